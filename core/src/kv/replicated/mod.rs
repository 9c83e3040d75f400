//! The store of a register per key, replicated on 2f+1 memory nodes,
//! found through the index and cached by clients (SWARM §5.3): SWARM-KV
//! and DM-ABD, which differ only in the register protocol (Safe-Guess over
//! In-n-Out, or ABD over out-of-place objects). The protocol is a type
//! ([`Protocol`]) that each system's folder provides; this client, the
//! location descriptors (`descriptor`) and what a client keeps of a key
//! (`known`) serve both.
//!
//! ```text
//! insert(k, v):  cached k: update(k, v), unless k turns out deleted
//!                fresh replicas on k's nodes; in parallel: write v to them,
//!                  write their descriptor to the index's replicas,
//!                  read k's index buckets                             # 1 RTT
//!                publish the mapping (SNAPSHOT: backups, primary)     # 2 RTT
//!                k already mapped: update its register; if deleted,
//!                  swing the mapping to the fresh replicas
//! update(k, v):  locate k (cache: 0 RTT); write v                     # 1 RTT
//!                deleted: forget k, unmap it (the deleter may have
//!                  failed before), retry: then k is not found (§5.3.3)
//! get(k):        locate k; read                                       # 1 RTT
//!                deleted and cached: forget k, retry via the index (§5.3.4)
//! delete(k):     locate k (cached: check its index slot, 1 RTT);
//!                write the deletion marker                            # 1 RTT
//!                then unmap k in the background (§5.3.2)
//! ```
//!
//! The index is replicated on the store's first 2f+1 nodes
//! ([`crate::index::snapshot`]), with the descriptors beside it, so that
//! the store survives the crash of any minority of its nodes.
//!
//! Index operations and the rare paths are boxed ([`crate::substrate::exec::cold`]):
//! futures are as large as the largest future they await, and every level
//! moves its children, so the common path keeps them small.
//!
//! Differences from the paper, and why:
//! - The mapping of a new key is published only once its value is written
//!   ([`Index::insert_after`]), not in parallel: a reader can then never
//!   find a mapped key with empty replicas, and an update never lands on a
//!   register whose insert is still in flight (which would let a failed
//!   update's value survive). Our index needs three roundtrips for a new
//!   key anyway (read the buckets, then SNAPSHOT's two phases), and the
//!   value write hides in the first, so an insert of a new key costs three
//!   roundtrips.
//! - New replicas are not cleared: they come from fresh chunks of nodes
//!   that start zeroed (or from above a crashed holder's marks, where it
//!   wrote nothing: it writes an object only once its mark is recorded).
//!   Writers' log entries are recycled ([`crate::swarm::recycle`]: a value that stays moves to its object's
//!   home copy), but objects, descriptors and index blocks are not yet: a
//!   deleted key's replicas stay claimed (issue #20). Recycling them will
//!   need the paper's pre-cleared buffers.
//! - A delete with a cached location first checks that the index slot
//!   still holds it (one more roundtrip, two in all; see
//!   [`Replicated::delete`]); see [`super`] for what deletes answer.
//! - An insert does not wait for a node that is late with a fresh chunk
//!   (§6 promises that a slow node costs nothing): the key gets no replica
//!   there, as on a node that is down. So that it again survives the
//!   failure of any minority, a later operation gives it the missing
//!   replica once the node answers (`Replicated::restore`: a new
//!   descriptor, and the index entry swung to it); one that finds no
//!   majority without it waits for the node to do so. An insert whose
//!   first write then finds no majority is tried again, waiting for every
//!   node.
//! - As in the paper's implementation (§6), operations start with a
//!   majority (the key's first replicas, unless this client saw their node
//!   fail) and widen on failure ([`crate::substrate::quorum::quorum_first`]), and by
//!   default only the first replica keeps an in-place copy
//!   (SWARM-KV's option `in-place`).

use alloc::boxed::Box;
use core::future::Future;

use crate::index::cache::LocationCache;
use crate::index::snapshot::SnapshotIndex;
use crate::index::{Change, Entry, Expect, Index, Insert};
use crate::substrate::clock::Clock;
use crate::substrate::exec::cold;
use crate::substrate::join::join2;
use crate::substrate::late::NodeView;
use crate::substrate::lease::LeaseError;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority};
use crate::substrate::space::slab::ARENA_CLASS;
use crate::substrate::space::{AllocError, Region, RegionError, roots};
use crate::substrate::value::Value;
use crate::swarm::client::{ClientCtx, ClientError};
use crate::swarm::inout::{InOutError, Layout, Replica};
use crate::swarm::maxreg::{RegCache, RegError, Register};
use crate::swarm::meta::Meta;
use crate::swarm::writerlog::{self, LogError};
use crate::{Memory, NodeId};

