//! Seeded campaigns of any registered key-value system in the simulator:
//! concurrent clients insert, update, get and delete a few keys under
//! delays, torn transfers, clock skew, crashes of a minority of nodes and
//! of a client, a slow node, a client paused mid-operation (as a
//! process stopped with SIGSTOP, then continued), and a client stopped
//! between operations past its lease while another takes its id over
//! ([`KvCampaign::lapse`]); a fresh client reads
//! every key at the end (with leases, as the next holder of the crashed
//! client's id, so that it first recovers what that client left
//! mid-operation); the history
//! must satisfy the system's declared [`Guarantee`]. In a third of the
//! runs the crashed client is a key's only writer and crashes in one of
//! its writes of it, which is then the key's last change: recovery must
//! finish or drop it, with no other client's write over it.
//!
//! What a campaign asks of a system follows its declaration:
//! - [`Guarantee::Linearizable`]: every client may use every key, and a
//!   minority of the nodes crash: any of them where the system replicates
//!   its index, else those that hold no index (a store whose index is on
//!   [`INDEX_NODE`] alone does not survive that node);
//! - [`Guarantee::LinearizablePrimary`]: the same, and an operation may
//!   fail by naming one of the crashed nodes as down (its key's primary):
//!   it stays pending in the history (it may or may not have taken
//!   effect), and the client goes on;
//! - [`Guarantee::OneClientPerKey`]: each key belongs to one client, and
//!   no node or client crashes (such a store promises nothing then);
//!
//! and every declared option takes a value chosen by the seed, so that
//! the campaigns cover each of them.
//!
//! A failing run prints the command that replays it:
//! `SWARM_KV=<system> SWARM_SEED=<seed> SWARM_REPLICAS=<n> cargo test -p swarm-core --lib systems::tests::replay -- --nocapture`.

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};

use swarm_lincheck::{self as lincheck, History, KvOp, KvRet};

use super::{Pause, SimClock, TICK_NS, clock, id_of, value};
use crate::kv::place::INDEX_NODE;
use crate::kv::{Got, Guarantee, KvClient, KvError, KvSystem, StoreConfig, System, Visit, Who};
use crate::sim::{CrashMode, ServerShell, Sim, SimConfig, SimMemory};
use crate::substrate::clock::MAX_SKEW_NS;
use crate::substrate::lease::{Held, LeaseError, Want};
use crate::substrate::msg::area::{Area, State as AreaState};
use crate::substrate::rtt::Counted;
use crate::substrate::space::Region;
use crate::swarm::client::Paths;
use crate::{Memory, NodeId, systems};

/// Bytes of each simulated node.
pub const NODE_SIZE: u64 = 4 << 20;
/// Allocation chunk of the simulated nodes.
pub const CHUNK: u64 = 64 << 10;
/// The keys a campaign uses.
const KEYS: [&[u8]; 6] = [b"key-0", b"key-1", b"key-2", b"key-3", b"key-4", b"key-5"];

/// What one campaign run is made of.
#[derive(Clone, Copy, Debug)]
pub struct KvCampaign {
    /// The system.
    pub system: System,
    /// Nodes, and replicas of each key.
    pub replicas: usize,
    /// Concurrent clients.
    pub clients: u8,
    /// Keys they share (or, one client per key, that each owns).
    pub keys: u64,
    /// Operations per client.
    pub ops: u64,
    /// Largest clock skew between clients, ns.
    pub max_skew_ns: u64,
    /// Whether nodes and a client crash and a node turns slow.
    pub faults: bool,
    /// Whether clients claim leased ids (and give them back when done), or
    /// are given fixed ones.
    pub leases: bool,
    /// Whether the system's server, if it has one ([`KvSystem::SERVER`]),
    /// crashes among the operations, and a standby takes over.
    pub server_crash: bool,
    /// Whether the crashed nodes come back with their memory soon after
    /// (systems that take such a node back, `SystemInfo::rejoins`: the
    /// others' declared model assumes a crashed primary stays down).
    pub heal: bool,
    /// Whether clients run `KvClient::keep` after each operation, and a
    /// few times more after their last, a recycling delay apart (what
    /// recycles SWARM-KV's and DM-ABD's logs: [`crate::swarm::recycle`]),
    /// so that the last reads meet values moved home.
    pub keep: bool,
    /// Whether the client that crashes (if one does, on shared keys) is
    /// key 0's only writer, all its writes going there while the others
    /// only read it: what it left mid-write is then the key's last change,
    /// which its id's next holder finds and must finish or drop (FUSEE's
    /// redo, §5.3), not a change others overwrote since.
    pub owned_key: bool,
    /// Whether a client is paused (a process stopped, SIGSTOP) at some
    /// point of its run and continued later, in the middle of whatever it
    /// was doing: for less than a time-out, for longer than the stores'
    /// short delays and leases (a recycling delay, an index view's lease),
    /// or for longer than a server's answer may be used (pDPM-Central's
    /// answer lifetime), but never past a client id's lease.
    pub pause: bool,
    /// Whether a client with a leased id stops between two of its
    /// operations for longer than its lease (a process stopped, SIGSTOP),
    /// while another client claims its id, uses it and gives it back:
    /// continued, it must not use the id again (its writes fail with a
    /// lease error, as [`crate::substrate::lease`] says), and nothing it
    /// does may spoil what the id's next holder did.
    pub lapse: bool,
}

