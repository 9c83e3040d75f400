//! The RACE-style index client: insert, lookup, update, remove (see the
//! module documentation of [`crate::index`] for the layout and the rules).

use core::future::Future;

use crate::index::layout::{Block, COMBINED_BYTES, Geometry, KeyHash, MAX_KEY, SlotWord};
use crate::index::probe::{AfterLoss, Choice, View, after_lost_change};
use crate::index::{Change, Entry, Expect, Index, IndexError, Insert};
use crate::substrate::join::join2;
use crate::substrate::mutant::mutant;
use crate::substrate::space::region::Region;
use crate::substrate::space::roots;
use crate::substrate::space::slab::{CLASSES, Carry, mark_past};
use crate::{MAX_PIPELINE, Memory, NodeId, Op, RemoteAddr};

/// How many times in a row an operation may lose a CAS to other clients
/// before it gives up with [`IndexError::Contended`]. Each loss means
/// another client's operation on the same slot succeeded.
pub const MAX_ATTEMPTS: usize = 64;

/// Bytes zeroed per write when creating an index.
const ZERO_STRIDE: usize = 64 << 10;
static ZEROS: [u8; ZERO_STRIDE] = [0; ZERO_STRIDE];

/// Unpublished key blocks a client keeps for reuse.
const SPARES: usize = 4;

/// The shape of a new index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IndexConfig {
    /// Bucket groups; each holds 24 slots (2 main buckets and their shared
    /// overflow bucket).
    pub groups: u64,
    /// Longest key, at most [`MAX_KEY`] (255) bytes.
    pub max_key: usize,
    /// Seed of the key hash.
    pub seed: u64,
}

impl IndexConfig {
    /// Room for about `keys` keys at a load of one half (RACE reaches higher
    /// loads, but a removed key keeps its slot; see the module docs).
    pub fn for_keys(keys: u64, max_key: usize) -> IndexConfig {
        IndexConfig { groups: keys.div_ceil(12).max(1), max_key, seed: 0x5357_4152_4d49_4458 }
    }

    pub(crate) fn check(&self) -> Result<(), IndexError> {
        if self.max_key > MAX_KEY {
            return Err(IndexError::BadConfig("keys may have at most 255 bytes"));
        }
        if self.groups == 0 || Geometry::bytes(self.groups).is_none() {
            return Err(IndexError::BadConfig("the index needs between 1 and 2^58 bucket groups"));
        }
        Ok(())
    }
}

/// A key block this client allocated, and what became of it.
#[derive(Clone, Copy)]
struct Fresh {
    offset: u64,
    size: u64,
    word: SlotWord,
    /// Its bytes were written (by a pipeline that also CASed).
    written: bool,
    /// A CAS publishing it may have been applied (it succeeded, or its
    /// pipeline failed): never reuse it.
    published: bool,
}

/// One client's handle on the index of one node.
pub struct RaceIndex {
    geo: Geometry,
    /// The node's region, for key-block chunks.
    region: Region,
    /// Free part of the current chunk for key blocks.
    bump: u64,
    end: u64,
    /// The chunk's mark, at or above `bump` once [`RaceIndex::reserve`]
    /// made room (`crate::substrate::space::slab`'s marks: what the
    /// lease record of a leased client says of the chunk).
    mark: u64,
    /// Unpublished blocks for reuse: (offset, size).
    spare: heapless::Vec<(u64, u64), SPARES>,
}

impl RaceIndex {
    /// Opens the index of `node` (two roundtrips).
    pub async fn open<M: Memory>(mem: &M, node: NodeId) -> Result<RaceIndex, IndexError> {
        let (region, root) = join2(Region::open(mem, node), Region::read_root(mem, node, roots::INDEX)).await;
        let (region, root) = (region?, root?);
        if root == 0 {
            return Err(IndexError::NoIndex { node });
        }
        Self::open_at(mem, region, root).await
    }

    async fn open_at<M: Memory>(mem: &M, region: Region, header: u64) -> Result<RaceIndex, IndexError> {
        let node = region.node;
        let end = header.checked_add(crate::index::HEADER_BYTES);
        if !header.is_multiple_of(8) || end.is_none_or(|e| e > region.size) {
            return Err(IndexError::Corrupt { node, what: "root slot points outside the region" });
        }
        let buf = mem.read(RemoteAddr::new(node, header), crate::index::HEADER_BYTES as usize).await?;
        let geo = Geometry::decode(node, header, &buf, region.size)?;
        Ok(RaceIndex { geo, region, bump: 0, end: 0, mark: 0, spare: heapless::Vec::new() })
    }

