//! A deterministic simulated memory, and the executor that runs clients on it.
//!
//! Everything is driven by one seeded generator and a virtual clock, so a run
//! is a pure function of its seed and its workload: the same seed replays the
//! same interleaving byte for byte ([`Sim::digest`] fingerprints it), and a
//! failing seed is a reproducible bug report.
//!
//! What it models (DESIGN.md, "Timing, roundtrips and faults"):
//! - per-operation latency drawn in `[min_latency_ns, max_latency_ns]`;
//!   operations posted together overlap, and operations to different nodes
//!   (or separate operations to one node) complete in any order;
//! - non-atomic reads and writes: long transfers are applied in pieces at
//!   distinct instants, so concurrent readers see torn data;
//! - node crashes ([`CrashMode`]: fail fast, or hang until the timeout) and
//!   slow nodes;
//! - client crashes: the client's tasks are dropped mid-operation, and its
//!   transfers in flight are cut short at a random point;
//! - slow and stalled clients (a server on a loaded CPU, a paused process),
//!   and local accesses (a receiver polling its inbox, `local_latency_ns`).
//!
//! The executor polls tasks when they are woken and otherwise advances the
//! clock to the next event. A run ends when every task finished or crashed;
//! it fails if tasks remain with nothing left to happen (a lost wake-up or a
//! deadlock) or if virtual time passes the configured limit (a livelock: an
//! operation that is not wait-free).

mod memory;
mod rng;
mod shell;
mod world;

use alloc::boxed::Box;
use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::task::Wake;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::{Context, Poll, Waker};

pub use memory::SimMemory;
pub use rng::Rng;
pub use shell::ServerShell;
pub use world::{CrashMode, TraceEntry};
use world::{Event, World};

/// The simulated cluster and network.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed every random choice derives from.
    pub seed: u64,
    /// Number of memory nodes.
    pub nodes: usize,
    /// Bytes per node.
    pub node_size: u64,
    /// Shortest roundtrip, ns.
    pub min_latency_ns: u64,
    /// Longest roundtrip (before slow-node factors), ns.
    pub max_latency_ns: u64,
    /// Largest gap between the pieces of one transfer, ns.
    pub max_piece_gap_ns: u64,
    /// One message in `tail_one_in` (0: none) is delayed `tail_factor` times
    /// longer: the heavy tail of a congested fabric, which makes the late
    /// messages that protocols must tolerate common enough to be explored.
    pub tail_one_in: u64,
    /// Delay multiplier of a tail message.
    pub tail_factor: u64,
    /// Operations of one client to one node are applied in the order they
    /// were posted, as on an RDMA reliable-connected queue pair (one per
    /// client and node). Off, separate posts may overtake each other, which
    /// is more adversarial: protocols must only rely on ordered pipelines.
    pub fifo_per_queue: bool,
    /// Roundtrip of a local access: a receiver polling its own inbox
    /// (`Memory::read_inbox`), ns.
    pub local_latency_ns: u64,
    /// How long a client waits on a hung node before [`crate::MemErrorKind::TimedOut`], ns.
    pub timeout_ns: u64,
    /// Virtual time after which a run is declared a livelock, ns.
    pub time_limit_ns: u64,
    /// Keep every [`TraceEntry`] (the digest is always kept).
    pub keep_trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            nodes: 3,
            node_size: 1 << 20,
            min_latency_ns: 1_000,
            max_latency_ns: 3_000,
            max_piece_gap_ns: 200,
            tail_one_in: 20,
            tail_factor: 10,
            fifo_per_queue: false,
            local_latency_ns: 100,
            timeout_ns: 50_000,
            time_limit_ns: 10_000_000_000,
            keep_trace: false,
        }
    }
}

impl SimConfig {
    /// Latency that is the same for every operation (`rtt_ns`), no tail and
    /// no torn pieces spread in time: the setting for counting roundtrips
    /// exactly.
    pub fn fixed_latency(mut self, rtt_ns: u64) -> Self {
        self.min_latency_ns = rtt_ns;
        self.max_latency_ns = rtt_ns;
        self.max_piece_gap_ns = 0;
        self.tail_one_in = 0;
        self
    }
}

