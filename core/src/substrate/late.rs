//! Late replicas: a slow node costs a little latency, never a time-out
//! (SWARM §6, §7.7).
//!
//! An operation starts with a mere majority of its replicas (saving the
//! others' bandwidth) and "contacts additional memory nodes as the majority
//! it initially contacted takes longer than expected to respond", with no
//! reconfiguration. Longer than expected is relative to what this client
//! sees of the same operation: a replica of the first majority is *late*
//! when it has not answered [`LATE_FACTOR`] times as long after the start as
//! the first reply took (and at least [`MIN_LATE_NS`]); before any reply,
//! after [`NO_REPLY_LATE_NS`]. A failed or timed-out reply widens at once,
//! as before.
//!
//! Each client keeps a [`NodeView`]: the nodes it saw fail or come late are
//! *suspects*, which later operations start without (their majority is
//! taken from the others first) until the node answers promptly again. So
//! that a node that recovers is noticed, one quorum operation in
//! [`PROBE_EVERY`] also starts the suspects of its replica set alongside
//! its majority, as probes: they cost bandwidth, not latency, since the
//! operation completes with whichever majority answers first, and a probe
//! that answers among them clears its node.
//!
//! Timing assumption: none for safety (a late replica is treated as a
//! failed one, which every protocol tolerates: its operation may still be
//! applied). For liveness and latency, replies of a healthy node take
//! less than [`LATE_FACTOR`] times those of the fastest one; where they do
//! not, the cost is bandwidth (a widened operation), not correctness.

use core::future::Future;
use core::task::{Context, Poll};

use crate::substrate::mutant::mutant;
use crate::substrate::quorum::Tally;
use crate::{MemError, MemErrorKind, Memory, NodeId};

/// A replica is late once this many times the first reply's time passed.
pub const LATE_FACTOR: u64 = 4;
/// ... and never before this long after the start, ns: the jitter of a
/// loaded host (a thread descheduled for a moment) is not a slow node.
pub const MIN_LATE_NS: u64 = 20_000;
/// With no reply at all, the first majority is late after this long, ns.
pub const NO_REPLY_LATE_NS: u64 = 1_000_000;
/// One quorum operation in this many probes the suspects among its replicas.
pub const PROBE_EVERY: u32 = 64;

/// Time, as a quorum needs it: [`Memory::now_ns`] and
/// [`Memory::poll_alarm`] of any memory, behind a reference that every
/// waiting combinator can take without being generic over the memory.
pub trait Timekeeper {
    /// See [`Memory::now_ns`].
    fn now_ns(&self) -> Option<u64>;
    /// See [`Memory::poll_alarm`].
    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()>;
}

impl<M: Memory> Timekeeper for M {
    fn now_ns(&self) -> Option<u64> {
        Memory::now_ns(self)
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        Memory::poll_alarm(self, cx, at_ns)
    }
}

/// When the replicas a wait started with are late: a wait's deadline,
/// set from its start and tightened by its first reply.
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    time: &'a dyn Timekeeper,
    start: Option<u64>,
    deadline: u64,
    measured: bool,
    /// How long to wait with no reply at all, ns.
    no_reply: u64,
    /// The least wait before anything is late, ns.
    min_late: u64,
}

impl<'a> Watch<'a> {
    /// A watch on `mem`'s clock (which never rings if it keeps no time).
    pub fn on<M: Memory>(mem: &'a M) -> Self {
        Watch {
            time: mem,
            start: None,
            deadline: u64::MAX,
            measured: false,
            no_reply: NO_REPLY_LATE_NS,
            min_late: MIN_LATE_NS,
        }
    }

    /// The same watch, for a wait whose left-out nodes stay left out for
    /// long (the sites of a lease): nothing is late before `ns`.
    pub fn at_least(mut self, ns: u64) -> Self {
        self.min_late = self.min_late.max(ns);
        self.no_reply = self.no_reply.max(ns);
        self
    }

    /// The same watch for a wait whose answers are not needed (the caller
    /// has what it must have, and asks the others as a courtesy): with no
    /// reply at all, they are late after [`MIN_LATE_NS`].
    pub fn courtesy(mut self) -> Self {
        self.no_reply = self.min_late;
        self
    }

