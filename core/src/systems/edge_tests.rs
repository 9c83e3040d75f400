//! Every registered system at the edges of its store (issue #19): a full
//! store stays readable by a client that connects after it filled, and a
//! write that needs memory names the node and the bytes; nodes of exactly
//! [`StoreConfig::min_node_bytes`] take keys from every client, a chunk
//! less does not; running out of time and a clock far ahead are their own
//! errors, not a full store or missing nodes; a node that is down is named.

use alloc::format;
use alloc::vec::Vec;

use super::*;
use crate::check::clock;
use crate::check::kv::CHUNK;
use crate::kv::place::node_of;
use crate::kv::{Got, KvClient, NodeShape};
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
use crate::substrate::space::region::Region;
use crate::swarm::client::ClientError;
use crate::swarm::meta::MAX_TIME;
use crate::swarm::writerlog::{self, LogError, LogGeometry};
use crate::{MemError, MemErrorKind, NodeId};

/// Whether `system`'s writes take writer-log entries and SWARM timestamps
/// (the stores of `kv::replicated`); the others (RAW, pDPM-Direct) write
/// in place and name their writes otherwise.
fn logs(system: System) -> bool {
    matches!(system.name(), "swarm-kv" | "dm-abd")
}

/// Whether `system` takes the memory of its values when the store is set
/// up (FUSEE: its objects are records of the index's arena), so that a
/// full store says so with [`KvError::IndexSpace`] (or [`KvError::Full`],
/// if the index's slots run out first), and nodes without a free chunk
/// cost its writes nothing.
fn up_front(system: System) -> bool {
    system.name() == "fusee"
}

fn config(system: System, writers: u8) -> StoreConfig {
    // The replicated index takes room for its keys' changes up front, and
    // FUSEE's for their objects too.
    let keys = if up_front(system) {
        500
    } else if system.replicated_index() {
        4_000
    } else {
        20_000
    };
    let mut cfg = StoreConfig::new(system, keys);
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = writers;
    cfg.cache_capacity = 64;
    cfg
}

/// The writer-log directory every node gets, as `swarm memnode create`
/// formats one.
fn geometry() -> LogGeometry {
    LogGeometry::new(256, CHUNK, 16).unwrap()
}

/// A simulator of 3 nodes of `size` bytes: regions, log directories, and
/// the store of `cfg`.
fn setup(cfg: &StoreConfig, size: u64) -> Sim {
    setup_on(cfg, SimConfig { nodes: 3, node_size: size, ..SimConfig::default() })
}

/// [`setup`] on a simulator of configuration `sc` (every node of it).
fn setup_on(cfg: &StoreConfig, sc: SimConfig) -> Sim {
    let (size, nodes) = (sc.node_size, sc.nodes as u16);
    let mut sim = Sim::new(sc);
    let admin = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        for n in 0..nodes {
            Region::format(&admin, NodeId(n), size, CHUNK).await.unwrap();
            writerlog::format(&admin, NodeId(n), geometry()).await.unwrap();
        }
        format(&admin, &c, 1).await.unwrap();
    })
    .unwrap();
    crate::check::kv::start_server(&mut sim, cfg);
    sim
}

async fn connect(mem: &SimMemory, cfg: &StoreConfig, id: u8, skew: u64) -> AnyClient<'static, Value<Vec<u8>>> {
    connect_any(mem.clone(), cfg, Who::Id(id), clock(mem, skew)).await.unwrap()
}

/// Keys of writer `w` that put each replica of some key on each node, so
/// that the writer carves every size class it may use on every node.
fn keys_of(w: u8, cfg: &StoreConfig) -> Vec<Vec<u8>> {
    let copies = if cfg.system.replicated() { cfg.replicas } else { 1 };
    let mut missing: Vec<(usize, u16)> = (0..copies).flat_map(|r| (0..3).map(move |n| (r, n))).collect();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("w{w}-{i}").into_bytes();
        let before = missing.len();
        missing.retain(|&(r, n)| node_of(&key, r, 3) != NodeId(n));
        if missing.len() < before {
            keys.push(key);
        }
        if missing.is_empty() {
            return keys;
        }
    }
    unreachable!()
}