/// Why a run did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// Tasks are waiting but nothing is scheduled to wake them.
    Stuck {
        /// Virtual time when it was noticed.
        time: u64,
        /// Tasks still alive.
        tasks: usize,
    },
    /// Virtual time passed `time_limit_ns` with tasks still running.
    TimeLimit {
        /// Tasks still alive.
        tasks: usize,
    },
    /// [`Sim::block_on`]'s future was dropped by a crash of its client.
    Crashed,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Stuck { time, tasks } => write!(f, "{tasks} task(s) stuck at t={time}ns with nothing scheduled"),
            SimError::TimeLimit { tasks } => write!(f, "{tasks} task(s) still running at the time limit"),
            SimError::Crashed => write!(f, "the task was dropped by a client crash"),
        }
    }
}

impl core::error::Error for SimError {}

/// What a completed run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunStats {
    /// Virtual time at the end, ns.
    pub end_time: u64,
    /// Events processed.
    pub events: u64,
    /// Fingerprint of everything that happened to memory.
    pub digest: u64,
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Task {
    client: Option<u32>,
    fut: Pin<Box<dyn Future<Output = ()>>>,
    woken: Arc<Flag>,
    waker: Waker,
}

/// The simulator: memory nodes, network, clients and their tasks.
pub struct Sim {
    world: Rc<RefCell<World>>,
    tasks: Vec<Option<Task>>,
    next_client: u32,
}

impl Sim {
    /// A fresh cluster with zeroed nodes.
    pub fn new(cfg: SimConfig) -> Self {
        Sim { world: Rc::new(RefCell::new(World::new(cfg))), tasks: Vec::new(), next_client: 0 }
    }

    /// A new client.
    pub fn client(&mut self) -> SimMemory {
        self.next_client += 1;
        SimMemory { world: self.world.clone(), client: self.next_client }
    }

    /// Runs `fut` as a task of `client` (dropped if that client crashes).
    pub fn spawn(&mut self, client: &SimMemory, fut: impl Future<Output = ()> + 'static) {
        self.spawn_task(Some(client.client), Box::pin(fut));
    }

    fn spawn_task(&mut self, client: Option<u32>, fut: Pin<Box<dyn Future<Output = ()>>>) {
        let woken = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(woken.clone());
        self.tasks.push(Some(Task { client, fut, woken, waker }));
    }

    /// Crashes `node` at virtual time `at`.
    pub fn crash_node_at(&mut self, node: usize, at: u64, mode: CrashMode) {
        self.world.borrow_mut().schedule(at, Event::CrashNode { node, mode });
    }

    /// Brings a crashed `node` back at virtual time `at`, with the memory
    /// it had (a node that restarts over persistent memory, or a healed
    /// partition): what reached it while it was down stays lost.
    pub fn heal_node_at(&mut self, node: usize, at: u64) {
        self.world.borrow_mut().schedule(at, Event::HealNode { node });
    }

    /// Makes `node`'s latency `factor` times longer from `at` on.
    pub fn slow_node_at(&mut self, node: usize, at: u64, factor: u64) {
        self.world.borrow_mut().schedule(at, Event::SlowNode { node, factor });
    }

    /// Stalls `node` from `at` for `ns`: what reaches it meanwhile waits,
    /// and is applied when the stall ends (answered then, or timed out by
    /// the client after [`SimConfig::timeout_ns`]). A node that is slow for
    /// a while, not a crash: nothing is lost.
    pub fn stall_node_at(&mut self, node: usize, at: u64, ns: u64) {
        self.world.borrow_mut().schedule(at, Event::StallNode { node, until: at.saturating_add(ns) });
    }

    /// Crashes `client` at virtual time `at`: its tasks are dropped wherever
    /// they are, and its transfers in flight are cut short.
    pub fn crash_client_at(&mut self, client: &SimMemory, at: u64) {
        self.world.borrow_mut().schedule(at, Event::CrashClient { client: client.client });
    }

    /// Makes every operation of `client` `factor` times slower from `at` on
    /// (a server whose CPU is loaded).
    pub fn slow_client_at(&mut self, client: &SimMemory, at: u64, factor: u64) {
        self.world.borrow_mut().schedule(at, Event::SlowClient { client: client.client, factor });
    }

    /// Stalls `client` from `at` for `ns`: its tasks are not polled
    /// meanwhile (a paused process); its operations in flight still land.
    pub fn stall_client_at(&mut self, client: &SimMemory, at: u64, ns: u64) {
        self.world
            .borrow_mut()
            .schedule(at, Event::StallClient { client: client.client, until: at.saturating_add(ns) });
    }

