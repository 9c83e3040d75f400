//! FUSEE's embedded operation log and client-crash recovery
//! (`papers/fusee.txt` §4.5, §5.3; see [`super`] for the argument).
//!
//! Every object a client writes is an entry of its id's log
//! ([`super::object`]: op, `prev`, `base`, and a commit written later).
//! The lease record of the id names the log's *anchor*: the arena chunk
//! the id's objects are carved from now, and the entry before it,
//!
//! ```text
//! payload head  LOG_TAG | prev: last entry before the chunk | check
//! carried       the chunk (class ARENA_CLASS): first object .. chunk end
//! ```
//!
//! recorded (one majority write, beside the write of the chunk's first
//! object: no roundtrip of its own) once per chunk (16 KiB or more). A client that opens with an id whose holder crashed
//! ([`Resumed::Crashed`]) reads the anchored chunk from every replica of
//! the view at once (the log walk: one roundtrip), takes each whole object
//! there (in allocation order, so the last one found is the log's last
//! entry) and follows `prev` back from the last, then decides the last
//! entry if it has no commit (the redo), and goes on carving the chunk
//! past the last byte any replica holds.

use alloc::boxed::Box;
use alloc::vec::Vec;

use xxhash_rust::xxh3::xxh3_64;

use super::client::LogState;
use super::object::{self, Kind};
use crate::Memory;
use crate::index::snapshot::arena::{self, ALIGN};
use crate::index::{Change, Expect, Index, Insert, SnapshotIndex};
use crate::kv::KvError;
use crate::kv::seat::Seat;
use crate::substrate::clock::Clock;
use crate::substrate::lease::{Payload, Resume, Resumed};
use crate::substrate::mutant::mutant;
use crate::substrate::space::slab::{ARENA_CLASS, Carry, SlabAllocator};

/// The first head word of a lease payload that names a log anchor
/// ("FUSEELOG").
const LOG_TAG: u64 = u64::from_le_bytes(*b"FUSEELOG");

/// How recovery left the crashed holder's last operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// Nothing was in doubt: no entry in the anchored chunk, or the last
    /// one committed.
    Nothing,
    /// The index already held its object (its change took effect, by its
    /// writer or a helper); for a delete, the key was not mapped.
    Done,
    /// The key still mapped to the word its change started from: recovery
    /// made the change, by its own SNAPSHOT round from that word or by
    /// completing the crashed holder's round its round met (at most once:
    /// see [`super`]).
    Redone,
    /// The key moved on without it (or the word its change started from
    /// was not known): left undone.
    Dropped,
}

/// What recovering a crashed holder's log took (FUSEE §5.3 reports 3.5 ms
/// to walk the log and 3.5 ms to redo, on RDMA).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Recovery {
    /// Whole objects found in the anchored chunk.
    pub found: u32,
    /// Entries walked back from the last one by `prev`, within the chunk.
    pub walked: u32,
    /// Time of the walk (reading and scanning the chunk), ns of the
    /// memory's clock (simulated, or wall time on the mapped backends).
    pub walk_ns: u64,
    /// Time of deciding the last entry (its lookup, the redo, the commit).
    pub redo_ns: u64,
    /// What became of the last entry's operation.
    pub outcome: Outcome,
    /// Bytes of the crashed holder's chunk that this client carves on (the
    /// rest past the last byte written there).
    pub reclaimed: u64,
}

fn anchor_check(prev: u64, start: u64, end: u64) -> u64 {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&LOG_TAG.to_le_bytes());
    b[8..16].copy_from_slice(&prev.to_le_bytes());
    b[16..24].copy_from_slice(&start.to_le_bytes());
    b[24..32].copy_from_slice(&end.to_le_bytes());
    xxh3_64(&b)
}

/// The lease payload that anchors the log at the chunk `start..end`
/// (`start`: its first object), `prev` the last entry before it.
/// Every later record of the client carries it again
/// ([`SlabAllocator::marked`]).
pub(super) fn anchor_payload<C>(seat: &mut Seat<C, SnapshotIndex>, start: u64, end: u64, prev: u64) -> Payload {
    let node = seat.index.header().sites()[0].node;
    let carry = Carry { node, class: ARENA_CLASS, bump: start, end };
    seat.slab.marked([LOG_TAG, prev, anchor_check(prev, start, end)], Some(carry))
}

