//! SWARM-KV shared by OS processes on shared-memory nodes (issue #4):
//!
//! - `four_processes_ycsb_a_with_a_failed_node`: four client processes run
//!   a YCSB-A-like mix (half gets, half updates, on 16 shared keys) while
//!   the parent fails one of the three memory nodes by fault injection
//!   half-way. Every operation must complete, and the history of all
//!   processes (with the parent's final reads) must be linearizable.
//! - `kill_minus_nine_mid_write`: a client process updating keys in a
//!   tight loop is killed with SIGKILL; every key must stay readable by
//!   the others, hold a value that was written and is no older than the
//!   last update acknowledged to the killed writer, and take new updates.
//!
//! Both re-execute the test binary as children (`swarm_testkit::procs`),
//! and time operations with a logical clock: a counter in a second, tiny
//! shared-memory cluster that every process increments around each
//! operation, so that "returned before invoked" is exact across processes.
#![cfg(not(loom))]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use swarm_backend_shm::{Fault, ShmCluster, ShmMemory};
use swarm_core::NodeId;
use swarm_core::kv::{Got, KvClient, KvSystem, StoreConfig, Who};
use swarm_core::sim::Rng;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::lease::Want;
use swarm_core::substrate::rtt::Counted;
use swarm_core::substrate::space::region::Region;
use swarm_core::systems::{self, swarm_kv::SwarmKv};
use swarm_lincheck::{self as lincheck, History, KvOp, KvRet};
use swarm_testkit::procs::{self, Children, id_of, key, line, parse, tick, value};

const NODES: usize = 3;
const KEYS: u64 = 16;
const CLIENTS: u8 = 4;
const OPS: u64 = 3_000;
const DEADLINE: Duration = Duration::from_secs(240);

fn config() -> StoreConfig {
    let mut cfg = StoreConfig::new(systems::from_name("swarm-kv").unwrap(), 64);
    cfg.max_key = 16;
    cfg.writers = CLIENTS + 3;
    cfg.cache_capacity = 64;
    cfg
}

/// The store's cluster of [`NODES`] nodes and the clock's, in `dir`.
fn create(dir: &Path) -> (ShmCluster, ShmCluster) {
    create_on(dir, NODES)
}

/// The store's cluster of `nodes` nodes and the clock's, in `dir`.
fn create_on(dir: &Path, nodes: usize) -> (ShmCluster, ShmCluster) {
    let cfg = config();
    let size = cfg.node_bytes(nodes, CLIENTS as u64 * OPS * 2);
    let store = ShmCluster::create(dir.join("store"), nodes, size).expect("create store nodes");
    let clock = ShmCluster::create(dir.join("clock"), 1, 4096).expect("create clock node");
    let mem = store.memory();
    block_on(async {
        for n in 0..nodes {
            Region::format(&mem, NodeId(n as u16), size, StoreConfig::CHUNK).await.unwrap();
        }
        systems::format(&mem, &cfg, SystemClock::unix_us()).await.unwrap();
    });
    (store, clock)
}

fn open(dir: &Path) -> (ShmCluster, ShmCluster) {
    (ShmCluster::open(dir.join("store")).unwrap(), ShmCluster::open(dir.join("clock")).unwrap())
}

/// A SWARM-KV client on shared memory.
type Client = <SwarmKv as KvSystem>::Client<ShmMemory, SystemClock>;

/// Client `id`, with the store's clock and a lease on its id.
fn connect(mem: ShmMemory, id: u8) -> Client {
    block_on(async {
        let clock = SystemClock { epoch_us: systems::open(&mem).await?.epoch_us };
        let held = systems::claim(&mem, &config(), &clock, Want::Id(id), std::process::id()).await?;
        SwarmKv::connect(mem, &config(), Who::Lease(held), clock).await
    })
    .expect("connect")
}

