//! A node's server area: where the server beside a memory node and its
//! clients meet. Found through the root slot [`roots::SERVER`] of the
//! node's region; made of whole chunks of the region.
//!
//! ```text
//! 0     magic "SWSRVAR1", version (4) | channels (4), ring bytes (8),
//!       0 (32), xxh3 of bytes 0..56                         (64 B)
//! 64    state word: epoch (2) | state (1)   (CAS; a line of its own)
//! 128   connection words: one per channel, the client's generation (CAS)
//! H     head lines: two per channel (64 B each): the request ring's (the
//!       server publishes it), the response ring's (the client does)
//! R     rings: per channel, its request ring then its response ring
//! ```
//!
//! Channel `c` belongs to client id `c` (ids are unique among live
//! clients). The *epoch* names one incarnation of the server: a server
//! that starts raises it, which makes every message of the previous
//! incarnation stale; the *generation* names one connection of a client:
//! a client that (re)connects raises it, and the server then restarts the
//! channel's rings from their beginning.

use crate::substrate::memory::word_at;
use crate::substrate::space::{Region, roots};
use crate::{Memory, NodeId, RemoteAddr};

use super::MsgError;
use super::ring::{Link, MIN_RING, RingAt, max_payload};

const MAGIC: u64 = u64::from_le_bytes(*b"SWSRVAR1");
const VERSION: u32 = 1;
const HEADER: u64 = 64;
const STATE_AT: u64 = 64;
const CONNS_AT: u64 = 128;
const LINE: u64 = 64;

/// The shape of a server area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Channels: client ids `0..channels` may connect.
    pub channels: u16,
    /// Bytes of each ring (a multiple of 64, at least [`MIN_RING`]).
    pub ring_bytes: u64,
}

impl Default for Geometry {
    /// A channel for every client id (0 to 127: ids 1 to 126 and the
    /// setup id), 4 KiB rings (messages up to 2 KiB): 1 MiB per node.
    fn default() -> Self {
        Geometry { channels: 128, ring_bytes: 4096 }
    }
}

impl Geometry {
    /// Checks the shape.
    pub fn check(&self) -> Result<(), MsgError> {
        if self.channels == 0 {
            return Err(MsgError::BadConfig("a server area needs at least one channel"));
        }
        if self.ring_bytes < MIN_RING.next_multiple_of(LINE)
            || !self.ring_bytes.is_multiple_of(LINE)
            || self.ring_bytes > 1 << 30
        {
            return Err(MsgError::BadConfig("rings must be multiples of 64 bytes, from 128 bytes to 1 GiB"));
        }
        Ok(())
    }

    /// The largest message body a channel carries (either way).
    pub fn max_message(&self) -> u64 {
        max_payload(self.ring_bytes)
    }

    fn heads_at(&self) -> u64 {
        (CONNS_AT + 8 * self.channels as u64).next_multiple_of(LINE)
    }

    fn rings_at(&self) -> u64 {
        self.heads_at() + 2 * LINE * self.channels as u64
    }

    /// Bytes of the whole area.
    pub fn bytes(&self) -> u64 {
        self.rings_at() + 2 * self.ring_bytes * self.channels as u64
    }
}

/// Where the server area of a node is, as a validated header said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    /// The node.
    pub node: NodeId,
    /// Its first byte.
    pub base: u64,
    /// Its shape.
    pub geo: Geometry,
}

/// How a server's incarnation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No server ever served this area.
    Never,
    /// Incarnation `epoch` serves it.
    Running(u16),
    /// Incarnation `epoch` stopped cleanly.
    Stopped(u16),
}

impl State {
    fn decode(w: u64) -> State {
        let epoch = (w >> 48) as u16;
        match w & 0xff {
            1 => State::Running(epoch),
            2 => State::Stopped(epoch),
            _ => State::Never,
        }
    }

    /// The state word that says this state.
    pub fn encode(self) -> u64 {
        match self {
            State::Never => 0,
            State::Running(e) => (e as u64) << 48 | 1,
            State::Stopped(e) => (e as u64) << 48 | 2,
        }
    }

    /// The epoch a new incarnation takes after this one (never 0).
    fn next_epoch(self) -> u16 {
        let e = match self {
            State::Never => 0,
            State::Running(e) | State::Stopped(e) => e,
        };
        e.wrapping_add(1).max(1)
    }
}

impl Area {
    fn at(&self, off: u64) -> RemoteAddr {
        RemoteAddr::new(self.node, self.base + off)
    }

    /// The server's state word.
    pub fn state_word(&self) -> RemoteAddr {
        self.at(STATE_AT)
    }

    /// Channel `c`'s connection word.
    pub fn conn_word(&self, c: u16) -> RemoteAddr {
        self.at(CONNS_AT + 8 * c as u64)
    }

    /// The state word and every connection word, as one span (the server
    /// reads them together each pass).
    pub fn control_span(&self) -> (RemoteAddr, usize) {
        (self.at(STATE_AT), (CONNS_AT - STATE_AT + 8 * self.geo.channels as u64) as usize)
    }

    /// Channel `c`'s request ring (clients write, the server polls).
    pub fn request_ring(&self, c: u16) -> RingAt {
        let ring = self.geo.rings_at() + 2 * self.geo.ring_bytes * c as u64;
        RingAt {
            addr: self.at(ring),
            size: self.geo.ring_bytes,
            head: self.at(self.geo.heads_at() + 2 * LINE * c as u64),
        }
    }

    /// Channel `c`'s response ring (the server writes, the client polls).
    pub fn response_ring(&self, c: u16) -> RingAt {
        let ring = self.geo.rings_at() + 2 * self.geo.ring_bytes * c as u64 + self.geo.ring_bytes;
        let head = self.at(self.geo.heads_at() + 2 * LINE * c as u64 + LINE);
        RingAt { addr: self.at(ring), size: self.geo.ring_bytes, head }
    }

