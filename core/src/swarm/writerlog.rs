//! Writers' logs: where out-of-place copies of values and the timestamp
//! locks of writes live (SWARM §4.3; the layout of the authors' code).
//!
//! Every client owns a log on every memory node, an array of entries indexed
//! by a *log id* that the client never reuses. A write takes the next log id
//! and uses entry `(client, log id)` on each replica node: the entry holds
//! the write's timestamp-lock word and the out-of-place copy of its value.
//! The metadata word names the entry ([`crate::swarm::meta::Meta`]), so any process
//! can find the copy, write it back to a lagging replica (identical bytes),
//! or lock the write's timestamp.
//!
//! A log grows by segments of one region chunk each. Each node has a log
//! directory, found through root slot [`roots::LOG_DIR`]:
//!
//! ```text
//! header   magic | entry size | segments per client | entries per segment
//! row c    high-water log id of client c | segment 0 | segment 1 | ...
//! ```
//!
//! Segment words are claimed by CAS, so the writer and a reader writing a
//! value back agree on one segment. Entries are never recycled (the paper
//! leaves recycling to future work, §4.5): a client's log holds at most
//! `segments × entries per segment` writes, and its ids survive restarts
//! through the high-water word.
//!
//! Entry layout: `lock word (8) | value length (8) | value bytes`.

use core::fmt;

use crate::substrate::memory::{read_word, word_at};
use crate::substrate::quorum::{MAX_REPLICAS, join_all, majority, quorum};
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::roots;
use crate::substrate::space::slab::{AllocError, SlabAllocator};
use crate::swarm::meta::{MAX_CLIENT, MAX_LOG_ID};
use crate::{MemError, Memory, NodeId, RemoteAddr};

/// "SWARMLG1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"SWARMLG1");
/// Bytes before an entry's value.
pub const ENTRY_HEADER: u64 = 16;
/// Log ids a client reserves at a time.
pub const ID_BATCH: u64 = 1 << 12;
const HEADER_WORDS: u64 = 4;
const CACHE: usize = 64;

/// A failure to use a log.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogError {
    /// A memory operation failed.
    Mem(MemError),
    /// Allocating a segment failed.
    Alloc(AllocError),
    /// Remote data that cannot be right (bad directory, segment outside the
    /// region): a retry may help, or the node is corrupt.
    Corrupt {
        /// The node.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The client's log is full (no recycling).
    Full,
    /// No majority of nodes answered.
    NoQuorum(MemError),
}

impl From<MemError> for LogError {
    fn from(e: MemError) -> Self {
        LogError::Mem(e)
    }
}

/// A node failure stays a [`LogError::Mem`], whichever layer met it, so
/// that callers can tell an unreachable node from a real allocation failure.
impl From<AllocError> for LogError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::Region(r) => r.into(),
            e => LogError::Alloc(e),
        }
    }
}

impl From<RegionError> for LogError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Mem(m) => LogError::Mem(m),
            e => LogError::Alloc(AllocError::Region(e)),
        }
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Mem(e) => write!(f, "{e}"),
            LogError::Alloc(e) => write!(f, "{e}"),
            LogError::Corrupt { node, what } => write!(f, "{node}: corrupt log directory: {what}"),
            LogError::Full => write!(f, "the client's log is full (buffers are not recycled)"),
            LogError::NoQuorum(e) => write!(f, "no majority of nodes answered: {e}"),
        }
    }
}

/// The geometry of every log on a node, as read from its directory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LogGeometry {
    /// Bytes per entry (header + largest value, 64-byte aligned).
    pub entry_size: u64,
    /// Segments a client's log may have.
    pub segments: u64,
    /// Entries per segment.
    pub per_segment: u64,
}

impl LogGeometry {
    /// The geometry for values of up to `max_value` bytes in chunks of
    /// `chunk` bytes, with `segments` segments per client.
    pub fn new(max_value: u64, chunk: u64, segments: u64) -> Result<Self, LogError> {
        if max_value > crate::swarm::inout::MAX_VALUE {
            return Err(LogError::Alloc(AllocError::BadSize { size: max_value }));
        }
        let entry_size = (ENTRY_HEADER + max_value).next_multiple_of(64);
        let per_segment = chunk / entry_size;
        if per_segment == 0 || segments == 0 {
            return Err(LogError::Alloc(AllocError::BadSize { size: entry_size }));
        }
        Ok(LogGeometry { entry_size, segments, per_segment })
    }

    /// Largest value an entry holds.
    pub fn max_value(&self) -> u64 {
        self.entry_size - ENTRY_HEADER
    }

