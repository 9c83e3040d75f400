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
//! operation works on a `Known` unpacked into one place of its client
//! ([`Cached::load`]), and what it learned (the per-replica cache) is
//! written back ([`Cached::keep`]).

use alloc::boxed::Box;

use crate::index::Entry;
#[cfg(doc)]
use crate::substrate::quorum::MAX_REPLICAS;
use crate::swarm::inout::{Layout, ReplicaCache};
use crate::swarm::maxreg::{PACKED, PackedRegister, RegCache, Register};
use crate::{NodeId, RemoteAddr};

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

impl Known {
    /// Knowledge of no key: a place for [`Cached::load`] to fill.
    pub fn blank(layout: Layout) -> Known {
        let entry = Entry { location: 0, slot: RemoteAddr::new(NodeId(0), 0), word: 0 };
        Known { reg: Register { layout, replicas: heapless::Vec::new() }, rc: RegCache::default(), entry }
    }
}

/// Replicas a [`Cached`] keeps inline ([`PACKED`]).
pub(super) const INLINE: usize = PACKED;

/// A [`Known`] as the location cache keeps it.
pub(super) enum Cached {
    /// A register of at most [`INLINE`] replicas.
    Inline(Compact),
    /// A larger one (5 or 7 replicas), as it is: one pointer more to follow.
    Boxed(Box<Known>),
}

/// A [`Known`] of at most [`INLINE`] replicas, without the empty room,
/// and without the layout's tag (the key's hash, which the location cache
/// keeps with the entry).
pub(super) struct Compact {
    reg: PackedRegister,
    entry: Entry,
    rc: [ReplicaCache; INLINE],
}

impl Cached {
    /// Keeps `k`.
    pub fn new(k: Known) -> Cached {
        let Some(reg) = PackedRegister::pack(&k.reg) else { return Cached::Boxed(Box::new(k)) };
        let mut rc = [ReplicaCache::default(); INLINE];
        rc[..reg.len()].copy_from_slice(&k.rc.replicas[..reg.len()]);
        Cached::Inline(Compact { reg, entry: k.entry, rc })
    }

    /// What is kept, whole, for the key whose hash is `tag`.
    pub fn known(&self, tag: u64) -> Known {
        match self {
            Cached::Inline(c) => {
                let mut k = Known::blank(c.reg.layout(tag));
                self.load(&mut k, tag);
                k
            }
            Cached::Boxed(k) => Known::clone(k),
        }
    }

    /// Copies what is kept over `k`, for an operation to work on (then
    /// [`Cached::keep`]): a client unpacks every key into the same place,
    /// which stays in its first-level cache. `tag` is the key's hash.
    pub fn load(&self, k: &mut Known, tag: u64) {
        match self {
            Cached::Inline(c) => {
                let n = c.reg.len();
                c.reg.unpack_into(&mut k.reg, tag);
                k.rc.replicas[..n].copy_from_slice(&c.rc[..n]);
                k.rc.replicas[n..].fill(ReplicaCache::default());
                k.entry = c.entry;
            }
            Cached::Boxed(b) => k.clone_from(b),
        }
    }

    /// Keeps what an operation on [`Cached::load`]'s copy learned of the
    /// replicas (`rc`, the only part of a key's knowledge that changes).
    pub fn keep(&mut self, k: &Known) {
        match self {
            Cached::Inline(c) => {
                let n = c.reg.len();
                c.rc[..n].copy_from_slice(&k.rc.replicas[..n]);
            }
            Cached::Boxed(b) => b.rc = k.rc.clone(),
        }
    }

    /// Whether the key has a replica at `base` on `node`.
    pub fn has(&self, node: NodeId, base: u64) -> bool {
        self.replica(node, base).is_some()
    }

    /// Notes that this client's word on the key's replica at `base` on
    /// `node` is now `new`, if what is kept says `old` (recycling changed
    /// it: [`crate::swarm::recycle::Rewrite`]).
    pub fn rewritten(&mut self, node: NodeId, base: u64, old: u64, new: u64) {
        let Some(i) = self.replica(node, base) else { return };
        let c = match self {
            Cached::Inline(c) => &mut c.rc[i],
            Cached::Boxed(k) => &mut k.rc.replicas[i],
        };
        if c.mine == old {
            c.mine = new;
        }
    }

    fn replica(&self, node: NodeId, base: u64) -> Option<usize> {
        match self {
            Cached::Inline(c) => c.reg.position(node, base),
            Cached::Boxed(k) => k.reg.replicas.iter().position(|r| r.node == node && r.base == base),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::substrate::quorum::MAX_REPLICAS;
    use crate::swarm::inout::Replica;
    use crate::swarm::meta::Meta;

    fn known(n: usize, seed: u64) -> Known {
        let mut reg = Register {
            layout: Layout::new(1 + (seed % 4) as u32, 100 + seed % 50).unwrap().tagged(seed.rotate_left(5)),
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
            prop_assert_eq!(c.known(k.reg.layout.tag), k.clone());
            // Loaded over another key's knowledge: nothing of it is left.
            let mut other = known(MAX_REPLICAS + 1 - n, !seed);
            c.load(&mut other, k.reg.layout.tag);
            prop_assert_eq!(other, k);
        }

        /// What an operation learns of the replicas is kept.
        #[test]
        fn an_operation_s_knowledge_is_kept(n in 1..=MAX_REPLICAS, seed in any::<u64>(), learned in any::<u64>()) {
            let k = known(n, seed);
            let mut c = Cached::new(k.clone());
            let mut work = known(MAX_REPLICAS, 1);
            c.load(&mut work, k.reg.layout.tag);
            work.rc.replicas[n - 1].max = Meta(learned);
            work.rc.replicas[0].mine = learned;
            c.keep(&work);
            let mut want = k.clone();
            want.rc.replicas[n - 1].max = Meta(learned);
            want.rc.replicas[0].mine = learned;
            prop_assert_eq!(c.known(k.reg.layout.tag), want);
        }
    }
}
