#!/usr/bin/env bash
# The broken protocol variants that the checks are proven to catch. Each
# mutant lives in the code behind `cfg(swarm_mutant = "NAME")` (grep for
# it), which swarm-core's build script sets (src/substrate/mutant.rs): the
# simulator's mutants share one build with every mutant behind a switch
# (`SWARM_MUTANT=switch`, the mutant chosen by `SWARM_MUTANT_ACTIVE=NAME`
# when the tests run), the loom ones are compiled in one at a time
# (`SWARM_MUTANT=NAME`). The script runs the tests that must fail on each,
# and passes only if every one of them fails for the stated reason. It
# prints each mutant's first failing seed (or the failing check), so that a
# report can say how quickly each is caught.
#
#   scripts/mutants.sh            # every mutant
#   scripts/mutants.sh rpc-resend # one
set -euo pipefail
cd "$(dirname "$0")/.."

# name | extra RUSTFLAGS | what must appear in the output | test command
MUTANTS=(
  "ring-unchecked|--cfg loom|a torn or foreign message was delivered|cargo test -p swarm-loom-tests --release --test ring"
  "ring-unchecked||answered|cargo test -p swarm-core --release --lib check::rpc::tests::a_server"
  "rpc-resend||not linearizable for a counter|cargo test -p swarm-core --release --lib check::rpc::tests::a_server"
  "rpc-no-last-look||timed out on a look taken before its pause|cargo test -p swarm-core --release --lib substrate::msg::tests::a_caller_paused"
  "lease-lost-forgotten||the first renewal after the pause|cargo test -p swarm-core --release --lib substrate::lease::tests::a_lease_lost_to_another"
  "lease-lost-forgotten||corrupt data in memory|cargo test -p swarm-core --release --lib systems::tests::fusee_campaign_3_replicas"
  "lease-lost-forgotten||the next write|cargo test -p swarm-core --release --lib systems::tests::an_index_fence_that_outlasts"
  "lease-takes-after-expiry||renewed on a site taken past the expiry|cargo test -p swarm-core --release --lib substrate::lease::tests::past_its_expiry"
  "lease-skips-lost-claims||site 0 taken at the renewal|cargo test -p swarm-core --release --lib substrate::lease::tests::a_site_held_by"
  "server-call-unleased||does not answer|cargo test -p swarm-core --release --lib systems::tests::pdpm_central_campaign_3_replicas"
  "server-call-unleased||does not answer|cargo test -p swarm-core --release --lib systems::tests::clover_campaign_3_replicas"
  "marks-are-bumps||carved again under published objects|cargo test -p swarm-core --release --lib substrate::space::slab::tests::the_next_holder"
  "marks-are-bumps||raw: a-|cargo test -p swarm-core --release --lib systems::edge_tests::a_crashed_clients_chunks"
  "marks-are-bumps||not linearizable|cargo test -p swarm-core --release --lib systems::tests::swarm_kv_campaign_3_replicas"
  "index-marks-are-bumps||raw: a-|cargo test -p swarm-core --release --lib systems::edge_tests::a_crashed_clients_chunks"
  "crashed-claim-given-back||took chunks of its own|cargo test -p swarm-core --release --lib systems::edge_tests::a_claimer_that_cannot_open"
  "inherited-left-in-use||segments in use once the one-command holder closed|cargo test -p swarm-core --release --lib systems::edge_tests::a_one_command_holder"
  "ack-one||not linearizable|cargo test -p swarm-core --release --lib swarm::safeguess::tests::campaign_3_replicas"
  "guessed-unlocked||not linearizable|cargo test -p swarm-core --release --lib swarm::safeguess::tests::campaign_3_replicas"
  "abd-no-write-back||not linearizable|cargo test -p swarm-core --release --lib baselines::abd::tests::campaign_3_replicas"
  "deleted-unconfirmed||an acknowledged update was lost|cargo test -p swarm-core --release --lib systems::tests::a_deletion_marker"
  "no-restore||after node 2's crash|cargo test -p swarm-core --release --lib systems::tests::a_key_inserted_past_a_late_node"
  "insert-impatient||too few memory nodes answered|cargo test -p swarm-core --release --lib systems::tests::dm_abd_campaign"
  "same-tombstone||not linearizable|cargo test -p swarm-core --release --lib index::snapshot::tests::concurrent_mixed"
  "any-empty-slot||not the first free slot|cargo test -p swarm-core --release --lib index::probe"
  "help-own-value|--cfg loom|every replica ends with the winner|cargo test -p swarm-loom-tests --release --test snapshot"
  "rejoin-word-only||Corrupt { node|cargo test -p swarm-core --release --lib index::snapshot::tests::a_healed_node"
  "no-fence||index::snapshot::tests::Snap|cargo test -p swarm-core --release --lib index::snapshot::tests::campaigns_with_a_crashed_node"
  "central-no-rdlock||read a reused copy|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_slow_reader"
  "central-no-fence||from its stale map|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_coordinator_answers_nothing"
  "central-unstamped||A answered the version it had loaded|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_reused_record"
  "central-skips-short||one data node of three up|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_write_short"
  "central-no-readmit||node 1 taken back by one write|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_data_node_that_comes_back"
  "central-frees-foreign-at-once||an earlier incarnation's reader would read a reused copy|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::an_earlier_incarnations"
  "central-frees-after-takeover||a successor's reader would read a reused copy|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_superseded_coordinator"
  "central-reads-late||a late READ returned a reused copy|cargo test -p swarm-core --release --lib systems::pdpm_central::tests::a_read_done_past"
  "clover-stale-cursor||the tail, not the cursor's version|cargo test -p swarm-core --release --lib systems::clover::tests::a_cursor_behind"
  "clover-no-gcver||a recycled buffer's bytes were returned|cargo test -p swarm-core --release --lib systems::clover::tests::a_recycled_buffer"
  "clover-no-gcver|--cfg loom|next incarnation was returned before it was linked|cargo test -p swarm-loom-tests --release --test clover"
  "pdpm-no-redo||the redo copy was not replayed|cargo test -p swarm-core --release --lib systems::pdpm_direct::tests::a_"
  "fusee-stale-cache||a stale cached entry answered|cargo test -p swarm-core --release --lib systems::fusee::tests::a_stale"
  "fusee-cached-loser||not linearizable|cargo test -p swarm-core --release --lib systems::tests::fusee_campaign"
  "fusee-redo-moved-on||moved on true, R crashed None: not linearizable|cargo test -p swarm-core --release --lib systems::fusee::tests::a_crashed_clients_update"
  "home-unsettled||not linearizable|cargo test -p swarm-core --release --lib swarm::recycle::tests::a_write_on"
  "release-goes-on||cold key|cargo test -p swarm-core --release --lib swarm::recycle::tests::holders_of_a_leased"
  "scan-asks-again||reads of the repair scan left unanswered|cargo test -p swarm-core --release --lib index::snapshot::tests::a_stalled_node_costs"
  "rewrites-forgotten||roundtrips per update|cargo test -p swarm-core --release --lib swarm::recycle::tests::writes_after_recycling"
  "waits-for-late||open waited for node 0's time-out|cargo test -p swarm-core --release --lib systems::edge_tests::a_stalled_node_0"
  "claim-timer-resets||kept changing|cargo test -p swarm-core --release --lib systems::tests::a_split_view_claim"
  "clover-no-stuck-reads||bytes more after 6 client crashes|cargo test -p swarm-core --release --lib systems::clover::tests::a_crash_loses"
  "torn-impatient||answered Err(Corrupt)|cargo test -p swarm-core --release --lib systems::raw::tests::a_copy_torn_for_a_while"
  "fusee-no-round-base||an uncached update was never redone|cargo test -p swarm-core --release --lib systems::fusee::tests::a_crashed_clients_uncached"
  "fusee-no-round-base||a new key's insert was never redone|cargo test -p swarm-core --release --lib systems::fusee::tests::a_crashed_clients_insert"
  "fusee-redo-moved-on||moved on true, R crashed None: not linearizable|cargo test -p swarm-core --release --lib systems::fusee::tests::a_crashed_clients_insert"
  "view-keeps-unrepaired||view changes: MasterPaths|cargo test -p swarm-core --release --lib index::snapshot::tests::a_stalled_node_costs"
  "view-keeps-unrepaired||not linearizable|cargo test -p swarm-core --release --lib systems::tests::a_replica_the_repair_missed"
  "fusee-carve-last-byte||Err(Corrupt)|cargo test -p swarm-core --release --lib systems::fusee::tests::a_recovered_log"
  "clover-old-cursor||an old cursor's recycled buffer was read as the value|cargo test -p swarm-core --release --lib systems::clover::tests::an_old_cursor"
  "clover-late-restarts||late READs were answered as something else than its time-out|cargo test -p swarm-core --release --lib systems::clover::tests::late_reads"
  "clover-any-class||of another size class|cargo test -p swarm-core --release --lib systems::clover::tests::versions_take"
  "clover-strands||a full node refused a smaller class|cargo test -p swarm-core --release --lib systems::clover::tests::a_full_node"
  "clover-larger-batch||the client holds|cargo test -p swarm-core --release --lib systems::clover::tests::a_full_node"
  "clover-keeps-lent||groups taken back from the crashed holder|cargo test -p swarm-core --release --lib systems::clover::tests::a_crashed_holders"
  "abd-stale-seed||2, 3, 3, 3|cargo test -p swarm-core --release --lib baselines::abd::tests::writers_taking_turns"
  "pool-untagged||a block in the pool has impossible links|cargo test -p swarm-core --release --lib substrate::space::pool::tests::concurrent"
  "restart-narrow||the read failed with every node up|cargo test -p swarm-core --release --lib swarm::maxreg::tests::a_read_that_finds"
  "stale-write-back||written back after R/2|cargo test -p swarm-core --release --lib swarm::maxreg::tests::a_reader_writes_back_only"
  "stale-write-back||locked after R/2|cargo test -p swarm-core --release --lib swarm::maxreg::tests::a_reader_locks_a_guessed"
  "index-ride-unchecked||the lookup answered the left-out replica's old location|cargo test -p swarm-core --release --lib index::snapshot::tests::a_ride_that_finds"
)

