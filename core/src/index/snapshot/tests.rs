//! The replicated index under the simulator: operations one by one,
//! roundtrips per operation, the model-based property and the concurrent
//! campaigns of the single-node index (`index::tests`), on 3 and 5
//! replicas, with replicas checked equal once the clients are done.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::block;
use super::header::{self, Header};
use super::master::MasterPaths;
use super::slot::SlotPaths;
use super::view::Timing;
use super::{SnapshotConfig, SnapshotIndex};
use crate::index::layout::{Block, SlotWord, block_len};
use crate::index::tests::{
    CHUNK, Campaign, INSERTS, MAX_KEY_LEN, MIXED, NODE_SIZE, Under, check_run, key, one_client_matches_a_hash_map_on,
    op_strategy, sim_of,
};
use crate::index::{Change, Expect, Index, IndexConfig, IndexError, Insert};
use crate::sim::{Sim, SimConfig, SimMemory};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::{ROOTS_OFFSET, Region};
use crate::{Memory, NodeId, RemoteAddr};

/// The replicated index on nodes `0..R`.
struct Snap<const R: usize>;

fn nodes(r: usize) -> Vec<NodeId> {
    (0..r as u16).map(NodeId).collect()
}

fn config(groups: u64) -> SnapshotConfig {
    SnapshotConfig {
        index: IndexConfig { groups, max_key: MAX_KEY_LEN, seed: 11 },
        arena: 1 << 20,
        chunk: 16 << 10,
        // The simulator's time-out is 50 µs; a long lease keeps renewals
        // out of the roundtrip counts.
        timing: Timing { lease_ns: 10_000_000, landing_ns: 50_000 },
    }
}

fn setup_on(sim: &mut Sim, r: usize, groups: u64) {
    let admin = sim.client();
    sim.block_on(async move {
        for n in nodes(r) {
            Region::format(&admin, n, NODE_SIZE, CHUNK).await.unwrap();
        }
        SnapshotIndex::open_or_create(&admin, &nodes(r), config(groups)).await.unwrap();
    })
    .unwrap();
}

fn peek_word(sim: &Sim, node: NodeId, offset: u64) -> u64 {
    u64::from_le_bytes(sim.peek(node.0 as usize, offset, 8).unwrap().try_into().unwrap())
}

fn header_of(sim: &Sim) -> Header {
    let root = peek_word(sim, NodeId(0), ROOTS_OFFSET + 8 * crate::substrate::space::roots::INDEX.slot);
    Header::decode(NodeId(0), &sim.peek(0, root, header::BYTES as usize).unwrap()).unwrap()
}

/// The newest view any replica's view word holds (the one served once
/// the clients are done).
fn view_of(sim: &Sim, h: &Header) -> super::view::View {
    let words = (0..h.replicas.len()).map(|i| {
        let at = h.view_addr(i);
        super::view::View::decode(peek_word(sim, at.node, at.offset)).expect("a whole view word")
    });
    super::view::newest(words).unwrap()
}

/// Each slot's word on every replica the final view serves, primary
/// first: slot -> words.
fn words(sim: &Sim) -> Vec<(u64, Vec<u64>)> {
    let h = header_of(sim);
    let excluded = view_of(sim, &h).excluded;
    let geo = h.logical();
    (0..geo.slots())
        .map(|s| {
            let offset = geo.buckets() + 8 * s;
            let ws = h
                .order_without(offset, excluded)
                .map(|i| peek_word(sim, h.replicas[i].node, h.at(i, offset).offset))
                .collect();
            (offset, ws)
        })
        .collect()
}

/// Slots whose replicas differ, once every client is done.
fn split_slots(sim: &Sim) -> Vec<(u64, Vec<u64>)> {
    words(sim).into_iter().filter(|(_, ws)| ws.iter().any(|&w| w != ws[0])).collect()
}

fn audit_of(sim: &Sim) -> BTreeMap<Vec<u8>, Vec<(u64, u64)>> {
    let h = header_of(sim);
    let mut out: BTreeMap<Vec<u8>, Vec<(u64, u64)>> = BTreeMap::new();
    for (offset, ws) in words(sim) {
        let w = SlotWord(ws[0]);
        if !w.is_live() {
            continue;
        }
        let primary = h.order_without(offset, view_of(sim, &h).excluded).next().unwrap();
        let site = h.sites()[primary];
        let at =
            block::addr_of(site, h.arena_size, w.0, block::Part::Block).expect("a live slot points into the arena");
        let bytes = sim.peek(site.node.0 as usize, at.offset, block_len(w.key_len())).unwrap();
        let (location, k) = Block::decode(&bytes, w.key_len()).expect("a committed block is on the primary");
        if view_of(sim, &h).epoch == 0 {
            let at = block::addr_of(site, h.arena_size, w.0, block::Part::Mark).unwrap();
            assert_eq!(peek_word(sim, site.node, at.offset), block::mark_of(w.0), "a committed word is marked");
        }
        out.entry(k.to_vec()).or_default().push((offset, location));
    }
    out
}

impl<const R: usize> Under for Snap<R> {
    type Ix = SnapshotIndex;
    const NODES: usize = R;

