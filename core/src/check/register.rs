//! Seeded simulator campaigns shared by the register protocols' tests:
//! concurrent clients on one replicated register under delays, crashes and
//! clock skew, every history checked for linearizability.
//!
//! A failing run prints the command that replays it, e.g.
//! `SWARM_PROTOCOL=safeguess SWARM_SEED=<seed> SWARM_REPLICAS=<n> cargo test -p swarm-core --lib check::register::replay -- --nocapture`

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;

use crate::NodeId;
use crate::baselines::abd;
use crate::sim::{CrashMode, Sim, SimConfig};

pub(crate) use super::{Pause, TICK_NS, clock, id_of, value};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::Region;
use crate::swarm::client::{ClientCtx, Paths};
use crate::swarm::inout::Layout;
use crate::swarm::maxreg::{RegCache, Register};
use crate::swarm::safeguess;
use crate::swarm::writerlog::{self, LogGeometry};
use swarm_lincheck::{self as lincheck, History, RegisterOp, RegisterRet};

/// The register protocol a campaign runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// SWARM's Safe-Guess over In-n-Out.
    SafeGuess,
    /// DM-ABD.
    Abd,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::SafeGuess => "safeguess",
            Protocol::Abd => "abd",
        }
    }

    fn from_name(name: &str) -> Option<Protocol> {
        [Protocol::SafeGuess, Protocol::Abd].into_iter().find(|p| p.name() == name)
    }
}

pub(crate) const NODE_SIZE: u64 = 8 << 20;
const CHUNK: u64 = 256 << 10;
const ADMIN: u8 = 127;

/// Formats every node and creates one register replicated on all of them.
pub(crate) fn setup(sim: &mut Sim, nodes: usize, layout: Layout) -> Register {
    setup_sized(sim, nodes, layout, NODE_SIZE)
}

/// [`setup`] of nodes of `node_size` bytes.
fn setup_sized(sim: &mut Sim, nodes: usize, layout: Layout, node_size: u64) -> Register {
    let admin = sim.client();
    sim.block_on(async move {
        let geo = LogGeometry::new(layout.max_value, CHUNK, 64).unwrap();
        for n in 0..nodes {
            Region::format_fresh(&admin, NodeId(n as u16), node_size, CHUNK).await.unwrap();
            writerlog::format(&admin, NodeId(n as u16), geo).await.unwrap();
        }
        let mut ctx = ClientCtx::new(ADMIN, || 0).unwrap();
        let ids: Vec<NodeId> = (0..nodes).map(|n| NodeId(n as u16)).collect();
        Register::create(&mut ctx, &admin, &ids, layout).await.unwrap()
    })
    .unwrap()
}

/// What one campaign run is made of.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Campaign {
    pub protocol: Protocol,
    pub replicas: usize,
    pub writers: u8,
    pub readers: u8,
    pub ops: u64,
    pub max_skew_ns: u64,
    pub think_ns: u64,
    /// Least think time, so background work of the previous operation can land.
    pub min_think_ns: u64,
    pub faults: bool,
    /// Every client both reads and writes (a coin per operation).
    pub mixed: bool,
    /// Heavy-tailed message delays (one in 20 is 10 times slower).
    pub tails: bool,
    /// Operations of a client to a node apply in order (RDMA RC queue pairs).
    pub fifo: bool,
    /// Metadata words per object (0: 1 or 8, by seed).
    pub meta_words: u32,
    /// A low-jitter fabric (2.0-2.2 µs roundtrips) instead of 1-3 µs.
    pub tight: bool,
    /// A client paused mid-run (a process stopped with SIGSTOP, then
    /// continued), for less than a time-out or for up to 2 ms: it comes
    /// back in the middle of an operation, with the clock readings and
    /// knowledge it had before.
    pub pause: bool,
}

/// Statistics of one run.
#[derive(Default, Debug, Clone)]
pub(crate) struct RunReport {
    pub ops: usize,
    pub max_rtt: u32,
    pub write_rtts: Vec<u32>,
    pub read_rtts: Vec<u32>,
    pub paths: [u32; 3],
    /// The rare paths the clients took, summed.
    pub taken: Paths,
    /// Operations in flight all through their client's pause
    /// ([`Campaign::pause`]).
    pub paused: usize,
}

type Hist = History<RegisterOp, RegisterRet>;

