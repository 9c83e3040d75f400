//! FUSEE's KV objects (`papers/fusee.txt` §4.1, §4.4, §4.5): every version
//! of a key is an immutable object written out of place, an index slot
//! points to the key's current one, and each object is also an entry of
//! its writer's embedded operation log.
//!
//! ```text
//! 0   key length:16 | op:8 | 0:8 | value length:32    op: 1 update, 2 insert, 3 delete
//! 8   sum:64      xxh3 (seeded) of bytes 0..8 and 16..32, the key and the value
//! 16  prev:64     location of the previous object of the writer's id (its log), 0: none
//! 24  base:64     the slot word the writer's change starts from, if known when
//!                 written (a cached entry's), 0: not known
//! 32  old:64      commit: the slot word the change replaced (0: none)   } not under
//! 40  check:64    commit check: hash(sum, kind, old) << 8 | kind         } the sum
//! 48  key | value, padded to the arena's 64 B
//! location  object bytes / 64 : 16 | arena offset : 48
//! ```
//!
//! An object lives at one offset of the replicated index's arena, the same
//! on every index replica ([`crate::index::snapshot::records`]), so its
//! location is that offset, with its length (in arena units) above it so
//! that a reader knows how much to read.
//!
//! # The embedded log (FUSEE §4.5)
//!
//! `op`, `prev` and `base` are the log entry: what the object's operation
//! is, the writer's previous entry, and the word its change starts from.
//! All three are known before the object is written, so the log costs no
//! write of its own. A delete writes an object too, with no value (FUSEE's
//! temporary delete object), beside its first round. The *commit* (`old`,
//! `check`) is the one part written later, once the operation answered:
//! with the writer's next object (in the same pipeline to each replica),
//! or when it closes (see [`super`] for when and what recovery concludes
//! from it). A change whose round starts from a word the object does not
//! log as its `base` writes a provisional commit beside that round
//! ([`Kind::Started`], naming the word), so that recovery knows where to
//! redo it from. The commit is the
//! only part of an object that ever changes, and readers never misread it
//! because nothing they check covers it: the sum leaves bytes 32..48 out,
//! and [`decode`] reads neither. A commit is taken only whole and only for
//! its own object ([`Entry::commit`]: the check hashes the object's sum,
//! the kind and the word), so a torn commit, one of another object, or
//! zeros (never committed) read as "not committed".
//!
//! Everything read back is untrusted: [`decode`] and [`entry`] check both
//! lengths against what was read and the sum against the bytes, and
//! [`decode`] the key against the key asked for, so a torn, garbled,
//! never-written or other key's object is refused (and the records' reader
//! tries another replica).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::index::snapshot::arena::ALIGN;

/// Bytes of an object's header (with its log fields).
pub const HEADER: usize = 48;

/// Where the commit (`old`, `check`) is in an object.
pub const COMMIT: usize = 32;

/// The seed of the objects' sums ("FUSEEOBJ").
const SEED: u64 = 0x4655_5345_454f_424a;
/// The seed of the commits' checks ("FUSEECMT").
const COMMIT_SEED: u64 = 0x4655_5345_4543_4d54;

/// Bits of a location's arena offset.
const OFFSET_BITS: u32 = 48;

/// The largest object a location can name: 2^16 - 1 arena units.
pub const MAX_OBJECT: u64 = ((1 << (64 - OFFSET_BITS)) - 1) * ALIGN;

/// What an object's operation is (its log entry's op code).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    /// An update (or an insert that found the key cached: the same).
    Update = 1,
    /// An insert.
    Insert = 2,
    /// A delete: a log entry only (FUSEE's temporary delete object), with
    /// the key and no value; no slot ever points at it, and [`decode`]
    /// never answers it as a value.
    Delete = 3,
}

impl Op {
    fn of(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::Update,
            2 => Op::Insert,
            3 => Op::Delete,
            _ => return None,
        })
    }
}

/// How an object's operation ended, as its commit says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Its change took effect: `old` is the slot word it replaced.
    Published = 1,
    /// It answered without publishing the object (a losing update,
    /// overwritten; a key not found).
    Unpublished = 2,
    /// It answered an error: its change may have taken effect, or may yet
    /// (a SNAPSHOT round frozen on the backups); `old` is its base.
    InDoubt = 3,
    /// Its writer crashed, and a recovering client found the change done
    /// or finished it (`old`: its base).
    Recovered = 4,
    /// Its writer crashed, and a recovering client found the key moved on
    /// without it (`old`: the word found): recovery will not redo it.
    Dropped = 5,
    /// Not an outcome: its change is running a SNAPSHOT round from `old`,
    /// a slot word it learnt after the object was written (so not its
    /// `base`: a lookup beside the write, or a retry after a lost round).
    /// Written beside the round, and overwritten by the outcome; recovery
    /// takes it as the entry's base and the entry as undecided.
    Started = 6,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Published,
            2 => Kind::Unpublished,
            3 => Kind::InDoubt,
            4 => Kind::Recovered,
            5 => Kind::Dropped,
            6 => Kind::Started,
            _ => return None,
        })
    }
}

/// The log fields of an object about to be written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Log {
    /// Its operation.
    pub op: Op,
    /// The location of its writer's previous object, 0 if none.
    pub prev: u64,
    /// The slot word its change starts from, 0 if not known yet.
    pub base: u64,
}

/// Bytes the arena gives an object of `key` and `value` bytes.
pub fn alloc_len(key: usize, value: usize) -> u64 {
    ((HEADER + key + value) as u64).next_multiple_of(ALIGN)
}

