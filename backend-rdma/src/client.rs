//! [`RdmaMemory`]: the core's [`Memory`] over a [`Nic`], one client's
//! handle on its memory nodes.
//!
//! - **One roundtrip per pipeline.** An ordered pipeline becomes one chain
//!   of work requests posted with one doorbell on the node's queue pair:
//!   only the last is signaled, since on a reliable-connected queue pair a
//!   completion means every earlier request of the queue pair completed
//!   too. A request that follows a READ or a CAS carries the fence flag,
//!   because RDMA lets a later WRITE overtake an earlier READ or atomic;
//!   WRITE followed by CAS, the case the protocols rely on (In-n-Out, §4
//!   of the SWARM paper), is executed in order by the responder and needs
//!   no fence.
//! - **Buffers belong to the backend until their completion.** Write data
//!   is copied into chunks of the registered arena before posting, read
//!   results are copied out after completion. An operation dropped or timed
//!   out before its completion leaves its chunks in the in-flight table,
//!   marked abandoned, and they are freed when the completion is polled.
//! - **Completions are polled inside the futures**: whichever operation of
//!   the handle is polled drains the completion queue and marks the
//!   operations it finishes; each finds its own result at its next poll.
//! - **Time-outs**: an operation whose completion has not come within the
//!   handle's time-out returns [`MemErrorKind::TimedOut`] (it may or may
//!   not have been applied, as the core expects). Completion errors map to
//!   the core's kinds ([`crate::nic::completion_error`]): a node that does
//!   not answer the transport's retries is `Unreachable`.
//! - **Bounds** are checked by the core's shared checks before anything is
//!   posted, so a bad offset never reaches the wire.

use core::cell::RefCell;
use core::future::Future;
use std::time::{Duration, Instant};

use swarm_core::substrate::exec::yield_now;
use swarm_core::substrate::memory::{OpOutput, check_pipeline};
use swarm_core::{MemError, MemErrorKind, Memory, NodeId, Op, Outputs, RemoteAddr};
use swarm_mapped::MappedBuf;

use crate::arena::{Arena, Chunk, MIN_CHUNK};
use crate::nic::{Nic, PostError, Wc, Wr, WrKind, completion_error, post_error, status};

/// How long an operation waits for its completion, unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Completions taken from the NIC per poll.
const POLL_BATCH: usize = 32;

/// One client's handle on its memory nodes over RDMA (or any [`Nic`]).
pub struct RdmaMemory<N: Nic> {
    nic: N,
    timeout: Duration,
    state: RefCell<State>,
}

/// The in-flight table and the arena's allocator.
struct State {
    arena: Arena,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Work requests posted and not yet completed, per node's queue pair.
    outstanding: Vec<usize>,
    /// Nodes whose queue pair this handle put in the error state.
    failed: Vec<bool>,
    wcs: Vec<Wc>,
}

/// One posted chain.
#[derive(Default)]
struct Slot {
    /// Bumped on every reuse; completions carry it, so a late one for an
    /// earlier use is recognised.
    generation: u32,
    node: u16,
    /// Work requests in the chain.
    wrs: usize,
    /// The chain's last completion has been polled.
    done: bool,
    /// Nobody waits for the result: free everything on completion.
    abandoned: bool,
    /// The first error status any request of the chain completed with.
    error: Option<u32>,
    /// Local chunks, in posting order, with the operation each belongs to.
    pieces: Vec<Piece>,
}

#[derive(Clone, Copy)]
struct Piece {
    op: u8,
    chunk: Chunk,
    len: u32,
}

/// Why a chain could not be posted now.
enum Start {
    /// The arena or the queue pair is full: try again after polling.
    Busy,
    Failed(MemError),
}

/// A work request's id: slot, generation (24 bits), and whether it is the
/// chain's last.
fn wr_id(slot: u32, generation: u32, last: bool) -> u64 {
    (u64::from(slot) << 32) | (u64::from(generation & 0xff_ffff) << 8) | u64::from(last)
}

impl<N: Nic> RdmaMemory<N> {
    /// A handle that drives `nic`.
    pub fn new(nic: N) -> RdmaMemory<N> {
        let nodes = nic.node_count();
        let arena = Arena::new(nic.arena_size());
        let state = State {
            arena,
            slots: Vec::new(),
            free_slots: Vec::new(),
            outstanding: vec![0; nodes],
            failed: vec![false; nodes],
            wcs: Vec::new(),
        };
        RdmaMemory { nic, timeout: DEFAULT_TIMEOUT, state: RefCell::new(state) }
    }

    /// Makes operations give up (with [`MemErrorKind::TimedOut`]) after
    /// `timeout` without a completion.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The NIC.
    pub fn nic(&self) -> &N {
        &self.nic
    }

