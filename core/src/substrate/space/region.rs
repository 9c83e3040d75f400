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
//!        40..64 reserved
//!        64..   root slots: CAS words, 0 = unset, for protocols' well-known
//!               objects (an index's location, a log directory), declared
//!               in [`super::roots`]
//!        4096   first chunk
//! ```
//!
//! Everything read from the header is validated: a garbled header is a
//! [`RegionError::Corrupt`], never a panic or an out-of-bounds access.

use core::fmt;

use super::roots::Root;
use crate::substrate::memory::{read_word, word_at};
use crate::{MemError, Memory, NodeId, RemoteAddr};

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
    /// No chunk is left on the node.
    Exhausted {
        /// The node.
        node: NodeId,
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
            RegionError::Exhausted { node } => write!(f, "{node}: region is full"),
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

    /// Writes a fresh header on `node`. Run once, by whoever creates the
    /// node, before any client opens it; the magic word is written last so
    /// that a half-written header is never taken for a valid one.
    pub async fn format<M: Memory>(mem: &M, node: NodeId, size: u64, chunk: u64) -> Result<Region, RegionError> {
        Self::check_layout(size, chunk)?;
        let mut head = [0u8; HEADER_SIZE as usize];
        head[8..16].copy_from_slice(&VERSION.to_le_bytes());
        head[16..24].copy_from_slice(&size.to_le_bytes());
        head[24..32].copy_from_slice(&chunk.to_le_bytes());
        head[32..40].copy_from_slice(&HEADER_SIZE.to_le_bytes());
        mem.write(RemoteAddr::new(node, 0), &[0; 8]).await?;
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

    /// Takes `n` contiguous chunks (for objects larger than a chunk).
    pub async fn alloc_chunks<M: Memory>(&mut self, mem: &M, n: u64) -> Result<RemoteAddr, RegionError> {
        let cursor_addr = RemoteAddr::new(self.node, CURSOR_OFFSET);
        let bytes = n.checked_mul(self.chunk).ok_or(RegionError::Exhausted { node: self.node })?;
        loop {
            let next = match self.cursor.checked_add(bytes) {
                Some(next) if next <= self.size && n > 0 => next,
                _ => return Err(RegionError::Exhausted { node: self.node }),
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
