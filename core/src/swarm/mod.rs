//! SWARM ("SWARM: Replicating Shared Disaggregated-Memory Data in No
//! Time"): the objects that give one-roundtrip linearizable reads and writes
//! over 2f+1 memory nodes, each in a module named after its concept and
//! citing the section it implements.
//!
//! - [`meta`]: the 8-byte metadata word (timestamp, log id, writer, flag);
//! - [`client`]: what one SWARM client owns (id, logs, allocator, clock);
//! - [`writerlog`]: writers' logs of out-of-place buffers (§4.3);
//! - [`inout`]: In-n-Out, one replica's object (§4);
//! - [`maxreg`]: the reliable max register over 2f+1 replicas (App. A);
//! - [`safeguess`]: Safe-Guess, the register protocol (§3.2, App. C).

pub mod client;
pub mod inout;
pub mod maxreg;
pub mod meta;
#[cfg(feature = "alloc")]
pub mod recycle;
pub mod safeguess;
pub mod writerlog;
