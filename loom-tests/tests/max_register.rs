//! The core's max register emulated with CAS
//! (`swarm_core::objects::max::cas_max`) over the shared-memory backend's
//! loom mode: every interleaving of two writers is explored, and the wrong
//! variant (a blind write) is shown to be caught.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::future::Future;

    use swarm_backend_shm::{ShmCluster, ShmMemory};
    use swarm_core::objects::max::{MaxOutcome, cas_max};
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::memory::read_word;
    use swarm_core::{MemError, NodeId, RemoteAddr};
    use swarm_loom_tests::{blind_write_max, explore};

    const REGISTER: RemoteAddr = RemoteAddr::new(NodeId(0), 0);

    /// Two writers raise the register to 3 and to 5 with `write_max`; each
    /// then reads it and must find at least its own value, and the final
    /// value must be the maximum.
    fn two_writers<F, Fut>(write_max: F)
    where
        F: Fn(ShmMemory, u64) -> Fut + Copy + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, MemError>>,
    {
        let runs = explore(move || {
            let cluster = ShmCluster::in_process(1, 8).unwrap();
            let writers: Vec<_> = [3u64, 5]
                .into_iter()
                .map(|v| {
                    let mem = cluster.memory();
                    loom::thread::spawn(move || {
                        let after = block_on(write_max(mem.clone(), v)).unwrap();
                        assert!(after >= v, "max register violated: write_max({v}) returned {after}");
                        let seen = block_on(read_word(&mem, REGISTER)).unwrap();
                        assert!(seen >= v, "max register violated: a writer of {v} read {seen} afterwards");
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            let last = block_on(read_word(&cluster.memory(), REGISTER)).unwrap();
            assert_eq!(last, 5, "max register violated: it lost the maximum");
        });
        eprintln!("explored {runs} executions");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
    }

    #[test]
    fn cas_max_register_keeps_the_max() {
        two_writers(|mem, v| async move {
            // From the guess 0: the word's value afterwards as this writer knows it.
            Ok(match cas_max(&mem, REGISTER, 0, v).await? {
                MaxOutcome::Installed { .. } => v,
                MaxOutcome::Superseded { found } => found,
            })
        });
    }

    /// The check can fail: a blind write lets the smaller value win.
    #[test]
    #[should_panic(expected = "max register violated")]
    fn blind_write_max_register_is_caught() {
        two_writers(|mem, v| async move { blind_write_max(&mem, REGISTER, v).await });
    }
}
