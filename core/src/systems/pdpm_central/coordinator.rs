//! pDPM-Central's coordinator (pDPM §4.2): a [`Service`] on the core's
//! server layer, beside the coordinator's node ([`super::COORDINATOR`]),
//! that owns the index (key -> committed version), allocates and frees all
//! data space, and orders every access to an entry.
//!
//! # State: in the process, with a durable copy on its node
//!
//! The coordinator answers from its process memory (a map of keys to their
//! committed [`Version`]), and keeps the durable copy the paper keeps in
//! its local PM on its own node: the store's index (`RaceIndex`, key ->
//! the key's *cell*), one cell per key (a word: the offset of the key's
//! committed record, stamped, or [`TOMB`]), and one record per committed
//! version ([`Version::encode`]). A write commits when the cell's word is
//! swapped to the new record (a CAS, after the record's WRITE in the same
//! ordered pipeline: the paper's "set meta = new loc + flush"); the index
//! and the records are never changed in place. A restarted coordinator
//! starts with an empty map and loads a key from its node on its first
//! request ([`Paths::loaded`]), so no scan is needed to recover.
//!
//! # Locks
//!
//! The serial server loop ([`crate::substrate::msg::server`] serves one
//! request at a time, to completion) is the writer side of every key's
//! reader-writer lock: two writes of a key, or a write and the answer of a
//! read, never interleave. The reader side outlives the request: a GET
//! read-locks the version it answers for the client, who READs the value
//! from a data node itself (the read's second roundtrip, see
//! [`super::client`]); the lock is released by the client's next request
//! on its channel (it runs one operation at a time, so its next request
//! means its READ is over), so releasing it costs no roundtrip. Writes are
//! out of place, so a read lock never delays a write: it only delays the
//! *free* of a superseded version, which waits until no reader holds it
//! ([`Paths::deferred_frees`]). A client that crashes holding a read lock
//! keeps one version of one key allocated until its id's next request.
//!
//! # Frees
//!
//! A superseded or deleted version's record and copies are freed (to this
//! coordinator's free lists, reused by its next writes) once unlocked.
//! Copies on a node marked down are left alone.
//!
//! A version committed by an earlier incarnation may still be read by that
//! incarnation's readers, whose locks this one does not know. It is freed
//! by this one once those readers' time is over: [`foreign_wait_ns`] after
//! its supersession, [`super::client::answer_lifetime_ns`] and a margin of
//! one memory time-out (and once this incarnation's own readers of it are
//! done, as for its own versions; [`Paths::foreign_frees`]). The earlier
//! incarnation checked the key's cell before each answer it gave, and
//! that check came before the supersession (after it, the cell holds
//! another word), so its readers' calls began before the supersession too;
//! a client drops a READ done later than the answer's lifetime after its
//! call began, and asks again. So every READ whose bytes a client uses
//! sampled the copy before the free. The margin covers the clocks' ticks
//! and rates (each side measures its own intervals; no offsets are
//! compared). An older incarnation that comes back after a newer one
//! began (it was paused) treats the versions it supersedes so too, if
//! the newer one may have answered for them: its commit's pipeline reads
//! the server's state word after the CAS, and one that finds a newer
//! incarnation there does not free the superseded version at once. It
//! never answers for a version the newer one committed (which that one
//! frees at once): it checks the state word after every load, and answers
//! that it is down if a newer one began. Only one incarnation frees a
//! version: the one whose CAS (or delete) moved the key's cell off it. On a memory that keeps no time,
//! such versions are never freed ([`Paths::leaked`]): at most one version
//! per key and takeover.
//!
//! # Replication
//!
//! A write goes to the key's R data nodes in parallel (`node_of(key, i)`),
//! and commits once a majority acknowledged it; the version names only the
//! copies that were acknowledged, so a reader never reads a copy that was
//! not written. A node whose write failed is marked down and skipped
//! ([`Paths::skipped`]) until [`RETRY_TIMEOUTS`] of the memory's time-outs
//! have passed; then the next write of a key on it tries it again beside
//! its other copies, and a node that acknowledges is back in use
//! ([`Paths::readmitted`]; one that does not is marked down again). A
//! write that the nodes up leave short of a majority tries the nodes
//! marked down at once, in a second roundtrip (a node that came back
//! while another failed). A node that comes back holds what it
//! acknowledged before it went down, and only acknowledged copies are
//! named by versions, so nothing it missed is ever read from it. The try
//! costs the one write that makes it the wait for that node's answer (a
//! time-out, if it still hangs), once per interval.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use hashbrown::HashMap;

