//! The replicated index's header (`notes/fusee-design.md` §2): its logical
//! geometry and where each replica keeps its buckets and its arena. Pure
//! encoding and decoding, no memory access; the decoder takes untrusted
//! bytes.
//!
//! Every replica holds the same header, found through its node's root
//! slot [`roots::INDEX`](crate::substrate::space::roots::INDEX), so a
//! client that reads any one header knows every replica (a majority is a
//! majority of all of them):
//!
//! ```text
//! 0     magic "SWIDXSN1"
//! 8     version (3)
//! 16    bucket groups
//! 24    longest key
//! 32    hash seed
//! 40    replicas r (1..=8)
//! 48    arena size, bytes
//! 56    arena chunk (what one claim takes), bytes
//! 64    view lease L, ns (see super::view)
//! 72    landing bound D, ns
//! 96    replica i at 96 + 32 i, for i < 8 (zero beyond r):
//!         node, region size, bucket array offset, arena offset
//! 352   checksum: xxh3-64 of bytes 0..352
//! 384   the replica's view word (not in the checksum: it changes by CAS)
//! ```
//!
//! A slot's word sits at the same place of every replica's bucket array;
//! the arrays' offsets may differ from node to node. Slot words point into
//! the arena by offsets relative to its start, the same on every replica
//! ([`super::arena`]).

use xxhash_rust::xxh3::xxh3_64;

use super::arena::{self, Site};
use super::view::Timing;
use crate::index::IndexError;
use crate::index::layout::{BUCKET_BYTES, Geometry, MAX_KEY};
use crate::substrate::memory::word_at;
use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::region::HEADER_SIZE as REGION_HEADER;
use crate::{NodeId, RemoteAddr};

/// "SWIDXSN1", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"SWIDXSN1");
/// The layout's version: 3, the first replicated one (the single-node
/// index's is 2).
pub const VERSION: u64 = 3;
/// Bytes of the header; the replica's bucket array may follow it.
pub const BYTES: u64 = 448;
/// The longest view lease (a minute): past it a failover pause is a bug.
const MAX_LEASE_NS: u64 = 60_000_000_000;
/// Where the checksum is.
const SUM_AT: usize = TABLE + 32 * MAX_REPLICAS;
/// Where the replica table starts.
const TABLE: usize = 96;

/// Where one replica keeps its part of the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica {
    /// Its node.
    pub node: NodeId,
    /// Bytes of the node's region: nothing of the index lies beyond.
    pub region_size: u64,
    /// Offset of its bucket array.
    pub buckets: u64,
    /// Offset of its arena (the arena's header).
    pub arena: u64,
}

/// What the header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bucket groups.
    pub groups: u64,
    /// Longest key.
    pub max_key: usize,
    /// Seed of the key hash.
    pub seed: u64,
    /// Bytes of the arena.
    pub arena_size: u64,
    /// Bytes one arena claim takes.
    pub chunk: u64,
    /// The view change's durations, which every client and master must
    /// share.
    pub timing: Timing,
    /// Every replica, in replica order.
    pub replicas: heapless::Vec<Replica, MAX_REPLICAS>,
}

impl Header {
    /// The geometry of the buckets as offsets from a bucket array at 64 (a
    /// header of 64 bytes at 0): the same for every replica.
    /// [`Header::at`] turns its slot offsets into a replica's addresses.
    pub fn logical(&self) -> Geometry {
        Geometry {
            node: NodeId(0),
            header: 0,
            groups: self.groups,
            max_key: self.max_key,
            seed: self.seed,
            region_size: u64::MAX,
        }
    }

    /// Where the logical offset `offset` (a slot or a combined bucket of
    /// [`Header::logical`]) lies on replica `i`.
    pub fn at(&self, i: usize, offset: u64) -> RemoteAddr {
        let r = &self.replicas[i];
        RemoteAddr::new(r.node, r.buckets + (offset - BUCKET_BYTES))
    }

