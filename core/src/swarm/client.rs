//! What one SWARM client owns, shared by every object it accesses: its id
//! (fixed, or leased so that no other live client has it), its view of the
//! writer logs and where its next write goes in its own, its allocator and
//! its clock.
//!
//! Times. A client's times are strictly increasing (`guessTs`, §3.2) and
//! follow its clock, moved forward after a stale guess (re-synchronisation)
//! by at most twice [`MAX_SKEW_NS`]: a time seen further ahead than that
//! comes from a wrong clock, and a write that would have to follow it fails
//! with [`ClientError::TimeAhead`] rather than carry every later write of
//! this client (and of those who see them) that far into the time space.
//!
//! Log entries. Writes take slot after slot of the client's current log
//! segment ([`crate::swarm::writerlog`]): nothing is reserved before the
//! first write, and a client that resumes a released lease goes on where
//! its predecessor stopped.

use crate::substrate::clock::{Clock, MAX_SKEW_NS};
use crate::substrate::exec::{Heavy, cold};
use crate::substrate::late::NodeView;
use crate::substrate::lease::{Held, LeaseError, Resumed};
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority};
use crate::substrate::space::slab::{Carry, Carver, SlabAllocator};
use crate::swarm::meta::{MAX_CLIENT, MAX_TIME, Meta, TIME_BITS};
use crate::swarm::writerlog::{LogError, LogGeometry, Logs, Place};
use crate::{Memory, NodeId};

