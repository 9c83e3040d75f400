//! The backend's ordering promise for In-n-Out, under loom's memory model:
//! whoever sees the CAS of a write-then-CAS pipeline sees the write in its
//! next operation. This checks the backend's fences (a release fence before
//! a write's stores and after them, a `SeqCst` CAS, an acquire fence after a
//! read's loads); removing the writer's or the reader's side makes it fail.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use swarm_backend_shm::ShmCluster;
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::memory::read_word;
    use swarm_core::{Memory, NodeId, Op, RemoteAddr};
    use swarm_loom_tests::explore;

    const FLAG: RemoteAddr = RemoteAddr::new(NodeId(0), 0);
    const DATA: RemoteAddr = RemoteAddr::new(NodeId(0), 8);

    #[test]
    fn a_cas_seen_implies_the_write_before_it_seen() {
        let runs = explore(|| {
            let cluster = ShmCluster::in_process(1, 16).unwrap();
            let writer = cluster.memory();
            let w = loom::thread::spawn(move || {
                let data = 42u64.to_le_bytes();
                let ops = [
                    Op::Write { offset: DATA.offset, data: &data },
                    Op::Cas { offset: FLAG.offset, expected: 0, new: 1 },
                ];
                block_on(writer.pipeline(NodeId(0), &ops)).unwrap();
            });
            let reader = cluster.memory();
            if block_on(read_word(&reader, FLAG)).unwrap() == 1 {
                let data = block_on(read_word(&reader, DATA)).unwrap();
                assert_eq!(data, 42, "saw the CAS but not the write before it");
            }
            w.join().unwrap();
        });
        eprintln!("explored {runs} executions");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
    }
}
