//! Compute beside memory: messages to a server that runs next to a memory
//! node, over the memory interface itself (FaRM §3), so that every system
//! that needs a CPU beside memory (FUSEE's allocator and master,
//! pDPM-Central's coordinator, Clover's metadata server, FaRM's
//! transactions, DINOMO's KVS nodes) runs on every backend and in the
//! simulator.
//!
//! - [`ring`]: a one-way ring that a sender writes with one-sided WRITEs
//!   and its receiver polls; free space comes back through a head word the
//!   receiver advances lazily.
//! - [`area`]: a node's server area: a header, the server's epoch, and one
//!   channel (a request ring and a response ring) per client id.
//! - [`rpc`]: request/response on a channel: ids, time-outs, bounded
//!   messages, reconnection; an RPC counts as one roundtrip, and the
//!   server's own memory operations are reported apart.
//! - [`server`]: a server: a task that polls its channels and answers with a
//!   [`server::Service`]. It runs as a thread beside the clients, as its own
//!   process (`swarm serve`), or as a task of the simulator, where it can
//!   crash, stall and be slow like a memory node.
//!
//! The server area lives on the memory node the server runs beside; its
//! rings play FaRM's receivers' memory: a client's requests are written
//! into the server's node, and its answers into a ring the client polls
//! ([`crate::Memory::read_inbox`]).

use core::fmt;

use crate::substrate::space::RegionError;
use crate::{MemError, NodeId};

pub mod area;
pub mod ring;
pub mod rpc;
pub mod server;
#[cfg(all(test, feature = "sim"))]
mod tests;

/// Why a message could not be sent, answered or served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgError {
    /// A memory operation failed.
    Mem(MemError),
    /// The node's region could not give the server area room.
    Region(RegionError),
    /// No server answers on the node: why.
    NoServer {
        /// The node.
        node: NodeId,
        /// What was found.
        why: &'static str,
    },
    /// The server area holds what cannot be right.
    Corrupt {
        /// The node.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The receiver's ring is full: it is behind, or gone.
    Full,
    /// A message larger than the channel carries.
    TooLarge {
        /// Bytes given.
        len: u64,
        /// Bytes allowed.
        max: u64,
    },
    /// No answer in time: the request may or may not have been served.
    TimedOut,
    /// The server answered that it could not serve the request.
    Refused(rpc::Status),
    /// Another server took this node's area over (a server restarted
    /// elsewhere); this one must stop.
    Superseded,
    /// A configuration that cannot be (channels, ring sizes).
    BadConfig(&'static str),
}

impl From<MemError> for MsgError {
    fn from(e: MemError) -> Self {
        MsgError::Mem(e)
    }
}

impl From<RegionError> for MsgError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Mem(e) => MsgError::Mem(e),
            e => MsgError::Region(e),
        }
    }
}

impl From<ring::RingError> for MsgError {
    fn from(e: ring::RingError) -> Self {
        match e {
            ring::RingError::Mem(e) => MsgError::Mem(e),
            ring::RingError::Full => MsgError::Full,
            ring::RingError::TooLarge { len, max } => MsgError::TooLarge { len, max },
            ring::RingError::Corrupt(node) => MsgError::Corrupt { node, what: "a ring's head word" },
        }
    }
}

impl fmt::Display for MsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgError::Mem(e) => write!(f, "{e}"),
            MsgError::Region(e) => write!(f, "{e}"),
            MsgError::NoServer { node, why } => write!(f, "no server on {node}: {why}"),
            MsgError::Corrupt { node, what } => write!(f, "{node}: corrupt server area: {what}"),
            MsgError::Full => write!(f, "the server's ring is full (the server is behind)"),
            MsgError::TooLarge { len, max } => write!(f, "a message of {len} bytes; the channel carries {max}"),
            MsgError::TimedOut => write!(f, "the server did not answer in time (the request may have run)"),
            MsgError::Refused(s) => write!(f, "the server refused the request: {s}"),
            MsgError::Superseded => write!(f, "another server took this node's area over"),
            MsgError::BadConfig(what) => write!(f, "bad server configuration: {what}"),
        }
    }
}

impl core::error::Error for MsgError {}
