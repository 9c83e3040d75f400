//! Nodes start clean (issue #18): a cluster file whose nodes hold an
//! earlier run's bytes (here: random garbage, as a reused pmem file or
//! device-dax region would) is formatted again by the key-value suite
//! (`Region::format`, then the store), and every registered system then
//! passes the suite, its history checked against the system's guarantee.

use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;

use swarm_backend_cxl::{CxlCluster, CxlConfig};
use swarm_core::sim::Rng;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::region::Region;
use swarm_core::{Memory, NodeId, RemoteAddr, systems};
use swarm_testkit::{KvTest, kv_suite};

/// Bytes of the cluster file's own header: its nodes start after it.
const CLUSTER_HEADER: u64 = 4096;

/// Overwrites everything after the cluster header of the file at `path`
/// with bytes from `seed`: words of every kind (all ones, small numbers,
/// plausible offsets, random), as memory a protocol once used holds.
fn fill_with_garbage(path: &PathBuf, seed: u64) {
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let mut rng = Rng::new(seed);
    let mut chunk = vec![0u8; 1 << 20];
    file.seek(SeekFrom::Start(CLUSTER_HEADER)).unwrap();
    let mut at = CLUSTER_HEADER;
    while at < len {
        for w in chunk.chunks_exact_mut(8) {
            let word = match rng.range(0, 3) {
                0 => u64::MAX,
                1 => rng.range(1, 1 << 20),
                _ => rng.next_u64() | 1,
            };
            w.copy_from_slice(&word.to_le_bytes());
        }
        let n = (len - at).min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n]).unwrap();
        at += n as u64;
    }
    file.sync_all().unwrap();
}

#[test]
fn every_system_runs_on_nodes_formatted_over_garbage() {
    let dir = PathBuf::from(format!("/dev/shm/swarm-cxl-garbage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let result = (|| -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        for (i, &system) in systems::ALL.iter().enumerate() {
            let t = KvTest { system, seed: 31 + i as u64, ops_per_client: 400, ..KvTest::default() };
            let paths = [dir.join(format!("pool-{}", system.name()))];
            let cfg = CxlConfig::default();
            drop(CxlCluster::create(&paths, t.replicas, t.node_size, &cfg).map_err(|e| e.to_string())?);
            fill_with_garbage(&paths[0], 7 + i as u64);
            let cluster = CxlCluster::open(&paths, &cfg).map_err(|e| e.to_string())?;
            let mem = cluster.memory();
            // The garbage is there: in a node's header and in its last word.
            let last = RemoteAddr::new(NodeId(2), t.node_size - 8);
            let word = |addr| block_on(mem.read(addr, 8)).map(|b| b.to_vec()).map_err(|e| e.to_string());
            if word(RemoteAddr::new(NodeId(1), 0))? == [0; 8] || word(last)? == [0; 8] {
                return Err("the garbage did not land in the nodes".into());
            }
            let ops = kv_suite(|| cluster.memory(), &t).map_err(|e| format!("{}: {e}", system.name()))?;
            // Past what the store allocated, every byte reads as zero.
            for n in 0..t.replicas {
                let node = NodeId(n as u16);
                let region = block_on(Region::open(&mem, node)).map_err(|e| e.to_string())?;
                for at in (region.cursor..t.node_size).step_by(1 << 20) {
                    let len = (t.node_size - at).min(1 << 20) as usize;
                    let bytes = block_on(mem.read(RemoteAddr::new(node, at), len)).map_err(|e| e.to_string())?;
                    if let Some(i) = bytes.iter().position(|&b| b != 0) {
                        return Err(format!("{}: {node} byte {} is not cleared", system.name(), at + i as u64));
                    }
                }
            }
            done.push(format!("{}: {ops} operations checked", system.name()));
            drop((mem, cluster));
            CxlCluster::remove(&paths, &cfg).map_err(|e| e.to_string())?;
        }
        Ok(done)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(done) => println!("{}", done.join("\n")),
        Err(e) => panic!("{e}"),
    }
}