/// Declares [`Paths`] from its list of counters, once: the struct and the
/// methods that go over every counter.
macro_rules! paths {
    ($($(#[$doc:meta])* $name:ident,)+) => {
        /// How often this client's operations took each of their rare paths:
        /// what a campaign asserts it exercised, and what a benchmark reports
        /// per operation. Plain counters, bumped where the path starts
        /// (SWARM's §7.8 breakdown, and the paths a test must reach).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Paths {
            $($(#[$doc])* pub $name: u64,)+
        }

        impl Paths {
            /// The sum of two tallies.
            pub fn add(&mut self, o: &Paths) {
                $(self.$name += o.$name;)+
            }

            /// What was counted since `earlier`, a tally of the same client.
            pub fn since(&self, earlier: &Paths) -> Paths {
                Paths { $($name: self.$name.saturating_sub(earlier.$name),)+ }
            }

            /// Every counter with its name, in declaration order.
            pub fn each(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),+].into_iter()
            }

            /// Sets the counter called `name` (as [`Paths::each`] names it);
            /// false if there is none.
            pub fn set(&mut self, name: &str, value: u64) -> bool {
                $(if name == stringify!($name) {
                    self.$name = value;
                    return true;
                })+
                false
            }
        }
    };
}

paths! {
    /// Safe-Guess writes whose guess was stale (the strong read, the lock).
    slow_writes,
    /// Reads that met a GUESSED tuple (Safe-Guess' read loop).
    unverified_reads,
    /// Of which a reader locked the writer's timestamp.
    reader_locks,
    /// Reads whose value came from a log entry (no matching in-place copy).
    out_of_place_reads,
    /// Reads whose value came from a replica's home copy, read after the
    /// metadata (a replica without in-place copy whose word says the value
    /// moved home: [`crate::swarm::recycle`]).
    home_reads,
    /// Writes of this client whose log entries were given back: superseded
    /// on a majority, or their value moved home on every replica that
    /// held it ([`crate::swarm::recycle`]).
    entries_recycled,
    /// Of which those whose value this client moved home on some replica.
    moved_home,
    /// Log segments of this client given back on a node, for its next
    /// segments there.
    segments_recycled,
    /// Of which those whose memory went to the node's pool, for any client
    /// ([`crate::swarm::writerlog::Logs::release_surplus`]).
    segments_released,
    /// Reads that wrote their tuple back to a majority.
    write_backs,
    /// Quorum operations that contacted more replicas than a majority (a
    /// replica of the first majority failed or was suspected).
    widened,
    /// Reads run again because the replicas holding their tuple failed
    /// between the quorum and the value.
    read_restarts,
    /// Inserts tried again waiting for every replica's allocation, after
    /// one left out as late cost their first write its majority.
    patient_inserts,
    /// Registers given the replicas their insert left out (on nodes that
    /// were late or down then).
    restored_replicas,
    /// Writes whose superseded version was still read-locked, so that its
    /// free waited for its readers (pDPM-Central's coordinator).
    deferred_frees,
    /// Answers whose key the coordinator found changed by another
    /// incarnation of it (one paused that came back, or its successor),
    /// and loaded again before it answered (pDPM-Central).
    fenced_answers,
    /// Writes whose copy went to a data node marked down before, which
    /// acknowledged it and is in use again (pDPM-Central's coordinator).
    nodes_readmitted,
    /// Requests during which pDPM-Central's coordinator freed versions an
    /// earlier incarnation of it had committed, once their readers' time
    /// was over.
    foreign_frees,
    /// View changes of the store's replicated index that this client led
    /// (a replica of the index failed under it).
    index_views,
    /// Replicas of the store's index that this client brought back as
    /// master (they came back with their memory after a failure).
    index_rejoins,
    /// Prepares of the index's next view that this client superseded as
    /// master (their master had run out of time).
    index_superseded,
    /// Replicas of the index that this client, as master, left out of the
    /// view it installed because its repair missed them.
    index_left_unrepaired,
    /// pDPM-Direct: locks taken over from a holder whose lease had expired
    /// (a client that died holding it).
    lock_takeovers,
    /// pDPM-Direct: redo copies replayed onto the committed spaces (by the
    /// client that took a lock over, or the next holder after a writer
    /// gave up between its rounds).
    redo_replays,
    /// Clover: hops of gets along a key's chain of versions, past a cursor
    /// that was not the tail (another client wrote since; pDPM §6 reports
    /// 0.2-0.3 per read).
    read_hops,
    /// Clover: hops of updates and deletes along a key's chain, after a
    /// CAS that found a link (pDPM §6: 3.7-3.9 per write).
    write_hops,
    /// Clover: cursors dropped because their buffer was recycled (another
    /// GC version, or another key's bytes, found there), and the operation
    /// started again from the key's head.
    stale_gc,
    /// Clover: cursors dropped for their age, and READs discarded for
    /// taking longer than the read time-out (pDPM §5.2); pDPM-Central:
    /// gets asked again because their READ was done later than their
    /// answer may be used.
    gc_timeouts,
    /// Clover: of those restarts, the ones that took the key's head from
    /// its cell (the shortcut, read one-sided: beside the get's READ, or
    /// after a CAS) rather than from a call to the metadata server.
    shortcuts,
    /// Clover: cursors older than their lifetime that a get used all the
    /// same, because the key's cell, read beside its READ, named them as
    /// the key's head (no restart, no roundtrip more).
    vouched_cursors,
    /// Clover: groups of buffers a client was handed that had been freed
    /// and recycled by the metadata server (garbage collection).
    recycled,
    /// Clover: writes that took a group of a larger size class than their
    /// version needs, as the client had none of its own class on the
    /// key's primary (its class is asked for beside the WRITE).
    larger_groups,
    /// Clover: CASes of a tail's header that lost to another client's
    /// (the writer follows the chain and tries again at the new tail).
    cas_retries,
    /// Clover: batches of free buffers fetched from the metadata server
    /// beside a write (in the background: no roundtrip of their own).
    refills,
    /// FUSEE: gets answered from the cached entry, its slot found unchanged
    /// in the same roundtrip (FUSEE §4.6).
    cache_hits,
    /// FUSEE: gets whose cached entry was stale (the slot changed), so
    /// that they looked the key up in the index again.
    stale_caches,
    /// FUSEE: gets, updates and inserts of a cached key that skipped its
    /// entry and went straight to the index, because more of the key's
    /// accesses had found it stale than the store's `bypass` threshold
    /// allows (the adaptive index cache, FUSEE §4.6).
    cache_bypasses,
    /// FUSEE: changes of a key's slot that found another client's change
    /// there first (a lost SNAPSHOT round, or a stale cached entry) and
    /// were tried again from the slot's current word.
    lost_changes,
    /// FUSEE: updates that lost their SNAPSHOT round to a change that took
    /// effect inside their own interval, and returned done, ordered just
    /// before it (FUSEE's losing writer, §4.3).
    overwritten,
    /// FUSEE: logs of an id's crashed previous holder walked when the id
    /// was opened again (§5.3).
    log_recoveries,
    /// FUSEE: of which the last operation was in doubt and recovery made
    /// its change (the key still mapped to the word it started from).
    log_redos,
    /// FUSEE: time those recoveries spent walking the logs (reading and
    /// scanning the anchored chunks), ns of the memory's clock (simulated,
    /// or wall time on the mapped backends).
    log_walk_ns,
    /// FUSEE: time they spent deciding the last entries (lookup, redo,
    /// commit), ns.
    log_redo_ns,
    /// Writes of an id's previous holder that could not be resolved from
    /// their entries alone (found on fewer than a majority of replicas: a
    /// writer that crashed mid-write), checked again later.
    entries_stuck,
    /// Ids opened after a holder that crashed: the log segments it left
    /// in use taken over, to be resolved and recycled by the new holder.
    crashed_logs_taken,
    /// Partly used chunks of a crashed holder taken over from their marks
    /// (`crate::substrate::space::slab`), to be carved on by the new holder.
    crashed_chunks_taken,
    /// Waits of a write for recycling to give one of its writer's segments
    /// back (backpressure): every segment number in use, or a node without
    /// room for another segment.
    room_waits,
}

/// How long a write waits for its writer's log to give a segment back
/// when it has none left or a node has no room for another
/// ([`ClientCtx::next_write`]), in units of R: long enough for a segment whose
/// last write was just written to be recycled (at most about 4 R, its
/// values moved home) and for an id's new holder to take over what its
/// predecessor left.
pub const ROOM_WAIT_R: u64 = 16;

/// Whether `e` says there is no room for a new segment: every number in
/// use, or a node out of memory.
#[cfg(feature = "alloc")]
fn no_room(e: &ClientError) -> bool {
    use crate::substrate::space::region::RegionError;
    use crate::substrate::space::slab::AllocError;
    matches!(
        e,
        ClientError::Log(LogError::Full { .. } | LogError::Alloc(AllocError::Region(RegionError::Exhausted { .. })))
    )
}

/// The recycling delay R ([`crate::swarm::recycle`]) of a store on a memory
/// whose operations time out after `timeout_ns`: eight time-outs, so that
/// a read whose quorums wait out a late node (a time-out each) can still
/// write back within R/2 ([`ClientCtx::fresh`]); at most a tenth of a
/// second (a memory's time-out is the most an operation may take to fail,
/// far above the time one takes to land: on shared memory, a second).
pub fn recycle_delay_ns(timeout_ns: Option<u64>) -> u64 {
    timeout_ns.map_or(100_000_000, |t| t.saturating_mul(8).min(100_000_000)).max(1)
}

/// One client's state.
pub struct ClientCtx<C> {
    /// This client's id, `1..=MAX_CLIENT`; it names its writes and its log.
    pub id: u8,
    /// The writer logs (directories and cached segments).
    pub logs: Heavy<Logs>,
    /// Remote memory allocation.
    pub slab: Heavy<SlabAllocator>,
    /// The nodes this client last saw fail or come late: the replicated
    /// objects start their majority with the others (SWARM §6).
    pub nodes: NodeView,
    /// The rare paths this client's operations took.
    pub paths: Paths,
    clock: C,
    /// Added to the clock after a stale guess (re-synchronisation), at most
    /// `ahead`.
    offset: u64,
    /// Ticks a time may run ahead of this client's clock.
    ahead: u64,
    last_time: u64,
    /// Where the next write goes: `None` until known (a fixed id looks at
    /// its log's directory before its first write).
    cursor: Option<Cursor>,
    /// Entries per segment once the cursor is open in this process (0:
    /// the next write opens it).
    per_segment: u32,
    lease: Option<Held>,
    /// The segment (number and start) the lease's record names as this
    /// holder's current one.
    named: (u32, u64),
    /// When this client's last read started (ns of the memory's clock), for
    /// [`ClientCtx::fresh`].
    pub(crate) read_at: Option<u64>,
    /// R, the recycling delay ([`crate::swarm::recycle`]), ns.
    delay: u64,
    /// What this client recycles of its log.
    #[cfg(feature = "alloc")]
    pub recycle: Heavy<crate::swarm::recycle::Recycler>,
    /// The segment numbers from which a new segment does not fit, and
    /// what the first of them found: a node without room (segments keep
    /// their memory with their number, so the numbers below have theirs).
    #[cfg(feature = "alloc")]
    room: Option<(u32, LogError)>,
}

/// Where a client's next write goes in its log: slot `next` of segment
/// `segment`, which started at time `start` (0: not started; the next
/// write starts it). What a released lease hands to the next holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The segment.
    pub segment: u32,
    /// Its next free slot.
    pub next: u32,
    /// Its start time, or 0.
    pub start: u64,
}