impl KvCampaign {
    /// The run for `seed`: 2 to 5 clients on 1 to 3 keys, 12 operations
    /// each, clocks skewed by up to 0, 2 or 30 µs (roundtrips are 1-3 µs),
    /// and in four runs out of five a crashed minority of nodes, a client
    /// crashing mid-operation and a slow node; in one run out of three the
    /// crashed nodes come back (systems that take them back).
    pub fn for_seed(system: System, replicas: usize, seed: u64) -> KvCampaign {
        KvCampaign {
            system,
            replicas,
            clients: 2 + (seed % 4) as u8,
            keys: 1 + (seed / 4) % 3,
            ops: 12,
            max_skew_ns: [0, 2_000, 30_000][(seed % 3) as usize],
            faults: !seed.is_multiple_of(5),
            leases: seed % 4 >= 2,
            server_crash: !seed.is_multiple_of(5) && !seed.is_multiple_of(3),
            heal: seed % 3 == 1,
            keep: seed % 2 == 1,
            owned_key: (seed / 12).is_multiple_of(3),
            // Not the seeds of `systems::tests`' replays (1 and 3 mod 8);
            // every other such seed lapses instead.
            pause: seed % 8 == 6 && !lapses(seed),
            lapse: lapses(seed),
        }
    }

    /// The store's shape for this run; options chosen by `seed`.
    pub fn config(&self, seed: u64) -> StoreConfig {
        let mut cfg = StoreConfig::new(self.system, 64);
        cfg.replicas = self.replicas;
        cfg.max_key = 16;
        cfg.max_value = 256;
        // The stores that recycle their logs, with room for 3 entries per
        // segment (16 KiB values in 64 KiB chunks), so that their clients
        // fill segments and start them again under recycled numbers.
        if self.keep && matches!(self.system.name(), "swarm-kv" | "dm-abd") {
            cfg.max_value = 16 << 10;
        }
        // Spare ids: with a bare majority of the lease table's sites up, an
        // id a crashed client was claiming stays blocked until its words
        // there expire (with their grace), and the others claim around it.
        cfg.writers = self.clients + 3;
        cfg.cache_capacity = 64;
        cfg.seed_options(seed);
        if self.lapse {
            // The shortest lease: a lapse outlasts it and the grace.
            cfg.lease_ms = crate::kv::config::MIN_LEASE_MS;
        }
        cfg
    }

    /// Whether every client uses every key.
    fn shared_keys(&self) -> bool {
        self.system.guarantee().shares_keys()
    }

    /// The keys the clients use: all of them shared, or one per client.
    fn keys_used(&self) -> u64 {
        if self.shared_keys() { self.keys } else { (self.clients as u64).min(KEYS.len() as u64) }
    }
}

/// Whether the run for `seed` has a lapse ([`KvCampaign::lapse`]): one
/// seed in sixteen (half of the pause's, whose runs all lease their ids).
fn lapses(seed: u64) -> bool {
    seed % 16 == 14
}

/// What a campaign found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Runs.
    pub runs: u64,
    /// Operations checked in all.
    pub ops: usize,
    /// Of which failed as the system's declaration allows ([`Ran::excused`]).
    pub excused: usize,
    /// Operations a pause caught in flight ([`Ran::paused`]).
    pub paused: usize,
    /// Operations refused after a lapse ([`Ran::refused`]).
    pub refused: usize,
    /// The rare paths the clients took, summed.
    pub paths: Paths,
}

/// What one run checked.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ran {
    /// Operations checked.
    pub ops: usize,
    /// Of which failed as the system's declaration allows (left pending:
    /// a key's primary down, [`Guarantee::LinearizablePrimary`], or a call
    /// to a crashed server).
    pub excused: usize,
    /// Operations in flight all through their client's pause
    /// ([`KvCampaign::pause`]): begun before it, and done (or failed)
    /// after it.
    pub paused: usize,
    /// Operations of a client, after its lease lapsed and its id was
    /// taken over ([`KvCampaign::lapse`]), that failed with a lease error
    /// (left pending: they may have taken effect before they failed).
    pub refused: usize,
    /// The rare paths the clients took (one that crashed, up to its last
    /// operation done).
    pub paths: Paths,
}

