//! Clover's metadata server (pDPM §5, "MS duties"): a [`Service`] on the
//! core's server layer (`crate::substrate::msg::server`), beside node 0
//! ([`super::MS`]), as pDPM-Central's coordinator is. It never takes part
//! in a read or an update: it creates keys' chains, tells clients where a
//! chain starts, and hands out free buffers.
//!
//! - **Index and creates.** A key's chain starts at its first version,
//!   which the MS writes itself (to the key's R nodes, out of place, as
//!   any version) before it maps the key to that buffer in the store's
//!   index (`RaceIndex`) on its node, the paper's "local PM". Creates are
//!   serialized by the server loop; a create of a key that has a chain
//!   answers that chain, on which the client appends its version. So a
//!   key has one chain for ever, deletes and inserts again included
//!   ([`super::header`]).
//! - **Lookups** answer the chain's head from the MS's map, loaded from
//!   the index on a key's first request (after a restart: nothing else to
//!   recover, every other piece of state is in the chains).
//! - **ALLOC** hands a client a batch of free buffers on every data node
//!   at once (the paper's "background batches, one bucket per DN"),
//!   carved by the MS's slab allocator from chunks of the nodes' regions.
//!   A node whose allocation fails is skipped for a while
//!   ([`RETRY_AFTER`] requests): its buckets stay empty.
//!
//! Buffers are never freed (garbage collection is not done: see
//! [`super`]), so nothing an earlier incarnation handed out can be handed
//! out again by a standby: its slab allocator claims fresh chunks.

use alloc::vec::Vec;

use hashbrown::HashMap;

use super::buffer;
use super::wire::{self, Answer, MAX_BATCH};
use crate::index::{Index, Insert, RaceIndex};
use crate::kv::place::{addr_of, key_hash, location_of, node_of};
use crate::kv::{KvError, StoreConfig};
use crate::substrate::join::join2;
use crate::substrate::msg::rpc::Status;
use crate::substrate::msg::server::{Request, Service};
use crate::substrate::quorum::{MAX_REPLICAS, majority, to_all};
use crate::substrate::rtt::Counted;
use crate::substrate::space::slab::SlabAllocator;
use crate::{MemError, MemErrorKind, Memory, NodeId, RemoteAddr};

/// The metadata server's service name, which clients check they connect to.
pub const NAME: &str = "clover metadata server";

/// Requests a node whose allocation failed is skipped for.
pub const RETRY_AFTER: u32 = 16;

/// What the metadata server did, over its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Chains created.
    pub creates: u64,
    /// Creates that found a chain (the client appends to it).
    pub existing: u64,
    /// Batches handed out.
    pub batches: u64,
    /// Buffers handed out.
    pub buffers: u64,
    /// Keys loaded from the index (after a restart).
    pub loaded: u64,
    /// Allocations that failed on a data node.
    pub failed_allocs: u64,
}

/// The metadata server's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// The node it runs beside (its index is there).
    pub node: NodeId,
    /// Copies of each version.
    pub replicas: usize,
    /// Longest key.
    pub max_key: usize,
    /// Largest value.
    pub max_value: usize,
}

impl Shape {
    /// The shape for a store of `cfg`.
    pub fn of(cfg: &StoreConfig) -> Shape {
        Shape { node: super::MS, replicas: cfg.replicas, max_key: cfg.max_key, max_value: cfg.max_value }
    }

    /// Bytes of every buffer.
    pub fn buffer(&self) -> u64 {
        buffer::size(self.max_key, self.max_value) as u64
    }
}

/// The metadata server's service.
pub struct MetadataServer {
    shape: Shape,
    index: RaceIndex,
    slab: SlabAllocator,
    heads: HashMap<Vec<u8>, RemoteAddr>,
    /// Per node: requests left before its allocations are tried again.
    skip: Vec<u32>,
    paths: Paths,
}

/// A request that is not what its method takes.
const BAD_REQUEST: KvError = KvError::Bug("a malformed request");

impl MetadataServer {
    /// A metadata server of shape `shape` over the store's `index`.
    pub fn new(shape: Shape, index: RaceIndex) -> Self {
        MetadataServer {
            shape,
            index,
            slab: SlabAllocator::new(),
            heads: HashMap::new(),
            skip: Vec::new(),
            paths: Paths::default(),
        }
    }

    /// What it did so far.
    pub fn paths(&self) -> Paths {
        self.paths
    }

    /// The head of `key`'s chain, from the map or the index.
    async fn head<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Option<RemoteAddr>, KvError> {
        if let Some(&h) = self.heads.get(key) {
            return Ok(Some(h));
        }
        let Some(entry) = self.index.lookup(mem, key).await? else { return Ok(None) };
        let head = addr_of(entry.location, mem.node_count()).filter(|a| a.offset != 0).ok_or(KvError::Corrupt)?;
        self.paths.loaded += 1;
        self.heads.insert(key.to_vec(), head);
        Ok(Some(head))
    }

    fn skipped(&mut self, node: NodeId) -> bool {
        self.skip.get(node.index()).is_some_and(|&s| s > 0)
    }

