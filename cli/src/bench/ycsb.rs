//! `swarm bench`: the YCSB comparison of every key-value store the build
//! has, side by side on one backend, one workload and one seed (the
//! harness is the `swarm-ycsb` crate; this is its command line).
//!
//! Each system runs on a fresh cluster sized for the run: in-process
//! shared memory (`shm`, the default), a shared-memory directory in
//! /dev/shm shared with worker processes (`shm --processes N`), DAX
//! devices or files (`cxl --path`), the RDMA memory nodes of a cluster
//! file (`rdma --cluster`, formatted anew for each system), or the
//! deterministic simulator (`sim`: exact roundtrips in virtual time,
//! replayable from `--seed`).
//!
//! `--inflight` takes a list (`1,2,4`): the store is loaded once per
//! system and each setting gets its own warm-up and measurement, which is
//! how the throughput-against-in-flight plot is drawn (the paper's §7.2).
//!
//! The comparison runs in rounds (`--rounds`, 5 by default where time is
//! real): each system measures a share of the operations in each round,
//! the systems taking turns (RAW, SWARM-KV, DM-ABD, RAW, ...), and each
//! system's rounds are reported together. On a machine whose speed drifts
//! (a shared VM, whose CPU slows for seconds to hours at a time), every
//! system then meets its slow and fast stretches alike, and the ratios
//! between them stop depending on which system ran when.
//!
//! `--duration` measures each system for a fixed time instead, with a
//! timeline (`--bucket`); `--fault-node` fails or stalls memory nodes
//! during it, and the node is healthy again before the next system or
//! round (the availability experiment, SWARM §7.7; see [`super::timed`]).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use swarm_backend_cxl::{CxlCluster, CxlConfig, FlushMode};
use swarm_backend_shm::ShmCluster;
use swarm_core::Memory;
use swarm_core::kv::System;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::systems;
use swarm_ycsb::fault::{self, NodeFault};
use swarm_ycsb::plot::write_plots;
use swarm_ycsb::progress::Progress;
use swarm_ycsb::report::Report;
use swarm_ycsb::runner::{MAX_HANDLES, MemoryUse, RunSpec, SystemRun};
use swarm_ycsb::sim::{RTT_NS, format_cluster, run_sim};
use swarm_ycsb::threads::{Extras, run_threads};
use swarm_ycsb::{ClientResult, Distribution, Workload};

use super::{procs, timed};
use crate::args::{format_size, int_in, parse_ops, parse_replicas, parse_rtt_us, parse_size, parse_warmup};
use crate::memnode::print_warnings;
use crate::rdma;
use swarm_backend_rdma::ClusterConfig;

/// Most keys a run may load.
pub const MAX_KEYS: u64 = 100_000_000;
/// Measured operations per client without `--ops`.
const DEFAULT_OPS: u64 = 200_000;

/// Where `swarm bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum YcsbBackend {
    /// Shared memory: in-process with threads, or a /dev/shm cluster shared
    /// by worker processes (`--processes`).
    Shm,
    /// The deterministic simulator: exact roundtrips, virtual time.
    Sim,
    /// DAX devices or files (`--path`), with cache-line flushes (`--flush`).
    Cxl,
    /// RDMA memory nodes (`--cluster`; needs a build with `--features rdma`).
    Rdma,
}

impl YcsbBackend {
    /// As `--backend` takes it.
    pub fn name(self) -> &'static str {
        match self {
            YcsbBackend::Shm => "shm",
            YcsbBackend::Sim => "sim",
            YcsbBackend::Cxl => "cxl",
            YcsbBackend::Rdma => "rdma",
        }
    }
}

