//! The register suite shared by every backend (`swarm_testkit`) over
//! this one: Safe-Guess clients on real threads, their history checked for
//! linearizability, on in-process memory and on a cluster of files in
//! `/dev/shm`.
#![cfg(not(loom))]

use std::path::PathBuf;

use swarm_backend_shm::ShmCluster;
use swarm_core::NodeId;
use swarm_testkit::{RegisterTest, register_suite};

const NODES: [NodeId; 3] = [NodeId(0), NodeId(1), NodeId(2)];

#[test]
fn registers_are_linearizable_in_process() {
    for seed in 1..=3 {
        let t = RegisterTest { seed, ..RegisterTest::default() };
        let cluster = ShmCluster::in_process(NODES.len(), t.node_size).unwrap();
        let report = register_suite(|| cluster.memory(), &NODES, &t).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        println!("shm in-process, seed {seed}: {report}");
    }
}

#[test]
fn registers_are_linearizable_on_files() {
    let t = RegisterTest { clients: 5, seed: 7, ..RegisterTest::default() };
    let dir = PathBuf::from(format!("/dev/shm/swarm-registers-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = ShmCluster::create(&dir, NODES.len(), t.node_size).unwrap();
    let result = register_suite(|| cluster.memory(), &NODES, &t);
    drop(cluster);
    ShmCluster::remove(&dir).unwrap();
    println!("shm files: {}", result.unwrap());
}

/// The suite is not vacuous: over a memory whose reads sometimes return a
/// stale copy of what the same handle read before (as a cache without
/// coherence would), it finds a history that is not linearizable.
#[test]
fn the_suite_catches_stale_reads() {
    let t = RegisterTest { clients: 3, ops_per_client: 400, seed: 3, ..RegisterTest::default() };
    let cluster = ShmCluster::in_process(NODES.len(), t.node_size).unwrap();
    let err =
        register_suite(|| stale::Stale::new(cluster.memory()), &NODES, &t).expect_err("stale reads went unnoticed");
    println!("as expected: {}", err.lines().next().unwrap_or(""));
    assert!(err.contains("not linearizable"), "{err}");
}

mod stale {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    use swarm_backend_shm::ShmMemory;
    use swarm_core::{MemError, Memory, NodeId, Op, OpOutput, Outputs, RemoteAddr};

    /// A broken memory (see the test above).
    pub struct Stale {
        inner: ShmMemory,
        /// The first copy of each range this handle read.
        first: RefCell<HashMap<(NodeId, u64, usize), Vec<u8>>>,
        rng: Cell<u64>,
    }

    impl Stale {
        pub fn new(inner: ShmMemory) -> Stale {
            Stale { inner, first: RefCell::new(HashMap::new()), rng: Cell::new(0x9E37_79B9_7F4A_7C15) }
        }

        fn coin(&self) -> bool {
            let mut x = self.rng.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.rng.set(x);
            x & 1 == 0
        }
    }

    impl Memory for Stale {
        type Buf = Vec<u8>;

        fn node_count(&self) -> usize {
            self.inner.node_count()
        }

        async fn read(&self, addr: RemoteAddr, len: usize) -> Result<Vec<u8>, MemError> {
            let key = (addr.node, addr.offset, len);
            if self.coin()
                && let Some(old) = self.first.borrow().get(&key)
            {
                return Ok(old.clone());
            }
            let fresh = self.inner.read(addr, len).await?.to_vec();
            self.first.borrow_mut().entry(key).or_insert_with(|| fresh.clone());
            Ok(fresh)
        }

        async fn write(&self, addr: RemoteAddr, data: &[u8]) -> Result<(), MemError> {
            self.inner.write(addr, data).await
        }

        async fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, MemError> {
            self.inner.cas(addr, expected, new).await
        }

        async fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> Result<Outputs<Vec<u8>>, MemError> {
            let outs = self.inner.pipeline(node, ops).await?;
            Ok(outs
                .into_iter()
                .map(|o| match o {
                    OpOutput::Read(b) => OpOutput::Read(b.to_vec()),
                    OpOutput::Written => OpOutput::Written,
                    OpOutput::Cas(v) => OpOutput::Cas(v),
                })
                .collect())
        }

        fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
            self.inner.post_background(node, ops)
        }
    }
}
