//! The replicated index's key-block arena (`notes/fusee-design.md` §2,
//! design step 4): space at the same offset on every index replica.
//!
//! A slot word of the replicated index points at a key block by a 39-bit
//! offset *relative to the arena*, and the same word is CASed into every
//! replica of the slot; so a block must sit at the same relative offset in
//! each replica's arena, although each replica's arena has its own base on
//! its own node. Clients therefore take arena space in *chunks* claimed on
//! all the replicas at once, and carve blocks from their chunk with no
//! roundtrip, as the slab does from region chunks
//! ([`crate::substrate::space::slab`]).
//!
//! # Format
//!
//! On each index replica, [`format`] takes `size` bytes (rounded up to
//! whole chunks of the node's [`Region`]) and writes, at their start:
//!
//! ```text
//! offset 0   cursor: bytes of the arena handed out, header included (CAS)
//!        8   magic "SWARENA1"
//!        16  size of the arena, bytes (a multiple of 64)
//!        24..64 zero
//!        64..size  chunks, in claim order
//! ```
//!
//! Offsets within the arena (what slot words hold) count from its base, so
//! offset 0 is the header and never a block. The arena has no root slot of
//! its own: [`format`] returns where it put the arena on each node (a
//! [`Site`]), and the replicated index records those in its own header,
//! found through [`crate::substrate::space::roots::INDEX`], from which
//! `SnapshotIndex::open` hands them to [`Arena::open`]. The sites of *every*
//! replica must be given (a majority is a majority of them), so the index
//! header should record every replica's site, not only its own: a client
//! that read any one header then knows them all. [`Arena::open`] checks each
//! header it reads (magic, size, cursor), and that the sizes agree.
//!
//! # Claims
//!
//! A client claims the range `[s, s + chunk)` (the arena's last chunk:
//! what is left, if less) by posting, to every replica
//! `i` at once (one roundtrip), `CAS(cursor_i, s, s + chunk)`, preceded in
//! the same ordered pipeline by `CAS(cursor_i, seen_i, s)` where the
//! client saw replica `i` behind `s` (`seen_i < s`). It *owns* the range iff
//! its `CAS(s, s + chunk)` won (returned `s`) on a strict majority of the
//! replicas. `s` is the largest cursor the client saw on any replica (its
//! last claim's replies, or [`Arena::open`]'s reads, which reach at least a
//! majority), so a replica that missed earlier CASes (its cursor behind
//! the others: they *diverge*) is moved forward in the same roundtrip, by a
//! CAS that expects what the client saw there. A claim that wins no
//! majority learns every cursor from its CASes' replies and tries again
//! from them (after a random pause, so that clients that split the
//! replicas between them do not split them again), at most
//! [`MAX_ATTEMPTS`] times ([`ArenaError::Contended`]); a claim that finds
//! the arena used up says how far ([`ArenaError::Full`]). Replicas that
//! are late once a majority answered are left out, as quorums do
//! ([`join_timely`]): a failed or stalled replica costs a claim nothing
//! while a majority answers. An uncontended claim takes one roundtrip.
//!
//! **Two clients never own overlapping ranges.** Every CAS a claim posts
//! takes a cursor from some value to a larger one, and nothing else writes
//! a cursor after [`format`]; so each replica's cursor only grows, every
//! successful CAS on it moves it from `x` to `y > x` through the *step*
//! `[x, y)`, and the steps of one replica are disjoint (two CASes from the
//! same `x` cannot both succeed: after the first, the cursor never holds
//! `x` again). If A owns `[a, a')` and B owns `[b, b')`, A's
//! `CAS(a, a')` and B's `CAS(b, b')` both won on a majority; two majorities
//! of the same replicas share a replica, on which `[a, a')` and `[b, b')`
//! are two steps, hence disjoint (the same claim's retries propose a larger
//! `s` each time, so they are two steps too). A CAS that lands late, or
//! wins only a minority, makes a step that nobody owns: its space is lost,
//! never given twice. For the same reason every owned range ends at or
//! below the cursor of at least one replica of every majority (the one it
//! shares with the owner's), so a claim that starts from the largest
//! cursor of a majority never proposes owned space, and [`Arena::adopt`]
//! can check a carried chunk against the cursors it read.
//!
//! # Blocks
//!
//! [`Arena::alloc`] carves 64-byte aligned blocks from the client's chunk
//! (a new claim when it has no room left); the free rest of the chunk goes
//! to the client's id's next holder as a [`Carry`] of class [`ARENA_CLASS`]
//! ([`Arena::carried`], [`Arena::adopt`]), as `RaceIndex` does with its
//! region chunk. Blocks are never freed (`notes/fusee-design.md` §6).
//!
//! Every cursor read from remote memory (an [`Arena::open`] read, a CAS
//! reply) is checked against the arena's size, and so is every carried
//! chunk (it came through a lease record): a garbled cursor is an
//! [`ArenaError::Corrupt`], a garbled carry is refused, never a panic or
//! an access outside the arena.

