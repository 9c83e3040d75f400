//! [`MappedMemory`]: one client's handle on a node set, implementing the
//! core's [`Memory`] interface, with optional injected latency and fault
//! injection.
//!
//! # Life of an operation
//!
//! An operation does nothing until its future is first polled. That poll
//! *posts* it: the request is checked (node, bounds, alignment, pipeline
//! length; a bad request fails at once and changes nothing), the node's
//! fault state is consulted and the lines it will touch are prefetched
//! (see [`bytes::prefetch`]). The node *applies* it within the roundtrip: at
//! the future's next poll, or when the future is dropped, whichever comes
//! first, so a posted operation is always applied, as a posted RDMA operation
//! would be. The memory node's work thus never delays the client's next
//! post: operations posted together (a pipeline, or the replicas of a
//! `quorum`) are all posted before any is applied, as a NIC takes requests
//! to several nodes in parallel, instead of each replica's post waiting for
//! the previous replica's memory accesses (which on shared memory run on the
//! client's CPU).
//!
//! With an injected latency the future then stays pending until `latency`
//! after the post, spinning on the clock, so operations posted together
//! overlap and cost one latency, like roundtrips on a real fabric. It may
//! wait out the last stretch before the deadline inside one poll, so that
//! its completion is seen when it is due, not a poll of the whole future
//! tree later (see [`waits_here`]). Without a latency the future completes
//! on its next poll, never the one that posted it, for the same reason.
//! Separate operations are not ordered (only a pipeline is, as [`Memory`]
//! says).
//!
//! Fault injection ([`crate::Fault`], set on the [`Nodes`]): a failed node's
//! operations fail at once with `Unreachable`; a stalled node's operations
//! wait unapplied until the handle's timeout and then fail with `TimedOut`,
//! unless the stall ends first. The node's state is consulted when an
//! operation is posted: one posted before its node failed is still applied,
//! as a request already delivered may be.
//!
//! A handle may carry [`Persistence`] hooks (cache-line write-back and
//! fences for persistent or non-coherent memory); by default it carries
//! [`Coherent`], which does nothing. See [`crate::persist`] for where the
//! hooks run.

use std::future::{Future, poll_fn};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use swarm_core::substrate::exec::yield_now;
use swarm_core::substrate::memory::check_pipeline;
use swarm_core::{MemError, MemErrorKind, Memory, NodeId, Op, OpOutput, Outputs, RemoteAddr};

use crate::atomic::AtomicU64;
use crate::clock::{coarse_ns, monotonic_ns};
use crate::persist::{Coherent, Persistence};
use crate::{Fault, MappedBuf, Nodes, bytes};

/// Default for how long an operation on a stalled node waits.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// A client's handle on [`Nodes`]: the [`Memory`] of every backend over
/// mapped memory (`swarm-backend-shm`'s `ShmMemory`, `swarm-backend-cxl`'s
/// `CxlMemory`).
///
/// Make one per client thread (they are cheap: a reference to the nodes,
/// two durations and the persistence hooks `P`, by default none). Handles
/// and buffers are `Send`.
#[derive(Clone)]
pub struct MappedMemory<P = Coherent> {
    nodes: Nodes,
    latency: Duration,
    timeout: Duration,
    persist: P,
}

impl MappedMemory {
    pub(crate) fn new(nodes: Nodes) -> MappedMemory {
        MappedMemory { nodes, latency: Duration::ZERO, timeout: DEFAULT_TIMEOUT, persist: Coherent }
    }
}

impl<P: Persistence> MappedMemory<P> {
    /// The same handle with persistence hooks `persist` instead of its own
    /// (see [`crate::persist`]).
    pub fn with_persistence<Q: Persistence>(self, persist: Q) -> MappedMemory<Q> {
        MappedMemory { nodes: self.nodes, latency: self.latency, timeout: self.timeout, persist }
    }

    /// The handle's persistence hooks (and whatever statistics they keep).
    pub fn persistence(&self) -> &P {
        &self.persist
    }

    /// Makes every operation complete `latency` after it was posted (an
    /// emulated roundtrip); zero, the default, completes at once.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Sets how long operations on a stalled node wait before failing with
    /// `TimedOut` (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The injected latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// The timeout for stalled nodes.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The nodes this handle reaches (their fault state, their shape).
    pub fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    /// The node's words, after checking the request against its size.
    fn checked(&self, node: NodeId, check: impl FnOnce(u64) -> Result<(), MemError>) -> Result<&[AtomicU64], MemError> {
        let words = self.nodes.words(node).ok_or(MemError::new(node, MemErrorKind::NoSuchNode))?;
        check(self.nodes.node_size())?;
        Ok(words)
    }

