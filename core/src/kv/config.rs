//! The shape of a store, which every client of it must share: what the
//! harness, the command line and the tests pass to a system's `format` and
//! `connect` ([`super::KvSystem`]).
//!
//! The fields every system reads (keys, sizes, client ids) are fields;
//! what only some systems have (SWARM-KV's in-place copies) is an
//! [`Option`](Choice) the system declares, set by name
//! ([`StoreConfig::set_option`]) and checked against the declaration, so
//! that a new system brings its knobs without touching this type.

use super::KvError;
use super::place::{INDEX_NODE, lease_nodes};
use super::system::System;
use crate::NodeId;
#[cfg(feature = "alloc")]
use crate::index::cache::{CacheConfig, Eviction};
use crate::index::{BLOCK_ALIGN, Geometry, IndexConfig, MAX_KEY, block_len};
use crate::substrate::lease;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab;
use crate::swarm::writerlog::LogGeometry;

/// The largest value any store takes, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;
/// Client ids are `1..=MAX_CLIENTS` (SWARM's metadata word has 7 bits for
/// the writer, and 127 is kept for setup).
pub const MAX_CLIENTS: u8 = 126;
/// The most options one system may declare.
pub const MAX_OPTIONS: usize = 8;

/// An option a system declares: a name and the values it may take, the
/// first being the default.
#[derive(Debug)]
pub struct Choice {
    /// Its name, lower case with dashes (`in-place`).
    pub name: &'static str,
    /// What it changes, in a sentence.
    pub about: &'static str,
    /// Its values; the first is the default.
    pub values: &'static [&'static str],
}

/// The values of a system's options: for each [`Choice`] it declares, in
/// order, the index of the chosen value (0, the default, for all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Options([u8; MAX_OPTIONS]);

impl Options {
    /// The value chosen for the system's `i`-th option (0: its default).
    pub fn get(&self, i: usize) -> usize {
        self.0.get(i).map_or(0, |&v| v as usize)
    }

    /// The raw values, for records.
    pub fn to_bytes(self) -> [u8; MAX_OPTIONS] {
        self.0
    }

    /// Values read back from a record (checked by [`StoreConfig::check`]).
    pub fn from_bytes(b: [u8; MAX_OPTIONS]) -> Options {
        Options(b)
    }
}

/// Shortest lease a store may have, in milliseconds.
pub const MIN_LEASE_MS: u32 = 100;
/// Longest lease a store may have, in milliseconds.
pub const MAX_LEASE_MS: u32 = 3_600_000;

/// A cluster's nodes, as far as fitting a store on them goes
/// ([`StoreConfig::min_node_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShape {
    /// Bytes per node.
    pub size: u64,
    /// Bytes per chunk.
    pub chunk: u64,
    /// The writer-log directory every node holds (`swarm memnode create`
    /// formats one); `None` on nodes without, where a replicated store's
    /// `format` makes one.
    pub log: Option<LogGeometry>,
}

/// Chunks a system takes on one node beyond what every store takes there
/// ([`super::KvSystem::node_chunks`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeChunks {
    /// Its own structures, set up once.
    pub own: u64,
    /// What one client claims to write one key of the largest value.
    pub per_client: u64,
}

/// The least memory a node needs for a store, and what it is made of
/// ([`StoreConfig::min_node_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinNode {
    /// The node that needs the most (node 0, which holds the index).
    pub node: NodeId,
    /// Bytes it needs: the region header, the store's structures, and
    /// every client's chunks.
    pub bytes: u64,
    /// Of which the header and the structures (log directory, lease
    /// table, index, and the system's own).
    pub structures: u64,
    /// Of which each client's chunks: what one client claims there to
    /// write one key of the largest value.
    pub per_client: u64,
}

