//! A Clover client (pDPM §5): reads and writes go straight to the data
//! nodes with one-sided operations; only creates, cold lookups and
//! allocation batches go to the metadata server.
//!
//! ```text
//! get(k):     READ the cursor's buffer                                     # 1 RTT
//!             its header a link: hop to the next version, READ it again
//! update(k):  WRITE the new version to free buffers on the key's R nodes   # 1
//!             (with an ALLOC of more free buffers beside it, when low,
//!             its answer collected beside a later WRITE)
//!             CAS(cursor's header, tail -> link to the new version)        # 2
//!             the CAS found a link: hop there, CAS again (no new WRITE)
//! delete(k):  CAS(cursor's header, tail -> deleted)                        # 1
//! insert(k):  new key: RPC CREATE, the MS writes the first version        # 2
//!             else as an update, from tail or deleted
//! ```
//!
//! A *cursor* is a buffer of the key's chain this client knows, with the
//! GC version it had then (the key's location in its `LocationCache`; the
//! MS's head on a miss). The chain only grows at its tail and is freed
//! from its head, so a cursor is either old (hops lead to the tail) or
//! stale: its buffer was recycled, which a read sees as another GC
//! version (or another key's bytes) and a CAS as another tail word
//! ([`super::header`]); both drop it and start again from the MS's head.
//! A cursor that has not been found right for
//! [`super::CURSOR_LIFETIME_NS`] is used only if the key's cell, read
//! beside, names it, and a READ that took longer than the read time-out
//! is discarded ([`super`]: the GC argument, and "Old cursors"). Reads and
//! CASes go to the key's primary (its first node, where the chain
//! lives); while it is down they fail naming it. The other copies of a
//! version are written for durability, never read.
//!
//! A write takes a free *group* (the version's R buffers) of the size
//! class its value needs from its pool of that class (one per class it
//! has written); the writer whose CAS links version N+1 from N *retires*
//! N, sent to the MS with its next ALLOC (beside a later WRITE: no
//! roundtrip of its own). A READ reads as many bytes as its cursor's size
//! class holds.

use alloc::vec::Vec;

use super::buffer;
use super::header::{self, Cursor, Next};
use super::wire::{self, Alloc, Answer, Chain, Group, MAX_GIVEN, MAX_RETIRES, MAX_WANTS, Retire, Want};
use super::{Clover, MS};
use crate::index::cache::LocationCache;
use crate::kv::place::{key_hash, node_of};
use crate::kv::seat::{give_back, keep_lease};
use crate::kv::{Got, Handle, KvClient, KvError, KvSystem, Limits, Missing, StoreConfig, Who, Written};
use crate::substrate::clock::Clock;
use crate::substrate::join::join2;
use crate::substrate::lease::Held;
use crate::substrate::memory::read_word;
use crate::substrate::msg::MsgError;
use crate::substrate::msg::rpc::{Channel, Reply, Sent, Status};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority, to_all};
use crate::substrate::space::slab::class_size;
use crate::substrate::value::Value;
use crate::swarm::client::Paths;
use crate::systems::pdpm_central::client::{call_error, call_timeout_ns, open_channel};
use crate::{MemError, MemErrorKind, Memory, NodeId, RemoteAddr};

/// Free groups a client keeps per data node, by default (the store's
/// `pool` option).
pub const BATCH: usize = 16;
/// Writes without a background refill after one failed (the MS down: each
/// try waits for the call's time-out).
const QUIET_AFTER_FAILURE: u32 = 8;
/// Retires waiting that make the next write fetch beside its WRITE even
/// if its pool is not low (so that the MS frees versions as they come).
pub const RETIRE_SOON: usize = 8;
/// Times an operation starts again from the MS's head (its cursor met a
/// recycled buffer, or grew too old) before it gives up.
const MAX_RESTARTS: usize = 16;

/// What a change does at the key's tail.
#[derive(Clone, Copy)]
enum Change<'a> {
    /// A new version; `revive`: also after a deletion (an insert).
    Put { value: &'a [u8], revive: bool },
    /// A deletion.
    Delete,
}