use super::wire::{self, Answer, Flags, Mode, RECORD_BYTES, Version, value_sum};
use crate::index::{Index, Insert, RaceIndex};
use crate::kv::KvError;
use crate::kv::place::node_of;
use crate::substrate::memory::{read_word, word_at};
use crate::substrate::msg::rpc::Status;
use crate::substrate::msg::server::{Incarnation, Request, Service};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_all, majority};
use crate::substrate::rtt::Counted;
use crate::substrate::space::slab::{SlabAllocator, class_of};
use crate::{MemError, MemErrorKind, Memory, NodeId, Op, OpOutput, RemoteAddr};

/// A cell's word for a deleted key.
pub const TOMB: u64 = 1;
/// The bits of a cell's word that hold its record's offset; the 16 above
/// them hold a stamp, this incarnation's count of commits then.
const RECORD_BITS: u32 = 48;

/// A cell's word for the record at `record`, with `stamp`.
fn cell_word(record: u64, stamp: u16) -> u64 {
    // Mutant `central-unstamped`: a reused record's word is the word it
    // had, and passes a paused incarnation's check for the old version.
    if mutant!("central-unstamped") {
        return record;
    }
    (stamp as u64) << RECORD_BITS | record
}

/// The record a cell's word names.
fn record_of(word: u64) -> u64 {
    word & ((1 << RECORD_BITS) - 1)
}

/// The coordinator's service name, which clients check they connect to.
pub const NAME: &str = "pdpm-central coordinator";

/// What the coordinator did, over its life: what campaigns assert ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Versions committed (writes and inserts).
    pub commits: u64,
    /// Reads answered with a read lock.
    pub read_locks: u64,
    /// Superseded versions freed at once.
    pub frees: u64,
    /// Superseded versions whose free waited for their readers.
    pub deferred_frees: u64,
    /// Superseded versions of an earlier incarnation, freed once their
    /// readers' time was over ([`foreign_wait_ns`]).
    pub foreign_frees: u64,
    /// Superseded versions of an earlier incarnation, never freed (on a
    /// memory that keeps no time).
    pub leaked: u64,
    /// Keys loaded from the coordinator's node (after a restart).
    pub loaded: u64,
    /// Copies not written because their node was down.
    pub skipped: u64,
    /// Writes that failed on a data node (which is then marked down).
    pub failed_copies: u64,
    /// Nodes marked down that acknowledged a write again.
    pub readmitted: u64,
    /// Keys found changed by another incarnation (a paused one that came
    /// back, or a successor), and loaded again.
    pub fenced: u64,
}

/// A key's committed state.
#[derive(Clone, Debug)]
enum State {
    Deleted,
    Live {
        record: u64,
        version: Version,
        /// Committed by this incarnation (its frees are this one's to make).
        ours: bool,
    },
}

#[derive(Clone, Debug)]
struct Key {
    cell: RemoteAddr,
    word: u64,
    state: State,
}

/// The coordinator's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// The node it runs beside (its records, cells and index are there).
    pub node: NodeId,
    /// Copies of each value.
    pub replicas: usize,
    /// Longest key.
    pub max_key: usize,
    /// Largest value.
    pub max_value: usize,
    /// Channels of its server area (client ids `0..channels`).
    pub channels: u16,
}

