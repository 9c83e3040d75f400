//! Errors of setting up a cluster (creating, opening, removing); errors of
//! memory operations are [`swarm_core::MemError`]s.

use std::fmt;
use std::io;
use std::path::PathBuf;

use swarm_mapped::MappedError;

/// Why a cluster could not be created, opened or removed.
#[derive(Debug)]
pub enum ShmError {
    /// The configuration asked for is impossible (no nodes, a size that is
    /// not a multiple of the page size, ...).
    Config(String),
    /// A file system call failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// The directory does not hold a valid cluster (missing or wrongly sized
    /// files, a garbled control file, unsafe permissions, foreign files).
    Invalid {
        /// The offending file or directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl ShmError {
    #[cfg_attr(loom, allow(dead_code))] // used by files, which loom mode lacks
    pub(crate) fn io(path: impl Into<PathBuf>, what: &'static str, source: io::Error) -> ShmError {
        ShmError::Io { path: path.into(), what, source }
    }

    #[cfg_attr(loom, allow(dead_code))] // used by opening files, which loom mode lacks
    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> ShmError {
        ShmError::Invalid { path: path.into(), reason: reason.into() }
    }

    /// The node set's error `e`, naming node `i` by `label(i)` (its file),
    /// and the control block, which it only fails to map in-process, as
    /// anonymous memory.
    pub(crate) fn mapped(e: MappedError, label: impl FnOnce(usize) -> PathBuf) -> ShmError {
        match e {
            MappedError::Config(what) => ShmError::Config(what),
            MappedError::Io { node, what, source } => {
                ShmError::Io { path: node.map_or_else(|| PathBuf::from("<anonymous>"), label), what, source }
            }
        }
    }
}

/// How errors name node `i` of an in-process cluster.
pub(crate) fn in_process_node(i: usize) -> PathBuf {
    PathBuf::from(format!("<node {i}>"))
}

/// Errors of in-process nodes, and shape checks.
impl From<MappedError> for ShmError {
    fn from(e: MappedError) -> ShmError {
        ShmError::mapped(e, in_process_node)
    }
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::Config(what) => write!(f, "bad shared-memory cluster configuration: {what}"),
            ShmError::Io { path, what, source } => write!(f, "{}: cannot {what}: {source}", path.display()),
            ShmError::Invalid { path, reason } => write!(f, "{}: not a usable cluster: {reason}", path.display()),
        }
    }
}

impl std::error::Error for ShmError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShmError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
