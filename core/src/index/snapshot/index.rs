//! `SnapshotIndex`: the RACE index of [`crate::index`], replicated on r
//! memory nodes with SNAPSHOT (`papers/fusee.txt` §4.2-4.3;
//! `notes/fusee-design.md` design step 6).
//!
//! Every replica has the same bucket groups; a slot is one replicated word
//! (`super::slot`) whose primary is replica `g mod r` for its group `g`
//! ([`Header::order`]), so that no node serves more reads than another. A
//! key's slots, its fixed candidate order and the rules that keep one live
//! slot per key are the single-node index's (`crate::index::probe`):
//! they carry over because a slot is a linearizable compare-and-set on its
//! committed (primary) value, a committed word names one key for ever
//! (rule 1: removals propose a tombstone pointing at a fresh *tomb block*
//! that names the key), and every proposed word is new (F1: each points at
//! a block of its own, never reused). What a lookup reads is the primary's:
//! the buckets, then the block of a matching word, which every commit puts
//! on the primary with its word (`super::block`).
//!
//! # Roundtrips (measured in `tests.rs`)
//!
//! | operation | roundtrips (Rule 1; Rule 2 +1, Rule 3 +2) |
//! |---|---|
//! | lookup, key present | 2 (both combined buckets; the key block) |
//! | lookup, key absent | 1 |
//! | insert of a new key | 3 (buckets; backups: block + CAS; primary: block + mark + CAS) |
//! | insert of a present key | 2 |
//! | update / remove by key | 4 (a lookup, then the two write phases) |
//! | update / remove with [`Expect::Entry`] | 2 |
//! | [`Index::still`] | 1 |
//! | [`Index::remove_background`] | 0 (nothing: see below) |
//!
//! A write starts its round from the word it read on the primary itself in
//! this operation (or from an [`Expect::Entry`]'s), so that a lost round is
//! a failed compare-and-set and never success (F6). The first block a
//! client writes also claims a chunk of the arena (one roundtrip).
//!
//! The view lease ([`super::view`]) costs no roundtrip of its own where it
//! can be helped: opening the index takes it beside the arena's cursors,
//! and an operation that finds it lapsed renews it in its first roundtrip
//! when that roundtrip is reads (lookups, inserts, changes by key,
//! [`Index::still`]: design F9, `SnapshotIndex::riding`). Only a change
//! from a known entry, whose first roundtrip is CASes, renews first (one
//! roundtrip more, once every `L - D`).
//!
//! # Failures
//!
//! A client whose operation meets a failed replica (an error or a
//! time-out) leads a view change that leaves it out
//! ([`super::master::settle`]), or waits for the one under way, and goes on
//! in the new view: a read runs again; a write whose round was frozen by the
//! change finds out where it stands on the new primary (its word: won; the
//! word it started from: it runs the same round again; another word: won
//! only if its word is marked committed on a replica). Every operation is
//! fenced by the lease on its view ([`super::view`]), so nothing it posts
//! under an old view lands after the master repaired the slots. The index
//! serves while a majority of its replicas is up; the campaigns crash any
//! one node, node 0 included, while clients run (and crash). A node that
//! comes back with its memory is brought back by the first client whose
//! lease renewal hears from it ([`super::master`]), so a store survives one
//! failure after another as long as they do not overlap.
//!
//! # Not done yet
//!
//! - Two clients that split the view words between their claims wait for
//!   each other's claim to run out (`Lm + D`) before one supersedes it.
//! - Bringing a replica back pauses the index for a fence, as leaving it
//!   out does; the joiner's records beside the index are not copied to it
//!   (a reader that tries the joiner first for an older record takes one
//!   more roundtrip).
//! - [`Index::remove_background`] does nothing (F8: one CAS on the primary
//!   alone would make it newer than its backups); the stores tolerate
//!   mappings left to deleted keys.
//! - Blocks are never freed, so every update or removal uses up arena
//!   space (`super::arena::ArenaError::Full` says how much): recycling is
//!   issue #20.

use core::cell::Cell;
use core::future::Future;

use super::arena::{Arena, ArenaError, Site};
use super::block::{self, KeyBlock, Part};
use super::header::{self, Header, Replica};
use super::master::{self, MasterPaths, now_ns};
use super::records::Records;
use super::slot::{self, Exp, Outcome, Slot, SlotError, SlotPaths, Target, TargetOps};
use super::view::{Timing, View, ViewError, ViewLease};
use crate::index::layout::{Block, COMBINED_BYTES, Geometry, KeyHash, SlotWord, block_len};
use crate::index::probe::{AfterLoss, Choice, View as ProbeView, after_lost_change};
use crate::index::race::zero;
use crate::index::{Change, Entry, Expect, Index, IndexConfig, IndexError, Insert, MAX_ATTEMPTS};
use crate::substrate::join::join2;
use crate::substrate::late::{Watch, late};
use crate::substrate::memory::read_word;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_timely, majority};
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::roots;
use crate::substrate::space::slab::Carry;
use crate::{MemError, Memory, NodeId, RemoteAddr};

