//! A Clover data buffer (pDPM §5): one version of one key, written once,
//! out of place, before it is linked into the key's chain; never written
//! again after (its header word aside, [`super::header`]).
//!
//! ```text
//! word 0   header: what comes next in the chain (changed by CAS only)
//! word 1   magic (16) | key length (8) | GC version (8) | value length (32)
//! word 2   sum: xxh3 of word 1, the key and the value, seeded by the key
//! key | value, padded to a word
//! ```
//!
//! The sum is seeded with the key's hash and covers the key's bytes, so a
//! buffer of another key (a garbled pointer, or a buffer recycled for
//! another key) never passes for this key's: a read of key 18 never
//! returns key 19's value. It covers the GC version too (the metadata
//! server's count of the buffer's hand-outs, [`super::header`]), and a
//! tail's header word must carry the same one: a READ torn between two
//! incarnations of a recycled buffer (the old bytes and the new owner's)
//! decodes to `None`, and a whole one says which incarnation it is. Every
//! length is checked against the read and the store's limits before it is
//! used: garbage decodes to `None`, never a panic.

use alloc::vec::Vec;
use core::ops::Range;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::header::{self, Next};
use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::space::slab::class_of;

const MAGIC: u64 = 0xC10E;
/// Bytes before the key.
pub const HEAD: usize = 24;
const SALT: u64 = 0x436c_6f76_6572_4246;

/// Bytes of a version of a key of `key` bytes and a value of `value`
/// bytes (its buffer is the slab object of the class that holds them,
/// [`class`]).
pub fn size(key: usize, value: usize) -> usize {
    (HEAD + key + value).next_multiple_of(8)
}

/// The size class of the buffer of a version of a key of `key` bytes and
/// a value of `value` bytes; `None` if a link cannot name one that large
/// ([`header::CLASSES`]).
pub fn class(key: usize, value: usize) -> Option<u8> {
    class_of(size(key, value) as u64).map(|(c, _)| c as u8).filter(|&c| (c as usize) < header::CLASSES)
}

