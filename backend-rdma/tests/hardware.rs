//! The suites over real verbs: three memory-node daemons in this process
//! (loopback through one NIC when the machine has only one), clients
//! connected through the cluster file, the register and key-value suites
//! every backend runs.
//!
//! They need an RDMA device and the `verbs` feature, so they are ignored by
//! default; `scripts/test-rdma-hardware.sh` checks for a device and runs
//! them. `RDMA_DEVICE` and `RDMA_GID_INDEX` choose the device and GID.
#![cfg(feature = "verbs")]

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::thread::JoinHandle;

use swarm_backend_rdma::config::{ClientOptions, ClusterConfig, NodeSpec};
use swarm_backend_rdma::daemon::{ServeOptions, serve};
use swarm_backend_rdma::verbs::node::VerbsNode;
use swarm_backend_rdma::verbs::{Device, DeviceChoice, nic::connect};
use swarm_core::substrate::exec::block_on;
use swarm_core::systems;
use swarm_core::{Memory, NodeId, RemoteAddr};
use swarm_testkit::{KvTest, RegisterTest, kv_suite, register_suite};

const NEEDS: &str = "needs an RDMA device: run scripts/test-rdma-hardware.sh";

fn choice() -> DeviceChoice {
    DeviceChoice {
        name: std::env::var("RDMA_DEVICE").ok(),
        port: 1,
        gid_index: std::env::var("RDMA_GID_INDEX").ok().and_then(|g| g.parse().ok()),
    }
}

/// `n` daemons of `size` bytes each on loopback ports, and the cluster file
/// that lists them.
struct Cluster {
    config: ClusterConfig,
    stop: Arc<AtomicBool>,
    daemons: Vec<JoinHandle<()>>,
}

impl Cluster {
    fn start(n: usize, size: u64) -> Cluster {
        let stop = Arc::new(AtomicBool::new(false));
        let mut nodes = Vec::new();
        let mut daemons = Vec::new();
        for i in 0..n {
            let node = VerbsNode::new(&choice(), size).unwrap_or_else(|e| panic!("node {i}: {e}"));
            println!("node {i}: {}", node.describe());
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            nodes.push(NodeSpec { address: listener.local_addr().unwrap().to_string(), size });
            let stop = stop.clone();
            daemons.push(std::thread::spawn(move || {
                let log = |line: &str| println!("node {i}: {line}");
                serve(&listener, &node, &ServeOptions::default(), &stop, &log).unwrap();
            }));
        }
        let c = choice();
        let client = ClientOptions { device: c.name, gid_index: c.gid_index, ..ClientOptions::default() };
        Cluster { config: ClusterConfig { nodes, client }, stop, daemons }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for d in self.daemons.drain(..) {
            let _ = d.join();
        }
    }
}

#[test]
fn a_missing_device_is_named_clearly() {
    let e = Device::open(&DeviceChoice { name: Some("no-such-rdma-device".into()), ..DeviceChoice::default() })
        .err()
        .expect("no device has that name");
    assert!(e.contains("no RDMA device"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test-rdma-hardware.sh"]
fn reads_writes_and_cas_over_real_verbs() {
    let cluster = Cluster::start(2, 1 << 20);
    let m = connect(&cluster.config, "hardware test").unwrap();
    let at = RemoteAddr { node: NodeId(1), offset: 4096 };
    block_on(m.write(at, b"over the wire")).unwrap();
    assert_eq!(&*block_on(m.read(at, 13)).unwrap(), b"over the wire");
    let word = RemoteAddr { node: NodeId(0), offset: 64 };
    assert_eq!(block_on(m.cas(word, 0, 42)).unwrap(), 0);
    assert_eq!(block_on(m.cas(word, 0, 7)).unwrap(), 42);
    assert_eq!(&*block_on(m.read(word, 8)).unwrap(), &42u64.to_le_bytes(), "CAS words are little-endian in memory");
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| i as u8).collect();
    let cluster_big = Cluster::start(1, 8 << 20);
    let m2 = connect(&cluster_big.config, "hardware test, big").unwrap();
    block_on(m2.write(RemoteAddr { node: NodeId(0), offset: 0 }, &big)).unwrap();
    assert!(*block_on(m2.read(RemoteAddr { node: NodeId(0), offset: 0 }, big.len())).unwrap() == *big);
    println!("{NEEDS}: ran");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test-rdma-hardware.sh"]
fn the_register_suite_passes_over_real_verbs() {
    let nodes = [NodeId(0), NodeId(1), NodeId(2)];
    let t = RegisterTest { seed: 11, ..RegisterTest::default() };
    let cluster = Cluster::start(3, t.node_size);
    let report = register_suite(|| connect(&cluster.config, "register suite").unwrap(), &nodes, &t).unwrap();
    println!("verbs: {report}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test-rdma-hardware.sh"]
fn every_store_passes_the_kv_suite_over_real_verbs() {
    for &system in systems::ALL {
        let t = KvTest { system, replicas: 3, seed: 12, ..KvTest::default() };
        let cluster = Cluster::start(3, t.node_size);
        let ops = kv_suite(|| connect(&cluster.config, "kv suite").unwrap(), &t)
            .unwrap_or_else(|e| panic!("{}: {e}", system.name()));
        println!("{} over verbs: {ops} operations checked", system.name());
    }
}