    /// Called each time the wait would sleep (`replied`: some replica has
    /// answered): `Ready` once the replicas still awaited are late. The
    /// first call starts the clock (the operations were just posted).
    pub fn poll_late(&mut self, cx: &mut Context<'_>, replied: bool) -> Poll<()> {
        let Some(start) = self.start else {
            let Some(now) = self.time.now_ns() else { return Poll::Pending };
            self.start = Some(now);
            self.deadline = now.saturating_add(self.no_reply);
            if replied {
                self.measured = true;
                self.deadline = now.saturating_add(self.min_late);
            }
            return self.time.poll_alarm(cx, self.deadline);
        };
        if replied && !self.measured {
            self.measured = true;
            if let Some(now) = self.time.now_ns() {
                let first = now.saturating_sub(start);
                let late = start.saturating_add(self.min_late.max(LATE_FACTOR.saturating_mul(first)));
                self.deadline = self.deadline.min(late);
            }
        }
        self.time.poll_alarm(cx, self.deadline)
    }
}

/// `fut`, or `None` once it is late by `watch` (with no reply to measure
/// by: [`NO_REPLY_LATE_NS`]): one operation on one node that the caller
/// would rather ask elsewhere than wait for, with nothing of a quorum's
/// bookkeeping on its common path.
///
/// A hand-written future: an `async fn` would hold `fut` twice
/// (rust-lang/rust#62958).
pub fn or_late<F: Future>(fut: F, watch: Watch<'_>) -> OrLate<'_, F> {
    OrLate { fut, watch }
}

pin_project_lite::pin_project! {
    /// What [`or_late`] returns.
    #[must_use = "futures do nothing unless awaited"]
    pub struct OrLate<'a, F> {
        #[pin]
        fut: F,
        watch: Watch<'a>,
    }
}

impl<F: Future> Future for OrLate<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut core::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Some(out));
        }
        this.watch.poll_late(cx, false).map(|()| None)
    }
}

/// Asks `ask(i)` of `0..n` in turn until `decide` breaks with an answer,
/// for what any one node can answer (a record every node keeps): a node
/// that is late by [`Watch`] is passed over rather than waited for until
/// its time-out, and asked again, patiently, once every other one was.
/// `None` if no answer decided.
pub async fn in_turn<M: Memory, T, R, F: Future<Output = T>>(
    mem: &M,
    n: usize,
    mut ask: impl FnMut(usize) -> F,
    mut decide: impl FnMut(T) -> core::ops::ControlFlow<R>,
) -> Option<R> {
    // Those passed over (bit `i` for `i`; those beyond 64 are waited for).
    let mut late = 0u64;
    for patient in [false, true] {
        for i in 0..n {
            let bit = 1u64.checked_shl(i as u32).unwrap_or(0);
            let answer = if patient {
                if late & bit == 0 {
                    continue;
                }
                ask(i).await
            } else if bit == 0 || mutant!("waits-for-late") {
                ask(i).await
            } else {
                match or_late(ask(i), Watch::on(mem)).await {
                    Some(answer) => answer,
                    None => {
                        late |= bit;
                        continue;
                    }
                }
            };
            if let core::ops::ControlFlow::Break(r) = decide(answer) {
                return Some(r);
            }
        }
    }
    None
}

/// What a node left out for being late answers, as far as the caller is
/// concerned: timed out.
pub fn late(node: NodeId) -> MemError {
    MemError::new(node, MemErrorKind::TimedOut)
}

/// How one quorum operation is started: the replicas to take the majority
/// from first, the suspects to probe alongside, and the watch that widens
/// it when the first ones are late. Masks have bit `j` for replica `j`.
#[derive(Clone, Copy)]
pub struct Plan<'a> {
    /// Replicas tried before the others (each in index order).
    pub first: u16,
    /// Replicas started at once in addition to the majority.
    pub probe: u16,
    /// Widens the operation when the started replicas are late; `None`:
    /// only on failure.
    pub watch: Option<Watch<'a>>,
}

