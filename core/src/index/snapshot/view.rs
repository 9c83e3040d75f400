//! The replicated index's *view*: which replicas take part, and the lease
//! a client holds on it (`notes/fusee-design.md` §1 F9, §7; FUSEE §5.2).
//!
//! A replica that fails leaves every slot it holds unable to decide a
//! round (a backup's CAS never answers) or to be read (a primary). The
//! index then changes view: a *master* (any client that met the failure)
//! excludes the replica, repairs the slots it touched, and moves their
//! primaries to the next replica (design step 9). This module is what
//! clients and master agree on, and the fence that keeps a client that
//! has not seen a new view from acting in it:
//!
//! - **The view word**, one per replica, beside its header
//!   ([`Header::view_addr`]): epoch, excluded replicas, phase. `Stable`
//!   views are served; a `Prepare` view is a change under way. A word only
//!   changes by CAS from what its writer saw; clients read a majority and
//!   follow the newest ([`newest`]).
//! - **The view lease**: a client may post a slot operation (a read or a
//!   CAS) only while `now + D < expiry`, where the expiry is `L` after it
//!   *sent* the reads that found a majority Stable in its view. A master
//!   waits `L + D` after its Prepare reached a majority before it touches
//!   a slot: every operation posted under the old view has landed by then
//!   (every renewal after the Prepare's arrival meets it on some replica
//!   of its majority and does not renew). Reads posted *with* the
//!   renewal, at the instant its reads are sent, count if it renews the
//!   view they were addressed in (the index's `riding`): the Prepare
//!   reached its majority after that instant, so they land before any
//!   slot is touched.
//!
//! Both durations are measured by each side on its own clock, from its own
//! events, so only the clocks' *rates* must agree (drift), not their
//! readings; and `D` must bound how long a posted operation may take to
//! land (the operation time-out). That is the timing assumption (partial
//! synchrony, as for the id leases of [`crate::substrate::lease`]): a
//! client paused between its check and its post for longer than `D`
//! breaks it; RDMA can add fencing by cutting the client's queue pair.

use core::fmt;

use super::header::Header;
use crate::substrate::late::{Watch, late};
use crate::substrate::memory::read_word;
use crate::substrate::quorum::{MAX_REPLICAS, join_timely, majority};
use crate::{MemError, Memory, NodeId};

/// Where a replica's view word is, from its header's start: past the
/// checksummed part, zero when the index is created (the first view).
pub const VIEW_AT: u64 = 384;

/// Whether a view is served or being installed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// Served: clients take leases on it.
    Stable,
    /// Being installed by a master: no client may take a lease.
    Prepare,
}

/// One view, as a view word holds it:
///
/// ```text
/// bit 63..32  epoch
/// bit 31..24  excluded replicas (bit i: replica i)
/// bit 23..16  phase: 0 Stable, 1 Prepare
/// bit 15..8   joiners: excluded replicas a Prepare brings back (0 when Stable)
/// bit 7..0    the master's nonce (which master prepared it: its client id)
/// ```
/// The word 0 is the first view: epoch 0, every replica in, stable.
///
/// A Prepare names its joiners so that a master who supersedes it knows
/// which replicas its repair may have left half caught up: those are left
/// out again ([`super::master`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct View {
    /// Views are numbered; a master prepares the epoch after the newest.
    pub epoch: u32,
    /// Replicas left out, bit `i` for replica `i`.
    pub excluded: u8,
    /// Served or being installed.
    pub phase: Phase,
    /// Of a Prepare: the replicas, excluded before, that this change
    /// brings back (bit `i`: replica `i`; never in `excluded`).
    pub joiners: u8,
    /// The master that prepared it (0 for the first view).
    pub nonce: u8,
}

impl View {
    /// The view of a new index.
    pub const FIRST: View = View { epoch: 0, excluded: 0, phase: Phase::Stable, joiners: 0, nonce: 0 };

    /// The view word.
    pub fn encode(self) -> u64 {
        let phase = match self.phase {
            Phase::Stable => 0u64,
            Phase::Prepare => 1,
        };
        (self.epoch as u64) << 32
            | (self.excluded as u64) << 24
            | phase << 16
            | (self.joiners as u64) << 8
            | self.nonce as u64
    }

