//! A Clover buffer's header word (pDPM §5, "data buffer"): the pointer to
//! the next version of the key's chain, the one word of a buffer that
//! changes after it is written, and only by CAS (a version is committed
//! when its predecessor's header word is swung to it).
//!
//! ```text
//! bits  0..2   kind: 1 the tail, 2 the tail of a deleted key, 3 a link
//! bits  2..38  a link's offset / 8
//! bits 38..44  a link's node
//! bits 44..52  GC version: a tail's own, a link's target's
//! bits 52..64  check: 12 bits of xxh3 of bits 0..52, seeded by the key
//! ```
//!
//! The paper's NULL pointer is a *tail* word here, not 0, and every word
//! carries a check seeded by the key's hash: a zeroed word, a flipped bit
//! or another key's word decodes to `None` (a retry, then an error), never
//! to "this is the latest version". So the CAS that commits a version,
//! which expects the key's tail word, can only succeed on a genuine tail
//! of that key's chain.
//!
//! **GC versions** (pDPM §5.2). The metadata server raises a buffer's GC
//! version each time it hands it out again. A tail word carries its own
//! buffer's, so that the CAS of a commit, which expects the tail word with
//! the GC version its cursor holds, fails on a buffer recycled since (no
//! ABA: the recycled buffer's tail word has another GC version); a link
//! carries its target's, so that the client that hops knows what to
//! expect there ([`Cursor`]).
//!
//! A delete swings the tail's word to [`Next::Deleted`] (one CAS, no new
//! buffer); an insert of a deleted key swings that word on to a new
//! version, so a key's whole history, deletes included, is one chain.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::{NodeId, RemoteAddr};

/// A buffer as a client expects to find it: where (the primary's copy)
/// and with which GC version. A cursor, a link's target, a chain's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cursor {
    /// The buffer.
    pub at: RemoteAddr,
    /// Its GC version when the cursor was taken.
    pub gc: u8,
}

impl Cursor {
    /// The cursor at `at` with GC version `gc`.
    pub fn new(at: RemoteAddr, gc: u8) -> Cursor {
        Cursor { at, gc }
    }

    /// Its location in an index or a cache: the GC version in the top
    /// byte, the node in the next, the offset below (48 bits).
    pub fn location(self) -> u64 {
        (self.gc as u64) << 56 | (self.at.node.0 as u64 & 0xff) << 48 | self.at.offset
    }

    /// The cursor [`Cursor::location`] names on a cluster of `nodes`
    /// nodes, checked (it comes from memory): a node of the cluster, an
    /// aligned non-zero offset.
    pub fn of_location(location: u64, nodes: usize) -> Option<Cursor> {
        let node = (location >> 48) as u8 as usize;
        let offset = location & ((1 << 48) - 1);
        (node < nodes && offset.is_multiple_of(8) && offset != 0)
            .then(|| Cursor::new(RemoteAddr::new(NodeId(node as u16), offset), (location >> 56) as u8))
    }
}

/// What a header word says comes after its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: this buffer is the key's latest version; its own GC
    /// version.
    Tail(u8),
    /// Nothing, and the key is deleted: its latest version is a deletion;
    /// its own GC version.
    Deleted(u8),
    /// The next version, on the key's primary, with its GC version.
    Link(Cursor),
}

const KIND_BITS: u32 = 2;
const OFFSET_BITS: u32 = 36;
const NODE_BITS: u32 = 6;
const GC_BITS: u32 = 8;
/// Bits under the check.
const BODY_BITS: u32 = KIND_BITS + OFFSET_BITS + NODE_BITS + GC_BITS;
const GC_SHIFT: u32 = KIND_BITS + OFFSET_BITS + NODE_BITS;
const SALT: u64 = 0x436c_6f76_6572_4844;

/// Largest offset a link can name (exclusive): 512 GiB.
pub const MAX_OFFSET: u64 = 8 << OFFSET_BITS;
/// Most nodes a link can name.
pub const MAX_LINK_NODES: usize = 1 << NODE_BITS;

fn check(body: u64, tag: u64) -> u64 {
    xxh3_64_with_seed(&body.to_le_bytes(), tag ^ SALT) >> BODY_BITS
}

/// The header word of `next` for the key whose hash is `tag`
/// (`crate::kv::place::key_hash`); `None` for a link that a word cannot
/// name (an offset beyond [`MAX_OFFSET`], zero or unaligned, a node
/// beyond [`MAX_LINK_NODES`]).
pub fn encode(next: Next, tag: u64) -> Option<u64> {
    let body = match next {
        Next::Tail(gc) => 1 | (gc as u64) << GC_SHIFT,
        Next::Deleted(gc) => 2 | (gc as u64) << GC_SHIFT,
        Next::Link(Cursor { at: a, gc }) => {
            if !a.offset.is_multiple_of(8)
                || a.offset >= MAX_OFFSET
                || a.offset == 0
                || a.node.0 as usize >= MAX_LINK_NODES
            {
                return None;
            }
            3 | (a.offset / 8) << KIND_BITS | (a.node.0 as u64) << (KIND_BITS + OFFSET_BITS) | (gc as u64) << GC_SHIFT
        }
    };
    Some(body | check(body, tag) << BODY_BITS)
}