/// `swarm bench`.
#[derive(Args, Debug)]
pub struct YcsbArgs {
    /// The memory to run on.
    #[arg(long, value_enum, default_value_t = YcsbBackend::Shm)]
    pub backend: YcsbBackend,
    /// YCSB core workload: a (50% get, 50% update), b (95/5), c (gets
    /// only), d (95% get of recent keys, 5% insert), f (50% get, 50%
    /// read-modify-write).
    #[arg(long, value_name = "W", default_value = "b", value_parser = parse_workload)]
    pub workload: Workload,
    /// Key popularity: zipf (YCSB's scrambled Zipfian, 0.99) or uniform
    /// (workload d always favours recent keys).
    #[arg(long, value_name = "D", default_value = "zipf", value_parser = parse_distribution)]
    pub distribution: Distribution,
    /// Systems to compare, comma-separated (raw, dm-abd, swarm-kv,
    /// pdpm-direct, pdpm-central, clover, fusee) [default: every system of
    /// this build].
    #[arg(long, value_name = "LIST", value_parser = parse_systems)]
    pub systems: Option<Systems>,
    /// Client threads (with --processes: in all processes together).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_clients)]
    pub clients: usize,
    /// Run the clients in N separate OS processes on one shm cluster (the
    /// clients are dealt among them).
    #[arg(long, value_name = "N", value_parser = parse_processes)]
    pub processes: Option<usize>,
    /// Operations in flight per client; a comma-separated list (1,2,4)
    /// runs each setting in turn on the same loaded store.
    #[arg(long, value_name = "LIST", default_value = "1", value_parser = parse_inflight)]
    pub inflight: Inflight,
    /// Keys loaded before the run.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = parse_keys)]
    pub keys: u64,
    /// Bytes per key (YCSB names: 'user' and a number, zero-padded).
    #[arg(long, value_name = "BYTES", default_value = "24", value_parser = parse_key_size)]
    pub key_size: usize,
    /// Bytes per value (suffixes K allowed, at most 64K), or a range MIN..MAX
    /// from which each write's length is drawn uniformly (e.g. 32..1K).
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_value_size)]
    pub value_size: (usize, usize),
    /// Replicas of each key (2f+1; RAW keeps one copy).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_replicas)]
    pub replicas: usize,
    /// Unmeasured operations per client before each measurement (of every
    /// round, with --rounds), going on until the store's background
    /// recycling has worked off the load (SWARM-KV and DM-ABD: 5 recycling
    /// delays, 500 ms on shm) [default: ops / 5].
    #[arg(long, value_name = "N", value_parser = parse_warmup)]
    pub warmup: Option<u64>,
    /// Measured operations per client (per in-flight setting) [default:
    /// 200000; with --duration or --fault-node, at most: by default 3
    /// million a second per operation in flight, in the simulator one per
    /// roundtrip].
    #[arg(long, value_name = "N", value_parser = parse_ops)]
    pub ops: Option<u64>,
    /// Measure each system for this long (500ms, 4s, 1m: from the gate
    /// that opens the measured phase, per in-flight setting and round)
    /// rather than a number of operations, and record a timeline of
    /// throughput and p50/p99 latency [default with --fault-node: 3 s after
    /// the last fault's start, or 2 s after its end if it has a duration].
    #[arg(long, value_name = "TIME", value_parser = timed::parse_duration)]
    pub duration: Option<u64>,
    /// Width of the timeline's buckets (with --duration or --fault-node)
    /// [default: 100ms].
    #[arg(long, value_name = "TIME", value_parser = timed::parse_bucket)]
    pub bucket: Option<u64>,
    /// Fail or stall memory node NODE during each system's measured phase:
    /// NODE:KIND@START[+DURATION], KIND fail or stall, times from the
    /// measured phase's start (1500ms, 2s); without +DURATION to the end of
    /// the run (the node is healthy again before the next system or round).
    /// Repeat for several. Node 0 only for runs whose systems all
    /// replicate their index (--systems swarm-kv,dm-abd,fusee): it holds the one
    /// copy of the others'. On shm (threads or --processes) and cxl; in the
    /// simulator a failure is a crash that lasts (no +DURATION); not rdma.
    /// Implies a timed run (--duration).
    #[arg(long, value_name = "NODE:KIND@START[+DURATION]", value_parser = timed::parse_fault)]
    pub fault_node: Vec<NodeFault>,
    /// Split the run into N rounds in which the systems take turns, each
    /// on a fresh store with its share of --ops (after a whole warm-up, and
    /// with a seed of its own), and report each system's rounds together
    /// [default: 5, or 1 with --backend sim, whose time is virtual, and
    /// with --duration or --fault-node, whose rounds each take the whole
    /// time].
    #[arg(long, value_name = "N", value_parser = parse_rounds)]
    pub rounds: Option<u64>,
    /// Seed of every random choice (and of the whole run with the simulator).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Latency injected into every roundtrip, µs (shm and cxl).
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_rtt_us, allow_negative_numbers = true)]
    pub inject_rtt_us: f64,
    /// Measure with cold location caches: skip the pass in which every
    /// client reads every key once after the load.
    #[arg(long)]
    pub cold_cache: bool,
    /// cxl: device-dax instances or new files where each system's nodes are
    /// laid out for the run (and removed afterwards); repeat for several.
    #[arg(long, value_name = "PATH")]
    pub path: Vec<PathBuf>,
    /// rdma: the cluster file (TOML) that lists the memory nodes; the run
    /// formats them, so whatever they held is lost.
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// cxl: none, persist or noncoherent [default: persist].
    #[arg(long, value_name = "MODE", value_parser = parse_flush)]
    pub flush: Option<FlushMode>,
    /// Also write the results as JSON to FILE (plots go next to it).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the plots (SVG and PNG) into DIR [default: next to --json, or
    /// the system's temporary directory under swarm-bench/].
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Draw no plots.
    #[arg(long, conflicts_with = "plots")]
    pub no_plots: bool,
}

