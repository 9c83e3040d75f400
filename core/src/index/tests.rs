//! The index under the simulator: operations one by one, full buckets,
//! roundtrips, a model-based property test, seeded campaigns of concurrent
//! clients whose histories must be linearizable and whose memory must hold
//! exactly one slot per key, and garbled memory.
//!
//! A failing campaign run names its seed; replay it with
//! `SWARM_SEED=<seed> cargo test -p swarm-core --lib index::tests::replay -- --nocapture`.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::collections::HashMap;

use proptest::prelude::*;

use super::cache::{CacheConfig, Eviction, LocationCache};
use super::snapshot::master::MasterPaths;
use super::snapshot::slot::SlotPaths;
use super::*;
use crate::sim::{Sim, SimConfig, SimMemory};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::{ROOTS_OFFSET, Region};
use swarm_lincheck::{self as lincheck, History, Model};

pub(super) const NODE_SIZE: u64 = 4 << 20;
pub(super) const CHUNK: u64 = 64 << 10;
const NODE: NodeId = NodeId(0);
pub(super) const MAX_KEY_LEN: usize = 24;

fn new_sim(seed: u64) -> Sim {
    sim_of(seed, 1)
}

pub(super) fn sim_of(seed: u64, nodes: usize) -> Sim {
    Sim::new(SimConfig { seed, nodes, node_size: NODE_SIZE, ..SimConfig::default() })
}

/// Formats node 0 and creates an index of `groups` groups on it.
fn setup(sim: &mut Sim, groups: u64) {
    let admin = sim.client();
    sim.block_on(async move {
        Region::format(&admin, NODE, NODE_SIZE, CHUNK).await.unwrap();
        let cfg = IndexConfig { groups, max_key: MAX_KEY_LEN, seed: 11 };
        RaceIndex::open_or_create(&admin, NODE, cfg).await.unwrap();
    })
    .unwrap();
}

pub(super) fn key(i: u64) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn peek_word(sim: &Sim, offset: u64) -> u64 {
    u64::from_le_bytes(sim.peek(0, offset, 8).unwrap().try_into().unwrap())
}

fn geometry(sim: &Sim) -> Geometry {
    let root = peek_word(sim, ROOTS_OFFSET + 8 * crate::substrate::space::roots::INDEX.slot);
    let header = sim.peek(0, root, HEADER_BYTES as usize).unwrap();
    Geometry::decode(NODE, root, &header, NODE_SIZE).unwrap()
}

/// Every live slot of the index, read outside virtual time: key -> (slot
/// offset, location) for each slot that maps it.
fn audit(sim: &Sim) -> BTreeMap<Vec<u8>, Vec<(u64, u64)>> {
    let geo = geometry(sim);
    let mut out: BTreeMap<Vec<u8>, Vec<(u64, u64)>> = BTreeMap::new();
    for s in 0..geo.slots() {
        let offset = geo.buckets() + 8 * s;
        let w = SlotWord(peek_word(sim, offset));
        if !w.is_live() {
            continue;
        }
        let addr = geo.block_addr(w, w.key_len()).expect("a live slot points to a block");
        let bytes = sim.peek(0, addr.offset, block_len(w.key_len())).unwrap();
        let (location, k) = Block::decode(&bytes, w.key_len()).expect("a published block is whole");
        out.entry(k.to_vec()).or_default().push((offset, location));
    }
    out
}

/// An index under test: how a simulator is set up for it, how a client
/// opens it, and what it maps (read outside virtual time). The campaigns
/// and the model-based property run on each ([`Race`] here, the replicated
/// index in `snapshot::tests`).
pub(super) trait Under {
    /// The index.
    type Ix: Index;
    /// Memory nodes of the simulator.
    const NODES: usize;
    /// Formats the nodes and creates an index of `groups` groups.
    fn setup(sim: &mut Sim, groups: u64);
    /// Client `id`'s handle.
    fn open(mem: &SimMemory, id: u32) -> impl core::future::Future<Output = Self::Ix>;
    /// Every live slot: key -> (slot, location) for each slot that maps it.
    fn audit(sim: &Sim) -> BTreeMap<Vec<u8>, Vec<(u64, u64)>>;
    /// What must hold of memory once every client finished and none
    /// crashed (the replicated index: replicas agree).
    fn settled(sim: &Sim) -> Result<(), alloc::string::String> {
        let _ = sim;
        Ok(())
    }
    /// The paths a handle's writes took (if it counts them).
    fn paths(ix: &Self::Ix) -> SlotPaths {
        let _ = ix;
        SlotPaths::default()
    }
    /// The view changes a handle took part in (if it has views).
    fn master_paths(ix: &Self::Ix) -> MasterPaths {
        let _ = ix;
        MasterPaths::default()
    }
}

