//! The model of a counter: fetch-and-add (a sequencer, a ticket
//! dispenser) and read.

use super::Model;

/// A counter of `u64`, starting at 0: `Add(n)` adds `n` and answers the
/// value before ([`CounterRet::Value`]); `Read` answers the value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter;

/// An operation on a [`Counter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterOp {
    /// Fetch-and-add.
    Add(u64),
    /// Reads the value.
    Read,
}

/// The answer of a [`Counter`] operation: the value before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterRet {
    /// The counter's value (before the operation).
    Value(u64),
}

impl Model for Counter {
    type State = u64;
    type Input = CounterOp;
    type Output = CounterRet;
    type Key = ();

    fn init(&self) -> u64 {
        0
    }

    fn step(&self, state: &u64, input: &CounterOp) -> (u64, CounterRet) {
        match *input {
            CounterOp::Add(n) => (state.wrapping_add(n), CounterRet::Value(*state)),
            CounterOp::Read => (*state, CounterRet::Value(*state)),
        }
    }

    fn key(&self, _input: &CounterOp) {}

    fn is_read_only(&self, input: &CounterOp) -> bool {
        matches!(input, CounterOp::Read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{History, check};

    #[test]
    fn tickets_must_be_distinct_and_follow_real_time() {
        let mut h = History::new();
        let a = h.invoke(0, 1, CounterOp::Add(1));
        h.respond(a, 2, CounterRet::Value(0));
        let b = h.invoke(1, 3, CounterOp::Add(1));
        let c = h.invoke(2, 3, CounterOp::Add(1));
        h.respond(b, 5, CounterRet::Value(2));
        h.respond(c, 5, CounterRet::Value(1));
        let _lost = h.invoke(3, 6, CounterOp::Add(1));
        let r = h.invoke(0, 7, CounterOp::Read);
        h.respond(r, 8, CounterRet::Value(4));
        assert!(check(&Counter, h.operations()).is_linearizable(), "the pending add took effect");

        let mut dup = History::new();
        let a = dup.invoke(0, 1, CounterOp::Add(1));
        let b = dup.invoke(1, 1, CounterOp::Add(1));
        dup.respond(a, 2, CounterRet::Value(0));
        dup.respond(b, 2, CounterRet::Value(0));
        assert!(!check(&Counter, dup.operations()).is_linearizable(), "two answers of one ticket");

        let mut stale = History::new();
        let a = stale.invoke(0, 1, CounterOp::Add(1));
        stale.respond(a, 2, CounterRet::Value(0));
        let b = stale.invoke(1, 3, CounterOp::Add(1));
        stale.respond(b, 4, CounterRet::Value(0));
        assert!(!check(&Counter, stale.operations()).is_linearizable(), "a ticket handed out again later");
    }
}
