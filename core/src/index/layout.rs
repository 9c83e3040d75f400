//! The index's bytes on its memory node: the header, the bucket groups, the
//! 8-byte slot words and the key blocks they point to, and how a key picks
//! its candidate slots. Pure functions, no memory access: everything here is
//! unit-tested and every decoder takes untrusted bytes.

use core::ops::Deref;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::IndexError;
use crate::substrate::memory::word_at;
use crate::substrate::space::region::HEADER_SIZE as REGION_HEADER;
use crate::{NodeId, RemoteAddr};

/// "SWIDXRC1", little endian: the index header's magic word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SWIDXRC1");
/// Version of the layout below (2: slot words carry a check).
pub const VERSION: u64 = 2;
/// Bytes of the header; the bucket groups follow it.
pub const HEADER_BYTES: u64 = 64;
/// Slots in one bucket (a 64-byte cache line).
pub const SLOTS_PER_BUCKET: usize = 8;
/// Bytes of one bucket.
pub const BUCKET_BYTES: u64 = 64;
/// Bytes of one bucket group: main bucket 0, the shared overflow bucket, main bucket 1.
pub const GROUP_BYTES: u64 = 3 * BUCKET_BYTES;
/// Bytes of a combined bucket (a main bucket and its overflow, adjacent): one READ.
pub const COMBINED_BYTES: usize = 2 * BUCKET_BYTES as usize;
/// Most candidate slots of one key: two combined buckets.
pub const CANDIDATES: usize = 4 * SLOTS_PER_BUCKET;
/// Longest key the layout can describe (the slot's length field has 8 bits).
pub const MAX_KEY: usize = 255;
/// Key blocks are allocated in multiples of this, aligned to it.
pub const BLOCK_ALIGN: u64 = 64;
/// Bytes of a block around its key: header word, location word, checksum word.
pub const BLOCK_OVERHEAD: usize = 24;
/// Largest block (a key of [`MAX_KEY`] bytes, padded to a word).
pub const MAX_BLOCK: usize = BLOCK_OVERHEAD + MAX_KEY.div_ceil(8) * 8;
/// "SWIB": the low half of a block's header word.
pub const BLOCK_MAGIC: u32 = u32::from_le_bytes(*b"SWIB");

const FP_SHIFT: u32 = 56;
const LEN_SHIFT: u32 = 48;
/// The slot's tombstone bit: the key was removed; the pointer still names
/// its last block, so the slot stays dedicated to that key.
pub const TOMB: u64 = 1 << 47;
const CHECK_SHIFT: u32 = 39;
const PTR_MASK: u64 = (1 << CHECK_SHIFT) - 1;
/// Seed offset of the second hash function.
const SECOND_HASH: u64 = 0x9E37_79B9_7F4A_7C15;

/// What a slot word says, decoded.
///
/// ```text
/// bit 63..56  fingerprint (8 bits of the key's hash)
/// bit 55..48  key length in bytes
/// bit 47      tombstone
/// bit 46..39  check: 8 bits of a hash of the fingerprint, length and offset
/// bit 38..0   offset of the key block / 64 (nodes of up to 32 TiB)
/// ```
/// The word 0 is an empty slot that no key ever used. A word whose check
/// fails was garbled ([`SlotWord::is_sound`]): it matches no key, and a
/// lookup that meets one among its key's candidates and finds the key
/// nowhere else says the index is corrupt rather than that the key is not
/// there.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SlotWord(pub u64);

impl SlotWord {
    /// An empty, never-used slot.
    pub const EMPTY: SlotWord = SlotWord(0);

    /// The word for a block at `block` (a multiple of [`BLOCK_ALIGN`], not
    /// 0); `None` if the offset cannot be encoded.
    pub fn new(fp: u8, key_len: u8, block: u64, tomb: bool) -> Option<SlotWord> {
        if block == 0 || !block.is_multiple_of(BLOCK_ALIGN) || block / BLOCK_ALIGN > PTR_MASK {
            return None;
        }
        let t = if tomb { TOMB } else { 0 };
        let body = ((fp as u64) << FP_SHIFT) | ((key_len as u64) << LEN_SHIFT) | (block / BLOCK_ALIGN);
        Some(SlotWord(body | t | (check_of(body) << CHECK_SHIFT)))
    }

