//! What pDPM-Central's coordinator and clients exchange, and what the
//! coordinator keeps durably on its node (pDPM §4.2): a key's committed
//! *version* (where its value's copies are, its length and checksum), the
//! requests, and the answers.
//!
//! ```text
//! version   magic (2) | copies (1) | 0 (1) | length (4)
//!           | value checksum (8) | copies x location (8) | check (8)
//! location  node (16 bits) | offset (48 bits)
//! request   GET / DELETE: key;  PUT: mode (1) | key length (1) | key | value
//! answer    kind (1) | coordinator's roundtrips to data nodes (1)
//!           | flags (1: bit 0, the superseded version's free waits for
//!           readers; bit 1, the key was loaded again, fenced; bit 2, a
//!           data node marked down took a copy and is back; bit 3, an
//!           earlier incarnation's versions were freed) | 0 (5)
//!           [ | version, for a key found ]
//! ```
//!
//! Everything decoded here comes from memory (the coordinator's records,
//! the rings): decoding checks every bound and answers `None` for what
//! cannot be right, never panics.

use alloc::vec::Vec;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::kv::KvError;
use crate::substrate::memory::word_at;
use crate::substrate::msg::rpc::method::FIRST_SERVICE;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::{MemError, MemErrorKind, NodeId, RemoteAddr};

/// Reads a key: the coordinator read-locks its committed version and
/// answers where its copies are.
pub const GET: u16 = FIRST_SERVICE;
/// Writes a key out of place ([`Mode`]).
pub const PUT: u16 = FIRST_SERVICE + 1;
/// Deletes a key.
pub const DELETE: u16 = FIRST_SERVICE + 2;

const MAGIC: u64 = 0x4350;
/// Bytes of a version's fixed part (before its copies and check).
const FIXED: usize = 16;
/// Bytes of the largest version (the size of a record on the coordinator's node).
pub const RECORD_BYTES: usize = FIXED + 8 * MAX_REPLICAS + 8;
/// Bytes of an answer's header.
pub const ANSWER_HEADER: usize = 8;

/// A key's committed version: where the copies of its value are (only the
/// data nodes that acknowledged it), its length and its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Bytes of the value.
    pub len: u32,
    /// [`value_sum`] of the value.
    pub sum: u64,
    /// Its copies, one per data node that holds it.
    pub copies: heapless::Vec<RemoteAddr, MAX_REPLICAS>,
}

/// A location as one word.
pub fn location(addr: RemoteAddr) -> u64 {
    (addr.node.0 as u64) << 48 | addr.offset
}

/// The location of word `w` on a cluster of `nodes` nodes; `None` if it
/// names no node or an unaligned offset.
pub fn decode_location(w: u64, nodes: usize) -> Option<RemoteAddr> {
    let node = (w >> 48) as usize;
    let offset = w & ((1 << 48) - 1);
    (node < nodes && offset.is_multiple_of(8) && offset != 0).then(|| RemoteAddr::new(NodeId(node as u16), offset))
}

/// The checksum of a value: a copy that holds anything else (garbled, or
/// another value written over a freed copy) does not match.
pub fn value_sum(value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, 0x7044_504d_4365_6e74)
}

impl Version {
    /// Its bytes (a record, or the body of an answer).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + 8 * self.copies.len() + 8);
        let w0 = MAGIC | (self.copies.len() as u64) << 16 | (self.len as u64) << 32;
        b.extend_from_slice(&w0.to_le_bytes());
        b.extend_from_slice(&self.sum.to_le_bytes());
        for c in &self.copies {
            b.extend_from_slice(&location(*c).to_le_bytes());
        }
        let check = xxh3_64_with_seed(&b, MAGIC);
        b.extend_from_slice(&check.to_le_bytes());
        b
    }

    /// Reads what [`Version::encode`] wrote, on a cluster of `nodes` nodes
    /// with values of at most `max_value` bytes; `None` for anything else.
    pub fn decode(b: &[u8], nodes: usize, max_value: usize) -> Option<Version> {
        let w0 = word_at(b, 0)?;
        let count = (w0 >> 16) as u8 as usize;
        let len = (w0 >> 32) as u32;
        if w0 & 0xffff != MAGIC || (w0 >> 24) as u8 != 0 || count == 0 || count > MAX_REPLICAS {
            return None;
        }
        if len as usize > max_value {
            return None;
        }
        let end = FIXED + 8 * count;
        if word_at(b, end)? != xxh3_64_with_seed(b.get(..end)?, MAGIC) {
            return None;
        }
        let mut copies = heapless::Vec::new();
        for i in 0..count {
            let at = decode_location(word_at(b, FIXED + 8 * i)?, nodes)?;
            if copies.iter().any(|c: &RemoteAddr| c.node == at.node) {
                return None;
            }
            copies.push(at).ok()?;
        }
        Some(Version { len, sum: word_at(b, 8)?, copies })
    }
}

