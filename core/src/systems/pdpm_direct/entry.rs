//! A key's entry on one replica node: pDPM §4.1's committed space and
//! uncommitted (redo) space, pre-assigned when the key is created and
//! fixed until it is deleted, behind a header that names every replica of
//! the key.
//!
//! ```text
//! object      header (128) | committed space | redo space
//! header      magic "PDPMENT1" | tag (the key's hash) | replicas (1) | this replica (1)
//!             | 0 (2) | max value (4) | nodes: 8 × u16 | bases: 8 × u64 | xxh3 of bytes 0..104 | 0…
//! space       word 0 | sum | version | len (32 bits) + deleted (bit 32) | value (max value, padded to 8)
//! ```
//!
//! Word 0 of the primary's committed space is the key's lock
//! ([`super::lock`]); word 0 of every other space is never used. Writes
//! of a payload start at word 1, so that no WRITE ever touches a lock word
//! (issue #22, item 7: the lock is changed only by CAS).
//!
//! The payload's *sum* is xxHash3 of its version, length word and value,
//! seeded by the key's hash (the paper's CRC; the toolkit's checksums are
//! xxHash3, as RAW's): a read that met a write in progress (the paper's
//! "incomplete read"), a space never written, a garbled one and another
//! key's all fail it. The *version* orders a key's payloads: each holder of
//! the lock writes one above every version its primary holds, so a redo
//! copy newer than the committed one is a write that did not finish.
//!
//! Everything is decoded as untrusted input: lengths and addresses are
//! bounds-checked, and garbage decodes to `None`, never a panic.

use alloc::vec::Vec;
use core::ops::Range;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::substrate::memory::word_at;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::{NodeId, RemoteAddr};

/// "PDPMENT1".
const MAGIC: u64 = u64::from_le_bytes(*b"PDPMENT1");
/// Bytes of the header.
pub const HEADER: u64 = 128;
/// Bytes of the header that its checksum covers.
const SUMMED: usize = 104;
/// Bytes of a space before its value: word 0, sum, version, length.
pub const SPACE_HEAD: u64 = 32;
/// Where a payload starts in its space (after word 0).
pub const PAYLOAD_AT: u64 = 8;
/// Bit of the length word that marks a deletion (a tombstone's payload).
const DELETED: u64 = 1 << 32;
/// A base that names no object: the replica an insert could not allocate
/// (its node was down). Every write to it is skipped (and would fail the
/// node's bounds check: it lies beyond any region).
pub const NO_REPLICA: u64 = 1 << 62;
/// Seeds the sum apart from other checksums of the same key.
const SALT: u64 = 0x5044_504d;

/// The shape of a store's entries: sizes follow its largest value, fixed
/// when the store is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Largest value, bytes.
    pub max_value: u64,
}

impl Shape {
    /// Bytes of one space: head and value, padded to a word.
    pub fn space(&self) -> u64 {
        SPACE_HEAD + self.max_value.next_multiple_of(8)
    }

    /// Bytes of one replica's object: header and both spaces.
    pub fn object(&self) -> u64 {
        HEADER + 2 * self.space()
    }

    /// Offset of the committed space in an object (its word 0 is the lock
    /// on the primary).
    pub fn committed(&self) -> u64 {
        HEADER
    }

    /// Offset of the redo space in an object.
    pub fn redo(&self) -> u64 {
        HEADER + self.space()
    }
}

/// Where the replicas of a key are: the objects its header names, the
/// primary first (it holds the lock and answers reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// Object of each replica; [`NO_REPLICA`] bases for those left out.
    pub replicas: heapless::Vec<RemoteAddr, MAX_REPLICAS>,
}

impl Place {
    /// The primary's object.
    pub fn primary(&self) -> RemoteAddr {
        self.replicas[0]
    }
}

