//! A one-way message ring in memory (FaRM §3, "Communication primitives"):
//! one sender writes messages into a contiguous ring in the receiver's
//! memory with one-sided WRITEs, the receiver polls it, and the sender
//! learns how much the receiver has processed from a head word that the
//! receiver advances lazily.
//!
//! ```text
//! message   len (4) | kind (1) | 0 (3)        kind: 1 data, 2 wrap
//!           tag: epoch (2) | generation (2) | sequence (4)
//!           xxh3 of the two words above and the payload
//!           payload (len bytes), padded to 8
//! head line 8 slots: generation (2) | position mod 2^48 (6)
//! ```
//!
//! Positions count bytes from the start of a connection (the ring offset is
//! the position modulo the ring's size). A message never straddles the end
//! of the ring: when it does not fit, the sender writes a *wrap* marker (in
//! the same ordered pipeline as the message, so one roundtrip) and the
//! message goes at the start; when less than a header is left, both sides
//! skip it without a marker.
//!
//! Departures from FaRM, and why:
//! - FaRM relies on the NIC writing in increasing address order and on
//!   zeroing processed space: a non-zero trailer means a whole message. The
//!   memory interface promises neither (a WRITE is not atomic, in any
//!   order), so each message carries its tag (which connection, which
//!   sequence number) and a checksum over all of it: the receiver takes a
//!   message only when the tag is the one it expects next and the checksum
//!   matches, and otherwise polls again. A torn, stale or garbled message is
//!   never delivered, and nothing needs zeroing.
//! - The head is published in one of eight slots of a line, in turn, and
//!   the sender takes the furthest: publications are posted without
//!   waiting, and separate posts may land in any order, so a late older one
//!   must not hide a newer one (it can only overwrite its own slot). A
//!   receiver that runs out of messages after publishing publishes once
//!   more, into the next slot, so that the newest head is always somewhere
//!   once the ring is quiet. Each slot carries the connection's generation,
//!   so that a slot left from an earlier connection is never taken for
//!   progress, and positions modulo 2^48, compared with wrapping arithmetic,
//!   so that no counter runs out however long a connection lives (sequence
//!   numbers wrap too; the receiver only ever expects the next one).
//! - The receiver's polls are [`Memory::read_inbox`]: its own memory in
//!   FaRM's setting, a local read where the backend can make it one.
//!
//! The receiver publishes its head once it has processed a quarter of the
//! ring since it last did, and a message with its header takes at most
//! three eighths of it ([`max_payload`]): a sender that finds no room
//! needs at most twice a message's bytes (the rest of the ring it skips,
//! then the message), and what the receiver has processed but not yet
//! published is less than a quarter, so a receiver that has processed
//! everything has always published enough (FaRM's argument, with the
//! skipped end of the ring counted). A sender that finds the ring full
//! reads the head word again and, if there is still no room, is told
//! ([`RingError::Full`]): it pushes back instead of overwriting unprocessed
//! messages.
//!
//! Everything read from memory is checked: a garbled length, kind or head
//! word is an error or "no message yet", never a panic or an access outside
//! the ring.

use alloc::vec::Vec;
use core::fmt;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::value::Value;
use crate::{MemError, Memory, NodeId, Op, RemoteAddr};

/// Bytes of a message's header.
pub const HEADER: u64 = 24;
/// Smallest ring: room for messages of 24 bytes.
pub const MIN_RING: u64 = 128;
/// Positions are kept modulo 2^48 in head words.
const POS_MASK: u64 = (1 << 48) - 1;
const KIND_DATA: u8 = 1;
const KIND_WRAP: u8 = 2;
/// Seed of the messages' checksums ("SWRING").
const SEED: u64 = 0x5357_5249_4e47;

/// The largest payload a ring of `size` bytes carries: with its header at
/// most three eighths of the ring, so that a receiver that processed
/// everything always published room enough (see the module's text).
pub const fn max_payload(size: u64) -> u64 {
    (size / 8 * 3 - HEADER) & !7
}

/// Why a ring operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The memory operation failed.
    Mem(MemError),
    /// No room: the receiver has not processed enough (it is behind or gone).
    Full,
    /// A payload larger than the ring carries.
    TooLarge {
        /// Bytes given.
        len: u64,
        /// Bytes allowed.
        max: u64,
    },
    /// A head word that cannot be right (the receiver's, or garbage), on
    /// the ring's node.
    Corrupt(NodeId),
}

impl From<MemError> for RingError {
    fn from(e: MemError) -> Self {
        RingError::Mem(e)
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Mem(e) => write!(f, "{e}"),
            RingError::Full => write!(f, "the ring is full (its receiver is behind)"),
            RingError::TooLarge { len, max } => write!(f, "a message of {len} bytes; the ring carries {max}"),
            RingError::Corrupt(n) => write!(f, "{n}: a ring's head word cannot be right"),
        }
    }
}

