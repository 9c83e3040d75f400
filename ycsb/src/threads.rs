//! Clients as OS threads on real memory (shared memory, DAX/CXL, RDMA):
//! one thread per client, each driving its handles with the core's spin
//! [`block_on`], latencies on the wall clock.
//!
//! Worker processes (`--processes`) run this too, for their share of the
//! clients; their gate then also waits for the other processes (a hook
//! that the last local thread to arrive runs).
//!
//! With faults and a [`FaultControl`] (the cluster's nodes), an
//! [`Injector`] thread runs beside the clients, from the measured phase's
//! origin, and heals the nodes before [`run_threads`] returns. (Worker
//! processes get none: their parent injects.)

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use swarm_core::Memory;
use swarm_core::kv::{KvSystem, StoreConfig, System, Visit, Who};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::lease::Want;
use swarm_core::substrate::rtt::Counted;
use swarm_core::systems;

use crate::fault::{FaultControl, Injector};
use crate::runner::{ClientResult, Env, RunSpec, chooser, run_client};

/// Stack of each client thread: store handles are large while they are
/// built inside a future that lives on the stack.
const STACK: usize = 16 << 20;

/// What the last thread to reach a gate runs before opening it (the
/// exchange with the other processes); `false` aborts the run.
pub type GateHook<'a> = &'a (dyn Fn() -> bool + Sync);

/// What [`run_threads`] may be given besides the clients' work.
#[derive(Default)]
pub struct Extras<'a> {
    /// Run by the last thread to reach a gate (worker processes).
    pub hook: Option<GateHook<'a>>,
    /// Where the clients count their operations (progress bars).
    pub progress: Option<Arc<AtomicU64>>,
    /// What sets the nodes' state, to inject the run's faults.
    pub faults: Option<&'a dyn FaultControl>,
    /// Whether to run the system's server beside its node for the run
    /// ([`systems::with_server`]): where this process runs the whole run, not one
    /// worker process's share of it.
    pub serve: bool,
}

/// The threads' shared state: clock, gate, abort flag, progress counter.
pub struct ThreadEnv<'a> {
    base: Instant,
    abort: AtomicBool,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    /// When the last gate opened, ns after `base`.
    opened: AtomicU64,
    members: usize,
    hook: Option<GateHook<'a>>,
    progress: Option<Arc<AtomicU64>>,
    injector: Option<&'a Injector<'a>>,
}

impl<'a> ThreadEnv<'a> {
    /// For `members` threads.
    pub fn new(members: usize, hook: Option<GateHook<'a>>, progress: Option<Arc<AtomicU64>>) -> Self {
        ThreadEnv {
            base: Instant::now(),
            abort: AtomicBool::new(false),
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            opened: AtomicU64::new(0),
            members,
            hook,
            progress,
            injector: None,
        }
    }
}

impl Env for ThreadEnv<'_> {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    async fn gate(&self) -> Option<u64> {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.members {
            self.arrived.store(0, Ordering::Release);
            if !self.hook.is_none_or(|h| h()) {
                self.abort();
            }
            // Read by the others once they see the new generation; not
            // written again before every one of them reached the next gate.
            self.opened.store(self.now_ns(), Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::AcqRel);
        } else {
            // Sleep rather than spin: the machine may have fewer cores than
            // threads, and the ones still working need them.
            while self.generation.load(Ordering::Acquire) == generation && !self.aborted() {
                thread::sleep(Duration::from_micros(50));
            }
        }
        (!self.aborted()).then(|| self.opened.load(Ordering::Relaxed))
    }

    fn measure_begins(&self, origin_ns: u64) {
        if let Some(i) = self.injector {
            i.begin(self.base + Duration::from_nanos(origin_ns));
        }
    }

    fn abort(&self) {
        self.abort.store(true, Ordering::Release);
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    fn progress(&self, n: u64) {
        if let Some(p) = &self.progress {
            p.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Aborts the run if its thread unwinds, so that no client waits forever
/// at a gate for one that crashed.
struct AbortOnPanic<'a, 'b>(&'a ThreadEnv<'b>);

impl Drop for AbortOnPanic<'_, '_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.abort();
        }
    }
}

