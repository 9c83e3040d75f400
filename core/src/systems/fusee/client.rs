//! One FUSEE client (`papers/fusee.txt` §4.3, §4.6): gets from the cached
//! entry checked against the key's slot in the same roundtrip, updates
//! that write a new object and then change the slot with SNAPSHOT from
//! the cached entry, inserts and deletes, and the adaptive cache's bypass
//! of keys whose entries keep going stale (see [`super`] for the protocol
//! and why it is linearizable, [`super::cache`] for the bypass).

use alloc::boxed::Box;
use core::cell::Cell;

use super::cache::Cached;
use super::log::{self, Recovery};
use super::object::{self, Kind, Log, Op};
use crate::Memory;
use crate::index::cache::LocationCache;
use crate::index::snapshot::records::Records;
use crate::index::{Change, Entry, Expect, Index, Insert, SnapshotIndex};
use crate::kv::place::RETRIES;
use crate::kv::seat::Seat;
use crate::kv::{Got, Handle, KvClient, KvError, KvSystem, Limits, Missing, StoreConfig, Who, Written};
use crate::substrate::clock::Clock;
use crate::substrate::join::join2;
use crate::substrate::memory::pause_jittered;
use crate::substrate::mutant::mutant;
use crate::substrate::value::Value;
use crate::swarm::client::Paths;

/// One FUSEE client.
pub struct FuseeClient<M, C> {
    mem: M,
    /// Its id, lease and the replicated index (whose arena holds the
    /// objects).
    seat: Seat<C, SnapshotIndex>,
    /// Key -> its entry as this client last saw it and how often it was
    /// stale (FUSEE's adaptive index cache, §4.6).
    cache: LocationCache<Cached>,
    /// The percentage of a key's accesses found stale above which the key
    /// bypasses the cache (the store's `bypass` option).
    bypass: u8,
    limits: Limits,
    paths: Paths,
    /// State of the jitter of a losing delete's waits (xorshift).
    rng: u64,
    /// This client's end of its id's embedded log (see [`super`]).
    log: LogState,
    /// What recovering the id's crashed previous holder took, if it did.
    recovery: Option<Recovery>,
}

/// A client's end of its id's embedded operation log.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LogState {
    /// The location of the id's last object (the next one's `prev`), 0 if
    /// none.
    pub last: u64,
    /// The last object, if this client wrote it and its commit is not yet
    /// decided.
    pub current: Option<Current>,
    /// Its commit, decided and not yet written: the arena offset and
    /// bytes, to ride with the next object or delete.
    pub pending: Option<(u64, [u8; 16])>,
    /// The chunk range the lease record names as this id's log anchor
    /// (`start..end`): objects outside it need a new record first.
    pub anchor: Option<(u64, u64)>,
}

/// The last object a client wrote, its outcome undecided.
#[derive(Clone, Copy, Debug)]
pub(super) struct Current {
    /// Its arena offset.
    pub offset: u64,
    /// Its sum (what its commit's check names).
    pub sum: u64,
    /// The slot word its change starts from as its log says (its `base`,
    /// or a provisional commit's), if known.
    pub base: Option<u64>,
}

impl Current {
    /// The provisional commit ([`Kind::Started`]) of this object for a
    /// round from `word`: its arena offset and bytes.
    fn started(&self, word: u64) -> (u64, [u8; 16]) {
        (self.offset + object::COMMIT as u64, object::commit(self.sum, Kind::Started, word))
    }
}

/// The most rounds a delete tries before it gives up
/// ([`KvError::Contended`]): it may not return as a losing update does
/// (see [`super`], "Losers"), so it waits and tries again.
const DELETE_TRIES: u32 = 64;
/// A losing delete's first wait, ns (about a roundtrip); each loss doubles
/// it, up to [`MAX_WAIT_NS`].
const FIRST_WAIT_NS: u64 = 2_000;
const MAX_WAIT_NS: u64 = 100_000;

