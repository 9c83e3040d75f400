//! A client-side cache of index lookups: key -> location and a small user
//! payload (SWARM-KV keeps the last metadata it saw there), so that a hit
//! costs no roundtrip.
//!
//! The cache is a hint: another client may have updated or removed the
//! mapping since. The caller validates what it finds at the location (SWARM-KV
//! sees a deleted or moved object) and then [`LocationCache::remove`]s the
//! entry and asks the index.
//!
//! Entries hold the key's bytes and are compared whole, so two keys never
//! share an entry (a 64-bit hash collision only costs a probe). Capacity is
//! fixed; when full, an insert evicts by the configured [`Eviction`]:
//! - [`Eviction::Lru`]: the entry used least recently;
//! - [`Eviction::Lfu`]: the entry used least often (a use is a hit or an
//!   insert), the least recently used among those.
//!
//! Both are O(1) per operation: entries sit in doubly linked lists, one per
//! use count in use (LFU; the "O(1) LFU" of Shah, Mitra and Matani) or a
//! single one (LRU), most recent first. Needs the `alloc` feature (a `Vec`
//! arena and a `hashbrown` table; memory grows with use up to the capacity).

use alloc::vec::Vec;

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_64;

/// The hash the cache files a key under (xxHash3 of its bytes), which it
/// keeps with the entry ([`LocationCache::get_hashed`]).
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// Which entry a full cache gives up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Eviction {
    /// Least recently used.
    Lru,
    /// Least frequently used (ties: least recently used).
    Lfu,
}

/// The shape of a cache.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CacheConfig {
    /// Most entries (0: the cache keeps nothing).
    pub capacity: usize,
    /// Longest key kept; longer keys are never cached.
    pub max_key: usize,
    /// What a full cache evicts.
    pub eviction: Eviction,
}

/// Counters since the cache was made.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CacheStats {
    /// [`LocationCache::get`] found the key.
    pub hits: u64,
    /// [`LocationCache::get`] did not.
    pub misses: u64,
    /// Entries given up to make room.
    pub evictions: u64,
}

const NIL: u32 = u32::MAX;

struct Slot<P> {
    hash: u64,
    key_len: u32,
    location: u64,
    /// `Some` while the slot holds an entry.
    payload: Option<P>,
    /// Neighbours in its list (towards the head = most recent, and the tail).
    prev: u32,
    next: u32,
    /// The list it is in.
    list: u32,
}

/// The entries with one use count, most recent at the head.
#[derive(Clone, Copy)]
struct List {
    uses: u64,
    head: u32,
    tail: u32,
    /// Neighbouring lists, by increasing use count.
    lower: u32,
    higher: u32,
}

/// The cache. `P` is the user payload kept with each location.
pub struct LocationCache<P> {
    cfg: CacheConfig,
    table: HashTable<u32>,
    slots: Vec<Slot<P>>,
    /// Key bytes: slot `i`'s at `i * max_key`.
    keys: Vec<u8>,
    free_slots: Vec<u32>,
    lists: Vec<List>,
    free_lists: Vec<u32>,
    /// The list of the fewest uses (evicted from first).
    lowest: u32,
    len: usize,
    stats: CacheStats,
}

fn key_of<'a, P>(keys: &'a [u8], max_key: usize, slots: &[Slot<P>], i: u32) -> &'a [u8] {
    let start = i as usize * max_key;
    let len = slots.get(i as usize).map_or(0, |s| s.key_len as usize);
    keys.get(start..start + len).unwrap_or(&[])
}

