//! Writers' logs: where out-of-place copies of values and the timestamp
//! locks of writes live (SWARM §4.3; the layout of the authors' code, with
//! segments found by time), as a ring of segments that their writer
//! recycles ([`crate::swarm::recycle`]).
//!
//! Every client owns a log on every memory node. A log is a set of
//! *segments* of `per_segment` entries, numbered the same on every node: a
//! client writes into slot after slot of its current segment, and starts a
//! new segment when that one is full (or when it resumes its id after a
//! crash), under a number that is free: never used, or given back once no
//! entry of its segment was needed any more ([`Logs::mark_free`]; the
//! segment's memory on each node stays with its number there, for the
//! writer's next segment under it). A segment starts at `start`, the time
//! of its first write, so that a client's times (strictly increasing) fall
//! in its segments in order. A metadata word names `(client, time, slot)`
//! ([`crate::swarm::meta::Meta`]); its entry is slot `slot` of the segment
//! that started last at or before `time`, whatever its number. A node holds
//! the segments its writer created there (on every node at once, when it
//! starts one) and those readers writing values back created where it was
//! missing; each node's log directory says where they are and when they
//! started, so any process can find a write's copy, write it back to a
//! lagging replica (identical bytes), or lock the write's timestamp.
//!
//! A node's log directory, found through root slot [`roots::LOG_DIR`]:
//!
//! ```text
//! header   magic | entry size | segments per client | entries per segment
//! row c    per segment: start time (8) | offset (8, 0 until it exists here)
//! ```
//!
//! A segment is created on a node with one ordered pipeline, its start time
//! then a CAS of its offset, so whoever sees the offset sees the start; the
//! writer and a reader writing a value back agree on one segment. A
//! segment given back has the start [`FREE`] and keeps its offset: only
//! its writer starts a new one under the number ([`Logs::write_in`]).
//! Beyond [`KEEP_FREE`] of them, the writer gives their memory to the
//! node's pool ([`Logs::release_surplus`], [`crate::substrate::space::pool`]),
//! for any client: the number's start becomes [`RELEASED`] and its offset
//! 0, and again only its writer starts a segment under it (with fresh
//! memory). A
//! node that answers for a number with another start than the one asked
//! for holds another segment under it ([`LogError::Stale`]).
//!
//! An entry says which write it holds, so that a reader who guessed its
//! segment from what it knows of the directory (no roundtrip) can check,
//! and so that its writer can recycle it without remembering it:
//!
//! ```text
//! entry    lock word (8) | id (8) | replicas (8 bits) value length (56) | checksum (8)
//!          | tag (8) | object (8) | value bytes
//! ```
//!
//! `id` is the write's metadata word, GUESSED; `object` the offset of the
//! register's replica on this node, `tag` its tag, `replicas` how many
//! the register has; the checksum (xxh3 of the value, seeded by `id`, the
//! length and the tag, and mixed with the object and the replicas) catches
//! a torn or garbled copy, and an entry that was recycled for another write
//! or object. An entry belongs to one write: Safe-Guess' slow-path rewrite
//! (§3.2) is a write of its own, in an entry of its own, so that every copy
//! of an entry is the same bytes however late a copy lands. A client's log
//! holds `segments × per_segment` writes that are not recycled yet
//! ([`LogError::Full`] says so, with the numbers).

use core::fmt;
use core::ops::ControlFlow;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::substrate::late::{Watch, in_turn, late};
use crate::substrate::lease::LeaseError;
use crate::substrate::memory::word_at;
use crate::substrate::quorum::{MAX_REPLICAS, join_timely};
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::slab::{AllocError, Carver, class_of};
use crate::substrate::space::{pool, roots};
use crate::swarm::meta::{MAX_CLIENT, MAX_SLOT, Meta};
use crate::{MemError, Memory, NodeId, Op, OpOutput, RemoteAddr};

/// "SWARMLG2".
pub const MAGIC: u64 = u64::from_le_bytes(*b"SWARMLG2");
/// Bytes before an entry's value: its lock word and its header.
pub const ENTRY_HEADER: u64 = 8 + ENTRY_ID_BYTES as u64;
/// The most entries a segment may have (what a metadata word's slot names).
pub const MAX_PER_SEGMENT: u64 = MAX_SLOT as u64 + 1;
/// The most segments a client's log may have (numbers, reused once given
/// back: what a [`SegmentSet`] holds).
pub const MAX_SEGMENTS: u64 = 1024;

/// A set of segment numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentSet([u64; MAX_SEGMENTS as usize / 64]);

impl SegmentSet {
    /// Adds `s` (ignored beyond [`MAX_SEGMENTS`]).
    pub fn insert(&mut self, s: u32) {
        if let Some(w) = self.0.get_mut(s as usize / 64) {
            *w |= 1 << (s % 64);
        }
    }

    /// Removes `s`.
    pub fn remove(&mut self, s: u32) {
        if let Some(w) = self.0.get_mut(s as usize / 64) {
            *w &= !(1 << (s % 64));
        }
    }

    /// Whether `s` is in.
    pub fn contains(&self, s: u32) -> bool {
        self.0.get(s as usize / 64).is_some_and(|w| w & (1 << (s % 64)) != 0)
    }

    /// The first number below `below` not in the set.
    pub fn first_absent(&self, below: u64) -> Option<u32> {
        (0..below.min(MAX_SEGMENTS) as u32).find(|&s| !self.contains(s))
    }

