//! The key-value interface every system of the toolkit implements
//! (SWARM-KV, RAW, DM-ABD, and the other systems as they come), so that the
//! harness, the checks and the command line treat them alike; how a system
//! is declared ([`KvSystem`], registered in `crate::systems`); and the
//! parts its stores share (placement, errors, the configuration record,
//! the replicated-register store of SWARM-KV and DM-ABD).
//!
//! Semantics, per key (the model `swarm_lincheck::Kv` checks histories
//! against, with tombstones):
//!
//! | operation | key present (`v0`) | key absent | key deleted |
//! |---|---|---|---|
//! | `insert(k, v)` | sets `v`: [`Written`] | sets `v`: [`Written`] | sets `v`: [`Written`] |
//! | `update(k, v)` | sets `v`: [`Written`] | [`Missing::NotFound`] | [`Missing::NotFound`] |
//! | `get(k)` | [`Got::Found`]`(v0)` | [`Got::NotFound`] | [`Got::Deleted`] |
//! | `delete(k)` | removes it: [`Written`] | [`Missing::NotFound`] | [`Missing::NotFound`] or [`Written`] |
//!
//! A deleted key's tombstone is unmapped in the background (SWARM §5.3.2),
//! so for a while after a delete `get` may answer [`Got::Deleted`] or
//! [`Got::NotFound`], and a second delete may find the tombstone still
//! mapped and answer [`Written`] (deletes are idempotent: telling a first
//! delete from a concurrent second one would take consensus, not one
//! roundtrip). `swarm_lincheck::Kv::lazy_unmap` is this table.
//!
//! An insert of an existing key is an update (SWARM §5.3.1). A client
//! handle runs one operation at a time (`&mut self`); a thread keeps several
//! operations in flight by driving several handles concurrently, each with
//! its own client id, as the paper's coroutines do (1 to 8 per thread,
//! §7.2): Safe-Guess needs one outstanding operation per writer id.

use core::future::Future;
use core::ops::Deref;

#[cfg(feature = "alloc")]
pub mod any;
pub mod config;
mod error;
pub mod place;
pub mod record;
#[cfg(feature = "alloc")]
pub mod replicated;
#[cfg(feature = "alloc")]
pub mod seat;
mod system;
pub mod torn;

#[cfg(feature = "alloc")]
pub use any::AnyClient;
pub use config::{Choice, MAX_CLIENTS, MAX_OPTIONS, MAX_VALUE, MinNode, NodeChunks, NodeShape, Options, StoreConfig};
pub use error::KvError;
pub use system::{Guarantee, Handle, KvSystem, Roundtrips, System, SystemInfo, Visit, Who};

/// Limits on keys and values, checked before anything is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes.
    pub max_key: usize,
    /// Largest value, in bytes.
    pub max_value: usize,
}

impl Limits {
    /// Checks a key (non-empty, at most `max_key` bytes).
    pub fn check_key(&self, key: &[u8]) -> Result<(), KvError> {
        if key.is_empty() || key.len() > self.max_key {
            return Err(KvError::BadKey { len: key.len(), max: self.max_key });
        }
        Ok(())
    }

    /// Checks a key and a value.
    pub fn check(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.check_key(key)?;
        if value.len() > self.max_value {
            return Err(KvError::ValueTooLarge { len: value.len(), max: self.max_value });
        }
        Ok(())
    }
}

/// A write took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written;

/// Why an update or delete had no effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The key is not in the store (never inserted, or deleted).
    NotFound,
}

/// What a get found.
#[derive(Debug, PartialEq, Eq)]
pub enum Got<V> {
    /// The key's value.
    Found(V),
    /// The key was never inserted (or its index entry is gone).
    NotFound,
    /// The key was deleted and not inserted again since.
    Deleted,
}

/// One client of a key-value store.
pub trait KvClient {
    /// A value read from the store.
    type Value: Deref<Target = [u8]>;

    /// The system's name, lower case with dashes (`raw`, `dm-abd`, `swarm-kv`).
    fn name(&self) -> &'static str;

    /// The limits this store was configured with.
    fn limits(&self) -> Limits;

