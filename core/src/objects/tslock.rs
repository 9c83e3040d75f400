//! Timestamp locks (SWARM §3.3, Appendix B, Algorithm "split").
//!
//! `TRYLOCK(ts, mode)` races READ against WRITE for a timestamp over one CAS
//! word per memory node. A word holds a packed `(ts, mode)` and only ever
//! grows, and it never changes its mind about the mode of a timestamp, so
//! READ and WRITE at the same timestamp cannot both win a majority (true
//! exclusion, Thm. B.2). A lock call with no earlier or concurrent call at a
//! higher timestamp or in the other mode returns true (true safety,
//! Thm. B.1). Each word's loop ends once the word holds a timestamp at least
//! `ts`, so the lock is wait-free (Thm. B.3).

use crate::substrate::quorum::{MAX_REPLICAS, majority, quorum};
use crate::{MemError, Memory, RemoteAddr};

/// The two sides of a timestamp lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// A reader deems the timestamp fresh and returns its value.
    Read = 1,
    /// The writer rewrites its value with another timestamp.
    Write = 2,
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Read => Mode::Write,
            Mode::Write => Mode::Read,
        }
    }
}

/// Largest timestamp a lock word can hold.
pub const MAX_TS: u64 = (1 << 62) - 1;

/// The word for `(ts, mode)`; 0 is bottom.
pub const fn pack(ts: u64, mode: Mode) -> u64 {
    (ts << 2) | mode as u64
}

/// The timestamp held by a lock word (0 for bottom).
pub const fn ts_of(word: u64) -> u64 {
    word >> 2
}

/// TRYLOCK(ts, mode) over the lock words `words`, one per node of the 2f+1;
/// `None` is a word whose node cannot be reached (it counts as a failed
/// replica). `ts` must be in `1..=MAX_TS`.
///
/// Returns `Err` only if no majority of words could be reached.
pub async fn try_lock<M: Memory>(
    mem: &M,
    words: &[Option<RemoteAddr>],
    ts: u64,
    mode: Mode,
) -> Result<bool, Option<MemError>> {
    debug_assert!((1..=MAX_TS).contains(&ts));
    let mine = pack(ts, mode);
    let need = majority(words.len());
    let futs: heapless::Vec<_, MAX_REPLICAS> = words.iter().flatten().map(|&w| lock_word(mem, w, ts, mine)).collect();
    let replies = quorum(futs, need).await;
    if !replies.reached(need) {
        return Err(replies.first_error().copied());
    }
    let theirs = pack(ts, mode.other());
    let lost = replies.oks().any(|(_, &seen)| ts_of(seen) > ts || seen == theirs);
    Ok(!lost)
}