/// How a PUT treats a key that is absent or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Writes it anyway (an insert; of a present key, an update).
    Insert,
    /// Writes only a present key (an update).
    Update,
}

/// The body of a PUT.
pub fn put_body(mode: Mode, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + key.len() + value.len());
    b.push(matches!(mode, Mode::Update) as u8);
    b.push(key.len() as u8);
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b
}

/// The mode, key and value of a PUT's body; `None` if malformed.
pub fn parse_put(b: &[u8]) -> Option<(Mode, &[u8], &[u8])> {
    let mode = match *b.first()? {
        0 => Mode::Insert,
        1 => Mode::Update,
        _ => return None,
    };
    let klen = *b.get(1)? as usize;
    let key = b.get(2..2 + klen)?;
    Some((mode, key, b.get(2 + klen..)?))
}

/// What an answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The key was never inserted (or is unknown to the coordinator's index).
    Absent,
    /// The key was deleted and not inserted again since.
    Deleted,
    /// The key's committed version, read-locked for this client until its
    /// next request.
    Found(Version),
    /// The write or delete committed.
    Written,
    /// An update or delete of a key that is absent or deleted: nothing changed.
    NotFound,
}

impl Answer {
    fn kind(&self) -> u8 {
        match self {
            Answer::Absent => 0,
            Answer::Deleted => 1,
            Answer::Found(_) => 2,
            Answer::Written => 3,
            Answer::NotFound => 4,
        }
    }

    /// Its bytes, saying that the coordinator made `rounds` sequential
    /// roundtrips to data nodes for it, and `flags`.
    pub fn encode(&self, rounds: u8, flags: Flags, out: &mut Vec<u8>) {
        let f = flags.deferred as u8
            | (flags.fenced as u8) << 1
            | (flags.readmitted as u8) << 2
            | (flags.foreign_freed as u8) << 3;
        out.extend_from_slice(&[self.kind(), rounds, f, 0, 0, 0, 0, 0]);
        if let Answer::Found(v) = self {
            out.extend_from_slice(&v.encode());
        }
    }

    /// Reads what [`Answer::encode`] wrote (see [`Version::decode`] for
    /// `nodes` and `max_value`): the answer, the coordinator's rounds, and
    /// its flags.
    pub fn decode(b: &[u8], nodes: usize, max_value: usize) -> Option<(Answer, u8, Flags)> {
        let h = b.get(..ANSWER_HEADER)?;
        if h[2] > 15 || h[3..].iter().any(|&x| x != 0) {
            return None;
        }
        let rest = &b[ANSWER_HEADER..];
        let a = match h[0] {
            0 => Answer::Absent,
            1 => Answer::Deleted,
            2 => Answer::Found(Version::decode(rest, nodes, max_value)?),
            3 => Answer::Written,
            4 => Answer::NotFound,
            _ => return None,
        };
        if !matches!(a, Answer::Found(_)) && !rest.is_empty() {
            return None;
        }
        let flags = Flags {
            deferred: h[2] & 1 != 0,
            fenced: h[2] & 2 != 0,
            readmitted: h[2] & 4 != 0,
            foreign_freed: h[2] & 8 != 0,
        };
        Some((a, h[1], flags))
    }
}

/// What an answer says of how it was served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// The version it superseded was read-locked: its free waits for its
    /// readers.
    pub deferred: bool,
    /// The coordinator found the key changed by another incarnation of it
    /// (the map it answers from was stale) and loaded it again.
    pub fenced: bool,
    /// A data node the coordinator had marked down acknowledged a copy of
    /// this write: it is in use again.
    pub readmitted: bool,
    /// The coordinator freed versions an earlier incarnation of it had
    /// committed (superseded long enough ago).
    pub foreign_freed: bool,
}

