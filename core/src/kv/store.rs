//! Setting up a store on memory nodes, connecting clients to it, and the
//! one client type every caller uses whatever the system.

use alloc::boxed::Box;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::index::{IndexError, RaceIndex};
use crate::substrate::clock::Clock;
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::roots;
use crate::substrate::space::slab::AllocError;
use crate::substrate::value::Value;
use crate::swarm::client::ClientError;
use crate::swarm::maxreg::RegError;
use crate::swarm::writerlog::{self, LogError};
use crate::{MemError, Memory, NodeId};

use super::config::{StoreConfig, System};
use super::raw::Raw;
use super::replicated::Replicated;
use super::{Got, KvClient, KvError, Limits, Missing, Written};

/// The node that holds the index (and the replicas' descriptors).
pub(crate) const INDEX_NODE: NodeId = NodeId(0);

/// How many times an operation starts again after finding a stale cached
/// location or losing a race with a delete, before giving up.
pub(crate) const RETRIES: usize = 8;

/// Where a key's values live: the first of its consecutive nodes.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, 0x5357_4b56)
}

pub(crate) fn mem_error(e: MemError) -> KvError {
    if e.is_request_error() { KvError::Corrupt } else { KvError::Unavailable }
}

pub(crate) fn reg_error(e: RegError) -> KvError {
    match e {
        RegError::NoQuorum(_) => KvError::Unavailable,
        RegError::ValueTooLarge { len, max } => KvError::ValueTooLarge { len, max: max as usize },
        RegError::Client(ClientError::Log(LogError::NoQuorum(_))) => KvError::Unavailable,
        RegError::Client(ClientError::Log(LogError::Mem(e))) => mem_error(e),
        RegError::Client(ClientError::Log(LogError::Corrupt { .. })) => KvError::NoStore,
        RegError::Client(ClientError::BadId(_)) => KvError::BadConfig("client ids go from 1 to 126"),
        RegError::Client(_) => KvError::Full,
        RegError::Corrupt(_) => KvError::Corrupt,
        RegError::NotWaitFree | RegError::Deleted => KvError::Contended,
    }
}

pub(crate) fn index_error(e: IndexError) -> KvError {
    match e {
        IndexError::Mem(e) => mem_error(e),
        IndexError::Region(RegionError::Exhausted { .. }) | IndexError::Full { .. } => KvError::Full,
        IndexError::KeyTooLong { len, max } => KvError::BadKey { len, max },
        IndexError::NoIndex { .. } => KvError::NoStore,
        IndexError::Contended => KvError::Contended,
        _ => KvError::Corrupt,
    }
}

/// Sets up a store on every node of `mem`, once, by one client, after
/// [`Region::format`] of each node (with [`StoreConfig::CHUNK`]-byte chunks,
/// or any size that holds a log entry; nodes must start zeroed, as every backend creates them): writer logs on
/// the nodes that have none, and the index on node 0. Running it again on
/// a formatted cluster changes nothing.
pub async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
    cfg.check(mem.node_count())?;
    if cfg.system.replicated() {
        for n in 0..mem.node_count() {
            let node = NodeId(n as u16);
            let region = Region::open(mem, node).await.map_err(region_error)?;
            let geo = cfg.log_geometry(region.size, region.chunk)?;
            let dir = Region::read_root(mem, node, roots::LOG_DIR).await.map_err(region_error)?;
            if dir == 0 {
                writerlog::format(mem, node, geo).await.map_err(|e| match e {
                    LogError::Mem(e) => mem_error(e),
                    LogError::Alloc(_) | LogError::Full => KvError::Full,
                    _ => KvError::Corrupt,
                })?;
            }
        }
    }
    RaceIndex::open_or_create(mem, INDEX_NODE, cfg.index()).await.map_err(index_error)?;
    Ok(())
}

pub(crate) fn alloc_error(e: AllocError) -> KvError {
    match e {
        AllocError::Region(e) => region_error(e),
        AllocError::BadSize { .. } => KvError::BadConfig("values too large for the nodes' chunks"),
        AllocError::TooManyNodes => KvError::BadConfig("at most 32 memory nodes"),
    }
}

pub(crate) fn region_error(e: RegionError) -> KvError {
    match e {
        RegionError::Mem(e) => mem_error(e),
        RegionError::Exhausted { .. } => KvError::Full,
        RegionError::Corrupt { .. } => KvError::NoStore,
        _ => KvError::Corrupt,
    }
}

/// Connects client `id` (`1..=cfg.writers`) to the store that [`format`]
/// set up on `mem`. Several clients (distinct ids) may share a thread, to
/// keep several operations in flight.
pub async fn connect<M: Memory, C: Clock>(mem: M, cfg: &StoreConfig, id: u8, clock: C) -> Result<Store<M, C>, KvError> {
    cfg.check(mem.node_count())?;
    if id == 0 || id > cfg.writers {
        return Err(KvError::BadConfig("client id outside 1..=writers"));
    }
    let inner = match cfg.system {
        System::Raw => Inner::Raw(Box::new(Raw::open(mem, cfg, id).await?)),
        _ => Inner::Replicated(Box::new(Replicated::open(mem, cfg, id, clock).await?)),
    };
    Ok(Store { inner })
}

/// A client of any of the stores.
pub struct Store<M: Memory, C> {
    inner: Inner<M, C>,
}

/// Boxed: a client holds its allocator's and logs' state (tens of KiB).
enum Inner<M: Memory, C> {
    Raw(Box<Raw<M>>),
    Replicated(Box<Replicated<M, C>>),
}

impl<M: Memory, C: Clock> Store<M, C> {
    /// The memory this client works on (e.g. a [`crate::substrate::rtt::Counted`], to
    /// read each operation's roundtrips).
    pub fn mem(&self) -> &M {
        match &self.inner {
            Inner::Raw(s) => s.mem(),
            Inner::Replicated(s) => s.mem(),
        }
    }

    /// The client's id.
    pub fn id(&self) -> u8 {
        match &self.inner {
            Inner::Raw(s) => s.id(),
            Inner::Replicated(s) => s.id(),
        }
    }
}

impl<M: Memory, C: Clock> KvClient for Store<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        match &self.inner {
            Inner::Raw(_) => System::Raw.name(),
            Inner::Replicated(s) => s.system().name(),
        }
    }

    fn limits(&self) -> Limits {
        match &self.inner {
            Inner::Raw(s) => s.limits(),
            Inner::Replicated(s) => s.limits(),
        }
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        match &mut self.inner {
            Inner::Raw(s) => s.insert(key, value).await,
            Inner::Replicated(s) => s.insert(key, value).await,
        }
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        match &mut self.inner {
            Inner::Raw(s) => s.update(key, value).await,
            Inner::Replicated(s) => s.update(key, value).await,
        }
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Self::Value>, KvError> {
        match &mut self.inner {
            Inner::Raw(s) => s.get(key).await,
            Inner::Replicated(s) => s.get(key).await,
        }
    }

    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        match &mut self.inner {
            Inner::Raw(s) => s.delete(key).await,
            Inner::Replicated(s) => s.delete(key).await,
        }
    }
}
