//! The key-value suite shared by every backend (`swarm_testkit`) over
//! this one (issue #6): SWARM-KV and DM-ABD clients on threads over files
//! mapped from `/dev/shm`, in each flush mode, their histories checked for
//! linearizability.

use std::path::PathBuf;

use swarm_backend_cxl::{CxlCluster, CxlConfig, FlushMode, Flusher};
use swarm_core::systems;
use swarm_testkit::{KvTest, kv_suite};

#[test]
fn replicated_stores_are_linearizable_in_every_flush_mode() {
    for (i, mode) in [FlushMode::Persist, FlushMode::None, FlushMode::NonCoherent].into_iter().enumerate() {
        if mode == FlushMode::NonCoherent && !cfg!(target_arch = "x86_64") {
            continue;
        }
        for system in ["swarm-kv", "dm-abd"].map(|n| systems::from_name(n).unwrap()) {
            let t = KvTest { system, seed: 21 + i as u64, ops_per_client: 500, ..KvTest::default() };
            let dir = PathBuf::from(format!("/dev/shm/swarm-cxl-kv-{}-{}-{}", system.name(), i, std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let paths = [dir.join("pool")];
            let result = (|| {
                let cluster =
                    CxlCluster::create(&paths, 3, t.node_size, &CxlConfig::default()).map_err(|e| e.to_string())?;
                let flusher = Flusher::new(mode).map_err(|e| e.to_string())?;
                kv_suite(|| cluster.memory_with(flusher.clone()), &t)
            })();
            let _ = std::fs::remove_dir_all(&dir);
            match result {
                Ok(ops) => println!("cxl {}, {}: {ops} operations linearizable", mode.name(), system.name()),
                Err(e) => panic!("cxl {}, {}: {e}", mode.name(), system.name()),
            }
        }
    }
}
