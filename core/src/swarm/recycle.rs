//! Recycling of writers' log entries (SWARM §4.5, §5.4), so that a client's
//! log is a bounded ring of segments rather than a space a workload uses
//! up.
//!
//! Every write puts its value in a fresh log entry of its writer on each
//! replica it reaches ([`crate::swarm::writerlog`]); the entry is named by
//! the write's metadata word, and holds its timestamp lock. The paper asks
//! readers to stop using buffers before they are reused, and leaves it at
//! that. Here the writer itself decides, replica by replica, when no one
//! can need an entry any more, and needs no answer from readers:
//!
//! ```text
//! for each write w of this client, R after it was written, and again every R:
//!   probe every replica of w's object: its largest word, w's word, its home's hash
//!   if a majority holds a later write:          w is dead; resolved
//!   elif w is VERIFIED (or later) on a majority:
//!     a replica holding w GUESSED:               CAS it VERIFIED
//!     a replica holding w, seen so R ago too:    move the value home, mark the word H
//!     none holds w with its value in the entry, and nothing was changed for R: resolved
//!   else:                                        read the register (Safe-Guess settles w)
//! a segment whose writes are all resolved, R after the last:
//!   mark it free on every node; its number and memory make the next segment
//! ```
//!
//! Why no one needs the entries of a resolved write:
//! - *Readers.* A read returns a value only after checking it: an entry by
//!   the id in its header and a checksum over the value, the object and
//!   the id; a home by a hash seeded by the word. A read that lands on a
//!   recycled entry reads again, and meets a later tuple or the value at
//!   home. No read ever returns recycled bytes, whatever the timing.
//! - *Write-backs and locks*, which change another client's entries. A
//!   reader writes back the tuple it read only while no majority is known
//!   to hold it, and locks only a GUESSED one. A word marked H says its
//!   tuple was VERIFIED on a majority before it was marked (the first
//!   rule of the loop), so neither happens for it; a dead write is below
//!   what every majority holds. Once a write is resolved, any majority of
//!   its replicas includes one that answered the last probe, and so holds
//!   the write at home or a later one: no reader acts on the write's
//!   entries again, even with a node that was down then and comes back
//!   holding the word unmarked. What was decided before lands within R:
//!   a reader posts a write-back or a lock only within R/2 of the read
//!   that decided it ([`ClientCtx::fresh`]), and operations land within
//!   R/2 of being posted. That last part is the timing assumption (partial
//!   synchrony), and only durability rests on it: a write-back that lands
//!   later than that spoils one node's copy of a newer write in the same
//!   entry, which readers detect and the writer rewrites from another
//!   replica when it moves the value home; a reader that finds no sound
//!   copy among the holders of its first majority reads every replica
//!   before it gives up (`Register::read_inner`), as the replicas outside
//!   it may hold the write too.
//! - *Home copies.* A home is written by a writer's background in-place
//!   copy after its word is installed, and by the move. The move waits R
//!   after it first saw the word on the replica, so that an older write's
//!   in-place copy posted before cannot land over the moved value.
//!
//! Entries are only ever reused by their own writer (a segment's memory
//! stays with its number on its node), so a late lock CAS can only find
//! an older timestamp of the same writer, below every lock a newer write
//! takes: harmless. A segment's number is reused once it was marked free
//! on every node that answers; a node that was down then is marked when it
//! answers again (until then it holds the old segment under the number,
//! and a write to it for the new one is refused as `Stale`, as if it were
//! down).
//!
//! What one resolution costs: a probe (one small READ) per replica, once
//! for a write superseded within R (the hot keys), three times for one that
//! stays the key's value (and the move: a CAS, with the value if the home
//! lacks it). None of it runs on an operation's path: a client runs it
//! between operations ([`ClientCtx::recycle`], what `KvClient::keep` does),
//! and a log holds about 2R to 4R of a client's writes.
//!
//! An id's next holder (after a release or a crash) takes over the segments
//! its predecessor left in use: it reads them, finds each write's object on
//! each node from the entry's header (which names it, checksummed), and
//! resolves those writes the same way. A write of which fewer than a
//! majority of entries are found (a writer that crashed in the middle)
//! cannot be told dead or settled from them alone: it keeps its segment
//! until a reader settles it ([`Paths::entries_stuck`]).
//!
//! [`Paths::entries_stuck`]: crate::swarm::client::Paths

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::substrate::clock::Clock;
use crate::substrate::join::join_vec;
use crate::substrate::memory::pause;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, majority};
use crate::swarm::client::ClientCtx;
use crate::swarm::inout::{Layout, Probe, Replica, inplace_hash};
use crate::swarm::maxreg::{PackedRegister, RegCache, Register};
use crate::swarm::meta::Meta;
use crate::swarm::safeguess;
use crate::swarm::writerlog::{ENTRY_ID_BYTES, EntryHeader, FREE, LogGeometry, Place, SegmentSet};
use crate::{Memory, NodeId, RemoteAddr};

