//! Client-side sub-allocation of remote memory, without roundtrips in the
//! common case.
//!
//! Each client takes whole chunks from a node's [`Region`] (one CAS) and
//! carves them into objects of size classes, from 64 bytes (a cache line,
//! so objects never share one) up to the chunk size: multiples of 64 bytes
//! up to 256, then four classes per doubling ([`class_of`]), so that an
//! object wastes at most a fifth of its size (a 1 KiB value with its
//! header takes 1,280 bytes, not the 2,048 of a power of two). Freed
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
//!
//! A client that crashes hands nothing over, so each chunk it carves has a
//! *mark*, kept in the id's lease record: every object carved from the
//! chunk and made reachable lies below it. Carving past the mark moves it
//! a quarter chunk ahead, and the new mark is recorded
//! ([`SlabAllocator::record_marks`], one roundtrip to the lease table, about
//! once per quarter chunk) before the object is written or published (named
//! where others find it: an index, a log directory). The id's next holder
//! after a crash goes on carving each chunk from its mark
//! ([`SlabAllocator::take_over_marked`]): it loses at most a quarter chunk
//! per chunk, never an object in use, and finds the memory above the mark
//! as fresh as a new chunk's (its holder wrote nothing there).

use core::fmt;

use crate::substrate::late::{Watch, late};
use crate::substrate::lease::{Held, LeaseError, PAYLOAD_WORDS, Payload};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_timely};
use crate::substrate::space::region::{HEADER_SIZE, Region, RegionError};
use crate::{Memory, NodeId, RemoteAddr};

/// Smallest object: one cache line.
pub const MIN_OBJECT: u64 = 64;
/// Number of size classes (64 B to 32 MiB, [`class_of`]).
pub const CLASSES: usize = 72;
/// Size classes one client uses on one node at once (a store uses a few:
/// its objects, its descriptors); a class whose chunk is used up and whose
/// free list is empty gives its place to another.
pub const USED_CLASSES: usize = 12;
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
    /// More than [`USED_CLASSES`] object sizes are in use on one node,
    /// each with room left or objects freed.
    TooManyClasses {
        /// The node.
        node: NodeId,
    },
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
            AllocError::TooManyClasses { node } => {
                write!(f, "{node}: more than {USED_CLASSES} object sizes in use at once by one client")
            }
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
    /// The chunk's mark: at or above `bump`, what the lease record says of
    /// it (once recorded: [`SlabAllocator::record_marks`]).
    mark: u64,
    free: heapless::Vec<u64, FREE_LIST>,
}

impl Class {
    /// A class carving `bump..end`, with its mark at `bump`.
    fn carving(bump: u64, end: u64) -> Class {
        Class { bump, end, mark: bump, free: heapless::Vec::new() }
    }

    /// An object of `obj` bytes from the free list, or the current chunk
    /// (of `chunk` bytes) if it has room; and whether the mark moved
    /// ([`mark_past`]).
    fn take(&mut self, obj: u64, chunk: u64) -> Option<(u64, bool)> {
        if let Some(off) = self.free.pop() {
            return Some((off, false));
        }
        if self.end - self.bump < obj {
            return None;
        }
        self.bump += obj;
        let moved = self.bump > self.mark;
        if moved {
            self.mark = mark_past(self.mark, self.bump, self.end, chunk);
        }
        Some((self.bump - obj, moved))
    }

    /// Whether [`take`](Self::take) would succeed.
    fn can_take(&self, obj: u64) -> bool {
        !self.free.is_empty() || self.end - self.bump >= obj
    }
}

struct NodeSlabs {
    region: Region,
    /// The classes in use, by number.
    classes: heapless::Vec<(u8, Class), USED_CLASSES>,
}

impl NodeSlabs {
    /// An object of class `i` (its place in `classes`) of `obj` bytes, as
    /// [`Class::take`].
    fn take(&mut self, i: usize, obj: u64) -> Option<(u64, bool)> {
        self.classes[i].1.take(obj, self.region.chunk)
    }

    /// Class `class`'s state, if it is in use.
    fn get(&mut self, class: usize) -> Option<&mut Class> {
        self.classes.iter_mut().find(|(c, _)| *c as usize == class).map(|(_, st)| st)
    }