use core::fmt;
use core::ops::Range;

use crate::substrate::late::{Watch, late};
use crate::substrate::memory::{pause, word_at};
use crate::substrate::quorum::{MAX_REPLICAS, join_all, join_timely, majority};
use crate::substrate::space::region::{Region, RegionError};
use crate::substrate::space::slab::{ARENA_CLASS, Carry};
use crate::{MemError, Memory, NodeId, Op, OpOutput, RemoteAddr};

/// "SWARENA1", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"SWARENA1");
/// Bytes of the header (one cache line); the first chunk starts here.
pub const HEADER: u64 = 64;
/// Alignment of chunks, blocks and cursors: a cache line.
pub const ALIGN: u64 = 64;
/// The largest arena: slot words hold offsets in 39 bits of 64-byte units.
pub const MAX_SIZE: u64 = ALIGN << 39;
/// Tries of one claim before [`ArenaError::Contended`].
pub const MAX_ATTEMPTS: u32 = 32;
/// The largest pause between two tries of a claim, in multiples of the
/// last try's duration (a random fraction of it is waited).
const MAX_BACKOFF: u64 = 64;

/// A failure to set up, open or take space from an arena.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArenaError {
    /// A memory operation failed.
    Mem(MemError),
    /// Taking the arena's space from a node's region failed ([`format`]).
    Region(RegionError),
    /// Fewer than a majority of the replicas answered.
    NoQuorum {
        /// Replicas that answered.
        answered: usize,
        /// Replicas needed (a strict majority).
        need: usize,
    },
    /// A replica's arena header or cursor cannot be right.
    Corrupt {
        /// The replica's node.
        node: NodeId,
        /// What is wrong.
        what: &'static str,
    },
    /// The arena is used up: a cursor reached its size (the space below is
    /// owned, or lost to tries that won no majority).
    Full {
        /// Bytes handed out (the largest cursor seen, header included).
        used: u64,
        /// Bytes of the arena.
        size: u64,
    },
    /// Other clients' claims won every time, [`MAX_ATTEMPTS`] times.
    Contended {
        /// Claims tried.
        attempts: u32,
    },
    /// A block larger than a chunk, or of size zero.
    BadSize {
        /// Bytes asked for.
        size: u64,
    },
    /// A layout the arena cannot have (sizes not multiples of 64 bytes, too
    /// large for slot words, no replica, too many).
    BadLayout(&'static str),
}

impl From<MemError> for ArenaError {
    fn from(e: MemError) -> Self {
        ArenaError::Mem(e)
    }
}

impl From<RegionError> for ArenaError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::Mem(m) => ArenaError::Mem(m),
            e => ArenaError::Region(e),
        }
    }
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ArenaError::Mem(e) => write!(f, "{e}"),
            ArenaError::Region(e) => write!(f, "cannot set up the index arena: {e}"),
            ArenaError::NoQuorum { answered, need } => {
                write!(f, "{answered} index replica(s) answered, {need} needed for an arena claim")
            }
            ArenaError::Corrupt { node, what } => write!(f, "{node}: corrupt index arena: {what}"),
            ArenaError::Full { used, size } => write!(f, "the index arena is full: {used} of {size} bytes used"),
            ArenaError::Contended { attempts } => {
                write!(f, "other clients won {attempts} arena claims in a row")
            }
            ArenaError::BadSize { size } => write!(f, "cannot take a block of {size} bytes from the index arena"),
            ArenaError::BadLayout(what) => write!(f, "bad index arena layout: {what}"),
        }
    }
}

