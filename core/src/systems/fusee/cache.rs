//! What a FUSEE client keeps of a cached key: the key's index entry as it
//! last saw it and the adaptive index cache's counters (§4.6), kept in the
//! shared location cache's payload (so the cache itself, and the other
//! stores that use it, are unchanged).
//!
//! Each get, update or insert of a cached key is an *access* (and so is
//! the one that cached it); one that found the cached word replaced by
//! another client's change (the slot read beside the object, a change's
//! lost round, or a lookup that found another word) is also *stale*. A
//! key whose stale accesses are more than the store's threshold (the
//! `bypass` option, a percentage of its accesses) is *bypassed*: its
//! gets, updates and inserts go straight to the index, which costs less
//! than a stale entry's try followed by the same lookup. A bypassed key
//! keeps its entry, and its lookups keep counting (stale if the word they
//! find is not the cached one), so a key whose writes stop comes back to
//! the cache.

use crate::index::Entry;

/// Accesses at which both counters are halved: they hold `WINDOW / 2` to
/// `WINDOW` accesses, the older ones weighing half as much at each
/// halving, so a key whose writes stop is cached again after a bounded
/// number of accesses, however long it was written before: it bypasses
/// at most 16 more at a threshold of 50%, 54 at 10% (tested).
pub const WINDOW: u8 = 32;

/// A cached key: its entry and its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cached {
    /// The key's entry as this client last saw it.
    pub entry: Entry,
    /// Accesses counted (fewer than [`WINDOW`]).
    uses: u8,
    /// Of which stale (at most `uses`).
    stale: u8,
}

impl Cached {
    /// A newly cached key: the access that found or made `entry` counts,
    /// not stale (as in FUSEE's code), so that one stale access after it
    /// does not bypass the key at once (at 50%).
    pub fn new(entry: Entry) -> Cached {
        Cached { entry, uses: 1, stale: 0 }
    }

    /// The same counters with a newer entry; `stale` counts the current
    /// access as stale (the word the client knew had been replaced).
    pub fn seen(self, entry: Entry, stale: bool) -> Cached {
        Cached { entry, stale: (self.stale + stale as u8).min(self.uses), ..self }
    }

    /// Whether accesses skip the cached entry: more than `percent` of the
    /// accesses counted were stale (never with none counted).
    pub fn bypassed(&self, percent: u8) -> bool {
        self.stale as u32 * 100 > self.uses as u32 * percent as u32
    }

    /// Counts an access, halving both counters when they reach
    /// [`WINDOW`] accesses.
    pub fn access(&mut self) {
        self.uses += 1;
        if self.uses >= WINDOW {
            (self.uses, self.stale) = (self.uses / 2, self.stale / 2);
        }
    }

    /// The counters: accesses, of which stale.
    #[cfg(test)]
    pub fn counts(&self) -> (u8, u8) {
        (self.uses, self.stale)
    }
}
