//! One pDPM-Direct client: gets, the four-roundtrip write under the lock,
//! taking over the lock of a client that died holding it and replaying its
//! redo copy, inserts into fresh entries, and deletes (see the module
//! documentation of [`super`] for the protocol and why).

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::Cell;
use core::future::Future;

use super::entry::{self, NO_REPLICA, PAYLOAD_AT, Payload, Place, Shape};
use super::lock::{self, Seen, Timing};
use crate::index::cache::{LocationCache, key_hash};
use crate::index::{Change, Entry, Expect, Index, Insert};
use crate::kv::place::{RETRIES, addr_of, location_of, node_of};
use crate::kv::seat::Seat;
use crate::kv::torn::TornReads;
use crate::kv::{Got, Handle, KvClient, KvError, KvSystem, Limits, Missing, StoreConfig, Who, Written};
use crate::substrate::clock::Clock;
use crate::substrate::exec::cold;
use crate::substrate::join::join2;
use crate::substrate::memory::{pause, pause_jittered, word_at};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority, to_all};
use crate::substrate::space::{AllocError, RegionError};
use crate::substrate::value::Value;
use crate::swarm::client::Paths;
use crate::{MemError, MemErrorKind, Memory, Op, OpOutput, RemoteAddr};

/// The most times an operation looks at a lock before it gives up
/// ([`KvError::Contended`]): other writers kept the key, or a memory that
/// keeps no time (where waits cannot pause) spun through them.
const MAX_LOOKS: u32 = 4096;
/// The first wait for a held lock, ns (about a roundtrip); each look at
/// the same word waits twice as long, up to when it may be taken over.
const FIRST_WAIT_NS: u64 = 1_000;

/// The longest wait between two tries of an operation on a primary that
/// timed out, ns (each try waits for its own time-out too).
const MAX_RETRY_WAIT_NS: u64 = 100_000;

/// What a client keeps of a key: its index entry and its replicas.
#[derive(Clone, Debug)]
struct Cached {
    entry: Entry,
    place: Place,
}

/// A key this client works on.
#[derive(Clone, Debug)]
struct Key {
    /// The key's hash: seeds its payloads' sums.
    tag: u64,
    entry: Entry,
    place: Place,
}

/// What a write changes a key to.
#[derive(Clone, Copy)]
enum Put<'a> {
    Set(&'a [u8]),
    Delete,
}

/// How a write on an entry ended.
enum Wrote {
    Done,
    /// The entry holds a tombstone: nothing was written.
    WasDeleted,
}

/// What an insert that found its key mapped did.
enum Existing {
    /// Wrote the key's entry.
    Written,
    /// The entry held a tombstone: the key now maps to the fresh objects.
    Swung(Entry),
    /// The mapping changed meanwhile: nothing was done.
    Raced,
}

/// A lock this client holds, and what it read under it.
struct Locked<B> {
    /// Its word on the primary (what a renewal or release expects).
    word: u64,
    expiry: u64,
    /// Both of the primary's spaces, as read right after the lock was won.
    spaces: B,
    /// The payload the committed space holds now (after any replay), and
    /// where it is in `spaces`.
    now: Payload,
    /// The highest version the primary holds.
    top: u64,
}

/// Why a round of writes failed.
enum RoundError {
    /// The primary failed (or its patience ran out): the lock may still be
    /// held, and cannot be released.
    Primary(KvError),
    /// The primary has the payload, too few other replicas answered.
    Quorum,
}

/// How an operation's waits for a lock go: how many looks, since when,
/// and how long the next wait is.
struct Wait {
    looks: u32,
    started: u64,
    word: u64,
    backoff_ns: u64,
}

/// One pDPM-Direct client.
pub struct PdpmClient<M, C> {
    mem: M,
    seat: Seat<C>,
    cache: LocationCache<Cached>,
    shape: Shape,
    replicas: usize,
    nodes: usize,
    limits: Limits,
    timing: Timing,
    paths: Paths,
    /// State of the jitter of waits (xorshift).
    rng: u64,
}