/// One seeded run; `Err` carries a description and the replay command.
pub(crate) fn run_campaign(seed: u64, c: Campaign) -> Result<RunReport, String> {
    let replay = format!(
        "replay: SWARM_PROTOCOL={} SWARM_SEED={seed} SWARM_REPLICAS={} cargo test -p swarm-core --lib check::register::replay -- --nocapture",
        c.protocol.name(),
        c.replicas
    );
    // A log segment (a chunk) per client on every node, and room to spare.
    let node_size = NODE_SIZE.max(CHUNK * (8 + 2 * u64::from(c.writers + c.readers)));
    let tail_one_in = if c.tails { SimConfig::default().tail_one_in } else { 0 };
    let cfg = SimConfig {
        seed,
        nodes: c.replicas,
        node_size,
        max_piece_gap_ns: 500,
        tail_one_in,
        fifo_per_queue: c.fifo,
        min_latency_ns: if c.tight { 2_000 } else { 1_000 },
        max_latency_ns: if c.tight { 2_200 } else { 3_000 },
        ..SimConfig::default()
    };
    let mut sim = Sim::new(cfg);
    let size = [8, 64, 200][(seed % 3) as usize];
    let layout = match c.protocol {
        Protocol::SafeGuess if c.meta_words > 0 => Layout::new(c.meta_words, 256).unwrap(),
        Protocol::SafeGuess => Layout::new(1 + (seed % 2) as u32 * 7, 256).unwrap(),
        Protocol::Abd => abd::layout(256).unwrap(),
    };
    let reg = setup_sized(&mut sim, c.replicas, layout, node_size);
    let hist: Rc<RefCell<Hist>> = Rc::new(RefCell::new(History::new()));
    let report = Rc::new(RefCell::new(RunReport::default()));
    let failures: Rc<RefCell<Vec<String>>> = Rc::new(RefCell::new(Vec::new()));
    let start = sim.now();
    let mut clients = Vec::new();
    for i in 0..(c.writers + c.readers) {
        let id = i + 1;
        let is_writer = i < c.writers;
        let mixed = c.mixed;
        let mem = sim.client();
        let skew = sim.random(0, c.max_skew_ns) / TICK_NS;
        let think = sim.random(0, c.think_ns);
        let min_think = c.min_think_ns;
        let (reg, hist, report, failures, m) =
            (reg.clone(), hist.clone(), report.clone(), failures.clone(), mem.clone());
        let ops = c.ops;
        let protocol = c.protocol;
        let replicas = c.replicas;
        sim.spawn(&mem, async move {
            let mut ctx = ClientCtx::new(id, clock(&m, skew)).unwrap();
            // Half the clients once saw a node fail and start their
            // majorities elsewhere (SWARM §6): otherwise every client
            // would try the same majority first, and a write that reached
            // too few replicas would go unnoticed.
            if m.random(0, 1) == 0 {
                ctx.nodes.note(NodeId(m.random(0, replicas as u64 - 1) as u16), true);
            }
            let mut cache = RegCache::default();
            if let Err(e) = ctx.prepare(&m).await {
                // A crashed majority of the cluster's nodes (with 5 replicas
                // and one more node down) is not tolerated: not the case here.
                failures.borrow_mut().push(format!("client {id}: prepare failed: {e}"));
                return;
            }
            for seq in 1..=ops {
                m.sleep(min_think + m.random(0, think)).await;
                let counted = Counted::new(&m);
                let at = m.now();
                if (mixed && m.random(0, 1) == 0) || (!mixed && is_writer) {
                    let v = value(id, seq, size);
                    let op = hist.borrow_mut().invoke(id as u32, at, RegisterOp::Write(id_of(&v)));
                    let written = match protocol {
                        Protocol::SafeGuess => safeguess::write(&mut ctx, &counted, &reg, &mut cache, &v).await,
                        Protocol::Abd => abd::write(&mut ctx, &counted, &reg, &mut cache, &v)
                            .await
                            .map(|m| (m, safeguess::WritePath::Fast)),
                    };
                    match written {
                        Ok((_, path)) => {
                            hist.borrow_mut().respond(op, m.now(), RegisterRet::Ack);
                            let mut r = report.borrow_mut();
                            r.write_rtts.push(counted.roundtrips());
                            r.paths[path as usize] += 1;
                        }
                        Err(e) => failures.borrow_mut().push(format!("client {id} write {seq}: {e}")),
                    }
                } else {
                    let op = hist.borrow_mut().invoke(id as u32, at, RegisterOp::Read);
                    let got = match protocol {
                        Protocol::SafeGuess => safeguess::read(&mut ctx, &counted, &reg, &mut cache).await,
                        Protocol::Abd => abd::read(&mut ctx, &counted, &reg, &mut cache).await,
                    };
                    match got {
                        Ok((_, v)) => {
                            hist.borrow_mut().respond(op, m.now(), RegisterRet::Value(id_of(&v)));
                            report.borrow_mut().read_rtts.push(counted.roundtrips());
                        }
                        Err(e) => failures.borrow_mut().push(format!("client {id} read {seq}: {e}")),
                    }
                }
                let mut r = report.borrow_mut();
                r.max_rtt = r.max_rtt.max(counted.roundtrips());
                r.ops += 1;
            }
            report.borrow_mut().taken.add(&ctx.paths);
        });
        clients.push(mem);
    }
    if c.faults {
        // A minority of nodes crash (f = 1 with 3 replicas, up to 2 with 5),
        // one client crashes mid-run, one node may turn slow.
        let f = (c.replicas - 1) / 2;
        for _ in 0..sim.random(1, f as u64) {
            let node = sim.random(0, c.replicas as u64 - 1) as usize;
            let at = start + sim.random(0, 60_000);
            let mode = if sim.random(0, 1) == 0 { CrashMode::Hang } else { CrashMode::FailFast };
            sim.crash_node_at(node, at, mode);
        }
        let victim = sim.random(0, clients.len() as u64 - 1) as usize;
        let at = start + sim.random(0, 60_000);
        sim.crash_client_at(&clients[victim], at);
        let slow = sim.random(0, c.replicas as u64 - 1) as usize;
        sim.slow_node_at(slow, start + sim.random(0, 30_000), 5);
        // A node stalls for less than the clients' time-out: what reaches
        // it lands late, and quorums must not wait for it (SWARM §6).
        // (Not the slow node: slow and stalled, it would time out, a fault
        // beyond the crashed minority.)
        let stalled = (slow + 1 + sim.random(0, c.replicas as u64 - 2) as usize) % c.replicas;
        let (at, ns) = (start + sim.random(0, 60_000), sim.random(2_000, 25_000));
        sim.stall_node_at(stalled, at, ns);
    }
    // Drawn last, so that the other faults of a seed are the same with it.
    // (Clients prepare for about 10 µs, then run for about 100.)
    let lengths = [(2_000, 40_000), (100_000, 2_000_000)];
    let pause = c.pause.then(|| Pause::draw(&mut sim, &clients, (start + 10_000, start + 100_000), &lengths));
    if let Err(e) = sim.run() {
        return Err(format!("seed {seed}: {e} (an operation of a live client did not complete)\n{replay}"));
    }
    if let Some(f) = failures.borrow().first() {
        return Err(format!("seed {seed}: {f}\n{replay}"));
    }
    let h = hist.borrow();
    // Written values are distinct: the checker's zones decide at once.
    let verdict = lincheck::check(&lincheck::Register::new(0), h.operations());
    if !verdict.is_linearizable() {
        return Err(format!("seed {seed}: history of {} ops is not linearizable: {verdict:?}\n{replay}", h.len()));
    }
    let mut r = report.borrow().clone();
    // (A paused client that also crashed leaves its last operation
    // pending: counted too, as the crash may come after the pause.)
    r.paused = pause.map_or(0, |p| p.caught(h.operations()));
    Ok(r)
}

