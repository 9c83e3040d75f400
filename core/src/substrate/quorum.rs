//! Waiting for a majority: the paper's "wait until a majority replied",
//! which must never block on the late replicas.
//!
//! [`quorum`] polls one future per replica and resolves as soon as `need` of
//! them succeeded, or as soon as so many failed that `need` can no longer be
//! reached. The late futures are dropped: an operation they posted may still
//! be applied by its node, which the protocols of the core tolerate (their
//! remote writes are monotone or guarded by CAS).
//!
//! [`quorum_first`], the one on every common path of the registers, hands
//! each reply to the caller as it arrives instead of collecting them: the
//! caller folds what it needs (a maximum, a mask of holders) and nothing
//! per replica is stored or moved.

use core::future::{Future, poll_fn};
use core::pin::{Pin, pin};
use core::task::Poll;

use crate::substrate::exec::{Cold, cold, map, pin_cold};
use crate::substrate::late::{Plan, Watch};

/// The most replicas (or nodes) one object spans; the paper evaluates 3, 5 and 7.
pub const MAX_REPLICAS: usize = 8;
// Replica sets are `u16` bit masks (`Tally`, `mask`, `gather`).
const _: () = assert!(MAX_REPLICAS <= 16);

/// What each replica's future returned by the time the quorum resolved.
#[derive(Debug)]
pub struct Replies<T, E> {
    /// One slot per future, in the order given; `None` for those still
    /// pending when the quorum resolved.
    pub results: heapless::Vec<Option<Result<T, E>>, MAX_REPLICAS>,
    /// How many succeeded.
    pub ok: usize,
    /// How many failed.
    pub failed: usize,
}

impl<T, E> Replies<T, E> {
    /// Whether at least `need` replicas succeeded.
    pub fn reached(&self, need: usize) -> bool {
        self.ok >= need
    }

    /// The successful results with their replica index.
    pub fn oks(&self) -> impl Iterator<Item = (usize, &T)> {
        self.results.iter().enumerate().filter_map(|(i, r)| match r {
            Some(Ok(v)) => Some((i, v)),
            _ => None,
        })
    }

    /// The first error, if any replica failed.
    pub fn first_error(&self) -> Option<&E> {
        self.results.iter().find_map(|r| match r {
            Some(Err(e)) => Some(e),
            _ => None,
        })
    }
}

/// How a [`quorum_first`] ended: counts and masks (bit `i` for replica `i`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many succeeded.
    pub ok: usize,
    /// How many failed.
    pub failed: usize,
    /// Which were started.
    pub started: u16,
    /// Which answered (their result went to the caller).
    pub answered: u16,
    /// Which were awaited when they became late ([`crate::substrate::late`])
    /// and had not answered when the wait ended.
    pub late: u16,
}

impl Tally {
    /// Whether at least `need` replicas succeeded.
    pub fn reached(&self, need: usize) -> bool {
        self.ok >= need
    }
}

/// A majority of `n`: `n / 2 + 1`.
pub const fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The replicas of `0..n` that `f` accepts, as a mask (bit `i` for `i`).
pub fn mask(n: usize, f: impl Fn(usize) -> bool) -> u16 {
    (0..n.min(MAX_REPLICAS)).filter(|&i| f(i)).fold(0, |m, i| m | 1 << i)
}

/// When a wait ends (besides when every started future answered).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// When this many succeeded, or so many failed that they cannot.
    Quorum(usize),
    /// Only when every one answered.
    All,
    /// Every one, unless some are late: then as [`Until::Quorum`].
    Timely(usize),
}

// `quorum`, `join_all` and `join_timely` are plain functions that box each
// future of `futs` at once, not `async fn`s: an `async fn` keeps its
// arguments for its whole life (rust-lang/rust#62958), so every level would
// hold a slot per replica for the futures, and move them all when started.

/// Polls every future of `futs` concurrently until `need` of them returned
/// `Ok`, or until `need` can no longer be reached, or until all completed.
pub fn quorum<F, T, E>(futs: heapless::Vec<F, MAX_REPLICAS>, need: usize) -> impl Future<Output = Replies<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    map(collect(futs, Until::Quorum(need), None), |(replies, _)| replies)
}

/// Polls every future of `futs` concurrently until all of them completed,
/// successfully or not: for work that must reach every node.
pub fn join_all<F, T, E>(futs: heapless::Vec<F, MAX_REPLICAS>) -> impl Future<Output = Replies<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    map(collect(futs, Until::All, None), |(replies, _)| replies)
}

