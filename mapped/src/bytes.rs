//! Reads, writes and compare-and-swap of bytes held in atomic words, and the
//! memory ordering that makes the backend's operations behave like a remote
//! memory's.
//!
//! # Access
//!
//! Byte `b` of a node is byte `b % 8` of word `b / 8` in memory order (the
//! words are converted with `to_ne_bytes`/`from_ne_bytes`, so every process
//! on the machine sees the same bytes at the same offsets). A CAS value is
//! stored little-endian, like every word the core decodes with
//! [`swarm_core::substrate::memory::word_at`].
//!
//! - A read loads each word it covers once (Relaxed) and copies the bytes
//!   asked for.
//! - A write stores each word it covers entirely (Relaxed). A word it covers
//!   only in part (its unaligned head or tail) is updated with a CAS loop that
//!   replaces just those bytes, so concurrent writers of the word's other
//!   bytes are never clobbered with stale data. All accesses are 8-byte
//!   atomics; no other access size is ever used on the memory, as Rust's
//!   memory model forbids racing accesses of mixed sizes.
//! - A CAS is one `compare_exchange` on its word.
//!
//! Reads and writes are not atomic as a whole (a read overlapping a write may
//! return a mix), exactly as the interface promises; each single word is.
//!
//! # Ordering
//!
//! The guarantees, and the fences that give them (all free on x86 except the
//! `SeqCst` fence ending a write, one `mfence`):
//!
//! 1. **Ordered pipelines, and publication by CAS.** If anyone observes a
//!    value stored by an operation `B` of a client, then every operation that
//!    observer runs afterwards sees everything the client did before `B`.
//!    Every write starts with a `Release` fence and every CAS is (at least)
//!    `Release`; every read ends with an `Acquire` fence and every CAS is (at
//!    least) `Acquire`. By the fence rules of the C++/Rust model, a relaxed
//!    load that reads a value stored after a release fence (or by a release
//!    RMW), followed by an acquire fence, makes the release side
//!    happen-before everything after the acquire fence. So for write-then-CAS
//!    (In-n-Out), a reader that sees the new CAS word, by a read or by a CAS,
//!    sees the data in its next operation; and a pipeline's later operations
//!    are never visible without its earlier ones.
//! 2. **Completion means visible to all.** On RDMA, a completed write is in
//!    the node's memory: any operation started afterwards, by anyone, sees it.
//!    A relaxed store may still sit in the writer's store buffer, so a write
//!    ends with a `SeqCst` fence, and CAS is `SeqCst` (on x86 a locked
//!    `cmpxchg`, a full barrier, whatever the ordering asked). With them all
//!    operations on single words are linearizable with respect to the
//!    `SeqCst` order: if a write or CAS completed before another operation
//!    started, ordered by any `SeqCst` operation in between (a test's atomic
//!    clock, a lock, a thread join), that operation sees it. `AcqRel` CAS and
//!    no trailing fence would allow the store-buffer (Dekker) anomaly, where
//!    two clients each write one word and then both read the other's old
//!    value, which no remote memory exhibits.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use crate::atomic::{AtomicU64, WORD, fence, prefetch_line};

/// Reads `len` bytes at byte `offset` of `words` into `out` (cleared first).
///
/// The range must have been checked (`swarm_core::substrate::addr::check_range`); out of
/// range indices would panic, never touch memory outside `words`.
#[inline]
pub(crate) fn read(words: &[AtomicU64], offset: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(len, 0);
    let mut dst = &mut out[..];
    let mut word = offset as usize / WORD;
    // Unaligned head, or a short read inside one word.
    let lo = offset as usize % WORD;
    if lo != 0 || dst.len() < WORD {
        let n = (WORD - lo).min(dst.len());
        if n > 0 {
            dst[..n].copy_from_slice(&words[word].load(Relaxed).to_ne_bytes()[lo..lo + n]);
            word += 1;
        }
        dst = &mut dst[n..];
    }
    // Whole words (fixed-size copies: no call to memcpy per word).
    let mut whole = dst.chunks_exact_mut(WORD);
    for (chunk, w) in whole.by_ref().zip(&words[word.min(words.len())..]) {
        chunk.copy_from_slice(&w.load(Relaxed).to_ne_bytes());
        word += 1;
    }
    // Unaligned tail.
    let tail = whole.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&words[word].load(Relaxed).to_ne_bytes()[..n]);
    }
    fence(Acquire);
}

