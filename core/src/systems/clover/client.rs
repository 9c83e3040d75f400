//! A Clover client (pDPM §5): reads and writes go straight to the data
//! nodes with one-sided operations; only creates, cold lookups and
//! allocation batches go to the metadata server.
//!
//! ```text
//! get(k):     READ the cursor's buffer                                     # 1 RTT
//!             its header a link: hop to the next version, READ it again
//! update(k):  WRITE the new version to free buffers on the key's R nodes   # 1
//!             (with an ALLOC of more free buffers beside it, when low)
//!             CAS(cursor's header, tail -> link to the new version)        # 2
//!             the CAS found a link: hop there, CAS again (no new WRITE)
//! delete(k):  CAS(cursor's header, tail -> deleted)                        # 1
//! insert(k):  new key: RPC CREATE, the MS writes the first version        # 2
//!             else as an update, from tail or deleted
//! ```
//!
//! A *cursor* is the last buffer of the key's chain this client knows (the
//! key's location in its `LocationCache`; the MS's head on a miss): never
//! wrong, only old, as the chain only grows. The CAS of a commit expects
//! the key's tail word ([`super::header`]), so it can only succeed on a
//! genuine tail of that key. Reads and CASes go to the key's primary (its
//! first node, where the chain lives); while it is down they fail naming
//! it. The other copies of a version are written for durability, never
//! read.

use alloc::vec::Vec;

use super::buffer;
use super::header::{self, Next};
use super::wire::{self, Answer};
use super::{Clover, MS};
use crate::index::cache::LocationCache;
use crate::kv::place::{RETRIES, addr_of, key_hash, location_of, node_of};
use crate::kv::seat::{give_back, keep_lease};
use crate::kv::{Got, Handle, KvClient, KvError, KvSystem, Limits, Missing, StoreConfig, Who, Written};
use crate::substrate::clock::Clock;
use crate::substrate::join::join2;
use crate::substrate::lease::Held;
use crate::substrate::msg::MsgError;
use crate::substrate::msg::rpc::{Channel, Status};
use crate::substrate::quorum::{MAX_REPLICAS, majority, to_all};
use crate::substrate::value::Value;
use crate::swarm::client::Paths;
use crate::systems::pdpm_central::client::{call_error, call_timeout_ns, open_channel};
use crate::{MemError, MemErrorKind, Memory, NodeId, RemoteAddr};

/// Free buffers a client keeps per data node.
pub const BATCH: usize = 16;
/// Below this many free buffers on a node, a write fetches more beside
/// its WRITE (up to a batch per node): early, so that a burst of writes
/// never waits for allocation (a refill costs the MS a request, and the
/// writer no roundtrip).
pub const LOW: usize = BATCH * 3 / 4;
/// Writes without a background refill after one failed (the MS down: each
/// try waits for the call's time-out).
const QUIET_AFTER_FAILURE: u32 = 8;

/// What a change does at the key's tail.
#[derive(Clone, Copy)]
enum Change<'a> {
    /// A new version; `revive`: also after a deletion (an insert).
    Put { value: &'a [u8], revive: bool },
    /// A deletion.
    Delete,
}

/// One Clover client.
pub struct CloverClient<M, C> {
    mem: M,
    id: u8,
    lease: Option<Held>,
    clock: C,
    channel: Channel,
    call_timeout_ns: u64,
    limits: Limits,
    replicas: usize,
    /// Bytes of a buffer.
    buffer: usize,
    /// Key -> cursor (`location_of` its buffer), and whether it was a
    /// deletion's tail when last seen.
    cache: LocationCache<bool>,
    /// Free buffers per node (offsets).
    pool: Vec<Vec<u64>>,
    /// Per node: the last batch had no buffer there (the MS could not
    /// allocate there): writes go on without it rather than ask again.
    dry: Vec<bool>,
    quiet: u32,
    paths: Paths,
}

