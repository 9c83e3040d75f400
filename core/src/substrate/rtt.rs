//! Roundtrip accounting: the figure the papers compare (SWARM Table 2,
//! Clover Table 1, DINOMO Table 6), exact and independent of the machine.
//!
//! [`Counted`] wraps any [`Memory`] (owned, or borrowed: `&M` is a memory
//! too) for the duration of one logical operation, or for a client's whole
//! life with a [`Counted::reset`] before each operation. Each memory operation is stamped, when it is created, with the
//! number of sequential roundtrips the caller had completed so far; when the
//! caller receives its completion, the count becomes at least that stamp plus
//! one. Operations posted together therefore count once, a majority wait
//! counts once, and background posts and dropped (late) operations do not
//! count at all: the result is the length of the longest chain of
//! memory operations the caller waited for, one after the other.
//!
//! A message exchange with a server (`crate::substrate::msg::rpc`) counts
//! as one roundtrip: the request's write is counted, the polls of the
//! caller's inbox ([`Memory::read_inbox`]) are not; the server's own memory
//! operations for the request are reported apart ([`Counted::served`]),
//! except the sequential roundtrips a server makes to other nodes while
//! the caller waits, which it may report ([`Memory::note_server_roundtrips`])
//! and which count as the caller's (pDPM-Central's write: the RPC, then the
//! coordinator's WRITE to the data nodes, 2 roundtrips as pDPM Table 1).

use core::cell::Cell;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use crate::{MemError, Memory, NodeId, Op, Outputs, RemoteAddr};

/// A [`Memory`] that counts the sequential roundtrips of what it carries.
pub struct Counted<M> {
    mem: M,
    level: Cell<u32>,
    ops: Cell<u32>,
    served: Cell<u32>,
}

impl<M: Memory> Counted<M> {
    /// Starts counting from zero on `mem`.
    pub fn new(mem: M) -> Self {
        Self { mem, level: Cell::new(0), ops: Cell::new(0), served: Cell::new(0) }
    }

    /// Sequential roundtrips so far.
    pub fn roundtrips(&self) -> u32 {
        self.level.get()
    }

    /// Memory operations posted so far (background ones included; a pipeline counts once).
    pub fn ops(&self) -> u32 {
        self.ops.get()
    }

    /// Memory operations that servers did for this caller's requests so far
    /// (as they reported them, [`Memory::note_served`]).
    pub fn served(&self) -> u32 {
        self.served.get()
    }

    /// Starts again from zero, for the next logical operation.
    pub fn reset(&self) {
        self.level.set(0);
        self.ops.set(0);
        self.served.set(0);
    }

    /// The wrapped memory.
    pub fn inner(&self) -> &M {
        &self.mem
    }

    /// Stamps `op` with the roundtrips completed when it was *created*, not
    /// when first polled: operations created together (say, one per replica,
    /// then handed to a quorum) count once even on a backend that completes
    /// each in the same poll that posts it.
    fn track<F: Future>(&self, op: F) -> Tracked<'_, F> {
        self.ops.set(self.ops.get() + 1);
        Tracked { op, level: &self.level, posted_at: self.level.get() }
    }
}

pin_project_lite::pin_project! {
    /// An operation of a [`Counted`] memory: completes as the one it wraps,
    /// and then raises the count to at least one more than it was when the
    /// operation was created. (A hand-written future: as an `async` block
    /// it would hold the wrapped future twice, rust-lang/rust#62958.)
    pub struct Tracked<'a, F> {
        #[pin]
        op: F,
        level: &'a Cell<u32>,
        posted_at: u32,
    }
}

impl<F: Future> Future for Tracked<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = core::task::ready!(this.op.poll(cx));
        this.level.set(this.level.get().max(*this.posted_at + 1));
        Poll::Ready(out)
    }
}

impl<M: Memory> Memory for Counted<M> {
    type Buf = M::Buf;

    fn node_count(&self) -> usize {
        self.mem.node_count()
    }

    fn read(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>> {
        self.track(self.mem.read(addr, len))
    }

    fn write(&self, addr: RemoteAddr, data: &[u8]) -> impl Future<Output = Result<(), MemError>> {
        self.track(self.mem.write(addr, data))
    }

    fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> impl Future<Output = Result<u64, MemError>> {
        self.track(self.mem.cas(addr, expected, new))
    }

    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<Self::Buf>, MemError>> {
        self.track(self.mem.pipeline(node, ops))
    }

    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        self.ops.set(self.ops.get() + 1);
        self.mem.post_background(node, ops)
    }

    fn read_inbox(&self, addr: RemoteAddr, len: usize) -> impl Future<Output = Result<Self::Buf, MemError>> {
        self.mem.read_inbox(addr, len)
    }

    fn note_served(&self, ops: u32) {
        self.served.set(self.served.get().saturating_add(ops));
        self.mem.note_served(ops)
    }

    fn note_server_roundtrips(&self, rounds: u32) {
        self.level.set(self.level.get().saturating_add(rounds));
        self.mem.note_server_roundtrips(rounds)
    }

    fn now_ns(&self) -> Option<u64> {
        self.mem.now_ns()
    }

    fn coarse_now_ns(&self) -> Option<u64> {
        self.mem.coarse_now_ns()
    }

    fn timeout_ns(&self) -> Option<u64> {
        self.mem.timeout_ns()
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        self.mem.poll_alarm(cx, at_ns)
    }
}