/// Slots of a head line.
pub const HEAD_SLOTS: u64 = 8;

/// Where a ring is: its bytes, and the head line its receiver publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingAt {
    /// First byte of the ring (8-byte aligned).
    pub addr: RemoteAddr,
    /// Bytes in the ring: a multiple of 8, at least [`MIN_RING`].
    pub size: u64,
    /// The receiver's published head: [`HEAD_SLOTS`] words (8-byte aligned).
    pub head: RemoteAddr,
}

/// Which connection a message belongs to: the server's epoch and the
/// client's generation. Messages of any other connection are ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Link {
    /// The incarnation of the receiving (or sending) server.
    pub epoch: u16,
    /// The client's connection count.
    pub generation: u16,
}

impl Link {
    fn tag(self, seq: u32) -> u64 {
        (self.epoch as u64) << 48 | (self.generation as u64) << 32 | seq as u64
    }
}

/// The head slot a receiver publishes for `link` at `pos`.
fn head_word(link: Link, pos: u64) -> u64 {
    (link.generation as u64) << 48 | (pos & POS_MASK)
}

fn pad8(n: u64) -> u64 {
    n.next_multiple_of(8)
}

fn checksum(word0: u64, tag: u64, payload: &[u8]) -> u64 {
    xxh3_64_with_seed(payload, SEED ^ word0.rotate_left(17) ^ tag)
}

/// Appends a message's bytes (header, then the payload made of `parts`,
/// padded) to `out`.
fn encode(out: &mut Vec<u8>, kind: u8, tag: u64, parts: &[&[u8]]) {
    let start = out.len();
    out.resize(start + HEADER as usize, 0);
    for part in parts {
        out.extend_from_slice(part);
    }
    let len = (out.len() - start) as u64 - HEADER;
    let word0 = len | (kind as u64) << 32;
    let sum = checksum(word0, tag, &out[start + HEADER as usize..]);
    out[start..start + 8].copy_from_slice(&word0.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&tag.to_le_bytes());
    out[start + 16..start + 24].copy_from_slice(&sum.to_le_bytes());
    out.resize(start + (HEADER + pad8(len)) as usize, 0);
}

/// Position `pos`, or the start of the next lap if less than a header is
/// left before the end of the ring: both sides skip such a dead end as
/// soon as they reach it, so that a receiver's head never passes its
/// sender's tail.
fn skip_dead_end(pos: u64, size: u64) -> u64 {
    let rest = size - pos % size;
    if rest < HEADER { pos.wrapping_add(rest) } else { pos }
}

/// Where a message of `need` bytes goes from position `tail` in a ring of
/// `size` bytes: the bytes skipped first (0, or the rest of the ring), and
/// whether they hold a wrap marker.
fn placement(tail: u64, need: u64, size: u64) -> (u64, bool) {
    let off = tail % size;
    let rest = size - off;
    if rest < HEADER {
        (rest, false)
    } else if rest < need {
        (rest, true)
    } else {
        (0, false)
    }
}

/// The sending side of a ring.
#[derive(Clone, Debug)]
pub struct Producer {
    at: RingAt,
    link: Link,
    /// Position of the next message.
    tail: u64,
    seq: u32,
    /// The receiver's head as last read.
    head_seen: u64,
    /// Times a message went back to the start of the ring.
    wraps: u64,
    /// A message's bytes, reused.
    scratch: Vec<u8>,
}

impl Producer {
    /// A sender on a fresh connection `link` (positions and sequence
    /// numbers from 0).
    pub fn new(at: RingAt, link: Link) -> Producer {
        Producer { at, link, tail: 0, seq: 0, head_seen: 0, wraps: 0, scratch: Vec::new() }
    }

    /// The sequence number the next message will have.
    pub fn next_seq(&self) -> u32 {
        self.seq
    }

    /// The connection it sends on.
    pub fn link(&self) -> Link {
        self.link
    }

    /// Times a message went back to the start of the ring.
    pub fn wraps(&self) -> u64 {
        self.wraps
    }

    /// Bytes the next message of `len` bytes would need past the receiver's
    /// head as last seen (skipped bytes included).
    fn needs(&self, len: u64) -> (u64, bool, u64) {
        let need = HEADER + pad8(len);
        let (skip, marker) = placement(self.tail, need, self.at.size);
        let end = self.tail.wrapping_add(skip + need);
        (end, marker, skip)
    }

    fn fits(&self, end: u64) -> bool {
        (end.wrapping_sub(self.head_seen) & POS_MASK) <= self.at.size
    }

