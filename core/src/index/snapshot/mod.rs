//! SNAPSHOT: FUSEE's replicated slot word (`papers/fusee.txt` §4.2-4.3,
//! Algorithms 1-2), the basis of the replicated index (issue #21).
//!
//! One logical slot is the same 64-bit word on r memory nodes: a *primary*,
//! which readers read and which holds the committed value, and r - 1
//! *backups*, on which concurrent writers settle who wins. A write is a
//! replicated compare-and-set: every writer of a round reads `vold` from the
//! primary, CASes every backup from `vold` to its own unique `vnew`, decides
//! from the CAS replies alone which writer of the round is the last one
//! (FUSEE's three rules), and only that writer catches the backups up and
//! CASes the primary; the others wait for the primary to change.
//!
//! This folder will hold the replicated index (the slot protocol with the
//! fixes of `notes/fusee-design.md` §1, helping, the view and the in-band
//! master, and `SnapshotIndex`). For now it holds the pure rules
//! ([`rules`]): what a writer decides from what its backup CASes returned,
//! and which value a helper completes a round with; the slot protocol
//! over memory ([`slot`]: READ and RCAS of one replicated word, with
//! minimal helping, no view changes and no master yet); and the key-block
//! arena ([`arena`]): space at the same offset on every index replica,
//! claimed in chunks by CAS on a majority of the replicas.

pub(crate) mod arena;
pub(crate) mod rules;
pub(crate) mod slot;
