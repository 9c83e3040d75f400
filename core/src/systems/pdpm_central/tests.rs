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
use crate::substrate::msg::area::{Area, State as AreaState};
use crate::substrate::msg::rpc::Status;
use crate::substrate::msg::server::Incarnation;
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
    gotten(g).ok().flatten()
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

/// A get's answer as [`Gotten`].
fn gotten(g: Result<Got<crate::substrate::value::Value<Vec<u8>>>, KvError>) -> Gotten {
    g.map(|g| match g {
        Got::Found(v) => Some(v.to_vec()),
        _ => None,
    })
}

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
            let r = gotten(a.get(b"k").await);
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

/// How coordinator `c`, serving as incarnation `inc`, answers channel
/// `ch`'s request: its status, and its answer if it is one.
async fn serve_as(
    c: &mut Coordinator,
    mem: &SimMemory,
    inc: Option<Incarnation>,
    ch: u16,
    method: u16,
    body: &[u8],
) -> (Status, Option<wire::Answer>) {
    use crate::substrate::msg::server::{Request, Service};
    let mut out = Vec::new();
    let status = c.handle(mem, Request { client: ch, method, body, incarnation: inc }, &mut out, 1 << 16).await;
    (status, wire::Answer::decode(&out, 3, 256).map(|a| a.0))
}

/// Runs `body` with two coordinators of the store on one simulated memory
/// and no server running: incarnations driven through `Service::handle`
/// (say A, one paused that came back, and B, its successor).
fn two_coordinators<F: core::future::Future<Output = ()> + 'static>(
    body: impl FnOnce(SimMemory, StoreConfig, Coordinator, Coordinator) -> F,
) {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg);
    shell.stop();
    let (mem, c) = (sim.client(), cfg.clone());
    let m = mem.clone();
    let (a, b) = sim
        .block_on(async move {
            let open = || async { RaceIndex::open(&m, COORDINATOR).await.unwrap() };
            (Coordinator::new(shape(&c), open().await), Coordinator::new(shape(&c), open().await))
        })
        .unwrap();
    sim.block_on(body(mem, cfg, a, b)).unwrap();
}

/// What coordinator `c` answers channel `ch`'s request (outside a server).
/// A PUT's body that inserts `key` with `v`, or updates it.
fn insert_body(key: &[u8], v: &[u8]) -> Vec<u8> {
    wire::put_body(wire::Mode::Insert, key, v)
}

/// Serves a PUT of `key` with `v` on channel `ch`, which must be written.
async fn put(c: &mut Coordinator, mem: &SimMemory, ch: u16, key: &[u8], v: &[u8]) {
    assert_eq!(serve(c, mem, ch, wire::PUT, &insert_body(key, v)).await, wire::Answer::Written, "{key:?}");
}

async fn serve(c: &mut Coordinator, mem: &SimMemory, ch: u16, method: u16, body: &[u8]) -> wire::Answer {
    let (status, answer) = serve_as(c, mem, None, ch, method, body).await;
    assert_eq!(status, Status::Ok);
    answer.expect("an answer")
}

