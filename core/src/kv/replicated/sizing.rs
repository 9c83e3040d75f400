//! How much memory a replicated store needs, and the writer logs it
//! formats: what both of its systems (SWARM-KV, DM-ABD) share.

use crate::NodeId;
use crate::swarm::inout::Layout;
use crate::swarm::writerlog::{ENTRY_HEADER, LogGeometry};

use super::descriptor::DESCRIPTOR_BYTES;
use crate::index::Geometry;
use crate::index::snapshot::header;
use crate::index::snapshot::view::Timing;
use crate::index::snapshot::{SnapshotConfig, block};
use crate::kv::place::index_nodes;
use crate::kv::{KvError, NodeChunks, NodeShape, StoreConfig};
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::{CLASSES, class_of};

/// Most log segments per client and node: with 1 MiB chunks, a million
/// writes of 64 B per client not recycled yet, 126 thousand of 8 KiB
/// (entries are recycled a few recycling delays after their write:
/// `crate::swarm::recycle`). Fewer on nodes that could not hold as many.
const LOG_SEGMENTS: u64 = 1024;

/// Changes of its mapping (insert, removal, a replica restored) per key
/// that the index's arena has room for: its key blocks and descriptors
/// are never recycled (issue #20).
const INDEX_CHANGES: u64 = 2;

/// The operation time-out a store's index is fenced with where the
/// memory states none ([`crate::Memory::timeout_ns`]): the mapped
/// backends' default.
pub(crate) const DEFAULT_TIMEOUT_NS: u64 = 1_000_000_000;

/// Bytes of the index's arena a client claims at a time (a roundtrip per
/// 64 new keys of 24 B).
const INDEX_CHUNK: u64 = 16 << 10;

/// The replicated index of a store of `cfg` on memory whose operations
/// time out after `timeout_ns`: room for [`StoreConfig::keys`] keys, each
/// changing [`INDEX_CHANGES`] times with a descriptor each time, and for
/// two partly used chunks of each client id.
pub(crate) fn index_config(cfg: &StoreConfig, timeout_ns: u64) -> SnapshotConfig {
    snapshot_config(cfg, timeout_ns, DESCRIPTOR_BYTES, INDEX_CHANGES, INDEX_CHUNK)
}

/// The replicated index of a store of `cfg` on memory whose operations
/// time out after `timeout_ns`, whose every change of a key's mapping
/// takes a key block and a record of `record` bytes in the arena
/// (SWARM-KV's descriptors, FUSEE's objects): room for
/// [`StoreConfig::keys`] keys changing `changes` times each, and for two
/// partly used arena chunks of `chunk` bytes per client id.
pub(crate) fn snapshot_config(
    cfg: &StoreConfig,
    timeout_ns: u64,
    record: u64,
    changes: u64,
    chunk: u64,
) -> SnapshotConfig {
    let mut c = SnapshotConfig::for_keys(cfg.keys.max(1), cfg.max_key, changes);
    let per_change = block::alloc_len(cfg.max_key) + record;
    let changes = cfg.keys.max(1).saturating_mul(changes).saturating_mul(per_change);
    let chunks = 2 * cfg.writers as u64 * chunk;
    c.chunk = chunk;
    c.arena = changes.saturating_add(chunks).saturating_add(chunk).next_multiple_of(chunk);
    c.timing = Timing::for_timeout(timeout_ns);
    c
}

/// Bytes of one replica of the index of a store of `cfg`: header,
/// buckets and arena, each in whole `chunk`s.
fn index_replica_bytes(cfg: &StoreConfig, chunk: u64) -> u64 {
    replica_bytes(&index_config(cfg, DEFAULT_TIMEOUT_NS), chunk)
}

/// Bytes of one replica of an index of shape `c` on nodes of `chunk`-byte
/// chunks: header, buckets and arena, each in whole chunks.
pub(crate) fn replica_bytes(c: &SnapshotConfig, chunk: u64) -> u64 {
    let chunk = chunk.max(1);
    buckets_bytes(c).next_multiple_of(chunk).saturating_add(c.arena.next_multiple_of(chunk))
}

