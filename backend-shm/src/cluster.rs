//! A cluster: the memory of all nodes, mapped once per process and shared by
//! its threads; clients reach it through [`ShmMemory`] handles.
//!
//! A shared cluster is a private directory (mode 0700), normally under
//! `/dev/shm` so that its memory is RAM, holding one file per node (mode
//! 0600) and a small control file (shape and fault state, see
//! [`crate::control`]):
//!
//! ```text
//! DIR/control
//! DIR/node-0
//! DIR/node-1
//! ...
//! ```
//!
//! One process [`create`](ShmCluster::create)s it, any number
//! [`open`](ShmCluster::open) it, and someone [`remove`](ShmCluster::remove)s
//! it when done (processes that still have it mapped keep working until they
//! drop it). Files are zero-filled when created and never resized: a file
//! truncated behind the backend's back would make accesses to the missing
//! part fault (SIGBUS), which the private directory rules out for everyone
//! but the owner.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use swarm_core::{MemError, MemErrorKind, NodeId};

use crate::atomic::{AtomicU64, Words};
use crate::control::{Control, Fault};
use crate::{ShmError, ShmMemory};

/// The most nodes a cluster may have.
pub const MAX_NODES: usize = 1024;
/// The most bytes a node may have (1 TiB; tmpfs files are sparse, but a
/// larger size is almost certainly a garbled number).
pub const MAX_NODE_SIZE: u64 = 1 << 40;
/// Node files are whole pages: their size must be a multiple of this.
pub const PAGE_SIZE: u64 = 4096;

/// The memory nodes of one cluster, shared by the threads of a process.
///
/// Cloning is cheap (one reference count); the mappings go away when the
/// last clone and the last [`ShmMemory`] made from it are dropped.
#[derive(Clone)]
pub struct ShmCluster {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Box<[Words]>,
    node_size: u64,
    control: Control,
    dir: Option<PathBuf>,
}

impl ShmCluster {
    /// A cluster of `nodes` nodes of `node_size` bytes each, in anonymous
    /// memory private to this process: for tests and single-process
    /// benchmarks. `node_size` must be a positive multiple of 8. The memory
    /// is in transparent huge pages where the kernel allows
    /// ([`crate::Words::anonymous`]): a first touch makes 2 MiB resident, so
    /// large nodes used sparsely take more memory than their use.
    pub fn in_process(nodes: usize, node_size: u64) -> Result<ShmCluster, ShmError> {
        let bytes = check_config(nodes, node_size, 8)?;
        let anon = |bytes| Words::anonymous(bytes).map_err(|e| ShmError::io("<anonymous>", "map anonymous memory", e));
        let words = (0..nodes).map(|_| anon(bytes)).collect::<Result<Box<[Words]>, _>>()?;
        let control = Control::new(anon(crate::control::control_bytes(nodes))?);
        control.init(nodes, node_size);
        Ok(ShmCluster { inner: Arc::new(Inner { nodes: words, node_size, control, dir: None }) })
    }

    /// A cluster over memory that the caller mapped, `nodes[i]` being node
    /// `i`: the backend's handles, checks, latency, fault injection and
    /// persistence hooks over memory it does not map itself (DAX devices, a
    /// CXL pool cut into nodes; see `swarm-backend-cxl`). Every node must
    /// have the same size, a positive multiple of 64 bytes. The fault state
    /// lives in memory private to this process, so an injected fault is
    /// seen by its threads only.
    pub fn from_words(nodes: Vec<Words>) -> Result<ShmCluster, ShmError> {
        let node_size = nodes.first().map_or(0, |w| w.bytes() as u64);
        check_config(nodes.len(), node_size, 64)?;
        if let Some((i, w)) = nodes.iter().enumerate().find(|(_, w)| w.bytes() as u64 != node_size) {
            return Err(ShmError::Config(format!("node {i} has {} bytes, node 0 has {node_size}", w.bytes())));
        }
        let control = Control::new(
            Words::anonymous(crate::control::control_bytes(nodes.len()))
                .map_err(|e| ShmError::io("<anonymous>", "map anonymous memory", e))?,
        );
        control.init(nodes.len(), node_size);
        Ok(ShmCluster { inner: Arc::new(Inner { nodes: nodes.into(), node_size, control, dir: None }) })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Bytes per node: valid offsets are `0..node_size()`.
    pub fn node_size(&self) -> u64 {
        self.inner.node_size
    }

    /// The directory of a shared cluster; `None` in-process.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir.as_deref()
    }

    /// A new client handle with no injected latency and a 1 s timeout.
    pub fn memory(&self) -> ShmMemory {
        ShmMemory::new(self.clone())
    }

