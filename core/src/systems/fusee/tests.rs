//! FUSEE in the simulator, on purpose where the campaigns
//! (`systems::tests`) go by chance: the roundtrips of each operation, a
//! cached entry gone stale after another client's update or delete
//! (detected in the get's one roundtrip and refreshed: the mutant
//! `fusee-stale-cache` fails here), the adaptive cache's bypass of a key
//! that keeps going stale and its return once the key stops changing,
//! writers racing on one key, node 0 (an
//! index replica, the first primary) crashed under cached clients, and
//! garbled objects; and a property of the objects' encoding.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use proptest::prelude::*;

use super::cache::{Cached, WINDOW};
use super::object;
use super::{Fusee, FuseeClient};
use crate::check::kv::{CHUNK, NODE_SIZE};
use crate::check::{SimClock, clock};
use crate::index::snapshot::arena::ALIGN;
use crate::index::{Index, SnapshotIndex};
use crate::kv::place::index_nodes;
use crate::kv::{Got, KvClient, KvError, KvSystem, Missing, StoreConfig, Who, Written};
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::Region;
use crate::systems::{format, from_name};
use crate::{Memory, NodeId, RemoteAddr};

fn config(writers: u8) -> StoreConfig {
    let mut cfg = StoreConfig::new(from_name("fusee").unwrap(), 64);
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = writers;
    cfg.cache_capacity = 64;
    cfg
}

/// `nodes` nodes (as many replicas), 2 µs roundtrips, the store set up.
fn setup(cfg: &mut StoreConfig, nodes: usize) -> Sim {
    setup_on(cfg, SimConfig { nodes, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000))
}

/// [`setup`], 3 nodes whose operations time out after 5 ms rather than
/// 50 µs: a client's lease on the index's view (4 time-outs) then outlasts
/// a test, so that no renewal adds a roundtrip to those it counts.
fn setup_long_leases(cfg: &mut StoreConfig) -> Sim {
    let sim = SimConfig { nodes: 3, node_size: NODE_SIZE, timeout_ns: 5_000_000, ..SimConfig::default() };
    setup_on(cfg, sim.fixed_latency(2_000))
}

/// The store set up on a simulator of `sim` (as many replicas as nodes).
fn setup_on(cfg: &mut StoreConfig, sim: SimConfig) -> Sim {
    let nodes = sim.nodes;
    cfg.replicas = nodes;
    let mut sim = Sim::new(sim);
    let admin = sim.client();
    let cfg = cfg.clone();
    sim.block_on(async move {
        for n in 0..nodes {
            Region::format(&admin, NodeId(n as u16), NODE_SIZE, CHUNK).await.unwrap();
        }
        format(&admin, &cfg, 1).await.unwrap();
    })
    .unwrap();
    sim
}

async fn client<M: Memory>(mem: M, sim: &SimMemory, cfg: &StoreConfig, id: u8) -> FuseeClient<M, SimClock> {
    *Fusee::connect(mem, cfg, Who::Id(id), clock(sim, 0)).await.unwrap()
}

fn found<V: core::ops::Deref<Target = [u8]>>(g: Result<Got<V>, KvError>) -> Result<Option<Vec<u8>>, KvError> {
    g.map(|g| match g {
        Got::Found(v) => Some(v.to_vec()),
        _ => None,
    })
}

/// Runs `op` and answers its result with its roundtrips on `mem`.
async fn counted<T>(mem: &Counted<SimMemory>, op: impl AsyncFnOnce() -> T) -> (T, u32) {
    mem.reset();
    let out = op().await;
    (out, mem.roundtrips())
}

/// Each operation's roundtrips, cached and not (module table of
/// [`super`]), and what it answers.
#[test]
fn operations_take_the_roundtrips_the_module_says() {
    let mut cfg = config(2);
    let mut sim = setup(&mut cfg, 3);
    let mem = sim.client();
    sim.block_on(async move {
        let (ma, mb) = (Counted::new(mem.clone()), Counted::new(mem.clone()));
        let mut a = client(&ma, &mem, &cfg, 1).await;
        let mut b = client(&mb, &mem, &cfg, 2).await;
        // The first insert claims an arena chunk.
        a.insert(b"w", b"warm").await.unwrap();
        // b's first operation takes its lease on the index's view.
        assert_eq!(found(b.get(b"w").await), Ok(Some(b"warm".to_vec())));
        let (r, n) = counted(&ma, async || a.insert(b"k", b"v1").await).await;
        assert_eq!((r, n), (Ok(Written), 3), "insert of a new key");
        let (g, n) = counted(&ma, async || found(a.get(b"k").await)).await;
        assert_eq!((g, n), (Ok(Some(b"v1".to_vec())), 1), "get, cached");
        let (r, n) = counted(&ma, async || a.update(b"k", b"v2").await).await;
        assert_eq!((r, n), (Ok(Ok(Written)), 3), "update, cached");
        let (g, n) = counted(&mb, async || found(b.get(b"k").await)).await;
        assert_eq!((g, n), (Ok(Some(b"v2".to_vec())), 3), "get, not cached");
        let (g, n) = counted(&mb, async || found(b.get(b"absent").await)).await;
        assert_eq!((g, n), (Ok(None), 1), "get of an absent key");
        let (r, n) = counted(&ma, async || a.delete(b"k").await).await;
        assert_eq!((r, n), (Ok(Ok(Written)), 2), "delete, cached");
        assert_eq!(a.delete(b"k").await, Ok(Err(Missing::NotFound)));
        assert_eq!(a.update(b"k", b"x").await, Ok(Err(Missing::NotFound)));
        assert_eq!(found(a.get(b"k").await), Ok(None));
        // Inserted again (its slot's tombstone taken back), then an insert
        // of a present key is an update.
        assert_eq!(a.insert(b"k", b"v3").await, Ok(Written));
        assert_eq!(b.insert(b"k", b"v4").await, Ok(Written));
        assert_eq!(found(a.get(b"k").await), Ok(Some(b"v4".to_vec())));
        // Values of every size up to the largest, and the empty one.
        for len in [0, 1, 47, 48, 49, 255, 256] {
            let v: Vec<u8> = (0..len).map(|i| i as u8).collect();
            a.update(b"k", &v).await.unwrap().unwrap();
            assert_eq!(found(b.get(b"k").await), Ok(Some(v)));
        }
    })
    .unwrap();
}

