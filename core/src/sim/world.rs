//! The simulated memory nodes and the network between them and the clients:
//! what happens when, in virtual time.
//!
//! An operation group (one op, or an ordered pipeline) posted at time `t`
//! reaches its node after a random one-way delay, is applied there in
//! *pieces* (reads and writes longer than a word are split at random word
//! boundaries and applied at distinct instants, so a concurrent read can see
//! a mix: the paper's non-atomic READ and WRITE), and its response arrives
//! after another random delay. Groups to different nodes, and separate
//! groups to one node, overlap and complete in any order; the pieces of one
//! group are applied in order (the ordered pipeline).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::task::Waker;

use super::SimConfig;
use super::rng::Rng;
use crate::substrate::memory::check_pipeline;
use crate::{MemError, MemErrorKind, NodeId, Op, OpOutput, Outputs};

/// How a crashed node answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CrashMode {
    /// Operations fail after one roundtrip with [`MemErrorKind::Unreachable`]
    /// (a connection-level error, e.g. an RDMA retry-exceeded completion).
    FailFast,
    /// Operations hang until the client's timeout, then fail with
    /// [`MemErrorKind::TimedOut`].
    Hang,
}

/// The result slot a waiting future reads, and whom to wake when it fills.
pub(crate) struct Slot<T> {
    pub(crate) result: Option<T>,
    pub(crate) waker: Option<Waker>,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Slot { result: None, waker: None }))
    }

    fn fill(&mut self, v: T) {
        self.result = Some(v);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

pub(crate) type OpResult = Result<Outputs<Vec<u8>>, MemError>;

enum OwnedOp {
    Read { offset: u64 },
    Write { offset: u64, data: Vec<u8> },
    Cas { offset: u64, expected: u64, new: u64 },
}

/// A contiguous part of one operation, applied at one instant.
struct Piece {
    op: usize,
    /// Byte range within the operation.
    start: usize,
    end: usize,
}

struct Group {
    client: u32,
    node: usize,
    posted_at: u64,
    ops: Vec<OwnedOp>,
    pieces: Vec<Piece>,
    outputs: Vec<OpOutput<Vec<u8>>>,
    /// Pieces from this index on are never applied (a client crash cut the
    /// transfer short).
    cut: usize,
    /// The node was down when a piece arrived.
    failed: bool,
    /// Pieces applied so far.
    applied: usize,
    slot: Option<Rc<RefCell<Slot<OpResult>>>>,
}

pub(crate) enum Event {
    Apply { group: u64, piece: usize },
    Respond { group: u64 },
    Timer { slot: Rc<RefCell<Slot<()>>> },
    Alarm { client: u32, waker: Waker },
    CrashNode { node: usize, mode: CrashMode },
    HealNode { node: usize },
    SlowNode { node: usize, factor: u64 },
    StallNode { node: usize, until: u64 },
    CrashClient { client: u32 },
    SlowClient { client: u32, factor: u64 },
    StallClient { client: u32, until: u64 },
    Unstall { client: u32 },
}

struct NodeState {
    mem: Vec<u8>,
    down: Option<CrashMode>,
    slow: u64,
    /// Stalled until this time (a paused memory node, an overloaded
    /// switch): what arrives meanwhile waits and is applied after.
    stalled_until: u64,
}

/// One line of the trace: something that happened to memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TraceEntry {
    /// Virtual time, ns.
    pub time: u64,
    /// The client that posted the operation.
    pub client: u32,
    /// The node.
    pub node: u16,
    /// 'R' read piece, 'W' write piece, 'C' CAS, 'r' response, 'x' dropped.
    pub kind: u8,
    /// Offset in the node's region.
    pub offset: u64,
    /// Bytes touched (for 'C': 1 if it swapped).
    pub len: u64,
}

pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    pub(crate) now: u64,
    pub(crate) rng: Rng,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    nodes: Vec<NodeState>,
    groups: BTreeMap<u64, Group>,
    next_group: u64,
    pub(crate) digest: u64,
    pub(crate) trace: Vec<TraceEntry>,
    pub(crate) events_done: u64,
    /// Clients whose tasks the executor must drop.
    pub(crate) crashed_clients: Vec<u32>,
    /// Latest scheduled piece per (client, node), for `fifo_per_queue`.
    queues: BTreeMap<(u32, usize), u64>,
    /// Clients made slower (a server on a loaded CPU): factor on their
    /// operations' latency.
    slow_clients: BTreeMap<u32, u64>,
    /// Clients stalled (a paused process), until when: the executor does
    /// not poll their tasks meanwhile.
    pub(crate) stalled: BTreeMap<u32, u64>,
    /// Alarms set and not yet rung, per client and time: a task that polls
    /// for the same alarm again sets it once.
    alarms: BTreeSet<(u32, u64)>,
}