impl Cursor {
    /// The cursor and the last time used, as a lease record's payload.
    fn encode(self, last_time: u64) -> [u64; 3] {
        [(self.segment as u64) << 32 | self.next as u64, self.start, last_time]
    }

    fn decode(p: &[u64]) -> (Cursor, u64) {
        (Cursor { segment: (p[0] >> 32) as u32, next: p[0] as u32, start: p[1] }, p[2])
    }
}

/// Why a client could not be set up or could not name a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClientError {
    /// The id is 0 or above [`MAX_CLIENT`].
    BadId(u8),
    /// Timestamps ran out: the time needed passed [`MAX_TIME`].
    TimeExhausted {
        /// The time needed, in ticks since the store was set up.
        time: u64,
        /// Nanoseconds per tick.
        tick_ns: u64,
    },
    /// A write must follow a time further ahead of this client's clock than
    /// clocks may differ: some client's clock is wrong.
    TimeAhead {
        /// The time seen.
        seen: u64,
        /// This client's clock.
        now: u64,
        /// Nanoseconds per tick.
        tick_ns: u64,
    },
    /// The log could not be used.
    Log(LogError),
    /// The client's lease on its id could not be kept.
    Lease(LeaseError),
}

impl core::fmt::Display for ClientError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ClientError::BadId(id) => write!(f, "client id {id} is not in 1..={MAX_CLIENT}"),
            ClientError::TimeExhausted { time, tick_ns } => write!(
                f,
                "timestamps are exhausted: time {time} passed the limit of 2^{TIME_BITS} ticks of {tick_ns} ns \
                 ({} days after the store was set up)",
                (MAX_TIME as u128 * tick_ns as u128 / 86_400_000_000_000) as u64
            ),
            ClientError::TimeAhead { seen, now, tick_ns } => write!(
                f,
                "a write must follow time {seen}, {} ms ahead of this client's clock ({now}); clients' clocks must \
                 agree within {} ms, so some client's clock is wrong",
                (seen.saturating_sub(now) as u128 * tick_ns as u128 / 1_000_000) as u64,
                MAX_SKEW_NS / 1_000_000
            ),
            ClientError::Log(e) => write!(f, "{e}"),
            ClientError::Lease(e) => write!(f, "{e}"),
        }
    }
}