/// Encodes the header of replica `this` of a key whose hash is `tag`.
pub fn header(place: &Place, this: usize, tag: u64, shape: Shape) -> [u8; HEADER as usize] {
    let mut b = [0u8; HEADER as usize];
    b[..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&tag.to_le_bytes());
    b[16] = place.replicas.len() as u8;
    b[17] = this as u8;
    b[20..24].copy_from_slice(&(shape.max_value as u32).to_le_bytes());
    for (i, r) in place.replicas.iter().enumerate() {
        b[24 + 2 * i..26 + 2 * i].copy_from_slice(&r.node.0.to_le_bytes());
        b[40 + 8 * i..48 + 8 * i].copy_from_slice(&r.offset.to_le_bytes());
    }
    let sum = xxh3_64(&b[..SUMMED]);
    b[SUMMED..SUMMED + 8].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Decodes the header at the start of `b`, read from the object at `at`,
/// for the key whose hash is `tag` in a store of `shape` on `nodes` nodes:
/// the key's place, if the header is intact, is the key's, belongs to a
/// primary, and that primary is `at` (a header copied from elsewhere, or
/// a location pointing at a backup, is refused).
pub fn decode_header(b: &[u8], at: RemoteAddr, tag: u64, shape: Shape, nodes: usize) -> Option<Place> {
    let b = b.get(..HEADER as usize)?;
    if word_at(b, 0)? != MAGIC || word_at(b, SUMMED)? != xxh3_64(&b[..SUMMED]) || word_at(b, 8)? != tag {
        return None;
    }
    let (n, this) = (b[16] as usize, b[17]);
    let max_value = u32::from_le_bytes(b[20..24].try_into().ok()?) as u64;
    if n == 0 || n > MAX_REPLICAS || this != 0 || max_value != shape.max_value {
        return None;
    }
    let mut replicas = heapless::Vec::new();
    for i in 0..n {
        let node = u16::from_le_bytes(b[24 + 2 * i..26 + 2 * i].try_into().ok()?);
        let base = word_at(b, 40 + 8 * i)?;
        let real = base != NO_REPLICA;
        if node as usize >= nodes || !base.is_multiple_of(8) || (real && base.checked_add(shape.object()).is_none()) {
            return None;
        }
        // The primary always has its object.
        if i == 0 && !real {
            return None;
        }
        replicas.push(RemoteAddr::new(NodeId(node), base)).ok()?;
    }
    (replicas[0] == at).then_some(Place { replicas })
}

/// What a payload says, decoded from a space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    /// Its version (1 for a key's first value).
    pub version: u64,
    /// A deletion (no value).
    pub deleted: bool,
    /// Where its value is in the space's bytes.
    pub value: Range<usize>,
}