    /// Whether the word is empty or its check holds (the tombstone bit is
    /// outside the check: tombstoning is one bit set by CAS).
    pub fn is_sound(self) -> bool {
        let body = self.0 & !(TOMB | (0xFF << CHECK_SHIFT));
        self.0 == 0 || (self.0 >> CHECK_SHIFT) & 0xFF == check_of(body)
    }

    /// Whether the slot was never used.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the slot maps a key now.
    pub fn is_live(self) -> bool {
        self.0 != 0 && self.0 & TOMB == 0
    }

    /// Whether the slot holds a removed key's tombstone.
    pub fn is_tomb(self) -> bool {
        self.0 & TOMB != 0
    }

    /// The fingerprint.
    pub fn fp(self) -> u8 {
        (self.0 >> FP_SHIFT) as u8
    }

    /// The key length.
    pub fn key_len(self) -> usize {
        ((self.0 >> LEN_SHIFT) & 0xFF) as usize
    }

    /// The block's offset (0 if the pointer field is 0: a garbled word).
    pub fn block(self) -> u64 {
        (self.0 & PTR_MASK) * BLOCK_ALIGN
    }

    /// Whether the word is used (live or tomb) with this fingerprint and
    /// length, and sound.
    pub fn matches(self, kh: &KeyHash) -> bool {
        self.0 != 0 && self.fp() == kh.fp && self.key_len() == kh.len as usize && self.is_sound()
    }

    /// The same word with the tombstone bit set.
    pub fn tombstone(self) -> SlotWord {
        SlotWord(self.0 | TOMB)
    }
}

/// The check of a slot word's fingerprint, length and offset: 8 bits.
fn check_of(body: u64) -> u64 {
    body.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56
}

/// Bytes of the block of a key of `key_len` bytes.
pub const fn block_len(key_len: usize) -> usize {
    BLOCK_OVERHEAD + key_len.div_ceil(8) * 8
}

/// Bytes allocated for that block (a multiple of [`BLOCK_ALIGN`]).
pub const fn block_alloc(key_len: usize) -> u64 {
    (block_len(key_len) as u64).div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN
}

/// An encoded key block.
///
/// ```text
/// 0        header: "SWIB" | key length << 32
/// 8        location (u64, non-zero)
/// 16       key bytes, zero-padded to a word
/// len - 8  checksum: xxh3-64 of everything before it
/// ```
/// Blocks are written once, before the slot CAS that publishes them, and
/// never changed: an update or a removal publishes a new slot word instead.
#[derive(Clone, Copy)]
pub struct Block {
    bytes: [u8; MAX_BLOCK],
    len: usize,
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Block {
    /// The block for `key` (at most [`MAX_KEY`] bytes; longer keys are cut,
    /// so check first) and `location`.
    pub fn encode(key: &[u8], location: u64) -> Block {
        let key = &key[..key.len().min(MAX_KEY)];
        let len = block_len(key.len());
        let mut bytes = [0u8; MAX_BLOCK];
        let head = BLOCK_MAGIC as u64 | (key.len() as u64) << 32;
        bytes[..8].copy_from_slice(&head.to_le_bytes());
        bytes[8..16].copy_from_slice(&location.to_le_bytes());
        bytes[16..16 + key.len()].copy_from_slice(key);
        let sum = xxh3_64(&bytes[..len - 8]);
        bytes[len - 8..len].copy_from_slice(&sum.to_le_bytes());
        Block { bytes, len }
    }

    /// Decodes a block read for a key of `key_len` bytes: its location and
    /// key, or what is wrong with it.
    pub fn decode(bytes: &[u8], key_len: usize) -> Result<(u64, &[u8]), &'static str> {
        let len = block_len(key_len);
        let b = bytes.get(..len).ok_or("key block is truncated")?;
        let sum_at = len - 8;
        let head = word_at(b, 0).ok_or("key block is truncated")?;
        if head as u32 != BLOCK_MAGIC || (head >> 32) != key_len as u64 {
            return Err("key block has a bad header");
        }
        if word_at(b, sum_at) != Some(xxh3_64(&b[..sum_at])) {
            return Err("key block fails its checksum");
        }
        let location = word_at(b, 8).ok_or("key block is truncated")?;
        if location == 0 {
            return Err("key block holds location 0");
        }
        let key = b.get(16..16 + key_len).ok_or("key block is truncated")?;
        Ok((location, key))
    }
}

