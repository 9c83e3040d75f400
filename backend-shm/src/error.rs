//! Errors of setting up a cluster (creating, opening, removing); errors of
//! memory operations are [`swarm_core::MemError`]s.

use std::fmt;
use std::io;
use std::path::PathBuf;

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
    pub(crate) fn io(path: impl Into<PathBuf>, what: &'static str, source: io::Error) -> ShmError {
        ShmError::Io { path: path.into(), what, source }
    }

    #[cfg_attr(loom, allow(dead_code))] // used by opening files, which loom mode lacks
    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> ShmError {
        ShmError::Invalid { path: path.into(), reason: reason.into() }
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
