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
//!
//! A client's partly used chunks outlive it: when it gives its leased id
//! back ([`crate::substrate::lease`]), it hands them to the id's next holder
//! ([`SlabAllocator::hand_over`], [`SlabAllocator::take_over`]), who goes on
//! carving them, so that a process that stores one key costs one object per
//! node, not a chunk.

use core::fmt;

use crate::substrate::late::{Watch, late};
use crate::substrate::lease::{PAYLOAD_WORDS, Payload};
use crate::substrate::quorum::{MAX_REPLICAS, join_timely};
use crate::substrate::space::region::{HEADER_SIZE, Region, RegionError};
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

/// A partly used chunk, handed from a client to its id's next holder: the
/// free part `bump..end` of the chunk of size class `class` on `node`
/// (class [`CLASSES`]: a caller's own, the index's key blocks; class
/// [`ARENA_CLASS`]: the replicated index's arena chunk, in arena offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carry {
    /// The node.
    pub node: NodeId,
    /// The size class, or [`CLASSES`] for the caller's own.
    pub class: u8,
    /// Next free byte.
    pub bump: u64,
    /// End of the chunk.
    pub end: u64,
}

/// The class of a carried chunk of the replicated index's key-block arena
/// (`index::snapshot::arena`): its offsets are relative to the arena, not
/// to the node's region, so it is never taken for a region chunk.
pub const ARENA_CLASS: u8 = CLASSES as u8 + 1;

/// Chunks a lease payload carries.
pub const MAX_CARRIED: usize = (PAYLOAD_WORDS - HEAD_WORDS - 1) / 3;
/// Words of a lease payload before the carried chunks: the user's own
/// (the SWARM client's log cursor and time).
pub const HEAD_WORDS: usize = 3;

impl Carry {
    /// Whether it can be a chunk of `region` that a client took and partly
    /// used: it comes from remote memory, so it is checked before use.
    pub fn fits(&self, region: &Region) -> bool {
        let chunk_end = self.end.checked_sub(HEADER_SIZE).is_some_and(|e| e > 0 && e.is_multiple_of(region.chunk));
        self.node == region.node
            && chunk_end
            && self.end <= region.cursor
            && self.bump <= self.end
            && self.bump + region.chunk >= self.end
            && self.bump.is_multiple_of(MIN_OBJECT)
    }
}

#[derive(Default)]
struct Class {
    /// Next free byte of the current chunk, and its end (both 0: no chunk).
    bump: u64,
    end: u64,
    free: heapless::Vec<u64, FREE_LIST>,
}

impl Class {
    /// An object of `obj` bytes from the free list, or the current chunk
    /// if it has room.
    fn take(&mut self, obj: u64) -> Option<u64> {
        if let Some(off) = self.free.pop() {
            return Some(off);
        }
        if self.end - self.bump < obj {
            return None;
        }
        self.bump += obj;
        Some(self.bump - obj)
    }

    /// Whether [`take`](Self::take) would succeed.
    fn can_take(&self, obj: u64) -> bool {
        !self.free.is_empty() || self.end - self.bump >= obj
    }
}

struct NodeSlabs {
    region: Region,
    classes: [Class; CLASSES],
}

