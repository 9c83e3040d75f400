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

#[cfg(all(test, feature = "sim"))]
mod tests;

use alloc::boxed::Box;

use crate::kv::place::{INDEX_NODE, RETRIES, addr_of, location_of, node_of};
use crate::kv::seat::{self, Seat};
use crate::kv::torn::TornReads;
use crate::kv::{
    Got, Guarantee, Handle, KvClient, KvError, KvSystem, Limits, Missing, NodeChunks, NodeShape, Roundtrips,
    StoreConfig, SystemInfo, Who, Written,
};
use crate::substrate::clock::Clock;
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::class_of;

use crate::baselines::raw::{RawError, RawRegister};
use crate::index::cache::{LocationCache, key_hash};
use crate::index::{Change, Entry, Expect, Index, Insert};
use crate::substrate::value::Value;
use crate::{Memory, NodeId};

/// RAW: the latency floor of the SWARM paper's comparison (§7).
pub struct Raw;

impl KvSystem for Raw {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "raw",
        about: "one unreplicated copy in place, no concurrency control: the latency floor (SWARM §7, Baselines)",
        replicated: false,
        replicated_index: false,
        rejoins: false,
        floor: true,
        guarantee: Guarantee::OneClientPerKey,
        roundtrips: Roundtrips { get: 1, update: 1, insert: 2, delete: 1 },
        options: &[],
    };

    /// Boxed: a client holds its allocator's state (about 50 KiB).
    type Client<M: Memory, C: Clock> = Box<RawClient<M, C>>;

    fn check(_: &StoreConfig, _: usize) -> Result<(), KvError> {
        Ok(())
    }

    /// One copy per key, spread over the nodes, and the index on node 0.
    fn node_bytes(cfg: &StoreConfig, nodes: usize, _writes: u64) -> u64 {
        let obj = |size: u64| class_of(size).map_or(size, |(_, c)| c);
        let values = cfg.keys.div_ceil(nodes.max(1) as u64) * obj(RawRegister::size(cfg.max_value as u64));
        let slack = cfg.writers as u64 * 6 * StoreConfig::CHUNK;
        let total = values + cfg.index_bytes() + slack;
        (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
    }

    /// Per client: a chunk of values on any node, and one of key blocks on
    /// the index node.
    fn node_chunks(cfg: &StoreConfig, _: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        match class_of(RawRegister::size(cfg.max_value as u64)) {
            Some((_, obj)) if obj <= shape.chunk => {
                Ok(NodeChunks { own: 0, per_client: 1 + (node == INDEX_NODE) as u64 })
            }
            _ => Err(KvError::BadConfig("a value does not fit in a chunk (use bigger chunks or smaller values)")),
        }
    }

    async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
        seat::format(mem, cfg).await
    }

    async fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> Result<Box<RawClient<M, C>>, KvError> {
        Ok(Box::new(RawClient::open(mem, cfg, who, clock).await?))
    }
}

/// One RAW client.
pub struct RawClient<M, C> {
    mem: M,
    /// Its id, lease, allocator and index (RAW names nothing with its id,
    /// but the id stays its own while it runs).
    seat: Seat<C>,
    cache: LocationCache<Entry>,
    limits: Limits,
    nodes: usize,
}

impl<M: Memory, C: Clock> RawClient<M, C> {
    /// Connects a client (the index opened; nothing allocated; see
    /// [`Seat::open`]).
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let seat = Seat::open(&mem, cfg, who, clock).await?;
        let cache = LocationCache::new(cfg.cache());
        let nodes = mem.node_count();
        Ok(RawClient { mem, seat, cache, limits: cfg.limits(), nodes })
    }

    /// The register at a location (checked: it comes from memory) of the
    /// key whose hash is `tag`.
    fn register(&self, tag: u64, location: u64) -> Result<RawRegister, KvError> {
        let addr = addr_of(location, self.nodes).ok_or(KvError::Corrupt)?;
        Ok(RawRegister { addr, max_value: self.limits.max_value as u64, tag })
    }

    /// The key's copy and the key's hash: cached (the cache keeps the
    /// hash), or from the index (then cached); whether it was cached.
    async fn find(&mut self, key: &[u8]) -> Result<Option<(u64, u64, bool)>, KvError> {
        if let Some((location, tag, _)) = self.cache.get_hashed(key) {
            return Ok(Some((location, tag, true)));
        }
        let found = Box::pin(self.seat.index.lookup(&self.mem, key)).await?;
        Ok(found.map(|e| {
            self.cache.insert(key, e.location, e);
            (e.location, key_hash(key), false)
        }))
    }

    async fn write(&self, tag: u64, location: u64, value: &[u8]) -> Result<(), KvError> {
        match self.register(tag, location)?.write(&self.mem, value).await {
            Ok(()) => Ok(()),
            Err(RawError::Mem(e)) => Err(e.into()),
            Err(_) => Err(KvError::Corrupt),
        }
    }
}

