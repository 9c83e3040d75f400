//! The ring's promises, in the simulator (random latencies, transfers
//! applied in pieces at distinct instants, so a receiver's poll can see a
//! message half written): no message lost, duplicated, torn or reordered;
//! wrap-around; a full ring pushes back; garbled ring contents give "no
//! message" or an error, never a panic or an access outside the ring.

use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use proptest::prelude::*;

use super::*;
use crate::NodeId;
use crate::sim::{Sim, SimConfig, SimMemory};

const NODE: NodeId = NodeId(0);
const BASE: u64 = 4096;

fn ring(size: u64) -> RingAt {
    RingAt { addr: RemoteAddr::new(NODE, BASE), size, head: RemoteAddr::new(NODE, 64) }
}

/// The head line of [`ring`].
const HEAD_LINE: u64 = 64;

/// One node; transfers in pieces; a run that takes more than 50 ms of
/// virtual time (a few hundred messages need well under one) is stuck.
fn sim(seed: u64) -> Sim {
    Sim::new(SimConfig {
        seed,
        nodes: 1,
        node_size: 1 << 16,
        max_piece_gap_ns: 500,
        time_limit_ns: 50_000_000,
        ..SimConfig::default()
    })
}

/// Message `i`'s bytes: its number, then filler derived from it.
fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| if b < 8 { (i as u64).to_le_bytes()[b] } else { (i * 31 + b) as u8 }).collect()
}

const LINK: Link = Link { epoch: 3, generation: 7 };

/// Sends `lens` one after the other (waiting while the ring is full) while
/// a receiver polls, pausing `pause_ns` after each message; returns what
/// the receiver got, in order, and how many times the sender found the ring
/// full.
fn exchange(seed: u64, size: u64, lens: &[usize], pause_ns: u64) -> (Vec<Vec<u8>>, u32) {
    let mut sim = sim(seed);
    let (tx, rx) = (sim.client(), sim.client());
    let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let full = Rc::new(RefCell::new(0));
    let n = lens.len();
    let (lens, f) = (lens.to_vec(), full.clone());
    let m = tx.clone();
    sim.spawn(&tx, async move {
        let mut p = Producer::new(ring(size), LINK);
        for (i, &len) in lens.iter().enumerate() {
            loop {
                match p.send(&m, &[&message(i, len)]).await {
                    Ok(()) => break,
                    Err(RingError::Full) => {
                        *f.borrow_mut() += 1;
                        m.sleep(2_000).await;
                    }
                    Err(e) => panic!("send {i}: {e}"),
                }
            }
        }
    });
    let (g, m) = (got.clone(), rx.clone());
    sim.spawn(&rx, async move {
        let mut c = Consumer::new(ring(size), LINK);
        while g.borrow().len() < n {
            match c.poll(&m, 64).await.unwrap() {
                Some(msg) => {
                    assert_eq!(msg.seq as usize, g.borrow().len(), "sequence numbers follow each other");
                    g.borrow_mut().push(msg.payload().to_vec());
                    c.publish(&m);
                    m.sleep(pause_ns).await;
                }
                None => m.sleep(300).await,
            }
        }
    });
    sim.run().unwrap();
    let out = got.borrow().clone();
    let f = *full.borrow();
    (out, f)
}

/// `RING_SEEDS=n`: runs seeds `0..n` of every ring size and prints the
/// first that fails (for exploring; does nothing unless set).
#[test]
fn explore() {
    let Ok(n) = std::env::var("RING_SEEDS") else { return };
    for seed in 0..n.parse::<u64>().unwrap() {
        for size in [128u64, 192, 256, 1024] {
            let lens: Vec<usize> = (0..30).map(|i| (seed as usize * 7 + i * 13) % 25).collect();
            let r = std::panic::catch_unwind(|| exchange(seed, size, &lens, seed % 4 * 1_000));
            if r.is_err() {
                std::println!("FAIL seed {seed} size {size} lens {lens:?}");
                return;
            }
        }
    }
}

#[test]
fn sizes_and_placement() {
    assert_eq!(max_payload(128), 24);
    assert_eq!(max_payload(4096), 1512);
    // A message fits: no skip.
    assert_eq!(placement(0, 64, 128), (0, false));
    // It does not fit in the rest: a wrap marker, then the start.
    assert_eq!(placement(96, 64, 128), (32, true));
    // Less than a header left: skipped without a marker.
    assert_eq!(placement(112, 32, 128), (16, false));
}