/// A list of systems, as parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Systems(pub Vec<System>);

/// A list of in-flight settings, as parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inflight(pub Vec<usize>);

fn parse_workload(s: &str) -> Result<Workload, String> {
    Workload::from_name(s).ok_or_else(|| format!("'{s}' is not a workload (use a, b, c, d or f)"))
}

fn parse_distribution(s: &str) -> Result<Distribution, String> {
    Distribution::from_name(s).ok_or_else(|| format!("'{s}' is not a distribution (use zipf or uniform)"))
}

fn parse_systems(s: &str) -> Result<Systems, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let sys = systems::from_name(&part.to_ascii_lowercase())
            .ok_or_else(|| format!("'{part}' is not a system of this build (use {})", systems::names()))?;
        if !out.contains(&sys) {
            out.push(sys);
        }
    }
    Ok(Systems(out))
}

/// A whole number in `lo..=hi`, naming `what` in the error.
fn parse_clients(s: &str) -> Result<usize, String> {
    int_in(s, "the number of clients", 1, MAX_HANDLES as u64)
}

fn parse_processes(s: &str) -> Result<usize, String> {
    int_in(s, "the number of processes", 1, MAX_HANDLES as u64)
}

fn parse_inflight(s: &str) -> Result<Inflight, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let n: u64 = int_in(part, "operations in flight", 1, MAX_HANDLES as u64)?;
        out.push(n as usize);
    }
    Ok(Inflight(out))
}

fn parse_rounds(s: &str) -> Result<u64, String> {
    int_in(s, "the number of rounds", 1, 1000)
}

/// Rounds when `--rounds` is not given: several where time is real, so that
/// a drift of the machine's speed falls on every system alike.
const DEFAULT_ROUNDS: u64 = 5;

/// The run's rounds (never more than its measured operations).
fn rounds(a: &YcsbArgs, spec: &RunSpec) -> u64 {
    let default = if a.backend == YcsbBackend::Sim || spec.timed.is_some() { 1 } else { DEFAULT_ROUNDS };
    a.rounds.unwrap_or(default.min(spec.ops))
}

fn parse_keys(s: &str) -> Result<u64, String> {
    int_in(s, "the number of keys", 1, MAX_KEYS)
}

fn parse_key_size(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        n @ 1..=255 => Ok(n as usize),
        _ => Err("keys may have 1 to 255 bytes".into()),
    }
}

/// One size (both ends the same) or a range `MIN..MAX`.
fn parse_value_size(s: &str) -> Result<(usize, usize), String> {
    let one = |s: &str| match parse_size(s)? {
        n if n > 1 << 16 => Err("values may have at most 65536 bytes (the stores' limit)".to_string()),
        n => Ok(n as usize),
    };
    match s.split_once("..") {
        None => one(s).map(|n| (n, n)),
        Some((lo, hi)) => match (one(lo)?, one(hi)?) {
            (lo, hi) if lo > hi => Err(format!("the range {s} is empty: its smallest size is above its largest")),
            r => Ok(r),
        },
    }
}

