//! Crash durability: a client process killed with SIGKILL at a random moment
//! loses no acknowledged write, and leaves every metadata word consistent.
//!
//! SWARM-KV does not exist yet (issue #4), so the "keys" are Safe-Guess
//! registers, one per key, replicated on 3 nodes that partition one file.
//! Each round, the test re-executes its own binary as a child process
//! (selected by `SWARM_CXL_CRASH_CHILD`) that opens the file through this
//! backend (flush mode `persist`) as a fresh client and writes and reads
//! random keys without end, reporting on its stdout pipe each write it
//! attempts (`A key value`, before issuing it) and each write acknowledged
//! (`K key value`, after it returned). The parent kills it with SIGKILL at a
//! random moment (after a random number of acknowledgements, plus a random
//! few microseconds; in some rounds at a random time after start, which may
//! fall into its setup), maps the same file again, and checks:
//!
//! - every key reads (a Safe-Guess read, by the parent's own client) the last
//!   acknowledged value, or a value attempted after it and not acknowledged
//!   (a write cut by the kill may or may not have taken effect), never an
//!   older or unknown one; a value read becomes the new floor for the key;
//! - every metadata word of every replica is bottom or decodes to a client
//!   that ran, names a log entry that exists on that node, and that entry
//!   holds, intact, a value that this client attempted for this key (the
//!   ordered write-then-CAS put the data before the word);
//! - every node's region header and log directory still decode.
//!
//! The rounds share the file, so damage would accumulate. Files on tmpfs
//! (`/dev/shm`, 50 rounds) and on a disk file system (`/tmp`, 25 rounds).
//!
//! What this shows, and what not: a killed *process* loses nothing its
//! stores reached (they are in the page cache or on the device), so this is
//! the protocol's and the backend's crash consistency under client crashes,
//! with the flush layer on the write path. A power failure, which the flushes
//! and `msync` are for, cannot be cut here.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use swarm_backend_cxl::{CxlCluster, CxlConfig, CxlMemory};
use swarm_core::sim::Rng;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::word_at;
use swarm_core::substrate::space::region::Region;
use swarm_core::swarm::client::ClientCtx;
use swarm_core::swarm::inout::{Layout, Replica};
use swarm_core::swarm::maxreg::{RegCache, Register};
use swarm_core::swarm::meta::{MAX_CLIENT, Meta};
use swarm_core::swarm::safeguess;
use swarm_core::swarm::writerlog::Logs;
use swarm_core::{Memory, NodeId};
use swarm_testkit::{RegisterTest, format_nodes, id_of_value, value_of};

const ROLE_ENV: &str = "SWARM_CXL_CRASH_CHILD";
const PATH_ENV: &str = "SWARM_CXL_CRASH_PATH";
const REGS_ENV: &str = "SWARM_CXL_CRASH_REGS";
const EPOCH_ENV: &str = "SWARM_CXL_CRASH_EPOCH";

const NODES: usize = 3;
const NODE_SIZE: u64 = 32 << 20;
const CHUNK: u64 = 64 << 10;
const KEYS: usize = 8;
const VALUE: usize = 64;
const META_WORDS: u32 = 4;
/// Writes one child may attempt (log capacity).
const MAX_WRITES: u64 = 4000;
/// The parent's reader id (the setup client has `MAX_CLIENT`).
const READER: u8 = MAX_CLIENT - 1;
/// How long a round may take before it is declared hung.
const ROUND_DEADLINE: Duration = Duration::from_secs(30);

fn layout() -> Layout {
    Layout::new(META_WORDS, VALUE as u64).unwrap()
}

/// The value of write `seq` of `client` to `key`, and its id.
fn value(client: u8, key: usize, seq: u64) -> (Vec<u8>, u64) {
    let s = ((key as u64) << 24) | seq;
    (value_of(client, s, VALUE), ((client as u64) << 32) | s)
}

fn key_of(id: u64) -> usize {
    ((id >> 24) & 0xFF) as usize
}