use super::config::{NodeChunks, NodeShape, StoreConfig};
use super::place::{RETRIES, index_nodes, node_of};
use super::system::{Handle, KvSystem, SystemInfo, Who};
use super::{Got, KvClient, KvError, Limits, Missing, Written};
use crate::index::cache::key_hash;
use descriptor::DESCRIPTOR_BYTES;
use known::{Cached, Known};

pub(crate) mod descriptor;
mod known;
pub(crate) mod sizing;

use sizing::node_bytes;

/// A register protocol over a key's replicated [`Register`]: how a store
/// of this kind reads and writes a key's value. Every protocol is a
/// [`KvSystem`] (its store is [`Replicated`]); its folder under `systems/`
/// declares its [`SystemInfo`] and implements this.
pub trait Protocol: 'static {
    /// The system's declaration.
    const INFO: &'static SystemInfo;

    /// The shape of every replica of a key in a store of `cfg`.
    fn layout(cfg: &StoreConfig) -> Result<Layout, KvError>;

    /// Reads the register: its metadata and value.
    fn read<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
    ) -> impl Future<Output = Result<(Meta, Value<M::Buf>), RegError>>;

    /// Writes `value`.
    fn write<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
        value: &[u8],
    ) -> impl Future<Output = Result<(), RegError>>;
}

/// How a register's failure reads to a store's user. A write that reached
/// no majority because a replica's node had no room for its log entry (or
/// the log said why else it could not be used) says that, with its
/// numbers, rather than that nodes did not answer.
fn reg_error(e: RegError) -> KvError {
    match e {
        RegError::NoQuorum(InOutError::Log(
            e @ (LogError::Alloc(_) | LogError::Full { .. } | LogError::NoLog(_) | LogError::Lease(_)),
        )) => client_error(ClientError::Log(e)),
        RegError::NoQuorum(_) => KvError::Unavailable,
        RegError::ValueTooLarge { len, max } => KvError::ValueTooLarge { len, max: max as usize },
        RegError::Client(e) => client_error(e),
        RegError::Corrupt(_) => KvError::Corrupt,
        RegError::NotWaitFree => KvError::Bug("a Safe-Guess read looped past the bound of Lemma C.5"),
        // Acted on by the store, never returned.
        RegError::Deleted => KvError::Contended,
    }
}

/// How a client's failure to name a write reads to a store's user: a
/// node's failure as such, a node without room as such (with the bytes),
/// the rest with its numbers: a full log, timestamps run out, a clock
/// ahead ([`ClientError`]'s own messages).
fn client_error(e: ClientError) -> KvError {
    match e {
        ClientError::Log(LogError::NoQuorum(_)) => KvError::Unavailable,
        ClientError::Log(LogError::Lease(e)) => client_error(ClientError::Lease(e)),
        ClientError::Log(LogError::Mem(e)) | ClientError::Lease(LeaseError::Mem(e)) => e.into(),
        ClientError::Log(LogError::Alloc(e)) => e.into(),
        ClientError::Lease(LeaseError::Region(e)) => e.into(),
        ClientError::Log(LogError::Corrupt { .. }) => KvError::Corrupt,
        ClientError::Log(LogError::Stale(_)) => KvError::Unavailable,
        ClientError::Log(LogError::NoLog(_)) => KvError::NoStore,
        ClientError::BadId(_) => KvError::BadConfig("client ids go from 1 to 126"),
        ClientError::Lease(e) => KvError::Lease(e),
        e @ (ClientError::Log(LogError::Full { .. })
        | ClientError::TimeExhausted { .. }
        | ClientError::TimeAhead { .. }) => KvError::Client(e),
    }
}

impl<P: Protocol> KvSystem for P {
    const INFO: &'static SystemInfo = P::INFO;

    /// Boxed: a client holds its allocator's and logs' state (about 100 KiB).
    type Client<M: Memory, C: Clock> = Box<Replicated<P, M, C>>;

    fn check(cfg: &StoreConfig, _: usize) -> Result<(), KvError> {
        P::layout(cfg).map(|_| ())
    }

    fn node_bytes(cfg: &StoreConfig, nodes: usize, writes: u64) -> u64 {
        node_bytes(cfg, P::layout(cfg), nodes, writes)
    }