impl<M: Memory, C: Clock> FuseeClient<M, C> {
    /// Connects a client (the index opened; nothing allocated; see
    /// [`Seat::open`]).
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let seat = Seat::open(&mem, cfg, who, clock).await?;
        let cache = LocationCache::new(cfg.cache());
        let rng = 0x9E37_79B9_7F4A_7C15 ^ seat.id as u64;
        let mut c = FuseeClient {
            mem,
            seat,
            cache,
            bypass: super::bypass(cfg),
            limits: cfg.limits(),
            paths: Paths::default(),
            rng,
            log: LogState::default(),
            recovery: None,
        };
        if let Some(prior) = c.seat.prior {
            let max_chunk = super::Fusee::chunk(cfg);
            let (mem, seat) = (&c.mem, &mut c.seat);
            let (state, recovery) = Box::pin(log::recover(mem, seat, &prior, max_chunk)).await?;
            c.log = state;
            if let Some(r) = recovery {
                c.paths.log_recoveries += 1;
                c.paths.log_redos += (r.outcome == log::Outcome::Redone) as u64;
                c.paths.log_walk_ns += r.walk_ns;
                c.paths.log_redo_ns += r.redo_ns;
            }
            c.recovery = recovery;
        }
        Ok(c)
    }

    /// What recovering the id's crashed previous holder took at open
    /// (`None`: the id was fresh, released, or given).
    pub fn recovery(&self) -> Option<Recovery> {
        self.recovery
    }

    /// Room in the arena for the object of `key` and `value`, its
    /// location, and, for a leased id whose object starts a chunk the log
    /// is not anchored in yet, the lease record that anchors it there (to
    /// be written beside the object: [`put`]). No roundtrip unless this
    /// client's arena chunk is used up.
    async fn alloc(&mut self, key: &[u8], value: &[u8]) -> Result<(u64, u64, Option<Anchor>), KvError> {
        let len = object::alloc_len(key.len(), value.len());
        let offset = Box::pin(self.seat.index.alloc_record(&self.mem, len)).await?;
        let location = object::location(offset, len).ok_or(KvError::Bug("an object's location does not fit"))?;
        let anchored = self.log.anchor.is_some_and(|(a, b)| a <= offset && offset < b);
        let anchor = (!anchored && self.seat.prior.is_some()).then(|| {
            let end = self.seat.index.carried().map_or(offset + len, |c| c.end);
            Anchor {
                range: (offset, end),
                payload: Box::new(log::anchor_payload(&mut self.seat, offset, end, self.log.last)),
            }
        });
        Ok((offset, location, anchor))
    }

    /// The object of `key` and `value` for operation `op` from `base` (the
    /// slot word it starts from, 0 if not known), as the log's next entry.
    fn encode(&self, key: &[u8], value: &[u8], op: Op, base: u64) -> alloc::vec::Vec<u8> {
        object::encode(key, value, Log { op, prev: self.log.last, base })
    }

    /// The object at `offset` (location `w`) was written: it is the log's
    /// last entry, its commit undecided; the previous one's went with it.
    fn wrote(&mut self, offset: u64, w: u64, bytes: &[u8], anchor: Option<Anchor>) {
        if let Some(a) = anchor {
            self.log.anchor = Some(a.range);
        }
        self.log.pending = None;
        self.log.last = w;
        self.log.current = Some(Self::unwritten(offset, bytes));
    }

    /// The object at `offset` of `bytes` as the log's last entry would be,
    /// before it is written ([`Self::wrote`]): for its provisional commits.
    fn unwritten(offset: u64, bytes: &[u8]) -> Current {
        Current { offset, sum: object::sum_in(bytes), base: object::base_in(bytes) }
    }

    /// The last object (`object`), settled unpublished because its key was
    /// found removed, goes on to an insert of the key: its outcome is
    /// undecided again.
    fn reopen(&mut self, object: Current) {
        self.log.pending = None;
        self.log.current = Some(object);
    }

    /// The last object's operation answered: its commit, to be written
    /// with the next object (or delete, or at close).
    fn settle(&mut self, kind: Kind, old: u64) {
        if let Some(c) = self.log.current.take() {
            self.log.pending = Some((c.offset + object::COMMIT as u64, object::commit(c.sum, kind, old)));
        }
    }

    /// Writes a new object of `key` and `value` to every index replica,
    /// until a majority has it, with the previous object's commit in the
    /// same pipelines (one roundtrip): its location.
    async fn write_object(&mut self, key: &[u8], value: &[u8], op: Op, base: u64) -> Result<u64, KvError> {
        let (offset, w, anchor) = self.alloc(key, value).await?;
        let bytes = self.encode(key, value, op, base);
        let before = self.log.pending.as_ref().map(|(o, c)| (*o, &c[..]));
        let records = self.seat.index.records();
        let lease = &mut self.seat.lease;
        Box::pin(put(&records, &self.mem, lease, before, (offset, &bytes), anchor.as_ref())).await?;
        self.wrote(offset, w, &bytes, anchor);
        Ok(w)
    }

    /// Points `key`'s slot at the object at `location` (written already),
    /// starting from `entry`: SNAPSHOT's two phases from the entry's word
    /// (two roundtrips). `seen` says whether this operation saw the slot
    /// hold the entry's word (a lookup or an insert's read of the buckets
    /// during it), rather than taking it from the cache.
    ///
    /// A change that finds another client's change there first: if this
    /// operation saw the slot hold the word it started from, that change
    /// took effect inside this operation's interval, and the update is
    /// done, ordered just before it and overwritten by it (FUSEE's losing
    /// writer, §4.3; see [`super`], "Losers"); otherwise (a stale cached
    /// entry) it starts again from the word the index found, which this
    /// operation now saw. The key's new entry (`None` for a loser), or
    /// [`Missing::NotFound`] if the key is not mapped (deleted).
    ///
    /// A round from another word than the one the object logs as its base
    /// writes that word beside it as the object's provisional commit
    /// ([`Kind::Started`]), so that recovery can redo the change.
    async fn swing(
        &mut self,
        key: &[u8],
        mut entry: Entry,
        location: u64,
        mut seen: bool,
    ) -> Result<Result<Option<Entry>, Missing>, KvError> {
        for _ in 0..RETRIES {
            let side = self.started(entry.word);
            let records = self.seat.index.records();
            let (mem, index) = (&self.mem, &mut self.seat.index);
            let change = Box::pin(index.update(mem, key, Expect::Entry(entry), location));
            let changed = beside(&records, mem, side, change).await?;
            match changed {
                Change::Done { now: Some(now), .. } => {
                    self.remember(key, now, false);
                    self.settle(Kind::Published, entry.word);
                    return Ok(Ok(Some(now)));
                }
                Change::Done { now: None, .. } => return Err(KvError::Bug("an update of the index removed the key")),
                Change::NotFound => {
                    self.cache.remove(key);
                    self.settle(Kind::Unpublished, 0);
                    return Ok(Err(Missing::NotFound));
                }
                Change::Mismatch { current } if seen || mutant!("fusee-cached-loser") => {
                    self.paths.overwritten += 1;
                    self.remember(key, current, false);
                    self.settle(Kind::Unpublished, current.word);
                    return Ok(Ok(None));
                }
                Change::Mismatch { current } => {
                    // The cached entry was stale.
                    self.paths.lost_changes += 1;
                    self.remember(key, current, true);
                    (entry, seen) = (current, true);
                }
            }
        }
        Err(KvError::Contended)
    }

    /// The provisional commit of the last object, to be written beside a
    /// round from `word`, if its log does not say that word yet (the
    /// object's base, or the last such commit).
    fn started(&mut self, word: u64) -> Option<(u64, [u8; 16])> {
        let c = self.log.current.as_mut()?;
        if c.base == Some(word) || mutant!("fusee-no-round-base") {
            return None;
        }
        c.base = Some(word);
        Some(c.started(word))
    }

    /// The key's entry: cached (no roundtrip), or from the index (two
    /// roundtrips). `None` if the key is not mapped.
    async fn find(&mut self, key: &[u8]) -> Result<Option<Entry>, KvError> {
        if let Some((_, c)) = self.cache.get(key) {
            return Ok(Some(c.entry));
        }
        Ok(Box::pin(self.seat.index.lookup(&self.mem, key)).await?)
    }

    /// What the cache knows of `key` for a get, update or insert, which
    /// this counts as an access of it ([`super::cache`]). No roundtrip.
    fn cached(&mut self, key: &[u8]) -> Option<Known> {
        let percent = self.bypass;
        let (_, c) = self.cache.get(key)?;
        let known = Known { entry: c.entry, bypass: c.bypassed(percent) };
        c.access();
        self.paths.cache_bypasses += known.bypass as u64;
        Some(known)
    }

    /// Caches `entry` as the key's, with the counters of the entry cached
    /// before if any; `stale`: this access found that entry's word
    /// replaced by another client's change.
    fn remember(&mut self, key: &[u8], entry: Entry, stale: bool) {
        let c = self.cache.peek(key).map_or(Cached::new(entry), |(_, c)| c.seen(entry, stale));
        self.cache.insert(key, entry.location, c);
    }

    /// Caches `entry`, which the index showed as the key's current one,
    /// in an access that knew `known` from the cache: stale if the cached
    /// word was another (the cache holds the last word this client saw,
    /// its own changes' included, so another word is another client's).
    fn looked_up(&mut self, key: &[u8], entry: Entry, known: Option<Known>) {
        self.remember(key, entry, known.is_some_and(|k| k.entry.word != entry.word));
    }
}

