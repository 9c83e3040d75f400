//! SNAPSHOT's replicated compare-and-set of one slot word (`papers/fusee.txt`
//! §4.3, Algorithms 1-2; `notes/fusee-design.md` §1, `READ` and `RCAS`,
//! design step 5).
//!
//! A [`Slot`] is the same 64-bit word on r replicas: the *primary* (first),
//! which readers read and which holds the committed value, and r - 1
//! *backups*, on which the concurrent writers of a *round* (every write that
//! started from the same `vold`) settle who wins. The decisions are the pure
//! rules of `super::rules`; this module posts the operations and feeds them
//! the replies.
//!
//! ```text
//! READ(slot):  read(P)                                          1 RTT, linearises there
//!
//! RCAS(slot, exp, vnew, tgt):                                   vnew unique (F1)
//!   vold = exp is Hint(w) ? w : read(P)                         RTT 1 (none with a hint)
//!   seen[i] = pipeline(B[i], [tgt.backup_ops(i), CAS(B[i], vold, vnew)])
//!             in parallel, every backup answers                 RTT 2
//!   seen[i] = Seen::from_cas(seen[i], vold, vnew)               (Alg. 1 line 9)
//!   match eval(seen):                                           (Alg. 2)
//!     ReadPrimary -> vchk = read(P), posted after every reply   RTT 3 of R3 (F3)
//!                    eval_with_primary(seen, vold, vnew, vchk)
//!   R1      -> COMMIT                                           RTT 3
//!   R2 | R3 -> CAS(B[i], seen[i], vnew) for seen[i] != vnew     RTT 3 | 4 (F2: expect what was seen)
//!              COMMIT                                           RTT 4 | 5
//!   Lose    -> WAIT
//!   Finish  -> OUTCOME(vchk)                                    (F7)
//!   Fail    -> Unavailable
//! COMMIT:  pipeline(P, [tgt.commit_ops(vnew, vold), CAS(P, vold, vnew)]) -> Won { previous: vold }
//!          (with no backups, r = 1, the CAS alone decides: it may answer Lost)
//! WAIT:    read(P) at once, then after a pause, until it leaves vold or WAIT_READS reads:
//!          p != vold -> OUTCOME(p);  else HELP                  (F5)
//! HELP:    bs = read every B[i]; p = read(P) after them; p != vold -> OUTCOME(p)
//!          w = winner(bs); tgt.fetch(w) onto P; CAS(B[i], bs[i], w) for bs[i] != w;
//!          pipeline(P, [tgt.commit_ops(w, vold), CAS(P, vold, w)]); OUTCOME(P)
//! OUTCOME(p): p == vnew -> Won;
//!             won no backup, or read P == vold after every reply -> Lost { current: p };
//!             else tgt.marked(vnew) ? Won : Lost                (F7, +1 RTT)
//! ```
//!
//! Roundtrips (FUSEE §4.3, "Performance"): Rule 1 takes 3 with the read of
//! `vold` (2 with a hint), Rule 2 4, Rule 3 5; with r = 1 (no backup
//! phase) a write takes 2, or 1 with a hint. A loser decides in as many as
//! the winner before its commit, then reads the primary until the winner
//! commits.
//!
//! # Linearisation
//!
//! A read at its read of the primary; a winner at its primary CAS (or at the
//! helper's that committed it). A loser's [`Outcome::Lost`] is a failed CAS:
//! it is linearised just after the winner's commit, which lies inside its
//! interval (it read or was handed `vold` before, and returns only once the
//! primary left `vold`). A blind writer that read `vold` itself
//! ([`Exp::Fresh`]) may instead count a loss as a write overwritten at
//! once (FUSEE: "return success", linearised just before the winner's
//! commit); one that started from a hint ([`Exp::Hint`]) never may (F6): its
//! round may have been over before it was invoked. This module answers
//! `Lost { current }` in both cases; the caller knows which it passed.
//!
//! # Who won (F7)
//!
//! A writer that decided to win (Rules 1-3) is the round's winner: its
//! primary CAS returns `vold` (it committed), `vnew` (a helper committed it
//! meanwhile), or a later value (a helper committed it and a later round
//! committed over it, before its own CAS landed): [`Outcome::Won`] in every
//! case, since every participant commits the same winner (`rules::winner`)
//! and, without a master, nothing else ever changes the primary.
//!
//! A writer that did not decide to win may still be the winner, committed
//! by a helper: its backup CASes can land after its round was committed
//! and see a later round's values (a stall, or a tail latency longer than
//! the helpers' wait), and a list that mixes rounds can make it decide
//! `Lose` or `Finish` (the F3 interleaving, from the winner's side). Its
//! decision is exact once it has read the primary holding `vold` *after*
//! every backup reply (then every reply is of its round, the argument of
//! F3); otherwise, if the primary holds neither `vold` nor `vnew` and it
//! won a backup, only a durable mark of its commit can tell: [`Target`]s
//! write one in the commit pipeline (of their own value, and of the
//! winner's when they help), and [`Target::marked`] reads it. A target
//! without marks (the trait's defaults) gets [`SlotError::Unknown`] then.
//!
//! # Not done yet
//!
//! - **Failures of nodes.** A backup or primary operation that fails (the
//!   node failed or timed out) gives [`SlotError::Unavailable`]: the round
//!   may be left undecided (a backup CAS may have been applied) and only the
//!   in-band master (design steps 8-9: view, fence F9, Alg. 3) can repair
//!   it. No view lease is checked before posting.

use super::rules::{self, Decision, Eval, Seen};
use crate::substrate::memory::{pause, read_word};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_all};
use crate::{MAX_PIPELINE, MemError, MemErrorKind, Memory, Op, OpOutput, RemoteAddr};

/// How many times a loser reads the primary waiting for the winner's commit
/// before it helps (F5's bound `Wb`): the first read at once, the others a
/// backup roundtrip apart (as long as its backup phase took), so about
/// twice this many roundtrips. The winner needs at most 3 after its backup
/// phase (Rule 3: the check, the catch-ups, the commit). Helping early is
/// safe (idempotent), only wasteful.
pub const WAIT_READS: u32 = 8;

/// The most operations a [`Target`] adds to one pipeline: the slot's CAS
/// takes the last place.
pub const TARGET_OPS: usize = MAX_PIPELINE - 1;

/// Operations a [`Target`] puts in front of a slot CAS.
pub type TargetOps<'a> = heapless::Vec<Op<'a>, TARGET_OPS>;

/// One logical slot: the address of its word on each replica, the primary
/// first. Each replica's word may be at a different offset; replicas are
/// expected on distinct nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    words: heapless::Vec<RemoteAddr, MAX_REPLICAS>,
}

impl Slot {
    /// The slot whose word is at `words[0]` on the primary and `words[i]` on
    /// backup `i - 1`; `None` without a primary or with more than
    /// [`MAX_REPLICAS`] replicas.
    pub fn new(words: &[RemoteAddr]) -> Option<Slot> {
        if words.is_empty() {
            return None;
        }
        Some(Slot { words: heapless::Vec::from_slice(words).ok()? })
    }

    /// The primary's word.
    pub fn primary(&self) -> RemoteAddr {
        self.words[0]
    }

    /// The backups' words, backup `i` at `[i]`.
    pub fn backups(&self) -> &[RemoteAddr] {
        &self.words[1..]
    }
}

