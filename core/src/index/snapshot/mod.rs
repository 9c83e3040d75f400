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
//! The folder, one concept per module:
//!
//! - `rules`: what a writer decides from what its backup CASes returned,
//!   and which value a helper completes a round with (pure).
//! - [`slot`]: READ and RCAS of one replicated word over [`crate::Memory`],
//!   with helping (no view changes and no master yet).
//! - [`arena`]: the key-block arena, space at the same offset on every
//!   index replica, claimed in chunks by CAS on a majority of them.
//! - `block`: key blocks in the arena and their commit marks, as the
//!   slot protocol carries them.
//! - [`header`]: the index's header, every replica's placement.
//! - [`index`]: [`SnapshotIndex`], the replicated index.
//! - [`view`]: which replicas take part (the view word) and the lease a
//!   client holds on it, the fence of a view change.
//! - [`master`]: the view change a client leads when a replica fails or
//!   comes back: the fence, the repair of every slot (and the catch-up of a
//!   replica brought back), the new view.

pub mod arena;
pub mod block;
pub mod header;
pub mod index;
pub mod master;
pub mod records;
pub(crate) mod rules;
pub mod slot;
#[cfg(all(test, feature = "sim"))]
mod tests;
pub mod view;

pub use index::{SnapshotConfig, SnapshotIndex};