/// Runs clients `clients` (0-based numbers among `spec.clients`) of
/// `system`'s store, formatted on the nodes that `make` reaches, one
/// thread each; every handle gets its own memory from `make`; injects the
/// run's faults if `extras` has a control. Returns their measurements
/// merged.
pub fn run_threads<M: Memory, F: Fn() -> M + Sync>(
    spec: &RunSpec,
    system: System,
    clients: Range<usize>,
    make: F,
    clock: SystemClock,
    extras: Extras<'_>,
) -> Result<ClientResult, String> {
    let cfg = spec.store_config(system);
    let injector = match (extras.faults, &spec.timed) {
        (Some(control), Some(t)) if !t.faults.is_empty() => Some(Injector::new(&t.faults, t.run_ns, control)),
        _ => None,
    };
    let mut env = ThreadEnv::new(clients.len(), extras.hook, extras.progress);
    env.injector = injector.as_ref();
    let (results, injected) = thread::scope(|s| {
        let injecting = injector.as_ref().map(|i| s.spawn(|| i.run()));
        let threads = || systems::visit(system, Threads { spec, cfg: &cfg, clients, make: &make, clock, env: &env });
        let results = if extras.serve { systems::with_server(&cfg, &make, threads) } else { threads() };
        // The clients are done: the injector heals what it faulted.
        let injected = match (&injector, injecting) {
            (Some(i), Some(h)) => {
                i.stop();
                h.join().unwrap_or_else(|_| Err("the fault injector crashed (a bug)".into()))
            }
            _ => Ok(()),
        };
        (results, injected)
    });
    injected.map_err(|e| format!("{}: {e}", system.name()))?;
    let mut merged = ClientResult::default();
    let mut aborted = false;
    for r in results {
        match r {
            Ok(r) => merged.merge(&r),
            Err(Some(e)) => return Err(format!("{}: {e}", system.name())),
            Err(None) => aborted = true,
        }
    }
    if aborted {
        return Err(format!("{}: the run was aborted", system.name()));
    }
    Ok(merged)
}

/// How one client thread ended (`Err(None)`: stopped because another failed).
type Outcome = Result<ClientResult, Option<String>>;

/// The threads of [`run_threads`], with the system's type.
struct Threads<'a, 'h, F> {
    spec: &'a RunSpec,
    cfg: &'a StoreConfig,
    clients: Range<usize>,
    make: &'a F,
    clock: SystemClock,
    env: &'a ThreadEnv<'h>,
}

impl<M: Memory, F: Fn() -> M + Sync> Visit for Threads<'_, '_, F> {
    type Out = Vec<Outcome>;

    fn visit<S: KvSystem>(self) -> Vec<Outcome> {
        let Threads { spec, cfg, clients, make, clock, env } = self;
        let base = chooser(spec);
        thread::scope(|s| {
            let mut handles = Vec::new();
            for client in clients.clone() {
                let base = &base;
                let body = move || {
                    let _guard = AbortOnPanic(env);
                    // Two futures, not one: the stores are built in the first,
                    // whose poll needs a stack frame as large as a store (tens
                    // of KiB, probed page by page on every poll); polls of the
                    // measured one do not pay for that frame. (In one future,
                    // the probes made RAW's gets 0.6 µs slower on cxl.)
                    let stores = block_on(async {
                        let mut stores = Vec::with_capacity(spec.max_inflight());
                        for h in 0..spec.max_inflight() {
                            // Each handle claims a leased id, as any process does.
                            let handle = (client * spec.max_inflight() + h) as u32;
                            let nonce = std::process::id() << 12 ^ handle;
                            let mem = make();
                            let connected = match systems::claim(&mem, cfg, &clock, Want::Any, nonce).await {
                                Ok(held) => S::connect(Counted::new(mem), cfg, Who::Lease(held), clock).await,
                                Err(e) => Err(e),
                            };
                            match connected {
                                Ok(s) => stores.push(s),
                                Err(e) => {
                                    env.abort();
                                    return Err(Some(format!("client handle {handle} cannot connect: {e}")));
                                }
                            }
                        }
                        Ok(stores)
                    })?;
                    block_on(run_client(spec, client, stores, base, env))
                };
                let spawned =
                    thread::Builder::new().name(format!("client-{client}")).stack_size(STACK).spawn_scoped(s, body);
                match spawned {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        env.abort();
                        handles.clear();
                        return vec![Err(Some(format!("cannot start a client thread: {e}")))];
                    }
                }
            }
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Some("a client thread crashed (a bug)".into()))))
                .collect()
        })
    }
}