    /// Log ids a client may use.
    pub fn capacity(&self) -> u64 {
        (self.segments * self.per_segment).min(MAX_LOG_ID as u64 + 1)
    }

    /// Bytes of the log directory of a node with this geometry.
    pub fn dir_bytes(&self) -> u64 {
        8 * (HEADER_WORDS + (MAX_CLIENT as u64 + 1) * (1 + self.segments))
    }

    fn row(&self, client: u8) -> u64 {
        8 * (HEADER_WORDS + client as u64 * (1 + self.segments))
    }

    /// Where entry `log_id` of a log is: its segment, and its byte offset
    /// within the segment.
    fn position(&self, log_id: u32) -> (u64, u64) {
        let id = log_id as u64;
        (id / self.per_segment, (id % self.per_segment) * self.entry_size)
    }
}

#[derive(Clone, Copy)]
struct NodeDir {
    node: NodeId,
    base: u64,
    geo: LogGeometry,
    /// Direct-mapped cache of segment offsets: (client, segment + 1, offset).
    cache: [(u8, u64, u64); CACHE],
}

/// Where to look up an entry whose segment is not cached.
struct Uncached {
    /// The directory word holding the segment's offset.
    word: RemoteAddr,
    /// The entry's offset within its segment.
    within: u64,
    /// The cache slot the segment goes in.
    slot: usize,
}

impl NodeDir {
    /// Entry `(client, log_id)`: its address if its segment is cached, else
    /// where to find the segment; an error if the directory has no such
    /// entry.
    /// `(seg, within)` is the entry's [`LogGeometry::position`].
    fn locate(&self, client: u8, (seg, within): (u64, u64)) -> Result<Result<RemoteAddr, Uncached>, LogError> {
        if seg >= self.geo.segments || client > MAX_CLIENT {
            return Err(LogError::Corrupt { node: self.node, what: "log id or client beyond the directory" });
        }
        let slot = (client as usize * 31 + seg as usize) % CACHE;
        Ok(match self.cache[slot] {
            (c, s, off) if c == client && s == seg + 1 => Ok(RemoteAddr::new(self.node, off + within)),
            _ => Err(Uncached {
                word: RemoteAddr::new(self.node, self.base + self.geo.row(client) + 8 * (1 + seg)),
                within,
                slot,
            }),
        })
    }
}

/// One client's view of the log directories of the nodes it uses.
#[derive(Default)]
pub struct Logs {
    nodes: heapless::Vec<NodeDir, { 4 * MAX_REPLICAS }>,
}

/// Creates the log directory on `node` (once, by whoever sets the node up,
/// after [`Region::format`]).
pub async fn format<M: Memory>(mem: &M, node: NodeId, geo: LogGeometry) -> Result<(), LogError> {
    let mut region = Region::open(mem, node).await?;
    let chunks = geo.dir_bytes().div_ceil(region.chunk);
    let base = region.alloc_chunks(mem, chunks).await?;
    let header = [MAGIC, geo.entry_size, geo.segments, geo.per_segment];
    let mut bytes = [0u8; 8 * HEADER_WORDS as usize];
    for (i, w) in header.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    mem.write(base, &bytes).await?;
    Region::claim_root(mem, node, roots::LOG_DIR, base.offset).await?;
    Ok(())
}

impl Logs {
    /// A client that knows no directory yet.
    pub fn new() -> Self {
        Self::default()
    }

    async fn dir<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<&mut NodeDir, LogError> {
        if let Some(i) = self.nodes.iter().position(|d| d.node == node) {
            return Ok(&mut self.nodes[i]);
        }
        let corrupt = |what| LogError::Corrupt { node, what };
        let base = Region::read_root(mem, node, roots::LOG_DIR).await?;
        if base == 0 {
            return Err(corrupt("no log directory (node not formatted for SWARM)"));
        }
        let h = mem.read(RemoteAddr::new(node, base), 8 * HEADER_WORDS as usize).await?;
        let word = |i: usize| word_at(&h, 8 * i).ok_or(corrupt("truncated header"));
        let (magic, entry_size, segments, per_segment) = (word(0)?, word(1)?, word(2)?, word(3)?);
        if magic != MAGIC || entry_size < ENTRY_HEADER || entry_size % 64 != 0 || segments == 0 || per_segment == 0 {
            return Err(corrupt("bad header"));
        }
        // At most what `LogGeometry::new` makes: every product of them fits
        // in 64 bits.
        let largest = (ENTRY_HEADER + crate::swarm::inout::MAX_VALUE).next_multiple_of(64);
        if segments > 1 << 20 || per_segment > 1 << 24 || entry_size > largest {
            return Err(corrupt("impossible geometry"));
        }
        let geo = LogGeometry { entry_size, segments, per_segment };
        if base.checked_add(geo.dir_bytes()).is_none() {
            return Err(corrupt("directory beyond the address space"));
        }
        let d = NodeDir { node, base, geo, cache: [(0, 0, 0); CACHE] };
        self.nodes.push(d).map_err(|_| corrupt("too many nodes"))?;
        Ok(self.nodes.last_mut().expect("just pushed"))
    }