/// One word of TRYLOCK: CAS `(ts, mode)` in until the word holds a
/// timestamp of at least `ts`; returns what it holds then.
async fn lock_word<M: Memory>(mem: &M, word: RemoteAddr, ts: u64, mine: u64) -> Result<u64, MemError> {
    let mut seen = 0;
    while ts_of(seen) < ts {
        let prev = mem.cas(word, seen, mine).await?;
        seen = if prev == seen { mine } else { prev };
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use alloc::rc::Rc;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use super::*;
    use crate::NodeId;
    use crate::sim::{CrashMode, Sim, SimConfig};

    fn words(n: u16) -> Vec<Option<RemoteAddr>> {
        (0..n).map(|i| Some(RemoteAddr::new(NodeId(i), 64))).collect()
    }

    #[test]
    fn uncontended_lock_succeeds_in_one_roundtrip() {
        let mut sim = Sim::new(SimConfig::default());
        let m = sim.client();
        let (ok, rtt) = sim
            .block_on(async move {
                let c = crate::substrate::rtt::Counted::new(&m);
                let ok = try_lock(&c, &words(3), 5, Mode::Read).await.unwrap();
                (ok, c.roundtrips())
            })
            .unwrap();
        assert!(ok);
        assert_eq!(rtt, 1);
    }

    #[test]
    fn same_mode_relocks_and_other_mode_fails() {
        let mut sim = Sim::new(SimConfig::default());
        let m = sim.client();
        let r = sim
            .block_on(async move {
                let w = words(3);
                [
                    try_lock(&m, &w, 5, Mode::Read).await.unwrap(),
                    try_lock(&m, &w, 5, Mode::Read).await.unwrap(),
                    try_lock(&m, &w, 5, Mode::Write).await.unwrap(),
                    try_lock(&m, &w, 4, Mode::Read).await.unwrap(),
                    try_lock(&m, &w, 6, Mode::Write).await.unwrap(),
                ]
            })
            .unwrap();
        assert_eq!(r, [true, true, false, false, true]);
    }

    #[test]
    fn tolerates_a_minority_of_crashed_nodes_and_fails_without_majority() {
        let mut sim = Sim::new(SimConfig { nodes: 5, ..SimConfig::default() });
        sim.crash_node_at(1, 0, CrashMode::Hang);
        sim.crash_node_at(3, 0, CrashMode::FailFast);
        let m = sim.client();
        assert!(sim.block_on(async move { try_lock(&m, &words(5), 9, Mode::Write).await }).unwrap().unwrap());
        sim.crash_node_at(4, 0, CrashMode::FailFast);
        let m = sim.client();
        assert!(sim.block_on(async move { try_lock(&m, &words(5), 10, Mode::Write).await }).unwrap().is_err());
    }

    /// True exclusion under every schedule the simulator explores: a READ
    /// and a WRITE locker race for the same timestamp; they never both win.
    /// True safety: when only one mode is used, it wins.
    #[test]
    fn exclusion_and_safety_across_schedules() {
        let mut both_lost = 0;
        for seed in 0..2_000 {
            let nodes = if seed % 2 == 0 { 3 } else { 5 };
            let mut sim = Sim::new(SimConfig { seed, nodes, ..SimConfig::default() });
            if seed % 3 == 0 {
                let node = sim.random(0, nodes as u64 - 1) as usize;
                let at = sim.random(0, 3_000);
                sim.crash_node_at(node, at, CrashMode::Hang);
            }
            let out = Rc::new(RefCell::new([None, None]));
            for (i, mode) in [Mode::Read, Mode::Write].into_iter().enumerate() {
                let c = sim.client();
                let (m, out) = (c.clone(), out.clone());
                let delay = sim.random(0, 4_000);
                sim.spawn(&c, async move {
                    m.sleep(delay).await;
                    let w = words(nodes as u16);
                    out.borrow_mut()[i] = Some(try_lock(&m, &w, 7, mode).await.unwrap());
                });
            }
            sim.run().unwrap();
            let [r, w] = *out.borrow();
            let (r, w) = (r.unwrap(), w.unwrap());
            assert!(!(r && w), "seed {seed}: READ and WRITE both locked ts 7");
            both_lost += (!r && !w) as u32;
        }
        // Both may fail when they overlap; it must not be the common case.
        assert!(both_lost < 1_000, "{both_lost} runs where both lost");
    }
}

#[cfg(test)]
mod props {
    use alloc::rc::Rc;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use proptest::prelude::*;

    use super::*;
    use crate::NodeId;
    use crate::sim::{CrashMode, Sim, SimConfig};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// App. B's properties for random lockers: true exclusion (READ and
        /// WRITE at one timestamp never both win) and true safety (a call
        /// that loses had a conflicting call invoked before it returned).
        #[test]
        fn true_exclusion_and_true_safety(seed in any::<u64>(), calls in prop::collection::vec((1u64..4, any::<bool>(), 0u64..5_000), 2..6), crash in any::<bool>()) {
            let mut sim = Sim::new(SimConfig { seed, nodes: 3, ..SimConfig::default() });
            if crash {
                sim.crash_node_at((seed % 3) as usize, seed % 4_000, CrashMode::Hang);
            }
            // (ts, mode, invoked, returned, result)
            let log = Rc::new(RefCell::new(Vec::new()));
            for &(ts, write, delay) in &calls {
                let c = sim.client();
                let (m, log) = (c.clone(), log.clone());
                let mode = if write { Mode::Write } else { Mode::Read };
                sim.spawn(&c, async move {
                    m.sleep(delay).await;
                    let words: Vec<Option<RemoteAddr>> = (0..3).map(|n| Some(RemoteAddr::new(NodeId(n), 0))).collect();
                    let t0 = m.now();
                    let ok = try_lock(&m, &words, ts, mode).await.unwrap();
                    log.borrow_mut().push((ts, mode, t0, m.now(), ok));
                });
            }
            sim.run().unwrap();
            let log = log.borrow();
            for a in log.iter() {
                for b in log.iter() {
                    prop_assert!(!(a.0 == b.0 && a.1 != b.1 && a.4 && b.4), "exclusion violated: {:?} {:?}", a, b);
                }
                if !a.4 {
                    let conflict = log.iter().any(|b| b.2 <= a.3 && (b.0 > a.0 || (b.0 == a.0 && b.1 != a.1)));
                    prop_assert!(conflict, "{:?} failed with no conflicting call", a);
                }
            }
        }
    }
}
