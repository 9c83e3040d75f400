//! A majority that meets no failure costs no heap allocation: the first
//! futures of `quorum_first` are kept inline, and only replicas started
//! after a failure are boxed. Counted with a global allocator of this test
//! binary alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use swarm_core::substrate::exec::{block_on, yield_now};
use swarm_core::substrate::late::Plan;
use swarm_core::substrate::quorum::quorum_first;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; the
// counter is the only addition.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Replica `i` answers after one poll: `Ok(i)`, or `Err` if it is in `down`.
async fn replica(i: usize, down: &[usize]) -> Result<usize, ()> {
    yield_now().await;
    if down.contains(&i) { Err(()) } else { Ok(i) }
}

/// Allocations made by a `quorum_first` of `n` replicas needing `need`.
fn allocations(n: usize, need: usize, down: &[usize]) -> (usize, usize) {
    let before = ALLOCS.load(Ordering::Relaxed);
    let replies = block_on(quorum_first(n, need, Plan::trusting(u16::MAX), |i| replica(i, down), |_, _| {}));
    let made = ALLOCS.load(Ordering::Relaxed) - before;
    (made, replies.ok)
}

#[test]
fn a_majority_without_failures_allocates_nothing() {
    assert_eq!(allocations(3, 2, &[]), (0, 2), "three replicas: the majority is inline");
    // Past the inline ones, each started replica is boxed: one for five
    // replicas, two more after two failures.
    assert_eq!(allocations(5, 3, &[]), (1, 3));
    assert_eq!(allocations(5, 3, &[0, 2]), (3, 3));
    assert_eq!(allocations(3, 2, &[1]), (1, 2), "a failure starts the third replica, boxed");
}