/// Polls every future of `futs` concurrently until all of them completed,
/// or, once those still awaited are late (`watch`), until `need`
/// succeeded: for work that should reach every node it can, of which a
/// majority is enough. With `need` 0, nothing is waited for long (see
/// [`Watch::courtesy`]); with a `need` above their number, every one is
/// (as [`join_all`]). The late ones are dropped, and answer `late(i)`,
/// as a time-out would (their operations may still be applied). The
/// tally says which they were.
pub fn join_timely<'w, F, T, E>(
    futs: heapless::Vec<F, MAX_REPLICAS>,
    need: usize,
    watch: Watch<'w>,
    late: impl Fn(usize) -> E,
) -> impl Future<Output = (Replies<T, E>, Tally)>
where
    F: Future<Output = Result<T, E>>,
{
    let watch = if need == 0 { watch.courtesy() } else { watch };
    let until = if need > futs.len() { Until::All } else { Until::Timely(need) };
    map(collect(futs, until, Some(watch)), move |(mut replies, tally): (Replies<T, E>, Tally)| {
        for i in BitIter(tally.late) {
            if let Some(slot) = replies.results.get_mut(i) {
                *slot = Some(Err(late(i)));
                replies.failed += 1;
            }
        }
        (replies, tally)
    })
}

/// [`quorum`], [`join_all`] and [`join_timely`]: every future started at
/// once, their results kept by index. Boxes the futures here, before
/// anything is awaited.
fn collect<'w, F, T, E>(
    futs: heapless::Vec<F, MAX_REPLICAS>,
    until: Until,
    watch: Option<Watch<'w>>,
) -> impl Future<Output = (Replies<T, E>, Tally)>
where
    F: Future<Output = Result<T, E>>,
{
    collect_boxed(futs.into_iter().map(|f| Some(cold(|| f))).collect(), until, watch)
}

/// [`collect`], once the futures are boxed.
async fn collect_boxed<F, T, E>(
    slots: heapless::Vec<Option<Cold<F>>, MAX_REPLICAS>,
    until: Until,
    watch: Option<Watch<'_>>,
) -> (Replies<T, E>, Tally)
where
    F: Future<Output = Result<T, E>>,
{
    let mut results: heapless::Vec<Option<Result<T, E>>, MAX_REPLICAS> = slots.iter().map(|_| None).collect();
    let plan = Plan { first: 0, probe: 0, watch };
    // Nothing is started later, so no room is kept for futures inline.
    let tally = gather::<F, T, E, 0>(slots, plan, until, None::<fn(usize) -> F>, |i, r| results[i] = Some(r)).await;
    (Replies { results, ok: tally.ok, failed: tally.failed }, tally)
}

/// The indices of the bits set in a mask, lowest first.
struct BitIter(u16);

impl Iterator for BitIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }
}

/// Majority first (SWARM §6): starts `op(i)` for only `need` of the
/// replicas `0..n`, those in `plan.first` before the others, each in
/// index order, and the probes of `plan.probe` with them; each time one
/// fails, starts one more, so that `need` can still succeed, and once
/// those awaited are late (`plan.watch`), starts all the others; until
/// `need` succeeded or every replica answered. Saves the bandwidth and
/// work of the replicas beyond a majority; a failed replica costs a
/// roundtrip more, a late one a little waiting.
///
/// Each reply goes to `on_reply(i, result)` as it arrives (replica `i`);
/// the tally says which were started, which answered and which were late.
///
/// (A plain function returning `gather`'s future, not an `async fn`: on
/// every common path, a level of future less to poll.)
pub fn quorum_first<F, T, E>(
    n: usize,
    need: usize,
    plan: Plan<'_>,
    op: impl FnMut(usize) -> F,
    on_reply: impl FnMut(usize, Result<T, E>),
) -> impl Future<Output = Tally>
where
    F: Future<Output = Result<T, E>>,
{
    let slots = (0..n.min(MAX_REPLICAS)).map(|_| None).collect();
    gather::<F, T, E, INLINE>(slots, plan, Until::Quorum(need), Some(op), on_reply)
}

/// How many of the futures that [`quorum_first`] starts are kept inline in
/// its own future rather than boxed: the first majority of the common three
/// replicas, so that an operation that meets no failure allocates nothing.
const INLINE: usize = 2;