    /// The fault state of `node`; `None` if there is no such node.
    pub fn fault(&self, node: NodeId) -> Option<Fault> {
        (node.index() < self.node_count()).then(|| self.inner.control.fault(node.index()))
    }

    /// Fails, stalls or heals `node`, for every thread and every process
    /// using the cluster; operations posted from then on see it.
    pub fn set_fault(&self, node: NodeId, fault: Fault) -> Result<(), MemError> {
        if node.index() >= self.node_count() {
            return Err(MemError::new(node, MemErrorKind::NoSuchNode));
        }
        self.inner.control.set_fault(node.index(), fault);
        Ok(())
    }

    /// Faults every node's pages in, in this process ([`Words::prefault`]):
    /// what a benchmark does before it measures, so that first touches of
    /// fresh memory (page faults, several µs each) are not charged to
    /// operations, as they are not on pinned RDMA memory. Each process
    /// sharing a cluster has its own page tables and prefaults for itself.
    pub fn prefault(&self) -> Result<(), ShmError> {
        for (i, w) in self.inner.nodes.iter().enumerate() {
            w.prefault().map_err(|e| ShmError::io(self.node_label(i), "prefault", e))?;
        }
        Ok(())
    }

    /// How errors name node `i`: its file, or its number in-process.
    fn node_label(&self, i: usize) -> PathBuf {
        #[cfg(not(loom))]
        if let Some(dir) = self.dir() {
            return files::node_path(dir, i);
        }
        PathBuf::from(format!("<node {i}>"))
    }

    /// The words of `node`, or `None` if there is no such node.
    pub(crate) fn words(&self, node: NodeId) -> Option<&[AtomicU64]> {
        self.inner.nodes.get(node.index()).map(Words::as_slice)
    }
}

#[cfg(not(loom))]
mod files {
    use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

    use super::*;
    use crate::control::control_bytes;

    const CONTROL: &str = "control";

    pub(super) fn node_path(dir: &Path, i: usize) -> PathBuf {
        dir.join(format!("node-{i}"))
    }

    /// Whether `name` is a file this backend makes.
    fn is_ours(name: &str) -> bool {
        name == CONTROL
            || name.strip_prefix("node-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    impl ShmCluster {
        /// Creates a cluster of `nodes` zeroed nodes of `node_size` bytes in
        /// the new directory `dir` (e.g. `/dev/shm/swarm-NAME`), and maps it.
        ///
        /// `dir` must not exist (its parent must); `node_size` must be a
        /// positive multiple of [`PAGE_SIZE`]. On failure nothing is left
        /// behind.
        pub fn create(dir: impl AsRef<Path>, nodes: usize, node_size: u64) -> Result<ShmCluster, ShmError> {
            let dir = dir.as_ref();
            let bytes = check_config(nodes, node_size, PAGE_SIZE)?;
            DirBuilder::new().mode(0o700).create(dir).map_err(|e| ShmError::io(dir, "create directory", e))?;
            // From here on, a failure removes what was made.
            let made = (|| {
                // The umask may have cleared bits of the mode; make it exact.
                fs::set_permissions(dir, Permissions::from_mode(0o700))
                    .map_err(|e| ShmError::io(dir, "set permissions", e))?;
                let words =
                    (0..nodes).map(|i| new_file(&node_path(dir, i), bytes)).collect::<Result<Box<[Words]>, _>>()?;
                let control = Control::new(new_file(&dir.join(CONTROL), control_bytes(nodes))?);
                control.init(nodes, node_size);
                Ok(ShmCluster {
                    inner: Arc::new(Inner { nodes: words, node_size, control, dir: Some(dir.to_path_buf()) }),
                })
            })();
            if made.is_err() {
                let _ = ShmCluster::remove(dir);
            }
            made
        }

        /// Opens and maps the cluster that [`create`](Self::create) made in
        /// `dir`, checking its permissions, its control file and the size of
        /// every node file.
        pub fn open(dir: impl AsRef<Path>) -> Result<ShmCluster, ShmError> {
            let dir = dir.as_ref();
            let meta = fs::metadata(dir).map_err(|e| ShmError::io(dir, "open directory", e))?;
            if !meta.is_dir() {
                return Err(ShmError::invalid(dir, "not a directory"));
            }
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(ShmError::invalid(dir, format!("directory mode is {mode:o}; a cluster's must be 700")));
            }
            let control_path = dir.join(CONTROL);
            let control_len = usize::try_from(file_len(&control_path)?).unwrap_or(usize::MAX);
            if control_len == 0 || !control_len.is_multiple_of(8) || control_len > control_bytes(MAX_NODES) {
                return Err(ShmError::invalid(&control_path, format!("impossible size of {control_len} bytes")));
            }
            let control = Control::new(map_existing(&control_path, control_len)?);
            let (nodes, node_size) = control.validate().map_err(|r| ShmError::invalid(&control_path, r))?;
            let bytes = check_config(nodes, node_size, PAGE_SIZE)
                .map_err(|e| ShmError::invalid(&control_path, format!("records an impossible shape ({e})")))?;
            let words = (0..nodes)
                .map(|i| {
                    let path = node_path(dir, i);
                    let len = file_len(&path)?;
                    if len != node_size {
                        return Err(ShmError::invalid(
                            &path,
                            format!("is {len} bytes, the cluster's nodes are {node_size}"),
                        ));
                    }
                    map_existing(&path, bytes)
                })
                .collect::<Result<Box<[Words]>, _>>()?;
            Ok(ShmCluster { inner: Arc::new(Inner { nodes: words, node_size, control, dir: Some(dir.to_path_buf()) }) })
        }

        /// Deletes the cluster in `dir`: its files, then the directory.
        ///
        /// Refuses, deleting nothing, if the directory holds anything this
        /// backend does not make, so a mistyped path cannot destroy other
        /// data. Processes that have the cluster mapped keep their memory
        /// until they drop it.
        pub fn remove(dir: impl AsRef<Path>) -> Result<(), ShmError> {
            let dir = dir.as_ref();
            let mut names = Vec::new();
            for entry in fs::read_dir(dir).map_err(|e| ShmError::io(dir, "list directory", e))? {
                let entry = entry.map_err(|e| ShmError::io(dir, "list directory", e))?;
                let name = entry.file_name();
                match name.to_str() {
                    Some(n) if is_ours(n) => names.push(entry.path()),
                    _ => {
                        return Err(ShmError::invalid(
                            dir,
                            format!("holds {name:?}, which is not a cluster file; nothing removed"),
                        ));
                    }
                }
            }
            for path in names {
                fs::remove_file(&path).map_err(|e| ShmError::io(path, "remove file", e))?;
            }
            fs::remove_dir(dir).map_err(|e| ShmError::io(dir, "remove directory", e))
        }
    }