const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;

impl World {
    pub(crate) fn new(cfg: SimConfig) -> Self {
        let nodes = (0..cfg.nodes)
            .map(|_| NodeState { mem: vec![0; cfg.node_size as usize], down: None, slow: 1, stalled_until: 0 })
            .collect();
        World {
            rng: Rng::new(cfg.seed),
            cfg,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            nodes,
            groups: BTreeMap::new(),
            next_group: 0,
            digest: 0xCBF2_9CE4_8422_2325,
            trace: Vec::new(),
            events_done: 0,
            crashed_clients: Vec::new(),
            queues: BTreeMap::new(),
            slow_clients: BTreeMap::new(),
            stalled: BTreeMap::new(),
            alarms: BTreeSet::new(),
        }
    }

    pub(crate) fn schedule(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.events.insert((at.max(self.now), self.seq), ev);
    }

    /// Wakes `waker` at time `at`, unless `client` set that alarm already.
    pub(crate) fn alarm(&mut self, client: u32, at: u64, waker: &Waker) {
        if self.alarms.insert((client, at)) {
            self.schedule(at, Event::Alarm { client, waker: waker.clone() });
        }
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub(crate) fn next_event_time(&self) -> Option<u64> {
        self.events.first_key_value().map(|(&(t, _), _)| t)
    }

    /// The one-way delay of an operation of `client` to `node`: across the
    /// network, or a `local` access (a receiver polling its own inbox).
    fn one_way(&mut self, client: u32, node: usize, local: bool) -> u64 {
        let slow = self.slow_clients.get(&client).copied().unwrap_or(1);
        if local {
            return (self.cfg.local_latency_ns / 2).max(1) * slow;
        }
        let (lo, hi) = (self.cfg.min_latency_ns / 2, self.cfg.max_latency_ns / 2);
        let tail =
            if self.cfg.tail_one_in > 0 && self.rng.chance(1, self.cfg.tail_one_in) { self.cfg.tail_factor } else { 1 };
        self.rng.range(lo, hi) * self.nodes[node].slow * tail.max(1) * slow
    }

    fn record(&mut self, e: TraceEntry) {
        for w in [e.time, e.client as u64, e.node as u64, e.kind as u64, e.offset, e.len] {
            self.digest = (self.digest ^ w).wrapping_mul(FNV_PRIME);
        }
        if self.cfg.keep_trace {
            self.trace.push(e);
        }
    }

    /// Posts a group of operations; its response fills `slot` (none for
    /// background posts). Requests that are wrong in themselves (bad node,
    /// out of bounds) fail at once, before anything is sent. A `local` group
    /// is a read of the client's own inbox: local latency, no tail.
    pub(crate) fn post(
        &mut self,
        client: u32,
        node: NodeId,
        ops: &[Op<'_>],
        slot: Option<Rc<RefCell<Slot<OpResult>>>>,
        local: bool,
    ) -> Result<(), MemError> {
        let n = node.index();
        if n >= self.nodes.len() {
            return Err(MemError::new(node, MemErrorKind::NoSuchNode));
        }
        check_pipeline(node, ops, self.cfg.node_size)?;
        let id = self.next_group;
        self.next_group += 1;
        let mut group = Group {
            client,
            node: n,
            posted_at: self.now,
            ops: Vec::with_capacity(ops.len()),
            pieces: Vec::new(),
            outputs: Vec::with_capacity(ops.len()),
            cut: usize::MAX,
            failed: false,
            applied: 0,
            slot,
        };
        for (i, op) in ops.iter().enumerate() {
            let (owned, out, len) = match *op {
                Op::Read { offset, len } => (OwnedOp::Read { offset }, OpOutput::Read(vec![0; len]), len),
                Op::Write { offset, data } => {
                    (OwnedOp::Write { offset, data: data.to_vec() }, OpOutput::Written, data.len())
                }
                Op::Cas { offset, expected, new } => (OwnedOp::Cas { offset, expected, new }, OpOutput::Cas(0), 8),
            };
            let offset = match owned {
                OwnedOp::Read { offset, .. } | OwnedOp::Write { offset, .. } | OwnedOp::Cas { offset, .. } => offset,
            };
            let splittable = !matches!(owned, OwnedOp::Cas { .. });
            self.split(&mut group.pieces, i, offset, len, splittable);
            group.ops.push(owned);
            group.outputs.push(out);
        }
        let mut t = self.now + self.one_way(client, n, local);
        if self.cfg.fifo_per_queue {
            let last = self.queues.entry((client, n)).or_insert(0);
            t = t.max(*last + 1);
        }
        if self.nodes[n].down.is_some() {
            group.failed = true;
            group.pieces.clear();
        }
        let pieces = group.pieces.len();
        self.groups.insert(id, group);
        for p in 0..pieces {
            self.schedule(t, Event::Apply { group: id, piece: p });
            if self.cfg.fifo_per_queue {
                self.queues.insert((client, n), t);
            }
            t += self.rng.range(0, self.cfg.max_piece_gap_ns);
        }
        let back = self.one_way(client, n, local);
        self.schedule(t + back, Event::Respond { group: id });
        Ok(())
    }

    /// Splits `len` bytes at `offset` into up to four pieces at word
    /// boundaries (CAS words are never split).
    fn split(&mut self, pieces: &mut Vec<Piece>, op: usize, offset: u64, len: usize, splittable: bool) {
        let mut start = 0usize;
        if splittable && len > 8 {
            let extra = self.rng.range(0, 3);
            for _ in 0..extra {
                // A cut point at an aligned address strictly inside the range.
                let at = self.rng.range(start as u64 + 1, len as u64 - 1);
                let aligned = ((offset + at) & !7).saturating_sub(offset) as usize;
                if aligned > start && aligned < len {
                    pieces.push(Piece { op, start, end: aligned });
                    start = aligned;
                }
            }
        }
        pieces.push(Piece { op, start, end: len });
    }

    pub(crate) fn process(&mut self) -> Option<()> {
        let ((t, _), ev) = self.events.pop_first()?;
        self.now = t;
        self.events_done += 1;
        match ev {
            Event::Apply { group, piece } => self.apply(group, piece),
            Event::Respond { group } => self.respond(group),
            Event::Timer { slot } => slot.borrow_mut().fill(()),
            Event::Alarm { client, waker } => {
                self.alarms.remove(&(client, t));
                waker.wake();
            }
            Event::CrashNode { node, mode } => self.nodes[node].down = Some(mode),
            Event::HealNode { node } => self.nodes[node].down = None,
            Event::SlowNode { node, factor } => self.nodes[node].slow = factor.max(1),
            Event::StallNode { node, until } => {
                let n = &mut self.nodes[node];
                n.stalled_until = n.stalled_until.max(until);
            }
            Event::CrashClient { client } => self.crash_client(client),
            Event::SlowClient { client, factor } => {
                self.slow_clients.insert(client, factor.max(1));
            }
            Event::StallClient { client, until } => {
                self.stalled.insert(client, until);
                self.schedule(until, Event::Unstall { client });
            }
            Event::Unstall { client } => {
                if self.stalled.get(&client).is_some_and(|&u| u <= self.now) {
                    self.stalled.remove(&client);
                }
            }
        }
        Some(())
    }

    fn apply(&mut self, id: u64, p: usize) {
        let now = self.now;
        let Some(g) = self.groups.get_mut(&id) else { return };
        let node = g.node;
        let entry =
            |kind, offset, len| TraceEntry { time: now, client: g.client, node: node as u16, kind, offset, len };
        if p >= g.cut || g.failed {
            let e = entry(b'x', 0, p as u64);
            self.record(e);
            return;
        }
        if self.nodes[node].down.is_some() {
            g.failed = true;
            let e = entry(b'x', 0, p as u64);
            self.record(e);
            return;
        }
        let until = self.nodes[node].stalled_until;
        if until > now {
            // Applied when the stall ends, in the order it arrived.
            self.schedule(until, Event::Apply { group: id, piece: p });
            return;
        }
        g.applied += 1;
        let piece = &g.pieces[p];
        let mem = &mut self.nodes[node].mem;
        let e = match (&g.ops[piece.op], &mut g.outputs[piece.op]) {
            (OwnedOp::Read { offset, .. }, OpOutput::Read(buf)) => {
                let at = *offset as usize + piece.start;
                buf[piece.start..piece.end].copy_from_slice(&mem[at..at + piece.end - piece.start]);
                entry(b'R', at as u64, (piece.end - piece.start) as u64)
            }
            (OwnedOp::Write { offset, data }, _) => {
                let at = *offset as usize + piece.start;
                mem[at..at + piece.end - piece.start].copy_from_slice(&data[piece.start..piece.end]);
                entry(b'W', at as u64, (piece.end - piece.start) as u64)
            }
            (OwnedOp::Cas { offset, expected, new }, out) => {
                let at = *offset as usize;
                let word: [u8; 8] = mem[at..at + 8].try_into().unwrap_or([0; 8]);
                let prev = u64::from_le_bytes(word);
                if prev == *expected {
                    mem[at..at + 8].copy_from_slice(&new.to_le_bytes());
                }
                *out = OpOutput::Cas(prev);
                entry(b'C', at as u64, (prev == *expected) as u64)
            }
            // Outputs are built to match their operations in `post`.
            (OwnedOp::Read { .. }, _) => return,
        };
        self.record(e);
    }

    fn respond(&mut self, id: u64) {
        let Some(g) = self.groups.get(&id) else { return };
        let node = NodeId(g.node as u16);
        if !g.failed && g.applied < g.pieces.len().min(g.cut) && g.slot.is_some() {
            // Held by a stalled node: answered after it, or timed out (the
            // node may still apply it later, as a late request is).
            let deadline = g.posted_at + self.cfg.timeout_ns;
            if self.now < deadline {
                let after = self.nodes[g.node].stalled_until + self.cfg.max_latency_ns;
                self.schedule(after.min(deadline), Event::Respond { group: id });
                return;
            }
            let e = TraceEntry { time: self.now, client: g.client, node: node.0, kind: b'r', offset: 0, len: 1 };
            let after = self.nodes[g.node].stalled_until + self.cfg.max_latency_ns;
            self.record(e);
            if let Some(slot) = self.groups.get_mut(&id).and_then(|g| g.slot.take()) {
                slot.borrow_mut().fill(Err(MemError::new(node, MemErrorKind::TimedOut)));
            }
            // Forgotten once the node got to it.
            self.schedule(after, Event::Respond { group: id });
            return;
        }
        if g.failed && g.slot.is_some() {
            let mode = self.nodes[g.node].down.unwrap_or(CrashMode::Hang);
            let deadline = g.posted_at + self.cfg.timeout_ns;
            if mode == CrashMode::Hang && self.now < deadline {
                self.schedule(deadline, Event::Respond { group: id });
                return;
            }
        }
        let Some(g) = self.groups.remove(&id) else { return };
        let e =
            TraceEntry { time: self.now, client: g.client, node: node.0, kind: b'r', offset: 0, len: g.failed as u64 };
        self.record(e);
        let Some(slot) = g.slot else { return };
        let result = if g.failed {
            let kind = match self.nodes[g.node].down {
                Some(CrashMode::FailFast) => MemErrorKind::Unreachable,
                _ => MemErrorKind::TimedOut,
            };
            Err(MemError::new(node, kind))
        } else {
            Ok(g.outputs.into_iter().collect())
        };
        slot.borrow_mut().fill(result);
    }

    /// A client crashed: its tasks are dropped by the executor, and each of
    /// its transfers still in flight is cut short at a random piece (the
    /// NIC may or may not have sent the rest).
    fn crash_client(&mut self, client: u32) {
        self.crashed_clients.push(client);
        let ids: Vec<u64> = self.groups.iter().filter(|(_, g)| g.client == client).map(|(&id, _)| id).collect();
        for id in ids {
            let pieces = self.groups[&id].pieces.len() as u64;
            let cut = self.rng.range(0, pieces) as usize;
            if let Some(g) = self.groups.get_mut(&id) {
                g.cut = g.cut.min(cut);
                g.slot = None;
            }
        }
    }

    /// Reads node memory directly, for checks after a run.
    pub(crate) fn peek(&self, node: usize, offset: usize, len: usize) -> Option<&[u8]> {
        self.nodes.get(node)?.mem.get(offset..offset.checked_add(len)?)
    }

    pub(crate) fn groups_in_flight(&self) -> usize {
        self.groups.len()
    }
}