    fn node_chunks(cfg: &StoreConfig, nodes: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        sizing::node_chunks(cfg, P::layout(cfg)?, nodes, node, shape)
    }

    async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
        format(mem, cfg).await
    }

    async fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> Result<Box<Replicated<P, M, C>>, KvError> {
        Replicated::open(mem, cfg, who, clock).await
    }
}

/// Sets up a replicated store on every node of `mem`: writer logs on the
/// nodes that have none, and the index. Running it again changes nothing.
async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        let region = Region::open(mem, node).await?;
        let geo = sizing::log_geometry(cfg, region.size, region.chunk)?;
        if Region::read_root(mem, node, roots::LOG_DIR).await? == 0 {
            writerlog::format(mem, node, geo).await.map_err(|e| match e {
                LogError::Mem(e) => e.into(),
                LogError::Alloc(e) => e.into(),
                _ => KvError::Corrupt,
            })?;
        }
    }
    let timeout = mem.timeout_ns().unwrap_or(sizing::DEFAULT_TIMEOUT_NS);
    SnapshotIndex::open_or_create(mem, &index_nodes(cfg, mem.node_count()), sizing::index_config(cfg, timeout)).await?;
    Ok(())
}

/// One client of a replicated store of protocol `P`.
pub struct Replicated<P, M, C> {
    io: Io<P, M, C>,
    index: SnapshotIndex,
    cache: LocationCache<Cached>,
    /// Where an operation on a cached key works ([`Cached::load`]).
    work: Known,
    layout: Layout,
    replicas: usize,
    nodes: usize,
    limits: Limits,
    /// Nodes (bit `n`) where restoring a replica found no room.
    no_room: u32,
}

impl<P: Protocol, M: Memory, C: Clock> Replicated<P, M, C> {
    /// Connects a client: the nodes' log directories and the index opened,
    /// nothing allocated ([`ClientCtx::open_logs`]: a client claims memory
    /// at its first write, so that a full store stays readable). If the
    /// connection fails, a leased id is given back at once, with what its
    /// previous holder handed over, rather than held until its lease ends.
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Box<Self>, KvError> {
        let id = crate::kv::seat::check_id(&who, cfg)?;
        let ctx = match who {
            Who::Id(id) => ClientCtx::new(id, clock),
            Who::Lease(held) => ClientCtx::leased(held, clock),
        };
        let mut ctx = ctx.map_err(client_error)?;
        ctx.configure(crate::swarm::client::recycle_delay_ns(mem.timeout_ns()), P::layout(cfg)?);
        let opened = match ctx.open_logs(&mem).await {
            Ok(()) => {
                SnapshotIndex::open(&mem, &index_nodes(cfg, mem.node_count()), id as u32).await.map_err(KvError::from)
            }
            Err(e) => Err(client_error(e)),
        };
        let mut index = match opened {
            Ok(index) => index,
            Err(e) => {
                // Best effort: the id frees when its lease ends otherwise.
                let _ = ctx.release(&mem, None).await;
                return Err(e);
            }
        };
        if let Some(c) = ctx.slab.take_extra_of(index.header().replicas[0].node, ARENA_CLASS) {
            index.adopt(c);
        }
        let cache = LocationCache::new(cfg.cache());
        let nodes = mem.node_count();
        let layout = P::layout(cfg)?;
        Ok(Box::new(Replicated {
            io: Io { mem, ctx, protocol: core::marker::PhantomData },
            index,
            cache,
            work: Known::blank(layout),
            layout,
            replicas: cfg.replicas,
            nodes,
            limits: cfg.limits(),
            no_room: 0,
        }))
    }

    /// Runs `op` on the key's register: the cached one, in place (no
    /// roundtrip to find it), or else the one the index and its descriptor
    /// name (three roundtrips), cached afterwards. `None` if the key is not
    /// mapped; with the answer, whether the register came from the cache
    /// (and may be stale).
    async fn with_key<T>(
        &mut self,
        key: &[u8],
        mut op: impl AsyncFnMut(&mut Io<P, M, C>, &mut Known) -> T,
    ) -> Result<Option<(T, bool)>, KvError> {
        if let Some(out) = self.on_cached(key, &mut op).await {
            return Ok(Some((out, true)));
        }
        let Some(entry) = Box::pin(self.index.lookup(&self.io.mem, key)).await? else {
            return Ok(None);
        };
        // Boxed: the cached path above holds the common copy of `op`'s future.
        cold(|| async {
            let mut k = self.describe(key, entry).await?;
            if k.reg.replicas.iter().any(|r| restorable(r, &self.io.ctx.nodes, self.no_room, false))
                && let Some(now) = self.restore(key, k.clone(), false).await
            {
                k = now;
            }
            let out = op(&mut self.io, &mut k).await;
            self.cache.insert(key, k.entry.location, Cached::new(k));
            Ok(Some((out, false)))
        })
        .await
    }