impl<M: Memory, C: Clock> PdpmClient<M, C> {
    /// Connects a client (the index opened; nothing allocated).
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let seat = Seat::open(&mem, cfg, who, clock).await?;
        let cache = LocationCache::new(cfg.cache());
        let nodes = mem.node_count();
        let timing = Timing::of(&seat.clock);
        let rng = 0x9E37_79B9_7F4A_7C15 ^ seat.id as u64;
        Ok(PdpmClient {
            mem,
            seat,
            cache,
            shape: super::PdpmDirect::shape(cfg),
            replicas: cfg.replicas.max(1),
            nodes,
            limits: cfg.limits(),
            timing,
            paths: Paths::default(),
            rng,
        })
    }

    fn now(&self) -> u64 {
        self.seat.clock.now()
    }

    /// The primary's lock word (word 0 of its committed space).
    fn lock_at(&self, k: &Key) -> RemoteAddr {
        let p = k.place.primary();
        RemoteAddr::new(p.node, p.offset + self.shape.committed())
    }

    /// The key from the cache (no roundtrip), or from the index and its
    /// primary's header (three roundtrips; then cached). With `read`, the
    /// header is read with the committed space behind it, and that read is
    /// given back for the caller to use (a get's one READ). Whether the
    /// key came from the cache.
    async fn find(&mut self, key: &[u8], read: bool) -> Result<Option<(Key, bool, Option<M::Buf>)>, KvError> {
        if let Some((_, tag, c)) = self.cache.get_hashed(key) {
            return Ok(Some((Key { tag, entry: c.entry, place: c.place.clone() }, true, None)));
        }
        let Some(entry) = Box::pin(self.seat.index.lookup(&self.mem, key)).await? else {
            return Ok(None);
        };
        let (k, buf) = self.describe(key, entry, read).await?;
        self.cache.insert(key, entry.location, Cached { entry, place: k.place.clone() });
        Ok(Some((k, false, read.then_some(buf))))
    }

    /// Reads the header of the primary `entry` names (and the committed
    /// space after it, with `read`): it must be `key`'s primary's.
    async fn describe(&self, key: &[u8], entry: Entry, read: bool) -> Result<(Key, M::Buf), KvError> {
        let at = addr_of(entry.location, self.nodes).ok_or(KvError::Corrupt)?;
        let len = entry::HEADER + if read { self.shape.space() } else { 0 };
        let buf = self.mem.read(at, len as usize).await?;
        let tag = key_hash(key);
        let place = entry::decode_header(&buf, at, tag, self.shape, self.nodes).ok_or(KvError::Corrupt)?;
        Ok((Key { tag, entry, place }, buf))
    }

    /// Reads the key's committed space on its primary until it finds the
    /// lock free and the payload whole (the buffer and the payload in it);
    /// `first` is a read of it made already (at its offset in the buffer).
    /// Waits while the lock is held; takes it over once its lease is past.
    async fn read(&mut self, k: &Key, mut first: Option<(M::Buf, usize)>) -> Result<(M::Buf, Payload), KvError> {
        let mut wait = Wait::new(self.now());
        let mut torn = TornReads::new(k.tag ^ self.rng);
        loop {
            let (buf, at) = match first.take() {
                Some(read) => read,
                None => (self.mem.read(self.lock_at(k), self.shape.space() as usize).await?, 0),
            };
            let space = buf.get(at..).unwrap_or(&[]);
            let word = word_at(space, 0).ok_or(KvError::Corrupt)?;
            match lock::judge(word, self.now(), &self.timing) {
                Seen::Free => match entry::decode(space, self.shape, k.tag) {
                    Some(p) => return Ok((buf, shifted(p, at))),
                    // Read while a write landed, or garbled.
                    None => torn.again(&self.mem).await?,
                },
                Seen::Held { takeover } => self.wait(&mut wait, word, takeover).await?,
                Seen::Expired => return Box::pin(self.read_taken_over(k, word)).await,
                Seen::Garbled => return Err(KvError::Corrupt),
            }
        }
    }

    /// A get that found the lock of a dead holder: takes it over (replaying
    /// its redo copy if it did not finish), and answers what the committed
    /// space holds then, under the lock.
    async fn read_taken_over(&mut self, k: &Key, word: u64) -> Result<(M::Buf, Payload), KvError> {
        let l = self.acquire(k, word).await?;
        self.release(k, &l).await?;
        Ok((l.spaces, l.now))
    }

    /// Waits before looking at a lock held with `word` again: each look at
    /// the same word twice as long as the last (with jitter), never past
    /// `takeover`, when the lock may be taken over. Gives up
    /// ([`KvError::Contended`]) after [`MAX_LOOKS`] looks, or once the
    /// operation has waited longer than a holder may keep a lock (other
    /// holders kept taking it).
    async fn wait(&mut self, w: &mut Wait, word: u64, takeover: u64) -> Result<(), KvError> {
        let now = self.now();
        let t = &self.timing;
        w.looks += 1;
        if w.looks > MAX_LOOKS || now > w.started + 2 * t.lease + t.grace + t.skew {
            return Err(KvError::Contended);
        }
        if word != w.word {
            (w.word, w.backoff_ns) = (word, FIRST_WAIT_NS);
        }
        // Never past the takeover, nor past the time to renew this client's
        // own lease: a wait for a dead holder's lock (its lease and the
        // grace, seconds) may outlast it, and the id must not be claimed
        // from under the operation.
        let wake = self.seat.renewal_due().map_or(takeover, |due| due.min(takeover));
        let until_ns = wake.saturating_sub(now).saturating_add(1).saturating_mul(t.tick_ns);
        let ns = w.backoff_ns.min(until_ns);
        w.backoff_ns = w.backoff_ns.saturating_mul(2);
        // Waiters of one lock look again at different times.
        pause_jittered(&self.mem, ns, &mut self.rng).await;
        self.seat.keep(&self.mem).await
    }

    /// Runs `op` on the primary again while it times out (a stalled node
    /// answers once it is back, and what a timed-out operation did is
    /// unknown), for at most a round's patience: waits double from a
    /// roundtrip, up to [`MAX_RETRY_WAIT_NS`] (so that a node that comes
    /// back is found soon). `op` must be safe to repeat.
    async fn patient<T, F: Future<Output = Result<T, MemError>>>(
        &self,
        mut op: impl FnMut() -> F,
    ) -> Result<T, MemError> {
        let start = self.now();
        let mut ns = FIRST_WAIT_NS;
        loop {
            match op().await {
                Err(e) if e.kind == MemErrorKind::TimedOut && self.now() < start + self.timing.patience => {
                    pause(&self.mem, ns).await;
                    ns = (2 * ns).min(MAX_RETRY_WAIT_NS);
                }
                r => return r,
            }
        }
    }

    /// A CAS of the key's lock word, and a read of both of the primary's
    /// spaces after it (one ordered pipeline, one roundtrip): the word it
    /// found and the spaces.
    async fn cas_and_read(&self, k: &Key, expected: u64, new: u64) -> Result<(u64, M::Buf), KvError> {
        let at = self.lock_at(k);
        let ops = [
            Op::Cas { offset: at.offset, expected, new },
            Op::Read { offset: at.offset, len: 2 * self.shape.space() as usize },
        ];
        // Repeating it is safe: a CAS that landed before answers `new`. (A
        // try that timed out may still land after a later one won and the
        // lock was released: a lock of this client's, with its expiry, that
        // blocks the key until then and the grace, as a crash would.)
        let mut out = self.patient(|| self.mem.pipeline(at.node, &ops)).await?.into_iter();
        match (out.next(), out.next()) {
            (Some(OpOutput::Cas(prev)), Some(OpOutput::Read(b))) => Ok((prev, b)),
            _ => Err(KvError::Bug("a pipeline answered other operations than it was given")),
        }
    }

    /// [`lock::swing`] of the key's lock word from `from` to `to`, repeated
    /// while the primary times out: whether it is `to` now.
    async fn swing(&self, k: &Key, from: u64, to: u64) -> Result<bool, KvError> {
        let at = self.lock_at(k);
        Ok(self.patient(|| lock::swing(&self.mem, at, from, to)).await?)
    }

    /// Takes the key's lock (round 1): `CAS(expected -> mine)`, where
    /// `expected` is 0 or the word of a holder whose lease is past, waiting
    /// while another client holds it and taking it over once its lease is
    /// past. Under the lock, replays the redo copy of a write that did not
    /// finish (the redo payload whole and newer than the committed one, or
    /// the committed one torn).
    async fn acquire(&mut self, k: &Key, mut expected: u64) -> Result<Locked<M::Buf>, KvError> {
        let mut wait = Wait::new(self.now());
        loop {
            let now = self.now();
            let expiry = now + self.timing.lease;
            let mine = lock::held(self.seat.id, expiry);
            let (prev, spaces) = self.cas_and_read(k, expected, mine).await?;
            if prev == expected || prev == mine {
                if expected != 0 {
                    self.paths.lock_takeovers += 1;
                }
                return Box::pin(self.settle(k, mine, expiry, spaces)).await;
            }
            match lock::judge(prev, now, &self.timing) {
                Seen::Held { takeover } => {
                    self.wait(&mut wait, prev, takeover).await?;
                    expected = 0;
                }
                // Released, or past its lease: try again at once.
                Seen::Free => (expected, wait.looks) = (0, wait.looks + 1),
                Seen::Expired => (expected, wait.looks) = (prev, wait.looks + 1),
                Seen::Garbled => return Err(KvError::Corrupt),
            }
            if wait.looks > MAX_LOOKS {
                return Err(KvError::Contended);
            }
        }
    }

    /// What a new holder finds in the primary's spaces (`spaces`, read
    /// after its CAS won): a redo payload that is newer than the committed
    /// one, or a committed one that is torn, is a write that did not
    /// finish, and is written again (redo, then committed) before the
    /// holder goes on.
    async fn settle(&mut self, k: &Key, word: u64, expiry: u64, spaces: M::Buf) -> Result<Locked<M::Buf>, KvError> {
        let space = self.shape.space() as usize;
        let committed = entry::decode(&spaces, self.shape, k.tag);
        let redo_space = spaces.get(space..).unwrap_or(&[]);
        let redo = entry::decode(redo_space, self.shape, k.tag);
        // What a replay writes: the redo payload's bytes, as they are.
        let replay: Option<Vec<u8>> = redo.as_ref().and_then(|r| entry::payload_bytes(redo_space, r)).map(Vec::from);
        let redo = redo.map(|p| shifted(p, space));
        let unfinished = match (&committed, &redo) {
            (None, Some(_)) => true,
            (Some(c), Some(r)) => r.version > c.version,
            _ => false,
        };
        let top = committed.iter().chain(&redo).map(|p| p.version).max().unwrap_or(0);
        let mut l = Locked { word, expiry, now: Payload { version: 0, deleted: false, value: 0..0 }, top, spaces };
        if unfinished
            && !mutant!("pdpm-no-redo")
            && let (Some(r), Some(bytes)) = (redo, replay)
        {
            self.paths.redo_replays += 1;
            self.write_rounds(k, &mut l, &bytes).await?;
            l.now = r;
            return Ok(l);
        }
        match committed {
            Some(c) => {
                l.now = c;
                Ok(l)
            }
            // Neither space whole: garbage (a write in progress leaves one
            // of them whole), which no holder can repair.
            None => {
                self.release(k, &l).await?;
                Err(KvError::Corrupt)
            }
        }
    }

    /// Rounds 2 and 3 with `payload`: the redo spaces, then the committed
    /// ones. A round that reached the primary but too few other replicas
    /// releases the lock ([`KvError::Unavailable`]: the next holder replays
    /// the redo copy if it is on the primary, so the write may still take
    /// effect); one whose primary failed keeps it (it cannot be released).
    async fn write_rounds(&mut self, k: &Key, l: &mut Locked<M::Buf>, payload: &[u8]) -> Result<(), KvError> {
        for space in [self.shape.redo(), self.shape.committed()] {
            match self.round(k, l, space, payload).await {
                Ok(()) => {}
                Err(RoundError::Primary(e)) => return Err(e),
                Err(RoundError::Quorum) => {
                    self.release(k, l).await?;
                    return Err(KvError::Unavailable);
                }
            }
        }
        Ok(())
    }

    /// Writes `payload` after word 0 of the space at `space` (offset in the
    /// object) of every replica: waits for the primary (patiently) and for
    /// a majority of the replicas in all (the writes to the others are
    /// posted all the same). Renews the lease first if half of it has
    /// passed, so that no write of the round starts after it ends.
    async fn round(&mut self, k: &Key, l: &mut Locked<M::Buf>, space: u64, payload: &[u8]) -> Result<(), RoundError> {
        self.hold(k, l).await.map_err(RoundError::Primary)?;
        let at = |r: &RemoteAddr| RemoteAddr::new(r.node, r.offset + space + PAYLOAD_AT);
        let mem = &self.mem;
        let primary = at(&k.place.primary());
        let backups: heapless::Vec<RemoteAddr, MAX_REPLICAS> =
            k.place.replicas[1..].iter().filter(|r| r.offset != NO_REPLICA).map(at).collect();
        let to_primary = self.patient(|| mem.write(primary, payload));
        let to_backups = to_all(backups.len(), majority(self.replicas) - 1, |i| mem.write(backups[i], payload));
        let (p, (reached, _)) = join2(to_primary, to_backups).await;
        p.map_err(|e| RoundError::Primary(e.into()))?;
        if !reached {
            return Err(RoundError::Quorum);
        }
        Ok(())
    }

    /// Renews the lease on the lock by CAS from this holder's word, if
    /// half of it has passed; [`KvError::Unavailable`] if it was taken over
    /// meanwhile (this holder was too slow; what it wrote may still be
    /// replayed by the new holder).
    async fn hold(&mut self, k: &Key, l: &mut Locked<M::Buf>) -> Result<(), KvError> {
        let now = self.now();
        if now + self.timing.lease / 2 < l.expiry {
            return Ok(());
        }
        let expiry = now + self.timing.lease;
        let word = lock::held(self.seat.id, expiry);
        if !self.swing(k, l.word, word).await? {
            return Err(KvError::Unavailable);
        }
        (l.word, l.expiry) = (word, expiry);
        Ok(())
    }

    /// Releases the lock (round 4) by CAS from this holder's word, never by
    /// a WRITE (see [`super::lock`]). A word other than its own means the
    /// lock was taken over after its lease (or released by an earlier try
    /// of this CAS that timed out): nothing to do.
    async fn release(&self, k: &Key, l: &Locked<M::Buf>) -> Result<(), KvError> {
        self.swing(k, l.word, 0).await.map(drop)
    }

    /// A write of `change` to the key's entry, under its lock: rounds 1 to
    /// 4. An entry that holds a tombstone is left as it is.
    async fn change(&mut self, k: &Key, change: Put<'_>) -> Result<Wrote, KvError> {
        let mut l = self.acquire(k, 0).await?;
        if l.now.deleted {
            self.release(k, &l).await?;
            return Ok(Wrote::WasDeleted);
        }
        let value = match change {
            Put::Set(v) => Some(v),
            Put::Delete => None,
        };
        let payload = entry::encode(l.top + 1, value, k.tag);
        self.write_rounds(k, &mut l, &payload).await?;
        self.release(k, &l).await?;
        Ok(Wrote::Done)
    }

    /// A write of `change` to `key`, found through the cache or the index:
    /// the key as written, or `None` if it is not mapped or its entry
    /// holds a tombstone (unmapped then, in the background, in case its
    /// deleter failed before it could).
    async fn write(&mut self, key: &[u8], change: Put<'_>) -> Result<Option<Key>, KvError> {
        for _ in 0..RETRIES {
            let Some((k, cached, _)) = self.find(key, false).await? else { return Ok(None) };
            match self.change(&k, change).await? {
                Wrote::Done => return Ok(Some(k)),
                Wrote::WasDeleted => {
                    self.cache.remove(key);
                    // A stale cached entry: the key may live elsewhere now.
                    if !cached {
                        self.seat.index.remove_background(&self.mem, key, &k.entry)?;
                        return Ok(None);
                    }
                }
            }
        }
        Err(KvError::Contended)
    }

    /// Inserts `key` in fresh objects on its nodes: written (header and
    /// both spaces, version 1) while the index finds a slot, then
    /// published. A key mapped already is written in place; if its entry
    /// holds a tombstone, the mapping is swung to the fresh objects.
    async fn insert_fresh(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Written>, KvError> {
        let tag = key_hash(key);
        let place = self.new_place(key).await?;
        let payload = entry::encode(1, Some(value), tag);
        let shape = self.shape;
        let objects: heapless::Vec<(RemoteAddr, [u8; entry::HEADER as usize]), MAX_REPLICAS> = place
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.offset != NO_REPLICA)
            .map(|(i, &r)| (r, entry::header(&place, i, tag, shape)))
            .collect();
        let mem = &self.mem;
        let need = majority(self.replicas) - 1;
        let mut failed = None;
        // Which objects may be given back if the insert fails: those never
        // written, and those whose write answered. A write still in flight
        // would land on the next key given the object (the campaigns found
        // one): those objects are left unused, for good.
        let (started, landed) = (Cell::new(false), Cell::new(0u16));
        let ready = async {
            started.set(true);
            let backup = |i: usize| {
                let (r, head) = &objects[1 + i];
                write_object(mem, *r, head, &payload, shape)
            };
            let to_backups = to_all(objects.len() - 1, need, backup);
            let (r, head) = &objects[0];
            let (p, (reached, backups)) = join2(write_object(mem, *r, head, &payload, shape), to_backups).await;
            landed.set(backups << 1 | p.is_ok() as u16);
            match p {
                Ok(()) if reached => true,
                Ok(()) => {
                    failed = Some(KvError::Unavailable);
                    false
                }
                Err(e) => {
                    failed = Some(e.into());
                    false
                }
            }
        };
        let primary = place.primary();
        let inserted = Box::pin(self.seat.index.insert_after(mem, key, location_of(primary), ready)).await;
        let forget = |s: &mut Self| {
            let free = if started.get() { landed.get() } else { u16::MAX };
            for (i, (r, _)) in objects.iter().enumerate() {
                if free & 1 << i != 0 {
                    s.seat.slab.free(*r, shape.object());
                }
            }
        };
        let inserted = match inserted {
            Ok(Some(i)) => i,
            Ok(None) => {
                forget(self);
                return Err(failed.unwrap_or(KvError::Unavailable));
            }
            Err(e) => {
                forget(self);
                return Err(e.into());
            }
        };
        let entry = match inserted {
            Insert::New(entry) => entry,
            // Mapped already (by another client, or before this one's
            // cache knew).
            Insert::Exists(entry) => match Box::pin(self.existing(key, value, entry, location_of(primary))).await {
                Ok(Existing::Swung(now)) => now,
                done => {
                    forget(self);
                    return done.map(|d| matches!(d, Existing::Written).then_some(Written));
                }
            },
        };
        self.cache.insert(key, entry.location, Cached { entry, place });
        Ok(Some(Written))
    }

    /// An insert that found `key` mapped to `entry`: writes that entry, or
    /// if it holds a tombstone, swings the mapping to the insert's fresh
    /// objects at `fresh`.
    async fn existing(&mut self, key: &[u8], value: &[u8], entry: Entry, fresh: u64) -> Result<Existing, KvError> {
        let (k, _) = self.describe(key, entry, false).await?;
        if let Wrote::Done = self.change(&k, Put::Set(value)).await? {
            self.cache.insert(key, entry.location, Cached { entry, place: k.place });
            return Ok(Existing::Written);
        }
        self.seat.reserve_index(&self.mem, key.len()).await?;
        let swung = Box::pin(self.seat.index.update(&self.mem, key, Expect::Entry(entry), fresh)).await?;
        Ok(match swung {
            Change::Done { now: Some(now), .. } => Existing::Swung(now),
            // Another client's insert or delete came first.
            _ => Existing::Raced,
        })
    }

    /// Fresh objects on the key's nodes (`node_of(key, i)`), from this
    /// client's chunks (usually no roundtrip; else one, waiting for every
    /// node: a node that is merely late is not left out). A node whose new
    /// chunk cannot be had for being down is left out ([`NO_REPLICA`]: the
    /// key has one replica less, for good); the primary never is.
    async fn new_place(&mut self, key: &[u8]) -> Result<Place, KvError> {
        let size = self.shape.object();
        let nodes: heapless::Vec<_, MAX_REPLICAS> = (0..self.replicas).map(|i| node_of(key, i, self.nodes)).collect();
        let mut place = Place { replicas: heapless::Vec::new() };
        for &node in &nodes {
            let _ = place
                .replicas
                .push(self.seat.slab.alloc_local(node, size).unwrap_or(RemoteAddr::new(node, NO_REPLICA)));
        }
        // Rarely (a client's first objects, a chunk used up): the others'
        // new chunks, all at once.
        if place.replicas.iter().any(|r| r.offset == NO_REPLICA) {
            let short: heapless::Vec<usize, MAX_REPLICAS> =
                (0..nodes.len()).filter(|&i| place.replicas[i].offset == NO_REPLICA).collect();
            let (short_nodes, sizes): (heapless::Vec<_, MAX_REPLICAS>, heapless::Vec<u64, MAX_REPLICAS>) =
                short.iter().map(|&i| (nodes[i], size)).unzip();
            let (mem, slab) = (&self.mem, &mut self.seat.slab);
            let got = cold(|| slab.alloc_each(mem, &short_nodes, &sizes, usize::MAX)).await;
            let mut error = None;
            for (&i, r) in short.iter().zip(got) {
                match r {
                    Ok(a) => place.replicas[i] = a,
                    Err(AllocError::Region(RegionError::Mem(e))) if !e.is_request_error() && i > 0 => {}
                    Err(e) => error = error.or(Some(KvError::from(e))),
                }
            }
            let real = place.replicas.iter().filter(|r| r.offset != NO_REPLICA).count();
            if error.is_some() || real < majority(self.replicas) {
                for r in place.replicas.iter().filter(|r| r.offset != NO_REPLICA) {
                    self.seat.slab.free(*r, size);
                }
                return Err(error.unwrap_or(KvError::Unavailable));
            }
        }
        // Recorded before the index names them, with room for the
        // index's block (`crate::substrate::space::slab`).
        self.seat.reserve_index(&self.mem, key.len()).await?;
        Ok(place)
    }
}