/// The single-node index on node 0.
pub(super) struct Race;

impl Under for Race {
    type Ix = RaceIndex;
    const NODES: usize = 1;

    fn setup(sim: &mut Sim, groups: u64) {
        setup(sim, groups)
    }

    async fn open(mem: &SimMemory, _id: u32) -> RaceIndex {
        RaceIndex::open(mem, NODE).await.unwrap()
    }

    fn audit(sim: &Sim) -> BTreeMap<Vec<u8>, Vec<(u64, u64)>> {
        audit(sim)
    }
}

#[test]
fn insert_lookup_update_remove() {
    let mut sim = new_sim(1);
    setup(&mut sim, 16);
    let mem = sim.client();
    sim.block_on(async move {
        let mut ix = RaceIndex::open(&mem, NODE).await.unwrap();
        assert_eq!(ix.max_key(), MAX_KEY_LEN);
        let k = b"alpha";
        assert_eq!(ix.lookup(&mem, k).await, Ok(None));
        let Insert::New(e1) = ix.insert(&mem, k, 100).await.unwrap() else { panic!("a new key") };
        assert_eq!(e1.location, 100);
        assert_eq!(ix.lookup(&mem, k).await, Ok(Some(e1)));
        assert_eq!(ix.insert(&mem, k, 200).await, Ok(Insert::Exists(e1)), "insert does not overwrite");

        // Updates: unconditional, by location, by entry.
        let Change::Done { previous: 100, now: Some(e2) } = ix.update(&mem, k, Expect::Any, 200).await.unwrap() else {
            panic!("update")
        };
        assert_eq!((e2.location, e2.slot), (200, e1.slot), "same slot, new block");
        assert_eq!(ix.update(&mem, k, Expect::Location(100), 300).await, Ok(Change::Mismatch { current: e2 }));
        assert_eq!(ix.update(&mem, k, Expect::Entry(e1), 300).await, Ok(Change::Mismatch { current: e2 }));
        let Change::Done { previous: 200, now: Some(e3) } =
            ix.update(&mem, k, Expect::Location(200), 300).await.unwrap()
        else {
            panic!("update by location")
        };
        let Change::Done { previous: 300, now: Some(e4) } = ix.update(&mem, k, Expect::Entry(e3), 400).await.unwrap()
        else {
            panic!("update by entry")
        };
        assert_eq!(ix.lookup(&mem, k).await, Ok(Some(e4)));

        // Removal, then the key is gone for everyone.
        assert_eq!(ix.remove(&mem, k, Expect::Location(1)).await, Ok(Change::Mismatch { current: e4 }));
        assert_eq!(ix.remove(&mem, k, Expect::Any).await, Ok(Change::Done { previous: 400, now: None }));
        assert_eq!(ix.lookup(&mem, k).await, Ok(None));
        assert_eq!(ix.update(&mem, k, Expect::Any, 5).await, Ok(Change::NotFound));
        assert_eq!(ix.remove(&mem, k, Expect::Any).await, Ok(Change::NotFound));
        assert_eq!(ix.remove(&mem, k, Expect::Entry(e4)).await, Ok(Change::NotFound));
        // Inserting it again takes its old slot back.
        let Insert::New(e5) = ix.insert(&mem, k, 500).await.unwrap() else { panic!("re-insert") };
        assert_eq!(e5.slot, e1.slot);

        // Empty and longest keys; the limits.
        for k in [&b""[..], &[7u8; MAX_KEY_LEN][..]] {
            assert!(matches!(ix.insert(&mem, k, 9).await, Ok(Insert::New(_))));
            assert_eq!(ix.lookup(&mem, k).await.unwrap().map(|e| e.location), Some(9));
        }
        let long = [7u8; MAX_KEY_LEN + 1];
        let too_long = IndexError::KeyTooLong { len: MAX_KEY_LEN + 1, max: MAX_KEY_LEN };
        assert_eq!(ix.insert(&mem, &long, 1).await, Err(too_long));
        assert_eq!(ix.lookup(&mem, &long).await, Err(too_long));
        assert_eq!(ix.update(&mem, &long, Expect::Any, 1).await, Err(too_long));
        assert_eq!(ix.remove(&mem, &long, Expect::Any).await, Err(too_long));
        assert_eq!(ix.insert(&mem, b"zero", 0).await, Err(IndexError::ZeroLocation));
        assert_eq!(ix.update(&mem, k, Expect::Any, 0).await, Err(IndexError::ZeroLocation));
        // An entry of another key, or a forged one, is refused.
        let e9 = ix.lookup(&mem, b"").await.unwrap().unwrap();
        assert_eq!(ix.remove(&mem, k, Expect::Entry(e9)).await, Err(IndexError::BadEntry));
        let forged = Entry { word: e5.word ^ (1 << 56), ..e5 };
        assert_eq!(ix.update(&mem, k, Expect::Entry(forged), 1).await, Err(IndexError::BadEntry));

        // Background removal: no answer, applied later.
        ix.remove_background(&mem, k, &e5).unwrap();
        mem.sleep(100_000).await;
        assert_eq!(ix.lookup(&mem, k).await, Ok(None));
    })
    .unwrap();
    let live = audit(&sim);
    assert_eq!(live.len(), 2, "the empty and the longest key: {live:?}");
}