/// A client that cached a key's entry finds, in its get's one roundtrip,
/// that another client's update changed the slot: it looks the key up
/// again and answers the new value (never the cached object's), and
/// caches the new entry; after a delete, it answers not found.
#[test]
fn a_stale_cached_entry_is_detected_and_refreshed() {
    let mut cfg = config(2);
    let mut sim = setup(&mut cfg, 3);
    let mem = sim.client();
    sim.block_on(async move {
        let mb = Counted::new(mem.clone());
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        let mut b = client(&mb, &mem, &cfg, 2).await;
        a.insert(b"k", b"old").await.unwrap();
        assert_eq!(found(b.get(b"k").await), Ok(Some(b"old".to_vec())));
        a.update(b"k", b"new").await.unwrap().unwrap();
        let (g, n) = counted(&mb, async || found(b.get(b"k").await)).await;
        assert_eq!(g, Ok(Some(b"new".to_vec())), "a stale cached entry answered the old value");
        // The cached try (1), the lookup (2) and the object (1).
        assert_eq!(n, 4);
        assert_eq!(b.paths().stale_caches, 1);
        let (g, n) = counted(&mb, async || found(b.get(b"k").await)).await;
        assert_eq!((g, n), (Ok(Some(b"new".to_vec())), 1), "the new entry is cached");
        a.delete(b"k").await.unwrap().unwrap();
        assert_eq!(found(b.get(b"k").await), Ok(None), "a stale cached entry answered a deleted key");
        assert_eq!(b.paths().stale_caches, 2);
        // b's update from its (stale) entry finds the key gone.
        a.insert(b"k", b"again").await.unwrap();
        assert_eq!(found(b.get(b"k").await), Ok(Some(b"again".to_vec())));
        a.update(b"k", b"later").await.unwrap().unwrap();
        // b's cached entry is stale: its change loses and goes again.
        b.update(b"k", b"b's").await.unwrap().unwrap();
        assert!(b.paths().lost_changes >= 1);
        assert_eq!(found(a.get(b"k").await), Ok(Some(b"b's".to_vec())));
        assert_eq!(a.paths().stale_caches, 1);
    })
    .unwrap();
}

/// A key that another client writes between every get of this one (the
/// adaptive cache, §4.6): its cached entry goes stale (4 roundtrips a get:
/// the cached try, the lookup, the object) until the key is bypassed, and
/// its gets then take 3 (the lookup and the object); likewise a key both
/// clients update in turn, whose updates from a stale entry take 6 (the
/// object, the lost round, the round again) and bypassed 4 (the object
/// beside the lookup, the round). At each threshold of the `bypass`
/// option.
#[test]
fn a_key_written_between_every_get_is_bypassed() {
    for threshold in ["50", "10"] {
        let mut cfg = config(2);
        cfg.set_option("bypass", threshold).unwrap();
        let mut sim = setup_long_leases(&mut cfg);
        let mem = sim.client();
        sim.block_on(async move {
            let mb = Counted::new(mem.clone());
            let mut a = client(mem.clone(), &mem, &cfg, 1).await;
            let mut b = client(&mb, &mem, &cfg, 2).await;
            a.insert(b"k", b"0").await.unwrap();
            a.insert(b"u", b"0").await.unwrap();
            // b's first operation takes its lease on the index's view, and
            // its first write an arena chunk.
            b.insert(b"w", b"warm").await.unwrap();
            let mut gets = Vec::new();
            for i in 1..=12u8 {
                a.update(b"k", &[i]).await.unwrap().unwrap();
                let (g, n) = counted(&mb, async || found(b.get(b"k").await)).await;
                assert_eq!(g, Ok(Some(alloc::vec![i])), "threshold {threshold}%, get {i}");
                gets.push(n);
            }
            std::println!("threshold {threshold}%: gets' roundtrips {gets:?}, {:?}", b.paths());
            // Not cached, then stale: one stale get at 10% (a stale access
            // in two), two at 50% (two in three).
            let stale = if threshold == "10" { 1 } else { 2 };
            let mut expect = alloc::vec![3];
            expect.extend(core::iter::repeat_n(4, stale));
            expect.resize(gets.len(), 3);
            assert_eq!(gets, expect, "threshold {threshold}%");
            assert_eq!(b.paths().stale_caches, stale as u64);
            assert_eq!(b.paths().cache_bypasses, (gets.len() - 1 - stale) as u64);
            assert_eq!(b.paths().cache_hits, 0);

            let mut updates = Vec::new();
            for i in 1..=12u8 {
                a.update(b"u", &[i]).await.unwrap().unwrap();
                let (r, n) = counted(&mb, async || b.update(b"u", &[i, i]).await).await;
                assert_eq!(r, Ok(Ok(Written)));
                updates.push(n);
            }
            std::println!("threshold {threshold}%: updates' roundtrips {updates:?}");
            let mut expect = alloc::vec![4];
            expect.extend(core::iter::repeat_n(6, stale));
            expect.resize(updates.len(), 4);
            assert_eq!(updates, expect, "threshold {threshold}%");
            assert_eq!(found(a.get(b"u").await), Ok(Some(alloc::vec![12, 12])));
        })
        .unwrap();
    }
}