/// Writes a fresh object at `r`: its header `head`, word 0 of its
/// committed space (the lock, free, on the primary), and `payload` in both
/// spaces (one ordered pipeline). The object is not published yet: no CAS
/// can meet these writes.
async fn write_object<M: Memory>(
    mem: &M,
    r: RemoteAddr,
    head: &[u8],
    payload: &[u8],
    shape: Shape,
) -> Result<(), MemError> {
    let space = |s: u64| r.offset + s + PAYLOAD_AT;
    let ops = [
        Op::Write { offset: r.offset, data: head },
        Op::Write { offset: r.offset + shape.committed(), data: &[0; 8] },
        Op::Write { offset: space(shape.committed()), data: payload },
        Op::Write { offset: space(shape.redo()), data: payload },
    ];
    mem.pipeline(r.node, &ops).await.map(drop)
}

/// `p`, its value range moved by `at` (where its space starts in a buffer).
fn shifted(p: Payload, at: usize) -> Payload {
    Payload { value: p.value.start + at..p.value.end + at, ..p }
}

impl Wait {
    fn new(now: u64) -> Wait {
        Wait { looks: 0, started: now, word: 0, backoff_ns: FIRST_WAIT_NS }
    }
}

impl<M: Memory, C: Clock> KvClient for PdpmClient<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        super::PdpmDirect::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        for _ in 0..RETRIES {
            let Some((k, cached, read)) = self.find(key, true).await? else {
                return Ok(Got::NotFound);
            };
            let first = read.map(|b| (b, entry::HEADER as usize));
            let (buf, p) = self.read(&k, first).await?;
            if !p.deleted {
                return Ok(Got::Found(Value::in_buf(buf, p.value)));
            }
            self.cache.remove(key);
            // A stale cached entry: the key may live elsewhere now.
            if !cached {
                return Ok(Got::Deleted);
            }
        }
        Err(KvError::Contended)
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        Ok(self.write(key, Put::Set(value)).await?.map(|_| Written).ok_or(Missing::NotFound))
    }

    /// The tombstone under the lock (four roundtrips with the key cached),
    /// then the key unmapped in the background.
    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        self.seat.keep(&self.mem).await?;
        let Some(k) = self.write(key, Put::Delete).await? else { return Ok(Err(Missing::NotFound)) };
        self.cache.remove(key);
        self.seat.index.remove_background(&self.mem, key, &k.entry)?;
        Ok(Ok(Written))
    }

    /// A new key in fresh objects (two roundtrips: written while the index
    /// finds a slot, then published); an existing one written in place.
    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        for _ in 0..RETRIES {
            if let Some((_, tag, c)) = self.cache.get_hashed(key) {
                let k = Key { tag, entry: c.entry, place: c.place.clone() };
                match self.change(&k, Put::Set(value)).await? {
                    Wrote::Done => return Ok(Written),
                    Wrote::WasDeleted => {
                        self.cache.remove(key);
                    }
                }
            }
            if let Some(w) = Box::pin(self.insert_fresh(key, value)).await? {
                return Ok(w);
            }
        }
        Err(KvError::Contended)
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.seat.keep(&self.mem).await
    }

    async fn close(&mut self) -> Result<(), KvError> {
        self.seat.close(&self.mem).await
    }

    fn paths(&self) -> Paths {
        self.paths
    }
}

impl<M: Memory, C> Handle for PdpmClient<M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.mem
    }

    fn id(&self) -> u8 {
        self.seat.id
    }
}
