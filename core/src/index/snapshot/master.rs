//! The in-band master: a view change that excludes failed replicas and
//! repairs the slots they leave behind (FUSEE §5.2, Algorithm 3, rewritten
//! without a separate master process; `notes/fusee-design.md` §7,
//! design step 9).
//!
//! Any client whose operation met a failed replica runs [`settle`]:
//!
//! ```text
//! SETTLE(suspects):
//!   V = newest view word on a majority
//!   V Stable, excluding suspects already   -> lease it, done
//!   V Stable                               -> propose Prepare(V.epoch+1, V.excluded | suspects)
//!   V Prepare, every Prepare of V's epoch
//!     read first seen Lm + D ago           -> propose Prepare(V.epoch+1, V.excluded | suspects)
//!   V Prepare, else                        -> wait, SETTLE again
//!   CAS every replica's word from what was read to the proposal; a majority won -> MASTER
//! MASTER:
//!   wait L + D from the claim          (every post under an older view has landed: the fence)
//!   for every slot: c = CHOOSE(words of the base view's replicas that answer); CAS each of them to c;
//!                   copy c's block to each joiner, then CAS its word to c
//!   leave out of the Stable view every replica a read of the scan or a CAS of the repair missed
//!   CAS the view words from the Prepare to its Stable view (a majority), lease it
//! ```
//!
//! **Masters never overlap.** A master posts nothing later than `Lm - D`
//! after its claim was sent; a Prepare is superseded only by a client that
//! first saw its word `Lm + D` before, and the claim that supersedes it
//! replaces only words it read. Two claims of one epoch (a split) may both
//! show, on different replicas: each is timed from when it was first seen,
//! and the newest epoch is superseded only once every claim of it that the
//! read shows is that old. (A master whose word the read does not show
//! holds a majority this claim cannot win without replacing its word
//! somewhere, which it would then have read.) So every superseded master's
//! last post has landed before the new one's first.
//!
//! **What a slot gets** (`CHOOSE`). The replicas of a served view hold, for
//! each slot, the last committed word `w` or proposals of the open round,
//! whose parent (the round's `vold`, in their block's record) is `w`: a
//! winner catches every backup up before it commits. So: if every answering
//! replica holds the same word, that word (`w`, or a proposal that every
//! backup took, which its writer then finds on the primary); otherwise `w`,
//! the word that is another's parent or else their common parent. Either is
//! a value the slot may hold next. The choice depends only on the words, and
//! a master that runs after a superseded one reads the words that one left
//! (some moved to its choice), so it chooses the same or `w` (a writer whose
//! proposal it was runs its round again). Masters never mark a choice
//! committed: writers learn their outcome from the primary, or from the
//! marks later rounds leave on the backups (`super::block`).
//!
//! **Every replica of a view was repaired by its master** (or caught up as a
//! joiner). A replica that missed a read of the scan or a repair CAS (a
//! stalled node, one that failed during the fence) may hold, for some
//! slot, a word older than the last committed one: a round it missed
//! while it did not answer, which the others settled. Left in the view,
//! it would break CHOOSE's premise at the next change, where its word,
//! the parent of the committed one, reads as committed and the newer one
//! as a proposal: the next master would undo a committed change (found by
//! the key-value campaigns: an acknowledged FUSEE insert lost, 5 replicas,
//! one node failed and another stalled during the fence). So the Stable
//! view leaves it out too, and it comes back as a joiner, caught up.
//!
//! A view keeps a majority of the replicas, or no change is made.
//!
//! **Bringing a replica back.** A client whose lease renewal hears from a
//! replica the view excludes (a node that came back with its memory: a
//! healed partition, a restart over persistent memory) checks that the
//! replica still holds the index's header, then runs SETTLE with it as a
//! *joiner*: the Prepare names it (so that no one leases a view while it is
//! caught up), and after the same fence the master catches every slot of
//! the joiner up to the word the base view's replicas settle on, block
//! record and mark first, then the word (`catch_up`), before the Stable
//! view includes it. The fence is what makes a copy enough: no operation of
//! the old view is in flight, and none of the new one starts before the
//! joiner is whole. A joiner that fails meanwhile is left out again, and a
//! master that supersedes a Prepare leaves its joiners out (they may be
//! half caught up), so a stale joiner's words never reach `CHOOSE`. The
//! joiner's records beside the index (`super::records`) are not copied:
//! every record is on a majority of the other replicas, and a reader that
//! finds the joiner's copy missing reads another. An operation that failed
//! on a replica in an older view than the newest does not suspect it (the
//! newer view may have brought it back): it runs again first.