/// Runs seeds `from..from + runs` of `system` on `replicas` nodes; the
/// first failure's description (with the command that replays it), or
/// what was checked.
pub fn campaign(system: System, replicas: usize, from: u64, runs: u64) -> Result<Summary, String> {
    let mut s = Summary::default();
    for seed in from..from + runs {
        let ran = run(seed, &KvCampaign::for_seed(system, replicas, seed))?;
        s.ops += ran.ops;
        s.excused += ran.excused;
        s.paused += ran.paused;
        s.refused += ran.refused;
        s.paths.add(&ran.paths);
        s.runs += 1;
    }
    Ok(s)
}

/// One seeded run: the number of operations checked, or what went wrong
/// and the command that replays it.
pub fn run(seed: u64, c: &KvCampaign) -> Result<Ran, String> {
    struct Run<'a> {
        seed: u64,
        c: &'a KvCampaign,
    }
    impl Visit for Run<'_> {
        type Out = Result<Ran, String>;
        fn visit<S: KvSystem>(self) -> Self::Out {
            run_typed::<S>(self.seed, self.c)
        }
    }
    let replay = format!(
        "replay: SWARM_KV={} SWARM_SEED={seed} SWARM_REPLICAS={} cargo test -p swarm-core --lib systems::tests::replay -- --nocapture",
        c.system.name(),
        c.replicas
    );
    systems::visit(c.system, Run { seed, c }).map_err(|e| format!("seed {seed}: {e}\n{replay}"))
}

type Hist = History<KvOp, KvRet>;

/// Runs `op` on `s` and records it; an error of the store is a failure,
/// unless the system's declaration `excuses` it (then the operation stays
/// pending in the history: it may or may not have taken effect). Whether
/// it was excused.
async fn record<K: KvClient>(
    s: &mut K,
    m: &SimMemory,
    hist: &RefCell<Hist>,
    id: u32,
    op: KvOp,
    excuses: &Excuses,
) -> Result<bool, String> {
    let key = KEYS[op.key() as usize % KEYS.len()];
    let invoked = hist.borrow_mut().invoke(id, m.now(), op);
    let ret = match op {
        KvOp::Insert(_, v) => s.insert(key, &value_of(v)).await.map(|_| KvRet::Ok),
        KvOp::Update(_, v) => s.update(key, &value_of(v)).await.map(|r| r.map_or(KvRet::NotFound, |_| KvRet::Ok)),
        KvOp::Delete(_) => s.delete(key).await.map(|r| r.map_or(KvRet::NotFound, |_| KvRet::Ok)),
        KvOp::Get(_) => s.get(key).await.map(|g| match g {
            Got::Found(v) => KvRet::Found(id_of(&v)),
            Got::NotFound => KvRet::NotFound,
            Got::Deleted => KvRet::Deleted,
        }),
    };
    match ret {
        Ok(r) => {
            hist.borrow_mut().respond(invoked, m.now(), r);
            Ok(false)
        }
        Err(e) if excuses.excuse(&e, m.now(), id) => Ok(true),
        Err(e) => Err(format!("client {id}: {op:?}: {e}")),
    }
}

/// The failures a system's declaration allows in a run: for
/// [`Guarantee::LinearizablePrimary`], a node that crashed in it named as
/// down (a key's primary); for a system with a server, a call that met it
/// crashed; a lease error of a client whose id was taken over while it
/// was stopped ([`KvCampaign::lapse`]).
#[derive(Clone, Default)]
struct Excuses {
    primary: bool,
    /// The nodes crashed in this run (filled before it starts).
    crashed: Rc<RefCell<Vec<usize>>>,
    /// When the system's server crashed, and its node: a call to it that
    /// fails from then on may or may not have taken effect.
    server: Option<(u64, NodeId)>,
    /// The client (its id in the history) whose id was taken over, once
    /// it is continued.
    lapsed: Rc<Cell<Option<u32>>>,
    /// Its operations refused with a lease error.
    refused: Rc<Cell<usize>>,
}

impl Excuses {
    fn excuse(&self, e: &KvError, now: u64, client: u32) -> bool {
        if let KvError::Lease(_) = e
            && self.lapsed.get() == Some(client)
        {
            self.refused.set(self.refused.get() + 1);
            return true;
        }
        let KvError::Down(d) = e else { return false };
        (self.primary && self.crashed.borrow().contains(&d.node.index()))
            || self.server.is_some_and(|(at, node)| now >= at && d.node == node)
    }
}

