//! Which store, and its shape: what the harness, the command line and the
//! tests pass to [`super::format`] and [`super::connect`].

use crate::baselines::raw::RawRegister;
use crate::index::{BLOCK_ALIGN, IndexConfig, MAX_KEY, block_len};
use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::slab::class_of;
use crate::swarm::inout::{Layout, MAX_VALUE};
use crate::swarm::meta::MAX_CLIENT;
use crate::swarm::writerlog::{ENTRY_HEADER, LogGeometry};

use super::KvError;
use super::descriptor::DESCRIPTOR_BYTES;

/// The key-value stores of the toolkit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    /// One unreplicated copy, no concurrency control: the latency floor
    /// (SWARM §7, "Baselines").
    Raw,
    /// ABD over 2f+1 nodes, values out of place (SWARM §2.3, §7).
    DmAbd,
    /// SWARM-KV (SWARM §5).
    SwarmKv,
}

impl System {
    /// Every system, in the order reports list them.
    pub const ALL: [System; 3] = [System::Raw, System::DmAbd, System::SwarmKv];

    /// The name reports and flags use, lower case with dashes.
    pub const fn name(self) -> &'static str {
        match self {
            System::Raw => "raw",
            System::DmAbd => "dm-abd",
            System::SwarmKv => "swarm-kv",
        }
    }

    /// The system called `s` ([`System::name`]).
    pub fn from_name(s: &str) -> Option<System> {
        Self::ALL.into_iter().find(|sys| sys.name() == s)
    }

    /// Whether values are replicated (RAW keeps one copy).
    pub const fn replicated(self) -> bool {
        !matches!(self, System::Raw)
    }
}

/// The shape of a store. Every client of one store must use the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which store.
    pub system: System,
    /// Replicas of each key, 2f+1 (RAW keeps one copy and ignores this).
    pub replicas: usize,
    /// Keys the store must hold (sizes the index).
    pub keys: u64,
    /// Longest key, in bytes.
    pub max_key: usize,
    /// Largest value, in bytes.
    pub max_value: usize,
    /// Client ids `1..=writers` will be used (sizes the metadata arrays).
    pub writers: u8,
    /// Entries of each client's location cache.
    pub cache_capacity: usize,
    /// Which replicas keep an in-place copy of the value (SWARM-KV).
    pub in_place: InPlace,
}

/// Where SWARM-KV keeps in-place copies of values (SWARM §4, §6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InPlace {
    /// On the key's first replica only (the paper's implementation, §6):
    /// a third of the memory for values, and majorities start there.
    #[default]
    First,
    /// On every replica (§4 as written): a get stays one roundtrip whichever
    /// majority answers.
    Every,
}

/// Most metadata words per In-n-Out object: one per writer up to this many
/// (SWARM §4.4), then writers share words (`client mod words`).
pub const MAX_META_WORDS: u32 = 8;

/// Most log segments per client and node: with 1 MiB chunks, 8 million
/// writes of 64 B per client, 126 thousand of 8 KiB (log entries are not
/// recycled). Fewer on nodes with fewer chunks.
const LOG_SEGMENTS: u64 = 1024;

impl StoreConfig {
    /// Chunk size to format the nodes' regions with (one log segment); any
    /// size that holds a log entry works.
    pub const CHUNK: u64 = 1 << 20;