/// What the cache knows of a key, for one get, update or insert.
#[derive(Clone, Copy)]
struct Known {
    /// The key's entry as this client last saw it.
    entry: Entry,
    /// Its entries were found stale too often: the operation goes to the
    /// index as if the key were not cached (and counts what it finds).
    bypass: bool,
}

impl Known {
    /// The cached entry, if the operation takes it.
    fn usable(self) -> Option<Entry> {
        (!self.bypass).then_some(self.entry)
    }
}

/// A lease record that anchors the log in a new chunk (`range`), to be
/// written beside the chunk's first object.
struct Anchor {
    range: (u64, u64),
    payload: Box<crate::substrate::lease::Payload>,
}

/// Writes an object's `bytes` at arena offset `at.0` to every replica until
/// a majority has it, with `before` (the previous object's commit) ahead of
/// it in the same pipelines, and beside them `anchor` to the lease record
/// (one roundtrip for all). The anchor need not land first: a client that
/// crashes with the object written and the anchor not has not started
/// the object's change (it waits for both), so nothing in doubt is lost;
/// the chunk's space is.
async fn put<M: Memory>(
    records: &Records,
    mem: &M,
    lease: &mut Option<crate::substrate::lease::Held>,
    before: Option<(u64, &[u8])>,
    at: (u64, &[u8]),
    anchor: Option<&Anchor>,
) -> Result<(), KvError> {
    let write = Box::pin(records.write_with(mem, before, at.0, at.1));
    match (anchor, lease) {
        (Some(a), Some(h)) => {
            let (wrote, recorded) = join2(write, Box::pin(h.record(mem, &a.payload[..]))).await;
            recorded.map_err(KvError::Lease)?;
            Ok(wrote?)
        }
        _ => Ok(write.await?),
    }
}

