//! RAW: one unreplicated copy, read and written in place (SWARM §7,
//! "Baselines"). One READ per get, one WRITE per update.
//!
//! RAW has no concurrency control: a read concurrent with a write may
//! return a mix of both values, and concurrent writers may leave such a
//! mix behind. It is the lower bound on latency that the replicated
//! protocols are compared to, not something to store data with; it is
//! correct only with one writer and no read concurrent with a write.
//!
//! Layout: `length (8) | value bytes (up to max_value)`; a length of
//! [`DELETED_LEN`] marks a deleted key (RAW's key-value store).

use crate::substrate::memory::word_at;
use crate::{MemError, Memory, Op, RemoteAddr};

/// The length word of a deleted RAW register.
pub const DELETED_LEN: u64 = u64::MAX;

/// A RAW register at `addr`, holding values of up to `max_value` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRegister {
    /// Where it lives.
    pub addr: RemoteAddr,
    /// Largest value.
    pub max_value: u64,
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
            RawError::Deleted => write!(f, "deleted"),
        }
    }
}

impl RawRegister {
    /// Bytes the register occupies (64-byte aligned).
    pub fn size(max_value: u64) -> u64 {
        (8 + max_value).next_multiple_of(64)
    }

    /// UPDATE: length and value in one pipeline (one roundtrip).
    pub async fn write<M: Memory>(&self, mem: &M, value: &[u8]) -> Result<(), RawError> {
        if value.len() as u64 > self.max_value {
            return Err(RawError::TooLarge { len: value.len() });
        }
        let len = (value.len() as u64).to_le_bytes();
        let ops = [
            Op::Write { offset: self.addr.offset, data: &len },
            Op::Write { offset: self.addr.offset + 8, data: value },
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
        let buf = mem.read(self.addr, 8 + self.max_value as usize).await?;
        let len = word_at(&buf, 0).ok_or(RawError::Corrupt)?;
        if len == DELETED_LEN {
            return Err(RawError::Deleted);
        }
        if len > self.max_value {
            return Err(RawError::Corrupt);
        }
        Ok((buf, 8..8 + len as usize))
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
        RawRegister { addr: RemoteAddr::new(NodeId(0), 128), max_value: 256 }
    }

    #[test]
    fn one_roundtrip_each_and_sizes_checked() {
        let mut sim = Sim::new(SimConfig { nodes: 1, ..SimConfig::default() });
        let mem = sim.client();
        sim.block_on(async move {
            let r = reg();
            let (buf, range) = r.read(&mem).await.unwrap();
            assert!(buf[range].is_empty(), "a fresh register is empty");
            let c = Counted::new(&mem);
            r.write(&c, &[7; 100]).await.unwrap();
            let (buf, range) = r.read(&c).await.unwrap();
            assert_eq!(&buf[range], &[7; 100][..]);
            assert_eq!(c.roundtrips(), 2);
            assert_eq!(r.write(&mem, &[0; 257]).await, Err(RawError::TooLarge { len: 257 }));
            mem.write(r.addr, &(u64::MAX - 1).to_le_bytes()).await.unwrap();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Corrupt));
            r.delete(&mem).await.unwrap();
            assert_eq!(r.read(&mem).await.err(), Some(RawError::Deleted));
        })
        .unwrap();
    }

    /// What the module doc warns about: with concurrent writers, reads
    /// return mixes of two values.
    #[test]
    fn concurrent_writers_tear_values() {
        let mut torn = 0;
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
                    if let Ok((buf, range)) = reg().read(&m).await {
                        let v = buf[range].to_vec();
                        s.borrow_mut().push(v);
                    }
                }
            });
            sim.run().unwrap();
            torn += seen.borrow().iter().filter(|v| !v.is_empty() && v.iter().any(|&b| b != v[0])).count();
        }
        assert!(torn > 0, "RAW was expected to tear under concurrent writers");
    }
}