/// What a write expects the slot to hold (its round's `vold`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exp {
    /// Whatever the primary holds: read it in the first roundtrip (FUSEE's
    /// blind writes, design step 15; the index always has a word at hand).
    #[cfg_attr(not(test), allow(dead_code))]
    Fresh,
    /// This word, without reading it: a cache's last word (F6: a loss then
    /// never means success), or one the caller read from the primary itself
    /// earlier in the same operation. It must be a word once read from the
    /// primary (a committed one): a word that only ever reached backups
    /// would start a round that cannot commit.
    Hint(u64),
}

/// How a write ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// `vnew` was committed over `previous` (the round's `vold`).
    Won {
        /// What the slot held before.
        previous: u64,
    },
    /// Another value was committed: the slot did not hold `vold`, or another
    /// writer of the round won. `current` is what the primary held when
    /// this writer last looked (a committed value).
    Lost {
        /// The primary's word.
        current: u64,
    },
}

/// Why a write or read has no answer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SlotError {
    /// A replica's operation failed or timed out. The write's round may be
    /// left undecided or half caught up until recovery (the master, a later
    /// step) repairs the slot; the write may or may not take effect.
    Unavailable(MemError),
    /// The writer may not post any more ([`Target::fence`]: the view it
    /// works in changed or its lease on it lapsed). Its round is frozen as
    /// it stands; whoever changes the view settles it.
    Fenced,
    /// The primary moved past this writer's round before it looked, and its
    /// target keeps no commit mark ([`Target::marked`] is `None`): its
    /// value may or may not have been committed (see the module docs, F7).
    Unknown {
        /// The primary's word when it looked.
        current: u64,
    },
}

impl From<MemError> for SlotError {
    fn from(e: MemError) -> Self {
        SlotError::Unavailable(e)
    }
}

/// How many writes took each path, for tests and campaigns to check
/// coverage.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SlotPaths {
    /// Rule 1: won every backup.
    pub r1: u64,
    /// Rule 2: won a strict majority of the backups.
    pub r2: u64,
    /// Rule 3: the least value, the primary still at `vold` after the replies.
    pub r3: u64,
    /// Lost from the backups, or Rule 3's least value was another.
    pub lose: u64,
    /// Rule 3's check found the round committed.
    pub finish: u64,
    /// Losers that waited out [`WAIT_READS`] and helped.
    pub help: u64,
    /// Outcomes that only the target's commit mark could tell (F7).
    pub marks: u64,
}

impl SlotPaths {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &SlotPaths) {
        self.r1 += o.r1;
        self.r2 += o.r2;
        self.r3 += o.r3;
        self.lose += o.lose;
        self.finish += o.finish;
        self.help += o.help;
        self.marks += o.marks;
    }

    fn note(&mut self, d: Decision) {
        match d {
            Decision::R1 => self.r1 += 1,
            Decision::R2 => self.r2 += 1,
            Decision::R3 => self.r3 += 1,
            Decision::Lose => self.lose += 1,
            Decision::Finish => self.finish += 1,
            Decision::Fail => {}
        }
    }
}

/// What a slot word points to, as far as the slot's pipelines carry it: a
/// writer's copies to each backup (ahead of its CAS there) and what a
/// commit writes on the primary (ahead of the primary CAS). Every method
/// has a default that does nothing.
pub trait Target {
    /// Operations on backup `backup`'s node ahead of this writer's CAS
    /// there (e.g. writing the key block its word points to into that
    /// replica's arena). Posted once, with the round's first CAS, on every
    /// backup, won or not.
    fn backup_ops<'a>(&'a self, backup: usize, out: &mut TargetOps<'a>) {
        let _ = (backup, out);
    }

    /// Operations on the primary's node ahead of the CAS that commits
    /// `word` over `vold`: `word` is this writer's own value, or, when it
    /// helps, the round's winner (of which it knows only the word). They
    /// should mark `word` committed (F7), durably and where
    /// [`Target::marked`] finds it; they ride the primary's ordered
    /// pipeline, so a mark is visible to anyone who saw the primary change.
    fn commit_ops<'a>(&'a self, word: u64, vold: u64, out: &mut TargetOps<'a>) {
        let _ = (word, vold, out);
    }

    /// Whether a commit of `word` was marked (by [`Target::commit_ops`] of
    /// any participant), read after the primary was seen past the round;
    /// `None` if this target keeps no marks.
    fn marked<M: Memory>(&self, mem: &M, word: u64) -> impl Future<Output = Result<Option<bool>, MemError>> {
        let _ = (mem, word);
        core::future::ready(Ok(None))
    }

    /// Whether this writer may still post an operation on the slot: checked
    /// before each one. The replicated index answers from the lease on the
    /// view its slot belongs to ([`super::view`]), renewing it if needed,
    /// and [`SlotError::Fenced`] once the view changed.
    fn fence<M: Memory>(&self, mem: &M) -> impl Future<Output = Result<(), SlotError>> {
        let _ = mem;
        core::future::ready(Ok(()))
    }

    /// Before a helper commits `word`, another writer's winning value:
    /// puts on the primary whatever `word` points to, which its writer
    /// copied only to backups (its own commit would have written it with
    /// the CAS). `holders` are the backups seen holding `word`; at least
    /// one of them got it from its writer's own backup pipeline, copies
    /// first (catch-ups move words, not copies). Done before the catch-ups
    /// and the commit are posted, so the copies are there when the word is.
    fn fetch<M: Memory>(
        &self,
        mem: &M,
        word: u64,
        holders: &[RemoteAddr],
    ) -> impl Future<Output = Result<(), MemError>> {
        let _ = (mem, word, holders);
        core::future::ready(Ok(()))
    }
}

/// A bare word: nothing rides the pipelines and nothing is marked.
#[cfg(test)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct NoTarget;

#[cfg(test)]
impl Target for NoTarget {}

/// READ: the primary's word (linearises at that read).
pub async fn read<M: Memory>(mem: &M, slot: &Slot) -> Result<u64, SlotError> {
    Ok(read_word(mem, slot.primary()).await?)
}

/// RCAS: replaces the slot's committed word by `vnew` if it holds `exp`'s
/// word and this writer wins its round (see the module docs). `vnew` must
/// never have been proposed for this slot before (F1). Counts the paths it
/// took in `paths`.
pub async fn rcas<M: Memory, T: Target>(
    mem: &M,
    slot: &Slot,
    exp: Exp,
    vnew: u64,
    target: &T,
    paths: &mut SlotPaths,
) -> Result<Outcome, SlotError> {
    let vold = match exp {
        Exp::Fresh => read(mem, slot).await?,
        Exp::Hint(w) => w,
    };
    debug_assert_ne!(vold, vnew, "F1: a proposed word is new");
    target.fence(mem).await?;
    let backups = backup_phase(mem, slot, vold, vnew, target).await;
    let mut round = Round { mem, slot, target, vold, vnew, backups, pure: false };
    round.decide(paths).await
}

/// What one writer's backup CASes returned.
pub(crate) struct Backups {
    /// One per backup, in order (F2: what its catch-up CAS expects).
    pub(crate) seen: heapless::Vec<Seen, MAX_REPLICAS>,
    /// The first failure, if any backup failed.
    pub(crate) error: Option<MemError>,
    /// How long the phase took, ns, if the memory keeps time: the pause of
    /// a loser's wait.
    pub(crate) took_ns: Option<u64>,
}

