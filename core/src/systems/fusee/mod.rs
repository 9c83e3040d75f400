//! FUSEE (Shen et al., FAST'23; `papers/fusee.txt` §4): a fully
//! memory-disaggregated key-value store. Clients reach the memory nodes
//! with one-sided operations only; every version of a key is an immutable
//! object written out of place ([`object`], §4.1, §4.4), and the key's slot
//! in a replicated RACE index points to its current one. The index is
//! replicated with SNAPSHOT (§4.2-4.3): the [`SnapshotIndex`] SWARM-KV
//! uses, on the store's first 2f+1 nodes, with its in-band master for view
//! changes, so no single node (node 0 included) is a point of failure.
//!
//! ```text
//! get(k), entry cached:  READ object @ entry ∥ READ k's slot on its primary      # 1 RTT
//!                        slot == entry's word: the object's value
//!                        else: lookup (2 RTT), READ object (1)
//! get(k), not cached:    lookup: buckets, key block (2 RTT); READ object       # 3 RTT
//!   (or k bypassed)
//! update(k, v):          WRITE object to every index replica (majority)        # 1 RTT
//!                        (not cached or bypassed: ∥ lookup, 2 RTT)
//!                        SNAPSHOT change from the cached entry (or found):
//!                          CAS the backups; catch-up and CAS the primary       # +2 RTT
//!                        another writer changed the slot first: change again
//!                          from the word found (same object)
//! insert(k, v):          WRITE object ∥ read k's buckets; SNAPSHOT insert      # 3 RTT
//!                        k mapped already: an update, with the same object
//! delete(k):             SNAPSHOT change to a tombstone from the entry         # 2 RTT
//!                        (its log entry written beside the first phase)
//! ```
//!
//! # Where objects live
//!
//! An object is a record of the replicated index's arena
//! ([`crate::index::snapshot::records`]): at the same offset on every
//! index replica, written to all of them and counted once a majority has
//! it, read from one (rotating with the offset) and from the others if
//! that copy is missing, torn or the node failed. So its location is one
//! offset (with its length above it, [`object::location`]), the key's
//! index entry alone finds every copy, and objects survive what the index
//! survives. Arena space is carved from per-client chunks, claimed by CAS
//! on a majority of the replicas: no roundtrip in the common case. Two
//! consequences, and why: the objects of every key go on the store's
//! first 2f+1 nodes rather than on the key's own nodes
//! ([`crate::kv::place::node_of`]; with as many nodes as replicas, the
//! usual setup, they are the same nodes), and the arena is sized when the
//! store is set up: every byte its nodes can spare then, and at least
//! [`CHANGES`] objects per key, since objects are never freed. FUSEE's own allocation (a block ALLOC
//! server per memory node, per-client slabs of size classes, §4.4) and
//! spreading objects over all nodes by consistent hashing are not done.
//!
//! # Guarantee: linearizable
//!
//! The index is linearizable (each change of a key's slot takes effect at
//! its CAS on the slot's primary, a lookup at its read of the primary; see
//! [`crate::index::snapshot`]), and every slot word it ever holds is new
//! (each change points at a fresh key block), so a slot that holds the
//! word an entry saw has not changed since. An object is published (its
//! location put in a slot) only after a majority of the replicas hold it
//! whole, and is never changed or freed afterwards, so once published
//! any reader finds a whole copy on at least one replica of every later
//! view (objects carry a sum over their lengths, key and value, so a torn
//! or foreign copy is never taken for it). Hence:
//!
//! - a get takes effect at its read of the slot (the cached word found
//!   there, or the lookup's read): the key then maps to the object it
//!   answers, whose value is the key's value then. The object may be read
//!   before or after the slot in the same roundtrip: it cannot change in
//!   between, and it cannot be freed, because nothing is freed. With
//!   garbage collection (not done) this would no longer hold: an object
//!   could be freed and reused between the slot's read and its own, and
//!   the get would then need FUSEE's valid byte and the key/CRC checks
//!   against reuse, or an epoch that holds off reuse while reads are in
//!   flight.
//! - an update, insert or delete takes effect at its successful change of
//!   the slot (whatever it answers then is true at that point), or, for a
//!   losing update, just before the change that beat it ("Losers"); one
//!   whose index change failed in doubt answers an error and may take
//!   effect later (a round another client completes).
//!
//! # Losers
//!
//! FUSEE lets the losing writer of a SNAPSHOT round return success,
//! ordered just before the winner ("it happened and was overwritten",
//! §4.3, App. A). That is linearizable only if the change that beat it
//! took effect inside the loser's own interval: then the loser is placed
//! just before the first change after the last time it saw the slot hold
//! the word it started from; at that point the key maps to a live entry
//! (so an update applies), and the next change overwrites or deletes the
//! value at once, before anyone could read it (its object was never
//! published). With a *cached* entry that is not so: the change that beat
//! it may have completed before this operation began (a stale cache),
//! and answering done would order the update before a change that
//! finished before it started. So ([`FuseeClient`]'s `swing`):
//!
//! - an update or insert whose change started from a word *this
//!   operation* saw committed on the slot's primary (a lookup, the
//!   buckets an insert read, or the word a lost round found) and loses
//!   returns done (`Paths::overwritten`);
//! - one that started from a cached entry and loses starts again from
//!   the word the index found, with the same object (never published, its
//!   location still new): at most once more, and that try may return as
//!   above (`Paths::lost_changes`);
//! - a delete that loses always starts again: placed before a winning
//!   *update*, it would make that update succeed on a deleted key;
//! - a change that finds the key removed answers
//!   [`Missing::NotFound`](crate::kv::Missing) (an insert inserts it
//!   again).
//!
//! The mutant `fusee-cached-loser` returns done from a stale cached entry
//! too; the campaigns catch it.
//!
//! # Deletes
//!
//! A delete changes the slot to the index's tombstone (a fresh tomb block
//! that names the key, so that concurrent deletes never meet on one
//! value: the pitfall of FUSEE's code that deletes to 0), and the key's
//! object is left as every superseded one. A get then answers
//! [`Got::NotFound`](crate::kv::Got); see [`crate::kv`] for what deletes
//! answer.
//!
//! # The adaptive cache (§4.6)
//!
//! A cached entry gone stale costs more than none: a get pays its
//! one-roundtrip try before the lookup it would have done anyway (4
//! roundtrips rather than 3), an update a lost SNAPSHOT round (6 rather
//! than 4: the object beside a lookup, then the round). So, as FUSEE does,
//! each client counts, per cached key, its accesses (gets, updates and
//! inserts, and the one that cached the key) and the stale ones among
//! them (the slot read beside the object held another word, the change's
//! first round lost, or a lookup found another word than the cached one),
//! and a key whose stale share is above the store's `bypass` option (a
//! percentage: 50 by default, or 10, the default of FUSEE's code) is
//! *bypassed*: its gets, updates and inserts run as if it were not cached
//! (`Paths::cache_bypasses`). It keeps its entry, and the lookups it then
//! does keep counting, so a key whose writes stop is cached again; the
//! counters are halved every 32 accesses, so that this takes a bounded
//! number of accesses however long the key was written (at most 16 at
//! 50%, 54 at 10%). The counters live in the location cache's payload
//! (module `cache`): the cache, shared with the other stores, is
//! unchanged. Why 50: the `bypass` option's declaration.
//!
//! The guarantee is unchanged: a bypassed operation is an uncached one
//! (its lookup falls in its own interval, so a losing update returns as
//! "Losers" says), except that an update or insert logs the cached word
//! as its object's `base`, as a cached one does (recovery redoes it only
//! if the slot still holds that word, which a slot never holds again once
//! it moved on). Deletes take the cached entry even for a bypassed key
//! (a stale one costs a delete a lost round, about what a lookup would),
//! and drop it.
//!
//! # Roundtrips (measured in `systems::tests` and `fusee::tests`)
//!
//! | operation | ours | FUSEE (paper, p50) |
//! |---|---|---|
//! | get, entry cached | 1 | 1 |
//! | get, not cached, stale or bypassed | 3 (1 more when stale) | 2 |
//! | update, entry cached | 3 (object; SNAPSHOT's 2 phases) | 4 (object; backups; log commit; primary) |
//! | update, not cached or bypassed | 4 (object beside the lookup; 2 phases) | |
//! | update, entry stale | 6 (object; the lost round and what beat it, 3; 2 phases) | |
//! | insert of a new key | 3 | 4 |
//! | delete, entry cached | 2 | 4 |
//!
//! Each phase is doorbell-batched with selective signalling (FUSEE §4.7):
//! what it sends one replica is one ordered pipeline, which the RDMA
//! backend posts as one chain with only its last request signaled. On 3
//! replicas a cached update is 6 chains of 15 requests (tested over the
//! software NIC, `backend-rdma/tests/softnic.rs`).
//!
//! A lookup takes two roundtrips here (the buckets, then the key block
//! that the slot points to and that holds the location); FUSEE's slot
//! points at the object itself, which holds the key. Our update has no
//! log-commit phase: the commit rides with the client's next object
//! write (below). Rule 2 adds a roundtrip to a change and Rule 3 two, as
//! in the paper. A leased client whose object starts a new arena chunk
//! records the chunk as its log's anchor in the lease record, beside the
//! object's write (same roundtrip): one more majority write every chunk
//! (16 KiB or more of objects), no more roundtrips.
//!
//! # The embedded log and client-crash recovery (§4.5, §5.3)
//!
//! Each object is an entry of its writer's log ([`object`]): its op, the
//! location of the id's previous object (`prev`), the slot word its change
//! starts from if known when written (`base`: a cached entry's word; the
//! common update), all under the object's sum and written with it; and a
//! *commit* (`old`, the word the change replaced, and a check that names
//! the object and the outcome) outside the sum. A delete writes an object
//! too (FUSEE's temporary delete object: its key, no value; no slot ever
//! points at it), beside its first round: no roundtrip of its own. A
//! round that starts from a word the object does not log (the lookup of
//! an uncached update or insert ran beside its write; a stale cached
//! entry's round lost and starts again from the word found; an insert's
//! round into the key's free slot, from its word: 0 if never used, or the
//! key's tombstone) writes that
//! word beside its first phase, to the object's commit, as a provisional
//! commit (`Started`), which the outcome overwrites: so recovery knows the
//! word the entry's last round started from, whichever path it took.
//!
//! **Finding the log.** The lease record of the id names the chunk the
//! id's objects are carved from now and the entry before it (the anchor,
//! [`log`]): written once per chunk, before the chunk's first object.
//! Objects are bump-allocated, so in the chunk they lie in allocation
//! order, interleaved with the id's key blocks; the last whole object
//! there is the log's last entry. We chose the lease record over walking
//! from a fixed head (FUSEE's per-class list heads on the MNs) because
//! the record is already where the next holder looks, is written to a
//! majority before it is acted on, and survives every fault the lease
//! survives; and over recording every entry there (a majority write per
//! operation). The anchor is written beside the chunk's first object, in
//! the same roundtrip; a client that crashes with an update's or insert's
//! object written and its anchor not had not started the object's change
//! (it waits for both), so recovery misses no such operation in doubt,
//! only the chunk's space. A delete's object and anchor go beside its
//! first round: a delete that crashes in that roundtrip with its round
//! started and its entry (or the anchor of the chunk it starts) not landed
//! is missed by recovery, and its round left to other clients' helping
//! (at most once), as every delete was before deletes were logged.
//!
//! **The commit costs no roundtrip**: it is written with the client's next
//! object, ahead of it in the same ordered pipeline to each replica
//! ([`Records::write_with`](crate::index::snapshot::records::Records::write_with)),
//! a delete's included, or at close. So every
//! entry but the last is committed on every replica that holds its
//! successor, and an entry with a successor is one whose operation
//! answered (a client runs one operation at a time). Recovery therefore
//! concludes: every entry before the last is done with (its commit says
//! how, for a future GC), and only the last one, with no commit, is in
//! doubt. Readers never misread the commit: it is the only field that
//! changes after publication, the sum does not cover it and `decode`
//! does not read it.
//!
//! **Recovery** runs when a client opens with an id whose holder crashed
//! (its lease expired with the record "taken"; [`FuseeClient::recovery`]
//! says what it took): it reads the anchored chunk from every replica of
//! the view (one roundtrip: the log walk), scans it for whole objects and
//! walks `prev` back from the last, then decides the last entry if its
//! commit says no outcome (none, or a provisional one). Its *base* here is
//! the word its last round started from: the provisional commit's, else
//! the object's `base`.
//!
//! - the key's slot holds its object (a delete's: the key is not mapped):
//!   done (its writer's or a helper's change took effect; for a delete,
//!   it or another one);
//! - the slot still holds its base (an insert: the key is not mapped and
//!   its free slot holds the base, [`SnapshotIndex::insert_from`]; a slot
//!   once used is never free again, so that slot is the one the insert's
//!   round was in): no change of the key took effect
//!   since the operation read that word (every word a slot holds is new),
//!   so neither did the operation (its rounds from earlier words ended
//!   when the primary left them, before it read the base). Recovery writes
//!   an update's or insert's object to a majority again and changes the
//!   slot from the base to it (a delete: to a tombstone): a SNAPSHOT round from the
//!   base, which commits at most one word: the crashed writer's own frozen
//!   round (helped) or recovery's, both the operation's. It takes effect
//!   once, inside its own interval (it never answered), and after no
//!   other completed change of the key (redone);
//! - otherwise (the key moved on, was removed, or the base is unknown):
//!   dropped. Had the operation taken effect, redoing it now would apply
//!   it twice (a value overwritten since would come back; a key inserted
//!   again would be deleted again); had it not, it can no longer: its
//!   round from the base ends when the primary leaves the base, which it
//!   never holds again. (A round whose provisional commit reached no
//!   replica recovery read may still be helped; that is its single
//!   effect, never a second.)
//!
//! and writes the decision as the entry's commit. The history checker
//! lets a crashed client's pending operation take effect at any time after
//! its start, which all three cases do at most once. Recovery is
//! idempotent: it changes nothing the next recovery reads but the commit
//! (and the slot, through the guarded redo, after which the slot holds
//! the object or moved on), and the claim of the id copied the crashed
//! holder's record, so a recovering client that crashes leaves the same
//! anchor to the next one (tested: every crash point of a recovery).
//! Recovery finally carves on past the last line any replica holds in the
//! chunk (a key block of the last round included), when every replica of
//! the view answered; otherwise the rest of the chunk is lost.
//!
//! Measured (`fusee::tests`, 2 µs roundtrips in the simulator): the log
//! walk is one roundtrip (2 µs) and the redo seven (14 µs: the lookup,
//! the object, SNAPSHOT's two phases, the commit, and a renewal of the
//! view lease that lapsed while the id's lease ran out). On the shm
//! backend (`swarm kv`, a shell killed with SIGKILL after its writes; the
//! next process with its id says what recovery took, cli test
//! `a_killed_fusee_client_s_log_is_recovered_by_the_next_holder`): a walk
//! of 86 µs and a decision (lookup and commit; the last update had taken
//! effect) of 96 µs of wall time, in one run on a shared 2-core machine.
//! FUSEE reports 3.5 ms each (177 ms in all, most of it reconnecting),
//! over RDMA and walking every size class's list.
//!
//! # Not done (open in issue #21)
//!
//! - A client with a fixed id (no lease, [`Who::Id`]: an embedder's or
//!   half the campaigns'; every `swarm` client is leased) has no lease
//!   record to anchor its log in: nobody recovers it.
//! - The two-level memory management: the ALLOC server beside each memory
//!   node, blocks, size classes, free bitmaps (§4.4); objects come from
//!   the index arena (above) and are never freed.
//! - Garbage collection of superseded objects and of the index's blocks
//!   (and with it the reuse checks a get would need, above). The log's
//!   commits say which word each change replaced, what GC would free; a
//!   recovered "dropped" entry may still be published by a round whose
//!   provisional commit recovery did not read (above), so GC must check
//!   the slot first.
//!   A crashed holder's chunk past the anchored one (claimed for a key
//!   block, never anchored) is lost space, as a released id's chunks are
//!   not. Until then
//!   the arena, every byte the index nodes could spare at set-up, fills
//!   with every change and then answers [`KvError::IndexSpace`] with its
//!   numbers.
//! - A provisional commit, a delete's object (and the commit before it)
//!   and a log anchor go to each replica as a chain of their own beside a
//!   phase's (same roundtrip, one doorbell more on RDMA); the phases
//!   themselves are batched (below, "Roundtrips").
//! - Memory-node failover beyond what the [`SnapshotIndex`]'s master does
//!   (its view changes leave a failed index replica out; nothing brings a
//!   node back or re-replicates its objects).