/// Runs `op` on `s`, timed by `clock`.
fn run(s: &mut Client, clock: &ShmMemory, id: u8, op: KvOp) -> String {
    let call = tick(clock);
    let answer = match op {
        KvOp::Get(k) => match block_on(s.get(&key(k))) {
            Ok(Got::Found(v)) => KvRet::Found(id_of(&v).unwrap_or_else(|| panic!("client {id}: a value nobody wrote"))),
            Ok(Got::NotFound) => KvRet::NotFound,
            Ok(Got::Deleted) => KvRet::Deleted,
            Err(e) => panic!("client {id}: get {k}: {e}"),
        },
        KvOp::Update(k, v) => match block_on(s.update(&key(k), &value(v))) {
            Ok(Ok(_)) => KvRet::Ok,
            Ok(Err(_)) => KvRet::NotFound,
            Err(e) => panic!("client {id}: update {k}: {e}"),
        },
        KvOp::Insert(k, v) => {
            block_on(s.insert(&key(k), &value(v))).unwrap_or_else(|e| panic!("client {id}: insert {k}: {e}"));
            KvRet::Ok
        }
        KvOp::Delete(_) => unreachable!("no deletes in YCSB-A"),
    };
    line(id as u32, call, tick(clock), &op, Some(&answer))
}

#[test]
fn four_processes_ycsb_a_with_a_failed_node() {
    if let Some((role, dir)) = procs::role() {
        if let Some(id) = role.strip_prefix("ycsb-") {
            ycsb_child(id.parse().unwrap(), &dir);
        }
        return;
    }
    let dir = TempDir::new("ycsb");
    let (store, clock_nodes) = create(&dir.0);
    let (mem, clock) = (store.memory(), clock_nodes.memory());
    // The load phase: every key inserted, by a client of its own.
    let loader = CLIENTS + 1;
    let mut s = connect(mem.clone(), loader);
    let mut lines = String::new();
    for k in 0..KEYS {
        lines += &run(&mut s, &clock, loader, KvOp::Insert(k, (loader as u64) << 32 | k));
    }
    let mut children = Children::spawn(
        "four_processes_ycsb_a_with_a_failed_node",
        &dir.0,
        (1..=CLIENTS).map(|c| format!("ycsb-{c}")),
        DEADLINE,
    );
    // Half-way (every child past half its operations), node 2 fails.
    let start = Instant::now();
    while (1..=CLIENTS).any(|c| !dir.0.join(format!("half-{c}")).exists()) {
        assert!(start.elapsed() < DEADLINE, "children never got half-way");
        children.check_alive();
        std::thread::sleep(Duration::from_millis(2));
    }
    store.set_fault(NodeId(2), Fault::Failed).unwrap();
    std::fs::File::create(dir.0.join("failed")).unwrap();
    children.wait_success();
    // Everything the children wrote, then a fresh client reads every key.
    for c in 1..=CLIENTS {
        lines += &std::fs::read_to_string(dir.0.join(format!("history-{c}"))).unwrap();
    }
    let reader = CLIENTS + 2;
    let mut s = connect(mem.clone(), reader);
    for k in 0..KEYS {
        lines += &run(&mut s, &clock, reader, KvOp::Get(k));
    }
    let ops: Vec<_> = lines.lines().map(parse).collect();
    assert_eq!(ops.len() as u64, 2 * KEYS + CLIENTS as u64 * OPS, "every operation completed");
    let mut h = History::new();
    for op in ops {
        h.push(op);
    }
    let verdict = lincheck::check(&lincheck::Kv::lazy_unmap(), h.operations());
    assert!(verdict.is_linearizable(), "{verdict}");
}