/// A writer's backup phase (RTT 2): on every backup in parallel, its
/// target's copies then `CAS(vold -> vnew)`, until every backup answered.
/// A test can run it alone to leave a writer stopped after it.
pub(crate) async fn backup_phase<M: Memory, T: Target>(
    mem: &M,
    slot: &Slot,
    vold: u64,
    vnew: u64,
    target: &T,
) -> Backups {
    let start = mem.now_ns();
    let cas = slot
        .backups()
        .iter()
        .enumerate()
        .map(|(i, &b)| async move {
            let mut extra = TargetOps::new();
            target.backup_ops(i, &mut extra);
            let mut ops: heapless::Vec<Op<'_>, MAX_PIPELINE> = extra.into_iter().collect();
            // Cannot fail: the target adds at most `TARGET_OPS`.
            let _ = ops.push(Op::Cas { offset: b.offset, expected: vold, new: vnew });
            let out = mem.pipeline(b.node, &ops).await?;
            last_cas(b, out.last())
        })
        .collect();
    let replies = join_all(cas).await;
    let took_ns = start.zip(mem.now_ns()).map(|(s, e)| e.saturating_sub(s));
    let mut error = None;
    let seen = replies
        .results
        .into_iter()
        .map(|r| match r {
            Some(Ok(prev)) => Seen::from_cas(prev, vold, vnew),
            Some(Err(e)) => {
                error.get_or_insert(e);
                Seen::Failed
            }
            None => Seen::Failed,
        })
        .collect();
    Backups { seen, error, took_ns }
}

/// The previous value a pipeline's last operation (a CAS on `at`) returned.
fn last_cas<B>(at: RemoteAddr, out: Option<&OpOutput<B>>) -> Result<u64, MemError> {
    out.and_then(OpOutput::cas).ok_or(MemError::new(at.node, MemErrorKind::Backend { code: 0 }))
}

/// One writer's round after its backup phase.
struct Round<'a, M, T> {
    mem: &'a M,
    slot: &'a Slot,
    target: &'a T,
    vold: u64,
    vnew: u64,
    backups: Backups,
    /// This writer read the primary holding `vold` after every backup
    /// reply: every reply is of this round, so its decision is exact.
    pure: bool,
}

