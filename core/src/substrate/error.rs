//! The one error type of memory operations.

use core::fmt;

use crate::NodeId;

/// Why a memory operation failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemErrorKind {
    /// The node is known to be down (crashed, disconnected, failed by fault injection).
    Unreachable,
    /// No completion arrived within the backend's timeout; the operation may
    /// or may not have been applied.
    TimedOut,
    /// The range `[offset, offset + len)` is not inside the node's region.
    OutOfBounds {
        /// First byte asked for.
        offset: u64,
        /// Number of bytes asked for.
        len: u64,
    },
    /// A CAS word that is not 8-byte aligned.
    Misaligned {
        /// The offending offset.
        offset: u64,
    },
    /// The node id names no configured node.
    NoSuchNode,
    /// A pipeline longer than [`crate::MAX_PIPELINE`] or one that is empty.
    BadPipeline {
        /// Number of operations that were given.
        len: usize,
    },
    /// A single transfer larger than the backend supports.
    TooLarge {
        /// Bytes asked for.
        len: u64,
    },
    /// The backend failed in a way the other kinds do not describe
    /// (an RDMA completion error, an I/O error on a mapping).
    Backend {
        /// A backend-specific code (e.g. an `ibv_wc_status`).
        code: u32,
    },
}

/// A failed memory operation: which node, and why.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemError {
    /// The node the operation was addressed to.
    pub node: NodeId,
    /// What went wrong.
    pub kind: MemErrorKind,
}

impl MemError {
    /// An error of `kind` on `node`.
    pub const fn new(node: NodeId, kind: MemErrorKind) -> Self {
        Self { node, kind }
    }

    /// Whether the node may have applied the operation anyway (a timeout, or
    /// a failure after posting). Protocols must then treat the write as
    /// possibly visible.
    pub const fn may_have_applied(&self) -> bool {
        matches!(self.kind, MemErrorKind::TimedOut | MemErrorKind::Backend { .. })
    }

    /// Whether the error is due to the request itself (a bug or corrupt
    /// remote data), not to the node's health.
    pub const fn is_request_error(&self) -> bool {
        matches!(
            self.kind,
            MemErrorKind::OutOfBounds { .. }
                | MemErrorKind::Misaligned { .. }
                | MemErrorKind::NoSuchNode
                | MemErrorKind::BadPipeline { .. }
                | MemErrorKind::TooLarge { .. }
        )
    }
}

impl fmt::Display for MemErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemErrorKind::Unreachable => write!(f, "unreachable"),
            MemErrorKind::TimedOut => write!(f, "timed out"),
            MemErrorKind::OutOfBounds { offset, len } => {
                write!(f, "out of bounds: {len} bytes at offset {offset:#x}")
            }
            MemErrorKind::Misaligned { offset } => write!(f, "CAS word at {offset:#x} is not 8-byte aligned"),
            MemErrorKind::NoSuchNode => write!(f, "no such memory node"),
            MemErrorKind::BadPipeline { len } => write!(f, "pipeline of {len} operations is not supported"),
            MemErrorKind::TooLarge { len } => write!(f, "transfer of {len} bytes is too large"),
            MemErrorKind::Backend { code } => write!(f, "backend error {code}"),
        }
    }
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.kind)
    }
}

impl core::error::Error for MemError {}
