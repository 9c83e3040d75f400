//! pDPM-Central in the simulator, beyond the registry's tests
//! (`systems::tests`: the table and roundtrips, corrupt memory, the
//! campaigns): read locks and deferred frees, a crashed data node, and a
//! restarted coordinator.

use alloc::boxed::Box;
use alloc::rc::Rc;
use alloc::vec::Vec;

use super::*;
use crate::check::clock;
use crate::check::kv::{CHUNK, NODE_SIZE, start_server};
use crate::index::RaceIndex;
use crate::kv::{Got, KvClient, Missing, Written};
use crate::sim::{CrashMode, ServerShell, Sim, SimConfig, SimMemory};
use crate::substrate::space::region::Region;
use crate::systems::from_name;

fn config() -> StoreConfig {
    let mut cfg = StoreConfig::new(from_name("pdpm-central").unwrap(), 64);
    cfg.replicas = 3;
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = 4;
    cfg
}

/// Three formatted nodes with the store, and its coordinator running.
fn setup(cfg: &StoreConfig) -> (Sim, ServerShell) {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    let admin = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        for n in 0..3 {
            Region::format(&admin, NodeId(n), NODE_SIZE, CHUNK).await.unwrap();
        }
        crate::systems::format(&admin, &c, 1).await.unwrap();
    })
    .unwrap();
    let shell = start_server(&mut sim, cfg).unwrap();
    (sim, shell)
}

type Client = Box<CentralClient<SimMemory, crate::check::SimClock>>;

async fn connect(mem: &SimMemory, cfg: &StoreConfig, id: u8) -> Client {
    PdpmCentral::connect(mem.clone(), cfg, Who::Id(id), clock(mem, 0)).await.unwrap()
}

fn value(g: Result<Got<crate::substrate::value::Value<Vec<u8>>>, KvError>) -> Option<Vec<u8>> {
    match g {
        Ok(Got::Found(v)) => Some(v.to_vec()),
        _ => None,
    }
}

/// A version read-locked by a get is not freed when a write supersedes
/// it: the write says its free waits, and the reader's next request
/// releases it.
#[test]
fn a_read_lock_defers_the_free_until_the_readers_next_request() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = connect(&mem, &cfg, 1).await;
        let mut b = connect(&mem, &cfg, 2).await;
        b.insert(b"k", b"one").await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"one"[..]));
        // a holds the read lock on "one" until its next request.
        b.update(b"k", b"two").await.unwrap().unwrap();
        assert_eq!(b.central_paths().deferred_frees, 1, "the free of 'one' waits for a");
        b.update(b"k", b"three").await.unwrap().unwrap();
        assert_eq!(b.central_paths().deferred_frees, 1, "'two' had no reader: freed at once");
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"three"[..]));
        b.update(b"k", b"four").await.unwrap().unwrap();
        assert_eq!(b.central_paths().deferred_frees, 2);
        // A delete's superseded version waits for its readers too.
        assert_eq!(a.get(b"k").await.map(|g| matches!(g, Got::Found(_))), Ok(true));
        assert_eq!(b.delete(b"k").await, Ok(Ok(Written)));
        assert_eq!(b.central_paths().deferred_frees, 3);
        assert_eq!(a.get(b"k").await.map(|g| matches!(g, Got::Found(_))), Ok(false));
    })
    .unwrap();
}