    /// Runs `op` on what this client knows of `key`, if it has the key in
    /// its cache (`None` otherwise), and keeps what `op` learned.
    async fn on_cached<T>(
        &mut self,
        key: &[u8],
        mut op: impl AsyncFnMut(&mut Io<P, M, C>, &mut Known) -> T,
    ) -> Option<T> {
        let mut tried = false;
        loop {
            let (_, tag, cached) = self.cache.get_hashed(key)?;
            cached.load(&mut self.work, tag);
            // Rarely (a replica left out and its node back): restore it
            // first, so that this operation uses it too.
            if tried || !self.work.reg.replicas.iter().any(|r| restorable(r, &self.io.ctx.nodes, self.no_room, false)) {
                let out = op(&mut self.io, &mut self.work).await;
                cached.keep(&self.work);
                return Some(out);
            }
            tried = true;
            cold(|| self.restore_cached(key, false)).await;
        }
    }

    /// The key's register: cached (no roundtrip, maybe stale: the flag), or
    /// from the index and its descriptor (three roundtrips), then cached.
    async fn find(&mut self, key: &[u8]) -> Result<Option<(Known, bool)>, KvError> {
        if let Some((_, tag, cached)) = self.cache.get_hashed(key) {
            return Ok(Some((cached.known(tag), true)));
        }
        let Some(entry) = Box::pin(self.index.lookup(&self.io.mem, key)).await? else {
            return Ok(None);
        };
        let k = Box::pin(self.describe(key, entry)).await?;
        self.cache.insert(key, entry.location, Cached::new(k.clone()));
        Ok(Some((k, false)))
    }

    /// Reads the descriptor `key`'s index entry points to, a record beside
    /// the index (one roundtrip, from any index replica that holds it
    /// whole): it must be `key`'s (its tag), or the entry is corrupt.
    async fn describe(&self, key: &[u8], entry: Entry) -> Result<Known, KvError> {
        let (tag, nodes) = (key_hash(key), self.nodes);
        let mine = |b: &[u8]| descriptor::decode(b, nodes).ok().filter(|r| r.layout.tag == tag);
        let reg = self.index.records().read(&self.io.mem, entry.location, descriptor::LEN, mine).await?;
        Ok(Known { reg, rc: RegCache::default(), entry })
    }

    /// Removes the key's mapping if it is still `entry`.
    async fn unmap(&mut self, key: &[u8], entry: Entry) -> Result<(), KvError> {
        self.cache.remove(key);
        Box::pin(self.index.remove(&self.io.mem, key, Expect::Entry(entry))).await?;
        Ok(())
    }