/// Nodes of exactly the least size a store needs take keys from every
/// client, each carving every size class on every node; a chunk less and
/// some client's write fails, naming the node and the bytes, and nothing
/// else goes wrong.
#[test]
fn min_node_bytes_takes_keys_from_every_client_and_no_less_does() {
    for &system in ALL {
        let cfg = config(system, 4);
        let shape = NodeShape { size: 64 << 20, chunk: CHUNK, log: Some(geometry()) };
        let min = cfg.min_node_bytes(3, &shape).unwrap();
        // Node 0 holds RAW's index; the replicated stores' index is on
        // every node here, so that all of them need the most.
        assert_eq!(min.node, NodeId(0), "{system}: node 0 holds an index");
        let fullest = |n: NodeId| n == NodeId(0) || system.replicated_index();
        assert_eq!(min.bytes, min.structures + 4 * min.per_client);
        if up_front(system) {
            // Everything is taken when the store is set up: a chunk less
            // and that fails, naming the node and the bytes.
            let mut sim = Sim::new(SimConfig { nodes: 3, node_size: min.bytes, ..SimConfig::default() });
            let admin = sim.client();
            let c = cfg.clone();
            let e = sim
                .block_on(async move {
                    for n in 0..3 {
                        Region::format(&admin, NodeId(n), min.bytes - CHUNK, CHUNK).await.unwrap();
                        writerlog::format(&admin, NodeId(n), geometry()).await.unwrap();
                    }
                    format(&admin, &c, 1).await.unwrap_err()
                })
                .unwrap();
            assert!(matches!(e, KvError::NodeFull { need, free, .. } if free < need), "{system}: {e:?}");
        }
        let sizes = if up_front(system) { &[min.bytes][..] } else { &[min.bytes, min.bytes - CHUNK][..] };
        for &size in sizes {
            let mut sim = setup(&cfg, size);
            let mem = sim.client();
            let c = cfg.clone();
            let errors = sim
                .block_on(async move {
                    let mut errors = Vec::new();
                    for w in 1..=4 {
                        let mut s = connect(&mem, &c, w, 0).await;
                        for key in keys_of(w, &c) {
                            if let Err(e) = s.insert(&key, &[w; 256]).await {
                                errors.push(e);
                            }
                        }
                    }
                    errors
                })
                .unwrap();
            if size == min.bytes {
                assert!(errors.is_empty(), "{system}: {errors:?} on nodes of the least size");
            } else {
                assert!(!errors.is_empty(), "{system}: a chunk less than the least size took every key");
                for e in errors {
                    assert!(
                        matches!(e, KvError::NodeFull { node, need: CHUNK, free } if free < CHUNK && fullest(node)),
                        "{system}: {e:?}"
                    );
                }
            }
        }
    }
}

/// Client 1 fills the store; client 2, which connects only then, reads
/// every key (connecting and gets allocate nothing), and its insert of a
/// new key fails with the node and the bytes.
#[test]
fn a_full_store_stays_readable_by_a_new_client() {
    for &system in ALL {
        let cfg = config(system, 2);
        let mut sim = setup(&cfg, 2 << 20);
        let mem = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            let mut a = connect(&mem, &c, 1, 0).await;
            let mut written = 0u32;
            let full = loop {
                match a.insert(format!("k{written}").as_bytes(), &[7; 200]).await {
                    Ok(_) => written += 1,
                    Err(e) => break e,
                }
            };
            assert!(written > 100, "{system}: {written} keys");
            let a_full = full;
            if up_front(system) {
                // Its arena, or the index's slots for new keys, whichever
                // runs out first.
                let said = matches!(full, KvError::IndexSpace { used, size } if used <= size);
                assert!(said || full == KvError::Full, "{system}: {full:?}");
            } else {
                let KvError::NodeFull { need, free, .. } = full else { panic!("{system}: {full:?}") };
                assert!(need == CHUNK && free < need, "{system}: {full:?}");
                let text = format!("{full}");
                assert!(text.contains("is full: 64 KiB needed") && text.contains("free"), "{text}");
            }
            let full = |e: &KvError| {
                if up_front(system) {
                    matches!(e, KvError::IndexSpace { .. } | KvError::Full)
                } else {
                    matches!(e, KvError::NodeFull { .. })
                }
            };
            let mut b = connect(&mem, &c, 2, 0).await;
            for k in (0..written).step_by(7) {
                let got = b.get(format!("k{k}").as_bytes()).await;
                assert!(matches!(&got, Ok(Got::Found(v)) if v[..] == [7; 200][..]), "{system}: k{k}: {got:?}");
            }
            // (Where the index's slots ran out, another key's may not have.)
            let inserted = b.insert(b"another", b"v").await;
            // (Clover recycles the versions the filler's updates retired:
            // a freed group and a head cell may take the new key.)
            let may_fit = (up_front(system) && a_full == KvError::Full) || system.name() == "clover";
            assert!(inserted.as_ref().map_or_else(full, |_| may_fit), "{system}: {inserted:?}");
            // An update out of place takes new memory (a log entry on a
            // majority of the key's nodes, some of which may have room
            // left, or pDPM-Central's fresh copies); one in place, none.
            let updated = b.update(b"k0", b"v").await;
            if matches!(system.name(), "raw" | "pdpm-direct") {
                assert!(updated.is_ok(), "{system}: {updated:?}");
            } else {
                assert!(updated.as_ref().map_or_else(full, |_| true), "{system}: {updated:?}");
            }
            // The filler reads on too.
            assert!(matches!(a.get(b"k1").await, Ok(Got::Found(_))), "{system}");
        })
        .unwrap();
    }
}

