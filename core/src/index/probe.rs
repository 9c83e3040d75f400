//! What a client decides from a key's candidate slots, whatever holds them:
//! which blocks it must read to learn whose key a slot holds, where an
//! insert goes, and what a lost CAS on the key's slot means. The rules of
//! [`crate::index`] ("Concurrent inserts of one key") live here once, for
//! the single-node index ([`super::race`]) and the replicated one that
//! issue #21 builds on SNAPSHOT; the I/O (reading buckets and blocks,
//! posting CASes) stays with each index.

use core::future::Future;

use crate::index::IndexError;
use crate::index::layout::{CANDIDATES, COMBINED_BYTES, Candidate, KeyHash, SlotWord};
use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_all};

/// What a client knows of a candidate slot's word: whose key it holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Owner {
    /// Not resolved (no need, or not yet).
    Unknown,
    /// This key; the block's location.
    Key(u64),
    /// Another key with the same fingerprint and length.
    Other,
}

/// A client's view of a key's candidate slots, in the key's fixed order.
pub(super) struct View {
    pub cands: heapless::Vec<Candidate, CANDIDATES>,
    pub words: [SlotWord; CANDIDATES],
    owners: [Owner; CANDIDATES],
}

/// Where an insert of the key goes, given a resolved [`View`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Choice {
    /// The key is live in slot `i`, at this location.
    Exists(usize, u64),
    /// Slot `i`: the first, in the key's order, that is empty or the key's
    /// own tombstone (rules 1 and 2).
    Take(usize),
    /// No candidate slot may take the key.
    Full,
}

impl View {
    /// The slots `cands` as read (`words`), no owner known yet.
    pub fn new(cands: heapless::Vec<Candidate, CANDIDATES>, words: [SlotWord; CANDIDATES]) -> View {
        View { cands, words, owners: [Owner::Unknown; CANDIDATES] }
    }

    /// The view of `cands` from the key's two combined buckets as read
    /// (`reads[c.read]` holds candidate `c`); `None` if a read is short.
    pub fn from_combined(cands: heapless::Vec<Candidate, CANDIDATES>, reads: [&[u8]; 2]) -> Option<View> {
        let mut words = [SlotWord::EMPTY; CANDIDATES];
        for (i, c) in cands.iter().enumerate() {
            let buf = reads[c.read as usize];
            words[i] = SlotWord(word_at(buf.get(..COMBINED_BYTES)?, c.at as usize)?);
        }
        Some(View::new(cands, words))
    }

    pub fn len(&self) -> usize {
        self.cands.len()
    }

    /// Sets slot `i`'s word as seen later (e.g. returned by a failed CAS).
    pub fn set(&mut self, i: usize, w: SlotWord) {
        if self.words[i] != w {
            self.words[i] = w;
            self.owners[i] = Owner::Unknown;
        }
    }

    fn first_empty(&self) -> usize {
        (0..self.len()).find(|&i| self.words[i].is_empty()).unwrap_or(self.len())
    }

    /// The slots whose owner matters and is unknown, as many as one
    /// roundtrip reads: live slots with the key's fingerprint and length,
    /// and (for inserts, `tombs`) such tombstones before the first empty
    /// slot, which an insert may take back only if they are the key's.
    pub fn unresolved(&self, kh: &KeyHash, tombs: bool) -> heapless::Vec<usize, MAX_REPLICAS> {
        let first_empty = self.first_empty();
        let wanted = |i: usize| {
            let w = self.words[i];
            self.owners[i] == Owner::Unknown && w.matches(kh) && (w.is_live() || (tombs && i < first_empty))
        };
        (0..self.len()).filter(|&i| wanted(i)).take(MAX_REPLICAS).collect()
    }

    /// Records that slot `i`'s block holds `location`, and whether it is
    /// the key's (`mine`) or another key's.
    pub fn resolved(&mut self, i: usize, location: u64, mine: bool) {
        self.owners[i] = if mine { Owner::Key(location) } else { Owner::Other };
    }

    /// Resolves every slot whose owner matters ([`View::unresolved`]),
    /// reading their blocks in parallel (one roundtrip each round, usually
    /// just one round): `read(candidate, word)` answers the block's
    /// location and whether it holds the key.
    pub async fn resolve<F: Future<Output = Result<(u64, bool), IndexError>>>(
        &mut self,
        kh: &KeyHash,
        tombs: bool,
        read: impl Fn(Candidate, SlotWord) -> F,
    ) -> Result<(), IndexError> {
        loop {
            let batch = self.unresolved(kh, tombs);
            if batch.is_empty() {
                return Ok(());
            }
            let reads = join_all(batch.iter().map(|&i| read(self.cands[i], self.words[i])).collect()).await;
            for (&i, r) in batch.iter().zip(reads.results) {
                // Every read answered (`join_all`); an unanswered one is read again.
                if let Some(r) = r {
                    let (location, mine) = r?;
                    self.resolved(i, location, mine);
                }
            }
        }
    }