/// The shape of a store. Every client of one store must use the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which store.
    pub system: System,
    /// Replicas of each key, 2f+1 (a system that keeps one copy ignores it).
    pub replicas: usize,
    /// Keys the store must hold (sizes the index).
    pub keys: u64,
    /// Longest key, in bytes.
    pub max_key: usize,
    /// Largest value, in bytes.
    pub max_value: usize,
    /// Client ids `1..=writers` will be used (sizes per-client state).
    pub writers: u8,
    /// Entries of each client's location cache.
    pub cache_capacity: usize,
    /// The system's own options (see [`System::options`]).
    pub options: Options,
    /// How long a client's lease on its id lasts without renewal, in
    /// milliseconds: a crashed client's id is free this long (and the
    /// clock-skew grace, [`crate::substrate::lease`]) after its last renewal.
    pub lease_ms: u32,
}

impl StoreConfig {
    /// Chunk size to format the nodes' regions with (one log segment); any
    /// size that holds a log entry works.
    pub const CHUNK: u64 = 1 << 20;

    /// A store of `system` with the toolkit's usual shape: 3 replicas, 24 B
    /// keys, 64 B values, 8 client ids, every key cached, default options.
    pub fn new(system: System, keys: u64) -> StoreConfig {
        StoreConfig {
            system,
            replicas: 3,
            keys,
            max_key: 24,
            max_value: 64,
            writers: 8,
            cache_capacity: keys.clamp(1, 1 << 20) as usize,
            options: Options::default(),
            lease_ms: (crate::substrate::lease::DEFAULT_LENGTH_NS / 1_000_000) as u32,
        }
    }

    /// Sets the system's option `name` to `value`; an error if the system
    /// has no such option or the option no such value.
    pub fn set_option(&mut self, name: &str, value: &str) -> Result<(), KvError> {
        let opts = self.system.options();
        let i = opts.iter().position(|c| c.name == name).ok_or(KvError::BadConfig("no such option for this system"))?;
        let v = opts[i]
            .values
            .iter()
            .position(|&v| v == value)
            .ok_or(KvError::BadConfig("no such value for this option"))?;
        self.options.0[i] = v as u8;
        Ok(())
    }

    /// Sets every option the system declares to a value picked by `seed`,
    /// so that seeded tests and campaigns cover each value of each option.
    pub fn seed_options(&mut self, seed: u64) {
        let mut pick = seed;
        for (i, c) in self.system.options().iter().enumerate().take(MAX_OPTIONS) {
            let n = c.values.len().max(1) as u64;
            self.options.0[i] = (pick % n) as u8;
            pick /= n;
        }
    }

