//! RPCs and servers in the simulator: what a call costs and answers, and
//! what a client sees when its server is stalled, stopped, restarted or
//! replaced. The seeded campaigns with crashes are `crate::check::rpc`.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::Cell;

use super::area::{Area, Geometry};
use super::rpc::{Channel, Status, method};
use super::server::{Server, Stats};
use super::*;
use crate::check::clock;
use crate::check::rpc::{ADD, Counter};
use crate::sim::{ServerShell, Sim, SimConfig, SimMemory};
use crate::substrate::memory::read_word;
use crate::substrate::rtt::Counted;
use crate::substrate::space::Region;
use crate::{NodeId, RemoteAddr};

const NODE: NodeId = NodeId(1);
const GEO: Geometry = Geometry { channels: 8, ring_bytes: 256 };
/// A client's call time-out: 20 µs of virtual time (roundtrips are 2 µs).
const TIMEOUT_NS: u64 = 20_000;
/// Virtual time a server takes to start (its area made, its incarnation
/// begun: a dozen roundtrips), with room to spare.
const SERVER_UP_NS: u64 = 50_000;

fn sim(seed: u64) -> Sim {
    Sim::new(SimConfig { seed, nodes: 2, node_size: 1 << 20, ..SimConfig::default() }.fixed_latency(2_000))
}

/// Formats the nodes; the counter's word.
fn setup(sim: &mut Sim) -> RemoteAddr {
    let admin = sim.client();
    sim.block_on(async move {
        for n in 0..2 {
            Region::format(&admin, NodeId(n), 1 << 20, 16 << 10).await.unwrap();
        }
        let mut r = Region::open(&admin, NODE).await.unwrap();
        r.alloc_chunk(&admin).await.unwrap()
    })
    .unwrap()
}

/// Starts a server beside [`NODE`] as a task of its own client; its shell.
fn spawn_server(sim: &mut Sim, word: RemoteAddr) -> (SimMemory, ServerShell) {
    spawn_server_at(sim, word, 0)
}

#[test]
fn a_call_is_one_roundtrip_and_reports_the_server_s_operations() {
    let mut sim = sim(1);
    let word = setup(&mut sim);
    let (_, shell) = spawn_server(&mut sim, word);
    let c = sim.client();
    sim.block_on(async move {
        let mem = Counted::new(c.clone());
        let clock = clock(&c, 0);
        c.sleep(SERVER_UP_NS).await;
        let mut ch = Channel::connect(&mem, NODE, 3).await.unwrap();
        for i in 0..20u64 {
            mem.reset();
            let t = c.now();
            let reply = ch.call(&mem, &clock, TIMEOUT_NS, method::PING, &i.to_le_bytes()).await.unwrap();
            assert_eq!(reply.status, Status::Ok);
            assert_eq!(&reply.body[..], &i.to_le_bytes());
            assert_eq!((mem.roundtrips(), mem.served()), (1, 0), "a ping is one roundtrip, no server operation");
            // The request's roundtrip, then the server's answer landing
            // (half a roundtrip after the request did), and local polls.
            assert!(c.now() - t <= 3_500, "a call took {} ns", c.now() - t);
            mem.reset();
            let n = ch.call(&mem, &clock, TIMEOUT_NS, ADD, &[]).await.unwrap().ok().unwrap();
            assert_eq!(read_word(&c, word).await.unwrap(), i + 1);
            assert_eq!(u64::from_le_bytes(n[..8].try_into().unwrap()), i);
            assert_eq!((mem.roundtrips(), mem.served()), (1, 2), "the counter's read and CAS, reported apart");
        }
        let stats = ch.call(&mem, &clock, TIMEOUT_NS, method::STATS, &[]).await.unwrap().ok().unwrap();
        let stats = Stats::decode(&stats).unwrap();
        assert_eq!((stats.served, stats.refused, stats.dropped, stats.resets), (40, 0, 0, 1));
        // The rings wrapped: 40 requests through a 256-byte ring.
        let r = ch.call(&mem, &clock, TIMEOUT_NS, 7, &[]).await.unwrap();
        assert_eq!(r.status, Status::NoSuchMethod, "a method below the services' is no built-in");
        let r = ch.call(&mem, &clock, TIMEOUT_NS, ADD + 1, &[]).await.unwrap();
        assert_eq!(r.ok().err(), Some(MsgError::Refused(Status::NoSuchMethod)));
        let too_big = [0u8; 200];
        assert!(matches!(
            ch.call(&mem, &clock, TIMEOUT_NS, method::PING, &too_big).await,
            Err(MsgError::TooLarge { .. })
        ));
        shell.stop();
    })
    .unwrap();
    sim.run().unwrap();
}