/// Runs an index change with `side` (a commit: its arena offset and
/// bytes) written beside it, to every replica at once with its first
/// phase: no roundtrip of its own. Best effort: the change's outcome is
/// what it answers (a commit that misses a majority costs recovery only
/// what it would have known).
async fn beside<M: Memory, T>(
    records: &Records,
    mem: &M,
    side: Option<(u64, [u8; 16])>,
    change: impl core::future::Future<Output = T>,
) -> T {
    match side {
        Some((at, c)) => join2(Box::pin(async move { records.write(mem, at, &c).await }), change).await.1,
        None => change.await,
    }
}

/// Reads the object at `location`, which must be `key`'s and whole: its
/// value, in the buffer read. One roundtrip (more if the first replica
/// read lacks a whole copy: [`Records::read_buf`]).
async fn read_object<M: Memory>(
    records: &Records,
    mem: &M,
    key: &[u8],
    location: u64,
) -> Result<Value<M::Buf>, KvError> {
    let (offset, len) = object::place(location).ok_or(KvError::Corrupt)?;
    let (buf, range) = Box::pin(records.read_buf(mem, offset, len, |b| object::decode(b, key))).await?;
    Ok(Value::in_buf(buf, range))
}

impl<M: Memory, C: Clock> KvClient for FuseeClient<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        super::Fusee::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    /// With the key's entry cached: the object it names and the key's slot
    /// on the index primary, read at once (one roundtrip); the value if the
    /// slot still holds the cached word. Otherwise (stale, bypassed or not
    /// cached): the index, then the object (three roundtrips).
    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        let known = self.cached(key);
        if let Some(e) = known.and_then(Known::usable) {
            let records = self.seat.index.records();
            let (mem, index) = (&self.mem, &mut self.seat.index);
            let (value, still) =
                join2(read_object(&records, mem, key, e.location), Box::pin(index.still(mem, key, &e))).await;
            // The mutant answers the cached object without looking at the
            // slot: stale after another client's update or delete.
            let still = if mutant!("fusee-stale-cache") { Ok(true) } else { still };
            if still? {
                self.paths.cache_hits += 1;
                return value.map(Got::Found);
            }
            self.paths.stale_caches += 1;
        }
        let Some(entry) = Box::pin(self.seat.index.lookup(&self.mem, key)).await? else {
            self.cache.remove(key);
            return Ok(Got::NotFound);
        };
        let value = read_object(&self.seat.index.records(), &self.mem, key, entry.location).await?;
        self.looked_up(key, entry, known);
        Ok(Got::Found(value))
    }

    /// The new object (one roundtrip; in parallel with the index lookup if
    /// the entry is not cached or the key bypassed), then the slot changed
    /// from the entry (SNAPSHOT's two phases).
    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        let known = self.cached(key);
        let (entry, w, seen) = if let Some(e) = known.and_then(Known::usable) {
            (Some(e), self.write_object(key, value, Op::Update, e.word).await?, false)
        } else {
            let (offset, w, anchor) = self.alloc(key, value).await?;
            // A bypassed key's object logs its cached word as its base, as
            // a cached update's object does: recovery redoes it only if
            // the slot still holds that word (see [`super`]).
            let bytes = self.encode(key, value, Op::Update, known.map_or(0, |k| k.entry.word));
            let records = self.seat.index.records();
            let (mem, index, lease) = (&self.mem, &mut self.seat.index, &mut self.seat.lease);
            let before = self.log.pending.as_ref().map(|(o, c)| (*o, &c[..]));
            let (wrote, found) = join2(
                Box::pin(put(&records, mem, lease, before, (offset, &bytes), anchor.as_ref())),
                Box::pin(index.lookup(mem, key)),
            )
            .await;
            let found = found?;
            match found {
                Some(e) => self.looked_up(key, e, known),
                None => {
                    self.cache.remove(key);
                }
            }
            if found.is_some() {
                wrote?;
            }
            if wrote.is_ok() {
                self.wrote(offset, w, &bytes, anchor);
            }
            (found, w, true)
        };
        let Some(entry) = entry else {
            self.settle(Kind::Unpublished, 0);
            return Ok(Err(Missing::NotFound));
        };
        let swung = self.swing(key, entry, w, seen).await;
        if swung.is_err() {
            self.settle(Kind::InDoubt, entry.word);
        }
        Ok(swung?.map(|_| Written))
    }

    /// The slot changed to a tombstone from the entry (two roundtrips with
    /// the entry cached), with the delete's log entry (an object with no
    /// value, the last object's commit ahead of it) written beside the
    /// first round. A delete that finds another client's change there
    /// first may not return (see [`super`], "Losers"): it waits a little
    /// (doubling, jittered, so that it does not lose to the same writers
    /// again and again) and tries again from the word it found.
    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        self.seat.keep(&self.mem).await?;
        let Some(mut entry) = self.find(key).await? else { return Ok(Err(Missing::NotFound)) };
        self.cache.remove(key);
        let (offset, w, mut anchor) = self.alloc(key, b"").await?;
        let bytes = self.encode(key, b"", Op::Delete, entry.word);
        let mut logged = false;
        let mut wait = FIRST_WAIT_NS;
        for tried in 0..DELETE_TRIES {
            let records = self.seat.index.records();
            let removed = if logged {
                let side = self.started(entry.word);
                let (mem, index) = (&self.mem, &mut self.seat.index);
                beside(&records, mem, side, Box::pin(index.remove(mem, key, Expect::Entry(entry)))).await
            } else {
                let (mem, index, lease) = (&self.mem, &mut self.seat.index, &mut self.seat.lease);
                let before = self.log.pending.as_ref().map(|(o, c)| (*o, &c[..]));
                let (wrote, removed) = join2(
                    Box::pin(put(&records, mem, lease, before, (offset, &bytes), anchor.as_ref())),
                    Box::pin(index.remove(mem, key, Expect::Entry(entry))),
                )
                .await;
                if wrote.is_ok() {
                    self.wrote(offset, w, &bytes, anchor.take());
                }
                logged = true;
                removed
            };
            let removed = match removed {
                Ok(r) => r,
                Err(e) => {
                    self.settle(Kind::InDoubt, entry.word);
                    return Err(e.into());
                }
            };
            match removed {
                Change::Done { .. } => {
                    self.settle(Kind::Published, entry.word);
                    return Ok(Ok(Written));
                }
                Change::NotFound => {
                    self.settle(Kind::Unpublished, 0);
                    return Ok(Err(Missing::NotFound));
                }
                Change::Mismatch { current } => {
                    self.paths.lost_changes += 1;
                    entry = current;
                    // (The first loss may be a stale cached entry's.)
                    if tried > 0 {
                        pause_jittered(&self.mem, wait, &mut self.rng).await;
                        wait = (wait * 2).min(MAX_WAIT_NS);
                    }
                }
            }
        }
        self.settle(Kind::InDoubt, entry.word);
        Err(KvError::Contended)
    }

    /// The new object written while the index reads the key's buckets
    /// (one roundtrip), then published in a free slot (two); a key that is
    /// mapped (cached, or found by the index) is updated instead, with the
    /// same object.
    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        self.seat.keep(&self.mem).await?;
        let r = self.insert_object(key, value).await;
        if r.is_err() {
            self.settle(Kind::InDoubt, 0);
        }
        r
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.seat.keep(&self.mem).await
    }

    /// Writes the last object's commit, if decided and not yet written
    /// (best effort: recovery decides an uncommitted last entry from the
    /// index), and gives the id back.
    async fn close(&mut self) -> Result<(), KvError> {
        if let Some((at, c)) = self.log.pending.take() {
            let _ = Box::pin(self.seat.index.records().write(&self.mem, at, &c)).await;
        }
        self.seat.close(&self.mem).await
    }

    fn paths(&self) -> Paths {
        let mut p = self.paths;
        crate::kv::seat::index_paths(&self.seat.index, &mut p);
        p
    }
}