/// Two incarnations of the coordinator at once (one paused that came
/// back, serving its last requests, and its successor): A loads a key
/// that B committed; B updates it twice, freeing the first record and
/// reusing it for the second update, with the first version's copies.
/// A's check of the cell must not take the reused record for the version
/// it loaded from it: it reloads the key and answers the last value.
#[test]
fn a_reused_record_does_not_pass_for_the_version_it_held() {
    two_coordinators(|mem, _, mut a, mut b| async move {
        put(&mut b, &mem, 1, b"k", b"one").await;
        let wire::Answer::Found(first) = serve(&mut a, &mem, 2, wire::GET, b"k").await else { panic!("not found") };
        assert_eq!(first.sum, wire::value_sum(b"one"));
        put(&mut b, &mem, 1, b"k", b"two").await;
        put(&mut b, &mem, 1, b"k", b"three").await;
        assert_eq!(b.paths().frees, 2, "both superseded versions freed, for reuse");
        let wire::Answer::Found(now) = serve(&mut a, &mem, 2, wire::GET, b"k").await else { panic!("not found") };
        assert_eq!(now.copies, first.copies, "the third version reused the first one's copies (and record)");
        assert_eq!(now.sum, wire::value_sum(b"three"), "A answered the version it had loaded");
        assert_eq!(a.paths().fenced, 1);
    });
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

/// What `c` answers channel `ch`'s get of `key`, found.
async fn found(c: &mut Coordinator, mem: &SimMemory, ch: u16, key: &[u8]) -> wire::Version {
    match serve(c, mem, ch, wire::GET, key).await {
        wire::Answer::Found(v) => v,
        a => panic!("{key:?} not found: {a:?}"),
    }
}

/// Whether every copy of `v` holds `value`.
async fn holds(mem: &SimMemory, v: &wire::Version, value: &[u8]) -> bool {
    for &c in &v.copies {
        if mem.read(c, value.len()).await.unwrap() != value {
            return false;
        }
    }
    true
}

/// Versions an earlier incarnation (A) committed, superseded by its
/// successor (B): B frees each once the answers A may have given for it
/// are over ([`coordinator::foreign_wait_ns`] after the supersession), and
/// once B's own readers of it are done, and then reuses its copies. Before
/// that, A's reader's READ still finds the value it was answered (mutant
/// `central-frees-foreign-at-once`: B's next writes reuse the copies at
/// once).
#[test]
fn an_earlier_incarnations_versions_are_freed_once_their_readers_are_done() {
    two_coordinators(|mem, cfg, mut a, mut b| async move {
        for key in [&b"k"[..], b"j"] {
            put(&mut a, &mem, 1, key, b"one").await;
        }
        // A's reader (channel 2) was answered k's "one", and READs later.
        let k1 = found(&mut a, &mem, 2, b"k").await;
        // B's own reader (channel 3) holds j's "one".
        let j1 = found(&mut b, &mem, 3, b"j").await;
        for v in [b"two", b"thr", b"fou"] {
            put(&mut b, &mem, 1, b"k", v).await;
        }
        put(&mut b, &mem, 1, b"j", b"two").await;
        let superseded = mem.now();
        assert!(holds(&mem, &k1, b"one").await, "an earlier incarnation's reader would read a reused copy");
        assert_eq!(b.paths().foreign_frees, 0);
        mem.sleep(coordinator::foreign_wait_ns(&mem, shape(&cfg).channels) + 1).await;
        assert!(mem.now() > superseded);
        // Both are due at B's next request: k's "one" is freed, and its
        // copies taken by that very write; j's waits for channel 3.
        put(&mut b, &mem, 1, b"k", b"fiv").await;
        assert_eq!(b.paths().foreign_frees, 2);
        assert_eq!(found(&mut b, &mem, 4, b"k").await.copies, k1.copies, "k's 'one' freed and reused");
        assert!(holds(&mem, &j1, b"one").await, "freed while channel 3 read it");
        // Channel 3's next request releases j's "one": freed, reused.
        assert_eq!(found(&mut b, &mem, 3, b"k").await.copies, k1.copies);
        put(&mut b, &mem, 1, b"j", b"thr").await;
        assert_eq!(found(&mut b, &mem, 4, b"j").await.copies, j1.copies, "j's 'one' freed and reused");
        assert_eq!(b.paths().leaked, 0);
    });
}

/// A get answered by a coordinator that is then killed, whose READ is done
/// long after (its client slowed down right after its call): the standby
/// frees the version it answered for once superseded and that answer's
/// lifetime is over, and reuses its copies for later writes; the client
/// drops its late READ and asks again (and, its channel's server gone,
/// fails as unavailable), rather than use what the copy holds by then
/// (mutant `central-reads-late`: a value whose sum fails).
#[test]
fn a_read_done_past_its_answers_lifetime_is_dropped() {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg);
    let (ma, mb) = (sim.client(), sim.client());
    let (c, m) = (cfg.clone(), mb.clone());
    sim.block_on(async move { connect(&m, &c, 2).await.insert(b"k", &[1; 64]).await.unwrap() }).unwrap();
    let t0 = sim.now() + 100_000;
    // Right after A's request is sent, every operation of A takes 100 ms.
    sim.slow_client_at(&ma, t0 + 3_000, 50_000);
    sim.crash_client_at(shell.memory(), t0 + 20_000);
    let standby = shell.for_client(&sim.client());
    crate::check::kv::spawn_server(&mut sim, &cfg, &standby, t0 + 30_000);
    let got: Rc<core::cell::RefCell<Option<(Gotten, u64)>>> = Rc::default();
    let (g, c, m) = (got.clone(), cfg.clone(), ma.clone());
    sim.spawn(&ma, async move {
        let mut a = connect(&m, &c, 1).await;
        m.sleep(t0 - m.now()).await;
        let r = gotten(a.get(b"k").await);
        *g.borrow_mut() = Some((r, a.central_paths().late_reads));
    });
    let (g, m) = (got.clone(), mb.clone());
    let freed: Rc<core::cell::Cell<u64>> = Rc::default();
    let f = freed.clone();
    sim.spawn(&mb, async move {
        m.sleep(t0 + 60_000 - m.now()).await;
        let mut b = connect(&m, &cfg, 2).await;
        for i in 0u64.. {
            if g.borrow().is_some() {
                break;
            }
            b.update(b"k", &[(i % 250) as u8 + 2; 64]).await.unwrap().unwrap();
            m.sleep(500_000).await;
        }
        f.set(b.central_paths().foreign_frees);
        standby.stop();
    });
    sim.run().unwrap();
    let (r, late) = got.borrow_mut().take().expect("the get returned");
    assert!(freed.get() > 0, "the standby never freed the version A was answered");
    match r {
        Ok(Some(v)) => assert!(v.len() == 64 && v.iter().all(|&x| x == v[0]), "a torn value {v:?}"),
        Err(KvError::Down(_)) => {}
        r => panic!("a late READ returned a reused copy: {r:?}"),
    }
    assert_eq!(late, 1, "A's READ was not late: the case was not made");
}