/// Where one replica's arena is: its node and the arena's base there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// The node.
    pub node: NodeId,
    /// Offset of the arena's header on the node.
    pub base: u64,
}

/// Checks a proposed arena size.
pub fn check_size(size: u64) -> Result<(), ArenaError> {
    if !size.is_multiple_of(ALIGN) || size < HEADER + ALIGN {
        return Err(ArenaError::BadLayout("arena size must be a multiple of 64 bytes, with room for a block"));
    }
    if size > MAX_SIZE {
        return Err(ArenaError::BadLayout("arena larger than slot words can point into (32 TiB)"));
    }
    Ok(())
}

/// Sets up an arena of `size` bytes on each of `nodes` (the index replicas,
/// in replica order), from each node's region (formatted: its chunks read
/// as zero). Where each one is, to record in the index's header (see the
/// module's documentation). Every node must answer: this is done once, when
/// the store is created.
pub async fn format<M: Memory>(
    mem: &M,
    nodes: &[NodeId],
    size: u64,
) -> Result<heapless::Vec<Site, MAX_REPLICAS>, ArenaError> {
    check_size(size)?;
    if nodes.is_empty() || nodes.len() > MAX_REPLICAS {
        return Err(ArenaError::BadLayout("an arena has 1 to 8 replicas"));
    }
    let futs = nodes.iter().map(|&node| format_one(mem, node, size)).collect();
    let done = join_all(futs).await;
    let mut sites = heapless::Vec::new();
    for r in done.results {
        let site = r.ok_or(ArenaError::BadLayout("a node was not formatted"))??;
        let _ = sites.push(site);
    }
    Ok(sites)
}