/// A bypassed key whose writes stop comes back to the cached 1-roundtrip
/// get, after however long a run of writes (the counters are halved every
/// [`WINDOW`] accesses): within 16 gets at the default threshold.
#[test]
fn a_bypassed_key_that_stops_changing_is_cached_again() {
    let mut cfg = config(2);
    let mut sim = setup_long_leases(&mut cfg);
    let mem = sim.client();
    sim.block_on(async move {
        let mb = Counted::new(mem.clone());
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        let mut b = client(&mb, &mem, &cfg, 2).await;
        a.insert(b"k", b"0").await.unwrap();
        b.insert(b"w", b"warm").await.unwrap();
        for i in 0..100u8 {
            a.update(b"k", &[i]).await.unwrap().unwrap();
            b.get(b"k").await.unwrap();
        }
        let before = b.paths();
        assert!(before.cache_bypasses >= 90, "{before:?}");
        let mut bypassed = 0;
        loop {
            let (g, n) = counted(&mb, async || found(b.get(b"k").await)).await;
            assert_eq!(g, Ok(Some(alloc::vec![99])));
            if n == 1 {
                break;
            }
            assert_eq!(n, 3, "a bypassed get");
            bypassed += 1;
            assert!(bypassed <= 16, "still bypassed after {bypassed} gets of an unchanged key");
        }
        let p = b.paths().since(&before);
        std::println!("cached again after {bypassed} bypassed gets: {p:?}");
        assert_eq!((p.cache_bypasses, p.cache_hits, p.stale_caches), (bypassed, 1, 0));
        // And stays cached; its updates take the cached path (3) too.
        for _ in 0..40 {
            let (_, n) = counted(&mb, async || found(b.get(b"k").await)).await;
            assert_eq!(n, 1);
        }
        let (r, n) = counted(&mb, async || b.update(b"k", b"b's").await).await;
        assert_eq!((r, n), (Ok(Ok(Written)), 3));
    })
    .unwrap();
}

/// The counters alone: after any run of stale accesses, a key is bypassed
/// at most 16 clean accesses at 50%, 54 at 10% ([`WINDOW`]'s claim), and
/// never before its stale share is above the threshold.
#[test]
fn bypass_counters_forget_old_writes() {
    let entry = crate::index::Entry { location: 1, slot: RemoteAddr::new(NodeId(0), 8), word: 1 };
    for (percent, most) in [(50, 16), (10, 54)] {
        let mut worst = 0;
        for run in 0..4 * WINDOW as usize {
            let mut c = Cached::new(entry);
            for _ in 0..run {
                c.access();
                c = c.seen(entry, true);
                let (uses, stale) = c.counts();
                assert!(stale <= uses && uses < WINDOW);
                assert_eq!(c.bypassed(percent), stale as u32 * 100 > uses as u32 * percent as u32);
            }
            let mut clean = 0;
            while c.bypassed(percent) {
                c.access();
                clean += 1;
            }
            worst = worst.max(clean);
        }
        assert_eq!(worst, most, "threshold {percent}%");
    }
    // One stale access after the one that cached the key does not bypass
    // it at 50%; a second does.
    let mut c = Cached::new(entry);
    c.access();
    c = c.seen(entry, true);
    assert!(!c.bypassed(50) && c.bypassed(10));
    c.access();
    c = c.seen(entry, true);
    assert!(c.bypassed(50));
}

/// Clients update one key at once, over and over: every update succeeds
/// (a loser of a SNAPSHOT round whose own operation saw the word it
/// started from returns, overwritten by the winner), some lose rounds,
/// and the key ends with the last value of one of them (each client's
/// updates are in order, so the last one to take effect is some client's
/// last).
#[test]
fn concurrent_writers_on_one_key_all_take_effect() {
    const CLIENTS: u8 = 4;
    const WRITES: u8 = 12;
    let mut cfg = config(CLIENTS + 1);
    let mut sim = setup(&mut cfg, 3);
    let mem = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &c, 1).await;
        a.insert(b"k", b"first").await.unwrap();
    })
    .unwrap();
    let lost = Rc::new(RefCell::new(0u64));
    let done = Rc::new(RefCell::new(0u8));
    for id in 1..=CLIENTS {
        let m = sim.client();
        let (c, lost, done, mm) = (cfg.clone(), lost.clone(), done.clone(), m.clone());
        sim.spawn(&m, async move {
            let mut w = client(mm.clone(), &mm, &c, id).await;
            for i in 0..WRITES {
                assert_eq!(w.update(b"k", &[id, i]).await, Ok(Ok(Written)));
            }
            *lost.borrow_mut() += w.paths().overwritten;
            *done.borrow_mut() += 1;
        });
    }
    sim.run().unwrap();
    assert_eq!(*done.borrow(), CLIENTS);
    assert!(*lost.borrow() > 0, "no writer lost a round and returned overwritten");
    let mem = sim.client();
    let c = cfg.clone();
    let last = sim
        .block_on(async move { found(client(mem.clone(), &mem, &c, 5).await.get(b"k").await) })
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(last.len() == 2 && (1..=CLIENTS).contains(&last[0]) && last[1] == WRITES - 1, "{last:?}");
}

