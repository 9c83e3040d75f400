//! A linearizability checker for histories of concurrent operations.
//!
//! A history records, for every operation a client issued against a shared
//! object, when it was invoked, when it returned (if it did), what it was
//! asked to do and what it answered. The history is *linearizable* if every
//! operation can be given a single point in time between its invocation and
//! its response at which it took effect, such that executing the operations
//! one by one in the order of those points on a sequential [`Model`] of the
//! object yields exactly the recorded answers. The protocols of this crate
//! promise linearizable registers and key-value stores; the simulator's test
//! runs record histories and hand them to [`check`].
//!
//! # Recording a history
//!
//! Time is a `u64` of any clock that every client shares (the simulator's
//! virtual time, a logical counter). Intervals are *closed*: an operation
//! that returned at `t` and one invoked at the same `t` count as concurrent,
//! so a clock too coarse to order them never produces a false alarm.
//! An operation that never returned (its client crashed, or the run ended
//! first, or it failed with an error after which its effect is unknown) is
//! *pending*: it may have taken effect at any point after its invocation, or
//! not at all, and its answer is not checked.
//!
//! ```
//! use swarm_lincheck::{check, History, Register, RegisterOp, RegisterRet};
//!
//! let mut h = History::new();
//! let w = h.invoke(0, 1, RegisterOp::Write(7));
//! let r = h.invoke(1, 2, RegisterOp::Read);
//! h.respond(w, 3, RegisterRet::Ack);
//! h.respond(r, 4, RegisterRet::Value(7));
//! let _crashed = h.invoke(2, 5, RegisterOp::Write(9)); // never returns
//! assert!(check(&Register::default(), h.operations()).is_linearizable());
//! ```
//!
//! # Algorithm
//!
//! The search is the one of Wing & Gong as improved by Lowe ("Testing for
//! linearizability", 2017) and used by Porcupine: the invocation and response
//! events are put in time order in a doubly linked list; the search walks it,
//! tentatively linearizing any operation whose invocation comes before the
//! first response still in the list (the *minimal* operations: nothing
//! returned before they were called, so real-time order allows them next),
//! and backtracks when no minimal operation leads anywhere. Every
//! configuration reached, the set of linearized operations (a bitset)
//! together with the model's state, is memoized so that no configuration is
//! explored twice. Two refinements cut the branching: a minimal read-only
//! operation whose answer fits the current state is linearized at once and
//! alone (if any order works, one with it first does), and the operation
//! whose response comes first is tried first.
//!
//! Before searching, the history is split by [`Model::key`]: operations on
//! different keys act on independent objects, and a history is linearizable
//! if and only if each key's sub-history is (linearizability is *local*,
//! Herlihy & Wing 1990). Each key is then searched alone with a small state,
//! which keeps both the search and the memo small.
//!
//! The problem is NP-complete, and proving a violation means ruling out
//! every order of everything before it, which with many concurrent writers
//! is far more work than finding the order of a linearizable history. So a
//! key whose search does not end quickly is also checked in short *windows*,
//! each searched alone from every state the object could be in
//! ([`Model::window_states`]): a window that no state can start is a
//! violation, found without searching the whole history. [`Checker::max_steps`]
//! bounds the work, and the answer may be [`CheckResult::Unknown`]. A
//! model may also prove a key's history linearizable without a search
//! ([`Model::proves_linearizable`]): a [`Register`] whose written values are
//! distinct is decided by Gibbons and Korach's zones in `O(n log n)`, which
//! settles histories of dozens of concurrent writers that no search would.
//!
//! Crates that exist for this (stateright's `LinearizabilityTester`, ports of
//! Porcupine) need `std` and bring large dependency trees, or lack pending
//! operations, budgets or per-key decomposition; this crate needs only
//! `alloc` and `hashbrown`, and nothing else of the toolkit: the protocol
//! core's campaigns, the backends' suites and any user's own tests use it.
//!
//! # Performance
//!
//! Measured on register histories made by executing random reads and
//! writes (release build, one core; `timing_of_large_histories` in the
//! tests prints them). Linearizable histories of 300 operations: about
//! 0.2 ms with 8 concurrent clients (under 1 ms at worst), about 10 to 30
//! ms with 16 clients all working one register at once (a quarter of a
//! second at worst). Violations cost more, since every order before them
//! must be ruled out: with 8 clients, a few milliseconds; with 16 clients
//! on one register, a read of a value never written is found in about 0.1
//! s, but a stale read often needs more than the default budget, and the
//! answer is then [`CheckResult::Unknown`] after about half a second (a
//! budget of 20 million steps, a second or two and about a gigabyte of
//! memo, found every one in those tests). Keys of a key-value store rarely
//! see such contention.

#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

mod counter;
mod history;
mod key;
mod kv;
mod register;
mod report;
mod search;
#[cfg(test)]
mod tests;
mod zones;

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt::Debug;
use core::hash::Hash;

pub use counter::{Counter, CounterOp, CounterRet};
pub use history::{History, OpId, Operation, Response};
pub use kv::{KeyState, Kv, KvOp, KvRet};
pub use register::{Register, RegisterOp, RegisterRet};
pub use report::{CheckResult, Role, Violation, WindowOp};

/// The sequential specification of a shared object: what each operation
/// does to the state and what it answers when operations run one at a time.
///
/// A model describes the object that one [`key`](Model::key) names; the
/// checker runs each key's operations on a fresh [`init`](Model::init) state.
pub trait Model {
    /// The object's state. It is hashed and compared to memoize the search,
    /// so the smaller the better.
    type State: Clone + Eq + Hash + Debug;
    /// What a client asks for (an operation and its arguments).
    type Input: Clone + Debug;
    /// What the object answers; compared with the recorded answer.
    type Output: Clone + Eq + Debug;
    /// The name of an independent object inside the history, e.g. the key of
    /// a key-value store; `()` when the whole history is one object.
    type Key: Clone + Ord + Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// Runs `input` on `state`: the state after it and what it answers.
    fn step(&self, state: &Self::State, input: &Self::Input) -> (Self::State, Self::Output);

