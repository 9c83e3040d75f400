//! Histories: the operations clients issued, with their intervals and answers.

use alloc::vec::Vec;

/// One operation of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Which client issued it; only used in explanations (a client's
    /// operations need not be sequential for the checker, and a client that
    /// restarts after a crash may keep its id or take a new one).
    pub client: u32,
    /// When it was invoked.
    pub call: u64,
    /// What was asked.
    pub input: I,
    /// When it returned and what it answered; `None` while pending (never
    /// returned: it may or may not have taken effect, at any time after
    /// `call`).
    pub response: Option<Response<O>>,
}

/// The end of a completed operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response<O> {
    /// When it returned (not before the invocation).
    pub at: u64,
    /// What it answered.
    pub output: O,
}

impl<I, O> Operation<I, O> {
    /// An operation invoked at `call` that returned `output` at `ret`.
    pub fn completed(client: u32, call: u64, ret: u64, input: I, output: O) -> Self {
        Operation { client, call, input, response: Some(Response { at: ret, output }) }
    }

    /// An operation invoked at `call` that never returned.
    pub fn pending(client: u32, call: u64, input: I) -> Self {
        Operation { client, call, input, response: None }
    }

    /// Whether it never returned.
    pub fn is_pending(&self) -> bool {
        self.response.is_none()
    }
}

/// A handle on an operation recorded in a [`History`], to respond to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub usize);

/// A history being recorded: invoke operations as clients start them and
/// respond as they return; those never responded to stay pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History<I, O> {
    ops: Vec<Operation<I, O>>,
}

impl<I, O> History<I, O> {
    /// An empty history.
    pub const fn new() -> Self {
        History { ops: Vec::new() }
    }

    /// Records that `client` invoked `input` at time `at`.
    pub fn invoke(&mut self, client: u32, at: u64, input: I) -> OpId {
        self.ops.push(Operation::pending(client, at, input));
        OpId(self.ops.len() - 1)
    }

    /// Records that the operation `id` returned `output` at time `at`.
    ///
    /// # Panics
    ///
    /// If `id` is not of this history, already returned, or `at` is before
    /// its invocation.
    pub fn respond(&mut self, id: OpId, at: u64, output: O) {
        let op = &mut self.ops[id.0];
        assert!(op.response.is_none(), "lincheck: operation {} responded twice", id.0);
        assert!(at >= op.call, "lincheck: operation {} returned at {at} before its invocation at {}", id.0, op.call);
        op.response = Some(Response { at, output });
    }

    /// Appends a whole operation.
    pub fn push(&mut self, op: Operation<I, O>) -> OpId {
        self.ops.push(op);
        OpId(self.ops.len() - 1)
    }

    /// The operations in the order they were recorded; [`OpId`]`(i)` is
    /// the `i`-th, and [`Violation`](super::Violation)s name operations by
    /// this index.
    pub fn operations(&self) -> &[Operation<I, O>] {
        &self.ops
    }

    /// The number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no operation was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The recorded operations, by value.
    pub fn into_operations(self) -> Vec<Operation<I, O>> {
        self.ops
    }
}

impl<I, O> Default for History<I, O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I, O> From<Vec<Operation<I, O>>> for History<I, O> {
    fn from(ops: Vec<Operation<I, O>>) -> Self {
        History { ops }
    }
}
