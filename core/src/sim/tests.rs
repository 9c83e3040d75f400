//! The simulator's own guarantees: determinism, overlap, torn transfers,
//! ordered pipelines, crashes.

use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use super::*;
use crate::substrate::join::join2;
use crate::substrate::quorum::{majority, quorum};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::Region;
use crate::substrate::space::slab::SlabAllocator;
use crate::{MemErrorKind, Memory, NodeId, Op, RemoteAddr};

fn addr(node: u16, offset: u64) -> RemoteAddr {
    RemoteAddr::new(NodeId(node), offset)
}

/// Three clients hammer one word with CAS increments and write/read a
/// buffer; returns what the clients observed plus the run's digest.
fn contended_run(seed: u64) -> (Vec<(u32, u64, u64)>, u64) {
    let mut sim = Sim::new(SimConfig { seed, ..SimConfig::default() });
    let log = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..3 {
        let c = sim.client();
        let (mem, log) = (c.clone(), log.clone());
        sim.spawn(&c, async move {
            for i in 0..20u64 {
                let mut cur = 0;
                loop {
                    let prev = mem.cas(addr(0, 0), cur, cur + 1).await.unwrap();
                    if prev == cur {
                        break;
                    }
                    cur = prev;
                }
                mem.write(addr(1, 64), &[i as u8; 32]).await.unwrap();
                let b = mem.read(addr(1, 64), 32).await.unwrap();
                log.borrow_mut().push((mem.id(), mem.now(), cur * 1000 + b[0] as u64));
            }
        });
    }
    let stats = sim.run().unwrap();
    assert_eq!(sim.peek(0, 0, 8).unwrap(), 60u64.to_le_bytes(), "no increment may be lost");
    let out = log.borrow().clone();
    (out, stats.digest)
}

#[test]
fn same_seed_same_history() {
    let (h1, d1) = contended_run(42);
    let (h2, d2) = contended_run(42);
    assert_eq!(h1, h2);
    assert_eq!(d1, d2);
}

