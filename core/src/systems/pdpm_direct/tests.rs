//! pDPM-Direct in the simulator, on purpose where the campaigns go by
//! chance: a writer that dies holding a key's lock (its lock taken over
//! after its lease, its redo copy replayed), a committed space left torn
//! (repaired from the redo copy: the mutant `pdpm-no-redo` fails here),
//! the primary of a key down (its operations fail naming it, the other
//! keys go on) and a backup down (nothing fails), and garbled lock words.

use alloc::vec::Vec;
use core::cell::Cell;
use core::task::{Context, Poll};

use super::entry::{self, PAYLOAD_AT, Place};
use super::lock::{self, LEASE_NS};
use super::{PdpmClient, PdpmDirect};
use crate::check::clock;
use crate::check::kv::{CHUNK, NODE_SIZE};
use crate::index::cache::key_hash;
use crate::index::{Index, RaceIndex};
use crate::kv::place::{INDEX_NODE, addr_of, node_of};
use crate::kv::{Got, KvClient, KvError, KvSystem, StoreConfig, Who};
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
use crate::substrate::clock::{Clock, MAX_SKEW_NS};
use crate::substrate::space::region::Region;
use crate::systems::{format, from_name};
use crate::{MemError, Memory, NodeId, Op, Outputs, RemoteAddr};

const MS: u64 = 1_000_000;
/// How long past its expiry a lock stays its holder's: three times the
/// skew bound ([`crate::substrate::lease::grace`]).
const GRACE_NS: u64 = 3 * MAX_SKEW_NS;

fn config(writers: u8) -> StoreConfig {
    let mut cfg = StoreConfig::new(from_name("pdpm-direct").unwrap(), 64);
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = writers;
    cfg.cache_capacity = 64;
    cfg
}

/// Three nodes, 2 µs roundtrips, the store set up.
fn setup(cfg: &StoreConfig) -> Sim {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    let admin = sim.client();
    let cfg = cfg.clone();
    sim.block_on(async move {
        for n in 0..3 {
            Region::format(&admin, NodeId(n), NODE_SIZE, CHUNK).await.unwrap();
        }
        format(&admin, &cfg, 1).await.unwrap();
    })
    .unwrap();
    sim
}

async fn client<M: Memory>(
    mem: M,
    sim: &SimMemory,
    cfg: &StoreConfig,
    id: u8,
) -> PdpmClient<M, crate::check::SimClock> {
    *PdpmDirect::connect(mem, cfg, Who::Id(id), clock(sim, 0)).await.unwrap()
}

fn found(g: Result<Got<crate::substrate::value::Value<Vec<u8>>>, KvError>) -> Result<Option<Vec<u8>>, KvError> {
    g.map(|g| match g {
        Got::Found(v) => Some(v.to_vec()),
        _ => None,
    })
}

/// Where `key`'s replicas are, read as a client would: its index entry,
/// then its primary's header.
async fn place_of(mem: &SimMemory, cfg: &StoreConfig, key: &[u8]) -> Place {
    let mut index = RaceIndex::open(mem, INDEX_NODE).await.unwrap();
    let e = index.lookup(mem, key).await.unwrap().unwrap();
    let at = addr_of(e.location, 3).unwrap();
    let head = mem.read(at, entry::HEADER as usize).await.unwrap();
    entry::decode_header(&head, at, key_hash(key), PdpmDirect::shape(cfg), 3).unwrap()
}

/// A space of `r` (its offset in the object), moved by `at` bytes.
fn space(r: RemoteAddr, space: u64, at: u64) -> RemoteAddr {
    RemoteAddr::new(r.node, r.offset + space + at)
}

/// A client's memory whose writes to one address (once set) start `ns`
/// later: a write that lags on its way to one node.
#[derive(Clone)]
struct Lagging {
    mem: SimMemory,
    at: alloc::rc::Rc<Cell<Option<RemoteAddr>>>,
    ns: u64,
}

impl Lagging {
    fn lags(&self, node: NodeId, offset: u64) -> bool {
        self.at.get() == Some(RemoteAddr::new(node, offset))
    }
}

impl Memory for Lagging {
    type Buf = Vec<u8>;

    fn node_count(&self) -> usize {
        self.mem.node_count()
    }

    async fn read(&self, addr: RemoteAddr, len: usize) -> Result<Vec<u8>, MemError> {
        self.mem.read(addr, len).await
    }

    async fn write(&self, addr: RemoteAddr, data: &[u8]) -> Result<(), MemError> {
        if self.lags(addr.node, addr.offset) {
            self.mem.sleep(self.ns).await;
        }
        self.mem.write(addr, data).await
    }

    async fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, MemError> {
        self.mem.cas(addr, expected, new).await
    }