/// The shape of a new replicated index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SnapshotConfig {
    /// Buckets, longest key, hash seed: as the single-node index's.
    pub index: IndexConfig,
    /// Bytes of the key-block arena on each replica: every insert, update
    /// and removal takes `block::alloc_len` of it for good.
    pub arena: u64,
    /// Bytes a client claims from the arena at a time.
    pub chunk: u64,
    /// The view lease and the landing bound of operations (see
    /// [`super::view`]).
    pub timing: Timing,
}

impl SnapshotConfig {
    /// Room for about `keys` keys, each inserted, updated or removed about
    /// `changes` times in the index's life.
    pub fn for_keys(keys: u64, max_key: usize, changes: u64) -> SnapshotConfig {
        let index = IndexConfig::for_keys(keys, max_key);
        let chunk = 64 << 10;
        let blocks = keys.saturating_mul(changes.max(1)).saturating_mul(block::alloc_len(max_key));
        let arena = blocks.saturating_add(chunk).next_multiple_of(chunk);
        // The time-out of the mapped backends (shm, cxl): one second.
        SnapshotConfig { index, arena, chunk, timing: Timing::for_timeout(1_000_000_000) }
    }
}

/// What a write proposes for a key's slot: a block of its own in either case.
#[derive(Clone, Copy)]
enum Proposal {
    /// The key maps to this location.
    Live(u64),
    /// The key is removed; its tomb block keeps the location it had.
    Tomb(u64),
}

/// How many view changes one operation goes through before it gives up.
const MAX_SETTLES: usize = 8;

/// One client's handle on a replicated index.
pub struct SnapshotIndex {
    header: Header,
    /// The buckets' logical geometry ([`Header::logical`]).
    geo: Geometry,
    arena: Arena,
    /// The lease on the view this client works in (a cell: the writes'
    /// fences renew it).
    lease: Cell<ViewLease>,
    /// This client's name as a master (its id: ids are below 256).
    nonce: u8,
    /// Replicas whose header this client found wrong (their memory was
    /// lost or reused): never brought back by it.
    refused: u8,
    /// When this client may next try to bring replicas back (after a try
    /// that failed), ns on its clock.
    next_join_ns: u64,
    paths: SlotPaths,
    master: MasterPaths,
    /// Renewals that rode an operation, and those whose reads were dropped.
    rides: Cell<(u64, u64)>,
}

/// A writer's key block, fenced by the lease on the view its slot was
/// built in: what the slot protocol carries for the replicated index.
struct Guarded<'a> {
    block: KeyBlock,
    lease: &'a Cell<ViewLease>,
    header: &'a Header,
    epoch: u32,
}

impl Target for Guarded<'_> {
    fn backup_ops<'a>(&'a self, backup: usize, out: &mut TargetOps<'a>) {
        self.block.backup_ops(backup, out)
    }

    fn commit_ops<'a>(&'a self, word: u64, vold: u64, out: &mut TargetOps<'a>) {
        self.block.commit_ops(word, vold, out)
    }

    async fn marked<M: Memory>(&self, mem: &M, word: u64) -> Result<Option<bool>, MemError> {
        self.block.marked(mem, word).await
    }

    async fn fetch<M: Memory>(&self, mem: &M, word: u64, holders: &[RemoteAddr]) -> Result<(), MemError> {
        self.block.fetch(mem, word, holders).await
    }

    async fn fence<M: Memory>(&self, mem: &M) -> Result<(), SlotError> {
        fence(mem, self.lease, self.header, self.epoch).await
    }
}

/// Posts `reads` under the lease on view `epoch`: at once if the lease
/// covers them (`None`), else together with the lease's renewal, whose
/// outcome comes with them (the lease is renewed either way). Nothing is
/// posted once the view changed ([`SlotError::Fenced`]).
async fn leased<M: Memory, T>(
    mem: &M,
    lease: &Cell<ViewLease>,
    header: &Header,
    epoch: u32,
    reads: impl Future<Output = T>,
) -> Result<(T, Option<Result<View, ViewError>>), SlotError> {
    let now = now_ns(mem);
    let mut l = lease.get();
    if l.view().epoch != epoch {
        return Err(SlotError::Fenced);
    }
    if l.covers(now) {
        return Ok((reads.await, None));
    }
    let (renewed, out) = join2(l.renew(mem, header, now), reads).await;
    lease.set(l);
    Ok((out, Some(renewed)))
}

/// Whether an operation posted now lands within the lease on view `epoch`,
/// renewing the lease if it would not; [`SlotError::Fenced`] once the view
/// changed (or cannot be leased).
async fn fence<M: Memory>(mem: &M, lease: &Cell<ViewLease>, header: &Header, epoch: u32) -> Result<(), SlotError> {
    match leased(mem, lease, header, epoch, async {}).await? {
        ((), None) => Ok(()),
        ((), Some(Ok(v))) if v.epoch == epoch => Ok(()),
        _ => Err(SlotError::Fenced),
    }
}