use super::block::{self, Part};
use super::header::Header;
use super::view::{Phase, View, ViewLease, newest};
use crate::index::IndexError;
use crate::index::layout::{BUCKET_BYTES, GROUP_BYTES, SlotWord, block_len};
use crate::substrate::late::{Watch, late};
use crate::substrate::memory::{read_word, wait_until, word_at};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_all, join_timely, majority};
use crate::{MemError, MemErrorKind, Memory, NodeId, Op};

/// Tries of one [`settle`] before it gives up.
const MAX_TRIES: u32 = 256;
/// A master's time, in view leases: from its claim to its last post.
const MASTER_LEASES: u64 = 8;
/// Bytes of bucket array a master reads at once from each replica.
const SCAN_BYTES: u64 = 16 << 10;

/// What view changes a client took part in, for tests and campaigns.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct MasterPaths {
    /// Views this client installed as master.
    pub views: u64,
    /// Prepares it superseded (their master had run out of time).
    pub superseded: u64,
    /// Slots it repaired.
    pub repaired: u64,
    /// Times it waited for another master.
    pub waits: u64,
    /// Rounds it ran again after a view change found them where they began.
    pub reruns: u64,
    /// Replicas it brought back into the view as master.
    pub rejoined: u64,
    /// Replicas it left out of the view it installed because the repair
    /// missed them (they did not answer in time, though up).
    pub left_unrepaired: u64,
    /// Slots it caught up on replicas brought back.
    pub caught_up: u64,
    /// Reads of the repair scan that a replica did not answer.
    pub unanswered: u64,
    /// Lapsed view leases it renewed in an operation's first roundtrip.
    pub rides: u64,
    /// Of those, the ones whose reads it dropped: the view had changed.
    pub rides_dropped: u64,
}

impl MasterPaths {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &MasterPaths) {
        self.views += o.views;
        self.superseded += o.superseded;
        self.repaired += o.repaired;
        self.waits += o.waits;
        self.reruns += o.reruns;
        self.rejoined += o.rejoined;
        self.left_unrepaired += o.left_unrepaired;
        self.caught_up += o.caught_up;
        self.unanswered += o.unanswered;
        self.rides += o.rides;
        self.rides_dropped += o.rides_dropped;
    }
}

/// The client's clock, ns (0 where the memory keeps none: then leases
/// never lapse and masters never wait, see [`super::view`]).
pub(crate) fn now_ns<M: Memory>(mem: &M) -> u64 {
    mem.now_ns().unwrap_or(0)
}

fn unavailable(node: NodeId) -> IndexError {
    IndexError::Unavailable(MemError::new(node, MemErrorKind::TimedOut))
}

/// The view words of every replica (`None`: no answer), once a majority
/// answered.
async fn read_views<M: Memory>(
    mem: &M,
    header: &Header,
) -> Result<heapless::Vec<Option<View>, MAX_REPLICAS>, IndexError> {
    let r = header.replicas.len();
    let futs: heapless::Vec<_, MAX_REPLICAS> = (0..r).map(|i| read_word(mem, header.view_addr(i))).collect();
    let need = majority(r);
    let (replies, _) = join_timely(futs, need, Watch::on(mem), |i| late(header.replicas[i].node)).await;
    if replies.ok < need {
        return Err(IndexError::Unavailable(
            replies.first_error().copied().unwrap_or(MemError::new(header.replicas[0].node, MemErrorKind::TimedOut)),
        ));
    }
    // A word that cannot be a view (a replica whose memory was lost) is
    // no answer: its replica is left out, or kept out.
    let mut out = heapless::Vec::new();
    let mut corrupt = None;
    for (i, r) in replies.results.iter().enumerate() {
        let v = match r {
            Some(Ok(w)) => View::decode(*w),
            _ => None,
        };
        if v.is_none() && matches!(r, Some(Ok(_))) {
            corrupt = corrupt.or(Some(header.replicas[i].node));
        }
        let _ = out.push(v);
    }
    match corrupt {
        Some(node) if out.iter().flatten().count() < need => Err(IndexError::Corrupt { node, what: "bad view word" }),
        _ => Ok(out),
    }
}