#[test]
fn different_seeds_different_interleavings() {
    let digests: Vec<u64> = (0..8).map(|s| contended_run(s).1).collect();
    let mut uniq = digests.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert!(uniq.len() >= 7, "seeds should explore different schedules: {digests:?}");
    let histories: Vec<_> = (0..4).map(|s| contended_run(s).0).collect();
    assert!(histories.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn ops_posted_together_overlap() {
    let mut sim = Sim::new(SimConfig::default().fixed_latency(1_000));
    let mem = sim.client();
    let (rtts, elapsed) = sim
        .block_on(async move {
            let c = Counted::new(&mem);
            let t0 = mem.now();
            let (a, b) = join2(c.write(addr(0, 0), &[1; 8]), c.write(addr(1, 0), &[2; 8])).await;
            a.unwrap();
            b.unwrap();
            let futs = (0..3).map(|n| c.read(addr(n, 0), 8)).collect();
            assert!(quorum(futs, majority(3)).await.reached(2));
            c.pipeline(
                NodeId(2),
                &[Op::Write { offset: 8, data: &[3; 8] }, Op::Cas { offset: 0, expected: 0, new: 1 }],
            )
            .await
            .unwrap();
            (c.roundtrips(), mem.now() - t0)
        })
        .unwrap();
    assert_eq!(rtts, 3, "join, quorum and pipeline are one roundtrip each");
    assert_eq!(elapsed, 3_000, "overlapping ops cost one latency, not one each");
}

/// Counting costs a few words per operation, not a second copy of it: the
/// harness counts every benchmark operation, and each replica's future of a
/// quorum is boxed, so its size is paid on every operation.
#[test]
fn counted_operations_are_not_twice_as_large() {
    let mut sim = Sim::new(SimConfig::default());
    let mem = sim.client();
    let c = Counted::new(&mem);
    let ops = [Op::Cas { offset: 0, expected: 0, new: 1 }];
    let plain = size_of_val(&mem.pipeline(NodeId(0), &ops));
    let counted = size_of_val(&c.pipeline(NodeId(0), &ops));
    assert!(counted <= plain + 32, "a counted pipeline takes {counted} bytes, a plain one {plain}");
    let plain = size_of_val(&mem.read(addr(0, 0), 8));
    let counted = size_of_val(&c.read(addr(0, 0), 8));
    assert!(counted <= plain + 32, "a counted read takes {counted} bytes, a plain one {plain}");
}

#[test]
fn sequential_ops_count_one_roundtrip_each() {
    let mut sim = Sim::new(SimConfig::default());
    let mem = sim.client();
    let rtts = sim
        .block_on(async move {
            let c = Counted::new(&mem);
            c.write(addr(0, 0), &[1; 8]).await.unwrap();
            c.read(addr(0, 0), 8).await.unwrap();
            c.post_background(NodeId(1), &[Op::Write { offset: 0, data: &[5; 8] }]);
            c.cas(addr(0, 0), 0, 1).await.unwrap();
            c.roundtrips()
        })
        .unwrap();
    assert_eq!(rtts, 3, "background posts do not count");
}

#[test]
fn crashed_node_fails_fast_or_hangs_until_timeout() {
    for (mode, kind) in [(CrashMode::FailFast, MemErrorKind::Unreachable), (CrashMode::Hang, MemErrorKind::TimedOut)] {
        let cfg = SimConfig::default().fixed_latency(1_000);
        let timeout = cfg.timeout_ns;
        let mut sim = Sim::new(cfg);
        sim.crash_node_at(1, 0, mode);
        let mem = sim.client();
        let (err, ok, elapsed) = sim
            .block_on(async move {
                let t0 = mem.now();
                let err = mem.read(addr(1, 0), 8).await.unwrap_err();
                let elapsed = mem.now() - t0;
                let ok = mem.read(addr(0, 0), 8).await.is_ok();
                (err, ok, elapsed)
            })
            .unwrap();
        assert_eq!(err.kind, kind);
        assert_eq!(err.node, NodeId(1));
        assert!(ok, "other nodes keep serving");
        let expected = if mode == CrashMode::Hang { timeout } else { 1_000 };
        assert_eq!(elapsed, expected);
    }
}

#[test]
fn stalled_node_applies_late_or_times_out() {
    let cfg = SimConfig::default().fixed_latency(1_000);
    let timeout = cfg.timeout_ns;
    let mut sim = Sim::new(cfg);
    // Short stall: the write waits it out and lands.
    sim.stall_node_at(1, 0, 10_000);
    // Long stall from 20 µs: the next write times out, and still lands after.
    sim.stall_node_at(1, 20_000, 4 * timeout);
    let mem = sim.client();
    let probe = sim.client();
    let (first, second, during, elapsed) = sim
        .block_on(async move {
            let t0 = mem.now();
            let first = mem.write(addr(1, 0), &[1; 8]).await;
            let first_at = mem.now() - t0;
            mem.sleep(20_000 - mem.now()).await;
            let t1 = mem.now();
            let second = mem.write(addr(1, 8), &[2; 8]).await;
            let during = probe.read(addr(1, 8), 8).await;
            (first.map(|_| first_at), second.map(|_| mem.now() - t1), during, mem.now())
        })
        .unwrap();
    let first = first.unwrap();
    assert!((10_000..=11_000).contains(&first), "answered once the stall ended: {first}");
    assert_eq!(second.unwrap_err().kind, MemErrorKind::TimedOut);
    assert_eq!(during.unwrap_err().kind, MemErrorKind::TimedOut);
    assert!(elapsed < 20_000 + 4 * timeout);
    let idle = sim.client();
    sim.block_on(async move { idle.sleep(5 * timeout).await }).unwrap();
    assert_eq!(sim.peek(1, 8, 8).unwrap(), vec![2; 8], "a timed-out write still lands when the node resumes");
    assert_eq!(sim.in_flight(), 0);
}

#[test]
fn crash_during_an_operation_fails_it() {
    let mut sim = Sim::new(SimConfig::default().fixed_latency(1_000));
    sim.crash_node_at(0, 200, CrashMode::FailFast);
    let mem = sim.client();
    let r = sim.block_on(async move { mem.write(addr(0, 0), &[1; 8]).await }).unwrap();
    assert_eq!(r.unwrap_err().kind, MemErrorKind::Unreachable);
    assert_eq!(sim.peek(0, 0, 8).unwrap(), vec![0; 8], "a write that reached a dead node is not applied");
}

#[test]
fn bad_requests_fail_at_once_without_panicking() {
    let mut sim = Sim::new(SimConfig { node_size: 4096, ..SimConfig::default() });
    let mem = sim.client();
    let kinds = sim
        .block_on(async move {
            let mut v = Vec::new();
            v.push(mem.read(addr(0, 4090), 8).await.unwrap_err().kind);
            v.push(mem.read(addr(7, 0), 8).await.unwrap_err().kind);
            v.push(mem.cas(addr(0, 4), 0, 1).await.unwrap_err().kind);
            v.push(mem.write(addr(0, u64::MAX), &[1]).await.unwrap_err().kind);
            v.push(mem.pipeline(NodeId(0), &[]).await.unwrap_err().kind);
            v
        })
        .unwrap();
    assert!(matches!(kinds[0], MemErrorKind::OutOfBounds { offset: 4090, len: 8 }));
    assert_eq!(kinds[1], MemErrorKind::NoSuchNode);
    assert_eq!(kinds[2], MemErrorKind::Misaligned { offset: 4 });
    assert!(matches!(kinds[3], MemErrorKind::OutOfBounds { .. }));
    assert_eq!(kinds[4], MemErrorKind::BadPipeline { len: 0 });
}

/// A writer replaces a 256-byte buffer of equal bytes; a reader that reads
/// concurrently must sometimes see two different byte values (non-atomic
/// READ/WRITE, §2.1), but only values that were written.
#[test]
fn long_transfers_tear() {
    let mut torn = 0;
    for seed in 0..200 {
        let mut sim = Sim::new(SimConfig { seed, max_piece_gap_ns: 1_000, ..SimConfig::default() });
        let (w, r) = (sim.client(), sim.client());
        sim.spawn(&w.clone(), async move {
            for v in 1..=4u8 {
                w.write(addr(0, 0), &[v; 256]).await.unwrap();
            }
        });
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s = seen.clone();
        sim.spawn(&r.clone(), async move {
            for _ in 0..4 {
                let b = r.read(addr(0, 0), 256).await.unwrap();
                s.borrow_mut().push(b);
            }
        });
        sim.run().unwrap();
        for b in seen.borrow().iter() {
            assert!(b.iter().all(|&x| x <= 4));
            if b.iter().any(|&x| x != b[0]) {
                torn += 1;
            }
        }
    }
    assert!(torn > 0, "the simulator never produced a torn read");
}

/// Ordered pipeline: whoever sees the CAS sees the write before it.
#[test]
fn pipelined_write_is_visible_before_the_cas() {
    for seed in 0..200 {
        let mut sim = Sim::new(SimConfig { seed, max_piece_gap_ns: 1_000, ..SimConfig::default() });
        let (w, r) = (sim.client(), sim.client());
        sim.spawn(&w.clone(), async move {
            for v in 1..=5u64 {
                let data = [v as u8; 128];
                w.pipeline(
                    NodeId(0),
                    &[Op::Write { offset: 64, data: &data }, Op::Cas { offset: 0, expected: v - 1, new: v }],
                )
                .await
                .unwrap();
            }
        });
        sim.spawn(&r.clone(), async move {
            for _ in 0..10 {
                let meta = crate::substrate::memory::read_word(&r, addr(0, 0)).await.unwrap();
                let data = r.read(addr(0, 64), 128).await.unwrap();
                assert!(data.iter().all(|&b| b as u64 >= meta), "seed {seed}: CAS visible before its data");
            }
        });
        sim.run().unwrap();
    }
}

#[test]
fn client_crash_drops_its_task_and_may_cut_its_writes() {
    let mut partial = 0;
    let mut whole = 0;
    for seed in 0..100 {
        let mut sim = Sim::new(SimConfig { seed, max_piece_gap_ns: 500, ..SimConfig::default() });
        let (w, other) = (sim.client(), sim.client());
        let done = Rc::new(RefCell::new(false));
        let d = done.clone();
        let wm = w.clone();
        sim.spawn(&w, async move {
            wm.write(addr(0, 0), &[9; 512]).await.unwrap();
            *d.borrow_mut() = true;
        });
        sim.crash_client_at(&w, 600);
        sim.spawn(&other.clone(), async move { other.sleep(100_000).await });
        sim.run().unwrap();
        assert!(!*done.borrow(), "a crashed client's task must not continue");
        let b = sim.peek(0, 0, 512).unwrap();
        assert!(b.iter().all(|&x| x == 0 || x == 9));
        if b.iter().all(|&x| x == 9) {
            whole += 1;
        } else if b.contains(&9) {
            partial += 1;
        }
    }
    assert!(partial > 0 && whole > 0, "crashes should leave both whole and cut writes ({partial} / {whole})");
}

#[test]
fn stuck_tasks_are_reported() {
    let mut sim = Sim::new(SimConfig::default());
    let c = sim.client();
    sim.spawn(&c, core::future::pending());
    assert!(matches!(sim.run(), Err(SimError::Stuck { tasks: 1, .. })));
}

#[test]
fn livelocks_hit_the_time_limit() {
    let mut sim = Sim::new(SimConfig { time_limit_ns: 1_000_000, ..SimConfig::default() });
    let c = sim.client();
    let m = c.clone();
    sim.spawn(&c, async move {
        loop {
            let _ = m.read(addr(0, 0), 8).await;
        }
    });
    assert!(matches!(sim.run(), Err(SimError::TimeLimit { tasks: 1 })));
}

#[test]
fn regions_hand_out_disjoint_chunks_to_concurrent_clients() {
    let mut sim = Sim::new(SimConfig { node_size: 4096 + 16 * 4096, ..SimConfig::default() });
    let admin = sim.client();
    sim.block_on(async move { Region::format(&admin, NodeId(0), 4096 + 16 * 4096, 4096).await.unwrap() }).unwrap();
    let got = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..3 {
        let c = sim.client();
        let (m, got) = (c.clone(), got.clone());
        sim.spawn(&c, async move {
            let mut region = Region::open(&m, NodeId(0)).await.unwrap();
            loop {
                match region.alloc_chunk(&m).await {
                    Ok(a) => got.borrow_mut().push(a.offset),
                    Err(crate::substrate::space::region::RegionError::Exhausted { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }
    sim.run().unwrap();
    let mut got = got.borrow().clone();
    got.sort_unstable();
    let want: Vec<u64> = (0..16).map(|i| 4096 + i * 4096).collect();
    assert_eq!(got, want, "every chunk handed out exactly once");
}

#[test]
fn slab_allocates_without_roundtrips_in_the_common_case() {
    let mut sim = Sim::new(SimConfig::default());
    let admin = sim.client();
    let size = SimConfig::default().node_size;
    sim.block_on(async move { Region::format(&admin, NodeId(1), size, 64 * 1024).await.unwrap() }).unwrap();
    let mem = sim.client();
    let (first, rest, addrs) = sim
        .block_on(async move {
            let mut slab = SlabAllocator::new();
            let c = Counted::new(&mem);
            let a = slab.alloc(&c, NodeId(1), 100).await.unwrap();
            let first = c.roundtrips();
            c.reset();
            let mut addrs = vec![a];
            for _ in 0..100 {
                addrs.push(slab.alloc(&c, NodeId(1), 100).await.unwrap());
            }
            slab.free(addrs[3], 100);
            let again = slab.alloc(&c, NodeId(1), 100).await.unwrap();
            assert_eq!(again, addrs[3], "freed objects are reused");
            assert!(slab.alloc(&c, NodeId(1), 0).await.is_err());
            assert!(slab.alloc(&c, NodeId(1), 1 << 20).await.is_err());
            (first, c.roundtrips(), addrs)
        })
        .unwrap();
    assert_eq!(first, 2, "open the region, then take a chunk");
    assert_eq!(rest, 0, "100 more objects fit in the chunk");
    let mut offs: Vec<u64> = addrs.iter().map(|a| a.offset).collect();
    offs.sort_unstable();
    assert!(offs.windows(2).all(|w| w[1] - w[0] >= 128), "objects must not overlap");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any address, length and alignment gives a result or an error,
        /// never a panic or an access outside the node.
        #[test]
        fn random_requests_never_panic(node in 0u16..5, offset in any::<u64>(), small in 0u64..5000, len in 0usize..10_000, cas_off in 0u64..5000) {
            let mut sim = Sim::new(SimConfig { nodes: 3, node_size: 4096, ..SimConfig::default() });
            let mem = sim.client();
            sim.block_on(async move {
                let data = vec![7u8; len];
                for off in [offset, small] {
                    let a = addr(node, off);
                    let ok = (node as usize) < 3 && off.checked_add(len as u64).is_some_and(|e| e <= 4096);
                    prop_assert_eq!(mem.read(a, len).await.is_ok(), ok);
                    prop_assert_eq!(mem.write(a, &data).await.is_ok(), ok);
                }
                let c = mem.cas(addr(node, cas_off), 0, 1).await;
                prop_assert_eq!(c.is_ok(), (node as usize) < 3 && cas_off % 8 == 0 && cas_off + 8 <= 4096);
                let ops = [Op::Write { offset: small, data: &data[..len.min(64)] }, Op::Cas { offset: cas_off, expected: 0, new: 1 }];
                let _ = mem.pipeline(NodeId(node), &ops).await;
                Ok(())
            }).unwrap()?;
        }
    }
}
