//! Client-side sub-allocation of remote memory, without roundtrips in the
//! common case.
//!
//! Each client takes whole chunks from a node's [`Region`] (one CAS) and
//! carves them into objects of power-of-two size classes, from 64 bytes (a
//! cache line, so objects never share one) up to the chunk size. Freed
//! objects go to a small per-class free list of this client and are reused by
//! it; there is no global free, as in the systems this toolkit reproduces
//! (SWARM §4.5 leaves recycling to future work): a client that frees more
//! than its lists hold leaks the rest until the region is formatted again.

use core::fmt;

use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::region::{Region, RegionError};
use crate::{Memory, NodeId, RemoteAddr};

/// Smallest object: one cache line.
pub const MIN_OBJECT: u64 = 64;
/// Number of size classes (64 B to 32 MiB).
pub const CLASSES: usize = 20;
/// Freed objects a client remembers per class and node.
pub const FREE_LIST: usize = 8;
/// Nodes one allocator serves.
pub const MAX_NODES: usize = 4 * MAX_REPLICAS;

/// A failure to allocate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AllocError {
    /// Getting a chunk failed.
    Region(RegionError),
    /// The object is larger than a chunk, or of size zero.
    BadSize {
        /// Bytes asked for.
        size: u64,
    },
    /// More nodes than [`MAX_NODES`] were used.
    TooManyNodes,
}

impl From<RegionError> for AllocError {
    fn from(e: RegionError) -> Self {
        AllocError::Region(e)
    }
}

impl From<crate::MemError> for AllocError {
    fn from(e: crate::MemError) -> Self {
        AllocError::Region(RegionError::Mem(e))
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Region(e) => write!(f, "{e}"),
            AllocError::BadSize { size } => write!(f, "cannot allocate an object of {size} bytes"),
            AllocError::TooManyNodes => write!(f, "allocator serves at most {MAX_NODES} nodes"),
        }
    }
}

impl core::error::Error for AllocError {}

#[derive(Default)]
struct Class {
    /// Next free byte of the current chunk, and its end (both 0: no chunk).
    bump: u64,
    end: u64,
    free: heapless::Vec<u64, FREE_LIST>,
}

struct NodeSlabs {
    region: Region,
    classes: [Class; CLASSES],
}

/// One client's allocator over any number of nodes (up to [`MAX_NODES`]).
#[derive(Default)]
pub struct SlabAllocator {
    nodes: heapless::Vec<NodeSlabs, MAX_NODES>,
}

/// The size class for `size` bytes, and that class's object size.
pub fn class_of(size: u64) -> Option<(usize, u64)> {
    if size == 0 {
        return None;
    }
    let obj = size.max(MIN_OBJECT).checked_next_power_of_two()?;
    let class = (obj.trailing_zeros() - MIN_OBJECT.trailing_zeros()) as usize;
    (class < CLASSES).then_some((class, obj))
}

impl SlabAllocator {
    /// An allocator that knows no node yet; it opens each node's region on
    /// first use (one roundtrip).
    pub fn new() -> Self {
        Self::default()
    }

    async fn slabs<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<&mut NodeSlabs, AllocError> {
        let i = match self.nodes.iter().position(|s| s.region.node == node) {
            Some(i) => i,
            None => {
                let region = Region::open(mem, node).await?;
                self.nodes
                    .push(NodeSlabs { region, classes: Default::default() })
                    .map_err(|_| AllocError::TooManyNodes)?;
                self.nodes.len() - 1
            }
        };
        Ok(&mut self.nodes[i])
    }

    /// Allocates `size` bytes on `node`, 64-byte aligned. No roundtrip unless
    /// a new chunk is needed (then one, or a few under contention).
    pub async fn alloc<M: Memory>(&mut self, mem: &M, node: NodeId, size: u64) -> Result<RemoteAddr, AllocError> {
        let (class, obj) = class_of(size).ok_or(AllocError::BadSize { size })?;
        let slabs = self.slabs(mem, node).await?;
        if obj > slabs.region.chunk {
            return Err(AllocError::BadSize { size });
        }
        let c = &mut slabs.classes[class];
        if let Some(off) = c.free.pop() {
            return Ok(RemoteAddr::new(node, off));
        }
        if c.end - c.bump < obj {
            let chunk = slabs.region.alloc_chunk(mem).await?;
            c.bump = chunk.offset;
            c.end = chunk.offset + slabs.region.chunk;
        }
        let off = c.bump;
        c.bump += obj;
        Ok(RemoteAddr::new(node, off))
    }

    /// Takes a whole chunk of `node` for the caller (e.g. a log segment).
    pub async fn alloc_chunk<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<RemoteAddr, AllocError> {
        Ok(self.slabs(mem, node).await?.region.alloc_chunk(mem).await?)
    }

    /// Takes one chunk on each of `nodes`, on all of them at once (one
    /// roundtrip when the cursors are as last seen). Results are in the
    /// order of `nodes`.
    pub async fn alloc_chunk_each<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
    ) -> heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> {
        let mut out: heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> =
            nodes.iter().map(|_| Err(AllocError::TooManyNodes)).collect();
        for (i, &node) in nodes.iter().enumerate() {
            if let Err(e) = self.slabs(mem, node).await {
                out[i] = Err(e);
            }
        }
        let futs: heapless::Vec<_, MAX_REPLICAS> = self
            .nodes
            .iter_mut()
            .filter(|s| nodes.contains(&s.region.node))
            .map(|s| async move {
                let node = s.region.node;
                s.region.alloc_chunk(mem).await.map_err(|e| (node, e))
            })
            .collect();
        let replies = crate::substrate::quorum::join_all(futs).await;
        for r in replies.results.into_iter().flatten() {
            let (node, res) = match r {
                Ok(a) => (a.node, Ok(a)),
                Err((node, e)) => (node, Err(AllocError::Region(e))),
            };
            if let Some(i) = nodes.iter().position(|&n| n == node) {
                out[i] = res;
            }
        }
        out
    }

    /// The chunk size of `node`'s region.
    pub async fn chunk_size<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<u64, AllocError> {
        Ok(self.slabs(mem, node).await?.region.chunk)
    }

    /// Returns an object of `size` bytes at `addr` to this client's free list
    /// (it is reused by this client only; see the module doc).
    pub fn free(&mut self, addr: RemoteAddr, size: u64) {
        let Some((class, _)) = class_of(size) else { return };
        if let Some(s) = self.nodes.iter_mut().find(|s| s.region.node == addr.node) {
            let _ = s.classes[class].free.push(addr.offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(1), Some((0, 64)));
        assert_eq!(class_of(64), Some((0, 64)));
        assert_eq!(class_of(65), Some((1, 128)));
        assert_eq!(class_of(8192), Some((7, 8192)));
        assert_eq!(class_of(32 << 20), Some((19, 32 << 20)));
        assert_eq!(class_of((32 << 20) + 1), None);
        assert_eq!(class_of(u64::MAX), None);
    }
}