/// The view change a client asks [`settle`] for.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Change {
    /// Replicas to leave out (bit `i`: replica `i`): an operation failed on
    /// them.
    pub suspects: u8,
    /// The epoch of the view in which they failed. A newer view that keeps
    /// them in was made after the failure (it may have brought them back):
    /// the operation runs again in it before they are suspected anew.
    pub seen: u32,
    /// Replicas to bring back: excluded, and answering again (see
    /// [`ViewLease::back`]).
    pub joiners: u8,
}

/// SETTLE (see the module's documentation): brings the index to a Stable
/// view that makes `change`, as its master or waiting for another, and
/// takes a lease on it. `nonce` names this client (its id). The view
/// leased; a joiner that fails while it is brought back is left out again.
pub async fn settle<M: Memory>(
    mem: &M,
    header: &Header,
    lease: &mut ViewLease,
    change: Change,
    nonce: u8,
    paths: &mut MasterPaths,
) -> Result<View, IndexError> {
    let Change { suspects, seen, joiners } = change;
    let t = header.timing;
    let master_ns = t.lease_ns.saturating_mul(MASTER_LEASES);
    let r = header.replicas.len();
    // Claims seen (their view word), and when each was first seen.
    let mut claims: heapless::Vec<(u64, u64), { 2 * MAX_REPLICAS }> = heapless::Vec::new();
    let mut own: Option<u64> = None;
    let mut joiners = joiners & !suspects;
    let mut rng = (nonce as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..MAX_TRIES {
        let now = now_ns(mem);
        let words = read_views(mem, header).await?;
        let Some(v) = newest(words.iter().flatten().copied()) else { return Err(unavailable(header.replicas[0].node)) };
        // A suspect whose exclusion would leave no majority is kept: it
        // may only be late, and the operation that suspected it tries
        // again. So is one that a view newer than its failure keeps.
        let left = r - ((v.excluded | suspects).count_ones() as usize).min(r);
        let suspects = if left < majority(r) || v.epoch > seen { suspects & v.excluded } else { suspects };
        let base = match v.phase {
            Phase::Stable if v.excluded & suspects == suspects && v.excluded & joiners == 0 => {
                match lease.renew(mem, header, now).await {
                    Ok(v) => return Ok(v),
                    Err(_) => continue,
                }
            }
            Phase::Stable => v,
            // This client's own claim, whose run failed: nothing of it is
            // still to be posted.
            Phase::Prepare if own == Some(v.encode()) => {
                paths.superseded += 1;
                v
            }
            Phase::Prepare => {
                // Every claim of the newest epoch that this read shows: a
                // split claim leaves several, and the one a read picks as
                // newest changes with the replicas that answer it, so each
                // is timed from when it was first seen.
                // (The mutant `claim-timer-resets` times the newest alone,
                // from when it became the newest: a split claim whose
                // replicas answer by turns is then waited on for ever.)
                if mutant!("claim-timer-resets") {
                    claims.retain(|s| s.0 == v.encode());
                }
                let mut ripe = true;
                for w in words.iter().flatten().filter(|w| {
                    w.phase == Phase::Prepare
                        && w.epoch == v.epoch
                        && (w.encode() == v.encode() || !mutant!("claim-timer-resets"))
                }) {
                    let word = w.encode();
                    let since = match claims.iter().find(|s| s.0 == word) {
                        Some(&(_, since)) => since,
                        None => {
                            if claims.is_full() {
                                claims.remove(0);
                            }
                            let _ = claims.push((word, now));
                            now
                        }
                    };
                    ripe &= now.saturating_sub(since) >= master_ns + t.landing_ns;
                }
                if !ripe {
                    paths.waits += 1;
                    wait_until(mem, now + t.lease_ns / 4).await;
                    continue;
                }
                paths.superseded += 1;
                v
            }
        };
        // A superseded Prepare's joiners may be half caught up: they are
        // no part of the base the repair reads, and stay out.
        let base = View { excluded: base.excluded | base.joiners, joiners: 0, ..base };
        let answered = words.iter().enumerate().filter(|(_, w)| w.is_some()).fold(0u8, |m, (i, _)| m | 1 << i);
        let joining = joiners & base.excluded & !suspects & answered;
        let excluded = (base.excluded | suspects) & !joining;
        if r - (excluded.count_ones() as usize).min(r) < majority(r) {
            return Err(unavailable(header.replicas[0].node));
        }
        let prepare = View { epoch: base.epoch + 1, excluded, phase: Phase::Prepare, joiners: joining, nonce };
        let sent = now_ns(mem);
        let claims: heapless::Vec<_, MAX_REPLICAS> = words
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.map(|w| (i, w)))
            .map(|(i, w)| async move {
                let prev = mem.cas(header.view_addr(i), w.encode(), prepare.encode()).await?;
                Ok::<bool, MemError>(prev == w.encode())
            })
            .collect();
        let replies = join_all(claims).await;
        let won = replies.oks().filter(|&(_, &won)| won).count();
        if won >= majority(r) {
            let view = match run(mem, header, base, prepare, sent, sent + master_ns - t.landing_ns, paths).await {
                Ok(view) => view,
                // Too few replicas answered in time (a late one, a second
                // failure, a joiner that failed again): claim the next view
                // from this one, without the joiners.
                Err(IndexError::Unavailable(_)) => {
                    own = Some(prepare.encode());
                    joiners = 0;
                    continue;
                }
                Err(e) => return Err(e),
            };
            paths.views += 1;
            paths.rejoined += u64::from(prepare.joiners.count_ones());
            return match lease.renew(mem, header, now_ns(mem)).await {
                Ok(v) => Ok(v),
                Err(_) => Ok(view),
            };
        }
        // Split with another claimer: try again after a random pause.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let now = now_ns(mem);
        wait_until(mem, now + rng % (t.landing_ns.max(1) * 4)).await;
    }
    Err(IndexError::Contended)
}