    fn header(&self) -> [u8; HEADER as usize] {
        let mut h = [0u8; HEADER as usize];
        h[..8].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.geo.channels as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.geo.ring_bytes.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&h[..56]);
        h[56..].copy_from_slice(&sum.to_le_bytes());
        h
    }

    /// Checks a header read at `base` on `node`, in a region of `size` bytes.
    fn decode(node: NodeId, base: u64, size: u64, h: &[u8]) -> Result<Area, MsgError> {
        let corrupt = |what| MsgError::Corrupt { node, what };
        let word = |at| word_at(h, at).ok_or(corrupt("truncated header"));
        if word(0)? != MAGIC {
            return Err(corrupt("bad magic"));
        }
        if word(56)? != xxhash_rust::xxh3::xxh3_64(&h[..56]) {
            return Err(corrupt("bad header checksum"));
        }
        let vc = word(8)?;
        if vc as u32 != VERSION {
            return Err(corrupt("unknown version"));
        }
        let channels = u16::try_from(vc >> 32).map_err(|_| corrupt("impossible channel count"))?;
        let geo = Geometry { channels, ring_bytes: word(16)? };
        geo.check().map_err(|_| corrupt("impossible shape"))?;
        if !base.is_multiple_of(LINE) || base.checked_add(geo.bytes()).is_none_or(|end| end > size) {
            return Err(corrupt("the area lies outside the region"));
        }
        Ok(Area { node, base, geo })
    }

    /// Opens `node`'s server area (two roundtrips).
    pub async fn open<M: Memory>(mem: &M, node: NodeId) -> Result<Area, MsgError> {
        let region = Region::open(mem, node).await?;
        let base = Region::read_root(mem, node, roots::SERVER).await?;
        if base == 0 {
            return Err(MsgError::NoServer { node, why: "no server area (no server ever ran beside it)" });
        }
        let h = mem.read(RemoteAddr::new(node, base), HEADER as usize).await?;
        Area::decode(node, base, region.size, &h)
    }

    /// Opens `node`'s server area, or makes one of shape `geo` from fresh
    /// chunks of its region. Of two servers making it at once, one wins the
    /// root slot and both use its area.
    pub async fn open_or_create<M: Memory>(mem: &M, node: NodeId, geo: Geometry) -> Result<Area, MsgError> {
        geo.check()?;
        match Area::open(mem, node).await {
            Err(MsgError::NoServer { .. }) => {}
            other => return other,
        }
        let mut region = Region::open(mem, node).await?;
        let chunks = geo.bytes().div_ceil(region.chunk);
        let at = region.alloc_chunks(mem, chunks).await?;
        let area = Area { node, base: at.offset, geo };
        // Fresh chunks read as zero: no server state, no connection.
        mem.write(RemoteAddr::new(node, at.offset), &area.header()).await?;
        Region::claim_root(mem, node, roots::SERVER, at.offset).await?;
        Area::open(mem, node).await
    }

    /// The server's state.
    pub async fn state<M: Memory>(&self, mem: &M) -> Result<State, MsgError> {
        let buf = mem.read(self.state_word(), 8).await?;
        Ok(State::decode(word_at(&buf, 0).unwrap_or(0)))
    }

    /// Starts a new incarnation: the state word goes from what it was to
    /// running with the next epoch. The previous incarnation, if alive,
    /// sees itself superseded.
    pub async fn begin<M: Memory>(&self, mem: &M) -> Result<u16, MsgError> {
        let mut seen = 0;
        loop {
            let state = State::decode(seen);
            let epoch = state.next_epoch();
            let prev = mem.cas(self.state_word(), seen, State::Running(epoch).encode()).await?;
            if prev == seen {
                return Ok(epoch);
            }
            seen = prev;
        }
    }

    /// Ends incarnation `epoch` cleanly, unless another took over.
    pub async fn end<M: Memory>(&self, mem: &M, epoch: u16) -> Result<(), MsgError> {
        let running = State::Running(epoch).encode();
        mem.cas(self.state_word(), running, State::Stopped(epoch).encode()).await?;
        Ok(())
    }

    /// A client's new connection on channel `c` with the running server:
    /// raises the channel's generation (never 0).
    pub async fn connect<M: Memory>(&self, mem: &M, c: u16) -> Result<Link, MsgError> {
        if c >= self.geo.channels {
            return Err(MsgError::BadConfig("no such channel (client id too large for the server area)"));
        }
        let epoch = match self.state(mem).await? {
            State::Running(e) => e,
            State::Never => return Err(MsgError::NoServer { node: self.node, why: "no server ever ran beside it" }),
            State::Stopped(_) => return Err(MsgError::NoServer { node: self.node, why: "its server stopped" }),
        };
        let word = self.conn_word(c);
        let mut seen = word_at(&mem.read(word, 8).await?, 0).unwrap_or(0);
        loop {
            let generation = (seen as u16).wrapping_add(1).max(1);
            let prev = mem.cas(word, seen, generation as u64).await?;
            if prev == seen {
                return Ok(Link { epoch, generation });
            }
            seen = prev;
        }
    }

    /// Decodes the span of [`Area::control_span`]: the state, and the
    /// generation of each channel.
    pub fn decode_control<'a>(&self, b: &'a [u8]) -> (State, impl Iterator<Item = u16> + 'a) {
        let state = State::decode(word_at(b, 0).unwrap_or(0));
        let conns = (0..self.geo.channels as usize)
            .map(move |c| word_at(b, (CONNS_AT - STATE_AT) as usize + 8 * c).map_or(0, |w| w as u16));
        (state, conns)
    }
}
