//! Why a cluster could not be created, opened or removed; errors of memory
//! operations are [`swarm_core::MemError`]s, as on every backend.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why a CXL/DAX cluster could not be created, opened or removed. Every
/// variant about a device or file names its path.
#[derive(Debug)]
pub enum CxlError {
    /// The device or file does not exist.
    NotFound {
        /// The path.
        path: PathBuf,
    },
    /// This user may not open it for reading and writing.
    PermissionDenied {
        /// The path.
        path: PathBuf,
    },
    /// It is smaller than the cluster needs.
    TooSmall {
        /// The path.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The bytes needed.
        needed: u64,
    },
    /// A size is not a multiple of the device's alignment (a device-dax
    /// instance maps only whole `align` units).
    Misaligned {
        /// The device.
        path: PathBuf,
        /// What is misaligned.
        what: &'static str,
        /// Its value in bytes.
        value: u64,
        /// The device's alignment in bytes.
        align: u64,
    },
    /// `create` was given a file that already holds data.
    AlreadyExists {
        /// The path.
        path: PathBuf,
    },
    /// It is not something this backend can use, or does not hold (this
    /// part of) a cluster: a block device, a character device that is not
    /// device-dax, a bad or mismatched header, a file that is not on a DAX
    /// file system when durability was required.
    Invalid {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another system call failed.
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// The configuration asked for is impossible (no nodes, a node size that
    /// is not a multiple of the page size, nodes that do not divide among
    /// the paths, ...).
    Config(String),
    /// This machine cannot do what was asked (the non-coherent mode off
    /// x86_64, an instruction the CPU lacks).
    Unsupported(String),
}

impl CxlError {
    /// The error of system call `what` on `path`: missing files and refused
    /// permissions get their own variants.
    pub(crate) fn io(path: &Path, what: &'static str, source: io::Error) -> CxlError {
        let path = path.to_path_buf();
        match source.kind() {
            io::ErrorKind::NotFound => CxlError::NotFound { path },
            io::ErrorKind::PermissionDenied => CxlError::PermissionDenied { path },
            _ => CxlError::Io { path, what, source },
        }
    }

    pub(crate) fn invalid(path: &Path, reason: impl Into<String>) -> CxlError {
        CxlError::Invalid { path: path.to_path_buf(), reason: reason.into() }
    }
}

impl fmt::Display for CxlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CxlError::NotFound { path } => write!(f, "{}: no such device or file", path.display()),
            CxlError::PermissionDenied { path } => write!(
                f,
                "{}: permission denied (it must be readable and writable by this user: \
                 check its owner and mode, or the group of the DAX device)",
                path.display()
            ),
            CxlError::TooSmall { path, size, needed } => {
                write!(f, "{}: too small: {size} bytes, the cluster needs {needed}", path.display())
            }
            CxlError::Misaligned { path, what, value, align } => write!(
                f,
                "{}: {what} of {value} bytes is not a multiple of the device's alignment of {align} bytes",
                path.display()
            ),
            CxlError::AlreadyExists { path } => write!(
                f,
                "{}: already holds data; remove it first (swarm memnode remove --backend cxl --path {0})",
                path.display()
            ),
            CxlError::Invalid { path, reason } => write!(f, "{}: {reason}", path.display()),
            CxlError::Io { path, what, source } => write!(f, "{}: cannot {what}: {source}", path.display()),
            CxlError::Config(what) => write!(f, "bad CXL cluster configuration: {what}"),
            CxlError::Unsupported(what) => write!(f, "unsupported here: {what}"),
        }
    }
}

impl std::error::Error for CxlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CxlError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