/// One write of this client whose entries are not known free yet.
#[derive(Clone, Debug)]
struct Pending {
    /// Its word, as written (VERIFIED once known so).
    meta: Meta,
    place: Place,
    /// Its object's replicas that it may be on (all of the register's, or
    /// for a predecessor's write, those with its entry), and the layout.
    target: Target,
    /// Replicas of the register (a majority is of these).
    replicas: u8,
    /// Whether `target` is the whole register (a Safe-Guess read may settle
    /// the write).
    whole: bool,
    /// The in-place hash and length of its value.
    home: (u64, u64),
    /// When it was last probed (or written), ns.
    since: u64,
    /// When this client last changed a replica's word of it, ns (0: never).
    changed: u64,
    /// Replicas seen holding it with its value in the entry at the last
    /// probe: moved home at the next.
    seen: u16,
    /// Whether this client moved its value home somewhere.
    moved: bool,
}

/// The register a pending write went to: packed when it can be, so that
/// a write's record takes two cache lines rather than four. A write
/// stores its record into the queue's tail, memory untouched since the
/// last pass, and waits for those stores at its CAS: the record's size
/// is on every write's path.
#[derive(Clone, Debug)]
enum Target {
    Packed { reg: PackedRegister, tag: u64 },
    Whole(alloc::boxed::Box<Register>),
}

impl Target {
    fn of(reg: &Register) -> Target {
        match PackedRegister::pack(reg) {
            Some(packed) => Target::Packed { reg: packed, tag: reg.layout.tag },
            None => Target::Whole(alloc::boxed::Box::new(reg.clone())),
        }
    }

    fn register(&self) -> Register {
        match self {
            Target::Packed { reg, tag } => reg.unpack(*tag),
            Target::Whole(reg) => Register::clone(reg),
        }
    }
}

/// What this client knows of one of its segment numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Seg {
    /// Free everywhere: the next segment may take the number.
    #[default]
    Free,
    /// Holds writes: `pending` not resolved yet, the last resolved at
    /// `last` (ns); `open` while writes may still go to it; `scan` if it
    /// also holds a predecessor's writes (the segment a released id's next
    /// holder goes on in), read like an inherited segment's once this
    /// client's own are resolved.
    Used { start: u64, pending: u32, last: u64, open: bool, scan: bool },
    /// A predecessor's, not read yet.
    Inherited { start: u64 },
    /// Marked free where it could be; `owed` nodes (bits) still hold it
    /// under `start`.
    Owed { start: u64, owed: u32 },
}

/// One client's recycling state (see the module's documentation).
#[derive(Debug)]
pub struct Recycler {
    /// R, ns.
    delay: u64,
    /// The store's layout (its objects' tags aside), for a predecessor's
    /// writes.
    layout: Option<Layout>,
    pending: VecDeque<Pending>,
    segs: Vec<Seg>,
    /// Whether the directory rows were read (the numbers a predecessor left
    /// in use are known).
    adopted: bool,
    /// The numbers a predecessor left in use and stopped writing in (a
    /// crashed holder's), until this client gives them back.
    inherited: SegmentSet,
    /// When each segment was last given back, ns (0: never by this client).
    freed: Vec<u64>,
    /// When the segments given back and unused for [`HOLD_R`] recycling
    /// delays go to the nodes' pools next (a predecessor's too: at first).
    next_release: u64,
    /// This client's own metadata words that recycling changed (marked
    /// VERIFIED or H) since the last [`Recycler::take_rewrites`]: the next
    /// write to such a word must expect the new word rather than the one
    /// its key's cache holds, or its CAS fails and costs a roundtrip. The
    /// owner of the keys' caches applies them between operations, so that
    /// an operation looks nothing up.
    rewrites: Vec<Rewrite>,
}

