//! Clover's metadata server (pDPM §5, "MS duties"): a [`Service`] on the
//! core's server layer (`crate::substrate::msg::server`), beside node 0
//! ([`super::MS`]), as pDPM-Central's coordinator is. It never takes part
//! in a read or an update: it creates keys' chains, tells clients where a
//! chain starts, and hands out free buffers.
//!
//! - **Index and creates.** A key's chain starts at its first version,
//!   which the MS writes itself (to the key's R nodes, out of place, as
//!   any version) before it maps the key, in the store's index
//!   (`RaceIndex`) on its node, the paper's "local PM", to the key's
//!   *cell*: a word on the key's primary that holds the chain's head
//!   (the paper keeps heads in the MS's PM and a shortcut per key on its
//!   DN; here they are one word, see "Shortcuts" below). Creates are
//!   serialized by the server loop; a create of a key that has a chain
//!   answers that chain, on which the client appends its version. So a
//!   key has one chain for ever, deletes and inserts again included
//!   ([`super::header`]).
//! - **Lookups** answer the chain's head and cell from the MS's map,
//!   loaded from the index and the cell on a key's first request (after a
//!   restart: nothing else to recover, every other piece of state is in
//!   the chains).
//! - **ALLOC** hands a client a batch of free *groups* of one size class
//!   on every data node at once (the paper's "background batches, one
//!   bucket per DN"): a group is a version's R buffers, one on a primary
//!   node and one on each node after it (`crate::kv::place::node_of`), all
//!   of one size class (the slab's, [`super::header`]), handed out,
//!   written, retired and recycled together under the primary's GC
//!   version, and handed out again for the same class (or, once its
//!   node has no room for a new group of a smaller class, for that one,
//!   one per request and node: the groups of a workload's larger values
//!   are not stranded when its values shrink; the group keeps its class,
//!   recorded here, and links name the class of the version in it). Fresh
//!   groups are carved by the MS's slab allocator from chunks of the
//!   nodes' regions; a node whose allocation fails is skipped for a while
//!   ([`RETRY_AFTER`] requests), and a group made then has no buffer
//!   there (topped up when it is handed out again).
//!
//! # Garbage collection (pDPM §5.2)
//!
//! - **Retires** ride on ALLOCs: the client whose CAS linked version N+1
//!   from N retires N, naming N and N+1. The MS answers the ALLOC first
//!   and frees after, between passes over its channels
//!   (`Service::background`), so that no answer waits for cell writes;
//!   the cells of all the retires waiting are written at once (one
//!   roundtrip a pass, not one a retire: the MS keeps up with its
//!   clients' writes). The MS frees a key's versions in
//!   *chain order only*: it keeps the key's head (its oldest version not
//!   freed) and frees the head when a retire names it, moving the head to
//!   the version linked from it; retires that arrive early wait. So a walk
//!   from the head never meets a freed buffer, and a version is freed at
//!   most once (only the head is freed, and the head only moves forward).
//!   The new head is written to the key's cell (in place: the index maps
//!   the key to its cell, as the index's out-of-place updates would leak
//!   a key block per move) before anything behind it is freed, so that a
//!   standby, and a client that reads the cell, start from a head that is
//!   not recycled.
//! - **A retire that never comes** (its client crashed, or its ALLOC met a
//!   crashed MS) would stop the key's chain for ever: when a key has more
//!   than [`STUCK_AFTER`] retires waiting, the MS reads its head's header
//!   word itself (the head is not freed, so the word is genuine): a link
//!   frees the head as a retire would; a tail says that what waits is
//!   behind the head already (done by such a read) and is dropped.
//! - **Delays.** A freed group is handed out again only after
//!   [`super::REUSE_AFTER_TIMEOUTS`] read time-outs, with its GC version
//!   raised; one whose GC version wraps (255 to 0) waits
//!   [`super::epoch_ns`] instead (the paper's overflow list: no cursor
//!   lives that long, so no cursor can mistake a later incarnation for
//!   the one it knew). Times are the MS's memory's clock
//!   (`Memory::now_ns`); where it keeps none, nothing is handed out again.
//! - **Deleted keys** keep their last version (its header says deleted):
//!   it is the chain's tail and never retired, until an insert links a new
//!   version from it (that insert retires it). So a deleted key holds one
//!   group, as the index holds its entry.
//! - **Given back**: a client's unused groups, when it closes.
//!
//! # Shortcuts (pDPM §5.1)
//!
//! The paper's shortcut is a per-key word on the key's DN, written by each
//! writer after its commit, that clients race against their chain walk.
//! A writer's shortcut can land after the version it names was retired
//! and freed (a slow writer, a crashed one's successor that never writes
//! its own), and then stays, naming a buffer that is recycled again and
//! again: once its 8-bit GC version wraps, a reader that follows it finds
//! a buffer of the right key and GC version that may be a version never
//! linked. So here the shortcut is the key's cell, written by the MS only,
//! before it frees anything behind the head it names: a client that
//! reads `(B, g)` there read it before the MS overwrote it, so before `B`
//! was freed, and such a cursor is as sound as one the MS answers
//! (`super`'s GC argument). Clients keep the cell's address with their
//! cursor, read the cell beside a get's first READ, and restart from it
//! (one-sided, no call) when their cursor was recycled. It names the
//! oldest version not freed, which GC keeps near the tail; it is never
//! ahead of a cursor that is still valid, so it serves the restarts, not
//! the hops (those follow links).
//!
//! What an incarnation knows of groups (their backups, the free lists) is
//! lost with it: a standby frees the groups it did not make without their
//! backups (it tops them up with fresh buffers when it hands them out),
//! and the groups on the crashed one's lists and in its clients' pools are
//! lost, a bounded loss per crash.
//!
//! **A crashed client's pool.** The MS remembers which client id it lent
//! each group to, until the group is freed. A client's ALLOCs name its
//! claim of its id (a lease's claim number: the next holder's is larger);
//! one that names a new claim on an id says the earlier holder is gone
//! (its lease ran out and its id was claimed again: by the leases' timing
//! rule, what it posted has landed). The MS then reads the meta word of
//! each group it lent that holder, and frees those never written in the
//! incarnation they were lent at (no version is in them, and no cursor
//! names them); the others hold a version, linked (garbage collection
//! frees it) or not (lost: one per crash at most). Its slab allocator claims fresh chunks,
//! so nothing an earlier incarnation handed out is handed out by it unless
//! freed in a chain from the index's head.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use hashbrown::HashMap;