impl From<LogError> for ClientError {
    fn from(e: LogError) -> Self {
        ClientError::Log(e)
    }
}

impl From<LeaseError> for ClientError {
    fn from(e: LeaseError) -> Self {
        ClientError::Lease(e)
    }
}

/// `slab` with `lease`, split from a client's other fields.
fn carver<'a>(slab: &'a mut SlabAllocator, lease: &'a mut Option<Held>) -> Carver<'a> {
    Carver { slab, lease: lease.as_mut() }
}

impl<C: Clock> ClientCtx<C> {
    /// A client with the fixed id `id` and clock `clock`. The caller makes
    /// sure no other live client has the id (tests, one process that owns
    /// the store); [`ClientCtx::leased`] is the safe way.
    pub fn new(id: u8, clock: C) -> Result<Self, ClientError> {
        if id == 0 || id > MAX_CLIENT {
            return Err(ClientError::BadId(id));
        }
        let ahead = clock.ticks(2 * MAX_SKEW_NS);
        Ok(ClientCtx {
            id,
            logs: Heavy::new(Logs::new()),
            slab: Heavy::new(SlabAllocator::new()),
            nodes: NodeView::default(),
            paths: Paths::default(),
            clock,
            offset: 0,
            ahead,
            last_time: 0,
            cursor: None,
            per_segment: 0,
            lease: None,
            named: (u32::MAX, 0),
            read_at: None,
            delay: recycle_delay_ns(None),
            #[cfg(feature = "alloc")]
            recycle: Heavy::new(crate::swarm::recycle::Recycler::new(recycle_delay_ns(None))),
            #[cfg(feature = "alloc")]
            room: None,
        })
    }

