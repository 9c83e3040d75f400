//! pDPM-Direct's lock word (`swarm_core::systems::pdpm_direct::lock`) under
//! loom: a holder whose lease ran out (it was slow, not dead) renews and
//! then releases its lock while another client, finding the lock past its
//! lease and grace, takes it over. At most one of the renewal and the
//! takeover wins, and the holder's release never frees the lock of the
//! client that took it over: every change of the word is a CAS from the
//! word its author saw (issue #22, item 7). The paper's unlock, a WRITE of
//! 0 (pDPM §4.1, step 4), is shown to be caught.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use swarm_backend_shm::{ShmCluster, ShmMemory};
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::memory::read_word;
    use swarm_core::systems::pdpm_direct::lock::{Seen, Timing, held, judge, swing};
    use swarm_core::{MemError, Memory, NodeId, RemoteAddr};
    use swarm_loom_tests::{explore, write_unlock};

    const LOCK: RemoteAddr = RemoteAddr::new(NodeId(0), 0);
    /// The slow holder (client 1): its word when the race starts, its lease
    /// long past, and its renewed word.
    const SLOW: u8 = 1;
    const EXPIRY: u64 = 10;
    const RENEWED: u64 = 20;
    /// The client that takes the lock over (client 2).
    const TAKER: u8 = 2;

    /// The two clients' clock: microsecond ticks, the taker's now far past
    /// the slow holder's expiry and the grace.
    fn timing() -> Timing {
        Timing::of(&|| 0u64)
    }

    fn now() -> u64 {
        EXPIRY + 100 * timing().grace
    }

    /// Races the slow holder (renew, then `unlock` whatever it holds) with
    /// the taker (read the word, judge it, take it over by CAS): checks
    /// that not both hold the lock at once, and that the word ends as the
    /// taker's if it won, free otherwise. Returns how many executions ended
    /// with the taker left without the lock, and with it (taken over, or
    /// taken once released).
    fn race<F, Fut>(unlock: F) -> [usize; 2]
    where
        F: Fn(ShmMemory, u64) -> Fut + Copy + Send + Sync + 'static,
        Fut: Future<Output = Result<bool, MemError>>,
    {
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let counts = seen.clone();
        let runs = explore(move || {
            let cluster = ShmCluster::in_process(1, 8).unwrap();
            let old = held(SLOW, EXPIRY);
            block_on(cluster.memory().write(LOCK, &old.to_le_bytes())).unwrap();
            let mem = cluster.memory();
            let slow = loom::thread::spawn(move || {
                let renewed = held(SLOW, RENEWED);
                let kept = block_on(swing(&mem, LOCK, old, renewed)).unwrap();
                let mine = if kept { renewed } else { old };
                block_on(unlock(mem, mine)).unwrap();
                kept
            });
            let mem = cluster.memory();
            let taker = loom::thread::spawn(move || {
                let word = block_on(read_word(&mem, LOCK)).unwrap();
                let mine = held(TAKER, now() + timing().lease);
                match judge(word, now(), &timing()) {
                    // Past its lease (or released already): taken by CAS from
                    // the word seen.
                    Seen::Expired | Seen::Free => (block_on(swing(&mem, LOCK, word, mine)).unwrap(), word == old),
                    other => panic!("lock violated: the taker judged {word:#x} {other:?}"),
                }
            });
            let (kept, (took, over)) = (slow.join().unwrap(), taker.join().unwrap());
            // Taken over from the slow holder's word while it renewed: both
            // would write under the lock at once.
            assert!(!(kept && took && over), "lock violated: the holder renewed and the taker took over");
            let last = block_on(read_word(&cluster.memory(), LOCK)).unwrap();
            if took {
                assert_eq!(last, held(TAKER, now() + timing().lease), "lock violated: the taker's lock was freed");
            } else {
                assert_eq!(last, 0, "the holder's release did not free its lock");
            }
            counts[took as usize].fetch_add(1, Ordering::Relaxed);
        });
        let seen = [0, 1].map(|i| seen[i].load(Ordering::Relaxed));
        eprintln!("explored {runs} executions, [the taker without the lock, with it]: {seen:?}");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        seen
    }

    /// The core's release: `CAS(mine -> 0)`.
    async fn release(mem: ShmMemory, mine: u64) -> Result<bool, MemError> {
        swing(&mem, LOCK, mine, 0).await
    }

    /// Both winners were explored, and each was safe.
    #[test]
    fn takeover_and_release_by_cas() {
        let [without, with] = race(release);
        assert!(without > 0 && with > 0, "loom missed a winner");
    }

    /// The check can fail: the paper's WRITE of 0 frees a lock taken over.
    #[test]
    #[should_panic(expected = "lock violated")]
    fn release_by_write_is_caught() {
        race(|mem, _| async move { write_unlock(&mem, LOCK).await });
    }
}