    /// Inserts `key` with `value` in fresh replicas (see
    /// [`new_register`](Self::new_register) for `wait_all`).
    async fn insert_fresh(&mut self, key: &[u8], value: &[u8], wait_all: bool) -> Result<Fresh, KvError> {
        let (reg, left_out) = self.new_register(key, wait_all).await?;
        let desc = self.index.alloc_record(&self.io.mem, DESCRIPTOR_BYTES).await?;
        let bytes = descriptor::encode(&reg);
        let mut rc = RegCache::default();
        let mut failed = None;
        let records = self.index.records();
        let (Io { mem, ctx, .. }, index) = (&mut self.io, &mut self.index);
        // Boxed: the index passes `ready` down by value through each of its
        // levels, and an `async fn` holds its arguments twice
        // (rust-lang/rust#62958).
        let ready = Box::pin(async {
            let first = Box::pin(first_write(ctx, mem, &reg, &mut rc, value));
            match join2(records.write(&*mem, desc, &bytes), first).await {
                (Ok(()), Ok(())) => true,
                (Err(e), _) => {
                    failed = Some(e.into());
                    false
                }
                (_, Err(e)) => {
                    failed = Some(reg_error(e));
                    false
                }
            }
        });
        let inserted = Box::pin(index.insert_after(&*mem, key, desc, ready)).await;
        let inserted = match inserted? {
            Some(i) => i,
            // A majority of the replicas that were not late may not be a
            // majority that answers (another node may have crashed): the
            // mapping was not published, so try again on every replica.
            None if left_out && !mutant!("insert-impatient") => return Ok(Fresh::WaitForAll),
            None => return Err(failed.unwrap_or(KvError::Unavailable)),
        };
        let mine = |entry| Known { reg: reg.clone(), rc: rc.clone(), entry };
        match inserted {
            Insert::New(entry) => {
                self.cache.insert(key, entry.location, Cached::new(mine(entry)));
                Ok(Fresh::Done(Written))
            }
            Insert::Exists(entry) => {
                // Mapped already (by another client, or before our cache
                // knew): update that register, or if it was deleted, swing
                // the mapping to ours.
                let mut k = self.describe(key, entry).await?;
                match self.io.write(&mut k, value).await {
                    Ok(()) => {
                        self.cache.insert(key, entry.location, Cached::new(k));
                        return Ok(Fresh::Done(Written));
                    }
                    Err(RegError::Deleted) => {}
                    Err(e @ RegError::NoQuorum(_)) => {
                        let restored = cold(|| self.restore(key, k, true)).await.is_some();
                        return if restored { Ok(Fresh::Again) } else { Err(reg_error(e)) };
                    }
                    Err(e) => return Err(reg_error(e)),
                }
                let swung = Box::pin(self.index.update(&self.io.mem, key, Expect::Entry(entry), desc)).await;
                match swung? {
                    Change::Done { now: Some(now), .. } => {
                        self.cache.insert(key, now.location, Cached::new(mine(now)));
                        Ok(Fresh::Done(Written))
                    }
                    _ => Ok(Fresh::Again),
                }
            }
        }
    }

    /// Fresh objects on the key's nodes (`hash + i mod nodes`), taken from
    /// this client's chunks: usually no roundtrip. The new chunks that some
    /// nodes need are taken on all of them at once; unless `wait_all`, a
    /// node that is late with its chunk once a majority have theirs is left
    /// out, as one that cannot be reached is (SWARM §6: an insert does not
    /// wait for a slow node). A node left out gets [`NO_REPLICA`] (if a
    /// majority can be had, or one may be once those left out as late are
    /// waited for): a replica that every operation fails on, as on a
    /// crashed node, until [`restore`](Self::restore) gives the key a new
    /// one. The second value says whether one may have been left out only
    /// for being late.
    async fn new_register(&mut self, key: &[u8], wait_all: bool) -> Result<(Register, bool), KvError> {
        let nodes: heapless::Vec<NodeId, MAX_REPLICAS> =
            (0..self.replicas).map(|r| node_of(key, r, self.nodes)).collect();
        let sizes: heapless::Vec<u64, MAX_REPLICAS> =
            (0..self.replicas).map(|r| self.layout.of_replica(r).size()).collect();
        // On a node it suspects, the client takes an object only if that
        // needs no roundtrip (it would be late again); on the others, all at
        // once. (A need above their number waits for every one.)
        let mut bases = [NO_REPLICA; MAX_REPLICAS];
        let (mut ask, mut local) = (heapless::Vec::<usize, MAX_REPLICAS>::new(), 0);
        for (r, &node) in nodes.iter().enumerate() {
            if wait_all || !self.io.ctx.nodes.suspects(node) {
                let _ = ask.push(r);
            } else if let Some(a) = self.io.ctx.slab.alloc_local(node, sizes[r]) {
                (bases[r], local) = (a.offset, local + 1);
            }
        }
        let need = if wait_all { usize::MAX } else { majority(nodes.len()).saturating_sub(local) };
        let (ask_nodes, ask_sizes): (heapless::Vec<NodeId, MAX_REPLICAS>, heapless::Vec<u64, MAX_REPLICAS>) =
            ask.iter().map(|&r| (nodes[r], sizes[r])).unzip();
        let got = self.io.ctx.slab.alloc_each(&self.io.mem, &ask_nodes, &ask_sizes, need).await;
        for (&r, got) in ask.iter().zip(got) {
            match got {
                Ok(a) => bases[r] = a.offset,
                Err(AllocError::Region(RegionError::Mem(e))) if !e.is_request_error() => {
                    self.io.ctx.nodes.note(nodes[r], true)
                }
                Err(e) => return Err(e.into()),
            }
        }
        let replicas: heapless::Vec<Replica, MAX_REPLICAS> =
            nodes.iter().zip(bases).map(|(&node, base)| Replica { node, base }).collect();
        let missing = replicas.iter().filter(|r| r.base == NO_REPLICA).count();
        let left_out = missing > 0 && !wait_all;
        if missing > (self.replicas - 1) / 2 && !left_out {
            return Err(KvError::Unavailable);
        }
        // Recorded before the index names them (`crate::substrate::space::slab`).
        self.io.ctx.record_marks(&self.io.mem).await.map_err(client_error)?;
        Ok((Register { layout: self.layout.tagged(key_hash(key)), replicas }, left_out))
    }

