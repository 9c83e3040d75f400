//! Helpers of the integration tests: running the built `swarm` binary, and
//! cluster directories in /dev/shm that are removed when the test ends.

#![allow(dead_code)] // each test file uses a different part

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs `swarm` with `args`.
pub fn swarm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_swarm")).args(args).output().expect("cannot run the swarm binary")
}

/// Runs `swarm`, expects success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let out = swarm(args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "swarm {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// Runs `swarm`, expects exit status `code` and one `error: ...` line on
/// stderr (and no panic); returns that line.
pub fn fails(args: &[&str], code: i32) -> String {
    let out = swarm(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "swarm {args:?}: unexpected status; stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "swarm {args:?} panicked:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "swarm {args:?}: expected one line on stderr, got:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "swarm {args:?}: {stderr}");
    lines[0].to_string()
}

/// Starts `swarm serve` beside `node` of the cluster in `dir` and waits
/// until it says it serves: the process and that first line.
pub fn start_server(dir: &str, node: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["serve", "--dir", dir, "--node", node])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start swarm serve");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with(&format!("serving node {node} of ")), "{first}");
    (child, first)
}

/// Sends signal `sig` (a name: TERM, STOP, ...) to `child`.
pub fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args(["-s", sig, &child.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill -s {sig} failed");
}

/// A fresh name for a cluster of this test process.
pub fn unique(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("clitest-{}-{tag}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A path under /dev/shm that is deleted (with everything in it) on drop,
/// whatever the test did with it.
pub struct ShmDir(pub PathBuf);

impl ShmDir {
    /// `/dev/shm/swarm-NAME` for a fresh NAME; returns the guard and NAME.
    pub fn named(tag: &str) -> (ShmDir, String) {
        let name = unique(tag);
        (ShmDir(Path::new("/dev/shm").join(format!("swarm-{name}"))), name)
    }

    /// The path, as an argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("test paths are UTF-8")
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