    /// Reads the receiver's head line again ([`Memory::read_inbox`]: in
    /// FaRM the receiver writes its head into the sender's memory) and takes
    /// the furthest head of this connection.
    async fn refresh<M: Memory>(&mut self, mem: &M) -> Result<(), RingError> {
        let corrupt = RingError::Corrupt(self.at.head.node);
        let buf = mem.read_inbox(self.at.head, 8 * HEAD_SLOTS as usize).await?;
        let mut furthest = 0;
        for slot in 0..HEAD_SLOTS as usize {
            let word = word_at(&buf, 8 * slot).ok_or(corrupt)?;
            if (word >> 48) as u16 != self.link.generation {
                // Not published on this connection.
                continue;
            }
            // A head lies between the last one seen and the tail (modulo
            // 2^48); one behind the last seen is an older publication, by
            // any amount (a slot may be many laps old); one past the tail
            // cannot be.
            let pos = word & POS_MASK;
            let ahead = pos.wrapping_sub(self.head_seen) & POS_MASK;
            let to_tail = self.tail.wrapping_sub(pos) & POS_MASK;
            if ahead <= self.at.size && to_tail <= self.at.size {
                furthest = furthest.max(ahead);
            } else if self.head_seen.wrapping_sub(pos) & POS_MASK > POS_MASK / 2 {
                return Err(corrupt);
            }
        }
        self.head_seen = self.head_seen.wrapping_add(furthest);
        Ok(())
    }

    /// Makes room for a message of the payload made of `parts` and lays
    /// out its bytes (and a wrap marker before it if needed) in `scratch`;
    /// returns the offsets to write them at.
    async fn prepare<M: Memory>(&mut self, mem: &M, parts: &[&[u8]]) -> Result<Placed, RingError> {
        let len = parts.iter().map(|p| p.len() as u64).sum::<u64>();
        let max = max_payload(self.at.size);
        if len > max {
            return Err(RingError::TooLarge { len, max });
        }
        let (end, marker, skip) = self.needs(len);
        if !self.fits(end) {
            self.refresh(mem).await?;
            if !self.fits(end) {
                return Err(RingError::Full);
            }
        }
        let tag = self.link.tag(self.seq);
        self.scratch.clear();
        let off = self.tail % self.at.size;
        let mut marker_at = None;
        if marker {
            encode(&mut self.scratch, KIND_WRAP, tag, &[]);
            marker_at = Some(off);
        }
        let msg_start = self.scratch.len();
        encode(&mut self.scratch, KIND_DATA, tag, parts);
        let msg_off = (off + skip) % self.at.size;
        Ok(Placed { marker_at, msg_start, msg_off, end })
    }

    fn ops<'a>(&'a self, p: &Placed) -> heapless::Vec<Op<'a>, 2> {
        let mut ops = heapless::Vec::new();
        let base = self.at.addr.offset;
        if let Some(m) = p.marker_at {
            let _ = ops.push(Op::Write { offset: base + m, data: &self.scratch[..p.msg_start] });
        }
        let _ = ops.push(Op::Write { offset: base + p.msg_off, data: &self.scratch[p.msg_start..] });
        ops
    }

    fn sent(&mut self, p: &Placed) {
        self.wraps += (p.msg_off == 0 && p.end != 0) as u64;
        self.tail = skip_dead_end(p.end, self.at.size);
        self.seq = self.seq.wrapping_add(1);
    }

    /// Sends the payload made of `parts` and waits until its write
    /// completed (one roundtrip, a wrap marker included). Its sequence
    /// number is [`Producer::next_seq`] before the call.
    pub async fn send<M: Memory>(&mut self, mem: &M, parts: &[&[u8]]) -> Result<(), RingError> {
        let p = self.prepare(mem, parts).await?;
        mem.pipeline(self.at.addr.node, &self.ops(&p)).await?;
        self.sent(&p);
        Ok(())
    }

    /// Sends the payload made of `parts` without waiting for its write
    /// ([`Memory::post_background`]): what a server does with its answers,
    /// so that answering one client never waits on the network before the
    /// next.
    pub async fn post<M: Memory>(&mut self, mem: &M, parts: &[&[u8]]) -> Result<(), RingError> {
        let p = self.prepare(mem, parts).await?;
        mem.post_background(self.at.addr.node, &self.ops(&p));
        self.sent(&p);
        Ok(())
    }
}

/// A message's bytes in the scratch buffer, and where they go.
struct Placed {
    marker_at: Option<u64>,
    msg_start: usize,
    msg_off: u64,
    end: u64,
}

/// The receiving side of a ring.
#[derive(Clone, Debug)]
pub struct Consumer {
    at: RingAt,
    link: Link,
    /// Position of the next message.
    head: u64,
    seq: u32,
    /// The head as last published.
    published: u64,
    /// Publications so far (the next one's slot is this modulo [`HEAD_SLOTS`]).
    publications: u64,
    /// The publication count when the ring last ran dry.
    dry_at: u64,
}

