//! Clover's chain (`swarm_core::systems::clover`, pDPM §5) under loom: the
//! reads of a get racing the writes that extend a key's chain, and the
//! write of a recycled buffer's next incarnation (pDPM §5.2).
//!
//! - Two writers link their versions after the same tail, each by the
//!   client's CAS of the tail's header word, hopping to the version that
//!   beat it: both are linked, once each, and a get walking the chain meanwhile
//!   returns a whole version (the first or one of theirs), never a torn
//!   one, and never finds a linked version that is not whole.
//! - A buffer that the metadata server freed and handed out again is
//!   written by its new owner (GC version 2) and linked after the key's
//!   tail, while a get holds a cursor of its old incarnation (GC version
//!   1). The get never returns the new incarnation's bytes before they are
//!   linked: the reader's check of the GC version
//!   (`buffer::decode_incarnation`) turns them into a restart. A reader
//!   that skips it is caught, as is the core's mutant `clover-no-gcver`
//!   (`scripts/mutants.sh`).
//!
//! Reads and writes of the shared-memory backend are word by word, so
//! loom explores every way a READ can be torn by a WRITE. The get's walk
//! and the write's commit loop are restated here (`walk`, `commit`: the
//! client's are woven into its cache, the key's cell and its clock); what
//! is the core's own is every decision on the bytes read: the buffer and
//! header codecs and the GC version check, `buffer::decode_incarnation`,
//! which the client's get calls.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use loom::sync::atomic::AtomicBool;
    use swarm_backend_shm::{ShmCluster, ShmMemory};
    use swarm_core::kv::place::key_hash;
    use swarm_core::substrate::exec::block_on;
    use swarm_core::systems::clover::buffer::{self, Version};
    use swarm_core::systems::clover::header::{self, Cursor, Next};
    use swarm_core::{Memory, NodeId, RemoteAddr};
    use swarm_loom_tests::{decode_any_incarnation, explore_bounded};

    const NODES: usize = 1;
    const KEY: &[u8] = b"k";
    const MAX_VALUE: usize = 8;
    /// Every buffer is of the smallest class (64 bytes: 24 of header, the
    /// key and the value).
    const CLASS: u8 = 0;
    /// Preemptions per execution: enough for a READ of one buffer (8
    /// words) torn by a WRITE of its version (5), with room to spare.
    const PREEMPTIONS: Option<usize> = Some(3);

    const V0: [u8; 8] = [0x10; 8];
    const V1: [u8; 8] = [0x11; 8];
    const V2: [u8; 8] = [0x12; 8];

    type Decode = fn(&[u8], &[u8], u64, u8, usize, usize) -> Option<Version>;

    fn tag() -> u64 {
        key_hash(KEY)
    }

    fn at(offset: u64, gc: u8) -> Cursor {
        Cursor::new(RemoteAddr::new(NodeId(0), offset), gc, CLASS)
    }

    /// What a get's walk from a cursor ends with.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Found {
        /// The value of the tail it reached, and that tail.
        Value(Vec<u8>, Cursor),
        /// A buffer that is not the cursor's incarnation (or not whole):
        /// the get starts again from the key's head.
        Restart,
    }

    /// A get's walk (`CloverClient::get_value` without its cache, cell and
    /// clock): READ the cursor's buffer, check it is the incarnation the
    /// cursor expects with `decode`, return a tail's value, hop a link.
    fn walk(mem: &ShmMemory, mut at: Cursor, decode: Decode) -> Found {
        for _ in 0..4 {
            let b = block_on(mem.read(at.at, at.bytes())).unwrap();
            let Some(v) = decode(&b, KEY, tag(), at.gc, NODES, MAX_VALUE) else { return Found::Restart };
            match v.next {
                Next::Tail(_) => return Found::Value(b[v.value].to_vec(), at),
                Next::Link(next) => at = next,
                Next::Deleted(_) => panic!("clover violated: a deletion nobody wrote"),
            }
        }
        panic!("clover violated: a chain longer than what was written");
    }

    /// A write's commit as the client does it (`CloverClient::change`):
    /// the version's bytes first, then the CAS of the tail's header word
    /// from the tail word of the cursor's GC version to the link, hopping
    /// to the link the CAS found if another version won. Returns the
    /// version it was linked after.
    fn commit(mem: &ShmMemory, mut after: Cursor, new: Cursor, value: &[u8]) -> Cursor {
        block_on(mem.write(new.at, &buffer::encode(KEY, value, tag(), new.gc))).unwrap();
        loop {
            let expect = Next::Tail(after.gc).word(tag());
            let prev = block_on(mem.cas(after.at, expect, Next::Link(new).word(tag()))).unwrap();
            if prev == expect {
                return after;
            }
            match header::decode(prev, tag(), NODES) {
                Some(Next::Link(next)) => after = next,
                other => panic!("clover violated: the commit's CAS found {other:?}"),
            }
        }
    }

    /// Two writers extend the chain from A (V0) with B (V1) and C (V2)
    /// while a get walks it from A.
    #[test]
    fn racing_writers_are_both_linked_and_a_get_reads_whole_versions() {
        // Executions in which the get returned V0, V1, V2.
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        let counts = seen.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let (a, b, c) = (at(64, 1), at(128, 1), at(192, 1));
            let cluster = ShmCluster::in_process(1, 256).unwrap();
            block_on(cluster.memory().write(a.at, &buffer::encode(KEY, &V0, tag(), 1))).unwrap();
            let mem = cluster.memory();
            let first = loom::thread::spawn(move || commit(&mem, a, b, &V1));
            let mem = cluster.memory();
            let second = loom::thread::spawn(move || commit(&mem, a, c, &V2));
            let got = walk(&cluster.memory(), a, buffer::decode_incarnation);
            let (after_b, after_c) = (first.join().unwrap(), second.join().unwrap());
            let Found::Value(v, _) = got else { panic!("clover violated: a linked version was not whole") };
            let i = [V0, V1, V2].iter().position(|x| *x == v[..]);
            let i = i.unwrap_or_else(|| panic!("clover violated: the get returned {v:x?}"));
            counts[i].fetch_add(1, Ordering::Relaxed);
            // One after A, the other after it: a chain of three links.
            let last = match (after_b == a, after_c == a) {
                (true, false) if after_c == b => V2,
                (false, true) if after_b == c => V1,
                _ => panic!("clover violated: B linked after {after_b:?}, C after {after_c:?}"),
            };
            let end = if last == V2 { c } else { b };
            assert_eq!(walk(&cluster.memory(), a, buffer::decode_incarnation), Found::Value(last.to_vec(), end));
        });
        let seen = [0, 1, 2].map(|i| seen[i].load(Ordering::Relaxed));
        eprintln!("explored {runs} executions; the get returned V0, V1, V2 in {seen:?}");
        assert!(seen.iter().all(|&n| n > 0), "loom missed an outcome of the get: {seen:?}");
    }

    /// A's version (V0, GC version 1) was superseded by B (V1, the tail)
    /// and A freed; its new owner writes V2 into it (GC version 2) and
    /// links it after B, while a get walks from a cursor of A's old
    /// incarnation. Returns how many executions restarted, and how many
    /// returned V1 and V2.
    fn recycle(decode: Decode) -> [usize; 3] {
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        let counts = seen.clone();
        let runs = explore_bounded(PREEMPTIONS, move || {
            let (old, b, new) = (at(64, 1), at(128, 1), at(64, 2));
            let cluster = ShmCluster::in_process(1, 256).unwrap();
            let mem = cluster.memory();
            block_on(mem.write(b.at, &buffer::encode(KEY, &V1, tag(), 1))).unwrap();
            let mut a = buffer::encode(KEY, &V0, tag(), 1);
            a[..8].copy_from_slice(&Next::Link(b).word(tag()).to_le_bytes());
            block_on(mem.write(old.at, &a)).unwrap();
            // Set before the CAS that links V2: a get that returns V2 with
            // it unset returned bytes that were not linked yet.
            let linking = Arc::new(AtomicBool::new(false));
            let flag = linking.clone();
            let writer = loom::thread::spawn(move || {
                block_on(mem.write(new.at, &buffer::encode(KEY, &V2, tag(), 2))).unwrap();
                flag.store(true, loom::sync::atomic::Ordering::SeqCst);
                let expect = Next::Tail(b.gc).word(tag());
                let prev = block_on(mem.cas(b.at, expect, Next::Link(new).word(tag()))).unwrap();
                assert_eq!(prev, expect, "nobody else writes");
            });
            let got = walk(&cluster.memory(), old, decode);
            let i = match got {
                Found::Restart => 0,
                Found::Value(v, at) if v == V1 && at == b => 1,
                // V2 only through B's link, to the new incarnation: never
                // from the old one's cursor, and never before it is linked.
                Found::Value(v, at) if v == V2 => {
                    assert!(
                        at == new && linking.load(loom::sync::atomic::Ordering::SeqCst),
                        "clover violated: a recycled buffer's next incarnation was returned before it was linked \
                         (through {at:?})"
                    );
                    2
                }
                Found::Value(v, at) => panic!("clover violated: the get returned {v:x?} from {at:?}"),
            };
            writer.join().unwrap();
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        let seen = [0, 1, 2].map(|i| seen[i].load(Ordering::Relaxed));
        eprintln!("explored {runs} executions; the get restarted, returned V1, V2 in {seen:?}");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
        seen
    }

    #[test]
    fn a_cursor_of_a_recycled_buffer_never_reads_its_next_incarnation() {
        let seen = recycle(buffer::decode_incarnation);
        assert!(seen.iter().all(|&n| n > 0), "loom missed an outcome of the get: {seen:?}");
    }

    /// The check can fail: a reader that takes any incarnation returns V2
    /// from A before B links it.
    #[test]
    #[should_panic(expected = "next incarnation was returned before it was linked")]
    fn a_reader_skipping_the_gc_version_is_caught() {
        recycle(decode_any_incarnation);
    }
}