/// What a write does with the metadata server beside its WRITE.
enum Side {
    /// Sends an ALLOC with this body.
    Send(Vec<u8>),
    /// Looks for the answer to the ALLOC in flight.
    Look(Sent),
    Nothing,
}

/// How it went.
enum Sided<B> {
    Sent(Result<Sent, MsgError>),
    Answer(Result<Option<Reply<B>>, MsgError>),
    Nothing,
}

/// What a client knows of a key beside its cursor.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// The cursor was a deletion's tail.
    deleted: bool,
    /// When the cursor was last known right (the client's clock, ticks):
    /// it is dropped [`super::CURSOR_LIFETIME_NS`] later.
    since: u64,
    /// The key's cell on its primary, where the MS keeps the chain's head
    /// (the shortcut, [`super::ms`]): where the client starts again when
    /// its cursor is dropped. Fixed for the key's life.
    cell: RemoteAddr,
}

/// Free groups of one size class, per primary node.
struct Pool {
    class: u8,
    nodes: Vec<Vec<Group>>,
    /// Per node: the last batch had no group there (the MS could not
    /// allocate there): writes go on without it rather than ask again.
    dry: Vec<bool>,
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
    /// Bytes of the largest buffer: no READ reads more.
    max_read: usize,
    /// The size class a new client fetches groups of first: the largest
    /// version's (the store's usual one when values have one size).
    first_class: u8,
    /// Groups per node it keeps (the `pool` option), and the level below
    /// which a write fetches more beside its WRITE.
    batch: usize,
    low: usize,
    /// The read time-out and a cursor's lifetime, in clock ticks.
    read_timeout: u64,
    lifetime: u64,
    /// Key -> cursor ([`Cursor::location`]) and what else it knows.
    cache: LocationCache<Seen>,
    /// Free groups per size class it wrote.
    pools: Vec<Pool>,
    /// The size classes the last ALLOC asked for.
    asked: Vec<u8>,
    /// Versions this client superseded, for its next ALLOC.
    retired: Vec<Retire>,
    /// The ALLOC sent beside a write whose answer is not collected yet
    /// (looked for beside the next writes, waited for only when a pool
    /// runs dry or before another call).
    inflight: Option<Sent>,
    quiet: u32,
    paths: Paths,
}

/// Where a change or a get starts: a cursor, and what else is known.
type Start = (Cursor, Seen);

