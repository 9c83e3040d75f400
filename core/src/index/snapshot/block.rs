//! Key blocks in the replicated index's arena, and their commit marks: what
//! a slot word points to, as the slot protocol (`super::slot`) carries it
//! (`notes/fusee-design.md` §2, "Block").
//!
//! A block is the single-node index's key block ([`Block`]: key, location,
//! checksum), at the same arena offset on every replica, followed by its
//! *parent* (the word its writer's round started from, checked) and one
//! *mark* word:
//!
//! ```text
//! 0                 the block (block_len(key length) bytes)
//! block_len         parent: the round's vold, a committed word
//! block_len + 8     parent check: xxh3 of the parent and the block's checksum
//! block_len + 16    mark: 0, or mark_of(word) once the word was committed
//! ```
//!
//! The parent tells a master which word was committed when the primary that
//! held it is gone (the backups hold it, or proposals whose parent it is:
//! `notes/fusee-design.md` §7.1). The mark of a word is set by whoever
//! commits it (on the primary) and, as evidence, by every later round that
//! starts from it (on each backup it reaches: its vold was read from a
//! primary, so it is committed), so a writer that lost track of its round
//! finds out whether its word was committed.
//!
//! Every proposed word points to a block of its own (F1: a removal, too,
//! proposes a *tomb block* naming the key), written to each backup ahead of
//! the writer's CAS there and to the primary ahead of the commit's CAS, in
//! the same ordered pipelines; a helper that commits another writer's word
//! first copies that writer's block to the primary and the backups
//! (`KeyBlock::fetch`). So a replica that holds a word holds its block.
//! The mark is set by CAS in the commit's pipeline (never by a plain write:
//! CAS is all that ever touches it), so an interrupted writer learns from
//! it whether a helper committed its word (F7).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::arena::{ALIGN, Site};
use super::slot::{Target, TargetOps};
use crate::index::layout::{Block, MAX_BLOCK, SlotWord, block_len};
use crate::substrate::late::{Watch, late};
use crate::substrate::memory::{read_word, word_at};
use crate::substrate::quorum::{MAX_REPLICAS, join_all, join_timely, majority};
use crate::{MemError, Memory, Op, RemoteAddr};

/// Seed of the mark hash.
const MARK_SEED: u64 = 0x5357_4d41_524b_0001;
/// Bytes of the parent record after a block: the parent and its check.
const PARENT: usize = 16;

/// Bytes a block for a key of `key_len` bytes takes in the arena: the
/// block, its parent and its mark, in whole 64-byte lines.
pub const fn alloc_len(key_len: usize) -> u64 {
    (block_len(key_len) as u64 + PARENT as u64 + 8).div_ceil(ALIGN) * ALIGN
}

/// The mark of a committed `word` (never 0).
pub fn mark_of(word: u64) -> u64 {
    xxh3_64_with_seed(&word.to_le_bytes(), MARK_SEED) | 1
}

/// What part of a word's block an address is wanted for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Part {
    /// The key block alone.
    Block,
    /// The key block and its parent record.
    Record,
    /// The mark word.
    Mark,
}

/// Where `part` of `word`'s block lies at `site`, if inside an arena of
/// `size` bytes: the word came from remote memory.
pub fn addr_of(site: Site, size: u64, word: u64, part: Part) -> Option<RemoteAddr> {
    let w = SlotWord(word);
    let len = block_len(w.key_len()) as u64;
    let (at, bytes) = match part {
        Part::Block => (0, len),
        Part::Record => (0, len + PARENT as u64),
        Part::Mark => (len + PARENT as u64, 8),
    };
    let at = w.block().checked_add(at)?;
    let end = at.checked_add(bytes)?;
    (w.block() >= super::arena::HEADER && end <= size).then_some(RemoteAddr::new(site.node, site.base + at))
}

/// The check of a parent record.
fn parent_check(parent: u64, block: &[u8]) -> u64 {
    let sum = word_at(block, block.len().saturating_sub(8)).unwrap_or(0);
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&parent.to_le_bytes());
    b[8..].copy_from_slice(&sum.to_le_bytes());
    xxh3_64(&b) | 1
}

/// The record of a block for a key of `key_len` bytes, read from remote
/// memory: the block's location and key, and its parent; `None` if the
/// block or its parent record is not whole.
pub fn decode_record(bytes: &[u8], key_len: usize) -> Option<(u64, &[u8], u64)> {
    let len = block_len(key_len);
    let (location, key) = Block::decode(bytes, key_len).ok()?;
    let parent = word_at(bytes, len)?;
    (word_at(bytes, len + 8)? == parent_check(parent, &bytes[..len])).then_some((location, key, parent))
}

/// One writer's block, as its slot's pipelines carry it: `sites` are the
/// slot's replicas' arenas in the slot's order (primary first).
pub struct KeyBlock {
    /// The arenas, primary first.
    sites: heapless::Vec<Site, MAX_REPLICAS>,
    /// Bytes of the arena.
    size: u64,
    /// The word this writer proposes.
    word: u64,
    /// The round's `vold` (committed: read from a primary).
    vold: u64,
    /// Its block and parent record.
    record: heapless::Vec<u8, { MAX_BLOCK + PARENT }>,
}

