//! What Clover's clients and its metadata server exchange (pDPM §5, "MS
//! duties"): look a key's chain up, create a key's chain, and ALLOC
//! batches of free buffers on several data nodes at once, which also
//! carries the versions the client retired (the paper's retire requests,
//! piggybacked: no message of their own) and the buffers it gives back.
//!
//! ```text
//! LOOKUP  key
//! CREATE  key length (1) | key | value
//! ALLOC   classes (1) | per class: size class (1) | nodes (1)
//!                                  | per node: groups wanted (1)
//!         | retires (1) | per retire: key length (1) | key | old (8) | new (8)
//!         | given back (1) | per group: its primary (8)
//! answer  kind (1) | server's roundtrips to data nodes (1)
//!         | groups handed out again, recycled (2) | 0 (4)
//!         [ | head (8) | cell (8): a key's chain, for Head and Created ]
//!         [ | per node: count (1) | count x group, for Buffers ]
//! group   primary's offset (8) | GC version (1) | size class (1)
//!         | backups (1) | backups x location (8)
//! failure a data node down: 3 | node (2) | timed out (1); else as
//!         pDPM-Central's (`super::super::pdpm_central::wire::encode_failure`)
//! ```
//!
//! Cursors (old, new, given back, heads) are [`Cursor::location`]s: the
//! GC version rides with the address. Everything decoded here came
//! through memory: decoding checks every bound and answers `None` for
//! what cannot be right, never panics.

use alloc::vec::Vec;

use super::header::{ALIGN, CLASSES, Cursor, MAX_OFFSET};
use crate::kv::KvError;
use crate::kv::place::{addr_of, location_of};
use crate::substrate::memory::word_at;
use crate::substrate::msg::rpc::method::FIRST_SERVICE;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::systems::pdpm_central::wire as central;
use crate::{MemError, MemErrorKind, NodeId, RemoteAddr};

/// Where a key's chain starts.
pub const LOOKUP: u16 = FIRST_SERVICE;
/// Creates a key's chain with its first version (or answers the chain
/// that exists).
pub const CREATE: u16 = FIRST_SERVICE + 1;
/// Free buffers, a batch per node; retires and gives back buffers.
pub const ALLOC: u16 = FIRST_SERVICE + 2;

/// Bytes of an answer's header.
pub const ANSWER_HEADER: usize = 8;
/// Most groups per node in one batch.
pub const MAX_BATCH: usize = 64;
/// Most retires in one ALLOC.
pub const MAX_RETIRES: usize = 32;
/// Most groups given back in one ALLOC.
pub const MAX_GIVEN: usize = 64;
/// Most size classes one ALLOC asks groups of.
pub const MAX_WANTS: usize = 4;

/// The copies of one version: a buffer on a primary node and one on each
/// of the nodes after it (`crate::kv::place::node_of`), handed out,
/// written, linked, retired and recycled together, with one GC version
/// (the primary's: the backups are never read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The primary's buffer and the group's GC version.
    pub primary: Cursor,
    /// The backups' buffers (fewer than R - 1 where a node was down when
    /// the group was made).
    pub backups: heapless::Vec<RemoteAddr, MAX_REPLICAS>,
}

/// A version superseded: `old`, which `new` was linked from (by the CAS
/// of the client that retires it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retire {
    /// The key.
    pub key: Vec<u8>,
    /// The version retired.
    pub old: Cursor,
    /// The version linked from it.
    pub new: Cursor,
}

/// Groups of one size class an ALLOC asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Want {
    /// The size class (below [`super::header::CLASSES`]).
    pub class: u8,
    /// Per primary node, groups wanted.
    pub nodes: Vec<u8>,
}

/// An ALLOC's body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Alloc {
    /// Groups wanted, per size class (at most [`MAX_WANTS`]).
    pub want: Vec<Want>,
    /// Versions retired (at most [`MAX_RETIRES`]).
    pub retires: Vec<Retire>,
    /// Groups given back unused (at most [`MAX_GIVEN`]): never linked.
    pub given: Vec<Cursor>,
    /// The client's claim of its id (`Held::claim`; 0 without a lease):
    /// a new number on a channel says the id's earlier holder is gone.
    pub holder: u64,
}