impl<M: Memory, C: Clock> CloverClient<M, C> {
    /// Connects a client to the metadata server (waiting for it to start),
    /// and fetches its first batch of free buffers.
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let (id, lease, channel) = open_channel(&mem, cfg, who, &clock, MS).await?;
        let nodes = mem.node_count();
        let batch = super::pool(cfg);
        let first_class = super::largest_class(cfg)?;
        let mut c = CloverClient {
            call_timeout_ns: call_timeout_ns(&mem, super::geometry(cfg).channels),
            read_timeout: clock.ticks(super::read_timeout_ns(&mem)),
            lifetime: clock.ticks(super::cursor_lifetime_ns(cfg)),
            mem,
            id,
            lease,
            clock,
            channel,
            limits: cfg.limits(),
            replicas: cfg.replicas.clamp(1, nodes.min(MAX_REPLICAS)),
            max_read: class_size(first_class as usize) as usize,
            first_class,
            batch,
            low: batch * 3 / 4,
            cache: LocationCache::new(cfg.cache()),
            pools: Vec::new(),
            asked: Vec::new(),
            retired: Vec::new(),
            inflight: None,
            quiet: 0,
            paths: Paths::default(),
        };
        // Without it the first writes fetch their buffers first.
        let _ = c.refill(first_class).await;
        Ok(c)
    }

    /// Free groups it holds whose primary is `node` (of any size class).
    pub fn free_buffers(&self, node: NodeId) -> usize {
        self.pools.iter().map(|p| p.nodes.get(node.index()).map_or(0, |g| g.len())).sum()
    }

    /// The size classes it holds free groups of, or held.
    pub fn classes(&self) -> Vec<u8> {
        self.pools.iter().map(|p| p.class).collect()
    }

    /// Its pool of size class `class`, made empty if it has none.
    fn pool(&mut self, class: u8) -> &mut Pool {
        let i = match self.pools.iter().position(|p| p.class == class) {
            Some(i) => i,
            None => {
                let nodes = self.mem.node_count();
                let dry = alloc::vec![false; nodes];
                self.pools.push(Pool { class, nodes: (0..nodes).map(|_| Vec::new()).collect(), dry });
                self.pools.len() - 1
            }
        };
        &mut self.pools[i]
    }

    /// The key's cursor, if cached: the version it last found or wrote, and
    /// its GC version.
    pub fn cursor(&self, key: &[u8]) -> Option<Cursor> {
        Cursor::of_location(self.cache.peek(key)?.0, self.mem.node_count())
    }

    /// The key's cell, if cached: where the MS keeps its chain's head.
    pub fn cell(&self, key: &[u8]) -> Option<RemoteAddr> {
        Some(self.cache.peek(key)?.1.cell)
    }

    /// Versions it retired and has not sent to the MS yet.
    pub fn retires_waiting(&self) -> usize {
        self.retired.len()
    }

    /// Its claim of its id (0 without a lease), which its ALLOCs carry: the
    /// MS takes back the groups it lent to the id's earlier holder.
    fn holder(&self) -> u64 {
        self.lease.as_ref().map_or(0, |h| h.claim())
    }

    async fn keep_lease(&mut self) -> Result<(), KvError> {
        keep_lease(&mut self.lease, &self.mem, self.clock.now()).await
    }

    /// Calls the metadata server: its answer (its roundtrips to data
    /// nodes noted as this client's). The channel is the id's: the lease is
    /// kept first, so that a client whose id went to another while it was
    /// stopped is told so, and does not call on a channel that is no
    /// longer its own.
    async fn call(&mut self, method: u16, body: &[u8]) -> Result<Answer, KvError> {
        // (Mutant `server-call-unleased`: a stopped client, continued,
        // calls on its lost id's channel, and waits for an answer that
        // never comes.)
        if !mutant!("server-call-unleased") {
            self.keep_lease().await?;
        }
        self.settle().await;
        let (mem, clock) = (&self.mem, &self.clock);
        call(&mut self.channel, mem, clock, self.call_timeout_ns, method, body).await
    }

    /// An ALLOC's body: the groups wanted, of size class `class` and of
    /// every other class whose pool is low, and the retires waiting
    /// (taken: if the call fails they are lost, and the MS finds those
    /// versions by reading the chain).
    fn alloc_body(&mut self, class: u8) -> Vec<u8> {
        let mut classes = alloc::vec![class];
        let others = self.pools.iter().map(|p| p.class).filter(|&c| c != class && self.low(c));
        classes.extend(others.take(MAX_WANTS - 1).collect::<Vec<_>>());
        let want = classes.iter().map(|&c| Want { class: c, nodes: self.wanted(c) }).collect();
        self.asked = classes;
        let n = self.retired.len().min(MAX_RETIRES);
        let retires = self.retired.drain(..n).collect();
        Alloc { want, retires, given: Vec::new(), holder: self.holder() }.encode()
    }

    /// Waits for the answer to the ALLOC in flight, if any, and takes its
    /// groups.
    async fn settle(&mut self) {
        if let Some(sent) = self.inflight.take() {
            let (mem, clock) = (&self.mem, &self.clock);
            let got = self.channel.finish(mem, clock, self.call_timeout_ns, sent, None).await;
            let got = got.map_err(|e| call_error(e, MS)).and_then(|r| answer(r, mem));
            self.took(got);
        }
    }

    /// Takes a background ALLOC's answer; a failure quiets the next
    /// writes' background calls.
    fn took(&mut self, got: Result<Answer, KvError>) {
        match self.take(got) {
            Ok(()) => self.paths.refills += 1,
            Err(_) => self.quiet = QUIET_AFTER_FAILURE,
        }
    }

    /// Fetches groups of size class `class` for the nodes that are low (a
    /// batch's worth each), in the foreground.
    async fn refill(&mut self, class: u8) -> Result<(), KvError> {
        self.settle().await;
        let body = self.alloc_body(class);
        let (mem, clock) = (&self.mem, &self.clock);
        let got = call(&mut self.channel, mem, clock, self.call_timeout_ns, wire::ALLOC, &body).await;
        self.take(got)
    }

    /// Groups of size class `class` wanted per node (a request's body).
    fn wanted(&mut self, class: u8) -> Vec<u8> {
        let batch = self.batch;
        self.pool(class).nodes.iter().map(|p| batch.saturating_sub(p.len()) as u8).collect()
    }

    /// Whether a node the MS allocates on has few free groups of size
    /// class `class` left.
    fn low(&self, class: u8) -> bool {
        match self.pools.iter().find(|p| p.class == class) {
            Some(p) => p.nodes.iter().zip(&p.dry).any(|(p, &dry)| p.len() < self.low && !dry),
            None => true,
        }
    }

    /// Adds a batch to the pools of its groups' size classes. A pool it
    /// asked for is dry on a node that got no group at all (the MS could
    /// not allocate there; one that got groups of another class only ran
    /// out of room in the answer).
    fn take(&mut self, got: Result<Answer, KvError>) -> Result<(), KvError> {
        match got? {
            Answer::Buffers { groups, recycled } => {
                self.paths.recycled += recycled as u64;
                let (batch, asked) = (self.batch, core::mem::take(&mut self.asked));
                for (n, gs) in groups.into_iter().enumerate() {
                    for &class in &asked {
                        let pool = self.pool(class);
                        if let (Some(p), Some(dry)) = (pool.nodes.get(n), pool.dry.get_mut(n)) {
                            *dry = gs.is_empty() && p.len() < batch;
                        }
                    }
                    for g in gs {
                        if let Some(p) = self.pool(g.primary.class).nodes.get_mut(n) {
                            p.push(g);
                        }
                    }
                }
                Ok(())
            }
            _ => Err(KvError::Corrupt),
        }
    }

    /// Whether a cursor known right since `since` is too old to use on its
    /// own word at `at` (now, or when the READ that uses it was posted).
    fn expired_at(&self, since: u64, at: u64) -> bool {
        at.saturating_sub(since) > self.lifetime
    }

    /// Whether a cursor known right since `since` is too old to use now.
    fn expired(&self, since: u64) -> bool {
        self.expired_at(since, self.clock.now())
    }

    /// The key's cursor if cached (too old or not: one too old starts
    /// again from the key's cell, [`Self::restart`]).
    fn cached(&mut self, key: &[u8]) -> Option<Start> {
        let nodes = self.mem.node_count();
        let (loc, &mut seen) = self.cache.get(key)?;
        match Cursor::of_location(loc, nodes) {
            Some(c) => Some((c, seen)),
            None => {
                self.cache.remove(key);
                None
            }
        }
    }

    /// Where the MS's answer `chain` starts `key`, known right since
    /// `since`; an error if it is not on the key's primary.
    fn start(&self, key: &[u8], chain: Chain, since: u64) -> Result<Start, KvError> {
        match chain.head.at.node == node_of(key, 0, self.mem.node_count()) {
            true => Ok((chain.head, Seen { deleted: false, since, cell: chain.cell })),
            false => Err(KvError::Corrupt),
        }
    }

    /// The chain's head from the MS (one roundtrip); `None` if the key has
    /// no chain.
    async fn lookup(&mut self, key: &[u8]) -> Result<Option<Start>, KvError> {
        let since = self.clock.now();
        match self.call(wire::LOOKUP, key).await? {
            Answer::Absent => Ok(None),
            Answer::Head(chain) => self.start(key, chain, since).map(Some),
            _ => Err(KvError::Corrupt),
        }
    }

    /// The key's cursor: cached (no roundtrip), or the chain's head from
    /// the MS (one); `None` if the key has no chain.
    async fn find(&mut self, key: &[u8]) -> Result<Option<Start>, KvError> {
        match self.cached(key) {
            Some(c) => Ok(Some(c)),
            None => self.lookup(key).await,
        }
    }

    /// Drops the key's cursor and starts again from the key's head (its
    /// cursor met a buffer recycled since, or another key's bytes, or grew
    /// too old): the head in the key's `cell` (`read`: its word, read
    /// beside the operation's READ, and when that was sent; else it is
    /// read now, one-sided), or the MS's if the cell's word is not right.
    /// The `restarts`-th time, at most [`MAX_RESTARTS`].
    async fn restart(
        &mut self,
        key: &[u8],
        cell: RemoteAddr,
        read: Option<(u64, u64)>,
        restarts: &mut usize,
    ) -> Result<Option<Start>, KvError> {
        self.cache.remove(key);
        *restarts += 1;
        if *restarts > MAX_RESTARTS {
            return Err(KvError::Corrupt);
        }
        let (word, sent) = match read {
            Some(r) => r,
            None => {
                let sent = self.clock.now();
                (read_word(&self.mem, cell).await.map_err(mem_error)?, sent)
            }
        };
        let nodes = self.mem.node_count();
        match header::decode_cell(word, key_hash(key), nodes).filter(|h| h.at.node == cell.node) {
            // Known right when the cell was read: the MS writes a head
            // there before it frees anything behind it (`super::ms`).
            Some(head) => {
                self.paths.shortcuts += 1;
                Ok(Some((head, Seen { deleted: false, since: sent, cell })))
            }
            None => self.lookup(key).await,
        }
    }

    fn remember(&mut self, key: &[u8], at: Cursor, seen: Seen) {
        self.cache.insert(key, at.location(), seen);
    }

    /// A free group whose primary is `node`, of size class `class` or, if
    /// it has none, of the smallest larger class it has: a version fits
    /// any buffer as large as its class (its link names the version's), so
    /// a write of a class this client has no group of yet costs no
    /// roundtrip (its pool is filled beside the WRITE).
    fn pop_group(&mut self, node: NodeId, class: u8) -> Option<Group> {
        let fits = self.pools.iter_mut().filter(|p| p.class >= class);
        let pool = fits.filter(|p| p.nodes.get(node.index()).is_some_and(|g| !g.is_empty())).min_by_key(|p| p.class);
        let g = pool?.nodes[node.index()].pop()?;
        self.paths.larger_groups += (g.primary.class > class) as u64;
        Some(g)
    }

    /// A free group for a version of size class `class` whose primary is
    /// the key's ([`Self::pop_group`]; fetched in the foreground if there
    /// is none).
    async fn group(&mut self, key: &[u8], class: u8) -> Result<Group, KvError> {
        let node = node_of(key, 0, self.mem.node_count());
        if let Some(g) = self.pop_group(node, class) {
            return Ok(g);
        }
        self.settle().await;
        if let Some(g) = self.pop_group(node, class) {
            return Ok(g);
        }
        self.refill(class).await?;
        // None: the MS could not allocate there: it failed.
        self.pop_group(node, class).ok_or(KvError::Down(MemError::new(node, MemErrorKind::Unreachable)))
    }

    /// Puts an unlinked version's group back in its pool: its primary's
    /// WRITE is done. (Its backups' WRITEs may still land, after the
    /// write went on without them, over the group's next version there:
    /// backups are never read.)
    fn give_back(&mut self, group: Option<Group>) {
        if let Some(g) = group
            && let Some(p) = self.pool(g.primary.class).nodes.get_mut(g.primary.at.node.index())
        {
            p.push(g);
        }
    }

    /// Writes a new version to `group`: waits for the primary and a
    /// majority of the R copies in all; fetches a batch of groups beside
    /// it (with the retires waiting) if the pool of `class` (the
    /// version's) is low or retires pile up,
    /// and reads the word of `cell` beside it if asked (answered with when
    /// it was sent, for [`Self::restart`]).
    async fn write_copies(
        &mut self,
        group: &Group,
        class: u8,
        bytes: &[u8],
        cell: Option<RemoteAddr>,
    ) -> Result<Option<(u64, u64)>, KvError> {
        // At most one ALLOC in flight: its answer looked for beside this
        // WRITE, or a new one sent beside it.
        let side = match self.inflight {
            Some(sent) => Side::Look(sent),
            None if (self.low(class) || self.retired.len() >= RETIRE_SOON) && self.quiet == 0 => {
                Side::Send(self.alloc_body(class))
            }
            None => Side::Nothing,
        };
        self.quiet = self.quiet.saturating_sub(1);
        let need = majority(self.replicas) - 1;
        let (mem, clock, timeout) = (&self.mem, &self.clock, self.call_timeout_ns);
        let backups = &group.backups;
        let write =
            join2(mem.write(group.primary.at, bytes), to_all(backups.len(), need, |i| mem.write(backups[i], bytes)));
        let sent = clock.now();
        let head = async move {
            match cell {
                Some(c) => read_word(mem, c).await.ok().map(|w| (w, sent)),
                None => None,
            }
        };
        let channel = &mut self.channel;
        let alloc = async move {
            match side {
                Side::Send(body) => Sided::Sent(channel.start(mem, clock, wire::ALLOC, &body).await),
                // Past the call's time-out: waiting says why at once.
                Side::Look(s) if clock.now().wrapping_sub(s.at()) > clock.ticks(timeout) => {
                    Sided::Answer(channel.finish(mem, clock, timeout, s, None).await.map(Some))
                }
                Side::Look(s) => Sided::Answer(channel.poll(mem, &s).await),
                Side::Nothing => Sided::Nothing,
            }
        };
        let (((primary, (reached, _)), head), sided) = join2(join2(write, head), alloc).await;
        match sided {
            Sided::Sent(Ok(s)) => self.inflight = Some(s),
            // Its retires are lost: the MS finds those versions by
            // reading the chain.
            Sided::Sent(Err(_)) => self.quiet = QUIET_AFTER_FAILURE,
            Sided::Answer(Ok(None)) | Sided::Nothing => {}
            Sided::Answer(Ok(Some(reply))) => {
                self.inflight = None;
                let got = answer(reply, &self.mem);
                self.took(got);
            }
            Sided::Answer(Err(e)) => {
                self.inflight = None;
                self.took(Err(call_error(e, MS)));
            }
        }
        primary.map_err(mem_error)?;
        if !reached {
            return Err(KvError::Unavailable);
        }
        Ok(head)
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
                let since = self.clock.now();
                match self.call(wire::CREATE, &wire::create_body(key, value)).await? {
                    Answer::Created(chain) => {
                        let (at, seen) = self.start(key, chain, since)?;
                        self.remember(key, at, seen);
                        return Ok(Ok(Written));
                    }
                    Answer::Head(chain) => Some(self.start(key, chain, since)?),
                    _ => return Err(KvError::Corrupt),
                }
            }
            (None, _) => self.lookup(key).await?,
        };
        let Some((mut at, mut seen)) = found else { return Ok(Err(Missing::NotFound)) };
        // The new version, written before any CAS can link it; beside it,
        // the key's head in its cell if the cursor is too old to be used
        // (where the CAS goes instead: no roundtrip of its own).
        let (mut head, mut needed) = (None, self.first_class);
        let group = match change {
            Change::Put { value, .. } => {
                // The key and value fit (the store's limits): so does their class.
                let class = buffer::class(key.len(), value.len()).unwrap_or(self.first_class);
                needed = class;
                let g = self.group(key, class).await?;
                let cell = self.expired(seen.since).then_some(seen.cell);
                match self.write_copies(&g, class, &buffer::encode(key, value, tag, g.primary.gc), cell).await {
                    Ok(h) => head = h,
                    Err(e) => {
                        // Not linked: its WRITEs are done or failed.
                        self.give_back(Some(g));
                        return Err(e);
                    }
                }
                Some(g)
            }
            Change::Delete => None,
        };
        // The new version, as links and cursors name it: of the class it
        // needs, which a larger group's buffers hold (a READ of it reads no
        // more than it holds).
        let version = group.as_ref().map(|g| Cursor { class: needed, ..g.primary });
        let revive = matches!(change, Change::Put { revive: true, .. });
        let mut on_deleted = seen.deleted && revive;
        let mut restarts = 0;
        loop {
            if self.expired(seen.since) {
                self.paths.gc_timeouts += 1;
                match self.restart(key, seen.cell, head.take(), &mut restarts).await {
                    Ok(Some(s)) => ((at, seen), on_deleted) = (s, false),
                    r => {
                        self.give_back(group);
                        return r.and(Err(KvError::Corrupt));
                    }
                }
                continue;
            }
            let expect = if on_deleted { Next::Deleted(at.gc) } else { Next::Tail(at.gc) }.word(tag);
            let new = match version {
                Some(v) => Next::Link(v).word(tag),
                None => Next::Deleted(at.gc).word(tag),
            };
            let sent = self.clock.now();
            // An error leaves the group out of the pool: the CAS may have
            // linked it.
            let prev = self.mem.cas(at.at, expect, new).await.map_err(mem_error)?;
            if prev == expect {
                let cell = seen.cell;
                match version {
                    Some(v) => {
                        self.retired.push(Retire { key: key.to_vec(), old: at, new: v });
                        self.remember(key, v, Seen { deleted: false, since: sent, cell });
                    }
                    None => self.remember(key, at, Seen { deleted: true, since: sent, cell }),
                }
                return Ok(Ok(Written));
            }
            self.paths.cas_retries += 1;
            match header::decode(prev, tag, nodes) {
                Some(Next::Link(next)) => {
                    self.paths.write_hops += 1;
                    // Known right when the CAS read the link.
                    (at, seen.since) = (next, sent);
                    on_deleted = false;
                }
                Some(Next::Tail(gc)) if gc == at.gc => on_deleted = false,
                Some(Next::Deleted(gc)) if gc == at.gc => match change {
                    Change::Put { revive: true, .. } => on_deleted = true,
                    _ => {
                        self.remember(key, at, Seen { deleted: true, since: sent, ..seen });
                        self.give_back(group);
                        return Ok(Err(Missing::NotFound));
                    }
                },
                // Another GC version (the buffer was recycled) or another
                // key's word: start again from the head.
                _ => {
                    self.paths.stale_gc += 1;
                    match self.restart(key, seen.cell, None, &mut restarts).await {
                        Ok(Some(s)) => ((at, seen), on_deleted) = (s, false),
                        r => {
                            self.give_back(group);
                            return r.and(Err(KvError::Corrupt));
                        }
                    }
                }
            }
        }
    }

    async fn get_value(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        let tag = key_hash(key);
        let nodes = self.mem.node_count();
        let Some((mut at, mut seen)) = self.find(key).await? else { return Ok(Got::NotFound) };
        let (mut restarts, mut lates) = (0, 0);
        loop {
            let sent = self.clock.now();
            // The cursor's buffer, and beside it the key's cell: where the
            // get starts again, with no roundtrip of its own, if the
            // cursor's buffer was recycled (the paper's shortcut, raced
            // against the chain walk), and what vouches for a cursor too
            // old to be used on its own.
            let len = at.bytes().min(self.max_read);
            let (b, w) = join2(self.mem.read(at.at, len), read_word(&self.mem, seen.cell)).await;
            let b = b.map_err(mem_error)?;
            let cell = w.ok().map(|w| (w, sent));
            // The read time-out (pDPM §5.2): a READ that took longer may
            // have met a buffer freed and handed out again meanwhile.
            let late = self.clock.now().saturating_sub(sent) > self.read_timeout;
            // A cursor too old (its buffer may have come round to the same
            // GC version since, [`super::epoch_ns`]) is used only if the
            // cell names it: then it is the key's head, linked and not
            // freed, when the cell was read ([`super`], "Old cursors").
            // Mutant `clover-old-cursor`: an old cursor is used unvouched.
            let vouched = match self.expired_at(seen.since, sent) {
                false => true,
                true => {
                    let named = cell.and_then(|(w, _)| header::decode_cell(w, tag, nodes)) == Some(at);
                    if named && !late {
                        self.paths.vouched_cursors += 1;
                        seen.since = sent;
                    }
                    named || mutant!("clover-old-cursor")
                }
            };
            let read = match (vouched, late) {
                (true, false) => match buffer::decode_incarnation(&b, key, tag, at.gc, nodes, self.limits.max_value) {
                    Some(v) => Some((b, v)),
                    // A recycled buffer (another GC version, or another
                    // key's bytes: its sum fails), a READ torn between two
                    // of its incarnations, or garbage.
                    _ => {
                        self.paths.stale_gc += 1;
                        None
                    }
                },
                _ => {
                    self.paths.gc_timeouts += 1;
                    None
                }
            };
            // A late READ of a cursor that may be used says nothing of the
            // cursor: it is read again, rather than the walk starting again
            // from the head (on a long chain, a slow node then made gets
            // fail after MAX_RESTARTS late hops). A node whose every READ
            // is late is as good as timed out.
            if !late {
                lates = 0;
            } else if vouched && !mutant!("clover-late-restarts") {
                lates += 1;
                if lates > MAX_RESTARTS {
                    return Err(KvError::Down(MemError::new(at.at.node, MemErrorKind::TimedOut)));
                }
                continue;
            }
            // Any of these: start again from the head, in the cell's word
            // read beside (a head then, whatever the READ's time), or read
            // now.
            let Some((got, v)) = read else {
                match self.restart(key, seen.cell, cell, &mut restarts).await? {
                    Some(s) => (at, seen) = s,
                    None => return Ok(Got::NotFound),
                }
                continue;
            };
            match v.next {
                Next::Tail(_) => {
                    self.remember(key, at, Seen { deleted: false, since: sent, ..seen });
                    return Ok(Got::Found(Value::in_buf(got, v.value)));
                }
                Next::Deleted(_) => {
                    self.remember(key, at, Seen { deleted: true, since: sent, ..seen });
                    return Ok(Got::Deleted);
                }
                // Mutant `clover-stale-cursor`: the cursor's version is
                // returned without checking that it is the tail.
                Next::Link(_) if mutant!("clover-stale-cursor") => {
                    return Ok(Got::Found(Value::in_buf(got, v.value)));
                }
                Next::Link(next) => {
                    self.paths.read_hops += 1;
                    // Known right when the READ found the link.
                    (at, seen.since) = (next, sent);
                }
            }
        }
    }

    /// Sends the retires waiting and gives the pool back (a client that
    /// closes), in as many ALLOCs as they take.
    async fn hand_in(&mut self) -> Result<(), KvError> {
        // The groups of an ALLOC in flight go back too.
        self.settle().await;
        let pools = self.pools.iter_mut().flat_map(|p| p.nodes.iter_mut());
        let mut given: Vec<Cursor> = pools.flat_map(|p| p.drain(..)).map(|g| g.primary).collect();
        while !self.retired.is_empty() || !given.is_empty() {
            let n = self.retired.len().min(MAX_RETIRES);
            let retires = self.retired.drain(..n).collect();
            let g = given.len().min(MAX_GIVEN);
            let body =
                Alloc { want: Vec::new(), retires, given: given.drain(..g).collect(), holder: self.holder() }.encode();
            self.call(wire::ALLOC, &body).await?;
        }
        Ok(())
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
    answer(reply, mem)
}

/// The MS's answer in `reply` (its roundtrips to data nodes noted as the
/// caller's).
fn answer<M: Memory>(reply: Reply<M::Buf>, mem: &M) -> Result<Answer, KvError> {
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

    /// Sends its retires, gives its free groups back to the MS (if it
    /// answers: else they are lost, a bounded loss), and the leased id.
    async fn close(&mut self) -> Result<(), KvError> {
        let _ = self.hand_in().await;
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