impl<M: Memory, T: Target> Round<'_, M, T> {
    /// EVAL and what follows it.
    async fn decide(&mut self, paths: &mut SlotPaths) -> Result<Outcome, SlotError> {
        let seen = &self.backups.seen;
        let (decision, vchk) = match rules::eval(seen, self.vnew) {
            Eval::Decided(d) => (d, None),
            Eval::ReadPrimary => {
                // F3: posted now, after every backup answered.
                self.target.fence(self.mem).await?;
                let vchk = read_word(self.mem, self.slot.primary()).await?;
                self.pure = vchk == self.vold;
                (rules::eval_with_primary(seen, self.vold, self.vnew, Some(vchk)), Some(vchk))
            }
        };
        paths.note(decision);
        match decision {
            Decision::R1 | Decision::R2 | Decision::R3 => {
                let expected: heapless::Vec<u64, MAX_REPLICAS> =
                    seen.iter().map(|s| s.value().unwrap_or(self.vnew)).collect();
                self.catch_up(&expected, self.vnew).await?;
                let prev = self.commit(self.vnew).await?;
                if self.slot.backups().is_empty() && prev != self.vold && prev != self.vnew {
                    // No backups: the primary's CAS alone arbitrates.
                    return Ok(Outcome::Lost { current: prev });
                }
                // `vold`: committed; otherwise a helper committed this
                // writer's value (and maybe a later round followed).
                Ok(Outcome::Won { previous: self.vold })
            }
            Decision::Finish => self.outcome(vchk.unwrap_or(self.vold), paths).await,
            Decision::Lose => self.wait(paths).await,
            Decision::Fail => {
                let e = self.backups.error.unwrap_or(MemError::new(self.slot.primary().node, MemErrorKind::TimedOut));
                Err(SlotError::Unavailable(e))
            }
        }
    }

    /// Moves every backup whose `expected` word is not `w` to `w`, each CAS
    /// expecting that word (F2), in parallel (one roundtrip, none if every
    /// backup holds `w`). A CAS that finds neither means the round was
    /// committed and a later one began: nothing to do there.
    async fn catch_up(&self, expected: &[u64], w: u64) -> Result<(), SlotError> {
        let (mem, slot) = (self.mem, self.slot);
        let cas: heapless::Vec<_, MAX_REPLICAS> =
            expected.iter().zip(slot.backups()).filter(|&(&e, _)| e != w).map(|(&e, &b)| mem.cas(b, e, w)).collect();
        if cas.is_empty() {
            return Ok(());
        }
        self.target.fence(mem).await?;
        match join_all(cas).await.first_error() {
            Some(&e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// COMMIT of `word` (this writer's or, helping, the winner's): the
    /// target's commit operations, then `CAS(P, vold, word)`, in one
    /// pipeline on the primary. Returns what the primary held.
    async fn commit(&self, word: u64) -> Result<u64, SlotError> {
        self.target.fence(self.mem).await?;
        let p = self.slot.primary();
        let mut extra = TargetOps::new();
        self.target.commit_ops(word, self.vold, &mut extra);
        let mut ops: heapless::Vec<Op<'_>, MAX_PIPELINE> = extra.into_iter().collect();
        // Cannot fail: the target adds at most `TARGET_OPS`.
        let _ = ops.push(Op::Cas { offset: p.offset, expected: self.vold, new: word });
        let out = self.mem.pipeline(p.node, &ops).await?;
        Ok(last_cas(p, out.last())?)
    }

    /// WAIT: reads the primary until it leaves `vold` (the first read at
    /// once, the next ones a backup roundtrip apart), then HELP.
    async fn wait(&mut self, paths: &mut SlotPaths) -> Result<Outcome, SlotError> {
        let pause_ns = self.backups.took_ns.unwrap_or(0);
        for i in 0..WAIT_READS {
            if i > 0 {
                pause(self.mem, pause_ns).await;
            }
            self.target.fence(self.mem).await?;
            let p = read_word(self.mem, self.slot.primary()).await?;
            if p != self.vold {
                return self.outcome(p, paths).await;
            }
            self.pure = true;
        }
        paths.help += 1;
        self.help(paths).await
    }

    /// HELP (F5): completes the round with the backups' winner, as its
    /// winner would. Only a participant helps: every backup answered its
    /// CAS, so none holds `vold` any more.
    async fn help(&mut self, paths: &mut SlotPaths) -> Result<Outcome, SlotError> {
        let (mem, slot) = (self.mem, self.slot);
        self.target.fence(mem).await?;
        let reads: heapless::Vec<_, MAX_REPLICAS> = slot.backups().iter().map(|&b| read_word(mem, b)).collect();
        let replies = join_all(reads).await;
        if let Some(&e) = replies.first_error() {
            return Err(e.into());
        }
        let bs: heapless::Vec<u64, MAX_REPLICAS> = replies.oks().map(|(_, &v)| v).collect();
        // After the backups: still `vold`, so no commit came before those
        // reads and they are all of this round (F3's argument).
        self.target.fence(mem).await?;
        let p = read_word(mem, slot.primary()).await?;
        if p != self.vold {
            return self.outcome(p, paths).await;
        }
        self.pure = true;
        // Only a writer that lost (so with backups) waits and helps.
        let Some(w) = rules::winner(&bs) else { return Ok(Outcome::Lost { current: p }) };
        // A helper that completes the round with its own value instead of
        // the backups' winner: two writers of one round can both win.
        let w = if mutant!("help-own-value") { self.vnew } else { w };
        if w != self.vnew {
            let holders: heapless::Vec<RemoteAddr, MAX_REPLICAS> =
                bs.iter().zip(slot.backups()).filter(|&(&b, _)| b == w).map(|(_, &at)| at).collect();
            self.target.fence(mem).await?;
            self.target.fetch(mem, w, &holders).await?;
        }
        self.catch_up(&bs, w).await?;
        let prev = self.commit(w).await?;
        self.outcome(if prev == self.vold { w } else { prev }, paths).await
    }

    /// OUTCOME (F7) of this writer, the primary found holding `p` (not
    /// `vold`).
    async fn outcome(&self, p: u64, paths: &mut SlotPaths) -> Result<Outcome, SlotError> {
        if p == self.vnew {
            return Ok(Outcome::Won { previous: self.vold });
        }
        let won_a_backup = self.backups.seen.contains(&Seen::Holds(self.vnew));
        if self.pure || !won_a_backup {
            // An exact decision, or one that held no backup: never the winner.
            return Ok(Outcome::Lost { current: p });
        }
        paths.marks += 1;
        self.target.fence(self.mem).await?;
        match self.target.marked(self.mem, self.vnew).await? {
            Some(true) => Ok(Outcome::Won { previous: self.vold }),
            Some(false) => Ok(Outcome::Lost { current: p }),
            None => Err(SlotError::Unknown { current: p }),
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use alloc::format;
    use alloc::rc::Rc;
    use alloc::vec;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use proptest::prelude::*;
    use swarm_lincheck::{self as lincheck, Model, Operation};

    use super::*;
    use crate::NodeId;
    use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
    use crate::substrate::rtt::Counted;

    const NODE_SIZE: u64 = 1 << 20;
    /// The slot word on replica `i` is at `SLOT_AT + 8 i` (offsets differ per replica).
    const SLOT_AT: u64 = 4096;
    /// The commit marks, on the primary's node: one word per proposed value.
    const MARKS_AT: u64 = 64 << 10;
    /// Each writer's copy of its value, on every backup (a key block's stand-in).
    const COPIES_AT: u64 = 256 << 10;
    /// A mark holds `vold | MARKED`.
    const MARKED: u64 = 1 << 63;
    /// What every slot holds first (zeroed memory).
    const V0: u64 = 0;
    /// Roundtrip of the fixed-latency tests.
    const RTT: u64 = 1_000;

    /// A unique proposed value: writer `w` (1..16), its `seq`-th proposal
    /// (< 256), and `salt` (1..) in the high bits to vary Rule 3's order.
    fn value(w: u64, seq: u64, salt: u64) -> u64 {
        assert!((1..16).contains(&w) && seq < 256 && salt > 0);
        (salt << 32) | (w << 8) | seq
    }

    /// Where `word`'s mark or copy goes in a table of one word per value.
    fn index(word: u64) -> u64 {
        8 * (word & 0xFFF)
    }

    fn new_sim(seed: u64, r: usize) -> Sim {
        Sim::new(SimConfig { seed, nodes: r, node_size: NODE_SIZE, ..SimConfig::default() })
    }

    fn fixed_sim(r: usize) -> Sim {
        Sim::new(SimConfig { nodes: r, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(RTT))
    }

    fn slot(r: usize) -> Slot {
        let words: Vec<RemoteAddr> =
            (0..r).map(|i| RemoteAddr::new(NodeId(i as u16), SLOT_AT + 8 * i as u64)).collect();
        Slot::new(&words).unwrap()
    }

    fn peek(sim: &Sim, node: usize, offset: u64) -> u64 {
        u64::from_le_bytes(sim.peek(node, offset, 8).unwrap().try_into().unwrap())
    }

    /// Every replica's word.
    fn replicas(sim: &Sim, r: usize) -> Vec<u64> {
        (0..r).map(|i| peek(sim, i, SLOT_AT + 8 * i as u64)).collect()
    }

    /// A writer's target: its value's copy on each backup, and commit marks
    /// on the primary (node 0) for whatever word it commits.
    struct Marks {
        copy: [u8; 8],
    }

    impl Marks {
        fn of(vnew: u64) -> Marks {
            Marks { copy: vnew.to_le_bytes() }
        }
    }

    impl Target for Marks {
        fn backup_ops<'a>(&'a self, _backup: usize, out: &mut TargetOps<'a>) {
            let own = u64::from_le_bytes(self.copy);
            out.push(Op::Write { offset: COPIES_AT + index(own), data: &self.copy }).unwrap();
        }

        fn commit_ops<'a>(&'a self, word: u64, vold: u64, out: &mut TargetOps<'a>) {
            out.push(Op::Cas { offset: MARKS_AT + index(word), expected: 0, new: vold | MARKED }).unwrap();
        }

        async fn marked<M: Memory>(&self, mem: &M, word: u64) -> Result<Option<bool>, MemError> {
            let mark = read_word(mem, RemoteAddr::new(NodeId(0), MARKS_AT + index(word))).await?;
            Ok(Some(mark != 0))
        }
    }

    fn mark(sim: &Sim, word: u64) -> u64 {
        peek(sim, 0, MARKS_AT + index(word))
    }

    fn copy(sim: &Sim, node: usize, word: u64) -> u64 {
        peek(sim, node, COPIES_AT + index(word))
    }

    // -----------------------------------------------------------------------
    // One writer.

    #[test]
    fn slot_needs_a_primary() {
        assert_eq!(Slot::new(&[]), None);
        let many = [RemoteAddr::new(NodeId(0), 0); MAX_REPLICAS + 1];
        assert_eq!(Slot::new(&many), None);
        let s = slot(3);
        assert_eq!(s.primary(), RemoteAddr::new(NodeId(0), SLOT_AT));
        assert_eq!(s.backups(), &[RemoteAddr::new(NodeId(1), SLOT_AT + 8), RemoteAddr::new(NodeId(2), SLOT_AT + 16)]);
    }

    /// Rule 1 alone: 3 roundtrips with the read of `vold`, 2 with a hint; a
    /// read 1; a stale hint loses every backup and finds the primary moved
    /// (2, and no change).
    #[test]
    fn a_lone_writer_wins_rule_1_in_3_roundtrips() {
        for r in [1, 2, 3, 5] {
            let mut sim = fixed_sim(r);
            let mem = sim.client();
            let s = slot(r);
            let (rtts, paths) = sim
                .block_on(async move {
                    let c = Counted::new(&mem);
                    let mut paths = SlotPaths::default();
                    let (a, b, x) = (value(1, 0, 1), value(1, 1, 1), value(1, 2, 1));
                    let mut rtts = Vec::new();
                    assert_eq!(
                        rcas(&c, &s, Exp::Fresh, a, &Marks::of(a), &mut paths).await,
                        Ok(Outcome::Won { previous: V0 })
                    );
                    rtts.push(c.roundtrips());
                    c.reset();
                    assert_eq!(
                        rcas(&c, &s, Exp::Hint(a), b, &NoTarget, &mut paths).await,
                        Ok(Outcome::Won { previous: a })
                    );
                    rtts.push(c.roundtrips());
                    c.reset();
                    assert_eq!(read(&c, &s).await, Ok(b));
                    rtts.push(c.roundtrips());
                    c.reset();
                    // A stale hint: every backup CAS fails (Lose), the primary has moved.
                    let got = rcas(&c, &s, Exp::Hint(a), x, &NoTarget, &mut paths).await;
                    assert_eq!(got, Ok(Outcome::Lost { current: b }));
                    rtts.push(c.roundtrips());
                    (rtts, paths)
                })
                .unwrap();
            // With no backups (r = 1) the primary's CAS is the whole round.
            let want = if r == 1 { vec![2, 1, 1, 1] } else { vec![3, 2, 1, 2] };
            assert_eq!(rtts, want, "r = {r}");
            let lost = u64::from(r > 1);
            assert_eq!(paths, SlotPaths { r1: 2 + 1 - lost, lose: lost, ..SlotPaths::default() }, "r = {r}");
            let (a, b) = (value(1, 0, 1), value(1, 1, 1));
            assert_eq!(replicas(&sim, r), vec![b; r]);
            assert_eq!(mark(&sim, a), V0 | MARKED, "the commit pipeline marked a over V0");
            for node in 1..r {
                assert_eq!(copy(&sim, node, a), a, "a's copy rode its backup CAS");
            }
        }
    }

    /// Sets backup `i`'s word to `v` as a writer stopped after its CAS
    /// there would have (with its copy first).
    async fn stopped_cas(mem: &SimMemory, s: &Slot, i: usize, v: u64) {
        let b = s.backups()[i];
        mem.write(RemoteAddr::new(b.node, COPIES_AT + index(v)), &v.to_le_bytes()).await.unwrap();
        assert_eq!(mem.cas(b, V0, v).await, Ok(V0));
    }

    /// Rule 2 takes 4 roundtrips, Rule 3 5: another writer (stopped) took
    /// one backup first, which the winner catches up from the value it saw (F2).
    #[test]
    fn rule_2_takes_4_roundtrips_and_rule_3_5() {
        for (r, want, rule) in [(5, 4, "r2"), (3, 5, "r3"), (4, 5, "r3")] {
            let mut sim = fixed_sim(r);
            let mem = sim.client();
            let s = slot(r);
            let (w, x) = (value(1, 0, 1), value(2, 0, 2));
            let (got, rtts, paths) = sim
                .block_on(async move {
                    // x took the last backup (for r = 4, x's 1 of 3 leaves no majority).
                    stopped_cas(&mem, &s, s.backups().len() - 1, x).await;
                    if r == 4 {
                        stopped_cas(&mem, &s, 1, value(3, 0, 3)).await;
                    }
                    let c = Counted::new(&mem);
                    let mut paths = SlotPaths::default();
                    let got = rcas(&c, &s, Exp::Fresh, w, &Marks::of(w), &mut paths).await;
                    (got, c.roundtrips(), paths)
                })
                .unwrap();
            assert_eq!(got, Ok(Outcome::Won { previous: V0 }), "r = {r}");
            assert_eq!(rtts, want, "r = {r}");
            let one = SlotPaths { r2: u64::from(rule == "r2"), r3: u64::from(rule == "r3"), ..SlotPaths::default() };
            assert_eq!(paths, one, "r = {r}");
            assert_eq!(replicas(&sim, r), vec![w; r], "r = {r}: caught up and committed");
        }
    }

    /// A failed backup or primary gives `Unavailable` (no master yet).
    #[test]
    fn a_failed_replica_makes_the_slot_unavailable() {
        for (node, mode) in [(2, CrashMode::FailFast), (0, CrashMode::FailFast), (1, CrashMode::Hang)] {
            let mut sim = fixed_sim(3);
            sim.crash_node_at(node, 0, mode);
            let mem = sim.client();
            let s = slot(3);
            let got = sim
                .block_on(async move {
                    rcas(&mem, &s, Exp::Hint(V0), value(1, 0, 1), &NoTarget, &mut SlotPaths::default()).await
                })
                .unwrap();
            let Err(SlotError::Unavailable(e)) = got else { panic!("node {node}: {got:?}") };
            assert_eq!(e.node, NodeId(node as u16));
        }
    }

    // -----------------------------------------------------------------------
    // Helping.

    /// A writer that stopped after its backup phase, having won every
    /// backup (Rule 1): a later writer loses every CAS, waits out its bound,
    /// helps, and commits the stopped writer's value (marked), losing to it.
    #[test]
    fn a_loser_commits_a_stopped_winner() {
        for r in [2, 3, 5] {
            let mut sim = fixed_sim(r);
            let (ma, mb) = (sim.client(), sim.client());
            let s = slot(r);
            let (a, b) = (value(1, 0, 1), value(2, 0, 2));
            let (got, paths) = sim
                .block_on(async move {
                    let phase = backup_phase(&ma, &s, V0, a, &Marks::of(a)).await;
                    assert!(phase.error.is_none());
                    assert_eq!(rules::eval(&phase.seen, a), Eval::Decided(Decision::R1));
                    // a stops here. b starts.
                    let mut paths = SlotPaths::default();
                    let got = rcas(&mb, &s, Exp::Fresh, b, &Marks::of(b), &mut paths).await;
                    // a comes back: its mark says it won.
                    assert_eq!(Marks::of(a).marked(&ma, a).await, Ok(Some(true)));
                    (got, paths)
                })
                .unwrap();
            assert_eq!(got, Ok(Outcome::Lost { current: a }), "r = {r}");
            assert_eq!(paths, SlotPaths { lose: 1, help: 1, ..SlotPaths::default() }, "r = {r}");
            assert_eq!(replicas(&sim, r), vec![a; r], "r = {r}");
            assert_eq!(mark(&sim, a), V0 | MARKED);
            assert_eq!(mark(&sim, b), 0);
        }
    }

    /// A loser whose value is in its list but who read the primary at
    /// `vold` after its replies decided exactly (Rule 3's check here): it
    /// needs no mark to know it lost, even with a target that keeps none.
    #[test]
    fn an_exact_loser_needs_no_mark() {
        let mut sim = fixed_sim(3);
        let mem = sim.client();
        let s = slot(3);
        let (x, l) = (value(1, 0, 1), value(2, 0, 2));
        let (got, paths) = sim
            .block_on(async move {
                // x (stopped) took backup 1 first; l takes backup 0: [l, x], x least.
                stopped_cas(&mem, &s, 1, x).await;
                let mut paths = SlotPaths::default();
                (rcas(&mem, &s, Exp::Fresh, l, &NoTarget, &mut paths).await, paths)
            })
            .unwrap();
        assert_eq!(got, Ok(Outcome::Lost { current: x }));
        assert_eq!(paths, SlotPaths { lose: 1, help: 1, ..SlotPaths::default() });
        assert_eq!(replicas(&sim, 3), vec![x; 3]);
    }

    /// A winner whose primary CAS lands after a helper committed it and a
    /// later round committed over it still won (no master: nothing else
    /// moves the primary from `vold`).
    #[test]
    fn a_winner_overtaken_after_its_decision_won() {
        let mut sim = fixed_sim(3);
        let (mw, admin) = (sim.client(), sim.client());
        let s = slot(3);
        let (w, c) = (value(1, 0, 1), value(2, 0, 2));
        let (got, paths) = sim
            .block_on(async move {
                let target = Marks::of(w);
                let backups = backup_phase(&mw, &s, V0, w, &target).await;
                // Before w goes on, a helper commits it and a later round (c) follows.
                for b in s.backups() {
                    assert_eq!(admin.cas(*b, w, c).await, Ok(w));
                }
                assert_eq!(admin.cas(s.primary(), V0, w).await, Ok(V0));
                assert_eq!(admin.cas(s.primary(), w, c).await, Ok(w));
                let mut round = Round { mem: &mw, slot: &s, target: &target, vold: V0, vnew: w, backups, pure: false };
                let mut paths = SlotPaths::default();
                (round.decide(&mut paths).await, paths)
            })
            .unwrap();
        assert_eq!(got, Ok(Outcome::Won { previous: V0 }));
        assert_eq!(paths, SlotPaths { r1: 1, ..SlotPaths::default() });
        assert_eq!(replicas(&sim, 3), vec![c; 3]);
    }

    /// A helper whose round was committed, and a later one begun, between
    /// its wait and its backup reads must not complete anything: it reads
    /// the primary after the backups, finds it moved, and leaves the later
    /// round's backups alone (`winner` of a half-done later round would
    /// move its backup back).
    #[test]
    fn a_late_helper_leaves_a_later_round_alone() {
        let mut sim = fixed_sim(3);
        let (mw, ml, admin) = (sim.client(), sim.client(), sim.client());
        let s = slot(3);
        // y > w: winner([y, w]) would be w, moving backup 0 back from y.
        let (w, l, y) = (value(1, 0, 1), value(2, 0, 2), value(3, 0, 3));
        let (got, b0) = sim
            .block_on(async move {
                // w wins every backup and stops; l loses both.
                backup_phase(&mw, &s, V0, w, &NoTarget).await;
                let backups = backup_phase(&ml, &s, V0, l, &NoTarget).await;
                assert_eq!(rules::eval(&backups.seen, l), Eval::Decided(Decision::Lose));
                // Someone else helps w to its commit; y's round starts on backup 0.
                assert_eq!(admin.cas(s.primary(), V0, w).await, Ok(V0));
                assert_eq!(admin.cas(s.backups()[0], w, y).await, Ok(w));
                let mut round = Round { mem: &ml, slot: &s, target: &NoTarget, vold: V0, vnew: l, backups, pure: true };
                let got = round.help(&mut SlotPaths::default()).await;
                (got, read_word(&ml, s.backups()[0]).await.unwrap())
            })
            .unwrap();
        assert_eq!(got, Ok(Outcome::Lost { current: w }));
        assert_eq!(b0, y, "the later round's backup is untouched");
    }

    /// Writers stopped after CASing only some backups (every subset, from
    /// one or two stopped writers), then two live writers: the round
    /// completes with one value, everyone agrees on it, every replica
    /// holds it, and it is the backups' winner.
    #[test]
    fn stopped_writers_leave_one_value() {
        let mut paths = SlotPaths::default();
        for r in [3usize, 4, 5] {
            let n = r - 1;
            // Backup i's first CAS: 0 none, 1 stopped writer x, 2 stopped writer y.
            for pattern in 0..3u32.pow(n as u32) {
                let firsts: Vec<u32> = (0..n).map(|i| pattern / 3u32.pow(i as u32) % 3).collect();
                for salts in [[1, 2, 3, 4], [4, 3, 2, 1], [2, 4, 1, 3]] {
                    let seed = u64::from(pattern) * 7 + salts[0];
                    let got = stopped_round(seed, r, &firsts, salts);
                    paths.add(&got);
                }
            }
        }
        assert!(paths.help > 0 && paths.lose > 0 && paths.r2 > 0 && paths.r3 > 0 && paths.r1 > 0, "{paths:?}");
    }

    fn stopped_round(seed: u64, r: usize, firsts: &[u32], salts: [u64; 4]) -> SlotPaths {
        let mut sim = new_sim(seed, r);
        let s = slot(r);
        let (x, y) = (value(1, 0, salts[0]), value(2, 0, salts[1]));
        let live = [value(3, 0, salts[2]), value(4, 0, salts[3])];
        let admin = sim.client();
        let (s2, firsts2) = (s.clone(), firsts.to_vec());
        sim.block_on(async move {
            for (i, &f) in firsts2.iter().enumerate() {
                if f > 0 {
                    stopped_cas(&admin, &s2, i, if f == 1 { x } else { y }).await;
                }
            }
        })
        .unwrap();
        let results = Rc::new(RefCell::new(Vec::new()));
        for v in live {
            let m = sim.client();
            let (s, results) = (s.clone(), results.clone());
            sim.spawn(&m.clone(), async move {
                m.sleep(m.random(0, 2_000)).await;
                let mut paths = SlotPaths::default();
                // A hint of V0: one round, even for a writer that starts after the commit.
                let got = rcas(&m, &s, Exp::Hint(V0), v, &Marks::of(v), &mut paths).await;
                results.borrow_mut().push((v, got, paths));
            });
        }
        sim.run().unwrap();
        let results = results.borrow();
        let ctx = format!("r {r}, firsts {firsts:?}, salts {salts:?}, seed {seed}: {results:?}");
        let committed = peek(&sim, 0, SLOT_AT);
        assert_eq!(replicas(&sim, r), vec![committed; r], "{ctx}");
        assert!([x, y, live[0], live[1]].contains(&committed), "{ctx}");
        let mut total = SlotPaths::default();
        let mut won = 0;
        for &(v, got, ref p) in results.iter() {
            total.add(p);
            if v == committed {
                assert_eq!(got, Ok(Outcome::Won { previous: V0 }), "{ctx}");
                won += 1;
            } else {
                match got {
                    Ok(Outcome::Lost { current }) => assert_eq!(current, committed, "{ctx}"),
                    Ok(Outcome::Won { previous }) => panic!("{ctx}: {v} won over {previous}"),
                    Err(e) => panic!("{ctx}: {e:?}"),
                }
            }
        }
        // A stopped writer's value is committed only by a helper.
        assert_eq!(won, usize::from(live.contains(&committed)), "{ctx}");
        if !live.contains(&committed) {
            assert!(total.help > 0, "{ctx}");
        }
        assert_eq!(mark(&sim, committed), V0 | MARKED, "{ctx}");
        total
    }

    /// The F7 mark: writer a wins backup 1 and its CAS on backup 2 is held
    /// by a stall, while (as a helper and a later round would) its value is
    /// committed and then overwritten. Its late reply mixes rounds: `[a, b]`,
    /// and the check finds the primary at c: only the mark tells it won. A
    /// target without marks cannot tell.
    #[test]
    fn a_writer_overtaken_by_its_helper_learns_from_its_mark() {
        for marks in [true, false] {
            let mut sim = fixed_sim(3);
            let s = slot(3);
            let (a, b, c) = (value(1, 0, 1), value(2, 0, 2), value(3, 0, 3));
            let (admin, ma) = (sim.client(), sim.client());
            let s2 = s.clone();
            sim.block_on(async move { stopped_cas(&admin, &s2, 1, b).await }).unwrap();
            let start = sim.now();
            sim.stall_node_at(2, start, 20 * RTT);
            let result = Rc::new(RefCell::new(None));
            let (s2, out) = (s.clone(), result.clone());
            sim.spawn(&ma.clone(), async move {
                let mut paths = SlotPaths::default();
                let got = if marks {
                    rcas(&ma, &s2, Exp::Hint(V0), a, &Marks::of(a), &mut paths).await
                } else {
                    rcas(&ma, &s2, Exp::Hint(V0), a, &NoTarget, &mut paths).await
                };
                *out.borrow_mut() = Some((got, paths));
            });
            let admin = sim.client();
            sim.block_on(async move {
                admin.sleep(5 * RTT).await;
                // A helper commits a (the least of [a, b]), then a later round commits c.
                let p = s.primary();
                let mark = Op::Cas { offset: MARKS_AT + index(a), expected: 0, new: V0 | MARKED };
                let out = admin.pipeline(p.node, &[mark, Op::Cas { offset: p.offset, expected: V0, new: a }]).await;
                assert_eq!(out.unwrap()[1], OpOutput::Cas(V0));
                assert_eq!(admin.cas(p, a, c).await, Ok(a));
            })
            .unwrap();
            sim.run().unwrap();
            let (got, paths) = result.borrow_mut().take().unwrap();
            assert_eq!(paths.finish, 1);
            if marks {
                assert_eq!(got, Ok(Outcome::Won { previous: V0 }));
                assert_eq!(paths.marks, 1);
            } else {
                assert_eq!(got, Err(SlotError::Unknown { current: c }));
            }
        }
    }

    // -----------------------------------------------------------------------
    // Concurrent writers.

    /// `writers` writers of unique values, each starting within `spread`
    /// ns, from the same `vold` (a hint of V0, or each reading it).
    fn concurrent_round(seed: u64, r: usize, writers: u64, hint: bool) -> SlotPaths {
        let mut sim = new_sim(seed, r);
        let s = slot(r);
        let results = Rc::new(RefCell::new(Vec::new()));
        for w in 1..=writers {
            let m = sim.client();
            let (s, results) = (s.clone(), results.clone());
            sim.spawn(&m.clone(), async move {
                m.sleep(m.random(0, 500)).await;
                let v = value(w, 0, m.random(1, 0xFFFF));
                let exp = if hint { Exp::Hint(V0) } else { Exp::Fresh };
                let mut paths = SlotPaths::default();
                let got = rcas(&m, &s, exp, v, &Marks::of(v), &mut paths).await;
                results.borrow_mut().push((v, got, paths));
            });
        }
        sim.run().unwrap();
        let results = results.borrow();
        let ctx = format!("r {r}, {writers} writers, hint {hint}, seed {seed}: {results:?}");
        // The committed values form a chain from V0 (a writer that read after
        // the first commit runs a second round, alone).
        let mut chain = vec![V0];
        while let Some(&(v, _, _)) =
            results.iter().find(|(_, got, _)| *got == Ok(Outcome::Won { previous: *chain.last().unwrap() }))
        {
            chain.push(v);
        }
        let won = results.iter().filter(|(_, got, _)| matches!(got, Ok(Outcome::Won { .. }))).count();
        assert!(chain.len() >= 2 && won == chain.len() - 1, "{ctx}: one winner per round, chain {chain:?}");
        if hint {
            assert_eq!(chain.len(), 2, "{ctx}: one round");
        }
        let last = *chain.last().unwrap();
        assert_eq!(replicas(&sim, r), vec![last; r], "{ctx}");
        let mut total = SlotPaths::default();
        for &(v, got, ref p) in results.iter() {
            total.add(p);
            match got {
                Ok(Outcome::Won { .. }) => {
                    assert!(chain.contains(&v), "{ctx}");
                    assert_ne!(mark(&sim, v), 0, "{ctx}");
                    for node in 1..r {
                        assert_eq!(copy(&sim, node, v), v, "{ctx}: the winner's copy is on every backup");
                    }
                }
                Ok(Outcome::Lost { current }) => {
                    assert!(chain[1..].contains(&current), "{ctx}");
                    assert_eq!(mark(&sim, v), 0, "{ctx}: a loser's value is never committed");
                    if hint {
                        assert_eq!(current, last, "{ctx}");
                    }
                }
                Err(e) => panic!("{ctx}: {e:?}"),
            }
        }
        total
    }

    #[test]
    fn concurrent_writers_of_one_round_agree() {
        let mut all = SlotPaths::default();
        for r in [3, 5] {
            for writers in [2, 3] {
                let mut paths = SlotPaths::default();
                for seed in 0..300 {
                    paths.add(&concurrent_round(seed, r, writers, seed % 2 == 0));
                }
                std::println!("r {r}, {writers} writers: {paths:?}");
                assert!(paths.r1 > 0 && paths.r3 > 0 && paths.lose > 0, "r {r}, {writers} writers: {paths:?}");
                if r == 5 {
                    assert!(paths.r2 > 0, "r {r}, {writers} writers: {paths:?}");
                }
                all.add(&paths);
            }
        }
        std::println!("all: {all:?}");
    }

    // -----------------------------------------------------------------------
    // Histories.

    /// A CAS register, for the checker: the inputs are written after the
    /// fact, from what each write answered (a fresh write's `vold` is only
    /// known then).
    struct CasRegister;

    #[derive(Clone, Copy, Debug)]
    enum CasIn {
        /// A write from `exp` (`None`: from whatever the slot holds, a
        /// fresh write that never returned).
        Cas {
            exp: Option<u64>,
            new: u64,
        },
        /// A fresh write that lost: it changed nothing.
        Lost,
        Read,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum CasOut {
        Won(u64),
        Lost(u64),
        Read(u64),
    }

    impl Model for CasRegister {
        type State = u64;
        type Input = CasIn;
        type Output = CasOut;
        type Key = ();

        fn init(&self) -> u64 {
            V0
        }

        fn step(&self, &state: &u64, input: &CasIn) -> (u64, CasOut) {
            match *input {
                CasIn::Cas { exp, new } if exp.is_none_or(|e| e == state) => (new, CasOut::Won(state)),
                CasIn::Cas { .. } | CasIn::Lost => (state, CasOut::Lost(state)),
                CasIn::Read => (state, CasOut::Read(state)),
            }
        }

        fn key(&self, _: &CasIn) {}

        fn is_read_only(&self, input: &CasIn) -> bool {
            matches!(input, CasIn::Lost | CasIn::Read)
        }
    }

    type Ops = Rc<RefCell<Vec<Operation<CasIn, CasOut>>>>;

    /// Paths taken, and how many writes learnt that they won from their mark.
    type Taken = Rc<RefCell<(SlotPaths, u64)>>;

    /// Writer `w`: `wins` successful writes, each retried from the current
    /// word it lost to (a hint) with a new value until it wins; the first
    /// try of each reads `vold` itself. Records every try.
    async fn retrying_writer(m: SimMemory, s: Slot, w: u64, wins: u32, ops: Ops, taken: Taken) {
        let mut seq = 0;
        for _ in 0..wins {
            let mut exp = Exp::Fresh;
            loop {
                m.sleep(m.random(0, 2_000)).await;
                let v = value(w, seq, m.random(1, 0xFFFF));
                seq += 1;
                let call = m.now();
                let mut p = SlotPaths::default();
                let got = rcas(&m, &s, exp, v, &Marks::of(v), &mut p).await;
                let mut t = taken.borrow_mut();
                t.0.add(&p);
                t.1 += u64::from(p.marks > 0 && matches!(got, Ok(Outcome::Won { .. })));
                drop(t);
                let (input, output) = match (exp, got) {
                    (_, Ok(Outcome::Won { previous })) => {
                        (CasIn::Cas { exp: Some(previous), new: v }, CasOut::Won(previous))
                    }
                    (Exp::Hint(h), Ok(Outcome::Lost { current })) => {
                        (CasIn::Cas { exp: Some(h), new: v }, CasOut::Lost(current))
                    }
                    (Exp::Fresh, Ok(Outcome::Lost { current })) => (CasIn::Lost, CasOut::Lost(current)),
                    (_, Err(e)) => panic!("writer {w}: {e:?}"),
                };
                ops.borrow_mut().push(Operation::completed(w as u32, call, m.now(), input, output));
                match got {
                    Ok(Outcome::Won { .. }) => break,
                    Ok(Outcome::Lost { current }) => exp = Exp::Hint(current),
                    Err(_) => unreachable!(),
                }
            }
        }
    }

    /// What goes wrong in a [`chain`].
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Fault {
        None,
        /// A fourth writer crashes at a random time.
        Crash,
        /// Writer 1 is 100 times slower for a while: its CASes land far
        /// apart, some after its round was helped to its commit.
        Slow,
    }

    /// Writers retrying until they win, a reader, and `fault`; the history
    /// must be a CAS register's.
    fn chain(seed: u64, r: usize, writers: u64, wins: u32, fault: Fault) -> (SlotPaths, u64) {
        let mut sim = new_sim(seed, r);
        let s = slot(r);
        let ops: Ops = Rc::default();
        let paths: Taken = Rc::default();
        for w in 1..=writers {
            let m = sim.client();
            if w == 1 && fault == Fault::Slow {
                let at = sim.random(0, 20_000);
                sim.slow_client_at(&m, at, 100);
                sim.slow_client_at(&m, at + 200_000, 1);
            }
            sim.spawn(&m.clone(), retrying_writer(m, s.clone(), w, wins, ops.clone(), paths.clone()));
        }
        let reader = sim.client();
        let (s2, ops2) = (s.clone(), ops.clone());
        sim.spawn(&reader.clone(), async move {
            for _ in 0..wins * 3 {
                reader.sleep(reader.random(0, 6_000)).await;
                let call = reader.now();
                let v = read(&reader, &s2).await.unwrap();
                ops2.borrow_mut().push(Operation::completed(99, call, reader.now(), CasIn::Read, CasOut::Read(v)));
            }
        });
        // The crashing writer's one write: pending unless it returned.
        let crashed_op = Rc::new(RefCell::new(None));
        if fault == Fault::Crash {
            let m = sim.client();
            let at = sim.random(0, 30_000);
            sim.crash_client_at(&m, at);
            let (s, out, paths) = (s.clone(), crashed_op.clone(), paths.clone());
            sim.spawn(&m.clone(), async move {
                m.sleep(m.random(0, 20_000)).await;
                let v = value(15, 0, m.random(1, 0xFFFF));
                *out.borrow_mut() = Some(Operation::pending(15, m.now(), CasIn::Cas { exp: None, new: v }));
                let mut p = SlotPaths::default();
                let got = rcas(&m, &s, Exp::Fresh, v, &Marks::of(v), &mut p).await;
                paths.borrow_mut().0.add(&p);
                let Some(op) = out.borrow_mut().as_mut().map(|op| op.call) else { return };
                let output = match got.unwrap() {
                    Outcome::Won { previous } => CasOut::Won(previous),
                    Outcome::Lost { current } => CasOut::Lost(current),
                };
                let input = match output {
                    CasOut::Won(previous) => CasIn::Cas { exp: Some(previous), new: v },
                    _ => CasIn::Lost,
                };
                *out.borrow_mut() = Some(Operation::completed(15, op, m.now(), input, output));
            });
        }
        sim.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let mut history = ops.borrow().clone();
        history.extend(crashed_op.borrow_mut().take());
        // A final read, after everything.
        let last = peek(&sim, 0, SLOT_AT);
        let end = sim.now() + 1;
        history.push(Operation::completed(100, end, end, CasIn::Read, CasOut::Read(last)));
        let ctx = format!("r {r}, seed {seed}, {fault:?}");
        assert_eq!(replicas(&sim, r), vec![last; r], "{ctx}");
        let wins_seen =
            history.iter().filter(|op| matches!(op.response.as_ref().map(|r| r.output), Some(CasOut::Won(_)))).count();
        assert!(wins_seen >= (writers as usize) * wins as usize, "{ctx}");
        let verdict = lincheck::check(&CasRegister, &history);
        assert!(verdict.is_linearizable(), "{ctx}: not linearizable: {verdict:?}");
        *paths.borrow()
    }

    /// Runs [`chain`] on `seeds`, r = 3 and 5 alternately or `r`; sums what they took.
    fn chains(seeds: core::ops::Range<u64>, r: Option<usize>, wins: u32, fault: Fault) -> (SlotPaths, u64) {
        let mut total = (SlotPaths::default(), 0);
        for seed in seeds {
            let (p, by_mark) = chain(seed, r.unwrap_or(3 + 2 * (seed as usize % 2)), 3, wins, fault);
            total.0.add(&p);
            total.1 += by_mark;
        }
        std::println!("{fault:?}, r {r:?}: {total:?}");
        total
    }

    /// 3 writers × 7 wins (21 rounds) with retries, a reader, on r = 3 and
    /// r = 5: the history is a CAS register's, the replicas end equal.
    #[test]
    fn retried_writes_form_a_cas_register() {
        for r in [3, 5] {
            let (paths, _) = chains(0..40, Some(r), 7, Fault::None);
            assert!(paths.r1 > 0 && paths.r3 > 0 && paths.lose > 0, "r {r}: {paths:?}");
            if r == 5 {
                assert!(paths.r2 > 0, "r {r}: {paths:?}");
            }
        }
    }

    /// As above, with a fourth writer crashing at a random time: the others
    /// help its round when they must, nobody is stuck, and its write took
    /// effect or not, at most once.
    #[test]
    fn a_crashed_writer_is_helped() {
        let (paths, _) = chains(0..100, None, 3, Fault::Crash);
        assert!(paths.help > 0, "{paths:?}");
    }

    /// As above, with writer 1 slow for a while: its rounds are helped, and
    /// its CASes that land after the help see later rounds, so that it
    /// decides from lists that mix rounds and learns from its mark that it won.
    #[test]
    fn a_slow_writer_is_helped_and_learns_it_won() {
        let (paths, won_by_mark) = chains(0..200, None, 3, Fault::Slow);
        assert!(paths.help > 0 && won_by_mark > 0, "{paths:?}, won by mark {won_by_mark}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Stopped writers' CASes on any backups (r = 2..6), then two live
        /// writers on random delays: one value committed, agreed, on every
        /// replica (as `stopped_writers_leave_one_value`, on random states).
        #[test]
        fn any_stopped_state_completes(
            r in 2usize..=6,
            firsts in prop::collection::vec(0u32..4, 5),
            salts in prop::collection::vec(1u64..0xFFFF, 4),
            seed in any::<u64>(),
        ) {
            let firsts: Vec<u32> = firsts[..r - 1].iter().map(|&f| f.min(2)).collect();
            let mut salts: Vec<u64> = salts;
            salts.sort_unstable();
            salts.dedup();
            prop_assume!(salts.len() == 4);
            let shuffled = [salts[(seed % 4) as usize], salts[((seed + 1) % 4) as usize], salts[((seed + 2) % 4) as usize], salts[((seed + 3) % 4) as usize]];
            stopped_round(seed, r, &firsts, shuffled);
        }
    }
}