/// The coordinator's service.
pub struct Coordinator {
    shape: Shape,
    index: RaceIndex,
    slab: SlabAllocator,
    /// Freed objects by node and size class.
    free: HashMap<(u16, usize), Vec<u64>>,
    keys: HashMap<Vec<u8>, Key>,
    /// The record each channel's client read-locks (until its next request).
    holds: Vec<Option<u64>>,
    /// Read locks per record.
    readers: HashMap<u64, u32>,
    /// Superseded versions waiting for their readers, by record.
    retired: HashMap<u64, Version>,
    /// Superseded versions of earlier incarnations, in the order they are
    /// due to be freed: when (the memory's time, ns), record, version.
    foreign: VecDeque<(u64, u64, Version)>,
    /// Per node: since when it is marked down (`None`: up).
    down: Vec<Option<Down>>,
    /// The stamp of the next commit's cell word.
    stamp: u16,
    /// The incarnation serving the request being served.
    incarnation: Option<Incarnation>,
    paths: Paths,
    /// How the request being served went, for its answer.
    flags: Flags,
}

/// Why a request failed: answered as [`OWN_NODE`] with the error
/// ([`wire::encode_failure`]), or [`Status::BadRequest`] for
/// [`BAD_REQUEST`].
type Failed = KvError;

/// A request that is not what its method takes.
const BAD_REQUEST: KvError = KvError::Bug("a malformed request");
/// A failed operation on the coordinator's own node, or a record there
/// that cannot be right.
const OWN_NODE: KvError = KvError::Unavailable;
/// Tries of a request whose key another incarnation changed under it.
const TRIES: usize = 4;
/// Time-outs of the memory after which a node marked down is tried again.
pub const RETRY_TIMEOUTS: u64 = 2;
/// Writes that skip a node marked down before it is tried again, on a
/// memory that keeps no time.
const RETRY_SKIPS: u32 = 64;
/// How long after superseding a version of an earlier incarnation this one
/// frees it ("Frees"), ns: the answers' lifetime, and a memory time-out.
pub fn foreign_wait_ns<M: Memory>(mem: &M, channels: u16) -> u64 {
    super::client::answer_lifetime_ns(mem, channels).saturating_add(mem.timeout_ns().unwrap_or(0))
}

/// When a data node was marked down, and what skipped it since.
#[derive(Clone, Copy, Debug)]
struct Down {
    /// The memory's time then, ns (`None`: it keeps none).
    since: Option<u64>,
    /// Copies not written to it since.
    skipped: u32,
}

impl Coordinator {
    /// A coordinator of shape `shape` over the store's `index` (opened on
    /// its node).
    pub fn new(shape: Shape, index: RaceIndex) -> Self {
        Coordinator {
            shape,
            index,
            slab: SlabAllocator::new(),
            free: HashMap::new(),
            keys: HashMap::new(),
            holds: (0..shape.channels).map(|_| None).collect(),
            readers: HashMap::new(),
            retired: HashMap::new(),
            foreign: VecDeque::new(),
            down: Vec::new(),
            stamp: 0,
            incarnation: None,
            paths: Paths::default(),
            flags: Flags::default(),
        }
    }

    /// Another incarnation kept changing a key under this one: it was
    /// superseded. Answered as its node being unreachable (the client's
    /// operation did not take effect; its next call reconnects, to the
    /// new incarnation).
    fn superseded(&self) -> KvError {
        KvError::Down(MemError::new(self.shape.node, MemErrorKind::Unreachable))
    }

    /// Whether no newer incarnation has begun (read locally; outside a
    /// server, taken as so).
    async fn current<M: Memory>(&self, mem: &M) -> Result<bool, Failed> {
        let Some(i) = self.incarnation else { return Ok(true) };
        Ok(read_word(mem, i.word).await.map_err(|_| OWN_NODE)? == i.running)
    }