async fn format_one<M: Memory>(mem: &M, node: NodeId, size: u64) -> Result<Site, ArenaError> {
    let mut region = Region::open(mem, node).await?;
    let base = region.alloc_chunks(mem, size.div_ceil(region.chunk)).await?.offset;
    let mut header = [0u8; 24];
    for (i, w) in [HEADER, MAGIC, size].into_iter().enumerate() {
        header[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    mem.write(RemoteAddr::new(node, base), &header).await?;
    Ok(Site { node, base })
}

/// Too few replicas answered: with none, the first one's error says more.
fn no_quorum(answered: usize, need: usize, first: Option<&MemError>) -> ArenaError {
    match first {
        Some(&e) if answered == 0 => ArenaError::Mem(e),
        _ => ArenaError::NoQuorum { answered, need },
    }
}

/// Whether `cursor` can be a cursor of an arena of `size` bytes.
fn valid_cursor(cursor: u64, size: u64) -> bool {
    (HEADER..=size).contains(&cursor) && cursor.is_multiple_of(ALIGN)
}

/// One client's handle on the arena of the index replicas: what it last
/// saw of each cursor, and the chunk it carves blocks from (not `Clone`:
/// two handles carving one chunk would hand out the same blocks).
#[derive(Debug)]
pub struct Arena {
    /// Every replica's site, in replica order.
    sites: heapless::Vec<Site, MAX_REPLICAS>,
    /// Bytes of the arena.
    size: u64,
    /// Bytes a claim takes (the last one may take less: what is left).
    chunk: u64,
    /// The cursor last seen on each replica; 0: never seen (0 is no cursor).
    seen: [u64; MAX_REPLICAS],
    /// The free part of the chunk owned, `bump..end` (both 0: none).
    bump: u64,
    end: u64,
    /// The state of the generator of claim pauses.
    rng: u64,
}

impl Arena {
    /// The arena of the index replicas at `sites` (every replica's, in
    /// replica order), claimed `chunk` bytes at a time; `nonce` tells this
    /// client from others (its id: it only seeds the pauses between
    /// contended claims). Reads each replica's header (one roundtrip; a
    /// majority must answer, and their headers agree), which also tells
    /// the first claim where the cursors are.
    pub async fn open<M: Memory>(mem: &M, sites: &[Site], chunk: u64, nonce: u32) -> Result<Arena, ArenaError> {
        if sites.is_empty() || sites.len() > MAX_REPLICAS {
            return Err(ArenaError::BadLayout("an arena has 1 to 8 replicas"));
        }
        if chunk == 0 || !chunk.is_multiple_of(ALIGN) || chunk > MAX_SIZE {
            return Err(ArenaError::BadLayout("arena chunks must be a positive multiple of 64 bytes"));
        }
        // Sites come from the index's headers, in remote memory: checked.
        if let Some(s) = sites.iter().find(|s| !s.base.is_multiple_of(ALIGN) || s.base.checked_add(MAX_SIZE).is_none())
        {
            return Err(ArenaError::Corrupt {
                node: s.node,
                what: "arena base not aligned or beyond the address space",
            });
        }
        let need = majority(sites.len());
        let futs = sites.iter().map(|s| mem.read(RemoteAddr::new(s.node, s.base), 24)).collect();
        let (reads, _) = join_timely(futs, need, Watch::on(mem), |i| late(sites[i].node)).await;
        let mut arena = Arena {
            sites: sites.iter().copied().collect(),
            size: 0,
            chunk,
            seen: [0; MAX_REPLICAS],
            bump: 0,
            end: 0,
            rng: (nonce as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1,
        };
        let mut answered = 0;
        for (i, r) in reads.results.iter().enumerate() {
            let Some(Ok(b)) = r else { continue };
            let node = sites[i].node;
            let corrupt = |what| ArenaError::Corrupt { node, what };
            let w = |k: usize| word_at(b, 8 * k).ok_or(corrupt("truncated header"));
            let (cursor, magic, size) = (w(0)?, w(1)?, w(2)?);
            if magic != MAGIC {
                return Err(corrupt("bad magic (no arena at this site)"));
            }
            if check_size(size).is_err() {
                return Err(corrupt("impossible arena size"));
            }
            if arena.size != 0 && size != arena.size {
                return Err(corrupt("arena sizes differ between replicas"));
            }
            arena.size = size;
            if !valid_cursor(cursor, size) {
                return Err(corrupt("cursor outside the arena or not 64-byte aligned"));
            }
            arena.seen[i] = cursor;
            answered += 1;
        }
        if answered < need {
            return Err(no_quorum(answered, need, reads.first_error()));
        }
        Ok(arena)
    }

    /// Bytes of the arena.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes a claim takes.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Every replica's site, in replica order.
    pub fn sites(&self) -> &[Site] {
        &self.sites
    }

    /// The cursor this client last saw on replica `i` (`None`: never).
    pub fn seen(&self, i: usize) -> Option<u64> {
        self.seen.get(i).copied().filter(|&c| c != 0)
    }

    /// The address of `len` bytes at arena offset `off` on replica `i`, if
    /// they lie within the arena (after its header).
    pub fn addr(&self, i: usize, off: u64, len: u64) -> Option<RemoteAddr> {
        let site = self.sites.get(i)?;
        let end = off.checked_add(len)?;
        // No overflow: `open` checked `base + MAX_SIZE`, and `size <= MAX_SIZE`.
        (off >= HEADER && end <= self.size).then(|| RemoteAddr::new(site.node, site.base + off))
    }

    /// Takes a block of `bytes` bytes (rounded up to 64) from this client's
    /// chunk: its arena offset, the same on every replica. No roundtrip
    /// unless the chunk has no room left; then one claim (one roundtrip
    /// when uncontended), and the old chunk's rest is lost.
    pub async fn alloc<M: Memory>(&mut self, mem: &M, bytes: u64) -> Result<u64, ArenaError> {
        let need = bytes.checked_next_multiple_of(ALIGN).filter(|&n| n > 0 && n <= self.chunk);
        let need = need.ok_or(ArenaError::BadSize { size: bytes })?;
        if self.end - self.bump < need {
            let got = self.claim(mem).await?;
            if got.end - got.start < need {
                // The arena's last, short chunk: too small for this block.
                return Err(ArenaError::Full { used: got.end, size: self.size });
            }
        }
        self.bump += need;
        Ok(self.bump - need)
    }

    /// Claims the next chunk on a majority of the replicas (see the
    /// module's documentation) and makes it the one blocks are carved from;
    /// the old chunk's rest is lost. The range owned, in arena offsets.
    pub async fn claim<M: Memory>(&mut self, mem: &M) -> Result<Range<u64>, ArenaError> {
        let n = self.sites.len();
        let need = majority(n);
        for attempt in 0..MAX_ATTEMPTS {
            let start = self.seen[..n].iter().copied().max().unwrap_or(0);
            if !valid_cursor(start, self.size) {
                return Err(ArenaError::BadLayout("claim on an arena that was not opened"));
            }
            if start == self.size {
                return Err(ArenaError::Full { used: start, size: self.size });
            }
            let end = start + self.chunk.min(self.size - start);
            let began = mem.now_ns();
            let futs = (0..n)
                .map(|i| {
                    let (node, cursor) = (self.sites[i].node, self.sites[i].base);
                    let mut ops: heapless::Vec<Op<'static>, 2> = heapless::Vec::new();
                    let seen = self.seen[i];
                    if seen != 0 && seen < start {
                        let _ = ops.push(Op::Cas { offset: cursor, expected: seen, new: start });
                    }
                    let _ = ops.push(Op::Cas { offset: cursor, expected: start, new: end });
                    async move { mem.pipeline(node, &ops).await }
                })
                .collect();
            let sites = &self.sites;
            let (replies, _) = join_timely(futs, need, Watch::on(mem), |i| late(sites[i].node)).await;
            let (mut won, mut answered) = (0, 0);
            for (i, r) in replies.results.iter().enumerate() {
                // Failed or late: what it holds is unknown (its CASes may
                // yet land, in steps nobody owns); the next try asks again.
                let Some(Ok(out)) = r else { continue };
                let node = self.sites[i].node;
                let prev = out.last().and_then(OpOutput::cas);
                let prev = prev.ok_or(ArenaError::Corrupt { node, what: "a cursor CAS answered no value" })?;
                answered += 1;
                if prev == start {
                    won += 1;
                    self.seen[i] = end;
                } else if valid_cursor(prev, self.size) {
                    self.seen[i] = prev;
                } else {
                    return Err(ArenaError::Corrupt { node, what: "cursor outside the arena or not 64-byte aligned" });
                }
            }
            if won >= need {
                (self.bump, self.end) = (start, end);
                return Ok(start..end);
            }
            if answered < need {
                return Err(no_quorum(answered, need, replies.first_error()));
            }
            if attempt + 1 < MAX_ATTEMPTS {
                self.pause(mem, began, attempt).await;
            }
        }
        Err(ArenaError::Contended { attempts: MAX_ATTEMPTS })
    }

    /// Waits a random part of `2^attempt` times (at most [`MAX_BACKOFF`]
    /// times) as long as the try that began at `began` took: claimers that
    /// split the replicas between them try again at different times.
    /// Nothing where the memory keeps no time.
    async fn pause<M: Memory>(&mut self, mem: &M, began: Option<u64>, attempt: u32) {
        let (Some(began), Some(now)) = (began, mem.now_ns()) else { return };
        let factor = MAX_BACKOFF.min(1 << attempt.min(63));
        let span = now.saturating_sub(began).max(1).saturating_mul(factor);
        // xorshift64.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        pause(mem, self.rng % (span + 1)).await
    }

    /// The free part of the chunk blocks are carved from, for the next
    /// holder of this client's id: arena offsets, marked [`ARENA_CLASS`],
    /// under the first replica's node.
    pub fn carried(&self) -> Option<Carry> {
        (self.bump < self.end).then_some(Carry {
            node: self.sites[0].node,
            class: ARENA_CLASS,
            bump: self.bump,
            end: self.end,
        })
    }

    /// Goes on carving blocks from `c`, a chunk this client's id's previous
    /// holder carried (a released id's: a crashed holder may have carved
    /// it further), if it can be one of this arena's: the class and node
    /// [`Arena::carried`] gives, aligned, within the arena, and below the
    /// largest cursor [`Arena::open`] read (every owned range is, see the
    /// module's documentation). Whether it was taken.
    pub fn adopt(&mut self, c: Carry) -> bool {
        let top = self.seen[..self.sites.len()].iter().copied().max().unwrap_or(0);
        let fits = c.class == ARENA_CLASS
            && c.node == self.sites[0].node
            && c.bump >= HEADER
            && c.bump <= c.end
            && c.end <= top
            && c.end <= self.size
            && c.bump.is_multiple_of(ALIGN)
            && c.end.is_multiple_of(ALIGN);
        if fits {
            (self.bump, self.end) = (c.bump, c.end);
        }
        fits
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests;
