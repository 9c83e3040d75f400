//! A Clover buffer's header word (pDPM §5, "data buffer"): the pointer to
//! the next version of the key's chain, the one word of a buffer that
//! changes after it is written, and only by CAS (a version is committed
//! when its predecessor's header word is swung to it).
//!
//! ```text
//! bits  0..2   kind: 1 the tail, 2 the tail of a deleted key, 3 a link
//! bits  2..35  a link's offset / 64
//! bits 35..40  a link's node
//! bits 40..48  GC version: a tail's own, a link's target's
//! bits 48..54  a link's size class: its target version's (the class its
//!              key and value need; its buffers' may be larger), so that
//!              a hop READs what the version holds and no more
//! bits 54..64  check: 10 bits of xxh3 of bits 0..54, seeded by the key
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
//! **Size classes.** A version's buffers are as large as its value needs,
//! in the slab's size classes ([`crate::substrate::space::slab::class_of`]):
//! a link and a cursor carry their target version's class, so that a READ
//! of a version reads its bytes and no more, and a write takes a group of
//! the class its value needs (or a larger one: a version in a larger
//! group is still named by its own class).
//!
//! A delete swings the tail's word to [`Next::Deleted`] (one CAS, no new
//! buffer); an insert of a deleted key swings that word on to a new
//! version, so a key's whole history, deletes included, is one chain.
//!
//! **A WRITE over a word that CASes target** (issue #22, item 7: a NIC's
//! CAS need not be atomic against a plain WRITE of the same word). One
//! plain WRITE ever reaches a header word after its buffer is first
//! handed out: the next owner's WRITE of the whole buffer, once the MS
//! has recycled it (pDPM's GC does the same). A CAS racing that WRITE
//! cannot succeed, so it never writes over it: every CAS expects a tail
//! (or deleted) word with the GC version of its cursor, and while the
//! WRITE is in flight the word holds either the old incarnation's last
//! word or the new one's tail. The old incarnation's last word is a link
//! (a version is freed only once another is linked after it), which no
//! CAS expects, or, for a group given back unlinked, a tail no cursor
//! names (nobody learnt of that version). The new incarnation's tail has
//! a GC version no live cursor holds: a cursor of the new incarnation
//! exists only once its version is linked, after the WRITE has completed,
//! and one of an incarnation 256 hand-outs older is not used past its
//! lifetime ([`super::epoch_ns`]). The key's cell is written by the MS
//! alone, and only read by clients.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::substrate::space::slab::{MAX_NODES, class_size};
use crate::{NodeId, RemoteAddr};

/// Size classes a link can name: the slab's first 64, buffers up to
/// 8 MiB.
pub const CLASSES: usize = 1 << CLASS_BITS;
/// Buffers are whole slab objects: their offsets are multiples of this.
pub const ALIGN: u64 = 64;

/// A buffer as a client expects to find it: where (the primary's copy),
/// with which GC version, and of which size class. A cursor, a link's
/// target, a chain's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cursor {
    /// The buffer.
    pub at: RemoteAddr,
    /// Its GC version when the cursor was taken.
    pub gc: u8,
    /// Its size class (below [`CLASSES`]).
    pub class: u8,
}

impl Cursor {
    /// The cursor at `at` with GC version `gc`, of size class `class`.
    pub fn new(at: RemoteAddr, gc: u8, class: u8) -> Cursor {
        Cursor { at, gc, class }
    }

    /// Bytes of its size class: what a READ of the version it names
    /// reads (its buffer may be larger).
    pub fn bytes(self) -> usize {
        class_size(self.class as usize) as usize
    }

    /// Its location in an index or a cache: the GC version in the top
    /// byte, the node in the next, the size class in the next, the offset
    /// below (40 bits).
    pub fn location(self) -> u64 {
        (self.gc as u64) << 56 | (self.at.node.0 as u64 & 0xff) << 48 | (self.class as u64) << 40 | self.at.offset
    }