    /// Class `class`'s place in `classes`, made if it was not in use (in
    /// the place of a used-up class if need be).
    fn place(&mut self, class: usize) -> Result<usize, AllocError> {
        if let Some(i) = self.classes.iter().position(|(c, _)| *c as usize == class) {
            return Ok(i);
        }
        if self.classes.is_full() {
            let spent = self.classes.iter().position(|(c, st)| !st.can_take(class_size(*c as usize)));
            let i = spent.ok_or(AllocError::TooManyClasses { node: self.region.node })?;
            self.classes.swap_remove(i);
        }
        self.classes
            .push((class as u8, Class::default()))
            .map_err(|_| AllocError::TooManyClasses { node: self.region.node })?;
        Ok(self.classes.len() - 1)
    }
}

/// One client's allocator over any number of nodes (up to [`MAX_NODES`]).
#[derive(Default)]
pub struct SlabAllocator {
    nodes: heapless::Vec<NodeSlabs, MAX_NODES>,
    /// Chunks taken over, for nodes not opened yet.
    adopted: heapless::Vec<Carry, MAX_CARRIED>,
    /// Marks moved so far, and how many of those moves the lease record
    /// holds ([`SlabAllocator::record_marks`]).
    moves: u64,
    recorded: u64,
    /// The user's words and chunk of its last record, which every record
    /// of the marks carries again.
    head: [u64; HEAD_WORDS],
    extra: Option<Carry>,
}

/// Where a chunk's mark moves when carving reaches `reach` past it: a
/// quarter chunk (of `chunk` bytes) ahead, or to `reach` if that is
/// further, never past the chunk's `end`. The one rule for every chunk
/// carved under marks (the slab's, the one-copy index's key blocks).
pub fn mark_past(mark: u64, reach: u64, end: u64, chunk: u64) -> u64 {
    end.min(reach.max(mark + chunk / 4))
}

/// An allocator with the lease its marks are recorded in
/// ([`SlabAllocator::record_marks`]): what code that carves objects and
/// publishes them is given.
pub struct Carver<'a> {
    /// The allocator.
    pub slab: &'a mut SlabAllocator,
    /// The lease of its client's id (none for a given id).
    pub lease: Option<&'a mut Held>,
}

impl Carver<'_> {
    /// The same, borrowed again (for a call that does not keep it).
    pub fn reborrow(&mut self) -> Carver<'_> {
        Carver { slab: &mut *self.slab, lease: self.lease.as_deref_mut() }
    }

    /// Records the marks if one moved ([`SlabAllocator::record_marks`]).
    pub async fn record_marks<M: Memory>(&mut self, mem: &M) -> Result<(), LeaseError> {
        self.slab.record_marks(mem, self.lease.as_deref_mut()).await
    }
}

/// The size class for `size` bytes, and that class's object size: the
/// multiple of 64 bytes at or above it up to 256 (classes 0 to 3), then,
/// in each doubling from 2^k to 2^(k+1), the multiple of 2^(k-2) (four
/// classes per doubling), up to 32 MiB.
pub fn class_of(size: u64) -> Option<(usize, u64)> {
    if size == 0 {
        return None;
    }
    let size = size.max(MIN_OBJECT);
    if size <= 4 * MIN_OBJECT {
        let obj = size.next_multiple_of(MIN_OBJECT);
        return Some(((obj / MIN_OBJECT - 1) as usize, obj));
    }
    // size is in (2^k, 2^(k+1)], k >= 8.
    let k = 63 - (size - 1).leading_zeros();
    let step = 1u64 << (k - 2);
    let obj = size.checked_next_multiple_of(step)?;
    let class = 4 + 4 * (k as usize - 8) + (obj / step - 5) as usize;
    (class < CLASSES).then_some((class, obj))
}