/// Node 0 (an index replica, and the first one's primary slots) crashes
/// under clients that cached their keys: the index changes its view
/// without it, and every operation goes on, for those clients and a new
/// one.
#[test]
fn node_0_down_costs_a_view_change_and_nothing_else() {
    let mut cfg = config(3);
    let mut sim = setup(&mut cfg, 3);
    let keys: Vec<Vec<u8>> = (0..8).map(|i| alloc::format!("key{i}").into_bytes()).collect();
    let mem = sim.client();
    let (c, ks) = (cfg.clone(), keys.clone());
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &c, 1).await;
        for k in &ks {
            a.insert(k, k).await.unwrap();
        }
    })
    .unwrap();
    let now = sim.now();
    sim.crash_node_at(0, now, CrashMode::FailFast);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        for k in &keys {
            assert_eq!(found(a.get(k).await), Ok(Some(k.clone())));
            a.update(k, b"after").await.unwrap().unwrap();
        }
        let mut b = client(mem.clone(), &mem, &cfg, 2).await;
        for k in &keys {
            assert_eq!(found(b.get(k).await), Ok(Some(b"after".to_vec())));
            assert_eq!(found(b.get(k).await), Ok(Some(b"after".to_vec())));
            b.delete(k).await.unwrap().unwrap();
            assert_eq!(found(a.get(k).await), Ok(None));
            a.insert(k, b"back").await.unwrap();
            assert_eq!(found(b.get(k).await), Ok(Some(b"back".to_vec())));
        }
        assert!(a.paths().index_views + b.paths().index_views >= 1, "no view change");
        assert!(b.paths().cache_hits >= keys.len() as u64);
    })
    .unwrap();
}

/// An object garbled on one replica is read from another; garbled on
/// every replica, a get is an error, never another value.
#[test]
fn garbled_objects_are_read_elsewhere_or_refused() {
    let mut cfg = config(2);
    let mut sim = setup(&mut cfg, 3);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        a.insert(b"k", b"value").await.unwrap();
        let nodes = index_nodes(&cfg, 3);
        let mut index = SnapshotIndex::open(&mem, &nodes, 9).await.unwrap();
        let entry = index.lookup(&mem, b"k").await.unwrap().unwrap();
        let (offset, _) = object::place(entry.location).unwrap();
        let sites = index.header().sites();
        // The value's first byte, on each replica in turn.
        let at = |i: usize| RemoteAddr::new(sites[i].node, sites[i].base + offset + object::HEADER as u64 + 1);
        for i in 0..sites.len() {
            let old = mem.read(at(i), 1).await.unwrap();
            mem.write(at(i), &[old[0] ^ 0x20]).await.unwrap();
            let mut b = client(mem.clone(), &mem, &cfg, 2).await;
            let got = found(b.get(b"k").await);
            if i + 1 < sites.len() {
                assert_eq!(got, Ok(Some(b"value".to_vec())), "garbled on {} replicas", i + 1);
            } else {
                assert_eq!(got, Err(KvError::Corrupt), "garbled on every replica");
            }
        }
    })
    .unwrap();
}

/// Operations keep their futures small (the index's futures are boxed).
#[test]
fn operation_futures_are_small() {
    let mut cfg = config(2);
    let mut sim = setup(&mut cfg, 3);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        let g = size_of_val(&a.get(b"k"));
        let i = size_of_val(&a.insert(b"k", b"v"));
        let u = size_of_val(&a.update(b"k", b"v"));
        let d = size_of_val(&a.delete(b"k"));
        let sizes = [g, i, u, d];
        std::println!("get, insert, update, delete: {sizes:?} bytes");
        assert!(sizes.iter().all(|&s| s <= 4096), "{sizes:?}");
    })
    .unwrap();
}

