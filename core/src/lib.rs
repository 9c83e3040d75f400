//! The protocol core of the toolkit: every algorithm for replicated data in
//! disaggregated memory lives here, written against an abstract memory.
//!
//! The memory is the one of the SWARM paper's setting (§2.1): memory nodes
//! without compute that offer non-atomic `read` and `write` of any length,
//! an atomic 64-bit compare-and-swap, and an *ordered pipeline* of several
//! operations to one node that execute in order and cost one roundtrip.
//! Backends (shared memory, DAX/CXL, RDMA, the simulator) implement
//! [`Memory`]; protocols are ordinary `async` code generic over it.
//!
//! The modules are layers; each uses only those listed before it
//! (`ARCHITECTURE.md` at the repository root has the map):
//!
//! | layer | what |
//! |---|---|
//! | [`substrate`] | the memory interface, combinators, roundtrip accounting, clocks, node layout and allocation ([`substrate::space`]), messages and servers beside memory ([`substrate::msg`]) |
//! | [`objects`] | small shared objects on CAS words: the max word, timestamp locks |
//! | [`swarm`] | SWARM: metadata, writer logs, In-n-Out, the reliable max register, Safe-Guess |
//! | [`baselines`] | the registers of the SWARM paper's baselines: ABD, RAW |
//! | [`index`] | the RACE hash index and the clients' location cache |
//! | [`kv`] | the key-value interface every system implements, how a system is declared, and the stores' shared parts |
//! | [`systems`] | one folder per system, and the registry that lists them |
//! | [`sim`] | the deterministic simulator: a backend and an executor (feature `sim`) |
//! | [`check`] | simulator campaigns over any registered system, histories checked by `swarm-lincheck` (feature `sim`) |
//!
//! The crate is `#![no_std]`. The `alloc` feature enables the parts that need
//! a heap (the stores), `std` the wall clock, `sim` the simulator and the
//! campaigns.
#![no_std]
#![warn(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod baselines;
pub mod index;
pub mod kv;
pub mod objects;
pub mod substrate;
pub mod swarm;
#[cfg(feature = "alloc")]
pub mod systems;

#[cfg(feature = "sim")]
pub mod check;
#[cfg(feature = "sim")]
pub mod sim;

pub use substrate::addr::{NodeId, RemoteAddr};
pub use substrate::error::{MemError, MemErrorKind};
pub use substrate::memory::{MAX_PIPELINE, Memory, Op, OpOutput, Outputs};