    /// Creates the file `path` (mode 0600, `bytes` long, zero-filled) and maps it.
    fn new_file(path: &Path, bytes: usize) -> Result<Words, ShmError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| ShmError::io(path, "create file", e))?;
        file.set_permissions(Permissions::from_mode(0o600)).map_err(|e| ShmError::io(path, "set permissions", e))?;
        file.set_len(bytes as u64).map_err(|e| ShmError::io(path, "set file size", e))?;
        map(path, &file, bytes)
    }

    /// Maps the existing file `path`, whose length was checked to be `bytes`.
    fn map_existing(path: &Path, bytes: usize) -> Result<Words, ShmError> {
        let file =
            OpenOptions::new().read(true).write(true).open(path).map_err(|e| ShmError::io(path, "open file", e))?;
        // Checked again on the open file: the path might have been replaced.
        let len = file.metadata().map_err(|e| ShmError::io(path, "stat file", e))?.len();
        if len != bytes as u64 {
            return Err(ShmError::invalid(path, format!("is {len} bytes, expected {bytes}")));
        }
        map(path, &file, bytes)
    }

    fn map(path: &Path, file: &File, bytes: usize) -> Result<Words, ShmError> {
        Words::map_file(file, bytes).map_err(|e| ShmError::io(path, "map file", e))
    }

    /// The length of the regular file `path`.
    fn file_len(path: &Path) -> Result<u64, ShmError> {
        let meta = fs::metadata(path).map_err(|e| ShmError::io(path, "open file", e))?;
        if !meta.is_file() {
            return Err(ShmError::invalid(path, "not a regular file"));
        }
        Ok(meta.len())
    }

    #[cfg(test)]
    mod tests {
        use super::is_ours;

        #[test]
        fn only_cluster_files_are_ours() {
            assert!(is_ours("control") && is_ours("node-0") && is_ours("node-17"));
            assert!(!is_ours("node-") && !is_ours("node-1x") && !is_ours("controls") && !is_ours("data"));
        }
    }
}

/// Checks a cluster's shape; returns the node size in bytes as a `usize`.
fn check_config(nodes: usize, node_size: u64, grain: u64) -> Result<usize, ShmError> {
    if !(1..=MAX_NODES).contains(&nodes) {
        return Err(ShmError::Config(format!("{nodes} nodes; a cluster has 1 to {MAX_NODES}")));
    }
    if node_size == 0 || !node_size.is_multiple_of(grain) || node_size > MAX_NODE_SIZE {
        return Err(ShmError::Config(format!(
            "node size {node_size}; it must be a positive multiple of {grain} bytes, at most {MAX_NODE_SIZE}"
        )));
    }
    usize::try_from(node_size).map_err(|_| ShmError::Config(format!("node size {node_size} exceeds the address space")))
}