/// With one group, every key has the same 24 candidates: both main
/// buckets fill first (alternately), then the shared overflow bucket, then
/// the index is full. A removed key keeps its slot for itself.
#[test]
fn full_buckets_overflow_then_refuse() {
    let mut sim = new_sim(2);
    setup(&mut sim, 1);
    let mem = sim.client();
    let (geo, overflow_at_16, overflow_at_24) = {
        let g = geometry(&sim);
        (g, g.buckets() + 64, g.buckets() + 128)
    };
    let _ = overflow_at_24;
    let slots = sim
        .block_on(async move {
            let mut ix = RaceIndex::open(&mem, NODE).await.unwrap();
            let mut slots = Vec::new();
            for i in 0..24 {
                let Insert::New(e) = ix.insert(&mem, &key(i), i + 1).await.unwrap() else { panic!("key {i}") };
                slots.push(e.slot.offset);
            }
            assert_eq!(ix.insert(&mem, &key(24), 25).await, Err(IndexError::Full { node: NODE }));
            for i in 0..24 {
                assert_eq!(ix.lookup(&mem, &key(i)).await.unwrap().map(|e| e.location), Some(i + 1));
            }
            assert_eq!(ix.lookup(&mem, &key(24)).await, Ok(None));
            // A removed key's slot is not given to another key...
            assert!(matches!(ix.remove(&mem, &key(3), Expect::Any).await, Ok(Change::Done { .. })));
            assert_eq!(ix.insert(&mem, &key(24), 25).await, Err(IndexError::Full { node: NODE }));
            // ...but taken back by the same key.
            let Insert::New(e) = ix.insert(&mem, &key(3), 99).await.unwrap() else { panic!("re-insert") };
            assert_eq!(e.slot.offset, slots[3]);
            slots
        })
        .unwrap();
    let (main0, main1) = (geo.buckets(), geo.buckets() + 128);
    let in_bucket = |s: u64, b: u64| s >= b && s < b + 64;
    assert!(slots[..16].iter().all(|&s| in_bucket(s, main0) || in_bucket(s, main1)), "mains first: {slots:?}");
    assert_eq!(slots[..16].iter().filter(|&&s| in_bucket(s, main0)).count(), 8, "both mains evenly");
    assert!(slots[16..].iter().all(|&s| in_bucket(s, overflow_at_16)), "then the overflow bucket: {slots:?}");
}

/// Clients that race to create the index all end up on the same one.
#[test]
fn racing_creators_share_one_index() {
    for seed in 0..50 {
        let mut sim = new_sim(seed);
        let admin = sim.client();
        sim.block_on(async move {
            Region::format(&admin, NODE, NODE_SIZE, CHUNK).await.unwrap();
            assert_eq!(RaceIndex::open(&admin, NODE).await.err(), Some(IndexError::NoIndex { node: NODE }));
            let bad = IndexConfig { groups: 4, max_key: 256, seed: 0 };
            assert!(matches!(RaceIndex::open_or_create(&admin, NODE, bad).await, Err(IndexError::BadConfig(_))));
        })
        .unwrap();
        let headers = Rc::new(RefCell::new(Vec::new()));
        for c in 0..3u64 {
            let (mem, headers) = (sim.client(), headers.clone());
            sim.spawn(&mem.clone(), async move {
                let cfg = IndexConfig { groups: 8 + c, ..IndexConfig::for_keys(64, MAX_KEY_LEN) };
                let mut ix = RaceIndex::open_or_create(&mem, NODE, cfg).await.unwrap();
                headers.borrow_mut().push(ix.geometry().header);
                assert!(matches!(ix.insert(&mem, &key(c), c + 1).await, Ok(Insert::New(_))));
            });
        }
        sim.run().unwrap();
        let h = headers.borrow();
        assert!(h.iter().all(|&x| x == h[0]), "seed {seed}: {h:?}");
        assert_eq!(audit(&sim).len(), 3, "seed {seed}");
    }
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
    remove_background: u32,
    cache_miss: u32,
    cache_hit: u32,
}

