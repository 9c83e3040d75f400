//! The register suite shared by every backend (`swarm_testkit`) over
//! this one: Safe-Guess clients on real threads, their history checked for
//! linearizability, on clusters mapped from files in `/dev/shm` (tmpfs) and
//! `/tmp` (a disk file system), in each flush mode.

use std::path::PathBuf;

use swarm_backend_cxl::{CxlCluster, CxlConfig, FlushMode, Flusher};
use swarm_core::NodeId;
use swarm_testkit::{RegisterTest, register_suite};

const NODES: [NodeId; 3] = [NodeId(0), NodeId(1), NodeId(2)];

/// Runs the suite on a fresh cluster of `files` files under `root`.
fn run(root: &str, name: &str, files: usize, mode: FlushMode, t: &RegisterTest) {
    let dir = PathBuf::from(format!("{root}/swarm-cxl-registers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<PathBuf> = (0..files).map(|i| dir.join(format!("pool-{i}"))).collect();
    let result = (|| {
        let cluster =
            CxlCluster::create(&paths, NODES.len(), t.node_size, &CxlConfig::default()).map_err(|e| e.to_string())?;
        let flusher = Flusher::new(mode).map_err(|e| e.to_string())?;
        let report = register_suite(|| cluster.memory_with(flusher.clone()), &NODES, t)?;
        Ok::<_, String>(report)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(report) => println!("cxl {root}, {files} file(s), {}: {report}", mode.name()),
        Err(e) => panic!("cxl {root}, {files} file(s), {}: {e}", mode.name()),
    }
}

#[test]
fn registers_are_linearizable_on_tmpfs_in_every_mode() {
    for (i, mode) in [FlushMode::Persist, FlushMode::None, FlushMode::NonCoherent].into_iter().enumerate() {
        if mode == FlushMode::NonCoherent && !cfg!(target_arch = "x86_64") {
            continue;
        }
        let t = RegisterTest { seed: 11 + i as u64, ..RegisterTest::default() };
        run("/dev/shm", mode.name(), 1, mode, &t);
    }
}

#[test]
fn registers_are_linearizable_on_disk_files() {
    let t = RegisterTest { clients: 5, seed: 21, ..RegisterTest::default() };
    run("/tmp", "disk", 3, FlushMode::Persist, &t);
}