fn parse_flush(s: &str) -> Result<FlushMode, String> {
    s.trim().parse()
}

/// The run the flags describe, after the checks between flags.
pub fn spec(a: &YcsbArgs) -> Result<RunSpec, String> {
    let timed = timed::timed(a)?;
    let inflight = a.inflight.0.clone();
    let max_inflight = inflight.iter().copied().max().unwrap_or(1);
    let ops = match (a.ops, &timed) {
        (Some(n), _) => n,
        (None, None) => DEFAULT_OPS,
        (None, Some(t)) => timed::ops_cap(t, a.backend, max_inflight),
    };
    let spec = RunSpec {
        workload: a.workload,
        distribution: a.distribution,
        keys: a.keys,
        key_size: a.key_size,
        value_size: a.value_size.1,
        value_min: a.value_size.0,
        replicas: a.replicas,
        clients: a.clients,
        inflight,
        // A timed run's cap is no measure of how long to warm up.
        warmup: a.warmup.unwrap_or(if timed.is_some() { DEFAULT_OPS / 5 } else { ops / 5 }),
        ops,
        seed: a.seed,
        warm_cache: !a.cold_cache,
        timed,
    };
    let backend = a.backend;
    if backend == YcsbBackend::Rdma && a.cluster.is_none() {
        return Err("--backend rdma needs --cluster FILE (the memory nodes; see backend-rdma/README.md)".into());
    }
    if backend != YcsbBackend::Rdma && a.cluster.is_some() {
        return Err("--cluster applies to --backend rdma only".into());
    }
    if matches!(backend, YcsbBackend::Sim | YcsbBackend::Rdma) && a.inject_rtt_us != 0.0 {
        return Err("--inject-rtt-us applies to --backend shm and cxl (the others have real or simulated \
                    roundtrips)"
            .into());
    }
    if let Some(p) = a.processes {
        if backend != YcsbBackend::Shm {
            return Err("--processes applies to --backend shm only".into());
        }
        if p > a.clients {
            return Err(format!("--processes {p} needs at least {p} clients (--clients {})", a.clients));
        }
    }
    if backend != YcsbBackend::Cxl && !a.path.is_empty() {
        return Err("--path applies to --backend cxl only".into());
    }
    if backend != YcsbBackend::Cxl && a.flush.is_some() {
        return Err("--flush applies to --backend cxl only".into());
    }
    if let Some(r) = a.rounds
        && r > spec.ops
    {
        return Err(format!("--rounds {r} needs at least as many --ops (each round measures its share)"));
    }
    if backend == YcsbBackend::Cxl && a.path.is_empty() {
        return Err("--backend cxl needs --path PATH (a device-dax or a new file; repeat for several)".into());
    }
    spec.check()?;
    if let Some(t) = &spec.timed {
        fault::check_index_node(&t.faults, &systems_of(a), spec.replicas)?;
    }
    Ok(spec)
}

/// The systems `a` runs, in order.
fn systems_of(a: &YcsbArgs) -> Vec<System> {
    a.systems.as_ref().map_or_else(|| systems::ALL.to_vec(), |s| s.0.clone())
}