    /// The value chosen for option `name` (its default if unset); `None` if
    /// the system has no such option.
    pub fn option(&self, name: &str) -> Option<&'static str> {
        let opts = self.system.options();
        let i = opts.iter().position(|c| c.name == name)?;
        opts[i].values.get(self.options.get(i)).copied()
    }

    /// Checks the configuration against a cluster of `nodes` memory nodes:
    /// what every store needs, then what the system needs.
    pub fn check(&self, nodes: usize) -> Result<(), KvError> {
        if nodes == 0 {
            return Err(KvError::BadConfig("there are no memory nodes"));
        }
        if self.system.replicated() {
            if self.replicas == 0 || self.replicas.is_multiple_of(2) || self.replicas > MAX_REPLICAS {
                return Err(KvError::BadConfig("replicas must be odd (2f+1), from 1 to 7"));
            }
            if self.replicas > nodes {
                return Err(KvError::BadConfig("more replicas than memory nodes"));
            }
        }
        if nodes > slab::MAX_NODES {
            return Err(KvError::BadConfig("at most 32 memory nodes"));
        }
        if self.keys == 0 {
            return Err(KvError::BadConfig("the store must hold at least one key"));
        }
        if self.max_key == 0 || self.max_key > MAX_KEY {
            return Err(KvError::BadConfig("keys may have 1 to 255 bytes"));
        }
        if self.max_value > MAX_VALUE {
            return Err(KvError::BadConfig("values may have at most 64 KiB"));
        }
        if self.writers == 0 || self.writers > MAX_CLIENTS {
            return Err(KvError::BadConfig("from 1 to 126 client ids (writers)"));
        }
        if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&self.lease_ms) {
            return Err(KvError::BadConfig("leases last from 100 ms to one hour"));
        }
        if self.cache_capacity == 0 {
            return Err(KvError::BadConfig("the location cache needs room for at least one key"));
        }
        let opts = self.system.options();
        for (i, &v) in self.options.0.iter().enumerate() {
            let ok = match opts.get(i) {
                Some(c) => (v as usize) < c.values.len(),
                None => v == 0,
            };
            if !ok {
                return Err(KvError::BadConfig("an option value the system does not have"));
            }
        }
        self.system.check(self, nodes)
    }

    /// The limits clients enforce.
    pub fn limits(&self) -> super::Limits {
        super::Limits { max_key: self.max_key, max_value: self.max_value }
    }

    /// The location cache of each client: [`StoreConfig::cache_capacity`]
    /// keys, least recently used out first.
    #[cfg(feature = "alloc")]
    pub fn cache(&self) -> CacheConfig {
        CacheConfig { capacity: self.cache_capacity, max_key: self.max_key, eviction: Eviction::Lru }
    }

    /// The index every store keeps its keys in (on [`super::place::INDEX_NODE`]).
    pub fn index(&self) -> IndexConfig {
        IndexConfig::for_keys(self.keys, self.max_key)
    }

    /// Bytes of the index for [`StoreConfig::keys`] keys: its buckets and
    /// one key block per key.
    pub fn index_bytes(&self) -> u64 {
        let block = slab::class_of(block_len(self.max_key) as u64).map_or(BLOCK_ALIGN, |(_, c)| c).max(BLOCK_ALIGN);
        Geometry::bytes(self.index().groups).unwrap_or(0) + self.keys * block
    }

    /// The least memory each of `nodes` nodes shaped `shape` needs for this
    /// store to take one key from each of its [`writers`](Self::writers)
    /// clients: the region header (with the store's record in its root
    /// slots), the log directory the nodes hold, the lease table (on the
    /// first 2f+1 nodes), the index (on node 0), the system's own
    /// structures, and what each client claims on a node to write one key
    /// of [`max_value`](Self::max_value) bytes: a chunk per size class it
    /// carves there (values' replicas, its log segment, descriptors and
    /// key blocks on node 0), as its keys may land on any node. Memory is
    /// never recycled, so on smaller nodes some client's first write fails;
    /// what the keys themselves take comes on top ([`node_bytes`](Self::node_bytes)
    /// estimates it). The one place this is computed: `swarm memnode
    /// create` and `swarm kv init` both refuse nodes below it. An error if
    /// an object the store needs does not fit in a chunk.
    pub fn min_node_bytes(&self, nodes: usize, shape: &NodeShape) -> Result<MinNode, KvError> {
        let chunk = shape.chunk.max(1);
        let chunks_of = |bytes: u64| bytes.div_ceil(chunk);
        let mut worst: Option<MinNode> = None;
        for n in 0..nodes.max(1) {
            let node = NodeId(n as u16);
            let mut own = shape.log.map_or(0, |g| chunks_of(g.dir_bytes()));
            if n < lease_nodes(self, nodes) {
                own += chunks_of(lease::table_bytes(self.writers));
            }
            // The replicated stores' index is their own ([`KvSystem::node_chunks`]).
            if node == INDEX_NODE && !self.system.replicated_index() {
                let index = Geometry::bytes(self.index().groups).ok_or(KvError::BadConfig("too many keys"))?;
                own += chunks_of(index);
            }
            let system = self.system.node_chunks(self, nodes, node, shape)?;
            let structures = HEADER_SIZE.saturating_add((own + system.own).saturating_mul(chunk));
            let per_client = system.per_client.saturating_mul(chunk);
            let bytes = structures.saturating_add(per_client.saturating_mul(self.writers as u64));
            if worst.is_none_or(|w| bytes > w.bytes) {
                worst = Some(MinNode { node, bytes, structures, per_client });
            }
        }
        worst.ok_or(KvError::BadConfig("there are no memory nodes"))
    }

    /// Bytes each of `nodes` memory nodes needs for [`StoreConfig::keys`]
    /// keys and `writes` writes by all clients together (the system's
    /// estimate, headers and spare room included).
    pub fn node_bytes(&self, nodes: usize, writes: u64) -> u64 {
        self.system.node_bytes(self, nodes, writes)
    }
}
