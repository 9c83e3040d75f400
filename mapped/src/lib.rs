//! Memory nodes over mapped memory, for the [`swarm_core::Memory`]
//! interface: everything a backend needs once it has memory mapped into
//! this process, whoever mapped it.
//!
//! ```
//! use swarm_core::{Memory, NodeId, RemoteAddr, substrate::exec::block_on};
//! use swarm_mapped::{Fault, Nodes};
//!
//! let nodes = Nodes::anonymous(3, 1 << 20)?; // three nodes of 1 MiB
//! let mem = nodes.memory(); // one handle per client thread
//! let addr = RemoteAddr::new(NodeId(1), 64);
//! assert_eq!(block_on(mem.cas(addr, 0, 7))?, 0);
//! nodes.set_fault(NodeId(1), Fault::Failed)?;
//! assert!(block_on(mem.cas(addr, 7, 8)).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Words`]: the atomic word layer, the one place that decides what
//!   memory is made of (a `memmap2` mapping of a file or of anonymous
//!   memory, or a [`RawMapping`] made elsewhere; loom atomics under
//!   `--cfg loom`).
//! - [`Nodes`]: the node set (the words of every node, shared by the
//!   threads of a process) and its [`Control`] block, which holds each
//!   node's [`Fault`] state for fault injection.
//! - [`MappedMemory`]: a client's handle, optionally with an injected
//!   roundtrip latency and a time-out for stalled nodes; its read buffers
//!   are pooled [`MappedBuf`]s; it runs [`Persistence`] hooks around its
//!   accesses ([`Coherent`], none, by default).
//! - [`monotonic_ns`] and [`coarse_ns`]: the process's clock, the time of
//!   `Memory::now_ns` and `Memory::coarse_now_ns` for every handle.
//! - [`check_private`]: whether a directory or file that a cluster lives in
//!   is this user's alone, which the backends that map files ask before
//!   they use one.
//!
//! Who uses it:
//!
//! - `swarm-backend-shm` maps files in a private directory under
//!   `/dev/shm` (shared by processes, the control block a file of its own)
//!   and hands them over ([`Nodes::from_parts`]), or uses anonymous memory
//!   in one process ([`Nodes::anonymous`]);
//! - `swarm-backend-cxl` maps DAX devices, fsdax files and plain files
//!   (some as [`RawMapping`]s with `MAP_SYNC`), cuts them into nodes
//!   ([`Words::slice`], [`Nodes::from_words`]) and plugs its cache-line
//!   flushes in as [`Persistence`] hooks;
//! - `swarm-backend-rdma` runs its software NIC over a [`MappedMemory`] and
//!   hands out [`MappedBuf`]s as its read buffers ([`MappedBuf::filled`]);
//! - `swarm-loom-tests` model-checks the core over the loom mode (through
//!   `swarm-backend-shm`'s in-process clusters).
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
//! Under `--cfg loom` the words are loom atomics and only anonymous memory
//! exists ([`Nodes::anonymous`], [`Words::anonymous`]), so loom can
//! model-check code running over these nodes (see the `swarm-loom-tests`
//! crate).

#![warn(missing_docs)]
// The only `unsafe` is in the atomic layer (mapping files, viewing a mapping
// as atomic words, the prefetch hint), where it is allowed and argued.
#![deny(unsafe_code)]

mod atomic;
mod buf;
mod bytes;
mod clock;
mod control;
mod error;
mod memory;
mod nodes;
#[cfg(not(loom))]
mod owner;
pub mod persist;

#[cfg(not(loom))]
pub use atomic::RawMapping;
pub use atomic::{WORD, Words};
pub use buf::MappedBuf;
pub use clock::{coarse_ns, monotonic_ns};
pub use control::{Control, Fault, control_bytes};
pub use error::MappedError;
pub use memory::{DEFAULT_TIMEOUT, MappedMemory, poll_alarm};
pub use nodes::{MAX_NODE_SIZE, MAX_NODES, Nodes, check_config};
#[cfg(not(loom))]
pub use owner::{check_private, private};
pub use persist::{Coherent, Persistence};

#[cfg(all(test, not(loom)))]
mod tests;