    /// Chains posted whose completion has not been polled yet (abandoned
    /// ones included).
    pub fn in_flight(&self) -> usize {
        let s = self.state.borrow();
        s.slots.len() - s.free_slots.len()
    }

    /// Arena chunks held by chains in flight.
    pub fn chunks_held(&self) -> usize {
        self.state.borrow().arena.held()
    }

    /// Checks `ops` for `node`.
    fn check(&self, node: NodeId, ops: &[Op<'_>]) -> Result<(), MemError> {
        if usize::from(node.0) >= self.nic.node_count() {
            return Err(MemError::new(node, MemErrorKind::NoSuchNode));
        }
        check_pipeline(node, ops, self.nic.node_size(node))?;
        // A chain must fit the queue pair, and each piece the arena.
        let largest = self.state.borrow().arena.largest() as usize;
        let wrs: usize = ops.iter().map(|op| pieces(op_len(op), largest)).sum();
        if wrs > self.nic.queue_depth() || arena_bytes(ops, largest) > self.nic.arena_size() as usize {
            let len = ops.iter().map(|op| op_len(op) as u64).sum();
            return Err(MemError::new(node, MemErrorKind::TooLarge { len }));
        }
        Ok(())
    }

    /// Copies `ops` into arena chunks and posts them as one chain; returns
    /// the slot, or `None` if there was nothing to post (every operation
    /// moves zero bytes).
    fn start(&self, node: NodeId, ops: &[Op<'_>], abandoned: bool) -> Result<Option<u32>, Start> {
        let mut guard = self.state.borrow_mut();
        let s = &mut *guard;
        let largest = s.arena.largest() as usize;
        let wrs: usize = ops.iter().map(|op| pieces(op_len(op), largest)).sum();
        if wrs == 0 {
            return Ok(None);
        }
        if s.failed[usize::from(node.0)] {
            return Err(Start::Failed(MemError::new(node, MemErrorKind::Unreachable)));
        }
        if s.outstanding[usize::from(node.0)] + wrs > self.nic.queue_depth() {
            return Err(Start::Busy);
        }
        let slot = match s.free_slots.pop() {
            Some(i) => i,
            None => {
                s.slots.push(Slot::default());
                (s.slots.len() - 1) as u32
            }
        };
        let sl = &mut s.slots[slot as usize];
        sl.generation = sl.generation.wrapping_add(1);
        if !alloc_pieces(&mut s.arena, ops, largest, &mut sl.pieces) {
            s.free_slots.push(slot);
            return Err(Start::Busy);
        }
        let mut chain = Vec::with_capacity(wrs);
        let mut fenced = false;
        let mut prev_op = 0;
        let mut done = 0;
        for p in &sl.pieces {
            let op = &ops[usize::from(p.op)];
            if usize::from(p.op) != prev_op {
                fenced |= !matches!(ops[prev_op], Op::Write { .. });
                (prev_op, done) = (usize::from(p.op), 0);
            }
            let (kind, remote) = match *op {
                Op::Read { offset, .. } => (WrKind::Read, offset),
                Op::Write { offset, data } => {
                    // SAFETY: the chunk was just allocated, so no work
                    // request in flight uses it, and it lies in the arena.
                    unsafe { self.nic.put(p.chunk.at, &data[done..done + p.len as usize]) };
                    (WrKind::Write, offset)
                }
                Op::Cas { offset, expected, new } => (WrKind::Cas { expected, new }, offset),
            };
            let last = chain.len() + 1 == wrs;
            chain.push(Wr {
                id: wr_id(slot, sl.generation, last),
                kind,
                local: p.chunk.at,
                len: p.len,
                remote: remote + done as u64,
                signaled: last,
                fence: fenced,
            });
            done += p.len as usize;
        }
        if let Err(PostError { errno, posted }) = self.nic.post(node, &chain) {
            if posted == 0 {
                sl.pieces.iter().for_each(|p| s.arena.free(p.chunk));
                sl.pieces.clear();
                s.free_slots.push(slot);
            } else {
                // A prefix is in flight, unsignaled: no completion will
                // say when the NIC is done with its buffers. Keep them (and
                // the slot) for good, and give up on the queue pair, so that
                // no later chain is ordered after requests nobody tracks.
                (sl.node, sl.wrs, sl.done, sl.abandoned, sl.error) = (node.0, posted, false, true, None);
                s.outstanding[usize::from(node.0)] += posted;
                s.failed[usize::from(node.0)] = true;
                self.nic.fail(node);
            }
            return Err(Start::Failed(post_error(node, errno)));
        }
        sl.node = node.0;
        sl.wrs = chain.len();
        sl.done = false;
        sl.abandoned = abandoned;
        sl.error = None;
        s.outstanding[usize::from(node.0)] += chain.len();
        Ok(Some(slot))
    }

    /// Drains the completion queue into the in-flight table.
    fn progress(&self) {
        let mut guard = self.state.borrow_mut();
        let s = &mut *guard;
        s.wcs.resize(POLL_BATCH, Wc::default());
        loop {
            let n = self.nic.poll(&mut s.wcs);
            for k in 0..n {
                let wc = s.wcs[k];
                let (slot, generation, last) =
                    ((wc.id >> 32) as u32, ((wc.id >> 8) & 0xff_ffff) as u32, wc.id & 1 == 1);
                let Some(sl) = s.slots.get_mut(slot as usize) else { continue };
                if sl.generation & 0xff_ffff != generation || sl.done {
                    continue; // a late completion of a chain already finished
                }
                if wc.status != status::SUCCESS {
                    sl.error.get_or_insert(wc.status);
                }
                if !last {
                    continue;
                }
                s.outstanding[usize::from(sl.node)] -= sl.wrs;
                sl.done = true;
                if sl.abandoned {
                    sl.pieces.iter().for_each(|p| s.arena.free(p.chunk));
                    sl.pieces.clear();
                    s.free_slots.push(slot);
                }
            }
            if n < POLL_BATCH {
                return;
            }
        }
    }

    /// Takes a finished chain's outputs and frees its slot.
    fn finish(&self, slot: u32, node: NodeId, ops: &[Op<'_>]) -> Result<Outputs<MappedBuf>, MemError> {
        let mut guard = self.state.borrow_mut();
        let s = &mut *guard;
        let sl = &mut s.slots[slot as usize];
        let result = match sl.error {
            Some(code) => Err(completion_error(node, code)),
            None => Ok(self.outputs(ops, |i| sl.pieces.iter().filter(move |p| usize::from(p.op) == i))),
        };
        sl.pieces.iter().for_each(|p| s.arena.free(p.chunk));
        sl.pieces.clear();
        s.free_slots.push(slot);
        result
    }

    /// The outputs of `ops`, whose pieces `pieces_of(i)` gives in order.
    fn outputs<'p, I: Iterator<Item = &'p Piece>>(
        &self,
        ops: &[Op<'_>],
        pieces_of: impl Fn(usize) -> I,
    ) -> Outputs<MappedBuf> {
        let mut out = Outputs::new();
        for (i, op) in ops.iter().enumerate() {
            let o = match *op {
                Op::Read { len, .. } => OpOutput::Read(MappedBuf::filled(len, |buf| {
                    let mut at = 0;
                    for p in pieces_of(i) {
                        let n = p.len as usize;
                        // SAFETY: the chain's completion was polled, so the
                        // NIC is done with the chunk; it lies in the arena.
                        unsafe { self.nic.get(p.chunk.at, &mut buf[at..at + n]) };
                        at += n;
                    }
                })),
                Op::Write { .. } => OpOutput::Written,
                Op::Cas { .. } => {
                    let mut word = [0u8; 8];
                    if let Some(p) = pieces_of(i).next() {
                        // SAFETY: as above.
                        unsafe { self.nic.get(p.chunk.at, &mut word) };
                    }
                    // The NIC stores the old value in host order.
                    OpOutput::Cas(u64::from_ne_bytes(word))
                }
            };
            // At most MAX_PIPELINE operations, which `check` made sure of.
            let _ = out.push(o);
        }
        out
    }

    /// Runs `ops` on `node` as one chain and waits for its completion.
    async fn run(&self, node: NodeId, ops: &[Op<'_>]) -> Result<Outputs<MappedBuf>, MemError> {
        self.check(node, ops)?;
        let deadline = Instant::now() + self.timeout;
        let timed_out = || MemError::new(node, MemErrorKind::TimedOut);
        let slot = loop {
            match self.start(node, ops, false) {
                Ok(Some(slot)) => break slot,
                Ok(None) => return Ok(self.outputs(ops, |_| [].iter())),
                Err(Start::Failed(e)) => return Err(e),
                Err(Start::Busy) if Instant::now() >= deadline => return Err(timed_out()),
                Err(Start::Busy) => {
                    self.progress();
                    yield_now().await;
                }
            }
        };
        // From here on the chain is the NIC's: if this future is dropped,
        // the ticket hands the slot over to be freed on completion.
        let mut ticket = Ticket { mem: self, slot: Some(slot) };
        loop {
            self.progress();
            if self.state.borrow().slots[slot as usize].done {
                ticket.slot = None;
                return self.finish(slot, node, ops);
            }
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            yield_now().await;
        }
    }

    /// Marks `slot` abandoned, freeing it now if its completion came.
    fn abandon(&self, slot: u32) {
        let mut guard = self.state.borrow_mut();
        let s = &mut *guard;
        let sl = &mut s.slots[slot as usize];
        if sl.done {
            sl.pieces.iter().for_each(|p| s.arena.free(p.chunk));
            sl.pieces.clear();
            s.free_slots.push(slot);
        } else {
            sl.abandoned = true;
        }
    }
}

/// A chain in flight that an operation still waits for.
struct Ticket<'a, N: Nic> {
    mem: &'a RdmaMemory<N>,
    slot: Option<u32>,
}

impl<N: Nic> Drop for Ticket<'_, N> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.mem.abandon(slot);
        }
    }
}

fn op_len(op: &Op<'_>) -> usize {
    match *op {
        Op::Read { len, .. } => len,
        Op::Write { data, .. } => data.len(),
        Op::Cas { .. } => 8,
    }
}

/// Takes the chunks of every piece of `ops` (each at most `largest` bytes)
/// into `out`, in order, or none of them if the arena has no room now. An
/// arena that nothing else holds starts over first, so a chain that fits
/// the whole arena ([`RdmaMemory::check`]) always gets its room eventually.
fn alloc_pieces(arena: &mut Arena, ops: &[Op<'_>], largest: usize, out: &mut Vec<Piece>) -> bool {
    for restart in [false, true] {
        out.clear();
        let mut ok = true;
        'ops: for (i, op) in ops.iter().enumerate() {
            let len = op_len(op);
            let mut done = 0;
            while done < len {
                let n = (len - done).min(largest) as u32;
                let Some(chunk) = arena.alloc(n) else {
                    ok = false;
                    break 'ops;
                };
                out.push(Piece { op: i as u8, chunk, len: n });
                done += n as usize;
            }
        }
        if ok {
            return true;
        }
        out.drain(..).for_each(|p| arena.free(p.chunk));
        if restart || arena.held() > 0 {
            return false;
        }
        arena.reset();
    }
    false
}

/// Bytes of arena the chunks of `ops` take.
fn arena_bytes(ops: &[Op<'_>], largest: usize) -> usize {
    let chunk = |n: usize| n.max(MIN_CHUNK as usize).next_power_of_two();
    ops.iter()
        .map(|op| {
            let (full, rest) = (op_len(op) / largest, op_len(op) % largest);
            full * chunk(largest) + if rest > 0 { chunk(rest) } else { 0 }
        })
        .sum()
}

/// Work requests a transfer of `len` bytes takes with pieces of `largest`.
fn pieces(len: usize, largest: usize) -> usize {
    len.div_ceil(largest.max(1))
}

impl<N: Nic> Memory for RdmaMemory<N> {
    type Buf = MappedBuf;

    fn node_count(&self) -> usize {
        self.nic.node_count()
    }

    async fn read(&self, addr: RemoteAddr, len: usize) -> Result<MappedBuf, MemError> {
        let mut out = self.run(addr.node, &[Op::Read { offset: addr.offset, len }]).await?;
        Ok(out.pop().and_then(OpOutput::into_read).unwrap_or_else(|| MappedBuf::filled(0, |_| ())))
    }

    async fn write(&self, addr: RemoteAddr, data: &[u8]) -> Result<(), MemError> {
        self.run(addr.node, &[Op::Write { offset: addr.offset, data }]).await.map(drop)
    }

    async fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, MemError> {
        let out = self.run(addr.node, &[Op::Cas { offset: addr.offset, expected, new }]).await?;
        Ok(out.first().and_then(OpOutput::cas).unwrap_or(0))
    }

    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<MappedBuf>, MemError>> {
        self.run(node, ops)
    }

    /// Posts now (the data is copied before this returns) and frees the
    /// chain's buffers when a later poll sees its completion. If the queue
    /// pair or the arena is full, waits for room up to the time-out, then
    /// drops the work, as a crash of this client would.
    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        if self.check(node, ops).is_err() {
            return;
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.start(node, ops, true) {
                Err(Start::Busy) if Instant::now() < deadline => self.progress(),
                _ => return,
            }
        }
    }

    fn now_ns(&self) -> Option<u64> {
        Some(swarm_mapped::monotonic_ns())
    }

    fn coarse_now_ns(&self) -> Option<u64> {
        Some(swarm_mapped::coarse_ns())
    }

    fn timeout_ns(&self) -> Option<u64> {
        Some(u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX))
    }

    fn poll_alarm(&self, cx: &mut std::task::Context<'_>, at_ns: u64) -> std::task::Poll<()> {
        swarm_mapped::poll_alarm(cx, at_ns)
    }
}
