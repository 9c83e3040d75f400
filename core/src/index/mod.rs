//! A RACE-style hash index on a memory node, and a client-side location
//! cache (issue #4, item 2).
//!
//! The index maps a key (bytes, up to a configured maximum of at most 255)
//! to a *location*: a non-zero `u64` the caller chooses and the index treats
//! as opaque (for SWARM-KV, the offset of the key's replicated object
//! descriptor). It is the hash index of RACE (Zuo et al., ATC'21), as FUSEE
//! uses it (`papers/fusee.txt` §4.2, notes §2): one-sided READs and CAS
//! only, no CPU on the memory node.
//!
//! **It lives on one memory node** (`RaceIndex::open(mem, node)`); the
//! memory node is a single point of failure for the mapping until the index
//! is replicated (FUSEE's SNAPSHOT, a later issue). SWARM §5 also assumes a
//! reliable index.
//!
//! # Layout on the node
//!
//! Region root slot [`roots::INDEX`](crate::substrate::space::roots::INDEX) holds the offset of the index header, set once by CAS
//! ([`RaceIndex::open_or_create`]). The header and the bucket array are one
//! run of whole chunks ([`crate::substrate::space::region::Region::alloc_chunks`]):
//!
//! ```text
//! header   magic "SWIDXRC1", version, groups, max key, hash seed,
//!          bucket array offset, region size, checksum          (64 B)
//! group g  [main bucket 2g][overflow bucket][main bucket 2g+1]  (3 × 64 B)
//! bucket   8 slots of 8 bytes (one cache line)
//! slot     fingerprint:8 | key length:8 | tombstone:1 | block offset / 64 : 47
//!          0 = empty (never used)
//! block    "SWIB" | key length, location, key (padded), xxh3 checksum
//! ```
//!
//! A key hashes (xxh3 with two seeds) to two different main buckets; each
//! main bucket and the overflow bucket it shares with its neighbour are
//! adjacent, so a *combined bucket* is one 128-byte READ and a key's two
//! candidate groups are two READs posted together: one roundtrip. Key blocks
//! are allocated by the client from chunks of the same node (so a block
//! write and the slot CAS that publishes it form one ordered pipeline) and
//! never change once published. A lookup reads both combined buckets, then
//! the blocks of the live slots whose fingerprint and length match (almost
//! always just the key's own), and confirms the key bytes and checksum.
//!
//! # Concurrent inserts of one key: the rule
//!
//! RACE re-reads the buckets after its CAS and keeps the duplicate in the
//! smallest slot. That rule alone is not safe: a client A that read the
//! buckets before B inserted the same key, and CASes a smaller slot after B
//! re-read, returned, and was found by lookups, would make A's insert win
//! over B's *completed* one (and no fixed tie-break works when two inserters
//! cannot know whether the other already returned). This index makes
//! duplicates impossible instead, with two rules:
//!
//! 1. **A slot, once used by a key, belongs to that key forever.** A removal
//!    does not CAS the slot to 0 but to a *tombstone* (the same word with
//!    the tombstone bit: it still points to the key's last block, so it
//!    still names the key). Only an insert of that same key may take a
//!    tombstone back; other keys only take empty (never used) slots.
//! 2. **An insert takes the first slot it may take in the key's fixed
//!    candidate order** ([`layout::Geometry::candidates`]: both main buckets
//!    interleaved, then both overflow buckets; a fixed function of the key,
//!    which also fills the less loaded main bucket first), and a failed CAS
//!    updates its view of that slot and goes on (no re-read).
//!
//! Why two inserts of key *k* can never both succeed in different slots
//! `a < b` (in *k*'s order), with *k* present in both: a slot's value never
//! repeats (block pointers are unique, and a slot never goes back to 0), so
//! A's successful CAS on `a` means `a` held one value, free for *k*, from
//! A's read of `a` until A's CAS. B skipped `a`, so B's read of `a` saw it
//! not free for *k*: either in use by another key (then it never becomes
//! free for *k*, and A could not have taken it), or holding *k* (then B
//! found *k* and did not insert). So every key has at most one live slot at
//! all times, concurrent inserts of a key meet on one slot and the CAS picks
//! one winner, the others return [`Insert::Exists`], and each insert takes
//! effect at its CAS, as do updates and removals: the index is linearizable
//! (the simulator campaigns check this with `swarm_lincheck`). No
//! re-read is needed, so a fresh insert is two roundtrips.
//!
//! The price: slots are never recycled for *other* keys. A key that is
//! removed and inserted again reuses its slot, but an index that sees
//! unboundedly many distinct keys fills up ([`IndexError::Full`]), like the
//! never-recycled memory of the papers (SWARM §4.5). Recycling tombstones
//! safely needs a quiescence or epoch scheme (unfinished).
//!
//! # Roundtrips (measured in `tests.rs` with [`crate::substrate::rtt::Counted`])
//!
//! | operation | roundtrips |
//! |---|---|
//! | lookup, key present | 2 (read both groups; read the key block) |
//! | lookup, key absent | 1 (usually no fingerprint matches) |
//! | insert of a new key | 2 (read both groups; write block + CAS, one ordered pipeline) |
//! | insert of a present key | 2 (it answers [`Insert::Exists`]) |
//! | update / remove by key | 3 (a lookup, then write block + CAS) |
//! | update / remove with [`Expect::Entry`] | 1 (write block + CAS) |
//! | [`Index::still`] (is a cached entry current?) | 1 |
//! | [`Index::remove_background`] | 0 |
//! | location cache hit (`cache::LocationCache`, `locate`) | 0 |
//!
//! Fingerprint collisions with other keys add one roundtrip (their blocks
//! are read with the key's own, in parallel); so does re-inserting a removed
//! key whose tombstone comes before every empty slot.
//!
//! # Untrusted memory
//!
//! Every word and block read is decoded with bounds checks: a slot whose
//! pointer leaves the region, a block with a bad header, length or
//! checksum, or a garbled header gives [`IndexError::Corrupt`], never a
//! panic. Slots of other keys (other fingerprint or length) are never
//! followed, so garbage there only makes them look used.

