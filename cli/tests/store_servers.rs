//! The server of every store that has one (`KvSystem::SERVER`:
//! pDPM-Central's coordinator, pDPM §4.2) as an OS process of its own
//! (`swarm serve --node 0`), serving client processes on one shm cluster,
//! killed with SIGKILL in the middle of their operations and replaced by a
//! standby process (a new incarnation of the server, which recovers the
//! committed state from node 0's memory).
//!
//! The clients re-execute this test binary (`swarm_testkit::procs`) and
//! time their operations with a logical clock, a counter in a second,
//! tiny cluster that every process increments around each operation. A
//! call that fails while the server is down may or may not have taken
//! effect: it stays pending in the history, and its client goes on under a
//! new name. The history of every process, with the parent's final reads,
//! must be linearizable (the store's declared guarantee).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{ShmDir, ok, signal, start_server};
use swarm_backend_shm::{ShmCluster, ShmMemory};
use swarm_core::kv::AnyClient;
use swarm_core::kv::System;
use swarm_core::kv::{Got, KvClient, KvError, StoreConfig, Who};
use swarm_core::sim::Rng;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::lease::Want;
use swarm_core::systems;
use swarm_core::{Memory, NodeId};
use swarm_lincheck::{self as lincheck, History, KvOp, KvRet};
use swarm_testkit::procs::{self, Children, id_of, key, line, parse, tick, value};

const TEST: &str = "a_killed_server_process_is_replaced_mid_run";
const KEYS: u64 = 8;
const CLIENTS: u8 = 3;
/// Operations each client runs at least, half before the kill.
const OPS: u64 = 300;
const DEADLINE: Duration = Duration::from_secs(300);
/// Keys of each client's own, inserted in turn (the store holds 1,000).
const NEW_KEYS: u64 = 300;

/// The store's cluster and the clock's.
fn open(dir: &Path) -> (ShmCluster, ShmCluster) {
    (ShmCluster::open(dir.join("store")).unwrap(), ShmCluster::open(dir.join("clock")).unwrap())
}

type Client = AnyClient<'static, swarm_core::substrate::value::Value<<ShmMemory as Memory>::Buf>>;

/// Client `id` of the store on `mem`, with a lease on its id.
fn connect(mem: ShmMemory, id: u8) -> (Client, StoreConfig) {
    block_on(async {
        let rec = systems::open(&mem).await?;
        let clock = SystemClock { epoch_us: rec.epoch_us };
        let held = systems::claim(&mem, &rec.config, &clock, Want::Id(id), std::process::id()).await?;
        let c = systems::connect_any(mem, &rec.config, Who::Lease(held), clock).await?;
        Ok::<_, KvError>((c, rec.config))
    })
    .expect("connect")
}

/// Runs `op` on `s` as history client `client`, timed by `clock`: its
/// line, and whether it completed. Only a failure to reach the server
/// (beside node 0) leaves it pending; any other error fails
/// the test.
fn run(s: &mut Client, clock: &ShmMemory, client: u32, op: KvOp) -> (String, bool) {
    let call = tick(clock);
    let answer = match op {
        KvOp::Get(k) => block_on(s.get(&key(k))).map(|g| match g {
            Got::Found(v) => KvRet::Found(id_of(&v).unwrap_or_else(|| panic!("client {client}: a value nobody wrote"))),
            Got::NotFound => KvRet::NotFound,
            Got::Deleted => KvRet::Deleted,
        }),
        KvOp::Update(k, v) => block_on(s.update(&key(k), &value(v))).map(|r| r.map_or(KvRet::NotFound, |_| KvRet::Ok)),
        KvOp::Insert(k, v) => block_on(s.insert(&key(k), &value(v))).map(|_| KvRet::Ok),
        KvOp::Delete(k) => block_on(s.delete(&key(k))).map(|r| r.map_or(KvRet::NotFound, |_| KvRet::Ok)),
    };
    match answer {
        Ok(a) => (line(client, call, tick(clock), &op, Some(&a)), true),
        Err(KvError::Down(e)) if e.node == NodeId(0) => (line(client, call, 0, &op, None), false),
        Err(e) => panic!("client {client}: {op:?}: {e}"),
    }
}

/// Starts `swarm serve` beside node 0 of the store in `dir`, as
/// `system`'s server.
fn start_store_server(dir: &Path, system: System) -> Child {
    let (child, first) = start_server(dir.join("store").to_str().unwrap(), "0");
    assert!(first.contains(&format!("as {system}'s server")), "{first}");
    child
}

#[test]
fn a_killed_server_process_is_replaced_mid_run() {
    if let Some((role, dir)) = procs::role() {
        if let Some(id) = role.strip_prefix("client-") {
            client_child(id.parse().unwrap(), &dir);
        }
        return;
    }
    let with_server: Vec<System> = systems::ALL.iter().copied().filter(|s| s.server().is_some()).collect();
    assert!(!with_server.is_empty(), "no system has a server");
    for system in with_server {
        eprintln!("{system}:");
        let (dir, _) = ShmDir::named(system.name());
        a_killed_server_is_replaced(system, &dir.0);
    }
}