    fn failed(&mut self, node: NodeId) {
        if self.skip.len() <= node.index() {
            self.skip.resize(node.index() + 1, 0);
        }
        self.skip[node.index()] = RETRY_AFTER;
        self.paths.failed_allocs += 1;
    }

    async fn alloc<M: Memory>(&mut self, mem: &M, node: NodeId) -> Result<RemoteAddr, KvError> {
        if self.skipped(node) {
            return Err(KvError::Down(MemError::new(node, MemErrorKind::Unreachable)));
        }
        match self.slab.alloc(mem, node, self.shape.buffer()).await {
            Ok(a) => Ok(a),
            Err(e) => {
                let e = KvError::from(e);
                if matches!(e, KvError::Down(_)) {
                    self.failed(node);
                }
                Err(e)
            }
        }
    }

    /// Creates `key`'s chain with `value` as its first version: its R
    /// copies written (the primary's and a majority's in all), then the key
    /// mapped to the primary's copy. The answer, and the roundtrips to
    /// data nodes.
    async fn create<M: Memory>(&mut self, mem: &M, key: &[u8], value: &[u8]) -> Result<(Answer, u8), KvError> {
        if key.is_empty() || key.len() > self.shape.max_key || value.len() > self.shape.max_value {
            return Err(BAD_REQUEST);
        }
        if let Some(h) = self.head(mem, key).await? {
            self.paths.existing += 1;
            return Ok((Answer::Head(h), 0));
        }
        let nodes = mem.node_count();
        let r = self.shape.replicas.clamp(1, nodes.min(MAX_REPLICAS));
        let primary = self.alloc(mem, node_of(key, 0, nodes)).await?;
        let mut backups: heapless::Vec<RemoteAddr, MAX_REPLICAS> = heapless::Vec::new();
        for i in 1..r {
            // A node down is left out (a majority of copies will do); a
            // full one fails the create.
            match self.alloc(mem, node_of(key, i, nodes)).await {
                Ok(a) => {
                    let _ = backups.push(a);
                }
                Err(KvError::Down(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let bytes = buffer::encode(key, value, key_hash(key));
        let counted = Counted::new(mem);
        let (p, (reached, _)) = join2(
            counted.write(primary, &bytes),
            to_all(backups.len(), majority(r) - 1, |i| counted.write(backups[i], &bytes)),
        )
        .await;
        p?;
        if !reached {
            return Err(KvError::Unavailable);
        }
        let rounds = counted.roundtrips().min(u8::MAX as u32) as u8;
        let head = match self.index.insert(mem, key, location_of(primary)).await? {
            Insert::New(_) => primary,
            // Another incarnation created it meanwhile: its chain is the
            // key's (these copies are left unused).
            Insert::Exists(e) => addr_of(e.location, nodes).filter(|a| a.offset != 0).ok_or(KvError::Corrupt)?,
        };
        self.heads.insert(key.to_vec(), head);
        self.paths.creates += 1;
        Ok((if head == primary { Answer::Created(head) } else { Answer::Head(head) }, rounds))
    }

    /// Up to `want[n]` free buffers on each node `n`.
    async fn batch<M: Memory>(&mut self, mem: &M, want: &[u8]) -> Result<Answer, KvError> {
        if want.len() > mem.node_count() {
            return Err(BAD_REQUEST);
        }
        for s in self.skip.iter_mut() {
            *s = s.saturating_sub(1);
        }
        let mut per_node = Vec::with_capacity(want.len());
        for (n, &w) in want.iter().enumerate() {
            let mut offs = Vec::new();
            for _ in 0..(w as usize).min(MAX_BATCH) {
                match self.alloc(mem, NodeId(n as u16)).await {
                    Ok(a) => offs.push(a.offset),
                    Err(KvError::Down(_)) => break,
                    Err(e) => return Err(e),
                }
            }
            self.paths.buffers += offs.len() as u64;
            per_node.push(offs);
        }
        self.paths.batches += 1;
        Ok(Answer::Buffers(per_node))
    }
}

impl Service for MetadataServer {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn handle<M: Memory>(&mut self, mem: &M, req: Request<'_>, out: &mut Vec<u8>, _max: usize) -> Status {
        let key_ok = |k: &[u8]| !k.is_empty() && k.len() <= self.shape.max_key;
        let done = match req.method {
            wire::LOOKUP if key_ok(req.body) => {
                self.head(mem, req.body).await.map(|h| (h.map_or(Answer::Absent, Answer::Head), 0))
            }
            wire::CREATE => match wire::parse_create(req.body) {
                Some((key, value)) => self.create(mem, key, value).await,
                None => Err(BAD_REQUEST),
            },
            wire::ALLOC => self.batch(mem, req.body).await.map(|a| (a, 0)),
            wire::LOOKUP => Err(BAD_REQUEST),
            _ => return Status::NoSuchMethod,
        };
        match done {
            Ok((answer, rounds)) => {
                answer.encode(rounds, out);
                Status::Ok
            }
            Err(BAD_REQUEST) => Status::BadRequest,
            Err(e) => {
                wire::encode_failure(&e, out);
                Status::Failed
            }
        }
    }
}