impl SnapshotIndex {
    /// Opens the index replicated on `nodes` (at least one of them must
    /// have it): three roundtrips (the root slots, a header, the arena's
    /// cursors); a majority of the replicas must answer. `nonce` tells this
    /// client from others (its id).
    pub async fn open<M: Memory>(mem: &M, nodes: &[NodeId], nonce: u32) -> Result<SnapshotIndex, IndexError> {
        if nodes.is_empty() || nodes.len() > MAX_REPLICAS {
            return Err(IndexError::BadConfig("a replicated index has 1 to 8 replicas"));
        }
        let futs = nodes.iter().map(|&n| Region::read_root(mem, n, roots::INDEX)).collect();
        let late_one = |i: usize| RegionError::Mem(late(nodes[i]));
        let (replies, _) = join_timely(futs, majority(nodes.len()), Watch::on(mem), late_one).await;
        let mut failure = None;
        for (i, r) in replies.results.iter().enumerate() {
            match r {
                Some(Ok(root)) if *root != 0 => match Self::read_header(mem, nodes[i], *root).await {
                    Ok(header) => return Self::open_with(mem, header, nonce).await,
                    Err(e) => failure = Some(e),
                },
                Some(Err(e)) => failure = failure.or(Some((*e).into())),
                _ => {}
            }
        }
        Err(failure.unwrap_or(IndexError::NoIndex { node: nodes[0] }))
    }

    async fn read_header<M: Memory>(mem: &M, node: NodeId, root: u64) -> Result<Header, IndexError> {
        if !root.is_multiple_of(8) {
            return Err(IndexError::Corrupt { node, what: "root slot points to a misaligned header" });
        }
        let buf = mem.read(RemoteAddr::new(node, root), header::BYTES as usize).await?;
        Header::decode(node, &buf)
    }

    /// Opens the arena and takes a lease on the view in the same roundtrip
    /// (a lease it cannot take now is taken by the first operation).
    async fn open_with<M: Memory>(mem: &M, header: Header, nonce: u32) -> Result<SnapshotIndex, IndexError> {
        let mut lease = ViewLease::new(header.timing);
        let now = now_ns(mem);
        let (arena, _) =
            join2(Arena::open(mem, &header.sites(), header.chunk, nonce), lease.renew(mem, &header, now)).await;
        let arena = arena?;
        let geo = header.logical();
        let lease = Cell::new(lease);
        let (paths, master) = (SlotPaths::default(), MasterPaths::default());
        let nonce = nonce as u8;
        let rides = Cell::new((0, 0));
        Ok(SnapshotIndex { header, geo, arena, lease, nonce, refused: 0, next_join_ns: 0, paths, master, rides })
    }

    /// Opens the index replicated on `nodes`, creating it with `cfg` if
    /// none of them has one. Creating takes each node's buckets and arena
    /// from its region (every node must answer) and zeroes the buckets;
    /// the first node's root slot decides between creators that race (the
    /// losers open the winner's index), but a store is formatted by one
    /// client: a creator that wins the first node and loses another gives
    /// up ([`IndexError::Corrupt`]).
    pub async fn open_or_create<M: Memory>(
        mem: &M,
        nodes: &[NodeId],
        cfg: SnapshotConfig,
    ) -> Result<SnapshotIndex, IndexError> {
        cfg.index.check()?;
        if nodes.is_empty() || nodes.len() > MAX_REPLICAS {
            return Err(IndexError::BadConfig("a replicated index has 1 to 8 replicas"));
        }
        for &n in nodes {
            if Region::read_root(mem, n, roots::INDEX).await? != 0 {
                return Self::open(mem, nodes, 0).await;
            }
        }
        let bucket_bytes = Geometry::bytes(cfg.index.groups).ok_or(IndexError::BadConfig("too many groups"))? - 64;
        let mut replicas: heapless::Vec<Replica, MAX_REPLICAS> = heapless::Vec::new();
        for &node in nodes {
            let mut region = Region::open(mem, node).await?;
            let bytes = header::BYTES + bucket_bytes;
            let base = region.alloc_chunks(mem, bytes.div_ceil(region.chunk)).await?.offset;
            zero(mem, node, base + header::BYTES, bucket_bytes).await?;
            let _ = replicas.push(Replica { node, region_size: region.size, buckets: base + header::BYTES, arena: 0 });
        }
        let sites = super::arena::format(mem, nodes, cfg.arena).await?;
        for (r, s) in replicas.iter_mut().zip(&sites) {
            r.arena = s.base;
        }
        let header = Header {
            groups: cfg.index.groups,
            max_key: cfg.index.max_key,
            seed: cfg.index.seed,
            arena_size: cfg.arena,
            chunk: cfg.chunk,
            timing: cfg.timing,
            replicas,
        };
        let bytes = header.encode();
        Header::decode(nodes[0], &bytes)?;
        for r in &header.replicas {
            mem.write(RemoteAddr::new(r.node, r.buckets - header::BYTES), &bytes).await?;
        }
        for (i, r) in header.replicas.iter().enumerate() {
            let mine = r.buckets - header::BYTES;
            if Region::claim_root(mem, r.node, roots::INDEX, mine).await? != mine {
                if i == 0 {
                    return Self::open(mem, nodes, 0).await;
                }
                return Err(IndexError::Corrupt { node: r.node, what: "another index was created at the same time" });
            }
        }
        Self::open_with(mem, header, 0).await
    }