/// The run of [`a_killed_server_process_is_replaced_mid_run`] for
/// `system`, in `dir`.
fn a_killed_server_is_replaced(system: System, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let store = dir.join("store");
    let s = store.to_str().unwrap();
    ok(&["memnode", "create", "--dir", s, "--nodes", "3", "--size", "64M"]);
    let init = ok(&["kv", "--dir", s, "init", "--system", system.name(), "--keys", "1000", "--max-value", "64"]);
    assert!(init.contains(system.name()), "{init}");
    let clock_nodes = ShmCluster::create(dir.join("clock"), 1, 4096).unwrap();
    let clock = clock_nodes.memory();
    let mut server = start_store_server(dir, system);

    // The load phase: every key inserted.
    let (store_nodes, _) = open(dir);
    let loader = CLIENTS + 1;
    let (mut s, _) = connect(store_nodes.memory(), loader);
    let mut lines = String::new();
    for k in 0..KEYS {
        let (l, done) = run(&mut s, &clock, loader as u32, KvOp::Insert(k, (loader as u64) << 32 | k));
        assert!(done);
        lines += &l;
    }
    block_on(s.close()).unwrap();

    let mut children = Children::spawn(TEST, dir, (1..=CLIENTS).map(|c| format!("client-{c}")), DEADLINE);
    // Once every client is half-way, the server is killed among their
    // calls, and a standby process takes over a little later.
    let start = Instant::now();
    while (1..=CLIENTS).any(|c| !dir.join(format!("half-{c}")).exists()) {
        assert!(start.elapsed() < DEADLINE, "the clients never got half-way");
        children.check_alive();
        std::thread::sleep(Duration::from_millis(2));
    }
    server.kill().unwrap(); // SIGKILL
    let killed = server.wait().unwrap();
    assert!(!killed.success(), "the server was killed: {killed:?}");
    std::thread::sleep(Duration::from_millis(50));
    let standby = start_store_server(dir, system);
    std::fs::File::create(dir.join("replaced")).unwrap();
    children.wait_success();

    // Everything the clients did, then a fresh client reads every key.
    let mut pending = 0;
    for c in 1..=CLIENTS {
        let h = std::fs::read_to_string(dir.join(format!("history-{c}"))).unwrap();
        pending += h.lines().filter(|l| l.contains(" pending ")).count();
        lines += &h;
    }
    let reader = CLIENTS + 2;
    let (mut s, _) = connect(store_nodes.memory(), reader);
    for k in 0..KEYS {
        let (l, done) = run(&mut s, &clock, reader as u32, KvOp::Get(k));
        assert!(done, "the final read of key {k} failed");
        lines += &l;
    }
    block_on(s.close()).unwrap();
    let ops: Vec<_> = lines.lines().map(parse).collect();
    eprintln!("{} operations, {pending} pending (their calls met the killed server)", ops.len());
    let mut h = History::new();
    for op in ops {
        h.push(op);
    }
    let verdict = lincheck::check(&lincheck::Kv::lazy_unmap(), h.operations());
    assert!(verdict.is_linearizable(), "{verdict}");

    // The standby served the clients, and stops cleanly on SIGTERM.
    signal(&standby, "TERM");
    let out = standby.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    let served: u64 = said
        .split_once("s: ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the standby's last words: {said}"));
    eprintln!("the standby served {served} requests");
    assert!(served > 0, "no client reached the standby");
}

/// Runs a mix of gets, updates, inserts and deletes on the shared keys,
/// and inserts of new keys: at least [`OPS`], and on until the server was
/// replaced; says when it is half-way; writes its history to
/// `history-{id}`.
fn client_child(id: u8, dir: &Path) {
    let (store, clock_nodes) = open(dir);
    let clock = clock_nodes.memory();
    let (mut s, _) = connect(store.memory(), id);
    let mut rng = Rng::new(id as u64);
    let mut lines = String::new();
    let mut me = id as u32;
    let start = Instant::now();
    for seq in 1.. {
        if seq > OPS && dir.join("replaced").exists() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "client {id}: the server was never replaced");
        let k = rng.below(KEYS);
        let v = (id as u64) << 32 | seq;
        let op = match rng.below(10) {
            0..=4 => KvOp::Get(k),
            5..=6 => KvOp::Update(k, v),
            7 => KvOp::Insert(k, v),
            // A key of its own, new until its keys wrap around: a store
            // whose server holds only metadata (Clover's) calls it for
            // a new key.
            8 => KvOp::Insert(KEYS + (id as u64 - 1) * NEW_KEYS + seq % NEW_KEYS, v),
            _ => KvOp::Delete(k),
        };
        let (l, done) = run(&mut s, &clock, me, op);
        lines += &l;
        if !done {
            // Its outcome is unknown: the client goes on as a new one.
            me += 100;
        }
        if seq == OPS / 2 {
            std::fs::File::create(dir.join(format!("half-{id}"))).unwrap();
        }
    }
    block_on(s.close()).unwrap();
    std::fs::File::create(dir.join(format!("history-{id}"))).unwrap().write_all(lines.as_bytes()).unwrap();
}