/// `swarm bench`.
pub fn run(a: &YcsbArgs) -> Result<(), String> {
    let spec = spec(a)?;
    let systems = systems_of(a);
    let cluster = match &a.cluster {
        Some(path) => Some(rdma::load_cluster(path, spec.replicas)?),
        None => None,
    };
    // Fail on an unwritable report now, not after the run.
    let mut json_file = match &a.json {
        Some(p) => Some(File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))?),
        None => None,
    };
    let plots_dir = plots_dir(a);
    let n = rounds(a, &spec);
    let (backend, backend_json) = describe(a, &systems, cluster.as_ref(), n);
    let round_specs: Vec<RunSpec> = (0..n).filter_map(|r| spec.round(r, n)).collect();
    let total: u64 = round_specs.iter().map(RunSpec::total_ops).sum();
    // A timed run's length is its time, not its operations: no bar.
    let progress = Progress::start(total * systems.len() as u64, spec.timed.is_none());
    let mut runs: Vec<SystemRun> = Vec::new();
    for (r, round) in round_specs.iter().enumerate() {
        for &system in &systems {
            let label = if n > 1 { format!("{} {}/{n}", system.name(), r + 1) } else { system.name().into() };
            progress.set_label(label);
            match run_system(a, round, system, cluster.as_ref(), progress.counter()) {
                Ok(result) => match runs.iter_mut().find(|s| s.system == system) {
                    Some(run) => run.result.append(&result),
                    None => runs.push(SystemRun { system, result }),
                },
                Err(e) => {
                    progress.finish();
                    if let Some(p) = &a.json {
                        drop(json_file.take());
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(e);
                }
            }
        }
    }
    progress.finish();
    let virtual_time = a.backend == YcsbBackend::Sim;
    let report = Report::new(&spec, backend, backend_json, virtual_time, &runs);
    print!("{}", report.text());
    if let (Some(file), Some(path)) = (json_file.as_mut(), &a.json) {
        let text = serde_json::to_string_pretty(&report.json()).map_err(|e| format!("cannot encode JSON: {e}"))?;
        writeln!(file, "{text}").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("\nresults: {}", path.display());
    }
    if let Some(dir) = plots_dir {
        let files = write_plots(&dir, &spec, &runs, virtual_time)?;
        println!("plots ({}): {}", dir.display(), names(&files));
    }
    Ok(())
}

/// The files' names, for one line.
fn names(files: &[PathBuf]) -> String {
    files.iter().filter_map(|f| f.file_name()).map(|n| n.to_string_lossy().into_owned()).collect::<Vec<_>>().join(", ")
}

/// Where plots go, if anywhere.
fn plots_dir(a: &YcsbArgs) -> Option<PathBuf> {
    if a.no_plots {
        return None;
    }
    if let Some(d) = &a.plots {
        return Some(d.clone());
    }
    if let Some(j) = &a.json {
        let parent = j.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        return Some(parent.to_path_buf());
    }
    Some(std::env::temp_dir().join("swarm-bench"))
}

