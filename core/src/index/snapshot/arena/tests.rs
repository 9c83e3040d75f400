use alloc::format;
use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use proptest::prelude::*;

use super::*;
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};
use crate::substrate::late::MIN_LATE_NS;
use crate::substrate::rtt::Counted;
use crate::substrate::space::slab::CLASSES;

/// Bytes of each simulated node.
const NODE: u64 = 1 << 20;
/// The arena of most tests.
const SIZE: u64 = 512 << 10;
/// The chunk of most tests.
const CHUNK: u64 = 4 << 10;

fn nodes(n: usize) -> Vec<NodeId> {
    (0..n as u16).map(NodeId).collect()
}

/// A simulation of `cfg` with `n` nodes, each with a region and an arena
/// of `size` bytes; the arena's sites.
fn setup(cfg: SimConfig, n: usize, size: u64) -> (Sim, Vec<Site>) {
    let mut sim = Sim::new(SimConfig { nodes: n, node_size: NODE, ..cfg });
    let admin = sim.client();
    let sites = sim
        .block_on(async move {
            for node in nodes(n) {
                Region::format_fresh(&admin, node, NODE, 16 << 10).await.unwrap();
            }
            // Something else in the regions first: bases differ per node.
            for node in nodes(n).into_iter().skip(1) {
                let mut r = Region::open(&admin, node).await.unwrap();
                r.alloc_chunks(&admin, node.0 as u64).await.unwrap();
            }
            format(&admin, &nodes(n), size).await.unwrap().to_vec()
        })
        .unwrap();
    (sim, sites)
}

fn quiet(seed: u64) -> SimConfig {
    SimConfig { seed, ..SimConfig::default() }.fixed_latency(1_000)
}

/// Each replica's cursor, read outside of virtual time.
fn cursors(sim: &Sim, sites: &[Site]) -> Vec<u64> {
    sites.iter().map(|s| word_at(&sim.peek(s.node.0 as usize, s.base, 8).unwrap(), 0).unwrap()).collect()
}

fn set_cursor(sim: &mut Sim, site: Site, value: u64) {
    let mem = sim.client();
    sim.block_on(async move { mem.write(RemoteAddr::new(site.node, site.base), &value.to_le_bytes()).await.unwrap() })
        .unwrap();
}

/// The least, over every majority of the replicas, of the majority's
/// highest cursor: what "under every majority's cursor" is under.
fn majority_floor(cursors: &[u64]) -> u64 {
    let mut c = cursors.to_vec();
    c.sort();
    c[majority(c.len()) - 1]
}

/// Format, then claims and blocks on 3 and 5 replicas: consecutive chunks
/// from the header on, at different bases on each node, every cursor at
/// the last claim's end; blocks 64-byte aligned, packed in their chunk.
#[test]
fn format_and_claims_on_3_and_5_replicas() {
    for n in [3, 5] {
        let (mut sim, sites) = setup(quiet(n as u64), n, SIZE);
        let bases: Vec<u64> = sites.iter().map(|s| s.base).collect();
        assert!(bases.windows(2).all(|w| w[0] != w[1]), "{bases:?}");
        let mem = sim.client();
        let s = sites.clone();
        let (claims, blocks, arena) = sim
            .block_on(async move {
                let mut a = Arena::open(&mem, &s, CHUNK, 1).await.unwrap();
                let mut got = Vec::new();
                for _ in 0..3 {
                    got.push(a.claim(&mem).await.unwrap());
                }
                let mut blocks = Vec::new();
                for bytes in [1, 64, 65, 200, CHUNK] {
                    blocks.push(a.alloc(&mem, bytes).await.unwrap());
                }
                (got, blocks, a)
            })
            .unwrap();
        let c = CHUNK;
        assert_eq!(claims, [HEADER..HEADER + c, HEADER + c..HEADER + 2 * c, HEADER + 2 * c..HEADER + 3 * c]);
        let b = HEADER + 2 * c;
        assert_eq!(blocks, [b, b + 64, b + 128, b + 256, HEADER + 3 * c], "the last one takes a new chunk");
        assert_eq!(cursors(&sim, &sites), [HEADER + 4 * c].repeat(n));
        assert_eq!((arena.size(), arena.chunk(), arena.sites()), (SIZE, CHUNK, &sites[..]));
        assert_eq!(arena.addr(1, b, 64), Some(RemoteAddr::new(sites[1].node, sites[1].base + b)));
        assert_eq!(arena.addr(1, 0, 64), None, "the header is no block");
        assert_eq!(arena.addr(1, SIZE - 64, 128), None, "past the arena");
        assert_eq!(arena.addr(n, b, 64), None);
    }
}

