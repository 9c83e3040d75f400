//! What Clover's clients and its metadata server exchange (pDPM §5, "MS
//! duties"): look a key's chain up, create a key's chain, and ALLOC
//! batches of free buffers on several data nodes at once.
//!
//! ```text
//! LOOKUP  key
//! CREATE  key length (1) | key | value
//! ALLOC   per node: buffers wanted (1)
//! answer  kind (1) | server's roundtrips to data nodes (1) | 0 (6)
//!         [ | location (8): a chain's head, for Head and Created ]
//!         [ | per node: count (1) | count x offset (8), for Buffers ]
//! failure a data node down: 3 | node (2) | timed out (1); else as
//!         pDPM-Central's (`super::super::pdpm_central::wire::encode_failure`)
//! ```
//!
//! Everything decoded here came through memory: decoding checks every
//! bound and answers `None` for what cannot be right, never panics.

use alloc::vec::Vec;

use crate::kv::KvError;
use crate::kv::place::{addr_of, location_of};
use crate::substrate::memory::word_at;
use crate::substrate::msg::rpc::method::FIRST_SERVICE;
use crate::systems::pdpm_central::wire as central;
use crate::{MemError, MemErrorKind, NodeId, RemoteAddr};

/// Where a key's chain starts.
pub const LOOKUP: u16 = FIRST_SERVICE;
/// Creates a key's chain with its first version (or answers the chain
/// that exists).
pub const CREATE: u16 = FIRST_SERVICE + 1;
/// Free buffers, a batch per node.
pub const ALLOC: u16 = FIRST_SERVICE + 2;

/// Bytes of an answer's header.
pub const ANSWER_HEADER: usize = 8;
/// Most buffers per node in one batch.
pub const MAX_BATCH: usize = 64;

/// What an answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The key has no chain.
    Absent,
    /// The key's chain starts at this buffer (on the key's primary).
    Head(RemoteAddr),
    /// The chain was created with its first version, here.
    Created(RemoteAddr),
    /// Free buffers: per node, their offsets (none where the node failed).
    Buffers(Vec<Vec<u64>>),
}

/// The body of a CREATE.
pub fn create_body(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(1 + key.len() + value.len());
    b.push(key.len() as u8);
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b
}

/// The key and value of a CREATE's body; `None` if malformed.
pub fn parse_create(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let klen = *b.first()? as usize;
    Some((b.get(1..1 + klen)?, b.get(1 + klen..)?))
}

impl Answer {
    fn kind(&self) -> u8 {
        match self {
            Answer::Absent => 0,
            Answer::Head(_) => 1,
            Answer::Created(_) => 2,
            Answer::Buffers(_) => 3,
        }
    }

    /// Its bytes, saying that the server made `rounds` sequential
    /// roundtrips to data nodes for it.
    pub fn encode(&self, rounds: u8, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.kind(), rounds, 0, 0, 0, 0, 0, 0]);
        match self {
            Answer::Absent => {}
            Answer::Head(a) | Answer::Created(a) => out.extend_from_slice(&location_of(*a).to_le_bytes()),
            Answer::Buffers(per_node) => {
                for offs in per_node {
                    out.push(offs.len().min(MAX_BATCH) as u8);
                    for o in offs.iter().take(MAX_BATCH) {
                        out.extend_from_slice(&o.to_le_bytes());
                    }
                }
            }
        }
    }

    /// Reads what [`Answer::encode`] wrote, on a cluster of `nodes` nodes:
    /// the answer and the server's rounds.
    pub fn decode(b: &[u8], nodes: usize) -> Option<(Answer, u8)> {
        let h = b.get(..ANSWER_HEADER)?;
        if h[2..].iter().any(|&x| x != 0) {
            return None;
        }
        let rest = &b[ANSWER_HEADER..];
        let at = |rest: &[u8]| -> Option<RemoteAddr> {
            let a = addr_of(word_at(rest, 0)?, nodes)?;
            (rest.len() == 8 && a.offset != 0).then_some(a)
        };
        let a = match h[0] {
            0 if rest.is_empty() => Answer::Absent,
            1 => Answer::Head(at(rest)?),
            2 => Answer::Created(at(rest)?),
            3 => {
                let (mut per_node, mut i) = (Vec::new(), 0);
                while i < rest.len() {
                    let n = rest[i] as usize;
                    if n > MAX_BATCH || per_node.len() >= nodes {
                        return None;
                    }
                    let offs = (0..n)
                        .map(|j| word_at(rest, i + 1 + 8 * j).filter(|o| o.is_multiple_of(8) && *o != 0))
                        .collect::<Option<Vec<u64>>>()?;
                    per_node.push(offs);
                    i += 1 + 8 * n;
                }
                Answer::Buffers(per_node)
            }
            _ => return None,
        };
        Some((a, h[1]))
    }
}

/// The body of a failed request: a data node that failed (the key's
/// primary: the client's operation fails naming it), else as
/// pDPM-Central's.
pub fn encode_failure(e: &KvError, out: &mut Vec<u8>) {
    match e {
        KvError::Down(d) => {
            out.push(3);
            out.extend_from_slice(&d.node.0.to_le_bytes());
            out.push((d.kind == MemErrorKind::TimedOut) as u8);
        }
        e => central::encode_failure(e, out),
    }
}

/// What [`encode_failure`] wrote.
pub fn decode_failure(b: &[u8]) -> KvError {
    match *b {
        [3, n0, n1, t] if t <= 1 => {
            let kind = if t == 1 { MemErrorKind::TimedOut } else { MemErrorKind::Unreachable };
            KvError::Down(MemError::new(NodeId(u16::from_le_bytes([n0, n1])), kind))
        }
        _ => central::decode_failure(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn answers_round_trip() {
        let a = RemoteAddr::new(NodeId(2), 4096);
        let buffers = Answer::Buffers(alloc::vec![alloc::vec![64, 128], alloc::vec![], alloc::vec![8]]);
        for ans in [Answer::Absent, Answer::Head(a), Answer::Created(a), buffers] {
            let mut out = Vec::new();
            ans.encode(1, &mut out);
            assert_eq!(Answer::decode(&out, 3), Some((ans.clone(), 1)));
        }
        let mut out = Vec::new();
        Answer::Head(a).encode(0, &mut out);
        assert_eq!(Answer::decode(&out, 2), None, "a node that is not there");
        for e in [
            KvError::Down(MemError::new(NodeId(2), MemErrorKind::Unreachable)),
            KvError::Down(MemError::new(NodeId(1), MemErrorKind::TimedOut)),
            KvError::Full,
            KvError::Unavailable,
        ] {
            let mut out = Vec::new();
            encode_failure(&e, &mut out);
            assert_eq!(decode_failure(&out), e);
        }
        let b = create_body(b"key", b"value");
        assert_eq!(parse_create(&b), Some((&b"key"[..], &b"value"[..])));
        assert_eq!(parse_create(&b[..3]), None);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200), nodes in 0usize..10) {
            if let Some((a, r)) = Answer::decode(&b, nodes) {
                let mut out = Vec::new();
                a.encode(r, &mut out);
                prop_assert_eq!(Answer::decode(&out, nodes), Some((a, r)));
            }
            let _ = parse_create(&b);
            let _ = decode_failure(&b);
        }
    }
}