use super::buffer;
use super::header::{self, Cursor, Next};
use super::wire::{self, Alloc, Answer, Chain, Group, MAX_BATCH, Retire};
use crate::index::{Index, Insert, RaceIndex};
use crate::kv::place::{addr_of, key_hash, location_of, node_of};
use crate::kv::{KvError, StoreConfig};
use crate::substrate::join::{join_vec, join2};
use crate::substrate::memory::read_word;
use crate::substrate::msg::rpc::Status;
use crate::substrate::msg::server::{Request, Service};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority, to_all};
use crate::substrate::rtt::Counted;
use crate::substrate::space::slab::{SlabAllocator, USED_CLASSES, class_size};
use crate::{MemError, MemErrorKind, Memory, NodeId, RemoteAddr};

/// The metadata server's service name, which clients check they connect to.
pub const NAME: &str = "clover metadata server";

/// Requests a node whose allocation failed is skipped for.
pub const RETRY_AFTER: u32 = 16;
/// Retires a key may have waiting before the MS reads its head's header
/// word to find what was retired without telling it.
pub const STUCK_AFTER: usize = 4;
/// Most heads the MS reads for one key in one request.
const MAX_STUCK_READS: usize = 64;

/// What the metadata server did, over its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Chains created.
    pub creates: u64,
    /// Creates that found a chain (the client appends to it).
    pub existing: u64,
    /// Batches handed out.
    pub batches: u64,
    /// Groups handed out (fresh and recycled).
    pub buffers: u64,
    /// Groups made fresh (slab allocations).
    pub fresh: u64,
    /// Groups handed out again after they were freed.
    pub recycled: u64,
    /// Groups freed (retired versions, and groups given back).
    pub freed: u64,
    /// Groups whose GC version wrapped (they waited an epoch).
    pub wrapped: u64,
    /// Heads read because retires waited for one that never came.
    pub stuck_reads: u64,
    /// Keys loaded from the index (after a restart).
    pub loaded: u64,
    /// Allocations that failed on a data node.
    pub failed_allocs: u64,
    /// Freed groups handed out for a smaller size class than theirs, as
    /// their node had no room for a new group of that class.
    pub larger: u64,
    /// Groups taken back unwritten from a client id's earlier holder.
    pub reclaimed: u64,
}