/// An uncontended claim is one roundtrip, blocks from the chunk none,
/// opening one.
#[test]
fn an_uncontended_claim_is_one_roundtrip() {
    let (mut sim, sites) = setup(quiet(1), 3, SIZE);
    let mem = sim.client();
    let rtts = sim
        .block_on(async move {
            let c = Counted::new(&mem);
            let mut a = Arena::open(&c, &sites, CHUNK, 1).await.unwrap();
            let mut rtts = Vec::new();
            rtts.push(c.roundtrips());
            for bytes in [CHUNK / 2, CHUNK / 2, 64] {
                c.reset();
                a.alloc(&c, bytes).await.unwrap();
                rtts.push(c.roundtrips());
            }
            c.reset();
            a.claim(&c).await.unwrap();
            rtts.push(c.roundtrips());
            rtts
        })
        .unwrap();
    assert_eq!(rtts, [1, 1, 0, 1, 1], "open; alloc with a claim, from the chunk, with a claim; claim");
}

/// Cursors that diverged (replicas that missed CASes) are caught up by
/// the next claim in its one roundtrip, which takes the chunk after the
/// largest; when they diverged after the client looked, its first try
/// learns them and the second wins.
#[test]
fn diverged_cursors_are_repaired() {
    let (mut sim, sites) = setup(quiet(2), 3, SIZE);
    let c = CHUNK;
    set_cursor(&mut sim, sites[0], HEADER + 3 * c);
    set_cursor(&mut sim, sites[1], HEADER + c);
    let mem = sim.client();
    let s = sites.clone();
    let (first, rtts, a) = sim
        .block_on(async move {
            let counted = Counted::new(&mem);
            let mut a = Arena::open(&mem, &s, CHUNK, 1).await.unwrap();
            let got = a.claim(&counted).await.unwrap();
            (got, counted.roundtrips(), a)
        })
        .unwrap();
    assert_eq!((first, rtts), (HEADER + 3 * c..HEADER + 4 * c, 1));
    assert_eq!(cursors(&sim, &sites), [HEADER + 4 * c; 3]);
    // Behind the client's back: one replica ahead, one behind what it saw.
    set_cursor(&mut sim, sites[1], HEADER + 6 * c);
    set_cursor(&mut sim, sites[2], HEADER + 2 * c);
    let mem = sim.client();
    let (second, rtts) = sim
        .block_on(async move {
            let mut a = a;
            let counted = Counted::new(&mem);
            let got = a.claim(&counted).await.unwrap();
            (got, counted.roundtrips())
        })
        .unwrap();
    assert_eq!((second, rtts), (HEADER + 6 * c..HEADER + 7 * c, 2));
    assert_eq!(cursors(&sim, &sites), [HEADER + 7 * c; 3]);
}

/// A full arena says how full; its last chunk is what is left; a block
/// that does not fit the last chunk is refused with the numbers too.
#[test]
fn a_full_arena_names_the_numbers() {
    let c = 1024;
    let size = HEADER + 2 * c + c / 2;
    let (mut sim, sites) = setup(quiet(3), 3, size);
    let mem = sim.client();
    let s = sites.clone();
    let (claims, full) = sim
        .block_on(async move {
            let mut a = Arena::open(&mem, &s, c, 1).await.unwrap();
            let mut claims = Vec::new();
            for _ in 0..3 {
                claims.push(a.claim(&mem).await.unwrap());
            }
            (claims, a.claim(&mem).await.unwrap_err())
        })
        .unwrap();
    assert_eq!(claims, [HEADER..HEADER + c, HEADER + c..HEADER + 2 * c, HEADER + 2 * c..size]);
    assert_eq!(full, ArenaError::Full { used: size, size });
    assert_eq!(format!("{full}"), "the index arena is full: 2624 of 2624 bytes used");
    assert_eq!(cursors(&sim, &sites), [size; 3]);
    let (mut sim, sites) = setup(quiet(3), 3, size);
    let mem = sim.client();
    let blocks = sim
        .block_on(async move {
            let mut a = Arena::open(&mem, &sites, c, 1).await.unwrap();
            let mut blocks = Vec::new();
            for _ in 0..3 {
                blocks.push(a.alloc(&mem, c).await);
            }
            blocks
        })
        .unwrap();
    let full = Err(ArenaError::Full { used: size, size });
    assert_eq!(blocks, [Ok(HEADER), Ok(HEADER + c), full], "half a chunk left, a chunk asked for");
}

