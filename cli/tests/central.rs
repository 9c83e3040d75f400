//! pDPM-Central's coordinator (pDPM §4.2) as an OS process of its own
//! (`swarm serve --node 0`), serving client processes on one shm cluster,
//! killed with SIGKILL in the middle of their operations and replaced by a
//! standby process (a new incarnation of the server, which recovers the
//! committed state from node 0's memory).
//!
//! The clients re-execute this test binary (role in `SWARM_CENTRAL_ROLE`)
//! and time their operations with a logical clock, a counter in a second,
//! tiny cluster that every process increments around each operation. A
//! call that fails while the coordinator is down may or may not have taken
//! effect: it stays pending in the history, and its client goes on under a
//! new name. The history of every process, with the parent's final reads,
//! must be linearizable (the store's declared guarantee).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ShmDir, ok};
use swarm_backend_shm::{ShmCluster, ShmMemory};
use swarm_core::kv::AnyClient;
use swarm_core::kv::{Got, KvClient, KvError, StoreConfig, Who};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::lease::Want;
use swarm_core::systems;
use swarm_core::{Memory, NodeId, RemoteAddr};
use swarm_lincheck::{self as lincheck, History, KvOp, KvRet, Operation, Response};

const ROLE_ENV: &str = "SWARM_CENTRAL_ROLE";
const DIR_ENV: &str = "SWARM_CENTRAL_DIR";
const TEST: &str = "a_killed_coordinator_process_is_replaced_mid_run";
const KEYS: u64 = 8;
const CLIENTS: u8 = 3;
/// Operations each client runs at least, half before the kill.
const OPS: u64 = 300;
const DEADLINE: Duration = Duration::from_secs(300);

fn key(k: u64) -> Vec<u8> {
    format!("user{k:04}").into_bytes()
}

/// Value `id` (client << 32 | seq) as bytes, and back.
fn value(id: u64) -> Vec<u8> {
    let mut v = vec![(id % 251) as u8; 24];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

fn id_of(v: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    (value(id) == v).then_some(id)
}

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

/// The next tick of the shared logical clock.
fn tick(clock: &ShmMemory) -> u64 {
    let at = RemoteAddr::new(NodeId(0), 0);
    let mut cur = 0;
    loop {
        let prev = block_on(clock.cas(at, cur, cur + 1)).unwrap();
        if prev == cur {
            return cur + 1;
        }
        cur = prev;
    }
}

/// One operation as a line: `client call ret op key value answer value`,
/// `ret` 0 and answer `pending` for one whose outcome is unknown.
fn line(client: u32, call: u64, ret: u64, op: &KvOp, answer: Option<KvRet>) -> String {
    let (name, k, v) = match *op {
        KvOp::Get(k) => ("get", k, 0),
        KvOp::Update(k, v) => ("update", k, v),
        KvOp::Insert(k, v) => ("insert", k, v),
        KvOp::Delete(k) => ("delete", k, 0),
    };
    let (a, av) = match answer {
        None => ("pending", 0),
        Some(KvRet::Ok) => ("ok", 0),
        Some(KvRet::Found(v)) => ("found", v),
        Some(KvRet::NotFound) => ("notfound", 0),
        Some(KvRet::Deleted) => ("deleted", 0),
    };
    format!("{client} {call} {ret} {name} {k} {v} {a} {av}\n")
}

fn parse(l: &str) -> Operation<KvOp, KvRet> {
    let f: Vec<&str> = l.split_whitespace().collect();
    let n = |i: usize| f[i].parse::<u64>().unwrap();
    let op = match f[3] {
        "get" => KvOp::Get(n(4)),
        "update" => KvOp::Update(n(4), n(5)),
        "insert" => KvOp::Insert(n(4), n(5)),
        _ => KvOp::Delete(n(4)),
    };
    let ret = match f[6] {
        "pending" => return Operation::pending(n(0) as u32, n(1), op),
        "ok" => KvRet::Ok,
        "found" => KvRet::Found(n(7)),
        "notfound" => KvRet::NotFound,
        _ => KvRet::Deleted,
    };
    Operation { client: n(0) as u32, call: n(1), input: op, response: Some(Response { at: n(2), output: ret }) }
}

/// Runs `op` on `s` as history client `client`, timed by `clock`: its
/// line, and whether it completed. Only a failure to reach the
/// coordinator (node 0's server) leaves it pending; any other error fails
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
        Ok(a) => (line(client, call, tick(clock), &op, Some(a)), true),
        Err(KvError::Down(e)) if e.node == NodeId(0) => (line(client, call, 0, &op, None), false),
        Err(e) => panic!("client {client}: {op:?}: {e}"),
    }
}