/// A clock past the last timestamp fails writes with `TimeExhausted` and
/// its numbers; a write after one made by a client whose clock is far
/// ahead fails with `TimeAhead`; neither is "full" or "unavailable", and
/// gets go on.
#[test]
fn running_out_of_time_and_a_clock_ahead_are_their_own_errors() {
    for &system in ALL.iter().filter(|&&s| logs(s)) {
        let cfg = config(system, 2);
        let mut sim = setup(&cfg, 4 << 20);
        let mem = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            let mut honest = connect(&mem, &c, 1, 0).await;
            honest.insert(b"k", b"v").await.unwrap();
            let mut late = connect(&mem, &c, 2, MAX_TIME).await;
            let e = late.insert(b"k2", b"v").await.unwrap_err();
            assert!(matches!(e, KvError::Client(ClientError::TimeExhausted { .. })), "{system}: {e:?}");
            assert!(format!("{e}").contains("timestamps are exhausted"), "{e}");
            let e = late.update(b"k", b"w").await.unwrap_err();
            assert!(matches!(e, KvError::Client(ClientError::TimeExhausted { .. })), "{system}: {e:?}");
            assert!(matches!(late.get(b"k").await, Ok(Got::Found(v)) if v[..] == b"v"[..]), "{system}");
            // An hour ahead (ticks of 100 ns).
            let mut ahead = connect(&mem, &c, 2, 36_000_000_000).await;
            ahead.update(b"k", b"from the future").await.unwrap().unwrap();
            let e = honest.update(b"k", b"now").await.unwrap_err();
            assert!(matches!(e, KvError::Client(ClientError::TimeAhead { .. })), "{system}: {e:?}");
            assert!(format!("{e}").contains("some client's clock is wrong"), "{e}");
        })
        .unwrap();
    }
}