async fn set_cursor_in(mem: &SimMemory, site: Site, value: u64) {
    mem.write(RemoteAddr::new(site.node, site.base), &value.to_le_bytes()).await.unwrap()
}

/// Garbled headers and cursors give errors naming the replica: at open
/// (cursor, magic, size, sizes that differ) and in a claim's CAS replies.
#[test]
fn a_garbled_cursor_is_an_error() {
    let c = CHUNK;
    for (word, value, what) in [
        (0, 65, "cursor outside the arena or not 64-byte aligned"),
        (0, 0, "cursor outside the arena or not 64-byte aligned"),
        (0, SIZE + 64, "cursor outside the arena or not 64-byte aligned"),
        (0, u64::MAX, "cursor outside the arena or not 64-byte aligned"),
        (1, 7, "bad magic (no arena at this site)"),
        (2, 100, "impossible arena size"),
        (2, u64::MAX, "impossible arena size"),
        (2, SIZE * 2, "arena sizes differ between replicas"),
    ] {
        let (mut sim, sites) = setup(quiet(4), 3, SIZE);
        let s = sites[1];
        let mem = sim.client();
        let e = sim
            .block_on(async move {
                mem.write(RemoteAddr::new(s.node, s.base + 8 * word), &u64::to_le_bytes(value)).await.unwrap();
                Arena::open(&mem, &sites, c, 1).await.unwrap_err()
            })
            .unwrap();
        assert_eq!(e, ArenaError::Corrupt { node: NodeId(1), what }, "word {word} = {value}");
    }
    for garbage in [u64::MAX, 65, 8, SIZE + 64] {
        let (mut sim, sites) = setup(quiet(5), 3, SIZE);
        let mem = sim.client();
        let e = sim
            .block_on(async move {
                let mut a = Arena::open(&mem, &sites, c, 1).await.unwrap();
                a.claim(&mem).await.unwrap();
                set_cursor_in(&mem, sites[2], garbage).await;
                a.claim(&mem).await.unwrap_err()
            })
            .unwrap();
        let what = "cursor outside the arena or not 64-byte aligned";
        assert_eq!(e, ArenaError::Corrupt { node: NodeId(2), what }, "{garbage}");
    }
}

/// Bad layouts and sizes are refused before anything is touched.
#[test]
fn bad_layouts_are_refused() {
    let (mut sim, sites) = setup(quiet(6), 3, SIZE);
    let mem = sim.client();
    let out = sim
        .block_on(async move {
            let mut a = Arena::open(&mem, &sites, CHUNK, 1).await.unwrap();
            (
                format(&mem, &nodes(3), 100).await.unwrap_err(),
                format(&mem, &nodes(3), MAX_SIZE + 64).await.unwrap_err(),
                format(&mem, &[], SIZE).await.unwrap_err(),
                Arena::open(&mem, &sites, 100, 1).await.unwrap_err(),
                Arena::open(&mem, &[], CHUNK, 1).await.unwrap_err(),
                Arena::open(&mem, &[Site { base: 8, ..sites[0] }], CHUNK, 1).await.unwrap_err(),
                Arena::open(&mem, &[Site { base: u64::MAX - 63, ..sites[0] }], CHUNK, 1).await.unwrap_err(),
                a.alloc(&mem, 0).await.unwrap_err(),
                a.alloc(&mem, CHUNK + 1).await.unwrap_err(),
                format(&mem, &nodes(3), NODE).await.unwrap_err(),
            )
        })
        .unwrap();
    assert!(matches!(out.0, ArenaError::BadLayout(_)), "{:?}", out.0);
    assert!(matches!(out.1, ArenaError::BadLayout(_)), "{:?}", out.1);
    assert!(matches!(out.2, ArenaError::BadLayout(_)), "{:?}", out.2);
    assert!(matches!(out.3, ArenaError::BadLayout(_)), "{:?}", out.3);
    assert!(matches!(out.4, ArenaError::BadLayout(_)), "{:?}", out.4);
    let what = "arena base not aligned or beyond the address space";
    assert_eq!(
        (out.5, out.6),
        (ArenaError::Corrupt { node: NodeId(0), what }, ArenaError::Corrupt { node: NodeId(0), what })
    );
    assert_eq!((out.7, out.8), (ArenaError::BadSize { size: 0 }, ArenaError::BadSize { size: CHUNK + 1 }));
    assert!(matches!(out.9, ArenaError::Region(RegionError::Exhausted { .. })), "{:?}", out.9);
}