impl Plan<'_> {
    /// `first` first, no probe, no watch: widening on failure only.
    pub const fn trusting(first: u16) -> Plan<'static> {
        Plan { first, probe: 0, watch: None }
    }
}

/// One client's view of the nodes (SWARM §6): which it suspects, failed or
/// late the last time it used them, and when to probe them again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Bit `n` for node `n < 32`.
    suspects: u32,
    /// Quorum operations until the next probe.
    until_probe: u32,
}

impl NodeView {
    /// Whether `node` failed or was late the last time this client used it.
    pub fn suspects(&self, node: NodeId) -> bool {
        node.0 < 32 && self.suspects & (1 << node.0) != 0
    }

    /// Whether any node is suspected.
    pub fn any(&self) -> bool {
        self.suspects != 0
    }

    /// Remembers how `node` answered: failed (unreachable or timed out),
    /// or not.
    pub fn note(&mut self, node: NodeId, failed: bool) {
        if node.0 < 32 {
            if failed {
                if self.suspects == 0 {
                    self.until_probe = PROBE_EVERY;
                }
                self.suspects |= 1 << node.0;
            } else {
                self.suspects &= !(1 << node.0);
            }
        }
    }

    /// How to start a quorum operation on `n` replicas, replica `j` on
    /// node `node(j)`, watched on `mem`'s clock.
    pub fn plan<'a, M: Memory>(&mut self, mem: &'a M, n: usize, node: impl Fn(usize) -> NodeId) -> Plan<'a> {
        let suspect = crate::substrate::quorum::mask(n, |j| self.suspects(node(j)));
        let mut probe = 0;
        if suspect != 0 {
            self.until_probe = self.until_probe.saturating_sub(1);
            if self.until_probe == 0 {
                self.until_probe = PROBE_EVERY;
                probe = suspect;
            }
        }
        Plan { first: !suspect, probe, watch: Some(Watch::on(mem)) }
    }

    /// Learns from a finished operation whose replica `j` is on `node(j)`:
    /// the replicas it was still waiting for when they became late are
    /// suspected (those that answered were noted as they did).
    pub fn learn(&mut self, tally: &Tally, node: impl Fn(usize) -> NodeId) {
        let mut late = tally.late;
        while late != 0 {
            let j = late.trailing_zeros() as usize;
            late &= late - 1;
            self.note(node(j), true);
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use alloc::vec::Vec;

    use super::*;
    use crate::RemoteAddr;
    use crate::sim::{Sim, SimConfig, SimMemory};
    use crate::substrate::quorum::{join_timely, quorum_first};

    fn node(j: usize) -> NodeId {
        NodeId(j as u16)
    }

    /// One quorum read of word 0 on nodes 0..3 with `view`'s plan: its
    /// tally and how long it took, ns.
    async fn read3(mem: &SimMemory, view: &mut NodeView) -> (Tally, u64) {
        let t0 = mem.now();
        let plan = view.plan(mem, 3, node);
        let mut answered = Vec::new();
        let op = |j: usize| mem.read(RemoteAddr::new(node(j), 0), 8);
        let tally = quorum_first(3, 2, plan, op, |j, r: Result<_, MemError>| answered.push((j, r.is_err()))).await;
        for (j, failed) in answered {
            view.note(node(j), failed);
        }
        view.learn(&tally, node);
        (tally, mem.now() - t0)
    }

    #[test]
    fn a_late_majority_widens_and_the_late_node_is_avoided_until_it_answers() {
        let cfg = SimConfig::default().fixed_latency(1_000);
        let stall = 100 * cfg.timeout_ns;
        let mut sim = Sim::new(cfg);
        sim.stall_node_at(1, 0, stall);
        let mem = sim.client();
        let (first, next, recovered) = sim
            .block_on(async move {
                let mut view = NodeView::default();
                let first = read3(&mem, &mut view).await;
                assert!(view.suspects(node(1)));
                let next = read3(&mem, &mut view).await;
                mem.sleep(stall).await;
                let mut recovered = None;
                for k in 0..2 * PROBE_EVERY {
                    let (t, _) = read3(&mem, &mut view).await;
                    if !view.suspects(node(1)) {
                        recovered = Some((k, t));
                        break;
                    }
                }
                (first, next, recovered)
            })
            .unwrap();
        // Node 0 answers after 1 µs; node 1 is late at 20 µs, node 2 is
        // asked then and answers 1 µs later: no time-out (50 µs) waited.
        assert!(first.0.reached(2));
        assert_eq!((first.0.started, first.0.late), (0b111, 0b010));
        assert_eq!(first.1, MIN_LATE_NS + 1_000);
        // The next starts with 0 and 2: one roundtrip.
        assert_eq!((next.0.started, next.0.late, next.1), (0b101, 0, 1_000));
        // Once it resumed, a probe finds it and it is trusted again.
        let (k, probe) = recovered.expect("the node is probed again");
        assert!(k < PROBE_EVERY, "probed within {PROBE_EVERY} operations, not {k}");
        assert_eq!(probe.started, 0b111);
    }

    #[test]
    fn a_timely_join_leaves_a_late_node_out_once_a_majority_answered() {
        let cfg = SimConfig::default().fixed_latency(1_000);
        let timeout = cfg.timeout_ns;
        let mut sim = Sim::new(cfg);
        sim.stall_node_at(2, 0, 10 * timeout);
        let mem = sim.client();
        let (replies, tally, took) = sim
            .block_on(async move {
                let t0 = mem.now();
                let futs = (0..3).map(|j| mem.read(RemoteAddr::new(node(j), 0), 8)).collect();
                let (r, t) = join_timely(futs, 2, Watch::on(&mem), |j| late(node(j))).await;
                (r, t, mem.now() - t0)
            })
            .unwrap();
        assert_eq!(took, MIN_LATE_NS);
        assert_eq!((replies.ok, replies.failed, tally.late), (2, 1, 0b100));
        assert!(matches!(&replies.results[2], Some(Err(e)) if e.kind == MemErrorKind::TimedOut));
    }

    /// One read, given up when late: a stalled node's after
    /// [`NO_REPLY_LATE_NS`] (not its time-out), a healthy one's never.
    #[test]
    fn one_read_is_given_up_once_late() {
        let cfg = SimConfig::default().fixed_latency(1_000);
        let mut sim = Sim::new(SimConfig { timeout_ns: 10 * NO_REPLY_LATE_NS, ..cfg });
        sim.stall_node_at(1, 0, 100 * NO_REPLY_LATE_NS);
        let mem = sim.client();
        let got = sim
            .block_on(async move {
                let mut out = Vec::new();
                for n in [0, 1] {
                    let t0 = mem.now();
                    let r = or_late(mem.read(RemoteAddr::new(node(n), 0), 8), Watch::on(&mem)).await;
                    out.push((r.map(|r| r.is_ok()), mem.now() - t0));
                }
                out
            })
            .unwrap();
        assert_eq!(got, [(Some(true), 1_000), (None, NO_REPLY_LATE_NS)]);
    }

    #[test]
    fn nothing_is_late_on_a_healthy_cluster() {
        let mut sim = Sim::new(SimConfig { tail_one_in: 0, ..SimConfig::default() });
        let mem = sim.client();
        let view = sim
            .block_on(async move {
                let mut view = NodeView::default();
                for _ in 0..200 {
                    let (t, _) = read3(&mem, &mut view).await;
                    assert_eq!((t.started, t.late), (0b011, 0));
                }
                view
            })
            .unwrap();
        assert!(!view.any());
    }

    #[test]
    fn suspects_are_probed_once_in_a_while() {
        let mut v = NodeView::default();
        let mem = Sim::new(Default::default()).client();
        assert_eq!(v.plan(&mem, 3, node).first & 0b111, 0b111);
        v.note(NodeId(1), true);
        let probes = (0..3 * PROBE_EVERY).filter(|_| v.plan(&mem, 3, node).probe == 0b010).count();
        assert_eq!(probes, 3);
        assert_eq!(v.plan(&mem, 3, node).first & 0b111, 0b101);
        v.note(NodeId(1), false);
        assert!(!v.any());
    }
}