/// A writer log with no entry left waits for its entries to be recycled
/// (backpressure); one whose entries cannot be (segments a previous
/// holder of its id left, on a node that is down) fails, once the wait
/// is over, with its own error and its numbers, whichever path meets it:
/// not "too few memory nodes answered".
#[test]
fn a_full_writer_log_waits_then_is_not_a_missing_quorum() {
    for &system in ALL.iter().filter(|&&s| logs(s)) {
        let cfg = config(system, 2);
        // One segment of 4 entries per client, and a chunk that takes one.
        let geo = LogGeometry::new(256, 4 * 320, 1).unwrap();
        assert_eq!(geo.capacity(), 4);
        let mut sim = Sim::new(SimConfig { nodes: 3, node_size: 2 << 20, ..SimConfig::default() });
        let admin = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            for n in 0..3 {
                Region::format(&admin, NodeId(n), 2 << 20, CHUNK).await.unwrap();
                writerlog::format(&admin, NodeId(n), geo).await.unwrap();
            }
            format(&admin, &c, 1).await.unwrap();
        })
        .unwrap();
        let mem = sim.client();
        let c = cfg.clone();
        let waits = sim
            .block_on(async move {
                let mut s = connect(&mem, &c, 1, 0).await;
                for i in 0..10 {
                    s.insert(format!("k{i}").as_bytes(), b"v").await.unwrap_or_else(|e| panic!("{system}: {e}"));
                }
                s.paths().room_waits
            })
            .unwrap();
        assert!(waits > 0, "{system}: ten writes in a log of four waited for none");
        // The next holder of id 1 cannot read what the last one left on
        // node 2, so it cannot give it back.
        let now = sim.now();
        sim.crash_node_at(2, now, CrashMode::FailFast);
        let mem = sim.client();
        sim.block_on(async move {
            let mut s = connect(&mem, &cfg, 1, 0).await;
            let e = s.insert(b"k0", b"w").await.map(|_| ()).unwrap_err();
            let full = ClientError::Log(LogError::Full { client: 1, capacity: 4 });
            assert_eq!(e, KvError::Client(full), "{system}");
            assert!(format!("{e}").contains("has used all 4 entries of its log"), "{e}");
            assert!(s.paths().room_waits > 0, "{system}: it failed without waiting");
        })
        .unwrap();
    }
}

/// Every node without a free chunk: a write whose log segment cannot be
/// created on any replica's node fails naming the node and the bytes (it
/// once read "too few memory nodes answered", as if nodes were down); a
/// new client still connects and reads.
#[test]
fn no_room_for_a_log_segment_is_not_a_missing_quorum() {
    // A store whose server allocates carves its chunks before the nodes
    // fill, and writes on into them: not this test's case.
    for &system in ALL.iter().filter(|s| s.server().is_none()) {
        let cfg = config(system, 2);
        let mut sim = setup(&cfg, 4 << 20);
        let mem = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            let mut a = connect(&mem, &c, 1, 0).await;
            a.insert(b"k", b"v").await.unwrap();
            for n in 0..3 {
                let mut region = Region::open(&mem, NodeId(n)).await.unwrap();
                while region.alloc_chunk(&mem).await.is_ok() {}
            }
            let mut b = connect(&mem, &c, 2, 0).await;
            assert!(matches!(b.get(b"k").await, Ok(Got::Found(v)) if v[..] == b"v"[..]), "{system}");
            let updated = b.update(b"k", b"w").await;
            if logs(system) {
                let e = updated.unwrap_err();
                assert!(matches!(e, KvError::NodeFull { need: CHUNK, .. }), "{system}: {e:?}");
            } else {
                assert!(updated.is_ok(), "{system}: updates in place or in the arena: {updated:?}");
            }
            let inserted = b.insert(b"new", b"v").await;
            if up_front(system) {
                assert!(inserted.is_ok(), "{system}: objects in the arena: {inserted:?}");
            } else {
                let e = inserted.unwrap_err();
                assert!(matches!(e, KvError::NodeFull { need: CHUNK, .. }), "{system}: {e:?}");
            }
        })
        .unwrap();
    }
}

/// Node 0 stalled (its operations wait, unanswered, until they time out):
/// a store's record, and a writer's log geometry, are read from the next
/// node once node 0 is late, not after its time-out, which every command
/// and client (and its first write) would otherwise pay (1 s on shm).
#[test]
fn a_stalled_node_0_is_passed_over_for_what_every_node_holds() {
    let timeout = 20_000_000;
    let system = from_name("swarm-kv").unwrap();
    let cfg = config(system, 2);
    let sc = SimConfig { nodes: 3, node_size: 4 << 20, timeout_ns: timeout, ..SimConfig::default() };
    let mut sim = setup_on(&cfg, sc);
    let now = sim.now();
    sim.stall_node_at(0, now, 10 * timeout);
    let mem = sim.client();
    let (found, took, geo, geo_took) = sim
        .block_on(async move {
            let t0 = mem.now();
            let found = open(&mem).await.map(|r| r.config.system);
            let t1 = mem.now();
            let geo = writerlog::Logs::new().any_geometry(&mem).await;
            (found, mem.now() - t0, geo, mem.now() - t1)
        })
        .unwrap();
    assert_eq!(found, Ok(system), "the record of the other nodes");
    assert!(took < timeout / 4, "open waited for node 0's time-out: {took} ns (time-out {timeout} ns)");
    assert_eq!(geo.ok(), Some(geometry()), "the geometry of the other nodes' logs");
    assert!(geo_took < timeout / 4, "the log geometry waited for node 0's time-out: {geo_took} ns");
}

