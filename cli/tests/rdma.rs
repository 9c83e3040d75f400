//! `swarm memnode --backend rdma` and `swarm bench --backend rdma`: every
//! mistake in flags and cluster files is one line of error, and a command
//! that would need hardware says what is missing: the `rdma` feature (and
//! how to build with it), or, with it, an RDMA device.
//!
//! The runs themselves (clients on real queue pairs) are in
//! backend-rdma's hardware tests; the bench's logic on memory nodes is
//! tested over the software NIC in `cli/src/rdma.rs`.

mod common;

use std::path::PathBuf;

use common::{fails, unique};

/// A cluster file in the temporary directory, removed on drop.
struct ClusterFile(PathBuf);

impl ClusterFile {
    fn new(text: &str) -> ClusterFile {
        let path = std::env::temp_dir().join(format!("{}.toml", unique("cluster")));
        std::fs::write(&path, text).unwrap();
        ClusterFile(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ClusterFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn nodes(n: usize, size: &str) -> String {
    (0..n).map(|i| format!("[[node]]\naddress = \"127.0.0.1:{}\"\nsize = \"{size}\"\n", 7471 + i)).collect()
}

/// Whether this machine has an RDMA device (then the commands below would
/// really run, and the no-device checks are skipped).
fn has_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// What a command that needs hardware must say on this build and machine.
fn missing_hardware() -> Option<&'static str> {
    if !cfg!(feature = "rdma") {
        Some("rebuild with `cargo build --release -p swarm-cli --features rdma`")
    } else if !has_device() {
        Some("no RDMA device found")
    } else {
        None
    }
}

#[test]
fn bench_flags_and_cluster_files_are_checked() {
    let small = ClusterFile::new(&nodes(3, "64K"));
    let two = ClusterFile::new(&nodes(2, "1G"));
    let bad = ClusterFile::new("[[node]]\naddress = \"127.0.0.1:1\"\nsize = 4096\n");
    let unknown = ClusterFile::new(&(nodes(3, "1G") + "[client]\nbufer = \"4M\"\n"));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--backend", "rdma"], "--backend rdma needs --cluster FILE"),
        (vec!["--cluster", small.arg()], "--cluster applies to --backend rdma only"),
        (vec!["--backend", "rdma", "--cluster", "/nonexistent/c.toml"], "cannot read /nonexistent/c.toml"),
        (vec!["--backend", "rdma", "--cluster", two.arg()], "lists 2 memory node(s), and --replicas 3 needs 3"),
        (vec!["--backend", "rdma", "--cluster", bad.arg()], "line 3, column 8"),
        (vec!["--backend", "rdma", "--cluster", unknown.arg()], "bufer"),
        (vec!["--backend", "rdma", "--cluster", small.arg(), "--inject-rtt-us", "1"], "--inject-rtt-us applies"),
        (vec!["--backend", "rdma", "--cluster", small.arg(), "--keys", "1000"], "has 64 KiB, and this run needs"),
    ];
    let json = std::env::temp_dir().join(format!("{}.json", unique("report")));
    for (args, want) in cases {
        let args: Vec<&str> =
            ["bench", "--no-plots", "--json", json.to_str().unwrap()].into_iter().chain(args).collect();
        let line = fails(&args, 1);
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(!json.exists(), "{args:?}: a failed run leaves no report behind");
    }
}

#[test]
fn bench_without_hardware_says_what_is_missing() {
    let Some(want) = missing_hardware() else { return };
    let file = ClusterFile::new(&nodes(3, "1G"));
    let line = fails(&["bench", "--no-plots", "--backend", "rdma", "--cluster", file.arg(), "--keys", "1000"], 1);
    assert!(line.contains(want), "{line}");
}

#[test]
fn memnode_flags_are_checked() {
    let usage: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--backend", "shm"], "shm clusters are made with a subcommand"),
        (vec!["--backend", "ib"], "'ib' is not a backend"),
        (vec!["--backend", "rdma", "--size", "1000"], "multiple of 4 KiB"),
        (vec!["--backend", "rdma", "--port", "0"], "the device port must be between 1 and 255"),
        (vec!["--backend", "rdma", "--listen", "127.0.0.1:0", "--size", "1M", "list"], "cannot be used with"),
    ];
    for (args, want) in usage {
        let args: Vec<&str> = ["memnode"].into_iter().chain(args).collect();
        let line = fails(&args, 2);
        assert!(line.contains(want), "{args:?}: {line}");
    }
    let failed: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "swarm memnode needs a subcommand (create, list, remove)"),
        (vec!["--listen", "127.0.0.1:0"], "swarm memnode needs a subcommand"),
        (vec!["--backend", "rdma", "--size", "1M"], "--backend rdma needs --listen ADDR"),
        (vec!["--backend", "rdma", "--listen", "127.0.0.1:0"], "--backend rdma needs --size SIZE"),
        (vec!["--backend", "rdma", "--listen", "1.2.3.4:x", "--size", "1M"], "is not an address to listen on"),
    ];
    for (args, want) in failed {
        let args: Vec<&str> = ["memnode"].into_iter().chain(args).collect();
        let line = fails(&args, 1);
        assert!(line.contains(want), "{args:?}: {line}");
    }
}

#[test]
fn memnode_without_hardware_says_what_is_missing() {
    let Some(want) = missing_hardware() else { return };
    let line = fails(&["memnode", "--backend", "rdma", "--listen", "127.0.0.1:0", "--size", "1M"], 1);
    assert!(line.contains(want), "{line}");
}
