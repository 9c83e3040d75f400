//! Leases of client ids, kept on a majority of nodes: a client claims a
//! free id with CAS, renews its lease while it runs, and gives it back when
//! it stops; a crashed client's id becomes free when its lease has expired.
//! Two live clients never hold one id, so what an id names (a writer log,
//! a timestamp's writer) is never used by two processes at once.
//!
//! Each table node holds, found through root slot [`roots::LEASES`]:
//!
//! ```text
//! header      magic | ids | lease length (ns) | 0…                 (64 B)
//! words       lease word of id 0 (unused), 1, …, ids               (8 B each)
//! records     per id: version (8) | state (8) | payload (160×8) | checksum (8)
//! ```
//!
//! The *lease word* is the holder's nonce and its expiry, in ticks of the
//! clients' common clock (0: free). A client claims an id with one CAS per
//! node, from the word it read there to its own, and holds the id if its
//! CAS won on a majority of the table's nodes; it gives back what it won
//! otherwise. A word is free if it is 0 or expired for longer than the
//! grace ([`MAX_SKEW_NS`] for clocks that differ, and twice it for the
//! times a holder may run ahead of its clock): by then its holder has
//! stopped using the id, by its own clock. Two claimers both winning would
//! need a node where each replaced a word the other held unexpired.
//!
//! The *record* says where a holder's use of the id stands, for the next
//! holder: a payload the user of the table defines (the SWARM client's log
//! cursor and last time, the marks of the chunks it carves:
//! `crate::substrate::space::slab`), and whether it was taken (the holder
//! may have gone beyond it, having crashed) or released (the holder
//! stopped there).
//! A claim reads the records in the same pipeline as its CAS, so that it
//! sees the last record its predecessor completed on a majority, and a
//! holder writes a record to a majority before it acts on it. Versions
//! order records: the claim number, then the holder's writes.
//!
//! A holder renews its lease by CAS from its own words. One that finds its
//! word replaced (it was paused or late past its lease, and another client
//! claimed the id) has lost the id for good, even once that client gave
//! the id back: what it knew of the id's use (a log's cursor, its times,
//! its free buffers) is stale, and only a new claim, which reads the
//! record its predecessor left, may use the id again.
//!
//! The rule assumes clients' clocks differ by less than [`MAX_SKEW_NS`] and
//! a client is never paused, between checking its lease and using the id,
//! for longer than the grace.

use core::fmt;

use xxhash_rust::xxh3::xxh3_64;

use crate::substrate::clock::{Clock, MAX_SKEW_NS};
use crate::substrate::exec::cold;
use crate::substrate::late::{Watch, late};
use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::quorum::{MAX_REPLICAS, join_timely, majority};
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::roots;
use crate::{MemError, Memory, NodeId, Op, OpOutput, RemoteAddr};

/// "SWLEASE1".
const MAGIC: u64 = u64::from_le_bytes(*b"SWLEASE1");
/// Bytes of the header.
const HEADER: u64 = 64;
/// Words of a record's payload: what a holder hands to the next (the
/// SWARM client's log cursor and time, the partly used chunks it carves).
pub const PAYLOAD_WORDS: usize = 160;
/// A record's payload.
pub type Payload = [u64; PAYLOAD_WORDS];
/// Bytes of a record: version, state, payload, checksum.
const BODY: usize = 8 * (PAYLOAD_WORDS + 3);
/// Bytes a record takes in the table (cache lines).
const RECORD: u64 = (BODY as u64).next_multiple_of(64);
/// The most ids a table has (ids `1..=MAX_IDS`).
pub const MAX_IDS: u8 = 127;
/// The lease length of a store that does not say (`swarm kv init --lease`).
pub const DEFAULT_LENGTH_NS: u64 = 10_000_000_000;
/// Bits of a lease word's expiry (ticks); the nonce has the others.
const EXPIRY_BITS: u32 = 45;
const EXPIRY_MASK: u64 = (1 << EXPIRY_BITS) - 1;

