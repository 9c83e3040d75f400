//! Seeded campaigns of clients calling a server beside a memory node, in
//! the simulator: delays with heavy tails, transfers torn in pieces, a
//! server that crashes and is restarted, stalls, or turns slow, and a
//! client that crashes mid-call. The server is a [`Counter`] (fetch-and-add
//! on a word of its node, so that its state survives it); clients mix
//! additions with pings carrying a body of their own.
//!
//! Checked on every run: each ping's answer is exactly its request's body
//! (nothing lost, torn, duplicated or mixed up between calls or clients);
//! the additions, with every call that failed counted as one that may or
//! may not have run, and a final read of the word, are linearizable for a
//! counter (`swarm_lincheck::Counter`): no request is ever served twice.
//! Over a campaign, [`Paths`] counts what ran, and the tests require each
//! path a stated number of times.
//!
//! A failing run prints the command that replays it:
//! `SWARM_SEED=<seed> cargo test -p swarm-core --lib check::rpc::tests::replay -- --nocapture`.

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;

use swarm_lincheck::{self as lincheck, Counter as CounterModel, CounterOp, CounterRet, History};

use super::clock;
use crate::sim::{ServerShell, Sim, SimConfig, SimMemory};
use crate::substrate::memory::{read_word, word_at};
use crate::substrate::msg::MsgError;
use crate::substrate::msg::area::Geometry;
use crate::substrate::msg::rpc::{Channel, Status, method};
use crate::substrate::msg::server::{Request, Server, Service};
use crate::substrate::space::Region;
use crate::{Memory, NodeId, RemoteAddr};

/// The node the server runs beside.
pub const NODE: NodeId = NodeId(1);
/// Small rings, so that they wrap often.
const GEO: Geometry = Geometry { channels: 8, ring_bytes: 256 };
/// A call's time-out (roundtrips are 1-3 µs, one in 20 ten times longer).
const TIMEOUT_NS: u64 = 40_000;
/// Time a server needs to start, with room to spare.
const SERVER_UP_NS: u64 = 60_000;

/// A service that adds one to a counter kept in its node's memory and
/// answers the value before: a read and a CAS, two memory operations.
pub struct Counter {
    /// The counter's word.
    pub word: RemoteAddr,
}

/// The counter's method.
pub const ADD: u16 = method::FIRST_SERVICE;

impl Service for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    async fn handle<M: Memory>(&mut self, mem: &M, req: Request<'_>, out: &mut Vec<u8>, _: usize) -> Status {
        if req.method != ADD {
            return Status::NoSuchMethod;
        }
        let Ok(mut cur) = read_word(mem, self.word).await else { return Status::Failed };
        loop {
            match mem.cas(self.word, cur, cur.wrapping_add(1)).await {
                Ok(prev) if prev == cur => break,
                Ok(prev) => cur = prev,
                Err(_) => return Status::Failed,
            }
        }
        out.extend_from_slice(&cur.to_le_bytes());
        Status::Ok
    }
}

/// What ran, over one run or a campaign.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Calls answered.
    pub answered: u64,
    /// Calls that timed out.
    pub timed_out: u64,
    /// Calls told that the server stopped or restarted, or that found none.
    pub no_server: u64,
    /// Reconnections of channels (a new generation).
    pub reconnects: u64,
    /// Late answers to timed-out calls, recognised and skipped.
    pub late_answers: u64,
    /// Times a request ring wrapped around.
    pub wraps: u64,
    /// Servers crashed (and restarted).
    pub restarts: u64,
    /// Servers stalled.
    pub stalls: u64,
    /// Clients crashed mid-run.
    pub client_crashes: u64,
    /// Calls checked (answers compared, additions checked by the counter model).
    pub checked: u64,
}

impl Paths {
    fn add(&mut self, o: &Paths) {
        self.answered += o.answered;
        self.timed_out += o.timed_out;
        self.no_server += o.no_server;
        self.reconnects += o.reconnects;
        self.late_answers += o.late_answers;
        self.wraps += o.wraps;
        self.restarts += o.restarts;
        self.stalls += o.stalls;
        self.client_crashes += o.client_crashes;
        self.checked += o.checked;
    }
}

/// Runs seeds `from..from + runs`: what ran, or the first failure with the
/// command that replays it.
pub fn campaign(from: u64, runs: u64) -> Result<Paths, String> {
    let mut total = Paths::default();
    for seed in from..from + runs {
        total.add(&run(seed)?);
    }
    Ok(total)
}