impl Alloc {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = alloc::vec![self.want.len().min(MAX_WANTS) as u8];
        for w in self.want.iter().take(MAX_WANTS) {
            b.extend_from_slice(&[w.class, w.nodes.len() as u8]);
            b.extend_from_slice(&w.nodes);
        }
        b.push(self.retires.len().min(MAX_RETIRES) as u8);
        for r in self.retires.iter().take(MAX_RETIRES) {
            b.push(r.key.len() as u8);
            b.extend_from_slice(&r.key);
            b.extend_from_slice(&r.old.location().to_le_bytes());
            b.extend_from_slice(&r.new.location().to_le_bytes());
        }
        b.push(self.given.len().min(MAX_GIVEN) as u8);
        for g in self.given.iter().take(MAX_GIVEN) {
            b.extend_from_slice(&g.location().to_le_bytes());
        }
        b.extend_from_slice(&self.holder.to_le_bytes());
        b
    }

    /// Reads what [`Alloc::encode`] wrote, on a cluster of `nodes` nodes.
    pub fn decode(b: &[u8], nodes: usize) -> Option<Alloc> {
        let wants = *b.first()? as usize;
        if wants > MAX_WANTS {
            return None;
        }
        let (mut want, mut i) = (Vec::with_capacity(wants), 1);
        for _ in 0..wants {
            let (class, n) = (*b.get(i)?, *b.get(i + 1)? as usize);
            if n > nodes || class as usize >= CLASSES {
                return None;
            }
            want.push(Want { class, nodes: b.get(i + 2..i + 2 + n)?.to_vec() });
            i += 2 + n;
        }
        let cursor = |i: usize| Cursor::of_location(word_at(b, i)?, nodes);
        let count = *b.get(i)? as usize;
        i += 1;
        if count > MAX_RETIRES {
            return None;
        }
        let mut retires = Vec::with_capacity(count);
        for _ in 0..count {
            let klen = *b.get(i)? as usize;
            let key = b.get(i + 1..i + 1 + klen)?.to_vec();
            i += 1 + klen;
            retires.push(Retire { key, old: cursor(i)?, new: cursor(i + 8)? });
            i += 16;
        }
        let count = *b.get(i)? as usize;
        i += 1;
        if count > MAX_GIVEN {
            return None;
        }
        let given = (0..count).map(|j| cursor(i + 8 * j)).collect::<Option<Vec<_>>>()?;
        let holder = word_at(b, i + 8 * count)?;
        (i + 8 * count + 8 == b.len()).then_some(Alloc { want, retires, given, holder })
    }
}

/// Where a key's chain is, as the MS answers it: its head (the oldest
/// version not freed) and its *cell*, the word on the key's primary where
/// the MS keeps that head, which the client reads itself from then on
/// (the paper's shortcut, [`super::header::cell_word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The head.
    pub head: Cursor,
    /// The key's cell, on the head's node.
    pub cell: RemoteAddr,
}

/// What an answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The key has no chain.
    Absent,
    /// The key's chain (on the key's primary).
    Head(Chain),
    /// The chain was created with its first version, its head.
    Created(Chain),
    /// Free groups: per primary node, its groups (none where the node
    /// failed; of the size classes asked for, each group naming its own);
    /// of which `recycled` were handed out before.
    Buffers {
        /// Per primary node.
        groups: Vec<Vec<Group>>,
        /// How many of them are recycled.
        recycled: u16,
    },
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

/// Bytes of a group of `replicas` copies in an answer.
pub fn group_bytes(replicas: usize) -> usize {
    11 + 8 * replicas.saturating_sub(1)
}

impl Answer {
    fn kind(&self) -> u8 {
        match self {
            Answer::Absent => 0,
            Answer::Head(_) => 1,
            Answer::Created(_) => 2,
            Answer::Buffers { .. } => 3,
        }
    }

    /// Its bytes, saying that the server made `rounds` sequential
    /// roundtrips to data nodes for it.
    pub fn encode(&self, rounds: u8, out: &mut Vec<u8>) {
        let recycled = match self {
            Answer::Buffers { recycled, .. } => *recycled,
            _ => 0,
        };
        let r = recycled.to_le_bytes();
        out.extend_from_slice(&[self.kind(), rounds, r[0], r[1], 0, 0, 0, 0]);
        match self {
            Answer::Absent => {}
            Answer::Head(c) | Answer::Created(c) => {
                out.extend_from_slice(&c.head.location().to_le_bytes());
                out.extend_from_slice(&location_of(c.cell).to_le_bytes());
            }
            Answer::Buffers { groups, .. } => {
                for gs in groups {
                    out.push(gs.len().min(MAX_BATCH) as u8);
                    for g in gs.iter().take(MAX_BATCH) {
                        out.extend_from_slice(&g.primary.at.offset.to_le_bytes());
                        out.push(g.primary.gc);
                        out.push(g.primary.class);
                        out.push(g.backups.len() as u8);
                        for b in &g.backups {
                            out.extend_from_slice(&location_of(*b).to_le_bytes());
                        }
                    }
                }
            }
        }
    }

