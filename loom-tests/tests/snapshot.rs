//! SNAPSHOT's replicated compare-and-set
//! (`swarm_core::index::snapshot::slot::rcas`, FUSEE §4.3) under loom: two
//! writers of one round (values A < B, both from the committed 0) and a
//! reader, over one slot word on each of three nodes (primary on node 0).
//! In every execution exactly one writer wins, the other learns the winner
//! as a failed compare-and-set, every replica ends holding the winner with
//! its commit mark, and the reader sees 0 or the winner. Executions include
//! Rule 3 (each writer wins one backup) and losers that help.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use swarm_backend_shm::ShmCluster;
    use swarm_core::index::snapshot::slot::{Exp, Outcome, Slot, SlotPaths, Target, TargetOps, rcas, read};
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::memory::read_word;
    use swarm_core::{MemError, Memory, NodeId, Op, RemoteAddr};
    use swarm_loom_tests::{explore_bounded, spawn_big};

    /// The two proposals, A < B (Rule 3 picks A).
    const A: u64 = 0x11;
    const B: u64 = 0x22;
    /// Preemptions per execution: 3 explores about 23,000 executions in a
    /// few seconds, among them Rule 3 decisions and helping losers.
    const PREEMPTIONS: Option<usize> = Some(3);

    fn slot() -> Slot {
        Slot::new(&[0u16, 1, 2].map(|n| RemoteAddr::new(NodeId(n), 0))).unwrap()
    }

    /// The mark of `word` on the primary: word 1 for A, word 2 for B.
    fn mark_at(word: u64) -> RemoteAddr {
        RemoteAddr::new(NodeId(0), if word == A { 8 } else { 16 })
    }

    /// A target that only marks commits (CAS 0 -> 1 on the word's mark).
    struct Marks;

    impl Target for Marks {
        fn commit_ops<'a>(&'a self, word: u64, _vold: u64, out: &mut TargetOps<'a>) {
            let _ = out.push(Op::Cas { offset: mark_at(word).offset, expected: 0, new: 1 });
        }

        async fn marked<M: Memory>(&self, mem: &M, word: u64) -> Result<Option<bool>, MemError> {
            Ok(Some(read_word(mem, mark_at(word)).await? == 1))
        }
    }

    #[test]
    fn one_round_has_one_winner_everywhere() {
        // Plain counters: executions where A won, where B won; helps; Rule 3 wins.
        let seen = Arc::new([0; 4].map(AtomicUsize::new));
        let results = seen.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let cluster = ShmCluster::in_process(3, 24).unwrap();
            let writers = [A, B].map(|v| {
                let mem = cluster.memory();
                spawn_big(move || {
                    let mut paths = SlotPaths::default();
                    let out = block_on(rcas(&mem, &slot(), Exp::Hint(0), v, &Marks, &mut paths)).unwrap();
                    (out, paths.help, paths.r3)
                })
            });
            let mem = cluster.memory();
            let reader = spawn_big(move || block_on(read(&mem, &slot())).unwrap());
            let [(a, ha, ra), (b, hb, rb)] = writers.map(|t| t.join().unwrap());
            let r = reader.join().unwrap();
            let winner = match (a, b) {
                (Outcome::Won { previous: 0 }, Outcome::Lost { current }) => {
                    assert_eq!(current, A, "the loser learns the winner");
                    A
                }
                (Outcome::Lost { current }, Outcome::Won { previous: 0 }) => {
                    assert_eq!(current, B, "the loser learns the winner");
                    B
                }
                other => panic!("one writer must win, the other lose: {other:?}"),
            };
            let mem = cluster.memory();
            let finals = [0u16, 1, 2].map(|n| block_on(read_word(&mem, RemoteAddr::new(NodeId(n), 0))).unwrap());
            assert_eq!(finals, [winner; 3], "every replica ends with the winner");
            assert_eq!(block_on(read_word(&mem, mark_at(winner))).unwrap(), 1, "the winner's commit is marked");
            assert!(r == 0 || r == winner, "the reader saw {r:#x}, neither 0 nor the winner");
            results[usize::from(winner == B)].fetch_add(1, Ordering::Relaxed);
            results[2].fetch_add((ha + hb) as usize, Ordering::Relaxed);
            results[3].fetch_add((ra + rb) as usize, Ordering::Relaxed);
        });
        let seen = [0, 1, 2, 3].map(|i| seen[i].load(Ordering::Relaxed));
        eprintln!("explored {runs} executions: [A won, B won, helps, Rule 3 wins] {seen:?}");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        assert!(seen[0] > 0 && seen[1] > 0, "both writers should win somewhere: {seen:?}");
        assert!(seen[2] > 0 && seen[3] > 0, "losers should help and Rule 3 decide somewhere: {seen:?}");
    }
}
