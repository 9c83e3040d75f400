use alloc::vec::Vec;

use super::*;
use crate::sim::{Sim, SimConfig};
use crate::substrate::space::SlabAllocator;
use crate::substrate::space::region::HEADER_SIZE;

const SIZE: u64 = 1 << 20;
const CHUNK: u64 = 64 << 10;

fn sim(seed: u64) -> Sim {
    let mut sim = Sim::new(SimConfig { seed, nodes: 1, node_size: SIZE, ..SimConfig::default() });
    let mem = sim.client();
    sim.block_on(async move { Region::format_fresh(&mem, NodeId(0), SIZE, CHUNK).await.unwrap() }).unwrap();
    sim
}

/// Blocks come out last in, first out, zeroed throughout, and the pool's
/// byte count follows; an empty pool gives nothing.
#[test]
fn blocks_come_back_zeroed_last_in_first_out() {
    let mut sim = sim(1);
    let mem = sim.client();
    let taken = sim
        .block_on(async move {
            let region = Region::open(&mem, NodeId(0)).await.unwrap();
            for i in 0..3 {
                let at = HEADER_SIZE + i * CHUNK;
                mem.write(RemoteAddr::new(NodeId(0), at), &[0xAB; 4096]).await.unwrap();
                assert!(give(&mem, &region, at, 4096).await.unwrap());
            }
            assert_eq!(bytes(&mem, NodeId(0)).await.unwrap(), 3 * 4096);
            let mut taken = Vec::new();
            while let Some((at, len)) = take(&mem, &region).await.unwrap() {
                let b = mem.read(RemoteAddr::new(NodeId(0), at), len as usize).await.unwrap();
                assert!(b.iter().all(|&x| x == 0), "a block from the pool reads as zero");
                taken.push((at, len));
            }
            assert_eq!(bytes(&mem, NodeId(0)).await.unwrap(), 0);
            taken
        })
        .unwrap();
    let at = |i| HEADER_SIZE + i * CHUNK;
    assert_eq!(taken, [(at(2), 4096), (at(1), 4096), (at(0), 4096)]);
}

/// A block outside the region, or too small for its links, is refused; a
/// head or link garbled on the node is an error, never a block outside
/// the region.
#[test]
fn garbage_is_refused_never_followed() {
    let mut sim = sim(2);
    let mem = sim.client();
    sim.block_on(async move {
        let region = Region::open(&mem, NodeId(0)).await.unwrap();
        assert!(!give(&mem, &region, 64, 4096).await.unwrap(), "the header is not a block");
        assert!(!give(&mem, &region, SIZE - 64, 4096).await.unwrap(), "past the region");
        assert!(!give(&mem, &region, HEADER_SIZE + 8, 4096).await.unwrap(), "unaligned");
        assert!(!give(&mem, &region, HEADER_SIZE, 8).await.unwrap(), "no room for its links");
        assert_eq!(take(&mem, &region).await.unwrap(), None);
        // A head that names the header.
        mem.write(RemoteAddr::new(NodeId(0), HEAD_OFFSET), &1u64.to_le_bytes()).await.unwrap();
        assert!(matches!(take(&mem, &region).await, Err(RegionError::Corrupt { .. })));
        // A block whose link points past the region.
        mem.write(RemoteAddr::new(NodeId(0), HEAD_OFFSET), &0u64.to_le_bytes()).await.unwrap();
        assert!(give(&mem, &region, HEADER_SIZE, 4096).await.unwrap());
        mem.write(RemoteAddr::new(NodeId(0), HEADER_SIZE), &(SIZE + 4096).to_le_bytes()).await.unwrap();
        assert!(matches!(take(&mem, &region).await, Err(RegionError::Corrupt { .. })));
        // And one whose size runs past the region.
        mem.write(RemoteAddr::new(NodeId(0), HEADER_SIZE), &[0; 8]).await.unwrap();
        mem.write(RemoteAddr::new(NodeId(0), HEADER_SIZE + 8), &SIZE.to_le_bytes()).await.unwrap();
        assert!(matches!(take(&mem, &region).await, Err(RegionError::Corrupt { .. })));
    })
    .unwrap();
}

/// Clients that give and take blocks at once, with delays and reordering:
/// no block is ever held by two clients at once, and none is lost.
#[test]
fn concurrent_clients_never_share_a_block() {
    use core::cell::RefCell;
    use std::collections::BTreeSet;
    use std::rc::Rc;

    const CLIENTS: u64 = 4;
    const BLOCKS: u64 = 3;
    for seed in 0..40 {
        let mut sim = sim(100 + seed);
        let held: Rc<RefCell<BTreeSet<u64>>> = Rc::default();
        for c in 0..CLIENTS {
            let (mem, held) = (sim.client(), held.clone());
            let client = mem.clone();
            sim.spawn(&client, async move {
                let region = Region::open(&mem, NodeId(0)).await.unwrap();
                // Each client starts with blocks of its own.
                let mut mine: Vec<u64> = (0..BLOCKS).map(|b| HEADER_SIZE + (c * BLOCKS + b) * CHUNK).collect();
                for &b in &mine {
                    held.borrow_mut().insert(b);
                }
                for round in 0..20 {
                    if round % 2 == 0 {
                        if let Some(b) = mine.pop() {
                            assert!(held.borrow_mut().remove(&b));
                            assert!(give(&mem, &region, b, 4096).await.unwrap());
                        }
                    } else if let Some((b, len)) = take(&mem, &region).await.unwrap() {
                        assert_eq!(len, 4096);
                        assert!(held.borrow_mut().insert(b), "seed {seed}: block {b} taken twice");
                        mine.push(b);
                    }
                }
            });
        }
        sim.run().unwrap();
        let mem = sim.client();
        let left = sim
            .block_on(async move {
                let region = Region::open(&mem, NodeId(0)).await.unwrap();
                let mut n = 0;
                while take(&mem, &region).await.unwrap().is_some() {
                    n += 1;
                }
                n
            })
            .unwrap();
        assert_eq!(left + held.borrow().len() as u64, CLIENTS * BLOCKS, "seed {seed}: a block was lost");
    }
}

/// A slab whose node has no chunk left carves its objects from a block of
/// the pool, and says the node is full once the pool is empty too.
#[test]
fn a_full_node_s_slab_takes_blocks_from_the_pool() {
    let mut sim = sim(3);
    let mem = sim.client();
    sim.block_on(async move {
        let mut region = Region::open(&mem, NodeId(0)).await.unwrap();
        // Every chunk claimed; one given back to the pool.
        let mut last = None;
        while let Ok(c) = region.alloc_chunk(&mem).await {
            last = Some(c.offset);
        }
        assert!(give(&mem, &region, last.unwrap(), CHUNK).await.unwrap());
        let mut slab = SlabAllocator::new();
        let a = slab.alloc(&mem, NodeId(0), 1024).await.unwrap();
        assert_eq!(a.offset, last.unwrap(), "the first object is the block's start");
        for _ in 1..CHUNK / 1024 {
            slab.alloc(&mem, NodeId(0), 1024).await.unwrap();
        }
        assert!(matches!(
            slab.alloc(&mem, NodeId(0), 1024).await,
            Err(crate::substrate::space::AllocError::Region(RegionError::Exhausted { .. }))
        ));
    })
    .unwrap();
}
