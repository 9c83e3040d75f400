//! `swarm bench --processes N`: the clients in separate OS processes on
//! one shared-memory cluster.
//!
//! The parent makes a cluster directory in /dev/shm, formats the store,
//! and starts N copies of itself with the hidden `ycsb-worker` subcommand.
//! It talks to each worker over its stdin and stdout, one line at a time:
//!
//! - parent → worker, first: the job as JSON (run, system, cluster
//!   directory, the worker's clients, injected latency, clock epoch);
//! - at every gate between phases, worker → parent `gate`, and once every
//!   worker sent it, parent → worker `go` (or `abort`);
//! - at the end, worker → parent `result <JSON>` or `error <message>`.
//!
//! The parent merges the results (each worker's window on its own clock:
//! the longest counts) and removes the cluster, whatever happened.
//!
//! Faults are the parent's: its [`Injector`] starts its clock when the
//! parent opens the gate of the measured phase, sets the nodes' state in
//! the cluster's control block (which every worker maps), and has healed
//! them when [`run`] returns.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use swarm_backend_shm::Nodes;
use swarm_backend_shm::ShmCluster;
use swarm_core::kv::System;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_ycsb::fault::Injector;
use swarm_ycsb::runner::RunSpec;
use swarm_ycsb::sim::format_cluster;
use swarm_ycsb::threads::{Extras, run_threads};
use swarm_ycsb::{ClientResult, OpKind};

use crate::args::format_size;

/// One worker, as the parent sees it.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// The next line, without its end; `None` at the end of its output.
    fn line(&mut self) -> Option<String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(s.trim_end().to_string()),
        }
    }

    fn send(&mut self, line: &str) -> bool {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).is_ok()
    }
}

/// Removes the cluster directory when the run ends, however it ends.
struct Cleanup<'a>(&'a Path);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = ShmCluster::remove(self.0);
    }
}

/// Client numbers `lo..hi` of worker `w` among `procs` workers.
fn clients_of(clients: usize, procs: usize, w: usize) -> (usize, usize) {
    let lo = w * clients / procs;
    let hi = (w + 1) * clients / procs;
    (lo, hi)
}

/// Refuses a cluster larger than the free space of /dev/shm.
fn check_free_space(parent: &Path, need: u64) -> Result<(), String> {
    let st = rustix::fs::statvfs(parent).map_err(|e| format!("{}: cannot check free space: {e}", parent.display()))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if need > free {
        return Err(format!(
            "this run's memory nodes need up to {}, but {} has only {} free",
            format_size(need),
            parent.display(),
            format_size(free)
        ));
    }
    Ok(())
}