    /// Gives a register the replicas it was created without, on those of
    /// their nodes that this client does not suspect (SWARM §6: an insert
    /// leaves out a node that is late or down, see
    /// [`new_register`](Self::new_register); once the node is back, the
    /// key should again survive the failure of any minority). Fresh objects
    /// there, a new descriptor naming them, and the key's index entry
    /// swung to it if it is still `k`'s; the new register, if so.
    ///
    /// Without `wait`, best effort, before an operation on the key (which
    /// then uses the new replicas too): only on nodes the client does not
    /// suspect, not waiting for one that turns out late. Whatever fails is
    /// left for a later operation, and a node with no room is not tried
    /// again by this client. With `wait`, after an operation that reached
    /// no majority without them: on every such node, waiting for each, as
    /// an insert that had waited for them would have.
    ///
    /// Safe while other clients still use the old descriptor: a new
    /// replica starts empty, as a replica that no write or lock has reached
    /// yet, and every quorum, with or without it, is a majority of the same
    /// replicas, so any two intersect.
    async fn restore(&mut self, key: &[u8], k: Known, wait: bool) -> Option<Known> {
        let (view, no_room) = (&self.io.ctx.nodes, self.no_room);
        let lacking: heapless::Vec<usize, MAX_REPLICAS> =
            (0..k.reg.replicas.len()).filter(|&i| restorable(&k.reg.replicas[i], view, no_room, wait)).collect();
        if lacking.is_empty() || mutant!("no-restore") {
            return None;
        }
        let nodes: heapless::Vec<NodeId, MAX_REPLICAS> = lacking.iter().map(|&i| k.reg.replicas[i].node).collect();
        let sizes: heapless::Vec<u64, MAX_REPLICAS> =
            lacking.iter().map(|&i| self.layout.of_replica(i).size()).collect();
        // Unless waiting, need none: a node late now is suspected instead.
        let need = if wait { usize::MAX } else { 0 };
        let got = self.io.ctx.slab.alloc_each(&self.io.mem, &nodes, &sizes, need).await;
        let Known { mut reg, mut rc, entry } = k;
        let mut restored = false;
        for ((&i, &node), r) in lacking.iter().zip(&nodes).zip(got) {
            match r {
                Ok(a) => {
                    reg.replicas[i].base = a.offset;
                    rc.replicas[i] = Default::default();
                    restored = true;
                }
                Err(AllocError::Region(RegionError::Mem(e))) if !e.is_request_error() => {
                    self.io.ctx.nodes.note(node, true)
                }
                Err(_) => self.no_room |= bit(node),
            }
        }
        // Recorded before the new descriptor names them.
        if !restored || self.io.ctx.record_marks(&self.io.mem).await.is_err() {
            return None;
        }
        let Ok(desc) = self.index.alloc_record(&self.io.mem, DESCRIPTOR_BYTES).await else { return None };
        if self.index.records().write(&self.io.mem, desc, &descriptor::encode(&reg)).await.is_err() {
            return None;
        }
        let swung = Box::pin(self.index.update(&self.io.mem, key, Expect::Entry(entry), desc)).await;
        match swung {
            Ok(Change::Done { now: Some(now), .. }) => {
                self.io.ctx.paths.restored_replicas += 1;
                let k = Known { reg, rc, entry: now };
                self.cache.insert(key, now.location, Cached::new(k.clone()));
                Some(k)
            }
            // The key maps to something else now (or the index could not
            // tell): what this client has of it may be stale.
            _ => {
                self.cache.remove(key);
                None
            }
        }
    }

    /// After an operation on `key` failed with `e`: whether it reached no
    /// majority of a register created without some replicas, and those
    /// are now restored (waiting for their nodes), so it is worth trying
    /// again. An insert that left out a late node counted on the others;
    /// if one of those fails before the late node is back, the register
    /// needs its missing replica to have a majority again.
    async fn restore_after(&mut self, key: &[u8], e: &RegError) -> bool {
        matches!(e, RegError::NoQuorum(_)) && cold(|| self.restore_cached(key, true)).await
    }

