//! The benchmark in the deterministic simulator: one task per client,
//! latencies in virtual time. Roundtrip counts are exact and the whole run
//! replays from `--seed`: the operation mix is drawn from the simulator's
//! own generator.
//!
//! The network is a fixed roundtrip of [`FIXED_RTT_NS`] by default: like
//! the FIFO queue pairs of RDMA, an operation posted after another to the
//! same node lands after it, so a client's background work (marking its
//! write VERIFIED, the in-place copy) is visible to its next operation, as
//! the paper's one-roundtrip figures assume. `--sim-jitter` selects the
//! simulator's default network instead: roundtrips of 1 to 3 µs, one
//! message in 20 ten times slower, and operations to one node reordered;
//! there a read that follows its own client's write often overtakes that
//! write's background work and takes extra roundtrips.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use swarm_core::sim::{Sim, SimConfig, SimError, SimMemory};
use swarm_core::swarm::client::ClientCtx;
use swarm_core::swarm::maxreg::{RegCache, Register};

use super::{CHUNK, ClientOut, Workload, check_memory, create_registers, fill_value, merge, one_op};
use crate::memnode::format_nodes;
use crate::report::{Measured, Sample, TimeBase};

/// Virtual time after which the run is declared stuck: an hour, about what
/// the clients' 32-bit microsecond clocks allow.
const TIME_LIMIT_NS: u64 = 3_600 * 1_000_000_000;
/// The roundtrip of the default (fixed) network, ns.
const FIXED_RTT_NS: u64 = 2_000;
/// How often a client at the start gate looks whether the others arrived.
const GATE_POLL_NS: u64 = 1_000;

/// What the client tasks share.
#[derive(Default)]
struct Shared {
    ready: Cell<usize>,
    abort: Cell<bool>,
    outs: RefCell<Vec<Result<ClientOut, Option<String>>>>,
}

/// A client's clock: microsecond ticks of virtual time (never 0).
fn clock(m: &SimMemory) -> impl Fn() -> u64 + use<> {
    let m = m.clone();
    move || m.now() / 1_000 + 1
}

/// A random word from the run's generator. (`random(0, u64::MAX)` would
/// overflow in `Rng::range`; one value less makes no difference here.)
fn draw(m: &SimMemory) -> u64 {
    m.random(0, u64::MAX - 1)
}

fn sim_error(e: SimError) -> String {
    format!("the simulation did not complete: {e}")
}

/// Runs `w` in a fresh simulated cluster of `w.replicas` nodes, on the
/// jittery network or the fixed one.
pub fn run(w: &Workload, jitter: bool) -> Result<Measured, String> {
    let (size, geo) = w.own_nodes()?;
    check_memory(w, w.replicas as u64 * size)?;
    let cfg = SimConfig {
        seed: w.seed,
        nodes: w.replicas,
        node_size: size,
        time_limit_ns: TIME_LIMIT_NS,
        ..SimConfig::default()
    };
    let mut sim = Sim::new(if jitter { cfg } else { cfg.fixed_latency(FIXED_RTT_NS) });
    let admin = sim.client();
    let setup = w.clone();
    let regs = sim
        .block_on(async move {
            format_nodes(&admin, size, CHUNK, geo).await?;
            create_registers(&setup, &admin, clock(&admin)).await
        })
        .map_err(sim_error)??;
    let regs = Rc::new(regs);
    let shared = Rc::new(Shared::default());
    for id in 1..=w.clients {
        let m = sim.client();
        let (w, regs, shared, mem) = (w.clone(), regs.clone(), shared.clone(), m.clone());
        sim.spawn(&m, async move {
            let res = client(id, &w, &regs, &mem, &shared).await;
            if matches!(res, Err(Some(_))) {
                shared.abort.set(true);
            }
            shared.outs.borrow_mut().push(res);
        });
    }
    sim.run().map_err(sim_error)?;
    let results = std::mem::take(&mut *shared.outs.borrow_mut());
    let mut outs = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(o) => outs.push(o),
            Err(Some(e)) => return Err(e),
            Err(None) => {}
        }
    }
    if outs.len() != w.clients as usize {
        return Err("the run was aborted".into());
    }
    Ok(merge(outs, TimeBase::Virtual))
}

/// One client task: warm-up, start gate, measured operations. `Err(None)`:
/// it stopped because another client failed.
async fn client(
    id: u8,
    w: &Workload,
    regs: &[Register],
    m: &SimMemory,
    shared: &Shared,
) -> Result<ClientOut, Option<String>> {
    let mut ctx = ClientCtx::new(id, clock(m)).map_err(|e| Some(format!("client {id}: cannot start: {e}")))?;
    let mut caches = vec![RegCache::default(); regs.len()];
    let mut value = vec![0u8; w.value_size as usize];
    let mut warm = ctx.prepare(m).await.map_err(|e| format!("client {id}: cannot start: {e}"));
    for seq in 0..w.warmup {
        if warm.is_err() {
            break;
        }
        let (r, read) = w.pick(draw(m), draw(m));
        fill_value(&mut value, id, seq);
        let read = read.then_some(value.len());
        warm = one_op(&mut ctx, m, &regs[r], &mut caches[r], read, &value).await.map(|_| ());
    }
    if warm.is_err() {
        shared.abort.set(true);
    }
    shared.ready.set(shared.ready.get() + 1);
    while shared.ready.get() < w.clients as usize && !shared.abort.get() {
        m.sleep(GATE_POLL_NS).await;
    }
    warm.map_err(Some)?;
    let mut out = ClientOut::with_capacity(w);
    out.start_ns = m.now();
    for seq in w.warmup..w.warmup + w.ops {
        if shared.abort.get() {
            return Err(None);
        }
        let (r, read) = w.pick(draw(m), draw(m));
        fill_value(&mut value, id, seq);
        let read = read.then_some(value.len());
        let t0 = m.now();
        let (roundtrips, path) = one_op(&mut ctx, m, &regs[r], &mut caches[r], read, &value).await.map_err(Some)?;
        out.record(Sample { latency_ns: m.now() - t0, roundtrips }, path);
    }
    out.end_ns = m.now();
    Ok(out)
}
