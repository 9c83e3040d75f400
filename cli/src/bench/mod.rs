//! `swarm bench-register`: a Safe-Guess register benchmark (and, in
//! [`ycsb`], `swarm bench`: the YCSB comparison of the key-value stores).
//!
//! Every client loops over seeded random operations: pick a register
//! uniformly among `--registers`, then read it or write a `--value-size`
//! value to it (`--read-ratio`). Each operation is timed and its sequential
//! roundtrips counted ([`Counted`]); writes also say which path they took
//! ([`WritePath`]). The same workload runs on shared memory, with one OS
//! thread per client ([`shm`]), on DAX devices and files with cache-line
//! flushes ([`cxl`], the same threads), or in the deterministic simulator,
//! with one task per client and virtual time ([`sim`]).
//!
//! Client `i` has id `i` (1..=N); the setup client that formats the nodes
//! and creates the registers has the last id ([`MAX_CLIENT`]). Writer logs
//! are never recycled (SWARM §4.5), so the nodes the benchmark makes for
//! itself are sized for the run, and a `--dir` cluster is checked for room.

mod cxl;
pub mod procs;
mod shm;
mod sim;
pub(crate) mod timed;
pub mod ycsb;

use std::fs::File;
use std::io::Write;

use serde_json::json;
use swarm_core::substrate::clock::Clock;
use swarm_core::substrate::rtt::Counted;
use swarm_core::substrate::space::region::{HEADER_SIZE, RegionError};
use swarm_core::substrate::space::slab::{AllocError, class_of};
use swarm_core::swarm::client::{ClientCtx, ClientError};
use swarm_core::swarm::inout::{InOutError, Layout};
use swarm_core::swarm::maxreg::{RegCache, RegError, Register};
use swarm_core::swarm::meta::MAX_CLIENT;
use swarm_core::swarm::safeguess::{self, WritePath};
use swarm_core::swarm::writerlog::{LogError, LogGeometry};
use swarm_core::{Memory, NodeId};

use crate::args::{Backend, BenchArgs, format_size};
use crate::report::{Measured, Paths, Report, Sample, TimeBase};

/// Chunk size of the nodes the benchmark makes for itself (in-process and
/// simulated): one writer-log segment.
const CHUNK: u64 = 1 << 20;

/// What every client does.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Clients, ids `1..=clients`.
    pub clients: u8,
    /// Replicas per register; the registers live on nodes `0..replicas`.
    pub replicas: usize,
    /// Bytes per written value.
    pub value_size: u64,
    /// Measured operations per client.
    pub ops: u64,
    /// Unmeasured operations per client, first.
    pub warmup: u64,
    /// Share of reads.
    pub read_ratio: f64,
    /// Number of registers.
    pub registers: u32,
    /// Shape of every replica.
    pub layout: Layout,
    /// Seed of the operation mix.
    pub seed: u64,
}

impl Workload {
    /// The most writes one client may issue (every operation a write).
    fn writes_bound(&self) -> u64 {
        self.ops + self.warmup
    }

    /// Register `r1 mod K` and whether to read, from two random words.
    fn pick(&self, r1: u64, r2: u64) -> (usize, bool) {
        let reg = (r1 % self.registers as u64) as usize;
        let unit = (r2 >> 11) as f64 / (1u64 << 53) as f64;
        (reg, unit < self.read_ratio)
    }

    /// Chunks per node that the registers and the clients' log segments may
    /// take, for a node with `chunk`-byte chunks and `per_segment` log
    /// entries per segment, with a quarter spare (segments that two clients
    /// raced to claim are lost to one of them).
    fn chunks_needed(&self, chunk: u64, per_segment: u64) -> Result<u64, String> {
        let obj = class_of(self.layout.size()).map_or(u64::MAX, |(_, obj)| obj);
        if obj > chunk {
            return Err(format!(
                "a register replica of {} does not fit in a chunk of {}",
                format_size(self.layout.size()),
                format_size(chunk)
            ));
        }
        let registers = (self.registers as u64).div_ceil(chunk / obj);
        let per_client = self.writes_bound().div_ceil(per_segment.max(1)) + 2;
        let total = registers + self.clients as u64 * per_client;
        Ok(total + total / 4 + 2)
    }