    /// The read of the incarnation's state word that rides, last, in a
    /// commit's pipeline on this node (none outside a server).
    fn state_read(&self) -> Option<Op<'static>> {
        let i = self.incarnation.filter(|i| i.word.node == self.shape.node)?;
        Some(Op::Read { offset: i.word.offset, len: 8 })
    }

    /// Whether a newer incarnation had begun when the pipeline whose
    /// outputs are `out` ran ([`Self::state_read`] last), or, had none
    /// ridden, by now. A version a commit superseded then may have been
    /// answered for by that incarnation, whose readers this one does not
    /// know: it is freed as an earlier incarnation's is ("Frees").
    async fn superseded_by_commit<M: Memory>(&self, mem: &M, out: &[OpOutput<M::Buf>]) -> Result<bool, Failed> {
        // Mutant `central-frees-after-takeover`: a version superseded by a
        // commit is freed at once, even after a successor may have
        // answered for it.
        let Some(i) = self.incarnation.filter(|_| !mutant!("central-frees-after-takeover")) else { return Ok(false) };
        if self.state_read().is_none() {
            return Ok(!self.current(mem).await?);
        }
        let word = out.last().and_then(|o| o.read()).and_then(|b| word_at(b, 0));
        Ok(word != Some(i.running))
    }

    /// What it did so far.
    pub fn paths(&self) -> Paths {
        self.paths
    }

    /// Read locks held now.
    pub fn locks_held(&self) -> usize {
        self.holds.iter().flatten().count()
    }

    async fn alloc<M: Memory>(&mut self, mem: &M, node: NodeId, size: u64) -> Result<RemoteAddr, Failed> {
        let (class, _) = class_of(size.max(1)).ok_or(KvError::BadConfig("values too large for the nodes' chunks"))?;
        if let Some(off) = self.free.get_mut(&(node.0, class)).and_then(|l| l.pop()) {
            return Ok(RemoteAddr::new(node, off));
        }
        Ok(self.slab.alloc(mem, node, size.max(1)).await?)
    }

    fn free(&mut self, addr: RemoteAddr, size: u64) {
        if let Some((class, _)) = class_of(size.max(1)) {
            self.free.entry((addr.node.0, class)).or_default().push(addr.offset);
        }
    }

    fn free_version(&mut self, record: u64, v: &Version) {
        self.free(RemoteAddr::new(self.shape.node, record), RECORD_BYTES as u64);
        for &c in &v.copies {
            if !self.is_down(c.node) {
                self.free(c, self.copy_bytes());
            }
        }
    }

    /// Bytes of every copy: room for the largest value, as RAW's registers,
    /// so that a copy freed by one write fits any later one.
    fn copy_bytes(&self) -> u64 {
        self.shape.max_value.max(1) as u64
    }

    fn is_down(&self, node: NodeId) -> bool {
        matches!(self.down.get(node.index()), Some(Some(_)))
    }

    /// Marks `node` down from now.
    fn mark_down<M: Memory>(&mut self, mem: &M, node: NodeId) {
        if let Some(d) = self.down.get_mut(node.index()) {
            *d = Some(Down { since: mem.now_ns(), skipped: 0 });
        }
    }

    /// Whether a write skips `node`, marked down and not due for another
    /// try ([`RETRY_TIMEOUTS`]); counts the skip.
    fn skips<M: Memory>(&mut self, mem: &M, node: NodeId) -> bool {
        let Some(Some(d)) = self.down.get_mut(node.index()) else { return false };
        let due = match (d.since, mem.now_ns(), mem.timeout_ns()) {
            (Some(since), Some(now), Some(t)) => now.saturating_sub(since) >= RETRY_TIMEOUTS.saturating_mul(t),
            _ => d.skipped >= RETRY_SKIPS,
        };
        d.skipped = d.skipped.saturating_add(1);
        // Mutant `central-no-readmit`: a node marked down is never due
        // (tried again only by a write that has no majority without it).
        let due = due && !mutant!("central-no-readmit");
        if due {
            // Tried by this write; marked down again if it fails.
            *d = Down { since: mem.now_ns(), skipped: 0 };
        }
        !due
    }

    /// A superseded version: freed now or once its readers are done; an
    /// earlier incarnation's once its readers' time is over too, or never
    /// on a memory that keeps no time ("Frees").
    fn retire<M: Memory>(&mut self, mem: &M, state: State) {
        let State::Live { record, version, ours } = state else { return };
        if !ours {
            match mem.now_ns() {
                Some(now) => {
                    // Mutant `central-frees-foreign-at-once`: due at once,
                    // while the earlier incarnation's readers may still
                    // READ its copies.
                    let wait = if mutant!("central-frees-foreign-at-once") {
                        0
                    } else {
                        foreign_wait_ns(mem, self.shape.channels)
                    };
                    self.foreign.push_back((now.saturating_add(wait), record, version));
                }
                None => self.paths.leaked += 1,
            }
        } else {
            self.free_unlocked(record, version);
        }
    }

    /// Frees a superseded version now, or once no reader holds it.
    fn free_unlocked(&mut self, record: u64, version: Version) {
        if self.readers.get(&record).copied().unwrap_or(0) > 0 {
            self.paths.deferred_frees += 1;
            self.flags.deferred = true;
            self.retired.insert(record, version);
        } else {
            self.paths.frees += 1;
            self.free_version(record, &version);
        }
    }

    /// Frees the earlier incarnations' versions that are due (once this
    /// one's own readers of them are done).
    fn free_foreign<M: Memory>(&mut self, mem: &M) {
        let Some(now) = mem.now_ns() else { return };
        while self.foreign.front().is_some_and(|&(due, _, _)| due <= now) {
            let Some((_, record, version)) = self.foreign.pop_front() else { break };
            self.paths.foreign_frees += 1;
            self.flags.foreign_freed = true;
            self.free_unlocked(record, version);
        }
    }

    /// Releases the read lock of channel `c`'s client: its previous
    /// operation is over.
    fn release(&mut self, c: u16) {
        let Some(record) = self.holds.get_mut(c as usize).and_then(|h| h.take()) else { return };
        let left = match self.readers.get_mut(&record) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => return,
        };
        if left == 0 {
            self.readers.remove(&record);
            if let Some(v) = self.retired.remove(&record) {
                self.free_version(record, &v);
            }
        }
    }

    /// Makes sure the map knows `key` if the node's index does (loading it
    /// after a restart); whether it exists.
    async fn load<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<bool, Failed> {
        if self.keys.contains_key(key) {
            return Ok(true);
        }
        let Some(entry) = self.index.lookup(mem, key).await.map_err(KvError::from)? else { return Ok(false) };
        let cell = wire::decode_location(entry.location, mem.node_count())
            .filter(|c| c.node == self.shape.node)
            .ok_or(OWN_NODE)?;
        let word = read_word(mem, cell).await.map_err(|_| OWN_NODE)?;
        let state = match word {
            // An insert that never committed leaves no cell behind (the cell
            // is written before the index names it): as deleted.
            0 | TOMB => State::Deleted,
            word => {
                let record = record_of(word);
                let at = RemoteAddr::new(self.shape.node, record);
                let b = mem.read(at, RECORD_BYTES).await.map_err(|_| OWN_NODE)?;
                let version = Version::decode(&b, mem.node_count(), self.shape.max_value).ok_or(OWN_NODE)?;
                State::Live { record, version, ours: false }
            }
        };
        self.paths.loaded += 1;
        self.keys.insert(key.to_vec(), Key { cell, word, state });
        // What it loaded may have been committed by a newer incarnation,
        // whose readers this one does not know (and whose versions it
        // must not answer for, as that one frees its own at once): this
        // one is then superseded. An incarnation still current after the
        // load read what it loaded before any newer one began.
        if !self.current(mem).await? {
            self.keys.remove(key);
            return Err(self.superseded());
        }
        Ok(true)
    }

    /// Whether the key's cell still holds the word the map has for it (a
    /// local read): an answer taken from the map is checked so before it
    /// is given, and takes effect at that read. If not, another
    /// incarnation changed the key (this one was paused and superseded, or
    /// one paused before this one started committed late): the key is
    /// dropped from the map, to be loaded again.
    async fn still<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<bool, Failed> {
        let k = &self.keys[key];
        let (cell, word) = (k.cell, k.word);
        // The mutant trusts the map: a paused incarnation's stale answer,
        // or a late commit its successor never sees.
        if mutant!("central-no-fence") || read_word(mem, cell).await.map_err(|_| OWN_NODE)? == word {
            return Ok(true);
        }
        self.stale(key);
        Ok(false)
    }

    /// The key's cell was changed by another incarnation: forget what the
    /// map says (its versions are not this one's to free any more).
    fn stale(&mut self, key: &[u8]) {
        self.paths.fenced += 1;
        self.flags.fenced = true;
        self.keys.remove(key);
    }

    async fn get<M: Memory>(&mut self, mem: &M, c: u16, key: &[u8]) -> Result<Answer, Failed> {
        for _ in 0..TRIES {
            if !self.load(mem, key).await? {
                return Ok(Answer::Absent);
            }
            // Checked even right after a load: the load read the cell,
            // then the record; the cell still holding the same stamped
            // word means it held it all along, so the record read was not
            // of a reuse by another incarnation.
            if self.still(mem, key).await? {
                return Ok(self.answer(c, key));
            }
        }
        Err(self.superseded())
    }

    /// The answer to a get of `key` from the map (checked), read-locking
    /// the version it names for channel `c`'s client.
    fn answer(&mut self, c: u16, key: &[u8]) -> Answer {
        let (record, version) = match &self.keys[key].state {
            State::Deleted => return Answer::Deleted,
            State::Live { record, version, .. } => (*record, version.clone()),
        };
        // Mutant `central-no-rdlock`: the answer is given without a read
        // lock, so a write frees the version while the client still reads
        // it, and the next write may reuse its copies.
        if !mutant!("central-no-rdlock") {
            *self.readers.entry(record).or_insert(0) += 1;
            if let Some(h) = self.holds.get_mut(c as usize) {
                *h = Some(record);
            }
            self.paths.read_locks += 1;
        }
        Answer::Found(version)
    }

    /// Writes `value` to the key's live data nodes in parallel: its copies
    /// (a majority at least), and the roundtrips it took. If the nodes up
    /// do not make a majority, the nodes marked down are tried too, in a
    /// second roundtrip: a node that came back is then taken back at once,
    /// rather than after the retry interval.
    async fn write_copies<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        value: &[u8],
    ) -> Result<(heapless::Vec<RemoteAddr, MAX_REPLICAS>, u8), Failed> {
        let nodes = mem.node_count();
        if self.down.len() < nodes {
            self.down.resize(nodes, None);
        }
        let counted = Counted::new(mem);
        let mut first: heapless::Vec<NodeId, MAX_REPLICAS> = heapless::Vec::new();
        let mut skipped: heapless::Vec<NodeId, MAX_REPLICAS> = heapless::Vec::new();
        for i in 0..self.shape.replicas.min(nodes) {
            let node = node_of(key, i, nodes);
            let _ = if self.skips(mem, node) { skipped.push(node) } else { first.push(node) };
        }
        let need = majority(self.shape.replicas.min(nodes)).max(1);
        let mut copies = self.write_to(mem, &counted, &first, value).await?;
        // Mutant `central-skips-short`: a write short of a majority fails
        // rather than try the nodes marked down.
        if copies.len() < need && !skipped.is_empty() && !mutant!("central-skips-short") {
            let more = self.write_to(mem, &counted, &skipped, value).await?;
            copies.extend(more);
        } else {
            self.paths.skipped += skipped.len() as u64;
        }
        let rounds = counted.roundtrips().min(u8::MAX as u32) as u8;
        if copies.len() < need {
            for &c in &copies {
                self.free(c, self.copy_bytes());
            }
            return Err(KvError::Unavailable);
        }
        Ok((copies, rounds))
    }

    /// Writes `value` to a new copy on each of `nodes` in parallel: the
    /// copies that were acknowledged. A node that fails is marked down; a
    /// node marked down that acknowledges is up again.
    async fn write_to<M: Memory>(
        &mut self,
        mem: &M,
        counted: &Counted<&M>,
        nodes: &[NodeId],
        value: &[u8],
    ) -> Result<heapless::Vec<RemoteAddr, MAX_REPLICAS>, Failed> {
        let mut targets: heapless::Vec<RemoteAddr, MAX_REPLICAS> = heapless::Vec::new();
        for &node in nodes {
            match self.alloc(counted, node, self.copy_bytes()).await {
                Ok(a) => targets.push(a).map_err(|_| OWN_NODE)?,
                Err(KvError::Down(_)) => {
                    self.mark_down(mem, node);
                    self.paths.failed_copies += 1;
                }
                Err(e) => {
                    for &t in &targets {
                        self.free(t, self.copy_bytes());
                    }
                    return Err(e);
                }
            }
        }
        let futs: heapless::Vec<_, MAX_REPLICAS> = targets.iter().map(|&a| counted.write(a, value)).collect();
        let replies = join_all(futs).await;
        let mut copies = heapless::Vec::new();
        for (i, r) in replies.results.into_iter().enumerate() {
            match r {
                Some(Ok(())) => {
                    let _ = copies.push(targets[i]);
                    if let Some(d) = self.down.get_mut(targets[i].node.index()).filter(|d| d.is_some()) {
                        *d = None;
                        self.paths.readmitted += 1;
                        self.flags.readmitted = true;
                    }
                }
                Some(Err(e)) => {
                    // Maybe applied later (a stall): the block is left alone.
                    if matches!(e.kind, MemErrorKind::Unreachable | MemErrorKind::TimedOut) {
                        self.mark_down(mem, targets[i].node);
                    }
                    self.paths.failed_copies += 1;
                }
                None => self.paths.failed_copies += 1,
            }
        }
        Ok(copies)
    }

    async fn put<M: Memory>(&mut self, mem: &M, mode: Mode, key: &[u8], value: &[u8]) -> Result<(Answer, u8), Failed> {
        if key.is_empty() || key.len() > self.shape.max_key || value.len() > self.shape.max_value {
            return Err(BAD_REQUEST);
        }
        for _ in 0..TRIES {
            if let Some(done) = self.put_once(mem, mode, key, value).await? {
                return Ok(done);
            }
        }
        Err(self.superseded())
    }

    /// One try of [`Self::put`]: `None` if another incarnation changed
    /// the key since the map learnt it (nothing was committed; the key is
    /// to be loaded again).
    async fn put_once<M: Memory>(
        &mut self,
        mem: &M,
        mode: Mode,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<(Answer, u8)>, Failed> {
        let known = self.load(mem, key).await?;
        let live = known && matches!(self.keys[key].state, State::Live { .. });
        if mode == Mode::Update && !live {
            // Unknown to the index (a fresh lookup), or deleted as the map
            // says, checked.
            let fresh = !known || self.still(mem, key).await?;
            return Ok(fresh.then_some((Answer::NotFound, 0)));
        }
        let node = self.shape.node;
        let (copies, rounds) = self.write_copies(mem, key, value).await?;
        let record = match self.alloc(mem, node, RECORD_BYTES as u64).await {
            Ok(r) => r,
            Err(e) => {
                for &c in &copies {
                    self.free(c, self.copy_bytes());
                }
                return Err(e);
            }
        };
        let version = Version { len: value.len() as u32, sum: value_sum(value), copies };
        let bytes = version.encode();
        let new = State::Live { record: record.offset, version, ours: true };
        self.stamp = self.stamp.wrapping_add(1);
        let stamped = cell_word(record.offset, self.stamp);
        if known {
            // The commit: the record, then the cell's CAS, in one pipeline.
            let (cell, word) = (self.keys[key].cell, self.keys[key].word);
            let mut ops: heapless::Vec<Op<'_>, 3> = heapless::Vec::new();
            let _ = ops.push(Op::Write { offset: record.offset, data: &bytes });
            let _ = ops.push(Op::Cas { offset: cell.offset, expected: word, new: stamped });
            if let Some(read) = self.state_read() {
                let _ = ops.push(read);
            }
            let out = mem.pipeline(node, &ops).await.map_err(|_| OWN_NODE)?;
            if out.get(1).and_then(|o| o.cas()) != Some(word) {
                // Another incarnation committed meanwhile: nothing of this
                // try was published.
                self.free_version(record.offset, &version_of(&new));
                self.stale(key);
                return Ok(None);
            }
            let shared = self.superseded_by_commit(mem, &out).await?;
            let k = self.keys.get_mut(key).ok_or(OWN_NODE)?;
            k.word = stamped;
            let old = core::mem::replace(&mut k.state, new);
            self.retire(mem, shared_with_successor(old, shared));
        } else {
            // A new key: its cell, written before the index names it.
            let cell = match self.alloc(mem, node, 8).await {
                Ok(c) => c,
                Err(e) => {
                    self.free_version(record.offset, &version_of(&new));
                    return Err(e);
                }
            };
            let ops = [
                Op::Write { offset: record.offset, data: &bytes },
                Op::Write { offset: cell.offset, data: &stamped.to_le_bytes() },
            ];
            mem.pipeline(node, &ops).await.map_err(|_| OWN_NODE)?;
            match self.index.insert(mem, key, wire::location(cell)).await.map_err(KvError::from)? {
                Insert::New(_) => {}
                Insert::Exists(_) => {
                    // Another incarnation inserted it meanwhile.
                    self.free_version(record.offset, &version_of(&new));
                    self.free(cell, 8);
                    self.paths.fenced += 1;
                    self.flags.fenced = true;
                    return Ok(None);
                }
            }
            self.keys.insert(key.to_vec(), Key { cell, word: stamped, state: new });
        }
        self.paths.commits += 1;
        Ok(Some((Answer::Written, rounds)))
    }

    async fn delete<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Answer, Failed> {
        for _ in 0..TRIES {
            if let Some(done) = self.delete_once(mem, key).await? {
                return Ok(done);
            }
        }
        Err(self.superseded())
    }

    /// One try of [`Self::delete`], as [`Self::put_once`].
    async fn delete_once<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Option<Answer>, Failed> {
        if !self.load(mem, key).await? {
            return Ok(Some(Answer::NotFound));
        }
        if matches!(self.keys[key].state, State::Deleted) {
            return Ok(self.still(mem, key).await?.then_some(Answer::NotFound));
        }
        let (cell, word) = (self.keys[key].cell, self.keys[key].word);
        let mut ops: heapless::Vec<Op<'_>, 2> = heapless::Vec::new();
        let _ = ops.push(Op::Cas { offset: cell.offset, expected: word, new: TOMB });
        if let Some(read) = self.state_read() {
            let _ = ops.push(read);
        }
        let out = mem.pipeline(cell.node, &ops).await.map_err(|_| OWN_NODE)?;
        if out.first().and_then(|o| o.cas()) != Some(word) {
            self.stale(key);
            return Ok(None);
        }
        let shared = self.superseded_by_commit(mem, &out).await?;
        let k = self.keys.get_mut(key).ok_or(OWN_NODE)?;
        k.word = TOMB;
        let old = core::mem::replace(&mut k.state, State::Deleted);
        self.retire(mem, shared_with_successor(old, shared));
        Ok(Some(Answer::Written))
    }
}