    fn setup(sim: &mut Sim, groups: u64) {
        setup_on(sim, R, groups)
    }

    async fn open(mem: &SimMemory, id: u32) -> SnapshotIndex {
        SnapshotIndex::open(mem, &nodes(R), id).await.unwrap()
    }

    fn audit(sim: &Sim) -> BTreeMap<Vec<u8>, Vec<(u64, u64)>> {
        audit_of(sim)
    }

    fn settled(sim: &Sim) -> Result<(), alloc::string::String> {
        let split = split_slots(sim);
        if split.is_empty() { Ok(()) } else { Err(alloc::format!("replicas differ: {split:?}")) }
    }

    fn paths(ix: &SnapshotIndex) -> SlotPaths {
        ix.paths()
    }

    fn master_paths(ix: &SnapshotIndex) -> MasterPaths {
        ix.master_paths()
    }
}

#[test]
fn insert_lookup_update_remove_on_3_replicas() {
    let mut sim = sim_of(1, 3);
    setup_on(&mut sim, 3, 16);
    let mem = sim.client();
    sim.block_on(async move {
        let mut ix = SnapshotIndex::open(&mem, &nodes(3), 1).await.unwrap();
        let k = b"alpha";
        assert_eq!(ix.lookup(&mem, k).await, Ok(None));
        let Insert::New(e1) = ix.insert(&mem, k, 100).await.unwrap() else { panic!("a new key") };
        assert_eq!(ix.lookup(&mem, k).await, Ok(Some(e1)));
        assert_eq!(ix.insert(&mem, k, 200).await, Ok(Insert::Exists(e1)));
        let Ok(Change::Done { previous: 100, now: Some(e2) }) = ix.update(&mem, k, Expect::Any, 200).await else {
            panic!("update")
        };
        assert_eq!(e2.slot, e1.slot);
        assert_eq!(ix.update(&mem, k, Expect::Entry(e1), 300).await, Ok(Change::Mismatch { current: e2 }));
        assert_eq!(ix.remove(&mem, k, Expect::Location(1)).await, Ok(Change::Mismatch { current: e2 }));
        assert_eq!(ix.remove(&mem, k, Expect::Entry(e2)).await, Ok(Change::Done { previous: 200, now: None }));
        assert_eq!(ix.lookup(&mem, k).await, Ok(None));
        assert_eq!(ix.remove(&mem, k, Expect::Any).await, Ok(Change::NotFound));
        // The key takes its own tombstone back.
        let Insert::New(e3) = ix.insert(&mem, k, 500).await.unwrap() else { panic!("re-insert") };
        assert_eq!(e3.slot, e1.slot);
        let long = [7u8; MAX_KEY_LEN + 1];
        assert!(matches!(ix.insert(&mem, &long, 1).await, Err(IndexError::KeyTooLong { .. })));
        assert_eq!(ix.insert(&mem, b"zero", 0).await, Err(IndexError::ZeroLocation));
        // Another client sees the same.
        let mut other = SnapshotIndex::open(&mem, &nodes(3), 2).await.unwrap();
        assert_eq!(other.lookup(&mem, k).await, Ok(Some(e3)));
    })
    .unwrap();
    assert!(split_slots(&sim).is_empty(), "replicas agree: {:?}", split_slots(&sim));
    assert_eq!(audit_of(&sim).len(), 1);
}

