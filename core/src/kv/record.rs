//! The store's configuration record: what every client of a store must
//! agree on (system, shape, options, the clients' clock epoch), written on
//! every node when the store is set up, so that any process can connect
//! to a cluster knowing nothing but where it is.
//!
//! It lives in the root slots [`roots::STORE_RECORD`] of each node's
//! region header:
//!
//! ```text
//! 0    magic "SWKVREC1" (CAS: 0 -> CLAIM by the writer, then the magic)
//! 8    version (3) | replicas (1) | writers (1) | max key (2) | 0 (2)
//! 16   max value (8)
//! 24   keys (8)
//! 32   epoch, µs since the Unix epoch (8)
//! 40   system name, NUL-padded (16)
//! 56   options (8)
//! 64   lease length, ms (4)
//! 68   0 (52)
//! 120  xxh3 of bytes 8..120
//! ```
//!
//! A record is claimed with one CAS on its first word, so of two processes
//! setting up a store at once one wins and the other is told; its bytes
//! are written, then the magic. Everything read back is checked (magic,
//! checksum, every field against the system's limits): a garbled or torn
//! record is an error that says so, never a wrong configuration.

use xxhash_rust::xxh3::xxh3_64;

use super::config::{MAX_OPTIONS, Options, StoreConfig};
use super::{KvError, System};
use crate::substrate::memory::word_at;
use crate::substrate::space::{Region, roots};
use crate::{Memory, NodeId, RemoteAddr};

const MAGIC: u64 = u64::from_le_bytes(*b"SWKVREC1");
/// The first word while its writer fills the record.
const CLAIM: u64 = u64::from_le_bytes(*b"SWKVCLM1");
/// 2: lease tables and writer logs of segments found by time. 3: Clover's
/// keys' cells (their heads, the shortcuts) on their primaries, as checked
/// words.
const VERSION: u16 = 3;
/// Bytes of a record.
pub const LEN: usize = 128;
/// Bytes of a system's name in a record.
pub const NAME_LEN: usize = 16;

/// What a record holds: the store's configuration and clock epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The store's shape (its cache capacity is the reader's choice: set
    /// to [`StoreConfig::new`]'s).
    pub config: StoreConfig,
    /// Microseconds since the Unix epoch at the clients' clock tick 0.
    pub epoch_us: u64,
}

/// What reading a node's record found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// No record: no store was set up.
    Empty,
    /// Another process is writing one now.
    Claimed,
    /// A valid record.
    Record(Record),
}

/// The record's bytes.
pub fn encode(r: &Record) -> [u8; LEN] {
    let c = &r.config;
    let mut b = [0u8; LEN];
    b[..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..10].copy_from_slice(&VERSION.to_le_bytes());
    b[10] = c.replicas as u8;
    b[11] = c.writers;
    b[12..14].copy_from_slice(&(c.max_key as u16).to_le_bytes());
    b[16..24].copy_from_slice(&(c.max_value as u64).to_le_bytes());
    b[24..32].copy_from_slice(&c.keys.to_le_bytes());
    b[32..40].copy_from_slice(&r.epoch_us.to_le_bytes());
    let name = c.system.name().as_bytes();
    b[40..40 + name.len().min(NAME_LEN)].copy_from_slice(&name[..name.len().min(NAME_LEN)]);
    b[56..64].copy_from_slice(&c.options.to_bytes());
    b[64..68].copy_from_slice(&c.lease_ms.to_le_bytes());
    let sum = xxh3_64(&b[8..120]);
    b[120..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Reads a record's bytes; `lookup` names the systems there are.
pub fn decode(b: &[u8], lookup: impl Fn(&str) -> Option<System>) -> Result<Found, &'static str> {
    let b = b.get(..LEN).ok_or("truncated store record")?;
    let word = |at| word_at(b, at).ok_or("truncated store record");
    match word(0)? {
        0 if b.iter().all(|&x| x == 0) => return Ok(Found::Empty),
        CLAIM => return Ok(Found::Claimed),
        MAGIC => {}
        _ => return Err("not a store record"),
    }
    if word(120)? != xxh3_64(&b[8..120]) {
        return Err("the store record's checksum does not match");
    }
    if u16::from_le_bytes([b[8], b[9]]) != VERSION {
        return Err("a store record of another version");
    }
    let name = &b[40..56];
    let len = name.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
    let name = core::str::from_utf8(&name[..len]).map_err(|_| "the store record names no system")?;
    let system = lookup(name).ok_or("the store record names a system this build does not have")?;
    let mut options = [0u8; MAX_OPTIONS];
    options.copy_from_slice(&b[56..64]);
    let keys = word(24)?;
    let mut config = StoreConfig::new(system, keys);
    config.replicas = b[10] as usize;
    config.writers = b[11];
    config.max_key = u16::from_le_bytes([b[12], b[13]]) as usize;
    config.max_value = usize::try_from(word(16)?).map_err(|_| "impossible store record")?;
    config.options = Options::from_bytes(options);
    config.lease_ms = u32::from_le_bytes([b[64], b[65], b[66], b[67]]);
    // Checked against the most nodes there may be; `systems::open` checks
    // it again against the cluster's.
    config.check(crate::substrate::space::slab::MAX_NODES).map_err(|_| "impossible store record")?;
    Ok(Found::Record(Record { config, epoch_us: word(32)? }))
}

fn at(node: NodeId) -> Result<RemoteAddr, KvError> {
    Ok(Region::root_slot(node, roots::STORE_RECORD)?)
}

/// Reads `node`'s record.
pub async fn read<M: Memory>(mem: &M, node: NodeId, lookup: impl Fn(&str) -> Option<System>) -> Result<Found, KvError> {
    let buf = mem.read(at(node)?, LEN).await?;
    decode(&buf, lookup).map_err(|_| KvError::Corrupt)
}

/// Writes `r` on `node`, unless it has a record: claims it, fills it, then
/// sets the magic. `Ok(false)` if another record was there or claimed.
pub async fn write<M: Memory>(mem: &M, node: NodeId, r: &Record) -> Result<bool, KvError> {
    let first = at(node)?;
    if mem.cas(first, 0, CLAIM).await? != 0 {
        return Ok(false);
    }
    let bytes = encode(r);
    let rest = first.checked_add(8).ok_or(KvError::Corrupt)?;
    mem.write(rest, &bytes[8..]).await?;
    mem.write(first, &bytes[..8]).await?;
    Ok(true)
}