    /// Node size and log geometry for the benchmark's own nodes.
    fn own_nodes(&self) -> Result<(u64, LogGeometry), String> {
        let bad = |_| format!("values of {} bytes do not fit the benchmark's writer logs", self.value_size);
        let per_segment = LogGeometry::new(self.value_size, CHUNK, 1).map_err(bad)?.per_segment;
        let segments = self.writes_bound().div_ceil(per_segment) + 2;
        let geo = LogGeometry::new(self.value_size, CHUNK, segments).map_err(bad)?;
        let chunks = geo.dir_bytes().div_ceil(CHUNK) + self.chunks_needed(CHUNK, per_segment)?;
        let size = HEADER_SIZE + chunks * CHUNK;
        Ok((size, geo))
    }

    /// Bytes of this process's memory the run needs besides the nodes: the
    /// latency samples (kept, merged and sorted: about four copies), each
    /// client's register caches, and the registers.
    fn host_bytes(&self) -> u64 {
        let clients = self.clients as u64;
        let samples = clients * self.ops * 4 * size_of::<Sample>() as u64;
        let caches = clients * self.registers as u64 * size_of::<RegCache>() as u64;
        samples + caches + self.registers as u64 * size_of::<Register>() as u64
    }
}

/// Refuses a run that would not fit in the memory available now
/// (`MemAvailable` of /proc/meminfo; no check if it cannot be read): its
/// in-memory nodes (`node_bytes`) and [`Workload::host_bytes`]. Better than
/// being killed by the kernel, or aborting on a failed allocation, halfway.
fn check_memory(w: &Workload, node_bytes: u64) -> Result<(), String> {
    let need = node_bytes.saturating_add(w.host_bytes());
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else { return Ok(()) };
    let avail_kib = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match avail_kib {
        Some(kib) if need > kib.saturating_mul(1024) => Err(format!(
            "this run needs about {} of memory, but only {} is available \
             (use fewer --ops, --clients or --registers, or a smaller --value-size)",
            format_size(need),
            format_size(kib * 1024)
        )),
        _ => Ok(()),
    }
}

/// Formats the value a client writes as its `seq`-th operation: the client
/// and the sequence number in the first bytes, so that writes differ.
fn fill_value(buf: &mut [u8], client: u8, seq: u64) {
    let tag = ((client as u64) << 56 | seq).to_le_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&tag[..n]);
}

/// One operation, counted: `(roundtrips, path of a write)`.
async fn one_op<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    cache: &mut RegCache,
    read: Option<usize>,
    value: &[u8],
) -> Result<(u32, Option<WritePath>), String> {
    let counted = Counted::new(mem);
    let id = ctx.id;
    match read {
        Some(expected_len) => {
            let (_, v) = safeguess::read(ctx, &counted, reg, cache).await.map_err(|e| op_error(id, "read", e))?;
            if !v.is_empty() && v.len() != expected_len {
                return Err(format!(
                    "client {id}: read returned {} bytes, but every write has {expected_len}",
                    v.len()
                ));
            }
            Ok((counted.roundtrips(), None))
        }
        None => {
            let (_, path) =
                safeguess::write(ctx, &counted, reg, cache, value).await.map_err(|e| op_error(id, "write", e))?;
            Ok((counted.roundtrips(), Some(path)))
        }
    }
}

/// Explains a failed operation, naming the usual causes in words.
fn op_error(id: u8, what: &str, e: RegError) -> String {
    match e {
        RegError::NoQuorum(InOutError::Log(LogError::Alloc(AllocError::Region(RegionError::Exhausted {
            node,
            ..
        }))))
        | RegError::Client(ClientError::Log(LogError::Alloc(AllocError::Region(RegionError::Exhausted {
            node,
            ..
        })))) => {
            format!("client {id}: {node} is full (remote memory is never recycled: use a bigger or a new cluster)")
        }
        e => format!("client {id}: {what} failed: {e}"),
    }
}

/// Creates the benchmark's registers on nodes `0..replicas`, as the setup
/// client.
async fn create_registers<M: Memory, C: Clock>(w: &Workload, mem: &M, clock: C) -> Result<Vec<Register>, String> {
    let mut ctx = ClientCtx::new(MAX_CLIENT, clock).map_err(|e| format!("setup client: {e}"))?;
    let nodes: Vec<NodeId> = (0..w.replicas).map(|n| NodeId(n as u16)).collect();
    let mut regs = Vec::with_capacity(w.registers as usize);
    for _ in 0..w.registers {
        let reg = Register::create(&mut ctx, mem, &nodes, w.layout)
            .await
            .map_err(|e| format!("cannot create the registers: {e}"))?;
        regs.push(reg);
    }
    Ok(regs)
}

/// What one client measured.
#[derive(Debug, Default)]
struct ClientOut {
    reads: Vec<Sample>,
    writes: Vec<Sample>,
    paths: Paths,
    /// Start of its first measured operation and end of its last, ns on
    /// the run's clock.
    start_ns: u64,
    end_ns: u64,
}