    /// The index's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// How many of this client's writes took each path of the slot protocol.
    #[cfg(test)]
    pub(crate) fn paths(&self) -> SlotPaths {
        self.paths
    }

    /// The view changes this client took part in.
    pub fn master_paths(&self) -> MasterPaths {
        let (rides, rides_dropped) = self.rides.get();
        MasterPaths { rides, rides_dropped, ..self.master }
    }

    /// The view this client works in.
    pub fn view(&self) -> View {
        self.lease.get().view()
    }

    /// The replicas (bit `i`: replica `i`) on the node a failure came from.
    fn suspects(&self, e: &MemError) -> u8 {
        self.header.replicas.iter().position(|r| r.node == e.node).map_or(0, |i| 1 << i)
    }

    /// Brings the index to a Stable view without `suspects` (failed in view
    /// `seen`) and with `joiners`, and leases it
    /// ([`super::master::settle`]).
    async fn settle<M: Memory>(&mut self, mem: &M, suspects: u8, seen: u32, joiners: u8) -> Result<View, IndexError> {
        let mut lease = self.lease.get();
        let change = master::Change { suspects, seen, joiners };
        let r = master::settle(mem, &self.header, &mut lease, change, self.nonce, &mut self.master).await;
        self.lease.set(lease);
        r
    }

    /// A lease that covers the operation about to be posted: the current
    /// one, renewed (one roundtrip every `L`), or a new view's. A renewal
    /// that heard from replicas the view excludes brings them back first
    /// ([`Self::rejoin`]). With `ride`, a lapsed lease is left to the
    /// operation's first roundtrip, of reads only ([`Self::riding`]).
    async fn ensure<M: Memory>(&mut self, mem: &M, ride: bool) -> Result<(), IndexError> {
        let now = now_ns(mem);
        let mut lease = self.lease.get();
        if lease.covers(now) {
            return self.rejoin(mem).await;
        }
        if ride {
            return Ok(());
        }
        let renewed = lease.renew(mem, &self.header, now).await;
        self.lease.set(lease);
        match renewed {
            Ok(_) => self.rejoin(mem).await,
            Err(ViewError::Corrupt { node }) => Err(IndexError::Corrupt { node, what: "bad view word" }),
            Err(_) => self.settle(mem, 0, 0, 0).await.map(drop),
        }
    }

    /// Brings back the replicas that the view excludes and that answered
    /// this client's last renewal, if their header is still this index's
    /// (one roundtrip) and this client has not just failed to: a view
    /// change whose master catches their slots up ([`super::master`]).
    async fn rejoin<M: Memory>(&mut self, mem: &M) -> Result<(), IndexError> {
        let back = self.lease.get().back() & !self.refused;
        if back == 0 || now_ns(mem) < self.next_join_ns {
            return Ok(());
        }
        let mut joiners = 0;
        for (i, r) in self.header.replicas.iter().enumerate() {
            if back & (1 << i) == 0 {
                continue;
            }
            match Self::read_header(mem, r.node, r.buckets - header::BYTES).await {
                Ok(h) if h == self.header => joiners |= 1 << i,
                Ok(_) | Err(IndexError::Corrupt { .. }) => self.refused |= 1 << i,
                Err(_) => {}
            }
        }
        if joiners == 0 {
            return Ok(());
        }
        let before = self.master.rejoined;
        let settled = self.settle(mem, 0, 0, joiners).await;
        if self.master.rejoined == before && self.view().excluded & joiners != 0 {
            // Failed (or another master is at it): not again for a while.
            let t = self.header.timing;
            self.next_join_ns = now_ns(mem).saturating_add(t.lease_ns.saturating_mul(8));
        }
        settled.map(drop)
    }

    /// Runs `op` (reads and writes that recover from their own rounds'
    /// failures) with a covering lease; after a replica's failure in a read,
    /// changes the view and runs it again: nothing was written. An `op`
    /// whose first roundtrip is reads posted through [`Self::riding`]
    /// (`rides`) renews a lapsed lease in that roundtrip, on its first try.
    async fn with_view<M: Memory, T>(
        &mut self,
        mem: &M,
        rides: bool,
        mut op: impl AsyncFnMut(&mut Self) -> Result<T, IndexError>,
    ) -> Result<T, IndexError> {
        for attempt in 0..MAX_SETTLES {
            self.ensure(mem, rides && attempt == 0).await?;
            let seen = self.view().epoch;
            match op(self).await {
                Err(IndexError::Mem(e)) if self.suspects(&e) != 0 => {
                    let s = self.suspects(&e);
                    self.settle(mem, s, seen, 0).await?;
                }
                Err(IndexError::ViewChanged) => {}
                r => return r,
            }
        }
        Err(IndexError::ViewChanged)
    }