/// Bytes of the header and buckets of one replica of an index of shape `c`.
pub(crate) fn buckets_bytes(c: &SnapshotConfig) -> u64 {
    Geometry::bytes(c.index.groups).unwrap_or(u64::MAX / 4) - 64 + header::BYTES
}

/// The writer logs of a node of `size` bytes in `chunk`-byte chunks: as
/// many segments per client as the node could hold (one client may write
/// more than its share: the bench's loader writes every key), at most
/// [`LOG_SEGMENTS`].
pub(crate) fn log_geometry(cfg: &StoreConfig, size: u64, chunk: u64) -> Result<LogGeometry, KvError> {
    let bad = |_| KvError::BadConfig("values too large for the nodes' chunks");
    let one = LogGeometry::new(cfg.max_value as u64, chunk, 1).map_err(bad)?;
    let segments = (size / (one.per_segment * one.entry_size)).clamp(1, LOG_SEGMENTS);
    LogGeometry::new(cfg.max_value as u64, chunk, segments).map_err(bad)
}

/// Bytes each of `nodes` memory nodes needs for `cfg.keys` keys of
/// `layout` and `writes` writes by all clients together, region header and
/// a quarter spare included. The first 2f+1 nodes also hold the index.
pub fn node_bytes(cfg: &StoreConfig, layout: Result<Layout, KvError>, nodes: usize, writes: u64) -> u64 {
    let nodes = nodes.max(1) as u64;
    let obj = |size: u64| class_of(size).map_or(size, |(_, c)| c);
    let copies = cfg.replicas.max(1) as u64;
    let objects: u64 =
        (0..cfg.replicas.max(1)).map(|r| layout.as_ref().map_or(0, |l| obj(l.of_replica(r).size()))).sum();
    // Values: one object per key and copy, spread over the nodes.
    let values = cfg.keys.div_ceil(nodes) * objects;
    // Out-of-place copies: one log entry per write and replica.
    let entry = (ENTRY_HEADER + cfg.max_value as u64).next_multiple_of(64);
    let dir = log_geometry(cfg, u64::MAX, StoreConfig::CHUNK).map_or(0, |g| g.dir_bytes());
    let logs = dir + (writes * copies).div_ceil(nodes) * entry;
    // The index, its key blocks and the descriptors, on the index nodes.
    let index = index_replica_bytes(cfg, StoreConfig::CHUNK);
    // Each client's partly used chunks: a few size classes on each node,
    // and a partly used log segment.
    let slack = cfg.writers as u64 * 6 * StoreConfig::CHUNK;
    let total = values + logs + index + slack;
    (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
}

/// What a replicated store takes on `node` of `nodes` beyond what every
/// store takes ([`crate::kv::KvSystem::node_chunks`]): a log directory
/// where the nodes have none, a replica of the index on the index nodes;
/// and per client, a chunk for each size class it carves there (each
/// replica's object, its log segment).
pub(crate) fn node_chunks(
    cfg: &StoreConfig,
    layout: Layout,
    nodes: usize,
    node: NodeId,
    shape: &NodeShape,
) -> Result<NodeChunks, KvError> {
    let index = if index_nodes(cfg, nodes).contains(&node) {
        index_replica_bytes(cfg, shape.chunk).div_ceil(shape.chunk.max(1))
    } else {
        0
    };
    let (dir, geo) = match shape.log {
        Some(g) => (0, g),
        None => {
            let g = log_geometry(cfg, shape.size, shape.chunk)?;
            (g.dir_bytes().div_ceil(shape.chunk.max(1)), g)
        }
    };
    let mut classes = [false; CLASSES];
    let mut take = |size: u64, what: &'static str| match class_of(size) {
        Some((class, obj)) if obj <= shape.chunk => {
            classes[class] = true;
            Ok(())
        }
        _ => Err(KvError::BadConfig(what)),
    };
    for r in 0..cfg.replicas.max(1) {
        take(
            layout.of_replica(r).size(),
            "a value's replica does not fit in a chunk (use bigger chunks or smaller values)",
        )?;
    }
    take(geo.segment_bytes(), "a writer-log segment does not fit in a chunk")?;
    let client = classes.iter().filter(|&&c| c).count() as u64;
    Ok(NodeChunks { own: dir + index, per_client: client })
}
