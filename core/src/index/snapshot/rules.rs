//! The conflict rules of SNAPSHOT (`papers/fusee.txt` §4.3, Algorithm 2),
//! as pure functions: what a writer decides from what its backup CASes
//! returned ([`eval`], finished by [`eval_with_primary`] when Rule 3 needs
//! the primary), and which value a helper completes a stalled round with
//! ([`winner`]). No memory access: the slot protocol posts the operations
//! and feeds their replies here (`notes/fusee-design.md` §1, `EVAL` and
//! `WINNER`).
//!
//! A *round* is every write that read the same `vold` from the primary. Each
//! backup starts the round holding `vold` and is CASed once from `vold` by
//! every writer, so it changes exactly once: it ends the round holding the
//! value of the first CAS that reached it. Every proposed value is unique
//! (fix F1), so a value names its writer, and all writers of a round that
//! have heard from every backup see the same list. The rules pick one last
//! writer from that list with no further communication:
//!
//! - **Rule 1**: it won every backup (3 roundtrips in all);
//! - **Rule 2**: it won a strict majority of the backups (4: its catch-ups
//!   add one);
//! - **Rule 3**: no value holds a strict majority, the primary still holds
//!   `vold`, and its value is the least of the list (5: the primary check
//!   and the catch-ups add one each).
//!
//! Everyone else loses and waits for the primary to change (FUSEE §4.3:
//! losers linearise just before the winner's primary CAS).

/// What one backup's CAS of a round tells the writer that posted it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Seen {
    /// The value the backup holds for this round: the writer's own `vnew`
    /// if its CAS won the backup, else the value its CAS found there (Alg. 1
    /// line 9, `change_list_value`). Build it with [`Seen::from_cas`].
    Holds(u64),
    /// The backup's CAS failed and its outcome could not be learnt: the
    /// round cannot be decided from the backups (FUSEE §5, recovery).
    Failed,
}

impl Seen {
    /// What a backup CAS `vold -> vnew` that returned `prev` means: `prev ==
    /// vold` (or `vnew`, for a CAS of ours that landed earlier and was
    /// re-posted) is a backup this writer won, so it counts as `vnew`; any
    /// other value is another writer's, which won it (Alg. 1 line 9).
    pub fn from_cas(prev: u64, vold: u64, vnew: u64) -> Seen {
        Seen::Holds(if prev == vold { vnew } else { prev })
    }

    /// The value, unless the backup failed.
    pub fn value(self) -> Option<u64> {
        match self {
            Seen::Holds(v) => Some(v),
            Seen::Failed => None,
        }
    }
}

/// What a writer does after its backup CASes (Alg. 2's answers).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Decision {
    /// Rule 1: it won every backup; it commits on the primary.
    R1,
    /// Rule 2: it won a strict majority of the backups; it catches the
    /// others up (each CAS expecting the value it saw there, fix F2), then
    /// commits on the primary.
    R2,
    /// Rule 3: nobody holds a strict majority, the primary still held `vold`
    /// after every backup answered, and its value is the least one seen; it
    /// catches up and commits as for Rule 2.
    R3,
    /// Another writer of the round wins, or may: it waits for the primary to
    /// change (and helps after a bounded wait, fix F5).
    Lose,
    /// The primary no longer holds `vold`: the round was committed, maybe on
    /// this writer's behalf by a helper (fix F7: the caller looks at who won).
    Finish,
    /// A backup, or the primary check, failed: recovery decides.
    Fail,
}

impl Decision {
    /// This writer is the round's last writer (Rules 1-3).
    #[cfg(test)]
    pub fn wins(self) -> bool {
        matches!(self, Decision::R1 | Decision::R2 | Decision::R3)
    }

    /// A winner that must first move the backups it did not win to its value.
    #[cfg(test)]
    pub fn catches_up(self) -> bool {
        matches!(self, Decision::R2 | Decision::R3)
    }
}

/// [`eval`]'s answer: a decision, or Rule 3's need for a fresh primary read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Eval {
    /// Decided from the backups alone.
    Decided(Decision),
    /// No value holds a strict majority and `vnew` is among them: read the
    /// primary now, after every backup answered, and pass what it holds to
    /// [`eval_with_primary`] (fix F3).
    ReadPrimary,
}

