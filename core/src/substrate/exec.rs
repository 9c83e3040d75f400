//! Driving futures without a runtime.
//!
//! Backends whose operations complete on their own (shared memory, RDMA with
//! completions polled inside the future) are driven by [`block_on`], a spin
//! loop on one thread. The simulator brings its own executor.

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};

/// Polls `fut` until it completes, spinning between polls, or yielding
/// the CPU where the task said it waits on another thread
/// ([`yield_to_peers`]).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        #[cfg(feature = "std")]
        if PEER_WAIT.with(|w| w.replace(false)) {
            std::thread::yield_now();
            continue;
        }
        core::hint::spin_loop();
    }
}

#[cfg(feature = "std")]
std::thread_local! {
    /// Set by [`yield_to_peers`], taken by [`block_on`].
    static PEER_WAIT: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// As [`yield_now`], and tells a spinning executor ([`block_on`]) that the
/// task waits on another thread or process of this machine (a server
/// beside memory), so it yields the CPU before polling again: where cores
/// are fewer than busy threads, a waiter that only spins holds off the
/// very thread it waits for. Executors without threads ignore it.
pub async fn yield_to_peers() {
    #[cfg(feature = "std")]
    PEER_WAIT.with(|w| w.set(true));
    yield_now().await
}

/// Polls `fut` once; `Some` if it completed.
pub fn poll_once<F: Future>(fut: core::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match fut.poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// A future that is pending once, then ready: lets a spinning executor
/// interleave other work (used by backends that wait for a deadline).
pub async fn yield_now() {
    let mut yielded = false;
    core::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// `fut`, its output passed through `f`.
///
/// A hand-written future: an `async` block that awaited `fut` would hold
/// it twice, as its capture and as the future it polls
/// (rust-lang/rust#62958), and everything that starts it would move both.
pub fn map<F: Future, T>(fut: F, f: impl FnOnce(F::Output) -> T) -> impl Future<Output = T> {
    Map { fut, f: Some(f) }
}

pin_project_lite::pin_project! {
    /// What [`map`] returns.
    struct Map<F, G> {
        #[pin]
        fut: F,
        f: Option<G>,
    }
}

impl<F: Future, T, G: FnOnce(F::Output) -> T> Future for Map<F, G> {
    type Output = T;

    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.project();
        let out = core::task::ready!(this.fut.poll(cx));
        match this.f.take() {
            Some(f) => Poll::Ready(f(out)),
            None => panic!("`map` polled after it completed"),
        }
    }
}

/// State too large to move by value (a client's writer-log directories
/// and slab: over 100 KiB), boxed where `alloc` is available, so that
/// moving its owner costs a pointer: an unoptimised build copies a struct
/// on every move, and a client's context moves through every connect.
pub struct Heavy<T>(#[cfg(feature = "alloc")] alloc::boxed::Box<T>, #[cfg(not(feature = "alloc"))] T);

impl<T> Heavy<T> {
    /// `t`, boxed where `alloc` is available.
    pub fn new(t: T) -> Self {
        #[cfg(feature = "alloc")]
        return Heavy(alloc::boxed::Box::new(t));
        #[cfg(not(feature = "alloc"))]
        return Heavy(t);
    }
}

impl<T> core::ops::Deref for Heavy<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> core::ops::DerefMut for Heavy<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// A future for a path an operation rarely takes (a retry, a slow path, a
/// write-back), boxed where `alloc` is available so that it does not
/// inflate the caller's future: async state machines are as large as their
/// largest awaited future, and every level that creates and moves one pays
/// a copy of its whole size on every call, taken or not.
///
/// `make` builds the future here, in a frame of its own, and not in the
/// caller's: a caller that built a large future itself would keep a stack
/// slot for it, and probe that much stack on every poll, taken or not.
#[cfg(feature = "alloc")]
#[inline(never)]
pub fn cold<F: Future>(make: impl FnOnce() -> F) -> Cold<F> {
    alloc::boxed::Box::pin(make())
}

/// Without `alloc`, the future itself.
#[cfg(not(feature = "alloc"))]
pub fn cold<F: Future>(make: impl FnOnce() -> F) -> Cold<F> {
    make()
}

/// The future a pinned [`Cold`] holds.
#[cfg(feature = "alloc")]
pub fn pin_cold<F>(cold: core::pin::Pin<&mut Cold<F>>) -> core::pin::Pin<&mut F> {
    cold.get_mut().as_mut()
}

/// The future a pinned [`Cold`] holds.
#[cfg(not(feature = "alloc"))]
pub fn pin_cold<F>(cold: core::pin::Pin<&mut Cold<F>>) -> core::pin::Pin<&mut F> {
    cold
}

/// What [`cold`] makes of a future `F`.
#[cfg(feature = "alloc")]
pub type Cold<F> = core::pin::Pin<alloc::boxed::Box<F>>;
/// What [`cold`] makes of a future `F`.
#[cfg(not(feature = "alloc"))]
pub type Cold<F> = F;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_on_drives_pending_futures() {
        let v = block_on(async {
            yield_now().await;
            yield_now().await;
            7
        });
        assert_eq!(v, 7);
    }
}