    /// Checks the configuration against a cluster of `nodes` memory nodes.
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
            if nodes > crate::substrate::space::slab::MAX_NODES {
                return Err(KvError::BadConfig("at most 32 memory nodes"));
            }
        }
        if self.keys == 0 {
            return Err(KvError::BadConfig("the store must hold at least one key"));
        }
        if self.max_key == 0 || self.max_key > MAX_KEY {
            return Err(KvError::BadConfig("keys may have 1 to 255 bytes"));
        }
        if self.max_value as u64 > MAX_VALUE {
            return Err(KvError::BadConfig("values may have at most 64 KiB"));
        }
        if self.writers == 0 || self.writers >= MAX_CLIENT {
            return Err(KvError::BadConfig("from 1 to 126 client ids (writers)"));
        }
        if self.cache_capacity == 0 {
            return Err(KvError::BadConfig("the location cache needs room for at least one key"));
        }
        Ok(())
    }

    /// The limits clients enforce.
    pub fn limits(&self) -> super::Limits {
        super::Limits { max_key: self.max_key, max_value: self.max_value }
    }

    /// Metadata words per In-n-Out object.
    pub(crate) fn meta_words(&self) -> u32 {
        (self.writers as u32).clamp(1, MAX_META_WORDS)
    }

    /// The shape of every replica: in place for SWARM-KV, out of place for
    /// DM-ABD (its metadata word points to the value, SWARM §7).
    pub(crate) fn layout(&self) -> Result<Layout, KvError> {
        let bad = |_| KvError::BadConfig("values may have at most 64 KiB");
        match self.system {
            System::DmAbd => Layout::out_of_place(1, self.max_value as u64).map_err(bad),
            _ => {
                let layout = Layout::new(self.meta_words(), self.max_value as u64).map_err(bad)?;
                Ok(if self.in_place == InPlace::First { layout.in_place_on_first() } else { layout })
            }
        }
    }

    /// The writer logs of a node of `size` bytes in `chunk`-byte chunks.
    pub(crate) fn log_geometry(&self, size: u64, chunk: u64) -> Result<LogGeometry, KvError> {
        let segments = (size / chunk.max(1)).clamp(1, LOG_SEGMENTS);
        LogGeometry::new(self.max_value as u64, chunk, segments)
            .map_err(|_| KvError::BadConfig("values too large for the nodes' chunks"))
    }

    /// The index on node 0.
    pub(crate) fn index(&self) -> IndexConfig {
        IndexConfig::for_keys(self.keys, self.max_key)
    }

    /// Bytes each of `nodes` memory nodes needs for [`StoreConfig::keys`]
    /// keys and `writes` writes by all clients together, region header and
    /// a quarter spare included. Node 0 also holds the index.
    pub fn node_bytes(&self, nodes: usize, writes: u64) -> u64 {
        let nodes = nodes.max(1) as u64;
        let keys = self.keys;
        let obj = |size: u64| class_of(size).map_or(size, |(_, c)| c);
        let (copies, objects) = match self.system {
            System::Raw => (1, obj(RawRegister::size(self.max_value as u64))),
            _ => {
                let copies = self.replicas.max(1);
                let layout = self.layout();
                (copies as u64, (0..copies).map(|r| layout.as_ref().map_or(0, |l| obj(l.of_replica(r).size()))).sum())
            }
        };
        // Values: one object per key and copy, spread over the nodes.
        let values = keys.div_ceil(nodes) * objects;
        // Out-of-place copies: one log entry per write and replica.
        let entry = (ENTRY_HEADER + self.max_value as u64).next_multiple_of(64);
        let logs = match self.system {
            System::Raw => 0,
            _ => {
                let dir = self.log_geometry(u64::MAX, Self::CHUNK).map_or(0, |g| g.dir_bytes());
                dir + (writes * copies).div_ceil(nodes) * entry
            }
        };
        // The index and its key blocks, and the descriptors, on node 0.
        let blocks = keys * (obj(block_len(self.max_key) as u64).max(BLOCK_ALIGN) + DESCRIPTOR_BYTES);
        let index = crate::index::Geometry::bytes(self.index().groups).unwrap_or(0) + blocks;
        // Each client's partly used chunks: a few size classes on each node,
        // and a partly used log segment.
        let slack = self.writers as u64 * 6 * Self::CHUNK;
        let total = values + logs + index + slack;
        (total + total / 4 + crate::substrate::space::region::HEADER_SIZE).next_multiple_of(Self::CHUNK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(system: System) -> StoreConfig {
        StoreConfig {
            system,
            replicas: 3,
            keys: 1000,
            max_key: 24,
            max_value: 64,
            writers: 4,
            cache_capacity: 1000,
            in_place: InPlace::First,
        }
    }

    #[test]
    fn names_round_trip() {
        for s in System::ALL {
            assert_eq!(System::from_name(s.name()), Some(s));
        }
        assert_eq!(System::from_name("swarm"), None);
    }

    #[test]
    fn impossible_configurations_are_refused_with_a_reason() {
        assert!(cfg(System::SwarmKv).check(3).is_ok());
        let bad = |f: fn(&mut StoreConfig), nodes| {
            let mut c = cfg(System::SwarmKv);
            f(&mut c);
            c.check(nodes).unwrap_err()
        };
        assert_eq!(bad(|c| c.replicas = 4, 5), KvError::BadConfig("replicas must be odd (2f+1), from 1 to 7"));
        assert_eq!(bad(|_| {}, 2), KvError::BadConfig("more replicas than memory nodes"));
        assert_eq!(bad(|c| c.max_key = 300, 3), KvError::BadConfig("keys may have 1 to 255 bytes"));
        assert_eq!(bad(|c| c.max_value = 1 << 20, 3), KvError::BadConfig("values may have at most 64 KiB"));
        assert_eq!(bad(|c| c.writers = 127, 3), KvError::BadConfig("from 1 to 126 client ids (writers)"));
        assert_eq!(bad(|c| c.keys = 0, 3), KvError::BadConfig("the store must hold at least one key"));
        let mut raw = cfg(System::Raw);
        raw.replicas = 4;
        assert!(raw.check(1).is_ok(), "RAW ignores replicas");
    }

    #[test]
    fn replicated_stores_need_more_memory_than_raw() {
        let raw = cfg(System::Raw).node_bytes(3, 10_000);
        let abd = cfg(System::DmAbd).node_bytes(3, 10_000);
        let swarm = cfg(System::SwarmKv).node_bytes(3, 10_000);
        assert!(raw < abd && raw < swarm, "{raw} {abd} {swarm}");
        assert_eq!(swarm % StoreConfig::CHUNK, 0);
    }
}
