//! A key's lock word (pDPM §4.1: "an 8-byte value at the beginning of
//! each data entry"), on the key's primary only, with a lease.
//!
//! ```text
//! 0                         free
//! holder (7) | expiry (57)  held by client `holder` (1..=126) until `expiry`,
//!                           in ticks of the clients' common clock
//! ```
//!
//! The paper's lock is a bare 0/1 word: a client that dies holding it
//! blocks its key for ever (the paper leaves this open, issue #22). Here
//! the holder writes its expiry in the word, and a client that finds the
//! lock held past its expiry and the toolkit's grace
//! ([`crate::substrate::lease::grace`]: the skew bound between clients'
//! clocks, and time for the holder's last writes to land) takes it over
//! with a CAS from the word it saw. The holder, for its part, never starts
//! a round of writes unless at least half of its lease is left, and
//! renews the lease by CAS (from its own word) when less is; a round never
//! waits longer than [`PATIENCE_NS`], half a lease. So by the time
//! another client may take a lock over, its holder has stopped writing,
//! under the timing assumption the lease table of client ids makes too.
//!
//! The word is only ever changed by CAS, never by a WRITE (issue #22, item
//! 7: the InfiniBand specification does not make a NIC's CAS atomic
//! against a plain WRITE of the same word, and the paper unlocks with a
//! WRITE): taken with `CAS(0 -> mine)`, taken over with `CAS(theirs ->
//! mine)`, renewed with `CAS(mine -> mine')`, released with `CAS(mine ->
//! 0)`. A release that finds another word does nothing: the lock was taken
//! over, and a blind write would have freed the new holder's lock.

use crate::kv::MAX_CLIENTS;
use crate::substrate::clock::{Clock, MAX_SKEW_NS};
use crate::substrate::lease;
use crate::{MemError, Memory, RemoteAddr};

/// How long a holder's lease on a lock lasts, ns: ten thousand times a
/// write's four roundtrips, so that renewals are rare, and short beside
/// the grace that dominates how long a dead holder blocks its key.
pub const LEASE_NS: u64 = 100_000_000;
/// How long a holder waits for the primary to answer one round (retrying
/// while it times out: a stalled node comes back) before giving up, ns:
/// half a lease, so that a round started with half a lease left never
/// writes past it.
pub const PATIENCE_NS: u64 = LEASE_NS / 2;
/// Bits of the expiry: 2^57 ticks, over 450 years of 100 ns ticks.
const EXPIRY_BITS: u32 = 57;
const EXPIRY_MASK: u64 = (1 << EXPIRY_BITS) - 1;

/// The word of a lock held by client `holder` until `expiry` (ticks).
pub fn held(holder: u8, expiry: u64) -> u64 {
    (holder as u64) << EXPIRY_BITS | (expiry & EXPIRY_MASK)
}

/// The lease times of one client's clock, in its ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A lease.
    pub lease: u64,
    /// How long past an expiry a lock stays its holder's
    /// ([`lease::grace`]).
    pub grace: u64,
    /// How far another client's clock may be ahead ([`MAX_SKEW_NS`]).
    pub skew: u64,
    /// [`PATIENCE_NS`].
    pub patience: u64,
    /// Nanoseconds per tick.
    pub tick_ns: u64,
}

impl Timing {
    /// The times of `clock`.
    pub fn of<C: Clock>(clock: &C) -> Timing {
        Timing {
            lease: clock.ticks(LEASE_NS),
            grace: lease::grace(clock),
            skew: clock.ticks(MAX_SKEW_NS),
            patience: clock.ticks(PATIENCE_NS),
            tick_ns: clock.tick_ns().max(1),
        }
    }
}

