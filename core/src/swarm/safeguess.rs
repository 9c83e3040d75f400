//! Safe-Guess (SWARM §3.2, Appendix C): a linearizable, wait-free
//! multi-writer register over a reliable max register M of
//! `(timestamp, flag, value)` tuples and one timestamp lock per write.
//!
//! ```text
//! WRITE(v):
//!   w = (guessTs(), GUESSED, v)
//!   in parallel: m = M.READ(); M.WRITE(w)      # one pipeline per replica
//!   if m <= w: background M.WRITE((w.ts, VERIFIED, v)); return     # 1 RTT
//!   if TSL[w].TRYLOCK(w.ts, WRITE): M.WRITE(((m.ts.time + 1, tid), VERIFIED, v))
//!
//! READ():
//!   loop:
//!     m = M.READ()
//!     if m is VERIFIED: return m.value                              # 1 RTT
//!     p = m.ts.tid
//!     if seen[p] == m and TSL[m].TRYLOCK(m.ts, READ):
//!       background M.WRITE((m.ts, VERIFIED, m.value)); return m.value
//!     if seen[p] exists and seen[p] != m: return seen[p].value
//!     seen[p] = m
//! ```
//!
//! `M.READ` in the write is first the weak read that the CAS of each
//! replica's MAX returns anyway (App. A.2): when it finds nothing above the
//! guess, the write is done in one roundtrip. Otherwise the writer does the
//! strong read (written back to a majority) before it locks, as Lemma C.5's
//! proof of wait-freedom needs, and goes on with what that read returns. The
//! lock of a write lives in its log entry ([`crate::swarm::writerlog`]),
//! one CAS word per replica node, so a lock is only ever taken at that
//! write's guessed timestamp.
//!
//! A register may hold the deletion marker [`Meta::DELETED`] of SWARM-KV
//! (§5.3.2), which [`Register::delete`] writes: a read then returns it (it is
//! VERIFIED), and a write that sees it takes its own timestamp lock. If a
//! reader locked it first, the write was returned by that reader and stands,
//! ordered before the delete; otherwise it fails with [`RegError::Deleted`]
//! and no reader will ever return it.
//!
//! A read returning `seen[p]` after seeing a newer tuple from `p` relies on
//! `p` having started a newer write, which implies the older one completed
//! (one outstanding operation per writer, Assumption 2 of App. C).

use crate::objects::tslock::{Mode, try_lock};
use crate::substrate::clock::Clock;
use crate::substrate::exec::cold;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority};
use crate::substrate::value::Value;
use crate::swarm::client::ClientCtx;
use crate::swarm::inout::InOutError;
use crate::swarm::maxreg::{RegCache, RegError, Register};
use crate::swarm::meta::{MAX_CLIENT, Meta};
use crate::swarm::writerlog::{LogCopy, LogError};
use crate::{Memory, RemoteAddr};

/// How a write completed, for statistics (the paper's §7.8 breakdown).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WritePath {
    /// The guessed timestamp was fresh.
    Fast,
    /// Stale guess; the writer locked readers out and rewrote the value.
    Rewritten,
    /// Stale guess, but a reader had already locked the timestamp: the
    /// write stands as it is.
    ReaderLocked,
}

/// Bound on read iterations (Lemma C.5: two per writer, plus one).
const MAX_ITERATIONS: usize = 2 * (MAX_CLIENT as usize + 1) + 1;
/// Tuples a read remembers: one per possible writer, as Lemma C.5 needs.
const SEEN: usize = MAX_CLIENT as usize + 1;

/// Safe-Guess WRITE of `value` to `reg`. Returns the tuple it linearized
/// under and which path it took.
pub async fn write<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    cache: &mut RegCache,
    value: &[u8],
) -> Result<(Meta, WritePath), RegError> {
    reg.check_value(value)?;
    let (time, place) = ctx.next_write(mem, Meta::BOTTOM).await?;
    let w = Meta::new(time, place.slot, ctx.id);
    let copy = reg.own_entry(ctx, mem, w, place, value);
    let m = reg.write_and_read(ctx, mem, cache, w, &copy, value).await?;
    if m == w {
        mark_verified(mem, reg, cache, w, MarkOn::Installed);
        return Ok((w, WritePath::Fast));
    }
    cold(|| slow_write(ctx, mem, reg, cache, value, w, &copy, m)).await
}