/// Exact roundtrips per operation (fixed latency, no contention), the
/// figures of the module documentation's table.
#[test]
fn roundtrips_per_operation() {
    let mut sim = Sim::new(SimConfig { nodes: 1, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    setup(&mut sim, 64);
    let mem = sim.client();
    let runs = sim
        .block_on(async move {
            let mut ix = RaceIndex::open(&mem, NODE).await.unwrap();
            // Warm-up: the first insert takes a chunk for key blocks.
            ix.insert(&mem, b"warm-up", 1).await.unwrap();
            let mut cache: LocationCache<[u8; 32]> =
                LocationCache::new(CacheConfig { capacity: 16, max_key: MAX_KEY_LEN, eviction: Eviction::Lru });
            let mut runs = Vec::new();
            for i in 0..20u64 {
                let mut r = Rtts::default();
                let c = Counted::new(&mem);
                let k = key(i);
                let Insert::New(e) = ix.insert(&c, &k, i + 10).await.unwrap() else { panic!("new") };
                r.insert_new = c.roundtrips();
                c.reset();
                assert!(matches!(ix.insert(&c, &k, 1).await, Ok(Insert::Exists(_))));
                r.insert_present = c.roundtrips();
                c.reset();
                assert_eq!(ix.lookup(&c, &k).await, Ok(Some(e)));
                r.lookup_present = c.roundtrips();
                c.reset();
                assert_eq!(ix.lookup(&c, &key(1000 + i)).await, Ok(None));
                r.lookup_absent = c.roundtrips();
                c.reset();
                let Ok(Change::Done { now: Some(e), .. }) = ix.update(&c, &k, Expect::Any, 7).await else { panic!() };
                r.update_by_key = c.roundtrips();
                c.reset();
                let Ok(Change::Done { now: Some(e), .. }) = ix.update(&c, &k, Expect::Entry(e), 8).await else {
                    panic!()
                };
                r.update_by_entry = c.roundtrips();
                c.reset();
                let located = locate(&mut ix, &c, &mut cache, &k, [0; 32]).await.unwrap().unwrap();
                assert_eq!(located, Located { location: 8, cached: false });
                r.cache_miss = c.roundtrips();
                c.reset();
                let located = locate(&mut ix, &c, &mut cache, &k, [0; 32]).await.unwrap().unwrap();
                assert_eq!(located, Located { location: 8, cached: true });
                r.cache_hit = c.roundtrips();
                c.reset();
                if i % 2 == 0 {
                    assert!(matches!(ix.remove(&c, &k, Expect::Entry(e)).await, Ok(Change::Done { .. })));
                    r.remove_by_entry = c.roundtrips();
                } else {
                    ix.remove_background(&c, &k, &e).unwrap();
                    r.remove_background = c.roundtrips();
                    r.remove_by_entry = 1;
                }
                runs.push(r);
            }
            runs
        })
        .unwrap();
    let want = Rtts {
        insert_new: 2,
        insert_present: 2,
        lookup_present: 2,
        lookup_absent: 1,
        update_by_key: 3,
        update_by_entry: 1,
        remove_by_entry: 1,
        remove_background: 0,
        cache_miss: 2,
        cache_hit: 0,
    };
    std::println!("index roundtrips: {want:?}");
    assert!(runs.iter().all(|r| *r == want), "{runs:#?}");
}

// ---------------------------------------------------------------------------
// The sequential specification, for proptest and lincheck.

/// An index operation on key number `.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum IxOp {
    Insert(u8, u64),
    Lookup(u8),
    /// Key, expected location (`None`: any), new location.
    Update(u8, Option<u64>, u64),
    Remove(u8, Option<u64>),
}

/// What it answered (locations only; slots and words are not specified).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum IxRet {
    New,
    Exists(u64),
    Found(Option<u64>),
    Done(u64),
    NotFound,
    Mismatch(u64),
}

/// One key -> location map per key.
pub(super) struct IndexModel;

impl Model for IndexModel {
    type State = Option<u64>;
    type Input = IxOp;
    type Output = IxRet;
    type Key = u8;

    fn init(&self) -> Option<u64> {
        None
    }

