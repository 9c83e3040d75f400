//! The 8-byte metadata word that orders Safe-Guess tuples and names where
//! their value lives (SWARM §3.2, §4.3).
//!
//! ```text
//!  63           19 18      12  11  10  9       0
//! +---------------+----------+---+---+----------+
//! |   time (45)   | client(7)| V | H | slot (10)|
//! +---------------+----------+---+---+----------+
//! ```
//! A tuple's timestamp is `(time, client)`; `V` is the VERIFIED flag
//! (GUESSED < VERIFIED). `(client, time, slot)` names the writer's log entry
//! that holds the out-of-place copy of the value and the write's timestamp
//! lock: the entry is slot `slot` of the segment of the writer's log that
//! was current at `time` ([`crate::swarm::writerlog`]). `H` says that the
//! value is no longer read from that entry on the replica that holds the
//! word: it was moved to the object's home copy there, so that the entry
//! can be recycled ([`crate::swarm::recycle`]); a word changes from `H`
//! clear to `H` set only that way, and only once its tuple is VERIFIED.
//!
//! Words compare as integers: time first, then the writer; a client never
//! uses one time twice, so two different writes never compare equal, a
//! write's VERIFIED word is just above its GUESSED one, and its word with
//! `H` set just above that, below every later write: moving a value home
//! never changes the order of writes. 0 is bottom: no write yet.
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
pub const SLOT_BITS: u32 = 10;
/// Bits of the client field.
pub const CLIENT_BITS: u32 = 7;
/// Largest time; reserved for deletion markers (SWARM-KV §5.3.2).
pub const MAX_TIME: u64 = (1 << TIME_BITS) - 1;
/// Largest slot.
pub const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;
/// Largest client id; ids start at 1.
pub const MAX_CLIENT: u8 = (1 << CLIENT_BITS) - 1;
const HOME: u64 = 1 << SLOT_BITS;
const VERIFIED: u64 = HOME << 1;
const CLIENT_SHIFT: u32 = SLOT_BITS + 2;
const TIME_SHIFT: u32 = CLIENT_SHIFT + CLIENT_BITS;

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

    /// A GUESSED (unverified) tuple whose value is in its log entry. Fields
    /// are truncated to their widths.
    pub const fn new(time: u64, slot: u32, client: u8) -> Meta {
        Meta(
            (time & MAX_TIME) << TIME_SHIFT | ((client & MAX_CLIENT) as u64) << CLIENT_SHIFT | (slot & MAX_SLOT) as u64,
        )
    }

    /// The time part of the timestamp.
    pub const fn time(self) -> u64 {
        self.0 >> TIME_SHIFT
    }

    /// The writer's log entry within the segment current at [`Meta::time`].
    pub const fn slot(self) -> u32 {
        (self.0 as u32) & MAX_SLOT
    }

    /// The writer (the timestamp's thread id).
    pub const fn client(self) -> u8 {
        ((self.0 >> CLIENT_SHIFT) as u8) & MAX_CLIENT
    }

    /// Whether the tuple is VERIFIED.
    pub const fn verified(self) -> bool {
        self.0 & VERIFIED != 0
    }

    /// The same tuple, VERIFIED.
    pub const fn verify(self) -> Meta {
        Meta(self.0 | VERIFIED)
    }

    /// The write, GUESSED and with its value in its log entry: what
    /// identifies it whatever its flag and wherever its value is.
    pub const fn guessed(self) -> Meta {
        Meta(self.0 & !(VERIFIED | HOME))
    }

    /// Whether the value of the write is in the object's home copy on the
    /// replica that holds this word, not in the log entry (never for the
    /// deletion marker, which has no value).
    pub const fn home(self) -> bool {
        self.0 & HOME != 0 && !self.is_deleted()
    }

    /// The same word, the value moved to the object's home copy.
    pub const fn homed(self) -> Meta {
        Meta(self.0 | HOME)
    }

    /// The same word, the value in its log entry: what the word is in the
    /// order of tuples, wherever the value is. A replica holding either
    /// holds the same tuple.
    pub const fn unhomed(self) -> Meta {
        if self.is_deleted() { self } else { Meta(self.0 & !HOME) }
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
        let home = if self.home() { " home" } else { "" };
        write!(f, "Meta(t{} c{} slot{} {flag}{home})", self.time(), self.client(), self.slot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_year_of_microseconds_fits() {
        const { assert!(MAX_TIME > 365 * 24 * 3600 * 1_000_000) };
        const { assert!(TIME_BITS + CLIENT_BITS + 2 + SLOT_BITS == 64) };
        assert!(Meta::new(MAX_TIME - 1, MAX_SLOT, MAX_CLIENT).verify().homed() < Meta::DELETED);
    }

    #[test]
    fn bottom_is_below_every_write() {
        assert!(Meta::BOTTOM < Meta::new(1, 0, 1));
        assert!(Meta::new(1, 0, 1) < Meta::new(1, 0, 1).verify());
        assert!(Meta::new(1, 9, 1).verify() < Meta::new(2, 0, 1));
    }

    #[test]
    fn moving_a_value_home_keeps_the_order_of_writes() {
        let w = Meta::new(7, 300, 3).verify();
        assert!(w < w.homed() && w.homed() < Meta::new(7, 0, 4) && w.homed() < Meta::new(8, 0, 1));
        assert!(Meta::new(7, 0, 2).verify().homed() < Meta::new(7, 0, 3));
        assert_eq!(w.homed().unhomed(), w);
        assert_eq!(w.homed().guessed(), Meta::new(7, 300, 3));
        assert_eq!((w.homed().slot(), w.homed().client(), w.homed().time()), (300, 3, 7));
        assert!(w.homed().verified() && w.homed().home() && !w.home());
        assert_eq!(Meta::DELETED.unhomed(), Meta::DELETED);
        assert!(!Meta::DELETED.home(), "the marker has no value, at home or elsewhere");
    }

    proptest! {
        #[test]
        fn fields_roundtrip(time in 0..=MAX_TIME, slot in 0..=MAX_SLOT, client in 0..=MAX_CLIENT, v in any::<bool>(), h in any::<bool>()) {
            let m = if v { Meta::new(time, slot, client).verify() } else { Meta::new(time, slot, client) };
            let m = if h { m.homed() } else { m };
            prop_assert_eq!((m.time(), m.slot(), m.client(), m.verified(), m.home()), (time, slot, client, v, h));
            prop_assert_eq!(m.guessed().verify(), m.verify().unhomed());
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