    /// The free part of the arena chunk this client carves blocks from, for
    /// its id's next holder.
    pub fn carried(&self) -> Option<Carry> {
        self.arena.carried()
    }

    /// Goes on carving blocks from `c`, carried by this client's id's
    /// previous holder, if it can be this arena's.
    pub fn adopt(&mut self, c: Carry) -> bool {
        self.arena.adopt(c)
    }

    /// Takes room for a record of `bytes` bytes in the arena (see
    /// [`Records`]): its offset, the same on every replica. No roundtrip
    /// unless this client's arena chunk is used up.
    pub async fn alloc_record<M: Memory>(&mut self, mem: &M, bytes: u64) -> Result<u64, IndexError> {
        Ok(self.arena.alloc(mem, bytes).await?)
    }

    /// Where this index keeps records, as of the view this client is in.
    pub fn records(&self) -> Records {
        Records::new(&self.header, self.view().excluded)
    }

    fn check_key(&self, key: &[u8]) -> Result<KeyHash, IndexError> {
        if key.len() > self.geo.max_key {
            return Err(IndexError::KeyTooLong { len: key.len(), max: self.geo.max_key });
        }
        Ok(self.geo.hash(key))
    }

    fn corrupt(&self, node: NodeId, what: &'static str) -> IndexError {
        IndexError::Corrupt { node, what }
    }

    /// The primary's address of logical offset `offset` in the current view.
    fn on_primary(&self, offset: u64) -> RemoteAddr {
        let first = self.header.order_without(offset, self.view().excluded).next().unwrap_or(0);
        self.header.at(first, offset)
    }

    /// The replicated slot at logical offset `offset`, and its replicas'
    /// arenas in the same order.
    fn slot(&self, offset: u64) -> (Slot, heapless::Vec<Site, MAX_REPLICAS>) {
        let order = self.header.order_without(offset, self.view().excluded);
        let (mut words, mut sites) = (heapless::Vec::<RemoteAddr, MAX_REPLICAS>::new(), heapless::Vec::new());
        for i in order {
            let _ = words.push(self.header.at(i, offset));
            let r = &self.header.replicas[i];
            let _ = sites.push(Site { node: r.node, base: r.arena });
        }
        // Cannot fail: a header has 1 to MAX_REPLICAS replicas.
        (Slot::new(&words).expect("a header has a replica"), sites)
    }

    /// Posts `reads` (of slot words, addressed in the current view) with a
    /// lease that covers them. A lapsed lease is renewed in the same
    /// roundtrip (design F9, "renewals ride the operation"): the reads
    /// count only if the renewal finds the view they were addressed in,
    /// Stable, on a majority, with no replica to bring back; otherwise
    /// [`IndexError::ViewChanged`], and [`Self::with_view`] renews, settles
    /// or rejoins before it runs the operation again.
    ///
    /// Why such reads are sound: the renewal's reads and these were posted
    /// at the same instant `t`, and each lands within `D` of it. A master
    /// of the next view CASes its Prepare onto a majority, which shares a
    /// replica with the renewal's; there the renewal read Stable, so the
    /// Prepare reached its majority after `t`, and the master touches no
    /// slot before `L + D` later, when these reads have landed: they read
    /// the view they were addressed in, as reads under a lease do.
    async fn riding<M: Memory, T>(&self, mem: &M, reads: impl Future<Output = T>) -> Result<T, IndexError> {
        let epoch = self.view().epoch;
        let (out, renewed) =
            leased(mem, &self.lease, &self.header, epoch, reads).await.map_err(|_| IndexError::ViewChanged)?;
        let Some(renewed) = renewed else { return Ok(out) };
        let stale = mutant!("index-ride-unchecked");
        let kept = matches!(renewed, Ok(v) if stale || (v.epoch == epoch && self.lease.get().back() == 0));
        let (n, dropped) = self.rides.get();
        self.rides.set((n + 1, dropped + u64::from(!kept)));
        if kept { Ok(out) } else { Err(IndexError::ViewChanged) }
    }

    /// Reads the key's two combined buckets from their primaries, posted
    /// together (one roundtrip).
    async fn read_view<M: Memory>(&self, mem: &M, kh: &KeyHash) -> Result<ProbeView, IndexError> {
        let at = |m: u64| self.on_primary(self.geo.combined(m));
        let reads = join2(mem.read(at(kh.mains[0]), COMBINED_BYTES), mem.read(at(kh.mains[1]), COMBINED_BYTES));
        let (a, b) = self.riding(mem, reads).await?;
        let (a, b) = (a?, b?);
        let node = at(kh.mains[0]).node;
        ProbeView::from_combined(self.geo.candidates(kh), [&a, &b]).ok_or(self.corrupt(node, "short read of a bucket"))
    }