/// The write's slow path: the weak read found `seen`, above the guess `w`.
#[allow(clippy::too_many_arguments)]
async fn slow_write<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    cache: &mut RegCache,
    value: &[u8],
    w: Meta,
    copy: &LogCopy,
    seen: Meta,
) -> Result<(Meta, WritePath), RegError> {
    ctx.paths.slow_writes += 1;
    // The strong read (Lemma C.5): what it returns is on a majority, a
    // deletion marker included, before this writer acts on it. The mutant
    // `deleted-unconfirmed` acts on the weak read's tuple, as the code once
    // did: a marker on one replica then loses an acknowledged update
    // (`systems::tests::a_deletion_marker_on_one_replica_...`).
    let m = if mutant!("deleted-unconfirmed") { seen } else { reg.read_meta_strong(ctx, mem, cache).await? };
    if m <= w.verify() {
        // Only a minority saw the larger tuple: this write's read returns
        // at most `w`, which is what the fast path needs.
        mark_verified(mem, reg, cache, w, MarkOn::Installed);
        return Ok((w, WritePath::Fast));
    }
    if !m.is_deleted() {
        ctx.resync(m);
    }
    if !lock(ctx, mem, reg, w, copy, Mode::Write).await? {
        return Ok((w, WritePath::ReaderLocked));
    }
    if m.is_deleted() {
        // Locked before any reader could return `w`: the write never took
        // effect, and never will. It comes after the delete (SWARM-KV §5.3.3).
        return Err(RegError::Deleted);
    }
    // The rewrite is a write of its own, in a log entry of its own.
    let (time2, place2) = ctx.next_write(mem, m).await?;
    let w2 = Meta::new(time2, place2.slot, ctx.id).verify();
    let copy2 = reg.own_entry(ctx, mem, w2, place2, value);
    reg.write(ctx, mem, cache, w2, &copy2, value).await?;
    Ok((w2, WritePath::Rewritten))
}

/// Safe-Guess READ of `reg`: the value and the tuple it was written with
/// (bottom and an empty value before the first write).
pub async fn read<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    cache: &mut RegCache,
) -> Result<(Meta, Value<M::Buf>), RegError> {
    let (m, value) = reg.read(ctx, mem, cache).await?;
    // The mutant `guessed-unlocked` returns a GUESSED tuple without the
    // lock rules.
    if m.is_bottom() || m.verified() || mutant!("guessed-unlocked") {
        return Ok((m, value));
    }
    cold(|| read_unverified(ctx, mem, reg, cache, (m, value))).await
}

/// The rest of a READ whose first iteration found `first`, a GUESSED tuple
/// (the rare path: its `seen` is large).
async fn read_unverified<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    cache: &mut RegCache,
    first: (Meta, Value<M::Buf>),
) -> Result<(Meta, Value<M::Buf>), RegError> {
    ctx.paths.unverified_reads += 1;
    let mut seen: heapless::Vec<(Meta, Value<M::Buf>), SEEN> = heapless::Vec::new();
    let _ = seen.push(first);
    for _ in 1..MAX_ITERATIONS {
        let (m, value) = reg.read(ctx, mem, cache).await?;
        if m.is_bottom() || m.verified() {
            return Ok((m, value));
        }
        let Some(i) = seen.iter().position(|(s, _)| s.client() == m.client()) else {
            if seen.is_full() {
                seen.remove(0);
            }
            let _ = seen.push((m, value));
            continue;
        };
        if seen[i].0 != m {
            // The writer began a newer write, so this one completed.
            return Ok(seen.swap_remove(i));
        }
        if cold(|| lock_for_read(ctx, mem, reg, m)).await? {
            ctx.paths.reader_locks += 1;
            mark_verified(mem, reg, cache, m, MarkOn::Every);
            return Ok((m, value));
        }
        seen[i] = (m, value);
    }
    Err(RegError::NotWaitFree)
}

/// A reader's TRYLOCK of `m`'s timestamp (the rare path of a read).
async fn lock_for_read<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    m: Meta,
) -> Result<bool, RegError> {
    let (copy, _) = reg.read_out_of_place(ctx, mem, 0, m).await?;
    // Only soon after the read that found `m`: its writer may recycle its
    // entries, lock words included, later ([`ClientCtx::fresh`]). A lock
    // not taken makes the reader read again.
    if !ctx.fresh(mem) {
        return Ok(false);
    }
    lock(ctx, mem, reg, m, &copy, Mode::Read).await
}

