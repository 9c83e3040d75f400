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

use crate::sim::SimMemory;

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