/// Node 0 failed: connecting to a store whose index it holds alone says that
/// node 0 is down; the replicated stores, whose index is replicated like
/// their values, go on (a store's record is read from the other nodes).
#[test]
fn node_0_down_is_named_by_raw_and_survived_by_the_replicated_stores() {
    for &system in ALL {
        let cfg = config(system, 2);
        let mut sim = setup(&cfg, 4 << 20);
        let now = sim.now();
        sim.crash_node_at(0, now, CrashMode::FailFast);
        let mem = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            assert_eq!(open(&mem).await.map(|r| r.config.system), Ok(system), "the record of the other nodes");
            let connected = connect_any(mem.clone(), &c, Who::Id(1), clock(&mem, 0)).await;
            if !system.replicated_index() {
                let e = connected.err().unwrap();
                let down = MemError::new(NodeId(0), MemErrorKind::Unreachable);
                assert_eq!(e, KvError::Down(down), "{system}");
                assert_eq!(format!("{e}"), "node 0 is down (unreachable)");
                return;
            }
            let mut s = connected.unwrap();
            for i in 0..20u8 {
                let key = [b'k', i];
                s.insert(&key, &[i; 8]).await.unwrap();
                assert!(matches!(s.get(&key).await, Ok(Got::Found(v)) if v[..] == [i; 8]), "{system}");
            }
            // A client that never cached them finds them through the index.
            let mut t = connect(&mem, &c, 2, 0).await;
            for i in 0..20u8 {
                assert!(matches!(t.get(&[b'k', i]).await, Ok(Got::Found(v)) if v[..] == [i; 8]), "{system}");
            }
        })
        .unwrap();
    }
}

/// A client whose lease expired while it was idle, and that then finds no
/// majority of the lease table's nodes (the first three of five) to renew
/// it, is told that its lease could not be kept, not that the nodes of
/// the operation (a key on the other three) did not answer: every system
/// that leases ids says so the same way.
#[test]
fn a_lease_that_cannot_be_renewed_says_so() {
    use crate::kv::place::lease_nodes;
    use crate::substrate::lease::{LeaseError, Want};
    let mut seen = 0;
    for &system in ALL {
        let mut cfg = config(system, 2);
        cfg.lease_ms = crate::kv::config::MIN_LEASE_MS;
        let copies = if system.replicated() { cfg.replicas } else { 1 };
        if lease_nodes(&cfg, 5) != 3 || system.server().is_some() {
            continue;
        }
        seen += 1;
        let mut sim = setup_on(&cfg, SimConfig { nodes: 5, node_size: 4 << 20, ..SimConfig::default() });
        // A key whose every copy is on nodes 2 to 4.
        let key = (0u32..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| (0..copies).all(|r| node_of(k, r, 5).0 >= 2))
            .unwrap();
        let mem = sim.client();
        let lease_ns = cfg.lease_ms as u64 * 1_000_000;
        let crash = sim.now() + lease_ns;
        // Past the lease, within the grace: the id is still this client's.
        sim.crash_node_at(0, crash, CrashMode::FailFast);
        sim.crash_node_at(1, crash, CrashMode::FailFast);
        sim.block_on(async move {
            let clk = clock(&mem, 0);
            let held = claim(&mem, &cfg, &clk, Want::Id(1), 7).await.unwrap();
            let mut s = connect_any(mem.clone(), &cfg, Who::Lease(held), clk).await.unwrap();
            s.insert(&key, b"v").await.unwrap();
            mem.sleep(lease_ns + lease_ns / 2).await;
            let e = s.update(&key, b"w").await.unwrap_err();
            assert_eq!(e, KvError::Lease(LeaseError::NoQuorum), "{system}: {e}");
            assert!(format!("{e}").contains("lease table"), "{e}");
        })
        .unwrap();
    }
    assert!(seen >= 4, "systems checked: {seen}");
}