proptest! {
    /// An object decodes to its value, padded to whole arena units; any
    /// flipped bit, a cut, or another key is refused; and its location
    /// names its offset and length.
    #[test]
    fn objects_decode_whole_and_refuse_anything_else(
        key in proptest::collection::vec(any::<u8>(), 1..40),
        value in proptest::collection::vec(any::<u8>(), 0..300),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
        units in 1u64..1000,
        prev in any::<u64>(),
        base in any::<u64>(),
        old in any::<u64>(),
    ) {
        let log = object::Log { op: object::Op::Update, prev, base };
        let b = object::encode(&key, &value, log);
        prop_assert_eq!(b.len() as u64, object::alloc_len(key.len(), value.len()));
        prop_assert_eq!(b.len() as u64 % ALIGN, 0);
        let range = object::decode(&b, &key).unwrap();
        prop_assert_eq!(&b[range], &value[..]);
        let used = object::HEADER + key.len() + value.len();
        let e = object::entry(&b).unwrap();
        prop_assert_eq!((e.prev, e.base, e.commit, e.len), (prev, base, None, b.len() as u64));
        // Every bit but the commit's is under the sum.
        let mut g = b.clone();
        let at = flip.index(used - 16);
        let at = if at >= object::COMMIT { at + 16 } else { at };
        g[at] ^= 1 << bit;
        prop_assert_eq!(object::decode(&g, &key), None);
        prop_assert_eq!(object::entry(&g), None);
        // A commit is read whole and only for its own object; readers
        // ignore it, whatever it holds.
        let mut c = b.clone();
        c[object::COMMIT..object::COMMIT + 16].copy_from_slice(&object::commit(e.sum, object::Kind::Published, old));
        prop_assert_eq!(object::entry(&c).unwrap().commit, Some((object::Kind::Published, old)));
        prop_assert_eq!(object::decode(&c, &key), object::decode(&b, &key));
        c[object::COMMIT + (bit as usize % 16)] ^= 1 << (flip.index(8) as u8);
        prop_assert_eq!(object::entry(&c).unwrap().commit, None);
        prop_assert_eq!(object::decode(&c, &key), object::decode(&b, &key));
        c[object::COMMIT..object::COMMIT + 16].copy_from_slice(&object::commit(e.sum ^ 1, object::Kind::Published, old));
        prop_assert_eq!(object::entry(&c).unwrap().commit, None);
        // A provisional commit is no outcome, and names the round's base.
        c[object::COMMIT..object::COMMIT + 16].copy_from_slice(&object::commit(e.sum, object::Kind::Started, old));
        let started = object::entry(&c).unwrap();
        prop_assert_eq!((started.outcome(), started.round_base()), (None, Some(old)));
        prop_assert_eq!((e.outcome(), e.round_base()), (None, Some(base).filter(|&b| b != 0)));
        prop_assert_eq!(object::base_in(&b), Some(base).filter(|&b| b != 0));
        // A delete's object is a log entry of its key, never a value.
        let d = object::encode(&key, &[], object::Log { op: object::Op::Delete, prev, base });
        prop_assert_eq!(object::entry(&d).map(|e| e.op), Some(object::Op::Delete));
        prop_assert_eq!(object::decode(&d, &key), None);
        prop_assert_eq!(object::decode(&b[..used - 1], &key), None);
        let mut other = key.clone();
        other[0] ^= 1;
        prop_assert_eq!(object::decode(&b, &other), None);
        let loc = object::location(units * ALIGN, b.len() as u64).unwrap();
        prop_assert_ne!(loc, 0);
        prop_assert_eq!(object::place(loc), Some((units * ALIGN, b.len())));
    }

    /// Random bytes never panic the decoder, nor decode as a value that
    /// they do not hold whole.
    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200), loc in any::<u64>()) {
        if let Some(r) = object::decode(&b, b"k") {
            prop_assert!(r.end <= b.len());
        }
        if let Some(e) = object::entry(&b) {
            prop_assert!(e.key.end <= b.len() && e.len >= e.key.end as u64);
        }
        if let Some((off, len)) = object::place(loc) {
            prop_assert!(len > 0 && off % ALIGN == 0);
        }
    }
}

/// What one crash-recovery run saw: the recovering clients' reports, the
/// value the key ends with, and the history's verdict.
struct Recovered {
    first: Option<super::Recovery>,
    second: Option<super::Recovery>,
    last: Option<u64>,
}

type Hist = swarm_lincheck::History<swarm_lincheck::KvOp, swarm_lincheck::KvRet>;

/// Runs `op` as client `id`'s, recorded in `hist` (left pending if the
/// client crashes in it).
async fn logged<K: KvClient>(
    c: &mut K,
    mem: &SimMemory,
    hist: &RefCell<Hist>,
    id: u32,
    op: swarm_lincheck::KvOp,
) -> Option<u64> {
    use swarm_lincheck::{KvOp, KvRet};
    let invoked = hist.borrow_mut().invoke(id, mem.now(), op);
    let ret = match op {
        KvOp::Update(_, v) => c.update(b"k", &value_of(v)).await.unwrap().map_or(KvRet::NotFound, |_| KvRet::Ok),
        KvOp::Insert(_, v) => c.insert(b"k", &value_of(v)).await.map(|_| KvRet::Ok).unwrap(),
        KvOp::Delete(_) => c.delete(b"k").await.unwrap().map_or(KvRet::NotFound, |_| KvRet::Ok),
        _ => match c.get(b"k").await.unwrap() {
            Got::Found(v) => KvRet::Found(crate::check::id_of(&v)),
            _ => KvRet::NotFound,
        },
    };
    hist.borrow_mut().respond(invoked, mem.now(), ret);
    match ret {
        KvRet::Found(v) => Some(v),
        _ => None,
    }
}

fn value_of(id: u64) -> Vec<u8> {
    crate::check::value((id >> 32) as u8, id & 0xffff_ffff, 40)
}

/// The operation client A crashes in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Crashed {
    /// An update of `k`, which A inserted (and cached) before.
    Update,
    /// An update of `k`, which another client inserted: A's object is
    /// written beside its lookup, so it does not log its base.
    UncachedUpdate,
    /// A delete of `k`, which A inserted (and cached) before.
    Delete,
    /// An insert of `k`, which no client wrote before: its round starts
    /// from a slot never used.
    Insert,
}