    /// Runs one posted operation: checks it, waits out a stall, applies it
    /// and completes `latency` after it was posted.
    async fn run<T>(
        &self,
        node: NodeId,
        latency: Duration,
        check: impl FnOnce(u64) -> Result<(), MemError>,
        lines: impl FnOnce(&[AtomicU64]),
        apply: impl FnOnce(&[AtomicU64]) -> T,
    ) -> Result<T, MemError> {
        let posted = (!latency.is_zero()).then(Instant::now);
        let words = self.checked(node, check)?;
        // A healthy node (the common case) admits at once, without a
        // future of its own to poll.
        if self.nodes.fault(node) != Some(Fault::Healthy) {
            self.admit(node).await?;
        }
        // The node starts on its memory now (see `bytes::prefetch`).
        lines(words);
        let posted_op = Posted { words, apply: Some(apply) };
        // Completion is reported no earlier than the next poll, as on a
        // fabric: operations posted in one poll (the replicas of a quorum)
        // then complete together, and roundtrip counting (rtt::Counted)
        // sees them as one roundtrip rather than one after the other.
        yield_now().await;
        let out = posted_op.apply();
        if let Some(posted) = posted {
            // An absurd latency that overflows the clock never completes.
            let deadline = posted.checked_add(latency);
            spin_until(deadline).await;
        }
        Ok(out)
    }

    /// A read that completes `latency` after it was posted.
    fn read_after(
        &self,
        addr: RemoteAddr,
        len: usize,
        latency: Duration,
    ) -> impl Future<Output = Result<MappedBuf, MemError>> {
        self.run(
            addr.node,
            latency,
            move |size| swarm_core::substrate::addr::check_range(addr.node, addr.offset, len, size),
            move |words| bytes::prefetch(words, addr.offset, len),
            move |words| read_buf(&self.persist, words, addr.offset, len),
        )
    }

    /// Waits until `node` may be accessed: at once if healthy, an error if
    /// failed, and while stalled until the stall ends or the timeout passes.
    async fn admit(&self, node: NodeId) -> Result<(), MemError> {
        let mut give_up = None;
        loop {
            match self.nodes.fault(node) {
                Some(Fault::Healthy) => return Ok(()),
                Some(Fault::Failed) => return Err(MemError::new(node, MemErrorKind::Unreachable)),
                None => return Err(MemError::new(node, MemErrorKind::NoSuchNode)),
                Some(Fault::Stalled) => {
                    let now = Instant::now();
                    let deadline = *give_up.get_or_insert_with(|| now.checked_add(self.timeout));
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(MemError::new(node, MemErrorKind::TimedOut));
                    }
                    yield_now().await;
                }
            }
        }
    }
}

/// A posted operation that its node has not applied yet: applied by
/// [`Posted::apply`], or else when dropped (the future was dropped before
/// completing), since a posted operation cannot be called back.
struct Posted<'a, T, F: FnOnce(&'a [AtomicU64]) -> T> {
    words: &'a [AtomicU64],
    apply: Option<F>,
}

impl<'a, T, F: FnOnce(&'a [AtomicU64]) -> T> Posted<'a, T, F> {
    fn apply(mut self) -> T {
        match self.apply.take() {
            Some(apply) => apply(self.words),
            // Only `drop` takes it otherwise, and it has not run.
            None => unreachable!("a posted operation is applied once"),
        }
    }
}

impl<'a, T, F: FnOnce(&'a [AtomicU64]) -> T> Drop for Posted<'a, T, F> {
    fn drop(&mut self) {
        if let Some(apply) = self.apply.take() {
            apply(self.words);
        }
    }
}