mod cache;
mod client;
pub mod log;
pub mod object;
#[cfg(all(test, feature = "sim"))]
mod tests;

use alloc::boxed::Box;

pub use client::FuseeClient;
pub use log::{Outcome, Recovery};

use crate::index::SnapshotIndex;
use crate::index::snapshot::SnapshotConfig;
use crate::index::snapshot::arena::{self, ALIGN};
use crate::kv::place::index_nodes;
use crate::kv::replicated::sizing::{self, DEFAULT_TIMEOUT_NS};
use crate::kv::{
    Choice, Guarantee, KvError, KvSystem, NodeChunks, NodeShape, Roundtrips, StoreConfig, SystemInfo, Who,
};
use crate::substrate::clock::Clock;
use crate::substrate::lease;
use crate::substrate::space::region::{HEADER_SIZE, Region};
use crate::{Memory, NodeId};

/// FUSEE.
pub struct Fusee;

/// Changes of each key's mapping (its insert, updates, delete) that the
/// arena has room for, on average over the keys: objects and key blocks
/// are never freed, so a store whose keys change more often than this
/// runs out of arena ([`KvError::IndexSpace`]) until garbage collection
/// is done.
pub const CHANGES: u64 = 4;

/// The store's option: the adaptive index cache's threshold (§4.6), the
/// percentage of a cached key's accesses that found its entry stale above
/// which the key's gets, updates and inserts bypass the cache ([`cache`]).
/// 50, the default, in roundtrips: a get takes 1 from a valid entry, 4
/// from a stale one and 3 bypassed; an update 3, 6 and 4; so bypassing
/// pays for a key stale more than two thirds of the time in gets and a
/// third in updates, and a half is between. 10 is the default of FUSEE's
/// code (`miss_rate_threash`), which also weighs the bandwidth that a
/// stale object's read wastes. An option rather than a constant so that
/// it can be chosen per store (`swarm kv init --option bypass=10`) and so
/// that the campaigns, which pick each option's value by seed, check both.
const BYPASS: Choice = Choice {
    name: "bypass",
    about: "percentage of a cached key's accesses that found its entry stale above which its operations skip the cache",
    values: &["50", "10"],
};