/// The rest of a chunk goes to the id's next holder, who carves on from
/// it without a roundtrip; a carry that cannot be this arena's is refused.
#[test]
fn the_rest_of_a_chunk_is_carried_to_the_next_holder() {
    let (mut sim, sites) = setup(quiet(7), 3, SIZE);
    let mem = sim.client();
    let (carry, next, rtts, refused) = sim
        .block_on(async move {
            let mut a = Arena::open(&mem, &sites, CHUNK, 1).await.unwrap();
            a.alloc(&mem, 100).await.unwrap();
            let carry = a.carried().unwrap();
            let mut b = Arena::open(&mem, &sites, CHUNK, 2).await.unwrap();
            let ok = carry;
            let bad = [
                Carry { class: CLASSES as u8, ..ok },
                Carry { node: NodeId(1), ..ok },
                Carry { bump: ok.bump + 1, ..ok },
                Carry { end: ok.end + CHUNK, ..ok },
                Carry { bump: 0, ..ok },
                Carry { bump: ok.end + 64, ..ok },
                Carry { end: u64::MAX - 63, ..ok },
            ];
            let refused = bad.iter().filter(|&&c| !b.adopt(c)).count();
            assert!(b.adopt(ok));
            let c = Counted::new(&mem);
            let next = b.alloc(&c, 64).await.unwrap();
            (carry, next, c.roundtrips(), (refused, bad.len()))
        })
        .unwrap();
    let c = CHUNK;
    assert_eq!(carry, Carry { node: NodeId(0), class: ARENA_CLASS, bump: HEADER + 128, end: HEADER + c });
    assert_eq!((next, rtts), (HEADER + 128, 0));
    assert_eq!(refused.0, refused.1, "every bad carry is refused");
}

/// How one concurrent run is disturbed.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// A node crashes at a time.
    Crash(usize, u64, CrashMode),
    /// A node stalls from a time for a while (shorter than the time-out).
    Stall(usize, u64, u64),
}

/// What the claimers of one run got.
struct Run {
    /// `(client, range)` of every claim that succeeded.
    owned: Vec<(usize, Range<u64>)>,
    errors: Vec<(usize, ArenaError)>,
    /// Each replica's cursor at the end (a crashed one's as it crashed).
    cursors: Vec<u64>,
}

/// `clients` claimers, each opening the arena at a random time and
/// claiming `claims` chunks of its own size with random pauses (up to
/// `think` ns), on `n` replicas with random latencies (heavy tail
/// included).
fn concurrent(seed: u64, n: usize, clients: usize, claims: usize, think: u64, fault: Fault) -> Run {
    let (mut sim, sites) = setup(SimConfig { seed, ..SimConfig::default() }, n, SIZE);
    match fault {
        Fault::None => {}
        Fault::Crash(node, at, mode) => sim.crash_node_at(node, at, mode),
        Fault::Stall(node, at, ns) => sim.stall_node_at(node, at, ns),
    }
    let owned = Rc::new(RefCell::new(Vec::new()));
    let errors = Rc::new(RefCell::new(Vec::new()));
    for k in 0..clients {
        let m = sim.client();
        let (owned, errors, sites) = (owned.clone(), errors.clone(), sites.clone());
        sim.spawn(&m.clone(), async move {
            m.sleep(m.random(0, think)).await;
            let chunk = 64 * m.random(1, 64);
            let mut a = match Arena::open(&m, &sites, chunk, k as u32).await {
                Ok(a) => a,
                Err(e) => return errors.borrow_mut().push((k, e)),
            };
            for _ in 0..claims {
                match a.claim(&m).await {
                    Ok(r) => owned.borrow_mut().push((k, r)),
                    Err(e) => errors.borrow_mut().push((k, e)),
                }
                m.sleep(m.random(0, think)).await;
            }
        });
    }
    sim.run().unwrap();
    let cursors = cursors(&sim, &sites);
    let owned = owned.borrow().clone();
    let errors = errors.borrow().clone();
    Run { owned, errors, cursors }
}

