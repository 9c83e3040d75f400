//! Clients as tasks of the deterministic simulator: virtual time, exact
//! roundtrips, and a run that replays from its seed (the simulator's
//! network and every client's choices derive from it).
//!
//! The network has a fixed roundtrip of [`RTT_NS`], like the paper's
//! testbed (about 2 µs): operations one client posts to one node land in
//! order, as on RDMA queue pairs, so a client's background work is visible
//! to its next operation, as the paper's one-roundtrip figures assume.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use swarm_core::kv::{KvSystem, StoreConfig, System, Visit, Who};
use swarm_core::sim::{Sim, SimConfig, SimMemory};
use swarm_core::substrate::lease::Want;
use swarm_core::substrate::rtt::Counted;
use swarm_core::substrate::space::region::Region;
use swarm_core::systems;
use swarm_core::{Memory, NodeId};

use crate::runner::{ClientResult, Env, RunSpec, chooser, run_client};

/// The fixed roundtrip of the simulated network, ns.
pub const RTT_NS: u64 = 2_000;
/// Virtual time after which a run is declared stuck: an hour, about what
/// the clients' 32-bit microsecond clocks allow.
const TIME_LIMIT_NS: u64 = 3_600 * 1_000_000_000;
/// How often a client waiting at a gate looks again, virtual ns.
const GATE_POLL_NS: u64 = 1_000;

/// A client's clock: microsecond ticks of virtual time (never 0).
fn clock(m: &SimMemory) -> impl Fn() -> u64 + use<> {
    let m = m.clone();
    move || m.now() / 1_000 + 1
}

/// How one client task ended (`Err(None)`: stopped because another failed).
type ClientOutcome = Result<ClientResult, Option<String>>;

/// What the client tasks share.
#[derive(Default)]
struct Gate {
    arrived: Cell<usize>,
    generation: Cell<u64>,
    abort: Cell<bool>,
}

/// One task's view of the run.
struct SimEnv {
    mem: SimMemory,
    gate: Rc<Gate>,
    members: usize,
    progress: Option<Arc<AtomicU64>>,
}

impl Env for SimEnv {
    fn now_ns(&self) -> u64 {
        self.mem.now()
    }

    async fn gate(&self) -> bool {
        let g = &self.gate;
        let generation = g.generation.get();
        g.arrived.set(g.arrived.get() + 1);
        if g.arrived.get() == self.members {
            g.arrived.set(0);
            g.generation.set(generation + 1);
        } else {
            while g.generation.get() == generation && !g.abort.get() {
                self.mem.sleep(GATE_POLL_NS).await;
            }
        }
        !g.abort.get()
    }

    fn abort(&self) {
        self.gate.abort.set(true);
    }

    fn aborted(&self) -> bool {
        self.gate.abort.get()
    }

    fn progress(&self, n: u64) {
        if let Some(p) = &self.progress {
            p.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Formats every node of `mem` (`node_size` bytes each) for a store of
/// shape `cfg`: region headers, then the store and its record, whose clock
/// epoch is `epoch_us` (µs since the Unix epoch; the simulator's runs use
/// a fixed one, so that they replay byte for byte).
pub async fn format_cluster<M: Memory>(
    mem: &M,
    cfg: &StoreConfig,
    node_size: u64,
    epoch_us: u64,
) -> Result<(), String> {
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        Region::format(mem, node, node_size, StoreConfig::CHUNK)
            .await
            .map_err(|e| format!("cannot format {node}: {e}"))?;
    }
    systems::format(mem, cfg, epoch_us).await.map_err(|e| format!("cannot set up the {} store: {e}", cfg.system.name()))
}

/// Runs `system` in a fresh simulated cluster of `spec.replicas` nodes.
pub fn run_sim(spec: &RunSpec, system: System, progress: Option<Arc<AtomicU64>>) -> Result<ClientResult, String> {
    let cfg = spec.store_config(system);
    let size = spec.node_bytes(system);
    let sim_cfg = SimConfig {
        seed: spec.seed,
        nodes: spec.replicas,
        node_size: size,
        time_limit_ns: TIME_LIMIT_NS,
        fifo_per_queue: true,
        ..SimConfig::default()
    };
    let mut sim = Sim::new(sim_cfg.fixed_latency(RTT_NS));
    let admin = sim.client();
    let setup = cfg.clone();
    let stuck = |e| format!("{}: the simulation did not complete: {e}", system.name());
    sim.block_on(async move { format_cluster(&admin, &setup, size, 1).await }).map_err(stuck)??;
    let gate = Rc::new(Gate::default());
    let outs: Rc<RefCell<Vec<ClientOutcome>>> = Rc::default();
    systems::visit(system, Spawn { sim: &mut sim, spec, cfg, gate, outs: outs.clone(), progress });
    sim.run().map_err(stuck)?;
    let mut merged = ClientResult::default();
    let results = std::mem::take(&mut *outs.borrow_mut());
    if results.len() != spec.clients {
        return Err(format!("{}: the simulation lost a client", system.name()));
    }
    for r in results {
        match r {
            Ok(r) => merged.merge(&r),
            Err(Some(e)) => return Err(format!("{}: {e}", system.name())),
            Err(None) => {}
        }
    }
    Ok(merged)
}

/// The client tasks of [`run_sim`], with the system's type.
struct Spawn<'a> {
    sim: &'a mut Sim,
    spec: &'a RunSpec,
    cfg: StoreConfig,
    gate: Rc<Gate>,
    outs: Rc<RefCell<Vec<ClientOutcome>>>,
    progress: Option<Arc<AtomicU64>>,
}

impl Visit for Spawn<'_> {
    type Out = ();

    fn visit<S: KvSystem>(self) {
        let Spawn { sim, spec, cfg, gate, outs, progress } = self;
        let spec = Rc::new(spec.clone());
        let base = Rc::new(chooser(&spec));
        let cfg = Rc::new(cfg);
        for client in 0..spec.clients {
            let m = sim.client();
            let env = SimEnv { mem: m.clone(), gate: gate.clone(), members: spec.clients, progress: progress.clone() };
            let (spec, base, cfg, outs) = (spec.clone(), base.clone(), cfg.clone(), outs.clone());
            sim.spawn(&m, async move {
                let mut stores = Vec::with_capacity(spec.max_inflight());
                for h in 0..spec.max_inflight() {
                    // Each handle claims a leased id, as any process does.
                    let handle = (client * spec.max_inflight() + h) as u32;
                    let clk = clock(&env.mem);
                    let connected = match systems::claim(&env.mem, &cfg, &clk, Want::Any, handle).await {
                        Ok(held) => S::connect(Counted::new(env.mem.clone()), &cfg, Who::Lease(held), clk).await,
                        Err(e) => Err(e),
                    };
                    match connected {
                        Ok(s) => stores.push(s),
                        Err(e) => {
                            env.abort();
                            outs.borrow_mut().push(Err(Some(format!("client handle {handle} cannot connect: {e}"))));
                            return;
                        }
                    }
                }
                let r = run_client(&spec, client, stores, &base, &env).await;
                outs.borrow_mut().push(r);
            });
        }
    }
}