/// The anchor a lease payload names, checked (it comes from remote
/// memory): the chunk, and the entry before it. `None` if there is none
/// or it cannot be one of this arena's chunks of at most `max_chunk`.
fn anchor_of(seat: &Seat<impl Clock, SnapshotIndex>, payload: &Payload, max_chunk: u64) -> Option<(u64, u64, u64)> {
    if payload[0] != LOG_TAG {
        return None;
    }
    let mut slab = SlabAllocator::new();
    slab.take_over(payload);
    let node = seat.index.header().sites()[0].node;
    let c = slab.take_extra_of(node, ARENA_CLASS)?;
    let size = seat.index.header().arena_size;
    let fits = c.bump >= arena::HEADER
        && c.bump < c.end
        && c.end <= size
        && c.end - c.bump <= max_chunk
        && c.bump.is_multiple_of(ALIGN)
        && c.end.is_multiple_of(ALIGN);
    (fits && payload[2] == anchor_check(payload[1], c.bump, c.end)).then_some((c.bump, c.end, payload[1]))
}

fn now<M: Memory>(mem: &M) -> u64 {
    mem.now_ns().unwrap_or(0)
}

/// One whole object found in the chunk: its offset, its entry, and the
/// copy it was read from.
struct Found {
    offset: u64,
    entry: object::Entry,
    copy: usize,
}

/// Recovers the log of the id's previous holder if it crashed (`prior`):
/// see the module's documentation. This client's log state (its log goes
/// on from the last entry, in the anchored chunk), and what recovery took.
/// Idempotent: a recovery that crashes leaves the lease record as it was
/// (the claim copied it), and the next one decides the same entry again
/// (a redo is guarded by the slot's word, see [`super`]).
pub(super) async fn recover<M: Memory, C: Clock>(
    mem: &M,
    seat: &mut Seat<C, SnapshotIndex>,
    prior: &Resume,
    max_chunk: u64,
) -> Result<(LogState, Option<Recovery>), KvError> {
    let mut state = LogState::default();
    if prior.state != Resumed::Crashed {
        return Ok((state, None));
    }
    let Some((start, end, before)) = anchor_of(seat, &prior.payload, max_chunk) else {
        return Ok((state, None));
    };
    let t0 = now(mem);
    let records = seat.index.records();
    let len = (end - start) as usize;
    let (copies, all) = Box::pin(records.read_each(mem, start, len)).await?;
    let copies: Vec<&[u8]> = copies.iter().flatten().map(|b| &b[..]).filter(|b| b.len() == len).collect();
    if copies.is_empty() {
        return Err(KvError::Unavailable);
    }
    // Whole objects, in allocation order; lines that hold none (key blocks,
    // torn or missing objects) are stepped over.
    let mut found: Vec<Found> = Vec::new();
    let mut at = 0usize;
    while at < len {
        let whole = copies.iter().enumerate().find_map(|(i, b)| object::entry(&b[at..]).map(|e| (i, e)));
        match whole {
            Some((copy, mut entry)) if entry.len as usize <= len - at => {
                // A commit counts from any copy that holds it whole, an
                // outcome before a provisional one (which a late write may
                // have left over it on a replica).
                let commits: Vec<(Kind, u64)> = copies
                    .iter()
                    .filter_map(|b| object::entry(&b[at..]).filter(|x| x.sum == entry.sum))
                    .filter_map(|x| x.commit)
                    .collect();
                entry.commit = commits.iter().find(|(k, _)| *k != Kind::Started).or(commits.first()).copied();
                let step = entry.len as usize;
                found.push(Found { offset: start + at as u64, entry, copy });
                at += step;
            }
            _ => at += ALIGN as usize,
        }
    }
    // The walk back from the last entry by `prev`.
    let location = |f: &Found| object::location(f.offset, f.entry.len).unwrap_or(0);
    let mut walked = 0u32;
    let mut cursor = found.last();
    while let Some(f) = cursor {
        walked += 1;
        cursor = found.iter().find(|g| g.offset < f.offset && location(g) == f.entry.prev);
    }
    // Used: up to the end of the last whole object, or past the last line
    // any replica holds a byte of (a torn object's), whichever is further.
    // (Not the last byte alone: an object whose value ends in zeros ends
    // past it, and carving from there would overwrite the object.)
    let written = copies
        .iter()
        .filter_map(|b| b.iter().rposition(|&x| x != 0))
        .max()
        .map_or(0, |i| (i as u64 / ALIGN + 1) * ALIGN);
    let objects = found.last().map_or(0, |f| f.offset - start + f.entry.len);
    // The mutant carves from the last nonzero line alone.
    let used = if mutant!("fusee-carve-last-byte") { written } else { written.max(objects) };
    let t1 = now(mem);
    let mut reclaimed = 0;
    if all && start + used < end {
        let node = seat.index.header().sites()[0].node;
        if seat.index.adopt(Carry { node, class: ARENA_CLASS, bump: start + used, end }) {
            reclaimed = end - start - used;
        }
    }
    state.anchor = Some((start, end));
    state.last = found.last().map_or(before, location);
    let outcome = match found.last() {
        Some(f) if f.entry.outcome().is_none() => {
            let bytes = &copies[f.copy][(f.offset - start) as usize..][..f.entry.len as usize];
            Box::pin(decide(mem, &mut seat.index, f, bytes)).await?
        }
        _ => Outcome::Nothing,
    };
    let recovery =
        Recovery { found: found.len() as u32, walked, walk_ns: t1 - t0, redo_ns: now(mem) - t1, outcome, reclaimed };
    Ok((state, Some(recovery)))
}

