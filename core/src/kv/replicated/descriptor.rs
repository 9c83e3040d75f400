//! Where a key's replicas are: the immutable block an index entry points to
//! (SWARM §5.2: "an index tracks the locations of keys' replicas").
//!
//! The index maps a key to one `u64`; a replicated key needs 2f+1 addresses
//! and the shape of its objects, so the `u64` is the offset of this block,
//! a record beside the index (`crate::index::snapshot::records`: in its
//! arena, on every index replica), written by the inserter before the
//! index entry that publishes it, and never changed. Clients read it once per key and cache
//! it with the location (SWARM §5.2's 24 B per key, here the whole
//! [`Register`]).
//!
//! ```text
//! 0    magic "SWKVDSC1"
//! 8    replicas (1) | in place (bit 0), on the first only (bit 1) (1)
//!      | reserved (2) | meta words (4)
//! 16   max value (8)
//! 24   nodes: 8 × u16
//! 40   bases: 8 × u64
//! 104  tag: the key's hash (`index::cache::key_hash`)
//! 112  xxh3 of bytes 0..112
//! ```
//!
//! Everything is checked when read back: a block that fails any check is
//! corrupt, never trusted; a block of another key (a garbled index entry)
//! is told by its tag, which also seeds every checksum of the key's values.

use xxhash_rust::xxh3::xxh3_64;

use crate::NodeId;
use crate::substrate::memory::word_at;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::swarm::inout::{Layout, MAX_META_WORDS, MAX_VALUE, Replica};
use crate::swarm::maxreg::Register;

const MAGIC: u64 = u64::from_le_bytes(*b"SWKVDSC2");
/// Bytes of an encoded descriptor.
pub const LEN: usize = 120;
/// Bytes a descriptor takes in the index's arena.
pub const DESCRIPTOR_BYTES: u64 = 128;

/// Encodes `reg` (at most [`MAX_REPLICAS`] replicas, which `Register` holds).
pub fn encode(reg: &Register) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8] = reg.replicas.len() as u8;
    b[9] = reg.layout.in_place as u8 | (reg.layout.first_only as u8) << 1;
    b[12..16].copy_from_slice(&reg.layout.meta_words.to_le_bytes());
    b[16..24].copy_from_slice(&reg.layout.max_value.to_le_bytes());
    for (i, r) in reg.replicas.iter().enumerate() {
        b[24 + 2 * i..26 + 2 * i].copy_from_slice(&r.node.0.to_le_bytes());
        b[40 + 8 * i..48 + 8 * i].copy_from_slice(&r.base.to_le_bytes());
    }
    b[104..112].copy_from_slice(&reg.layout.tag.to_le_bytes());
    let sum = xxh3_64(&b[..112]);
    b[112..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Decodes a descriptor read from memory, for a cluster of `nodes` nodes.
pub fn decode(b: &[u8], nodes: usize) -> Result<Register, &'static str> {
    let b = b.get(..LEN).ok_or("truncated descriptor")?;
    let word = |at| word_at(b, at).ok_or("truncated descriptor");
    if word(0)? != MAGIC {
        return Err("bad descriptor magic");
    }
    if word(112)? != xxh3_64(&b[..112]) {
        return Err("bad descriptor checksum");
    }
    let n = b[8] as usize;
    let meta_words = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    let max_value = word(16)?;
    if n == 0 || n > MAX_REPLICAS || b[9] > 3 || meta_words == 0 || meta_words > MAX_META_WORDS || max_value > MAX_VALUE
    {
        return Err("impossible descriptor");
    }
    let (in_place, first_only, tag) = (b[9] & 1 == 1, b[9] & 2 == 2, word(104)?);
    let layout = Layout { meta_words, max_value, in_place, first_only, tag };
    let mut replicas = heapless::Vec::new();
    for i in 0..n {
        let node = u16::from_le_bytes([b[24 + 2 * i], b[25 + 2 * i]]);
        let base = word(40 + 8 * i)?;
        if node as usize >= nodes || !base.is_multiple_of(8) || base.checked_add(layout.of_replica(i).size()).is_none()
        {
            return Err("descriptor names an impossible replica");
        }
        let _ = replicas.push(Replica { node: NodeId(node), base });
    }
    Ok(Register { layout, replicas })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reg(n: usize) -> Register {
        let layout = Layout::new(4, 64).unwrap();
        let replicas = (0..n).map(|i| Replica { node: NodeId(i as u16), base: 4096 + 64 * i as u64 }).collect();
        Register { layout, replicas }
    }

    #[test]
    fn round_trips() {
        for n in [1, 3, 5, 7] {
            assert_eq!(decode(&encode(&reg(n)), 8), Ok(reg(n)));
            let mut one = reg(n);
            one.layout = one.layout.in_place_on_first();
            assert_eq!(decode(&encode(&one), 8), Ok(one));
        }
        assert_eq!(decode(&encode(&reg(3)), 2), Err("descriptor names an impossible replica"));
    }

    proptest! {
        /// Any corruption of a descriptor is caught: never a wrong register.
        #[test]
        fn corrupt_bytes_are_refused(at in 0usize..LEN, bit in 0u8..8, cut in 0usize..LEN) {
            let mut b = encode(&reg(3));
            b[at] ^= 1 << bit;
            prop_assert!(decode(&b, 8).is_err());
            prop_assert!(decode(&encode(&reg(3))[..cut], 8).is_err());
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&b, 8);
        }
    }
}