/// A client that crashes leaves its partly used chunks to its id's next
/// holder, from the marks its lease record names (the one-copy index's
/// chunk of key blocks too): the next holder's inserts take no chunk of
/// their own, and every key of both reads its
/// value (an object carved again under a published one would give one
/// key the other's value). Checked on every store whose clients carve
/// their own objects; the mutant `marks-are-bumps` (records that name
/// each chunk from where carving stood, not from its mark) fails it.
#[test]
fn a_crashed_clients_chunks_go_to_its_ids_next_holder() {
    crashed_chunks_go_to_the_next_holder(false);
}

/// The same, with a claimer in between that cannot open the index (its
/// root words gone for a moment): it gives the id back with the crashed
/// holder's chunks from their marks, or leaves it to lapse (the stores of
/// `kv::seat`, whose record may name FUSEE's log), so that its next holder
/// still takes them over. The mutant `crashed-claim-given-back` (given back with
/// nothing, as before) fails it.
#[test]
fn a_claimer_that_cannot_open_the_index_leaves_a_crashed_holders_chunks() {
    crashed_chunks_go_to_the_next_holder(true);
}

/// Runs `body` on a fresh store of each system `pick` chooses (one
/// writer, the shortest lease, 8 MiB nodes); how many it ran on.
fn on_each_short_lease<F: core::future::Future<Output = ()> + 'static>(
    pick: impl Fn(System) -> bool,
    body: impl Fn(System, StoreConfig, SimMemory) -> F,
) -> usize {
    let mut seen = 0;
    for &system in ALL.iter().filter(|&&s| pick(s)) {
        seen += 1;
        let mut cfg = config(system, 1);
        cfg.lease_ms = crate::kv::config::MIN_LEASE_MS;
        let mut sim = setup(&cfg, 8 << 20);
        let mem = sim.client();
        sim.block_on(body(system, cfg, mem)).unwrap();
    }
    seen
}

/// Claims id 1 of `cfg`'s store for `system` once its holder's lease (and
/// grace) is over.
async fn claim_lapsed(
    mem: &SimMemory,
    cfg: &StoreConfig,
    clk: &crate::check::SimClock,
    nonce: u32,
    system: System,
) -> crate::substrate::lease::Held {
    use crate::substrate::lease::{LeaseError, Want};
    loop {
        match claim(mem, cfg, clk, Want::Id(1), nonce).await {
            Ok(h) => return h,
            Err(KvError::Lease(LeaseError::Taken { free_in_ms, .. })) => mem.sleep((free_in_ms + 1) * 1_000_000).await,
            Err(e) => panic!("{system}: {e}"),
        }
    }
}

/// A client whose id's previous holder crashed leaves the log segment
/// that holder wrote in to be recycled by some later holder; a holder that
/// runs one command, as `swarm kv put` does, lives too short for that, so
/// it recycles the segment before it gives the id back
/// (`ClientCtx::settle_inherited`): after it closes, the id holds its own
/// segment alone on every node. The mutant `inherited-left-in-use` (it
/// gives the id back at once) leaves two.
#[test]
fn a_one_command_holder_gives_back_the_segment_a_crashed_one_left() {
    use crate::substrate::lease::{Resumed, Want};
    let seen = on_each_short_lease(logs, |system, cfg, mem| async move {
        let clk = clock(&mem, 0);
        let in_use = async || {
            let nodes = [NodeId(0), NodeId(1), NodeId(2)];
            let mut each = [0; 3];
            writerlog::Logs::new().in_use_on(&mem, &nodes, 1, 3, |n, _, _| each[n] += 1).await;
            each
        };
        let held = claim(&mem, &cfg, &clk, Want::Id(1), 7).await.unwrap();
        let mut a = connect_any(mem.clone(), &cfg, Who::Lease(held), clock(&mem, 0)).await.unwrap();
        for i in 0..20u32 {
            a.insert(format!("k{i}").as_bytes(), b"a's").await.unwrap();
        }
        // Crashed: never closed, its lease left to expire.
        core::mem::forget(a);
        let held = claim_lapsed(&mem, &cfg, &clk, 8, system).await;
        assert_eq!(held.resume().state, Resumed::Crashed);
        let mut b = connect_any(mem.clone(), &cfg, Who::Lease(held), clk).await.unwrap();
        b.update(b"k0", b"b's").await.unwrap().unwrap();
        assert_eq!(in_use().await, [2; 3], "{system}: the crashed holder's segment and the next one's");
        b.close().await.unwrap();
        assert_eq!(in_use().await, [1; 3], "{system}: segments in use once the one-command holder closed");
        let mut c = connect_any(mem.clone(), &cfg, Who::Id(1), clock(&mem, 0)).await.unwrap();
        for i in 0..20u32 {
            let want: &[u8] = if i == 0 { b"b's" } else { b"a's" };
            match c.get(format!("k{i}").as_bytes()).await {
                Ok(Got::Found(v)) => assert_eq!(v.as_ref(), want, "{system}: k{i}"),
                other => panic!("{system}: k{i}: {other:?}"),
            }
        }
    });
    assert!(seen >= 2, "systems checked: {seen}");
}