/// A metadata word of this client that recycling changed, on the replica
/// at `base` on `node` of the register whose layout tag (a key-value
/// store's key hash) is `tag`: from `old` to `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// The register's layout tag.
    pub tag: u64,
    /// The replica's node.
    pub node: crate::NodeId,
    /// The replica's object.
    pub base: u64,
    /// The word before.
    pub old: u64,
    /// The word now.
    pub new: u64,
}

/// Rewrites kept for [`Recycler::take_rewrites`] at most (a client that
/// never takes them, a register's own test, forgets them: a write to a
/// word forgotten takes one more roundtrip, its CAS failing once).
const MAX_REWRITES: usize = 1 << 16;

/// Recycling delays a segment given back stays with its client id, unused,
/// before its memory goes to the node's pool (beyond
/// [`crate::swarm::writerlog::KEEP_FREE`] of them): the segments a burst
/// needed go to other clients, those of a steady load stay for its next
/// segments (1.6 s on shm).
pub const HOLD_R: u64 = 16;

/// How long a client that gives its id back goes on recycling the
/// segments a crashed predecessor left, at most, in recycling delays after
/// it read them: a write is resolved in about 3 R and its segment given
/// back R later ([`ClientCtx::settle_inherited`]).
pub const SETTLE_R: u64 = 6;

impl Recycler {
    /// A recycler with delay `delay_ns` ([`crate::swarm::client::recycle_delay_ns`]).
    pub fn new(delay_ns: u64) -> Self {
        Recycler {
            delay: delay_ns.max(1),
            layout: None,
            pending: VecDeque::new(),
            segs: Vec::new(),
            adopted: false,
            inherited: SegmentSet::default(),
            freed: Vec::new(),
            next_release: 0,
            rewrites: Vec::new(),
        }
    }

    /// R, ns.
    pub fn delay(&self) -> u64 {
        self.delay
    }

    /// Sets the store's layout and R (the key-value store's client, at
    /// connection).
    pub fn configure(&mut self, layout: Layout, delay_ns: u64) {
        self.layout = Some(layout);
        self.delay = delay_ns.max(1);
    }

    fn seg(&mut self, s: u32) -> &mut Seg {
        let i = s as usize;
        if self.segs.len() <= i {
            self.segs.resize(i + 1, Seg::Free);
        }
        &mut self.segs[i]
    }

    /// Notes that recycling changed this client's word on `rep`, of the
    /// register tagged `tag`, from `old` to `new`.
    /// Notes that segment `s` was given back at `now`.
    fn given_back(&mut self, s: usize, now: u64) {
        if self.freed.len() <= s {
            self.freed.resize(s + 1, 0);
        }
        self.freed[s] = now;
    }

    fn rewrote(&mut self, tag: u64, rep: Replica, old: u64, new: u64) {
        if self.rewrites.len() >= MAX_REWRITES {
            self.rewrites.clear();
        }
        self.rewrites.push(Rewrite { tag, node: rep.node, base: rep.base, old, new });
    }

    /// The words recycling changed since the last call, for the owner of
    /// the caches that hold them to apply.
    pub fn take_rewrites(&mut self) -> Vec<Rewrite> {
        core::mem::take(&mut self.rewrites)
    }

    /// Writes not known free yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Segment numbers in use (not free everywhere).
    pub fn segments_in_use(&self) -> usize {
        self.segs.iter().filter(|s| !matches!(s, Seg::Free)).count()
    }

    /// Whether the numbers a predecessor left in use were read.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// Notes the numbers in use on the nodes (a predecessor's segments, read
    /// from the directory rows): `used` with their starts.
    pub fn adopt(&mut self, used: &[(u32, u64)], current: Option<u32>) {
        for &(s, start) in used {
            if !matches!(self.seg(s), Seg::Free) {
                continue;
            }
            if Some(s) == current {
                // The mutant `release-goes-on` forgets its predecessor's
                // writes there (see `ClientCtx::leased`).
                let scan = !mutant!("release-goes-on");
                *self.seg(s) = Seg::Used { start, pending: 0, last: 0, open: true, scan };
            } else {
                *self.seg(s) = Seg::Inherited { start };
                self.inherited.insert(s);
            }
        }
        self.adopted = true;
    }