/// Encodes the payload of version `version`: `value`, or a deletion
/// (`None`). Written at [`PAYLOAD_AT`] of a space.
pub fn encode(version: u64, value: Option<&[u8]>, tag: u64) -> Vec<u8> {
    let v = value.unwrap_or(&[]);
    let len = v.len() as u64 | if value.is_none() { DELETED } else { 0 };
    let mut b = Vec::with_capacity(24 + v.len());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(v);
    let sum = xxh3_64_with_seed(&b[8..], tag ^ SALT);
    b[..8].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Decodes the payload of a space whose bytes (from its word 0) are
/// `space`: `None` if it is not whole (torn by a write in progress, never
/// written, garbled or another key's).
pub fn decode(space: &[u8], shape: Shape, tag: u64) -> Option<Payload> {
    let (sum, version, len) = (word_at(space, 8)?, word_at(space, 16)?, word_at(space, 24)?);
    let deleted = len & DELETED != 0;
    let n = len & !DELETED;
    if version == 0 || len >> 33 != 0 || n > shape.max_value || (deleted && n != 0) {
        return None;
    }
    let end = SPACE_HEAD as usize + n as usize;
    let summed = space.get(16..end)?;
    (xxh3_64_with_seed(summed, tag ^ SALT) == sum).then_some(Payload { version, deleted, value: 32..end })
}

/// The bytes a payload was written with (from [`PAYLOAD_AT`] of its
/// space): what a replay writes again, unchanged.
pub fn payload_bytes<'a>(space: &'a [u8], p: &Payload) -> Option<&'a [u8]> {
    space.get(PAYLOAD_AT as usize..p.value.end)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SHAPE: Shape = Shape { max_value: 100 };

    fn place(n: usize) -> Place {
        Place { replicas: (0..n).map(|i| RemoteAddr::new(NodeId(i as u16), 4096 + 512 * i as u64)).collect() }
    }

    /// A space holding `payload` (as written at word 1), `len` bytes long.
    fn space_with(payload: &[u8]) -> Vec<u8> {
        let mut s = alloc::vec![0u8; SHAPE.space() as usize];
        s[8..8 + payload.len()].copy_from_slice(payload);
        s
    }

    #[test]
    fn sizes_follow_the_largest_value() {
        assert_eq!(SHAPE.space(), 32 + 104);
        assert_eq!(SHAPE.object(), 128 + 2 * 136);
        assert_eq!((SHAPE.committed(), SHAPE.redo()), (128, 128 + 136));
    }

    #[test]
    fn headers_read_back_and_refuse_what_is_not_the_keys_primary() {
        for n in [1, 3, 5, 7] {
            let p = place(n);
            let h = header(&p, 0, 7, SHAPE);
            assert_eq!(decode_header(&h, p.primary(), 7, SHAPE, 8), Some(p.clone()));
            assert_eq!(decode_header(&h, p.primary(), 8, SHAPE, 8), None, "another key's");
            assert_eq!(decode_header(&h, p.replicas[n - 1], 7, SHAPE, 8).filter(|_| n > 1), None, "elsewhere");
            assert_eq!(decode_header(&h, p.primary(), 7, Shape { max_value: 64 }, 8), None, "another shape");
            assert_eq!(decode_header(&h, p.primary(), 7, SHAPE, n - 1), None, "a node the cluster lacks");
            assert_eq!(decode_header(&header(&p, 1, 7, SHAPE), p.primary(), 7, SHAPE, 8), None, "a backup's");
        }
        let mut p = place(3);
        p.replicas[2].offset = NO_REPLICA;
        let h = header(&p, 0, 7, SHAPE);
        assert_eq!(decode_header(&h, p.primary(), 7, SHAPE, 8), Some(p.clone()), "a replica left out");
        p.replicas[0].offset = NO_REPLICA;
        assert_eq!(decode_header(&header(&p, 0, 7, SHAPE), p.primary(), 7, SHAPE, 8), None, "no primary object");
    }

    #[test]
    fn payloads_read_back_and_tell_deletions() {
        let s = space_with(&encode(3, Some(b"hello"), 9));
        let p = decode(&s, SHAPE, 9).unwrap();
        assert_eq!((p.version, p.deleted, &s[p.value.clone()]), (3, false, &b"hello"[..]));
        assert_eq!(payload_bytes(&s, &p), Some(&encode(3, Some(b"hello"), 9)[..]));
        let s = space_with(&encode(4, None, 9));
        let p = decode(&s, SHAPE, 9).unwrap();
        assert_eq!((p.version, p.deleted, p.value.len()), (4, true, 0));
        let s = space_with(&encode(5, Some(&[]), 9));
        assert!(!decode(&s, SHAPE, 9).unwrap().deleted, "an empty value is not a deletion");
        assert_eq!(decode(&space_with(&encode(3, Some(b"hello"), 9)), SHAPE, 10), None, "another key's");
        assert_eq!(decode(&space_with(&[]), SHAPE, 9), None, "never written");
        assert_eq!(decode(&space_with(&encode(3, Some(&[1; 100]), 9)), SHAPE, 9).map(|p| p.value.len()), Some(100));
    }

    /// A space with a write in progress holds the first bytes of the new
    /// payload and the rest of the old one: never a payload.
    #[test]
    fn a_torn_space_is_no_payload() {
        let old = encode(3, Some(&[1; 60]), 9);
        let new = encode(4, Some(&[2; 60]), 9);
        for cut in 1..old.len() {
            let mut torn = old.clone();
            torn[..cut].copy_from_slice(&new[..cut]);
            let s = space_with(&torn);
            assert_eq!(decode(&s, SHAPE, 9), None, "cut at {cut}");
        }
    }

    proptest! {
        /// Any flipped bit of a payload or header is caught.
        #[test]
        fn a_flipped_bit_is_caught(at in 0usize..84, bit in 0u8..8, hat in 0usize..SUMMED + 8) {
            let mut b = encode(7, Some(&[5; 60]), 11);
            b[at] ^= 1 << bit;
            prop_assert_eq!(decode(&space_with(&b), SHAPE, 11), None);
            let p = place(3);
            let mut h = header(&p, 0, 11, SHAPE);
            h[hat] ^= 1 << bit;
            prop_assert_eq!(decode_header(&h, p.primary(), 11, SHAPE, 8), None);
        }

        /// Garbage decodes to nothing or something bounded, never a panic.
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400), nodes in 0usize..10) {
            if let Some(p) = decode(&b, SHAPE, 0) {
                prop_assert!(p.value.end <= b.len() && p.value.len() as u64 <= SHAPE.max_value);
            }
            let at = RemoteAddr::new(NodeId(0), 0);
            if let Some(p) = decode_header(&b, at, word_at(&b, 8).unwrap_or(0), SHAPE, nodes) {
                prop_assert!(p.replicas.iter().all(|r| (r.node.0 as usize) < nodes));
            }
        }
    }
}