/// A coordinator paused that came back (A) after its successor (B) began,
/// and B's reader was answered A's last version of k: A's commits over k
/// then must not free that version at once (B's reader READs it later;
/// mutant `central-frees-after-takeover`: A's next write reuses its
/// copies). And A answers for no version it loads after B began (B frees
/// its own at once, knowing no reader of A's): it says it is down.
#[test]
fn a_superseded_coordinator_frees_nothing_its_successor_answered_for() {
    two_coordinators(|mem, cfg, mut a, mut b| async move {
        let area = Area::open_or_create(&mem, COORDINATOR, geometry(&cfg)).await.unwrap();
        let begin = || async {
            let e = area.begin(&mem).await.unwrap();
            Some(Incarnation { word: area.state_word(), running: AreaState::Running(e).encode() })
        };
        let ia = begin().await;
        assert_eq!(
            serve_as(&mut a, &mem, ia, 1, wire::PUT, &insert_body(b"k", b"one")).await.1,
            Some(wire::Answer::Written)
        );
        let ib = begin().await;
        let Some(wire::Answer::Found(k1)) = serve_as(&mut b, &mem, ib, 3, wire::GET, b"k").await.1 else {
            panic!("B did not find k")
        };
        assert_eq!(
            serve_as(&mut b, &mem, ib, 3, wire::PUT, &insert_body(b"j", b"bee")).await.1,
            Some(wire::Answer::Written)
        );
        // A comes back and writes k twice (its map is right: no fence).
        for v in [b"two", b"thr"] {
            assert_eq!(
                serve_as(&mut a, &mem, ia, 1, wire::PUT, &insert_body(b"k", v)).await.1,
                Some(wire::Answer::Written)
            );
        }
        assert!(holds(&mem, &k1, b"one").await, "a successor's reader would read a reused copy");
        assert_eq!(a.paths().frees, 0, "A freed what B may have answered for");
        // j, which B committed, is not A's to answer for.
        let (status, _) = serve_as(&mut a, &mem, ia, 2, wire::GET, b"j").await;
        assert_eq!(status, Status::Failed, "A answered a version committed after it was superseded");
        // B, current, goes on: k's last version is A's "thr".
        let Some(wire::Answer::Found(k3)) = serve_as(&mut b, &mem, ib, 4, wire::GET, b"k").await.1 else {
            panic!("B did not find k")
        };
        assert_eq!(k3.sum, wire::value_sum(b"thr"));
    });
}

/// A coordinator paused that came back (A) answers nothing from its map
/// that another incarnation (B) changed meanwhile: k, which A deleted, B
/// inserted again; j, which A holds as "one", B updated. A's answers
/// follow the keys' cells (mutant `central-no-fence`: A answers from its
/// map, a deleted k and j's old value).
#[test]
fn a_coordinator_answers_nothing_from_its_map_that_another_changed() {
    two_coordinators(|mem, _, mut a, mut b| async move {
        for key in [&b"k"[..], b"j"] {
            put(&mut a, &mem, 1, key, b"one").await;
        }
        assert_eq!(serve(&mut a, &mem, 1, wire::DELETE, b"k").await, wire::Answer::Written);
        put(&mut b, &mem, 2, b"k", b"two").await;
        put(&mut b, &mem, 2, b"j", b"two").await;
        for key in [&b"k"[..], b"j"] {
            let got = serve(&mut a, &mem, 1, wire::GET, key).await;
            assert!(
                matches!(&got, wire::Answer::Found(v) if v.sum == wire::value_sum(b"two")),
                "A answered {key:?} from its stale map: {got:?}"
            );
        }
        assert_eq!(a.paths().fenced, 2);
    });
}
