//! Unit tests of the handle's semantics: operations, errors, pipelines,
//! concurrency on neighbouring bytes, latency, faults, and the shapes of
//! node sets.

use std::pin::pin;
use std::thread;
use std::time::{Duration, Instant};

use swarm_core::substrate::exec::{block_on, poll_once};
use swarm_core::substrate::join::{join2, join3};
use swarm_core::substrate::memory::read_word;
use swarm_core::substrate::quorum::quorum;
use swarm_core::substrate::rtt::Counted;
use swarm_core::{MAX_PIPELINE, MemErrorKind, Memory, NodeId, Op, OpOutput, RemoteAddr};

use crate::{Fault, MAX_NODE_SIZE, MAX_NODES, MappedBuf, MappedError, MappedMemory, Nodes, Words, check_config};

const SIZE: u64 = 4096;

fn at(node: u16, offset: u64) -> RemoteAddr {
    RemoteAddr::new(NodeId(node), offset)
}

fn mem(nodes: usize) -> MappedMemory {
    Nodes::anonymous(nodes, SIZE).unwrap().memory()
}

fn read(m: &MappedMemory, node: u16, offset: u64, len: usize) -> Vec<u8> {
    block_on(m.read(at(node, offset), len)).unwrap().to_vec()
}

fn kind<T: std::fmt::Debug>(r: Result<T, swarm_core::MemError>) -> MemErrorKind {
    r.unwrap_err().kind
}

#[test]
fn handles_and_buffers_can_move_between_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<MappedMemory>();
    send::<MappedBuf>();
    send_sync::<Nodes>();
}

#[test]
fn read_write_cas_round_trip() {
    let m = mem(2);
    assert_eq!(m.node_count(), 2);
    assert_eq!(read(&m, 1, 0, 16), [0; 16], "fresh memory is zeroed");
    block_on(m.write(at(1, 3), b"hello, world")).unwrap();
    assert_eq!(read(&m, 1, 3, 12), b"hello, world");
    assert_eq!(read(&m, 0, 3, 12), [0; 12], "nodes are separate");
    assert_eq!(block_on(m.cas(at(1, 64), 0, 42)).unwrap(), 0);
    assert_eq!(block_on(m.cas(at(1, 64), 0, 43)).unwrap(), 42, "a failed CAS returns the current value");
    assert_eq!(block_on(read_word(&m, at(1, 64))).unwrap(), 42, "CAS words read back little-endian");
    block_on(m.write(at(1, SIZE - 4), &[9; 4])).unwrap();
    assert_eq!(read(&m, 1, SIZE - 4, 4), [9; 4], "the last bytes are usable");
    assert!(read(&m, 1, SIZE, 0).is_empty(), "an empty read at the end is in bounds");
}

#[test]
fn bad_requests_are_errors() {
    let m = mem(2);
    assert_eq!(kind(block_on(m.read(at(2, 0), 1))), MemErrorKind::NoSuchNode);
    assert_eq!(kind(block_on(m.write(at(u16::MAX, 0), &[1]))), MemErrorKind::NoSuchNode);
    assert_eq!(kind(block_on(m.read(at(0, SIZE - 7), 8))), MemErrorKind::OutOfBounds { offset: SIZE - 7, len: 8 });
    assert_eq!(kind(block_on(m.read(at(0, 1), usize::MAX))), MemErrorKind::OutOfBounds { offset: 1, len: u64::MAX });
    assert_eq!(kind(block_on(m.write(at(0, u64::MAX), &[1]))), MemErrorKind::OutOfBounds { offset: u64::MAX, len: 1 });
    assert_eq!(kind(block_on(m.cas(at(0, 12), 0, 1))), MemErrorKind::Misaligned { offset: 12 });
    assert_eq!(kind(block_on(m.cas(at(0, SIZE), 0, 1))), MemErrorKind::OutOfBounds { offset: SIZE, len: 8 });
    assert_eq!(kind(block_on(m.pipeline(NodeId(0), &[]))), MemErrorKind::BadPipeline { len: 0 });
    let long = [Op::Read { offset: 0, len: 8 }; MAX_PIPELINE + 1];
    assert_eq!(kind(block_on(m.pipeline(NodeId(0), &long))), MemErrorKind::BadPipeline { len: MAX_PIPELINE + 1 });
    assert_eq!(kind(block_on(m.pipeline(NodeId(9), &long[..1]))), MemErrorKind::NoSuchNode);
    assert_eq!(read(&m, 0, 0, SIZE as usize), vec![0; SIZE as usize], "no failed request changed memory");
}

