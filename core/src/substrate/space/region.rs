//! The layout every memory node starts with, and chunk allocation on passive
//! memory.
//!
//! Memory nodes have no CPU to run an allocator, so a node's region begins
//! with a header whose *cursor* word is advanced by CAS: each successful CAS
//! hands the caller one chunk. Clients sub-allocate from their chunks
//! ([`crate::substrate::space::slab`]) without roundtrips in the common case.
//!
//! ```text
//! offset 0      magic "SWARMRG1"
//!        8      layout version
//!        16     region size in bytes
//!        24     chunk size in bytes
//!        32     cursor: offset of the next free chunk (CAS)
//!        40     the pool of given-back blocks: its head (CAS) and, at 48,
//!               its bytes ([`super::pool`])
//!        56..64 reserved
//!        64..   root slots: CAS words, 0 = unset, for protocols' well-known
//!               objects (an index's location, a log directory), declared
//!               in [`super::roots`]
//!        4096   first chunk
//! ```
//!
//! Everything read from the header is validated: a garbled header is a
//! [`RegionError::Corrupt`], never a panic or an out-of-bounds access.
//!
//! Memory from an earlier run is garbage until formatted. The protocols
//! take fresh memory to read as zero (log rows, lock words, replicas, index
//! buckets, server areas: everything in the chunks handed out here), but a
//! device-dax region, a persistent-memory file or an RDMA daemon's memory
//! keeps whatever an earlier run left in it. So [`Region::format`] writes
//! zeros over every byte of the region after the header (and the whole
//! header, as it writes it) before it writes the magic word, through the
//! [`Memory`] interface like any client, so that it holds on every backend
//! and in the simulator; bytes past the region's `size` are left alone.

use core::fmt;

use super::roots::Root;
use crate::substrate::memory::{read_word, word_at};
use crate::substrate::quorum::{MAX_REPLICAS, join_all};
use crate::{MemError, MemErrorKind, Memory, NodeId, RemoteAddr};

/// "SWARMRG1", little endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SWARMRG1");
/// Version of the layout above.
pub const VERSION: u64 = 1;
/// Bytes before the first chunk.
pub const HEADER_SIZE: u64 = 4096;
/// Offset of the cursor word.
pub const CURSOR_OFFSET: u64 = 32;
/// Offset of the first root slot.
pub const ROOTS_OFFSET: u64 = 64;
/// Number of root slots.
pub const ROOT_SLOTS: u64 = (HEADER_SIZE - ROOTS_OFFSET) / 8;
/// Smallest chunk size accepted.
pub const MIN_CHUNK: u64 = 4096;

/// Bytes of one write of zeros when [`Region::format`] clears a node.
const ZERO_PIECE: usize = 64 << 10;
/// The smallest write of zeros tried, on a backend whose transfers are
/// too small for [`ZERO_PIECE`] ([`MemErrorKind::TooLarge`]).
const MIN_ZERO_PIECE: u64 = 64;
/// What the writes of zeros copy from.
static ZEROS: [u8; ZERO_PIECE] = [0; ZERO_PIECE];

/// A failure of region management.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegionError {
    /// The memory operation failed.
    Mem(MemError),
    /// The node's header is not a valid region header.
    Corrupt {
        /// The node.
        node: NodeId,
        /// What is wrong with it.
        what: &'static str,
    },
    /// No chunk is left on the node: what was asked for, and what is left
    /// (the node's size less its cursor).
    Exhausted {
        /// The node.
        node: NodeId,
        /// Bytes asked for (whole chunks).
        need: u64,
        /// Bytes left after the last chunk handed out.
        free: u64,
    },
    /// The requested layout is impossible (sizes not multiples of 4 KiB, a
    /// region too small for one chunk, a root slot out of range).
    BadLayout(&'static str),
}