fn crashed_chunks_go_to_the_next_holder(failed_claim: bool) {
    use crate::substrate::lease::{Resumed, Want};
    use crate::substrate::space::roots;
    let carving = |system: System| system.server().is_none() && !up_front(system);
    let seen = on_each_short_lease(carving, move |system, cfg, mem| async move {
        let clk = clock(&mem, 0);
        let key = |who: &str, i: u32| format!("{who}-{i}").into_bytes();
        let value = |who: &str, i: u32| format!("{who} wrote {i}").into_bytes();
        let cursors = async || {
            let mut c = Vec::new();
            for n in 0..3 {
                c.push(Region::open(&mem, NodeId(n)).await.unwrap().cursor);
            }
            c
        };
        let held = claim(&mem, &cfg, &clk, Want::Id(1), 7).await.unwrap();
        let mut a = connect_any(mem.clone(), &cfg, Who::Lease(held), clock(&mem, 0)).await.unwrap();
        for i in 0..20 {
            a.insert(&key("a", i), &value("a", i)).await.unwrap();
        }
        // Crashed: never closed, its lease left to expire.
        core::mem::forget(a);
        if failed_claim {
            // A claimer finds no index (every replica's root word
            // cleared for a moment) and fails.
            let roots: Vec<_> = (0..3).map(|n| Region::root_slot(NodeId(n), roots::INDEX).unwrap()).collect();
            let mut kept = Vec::new();
            for &at in &roots {
                kept.push(crate::substrate::memory::read_word(&mem, at).await.unwrap());
                mem.write(at, &0u64.to_le_bytes()).await.unwrap();
            }
            let held = claim_lapsed(&mem, &cfg, &clk, 9, system).await;
            assert_eq!(held.resume().state, Resumed::Crashed);
            let failed = connect_any(mem.clone(), &cfg, Who::Lease(held), clock(&mem, 0)).await;
            assert!(failed.is_err(), "{system}: a client connected without an index");
            for (&at, w) in roots.iter().zip(kept) {
                mem.write(at, &w.to_le_bytes()).await.unwrap();
            }
        }
        let held = claim_lapsed(&mem, &cfg, &clk, 8, system).await;
        // (The stores of `kv::replicated` give the id back at once,
        // with the crashed holder's chunks from their marks.)
        if !failed_claim {
            assert_eq!(held.resume().state, Resumed::Crashed);
        }
        let mut b = connect_any(mem.clone(), &cfg, Who::Lease(held), clk).await.unwrap();
        // Its first write opens its own log segment (the crashed
        // holder's stay in use until they are recycled).
        b.update(&key("a", 0), &value("a", 0)).await.unwrap().unwrap();
        let taken = cursors().await;
        for i in 0..20 {
            b.insert(&key("b", i), &value("b", i)).await.unwrap();
        }
        assert_eq!(cursors().await, taken, "{system}: the next holder took chunks of its own");
        for who in ["a", "b"] {
            for i in 0..20 {
                match b.get(&key(who, i)).await {
                    Ok(Got::Found(v)) => assert_eq!(v.as_ref(), &value(who, i)[..], "{system}: {who}-{i}"),
                    other => panic!("{system}: {who}-{i}: {other:?}"),
                }
            }
        }
        b.close().await.unwrap();
    });
    assert!(seen >= 4, "systems checked: {seen}");
}
