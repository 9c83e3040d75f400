//! The benchmark on shared memory: one OS thread per client, each with its
//! own [`ShmMemory`](swarm_backend_shm::ShmMemory) handle, driven by [`block_on`]; latency on the wall
//! clock. The threaded runner ([`run_threads`]) and the check of an existing
//! cluster ([`check_room`]) serve every backend with real memory (cxl too).
//!
//! The nodes are in-process memory sized for the run, or the cluster that
//! `swarm memnode create` made in `--dir` (other processes may use it too).
//! Clients warm up, wait for each other at a start gate, and then run their
//! measured operations together, so that the measured window is one of full
//! concurrency.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use swarm_backend_shm::ShmCluster;
use swarm_core::sim::Rng;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::region::Region;
use swarm_core::swarm::client::ClientCtx;
use swarm_core::swarm::maxreg::{RegCache, Register};
use swarm_core::swarm::writerlog::Logs;
use swarm_core::{Memory, NodeId};

use super::{ClientOut, Workload, check_memory, create_registers, fill_value, merge, one_op};
use crate::args::format_size;
use crate::memnode::format_nodes;
use crate::report::{Measured, Sample, TimeBase};

/// Runs `w` on in-process memory, or on the cluster in `dir`.
pub fn run(w: &Workload, dir: Option<&Path>, rtt: Duration) -> Result<Measured, String> {
    let cluster = match dir {
        None => in_process(w)?,
        Some(dir) => {
            check_memory(w, 0)?;
            existing(w, dir)?
        }
    };
    let (measured, _) = run_threads(w, || cluster.memory().with_latency(rtt))?;
    Ok(measured)
}

/// Runs `w` with one thread per client, each with its own handle from
/// `make`, on nodes that are formatted and have room; returns the
/// measurements and the clients' handles (with whatever they counted).
pub fn run_threads<M: Memory + Send>(w: &Workload, make: impl Fn() -> M) -> Result<(Measured, Vec<M>), String> {
    let clock = SystemClock::starting_now();
    let regs = block_on(create_registers(w, &make(), clock))?;
    let gate = Gate { ready: AtomicUsize::new(0), abort: AtomicBool::new(false), clients: w.clients as usize };
    let base = Instant::now();
    let (results, spawn_error) = thread::scope(|s| {
        let mut handles = Vec::new();
        let mut spawn_error = None;
        for id in 1..=w.clients {
            let mem = make();
            let (regs, gate) = (&regs, &gate);
            let body = move || {
                let _guard = AbortOnPanic(&gate.abort);
                let res = client(id, w, regs, mem, clock, gate, base);
                if matches!(res, Err(Some(_))) {
                    gate.abort.store(true, Ordering::Relaxed);
                }
                res
            };
            match thread::Builder::new().name(format!("client-{id}")).spawn_scoped(s, body) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    gate.abort.store(true, Ordering::Relaxed);
                    spawn_error = Some(format!("cannot start the thread of client {id}: {e}"));
                    break;
                }
            }
        }
        let results: Vec<Result<(ClientOut, M), Option<String>>> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| h.join().unwrap_or_else(|_| Err(Some(format!("client {} crashed (a bug)", i + 1)))))
            .collect();
        (results, spawn_error)
    });
    if let Some(e) = spawn_error {
        return Err(e);
    }
    let mut outs = Vec::with_capacity(results.len());
    let mut mems = Vec::with_capacity(results.len());
    let mut aborted = false;
    for r in results {
        match r {
            Ok((o, m)) => {
                outs.push(o);
                mems.push(m);
            }
            Err(Some(e)) => return Err(e),
            Err(None) => aborted = true,
        }
    }
    if aborted {
        return Err("the run was aborted".into());
    }
    Ok((merge(outs, TimeBase::Wall), mems))
}

/// In-process nodes sized for `w`, formatted.
fn in_process(w: &Workload) -> Result<ShmCluster, String> {
    let (size, geo) = w.own_nodes()?;
    check_memory(w, w.replicas as u64 * size)?;
    let cluster = ShmCluster::in_process(w.replicas, size).map_err(|e| e.to_string())?;
    cluster.prefault().map_err(|e| e.to_string())?;
    block_on(format_nodes(&cluster.memory(), size, super::CHUNK, geo))?;
    Ok(cluster)
}

/// The cluster in `dir`, after checking that it can hold the run.
fn existing(w: &Workload, dir: &Path) -> Result<ShmCluster, String> {
    let cluster = ShmCluster::open(dir).map_err(|e| e.to_string())?;
    check_room(w, &cluster.memory(), &dir.display().to_string(), "swarm memnode create")?;
    Ok(cluster)
}