fn client_of(id: u64) -> u8 {
    (id >> 32) as u8
}

#[test]
fn killed_writers_lose_no_acknowledged_write_on_tmpfs() {
    if child_role() {
        return;
    }
    crash_rounds("/dev/shm", "tmpfs", 50, 1);
}

#[test]
fn killed_writers_lose_no_acknowledged_write_on_a_disk_file() {
    if child_role() {
        return;
    }
    crash_rounds("/tmp", "disk", 25, 2);
}

/// Runs the child's part instead of the test if this process is a child.
fn child_role() -> bool {
    let Ok(id) = std::env::var(ROLE_ENV) else { return false };
    child(id.parse().expect("bad child id"));
    true
}

/// Removes the test's directory, also when it fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills the child if the test fails while it runs.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the parent knows of one key.
#[derive(Default, Clone)]
struct KeyState {
    /// The value every read must at least return (0: none yet).
    floor: u64,
    /// Values attempted after the floor, not acknowledged, in order.
    pending: Vec<u64>,
}

fn crash_rounds(root: &str, name: &str, rounds: u8, seed: u64) {
    let dir = PathBuf::from(format!("{root}/swarm-cxl-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Cleanup(dir.clone());
    let path = dir.join("pool");
    let config = CxlConfig::default();
    let epoch = SystemClock::starting_now();
    let regs = {
        let cluster = CxlCluster::create(&[&path], NODES, NODE_SIZE, &config).unwrap();
        let mem = cluster.memory();
        let nodes: Vec<NodeId> = (0..NODES).map(|n| NodeId(n as u16)).collect();
        let t = RegisterTest {
            node_size: NODE_SIZE,
            chunk: CHUNK,
            value_len: VALUE,
            ops_per_client: MAX_WRITES,
            ..RegisterTest::default()
        };
        format_nodes(&mem, &nodes, &t).unwrap();
        let mut setup = Box::new(ClientCtx::new(MAX_CLIENT, epoch).unwrap());
        (0..KEYS).map(|_| block_on(Register::create(&mut setup, &mem, &nodes, layout())).unwrap()).collect::<Vec<_>>()
    };
    let regs_arg = regs
        .iter()
        .map(|r| r.replicas.iter().map(|rep| rep.base.to_string()).collect::<Vec<_>>().join(","))
        .collect::<Vec<_>>()
        .join(";");

    let exe = std::env::current_exe().unwrap();
    let test_name = if name == "tmpfs" {
        "killed_writers_lose_no_acknowledged_write_on_tmpfs"
    } else {
        "killed_writers_lose_no_acknowledged_write_on_a_disk_file"
    };
    let mut rng = Rng::new(seed);
    let mut keys = vec![KeyState::default(); KEYS];
    // Every value any child attempted: (client, key) of each id.
    let mut attempted: HashMap<u64, ()> = HashMap::new();
    let mut reader = Box::new(ClientCtx::new(READER, epoch).unwrap());
    let mut caches = vec![RegCache::default(); KEYS];
    let (mut acks, mut cut, mut took_effect, mut timed) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    for round in 0..rounds {
        let id = round + 1;
        let mut child = KillOnDrop(
            Command::new(&exe)
                .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_ENV, id.to_string())
                .env(PATH_ENV, &path)
                .env(REGS_ENV, &regs_arg)
                .env(EPOCH_ENV, epoch.epoch_us.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let (tx, rx) = mpsc::channel();
        let out = child.0.stdout.take().unwrap();
        let pipe = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // When to kill: after a random number of acknowledged writes, or
        // (one round in five) at a random time after the start.
        let by_time = rng.chance(1, 5);
        let target_acks = rng.range(0, 300);
        let kill_at = Instant::now() + Duration::from_micros(rng.range(1_000, 60_000));
        let deadline = Instant::now() + ROUND_DEADLINE;
        let mut round_acks = 0;
        let mut handle = |line: &str, keys: &mut Vec<KeyState>, round_acks: &mut u64| {
            // Only the child's reports; libtest writes its own lines too.
            let mut parts = line.split(' ');
            let (Some(kind @ ("A" | "K")), Some(k), Some(v), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return;
            };
            let (Ok(k), Ok(v)) = (k.parse::<usize>(), v.parse::<u64>()) else { return };
            assert_eq!(key_of(v), k);
            match kind {
                "A" => {
                    attempted.insert(v, ());
                    keys[k].pending.push(v);
                }
                "K" => {
                    assert_eq!(keys[k].pending.last(), Some(&v), "an acknowledgement follows its attempt");
                    keys[k] = KeyState { floor: v, pending: Vec::new() };
                    *round_acks += 1;
                }
                _ => {}
            }
        };
        loop {
            if by_time && Instant::now() >= kill_at {
                timed += 1;
                break;
            }
            if !by_time && round_acks >= target_acks {
                // Let it run on into its next operation for a moment.
                let until = Instant::now() + Duration::from_micros(rng.range(0, 200));
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                break;
            }
            assert!(Instant::now() < deadline, "round {round}: the child hangs");
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(line) => handle(&line, &mut keys, &mut round_acks),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.0.wait().unwrap();
                    panic!("round {round}: the child ended by itself ({status}) before it was killed");
                }
            }
        }
        child.0.kill().unwrap();
        let status = child.0.wait().unwrap();
        pipe.join().unwrap();
        // Everything the child reported before it died.
        while let Ok(line) = rx.try_recv() {
            handle(&line, &mut keys, &mut round_acks);
        }
        use std::os::unix::process::ExitStatusExt;
        assert!(status.signal() == Some(9) || status.success(), "round {round}: child ended with {status}");
        acks += round_acks;
        cut += keys.iter().filter(|k| !k.pending.is_empty()).count() as u64;

        // Map the file again, as after a restart, and check.
        let cluster = CxlCluster::open(&[&path], &config).unwrap();
        let mem = cluster.memory();
        for (k, reg) in regs.iter().enumerate() {
            let (_, v) = block_on(safeguess::read(&mut reader, &mem, reg, &mut caches[k]))
                .unwrap_or_else(|e| panic!("round {round}: key {k}: read failed: {e}"));
            let got = id_of_value(&v).unwrap_or_else(|| panic!("round {round}: key {k}: torn value {:02x?}", &v[..]));
            let st = &mut keys[k];
            if got == st.floor {
                continue;
            }
            let Some(i) = st.pending.iter().position(|&p| p == got) else {
                panic!(
                    "round {round}: key {k} reads {got:#x}, but the last acknowledged write was {:#x} \
                     and the writes attempted since were {:x?}",
                    st.floor, st.pending
                );
            };
            took_effect += 1;
            st.floor = got;
            st.pending.drain(..=i);
        }
        check_metadata(&mem, &regs, id, &attempted, round);
    }
    println!(
        "{name}: {rounds} children killed ({timed} at a random time), {acks} acknowledged writes, \
         {cut} keys with a write cut by a kill ({took_effect} of those took effect), all intact; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Checks every node's header and log directory, and every metadata word of
/// every replica (see the module documentation).
fn check_metadata(mem: &CxlMemory, regs: &[Register], max_client: u8, attempted: &HashMap<u64, ()>, round: u8) {
    let mut logs = Logs::new();
    for n in 0..NODES {
        let node = NodeId(n as u16);
        block_on(Region::open(mem, node)).unwrap_or_else(|e| panic!("round {round}: {node}: region: {e}"));
        block_on(logs.geometry(mem, node)).unwrap_or_else(|e| panic!("round {round}: {node}: log directory: {e}"));
    }
    let layout = layout();
    let now = SystemClock::unix_us();
    for (k, reg) in regs.iter().enumerate() {
        for rep in &reg.replicas {
            let words =
                block_on(mem.read(swarm_core::RemoteAddr::new(rep.node, rep.base), 8 * META_WORDS as usize)).unwrap();
            for w in 0..META_WORDS as usize {
                let m = Meta(word_at(&words, 8 * w).unwrap());
                if m.is_bottom() {
                    continue;
                }
                let ctx = format!("round {round}: key {k}, {} word {w} {m:?}", rep.node);
                assert!((1..=max_client).contains(&m.client()), "{ctx}: names a client that never ran");
                assert!(m.time() > 0 && m.time() < now, "{ctx}: impossible time");
                let (entry, _) = block_on(logs.locate(mem, rep.node, m))
                    .unwrap_or_else(|e| panic!("{ctx}: log entry: {e}"))
                    .unwrap_or_else(|| panic!("{ctx}: names a log entry that does not exist"));
                let (_, v) = block_on(rep_of(rep).read_out_of_place(mem, &layout, entry, VALUE as u64, m))
                    .unwrap_or_else(|e| panic!("{ctx}: out-of-place copy: {e}"));
                let id = id_of_value(&v).unwrap_or_else(|| panic!("{ctx}: its log entry holds a torn value"));
                assert!(
                    attempted.contains_key(&id) && client_of(id) == m.client() && key_of(id) == k,
                    "{ctx}: its log entry holds {id:#x}, not a write of this client to this key"
                );
            }
        }
    }
}

fn rep_of(r: &Replica) -> Replica {
    *r
}

/// The child: a fresh client that writes and reads random keys until it is
/// killed, reporting its writes on stdout.
fn child(id: u8) {
    let path = PathBuf::from(std::env::var(PATH_ENV).unwrap());
    let epoch = SystemClock { epoch_us: std::env::var(EPOCH_ENV).unwrap().parse().unwrap() };
    let regs: Vec<Register> = std::env::var(REGS_ENV)
        .unwrap()
        .split(';')
        .map(|r| Register {
            layout: layout(),
            replicas: r
                .split(',')
                .enumerate()
                .map(|(n, b)| Replica { node: NodeId(n as u16), base: b.parse().unwrap() })
                .collect(),
        })
        .collect();
    run_child(id, &path, epoch, &regs);
}

fn run_child(id: u8, path: &Path, epoch: SystemClock, regs: &[Register]) {
    let cluster = CxlCluster::open(&[path], &CxlConfig::default()).unwrap();
    let mem = cluster.memory();
    let mut ctx = Box::new(ClientCtx::new(id, epoch).unwrap());
    block_on(ctx.prepare(&mem)).unwrap();
    let mut caches = vec![RegCache::default(); regs.len()];
    let mut rng = Rng::new(0x5EED ^ id as u64);
    let mut out = std::io::stdout().lock();
    // libtest has written "test NAME ... " without a newline: end that line.
    writeln!(out).unwrap();
    let started = Instant::now();
    let mut seq = 0;
    while started.elapsed() < ROUND_DEADLINE {
        let k = rng.range(0, KEYS as u64 - 1) as usize;
        // Past its log's capacity, the child only reads, until it is killed
        // (a fast machine gets there before a kill by time).
        if seq >= MAX_WRITES || rng.chance(1, 5) {
            let (_, v) = block_on(safeguess::read(&mut ctx, &mem, &regs[k], &mut caches[k])).unwrap();
            let got = id_of_value(&v).expect("child: torn value");
            assert!(got == 0 || key_of(got) == k, "child: key {k} holds a value of key {}", key_of(got));
            continue;
        }
        seq += 1;
        let (bytes, vid) = value(id, k, seq);
        writeln!(out, "A {k} {vid}").unwrap();
        out.flush().unwrap();
        block_on(safeguess::write(&mut ctx, &mem, &regs[k], &mut caches[k], &bytes)).unwrap();
        writeln!(out, "K {k} {vid}").unwrap();
        out.flush().unwrap();
    }
    // Not killed in time: the parent reports a hang.
}

#[test]
fn values_encode_client_key_and_sequence() {
    let (bytes, id) = value(7, 5, 300);
    assert_eq!(id_of_value(&bytes), Some(id));
    assert_eq!((client_of(id), key_of(id), id & 0xFF_FFFF), (7, 5, 300));
}