impl<M: Memory, C: Clock> CloverClient<M, C> {
    /// Connects a client to the metadata server (waiting for it to start),
    /// and fetches its first batch of free buffers.
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let (id, lease, channel) = open_channel(&mem, cfg, who, &clock, MS, super::ms::NAME).await?;
        let nodes = mem.node_count();
        let mut c = CloverClient {
            call_timeout_ns: call_timeout_ns(&mem, super::geometry(cfg).channels),
            mem,
            id,
            lease,
            clock,
            channel,
            limits: cfg.limits(),
            replicas: cfg.replicas.clamp(1, nodes.min(MAX_REPLICAS)),
            buffer: buffer::size(cfg.max_key, cfg.max_value),
            cache: LocationCache::new(cfg.cache()),
            pool: (0..nodes).map(|_| Vec::new()).collect(),
            dry: alloc::vec![false; nodes],
            quiet: 0,
            paths: Paths::default(),
        };
        // Without it the first writes fetch their buffers first.
        let _ = c.refill().await;
        Ok(c)
    }

    /// Free buffers it holds on `node`.
    pub fn free_buffers(&self, node: NodeId) -> usize {
        self.pool.get(node.index()).map_or(0, |p| p.len())
    }

    async fn keep_lease(&mut self) -> Result<(), KvError> {
        keep_lease(&mut self.lease, &self.mem, self.clock.now()).await
    }

    /// Calls the metadata server: its answer (its roundtrips to data
    /// nodes noted as this client's).
    async fn call(&mut self, method: u16, body: &[u8]) -> Result<Answer, KvError> {
        let (mem, clock) = (&self.mem, &self.clock);
        call(&mut self.channel, mem, clock, self.call_timeout_ns, method, body).await
    }

    /// Fetches buffers for the nodes that are low (a batch's worth each),
    /// in the foreground.
    async fn refill(&mut self) -> Result<(), KvError> {
        let want = self.wanted();
        let (mem, clock) = (&self.mem, &self.clock);
        let got = call(&mut self.channel, mem, clock, self.call_timeout_ns, wire::ALLOC, &want).await;
        self.take(got)
    }

    /// Buffers wanted per node (a request's body).
    fn wanted(&self) -> Vec<u8> {
        self.pool.iter().map(|p| BATCH.saturating_sub(p.len()) as u8).collect()
    }

    /// Whether a node the MS allocates on has few free buffers left.
    fn low(&self) -> bool {
        self.pool.iter().zip(&self.dry).any(|(p, &dry)| p.len() < LOW && !dry)
    }

    /// Adds a batch to the pool.
    fn take(&mut self, got: Result<Answer, KvError>) -> Result<(), KvError> {
        match got? {
            Answer::Buffers(per_node) => {
                for (n, offs) in per_node.into_iter().enumerate() {
                    if let (Some(p), Some(dry)) = (self.pool.get_mut(n), self.dry.get_mut(n)) {
                        *dry = offs.is_empty() && p.len() < BATCH;
                        p.extend(offs);
                    }
                }
                Ok(())
            }
            _ => Err(KvError::Corrupt),
        }
    }

    /// The key's cursor if cached, and whether it was a deletion's tail.
    fn cached(&mut self, key: &[u8]) -> Option<(RemoteAddr, bool)> {
        let (loc, &mut deleted) = self.cache.get(key)?;
        Some((addr_of(loc, self.mem.node_count())?, deleted))
    }

    /// The key's cursor: cached (no roundtrip), or the chain's head from
    /// the MS (one); `None` if the key has no chain.
    async fn find(&mut self, key: &[u8]) -> Result<Option<(RemoteAddr, bool)>, KvError> {
        if let Some(c) = self.cached(key) {
            return Ok(Some(c));
        }
        match self.call(wire::LOOKUP, key).await? {
            Answer::Absent => Ok(None),
            Answer::Head(at) => Ok(Some((at, false))),
            _ => Err(KvError::Corrupt),
        }
    }

    fn remember(&mut self, key: &[u8], at: RemoteAddr, deleted: bool) {
        self.cache.insert(key, location_of(at), deleted);
    }

    /// Free buffers on the key's R nodes, the primary's first (fetched in
    /// the foreground if one of them has none): a node the MS could not
    /// allocate on is left out, except the primary, which a write cannot
    /// go without.
    async fn buffers(&mut self, key: &[u8]) -> Result<heapless::Vec<RemoteAddr, MAX_REPLICAS>, KvError> {
        let nodes = self.mem.node_count();
        let empty = |i: usize, c: &Self| {
            let n = node_of(key, i, nodes).index();
            c.pool[n].is_empty() && (i == 0 || !c.dry[n])
        };
        if (0..self.replicas).any(|i| empty(i, self)) {
            self.refill().await?;
        }
        let mut out = heapless::Vec::new();
        for i in 0..self.replicas {
            let node = node_of(key, i, nodes);
            match self.pool[node.index()].pop() {
                Some(off) => {
                    let _ = out.push(RemoteAddr::new(node, off));
                }
                // The MS could not allocate there: it failed.
                None if i == 0 => return Err(KvError::Down(MemError::new(node, MemErrorKind::Unreachable))),
                None => {}
            }
        }
        Ok(out)
    }

    /// Puts the primary's copy of an unlinked version back in the pool:
    /// its WRITE is done. (The other copies' WRITEs may still land, after
    /// the write went on without them: those buffers are left unused.)
    fn give_back(&mut self, copies: &[RemoteAddr]) {
        if let Some(c) = copies.first()
            && let Some(p) = self.pool.get_mut(c.node.index())
        {
            p.push(c.offset);
        }
    }

    /// Writes a new version to `copies` (the primary's first): waits for
    /// the primary and a majority of the R copies in all; fetches a batch
    /// of buffers beside it if the pool is low.
    async fn write_copies(&mut self, copies: &[RemoteAddr], bytes: &[u8]) -> Result<(), KvError> {
        let background = self.low() && self.quiet == 0;
        self.quiet = self.quiet.saturating_sub(1);
        let want = self.wanted();
        let need = majority(self.replicas) - 1;
        let (mem, clock, timeout) = (&self.mem, &self.clock, self.call_timeout_ns);
        let backups = &copies[1..];
        let write = join2(mem.write(copies[0], bytes), to_all(backups.len(), need, |i| mem.write(backups[i], bytes)));
        let channel = &mut self.channel;
        let refill = async move {
            match background {
                true => Some(call(channel, mem, clock, timeout, wire::ALLOC, &want).await),
                false => None,
            }
        };
        let ((primary, (reached, _)), got) = join2(write, refill).await;
        if let Some(got) = got {
            match self.take(got) {
                Ok(()) => self.paths.refills += 1,
                Err(_) => self.quiet = QUIET_AFTER_FAILURE,
            }
        }
        primary.map_err(mem_error)?;
        if !reached {
            return Err(KvError::Unavailable);
        }
        Ok(())
    }

    /// Applies `change` at the tail of `key`'s chain.
    async fn change(&mut self, key: &[u8], change: Change<'_>) -> Result<Result<Written, Missing>, KvError> {
        let tag = key_hash(key);
        let nodes = self.mem.node_count();
        // An insert of a key it has no cursor for asks the MS to create
        // it (answered the chain if there is one); the others look it up.
        let found = match (self.cached(key), change) {
            (Some(c), _) => Some(c),
            (None, Change::Put { value, revive: true }) => {
                match self.call(wire::CREATE, &wire::create_body(key, value)).await? {
                    Answer::Created(at) => {
                        self.remember(key, at, false);
                        return Ok(Ok(Written));
                    }
                    Answer::Head(at) => Some((at, false)),
                    _ => return Err(KvError::Corrupt),
                }
            }
            (None, _) => match self.find(key).await? {
                Some(c) => Some(c),
                None => return Ok(Err(Missing::NotFound)),
            },
        };
        let Some((mut at, deleted)) = found else { return Err(KvError::Bug("no cursor")) };
        // The new version, written before any CAS can link it.
        let (copies, new) = match change {
            Change::Put { value, .. } => {
                let copies = self.buffers(key).await?;
                self.write_copies(&copies, &buffer::encode(key, value, tag)).await?;
                let new = Next::Link(copies[0]).word(tag);
                (copies, new)
            }
            Change::Delete => (heapless::Vec::new(), Next::Deleted.word(tag)),
        };
        let mut expect =
            if deleted && matches!(change, Change::Put { revive: true, .. }) { Next::Deleted } else { Next::Tail };
        loop {
            let prev = self.mem.cas(at, expect.word(tag), new).await.map_err(mem_error)?;
            if prev == expect.word(tag) {
                let now = match change {
                    Change::Put { .. } => (copies[0], false),
                    Change::Delete => (at, true),
                };
                self.remember(key, now.0, now.1);
                return Ok(Ok(Written));
            }
            self.paths.cas_retries += 1;
            match header::decode(prev, tag, nodes) {
                Some(Next::Link(next)) => {
                    self.paths.chain_hops += 1;
                    at = next;
                    expect = Next::Tail;
                }
                Some(Next::Tail) => expect = Next::Tail,
                Some(Next::Deleted) => match change {
                    Change::Put { revive: true, .. } => expect = Next::Deleted,
                    _ => {
                        self.remember(key, at, true);
                        self.give_back(&copies);
                        return Ok(Err(Missing::NotFound));
                    }
                },
                None => {
                    self.cache.remove(key);
                    self.give_back(&copies);
                    return Err(KvError::Corrupt);
                }
            }
        }
    }

    async fn get_value(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        let tag = key_hash(key);
        let nodes = self.mem.node_count();
        let Some((mut at, _)) = self.find(key).await? else { return Ok(Got::NotFound) };
        let mut bad = 0;
        loop {
            let b = self.mem.read(at, self.buffer).await.map_err(mem_error)?;
            let Some(v) = buffer::decode(&b, key, tag, nodes, self.limits.max_value) else {
                // A torn header word (never: words are atomic) or garbage.
                bad += 1;
                if bad > RETRIES {
                    self.cache.remove(key);
                    return Err(KvError::Corrupt);
                }
                continue;
            };
            match v.next {
                Next::Tail => {
                    self.remember(key, at, false);
                    return Ok(Got::Found(Value::in_buf(b, v.value)));
                }
                Next::Deleted => {
                    self.remember(key, at, true);
                    return Ok(Got::Deleted);
                }
                // Mutant `clover-stale-cursor`: the cursor's version is
                // returned without checking that it is the tail.
                Next::Link(_) if cfg!(swarm_mutant = "clover-stale-cursor") => {
                    return Ok(Got::Found(Value::in_buf(b, v.value)));
                }
                Next::Link(next) => {
                    self.paths.chain_hops += 1;
                    at = next;
                    bad = 0;
                }
            }
        }
    }
}

