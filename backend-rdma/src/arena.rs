//! Which bytes of the client's registered buffer arena belong to which
//! operation.
//!
//! Registering memory with the NIC costs microseconds and pins pages, so a
//! client registers one arena when it connects and carves the local side of
//! every work request from it: power-of-two chunks from [`MIN_CHUNK`] to
//! [`MAX_CHUNK`] bytes, aligned to [`MIN_CHUNK`] (so a CAS result is
//! aligned), taken from a free list of their size or cut fresh from the
//! untouched end. A chunk goes back only when the completion of the chain
//! that used it has been polled, even if the operation was abandoned: the
//! NIC may write into it until then.
//!
//! Chunks are never split or merged. When the untouched end is used up and
//! a size has no free chunk, the request waits; once no chunk at all is
//! held, the arena starts over from empty, so a client whose early traffic
//! was all small chunks can still get a large one later.

/// The smallest chunk (a cache line).
pub const MIN_CHUNK: u32 = 64;
/// The largest chunk, and so the largest piece one work request moves;
/// longer transfers are split into several work requests.
pub const MAX_CHUNK: u32 = 1 << 20;
const CLASSES: usize = (MAX_CHUNK.trailing_zeros() - MIN_CHUNK.trailing_zeros() + 1) as usize;

/// A chunk of the arena: its offset and size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of the first byte in the arena.
    pub at: u32,
    class: u8,
}

impl Chunk {
    /// Bytes in the chunk.
    pub fn size(&self) -> u32 {
        MIN_CHUNK << self.class
    }
}

/// The chunk allocator of one arena.
#[derive(Debug)]
pub struct Arena {
    size: u32,
    /// First byte never handed out since the last start-over.
    fresh: u32,
    free: [Vec<u32>; CLASSES],
    held: usize,
}

impl Arena {
    /// The allocator of an arena of `size` bytes.
    pub fn new(size: u32) -> Arena {
        Arena { size, fresh: 0, free: Default::default(), held: 0 }
    }

    /// The most bytes one request may ask for: [`MAX_CHUNK`], or what a
    /// quarter of the arena holds, so that a request always fits once the
    /// others have let go.
    pub fn largest(&self) -> u32 {
        MAX_CHUNK.min(prev_power_of_two(self.size / 4)).max(MIN_CHUNK.min(self.size))
    }

    /// A chunk of at least `len` bytes (`1..=largest()`), or `None` until
    /// more chunks are freed.
    pub fn alloc(&mut self, len: u32) -> Option<Chunk> {
        if len == 0 || len > self.largest() {
            return None;
        }
        let class = len.max(MIN_CHUNK).next_power_of_two().trailing_zeros() - MIN_CHUNK.trailing_zeros();
        let size = MIN_CHUNK << class;
        let at = match self.free[class as usize].pop() {
            Some(at) => at,
            None if self.size - self.fresh >= size => {
                self.fresh += size;
                self.fresh - size
            }
            None if self.held == 0 => {
                // Nothing is held: every free list describes empty space.
                self.reset();
                self.fresh = size;
                0
            }
            None => return None,
        };
        self.held += 1;
        Some(Chunk { at, class: class as u8 })
    }

    /// Forgets every free chunk and starts cutting from the beginning
    /// again. Only while nothing is held (otherwise nothing happens).
    pub fn reset(&mut self) {
        if self.held == 0 {
            self.free.iter_mut().for_each(Vec::clear);
            self.fresh = 0;
        }
    }

    /// Gives `chunk` back.
    pub fn free(&mut self, chunk: Chunk) {
        debug_assert!(self.held > 0, "freed more chunks than were handed out");
        self.held -= 1;
        self.free[chunk.class as usize].push(chunk.at);
    }

    /// Chunks handed out and not freed.
    pub fn held(&self) -> usize {
        self.held
    }
}

fn prev_power_of_two(n: u32) -> u32 {
    if n == 0 { 0 } else { 1 << (31 - n.leading_zeros()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_round_up_to_a_power_of_two_of_at_least_a_cache_line() {
        let mut a = Arena::new(4 << 20);
        assert_eq!(a.alloc(1).unwrap().size(), 64);
        assert_eq!(a.alloc(65).unwrap().size(), 128);
        assert_eq!(a.alloc(MAX_CHUNK).unwrap().size(), MAX_CHUNK);
        assert_eq!(a.alloc(MAX_CHUNK + 1), None);
        assert_eq!(a.alloc(0), None);
        assert_eq!(a.largest(), MAX_CHUNK);
        assert_eq!(Arena::new(1 << 16).largest(), 1 << 14);
    }

    #[test]
    fn freed_chunks_are_reused_and_a_full_arena_waits() {
        let mut a = Arena::new(256);
        let (x, y, z, w) = (a.alloc(64).unwrap(), a.alloc(64).unwrap(), a.alloc(64).unwrap(), a.alloc(64).unwrap());
        assert_eq!(a.alloc(64), None, "full");
        a.free(y);
        assert_eq!(a.alloc(10), Some(y));
        for c in [x, y, z, w] {
            a.free(c);
        }
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn an_empty_arena_starts_over_for_a_size_it_has_no_chunk_of() {
        let mut a = Arena::new(1 << 12);
        let small: Vec<_> = (0..64).map(|_| a.alloc(64).unwrap()).collect();
        let big = a.largest();
        assert_eq!(a.alloc(big), None, "all cut into small chunks, some held");
        small.into_iter().for_each(|c| a.free(c));
        let c = a.alloc(big).expect("nothing held: starts over");
        assert_eq!(c.at, 0);
        // The small chunks' old offsets are forgotten: no overlap with `c`.
        let d = a.alloc(64).unwrap();
        assert!(d.at >= c.at + c.size());
    }

    proptest! {
        /// Chunks held at once never overlap and stay inside the arena.
        #[test]
        fn held_chunks_never_overlap(steps in proptest::collection::vec((any::<bool>(), 1u32..5000), 1..300)) {
            let size = 1 << 14;
            let mut a = Arena::new(size);
            let mut held: Vec<Chunk> = Vec::new();
            for (take, len) in steps {
                if take || held.is_empty() {
                    if let Some(c) = a.alloc(len) {
                        prop_assert!(c.size() >= len && c.at + c.size() <= size && c.at % MIN_CHUNK == 0);
                        for h in &held {
                            prop_assert!(c.at + c.size() <= h.at || h.at + h.size() <= c.at, "{c:?} overlaps {h:?}");
                        }
                        held.push(c);
                    } else {
                        prop_assert!(!held.is_empty() || len > a.largest(), "refused {len} with nothing held");
                    }
                } else {
                    let c = held.swap_remove(len as usize % held.len());
                    a.free(c);
                }
                prop_assert_eq!(a.held(), held.len());
            }
        }
    }
}