/// The invariants of any run: owned ranges inside the arena, aligned,
/// pairwise disjoint, and each one under every majority's cursor.
fn check(run: &Run, what: &str) {
    let mut owned = run.owned.clone();
    owned.sort_by_key(|(_, r)| r.start);
    for (k, r) in &owned {
        assert!(r.start >= HEADER && r.end <= SIZE && r.start < r.end, "{what}: client {k} got {r:?}");
        assert!(r.start.is_multiple_of(ALIGN) && r.end.is_multiple_of(ALIGN), "{what}: {r:?}");
    }
    for w in owned.windows(2) {
        assert!(w[0].1.end <= w[1].1.start, "{what}: overlapping ranges {:?} and {:?}", w[0], w[1]);
    }
    // Every owned range's CASes won on a majority, whose cursors only grew
    // since (a crashed node's memory keeps what it applied): at least a
    // majority is at or above the last owned byte, so every majority has a
    // replica there.
    let top = owned.iter().map(|(_, r)| r.end).max().unwrap_or(HEADER);
    let above = run.cursors.iter().filter(|&&c| c >= top).count();
    assert!(above >= majority(run.cursors.len()), "{what}: owned up to {top}, cursors {:?}", run.cursors);
    assert!(majority_floor(&run.cursors) >= top);
}

/// Four claimers, many seeds, random latencies, 3 and 5 replicas: no two
/// own overlapping ranges, every owned range is under every majority's
/// cursor, and every claim succeeds.
#[test]
fn concurrent_claimers_never_own_overlapping_ranges() {
    for seed in 0..150 {
        for n in [3, 5] {
            let run = concurrent(seed, n, 4, 6, 3_000, Fault::None);
            let what = format!("seed {seed}, {n} replicas");
            check(&run, &what);
            assert!(run.errors.is_empty(), "{what}: {:?}", run.errors);
            assert_eq!(run.owned.len(), 24, "{what}");
        }
    }
}

/// Sixteen claimers that claim back to back, with no pause: the random
/// pauses between a claim's tries keep any of them from losing
/// [`MAX_ATTEMPTS`] times in a row, and waste little (each try that no
/// claimer won loses a chunk).
#[test]
fn claimers_back_to_back_all_get_their_chunks() {
    let (mut owned, mut used) = (0, 0);
    for seed in 0..20 {
        for n in [3, 5] {
            let run = concurrent(seed, n, 16, 8, 0, Fault::None);
            let what = format!("seed {seed}, {n} replicas");
            check(&run, &what);
            assert!(run.errors.is_empty(), "{what}: {:?}", run.errors);
            assert_eq!(run.owned.len(), 16 * 8, "{what}");
            owned += run.owned.iter().map(|(_, r)| r.end - r.start).sum::<u64>();
            used += run.cursors.iter().max().unwrap() - HEADER;
        }
    }
    assert!(owned * 10 >= used * 9, "more than a tenth wasted: {owned} owned of {used}");
}

/// A node that crashes (failing fast or hanging) while clients claim does
/// not block their claims once a majority answers, nor break disjointness.
#[test]
fn a_crashed_node_does_not_block_claims() {
    for seed in 0..60 {
        for (n, node) in [(3, 0), (3, 2), (5, 1)] {
            let mode = if seed % 2 == 0 { CrashMode::FailFast } else { CrashMode::Hang };
            let at = seed * 500 % 8_000;
            let run = concurrent(seed, n, 4, 6, 3_000, Fault::Crash(node, at, mode));
            let what = format!("seed {seed}, {n} replicas, node {node} {mode:?} at {at}");
            check(&run, &what);
            assert!(run.errors.is_empty(), "{what}: {:?}", run.errors);
            assert_eq!(run.owned.len(), 24, "{what}");
        }
    }
}

/// A node stalled for less than the time-out while clients claim: claims
/// go on without it, disjoint; its CASes land after the stall, in steps
/// nobody owns.
#[test]
fn a_stalled_node_does_not_block_claims() {
    let timeout = SimConfig::default().timeout_ns;
    for seed in 0..60 {
        for (n, node) in [(3, 1), (5, 0)] {
            let at = seed * 300 % 6_000;
            let run = concurrent(seed, n, 4, 6, 3_000, Fault::Stall(node, at, timeout * 4 / 5));
            let what = format!("seed {seed}, {n} replicas, node {node} stalled at {at}");
            check(&run, &what);
            assert!(run.errors.is_empty(), "{what}: {:?}", run.errors);
            assert_eq!(run.owned.len(), 24, "{what}");
        }
    }
}