#[test]
fn a_pipeline_with_one_bad_op_executes_none() {
    let m = mem(1);
    let data = [7u8; 16];
    for bad in [
        Op::Cas { offset: 9, expected: 0, new: 1 },
        Op::Read { offset: SIZE, len: 1 },
        Op::Write { offset: SIZE - 1, data: &data },
    ] {
        let ops = [Op::Write { offset: 0, data: &data }, Op::Cas { offset: 16, expected: 0, new: 5 }, bad];
        assert!(block_on(m.pipeline(NodeId(0), &ops)).is_err());
        m.post_background(NodeId(0), &ops);
        assert_eq!(read(&m, 0, 0, 32), [0; 32], "nothing of the pipeline {ops:?} was applied");
    }
}

#[test]
fn pipelines_run_in_order() {
    let m = mem(1);
    let ops = [
        Op::Write { offset: 8, data: &[1, 2, 3] },
        Op::Read { offset: 8, len: 4 },
        Op::Cas { offset: 0, expected: 0, new: 9 },
        Op::Read { offset: 0, len: 8 },
    ];
    let outs = block_on(m.pipeline(NodeId(0), &ops)).unwrap();
    assert_eq!(outs.len(), 4);
    assert_eq!(outs[0], OpOutput::Written);
    assert_eq!(&**outs[1].as_read().unwrap(), &[1, 2, 3, 0], "a read sees the write before it");
    assert_eq!(outs[2].cas(), Some(0));
    assert_eq!(&**outs[3].as_read().unwrap(), &9u64.to_le_bytes(), "a read sees the CAS before it");
}

trait AsRead {
    fn as_read(&self) -> Option<&MappedBuf>;
}

impl AsRead for OpOutput<MappedBuf> {
    fn as_read(&self) -> Option<&MappedBuf> {
        match self {
            OpOutput::Read(b) => Some(b),
            _ => None,
        }
    }
}

/// Three threads own interleaved byte ranges of the same words (every
/// alignment: heads, tails, spans of two words) and write them over and over;
/// nobody may ever see their own bytes changed by a neighbour's write.
#[test]
fn unaligned_writes_do_not_clobber_concurrent_neighbours() {
    let cluster = Nodes::anonymous(1, SIZE).unwrap();
    // (offset, len) owned by each thread, repeated every 24 bytes over 8 groups.
    const LANES: [(u64, usize); 3] = [(3, 5), (8, 5), (13, 6)];
    let rounds = 20_000u32;
    thread::scope(|s| {
        for (t, &(off, len)) in LANES.iter().enumerate() {
            let m = cluster.memory();
            s.spawn(move || {
                for r in 0..rounds {
                    let group = u64::from(r % 8) * 24;
                    let val: Vec<u8> = (0..len).map(|i| (r as u8).wrapping_add(i as u8) ^ (t as u8 * 0x55)).collect();
                    block_on(m.write(at(0, group + off), &val)).unwrap();
                    assert_eq!(
                        read(&m, 0, group + off, len),
                        val,
                        "thread {t} round {r}: a neighbour clobbered my bytes"
                    );
                }
            });
        }
    });
    let m = cluster.memory();
    for group in 0..8u32 {
        let last = (0..rounds).rev().find(|r| r % 8 == group).unwrap();
        for (t, &(off, len)) in LANES.iter().enumerate() {
            let val: Vec<u8> = (0..len).map(|i| (last as u8).wrapping_add(i as u8) ^ (t as u8 * 0x55)).collect();
            assert_eq!(read(&m, 0, u64::from(group) * 24 + off, len), val);
        }
    }
    assert_eq!(read(&m, 0, 0, 3), [0; 3], "bytes nobody owns stay untouched");
}

#[test]
fn concurrent_cas_increments_are_never_lost() {
    let cluster = Nodes::anonymous(1, SIZE).unwrap();
    let per_thread = 20_000u64;
    thread::scope(|s| {
        for _ in 0..3 {
            let m = cluster.memory();
            s.spawn(move || {
                let mut cur = 0;
                for _ in 0..per_thread {
                    loop {
                        let prev = block_on(m.cas(at(0, 8), cur, cur + 1)).unwrap();
                        if prev == cur {
                            cur += 1;
                            break;
                        }
                        cur = prev;
                    }
                }
            });
        }
    });
    assert_eq!(block_on(read_word(&cluster.memory(), at(0, 8))).unwrap(), 3 * per_thread);
}