#[test]
fn messages_wrap_around_a_small_ring() {
    let lens: Vec<usize> = (0..40).map(|i| [0, 8, 13, 24][i % 4]).collect();
    let (got, full) = exchange(1, 128, &lens, 5_000);
    let want: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| message(i, l)).collect();
    assert_eq!(got, want);
    assert!(full > 0, "a 128-byte ring fills up: the sender waited on it");
}

#[test]
fn a_full_ring_pushes_back_until_the_receiver_publishes() {
    let mut sim = sim(2);
    let m = sim.client();
    sim.block_on(async move {
        let mut p = Producer::new(ring(256), LINK);
        let mut c = Consumer::new(ring(256), LINK);
        let mut sent = 0;
        while p.send(&m, &[&message(sent, 40)]).await.is_ok() {
            sent += 1;
            assert!(sent <= 4, "a 256-byte ring holds at most four 64-byte messages");
        }
        assert_eq!(sent, 4);
        assert_eq!(p.send(&m, &[&message(sent, 40)]).await, Err(RingError::Full));
        // Received but not published: still full.
        let first = c.poll(&m, 256).await.unwrap().unwrap();
        assert_eq!(first.payload(), &message(0, 40)[..]);
        c.publish(&m);
        m.sleep(100_000).await;
        // A quarter of the ring processed and published: room again.
        p.send(&m, &[&message(sent, 40)]).await.unwrap();
        assert_eq!(p.send(&m, &[&[0; 73]]).await, Err(RingError::TooLarge { len: 73, max: 72 }));
    })
    .unwrap();
}

#[test]
fn another_connection_s_messages_are_ignored() {
    let mut sim = sim(3);
    let m = sim.client();
    sim.block_on(async move {
        let mut old = Producer::new(ring(256), Link { epoch: 3, generation: 6 });
        old.send(&m, &[b"stale"]).await.unwrap();
        let mut c = Consumer::new(ring(256), LINK);
        assert!(c.poll(&m, 64).await.unwrap().is_none(), "a message of the previous generation");
        let mut p = Producer::new(ring(256), LINK);
        p.send(&m, &[b"fresh"]).await.unwrap();
        assert_eq!(c.poll(&m, 64).await.unwrap().unwrap().payload(), b"fresh");
    })
    .unwrap();
}

/// Writes `bytes` over the ring and `head` over every slot of its head line.
fn scribble(m: &SimMemory, bytes: Vec<u8>, head: u64) -> impl core::future::Future<Output = ()> {
    let m = m.clone();
    async move {
        m.write(RemoteAddr::new(NODE, BASE), &bytes).await.unwrap();
        for slot in 0..HEAD_SLOTS {
            m.write(RemoteAddr::new(NODE, HEAD_LINE + 8 * slot), &(head ^ slot << 3).to_le_bytes()).await.unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the sizes and the schedule: every message arrives once,
    /// whole, in order.
    #[test]
    fn every_message_arrives_once_whole_and_in_order(
        seed in 0u64..1_000,
        size in prop::sample::select(vec![128u64, 192, 256, 1024]),
        lens in prop::collection::vec(0usize..=24, 1..40),
    ) {
        let (got, _) = exchange(seed, size, &lens, seed % 4 * 1_000);
        let want: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| message(i, l)).collect();
        prop_assert_eq!(got, want);
    }

    /// A ring and head word full of garbage: polls find nothing (or an
    /// error), sends push back or go through; nothing panics or reaches
    /// outside the ring (the simulator refuses out-of-range accesses).
    #[test]
    fn garbage_never_panics(
        seed in 0u64..1_000,
        bytes in prop::collection::vec(any::<u8>(), 256),
        head in any::<u64>(),
        window in 0u64..10_000,
    ) {
        let mut sim = sim(seed);
        let m = sim.client();
        // Half the time a head word of this connection's generation, with a
        // wild position.
        let head = if seed % 2 == 0 { head } else { (LINK.generation as u64) << 48 | (head & POS_MASK) };
        sim.block_on(async move {
            scribble(&m, bytes, head).await;
            let mut c = Consumer::new(ring(256), LINK);
            for _ in 0..4 {
                let _ = c.poll(&m, window).await;
            }
            let mut p = Producer::new(ring(256), LINK);
            for i in 0..8 {
                let _ = p.send(&m, &[&message(i, 24)]).await;
            }
        })
        .unwrap();
    }
}
