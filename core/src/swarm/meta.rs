//! The 8-byte metadata word that orders Safe-Guess tuples and names where
//! their value lives (SWARM §3.2, §4.3).
//!
//! ```text
//!  63        32 31          8 7       1   0
//! +------------+-------------+---------+---+
//! |  time (32) | log id (24) | client  | V |
//! +------------+-------------+---------+---+
//! ```
//! A tuple's timestamp is `(time, client)`; `V` is the VERIFIED flag
//! (GUESSED < VERIFIED). `(client, log id)` names the writer's log entry
//! that holds the out-of-place copy of the value and the write's timestamp
//! lock (the layout of the authors' code). Words compare as integers: time
//! first, then the log id, which a client never reuses, so two different
//! writes never compare equal and a write's VERIFIED word is just above its
//! GUESSED one. 0 is bottom: no write yet.

use core::fmt;

/// Bits of the time field.
pub const TIME_BITS: u32 = 32;
/// Bits of the log id field.
pub const LOG_BITS: u32 = 24;
/// Bits of the client field.
pub const CLIENT_BITS: u32 = 7;
/// Largest time; reserved for deletion markers (SWARM-KV §5.3.2).
pub const MAX_TIME: u64 = (1 << TIME_BITS) - 1;
/// Largest log id.
pub const MAX_LOG_ID: u32 = (1 << LOG_BITS) - 1;
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
    pub const fn new(time: u64, log_id: u32, client: u8) -> Meta {
        Meta(
            (time & MAX_TIME) << (LOG_BITS + CLIENT_BITS + 1)
                | ((log_id & MAX_LOG_ID) as u64) << (CLIENT_BITS + 1)
                | ((client & MAX_CLIENT) as u64) << 1,
        )
    }

    /// The time part of the timestamp.
    pub const fn time(self) -> u64 {
        self.0 >> (LOG_BITS + CLIENT_BITS + 1)
    }

    /// The writer's log entry.
    pub const fn log_id(self) -> u32 {
        ((self.0 >> (CLIENT_BITS + 1)) as u32) & MAX_LOG_ID
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
        write!(f, "Meta(t{} c{} log{} {flag})", self.time(), self.client(), self.log_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bottom_is_below_every_write() {
        assert!(Meta::BOTTOM < Meta::new(1, 0, 1));
        assert!(Meta::new(1, 0, 1) < Meta::new(1, 0, 1).verify());
        assert!(Meta::new(1, 9, 1).verify() < Meta::new(2, 0, 1));
    }

    proptest! {
        #[test]
        fn fields_roundtrip(time in 0..=MAX_TIME, log in 0..=MAX_LOG_ID, client in 0..=MAX_CLIENT, v in any::<bool>()) {
            let m = if v { Meta::new(time, log, client).verify() } else { Meta::new(time, log, client) };
            prop_assert_eq!((m.time(), m.log_id(), m.client(), m.verified()), (time, log, client, v));
            prop_assert_eq!(m.guessed().verify(), m.verify());
        }

        #[test]
        fn order_is_time_first(a in (1..=MAX_TIME, 0..=MAX_LOG_ID, 1..=MAX_CLIENT), b in (1..=MAX_TIME, 0..=MAX_LOG_ID, 1..=MAX_CLIENT)) {
            let (x, y) = (Meta::new(a.0, a.1, a.2), Meta::new(b.0, b.1, b.2));
            if a.0 != b.0 {
                prop_assert_eq!(x < y, a.0 < b.0);
            }
        }
    }
}