/// Client A (leased id 1) starts `op` at `T0` and crashes `crash_at` ns
/// into it (see [`Crashed`] for what it did before). If `moved_on`, client
/// C then reads `k`, writes it (an update; an insert after a delete) and
/// reads it again. After A's lease, client R claims id 1 and recovers A's
/// log; it crashes `r_crash` ns into its open (if given), and R2 recovers
/// again. A fresh client reads `k` last. Every operation goes into one
/// history, A's last one pending, which must be linearizable.
fn crash_and_recover(op: Crashed, crash_at: u64, moved_on: bool, r_crash: Option<u64>) -> Recovered {
    use swarm_lincheck::KvOp;
    const T0: u64 = 1_000_000;
    let mut cfg = config(4);
    cfg.lease_ms = crate::kv::config::MIN_LEASE_MS;
    let mut sim = setup(&mut cfg, 3);
    let lease_wait = cfg.lease_ms as u64 * 1_000_000 + 3 * crate::substrate::clock::MAX_SKEW_NS + 1_000_000;
    let hist: Rc<RefCell<Hist>> = Rc::new(RefCell::new(swarm_lincheck::History::new()));
    let (v1, v2, v3) = (1u64 << 32 | 1, 1u64 << 32 | 2, 3u64 << 32 | 1);
    // B, for an uncached update: the key's first writer.
    let start = sim.now();
    if op == Crashed::UncachedUpdate {
        let mb = sim.client();
        let (m, cfg, hist) = (mb.clone(), cfg.clone(), hist.clone());
        sim.spawn(&mb, async move {
            let mut b = client(m.clone(), &m, &cfg, 2).await;
            logged(&mut b, &m, &hist, 2, KvOp::Insert(0, v1)).await;
        });
    }
    // A.
    let ma = sim.client();
    {
        let (m, cfg, hist) = (ma.clone(), cfg.clone(), hist.clone());
        sim.spawn(&ma, async move {
            let mut a = claim(&m, &cfg, 1).await;
            if matches!(op, Crashed::Update | Crashed::Delete) {
                logged(&mut a, &m, &hist, 1, KvOp::Insert(0, v1)).await;
                logged(&mut a, &m, &hist, 1, KvOp::Get(0)).await;
            }
            m.sleep((start + T0).saturating_sub(m.now())).await;
            let last = match op {
                Crashed::Delete => KvOp::Delete(0),
                Crashed::Insert => KvOp::Insert(0, v2),
                _ => KvOp::Update(0, v2),
            };
            logged(&mut a, &m, &hist, 1, last).await;
            // Crashed at the latest here: its operation answered,
            // unrecorded in its log's commit.
            m.sleep(1_000_000_000).await;
        });
    }
    sim.crash_client_at(&ma, start + T0 + crash_at);
    // C.
    if moved_on {
        let mc = sim.client();
        let (m, cfg, hist) = (mc.clone(), cfg.clone(), hist.clone());
        sim.spawn(&mc, async move {
            m.sleep((start + T0 + 50_000).saturating_sub(m.now())).await;
            let mut c = client(m.clone(), &m, &cfg, 3).await;
            logged(&mut c, &m, &hist, 3, KvOp::Get(0)).await;
            let write = match op {
                Crashed::Delete => KvOp::Insert(0, v3),
                Crashed::Insert => KvOp::Delete(0),
                _ => KvOp::Update(0, v3),
            };
            logged(&mut c, &m, &hist, 3, write).await;
            logged(&mut c, &m, &hist, 3, KvOp::Get(0)).await;
        });
    }
    // R, maybe crashed in its open.
    let first: Rc<RefCell<Option<super::Recovery>>> = Rc::default();
    let tr = start + T0 + lease_wait;
    let mr = sim.client();
    {
        let (m, cfg, out) = (mr.clone(), cfg.clone(), first.clone());
        sim.spawn(&mr, async move {
            m.sleep(tr.saturating_sub(m.now())).await;
            *out.borrow_mut() = claim(&m, &cfg, 1).await.recovery();
        });
    }
    if let Some(at) = r_crash {
        sim.crash_client_at(&mr, tr + at);
    }
    sim.run().unwrap();
    let (h, cfg2, m) = (hist.clone(), cfg.clone(), sim.client());
    let (second, last) = sim
        .block_on(async move {
            let second = if r_crash.is_some() {
                m.sleep(lease_wait).await;
                let r2 = claim(&m, &cfg2, 1).await;
                r2.recovery()
            } else {
                None
            };
            let mut z = client(m.clone(), &m, &cfg2, 4).await;
            let last = logged(&mut z, &m, &h, 4, KvOp::Get(0)).await;
            (second, last)
        })
        .unwrap();
    let verdict = swarm_lincheck::check(&swarm_lincheck::Kv::lazy_unmap(), hist.borrow().operations());
    assert!(
        verdict.is_linearizable(),
        "crash {crash_at} ns into A's {op:?}, moved on {moved_on}, R crashed {r_crash:?}: not linearizable: \
         {verdict}\n{:?}",
        hist.borrow().operations()
    );
    let first = *first.borrow();
    Recovered { first, second, last }
}

/// A client of `cfg` that claims id `id` (and recovers its previous
/// holder's log if it crashed).
async fn claim(m: &SimMemory, cfg: &StoreConfig, id: u8) -> FuseeClient<SimMemory, SimClock> {
    let clk = clock(m, 0);
    let held = crate::systems::claim(m, cfg, &clk, crate::substrate::lease::Want::Id(id), 7).await.unwrap();
    *Fusee::connect(m.clone(), cfg, Who::Lease(held), clk).await.unwrap()
}