    /// A client with the id of lease `held`, going on in its log where the
    /// id's previous holder stopped: in the same segment if it released the
    /// lease, in the next one if it crashed, at times after all of its.
    pub fn leased(held: Held, clock: C) -> Result<Self, ClientError> {
        let mut ctx = Self::new(held.id, clock)?;
        let resume = held.resume();
        ctx.slab.resume_from(&resume.payload);
        // The claim recorded the predecessor's cursor as taken.
        let (cursor, last) = Cursor::decode(&resume.payload);
        ctx.named = (cursor.segment, cursor.start);
        ctx.cursor = Some(match resume.state {
            Resumed::Fresh => Cursor::default(),
            Resumed::Released => {
                ctx.slab.take_over(&resume.payload);
                // Its predecessor's writes in the segment it goes on in are
                // read and resolved once its own are, before the segment
                // is given back (the mutant `release-goes-on` gives it back
                // under them: a value written last before the release is
                // lost).
                #[cfg(feature = "alloc")]
                if cursor.start != 0 && !mutant!("release-goes-on") {
                    ctx.recycle.resumed(cursor.segment, cursor.start);
                }
                cursor
            }
            // Its segment is taken over with the others it left in use;
            // the next write opens a new one.
            // Its chunks too, from the marks its last record names.
            Resumed::Crashed => {
                ctx.paths.crashed_logs_taken += 1;
                ctx.paths.crashed_chunks_taken += ctx.slab.take_over_marked(&resume.payload) as u64;
                Cursor { segment: cursor.segment, next: u32::MAX, start: cursor.start }
            }
        });
        ctx.last_time = last.max(resume.floor);
        ctx.lease = Some(held);
        Ok(ctx)
    }

    /// Makes segment `segment`, started at `start`, the one this client
    /// writes in: tests that name their writes' places by hand.
    #[cfg(test)]
    pub(crate) fn writing_in(&mut self, segment: u32, start: u64) {
        self.cursor = Some(Cursor { segment, next: 0, start });
        self.logs.write_in(self.id, segment, start);
    }

    /// R, the recycling delay ([`crate::swarm::recycle`]), ns.
    pub fn delay(&self) -> u64 {
        self.delay
    }

    /// Sets R ([`recycle_delay_ns`]) and, for the writes of
    /// an id's previous holder, the layout of the store's objects (their
    /// tags aside).
    pub fn configure(&mut self, delay_ns: u64, _layout: crate::swarm::inout::Layout) {
        self.delay = delay_ns.max(1);
        #[cfg(feature = "alloc")]
        self.recycle.configure(_layout, self.delay);
    }

    /// Whether a reader may still act (write back, lock) on what its last
    /// read found: within R/2 of its start ([`crate::swarm::recycle`]).
    pub fn fresh<M: Memory>(&self, mem: &M) -> bool {
        // (The mutant `stale-write-back` does not check.)
        if mutant!("stale-write-back") {
            return true;
        }
        match (mem.now_ns(), self.read_at) {
            (Some(now), Some(at)) => now.saturating_sub(at) <= self.delay / 2,
            _ => true,
        }
    }

    /// Notes the start of a read, for [`ClientCtx::fresh`]: on the coarse
    /// clock, which every read pays for, and which can only make the
    /// read look older than it is.
    pub fn note_read<M: Memory>(&mut self, mem: &M) {
        self.read_at = mem.coarse_now_ns();
    }