const LATENCY: Duration = Duration::from_millis(20);

#[test]
fn latency_delays_completion_but_not_application() {
    let m = mem(1).with_latency(LATENCY);
    let start = Instant::now();
    let mut fut = pin!(m.write(at(0, 0), &[1]));
    assert!(poll_once(fut.as_mut()).is_none(), "pending until the latency passed");
    assert_eq!(read_direct(&m, 0), 0, "posted, not yet applied by its node");
    assert!(poll_once(fut.as_mut()).is_none(), "pending until the latency passed");
    assert_eq!(read_direct(&m, 0), 1, "applied within the roundtrip");
    block_on(fut).unwrap();
    assert!(start.elapsed() >= LATENCY);
}

#[test]
fn the_last_stretch_is_waited_out_only_when_the_next_poll_would_be_late() {
    use crate::memory::waits_here;
    let t = Instant::now();
    let ns = |n| t + Duration::from_nanos(n);
    // Polls 100 ns apart: a deadline 80 ns away is waited for here, one
    // 120 ns away is left to the next poll.
    assert!(waits_here(ns(0), ns(100), ns(180)));
    assert!(!waits_here(ns(0), ns(100), ns(220)));
    // Polls 10 µs apart (other operations in flight on the thread, or a
    // sibling that waited out its own deadline): a deadline close by is
    // still met here, but the thread is never held up for longer than
    // SPIN_AT_MOST, however late the next poll would be.
    assert!(waits_here(ns(0), ns(10_000), ns(10_050)));
    assert!(!waits_here(ns(0), ns(10_000), ns(10_300)));
    // A deadline already passed is met here at once; after a clock that
    // went backwards (no period to judge by) nothing is waited for.
    assert!(waits_here(ns(0), ns(100), ns(50)));
    assert!(!waits_here(ns(100), ns(0), ns(1_000)));
    // Whatever the polls do, an operation never completes before its
    // latency passed.
    let m = mem(1).with_latency(Duration::from_micros(50));
    for _ in 0..100 {
        let start = Instant::now();
        block_on(m.read(at(0, 0), 8)).unwrap();
        assert!(start.elapsed() >= Duration::from_micros(50));
    }
}

#[test]
fn a_posted_operation_is_applied_even_if_its_future_is_dropped() {
    for m in [mem(1), mem(1).with_latency(LATENCY)] {
        let mut fut = Box::pin(m.write(at(0, 0), &[7]));
        assert!(poll_once(fut.as_mut()).is_none());
        drop(fut);
        assert_eq!(read_direct(&m, 0), 7, "posted, then dropped: still applied");
        // Never polled: never posted, never applied.
        drop(m.write(at(0, 0), &[8]));
        assert_eq!(read_direct(&m, 0), 7);
        block_on(m.write(at(0, 0), &[0])).unwrap();
    }
}

/// Byte `offset` of node 0, read directly, bypassing latency and faults (to
/// look at memory while an operation is in flight).
fn read_direct(m: &MappedMemory, offset: u64) -> u8 {
    let mut out = Vec::new();
    crate::bytes::read(m.nodes().words(NodeId(0)).unwrap(), offset, 1, &mut out);
    out[0]
}