impl ClientOut {
    /// Room for the expected number of reads and writes, and a tenth more.
    fn with_capacity(w: &Workload) -> ClientOut {
        let room = |share: f64| ((w.ops as f64 * share * 1.1) as usize + 16).min(w.ops as usize);
        ClientOut {
            reads: Vec::with_capacity(room(w.read_ratio)),
            writes: Vec::with_capacity(room(1.0 - w.read_ratio)),
            ..ClientOut::default()
        }
    }

    fn record(&mut self, sample: Sample, path: Option<WritePath>) {
        match path {
            None => self.reads.push(sample),
            Some(p) => {
                self.writes.push(sample);
                match p {
                    WritePath::Fast => self.paths.fast += 1,
                    WritePath::Rewritten => self.paths.rewritten += 1,
                    WritePath::ReaderLocked => self.paths.reader_locked += 1,
                }
            }
        }
    }
}

/// Merges the clients' measurements.
fn merge(outs: Vec<ClientOut>, time: TimeBase) -> Measured {
    let start = outs.iter().map(|o| o.start_ns).min().unwrap_or(0);
    let end = outs.iter().map(|o| o.end_ns).max().unwrap_or(0);
    let mut m =
        Measured { reads: Vec::new(), writes: Vec::new(), paths: Paths::default(), window_ns: end - start, time };
    for o in outs {
        m.reads.extend(o.reads);
        m.writes.extend(o.writes);
        m.paths.add(o.paths);
    }
    m
}

