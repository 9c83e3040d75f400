//! FUSEE's KV objects (`papers/fusee.txt` §4.1, §4.4): every version of a
//! key is an immutable object written out of place, and an index slot
//! points to the key's current one.
//!
//! ```text
//! object    key length:16 | 0:16 | value length:32 | sum:64    (16 B)
//!           key | value, padded to the arena's 64 B
//! sum       xxh3 (seeded) of the first 8 header bytes, the key and the value
//! location  object bytes / 64 : 16 | arena offset : 48
//! ```
//!
//! An object lives at one offset of the replicated index's arena, the same
//! on every index replica ([`crate::index::snapshot::records`]), so its
//! location is that offset, with its length (in arena units) above it so
//! that a reader knows how much to read. The paper's object also carries
//! the embedded operation log (`next`, `prev`, `old_value`, the used bit:
//! §4.5); that is not done here (see [`super`]).
//!
//! Everything read back is untrusted: [`decode`] checks both lengths
//! against what was read and the sum against the bytes, and the key
//! against the key asked for, so a torn, garbled, never-written or other
//! key's object is refused (and the records' reader tries another replica).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::index::snapshot::arena::ALIGN;

/// Bytes of an object's header.
pub const HEADER: usize = 16;

/// The seed of the objects' sums ("FUSEEOBJ").
const SEED: u64 = 0x4655_5345_454f_424a;

/// Bits of a location's arena offset.
const OFFSET_BITS: u32 = 48;

/// The largest object a location can name: 2^16 - 1 arena units.
pub const MAX_OBJECT: u64 = ((1 << (64 - OFFSET_BITS)) - 1) * ALIGN;

/// Bytes the arena gives an object of `key` and `value` bytes.
pub fn alloc_len(key: usize, value: usize) -> u64 {
    ((HEADER + key + value) as u64).next_multiple_of(ALIGN)
}

/// The object of `key` and `value`, padded to [`alloc_len`].
pub fn encode(key: &[u8], value: &[u8]) -> alloc::vec::Vec<u8> {
    let mut b = alloc::vec![0u8; alloc_len(key.len(), value.len()) as usize];
    b[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    b[4..8].copy_from_slice(&(value.len() as u32).to_le_bytes());
    b[HEADER..HEADER + key.len()].copy_from_slice(key);
    b[HEADER + key.len()..HEADER + key.len() + value.len()].copy_from_slice(value);
    let sum = sum_of(&b[0..8], &b[HEADER..HEADER + key.len() + value.len()]);
    b[8..16].copy_from_slice(&sum.to_le_bytes());
    b
}

fn sum_of(lengths: &[u8], body: &[u8]) -> u64 {
    let seed = xxh3_64_with_seed(lengths, SEED);
    xxh3_64_with_seed(body, seed)
}

/// The range of the value in `b`, if `b` starts with a whole object of
/// `key` (lengths within `b`, sum right, the same key); `None` for
/// anything else.
pub fn decode(b: &[u8], key: &[u8]) -> Option<core::ops::Range<usize>> {
    let head = b.get(0..HEADER)?;
    let klen = u16::from_le_bytes([head[0], head[1]]) as usize;
    let vlen = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    if klen == 0 || klen != key.len() || head[2..4] != [0, 0] {
        return None;
    }
    let end = HEADER.checked_add(klen)?.checked_add(vlen)?;
    let body = b.get(HEADER..end)?;
    let sum = u64::from_le_bytes(head[8..16].try_into().ok()?);
    (sum == sum_of(&head[0..8], body) && &body[..klen] == key).then_some(HEADER + klen..end)
}

/// The location of an object of `len` bytes ([`alloc_len`]) at arena
/// offset `offset` (never 0: `len` is at least one unit).
pub fn location(offset: u64, len: u64) -> Option<u64> {
    let units = len / ALIGN;
    let fits = offset < 1 << OFFSET_BITS && offset.is_multiple_of(ALIGN) && len.is_multiple_of(ALIGN);
    (fits && units > 0 && units < 1 << (64 - OFFSET_BITS)).then_some(units << OFFSET_BITS | offset)
}

/// The arena offset and length a location names (checked: it comes from
/// memory; the records' reader checks that they lie in the arena).
pub fn place(location: u64) -> Option<(u64, usize)> {
    let offset = location & ((1 << OFFSET_BITS) - 1);
    let len = (location >> OFFSET_BITS) * ALIGN;
    (len > 0 && offset.is_multiple_of(ALIGN)).then_some((offset, len as usize))
}