/// How a key is placed: its fingerprint, length and two main buckets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct KeyHash {
    /// 8 bits of the key's hash, kept in the slot to skip other keys' blocks.
    pub fp: u8,
    /// The key's length.
    pub len: u8,
    /// The two main buckets (of `2 × groups`), different from each other.
    pub mains: [u64; 2],
}

/// One candidate slot of a key, in the order inserts try them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Candidate {
    /// The slot's offset on the node.
    pub offset: u64,
    /// Which of the two combined-bucket reads holds it.
    pub read: u8,
    /// Its byte offset within that read.
    pub at: u8,
}

/// The geometry of one index, as read from its header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Geometry {
    /// The node that holds it.
    pub node: NodeId,
    /// Offset of the header.
    pub header: u64,
    /// Number of bucket groups (each: 2 main buckets and 1 overflow bucket).
    pub groups: u64,
    /// Longest key.
    pub max_key: usize,
    /// Seed of the key hash.
    pub seed: u64,
    /// Bytes in the node's region (every pointer must stay below it).
    pub region_size: u64,
}

impl Geometry {
    /// Bytes the index takes for `groups` groups (header included).
    pub fn bytes(groups: u64) -> Option<u64> {
        groups.checked_mul(GROUP_BYTES)?.checked_add(HEADER_BYTES)
    }

    /// Offset of the first bucket group.
    pub fn buckets(&self) -> u64 {
        self.header + HEADER_BYTES
    }

    /// Number of slots.
    pub fn slots(&self) -> u64 {
        self.groups * 3 * SLOTS_PER_BUCKET as u64
    }

    /// The header's 64 bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES as usize] {
        let mut b = [0u8; HEADER_BYTES as usize];
        let words = [MAGIC, VERSION, self.groups, self.max_key as u64, self.seed, self.buckets(), self.region_size];
        for (i, w) in words.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let sum = xxh3_64(&b[..56]);
        b[56..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Validates a header read at `header` on `node`, whose region has
    /// `region_size` bytes.
    pub fn decode(node: NodeId, header: u64, b: &[u8], region_size: u64) -> Result<Geometry, IndexError> {
        let corrupt = |what| IndexError::Corrupt { node, what };
        let word = |at| word_at(b, at).ok_or(corrupt("index header is truncated"));
        if word(0)? != MAGIC {
            return Err(corrupt("index header has a bad magic word"));
        }
        if word(8)? != VERSION {
            return Err(corrupt("index header has an unknown version"));
        }
        let sum = xxh3_64(b.get(..56).ok_or(corrupt("index header is truncated"))?);
        if word(56)? != sum {
            return Err(corrupt("index header fails its checksum"));
        }
        let (groups, max_key, seed, buckets, size) = (word(16)?, word(24)?, word(32)?, word(40)?, word(48)?);
        let end = Geometry::bytes(groups).and_then(|n| header.checked_add(n));
        if groups == 0 || max_key > MAX_KEY as u64 || size != region_size || end.is_none_or(|e| e > region_size) {
            return Err(corrupt("index header has an impossible geometry"));
        }
        if header < REGION_HEADER || buckets != header + HEADER_BYTES {
            return Err(corrupt("index header is misplaced"));
        }
        Ok(Geometry { node, header, groups, max_key: max_key as usize, seed, region_size })
    }

    /// The fingerprint, length and main buckets of `key` (at most
    /// [`MAX_KEY`] bytes).
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        let h1 = xxh3_64_with_seed(key, self.seed);
        let h2 = xxh3_64_with_seed(key, self.seed ^ SECOND_HASH);
        let mains = 2 * self.groups;
        let m1 = h1 % mains;
        let mut m2 = h2 % mains;
        if m2 == m1 {
            // The other main bucket of the same group: the key still has two.
            m2 = m1 ^ 1;
        }
        KeyHash { fp: ((h1 ^ h2) >> 56) as u8, len: key.len().min(MAX_KEY) as u8, mains: [m1, m2] }
    }

    /// Offset of the combined bucket of main bucket `main`: main bucket 0 of
    /// a group with the overflow after it, or the overflow with main bucket
    /// 1 after it.
    pub fn combined(&self, main: u64) -> u64 {
        self.buckets() + (main / 2) * GROUP_BYTES + (main % 2) * BUCKET_BYTES
    }