    /// Remembers a write of this client, so that its log entries are
    /// recycled ([`crate::swarm::recycle`]): `meta` of `value` to `reg`,
    /// in `place`.
    pub fn track<M: Memory>(
        &mut self,
        _mem: &M,
        _reg: &crate::swarm::maxreg::Register,
        _meta: Meta,
        _place: Place,
        _value: &[u8],
    ) {
        #[cfg(feature = "alloc")]
        {
            let home = (crate::swarm::inout::inplace_hash(_reg.layout.tag, _meta, _value), _value.len() as u64);
            let now = _mem.now_ns().unwrap_or(0);
            self.recycle.track(_meta, _place, _reg, home, now);
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// guessTs(): the local clock (re-synchronised), but strictly above
    /// every time this client used before.
    pub fn guess_time(&mut self) -> Result<u64, ClientError> {
        self.guess_at(self.clock.now())
    }

    /// [`ClientCtx::guess_time`] with the clock read at `now`.
    fn guess_at(&mut self, now: u64) -> Result<u64, ClientError> {
        let t = (now + self.offset).max(self.last_time + 1);
        self.use_time(t)
    }

    /// A time after `seen` (a write this one must follow: DM-ABD's write,
    /// Safe-Guess' rewrite), at least the next guess. Refused if `seen` is
    /// further ahead of this client's clock than clocks may differ.
    /// `now` is the clock, read.
    fn time_after(&mut self, seen: Meta, now: u64) -> Result<u64, ClientError> {
        if seen.time() > now + self.ahead {
            return Err(ClientError::TimeAhead { seen: seen.time(), now, tick_ns: self.clock.tick_ns() });
        }
        let t = (seen.time() + 1).max(now + self.offset).max(self.last_time + 1);
        self.use_time(t)
    }

    fn use_time(&mut self, t: u64) -> Result<u64, ClientError> {
        if t >= MAX_TIME {
            return Err(ClientError::TimeExhausted { time: t, tick_ns: self.clock.tick_ns() });
        }
        self.last_time = t;
        Ok(t)
    }

    /// After a stale guess: move the clock past `seen` so that the next
    /// guesses are fresh again, by at most the bound on clock differences.
    pub fn resync(&mut self, seen: Meta) {
        let now = self.clock.now() + self.offset;
        if seen.time() >= now {
            self.offset = (self.offset + seen.time() + 1 - now).min(self.ahead);
        }
    }

    /// The time and log place of this client's next write: a fresh guess,
    /// or a time after `after` (bottom for none). The lease, if any, is
    /// renewed first when half of it has passed.
    pub async fn next_write<M: Memory>(&mut self, mem: &M, after: Meta) -> Result<(u64, Place), ClientError> {
        // One reading of the clock serves the lease and the write's time
        // (it is on every write's path); it is read again after anything
        // that waits.
        let mut now = self.clock.now();
        if let Some(held) = &self.lease
            && held.needs_renewal(now)
        {
            cold(|| self.renew(mem)).await?;
            now = self.clock.now();
        }
        let c = match self.cursor {
            Some(c) if c.start != 0 && c.next < self.per_segment => c,
            _ => {
                let c = cold(|| self.open(mem)).await?;
                now = self.clock.now();
                c
            }
        };
        // After opening: the segment's start is below every time in it.
        let time = if after.is_bottom() { self.guess_at(now)? } else { self.time_after(after, now)? };
        self.cursor = Some(Cursor { next: c.next + 1, ..c });
        Ok((time, Place { segment: c.segment, slot: c.next, start: c.start }))
    }

    /// Renews the lease, if any, when half of it has passed (writes do it
    /// on their own; an idle client calls this).
    pub async fn keep<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        match &self.lease {
            Some(held) if held.needs_renewal(self.clock.now()) => self.renew(mem).await,
            _ => Ok(()),
        }
    }

    async fn renew<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        let now = self.clock.now();
        let Some(held) = &mut self.lease else { return Ok(()) };
        held.keep(mem, now).await.map_err(ClientError::Lease)
    }

    /// Makes the cursor name a started segment with a free slot: the one
    /// the client resumes, or a new one when it is full. A segment starts
    /// at a fresh time, below every time written in it and above every
    /// time of the segments before (numbers are reused once recycled:
    /// lookups go by start); a lease names it before it is used, so that a
    /// crash leaves the next holder after it. A new segment is created on
    /// every node at once, so that its entries' lock words exist wherever
    /// a reader may look for them (readers create nothing).
    ///
    /// A client whose every segment number is in use, or that finds a node
    /// without room for a new segment, recycles and waits for one of its
    /// segments to be given back (backpressure), up to [`ROOM_WAIT_R`]
    /// times R; past that, the error stands.
    async fn open<M: Memory>(&mut self, mem: &M) -> Result<Cursor, ClientError> {
        #[cfg(feature = "alloc")]
        {
            let began = mem.now_ns();
            loop {
                let err = match self.open_once(mem).await {
                    Err(e) if no_room(&e) => e,
                    done => return done,
                };
                let waited = match (began, mem.now_ns()) {
                    (Some(t0), Some(now)) => now.saturating_sub(t0),
                    _ => return Err(err),
                };
                // Nothing of this client's to give back: waiting is vain.
                if waited >= ROOM_WAIT_R * self.delay || self.recycle.segments_in_use() == 0 {
                    return Err(err);
                }
                self.paths.room_waits += 1;
                // Recycling reads registers: the read a write-back of this
                // operation may rest on keeps its own start.
                let read_at = self.read_at;
                self.keep(mem).await?;
                self.recycle(mem).await;
                self.read_at = read_at;
                crate::substrate::memory::pause(mem, (self.delay / 8).max(1)).await;
            }
        }
        #[cfg(not(feature = "alloc"))]
        self.open_once(mem).await
    }

