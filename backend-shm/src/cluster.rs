//! A cluster: the memory of all nodes, mapped once per process and shared by
//! its threads (a [`Nodes`] set), and where it lives; clients reach it
//! through [`ShmMemory`] handles.
//!
//! A shared cluster is a private directory (mode 0700), normally under
//! `/dev/shm` so that its memory is RAM, holding one file per node (mode
//! 0600) and a small control file (shape and fault state, see
//! [`swarm_mapped::Control`]):
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
//!
//! A cluster must be ours: [`open`](ShmCluster::open) refuses a directory
//! or file that another user owns or that group or others may reach
//! ([`swarm_mapped::check_private`]), as ssh refuses a key file, so that a
//! directory someone else made under a cluster's name (`/dev/shm` is open
//! to all) is never filled with data they can read; and
//! [`create`](ShmCluster::create) makes a new directory or fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use swarm_core::{MemError, NodeId};
use swarm_mapped::{Fault, Nodes};

use crate::{ShmError, ShmMemory};

/// Node files are whole pages: their size must be a multiple of this.
pub const PAGE_SIZE: u64 = 4096;

/// The memory nodes of one cluster, shared by the threads of a process.
///
/// Cloning is cheap (two reference counts); the mappings go away when the
/// last clone and the last [`ShmMemory`] made from it are dropped.
#[derive(Clone)]
pub struct ShmCluster {
    nodes: Nodes,
    dir: Option<Arc<Path>>,
}

impl ShmCluster {
    /// A cluster of `nodes` nodes of `node_size` bytes each, in anonymous
    /// memory private to this process: for tests and single-process
    /// benchmarks. `node_size` must be a positive multiple of 8. The memory
    /// is in transparent huge pages where the kernel allows
    /// ([`Nodes::anonymous`]): a first touch makes 2 MiB resident, so large
    /// nodes used sparsely take more memory than their use.
    pub fn in_process(nodes: usize, node_size: u64) -> Result<ShmCluster, ShmError> {
        Ok(ShmCluster { nodes: Nodes::anonymous(nodes, node_size)?, dir: None })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.node_count()
    }

    /// Bytes per node: valid offsets are `0..node_size()`.
    pub fn node_size(&self) -> u64 {
        self.nodes.node_size()
    }

    /// The directory of a shared cluster; `None` in-process.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The nodes, as every backend over mapped memory sees them.
    pub fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    /// A new client handle with no injected latency and a 1 s timeout.
    pub fn memory(&self) -> ShmMemory {
        self.nodes.memory()
    }

    /// The fault state of `node`; `None` if there is no such node.
    pub fn fault(&self, node: NodeId) -> Option<Fault> {
        self.nodes.fault(node)
    }

    /// Fails, stalls or heals `node`, for every thread and every process
    /// using the cluster; operations posted from then on see it.
    pub fn set_fault(&self, node: NodeId, fault: Fault) -> Result<(), MemError> {
        self.nodes.set_fault(node, fault)
    }

    /// Faults every node's pages in, in this process ([`Nodes::prefault`]):
    /// what a benchmark does before it measures, so that first touches of
    /// fresh memory (page faults, several µs each) are not charged to
    /// operations, as they are not on pinned RDMA memory. Each process
    /// sharing a cluster has its own page tables and prefaults for itself.
    pub fn prefault(&self) -> Result<(), ShmError> {
        self.nodes.prefault().map_err(|e| ShmError::mapped(e, |i| self.node_label(i)))
    }

    /// How errors name node `i`: its file, or its number in-process.
    fn node_label(&self, i: usize) -> PathBuf {
        #[cfg(not(loom))]
        if let Some(dir) = self.dir() {
            return files::node_path(dir, i);
        }
        crate::error::in_process_node(i)
    }
}

#[cfg(not(loom))]
mod files {
    use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

    use swarm_mapped::{Control, MAX_NODES, Words, check_config, check_private, control_bytes};

    use super::*;

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
                    (0..nodes).map(|i| new_file(&node_path(dir, i), bytes)).collect::<Result<Vec<Words>, _>>()?;
                let control = Control::new(new_file(&dir.join(CONTROL), control_bytes(nodes))?);
                control.init(nodes, node_size);
                assemble(dir, words, control)
            })();
            if made.is_err() {
                let _ = ShmCluster::remove(dir);
            }
            made
        }

        /// Opens and maps the cluster that [`create`](Self::create) made in
        /// `dir`, checking that the directory and its files are this user's
        /// alone (owner and mode, see the module's documentation), its
        /// control file and the size of every node file.
        pub fn open(dir: impl AsRef<Path>) -> Result<ShmCluster, ShmError> {
            let dir = dir.as_ref();
            let meta = fs::metadata(dir).map_err(|e| ShmError::io(dir, "open directory", e))?;
            if !meta.is_dir() {
                return Err(ShmError::invalid(dir, "not a directory"));
            }
            check_private(&meta).map_err(|r| ShmError::invalid(dir, r))?;
            let control_path = dir.join(CONTROL);
            let control_len = usize::try_from(file_len(&control_path)?).unwrap_or(usize::MAX);
            if control_len == 0 || !control_len.is_multiple_of(8) || control_len > control_bytes(MAX_NODES) {
                return Err(ShmError::invalid(&control_path, format!("impossible size of {control_len} bytes")));
            }
            let control = Control::new(map_existing(&control_path, control_len)?);
            let (nodes, node_size) = control.validate().map_err(|r| ShmError::invalid(&control_path, r))?;
            let bytes = check_config(nodes, node_size, PAGE_SIZE)
                .map_err(ShmError::from)
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
                .collect::<Result<Vec<Words>, _>>()?;
            assemble(dir, words, control)
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

    /// The cluster in `dir` over its mapped node files and control file.
    fn assemble(dir: &Path, words: Vec<Words>, control: Control) -> Result<ShmCluster, ShmError> {
        let nodes = Nodes::from_parts(words, control).map_err(|e| ShmError::mapped(e, |i| node_path(dir, i)))?;
        Ok(ShmCluster { nodes, dir: Some(dir.into()) })
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

    /// Maps the existing file `path`, whose length was checked to be
    /// `bytes`, if it is this user's alone.
    fn map_existing(path: &Path, bytes: usize) -> Result<Words, ShmError> {
        let file =
            OpenOptions::new().read(true).write(true).open(path).map_err(|e| ShmError::io(path, "open file", e))?;
        // Checked on the open file: the path might have been replaced.
        let meta = file.metadata().map_err(|e| ShmError::io(path, "stat file", e))?;
        check_private(&meta).map_err(|r| ShmError::invalid(path, r))?;
        let len = meta.len();
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