    fn step(&self, s: &Option<u64>, op: &IxOp) -> (Option<u64>, IxRet) {
        let cond = |exp: Option<u64>, cur: u64| exp.is_none_or(|e| e == cur);
        match (*op, *s) {
            (IxOp::Insert(_, l), None) => (Some(l), IxRet::New),
            (IxOp::Insert(..), Some(c)) => (Some(c), IxRet::Exists(c)),
            (IxOp::Lookup(_), s) => (s, IxRet::Found(s)),
            (IxOp::Update(..) | IxOp::Remove(..), None) => (None, IxRet::NotFound),
            (IxOp::Update(_, e, l), Some(c)) if cond(e, c) => (Some(l), IxRet::Done(c)),
            (IxOp::Remove(_, e), Some(c)) if cond(e, c) => (None, IxRet::Done(c)),
            (IxOp::Update(..) | IxOp::Remove(..), Some(c)) => (Some(c), IxRet::Mismatch(c)),
        }
    }

    fn key(&self, op: &IxOp) -> u8 {
        match *op {
            IxOp::Insert(k, _) | IxOp::Lookup(k) | IxOp::Update(k, ..) | IxOp::Remove(k, _) => k,
        }
    }

    fn is_read_only(&self, op: &IxOp) -> bool {
        matches!(op, IxOp::Lookup(_))
    }
}

/// Runs `op` on the index; the answer in the model's terms, or the error.
pub(super) async fn run_op<I: Index, M: Memory>(
    ix: &mut I,
    mem: &M,
    keys: &[Vec<u8>],
    op: IxOp,
) -> Result<IxRet, IndexError> {
    let k = |i: u8| &keys[i as usize][..];
    let expect = |e: Option<u64>| e.map_or(Expect::Any, Expect::Location);
    let change = |c: Change| match c {
        Change::Done { previous, .. } => IxRet::Done(previous),
        Change::NotFound => IxRet::NotFound,
        Change::Mismatch { current } => IxRet::Mismatch(current.location),
    };
    Ok(match op {
        IxOp::Insert(i, l) => match ix.insert(mem, k(i), l).await? {
            Insert::New(e) => {
                assert_eq!(e.location, l);
                IxRet::New
            }
            Insert::Exists(e) => IxRet::Exists(e.location),
        },
        IxOp::Lookup(i) => IxRet::Found(ix.lookup(mem, k(i)).await?.map(|e| e.location)),
        IxOp::Update(i, e, l) => change(ix.update(mem, k(i), expect(e), l).await?),
        IxOp::Remove(i, e) => change(ix.remove(mem, k(i), expect(e)).await?),
    })
}

/// `n` distinct keys: the empty key, then keys of 1 to `MAX_KEY_LEN` bytes.
pub(super) fn keys_of_all_lengths(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| if i == 0 { Vec::new() } else { (0..1 + (i * 7) % MAX_KEY_LEN).map(|j| (i + j * 31) as u8).collect() })
        .collect()
}

pub(super) fn op_strategy(keys: u8) -> impl Strategy<Value = IxOp> {
    let loc = 1u64..6;
    let exp = proptest::option::of(1u64..6);
    prop_oneof![
        (0..keys, loc.clone()).prop_map(|(k, l)| IxOp::Insert(k, l)),
        (0..keys).prop_map(IxOp::Lookup),
        (0..keys, exp.clone(), loc).prop_map(|(k, e, l)| IxOp::Update(k, e, l)),
        (0..keys, exp).prop_map(|(k, e)| IxOp::Remove(k, e)),
    ]
}

