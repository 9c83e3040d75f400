//! Safe-Guess under the simulator: unit behaviour, roundtrips, and seeded
//! campaigns with crashes, delays and clock skew whose every history must be
//! linearizable.
//!
//! A failing campaign run prints the command that replays it:
//! `SWARM_SEED=<seed> SWARM_REPLICAS=<n> cargo test -p swarm-core --lib safeguess::tests::replay -- --nocapture`

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use super::*;
use crate::NodeId;
use crate::inout::Layout;
use crate::lincheck::{self, History, RegisterOp, RegisterRet};
use crate::region::Region;
use crate::rtt::Counted;
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
use crate::writerlog::{self, LogGeometry};

const NODE_SIZE: u64 = 8 << 20;
const CHUNK: u64 = 256 << 10;
const ADMIN: u8 = 127;

/// Formats every node and creates one register replicated on all of them.
fn setup(sim: &mut Sim, nodes: usize, layout: Layout) -> Register {
    let admin = sim.client();
    sim.block_on(async move {
        let geo = LogGeometry::new(layout.max_value, CHUNK, 64).unwrap();
        for n in 0..nodes {
            Region::format(&admin, NodeId(n as u16), NODE_SIZE, CHUNK).await.unwrap();
            writerlog::format(&admin, NodeId(n as u16), geo).await.unwrap();
        }
        let mut ctx = ClientCtx::new(ADMIN, || 0).unwrap();
        let ids: Vec<NodeId> = (0..nodes).map(|n| NodeId(n as u16)).collect();
        Register::create(&mut ctx, &admin, &ids, layout).await.unwrap()
    })
    .unwrap()
}

/// Clock resolution of the simulated clients: 100 ns, as a TSC-based clock
/// gives; coarser ticks make concurrent writers' guesses tie and go stale.
const TICK_NS: u64 = 100;

fn clock(mem: &SimMemory, skew_ticks: u64) -> impl Fn() -> u64 + use<> {
    let mem = mem.clone();
    move || mem.now() / TICK_NS + skew_ticks
}

/// The value written by `client` as its `seq`-th write: its id in the first
/// 8 bytes, then filler up to `len` bytes (at least 8).
fn value(client: u8, seq: u64, len: usize) -> Vec<u8> {
    let id = ((client as u64) << 32) | seq;
    let mut v = vec![(id % 251) as u8; len.max(8)];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

fn id_of(bytes: &[u8]) -> u64 {
    bytes.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

#[test]
fn write_then_read_in_one_roundtrip_each() {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    let reg = setup(&mut sim, 3, Layout::new(1, 256).unwrap());
    let mem = sim.client();
    let rtts = sim
        .block_on(async move {
            let mut ctx = ClientCtx::new(1, clock(&mem, 0)).unwrap();
            let mut cache = RegCache::default();
            // Warm up: the first write reserves log ids and opens the log directories.
            write(&mut ctx, &mem, &reg, &mut cache, &value(1, 0, 64)).await.unwrap();
            let mut rtts = Vec::new();
            for seq in 1..20 {
                mem.sleep(10_000).await;
                let c = Counted::new(&mem);
                let (_, path) = write(&mut ctx, &c, &reg, &mut cache, &value(1, seq, 64)).await.unwrap();
                assert_eq!(path, WritePath::Fast);
                let w = c.roundtrips();
                mem.sleep(10_000).await;
                let c = Counted::new(&mem);
                let (m, v) = read(&mut ctx, &c, &reg, &mut cache).await.unwrap();
                assert!(m.verified(), "the background VERIFIED marking landed");
                assert_eq!(id_of(&v), (1 << 32) | seq);
                rtts.push((w, c.roundtrips()));
            }
            rtts
        })
        .unwrap();
    assert!(rtts.iter().all(|&r| r == (1, 1)), "uncontended write and read take 1 roundtrip: {rtts:?}");
}

#[test]
fn a_stale_guess_is_rewritten_and_reads_stay_correct() {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    let reg = setup(&mut sim, 3, Layout::new(1, 64).unwrap());
    let (fast, slow) = (sim.client(), sim.client());
    let paths = sim
        .block_on(async move {
            // Client 2's clock is far ahead; client 1's guesses are stale.
            let mut c2 = ClientCtx::new(2, clock(&fast, 1_000_000)).unwrap();
            let mut c1 = ClientCtx::new(1, clock(&slow, 0)).unwrap();
            let (mut k1, mut k2) = (RegCache::default(), RegCache::default());
            write(&mut c2, &fast, &reg, &mut k2, &value(2, 1, 8)).await.unwrap();
            let (w, p1) = write(&mut c1, &slow, &reg, &mut k1, &value(1, 1, 8)).await.unwrap();
            let (_, v) = read(&mut c2, &fast, &reg, &mut k2).await.unwrap();
            assert_eq!(id_of(&v), (1 << 32) | 1, "the rewritten value is the latest");
            // Re-synchronised: the next guess is fresh.
            let (_, p2) = write(&mut c1, &slow, &reg, &mut k1, &value(1, 2, 8)).await.unwrap();
            (w.verified(), p1, p2)
        })
        .unwrap();
    assert_eq!(paths, (true, WritePath::Rewritten, WritePath::Fast));
}

#[test]
fn values_up_to_the_layout_limit_and_no_further() {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() });
    let reg = setup(&mut sim, 3, Layout::new(4, 8192).unwrap());
    let mem = sim.client();
    sim.block_on(async move {
        let mut ctx = ClientCtx::new(5, clock(&mem, 0)).unwrap();
        let mut cache = RegCache::default();
        let big = value(5, 1, 8192);
        write(&mut ctx, &mem, &reg, &mut cache, &big).await.unwrap();
        let (_, v) = read(&mut ctx, &mem, &reg, &mut cache).await.unwrap();
        assert_eq!(&*v, &big[..]);
        let too_big = vec![0u8; 8193];
        assert!(matches!(
            write(&mut ctx, &mem, &reg, &mut cache, &too_big).await,
            Err(RegError::ValueTooLarge { len: 8193, max: 8192 })
        ));
    })
    .unwrap();
}