/// Client-crash recovery (FUSEE §5.3), with A crashed at every point of an
/// update from its cached entry (every 400 ns from its start to past its
/// end: its object write, SNAPSHOT's backup and primary phases, and after
/// it answered): the next holder of A's id walks A's log and finishes the
/// update when A's object is in it and the key did not move on (the key
/// then holds A's value), and drops it when another client moved the key
/// on meanwhile (never redoes it then: the mutant `fusee-redo-moved-on`
/// fails here, "not linearizable"); every history, A's update pending,
/// is linearizable. Prints what recovery took, in simulated time (2 µs
/// roundtrips).
#[test]
fn a_crashed_clients_update_is_finished_at_most_once_by_the_next_holder() {
    use super::Outcome;
    let (v1, v2) = (1u64 << 32 | 1, 1u64 << 32 | 2);
    let mut seen = std::collections::BTreeMap::new();
    let mut moved_on = Vec::new();
    for step in 0..25u64 {
        let d = step * 400;
        let alone = crash_and_recover(Crashed::Update, d, false, None);
        let rec = alone.first.expect("the next holder recovered the log");
        *seen.entry(std::format!("{:?}", rec.outcome)).or_insert(0) += 1;
        if rec.found == 2 {
            assert!(matches!(rec.outcome, Outcome::Done | Outcome::Redone), "crash at {d}: {rec:?}");
            assert_eq!(alone.last, Some(v2), "crash at {d}: {rec:?}");
        } else {
            assert_eq!(alone.last, Some(v1), "crash at {d}: {rec:?}");
        }
        assert!(rec.reclaimed > 0, "crash at {d}: {rec:?}");
        if rec.outcome == Outcome::Redone {
            std::println!(
                "crash at {d} ns: log walk {} ns ({} entries of {} found), redo {} ns ({} roundtrips of 2 µs)",
                rec.walk_ns,
                rec.walked,
                rec.found,
                rec.redo_ns,
                rec.redo_ns / 2_000
            );
        }
        let moved = crash_and_recover(Crashed::Update, d, true, None);
        moved_on.push((d, moved.first.expect("the next holder recovered the log")));
    }
    std::println!("outcomes of the crashed update: {seen:?}");
    // (After the histories: a redo once the key moved on is not always
    // visible in one, but it is in those where the update took effect.)
    for (d, rec) in moved_on {
        assert_ne!(rec.outcome, Outcome::Redone, "crash at {d}, key moved on: {rec:?}");
    }
    assert!(seen.get("Redone").is_some_and(|&n| n > 0) && seen.get("Done").is_some_and(|&n| n > 0), "{seen:?}");
}

/// Client-crash recovery of an update whose object did not know the slot
/// word its change starts from (the key not cached: the lookup runs
/// beside the object's write), with A crashed at every point of it (every
/// 400 ns): the round's base, written beside its first phase as the
/// object's provisional commit, lets the next holder redo the update
/// where the key did not move on (without it, the mutant
/// `fusee-no-round-base`, recovery can only drop such an update), never
/// where it did; every history linearizable.
#[test]
fn a_crashed_clients_uncached_update_is_redone_from_its_rounds_base() {
    use super::Outcome;
    let (v1, v2) = (1u64 << 32 | 1, 1u64 << 32 | 2);
    let mut seen = std::collections::BTreeMap::new();
    for step in 0..30u64 {
        let d = step * 400;
        // (No recovery where A crashed before its object's write, which
        // anchors its log: A's first.)
        let alone = crash_and_recover(Crashed::UncachedUpdate, d, false, None);
        let outcome = alone.first.map(|r| r.outcome);
        *seen.entry(std::format!("{outcome:?}")).or_insert(0) += 1;
        let took = matches!(outcome, Some(Outcome::Done | Outcome::Redone));
        assert_eq!(alone.last, Some(if took { v2 } else { v1 }), "crash at {d}: {:?}", alone.first);
        let moved = crash_and_recover(Crashed::UncachedUpdate, d, true, None);
        assert_ne!(
            moved.first.map(|r| r.outcome),
            Some(Outcome::Redone),
            "crash at {d}, key moved on: {:?}",
            moved.first
        );
    }
    std::println!("outcomes of the crashed uncached update: {seen:?}");
    assert!(seen.contains_key("Some(Redone)"), "an uncached update was never redone: {seen:?}");
    assert!(seen.contains_key("Some(Done)"), "{seen:?}");
}

/// Client-crash recovery of a delete (FUSEE's temporary delete object: a
/// log entry with no value, written beside the delete's first round),
/// with A crashed at every point of it (every 400 ns): the next holder
/// finds the delete in A's log and finishes it where the key still maps
/// to the word it started from (the key then reads not found), and leaves
/// it where the key moved on (C inserted it again: redoing it would
/// delete C's value, a second effect: the mutant `fusee-redo-moved-on`);
/// every history linearizable.
#[test]
fn a_crashed_clients_delete_is_finished_at_most_once_by_the_next_holder() {
    use super::Outcome;
    let v1 = 1u64 << 32 | 1;
    let mut seen = std::collections::BTreeMap::new();
    for step in 0..25u64 {
        let d = step * 400;
        let alone = crash_and_recover(Crashed::Delete, d, false, None);
        let rec = alone.first.expect("the next holder recovered the log");
        if rec.found == 2 {
            *seen.entry(std::format!("{:?}", rec.outcome)).or_insert(0) += 1;
            assert!(matches!(rec.outcome, Outcome::Done | Outcome::Redone), "crash at {d}: {rec:?}");
            assert_eq!(alone.last, None, "crash at {d}: {rec:?}");
        } else {
            assert_eq!(alone.last, Some(v1), "crash at {d}: {rec:?}");
        }
        let moved = crash_and_recover(Crashed::Delete, d, true, None);
        let rec = moved.first.expect("the next holder recovered the log");
        assert_ne!(rec.outcome, Outcome::Redone, "crash at {d}, key moved on: {rec:?}");
    }
    std::println!("outcomes of the crashed delete: {seen:?}");
    assert!(seen.contains_key("Redone") && seen.contains_key("Done"), "{seen:?}");
}

