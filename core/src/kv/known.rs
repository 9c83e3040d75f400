//! What a SWARM-KV or DM-ABD client knows of a key ([`Known`]: its register,
//! its own knowledge of each replica, its index entry), and the compact
//! form its location cache keeps that in ([`Cached`]).
//!
//! A `Known` has room for [`MAX_REPLICAS`] replicas twice over (the
//! register's objects, and the max register's per-replica cache), 312
//! bytes, of which a register of the common three replicas uses a third.
//! The location cache keeps one per key, so over 100 000 keys it took 34 MB,
//! more than this machine's whole last-level cache (32 MB), where RAW's
//! entries take 7 MB: a get then waited on main memory for the lines of its
//! entry where RAW's came from the cache. A `Cached` keeps a register of up
//! to [`INLINE`] replicas in 128 bytes (larger ones boxed, whole); an
//! operation works on a `Known` unpacked on its own stack ([`Cached::known`])
//! and what it learned (the per-replica cache) is written back
//! ([`Cached::keep`]).

use alloc::boxed::Box;

use crate::NodeId;
use crate::index::Entry;
use crate::inout::{Layout, Replica, ReplicaCache};
use crate::maxreg::{RegCache, Register};
#[cfg(doc)]
use crate::quorum::MAX_REPLICAS;

/// What a client knows of a key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) struct Known {
    /// Its register (from its descriptor; never changes).
    pub reg: Register,
    /// What this client knows of each replica (changes with every operation).
    pub rc: RegCache,
    /// Its index entry when this client looked it up.
    pub entry: Entry,
}

/// Replicas a [`Cached`] keeps inline: 2f+1 for f = 1, the paper's
/// default and the store's.
pub(super) const INLINE: usize = 3;

/// A [`Known`] as the location cache keeps it.
pub(super) enum Cached {
    /// A register of at most [`INLINE`] replicas.
    Inline(Compact),
    /// A larger one (5 or 7 replicas), as it is: one pointer more to follow.
    Boxed(Box<Known>),
}

/// A [`Known`] of at most [`INLINE`] replicas, without the empty room.
pub(super) struct Compact {
    layout: Layout,
    entry: Entry,
    len: u8,
    nodes: [NodeId; INLINE],
    bases: [u64; INLINE],
    rc: [ReplicaCache; INLINE],
}

impl Cached {
    /// Keeps `k`.
    pub fn new(k: Known) -> Cached {
        let n = k.reg.replicas.len();
        if n > INLINE {
            return Cached::Boxed(Box::new(k));
        }
        let mut c = Compact {
            layout: k.reg.layout,
            entry: k.entry,
            len: n as u8,
            nodes: [NodeId(0); INLINE],
            bases: [0; INLINE],
            rc: [ReplicaCache::default(); INLINE],
        };
        for (i, r) in k.reg.replicas.iter().enumerate() {
            (c.nodes[i], c.bases[i], c.rc[i]) = (r.node, r.base, k.rc.replicas[i]);
        }
        Cached::Inline(c)
    }

    /// What is kept, whole: a copy to work on (on the stack, where an
    /// operation finds it in the first-level cache), then [`Cached::keep`].
    pub fn known(&self) -> Known {
        match self {
            Cached::Inline(c) => c.unpack(),
            Cached::Boxed(k) => Known::clone(k),
        }
    }

    /// Keeps what an operation on [`Cached::known`]'s copy learned of the
    /// replicas (`rc`, the only part of a key's knowledge that changes).
    pub fn keep(&mut self, k: &Known) {
        match self {
            Cached::Inline(c) => {
                let n = usize::from(c.len);
                c.rc[..n].copy_from_slice(&k.rc.replicas[..n]);
            }
            Cached::Boxed(b) => b.rc = k.rc.clone(),
        }
    }
}

impl Compact {
    fn unpack(&self) -> Known {
        let n = usize::from(self.len);
        let mut reg = Register { layout: self.layout, replicas: heapless::Vec::new() };
        let mut rc = RegCache::default();
        for i in 0..n {
            // Cannot fail: at most INLINE replicas, fewer than MAX_REPLICAS.
            let _ = reg.replicas.push(Replica { node: self.nodes[i], base: self.bases[i] });
        }
        rc.replicas[..n].copy_from_slice(&self.rc[..n]);
        Known { reg, rc, entry: self.entry }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::RemoteAddr;
    use crate::meta::Meta;
    use crate::quorum::MAX_REPLICAS;

    fn known(n: usize, seed: u64) -> Known {
        let mut reg = Register {
            layout: Layout::new(1 + (seed % 4) as u32, 100 + seed % 50).unwrap(),
            replicas: heapless::Vec::new(),
        };
        let mut rc = RegCache::default();
        for i in 0..n {
            let x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i as u32 * 7);
            let _ = reg.replicas.push(Replica { node: NodeId(i as u16 * 3 + 1), base: x >> 8 });
            rc.replicas[i] = ReplicaCache { max: Meta(x), mine: x ^ 0xff };
        }
        let entry = Entry { location: seed, slot: RemoteAddr::new(NodeId(0), seed << 3), word: !seed };
        Known { reg, rc, entry }
    }

    #[test]
    fn the_common_register_is_kept_in_128_bytes() {
        assert!(size_of::<Cached>() <= 128, "{} bytes", size_of::<Cached>());
        assert!(size_of::<Known>() > 2 * size_of::<Cached>(), "nothing to gain any more");
    }

    proptest! {
        /// Whatever the replica count, what comes back is what was kept,
        /// and the common counts are kept inline.
        #[test]
        fn kept_whole(n in 1..=MAX_REPLICAS, seed in any::<u64>()) {
            let k = known(n, seed);
            let c = Cached::new(k.clone());
            prop_assert_eq!(matches!(c, Cached::Inline(_)), n <= INLINE);
            prop_assert_eq!(c.known(), k);
        }

        /// What an operation learns of the replicas is kept.
        #[test]
        fn an_operation_s_knowledge_is_kept(n in 1..=MAX_REPLICAS, seed in any::<u64>(), learned in any::<u64>()) {
            let k = known(n, seed);
            let mut c = Cached::new(k.clone());
            let mut work = c.known();
            work.rc.replicas[n - 1].max = Meta(learned);
            work.rc.replicas[0].mine = learned;
            c.keep(&work);
            let mut want = k.clone();
            want.rc.replicas[n - 1].max = Meta(learned);
            want.rc.replicas[0].mine = learned;
            prop_assert_eq!(c.known(), want);
        }
    }
}