/// A message received: its sequence number, and its payload as a range of
/// the read buffer (no copy).
#[derive(Debug)]
pub struct Message<B> {
    /// Its sequence number on the connection.
    pub seq: u32,
    /// The buffer the payload was read into.
    pub buf: B,
    /// Where the payload is in it (checked against its length).
    pub range: core::ops::Range<usize>,
}

impl<B: core::ops::Deref<Target = [u8]>> Message<B> {
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        self.buf.get(self.range.clone()).unwrap_or(&[])
    }

    /// The payload from byte `skip` on, as a value.
    pub fn into_value(self, skip: usize) -> Value<B> {
        let start = (self.range.start + skip).min(self.range.end);
        Value::in_buf(self.buf, start..self.range.end)
    }
}

impl Consumer {
    /// A receiver on a fresh connection `link`.
    pub fn new(at: RingAt, link: Link) -> Consumer {
        Consumer { at, link, head: 0, seq: 0, published: 0, publications: 0, dry_at: 0 }
    }

    /// The sequence number of the next message.
    pub fn next_seq(&self) -> u32 {
        self.seq
    }

    /// Looks for the next message, reading up to `window` bytes at once
    /// (more in a second read for a longer message): `None` if it has not
    /// arrived whole yet. Reads are [`Memory::read_inbox`]. The first time
    /// it finds nothing after a publication, it publishes once more (see
    /// the module's text).
    pub async fn poll<M: Memory>(&mut self, mem: &M, window: u64) -> Result<Option<Message<M::Buf>>, RingError> {
        let found = self.next(mem, window).await?;
        if found.is_none() && self.dry_at != self.publications {
            self.post_head(mem);
            self.dry_at = self.publications;
        }
        Ok(found)
    }

    async fn next<M: Memory>(&mut self, mem: &M, window: u64) -> Result<Option<Message<M::Buf>>, RingError> {
        let size = self.at.size;
        // At most one wrap marker before the message.
        for _ in 0..2 {
            let off = self.head % size;
            let rest = size - off;
            if rest < HEADER {
                self.head = self.head.wrapping_add(rest);
                continue;
            }
            let first = window.clamp(HEADER, rest);
            let at = self.at.addr.checked_add(off).ok_or(RingError::Corrupt(self.at.addr.node))?;
            let buf = mem.read_inbox(at, first as usize).await?;
            let (Some(word0), Some(tag), Some(sum)) = (word_at(&buf, 0), word_at(&buf, 8), word_at(&buf, 16)) else {
                return Ok(None);
            };
            if tag != self.link.tag(self.seq) {
                return Ok(None);
            }
            let (len, kind) = (word0 & 0xffff_ffff, (word0 >> 32) as u8);
            if word0 >> 40 != 0 || len > max_payload(size) || HEADER + pad8(len) > rest {
                // Torn or garbled: not a message (yet).
                return Ok(None);
            }
            match kind {
                KIND_WRAP if len == 0 && sum == checksum(word0, tag, &[]) => {
                    self.head = self.head.wrapping_add(rest);
                    continue;
                }
                KIND_DATA => {}
                _ => return Ok(None),
            }
            let total = (HEADER + len) as usize;
            let buf = if buf.len() >= total { buf } else { mem.read_inbox(at, total).await? };
            let Some(payload) = buf.get(HEADER as usize..total) else { return Ok(None) };
            // Mutant `ring-unchecked`: trust the tag, as a receiver that
            // relied on the NIC writing in address order would.
            if checksum(word0, tag, payload) != sum && !mutant!("ring-unchecked") {
                return Ok(None);
            }
            let seq = self.seq;
            self.head = skip_dead_end(self.head.wrapping_add(HEADER + pad8(len)), size);
            self.seq = self.seq.wrapping_add(1);
            return Ok(Some(Message { seq, buf, range: HEADER as usize..total }));
        }
        Ok(None)
    }

    /// Publishes the head if a quarter of the ring was processed since the
    /// last time (in the background: the sender reads it only when it runs
    /// out of room). Call it after processing each message.
    pub fn publish<M: Memory>(&mut self, mem: &M) {
        if self.head.wrapping_sub(self.published) & POS_MASK >= self.at.size / 4 {
            self.post_head(mem);
        }
    }

    /// Posts the head into the next slot of the head line.
    fn post_head<M: Memory>(&mut self, mem: &M) {
        self.published = self.head;
        let slot = self.publications % HEAD_SLOTS;
        self.publications = self.publications.wrapping_add(1);
        let word = head_word(self.link, self.head).to_le_bytes();
        mem.post_background(self.at.head.node, &[Op::Write { offset: self.at.head.offset + 8 * slot, data: &word }]);
    }
}

#[cfg(test)]
mod tests;