/// A superseded state, as an earlier incarnation's if a newer one may
/// have answered for it (`shared`).
fn shared_with_successor(state: State, shared: bool) -> State {
    match state {
        State::Live { record, version, .. } if shared => State::Live { record, version, ours: false },
        s => s,
    }
}

/// The version of a live state (an empty one otherwise).
fn version_of(s: &State) -> Version {
    match s {
        State::Live { version, .. } => version.clone(),
        State::Deleted => Version { len: 0, sum: 0, copies: heapless::Vec::new() },
    }
}

impl Service for Coordinator {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn handle<M: Memory>(&mut self, mem: &M, req: Request<'_>, out: &mut Vec<u8>, _max: usize) -> Status {
        // Any request of a client ends its previous operation.
        self.release(req.client);
        self.incarnation = req.incarnation;
        self.flags = Flags::default();
        self.free_foreign(mem);
        let key_ok = |k: &[u8]| !k.is_empty() && k.len() <= self.shape.max_key;
        let done = match req.method {
            wire::GET if key_ok(req.body) => self.get(mem, req.client, req.body).await.map(|a| (a, 0)),
            wire::DELETE if key_ok(req.body) => self.delete(mem, req.body).await.map(|a| (a, 0)),
            wire::PUT => match wire::parse_put(req.body) {
                Some((mode, key, value)) => self.put(mem, mode, key, value).await,
                None => Err(BAD_REQUEST),
            },
            wire::GET | wire::DELETE => Err(BAD_REQUEST),
            _ => return Status::NoSuchMethod,
        };
        match done {
            Ok((answer, rounds)) => {
                answer.encode(rounds, self.flags, out);
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
