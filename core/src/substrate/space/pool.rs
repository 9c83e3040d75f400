//! A node's pool of given-back blocks: memory that a client claimed from
//! the region, used, and gave back for any client to take, so that what
//! one client freed does not stay out of reach of the others.
//!
//! Chunks are handed out by a cursor that only moves forward
//! ([`super::region`]), and clients keep what they carve from their chunks
//! ([`super::slab`]). Some memory is given back in whole blocks of one
//! size that outlive their user's interest: the writer logs' segments
//! ([`crate::swarm::writerlog`]), of which one client may have needed many
//! during a burst of writes and needs few afterwards. Such blocks go into
//! this pool, a stack in the node's memory (Treiber's, with a tag against
//! ABA), and a client whose node has no chunk left takes its next block
//! from it ([`super::slab::SlabAllocator`]).
//!
//! ```text
//! region header, offset 40   head: offset/64 of the top block (36 bits) | tag (28 bits)
//!                         48   bytes in the pool (approximate: a report, not a guard)
//! a block in the pool:  0     offset of the next block (0: none)
//!                       8     the block's bytes
//!                       16..  zeros
//! ```
//!
//! What gives a block to the pool must know that nobody still writes to
//! it: the writer logs give a segment only after its writer left it
//! unused for many recycling delays, past which no reader acts on what it
//! read there (`crate::swarm::recycle`'s timing assumption).
//!
//! Both header words were reserved (zero) in regions formatted before the
//! pool existed: such a region has an empty pool. A block is zeroed
//! before it goes in (the protocols take fresh memory to read as zero),
//! and its two link words are zeroed again when it is taken out, so a
//! block from the pool reads as a fresh chunk does.
//!
//! **Why a pop never takes a block twice.** A pop reads the head `(b, t)`,
//! then `b`'s link `n`, then CASes the head from `(b, t)` to `(n, t + 1)`;
//! every push and pop that succeeds adds one to the tag. If the CAS
//! succeeds, no push or pop succeeded between the pop's read of the head
//! and its CAS (unless 2^28 of them did, while it waited: the bound this
//! tag width sets, about a quarter of a billion operations on one node's
//! pool during one pop), so `b` was on top the whole time and `n` was its
//! link. Every link and size read from the node is checked against the
//! region before it is used: a garbled pool is an error, never an access
//! outside the region.

use super::region::{Region, RegionError, zero};
use crate::substrate::memory::{read_word, word_at};
use crate::substrate::mutant::mutant;
use crate::{Memory, NodeId, Op, OpOutput, RemoteAddr};

/// Offset of the head word in the region header.
pub const HEAD_OFFSET: u64 = 40;
/// Offset of the pool's byte count in the region header.
pub const BYTES_OFFSET: u64 = 48;
/// Bits of a head word that hold the top block's offset, in 64-byte units:
/// regions up to 4 TiB have a pool (a larger one gives nothing back).
const OFFSET_BITS: u32 = 36;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// The tag's bits: the rest of the word.
const TAG_MASK: u64 = (1 << (64 - OFFSET_BITS)) - 1;
/// Tries of one push or pop against other clients' before it gives up
/// (a pop then finds nothing; a push leaves the block out: lost space).
const MAX_TRIES: u32 = 64;

fn head(offset: u64, tag: u64) -> u64 {
    // The mutant `pool-untagged` leaves the tag out: a pop that read a
    // block's link before others took the block and gave it back puts a
    // block someone holds on top again (ABA).
    let tag = if mutant!("pool-untagged") { 0 } else { tag };
    (offset / 64) | (tag & TAG_MASK) << OFFSET_BITS
}

fn top(head: u64) -> u64 {
    (head & OFFSET_MASK) * 64
}

fn tag(head: u64) -> u64 {
    head >> OFFSET_BITS
}

/// Whether `region` can hold a pool block at `offset` of `bytes`: inside
/// the chunks, 64-byte aligned, room for its links, and within what a head
/// word can name.
pub fn sound(region: &Region, offset: u64, bytes: u64) -> bool {
    offset >= super::region::HEADER_SIZE
        && offset.is_multiple_of(64)
        && bytes >= 16
        && offset.checked_add(bytes).is_some_and(|end| end <= region.size)
        && offset / 64 <= OFFSET_MASK
}