    /// The location in the block that `w`, a committed word of the slot at
    /// logical offset `offset`, points to on the slot's primary, and
    /// whether it is `key`'s block.
    async fn read_block<M: Memory>(
        &self,
        mem: &M,
        offset: u64,
        w: SlotWord,
        key: &[u8],
    ) -> Result<(u64, bool), IndexError> {
        let (_, sites) = self.slot(offset);
        let primary = sites[0];
        let at = block::addr_of(primary, self.header.arena_size, w.0, Part::Block)
            .ok_or(self.corrupt(primary.node, "slot points outside the arena"))?;
        let buf = mem.read(at, block_len(key.len())).await?;
        let (location, k) = Block::decode(&buf, key.len()).map_err(|what| self.corrupt(primary.node, what))?;
        Ok((location, k == key))
    }

    async fn resolve<M: Memory>(
        &self,
        mem: &M,
        key: &[u8],
        kh: &KeyHash,
        view: &mut ProbeView,
        tombs: bool,
    ) -> Result<(), IndexError> {
        view.resolve(kh, tombs, |c, w| self.read_block(mem, c.offset, w, key)).await
    }

    /// Proposes a fresh block of `key` for the slot at logical offset
    /// `offset`, in a round started from `vold`, a word read from the
    /// slot's primary. The outcome and the word proposed.
    async fn propose<M: Memory>(
        &mut self,
        mem: &M,
        (key, kh): (&[u8], &KeyHash),
        what: Proposal,
        offset: u64,
        vold: SlotWord,
    ) -> Result<(Outcome, SlotWord), IndexError> {
        let (location, tomb) = match what {
            Proposal::Live(l) => (l, false),
            Proposal::Tomb(l) => (l, true),
        };
        let at = self.arena.alloc(mem, block::alloc_len(key.len())).await?;
        let node = self.on_primary(offset).node;
        let word = SlotWord::new(kh.fp, kh.len, at, tomb).ok_or(self.corrupt(node, "arena offset too large"))?;
        // The colliding deletes of FUSEE's code: every removal of a word
        // proposes the same tombstone (F1a), so two can both win.
        let word = if tomb && mutant!("same-tombstone") { vold.tombstone() } else { word };
        let block = Block::encode(key, location);
        let mut paths = SlotPaths::default();
        let mut seen = self.view().epoch;
        let mut out = self.round(mem, offset, word.0, vold.0, &block, &mut paths).await;
        for _ in 0..MAX_SETTLES {
            let suspects = match out {
                Ok(o) => {
                    self.paths.add(&paths);
                    return Ok((o, word));
                }
                Err(SlotError::Unavailable(e)) => self.suspects(&e),
                Err(SlotError::Fenced) => 0,
                Err(SlotError::Unknown { .. }) => {
                    let node = self.on_primary(offset).node;
                    return Err(self.corrupt(node, "a write's outcome is unknown"));
                }
            };
            // The round is frozen: settle the view, then find out where it
            // stands (a master may have committed this word, or the word it
            // started from; a later round may have followed).
            self.settle(mem, suspects, seen, 0).await?;
            seen = self.view().epoch;
            let (slot, sites) = self.slot(offset);
            let p = match read_word(mem, slot.primary()).await {
                Ok(p) => p,
                Err(e) => {
                    out = Err(SlotError::Unavailable(e));
                    continue;
                }
            };
            out = if p == word.0 {
                Ok(Outcome::Won { previous: vold.0 })
            } else if p == vold.0 {
                self.master.reruns += 1;
                self.round(mem, offset, word.0, vold.0, &block, &mut paths).await
            } else {
                let probe = KeyBlock::new(sites, self.header.arena_size, word.0, vold.0, &block);
                match probe.marked_anywhere(mem, word.0).await {
                    Ok(true) => Ok(Outcome::Won { previous: vold.0 }),
                    Ok(false) => Ok(Outcome::Lost { current: p }),
                    Err(e) => Err(SlotError::Unavailable(e)),
                }
            };
        }
        self.paths.add(&paths);
        Err(IndexError::ViewChanged)
    }

    /// One RCAS of `word` over `vold` on the slot at logical offset
    /// `offset`, in the current view, fenced by its lease.
    async fn round<M: Memory>(
        &self,
        mem: &M,
        offset: u64,
        word: u64,
        vold: u64,
        block: &Block,
        paths: &mut SlotPaths,
    ) -> Result<Outcome, SlotError> {
        let (slot, sites) = self.slot(offset);
        let target = Guarded {
            block: KeyBlock::new(sites, self.header.arena_size, word, vold, block),
            lease: &self.lease,
            header: &self.header,
            epoch: self.view().epoch,
        };
        slot::rcas(mem, &slot, Exp::Hint(vold), word, &target, paths).await
    }

