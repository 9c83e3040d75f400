//! The key-value suite shared by every backend (`swarm_testkit`) over
//! this one: every store, client threads on shared keys, the histories of
//! the replicated ones checked for linearizability.
#![cfg(not(loom))]

use swarm_backend_shm::ShmCluster;
use swarm_core::kv::System;
use swarm_testkit::{KvTest, kv_suite};

#[test]
fn every_store_passes_the_kv_suite_in_process() {
    for system in System::ALL {
        for (replicas, seed) in [(3, 1), (5, 2)] {
            let t = KvTest { system, replicas, seed, ..KvTest::default() };
            let cluster = ShmCluster::in_process(5, t.node_size).unwrap();
            let ops = kv_suite(|| cluster.memory(), &t)
                .unwrap_or_else(|e| panic!("{}, {replicas} replicas: {e}", system.name()));
            println!("{}, {replicas} replicas: {ops} operations checked", system.name());
        }
    }
}
