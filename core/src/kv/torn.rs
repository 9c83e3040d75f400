//! Reads that found a value torn: a copy read while a write to it was in
//! flight (its checksum or tag does not match), or garbled.
//!
//! Stores that write values in place (RAW, pDPM-Direct's committed space)
//! cannot tell the two apart from one read. A write in flight ends within
//! a roundtrip or two, so a reader reads again; a copy that stays torn for
//! [`TORN_PATIENCE_NS`] is not being written (its writer died mid-write,
//! or the memory is corrupt) and the reader gives up, saying so
//! ([`KvError::Torn`]). A count of tries alone is no bound: two clients
//! that write and read one hot key back to back tear each other's reads
//! many times in a row.

use crate::Memory;
use crate::substrate::memory::pause_jittered;
use crate::substrate::mutant::mutant;

use super::KvError;

/// How long a copy may stay torn before a reader gives up on it: far past
/// any write in flight (microseconds), short enough that a dead writer's
/// copy is reported at once to a user.
pub const TORN_PATIENCE_NS: u64 = 50_000_000;

/// The first pause between reads of a torn copy; pauses double from it.
const FIRST_PAUSE_NS: u64 = 500;

/// The longest pause between two reads of a torn copy.
const MAX_PAUSE_NS: u64 = 1_000_000;

/// Reads of a copy without memory time: what bounds them instead of
/// [`TORN_PATIENCE_NS`].
const MAX_READS_UNTIMED: u32 = 4_096;

/// One operation's torn reads so far, and when the first one was.
#[derive(Clone, Copy, Debug)]
pub struct TornReads {
    reads: u32,
    first_ns: u64,
    pause_ns: u64,
    rng: u64,
}

impl TornReads {
    /// None yet; `seed` jitters the pauses (the reader's id and the key's
    /// hash, say: readers of one copy pause for different times).
    pub fn new(seed: u64) -> Self {
        TornReads { reads: 0, first_ns: 0, pause_ns: FIRST_PAUSE_NS, rng: seed | 1 }
    }

    /// Counts one more torn read and waits before the next (pauses that
    /// double, jittered so that a reader and a writer that collide stop
    /// colliding), or gives up with [`KvError::Torn`] once the copy has
    /// stayed torn for [`TORN_PATIENCE_NS`].
    pub async fn again<M: Memory>(&mut self, mem: &M) -> Result<(), KvError> {
        if mutant!("torn-impatient") {
            // A few tries at once, what RAW did: gives up within
            // microseconds on a copy that a hot key's writer keeps tearing.
            self.reads += 1;
            return if self.reads as usize >= super::place::RETRIES { Err(KvError::Corrupt) } else { Ok(()) };
        }
        let now = mem.now_ns();
        if self.reads == 0 {
            self.first_ns = now.unwrap_or(0);
        }
        self.reads = self.reads.saturating_add(1);
        let waited = now.map(|t| t.saturating_sub(self.first_ns));
        let out_of_patience = match waited {
            Some(ns) => ns >= TORN_PATIENCE_NS,
            None => self.reads >= MAX_READS_UNTIMED,
        };
        if out_of_patience {
            return Err(KvError::Torn { reads: self.reads, ms: waited.unwrap_or(0) / 1_000_000 });
        }
        pause_jittered(mem, self.pause_ns, &mut self.rng).await;
        self.pause_ns = (2 * self.pause_ns).min(MAX_PAUSE_NS);
        Ok(())
    }
}