/// A memory error as the key-value interface says it: a request the node
/// refused (out of bounds: a garbled location) is corruption; else the
/// node is down.
fn mem_error(e: MemError) -> KvError {
    if e.is_request_error() { KvError::Corrupt } else { KvError::Down(e) }
}

/// Calls the metadata server on `channel`: its answer (its roundtrips to
/// data nodes noted as the caller's).
async fn call<M: Memory, C: Clock>(
    channel: &mut Channel,
    mem: &M,
    clock: &C,
    timeout_ns: u64,
    method: u16,
    body: &[u8],
) -> Result<Answer, KvError> {
    let reply = channel.call(mem, clock, timeout_ns, method, body).await.map_err(|e| call_error(e, MS))?;
    let body = match reply.status {
        Status::Ok => reply.body,
        Status::Failed => return Err(wire::decode_failure(&reply.body)),
        s => return Err(call_error(MsgError::Refused(s), MS)),
    };
    let (answer, rounds) = Answer::decode(&body, mem.node_count()).ok_or(KvError::Corrupt)?;
    mem.note_server_roundtrips(rounds as u32);
    Ok(answer)
}

impl<M: Memory, C: Clock> KvClient for CloverClient<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        Clover::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        self.get_value(key).await
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        self.keep_lease().await?;
        self.change(key, Change::Put { value, revive: false }).await
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        self.keep_lease().await?;
        match self.change(key, Change::Put { value, revive: true }).await? {
            Ok(w) => Ok(w),
            Err(_) => Err(KvError::Bug("an insert found no key")),
        }
    }

    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        self.keep_lease().await?;
        self.change(key, Change::Delete).await
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.keep_lease().await
    }

    fn paths(&self) -> Paths {
        self.paths
    }

    /// Gives the leased id back. Its free buffers are lost (garbage
    /// collection is not done).
    async fn close(&mut self) -> Result<(), KvError> {
        give_back(self.lease.take(), &self.mem).await
    }
}

impl<M: Memory, C> Handle for CloverClient<M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.mem
    }

    fn id(&self) -> u8 {
        self.id
    }
}