/// A garbled in-place copy (a torn or corrupted write) is detected by its
/// hash and the out-of-place copy is used; a garbled length never reads
/// out of bounds.
#[test]
fn garbled_in_place_data_falls_back_out_of_place() {
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() });
    let reg = setup(&mut sim, 3, Layout::new(1, 128).unwrap());
    let mem = sim.client();
    sim.block_on(async move {
        let mut ctx = ClientCtx::new(3, clock(&mem, 0)).unwrap();
        let mut cache = RegCache::default();
        let v = value(3, 7, 100);
        write(&mut ctx, &mem, &reg, &mut cache, &v).await.unwrap();
        mem.sleep(50_000).await;
        for rep in &reg.replicas {
            // Corrupt a value byte, then the length, of every in-place copy.
            mem.write(RemoteAddr::new(rep.node, rep.base + 8 + 16 + 50), &[0xFF]).await.unwrap();
        }
        let c = Counted::new(&mem);
        let (_, got) = read(&mut ctx, &c, &reg, &mut cache).await.unwrap();
        assert_eq!(&*got, &v[..]);
        assert_eq!(c.roundtrips(), 2, "one READ, then the out-of-place copy");
        for rep in &reg.replicas {
            mem.write(RemoteAddr::new(rep.node, rep.base + 8 + 8), &u64::MAX.to_le_bytes()).await.unwrap();
        }
        let (_, got) = read(&mut ctx, &mem, &reg, &mut cache).await.unwrap();
        assert_eq!(&*got, &v[..]);
    })
    .unwrap();
}

/// What one campaign run is made of.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Campaign {
    pub replicas: usize,
    pub writers: u8,
    pub readers: u8,
    pub ops: u64,
    pub max_skew_ticks: u64,
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
}

/// Statistics of one run.
#[derive(Default, Debug, Clone)]
pub(crate) struct RunReport {
    pub ops: usize,
    pub max_rtt: u32,
    pub write_rtts: Vec<u32>,
    pub read_rtts: Vec<u32>,
    pub paths: [u32; 3],
}

type Hist = History<RegisterOp, RegisterRet>;