/// Opening needs the index on some node; a second creator opens the first's.
#[test]
fn open_finds_the_index_and_creating_twice_opens_it() {
    let mut sim = sim_of(2, 3);
    let admin = sim.client();
    sim.block_on(async move {
        for n in nodes(3) {
            Region::format(&admin, n, NODE_SIZE, CHUNK).await.unwrap();
        }
        assert_eq!(
            SnapshotIndex::open(&admin, &nodes(3), 1).await.err(),
            Some(IndexError::NoIndex { node: NodeId(0) })
        );
        let a = SnapshotIndex::open_or_create(&admin, &nodes(3), config(4)).await.unwrap();
        let b = SnapshotIndex::open_or_create(&admin, &nodes(3), config(8)).await.unwrap();
        assert_eq!(a.header(), b.header());
        assert_eq!(a.header().groups, 4);
        // Primaries rotate: group g's is replica g mod 3.
        let h = a.header();
        let firsts: Vec<usize> =
            (0..3).map(|g| h.order(h.logical().buckets() + g * crate::index::GROUP_BYTES).next().unwrap()).collect();
        assert_eq!(firsts, [0, 1, 2]);
    })
    .unwrap();
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rtts {
    insert_new: u32,
    insert_present: u32,
    lookup_present: u32,
    lookup_absent: u32,
    update_by_key: u32,
    update_by_entry: u32,
    remove_by_entry: u32,
    still: u32,
    remove_background: u32,
}

/// Exact roundtrips per operation (fixed latency, no contention): the
/// module documentation's table.
#[test]
fn roundtrips_per_operation() {
    for r in [3, 5] {
        let cfg = SimConfig { nodes: r, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
        let mut sim = Sim::new(cfg);
        setup_on(&mut sim, r, 64);
        let mem = sim.client();
        let runs = sim
            .block_on(async move {
                let mut ix = SnapshotIndex::open(&mem, &nodes(r), 1).await.unwrap();
                // Warm-up: the first insert claims an arena chunk.
                ix.insert(&mem, b"warm-up", 1).await.unwrap();
                let mut runs = Vec::new();
                for i in 0..10u64 {
                    let mut t = Rtts::default();
                    let c = Counted::new(&mem);
                    let k = key(i);
                    let Insert::New(e) = ix.insert(&c, &k, i + 10).await.unwrap() else { panic!("new") };
                    t.insert_new = c.roundtrips();
                    c.reset();
                    assert!(matches!(ix.insert(&c, &k, 1).await, Ok(Insert::Exists(_))));
                    t.insert_present = c.roundtrips();
                    c.reset();
                    assert_eq!(ix.lookup(&c, &k).await, Ok(Some(e)));
                    t.lookup_present = c.roundtrips();
                    c.reset();
                    assert_eq!(ix.lookup(&c, &key(1000 + i)).await, Ok(None));
                    t.lookup_absent = c.roundtrips();
                    c.reset();
                    let Ok(Change::Done { now: Some(e), .. }) = ix.update(&c, &k, Expect::Any, 7).await else {
                        panic!()
                    };
                    t.update_by_key = c.roundtrips();
                    c.reset();
                    let Ok(Change::Done { now: Some(e), .. }) = ix.update(&c, &k, Expect::Entry(e), 8).await else {
                        panic!()
                    };
                    t.update_by_entry = c.roundtrips();
                    c.reset();
                    assert_eq!(ix.still(&c, &k, &e).await, Ok(true));
                    t.still = c.roundtrips();
                    c.reset();
                    ix.remove_background(&c, &k, &e).unwrap();
                    t.remove_background = c.roundtrips();
                    c.reset();
                    assert!(matches!(ix.remove(&c, &k, Expect::Entry(e)).await, Ok(Change::Done { .. })));
                    t.remove_by_entry = c.roundtrips();
                    runs.push(t);
                }
                (runs, ix.paths())
            })
            .unwrap();
        let (runs, paths) = runs;
        let want = Rtts {
            insert_new: 3,
            insert_present: 2,
            lookup_present: 2,
            lookup_absent: 1,
            update_by_key: 4,
            update_by_entry: 2,
            remove_by_entry: 2,
            still: 1,
            remove_background: 0,
        };
        std::println!("replicated index roundtrips, {r} replicas: {want:?}");
        assert!(runs.iter().all(|t| *t == want), "{r} replicas: {runs:#?}");
        assert_eq!(paths.r1, 41, "every write alone wins by Rule 1: {paths:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn one_client_matches_a_hash_map(ops in proptest::collection::vec(op_strategy(8), 1..60), groups in 1u64..4) {
        one_client_matches_a_hash_map_on::<Snap<3>>(ops, groups)?;
    }
}

/// Runs `seeds` of campaign `c` on `Under` `U`, with replicas checked
/// equal at the end when no client crashed; the paths the writes took.
fn campaigns<U: Under>(seeds: core::ops::Range<u64>, c: &Campaign) -> SlotPaths {
    campaigns_with_views::<U>(seeds, c).0
}

/// [`campaigns`], with the view changes too.
fn campaigns_with_views<U: Under>(seeds: core::ops::Range<u64>, c: &Campaign) -> (SlotPaths, MasterPaths) {
    let (mut paths, mut views) = (SlotPaths::default(), MasterPaths::default());
    for seed in seeds {
        let out = check_run::<U>(seed, c);
        paths.add(&out.paths);
        views.add(&out.views);
    }
    (paths, views)
}

/// A node crashes (node 0 too) while clients insert, update and remove:
/// a client that meets the failure leads a view change that leaves the
/// node out and repairs its slots; every operation completes, every history
/// is linearizable, the served replicas end equal.
#[test]
fn campaigns_with_a_crashed_node() {
    use crate::sim::CrashMode::{FailFast, Hang};
    let mut all = MasterPaths::default();
    for mode in [FailFast, Hang] {
        let (_, v3) = campaigns_with_views::<Snap<3>>(0..100, &Campaign { crash_node: Some(mode), ..MIXED });
        let (_, v5) = campaigns_with_views::<Snap<5>>(0..60, &Campaign { crash_node: Some(mode), ..MIXED });
        let (_, vi) = campaigns_with_views::<Snap<3>>(0..60, &Campaign { crash_node: Some(mode), ..INSERTS });
        std::println!("{mode:?}: 3 replicas {v3:?}\n{mode:?}: 5 replicas {v5:?}\n{mode:?}: inserts {vi:?}");
        // A client crashes too, maybe while it leads the view change.
        let (_, vc) =
            campaigns_with_views::<Snap<3>>(0..100, &Campaign { crash_node: Some(mode), crash_one: true, ..MIXED });
        std::println!("{mode:?}: with a crashed client {vc:?}");
        for v in [v3, v5, vi, vc] {
            all.add(&v);
        }
    }
    assert!(all.views > 50 && all.repaired > 0 && all.waits > 0, "view changes should be led and waited for: {all:?}");
}

/// A crashed node comes back with its memory (during the view change that
/// leaves it out, or soon after): a client whose renewal hears from it
/// leads a view change that catches its slots up and brings it back; every
/// history is linearizable and every replica of the final view, the
/// joiner's too, holds the same words and the blocks they point to.
#[test]
fn campaigns_with_a_healed_node() {
    use crate::sim::CrashMode::{FailFast, Hang};
    let mut all = MasterPaths::default();
    for mode in [FailFast, Hang] {
        let c = Campaign { crash_node: Some(mode), heal: true, ..MIXED };
        let (_, v3) = campaigns_with_views::<Snap<3>>(0..100, &c);
        let (_, v5) = campaigns_with_views::<Snap<5>>(0..40, &c);
        let (_, vc) = campaigns_with_views::<Snap<3>>(0..60, &Campaign { crash_one: true, ..c });
        std::println!("{mode:?}: 3 replicas {v3:?}\n{mode:?}: 5 replicas {v5:?}\n{mode:?}: crashed client {vc:?}");
        for v in [v3, v5, vc] {
            all.add(&v);
        }
    }
    assert!(all.rejoined > 20 && all.caught_up > 0, "healed nodes should be brought back: {all:?}");
}

/// The user's sequence: a node fails, comes back, then another fails. The
/// first is left out (one pause), brought back (a second pause, about a
/// lease), and is a full member again: with the second node out, the
/// index serves from it, and every key is found.
#[test]
fn a_healed_node_is_brought_back_and_serves_when_another_fails() {
    let cfg = SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
    let mut sim = Sim::new(cfg);
    setup_on(&mut sim, 3, 16);
    let mem = sim.client();
    let start = sim.now();
    sim.crash_node_at(1, start + 200_000, crate::sim::CrashMode::Hang);
    sim.heal_node_at(1, start + 15_000_000);
    sim.crash_node_at(2, start + 45_000_000, crate::sim::CrashMode::FailFast);
    let (views, worst, paths) = sim
        .block_on(async move {
            let mut ix = SnapshotIndex::open(&mem, &nodes(3), 1).await.unwrap();
            let (mut views, mut worst, mut last) = (Vec::new(), 0, mem.now());
            let mut i = 0u64;
            while mem.now() < start + 70_000_000 {
                // Inserts over the first 25 ms or so: many while node 1 is out.
                mem.sleep(50_000).await;
                let k = key(i % 300);
                if i < 300 {
                    let got = ix.insert(&mem, &k, i + 1).await;
                    assert!(matches!(got, Ok(Insert::New(_))), "insert {i}: {got:?} at {}", mem.now() - start);
                }
                assert_eq!(ix.lookup(&mem, &k).await.unwrap().map(|e| e.location), Some(i % 300 + 1), "key {i}");
                if views.last() != Some(&ix.view().excluded) {
                    views.push(ix.view().excluded);
                }
                worst = worst.max(mem.now() - last - 50_000);
                last = mem.now();
                i += 1;
            }
            (views, worst, ix.master_paths())
        })
        .unwrap();
    std::println!("views {views:?}, longest pause {worst} ns, {paths:?}");
    assert_eq!(views, [0, 0b10, 0, 0b100], "out, back, then the other out");
    assert_eq!(paths.rejoined, 1);
    assert!(paths.caught_up > 0, "slots written while node 1 was out are caught up: {paths:?}");
    assert!(worst < 2 * 10_000_000, "each pause about one lease (10 ms): {worst} ns");
    Snap::<3>::settled(&sim).unwrap();
    assert_eq!(Snap::<3>::audit(&sim).len(), 300);
}

/// A node whose memory was lost comes back answering: its header is
/// gone, so it is never brought back (the index goes on without it).
#[test]
fn a_node_that_lost_its_memory_stays_out() {
    let cfg = SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
    let mut sim = Sim::new(cfg);
    setup_on(&mut sim, 3, 16);
    let h = header_of(&sim);
    let mem = sim.client();
    let start = sim.now();
    sim.crash_node_at(2, start + 100_000, crate::sim::CrashMode::FailFast);
    let h2 = h.clone();
    let ix = sim
        .block_on(async move {
            let mut ix = SnapshotIndex::open(&mem, &nodes(3), 1).await.unwrap();
            for i in 0..100u64 {
                assert!(matches!(ix.insert(&mem, &key(i), i + 1).await, Ok(Insert::New(_))), "insert {i}");
            }
            assert_eq!(ix.view().excluded, 0b100);
            (ix, mem, h2)
        })
        .unwrap();
    let now = sim.now();
    sim.heal_node_at(2, now);
    let (mut ix, mem, h) = ix;
    sim.block_on(async move {
        mem.sleep(1_000).await;
        // The node restarted over memory that was reused: its header is
        // garbage, its view word an old view.
        let r = &h.replicas[2];
        let at = RemoteAddr::new(r.node, r.buckets - header::BYTES);
        mem.write(at, &[0xA5; super::view::VIEW_AT as usize]).await.unwrap();
        let until = mem.now() + 40_000_000;
        let mut i = 0;
        while mem.now() < until {
            assert_eq!(ix.lookup(&mem, &key(i % 100)).await.unwrap().map(|e| e.location), Some(i % 100 + 1));
            i += 1;
        }
        assert_eq!(ix.view().excluded, 0b100, "left out");
        assert_eq!(ix.master_paths().rejoined, 0);
    })
    .unwrap();
}

/// Concurrent inserts of overlapping key sets, all clients starting with
/// the same key at once: one slot per key, one winner, every history
/// linearizable; the rounds split the backups (Rules 2 and 3) and losers
/// wait for the winner.
#[test]
fn concurrent_inserts_leave_one_slot_per_key() {
    let p3 = campaigns::<Snap<3>>(0..150, &INSERTS);
    let p5 = campaigns::<Snap<5>>(0..100, &INSERTS);
    std::println!("paths, 3 replicas: {p3:?}\npaths, 5 replicas: {p5:?}");
    assert!(p3.lose > 50 && p5.lose > 50, "clients should meet on slots");
    assert!(p5.r2 > 0 && p5.r3 + p3.r3 > 0, "rounds should split the backups");
}

/// Inserts, lookups, updates and removals of 4 keys by 4 clients.
#[test]
fn concurrent_mixed_operations_are_linearizable() {
    let p3 = campaigns::<Snap<3>>(0..150, &MIXED);
    let p5 = campaigns::<Snap<5>>(0..100, &MIXED);
    std::println!("paths, 3 replicas: {p3:?}\npaths, 5 replicas: {p5:?}");
    assert!(p3.lose + p5.lose > 50, "clients should meet on slots");
}

/// Nodes stall for less than the time-out while clients write: CASes of
/// one round land late, among a later round's (the F3 interleavings, and
/// writers whose outcome only their mark tells, F7), and every history is
/// still linearizable with replicas equal at the end.
#[test]
fn campaigns_with_stalled_nodes() {
    let p3 = campaigns::<Snap<3>>(0..150, &Campaign { stalls: true, ..MIXED });
    let p5 = campaigns::<Snap<5>>(0..100, &Campaign { stalls: true, ..MIXED });
    let p5i = campaigns::<Snap<5>>(0..100, &Campaign { stalls: true, ..INSERTS });
    std::println!("paths, 3 replicas: {p3:?}\npaths, 5 replicas: {p5:?}\ninserts, 5 replicas: {p5i:?}");
    let all = [p3, p5, p5i].iter().fold(SlotPaths::default(), |mut a, p| {
        a.add(p);
        a
    });
    assert!(all.r3 > 0 && all.marks > 0, "stalls should split rounds and leave writers to learn from marks: {all:?}");
}

/// A client crashes mid-run, possibly in the middle of a round: the
/// others complete its round if they meet it (F5) and the index stays
/// linearizable.
#[test]
fn campaigns_with_a_crashing_client() {
    let p3 = campaigns::<Snap<3>>(0..150, &Campaign { crash_one: true, ..MIXED });
    let p5 = campaigns::<Snap<5>>(0..100, &Campaign { crash_one: true, ..INSERTS });
    std::println!("paths, 3 replicas: {p3:?}\npaths, 5 replicas: {p5:?}");
}

/// Client A inserts a key and crashes at a time swept across its write
/// (fixed latency): wherever it stops, client B's insert of the same key
/// answers consistently with A's, helping A's round to its end when A
/// stopped between its backups and its commit (and copying A's block to
/// the primary), and the replicas end equal.
#[test]
fn an_insert_meets_a_crashed_writers_round_and_completes_it() {
    let mut helped = 0;
    for r in [3, 5] {
        for at in (0..14_000).step_by(250) {
            let cfg = SimConfig { nodes: r, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
            let mut sim = Sim::new(cfg);
            setup_on(&mut sim, r, 4);
            let (a, b) = (sim.client(), sim.client());
            let a_done = alloc::rc::Rc::new(core::cell::Cell::new(false));
            let done = a_done.clone();
            let a2 = a.clone();
            sim.spawn(&a.clone(), async move {
                let a = a2;
                let mut ix = SnapshotIndex::open(&a, &nodes(r), 1).await.unwrap();
                assert!(matches!(ix.insert(&a, b"k", 1).await, Ok(Insert::New(_))));
                done.set(true);
            });
            let start = sim.now();
            sim.crash_client_at(&a, start + 6_000 + at);
            let got = alloc::rc::Rc::new(core::cell::RefCell::new(None));
            let out = got.clone();
            sim.spawn(&b.clone(), async move {
                b.sleep(20_000).await;
                let mut ix = SnapshotIndex::open(&b, &nodes(r), 2).await.unwrap();
                let ins = ix.insert(&b, b"k", 2).await.unwrap();
                let found = ix.lookup(&b, b"k").await.unwrap().map(|e| e.location);
                *out.borrow_mut() = Some((ins, found, ix.paths()));
            });
            sim.run().unwrap();
            let (ins, found, paths) = got.borrow_mut().take().expect("B finished");
            let want = match ins {
                Insert::New(e) => {
                    assert!(!a_done.get(), "{r} replicas, crash at {at}: A's insert was acknowledged");
                    e.location
                }
                Insert::Exists(e) => e.location,
            };
            assert_eq!(found, Some(want), "{r} replicas, crash at {at}");
            if a_done.get() {
                assert_eq!(want, 1, "A's acknowledged insert stays");
            }
            assert!(split_slots(&sim).is_empty(), "{r} replicas, crash at {at}: {:?}", split_slots(&sim));
            assert_eq!(audit_of(&sim).len(), 1);
            helped += paths.help;
        }
    }
    assert!(helped > 0, "some crash should stop A between its backups and its commit");
}

/// A lease on the view: taken from a majority of the view words, lasting
/// `L` from when the reads were sent, refused while a newer view is being
/// prepared on any replica of the majority read, and not waiting for a
/// failed replica.
#[test]
fn the_view_lease_follows_the_newest_view() {
    use super::view::{Phase, Timing, View, ViewError, ViewLease};
    let mut sim = sim_of(4, 3);
    setup_on(&mut sim, 3, 4);
    let h = header_of(&sim);
    let mem = sim.client();
    let timing = Timing { lease_ns: 100_000, landing_ns: 10_000 };
    let h2 = h.clone();
    sim.block_on(async move {
        let h = h2;
        let mut lease = ViewLease::new(timing);
        assert!(!lease.covers(0), "no lease before the first renewal");
        let sent = mem.now();
        assert_eq!(lease.renew(&mem, &h, sent).await, Ok(View::FIRST));
        assert!(lease.covers(sent + 89_999) && !lease.covers(sent + 90_000), "L - D after the send");
        // A master prepares epoch 1 without replica 2 on a majority.
        let prepare = View { epoch: 1, excluded: 0b100, phase: Phase::Prepare, joiners: 0, nonce: 5 };
        for i in [0, 1] {
            assert_eq!(mem.cas(h.view_addr(i), 0, prepare.encode()).await, Ok(0));
        }
        assert_eq!(lease.renew(&mem, &h, mem.now()).await, Err(ViewError::Changing(prepare)));
        // Installed: the lease follows it, with replica 2 failed and out.
        let stable = View { phase: Phase::Stable, ..prepare };
        for i in [0, 1] {
            mem.cas(h.view_addr(i), prepare.encode(), stable.encode()).await.unwrap();
        }
    })
    .unwrap();
    let now = sim.now();
    sim.crash_node_at(2, now, crate::sim::CrashMode::Hang);
    let mem = sim.client();
    let h2 = h.clone();
    sim.block_on(async move {
        let h = h2;
        let mut lease = ViewLease::new(timing);
        let v = lease.renew(&mem, &h, mem.now()).await.unwrap();
        assert_eq!((v.epoch, v.excluded, v.phase), (1, 0b100, Phase::Stable));
        let slot = h.logical().buckets() + 2 * crate::index::GROUP_BYTES;
        let order: Vec<usize> = h.order_without(slot, v.excluded).collect();
        assert_eq!(order, [0, 1], "group 2's primary (replica 2) moves to replica 0");
        // A garbled view word in the majority read is an error.
        mem.write(h.view_addr(1), &[0xFF; 8]).await.unwrap();
        assert_eq!(lease.renew(&mem, &h, mem.now()).await, Err(ViewError::Corrupt { node: NodeId(1) }));
    })
    .unwrap();
}

/// How long a node's crash stops the index (fixed latency, one client
/// inserting and looking up keys): the failed operation's time-out, then
/// the master's fence (`L + D`) and repair. Printed for the notes; bounded
/// by two leases.
#[test]
fn a_crash_pauses_the_index_for_about_a_lease() {
    use crate::sim::CrashMode::{FailFast, Hang};
    for (node, mode) in [(0, FailFast), (0, Hang), (1, Hang)] {
        let cfg = SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
        let mut sim = Sim::new(cfg);
        setup_on(&mut sim, 3, 16);
        let mem = sim.client();
        let start = sim.now();
        sim.crash_node_at(node, start + 200_000, mode);
        let gaps = sim
            .block_on(async move {
                let mut ix = SnapshotIndex::open(&mem, &nodes(3), 1).await.unwrap();
                let (mut last, mut worst) = (mem.now(), 0);
                for i in 0..200u64 {
                    let k = key(i);
                    assert!(matches!(ix.insert(&mem, &k, i + 1).await, Ok(Insert::New(_))), "insert {i}");
                    assert_eq!(ix.lookup(&mem, &k).await.unwrap().map(|e| e.location), Some(i + 1));
                    worst = worst.max(mem.now() - last);
                    last = mem.now();
                }
                (worst, ix.view(), ix.master_paths())
            })
            .unwrap();
        let (worst, view, paths) = gaps;
        std::println!("node {node} {mode:?}: longest pause {worst} ns, view {view:?}, {paths:?}");
        assert_eq!(view.excluded, 1 << node, "the node is left out");
        assert!(worst < 2 * 10_000_000, "a pause of about one lease (10 ms): {worst} ns");
    }
}

/// A stalled node (its operations hang until the time-out) costs a view
/// change its fence and a few time-outs, not one per block of the scan
/// that repairs the slots (an index of 2048 groups, 24 blocks): the master
/// does not ask the replica it leaves out (3 replicas, node 1 stalls: no
/// read unanswered), and stops asking one that did not answer (5
/// replicas, node 1 fails and node 2 stalls during the fence, so the scan
/// asks it once; the mutant `scan-asks-again` asks it 24 times). The
/// replica the scan missed is left out of the view the change installs,
/// not left in unrepaired until a writer suspects it (one view change,
/// where the mutant `view-keeps-unrepaired` takes two).
#[test]
fn a_stalled_node_costs_the_repair_scan_one_time_out() {
    use crate::sim::CrashMode::{FailFast, Hang};
    let cases = [(3, &[(1, Hang, 200_000)][..], 0), (5, &[(1, FailFast, 200_000), (2, Hang, 2_000_000)][..], 1)];
    for (r, crashes, unanswered) in cases {
        let changes = 1;
        let cfg = SimConfig { nodes: r, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
        let (timeout, lease) = (cfg.timeout_ns, config(1).timing.lease_ns);
        let mut sim = Sim::new(cfg);
        setup_on(&mut sim, r, 2048);
        let mem = sim.client();
        let start = sim.now();
        for &(node, mode, at) in crashes {
            sim.crash_node_at(node, start + at, mode);
        }
        let (worst, view, paths) = sim
            .block_on(async move {
                let mut ix = SnapshotIndex::open(&mem, &nodes(r), 1).await.unwrap();
                let (mut last, mut worst) = (mem.now(), 0);
                for i in 0..100u64 {
                    assert!(matches!(ix.insert(&mem, &key(i), i + 1).await, Ok(Insert::New(_))), "insert {i}");
                    worst = worst.max(mem.now() - last);
                    last = mem.now();
                }
                (worst, ix.view(), ix.master_paths())
            })
            .unwrap();
        std::println!("{r} replicas: longest pause {worst} ns (time-out {timeout} ns, lease {lease} ns), {paths:?}");
        assert_eq!(view.excluded, crashes.iter().fold(0, |m, c| m | 1 << c.0), "the nodes are left out");
        assert_eq!(paths.unanswered, unanswered, "reads of the repair scan left unanswered: {paths:?}");
        assert_eq!(paths.views, changes, "view changes: {paths:?}");
        // One view change per crash, each a lease and a few time-outs.
        let bound = crashes.len() as u64 * (lease + lease / 64 + 5 * timeout);
        assert!(worst < bound, "a pause of a lease and a few time-outs per crash: {worst} ns");
    }
}

/// Records beside the index: written to every replica (one roundtrip),
/// read from one; a copy that is missing (zeroed here) or a replica that
/// is down makes the reader take another's; no whole copy anywhere is
/// corruption, and an out-of-arena offset is refused.
#[test]
fn records_are_read_from_any_replica_that_holds_them() {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() });
    setup_on(&mut sim, 3, 4);
    let m = Counted::new(sim.client());
    let whole = |b: &[u8]| (b.iter().all(|&x| x == 7)).then_some(());
    let (off, first) = sim
        .block_on(async move {
            let mut ix = SnapshotIndex::open(&m, &nodes(3), 1).await.unwrap();
            let off = ix.alloc_record(&m, 100).await.unwrap();
            let rec = ix.records();
            m.reset();
            rec.write(&m, off, &[7u8; 100]).await.unwrap();
            assert_eq!(m.roundtrips(), 1, "a record is written in one roundtrip");
            m.reset();
            assert_eq!(rec.read(&m, off, 100, whole).await, Ok(()));
            assert_eq!(m.roundtrips(), 1, "and read in one");
            assert!(rec.write(&m, 1 << 40, &[1]).await.is_err(), "an offset beyond the arena");
            // The first replica a reader tries loses its copy: the others
            // have it.
            let first = ((off / 64) % 3) as usize;
            let site = ix.header().sites()[first];
            m.write(crate::RemoteAddr::new(site.node, site.base + off), &[0u8; 100]).await.unwrap();
            m.reset();
            assert_eq!(rec.read(&m, off, 100, whole).await, Ok(()));
            assert_eq!(m.roundtrips(), 2, "one more for the others");
            let never = |_: &[u8]| None::<()>;
            assert!(matches!(rec.read(&m, off, 100, never).await, Err(IndexError::Corrupt { .. })));
            (off, first)
        })
        .unwrap();
    // A replica down too: the third still has it.
    let now = sim.now();
    sim.crash_node_at((first + 1) % 3, now, crate::sim::CrashMode::FailFast);
    let m = sim.client();
    sim.block_on(async move {
        let ix = SnapshotIndex::open(&m, &nodes(3), 3).await.unwrap();
        assert_eq!(ix.records().read(&m, off, 100, whole).await, Ok(()));
    })
    .unwrap();
}

/// A lapsed view lease is renewed in the operation's first roundtrip when
/// that roundtrip is reads (design F9): after a pause longer than the
/// lease, lookups, inserts and `still` take the roundtrips of the table
/// (a write from a known entry, whose first roundtrip is CASes, renews
/// first: one more); opening the index takes the lease beside the arena's
/// cursors, so a new client's first operation renews nothing.
#[test]
fn a_lapsed_lease_rides_the_operations_first_roundtrip() {
    let cfg = SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
    let mut sim = Sim::new(cfg);
    let timing = Timing { lease_ns: 400_000, landing_ns: 50_000 };
    let admin = sim.client();
    sim.block_on(async move {
        for n in nodes(3) {
            Region::format(&admin, n, NODE_SIZE, CHUNK).await.unwrap();
        }
        SnapshotIndex::open_or_create(&admin, &nodes(3), SnapshotConfig { timing, ..config(64) }).await.unwrap();
    })
    .unwrap();
    let mem = sim.client();
    let (rtts, paths) = sim
        .block_on(async move {
            let c = Counted::new(&mem);
            let mut ix = SnapshotIndex::open(&c, &nodes(3), 1).await.unwrap();
            let mut rtts = Vec::new();
            rtts.push(("open", c.roundtrips()));
            c.reset();
            assert_eq!(ix.lookup(&c, b"absent").await, Ok(None));
            rtts.push(("first lookup", c.roundtrips()));
            ix.insert(&mem, b"warm-up", 1).await.unwrap();
            let lapse = async || mem.sleep(timing.lease_ns + 1_000).await;
            lapse().await;
            c.reset();
            let Insert::New(e) = ix.insert(&c, b"k", 10).await.unwrap() else { panic!("new") };
            rtts.push(("insert new", c.roundtrips()));
            lapse().await;
            c.reset();
            assert_eq!(ix.lookup(&c, b"k").await, Ok(Some(e)));
            rtts.push(("lookup present", c.roundtrips()));
            lapse().await;
            c.reset();
            assert_eq!(ix.lookup(&c, b"absent").await, Ok(None));
            rtts.push(("lookup absent", c.roundtrips()));
            lapse().await;
            c.reset();
            assert_eq!(ix.still(&c, b"k", &e).await, Ok(true));
            rtts.push(("still", c.roundtrips()));
            lapse().await;
            c.reset();
            let Ok(Change::Done { now: Some(e), .. }) = ix.update(&c, b"k", Expect::Any, 11).await else { panic!() };
            rtts.push(("update by key", c.roundtrips()));
            lapse().await;
            c.reset();
            let Ok(Change::Done { .. }) = ix.update(&c, b"k", Expect::Entry(e), 12).await else { panic!() };
            rtts.push(("update by entry", c.roundtrips()));
            (rtts, ix.master_paths())
        })
        .unwrap();
    std::println!("after a lapsed lease: {rtts:?}, {paths:?}");
    let want = [
        ("open", 3),
        ("first lookup", 1),
        ("insert new", 3),
        ("lookup present", 2),
        ("lookup absent", 1),
        ("still", 1),
        ("update by key", 4),
        ("update by entry", 3),
    ];
    assert_eq!(rtts, want);
    assert_eq!((paths.rides, paths.rides_dropped), (5, 0), "{paths:?}");
}

/// A ride whose renewal finds that the view changed drops its reads: they
/// were addressed in the old view, and may have read a replica that the
/// new view left out and that missed the writes since. Here a client's
/// lease lapses; meanwhile its key's primary stalls, another client's
/// update leaves it out and changes the key on the new primary, and the
/// stalled node comes back with its old words. The first client's lookup
/// rides its renewal and must not answer the old location (the mutant
/// `index-ride-unchecked` does).
#[test]
fn a_ride_that_finds_a_new_view_drops_its_reads() {
    let cfg = SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000);
    let mut sim = Sim::new(cfg);
    setup_on(&mut sim, 3, 16);
    let lease = config(16).timing.lease_ns;
    let (mem, other) = (sim.client(), sim.client());
    let (ix, e) = sim
        .block_on(async move {
            let mut ix = SnapshotIndex::open(&mem, &nodes(3), 1).await.unwrap();
            let Insert::New(e) = ix.insert(&mem, b"k", 10).await.unwrap() else { panic!("new") };
            (ix, e)
        })
        .unwrap();
    let primary = e.slot.node.0 as usize;
    let start = sim.now();
    sim.crash_node_at(primary, start + 1_000, crate::sim::CrashMode::Hang);
    sim.heal_node_at(primary, start + 3 * lease);
    let (mut ix, mem) = (ix, sim.client());
    let (got, paths, view) = sim
        .block_on(async move {
            let mut b = SnapshotIndex::open(&other, &nodes(3), 2).await.unwrap();
            other.sleep(2_000).await;
            let done = b.update(&other, b"k", Expect::Any, 20).await;
            assert!(matches!(done, Ok(Change::Done { .. })), "{done:?}");
            assert_ne!(b.view().excluded, 0, "the stalled primary was left out");
            mem.sleep((start + 3 * lease + 10_000).saturating_sub(mem.now())).await;
            let got = ix.lookup(&mem, b"k").await.unwrap().map(|e| e.location);
            (got, ix.master_paths(), ix.view())
        })
        .unwrap();
    std::println!("lookup after the ride: {got:?}, view {view:?}, {paths:?}");
    assert_eq!(got, Some(20), "the lookup answered the left-out replica's old location");
    assert!(paths.rides >= 1 && paths.rides_dropped >= 1, "{paths:?}");
}
