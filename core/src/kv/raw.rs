//! RAW's key-value store (SWARM §7, "Baselines"): one copy of each value,
//! in place, on the node the key hashes to, found through the same index
//! as the replicated stores. A get is one READ and an update one WRITE once
//! the location is cached: the latency floor the others are compared to.
//!
//! No concurrency control, as in the paper: a get concurrent with an
//! update may return a mix of two values, and a client whose cached
//! location went stale (the key deleted, then inserted elsewhere) may
//! update the old copy. It is not linearizable and not fault tolerant; it
//! answers correctly when one client at a time uses a key.
//!
//! The index location is the copy's address: node in the top 16 bits,
//! offset below, so no descriptor is needed.

use alloc::boxed::Box;

use crate::baselines::raw::{RawError, RawRegister};
use crate::index::cache::{CacheConfig, Eviction, LocationCache};
use crate::index::{Change, Entry, Expect, Index, Insert, RaceIndex};
use crate::substrate::space::slab::SlabAllocator;
use crate::substrate::value::Value;
use crate::{Memory, NodeId, RemoteAddr};

use super::config::StoreConfig;
use super::store::{INDEX_NODE, RETRIES, alloc_error, index_error, key_hash, mem_error};
use super::{Got, KvError, Limits, Missing, Written};

/// One RAW client.
pub struct Raw<M> {
    mem: M,
    id: u8,
    slab: SlabAllocator,
    index: RaceIndex,
    cache: LocationCache<Entry>,
    limits: Limits,
    nodes: usize,
}

fn encode(addr: RemoteAddr) -> u64 {
    (addr.node.0 as u64) << 48 | addr.offset
}

impl<M: Memory> Raw<M> {
    /// Connects client `id`.
    pub async fn open(mem: M, cfg: &StoreConfig, id: u8) -> Result<Self, KvError> {
        let index = RaceIndex::open(&mem, INDEX_NODE).await.map_err(index_error)?;
        let cache = LocationCache::new(CacheConfig {
            capacity: cfg.cache_capacity,
            max_key: cfg.max_key,
            eviction: Eviction::Lru,
        });
        let nodes = mem.node_count();
        Ok(Raw { mem, id, slab: SlabAllocator::new(), index, cache, limits: cfg.limits(), nodes })
    }

    pub fn mem(&self) -> &M {
        &self.mem
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The register a location names (checked: it comes from memory).
    fn register(&self, location: u64) -> Result<RawRegister, KvError> {
        let node = (location >> 48) as usize;
        let offset = location & ((1 << 48) - 1);
        if node >= self.nodes || !offset.is_multiple_of(8) {
            return Err(KvError::Corrupt);
        }
        let max_value = self.limits.max_value as u64;
        Ok(RawRegister { addr: RemoteAddr::new(NodeId(node as u16), offset), max_value })
    }

    /// The key's copy: cached, or from the index (then cached).
    async fn find(&mut self, key: &[u8]) -> Result<Option<(u64, bool)>, KvError> {
        if let Some((location, _)) = self.cache.get(key) {
            return Ok(Some((location, true)));
        }
        let found = Box::pin(self.index.lookup(&self.mem, key)).await.map_err(index_error)?;
        Ok(found.map(|e| {
            self.cache.insert(key, e.location, e);
            (e.location, false)
        }))
    }

    pub async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        for _ in 0..RETRIES {
            let Some((location, cached)) = self.find(key).await? else {
                return Ok(Got::NotFound);
            };
            match self.register(location)?.read(&self.mem).await {
                Ok((buf, range)) => return Ok(Got::Found(Value::in_buf(buf, range))),
                Err(RawError::Deleted) => {
                    self.cache.remove(key);
                    if !cached {
                        return Ok(Got::Deleted);
                    }
                }
                Err(RawError::Mem(e)) => return Err(mem_error(e)),
                Err(_) => return Err(KvError::Corrupt),
            }
        }
        Err(KvError::Contended)
    }

    pub async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        let Some((location, _)) = self.find(key).await? else {
            return Ok(Err(Missing::NotFound));
        };
        self.write(location, value).await?;
        Ok(Ok(Written))
    }

    async fn write(&self, location: u64, value: &[u8]) -> Result<(), KvError> {
        match self.register(location)?.write(&self.mem, value).await {
            Ok(()) => Ok(()),
            Err(RawError::Mem(e)) => Err(mem_error(e)),
            Err(_) => Err(KvError::Corrupt),
        }
    }

    /// The tombstone and the unmapping in parallel (one roundtrip with the
    /// entry cached; a stale entry unmaps nothing, and the copy it names was
    /// deleted already).
    pub async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        let mut entry = match self.cache.remove(key) {
            Some((_, entry)) => entry,
            None => match Box::pin(self.index.lookup(&self.mem, key)).await.map_err(index_error)? {
                Some(entry) => entry,
                None => return Ok(Err(Missing::NotFound)),
            },
        };
        for _ in 0..RETRIES {
            let reg = self.register(entry.location)?;
            let (mem, index) = (&self.mem, &mut self.index);
            let unmap = Box::pin(index.remove(mem, key, Expect::Entry(entry)));
            let (tomb, unmap) = crate::substrate::join::join2(reg.delete(mem), unmap).await;
            tomb.map_err(|e| match e {
                RawError::Mem(e) => mem_error(e),
                _ => KvError::Corrupt,
            })?;
            match unmap.map_err(index_error)? {
                Change::Done { .. } => return Ok(Ok(Written)),
                Change::NotFound => return Ok(Err(Missing::NotFound)),
                // A stale cached entry: the key lives elsewhere now.
                Change::Mismatch { current } => entry = current,
            }
        }
        Err(KvError::Contended)
    }

    /// A new copy written while the index finds a slot, then published; an
    /// existing key is updated in place instead.
    pub async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        if let Some((location, _)) = self.cache.get(key) {
            self.write(location, value).await?;
            return Ok(Written);
        }
        let node = NodeId((key_hash(key) % self.nodes as u64) as u16);
        let size = RawRegister::size(self.limits.max_value as u64);
        let addr = self.slab.alloc(&self.mem, node, size).await.map_err(alloc_error)?;
        let reg = RawRegister { addr, max_value: self.limits.max_value as u64 };
        let mut failed = None;
        let (mem, index) = (&self.mem, &mut self.index);
        let ready = async {
            match reg.write(mem, value).await {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        };
        let inserted = Box::pin(index.insert_after(mem, key, encode(addr), ready)).await.map_err(index_error)?;
        let entry = match inserted {
            Some(Insert::New(e)) => e,
            Some(Insert::Exists(e)) => {
                self.slab.free(addr, size);
                self.write(e.location, value).await?;
                e
            }
            None => {
                self.slab.free(addr, size);
                return Err(match failed {
                    Some(RawError::Mem(e)) => mem_error(e),
                    _ => KvError::Corrupt,
                });
            }
        };
        self.cache.insert(key, entry.location, entry);
        Ok(Written)
    }
}