    /// Whether a segment a predecessor stopped writing in (one a crashed
    /// holder left) is still in use: not yet marked free where it could be.
    pub fn holds_inherited(&mut self) -> bool {
        let segs = &self.segs;
        let done: Vec<u32> = self
            .inherited
            .iter()
            .filter(|&s| !matches!(segs.get(s as usize), Some(Seg::Used { .. } | Seg::Inherited { .. })))
            .collect();
        for s in done {
            self.inherited.remove(s);
        }
        !self.inherited.is_empty()
    }

    /// The segment a released id's holder goes on in (`s`, started at
    /// `start`): its predecessor's writes there are read once this
    /// client's own are resolved.
    pub fn resumed(&mut self, s: u32, start: u64) {
        *self.seg(s) = Seg::Used { start, pending: 0, last: 0, open: true, scan: true };
    }

    /// A number for the next segment: free everywhere this client knows of,
    /// below `limit`; the segment it takes is open from `start`.
    pub fn open(&mut self, limit: u64, start: u64) -> Option<u32> {
        let mut taken = SegmentSet::default();
        for (s, seg) in self.segs.iter().enumerate() {
            if !matches!(seg, Seg::Free) {
                taken.insert(s as u32);
            }
        }
        let s = taken.first_absent(limit)?;
        *self.seg(s) = Seg::Used { start, pending: 0, last: 0, open: true, scan: false };
        Some(s)
    }

    /// The segment `s` takes no more writes (the cursor moved on).
    pub fn close(&mut self, s: u32) {
        if let Seg::Used { open, .. } = self.seg(s) {
            *open = false;
        }
    }

    /// Remembers a write of this client (its entries to recycle): `meta` in
    /// `place`, to `reg`, of a value whose in-place hash and length are
    /// `home`, at time `now` (ns).
    pub fn track(&mut self, meta: Meta, place: Place, reg: &Register, home: (u64, u64), now: u64) {
        match self.seg(place.segment) {
            Seg::Used { pending, .. } => *pending += 1,
            s => *s = Seg::Used { start: place.start, pending: 1, last: 0, open: true, scan: false },
        }
        let replicas = reg.replicas.len() as u8;
        self.pending.push_back(Pending {
            meta: meta.unhomed(),
            place,
            target: Target::of(reg),
            replicas,
            whole: true,
            home,
            since: now,
            changed: 0,
            seen: 0,
            moved: false,
        });
    }
}

/// What a probe says of one replica, for write `w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A later write.
    Above,
    /// `w` with its value at home.
    Home,
    /// `w` VERIFIED, its value in the entry.
    Entry,
    /// `w` GUESSED.
    Guessed,
    /// An earlier write (or none).
    Below,
    /// No answer.
    Failed,
}

fn state(w: Meta, p: &Probe) -> State {
    let m = p.max;
    if m.guessed() == w.guessed() && !m.is_deleted() {
        match (m.verified(), m.home()) {
            (_, true) => State::Home,
            (true, false) => State::Entry,
            (false, false) => State::Guessed,
        }
    } else if m.unhomed() > w.verify() {
        State::Above
    } else {
        State::Below
    }
}

/// What the probes of one write found, replica by replica.
type States = heapless::Vec<(State, Option<Probe>), MAX_REPLICAS>;

/// Due writes probed together at most (their probes' futures are held
/// together).
const BATCH: usize = 64;

/// Probes every replica of every write of `batch` at once (one roundtrip);
/// what each found, write by write.
async fn probe_all<M: Memory>(mem: &M, batch: &[(Pending, Register)], client: u8) -> Vec<States> {
    let futs = batch.iter().flat_map(|(_, reg)| reg.replicas.iter().map(|rep| rep.probe(mem, &reg.layout, client)));
    let mut probes = join_vec(futs.collect()).await.into_iter();
    batch
        .iter()
        .map(|(p, reg)| {
            (&mut probes)
                .take(reg.replicas.len())
                .map(|r| match r {
                    Ok(probe) => (state(p.meta, &probe), Some(probe)),
                    Err(_) => (State::Failed, None),
                })
                .collect()
        })
        .collect()
}

