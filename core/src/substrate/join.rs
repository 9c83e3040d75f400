//! Running a few different futures at once: the paper's "in parallel".

use core::future::{Future, poll_fn};
use core::pin::pin;
use core::task::Poll;

/// Runs `a` and `b` concurrently and returns both outputs.
pub async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        // Outputs move only once both are there (they may be large).
        if ra.is_none() || rb.is_none() {
            return Poll::Pending;
        }
        match (ra.take(), rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            _ => Poll::Pending,
        }
    })
    .await
}

/// Runs three futures concurrently and returns all outputs.
pub async fn join3<A: Future, B: Future, C: Future>(a: A, b: B, c: C) -> (A::Output, B::Output, C::Output) {
    let ((x, y), z) = join2(join2(a, b), c).await;
    (x, y, z)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::substrate::exec::{block_on, yield_now};

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
    }
}