impl KeyBlock {
    /// The block of `word`, proposed from `vold`, holding `block`.
    pub fn new(sites: heapless::Vec<Site, MAX_REPLICAS>, size: u64, word: u64, vold: u64, block: &Block) -> KeyBlock {
        let mut record: heapless::Vec<u8, { MAX_BLOCK + PARENT }> = heapless::Vec::new();
        // Cannot fail: a block has at most MAX_BLOCK bytes.
        let _ = record.extend_from_slice(block);
        let check = parent_check(vold, block);
        let _ = record.extend_from_slice(&vold.to_le_bytes());
        let _ = record.extend_from_slice(&check.to_le_bytes());
        KeyBlock { sites, size, word, vold, record }
    }

    fn write<'a>(&'a self, site: Site, out: &mut TargetOps<'a>) {
        if let Some(at) = addr_of(site, self.size, self.word, Part::Record) {
            let _ = out.push(Op::Write { offset: at.offset, data: &self.record });
        }
    }

    /// The CAS that marks `word` committed at `site`.
    fn mark(&self, site: Site, word: u64) -> Option<Op<'static>> {
        let at = addr_of(site, self.size, word, Part::Mark)?;
        Some(Op::Cas { offset: at.offset, expected: 0, new: mark_of(word) })
    }

    /// Whether `word` is marked committed on a majority-read of the
    /// replicas (one roundtrip): after a view change, where the evidence
    /// of later rounds lies on the backups.
    pub async fn marked_anywhere<M: Memory>(&self, mem: &M, word: u64) -> Result<bool, MemError> {
        let futs: heapless::Vec<_, MAX_REPLICAS> = self
            .sites
            .iter()
            .map(|&s| async move {
                match addr_of(s, self.size, word, Part::Mark) {
                    Some(at) => read_word(mem, at).await,
                    None => Ok(0),
                }
            })
            .collect();
        let need = majority(self.sites.len());
        let (replies, _) = join_timely(futs, need, Watch::on(mem), |i| late(self.sites[i].node)).await;
        if replies.oks().any(|(_, &m)| m == mark_of(word)) {
            return Ok(true);
        }
        match replies.first_error() {
            Some(&e) if replies.ok < need => Err(e),
            _ => Ok(false),
        }
    }
}

impl Target for KeyBlock {
    fn backup_ops<'a>(&'a self, backup: usize, out: &mut TargetOps<'a>) {
        if let Some(&site) = self.sites.get(backup + 1) {
            self.write(site, out);
            if let Some(op) = self.mark(site, self.vold) {
                let _ = out.push(op);
            }
        }
    }

    fn commit_ops<'a>(&'a self, word: u64, _vold: u64, out: &mut TargetOps<'a>) {
        let primary = self.sites[0];
        if word == self.word {
            self.write(primary, out);
        }
        if let Some(op) = self.mark(primary, word) {
            let _ = out.push(op);
        }
    }

    async fn marked<M: Memory>(&self, mem: &M, word: u64) -> Result<Option<bool>, MemError> {
        let Some(at) = addr_of(self.sites[0], self.size, word, Part::Mark) else { return Ok(Some(false)) };
        Ok(Some(read_word(mem, at).await? == mark_of(word)))
    }

    /// Reads `word`'s record from every backup holding the word (one
    /// roundtrip) and writes the first whole one to the primary and to every
    /// backup, with the evidence mark of the round's `vold` on each backup
    /// (one more). A record no holder has whole (which the pipelines' order
    /// rules out) is not copied.
    async fn fetch<M: Memory>(&self, mem: &M, word: u64, holders: &[RemoteAddr]) -> Result<(), MemError> {
        let w = SlotWord(word);
        let len = block_len(w.key_len()) + PARENT;
        let site_of = |at: &RemoteAddr| self.sites.iter().copied().find(|s| s.node == at.node);
        let reads = holders
            .iter()
            .filter_map(|h| addr_of(site_of(h)?, self.size, word, Part::Record))
            .map(|at| mem.read(at, len))
            .take(MAX_REPLICAS)
            .collect();
        let replies = join_all(reads).await;
        let Some(record) = replies.oks().map(|(_, b)| b).find(|b| decode_record(b, w.key_len()).is_some()) else {
            return Ok(());
        };
        let record = &record[..len];
        let posts: heapless::Vec<_, MAX_REPLICAS> = self
            .sites
            .iter()
            .enumerate()
            .map(|(i, &site)| async move {
                let mut ops: heapless::Vec<Op<'_>, 2> = heapless::Vec::new();
                if let Some(at) = addr_of(site, self.size, word, Part::Record) {
                    let _ = ops.push(Op::Write { offset: at.offset, data: record });
                }
                if i > 0
                    && let Some(op) = self.mark(site, self.vold)
                {
                    let _ = ops.push(op);
                }
                mem.pipeline(site.node, &ops).await.map(drop)
            })
            .collect();
        match join_all(posts).await.first_error() {
            Some(&e) => Err(e),
            None => Ok(()),
        }
    }
}