/// MASTER: the fence, the repair of every slot over the replicas that
/// `base` serves, and the Stable view of `prepare`. Posts nothing at or
/// after `deadline` (less the landing bound).
async fn run<M: Memory>(
    mem: &M,
    header: &Header,
    base: View,
    prepare: View,
    sent: u64,
    deadline: u64,
    paths: &mut MasterPaths,
) -> Result<View, IndexError> {
    let t = header.timing;
    // The fence, with a margin for the clocks' rates.
    // (The mutant: a master that repairs at once, while a writer that has
    // not seen the new view yet still posts to the old one.)
    if !mutant!("no-fence") {
        wait_until(mem, sent + t.lease_ns + t.lease_ns / 64 + t.landing_ns).await;
    }
    let in_time = |mem: &M| {
        if now_ns(mem) + t.landing_ns < deadline || mem.now_ns().is_none() {
            Ok(())
        } else {
            Err(unavailable(header.replicas[0].node))
        }
    };
    let r = header.replicas.len();
    let considered: heapless::Vec<usize, MAX_REPLICAS> = (0..r).filter(|&i| !base.excludes(i)).collect();
    let joiners: heapless::Vec<usize, MAX_REPLICAS> = (0..r).filter(|&i| prepare.joiners & (1 << i) != 0).collect();
    let bucket_bytes = header.groups * GROUP_BYTES;
    let mut at = 0;
    // A replica that did not answer one read of the scan is not asked
    // again: it would only make every later read wait for it (a stalled
    // node, a time-out each), and an answer missing is what the scan
    // already copes with on any read. So the replicas this change leaves
    // out are not asked at all: one that failed an operation a moment ago
    // would most likely cost the scan a time-out.
    let leaving = u32::from(prepare.excluded & !base.excluded);
    let mut gone = leaving;
    // Replicas whose repair CAS failed.
    let mut unrepaired = 0u32;
    while at < bucket_bytes {
        let len = (bucket_bytes - at).min(SCAN_BYTES);
        in_time(mem)?;
        let asked: heapless::Vec<usize, MAX_REPLICAS> =
            considered.iter().copied().filter(|&i| gone & (1 << i) == 0).collect();
        let reads: heapless::Vec<_, MAX_REPLICAS> = asked
            .iter()
            .chain(&joiners)
            .map(|&i| {
                let rep = &header.replicas[i];
                mem.read(crate::RemoteAddr::new(rep.node, rep.buckets + at), len as usize)
            })
            .collect();
        let got = join_all(reads).await;
        // (The mutant `scan-asks-again` asks it again every time.)
        for (k, &i) in asked.iter().enumerate() {
            if !matches!(got.results[k], Some(Ok(_))) {
                paths.unanswered += 1;
                if !mutant!("scan-asks-again") {
                    gone |= 1 << i;
                }
            }
        }
        // A joiner must be caught up whole, or stay out.
        for (k, &j) in joiners.iter().enumerate() {
            if !matches!(got.results[asked.len() + k], Some(Ok(_))) {
                return Err(unavailable(header.replicas[j].node));
            }
        }
        for slot in 0..len / 8 {
            let offset = BUCKET_BYTES + at + 8 * slot;
            let word_of = |k: usize| match &got.results[k] {
                Some(Ok(b)) => word_at(b, 8 * slot as usize),
                _ => None,
            };
            let words: heapless::Vec<(usize, u64), MAX_REPLICAS> =
                (0..asked.len()).filter_map(|k| Some((asked[k], word_of(k)?))).collect();
            if words.is_empty() {
                return Err(unavailable(header.replicas[considered[0]].node));
            }
            let c = if words.iter().all(|&(_, w)| w == words[0].1) {
                words[0].1
            } else {
                let c = choose(mem, header, &words).await?;
                in_time(mem)?;
                let stale: heapless::Vec<usize, MAX_REPLICAS> =
                    words.iter().filter(|&&(_, w)| w != c).map(|&(i, _)| i).collect();
                let cas: heapless::Vec<_, MAX_REPLICAS> =
                    words.iter().filter(|&&(_, w)| w != c).map(|&(i, w)| mem.cas(header.at(i, offset), w, c)).collect();
                // A replica that fails now is left out of the view.
                let done = join_all(cas).await;
                for (k, &i) in stale.iter().enumerate() {
                    if !matches!(done.results[k], Some(Ok(_))) {
                        unrepaired |= 1 << i;
                    }
                }
                paths.repaired += 1;
                c
            };
            for (k, &j) in joiners.iter().enumerate() {
                let Some(w) = word_of(asked.len() + k) else {
                    return Err(unavailable(header.replicas[j].node));
                };
                if w != c {
                    in_time(mem)?;
                    catch_up(mem, header, j, &words, offset, w, c).await?;
                    paths.caught_up += 1;
                }
            }
        }
        at += len;
    }
    // Every replica of the new view holds, for every slot, the word chosen
    // or a later one (CHOOSE's premise for the next change): one that the
    // scan or the repair missed may hold an older word, even one committed
    // and superseded, so it is left out, to come back as a joiner, caught
    // up. (The mutant `view-keeps-unrepaired` keeps it: the next change
    // may then choose the older word and undo a committed one.)
    paths.left_unrepaired += ((gone | unrepaired) & !leaving).count_ones() as u64;
    let missed = if mutant!("view-keeps-unrepaired") { 0 } else { (gone | unrepaired) as u8 };
    let excluded = prepare.excluded | missed;
    if r - (excluded.count_ones() as usize).min(r) < majority(r) {
        return Err(unavailable(header.replicas[(missed.trailing_zeros() as usize).min(r - 1)].node));
    }
    let stable = View { phase: Phase::Stable, joiners: 0, excluded, ..prepare };
    in_time(mem)?;
    // A replica late once a majority answered (the stalled one the change
    // leaves out) is not waited for: its install may land later, or never,
    // and either is harmless, as it expects the Prepare.
    let installs: heapless::Vec<_, MAX_REPLICAS> =
        (0..r).map(|i| mem.cas(header.view_addr(i), prepare.encode(), stable.encode())).collect();
    let (replies, _) = join_timely(installs, majority(r), Watch::on(mem), |i| late(header.replicas[i].node)).await;
    let mut done = replies.oks().filter(|&(_, &prev)| prev == prepare.encode()).count();
    // Replicas that the claim missed (late then) and still hold an older
    // view catch up: nothing newer may be overwritten.
    let behind: heapless::Vec<_, MAX_REPLICAS> = replies
        .oks()
        .filter(|&(_, &prev)| View::decode(prev).is_some_and(|v| v.epoch < prepare.epoch))
        .map(|(i, &prev)| async move { mem.cas(header.view_addr(i), prev, stable.encode()).await.map(|p| p == prev) })
        .collect();
    done += join_all(behind).await.oks().filter(|&(_, &won)| won).count();
    if done < majority(r) {
        return Err(unavailable(header.replicas[0].node));
    }
    Ok(stable)
}