impl<P> LocationCache<P> {
    /// An empty cache (memory is taken as entries arrive). A capacity above
    /// `u32::MAX - 1` is taken as that.
    pub fn new(cfg: CacheConfig) -> Self {
        let cfg = CacheConfig { capacity: cfg.capacity.min(NIL as usize - 1), ..cfg };
        LocationCache {
            cfg,
            table: HashTable::new(),
            slots: Vec::new(),
            keys: Vec::new(),
            free_slots: Vec::new(),
            lists: Vec::new(),
            free_lists: Vec::new(),
            lowest: NIL,
            len: 0,
            stats: CacheStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> CacheConfig {
        self.cfg
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hit, miss and eviction counts.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        if key.len() > self.cfg.max_key {
            return None;
        }
        let (keys, slots, mk) = (&self.keys, &self.slots, self.cfg.max_key);
        self.table.find(key_hash(key), |&i| key_of(keys, mk, slots, i) == key).copied()
    }

    /// The key's location and payload, counting a use (and a hit or a miss).
    pub fn get(&mut self, key: &[u8]) -> Option<(u64, &mut P)> {
        self.get_hashed(key).map(|(location, _, payload)| (location, payload))
    }

    /// [`get`](Self::get), with the key's [`key_hash`], which the cache
    /// keeps: a store that needs the hash of a cached key (to check what it
    /// reads against the key) need not compute it again.
    pub fn get_hashed(&mut self, key: &[u8]) -> Option<(u64, u64, &mut P)> {
        let Some(i) = self.find(key) else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        self.touch(i);
        let s = &mut self.slots[i as usize];
        Some((s.location, s.hash, s.payload.as_mut()?))
    }

    /// The payload of a cached key whose [`key_hash`] is `hash` and that
    /// `is` accepts, without counting a use: for a store that learned
    /// something of a key it knows only by its hash (which keys may
    /// share; `is` tells them apart).
    pub fn find_hashed(&mut self, hash: u64, mut is: impl FnMut(&P) -> bool) -> Option<&mut P> {
        let slots = &self.slots;
        let i = *self.table.find(hash, |&i| {
            let s = &slots[i as usize];
            s.hash == hash && s.payload.as_ref().is_some_and(&mut is)
        })?;
        self.slots[i as usize].payload.as_mut()
    }

    /// The key's location and payload, without counting a use.
    pub fn peek(&self, key: &[u8]) -> Option<(u64, &P)> {
        let s = &self.slots[self.find(key)? as usize];
        Some((s.location, s.payload.as_ref()?))
    }

    /// Whether the key is cached.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.find(key).is_some()
    }

    /// Caches `key` -> (`location`, `payload`), replacing what it held (a
    /// use). When full, evicts one entry first and returns its location and
    /// payload. Keys longer than `max_key`, or a zero capacity, cache nothing.
    pub fn insert(&mut self, key: &[u8], location: u64, payload: P) -> Option<(u64, P)> {
        if let Some(i) = self.find(key) {
            let s = &mut self.slots[i as usize];
            s.location = location;
            s.payload = Some(payload);
            self.touch(i);
            return None;
        }
        if key.len() > self.cfg.max_key || self.cfg.capacity == 0 {
            return None;
        }
        let evicted = if self.len >= self.cfg.capacity {
            let victim = self.lists.get(self.lowest as usize).map(|l| l.tail);
            self.stats.evictions += 1;
            victim.and_then(|i| self.drop_slot(i))
        } else {
            None
        };
        let hash = key_hash(key);
        let slot =
            Slot { hash, key_len: key.len() as u32, location, payload: Some(payload), prev: NIL, next: NIL, list: NIL };
        let i = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.keys.resize(self.slots.len() * self.cfg.max_key, 0);
                (self.slots.len() - 1) as u32
            }
        };
        let start = i as usize * self.cfg.max_key;
        self.keys[start..start + key.len()].copy_from_slice(key);
        let slots = &self.slots;
        self.table.insert_unique(hash, i, |&j| slots[j as usize].hash);
        self.len += 1;
        // A new entry has one use (LFU), or is simply the most recent (LRU:
        // one list, of use count 0).
        let first = if self.cfg.eviction == Eviction::Lfu { 1 } else { 0 };
        let list = match self.lowest {
            l if l != NIL && self.lists[l as usize].uses == first => l,
            l => self.new_list(first, NIL, l),
        };
        self.push_front(list, i);
        evicted
    }

    /// Forgets the key; returns what it held.
    pub fn remove(&mut self, key: &[u8]) -> Option<(u64, P)> {
        let i = self.find(key)?;
        self.drop_slot(i)
    }

    /// Forgets everything (the counters stay).
    pub fn clear(&mut self) {
        self.table.clear();
        self.slots.clear();
        self.keys.clear();
        self.free_slots.clear();
        self.lists.clear();
        self.free_lists.clear();
        self.lowest = NIL;
        self.len = 0;
    }

    /// The key the next eviction would give up, if any.
    pub fn victim(&self) -> Option<&[u8]> {
        let l = self.lists.get(self.lowest as usize)?;
        Some(key_of(&self.keys, self.cfg.max_key, &self.slots, l.tail))
    }

    /// Takes entry `i` out of the table and its list.
    fn drop_slot(&mut self, i: u32) -> Option<(u64, P)> {
        let hash = self.slots.get(i as usize)?.hash;
        if let Ok(e) = self.table.find_entry(hash, |&j| j == i) {
            e.remove();
        }
        self.unlink(i);
        self.len -= 1;
        self.free_slots.push(i);
        let s = &mut self.slots[i as usize];
        Some((s.location, s.payload.take()?))
    }

    /// A use of entry `i`: to the head of the next list (LFU) or of its own
    /// (LRU, or a saturated count).
    fn touch(&mut self, i: u32) {
        let l = self.slots[i as usize].list;
        let List { uses, higher, .. } = self.lists[l as usize];
        if self.cfg.eviction == Eviction::Lru || uses == u64::MAX {
            if self.slots[i as usize].prev != NIL {
                // Not the head, so its list keeps an entry.
                self.unlink(i);
                self.push_front(l, i);
            }
            return;
        }
        let target = if higher != NIL && self.lists[higher as usize].uses == uses + 1 {
            higher
        } else {
            self.new_list(uses + 1, l, higher)
        };
        self.unlink(i);
        self.push_front(target, i);
    }

    /// A new empty list of `uses` between lists `lower` and `higher` (NIL: an end).
    fn new_list(&mut self, uses: u64, lower: u32, higher: u32) -> u32 {
        let list = List { uses, head: NIL, tail: NIL, lower, higher };
        let l = match self.free_lists.pop() {
            Some(l) => {
                self.lists[l as usize] = list;
                l
            }
            None => {
                self.lists.push(list);
                (self.lists.len() - 1) as u32
            }
        };
        match lower {
            NIL => self.lowest = l,
            x => self.lists[x as usize].higher = l,
        }
        if higher != NIL {
            self.lists[higher as usize].lower = l;
        }
        l
    }

    fn push_front(&mut self, l: u32, i: u32) {
        let head = self.lists[l as usize].head;
        let s = &mut self.slots[i as usize];
        (s.prev, s.next, s.list) = (NIL, head, l);
        match head {
            NIL => self.lists[l as usize].tail = i,
            h => self.slots[h as usize].prev = i,
        }
        self.lists[l as usize].head = i;
    }

    /// Takes entry `i` out of its list, and the list out if it empties.
    fn unlink(&mut self, i: u32) {
        let Slot { prev, next, list: l, .. } = self.slots[i as usize];
        match prev {
            NIL => self.lists[l as usize].head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.lists[l as usize].tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        let s = &mut self.slots[i as usize];
        (s.prev, s.next, s.list) = (NIL, NIL, NIL);
        let List { head, lower, higher, .. } = self.lists[l as usize];
        if head == NIL {
            match lower {
                NIL => self.lowest = higher,
                x => self.lists[x as usize].higher = higher,
            }
            if higher != NIL {
                self.lists[higher as usize].lower = lower;
            }
            self.free_lists.push(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    fn cache(capacity: usize, eviction: Eviction) -> LocationCache<[u8; 4]> {
        LocationCache::new(CacheConfig { capacity, max_key: 8, eviction })
    }

    fn keys<P>(c: &LocationCache<P>, all: &[&[u8]]) -> Vec<Vec<u8>> {
        all.iter().filter(|k| c.contains(k)).map(|k| k.to_vec()).collect()
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut c = cache(3, Eviction::Lru);
        assert_eq!(c.insert(b"a", 1, [1; 4]), None);
        assert_eq!(c.insert(b"b", 2, [2; 4]), None);
        assert_eq!(c.insert(b"c", 3, [3; 4]), None);
        assert_eq!(c.victim(), Some(&b"a"[..]));
        // Using "a" makes "b" the oldest; peeking uses nothing.
        assert_eq!(c.get(b"a").map(|(l, p)| (l, *p)), Some((1, [1; 4])));
        assert_eq!(c.peek(b"b").map(|(l, p)| (l, *p)), Some((2, [2; 4])));
        assert_eq!(c.insert(b"d", 4, [4; 4]), Some((2, [2; 4])), "b goes");
        assert_eq!(c.insert(b"e", 5, [5; 4]), Some((3, [3; 4])), "then c");
        // Replacing an entry is a use.
        assert_eq!(c.insert(b"a", 10, [9; 4]), None);
        assert_eq!(c.insert(b"f", 6, [6; 4]), Some((4, [4; 4])), "then d, not the refreshed a");
        assert_eq!(keys(&c, &[b"a", b"b", b"c", b"d", b"e", b"f"]), vec![b"a".to_vec(), b"e".to_vec(), b"f".to_vec()]);
        assert_eq!(c.peek(b"a").map(|(l, _)| l), Some(10));
        assert_eq!(c.len(), 3);
        assert_eq!(c.stats(), CacheStats { hits: 1, misses: 0, evictions: 3 });
    }

    #[test]
    fn lfu_evicts_the_least_frequently_used_then_the_oldest() {
        let mut c = cache(3, Eviction::Lfu);
        c.insert(b"a", 1, [1; 4]);
        c.insert(b"b", 2, [2; 4]);
        c.insert(b"c", 3, [3; 4]);
        for _ in 0..3 {
            c.get(b"a");
        }
        c.get(b"b");
        // Uses: a 4, b 2, c 1.
        assert_eq!(c.victim(), Some(&b"c"[..]));
        assert_eq!(c.insert(b"d", 4, [4; 4]), Some((3, [3; 4])), "c (1 use) goes");
        // d has 1 use: it goes next, even though it is the newest.
        assert_eq!(c.insert(b"e", 5, [5; 4]), Some((4, [4; 4])));
        c.get(b"e");
        // Uses: a 4, b 2, e 2; b and e tie, b was used longer ago.
        assert_eq!(c.insert(b"f", 6, [6; 4]), Some((2, [2; 4])));
        assert_eq!(c.insert(b"g", 7, [7; 4]), Some((6, [6; 4])));
        assert_eq!(
            keys(&c, &[b"a", b"b", b"c", b"d", b"e", b"f", b"g"]),
            vec![b"a".to_vec(), b"e".to_vec(), b"g".to_vec()]
        );
        assert_eq!(c.get(b"zz"), None);
        assert_eq!(c.stats().misses, 1);
    }

    #[test]
    fn remove_clear_long_keys_and_zero_capacity() {
        let mut c = cache(2, Eviction::Lfu);
        c.insert(b"a", 1, [1; 4]);
        c.insert(b"b", 2, [2; 4]);
        assert_eq!(c.remove(b"a"), Some((1, [1; 4])));
        assert_eq!(c.remove(b"a"), None);
        assert_eq!(c.insert(b"c", 3, [3; 4]), None, "room was made by the removal");
        assert_eq!(c.insert(b"123456789", 9, [9; 4]), None);
        assert!(!c.contains(b"123456789"), "keys over max_key are not cached");
        c.clear();
        assert!(c.is_empty() && c.victim().is_none());
        c.insert(b"x", 1, [0; 4]);
        assert_eq!(c.get(b"x").map(|(l, _)| l), Some(1));
        let mut z = cache(0, Eviction::Lru);
        assert_eq!(z.insert(b"a", 1, [0; 4]), None);
        assert!(z.is_empty());
        // The payload is the caller's to change.
        if let Some((_, p)) = c.get(b"x") {
            *p = [7; 4];
        }
        assert_eq!(c.peek(b"x").map(|(_, p)| *p), Some([7; 4]));
    }

    /// A slow, obviously right cache: every entry with its use count and
    /// the time of its last use.
    struct Model {
        cap: usize,
        lfu: bool,
        tick: u64,
        entries: Vec<(Vec<u8>, u64, u64, u64)>,
    }

    impl Model {
        fn use_at(&mut self, i: usize) {
            self.tick += 1;
            self.entries[i].2 += 1;
            self.entries[i].3 = self.tick;
        }
        fn get(&mut self, k: &[u8]) -> Option<u64> {
            let i = self.entries.iter().position(|e| e.0 == k)?;
            self.use_at(i);
            Some(self.entries[i].1)
        }
        fn insert(&mut self, k: &[u8], loc: u64) -> Option<u64> {
            if let Some(i) = self.entries.iter().position(|e| e.0 == k) {
                self.entries[i].1 = loc;
                self.use_at(i);
                return None;
            }
            let mut out = None;
            if self.entries.len() == self.cap {
                let lfu = self.lfu;
                let v = (0..self.entries.len())
                    .min_by_key(|&i| (if lfu { self.entries[i].2 } else { 0 }, self.entries[i].3))
                    .unwrap();
                out = Some(self.entries.remove(v).1);
            }
            self.tick += 1;
            self.entries.push((k.to_vec(), loc, 1, self.tick));
            out
        }
        fn remove(&mut self, k: &[u8]) -> Option<u64> {
            let i = self.entries.iter().position(|e| e.0 == k)?;
            Some(self.entries.remove(i).1)
        }
    }

    proptest! {
        #[test]
        fn matches_a_naive_model(lfu in any::<bool>(), cap in 1usize..6,
                                 ops in proptest::collection::vec((0u8..3, 0u8..9, any::<u64>()), 1..200)) {
            let eviction = if lfu { Eviction::Lfu } else { Eviction::Lru };
            let mut c: LocationCache<u64> = LocationCache::new(CacheConfig { capacity: cap, max_key: 4, eviction });
            let mut m = Model { cap, lfu, tick: 0, entries: Vec::new() };
            for (op, k, loc) in ops {
                let key = [b'k', k];
                match op {
                    0 => prop_assert_eq!(c.get(&key).map(|(l, p)| { assert_eq!(*p, l); l }), m.get(&key)),
                    1 => prop_assert_eq!(c.insert(&key, loc, loc).map(|(l, _)| l), m.insert(&key, loc)),
                    _ => prop_assert_eq!(c.remove(&key).map(|(l, _)| l), m.remove(&key)),
                }
                prop_assert_eq!(c.len(), m.entries.len());
            }
        }
    }
}