/// How [`MetadataServer::group`] had a group.
enum Had {
    /// From its class's free list.
    Recycled,
    /// Carved fresh.
    Fresh,
    /// From a larger class's free list (the node was full).
    Larger,
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
    /// How long clients use a cursor on its own word, ns
    /// ([`super::cursor_lifetime_ns`]).
    pub lifetime_ns: u64,
}

impl Shape {
    /// The shape for a store of `cfg`.
    pub fn of(cfg: &StoreConfig) -> Shape {
        Shape {
            node: super::MS,
            replicas: cfg.replicas,
            max_key: cfg.max_key,
            max_value: cfg.max_value,
            lifetime_ns: super::cursor_lifetime_ns(cfg),
        }
    }

    /// The size class of the largest buffer (a version of the longest key
    /// and largest value).
    pub fn max_class(&self) -> Option<u8> {
        buffer::class(self.max_key, self.max_value)
    }
}

/// A key's chain as the MS keeps it.
struct Kept {
    /// The key's cell on its primary (what the index maps the key to):
    /// the head, written in place as it moves ([`header::cell_word`]).
    cell: RemoteAddr,
    /// Its oldest version not freed.
    head: Cursor,
    /// Retires that came before the one of the head: (old, new).
    pending: Vec<(Cursor, Cursor)>,
}

/// The metadata server's service.
pub struct MetadataServer {
    shape: Shape,
    index: RaceIndex,
    /// Its slab allocators: the `i`-th carves the size classes from
    /// `i * USED_CLASSES` on (one allocator uses at most [`USED_CLASSES`]
    /// classes on a node at once, and versions may take all of Clover's).
    slabs: Vec<SlabAllocator>,
    /// The allocator of keys' cells, apart from the buffers': a cell freed
    /// at once (its create failed) must not come back as a buffer that
    /// its late WRITE would land on.
    cells: SlabAllocator,
    chains: HashMap<Vec<u8>, Kept>,
    /// The size class and backups of every group this incarnation made or
    /// freed, by its primary's buffer.
    groups: HashMap<RemoteAddr, (u8, heapless::Vec<RemoteAddr, MAX_REPLICAS>)>,
    /// Per primary node and size class, groups ready to be handed out
    /// (their GC version raised).
    free: HashMap<(NodeId, u8), VecDeque<Cursor>>,
    /// Freed groups and when they may be handed out (MS time, ns), in
    /// that order: after the reuse delay.
    cooling: VecDeque<(u64, Cursor)>,
    /// The same for groups whose GC version wrapped: after an epoch.
    overflow: VecDeque<(u64, Cursor)>,
    /// Per node: requests left before its allocations are tried again.
    skip: Vec<u32>,
    /// Per node and size class found full: requests for which a freed
    /// group of a larger class is handed out first (no allocation tried).
    full: HashMap<(NodeId, u8), u32>,
    /// The groups handed out and not freed since, by primary: to which
    /// client id, at which GC version.
    lent: HashMap<RemoteAddr, (u16, u8)>,
    /// Per client id, the claim of its holder that the last ALLOC named.
    holders: HashMap<u16, u64>,
    /// Retires that came with ALLOCs, freed after their answers were sent
    /// ([`Service::background`]): an ALLOC's answer waits for no cell
    /// write.
    backlog: VecDeque<Retire>,
    paths: Paths,
}

/// A key's head moved by retires, to be written to its cell before what
/// it passed is freed.
struct Moved {
    key: Vec<u8>,
    cell: RemoteAddr,
    /// The cell's new word, as written.
    word: [u8; 8],
    /// The head before (restored if the cell cannot be written).
    before: Cursor,
    /// The versions behind the new head.
    freed: Vec<Cursor>,
}