    /// The view a word holds, if it can be one.
    pub fn decode(w: u64) -> Option<View> {
        let phase = match (w >> 16) & 0xFF {
            0 => Phase::Stable,
            1 => Phase::Prepare,
            _ => return None,
        };
        let (excluded, joiners) = ((w >> 24) as u8, (w >> 8) as u8);
        let v = View { epoch: (w >> 32) as u32, excluded, phase, joiners, nonce: w as u8 };
        // The first view has no master and excludes nothing; only a
        // Prepare brings replicas back, and never excluded ones.
        let joins = joiners == 0 || (phase == Phase::Prepare && joiners & excluded == 0);
        (joins && (v.epoch > 0 || v == View::FIRST)).then_some(v)
    }

    /// Its place in the order of views: by epoch, and within an epoch the
    /// Stable view after the Prepare that led to it.
    pub fn order(self) -> u64 {
        (self.epoch as u64) << 1 | u64::from(self.phase == Phase::Stable)
    }

    /// Whether replica `i` is left out.
    pub fn excludes(self, i: usize) -> bool {
        i < 8 && self.excluded & (1 << i) != 0
    }
}

/// The newest of `views` (the last in [`View::order`]; between two
/// Prepares of one epoch by different masters, the larger word), if any.
pub fn newest(views: impl IntoIterator<Item = View>) -> Option<View> {
    views.into_iter().max_by_key(|v| (v.order(), v.encode()))
}

/// Why a client has no lease on a view.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ViewError {
    /// Fewer than a majority of the replicas answered.
    NoQuorum {
        /// Replicas that answered.
        answered: usize,
        /// Replicas needed.
        need: usize,
        /// The first failure, if any.
        first: Option<MemError>,
    },
    /// The newest view is being installed.
    Changing(View),
    /// A view word that cannot be one.
    Corrupt {
        /// Its node.
        node: NodeId,
    },
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::NoQuorum { answered, need, .. } => {
                write!(f, "{answered} index replica(s) answered, {need} needed to read the index's view")
            }
            ViewError::Changing(v) => write!(f, "the index is changing to view {} (a replica failed)", v.epoch),
            ViewError::Corrupt { node } => write!(f, "{node}: corrupt index view word"),
        }
    }
}

/// The two durations of the fence, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Timing {
    /// `L`: how long a lease lasts after the reads that took it were sent.
    pub lease_ns: u64,
    /// `D`: the longest a posted operation may take to land (the
    /// operation time-out).
    pub landing_ns: u64,
}

impl Timing {
    /// The durations for operations that time out after `timeout_ns`
    /// (`D`, since an operation still pending may land until then) with a
    /// lease of four times that.
    pub fn for_timeout(timeout_ns: u64) -> Timing {
        Timing { lease_ns: timeout_ns.saturating_mul(4), landing_ns: timeout_ns }
    }
}

/// A client's lease on the index's view.
#[derive(Clone, Copy, Debug)]
pub struct ViewLease {
    view: View,
    /// When it ends, ns on the client's clock (0: none held).
    expiry: u64,
    timing: Timing,
    /// Replicas the leased view excludes that answered the renewal.
    back: u8,
}

impl ViewLease {
    /// No lease yet, on the first view.
    pub fn new(timing: Timing) -> ViewLease {
        ViewLease { view: View::FIRST, expiry: 0, timing, back: 0 }
    }

    /// The view last leased.
    pub fn view(&self) -> View {
        self.view
    }

    /// Replicas that the leased view excludes but that answered its
    /// renewal: candidates to be brought back ([`super::master::settle`]'s
    /// joiners).
    pub fn back(&self) -> u8 {
        self.back
    }

    /// Whether an operation posted at `now_ns` lands before the lease ends.
    pub fn covers(&self, now_ns: u64) -> bool {
        now_ns.saturating_add(self.timing.landing_ns) < self.expiry
    }