/// A data node crashes: reads of versions written before go to another
/// copy, and writes go on with the majority that is left.
#[test]
fn a_crashed_data_node_is_read_around_and_written_around() {
    for mode in [CrashMode::FailFast, CrashMode::Hang] {
        let cfg = config();
        let (mut sim, _shell) = setup(&cfg);
        let mem = sim.client();
        let c = cfg.clone();
        let keys: Vec<Vec<u8>> = (0..6u8).map(|i| alloc::vec![b'k', i]).collect();
        let ks = keys.clone();
        sim.block_on(async move {
            let mut a = connect(&mem, &c, 1).await;
            for k in &ks {
                a.insert(k, k).await.unwrap();
            }
        })
        .unwrap();
        let now = sim.now();
        sim.crash_node_at(1, now, mode);
        let mem = sim.client();
        let other = sim
            .block_on(async move {
                let mut readers = Vec::new();
                for id in 1..=3 {
                    readers.push(connect(&mem, &cfg, id).await);
                }
                for r in readers.iter_mut() {
                    for k in &keys {
                        assert_eq!(value(r.get(k).await).as_deref(), Some(&k[..]), "{mode:?}");
                    }
                }
                for k in &keys {
                    assert_eq!(readers[0].update(k, b"after").await, Ok(Ok(Written)), "{mode:?}");
                }
                for r in readers.iter_mut() {
                    for k in &keys {
                        assert_eq!(value(r.get(k).await).as_deref(), Some(&b"after"[..]), "{mode:?}");
                    }
                }
                readers.iter().map(|r| r.central_paths().other_copies).sum::<u64>()
            })
            .unwrap();
        // Every key has a copy on node 1, and the clients start from
        // different copies: some read node 1 first, before the updates.
        assert!(other > 0, "{mode:?}: no read went to another copy");
    }
}

/// The coordinator restarts (a new incarnation of its server): it loads
/// what the first one committed from its node, key by key, and goes on.
#[test]
fn a_restarted_coordinator_recovers_from_its_node() {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg);
    let mem = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        let mut a = connect(&mem, &c, 1).await;
        a.insert(b"kept", b"v1").await.unwrap();
        a.insert(b"gone", b"v").await.unwrap();
        a.update(b"kept", b"v2").await.unwrap().unwrap();
        a.delete(b"gone").await.unwrap().unwrap();
    })
    .unwrap();
    shell.stop();
    let stopped = Rc::new(core::cell::Cell::new(false));
    let _again = start_server(&mut sim, &cfg);
    let mem = sim.client();
    let s = stopped.clone();
    sim.block_on(async move {
        // Its channel found the old server gone: the first call fails,
        // the next reconnects to the new one.
        let mut a = connect(&mem, &cfg, 1).await;
        assert_eq!(value(a.get(b"kept").await).as_deref(), Some(&b"v2"[..]));
        assert_eq!(a.get(b"gone").await.map(|g| matches!(g, Got::Found(_))), Ok(false));
        assert_eq!(a.update(b"gone", b"x").await, Ok(Err(Missing::NotFound)));
        assert_eq!(a.get(b"never").await.map(|g| matches!(g, Got::Found(_))), Ok(false));
        a.update(b"kept", b"v3").await.unwrap().unwrap();
        a.insert(b"gone", b"back").await.unwrap();
        assert_eq!(value(a.get(b"kept").await).as_deref(), Some(&b"v3"[..]));
        assert_eq!(value(a.get(b"gone").await).as_deref(), Some(&b"back"[..]));
        s.set(true);
    })
    .unwrap();
    assert!(stopped.get());
}

/// What a get answered: a value, or none.
type Gotten = Result<Option<Vec<u8>>, KvError>;