/// Where the future of one replica is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    /// Not started.
    Nowhere,
    /// In `inline[k]`.
    Inline(u8),
    /// In its slot of `slots`, boxed.
    Boxed,
}

/// Polls the futures in `slots` concurrently until `until` says the wait
/// is over or all completed, handing each result to `on_reply` as it
/// comes. Empty slots are started with `more` (those in `plan.first`
/// before the others, each in index order, and `plan.probe` at once)
/// whenever fewer than needed could still succeed: at the start, after
/// each failure, and all of them once those awaited are late. The first
/// `N` futures `more` makes are kept inline ([`INLINE`] of them for
/// [`quorum_first`]); the others, and those
/// given in `slots`, are [`Cold`] (boxed with `alloc`): inline, a slot per
/// possible replica would make every caller's future large.
async fn gather<F, T, E, const N: usize>(
    slots: heapless::Vec<Option<Cold<F>>, MAX_REPLICAS>,
    plan: Plan<'_>,
    until: Until,
    mut more: Option<impl FnMut(usize) -> F>,
    mut on_reply: impl FnMut(usize, Result<T, E>),
) -> Tally
where
    F: Future<Output = Result<T, E>>,
{
    let n = slots.len();
    let all: u16 = if n == 0 { 0 } else { u16::MAX >> (16 - n) };
    let (first, mut watch) = (plan.first, plan.watch);
    let mut tally = Tally::default();
    let mut at = [At::Nowhere; MAX_REPLICAS];
    // Started and not failed: succeeded or pending.
    let mut live = 0;
    for (i, slot) in slots.iter().enumerate() {
        if slot.is_some() {
            tally.started |= 1 << i;
            at[i] = At::Boxed;
            live += 1;
        }
    }
    let mut need_live = match until {
        Until::Quorum(need) => need,
        Until::All | Until::Timely(_) => n,
    };
    // Probes go first, on top of the majority.
    let mut probe = plan.probe & all & !tally.started;
    let mut probes = 0;
    let mut late_rang = false;
    let mut futs = pin!((slots, heapless::Vec::<F, N>::new()));
    poll_fn(|cx| {
        // SAFETY: structural pinning of the elements of two pinned
        // `heapless::Vec`s. Both store their elements inline, and they are
        // pinned for the rest of this function: they are never moved. The
        // first is never pushed to, popped from or resized, and a slot is
        // only ever assigned while it holds `None` (nothing pinned is
        // overwritten); the second is only pushed to, which writes a fresh
        // slot and moves no element. So no element moves between polls or
        // before it is dropped in place when the pair is dropped. We only
        // hand out `Pin<&mut F>` to the futures, and never move out.
        let (slots, inline): (&mut heapless::Vec<Option<Cold<F>>, MAX_REPLICAS>, &mut heapless::Vec<F, N>) = {
            let pair = unsafe { Pin::get_unchecked_mut(futs.as_mut()) };
            (&mut pair.0, &mut pair.1)
        };
        let slots = slots.as_mut_slice();
        loop {
            // Start replicas until `need` can succeed even if no other
            // fails, and the probes.
            while let Some(make) = more.as_mut()
                && tally.started != all
                && live < need_live + probes
            {
                let idle = all & !tally.started;
                let pick = if probe != 0 {
                    probe
                } else if idle & first != 0 {
                    idle & first
                } else {
                    idle
                };
                let i = pick.trailing_zeros() as usize;
                if probe != 0 {
                    probe &= !(1 << i);
                    probes += 1;
                }
                if !inline.is_full() {
                    at[i] = At::Inline(inline.len() as u8);
                    // Cannot fail: it is not full.
                    let _ = inline.push(make(i));
                } else {
                    slots[i] = Some(cold(|| make(i)));
                    at[i] = At::Boxed;
                }
                tally.started |= 1 << i;
                live += 1;
            }
            let mut failed_now = false;
            let mut pending = tally.started & !tally.answered;
            while pending != 0 {
                let i = pending.trailing_zeros() as usize;
                pending &= pending - 1;
                // SAFETY: see above; each future is an element of one of the
                // two pinned vectors (a boxed one is pinned by its box).
                let fut: Pin<&mut F> = match at[i] {
                    At::Nowhere => continue,
                    At::Inline(k) => match inline.get_mut(k as usize) {
                        Some(f) => unsafe { Pin::new_unchecked(f) },
                        None => continue,
                    },
                    At::Boxed => match slots[i].as_mut() {
                        Some(f) => pin_cold(unsafe { Pin::new_unchecked(f) }),
                        None => continue,
                    },
                };
                if let Poll::Ready(r) = fut.poll(cx) {
                    if r.is_ok() {
                        tally.ok += 1;
                    } else {
                        tally.failed += 1;
                        live -= 1;
                        failed_now = true;
                    }
                    tally.answered |= 1 << i;
                    on_reply(i, r);
                }
            }
            let done = tally.answered == all;
            let reached = |need: usize| tally.ok >= need || n.saturating_sub(tally.failed) < need;
            let enough = match until {
                Until::Quorum(need) => reached(need),
                Until::All => false,
                Until::Timely(need) => late_rang && reached(need),
            };
            if enough || done {
                return Poll::Ready(());
            }
            // A failure calls for another replica: start it and poll it now.
            if failed_now && tally.started != all {
                continue;
            }
            // About to sleep: are those awaited late? Then everyone is
            // called on (or, for a timely join, a majority will do).
            if !late_rang
                && let Some(w) = watch.as_mut()
                && w.poll_late(cx, tally.answered != 0).is_ready()
            {
                late_rang = true;
                tally.late = tally.started & !tally.answered;
                need_live = n;
                continue;
            }
            return Poll::Pending;
        }
    })
    .await;
    tally.late &= !tally.answered;
    tally
}