/// One claimer and a stalled replica: the claim returns once the replica
/// is late (not at the end of the stall), and the next claim after the
/// stall catches the replica up.
#[test]
fn a_claim_does_not_wait_for_a_stalled_replica() {
    let cfg = quiet(8);
    let stall = cfg.timeout_ns * 4 / 5;
    let (mut sim, sites) = setup(cfg, 3, SIZE);
    let mem = sim.client();
    let s = sites.clone();
    let mut a = sim.block_on(async move { Arena::open(&mem, &s, CHUNK, 1).await.unwrap() }).unwrap();
    sim.stall_node_at(2, sim.now(), stall);
    let mem = sim.client();
    let (a, took, first) = sim
        .block_on(async move {
            let t = mem.now();
            let r = a.claim(&mem).await.unwrap();
            (a, mem.now() - t, r)
        })
        .unwrap();
    assert_eq!(took, MIN_LATE_NS, "late after MIN_LATE_NS, not after the stall of {stall} ns");
    assert_eq!(first, HEADER..HEADER + CHUNK);
    assert_eq!(a.seen(2), Some(HEADER), "what it saw there before");
    let mem = sim.client();
    let (second, after) = sim
        .block_on(async move {
            let mut a = a;
            mem.sleep(stall).await;
            let r = a.claim(&mem).await.unwrap();
            (r, a.seen(2))
        })
        .unwrap();
    // The stalled replica's CAS landed after the stall: it is at the first
    // claim's end, and the second claim finds it there.
    assert_eq!(second, HEADER + CHUNK..HEADER + 2 * CHUNK);
    assert_eq!(after, Some(HEADER + 2 * CHUNK));
    assert_eq!(cursors(&sim, &sites), [HEADER + 2 * CHUNK; 3], "every replica at the last claim's end");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any number of claimers on 1 to 5 replicas, with a minority failed
    /// or stalled at any time: ranges owned are disjoint and under every
    /// majority's cursor.
    #[test]
    fn claims_stay_disjoint(
        seed in any::<u64>(),
        n in prop::sample::select(vec![1usize, 2, 3, 4, 5]),
        clients in 1usize..=5,
        claims in 1usize..=5,
        fault in 0u8..3,
        node in 0usize..5,
        at in 0u64..10_000,
    ) {
        let node = node % n;
        // Only a minority may fail: none of 1 or 2 replicas.
        let fault = match fault {
            _ if n < 3 => Fault::None,
            0 => Fault::None,
            1 => Fault::Crash(node, at, if at % 2 == 0 { CrashMode::FailFast } else { CrashMode::Hang }),
            _ => Fault::Stall(node, at, 40_000),
        };
        let run = concurrent(seed, n, clients, claims, 3_000, fault);
        check(&run, &format!("{fault:?}"));
        prop_assert!(run.errors.is_empty(), "{:?}", run.errors);
    }

    /// Garbage in a replica's header never panics: open or claim answers
    /// an error, or ranges within the arena.
    #[test]
    fn garbage_never_panics(words in prop::collection::vec(any::<u64>(), 3), replica in 0usize..3, small in any::<bool>()) {
        let (mut sim, sites) = setup(quiet(9), 3, SIZE);
        let s = sites[replica];
        let words: Vec<u64> = if small { words.iter().map(|w| w % (2 * SIZE)).collect() } else { words };
        let mem = sim.client();
        let got = sim
            .block_on(async move {
                let mut b = [0u8; 24];
                for (i, w) in words.iter().enumerate() {
                    b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
                }
                mem.write(RemoteAddr::new(s.node, s.base), &b).await.unwrap();
                let mut a = Arena::open(&mem, &sites, CHUNK, 1).await?;
                let r = a.claim(&mem).await?;
                Ok::<_, ArenaError>((r, a.alloc(&mem, 64).await))
            })
            .unwrap();
        if let Ok((r, _)) = got {
            prop_assert!(r.start >= HEADER && r.end <= SIZE, "{r:?}");
        }
    }
}