    /// One try of [`ClientCtx::open`].
    async fn open_once<M: Memory>(&mut self, mem: &M) -> Result<Cursor, ClientError> {
        let geo = self.logs.any_geometry(mem).await?;
        self.per_segment = geo.per_segment as u32;
        self.adopt(mem).await?;
        let c = match self.cursor {
            Some(c) if c.start != 0 && c.next < self.per_segment => c,
            old => {
                let start = self.guess_time()?;
                let segment = self.next_segment(old, geo)?;
                Cursor { segment, next: 0, start }
            }
        };
        if let Some(held) = &mut self.lease
            && (c.segment, c.start) != self.named
        {
            self.slab.record(mem, held, c.encode(self.last_time), None).await?;
            self.named = (c.segment, c.start);
        }
        self.logs.write_in(self.id, c.segment, c.start);
        if self.cursor != Some(c) {
            self.cursor = Some(c);
            let created = self.create_everywhere(mem, c).await;
            // No room for it: the numbers from it on are not tried again,
            // and it is given back (created on some nodes).
            #[cfg(feature = "alloc")]
            if let Err(e @ ClientError::Log(found)) = created
                && no_room(&e)
            {
                if self.room.is_none_or(|(s, _)| c.segment < s) {
                    self.room = Some((c.segment, found));
                }
                self.recycle.close(c.segment);
                self.cursor = None;
            }
            created?;
        }
        Ok(c)
    }

    /// The number of the segment after `old` (this client's current one).
    fn next_segment(&mut self, _old: Option<Cursor>, geo: LogGeometry) -> Result<u32, ClientError> {
        let full = || LogError::Full { client: self.id, capacity: geo.capacity() };
        #[cfg(feature = "alloc")]
        {
            if let Some(c) = _old.filter(|c| c.start != 0) {
                self.recycle.close(c.segment);
            }
            let start = self.last_time;
            // Every number that fits in use: the log is full, or a node.
            let (limit, err) = match self.room {
                Some((s, found)) if (s as u64) < geo.segments => (s as u64, found),
                _ => (geo.segments, full()),
            };
            self.recycle.open(limit, start).ok_or(err.into())
        }
        #[cfg(not(feature = "alloc"))]
        {
            let s = _old.map_or(0, |c| if c.start == 0 { c.segment } else { c.segment + 1 });
            if s as u64 >= geo.segments { Err(full().into()) } else { Ok(s) }
        }
    }

