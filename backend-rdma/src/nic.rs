//! What the client needs of a NIC: post a chain of work requests on the
//! queue pair to a node as one doorbell, poll completions, and move bytes
//! in and out of its registered buffer arena.
//!
//! Two implement it: the verbs NIC (`verbs` feature, real hardware) and
//! [`crate::softnic::SoftNic`] (shared memory behind the same interface,
//! for tests). The client ([`crate::RdmaMemory`]) is written once against
//! this trait, so its batching, buffer ownership, completion handling,
//! time-outs and error mapping are tested without hardware.

use swarm_core::{MemError, MemErrorKind, NodeId};

/// `ibv_wc_status` values the client distinguishes (the rest are passed on
/// as [`MemErrorKind::Backend`] with their number).
pub mod status {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `IBV_WC_WR_FLUSH_ERR`: posted to (or outstanding on) a queue pair
    /// that had already failed.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// `IBV_WC_REM_INV_REQ_ERR`: the node refused the request's shape.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// `IBV_WC_REM_ACCESS_ERR`: outside the region, or a wrong key.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// `IBV_WC_RETRY_EXC_ERR`: the node did not acknowledge within the
    /// transport's retries: it is down, or the path to it is.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: receiver not ready, retries exhausted.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// `IBV_WC_REM_ABORT_ERR`: the responder aborted the operation.
    pub const REM_ABORT_ERR: u32 = 16;
    /// `IBV_WC_FATAL_ERR`: the device failed.
    pub const FATAL_ERR: u32 = 19;
    /// `IBV_WC_RESP_TIMEOUT_ERR`: no response in time.
    pub const RESP_TIMEOUT_ERR: u32 = 20;
}

/// [`MemErrorKind::Backend`] codes at or above this are an `errno` from
/// posting (`ibv_post_send`), plus this offset; below it, a completion's
/// `ibv_wc_status`.
pub const POST_ERRNO: u32 = 0x1_0000;

/// What a work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrKind {
    /// RDMA READ of `len` bytes into the local buffer.
    Read,
    /// RDMA WRITE of `len` bytes from the local buffer.
    Write,
    /// 8-byte ATOMIC compare-and-swap; the old value lands in the local buffer.
    Cas {
        /// Compare value.
        expected: u64,
        /// Swap value.
        new: u64,
    },
}

/// One work request, in the NIC-neutral form the client builds: local
/// bytes are named by their offset in the NIC's buffer arena, remote ones
/// by their offset in the node's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wr {
    /// Handed back in the completion.
    pub id: u64,
    /// READ, WRITE or CAS.
    pub kind: WrKind,
    /// Local buffer: offset in the arena.
    pub local: u32,
    /// Bytes moved (8 for a CAS).
    pub len: u32,
    /// Offset in the node's region.
    pub remote: u64,
    /// Whether a completion is generated on success (errors always are).
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: wait for earlier READs and atomics of the queue
    /// pair to complete before this one starts.
    pub fence: bool,
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Wc {
    /// The work request's id.
    pub id: u64,
    /// `ibv_wc_status` ([`status::SUCCESS`] or an error).
    pub status: u32,
    /// The vendor's error syndrome, for people.
    pub vendor: u32,
}

/// A NIC as the client uses it: one queue pair per memory node, one
/// completion queue, one registered buffer arena.
pub trait Nic {
    /// Memory nodes, one queue pair each.
    fn node_count(&self) -> usize;

    /// Bytes of `node`'s region.
    fn node_size(&self, node: NodeId) -> u64;

    /// Bytes of the registered buffer arena.
    fn arena_size(&self) -> u32;

    /// Work requests each queue pair's send queue holds.
    fn queue_depth(&self) -> usize;

    /// Posts `chain` on `node`'s queue pair in one doorbell, in order.
    /// A refusal says why and how many of the chain's first requests were
    /// posted all the same (`ibv_post_send` stops at the first bad one):
    /// those are in flight, and their buffers in use, until they complete.
    fn post(&self, node: NodeId, chain: &[Wr]) -> Result<(), PostError>;

    /// Puts `node`'s queue pair in the error state: whatever is outstanding
    /// on it completes with a flush error, and nothing more is executed.
    fn fail(&self, node: NodeId);

    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [Wc]) -> usize;

    /// Copies `data` into the arena at `at`.
    ///
    /// # Safety
    /// No posted work request whose completion has not yet been polled may
    /// use `[at, at + data.len())`, and the range must be inside the arena.
    unsafe fn put(&self, at: u32, data: &[u8]);

    /// Copies the arena's bytes at `at` into `out`.
    ///
    /// # Safety
    /// As for [`Nic::put`]: the range is in the arena and no work request
    /// in flight uses it.
    unsafe fn get(&self, at: u32, out: &mut [u8]);
}

/// A chain the NIC refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Why (an `errno`).
    pub errno: i32,
    /// How many of the chain's first requests were posted before the
    /// refused one.
    pub posted: usize,
}

/// The core's error for a failed completion on `node`.
pub fn completion_error(node: NodeId, status: u32) -> MemError {
    use status::*;
    let kind = match status {
        // The node (or the path to it, or this queue pair) is gone: what
        // the protocols treat as a crashed node.
        WR_FLUSH_ERR | RETRY_EXC_ERR | RNR_RETRY_EXC_ERR | REM_ABORT_ERR => MemErrorKind::Unreachable,
        RESP_TIMEOUT_ERR => MemErrorKind::TimedOut,
        code => MemErrorKind::Backend { code },
    };
    MemError::new(node, kind)
}

/// The core's error for a chain the NIC refused to post.
pub fn post_error(node: NodeId, errno: i32) -> MemError {
    MemError::new(node, MemErrorKind::Backend { code: POST_ERRNO + errno.unsigned_abs().min(0xffff) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_nodes_read_as_unreachable_and_the_rest_keep_their_code() {
        let n = NodeId(2);
        for s in [status::WR_FLUSH_ERR, status::RETRY_EXC_ERR, status::RNR_RETRY_EXC_ERR, status::REM_ABORT_ERR] {
            assert_eq!(completion_error(n, s).kind, MemErrorKind::Unreachable, "status {s}");
        }
        assert_eq!(completion_error(n, status::RESP_TIMEOUT_ERR).kind, MemErrorKind::TimedOut);
        assert_eq!(completion_error(n, status::REM_ACCESS_ERR).kind, MemErrorKind::Backend { code: 10 });
        assert_eq!(completion_error(n, status::FATAL_ERR).kind, MemErrorKind::Backend { code: 19 });
        assert_eq!(completion_error(n, 4).node, n);
        assert_eq!(post_error(n, 12).kind, MemErrorKind::Backend { code: POST_ERRNO + 12 });
        assert_eq!(post_error(n, -22).kind, MemErrorKind::Backend { code: POST_ERRNO + 22 });
    }
}
