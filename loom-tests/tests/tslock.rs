//! The timestamp lock (`swarm_core::objects::tslock::try_lock`) under loom: a READ
//! and a WRITE locker race for the same timestamp over three lock words, one
//! on each of three nodes, and never both win (true exclusion); two lockers
//! in one mode both win (true safety). Wrong locks (check-then-write instead
//! of the CAS loop; an exclusive lock) are shown to be caught.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use swarm_backend_shm::{Fault, ShmCluster, ShmMemory};
    use swarm_core::objects::tslock::{Mode, try_lock};
    use swarm_core::substrate::exec::block_on;
    use swarm_core::{MemError, NodeId, RemoteAddr};
    use swarm_loom_tests::{check_then_write_try_lock, exclusive_try_lock, explore_bounded, spawn_big};

    /// The timestamp both lockers want.
    const TS: u64 = 7;
    /// Preemptions per execution: none is the bound, this model is small
    /// enough to explore every execution (the wrong locks need two
    /// preemptions to be caught).
    const PREEMPTIONS: Option<usize> = None;

    /// One lock word on each of three nodes (a node is one word: loom
    /// models each word, so nodes cost nothing more than words).
    fn words() -> [RemoteAddr; 3] {
        [0, 1, 2].map(|n| RemoteAddr::new(NodeId(n), 0))
    }

    /// Core's TRYLOCK over the three words (an unreachable node's word
    /// fails; a majority is always reachable here).
    async fn core_lock(mem: ShmMemory, ts: u64, mode: Mode) -> Result<bool, MemError> {
        let words = words().map(Some);
        try_lock(&mem, &words, ts, mode).await.map_err(|e| e.expect("a majority of nodes is reachable"))
    }

    /// Two threads lock `TS` in `modes` with `lock`, with node `failed` (if
    /// any) unreachable; `check` judges what they got. Checks that loom
    /// explored more than one execution, and returns how many executions
    /// ended with each result: `[neither won, the first won, the second
    /// won, both won]`.
    fn race<F, Fut>(
        lock: F,
        modes: [Mode; 2],
        failed: Option<NodeId>,
        check: impl Fn([bool; 2]) + Sync + Send + 'static,
    ) -> [usize; 4]
    where
        F: Fn(ShmMemory, u64, Mode) -> Fut + Copy + Send + Sync + 'static,
        Fut: Future<Output = Result<bool, MemError>>,
    {
        // Plain (not modelled) counters of the results.
        let seen = Arc::new([0; 4].map(AtomicUsize::new));
        let results = seen.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let cluster = ShmCluster::in_process(3, 8).unwrap();
            if let Some(node) = failed {
                cluster.set_fault(node, Fault::Failed).unwrap();
            }
            let lockers = modes.map(|mode| {
                let mem = cluster.memory();
                spawn_big(move || block_on(lock(mem, TS, mode)).unwrap())
            });
            let got = lockers.map(|t| t.join().unwrap());
            check(got);
            results[got[0] as usize + 2 * got[1] as usize].fetch_add(1, Ordering::Relaxed);
        });
        let seen = [0, 1, 2, 3].map(|i| seen[i].load(Ordering::Relaxed));
        eprintln!(
            "{modes:?}, {failed:?} failed: explored {runs} executions, [neither, first, second, both] won: {seen:?}"
        );
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        seen
    }

    /// Both orders of the race were explored: each mode won somewhere.
    fn both_won_somewhere(seen: [usize; 4]) {
        assert!(seen[1] > 0 && seen[2] > 0, "loom missed an order of the race: {seen:?}");
    }

    fn exclusion(got: [bool; 2]) {
        assert!(!(got[0] && got[1]), "true exclusion violated: READ and WRITE both locked ts {TS}");
    }

    fn safety(got: [bool; 2]) {
        assert!(got[0] && got[1], "true safety violated: lockers in one mode lost ts {TS}: {got:?}");
    }

    #[test]
    fn read_and_write_at_one_timestamp_never_both_win() {
        both_won_somewhere(race(core_lock, [Mode::Read, Mode::Write], None, exclusion));
    }

    /// With a node down, the lockers meet on the two words left.
    #[test]
    fn read_and_write_never_both_win_with_a_node_down() {
        both_won_somewhere(race(core_lock, [Mode::Read, Mode::Write], Some(NodeId(1)), exclusion));
    }

    #[test]
    fn lockers_in_one_mode_always_win() {
        race(core_lock, [Mode::Read, Mode::Read], None, safety);
        race(core_lock, [Mode::Write, Mode::Write], None, safety);
        race(core_lock, [Mode::Read, Mode::Read], Some(NodeId(1)), safety);
    }

    /// The exclusion check can fail: check-then-write lets a READ and a
    /// WRITE that overlap on two words both win.
    #[test]
    #[should_panic(expected = "true exclusion violated")]
    fn check_then_write_lock_is_caught() {
        race(
            |mem, ts, mode| async move { check_then_write_try_lock(&mem, &words(), ts, mode).await },
            [Mode::Read, Mode::Write],
            None,
            exclusion,
        );
    }

    /// The safety check can fail: an exclusive lock makes one of two
    /// readers lose.
    #[test]
    #[should_panic(expected = "true safety violated")]
    fn exclusive_lock_is_caught() {
        race(
            |mem, ts, mode| async move { exclusive_try_lock(&mem, &words(), ts, mode).await },
            [Mode::Read, Mode::Read],
            None,
            safety,
        );
    }
}