/// A request that is not what its method takes.
const BAD_REQUEST: KvError = KvError::Bug("a malformed request");

impl MetadataServer {
    /// A metadata server of shape `shape` over the store's `index`.
    pub fn new(shape: Shape, index: RaceIndex) -> Self {
        MetadataServer {
            shape,
            index,
            slabs: Vec::new(),
            cells: SlabAllocator::new(),
            chains: HashMap::new(),
            groups: HashMap::new(),
            free: HashMap::new(),
            cooling: VecDeque::new(),
            overflow: VecDeque::new(),
            skip: Vec::new(),
            full: HashMap::new(),
            lent: HashMap::new(),
            holders: HashMap::new(),
            backlog: VecDeque::new(),
            paths: Paths::default(),
        }
    }

    /// What it did so far.
    pub fn paths(&self) -> Paths {
        self.paths
    }

    /// Groups freed and not handed out again (cooling, wrapped, ready).
    pub fn free_groups(&self) -> usize {
        self.cooling.len() + self.overflow.len() + self.free.values().map(|f| f.len()).sum::<usize>()
    }

    /// `key`'s chain (its head and cell), from the map or the index.
    async fn head<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Option<Chain>, KvError> {
        if let Some(c) = self.chains.get(key) {
            return Ok(Some(Chain { head: c.head, cell: c.cell }));
        }
        let Some(entry) = self.index.lookup(mem, key).await? else { return Ok(None) };
        let nodes = mem.node_count();
        let primary = node_of(key, 0, nodes);
        let cell = addr_of(entry.location, nodes).filter(|a| a.offset != 0 && a.node == primary);
        let cell = cell.ok_or(KvError::Corrupt)?;
        let word = read_word(mem, cell).await.map_err(KvError::Down)?;
        let head = header::decode_cell(word, key_hash(key), nodes).filter(|h| h.at.node == primary);
        let head = head.ok_or(KvError::Corrupt)?;
        self.paths.loaded += 1;
        self.chains.insert(key.to_vec(), Kept { cell, head, pending: Vec::new() });
        Ok(Some(Chain { head, cell }))
    }

