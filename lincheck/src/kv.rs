//! The model of a key-value store, checked key by key.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::Model;

/// A key-value store of `u64` keys and values (callers hash larger ones),
/// with the answers SWARM-KV gives; every key starts absent.
///
/// Per key, with `tombstones` on (the default):
///
/// | operation      | key present (`v0`)          | key never present / deleted           |
/// |----------------|-----------------------------|---------------------------------------|
/// | `Insert(k, v)` | sets `v`, answers `Ok`      | sets `v`, answers `Ok`                |
/// | `Update(k, v)` | sets `v`, answers `Ok`      | no effect, answers `NotFound`         |
/// | `Get(k)`       | answers `Found(v0)`         | answers `NotFound` / `Deleted`        |
/// | `Delete(k)`    | removes it, answers `Ok`    | no effect, answers `NotFound`         |
///
/// That is, an insert of an existing key is an update, and `Deleted` is a
/// tombstone that only `Get` reports: after a `Delete` took effect, `Get`
/// answers `Deleted` until the next `Insert`, while `Update` and `Delete`
/// answer `NotFound` as for a key never inserted. With `tombstones` off a
/// deleted key is indistinguishable from one never inserted (`Get` answers
/// `NotFound`) and `Deleted` is never a correct answer.
///
/// The state is that of one key ([`KeyState`]): the checker splits a
/// history by key ([`Model::key`]) and checks each key alone.
///
/// [`Kv::lazy_unmap`] is the store whose tombstones are unmapped in the
/// background (SWARM-KV §5.3.2, the toolkit's `kv` interface): a deleted key may answer a
/// `Get` with `Deleted` or `NotFound` (unmapped), and a `Delete` of a
/// deleted key `NotFound` or `Ok` (its tombstone still mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kv {
    /// Whether `Get` tells a deleted key from one never inserted.
    pub tombstones: bool,
    /// Whether deleted keys may answer as unmapped or as still mapped.
    pub lazy: bool,
}

impl Kv {
    /// The store with the given handling of deleted keys.
    pub const fn new(tombstones: bool) -> Self {
        Kv { tombstones, lazy: false }
    }

    /// The store of the toolkit's `kv` interface: tombstones unmapped in the background.
    pub const fn lazy_unmap() -> Self {
        Kv { tombstones: true, lazy: true }
    }
}

impl Default for Kv {
    /// With tombstones.
    fn default() -> Self {
        Kv::new(true)
    }
}

/// An operation on a [`Kv`] store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// Sets the key's value, whether or not it exists.
    Insert(u64, u64),
    /// Sets the value of an existing key.
    Update(u64, u64),
    /// Reads the key.
    Get(u64),
    /// Removes the key.
    Delete(u64),
}

impl KvOp {
    /// The key the operation acts on.
    pub const fn key(&self) -> u64 {
        match *self {
            KvOp::Insert(k, _) | KvOp::Update(k, _) | KvOp::Get(k) | KvOp::Delete(k) => k,
        }
    }
}

/// The answer of a [`Kv`] operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvRet {
    /// An insert, an update of a present key or a delete of one completed.
    Ok,
    /// A get found this value.
    Found(u64),
    /// The key is absent (for a get: never inserted, or deleted and the
    /// model has no tombstones).
    NotFound,
    /// A get found the key deleted (tombstone model only).
    Deleted,
}

/// The state of one key of a [`Kv`] store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// Never inserted (or deleted, without tombstones).
    Absent,
    /// Holds this value.
    Present(u64),
    /// Deleted since it was last inserted (tombstone model only).
    Deleted,
}

impl Model for Kv {
    type State = KeyState;
    type Input = KvOp;
    type Output = KvRet;
    type Key = u64;

    fn init(&self) -> KeyState {
        KeyState::Absent
    }

    fn step(&self, state: &KeyState, input: &KvOp) -> (KeyState, KvRet) {
        let present = matches!(state, KeyState::Present(_));
        match *input {
            KvOp::Insert(_, v) => (KeyState::Present(v), KvRet::Ok),
            KvOp::Update(_, v) if present => (KeyState::Present(v), KvRet::Ok),
            KvOp::Update(..) => (*state, KvRet::NotFound),
            KvOp::Get(_) => match *state {
                KeyState::Present(v) => (*state, KvRet::Found(v)),
                KeyState::Absent => (*state, KvRet::NotFound),
                KeyState::Deleted => (*state, KvRet::Deleted),
            },
            KvOp::Delete(_) if present => {
                let gone = if self.tombstones { KeyState::Deleted } else { KeyState::Absent };
                (gone, KvRet::Ok)
            }
            KvOp::Delete(_) => (*state, KvRet::NotFound),
        }
    }

    fn key(&self, input: &KvOp) -> u64 {
        input.key()
    }

    fn accepts(&self, state: &KeyState, input: &KvOp, model: &KvRet, recorded: &KvRet) -> bool {
        model == recorded
            || (self.lazy
                && *state == KeyState::Deleted
                && matches!(
                    (input, model, recorded),
                    (KvOp::Get(_), KvRet::Deleted, KvRet::NotFound) | (KvOp::Delete(_), KvRet::NotFound, KvRet::Ok)
                ))
    }

    fn is_read_only(&self, input: &KvOp) -> bool {
        matches!(input, KvOp::Get(_))
    }

    /// Absent, deleted (with tombstones, if some operation deletes),
    /// present with each value written somewhere that the window gets, and
    /// present with one written value that it does not get: the window
    /// cannot tell the other values apart.
    fn window_states(&self, all: &[&KvOp], window: &[(&KvOp, Option<&KvRet>)]) -> Vec<KeyState> {
        let written: BTreeSet<u64> = all
            .iter()
            .filter_map(|op| match op {
                KvOp::Insert(_, v) | KvOp::Update(_, v) => Some(*v),
                KvOp::Get(_) | KvOp::Delete(_) => None,
            })
            .collect();
        let got: BTreeSet<u64> = window
            .iter()
            .filter_map(|(_, out)| match out {
                Some(KvRet::Found(v)) => Some(*v),
                _ => None,
            })
            .collect();
        let mut states = Vec::new();
        states.push(KeyState::Absent);
        if self.tombstones && all.iter().any(|op| matches!(op, KvOp::Delete(_))) {
            states.push(KeyState::Deleted);
        }
        states.extend(written.intersection(&got).map(|&v| KeyState::Present(v)));
        states.extend(written.difference(&got).next().map(|&v| KeyState::Present(v)));
        states
    }
}