/// The run for `seed`: 1 to 4 writers and 1 to 3 readers doing 10
/// operations each with little think time, clocks skewed by up to 0, 2 or 30
/// µs (the roundtrip is 1-3 µs), and in four runs out of five a crashed
/// minority of nodes, a slow node and a client crashing mid-operation.
pub(crate) fn campaign_for(protocol: Protocol, replicas: usize, seed: u64) -> Campaign {
    let normal = Campaign {
        protocol,
        replicas,
        writers: 1 + (seed % 4) as u8,
        readers: 1 + ((seed / 4) % 3) as u8,
        ops: 10,
        max_skew_ns: [0, 2_000, 30_000][(seed % 3) as usize],
        think_ns: 2_000,
        min_think_ns: 0,
        faults: !seed.is_multiple_of(5),
        mixed: seed % 3 == 2,
        tails: true,
        fifo: false,
        meta_words: 0,
        tight: false,
        pause: seed % 8 == 6,
    };
    if seed.is_multiple_of(2) {
        return normal;
    }
    // Adversarial mix: two writers whose clocks differ by about a roundtrip
    // (so guesses are stale while the newer write is still in flight) and
    // three readers in a tight loop: the schedules where a GUESSED tuple
    // must not be returned too early (Fig. 2 of the paper).
    Campaign {
        writers: 2,
        readers: 3,
        ops: 16,
        max_skew_ns: 1_000 * (1 + seed % 6),
        think_ns: 300,
        faults: !seed.is_multiple_of(3),
        ..normal
    }
}

