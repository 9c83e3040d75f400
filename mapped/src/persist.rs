//! Persistence hooks: what an operation must do, beyond its atomic accesses,
//! for its effects to reach a durability or visibility domain that the CPU
//! caches are not part of.
//!
//! On shared memory (`swarm-backend-shm`) nothing: the caches are coherent
//! and nothing outlives the machine, so the handle's default is
//! [`Coherent`], whose hooks are empty and compile away. A backend over
//! persistent or non-coherent memory (`swarm-backend-cxl`: DAX devices, CXL
//! pools) plugs in an implementation that writes cache lines back and
//! fences them, and reuses everything else of this crate (bounds checks,
//! latency and fault injection, the word layer) through
//! [`MappedMemory::with_persistence`](crate::MappedMemory::with_persistence).
//!
//! # When the hooks run
//!
//! Every operation, including the operations of a pipeline and background
//! operations, calls them around its accesses to a node's words:
//!
//! - a read: [`before_read`](Persistence::before_read) on the bytes it is
//!   about to load;
//! - a write: [`after_write`](Persistence::after_write) on the bytes it
//!   stored;
//! - a CAS: first [`drain`](Persistence::drain) if anything was written
//!   earlier in the same pipeline and not drained yet (so that the data of a
//!   write-then-CAS is written back before the CAS is issued: whoever sees
//!   the CAS, in memory or after a crash, sees the data), then
//!   `before_read` and `after_write` on its word (whether or not it
//!   succeeded: the value it returns may be one that its writer has not
//!   written back yet, and writing it back again is cheap insurance);
//! - at the end of an operation (or pipeline) that wrote anything,
//!   `drain` again, so that a completed operation is durable.

use crate::atomic::AtomicU64;

/// Hooks that make a memory's contents durable or visible beyond this
/// host's caches; see the [module documentation](self) for when each runs.
///
/// Implementations are per client handle (each [`crate::MappedMemory`] owns
/// one), so they may keep statistics. Offsets and lengths given to the
/// hooks were bounds-checked against `words`; a hook must not panic.
pub trait Persistence: Send + Sync {
    /// Before loading bytes `offset..offset + len` of `words` (for memory
    /// that other hosts write without hardware coherence: drop stale cached
    /// copies of those lines).
    #[inline]
    fn before_read(&self, words: &[AtomicU64], offset: u64, len: usize) {
        let _ = (words, offset, len);
    }

    /// After storing bytes `offset..offset + len` of `words` (start writing
    /// those lines back to memory).
    #[inline]
    fn after_write(&self, words: &[AtomicU64], offset: u64, len: usize) {
        let _ = (words, offset, len);
    }

    /// Waits until every write-back that [`after_write`](Self::after_write)
    /// started has completed.
    #[inline]
    fn drain(&self) {}
}

/// Coherent, volatile memory: no hooks (the default of
/// [`crate::MappedMemory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coherent;

impl Persistence for Coherent {}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Mutex;

    use swarm_core::substrate::exec::block_on;
    use swarm_core::{Memory, NodeId, Op, RemoteAddr};

    use super::*;
    use crate::Nodes;

    /// Records the hooks it sees.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    impl Persistence for Recorder {
        fn before_read(&self, _: &[AtomicU64], offset: u64, len: usize) {
            self.0.lock().unwrap().push(format!("read {offset}+{len}"));
        }
        fn after_write(&self, _: &[AtomicU64], offset: u64, len: usize) {
            self.0.lock().unwrap().push(format!("wrote {offset}+{len}"));
        }
        fn drain(&self) {
            self.0.lock().unwrap().push("drain".into());
        }
    }

    #[test]
    fn hooks_run_in_pipeline_order_and_drain_before_a_cas() {
        let mem = Nodes::anonymous(1, 4096).unwrap().memory().with_persistence(Recorder::default());
        let ops = [
            Op::Write { offset: 8, data: &[1; 16] },
            Op::Write { offset: 128, data: &[2; 64] },
            Op::Cas { offset: 0, expected: 0, new: 1 },
            Op::Read { offset: 0, len: 32 },
        ];
        block_on(mem.pipeline(NodeId(0), &ops)).unwrap();
        assert_eq!(
            mem.persistence().take(),
            ["wrote 8+16", "wrote 128+64", "drain", "read 0+8", "wrote 0+8", "read 0+32", "drain"]
        );
        // Reads alone drain nothing; a lone write or CAS drains once.
        block_on(mem.read(RemoteAddr::new(NodeId(0), 0), 8)).unwrap();
        block_on(mem.write(RemoteAddr::new(NodeId(0), 64), &[3; 8])).unwrap();
        block_on(mem.cas(RemoteAddr::new(NodeId(0), 0), 1, 2)).unwrap();
        assert_eq!(mem.persistence().take(), ["read 0+8", "wrote 64+8", "drain", "read 0+8", "wrote 0+8", "drain"]);
        // A rejected request runs no hook.
        assert!(block_on(mem.write(RemoteAddr::new(NodeId(0), 4090), &[0; 8])).is_err());
        assert!(mem.persistence().take().is_empty());
    }
}
