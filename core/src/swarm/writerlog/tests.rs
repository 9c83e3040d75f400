use super::*;
use crate::sim::{Sim, SimConfig, SimMemory};
use crate::substrate::space::slab::SlabAllocator;

const NODES: [NodeId; 3] = [NodeId(0), NodeId(1), NodeId(2)];

fn geo() -> LogGeometry {
    LogGeometry::new(64, 16 << 10, 4).unwrap()
}

async fn setup(mem: &SimMemory, nodes: &[NodeId]) {
    for &n in nodes {
        Region::format(mem, n, 1 << 20, 16 << 10).await.unwrap();
        format(mem, n, geo()).await.unwrap();
    }
}

/// What `f` returns, run on a fresh simulator (seed `seed`) whose three
/// nodes are set up.
fn on_nodes<T: 'static, F: Future<Output = T> + 'static>(seed: u64, f: impl FnOnce(SimMemory) -> F + 'static) -> T {
    let mut sim = Sim::new(SimConfig { seed, nodes: 3, node_size: 1 << 20, ..SimConfig::default() });
    let mem = sim.client();
    sim.block_on(async move {
        setup(&mem, &NODES).await;
        f(mem).await
    })
    .unwrap()
}

fn place(segment: u32, slot: u32, start: u64) -> Place {
    Place { segment, slot, start }
}

/// The synchronous lookup a write takes first agrees with `entries`, and
/// answers only what the client already knows.
#[test]
fn cached_entries_answer_only_known_segments_and_agree_with_entries() {
    let out = on_nodes(3, |mem| async move {
        let (mut logs, mut slab) = (Logs::new(), SlabAllocator::new());
        let cached = |logs: &Logs, client, p| {
            let mut out = heapless::Vec::new();
            logs.cached_entries(&NODES, client, p, &mut out).then_some(out)
        };
        let unknown = cached(&logs, 5, place(1, 3, 10));
        let made = logs.entries(&mem, &NODES, 5, place(1, 3, 10), Some(slab.unleased()), NODES.len()).await;
        let made: heapless::Vec<RemoteAddr, MAX_REPLICAS> = made.into_iter().map(|e| e.unwrap().unwrap()).collect();
        let same_segment = cached(&logs, 5, place(1, 4, 10));
        let next_segment = cached(&logs, 5, place(2, 0, 20));
        let other_client = cached(&logs, 6, place(1, 3, 10));
        let beyond = cached(&logs, 5, place(1, geo().per_segment as u32, 10));
        (unknown, made, cached(&logs, 5, place(1, 3, 10)), same_segment, next_segment, other_client, beyond)
    });
    let (unknown, made, cached, same_segment, next_segment, other_client, beyond) = out;
    assert_eq!(unknown, None, "nothing is known before the first lookup");
    assert_eq!(cached.as_ref(), Some(&made), "the cache gives what entries made");
    let next: heapless::Vec<RemoteAddr, MAX_REPLICAS> =
        made.iter().map(|a| RemoteAddr::new(a.node, a.offset + geo().entry_size)).collect();
    assert_eq!(same_segment, Some(next), "the next entry of a known segment");
    assert_eq!((next_segment, other_client, beyond), (None, None, None));
}

/// A write's entry is found by its time: `locate` gives the segment that
/// started last at or before it, on a node the write reached; another
/// client's guess from a stale view names a different entry, whose header
/// says so.
#[test]
fn entries_are_found_by_time_and_checked_by_header() {
    let out = on_nodes(7, |mem| async move {
        let (mut writer, mut slab) = (Logs::new(), SlabAllocator::new());
        // Segment 0 from time 10, segment 1 from time 50, on node 0.
        let (w0, w1) = (Meta::new(12, 2, 5), Meta::new(55, 2, 5));
        for (m, p) in [(w0, place(0, 2, 10)), (w1, place(1, 2, 50))] {
            let e =
                writer.entries(&mem, &NODES[..1], 5, p, Some(slab.unleased()), NODES.len()).await[0].unwrap().unwrap();
            let header = EntryHeader::of(m, 0, 1, b"v");
            mem.write(RemoteAddr::new(e.node, e.offset + 8), &header.encode()).await.unwrap();
        }
        let mut reader = Logs::new();
        let before = reader.guess(NodeId(0), w1);
        let l0 = reader.locate(&mem, NodeId(0), w0).await.unwrap().unwrap();
        let l1 = reader.locate(&mem, NodeId(0), w1).await.unwrap().unwrap();
        let early = reader.locate(&mem, NodeId(0), Meta::new(5, 2, 5)).await.unwrap();
        let elsewhere = reader.locate(&mem, NodeId(1), w1).await.unwrap();
        let read = async |at: RemoteAddr| {
            EntryHeader::decode(&mem.read(RemoteAddr::new(at.node, at.offset + 8), ENTRY_ID_BYTES).await.unwrap())
                .unwrap()
        };
        let (h0, h1) = (read(l0.0).await, read(l1.0).await);
        (before, l0.1, l1.1, early, elsewhere, h0.holds(w0), h1.holds(w1), h1.holds(w0))
    });
    let (before, p0, p1, early, elsewhere, holds0, holds1, cross) = out;
    assert_eq!(before, None, "a reader knows no segment before it looks");
    assert_eq!((p0, p1), (place(0, 2, 10), place(1, 2, 50)));
    assert_eq!(early, None, "no segment that early");
    assert_eq!(elsewhere, None, "node 1 holds no segment of client 5");
    assert!(holds0 && holds1 && !cross);
}