    /// How many are in.
    pub fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The numbers in the set, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..MAX_SEGMENTS as u32).filter(|&s| self.contains(s))
    }
}
const HEADER_WORDS: u64 = 4;
/// Segments of a node's directory this client remembers (direct-mapped).
const CACHE: usize = 128;
/// The start of a segment given back ([`Logs::mark_free`]): its memory stays
/// with its number on that node, for the owner's next segment there.
pub const FREE: u64 = u64::MAX;
/// The start of a number whose memory went to the node's pool
/// ([`Logs::release_surplus`]): its offset is 0, and only its owner starts
/// a segment under it again (with fresh memory).
pub const RELEASED: u64 = u64::MAX - 1;
/// Segments given back that a client keeps with their memory on each node,
/// for its next ones; the rest go to the node's pool, for any client.
pub const KEEP_FREE: usize = 2;

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
    /// The node has no log directory: it was not set up for SWARM.
    NoLog(NodeId),
    /// The client's log is full: every entry of its id holds a write that
    /// is not recycled yet (its writer does not run `keep`, or a node that
    /// holds its segments is down).
    Full {
        /// The client id.
        client: u8,
        /// Entries a log has: segments × entries per segment.
        capacity: u64,
    },
    /// No majority of nodes answered.
    NoQuorum(MemError),
    /// The lease record that must name a new segment's memory before it is
    /// used could not be written.
    Lease(LeaseError),
    /// The node holds another segment (an older one, not recycled there
    /// yet, or a newer one) under the number asked for: the entry is not
    /// there, as on a node that does not answer.
    Stale(NodeId),
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
            LogError::NoLog(node) => write!(f, "{node}: no writer logs (the node was not set up for SWARM)"),
            LogError::Full { client, capacity } => write!(
                f,
                "client id {client} has used all {capacity} entries of its log: none is recycled yet (the \
                 client must run keep between operations; a node down keeps the segments it holds)"
            ),
            LogError::NoQuorum(e) => write!(f, "no majority of nodes answered: {e}"),
            LogError::Lease(e) => write!(f, "{e}"),
            LogError::Stale(node) => write!(f, "{node} holds another log segment under that number"),
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
    /// Entries per segment (at most [`MAX_PER_SEGMENT`]).
    pub per_segment: u64,
}

impl LogGeometry {
    /// The geometry for values of up to `max_value` bytes in segments of
    /// one `chunk`-byte chunk, `segments` segments per client.
    pub fn new(max_value: u64, chunk: u64, segments: u64) -> Result<Self, LogError> {
        if max_value > crate::swarm::inout::MAX_VALUE {
            return Err(LogError::Alloc(AllocError::BadSize { size: max_value }));
        }
        let entry_size = (ENTRY_HEADER + max_value).next_multiple_of(64);
        // A segment is an object of the slab's size class for its bytes,
        // which must fit in a chunk (a chunk that is not a power of two
        // may be below the class of what it holds).
        let mut per_segment = (chunk / entry_size).min(MAX_PER_SEGMENT);
        while per_segment > 0 && class_of(per_segment * entry_size).is_none_or(|(_, obj)| obj > chunk) {
            per_segment -= 1;
        }
        if per_segment == 0 || segments == 0 || segments > MAX_SEGMENTS {
            return Err(LogError::Alloc(AllocError::BadSize { size: entry_size }));
        }
        Ok(LogGeometry { entry_size, segments, per_segment })
    }

    /// Bytes a segment takes: the slab's object of the size class of its
    /// entries ([`LogGeometry::new`] makes it fit in a chunk).
    pub fn segment_bytes(&self) -> u64 {
        let bytes = self.per_segment * self.entry_size;
        class_of(bytes).map_or(bytes, |(_, obj)| obj)
    }

    /// Largest value an entry holds.
    pub fn max_value(&self) -> u64 {
        self.entry_size - ENTRY_HEADER
    }

    /// Writes a client id's log holds.
    pub fn capacity(&self) -> u64 {
        self.segments * self.per_segment
    }

    /// Bytes of the log directory of a node with this geometry.
    pub fn dir_bytes(&self) -> u64 {
        8 * HEADER_WORDS + (MAX_CLIENT as u64 + 1) * self.row_bytes()
    }

    fn row_bytes(&self) -> u64 {
        16 * self.segments
    }

    fn row(&self, client: u8) -> u64 {
        8 * HEADER_WORDS + client as u64 * self.row_bytes()
    }

    /// Offset of the descriptor `[start, offset]` of `client`'s segment `s`.
    fn descriptor(&self, client: u8, s: u32) -> u64 {
        self.row(client) + 16 * s as u64
    }
}

/// How the client logs use one node's memory (each segment takes one
/// chunk of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogUsage {
    /// Segments holding entries that may still be needed.
    pub in_use: u64,
    /// Segments given back by their writer ([`FREE`]): their memory waits,
    /// with their number, for that client id's next segment.
    pub free: u64,
    /// Client ids with at least one segment on the node.
    pub ids: u32,
}

/// How one node's memory is used, for reports (`swarm memnode stats`, the
/// memory per key of `swarm bench`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeMemory {
    /// The region's size, bytes.
    pub size: u64,
    /// Bytes claimed from the region (its header and the chunks handed
    /// out).
    pub claimed: u64,
    /// Of which given back: log segments that their client id's next
    /// segments reuse, and the node's pool, which any client takes from
    /// once no chunk is left ([`crate::substrate::space::pool`]).
    pub reclaimable: u64,
    /// Of which in the node's pool.
    pub pooled: u64,
    /// The client logs' segments (none on a node without a log directory).
    pub log: LogUsage,
}

impl NodeMemory {
    /// Bytes claimed and not given back.
    pub fn live(&self) -> u64 {
        self.claimed.saturating_sub(self.reclaimable)
    }

    /// Bytes never claimed.
    pub fn free(&self) -> u64 {
        self.size.saturating_sub(self.claimed)
    }
}