/// What a check decided for one write.
enum Outcome {
    /// Its entries are free (at the time given, ns).
    Resolved,
    /// Check again later.
    Again,
    /// Read the register first (Safe-Guess settles a GUESSED write).
    Settle,
}

impl<C: Clock> ClientCtx<C> {
    /// Recycles what can be of this client's log (see
    /// [`crate::swarm::recycle`]): checks the writes that are due, at most a
    /// few thousand, and frees the segments they leave empty. Runs between
    /// operations; a memory without a clock recycles nothing.
    pub async fn recycle<M: Memory>(&mut self, mem: &M) {
        let Some(now) = mem.now_ns() else { return };
        let mut rec = core::mem::replace(&mut *self.recycle, Recycler::new(1));
        rec.delay = self.delay();
        let delay = rec.delay;
        // Oldest first; a write not due yet ends the pass (those after it
        // were written later), except the ones put back. The due writes'
        // probes go out together, a batch at a time (one roundtrip per
        // batch); what they call for is done one write after the other.
        let mut again = VecDeque::new();
        loop {
            let mut batch: Vec<(Pending, Register)> = Vec::new();
            while batch.len() < BATCH {
                match rec.pending.pop_front() {
                    Some(p) if p.since + delay <= now => {
                        let reg = p.target.register();
                        batch.push((p, reg));
                    }
                    Some(p) => {
                        rec.pending.push_front(p);
                        break;
                    }
                    None => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let probes = probe_all(mem, &batch, self.id).await;
            for ((p, reg), states) in batch.into_iter().zip(probes) {
                self.act(mem, &mut rec, p, &reg, states, delay, now, &mut again).await;
            }
        }
        // Checked again R after this pass, after the writes not due yet.
        for p in again {
            rec.pending.push_back(p);
        }
        self.free_segments(mem, &mut rec, now).await;
        *self.recycle = rec;
    }

    /// Before a client gives its id back: goes on recycling, for at most
    /// [`SETTLE_R`] recycling delays, until the segments a crashed
    /// predecessor left are given back. Otherwise holders that each run
    /// one command (`swarm kv put`) would hand them on for ever, as none
    /// lives a few delays; a crash would cost a segment on every node until
    /// a longer-lived holder came. A memory without a clock waits for none.
    pub async fn settle_inherited<M: Memory>(&mut self, mem: &M) {
        let mut until = None;
        while self.recycle.holds_inherited() && !mutant!("inherited-left-in-use") {
            self.recycle(mem).await;
            // Timed from the first pass, which reads the segments.
            let Some(now) = mem.now_ns() else { return };
            let until = *until.get_or_insert(now.saturating_add(SETTLE_R * self.delay()));
            if now >= until {
                return;
            }
            pause(mem, self.delay() / 4).await;
        }
    }

    /// What the probes of write `p` call for: its entries recycled, it
    /// checked again later (put in `again`), or the register read first.
    #[allow(clippy::too_many_arguments)]
    async fn act<M: Memory>(
        &mut self,
        mem: &M,
        rec: &mut Recycler,
        mut p: Pending,
        reg: &Register,
        states: States,
        delay: u64,
        now: u64,
        again: &mut VecDeque<Pending>,
    ) {
        match self.check(mem, rec, &mut p, reg, states, delay).await {
            Outcome::Resolved => {
                self.paths.entries_recycled += 1;
                self.paths.moved_home += p.moved as u64;
                if let Seg::Used { pending, last, .. } = rec.seg(p.place.segment) {
                    *pending = pending.saturating_sub(1);
                    *last = now;
                }
            }
            Outcome::Again => again.push_back(p),
            Outcome::Settle => {
                if p.whole {
                    let mut cache = RegCache::default();
                    let _ = safeguess::read(self, mem, reg, &mut cache).await;
                    p.changed = mem.now_ns().unwrap_or(now);
                } else {
                    self.paths.entries_stuck += 1;
                }
                again.push_back(p);
            }
        }
    }

    /// One check of write `p` (the loop of [`crate::swarm::recycle`]), on
    /// what its probes found.
    async fn check<M: Memory>(
        &mut self,
        mem: &M,
        rec: &mut Recycler,
        p: &mut Pending,
        reg: &Register,
        states: States,
        delay: u64,
    ) -> Outcome {
        let now = mem.now_ns().unwrap_or(p.since);
        let count = |f: &dyn Fn(State) -> bool| states.iter().filter(|(s, _)| f(*s)).count();
        let maj = majority(p.replicas as usize);
        p.since = now;
        if count(&|s| s == State::Above) >= maj {
            return Outcome::Resolved;
        }
        // The mutant `home-unsettled` moves values home without knowing the
        // write is on a majority: the H it sets then tells readers a
        // majority holds a write that only a minority may hold.
        if count(&|s| matches!(s, State::Above | State::Home | State::Entry)) < maj && !mutant!("home-unsettled") {
            return Outcome::Settle;
        }
        // VERIFIED (or later) on a majority: every replica holding it with
        // its value in the entry moves it home, and a GUESSED one is marked
        // VERIFIED (as a reader's mark would do), all at once.
        let seen = core::mem::take(&mut p.seen);
        let mut busy = false;
        let (mut marks, mut moves) =
            (heapless::Vec::<Replica, MAX_REPLICAS>::new(), heapless::Vec::<_, MAX_REPLICAS>::new());
        for (r, (s, probe)) in states.iter().enumerate() {
            let rep = reg.replicas[r];
            match s {
                State::Guessed => {
                    let _ = marks.push(rep);
                    busy = true;
                }
                State::Entry if seen & (1 << r) == 0 => {
                    p.seen |= 1 << r;
                    busy = true;
                }
                State::Entry => {
                    let _ = moves.push((rep, probe.is_some_and(|pr| pr.home == p.home)));
                    p.changed = now;
                    busy = true;
                }
                State::Failed => busy |= count(&|s| s != State::Failed) < maj,
                State::Above | State::Home | State::Below => {}
            }
        }
        if !marks.is_empty() || !moves.is_empty() {
            self.mark_and_move(mem, rec, p, reg, &marks, &moves, now).await;
        }
        if busy || now < p.changed + delay {
            return Outcome::Again;
        }
        Outcome::Resolved
    }

    /// Marks write `p` VERIFIED on the replicas `marks` (which hold it
    /// GUESSED), and moves its value home on `moves` (with whether their
    /// home holds it already), all at once.
    #[allow(clippy::too_many_arguments)]
    async fn mark_and_move<M: Memory>(
        &mut self,
        mem: &M,
        rec: &mut Recycler,
        p: &mut Pending,
        reg: &Register,
        marks: &[Replica],
        moves: &[(Replica, bool)],
        now: u64,
    ) {
        let (client, layout) = (self.id, reg.layout);
        // The value, read once, for the homes that lack it.
        let value = match moves.iter().find(|(_, at_home)| !at_home) {
            Some((rep, _)) => alloc::boxed::Box::pin(self.entry_value(mem, p, reg, rep)).await,
            None => None,
        };
        let (guessed, want) = (p.meta.guessed(), p.meta.verify());
        let value = value.as_deref();
        // One future type for both, each boxed by `join_vec`: only what is
        // done takes room.
        let acts = marks.iter().map(|&rep| (rep, None)).chain(moves.iter().map(|&(rep, home)| (rep, Some(home))));
        let run = |(rep, home): (Replica, Option<bool>)| async move {
            match (home, value) {
                (None, _) => {
                    let word = RemoteAddr::new(rep.node, rep.base + layout.word_of(client));
                    mem.cas(word, guessed.0, want.0).await.is_ok_and(|prev| prev == guessed.0)
                }
                (Some(true), _) => rep.move_home(mem, &layout, want, None).await == Ok(true),
                (Some(false), Some(v)) => rep.move_home(mem, &layout, want, Some(v)).await == Ok(true),
                (Some(false), None) => false,
            }
        };
        let done = join_vec(acts.clone().map(run).collect()).await;
        for ((rep, home), ok) in acts.zip(done) {
            match (home, ok) {
                (None, true) => {
                    p.changed = now;
                    rec.rewrote(layout.tag, rep, guessed.0, want.0);
                }
                (Some(_), true) => {
                    p.moved = true;
                    rec.rewrote(layout.tag, rep, want.0, want.homed().0);
                }
                (_, false) => {}
            }
        }
    }

    /// The value of write `p` from its entry on `rep`'s node, else on
    /// another replica's node (checked: it may have been spoiled).
    async fn entry_value<M: Memory>(&mut self, mem: &M, p: &Pending, reg: &Register, rep: &Replica) -> Option<Vec<u8>> {
        let mut order: heapless::Vec<Replica, MAX_REPLICAS> = heapless::Vec::new();
        let _ = order.push(*rep);
        order.extend(reg.replicas.iter().copied().filter(|r| r != rep));
        for r in order {
            let found = self.logs.entries(mem, &[r.node], self.id, p.place, None, 1).await;
            let Some(Ok(Some(entry))) = found.into_iter().next() else { continue };
            let layout = reg.layout;
            if let Ok((_, v)) = r.read_out_of_place(mem, &layout, entry, layout.max_value, p.meta).await {
                return Some(v.to_vec());
            }
        }
        None
    }

    /// Marks free, on every node, the segments whose writes are all
    /// resolved since R; takes over a predecessor's segments; retries the
    /// nodes that owe a mark.
    async fn free_segments<M: Memory>(&mut self, mem: &M, rec: &mut Recycler, now: u64) {
        let nodes = mem.node_count().min(32);
        for s in 0..rec.segs.len() {
            let seg = rec.segs[s];
            match seg {
                // Its own writes resolved: its predecessor's are read now.
                Seg::Used { start, pending: 0, last, open: false, scan: true } if now >= last + rec.delay => {
                    rec.segs[s] = Seg::Inherited { start };
                }
                Seg::Used { start, pending: 0, last, open: false, scan: false } if now >= last + rec.delay => {
                    let mut owed = 0u32;
                    for n in 0..nodes {
                        if self.logs.mark_free(mem, NodeId(n as u16), self.id, s as u32).await.is_err() {
                            owed |= 1 << n;
                        }
                    }
                    self.paths.segments_recycled += 1;
                    rec.segs[s] = if owed == 0 { Seg::Free } else { Seg::Owed { start, owed } };
                    rec.given_back(s, now);
                }
                Seg::Owed { start, owed } => {
                    let mut left = owed;
                    for n in 0..nodes {
                        if owed & (1 << n) != 0 && self.owe_free(mem, NodeId(n as u16), s as u32, start).await {
                            left &= !(1 << n);
                        }
                    }
                    rec.segs[s] = if left == 0 { Seg::Free } else { Seg::Owed { start, owed: left } };
                    rec.given_back(s, now);
                }
                Seg::Inherited { start } => {
                    if let Some(n) = self.take_over(mem, rec, s as u32, start, now).await {
                        rec.segs[s] = Seg::Used { start, pending: n, last: now, open: false, scan: false };
                    }
                }
                _ => {}
            }
        }
        // Segments given back and left unused for a while (beyond a few):
        // their memory goes to each node's pool, for any client. Checked
        // every HOLD / 2 (a node that does not answer is tried again then,
        // not at every pass: a stalled node costs a pass its time-out).
        if now >= rec.next_release {
            let hold = HOLD_R * rec.delay;
            let mut busy = SegmentSet::default();
            for (s, seg) in rec.segs.iter().enumerate() {
                let recent = rec.freed.get(s).is_some_and(|&at| now < at.saturating_add(hold));
                if !matches!(seg, Seg::Free) || recent {
                    busy.insert(s as u32);
                }
            }
            for n in 0..nodes {
                if let Ok(k) = self.logs.release_surplus(mem, NodeId(n as u16), self.id, &busy).await {
                    self.paths.segments_released += k as u64;
                }
            }
            rec.next_release = now + hold / 2;
        }
    }

    /// Marks segment `s` free on `node` if it still holds the one that
    /// started at `start` there (a node that did not answer when it was
    /// freed); whether nothing is owed there any more.
    async fn owe_free<M: Memory>(&mut self, mem: &M, node: NodeId, s: u32, start: u64) -> bool {
        let mut held = None;
        if self
            .logs
            .in_use(mem, node, self.id, |n, st, _| {
                if n == s {
                    held = Some(st);
                }
            })
            .await
            .is_err()
        {
            return false;
        }
        match held {
            Some(st) if st == start => self.logs.mark_free(mem, node, self.id, s).await.is_ok(),
            _ => true,
        }
    }

    /// Reads a predecessor's segment `s` (started at `start`) on every
    /// node, and tracks the writes found in it; how many, or `None` if a
    /// node that holds it did not answer (tried again later).
    async fn take_over<M: Memory>(&mut self, mem: &M, rec: &mut Recycler, s: u32, start: u64, now: u64) -> Option<u32> {
        let layout = rec.layout?;
        let mut found: Vec<(EntryHeader, Replica, Vec<u8>)> = Vec::new();
        for n in 0..mem.node_count().min(32) {
            let node = NodeId(n as u16);
            let mut at = None;
            self.logs
                .in_use(mem, node, self.id, |k, st, off| {
                    if k == s && st == start {
                        at = Some(off);
                    }
                })
                .await
                .ok()?;
            let Some(offset) = at else { continue };
            let geo = self.logs.geometry(mem, node).await.ok()?;
            self.scan(mem, node, (offset, start), &geo, layout, &mut found).await?;
        }
        // One pending write per id, with the replicas its entries name.
        let mut count = 0;
        found.sort_by_key(|(h, r, _)| (h.id, r.node));
        let mut i = 0;
        while i < found.len() {
            let id = found[i].0.id;
            let j = (i..found.len()).find(|&j| found[j].0.id != id).unwrap_or(found.len());
            let (h, _, v) = &found[i];
            let tagged = layout.tagged(h.tag);
            let mut reg = Register { layout: tagged, replicas: heapless::Vec::new() };
            for (_, r, _) in &found[i..j] {
                let _ = reg.replicas.push(*r);
            }
            let home = (inplace_hash(tagged.tag, id, v), v.len() as u64);
            // All its replicas found: a read of the register may settle it
            // (in another order than the key's: only where the in-place
            // copy is read differs, and every replica has a home).
            let whole = reg.replicas.len() == h.replicas as usize;
            let place = Place { segment: s, slot: id.slot(), start };
            rec.pending.push_back(Pending {
                meta: id,
                place,
                target: Target::of(&reg),
                replicas: h.replicas,
                whole,
                home,
                since: now,
                changed: 0,
                seen: 0,
                moved: false,
            });
            count += 1;
            i = j;
        }
        Some(count)
    }

    /// The writes of this client in the segment at `offset` on `node` that
    /// started at `start`: headers that check, with the object they name.
    /// An entry older than the start is an earlier segment's under the
    /// same number (its slot was not written again there: a write's
    /// entries are on the replicas that do not hold it in place), resolved
    /// before that segment was given back.
    async fn scan<M: Memory>(
        &mut self,
        mem: &M,
        node: NodeId,
        (offset, start): (u64, u64),
        geo: &LogGeometry,
        layout: Layout,
        found: &mut Vec<(EntryHeader, Replica, Vec<u8>)>,
    ) -> Option<()> {
        for slot in 0..geo.per_segment {
            let at = RemoteAddr::new(node, offset.checked_add(slot * geo.entry_size)?.checked_add(8)?);
            let b = mem.read(at, ENTRY_ID_BYTES + layout.max_value as usize).await.ok()?;
            let Some(h) = EntryHeader::decode(&b) else { continue };
            let mine = h.id.client() == self.id && h.id.slot() as u64 == slot && h.id.time() >= start;
            if h.id.is_bottom() || !mine || h.len > layout.max_value {
                continue;
            }
            let end = ENTRY_ID_BYTES + h.len as usize;
            if b.len() < end || !h.checks(h.tag, &b[ENTRY_ID_BYTES..end]) || h.obj == 0 || h.obj == FREE {
                continue;
            }
            found.push((h, Replica { node, base: h.obj }, b[ENTRY_ID_BYTES..end].to_vec()));
        }
        Some(())
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;
