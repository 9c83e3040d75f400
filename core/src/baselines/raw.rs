//! RAW: one unreplicated copy, read and written in place (SWARM §7,
//! "Baselines"). One READ per get, one WRITE per update.
//!
//! RAW has no concurrency control: a read concurrent with a write may
//! return a mix of both values, and concurrent writers may leave such a
//! mix behind. It is the lower bound on latency that the replicated
//! protocols are compared to, not something to store data with; it is
//! correct only with one writer and no read concurrent with a write.
//!
//! Layout: `length (8) | checksum (8) | value bytes (up to max_value)`; a
//! length of [`DELETED_LEN`] marks a deleted key (RAW's key-value store).
//! The checksum (xxHash3 of the value, seeded by the length and the
//! register's tag, a key-value store's key hash) is written with the value
//! and checked by every read: a torn read (a write concurrent with it), a
//! garbled copy or another key's copy is [`RawError::Torn`], never a value.
//! The same end-to-end check the replicated stores make, at no roundtrip.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::substrate::memory::word_at;
use crate::{MemError, Memory, Op, RemoteAddr};

/// Bytes before the value: its length and checksum.
const HEADER: u64 = 16;

/// The length word of a deleted RAW register.
pub const DELETED_LEN: u64 = u64::MAX;

/// A RAW register at `addr`, holding values of up to `max_value` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRegister {
    /// Where it lives.
    pub addr: RemoteAddr,
    /// Largest value.
    pub max_value: u64,
    /// What it holds values of (a key hash; 0 for a bare register): seeds
    /// its checksum.
    pub tag: u64,
}

/// A failure of a RAW operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawError {
    /// The memory operation failed.
    Mem(MemError),
    /// The value is larger than the register.
    TooLarge {
        /// Bytes given.
        len: usize,
    },
    /// The stored length is impossible (a torn or corrupt length word).
    Corrupt,
    /// The value does not match its checksum: read while it was being
    /// written (read again), or garbled.
    Torn,
    /// The register was deleted ([`RawRegister::delete`]).
    Deleted,
}

impl From<MemError> for RawError {
    fn from(e: MemError) -> Self {
        RawError::Mem(e)
    }
}

impl core::fmt::Display for RawError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RawError::Mem(e) => write!(f, "{e}"),
            RawError::TooLarge { len } => write!(f, "value of {len} bytes does not fit the register"),
            RawError::Corrupt => write!(f, "impossible stored length"),
            RawError::Torn => write!(f, "the value does not match its checksum"),
            RawError::Deleted => write!(f, "deleted"),
        }
    }
}

impl RawRegister {
    /// Bytes the register occupies (64-byte aligned).
    pub fn size(max_value: u64) -> u64 {
        (HEADER + max_value).next_multiple_of(64)
    }

    fn sum(&self, value: &[u8]) -> u64 {
        xxh3_64_with_seed(value, self.tag ^ (value.len() as u64).rotate_left(32) ^ 0x5357_5241)
    }

    /// UPDATE: length, checksum and value in one pipeline (one roundtrip).
    pub async fn write<M: Memory>(&self, mem: &M, value: &[u8]) -> Result<(), RawError> {
        if value.len() as u64 > self.max_value {
            return Err(RawError::TooLarge { len: value.len() });
        }
        let mut head = [0u8; HEADER as usize];
        head[..8].copy_from_slice(&(value.len() as u64).to_le_bytes());
        head[8..].copy_from_slice(&self.sum(value).to_le_bytes());
        let ops = [
            Op::Write { offset: self.addr.offset, data: &head },
            Op::Write { offset: self.addr.offset + HEADER, data: value },
        ];
        mem.pipeline(self.addr.node, &ops).await?;
        Ok(())
    }

    /// DELETE: the length word set to [`DELETED_LEN`] (one roundtrip).
    pub async fn delete<M: Memory>(&self, mem: &M) -> Result<(), RawError> {
        Ok(mem.write(self.addr, &DELETED_LEN.to_le_bytes()).await?)
    }