/// Catches joiner `j`'s slot at logical offset `offset` up from `from` to
/// `c`, the word the view's replicas (`holders`, with the words they hold)
/// agree on after the repair: `c`'s block record and mark, copied from the
/// holders (each held `c` once, so holds its block), then the word, in one
/// ordered pipeline, so that the joiner, like every replica, holds a word's
/// block before the word. The mark is written plainly: while the Prepare
/// is fenced nothing but its master posts to a joiner's slots or blocks
/// (the joiner is in no view that a lease covers), so no CAS races it.
async fn catch_up<M: Memory>(
    mem: &M,
    header: &Header,
    j: usize,
    holders: &[(usize, u64)],
    offset: u64,
    from: u64,
    c: u64,
) -> Result<(), IndexError> {
    let node = header.replicas[j].node;
    let fail = |e: MemError| IndexError::Unavailable(e);
    let sites = header.sites();
    let len = block_len(SlotWord(c).key_len()) + 16;
    let mut copy: heapless::Vec<u8, { crate::index::layout::MAX_BLOCK + 24 }> = heapless::Vec::new();
    let mut ops: heapless::Vec<Op<'_>, 2> = heapless::Vec::new();
    let at = block::addr_of(sites[j], header.arena_size, c, Part::Record);
    if c != 0 {
        let whole = |i: usize| {
            let s = sites[i];
            block::addr_of(s, header.arena_size, c, Part::Mark).and(block::addr_of(
                s,
                header.arena_size,
                c,
                Part::Record,
            ))
        };
        let reads: heapless::Vec<_, MAX_REPLICAS> = holders
            .iter()
            .map(|&(i, _)| i)
            .chain(core::iter::once(j))
            .map(|i| async move {
                match whole(i) {
                    Some(at) => mem.read(at, len + 8).await.map(Some),
                    None => Ok(None),
                }
            })
            .collect();
        let got = join_all(reads).await;
        let bufs = || got.oks().filter_map(|(k, b)| Some((k, b.as_ref()?.as_ref())));
        let Some((_, record)) =
            bufs().find(|&(k, b)| k < holders.len() && block::decode_record(b, SlotWord(c).key_len()).is_some())
        else {
            return Err(unavailable(header.replicas[holders[0].0].node));
        };
        let marked = bufs().any(|(_, b)| word_at(b, len) == Some(block::mark_of(c)));
        let _ = copy.extend_from_slice(&record[..len]);
        let _ = copy.extend_from_slice(&if marked { block::mark_of(c) } else { 0 }.to_le_bytes());
        let at = at.ok_or(IndexError::Corrupt { node, what: "a slot points outside the arena" })?;
        // The mutant catches the word up without its block: a joiner that
        // becomes a primary serves words whose blocks it lacks.
        if !mutant!("rejoin-word-only") {
            let _ = ops.push(Op::Write { offset: at.offset, data: &copy });
        }
    }
    let _ = ops.push(Op::Cas { offset: header.at(j, offset).offset, expected: from, new: c });
    let out = mem.pipeline(node, &ops).await.map_err(fail)?;
    match out.last().and_then(|o| o.cas()) {
        Some(prev) if prev == from => Ok(()),
        _ => Err(unavailable(node)),
    }
}

