//! The benchmark on DAX devices and files (`--backend cxl --path ...`): the
//! threaded runner of [`super::shm`], each client with its own
//! [`CxlMemory`](swarm_backend_cxl::CxlMemory) handle, whose cache-line
//! write-backs, invalidations and fences (`--flush`) are counted and
//! reported.
//!
//! Paths that hold a cluster (`swarm memnode create --backend cxl`) are
//! checked for room and used; paths that do not exist yet get nodes sized
//! for the run, which are removed afterwards.

use std::path::PathBuf;
use std::time::Duration;

use swarm_backend_cxl::{CxlCluster, CxlConfig, FlushMode, FlushStats};
use swarm_core::substrate::exec::block_on;

use super::shm::{check_room, run_threads};
use super::{CHUNK, Workload, check_memory};
use crate::memnode::{format_nodes, print_warnings};
use crate::report::Measured;

/// What a cxl run measured, besides the operations.
pub struct CxlOutcome {
    /// The operations.
    pub measured: Measured,
    /// The devices or files, what they are, and the flush mode, in words.
    pub place: String,
    /// The clients' flushes, warm-up included.
    pub flushes: FlushStats,
}

/// Runs `w` on `paths` with flush mode `mode`.
pub fn run(w: &Workload, paths: &[PathBuf], mode: FlushMode, rtt: Duration) -> Result<CxlOutcome, String> {
    let config = CxlConfig::with_mode(mode);
    let existing = paths.iter().filter(|p| std::fs::symlink_metadata(p).is_ok()).count();
    if existing == paths.len() {
        check_memory(w, 0)?;
        let cluster = CxlCluster::open(paths, &config).map_err(|e| e.to_string())?;
        let place = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        check_room(w, &cluster.memory(), &place, "swarm memnode create --backend cxl")?;
        return measure(w, &cluster, rtt);
    }
    if existing > 0 {
        return Err("some of the --path devices or files exist and some do not: give a cluster's paths, \
                    or only new paths for the benchmark's own nodes"
            .into());
    }
    let (size, geo) = w.own_nodes()?;
    check_memory(w, w.replicas as u64 * size)?;
    let cluster = CxlCluster::create(paths, w.replicas, size, &config).map_err(|e| e.to_string())?;
    let outcome = block_on(format_nodes(&cluster.memory(), size, CHUNK, geo)).and_then(|()| measure(w, &cluster, rtt));
    drop(cluster);
    let removed = CxlCluster::remove(paths, &config).map_err(|e| format!("cannot remove the benchmark's nodes: {e}"));
    let outcome = outcome?;
    removed?;
    Ok(outcome)
}

fn measure(w: &Workload, cluster: &CxlCluster, rtt: Duration) -> Result<CxlOutcome, String> {
    print_warnings(cluster);
    let (measured, mems) = run_threads(w, || cluster.memory().with_latency(rtt))?;
    let mut flushes = FlushStats::default();
    for m in &mems {
        let s = m.persistence().stats();
        flushes.lines_written_back += s.lines_written_back;
        flushes.lines_invalidated += s.lines_invalidated;
        flushes.fences += s.fences;
    }
    let instr = cluster.memory().persistence().writeback_instr();
    let kinds = cluster.backings().map(|b| format!("{}: {}", b.path.display(), b.kind.describe())).collect::<Vec<_>>();
    let place = format!("{}; flush {} with {instr:?}", kinds.join(", "), cluster.mode().name());
    Ok(CxlOutcome { measured, place, flushes })
}