#[test]
fn operations_posted_together_overlap() {
    let m = mem(3).with_latency(LATENCY);
    let c = Counted::new(&m);
    // Two concurrent operations: both posted by the first poll, one roundtrip.
    let start = Instant::now();
    let mut both = pin!(join2(c.write(at(0, 0), &[1]), c.cas(at(0, 8), 0, 1)));
    assert!(poll_once(both.as_mut()).is_none());
    assert_eq!((read_direct(&m, 0), read_direct(&m, 8)), (0, 0), "both posted before either is applied");
    assert!(poll_once(both.as_mut()).is_none());
    assert_eq!((read_direct(&m, 0), read_direct(&m, 8)), (1, 1), "both applied before either completed");
    let (w, x) = block_on(both);
    assert!(w.is_ok() && x.is_ok());
    assert!(start.elapsed() >= LATENCY);
    assert_eq!(c.roundtrips(), 1);

    // A pipeline of two is one roundtrip; so are three nodes asked through a quorum.
    c.reset();
    let ops = [Op::Write { offset: 16, data: &[2] }, Op::Cas { offset: 24, expected: 0, new: 2 }];
    block_on(c.pipeline(NodeId(0), &ops)).unwrap();
    assert_eq!(c.roundtrips(), 1);
    c.reset();
    let futs = (0..3).map(|n| c.write(at(n, 32), &[3])).collect();
    let replies = block_on(quorum(futs, 3));
    assert!(replies.reached(3));
    assert_eq!(c.roundtrips(), 1);
    let (a, b, d) = block_on(join3(c.read(at(0, 0), 1), c.read(at(1, 0), 1), c.read(at(2, 0), 1)));
    assert!(a.is_ok() && b.is_ok() && d.is_ok());
    assert_eq!(c.roundtrips(), 2, "one more roundtrip for three concurrent reads");

    // Three operations to three nodes at once: one poll posts them all, and
    // once one latency has passed since, one more poll completes them all.
    let mut three = pin!(join3(m.cas(at(0, 56), 0, 1), m.cas(at(1, 56), 0, 1), m.cas(at(2, 56), 0, 1)));
    assert!(poll_once(three.as_mut()).is_none());
    thread::sleep(LATENCY);
    let (a, b, d) = poll_once(three.as_mut()).expect("all three complete one latency after they were posted");
    assert_eq!((a.unwrap(), b.unwrap(), d.unwrap()), (0, 0, 0));

    // Sequential operations each wait their own latency.
    let start = Instant::now();
    block_on(async {
        m.write(at(0, 40), &[4]).await.unwrap();
        m.write(at(0, 48), &[4]).await.unwrap();
    });
    assert!(start.elapsed() >= 2 * LATENCY);
}

#[test]
fn background_posts_are_applied_at_once_without_latency() {
    let m = mem(1).with_latency(Duration::from_secs(3600));
    let ops = [Op::Write { offset: 0, data: &[5] }, Op::Cas { offset: 8, expected: 0, new: 5 }];
    m.post_background(NodeId(0), &ops);
    assert_eq!((read_direct(&m, 0), read_direct(&m, 8)), (5, 5));
    m.post_background(NodeId(7), &ops); // errors are discarded
}

#[test]
fn failed_nodes_are_unreachable() {
    let cluster = Nodes::anonymous(2, SIZE).unwrap();
    let m = cluster.memory().with_latency(Duration::from_secs(3600));
    cluster.set_fault(NodeId(1), Fault::Failed).unwrap();
    assert_eq!(cluster.fault(NodeId(1)), Some(Fault::Failed));
    assert_eq!(kind(block_on(m.write(at(1, 0), &[1]))), MemErrorKind::Unreachable);
    assert_eq!(kind(block_on(m.cas(at(1, 0), 0, 1))), MemErrorKind::Unreachable);
    assert_eq!(kind(block_on(m.pipeline(NodeId(1), &[Op::Read { offset: 0, len: 1 }]))), MemErrorKind::Unreachable);
    m.post_background(NodeId(1), &[Op::Write { offset: 0, data: &[1] }]);
    cluster.set_fault(NodeId(1), Fault::Healthy).unwrap();
    assert_eq!(read(&cluster.memory(), 1, 0, 1), [0], "nothing reached the failed node");
    // A quorum of three over one failed node still succeeds.
    let m = cluster.memory();
    cluster.set_fault(NodeId(0), Fault::Failed).unwrap();
    let replies = block_on(quorum([m.read(at(0, 0), 1), m.read(at(1, 0), 1)].into_iter().collect(), 1));
    assert!(replies.reached(1) && replies.failed == 1);
    assert_eq!(cluster.set_fault(NodeId(2), Fault::Failed).unwrap_err().kind, MemErrorKind::NoSuchNode);
    assert_eq!(cluster.fault(NodeId(2)), None);
}