    /// GET: one READ of length and value. Returns the buffer and the value's
    /// range in it.
    pub async fn read<M: Memory>(&self, mem: &M) -> Result<(M::Buf, core::ops::Range<usize>), RawError> {
        let buf = mem.read(self.addr, (HEADER + self.max_value) as usize).await?;
        let len = word_at(&buf, 0).ok_or(RawError::Corrupt)?;
        if len == DELETED_LEN {
            return Err(RawError::Deleted);
        }
        if len > self.max_value {
            return Err(RawError::Corrupt);
        }
        let range = HEADER as usize..(HEADER + len) as usize;
        let sum = word_at(&buf, 8).ok_or(RawError::Corrupt)?;
        match buf.get(range.clone()) {
            Some(value) if self.sum(value) == sum => Ok((buf, range)),
            _ => Err(RawError::Torn),
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::rc::Rc;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use super::*;
    use crate::NodeId;
    use crate::sim::{Sim, SimConfig};
    use crate::substrate::rtt::Counted;

    fn reg() -> RawRegister {
        RawRegister { addr: RemoteAddr::new(NodeId(0), 128), max_value: 256, tag: 7 }
    }

    #[test]
    fn one_roundtrip_each_and_sizes_checked() {
        let mut sim = Sim::new(SimConfig { nodes: 1, ..SimConfig::default() });
        let mem = sim.client();
        sim.block_on(async move {
            let r = reg();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Torn), "never written: no checksum");
            let c = Counted::new(&mem);
            r.write(&c, &[7; 100]).await.unwrap();
            let (buf, range) = r.read(&c).await.unwrap();
            assert_eq!(&buf[range], &[7; 100][..]);
            assert_eq!(c.roundtrips(), 2);
            let other = RawRegister { tag: 8, ..r };
            assert_eq!(other.read(&mem).await.err(), Some(RawError::Torn), "another key's copy");
            mem.write(RemoteAddr::new(NodeId(0), r.addr.offset + 20), &[8]).await.unwrap();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Torn), "a garbled byte");
            assert_eq!(r.write(&mem, &[0; 257]).await, Err(RawError::TooLarge { len: 257 }));
            mem.write(r.addr, &(u64::MAX - 1).to_le_bytes()).await.unwrap();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Corrupt));
            r.delete(&mem).await.unwrap();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Deleted));
        })
        .unwrap();
    }

    /// Concurrent writers leave reads that would mix two values: the
    /// checksum tells them (`Torn`), and no mix is ever returned.
    #[test]
    fn torn_reads_under_concurrent_writers_are_told() {
        let (mut torn, mut mixed) = (0, 0);
        for seed in 0..50 {
            let mut sim = Sim::new(SimConfig { seed, nodes: 1, max_piece_gap_ns: 1_000, ..SimConfig::default() });
            for w in 1..=2u8 {
                let c = sim.client();
                let m = c.clone();
                sim.spawn(&c, async move {
                    for _ in 0..5 {
                        reg().write(&m, &[w; 200]).await.unwrap();
                    }
                });
            }
            let seen = Rc::new(RefCell::new(Vec::new()));
            let c = sim.client();
            let (m, s) = (c.clone(), seen.clone());
            sim.spawn(&c, async move {
                for _ in 0..10 {
                    let got = reg().read(&m).await.map(|(buf, range)| buf[range].to_vec());
                    s.borrow_mut().push(got);
                }
            });
            sim.run().unwrap();
            torn += seen.borrow().iter().filter(|v| matches!(v, Err(RawError::Torn))).count();
            mixed += seen.borrow().iter().filter(|v| v.as_ref().is_ok_and(|v| v.iter().any(|&b| b != v[0]))).count();
        }
        assert!(torn > 0, "concurrent writers were expected to tear some reads");
        assert_eq!(mixed, 0, "a mix of two values was returned");
    }
}
