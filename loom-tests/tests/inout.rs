//! In-n-Out (`swarm_core::swarm::inout`) under loom: a read races a write on one
//! node set up as the protocols set nodes up (`Region::format`, then
//! `writerlog::format`), and returns exactly the old or the new value, with
//! the metadata that names it. A torn or stale in-place copy must be caught
//! by its hash and the out-of-place copy used instead; the checks make sure
//! loom explored such executions, and that a reader trusting the in-place
//! copy without its hash is caught.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use swarm_backend_shm::{ShmCluster, ShmMemory};
    use swarm_core::objects::max::MaxOutcome;
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::space::region::Region;
    use swarm_core::substrate::space::slab::SlabAllocator;
    use swarm_core::swarm::inout::{Layout, Replica, inplace_hash};
    use swarm_core::swarm::meta::Meta;
    use swarm_core::swarm::writerlog::{self, EntryHeader, LogGeometry, Logs, Place};
    use swarm_core::{Memory, NodeId, RemoteAddr};
    use swarm_loom_tests::{InPlace, explore_bounded, on_big_stack, read_in_place, spawn_big};

    const NODE: NodeId = NodeId(0);
    /// The smallest chunk a region allows.
    const CHUNK: u64 = 4096;
    /// Four chunks, the fewest that hold the node: the region header, the
    /// log directory, the object's chunk and the writer's log segment. Loom
    /// models every word, so the node is as small as it can be.
    const NODE_SIZE: u64 = 4 * CHUNK;
    /// Largest value of the layout and of the logs.
    const MAX_VALUE: u64 = 16;
    /// Where the object lies in its chunk.
    const OBJECT_AT: u64 = 256;
    /// Preemptions per execution. The model converges at about 13,000
    /// executions (a bound of 20 explores no more); 3 explores 1,500 in a
    /// few seconds. The trusting reader is caught even with 0.
    const PREEMPTIONS: Option<usize> = Some(3);

    const WRITER: u8 = 1;
    const READER: u8 = 2;
    /// The write done before the race, in slot 0 of the writer's first log
    /// segment (which starts at time 1).
    const M0: Meta = Meta::new(1, 0, WRITER);
    const V0: [u8; 16] = [0x11; 16];
    /// The racing write: same length, different bytes in both words, larger
    /// metadata, log entry 1.
    const M1: Meta = Meta::new(2, 1, WRITER);
    const V1: [u8; 16] = [0x22; 16];

    fn layout() -> Layout {
        Layout::new(1, MAX_VALUE).unwrap()
    }

    /// A fresh node with one object holding `V0` (written with
    /// `Replica::write`, in place too), and the writer's log entry for `M1`.
    /// Needs a big stack (`Logs`, `SlabAllocator` and the 4 KiB region
    /// header being formatted are all in the future).
    fn setup(mem: &ShmMemory) -> (Replica, RemoteAddr) {
        block_on(async {
            let layout = layout();
            Region::format_fresh(mem, NODE, NODE_SIZE, CHUNK).await.unwrap();
            let geo = LogGeometry::new(MAX_VALUE, CHUNK, 1).unwrap();
            writerlog::format(mem, NODE, geo).await.unwrap();
            let mut slab = SlabAllocator::new();
            let chunk = slab.alloc_chunk(mem, NODE).await.unwrap();
            let replica = Replica { node: NODE, base: chunk.offset + OBJECT_AT };
            let object = RemoteAddr::new(NODE, replica.base);
            mem.write(object, &vec![0; layout.size() as usize]).await.unwrap();
            let mut logs = Logs::new();
            let mut entry = async |m: Meta| {
                let place = Place { segment: 0, slot: m.slot(), start: 1 };
                logs.entries(mem, &[NODE], WRITER, place, Some(slab.unleased()), 1).await[0].unwrap().unwrap()
            };
            let (e0, e1) = (entry(M0).await, entry(M1).await);
            let out =
                replica.write(mem, &layout, e0, 0, M0, &EntryHeader::of(M0, 0, 1, &V0), &V0).await.unwrap().outcome;
            assert_eq!(out, MaxOutcome::Installed { prev: 0 });
            (replica, e1)
        })
    }

    /// Whether a reader may return `value` with `meta`: the initial write
    /// or the racing one, each with its own metadata.
    fn belongs(meta: Meta, value: &[u8]) -> bool {
        (meta == M0 && value == V0) || (meta == M1 && value == V1)
    }

    /// How a reader got its value.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Path {
        InPlace,
        OutOfPlace,
    }

    /// Core's In-n-Out READ: the in-place copy if its hash matches the
    /// metadata, else the out-of-place copy in the log entry the metadata
    /// names.
    fn core_read(mem: &ShmMemory, replica: Replica) -> (Meta, Vec<u8>, Path) {
        block_on(async {
            let layout = layout();
            let reply = replica.read(mem, layout, READER).await.unwrap();
            if let Some(v) = reply.value {
                return (reply.meta, v.to_vec(), Path::InPlace);
            }
            let meta = reply.meta;
            let mut logs = Logs::new();
            let found = logs.locate(mem, NODE, meta).await.unwrap();
            let (entry, _) = found.expect("the metadata names an existing log entry");
            let max = logs.geometry(mem, NODE).await.unwrap().max_value();
            let (_, v) = replica.read_out_of_place(mem, &layout, entry, max, meta).await.unwrap();
            (meta, v.to_vec(), Path::OutOfPlace)
        })
    }

    /// The deliberately wrong READ: takes the in-place copy without looking
    /// at its hash.
    fn trusting_read(mem: &ShmMemory, replica: Replica) -> (Meta, Vec<u8>, Path) {
        let InPlace { meta, value, .. } = block_on(read_in_place(mem, replica, &layout())).unwrap();
        (meta, value, Path::InPlace)
    }

    /// Sets up the node, then races a writer of `V1` against a reader using
    /// `read`; returns how many executions were explored and how many of
    /// them read out of place.
    fn race(read: fn(&ShmMemory, Replica) -> (Meta, Vec<u8>, Path)) -> (usize, usize) {
        let out_of_place = Arc::new(AtomicUsize::new(0));
        let count = out_of_place.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let count = count.clone();
            // The node's setup and the reader need big stacks; the driver
            // thread sets up, starts both sides, and reads once they are done.
            on_big_stack(move || {
                let cluster = ShmCluster::in_process(1, NODE_SIZE).unwrap();
                let (replica, e1) = setup(&cluster.memory());
                let mem = cluster.memory();
                let writer = loom::thread::spawn(move || {
                    let out =
                        block_on(replica.write(&mem, &layout(), e1, M0.0, M1, &EntryHeader::of(M1, 0, 1, &V1), &V1))
                            .unwrap()
                            .outcome;
                    assert_eq!(
                        out,
                        MaxOutcome::Installed { prev: M0.0 },
                        "in-n-out violated: the write did not install"
                    );
                });
                let mem = cluster.memory();
                let reader = spawn_big(move || {
                    let (meta, value, path) = read(&mem, replica);
                    assert!(belongs(meta, &value), "in-n-out violated: read {value:x?} with {meta:?} ({path:?})");
                    path
                });
                writer.join().unwrap();
                if reader.join().unwrap() == Path::OutOfPlace {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                // Once the write is done, a read sees it.
                let (meta, value, _) = read(&cluster.memory(), replica);
                assert!(meta == M1 && value == V1, "in-n-out violated: after the write, read {value:x?} with {meta:?}");
            })
        });
        let out_of_place = out_of_place.load(Ordering::Relaxed);
        eprintln!("explored {runs} executions, {out_of_place} of them read out of place");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        (runs, out_of_place)
    }

    #[test]
    fn a_read_racing_a_write_returns_the_old_or_the_new_value() {
        let (runs, out_of_place) = race(core_read);
        assert!(out_of_place > 0, "no execution read out of place: the stale and torn cases were not explored");
        assert!(out_of_place < runs, "no execution read in place");
    }

    /// The check can fail: a reader that trusts the in-place copy returns
    /// the old value (or a torn one) with the new metadata.
    #[test]
    #[should_panic(expected = "in-n-out violated")]
    fn a_reader_trusting_the_in_place_copy_is_caught() {
        race(trusting_read);
    }

    /// What the hash is up against: one READ racing the in-place copy's
    /// background write sees torn copies (words of both values), and whole
    /// copies of the other write than the metadata read. The hash
    /// (`inplace_hash`, the check of `Replica::read`) accepts a copy only
    /// with the metadata it belongs to. (It may also reject a copy that
    /// belongs, when the hash word read is the other write's: safe, the
    /// reader then goes out of place.)
    #[test]
    fn the_hash_accepts_no_torn_or_foreign_in_place_copy() {
        // Plain (not modelled) counters: accepted, torn, foreign copies.
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        let kinds = seen.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let kinds = kinds.clone();
            on_big_stack(move || {
                let cluster = ShmCluster::in_process(1, NODE_SIZE).unwrap();
                let (replica, e1) = setup(&cluster.memory());
                let mem = cluster.memory();
                let writer = loom::thread::spawn(move || {
                    block_on(replica.write(&mem, &layout(), e1, M0.0, M1, &EntryHeader::of(M1, 0, 1, &V1), &V1))
                        .unwrap();
                });
                let snapshot = block_on(read_in_place(&cluster.memory(), replica, &layout())).unwrap();
                let InPlace { meta, hash, value } = snapshot;
                let accepted = inplace_hash(layout().tag, meta, &value) == hash;
                if accepted {
                    assert!(belongs(meta, &value), "in-n-out violated: the hash accepts {value:x?} with {meta:?}");
                }
                let torn = value != V0 && value != V1;
                let kind = if accepted {
                    0
                } else if torn {
                    1
                } else if !belongs(meta, &value) {
                    2
                } else {
                    3
                };
                if let Some(k) = kinds.get(kind) {
                    k.fetch_add(1, Ordering::Relaxed);
                }
                writer.join().unwrap();
            })
        });
        let [accepted, torn, foreign] = [0, 1, 2].map(|k| seen[k].load(Ordering::Relaxed));
        eprintln!(
            "explored {runs} executions: in-place copy accepted in {accepted}, \
             torn in {torn}, of the other write in {foreign}"
        );
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        assert!(accepted > 0, "no execution found a good in-place copy");
        assert!(torn > 0, "no execution saw a torn in-place copy");
        assert!(foreign > 0, "no execution saw a whole in-place copy of the other write");
    }
}