impl<M: Memory, C: Clock> KvClient for RawClient<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        Raw::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        let mut torn = TornReads::new(self.seat.id as u64);
        let mut stale = 0;
        while stale < RETRIES {
            let Some((location, tag, cached)) = self.find(key).await? else {
                return Ok(Got::NotFound);
            };
            match self.register(tag, location)?.read(&self.mem).await {
                Ok((buf, range)) => return Ok(Got::Found(Value::in_buf(buf, range))),
                Err(RawError::Deleted) => {
                    self.cache.remove(key);
                    if !cached {
                        return Ok(Got::Deleted);
                    }
                    stale += 1;
                }
                // Read during a write, or garbled: read again, after a
                // pause, through the index (the cached location may be what
                // is wrong).
                Err(RawError::Torn) => {
                    self.cache.remove(key);
                    torn.again(&self.mem).await?;
                }
                Err(RawError::Mem(e)) => return Err(e.into()),
                Err(_) => return Err(KvError::Corrupt),
            }
        }
        Err(KvError::Contended)
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        let Some((location, tag, _)) = self.find(key).await? else {
            return Ok(Err(Missing::NotFound));
        };
        self.write(tag, location, value).await?;
        Ok(Ok(Written))
    }

    /// The tombstone and the unmapping in parallel (one roundtrip with the
    /// entry cached; a stale entry unmaps nothing, and the copy it names was
    /// deleted already).
    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        self.seat.keep(&self.mem).await?;
        let mut entry = match self.cache.remove(key) {
            Some((_, entry)) => entry,
            None => match Box::pin(self.seat.index.lookup(&self.mem, key)).await? {
                Some(entry) => entry,
                None => return Ok(Err(Missing::NotFound)),
            },
        };
        let tag = key_hash(key);
        for _ in 0..RETRIES {
            let reg = self.register(tag, entry.location)?;
            let (mem, index) = (&self.mem, &mut self.seat.index);
            let unmap = Box::pin(index.remove(mem, key, Expect::Entry(entry)));
            let (tomb, unmap) = crate::substrate::join::join2(reg.delete(mem), unmap).await;
            tomb.map_err(|e| match e {
                RawError::Mem(e) => e.into(),
                _ => KvError::Corrupt,
            })?;
            match unmap? {
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
    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        if let Some((location, tag, _)) = self.cache.get_hashed(key) {
            self.write(tag, location, value).await?;
            return Ok(Written);
        }
        let tag = key_hash(key);
        let node = node_of(key, 0, self.nodes);
        let size = RawRegister::size(self.limits.max_value as u64);
        let addr = self.seat.slab.alloc(&self.mem, node, size).await?;
        // Recorded before the index names it, with room for the index's
        // block (`crate::substrate::space::slab`).
        self.seat.reserve_index(&self.mem, key.len()).await?;
        let reg = RawRegister { addr, max_value: self.limits.max_value as u64, tag };
        let mut failed = None;
        let (mem, index) = (&self.mem, &mut self.seat.index);
        let ready = async {
            match reg.write(mem, value).await {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        };
        let inserted = Box::pin(index.insert_after(mem, key, location_of(addr), ready)).await?;
        let entry = match inserted {
            Some(Insert::New(e)) => e,
            Some(Insert::Exists(e)) => {
                self.seat.slab.free(addr, size);
                self.write(tag, e.location, value).await?;
                e
            }
            None => {
                self.seat.slab.free(addr, size);
                return Err(match failed {
                    Some(RawError::Mem(e)) => e.into(),
                    _ => KvError::Corrupt,
                });
            }
        };
        self.cache.insert(key, entry.location, entry);
        Ok(Written)
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.seat.keep(&self.mem).await
    }

    async fn close(&mut self) -> Result<(), KvError> {
        self.seat.close(&self.mem).await
    }
}

impl<M: Memory, C> Handle for RawClient<M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.mem
    }

    fn id(&self) -> u8 {
        self.seat.id
    }
}