/// The value of write `id` (client << 32 | sequence), of one of three sizes.
fn value_of(id: u64) -> Vec<u8> {
    value((id >> 32) as u8, id & 0xffff_ffff, 8 + (id % 3) as usize * 50)
}

/// Formats every simulated node and sets up a store of shape `cfg`,
/// twice (the second changes nothing).
pub fn setup(sim: &mut Sim, cfg: &StoreConfig) -> Result<(), String> {
    let admin = sim.client();
    let cfg = cfg.clone();
    let nodes = admin.node_count();
    sim.block_on(async move {
        for n in 0..nodes {
            Region::format_fresh(&admin, NodeId(n as u16), NODE_SIZE, CHUNK)
                .await
                .map_err(|e| format!("format: {e}"))?;
        }
        for _ in 0..2 {
            systems::format(&admin, &cfg, 1).await.map_err(|e| format!("set up the store: {e}"))?;
        }
        Ok(())
    })
    .map_err(|e| format!("setup: {e}"))?
}

/// Starts the server that `cfg`'s system needs, if any
/// ([`KvSystem::SERVER`]), as a task of a simulated client of its own;
/// its shell stops it.
pub fn start_server(sim: &mut Sim, cfg: &StoreConfig) -> Option<ServerShell> {
    cfg.system.server()?;
    let m = sim.client();
    let shell = ServerShell::new(&m, 200);
    spawn_server(sim, cfg, &shell, 0);
    Some(shell)
}

/// Runs the server of `cfg`'s system on `shell`'s client from virtual time
/// `at` on (a standby that takes over: a new incarnation).
pub(crate) fn spawn_server(sim: &mut Sim, cfg: &StoreConfig, shell: &ServerShell, at: u64) {
    let Some(node) = cfg.system.server() else { return };
    let m = shell.memory().clone();
    let (mm, sh, cfg) = (m.clone(), shell.clone(), cfg.clone());
    sim.spawn(&m, async move {
        if at > mm.now() {
            mm.sleep(at - mm.now()).await;
        }
        let _ = systems::serve(mm, node, &cfg, &sh).await;
    });
}

/// Waits until the server beside `node` runs.
pub fn server_up(sim: &mut Sim, node: NodeId) -> Result<(), String> {
    let m = sim.client();
    sim.block_on(async move {
        loop {
            if let Ok(area) = Area::open(&m, node).await
                && let Ok(AreaState::Running(_)) = area.state(&m).await
            {
                return;
            }
            m.sleep(1_000).await;
        }
    })
    .map_err(|e| format!("the server did not start: {e}"))
}

/// Claims an id for client `id`. If every id is held, it waits out one
/// lease and tries again, as a client would: a claim that lost leaves its
/// word on a node that crashed before the claim could take it back, and the
/// word holds its id there until its lease ends (`crate::substrate::lease`),
/// so that with one node down a few such words can hold every spare id.
async fn claim_patiently(m: &SimMemory, cfg: &StoreConfig, clk: &SimClock, id: u8) -> Result<Held, KvError> {
    for _ in 0..2 {
        match systems::claim(m, cfg, clk, Want::Any, id as u32).await {
            Err(KvError::Lease(LeaseError::NoFreeId { .. })) => {
                m.sleep(cfg.lease_ms as u64 * 1_000_000 + 3 * MAX_SKEW_NS).await
            }
            r => return r,
        }
    }
    systems::claim(m, cfg, clk, Want::Any, id as u32).await
}

/// Claims `id`, which a client that crashed held: once its lease has
/// run out (with the grace), as its next holder would. (With a node of
/// the table down, the id's word on another may hold it however soon its
/// claim says it frees: a lease is waited out whole.)
async fn claim_orphan(m: &SimMemory, cfg: &StoreConfig, clk: &SimClock, id: u8) -> Result<Held, String> {
    let lease = cfg.lease_ms as u64 * 1_000_000 + 3 * MAX_SKEW_NS;
    for _ in 0..3 {
        match systems::claim(m, cfg, clk, Want::Id(id), 0).await {
            Err(KvError::Lease(LeaseError::Taken { .. })) => m.sleep(lease).await,
            r => return r.map_err(|e| format!("final claim of id {id}, left by a crashed client: {e}")),
        }
    }
    Err(format!("id {id}, left by a crashed client, is still held after two leases"))
}

/// What a client runs after its last operation where clients recycle: its
/// background work four times, a recycling delay apart, so that what its
/// log holds is recycled (and what it took over from a crashed holder).
async fn keep_recycling<K: KvClient>(s: &mut K, m: &SimMemory) {
    let delay = crate::swarm::client::recycle_delay_ns(m.timeout_ns());
    for _ in 0..4 {
        m.sleep(delay).await;
        let _ = s.keep().await;
    }
}