/// Segment numbers are reused, so a guess takes the known segment that
/// started last at or before the write's time, whatever its number (it
/// took the largest number: DM-ABD's reads of values not yet moved home
/// guessed a segment given back long ago and cost 5 roundtrips at p90).
#[test]
fn guesses_take_the_latest_start_not_the_largest_number() {
    let out = on_nodes(9, |mem| async move {
        let (mut writer, mut slab) = (Logs::new(), SlabAllocator::new());
        // Segment 1 from time 10, then segment 0 (a number given back
        // and reused) from time 50, on node 0.
        for p in [place(1, 0, 10), place(0, 0, 50)] {
            writer.entries(&mem, &NODES[..1], 5, p, Some(slab.unleased()), 1).await[0].unwrap().unwrap();
        }
        let mut reader = Logs::new();
        reader.locate(&mem, NodeId(0), Meta::new(12, 3, 5)).await.unwrap().unwrap();
        let (old, new) = (Meta::new(12, 3, 5), Meta::new(55, 3, 5));
        (reader.guess(NodeId(0), old).map(|g| g.1), reader.guess(NodeId(0), new).map(|g| g.1))
    });
    assert_eq!(out.0, Some(place(1, 3, 10)), "before segment 0 started: segment 1");
    assert_eq!(out.1, Some(place(0, 3, 50)), "after: segment 0, which started last");
}

/// A header names its write, whatever its flag; its checksum catches a
/// torn or garbled value.
#[test]
fn headers_name_their_write_and_check_their_value() {
    let w = Meta::new(9, 3, 2);
    let h = EntryHeader::of(w.verify(), 0, 3, b"value");
    let back = EntryHeader::decode(&h.encode()).unwrap();
    assert_eq!(back, h);
    assert!(h.holds(w) && h.holds(w.verify()));
    assert!(!h.holds(Meta::new(9, 3, 3)) && !h.holds(Meta::new(10, 3, 2)) && !h.holds(Meta::BOTTOM));
    assert!(h.checks(0, b"value"));
    assert!(!h.checks(0, b"valuf") && !h.checks(0, b"valu"));
    assert!(!h.checks(1, b"value"), "another object's tag");
    assert!(EntryHeader::decode(&[0; ENTRY_ID_BYTES - 1]).is_none());
}

/// Directory words no client wrote give `Corrupt` errors: never an
/// overflow (a panic in debug builds) or an address that wrapped.
#[test]
fn corrupt_directories_are_errors() {
    let mut sim = Sim::new(SimConfig { seed: 4, nodes: 2, node_size: 1 << 20, ..SimConfig::default() });
    let mem = sim.client();
    let (huge_entries, wrapping_segment, reused) = sim
        .block_on(async move {
            setup(&mem, &NODES[..2]).await;
            let word = async |node, off: u64, value: u64| {
                let base = Region::read_root(&mem, node, roots::LOG_DIR).await.unwrap();
                mem.write(RemoteAddr::new(node, base + off), &value.to_le_bytes()).await.unwrap();
            };
            // Node 0: an entry size no geometry has.
            word(NodeId(0), 8, 1 << 62).await;
            // Node 1: client 5's first segment at the end of the address space.
            word(NodeId(1), geo().descriptor(5, 0), 1).await;
            word(NodeId(1), geo().descriptor(5, 0) + 8, u64::MAX - 64).await;
            let mut logs = Logs::new();
            let m = Meta::new(3, 1, 5);
            let a = logs.locate(&mem, NodeId(0), m).await;
            let b = logs.locate(&mem, NodeId(1), m).await;
            // Client 6: segment 1 starts before segment 0 (segment 0 was
            // recycled and started again), segment 2 is given back.
            for (s, start, at) in [(0, 100, 8192), (1, 50, 16384), (2, FREE, 24576)] {
                word(NodeId(1), geo().descriptor(6, s), start).await;
                word(NodeId(1), geo().descriptor(6, s) + 8, at).await;
            }
            let times = [120, 99, 40].map(|t| Meta::new(t, 1, 6));
            let mut found = alloc::vec::Vec::new();
            for m in times {
                found.push(logs.locate(&mem, NodeId(1), m).await.map(|f| f.map(|(_, p)| (p.segment, p.start))));
            }
            (a, b, found)
        })
        .unwrap();
    assert!(matches!(huge_entries, Err(LogError::Corrupt { what: "impossible geometry", .. })), "{huge_entries:?}");
    let beyond = Err(LogError::Corrupt { node: NodeId(1), what: "segment beyond the address space" });
    assert_eq!(wrapping_segment, beyond);
    assert_eq!(reused, [Ok(Some((0, 100))), Ok(Some((1, 50))), Ok(None)], "the latest start at or before the time");
}