/// What a client makes of a lock word it read at its time `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Free.
    Free,
    /// Held by a client that may still be writing: wait. From `takeover`
    /// (ticks) on, it may be taken over.
    Held {
        /// When it may be taken over.
        takeover: u64,
    },
    /// Held past its expiry and the grace: its holder has stopped; take it
    /// over (CAS from this word).
    Expired,
    /// No word a client writes: holder 0 or out of range, or an expiry
    /// further ahead than a lease from any clock (garbage).
    Garbled,
}

/// Judges lock word `word` at time `now` (ticks).
pub fn judge(word: u64, now: u64, t: &Timing) -> Seen {
    if word == 0 {
        return Seen::Free;
    }
    let (holder, expiry) = ((word >> EXPIRY_BITS) as u8, word & EXPIRY_MASK);
    if holder == 0 || holder > MAX_CLIENTS || expiry > now.saturating_add(t.lease + t.skew) {
        return Seen::Garbled;
    }
    let takeover = expiry.saturating_add(t.grace);
    if now > takeover { Seen::Expired } else { Seen::Held { takeover } }
}

/// Changes the lock word at `at` from `from` to `to` by CAS, never by a
/// WRITE: taking a free lock (`0 -> mine`), taking over an expired one
/// (`theirs -> mine`), renewing one's lease (`mine -> mine'`) or releasing
/// (`mine -> 0`). Whether the word is `to` now: it was `from`, or already
/// `to` (an earlier try that timed out landed). Otherwise nothing changed:
/// the lock is another's (for a holder: taken over after its lease).
/// The loom check `loom-tests/tests/pdpm_lock.rs` races these.
pub async fn swing<M: Memory>(mem: &M, at: RemoteAddr, from: u64, to: u64) -> Result<bool, MemError> {
    let prev = mem.cas(at, from, to).await?;
    Ok(prev == from || prev == to)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Microsecond ticks.
    fn timing() -> Timing {
        Timing::of(&|| 0u64)
    }

    #[test]
    fn a_lock_is_held_then_expires_after_the_grace() {
        let t = timing();
        assert_eq!((t.lease, t.grace, t.skew, t.patience), (100_000, 3_000_000, 1_000_000, 50_000));
        let now = 5_000_000;
        let w = held(3, now + t.lease);
        assert_eq!(judge(0, now, &t), Seen::Free);
        let takeover = now + t.lease + t.grace;
        assert_eq!(judge(w, now, &t), Seen::Held { takeover });
        assert_eq!(judge(w, takeover, &t), Seen::Held { takeover }, "the grace is inclusive");
        assert_eq!(judge(w, takeover + 1, &t), Seen::Expired);
        // A holder whose clock runs ahead by less than the skew bound.
        assert!(matches!(judge(held(3, now + t.lease + t.skew), now, &t), Seen::Held { .. }));
    }

    #[test]
    fn words_no_client_writes_are_garbled() {
        let t = timing();
        let now = 5_000_000;
        assert_eq!(judge(held(0, now), now, &t), Seen::Garbled, "holder 0");
        assert_eq!(judge(held(127, now), now, &t), Seen::Garbled, "holder 127");
        assert_eq!(judge(held(3, now + t.lease + t.skew + 1), now, &t), Seen::Garbled, "too far ahead");
        assert_eq!(judge(0x0101_0000_0000_0010, now, &t), Seen::Garbled);
    }

    proptest! {
        #[test]
        fn words_read_back(holder in 1u8..=126, expiry in 0u64..(1 << 57)) {
            let t = timing();
            let w = held(holder, expiry);
            prop_assert_eq!((w >> 57) as u8, holder);
            prop_assert_eq!(w & EXPIRY_MASK, expiry);
            prop_assert_ne!(judge(w, expiry, &t), Seen::Garbled);
            prop_assert_ne!(judge(w, expiry, &t), Seen::Free);
        }

        /// Any word, at any time: a judgement, never a panic.
        #[test]
        fn any_word_is_judged(w in any::<u64>(), now in any::<u64>()) {
            let _ = judge(w, now, &timing());
        }
    }
}