#[test]
fn clients_are_told_when_there_is_no_server() {
    let mut sim = sim(2);
    let word = setup(&mut sim);
    let mem = sim.client();
    sim.block_on(async move {
        let e = Channel::connect(&mem, NODE, 1).await.unwrap_err();
        assert!(matches!(e, MsgError::NoServer { why: "no server area (no server ever ran beside it)", .. }), "{e}");
        let e = Channel::connect(&mem, NodeId(0), 1).await.unwrap_err();
        assert!(matches!(e, MsgError::NoServer { .. }), "{e}");
    })
    .unwrap();
    let (_, shell) = spawn_server(&mut sim, word);
    let c = sim.client();
    let clock = clock(&c, 0);
    let stopped = shell.clone();
    sim.block_on(async move {
        c.sleep(SERVER_UP_NS).await;
        let e = Channel::connect(&c, NODE, GEO.channels).await.unwrap_err();
        assert!(matches!(e, MsgError::BadConfig(_)), "{e}");
        let mut ch = Channel::connect(&c, NODE, 1).await.unwrap();
        ch.call(&c, &clock, TIMEOUT_NS, method::PING, b"up").await.unwrap();
        stopped.stop();
        c.sleep(10_000).await;
        let e = ch.call(&c, &clock, TIMEOUT_NS, method::PING, b"down").await.err();
        assert_eq!(e, Some(MsgError::NoServer { node: NODE, why: "its server stopped" }));
        let e = Channel::connect(&c, NODE, 1).await.err();
        assert_eq!(e, Some(MsgError::NoServer { node: NODE, why: "its server stopped" }));
    })
    .unwrap();
}

#[test]
fn a_stalled_server_times_calls_out_and_serves_again_after() {
    let mut sim = sim(3);
    let word = setup(&mut sim);
    let (server, shell) = spawn_server(&mut sim, word);
    let start = sim.now();
    sim.stall_client_at(&server, start + SERVER_UP_NS + 20_000, 50_000);
    let c = sim.client();
    let clock = clock(&c, 0);
    let timed_out = Rc::new(Cell::new(0));
    let t = timed_out.clone();
    sim.block_on(async move {
        c.sleep(SERVER_UP_NS).await;
        let mut ch = Channel::connect(&c, NODE, 2).await.unwrap();
        let mut served = 0;
        while served < 30 {
            match ch.call(&c, &clock, TIMEOUT_NS, ADD, &[]).await {
                Ok(r) => {
                    r.ok().unwrap();
                    served += 1;
                }
                Err(MsgError::TimedOut) => t.set(t.get() + 1),
                Err(e) => panic!("{e}"),
            }
        }
        // Each timed-out request may have been served once, after the stall.
        let n = read_word(&c, word).await.unwrap();
        assert!((30..=30 + t.get() as u64).contains(&n), "{n} additions for 30 answered calls");
        shell.stop();
    })
    .unwrap();
    assert!(timed_out.get() >= 1, "the stall outlasted a call's time-out");
}

