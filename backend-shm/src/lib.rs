//! Memory nodes in shared memory, for the [`swarm_core::Memory`] interface.
//!
//! Each memory node is a file in a private directory (normally under
//! `/dev/shm`), mapped by every process that uses the cluster; or, for tests
//! and benchmarks, anonymous memory of one process. Real concurrency between
//! threads and OS processes, no network: the backend for testing protocols
//! under real interleavings and for measuring them without a fabric.
//!
//! ```no_run
//! use swarm_backend_shm::ShmCluster;
//! use swarm_core::{Memory, NodeId, RemoteAddr, substrate::exec::block_on};
//!
//! // One process creates the cluster, others open it.
//! let cluster = ShmCluster::create("/dev/shm/swarm-example", 3, 1 << 20)?;
//! let other = ShmCluster::open("/dev/shm/swarm-example")?;
//! let mem = cluster.memory(); // one handle per client thread
//! let addr = RemoteAddr::new(NodeId(1), 64);
//! assert_eq!(block_on(mem.cas(addr, 0, 7))?, 0);
//! assert_eq!(block_on(other.memory().cas(addr, 7, 8))?, 7);
//! ShmCluster::remove("/dev/shm/swarm-example")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`ShmCluster`]: the nodes (create, open, remove; or in-process), shared
//!   by threads, and fault injection ([`Fault`]) seen by all processes.
//! - [`ShmMemory`]: a client's handle, optionally with an injected roundtrip
//!   latency; its read buffers are [`ShmBuf`]s.
//!
//! This crate is about where the memory lives: files in a private
//! directory, with their permissions and a control file beside them, or
//! anonymous memory. Everything done with the memory once mapped (the atomic
//! word layer, bounds checks, byte copies and their memory ordering, read
//! buffers, latency, time-outs and fault injection, persistence hooks) is
//! `swarm-mapped`'s, shared with the other backends over mapped memory
//! (`swarm-backend-cxl`, and `swarm-backend-rdma`'s software NIC): a
//! [`ShmCluster`] wraps a [`Nodes`] set, [`ShmMemory`] is
//! [`swarm_mapped::MappedMemory`] and [`ShmBuf`] is
//! [`swarm_mapped::MappedBuf`]. Their names, and the word layer's, are
//! re-exported here so that users of this backend need no other crate.
//!
//! Under `--cfg loom` the words are loom atomics and only
//! [`ShmCluster::in_process`] exists, so loom can model-check code running
//! over this backend (see the `swarm-loom-tests` crate).

#![warn(missing_docs)]
// No `unsafe` here: the only `unsafe` (mapping files, viewing a mapping as
// atomic words) is in `swarm-mapped`'s atomic layer, where it is argued.
#![deny(unsafe_code)]

mod cluster;
mod error;

pub use cluster::{PAGE_SIZE, ShmCluster};
pub use error::ShmError;
#[cfg(not(loom))]
pub use swarm_mapped::RawMapping;
pub use swarm_mapped::{
    Coherent, DEFAULT_TIMEOUT, Fault, MAX_NODE_SIZE, MAX_NODES, Nodes, Persistence, WORD, Words, persist,
};

/// A client's handle on a [`ShmCluster`]: the [`swarm_core::Memory`] of
/// this backend, with persistence hooks `P` (none by default).
pub type ShmMemory<P = Coherent> = swarm_mapped::MappedMemory<P>;

/// Bytes read from a memory node; [`swarm_core::Memory::Buf`] of this backend.
pub type ShmBuf = swarm_mapped::MappedBuf;

#[cfg(all(test, not(loom)))]
mod tests;