/// TRYLOCK(`m`'s timestamp, `mode`) on the lock words of `m`'s log entry
/// on the register's nodes, those this client suspects left out (as
/// failed) while a majority is not suspected, and those late once a
/// majority answered (SWARM §6); if that fails, once more with every
/// node, each waited for (TRYLOCK may run again: it only ever moves words
/// towards `(ts, mode)`).
async fn lock<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    reg: &Register,
    m: Meta,
    copy: &LogCopy,
    mode: Mode,
) -> Result<bool, RegError> {
    let nodes: heapless::Vec<crate::NodeId, MAX_REPLICAS> = reg.replicas.iter().map(|r| r.node).collect();
    let trusted = nodes.iter().filter(|&&n| !ctx.nodes.suspects(n)).count();
    if trusted >= majority(nodes.len()) {
        let locks = lock_words(ctx, mem, &nodes, m, copy, true, majority(nodes.len())).await?;
        if let Ok(won) = try_lock(mem, &locks, m.lock_ts(), mode).await {
            return Ok(won);
        }
    }
    let locks = lock_words(ctx, mem, &nodes, m, copy, false, usize::MAX).await?;
    try_lock(mem, &locks, m.lock_ts(), mode).await.map_err(|e| no_quorum(e, reg))
}

/// Which replicas a background mark goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MarkOn {
    /// Those the writer's own MAX installed the tuple on (as far as it
    /// knows): elsewhere its word cannot hold the GUESSED tuple, and the
    /// CAS could only fail.
    Installed,
    /// Every replica: a reader does not know which replicas the write
    /// reached.
    Every,
}

/// Background M.WRITE((ts, VERIFIED, v)): one CAS per replica, seeded with
/// the GUESSED word; the next write of this client seeds from the VERIFIED
/// word, which is what the CAS leaves in the common case.
fn mark_verified<M: Memory>(mem: &M, reg: &Register, cache: &mut RegCache, m: Meta, on: MarkOn) {
    for (r, rep) in reg.replicas.iter().enumerate() {
        let c = &mut cache.replicas[r];
        let mine = c.mine == m.0;
        if mine {
            c.mine = m.verify().0;
        }
        if mine || on == MarkOn::Every {
            rep.post_verify(mem, &reg.layout, m);
        }
    }
}

/// The timestamp lock of the write that produced `m`, whose log entry is
/// `copy`: word 0 of the entry on each of `nodes` (the register's; the
/// entry is created where missing, so that every process agrees on the
/// same 2f+1 words); `None` for a node that cannot be reached, or that
/// this client suspects if `trusted_only`, or late once `need` answered.
/// If too few words are left for
/// a majority because an entry could not be created (a node without room
/// for its segment), that is the error, not nodes that did not answer.
async fn lock_words<M: Memory, C: Clock>(
    ctx: &mut ClientCtx<C>,
    mem: &M,
    nodes: &[crate::NodeId],
    m: Meta,
    copy: &LogCopy,
    trusted_only: bool,
    need: usize,
) -> Result<heapless::Vec<Option<RemoteAddr>, MAX_REPLICAS>, RegError> {
    let asked: heapless::Vec<crate::NodeId, MAX_REPLICAS> =
        nodes.iter().copied().filter(|&n| !trusted_only || !ctx.nodes.suspects(n)).collect();
    let (logs, carver) = ctx.logs_and_carver();
    let found = logs.entries(mem, &asked, m.client(), copy.place, Some(carver), need).await;
    let mut words = heapless::Vec::new();
    let mut why = None;
    for n in nodes {
        let word = match asked.iter().position(|a| a == n).map(|k| &found[k]) {
            Some(Ok(a)) => *a,
            Some(Err(LogError::Corrupt { node, .. })) => return Err(RegError::Corrupt(*node)),
            Some(Err(LogError::Mem(_))) | None => None,
            Some(Err(e)) => {
                why = why.or(Some(*e));
                None
            }
        };
        let _ = words.push(word);
    }
    if let Some(e) = why
        && words.iter().flatten().count() < majority(nodes.len())
    {
        return Err(RegError::NoQuorum(InOutError::Log(e)));
    }
    Ok(words)
}

/// A lock that reached no majority: the register is unavailable.
fn no_quorum(e: Option<crate::MemError>, reg: &Register) -> RegError {
    let node = reg.replicas.first().map_or(crate::NodeId(0), |r| r.node);
    RegError::NoQuorum(e.unwrap_or(crate::MemError::new(node, crate::MemErrorKind::Unreachable)).into())
}

#[cfg(test)]
mod tests;