/// A caller paused (a process stopped, or descheduled) while it waits for
/// its answer, for longer than its time-out: the server answered
/// meanwhile, and the call returns that answer rather than a time-out
/// decided on a look at the ring it took before its pause. The pause
/// starts at each half-µs of the call (6 µs unpaused), so that some
/// fall between a look that found nothing and the answer's arrival.
#[test]
fn a_caller_paused_past_its_time_out_takes_the_answer_that_came_meanwhile() {
    for offset in 0..12u64 {
        let mut sim = sim(7);
        let word = setup(&mut sim);
        let (_, shell) = spawn_server(&mut sim, word);
        let c = sim.client();
        // The call is made at CALL_AT (virtual ns), the pause starts
        // `offset` half-µs later and lasts five time-outs.
        const CALL_AT: u64 = 2 * SERVER_UP_NS;
        sim.stall_client_at(&c, CALL_AT + offset * 500, 5 * TIMEOUT_NS);
        let clock = clock(&c, 0);
        let answered = Rc::new(Cell::new(None));
        let (a, m) = (answered.clone(), c.clone());
        // A task of the paused client's own (not `block_on`'s, which no
        // pause reaches).
        sim.spawn(&c, async move {
            m.sleep(SERVER_UP_NS).await;
            let mut ch = Channel::connect(&m, NODE, 3).await.unwrap();
            m.sleep(CALL_AT - m.now()).await;
            let got = ch.call(&m, &clock, TIMEOUT_NS, ADD, &[]).await.map(|r| r.status);
            a.set(Some((got, m.now() - CALL_AT)));
            shell.stop();
        });
        sim.run().unwrap();
        let (got, took) = answered.get().expect("the caller finished");
        assert!(took > TIMEOUT_NS, "offset {offset}: the pause outlasted the time-out ({took} ns)");
        assert!(got == Ok(Status::Ok), "offset {offset}: timed out on a look taken before its pause: {got:?}");
    }
}

#[test]
fn a_restarted_server_supersedes_the_old_one_and_clients_reconnect() {
    let mut sim = sim(4);
    let word = setup(&mut sim);
    let (old, old_shell) = spawn_server(&mut sim, word);
    let start = sim.now();
    sim.crash_client_at(&old, start + SERVER_UP_NS + 30_000);
    // The new incarnation starts while clients still talk to the old one.
    let (_, shell) = spawn_server_at(&mut sim, word, start + SERVER_UP_NS + 40_000);
    let c = sim.client();
    let clock = clock(&c, 0);
    let outcomes = sim
        .block_on(async move {
            c.sleep(SERVER_UP_NS).await;
            let mut ch = Channel::connect(&c, NODE, 2).await.unwrap();
            let mut seen = Vec::new();
            while c.now() < start + SERVER_UP_NS + 120_000 {
                seen.push(match ch.call(&c, &clock, TIMEOUT_NS, method::PING, b"x").await {
                    Ok(_) => "ok",
                    Err(MsgError::TimedOut) => "timed out",
                    Err(MsgError::NoServer { why: "its server restarted", .. }) => "restarted",
                    Err(e) => panic!("{e}"),
                });
            }
            shell.stop();
            seen
        })
        .unwrap();
    let _ = old_shell;
    assert_eq!(outcomes.first(), Some(&"ok"));
    assert_eq!(outcomes.last(), Some(&"ok"), "{outcomes:?}");
    assert!(outcomes.contains(&"restarted") || outcomes.contains(&"timed out"), "{outcomes:?}");
}

/// A server task that starts at virtual time `at` (after a crash of
/// another) and polls every 100 ns when idle; its client and shell.
fn spawn_server_at(sim: &mut Sim, word: RemoteAddr, at: u64) -> (SimMemory, ServerShell) {
    let mem = sim.client();
    let shell = ServerShell::new(&mem, 100);
    let (m, sh) = (mem.clone(), shell.clone());
    sim.spawn(&mem, async move {
        m.sleep(at.saturating_sub(m.now())).await;
        let mut s = Server::start(m, NODE, GEO, Counter { word }).await.unwrap();
        let _ = s.run(&sh).await;
    });
    (mem, shell)
}

#[test]
fn two_servers_on_one_area_the_older_stops() {
    let mut sim = sim(5);
    let word = setup(&mut sim);
    let a = sim.client();
    let b = sim.client();
    sim.block_on(async move {
        let mut first = Server::start(a.clone(), NODE, GEO, Counter { word }).await.unwrap();
        first.poll().await.unwrap();
        let mut second = Server::start(b, NODE, GEO, Counter { word }).await.unwrap();
        assert_eq!(second.epoch(), first.epoch() + 1);
        assert_eq!(first.poll().await, Err(MsgError::Superseded));
        second.poll().await.unwrap();
        let area = Area::open(&a, NODE).await.unwrap();
        assert_eq!(area, second.area());
        assert_eq!(area.geo, GEO, "the area made first is the one every server uses");
    })
    .unwrap();
}
