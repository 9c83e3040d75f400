//! In-n-Out (SWARM §4): a max register of large values on one memory node,
//! one roundtrip per read and per write in the common case.
//!
//! Layout of one object on its node (64-byte aligned):
//!
//! ```text
//! meta words   K × 8 B   the register's value is the largest word (§4.4)
//! in-place     hash (8) | length (8) | value bytes (up to max_value)
//! ```
//!
//! The in-place area is also the value's *home*: once a write is no longer
//! going to be superseded soon, its writer moves the value there and marks
//! the word ([`Meta::home`]), so that its log entry can be recycled
//! ([`crate::swarm::recycle`]). Every object has the area; a replica
//! without in-place copy ([`Layout::in_place`] false) only reads it for a
//! word so marked, in a second roundtrip, as it would read the entry.
//!
//! A write puts its value out of place, in the writer's log entry
//! ([`crate::swarm::writerlog`]), and MAXes its metadata word in, as one ordered
//! pipeline (one roundtrip): whoever sees the word can find the value. The
//! in-place copy is then written in the background, with an xxHash3 hash
//! seeded by the metadata, so that a read of `meta + in-place` (one READ)
//! can tell whether the in-place copy belongs to the metadata it read, and
//! otherwise follows the metadata to the out-of-place copy (a second READ),
//! whose entry header names the write it holds and checksums its value
//! ([`EntryHeader`]): a copy that is not the metadata's, or not whole, is
//! never returned.
//!
//! With K metadata words, writer `c` MAXes word `c mod K` (one word per
//! writer makes every MAX succeed at its first CAS, §4.4 and §7.9); readers
//! take the largest word. Everything read is untrusted: lengths are checked
//! against `max_value`, and an entry that does not exist is an error, never
//! an out-of-bounds access.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::objects::max::{MaxOutcome, cas_max};
use crate::substrate::exec::cold;
use crate::substrate::memory::word_at;
use crate::substrate::value::Value;
use crate::swarm::meta::Meta;
use crate::swarm::writerlog::{ENTRY_HEADER, ENTRY_ID_BYTES, EntryHeader, LogError};
use crate::{MemError, Memory, NodeId, Op, OpOutput, RemoteAddr};

/// Largest value the protocols accept (the issue's requirement is 8 KiB).
pub const MAX_VALUE: u64 = 64 * 1024;
/// Most metadata words per object.
pub const MAX_META_WORDS: u32 = 128;
const INPLACE_HEADER: u64 = 16;

/// Shape of an In-n-Out object.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Layout {
    /// Metadata words (1 = one per object, up to one per writer).
    pub meta_words: u32,
    /// Largest value, in bytes.
    pub max_value: u64,
    /// Whether the object keeps an in-place copy: READ reads it with the
    /// metadata, and writes post it. Without one, every value is read out
    /// of place (two roundtrips): the classic out-of-place update with a
    /// pointer swing, as DM-ABD uses (SWARM §4.1, §7). The area is there
    /// either way, as the value's home.
    pub in_place: bool,
    /// Only a register's first replica keeps the in-place copy; the others
    /// hold the metadata alone (SWARM §6: less memory and bandwidth, and a
    /// majority that starts with the first replica still reads in one
    /// roundtrip). See [`Layout::of_replica`].
    pub first_only: bool,
    /// What the object holds values of (a key-value store's key hash, 0
    /// for a bare register): mixed into every checksum of its copies, in
    /// place and out of place, so that a copy of another object (a
    /// corrupted pointer, a reused buffer) never passes for one of this.
    pub tag: u64,
}

impl Layout {
    /// A layout, checked.
    pub fn new(meta_words: u32, max_value: u64) -> Result<Layout, InOutError> {
        if meta_words == 0 || meta_words > MAX_META_WORDS || max_value > MAX_VALUE {
            return Err(InOutError::BadLayout);
        }
        Ok(Layout { meta_words, max_value, in_place: true, first_only: false, tag: 0 })
    }

    /// The same, for the values of `tag` (see [`Layout::tag`]).
    pub fn tagged(self, tag: u64) -> Layout {
        Layout { tag, ..self }
    }

    /// A layout without in-place copy (values only out of place).
    pub fn out_of_place(meta_words: u32, max_value: u64) -> Result<Layout, InOutError> {
        Ok(Layout { in_place: false, ..Self::new(meta_words, max_value)? })
    }

    /// The same, with the in-place copy on the first replica only.
    pub fn in_place_on_first(self) -> Layout {
        Layout { first_only: true, ..self }
    }