impl From<MemError> for RegionError {
    fn from(e: MemError) -> Self {
        RegionError::Mem(e)
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Mem(e) => write!(f, "{e}"),
            RegionError::Corrupt { node, what } => write!(f, "{node}: corrupt region header: {what}"),
            RegionError::Exhausted { node, need, free } => {
                write!(f, "{node} is full: {} needed, {} free", Bytes(*need), Bytes(*free))
            }
            RegionError::BadLayout(what) => write!(f, "bad region layout: {what}"),
        }
    }
}

impl core::error::Error for RegionError {}

/// A validated region header, as one client knows it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Region {
    /// The node.
    pub node: NodeId,
    /// Bytes in the region.
    pub size: u64,
    /// Bytes per chunk.
    pub chunk: u64,
    /// The cursor as last seen (a guess; the CAS tells the truth).
    pub cursor: u64,
}

impl Region {
    /// Checks a proposed layout.
    pub fn check_layout(size: u64, chunk: u64) -> Result<(), RegionError> {
        if chunk < MIN_CHUNK || !chunk.is_multiple_of(MIN_CHUNK) {
            return Err(RegionError::BadLayout("chunk size must be a multiple of 4096 bytes"));
        }
        if !size.is_multiple_of(MIN_CHUNK) {
            return Err(RegionError::BadLayout("region size must be a multiple of 4096 bytes"));
        }
        if size < HEADER_SIZE + chunk {
            return Err(RegionError::BadLayout("region is too small for its header and one chunk"));
        }
        Ok(())
    }

    /// Writes a fresh region of `size` bytes on `node`: zeros over every
    /// byte after the header, whatever an earlier run left there (see the
    /// module's documentation), then the header. Run once, by whoever
    /// creates the node, before any client opens it; the magic word is
    /// cleared first and written last, so that neither a half-written
    /// header nor a half-cleared region is ever taken for a valid one.
    ///
    /// The zeros take a pass over the region (64 KiB a write, 8 writes in
    /// flight); memory that is known to read as zero already can skip it
    /// with [`format_fresh`](Self::format_fresh).
    pub async fn format<M: Memory>(mem: &M, node: NodeId, size: u64, chunk: u64) -> Result<Region, RegionError> {
        Self::write_region(mem, node, size, chunk, true).await
    }

    /// [`format`](Self::format) without the zeros, for memory that reads as
    /// zero because nothing wrote it since it was made: a new simulated
    /// node, a cluster just created (`ShmCluster::create` and
    /// `CxlCluster::create` make zeroed nodes). Zeros written over such
    /// memory would only cost a pass over it, and, on tmpfs, make every
    /// page of a sparse node file resident at once. Memory that an earlier
    /// run may have used (a device, a file or a daemon's memory formatted
    /// again) needs [`format`](Self::format).
    pub async fn format_fresh<M: Memory>(mem: &M, node: NodeId, size: u64, chunk: u64) -> Result<Region, RegionError> {
        Self::write_region(mem, node, size, chunk, false).await
    }

    /// [`format`](Self::format), zeroing the region after the header if
    /// `clear`.
    async fn write_region<M: Memory>(
        mem: &M,
        node: NodeId,
        size: u64,
        chunk: u64,
        clear: bool,
    ) -> Result<Region, RegionError> {
        Self::check_layout(size, chunk)?;
        let mut head = [0u8; HEADER_SIZE as usize];
        head[8..16].copy_from_slice(&VERSION.to_le_bytes());
        head[16..24].copy_from_slice(&size.to_le_bytes());
        head[24..32].copy_from_slice(&chunk.to_le_bytes());
        head[32..40].copy_from_slice(&HEADER_SIZE.to_le_bytes());
        mem.write(RemoteAddr::new(node, 0), &[0; 8]).await?;
        if clear {
            zero(mem, node, HEADER_SIZE, size).await?;
        }
        mem.write(RemoteAddr::new(node, 8), &head[8..]).await?;
        mem.write(RemoteAddr::new(node, 0), &MAGIC.to_le_bytes()).await?;
        Ok(Region { node, size, chunk, cursor: HEADER_SIZE })
    }