    /// Inserts `key` with `value`, or updates it if it exists.
    fn insert(&mut self, key: &[u8], value: &[u8]) -> impl Future<Output = Result<Written, KvError>>;

    /// Updates an existing key.
    fn update(&mut self, key: &[u8], value: &[u8]) -> impl Future<Output = Result<Result<Written, Missing>, KvError>>;

    /// Reads a key.
    fn get(&mut self, key: &[u8]) -> impl Future<Output = Result<Got<Self::Value>, KvError>>;

    /// Deletes a key.
    fn delete(&mut self, key: &[u8]) -> impl Future<Output = Result<Result<Written, Missing>, KvError>>;

    /// Stops using the store: gives the client's leased id back, with where
    /// its next holder goes on. A client that is dropped without closing
    /// keeps its id until the lease expires. (A client with nothing to give
    /// back keeps the default.)
    fn close(&mut self) -> impl Future<Output = Result<(), KvError>> {
        async { Ok(()) }
    }

    /// Renews this client's lease on its id if half of it has passed.
    /// Writes renew it on their own; a client that may stay idle for
    /// longer than its lease (a shell waiting for input) calls this
    /// meanwhile, or its id may be claimed by another process (its next
    /// write then fails). A client without a lease has nothing to renew.
    fn keep(&mut self) -> impl Future<Output = Result<(), KvError>> {
        async { Ok(()) }
    }

    /// How long [`KvClient::keep`] goes on working off a write after it was
    /// made, if it is called often meanwhile, ns (0 for a store with no
    /// such background work): SWARM-KV's and DM-ABD's log recycling
    /// resolves a write within a few recycling delays. A benchmark warms
    /// up at least this long, calling `keep` after every operation, so
    /// that it measures the steady state rather than the recycling of its
    /// load.
    fn settle_ns(&self) -> u64 {
        0
    }

    /// How often this client's operations took the rare paths of SWARM's
    /// objects (none for a store without them): what campaigns assert
    /// they exercised.
    fn paths(&self) -> crate::swarm::client::Paths {
        crate::swarm::client::Paths::default()
    }
}

/// A boxed client is a client: stores whose clients hold tens of KiB of
/// state (allocator, logs) hand them out boxed, so that moving one costs a
/// pointer.
#[cfg(feature = "alloc")]
impl<K: KvClient + ?Sized> KvClient for alloc::boxed::Box<K> {
    type Value = K::Value;

    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn limits(&self) -> Limits {
        (**self).limits()
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> impl Future<Output = Result<Written, KvError>> {
        (**self).insert(key, value)
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> impl Future<Output = Result<Result<Written, Missing>, KvError>> {
        (**self).update(key, value)
    }

    fn get(&mut self, key: &[u8]) -> impl Future<Output = Result<Got<Self::Value>, KvError>> {
        (**self).get(key)
    }

    fn delete(&mut self, key: &[u8]) -> impl Future<Output = Result<Result<Written, Missing>, KvError>> {
        (**self).delete(key)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), KvError>> {
        (**self).close()
    }

    fn keep(&mut self) -> impl Future<Output = Result<(), KvError>> {
        (**self).keep()
    }

    fn settle_ns(&self) -> u64 {
        (**self).settle_ns()
    }

    fn paths(&self) -> crate::swarm::client::Paths {
        (**self).paths()
    }
}

#[cfg(test)]
mod limits_tests {
    use super::*;

    #[test]
    fn limits_reject_bad_input_with_the_numbers() {
        let l = Limits { max_key: 24, max_value: 8192 };
        assert!(l.check(b"k", &[0; 8192]).is_ok());
        assert_eq!(l.check_key(b""), Err(KvError::BadKey { len: 0, max: 24 }));
        assert_eq!(l.check_key(&[1; 25]), Err(KvError::BadKey { len: 25, max: 24 }));
        assert_eq!(l.check(b"k", &[0; 8193]), Err(KvError::ValueTooLarge { len: 8193, max: 8192 }));
        assert_eq!(
            alloc::format!("{}", KvError::ValueTooLarge { len: 8193, max: 8192 }),
            "values may have up to 8192 bytes, this one has 8193"
        );
    }
}