/// The object of `key` and `value` with log fields `log`, padded to
/// [`alloc_len`], its commit empty.
pub fn encode(key: &[u8], value: &[u8], log: Log) -> alloc::vec::Vec<u8> {
    let mut b = alloc::vec![0u8; alloc_len(key.len(), value.len()) as usize];
    b[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    b[2] = log.op as u8;
    b[4..8].copy_from_slice(&(value.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&log.prev.to_le_bytes());
    b[24..32].copy_from_slice(&log.base.to_le_bytes());
    b[HEADER..HEADER + key.len()].copy_from_slice(key);
    b[HEADER + key.len()..HEADER + key.len() + value.len()].copy_from_slice(value);
    let sum = sum_of(&b[0..8], &b[16..32], &b[HEADER..HEADER + key.len() + value.len()]);
    b[8..16].copy_from_slice(&sum.to_le_bytes());
    b
}

fn sum_of(lengths: &[u8], log: &[u8], body: &[u8]) -> u64 {
    let seed = xxh3_64_with_seed(lengths, SEED);
    let seed = xxh3_64_with_seed(log, seed);
    xxh3_64_with_seed(body, seed)
}

/// The commit of the object whose sum is `sum`: `kind`, and the word
/// `old` (16 bytes, written at [`COMMIT`]).
pub fn commit(sum: u64, kind: Kind, old: u64) -> [u8; 16] {
    let mut h = [0u8; 17];
    h[0..8].copy_from_slice(&sum.to_le_bytes());
    h[8] = kind as u8;
    h[9..17].copy_from_slice(&old.to_le_bytes());
    let check = xxh3_64_with_seed(&h, COMMIT_SEED) << 8 | kind as u64;
    let mut c = [0u8; 16];
    c[0..8].copy_from_slice(&old.to_le_bytes());
    c[8..16].copy_from_slice(&check.to_le_bytes());
    c
}

/// The sum of an encoded object (its bytes 8..16).
pub fn sum_in(b: &[u8]) -> u64 {
    word_in(b, 8)
}

/// The base an encoded object logs (its bytes 24..32), if it names one.
pub fn base_in(b: &[u8]) -> Option<u64> {
    Some(word_in(b, 24)).filter(|&w| w != 0)
}

fn word_in(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).and_then(|s| s.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// A whole object read back as a log entry ([`entry`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    /// Its operation.
    pub op: Op,
    /// Its sum.
    pub sum: u64,
    /// The writer's previous object, 0 if none.
    pub prev: u64,
    /// The slot word its change started from, 0 if not known when written.
    pub base: u64,
    /// Bytes of the object (its arena allocation).
    pub len: u64,
    /// Where its key is in the bytes read.
    pub key: core::ops::Range<usize>,
    /// Its commit, if one is there whole: the kind and the word.
    pub commit: Option<(Kind, u64)>,
}

impl Entry {
    /// Its outcome, if its commit says one (a [`Kind::Started`] commit
    /// does not).
    pub fn outcome(&self) -> Option<(Kind, u64)> {
        self.commit.filter(|&(k, _)| k != Kind::Started)
    }

    /// The slot word its change started its last round from, as far as the
    /// log knows: a [`Kind::Started`] commit's (0 for an insert into a
    /// slot never used), else the object's `base` (0: not known).
    pub fn round_base(&self) -> Option<u64> {
        match self.commit {
            Some((Kind::Started, old)) => Some(old),
            _ => Some(self.base).filter(|&b| b != 0),
        }
    }
}

/// `b` read as a log entry, if it starts with a whole object (any key);
/// `None` for anything else, never a panic.
pub fn entry(b: &[u8]) -> Option<Entry> {
    let head = b.get(0..HEADER)?;
    let word = |at: usize| head[at..at + 8].try_into().ok().map(u64::from_le_bytes);
    let klen = u16::from_le_bytes([head[0], head[1]]) as usize;
    let vlen = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    let op = Op::of(head[2])?;
    if klen == 0 || head[3] != 0 {
        return None;
    }
    let end = HEADER.checked_add(klen)?.checked_add(vlen)?;
    let body = b.get(HEADER..end)?;
    let sum = word(8)?;
    if sum != sum_of(&head[0..8], &head[16..32], body) {
        return None;
    }
    let (old, check) = (word(COMMIT)?, word(COMMIT + 8)?);
    let commit = Kind::of(check as u8).filter(|&k| commit(sum, k, old)[8..16] == check.to_le_bytes()).map(|k| (k, old));
    let len = alloc_len(klen, vlen);
    Some(Entry { op, sum, prev: word(16)?, base: word(24)?, len, key: HEADER..HEADER + klen, commit })
}

/// The range of the value in `b`, if `b` starts with a whole object of
/// `key` (lengths within `b`, sum right, the same key); `None` for
/// anything else.
pub fn decode(b: &[u8], key: &[u8]) -> Option<core::ops::Range<usize>> {
    let head = b.get(0..HEADER)?;
    let klen = u16::from_le_bytes([head[0], head[1]]) as usize;
    let vlen = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    if klen == 0 || klen != key.len() || head[2] == Op::Delete as u8 {
        return None;
    }
    let end = HEADER.checked_add(klen)?.checked_add(vlen)?;
    let body = b.get(HEADER..end)?;
    let sum = u64::from_le_bytes(head[8..16].try_into().ok()?);
    (sum == sum_of(&head[0..8], &head[16..32], body) && &body[..klen] == key).then_some(HEADER + klen..end)
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
