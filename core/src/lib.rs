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
//! The crate is `#![no_std]`. The `alloc` feature enables the parts that need
//! a heap, `sim` the deterministic simulated memory (see [`sim`]).
#![no_std]
#![warn(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod abd;
pub mod addr;
#[cfg(test)]
mod campaign;
pub mod client;
pub mod error;
pub mod exec;
pub mod index;
pub mod inout;
pub mod join;
pub mod kv;
pub mod max;
pub mod maxreg;
pub mod memory;
pub mod meta;
pub mod quorum;
pub mod raw;
pub mod region;
pub mod rtt;
pub mod safeguess;
pub mod slab;
pub mod tslock;
pub mod writerlog;

#[cfg(feature = "alloc")]
pub mod lincheck;

#[cfg(feature = "alloc")]
pub mod units;

#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use addr::{NodeId, RemoteAddr};
pub use error::{MemError, MemErrorKind};
pub use memory::{MAX_PIPELINE, Memory, Op, OpOutput, Outputs};
