//! The 8-byte metadata word that orders Safe-Guess tuples and names where
//! their value lives (SWARM §3.2, §4.3).
//!
//! ```text
//!  63           19 18        8 7       1   0
//! +---------------+-----------+---------+---+
//! |   time (45)   | slot (11) | client  | V |
//! +---------------+-----------+---------+---+
//! ```
//! A tuple's timestamp is `(time, client)`; `V` is the VERIFIED flag
//! (GUESSED < VERIFIED). `(client, time, slot)` names the writer's log entry
//! that holds the out-of-place copy of the value and the write's timestamp
//! lock: the entry is slot `slot` of the segment of the writer's log that
//! was current at `time` ([`crate::swarm::writerlog`]). Words compare as
//! integers: time first; a client never uses one time twice, so two
//! different writes never compare equal, and a write's VERIFIED word is
//! just above its GUESSED one. 0 is bottom: no write yet.
//!
//! Time is in the clients' clock ticks (microseconds for [`SystemClock`]
//! since the store was set up): 45 bits last 407 days of microseconds. The
//! authors' code has 32 bits of time and 24 of log id, 71 minutes; the log
//! id's bits went to time, since the segment that the time falls in gives
//! what they named.
//!
//! [`SystemClock`]: crate::substrate::clock::SystemClock

use core::fmt;

/// Bits of the time field.
pub const TIME_BITS: u32 = 45;
/// Bits of the slot field (an entry of a log segment).
pub const SLOT_BITS: u32 = 11;
/// Bits of the client field.
pub const CLIENT_BITS: u32 = 7;
/// Largest time; reserved for deletion markers (SWARM-KV §5.3.2).
pub const MAX_TIME: u64 = (1 << TIME_BITS) - 1;
/// Largest slot.
pub const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;
/// Largest client id; ids start at 1.
pub const MAX_CLIENT: u8 = (1 << CLIENT_BITS) - 1;

/// A metadata word.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Meta(pub u64);

impl Meta {
    /// No write yet.
    pub const BOTTOM: Meta = Meta(0);

    /// The deletion marker of SWARM-KV (§5.3.2): every bit set, the largest
    /// word there is, so nothing can overwrite it. It names no log entry and
    /// carries no value; a register holding it stays deleted for good (a
    /// deleted key is inserted again into fresh replicas).
    pub const DELETED: Meta = Meta(u64::MAX);

    /// A GUESSED (unverified) tuple. Fields are truncated to their widths.
    pub const fn new(time: u64, slot: u32, client: u8) -> Meta {
        Meta(
            (time & MAX_TIME) << (SLOT_BITS + CLIENT_BITS + 1)
                | ((slot & MAX_SLOT) as u64) << (CLIENT_BITS + 1)
                | ((client & MAX_CLIENT) as u64) << 1,
        )
    }

    /// The time part of the timestamp.
    pub const fn time(self) -> u64 {
        self.0 >> (SLOT_BITS + CLIENT_BITS + 1)
    }

    /// The writer's log entry within the segment current at [`Meta::time`].
    pub const fn slot(self) -> u32 {
        ((self.0 >> (CLIENT_BITS + 1)) as u32) & MAX_SLOT
    }

    /// The writer (the timestamp's thread id).
    pub const fn client(self) -> u8 {
        ((self.0 >> 1) as u8) & MAX_CLIENT
    }

    /// Whether the tuple is VERIFIED.
    pub const fn verified(self) -> bool {
        self.0 & 1 == 1
    }

    /// The same tuple, VERIFIED.
    pub const fn verify(self) -> Meta {
        Meta(self.0 | 1)
    }

    /// The same tuple, GUESSED: what identifies the write whatever its flag.
    pub const fn guessed(self) -> Meta {
        Meta(self.0 & !1)
    }

    /// Whether this is bottom.
    pub const fn is_bottom(self) -> bool {
        self.0 == 0
    }

    /// Whether this is the deletion marker.
    pub const fn is_deleted(self) -> bool {
        self.0 == u64::MAX
    }

    /// The timestamp `(time, client)` packed for a timestamp lock (non-zero
    /// for any real write).
    pub const fn lock_ts(self) -> u64 {
        (self.time() << CLIENT_BITS) | self.client() as u64
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_bottom() {
            return write!(f, "Meta(⊥)");
        }
        if self.is_deleted() {
            return write!(f, "Meta(deleted)");
        }
        let flag = if self.verified() { "V" } else { "G" };
        write!(f, "Meta(t{} c{} slot{} {flag})", self.time(), self.client(), self.slot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_year_of_microseconds_fits() {
        const { assert!(MAX_TIME > 365 * 24 * 3600 * 1_000_000) };
        const { assert!(TIME_BITS + SLOT_BITS + CLIENT_BITS + 1 == 64) };
        assert!(Meta::new(MAX_TIME - 1, MAX_SLOT, MAX_CLIENT).verify() < Meta::DELETED);
    }

    #[test]
    fn bottom_is_below_every_write() {
        assert!(Meta::BOTTOM < Meta::new(1, 0, 1));
        assert!(Meta::new(1, 0, 1) < Meta::new(1, 0, 1).verify());
        assert!(Meta::new(1, 9, 1).verify() < Meta::new(2, 0, 1));
    }

    proptest! {
        #[test]
        fn fields_roundtrip(time in 0..=MAX_TIME, slot in 0..=MAX_SLOT, client in 0..=MAX_CLIENT, v in any::<bool>()) {
            let m = if v { Meta::new(time, slot, client).verify() } else { Meta::new(time, slot, client) };
            prop_assert_eq!((m.time(), m.slot(), m.client(), m.verified()), (time, slot, client, v));
            prop_assert_eq!(m.guessed().verify(), m.verify());
        }

        #[test]
        fn order_is_time_first(a in (1..=MAX_TIME, 0..=MAX_SLOT, 1..=MAX_CLIENT), b in (1..=MAX_TIME, 0..=MAX_SLOT, 1..=MAX_CLIENT)) {
            let (x, y) = (Meta::new(a.0, a.1, a.2), Meta::new(b.0, b.1, b.2));
            if a.0 != b.0 {
                prop_assert_eq!(x < y, a.0 < b.0);
            }
        }
    }
}
