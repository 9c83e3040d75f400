//! The substrate every protocol is written on: the memory interface of
//! disaggregated memory (SWARM §2.1), the few combinators protocols need to
//! issue operations to several nodes at once and continue at a majority,
//! exact roundtrip accounting, clocks, the layout and allocation of a
//! node's memory ([`space`]), leases of client ids ([`lease`]) and messages to servers that run beside memory
//! (`msg`, with `alloc`).

pub mod addr;
pub mod clock;
pub mod error;
pub mod exec;
pub mod join;
pub mod late;
pub mod lease;
pub mod memory;
#[cfg(feature = "alloc")]
pub mod msg;
pub mod mutant;
pub mod quorum;
pub mod rtt;
pub mod space;
pub mod value;