#[test]
fn stalled_nodes_time_out_or_resume() {
    let cluster = Nodes::anonymous(1, SIZE).unwrap();
    let timeout = Duration::from_millis(30);
    let m = cluster.memory().with_timeout(timeout);
    cluster.set_fault(NodeId(0), Fault::Stalled).unwrap();
    let start = Instant::now();
    assert_eq!(kind(block_on(m.write(at(0, 0), &[1]))), MemErrorKind::TimedOut);
    assert!(start.elapsed() >= timeout);
    m.post_background(NodeId(0), &[Op::Write { offset: 0, data: &[1] }]);
    assert_eq!(read_direct(&m, 0), 0, "a stalled node applies nothing");

    // The stall ends while an operation waits: it is applied and completes.
    let m = m.with_timeout(Duration::from_secs(3600));
    let mut fut = pin!(m.cas(at(0, 8), 0, 3));
    assert!(poll_once(fut.as_mut()).is_none());
    assert!(poll_once(fut.as_mut()).is_none());
    assert_eq!(read_direct(&m, 8), 0);
    cluster.set_fault(NodeId(0), Fault::Healthy).unwrap();
    assert_eq!(block_on(fut).unwrap(), 0);
    assert_eq!(read_direct(&m, 8), 3);
}

#[test]
fn prefetching_any_span_changes_nothing_and_never_reads_out_of_bounds() {
    let m = mem(1);
    block_on(m.write(at(0, 0), &[7; 200])).unwrap();
    let words = m.nodes().words(NodeId(0)).unwrap();
    let size = m.nodes().node_size();
    // In range, straddling lines, at and past the end, and absurd: a hint
    // that must neither panic nor change a byte.
    for (offset, len) in
        [(0, 200), (3, 1), (60, 10), (size - 8, 8), (size - 1, 100), (size, 8), (u64::MAX, usize::MAX), (0, 0)]
    {
        crate::bytes::prefetch(words, offset, len);
    }
    assert_eq!(read(&m, 0, 0, 200), vec![7; 200]);
    assert_eq!(read(&m, 0, 200, 8), vec![0; 8]);
}

/// Operations created together count as one roundtrip on instant
/// shared memory (no injected latency) too.
#[test]
fn roundtrips_are_counted_once_for_operations_created_together() {
    let cluster = Nodes::anonymous(2, 4096).unwrap();
    let (a, b) = (RemoteAddr::new(NodeId(0), 0), RemoteAddr::new(NodeId(1), 0));
    let mem = cluster.memory();
    let c = Counted::new(&mem);
    let _ = block_on(join2(c.read(a, 8), c.read(b, 8)));
    assert_eq!(c.roundtrips(), 1);
    let _ = block_on(c.read(a, 8));
    assert_eq!(c.roundtrips(), 2);
}

#[test]
fn shapes_are_checked() {
    // 1 to MAX_NODES nodes of a positive multiple of the grain, at most MAX_NODE_SIZE.
    assert_eq!(check_config(3, 4096, 64).unwrap(), 4096);
    let bad = [(0, 64, 8), (MAX_NODES + 1, 64, 8), (1, 0, 8), (1, 12, 8), (1, 4160, 4096), (1, MAX_NODE_SIZE + 8, 8)];
    for (nodes, size, grain) in bad {
        let refused = check_config(nodes, size, grain);
        assert!(matches!(refused, Err(MappedError::Config(_))), "{nodes} nodes of {size} bytes in units of {grain}");
    }
    assert!(matches!(Nodes::anonymous(1, 12), Err(MappedError::Config(_))), "anonymous nodes are whole words");
    let n = Nodes::anonymous(3, 64).unwrap();
    assert_eq!((n.node_count(), n.node_size()), (3, 64));
    // Caller-mapped nodes: whole lines, all of one size.
    let w = Words::anonymous(4096).unwrap();
    let view = |at, bytes| w.slice(at, bytes).unwrap();
    assert!(matches!(Nodes::from_words(vec![]), Err(MappedError::Config(_))));
    assert!(matches!(Nodes::from_words(vec![view(0, 64), view(64, 128)]), Err(MappedError::Config(_))));
    let n = Nodes::from_words(vec![view(0, 1024), view(1024, 1024)]).unwrap();
    assert_eq!((n.node_count(), n.node_size()), (2, 1024));
    block_on(n.memory().write(at(1, 0), &[5])).unwrap();
    assert_eq!(read(&Nodes::from_words(vec![view(1024, 1024)]).unwrap().memory(), 0, 0, 1), [5]);
    // A control block too small for the nodes is refused.
    let control = crate::Control::new(Words::anonymous(8 * 8).unwrap());
    assert!(matches!(Nodes::from_parts(vec![view(0, 64)], control), Err(MappedError::Config(_))));
}