/// The object size of class `class` (< [`CLASSES`]): what [`class_of`]
/// gives with it.
pub fn class_size(class: usize) -> u64 {
    if class < 4 {
        return (class as u64 + 1) * MIN_OBJECT;
    }
    let j = class - 4;
    let step = 1u64 << (8 + j / 4 - 2);
    (5 + (j % 4) as u64) * step
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
        let mut classes = heapless::Vec::new();
        for c in self.adopted.iter().filter(|c| c.node == node && (c.class as usize) < CLASSES) {
            if c.fits(&region) && !classes.iter().any(|(k, _): &(u8, Class)| *k == c.class) {
                // More than the table holds: the rest are left (lost space).
                let _ = classes.push((c.class, Class::carving(c.bump, c.end)));
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
        let i = slabs.place(class)?;
        if !slabs.classes[i].1.can_take(obj) {
            let (bump, end) = match slabs.region.alloc_chunk(mem).await {
                Ok(chunk) => (chunk.offset, chunk.offset + slabs.region.chunk),
                Err(e) => from_pool(mem, &slabs.region, obj, e).await?,
            };
            // No free object (it could not take one): a fresh chunk.
            slabs.classes[i].1 = Class::carving(bump, end);
        }
        let (off, moved) = slabs.take(i, obj).ok_or(AllocError::BadSize { size })?;
        self.moves += moved as u64;
        Ok(RemoteAddr::new(node, off))
    }

    /// Allocates `size` bytes on `node` only if that needs no roundtrip (its
    /// region is open and the size class has a free object or room in its
    /// chunk): for a node the caller would rather leave out than wait for.
    pub fn alloc_local(&mut self, node: NodeId, size: u64) -> Option<RemoteAddr> {
        let (class, obj) = class_of(size)?;
        let s = self.nodes.iter_mut().find(|s| s.region.node == node)?;
        let i = s.classes.iter().position(|(c, _)| *c as usize == class)?;
        let (off, moved) = s.take(i, obj)?;
        self.moves += moved as u64;
        Some(RemoteAddr::new(node, off))
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
            match slabs.and_then(|s| if obj > s.region.chunk { Ok(None) } else { Ok(Some((s.place(class)?, s))) }) {
                Ok(None) => {}
                Ok(Some((c, s))) => {
                    if !s.classes[c].1.can_take(obj) {
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
            let (Some(s), Some((class, obj))) = (self.nodes.iter_mut().find(|s| s.region.node == node), class(i))
            else {
                continue;
            };
            let range = match chunk {
                Ok(chunk) => Ok((chunk.offset, chunk.offset + s.region.chunk)),
                Err(AllocError::Region(e)) => from_pool(mem, &s.region, obj, e).await,
                Err(e) => Err(e),
            };
            match range {
                Ok((bump, end)) => {
                    if let Some(c) = s.get(class) {
                        *c = Class::carving(bump, end);
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
            let taken = s.classes.iter().position(|(c, _)| *c as usize == class).and_then(|k| s.take(k, obj));
            self.moves += taken.is_some_and(|(_, moved)| moved) as u64;
            out[i] = taken.map(|(off, _)| RemoteAddr::new(node, off)).ok_or(AllocError::BadSize { size: size(i) });
        }
        out
    }

    /// The chunk size of `node`'s region.
    pub async fn chunk_size<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<u64, AllocError> {
        Ok(self.slabs(mem, node).await?.region.chunk)
    }

    /// Its partly used chunks, for the id's next holder.
    pub fn carried(&self) -> impl Iterator<Item = Carry> + '_ {
        self.open_chunks(false)
    }

    /// Its partly used chunks, from their bumps (for a holder that stopped
    /// carving) or their marks (for one that may go on); then those taken
    /// over and not used yet.
    fn open_chunks(&self, marks: bool) -> impl Iterator<Item = Carry> + '_ {
        let open = self.nodes.iter().flat_map(move |s| {
            s.classes.iter().map(move |&(class, ref c)| Carry {
                node: s.region.node,
                class,
                // (Mutant `marks-are-bumps`: a record names each chunk from
                // where carving stood, and objects carved below the mark
                // since are published unrecorded.)
                bump: if marks && !mutant!("marks-are-bumps") { c.mark } else { c.bump },
                end: c.end,
            })
        });
        open.filter(|c| c.bump < c.end).chain(self.adopted.iter().copied())
    }

    /// The lease payload a client gives its id back with: `head` (its own
    /// words), then its partly used chunks and `extra` (the caller's own,
    /// class [`CLASSES`]), as many as fit.
    pub fn hand_over(&self, head: [u64; HEAD_WORDS], extra: Option<Carry>) -> Payload {
        payload(head, extra.into_iter().chain(self.carried()))
    }

    /// The lease payload of a record taken while this client works: `head`
    /// and `extra` as in [`hand_over`](Self::hand_over), with each chunk
    /// from its mark. Every later record of the marks
    /// ([`record_marks`](Self::record_marks)) carries the same `head` and
    /// `extra`, so that a record of the marks never undoes the user's.
    pub fn marked(&mut self, head: [u64; HEAD_WORDS], extra: Option<Carry>) -> Payload {
        (self.head, self.extra) = (head, extra);
        payload(head, extra.into_iter().chain(self.open_chunks(true)))
    }

    /// Starts from the record an id's claim left (its predecessor's words,
    /// copied): until this client records words of its own, its records of
    /// the marks repeat those, so that the id's next holder still finds
    /// where the predecessor stood (a SWARM client's log cursor, FUSEE's
    /// anchor).
    pub fn resume_from(&mut self, payload: &Payload) {
        self.head.copy_from_slice(&payload[..HEAD_WORDS]);
    }

    /// Sets the caller's own chunk that every record carries
    /// ([`marked`](Self::marked)), from its mark: a record is due if it
    /// changed.
    pub fn set_extra(&mut self, extra: Option<Carry>) {
        if extra != self.extra {
            self.extra = extra;
            self.moves += 1;
        }
    }

    /// Writes `head` and `extra` with the marks to `lease`'s record
    /// ([`marked`](Self::marked)), as taken.
    pub async fn record<M: Memory>(
        &mut self,
        mem: &M,
        lease: &mut Held,
        head: [u64; HEAD_WORDS],
        extra: Option<Carry>,
    ) -> Result<(), LeaseError> {
        let moves = self.moves;
        let p = self.marked(head, extra);
        lease.record(mem, &p).await?;
        self.recorded = moves;
        Ok(())
    }

    /// Whether a mark moved since the lease record last held them all: the
    /// objects carved since must not be published before
    /// [`record_marks`](Self::record_marks).
    pub fn unrecorded(&self) -> bool {
        self.moves != self.recorded
    }

    /// This allocator with no lease to record its marks in (a given id).
    pub fn unleased(&mut self) -> Carver<'_> {
        Carver { slab: self, lease: None }
    }

    /// Records the marks in `lease`'s record if one moved since it last
    /// held them (nothing otherwise, and nothing for a client without a
    /// lease): callers run it after they carve objects and before they
    /// publish them. One roundtrip, about once per quarter chunk.
    pub async fn record_marks<M: Memory>(&mut self, mem: &M, lease: Option<&mut Held>) -> Result<(), LeaseError> {
        match lease {
            Some(h) if self.unrecorded() => {
                let (head, extra) = (self.head, self.extra);
                self.record(mem, h, head, extra).await
            }
            _ => {
                self.recorded = self.moves;
                Ok(())
            }
        }
    }

    /// Takes over the chunks of a payload an id's previous holder gave it
    /// back with (a released id's, from their bumps). Each is used when its
    /// node is first opened, if it [`fits`](Carry::fits) the node's region.
    pub fn take_over(&mut self, payload: &Payload) {
        for c in carries(payload) {
            let _ = self.adopted.push(c);
        }
    }

    /// Takes over the chunks of the last record of an id's holder that
    /// crashed, from their marks: nothing it published lies above them.
    /// The size classes' and the caller's own (class [`CLASSES`], the
    /// one-copy index's key blocks, [`take_extra`](Self::take_extra)); not
    /// the replicated index's arena chunk, whose blocks are carved without
    /// marks. The number taken over.
    pub fn take_over_marked(&mut self, payload: &Payload) -> usize {
        let before = self.adopted.len();
        for c in carries(payload).filter(|c| (c.class as usize) <= CLASSES) {
            let _ = self.adopted.push(c);
        }
        self.adopted.len() - before
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
    /// (it is reused by this client only; see the module doc). Lost, as when
    /// the list is full, if the client has [`USED_CLASSES`] other sizes with
    /// room on that node.
    pub fn free(&mut self, addr: RemoteAddr, size: u64) {
        let Some((class, _)) = class_of(size) else { return };
        if let Some(s) = self.nodes.iter_mut().find(|s| s.region.node == addr.node)
            && let Ok(i) = s.place(class)
        {
            let _ = s.classes[i].1.free.push(addr.offset);
        }
    }
}

/// A lease payload of `head` and `chunks`, as many as fit.
fn payload(head: [u64; HEAD_WORDS], chunks: impl Iterator<Item = Carry>) -> Payload {
    let mut p = [0u64; PAYLOAD_WORDS];
    p[..HEAD_WORDS].copy_from_slice(&head);
    let mut n = 0;
    for c in chunks.take(MAX_CARRIED) {
        let at = HEAD_WORDS + 1 + 3 * n;
        p[at..at + 3].copy_from_slice(&[(c.node.0 as u64) << 8 | c.class as u64, c.bump, c.end]);
        n += 1;
    }
    p[HEAD_WORDS] = n as u64;
    p
}

/// The chunks a lease payload names (unchecked: each is checked against
/// its node's region before use, [`Carry::fits`]), of the known classes.
fn carries(payload: &Payload) -> impl Iterator<Item = Carry> + '_ {
    let n = (payload[HEAD_WORDS] as usize).min(MAX_CARRIED);
    (0..n).filter_map(move |i| {
        let w = &payload[HEAD_WORDS + 1 + 3 * i..HEAD_WORDS + 4 + 3 * i];
        let c = Carry { node: NodeId((w[0] >> 8) as u16), class: w[0] as u8, bump: w[1], end: w[2] };
        (((c.class as usize) <= CLASSES || c.class == ARENA_CLASS) && w[0] >> 24 == 0).then_some(c)
    })
}

/// Where a class goes on when its node has no chunk left (`failed`
/// says so): a block of the node's pool of given-back memory
/// ([`super::pool`]) that holds an object of `obj` bytes, as the range
/// to carve. Any other failure, or an empty pool, is `failed` itself; a
/// block too small for the object goes back.
async fn from_pool<M: Memory>(
    mem: &M,
    region: &Region,
    obj: u64,
    failed: RegionError,
) -> Result<(u64, u64), AllocError> {
    if !matches!(failed, RegionError::Exhausted { .. }) {
        return Err(failed.into());
    }
    match super::pool::take_fitting(mem, region, obj).await? {
        Some((block, bytes)) => Ok((block, block + bytes)),
        None => Err(failed.into()),
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
        assert_eq!(class_of(256), Some((3, 256)));
        assert_eq!(class_of(257), Some((4, 320)));
        assert_eq!(class_of(512), Some((7, 512)));
        assert_eq!(class_of(513), Some((8, 640)));
        // A 1 KiB value and its header.
        assert_eq!(class_of(1032), Some((12, 1280)));
        assert_eq!(class_of(8192), Some((23, 8192)));
        assert_eq!(class_of(32 << 20), Some((CLASSES - 1, 32 << 20)));
        assert_eq!(class_of((32 << 20) + 1), None);
        assert_eq!(class_of(u64::MAX), None);
    }

    proptest::proptest! {
        /// Every size up to the largest class gets the smallest class that
        /// holds it: cache-line multiples, a fifth at most wasted above
        /// 256 bytes, classes in order of size.
        #[test]
        fn a_size_gets_the_smallest_class_that_holds_it(size in 1u64..=(32 << 20)) {
            let (class, obj) = class_of(size).unwrap();
            proptest::prop_assert!(obj >= size && obj.is_multiple_of(MIN_OBJECT));
            proptest::prop_assert_eq!(class_size(class), obj);
            proptest::prop_assert!(size <= 256 || obj * 4 < size * 5, "{} in {}", size, obj);
            if class > 0 {
                proptest::prop_assert!(class_size(class - 1) < size);
            }
        }
    }

    /// A client uses at most [`USED_CLASSES`] sizes on a node at once; a
    /// class that is used up gives its place to another, one still in use
    /// makes the next size an error that says so.
    #[test]
    fn used_up_classes_give_their_place() {
        use crate::sim::{Sim, SimConfig};
        use crate::substrate::space::Region;

        let mut sim = Sim::new(SimConfig { nodes: 1, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        let (full, after) = sim
            .block_on(async move {
                Region::format_fresh(&mem, NodeId(0), 1 << 20, 4 << 10).await.unwrap();
                let mut slab = SlabAllocator::new();
                // Classes of 64 B to 1 KiB: each takes a 4 KiB chunk.
                for c in 0..USED_CLASSES {
                    slab.alloc(&mem, NodeId(0), class_size(c)).await.unwrap();
                }
                let full = slab.alloc(&mem, NodeId(0), class_size(USED_CLASSES)).await;
                // The 1 KiB class's chunk, used up.
                while slab.alloc_local(NodeId(0), class_size(USED_CLASSES - 1)).is_some() {}
                let after = slab.alloc(&mem, NodeId(0), class_size(USED_CLASSES)).await;
                (full, after)
            })
            .unwrap();
        assert_eq!(full, Err(AllocError::TooManyClasses { node: NodeId(0) }));
        assert!(alloc::format!("{}", full.unwrap_err()).contains("more than 12 object sizes"));
        assert!(after.is_ok(), "{after:?}");
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

    /// Marks: carving past a chunk's mark moves it a quarter chunk ahead,
    /// and only then is a record due; a record names each chunk from its
    /// mark, a hand-over from its bump; the next holder after a crash
    /// carves from the mark, above every object carved before it.
    #[test]
    fn marks_move_a_quarter_chunk_ahead_and_a_crashed_holders_next_carves_above_them() {
        use crate::sim::{Sim, SimConfig};
        use crate::substrate::space::Region;

        let chunk = 4 << 10;
        let mut sim = Sim::new(SimConfig { nodes: 1, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        sim.block_on(async move {
            Region::format_fresh(&mem, NodeId(0), 1 << 20, chunk).await.unwrap();
            let mut slab = SlabAllocator::new();
            let first = slab.alloc(&mem, NodeId(0), 64).await.unwrap().offset;
            assert!(slab.unrecorded(), "a fresh chunk's first object moves its mark");
            slab.record_marks(&mem, None).await.unwrap();
            // The rest of the first quarter: no record due.
            for _ in 1..16 {
                slab.alloc_local(NodeId(0), 64).unwrap();
                assert!(!slab.unrecorded());
            }
            let past = slab.alloc_local(NodeId(0), 64).unwrap().offset;
            assert_eq!(past, first + 1024);
            assert!(slab.unrecorded(), "an object past the mark moves it");
            let chunk_of = |p: &Payload| carries(p).find(|c| c.class == 0).unwrap();
            let marked = slab.marked([0; HEAD_WORDS], None);
            assert_eq!(chunk_of(&marked).bump, first + 2048, "a quarter chunk ahead of the last mark");
            assert_eq!(chunk_of(&slab.hand_over([0; HEAD_WORDS], None)).bump, past + 64);
            let mut next = SlabAllocator::new();
            assert_eq!(next.take_over_marked(&marked), 1);
            let resumed = next.alloc(&mem, NodeId(0), 64).await.unwrap().offset;
            assert_eq!(resumed, first + 2048);
        })
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever a client carves (sizes, local or not) and whenever it
        /// records its marks, if it publishes only what it carved before a
        /// record that held the marks, the next holder after its crash,
        /// going on from the last record, never carves under a published
        /// object.
        #[test]
        fn the_next_holder_never_carves_under_a_published_object(
            steps in proptest::collection::vec((0u64..3, proptest::bool::ANY, 0u8..4), 1..120),
        ) {
            use crate::sim::{Sim, SimConfig};
            use crate::substrate::space::Region;

            let chunk = 4 << 10;
            let mut sim = Sim::new(SimConfig { nodes: 1, node_size: 1 << 20, ..SimConfig::default() });
            let mem = sim.client();
            let overlaps = sim.block_on(async move {
                Region::format_fresh(&mem, NodeId(0), 1 << 20, chunk).await.unwrap();
                let mut slab = SlabAllocator::new();
                let mut record = slab.marked([0; HEAD_WORDS], None);
                // Carved, not yet published; published.
                let (mut carved, mut published) = (alloc::vec::Vec::new(), alloc::vec::Vec::new());
                for (class, local, act) in steps {
                    let size = class_size(class as usize);
                    let got = if local { slab.alloc_local(NodeId(0), size) } else { None };
                    let got = match got {
                        Some(a) => Some(a),
                        None => slab.alloc(&mem, NodeId(0), size).await.ok(),
                    };
                    if let Some(a) = got {
                        carved.push((a.offset, size));
                    }
                    if act == 0 {
                        record = slab.marked([0; HEAD_WORDS], None);
                        slab.record_marks(&mem, None).await.unwrap();
                    }
                    if !slab.unrecorded() {
                        published.append(&mut carved);
                    }
                }
                let mut next = SlabAllocator::new();
                next.take_over_marked(&record);
                let under = |a: RemoteAddr, size: u64| published.iter().any(|&(o, s)| a.offset < o + s && o < a.offset + size);
                let mut overlaps = alloc::vec::Vec::new();
                for class in 0..3 {
                    let size = class_size(class);
                    // The first opens the node (and takes its chunks over);
                    // then the rest of the chunk.
                    let mut got = next.alloc(&mem, NodeId(0), size).await.ok();
                    while let Some(a) = got {
                        if under(a, size) {
                            overlaps.push(a.offset);
                        }
                        got = next.alloc_local(NodeId(0), size);
                    }
                }
                overlaps
            }).unwrap();
            proptest::prop_assert!(overlaps.is_empty(), "carved again under published objects at {:?}", overlaps);
        }
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
