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
//! - For other backends over mapped memory (`swarm-backend-cxl`): the word
//!   layer ([`Words`], [`RawMapping`]), clusters over memory mapped
//!   elsewhere ([`ShmCluster::from_words`]) and the [`Persistence`] hooks a
//!   handle runs around its accesses ([`ShmMemory::with_persistence`]).
//!
//! All memory is accessed as atomic 64-bit words, so processes racing on the
//! same bytes is defined behaviour, and a request is bounds-checked before it
//! touches memory: a garbled offset or length is an error, never a panic or
//! an access outside the mapping. Reads and writes are not atomic as a whole
//! (each word is); a partially covered word is updated by a CAS loop so that
//! writers of its other bytes are not clobbered.
//!
//! Memory ordering (argued in `src/bytes.rs`): writes begin with a release
//! fence and end with a `SeqCst` fence, reads end with an acquire fence, CAS
//! is `SeqCst`. Hence whoever observes any word an operation stored sees, in
//! its following operations, everything the storing client did before (an
//! ordered pipeline's write is visible to anyone who sees its CAS), and a
//! completed operation is visible to every operation that starts after it.
//!
//! Under `--cfg loom` the words are loom atomics and only
//! [`ShmCluster::in_process`] exists, so loom can model-check code running
//! over this backend (see the `swarm-loom-tests` crate).

#![warn(missing_docs)]
// The only `unsafe` is in the atomic layer (mapping files, viewing a mapping
// as atomic words), where it is allowed and argued.
#![deny(unsafe_code)]

mod atomic;
mod buf;
mod bytes;
mod cluster;
mod control;
mod error;
mod memory;
pub mod persist;

#[cfg(not(loom))]
pub use atomic::RawMapping;
pub use atomic::{WORD, Words};
pub use buf::ShmBuf;
pub use cluster::{MAX_NODE_SIZE, MAX_NODES, PAGE_SIZE, ShmCluster};
pub use control::Fault;
pub use error::ShmError;
pub use memory::{DEFAULT_TIMEOUT, ShmMemory};
pub use persist::{Coherent, Persistence};

#[cfg(all(test, not(loom)))]
mod tests;