/// A failure to claim, keep or give back a lease.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseError {
    /// A memory operation failed.
    Mem(MemError),
    /// No majority of the table's nodes answered.
    NoQuorum,
    /// The node holds no lease table, or a damaged one.
    Corrupt {
        /// The node.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The id asked for is held by a live client.
    Taken {
        /// The id.
        id: u8,
        /// Milliseconds until it may be claimed, if its holder stops now.
        free_in_ms: u64,
    },
    /// Every id is held.
    NoFreeId {
        /// Ids the table has.
        ids: u8,
    },
    /// The lease expired and another client claimed the id.
    Lost {
        /// The id.
        id: u8,
    },
    /// An id outside the table.
    BadId {
        /// The id.
        id: u8,
        /// Ids the table has.
        ids: u8,
    },
    /// The table could not be set up on a node's region (no room left for
    /// it, or a bad header): the region's error.
    Region(RegionError),
}

impl From<MemError> for LeaseError {
    fn from(e: MemError) -> Self {
        LeaseError::Mem(e)
    }
}

impl From<RegionError> for LeaseError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Mem(m) => LeaseError::Mem(m),
            e => LeaseError::Region(e),
        }
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LeaseError::Mem(e) => write!(f, "{e}"),
            LeaseError::NoQuorum => {
                write!(f, "no majority of the lease table's nodes answered to claim, renew or give back a client id")
            }
            LeaseError::Corrupt { node, what } => write!(f, "{node}: corrupt lease table: {what}"),
            LeaseError::Taken { id, free_in_ms } => {
                write!(f, "client id {id} is held by a live client (free in {free_in_ms} ms if it stops now)")
            }
            LeaseError::NoFreeId { ids } => write!(f, "all {ids} client ids are held by live clients"),
            LeaseError::Lost { id } => {
                write!(f, "the lease on client id {id} expired and another client claimed the id")
            }
            LeaseError::BadId { id, ids } => write!(f, "client id {id} is not in 1..={ids}"),
            LeaseError::Region(e) => write!(f, "cannot set up the lease table: {e}"),
        }
    }
}

/// Which id a claim asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    /// The lowest free id (the one whose log goes on where it stopped).
    Any,
    /// This id, or an error that says who holds it.
    Id(u8),
}

/// How the previous holder of a claimed id left it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resumed {
    /// Never held.
    Fresh,
    /// Given back: the payload is exactly where it stopped.
    Released,
    /// Its lease expired while it held the id: it may have gone past the
    /// payload (the last one it recorded).
    Crashed,
}

/// What a claim found of the id's previous holder.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Resume {
    /// How it left the id.
    pub state: Resumed,
    /// The last payload it recorded.
    pub payload: Payload,
    /// Times at or below this may have been used by it (a crashed holder's
    /// expiry plus how far its times may run ahead of its clock); 0 if none.
    pub floor: u64,
}

/// Where a table is on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Site {
    node: NodeId,
    base: u64,
}

/// The lease table of a set of nodes (a store's first 2f+1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTable {
    sites: heapless::Vec<Site, MAX_REPLICAS>,
    /// Nodes the table was set up on (a majority of these must answer);
    /// those without a site did not answer when it was opened.
    nodes: heapless::Vec<NodeId, MAX_REPLICAS>,
    ids: u8,
    length_ns: u64,
}

/// A lease held: its id, and what is needed to renew and give it back.
#[derive(Debug)]
pub struct Held {
    table: LeaseTable,
    /// The id.
    pub id: u8,
    /// This holder's word on each site, where its claim won (0 elsewhere).
    words: [u64; MAX_REPLICAS],
    /// On each site it does not hold, the word last seen there: the next
    /// renewal takes the site if that word is free or this holder's own.
    seen: [u64; MAX_REPLICAS],
    nonce: u64,
    grace: u64,
    expiry: u64,
    length: u64,
    version: u64,
    resume: Resume,
    /// Another claimer replaced this holder's word on a site: the id was
    /// taken over while this holder was paused or late, and what it knows
    /// of the id's use is stale. For good: only a new claim, which reads
    /// the next holder's record, may use the id again.
    lost: bool,
    /// The latest expiry this holder wrote (or tried to) in a word: a
    /// word with its nonce and an expiry up to this is its own.
    posted: u64,
}