    /// Creates segment `c` on every node that answers (the writer's own
    /// lookups then cost nothing); a node that does not is left for the
    /// first write that reaches it.
    async fn create_everywhere<M: Memory>(&mut self, mem: &M, c: Cursor) -> Result<(), ClientError> {
        let place = Place { segment: c.segment, slot: 0, start: c.start };
        let nodes: heapless::Vec<NodeId, { 4 * MAX_REPLICAS }> =
            (0..mem.node_count().min(4 * MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
        for group in nodes.chunks(MAX_REPLICAS) {
            for entry in self
                .logs
                .entries(
                    mem,
                    group,
                    self.id,
                    place,
                    Some(carver(&mut self.slab, &mut self.lease)),
                    majority(group.len()),
                )
                .await
            {
                match entry {
                    Ok(_) | Err(LogError::Mem(_) | LogError::Stale(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Learns, once, which of this id's segment numbers its previous
    /// holders left in use on the nodes (their writes are recycled as this
    /// client's own: [`crate::swarm::recycle`]).
    async fn adopt<M: Memory>(&mut self, _mem: &M) -> Result<(), ClientError> {
        #[cfg(feature = "alloc")]
        if !self.recycle.adopted() {
            // The rows of the nodes that answer. A number in use only on a
            // node that does not answer now may be taken again: the node
            // then holds the older segment under it, and refuses the new
            // one's entries (`LogError::Stale`) as if it were down.
            let mut used: alloc::vec::Vec<(u32, u64)> = alloc::vec::Vec::new();
            let nodes: heapless::Vec<NodeId, { 4 * MAX_REPLICAS }> =
                (0.._mem.node_count().min(4 * MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
            let mut answered = 0;
            for group in nodes.chunks(MAX_REPLICAS) {
                answered += self
                    .logs
                    .in_use_on(_mem, group, self.id, majority(group.len()), |_, s, start| {
                        if !used.contains(&(s, start)) {
                            used.push((s, start));
                        }
                    })
                    .await;
            }
            if answered == 0 {
                return Err(
                    LogError::NoQuorum(crate::MemError::new(NodeId(0), crate::MemErrorKind::Unreachable)).into()
                );
            }
            let current = self.cursor.filter(|c| c.start != 0 && c.next < self.per_segment).map(|c| c.segment);
            self.recycle.adopt(&used, current);
        }
        Ok(())
    }

    /// Takes, before the client's first operation, the roundtrips that
    /// would otherwise fall on it: opening every node's region and log
    /// directory, and the log segment of the next writes on every node (the
    /// paper's clients pre-allocate, §4.3). Unreachable nodes are skipped.
    /// No entry is used: a client that only reads leaves the segment to the
    /// id's next holder.
    pub async fn prepare<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        let c = match self.open(mem).await {
            Ok(c) => c,
            // No node answered: the first write opens the log.
            Err(ClientError::Log(LogError::NoQuorum(_) | LogError::Mem(_))) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.create_everywhere(mem, c).await
    }

    /// What connecting a key-value client does instead of
    /// [`prepare`](Self::prepare): reads every node's log directory (a node
    /// that was not set up for SWARM fails the connection; unreachable
    /// nodes are skipped), and where the segment that a resumed lease goes
    /// on in lives on the nodes that hold it, so that the first write finds
    /// it without a roundtrip. Allocates nothing: a client that only reads
    /// claims no memory, so that a full store stays readable by a new
    /// process. The first write opens its segment ([`next_write`](Self::next_write))
    /// and creates its entries where they are missing, as every later
    /// segment is.
    pub async fn open_logs<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        // The directories of every node at once; those late once a majority
        // answered are left out, and suspected (SWARM §6).
        let nodes: heapless::Vec<NodeId, { 4 * MAX_REPLICAS }> =
            (0..mem.node_count().min(4 * MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
        let mut segments = None;
        for group in nodes.chunks(MAX_REPLICAS) {
            let opened = self.logs.open_dirs(mem, group, majority(group.len())).await;
            for (&node, r) in group.iter().zip(opened) {
                match r {
                    Ok(()) => segments = segments.or(self.logs.known_geometry(node).map(|g| g.segments)),
                    Err(LogError::Mem(e)) => self.nodes.note(node, e.kind == crate::MemErrorKind::TimedOut),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let Some(c) = self.cursor.filter(|c| c.start != 0 && segments.is_some_and(|s| (c.segment as u64) < s)) else {
            return Ok(());
        };
        let place = Place { segment: c.segment, slot: 0, start: c.start };
        for group in nodes.chunks(MAX_REPLICAS) {
            for entry in self.logs.entries(mem, group, self.id, place, None, majority(group.len())).await {
                match entry {
                    Ok(_) | Err(LogError::Mem(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Gives the lease back, with where the next holder goes on: in the
    /// log, and in the partly used chunks of this client's allocator and
    /// `extra` (the caller's own). A client without a lease has nothing to
    /// give back.
    pub async fn release<M: Memory>(&mut self, mem: &M, extra: Option<Carry>) -> Result<(), ClientError> {
        let head = self.cursor.unwrap_or_default().encode(self.last_time);
        if let Some(held) = self.lease.take() {
            held.release(mem, &self.slab.hand_over(head, extra)).await?;
        }
        Ok(())
    }

    /// The id's lease, if it has one.
    pub fn lease(&self) -> Option<&Held> {
        self.lease.as_ref()
    }

    /// The writer logs, and the allocator with the lease its marks are
    /// recorded in: for code that creates log segments.
    pub fn logs_and_carver(&mut self) -> (&mut Logs, Carver<'_>) {
        (&mut self.logs, carver(&mut self.slab, &mut self.lease))
    }

    /// Records the allocator's marks in the lease's record if one moved
    /// (`crate::substrate::space::slab`): before objects carved are published.
    pub async fn record_marks<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        Ok(self.slab.record_marks(mem, self.lease.as_mut()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::Paths;

    #[test]
    fn paths_are_named_set_added_and_subtracted_counter_by_counter() {
        let mut a = Paths::default();
        let names: alloc::vec::Vec<&str> = a.each().map(|(name, _)| name).collect();
        assert!(names.contains(&"slow_writes") && names.contains(&"redo_replays"), "{names:?}");
        for (i, name) in names.iter().enumerate() {
            assert!(a.set(name, i as u64 + 1));
        }
        assert!(!a.set("no_such_path", 1));
        let mut b = a;
        b.add(&a);
        assert!(b.each().zip(a.each()).all(|((_, x), (_, y))| x == 2 * y));
        assert_eq!(b.since(&a), a);
        assert_eq!(a.since(&b), Paths::default(), "a later tally never counts below zero");
    }
}