    async fn do_insert<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        ready: impl Future<Output = bool>,
        rounds: &mut Rounds<impl FnMut(u64) -> Option<Note>>,
    ) -> Result<Option<Insert>, IndexError> {
        let kh = self.check_key(key)?;
        if location == 0 {
            return Err(IndexError::ZeroLocation);
        }
        let (view, ready) = join2(self.read_view(mem, &kh), ready).await;
        if !ready {
            return Ok(None);
        }
        let mut view = view?;
        for _ in 0..MAX_ATTEMPTS {
            self.resolve(mem, key, &kh, &mut view, true).await?;
            let i = match view.insert_choice() {
                Choice::Exists(i, loc) => {
                    let slot = self.on_primary(view.cands[i].offset);
                    return Ok(Some(Insert::Exists(Entry { location: loc, slot, word: view.words[i].0 })));
                }
                Choice::Take(i) => i,
                Choice::Full => return Err(IndexError::Full { node: self.header.replicas[0].node }),
            };
            let offset = view.cands[i].offset;
            if rounds.from.is_some_and(|w| w != view.words[i].0) {
                return Ok(None);
            }
            let note = (rounds.note)(view.words[i].0);
            let records = self.records();
            let propose = self.propose(mem, (key, &kh), Proposal::Live(location), offset, view.words[i]);
            let (_, proposed) = join2(
                async {
                    if let Some((at, bytes)) = note {
                        let _ = records.write(mem, at, &bytes).await;
                    }
                },
                propose,
            )
            .await;
            match proposed? {
                (Outcome::Won { .. }, word) => {
                    let slot = self.on_primary(offset);
                    return Ok(Some(Insert::New(Entry { location, slot, word: word.0 })));
                }
                (Outcome::Lost { current }, _) => view.set(i, SlotWord(current)),
            }
        }
        Err(IndexError::Contended)
    }

    async fn do_lookup<M: Memory>(&self, mem: &M, key: &[u8], kh: &KeyHash) -> Result<Option<Entry>, IndexError> {
        let mut view = self.read_view(mem, kh).await?;
        self.resolve(mem, key, kh, &mut view, false).await?;
        let found = view.live().map(|(i, location)| Entry {
            location,
            slot: self.on_primary(view.cands[i].offset),
            word: view.words[i].0,
        });
        if found.is_none() && view.words[..view.len()].iter().any(|w| !w.is_sound()) {
            let node = self.on_primary(view.cands[0].offset).node;
            return Err(self.corrupt(node, "a garbled slot word may hide the key"));
        }
        Ok(found)
    }

    /// The logical offset of the slot of `e`, if `e` can be a live mapping
    /// of the key with hash `kh`.
    fn check_entry(&self, kh: &KeyHash, e: &Entry) -> Result<u64, IndexError> {
        let w = SlotWord(e.word);
        if !w.is_live() || !w.matches(kh) || e.location == 0 {
            return Err(IndexError::BadEntry);
        }
        // Any replica's copy of the slot names it: the primary's may have
        // moved since the entry was made.
        let r = self.header.replicas.len();
        let cands = self.geo.candidates(kh);
        let c = cands.iter().find(|c| (0..r).any(|i| self.header.at(i, c.offset) == e.slot));
        c.map(|c| c.offset).ok_or(IndexError::BadEntry)
    }

    /// Update (`location: Some`) or removal (`None`).
    async fn do_change<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
        location: Option<u64>,
    ) -> Result<Change, IndexError> {
        let kh = self.check_key(key)?;
        if location == Some(0) {
            return Err(IndexError::ZeroLocation);
        }
        let mut cur = match expect {
            Expect::Entry(e) => {
                self.check_entry(&kh, &e)?;
                e
            }
            _ => match self.do_lookup(mem, key, &kh).await? {
                Some(e) => e,
                None => return Ok(Change::NotFound),
            },
        };
        let offset = self.check_entry(&kh, &cur)?;
        for _ in 0..MAX_ATTEMPTS {
            if let Expect::Location(l) = expect
                && cur.location != l
            {
                return Ok(Change::Mismatch { current: cur });
            }
            // A tomb block keeps the removed location, for whoever debugs.
            let what = location.map_or(Proposal::Tomb(cur.location), Proposal::Live);
            let prev = match self.propose(mem, (key, &kh), what, offset, SlotWord(cur.word)).await? {
                (Outcome::Won { .. }, word) => {
                    let now = location.map(|l| Entry { location: l, slot: cur.slot, word: word.0 });
                    return Ok(Change::Done { previous: cur.location, now });
                }
                (Outcome::Lost { current }, _) => SlotWord(current),
            };
            match after_lost_change(prev, &kh) {
                AfterLoss::Removed => return Ok(Change::NotFound),
                AfterLoss::Changed => {}
                AfterLoss::Foreign => {
                    return Err(self.corrupt(cur.slot.node, "a key's slot changed to another key's"));
                }
            }
            let (location, mine) = self.read_block(mem, offset, prev, key).await?;
            if !mine {
                return Err(self.corrupt(cur.slot.node, "a key's slot holds another key"));
            }
            cur = Entry { location, slot: cur.slot, word: prev.0 };
            if matches!(expect, Expect::Entry(_)) {
                return Ok(Change::Mismatch { current: cur });
            }
        }
        Err(IndexError::Contended)
    }
}