/// Two processes that create one segment on a node at once agree on it.
#[test]
fn concurrent_creations_agree() {
    let mut sim = Sim::new(SimConfig { seed: 11, nodes: 3, node_size: 1 << 20, ..SimConfig::default() });
    let admin = sim.client();
    sim.block_on(async move { setup(&admin, &NODES).await }).unwrap();
    let found = alloc::rc::Rc::new(core::cell::RefCell::new(alloc::vec::Vec::new()));
    for _ in 0..3 {
        let m = sim.client();
        let found = found.clone();
        sim.spawn(&m.clone(), async move {
            let (mut logs, mut slab) = (Logs::new(), SlabAllocator::new());
            let got = logs.entries(&m, &NODES, 9, place(0, 1, 7), Some(slab.unleased()), NODES.len()).await;
            let got: alloc::vec::Vec<RemoteAddr> = got.into_iter().map(|e| e.unwrap().unwrap()).collect();
            found.borrow_mut().push(got);
        });
    }
    sim.run().unwrap();
    let found = found.borrow();
    assert_eq!(found.len(), 3);
    assert!(found.iter().all(|f| *f == found[0]), "{found:?}");
}

/// `usage` counts, per node, the segments in use and those given back,
/// and the client ids holding any; a node whose segment was not created
/// there counts nothing for it.
#[test]
fn usage_counts_segments_in_use_and_given_back() {
    let usage = on_nodes(5, |mem| async move {
        let (mut logs, mut slab) = (Logs::new(), SlabAllocator::new());
        let fresh = logs.usage(&mem, NodeId(0)).await.unwrap();
        for (client, segment, nodes) in [(5, 0, &NODES[..]), (5, 1, &NODES[..]), (9, 0, &NODES[..1])] {
            for e in logs.entries(&mem, nodes, client, place(segment, 0, 10), Some(slab.unleased()), nodes.len()).await
            {
                e.unwrap().unwrap();
            }
        }
        logs.mark_free(&mem, NodeId(0), 5, 1).await.unwrap();
        let mut out = [fresh; 4];
        for (n, &node) in NODES.iter().enumerate() {
            out[n + 1] = logs.usage(&mem, node).await.unwrap();
        }
        out
    });
    assert_eq!(usage[0], LogUsage::default(), "a fresh node");
    assert_eq!(usage[1], LogUsage { in_use: 2, free: 1, ids: 2 }, "node 0: 5's two, one given back; 9's");
    assert_eq!(usage[2], LogUsage { in_use: 2, free: 0, ids: 1 }, "node 1: 5's two");
    assert_eq!(usage[3], usage[2]);
}

/// A segment is an object of the slab's class for its bytes: on a chunk
/// that is not a power of two it holds fewer entries, so that its class
/// fits, rather than being refused; on a power of two it fills the chunk.
#[test]
fn segments_take_a_class_that_fits_the_chunk() {
    for chunk in [12 << 10, 36 << 10, 64 << 10, 100 << 10] {
        let g = LogGeometry::new(1024, chunk, 4).unwrap();
        let (_, obj) = class_of(g.per_segment * g.entry_size).unwrap();
        assert!(obj <= chunk, "{chunk}: {} entries take {obj} B", g.per_segment);
        // One entry more would not fit (or would pass the cap).
        let more = class_of((g.per_segment + 1) * g.entry_size).unwrap().1;
        assert!(more > chunk || g.per_segment == MAX_PER_SEGMENT, "{chunk}: room for more than {}", g.per_segment);
    }
    let g = LogGeometry::new(1024, 64 << 10, 4).unwrap();
    assert_eq!(g.per_segment, (64 << 10) / g.entry_size);
}

/// What a node reports reclaimable is the segments given back, each the
/// slab object it took (a quarter of a chunk here), not a chunk each.
#[test]
fn given_back_segments_count_their_own_bytes() {
    let small = LogGeometry::new(64, 4 << 10, 4).unwrap();
    assert_eq!(small.segment_bytes(), 4 << 10);
    let mut sim = Sim::new(SimConfig { nodes: 1, node_size: 1 << 20, ..SimConfig::default() });
    let mem = sim.client();
    let memory = sim
        .block_on(async move {
            Region::format(&mem, NodeId(0), 1 << 20, 16 << 10).await.unwrap();
            format(&mem, NodeId(0), small).await.unwrap();
            let (mut logs, mut slab) = (Logs::new(), SlabAllocator::new());
            for segment in 0..2 {
                for e in logs.entries(&mem, &NODES[..1], 5, place(segment, 0, 10), Some(slab.unleased()), 1).await {
                    e.unwrap().unwrap();
                }
            }
            logs.mark_free(&mem, NodeId(0), 5, 1).await.unwrap();
            logs.memory(&mem, NodeId(0)).await.unwrap()
        })
        .unwrap();
    assert_eq!(memory.log, LogUsage { in_use: 1, free: 1, ids: 1 });
    assert_eq!(memory.reclaimable, 4 << 10, "one segment of 4 KiB given back");
}