/// The segments a directory row describes (`geo`'s), with memory on the
/// node: `(number, start, offset)`; a row cut short ends early.
fn descriptors(row: &[u8], geo: LogGeometry) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
    (0..geo.segments as u32)
        .map_while(move |s| {
            let at = 16 * s as usize;
            Some((s, word_at(row, at)?, word_at(row, at + 8)?))
        })
        .filter(|&(_, _, offset)| offset != 0)
}

/// Where a write's entry is in its client's log, the same on every node:
/// the segment and the slot, and the segment's start time (which a node
/// that does not hold the segment yet is given when it is created there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The segment.
    pub segment: u32,
    /// The entry within it.
    pub slot: u32,
    /// The time of the segment's first write.
    pub start: u64,
}

/// What an entry says of the write it holds, after its lock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// The GUESSED word of the write.
    pub id: Meta,
    /// Bytes of the value.
    pub len: u64,
    /// Replicas of the register written (2f+1).
    pub replicas: u8,
    /// The object's tag ([`crate::swarm::inout::Layout::tag`]).
    pub tag: u64,
    /// The offset of the object's replica on this entry's node, 0 in a
    /// template: what the entry's owner recycles it by
    /// ([`crate::swarm::recycle`]), whoever wrote it.
    pub obj: u64,
    /// The checksum of the value, the tag, the object and the id: of the
    /// value alone in a template ([`value_sum`]).
    pub sum: u64,
}

/// Bytes of an [`EntryHeader`] on memory.
pub const ENTRY_ID_BYTES: usize = 40;

/// The checksum of `value` in the entry of write `id` to an object tagged
/// `tag` ([`crate::swarm::inout::Layout::tag`]).
pub fn value_sum(id: Meta, tag: u64, value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, id.guessed().0 ^ (value.len() as u64).rotate_left(29) ^ tag.rotate_left(11) ^ 0x5357_4c47)
}

/// What a header's place (object and replica count) adds to its checksum:
/// 0 for a template (no object), so that placing a template is one XOR.
fn place_sum(id: Meta, obj: u64, replicas: u8) -> u64 {
    if obj == 0 {
        return 0;
    }
    // splitmix64's finaliser: any changed bit changes half of the sum.
    let mut z = obj ^ (replicas as u64) << 56 ^ id.guessed().0.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

impl EntryHeader {
    /// The template of the headers of write `id` of `value` to a register
    /// of `replicas` replicas tagged `tag`: [`EntryHeader::placed`] makes
    /// each replica's.
    pub fn of(id: Meta, tag: u64, replicas: u8, value: &[u8]) -> EntryHeader {
        EntryHeader { id: id.guessed(), len: value.len() as u64, replicas, tag, obj: 0, sum: value_sum(id, tag, value) }
    }

    /// The header of this write in the entry that goes with the register's
    /// replica at `obj` (on the entry's node).
    pub fn placed(self, obj: u64) -> EntryHeader {
        let t = self.template();
        EntryHeader { obj, sum: t.sum ^ place_sum(t.id, obj, t.replicas), ..t }
    }

    /// The template this header was placed from.
    pub fn template(self) -> EntryHeader {
        EntryHeader { obj: 0, sum: self.sum ^ place_sum(self.id, self.obj, self.replicas), ..self }
    }

    /// Its bytes.
    pub fn encode(&self) -> [u8; ENTRY_ID_BYTES] {
        let mut b = [0u8; ENTRY_ID_BYTES];
        let len = self.len | (self.replicas as u64) << 56;
        for (i, w) in [self.id.0, len, self.sum, self.tag, self.obj].into_iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Reads a header from `b` (the bytes after the lock word).
    pub fn decode(b: &[u8]) -> Option<EntryHeader> {
        let w = |i: usize| word_at(b, 8 * i);
        let len = w(1)?;
        Some(EntryHeader {
            id: Meta(w(0)?),
            len: len & ((1 << 56) - 1),
            replicas: (len >> 56) as u8,
            sum: w(2)?,
            tag: w(3)?,
            obj: w(4)?,
        })
    }

    /// Whether this entry holds the write of `meta` (either flag, wherever
    /// its value is now).
    pub fn holds(&self, meta: Meta) -> bool {
        let m = meta.guessed();
        !m.is_bottom() && self.id == m
    }

    /// Whether `value` is the value this header describes, whole, of an
    /// object tagged `tag`, and the header whole with it.
    pub fn checks(&self, tag: u64, value: &[u8]) -> bool {
        value.len() as u64 == self.len
            && self.tag == tag
            && value_sum(self.id, tag, value) ^ place_sum(self.id, self.obj, self.replicas) == self.sum
    }
}

/// What a write puts in its log entry on each replica: where, and the
/// header that names it. A value written back to a replica is copied with
/// the header it has on the replica it was read from, so that every copy
/// of an entry is the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogCopy {
    /// The entry.
    pub place: Place,
    /// Its header.
    pub header: EntryHeader,
}

/// One segment of one client on one node, as this client knows it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Known {
    /// `client + 1` (0: the cache slot is empty).
    client: u16,
    segment: u32,
    start: u64,
    offset: u64,
}

#[derive(Clone, Copy)]
struct NodeDir {
    node: NodeId,
    base: u64,
    geo: LogGeometry,
    /// Direct-mapped cache of segments.
    cache: [Known; CACHE],
}

fn slot_of(client: u8, segment: u32) -> usize {
    (client as usize * 31 + segment as usize) % CACHE
}