/// Gives the block of `bytes` at `offset` on `region`'s node to the pool:
/// zeros over it, its links, then the head. `Ok(false)` if the block
/// cannot go in (outside what the pool can name, or the head kept changing:
/// the block is then lost space, as a block nobody gives back).
pub async fn give<M: Memory>(mem: &M, region: &Region, offset: u64, bytes: u64) -> Result<bool, RegionError> {
    if !sound(region, offset, bytes) {
        return Ok(false);
    }
    let node = region.node;
    zero(mem, node, offset + 16, offset + bytes).await?;
    let head_at = RemoteAddr::new(node, HEAD_OFFSET);
    let mut seen = read_word(mem, head_at).await?;
    for _ in 0..MAX_TRIES {
        let next = top(seen);
        let mut links = [0u8; 16];
        links[..8].copy_from_slice(&next.to_le_bytes());
        links[8..].copy_from_slice(&bytes.to_le_bytes());
        let ops = [
            Op::Write { offset, data: &links },
            Op::Cas { offset: HEAD_OFFSET, expected: seen, new: head(offset, tag(seen) + 1) },
        ];
        let out = mem.pipeline(node, &ops).await?;
        match out.get(1).and_then(OpOutput::cas) {
            Some(prev) if prev == seen => {
                add_bytes(mem, node, bytes as i64).await?;
                return Ok(true);
            }
            Some(prev) => seen = prev,
            None => return Err(RegionError::Corrupt { node, what: "the pool's head CAS gave no word" }),
        }
    }
    Ok(false)
}

/// Takes a block from `region`'s pool: its offset and bytes, its links
/// zeroed (it reads as zero throughout), or `None` if the pool is empty.
pub async fn take<M: Memory>(mem: &M, region: &Region) -> Result<Option<(u64, u64)>, RegionError> {
    let node = region.node;
    let corrupt = |what| RegionError::Corrupt { node, what };
    let head_at = RemoteAddr::new(node, HEAD_OFFSET);
    let mut seen = read_word(mem, head_at).await?;
    for _ in 0..MAX_TRIES {
        let block = top(seen);
        if block == 0 {
            return Ok(None);
        }
        if !sound(region, block, 16) {
            return Err(corrupt("the pool's head names no block of the region"));
        }
        let links = mem.read(RemoteAddr::new(node, block), 16).await?;
        let (next, bytes) = (word_at(&links, 0).unwrap_or(u64::MAX), word_at(&links, 8).unwrap_or(0));
        if (next != 0 && !sound(region, next, 16)) || !sound(region, block, bytes) {
            // Taken and written over since the head was read, or garbled:
            // the head tells which.
            let now = read_word(mem, head_at).await?;
            if now == seen {
                return Err(corrupt("a block in the pool has impossible links"));
            }
            seen = now;
            continue;
        }
        let prev = mem.cas(head_at, seen, head(next, tag(seen) + 1)).await?;
        if prev == seen {
            mem.write(RemoteAddr::new(node, block), &[0; 16]).await?;
            add_bytes(mem, node, -(bytes as i64)).await?;
            return Ok(Some((block, bytes)));
        }
        seen = prev;
    }
    Ok(None)
}

/// A block of at least `bytes` from `region`'s pool: its offset and its
/// own size (zeroed throughout), or `None` if the pool is empty or its top
/// block is smaller (which goes back).
pub async fn take_fitting<M: Memory>(mem: &M, region: &Region, bytes: u64) -> Result<Option<(u64, u64)>, RegionError> {
    match take(mem, region).await? {
        Some((block, len)) if len >= bytes => Ok(Some((block, len))),
        Some((block, len)) => give(mem, region, block, len).await.map(|_| None),
        None => Ok(None),
    }
}

/// Bytes in `node`'s pool (approximate: the count follows the stack).
pub async fn bytes<M: Memory>(mem: &M, node: NodeId) -> Result<u64, RegionError> {
    let b = read_word(mem, RemoteAddr::new(node, BYTES_OFFSET)).await?;
    // A count caught between a pop and its decrement can be negative.
    Ok(if b > i64::MAX as u64 { 0 } else { b })
}

/// Adds `delta` to the pool's byte count.
async fn add_bytes<M: Memory>(mem: &M, node: NodeId, delta: i64) -> Result<(), RegionError> {
    let at = RemoteAddr::new(node, BYTES_OFFSET);
    let mut seen = read_word(mem, at).await?;
    for _ in 0..MAX_TRIES {
        let prev = mem.cas(at, seen, seen.wrapping_add(delta as u64)).await?;
        if prev == seen {
            break;
        }
        seen = prev;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