/// One client's random operations give the answers of a `HashMap`, and
/// memory ends with one live slot per key the map holds.
pub(super) fn one_client_matches_a_hash_map_on<U: Under>(ops: Vec<IxOp>, groups: u64) -> Result<(), TestCaseError> {
    let mut sim = sim_of(3, U::NODES);
    U::setup(&mut sim, groups);
    let mem = sim.client();
    let keys = keys_of_all_lengths(8);
    let ks = keys.clone();
    let (answers, model) = sim
        .block_on(async move {
            let mut ix = U::open(&mem, 1).await;
            let mut model: HashMap<u8, u64> = HashMap::new();
            let mut answers = Vec::new();
            for op in ops {
                let got = run_op(&mut ix, &mem, &ks, op).await;
                let (next, want) = IndexModel.step(&model.get(&IndexModel.key(&op)).copied(), &op);
                match next {
                    Some(l) => model.insert(IndexModel.key(&op), l),
                    None => model.remove(&IndexModel.key(&op)),
                };
                answers.push((op, got, want));
            }
            (answers, model)
        })
        .unwrap();
    for (op, got, want) in answers {
        prop_assert_eq!(got, Ok(want), "{:?}", op);
    }
    let live = U::audit(&sim);
    prop_assert_eq!(live.len(), model.len());
    for (k, l) in model {
        prop_assert_eq!(live.get(&keys[k as usize]).cloned().map(|v| v.len()), Some(1));
        prop_assert_eq!(live[&keys[k as usize]][0].1, l);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn one_client_matches_a_hash_map(ops in proptest::collection::vec(op_strategy(8), 1..80), groups in 1u64..4) {
        one_client_matches_a_hash_map_on::<Race>(ops, groups)?;
    }
}

// ---------------------------------------------------------------------------
// Campaigns.

pub(super) struct Campaign {
    pub(super) clients: u32,
    pub(super) keys: u8,
    pub(super) ops_per_client: usize,
    /// Only inserts (then lookups), every client starting with key 0 at once.
    pub(super) inserts_only: bool,
    pub(super) crash_one: bool,
    /// Stalls of random nodes, each shorter than the operation time-out:
    /// late operations land out of order, none fails.
    pub(super) stalls: bool,
    /// A crash of one random node (a replicated index must survive it).
    pub(super) crash_node: Option<crate::sim::CrashMode>,
    /// The crashed node comes back with its memory, while the view change
    /// that leaves it out is under way or soon after (a replicated index
    /// brings it back).
    pub(super) heal: bool,
}

pub(super) struct Outcome {
    history: History<IxOp, IxRet>,
    /// (client, op, answer) of completed inserts.
    inserts: Vec<(u32, IxOp, IxRet)>,
    live: BTreeMap<Vec<u8>, Vec<(u64, u64)>>,
    errors: Vec<IndexError>,
    /// The paths of the clients' writes (the replicated index counts them).
    pub(super) paths: SlotPaths,
    /// The view changes of the clients (the replicated index's).
    pub(super) views: MasterPaths,
}

fn campaign<U: Under>(seed: u64, c: &Campaign) -> Outcome {
    let mut sim = sim_of(seed, U::NODES);
    // Two groups: every key competes with every other for the same slots.
    U::setup(&mut sim, 2);
    let paths = Rc::new(RefCell::new(SlotPaths::default()));
    let views = Rc::new(RefCell::new(MasterPaths::default()));
    let keys = Rc::new(keys_of_all_lengths(c.keys as usize));
    let history = Rc::new(RefCell::new(History::new()));
    let inserts = Rc::new(RefCell::new(Vec::new()));
    let errors = Rc::new(RefCell::new(Vec::new()));
    let mut clients: Vec<SimMemory> = Vec::new();
    for id in 0..c.clients {
        let mem = sim.client();
        clients.push(mem.clone());
        let (keys, history, inserts, errors) = (keys.clone(), history.clone(), inserts.clone(), errors.clone());
        let (paths, views) = (paths.clone(), views.clone());
        let (nkeys, n, inserts_only) = (c.keys, c.ops_per_client, c.inserts_only);
        sim.spawn(&mem.clone(), async move {
            let mut ix = U::open(&mem, id + 1).await;
            let loc = |k: u8, seq: usize| ((id as u64 + 1) << 32) | ((k as u64) << 16) | (seq as u64 + 1);
            let mut ops = Vec::new();
            if inserts_only {
                // Everyone inserts key 0 at once, then a random order of the others.
                ops.push(IxOp::Insert(0, loc(0, 0)));
                let mut rest: Vec<u8> = (1..nkeys).filter(|_| mem.random(0, 3) > 0).collect();
                for i in (1..rest.len()).rev() {
                    rest.swap(i, mem.random(0, i as u64) as usize);
                }
                ops.extend(rest.iter().map(|&k| IxOp::Insert(k, loc(k, 0))));
                ops.extend((0..nkeys).map(IxOp::Lookup));
            } else {
                for seq in 0..n {
                    let k = mem.random(0, nkeys as u64 - 1) as u8;
                    let exp = match mem.random(0, 3) {
                        0 => None,
                        _ => Some(mem.random(1, 5)),
                    };
                    ops.push(match mem.random(0, 6) {
                        0 | 1 => IxOp::Insert(k, loc(k, seq)),
                        2 => IxOp::Lookup(k),
                        3 | 4 => IxOp::Update(k, exp.map(|e| loc(k, e as usize)), loc(k, seq)),
                        _ => IxOp::Remove(k, exp.map(|e| loc(k, e as usize))),
                    });
                }
            }
            for op in ops {
                mem.sleep(mem.random(0, 3_000)).await;
                let call = history.borrow_mut().invoke(id, mem.now(), op);
                match run_op(&mut ix, &mem, &keys, op).await {
                    Ok(ret) => {
                        history.borrow_mut().respond(call, mem.now(), ret);
                        if matches!(op, IxOp::Insert(..)) {
                            inserts.borrow_mut().push((id, op, ret));
                        }
                    }
                    // Left pending: it may or may not have taken effect.
                    Err(e) => errors.borrow_mut().push(e),
                }
            }
            paths.borrow_mut().add(&U::paths(&ix));
            views.borrow_mut().add(&U::master_paths(&ix));
        });
    }
    if c.crash_one {
        let at = sim.random(0, 30_000);
        sim.crash_client_at(&clients[0], at);
    }
    if let Some(mode) = c.crash_node {
        let (node, at) = (sim.random(0, U::NODES as u64 - 1), sim.random(0, 30_000));
        let now = sim.now();
        sim.crash_node_at(node as usize, now + at, mode);
        if c.heal {
            let back = sim.random(5_000, 2_000_000);
            sim.heal_node_at(node as usize, now + at + back);
        }
    }
    if c.stalls {
        // One after another, so that no operation waits longer than one.
        let mut at = sim.now();
        for _ in 0..3 {
            at += sim.random(0, 15_000);
            let (node, ns) = (sim.random(0, U::NODES as u64 - 1), sim.random(1_000, 30_000));
            sim.stall_node_at(node as usize, at, ns);
            at += ns;
        }
    }
    sim.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    if !c.crash_one {
        U::settled(&sim).unwrap_or_else(|e| panic!("{}, seed {seed}: {e}", core::any::type_name::<U>()));
    }
    let live = U::audit(&sim);
    let history = history.replace(History::new());
    let inserts = inserts.replace(Vec::new());
    let errors = errors.replace(Vec::new());
    let (paths, views) = (*paths.borrow(), *views.borrow());
    Outcome { history, inserts, live, errors, paths, views }
}

pub(super) fn check_run<U: Under>(seed: u64, c: &Campaign) -> Outcome {
    let out = campaign::<U>(seed, c);
    let ctx = format!("{}, seed {seed}", core::any::type_name::<U>());
    assert!(out.errors.is_empty(), "{ctx}: errors {:?}", out.errors);
    for (k, slots) in &out.live {
        assert_eq!(slots.len(), 1, "{ctx}: key {k:?} has {} live slots: {slots:?}", slots.len());
    }
    let verdict = lincheck::check(&IndexModel, out.history.operations());
    assert!(verdict.is_linearizable(), "{ctx}: not linearizable: {verdict:?}");
    if c.inserts_only {
        let keys = keys_of_all_lengths(c.keys as usize);
        for k in 0..c.keys {
            let mine: Vec<_> = out.inserts.iter().filter(|(_, op, _)| IndexModel.key(op) == k).collect();
            let winners: Vec<_> = mine.iter().filter(|(_, _, r)| *r == IxRet::New).collect();
            let slots = out.live.get(&keys[k as usize]);
            if mine.is_empty() {
                if !c.crash_one {
                    assert!(slots.is_none(), "{ctx}: key {k} was never inserted");
                }
                continue;
            }
            // No lost insert: the key is there, once, and one insert won.
            let Some(slots) = slots else { panic!("{ctx}: key {k} was inserted and is missing") };
            assert!(winners.len() <= 1, "{ctx}: key {k} inserted by {} clients", winners.len());
            if !c.crash_one {
                assert_eq!(winners.len(), 1, "{ctx}: key {k}: no insert won");
            }
            let l = slots[0].1;
            for (_, op, r) in &mine {
                match (op, r) {
                    (IxOp::Insert(_, mine), IxRet::New) => {
                        assert_eq!(*mine, l, "{ctx}: key {k}: the winner's location")
                    }
                    (_, IxRet::Exists(x)) => assert_eq!(*x, l, "{ctx}: key {k}: losers see the winner's location"),
                    _ => panic!("{ctx}: key {k}: {op:?} answered {r:?}"),
                }
            }
        }
    }
    out
}

pub(super) const INSERTS: Campaign = Campaign {
    clients: 4,
    keys: 8,
    ops_per_client: 0,
    inserts_only: true,
    crash_one: false,
    stalls: false,
    crash_node: None,
    heal: false,
};
pub(super) const MIXED: Campaign = Campaign {
    clients: 4,
    keys: 4,
    ops_per_client: 12,
    inserts_only: false,
    crash_one: false,
    stalls: false,
    crash_node: None,
    heal: false,
};

/// Concurrent inserts of overlapping key sets (all clients start with the
/// same key at the same time), then lookups.
#[test]
fn concurrent_inserts_leave_one_slot_per_key() {
    let mut contested = 0;
    for seed in 0..300 {
        let out = check_run::<Race>(seed, &INSERTS);
        contested += out.inserts.iter().filter(|(_, _, r)| matches!(r, IxRet::Exists(_))).count();
    }
    assert!(contested > 300, "clients should often meet on a key: {contested}");
}

#[test]
fn concurrent_inserts_with_a_crashing_client() {
    for seed in 0..200 {
        check_run::<Race>(seed, &Campaign { crash_one: true, ..INSERTS });
    }
}

/// Inserts, lookups, updates and removals (conditional or not) of 4 keys by
/// 4 clients: linearizable, one live slot per key at the end.
#[test]
fn concurrent_mixed_operations_are_linearizable() {
    for seed in 0..300 {
        check_run::<Race>(seed, &MIXED);
    }
    for seed in 300..400 {
        check_run::<Race>(seed, &Campaign { crash_one: true, ..MIXED });
    }
    for seed in 400..500 {
        check_run::<Race>(seed, &Campaign { stalls: true, ..MIXED });
    }
}

/// Replays one campaign run: `SWARM_SEED=<seed> cargo test -p swarm-core --lib index::tests::replay -- --nocapture`.
#[test]
fn replay() {
    let Some(seed) = std::env::var("SWARM_SEED").ok().and_then(|s| s.parse().ok()) else { return };
    for c in [&INSERTS, &MIXED] {
        let out = campaign::<Race>(seed, c);
        for op in out.history.operations() {
            std::println!("{op:?}");
        }
        std::println!("live: {:?}", out.live);
        check_run::<Race>(seed, c);
    }
}

// ---------------------------------------------------------------------------
// Garbled memory.

/// Fills an index with keys, garbles some of its slots and key blocks (or
/// its header), then runs every operation on every key: each answers or
/// fails, none panics. Returns how many failed as corrupt.
fn garbled_run(seed: u64, what: u64) -> usize {
    let mut sim = new_sim(seed);
    setup(&mut sim, 4);
    let mem = sim.client();
    let keys = keys_of_all_lengths(12);
    let geo = geometry(&sim);
    sim.block_on(async move {
        let mut ix = RaceIndex::open(&mem, NODE).await.unwrap();
        let mut blocks = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let e = ix.insert(&mem, k, i as u64 + 1).await.unwrap().entry();
            blocks.push(SlotWord(e.word).block());
        }
        // Garble: 0 slot words, 1 key blocks, 2 both, 3 the header.
        for _ in 0..mem.random(1, 6) {
            let mut junk = [0u8; 16];
            junk.iter_mut().for_each(|b| *b = mem.random(0, 255) as u8);
            let at = match what {
                0 => geo.buckets() + 8 * mem.random(0, geo.slots() - 1),
                1 => blocks[mem.random(0, blocks.len() as u64 - 1) as usize] + mem.random(0, 40),
                2 if mem.random(0, 2) == 0 => geo.buckets() + 8 * mem.random(0, geo.slots() - 1),
                2 => blocks[mem.random(0, blocks.len() as u64 - 1) as usize] + mem.random(0, 40),
                _ => geo.header + mem.random(0, HEADER_BYTES - 1),
            };
            let len = mem.random(1, 16) as usize;
            mem.write(RemoteAddr::new(NODE, at), &junk[..len]).await.unwrap();
        }
        let mut corrupt = 0;
        let mut count = |r: Result<(), IndexError>| match r {
            Err(IndexError::Corrupt { .. }) => corrupt += 1,
            Err(IndexError::Full { .. } | IndexError::BadEntry) | Ok(()) => {}
            Err(e) => panic!("seed {seed}: unexpected error {e}"),
        };
        match RaceIndex::open(&mem, NODE).await {
            Ok(mut ix) => {
                for (i, k) in keys.iter().enumerate() {
                    count(ix.lookup(&mem, k).await.map(drop));
                    count(ix.insert(&mem, k, 7).await.map(drop));
                    count(ix.update(&mem, k, Expect::Any, 8).await.map(drop));
                    count(ix.remove(&mem, k, Expect::Location(i as u64 + 1)).await.map(drop));
                    count(ix.insert(&mem, &key(100 + i as u64), 9).await.map(drop));
                    count(ix.lookup(&mem, &key(100 + i as u64)).await.map(drop));
                }
            }
            Err(e) => count(Err(e)),
        }
        corrupt
    })
    .unwrap()
}

#[test]
fn garbled_slots_blocks_and_header_give_errors_not_panics() {
    let mut corrupt = [0usize; 4];
    for seed in 0..100 {
        for (what, c) in corrupt.iter_mut().enumerate() {
            *c += garbled_run(seed, what as u64);
        }
    }
    std::println!("corrupt answers (slots, blocks, both, header): {corrupt:?}");
    assert!(corrupt.iter().all(|&c| c > 0), "garbage should be detected: {corrupt:?}");
}