only=${1:-}
failed=0
for entry in "${MUTANTS[@]}"; do
  IFS='|' read -r name flags marker cmd <<<"$entry"
  if [ -n "$only" ] && [ "$only" != "$name" ]; then continue; fi
  printf '\n=== mutant %s (%s)\n' "$name" "${flags:-simulator}"
  log=$(mktemp)
  set +e
  if [ -n "$flags" ]; then
    # Loom builds have no standard library to read a switch with: the
    # mutant is compiled in, in the loom checks' own build (same RUSTFLAGS).
    SWARM_MUTANT="$name" RUSTFLAGS="$flags" CARGO_TARGET_DIR=target/loom $cmd >"$log" 2>&1
  else
    # One build with every mutant behind a switch serves all of them.
    SWARM_MUTANT=switch SWARM_MUTANT_ACTIVE="$name" CARGO_TARGET_DIR=target/mutants $cmd >"$log" 2>&1
  fi
  rc=$?
  set -e
  if [ "$rc" -ne 0 ] && grep -q -- "$marker" "$log"; then
    caught=$(grep -m1 -oE 'seed [0-9]+' "$log" || true)
    echo "caught: ${caught:-by its check} ($marker)"
  else
    echo "NOT CAUGHT: '$cmd' exited $rc without '$marker'; its output ends:"
    tail -n 20 "$log"
    failed=1
  fi
  rm -f "$log"
done
exit "$failed"