    async fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> Result<Outputs<Vec<u8>>, MemError> {
        if ops.iter().any(|op| matches!(op, Op::Write { offset, .. } if self.lags(node, *offset))) {
            self.mem.sleep(self.ns).await;
        }
        self.mem.pipeline(node, ops).await
    }

    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        self.mem.post_background(node, ops)
    }

    fn now_ns(&self) -> Option<u64> {
        self.mem.now_ns()
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        self.mem.poll_alarm(cx, at_ns)
    }
}

/// A writer whose committed-space write to the primary lags dies holding
/// the lock, its redo copy on every replica: a reader waits for the lock's
/// lease and the grace (no longer), takes it over, replays the redo copy
/// and answers the dead writer's value, which every replica's committed
/// space then holds; the key is written and read as usual afterwards.
#[test]
fn a_writer_that_dies_holding_the_lock_is_taken_over_and_its_redo_replayed() {
    let cfg = config(4);
    let mut sim = setup(&cfg);
    let (a, w, r) = (sim.client(), sim.client(), sim.client());
    let c = cfg.clone();
    let place = sim
        .block_on(async move {
            let mut ac = client(a.clone(), &a, &c, 1).await;
            ac.insert(b"k", b"old").await.unwrap();
            place_of(&a, &c, b"k").await
        })
        .unwrap();
    let start = sim.now();
    let lagging = Lagging { mem: w.clone(), at: Default::default(), ns: 10_000 * MS };
    lagging.at.set(Some(space(place.primary(), PdpmDirect::shape(&cfg).committed(), PAYLOAD_AT)));
    let (c, l, wm) = (cfg.clone(), lagging.clone(), w.clone());
    sim.spawn(&w, async move {
        let mut wc = client(l, &wm, &c, 2).await;
        let _ = wc.update(b"k", b"new").await;
        unreachable!("the writer dies before its committed round ends");
    });
    sim.crash_client_at(&w, start + MS);
    let c = cfg.clone();
    let (got, waited, paths, committed) = sim
        .block_on(async move {
            r.sleep(2 * MS).await;
            let mut rc = client(r.clone(), &r, &c, 3).await;
            let t0 = r.now();
            let got = found(rc.get(b"k").await);
            let waited = r.now() - t0;
            let paths = rc.paths();
            // Every replica's committed space holds the replayed payload.
            let shape = PdpmDirect::shape(&c);
            let mut committed = Vec::new();
            for &rep in &place.replicas {
                let b = r.read(space(rep, shape.committed(), 0), shape.space() as usize).await.unwrap();
                let p = entry::decode(&b, shape, key_hash(b"k")).map(|p| b[p.value].to_vec());
                committed.push(p);
            }
            rc.update(b"k", b"after").await.unwrap().unwrap();
            let mut other = client(r.clone(), &r, &c, 4).await;
            assert_eq!(found(other.get(b"k").await), Ok(Some(b"after".to_vec())));
            (got, waited, paths, committed)
        })
        .unwrap();
    assert_eq!(got, Ok(Some(b"new".to_vec())), "the redo copy was not replayed");
    assert_eq!(committed, alloc::vec![Some(b"new".to_vec()); 3], "the redo copy was not replayed everywhere");
    assert_eq!((paths.lock_takeovers, paths.redo_replays), (1, 1));
    // From 2 ms on, the lock taken at about 0 expires after its lease and
    // the grace: no wait for ever, and none shorter.
    assert!(waited > LEASE_NS + GRACE_NS - 3 * MS, "waited {waited} ns");
    assert!(waited < LEASE_NS + GRACE_NS + MS, "waited {waited} ns");
}

/// A writer died in the middle of its committed write to the primary: the
/// lock is its, the committed space there torn (half new, half old), the
/// redo copy whole. The next reader takes the lock over and repairs the
/// committed space from the redo copy: the new value, not an error.
#[test]
fn a_torn_committed_space_is_repaired_from_the_redo_copy() {
    let cfg = config(2);
    let mut sim = setup(&cfg);
    let mem = sim.client();
    let c = cfg.clone();
    let (got, paths) = sim
        .block_on(async move {
            let mut a = client(mem.clone(), &mem, &c, 1).await;
            a.insert(b"k", &[1; 200]).await.unwrap();
            let place = place_of(&mem, &c, b"k").await;
            let shape = PdpmDirect::shape(&c);
            let new = entry::encode(2, Some(&[2; 200]), key_hash(b"k"));
            // The dead writer (client 2): its lock, then its redo round.
            let lock_at = space(place.primary(), shape.committed(), 0);
            let clk = clock(&mem, 0);
            let dead = lock::held(2, clk.now() + clk.ticks(LEASE_NS));
            assert_eq!(mem.cas(lock_at, 0, dead).await.unwrap(), 0);
            for &rep in &place.replicas {
                mem.write(space(rep, shape.redo(), PAYLOAD_AT), &new).await.unwrap();
            }
            // Half of its committed write landed on the primary.
            let half = &new[..new.len() / 2];
            mem.write(space(place.primary(), shape.committed(), PAYLOAD_AT), half).await.unwrap();
            let mut b = client(mem.clone(), &mem, &c, 2).await;
            (found(b.get(b"k").await), b.paths())
        })
        .unwrap();
    assert_eq!(got, Ok(Some([2; 200].to_vec())), "the redo copy was not replayed over the torn committed space");
    assert_eq!((paths.lock_takeovers, paths.redo_replays), (1, 1));
}

