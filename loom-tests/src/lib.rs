//! Loom model checks of code that runs over the shared-memory backend.
//!
//! The library holds the small algorithms under test, written against the
//! core's [`Memory`] interface exactly as protocol code is, and (under loom)
//! the model runner; the checks are in `tests/` and only exist when built
//! with `--cfg loom`, where `swarm-backend-shm` keeps its words in loom
//! atomics:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release
//! ```
//!
//! Without `--cfg loom` each test target compiles to one test that does
//! nothing but say so.
#![warn(missing_docs)]

use swarm_core::{MemError, Memory, RemoteAddr};

/// Raises the CAS word at `addr` to `value` if it is smaller: a max register
/// emulated with compare-and-swap, as protocols keep timestamps. Returns the
/// word's value afterwards as this writer knows it (at least `value`).
///
/// Starts from the guess 0 and follows what each failed CAS returns: `cur`
/// always holds a value the word had, so the loop ends when the word is
/// already at least `value`, or when the swap succeeded.
pub async fn raise_max<M: Memory>(mem: &M, addr: RemoteAddr, value: u64) -> Result<u64, MemError> {
    let mut cur = 0;
    loop {
        if cur >= value {
            return Ok(cur);
        }
        let prev = mem.cas(addr, cur, value).await?;
        if prev == cur {
            return Ok(value);
        }
        cur = prev;
    }
}

/// A deliberately wrong max register: a blind write, which can lower the
/// value when writers race. It exists to show that the loom check catches
/// the bug.
pub async fn blind_write_max<M: Memory>(mem: &M, addr: RemoteAddr, value: u64) -> Result<u64, MemError> {
    mem.write(addr, &value.to_le_bytes()).await?;
    Ok(value)
}

/// Explores every execution of `f` with loom (the models here are small:
/// tens of executions), unless `LOOM_MAX_PREEMPTIONS` bounds the
/// preemptions per execution. Returns how many executions were explored, so
/// that a check can make sure it was not vacuous.
#[cfg(loom)]
pub fn explore(f: impl Fn() + Sync + Send + 'static) -> usize {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // A plain (not modelled) counter of executions.
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    loom::model::Builder::new().check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f()
    });
    runs.load(Ordering::Relaxed)
}