    /// [`restore`](Self::restore) of the register this client caches for
    /// `key`, if any.
    async fn restore_cached(&mut self, key: &[u8], wait: bool) -> bool {
        let Some((_, tag, cached)) = self.cache.get_hashed(key) else { return false };
        let k = cached.known(tag);
        self.restore(key, k, wait).await.is_some()
    }
}

impl<P: Protocol, M: Memory, C: Clock> KvClient for Replicated<P, M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        P::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        for _ in 0..RETRIES {
            let Some((read, cached)) = self.with_key(key, Io::read).await? else {
                return Ok(Got::NotFound);
            };
            let (m, v) = match read {
                Ok(read) => read,
                Err(e) => {
                    if self.restore_after(key, &e).await {
                        continue;
                    }
                    return Err(reg_error(e));
                }
            };
            if m.is_deleted() {
                self.cache.remove(key);
                if cached {
                    continue;
                }
                return Ok(Got::Deleted);
            }
            // A mapped key's register always holds its first value: bottom
            // means an unreadable register, not an absent key.
            return if m.is_bottom() { Err(KvError::Corrupt) } else { Ok(Got::Found(v)) };
        }
        Err(KvError::Contended)
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        for _ in 0..RETRIES {
            let write = async |io: &mut Io<P, M, C>, k: &mut Known| io.write(k, value).await.map_err(|e| (e, k.entry));
            let Some((written, _)) = self.with_key(key, write).await? else {
                return Ok(Err(Missing::NotFound));
            };
            match written {
                Ok(()) => return Ok(Ok(Written)),
                Err((RegError::Deleted, entry)) => self.unmap(key, entry).await?,
                Err((e, _)) if self.restore_after(key, &e).await => {}
                Err((e, _)) => return Err(reg_error(e)),
            }
        }
        Err(KvError::Contended)
    }

    /// The marker goes only on a register known to be the key's current
    /// one at some point during the delete: a cached location is checked
    /// first (one READ of its index slot). A marker on a stale register
    /// could be the one that makes a concurrent insert move the key to
    /// fresh replicas, and a retry there would then delete twice.
    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        for _ in 0..RETRIES {
            let Some((mut k, cached)) = self.find(key).await? else {
                return Ok(Err(Missing::NotFound));
            };
            if cached && !Box::pin(self.index.still(&self.io.mem, key, &k.entry)).await? {
                self.cache.remove(key);
                continue;
            }
            let known = match Box::pin(k.reg.delete(&mut self.io.ctx, &self.io.mem, &mut k.rc)).await {
                Ok(known) => known,
                Err(e) if self.restore_after(key, &e).await => continue,
                Err(e) => return Err(reg_error(e)),
            };
            self.cache.remove(key);
            self.index.remove_background(&self.io.mem, key, &k.entry)?;
            // Known deleted before: a delete completed earlier.
            return Ok(if known { Err(Missing::NotFound) } else { Ok(Written) });
        }
        Err(KvError::Contended)
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        let mut wait_all = false;
        for _ in 0..RETRIES {
            // A cached key: an insert of an existing key is an update.
            if let Some(written) = self.on_cached(key, async |io, k| io.write(k, value).await).await {
                match written {
                    Ok(()) => return Ok(Written),
                    Err(RegError::Deleted) => {
                        self.cache.remove(key);
                    }
                    Err(e) if self.restore_after(key, &e).await => continue,
                    Err(e) => return Err(reg_error(e)),
                }
            }
            match Box::pin(self.insert_fresh(key, value, wait_all)).await {
                Ok(Fresh::Done(done)) => return Ok(done),
                Ok(Fresh::Again) => {}
                Ok(Fresh::WaitForAll) => {
                    self.io.ctx.paths.patient_inserts += 1;
                    wait_all = true;
                }
                // No room for fresh replicas on a full node: a key that is
                // there already needs none (an insert of it is an update).
                Err(full @ KvError::NodeFull { .. }) => {
                    return match Box::pin(self.update(key, value)).await? {
                        Ok(written) => Ok(written),
                        Err(Missing::NotFound) => Err(full),
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Err(KvError::Contended)
    }

    /// Recycles what a crashed predecessor left first
    /// ([`ClientCtx::settle_inherited`]), then gives the id back.
    async fn close(&mut self) -> Result<(), KvError> {
        self.io.ctx.settle_inherited(&self.io.mem).await;
        self.io.ctx.release(&self.io.mem, self.index.carried()).await.map_err(client_error)
    }

    /// Renews the lease if half of it passed, and recycles what can be of
    /// this client's log ([`crate::swarm::recycle`]): what a client runs
    /// between operations (`swarm bench` once per second at least).
    async fn keep(&mut self) -> Result<(), KvError> {
        self.io.ctx.keep(&self.io.mem).await.map_err(client_error)?;
        self.io.ctx.recycle(&self.io.mem).await;
        // The words recycling marked: their keys' next writes expect them.
        // (The mutant `rewrites-forgotten` leaves the cache as it was: the
        // next writes' CASes fail once.)
        let rewrites = self.io.ctx.recycle.take_rewrites();
        for w in rewrites.iter().filter(|_| !mutant!("rewrites-forgotten")) {
            if let Some(c) = self.cache.find_hashed(w.tag, |c| c.has(w.node, w.base)) {
                c.rewritten(w.node, w.base, w.old, w.new);
            }
        }
        Ok(())
    }

    /// A write that stays its key's value is resolved 3 R after it (probed
    /// at R, moved home at 2 R, confirmed at 3 R: [`crate::swarm::recycle`])
    /// and its segment given back R later; one more R for what a pass
    /// finds at once (a write that is not VERIFIED yet, a write-back).
    fn settle_ns(&self) -> u64 {
        if cfg!(feature = "alloc") { 5 * self.io.ctx.delay() } else { 0 }
    }

    fn paths(&self) -> crate::swarm::client::Paths {
        let mut p = self.io.ctx.paths;
        crate::kv::seat::index_paths(&self.index, &mut p);
        p
    }
}

/// Whether `r` is a replica that an insert left out (see
/// `Replicated::new_register`) and that `Replicated::restore` may give the
/// key now: its node is not one the client suspects (unless `wait`), nor
/// one where it found no room (`no_room`, a mask of [`bit`]s).
fn restorable(r: &Replica, view: &NodeView, no_room: u32, wait: bool) -> bool {
    r.base == NO_REPLICA && (wait || !view.suspects(r.node)) && no_room & bit(r.node) == 0
}

/// Bit `n` of a mask of nodes `n < 32` (none for the others).
fn bit(node: NodeId) -> u32 {
    if node.0 < 32 { 1 << node.0 } else { 0 }
}

/// How an insert of a key in fresh replicas ended.
enum Fresh {
    Done(Written),
    /// Lost a race with another client's insert or delete: try again.
    Again,
    /// The first write reached no majority, and a replica was left out for
    /// being late: try again, waiting for every replica's allocation.
    WaitForAll,
}

/// The base of a replica that could not be allocated: beyond any node's
/// region, so every operation on it fails its bounds check, even if the
/// node comes back, until the key is given a new replica there
/// (`Replicated::restore`).
const NO_REPLICA: u64 = 1 << 62;

/// What a client's register operations need: its memory and its SWARM
/// state; `P` is their protocol.
struct Io<P, M, C> {
    mem: M,
    ctx: ClientCtx<C>,
    protocol: core::marker::PhantomData<P>,
}

impl<P: Protocol, M: Memory, C: Clock> Io<P, M, C> {
    async fn read(&mut self, k: &mut Known) -> Result<(Meta, Value<M::Buf>), RegError> {
        P::read(&mut self.ctx, &self.mem, &k.reg, &mut k.rc).await
    }

    async fn write(&mut self, k: &mut Known, value: &[u8]) -> Result<(), RegError> {
        P::write(&mut self.ctx, &self.mem, &k.reg, &mut k.rc, value).await
    }
}

impl<P: Protocol, M: Memory, C: Clock> Handle for Replicated<P, M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.io.mem
    }

    fn id(&self) -> u8 {
        self.io.ctx.id
    }
}

/// The first write of a register nobody else can see yet: a VERIFIED tuple
/// at a guessed time, with no read (DM-ABD knows the timestamp is fresh,
/// Safe-Guess needs no lock), one roundtrip.
async fn first_write<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    rc: &mut RegCache,
    value: &[u8],
) -> Result<(), RegError> {
    let (time, place) = ctx.next_write(mem, Meta::BOTTOM).await?;
    let meta = Meta::new(time, place.slot, ctx.id).verify();
    let copy = reg.own_entry(ctx, mem, meta, place, value);
    reg.write(ctx, mem, rc, meta, &copy, value).await.map(|_| ())
}