    /// The key's candidate slots in the order inserts try them: the slots
    /// of its two main buckets interleaved (first bucket's slot 0, second
    /// bucket's slot 0, first bucket's slot 1, ...), then those of the two
    /// overflow buckets interleaved the same way; a slot two buckets share
    /// is listed once. Taking the first free slot in this order fills the
    /// less loaded main bucket first, and a key's order never depends on
    /// what the buckets hold: that is what keeps concurrent inserts of one
    /// key from taking two slots (see the module documentation).
    pub fn candidates(&self, kh: &KeyHash) -> heapless::Vec<Candidate, CANDIDATES> {
        let mut out: heapless::Vec<Candidate, CANDIDATES> = heapless::Vec::new();
        // Byte offset of the main and of the overflow bucket within each read.
        let part = |main: u64, overflow: bool| -> u8 {
            let main_first = main.is_multiple_of(2);
            if main_first == overflow { BUCKET_BYTES as u8 } else { 0 }
        };
        for overflow in [false, true] {
            for s in 0..SLOTS_PER_BUCKET {
                for (r, &main) in kh.mains.iter().enumerate() {
                    let at = part(main, overflow) + (s * 8) as u8;
                    let offset = self.combined(main) + at as u64;
                    if out.iter().all(|c| c.offset != offset) {
                        // Cannot fail: at most CANDIDATES distinct slots.
                        let _ = out.push(Candidate { offset, read: r as u8, at });
                    }
                }
            }
        }
        out
    }

    /// Whether `offset` is one of the slots of this index.
    pub fn is_slot(&self, offset: u64) -> bool {
        offset >= self.buckets()
            && offset.is_multiple_of(8)
            && (offset - self.buckets()) / GROUP_BYTES < self.groups
            && offset.checked_add(8).is_some_and(|e| e <= self.region_size)
    }

    /// Where the block of a key of `key_len` bytes that `w` points to lies,
    /// if that is a place a block can be: after the region header, inside
    /// the region, and not inside this index.
    pub fn block_addr(&self, w: SlotWord, key_len: usize) -> Option<RemoteAddr> {
        let at = w.block();
        let end = at.checked_add(block_len(key_len) as u64)?;
        let index_end = self.header + Geometry::bytes(self.groups)?;
        let outside_index = end <= self.header || at >= index_end;
        (at >= REGION_HEADER && end <= self.region_size && outside_index).then_some(RemoteAddr::new(self.node, at))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn geo(groups: u64) -> Geometry {
        Geometry { node: NodeId(0), header: 8192, groups, max_key: 64, seed: 7, region_size: 1 << 20 }
    }

    #[test]
    fn slot_words_round_trip() {
        let w = SlotWord::new(0xAB, 24, 4096 * 3 + 64, false).unwrap();
        assert_eq!((w.fp(), w.key_len(), w.block(), w.is_live(), w.is_tomb()), (0xAB, 24, 4096 * 3 + 64, true, false));
        let t = w.tombstone();
        assert_eq!((t.fp(), t.key_len(), t.block(), t.is_live(), t.is_tomb()), (0xAB, 24, 4096 * 3 + 64, false, true));
        assert!(!SlotWord::EMPTY.is_live() && SlotWord::EMPTY.is_empty());
        assert_eq!(SlotWord::new(0, 0, 0, false), None, "a zero pointer would read as an empty slot");
        assert_eq!(SlotWord::new(0, 0, 65, false), None);
        assert_eq!(SlotWord::new(0, 0, !63, false), None);
        // A word with every field zero but the fingerprint is still non-empty.
        assert!(SlotWord::new(0, 0, 64, false).unwrap().0 != 0);
    }

    #[test]
    fn blocks_round_trip_and_reject_garbage() {
        for len in [0usize, 1, 7, 8, 24, 64, MAX_KEY] {
            let key: heapless::Vec<u8, MAX_KEY> = (0..len).map(|i| i as u8).collect();
            let b = Block::encode(&key, 42);
            assert_eq!(b.len(), block_len(len));
            assert!(b.len() as u64 <= block_alloc(len));
            assert_eq!(Block::decode(&b, len), Ok((42, &key[..])));
            assert!(Block::decode(&b[..b.len() - 1], len).is_err());
            assert!(Block::decode(&b, len + 1).is_err());
            let mut bad = b;
            bad.bytes[16 + len / 2] ^= 1;
            assert!(Block::decode(&bad, len).is_err(), "a flipped bit fails the checksum");
        }
        assert_eq!(Block::decode(&Block::encode(b"k", 0), 1), Err("key block holds location 0"));
        assert_eq!(block_alloc(40), 64);
        assert_eq!(block_alloc(41), 128);
    }

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let g = geo(10);
        let b = g.encode();
        assert_eq!(Geometry::decode(NodeId(0), 8192, &b, 1 << 20), Ok(g));
        assert!(Geometry::decode(NodeId(0), 8192, &b, 1 << 19).is_err(), "another region size");
        assert!(Geometry::decode(NodeId(0), 4096, &b, 1 << 20).is_err(), "read at another place");
        assert!(Geometry::decode(NodeId(0), 8192, &b[..63], 1 << 20).is_err());
        for i in 0..64 {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert!(Geometry::decode(NodeId(0), 8192, &bad, 1 << 20).is_err(), "byte {i}");
        }
        let huge = Geometry { groups: u64::MAX / 2, ..g };
        assert!(Geometry::decode(NodeId(0), 8192, &huge.encode(), 1 << 20).is_err());
    }