/// Evaluates Rules 1 and 2 on `seen`, one reply per backup of the round (all
/// of them: the list must be complete before anything is decided), for a
/// writer that proposed `vnew`. FUSEE §4.3, Alg. 2 lines 4-11.
///
/// A strict majority (`2c > n`) decides alone: it can only grow during the
/// round (catch-ups move backups to the winner), so every writer that sees
/// the list sees the same majority. Without one, a writer whose value is not
/// in the list has lost (it won no backup, so its value cannot be the least
/// of the list). Otherwise it answers [`Eval::ReadPrimary`]: only then is the
/// primary read worth its roundtrip.
///
/// With no backups (r = 1) the answer is Rule 1: the primary's CAS alone
/// arbitrates.
pub fn eval(seen: &[Seen], vnew: u64) -> Eval {
    if seen.contains(&Seen::Failed) {
        return Eval::Decided(Decision::Fail);
    }
    let values = || seen.iter().filter_map(|s| s.value());
    if let Some((v, count)) = strict_majority(values) {
        let d = if v != vnew {
            Decision::Lose
        } else if count == seen.len() {
            Decision::R1
        } else {
            Decision::R2
        };
        return Eval::Decided(d);
    }
    if seen.is_empty() {
        return Eval::Decided(Decision::R1);
    }
    if !values().any(|v| v == vnew) {
        return Eval::Decided(Decision::Lose);
    }
    Eval::ReadPrimary
}

/// Finishes [`eval`] with Rule 3, given what the primary held (`vchk`; `None`
/// if that read failed) when read *after* every backup had answered. FUSEE
/// §4.3, Alg. 2 lines 12-19. (If `eval` decided alone, this returns its
/// decision and ignores `vchk`.)
///
/// Why a fresh read, posted only after the replies (F3): the replies may mix
/// rounds. A CAS delayed past the end of its round (a stall) fails on a
/// backup that already holds a later round's value, and a list such as
/// `[mine, c, c, d]` (my backup from round k, the others from round k+1)
/// would make this writer the least and let it overwrite round k+1's
/// backups. If the primary still holds `vold` after every reply arrived, no
/// writer committed this round before then, and the next round only starts
/// from a committed value: every reply is of this round and the list is the
/// one every participant decides on. A read from the write's first
/// roundtrip, or one posted with the CASes, can be answered before a late
/// CAS lands and proves nothing. A primary that changed means the round
/// is over ([`Decision::Finish`]).
///
/// Why the minimum is over raw words (F3): every participant of the round
/// (writers of any kind of slot, helpers, the master) must pick the same
/// least value from the same words, with nothing to decode that could fail
/// or differ. Comparing words with a bit masked (a tombstone bit) or decoded
/// pointers orders some pairs the other way, and two writers that compare
/// differently both win Rule 3.
pub fn eval_with_primary(seen: &[Seen], vold: u64, vnew: u64, vchk: Option<u64>) -> Decision {
    match eval(seen, vnew) {
        Eval::Decided(d) => d,
        Eval::ReadPrimary => match vchk {
            None => Decision::Fail,
            Some(p) if p != vold => Decision::Finish,
            Some(_) if seen.iter().filter_map(|s| s.value()).min() == Some(vnew) => Decision::R3,
            Some(_) => Decision::Lose,
        },
    }
}

/// The value a round's last writer has, or will have, decided, from the
/// backups as read after every writer of the round CASed them all: the value
/// held by a strict majority of `backups`, else their least raw `u64` (the
/// same order as Rule 3, see [`eval_with_primary`]). A helper completes a
/// round whose winner does not commit with it (fix F5). `None` only with no
/// backups.
///
/// It is the same value at every point of the round's catch-ups: they only
/// move backups *to* the winner, so a winner's majority stays one, and
/// without a majority the least value (Rule 3's winner) stays the least
/// until its catch-ups give it a majority. So a helper and the winner, or two
/// helpers, never complete a round with different values.
pub fn winner(backups: &[u64]) -> Option<u64> {
    match strict_majority(|| backups.iter().copied()) {
        Some((v, _)) => Some(v),
        None => backups.iter().copied().min(),
    }
}