/// Starts `swarm serve` beside node 0 of the store in `dir` and waits until
/// it serves (as pDPM-Central's coordinator).
fn start_coordinator(dir: &Path) -> Child {
    let store = dir.join("store");
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["serve", "--dir", store.to_str().unwrap(), "--node", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start swarm serve");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("as pdpm-central's server"), "{first}");
    child
}

#[test]
fn a_killed_coordinator_process_is_replaced_mid_run() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        if let Some(id) = role.strip_prefix("client-") {
            client_child(id.parse().unwrap(), Path::new(&std::env::var(DIR_ENV).unwrap()));
        }
        return;
    }
    let (dir, _) = ShmDir::named("central");
    std::fs::create_dir_all(&dir.0).unwrap();
    let store = dir.0.join("store");
    let s = store.to_str().unwrap();
    ok(&["memnode", "create", "--dir", s, "--nodes", "3", "--size", "64M"]);
    let init = ok(&["kv", "--dir", s, "init", "--system", "pdpm-central", "--keys", "1000", "--max-value", "64"]);
    assert!(init.contains("pdpm-central"), "{init}");
    let clock_nodes = ShmCluster::create(dir.0.join("clock"), 1, 4096).unwrap();
    let clock = clock_nodes.memory();
    let mut coordinator = start_coordinator(&dir.0);

    // The load phase: every key inserted.
    let (store_nodes, _) = open(&dir.0);
    let loader = CLIENTS + 1;
    let (mut s, _) = connect(store_nodes.memory(), loader);
    let mut lines = String::new();
    for k in 0..KEYS {
        let (l, done) = run(&mut s, &clock, loader as u32, KvOp::Insert(k, (loader as u64) << 32 | k));
        assert!(done);
        lines += &l;
    }
    block_on(s.close()).unwrap();

    let mut children = Children::spawn(&dir.0, (1..=CLIENTS).map(|c| format!("client-{c}")));
    // Once every client is half-way, the coordinator is killed among their
    // calls, and a standby process takes over a little later.
    let start = Instant::now();
    while (1..=CLIENTS).any(|c| !dir.0.join(format!("half-{c}")).exists()) {
        assert!(start.elapsed() < DEADLINE, "the clients never got half-way");
        children.check_alive();
        std::thread::sleep(Duration::from_millis(2));
    }
    coordinator.kill().unwrap(); // SIGKILL
    let killed = coordinator.wait().unwrap();
    assert!(!killed.success(), "the coordinator was killed: {killed:?}");
    std::thread::sleep(Duration::from_millis(50));
    let mut standby = start_coordinator(&dir.0);
    std::fs::File::create(dir.0.join("replaced")).unwrap();
    children.wait_success();

    // Everything the clients did, then a fresh client reads every key.
    let mut pending = 0;
    for c in 1..=CLIENTS {
        let h = std::fs::read_to_string(dir.0.join(format!("history-{c}"))).unwrap();
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
    eprintln!("{} operations, {pending} pending (their calls met the killed coordinator)", ops.len());
    assert!(pending > 0, "no call met the killed coordinator");
    let mut h = History::new();
    for op in ops {
        h.push(op);
    }
    let verdict = lincheck::check(&lincheck::Kv::lazy_unmap(), h.operations());
    assert!(verdict.is_linearizable(), "{verdict}");

    // The standby stops cleanly on SIGTERM.
    let status = Command::new("kill").args(["-s", "TERM", &standby.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(standby.wait().unwrap().success());
}

/// Runs a mix of gets, updates, inserts and deletes on the shared keys:
/// at least [`OPS`], and on until the coordinator was replaced; says when
/// it is half-way; writes its history to `history-{id}`.
fn client_child(id: u8, dir: &Path) {
    let (store, clock_nodes) = open(dir);
    let clock = clock_nodes.memory();
    let (mut s, _) = connect(store.memory(), id);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ id as u64);
    let mut lines = String::new();
    let mut me = id as u32;
    let start = Instant::now();
    for seq in 1.. {
        if seq > OPS && dir.join("replaced").exists() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "client {id}: the coordinator was never replaced");
        let k = rng.below(KEYS);
        let v = (id as u64) << 32 | seq;
        let op = match rng.below(10) {
            0..=4 => KvOp::Get(k),
            5..=7 => KvOp::Update(k, v),
            8 => KvOp::Insert(k, v),
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

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n
    }
}

/// Client processes, killed if still running when dropped.
struct Children(Vec<(String, Child)>);

impl Children {
    fn spawn(dir: &Path, roles: impl IntoIterator<Item = String>) -> Children {
        let exe = std::env::current_exe().unwrap();
        let spawn = |role: String| {
            let child = Command::new(&exe)
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_ENV, &role)
                .env(DIR_ENV, dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn a client");
            (role, child)
        };
        Children(roles.into_iter().map(spawn).collect())
    }

    fn check_alive(&mut self) {
        for (role, c) in &mut self.0 {
            if let Some(s) = c.try_wait().unwrap() {
                assert!(s.success(), "{role} failed: {s}");
            }
        }
    }

    fn wait_success(&mut self) {
        let start = Instant::now();
        for (role, c) in &mut self.0 {
            let status = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break s;
                }
                assert!(start.elapsed() < DEADLINE, "{role} hangs");
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(status.success(), "{role} failed: {status}");
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
