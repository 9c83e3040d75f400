//! Key-value tests whose clients are OS processes: the test binary runs one
//! of its own tests again as each client, the role and a shared directory
//! in its environment; the clients time their operations with a logical
//! clock (a counter word that every process increments around each
//! operation, so that "returned before invoked" is exact across
//! processes) and write their histories as lines the parent reads back.
//!
//! Used by the shm backend's multi-process tests and the command line's
//! server-process tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use swarm_core::substrate::exec::block_on;
use swarm_core::{Memory, NodeId, RemoteAddr};
use swarm_lincheck::{KvOp, KvRet, Operation, Response};

/// The environment variable that holds a child's role.
const ROLE_ENV: &str = "SWARM_TEST_ROLE";
/// The environment variable that holds the directory the processes share.
const DIR_ENV: &str = "SWARM_TEST_DIR";

/// The role and shared directory of this process, if it was started by
/// [`Children::spawn`] (and `None` in the parent).
pub fn role() -> Option<(String, PathBuf)> {
    let role = std::env::var(ROLE_ENV).ok()?;
    let dir = std::env::var(DIR_ENV).expect("a child without its directory");
    Some((role, PathBuf::from(dir)))
}

/// Child processes, each running `test` of this binary in its role; the
/// ones still running when dropped are killed.
pub struct Children {
    procs: Vec<(String, Child)>,
    deadline: Duration,
}

impl Children {
    /// Starts one child per role, sharing `dir`; [`Children::wait_success`]
    /// fails the test if one takes longer than `deadline`. Their standard
    /// output (their own test summaries) is dropped; their findings and
    /// panics go to the inherited standard error.
    pub fn spawn(test: &str, dir: &Path, roles: impl IntoIterator<Item = String>, deadline: Duration) -> Children {
        let exe = std::env::current_exe().expect("the test binary");
        let spawn = |role: String| {
            let child = Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_ENV, &role)
                .env(DIR_ENV, dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn a child");
            (role, child)
        };
        Children { procs: roles.into_iter().map(spawn).collect(), deadline }
    }

    /// Fails the test if a child has already failed.
    pub fn check_alive(&mut self) {
        for (role, c) in &mut self.procs {
            if let Some(s) = c.try_wait().expect("wait for a child") {
                assert!(s.success(), "child {role} failed: {s}");
            }
        }
    }

    /// Waits for every child and fails the test if one fails or hangs.
    pub fn wait_success(&mut self) {
        let start = Instant::now();
        for (role, c) in &mut self.procs {
            let status = loop {
                if let Some(s) = c.try_wait().expect("wait for a child") {
                    break s;
                }
                assert!(start.elapsed() < self.deadline, "child {role} hangs");
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(status.success(), "child {role} failed: {status}");
        }
    }

    /// Kills every child with SIGKILL.
    pub fn kill_all(&mut self) {
        for (_, c) in &mut self.procs {
            c.kill().expect("kill a child");
            c.wait().expect("wait for a killed child");
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Key `k` of the tests' key space.
pub fn key(k: u64) -> Vec<u8> {
    format!("user{k:04}").into_bytes()
}

/// The bytes of value `id` (by convention `client << 32 | seq`): the id,
/// then filler derived from it, so that a torn or foreign value shows.
pub fn value(id: u64) -> Vec<u8> {
    let mut v = vec![(id % 251) as u8; 24];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

/// The id of the value `v`, if it is exactly the bytes of one.
pub fn id_of(v: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    (value(id) == v).then_some(id)
}

/// The next tick of the logical clock in word 0 of node 0 of `clock` (a
/// tiny cluster of its own, shared by every process of the test).
pub fn tick<M: Memory>(clock: &M) -> u64 {
    let at = RemoteAddr::new(NodeId(0), 0);
    let mut cur = 0;
    loop {
        let prev = block_on(clock.cas(at, cur, cur + 1)).expect("the logical clock's CAS");
        if prev == cur {
            return cur + 1;
        }
        cur = prev;
    }
}

/// One operation as a history line, `client call ret op key value answer
/// value`: `ret` 0 and answer `pending` for one whose outcome is unknown
/// (`answer` none).
pub fn line(client: u32, call: u64, ret: u64, op: &KvOp, answer: Option<&KvRet>) -> String {
    let (name, k, v) = match *op {
        KvOp::Get(k) => ("get", k, 0),
        KvOp::Update(k, v) => ("update", k, v),
        KvOp::Insert(k, v) => ("insert", k, v),
        KvOp::Delete(k) => ("delete", k, 0),
    };
    let (a, av) = match answer {
        None => ("pending", 0),
        Some(KvRet::Ok) => ("ok", 0),
        Some(KvRet::Found(v)) => ("found", *v),
        Some(KvRet::NotFound) => ("notfound", 0),
        Some(KvRet::Deleted) => ("deleted", 0),
    };
    format!("{client} {call} {ret} {name} {k} {v} {a} {av}\n")
}

/// The operation of a line written by [`line()`].
pub fn parse(l: &str) -> Operation<KvOp, KvRet> {
    let f: Vec<&str> = l.split_whitespace().collect();
    let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|_| panic!("a bad history line: {l}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_as_the_operations_written() {
        let ops = [
            (KvOp::Get(3), Some(KvRet::Found(7 << 32 | 9))),
            (KvOp::Update(1, 5), Some(KvRet::NotFound)),
            (KvOp::Insert(2, 6), Some(KvRet::Ok)),
            (KvOp::Delete(4), Some(KvRet::Deleted)),
            (KvOp::Update(1, 8), None),
        ];
        for (i, (op, answer)) in ops.into_iter().enumerate() {
            let got = parse(&line(2, 10 + i as u64, 20 + i as u64, &op, answer.as_ref()));
            assert_eq!((got.client, got.call, got.input), (2, 10 + i as u64, op));
            assert_eq!(got.response.map(|r| (r.at, r.output)), answer.map(|a| (20 + i as u64, a)));
        }
    }

    #[test]
    fn a_value_is_known_by_its_bytes_only() {
        let v = value(3 << 32 | 17);
        assert_eq!(id_of(&v), Some(3 << 32 | 17));
        let mut torn = v.clone();
        torn[20] ^= 1;
        assert_eq!(id_of(&torn), None);
        assert_eq!(id_of(&v[..7]), None);
    }
}