    /// The slot holding the key live, if any, and its location.
    pub fn live(&self) -> Option<(usize, u64)> {
        (0..self.len()).find_map(|i| match self.owners[i] {
            Owner::Key(loc) if self.words[i].is_live() => Some((i, loc)),
            _ => None,
        })
    }

    /// Where an insert goes, once [`unresolved`](Self::unresolved) (with
    /// tombstones) is empty.
    pub fn insert_choice(&self) -> Choice {
        if let Some((i, loc)) = self.live() {
            return Choice::Exists(i, loc);
        }
        let free =
            |i: usize| self.words[i].is_empty() || (self.words[i].is_tomb() && matches!(self.owners[i], Owner::Key(_)));
        // FUSEE's duplicate-insert gap (notes §3): an insert takes a free
        // slot of the main bucket it sees less loaded, not the first in the
        // key's fixed order, so two inserts of one key that saw different
        // loads both succeed, in two slots.
        if mutant!("any-empty-slot") {
            let used =
                |r: u8| (0..self.len()).filter(|&i| self.cands[i].read == r && !self.words[i].is_empty()).count();
            let less = u8::from(used(1) < used(0));
            if let Some(i) = (0..self.len()).find(|&i| self.cands[i].read == less && free(i)) {
                return Choice::Take(i);
            }
        }
        (0..self.len()).find(|&i| free(i)).map_or(Choice::Full, Choice::Take)
    }
}

/// What the value `prev` found by a lost CAS on the key's own slot means.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum AfterLoss {
    /// The key's tombstone: removed meanwhile.
    Removed,
    /// Another live value of the key: follow it.
    Changed,
    /// Not the key's: the slot cannot have changed owner (rule 1), so the
    /// memory is corrupt.
    Foreign,
}

/// Classifies `prev`, the value a CAS on the slot of the key hashed to `kh`
/// found instead of the expected one. A slot belongs to its key forever
/// (rule 1), so it can only hold the key's tombstone or another of its
/// live values.
pub(super) fn after_lost_change(prev: SlotWord, kh: &KeyHash) -> AfterLoss {
    if !prev.matches(kh) {
        AfterLoss::Foreign
    } else if prev.is_tomb() {
        AfterLoss::Removed
    } else if prev.is_live() {
        AfterLoss::Changed
    } else {
        AfterLoss::Foreign
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A view of `kinds` (0 empty, 1 another key's live word, 2 another
    /// key's tombstone), slot `i` in read `i % 2`, owners resolved (no word
    /// matches the key, fingerprint 0, so none needs resolving).
    fn view_of(kinds: &[u8]) -> View {
        let cands = (0..kinds.len()).map(|i| Candidate { offset: 8 * i as u64, read: (i % 2) as u8, at: 0 }).collect();
        let mut words = [SlotWord::EMPTY; CANDIDATES];
        for (i, &k) in kinds.iter().enumerate() {
            if k != 0 {
                words[i] = SlotWord::new(1, 3, 64 * (i as u64 + 1), k == 2).unwrap();
            }
        }
        View::new(cands, words)
    }

    proptest! {
        /// Every inserter of a key takes the first free slot in the key's
        /// fixed order, whatever the buckets' loads: two inserts that both
        /// see that slot free compete for it, so neither can succeed in
        /// another slot (FUSEE's duplicate-insert gap, notes §3, is an
        /// insert choosing its slot by load).
        #[test]
        fn an_insert_takes_the_first_free_slot_in_the_keys_order(
            kinds in proptest::collection::vec(0u8..3, CANDIDATES)
        ) {
            let kh = KeyHash { fp: 0, len: 3, mains: [0, 1] };
            let mut v = view_of(&kinds);
            prop_assert!(v.unresolved(&kh, true).is_empty());
            let first = kinds.iter().position(|&k| k == 0);
            let want = first.map_or(Choice::Full, Choice::Take);
            prop_assert_eq!(v.insert_choice(), want, "not the first free slot in the key's order: {:?}", kinds);
            // A slot taken later (by another key) moves the choice only
            // past it, never to a slot before it.
            if let Some(f) = first {
                v.set(f, SlotWord::new(2, 3, 4096, false).unwrap());
                let next = kinds.iter().skip(f + 1).position(|&k| k == 0).map(|p| p + f + 1);
                prop_assert_eq!(v.insert_choice(), next.map_or(Choice::Full, Choice::Take));
            }
        }
    }
}