/// Client-crash recovery of an insert of a new key, with A crashed at
/// every point of it (every 400 ns): its round starts from a slot never
/// used, which the insert's object logs beside the round's first phase
/// (its provisional commit), so the next holder redoes it where that slot
/// still holds that word (the key then reads A's value), and never where
/// the key moved on (C read it and deleted it: an insert that took effect
/// must not take effect again; the mutant `fusee-redo-moved-on`, which
/// inserts whatever the slot holds, brings the deleted value back: "not
/// linearizable"); every history linearizable. Without the provisional commit (the mutant
/// `fusee-no-round-base`) such an insert is never redone.
#[test]
fn a_crashed_clients_insert_of_a_new_key_is_redone_from_its_rounds_base() {
    use super::Outcome;
    let v2 = 1u64 << 32 | 2;
    let (mut seen, mut moved_on) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    for step in 0..25u64 {
        let d = step * 400;
        // (No recovery where A crashed before its object's write, which
        // anchors its log: its first.)
        let alone = crash_and_recover(Crashed::Insert, d, false, None);
        let outcome = alone.first.map(|r| r.outcome);
        *seen.entry(std::format!("{outcome:?}")).or_insert(0) += 1;
        let took = matches!(outcome, Some(Outcome::Done | Outcome::Redone));
        assert_eq!(alone.last, took.then_some(v2), "crash at {d}: {:?}", alone.first);
        // C's delete removed A's value if the insert took effect first,
        // and found nothing otherwise (then a redo is A's one effect).
        let moved = crash_and_recover(Crashed::Insert, d, true, None);
        let outcome = moved.first.map(|r| r.outcome);
        *moved_on.entry(std::format!("{outcome:?}")).or_insert(0) += 1;
        let took = matches!(outcome, Some(Outcome::Done | Outcome::Redone));
        assert_eq!(moved.last, took.then_some(v2), "crash at {d}, key moved on: {:?}", moved.first);
    }
    std::println!("outcomes of the crashed insert: {seen:?}; with the key deleted meanwhile: {moved_on:?}");
    assert!(seen.contains_key("Some(Redone)"), "a new key's insert was never redone: {seen:?}");
    assert!(seen.contains_key("Some(Done)"), "{seen:?}");
    assert!(moved_on.contains_key("Some(Dropped)"), "C never deleted A's value before recovery: {moved_on:?}");
}

/// A crashed client's last object whose value ends in zeros stays whole
/// through recovery: the next holder carves on from the end of the last
/// whole object, not from the last line holding a nonzero byte (inside
/// that object: the index record of the redo's own change, and the next
/// holder's objects, then overwrote its zeros, and the key, which maps to
/// it, read as corrupt; the mutant `fusee-carve-last-byte`). A crashed at
/// every point of its update (every 400 ns), as in the test above; the
/// next holder writes, then the key reads the value its outcome says.
/// Found by the key-value campaigns' runs in which the crashed client is
/// a key's only writer.
#[test]
fn a_recovered_log_is_carved_past_its_last_object() {
    const T0: u64 = 1_000_000;
    let mut zeros = alloc::vec![0u8; 200];
    zeros[0] = 7;
    let mut outcomes = std::collections::BTreeMap::new();
    for step in 0..25u64 {
        let mut cfg = config(4);
        cfg.lease_ms = crate::kv::config::MIN_LEASE_MS;
        let mut sim = setup(&mut cfg, 3);
        let lease_wait = cfg.lease_ms as u64 * 1_000_000 + 3 * crate::substrate::clock::MAX_SKEW_NS + 1_000_000;
        let ma = sim.client();
        let start = sim.now();
        {
            let (m, cfg, zeros) = (ma.clone(), cfg.clone(), zeros.clone());
            sim.spawn(&ma, async move {
                let mut a = claim(&m, &cfg, 1).await;
                a.insert(b"k", b"first").await.unwrap();
                m.sleep((start + T0).saturating_sub(m.now())).await;
                a.update(b"k", &zeros).await.unwrap().unwrap();
                m.sleep(1_000_000_000).await;
            });
        }
        sim.crash_client_at(&ma, start + T0 + step * 400);
        sim.run().unwrap();
        let (m, zeros) = (sim.client(), zeros.clone());
        let outcome = sim
            .block_on(async move {
                m.sleep(lease_wait).await;
                let mut r = claim(&m, &cfg, 1).await;
                let rec = r.recovery().expect("the next holder recovered the log");
                for i in 0..4u8 {
                    r.insert(&[b'j', i], &[i; 100]).await.unwrap();
                }
                let mut z = client(m.clone(), &m, &cfg, 4).await;
                // The update's object in the log, and done or redone.
                let updated = rec.found == 2 && matches!(rec.outcome, super::Outcome::Done | super::Outcome::Redone);
                let want = if updated { zeros } else { b"first".to_vec() };
                let got = found(z.get(b"k").await);
                assert_eq!(got, Ok(Some(want)), "A crashed {} ns into its update: {rec:?}", step * 400);
                rec.outcome
            })
            .unwrap();
        *outcomes.entry(std::format!("{outcome:?}")).or_insert(0) += 1;
    }
    assert!(outcomes.contains_key("Redone") && outcomes.contains_key("Done"), "{outcomes:?}");
}

/// Recovery is idempotent: the recovering client crashes at every point
/// of its open (every 2 µs), and the next one recovers again; the update
/// takes effect once (the key holds A's value), the history linearizable.
#[test]
fn a_recovery_that_crashes_is_recovered_again() {
    let v2 = 1u64 << 32 | 2;
    let mut both = 0;
    for step in 0..16u64 {
        let r = crash_and_recover(Crashed::Update, 3_000, false, Some(step * 2_000));
        let second = r.second.expect("the third holder recovered the log");
        assert_eq!(r.last, Some(v2), "recovery crashed at {} µs: {:?} then {second:?}", step * 2, r.first);
        both += r.first.is_none() as u32;
    }
    assert!(both > 0, "no recovery crashed before it ended");
}