    /// Opens the index of `node`, creating it with `cfg` if there is none.
    /// Clients may race to create it: one wins the root slot's CAS, the
    /// others open its index (their allocation is lost, as memory is never
    /// recycled). Creating zeroes the bucket array (a few roundtrips per MiB).
    pub async fn open_or_create<M: Memory>(mem: &M, node: NodeId, cfg: IndexConfig) -> Result<RaceIndex, IndexError> {
        cfg.check()?;
        let (region, root) = join2(Region::open(mem, node), Region::read_root(mem, node, roots::INDEX)).await;
        let (mut region, root) = (region?, root?);
        if root != 0 {
            return Self::open_at(mem, region, root).await;
        }
        let bytes = Geometry::bytes(cfg.groups).ok_or(IndexError::BadConfig("too many groups"))?;
        let base = region.alloc_chunks(mem, bytes.div_ceil(region.chunk)).await?.offset;
        let geo = Geometry {
            node,
            header: base,
            groups: cfg.groups,
            max_key: cfg.max_key,
            seed: cfg.seed,
            region_size: region.size,
        };
        zero(mem, node, geo.buckets(), bytes - crate::index::HEADER_BYTES).await?;
        mem.write(RemoteAddr::new(node, base), &geo.encode()).await?;
        let root = Region::claim_root(mem, node, roots::INDEX, base).await?;
        Self::open_at(mem, region, root).await
    }

    /// The index's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The node that holds the index.
    pub fn node(&self) -> NodeId {
        self.geo.node
    }

    fn check_key(&self, key: &[u8]) -> Result<KeyHash, IndexError> {
        if key.len() > self.geo.max_key {
            return Err(IndexError::KeyTooLong { len: key.len(), max: self.geo.max_key });
        }
        Ok(self.geo.hash(key))
    }

    fn corrupt(&self, what: &'static str) -> IndexError {
        IndexError::Corrupt { node: self.geo.node, what }
    }

    /// Reads the key's two combined buckets, posted together (one roundtrip).
    async fn read_view<M: Memory>(&self, mem: &M, kh: &KeyHash) -> Result<View, IndexError> {
        let node = self.geo.node;
        let at = |m: u64| RemoteAddr::new(node, self.geo.combined(m));
        let (a, b) = join2(mem.read(at(kh.mains[0]), COMBINED_BYTES), mem.read(at(kh.mains[1]), COMBINED_BYTES)).await;
        let (a, b) = (a?, b?);
        View::from_combined(self.geo.candidates(kh), [&a, &b]).ok_or(self.corrupt("short read of a bucket"))
    }

    /// Resolves the owners of the view's slots that matter (see
    /// [`View::resolve`]) from their blocks on the node.
    async fn resolve<M: Memory>(
        &self,
        mem: &M,
        key: &[u8],
        kh: &KeyHash,
        view: &mut View,
        tombs: bool,
    ) -> Result<(), IndexError> {
        view.resolve(kh, tombs, |_, w| async move {
            let addr = self.geo.block_addr(w, key.len()).ok_or(self.corrupt("slot points outside the region"))?;
            let buf = mem.read(addr, crate::index::block_len(key.len())).await?;
            let (location, k) = Block::decode(&buf, key.len()).map_err(|what| self.corrupt(what))?;
            Ok((location, k == key))
        })
        .await
    }

    /// The free part of the chunk key blocks are carved from, for the next
    /// holder of this client's id ([`crate::substrate::space::slab`]).
    pub fn carried(&self) -> Option<Carry> {
        (self.bump < self.end).then_some(Carry {
            node: self.geo.node,
            class: CLASSES as u8,
            bump: self.bump,
            end: self.end,
        })
    }

    /// The same from its mark, for a record taken while this client works
    /// (see [`RaceIndex::reserve`]).
    pub fn marked(&self) -> Option<Carry> {
        // (Mutant `index-marks-are-bumps`: the record names the chunk from
        // where carving stood, below the block the change publishes.)
        let from = if mutant!("index-marks-are-bumps") { self.bump } else { self.mark.max(self.bump) };
        self.carried().map(|c| Carry { bump: from, ..c })
    }