impl NodeDir {
    /// The segment `segment` of `client` that started at `start`, if this
    /// client knows where it is (another segment under the same number, an
    /// earlier one since given back, is not it).
    fn known(&self, client: u8, segment: u32, start: u64) -> Option<Known> {
        let k = self.cache[slot_of(client, segment)];
        (k.client == client as u16 + 1 && k.segment == segment && k.start == start).then_some(k)
    }

    fn forget(&mut self, client: u8, segment: u32) {
        let k = &mut self.cache[slot_of(client, segment)];
        if k.client == client as u16 + 1 && k.segment == segment {
            *k = Known::default();
        }
    }

    fn remember(&mut self, client: u8, segment: u32, start: u64, offset: u64) {
        self.cache[slot_of(client, segment)] = Known { client: client as u16 + 1, segment, start, offset };
    }

    /// The address of slot `slot` of a segment at `offset` (checked: it
    /// comes from memory).
    fn entry_at(&self, offset: u64, slot: u32) -> Result<RemoteAddr, LogError> {
        if slot as u64 >= self.geo.per_segment {
            return Err(LogError::Corrupt { node: self.node, what: "slot beyond its segment" });
        }
        offset
            .checked_add(slot as u64 * self.geo.entry_size)
            .filter(|_| offset.checked_add(self.geo.per_segment * self.geo.entry_size).is_some())
            .map(|at| RemoteAddr::new(self.node, at))
            .ok_or(LogError::Corrupt { node: self.node, what: "segment beyond the address space" })
    }

    /// The segment of `client` that holds time `t` among those this client
    /// knows on this node: the known one with the latest start at or before
    /// `t`.
    fn guess(&self, client: u8, t: u64) -> Option<Known> {
        let mut best: Option<Known> = None;
        for k in self.cache.iter().filter(|k| k.client == client as u16 + 1 && k.start <= t) {
            if best.is_none_or(|b| k.start > b.start) {
                best = Some(*k);
            }
        }
        best
    }
}

/// One client's view of the log directories of the nodes it uses.
#[derive(Default)]
pub struct Logs {
    nodes: heapless::Vec<NodeDir, { 4 * MAX_REPLICAS }>,
    /// The segment its owner writes in now `(client, number, start)`: the
    /// only one [`Logs::entries`] starts under a number given back.
    writing: Option<(u8, u32, u64)>,
    /// Nodes (bit `n`) whose pool this client gave segments to and has
    /// not found empty since: its next segments there come from the pool
    /// first, so that its own burst's memory serves its later segments
    /// rather than fresh chunks.
    pooled: u64,
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

    /// Notes that `client`, whose view this is, now writes in segment
    /// `segment` started at `start` ([`Logs::entries`] may start it under
    /// a number given back).
    pub fn write_in(&mut self, client: u8, segment: u32, start: u64) {
        self.writing = Some((client, segment, start));
    }

    async fn dir<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<&mut NodeDir, LogError> {
        if let Some(i) = self.nodes.iter().position(|d| d.node == node) {
            return Ok(&mut self.nodes[i]);
        }
        let d = load_dir(mem, node).await?;
        self.nodes.push(d).map_err(|_| LogError::Corrupt { node, what: "too many nodes" })?;
        Ok(self.nodes.last_mut().expect("just pushed"))
    }

