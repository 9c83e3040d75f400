//! The memory interface of the SWARM paper's setting (§2.1), which every
//! backend implements and every protocol is written against.
//!
//! - [`Memory::read`] and [`Memory::write`] are not atomic: a read that
//!   overlaps a write may return a mix of old and new bytes.
//! - [`Memory::cas`] on an 8-byte aligned word is the only atomic operation.
//! - [`Memory::pipeline`] posts several operations to one node together; they
//!   execute in order (if a later one is visible, so are the earlier ones) and
//!   the whole pipeline costs one roundtrip. Write-then-CAS is the case that
//!   matters (In-n-Out, §4).
//! - [`Memory::post_background`] posts operations whose completion nobody
//!   waits for: work the paper sends "to the background" (§3.2, §4), which
//!   must not delay the operation that started it and may be lost if the
//!   client crashes.
//!
//! - [`Memory::read_inbox`] reads a ring that the caller receives messages
//!   in (see [`crate::substrate::msg`]); [`Memory::note_served`] tells
//!   roundtrip accounting what a server did for the caller.
//!
//! Operations are futures that post their work on first poll. Read buffers
//! belong to the backend ([`Memory::Buf`]); a backend whose hardware may still
//! write into a buffer after a future is dropped keeps that buffer until the
//! completion arrives.

use core::future::Future;
use core::ops::Deref;
use core::task::{Context, Poll};

use crate::substrate::addr::{check_range, check_word};
use crate::{MemError, MemErrorKind, NodeId, RemoteAddr};

/// The most operations one ordered pipeline may hold.
pub const MAX_PIPELINE: usize = 4;

/// One operation of an ordered pipeline; offsets are within the pipeline's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// Read `len` bytes at `offset`.
    Read {
        /// First byte.
        offset: u64,
        /// Number of bytes.
        len: usize,
    },
    /// Write `data` at `offset`.
    Write {
        /// First byte.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// Compare-and-swap the aligned word at `offset`.
    Cas {
        /// The word's offset (8-byte aligned).
        offset: u64,
        /// Value the word must hold for the swap to happen.
        expected: u64,
        /// Value written if it does.
        new: u64,
    },
}

impl Op<'_> {
    /// The bytes it touches: first byte and count.
    pub fn span(&self) -> (u64, usize) {
        match *self {
            Op::Read { offset, len } => (offset, len),
            Op::Write { offset, data } => (offset, data.len()),
            Op::Cas { offset, .. } => (offset, 8),
        }
    }

    /// Checks the operation against a region of `size` bytes on `node`.
    /// Every backend calls this before executing anything of a pipeline, so a
    /// pipeline with one bad operation executes none.
    pub fn check(&self, node: NodeId, size: u64) -> Result<(), MemError> {
        match *self {
            Op::Cas { offset, .. } => check_word(node, offset, size),
            _ => {
                let (offset, len) = self.span();
                check_range(node, offset, len, size)
            }
        }
    }
}

