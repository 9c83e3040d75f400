//! What a client of a store that keeps each key's values in objects of its
//! own, found through the index (RAW, pDPM-Direct: the one-copy index on
//! [`INDEX_NODE`]; FUSEE: the replicated [`SnapshotIndex`]), holds beside
//! its protocol: its id (leased from the store's table, or given), the
//! slab allocator it carves its objects from, and the index. The one place
//! for how such a client opens (the index found; the chunks the id's last
//! holder left taken over: a released one's from their bumps, a crashed
//! one's from their marks), records its marks before it publishes what it
//! carved, renews its lease as it works, and gives its id back with its
//! partly used chunks for the next holder.

use core::future::Future;

use super::place::{INDEX_NODE, index_nodes};
use super::{KvError, StoreConfig, Who};
use crate::Memory;
use crate::index::{RaceIndex, SnapshotIndex};
use crate::substrate::clock::Clock;
use crate::substrate::lease::{Held, Resume, Resumed};
use crate::substrate::mutant::mutant;
use crate::substrate::space::slab::{ARENA_CLASS, CLASSES, Carry, HEAD_WORDS, SlabAllocator};

/// The id of client `who` of the store `cfg`, checked: ids run from 1 to
/// the store's writers.
pub fn check_id(who: &Who, cfg: &StoreConfig) -> Result<u8, KvError> {
    match who.id() {
        id @ 1.. if id <= cfg.writers => Ok(id),
        _ => Err(KvError::BadConfig("client id outside 1..=writers")),
    }
}

/// Adds what a client did as master of the store's replicated `index`
/// to its paths `p`.
pub fn index_paths(index: &SnapshotIndex, p: &mut crate::swarm::client::Paths) {
    let m = index.master_paths();
    p.index_views = m.views;
    p.index_rejoins = m.rejoined;
    p.index_superseded = m.superseded;
    p.index_left_unrepaired = m.left_unrepaired;
}

/// Renews `lease`, if the client has one, when half of it has passed.
pub async fn keep_lease<M: Memory>(lease: &mut Option<Held>, mem: &M, now: u64) -> Result<(), KvError> {
    match lease {
        Some(h) => h.keep(mem, now).await.map_err(KvError::Lease),
        None => Ok(()),
    }
}

/// Gives `lease`'s id back, if the client has one, with no chunks for its
/// next holder (a client that carves nothing from its own chunks).
pub async fn give_back<M: Memory>(lease: Option<Held>, mem: &M) -> Result<(), KvError> {
    match lease {
        Some(h) => h.release(mem, &SlabAllocator::new().hand_over([0; HEAD_WORDS], None)).await.map_err(KvError::Lease),
        None => Ok(()),
    }
}

/// The index a [`Seat`] opens: how a client of the store finds it, and the
/// partly used chunk of its own that it hands over with its id (its first
/// replica's is on [`INDEX_NODE`] for both).
pub trait SeatIndex: Sized {
    /// The class its carried chunk is handed over as
    /// ([`SlabAllocator::take_extra_of`]).
    const CARRY_CLASS: u8;
    /// Opens the store's index for client `id`.
    fn open_for<M: Memory>(mem: &M, cfg: &StoreConfig, id: u8) -> impl Future<Output = Result<Self, KvError>>;
    /// The free part of the chunk this client carves the index's blocks
    /// from, for its id's next holder.
    fn carried(&self) -> Option<Carry>;
    /// Goes on carving blocks from `c`, the id's previous holder's.
    fn adopt(&mut self, c: Carry);
    /// Makes room below the mark of the chunk this client carves the
    /// index's blocks from, for one change of a key of `key_len` bytes: the
    /// chunk with its new mark if the mark moved (to be recorded before
    /// the change).
    fn reserve<M: Memory>(&mut self, mem: &M, key_len: usize) -> impl Future<Output = Result<Option<Carry>, KvError>>;
}

impl SeatIndex for RaceIndex {
    const CARRY_CLASS: u8 = CLASSES as u8;

    async fn open_for<M: Memory>(mem: &M, _: &StoreConfig, _: u8) -> Result<Self, KvError> {
        Ok(RaceIndex::open(mem, INDEX_NODE).await?)
    }

    fn carried(&self) -> Option<Carry> {
        RaceIndex::carried(self)
    }

    fn adopt(&mut self, c: Carry) {
        RaceIndex::adopt(self, c)
    }

    async fn reserve<M: Memory>(&mut self, mem: &M, key_len: usize) -> Result<Option<Carry>, KvError> {
        Ok(RaceIndex::reserve(self, mem, key_len).await?.then(|| self.marked()).flatten())
    }
}

/// On [`index_nodes`]; its first replica is node 0.
impl SeatIndex for SnapshotIndex {
    const CARRY_CLASS: u8 = ARENA_CLASS;

    async fn open_for<M: Memory>(mem: &M, cfg: &StoreConfig, id: u8) -> Result<Self, KvError> {
        Ok(SnapshotIndex::open(mem, &index_nodes(cfg, mem.node_count()), id as u32).await?)
    }

    fn carried(&self) -> Option<Carry> {
        SnapshotIndex::carried(self)
    }

    fn adopt(&mut self, c: Carry) {
        SnapshotIndex::adopt(self, c);
    }