/// `op` where key 0 has one writer ([`KvCampaign::owned_key`]): its
/// updates and inserts go to key 0 (`writer`), the others' writes of key
/// 0 become reads of it, and its own deletes of it too (its updates would
/// find nothing).
fn owned(op: KvOp, writer: bool) -> KvOp {
    match op {
        KvOp::Update(_, v) if writer => KvOp::Update(0, v),
        KvOp::Insert(_, v) if writer => KvOp::Insert(0, v),
        KvOp::Update(0, _) | KvOp::Insert(0, _) | KvOp::Delete(0) => KvOp::Get(0),
        op => op,
    }
}

/// Client `id` is done (finished or crashed); the server stops after the
/// last of `clients`.
fn finished(done: &RefCell<Vec<u8>>, id: u8, clients: u64, server: &Option<ServerShell>) {
    let mut d = done.borrow_mut();
    if !d.contains(&id) {
        d.push(id);
    }
    if d.len() as u64 == clients
        && let Some(s) = server
    {
        s.stop();
    }
}

/// A lapse ([`KvCampaign::lapse`]) as it goes, shared by the client that
/// lapses and its id's next holder.
#[derive(Default)]
struct Lapse {
    /// The client that lapses and the operation it stops before, once
    /// drawn.
    who: Cell<Option<(u8, u64)>>,
    /// When it stopped.
    at: Cell<Option<u64>>,
    /// Whether its id's next holder is done with the id.
    done: Cell<bool>,
}

/// The next holder of a lapsed client's id ([`KvCampaign::lapse`]).
struct Successor {
    /// The lapsed client.
    of: u8,
    /// Its own id in the history.
    history_id: u32,
    /// Keys it reads ([`KvCampaign::keys_used`]).
    keys: u64,
    /// The leased id each client claimed (by client).
    held: Rc<RefCell<Vec<(u8, u8)>>>,
}

/// What a run's failures are written to.
type Failures = Rc<RefCell<Vec<String>>>;

/// Starts the next holder of `who.of`'s leased id: once that client has
/// stopped, it waits out the lease and the grace, claims the id, reads
/// every key and updates key 0 (recorded in the history), and gives the
/// id back; then the stopped client is continued.
fn spawn_successor<S: KvSystem>(
    sim: &mut Sim,
    cfg: &StoreConfig,
    who: Successor,
    lapse: Rc<Lapse>,
    hist: Rc<RefCell<Hist>>,
    failures: Failures,
    excuses: Excuses,
) {
    let m = sim.client();
    let (mm, cfg) = (m.clone(), cfg.clone());
    sim.spawn(&m, async move {
        let m = mm;
        let result = async {
            while lapse.at.get().is_none() {
                m.sleep(1_000_000).await;
            }
            let id = who.held.borrow().iter().find(|h| h.0 == who.of).map(|h| h.1);
            let id = id.ok_or_else(|| format!("client {} lapsed with no leased id", who.of))?;
            let clk = clock(&m, 0);
            let h = claim_orphan(&m, &cfg, &clk, id).await?;
            let fail = |e: KvError| format!("the next holder of lapsed client {}'s id {id}: {e}", who.of);
            let mut s = S::connect(m.clone(), &cfg, Who::Lease(h), clk).await.map_err(fail)?;
            for k in 0..who.keys {
                record(&mut s, &m, &hist, who.history_id, KvOp::Get(k), &excuses).await?;
            }
            let v = (who.history_id as u64) << 32 | 1;
            record(&mut s, &m, &hist, who.history_id, KvOp::Update(0, v), &excuses).await?;
            s.close().await.map_err(fail)
        };
        if let Err(e) = result.await {
            failures.borrow_mut().push(e);
        }
        lapse.done.set(true);
    });
}