impl<M: Memory, C: Clock> FuseeClient<M, C> {
    /// [`KvClient::insert`]'s work once checked: see there.
    async fn insert_object(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        // A mapped key's insert is an update: a bypassed key's goes as an
        // uncached one does (the buckets' read beside the object's write).
        let known = self.cached(key);
        let cached = known.and_then(Known::usable);
        let (offset, w, mut anchor) = self.alloc(key, value).await?;
        let bytes = self.encode(key, value, Op::Insert, known.map_or(0, |k| k.entry.word));
        let object = Self::unwritten(offset, &bytes);
        let mut written = false;
        if let Some(e) = cached {
            let before = self.log.pending.as_ref().map(|(o, c)| (*o, &c[..]));
            let records = self.seat.index.records();
            let lease = &mut self.seat.lease;
            Box::pin(put(&records, &self.mem, lease, before, (offset, &bytes), anchor.as_ref())).await?;
            self.wrote(offset, w, &bytes, anchor.take());
            written = true;
            if self.swing(key, e, w, false).await?.is_ok() {
                return Ok(Written);
            }
            self.reopen(object);
        }
        for _ in 0..RETRIES {
            let records = self.seat.index.records();
            let (mem, index, lease) = (&self.mem, &mut self.seat.index, &mut self.seat.lease);
            let (mut failed, mut landed) = (None, false);
            // Each round's base, as the object's provisional commit beside
            // its first phase, so that recovery can redo a new key's
            // insert too.
            let noted = Cell::new(None);
            let note = |word| {
                noted.set(Some(word));
                (!mutant!("fusee-no-round-base")).then(|| object.started(word))
            };
            let inserted = if written {
                Box::pin(index.insert_noted(mem, key, w, async { true }, note)).await
            } else {
                let before = self.log.pending.as_ref().map(|(o, c)| (*o, &c[..]));
                let ready = async {
                    let anchor = anchor.as_ref();
                    match Box::pin(put(&records, mem, lease, before, (offset, &bytes), anchor)).await {
                        Ok(()) => {
                            landed = true;
                            true
                        }
                        Err(e) => {
                            failed = Some(e);
                            false
                        }
                    }
                };
                Box::pin(index.insert_noted(mem, key, w, ready, note)).await
            };
            if landed {
                // The object is on a majority: the log's last entry.
                self.wrote(offset, w, &bytes, anchor.take());
            }
            if let (Some(c), Some(word)) = (self.log.current.as_mut(), noted.get()) {
                c.base = Some(word);
            }
            let entry = match inserted? {
                None => return Err(failed.unwrap_or(KvError::Unavailable)),
                Some(Insert::New(e)) => {
                    self.remember(key, e, false);
                    self.settle(Kind::Published, 0);
                    return Ok(Written);
                }
                Some(Insert::Exists(e)) => {
                    self.looked_up(key, e, known);
                    e
                }
            };
            written = true;
            if self.swing(key, entry, w, true).await?.is_ok() {
                return Ok(Written);
            }
            // Deleted meanwhile: insert it again.
            self.reopen(object);
        }
        Err(KvError::Contended)
    }
}

impl<M: Memory, C> Handle for FuseeClient<M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.mem
    }

    fn id(&self) -> u8 {
        self.seat.id
    }
}