    /// Virtual time, ns.
    pub fn now(&self) -> u64 {
        self.world.borrow().now
    }

    /// Fingerprint of everything that happened to memory so far.
    pub fn digest(&self) -> u64 {
        self.world.borrow().digest
    }

    /// The trace, if `keep_trace` was set.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.world.borrow().trace.clone()
    }

    /// A random number from the run's generator.
    pub fn random(&self, lo: u64, hi: u64) -> u64 {
        self.world.borrow_mut().rng.range(lo, hi)
    }

    /// A copy of `len` bytes of `node` at `offset`, read outside of virtual
    /// time (for checks after a run); `None` if out of range.
    pub fn peek(&self, node: usize, offset: u64, len: usize) -> Option<Vec<u8>> {
        self.world.borrow().peek(node, usize::try_from(offset).ok()?, len).map(|b| b.to_vec())
    }

    /// Runs every task to completion (or crash).
    pub fn run(&mut self) -> Result<RunStats, SimError> {
        self.run_until(|_| false)
    }

    /// Runs `fut` to completion, along with every other task, and returns its
    /// output. Tasks still alive when it completes keep their state for a
    /// later `run`.
    pub fn block_on<T: 'static>(&mut self, fut: impl Future<Output = T> + 'static) -> Result<T, SimError> {
        let out: Rc<RefCell<Option<T>>> = Rc::new(RefCell::new(None));
        let slot = out.clone();
        let index = self.tasks.len();
        self.spawn_task(
            None,
            Box::pin(async move {
                let v = fut.await;
                *slot.borrow_mut() = Some(v);
            }),
        );
        self.run_until(|sim| sim.tasks.get(index).is_none_or(|t| t.is_none()))?;
        out.borrow_mut().take().ok_or(SimError::Crashed)
    }

    fn live(&self) -> usize {
        self.tasks.iter().filter(|t| t.is_some()).count()
    }

    fn run_until(&mut self, done: impl Fn(&Sim) -> bool) -> Result<RunStats, SimError> {
        loop {
            self.poll_woken();
            self.drop_crashed();
            if done(self) || self.live() == 0 {
                break;
            }
            let next = self.world.borrow().next_event_time();
            match next {
                None => {
                    let time = self.now();
                    return Err(SimError::Stuck { time, tasks: self.live() });
                }
                Some(t) if t > self.world.borrow().cfg.time_limit_ns => {
                    return Err(SimError::TimeLimit { tasks: self.live() });
                }
                Some(_) => {
                    self.world.borrow_mut().process();
                }
            }
        }
        let w = self.world.borrow();
        Ok(RunStats { end_time: w.now, events: w.events_done, digest: w.digest })
    }

    fn poll_woken(&mut self) {
        let mut progress = true;
        while progress {
            progress = false;
            for i in 0..self.tasks.len() {
                let Some(task) = self.tasks[i].as_mut() else { continue };
                if task.client.is_some_and(|c| self.world.borrow().stalled.contains_key(&c)) {
                    // Polled when the stall ends (its wake-up is kept).
                    continue;
                }
                if !task.woken.0.swap(false, Ordering::Relaxed) {
                    continue;
                }
                progress = true;
                let mut cx = Context::from_waker(&task.waker);
                if let Poll::Ready(()) = task.fut.as_mut().poll(&mut cx) {
                    self.tasks[i] = None;
                }
            }
        }
    }

    fn drop_crashed(&mut self) {
        let crashed = core::mem::take(&mut self.world.borrow_mut().crashed_clients);
        for c in crashed {
            for t in self.tasks.iter_mut() {
                if t.as_ref().is_some_and(|t| t.client == Some(c)) {
                    // Dropped outside any borrow of the world: a future's
                    // destructor may touch it.
                    drop(t.take());
                }
            }
        }
    }

    /// Operations posted and not yet answered (background ones included).
    pub fn in_flight(&self) -> usize {
        self.world.borrow().groups_in_flight()
    }

    /// Whether anything is still scheduled.
    pub fn has_events(&self) -> bool {
        self.world.borrow().has_events()
    }
}

#[cfg(test)]
mod tests;
