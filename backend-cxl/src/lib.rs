//! DAX devices, CXL memory pools and emulated persistent memory as memory
//! nodes, for the [`swarm_core::Memory`] interface.
//!
//! Users test disaggregated-memory protocols on CXL memory expanders, DAX
//! devices or emulated pmem (a `memmap=` region, or a plain file) before
//! they have a cluster. This backend maps such memory and runs the same
//! core and the same tests as shared memory on it:
//!
//! ```no_run
//! use swarm_backend_cxl::{CxlCluster, CxlConfig, FlushMode};
//! use swarm_core::{Memory, NodeId, Op, RemoteAddr, substrate::exec::block_on};
//!
//! // Three nodes as partitions of one device (or file, e.g. on tmpfs or an
//! // fsdax mount); `open` maps it again in any process.
//! let config = CxlConfig::with_mode(FlushMode::Persist);
//! let cluster = CxlCluster::create(&["/dev/dax0.0"], 3, 64 << 20, &config)?;
//! for w in cluster.warnings() {
//!     eprintln!("warning: {w}");
//! }
//! let mem = cluster.memory(); // one handle per client thread
//! // Write-then-CAS: the data is written back and fenced before the CAS.
//! let ops = [Op::Write { offset: 4096, data: &[7; 64] }, Op::Cas { offset: 64, expected: 0, new: 1 }];
//! block_on(mem.pipeline(NodeId(1), &ops))?;
//! assert_eq!(mem.persistence().stats().lines_written_back, 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is specific to this backend
//!
//! Everything else (bounds checks, atomic word access, latency and fault
//! injection, read buffers) is `swarm-mapped`'s, as for the shared-memory
//! backend: a [`CxlMemory`] *is* a
//! [`MappedMemory`](swarm_mapped::MappedMemory) whose
//! [`Persistence`](swarm_mapped::Persistence) hooks are a [`Flusher`], over
//! the [`Nodes`](swarm_mapped::Nodes) that [`CxlCluster::nodes`] returns.
//! This crate adds:
//!
//! - **Mapping** (see [`BackingKind`]): device-dax character devices
//!   honouring their alignment (read from sysfs), files on a DAX file
//!   system with `MAP_SHARED_VALIDATE | MAP_SYNC` (rustix: memmap2 cannot
//!   ask for it), and any other file (with a warning,
//!   [`CxlCluster::warnings`], that durability then needs `msync`,
//!   [`CxlCluster::sync`]). Several nodes as several devices or files, or
//!   as partitions of one, behind a small header that lets any process
//!   [`open`](CxlCluster::open) them ([`CxlCluster`]).
//! - **Ordering and durability** ([`Flusher`], [`FlushMode`]): in an
//!   ordered pipeline the data written before a CAS is written back
//!   (`clwb`, else `clflushopt`, else `clflush`, chosen at run time) and
//!   fenced (`sfence`) before the CAS is issued, so that "if the CAS is
//!   visible, or durable, so is the data", and every operation that wrote
//!   is drained before it completes. The [`FlushMode::NonCoherent`] mode
//!   also invalidates lines before reading them, for memory shared between
//!   hosts without hardware coherence. The mode is a configuration choice:
//!   see [`FlushMode`] for when to use which.
//! - **Counting**: every handle counts the lines it wrote back and
//!   invalidated and the fences it issued ([`FlushStats`]), so tests can
//!   see the flushes happen.
//! - **Errors** ([`CxlError`]) that name the path: a missing device, a
//!   permission refused, a device or file too small, a size not aligned to
//!   the device, a path that holds no cluster.
//!
//! # Crash consistency, and what the tests show
//!
//! The tests run on files (no DAX device here): a child process updating
//! registers is killed with SIGKILL at random moments and the parent
//! re-maps the file and checks every acknowledged write and every metadata
//! word. A killed process loses nothing its stores reached, on any file; a
//! *power failure* loses what was not written back, which is what the
//! flushes (device-dax, `MAP_SYNC`) or `msync` (other files) are for, and
//! which these tests cannot cut.

#![warn(missing_docs)]
// The only `unsafe` is in the flush instructions and the MAP_SYNC mapping,
// where it is allowed and argued.
#![deny(unsafe_code)]

mod cluster;
mod error;
mod flush;
mod map;

pub use cluster::{BackingInfo, CxlCluster, CxlConfig, MAX_NODE_SIZE};
pub use error::CxlError;
pub use flush::{CpuFlush, FlushInstr, FlushMode, FlushStats, Flusher};
pub use map::{BackingKind, PAGE};

/// A client's handle on a [`CxlCluster`]: the handle of every backend over
/// mapped memory with a [`Flusher`] as its persistence hooks. Its flush
/// counters are `mem.persistence().stats()`.
pub type CxlMemory = swarm_mapped::MappedMemory<Flusher>;

#[cfg(test)]
mod tests;
