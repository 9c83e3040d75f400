//! Running a few different futures at once: the paper's "in parallel".

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use crate::substrate::exec::map;

/// Runs `a` and `b` concurrently and returns both outputs.
///
/// A hand-written future, not an `async fn`: an `async fn` keeps its
/// arguments beside the pinned copies it polls (rust-lang/rust#62958), so
/// every `join2` would hold each future twice, and every level above it
/// would move twice its size when it starts it.
pub fn join2<A: Future, B: Future>(a: A, b: B) -> Join2<A, B> {
    Join2 { a, b, ra: None, rb: None }
}

pin_project_lite::pin_project! {
    /// What [`join2`] returns.
    #[must_use = "futures do nothing unless awaited"]
    pub struct Join2<A: Future, B: Future> {
        #[pin]
        a: A,
        #[pin]
        b: B,
        ra: Option<A::Output>,
        rb: Option<B::Output>,
    }
}

impl<A: Future, B: Future> Future for Join2<A, B> {
    type Output = (A::Output, B::Output);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.ra.is_none()
            && let Poll::Ready(v) = this.a.poll(cx)
        {
            *this.ra = Some(v);
        }
        if this.rb.is_none()
            && let Poll::Ready(v) = this.b.poll(cx)
        {
            *this.rb = Some(v);
        }
        // Outputs move only once both are there (they may be large).
        if this.ra.is_none() || this.rb.is_none() {
            return Poll::Pending;
        }
        match (this.ra.take(), this.rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            _ => Poll::Pending,
        }
    }
}

/// Runs three futures concurrently and returns all outputs.
pub fn join3<A: Future, B: Future, C: Future>(
    a: A,
    b: B,
    c: C,
) -> impl Future<Output = (A::Output, B::Output, C::Output)> {
    map(join2(join2(a, b), c), |((x, y), z)| (x, y, z))
}

/// Runs `futs` together, however many; their outputs in order.
#[cfg(feature = "alloc")]
pub async fn join_vec<F: Future>(futs: alloc::vec::Vec<F>) -> alloc::vec::Vec<F::Output> {
    use alloc::vec::Vec;
    let mut futs: Vec<Pin<alloc::boxed::Box<F>>> = futs.into_iter().map(alloc::boxed::Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    core::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(()) }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future completed")).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::substrate::exec::{block_on, yield_now};

    /// A future that holds 1 KiB across its await: large enough that a
    /// combinator holding it twice shows in its size.
    pub(crate) async fn big(v: u8) -> Result<u8, ()> {
        let buf = core::hint::black_box([v; 1024]);
        yield_now().await;
        Ok(buf[1023])
    }

    #[test]
    fn join_waits_for_both_and_keeps_order() {
        let (a, b) = block_on(join2(
            async {
                yield_now().await;
                1
            },
            async { 2 },
        ));
        assert_eq!((a, b), (1, 2));
        assert_eq!(block_on(join3(async { 1 }, async { 2 }, async { 3 })), (1, 2, 3));
        assert_eq!(block_on(map(big(7), |r| r.map(u32::from))), Ok(7));
    }

    /// Each combinator holds its futures once (an `async fn` taking them
    /// would hold them twice, rust-lang/rust#62958, and the levels above
    /// would move twice the bytes to start it).
    #[test]
    fn combinators_hold_each_future_once() {
        let one = size_of_val(&big(1));
        assert!(one >= 1024, "{one}");
        let two = size_of_val(&join2(big(1), big(2)));
        assert!(two < 2 * one + 64, "join2 of two {one}-byte futures: {two} bytes");
        let three = size_of_val(&join3(big(1), big(2), big(3)));
        assert!(three < 3 * one + 128, "join3 of three {one}-byte futures: {three} bytes");
        let mapped = size_of_val(&map(big(1), |r| r));
        assert!(mapped < one + 64, "map of a {one}-byte future: {mapped} bytes");
    }
}