/// `swarm bench-register`.
pub fn run(a: &BenchArgs) -> Result<(), String> {
    let w = workload(a)?;
    // Fail on an unwritable report now, not after the run.
    let mut json_file = match &a.json {
        Some(p) => Some(File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))?),
        None => None,
    };
    let (measured, backend, flushes) = match run_on_backend(a, &w) {
        Ok(r) => r,
        Err(e) => {
            // No empty report is left behind.
            if let Some(p) = &a.json {
                drop(json_file.take());
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };
    let title = format!(
        "safe-guess register bench: {backend}; {} replicas, {} client(s), {} register(s), {} B values, \
         read ratio {}, {} ops/client after {} warm-up, seed {}",
        w.replicas, w.clients, w.registers, w.value_size, w.read_ratio, w.ops, w.warmup, w.seed
    );
    let report = Report::new(title, config_json(a, &w), &measured);
    print!("{}", report.text());
    let mut report_json = report.json();
    if let Some(f) = flushes {
        // Per operation of the clients, warm-up included (the counters run
        // from the first operation).
        let ops = (w.clients as u64 * (w.ops + w.warmup)).max(1) as f64;
        println!(
            "flushes (warm-up included): {} lines written back ({:.2}/op), {} invalidated ({:.2}/op), {} fences ({:.2}/op)",
            f.lines_written_back,
            f.lines_written_back as f64 / ops,
            f.lines_invalidated,
            f.lines_invalidated as f64 / ops,
            f.fences,
            f.fences as f64 / ops
        );
        report_json["flushes"] = json!({
            "lines_written_back": f.lines_written_back,
            "lines_invalidated": f.lines_invalidated,
            "fences": f.fences,
            "operations": w.clients as u64 * (w.ops + w.warmup),
        });
    }
    if let (Some(file), Some(path)) = (json_file.as_mut(), &a.json) {
        let text = serde_json::to_string_pretty(&report_json).map_err(|e| format!("cannot encode JSON: {e}"))?;
        writeln!(file, "{text}").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The workload the flags describe, after the checks between flags.
fn workload(a: &BenchArgs) -> Result<Workload, String> {
    if a.backend == Backend::Sim && a.inject_rtt_us != 0.0 {
        return Err("--inject-rtt-us applies to --backend shm and cxl (the simulator has its own latencies)".into());
    }
    if a.backend != Backend::Shm && a.dir.is_some() {
        return Err("--dir applies to --backend shm only (cxl: --path)".into());
    }
    if a.backend != Backend::Sim && a.sim_jitter {
        return Err("--sim-jitter applies to --backend sim only".into());
    }
    if a.backend != Backend::Cxl && !a.path.is_empty() {
        return Err("--path applies to --backend cxl only (shm: --dir)".into());
    }
    if a.backend != Backend::Cxl && a.flush.is_some() {
        return Err("--flush applies to --backend cxl only".into());
    }
    if a.backend == Backend::Cxl && a.path.is_empty() {
        return Err("--backend cxl needs --path PATH (a device-dax or a file; repeat for several)".into());
    }
    let meta_words = a.meta_words.unwrap_or(a.clients as u32);
    let layout = Layout::new(meta_words, a.value_size).map_err(|e| format!("impossible register layout: {e}"))?;
    Ok(Workload {
        clients: a.clients,
        replicas: a.replicas,
        value_size: a.value_size,
        ops: a.ops,
        warmup: a.warmup.unwrap_or(a.ops / 10),
        read_ratio: a.read_ratio,
        registers: a.registers,
        layout,
        seed: a.seed,
    })
}

/// Runs `w` on the chosen backend; also describes the backend in words,
/// and gives the flushes of a cxl run.
fn run_on_backend(
    a: &BenchArgs,
    w: &Workload,
) -> Result<(Measured, String, Option<swarm_backend_cxl::FlushStats>), String> {
    let rtt = std::time::Duration::from_secs_f64(a.inject_rtt_us / 1e6);
    Ok(match a.backend {
        Backend::Shm => {
            let place = a.dir.as_ref().map_or("in-process".to_string(), |d| d.display().to_string());
            (shm::run(w, a.dir.as_deref(), rtt)?, format!("shm ({place}, injected rtt {} µs)", a.inject_rtt_us), None)
        }
        Backend::Cxl => {
            let o = cxl::run(w, &a.path, a.flush.unwrap_or_default(), rtt)?;
            (o.measured, format!("cxl ({}, injected rtt {} µs)", o.place, a.inject_rtt_us), Some(o.flushes))
        }
        Backend::Sim => {
            let net =
                if a.sim_jitter { "rtt 1-3 µs, 1 in 20 messages 10x slower, reordered" } else { "fixed rtt 2 µs" };
            (sim::run(w, a.sim_jitter)?, format!("sim (virtual time, {net})"), None)
        }
    })
}

/// The configuration, for the JSON report.
fn config_json(a: &BenchArgs, w: &Workload) -> serde_json::Value {
    json!({
        "backend": match a.backend { Backend::Shm => "shm", Backend::Cxl => "cxl", Backend::Sim => "sim" },
        "dir": a.dir.as_ref().map(|d| d.display().to_string()),
        "path": a.path.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "flush": (a.backend == Backend::Cxl).then(|| a.flush.unwrap_or_default().name()),
        "clients": w.clients,
        "replicas": w.replicas,
        "value_size": w.value_size,
        "ops": w.ops,
        "warmup": w.warmup,
        "read_ratio": w.read_ratio,
        "registers": w.registers,
        "meta_words": w.layout.meta_words,
        "inject_rtt_us": a.inject_rtt_us,
        "sim_jitter": a.sim_jitter,
        "seed": w.seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(read_ratio: f64, registers: u32) -> Workload {
        Workload {
            clients: 2,
            replicas: 3,
            value_size: 64,
            ops: 1000,
            warmup: 100,
            read_ratio,
            registers,
            layout: Layout::new(2, 64).unwrap(),
            seed: 1,
        }
    }

    #[test]
    fn the_mix_follows_the_ratio_and_spreads_over_registers() {
        let w = workload(0.25, 4);
        let mut rng = swarm_core::sim::Rng::new(9);
        let (mut reads, mut per_reg) = (0, [0; 4]);
        for _ in 0..40_000 {
            let (r, read) = w.pick(rng.next_u64(), rng.next_u64());
            per_reg[r] += 1;
            reads += read as u32;
        }
        assert!((9_000..11_000).contains(&reads), "{reads}");
        assert!(per_reg.iter().all(|&n| (9_000..11_000).contains(&n)), "{per_reg:?}");
        assert!(!workload(0.0, 1).pick(0, u64::MAX).1);
        assert!(workload(1.0, 1).pick(0, u64::MAX).1);
    }

    #[test]
    fn own_nodes_fit_the_workload() {
        let w = workload(0.5, 1);
        let (size, geo) = w.own_nodes().unwrap();
        assert!(geo.capacity() >= w.writes_bound());
        assert!(size.is_multiple_of(4096) && size >= HEADER_SIZE + 3 * CHUNK);
        let big = Workload { layout: Layout::new(1, 65536).unwrap(), value_size: 65536, ..w };
        assert!(big.own_nodes().is_ok());
    }

    #[test]
    fn values_are_tagged() {
        let mut v = [0u8; 4];
        fill_value(&mut v, 3, 7);
        assert_eq!(v, [7, 0, 0, 0]);
        let mut e: [u8; 0] = [];
        fill_value(&mut e, 3, 7);
    }
}