/// Checks a whole pipeline: its length and every operation.
pub fn check_pipeline(node: NodeId, ops: &[Op<'_>], size: u64) -> Result<(), MemError> {
    if ops.is_empty() || ops.len() > MAX_PIPELINE {
        return Err(MemError::new(node, MemErrorKind::BadPipeline { len: ops.len() }));
    }
    ops.iter().try_for_each(|op| op.check(node, size))
}

/// What one pipelined operation returned.
#[derive(Debug, PartialEq, Eq)]
pub enum OpOutput<B> {
    /// The bytes a [`Op::Read`] returned.
    Read(B),
    /// A [`Op::Write`] completed.
    Written,
    /// The value the word held before a [`Op::Cas`] (equal to `expected` iff it swapped).
    Cas(u64),
}

impl<B> OpOutput<B> {
    /// The previous value, if this was a CAS.
    pub fn cas(&self) -> Option<u64> {
        match self {
            OpOutput::Cas(v) => Some(*v),
            _ => None,
        }
    }

    /// The bytes, if this was a read.
    pub fn read(&self) -> Option<&B> {
        match self {
            OpOutput::Read(b) => Some(b),
            _ => None,
        }
    }

    /// The buffer, if this was a read.
    pub fn into_read(self) -> Option<B> {
        match self {
            OpOutput::Read(b) => Some(b),
            _ => None,
        }
    }
}

/// The outputs of a pipeline, one per operation, in order.
pub type Outputs<B> = heapless::Vec<OpOutput<B>, MAX_PIPELINE>;

/// A set of memory nodes, as seen by one client.
///
/// Handles are per client (they need not be `Sync`); several operations of
/// one client may be in flight at once. The futures need not be `Send`.
pub trait Memory {
    /// A buffer holding bytes read from a node.
    type Buf: Deref<Target = [u8]>;

    /// How many nodes there are; valid ids are `0..node_count()`.
    fn node_count(&self) -> usize;

    /// Reads `len` bytes at `addr` (not atomic).
    fn read(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>>;

    /// Writes `data` at `addr` (not atomic).
    fn write(&self, addr: RemoteAddr, data: &[u8]) -> impl Future<Output = Result<(), MemError>>;

    /// Atomically replaces the word at `addr` by `new` if it holds `expected`;
    /// returns the value it held.
    fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> impl Future<Output = Result<u64, MemError>>;

    /// Executes `ops` on `node` in order, in one roundtrip. On error, any
    /// prefix of the operations may have been applied.
    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<Self::Buf>, MemError>>;

    /// Posts `ops` (an ordered pipeline) without waiting for them. They are
    /// applied eventually unless the node or this client fails; their
    /// results and errors are discarded.
    fn post_background(&self, node: NodeId, ops: &[Op<'_>]);

    /// Reads `len` bytes at `addr` of a ring that the caller receives
    /// messages in, or of a word a receiver advances for it (FaRM §3). In
    /// FaRM's messaging that memory is the receiver's own, so polling it
    /// costs no network roundtrip: a sender's write carried the message
    /// there. Backends that can place it so (shared memory: no injected
    /// latency; the simulator: a local access) do; the others read (RDMA: a
    /// READ of the ring on the server's node, the substrate's clients having
    /// no registered memory of their own yet). Roundtrip accounting does
    /// not count it: the message's transfer is counted where it was sent.
    fn read_inbox(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>> {
        self.read(addr, len)
    }

    /// A server answered a request of this caller after `ops` memory
    /// operations of its own: roundtrip accounting reports them apart from
    /// the caller's roundtrips ([`crate::substrate::rtt::Counted::served`]).
    /// Nothing by default.
    fn note_served(&self, ops: u32) {
        let _ = ops;
    }

    /// A server answered a request of this caller after `rounds` sequential
    /// roundtrips of its own to other memory nodes, which the caller waited
    /// for (pDPM-Central's coordinator writing a value to its data nodes):
    /// roundtrip accounting adds them to the caller's, as the papers count
    /// them (pDPM Table 1). Nothing by default.
    fn note_server_roundtrips(&self, rounds: u32) {
        let _ = rounds;
    }

    /// This client's monotonic time, in nanoseconds from an origin of the
    /// backend's choosing: what tells a quorum that the replicas it
    /// started with are late ([`crate::substrate::late`]). `None` (the
    /// default) where the backend keeps no time: quorums then widen only
    /// when a replica fails.
    fn now_ns(&self) -> Option<u64> {
        None
    }

    /// [`Memory::now_ns`] as it read up to a few milliseconds ago (a clock
    /// tick), where the backend has that for less: never more than what
    /// `now_ns` reads at the same moment or later. For a time that is only
    /// compared with a later `now_ns`, where reading early errs on the
    /// safe side (the start of a read, [`crate::swarm::client::ClientCtx::fresh`]).
    /// `now_ns` by default.
    fn coarse_now_ns(&self) -> Option<u64> {
        self.now_ns()
    }

    /// How long an operation may stay pending before the backend fails it
    /// (its time-out), ns: also the longest after its posting that an
    /// operation may still land, which fences that wait out operations
    /// still in flight rely on (`crate::index::snapshot::view`). `None`
    /// where the backend sets none.
    fn timeout_ns(&self) -> Option<u64> {
        None
    }

    /// Ready once [`Memory::now_ns`] has reached `at_ns`; otherwise
    /// arranges for the task to be woken when it does (or sooner), as an
    /// operation's completion would. Never ready by default.
    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        let _ = (cx, at_ns);
        Poll::Pending
    }
}

impl<M: Memory + ?Sized> Memory for &M {
    type Buf = M::Buf;

    fn node_count(&self) -> usize {
        (**self).node_count()
    }

    fn read(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>> {
        (**self).read(addr, len)
    }

    fn write(&self, addr: RemoteAddr, data: &[u8]) -> impl Future<Output = Result<(), MemError>> {
        (**self).write(addr, data)
    }

    fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> impl Future<Output = Result<u64, MemError>> {
        (**self).cas(addr, expected, new)
    }

    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<Self::Buf>, MemError>> {
        (**self).pipeline(node, ops)
    }

    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        (**self).post_background(node, ops)
    }

    fn read_inbox(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>> {
        (**self).read_inbox(addr, len)
    }

    fn note_served(&self, ops: u32) {
        (**self).note_served(ops)
    }

    fn note_server_roundtrips(&self, rounds: u32) {
        (**self).note_server_roundtrips(rounds)
    }

    fn now_ns(&self) -> Option<u64> {
        (**self).now_ns()
    }

    fn coarse_now_ns(&self) -> Option<u64> {
        (**self).coarse_now_ns()
    }

    fn timeout_ns(&self) -> Option<u64> {
        (**self).timeout_ns()
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        (**self).poll_alarm(cx, at_ns)
    }
}

/// Reads the 8-byte little-endian word at `addr` (a read, not atomic with
/// respect to partial writes, but a CAS word is only ever changed by CAS).
pub async fn read_word<M: Memory>(mem: &M, addr: RemoteAddr) -> Result<u64, MemError> {
    let buf = mem.read(addr, 8).await?;
    Ok(word_at(&buf, 0).unwrap_or(0))
}

/// Waits `ns` of the memory's time ([`Memory::now_ns`]); not at all if it
/// keeps none (the operations a caller retries then space its tries).
pub async fn pause<M: Memory>(mem: &M, ns: u64) {
    let Some(now) = mem.now_ns() else { return };
    wait_until(mem, now.saturating_add(ns)).await
}

/// Waits until the memory's time ([`Memory::now_ns`]) reads `at_ns`; not
/// at all if it keeps none.
pub async fn wait_until<M: Memory>(mem: &M, at_ns: u64) {
    if mem.now_ns().is_none() {
        return;
    }
    core::future::poll_fn(|cx| mem.poll_alarm(cx, at_ns)).await
}

/// Waits between `ns / 2` and `ns` of the memory's time, the part chosen
/// by `rng` (xorshift64 state, stepped; never 0): clients that retry
/// against each other try again at different times.
pub async fn pause_jittered<M: Memory>(mem: &M, ns: u64, rng: &mut u64) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    pause(mem, ns / 2 + *rng % (ns / 2 + 1)).await
}

/// The little-endian word at byte `at` of `bytes`, or `None` past the end.
/// Use it to decode words from remote buffers without panicking.
pub fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let end = at.checked_add(8)?;
    let b: [u8; 8] = bytes.get(at..end)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_are_checked_whole() {
        let n = NodeId(0);
        assert!(check_pipeline(n, &[], 64).is_err());
        let w = [0u8; 8];
        let ok = [Op::Write { offset: 0, data: &w }, Op::Cas { offset: 8, expected: 0, new: 1 }];
        assert!(check_pipeline(n, &ok, 64).is_ok());
        let bad = [Op::Write { offset: 0, data: &w }, Op::Cas { offset: 9, expected: 0, new: 1 }];
        assert!(check_pipeline(n, &bad, 64).is_err());
        let long = [Op::Read { offset: 0, len: 1 }; MAX_PIPELINE + 1];
        assert_eq!(check_pipeline(n, &long, 64).unwrap_err().kind, MemErrorKind::BadPipeline { len: MAX_PIPELINE + 1 });
    }

    #[test]
    fn word_at_never_panics() {
        let b = [1u8, 0, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(word_at(&b, 0), Some(1));
        assert_eq!(word_at(&b, 1), Some(2 << 56));
        assert_eq!(word_at(&b, 2), None);
        assert_eq!(word_at(&b, usize::MAX), None);
    }
}
