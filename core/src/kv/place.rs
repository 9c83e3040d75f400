//! Where a key-value store puts things: the nodes of the index, and the
//! nodes of a key's values.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::{NodeId, RemoteAddr};

/// The node that holds the index of the stores that keep one copy of it
/// (RAW): a single point of failure, as RAW's values are (it replicates
/// nothing). The replicated stores replicate their index on
/// [`index_nodes`].
pub const INDEX_NODE: NodeId = NodeId(0);

/// The nodes of a replicated store's index (`crate::index::snapshot`):
/// its first 2f+1, those of the lease table ([`lease_nodes`]).
pub fn index_nodes(
    cfg: &super::StoreConfig,
    nodes: usize,
) -> heapless::Vec<NodeId, { crate::substrate::quorum::MAX_REPLICAS }> {
    (0..lease_nodes(cfg, nodes).min(crate::substrate::quorum::MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect()
}

/// How many nodes hold a store's table of client-id leases
/// ([`crate::substrate::lease`]): its first 2f+1, or 3 for a store of one
/// copy, at most the nodes there are.
pub fn lease_nodes(cfg: &super::StoreConfig, nodes: usize) -> usize {
    let r = if cfg.system.replicated() { cfg.replicas } else { 3 };
    r.min(nodes).max(1)
}

/// How many times an operation starts again after finding a stale cached
/// location or losing a race with a delete, before giving up.
pub const RETRIES: usize = 8;

/// The hash that places a key's values.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, 0x5357_4b56)
}

/// The `i`-th node of `key`'s values on a cluster of `nodes` nodes: the
/// key's first node is `hash mod nodes`, its replicas the nodes after it.
pub fn node_of(key: &[u8], i: usize, nodes: usize) -> NodeId {
    let first = (key_hash(key) % nodes.max(1) as u64) as usize;
    NodeId(((first + i) % nodes.max(1)) as u16)
}

/// An index location that is an object's address itself (RAW's copy,
/// pDPM-Direct's primary replica): the node in the top 16 bits, the
/// offset below.
pub fn location_of(addr: RemoteAddr) -> u64 {
    (addr.node.0 as u64) << 48 | addr.offset
}

/// The address a location of [`location_of`] names, checked (it comes
/// from memory): a node of the cluster's `nodes`, an aligned offset.
pub fn addr_of(location: u64, nodes: usize) -> Option<RemoteAddr> {
    let node = (location >> 48) as usize;
    let offset = location & ((1 << 48) - 1);
    (node < nodes && offset.is_multiple_of(8)).then(|| RemoteAddr::new(NodeId(node as u16), offset))
}