    /// Reads what [`Answer::encode`] wrote, on a cluster of `nodes` nodes:
    /// the answer and the server's rounds.
    pub fn decode(b: &[u8], nodes: usize) -> Option<(Answer, u8)> {
        let h = b.get(..ANSWER_HEADER)?;
        if h[4..].iter().any(|&x| x != 0) || (h[0] != 3 && h[2..4] != [0, 0]) {
            return None;
        }
        let rest = &b[ANSWER_HEADER..];
        let at = |rest: &[u8]| -> Option<Chain> {
            let head = Cursor::of_location(word_at(rest, 0)?, nodes)?;
            let cell = addr_of(word_at(rest, 8)?, nodes)?;
            let fits = rest.len() == 16 && cell.node == head.at.node && cell.offset != 0;
            (fits && cell.offset.is_multiple_of(8)).then_some(Chain { head, cell })
        };
        let a = match h[0] {
            0 if rest.is_empty() => Answer::Absent,
            1 => Answer::Head(at(rest)?),
            2 => Answer::Created(at(rest)?),
            3 => {
                let (mut groups, mut i) = (Vec::new(), 0);
                while i < rest.len() {
                    let n = rest[i] as usize;
                    let node = groups.len();
                    if n > MAX_BATCH || node >= nodes {
                        return None;
                    }
                    i += 1;
                    let mut gs = Vec::with_capacity(n);
                    for _ in 0..n {
                        let off = word_at(rest, i).filter(|o| o.is_multiple_of(ALIGN) && *o != 0 && *o < MAX_OFFSET)?;
                        let (gc, class, nb) = (*rest.get(i + 8)?, *rest.get(i + 9)?, *rest.get(i + 10)? as usize);
                        if nb >= MAX_REPLICAS || class as usize >= CLASSES {
                            return None;
                        }
                        i += 11;
                        let mut backups = heapless::Vec::new();
                        for j in 0..nb {
                            let a = addr_of(word_at(rest, i + 8 * j)?, nodes).filter(|a| a.offset != 0)?;
                            if a.node.index() == node {
                                return None;
                            }
                            backups.push(a).ok()?;
                        }
                        i += 8 * nb;
                        let primary = Cursor::new(RemoteAddr::new(NodeId(node as u16), off), gc, class);
                        gs.push(Group { primary, backups });
                    }
                    groups.push(gs);
                }
                Answer::Buffers { groups, recycled: u16::from_le_bytes([h[2], h[3]]) }
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
        let a = Cursor::new(RemoteAddr::new(NodeId(2), 4096), 3, 12);
        let chain = Chain { head: a, cell: RemoteAddr::new(NodeId(2), 64) };
        let g = |node: u16, off, gc, backups: &[(u16, u64)]| Group {
            primary: Cursor::new(RemoteAddr::new(NodeId(node), off), gc, 1),
            backups: backups.iter().map(|&(n, o)| RemoteAddr::new(NodeId(n), o)).collect(),
        };
        let groups = alloc::vec![
            alloc::vec![g(0, 64, 0, &[(1, 64), (2, 64)]), g(0, 128, 9, &[(2, 8)])],
            alloc::vec![],
            alloc::vec![g(2, 192, 255, &[])]
        ];
        let buffers = Answer::Buffers { groups, recycled: 2 };
        for ans in [Answer::Absent, Answer::Head(chain), Answer::Created(chain), buffers] {
            let mut out = Vec::new();
            ans.encode(1, &mut out);
            assert_eq!(Answer::decode(&out, 3), Some((ans.clone(), 1)));
        }
        let mut out = Vec::new();
        Answer::Head(chain).encode(0, &mut out);
        assert_eq!(Answer::decode(&out, 2), None, "a node that is not there");
        let elsewhere = Chain { cell: RemoteAddr::new(NodeId(1), 64), ..chain };
        out.clear();
        Answer::Head(elsewhere).encode(0, &mut out);
        assert_eq!(Answer::decode(&out, 3), None, "a cell off the head's node");
        let req = Alloc {
            want: alloc::vec![
                Want { class: 5, nodes: alloc::vec![1, 0, 3] },
                Want { class: 0, nodes: alloc::vec![2, 2, 2] }
            ],
            retires: alloc::vec![Retire { key: b"key".to_vec(), old: a, new: Cursor::new(a.at, 4, 12) }],
            given: alloc::vec![a],
            holder: 7,
        };
        assert_eq!(Alloc::decode(&req.encode(), 3), Some(req.clone()));
        assert_eq!(Alloc::decode(&req.encode(), 2), None);
        assert_eq!(Alloc::decode(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 3), Some(Alloc::default()));
        assert_eq!(Alloc::decode(&[0, 0, 0], 3), None, "no holder");
        assert_eq!(
            Alloc::decode(&[1, CLASSES as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 3),
            None,
            "a class no link names"
        );
        assert_eq!(Alloc::decode(&[MAX_WANTS as u8 + 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 3), None);
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
            if let Some(a) = Alloc::decode(&b, nodes) {
                prop_assert_eq!(Alloc::decode(&a.encode(), nodes), Some(a));
            }
            let _ = decode_failure(&b);
        }
    }
}