/// Decides the crashed holder's last entry `f` (its object's bytes
/// `bytes`), which has no outcome in its commit, and commits it: done if
/// the key's slot holds its object (a delete: if the key is not mapped);
/// redone if the slot still holds the word its change last started a
/// round from ([`object::Entry::round_base`]; an update's object written
/// to a majority first, then the change from that word: it takes effect
/// at most once); dropped otherwise.
async fn decide<M: Memory>(mem: &M, index: &mut SnapshotIndex, f: &Found, bytes: &[u8]) -> Result<Outcome, KvError> {
    let e = &f.entry;
    let key = &bytes[e.key.clone()];
    let location = object::location(f.offset, e.len).ok_or(KvError::Corrupt)?;
    let base = e.round_base();
    let records = index.records();
    let current = Box::pin(index.lookup(mem, key)).await?;
    // The mutant redoes from whatever the key maps to now: an operation
    // that took effect and was overwritten since takes effect again.
    let redo = |word: u64| base.is_some_and(|b| word == b || mutant!("fusee-redo-moved-on"));
    // On a majority first (it may be whole on fewer), its commit empty: no
    // reader can reach it yet, nor misread it.
    let republish = async || {
        let mut whole = bytes.to_vec();
        whole[object::COMMIT..object::COMMIT + 16].fill(0);
        Box::pin(records.write(mem, f.offset, &whole)).await
    };
    let (outcome, old) = match current {
        // Removed: by this delete, or by another (this one then need not
        // take effect; either way there is nothing to redo).
        None if e.op == object::Op::Delete => (Outcome::Done, base.unwrap_or(0)),
        // A new key's insert (or a removed key's), whose last round
        // started from `b`, the free slot's word: redone by a round from
        // `b` if the slot still holds it (see `SnapshotIndex::insert_from`).
        None if let (object::Op::Insert, Some(b)) = (e.op, base) => {
            republish().await?;
            // The mutant inserts whatever the slot holds now: an insert
            // that took effect and was removed since takes effect again.
            let inserted = if mutant!("fusee-redo-moved-on") {
                Box::pin(index.insert(mem, key, location)).await.map(Some)?
            } else {
                Box::pin(index.insert_from(mem, key, location, b)).await?
            };
            match inserted {
                Some(Insert::New(_)) => (Outcome::Redone, b),
                // The crashed holder's own round, which recovery's completed.
                Some(Insert::Exists(c)) if c.location == location => (Outcome::Redone, b),
                Some(Insert::Exists(c)) => (Outcome::Dropped, c.word),
                None => (Outcome::Dropped, 0),
            }
        }
        Some(c) if e.op != object::Op::Delete && c.location == location => (Outcome::Done, base.unwrap_or(0)),
        Some(c) if redo(c.word) && e.op == object::Op::Delete => {
            match Box::pin(index.remove(mem, key, Expect::Entry(c))).await? {
                Change::Done { .. } => (Outcome::Redone, c.word),
                // The crashed holder's own round, which recovery's completed
                // (or another delete, meanwhile).
                Change::NotFound => (Outcome::Redone, c.word),
                Change::Mismatch { current } => (Outcome::Dropped, current.word),
            }
        }
        Some(c) if redo(c.word) => {
            republish().await?;
            match Box::pin(index.update(mem, key, Expect::Entry(c), location)).await? {
                Change::Done { .. } => (Outcome::Redone, c.word),
                // The crashed holder's own round, which recovery's completed.
                Change::Mismatch { current } if current.location == location => (Outcome::Redone, c.word),
                Change::Mismatch { current } => (Outcome::Dropped, current.word),
                Change::NotFound => (Outcome::Dropped, 0),
            }
        }
        Some(c) => (Outcome::Dropped, c.word),
        None => (Outcome::Dropped, 0),
    };
    let kind = if outcome == Outcome::Dropped { Kind::Dropped } else { Kind::Recovered };
    let commit = object::commit(e.sum, kind, old);
    Box::pin(records.write(mem, f.offset + object::COMMIT as u64, &commit)).await?;
    Ok(outcome)
}