/// A record write (arena offset, bytes) posted beside an insert round's
/// first phase: [`SnapshotIndex::insert_noted`].
pub type Note = (u64, [u8; 16]);

/// What an insert's rounds are held to: the word they may start from, and
/// what each posts beside its first phase.
struct Rounds<F> {
    from: Option<u64>,
    note: F,
}

impl SnapshotIndex {
    /// [`Index::insert_after`], with `note(word)`, a record write, posted
    /// beside the first phase of each SNAPSHOT round the insert starts
    /// (from `word`: the free slot's, 0 if never used, or the key's
    /// tombstone), at no roundtrip of its own (best effort: what the
    /// insert answers does not wait on it). FUSEE's log records there the
    /// word its insert's last round started from, which recovery needs to
    /// redo it ([`Self::insert_from`]).
    pub async fn insert_noted<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        ready: impl Future<Output = bool>,
        note: impl FnMut(u64) -> Option<Note>,
    ) -> Result<Option<Insert>, IndexError> {
        // `ready` runs once, with the first try's first roundtrip.
        let mut ready = Some(ready);
        let mut rounds = Rounds { from: None, note };
        self.with_view(mem, true, async |ix| match ready.take() {
            Some(r) => ix.do_insert(mem, key, location, r, &mut rounds).await,
            None => ix.do_insert(mem, key, location, async { true }, &mut rounds).await,
        })
        .await
    }

    /// An insert of `key` to `location` only by a round from `word`, the
    /// word the key's free slot held when another insert started its
    /// round there (a crashed client's, which recovery redoes): `None` if
    /// that slot no longer holds `word` (the key took effect there and was
    /// removed since, or another key took the slot: every word a slot
    /// holds is new and a used slot is never free again, so the other
    /// insert's round from `word` is over) or lost it to another key;
    /// [`Insert::Exists`] if the key is mapped (by that other insert's
    /// round too, which this one's may have completed). A round from
    /// `word` commits one of its proposals, so the two inserts take effect
    /// once between them.
    pub async fn insert_from<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        word: u64,
    ) -> Result<Option<Insert>, IndexError> {
        let mut rounds = Rounds { from: Some(word), note: |_| None };
        self.with_view(mem, true, async |ix| ix.do_insert(mem, key, location, async { true }, &mut rounds).await).await
    }
}

impl From<ArenaError> for IndexError {
    fn from(e: ArenaError) -> Self {
        match e {
            ArenaError::Mem(m) => IndexError::Mem(m),
            e => IndexError::Arena(e),
        }
    }
}

impl Index for SnapshotIndex {
    fn max_key(&self) -> usize {
        self.geo.max_key
    }

    async fn insert<M: Memory>(&mut self, mem: &M, key: &[u8], location: u64) -> Result<Insert, IndexError> {
        let r = self.insert_after(mem, key, location, async { true }).await;
        r.map(|done| done.expect("ready is true"))
    }

    /// Reads the key's buckets while `ready` runs: one roundtrip for both.
    async fn insert_after<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        ready: impl Future<Output = bool>,
    ) -> Result<Option<Insert>, IndexError> {
        // `ready` runs once, with the first try's first roundtrip.
        self.insert_noted(mem, key, location, ready, |_| None).await
    }

    async fn lookup<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Option<Entry>, IndexError> {
        let kh = self.check_key(key)?;
        self.with_view(mem, true, async |ix| ix.do_lookup(mem, key, &kh).await).await
    }

    async fn update<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
        location: u64,
    ) -> Result<Change, IndexError> {
        let rides = !matches!(expect, Expect::Entry(_));
        self.with_view(mem, rides, async |ix| ix.do_change(mem, key, expect, Some(location)).await).await
    }

    async fn remove<M: Memory>(&mut self, mem: &M, key: &[u8], expect: Expect) -> Result<Change, IndexError> {
        let rides = !matches!(expect, Expect::Entry(_));
        self.with_view(mem, rides, async |ix| ix.do_change(mem, key, expect, None).await).await
    }

    async fn still<M: Memory>(&mut self, mem: &M, key: &[u8], entry: &Entry) -> Result<bool, IndexError> {
        let kh = self.check_key(key)?;
        let offset = self.check_entry(&kh, entry)?;
        self.with_view(mem, true, async |ix| {
            Ok(ix.riding(mem, read_word(mem, ix.on_primary(offset))).await?? == entry.word)
        })
        .await
    }

    /// Nothing (F8): a CAS on the primary alone would leave it ahead of its
    /// backups, and the next round on the slot could not decide.
    fn remove_background<M: Memory>(&mut self, _mem: &M, key: &[u8], entry: &Entry) -> Result<(), IndexError> {
        let kh = self.check_key(key)?;
        self.check_entry(&kh, entry)?;
        Ok(())
    }
}