/// The read lock at work: a client slowed 50 times gets a key while
/// another updates it over and over, so that the versions its gets were
/// answered are superseded (and, without the lock, freed and their copies
/// rewritten by the next writes: mutant `central-no-rdlock`) before its
/// READs land. Every get returns a value that was written, whole.
#[test]
fn a_slow_reader_reads_the_version_it_was_answered() {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg);
    let (ma, mb) = (sim.client(), sim.client());
    let c = cfg.clone();
    let m = mb.clone();
    sim.block_on(async move { connect(&m, &c, 2).await.insert(b"k", &[0; 64]).await.unwrap() }).unwrap();
    let now = sim.now();
    sim.slow_client_at(&ma, now, 50);
    let got: Rc<core::cell::RefCell<Vec<Gotten>>> = Rc::default();
    let (g, c, m) = (got.clone(), cfg.clone(), ma.clone());
    sim.spawn(&ma, async move {
        let mut a = connect(&m, &c, 1).await;
        for _ in 0..5 {
            let r = a.get(b"k").await.map(|g| match g {
                Got::Found(v) => Some(v.to_vec()),
                _ => None,
            });
            g.borrow_mut().push(r);
        }
    });
    let (g, m) = (got.clone(), mb.clone());
    sim.spawn(&mb, async move {
        let mut b = connect(&m, &cfg, 2).await;
        for i in 1.. {
            if g.borrow().len() == 5 {
                break;
            }
            b.update(b"k", &[(i % 250) as u8 + 1; 64]).await.unwrap().unwrap();
        }
        shell.stop();
    });
    sim.run().unwrap();
    let got = got.borrow();
    assert_eq!(got.len(), 5);
    for r in got.iter() {
        match r {
            Ok(Some(v)) => assert!(v.len() == 64 && v.iter().all(|&x| x == v[0]), "a torn value {v:?}"),
            r => panic!("a slow reader read a reused copy: {r:?}"),
        }
    }
}

/// Client 1 updates every key of `keys` to `v`, `wait` ns from now: how
/// many of its writes took a data node back.
fn update_all(sim: &mut Sim, cfg: &StoreConfig, keys: &[Vec<u8>], v: &'static [u8], wait: u64) -> u64 {
    let (mem, c, ks) = (sim.client(), cfg.clone(), keys.to_vec());
    sim.block_on(async move {
        mem.sleep(wait).await;
        let mut a = connect(&mem, &c, 1).await;
        for k in &ks {
            assert_eq!(a.update(k, v).await, Ok(Ok(Written)));
        }
        a.central_paths().readmitted
    })
    .unwrap()
}

/// A data node that crashed comes back with its memory: once the retry
/// interval passed, a write tries it again and it is in use again, so
/// that the crash of another node then leaves a majority of every key's
/// copies. Without the readmission, every write after the second crash
/// would find one data node of three and fail.
#[test]
fn a_data_node_that_comes_back_is_written_again() {
    for mode in [CrashMode::FailFast, CrashMode::Hang] {
        let cfg = config();
        let (mut sim, _shell) = setup(&cfg);
        let keys: Vec<Vec<u8>> = (0..6u8).map(|i| alloc::vec![b'k', i]).collect();
        let (mem, c, ks) = (sim.client(), cfg.clone(), keys.clone());
        sim.block_on(async move {
            let mut a = connect(&mem, &c, 1).await;
            for k in &ks {
                a.insert(k, b"before").await.unwrap();
            }
        })
        .unwrap();
        let now = sim.now();
        sim.crash_node_at(1, now, mode);
        assert_eq!(update_all(&mut sim, &cfg, &keys, b"down", 0), 0, "{mode:?}: node 1 is still down");
        let now = sim.now();
        sim.heal_node_at(1, now);
        // Past the retry interval (the simulator's time-out is 50 µs).
        let readmitted = update_all(&mut sim, &cfg, &keys, b"back", coordinator::RETRY_TIMEOUTS * 50_000 + 1);
        assert_eq!(readmitted, 1, "{mode:?}: node 1 taken back by one write");
        let now = sim.now();
        sim.crash_node_at(2, now, CrashMode::FailFast);
        let mem = sim.client();
        sim.block_on(async move {
            let mut a = connect(&mem, &cfg, 2).await;
            for k in &keys {
                assert_eq!(value(a.get(k).await).as_deref(), Some(&b"back"[..]), "{mode:?}");
                assert_eq!(a.update(k, b"after").await, Ok(Ok(Written)), "{mode:?}: node 1 was not taken back");
                assert_eq!(value(a.get(k).await).as_deref(), Some(&b"after"[..]), "{mode:?}");
            }
        })
        .unwrap();
    }
}

