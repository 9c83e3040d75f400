//! The model of a read/write register.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::Model;

/// A read/write register of `u64` values (callers that store larger values
/// record a hash of them), starting at [`initial`](Register::initial).
///
/// `Write(v)` sets the value and answers [`RegisterRet::Ack`]; `Read`
/// answers [`RegisterRet::Value`] with the current value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Register {
    /// The value a read sees before any write (0 by default).
    pub initial: u64,
}

impl Register {
    /// A register that holds `initial` before any write.
    pub const fn new(initial: u64) -> Self {
        Register { initial }
    }
}

/// An operation on a [`Register`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterOp {
    /// Sets the value.
    Write(u64),
    /// Reads the value.
    Read,
}

/// The answer of a [`Register`] operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterRet {
    /// A write completed.
    Ack,
    /// A read returned this value.
    Value(u64),
}

impl Model for Register {
    type State = u64;
    type Input = RegisterOp;
    type Output = RegisterRet;
    type Key = ();

    fn init(&self) -> u64 {
        self.initial
    }

    fn step(&self, state: &u64, input: &RegisterOp) -> (u64, RegisterRet) {
        match *input {
            RegisterOp::Write(v) => (v, RegisterRet::Ack),
            RegisterOp::Read => (*state, RegisterRet::Value(*state)),
        }
    }

    fn key(&self, _input: &RegisterOp) {}

    /// Distinct written values: Gibbons and Korach's zones decide it
    /// (see `zones`).
    fn proves_linearizable(&self, ops: &[&super::Operation<RegisterOp, RegisterRet>]) -> bool {
        super::zones::proves_linearizable(self.initial, ops)
    }

    fn is_read_only(&self, input: &RegisterOp) -> bool {
        matches!(input, RegisterOp::Read)
    }

    /// The values written (or initial) that the window reads, and one
    /// written value that it does not read: the window cannot tell the
    /// other values apart.
    fn window_states(&self, all: &[&RegisterOp], window: &[(&RegisterOp, Option<&RegisterRet>)]) -> Vec<u64> {
        let mut written: BTreeSet<u64> = all
            .iter()
            .filter_map(|op| match op {
                RegisterOp::Write(v) => Some(*v),
                RegisterOp::Read => None,
            })
            .collect();
        written.insert(self.initial);
        let read: BTreeSet<u64> = window
            .iter()
            .filter_map(|(_, out)| match out {
                Some(RegisterRet::Value(v)) => Some(*v),
                _ => None,
            })
            .collect();
        let mut states: Vec<u64> = written.intersection(&read).copied().collect();
        states.extend(written.difference(&read).next());
        states
    }
}