    #[test]
    fn candidates_interleave_mains_then_overflows() {
        let g = geo(4);
        let kh = KeyHash { fp: 1, len: 3, mains: [0, 5] };
        let c = g.candidates(&kh);
        assert_eq!(c.len(), 32);
        // Main bucket 0 = group 0's first bucket; main bucket 5 = group 2's last.
        let (b0, b5) = (g.buckets(), g.buckets() + 2 * GROUP_BYTES + 2 * BUCKET_BYTES);
        assert_eq!(c[0].offset, b0);
        assert_eq!(c[1].offset, b5);
        assert_eq!(c[2].offset, b0 + 8);
        assert_eq!(c[16].offset, b0 + BUCKET_BYTES, "group 0's overflow");
        assert_eq!(c[17].offset, b5 - BUCKET_BYTES, "group 2's overflow");
        for x in c.iter() {
            assert!(g.is_slot(x.offset));
            let read = g.combined(kh.mains[x.read as usize]);
            assert_eq!(read + x.at as u64, x.offset);
            assert!((x.at as usize) < COMBINED_BYTES);
        }
        // The two mains of one group share their overflow: 24 slots.
        let c = g.candidates(&KeyHash { fp: 1, len: 3, mains: [3, 2] });
        assert_eq!(c.len(), 24);
    }

    #[test]
    fn block_addresses_stay_in_the_region_and_out_of_the_index() {
        let g = geo(4);
        let end = g.header + Geometry::bytes(4).unwrap();
        let w = |off| SlotWord::new(1, 8, off, false).unwrap();
        assert!(g.block_addr(w(4096), 8).is_some());
        assert!(g.block_addr(w(64), 8).is_none(), "inside the region header");
        assert!(g.block_addr(w(8192), 8).is_none(), "inside the index");
        assert!(g.block_addr(w(end.next_multiple_of(64)), 8).is_some());
        assert!(g.block_addr(w((1 << 20) - 64), 8).is_some());
        assert!(g.block_addr(w((1 << 20) - 64), 64).is_none(), "runs past the region");
        assert!(g.block_addr(SlotWord(1 << 60), 8).is_none(), "zero pointer");
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), len in 0usize..300,
                                word in any::<u64>(), header in any::<u64>(), size in any::<u64>()) {
            let _ = Block::decode(&bytes, len);
            let _ = Geometry::decode(NodeId(1), header, &bytes, size);
            let g = geo(3);
            let w = SlotWord(word);
            let _ = (w.fp(), w.key_len(), w.block(), w.is_live(), w.is_tomb());
            let _ = g.block_addr(w, len);
            let _ = g.is_slot(word);
        }

        #[test]
        fn every_key_has_distinct_candidates_in_its_buckets(key in proptest::collection::vec(any::<u8>(), 0..80),
                                                             groups in 1u64..50, seed in any::<u64>()) {
            let g = Geometry { seed, ..geo(groups) };
            let kh = g.hash(&key);
            prop_assert!(kh.mains[0] != kh.mains[1]);
            prop_assert!(kh.mains.iter().all(|&m| m < 2 * groups));
            let c = g.candidates(&kh);
            prop_assert!(c.len() == 24 || c.len() == 32);
            prop_assert!(c.iter().all(|x| g.is_slot(x.offset)));
            for (i, x) in c.iter().enumerate() {
                prop_assert!(c[..i].iter().all(|y| y.offset != x.offset));
            }
        }
    }
}