mod layout;
mod probe;
mod race;
pub mod snapshot;
#[cfg(test)]
mod tests;

#[cfg(feature = "alloc")]
pub mod cache;

use core::fmt;
use core::future::Future;

pub use layout::{
    BLOCK_ALIGN, Block, CANDIDATES, Candidate, GROUP_BYTES, Geometry, HEADER_BYTES, KeyHash, MAX_KEY, SLOTS_PER_BUCKET,
    SlotWord, block_alloc, block_len,
};
pub use race::{IndexConfig, MAX_ATTEMPTS, RaceIndex};
pub use snapshot::{SnapshotConfig, SnapshotIndex};

use crate::substrate::space::region::RegionError;
use crate::{MemError, Memory, NodeId, RemoteAddr};

/// A key's mapping as one client saw it: its location, and the slot that
/// holds it with the slot's value (a hint for [`Expect::Entry`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Entry {
    /// The location the key maps to.
    pub location: u64,
    /// The slot.
    pub slot: RemoteAddr,
    /// The slot's value when seen; changes with every update.
    pub word: u64,
}

/// What an insert did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Insert {
    /// The key was absent and now maps to the given location.
    New(Entry),
    /// The key was present; nothing changed. Its current mapping.
    Exists(Entry),
}

impl Insert {
    /// The key's mapping after the insert.
    pub fn entry(&self) -> Entry {
        match *self {
            Insert::New(e) | Insert::Exists(e) => e,
        }
    }
}

/// The condition of an update or a removal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Expect {
    /// Whatever the key maps to.
    Any,
    /// Only if the key maps to this location.
    Location(u64),
    /// Only if the key's mapping is still exactly this one (from a lookup,
    /// insert or update of this key on this index): one roundtrip, no lookup.
    Entry(Entry),
}

/// What an update or a removal did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Change {
    /// Done. `previous` is the location replaced (or removed); `now` the new
    /// mapping (`None` after a removal).
    Done {
        /// The location before.
        previous: u64,
        /// The mapping after.
        now: Option<Entry>,
    },
    /// The key is not in the index; nothing changed.
    NotFound,
    /// The key maps to something else than expected; nothing changed.
    Mismatch {
        /// Its current mapping.
        current: Entry,
    },
}

/// A failed index operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IndexError {
    /// A memory operation failed; the operation may or may not have taken
    /// effect if [`MemError::may_have_applied`].
    Mem(MemError),
    /// Allocating the index or a key block failed.
    Region(RegionError),
    /// The key is longer than the index's limit.
    KeyTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// Location 0 (reserved) was given.
    ZeroLocation,
    /// Every candidate slot of the key (both main buckets and both overflow
    /// buckets) belongs to other keys.
    Full {
        /// The index's node.
        node: NodeId,
    },
    /// The node has no index (root slot unset).
    NoIndex {
        /// The node.
        node: NodeId,
    },
    /// A configuration the layout cannot hold.
    BadConfig(&'static str),
    /// An [`Expect::Entry`] that is not a mapping of this key in this index.
    BadEntry,
    /// Remote data that cannot be right.
    Corrupt {
        /// The node.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The slots kept changing under this client (other clients' CAS won
    /// every time, [`MAX_ATTEMPTS`] times in a row).
    Contended,
    /// A replica of a replicated index failed or timed out during a write:
    /// the write may or may not take effect (its round may be completed by
    /// another client later).
    Unavailable(MemError),
    /// The replicated index's key-block arena could not give a block.
    Arena(snapshot::arena::ArenaError),
    /// The replicated index changed its view (a replica was left out) more
    /// often than an operation retries; nothing of it took effect unless a
    /// write's outcome was in doubt (then [`IndexError::Unavailable`]).
    ViewChanged,
}

impl From<MemError> for IndexError {
    fn from(e: MemError) -> Self {
        IndexError::Mem(e)
    }
}

impl From<RegionError> for IndexError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Mem(m) => IndexError::Mem(m),
            e => IndexError::Region(e),
        }
    }
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::Mem(e) => write!(f, "{e}"),
            IndexError::Region(e) => write!(f, "{e}"),
            IndexError::KeyTooLong { len, max } => {
                write!(f, "index keys may have up to {max} bytes, this one has {len}")
            }
            IndexError::ZeroLocation => write!(f, "location 0 is reserved"),
            IndexError::Full { node } => write!(f, "{node}: index is full (every candidate slot of the key is taken)"),
            IndexError::NoIndex { node } => {
                write!(f, "{node}: no index (root slot {} is unset)", crate::substrate::space::roots::INDEX.slot)
            }
            IndexError::BadConfig(what) => write!(f, "bad index configuration: {what}"),
            IndexError::BadEntry => write!(f, "the entry is not a mapping of this key in this index"),
            IndexError::Corrupt { node, what } => write!(f, "{node}: corrupt index: {what}"),
            IndexError::Contended => write!(f, "index slots kept changing; gave up"),
            IndexError::Unavailable(e) => write!(f, "an index replica failed during a write: {e}"),
            IndexError::Arena(e) => write!(f, "{e}"),
            IndexError::ViewChanged => write!(f, "the index's replicas kept changing (failures); gave up"),
        }
    }
}