    /// Reads every replica's view word (one roundtrip; a majority must
    /// answer), sent at `sent_ns`, and takes a lease on the newest view if
    /// it is Stable. Replicas late once a majority answered are not waited
    /// for; a word that cannot be a view (a replica whose memory was lost)
    /// counts as no answer.
    pub async fn renew<M: Memory>(&mut self, mem: &M, header: &Header, sent_ns: u64) -> Result<View, ViewError> {
        let r = header.replicas.len();
        let futs: heapless::Vec<_, MAX_REPLICAS> = (0..r).map(|i| read_word(mem, header.view_addr(i))).collect();
        let need = majority(r);
        let (replies, _) = join_timely(futs, need, Watch::on(mem), |i| late(header.replicas[i].node)).await;
        let mut views: heapless::Vec<(usize, View), MAX_REPLICAS> = heapless::Vec::new();
        let mut corrupt = None;
        for (i, &w) in replies.oks() {
            match View::decode(w) {
                Some(v) => {
                    let _ = views.push((i, v));
                }
                None => corrupt = corrupt.or(Some(header.replicas[i].node)),
            }
        }
        if views.len() < need {
            if let Some(node) = corrupt {
                return Err(ViewError::Corrupt { node });
            }
            return Err(ViewError::NoQuorum { answered: views.len(), need, first: replies.first_error().copied() });
        }
        let v = newest(views.iter().map(|&(_, v)| v)).ok_or(ViewError::NoQuorum { answered: 0, need, first: None })?;
        if v.phase == Phase::Prepare {
            return Err(ViewError::Changing(v));
        }
        self.view = v;
        self.expiry = sent_ns.saturating_add(self.timing.lease_ns);
        self.back = views.iter().filter(|&&(i, _)| v.excludes(i)).fold(0, |m, &(i, _)| m | 1 << i);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_first_view_is_the_zero_word() {
        assert_eq!(View::FIRST.encode(), 0);
        assert_eq!(View::decode(0), Some(View::FIRST));
        // An epoch-0 word with anything else in it is garbage.
        assert_eq!(View::decode(1), None);
        assert_eq!(View::decode(1 << 16), None);
        assert_eq!(View::decode(3 << 16 | 1 << 32), None);
        // Only a Prepare brings replicas back, and only excluded ones.
        assert_eq!(View::decode(1 << 32 | 0b10 << 8), None, "a Stable view with joiners");
        assert_eq!(View::decode(1 << 32 | 0b10 << 24 | 1 << 16 | 0b10 << 8), None, "a joiner kept out");
        let join = View { epoch: 1, excluded: 0b1, phase: Phase::Prepare, joiners: 0b10, nonce: 4 };
        assert_eq!(View::decode(join.encode()), Some(join));
    }

    #[test]
    fn views_order_by_epoch_then_phase() {
        let v = |epoch, phase, nonce| View { epoch, excluded: 0b10, phase, joiners: 0, nonce };
        let (p1, s1, p2) = (v(1, Phase::Prepare, 7), v(1, Phase::Stable, 7), v(2, Phase::Prepare, 3));
        assert_eq!(newest([s1, p1]), Some(s1));
        assert_eq!(newest([p1, p2, s1, View::FIRST]), Some(p2));
        assert_eq!(newest([v(1, Phase::Prepare, 9), p1]), Some(v(1, Phase::Prepare, 9)), "ties: the larger word");
        assert_eq!(newest([]), None);
        assert!(s1.excludes(1) && !s1.excludes(0) && !s1.excludes(9));
    }

    proptest! {
        #[test]
        fn words_round_trip(epoch in 1u32.., excluded in any::<u8>(), prepare in any::<bool>(), joiners in any::<u8>(), nonce in any::<u8>()) {
            let phase = if prepare { Phase::Prepare } else { Phase::Stable };
            let joiners = if prepare { joiners & !excluded } else { 0 };
            let v = View { epoch, excluded, phase, joiners, nonce };
            prop_assert_eq!(View::decode(v.encode()), Some(v));
        }

        #[test]
        fn decoding_never_panics(w in any::<u64>()) {
            if let Some(v) = View::decode(w) {
                prop_assert_eq!(v.encode(), w);
            }
        }
    }
}