/// Starts fetching the cache lines of bytes `offset..offset + len` of
/// `words` into this CPU's cache: a hint, which neither accesses the memory
/// nor changes it (bytes out of range are left out).
///
/// An operation is posted in one poll and applied in a later one (see
/// [`crate::memory`]); prefetched at its post, its lines are on their way
/// while the client posts the others. The replicas of a quorum then wait
/// for their memory at the same time, as separate nodes do, instead of one
/// after the other on the client's CPU, which would charge a quorum a
/// miss per replica where a single read pays one.
#[inline]
pub(crate) fn prefetch(words: &[AtomicU64], offset: u64, len: usize) {
    let first = offset as usize / WORD;
    let end = (offset as usize).saturating_add(len).div_ceil(WORD).min(words.len());
    if first >= end {
        return;
    }
    // One word per 8 (a 64-byte line), and the last: every line of the
    // range, wherever the slice starts.
    let mut w = first;
    while w < end {
        prefetch_line(&words[w]);
        w += 8;
    }
    prefetch_line(&words[end - 1]);
}

/// Writes `data` at byte `offset` of `words`. The range must have been
/// checked, as for [`read`].
#[inline]
pub(crate) fn write(words: &[AtomicU64], offset: u64, data: &[u8]) {
    fence(Release);
    let mut pos = offset as usize;
    let mut rest = data;
    // Unaligned head, or a short write inside one word.
    let lo = pos % WORD;
    if lo != 0 || rest.len() < WORD {
        let n = (WORD - lo).min(rest.len());
        if n > 0 {
            merge(&words[pos / WORD], lo, &rest[..n]);
        }
        pos += n;
        rest = &rest[n..];
    }
    // Whole words.
    let mut whole = rest.chunks_exact(WORD);
    for (word, chunk) in words[pos / WORD..].iter().zip(whole.by_ref()) {
        let mut bytes = [0u8; WORD];
        bytes.copy_from_slice(chunk);
        word.store(u64::from_ne_bytes(bytes), Relaxed);
    }
    // Unaligned tail.
    let tail = whole.remainder();
    if !tail.is_empty() {
        pos += rest.len() - tail.len();
        merge(&words[pos / WORD], 0, tail);
    }
    fence(SeqCst);
}

/// Replaces bytes `lo..lo + bytes.len()` of `word`, leaving its other bytes
/// as they are even if another thread or process changes them meanwhile.
#[inline]
fn merge(word: &AtomicU64, lo: usize, bytes: &[u8]) {
    let update = |old: u64| {
        let mut b = old.to_ne_bytes();
        b[lo..lo + bytes.len()].copy_from_slice(bytes);
        Some(u64::from_ne_bytes(b))
    };
    // Cannot fail: the closure always returns `Some`.
    let _ = word.fetch_update(Relaxed, Relaxed, update);
}

/// Compare-and-swap of the aligned word at byte `offset` of `words`; returns
/// the value it held. The word must have been checked
/// (`swarm_core::substrate::addr::check_word`).
#[inline]
pub(crate) fn cas(words: &[AtomicU64], offset: u64, expected: u64, new: u64) -> u64 {
    let word = &words[offset as usize / WORD];
    match word.compare_exchange(expected.to_le(), new.to_le(), SeqCst, SeqCst) {
        Ok(prev) | Err(prev) => u64::from_le(prev),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn mem(words: usize) -> Vec<AtomicU64> {
        (0..words).map(|_| AtomicU64::new(0)).collect()
    }

    fn bytes_of(words: &[AtomicU64]) -> Vec<u8> {
        let mut out = Vec::new();
        read(words, 0, words.len() * WORD, &mut out);
        out
    }

    #[test]
    fn every_offset_and_length_round_trips() {
        for off in 0..24u64 {
            for len in 0..=40usize {
                let w = mem(9);
                for x in w.iter() {
                    x.store(u64::MAX, Relaxed);
                }
                let data: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(7).wrapping_add(1) & 0x7f).collect();
                write(&w, off, &data);
                let mut back = Vec::new();
                read(&w, off, len, &mut back);
                assert_eq!(back, data, "offset {off} len {len}");
                let all = bytes_of(&w);
                let range = off as usize..off as usize + len;
                for (i, b) in all.iter().enumerate() {
                    if !range.contains(&i) {
                        assert_eq!(*b, 0xff, "byte {i} outside offset {off} len {len} was touched");
                    }
                }
            }
        }
    }

    #[test]
    fn cas_values_are_little_endian_in_memory() {
        let w = mem(2);
        assert_eq!(cas(&w, 8, 0, 0x0102_0304_0506_0708), 0);
        let mut out = Vec::new();
        read(&w, 8, 8, &mut out);
        assert_eq!(out, 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(cas(&w, 8, 1, 2), 0x0102_0304_0506_0708, "a failed CAS returns the current value");
    }
}