/// The tail word of the key whose hash is `tag`, of a buffer of GC
/// version `gc`.
pub fn tail(tag: u64, gc: u8) -> u64 {
    Next::Tail(gc).word(tag)
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
    let gc = (body >> GC_SHIFT) as u8;
    let rest = body & ((1 << GC_SHIFT) - 1);
    match rest & ((1 << KIND_BITS) - 1) {
        1 if rest == 1 => Some(Next::Tail(gc)),
        2 if rest == 2 => Some(Next::Deleted(gc)),
        3 => {
            let offset = ((rest >> KIND_BITS) & ((1 << OFFSET_BITS) - 1)) * 8;
            let node = (rest >> (KIND_BITS + OFFSET_BITS)) as usize;
            (node < nodes && offset != 0)
                .then(|| Next::Link(Cursor::new(RemoteAddr::new(NodeId(node as u16), offset), gc)))
        }
        _ => None,
    }
}

/// The word of a key's *cell*: its chain's head, written in place by the
/// metadata server as it frees versions and read by clients as the
/// paper's shortcut (`super::ms`). A link word of the key, so checked and
/// bound to the key as any header word; never CASed, only written by the
/// MS and read.
pub fn cell_word(head: Cursor, tag: u64) -> u64 {
    Next::Link(head).word(tag)
}

/// The head a cell's word `w` names, for the key whose hash is `tag`;
/// `None` if it cannot be right.
pub fn decode_cell(w: u64, tag: u64, nodes: usize) -> Option<Cursor> {
    match decode(w, tag, nodes)? {
        Next::Link(head) => Some(head),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_round_trip_and_belong_to_their_key() {
        let link = Next::Link(Cursor::new(RemoteAddr::new(NodeId(4), 4096), 9));
        for next in [Next::Tail(0), Next::Tail(200), Next::Deleted(3), link] {
            let w = next.word(7);
            assert_eq!(decode(w, 7, 5), Some(next));
            assert_eq!(decode(w, 8, 5), None, "another key's word");
            assert_eq!(decode(0, 7, 5), None);
            for bit in 0..64 {
                assert_eq!(decode(w ^ 1 << bit, 7, 5), None, "{next:?} bit {bit}");
            }
        }
        assert_ne!(tail(7, 1), tail(7, 2), "a recycled buffer's tail word differs");
        assert_eq!(decode(link.word(7), 7, 4), None, "a node that is not there");
        let at = |node, off| Next::Link(Cursor::new(RemoteAddr::new(NodeId(node), off), 0));
        assert_eq!(encode(at(1, 12), 7), None, "unaligned");
        assert_eq!(encode(at(1, MAX_OFFSET), 7), None);
        assert_eq!(encode(at(64, 64), 7), None);
        let c = Cursor::new(RemoteAddr::new(NodeId(3), 1 << 40), 255);
        assert_eq!(Cursor::of_location(c.location(), 4), Some(c));
        assert_eq!(Cursor::of_location(c.location(), 3), None);
        assert_eq!(Cursor::of_location(0, 3), None);
        let head = Cursor::new(RemoteAddr::new(NodeId(3), 1 << 30), 255);
        assert_eq!(decode_cell(cell_word(head, 7), 7, 4), Some(head));
        assert_eq!(decode_cell(cell_word(head, 7), 8, 4), None, "another key's cell");
        assert_eq!(decode_cell(tail(7, 1), 7, 4), None, "a header word that is not a link");
    }

    proptest! {
        /// Garbage never panics; what decodes encodes back to itself.
        #[test]
        fn garbage_never_panics(w in any::<u64>(), tag in any::<u64>(), nodes in 0usize..300) {
            if let Some(n) = decode(w, tag, nodes) {
                prop_assert_eq!(encode(n, tag), Some(w));
            }
            let _ = Cursor::of_location(w, nodes);
        }

        #[test]
        fn links_round_trip(node in 0u16..64, off in 1u64..(1 << 36), gc in any::<u8>(), tag in any::<u64>()) {
            let n = Next::Link(Cursor::new(RemoteAddr::new(NodeId(node), off * 8), gc));
            prop_assert_eq!(decode(n.word(tag), tag, 64), Some(n));
        }
    }
}