/// Keys whose primary crashed fail, naming it; keys with a backup there
/// go on (writes need a majority of the replicas, not all).
#[test]
fn a_primary_down_fails_cleanly_and_a_backup_down_costs_nothing() {
    let cfg = config(2);
    let mut sim = setup(&cfg);
    // A key with its primary on node 1, and one with a backup there.
    let key = |first: u16| {
        (0..).map(|i| alloc::format!("k{i}").into_bytes()).find(|k| node_of(k, 0, 3) == NodeId(first)).unwrap()
    };
    let (on_1, on_2) = (key(1), key(2));
    let mem = sim.client();
    let c = cfg.clone();
    let (k1, k2) = (on_1.clone(), on_2.clone());
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &c, 1).await;
        a.insert(&k1, b"one").await.unwrap();
        a.insert(&k2, b"two").await.unwrap();
    })
    .unwrap();
    let now = sim.now();
    sim.crash_node_at(1, now, CrashMode::FailFast);
    let mem = sim.client();
    sim.block_on(async move {
        for id in [1, 2] {
            let mut b = client(mem.clone(), &mem, &cfg, id).await;
            let down = |e: Option<KvError>| matches!(e, Some(KvError::Down(m)) if m.node == NodeId(1));
            assert!(down(b.get(&on_1).await.err()), "get of a key whose primary is down");
            assert!(down(b.update(&on_1, b"x").await.err()), "update of a key whose primary is down");
            assert!(down(b.delete(&on_1).await.err()), "delete of a key whose primary is down");
            assert_eq!(found(b.get(&on_2).await), Ok(Some(b"two".to_vec())));
            b.update(&on_2, b"deux").await.unwrap().unwrap();
            assert_eq!(found(b.get(&on_2).await), Ok(Some(b"deux".to_vec())));
            b.update(&on_2, b"two").await.unwrap().unwrap();
        }
    })
    .unwrap();
}

/// A lock word no client writes (holder 0, an expiry further ahead than
/// any lease) is an error at once, not a wait; a plausible one whose lease
/// is long past is taken over.
#[test]
fn garbled_lock_words_are_errors_and_stale_ones_are_taken_over() {
    let cfg = config(2);
    let mut sim = setup(&cfg);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = client(mem.clone(), &mem, &cfg, 1).await;
        a.insert(b"k", b"v").await.unwrap();
        let place = place_of(&mem, &cfg, b"k").await;
        let lock_at = space(place.primary(), PdpmDirect::shape(&cfg).committed(), 0);
        let clk = clock(&mem, 0);
        for garbage in [1 << 40, lock::held(3, clk.now() + clk.ticks(100 * LEASE_NS))] {
            mem.write(lock_at, &u64::to_le_bytes(garbage)).await.unwrap();
            let t0 = mem.now();
            assert_eq!(found(a.get(b"k").await), Err(KvError::Corrupt));
            assert_eq!(a.update(b"k", b"w").await, Err(KvError::Corrupt));
            assert!(mem.now() - t0 < MS, "answered at once");
        }
        // Held by client 2 until long ago: taken over, and the key goes on.
        mem.write(lock_at, &u64::to_le_bytes(lock::held(2, 1))).await.unwrap();
        mem.sleep(GRACE_NS + MS).await;
        assert_eq!(found(a.get(b"k").await), Ok(Some(b"v".to_vec())));
        a.update(b"k", b"w").await.unwrap().unwrap();
        assert_eq!(found(a.get(b"k").await), Ok(Some(b"w".to_vec())));
        assert_eq!(a.paths().lock_takeovers, 1);
    })
    .unwrap();
}

/// Operations keep their futures small (their rare paths and the index's
/// futures are boxed), so that many fit on a thread's stack.
#[test]
fn operation_futures_are_small() {
    let cfg = config(2);
    let mut sim = setup(&cfg);
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