    /// Goes on carving key blocks from `c`, a chunk this client's id's
    /// previous holder carried (from its bump if released, from its mark
    /// if crashed), if it fits the region.
    pub fn adopt(&mut self, c: Carry) {
        if c.class as usize == CLASSES && c.fits(&self.region) {
            (self.bump, self.end, self.mark) = (c.bump, c.end, c.bump);
        }
    }

    /// Makes sure that the next insert or update of a key of `key_len`
    /// bytes carves its block below the chunk's mark (an insert or update
    /// takes one block at most): takes a new chunk if the current one has
    /// no room, and moves the mark a quarter chunk ahead if the block would
    /// pass it. Whether the mark moved: a leased client then records it
    /// (`crate::kv::seat`) before the operation publishes the block. (Key
    /// blocks published above a mark the record does not hold would be
    /// carved again by the id's next holder after a crash.)
    pub async fn reserve<M: Memory>(&mut self, mem: &M, key_len: usize) -> Result<bool, IndexError> {
        let size = crate::index::block_alloc(key_len);
        if self.spare.iter().any(|&(_, s)| s == size) {
            return Ok(false);
        }
        self.room_for(mem, size).await?;
        if self.bump + size <= self.mark {
            return Ok(false);
        }
        self.mark = mark_past(self.mark, self.bump + size, self.end, self.region.chunk);
        Ok(true)
    }

    /// Takes a new chunk for key blocks if the current one has no room for
    /// `size` bytes (its mark at its start: nothing recorded of it yet).
    async fn room_for<M: Memory>(&mut self, mem: &M, size: u64) -> Result<(), IndexError> {
        if self.end.saturating_sub(self.bump) < size {
            let chunk = self.region.alloc_chunk(mem).await?;
            (self.bump, self.end, self.mark) = (chunk.offset, chunk.offset + self.region.chunk, chunk.offset);
        }
        Ok(())
    }

    /// A block for `key` -> `location`, from the spares or the current chunk.
    async fn alloc_block<M: Memory>(&mut self, mem: &M, kh: &KeyHash, key_len: usize) -> Result<Fresh, IndexError> {
        let size = crate::index::block_alloc(key_len);
        let offset = match self.spare.iter().position(|&(_, s)| s == size) {
            Some(i) => self.spare.swap_remove(i).0,
            None => {
                self.room_for(mem, size).await?;
                self.bump += size;
                self.bump - size
            }
        };
        let word =
            SlotWord::new(kh.fp, kh.len, offset, false).ok_or(self.corrupt("region too large for slot pointers"))?;
        Ok(Fresh { offset, size, word, written: false, published: false })
    }

    /// Keeps a block that no slot can point to for the next operation.
    fn release(&mut self, fresh: Option<Fresh>) {
        if let Some(f) = fresh
            && !f.published
        {
            let _ = self.spare.push((f.offset, f.size));
        }
    }

    /// CASes slot `slot` from `expected` to `fresh.word`, writing the block
    /// first in the same ordered pipeline if not yet written. Returns the
    /// slot's previous value.
    async fn publish<M: Memory>(
        &self,
        mem: &M,
        slot: u64,
        expected: SlotWord,
        new: SlotWord,
        block: Option<(&mut Fresh, &[u8])>,
    ) -> Result<SlotWord, IndexError> {
        let node = self.geo.node;
        let cas = Op::Cas { offset: slot, expected: expected.0, new: new.0 };
        let mut ops: heapless::Vec<Op<'_>, MAX_PIPELINE> = heapless::Vec::new();
        let mut fresh = None;
        if let Some((f, bytes)) = block {
            if !f.written {
                let _ = ops.push(Op::Write { offset: f.offset, data: bytes });
            }
            fresh = Some(f);
        }
        let _ = ops.push(cas);
        let out = mem.pipeline(node, &ops).await;
        if let Some(f) = fresh {
            f.written = true;
            // After an error, any prefix of the pipeline may have been
            // applied, the CAS included: never reuse the block.
            f.published |= out.is_err();
        }
        let prev = out?.last().and_then(|o| o.cas()).ok_or(self.corrupt("pipeline answered no CAS result"))?;
        Ok(SlotWord(prev))
    }