/// The body of a failed request: why, as far as a client can act on it
/// (a full node, a full index), else "unavailable".
pub fn encode_failure(e: &KvError, out: &mut Vec<u8>) {
    match *e {
        KvError::NodeFull { node, need, free } => {
            out.push(1);
            out.extend_from_slice(&node.0.to_le_bytes());
            out.extend_from_slice(&need.to_le_bytes());
            out.extend_from_slice(&free.to_le_bytes());
        }
        KvError::Full => out.push(2),
        // The coordinator was superseded (see `coordinator`), or a node
        // it needed is down.
        KvError::Down(e) => {
            out.push(3);
            out.extend_from_slice(&e.node.0.to_le_bytes());
        }
        _ => out.push(0),
    }
}

/// What [`encode_failure`] wrote; "unavailable" for anything else.
pub fn decode_failure(b: &[u8]) -> KvError {
    match b.first() {
        Some(1) if b.len() == 19 => KvError::NodeFull {
            node: NodeId(u16::from_le_bytes([b[1], b[2]])),
            need: word_at(b, 3).unwrap_or(0),
            free: word_at(b, 11).unwrap_or(0),
        },
        Some(2) if b.len() == 1 => KvError::Full,
        Some(3) if b.len() == 3 => {
            KvError::Down(MemError::new(NodeId(u16::from_le_bytes([b[1], b[2]])), MemErrorKind::Unreachable))
        }
        _ => KvError::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn version(n: usize) -> Version {
        Version {
            len: 100,
            sum: 0xdead_beef,
            copies: (0..n).map(|i| RemoteAddr::new(NodeId(i as u16), 64 * (i as u64 + 1))).collect(),
        }
    }

    #[test]
    fn versions_and_answers_round_trip() {
        for n in 1..=MAX_REPLICAS {
            let v = version(n);
            let b = v.encode();
            assert!(b.len() <= RECORD_BYTES);
            assert_eq!(Version::decode(&b, MAX_REPLICAS, 256), Some(v.clone()));
            assert_eq!(Version::decode(&b, n - 1, 256), None, "a copy on a node that is not there");
            assert_eq!(Version::decode(&b, MAX_REPLICAS, 99), None, "longer than values may be");
            let mut out = Vec::new();
            let none = Flags::default();
            Answer::Found(v.clone()).encode(3, none, &mut out);
            assert_eq!(Answer::decode(&out, MAX_REPLICAS, 256), Some((Answer::Found(v), 3, none)));
        }
        for (i, a) in [Answer::Absent, Answer::Deleted, Answer::Written, Answer::NotFound].into_iter().enumerate() {
            let mut out = Vec::new();
            let flags = Flags { deferred: i % 2 == 0, fenced: i >= 2, readmitted: i % 3 == 1, foreign_freed: i == 1 };
            a.encode(1, flags, &mut out);
            assert_eq!(Answer::decode(&out, 3, 256), Some((a, 1, flags)));
        }
        let superseded = KvError::Down(MemError::new(NodeId(0), MemErrorKind::Unreachable));
        for e in [
            KvError::NodeFull { node: NodeId(2), need: 1 << 16, free: 12 },
            KvError::Full,
            KvError::Unavailable,
            superseded,
        ] {
            let mut out = Vec::new();
            encode_failure(&e, &mut out);
            assert_eq!(decode_failure(&out), e);
        }
        let b = put_body(Mode::Update, b"key", b"value");
        assert_eq!(parse_put(&b), Some((Mode::Update, &b"key"[..], &b"value"[..])));
        assert_eq!(parse_put(&b[..4]), None);
    }

    #[test]
    fn a_flipped_bit_is_refused() {
        let b = version(3).encode();
        for i in 0..b.len() * 8 {
            let mut g = b.clone();
            g[i / 8] ^= 1 << (i % 8);
            assert_eq!(Version::decode(&g, 8, 256), None, "bit {i}");
        }
    }

    proptest! {
        /// Garbage never panics, and what decodes re-encodes to itself.
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200), nodes in 0usize..10) {
            if let Some(v) = Version::decode(&b, nodes, 1 << 16) {
                prop_assert!(v.copies.iter().all(|c| c.node.index() < nodes));
                prop_assert_eq!(Version::decode(&v.encode(), nodes, 1 << 16), Some(v));
            }
            if let Some((a, r, d)) = Answer::decode(&b, nodes, 1 << 16) {
                let mut out = Vec::new();
                a.encode(r, d, &mut out);
                prop_assert_eq!(Answer::decode(&out, nodes, 1 << 16), Some((a, r, d)));
            }
            let _ = parse_put(&b);
            let _ = decode_failure(&b);
        }
    }
}
