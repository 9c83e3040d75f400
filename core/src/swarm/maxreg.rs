//! The reliable max register of SWARM Appendix A (Algorithm "wmr"), over
//! 2f+1 In-n-Out replicas (§4): a max register of `(metadata, value)`
//! tuples that tolerates the crash of a minority of its memory nodes.
//!
//! Each client keeps, per replica, the largest tuple it knows the replica
//! holds (`cache[r]`, [`crate::swarm::inout::ReplicaCache`]).
//! - `inner_write(v)`: write `v` to the replicas known to be behind, and
//!   wait until a majority is known to hold at least `v` (0 roundtrips when
//!   it already is).
//! - `READ`: read every replica, wait for a majority, take the largest
//!   tuple, and write it back with `inner_write` (usually 0 roundtrips).
//!
//! The value of the largest tuple comes from a matching in-place copy in one
//! of the replies, or else from the out-of-place copy its metadata names.
//! Every write carries its log entry ([`LogCopy`]): a writer's own, or for
//! a write-back, the one read from a replica that holds the tuple.

use crate::objects::max::MaxOutcome;
use crate::substrate::clock::Clock;
use crate::substrate::exec::cold;
use crate::substrate::late::{Plan, Watch, late, or_late};
use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, Tally, majority, mask, quorum, quorum_first};
use crate::substrate::value::Value;
use crate::swarm::client::ClientCtx;
use crate::swarm::inout::{InOutError, Layout, Replica, ReplicaCache, Reply, WriteReply, max_word};
use crate::swarm::meta::Meta;
use crate::swarm::writerlog::{EntryHeader, LogCopy, Place};
use crate::{Memory, NodeId, RemoteAddr};

use core::fmt;

/// A failure of a replicated operation. Failures of a minority of replicas
/// are not errors; these are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegError {
    /// No majority of replicas answered; the first failure is given.
    NoQuorum(InOutError),
    /// A value larger than the register's layout allows.
    ValueTooLarge {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: u64,
    },
    /// Remote data that cannot be right; retrying may help.
    Corrupt(NodeId),
    /// The client could not name a write (ids, log or timestamps exhausted).
    Client(crate::swarm::client::ClientError),
    /// A read looped past the bound of Lemma C.5: a bug, never expected.
    NotWaitFree,
    /// The register holds the deletion marker ([`Meta::DELETED`]): the write
    /// did not take effect (SWARM-KV §5.3.3).
    Deleted,
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegError::NoQuorum(e) => write!(f, "no majority of replicas answered: {e}"),
            RegError::ValueTooLarge { len, max } => write!(f, "value of {len} bytes exceeds the limit of {max}"),
            RegError::Corrupt(n) => write!(f, "{n}: corrupt data"),
            RegError::Client(e) => write!(f, "client: {e}"),
            RegError::NotWaitFree => write!(f, "read exceeded its iteration bound"),
            RegError::Deleted => write!(f, "the register was deleted"),
        }
    }
}

impl From<crate::swarm::client::ClientError> for RegError {
    fn from(e: crate::swarm::client::ClientError) -> Self {
        RegError::Client(e)
    }
}

/// Errors that may say a node is down (not a bad request).
trait NodeFailure {
    fn is_node_failure(&self) -> bool;
}

impl NodeFailure for crate::MemError {
    fn is_node_failure(&self) -> bool {
        !self.is_request_error()
    }
}

impl NodeFailure for InOutError {
    fn is_node_failure(&self) -> bool {
        matches!(self, InOutError::Mem(e) if !e.is_request_error())
    }
}

/// The error of a majority that did not answer: the first failure seen
/// (there is one unless the register has fewer replicas than a majority).
fn no_quorum(first_err: Option<InOutError>) -> RegError {
    RegError::NoQuorum(first_err.unwrap_or(InOutError::BadLayout))
}

/// Where a replicated register lives: one In-n-Out object per replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Register {
    /// The objects' shape.
    pub layout: Layout,
    /// One object per replica node (2f+1 of them).
    pub replicas: heapless::Vec<Replica, MAX_REPLICAS>,
}

/// Replicas a [`PackedRegister`] holds: 2f+1 for f = 1, the paper's
/// default and the store's.
pub const PACKED: usize = 3;

/// A [`Register`] of at most [`PACKED`] replicas, without its layout's tag
/// (a key-value store's key hash, which whoever keeps many registers keeps
/// beside them), in 48 bytes rather than 168: what a client keeps of many
/// registers (its location cache, its writes to recycle) takes fewer
/// cache lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedRegister {
    meta_words: u32,
    max_value: u32,
    in_place: bool,
    first_only: bool,
    len: u8,
    nodes: [NodeId; PACKED],
    bases: [u64; PACKED],
}

impl PackedRegister {
    /// `reg` packed, if it has at most [`PACKED`] replicas.
    pub fn pack(reg: &Register) -> Option<PackedRegister> {
        let l = reg.layout;
        let mut p = PackedRegister {
            meta_words: l.meta_words,
            max_value: u32::try_from(l.max_value).ok()?,
            in_place: l.in_place,
            first_only: l.first_only,
            len: 0,
            nodes: [NodeId(0); PACKED],
            bases: [0; PACKED],
        };
        if reg.replicas.len() > PACKED {
            return None;
        }
        for (i, r) in reg.replicas.iter().enumerate() {
            (p.nodes[i], p.bases[i]) = (r.node, r.base);
        }
        p.len = reg.replicas.len() as u8;
        Some(p)
    }

    /// Its replicas.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether it has no replica.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its layout, tagged `tag`.
    pub fn layout(&self, tag: u64) -> Layout {
        let (meta_words, max_value) = (self.meta_words, u64::from(self.max_value));
        Layout { meta_words, max_value, in_place: self.in_place, first_only: self.first_only, tag }
    }

    /// Its `i`th replica.
    pub fn replica(&self, i: usize) -> Replica {
        Replica { node: self.nodes[i], base: self.bases[i] }
    }

    /// Where its replica at `base` on `node` is, if it has one.
    pub fn position(&self, node: NodeId, base: u64) -> Option<usize> {
        (0..self.len()).find(|&i| self.nodes[i] == node && self.bases[i] == base)
    }

    /// Unpacks it over `reg`, with the layout's tag `tag`.
    pub fn unpack_into(&self, reg: &mut Register, tag: u64) {
        reg.layout = self.layout(tag);
        reg.replicas.clear();
        for i in 0..self.len() {
            // Cannot fail: at most PACKED replicas, fewer than MAX_REPLICAS.
            let _ = reg.replicas.push(self.replica(i));
        }
    }

