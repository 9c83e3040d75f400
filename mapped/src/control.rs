//! The control block: what a node set is (its shape) and which of its
//! nodes are failed or stalled (fault injection).
//!
//! `swarm-backend-shm` keeps it in the file `control` beside the node
//! files of a shared cluster, mapped by every process, so a fault injected
//! by one process is seen by all the others at their next operation (and
//! [`validate`](Control::validate)s it when opening the cluster). Otherwise
//! it is anonymous memory shared by the threads of one process. Like node
//! memory, it is only accessed through atomics.
//!
//! ```text
//! word 0     magic "SWARMSHM" (stored last when creating: a cluster whose
//!            magic is missing is still being created, or its creation failed)
//!      1     layout version
//!      2     number of nodes
//!      3     bytes per node
//!      4..8  reserved
//!      8+i   fault state of node i: 0 healthy, 1 failed, 2 stalled
//! ```

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::atomic::{CONTROL_GRAIN, WORD, Words};

/// "SWARMSHM", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"SWARMSHM");
/// Version of the layout above.
const VERSION: u64 = 1;
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 1;
const NODES_AT: usize = 2;
const SIZE_AT: usize = 3;
const FAULTS_AT: usize = 8;

/// The health of a memory node, as fault injection sets it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Fault {
    /// Operations run normally.
    #[default]
    Healthy,
    /// The node is down: its operations fail at once with
    /// [`swarm_core::MemErrorKind::Unreachable`] and are not applied.
    Failed,
    /// The node is frozen: its operations wait, unapplied, until the
    /// handle's timeout and then fail with
    /// [`swarm_core::MemErrorKind::TimedOut`]; if the stall ends first they
    /// are applied and complete normally. Background operations are dropped.
    Stalled,
}

impl Fault {
    fn encode(self) -> u64 {
        match self {
            Fault::Healthy => 0,
            Fault::Failed => 1,
            Fault::Stalled => 2,
        }
    }

    /// Unknown values (a garbled control file) read as failed: the safe side.
    fn decode(v: u64) -> Fault {
        match v {
            0 => Fault::Healthy,
            2 => Fault::Stalled,
            _ => Fault::Failed,
        }
    }
}

/// Bytes of the control block of a node set of `nodes` nodes: whole pages
/// (whole words under loom).
pub fn control_bytes(nodes: usize) -> usize {
    ((FAULTS_AT + nodes) * WORD).div_ceil(CONTROL_GRAIN) * CONTROL_GRAIN
}

/// A mapped control block: a header (magic, layout version, node count and
/// size) and one fault-state word per node, only accessed through atomics.
/// `swarm-backend-shm` maps it from a file that every process of a cluster
/// shares; otherwise it is anonymous memory of one process.
pub struct Control {
    words: Words,
}

impl Control {
    /// Wraps `words`, which must hold at least [`control_bytes`] for the node
    /// count it will be initialised with or validated against.
    pub fn new(words: Words) -> Control {
        Control { words }
    }

    /// Writes a fresh header (all nodes healthy); the magic goes last, with
    /// release ordering, so whoever sees it sees the rest.
    pub fn init(&self, nodes: usize, node_size: u64) {
        let w = self.words.as_slice();
        w[VERSION_AT].store(VERSION, Relaxed);
        w[NODES_AT].store(nodes as u64, Relaxed);
        w[SIZE_AT].store(node_size, Relaxed);
        for f in &w[FAULTS_AT..FAULTS_AT + nodes] {
            f.store(Fault::Healthy.encode(), Relaxed);
        }
        w[MAGIC_AT].store(MAGIC, Release);
    }

    /// Validates the header; returns the node count and bytes per node.
    /// Every value is checked before use (the file is input, not a promise).
    pub fn validate(&self) -> Result<(usize, u64), String> {
        let w = self.words.as_slice();
        if w.len() < FAULTS_AT {
            return Err(format!("control block of {} bytes is too short", self.words.bytes()));
        }
        if w[MAGIC_AT].load(Acquire) != MAGIC {
            return Err("bad magic: not a cluster, or its creation did not finish".into());
        }
        let version = w[VERSION_AT].load(Relaxed);
        if version != VERSION {
            return Err(format!("unknown layout version {version} (expected {VERSION})"));
        }
        let nodes = w[NODES_AT].load(Relaxed);
        let size = w[SIZE_AT].load(Relaxed);
        let nodes = usize::try_from(nodes)
            .ok()
            .filter(|&n| (1..=crate::MAX_NODES).contains(&n))
            .ok_or_else(|| format!("impossible node count {nodes}"))?;
        if control_bytes(nodes) != self.words.bytes() {
            return Err(format!(
                "control block is {} bytes, {} nodes need {}",
                self.words.bytes(),
                nodes,
                control_bytes(nodes)
            ));
        }
        Ok((nodes, size))
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.words.bytes()
    }

    /// The fault state of node `i` (`i` must be a valid node index).
    pub(crate) fn fault(&self, i: usize) -> Fault {
        Fault::decode(self.words.as_slice()[FAULTS_AT + i].load(Relaxed))
    }

    /// Sets the fault state of node `i` (`i` must be a valid node index).
    pub(crate) fn set_fault(&self, i: usize, fault: Fault) {
        self.words.as_slice()[FAULTS_AT + i].store(fault.encode(), Relaxed);
    }
}