    /// The shape of replica `r`'s object.
    pub fn of_replica(&self, r: usize) -> Layout {
        Layout { in_place: self.in_place && (!self.first_only || r == 0), first_only: false, ..*self }
    }

    /// Bytes of one object (64-byte aligned): the metadata and the home.
    pub fn size(&self) -> u64 {
        (8 * self.meta_words as u64 + INPLACE_HEADER + self.max_value).next_multiple_of(64)
    }

    /// Bytes a READ of the object takes: the metadata, and the in-place
    /// copy if there is one.
    fn read_len(&self) -> u64 {
        let copy = if self.in_place { INPLACE_HEADER + self.max_value } else { 0 };
        8 * self.meta_words as u64 + copy
    }

    fn inplace(&self) -> u64 {
        8 * self.meta_words as u64
    }

    /// Bytes a probe of the object reads: the metadata and the home's
    /// hash and length.
    fn probe_len(&self) -> u64 {
        8 * self.meta_words as u64 + INPLACE_HEADER
    }

    /// The metadata word writer `client` MAXes.
    pub fn word_of(&self, client: u8) -> u64 {
        // A 32-bit division: it is on every read's and write's path.
        8 * (client as u32 % self.meta_words) as u64
    }
}

/// A failure of an In-n-Out operation on one replica.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InOutError {
    /// The memory operation failed.
    Mem(MemError),
    /// The writer log could not be used.
    Log(LogError),
    /// Remote data that cannot be right (a length beyond the layout, a
    /// metadata word naming a missing entry, a copy whose checksum fails).
    Corrupt(NodeId),
    /// The log entry read holds another write than the one asked for: its
    /// segment was guessed wrong (look it up and read again).
    Elsewhere(NodeId),
    /// A value larger than the layout allows, or an impossible layout.
    BadLayout,
}

impl From<MemError> for InOutError {
    fn from(e: MemError) -> Self {
        InOutError::Mem(e)
    }
}

impl From<LogError> for InOutError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Mem(m) => InOutError::Mem(m),
            e => InOutError::Log(e),
        }
    }
}

impl core::fmt::Display for InOutError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InOutError::Mem(e) => write!(f, "{e}"),
            InOutError::Log(e) => write!(f, "{e}"),
            InOutError::Corrupt(n) => write!(f, "{n}: corrupt object or log entry"),
            InOutError::Elsewhere(n) => write!(f, "{n}: the log entry holds another write"),
            InOutError::BadLayout => write!(f, "value or layout beyond the object's limits"),
        }
    }
}

/// The hash that binds an in-place copy to its metadata and its object's
/// tag (the flag is left out: marking a tuple VERIFIED must not invalidate
/// its in-place copy).
pub fn inplace_hash(tag: u64, meta: Meta, value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, meta.guessed().0 ^ (value.len() as u64).rotate_left(32) ^ tag.rotate_left(7))
}

/// What a client remembers of one replica of one object.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct ReplicaCache {
    /// The largest metadata it knows the replica holds (the reliable max
    /// register's `cache[r]`, App. A).
    pub max: Meta,
    /// The last value it saw in its own metadata word (the seed of its MAX).
    pub mine: u64,
}

/// One replica: an object at `base` on `node`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Replica {
    /// The node.
    pub node: NodeId,
    /// The object's offset.
    pub base: u64,
}

/// What a probe of an object saw ([`Replica::probe`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Probe {
    /// The largest metadata word.
    pub max: Meta,
    /// The word of the client asked about.
    pub word: Meta,
    /// The home copy's hash and length.
    pub home: (u64, u64),
}

/// What one WRITE of an object did and saw.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WriteReply {
    /// What the MAX on the writer's own word did.
    pub outcome: MaxOutcome,
    /// The largest metadata seen in the object during the write (at least
    /// the written one).
    pub seen: Meta,
}

/// The largest of the first `words` metadata words of `bytes` (those
/// beyond its end are left out).
pub(crate) fn max_word(bytes: &[u8], words: usize) -> Meta {
    (0..words).filter_map(|i| word_at(bytes, 8 * i)).map(Meta).max().unwrap_or(Meta::BOTTOM)
}

/// What one READ of an object returned.
pub struct Reply<B> {
    /// The largest metadata word.
    pub meta: Meta,
    /// The word a given client MAXes (its next seed).
    pub word: u64,
    /// The value, if the in-place copy matches `meta` (empty if `meta` is
    /// bottom or the deletion marker).
    pub value: Option<Value<B>>,
}