/// The ping body of `client`'s `seq`-th call: its name and filler.
fn ping_body(client: u8, seq: u64) -> Vec<u8> {
    let id = (client as u64) << 32 | seq;
    let len = 8 + (id % 5) as usize * 12;
    (0..len).map(|i| if i < 8 { id.to_le_bytes()[i] } else { (id as usize * 7 + i) as u8 }).collect()
}

/// One seeded run.
pub fn run(seed: u64) -> Result<Paths, String> {
    let replay =
        format!("replay: SWARM_SEED={seed} cargo test -p swarm-core --lib check::rpc::tests::replay -- --nocapture");
    run_inner(seed).map_err(|e| format!("seed {seed}: {e}\n{replay}"))
}

type Hist = History<CounterOp, CounterRet>;

fn run_inner(seed: u64) -> Result<Paths, String> {
    let mut sim =
        Sim::new(SimConfig { seed, nodes: 2, node_size: 1 << 20, max_piece_gap_ns: 500, ..SimConfig::default() });
    let admin = sim.client();
    let word = sim
        .block_on(async move {
            for n in 0..2 {
                Region::format(&admin, NodeId(n), 1 << 20, 16 << 10).await?;
            }
            Region::open(&admin, NODE).await?.alloc_chunk(&admin).await
        })
        .map_err(|e| format!("setup: {e}"))?
        .map_err(|e| format!("setup: {e}"))?;
    let faults = !seed.is_multiple_of(4);
    let clients = 2 + (seed % 3) as u8;
    let calls = 30;
    let mut paths = Paths::default();

    // The first server, and the one that replaces it after a crash.
    let first = sim.client();
    let shell = ServerShell::new(&first, 200);
    let (m, sh) = (first.clone(), shell.clone());
    sim.spawn(&first, async move {
        if let Ok(mut s) = Server::start(m, NODE, GEO, Counter { word }).await {
            let _ = s.run(&sh).await;
        }
    });
    let start = sim.now();
    if faults {
        let crash_at = start + SERVER_UP_NS + sim.random(0, 150_000);
        let restart_at = crash_at + sim.random(0, 60_000);
        sim.crash_client_at(&first, crash_at);
        let second = sim.client();
        let (m, sh) = (second.clone(), shell.for_client(&second));
        sim.spawn(&second, async move {
            m.sleep(restart_at.saturating_sub(m.now())).await;
            if let Ok(mut s) = Server::start(m, NODE, GEO, Counter { word }).await {
                let _ = s.run(&sh).await;
            }
        });
        paths.restarts += 1;
        if sim.random(0, 1) == 0 {
            let at = start + SERVER_UP_NS + sim.random(0, 100_000);
            sim.stall_client_at(&first, at, sim.random(10_000, 80_000));
            paths.stalls += 1;
        }
        sim.slow_client_at(&second, restart_at + sim.random(0, 50_000), 1 + sim.random(0, 3));
    }

    let hist: Rc<RefCell<Hist>> = Rc::default();
    let failures: Rc<RefCell<Vec<String>>> = Rc::default();
    let observed: Rc<RefCell<Paths>> = Rc::default();
    let done: Rc<RefCell<u8>> = Rc::default();
    let mut handles = Vec::new();
    for id in 1..=clients {
        let c = sim.client();
        let (hist, failures, observed, done, shell) =
            (hist.clone(), failures.clone(), observed.clone(), done.clone(), shell.clone());
        let m = c.clone();
        sim.spawn(&c, async move {
            client(id, m, calls, &hist, &failures, &observed).await;
            *done.borrow_mut() += 1;
            if *done.borrow() == clients {
                shell.stop();
            }
        });
        handles.push(c);
    }
    if faults {
        let victim = sim.random(0, handles.len() as u64 - 1) as usize;
        let at = start + sim.random(0, 300_000);
        sim.crash_client_at(&handles[victim], at);
        paths.client_crashes += 1;
        // The others must still stop the servers.
        let (done, shell, m) = (done.clone(), shell.clone(), sim.client());
        let mm = m.clone();
        sim.spawn(&m, async move {
            mm.sleep(at.saturating_sub(mm.now()) + 1).await;
            *done.borrow_mut() += 1;
            if *done.borrow() == clients {
                shell.stop();
            }
        });
    }
    sim.run().map_err(|e| format!("{e} (a live client or server did not finish)"))?;
    if let Some(f) = failures.borrow().first() {
        return Err(f.clone());
    }
    // The counter's final value, read after everything stopped.
    let reader = sim.client();
    let end = sim
        .block_on(async move { read_word(&reader, word).await })
        .map_err(|e| format!("final read: {e}"))?
        .map_err(|e| format!("final read: {e}"))?;
    let mut h = hist.borrow_mut();
    let t = sim.now() + 1;
    let r = h.invoke(u32::MAX, t, CounterOp::Read);
    h.respond(r, t + 1, CounterRet::Value(end));
    let verdict = lincheck::check(&CounterModel, h.operations());
    if !verdict.is_linearizable() {
        return Err(format!("the additions are not linearizable for a counter: {verdict}"));
    }
    paths.add(&observed.borrow());
    Ok(paths)
}