    /// Reads and validates `node`'s header (one roundtrip).
    pub async fn open<M: Memory>(mem: &M, node: NodeId) -> Result<Region, RegionError> {
        let buf = mem.read(RemoteAddr::new(node, 0), 40).await?;
        Self::decode(node, &buf)
    }

    /// Validates the first 40 bytes of a header.
    pub fn decode(node: NodeId, b: &[u8]) -> Result<Region, RegionError> {
        let corrupt = |what| RegionError::Corrupt { node, what };
        let word = |at| word_at(b, at).ok_or(corrupt("header is truncated"));
        if word(0)? != MAGIC {
            return Err(corrupt("bad magic (not a formatted region)"));
        }
        if word(8)? != VERSION {
            return Err(corrupt("unknown layout version"));
        }
        let (size, chunk, cursor) = (word(16)?, word(24)?, word(32)?);
        Self::check_layout(size, chunk).map_err(|_| corrupt("impossible size or chunk size"))?;
        Self::check_cursor(node, size, chunk, cursor)?;
        Ok(Region { node, size, chunk, cursor })
    }

    fn check_cursor(node: NodeId, size: u64, chunk: u64, cursor: u64) -> Result<(), RegionError> {
        if cursor < HEADER_SIZE || cursor > size || !(cursor - HEADER_SIZE).is_multiple_of(chunk) {
            return Err(RegionError::Corrupt { node, what: "cursor outside the region or not on a chunk boundary" });
        }
        Ok(())
    }

    /// Takes one chunk: CAS the cursor forward, seeded with the last value
    /// seen (one roundtrip when no other client allocated meanwhile).
    pub async fn alloc_chunk<M: Memory>(&mut self, mem: &M) -> Result<RemoteAddr, RegionError> {
        self.alloc_chunks(mem, 1).await
    }

    /// Takes `n` contiguous chunks (for objects larger than a chunk). A
    /// node without room says how much was asked for and how much is left,
    /// from a fresh read of its cursor (one more roundtrip, on that path
    /// only: the cursor this client saw last may be stale).
    pub async fn alloc_chunks<M: Memory>(&mut self, mem: &M, n: u64) -> Result<RemoteAddr, RegionError> {
        let cursor_addr = RemoteAddr::new(self.node, CURSOR_OFFSET);
        let bytes = n.saturating_mul(self.chunk);
        loop {
            let next = match self.cursor.checked_add(bytes) {
                Some(next) if next <= self.size && n > 0 => next,
                _ => {
                    let now = read_word(mem, cursor_addr).await?;
                    Self::check_cursor(self.node, self.size, self.chunk, now)?;
                    self.cursor = self.cursor.max(now);
                    let free = self.size - self.cursor;
                    return Err(RegionError::Exhausted { node: self.node, need: bytes, free });
                }
            };
            let prev = mem.cas(cursor_addr, self.cursor, next).await?;
            if prev == self.cursor {
                self.cursor = next;
                return Ok(RemoteAddr::new(self.node, prev));
            }
            Self::check_cursor(self.node, self.size, self.chunk, prev)?;
            self.cursor = prev;
        }
    }

    /// The address of the first word of `root` (declared in [`super::roots`]).
    pub fn root_slot(node: NodeId, root: Root) -> Result<RemoteAddr, RegionError> {
        if root.words == 0 || root.slot.saturating_add(root.words) > ROOT_SLOTS {
            return Err(RegionError::BadLayout("root slot out of range"));
        }
        Ok(RemoteAddr::new(node, ROOTS_OFFSET + 8 * root.slot))
    }

    /// Reads the word of `root` (0 means unset).
    pub async fn read_root<M: Memory>(mem: &M, node: NodeId, root: Root) -> Result<u64, RegionError> {
        Ok(read_word(mem, Self::root_slot(node, root)?).await?)
    }