    /// Nothing: FUSEE's log recovery finds how far a crashed holder carved
    /// its arena chunk.
    async fn reserve<M: Memory>(&mut self, _: &M, _: usize) -> Result<Option<Carry>, KvError> {
        Ok(None)
    }
}

/// Sets up the one-copy index of such a store on [`INDEX_NODE`] (nothing
/// changes where it exists).
pub async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
    RaceIndex::open_or_create(mem, INDEX_NODE, cfg.index()).await?;
    Ok(())
}

/// A client's id, allocator and index handle.
pub struct Seat<C, I = RaceIndex> {
    /// The client's id, `1..=writers`.
    pub id: u8,
    /// Its lease on the id, renewed as it works (`None`: a given id).
    pub(crate) lease: Option<Held>,
    /// How the id's previous holder left it (`None`: a given id): FUSEE
    /// recovers a crashed holder's log from its last record.
    pub prior: Option<Resume>,
    /// Its clock.
    pub clock: C,
    /// Where it carves its objects from.
    pub slab: SlabAllocator,
    /// The store's index.
    pub index: I,
}

impl<C: Clock, I: SeatIndex> Seat<C, I> {
    /// Opens the index for client `who` of the store `cfg` (nothing is
    /// allocated). If the index cannot be opened, a leased id that its
    /// previous holder gave back (or never had one) is given back at once,
    /// with what that holder handed over, rather than held until its lease
    /// ends. One whose holder crashed is left to lapse instead: its record
    /// still holds the crashed holder's (the claim copied it), so the id's
    /// next holder takes the chunks over from their marks, and FUSEE
    /// recovers the log, as if this client had never claimed it. Given
    /// back, they would be lost, or taken from where carving stood.
    pub async fn open<M: Memory>(mem: &M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let id = check_id(&who, cfg)?;
        let mut index = match I::open_for(mem, cfg, id).await {
            Ok(index) => index,
            Err(e) => {
                if let Who::Lease(h) = who {
                    // (Mutant `crashed-claim-given-back`: given back with
                    // nothing, the crashed holder's chunks are lost.)
                    let payload = match h.resume().state {
                        Resumed::Crashed if !mutant!("crashed-claim-given-back") => None,
                        Resumed::Crashed => Some(SlabAllocator::new().hand_over([0; HEAD_WORDS], None)),
                        _ => Some(h.resume().payload),
                    };
                    if let Some(p) = payload {
                        let _ = h.release(mem, &p).await;
                    }
                }
                return Err(e);
            }
        };
        let mut slab = SlabAllocator::new();
        let prior = match &who {
            Who::Lease(h) => Some(h.resume()),
            Who::Id(_) => None,
        };
        let lease = match who {
            Who::Id(_) => None,
            Who::Lease(h) => {
                slab.resume_from(&h.resume().payload);
                // Go on carving the chunks a released id's last holder left;
                // a crashed one's from their marks (the one-copy index's
                // too; never FUSEE's arena chunk, which its log recovery
                // takes over).
                match h.resume().state {
                    Resumed::Released => slab.take_over(&h.resume().payload),
                    Resumed::Crashed => {
                        slab.take_over_marked(&h.resume().payload);
                    }
                    Resumed::Fresh => {}
                }
                if let Some(c) = slab.take_extra_of(INDEX_NODE, I::CARRY_CLASS) {
                    index.adopt(c);
                }
                Some(h)
            }
        };
        Ok(Seat { id, lease, prior, clock, slab, index })
    }

    /// Renews the lease when half of it has passed (before each change: a
    /// get uses nothing the id names).
    pub async fn keep<M: Memory>(&mut self, mem: &M) -> Result<(), KvError> {
        keep_lease(&mut self.lease, mem, self.clock.now()).await
    }

    /// When the lease needs renewing, in ticks of its clock (none for a
    /// given id): an operation that waits wakes by then to [`Seat::keep`].
    pub fn renewal_due(&self) -> Option<u64> {
        self.lease.as_ref().map(Held::renewal_due)
    }

    /// Records the allocator's marks in the lease's record if one moved
    /// (`crate::substrate::space::slab`): after objects are carved, before
    /// they are published. Nothing for a given id.
    pub async fn record_marks<M: Memory>(&mut self, mem: &M) -> Result<(), KvError> {
        self.slab.record_marks(mem, self.lease.as_mut()).await.map_err(KvError::Lease)
    }

    /// Makes room below its mark for the index's block of one change of a
    /// key of `key_len` bytes, and records the marks if one moved: before
    /// each index change that may carve a block.
    pub async fn reserve_index<M: Memory>(&mut self, mem: &M, key_len: usize) -> Result<(), KvError> {
        if let Some(c) = self.index.reserve(mem, key_len).await? {
            self.slab.set_extra(Some(c));
        }
        self.record_marks(mem).await
    }

    /// Gives the leased id back, with the partly used chunks for its next
    /// holder (nothing for a given id).
    pub async fn close<M: Memory>(&mut self, mem: &M) -> Result<(), KvError> {
        match self.lease.take() {
            Some(h) => {
                let payload = self.slab.hand_over([0; HEAD_WORDS], self.index.carried());
                h.release(mem, &payload).await.map_err(KvError::Lease)
            }
            None => Ok(()),
        }
    }
}
