//! Errors of setting up a node set; errors of memory operations are
//! [`swarm_core::MemError`]s.

use std::fmt;
use std::io;

/// Why a node set could not be made or prepared. Backends turn it into
/// their own errors, naming a node by what it is to them (a file, a
/// device).
#[derive(Debug)]
pub enum MappedError {
    /// The shape asked for is impossible (no nodes, nodes of different
    /// sizes, a size that is not a multiple of the grain, ...).
    Config(String),
    /// A system call on the memory failed.
    Io {
        /// The node whose memory it was; `None` for the control block.
        node: Option<usize>,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
}

impl MappedError {
    pub(crate) fn io(node: Option<usize>, what: &'static str, source: io::Error) -> MappedError {
        MappedError::Io { node, what, source }
    }
}

impl fmt::Display for MappedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappedError::Config(what) => write!(f, "bad memory-node configuration: {what}"),
            MappedError::Io { node: Some(i), what, source } => write!(f, "node {i}: cannot {what}: {source}"),
            MappedError::Io { node: None, what, source } => write!(f, "control block: cannot {what}: {source}"),
        }
    }
}

impl std::error::Error for MappedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MappedError::Io { source, .. } => Some(source),
            MappedError::Config(_) => None,
        }
    }
}