    /// Sets the word of `root` to `value` if it is unset; returns the value
    /// it holds afterwards (ours, or the one another client set first).
    pub async fn claim_root<M: Memory>(mem: &M, node: NodeId, root: Root, value: u64) -> Result<u64, RegionError> {
        let prev = mem.cas(Self::root_slot(node, root)?, 0, value).await?;
        Ok(if prev == 0 { value } else { prev })
    }
}

/// A byte count as people read it in an error message: exact binary units
/// where they fit (`1 MiB`), one decimal where not (`1.5 MiB`), else bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        for (unit, shift) in UNITS {
            let scale = 1u64 << shift;
            if self.0 >= scale {
                return if self.0.is_multiple_of(scale) {
                    write!(f, "{} {unit}", self.0 >> shift)
                } else {
                    write!(f, "{:.1} {unit}", self.0 as f64 / scale as f64)
                };
            }
        }
        write!(f, "{} B", self.0)
    }
}

/// Writes zeros over bytes `from..to` of `node`: [`ZERO_PIECE`] bytes a
/// write, [`MAX_REPLICAS`] writes in flight at once. A backend that finds
/// the writes too large ([`MemErrorKind::TooLarge`]) gets them again,
/// halved, down to [`MIN_ZERO_PIECE`] bytes (writing zeros twice is
/// harmless).
pub(super) async fn zero<M: Memory>(mem: &M, node: NodeId, from: u64, to: u64) -> Result<(), MemError> {
    let mut piece = ZERO_PIECE as u64;
    let mut at = from;
    while at < to {
        let writes = (0..MAX_REPLICAS as u64)
            .map(|i| at + i * piece)
            .take_while(|&start| start < to)
            .map(|start| mem.write(RemoteAddr::new(node, start), &ZEROS[..piece.min(to - start) as usize]))
            .collect();
        match join_all(writes).await.first_error() {
            None => at = to.min(at + MAX_REPLICAS as u64 * piece),
            Some(e) if matches!(e.kind, MemErrorKind::TooLarge { .. }) && piece > MIN_ZERO_PIECE => piece /= 2,
            Some(&e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(size: u64, chunk: u64, cursor: u64) -> [u8; 40] {
        let mut b = [0u8; 40];
        for (i, w) in [MAGIC, VERSION, size, chunk, cursor].iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    #[test]
    fn decode_accepts_a_good_header() {
        let r = Region::decode(NodeId(2), &header(1 << 20, 1 << 16, HEADER_SIZE)).unwrap();
        assert_eq!((r.size, r.chunk, r.cursor), (1 << 20, 1 << 16, HEADER_SIZE));
    }

    #[test]
    fn decode_rejects_garbage() {
        let n = NodeId(0);
        assert!(Region::decode(n, &header(1 << 20, 1 << 16, HEADER_SIZE)[..39]).is_err());
        assert!(Region::decode(n, &header(1 << 20, 1000, HEADER_SIZE)).is_err());
        assert!(Region::decode(n, &header(1 << 20, 1 << 16, 5)).is_err());
        assert!(Region::decode(n, &header(1 << 20, 1 << 16, HEADER_SIZE + 1)).is_err());
        assert!(Region::decode(n, &header(1 << 20, 1 << 16, (1 << 20) + (1 << 16))).is_err());
        assert!(Region::decode(n, &header(8192, 1 << 16, HEADER_SIZE)).is_err());
        let mut b = header(1 << 20, 1 << 16, HEADER_SIZE);
        b[0] ^= 1;
        assert!(Region::decode(n, &b).is_err());
    }

    /// A node full of an earlier run's bytes reads as zero after
    /// `format`, everywhere after the header, and its header is valid.
    #[test]
    fn format_clears_garbage() {
        use alloc::vec::Vec;

        use crate::sim::{Sim, SimConfig};

        const SIZE: u64 = (1 << 20) + 3 * 4096;
        let mut sim = Sim::new(SimConfig { seed: 5, nodes: 2, node_size: SIZE + 4096, ..SimConfig::default() });
        let garbage: Vec<u8> = (0..SIZE + 4096).map(|_| sim.random(1, 255) as u8).collect();
        let admin = sim.client();
        let mem = admin.clone();
        let region = sim
            .block_on(async move {
                for n in 0..2 {
                    mem.write(RemoteAddr::new(NodeId(n), 0), &garbage).await.unwrap();
                }
                // A region smaller than the node: the bytes past it are not the region's.
                Region::format(&mem, NodeId(1), SIZE, 16 << 10).await.unwrap();
                Region::open(&mem, NodeId(1)).await
            })
            .unwrap()
            .unwrap();
        assert_eq!((region.size, region.chunk, region.cursor), (SIZE, 16 << 10, HEADER_SIZE));
        let head = sim.peek(1, 0, HEADER_SIZE as usize).unwrap();
        assert!(Region::decode(NodeId(1), &head).is_ok());
        assert!(head[40..].iter().all(|&b| b == 0), "reserved words and root slots are unset");
        let body = sim.peek(1, HEADER_SIZE, (SIZE - HEADER_SIZE) as usize).unwrap();
        assert_eq!(body.iter().position(|&b| b != 0), None, "every byte after the header is zero");
        assert!(sim.peek(1, SIZE, 4096).unwrap().iter().all(|&b| b != 0), "past the region: untouched");
        assert!(sim.peek(0, 0, SIZE as usize).unwrap().iter().all(|&b| b != 0), "the other node: untouched");
    }

    /// `format_fresh` writes the same header and leaves the rest alone:
    /// it is only for memory that is zero already.
    #[test]
    fn format_fresh_writes_only_the_header() {
        use crate::sim::{Sim, SimConfig};

        const SIZE: u64 = 1 << 20;
        let mut sim = Sim::new(SimConfig { seed: 6, nodes: 1, node_size: SIZE, ..SimConfig::default() });
        let mem = sim.client();
        sim.block_on(async move {
            mem.write(RemoteAddr::new(NodeId(0), 0), &[7; SIZE as usize]).await.unwrap();
            Region::format_fresh(&mem, NodeId(0), SIZE, 16 << 10).await.unwrap();
        })
        .unwrap();
        let head = sim.peek(0, 0, HEADER_SIZE as usize).unwrap();
        assert_eq!(Region::decode(NodeId(0), &head).map(|r| r.cursor), Ok(HEADER_SIZE));
        assert!(head[40..].iter().all(|&b| b == 0));
        assert!(sim.peek(0, HEADER_SIZE, (SIZE - HEADER_SIZE) as usize).unwrap().iter().all(|&b| b == 7));
    }

    /// A memory whose transfers are at most `max` bytes, as an RDMA
    /// client with a small buffer arena.
    struct Limited<M> {
        mem: M,
        max: usize,
        largest_write: core::cell::Cell<usize>,
    }

    impl<M: Memory> Memory for Limited<M> {
        type Buf = M::Buf;

        fn node_count(&self) -> usize {
            self.mem.node_count()
        }

        async fn read(&self, addr: RemoteAddr, len: usize) -> Result<M::Buf, MemError> {
            self.mem.read(addr, len).await
        }

        async fn write(&self, addr: RemoteAddr, data: &[u8]) -> Result<(), MemError> {
            if data.len() > self.max {
                return Err(MemError::new(addr.node, MemErrorKind::TooLarge { len: data.len() as u64 }));
            }
            self.largest_write.set(self.largest_write.get().max(data.len()));
            self.mem.write(addr, data).await
        }

        async fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, MemError> {
            self.mem.cas(addr, expected, new).await
        }

        async fn pipeline(&self, node: NodeId, ops: &[crate::Op<'_>]) -> Result<crate::Outputs<M::Buf>, MemError> {
            self.mem.pipeline(node, ops).await
        }

        fn post_background(&self, node: NodeId, ops: &[crate::Op<'_>]) {
            self.mem.post_background(node, ops)
        }
    }

    /// A backend whose transfers are smaller than format's writes gets
    /// them in pieces it takes; one that takes none gets its error.
    #[test]
    fn format_writes_zeros_in_pieces_the_backend_takes() {
        use crate::sim::{Sim, SimConfig};

        const SIZE: u64 = 256 << 10;
        let mut sim = Sim::new(SimConfig { seed: 7, nodes: 1, node_size: SIZE, ..SimConfig::default() });
        let mem = sim.client();
        let (largest, tiny) = sim
            .block_on(async move {
                mem.write(RemoteAddr::new(NodeId(0), 0), &[9; SIZE as usize]).await.unwrap();
                let limited = Limited { mem: mem.clone(), max: 5000, largest_write: 0.into() };
                Region::format(&limited, NodeId(0), SIZE, 16 << 10).await.unwrap();
                let tiny = Limited { mem, max: 16, largest_write: 0.into() };
                (limited.largest_write.get(), Region::format(&tiny, NodeId(0), SIZE, 16 << 10).await)
            })
            .unwrap();
        assert_eq!(largest, 4096, "64 KiB halved until it fits");
        assert!(sim.peek(0, HEADER_SIZE, (SIZE - HEADER_SIZE) as usize).unwrap().iter().all(|&b| b == 0));
        assert!(
            matches!(tiny, Err(RegionError::Mem(MemError { kind: MemErrorKind::TooLarge { .. }, .. }))),
            "{tiny:?}"
        );
    }

    /// A node without a chunk left says how much was asked for and how
    /// much is left, from its cursor as it is now (another client took
    /// the last chunk since this one looked).
    #[test]
    fn exhaustion_names_the_bytes() {
        use crate::sim::{Sim, SimConfig};

        const SIZE: u64 = HEADER_SIZE + 3 * (64 << 10) + 8192;
        let mut sim = Sim::new(SimConfig { seed: 8, nodes: 1, node_size: SIZE, ..SimConfig::default() });
        let mem = sim.client();
        let (e, stale) = sim
            .block_on(async move {
                let mut mine = Region::format_fresh(&mem, NodeId(0), SIZE, 64 << 10).await.unwrap();
                let mut other = mine;
                mine.alloc_chunks(&mem, 2).await.unwrap();
                other.alloc_chunk(&mem).await.unwrap();
                // Two chunks do not fit even by the cursor this client saw
                // last (72 KiB free then): no CAS, but a fresh read.
                let stale = mine.cursor;
                (mine.alloc_chunks(&mem, 2).await.unwrap_err(), stale)
            })
            .unwrap();
        assert_eq!(e, RegionError::Exhausted { node: NodeId(0), need: 128 << 10, free: 8192 });
        assert_eq!(alloc::format!("{e}"), "node 0 is full: 128 KiB needed, 8 KiB free");
        assert_eq!(SIZE - stale, 72 << 10);
        let bytes = |b| alloc::format!("{}", Bytes(b));
        assert_eq!(
            [bytes(0), bytes(1023), bytes(1536), bytes(3 << 20), bytes(5 << 30)],
            ["0 B", "1023 B", "1.5 KiB", "3 MiB", "5 GiB"]
        );
    }

    #[test]
    fn layouts() {
        assert!(Region::check_layout(HEADER_SIZE + MIN_CHUNK, MIN_CHUNK).is_ok());
        assert!(Region::check_layout(HEADER_SIZE, MIN_CHUNK).is_err());
        assert!(Region::check_layout(1 << 20, 4095).is_err());
        assert!(Region::check_layout((1 << 20) + 1, 4096).is_err());
        let past = Root { slot: ROOT_SLOTS, words: 1, owner: "test" };
        assert!(Region::root_slot(NodeId(0), past).is_err());
        assert!(Region::root_slot(NodeId(0), Root { slot: ROOT_SLOTS - 1, words: 2, owner: "test" }).is_err());
    }
}
