//! Seeded simulator campaigns: concurrent clients under delays, torn
//! transfers, clock skew and crashes of clients and nodes, every history
//! checked against the system's declared consistency model with
//! `swarm-lincheck`. A failing run prints the command that replays it.
//!
//! - [`kv`]: any registered key-value system ([`crate::systems`]);
//! - [`rpc`]: clients and a server beside memory that crashes, stalls and
//!   restarts ([`crate::substrate::msg`]);
//! - `register`: one replicated register (Safe-Guess or ABD), for those
//!   protocols' own tests.

use alloc::vec;
use alloc::vec::Vec;

use crate::sim::{Sim, SimMemory};

pub mod kv;
#[cfg(test)]
pub(crate) mod register;
pub mod rpc;

/// Clock resolution of the simulated clients: 100 ns, as a TSC-based clock
/// gives; coarser ticks make concurrent writers' guesses tie and go stale.
pub const TICK_NS: u64 = 100;

/// A clock of virtual time for a client of `mem`, `skew_ticks` ahead.
pub fn clock(mem: &SimMemory, skew_ticks: u64) -> SimClock {
    SimClock { mem: mem.clone(), skew_ticks }
}

/// A simulated client's clock: virtual time in [`TICK_NS`] ticks, skewed.
pub struct SimClock {
    mem: SimMemory,
    skew_ticks: u64,
}

impl crate::substrate::clock::Clock for SimClock {
    fn now(&self) -> u64 {
        self.mem.now() / TICK_NS + self.skew_ticks
    }

    fn tick_ns(&self) -> u64 {
        TICK_NS
    }
}

/// The value written by `client` as its `seq`-th write: its id in the first
/// 8 bytes, then filler up to `len` bytes (at least 8).
pub fn value(client: u8, seq: u64, len: usize) -> Vec<u8> {
    let id = ((client as u64) << 32) | seq;
    let mut v = vec![(id % 251) as u8; len.max(8)];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

/// The id [`value`] put in `bytes` (0 for anything shorter).
pub fn id_of(bytes: &[u8]) -> u64 {
    crate::substrate::memory::word_at(bytes, 0).unwrap_or(0)
}

/// A client paused mid-run, as a process stopped with SIGSTOP and then
/// continued: its tasks are not polled for a while, and it comes back in
/// the middle of whatever it was doing, with what it knew before.
#[derive(Clone, Copy, Debug)]
pub struct Pause {
    /// The client's id in the history (its index among `clients`, plus 1).
    client: u32,
    from: u64,
    until: u64,
}

impl Pause {
    /// Pauses one of `clients`, drawn at random, at a time drawn from
    /// `window` (virtual ns), for a time drawn from one of `lengths` (each
    /// a range of ns, one chosen at random).
    pub fn draw(sim: &mut Sim, clients: &[SimMemory], window: (u64, u64), lengths: &[(u64, u64)]) -> Pause {
        let paused = sim.random(0, clients.len() as u64 - 1) as usize;
        let from = sim.random(window.0, window.1);
        let (lo, hi) = lengths[sim.random(0, lengths.len() as u64 - 1) as usize];
        let ns = sim.random(lo, hi);
        sim.stall_client_at(&clients[paused], from, ns);
        Pause { client: paused as u32 + 1, from, until: from + ns }
    }

    /// The paused client's id in the history.
    pub fn client(&self) -> u32 {
        self.client
    }

    /// Operations of `history` that the pause caught in flight: its
    /// client's, begun before it and done (or never done) after it.
    pub fn caught<I, O>(&self, history: &[swarm_lincheck::Operation<I, O>]) -> usize {
        let spans = |op: &&swarm_lincheck::Operation<I, O>| {
            op.client == self.client && op.call <= self.from && op.response.as_ref().is_none_or(|r| r.at >= self.until)
        };
        history.iter().filter(spans).count()
    }
}
