//! How much memory a replicated store needs, and the writer logs it
//! formats: what both of its systems (SWARM-KV, DM-ABD) share.

use crate::NodeId;
use crate::swarm::inout::Layout;
use crate::swarm::writerlog::{ENTRY_HEADER, LogGeometry};

use super::descriptor::DESCRIPTOR_BYTES;
use crate::kv::place::INDEX_NODE;
use crate::kv::{KvError, NodeChunks, NodeShape, StoreConfig};
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::{CLASSES, class_of};

/// Most log segments per client and node: with 1 MiB chunks, 2 million
/// writes of 64 B per client, 126 thousand of 8 KiB (log entries are not
/// recycled). Fewer on nodes that could not hold as many.
const LOG_SEGMENTS: u64 = 1024;

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
/// a quarter spare included. Node 0 also holds the index.
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
    // The index and its key blocks, and the descriptors, on node 0.
    let index = cfg.index_bytes() + cfg.keys * DESCRIPTOR_BYTES;
    // Each client's partly used chunks: a few size classes on each node,
    // and a partly used log segment.
    let slack = cfg.writers as u64 * 6 * StoreConfig::CHUNK;
    let total = values + logs + index + slack;
    (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
}

/// What a replicated store takes on `node` beyond what every store takes
/// ([`crate::kv::KvSystem::node_chunks`]): a log directory where the nodes
/// have none; and per client, a chunk for each size class it carves there
/// (each replica's object, its log segment, and on the index node the
/// descriptors), plus on the index node a chunk of key blocks.
pub(crate) fn node_chunks(
    cfg: &StoreConfig,
    layout: Layout,
    node: NodeId,
    shape: &NodeShape,
) -> Result<NodeChunks, KvError> {
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
    take(
        geo.per_segment * geo.entry_size,
        "a writer-log segment does not fit in a chunk (a chunk of a power of two bytes holds one)",
    )?;
    let mut client = 0;
    if node == INDEX_NODE {
        take(DESCRIPTOR_BYTES, "a descriptor does not fit in a chunk")?;
        client += 1;
    }
    client += classes.iter().filter(|&&c| c).count() as u64;
    Ok(NodeChunks { own: dir, per_client: client })
}