    /// Whether `recorded` is a correct answer of `input` in `state`, where
    /// the sequential specification answers `model` ([`Model::step`]). For
    /// objects that may answer in more than one way (the state after is
    /// `step`'s either way); the default accepts `model` only.
    fn accepts(&self, state: &Self::State, input: &Self::Input, model: &Self::Output, recorded: &Self::Output) -> bool {
        let _ = (state, input);
        model == recorded
    }

    /// Which independent object `input` acts on. Operations on different keys
    /// must never affect each other's answers; the checker then checks each
    /// key's sub-history alone (each from [`init`](Model::init)), which is
    /// equivalent and far cheaper.
    fn key(&self, input: &Self::Input) -> Self::Key;

    /// Whether `input` never changes the state (a read). Pending read-only
    /// operations are dropped before searching, since neither taking effect
    /// nor not can matter. Answering `false` is always correct, only slower.
    fn is_read_only(&self, input: &Self::Input) -> bool {
        let _ = input;
        false
    }

    /// States to start a window of the history from, when checking it
    /// alone. `all` is every operation of the key, `window` those of the
    /// window (`(input, answer if checked)`). Every state that some of the
    /// operations `all`, in some order, lead to from [`init`](Model::init)
    /// must behave, for the window's operations and everything after, like
    /// one of the returned states. One state per class of states that the
    /// window tells apart is enough: for a register, each value written
    /// somewhere that the window reads, and one written value it does not.
    ///
    /// Windows let the checker find a violation in a hard history without
    /// searching all of it (see [`Checker::check`]); the default, no
    /// states, turns that off.
    fn window_states(
        &self,
        all: &[&Self::Input],
        window: &[(&Self::Input, Option<&Self::Output>)],
    ) -> Vec<Self::State> {
        let _ = all;
        let _ = window;
        Vec::new()
    }

    /// Whether one key's operations are proven linearizable without a
    /// search, for objects that have a proof procedure for some histories
    /// ([`Register`]: distinct written values). Answering `true` for a
    /// history that is not linearizable would hide a violation; `false`
    /// (the default) only leaves the history to the search.
    fn proves_linearizable(&self, ops: &[&Operation<Self::Input, Self::Output>]) -> bool {
        let _ = ops;
        false
    }
}

/// A checker with a search budget. [`check`] uses the default one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checker {
    max_steps: u64,
}

impl Checker {
    /// The default budget per key: two million search steps, about a
    /// second and at most about 200 MiB of memo in the worst case;
    /// linearizable histories usually need few more steps than operations.
    pub const DEFAULT_MAX_STEPS: u64 = 2_000_000;

    /// A checker with the default budget.
    pub const fn new() -> Self {
        Checker { max_steps: Self::DEFAULT_MAX_STEPS }
    }

    /// The same checker with a budget of `max_steps` search steps per key
    /// (one step is one tentative application of an operation to the model).
    /// A key whose search runs out of steps is answered
    /// [`CheckResult::Unknown`].
    pub const fn max_steps(self, max_steps: u64) -> Self {
        Checker { max_steps }
    }

    /// Checks whether `history` is linearizable with respect to `model`.
    ///
    /// Each key is first searched from the initial state with a small part
    /// of the budget, which settles nearly every linearizable history. If
    /// that does not settle it, short windows of the key's history are
    /// searched alone from every [`Model::window_states`] state: a window
    /// that none of them can linearize proves a violation (found this way,
    /// it is reported with [`Violation::from`] set), far faster than a full
    /// search, which must rule out every order of everything before the
    /// violation. The rest of the budget goes to the full search.
    ///
    /// The keys are searched one by one in their order; the first key found
    /// not linearizable is reported, even if an earlier key ran out of
    /// budget; otherwise the first key that ran out of budget is reported as
    /// [`CheckResult::Unknown`].
    ///
    /// # Panics
    ///
    /// If an operation returned before it was invoked (a recording bug).
    pub fn check<M: Model>(&self, model: &M, history: &[Operation<M::Input, M::Output>]) -> CheckResult<M> {
        for (i, op) in history.iter().enumerate() {
            if let Some(resp) = &op.response {
                assert!(
                    resp.at >= op.call,
                    "lincheck: operation {i} returned at {} before its invocation at {}",
                    resp.at,
                    op.call
                );
            }
        }
        let mut by_key: BTreeMap<M::Key, Vec<usize>> = BTreeMap::new();
        for (i, op) in history.iter().enumerate() {
            by_key.entry(model.key(&op.input)).or_default().push(i);
        }
        let mut unknown = None;
        for (key, indices) in by_key {
            match key::check_key(model, history, &indices, self.max_steps) {
                key::KeyOutcome::Linearizable => {}
                key::KeyOutcome::Unknown { steps } => {
                    if unknown.is_none() {
                        unknown = Some(CheckResult::Unknown { key, steps });
                    }
                }
                key::KeyOutcome::Violation { stuck, from } => {
                    return CheckResult::NotLinearizable(report::explain(model, history, key, stuck, from));
                }
            }
        }
        unknown.unwrap_or(CheckResult::Linearizable)
    }
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

/// Checks `history` against `model` with the default budget
/// ([`Checker::new`]); see [`Checker::check`].
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>]) -> CheckResult<M> {
    Checker::new().check(model, history)
}