impl Replica {
    fn at(&self, off: u64) -> RemoteAddr {
        RemoteAddr::new(self.node, self.base + off)
    }

    /// WRITE (Alg. "ino-write"): the value out of place in `entry` (the
    /// writer's log entry on this node, with `header`, which names the
    /// write) and MAX on the metadata, in one ordered pipeline; then the
    /// in-place copy in the background. `seed` is what the caller believes
    /// its metadata word holds.
    ///
    /// The reply also says the largest metadata seen on the replica, which
    /// Safe-Guess uses as the read that runs in parallel with its write
    /// (§3.2, line 6). With one metadata word, the CAS returns it; with an
    /// array (§4.4) the CAS sees only this writer's word, so the pipeline
    /// also READs the whole array after the CAS, in the same roundtrip.
    #[allow(clippy::too_many_arguments)]
    pub async fn write<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        entry: RemoteAddr,
        seed: u64,
        meta: Meta,
        header: &EntryHeader,
        value: &[u8],
    ) -> Result<WriteReply, InOutError> {
        if value.len() as u64 > layout.max_value || meta.is_deleted() {
            return Err(InOutError::BadLayout);
        }
        let head = header.placed(self.base).encode();
        let ops = [
            Op::Write { offset: entry.offset + 8, data: &head },
            Op::Write { offset: entry.offset + ENTRY_HEADER, data: value },
        ];
        let reply = self.max_after(mem, layout, &ops, layout.word_of(meta.client()), seed, meta).await?;
        if let MaxOutcome::Installed { .. } = reply.outcome
            && layout.in_place
        {
            self.post_inplace(mem, layout, meta, value);
        }
        Ok(reply)
    }

    /// DELETE's write (SWARM-KV §5.3.2): [`Meta::DELETED`] MAXed into the
    /// deleter's own word (`writer`, whose word holds `seed`); no value,
    /// nothing out of place.
    pub async fn delete<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        writer: u8,
        seed: u64,
    ) -> Result<WriteReply, InOutError> {
        self.max_after(mem, layout, &[], layout.word_of(writer), seed, Meta::DELETED).await
    }

    /// `before` (writes that must be visible first), then the MAX of `meta`
    /// on metadata word `word` (seeded with `seed`), then with a metadata
    /// array the read of the whole array: one ordered pipeline.
    async fn max_after<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        before: &[Op<'_>],
        word: u64,
        seed: u64,
        meta: Meta,
    ) -> Result<WriteReply, InOutError> {
        // The MAX's first CAS. If the client already saw its word at or
        // above `meta`, a CAS to `meta` could only lower the word: it becomes
        // a probe that swaps the word with itself and reports it.
        let new = if seed < meta.0 { meta.0 } else { seed };
        let mut ops: heapless::Vec<Op<'_>, { crate::substrate::memory::MAX_PIPELINE }> = heapless::Vec::new();
        let cas_at = before.len();
        for op in before.iter().copied().chain([
            Op::Cas { offset: self.base + word, expected: seed, new },
            Op::Read { offset: self.base, len: layout.inplace() as usize },
        ]) {
            ops.push(op).map_err(|_| InOutError::BadLayout)?;
        }
        if layout.meta_words == 1 {
            ops.pop();
        }
        let out = mem.pipeline(self.node, &ops).await?;
        let prev = out.get(cas_at).and_then(OpOutput::cas).ok_or(InOutError::Corrupt(self.node))?;
        let others = match out.get(cas_at + 1).and_then(OpOutput::read) {
            Some(words) => max_word(words, layout.meta_words as usize),
            None => Meta::BOTTOM,
        };
        let outcome = match MaxOutcome::of_cas(seed, meta.0, prev) {
            Ok(o) => o,
            // The word held something other than the seed: retry (rare).
            Err(smaller) => cold(|| cas_max(mem, self.at(word), smaller, meta.0)).await?,
        };
        Ok(WriteReply { outcome, seen: others.max(Meta(outcome.max_seen(meta.0))) })
    }

    fn post_inplace<M: Memory>(&self, mem: &M, layout: &Layout, meta: Meta, value: &[u8]) {
        let mut head = [0u8; INPLACE_HEADER as usize];
        head[..8].copy_from_slice(&inplace_hash(layout.tag, meta, value).to_le_bytes());
        head[8..].copy_from_slice(&(value.len() as u64).to_le_bytes());
        let off = self.base + layout.inplace();
        let ops = [Op::Write { offset: off, data: &head }, Op::Write { offset: off + INPLACE_HEADER, data: value }];
        mem.post_background(self.node, &ops);
    }

    /// Marks `meta` VERIFIED in the background: one CAS seeded with the
    /// GUESSED word, abandoned if anything else was written meanwhile (a
    /// larger word makes the flag moot).
    pub fn post_verify<M: Memory>(&self, mem: &M, layout: &Layout, meta: Meta) {
        let op = Op::Cas {
            offset: self.base + layout.word_of(meta.client()),
            expected: meta.guessed().0,
            new: meta.verify().0,
        };
        mem.post_background(self.node, &[op]);
    }

    /// The value of `meta` in this replica's home copy, which the
    /// replica's word says holds it ([`Meta::home`]): what a reader of a
    /// replica without in-place copy reads instead of the log entry. A
    /// copy that does not match `meta` (the word moved on since) is
    /// [`InOutError::Elsewhere`].
    pub async fn read_home<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        meta: Meta,
    ) -> Result<Value<M::Buf>, InOutError> {
        let buf = mem.read(self.at(layout.inplace()), (INPLACE_HEADER + layout.max_value) as usize).await?;
        let b = &*buf;
        let (hash, vlen) = (word_at(b, 0).ok_or(InOutError::Corrupt(self.node))?, word_at(b, 8).unwrap_or(u64::MAX));
        let end = INPLACE_HEADER as usize + vlen.min(layout.max_value) as usize;
        if vlen > layout.max_value || b.len() < end || inplace_hash(layout.tag, meta, &b[16..end]) != hash {
            return Err(InOutError::Elsewhere(self.node));
        }
        Ok(Value::in_buf(buf, 16..end))
    }

    /// What the object's writer needs to recycle a write's log entry
    /// ([`crate::swarm::recycle`]): the largest metadata word, the word of
    /// writer `client`, and the home's hash and length (one READ).
    pub async fn probe<M: Memory>(&self, mem: &M, layout: &Layout, client: u8) -> Result<Probe, InOutError> {
        let corrupt = InOutError::Corrupt(self.node);
        let buf = mem.read(self.at(0), layout.probe_len() as usize).await?;
        let ip = layout.inplace() as usize;
        Ok(Probe {
            max: max_word(&buf, layout.meta_words as usize),
            word: Meta(word_at(&buf, layout.word_of(client) as usize).ok_or(corrupt)?),
            home: (word_at(&buf, ip).ok_or(corrupt)?, word_at(&buf, ip + 8).ok_or(corrupt)?),
        })
    }

    /// Moves the value of `meta` (VERIFIED, its value in the log entry) to
    /// this replica's home: writes `value` there unless `None` (the home
    /// holds it already), then CASes the writer's word from `meta` to
    /// [`Meta::homed`], one ordered pipeline. Whether the word was `meta`
    /// (else nothing is marked; a written home copy then only spoils an
    /// in-place copy that readers check anyway). Only the writer of `meta`
    /// does this, and only once no process may still post an older write's
    /// in-place copy here ([`crate::swarm::recycle`] says why).
    pub async fn move_home<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        meta: Meta,
        value: Option<&[u8]>,
    ) -> Result<bool, InOutError> {
        if !meta.verified() || meta.home() || value.is_some_and(|v| v.len() as u64 > layout.max_value) {
            return Err(InOutError::BadLayout);
        }
        let word = Op::Cas { offset: self.base + layout.word_of(meta.client()), expected: meta.0, new: meta.homed().0 };
        let out = match value {
            None => mem.pipeline(self.node, &[word]).await?,
            Some(v) => {
                let mut head = [0u8; INPLACE_HEADER as usize];
                head[..8].copy_from_slice(&inplace_hash(layout.tag, meta, v).to_le_bytes());
                head[8..].copy_from_slice(&(v.len() as u64).to_le_bytes());
                let off = self.base + layout.inplace();
                let ops =
                    [Op::Write { offset: off, data: &head }, Op::Write { offset: off + INPLACE_HEADER, data: v }, word];
                mem.pipeline(self.node, &ops).await?
            }
        };
        Ok(out.last().and_then(OpOutput::cas) == Some(meta.0))
    }

    /// READ (Alg. "ino-read"), first half: metadata and in-place copy in
    /// one READ. The value is present if the in-place copy matches the
    /// metadata; otherwise the caller follows the metadata with
    /// [`Replica::read_out_of_place`].
    pub async fn read<M: Memory>(&self, mem: &M, layout: Layout, client: u8) -> Result<Reply<M::Buf>, InOutError> {
        let buf = mem.read(self.at(0), layout.read_len() as usize).await?;
        self.reply(buf, layout, client)
    }

    /// READ's first half and, in the same roundtrip, the second for
    /// `guess`, a tuple the reader expects, from its log entry `entry` on
    /// this node: what a reader asks of the replicas without an in-place
    /// copy while those with one are suspected (SWARM §6), so that the
    /// value of a key that did not change still comes in one roundtrip.
    /// The value is present if the replica's largest tuple is `guess` and
    /// the entry holds it, or the in-place copy matches.
    pub async fn read_guessing<M: Memory>(
        &self,
        mem: &M,
        layout: Layout,
        client: u8,
        guess: Meta,
        entry: RemoteAddr,
    ) -> Result<Reply<M::Buf>, InOutError> {
        let ops = [
            Op::Read { offset: self.base, len: layout.read_len() as usize },
            Op::Read { offset: entry.offset + 8, len: ENTRY_ID_BYTES + layout.max_value as usize },
        ];
        let mut out = mem.pipeline(self.node, &ops).await?.into_iter();
        let (Some(OpOutput::Read(obj)), Some(OpOutput::Read(copy))) = (out.next(), out.next()) else {
            return Err(InOutError::Corrupt(self.node));
        };
        let mut reply = self.reply(obj, layout, client)?;
        if reply.value.is_none() && reply.meta == guess.unhomed() {
            reply.value = self.entry_value(copy, &layout, guess).ok().map(|(_, v)| v);
        }
        Ok(reply)
    }

    /// What READ's first half makes of the object's bytes `buf`.
    fn reply<B: core::ops::Deref<Target = [u8]>>(
        &self,
        buf: B,
        layout: Layout,
        client: u8,
    ) -> Result<Reply<B>, InOutError> {
        let corrupt = InOutError::Corrupt(self.node);
        let meta = max_word(&buf, layout.meta_words as usize);
        let word = word_at(&buf, layout.word_of(client) as usize).ok_or(corrupt)?;
        if meta.is_bottom() || meta.is_deleted() {
            return Ok(Reply { meta, word, value: Some(Value::empty()) });
        }
        if !layout.in_place {
            return Ok(Reply { meta, word, value: None });
        }
        let ip = layout.inplace() as usize;
        let b = &*buf;
        let (hash, vlen) = (word_at(b, ip).ok_or(corrupt)?, word_at(b, ip + 8).ok_or(corrupt)?);
        let start = ip + INPLACE_HEADER as usize;
        let valid = vlen <= layout.max_value
            && b.len() >= start + vlen as usize
            && inplace_hash(layout.tag, meta, &b[start..start + vlen as usize]) == hash;
        let value = valid.then(|| Value::in_buf(buf, start..start + vlen as usize));
        Ok(Reply { meta, word, value })
    }

    /// READ, second half: the out-of-place copy of `meta` in log entry
    /// `entry` on this replica's node, whose values are at most `max` bytes,
    /// with the entry's header (what a write-back copies). The header must
    /// name `meta` ([`InOutError::Elsewhere`] otherwise) and its checksum
    /// match ([`InOutError::Corrupt`] otherwise).
    pub async fn read_out_of_place<M: Memory>(
        &self,
        mem: &M,
        layout: &Layout,
        entry: RemoteAddr,
        max: u64,
        meta: Meta,
    ) -> Result<(EntryHeader, Value<M::Buf>), InOutError> {
        let at = RemoteAddr::new(self.node, entry.offset + 8);
        let buf = mem.read(at, ENTRY_ID_BYTES + max.min(layout.max_value) as usize).await?;
        self.entry_value(buf, layout, meta)
    }

    /// What READ's second half makes of the entry's bytes `buf`.
    fn entry_value<B: core::ops::Deref<Target = [u8]>>(
        &self,
        buf: B,
        layout: &Layout,
        meta: Meta,
    ) -> Result<(EntryHeader, Value<B>), InOutError> {
        let b = &*buf;
        let header = EntryHeader::decode(b).ok_or(InOutError::Corrupt(self.node))?;
        // An entry of another write, or of this write for another object
        // (the memory was recycled): not the value sought.
        if !header.holds(meta) || header.obj != self.base {
            return Err(InOutError::Elsewhere(self.node));
        }
        let end = usize::try_from(header.len).ok().and_then(|l| l.checked_add(ENTRY_ID_BYTES));
        let end = end.filter(|&e| e <= b.len()).ok_or(InOutError::Corrupt(self.node))?;
        if !header.checks(layout.tag, &b[ENTRY_ID_BYTES..end]) {
            return Err(InOutError::Corrupt(self.node));
        }
        Ok((header, Value::in_buf(buf, ENTRY_ID_BYTES..end)))
    }
}