    /// The replicas of the group holding logical offset `offset`, its
    /// primary first: group `g`'s primary is replica `g mod r`, its backups
    /// the replicas after it, so that every replica is the primary of as
    /// many groups as the others.
    pub fn order(&self, offset: u64) -> impl Iterator<Item = usize> + '_ {
        let r = self.replicas.len();
        let group = (offset - BUCKET_BYTES) / crate::index::GROUP_BYTES;
        let first = (group % r as u64) as usize;
        (0..r).map(move |k| (first + k) % r)
    }

    /// The replicas of that group that `excluded` (bit `i`: replica `i`)
    /// leaves in, in the same order: the first is the group's primary in
    /// that view ([`super::view`]).
    pub fn order_without(&self, offset: u64, excluded: u8) -> impl Iterator<Item = usize> + '_ {
        self.order(offset).filter(move |&i| i >= 8 || excluded & (1 << i) == 0)
    }

    /// Where replica `i`'s view word is ([`super::view::VIEW_AT`]).
    pub fn view_addr(&self, i: usize) -> RemoteAddr {
        let r = &self.replicas[i];
        RemoteAddr::new(r.node, r.buckets - BYTES + super::view::VIEW_AT)
    }

    /// Each replica's arena, in replica order.
    pub fn sites(&self) -> heapless::Vec<Site, MAX_REPLICAS> {
        self.replicas.iter().map(|r| Site { node: r.node, base: r.arena }).collect()
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; BYTES as usize] {
        let mut b = [0u8; BYTES as usize];
        let put = |b: &mut [u8], at: usize, w: u64| b[at..at + 8].copy_from_slice(&w.to_le_bytes());
        let words = [
            MAGIC,
            VERSION,
            self.groups,
            self.max_key as u64,
            self.seed,
            self.replicas.len() as u64,
            self.arena_size,
            self.chunk,
            self.timing.lease_ns,
            self.timing.landing_ns,
        ];
        for (i, &w) in words.iter().enumerate() {
            put(&mut b, 8 * i, w);
        }
        for (i, r) in self.replicas.iter().enumerate() {
            let at = TABLE + 32 * i;
            for (k, w) in [r.node.0 as u64, r.region_size, r.buckets, r.arena].into_iter().enumerate() {
                put(&mut b, at + 8 * k, w);
            }
        }
        let sum = xxh3_64(&b[..SUM_AT]);
        put(&mut b, SUM_AT, sum);
        b
    }

    /// Checks what a header says of itself: its fields, and that each
    /// replica's buckets and arena lie in its region, apart.
    fn check(&self) -> Result<(), &'static str> {
        if self.groups == 0 || self.max_key > MAX_KEY {
            return Err("index header has an impossible geometry");
        }
        let bucket_bytes = Geometry::bytes(self.groups).ok_or("index header has an impossible geometry")? - 64;
        arena::check_size(self.arena_size).map_err(|_| "index header has an impossible arena size")?;
        if self.chunk == 0 || !self.chunk.is_multiple_of(arena::ALIGN) || self.chunk > self.arena_size {
            return Err("index header has an impossible arena chunk");
        }
        let t = self.timing;
        if t.landing_ns == 0 || t.lease_ns <= t.landing_ns.saturating_mul(2) || t.lease_ns > MAX_LEASE_NS {
            return Err("index header has an impossible view lease (it must exceed twice the landing bound)");
        }
        for (i, r) in self.replicas.iter().enumerate() {
            if self.replicas[..i].iter().any(|o| o.node == r.node) {
                return Err("index header names a node twice");
            }
            let within = |at: u64, len: u64| {
                at >= REGION_HEADER
                    && at.is_multiple_of(arena::ALIGN)
                    && at.checked_add(len).is_some_and(|e| e <= r.region_size)
            };
            let header_ok = r.buckets.checked_sub(BYTES).is_some_and(|h| h >= REGION_HEADER);
            if !header_ok || !within(r.buckets, bucket_bytes) || !within(r.arena, self.arena_size) {
                return Err("index header places a replica outside its region");
            }
            let apart = r.buckets + bucket_bytes <= r.arena || r.arena + self.arena_size <= r.buckets;
            if !apart {
                return Err("index header overlaps a replica's buckets and arena");
            }
        }
        Ok(())
    }

    /// Decodes a header read from `node`, or says what is wrong with it.
    pub fn decode(node: NodeId, b: &[u8]) -> Result<Header, IndexError> {
        let corrupt = |what| IndexError::Corrupt { node, what };
        let word = |at: usize| word_at(b, at).ok_or(corrupt("index header is truncated"));
        if word(0)? != MAGIC {
            return Err(corrupt("index header has a bad magic word"));
        }
        if word(8)? != VERSION {
            return Err(corrupt("index header has an unknown version"));
        }
        if word(SUM_AT)? != xxh3_64(&b[..SUM_AT]) {
            return Err(corrupt("index header fails its checksum"));
        }
        let r = word(40)?;
        if r == 0 || r > MAX_REPLICAS as u64 {
            return Err(corrupt("index header has an impossible number of replicas"));
        }
        let mut replicas = heapless::Vec::new();
        for i in 0..r as usize {
            let at = TABLE + 32 * i;
            let id = word(at)?;
            let id = u16::try_from(id).map_err(|_| corrupt("index header names an impossible node"))?;
            let replica = Replica {
                node: NodeId(id),
                region_size: word(at + 8)?,
                buckets: word(at + 16)?,
                arena: word(at + 24)?,
            };
            let _ = replicas.push(replica);
        }
        let h = Header {
            groups: word(16)?,
            max_key: word(24)?.min(usize::MAX as u64) as usize,
            seed: word(32)?,
            arena_size: word(48)?,
            chunk: word(56)?,
            timing: Timing { lease_ns: word(64)?, landing_ns: word(72)? },
            replicas,
        };
        h.check().map_err(corrupt)?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    fn header(r: usize) -> Header {
        Header {
            groups: 10,
            max_key: 24,
            seed: 7,
            arena_size: 1 << 20,
            chunk: 64 << 10,
            timing: Timing { lease_ns: 10_000_000, landing_ns: 50_000 },
            replicas: (0..r)
                .map(|i| Replica { node: NodeId(i as u16 * 2), region_size: 8 << 20, buckets: 8192, arena: 1 << 20 })
                .collect(),
        }
    }

    #[test]
    fn round_trips_and_rotates_primaries() {
        for r in 1..=MAX_REPLICAS {
            let h = header(r);
            assert_eq!(Header::decode(NodeId(0), &h.encode()), Ok(h.clone()));
        }
        let h = header(3);
        let geo = h.logical();
        // Group g's primary is replica g mod 3.
        for g in 0..6u64 {
            let slot = geo.buckets() + g * crate::index::GROUP_BYTES + 8;
            let order: Vec<usize> = h.order(slot).collect();
            assert_eq!(order[0], (g % 3) as usize);
            assert_eq!(order.len(), 3);
            assert_eq!(h.at(order[0], slot), RemoteAddr::new(NodeId(2 * order[0] as u16), 8192 + g * 192 + 8));
        }
    }

    #[test]
    fn refuses_impossible_headers() {
        let bad = |f: &dyn Fn(&mut Header)| {
            let mut h = header(3);
            f(&mut h);
            Header::decode(NodeId(0), &h.encode()).unwrap_err()
        };
        bad(&|h| h.groups = 0);
        bad(&|h| h.chunk = 100);
        bad(&|h| h.replicas[1].node = NodeId(0));
        bad(&|h| h.replicas[2].arena = 8 << 20);
        bad(&|h| h.replicas[0].buckets = 1 << 20);
        bad(&|h| h.replicas[0].buckets = 64);
        let mut b = header(3).encode();
        b[100] ^= 1;
        assert!(matches!(Header::decode(NodeId(0), &b), Err(IndexError::Corrupt { .. })));
        assert!(Header::decode(NodeId(0), &b[..100]).is_err());
    }

    proptest! {
        /// Garbage never panics the decoder, with or without a valid checksum.
        #[test]
        fn decoding_garbage_never_panics(mut b in proptest::collection::vec(any::<u8>(), 0..400), fix in any::<bool>()) {
            if fix && b.len() >= SUM_AT + 8 {
                b[..16].copy_from_slice(&[MAGIC.to_le_bytes(), VERSION.to_le_bytes()].concat());
                let sum = xxh3_64(&b[..SUM_AT]);
                b[SUM_AT..SUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
            }
            if let Ok(h) = Header::decode(NodeId(0), &b) {
                prop_assert!(h.check().is_ok());
            }
        }
    }
}
