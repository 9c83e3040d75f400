//! The one registry of root slots: the words of a region header where
//! protocols find their well-known objects (an index, a log directory, a
//! server's rings, a store's configuration record).
//!
//! A root slot is a CAS word that starts at 0 (unset); whoever sets up the
//! object claims the slot with one CAS ([`super::Region::claim_root`]) and
//! everyone else reads it. Every slot a protocol uses is declared here,
//! once, so that two protocols can never pick the same word; the test below
//! checks that no two declarations overlap and that all fit the header.

use super::region::ROOT_SLOTS;

/// A run of consecutive root slots of the region header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root {
    /// Index of the first slot.
    pub slot: u64,
    /// Number of slots (words).
    pub words: u64,
    /// Who uses it, for the registry's report.
    pub owner: &'static str,
}

impl Root {
    const fn one(slot: u64, owner: &'static str) -> Root {
        Root { slot, words: 1, owner }
    }
}

/// The writer logs' directory offset (`swarm::writerlog`).
pub const LOG_DIR: Root = Root::one(1, "swarm::writerlog: log directory");
/// The hash index's header offset (`index`).
pub const INDEX: Root = Root::one(2, "index: RACE index header");
/// The server area of this node: its channels' rings (`substrate::msg`).
pub const SERVER: Root = Root::one(3, "substrate::msg: server area");
/// The table of client-id leases (`substrate::lease`).
pub const LEASES: Root = Root::one(4, "substrate::lease: client-id leases");
/// The store's configuration record, written on every node by
/// `kv::record` (system, shape, options, clock epoch).
pub const STORE_RECORD: Root = Root { slot: ROOT_SLOTS - 16, words: 16, owner: "kv::record: store configuration" };

/// Every root in use.
pub const ALL: [Root; 5] = [LOG_DIR, INDEX, SERVER, LEASES, STORE_RECORD];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_fit_the_header_and_never_overlap() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(a.words > 0 && a.slot + a.words <= ROOT_SLOTS, "{a:?}");
            for b in &ALL[i + 1..] {
                let apart = a.slot + a.words <= b.slot || b.slot + b.words <= a.slot;
                assert!(apart, "{a:?} overlaps {b:?}");
            }
        }
    }
}