fn sum(meta: u64, key: &[u8], value: &[u8], tag: u64) -> u64 {
    let mut b = Vec::with_capacity(8 + key.len() + value.len());
    b.extend_from_slice(&meta.to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    xxh3_64_with_seed(&b, tag ^ SALT)
}

/// The bytes of a fresh version of `key` (hash `tag`) holding `value`, in
/// a buffer of GC version `gc`: the chain's tail (its header the key's
/// tail word).
pub fn encode(key: &[u8], value: &[u8], tag: u64, gc: u8) -> Vec<u8> {
    let meta = MAGIC | (key.len() as u64) << 16 | (gc as u64) << 24 | (value.len() as u64) << 32;
    let mut b = Vec::with_capacity(size(key.len(), value.len()));
    b.extend_from_slice(&header::tail(tag, gc).to_le_bytes());
    b.extend_from_slice(&meta.to_le_bytes());
    b.extend_from_slice(&sum(meta, key, value, tag).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b.resize(b.len().next_multiple_of(8), 0);
    b
}

/// A version as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// What comes after it in the chain, when it was read.
    pub next: Next,
    /// The buffer's GC version (which incarnation of it was read).
    pub gc: u8,
    /// Where its value is in the bytes read.
    pub value: Range<usize>,
}

/// Reads a buffer of `key` (hash `tag`) from bytes `b` read at its start,
/// on a cluster of `nodes` nodes, with values of at most `max_value`
/// bytes; `None` if it is not a whole version of this key (a tail whose
/// header word has another GC version than its meta word: a READ torn
/// between two incarnations).
pub fn decode(b: &[u8], key: &[u8], tag: u64, nodes: usize, max_value: usize) -> Option<Version> {
    let next = header::decode(word_at(b, 0)?, tag, nodes)?;
    let meta = word_at(b, 8)?;
    let (klen, gc, vlen) = ((meta >> 16) as u8 as usize, (meta >> 24) as u8, (meta >> 32) as usize);
    if meta & 0xffff != MAGIC || klen != key.len() || vlen > max_value {
        return None;
    }
    if let Next::Tail(own) | Next::Deleted(own) = next
        && own != gc
    {
        return None;
    }
    let value = HEAD + klen..HEAD + klen + vlen;
    if b.get(HEAD..HEAD + klen)? != key || word_at(b, 16)? != sum(meta, key, b.get(value.clone())?, tag) {
        return None;
    }
    Some(Version { next, gc, value })
}

/// Whether a buffer's meta word (its second) is that of a version
/// written in its incarnation `gc`: one handed out at `gc` and never
/// written still has its earlier incarnation's word, or zeros.
pub fn holds_version(meta: u64, gc: u8) -> bool {
    meta & 0xffff == MAGIC && (meta >> 24) as u8 == gc
}

/// Reads incarnation `gc` of a buffer of `key`, as a cursor (or a link)
/// that expects it: as [`decode`], and `None` if the bytes are whole but
/// of another incarnation (the buffer was recycled since the cursor was
/// taken: they may be a version not linked yet, [`super`]'s "With garbage
/// collection").
pub fn decode_incarnation(b: &[u8], key: &[u8], tag: u64, gc: u8, nodes: usize, max_value: usize) -> Option<Version> {
    // Mutant `clover-no-gcver`: the reader takes whatever incarnation of
    // the buffer it finds.
    decode(b, key, tag, nodes, max_value).filter(|v| v.gc == gc || mutant!("clover-no-gcver"))
}

#[cfg(test)]
mod tests {
    use super::header::Cursor;
    use super::*;
    use crate::kv::place::key_hash;
    use crate::{NodeId, RemoteAddr};
    use proptest::prelude::*;

    #[test]
    fn a_buffer_reads_back_for_its_key_only() {
        let (k, v) = (&b"key18"[..], &b"value of 18"[..]);
        let b = encode(k, v, key_hash(k), 4);
        let got = decode(&b, k, key_hash(k), 3, 64).unwrap();
        assert_eq!((got.next, got.gc, &b[got.value]), (Next::Tail(4), 4, v));
        assert_eq!(decode(&b, b"key19", key_hash(b"key19"), 3, 64), None, "another key's buffer");
        assert_eq!(decode(&b, k, key_hash(k), 3, 4), None, "longer than values may be");
        assert_eq!(decode(&b[..b.len() - 8], k, key_hash(k), 3, 64), None, "cut short");
        for i in 0..b.len() * 8 {
            let mut g = b.clone();
            g[i / 8] ^= 1 << (i % 8);
            if i / 8 < HEAD + k.len() + v.len() {
                assert_eq!(decode(&g, k, key_hash(k), 3, 64), None, "bit {i}");
            }
        }
        let mut linked = b.clone();
        let next = Next::Link(Cursor::new(RemoteAddr::new(NodeId(2), 640), 7, 1));
        linked[..8].copy_from_slice(&next.word(key_hash(k)).to_le_bytes());
        assert_eq!(decode(&linked, k, key_hash(k), 3, 64).map(|v| (v.next, v.gc)), Some((next, 4)));
        // Torn between incarnations: the new owner's tail word over the old bytes.
        let mut torn = b.clone();
        torn[..8].copy_from_slice(&header::tail(key_hash(k), 5).to_le_bytes());
        assert_eq!(decode(&torn, k, key_hash(k), 3, 64), None, "a tail word of another GC version");
        assert!(size(16, 256) >= encode(&[1; 16], &[2; 256], 5, 0).len());
        assert_eq!(class(5, 11), Some(0), "40 bytes: one line");
        assert_eq!(class(16, 1000), Some(class_of(1040).unwrap().0 as u8), "1,040 bytes: 1,280");
        assert_eq!(crate::substrate::space::slab::class_size(class(16, 1000).unwrap() as usize), 1280);
        assert_eq!(class(8, 8 << 20), None, "beyond what a link names");
    }

    proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..120), max in 0usize..100) {
            if let Some(v) = decode(&b, b"k", 9, 4, max) {
                prop_assert!(v.value.end <= b.len() && v.value.len() <= max);
            }
        }
    }
}