    /// The geometry of `node`'s logs.
    pub async fn geometry<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<LogGeometry, LogError> {
        Ok(self.dir(mem, node).await?.geo)
    }

    /// The address of entry `(client, log_id)` on `node`. With `alloc`, a
    /// missing segment is created (the writer, or a reader writing a value
    /// back); without, a missing segment is `Ok(None)`.
    pub async fn entry<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        client: u8,
        log_id: u32,
        alloc: Option<&mut SlabAllocator>,
    ) -> Result<Option<RemoteAddr>, LogError> {
        let mut all = self.entries(mem, &[node], client, log_id, alloc).await;
        all.pop().unwrap_or(Ok(None))
    }

    /// [`Logs::entries`] when this client already knows every one of them
    /// (the common case of a write), into `out`: no future, no roundtrip.
    /// `false` if any must be looked up or is out of the directory's range
    /// (`out` then holds only some).
    pub fn cached_entries(
        &self,
        nodes: &[NodeId],
        client: u8,
        log_id: u32,
        out: &mut heapless::Vec<RemoteAddr, MAX_REPLICAS>,
    ) -> bool {
        out.clear();
        // The nodes of a store share one geometry: one division serves all.
        let mut at: Option<(LogGeometry, (u64, u64))> = None;
        for &node in nodes {
            let Some(d) = self.nodes.iter().find(|d| d.node == node) else { return false };
            let pos = match at {
                Some((geo, pos)) if geo == d.geo => pos,
                _ => at.insert((d.geo, d.geo.position(log_id))).1,
            };
            match d.locate(client, pos) {
                Ok(Ok(addr)) if out.push(addr).is_ok() => {}
                _ => return false,
            }
        }
        true
    }

    /// [`Logs::entry`] and the node's geometry when this client already
    /// knows them (the common case of a read out of place): no future, no
    /// roundtrip. `None` if they must be looked up.
    pub fn cached_entry(&self, node: NodeId, client: u8, log_id: u32) -> Option<(RemoteAddr, LogGeometry)> {
        let d = self.nodes.iter().find(|d| d.node == node)?;
        d.locate(client, d.geo.position(log_id)).ok()?.ok().map(|at| (at, d.geo))
    }

    /// [`Logs::entry`] on each of `nodes` (at most [`MAX_REPLICAS`]), in
    /// their order. Cached segments cost nothing; the others are looked up,
    /// and created if `alloc` is given, on all nodes at once: at most three
    /// roundtrips (directory words, chunks, CAS of the words) however many
    /// nodes there are.
    pub async fn entries<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        client: u8,
        log_id: u32,
        alloc: Option<&mut SlabAllocator>,
    ) -> heapless::Vec<Result<Option<RemoteAddr>, LogError>, MAX_REPLICAS> {
        // (index in `nodes`, directory word, byte offset within the segment, cache slot)
        let mut missing: heapless::Vec<(usize, RemoteAddr, u64, usize), MAX_REPLICAS> = heapless::Vec::new();
        let mut out: heapless::Vec<Result<Option<RemoteAddr>, LogError>, MAX_REPLICAS> = heapless::Vec::new();
        for (i, &node) in nodes.iter().take(MAX_REPLICAS).enumerate() {
            let d = match self.dir(mem, node).await {
                Ok(d) => d,
                Err(e) => {
                    let _ = out.push(Err(e));
                    continue;
                }
            };
            match d.locate(client, d.geo.position(log_id)) {
                Ok(Ok(addr)) => {
                    let _ = out.push(Ok(Some(addr)));
                }
                Ok(Err(Uncached { word, within, slot })) => {
                    let _ = missing.push((i, word, within, slot));
                    let _ = out.push(Ok(None));
                }
                Err(e) => {
                    let _ = out.push(Err(e));
                }
            }
        }
        if missing.is_empty() {
            return out;
        }
        let reads = join_all(missing.iter().map(|m| read_word(mem, m.1)).collect()).await;
        let mut offs: heapless::Vec<Option<u64>, MAX_REPLICAS> = heapless::Vec::new();
        for (k, r) in reads.results.into_iter().enumerate() {
            match r {
                Some(Ok(off)) => {
                    let _ = offs.push(Some(off));
                }
                Some(Err(e)) => {
                    out[missing[k].0] = Err(LogError::Mem(e));
                    let _ = offs.push(None);
                }
                None => {
                    let _ = offs.push(None);
                }
            }
        }
        if let Some(slab) = alloc {
            let empty: heapless::Vec<usize, MAX_REPLICAS> =
                (0..missing.len()).filter(|&k| offs[k] == Some(0)).collect();
            let targets: heapless::Vec<NodeId, MAX_REPLICAS> = empty.iter().map(|&k| missing[k].1.node).collect();
            let chunks = slab.alloc_chunk_each(mem, &targets).await;
            let mut claims: heapless::Vec<(usize, u64), MAX_REPLICAS> = heapless::Vec::new();
            for (j, chunk) in chunks.into_iter().enumerate() {
                match chunk {
                    Ok(c) => {
                        let _ = claims.push((empty[j], c.offset));
                    }
                    Err(e) => {
                        out[missing[empty[j]].0] = Err(e.into());
                        offs[empty[j]] = None;
                    }
                }
            }
            let cas = join_all(claims.iter().map(|&(k, chunk)| mem.cas(missing[k].1, 0, chunk)).collect()).await;
            for (j, r) in cas.results.into_iter().enumerate() {
                let (k, chunk) = claims[j];
                offs[k] = match r {
                    Some(Ok(0)) => Some(chunk),
                    Some(Ok(prev)) => Some(prev),
                    Some(Err(e)) => {
                        out[missing[k].0] = Err(LogError::Mem(e));
                        None
                    }
                    None => None,
                };
            }
        }
        for (k, &(i, word, within, slot)) in missing.iter().enumerate() {
            let Some(off) = offs[k].filter(|&o| o != 0) else { continue };
            let Some(d) = self.nodes.iter_mut().find(|d| d.node == word.node) else { continue };
            // A segment that would end past the address space is a corrupt
            // directory word; one that fits is cached, and every entry of it
            // then fits too (`locate` adds without overflow).
            if off.checked_add(d.geo.per_segment * d.geo.entry_size).is_none() {
                out[i] = Err(LogError::Corrupt { node: word.node, what: "segment beyond the address space" });
                continue;
            }
            d.cache[slot] = (client, d.geo.position(log_id).0 + 1, off);
            out[i] = Ok(Some(RemoteAddr::new(word.node, off + within)));
        }
        out
    }

    /// Reserves a batch of fresh log ids for `client`, using the high-water
    /// words of a majority of `nodes` so that a restarted client never reuses
    /// an id. Returns the batch as `[start, end)`.
    pub async fn reserve_ids<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        client: u8,
    ) -> Result<(u32, u32), LogError> {
        let need = majority(nodes.len());
        let mut words: heapless::Vec<RemoteAddr, MAX_REPLICAS> = heapless::Vec::new();
        let mut cap = u64::MAX;
        let mut last_err = None;
        for &n in nodes {
            // A node that cannot be reached is left out, like a replica that
            // does not answer; a majority of `nodes` must remain.
            match self.dir(mem, n).await {
                Ok(d) => {
                    cap = cap.min(d.geo.capacity());
                    let _ = words.push(RemoteAddr::new(n, d.base + d.geo.row(client)));
                }
                Err(LogError::Mem(e)) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        if words.len() < need {
            // No error and too few nodes: none were given.
            let none = MemError::new(NodeId(0), crate::MemErrorKind::NoSuchNode);
            return Err(LogError::NoQuorum(last_err.unwrap_or(none)));
        }
        let reads = quorum(words.iter().map(|&w| read_word(mem, w)).collect(), need).await;
        if !reads.reached(need) {
            return Err(LogError::NoQuorum(*reads.first_error().expect("failed quorum has an error")));
        }
        let start = reads.oks().map(|(_, &v)| v).max().unwrap_or(0);
        let end = (start + ID_BATCH).min(cap);
        if start >= end {
            return Err(LogError::Full);
        }
        let bumps =
            quorum(words.iter().map(|&w| crate::objects::max::cas_max(mem, w, start, end)).collect(), need).await;
        if !bumps.reached(need) {
            return Err(LogError::NoQuorum(*bumps.first_error().expect("failed quorum has an error")));
        }
        Ok((start as u32, end as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Sim, SimConfig};

    /// The synchronous lookup a write takes first agrees with `entries`, and
    /// answers only what the client already knows.
    #[test]
    fn cached_entries_answer_only_known_segments_and_agree_with_entries() {
        let mut sim = Sim::new(SimConfig { seed: 3, nodes: 3, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        let nodes = [NodeId(0), NodeId(1), NodeId(2)];
        let geo = LogGeometry::new(64, 16 << 10, 4).unwrap();
        let out = sim
            .block_on(async move {
                for &n in &nodes {
                    Region::format(&mem, n, 1 << 20, 16 << 10).await.unwrap();
                    format(&mem, n, geo).await.unwrap();
                }
                let (mut logs, mut slab) = (Logs::new(), SlabAllocator::new());
                let cached = |logs: &Logs, client, id| {
                    let mut out = heapless::Vec::new();
                    logs.cached_entries(&nodes, client, id, &mut out).then_some(out)
                };
                let unknown = cached(&logs, 5, 3);
                let made = logs.entries(&mem, &nodes, 5, 3, Some(&mut slab)).await;
                let made: heapless::Vec<RemoteAddr, MAX_REPLICAS> =
                    made.into_iter().map(|e| e.unwrap().unwrap()).collect();
                let same_segment = cached(&logs, 5, 4);
                let next_segment = cached(&logs, 5, geo.per_segment as u32);
                let other_client = cached(&logs, 6, 3);
                let beyond = cached(&logs, 5, (geo.capacity() + 1) as u32);
                (unknown, made, cached(&logs, 5, 3), same_segment, next_segment, other_client, beyond)
            })
            .unwrap();
        let (unknown, made, cached, same_segment, next_segment, other_client, beyond) = out;
        assert_eq!(unknown, None, "nothing is known before the first lookup");
        assert_eq!(cached.as_ref(), Some(&made), "the cache gives what entries made");
        let next: heapless::Vec<RemoteAddr, MAX_REPLICAS> =
            made.iter().map(|a| RemoteAddr::new(a.node, a.offset + geo.entry_size)).collect();
        assert_eq!(same_segment, Some(next), "the next entry of a known segment");
        assert_eq!((next_segment, other_client, beyond), (None, None, None));
    }

    /// Reserving ids on no nodes at all is an error, not a panic.
    #[test]
    fn reserving_on_no_nodes_is_an_error() {
        let mut sim = Sim::new(SimConfig { seed: 5, nodes: 1, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        let got = sim.block_on(async move { Logs::new().reserve_ids(&mem, &[], 5).await }).unwrap();
        assert_eq!(got, Err(LogError::NoQuorum(MemError::new(NodeId(0), crate::MemErrorKind::NoSuchNode))));
    }

    /// Directory words no client wrote give `Corrupt` errors: never an
    /// overflow (a panic in debug builds) or an address that wrapped.
    #[test]
    fn corrupt_directories_are_errors() {
        let mut sim = Sim::new(SimConfig { seed: 4, nodes: 2, node_size: 1 << 20, ..SimConfig::default() });
        let mem = sim.client();
        let geo = LogGeometry::new(64, 16 << 10, 4).unwrap();
        let (huge_entries, wrapping_segment) = sim
            .block_on(async move {
                for n in 0..2 {
                    Region::format(&mem, NodeId(n), 1 << 20, 16 << 10).await.unwrap();
                    format(&mem, NodeId(n), geo).await.unwrap();
                }
                let word = async |node, off: u64, value: u64| {
                    let base = Region::read_root(&mem, node, roots::LOG_DIR).await.unwrap();
                    mem.write(RemoteAddr::new(node, base + off), &value.to_le_bytes()).await.unwrap();
                };
                // Node 0: an entry size no geometry has.
                word(NodeId(0), 8, 1 << 62).await;
                // Node 1: client 5's first segment at the end of the address space.
                word(NodeId(1), geo.row(5) + 8, u64::MAX - 64).await;
                let mut logs = Logs::new();
                (logs.entry(&mem, NodeId(0), 5, 1, None).await, logs.entry(&mem, NodeId(1), 5, 1, None).await)
            })
            .unwrap();
        assert!(matches!(huge_entries, Err(LogError::Corrupt { what: "impossible geometry", .. })), "{huge_entries:?}");
        let beyond = Err(LogError::Corrupt { node: NodeId(1), what: "segment beyond the address space" });
        assert_eq!(wrapping_segment, beyond);
    }
}
