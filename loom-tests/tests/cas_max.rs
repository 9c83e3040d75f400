//! Core's CAS-emulated MAX (`swarm_core::objects::max::cas_max`) under loom, with
//! concurrent writers of different values and different seeds: the word
//! ends at the maximum, every `MaxOutcome` tells the truth, a read after a
//! MAX finds at least its value, and the installs tell the word's whole
//! history. A wrong MAX (read, then write if smaller) is shown to be caught.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use swarm_backend_shm::{ShmCluster, ShmMemory};
    use swarm_core::objects::max::{MaxOutcome, cas_max};
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::memory::read_word;
    use swarm_core::{MemError, Memory, NodeId, RemoteAddr};
    use swarm_loom_tests::{explore_bounded, read_then_write_max};

    const WORD: RemoteAddr = RemoteAddr::new(NodeId(0), 0);
    /// What the word holds before the writers start.
    const INITIAL: u64 = 2;
    /// Preemptions per execution with three writers (two writers are few
    /// enough to explore every execution). The wrong MAX needs one
    /// preemption to be caught.
    const PREEMPTIONS: usize = 3;

    /// `writers` as (seed, value) race their MAX on the word, each followed by
    /// a read. The seeds are values the word held (`cas_max`'s contract): 0, a
    /// stale one that makes the first CAS fail, or `INITIAL`, the current one.
    /// Also checks that both kinds of race were explored: a MAX superseded by
    /// a larger one, and every MAX installed, each over the one before.
    fn race<F, Fut>(max: F, writers: &'static [(u64, u64)])
    where
        F: Fn(ShmMemory, u64, u64) -> Fut + Copy + Send + Sync + 'static,
        Fut: Future<Output = Result<MaxOutcome, MemError>>,
    {
        let bound = (writers.len() > 2).then_some(PREEMPTIONS);
        // Plain (not modelled) counters of the executions of each kind.
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let kinds = seen.clone();
        let runs = explore_bounded(bound, move || {
            let cluster = ShmCluster::in_process(1, 8).unwrap();
            block_on(cluster.memory().write(WORD, &INITIAL.to_le_bytes())).unwrap();
            let threads: Vec<_> = writers
                .iter()
                .map(|&(seed, new)| {
                    let mem = cluster.memory();
                    loom::thread::spawn(move || {
                        let out = block_on(max(mem.clone(), seed, new)).unwrap();
                        let seen = block_on(read_word(&mem, WORD)).unwrap();
                        assert!(seen >= new, "max violated: a read after MAX({new}) = {out:?} found {seen}");
                        (new, out)
                    })
                })
                .collect();
            let outs: Vec<(u64, MaxOutcome)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let last = block_on(read_word(&cluster.memory(), WORD)).unwrap();
            let top = writers.iter().map(|&(_, v)| v).max().unwrap().max(INITIAL);
            assert_eq!(last, top, "max violated: the word lost the maximum ({outs:?})");
            let installs = check_outcomes(&outs, last);
            let kind = if installs == outs.len() { 1 } else { 0 };
            kinds[kind].fetch_add(1, Ordering::Relaxed);
        });
        let [superseded, all_installed] = [0, 1].map(|k| seen[k].load(Ordering::Relaxed));
        eprintln!(
            "{writers:?}, preemption bound {bound:?}: explored {runs} executions \
             ({superseded} with a MAX superseded, {all_installed} with every MAX installed)"
        );
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        assert!(superseded > 0 && all_installed > 0, "loom missed a kind of race");
    }

    /// Every outcome is truthful, and the installs form one chain from the
    /// initial value to the final one: each install replaced the value
    /// installed just before it (the word only ever changes by an install).
    /// Returns the number of installs.
    fn check_outcomes(outs: &[(u64, MaxOutcome)], last: u64) -> usize {
        let held = |v: u64| v == INITIAL || outs.iter().any(|&(new, _)| new == v);
        let mut installs = Vec::new();
        for &(new, out) in outs {
            match out {
                MaxOutcome::Installed { prev } => {
                    assert!(prev < new, "max violated: MAX({new}) installed over the larger {prev}");
                    installs.push((prev, new));
                }
                MaxOutcome::Superseded { found } => {
                    assert!(found >= new, "max violated: MAX({new}) superseded by the smaller {found}");
                    assert!(held(found), "max violated: MAX({new}) found {found}, never written");
                }
            }
        }
        installs.sort_by_key(|&(_, new)| new);
        let mut at = INITIAL;
        for &(prev, new) in &installs {
            assert_eq!(prev, at, "max violated: installs {installs:?} do not chain from {INITIAL}");
            at = new;
        }
        assert_eq!(at, last, "max violated: installs {installs:?} do not end at the final {last}");
        installs.len()
    }

    /// Two writers: one seeded with a stale 0 (its first CAS fails), one with
    /// the current value.
    const TWO: &[(u64, u64)] = &[(0, 5), (INITIAL, 7)];
    /// Three writers, one of them below the other two.
    const THREE: &[(u64, u64)] = &[(0, 5), (INITIAL, 7), (INITIAL, 3)];

    async fn core_max(mem: ShmMemory, seed: u64, new: u64) -> Result<MaxOutcome, MemError> {
        cas_max(&mem, WORD, seed, new).await
    }

    #[test]
    fn cas_max_two_writers() {
        race(core_max, TWO);
    }

    #[test]
    fn cas_max_three_writers() {
        race(core_max, THREE);
    }

    /// The check can fail: read-then-write loses the larger of two values.
    #[test]
    #[should_panic(expected = "max violated")]
    fn read_then_write_max_is_caught() {
        race(|mem, seed, new| async move { read_then_write_max(&mem, WORD, seed, new).await }, TWO);
    }
}
