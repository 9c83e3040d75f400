//! Why a key-value operation failed, and how the failures of the layers
//! below (memory, regions, allocation, the index) read to a store's user.

use core::fmt;

use crate::index::IndexError;
use crate::index::snapshot::arena::ArenaError;
use crate::substrate::lease::LeaseError;
use crate::substrate::space::region::Bytes;
use crate::substrate::space::{AllocError, RegionError};
use crate::swarm::client::ClientError;
use crate::{MemError, MemErrorKind, NodeId};

/// A failed operation: bad input, or a store that cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvError {
    /// An empty key or one longer than the limit.
    BadKey {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// A value larger than the limit.
    ValueTooLarge {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// Too few of the replicas of a key answered; the operation may or may
    /// not have taken effect.
    Unavailable,
    /// A node this operation needed did not answer (down, or timed out):
    /// node 0 with the index, the only node of a RAW key, the node of a
    /// store's record. The operation may or may not have taken effect.
    Down(MemError),
    /// The index has no free slot for the key: every slot it may take holds
    /// another key (the index is sized for the store's keys).
    Full,
    /// The replicated index's arena, where its key blocks and the
    /// descriptors of keys' replicas go, is used up (neither is recycled
    /// yet: issue #20).
    IndexSpace {
        /// Bytes handed out.
        used: u64,
        /// Bytes of the arena.
        size: u64,
    },
    /// A node has no memory left for what the operation needed (a value's
    /// replica, a writer-log segment, an index block): memory is never
    /// recycled, so the store cannot take more writes there.
    NodeFull {
        /// The node.
        node: NodeId,
        /// Bytes asked for (whole chunks).
        need: u64,
        /// Bytes left on the node.
        free: u64,
    },
    /// Remote data that cannot be right, after retries.
    Corrupt,
    /// A value's copy stayed torn (its checksum or tag wrong) over `reads`
    /// reads for `ms` milliseconds: no write in flight takes that long, so
    /// its writer died in the middle of writing it (a store without
    /// recovery of in-place writes: RAW), or the memory is corrupt.
    Torn {
        /// Reads that found it torn.
        reads: u32,
        /// Milliseconds from the first of them to the last.
        ms: u64,
    },
    /// The memory nodes hold no key-value store (`systems::format` was not run).
    NoStore,
    /// The key kept changing under this client (concurrent deletes and
    /// inserts won every retry); nothing was changed.
    Contended,
    /// A configuration the store cannot have (the reason is given).
    BadConfig(&'static str),
    /// The client cannot name a write: its log is full, timestamps ran
    /// out or a clock is wrong, its lease was lost (the numbers are given).
    Client(ClientError),
    /// The client's id could not be claimed or kept (the reason is given).
    Lease(LeaseError),
    /// The server beside this node does not serve the store's role (it
    /// serves another store, or none: it started before the store was set
    /// up and has not taken the role yet).
    NotServed(NodeId),
    /// A protocol broke a bound its proof gives: a bug, never expected.
    Bug(&'static str),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::BadKey { len, max } => write!(f, "keys must have 1 to {max} bytes, this one has {len}"),
            KvError::ValueTooLarge { len, max } => write!(f, "values may have up to {max} bytes, this one has {len}"),
            KvError::Unavailable => write!(f, "too few memory nodes answered"),
            KvError::Down(e) => match e.kind {
                MemErrorKind::Unreachable => write!(f, "{} is down (unreachable)", e.node),
                MemErrorKind::TimedOut => write!(f, "{} does not answer (timed out)", e.node),
                _ => write!(f, "{e}"),
            },
            KvError::Full => write!(f, "the index is full: every slot this key may take holds another key"),
            KvError::IndexSpace { used, size } => write!(
                f,
                "the index's arena is used up: {used} of {size} bytes (index blocks are not recycled yet; make the store for more keys)"
            ),
            KvError::NodeFull { node, need, free } => {
                write!(
                    f,
                    "{node} is full: {} needed, {} free (the log segments clients gave back are taken too; deleted keys' objects are not recycled yet)",
                    Bytes(*need),
                    Bytes(*free)
                )
            }
            KvError::Corrupt => write!(f, "corrupt data in memory"),
            KvError::Torn { reads, ms } => write!(
                f,
                "the value's copy stayed torn over {reads} reads in {ms} ms: its writer died in the middle of writing it, or the memory is corrupt"
            ),
            KvError::NoStore => write!(f, "no key-value store on these memory nodes (format them for one first)"),
            KvError::Contended => write!(f, "the key kept changing under this client; gave up"),
            KvError::BadConfig(why) => write!(f, "bad store configuration: {why}"),
            KvError::Client(e) => write!(f, "{e}"),
            KvError::Lease(e) => write!(f, "{e}"),
            KvError::NotServed(node) => write!(
                f,
                "the server beside {node} does not serve this store (it serves none or another one; a bare server takes the store's role within a second of `swarm kv init`)"
            ),
            KvError::Bug(what) => write!(f, "a bug: {what} (please report it)"),
        }
    }
}

impl core::error::Error for KvError {}

impl From<MemError> for KvError {
    /// A request the node refused (out of bounds, misaligned) came from
    /// corrupt remote data; anything else is the node's health.
    fn from(e: MemError) -> KvError {
        if e.is_request_error() { KvError::Corrupt } else { KvError::Down(e) }
    }
}

impl From<RegionError> for KvError {
    fn from(e: RegionError) -> KvError {
        match e {
            RegionError::Mem(e) => e.into(),
            RegionError::Exhausted { node, need, free } => KvError::NodeFull { node, need, free },
            RegionError::Corrupt { .. } => KvError::NoStore,
            RegionError::BadLayout(_) => KvError::Corrupt,
        }
    }
}

// The message below names the number.
const _: () = assert!(crate::substrate::space::slab::USED_CLASSES == 12);

impl From<AllocError> for KvError {
    fn from(e: AllocError) -> KvError {
        match e {
            AllocError::Region(e) => e.into(),
            AllocError::BadSize { .. } => KvError::BadConfig("values too large for the nodes' chunks"),
            AllocError::TooManyNodes => KvError::BadConfig("at most 32 memory nodes"),
            AllocError::TooManyClasses { .. } => KvError::BadConfig("more than 12 object sizes on one node"),
        }
    }
}

impl From<IndexError> for KvError {
    fn from(e: IndexError) -> KvError {
        match e {
            IndexError::Mem(e) => e.into(),
            IndexError::Region(e @ (RegionError::Exhausted { .. } | RegionError::Mem(_))) => e.into(),
            IndexError::Full { .. } => KvError::Full,
            IndexError::KeyTooLong { len, max } => KvError::BadKey { len, max },
            IndexError::NoIndex { .. } => KvError::NoStore,
            IndexError::Contended => KvError::Contended,
            IndexError::Unavailable(_) | IndexError::ViewChanged => KvError::Unavailable,
            IndexError::Arena(ArenaError::NoQuorum { .. }) => KvError::Unavailable,
            IndexError::Arena(ArenaError::Full { used, size }) => KvError::IndexSpace { used, size },
            IndexError::Arena(ArenaError::Region(e @ (RegionError::Exhausted { .. } | RegionError::Mem(_)))) => {
                e.into()
            }
            _ => KvError::Corrupt,
        }
    }
}