/// Applies the checked `ops` in order and returns their outputs.
fn apply_pipeline<P: Persistence>(p: &P, words: &[AtomicU64], ops: &[Op<'_>]) -> Outputs<MappedBuf> {
    let mut outs = Outputs::new();
    // Cannot fail: `check_pipeline` allowed at most `MAX_PIPELINE` operations.
    apply_ops(p, words, ops, |out| {
        let _ = outs.push(out);
    });
    outs
}

/// Applies the checked `ops` in order, with the persistence hooks where
/// [`crate::persist`] says, handing each output to `each` (a background
/// post drops them without collecting them).
fn apply_ops<P: Persistence>(p: &P, words: &[AtomicU64], ops: &[Op<'_>], mut each: impl FnMut(OpOutput<MappedBuf>)) {
    // Whether something was written back and not yet drained.
    let mut dirty = false;
    for op in ops {
        let out = match *op {
            Op::Read { offset, len } => OpOutput::Read(read_buf(p, words, offset, len)),
            Op::Write { offset, data } => {
                bytes::write(words, offset, data);
                p.after_write(words, offset, data.len());
                dirty = true;
                OpOutput::Written
            }
            Op::Cas { offset, expected, new } => {
                if dirty {
                    p.drain();
                }
                dirty = true;
                OpOutput::Cas(cas(p, words, offset, expected, new))
            }
        };
        each(out);
    }
    if dirty {
        p.drain();
    }
}

/// A read, after its hook.
fn read_buf<P: Persistence>(p: &P, words: &[AtomicU64], offset: u64, len: usize) -> MappedBuf {
    p.before_read(words, offset, len);
    let mut buf = MappedBuf::with_capacity(len);
    bytes::read(words, offset, len, buf.vec_mut());
    buf
}

/// A write and its write-back, drained.
fn write<P: Persistence>(p: &P, words: &[AtomicU64], offset: u64, data: &[u8]) {
    bytes::write(words, offset, data);
    p.after_write(words, offset, data.len());
    p.drain();
}

/// A CAS between its hooks, not drained.
fn cas<P: Persistence>(p: &P, words: &[AtomicU64], offset: u64, expected: u64, new: u64) -> u64 {
    p.before_read(words, offset, 8);
    let prev = bytes::cas(words, offset, expected, new);
    p.after_write(words, offset, 8);
    prev
}

/// Pending until `deadline` (forever if `None`). Wakes itself each time, so
/// that it also works under executors that wait for a wake-up; waits out
/// the last stretch itself when [`waits_here`] says so.
async fn spin_until(deadline: Option<Instant>) {
    let mut last_poll: Option<Instant> = None;
    poll_fn(|cx| {
        if let Some(d) = deadline {
            let now = Instant::now();
            if now >= d {
                return Poll::Ready(());
            }
            if last_poll.is_some_and(|last| waits_here(last, now, d)) {
                while Instant::now() < d {
                    core::hint::spin_loop();
                }
                return Poll::Ready(());
            }
            last_poll = Some(now);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// The longest wait [`spin_until`] does inside one poll.
const SPIN_AT_MOST: Duration = Duration::from_nanos(250);

/// Whether an operation polled at `now` (and before that at `last`) should
/// wait for its `deadline` inside this poll rather than return pending.
///
/// A spinning executor polls the whole tree of futures above an operation
/// between two looks at its clock, so a completion would be seen up to one
/// such period late: later for deeper trees (a quorum's) than for a single
/// read. A NIC's completion is visible as soon as it lands. So when the
/// next poll, one period on (judged by the last one), would come after the
/// deadline, the operation waits out the rest itself, if that rest is at
/// most [`SPIN_AT_MOST`], so that other operations in flight on the thread
/// are never held up for longer. The rest is what is bounded, not the
/// period: when a sibling (the replica posted just before, in the same
/// quorum) has just waited out its own deadline, the period looks long,
/// and the deadline a few tens of nanoseconds away must still be met here.
pub(crate) fn waits_here(last: Instant, now: Instant, deadline: Instant) -> bool {
    let period = now.saturating_duration_since(last);
    deadline.saturating_duration_since(now) <= period.min(SPIN_AT_MOST)
}

impl<P: Persistence> Memory for MappedMemory<P> {
    type Buf = MappedBuf;

    fn node_count(&self) -> usize {
        self.nodes.node_count()
    }

    fn read(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<MappedBuf, MemError>> {
        self.read_after(addr, len, self.latency)
    }

    fn write(&self, addr: RemoteAddr, data: &[u8]) -> impl Future<Output = Result<(), MemError>> {
        self.run(
            addr.node,
            self.latency,
            move |size| swarm_core::substrate::addr::check_range(addr.node, addr.offset, data.len(), size),
            move |words| bytes::prefetch(words, addr.offset, data.len()),
            move |words| write(&self.persist, words, addr.offset, data),
        )
    }

    fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> impl Future<Output = Result<u64, MemError>> {
        self.run(
            addr.node,
            self.latency,
            move |size| swarm_core::substrate::addr::check_word(addr.node, addr.offset, size),
            move |words| bytes::prefetch(words, addr.offset, 8),
            move |words| {
                let prev = cas(&self.persist, words, addr.offset, expected, new);
                self.persist.drain();
                prev
            },
        )
    }

    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<MappedBuf>, MemError>> {
        self.run(
            node,
            self.latency,
            move |size| check_pipeline(node, ops, size),
            move |words| {
                for op in ops {
                    let (offset, len) = op.span();
                    bytes::prefetch(words, offset, len);
                }
            },
            move |words| apply_pipeline(&self.persist, words, ops),
        )
    }

    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        // Applied now, without waiting for the latency; dropped on any error,
        // and by a failed or stalled node.
        if let Ok(words) = self.checked(node, |size| check_pipeline(node, ops, size))
            && self.nodes.fault(node) == Some(Fault::Healthy)
        {
            apply_ops(&self.persist, words, ops, drop);
        }
    }

    /// A read without the injected latency: messages to this client land in
    /// its inbox (see [`Memory::read_inbox`]), which it polls locally.
    fn read_inbox(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<MappedBuf, MemError>> {
        self.read_after(addr, len, Duration::ZERO)
    }

    fn now_ns(&self) -> Option<u64> {
        Some(monotonic_ns())
    }

    fn coarse_now_ns(&self) -> Option<u64> {
        Some(coarse_ns())
    }

    fn timeout_ns(&self) -> Option<u64> {
        Some(u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX))
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        poll_alarm(cx, at_ns)
    }
}

/// [`Memory::poll_alarm`] on [`monotonic_ns`]'s clock, spinning as the
/// operations do: the task is woken at once until the alarm is due.
pub fn poll_alarm(cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
    if monotonic_ns() >= at_ns {
        return Poll::Ready(());
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}