/// The value held by more than half of the values, and how many hold it.
fn strict_majority<I: Iterator<Item = u64>>(values: impl Fn() -> I) -> Option<(u64, usize)> {
    let n = values().count();
    values().map(|v| (v, values().filter(|&w| w == v).count())).find(|&(_, c)| 2 * c > n)
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    const VOLD: u64 = 0x77;

    fn holds(values: &[u64]) -> Vec<Seen> {
        values.iter().map(|&v| Seen::Holds(v)).collect()
    }

    /// The whole decision as a writer takes it: the primary (`primary`, or a
    /// failed read) is read only if [`eval`] asks; also says whether it was.
    fn decide(seen: &[Seen], vnew: u64, primary: Option<u64>) -> (Decision, bool) {
        let (d, read) = match eval(seen, vnew) {
            Eval::Decided(d) => (d, false),
            Eval::ReadPrimary => (eval_with_primary(seen, VOLD, vnew, primary), true),
        };
        assert_eq!(d, eval_with_primary(seen, VOLD, vnew, primary), "the two paths agree");
        (d, read)
    }

    /// (backup values, vnew, primary at the check) -> (decision, primary read?)
    type Row = (&'static [u64], u64, Option<u64>, Decision, bool);

    fn check_table(rows: &[Row]) {
        for &(values, vnew, primary, want, read) in rows {
            assert_eq!(
                decide(&holds(values), vnew, primary),
                (want, read),
                "{values:?}, vnew {vnew}, primary {primary:?}"
            );
        }
    }

    use Decision::{Fail, Finish, Lose, R1, R2, R3};
    const P: Option<u64> = Some(VOLD);

    #[test]
    fn one_backup() {
        check_table(&[
            (&[1], 1, P, R1, false),
            (&[2], 1, P, Lose, false),
            // A writer never reads the primary with one backup: someone holds all of it.
            (&[2], 1, None, Lose, false),
        ]);
        assert_eq!(decide(&[Seen::Failed], 1, P), (Fail, false));
    }

    #[test]
    fn two_backups() {
        check_table(&[
            (&[1, 1], 1, P, R1, false),
            (&[2, 2], 1, P, Lose, false),
            // A 1-1 split: the least value wins Rule 3, after the primary check.
            (&[1, 2], 1, P, R3, true),
            (&[2, 1], 1, P, R3, true),
            (&[1, 2], 2, P, Lose, true),
            // The round was committed meanwhile (by anyone, even for this writer: F7).
            (&[1, 2], 1, Some(9), Finish, true),
            (&[1, 2], 1, Some(1), Finish, true),
            (&[1, 2], 2, Some(1), Finish, true),
            // The check failed.
            (&[1, 2], 1, None, Fail, true),
            // Not among the values: lost without a check.
            (&[2, 3], 1, P, Lose, false),
        ]);
        assert_eq!(decide(&[Seen::Holds(1), Seen::Failed], 1, P), (Fail, false));
        assert_eq!(decide(&[Seen::Failed, Seen::Failed], 1, P), (Fail, false));
    }

    #[test]
    fn four_backups() {
        check_table(&[
            (&[5, 5, 5, 5], 5, P, R1, false),
            (&[5, 5, 5, 3], 5, P, R2, false),
            (&[3, 5, 5, 5], 5, P, R2, false),
            // A majority wins even if it is not the least value.
            (&[5, 5, 5, 3], 3, P, Lose, false),
            // 2-2: no strict majority (2c > n fails); the least wins Rule 3.
            (&[5, 3, 5, 3], 3, P, R3, true),
            (&[5, 3, 5, 3], 5, P, Lose, true),
            (&[5, 3, 5, 3], 3, Some(5), Finish, true),
            // 2-1-1 is no majority either: the least value, not the largest group.
            (&[5, 5, 3, 7], 3, P, R3, true),
            (&[5, 5, 3, 7], 5, P, Lose, true),
            (&[5, 5, 3, 7], 7, P, Lose, true),
            (&[4, 3, 2, 1], 1, P, R3, true),
            (&[4, 3, 2, 1], 4, P, Lose, true),
            (&[4, 3, 2, 6], 1, P, Lose, false),
        ]);
        // Any failure is a failure, even beside a majority (Alg. 2 checks it first).
        let seen = [Seen::Holds(5), Seen::Holds(5), Seen::Holds(5), Seen::Failed];
        assert_eq!(decide(&seen, 5, P), (Fail, false));
    }

    #[test]
    fn no_backups_leave_the_primary_to_decide() {
        assert_eq!(decide(&[], 1, P), (R1, false));
        assert_eq!(winner(&[]), None);
    }

    #[test]
    fn rule_2_needs_three_backups() {
        // With 1 or 2 backups a strict majority is all of them: Rule 1.
        for n in 1..=2 {
            for word in 0..3u64.pow(n) {
                let values: Vec<u64> = (0..n).map(|i| word / 3u64.pow(i) % 3 + 1).collect();
                for vnew in 1..=3 {
                    let (d, _) = decide(&holds(&values), vnew, P);
                    assert_ne!(d, R2, "{values:?} vnew {vnew}");
                    assert!(n == 2 || d != R3, "{values:?} vnew {vnew}");
                }
            }
        }
    }

    #[test]
    fn a_late_cas_of_an_earlier_round_finishes() {
        // F3, r = 5: op2 won b1 in round k; its CASes on b2-b4 land late, in
        // round k+1 (from op1, the value round k committed), and fail there.
        let (op1, op2, op3, op4) = (40, 10, 30, 20);
        let seen = holds(&[op2, op3, op3, op4]);
        assert_eq!(eval(&seen, op2), Eval::ReadPrimary);
        // The fresh read sees round k committed: op2 must not catch up.
        assert_eq!(eval_with_primary(&seen, VOLD, op2, Some(op1)), Finish);
        // What a stale check (the first roundtrip's read) would have let it do.
        assert_eq!(eval_with_primary(&seen, VOLD, op2, Some(VOLD)), R3);
    }

    #[test]
    fn the_minimum_is_over_raw_words() {
        // A tombstone word (bit 47 set) is larger than a live word with a
        // larger pointer, as raw u64s: the live word wins Rule 3.
        let tomb = (1 << 47) | 5;
        let live = 9;
        let seen = holds(&[tomb, live]);
        assert_eq!(decide(&seen, live, P), (R3, true));
        assert_eq!(decide(&seen, tomb, P), (Lose, true));
        assert_eq!(winner(&[tomb, live]), Some(live));
        let top = u64::MAX;
        assert_eq!(decide(&holds(&[top, 0]), 0, P), (R3, true));
    }

    #[test]
    fn from_cas_counts_a_won_backup_as_vnew() {
        assert_eq!(Seen::from_cas(VOLD, VOLD, 3), Seen::Holds(3));
        assert_eq!(Seen::from_cas(3, VOLD, 3), Seen::Holds(3));
        assert_eq!(Seen::from_cas(4, VOLD, 3), Seen::Holds(4));
        assert_eq!(Seen::Failed.value(), None);
    }

    #[test]
    fn winner_is_the_majority_else_the_least() {
        assert_eq!(winner(&[7]), Some(7));
        assert_eq!(winner(&[7, 3]), Some(3));
        assert_eq!(winner(&[7, 7, 3]), Some(7));
        assert_eq!(winner(&[7, 3, 7, 3]), Some(3));
        assert_eq!(winner(&[7, 7, 7, 3]), Some(7));
        assert_eq!(winner(&[9, 7, 7, 3]), Some(3));
    }

    #[test]
    fn decisions_classify() {
        for (d, wins, catches_up) in
            [(R1, true, false), (R2, true, true), (R3, true, true), (Lose, false, false), (Finish, false, false)]
        {
            assert_eq!((d.wins(), d.catches_up()), (wins, catches_up));
        }
        assert!(!Fail.wins() && !Fail.catches_up());
    }

    /// One round: `k` writers with distinct `values` (none is `VOLD`) CAS
    /// `n` backups from `VOLD`; backup `b` takes them in `orders[b]` (writer
    /// indices; those `>= k`, and those for which `reaches` is false, are
    /// skipped). Returns the final backups and, per writer, what each of its
    /// CASes returned (`Failed` for a CAS that never reached its backup).
    fn round(
        values: &[u64],
        k: usize,
        n: usize,
        orders: &[Vec<usize>],
        reaches: impl Fn(usize, usize) -> bool,
    ) -> (Vec<u64>, Vec<Vec<Seen>>) {
        let mut seen = vec![vec![Seen::Failed; n]; k];
        let mut backups = vec![VOLD; n];
        for (b, order) in orders.iter().take(n).enumerate() {
            for &w in order.iter().filter(|&&w| w < k && reaches(w, b)) {
                let prev = backups[b];
                if prev == VOLD {
                    backups[b] = values[w];
                }
                seen[w][b] = Seen::from_cas(prev, VOLD, values[w]);
            }
        }
        (backups, seen)
    }

    /// A CAS on a backup, returning what it held.
    fn cas(backup: &mut u64, expect: u64, new: u64) -> u64 {
        let prev = *backup;
        if prev == expect {
            *backup = new;
        }
        prev
    }

    /// Distinct raw words, none of them `VOLD`, in random order: the first
    /// is the only one that may be small, the rest anywhere in u64.
    fn distinct_values() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::btree_set(prop_oneof![0..16u64, any::<u64>()], 4)
            .prop_filter("VOLD is not proposed", |s| !s.contains(&VOLD))
            .prop_map(|s| s.into_iter().collect::<Vec<_>>())
            .prop_shuffle()
    }

    /// Per backup, the order in which the (up to 4) writers' CASes reach it.
    fn orders() -> impl Strategy<Value = Vec<Vec<usize>>> {
        prop::collection::vec(Just((0..4).collect::<Vec<usize>>()).prop_shuffle(), 4)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// No crash, primary still `VOLD` for everyone: exactly one writer
        /// wins, the one `winner` names; R3 goes to the least value that won
        /// a backup exactly when no value holds a strict majority; the
        /// primary is read only then, by the writers whose value is in the list.
        #[test]
        fn one_round_has_one_winner(k in 2usize..=4, n in 1usize..=4, values in distinct_values(), orders in orders()) {
            let (backups, seen) = round(&values, k, n, &orders, |_, _| true);
            let w = winner(&backups).unwrap();
            let majority = (0..k).any(|i| 2 * backups.iter().filter(|&&v| v == values[i]).count() > n);
            let least_that_won = (0..k).filter(|&i| backups.contains(&values[i])).map(|i| values[i]).min().unwrap();
            let mut winners = Vec::new();
            for i in 0..k {
                // Every writer heard from every backup, so it sees the final list.
                prop_assert_eq!(seen[i].iter().map(|s| s.value().unwrap()).collect::<Vec<_>>(), backups.clone());
                let (d, read) = decide(&seen[i], values[i], P);
                prop_assert_eq!(read, !majority && backups.contains(&values[i]));
                if d.wins() {
                    winners.push((i, d));
                } else {
                    prop_assert_eq!(d, Lose);
                }
            }
            prop_assert_eq!(winners.len(), 1, "winners {:?} on {:?}", winners, backups);
            let (i, d) = winners[0];
            prop_assert_eq!(values[i], w);
            prop_assert_eq!(d == R3, !majority);
            if !majority {
                prop_assert_eq!(values[i], least_that_won);
            }
        }

        /// Writers may crash after posting only some of their CASes (their
        /// CASes still land where they were posted); the others decide. At
        /// most one decides to win, it is `winner`'s value, and the writer
        /// of `winner`'s value wins unless it crashed (then a helper
        /// completes the round with `winner`, and nobody else has won).
        #[test]
        fn crashed_writers_leave_one_winner(
            k in 2usize..=4,
            n in 1usize..=4,
            values in distinct_values(),
            orders in orders(),
            crashed in prop::collection::vec(any::<bool>(), 4),
            reach in prop::collection::vec(any::<u8>(), 4),
        ) {
            // At least one writer is alive, so every backup got a CAS.
            let alive = |i: usize| i == 0 || !crashed[i];
            let (backups, seen) = round(&values, k, n, &orders, |w, b| alive(w) || reach[w] & (1 << b) != 0);
            prop_assert!(!backups.contains(&VOLD));
            let w = winner(&backups).unwrap();
            let mut winners = 0;
            for i in (0..k).filter(|&i| alive(i)) {
                let (d, _) = decide(&seen[i], values[i], P);
                prop_assert!(d == Lose || d.wins());
                prop_assert_eq!(d.wins(), values[i] == w);
                winners += usize::from(d.wins());
            }
            let owner = (0..k).find(|&i| values[i] == w).unwrap();
            prop_assert_eq!(winners, usize::from(alive(owner)));
        }

        /// The winner catches up every backup not holding its value (each CAS
        /// expecting what it saw there, F2), possibly crashing part way; a
        /// helper may read the backups at any point of that and catch up
        /// from what it read, its CASes interleaved with the winner's. The
        /// helper picks the same winner, no catch-up CAS finds a value other
        /// than the one it expects or the winner's, and every backup ends
        /// holding the winner.
        #[test]
        fn catch_ups_leave_every_backup_with_the_winner(
            k in 2usize..=4,
            n in 1usize..=4,
            values in distinct_values(),
            orders in orders(),
            helper in any::<bool>(),
            stop in any::<usize>(),
            read_at in any::<usize>(),
            interleave in prop::collection::vec(any::<bool>(), 8),
        ) {
            let (mut backups, seen) = round(&values, k, n, &orders, |_, _| true);
            let w = winner(&backups).unwrap();
            let owner = (0..k).find(|&i| values[i] == w).unwrap();
            let (d, _) = decide(&seen[owner], w, P);
            prop_assert!(d.wins());
            // The winner's catch-ups, from what its backup CASes returned.
            let mine: Vec<(usize, u64)> =
                (0..n).filter_map(|b| seen[owner][b].value().filter(|&v| v != w).map(|v| (b, v))).collect();
            prop_assert_eq!(d.catches_up(), !mine.is_empty());
            // Without a helper the winner does them all; with one it may stop anywhere.
            let stop = if helper { stop % (mine.len() + 1) } else { mine.len() };
            let read_at = if helper { read_at % (stop + 1) } else { stop };
            for &(b, expect) in &mine[..read_at] {
                let prev = cas(&mut backups[b], expect, w);
                prop_assert!(prev == expect || prev == w);
            }
            let mut theirs = Vec::new();
            if helper {
                prop_assert_eq!(winner(&backups), Some(w));
                theirs = (0..n).filter(|&b| backups[b] != w).map(|b| (b, backups[b])).collect();
            }
            let (mut a, mut h) = (read_at, 0);
            let mut bits = interleave.iter().cycle();
            while a < stop || h < theirs.len() {
                let winner_next = h == theirs.len() || (a < stop && *bits.next().unwrap());
                let (b, expect) = if winner_next { a += 1; mine[a - 1] } else { h += 1; theirs[h - 1] };
                let prev = cas(&mut backups[b], expect, w);
                prop_assert!(prev == expect || prev == w, "backup {} held {}, expected {} or {}", b, prev, expect, w);
            }
            prop_assert!(backups.iter().all(|&v| v == w), "{:?}, winner {}", backups, w);
        }

        /// On any complete list, with the primary unchanged, a writer whose
        /// value is in the list wins exactly when `winner` names it.
        #[test]
        fn eval_agrees_with_winner(values in prop::collection::vec(0..5u64, 1..=7), pick in any::<prop::sample::Index>()) {
            let vnew = values[pick.index(values.len())];
            let (d, _) = decide(&holds(&values), vnew, P);
            prop_assert_eq!(d.wins(), winner(&values) == Some(vnew));
        }
    }
}