/// Runs `system` with its clients in `procs` worker processes.
pub fn run(
    spec: &RunSpec,
    system: System,
    procs: usize,
    size: u64,
    rtt_us: f64,
    progress: &AtomicU64,
) -> Result<ClientResult, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let root = Path::new(crate::args::SHM_ROOT);
    check_free_space(root, spec.replicas as u64 * size)?;
    let dir = root.join(format!(
        "swarm-bench-{}-{}-{}",
        std::process::id(),
        system.name(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let cluster = ShmCluster::create(&dir, spec.replicas, size).map_err(|e| e.to_string())?;
    let _cleanup = Cleanup(&dir);
    cluster.prefault().map_err(|e| e.to_string())?;
    block_on(format_cluster(&cluster.memory(), &spec.store_config(system), size, SystemClock::unix_us()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program to start workers: {e}"))?;
    let epoch_us = SystemClock::starting_now().epoch_us;
    let mut workers = Vec::with_capacity(procs);
    let result = (|| {
        for w in 0..procs {
            let mut child = Command::new(&exe)
                .arg("ycsb-worker")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start worker process {w}: {e}"))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err("cannot talk to a worker process".to_string());
            };
            let mut worker = Worker { child, stdin, stdout: BufReader::new(stdout) };
            let (lo, hi) = clients_of(spec.clients, procs, w);
            let job = json!({
                "spec": spec.to_json(),
                "system": system.name(),
                "dir": dir.display().to_string(),
                "clients": [lo, hi],
                "rtt_us": rtt_us,
                "epoch_us": epoch_us,
            });
            let sent = worker.send(&job.to_string());
            workers.push(worker);
            if !sent {
                return Err(format!("worker process {w} exited at once"));
            }
        }
        // The system's server, if it has one, runs here for the whole run.
        let make = || cluster.memory();
        swarm_core::systems::with_server(&spec.store_config(system), &make, || {
            coordinate_faulted(spec, &mut workers, progress, cluster.nodes())
        })
    })();
    if result.is_err() {
        for w in &mut workers {
            let _ = w.send("abort");
        }
    }
    for w in &mut workers {
        // A worker told to abort ends at once; one that hangs is killed.
        for _ in 0..200 {
            if matches!(w.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    drop(cluster);
    result.map_err(|e| format!("{}: {e}", system.name()))
}

/// The phases of the run, each with its operations (for the progress
/// bar) and whether the gate after it opens a measured phase.
fn phase_ops(spec: &RunSpec) -> Vec<(u64, bool)> {
    let clients = spec.clients as u64;
    let mut v = vec![(spec.keys, false)];
    if spec.warm_cache {
        v.push((spec.handles() as u64 * spec.keys, false));
    }
    for _ in &spec.inflight {
        v.push((clients * spec.warmup, true));
        v.push((clients * spec.ops, false));
    }
    v
}

/// [`coordinate`], with an injector applying the run's faults on `nodes`
/// beside it, if it has any; the nodes are healthy when it returns.
fn coordinate_faulted(
    spec: &RunSpec,
    workers: &mut [Worker],
    progress: &AtomicU64,
    nodes: &Nodes,
) -> Result<ClientResult, String> {
    let Some(t) = spec.timed.as_ref().filter(|t| !t.faults.is_empty()) else {
        return coordinate(spec, workers, progress, None);
    };
    let injector = Injector::new(&t.faults, t.run_ns, nodes);
    std::thread::scope(|s| {
        let injecting = s.spawn(|| injector.run());
        let out = coordinate(spec, workers, progress, Some(&injector));
        injector.stop();
        let injected = injecting.join().unwrap_or_else(|_| Err("the fault injector crashed (a bug)".into()));
        out.and_then(|r| injected.map(|()| r))
    })
}

/// Opens each gate once every worker reached it (telling `injector` when
/// the measured phase begins), then collects results.
fn coordinate(
    spec: &RunSpec,
    workers: &mut [Worker],
    progress: &AtomicU64,
    injector: Option<&Injector<'_>>,
) -> Result<ClientResult, String> {
    for (ops, opens_measure) in phase_ops(spec) {
        for (i, w) in workers.iter_mut().enumerate() {
            match w.line() {
                Some(l) if l == "gate" => {}
                other => return Err(worker_failed(i, other)),
            }
        }
        if let Some(inj) = injector.filter(|_| opens_measure) {
            inj.begin(std::time::Instant::now());
        }
        for (i, w) in workers.iter_mut().enumerate() {
            if !w.send("go") {
                return Err(format!("worker process {i} exited"));
            }
        }
        progress.fetch_add(ops, Ordering::Relaxed);
    }
    let mut merged: Option<ClientResult> = None;
    for (i, w) in workers.iter_mut().enumerate() {
        let line = w.line();
        let Some(json) = line.as_deref().and_then(|l| l.strip_prefix("result ")) else {
            return Err(worker_failed(i, line));
        };
        let v: Value = serde_json::from_str(json).map_err(|e| format!("worker process {i} sent bad JSON: {e}"))?;
        let r = ClientResult::from_json(&v)?;
        match &mut merged {
            None => merged = Some(r),
            Some(m) => m.merge_foreign(&r),
        }
    }
    let merged = merged.unwrap_or_default();
    let loaded = merged.load.op(OpKind::Insert).count();
    if loaded != spec.keys {
        return Err(format!("the workers loaded {loaded} keys of {}", spec.keys));
    }
    Ok(merged)
}

/// Why worker `i` did not answer as expected.
fn worker_failed(i: usize, line: Option<String>) -> String {
    match line {
        Some(l) => match l.strip_prefix("error ") {
            Some(e) => e.to_string(),
            None => format!("worker process {i} said something unexpected: {l}"),
        },
        None => format!("worker process {i} exited unexpectedly"),
    }
}

/// `swarm ycsb-worker` (hidden): one worker process, talking to its parent
/// over stdin and stdout. Errors go to the parent as an `error` line.
pub fn worker() -> Result<(), String> {
    let input = std::io::stdin();
    let mut first = String::new();
    input.read_line(&mut first).map_err(|e| format!("cannot read the job: {e}"))?;
    let io = Mutex::new((input, std::io::stdout()));
    let result = worker_run(&first, &io);
    let mut guard = io.lock().map_err(|_| "a worker thread crashed")?;
    let out = &mut guard.1;
    let line = match &result {
        Ok(r) => format!("result {}", r.to_json()),
        Err(e) => format!("error {}", e.replace('\n', " ")),
    };
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    // The parent reports the error; this process only fails.
    result.map(|_| ()).map_err(|_| String::new())
}

/// The worker's end of the pipes to its parent.
type Io = Mutex<(std::io::Stdin, std::io::Stdout)>;

fn worker_run(job: &str, io: &Io) -> Result<ClientResult, String> {
    let job: Value = serde_json::from_str(job).map_err(|e| format!("bad job: {e}"))?;
    let spec = RunSpec::from_json(&job["spec"])?;
    let system = job["system"].as_str().and_then(swarm_core::systems::from_name).ok_or("bad job: no system")?;
    let dir = job["dir"].as_str().ok_or("bad job: no directory")?;
    let lo = job["clients"][0].as_u64().ok_or("bad job: no clients")? as usize;
    let hi = job["clients"][1].as_u64().ok_or("bad job: no clients")? as usize;
    let rtt = Duration::from_secs_f64(job["rtt_us"].as_f64().unwrap_or(0.0) / 1e6);
    let clock = SystemClock { epoch_us: job["epoch_us"].as_u64().ok_or("bad job: no clock epoch")? };
    let cluster = ShmCluster::open(dir).map_err(|e| e.to_string())?;
    cluster.prefault().map_err(|e| e.to_string())?;
    let told_to_abort = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = || {
        let Ok(mut g) = io.lock() else { return false };
        let (input, out) = &mut *g;
        if writeln!(out, "gate").and_then(|()| out.flush()).is_err() {
            return false;
        }
        let mut line = String::new();
        let go = matches!(input.read_line(&mut line), Ok(n) if n > 0) && line.trim() == "go";
        if !go {
            told_to_abort.store(true, Ordering::Relaxed);
        }
        go
    };
    let make = || cluster.memory().with_latency(rtt);
    // No fault control here: the parent injects.
    let r = run_threads(&spec, system, lo..hi, make, clock, Extras { hook: Some(&hook), ..Extras::default() });
    match r {
        Err(_) if told_to_abort.load(Ordering::Relaxed) => Err("aborted by the parent".into()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_dealt_evenly() {
        for (clients, procs) in [(1, 1), (4, 2), (5, 3), (7, 7)] {
            let mut all = Vec::new();
            for w in 0..procs {
                let (lo, hi) = clients_of(clients, procs, w);
                assert!(hi > lo, "every worker has a client");
                all.extend(lo..hi);
            }
            assert_eq!(all, (0..clients).collect::<Vec<_>>());
        }
    }
}