/// The cache's threshold for a store of `cfg` (its `bypass` option), a
/// percentage.
fn bypass(cfg: &StoreConfig) -> u8 {
    cfg.option(BYPASS.name).and_then(|v| v.parse().ok()).unwrap_or(50)
}

/// Bytes of the arena a client claims at a time, at least (and room for
/// four of the largest objects).
const MIN_CHUNK: u64 = 16 << 10;

impl Fusee {
    /// The arena's chunk for a store of `cfg`.
    fn chunk(cfg: &StoreConfig) -> u64 {
        MIN_CHUNK.max(4 * Self::largest(cfg)).next_multiple_of(ALIGN)
    }

    /// The largest object of a store of `cfg`.
    fn largest(cfg: &StoreConfig) -> u64 {
        object::alloc_len(cfg.max_key, cfg.max_value)
    }

    /// The smallest index of a store of `cfg` on memory whose operations
    /// time out after `timeout_ns`.
    fn index_config(cfg: &StoreConfig, timeout_ns: u64) -> SnapshotConfig {
        sizing::snapshot_config(cfg, timeout_ns, Self::largest(cfg), CHANGES, Self::chunk(cfg))
    }
}

impl KvSystem for Fusee {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "fusee",
        about: "immutable KV objects out of place, a SNAPSHOT-replicated RACE index on 2f+1 nodes, cached entries \
                checked in the same roundtrip; linearizable (FUSEE §4)",
        replicated: true,
        replicated_index: true,
        rejoins: true,
        floor: false,
        guarantee: Guarantee::Linearizable,
        roundtrips: Roundtrips { get: 1, update: 3, insert: 3, delete: 2 },
        options: &[BYPASS],
    };

    /// Boxed: a client holds its allocator's state (about 50 KiB).
    type Client<M: Memory, C: Clock> = Box<FuseeClient<M, C>>;

    fn check(cfg: &StoreConfig, _: usize) -> Result<(), KvError> {
        if Self::largest(cfg) > object::MAX_OBJECT || Self::chunk(cfg) > arena::MAX_SIZE {
            return Err(KvError::BadConfig("values too large for FUSEE's objects (at most 4 MiB)"));
        }
        Ok(())
    }

    /// The index with its arena (key blocks and objects, [`CHANGES`] per
    /// key), on each of the first 2f+1 nodes: the arena is sized when the
    /// store is set up, so `writes` beyond it do not fit anyway.
    fn node_bytes(cfg: &StoreConfig, _nodes: usize, _writes: u64) -> u64 {
        let c = Self::index_config(cfg, DEFAULT_TIMEOUT_NS);
        let index = sizing::replica_bytes(&c, StoreConfig::CHUNK);
        let slack = cfg.writers as u64 * 6 * StoreConfig::CHUNK + lease::table_bytes(cfg.writers);
        let total = index.saturating_add(slack);
        (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
    }

    /// The index on the first 2f+1 nodes (its arena holds the clients'
    /// chunks); nothing per client elsewhere.
    fn node_chunks(cfg: &StoreConfig, nodes: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        Self::check(cfg, nodes)?;
        let own = if index_nodes(cfg, nodes).contains(&node) {
            sizing::replica_bytes(&Self::index_config(cfg, DEFAULT_TIMEOUT_NS), shape.chunk)
                .div_ceil(shape.chunk.max(1))
        } else {
            0
        };
        Ok(NodeChunks { own, per_client: 0 })
    }

    /// The replicated index on the first 2f+1 nodes, its arena at least
    /// [`CHANGES`] objects per key and otherwise every byte the index
    /// nodes can spare (objects are the store's values: they get the
    /// memory other stores carve their values from). Nothing changes
    /// where it exists.
    async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
        let mut c = Self::index_config(cfg, mem.timeout_ns().unwrap_or(DEFAULT_TIMEOUT_NS));
        let nodes = index_nodes(cfg, mem.node_count());
        if SnapshotIndex::open(mem, &nodes, 0).await.is_err() {
            // The least room left on an index node, in its regions' chunks.
            let (mut spare, mut chunk) = (u64::MAX, 0);
            for &node in &nodes {
                let region = Region::open(mem, node).await?;
                spare = spare.min(region.size.saturating_sub(region.cursor));
                chunk = chunk.max(region.chunk);
            }
            // What else the store puts there: the buckets, the lease
            // table, and a chunk or two of rounding.
            let reserve = sizing::replica_bytes(&SnapshotConfig { arena: 0, ..c }, chunk)
                + lease::table_bytes(cfg.writers)
                + 2 * chunk;
            let room = spare.saturating_sub(reserve) / c.chunk * c.chunk;
            c.arena = c.arena.max(room.min(arena::MAX_SIZE / c.chunk * c.chunk));
        }
        SnapshotIndex::open_or_create(mem, &nodes, c).await?;
        Ok(())
    }

    async fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> Result<Box<FuseeClient<M, C>>, KvError> {
        Ok(Box::new(FuseeClient::open(mem, cfg, who, clock).await?))
    }
}