/// One client: `calls` calls, additions and pings, recorded and checked.
async fn client(
    id: u8,
    m: SimMemory,
    calls: u64,
    hist: &RefCell<Hist>,
    failures: &RefCell<Vec<String>>,
    observed: &RefCell<Paths>,
) {
    let clock = clock(&m, 0);
    m.sleep(SERVER_UP_NS).await;
    let mut ch = None;
    for seq in 1..=calls {
        m.sleep(m.random(0, 3_000)).await;
        if ch.is_none() {
            match Channel::connect(&m, NODE, id as u16).await {
                Ok(c) => ch = Some(c),
                Err(MsgError::NoServer { .. }) => {
                    observed.borrow_mut().no_server += 1;
                    m.sleep(20_000).await;
                    continue;
                }
                Err(e) => return failures.borrow_mut().push(format!("client {id}: connect: {e}")),
            }
        }
        let Some(c) = ch.as_mut() else { continue };
        let add = m.random(0, 1) == 0;
        let (method, body) = if add { (ADD, Vec::new()) } else { (method::PING, ping_body(id, seq)) };
        let op = add.then(|| hist.borrow_mut().invoke(id as u32, m.now(), CounterOp::Add(1)));
        let out = c.call(&m, &clock, TIMEOUT_NS, method, &body).await;
        match out {
            Ok(reply) => {
                observed.borrow_mut().answered += 1;
                observed.borrow_mut().checked += 1;
                if reply.status != Status::Ok {
                    return failures.borrow_mut().push(format!("client {id} call {seq}: {}", reply.status));
                }
                match op {
                    Some(op) => match word_at(&reply.body, 0) {
                        Some(v) if reply.body.len() == 8 => {
                            hist.borrow_mut().respond(op, m.now(), CounterRet::Value(v));
                        }
                        _ => return failures.borrow_mut().push(format!("client {id} call {seq}: a malformed sum")),
                    },
                    None if reply.body[..] != body[..] => {
                        return failures.borrow_mut().push(format!(
                            "client {id} ping {seq}: answered {:02x?}, sent {:02x?}",
                            &reply.body[..],
                            body
                        ));
                    }
                    None => {}
                }
            }
            // Failed calls may have run: pending in the history.
            Err(MsgError::TimedOut) => observed.borrow_mut().timed_out += 1,
            Err(MsgError::NoServer { .. }) => {
                observed.borrow_mut().no_server += 1;
                m.sleep(10_000).await;
            }
            Err(MsgError::Full) => {}
            Err(e) => return failures.borrow_mut().push(format!("client {id} call {seq}: {e}")),
        }
    }
    if let Some(c) = ch {
        let s = c.stats();
        let mut o = observed.borrow_mut();
        o.reconnects += s.reconnects;
        o.late_answers += s.late_answers;
        o.wraps += s.wraps;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2,000 runs; each path that the faults open must have run.
    #[test]
    fn a_server_that_crashes_stalls_and_restarts_serves_each_request_at_most_once() {
        let p = campaign(0, 2_000).unwrap_or_else(|e| panic!("{e}"));
        std::println!("rpc campaign, 2000 runs: {p:?}");
        assert!(p.answered > 50_000 && p.checked > 50_000, "{p:?}");
        assert!(p.timed_out >= 200, "calls timed out on a stalled or crashed server: {p:?}");
        assert!(p.no_server >= 100, "calls found the server restarted: {p:?}");
        assert!(p.reconnects >= 300, "channels reconnected: {p:?}");
        assert!(p.late_answers >= 5, "late answers skipped: {p:?}");
        assert!(p.wraps >= 10_000, "rings wrapped: {p:?}");
        assert!(p.restarts >= 1_000 && p.stalls >= 500 && p.client_crashes >= 1_000, "{p:?}");
    }

    /// Replays one run: `SWARM_SEED=<seed>`.
    #[test]
    fn replay() {
        let Ok(seed) = std::env::var("SWARM_SEED") else { return };
        match run(seed.parse().expect("SWARM_SEED must be a number")) {
            Ok(p) => std::println!("ok: {p:?}"),
            Err(e) => panic!("{e}"),
        }
    }
}