/// Sets up an empty lease table of `ids` ids and leases of `length_ns` on
/// `node` (once, after [`Region::format`]: its memory reads as zero).
pub async fn format<M: Memory>(mem: &M, node: NodeId, ids: u8, length_ns: u64) -> Result<(), LeaseError> {
    let ids = ids.min(MAX_IDS);
    let mut region = Region::open(mem, node).await?;
    let bytes = table_bytes(ids);
    let base = region.alloc_chunks(mem, bytes.div_ceil(region.chunk)).await?;
    let mut header = [0u8; 24];
    for (i, w) in [MAGIC, ids as u64, length_ns].into_iter().enumerate() {
        header[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    mem.write(base, &header).await?;
    Region::claim_root(mem, node, roots::LEASES, base.offset).await?;
    Ok(())
}

/// Ticks of `clock` that a lease's holder is given past its expiry before
/// what it held may go to another client: [`MAX_SKEW_NS`] for clocks that
/// differ, and twice it for the times a holder may run ahead of its clock
/// (and its last operations, sent before the expiry, to land). The rule of
/// this table, and of every lease the toolkit keeps on a CAS word (a
/// pDPM-Direct entry's lock).
pub fn grace<C: Clock>(clock: &C) -> u64 {
    clock.ticks(3 * MAX_SKEW_NS)
}

/// Bytes of a table of `ids` ids on one node (what [`format`] takes, in
/// whole chunks): header, lease words and records.
pub fn table_bytes(ids: u8) -> u64 {
    let ids = ids.min(MAX_IDS);
    records_at(ids) + RECORD * (ids as u64 + 1)
}

fn word(nonce: u64, expiry: u64) -> u64 {
    nonce << EXPIRY_BITS | (expiry & EXPIRY_MASK)
}

fn expiry_of(word: u64) -> u64 {
    word & EXPIRY_MASK
}

/// Where the records start, after the header and the lease words.
fn records_at(ids: u8) -> u64 {
    (HEADER + 8 * (ids as u64 + 1)).next_multiple_of(64)
}

/// A record: version, state, `payload` (zeros after it), checksum.
fn encode(id: u8, version: u64, state: u64, payload: &[u64]) -> [u8; BODY] {
    let mut b = [0u8; BODY];
    b[..8].copy_from_slice(&version.to_le_bytes());
    b[8..16].copy_from_slice(&state.to_le_bytes());
    for (i, w) in payload.iter().take(PAYLOAD_WORDS).enumerate() {
        b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    let sum = xxh3_64(&b[..BODY - 8]) ^ id as u64;
    b[BODY - 8..].copy_from_slice(&sum.to_le_bytes());
    b
}

const TAKEN: u64 = 1;
const RELEASED: u64 = 2;

/// A record read back: `(version, state, payload)`, or `None` for a bad
/// checksum (a torn or damaged record counts as absent).
fn decode(id: u8, b: &[u8]) -> Option<(u64, u64, Payload)> {
    let b = b.get(..BODY)?;
    if word_at(b, BODY - 8)? != xxh3_64(&b[..BODY - 8]) ^ id as u64 {
        return None;
    }
    let mut payload = [0u64; PAYLOAD_WORDS];
    for (i, w) in payload.iter_mut().enumerate() {
        *w = word_at(b, 16 + 8 * i)?;
    }
    Some((word_at(b, 0)?, word_at(b, 8)?, payload))
}

/// How long a lease operation waits for the sites beyond a majority: as
/// long as a quorum waits for a late replica (SWARM §6). A site left out
/// of a claim or a renewal is taken at a later renewal
/// ([`Held::renew`]), so a stalled node costs the lease nothing while
/// the others answer (§7.7).
fn patience<M: Memory>(mem: &M) -> Watch<'_> {
    Watch::on(mem)
}

impl LeaseTable {
    /// The table on `nodes`, from each node's header (a majority must
    /// answer, and agree).
    pub async fn open<M: Memory>(mem: &M, nodes: &[NodeId]) -> Result<LeaseTable, LeaseError> {
        let nodes = &nodes[..nodes.len().min(MAX_REPLICAS)];
        let futs = nodes.iter().map(|&n| Self::site(mem, n)).collect();
        let (found, _) =
            join_timely(futs, majority(nodes.len()), patience(mem), |i| LeaseError::Mem(late(nodes[i]))).await;
        let all = nodes.iter().copied().collect();
        let mut table = LeaseTable { sites: heapless::Vec::new(), nodes: all, ids: 0, length_ns: 0 };
        let mut first_err = None;
        for r in found.results.into_iter().flatten() {
            match r {
                Ok((site, ids, length_ns)) => {
                    if table.sites.is_empty() {
                        (table.ids, table.length_ns) = (ids, length_ns);
                    } else if (ids, length_ns) != (table.ids, table.length_ns) {
                        return Err(LeaseError::Corrupt { node: site.node, what: "tables differ between nodes" });
                    }
                    let _ = table.sites.push(site);
                }
                Err(LeaseError::Mem(_)) => {}
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if table.sites.len() < majority(nodes.len()) {
            return Err(first_err.unwrap_or(LeaseError::NoQuorum));
        }
        Ok(table)
    }

    async fn site<M: Memory>(mem: &M, node: NodeId) -> Result<(Site, u8, u64), LeaseError> {
        let corrupt = |what| LeaseError::Corrupt { node, what };
        let base = Region::read_root(mem, node, roots::LEASES).await?;
        if base == 0 {
            return Err(corrupt("no lease table (the store was set up by an older version)"));
        }
        let h = mem.read(RemoteAddr::new(node, base), 24).await?;
        let w = |i: usize| word_at(&h, 8 * i).ok_or(corrupt("truncated header"));
        let (ids, length_ns) = (w(1)?, w(2)?);
        if w(0)? != MAGIC || ids == 0 || ids > MAX_IDS as u64 || length_ns == 0 {
            return Err(corrupt("bad header"));
        }
        if base.checked_add(records_at(ids as u8) + RECORD * (ids + 1)).is_none() {
            return Err(corrupt("table beyond the address space"));
        }
        Ok((Site { node, base }, ids as u8, length_ns))
    }

    /// Ids the table has (`1..=ids`).
    pub fn ids(&self) -> u8 {
        self.ids
    }

    /// The lease length, in nanoseconds.
    pub fn length_ns(&self) -> u64 {
        self.length_ns
    }

    fn word(&self, s: usize, id: u8) -> RemoteAddr {
        RemoteAddr::new(self.sites[s].node, self.sites[s].base + HEADER + 8 * id as u64)
    }

    fn record(&self, s: usize, id: u8) -> RemoteAddr {
        RemoteAddr::new(self.sites[s].node, self.sites[s].base + records_at(self.ids) + RECORD * id as u64)
    }

    fn need(&self) -> usize {
        majority(self.nodes.len())
    }

    /// Adds the sites of the table's nodes that did not answer when it
    /// was opened and answer now (their word unknown: the next renewal
    /// learns it, or takes it if it is free), waiting for each one
    /// (`patient`: an operation failed for want of sites) or no longer
    /// than a quorum waits for a late replica. Whether it found any.
    async fn find_sites<M: Memory>(&mut self, mem: &M, patient: bool) -> bool {
        let t = &*self;
        let missing: heapless::Vec<NodeId, MAX_REPLICAS> =
            t.nodes.iter().copied().filter(|&n| !t.sites.iter().any(|s| s.node == n)).collect();
        if missing.is_empty() {
            return false;
        }
        let (need, watch) = if patient { (usize::MAX, patience(mem)) } else { (0, patience(mem).courtesy()) };
        let futs = missing.iter().map(|&n| LeaseTable::site(mem, n)).collect();
        let (found, _) = join_timely(futs, need, watch, |i| LeaseError::Mem(late(missing[i]))).await;
        let mut any = false;
        for r in found.results.into_iter().flatten() {
            if let Ok((site, ids, length_ns)) = r
                && (ids, length_ns) == (self.ids, self.length_ns)
            {
                any |= self.sites.push(site).is_ok();
            }
        }
        any
    }

    /// Ticks after an expiry before the id may be claimed again.
    fn grace<C: Clock>(clock: &C) -> u64 {
        grace(clock)
    }

    /// Claims an id (`want`), with `nonce` telling this claim from others
    /// (a process id, a thread number: it need not be unique, only unlikely
    /// to repeat with the same expiry). The id's record is then marked taken
    /// with its predecessor's payload, which [`Held::resume`] gives.
    pub async fn claim<M: Memory, C: Clock>(
        &self,
        mem: &M,
        clock: &C,
        want: Want,
        nonce: u32,
    ) -> Result<Held, LeaseError> {
        if let Want::Id(id) = want
            && (id == 0 || id > self.ids)
        {
            return Err(LeaseError::BadId { id, ids: self.ids });
        }
        let (grace, length) = (Self::grace(clock), clock.ticks(self.length_ns));
        let nonce = (nonce as u64) & ((1 << (64 - EXPIRY_BITS)) - 1);
        // Sites that did not answer when the table was opened are looked
        // up again where too few of the others answer.
        let mut table = self.clone();
        let t = &mut table;
        // Rounds: a contested id is skipped, and the table read again.
        let mut lost = LeaseError::NoFreeId { ids: self.ids };
        for _ in 0..4 {
            let words = match t.read_words(mem).await {
                Err(LeaseError::NoQuorum) if t.find_sites(mem, true).await => t.read_words(mem).await?,
                words => words?,
            };
            let now = clock.now();
            let free = |id: u8| {
                let held = (0..t.sites.len())
                    .filter(|&s| {
                        words[s].is_some_and(|w| w[id as usize] != 0 && expiry_of(w[id as usize]) + grace >= now)
                    })
                    .count();
                held + self.need() <= self.nodes.len()
            };
            let mut tried = false;
            for id in 1..=self.ids {
                if want != Want::Any && want != Want::Id(id) || !free(id) {
                    continue;
                }
                tried = true;
                if let Some(held) = t.try_claim(mem, clock, id, &words, now, nonce, length).await? {
                    return Ok(held);
                }
            }
            // An id held, or one whose claims lost (on a node down, its
            // holder's word is still there): when its words run out.
            let held = match want {
                Want::Any => LeaseError::NoFreeId { ids: self.ids },
                Want::Id(id) => {
                    let expiry = words.iter().flatten().map(|w| expiry_of(w[id as usize])).max().unwrap_or(0);
                    let ticks = (expiry + grace).saturating_sub(now);
                    LeaseError::Taken { id, free_in_ms: ticks * clock.tick_ns() / 1_000_000 }
                }
            };
            if !tried {
                return Err(held);
            }
            lost = held;
        }
        Err(lost)
    }

    /// The lease words of every id on each site (`None`: no answer).
    async fn read_words<M: Memory>(
        &self,
        mem: &M,
    ) -> Result<heapless::Vec<Option<[u64; MAX_IDS as usize + 1]>, MAX_REPLICAS>, LeaseError> {
        let len = 8 * (self.ids as usize + 1);
        let futs = self.sites.iter().map(|s| mem.read(RemoteAddr::new(s.node, s.base + HEADER), len)).collect();
        let (reads, _) = join_timely(futs, self.need(), patience(mem), |i| late(self.sites[i].node)).await;
        if reads.ok < self.need() {
            return Err(LeaseError::NoQuorum);
        }
        Ok(reads
            .results
            .into_iter()
            .map(|r| match r {
                Some(Ok(b)) => {
                    let mut w = [0u64; MAX_IDS as usize + 1];
                    for (id, slot) in w.iter_mut().enumerate().skip(1).take(self.ids as usize) {
                        *slot = word_at(&b, 8 * id).unwrap_or(u64::MAX);
                    }
                    Some(w)
                }
                _ => None,
            })
            .collect())
    }

    /// One try at `id`: CAS from the words read to this claimer's on every
    /// site where the id looked free, each with a read of the record after
    /// it. `None` if the CAS won on no majority (what it won is given back).
    #[allow(clippy::too_many_arguments)]
    async fn try_claim<M: Memory, C: Clock>(
        &self,
        mem: &M,
        clock: &C,
        id: u8,
        words: &[Option<[u64; MAX_IDS as usize + 1]>],
        now: u64,
        nonce: u64,
        length: u64,
    ) -> Result<Option<Held>, LeaseError> {
        let grace = Self::grace(clock);
        let expiry = now + length;
        let mine = word(nonce, expiry);
        let seen = |s: usize| words.get(s).copied().flatten().map(|w| w[id as usize]);
        let is_free = |w: u64| w == 0 || expiry_of(w) + grace < now;
        let tries: heapless::Vec<(usize, u64), MAX_REPLICAS> =
            (0..self.sites.len()).filter_map(|s| seen(s).filter(|&w| is_free(w)).map(|w| (s, w))).collect();
        let futs = tries
            .iter()
            .map(|&(s, old)| {
                let (word, record) = (self.word(s, id), self.record(s, id));
                async move {
                    let ops = [
                        Op::Cas { offset: word.offset, expected: old, new: mine },
                        Op::Read { offset: record.offset, len: BODY },
                    ];
                    mem.pipeline(word.node, &ops).await
                }
            })
            .collect();
        let node = |k: usize| self.sites[tries[k].0].node;
        let (cas, _) = join_timely(futs, self.need(), patience(mem), |k| late(node(k))).await;
        let mut held = [0u64; MAX_REPLICAS];
        // Where the claim did not win: the word there, as far as it knows
        // (a late CAS may yet land, leaving this claimer's own word).
        let mut others: [u64; MAX_REPLICAS] = core::array::from_fn(|s| seen(s).unwrap_or(0));
        let (mut won, mut best, mut floor) = (0, None::<(u64, u64, Payload)>, 0);
        for (k, r) in cas.results.into_iter().enumerate() {
            let (s, old) = tries[k];
            let Some(Ok(out)) = r else { continue };
            let found = out.first().and_then(OpOutput::cas);
            if found != Some(old) {
                others[s] = found.unwrap_or(others[s]);
                continue;
            }
            held[s] = mine;
            won += 1;
            if old != 0 {
                floor = floor.max(expiry_of(old) + clock.ticks(2 * MAX_SKEW_NS));
            }
            if let Some(rec) = out.get(1).and_then(OpOutput::read).and_then(|b| decode(id, b))
                && best.is_none_or(|b| rec.0 > b.0)
            {
                best = Some(rec);
            }
        }
        if won < self.need() {
            // Undone where it can be now; a late site keeps the word until
            // it expires.
            let sites: heapless::Vec<usize, MAX_REPLICAS> = (0..self.sites.len()).filter(|&s| held[s] != 0).collect();
            let futs = sites
                .iter()
                .map(|&s| {
                    let old = tries.iter().find(|t| t.0 == s).map_or(0, |t| t.1);
                    mem.cas(self.word(s, id), mine, old)
                })
                .collect();
            let _ = join_timely(futs, 0, patience(mem), |k| late(self.sites[sites[k]].node)).await;
            return Ok(None);
        }
        let (version, state, payload) = best.unwrap_or((0, 0, [0; PAYLOAD_WORDS]));
        let state = match state {
            RELEASED => Resumed::Released,
            TAKEN => Resumed::Crashed,
            _ => Resumed::Fresh,
        };
        let resume = Resume { state, payload, floor: if state == Resumed::Crashed { floor } else { 0 } };
        let mut h = Held {
            table: self.clone(),
            id,
            words: held,
            seen: others,
            nonce,
            grace,
            expiry,
            length,
            version: ((version >> 24) + 1) << 24,
            resume,
            lost: false,
            posted: expiry,
        };
        h.write_record(mem, TAKEN, &payload).await?;
        Ok(Some(h))
    }
}

impl Held {
    /// This claim's number: one more than the claim before it of this id
    /// (whose record every claim reads), so successive holders of an id
    /// have different numbers, and a service can tell a new holder from
    /// the one it served before.
    pub fn claim(&self) -> u64 {
        self.version >> 24
    }

    /// How the id's previous holder left it.
    pub fn resume(&self) -> Resume {
        self.resume
    }

    /// When the lease expires, in ticks.
    pub fn expiry(&self) -> u64 {
        self.expiry
    }

    /// Whether half of the lease has passed at `now`: time to renew.
    pub fn needs_renewal(&self, now: u64) -> bool {
        now >= self.renewal_due()
    }

    /// When half of the lease has passed, in ticks: a client that waits
    /// inside an operation (for a lock, a fence) wakes by then to renew.
    pub fn renewal_due(&self) -> u64 {
        self.expiry.saturating_sub(self.length / 2)
    }

    /// Renews the lease if half of it has passed at `now`. A renewal that
    /// finds no majority (nodes down, or a site held by a claim that lost
    /// until its word expires) is tried again at the next call: until the
    /// lease expires the id is still this holder's, and only then does the
    /// failure stand.
    pub async fn keep<M: Memory>(&mut self, mem: &M, now: u64) -> Result<(), LeaseError> {
        if !self.needs_renewal(now) {
            return Ok(());
        }
        match cold(|| self.renew(mem, now)).await {
            Err(LeaseError::NoQuorum) if now < self.expiry => Ok(()),
            r => r,
        }
    }

    /// Extends the lease to `now` plus its length, on a majority. Sites
    /// this holder does not hold (left out of its claim as late, or down,
    /// or held by another claim of the id that lost) are taken, whatever
    /// their word while the lease holds, and after only where it is free
    /// or its own; and nodes the table
    /// could not find when it was opened are looked up again: a lease
    /// that started on a bare majority does not stay one, so that it
    /// survives the next node to fail (SWARM §6).
    ///
    /// Taking a site is safe, and counts towards the majority, only while
    /// the lease has not expired: no other claimer can win a site then.
    /// Past its expiry, the lease is renewed only where this holder's own
    /// words are still in place on a majority, the proof that no claim
    /// won meanwhile (a claim that won replaced them on a majority, which
    /// shares a site with every other). A word of its own found replaced
    /// by another claimer's (or cleared by that claimer's release) loses
    /// the id for good: [`LeaseError::Lost`] from then on, here and from
    /// [`Held::record`] and [`Held::release`]. Otherwise, too few sites
    /// renewed is [`LeaseError::NoQuorum`]: the lease stands until its
    /// expiry ([`Held::keep`]).
    pub async fn renew<M: Memory>(&mut self, mem: &M, now: u64) -> Result<(), LeaseError> {
        if self.lost {
            return Err(LeaseError::Lost { id: self.id });
        }
        if self.table.sites.len() < self.table.nodes.len() {
            cold(|| self.table.find_sites(mem, false)).await;
        }
        let mine = word(self.nonce, now + self.length);
        self.posted = self.posted.max(now + self.length);
        let t = &self.table;
        let (nonce, expiry, grace, posted) = (self.nonce, self.expiry, self.grace, self.posted);
        let unexpired = now < expiry;
        // A word of its own: one of its renewals that did not answer in time
        // and landed since. (Another claimer with the same nonce writes an
        // expiry past every one of this holder's: it claimed after them.)
        let ours = |w: u64| w >> EXPIRY_BITS == nonce && expiry_of(w) <= posted;
        // A word another holder may still use is never replaced. While the
        // lease holds, no other claim can win: another's word is then a
        // claim that lost and is left until its expiry (its holder could
        // not take it back in time), taken as free. (Mutant
        // `lease-skips-lost-claims`: only once it expires.)
        let takeable = |w: u64| {
            (unexpired && !mutant!("lease-skips-lost-claims")) || w == 0 || expiry_of(w) + grace < now || ours(w)
        };
        let from = |s: usize| {
            if self.words[s] != 0 { Some(self.words[s]) } else { Some(self.seen[s]).filter(|&w| takeable(w)) }
        };
        let sites: heapless::Vec<(usize, u64), MAX_REPLICAS> =
            (0..t.sites.len()).filter_map(|s| from(s).map(|w| (s, w))).collect();
        let futs = sites.iter().map(|&(s, old)| mem.cas(t.word(s, self.id), old, mine)).collect();
        let (done, _) = join_timely(futs, t.need(), patience(mem), |k| late(t.sites[sites[k].0].node)).await;
        let mut kept = 0;
        for (k, r) in done.results.into_iter().enumerate() {
            let (s, old) = sites[k];
            let held = self.words[s] != 0;
            match r {
                Some(Ok(prev)) if prev == old => {
                    self.words[s] = mine;
                    // (Mutant `lease-takes-after-expiry`: a take counts
                    // whenever it lands.)
                    kept += (held || unexpired || mutant!("lease-takes-after-expiry")) as usize;
                }
                // A renewal of its own that landed late: still held, renewed
                // from that word next time.
                Some(Ok(prev)) if held && ours(prev) => self.words[s] = prev,
                // Its own word replaced by another claimer's, or cleared by
                // that claimer's release: taken over. (Mutant
                // `lease-lost-forgotten`: the site is looked at again next
                // time, as any other, and taken once free.)
                Some(Ok(_)) if held && !mutant!("lease-lost-forgotten") => self.lost = true,
                // Replaced (the id went to another client on this site), or
                // not yet taken: what is there now, for the next renewal.
                Some(Ok(prev)) => (self.words[s], self.seen[s]) = (0, prev),
                // No answer: the site keeps the word it had, maybe renewed;
                // a held one is kept, a taken one is looked at next time.
                _ => {}
            }
        }
        if self.lost {
            return Err(LeaseError::Lost { id: self.id });
        }
        if kept < t.need() {
            return Err(LeaseError::NoQuorum);
        }
        self.expiry = now + self.length;
        Ok(())
    }

    /// Records `payload` as taken: from now on this holder may go beyond
    /// it. Written to a majority before it returns.
    pub async fn record<M: Memory>(&mut self, mem: &M, payload: &[u64]) -> Result<(), LeaseError> {
        if self.lost {
            return Err(LeaseError::Lost { id: self.id });
        }
        self.write_record(mem, TAKEN, payload).await
    }

    async fn write_record<M: Memory>(&mut self, mem: &M, state: u64, payload: &[u64]) -> Result<(), LeaseError> {
        self.version += 1;
        let body = encode(self.id, self.version, state, payload);
        self.put_record(mem, &body, false).await
    }

    /// Gives the id back: `payload` recorded as where this holder stopped,
    /// then its lease words cleared, each after the record on its node.
    pub async fn release<M: Memory>(mut self, mem: &M, payload: &[u64]) -> Result<(), LeaseError> {
        if self.lost {
            return Err(LeaseError::Lost { id: self.id });
        }
        self.version += 1;
        let body = encode(self.id, self.version, RELEASED, payload);
        self.put_record(mem, &body, true).await
    }

    /// Writes the record `body` to a majority of the sites, each followed
    /// by the clearing of this holder's word there if `clear`. If too few
    /// sites answer, once more with the table's nodes that had none (a
    /// record may go anywhere: the next claim reads a majority).
    async fn put_record<M: Memory>(&mut self, mem: &M, body: &[u8], clear: bool) -> Result<(), LeaseError> {
        if self.put_on_sites(mem, body, clear).await
            || self.table.find_sites(mem, true).await && self.put_on_sites(mem, body, clear).await
        {
            return Ok(());
        }
        Err(LeaseError::NoQuorum)
    }

    /// One pass of [`Held::put_record`]: whether a majority did it all.
    async fn put_on_sites<M: Memory>(&self, mem: &M, body: &[u8], clear: bool) -> bool {
        let t = &self.table;
        let futs = (0..t.sites.len())
            .map(|s| {
                let (word, record) = (t.word(s, self.id), t.record(s, self.id));
                let mut ops: heapless::Vec<Op<'_>, 2> = heapless::Vec::new();
                let _ = ops.push(Op::Write { offset: record.offset, data: body });
                if clear && self.words[s] != 0 {
                    let _ = ops.push(Op::Cas { offset: word.offset, expected: self.words[s], new: 0 });
                }
                async move { mem.pipeline(word.node, &ops).await }
            })
            .collect();
        let (done, _) = join_timely(futs, t.need(), patience(mem), |s| late(t.sites[s].node)).await;
        done.ok >= t.need()
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;