/// Runs seeds `0..runs` of `protocol` on `replicas` nodes, panics with the
/// replay command on the first failure, and prints the summary line: runs,
/// operations, and the most roundtrips any operation took.
pub(crate) fn campaign(protocol: Protocol, replicas: usize, runs: u64) {
    let (mut max_rtt, mut ops, mut taken, mut writes, mut paused) = (0, 0, Paths::default(), [0u64; 3], 0);
    for seed in 0..runs {
        match run_campaign(seed, campaign_for(protocol, replicas, seed)) {
            Ok(r) => {
                max_rtt = max_rtt.max(r.max_rtt);
                ops += r.ops;
                taken.add(&r.taken);
                paused += r.paused as u64;
                for (w, n) in writes.iter_mut().zip(r.paths) {
                    *w += u64::from(n);
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    std::println!(
        "{}, {replicas} replicas: {runs} runs, {ops} ops, max roundtrips of one op: {max_rtt}; \
         writes fast / rewritten / reader-locked: {writes:?}; caught by a pause: {paused}; {taken:?}",
        protocol.name()
    );
    // What the campaign must have exercised, per 1,000 runs: a campaign
    // that stops reaching a path tests nothing there.
    let per = |n: u64| n * runs / 1_000;
    let mut least = alloc::vec![
        ("out-of-place reads", taken.out_of_place_reads, per(500)),
        ("write-backs", taken.write_backs, per(500)),
        ("widened quorums", taken.widened, per(500)),
        // One run in eight pauses a client (measured: 20 to 31 per 1,000
        // runs).
        ("operations a pause caught in flight", paused, per(10)),
    ];
    if protocol == Protocol::SafeGuess {
        least.extend([
            ("slow-path writes", taken.slow_writes, per(500)),
            ("rewritten writes", writes[1], per(100)),
            ("writes a reader had locked", writes[2], per(1)),
            ("reads of GUESSED tuples", taken.unverified_reads, per(100)),
            ("reader locks", taken.reader_locks, per(10)),
        ]);
    }
    for (path, ran, min) in least {
        assert!(ran >= min, "{}: {path} ran {ran} times in {runs} runs, fewer than {min}", protocol.name());
    }
}

/// Replays one campaign run:
/// `SWARM_PROTOCOL=safeguess|abd SWARM_SEED=<seed> SWARM_REPLICAS=<n>`.
#[test]
fn replay() {
    let Ok(seed) = std::env::var("SWARM_SEED") else { return };
    let seed: u64 = seed.parse().expect("SWARM_SEED must be a number");
    let replicas = std::env::var("SWARM_REPLICAS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let name = std::env::var("SWARM_PROTOCOL").unwrap_or_else(|_| "safeguess".into());
    let protocol = Protocol::from_name(&name).expect("SWARM_PROTOCOL must be safeguess or abd");
    let c = campaign_for(protocol, replicas, seed);
    std::println!("{c:?}");
    match run_campaign(seed, c) {
        Ok(r) => std::println!("ok: {r:?}"),
        Err(e) => panic!("{e}"),
    }
}

pub(crate) fn percentile(sorted: &[u32], p: f64) -> u32 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Share of operations that took 1, 2, 3 and 4 or more roundtrips, in %.
pub(crate) fn shares(rtts: &[u32]) -> [f64; 4] {
    let mut out = [0.0; 4];
    for &r in rtts {
        out[(r.clamp(1, 4) - 1) as usize] += 100.0 / rtts.len() as f64;
    }
    out
}
