//! The registry walk: every system registered in `swarm_core::systems`
//! runs the key-value suite shared by every backend (`swarm_testkit`) over
//! this one, client threads on real shared memory, and a campaign of seeded
//! simulator runs with crashes and delays (`swarm_core::check::kv`), each
//! history checked against the system's declared guarantee. A system is
//! checked here the moment it is registered: nothing names it.
#![cfg(not(loom))]

use swarm_backend_shm::ShmCluster;
use swarm_core::check::kv::campaign;
use swarm_core::systems;
use swarm_testkit::{KvTest, kv_suite};

#[test]
fn every_registered_system_passes_the_kv_suite_in_process() {
    for &system in systems::ALL {
        for (replicas, seed) in [(3, 1), (5, 2)] {
            let t = KvTest { system, replicas, seed, ..KvTest::default() };
            let cluster = ShmCluster::in_process(5, t.node_size).unwrap();
            let ops = kv_suite(|| cluster.memory(), &t)
                .unwrap_or_else(|e| panic!("{}, {replicas} replicas: {e}", system.name()));
            println!("{}, {replicas} replicas: {ops} operations checked", system.name());
        }
    }
}

/// A short campaign per system (the long ones run in the core's tests):
/// enough seeds to reach crashes, slow nodes and every option value.
#[test]
fn every_registered_system_passes_a_simulator_campaign() {
    for &system in systems::ALL {
        for replicas in [3, 5] {
            let s = campaign(system, replicas, 0, 40).unwrap_or_else(|e| panic!("{system}, {replicas} replicas: {e}"));
            assert_eq!(s.runs, 40);
            println!("{system}, {replicas} replicas: {} runs, {} operations checked", s.runs, s.ops);
        }
    }
}