/// The backend in words, and its settings for the JSON `config`.
fn describe(a: &YcsbArgs, systems: &[System], cluster: Option<&ClusterConfig>, rounds: u64) -> (String, Value) {
    let words = match a.backend {
        YcsbBackend::Shm => match a.processes {
            Some(p) => format!("shm ({p} processes on one /dev/shm cluster, injected rtt {} µs)", a.inject_rtt_us),
            None => format!("shm (in-process, threads, injected rtt {} µs)", a.inject_rtt_us),
        },
        YcsbBackend::Sim => format!("sim (virtual time, fixed rtt {} µs)", RTT_NS as f64 / 1e3),
        YcsbBackend::Cxl => format!(
            "cxl ({}, flush {}, injected rtt {} µs)",
            a.path.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            a.flush.unwrap_or_default().name(),
            a.inject_rtt_us
        ),
        YcsbBackend::Rdma => format!(
            "rdma ({} memory nodes: {})",
            cluster.map_or(0, |c| c.nodes.len()),
            cluster
                .map(|c| c.nodes.iter().map(|n| n.address.as_str()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default()
        ),
    };
    let json = json!({
        "backend": a.backend.name(),
        "systems": systems.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "processes": a.processes,
        "inject_rtt_us": a.inject_rtt_us,
        "rounds": rounds,
        "path": a.path.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "flush": (a.backend == YcsbBackend::Cxl).then(|| a.flush.unwrap_or_default().name()),
        "cluster": cluster.map(|c| c.nodes.iter().map(|n| json!({"address": n.address, "size": n.size})).collect::<Vec<_>>()),
    });
    (words, json)
}

/// Refuses a run whose memory nodes would not fit in the memory available
/// now (`MemAvailable`; no check if it cannot be read).
fn check_memory(need: u64) -> Result<(), String> {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else { return Ok(()) };
    let avail_kib = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match avail_kib {
        Some(kib) if need > kib.saturating_mul(1024) => Err(format!(
            "this run's memory nodes need up to {}, but only {} is available (use fewer --keys or --ops, or a \
             smaller --value-size)",
            format_size(need),
            format_size(kib * 1024)
        )),
        _ => Ok(()),
    }
}

/// Runs one system on a fresh cluster of the chosen backend.
fn run_system(
    a: &YcsbArgs,
    spec: &RunSpec,
    system: System,
    cluster: Option<&ClusterConfig>,
    progress: Arc<AtomicU64>,
) -> Result<ClientResult, String> {
    let size = spec.node_bytes(system);
    let rtt = Duration::from_secs_f64(a.inject_rtt_us / 1e6);
    match a.backend {
        YcsbBackend::Sim => {
            check_memory(spec.replicas as u64 * size)?;
            run_sim(spec, system, Some(progress))
        }
        YcsbBackend::Shm => match a.processes {
            Some(p) => procs::run(spec, system, p, size, a.inject_rtt_us, &progress),
            None => {
                check_memory(spec.replicas as u64 * size)?;
                let cluster = ShmCluster::in_process(spec.replicas, size).map_err(|e| e.to_string())?;
                cluster.prefault().map_err(|e| e.to_string())?;
                block_on(format_cluster(&cluster.memory(), &spec.store_config(system), size, SystemClock::unix_us()))?;
                let make = || cluster.memory().with_latency(rtt);
                let extras =
                    Extras { progress: Some(progress), faults: Some(cluster.nodes()), hook: None, serve: true };
                let out = run_threads(spec, system, 0..spec.clients, make, SystemClock::starting_now(), extras)?;
                Ok(with_memory(out, spec, &cluster.memory()))
            }
        },
        YcsbBackend::Cxl => {
            let config = CxlConfig::with_mode(a.flush.unwrap_or_default());
            let cluster = CxlCluster::create(&a.path, spec.replicas, size, &config).map_err(|e| e.to_string())?;
            print_warnings(&cluster);
            let out = cluster.prefault().map_err(|e| e.to_string()).and_then(|()| {
                block_on(format_cluster(&cluster.memory(), &spec.store_config(system), size, SystemClock::unix_us()))?;
                let make = || cluster.memory().with_latency(rtt);
                let extras =
                    Extras { progress: Some(progress), faults: Some(cluster.nodes()), hook: None, serve: true };
                let out = run_threads(spec, system, 0..spec.clients, make, SystemClock::starting_now(), extras)?;
                Ok(with_memory(out, spec, &cluster.memory()))
            });
            drop(cluster);
            let removed =
                CxlCluster::remove(&a.path, &config).map_err(|e| format!("cannot remove the benchmark's nodes: {e}"));
            let out = out?;
            removed?;
            Ok(out)
        }
        YcsbBackend::Rdma => {
            let cluster = cluster.ok_or("--backend rdma needs --cluster FILE")?;
            rdma::bench(cluster, spec, system, progress)
        }
    }
}

/// `result` with the memory its store holds on `mem` once its clients are
/// done (SWARM Table 3's measure).
fn with_memory<M: Memory>(mut result: ClientResult, spec: &RunSpec, mem: &M) -> ClientResult {
    let keys = MemoryUse::keys_after(spec, &result);
    result.memory = block_on(MemoryUse::of(mem, keys)).ok();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse() {
        assert_eq!(parse_inflight("1,2,4"), Ok(Inflight(vec![1, 2, 4])));
        assert!(parse_inflight("0").unwrap_err().contains("between 1 and 126"));
        assert!(parse_inflight("1,,2").is_err());
        let named = |n| systems::from_name(n).unwrap();
        assert_eq!(parse_systems("swarm-kv,RAW,raw"), Ok(Systems(vec![named("swarm-kv"), named("raw")])));
        assert!(parse_systems("swarm,raw").unwrap_err().contains("'swarm' is not a system"));
        assert_eq!(parse_workload("D"), Ok(Workload::D));
        assert!(parse_workload("e").is_err());
        assert!(parse_key_size("0").is_err() && parse_key_size("256").is_err());
        assert_eq!(parse_value_size("8K"), Ok((8192, 8192)));
        assert_eq!(parse_value_size("32..1K"), Ok((32, 1024)));
        assert!(parse_value_size("1K..32").is_err());
        assert!(parse_value_size("32..65537").is_err());
        assert!(parse_value_size("65537").is_err());
    }
}