fn ycsb_child(id: u8, dir: &Path) {
    let (store, clock_nodes) = open(dir);
    let (mem, clock) = (store.memory(), clock_nodes.memory());
    let mut s = connect(mem, id);
    let mut rng = Rng::new(id as u64);
    let mut out = std::fs::File::create(dir.join(format!("history-{id}"))).unwrap();
    let mut lines = String::new();
    for seq in 1..=OPS {
        let k = rng.below(KEYS);
        let op = if rng.below(2) == 0 { KvOp::Get(k) } else { KvOp::Update(k, (id as u64) << 32 | seq) };
        lines += &run(&mut s, &clock, id, op);
        if seq == OPS / 2 {
            // Half-way: wait until the parent has failed the node, so that
            // the second half certainly runs without it.
            std::fs::File::create(dir.join(format!("half-{id}"))).unwrap();
            let start = Instant::now();
            while !dir.join("failed").exists() {
                assert!(start.elapsed() < DEADLINE, "client {id}: the node was never failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    out.write_all(lines.as_bytes()).unwrap();
}

#[test]
fn kill_minus_nine_mid_write() {
    if let Some((role, dir)) = procs::role() {
        if role == "writer" {
            writer_child(&dir);
        }
        return;
    }
    let dir = TempDir::new("kill");
    let (store, clock_nodes) = create(&dir.0);
    let (mem, clock) = (store.memory(), clock_nodes.memory());
    let loader = CLIENTS + 1;
    let mut s = connect(mem.clone(), loader);
    for k in 0..KEYS {
        run(&mut s, &clock, loader, KvOp::Insert(k, (loader as u64) << 32 | k));
    }
    let mut children = Children::spawn("kill_minus_nine_mid_write", &dir.0, ["writer".to_string()], DEADLINE);
    // Let it write for a while, then SIGKILL it in the middle of its writes.
    let intents = dir.0.join("intents");
    let start = Instant::now();
    while std::fs::metadata(&intents).map_or(0, |m| m.len()) < 20_000 {
        assert!(start.elapsed() < DEADLINE, "the writer never started");
        children.check_alive();
        std::thread::sleep(Duration::from_millis(1));
    }
    children.kill_all();
    let written: std::collections::HashSet<u64> = std::fs::read_to_string(&intents)
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .chain((0..KEYS).map(|k| (loader as u64) << 32 | k))
        .collect();
    // The last update of each key acknowledged to the writer before it died.
    let mut acked = std::collections::HashMap::new();
    for v in std::fs::read_to_string(dir.0.join("acks")).unwrap().lines().filter_map(|l| l.parse::<u64>().ok()) {
        let seq = v & 0xffff_ffff;
        let last = acked.entry(seq % KEYS).or_insert(0);
        *last = seq.max(*last);
    }
    assert!(acked.len() as u64 == KEYS, "the writer was killed before it updated every key");
    // Every key readable by another client, with a value that was written,
    // no older than its last acknowledged update, and it takes new updates.
    let other = CLIENTS + 2;
    let mut s = connect(mem, other);
    for k in 0..KEYS {
        match block_on(s.get(&key(k))) {
            Ok(Got::Found(v)) => {
                let id = id_of(&v).expect("a torn or foreign value");
                assert!(written.contains(&id), "key {k}: value {id:#x} was never written");
                let last = acked[&k];
                assert!(
                    id >> 32 == 1 && id & 0xffff_ffff >= last,
                    "key {k}: read {id:#x}, older than the acknowledged update of seq {last}: a write was lost"
                );
            }
            other => panic!("key {k}: {other:?}"),
        }
        let fresh = (other as u64) << 32 | k;
        assert!(matches!(block_on(s.update(&key(k), &value(fresh))), Ok(Ok(_))));
        match block_on(s.get(&key(k))) {
            Ok(Got::Found(v)) => assert_eq!(id_of(&v), Some(fresh)),
            other => panic!("key {k} after update: {other:?}"),
        }
    }
}

#[test]
fn a_new_process_works_at_once_while_a_node_is_stalled() {
    if let Some((role, dir)) = procs::role() {
        if let Some(run) = role.strip_prefix("fresh-") {
            fresh_child(run, &dir);
        }
        return;
    }
    let dir = TempDir::new("stall");
    // Four nodes: the index on the first three, node 3 none of it.
    let (store, _clock) = create_on(&dir.0, 4);
    let loader = CLIENTS + 1;
    let mut s = connect(store.memory(), loader);
    for k in 0..KEYS {
        block_on(s.insert(&key(k), &value((loader as u64) << 32 | k))).unwrap();
    }
    block_on(s.close()).unwrap();
    // A fresh process on the healthy store, then one while node 3 (not
    // the index's) is stalled: the second waits for nothing (its stalled
    // operations would wait an hour), and takes at most a roundtrip more.
    Children::spawn(
        "a_new_process_works_at_once_while_a_node_is_stalled",
        &dir.0,
        ["fresh-healthy".to_string()],
        DEADLINE,
    )
    .wait_success();
    store.set_fault(NodeId(3), Fault::Stalled).unwrap();
    Children::spawn(
        "a_new_process_works_at_once_while_a_node_is_stalled",
        &dir.0,
        ["fresh-stalled".to_string()],
        DEADLINE,
    )
    .wait_success();
    let rtts = |run: &str| -> Vec<u32> {
        let text = std::fs::read_to_string(dir.0.join(format!("rtts-{run}"))).unwrap();
        text.split_whitespace().map(|w| w.parse().unwrap()).collect()
    };
    let (healthy, stalled) = (rtts("healthy"), rtts("stalled"));
    eprintln!(
        "roundtrips (connect, first get, first update, first insert): healthy {healthy:?}, node 3 stalled {stalled:?}"
    );
    let what = ["connect", "first get", "first update", "first insert"];
    assert_eq!(stalled.len(), what.len());
    for (what, (h, s)) in what.iter().zip(healthy.iter().zip(&stalled)) {
        assert!(s <= &(h + 1), "{what}: {s} roundtrips with node 3 stalled, {h} without");
    }
    // The keys inserted during the stall got no replica on node 3; once it
    // is back, they get one, so that they survive node 2's failure (an
    // index replica too: the index leaves it out, after its lease).
    store.set_fault(NodeId(3), Fault::Healthy).unwrap();
    store.set_fault(NodeId(2), Fault::Failed).unwrap();
    let mut s = connect(store.memory(), loader);
    for (run, k) in FRESH_RUNS.iter().flat_map(|&(run, from)| (from..from + NEW_KEYS).map(move |k| (run, k))) {
        match block_on(s.get(&key(k))) {
            Ok(Got::Found(v)) => assert_eq!(id_of(&v), Some(k), "key {k} of the {run} run"),
            other => panic!("key {k} of the {run} run, with node 2 failed: {other:?}"),
        }
    }
}

/// New keys per fresh process, and where each run's start.
const NEW_KEYS: u64 = 8;
const FRESH_RUNS: [(&str, u64); 2] = [("healthy", KEYS), ("stalled", KEYS + NEW_KEYS)];

/// Connects with a stall time-out of an hour, gets and updates every key,
/// inserts its run's new keys, and writes the roundtrips of its
/// connection, first get, first update and first insert to `rtts-{run}`.
fn fresh_child(run: &str, dir: &Path) {
    let (store, _clock) = open(dir);
    let mem = Counted::new(store.memory().with_timeout(Duration::from_secs(3600)));
    let id = CLIENTS + 3;
    let mut s = block_on(async {
        let clock = SystemClock { epoch_us: systems::open(&mem).await?.epoch_us };
        let held = systems::claim(&mem, &config(), &clock, Want::Id(id), std::process::id()).await?;
        SwarmKv::connect(&mem, &config(), Who::Lease(held), clock).await
    })
    .expect("connect");
    let mut rtts = vec![mem.roundtrips()];
    for k in 0..KEYS {
        mem.reset();
        let got = block_on(s.get(&key(k))).unwrap();
        assert!(matches!(got, Got::Found(v) if id_of(&v).is_some()), "key {k}");
        if k == 0 {
            rtts.push(mem.roundtrips());
        }
        mem.reset();
        block_on(s.update(&key(k), &value((id as u64) << 32 | k))).unwrap().unwrap();
        if k == 0 {
            rtts.push(mem.roundtrips());
        }
    }
    let (_, from) = FRESH_RUNS.iter().find(|(r, _)| *r == run).expect("a run of FRESH_RUNS");
    for k in *from..from + NEW_KEYS {
        mem.reset();
        block_on(s.insert(&key(k), &value(k))).unwrap();
        if k == *from {
            rtts.push(mem.roundtrips());
        }
    }
    block_on(s.close()).unwrap();
    let line: Vec<String> = rtts.iter().map(|r| r.to_string()).collect();
    std::fs::write(dir.join(format!("rtts-{run}")), line.join(" ")).unwrap();
}

/// Updates keys round-robin until killed; each value's id is appended to
/// `intents` (and flushed) before it is written, and to `acks` once the
/// update returned.
fn writer_child(dir: &Path) {
    let (store, _clock) = open(dir);
    let id = 1;
    let mut s = connect(store.memory(), id);
    let append = |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name)).unwrap();
    let (mut intents, mut acks) = (append("intents"), append("acks"));
    for seq in 1.. {
        let k = seq % KEYS;
        let v = (id as u64) << 32 | seq;
        writeln!(intents, "{v}").unwrap();
        intents.flush().unwrap();
        block_on(s.update(&key(k), &value(v))).unwrap().unwrap();
        writeln!(acks, "{v}").unwrap();
        acks.flush().unwrap();
    }
}

/// A fresh directory under /dev/shm, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = PathBuf::from(format!("/dev/shm/swarm-kv-mp-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = ShmCluster::remove(self.0.join("store"));
        let _ = ShmCluster::remove(self.0.join("clock"));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