    /// The cursor [`Cursor::location`] names on a cluster of `nodes`
    /// nodes, checked (it comes from memory): a node of the cluster, a
    /// class a link can name, an aligned non-zero offset.
    pub fn of_location(location: u64, nodes: usize) -> Option<Cursor> {
        let node = (location >> 48) as u8 as usize;
        let class = (location >> 40) as u8;
        let offset = location & ((1 << 40) - 1);
        (node < nodes && (class as usize) < CLASSES && offset.is_multiple_of(ALIGN) && offset != 0)
            .then(|| Cursor::new(RemoteAddr::new(NodeId(node as u16), offset), (location >> 56) as u8, class))
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
const OFFSET_BITS: u32 = 33;
const NODE_BITS: u32 = 5;
const GC_BITS: u32 = 8;
const CLASS_BITS: u32 = 6;
/// Bits under the check.
const BODY_BITS: u32 = KIND_BITS + OFFSET_BITS + NODE_BITS + GC_BITS + CLASS_BITS;
const GC_SHIFT: u32 = KIND_BITS + OFFSET_BITS + NODE_BITS;
const CLASS_SHIFT: u32 = GC_SHIFT + GC_BITS;
const SALT: u64 = 0x436c_6f76_6572_4844;

/// Largest offset a link can name (exclusive): 512 GiB.
pub const MAX_OFFSET: u64 = ALIGN << OFFSET_BITS;
/// Most nodes a link can name (as many as the slab allocator serves).
pub const MAX_LINK_NODES: usize = 1 << NODE_BITS;
const _: () = assert!(MAX_LINK_NODES >= MAX_NODES);

fn check(body: u64, tag: u64) -> u64 {
    xxh3_64_with_seed(&body.to_le_bytes(), tag ^ SALT) >> BODY_BITS
}

/// The header word of `next` for the key whose hash is `tag`
/// (`crate::kv::place::key_hash`); `None` for a link that a word cannot
/// name (an offset beyond [`MAX_OFFSET`], zero or unaligned, a node
/// beyond [`MAX_LINK_NODES`], a class beyond [`CLASSES`]).
pub fn encode(next: Next, tag: u64) -> Option<u64> {
    let body = match next {
        Next::Tail(gc) => 1 | (gc as u64) << GC_SHIFT,
        Next::Deleted(gc) => 2 | (gc as u64) << GC_SHIFT,
        Next::Link(Cursor { at: a, gc, class }) => {
            if !a.offset.is_multiple_of(ALIGN)
                || a.offset >= MAX_OFFSET
                || a.offset == 0
                || a.node.0 as usize >= MAX_LINK_NODES
                || class as usize >= CLASSES
            {
                return None;
            }
            3 | (a.offset / ALIGN) << KIND_BITS
                | (a.node.0 as u64) << (KIND_BITS + OFFSET_BITS)
                | (gc as u64) << GC_SHIFT
                | (class as u64) << CLASS_SHIFT
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
    let class = (body >> CLASS_SHIFT) as u8;
    let rest = body & ((1 << GC_SHIFT) - 1);
    match rest & ((1 << KIND_BITS) - 1) {
        1 if rest == 1 && class == 0 => Some(Next::Tail(gc)),
        2 if rest == 2 && class == 0 => Some(Next::Deleted(gc)),
        3 => {
            let offset = ((rest >> KIND_BITS) & ((1 << OFFSET_BITS) - 1)) * ALIGN;
            let node = (rest >> (KIND_BITS + OFFSET_BITS)) as usize;
            (node < nodes && offset != 0)
                .then(|| Next::Link(Cursor::new(RemoteAddr::new(NodeId(node as u16), offset), gc, class)))
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
        let link = Next::Link(Cursor::new(RemoteAddr::new(NodeId(4), 4096), 9, 5));
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
        let at = |node, off, class| Next::Link(Cursor::new(RemoteAddr::new(NodeId(node), off), 0, class));
        assert_eq!(encode(at(1, 72, 0), 7), None, "unaligned");
        assert_eq!(encode(at(1, MAX_OFFSET, 0), 7), None);
        assert_eq!(encode(at(32, 64, 0), 7), None);
        assert_eq!(encode(at(1, 64, CLASSES as u8), 7), None);
        assert!(encode(at(31, MAX_OFFSET - ALIGN, CLASSES as u8 - 1), 7).is_some());
        let c = Cursor::new(RemoteAddr::new(NodeId(3), 1 << 39), 255, 63);
        assert_eq!(Cursor::of_location(c.location(), 4), Some(c));
        assert_eq!(Cursor::of_location(c.location(), 3), None);
        assert_eq!(Cursor::of_location(0, 3), None);
        assert_eq!(c.bytes(), 8 << 20, "the largest class a link names");
        let head = Cursor::new(RemoteAddr::new(NodeId(3), 1 << 30), 255, 2);
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
        fn links_round_trip(
            node in 0u16..32,
            off in 1u64..(1 << 33),
            gc in any::<u8>(),
            class in 0u8..CLASSES as u8,
            tag in any::<u64>(),
        ) {
            let c = Cursor::new(RemoteAddr::new(NodeId(node), off * ALIGN), gc, class);
            prop_assert_eq!(decode(Next::Link(c).word(tag), tag, 32), Some(Next::Link(c)));
            prop_assert_eq!(Cursor::of_location(c.location(), 32), Some(c));
        }
    }
}
