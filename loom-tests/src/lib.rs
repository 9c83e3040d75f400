//! Loom model checks of code that runs over the shared-memory backend.
//!
//! The library holds the small algorithms under test and deliberately wrong
//! variants of the core's (each check shows that it catches its wrong
//! variant), written against the core's [`Memory`] interface exactly as
//! protocol code is, and (under loom) the model runners; the checks are in
//! `tests/` and only exist when built with `--cfg loom`, where
//! `swarm-backend-shm` keeps its words in loom atomics:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release
//! ```
//!
//! Without `--cfg loom` the test targets compile to nothing and report no
//! tests: they check nothing then, and do not pretend to. CI runs them with
//! the flag (`.ci/run`).
#![warn(missing_docs)]

use swarm_core::objects::max::MaxOutcome;
use swarm_core::objects::tslock::{Mode, pack, ts_of};
use swarm_core::substrate::memory::{read_word, word_at};
use swarm_core::substrate::quorum::{majority, quorum};
use swarm_core::swarm::inout::{Layout, Replica};
use swarm_core::swarm::meta::Meta;
use swarm_core::systems::clover::buffer::{self, Version};
use swarm_core::{MemError, Memory, RemoteAddr};

/// A deliberately wrong max register: a blind write, which can lower the
/// value when writers race. It exists to show that the loom check catches
/// the bug.
pub async fn blind_write_max<M: Memory>(mem: &M, addr: RemoteAddr, value: u64) -> Result<u64, MemError> {
    mem.write(addr, &value.to_le_bytes()).await?;
    Ok(value)
}

/// A deliberately wrong release of a pDPM-Direct lock, with the signature
/// of the core's (`swarm_core::systems::pdpm_direct::lock::swing` to 0):
/// the paper's unlock, a WRITE of 0 (pDPM §4.1, step 4). Correct while no
/// lock is taken over, but a holder whose lease ran out frees the lock of
/// the client that took it over. It exists to show that the loom check of
/// the lock catches it.
pub async fn write_unlock<M: Memory>(mem: &M, lock: RemoteAddr) -> Result<bool, MemError> {
    mem.write(lock, &0u64.to_le_bytes()).await?;
    Ok(true)
}

/// A deliberately wrong MAX with `swarm_core::objects::max::cas_max`'s signature:
/// read the word, and write the value over it if it was smaller. Correct
/// when alone, but two writers that both read before either writes lose the
/// larger value. It exists to show that the loom check of `cas_max` catches
/// the bug (`seed` is ignored).
pub async fn read_then_write_max<M: Memory>(
    mem: &M,
    word: RemoteAddr,
    _seed: u64,
    new: u64,
) -> Result<MaxOutcome, MemError> {
    let cur = read_word(mem, word).await?;
    if cur >= new {
        return Ok(MaxOutcome::Superseded { found: cur });
    }
    mem.write(word, &new.to_le_bytes()).await?;
    Ok(MaxOutcome::Installed { prev: cur })
}

/// A deliberately wrong Clover read of a cursor's buffer, with the
/// signature of `swarm_core::systems::clover::buffer::decode_incarnation`:
/// it takes whatever whole incarnation of the buffer it finds, not only
/// the cursor's (`gc` is ignored), as a reader that skips the GC version
/// check (pDPM §5.2). Right until a buffer is recycled; then a reader
/// holding a cursor of its old incarnation returns the new owner's version
/// before it is linked. It exists to show that the loom check of Clover's
/// reads catches it.
pub fn decode_any_incarnation(
    b: &[u8],
    key: &[u8],
    tag: u64,
    _gc: u8,
    nodes: usize,
    max_value: usize,
) -> Option<Version> {
    buffer::decode(b, key, tag, nodes, max_value)
}

fn other(mode: Mode) -> Mode {
    match mode {
        Mode::Read => Mode::Write,
        Mode::Write => Mode::Read,
    }
}

/// A deliberately wrong TRYLOCK: `swarm_core::objects::tslock::try_lock`'s decision
/// over a majority of words, but each word is taken by check-then-write (read
/// it; if it holds a smaller timestamp, write `(ts, mode)` blindly) instead
/// of the CAS loop. Right when the lockers do not overlap; a READ and a
/// WRITE that both read a word before either writes it both believe they
/// hold it. It exists to show that the exclusion check catches the bug.
pub async fn check_then_write_try_lock<M: Memory>(
    mem: &M,
    words: &[RemoteAddr],
    ts: u64,
    mode: Mode,
) -> Result<bool, MemError> {
    let (mine, theirs) = (pack(ts, mode), pack(ts, other(mode)));
    let need = majority(words.len());
    let lock_word = |word| async move {
        let seen = read_word(mem, word).await?;
        if ts_of(seen) >= ts {
            return Ok(seen);
        }
        mem.write(word, &mine.to_le_bytes()).await?;
        Ok(mine)
    };
    let replies = quorum(words.iter().map(|&w| lock_word(w)).collect(), need).await;
    if !replies.reached(need) {
        return Err(*replies.first_error().expect("a failed quorum has an error"));
    }
    Ok(!replies.oks().any(|(_, &seen)| ts_of(seen) > ts || seen == theirs))
}