    async fn do_insert<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        fresh: &mut Option<Fresh>,
        ready: impl Future<Output = bool>,
    ) -> Result<Option<Insert>, IndexError> {
        let kh = self.check_key(key)?;
        if location == 0 {
            return Err(IndexError::ZeroLocation);
        }
        let block = Block::encode(key, location);
        let (view, ready) = crate::substrate::join::join2(self.read_view(mem, &kh), ready).await;
        if !ready {
            return Ok(None);
        }
        let mut view = view?;
        for _ in 0..MAX_ATTEMPTS {
            self.resolve(mem, key, &kh, &mut view, true).await?;
            let node = self.geo.node;
            let i = match view.insert_choice() {
                Choice::Exists(i, loc) => {
                    let slot = RemoteAddr::new(node, view.cands[i].offset);
                    return Ok(Some(Insert::Exists(Entry { location: loc, slot, word: view.words[i].0 })));
                }
                Choice::Take(i) => i,
                Choice::Full => return Err(IndexError::Full { node }),
            };
            if fresh.is_none() {
                *fresh = Some(self.alloc_block(mem, &kh, key.len()).await?);
            }
            let Some(f) = fresh.as_mut() else { return Err(IndexError::Contended) };
            let (slot, expected, new) = (view.cands[i].offset, view.words[i], f.word);
            let prev = self.publish(mem, slot, expected, new, Some((f, &block))).await?;
            if prev == expected {
                f.published = true;
                return Ok(Some(Insert::New(Entry { location, slot: RemoteAddr::new(node, slot), word: new.0 })));
            }
            view.set(i, prev);
        }
        Err(IndexError::Contended)
    }

    async fn do_lookup<M: Memory>(&self, mem: &M, key: &[u8], kh: &KeyHash) -> Result<Option<Entry>, IndexError> {
        let mut view = self.read_view(mem, kh).await?;
        self.resolve(mem, key, kh, &mut view, false).await?;
        let found = view.live().map(|(i, location)| Entry {
            location,
            slot: RemoteAddr::new(self.geo.node, view.cands[i].offset),
            word: view.words[i].0,
        });
        if found.is_none() && view.words[..view.len()].iter().any(|w| !w.is_sound()) {
            return Err(self.corrupt("a garbled slot word may hide the key"));
        }
        Ok(found)
    }

    /// Checks that `e` can be a live mapping of the key with hash `kh`.
    fn check_entry(&self, kh: &KeyHash, e: &Entry) -> Result<(), IndexError> {
        let w = SlotWord(e.word);
        let ok = e.slot.node == self.geo.node
            && w.is_live()
            && w.matches(kh)
            && e.location != 0
            && self.geo.candidates(kh).iter().any(|c| c.offset == e.slot.offset);
        if ok { Ok(()) } else { Err(IndexError::BadEntry) }
    }

    /// The location of the key's block that live word `w` points to.
    async fn location_of<M: Memory>(&self, mem: &M, key: &[u8], w: SlotWord) -> Result<u64, IndexError> {
        let addr = self.geo.block_addr(w, key.len()).ok_or(self.corrupt("slot points outside the region"))?;
        let buf = mem.read(addr, crate::index::block_len(key.len())).await?;
        let (location, k) = Block::decode(&buf, key.len()).map_err(|what| self.corrupt(what))?;
        if k != key {
            return Err(self.corrupt("a key's slot holds another key"));
        }
        Ok(location)
    }

    /// Update (`location: Some`) or removal (`None`).
    async fn do_change<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
        location: Option<u64>,
        fresh: &mut Option<Fresh>,
    ) -> Result<Change, IndexError> {
        let kh = self.check_key(key)?;
        if location == Some(0) {
            return Err(IndexError::ZeroLocation);
        }
        let mut cur = match expect {
            Expect::Entry(e) => {
                self.check_entry(&kh, &e)?;
                e
            }
            _ => match self.do_lookup(mem, key, &kh).await? {
                Some(e) => e,
                None => return Ok(Change::NotFound),
            },
        };
        let block = location.map(|l| Block::encode(key, l));
        for _ in 0..MAX_ATTEMPTS {
            if let Expect::Location(l) = expect
                && cur.location != l
            {
                return Ok(Change::Mismatch { current: cur });
            }
            let expected = SlotWord(cur.word);
            let prev = match (location, &block) {
                (Some(l), Some(b)) => {
                    if fresh.is_none() {
                        *fresh = Some(self.alloc_block(mem, &kh, key.len()).await?);
                    }
                    let Some(f) = fresh.as_mut() else { return Err(IndexError::Contended) };
                    let new = f.word;
                    let prev = self.publish(mem, cur.slot.offset, expected, new, Some((f, b))).await?;
                    if prev == expected {
                        f.published = true;
                        let now = Entry { location: l, slot: cur.slot, word: new.0 };
                        return Ok(Change::Done { previous: cur.location, now: Some(now) });
                    }
                    prev
                }
                _ => {
                    let prev = self.publish(mem, cur.slot.offset, expected, expected.tombstone(), None).await?;
                    if prev == expected {
                        return Ok(Change::Done { previous: cur.location, now: None });
                    }
                    prev
                }
            };
            match after_lost_change(prev, &kh) {
                AfterLoss::Removed => return Ok(Change::NotFound),
                AfterLoss::Changed => {}
                AfterLoss::Foreign => return Err(self.corrupt("a key's slot changed to another key's")),
            }
            cur = Entry { location: self.location_of(mem, key, prev).await?, slot: cur.slot, word: prev.0 };
            if matches!(expect, Expect::Entry(_)) {
                return Ok(Change::Mismatch { current: cur });
            }
        }
        Err(IndexError::Contended)
    }
}