/// One client's allocator over any number of nodes (up to [`MAX_NODES`]).
#[derive(Default)]
pub struct SlabAllocator {
    nodes: heapless::Vec<NodeSlabs, MAX_NODES>,
    /// Chunks taken over, for nodes not opened yet.
    adopted: heapless::Vec<Carry, MAX_CARRIED>,
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
                self.opened(region)?
            }
        };
        Ok(&mut self.nodes[i])
    }

    /// Starts using `region`, with the chunks taken over on its node; its
    /// index in `nodes`.
    fn opened(&mut self, region: Region) -> Result<usize, AllocError> {
        let node = region.node;
        let mut classes: [Class; CLASSES] = Default::default();
        for c in self.adopted.iter().filter(|c| c.node == node && (c.class as usize) < CLASSES) {
            if c.fits(&region) {
                (classes[c.class as usize].bump, classes[c.class as usize].end) = (c.bump, c.end);
            }
        }
        self.adopted.retain(|c| c.node != node || c.class as usize >= CLASSES);
        self.nodes.push(NodeSlabs { region, classes }).map_err(|_| AllocError::TooManyNodes)?;
        Ok(self.nodes.len() - 1)
    }

    /// Opens the regions of those of `nodes` not open yet, all at once (one
    /// roundtrip), leaving out those that are late once `need` of `nodes`
    /// are open; whether each is open.
    async fn open_each<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        need: usize,
    ) -> heapless::Vec<Result<(), AllocError>, MAX_REPLICAS> {
        let mut out: heapless::Vec<Result<(), AllocError>, MAX_REPLICAS> = nodes.iter().map(|_| Ok(())).collect();
        let closed: heapless::Vec<usize, MAX_REPLICAS> =
            (0..nodes.len()).filter(|&i| !self.nodes.iter().any(|s| s.region.node == nodes[i])).collect();
        if closed.is_empty() {
            return out;
        }
        let futs = closed.iter().map(|&i| Region::open(mem, nodes[i])).collect();
        let need = need.saturating_sub(nodes.len() - closed.len());
        let node = |k: usize| nodes[closed[k]];
        let (replies, _) = join_timely(futs, need, Watch::on(mem), |k| RegionError::Mem(late(node(k)))).await;
        for (k, r) in replies.results.into_iter().enumerate() {
            out[closed[k]] = match r {
                Some(Ok(region)) => self.opened(region).map(drop),
                Some(Err(e)) => Err(e.into()),
                None => Err(AllocError::Region(RegionError::Mem(late(node(k))))),
            };
        }
        out
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
        if !c.can_take(obj) {
            let chunk = slabs.region.alloc_chunk(mem).await?;
            (c.bump, c.end) = (chunk.offset, chunk.offset + slabs.region.chunk);
        }
        let off = c.take(obj).ok_or(AllocError::BadSize { size })?;
        Ok(RemoteAddr::new(node, off))
    }

    /// Allocates `size` bytes on `node` only if that needs no roundtrip (its
    /// region is open and the size class has a free object or room in its
    /// chunk): for a node the caller would rather leave out than wait for.
    pub fn alloc_local(&mut self, node: NodeId, size: u64) -> Option<RemoteAddr> {
        let (class, obj) = class_of(size)?;
        let s = self.nodes.iter_mut().find(|s| s.region.node == node)?;
        Some(RemoteAddr::new(node, s.classes[class].take(obj)?))
    }

    /// Takes a whole chunk of `node` for the caller (e.g. a log segment).
    pub async fn alloc_chunk<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<RemoteAddr, AllocError> {
        Ok(self.slabs(mem, node).await?.region.alloc_chunk(mem).await?)
    }

    /// Takes one chunk on each of `nodes`, on all of them at once (one
    /// roundtrip when the cursors are as last seen); once `need` of them
    /// succeeded, those that are late are left out (as timed out).
    /// Results are in the order of `nodes`.
    pub async fn alloc_chunk_each<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        need: usize,
    ) -> heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> {
        let mut out: heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> =
            nodes.iter().map(|_| Err(AllocError::TooManyNodes)).collect();
        let open = self.open_each(mem, nodes, need).await;
        for (i, r) in open.into_iter().enumerate() {
            if let Err(e) = r {
                out[i] = Err(e);
            }
        }
        // The nodes in the order of the futures.
        let order: heapless::Vec<NodeId, MAX_REPLICAS> =
            self.nodes.iter().map(|s| s.region.node).filter(|n| nodes.contains(n)).collect();
        let futs: heapless::Vec<_, MAX_REPLICAS> = self
            .nodes
            .iter_mut()
            .filter(|s| nodes.contains(&s.region.node))
            .map(|s| async move {
                let node = s.region.node;
                s.region.alloc_chunk(mem).await.map_err(|e| (node, e))
            })
            .collect();
        let late = |k: usize| (order[k], RegionError::Mem(late(order[k])));
        let (replies, _) = join_timely(futs, need, Watch::on(mem), late).await;
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

    /// Allocates `sizes[i]` bytes on each `nodes[i]` (an object of its size
    /// class on each, as [`alloc`](Self::alloc) would), taking the new
    /// chunks that some of them need on all of them at once: no roundtrip
    /// when every node's current chunk has room, else one. Results are in
    /// the order of `nodes`. Once `need` of them succeeded, those that are
    /// late are left out (as timed out).
    pub async fn alloc_each<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        sizes: &[u64],
        need: usize,
    ) -> heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> {
        let size = |i: usize| sizes.get(i).copied().unwrap_or(0);
        let class = |i: usize| class_of(size(i));
        let mut out: heapless::Vec<Result<RemoteAddr, AllocError>, MAX_REPLICAS> =
            (0..nodes.len()).map(|i| Err(AllocError::BadSize { size: size(i) })).collect();
        // The nodes whose class has no free object and no room left.
        let mut short: heapless::Vec<NodeId, MAX_REPLICAS> = heapless::Vec::new();
        let open = self.open_each(mem, nodes, need).await;
        for (i, (&node, opened)) in nodes.iter().zip(open).enumerate() {
            let Some((class, obj)) = class(i) else { continue };
            let slabs = opened
                .and_then(|()| self.nodes.iter_mut().find(|s| s.region.node == node).ok_or(AllocError::TooManyNodes));
            match slabs {
                Ok(s) if obj > s.region.chunk => {}
                Ok(s) => {
                    if !s.classes[class].can_take(obj) {
                        let _ = short.push(node);
                    }
                    out[i] = Ok(RemoteAddr::new(node, 0));
                }
                Err(e) => out[i] = Err(e),
            }
        }
        let ready = out.iter().filter(|r| r.is_ok()).count() - short.len();
        let chunks = self.alloc_chunk_each(mem, &short, need.saturating_sub(ready)).await;
        for (&node, chunk) in short.iter().zip(chunks) {
            let i = nodes.iter().position(|&n| n == node).unwrap_or(0);
            match chunk {
                Ok(chunk) => {
                    if let (Some(s), Some((class, _))) =
                        (self.nodes.iter_mut().find(|s| s.region.node == node), class(i))
                    {
                        let c = &mut s.classes[class];
                        (c.bump, c.end) = (chunk.offset, chunk.offset + s.region.chunk);
                    }
                }
                Err(e) => out[i] = Err(e),
            }
        }
        for (i, &node) in nodes.iter().enumerate() {
            let Some((class, obj)) = class(i) else { continue };
            if out[i].is_err() {
                continue;
            }
            let Some(s) = self.nodes.iter_mut().find(|s| s.region.node == node) else { continue };
            out[i] = s.classes[class]
                .take(obj)
                .map(|off| RemoteAddr::new(node, off))
                .ok_or(AllocError::BadSize { size: size(i) });
        }
        out
    }

    /// The chunk size of `node`'s region.
    pub async fn chunk_size<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<u64, AllocError> {
        Ok(self.slabs(mem, node).await?.region.chunk)
    }

    /// Its partly used chunks, for the id's next holder.
    pub fn carried(&self) -> impl Iterator<Item = Carry> + '_ {
        let open = self.nodes.iter().flat_map(|s| {
            s.classes.iter().enumerate().filter(|(_, c)| c.bump < c.end).map(|(class, c)| Carry {
                node: s.region.node,
                class: class as u8,
                bump: c.bump,
                end: c.end,
            })
        });
        // Those taken over and not used yet go on too.
        open.chain(self.adopted.iter().copied())
    }

    /// The lease payload a client gives its id back with: `head` (its own
    /// words), then its partly used chunks and `extra` (the caller's own,
    /// class [`CLASSES`]), as many as fit.
    pub fn hand_over(&self, head: [u64; HEAD_WORDS], extra: Option<Carry>) -> Payload {
        let mut p = [0u64; PAYLOAD_WORDS];
        p[..HEAD_WORDS].copy_from_slice(&head);
        let mut n = 0;
        for c in extra.into_iter().chain(self.carried()).take(MAX_CARRIED) {
            let at = HEAD_WORDS + 1 + 3 * n;
            p[at..at + 3].copy_from_slice(&[(c.node.0 as u64) << 8 | c.class as u64, c.bump, c.end]);
            n += 1;
        }
        p[HEAD_WORDS] = n as u64;
        p
    }

    /// Takes over the chunks of a payload an id's previous holder gave it
    /// back with (only a released id's: a crashed holder may have carved
    /// them further). Each is used when its node is first opened, if it
    /// [`fits`](Carry::fits) the node's region.
    pub fn take_over(&mut self, payload: &Payload) {
        let n = (payload[HEAD_WORDS] as usize).min(MAX_CARRIED);
        for i in 0..n {
            let w = &payload[HEAD_WORDS + 1 + 3 * i..HEAD_WORDS + 4 + 3 * i];
            let c = Carry { node: NodeId((w[0] >> 8) as u16), class: w[0] as u8, bump: w[1], end: w[2] };
            if ((c.class as usize) <= CLASSES || c.class == ARENA_CLASS) && w[0] >> 24 == 0 {
                let _ = self.adopted.push(c);
            }
        }
    }

    /// The chunk of the caller's own (class [`CLASSES`]) on `node` that was
    /// taken over, if any (unchecked: the caller checks it with
    /// [`Carry::fits`]).
    pub fn take_extra(&mut self, node: NodeId) -> Option<Carry> {
        self.take_extra_of(node, CLASSES as u8)
    }

    /// The chunk of class `class` (above the size classes: [`CLASSES`] or
    /// [`ARENA_CLASS`]) on `node` that was taken over, if any (unchecked).
    pub fn take_extra_of(&mut self, node: NodeId, class: u8) -> Option<Carry> {
        let i = self.adopted.iter().position(|c| c.node == node && c.class == class)?;
        Some(self.adopted.swap_remove(i))
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

    /// An arena chunk goes through a lease payload under its own class: the
    /// next holder gets it back as such, never as the caller's region chunk.
    #[test]
    fn arena_chunks_are_carried_under_their_own_class() {
        let arena = Carry { node: NodeId(0), class: ARENA_CLASS, bump: 128, end: 4096 };
        let own = Carry { node: NodeId(0), class: CLASSES as u8, bump: 8192, end: 12288 };
        let mut p = SlabAllocator::new().hand_over([1, 2, 3], Some(arena));
        let mut next = SlabAllocator::new();
        next.take_over(&p);
        assert_eq!(next.take_extra(NodeId(0)), None);
        assert_eq!(next.take_extra_of(NodeId(0), ARENA_CLASS), Some(arena));
        // With the caller's own chunk beside it (as a second carried chunk).
        p[HEAD_WORDS] += 1;
        p[HEAD_WORDS + 4..HEAD_WORDS + 7].copy_from_slice(&[CLASSES as u64, own.bump, own.end]);
        let mut next = SlabAllocator::new();
        next.take_over(&p);
        assert_eq!(next.take_extra(NodeId(0)), Some(own));
        assert_eq!(next.take_extra_of(NodeId(0), ARENA_CLASS), Some(arena));
        // A class beyond the markers is dropped.
        p[HEAD_WORDS + 1] = ARENA_CLASS as u64 + 1;
        let mut next = SlabAllocator::new();
        next.take_over(&p);
        assert_eq!(next.carried().count(), 1);
    }

    /// Objects on several nodes at once: chunks are taken together when
    /// needed (one roundtrip), objects share a chunk, and a node that is
    /// not there answers its own error.
    #[test]
    fn alloc_each_takes_chunks_together_and_packs_objects() {
        use crate::sim::{Sim, SimConfig};
        use crate::substrate::rtt::Counted;
        use crate::substrate::space::Region;

        let mut sim = Sim::new(SimConfig { nodes: 3, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        let (first, second, rtts, missing) = sim
            .block_on(async move {
                for n in 0..3 {
                    Region::format_fresh(&mem, NodeId(n), 1 << 20, 64 << 10).await.unwrap();
                }
                let nodes = [NodeId(0), NodeId(1), NodeId(2)];
                let mut slab = SlabAllocator::new();
                let first = slab.alloc_each(&mem, &nodes, &[16 << 10; 3], nodes.len()).await;
                let c = Counted::new(&mem);
                let second = slab.alloc_each(&c, &nodes, &[16 << 10; 3], nodes.len()).await;
                let rtts = c.roundtrips();
                let missing = slab.alloc_each(&mem, &[NodeId(7)], &[64], 1).await;
                (first, second, rtts, missing)
            })
            .unwrap();
        for (a, b) in first.iter().zip(&second) {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!((a.node, b.offset), (b.node, a.offset + (16 << 10)), "the second object follows the first");
        }
        assert_eq!(rtts, 0, "room in every chunk: no roundtrip");
        assert!(missing[0].is_err());
    }
}
