//! The node set: the memory of every node, mapped once per process and
//! shared by its threads, and the control block that holds each node's
//! fault state; clients reach it through [`MappedMemory`] handles.
//!
//! Where the memory comes from is the caller's business:
//!
//! - anonymous memory of this process ([`Nodes::anonymous`]): in-process
//!   clusters for tests and single-process benchmarks, and the only kind
//!   under `--cfg loom`;
//! - views of memory mapped elsewhere, with a private control block
//!   ([`Nodes::from_words`]): DAX devices or files cut into nodes by
//!   `swarm-backend-cxl`;
//! - words and a control block mapped by the caller ([`Nodes::from_parts`]):
//!   `swarm-backend-shm`'s files, which other processes map too, so that a
//!   fault injected by one process is seen by all.

use std::sync::Arc;

use swarm_core::{MemError, MemErrorKind, NodeId};

use crate::atomic::{AtomicU64, WORD, Words};
use crate::control::{Control, Fault, control_bytes};
use crate::{MappedError, MappedMemory};

/// The most nodes a node set may have.
pub const MAX_NODES: usize = 1024;
/// The most bytes a node may have (1 TiB; tmpfs files are sparse, but a
/// larger size is almost certainly a garbled number).
pub const MAX_NODE_SIZE: u64 = 1 << 40;

/// The memory nodes of one cluster, shared by the threads of a process.
///
/// Cloning is cheap (one reference count); the mappings go away when the
/// last clone and the last [`MappedMemory`] made from it are dropped.
#[derive(Clone)]
pub struct Nodes {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Box<[Words]>,
    node_size: u64,
    control: Control,
}

impl Nodes {
    /// `nodes` nodes of `node_size` bytes each, in anonymous memory private
    /// to this process, with the fault state in anonymous memory too.
    /// `node_size` must be a positive multiple of 8. The memory is in
    /// transparent huge pages where the kernel allows ([`Words::anonymous`]):
    /// a first touch makes 2 MiB resident, so large nodes used sparsely take
    /// more memory than their use.
    pub fn anonymous(nodes: usize, node_size: u64) -> Result<Nodes, MappedError> {
        let bytes = check_config(nodes, node_size, WORD as u64)?;
        let words = (0..nodes)
            .map(|i| Words::anonymous(bytes).map_err(|e| MappedError::io(Some(i), "map anonymous memory", e)))
            .collect::<Result<Vec<Words>, _>>()?;
        Nodes::from_parts(words, private_control(nodes, node_size)?)
    }

    /// Nodes over memory that the caller mapped, `nodes[i]` being node `i`:
    /// the handles, checks, latency, fault injection and persistence hooks
    /// over memory this crate does not map itself (DAX devices, a CXL pool
    /// cut into nodes). Every node must have the same size, a positive
    /// multiple of 64 bytes. The fault state lives in memory private to
    /// this process, so an injected fault is seen by its threads only.
    pub fn from_words(nodes: Vec<Words>) -> Result<Nodes, MappedError> {
        let node_size = nodes.first().map_or(0, |w| w.bytes() as u64);
        check_config(nodes.len(), node_size, 64)?;
        let control = private_control(nodes.len(), node_size)?;
        Nodes::from_parts(nodes, control)
    }

    /// Nodes over words and a control block that the caller mapped (files
    /// that several processes map: the fault state is then seen by all of
    /// them). `control` must already hold a header, written by
    /// [`Control::init`] or checked by [`Control::validate`], and be large
    /// enough for the nodes ([`control_bytes`]); every node must have the
    /// same size.
    pub fn from_parts(nodes: Vec<Words>, control: Control) -> Result<Nodes, MappedError> {
        let node_size = nodes.first().map_or(0, |w| w.bytes() as u64);
        check_config(nodes.len(), node_size, WORD as u64)?;
        if let Some((i, w)) = nodes.iter().enumerate().find(|(_, w)| w.bytes() as u64 != node_size) {
            return Err(MappedError::Config(format!("node {i} has {} bytes, node 0 has {node_size}", w.bytes())));
        }
        if control.bytes() < control_bytes(nodes.len()) {
            return Err(MappedError::Config(format!(
                "control block of {} bytes; {} nodes need {}",
                control.bytes(),
                nodes.len(),
                control_bytes(nodes.len())
            )));
        }
        Ok(Nodes { inner: Arc::new(Inner { nodes: nodes.into(), node_size, control }) })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Bytes per node: valid offsets are `0..node_size()`.
    pub fn node_size(&self) -> u64 {
        self.inner.node_size
    }

    /// A new client handle with no injected latency and a 1 s timeout.
    pub fn memory(&self) -> MappedMemory {
        MappedMemory::new(self.clone())
    }

    /// The fault state of `node`; `None` if there is no such node.
    pub fn fault(&self, node: NodeId) -> Option<Fault> {
        (node.index() < self.node_count()).then(|| self.inner.control.fault(node.index()))
    }

    /// Fails, stalls or heals `node`, for every thread (and, when the
    /// control block is shared, every process) using the nodes; operations
    /// posted from then on see it.
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
    /// sharing memory has its own page tables and prefaults for itself. An
    /// error names the node that failed.
    pub fn prefault(&self) -> Result<(), MappedError> {
        for (i, w) in self.inner.nodes.iter().enumerate() {
            w.prefault().map_err(|e| MappedError::io(Some(i), "prefault", e))?;
        }
        Ok(())
    }

    /// The words of `node`, or `None` if there is no such node.
    #[inline]
    pub(crate) fn words(&self, node: NodeId) -> Option<&[AtomicU64]> {
        self.inner.nodes.get(node.index()).map(Words::as_slice)
    }
}

/// A fresh control block for `nodes` nodes of `node_size` bytes in
/// anonymous memory (all nodes healthy), seen by this process only.
fn private_control(nodes: usize, node_size: u64) -> Result<Control, MappedError> {
    let words = Words::anonymous(control_bytes(nodes)).map_err(|e| MappedError::io(None, "map anonymous memory", e))?;
    let control = Control::new(words);
    control.init(nodes, node_size);
    Ok(control)
}

/// Checks the shape of a node set: 1 to [`MAX_NODES`] nodes of a positive
/// multiple of `grain` bytes, at most [`MAX_NODE_SIZE`]. Returns the node
/// size in bytes as a `usize`.
pub fn check_config(nodes: usize, node_size: u64, grain: u64) -> Result<usize, MappedError> {
    if !(1..=MAX_NODES).contains(&nodes) {
        return Err(MappedError::Config(format!("{nodes} nodes; a cluster has 1 to {MAX_NODES}")));
    }
    if node_size == 0 || !node_size.is_multiple_of(grain) || node_size > MAX_NODE_SIZE {
        return Err(MappedError::Config(format!(
            "node size {node_size}; it must be a positive multiple of {grain} bytes, at most {MAX_NODE_SIZE}"
        )));
    }
    usize::try_from(node_size)
        .map_err(|_| MappedError::Config(format!("node size {node_size} exceeds the address space")))
}