    /// Unpacked, with the layout's tag `tag`.
    pub fn unpack(&self, tag: u64) -> Register {
        let mut reg = Register { layout: self.layout(tag), replicas: heapless::Vec::new() };
        self.unpack_into(&mut reg, tag);
        reg
    }
}

/// One client's knowledge of one register's replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegCache {
    /// Per replica, in the register's order.
    pub replicas: [ReplicaCache; MAX_REPLICAS],
}

impl Register {
    /// Allocates and clears a register on `nodes` (one object on each).
    pub async fn create<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        nodes: &[NodeId],
        layout: Layout,
    ) -> Result<Register, RegError> {
        let mut replicas = heapless::Vec::new();
        for (r, &node) in nodes.iter().enumerate() {
            let size = layout.of_replica(r).size();
            let a = ctx.slab.alloc(mem, node, size).await.map_err(|_| RegError::Corrupt(node))?;
            let _ = replicas.push(Replica { node, base: a.offset });
        }
        ctx.record_marks(mem).await.map_err(RegError::Client)?;
        let zeros = [0u8; 8 * crate::swarm::inout::MAX_META_WORDS as usize + 16];
        let clear =
            |r: usize| &zeros[..(8 * layout.meta_words as usize + 16).min(layout.of_replica(r).size() as usize)];
        let futs = replicas
            .iter()
            .enumerate()
            .map(|(i, r): (usize, &Replica)| mem.write(RemoteAddr::new(r.node, r.base), clear(i)))
            .collect();
        let done = quorum(futs, replicas.len()).await;
        if let Some(e) = done.first_error() {
            return Err(RegError::NoQuorum(InOutError::Mem(*e)));
        }
        Ok(Register { layout, replicas })
    }

    fn need(&self) -> usize {
        majority(self.replicas.len())
    }

    /// Whether this client knows a majority holds at least `meta` (a word
    /// whose value moved home holds the same tuple).
    fn held_by_majority(&self, cache: &RegCache, meta: Meta) -> bool {
        let meta = meta.unhomed();
        (0..self.replicas.len()).filter(|&r| cache.replicas[r].max.unhomed() >= meta).count() >= self.need()
    }

    /// Notes whether replica `r`'s node failed, from one of its answers.
    fn note<C: Clock, T, E: NodeFailure>(&self, ctx: &mut ClientCtx<C>, r: usize, res: &Result<T, E>) {
        let failed = res.as_ref().err().is_some_and(NodeFailure::is_node_failure);
        ctx.nodes.note(self.replicas[r].node, failed);
    }

    /// How a quorum operation on `n` of the replicas (the `j`th being
    /// replica `replica(j)`) starts: the replicas this client does not
    /// suspect first ([`crate::substrate::late`]).
    fn plan<'m, M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &'m M,
        replica: impl Fn(usize) -> usize,
        n: usize,
    ) -> Plan<'m> {
        ctx.nodes.plan(mem, n, |j| self.replicas[replica(j)].node)
    }

    /// After a quorum operation: its late replicas become suspects, and
    /// whether it contacted more than `want` is counted.
    fn learn<C: Clock>(&self, ctx: &mut ClientCtx<C>, tally: &Tally, replica: impl Fn(usize) -> usize, want: usize) {
        ctx.nodes.learn(tally, |j| self.replicas[replica(j)].node);
        ctx.paths.widened += (tally.started.count_ones() as usize > want) as u64;
    }

    /// The log entry of this client's own write `meta` of `value` to this
    /// register, in `place`; the write is remembered so that its entries
    /// are recycled ([`crate::swarm::recycle`]), whether it completes or
    /// not (a failed write may have reached a replica).
    pub fn own_entry<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        meta: Meta,
        place: Place,
        value: &[u8],
    ) -> LogCopy {
        ctx.track(mem, self, meta, place, value);
        LogCopy { place, header: EntryHeader::of(meta, self.layout.tag, self.replicas.len() as u8, value) }
    }

    /// Checks that `value` fits the register, before anything is spent on it.
    pub fn check_value(&self, value: &[u8]) -> Result<(), RegError> {
        if value.len() as u64 > self.layout.max_value {
            return Err(RegError::ValueTooLarge { len: value.len(), max: self.layout.max_value });
        }
        Ok(())
    }

    /// `inner_write(meta, value)`: returns as soon as a majority is known
    /// to hold at least `meta`, at once if this client already knows it.
    /// `copy` is the write's log entry (none for the deletion marker).
    pub async fn write<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        meta: Meta,
        copy: &LogCopy,
        value: &[u8],
    ) -> Result<Meta, RegError> {
        self.write_inner(ctx, mem, cache, meta, Some(copy), value, false).await
    }

    /// `M.WRITE(meta, value)` in parallel with `M.READ()`, as Safe-Guess'
    /// write needs (§3.2, line 6): writes to every replica, never from
    /// cached knowledge, and returns the largest metadata the majority that
    /// answered held (the weak read of App. A.2, for free with the write:
    /// each replica's MAX reports what it found).
    pub async fn write_and_read<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        meta: Meta,
        copy: &LogCopy,
        value: &[u8],
    ) -> Result<Meta, RegError> {
        self.write_inner(ctx, mem, cache, meta, Some(copy), value, true).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_inner<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        meta: Meta,
        copy: Option<&LogCopy>,
        value: &[u8],
        read: bool,
    ) -> Result<Meta, RegError> {
        match self.write_once(ctx, mem, cache, meta, copy, value, read, false).await {
            // A replica left out for being late when it was looked up may
            // be needed after all (another failed since): once more,
            // waiting for every replica's log entry.
            Err(RegError::NoQuorum(_)) => {
                cold(|| self.write_once(ctx, mem, cache, meta, copy, value, read, true)).await
            }
            r => r,
        }
    }

    /// One try of [`Register::write_inner`]: `patient`, it waits for the
    /// log entry of every replica that answers, however late.
    #[allow(clippy::too_many_arguments)]
    async fn write_once<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        meta: Meta,
        copy: Option<&LogCopy>,
        value: &[u8],
        read: bool,
        patient: bool,
    ) -> Result<Meta, RegError> {
        self.check_value(value)?;
        let n = self.replicas.len();
        // The replicas this client knows to hold `meta` or more (none for a
        // write that must also read), and the largest tuple they hold.
        let (mut known, mut seen) = (0u16, meta);
        for (r, c) in cache.replicas[..n].iter().enumerate() {
            if !read && c.max.unhomed() >= meta {
                known |= 1 << r;
                seen = seen.max(c.max.unhomed());
            }
        }
        // A write is done once a majority holds it; the mutant `ack-one`
        // stops at one replica.
        let need = if mutant!("ack-one") { 1 } else { self.need() };
        let already = known.count_ones() as usize;
        if already >= need {
            return Ok(seen);
        }
        // Where the value goes on each replica that is behind (cached, so
        // usually no roundtrip). A replica whose log cannot be reached now
        // is left out, like one that does not answer.
        // Those this client suspects are left out (as failed) while
        // enough others are behind (SWARM §6), unless `patient`.
        let want = need - already;
        let suspect = |r: usize| ctx.nodes.suspects(self.replicas[r].node);
        let trusted = (0..n).filter(|&r| known & (1 << r) == 0 && !suspect(r)).count();
        let skip = |r: usize| !patient && trusted >= want && suspect(r);
        let (mut behind, mut nodes) = ([0usize; MAX_REPLICAS], heapless::Vec::<NodeId, MAX_REPLICAS>::new());
        for (r, rep) in self.replicas.iter().enumerate() {
            if known & (1 << r) == 0 && !skip(r) {
                behind[nodes.len()] = r;
                let _ = nodes.push(rep.node);
            }
        }
        let mut entries = heapless::Vec::new();
        let mut first_err = None;
        // The deletion marker has no value and no log entry.
        let found = match copy {
            None => nodes.iter().all(|&n| entries.push(RemoteAddr::new(n, 0)).is_ok()),
            Some(c) => ctx.logs.cached_entries(&nodes, meta.client(), c.place, &mut entries),
        };
        if let (false, Some(c)) = (found, copy) {
            entries.clear();
            // The entries this write needs; a late node's is waited for
            // only by the patient try.
            let enough = if patient { usize::MAX } else { need - already };
            let looked_up = cold(|| {
                let (logs, carver) = ctx.logs_and_carver();
                logs.entries(mem, &nodes, meta.client(), c.place, Some(carver), enough)
            })
            .await;
            for (j, entry) in looked_up.into_iter().enumerate() {
                match entry {
                    Ok(Some(e)) => {
                        let _ = entries.push(e);
                        behind[entries.len() - 1] = behind[j];
                    }
                    Ok(None) => first_err = first_err.or(Some(InOutError::Corrupt(nodes[j]))),
                    Err(e) => first_err = first_err.or(Some(InOutError::from(e))),
                }
            }
        }
        let targets: heapless::Vec<(usize, RemoteAddr), MAX_REPLICAS> =
            entries.iter().enumerate().map(|(j, &e)| (behind[j], e)).collect();
        let (layout, id) = (self.layout, ctx.id);
        let mut seeds = [0u64; MAX_REPLICAS];
        for (j, &(r, _)) in targets.iter().enumerate() {
            seeds[j] = cache.replicas[r].mine;
        }
        let op = |j: usize| {
            let (r, entry) = targets[j];
            let (rep, seed, layout) = (self.replicas[r], seeds[j], layout.of_replica(r));
            async move {
                match copy {
                    None => rep.delete(mem, &layout, id, seed).await,
                    Some(c) => rep.write(mem, &layout, entry, seed, meta, &c.header, value).await,
                }
            }
        };
        let want = need - already;
        let plan = self.plan(ctx, mem, |j| targets[j].0, targets.len());
        let on_reply = |j: usize, res: Result<WriteReply, InOutError>| {
            let r = targets[j].0;
            self.note(ctx, r, &res);
            match res {
                Ok(reply) => {
                    let c = &mut cache.replicas[r];
                    c.mine = match reply.outcome {
                        MaxOutcome::Installed { .. } => meta.0,
                        MaxOutcome::Superseded { found } => found.max(c.mine),
                    };
                    c.max = c.max.max(reply.seen);
                    seen = seen.max(reply.seen.unhomed());
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        };
        let replies = quorum_first(targets.len(), want, plan, op, on_reply).await;
        self.learn(ctx, &replies, |j| targets[j].0, want);
        // Started but not waited for (the majority answered first). Its
        // first CAS most likely installed `meta`: seed the next MAX with it,
        // so that a slow replica does not stay behind for lack of a retry.
        // `max` only ever holds what a replica was seen to hold, so it is
        // left alone. Replicas never started changed nothing.
        for (j, &(r, _)) in targets.iter().enumerate() {
            if replies.started & !replies.answered & (1 << j) != 0 {
                let c = &mut cache.replicas[r];
                c.mine = c.mine.max(meta.0);
            }
        }
        if !replies.reached(want) {
            return Err(no_quorum(first_err));
        }
        Ok(seen)
    }

    /// Writes the deletion marker [`Meta::DELETED`] to a majority (SWARM-KV
    /// §5.3.2): it is larger than any tuple, so the register reads as deleted
    /// from then on, and writes fail. A client that already knows a
    /// majority holds the marker (a delete completed before) sends nothing
    /// and answers `true`; otherwise `false`. (Whether a marker found on a
    /// replica was there first cannot tell a first delete from a second:
    /// readers write markers back.)
    pub async fn delete<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
    ) -> Result<bool, RegError> {
        if self.held_by_majority(cache, Meta::DELETED) {
            return Ok(true);
        }
        self.write_inner(ctx, mem, cache, Meta::DELETED, None, &[], false).await?;
        Ok(false)
    }

    /// The weak read of App. A.2: the largest metadata a majority holds,
    /// without the value and without write-back (one roundtrip, always).
    /// Enough to learn a fresh timestamp (ABD's write); it does not give
    /// read-read monotonicity, which the full [`Register::read`] does.
    pub async fn read_meta<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
    ) -> Result<Meta, RegError> {
        let words = self.layout.meta_words as usize;
        let op = |r: usize| mem.read(RemoteAddr::new(self.replicas[r].node, self.replicas[r].base), 8 * words);
        let plan = self.plan(ctx, mem, |r| r, self.replicas.len());
        let (mut max, mut first_err) = (Meta::BOTTOM, None);
        let on_reply = |r: usize, res: Result<M::Buf, crate::MemError>| {
            self.note(ctx, r, &res);
            match res {
                Ok(buf) => {
                    let m = max_word(&buf, words);
                    let c = &mut cache.replicas[r];
                    c.max = c.max.max(m);
                    // The word this client's next MAX expects, as a read
                    // learns it: with one word shared by every writer
                    // (DM-ABD), the seed of its last write is stale once
                    // another wrote, and the MAX would take a roundtrip
                    // more to find the word (the mutant `abd-stale-seed`).
                    if let Some(w) = word_at(&buf, self.layout.word_of(ctx.id) as usize)
                        && !mutant!("abd-stale-seed")
                    {
                        c.mine = w;
                    }
                    max = max.max(m);
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        };
        let replies = quorum_first(self.replicas.len(), self.need(), plan, op, on_reply).await;
        self.learn(ctx, &replies, |r| r, self.need());
        if !replies.reached(self.need()) {
            return Err(no_quorum(first_err.map(InOutError::Mem)));
        }
        Ok(max)
    }

    /// The strong read of App. A.2 without the value: the largest tuple a
    /// majority holds, written back to a majority first if this client does
    /// not know a majority holds it (its value is read then). What
    /// Safe-Guess' writer reads before its slow path (Lemma C.5 needs it
    /// strong), and what a deletion marker seen on one replica must go
    /// through before anyone acts on it.
    pub async fn read_meta_strong<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
    ) -> Result<Meta, RegError> {
        Ok(self.read_inner(ctx, mem, cache, false).await?.0)
    }

    /// READ: the largest tuple of a majority, written back to a majority.
    pub async fn read<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
    ) -> Result<(Meta, Value<M::Buf>), RegError> {
        let (max, value) = self.read_inner(ctx, mem, cache, true).await?;
        Ok((max, value.unwrap_or_else(Value::empty)))
    }

    /// A strong read, with the value if `value` (else only where it must be
    /// read to be written back). Run again when it failed for want of
    /// nodes after its quorum answered: the only replicas that held its
    /// tuple (and so the value's log entries) may have crashed between the
    /// two roundtrips while a majority is still alive; or when the value's
    /// copies were not the tuple's any more (recycled since:
    /// [`crate::swarm::recycle`]) or not whole. Reading again is safe:
    /// nothing was returned or written back yet, and a tuple that a
    /// completed operation wrote or returned is on a majority, which the
    /// next quorum meets. At most one restart per replica; past that, the
    /// error stands.
    ///
    /// Restarts after the first read every replica that answers, each
    /// waited for, rather than the first majority: the only copies of the
    /// tuple's value that a majority's holders have may be spoiled (a
    /// write that landed later than the timing assumption allows, over a
    /// home, [`crate::swarm::recycle`]), while a replica outside that
    /// majority, slow, holds the tuple and its value.
    async fn read_inner<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        value: bool,
    ) -> Result<(Meta, Option<Value<M::Buf>>), RegError> {
        match self.read_once(ctx, mem, cache, value, false).await {
            Err(first @ (RegError::NoQuorum(_) | RegError::Corrupt(_))) => {
                cold(|| async move {
                    let mut last = first;
                    for k in 0..self.replicas.len() {
                        ctx.paths.read_restarts += 1;
                        // (The mutant `restart-narrow` restarts with the
                        // first majority, as the first try.)
                        let wide = k > 0 && !mutant!("restart-narrow");
                        match self.read_once(ctx, mem, cache, value, wide).await {
                            Err(e @ (RegError::NoQuorum(_) | RegError::Corrupt(_))) => last = e,
                            done => return done,
                        }
                    }
                    Err(last)
                })
                .await
            }
            done => done,
        }
    }

    /// One try of [`Register::read_inner`], of every replica if `wide`.
    async fn read_once<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        value: bool,
        wide: bool,
    ) -> Result<(Meta, Option<Value<M::Buf>>), RegError> {
        let (max, in_place, holders, homes) = self.read_replicas(ctx, mem, cache, wide).await?;
        // A word whose value moved home says its tuple is on a majority
        // (its writer saw it there first: [`crate::swarm::recycle`]). The
        // mutant `abd-no-write-back` returns what it read as it is.
        if homes != 0 || self.held_by_majority(cache, max) || mutant!("abd-no-write-back") {
            // The value: a matching in-place copy, else a home or
            // out-of-place one.
            return match in_place {
                Some(v) => Ok((max, Some(v))),
                None if !value => Ok((max, None)),
                None if homes != 0 => {
                    ctx.paths.home_reads += 1;
                    let v = cold(|| self.read_home(ctx, mem, homes, holders, max)).await?;
                    Ok((max, Some(v)))
                }
                None => {
                    ctx.paths.out_of_place_reads += 1;
                    let (_, v) = cold(|| self.read_out_of_place(ctx, mem, holders, max)).await?;
                    Ok((max, Some(v)))
                }
            };
        }
        let (max, v) = cold(|| self.write_back(ctx, mem, cache, holders, max, in_place)).await?;
        Ok((max, Some(v)))
    }

    /// The rest of a READ whose tuple `max` a majority is not known to
    /// hold: written back (with its log entry as a holder has it), then
    /// returned.
    async fn write_back<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        holders: u16,
        max: Meta,
        in_place: Option<Value<M::Buf>>,
    ) -> Result<(Meta, Value<M::Buf>), RegError> {
        ctx.paths.write_backs += 1;
        if max.is_deleted() {
            self.write_inner(ctx, mem, cache, max, None, &[], false).await?;
            return Ok((max, Value::empty()));
        }
        let (copy, value) = self.read_out_of_place(ctx, mem, holders, max).await?;
        // A matching in-place copy is the same value; either will do.
        let _ = in_place;
        // Written back only soon after the read that found it, or its
        // writer may have recycled its entries since ([`ClientCtx::fresh`]):
        // read again then.
        if !ctx.fresh(mem) {
            return Err(RegError::NoQuorum(InOutError::Elsewhere(self.replicas[0].node)));
        }
        self.write(ctx, mem, cache, max, &copy, &value).await?;
        Ok((max, value))
    }

    /// READ's roundtrip: the largest tuple a majority holds, its value if
    /// an in-place copy matched, which replicas hold it (bit `r` for
    /// replica `r`), and of those, which hold its value at home
    /// ([`Meta::home`]), folded from the replies as they arrive: only the
    /// chosen in-place value outlives them. The tuple is the word with
    /// its value in its log entry ([`Meta::unhomed`]), whatever the
    /// replicas say of where it is.
    async fn read_replicas<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        cache: &mut RegCache,
        wide: bool,
    ) -> Result<(Meta, Option<Value<M::Buf>>, u16, u16), RegError> {
        ctx.note_read(mem);
        let (layout, id) = (self.layout, ctx.id);
        let guess = self.guess(ctx, cache);
        let op = |r: usize| {
            let (rep, layout) = (self.replicas[r], layout.of_replica(r));
            let guessed = guess.and_then(|(m, entries)| entries[r].map(|e| (m, e)));
            async move {
                match guessed {
                    Some((m, entry)) => cold(|| rep.read_guessing(mem, layout, id, m, entry)).await,
                    None => rep.read(mem, layout, id).await,
                }
            }
        };
        let n = self.replicas.len();
        let (plan, wait_for) = match wide {
            true => (Plan::trusting(mask(n, |_| true)), n),
            false => (self.plan(ctx, mem, |r| r, n), self.need()),
        };
        let (mut max, mut holders, mut homes, mut in_place, mut first_err) = (Meta::BOTTOM, 0u16, 0u16, None, None);
        let on_reply = |r: usize, res: Result<Reply<M::Buf>, InOutError>| {
            self.note(ctx, r, &res);
            let reply = match res {
                Ok(reply) => reply,
                Err(e) => return first_err = first_err.or(Some(e)),
            };
            let c = &mut cache.replicas[r];
            c.max = c.max.max(reply.meta);
            c.mine = reply.word;
            let meta = reply.meta.unhomed();
            if meta > max {
                (max, holders, homes, in_place) = (meta, 0, 0, None);
            }
            if meta == max {
                holders |= 1 << r;
                if reply.meta.home() {
                    homes |= 1 << r;
                }
                // Any matching in-place copy will do: its hash binds it to `max`.
                if in_place.is_none() {
                    in_place = reply.value;
                }
            }
        };
        let replies = quorum_first(n, wait_for, plan, op, on_reply).await;
        self.learn(ctx, &replies, |r| r, self.need());
        if !replies.reached(self.need()) {
            return Err(no_quorum(first_err));
        }
        Ok((max, in_place, holders, homes))
    }

    /// The value of `max` from the home of one of the replicas that hold
    /// it there (`homes`), one after the other; else from the log entry of
    /// one of the other `holders`. A copy that is not the tuple's (the
    /// word moved on since) is a retry of the whole read.
    async fn read_home<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        homes: u16,
        holders: u16,
        max: Meta,
    ) -> Result<Value<M::Buf>, RegError> {
        let mut last = RegError::NoQuorum(InOutError::Elsewhere(self.replicas[0].node));
        let suspect = |ctx: &ClientCtx<C>, r: usize| ctx.nodes.suspects(self.replicas[r].node);
        let mut order: heapless::Vec<usize, MAX_REPLICAS> =
            (0..self.replicas.len()).filter(|&r| homes & (1 << r) != 0 && !suspect(ctx, r)).collect();
        order.extend((0..self.replicas.len()).filter(|&r| homes & (1 << r) != 0 && suspect(ctx, r)));
        for r in order {
            let res = self.replicas[r].read_home(mem, &self.layout.of_replica(r), max).await;
            self.note(ctx, r, &res);
            match res {
                Ok(v) => return Ok(v),
                Err(InOutError::Elsewhere(n)) => last = RegError::NoQuorum(InOutError::Elsewhere(n)),
                Err(InOutError::Corrupt(n)) => last = RegError::Corrupt(n),
                Err(e) => last = RegError::NoQuorum(e),
            }
        }
        let others = holders & !homes;
        if others == 0 {
            return Err(last);
        }
        Ok(self.read_out_of_place(ctx, mem, others, max).await?.1)
    }

    /// While every replica with an in-place copy is suspected (the
    /// paper's layout keeps one, on the first replica), the tuple this
    /// client last saw and its log entry on each other replica: READ asks
    /// for the entry in the same roundtrip ([`Replica::read_guessing`]),
    /// so that a node down costs the keys whose copy it held nothing while
    /// they do not change (SWARM §7.7 shows gets slowing until the copy is
    /// back).
    fn guess<C: Clock>(
        &self,
        ctx: &ClientCtx<C>,
        cache: &RegCache,
    ) -> Option<(Meta, [Option<RemoteAddr>; MAX_REPLICAS])> {
        let n = self.replicas.len();
        let copies = (0..n).filter(|&r| self.layout.of_replica(r).in_place);
        if copies.clone().next().is_none() || copies.clone().any(|r| !ctx.nodes.suspects(self.replicas[r].node)) {
            return None;
        }
        let seen = cache.replicas[..n].iter().map(|c| c.max).max()?;
        if seen.is_bottom() || seen.is_deleted() {
            return None;
        }
        let mut entries = [None; MAX_REPLICAS];
        for (r, e) in entries.iter_mut().enumerate().take(n) {
            if !self.layout.of_replica(r).in_place {
                *e = ctx.logs.guess(self.replicas[r].node, seen).map(|(at, _)| at);
            }
        }
        Some((seen, entries))
    }

    /// The value of `max` and its log entry, from the entry on one of the
    /// replicas that hold it (`holders`, bit `r` for replica `r`; all of
    /// them if 0): where this client guesses the entries are (no
    /// roundtrip), read from one holder and from the others as soon as it
    /// is late or fails (SWARM §6); else where a node's log directory says
    /// (a wrong guess costs one).
    pub async fn read_out_of_place<M: Memory, C: Clock>(
        &self,
        ctx: &mut ClientCtx<C>,
        mem: &M,
        holders: u16,
        max: Meta,
    ) -> Result<(LogCopy, Value<M::Buf>), RegError> {
        let holds = |r: usize| holders == 0 || holders & (1 << r) != 0;
        let mut last = RegError::Corrupt(self.replicas[0].node);
        let mut tried = 0u16;
        // The common case: the first trusted holder's entry, where this
        // client guesses it is, read at once (a quorum's bookkeeping would
        // cost a tenth of a 1 µs read); the others are asked if it fails
        // or is late.
        let first = (0..self.replicas.len()).find(|&r| holds(r) && !ctx.nodes.suspects(self.replicas[r].node));
        if let Some(r) = first
            && let Some((entry, place)) = ctx.logs.guess(self.replicas[r].node, max)
        {
            let (rep, layout) = (self.replicas[r], self.layout.of_replica(r));
            let read = rep.read_out_of_place(mem, &layout, entry, self.layout.max_value, max);
            match or_late(read, Watch::on(mem)).await {
                Some(Ok((header, v))) => return Ok((LogCopy { place, header }, v)),
                Some(Err(InOutError::Elsewhere(_))) => {}
                Some(Err(e)) => {
                    self.note(ctx, r, &Err::<(), _>(e));
                    tried |= 1 << r;
                    last = match e {
                        InOutError::Corrupt(n) => RegError::Corrupt(n),
                        e => RegError::NoQuorum(e),
                    };
                }
                None => {
                    ctx.nodes.note(rep.node, true);
                    tried |= 1 << r;
                    last = RegError::NoQuorum(InOutError::Mem(late(rep.node)));
                }
            }
        }
        // (replica, guessed entry, its place) of the others
        let guesses: heapless::Vec<(usize, RemoteAddr, Place), MAX_REPLICAS> = (0..self.replicas.len())
            .filter(|&r| holds(r) && tried & (1 << r) == 0 && Some(r) != first)
            .filter_map(|r| ctx.logs.guess(self.replicas[r].node, max).map(|(e, p)| (r, e, p)))
            .collect();
        if !guesses.is_empty() {
            let op = |j: usize| {
                let (r, entry, _) = guesses[j];
                let (rep, layout) = (self.replicas[r], self.layout.of_replica(r));
                async move { rep.read_out_of_place(mem, &layout, entry, self.layout.max_value, max).await }
            };
            let plan = self.plan(ctx, mem, |j| guesses[j].0, guesses.len());
            let mut got = None;
            let on_reply = |j: usize, res: Result<(EntryHeader, Value<M::Buf>), InOutError>| {
                let r = guesses[j].0;
                self.note(ctx, r, &res);
                match res {
                    Ok(v) => {
                        if got.is_none() {
                            got = Some((j, v));
                        }
                    }
                    Err(InOutError::Elsewhere(_)) => {}
                    Err(e) => {
                        tried |= 1 << r;
                        last = match e {
                            InOutError::Corrupt(n) => RegError::Corrupt(n),
                            e => RegError::NoQuorum(e),
                        };
                    }
                }
            };
            let tally = quorum_first(guesses.len(), 1, plan, op, on_reply).await;
            self.learn(ctx, &tally, |j| guesses[j].0, 1);
            if let Some((j, (header, v))) = got {
                return Ok((LogCopy { place: guesses[j].2, header }, v));
            }
        }
        // No guess held: the holders' directories, one holder after the
        // other (those not known to have failed; suspects last).
        let suspect = |r: usize| ctx.nodes.suspects(self.replicas[r].node);
        let mut order: heapless::Vec<usize, MAX_REPLICAS> =
            (0..self.replicas.len()).filter(|&r| holds(r) && tried & (1 << r) == 0 && !suspect(r)).collect();
        order.extend((0..self.replicas.len()).filter(|&r| holds(r) && tried & (1 << r) == 0 && suspect(r)));
        for r in order {
            let rep = self.replicas[r];
            let layout = self.layout.of_replica(r);
            let (entry, place) = match cold(|| ctx.logs.locate(mem, rep.node, max)).await {
                Ok(Some(found)) => found,
                Ok(None) => {
                    last = RegError::NoQuorum(InOutError::Elsewhere(rep.node));
                    continue;
                }
                Err(e) => {
                    last = RegError::NoQuorum(e.into());
                    continue;
                }
            };
            match rep.read_out_of_place(mem, &layout, entry, self.layout.max_value, max).await {
                Ok((header, v)) => return Ok((LogCopy { place, header }, v)),
                // Recycled since the tuple was read: the read runs again.
                Err(InOutError::Elsewhere(n)) => last = RegError::NoQuorum(InOutError::Elsewhere(n)),
                Err(InOutError::Corrupt(n)) => last = RegError::Corrupt(n),
                Err(e) => last = RegError::NoQuorum(e),
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use alloc::rc::Rc;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use proptest::prelude::*;

    use super::*;
    use crate::sim::{CrashMode, Sim, SimConfig};
    use crate::substrate::space::region::Region;
    use crate::swarm::writerlog::{self, EntryHeader, LogGeometry, Place};

    /// (client, meta written or read, invoked, returned, is_write, weak read)
    type Event = (u8, Meta, u64, u64, bool, bool);

    fn run(seed: u64, replicas: usize, writers: u8, readers: u8, crash: bool) -> Vec<Event> {
        let mut sim = Sim::new(SimConfig {
            seed,
            nodes: replicas,
            node_size: 4 << 20,
            max_piece_gap_ns: 400,
            ..SimConfig::default()
        });
        let admin = sim.client();
        let layout = Layout::new(1 + (seed % 3) as u32, 64).unwrap();
        let reg = sim
            .block_on(async move {
                let geo = LogGeometry::new(64, 64 << 10, 16).unwrap();
                for n in 0..replicas as u16 {
                    Region::format(&admin, NodeId(n), 4 << 20, 64 << 10).await.unwrap();
                    writerlog::format(&admin, NodeId(n), geo).await.unwrap();
                }
                let nodes: Vec<NodeId> = (0..replicas as u16).map(NodeId).collect();
                let mut ctx = ClientCtx::new(100, || 0).unwrap();
                Register::create(&mut ctx, &admin, &nodes, layout).await.unwrap()
            })
            .unwrap();
        if crash {
            let node = sim.random(0, replicas as u64 - 1) as usize;
            let at = sim.now() + sim.random(0, 20_000);
            sim.crash_node_at(node, at, CrashMode::Hang);
        }
        let events = Rc::new(RefCell::new(Vec::new()));
        for i in 0..writers + readers {
            let id = i + 1;
            let m = sim.client();
            let (reg, events, mem) = (reg.clone(), events.clone(), m.clone());
            sim.spawn(&m, async move {
                let mut ctx = ClientCtx::new(id, || 0).unwrap();
                ctx.writing_in(0, 1);
                let mut cache = RegCache::default();
                for k in 1..=5u64 {
                    mem.sleep(mem.random(0, 2_000)).await;
                    let t0 = mem.now();
                    if id <= writers {
                        // Segment 0 of each writer's log starts at time 1.
                        let meta = Meta::new(mem.random(1, 50), k as u32, id);
                        let v = [id; 16];
                        let copy = LogCopy {
                            place: Place { segment: 0, slot: k as u32, start: 1 },
                            header: EntryHeader::of(meta, 0, 3, &v),
                        };
                        reg.write(&mut ctx, &mem, &mut cache, meta, &copy, &v).await.unwrap();
                        events.borrow_mut().push((id, meta, t0, mem.now(), true, false));
                    } else if k % 2 == 0 {
                        // The weak read: no value, no write-back; still at
                        // least every write completed before it.
                        let meta = reg.read_meta(&mut ctx, &mem, &mut cache).await.unwrap();
                        events.borrow_mut().push((id, meta, t0, mem.now(), false, true));
                    } else {
                        let (meta, v) = reg.read(&mut ctx, &mem, &mut cache).await.unwrap();
                        assert!(meta.is_bottom() || v.iter().all(|&b| b == meta.client()), "value of another write");
                        events.borrow_mut().push((id, meta, t0, mem.now(), false, false));
                    }
                }
            });
        }
        sim.run().unwrap();
        events.borrow().clone()
    }

    /// Roundtrip of the fixed-latency tests.
    const RTT: u64 = 1_000;

    /// A register of `layout` on 3 nodes of a simulator whose every
    /// roundtrip takes [`RTT`] (no tails), for tests that count them.
    fn fixed_rtt_register(seed: u64, layout: Layout) -> (Sim, Register) {
        let mut sim =
            Sim::new(SimConfig { seed, nodes: 3, node_size: 4 << 20, ..SimConfig::default() }.fixed_latency(RTT));
        let admin = sim.client();
        let reg = sim
            .block_on(async move {
                let geo = LogGeometry::new(64, 64 << 10, 16).unwrap();
                let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
                for &n in &nodes {
                    Region::format(&admin, n, 4 << 20, 64 << 10).await.unwrap();
                    writerlog::format(&admin, n, geo).await.unwrap();
                }
                let mut ctx = ClientCtx::new(100, || 0).unwrap();
                Register::create(&mut ctx, &admin, &nodes, layout).await.unwrap()
            })
            .unwrap();
        (sim, reg)
    }

    /// On a [`fixed_rtt_register`]: a completed write of `old` (value
    /// `[1; 16]`), then one of `new` (`[2; 16]`, its writer crashed) that
    /// reached only replicas `on`; after the writes, `spoil` on the
    /// entries of `new` (one per replica of `on`). The two tuples.
    fn old_then_new(sim: &mut Sim, reg: &Register, on: &'static [usize], spoil: bool) -> (Meta, Meta) {
        let (admin, r, layout) = (sim.client(), reg.clone(), reg.layout);
        let (old, new) = (Meta::new(1, 1, 1), Meta::new(2, 2, 1));
        sim.block_on(async move {
            let mut w = ClientCtx::new(1, || 0).unwrap();
            w.writing_in(0, 1);
            let copy = |slot, meta: Meta, v: &[u8]| LogCopy {
                place: Place { segment: 0, slot, start: 1 },
                header: EntryHeader::of(meta, 0, 3, v),
            };
            r.write(&mut w, &admin, &mut RegCache::default(), old, &copy(1, old, &[1; 16]), &[1; 16]).await.unwrap();
            let c = copy(2, new, &[2; 16]);
            let nodes: Vec<NodeId> = on.iter().map(|&i| r.replicas[i].node).collect();
            let at = w.logs.entries(&admin, &nodes, 1, c.place, Some(w.slab.unleased()), on.len()).await;
            for (k, &i) in on.iter().enumerate() {
                let entry = at[k].unwrap().unwrap();
                r.replicas[i].write(&admin, &layout.of_replica(i), entry, 0, new, &c.header, &[2; 16]).await.unwrap();
                if spoil && k == 0 {
                    admin.write(entry, &[0xA5; 48]).await.unwrap();
                }
            }
        })
        .unwrap();
        (old, new)
    }

    /// A fresh client's read of `reg`: the tuple and value, and its restarts.
    fn fresh_read(sim: &mut Sim, reg: Register) -> (Result<(Meta, Vec<u8>), RegError>, u64) {
        let m = sim.client();
        sim.block_on(async move {
            let mut ctx = ClientCtx::new(2, || 0).unwrap();
            let read = reg.read(&mut ctx, &m, &mut RegCache::default()).await;
            (read.map(|(meta, v)| (meta, v.to_vec())), ctx.paths.read_restarts)
        })
        .unwrap()
    }

    /// A read whose tuple only one replica held, which crashes between the
    /// read's quorum and the value: the read starts again on the live
    /// majority and returns what it holds, instead of failing while a
    /// majority is up (found by the register campaign, seed 1393).
    #[test]
    fn a_read_whose_only_holder_crashes_reads_again() {
        let (mut sim, reg) = fixed_rtt_register(7, Layout::new(1, 64).unwrap());
        let (old, _) = old_then_new(&mut sim, &reg, &[1], false);
        // Node 1 answers the read's first roundtrip, then crashes.
        let start = sim.now();
        sim.crash_node_at(1, start + RTT + 1, CrashMode::FailFast);
        assert_eq!(fresh_read(&mut sim, reg), (Ok((old, alloc::vec![1; 16])), 1));
    }

    /// R below a roundtrip (a reader may never act on what it read: every
    /// write-back or lock would come after R/2) and R as a store sets it,
    /// each with whether the reader may act.
    fn delays() -> [(u64, bool); 2] {
        [(RTT, false), (crate::swarm::client::recycle_delay_ns(None), true)]
    }

    /// A fresh reader (client 2) of `reg` whose recycling delay is `delay`.
    fn reader_with_delay(delay: u64, reg: &Register) -> ClientCtx<impl Clock> {
        let mut ctx = ClientCtx::new(2, || 0).unwrap();
        ctx.configure(delay, reg.layout);
        ctx
    }

    /// A reader acts on what its read found (here, writes back a tuple
    /// that one replica holds) only within R/2 of the read's start
    /// ([`ClientCtx::fresh`]): later, the writer may have recycled the
    /// tuple's entries. With R below a roundtrip, every write-back would
    /// come too late, so the read writes nothing back and fails; with R
    /// as a store sets it, the same read writes the tuple back. (The
    /// mutant `stale-write-back`, a reader that does not check, writes it
    /// back either way.)
    #[test]
    fn a_reader_writes_back_only_soon_after_its_read() {
        for (delay, wrote_back) in delays() {
            let (mut sim, reg) = fixed_rtt_register(7, Layout::new(1, 64).unwrap());
            let (_, new) = old_then_new(&mut sim, &reg, &[1], false);
            let m = sim.client();
            let (read, before, after) = sim
                .block_on(async move {
                    let words = || async {
                        let mut words = Vec::new();
                        for (i, rep) in reg.replicas.iter().enumerate() {
                            words.push(rep.probe(&m, &reg.layout.of_replica(i), 1).await.unwrap().max.unhomed());
                        }
                        words
                    };
                    let before = words().await;
                    let mut ctx = reader_with_delay(delay, &reg);
                    let read = reg.read(&mut ctx, &m, &mut RegCache::default()).await.map(|(meta, _)| meta);
                    (read, before, words().await)
                })
                .unwrap();
            assert_eq!(before.iter().filter(|&&w| w == new).count(), 1, "the set-up: one holder");
            if wrote_back {
                assert_eq!(read, Ok(new), "R = {delay} ns");
                assert!(
                    after.iter().filter(|&&w| w == new).count() >= 2,
                    "R = {delay} ns: not written back: {after:?}"
                );
            } else {
                assert_eq!(after, before, "R = {delay} ns: written back after R/2");
                assert!(read.is_err(), "R = {delay} ns: read {read:?}");
            }
        }
    }

    /// The same rule for a reader's lock (the rare path of a Safe-Guess
    /// read, [`crate::swarm::safeguess`]): a GUESSED tuple on every
    /// replica, whose writer stopped before verifying it, is returned only
    /// once the reader locked its timestamp, and a reader locks only within
    /// R/2 of the read that found it. With R below a roundtrip it never
    /// does, and the read gives up at wait-freedom's bound; with R as a
    /// store sets it, the read locks and returns the tuple. (The mutant
    /// `stale-write-back` locks either way.)
    #[test]
    fn a_reader_locks_a_guessed_tuple_only_soon_after_its_read() {
        for (delay, locks) in delays() {
            let (mut sim, reg) = fixed_rtt_register(7, Layout::new(1, 64).unwrap());
            let (_, new) = old_then_new(&mut sim, &reg, &[0, 1, 2], false);
            let m = sim.client();
            let read = sim
                .block_on(async move {
                    let mut ctx = reader_with_delay(delay, &reg);
                    let read = crate::swarm::safeguess::read(&mut ctx, &m, &reg, &mut RegCache::default()).await;
                    read.map(|(meta, v)| (meta, v.to_vec()))
                })
                .unwrap();
            if locks {
                assert_eq!(read, Ok((new, alloc::vec![2; 16])), "R = {delay} ns");
            } else {
                assert!(matches!(read, Err(RegError::NotWaitFree)), "R = {delay} ns: locked after R/2: {read:?}");
            }
        }
    }

    /// A read whose first majority holds the newest tuple on one replica
    /// only, with that copy spoiled (as a write that lands later than the
    /// timing assumption allows spoils one, `crate::swarm::recycle`),
    /// while the replica outside that majority holds the tuple whole:
    /// the read's restarts read every replica, and it returns the value,
    /// instead of failing with every node up (found by the SWARM-KV
    /// campaign, seed 2839; the mutant `restart-narrow` fails it).
    #[test]
    fn a_read_that_finds_only_a_spoiled_copy_reads_every_replica() {
        let (mut sim, reg) = fixed_rtt_register(7, Layout::new(1, 64).unwrap());
        let (_, new) = old_then_new(&mut sim, &reg, &[1, 2], true);
        let got = fresh_read(&mut sim, reg);
        assert_eq!(got, (Ok((new, alloc::vec![2; 16])), 2), "the read failed with every node up");
    }

    /// With the in-place copy on the first replica only and its node
    /// down, a read of an unchanged register still takes one roundtrip: it
    /// asks the other replicas for the entry of the tuple it last saw; a
    /// changed one takes the second roundtrip and returns the new value.
    #[test]
    fn reads_guess_the_value_while_the_in_place_copy_is_down() {
        let (mut sim, reg) = fixed_rtt_register(9, Layout::new(1, 64).unwrap().in_place_on_first());
        let m = sim.client();
        let write = |slot: u32, t: u64, v: u8| {
            let meta = Meta::new(t, slot, 1);
            let copy =
                LogCopy { place: Place { segment: 0, slot, start: 1 }, header: EntryHeader::of(meta, 0, 3, &[v; 16]) };
            (meta, copy)
        };
        let now = sim.now();
        sim.crash_node_at(0, now + 10 * RTT, CrashMode::FailFast);
        let (times, values) = sim
            .block_on(async move {
                let (mut w, mut wc) = (ClientCtx::new(1, || 0).unwrap(), RegCache::default());
                w.writing_in(0, 1);
                let (mut r, mut rc) = (ClientCtx::new(2, || 0).unwrap(), RegCache::default());
                let (meta, copy) = write(1, 1, 1);
                reg.write(&mut w, &m, &mut wc, meta, &copy, &[1; 16]).await.unwrap();
                let (mut times, mut values) = (Vec::new(), Vec::new());
                for round in 0..5 {
                    if round == 0 {
                        // Warm: this reader saw the tuple, then node 0 crashes.
                        reg.read(&mut r, &m, &mut rc).await.unwrap();
                        m.sleep(20 * RTT).await;
                    }
                    if round == 3 {
                        let (meta, copy) = write(2, 2, 2);
                        reg.write(&mut w, &m, &mut wc, meta, &copy, &[2; 16]).await.unwrap();
                    }
                    let t0 = m.now();
                    let (_, v) = reg.read(&mut r, &m, &mut rc).await.unwrap();
                    times.push(m.now() - t0);
                    values.push(v[0]);
                }
                (times, values)
            })
            .unwrap();
        // The first read learns that node 0 is down (a roundtrip more); the
        // next ones guess right; after the write, one guesses wrong, and
        // the next right again.
        assert_eq!(values, [1, 1, 1, 2, 2]);
        assert_eq!(&times[1..], &[RTT, RTT, 2 * RTT, RTT], "{times:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// App. A's specification: validity, read-read and write-read
        /// monotonicity, wait-freedom (every operation returns), under
        /// random schedules and a crashed minority.
        #[test]
        fn reliable_max_register_specification(seed in any::<u64>(), five in any::<bool>(), w in 1u8..4, r in 1u8..4, crash in any::<bool>()) {
            let ev = run(seed, if five { 5 } else { 3 }, w, r, crash);
            prop_assert_eq!(ev.len(), 5 * (w + r) as usize);
            for &(_, m, _, ret, is_write, _) in &ev {
                if is_write || m.is_bottom() {
                    continue;
                }
                // Validity: some write of m was invoked before the read returned.
                prop_assert!(ev.iter().any(|&(_, wm, inv, _, wr, _)| wr && wm == m && inv <= ret));
            }
            for &(_, m, inv, _, is_write, _) in &ev {
                if is_write {
                    continue;
                }
                for &(_, m2, _, ret2, w2, weak2) in &ev {
                    // Monotonicity: every write, and every full read, that
                    // completed before this read began is not above it (weak
                    // reads promise nothing to later reads).
                    if ret2 < inv && (w2 || !weak2) {
                        prop_assert!(m >= m2, "read {:?} after completed op of {:?}", m, m2);
                    }
                }
            }
        }
    }
}