    /// Loads the directories of those of `nodes` not known yet, all at
    /// once, leaving out those that are late once `need` of `nodes` are
    /// known; whether each is known.
    pub(crate) async fn open_dirs<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        need: usize,
    ) -> heapless::Vec<Result<(), LogError>, MAX_REPLICAS> {
        let mut out: heapless::Vec<Result<(), LogError>, MAX_REPLICAS> = nodes.iter().map(|_| Ok(())).collect();
        let unknown: heapless::Vec<usize, MAX_REPLICAS> =
            (0..nodes.len()).filter(|&i| !self.nodes.iter().any(|d| d.node == nodes[i])).collect();
        if unknown.is_empty() {
            return out;
        }
        let futs = unknown.iter().map(|&i| load_dir(mem, nodes[i])).collect();
        let node = |k: usize| nodes[unknown[k]];
        let need = need.saturating_sub(nodes.len() - unknown.len());
        let (loaded, _) = join_timely(futs, need, Watch::on(mem), |k| LogError::Mem(late(node(k)))).await;
        for (k, r) in loaded.results.into_iter().enumerate() {
            out[unknown[k]] = match r {
                Some(Ok(d)) => {
                    self.nodes.push(d).map_err(|_| LogError::Corrupt { node: node(k), what: "too many nodes" })
                }
                Some(Err(e)) => Err(e),
                None => Err(LogError::Mem(late(node(k)))),
            };
        }
        out
    }

    /// The geometry of `node`'s logs if its directory is loaded already.
    pub fn known_geometry(&self, node: NodeId) -> Option<LogGeometry> {
        self.nodes.iter().find(|d| d.node == node).map(|d| d.geo)
    }

    /// The geometry of `node`'s logs.
    pub async fn geometry<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<LogGeometry, LogError> {
        Ok(self.dir(mem, node).await?.geo)
    }

    /// The log geometry (every node of a store has the same), from a
    /// directory this client knows, or else from the first node that
    /// answers: a stalled node is passed over once it is late
    /// ([`in_turn`]), not waited for until its time-out.
    pub async fn any_geometry<M: Memory>(&mut self, mem: &M) -> Result<LogGeometry, LogError> {
        if let Some(d) = self.nodes.first() {
            return Ok(d.geo);
        }
        let (nodes, mut last) = (&mut self.nodes, None);
        let found = in_turn(
            mem,
            mem.node_count(),
            |n| load_dir(mem, NodeId(n as u16)),
            |loaded| match loaded {
                Ok(d) => {
                    let (node, geo) = (d.node, d.geo);
                    let pushed = nodes.push(d).map(|()| geo);
                    ControlFlow::Break(pushed.map_err(|_| LogError::Corrupt { node, what: "too many nodes" }))
                }
                Err(e) => {
                    last = Some(e);
                    ControlFlow::Continue(())
                }
            },
        )
        .await;
        found.unwrap_or_else(|| Err(last.unwrap_or(LogError::Corrupt { node: NodeId(0), what: "no nodes" })))
    }

    /// The entries of write `place` of `client` on each of `nodes` when
    /// this client already knows the segment on all of them (the common case
    /// of a write), into `out`: no future, no roundtrip. `false` if any must
    /// be looked up or created (`out` then holds only some).
    pub fn cached_entries(
        &self,
        nodes: &[NodeId],
        client: u8,
        place: Place,
        out: &mut heapless::Vec<RemoteAddr, MAX_REPLICAS>,
    ) -> bool {
        out.clear();
        for &node in nodes {
            let Some(d) = self.nodes.iter().find(|d| d.node == node) else { return false };
            match d.known(client, place.segment, place.start).map(|k| d.entry_at(k.offset, place.slot)) {
                Some(Ok(addr)) if out.push(addr).is_ok() => {}
                _ => return false,
            }
        }
        true
    }

    /// The entry on `node` of the write of `meta`, from what this client
    /// knows of the node's directory (no roundtrip): its address and place.
    /// It may be another write's entry (a segment this client has not seen
    /// started since): check the entry's header ([`EntryHeader::holds`])
    /// before trusting it, and else [`Logs::locate`].
    pub fn guess(&self, node: NodeId, meta: Meta) -> Option<(RemoteAddr, Place)> {
        let d = self.nodes.iter().find(|d| d.node == node)?;
        let k = d.guess(meta.client(), meta.time())?;
        let addr = d.entry_at(k.offset, meta.slot()).ok()?;
        Some((addr, Place { segment: k.segment, slot: meta.slot(), start: k.start }))
    }

    /// The entry on `node` of the write of `meta`, from the node's
    /// directory row (one roundtrip), which this client then remembers:
    /// the segment the write's time falls in among those the node holds.
    /// Exact on a node the write reached; `None` if the node holds no
    /// segment that early.
    pub async fn locate<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        meta: Meta,
    ) -> Result<Option<(RemoteAddr, Place)>, LogError> {
        let client = meta.client();
        if client > MAX_CLIENT {
            return Err(LogError::Corrupt { node, what: "client beyond the directory" });
        }
        let d = self.dir(mem, node).await?;
        let (base, geo) = (d.base, d.geo);
        let row = mem.read(RemoteAddr::new(node, base + geo.row(client)), geo.row_bytes() as usize).await?;
        let d = self.dir(mem, node).await?;
        // Segment numbers are reused: the one that started last at or
        // before the time, whatever its number.
        let (t, mut found) = (meta.time(), None::<(u32, u64, u64)>);
        for s in 0..geo.segments as u32 {
            let (Some(start), Some(offset)) = (word_at(&row, 16 * s as usize), word_at(&row, 16 * s as usize + 8))
            else {
                break;
            };
            if offset == 0 || start == FREE {
                continue;
            }
            d.remember(client, s, start, offset);
            if start <= t && found.is_none_or(|(_, best, _)| start > best) {
                found = Some((s, start, offset));
            }
        }
        let Some((segment, start, offset)) = found else { return Ok(None) };
        let addr = d.entry_at(offset, meta.slot())?;
        Ok(Some((addr, Place { segment, slot: meta.slot(), start })))
    }

    /// The entry of write `place` of `client` on each of `nodes` (at most
    /// [`MAX_REPLICAS`]), in their order. Known segments cost nothing; the
    /// others are looked up, and created if `alloc` is given (the writer,
    /// or a reader writing a value back), on all nodes at once: at most
    /// three roundtrips (descriptors, chunks, start and CAS) however many
    /// nodes there are. Without `alloc`, a segment a node does not hold is
    /// `Ok(None)`. Nodes that are late once `need` of them have their
    /// entry are left out (as timed out), unless fewer than `need` got
    /// one: those are then waited for.
    pub async fn entries<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        client: u8,
        place: Place,
        mut alloc: Option<Carver<'_>>,
        need: usize,
    ) -> heapless::Vec<Result<Option<RemoteAddr>, LogError>, MAX_REPLICAS> {
        let nodes = &nodes[..nodes.len().min(MAX_REPLICAS)];
        let mut out = self.entries_once(mem, nodes, client, place, alloc.as_mut().map(Carver::reborrow), need).await;
        // Counting the nodes that need no work as successes may have left
        // out a slow node that is needed after all (another failed).
        let timed_out = |r: &Result<Option<RemoteAddr>, LogError>| matches!(r, Err(LogError::Mem(e)) if e.kind == crate::MemErrorKind::TimedOut);
        if out.iter().filter(|r| matches!(r, Ok(Some(_)))).count() < need && out.iter().any(timed_out) {
            let again: heapless::Vec<usize, MAX_REPLICAS> = (0..out.len()).filter(|&i| timed_out(&out[i])).collect();
            let late: heapless::Vec<NodeId, MAX_REPLICAS> = again.iter().map(|&i| nodes[i]).collect();
            let waited = self.entries_once(mem, &late, client, place, alloc, usize::MAX).await;
            for (k, r) in waited.into_iter().enumerate() {
                out[again[k]] = r;
            }
        }
        out
    }

    /// One pass of [`Logs::entries`]: late nodes are left out once `need`
    /// have their entry or need no work (`usize::MAX`: none is).
    async fn entries_once<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        client: u8,
        place: Place,
        alloc: Option<Carver<'_>>,
        need: usize,
    ) -> heapless::Vec<Result<Option<RemoteAddr>, LogError>, MAX_REPLICAS> {
        // (index in `nodes`, descriptor address)
        let mut missing: heapless::Vec<(usize, RemoteAddr), MAX_REPLICAS> = heapless::Vec::new();
        let mut out: heapless::Vec<Result<Option<RemoteAddr>, LogError>, MAX_REPLICAS> = heapless::Vec::new();
        let open = self.open_dirs(mem, nodes, need).await;
        for (i, (&node, opened)) in nodes.iter().zip(open).enumerate() {
            let found = self.nodes.iter_mut().find(|d| d.node == node);
            let d = match opened.and(found.ok_or(LogError::Corrupt { node, what: "too many nodes" })) {
                Ok(d) => d,
                Err(e) => {
                    let _ = out.push(Err(e));
                    continue;
                }
            };
            if place.segment as u64 >= d.geo.segments || client > MAX_CLIENT {
                let _ = out.push(Err(LogError::Corrupt { node, what: "segment or client beyond the directory" }));
                continue;
            }
            match d.known(client, place.segment, place.start) {
                Some(k) => {
                    let _ = out.push(d.entry_at(k.offset, place.slot).map(Some));
                }
                None => {
                    let at = RemoteAddr::new(node, d.base + d.geo.descriptor(client, place.segment));
                    let _ = missing.push((i, at));
                    let _ = out.push(Ok(None));
                }
            }
        }
        if missing.is_empty() {
            return out;
        }
        // What the nodes hold: (start, offset), or nothing yet.
        let futs = missing.iter().map(|m| mem.read(m.1, 16)).collect();
        let known = out.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        let need = need.saturating_sub(known);
        let (reads, _) = join_timely(futs, need, Watch::on(mem), |k| late(missing[k].1.node)).await;
        let mut found: heapless::Vec<Option<(u64, u64)>, MAX_REPLICAS> = heapless::Vec::new();
        for (k, r) in reads.results.into_iter().enumerate() {
            let _ = found.push(match r {
                Some(Ok(b)) => Some((word_at(&b, 0).unwrap_or(0), word_at(&b, 8).unwrap_or(0))),
                Some(Err(e)) => {
                    out[missing[k].0] = Err(LogError::Mem(e));
                    None
                }
                None => None,
            });
        }
        if let Some(mut carver) = alloc {
            let slab = &mut *carver.slab;
            // A number given back on a node keeps its memory there, for its
            // owner's next segment: its new start is all it takes. Nobody
            // else starts a segment under it (a late write-back of an older
            // write would start that write's segment again).
            let owner = self.writing == Some((client, place.segment, place.start));
            let reuse: heapless::Vec<usize, MAX_REPLICAS> = (0..missing.len())
                .filter(|&k| owner && found[k].is_some_and(|(st, off)| st == FREE && off != 0))
                .collect();
            let start = place.start.to_le_bytes();
            let futs = reuse
                .iter()
                .map(|&k| {
                    let (at, start) = (missing[k].1, &start);
                    async move { mem.write(at, start).await }
                })
                .collect();
            let (reused, _) = join_timely(futs, need, Watch::on(mem), |j| late(missing[reuse[j]].1.node)).await;
            for (j, r) in reused.results.into_iter().enumerate() {
                let k = reuse[j];
                found[k] = match r {
                    Some(Ok(())) => found[k].map(|(_, off)| (place.start, off)),
                    Some(Err(e)) => {
                        out[missing[k].0] = Err(LogError::Mem(e));
                        None
                    }
                    None => None,
                };
            }
            // A number whose memory went to the pool is its owner's to
            // start again, as one given back is.
            let empty: heapless::Vec<usize, MAX_REPLICAS> = (0..missing.len())
                .filter(|&k| found[k].is_some_and(|(st, off)| off == 0 && (owner || st != RELEASED)))
                .collect();
            // A segment takes what its entries need (an object of its size
            // class: a quarter of a chunk for small values), not a chunk.
            let bytes = self.nodes.first().map_or(0, |d| d.geo.segment_bytes());
            let mut claims: heapless::Vec<(usize, u64), MAX_REPLICAS> = heapless::Vec::new();
            // From the pools this client gave to, first (all at once; a
            // node late once one answered gets a fresh chunk instead).
            let bit = |node: NodeId| 1u64.checked_shl(node.0 as u32).unwrap_or(0);
            let tries: heapless::Vec<usize, MAX_REPLICAS> =
                empty.iter().copied().filter(|&k| self.pooled & bit(missing[k].1.node) != 0).collect();
            let futs = tries.iter().map(|&k| pooled_block(mem, missing[k].1.node, bytes)).collect();
            let (got, _) = join_timely(futs, 1, Watch::on(mem), |j| late(missing[tries[j]].1.node)).await;
            let mut fresh: heapless::Vec<usize, MAX_REPLICAS> =
                empty.iter().copied().filter(|k| !tries.contains(k)).collect();
            for (j, r) in got.results.into_iter().enumerate() {
                let k = tries[j];
                match r {
                    Some(Ok(Some(block))) => {
                        let _ = claims.push((k, block));
                    }
                    other => {
                        if matches!(other, Some(Ok(None))) {
                            self.pooled &= !bit(missing[k].1.node);
                        }
                        let _ = fresh.push(k);
                    }
                }
            }
            let targets: heapless::Vec<NodeId, MAX_REPLICAS> = fresh.iter().map(|&k| missing[k].1.node).collect();
            let created = found.iter().filter(|f| f.is_some_and(|(_, off)| off != 0)).count() + claims.len();
            let need = need.saturating_sub(created);
            let sizes = [bytes; MAX_REPLICAS];
            let chunks = slab.alloc_each(mem, &targets, &sizes, need).await;
            // What was carved is recorded before the directories name it
            // (`crate::substrate::space::slab`'s marks).
            let recorded = carver.record_marks(mem).await;
            let slab = &mut *carver.slab;
            for (j, chunk) in chunks.into_iter().enumerate() {
                match (chunk, recorded) {
                    (Ok(c), Ok(())) => {
                        let _ = claims.push((fresh[j], c.offset));
                    }
                    (Err(e), _) => {
                        out[missing[fresh[j]].0] = Err(e.into());
                        found[fresh[j]] = None;
                    }
                    (Ok(c), Err(e)) => {
                        slab.free(c, bytes);
                        out[missing[fresh[j]].0] = Err(LogError::Lease(e));
                        found[fresh[j]] = None;
                    }
                }
            }
            // The start, then the offset: whoever sees the offset sees the start.
            let futs = claims
                .iter()
                .map(|&(k, chunk)| {
                    let (at, start) = (missing[k].1, &start);
                    async move {
                        let ops = [
                            Op::Write { offset: at.offset, data: start },
                            Op::Cas { offset: at.offset + 8, expected: 0, new: chunk },
                        ];
                        mem.pipeline(at.node, &ops).await
                    }
                })
                .collect();
            let (creates, _) = join_timely(futs, need, Watch::on(mem), |j| late(missing[claims[j].0].1.node)).await;
            for (j, r) in creates.results.into_iter().enumerate() {
                let (k, chunk) = claims[j];
                found[k] = match r {
                    Some(Ok(outs)) => match outs.get(1).and_then(OpOutput::cas) {
                        Some(0) => Some((place.start, chunk)),
                        Some(prev) => {
                            // Another process created it first: ours goes back.
                            slab.free(RemoteAddr::new(missing[k].1.node, chunk), bytes);
                            Some((place.start, prev))
                        }
                        None => None,
                    },
                    Some(Err(e)) => {
                        out[missing[k].0] = Err(LogError::Mem(e));
                        None
                    }
                    None => None,
                };
            }
        }
        for (k, &(i, at)) in missing.iter().enumerate() {
            let Some((start, offset)) = found[k].filter(|&(st, off)| off != 0 && st != FREE) else { continue };
            let Some(d) = self.nodes.iter_mut().find(|d| d.node == at.node) else { continue };
            if start != place.start {
                out[i] = Err(LogError::Stale(at.node));
                continue;
            }
            match d.entry_at(offset, place.slot) {
                Ok(addr) => {
                    d.remember(client, place.segment, start, offset);
                    out[i] = Ok(Some(addr));
                }
                Err(e) => out[i] = Err(e),
            }
        }
        out
    }

    /// The segments of `client` on `node` that are in use (not given back),
    /// from its directory row (one roundtrip): by number, with their start
    /// and offset. What a client that takes an id over goes through.
    pub async fn in_use<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        client: u8,
        mut each: impl FnMut(u32, u64, u64),
    ) -> Result<(), LogError> {
        if client > MAX_CLIENT {
            return Err(LogError::Corrupt { node, what: "client beyond the directory" });
        }
        let d = self.dir(mem, node).await?;
        let (base, geo) = (d.base, d.geo);
        let row = mem.read(RemoteAddr::new(node, base + geo.row(client)), geo.row_bytes() as usize).await?;
        for s in 0..geo.segments as u32 {
            if let (Some(start), Some(offset)) = (word_at(&row, 16 * s as usize), word_at(&row, 16 * s as usize + 8))
                && offset != 0
                && start != FREE
            {
                each(s, start, offset);
            }
        }
        Ok(())
    }

    /// The segments of `client` in use on each of `nodes`, read at once
    /// (one roundtrip), leaving out those late once `need` answered:
    /// `each(node index, number, start)`; how many answered.
    pub async fn in_use_on<M: Memory>(
        &mut self,
        mem: &M,
        nodes: &[NodeId],
        client: u8,
        need: usize,
        mut each: impl FnMut(usize, u32, u64),
    ) -> usize {
        let nodes = &nodes[..nodes.len().min(MAX_REPLICAS)];
        let opened = self.open_dirs(mem, nodes, need).await;
        let mut rows: heapless::Vec<(usize, RemoteAddr, LogGeometry), MAX_REPLICAS> = heapless::Vec::new();
        for (i, (&node, ok)) in nodes.iter().zip(opened).enumerate() {
            if let (Ok(()), Some(d)) = (ok, self.nodes.iter().find(|d| d.node == node))
                && client <= MAX_CLIENT
            {
                let _ = rows.push((i, RemoteAddr::new(node, d.base + d.geo.row(client)), d.geo));
            }
        }
        let futs = rows.iter().map(|&(_, at, geo)| mem.read(at, geo.row_bytes() as usize)).collect();
        let (read, _) = join_timely(futs, need, Watch::on(mem), |k| late(rows[k].1.node)).await;
        let mut answered = 0;
        for (k, r) in read.results.into_iter().enumerate() {
            let Some(Ok(row)) = r else { continue };
            answered += 1;
            for (s, start, _) in descriptors(&row, rows[k].2) {
                if start != FREE {
                    each(rows[k].0, s, start);
                }
            }
        }
        answered
    }

    /// How the logs of every client id use `node`'s memory, from its
    /// directory (one read): what `swarm memnode stats` reports.
    pub async fn usage<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<LogUsage, LogError> {
        let d = self.dir(mem, node).await?;
        let (base, geo) = (d.base, d.geo);
        let rows = mem.read(RemoteAddr::new(node, base + geo.row(0)), geo.dir_bytes() as usize - geo.row(0) as usize);
        let rows = rows.await?;
        let mut usage = LogUsage::default();
        for row in rows.chunks(geo.row_bytes() as usize) {
            let mut held = false;
            for (_, start, _) in descriptors(row, geo) {
                held = true;
                if start == FREE { usage.free += 1 } else { usage.in_use += 1 }
            }
            usage.ids += u32::from(held);
        }
        Ok(usage)
    }

    /// How `node`'s memory is used: its region's header and its log
    /// directory (two reads).
    pub async fn memory<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<NodeMemory, LogError> {
        let region = Region::open(mem, node).await?;
        let (log, segment) = match self.usage(mem, node).await {
            // The directory is read already: its geometry costs nothing.
            Ok(u) => (u, self.dir(mem, node).await?.geo.segment_bytes()),
            // A store without writer logs, on nodes without a directory.
            Err(LogError::NoLog(_)) => (LogUsage::default(), 0),
            Err(e) => return Err(e),
        };
        let pooled = pool::bytes(mem, node).await?;
        Ok(NodeMemory {
            size: region.size,
            claimed: region.cursor,
            reclaimable: log.free * segment + pooled,
            pooled,
            log,
        })
    }

    /// Gives the memory of `client`'s segments given back on `node` to the
    /// node's pool ([`crate::substrate::space::pool`]), for any client,
    /// but for the [`KEEP_FREE`] lowest numbers (its next segments take
    /// the lowest) and those in `busy`: so that the segments a burst of
    /// writes needed do not stay with one client id. The client is the
    /// only one that starts segments under its numbers given back
    /// ([`FREE`]), so nothing races with it; a number released is marked
    /// [`RELEASED`] before its offset is cleared, so no reader starts a
    /// segment of an older write under it either. How many were released.
    pub async fn release_surplus<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        client: u8,
        busy: &SegmentSet,
    ) -> Result<u32, LogError> {
        let d = self.dir(mem, node).await?;
        if client > MAX_CLIENT {
            return Err(LogError::Corrupt { node, what: "client beyond the directory" });
        }
        let (geo, base) = (d.geo, d.base);
        let row = mem.read(RemoteAddr::new(node, base + geo.row(client)), geo.row_bytes() as usize).await?;
        let region = Region::open(mem, node).await?;
        let bytes = geo.segment_bytes();
        let mut released = 0;
        let given = descriptors(&row, geo).filter(|&(s, st, _)| st == FREE && !busy.contains(s));
        for (s, _, offset) in given.skip(KEEP_FREE) {
            if !pool::sound(&region, offset, bytes) {
                return Err(LogError::Corrupt { node, what: "a segment given back lies outside the region" });
            }
            let at = base + geo.descriptor(client, s);
            let ops = [
                Op::Write { offset: at, data: &RELEASED.to_le_bytes() },
                Op::Cas { offset: at + 8, expected: offset, new: 0 },
            ];
            let out = mem.pipeline(node, &ops).await?;
            if out.get(1).and_then(OpOutput::cas) == Some(offset) && pool::give(mem, &region, offset, bytes).await? {
                released += 1;
            }
        }
        if released > 0 {
            self.pooled |= 1u64.checked_shl(node.0 as u32).unwrap_or(0);
        }
        Ok(released)
    }

    /// Gives `client`'s segment `segment` on `node` back (its owner, once
    /// no entry of it is needed there): its memory stays with its number
    /// on the node for the owner's next segment under it
    /// ([`Logs::entries`]); lookups skip it from now on.
    pub async fn mark_free<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        client: u8,
        segment: u32,
    ) -> Result<(), LogError> {
        let d = self.dir(mem, node).await?;
        if segment as u64 >= d.geo.segments || client > MAX_CLIENT {
            return Err(LogError::Corrupt { node, what: "segment or client beyond the directory" });
        }
        let at = RemoteAddr::new(node, d.base + d.geo.descriptor(client, segment));
        d.forget(client, segment);
        mem.write(at, &FREE.to_le_bytes()).await?;
        Ok(())
    }
}