fn run_typed<S: KvSystem>(seed: u64, c: &KvCampaign) -> Result<Ran, String> {
    let mut sim = Sim::new(SimConfig {
        seed,
        nodes: c.replicas,
        node_size: NODE_SIZE,
        max_piece_gap_ns: 500,
        // Room for a client that waits out a lease ([`claim_patiently`]).
        time_limit_ns: 60_000_000_000,
        ..SimConfig::default()
    });
    let cfg = c.config(seed);
    setup(&mut sim, &cfg)?;
    let hist = Rc::new(RefCell::new(Hist::new()));
    let failures: Failures = Rc::new(RefCell::new(Vec::new()));
    // The paths each client took so far, by client (0: the final reader),
    // kept after every operation: a client that crashes counts up to its
    // last operation done.
    let taken: Rc<RefCell<Vec<Paths>>> = Rc::new(RefCell::new(alloc::vec![Paths::default(); c.clients as usize + 1]));
    // The system's server, up before the clients start (so that the
    // faults below fall among their operations), stopped once every client
    // is done.
    let server = start_server(&mut sim, &cfg);
    if let Some(node) = c.system.server() {
        server_up(&mut sim, node)?;
    }
    let start = sim.now();
    let shared = c.shared_keys();
    // The server crashes among the operations (a process killed: its
    // transfers cut short), and a standby starts a new incarnation a little
    // later. A client's call to the crashed one fails, its outcome unknown.
    let server_crash = match (&server, c.faults && c.server_crash) {
        (Some(shell), true) => {
            let at = start + sim.random(0, 100_000);
            let takeover = at + sim.random(5_000, 100_000);
            if sim.random(0, 1) == 0 {
                sim.crash_client_at(shell.memory(), at);
            } else {
                // Paused rather than killed (SIGSTOP): it comes back after
                // the standby took over, in the middle of whatever it was
                // doing, and must not act on what it knew before.
                let pause = takeover - at + sim.random(10_000, 200_000);
                sim.stall_client_at(shell.memory(), at, pause);
            }
            let standby = shell.for_client(&sim.client());
            spawn_server(&mut sim, &cfg, &standby, takeover);
            Some(at)
        }
        _ => None,
    };
    let excuses = Excuses {
        primary: c.system.guarantee() == Guarantee::LinearizablePrimary,
        server: server_crash.zip(c.system.server()),
        ..Excuses::default()
    };
    let excused: Rc<RefCell<usize>> = Rc::default();
    let done: Rc<RefCell<Vec<u8>>> = Rc::default();
    // Key 0's only writer, once the crashed client is chosen (before the
    // clients run).
    let owner: Rc<Cell<Option<u8>>> = Rc::default();
    let lapse: Rc<Lapse> = Rc::default();
    // The leased id each client claimed (by client).
    let held: Rc<RefCell<Vec<(u8, u8)>>> = Rc::default();
    let mut clients = Vec::new();
    for id in 1..=c.clients {
        let mem = sim.client();
        let skew = sim.random(0, c.max_skew_ns) / TICK_NS;
        let (hist, failures, m, cfg) = (hist.clone(), failures.clone(), mem.clone(), cfg.clone());
        let (taken, excuses, excused) = (taken.clone(), excuses.clone(), excused.clone());
        let (keys, ops, clients_n, leases, keep) = (c.keys, c.ops, c.clients as u64, c.leases, c.keep);
        let (done, server, held, owner) = (done.clone(), server.clone(), held.clone(), owner.clone());
        let lapse = lapse.clone();
        sim.spawn(&mem, async move {
            async {
                let clk = clock(&m, skew);
                let who = match leases {
                    false => Ok(Who::Id(id)),
                    true => claim_patiently(&m, &cfg, &clk, id).await.map(|h| {
                        held.borrow_mut().push((id, h.id));
                        Who::Lease(h)
                    }),
                };
                let connected = match who {
                    Ok(who) => S::connect(Counted::new(m.clone()), &cfg, who, clk).await,
                    Err(e) => Err(e),
                };
                let mut s = match connected {
                    Ok(s) => s,
                    Err(e) => return failures.borrow_mut().push(format!("client {id}: connect: {e}")),
                };
                // Key 0's only writer: its writes of it so far, and the one
                // it crashes in.
                let (mut writes_0, mut crash_in) = (0, None);
                for seq in 1..=ops {
                    if lapse.who.get() == Some((id, seq)) {
                        // Stopped until its id's next holder is done with
                        // it, then continued.
                        lapse.at.set(Some(m.now()));
                        while !lapse.done.get() {
                            m.sleep(1_000_000).await;
                        }
                        excuses.lapsed.set(Some(id as u32));
                    }
                    m.sleep(m.random(0, 3_000)).await;
                    // Shared keys, or this client's own.
                    let k =
                        if shared { m.random(0, keys - 1) } else { (id as u64 - 1) % clients_n.min(KEYS.len() as u64) };
                    let v = (id as u64) << 32 | seq;
                    let op = match m.random(0, 19) {
                        0..=7 => KvOp::Get(k),
                        8..=11 => KvOp::Update(k, v),
                        12..=16 => KvOp::Insert(k, v),
                        _ => KvOp::Delete(k),
                    };
                    let op = match owner.get() {
                        Some(o) => owned(op, o == id),
                        None => op,
                    };
                    if owner.get() == Some(id) && matches!(op, KvOp::Update(..) | KvOp::Insert(..)) {
                        writes_0 += 1;
                        if writes_0 == *crash_in.get_or_insert_with(|| 2 + m.random(0, 2)) {
                            // Somewhere in this write (writes take a few
                            // roundtrips, tens with a slow node).
                            m.crash_in(m.random(0, 30_000));
                            finished(&done, id, clients_n, &server);
                        }
                    }
                    match record(&mut s, &m, &hist, id as u32, op, &excuses).await {
                        Ok(excuse) => *excused.borrow_mut() += excuse as usize,
                        Err(e) => return failures.borrow_mut().push(e),
                    }
                    if keep {
                        // Background work: a failure here (a lease not
                        // renewed while nodes are down) is an operation's.
                        let _ = s.keep().await;
                    }
                    taken.borrow_mut()[id as usize] = s.paths();
                }
                if keep {
                    keep_recycling(&mut s, &m).await;
                }
                taken.borrow_mut()[id as usize] = s.paths();
                match s.close().await {
                    Err(KvError::Lease(_)) if excuses.lapsed.get() == Some(id as u32) => {}
                    Err(e) => failures.borrow_mut().push(format!("client {id}: close: {e}")),
                    Ok(()) => {}
                }
            }
            .await;
            finished(&done, id, clients_n, &server);
        });
        clients.push(mem);
    }
    // The client that crashes, if one does.
    let mut victim = None;
    if c.faults {
        let f = (c.replicas - 1) / 2;
        // A server's clients connect through it first (tens of µs): its
        // store's nodes crash later, among their operations.
        let crash_from = if c.system.server().is_some() { 40_000 } else { 0 };
        let spare_index = !c.system.replicated_index();
        if shared && f > 0 {
            // A minority of the nodes crash (not the index's, if it has
            // one copy), a client crashes mid-operation.
            for _ in 0..sim.random(1, f as u64) {
                let node = if spare_index {
                    let node = sim.random(0, c.replicas as u64 - 2) as usize;
                    if node >= INDEX_NODE.index() { node + 1 } else { node }
                } else {
                    sim.random(0, c.replicas as u64 - 1) as usize
                };
                let mode = if sim.random(0, 1) == 0 { CrashMode::Hang } else { CrashMode::FailFast };
                let at = start + crash_from + sim.random(0, 60_000);
                sim.crash_node_at(node, at, mode);
                excuses.crashed.borrow_mut().push(node);
                if c.heal && c.system.rejoins() {
                    // No draw of the run's randomness: the other faults
                    // stay those of the same seed without it.
                    sim.heal_node_at(node, at + 20_000 + at % 400_000);
                }
            }
            let crashed = sim.random(0, clients.len() as u64 - 1) as usize;
            let at = start + sim.random(0, 150_000);
            victim = Some(crashed as u8 + 1);
            if c.owned_key {
                // Key 0's writer crashes itself, in one of its writes of
                // it (one that knows the key's word: not its first), and
                // says it is done then.
                owner.set(victim);
            } else {
                sim.crash_client_at(&clients[crashed], at);
                // The crashed client is done when it crashes.
                let (done, server, m) = (done.clone(), server.clone(), sim.client());
                let (mm, n) = (m.clone(), c.clients as u64);
                sim.spawn(&m, async move {
                    mm.sleep(at.saturating_sub(mm.now()) + 1).await;
                    finished(&done, crashed as u8 + 1, n, &server);
                });
            }
        }
        let slow = sim.random(0, c.replicas as u64 - 1) as usize;
        sim.slow_node_at(slow, start + sim.random(0, 30_000), 5);
        // A node stalls for less than the clients' time-out: what reaches
        // it lands late, and quorums must not wait for it (SWARM §6). (Not
        // the index's, if it has one copy; nor the slow node: slow and
        // stalled, it would time out, a fault beyond the crashed minority.)
        let candidates: alloc::vec::Vec<usize> =
            (0..c.replicas).filter(|&n| !(spare_index && n == INDEX_NODE.index()) && n != slow).collect();
        if !candidates.is_empty() {
            let node = candidates[sim.random(0, candidates.len() as u64 - 1) as usize];
            let (at, ns) = (start + sim.random(0, 60_000), sim.random(2_000, 25_000));
            sim.stall_node_at(node, at, ns);
        }
    }
    // A client's pause, drawn last, so that the other faults of a seed are
    // the same with it; for a server's clients, after they connected
    // through it (tens of µs), among their operations. (A client that also
    // crashes leaves its last operation pending: not counted.)
    let lengths = [(2_000, 40_000), (100_000, 2_000_000), (8_000_000, 20_000_000)];
    let from = start + if c.system.server().is_some() { 40_000 } else { 0 };
    let pause = c
        .pause
        .then(|| Pause::draw(&mut sim, &clients, (from, from + 150_000), &lengths))
        .filter(|p| victim.map(u32::from) != Some(p.client()));
    if c.lapse {
        let candidates: Vec<u8> = (1..=c.clients).filter(|&i| Some(i) != victim).collect();
        let client = candidates[sim.random(0, candidates.len() as u64 - 1) as usize];
        lapse.who.set(Some((client, sim.random(2, c.ops))));
        let who = Successor { of: client, history_id: c.clients as u32 + 2, keys: c.keys_used(), held: held.clone() };
        spawn_successor::<S>(&mut sim, &cfg, who, lapse.clone(), hist.clone(), failures.clone(), excuses.clone());
    }
    if let Err(e) = sim.run() {
        return Err(format!("{e} (an operation of a live client did not complete)"));
    }
    // Afterwards, a fresh client reads every key: no acknowledged write lost
    // (through a new incarnation of the system's server, if it has one: it
    // recovers what the first one committed). With leases it takes the id
    // of the client that crashed, if that one held one, and so recovers
    // what its holder left mid-operation (FUSEE's log, a SWARM writer's log
    // segments), else a released id, whose log it goes on with. (Its
    // claim may wait out a lease, before the server starts: a server polls
    // all the while it runs.)
    let mem = sim.client();
    let (h, f, last, leases) = (hist.clone(), failures.clone(), c.clients + 1, c.leases);
    let (taken_end, excused_end, keep) = (taken.clone(), excused.clone(), c.keep);
    let keys = c.keys_used();
    let orphan = victim.and_then(|v| held.borrow().iter().find(|h| h.0 == v).map(|h| h.1));
    let (m, claim_cfg) = (mem.clone(), cfg.clone());
    let who = sim.block_on(async move {
        let clk = clock(&m, 0);
        Ok::<_, String>(match (leases, orphan) {
            (true, Some(id)) => Who::Lease(claim_orphan(&m, &claim_cfg, &clk, id).await?),
            (true, None) => Who::Lease(
                systems::claim(&m, &claim_cfg, &clk, Want::Any, 0).await.map_err(|e| format!("final claim: {e}"))?,
            ),
            (false, _) => Who::Id(last),
        })
    });
    let who = match who {
        Ok(Ok(who)) => who,
        Ok(Err(e)) => return Err(e),
        Err(e) => return Err(format!("final claim: {e}")),
    };
    let _again = start_server(&mut sim, &cfg);
    let refused = excuses.refused.clone();
    let end = sim.block_on(async move {
        let clk = clock(&mem, 0);
        let mut s = S::connect(mem.clone(), &cfg, who, clk).await.map_err(|e| format!("final client: {e}"))?;
        // Every key read; where clients recycle, read again once what the
        // reader took over was recycled (R apart, as a client's keep runs).
        let rounds = if keep { 2 } else { 1 };
        for round in 0..rounds {
            if round > 0 {
                keep_recycling(&mut s, &mem).await;
            }
            for k in 0..keys {
                match record(&mut s, &mem, &h, last as u32, KvOp::Get(k), &excuses).await {
                    Ok(excuse) => *excused_end.borrow_mut() += excuse as usize,
                    Err(e) => f.borrow_mut().push(e),
                }
            }
        }
        // What it did counts too (it may take over a lock a crashed client
        // left, with no other client after it on the key).
        taken_end.borrow_mut()[0] = s.paths();
        Ok::<(), String>(())
    });
    match end {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(e) => return Err(format!("final reads: {e}")),
    }
    if let Some(f) = failures.borrow().first() {
        return Err(f.clone());
    }
    let h = hist.borrow();
    let verdict = lincheck::check(&lincheck::Kv::lazy_unmap(), h.operations());
    if !verdict.is_linearizable() {
        let mut trace = String::new();
        for (i, op) in h.operations().iter().enumerate() {
            trace += &format!(
                "#{i} c{} [{} {:?}] {:?} -> {:?}\n",
                op.client,
                op.call,
                op.response.as_ref().map(|r| r.at),
                op.input,
                op.response.as_ref().map(|r| r.output)
            );
        }
        return Err(format!("history of {} ops is not linearizable: {verdict}\n{trace}", h.len()));
    }
    let mut paths = Paths::default();
    for p in taken.borrow().iter() {
        paths.add(p);
    }
    let excused = *excused.borrow();
    let paused = pause.map_or(0, |p| p.caught(h.operations()));
    let refused = refused.get();
    Ok(Ran { ops: h.len(), excused: excused - refused, paused, refused, paths })
}