/// Checks that the formatted nodes that `mem` reaches (at `place`) can hold
/// the run: enough nodes, values that fit, room in the logs and the regions.
/// `how` says how to make such a cluster.
pub fn check_room<M: Memory>(w: &Workload, mem: &M, place: &str, how: &str) -> Result<(), String> {
    let nodes = mem.node_count();
    if w.replicas > nodes {
        return Err(format!(
            "--replicas {} needs {} nodes, but the cluster at {place} has {nodes}",
            w.replicas, w.replicas
        ));
    }
    let mut logs = Logs::new();
    for n in 0..w.replicas {
        let node = NodeId(n as u16);
        let not_formatted =
            |e: String| format!("{place}: {node} is not formatted for SWARM ({e}); create clusters with `{how}`");
        let region = block_on(Region::open(mem, node)).map_err(|e| not_formatted(e.to_string()))?;
        let geo = block_on(logs.geometry(mem, node)).map_err(|e| not_formatted(e.to_string()))?;
        if w.value_size > geo.max_value() {
            return Err(format!(
                "the cluster at {place} holds values of up to {} bytes, not {} (see `{how} --max-value`)",
                geo.max_value(),
                w.value_size
            ));
        }
        if w.writes_bound() > geo.capacity() {
            return Err(format!(
                "{} writes per client exceed the {} a writer log of the cluster at {place} holds",
                w.writes_bound(),
                geo.capacity(),
            ));
        }
        let need = w.chunks_needed(region.chunk, geo.per_segment)?.saturating_mul(region.chunk);
        let free = region.size - region.cursor;
        if need > free {
            return Err(format!(
                "{node} of the cluster at {place} has {} free, but this run may need {} (memory is never recycled: \
                 use a new or bigger cluster, or fewer --ops)",
                format_size(free),
                format_size(need)
            ));
        }
    }
    Ok(())
}

/// Where clients wait for each other before measuring, and learn that
/// another one failed.
struct Gate {
    ready: AtomicUsize,
    abort: AtomicBool,
    clients: usize,
}

impl Gate {
    /// Waits until every client is ready; `false` if the run was aborted.
    fn pass(&self) -> bool {
        self.ready.fetch_add(1, Ordering::AcqRel);
        while self.ready.load(Ordering::Acquire) < self.clients {
            if self.aborted() {
                return false;
            }
            thread::yield_now();
        }
        !self.aborted()
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
}

/// Aborts the run if its thread unwinds, so that no client waits forever
/// at the gate for a client that crashed.
struct AbortOnPanic<'a>(&'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// One client thread: warm-up, gate, measured operations. `Err(None)`: it
/// stopped because another client failed.
fn client<M: Memory>(
    id: u8,
    w: &Workload,
    regs: &[Register],
    mem: M,
    clock: SystemClock,
    gate: &Gate,
    base: Instant,
) -> Result<(ClientOut, M), Option<String>> {
    client_ops(id, w, regs, &mem, clock, gate, base).map(|out| (out, mem))
}

/// The body of [`client`].
fn client_ops<M: Memory>(
    id: u8,
    w: &Workload,
    regs: &[Register],
    mem: &M,
    clock: SystemClock,
    gate: &Gate,
    base: Instant,
) -> Result<ClientOut, Option<String>> {
    let setup = |e| Some(format!("client {id}: cannot start: {e}"));
    let mut ctx = ClientCtx::new(id, clock).map_err(setup)?;
    let warm: Result<_, Option<String>> = (|| {
        block_on(ctx.prepare(mem)).map_err(setup)?;
        let mut caches = vec![RegCache::default(); regs.len()];
        let mut rng = Rng::new(w.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut value = vec![0u8; w.value_size as usize];
        for seq in 0..w.warmup {
            let (r, read) = w.pick(rng.next_u64(), rng.next_u64());
            fill_value(&mut value, id, seq);
            let read = read.then_some(value.len());
            block_on(one_op(&mut ctx, mem, &regs[r], &mut caches[r], read, &value)).map_err(Some)?;
        }
        Ok((caches, rng, value))
    })();
    if warm.is_err() {
        gate.abort.store(true, Ordering::Relaxed);
    }
    let passed = gate.pass();
    let (mut caches, mut rng, mut value) = warm?;
    if !passed {
        return Err(None);
    }
    let mut out = ClientOut::with_capacity(w);
    let start = Instant::now();
    for seq in w.warmup..w.warmup + w.ops {
        if gate.aborted() {
            return Err(None);
        }
        let (r, read) = w.pick(rng.next_u64(), rng.next_u64());
        fill_value(&mut value, id, seq);
        let read = read.then_some(value.len());
        let t0 = Instant::now();
        let (roundtrips, path) =
            block_on(one_op(&mut ctx, mem, &regs[r], &mut caches[r], read, &value)).map_err(Some)?;
        let latency_ns = t0.elapsed().as_nanos() as u64;
        out.record(Sample { latency_ns, roundtrips }, path);
    }
    let end = Instant::now();
    out.start_ns = start.duration_since(base).as_nanos() as u64;
    out.end_ns = end.duration_since(base).as_nanos() as u64;
    Ok(out)
}