/// A block for `bytes` from `node`'s pool (`None`: the pool is empty, or
/// garbled); a smaller block goes back.
async fn pooled_block<M: Memory>(mem: &M, node: NodeId, bytes: u64) -> Result<Option<u64>, MemError> {
    let out = async {
        let region = Region::open(mem, node).await?;
        Ok(pool::take_fitting(mem, &region, bytes).await?.map(|(block, _)| block))
    };
    match out.await {
        Ok(b) => Ok(b),
        Err(RegionError::Mem(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

/// `node`'s log directory: its place and geometry, from the node's root
/// slot and header (checked: remote memory is untrusted).
async fn load_dir<M: Memory>(mem: &M, node: NodeId) -> Result<NodeDir, LogError> {
    let corrupt = |what| LogError::Corrupt { node, what };
    let base = Region::read_root(mem, node, roots::LOG_DIR).await?;
    if base == 0 {
        return Err(LogError::NoLog(node));
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
    if segments > MAX_SEGMENTS || per_segment > MAX_PER_SEGMENT || entry_size > largest {
        return Err(corrupt("impossible geometry"));
    }
    let geo = LogGeometry { entry_size, segments, per_segment };
    if base.checked_add(geo.dir_bytes()).is_none() {
        return Err(corrupt("directory beyond the address space"));
    }
    Ok(NodeDir { node, base, geo, cache: [Known::default(); CACHE] })
}

#[cfg(test)]
mod tests;