/// One seeded run; `Err` carries a description and the replay command.
pub(crate) fn run_campaign(seed: u64, c: Campaign) -> Result<RunReport, String> {
    let replay = format!(
        "replay: SWARM_SEED={seed} SWARM_REPLICAS={} cargo test -p swarm-core --lib safeguess::tests::replay -- --nocapture",
        c.replicas
    );
    let tail_one_in = if c.tails { SimConfig::default().tail_one_in } else { 0 };
    let cfg = SimConfig {
        seed,
        nodes: c.replicas,
        node_size: NODE_SIZE,
        max_piece_gap_ns: 500,
        tail_one_in,
        fifo_per_queue: c.fifo,
        ..SimConfig::default()
    };
    let mut sim = Sim::new(cfg);
    let size = [8, 64, 200][(seed % 3) as usize];
    let reg = setup(&mut sim, c.replicas, Layout::new(1 + (seed % 2) as u32 * 7, 256).unwrap());
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
        let skew = sim.random(0, c.max_skew_ticks);
        let think = sim.random(0, c.think_ns);
        let min_think = c.min_think_ns;
        let (reg, hist, report, failures, m) =
            (reg.clone(), hist.clone(), report.clone(), failures.clone(), mem.clone());
        let ops = c.ops;
        sim.spawn(&mem, async move {
            let mut ctx = ClientCtx::new(id, clock(&m, skew)).unwrap();
            let mut cache = RegCache::default();
            if ctx.prepare(&m).await.is_err() {
                // A crashed majority of the cluster's nodes (with 5 replicas
                // and one more node down) is not tolerated: not the case here.
                failures.borrow_mut().push(format!("client {id}: prepare failed"));
                return;
            }
            for seq in 1..=ops {
                m.sleep(min_think + m.random(0, think)).await;
                let counted = Counted::new(&m);
                let at = m.now();
                if (mixed && m.random(0, 1) == 0) || (!mixed && is_writer) {
                    let v = value(id, seq, size);
                    let op = hist.borrow_mut().invoke(id as u32, at, RegisterOp::Write(id_of(&v)));
                    match write(&mut ctx, &counted, &reg, &mut cache, &v).await {
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
                    match read(&mut ctx, &counted, &reg, &mut cache).await {
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
    }
    if let Err(e) = sim.run() {
        return Err(format!("seed {seed}: {e} (an operation of a live client did not complete)\n{replay}"));
    }
    if let Some(f) = failures.borrow().first() {
        return Err(format!("seed {seed}: {f}\n{replay}"));
    }
    let h = hist.borrow();
    let verdict = lincheck::check(&lincheck::Register::new(0), h.operations());
    if !verdict.is_linearizable() {
        return Err(format!("seed {seed}: history of {} ops is not linearizable: {verdict:?}\n{replay}", h.len()));
    }
    let r = report.borrow().clone();
    Ok(r)
}

/// The run for `seed`: 1 to 4 writers and 1 to 3 readers doing 10
/// operations each with little think time, clocks skewed by up to 0, 2 or 30
/// µs (the roundtrip is 1-3 µs), and in four runs out of five a crashed
/// minority of nodes, a slow node and a client crashing mid-operation.
fn campaign_for(replicas: usize, seed: u64) -> Campaign {
    if seed % 2 == 1 {
        // Adversarial mix: two writers whose clocks differ by about a
        // roundtrip (so guesses are stale while the newer write is still in
        // flight) and three readers in a tight loop: the schedules where a
        // GUESSED tuple must not be returned too early (Fig. 2 of the paper).
        return Campaign {
            replicas,
            writers: 2,
            readers: 3,
            ops: 16,
            max_skew_ticks: 1 + seed % 6,
            think_ns: 300,
            min_think_ns: 0,
            faults: !seed.is_multiple_of(3),
            mixed: seed % 3 == 2,
            tails: true,
            fifo: false,
        };
    }
    Campaign {
        replicas,
        writers: 1 + (seed % 4) as u8,
        readers: 1 + ((seed / 4) % 3) as u8,
        ops: 10,
        max_skew_ticks: [0, 2, 30][(seed % 3) as usize],
        think_ns: 2_000,
        min_think_ns: 0,
        faults: !seed.is_multiple_of(5),
        mixed: seed % 3 == 2,
        tails: true,
        fifo: false,
    }
}

fn campaign(replicas: usize, runs: u64) -> (u32, usize) {
    let (mut max_rtt, mut ops) = (0, 0);
    for seed in 0..runs {
        match run_campaign(seed, campaign_for(replicas, seed)) {
            Ok(r) => {
                max_rtt = max_rtt.max(r.max_rtt);
                ops += r.ops;
            }
            Err(e) => panic!("{e}"),
        }
    }
    (max_rtt, ops)
}

#[test]
fn campaign_3_replicas() {
    let (max_rtt, ops) = campaign(3, 5_000);
    std::println!("safe-guess, 3 replicas: 5000 runs, {ops} ops, max roundtrips of one op: {max_rtt}");
}

#[test]
fn campaign_5_replicas() {
    let (max_rtt, ops) = campaign(5, 5_000);
    std::println!("safe-guess, 5 replicas: 5000 runs, {ops} ops, max roundtrips of one op: {max_rtt}");
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Share of operations that took 1, 2, 3 and 4 or more roundtrips, in %.
fn shares(rtts: &[u32]) -> [f64; 4] {
    let mut out = [0.0; 4];
    for &r in rtts {
        out[(r.clamp(1, 4) - 1) as usize] += 100.0 / rtts.len() as f64;
    }
    out
}

/// Roundtrips of Safe-Guess in the simulator, as the issue asks and the
/// paper reports (Table 2 and §7.8), with the network of the paper's
/// testbed: in-order queue pairs, no tail. Run with `--nocapture` to see the
/// table.
#[test]
fn roundtrip_report() {
    let base = Campaign {
        replicas: 3,
        writers: 16,
        readers: 0,
        ops: 40,
        max_skew_ticks: 0,
        think_ns: 0,
        min_think_ns: 0,
        faults: false,
        mixed: true,
        tails: false,
        fifo: true,
    };
    let scenarios = [
        (
            "uncontended, synced clocks",
            Campaign { writers: 1, ops: 400, min_think_ns: 10_000, think_ns: 10_000, ..base },
        ),
        ("16 clients, 1 register, YCSB-A, synced", base),
        ("16 clients, 1 register, YCSB-A, skew <= 5 us", Campaign { max_skew_ticks: 5_000 / TICK_NS, ..base }),
    ];
    std::println!("scenario | op | p50 | p99 | max | % in 1 / 2 / 3 / 4+ roundtrips");
    for (i, (name, c)) in scenarios.iter().enumerate() {
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        for seed in 0..10 {
            let r = run_campaign(1000 * i as u64 + seed, *c).unwrap_or_else(|e| panic!("{e}"));
            writes.extend(r.write_rtts);
            reads.extend(r.read_rtts);
        }
        writes.sort_unstable();
        reads.sort_unstable();
        for (op, v) in [("update", &writes), ("get", &reads)] {
            let s = shares(v);
            std::println!(
                "{name} | {op} | {} | {} | {} | {:.0} / {:.0} / {:.0} / {:.0}",
                percentile(v, 0.5),
                percentile(v, 0.99),
                v[v.len() - 1],
                s[0],
                s[1],
                s[2],
                s[3]
            );
        }
        if i == 0 {
            assert_eq!((percentile(&writes, 0.5), percentile(&writes, 0.99)), (1, 1), "uncontended updates");
            assert_eq!((percentile(&reads, 0.5), percentile(&reads, 0.99)), (1, 1), "uncontended gets");
        }
    }
    std::println!("paper §7.8 (16 clients, 1 key, YCSB-A, RDMA): updates 73 / 7 / 14 / 6 %");
}

/// Replays one campaign run: `SWARM_SEED=<seed> SWARM_REPLICAS=<n>`.
#[test]
fn replay() {
    let Ok(seed) = std::env::var("SWARM_SEED") else { return };
    let seed: u64 = seed.parse().expect("SWARM_SEED must be a number");
    let replicas = std::env::var("SWARM_REPLICAS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let c = campaign_for(replicas, seed);
    std::println!("{c:?}");
    match run_campaign(seed, c) {
        Ok(r) => std::println!("ok: {r:?}"),
        Err(e) => panic!("{e}"),
    }
}