    /// The slab allocator of buffers of size class `class`.
    fn slab(&mut self, class: u8) -> &mut SlabAllocator {
        let i = class as usize / USED_CLASSES;
        if self.slabs.len() <= i {
            self.slabs.resize_with(i + 1, SlabAllocator::new);
        }
        &mut self.slabs[i]
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

    async fn alloc<M: Memory>(&mut self, mem: &M, node: NodeId, class: u8) -> Result<RemoteAddr, KvError> {
        if self.skipped(node) {
            return Err(KvError::Down(MemError::new(node, MemErrorKind::Unreachable)));
        }
        match self.slab(class).alloc(mem, node, class_size(class as usize)).await {
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

    /// Moves the groups whose delay is over to the free lists.
    fn cool<M: Memory>(&mut self, mem: &M) {
        let Some(now) = mem.now_ns() else { return };
        for q in [&mut self.cooling, &mut self.overflow] {
            while let Some(&(at, c)) = q.front()
                && at <= now
            {
                q.pop_front();
                self.free.entry((c.at.node, c.class)).or_default().push_back(c);
            }
        }
    }

    /// Frees the group whose primary is `c` (of GC version `c.gc`): it
    /// waits its delay with its GC version raised. Its size class is the
    /// one this incarnation made it with; for a group it did not make,
    /// the one `c` names (from a link: checked), if no larger than the
    /// store's largest (else it is left out: lost space, never a buffer
    /// handed out larger than it is).
    fn release<M: Memory>(&mut self, mem: &M, c: Cursor) {
        let Some(now) = mem.now_ns() else { return };
        self.lent.remove(&c.at);
        let class = self.groups.entry(c.at).or_insert_with(|| (c.class, heapless::Vec::new())).0;
        if self.shape.max_class().is_none_or(|max| class > max) {
            self.groups.remove(&c.at);
            return;
        }
        let next = Cursor::new(c.at, c.gc.wrapping_add(1), class);
        self.paths.freed += 1;
        if next.gc == 0 {
            self.paths.wrapped += 1;
            self.overflow.push_back((now + super::epoch_ns(mem, self.shape.lifetime_ns), next));
        } else {
            self.cooling.push_back((now + super::REUSE_AFTER_TIMEOUTS * super::read_timeout_ns(mem), next));
        }
    }

    /// A freed group ready to be handed out whose primary is on `node`, of
    /// the smallest size class above `class` that has one.
    fn larger_free(&mut self, node: NodeId, class: u8) -> Option<Cursor> {
        // Mutant `clover-strands`: none is (the groups of classes no longer
        // written stay on their lists while writes fail for want of room).
        if mutant!("clover-strands") {
            return None;
        }
        let ready = self.free.iter().filter(|((n, c), f)| *n == node && *c > class && !f.is_empty());
        let (&key, _) = ready.min_by_key(|((_, c), _)| *c)?;
        self.free.get_mut(&key)?.pop_front()
    }

    /// A group of size class `class` whose primary is on `node`, with as
    /// many of its R - 1 backups as the nodes after it can hold: a freed
    /// one if one is ready (its missing backups topped up), else a fresh
    /// one, else (the node is full) a freed one of a larger class. Fails if
    /// the primary cannot be had.
    async fn group<M: Memory>(&mut self, mem: &M, node: NodeId, class: u8) -> Result<Group, KvError> {
        let nodes = mem.node_count();
        let r = self.shape.replicas.clamp(1, nodes.min(MAX_REPLICAS));
        // Mutant `clover-any-class`: a freed group is handed out for any
        // class (a version larger than its buffer then runs over the next).
        let reused = match mutant!("clover-any-class") {
            true => {
                let any = self.free.iter_mut().find(|((n, _), f)| *n == node && !f.is_empty());
                any.and_then(|(_, f)| f.pop_front()).map(|c| Cursor { class, ..c })
            }
            false => self.free.get_mut(&(node, class)).and_then(|f| f.pop_front()),
        };
        // How the group was had (counted once it is handed out).
        let (primary, how) = match reused {
            Some(c) => (c, Had::Recycled),
            // A node with no room for a new buffer of this class hands out a
            // freed group of a larger one (it keeps its class), so that the
            // memory freed by a workload whose values shrink is not stranded
            // on the lists of classes no longer written. Once a node was
            // found full for a class, the larger groups go first for a while,
            // with no allocation tried.
            None => {
                let full = self.full.get(&(node, class)).is_some_and(|&n| n > 0);
                match full.then(|| self.larger_free(node, class)).flatten() {
                    Some(c) => (c, Had::Larger),
                    None => match self.alloc(mem, node, class).await {
                        Ok(at) => {
                            self.groups.insert(at, (class, heapless::Vec::new()));
                            (Cursor::new(at, 0, class), Had::Fresh)
                        }
                        Err(e @ (KvError::NodeFull { .. } | KvError::BadConfig(_))) => {
                            self.full.insert((node, class), RETRY_AFTER);
                            match self.larger_free(node, class) {
                                Some(c) => (c, Had::Larger),
                                None => return Err(e),
                            }
                        }
                        Err(e) => return Err(e),
                    },
                }
            }
        };
        // A recycled group's backups are of its own class.
        let class = primary.class;
        let mut backups = self.groups.get(&primary.at).map(|g| g.1.clone()).unwrap_or_default();
        let mut refused = None;
        for i in 1..r {
            let n = NodeId(((node.index() + i) % nodes) as u16);
            if backups.iter().any(|b| b.node == n) {
                continue;
            }
            // A node down is left out (a majority of copies will do); a
            // full one too, unless the group is then short of a majority.
            match self.alloc(mem, n, class).await {
                Ok(a) => {
                    let _ = backups.push(a);
                }
                Err(KvError::Down(_)) => {}
                Err(e) => refused = Some(e),
            }
        }
        self.groups.insert(primary.at, (class, backups.clone()));
        if let Some(e) = refused
            && backups.len() + 1 < majority(r)
        {
            // What a write to it would fail on, said as it is (not as nodes
            // that did not answer); the group waits for the next request.
            self.free.entry((node, class)).or_default().push_front(primary);
            return Err(e);
        }
        match how {
            Had::Recycled => self.paths.recycled += 1,
            Had::Fresh => self.paths.fresh += 1,
            Had::Larger => (self.paths.recycled, self.paths.larger) = (self.paths.recycled + 1, self.paths.larger + 1),
        }
        self.paths.buffers += 1;
        Ok(Group { primary, backups })
    }

    /// Creates `key`'s chain with `value` as its first version: its R
    /// copies written (the primary's and a majority's in all), then the key
    /// mapped to the primary's copy. The answer, and the roundtrips to
    /// data nodes.
    async fn create<M: Memory>(&mut self, mem: &M, key: &[u8], value: &[u8]) -> Result<(Answer, u8), KvError> {
        if key.is_empty() || key.len() > self.shape.max_key || value.len() > self.shape.max_value {
            return Err(BAD_REQUEST);
        }
        let class = buffer::class(key.len(), value.len()).ok_or(BAD_REQUEST)?;
        if let Some(h) = self.head(mem, key).await? {
            self.paths.existing += 1;
            return Ok((Answer::Head(h), 0));
        }
        let nodes = mem.node_count();
        let r = self.shape.replicas.clamp(1, nodes.min(MAX_REPLICAS));
        self.cool(mem);
        let primary = node_of(key, 0, nodes);
        let g = self.group(mem, primary, class).await?;
        // The version as links name it: of its own class (the group's may
        // be larger).
        let head = Cursor { class, ..g.primary };
        let tag = key_hash(key);
        let bytes = buffer::encode(key, value, tag, g.primary.gc);
        // The key's cell, on its primary, written beside the first version
        // (the same roundtrip) and before the index maps the key to it.
        let cell = match self.cells.alloc(mem, primary, 8).await {
            Ok(cell) => cell,
            Err(e) => {
                self.release(mem, g.primary);
                return Err(KvError::from(e));
            }
        };
        let counted = Counted::new(mem);
        let backups = &g.backups;
        let ((p, c), (reached, _)) = join2(
            join2(
                counted.write(g.primary.at, &bytes),
                counted.write(cell, &header::cell_word(head, tag).to_le_bytes()),
            ),
            to_all(backups.len(), majority(r) - 1, |i| counted.write(backups[i], &bytes)),
        )
        .await;
        if p.is_err() || c.is_err() || !reached {
            // Never linked: both may be handed out again.
            self.release(mem, g.primary);
            self.cells.free(cell, 8);
            p?;
            c.map_err(KvError::Down)?;
            return Err(KvError::Unavailable);
        }
        let rounds = counted.roundtrips().min(u8::MAX as u32) as u8;
        let head = match self.index.insert(mem, key, location_of(cell)).await? {
            Insert::New(_) => head,
            // Another incarnation created it meanwhile: its chain is the
            // key's (this group is not linked: freed; the cell is lost).
            Insert::Exists(_) => {
                self.release(mem, g.primary);
                return match self.head(mem, key).await? {
                    Some(h) => Ok((Answer::Head(h), rounds)),
                    None => Err(KvError::Corrupt),
                };
            }
        };
        self.chains.insert(key.to_vec(), Kept { cell, head, pending: Vec::new() });
        self.paths.creates += 1;
        Ok((Answer::Created(Chain { head, cell }), rounds))
    }

    /// Takes `r` into its key's chain and moves the key's head as far as
    /// it can, in chain order: past the head while a retire names it, and
    /// past what the head's own word links to while too many retires
    /// wait. Answers what that frees once the new head is in the key's
    /// cell ([`Moved`]); the head is moved in the MS's map at once, so
    /// that the next retires of the key go on from it.
    async fn retire<M: Memory>(&mut self, mem: &M, r: Retire) -> Result<Option<Moved>, KvError> {
        let nodes = mem.node_count();
        let primary = node_of(&r.key, 0, nodes);
        if self.head(mem, &r.key).await?.is_none() {
            return Ok(None);
        }
        let tag = key_hash(&r.key);
        let Some(chain) = self.chains.get_mut(&r.key) else { return Ok(None) };
        if !chain.pending.iter().any(|p| p.0 == r.old) {
            chain.pending.push((r.old, r.new));
        }
        let mut freed = Vec::new();
        let before = chain.head;
        let mut head = chain.head;
        let mut reads = 0;
        loop {
            if let Some(i) = chain.pending.iter().position(|p| p.0 == head) {
                let (old, new) = chain.pending.swap_remove(i);
                freed.push(old);
                head = new;
                continue;
            }
            // Mutant `clover-no-stuck-reads`: a retire that never came
            // holds every later version of the key for ever.
            if chain.pending.len() <= STUCK_AFTER || reads >= MAX_STUCK_READS || mutant!("clover-no-stuck-reads") {
                break;
            }
            // A retire that never came: the head's own word says.
            reads += 1;
            self.paths.stuck_reads += 1;
            let w = read_word(mem, head.at).await.map_err(KvError::Down)?;
            match header::decode(w, tag, nodes) {
                Some(Next::Link(next)) if next.at.node == primary => {
                    freed.push(head);
                    head = next;
                }
                // The head is the tail (or not what it should be: left
                // alone): what waits is behind it.
                _ => chain.pending.clear(),
            }
        }
        if freed.is_empty() {
            return Ok(None);
        }
        chain.head = head;
        Ok(Some(Moved {
            key: r.key,
            cell: chain.cell,
            word: header::cell_word(head, tag).to_le_bytes(),
            before,
            freed,
        }))
    }

    /// Frees what the retires waiting allow: every key's new head written
    /// to its cell, all cells at once, then what is behind each head
    /// freed. A cell not written frees nothing: its key's head goes back
    /// (the versions stay allocated; their retires are spent, and the head
    /// is read again when later ones pile up).
    async fn free_retired<M: Memory>(&mut self, mem: &M) {
        let mut moves: Vec<Moved> = Vec::new();
        while let Some(r) = self.backlog.pop_front() {
            // A node down or a garbled word: what it would have freed
            // waits (or is lost).
            let Ok(Some(m)) = self.retire(mem, r).await else { continue };
            match moves.iter_mut().find(|x| x.key == m.key) {
                Some(x) => {
                    x.word = m.word;
                    x.freed.extend(m.freed);
                }
                None => moves.push(m),
            }
        }
        let written = join_vec(moves.iter().map(|m| mem.write(m.cell, &m.word)).collect()).await;
        for (m, w) in moves.into_iter().zip(written) {
            match w {
                Ok(()) => m.freed.into_iter().for_each(|c| self.release(mem, c)),
                Err(_) => {
                    if let Some(chain) = self.chains.get_mut(&m.key) {
                        chain.head = m.before;
                    }
                }
            }
        }
    }

    /// Takes back the groups lent to the earlier holder of client id
    /// `client`, which is gone (its id was claimed again: see
    /// [`Alloc::holder`]; what it posted has landed, by the leases' timing
    /// rule): a group whose primary was never written in the incarnation
    /// it was lent at holds no version and no cursor names it, and is
    /// freed; one written holds a version, linked (garbage collection frees
    /// it) or never linked (lost), and is forgotten. A group whose node
    /// does not answer stays lent, for the id's next holder to try.
    async fn reclaim<M: Memory>(&mut self, mem: &M, client: u16) {
        let lent: Vec<(RemoteAddr, u8)> =
            self.lent.iter().filter(|(_, l)| l.0 == client).map(|(&at, &(_, gc))| (at, gc)).collect();
        let metas =
            join_vec(lent.iter().map(|&(at, _)| read_word(mem, RemoteAddr::new(at.node, at.offset + 8))).collect())
                .await;
        for ((at, gc), meta) in lent.into_iter().zip(metas) {
            let Ok(meta) = meta else { continue };
            self.lent.remove(&at);
            // Mutant `clover-keeps-lent`: a crashed client's pool is lost.
            if buffer::holds_version(meta, gc) || mutant!("clover-keeps-lent") {
                continue;
            }
            let class = self.groups.get(&at).map_or(0, |g| g.0);
            self.paths.reclaimed += 1;
            self.release(mem, Cursor::new(at, gc, class));
        }
    }

    /// Serves an ALLOC: its retires and given-back groups first, then, for
    /// each size class it asks for, up to `nodes[n]` free groups of that
    /// class whose primary is node `n`.
    async fn batch<M: Memory>(&mut self, mem: &M, client: u16, body: &[u8], max: usize) -> Result<Answer, KvError> {
        let nodes = mem.node_count();
        let req = Alloc::decode(body, nodes).ok_or(BAD_REQUEST)?;
        for s in self.skip.iter_mut().chain(self.full.values_mut()) {
            *s = s.saturating_sub(1);
        }
        let primary = |k: &[u8]| node_of(k, 0, nodes);
        let max_key = self.shape.max_key;
        if req.want.iter().any(|w| self.shape.max_class().is_none_or(|max| w.class > max)) {
            return Err(BAD_REQUEST);
        }
        if req.retires.iter().any(|r| {
            r.key.is_empty()
                || r.key.len() > max_key
                || r.old.at.node != primary(&r.key)
                || r.new.at.node != primary(&r.key)
        }) {
            return Err(BAD_REQUEST);
        }
        if req.holder != 0 && self.holders.insert(client, req.holder).is_some_and(|h| h != req.holder) {
            self.reclaim(mem, client).await;
        }
        self.backlog.extend(req.retires);
        for c in req.given {
            if c.at.offset != 0 {
                self.release(mem, c);
            }
        }
        self.cool(mem);
        let each = wire::group_bytes(self.shape.replicas.clamp(1, nodes.min(MAX_REPLICAS)));
        let mut room = max.saturating_sub(wire::ANSWER_HEADER + nodes);
        let mut groups: Vec<Vec<Group>> = Vec::new();
        let (mut recycled, mut refused) = (0u16, None);
        for w in &req.want {
            groups.resize(groups.len().max(w.nodes.len()), Vec::new());
            for (n, &count) in w.nodes.iter().enumerate() {
                let mut left = (count as usize).min(MAX_BATCH.saturating_sub(groups[n].len()));
                while left > 0 && room >= each {
                    let before = self.paths.recycled;
                    match self.group(mem, NodeId(n as u16), w.class).await {
                        Ok(g) => {
                            recycled = recycled.saturating_add((self.paths.recycled - before) as u16);
                            room -= each;
                            // One larger group per node and request: the
                            // client uses it for one write and asks again
                            // (a batch of them each time would pile up in
                            // its pool, out of other clients' reach).
                            // Mutant `clover-larger-batch`: a batch of them.
                            let larger = g.primary.class != w.class && !mutant!("clover-larger-batch");
                            left = if larger { 0 } else { left - 1 };
                            self.lent.insert(g.primary.at, (client, g.primary.gc));
                            groups[n].push(g);
                        }
                        Err(KvError::Down(_)) => break,
                        // (The groups taken so far go out: an error here
                        // would lose them.)
                        Err(e) => {
                            refused = Some(e);
                            break;
                        }
                    }
                }
            }
        }
        if let Some(e) = refused
            && groups.iter().all(|g| g.is_empty())
        {
            return Err(e);
        }
        self.paths.batches += 1;
        Ok(Answer::Buffers { groups, recycled })
    }
}

impl Service for MetadataServer {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Frees what the retires waiting allow, all of them: they come as
    /// fast as versions are written, and a head left behind costs every
    /// restart from it hops. A node down or a garbled word: what a retire
    /// would have freed waits (or is lost: the head is read when later
    /// retires pile up).
    async fn background<M: Memory>(&mut self, mem: &M) -> bool {
        let worked = !self.backlog.is_empty();
        self.free_retired(mem).await;
        worked
    }

    async fn handle<M: Memory>(&mut self, mem: &M, req: Request<'_>, out: &mut Vec<u8>, max: usize) -> Status {
        let key_ok = |k: &[u8]| !k.is_empty() && k.len() <= self.shape.max_key;
        let done = match req.method {
            wire::LOOKUP if key_ok(req.body) => {
                self.head(mem, req.body).await.map(|h| (h.map_or(Answer::Absent, Answer::Head), 0))
            }
            wire::CREATE => match wire::parse_create(req.body) {
                Some((key, value)) => self.create(mem, key, value).await,
                None => Err(BAD_REQUEST),
            },
            // The retires' work is the MS's own bookkeeping, which the
            // client does not wait for: no roundtrips are reported.
            wire::ALLOC => self.batch(mem, req.client, req.body, max).await.map(|a| (a, 0)),
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