/// Zeroes `len` bytes at `offset`, up to [`MAX_PIPELINE`] writes per roundtrip.
pub(super) async fn zero<M: Memory>(mem: &M, node: NodeId, offset: u64, len: u64) -> Result<(), IndexError> {
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let mut ops: heapless::Vec<Op<'_>, MAX_PIPELINE> = heapless::Vec::new();
        while at < end && !ops.is_full() {
            let n = (end - at).min(ZERO_STRIDE as u64);
            let _ = ops.push(Op::Write { offset: at, data: &ZEROS[..n as usize] });
            at += n;
        }
        mem.pipeline(node, &ops).await?;
    }
    Ok(())
}

impl Index for RaceIndex {
    fn max_key(&self) -> usize {
        self.geo.max_key
    }

    async fn insert<M: Memory>(&mut self, mem: &M, key: &[u8], location: u64) -> Result<Insert, IndexError> {
        let r = self.insert_after(mem, key, location, async { true }).await;
        r.map(|done| done.expect("ready is true"))
    }

    /// Reads the key's buckets while `ready` runs: one roundtrip for both.
    async fn insert_after<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        location: u64,
        ready: impl Future<Output = bool>,
    ) -> Result<Option<Insert>, IndexError> {
        let mut fresh = None;
        let r = self.do_insert(mem, key, location, &mut fresh, ready).await;
        self.release(fresh);
        r
    }

    async fn lookup<M: Memory>(&mut self, mem: &M, key: &[u8]) -> Result<Option<Entry>, IndexError> {
        let kh = self.check_key(key)?;
        self.do_lookup(mem, key, &kh).await
    }

    async fn update<M: Memory>(
        &mut self,
        mem: &M,
        key: &[u8],
        expect: Expect,
        location: u64,
    ) -> Result<Change, IndexError> {
        let mut fresh = None;
        let r = self.do_change(mem, key, expect, Some(location), &mut fresh).await;
        self.release(fresh);
        r
    }

    async fn remove<M: Memory>(&mut self, mem: &M, key: &[u8], expect: Expect) -> Result<Change, IndexError> {
        self.do_change(mem, key, expect, None, &mut None).await
    }

    async fn still<M: Memory>(&mut self, mem: &M, key: &[u8], entry: &Entry) -> Result<bool, IndexError> {
        let kh = self.check_key(key)?;
        self.check_entry(&kh, entry)?;
        Ok(crate::substrate::memory::read_word(mem, entry.slot).await? == entry.word)
    }

    fn remove_background<M: Memory>(&mut self, mem: &M, key: &[u8], entry: &Entry) -> Result<(), IndexError> {
        let kh = self.check_key(key)?;
        self.check_entry(&kh, entry)?;
        let cas = Op::Cas { offset: entry.slot.offset, expected: entry.word, new: SlotWord(entry.word).tombstone().0 };
        mem.post_background(self.geo.node, &[cas]);
        Ok(())
    }
}