/// What coordinator `c` answers channel `ch`'s request.
async fn serve(c: &mut Coordinator, mem: &SimMemory, ch: u16, method: u16, body: &[u8]) -> wire::Answer {
    use crate::substrate::msg::server::{Request, Service};
    let mut out = Vec::new();
    let status = c.handle(mem, Request { client: ch, method, body }, &mut out, 1 << 16).await;
    assert_eq!(status, crate::substrate::msg::rpc::Status::Ok);
    wire::Answer::decode(&out, 3, 256).expect("an answer").0
}

/// Two incarnations of the coordinator at once (one paused that came
/// back, serving its last requests, and its successor): A loads a key
/// that B committed; B updates it twice, freeing the first record and
/// reusing it for the second update, with the first version's copies.
/// A's check of the cell must not take the reused record for the version
/// it loaded from it: it reloads the key and answers the last value.
#[test]
fn a_reused_record_does_not_pass_for_the_version_it_held() {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg);
    shell.stop();
    let mem = sim.client();
    sim.block_on(async move {
        let open = || async { RaceIndex::open(&mem, COORDINATOR).await.unwrap() };
        let (mut a, mut b) = (Coordinator::new(shape(&cfg), open().await), Coordinator::new(shape(&cfg), open().await));
        let put = |v: &[u8]| wire::put_body(wire::Mode::Insert, b"k", v);
        assert_eq!(serve(&mut b, &mem, 1, wire::PUT, &put(b"one")).await, wire::Answer::Written);
        let wire::Answer::Found(first) = serve(&mut a, &mem, 2, wire::GET, b"k").await else { panic!("not found") };
        assert_eq!(first.sum, wire::value_sum(b"one"));
        assert_eq!(serve(&mut b, &mem, 1, wire::PUT, &put(b"two")).await, wire::Answer::Written);
        assert_eq!(serve(&mut b, &mem, 1, wire::PUT, &put(b"three")).await, wire::Answer::Written);
        assert_eq!(b.paths().frees, 2, "both superseded versions freed, for reuse");
        let wire::Answer::Found(now) = serve(&mut a, &mem, 2, wire::GET, b"k").await else { panic!("not found") };
        assert_eq!(now.copies, first.copies, "the third version reused the first one's copies (and record)");
        assert_eq!(now.sum, wire::value_sum(b"three"), "A answered the version it had loaded");
        assert_eq!(a.paths().fenced, 1);
    })
    .unwrap();
}

/// A data node comes back and another crashes at once, before the retry
/// interval: the nodes up are one of three, so each write tries the node
/// marked down too, and takes it back (the first such write).
#[test]
fn a_write_short_of_a_majority_tries_the_nodes_marked_down() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg);
    let (mem, c) = (sim.client(), cfg.clone());
    sim.block_on(async move { connect(&mem, &c, 1).await.insert(b"k", b"before").await.unwrap() }).unwrap();
    let now = sim.now();
    sim.crash_node_at(1, now, CrashMode::FailFast);
    let (mem, c) = (sim.client(), cfg.clone());
    sim.block_on(async move { assert_eq!(connect(&mem, &c, 1).await.update(b"k", b"down").await, Ok(Ok(Written))) })
        .unwrap();
    let now = sim.now();
    sim.heal_node_at(1, now);
    sim.crash_node_at(2, now, CrashMode::FailFast);
    let mem = sim.client();
    let readmitted = sim
        .block_on(async move {
            let mut a = connect(&mem, &cfg, 1).await;
            for v in [&b"one"[..], b"two"] {
                assert_eq!(a.update(b"k", v).await, Ok(Ok(Written)), "one data node of three up");
                assert_eq!(value(a.get(b"k").await).as_deref(), Some(v));
            }
            a.central_paths().readmitted
        })
        .unwrap();
    assert_eq!(readmitted, 1);
}
