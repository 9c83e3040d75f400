//! Clients as tasks of the deterministic simulator: virtual time, exact
//! roundtrips, and a run that replays from its seed (the simulator's
//! network and every client's choices derive from it).
//!
//! The network has a fixed roundtrip of [`RTT_NS`], like the paper's
//! testbed (about 2 µs): operations one client posts to one node land in
//! order, as on RDMA queue pairs, so a client's background work is visible
//! to its next operation, as the paper's one-roundtrip figures assume.
//!
//! Faults ([`crate::fault`]) are scheduled in virtual time once the
//! measured phase's origin is known: a failure is a fail-fast crash
//! ([`Sim::crash_node_at`]), permanent (the simulator cannot bring a node
//! back, so a failure with a duration is refused, see [`check_faults`]);
//! a stall is [`Sim::stall_node_at`], to the fault's end or the run's.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};

use swarm_core::check::kv::start_server;
use swarm_core::kv::{KvSystem, StoreConfig, System, Visit, Who};
use swarm_core::sim::{CrashMode, ServerShell, Sim, SimConfig, SimMemory};
use swarm_core::substrate::lease::Want;
use swarm_core::substrate::rtt::Counted;
use swarm_core::substrate::space::region::Region;
use swarm_core::systems;
use swarm_core::{Memory, NodeId};

use crate::fault::{FaultKind, NodeFault};
use crate::runner::{ClientResult, Env, MemoryUse, RunSpec, chooser, run_client};

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
    /// When the last gate opened, virtual ns.
    opened: Cell<u64>,
    abort: Cell<bool>,
    /// The measured phase's origin, once a client began it.
    measuring: Cell<Option<u64>>,
    /// Woken when the measured phase begins or the run is aborted.
    watcher: RefCell<Option<Waker>>,
}

impl Gate {
    fn wake_watcher(&self) {
        if let Some(w) = self.watcher.borrow_mut().take() {
            w.wake();
        }
    }
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

    async fn gate(&self) -> Option<u64> {
        let g = &self.gate;
        let generation = g.generation.get();
        g.arrived.set(g.arrived.get() + 1);
        if g.arrived.get() == self.members {
            g.arrived.set(0);
            g.opened.set(self.mem.now());
            g.generation.set(generation + 1);
        } else {
            while g.generation.get() == generation && !g.abort.get() {
                self.mem.sleep(GATE_POLL_NS).await;
            }
        }
        (!g.abort.get()).then(|| g.opened.get())
    }

    fn measure_begins(&self, origin_ns: u64) {
        if self.gate.measuring.get().is_none() {
            self.gate.measuring.set(Some(origin_ns));
            self.gate.wake_watcher();
        }
    }

    fn abort(&self) {
        self.gate.abort.set(true);
        self.gate.wake_watcher();
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
    // The system's server, if it has one, as a task of its own; the last
    // client to end stops it.
    let server = start_server(&mut sim, &cfg);
    let spawn = Spawn { sim: &mut sim, spec, cfg, gate: gate.clone(), outs: outs.clone(), progress, server };
    systems::visit(system, spawn);
    if let Some(t) = spec.timed.as_ref().filter(|t| !t.faults.is_empty()) {
        // Runs until the first client begins the measured phase (or the
        // run is aborted), then schedules the faults from its origin.
        if let Some(origin) = sim.block_on(measure_origin(gate)).map_err(stuck)? {
            for f in &t.faults {
                schedule(&mut sim, f, origin, t.run_ns);
            }
        }
    }
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
    let (mem, keys) = (sim.client(), MemoryUse::keys_after(spec, &merged));
    merged.memory = sim.block_on(async move { MemoryUse::of(&mem, keys).await.ok() }).ok().flatten();
    Ok(merged)
}

/// Refuses the faults the simulator cannot model: a failure that ends (a
/// crashed node there stays crashed).
pub fn check_faults(faults: &[NodeFault]) -> Result<(), String> {
    match faults.iter().find(|f| f.kind == FaultKind::Fail && f.duration_ns.is_some()) {
        Some(f) => Err(format!(
            "fault {f}: the simulator cannot bring a failed node back; give fail without +DURATION (a crash to the \
             end of the run) or a stall"
        )),
        None => Ok(()),
    }
}

/// The measured phase's origin, once a client began it; `None` if the run
/// was aborted first.
async fn measure_origin(gate: Rc<Gate>) -> Option<u64> {
    poll_fn(|cx| match gate.measuring.get() {
        Some(origin) => Poll::Ready(Some(origin)),
        None if gate.abort.get() => Poll::Ready(None),
        None => {
            *gate.watcher.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    })
    .await
}

/// Schedules `f` in a run whose measured phase of `run_ns` began at
/// `origin` (virtual ns).
fn schedule(sim: &mut Sim, f: &NodeFault, origin: u64, run_ns: u64) {
    let at = origin + f.start_ns;
    match f.kind {
        FaultKind::Fail => sim.crash_node_at(f.node, at, CrashMode::FailFast),
        FaultKind::Stall => sim.stall_node_at(f.node, at, f.end_ns(run_ns) - f.start_ns),
    }
}

/// The client tasks of [`run_sim`], with the system's type.
struct Spawn<'a> {
    sim: &'a mut Sim,
    spec: &'a RunSpec,
    cfg: StoreConfig,
    gate: Rc<Gate>,
    outs: Rc<RefCell<Vec<ClientOutcome>>>,
    progress: Option<Arc<AtomicU64>>,
    server: Option<ServerShell>,
}

impl Visit for Spawn<'_> {
    type Out = ();

    fn visit<S: KvSystem>(self) {
        let Spawn { sim, spec, cfg, gate, outs, progress, server } = self;
        let spec = Rc::new(spec.clone());
        let base = Rc::new(chooser(&spec));
        let cfg = Rc::new(cfg);
        for client in 0..spec.clients {
            let m = sim.client();
            let env = SimEnv { mem: m.clone(), gate: gate.clone(), members: spec.clients, progress: progress.clone() };
            let (spec, base, cfg, outs, server) =
                (spec.clone(), base.clone(), cfg.clone(), outs.clone(), server.clone());
            let clients = spec.clients;
            let ended = move |outs: &RefCell<Vec<ClientOutcome>>, r: ClientOutcome| {
                outs.borrow_mut().push(r);
                if outs.borrow().len() == clients
                    && let Some(s) = &server
                {
                    s.stop();
                }
            };
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
                            ended(&outs, Err(Some(format!("client handle {handle} cannot connect: {e}"))));
                            return;
                        }
                    }
                }
                let r = run_client(&spec, client, stores, &base, &env).await;
                ended(&outs, r);
            });
        }
    }
}