/// A deliberately wrong TRYLOCK: an exclusive lock, which wins a word only
/// by installing `(ts, mode)` itself (one CAS from bottom) and needs a
/// majority of such wins. It keeps exclusion but breaks true safety: two
/// lockers in the same mode can both lose. It exists to show that the safety
/// check catches the bug.
pub async fn exclusive_try_lock<M: Memory>(
    mem: &M,
    words: &[RemoteAddr],
    ts: u64,
    mode: Mode,
) -> Result<bool, MemError> {
    let mine = pack(ts, mode);
    let need = majority(words.len());
    let lock_word = |word| async move { Ok::<bool, MemError>(mem.cas(word, 0, mine).await? == 0) };
    let replies = quorum(words.iter().map(|&w| lock_word(w)).collect(), need).await;
    if !replies.reached(need) {
        return Err(*replies.first_error().expect("a failed quorum has an error"));
    }
    Ok(replies.oks().filter(|&(_, &won)| won).count() >= need)
}

/// What one READ of an In-n-Out object shows, undecided: the largest
/// metadata word and the in-place copy (its hash and value bytes, the
/// length clamped to the layout), exactly the bytes
/// `swarm_core::swarm::inout::Replica::read` fetches in its single READ.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct InPlace {
    /// The largest metadata word.
    pub meta: Meta,
    /// The in-place copy's hash word.
    pub hash: u64,
    /// The in-place copy's value bytes.
    pub value: Vec<u8>,
}

/// Bytes of the in-place header (hash, length), as `swarm_core::swarm::inout`
/// lays an object out: `meta words | hash | length | value`.
const INPLACE_HEADER: usize = 16;

/// One READ of the object `replica` (the same single READ as
/// `Replica::read`), returned raw: nothing is checked against the hash.
///
/// Used as is, it is the deliberately wrong reader that trusts the in-place
/// copy; the checks also use it to see torn copies.
pub async fn read_in_place<M: Memory>(mem: &M, replica: Replica, layout: &Layout) -> Result<InPlace, MemError> {
    let buf = mem.read(RemoteAddr::new(replica.node, replica.base), layout.size() as usize).await?;
    let words = layout.meta_words as usize;
    let meta = (0..words).filter_map(|i| word_at(&buf, 8 * i)).map(Meta).max().unwrap_or(Meta::BOTTOM);
    let ip = 8 * words;
    let hash = word_at(&buf, ip).unwrap_or(0);
    let len = word_at(&buf, ip + 8).unwrap_or(0).min(layout.max_value) as usize;
    let start = ip + INPLACE_HEADER;
    Ok(InPlace { meta, hash, value: buf[start..start + len].to_vec() })
}

/// Branches (atomic operations and scheduling points) loom allows in one
/// execution of the checks here: setting up a node (formatting a 4 KiB
/// region header) takes several hundred atomic operations.
#[cfg(loom)]
pub const MAX_BRANCHES: usize = 20_000;

/// Stack of the loom threads [`spawn_big`] starts: the core's per-client
/// state (`writerlog::Logs`, `slab::SlabAllocator`) takes tens of KiB,
/// more than the 32 KiB a loom thread has by default.
#[cfg(loom)]
pub const BIG_STACK: usize = 1 << 20;

/// Spawns a loom thread with a [`BIG_STACK`].
#[cfg(loom)]
pub fn spawn_big<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> loom::thread::JoinHandle<T> {
    loom::thread::Builder::new().stack_size(BIG_STACK).spawn(f).expect("spawning a loom thread")
}

/// Runs `f` on a loom thread with a [`BIG_STACK`] and waits for it (the
/// model's main thread has a small stack that cannot be changed).
#[cfg(loom)]
pub fn on_big_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_big(f).join().expect("the thread panicked")
}

/// Explores every execution of `f` with loom (the models here are small:
/// tens of executions), unless `LOOM_MAX_PREEMPTIONS` bounds the
/// preemptions per execution. Returns how many executions were explored, so
/// that a check can make sure it was not vacuous.
#[cfg(loom)]
pub fn explore(f: impl Fn() + Sync + Send + 'static) -> usize {
    run(loom::model::Builder::new(), f)
}

/// Explores the executions of `f` with at most `preemptions` preemptions
/// each, or all of them with `None` (`LOOM_MAX_PREEMPTIONS`, if set, wins
/// either way, for deeper runs by hand), allowing [`MAX_BRANCHES`] branches
/// per execution. Returns how many executions were explored.
#[cfg(loom)]
pub fn explore_bounded(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) -> usize {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(preemptions);
    builder.max_branches = builder.max_branches.max(MAX_BRANCHES);
    run(builder, f)
}

#[cfg(loom)]
fn run(builder: loom::model::Builder, f: impl Fn() + Sync + Send + 'static) -> usize {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // A plain (not modelled) counter of executions.
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f()
    });
    runs.load(Ordering::Relaxed)
}
