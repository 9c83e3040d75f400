//! Seeded simulator campaigns: concurrent clients under delays, torn
//! transfers, clock skew and crashes of clients, nodes and servers, every
//! history checked against the system's declared consistency model with
//! `swarm-lincheck`. A failing run prints the command that replays it.
//!
//! - [`register`]: one replicated register (Safe-Guess or ABD).

#[cfg(test)]
pub(crate) mod register;