/// CHOOSE for one slot whose answering replicas hold `words` (replica,
/// word), not all equal: the committed word among them (another's
/// parent), or else the common parent of the proposals they hold.
async fn choose<M: Memory>(mem: &M, header: &Header, words: &[(usize, u64)]) -> Result<u64, IndexError> {
    let mut parents: heapless::Vec<(u64, u64), MAX_REPLICAS> = heapless::Vec::new();
    for &(i, w) in words {
        if parents.iter().any(|&(x, _)| x == w) {
            continue;
        }
        let _ = parents.push((w, parent(mem, header, i, w).await?));
    }
    for &(w, _) in &parents {
        if parents.iter().any(|&(x, p)| x != w && p == w) {
            return Ok(w);
        }
    }
    let p = parents[0].1;
    if parents.iter().all(|&(_, q)| q == p) {
        Ok(p)
    } else {
        Err(IndexError::Corrupt { node: header.replicas[words[0].0].node, what: "a slot's replicas span two rounds" })
    }
}

/// The parent of `w`, held by replica `i`, from its block's record there.
async fn parent<M: Memory>(mem: &M, header: &Header, i: usize, w: u64) -> Result<u64, IndexError> {
    let node = header.replicas[i].node;
    let corrupt = IndexError::Corrupt { node, what: "a slot's word has no whole block record" };
    if w == 0 {
        // The empty slot has no parent: nothing is older.
        return Ok(0);
    }
    let sites = header.sites();
    let at = block::addr_of(sites[i], header.arena_size, w, Part::Record).ok_or(corrupt)?;
    let len = block_len(SlotWord(w).key_len()) + 16;
    let bytes = mem.read(at, len).await?;
    block::decode_record(&bytes, SlotWord(w).key_len()).map(|(_, _, p)| p).ok_or(corrupt)
}
