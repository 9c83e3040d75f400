//! `ShmCluster::prefault`: every page of every node becomes resident (so
//! no operation pays a page fault later), and nothing written is lost. In
//! its own test binary: it measures this process's resident memory.
#![cfg(not(loom))]

use std::path::PathBuf;

use swarm_backend_shm::ShmCluster;
use swarm_core::substrate::exec::block_on;
use swarm_core::{Memory, NodeId, RemoteAddr};

const NODE: u64 = 16 << 20;

/// This process's resident memory, in bytes (`VmRSS`, which counts shared
/// file pages too).
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// Writes a word on each node, prefaults, and checks the words survived and
/// the nodes became resident.
fn check(cluster: &ShmCluster) {
    let mem = cluster.memory();
    for n in 0..2 {
        let at = RemoteAddr::new(NodeId(n), NODE / 2 + 8 * n as u64);
        block_on(mem.write(at, &(0xC0FFEE + n as u64).to_le_bytes())).unwrap();
    }
    let before = resident();
    cluster.prefault().unwrap();
    let grown = resident().saturating_sub(before);
    // Two nodes, each untouched but for one page (in-process nodes may be in
    // 2 MiB huge pages).
    assert!(grown >= 2 * NODE - 2 * (2 << 20), "prefault made {grown} bytes resident, expected about {}", 2 * NODE);
    for n in 0..2 {
        let at = RemoteAddr::new(NodeId(n), NODE / 2 + 8 * n as u64);
        let got = block_on(mem.read(at, 8)).unwrap();
        assert_eq!(got.to_vec(), (0xC0FFEE + n as u64).to_le_bytes(), "node {n} lost a word");
    }
    // A second time has nothing left to do, and is no error.
    cluster.prefault().unwrap();
}

/// Whether the kernel knows `MADV_POPULATE_WRITE` (Linux 5.14 and later);
/// without it `prefault` does nothing, by design.
fn kernel_can_prefault() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (5, 14)
}

#[test]
fn prefault_makes_nodes_resident_and_keeps_their_contents() {
    if !kernel_can_prefault() {
        eprintln!("skipped: this kernel cannot prefault (before Linux 5.14)");
        return;
    }
    check(&ShmCluster::in_process(2, NODE).unwrap());
    let dir = PathBuf::from(format!("/dev/shm/swarm-prefault-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = ShmCluster::create(&dir, 2, NODE).unwrap();
    check(&cluster);
    drop(cluster);
    ShmCluster::remove(&dir).unwrap();
}
