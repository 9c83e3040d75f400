//! Key blocks in the replicated index's arena, and their commit marks: what
//! a slot word points to, as the slot protocol (`super::slot`) carries it
//! (`notes/fusee-design.md` §2, "Block").
//!
//! A block is the single-node index's key block ([`Block`]: key, location,
//! checksum), at the same arena offset on every replica, followed by one
//! *mark* word:
//!
//! ```text
//! 0                 the block (block_len(key length) bytes)
//! block_len         mark: 0, or mark_of(word) once the word was committed
//! ```
//!
//! Every proposed word points to a block of its own (F1: a removal, too,
//! proposes a *tomb block* naming the key), written to each backup ahead of
//! the writer's CAS there and to the primary ahead of the commit's CAS, in
//! the same ordered pipelines; a helper that commits another writer's word
//! first copies that writer's block to the primary (`KeyBlock::fetch`).
//! So whoever reads a committed word on the primary finds its block there.
//! The mark is set by CAS in the commit's pipeline (never by a plain write:
//! CAS is all that ever touches it), so an interrupted writer learns from
//! it whether a helper committed its word (F7).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::arena::{ALIGN, Site};
use super::slot::{Target, TargetOps};
use crate::index::layout::{Block, SlotWord, block_len};
use crate::substrate::memory::read_word;
use crate::substrate::quorum::{MAX_REPLICAS, join_all};
use crate::{MemError, Memory, Op, RemoteAddr};

/// Seed of the mark hash.
const MARK_SEED: u64 = 0x5357_4d41_524b_0001;

/// Bytes a block for a key of `key_len` bytes takes in the arena: the
/// block and its mark, in whole 64-byte lines.
pub const fn alloc_len(key_len: usize) -> u64 {
    (block_len(key_len) as u64 + 8).div_ceil(ALIGN) * ALIGN
}

/// The mark of a committed `word` (never 0).
pub fn mark_of(word: u64) -> u64 {
    xxh3_64_with_seed(&word.to_le_bytes(), MARK_SEED) | 1
}

/// Where `word`'s block (`mark: false`) or mark lies at `site`, if inside
/// an arena of `size` bytes: the word came from remote memory.
pub fn addr_of(site: Site, size: u64, word: u64, mark: bool) -> Option<RemoteAddr> {
    let w = SlotWord(word);
    let len = block_len(w.key_len()) as u64;
    let at = w.block().checked_add(if mark { len } else { 0 })?;
    let end = at.checked_add(if mark { 8 } else { len })?;
    (w.block() >= super::arena::HEADER && end <= size).then_some(RemoteAddr::new(site.node, site.base + at))
}

/// One writer's block, as its slot's pipelines carry it: `sites` are the
/// slot's replicas' arenas in the slot's order (primary first).
pub struct KeyBlock<'a> {
    /// The arenas, primary first.
    pub sites: heapless::Vec<Site, MAX_REPLICAS>,
    /// Bytes of the arena.
    pub size: u64,
    /// The word this writer proposes.
    pub word: u64,
    /// Its block's bytes.
    pub block: &'a Block,
}

impl KeyBlock<'_> {
    fn write<'a>(&'a self, site: Site, out: &mut TargetOps<'a>) {
        if let Some(at) = addr_of(site, self.size, self.word, false) {
            let _ = out.push(Op::Write { offset: at.offset, data: self.block });
        }
    }
}

impl Target for KeyBlock<'_> {
    fn backup_ops<'a>(&'a self, backup: usize, out: &mut TargetOps<'a>) {
        if let Some(&site) = self.sites.get(backup + 1) {
            self.write(site, out);
        }
    }

    fn commit_ops<'a>(&'a self, word: u64, _vold: u64, out: &mut TargetOps<'a>) {
        let primary = self.sites[0];
        if word == self.word {
            self.write(primary, out);
        }
        if let Some(at) = addr_of(primary, self.size, word, true) {
            let _ = out.push(Op::Cas { offset: at.offset, expected: 0, new: mark_of(word) });
        }
    }

    async fn marked<M: Memory>(&self, mem: &M, word: u64) -> Result<Option<bool>, MemError> {
        let Some(at) = addr_of(self.sites[0], self.size, word, true) else { return Ok(Some(false)) };
        Ok(Some(read_word(mem, at).await? == mark_of(word)))
    }

    /// Reads `word`'s block from every backup holding the word (one
    /// roundtrip) and writes the first whole one to the primary (one
    /// more). A block no holder has whole (which the pipelines' order
    /// rules out) is not copied: lookups then report the slot corrupt.
    async fn fetch<M: Memory>(&self, mem: &M, word: u64, holders: &[RemoteAddr]) -> Result<(), MemError> {
        let w = SlotWord(word);
        let len = block_len(w.key_len());
        let site_of = |at: &RemoteAddr| self.sites.iter().copied().find(|s| s.node == at.node);
        let reads = holders
            .iter()
            .filter_map(|h| addr_of(site_of(h)?, self.size, word, false))
            .map(|at| mem.read(at, len))
            .take(MAX_REPLICAS)
            .collect();
        let replies = join_all(reads).await;
        let whole = replies.oks().map(|(_, b)| b).find(|b| Block::decode(b, w.key_len()).is_ok());
        match (whole, addr_of(self.sites[0], self.size, word, false)) {
            (Some(bytes), Some(at)) => mem.write(at, &bytes[..len]).await,
            _ => Ok(()),
        }
    }
}