#[cfg(test)]
mod tests {
    use alloc::rc::Rc;
    use alloc::vec;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use proptest::prelude::*;

    use super::*;
    use crate::sim::{Sim, SimConfig};
    use crate::substrate::space::region::Region;
    use crate::substrate::space::slab::SlabAllocator;
    use crate::swarm::writerlog::{self, LogGeometry, Logs, Place};

    /// The bytes every write of `meta` carries: a function of the metadata,
    /// so a reader can check that value and metadata belong together.
    fn value_of(meta: Meta, len: usize) -> Vec<u8> {
        (0..len).map(|i| (meta.guessed().0.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Reads never return a value that was not written, nor a value
        /// with the metadata of another write, however writes tear the
        /// in-place copy; and they are monotonic per reader.
        #[test]
        fn reads_return_written_values_only(seed in any::<u64>(), words in 1u32..4, len in 8usize..300, writers in 1u8..4) {
            let mut sim = Sim::new(SimConfig { seed, nodes: 1, node_size: 1 << 20, max_piece_gap_ns: 2_000, ..SimConfig::default() });
            let admin = sim.client();
            let layout = Layout::new(words, 300).unwrap();
            let node = NodeId(0);
            let rep = sim.block_on(async move {
                Region::format(&admin, node, 1 << 20, 16 << 10).await.unwrap();
                writerlog::format(&admin, node, LogGeometry::new(300, 16 << 10, 8).unwrap()).await.unwrap();
                let mut slab = SlabAllocator::new();
                Replica { node, base: slab.alloc(&admin, node, layout.size()).await.unwrap().offset }
            }).unwrap();
            let bad = Rc::new(RefCell::new(Vec::new()));
            for w in 1..=writers {
                let c = sim.client();
                let m = c.clone();
                sim.spawn(&c, async move {
                    let (mut logs, mut slab, mut seed) = (Logs::new(), SlabAllocator::new(), 0);
                    for k in 0..6u32 {
                        // All in segment 0, which starts at time 1.
                        let meta = Meta::new(1 + m.random(0, 40), k, w);
                        let place = Place { segment: 0, slot: k, start: 1 };
                        let entry = logs.entries(&m, &[node], w, place, Some(slab.unleased()), 1).await[0].unwrap().unwrap();
                        let value = value_of(meta, len);
                        let header = EntryHeader::of(meta, 0, 1, &value);
                        let r = rep.write(&m, &layout, entry, seed, meta, &header, &value).await.unwrap();
                        prop_assert!(r.seen >= meta);
                        seed = match r.outcome { MaxOutcome::Installed { .. } => meta.0, MaxOutcome::Superseded { found } => found };
                    }
                    Ok(())
                }.map(|r: Result<(), TestCaseError>| r.unwrap()));
            }
            for _ in 0..2 {
                let c = sim.client();
                let (m, bad) = (c.clone(), bad.clone());
                sim.spawn(&c, async move {
                    let mut logs = Logs::new();
                    let mut last = Meta::BOTTOM;
                    for _ in 0..8 {
                        let reply = rep.read(&m, layout, 99).await.unwrap();
                        let value = match reply.value {
                            Some(v) => v.to_vec(),
                            None => {
                                let (e, _) = logs.locate(&m, node, reply.meta).await.unwrap().unwrap();
                                rep.read_out_of_place(&m, &layout, e, 300, reply.meta).await.unwrap().1.to_vec()
                            }
                        };
                        let want = if reply.meta.is_bottom() { vec![] } else { value_of(reply.meta, len) };
                        if value != want || reply.meta < last {
                            bad.borrow_mut().push(reply.meta);
                        }
                        last = reply.meta;
                    }
                });
            }
            sim.run().unwrap();
            prop_assert!(bad.borrow().is_empty(), "reads returned foreign or torn values for {:?}", bad.borrow());
        }
    }

    trait MapFuture: core::future::Future + Sized {
        fn map<T>(self, f: impl FnOnce(Self::Output) -> T) -> impl core::future::Future<Output = T> {
            async move { f(self.await) }
        }
    }
    impl<F: core::future::Future> MapFuture for F {}
}