/// Runs `op(i)` for every `i` in `0..n` at once, and answers once `need`
/// of them succeeded, or so many failed that they cannot: whether `need`
/// did, and which succeeded by then (bit `i` for `op(i)`). The others are
/// left to land (an operation posted is applied even if nobody waits for
/// it). The substrate's majority-first quorum ([`quorum_first`]) with every
/// replica started at once, which keeps the first futures inline and boxes
/// the others: a round's future stays small.
pub async fn to_all<F: Future<Output = Result<(), crate::MemError>>>(
    n: usize,
    need: usize,
    op: impl FnMut(usize) -> F,
) -> (bool, u16) {
    let all = mask(n, |_| true);
    let plan = Plan { first: all, probe: all, watch: None };
    let mut ok = 0;
    let tally =
        quorum_first(n, need, plan, op, |i, r: Result<(), crate::MemError>| ok |= (r.is_ok() as u16) << i).await;
    (tally.reached(need), ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::substrate::exec::{block_on, yield_now};

    async fn after(polls: usize, r: Result<usize, &'static str>) -> Result<usize, &'static str> {
        for _ in 0..polls {
            yield_now().await;
        }
        r
    }

    /// The futures of `quorum`, `join_all` and `join_timely` are boxed as
    /// they are given, not held in the combinator's own future: a caller's
    /// future does not grow with the replicas' (rust-lang/rust#62958 would
    /// make an `async fn` hold all of them for its whole life).
    #[test]
    fn gathering_futures_are_boxed_at_once() {
        use crate::sim::{Sim, SimConfig};
        use crate::substrate::join::tests::big;
        let mem = Sim::new(SimConfig::default()).client();
        let one = size_of_val(&big(1));
        let three = || (1..=3).map(big).collect::<heapless::Vec<_, MAX_REPLICAS>>();
        let sizes = [
            size_of_val(&quorum(three(), 2)),
            size_of_val(&join_all(three())),
            size_of_val(&join_timely(three(), 2, Watch::on(&mem), |_| ())),
        ];
        assert!(sizes.iter().all(|&s| s < one), "futures of {one} bytes each, combinators of {sizes:?} bytes");
        let r = block_on(join_all(three()));
        assert_eq!((r.ok, r.oks().map(|(_, &v)| v).sum::<u8>()), (3, 6));
    }

    fn futs(
        spec: &[(usize, Result<usize, &'static str>)],
    ) -> heapless::Vec<impl Future<Output = Result<usize, &'static str>>, MAX_REPLICAS> {
        spec.iter().map(|&(p, r)| after(p, r)).collect()
    }

    #[test]
    fn resolves_at_majority_without_the_late_one() {
        let r = block_on(quorum(futs(&[(0, Ok(0)), (1000, Ok(1)), (1, Ok(2))]), 2));
        assert!(r.reached(2));
        assert!(r.results[1].is_none(), "the late replica must not be waited for");
        assert_eq!(r.oks().map(|(i, _)| i).collect::<heapless::Vec<_, 8>>().as_slice(), &[0, 2]);
    }

    #[test]
    fn gives_up_when_majority_is_impossible() {
        let r = block_on(quorum(futs(&[(0, Err("down")), (1_000_000, Ok(1)), (0, Err("down"))]), 2));
        assert!(!r.reached(2));
        assert_eq!(r.failed, 2);
        assert_eq!(r.first_error(), Some(&"down"));
    }

    #[test]
    fn failures_below_the_limit_are_tolerated() {
        let r = block_on(quorum(futs(&[(0, Err("down")), (3, Ok(1)), (2, Ok(2))]), 2));
        assert!(r.reached(2));
    }

    #[test]
    fn join_all_waits_for_every_future_even_after_failures() {
        let r = block_on(join_all(futs(&[(0, Err("down")), (50, Ok(1)), (3, Ok(2))])));
        assert_eq!((r.ok, r.failed), (2, 1));
        assert!(r.results.iter().all(Option::is_some));
    }

    #[test]
    fn majority_first_starts_a_majority_and_widens_on_failure() {
        use core::cell::RefCell;
        let spec = [(0, Ok(0)), (2, Ok(1)), (1, Ok(2)), (0, Ok(3)), (0, Ok(4))];
        let started = RefCell::new(heapless::Vec::<usize, 8>::new());
        let op = |i: usize| {
            let _ = started.borrow_mut().push(i);
            after(spec[i].0, spec[i].1)
        };
        // Replicas 1 and 2 are suspected: 0, 3 and 4 go first.
        let r = block_on(quorum_first(5, 3, Plan::trusting(mask(5, |i| i != 1 && i != 2)), op, |_, _| {}));
        assert!(r.reached(3));
        assert_eq!(started.borrow().as_slice(), &[0, 3, 4], "only a majority is started");
        let spec = [(0, Err("down")), (2, Ok(1)), (5, Ok(2)), (1, Err("down")), (0, Ok(4))];
        let started = RefCell::new(heapless::Vec::<usize, 8>::new());
        let op = |i: usize| {
            let _ = started.borrow_mut().push(i);
            after(spec[i].0, spec[i].1)
        };
        let r = block_on(quorum_first(5, 3, Plan::trusting(mask(5, |_| true)), op, |_, _| {}));
        assert!(r.reached(3));
        assert_eq!(started.borrow().as_slice(), &[0, 1, 2, 3, 4], "each failure starts one more");
        assert_eq!((r.ok, r.failed), (3, 2));
    }

    #[test]
    fn majority_first_hands_each_reply_over_once_as_it_arrives() {
        // 0 is suspected: 1 and 2 go first; 2 fails at once, which starts 0;
        // 1 answers next, 0 last.
        let spec = [(1000, Ok(0)), (2, Ok(1)), (0, Err("down"))];
        let mut seen = heapless::Vec::<(usize, Result<usize, &str>), 8>::new();
        let tally = block_on(quorum_first(
            3,
            2,
            Plan::trusting(0b110),
            |i| after(spec[i].0, spec[i].1),
            |i, r| {
                let _ = seen.push((i, r));
            },
        ));
        assert_eq!(seen.as_slice(), &[(2, Err("down")), (1, Ok(1)), (0, Ok(0))]);
        assert_eq!(tally, Tally { ok: 2, failed: 1, started: 0b111, answered: 0b111, late: 0 });
        // Two failures: the majority is out of reach, the slow 0 is not waited for.
        let spec = [(1000, Ok(0)), (0, Err("down")), (0, Err("down"))];
        let tally = block_on(quorum_first(3, 2, Plan::trusting(0b111), |i| after(spec[i].0, spec[i].1), |_, _| {}));
        assert_eq!(tally, Tally { ok: 0, failed: 2, started: 0b111, answered: 0b110, late: 0 });
        assert!(!tally.reached(2));
    }

    #[test]
    fn majority_first_gives_up_when_too_many_fail() {
        let spec = [(0, Err("down")), (2, Ok(1)), (1, Err("down"))];
        let r = block_on(quorum_first(3, 2, Plan::trusting(0b111), |i| after(spec[i].0, spec[i].1), |_, _| {}));
        assert!(!r.reached(2));
        assert_eq!(r.failed, 2);
    }

    #[test]
    fn majority_sizes() {
        assert_eq!([1, 2, 3, 5, 7].map(majority), [1, 2, 2, 3, 4]);
    }
}
