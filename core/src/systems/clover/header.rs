//! A Clover buffer's header word (pDPM §5, "data buffer"): the pointer to
//! the next version of the key's chain, the one word of a buffer that
//! changes after it is written, and only by CAS (a version is committed
//! when its predecessor's header word is swung to it).
//!
//! ```text
//! bits  0..2   kind: 1 the tail, 2 the tail of a deleted key, 3 a link
//! bits  2..42  a link's offset / 8
//! bits 42..50  a link's node
//! bits 50..64  check: 14 bits of xxh3 of bits 0..50, seeded by the key
//! ```
//!
//! The paper's NULL pointer is a *tail* word here, not 0, and every word
//! carries a check seeded by the key's hash: a zeroed word, a flipped bit
//! or another key's word decodes to `None` (a retry, then an error), never
//! to "this is the latest version". So the CAS that commits a version,
//! which expects the key's tail word, can only succeed on a genuine tail
//! of that key's chain.
//!
//! A delete swings the tail's word to [`Next::Deleted`] (one CAS, no new
//! buffer); an insert of a deleted key swings that word on to a new
//! version, so a key's whole history, deletes included, is one chain.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::{NodeId, RemoteAddr};

/// What a header word says comes after its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: this buffer is the key's latest version.
    Tail,
    /// Nothing, and the key is deleted: its latest version is a deletion.
    Deleted,
    /// The next version, on the key's primary.
    Link(RemoteAddr),
}

const KIND_BITS: u32 = 2;
const OFFSET_BITS: u32 = 40;
const NODE_BITS: u32 = 8;
/// Bits under the check.
const BODY_BITS: u32 = KIND_BITS + OFFSET_BITS + NODE_BITS;
const SALT: u64 = 0x436c_6f76_6572_4844;

/// Largest offset a link can name (exclusive).
pub const MAX_OFFSET: u64 = 8 << OFFSET_BITS;

fn check(body: u64, tag: u64) -> u64 {
    xxh3_64_with_seed(&body.to_le_bytes(), tag ^ SALT) >> BODY_BITS
}

/// The header word of `next` for the key whose hash is `tag`
/// (`crate::kv::place::key_hash`); `None` for a link that a word cannot
/// name (an offset beyond [`MAX_OFFSET`] or unaligned, a node beyond 255).
pub fn encode(next: Next, tag: u64) -> Option<u64> {
    let body = match next {
        Next::Tail => 1,
        Next::Deleted => 2,
        Next::Link(a) => {
            if !a.offset.is_multiple_of(8) || a.offset >= MAX_OFFSET || a.offset == 0 || a.node.0 >= 1 << NODE_BITS {
                return None;
            }
            3 | (a.offset / 8) << KIND_BITS | (a.node.0 as u64) << (KIND_BITS + OFFSET_BITS)
        }
    };
    Some(body | check(body, tag) << BODY_BITS)
}

/// The tail word of the key whose hash is `tag`.
pub fn tail(tag: u64) -> u64 {
    Next::Tail.word(tag)
}

impl Next {
    /// Its word for the key whose hash is `tag`. A link must be nameable
    /// ([`encode`]): buffers come from chunks of the store's nodes, far
    /// below [`MAX_OFFSET`].
    pub fn word(self, tag: u64) -> u64 {
        encode(self, tag).unwrap_or(0)
    }
}

/// What word `w` of a buffer of the key whose hash is `tag` says, on a
/// cluster of `nodes` nodes; `None` if it cannot be right.
pub fn decode(w: u64, tag: u64, nodes: usize) -> Option<Next> {
    let body = w & ((1 << BODY_BITS) - 1);
    if w >> BODY_BITS != check(body, tag) {
        return None;
    }
    match body & ((1 << KIND_BITS) - 1) {
        1 if body == 1 => Some(Next::Tail),
        2 if body == 2 => Some(Next::Deleted),
        3 => {
            let offset = ((body >> KIND_BITS) & ((1 << OFFSET_BITS) - 1)) * 8;
            let node = (body >> (KIND_BITS + OFFSET_BITS)) as usize;
            (node < nodes && offset != 0).then(|| Next::Link(RemoteAddr::new(NodeId(node as u16), offset)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_round_trip_and_belong_to_their_key() {
        let link = Next::Link(RemoteAddr::new(NodeId(4), 4096));
        for next in [Next::Tail, Next::Deleted, link] {
            let w = next.word(7);
            assert_eq!(decode(w, 7, 5), Some(next));
            assert_eq!(decode(w, 8, 5), None, "another key's word");
            assert_eq!(decode(0, 7, 5), None);
            for bit in 0..64 {
                assert_eq!(decode(w ^ 1 << bit, 7, 5), None, "{next:?} bit {bit}");
            }
        }
        assert_eq!(decode(link.word(7), 7, 4), None, "a node that is not there");
        assert_eq!(encode(Next::Link(RemoteAddr::new(NodeId(1), 12)), 7), None, "unaligned");
        assert_eq!(encode(Next::Link(RemoteAddr::new(NodeId(1), MAX_OFFSET)), 7), None);
        assert_eq!(encode(Next::Link(RemoteAddr::new(NodeId(300), 64)), 7), None);
    }

    proptest! {
        /// Garbage never panics; what decodes encodes back to itself.
        #[test]
        fn garbage_never_panics(w in any::<u64>(), tag in any::<u64>(), nodes in 0usize..300) {
            if let Some(n) = decode(w, tag, nodes) {
                prop_assert_eq!(encode(n, tag), Some(w));
            }
        }

        #[test]
        fn links_round_trip(node in 0u16..256, off in 1u64..(1 << 40), tag in any::<u64>()) {
            let n = Next::Link(RemoteAddr::new(NodeId(node), off * 8));
            prop_assert_eq!(decode(n.word(tag), tag, 256), Some(n));
        }
    }
}