impl core::error::Error for IndexError {}

/// A key -> location index on memory nodes, as SWARM-KV uses it.
///
/// A handle is one client's (`&mut self`: it allocates from its own
/// chunks); operations of different handles may run concurrently and are
/// linearizable. Memory is passed to each call, as everywhere in the core,
/// so that a caller can wrap it (e.g. in [`crate::substrate::rtt::Counted`]).
pub trait Index {
    /// The longest key accepted.
    fn max_key(&self) -> usize;

    /// Maps `key` to `location` (non-zero) if the key is absent.
    fn insert<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
    ) -> impl Future<Output = Result<Insert, IndexError>>;

    /// [`Index::insert`], but the mapping is published only after `ready`
    /// completes with `true`; with `false` nothing is published and the
    /// answer is `Ok(None)`. An index should run `ready` in parallel with its
    /// own first roundtrip: SWARM-KV writes a new key's value while the
    /// index finds it a slot, and publishes it written (§5.3.1). `ready`
    /// goes down the index's levels by value, and each `async fn` among
    /// them holds it twice (rust-lang/rust#62958): a large one should come
    /// boxed.
    fn insert_after<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        ready: impl Future<Output = bool>,
    ) -> impl Future<Output = Result<Option<Insert>, IndexError>> {
        async move {
            if !ready.await {
                return Ok(None);
            }
            self.insert(mem, key, location).await.map(Some)
        }
    }

    /// The key's mapping, if any.
    fn lookup<M: Memory>(&mut self, mem: &M, key: &[u8]) -> impl Future<Output = Result<Option<Entry>, IndexError>>;

    /// Maps a present `key` to `location` (non-zero) instead, if `expect` holds.
    fn update<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
        location: u64,
    ) -> impl Future<Output = Result<Change, IndexError>>;

    /// Unmaps `key`, if `expect` holds.
    fn remove<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
    ) -> impl Future<Output = Result<Change, IndexError>>;

    /// Whether `key` still maps exactly as `entry` says (one READ of its
    /// slot): a cached entry checked without a lookup.
    fn still<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        entry: &Entry,
    ) -> impl Future<Output = Result<bool, IndexError>>;

    /// Unmaps `key` if its mapping is still `entry`, in the background (no
    /// roundtrip, no answer; lost if this client or the node fails): SWARM-KV
    /// unmaps a deleted key this way (§5.3).
    fn remove_background<M: Memory>(&mut self, mem: &M, key: &[u8], entry: &Entry) -> Result<(), IndexError>;
}

/// Where a key was found by [`locate`].
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Located {
    /// The location.
    pub location: u64,
    /// It came from the cache (no roundtrip; possibly stale), not the index.
    pub cached: bool,
}

/// Finds `key` in `cache` (no roundtrip), or else in `index` (caching what
/// it finds, with `payload`). A cached location may be stale: the caller
/// checks what it finds there and [`cache::LocationCache::remove`]s it if
/// it was.
#[cfg(feature = "alloc")]
pub async fn locate<I: Index, M: Memory, P>(
    index: &mut I,
    mem: &M,
    cache: &mut cache::LocationCache<P>,
    key: &[u8],
    payload: P,
) -> Result<Option<Located>, IndexError> {
    if let Some((location, _)) = cache.get(key) {
        return Ok(Some(Located { location, cached: true }));
    }
    let found = index.lookup(mem, key).await?;
    Ok(found.map(|e| {
        cache.insert(key, e.location, payload);
        Located { location: e.location, cached: false }
    }))
}
