//! The checker's answer, and the explanation of a violation.

use alloc::vec::Vec;
use core::fmt;

use super::search::Stuck;
use super::{Model, Operation};

/// How many operations of the longest linearization prefix an explanation
/// shows before the point where the search got stuck.
const CONTEXT: usize = 3;

/// The answer of the checker.
pub enum CheckResult<M: Model> {
    /// Some order of the operations, each at a point inside its interval,
    /// explains every answer.
    Linearizable,
    /// No order does; where and why the search failed.
    NotLinearizable(Violation<M>),
    /// The search of `key` ran out of its budget of `steps` steps before
    /// deciding (and no other key was found not linearizable).
    Unknown {
        /// The key whose search ran out.
        key: M::Key,
        /// The steps it took.
        steps: u64,
    },
}

impl<M: Model> CheckResult<M> {
    /// Whether the history is linearizable.
    pub fn is_linearizable(&self) -> bool {
        matches!(self, CheckResult::Linearizable)
    }

    /// Whether the history is certainly not linearizable.
    pub fn is_violation(&self) -> bool {
        matches!(self, CheckResult::NotLinearizable(_))
    }

    /// Whether the budget ran out before an answer.
    pub fn is_unknown(&self) -> bool {
        matches!(self, CheckResult::Unknown { .. })
    }

    /// The violation, if the history is not linearizable.
    pub fn violation(&self) -> Option<&Violation<M>> {
        match self {
            CheckResult::NotLinearizable(v) => Some(v),
            _ => None,
        }
    }
}

/// Why a key's sub-history is not linearizable: the deepest point the search
/// reached, and the operations around it.
///
/// Operations are named by their index in the checked history slice.
/// Its [`Display`](fmt::Display) renders all this for a test failure message.
pub struct Violation<M: Model> {
    /// The key whose sub-history is not linearizable.
    pub key: M::Key,
    /// `None` if the search from the initial state failed, so that the
    /// prefix below is one of the whole history. `Some(t)` if the checker
    /// found a short window of the history, starting at time `t`, that no
    /// state can start: then the prefix and state are of the window, from
    /// the starting state that got furthest, and the operations invoked
    /// before `t` count as may-or-may-not in it.
    pub from: Option<u64>,
    /// The longest prefix of a linearization the search found (one of them,
    /// if several are as long), in order.
    pub prefix: Vec<usize>,
    /// The model state after `prefix`.
    pub state: M::State,
    /// The completed operation that no remaining operation order could fit
    /// in after `prefix`: it had to be next or earlier, and neither it nor
    /// any operation concurrent with it gives an answer that lets the
    /// search go on.
    pub stuck: usize,
    /// The operations around the failure, in order of invocation: the last
    /// few of `prefix`, then every operation of the key not in `prefix`
    /// that was invoked before `stuck` returned (the candidates for the next
    /// linearization point, `stuck` among them; for a window, those invoked
    /// in it).
    pub window: Vec<WindowOp<M::Input, M::Output>>,
}

/// An operation in a [`Violation`]'s window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowOp<I, O> {
    /// Its index in the history.
    pub index: usize,
    /// The operation itself.
    pub op: Operation<I, O>,
    /// How it stands at the point where the search got stuck.
    pub role: Role<O>,
}

/// How an operation of a [`Violation`]'s window stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role<O> {
    /// Part of the longest prefix, at this position (from 0).
    Linearized {
        /// Its position in the prefix.
        position: usize,
    },
    /// Not in the prefix but could be next in real-time order; the model,
    /// in the state after the prefix, would answer `model_output`.
    Candidate {
        /// What the model answers if it goes next.
        model_output: O,
    },
}

/// Builds the violation report from where the search got stuck.
pub(super) fn explain<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    key: M::Key,
    stuck: Stuck<M::State>,
    from: Option<u64>,
) -> Violation<M> {
    let Stuck { prefix, state, stuck } = stuck;
    let deadline = history[stuck].response.as_ref().map_or(u64::MAX, |r| r.at);
    let mut window = Vec::new();
    let first_shown = prefix.len().saturating_sub(CONTEXT);
    for (position, &index) in prefix.iter().enumerate().skip(first_shown) {
        window.push(WindowOp { index, op: history[index].clone(), role: Role::Linearized { position } });
    }
    for (index, op) in history.iter().enumerate() {
        // For a window, only the operations invoked inside it.
        let in_window = op.call <= deadline && from.is_none_or(|t| op.call >= t);
        if in_window && !prefix.contains(&index) && model.key(&op.input) == key {
            let (_, model_output) = model.step(&state, &op.input);
            window.push(WindowOp { index, op: op.clone(), role: Role::Candidate { model_output } });
        }
    }
    // The prefix first, then candidates by invocation time.
    window[prefix.len() - first_shown..].sort_by_key(|w| (w.op.call, w.index));
    Violation { key, from, prefix, state, stuck, window }
}

impl<M: Model> fmt::Display for Violation<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {:?} is not linearizable: ", self.key)?;
        if let Some(t) = self.from {
            write!(f, "the operations from time {t} on fit no starting state; the best start linearizes ")?;
        } else {
            write!(f, "at best ")?;
        }
        writeln!(
            f,
            "{} operations, leaving the state {:?}, and then no operation fits before operation #{} returns:",
            self.prefix.len(),
            self.state,
            self.stuck
        )?;
        for w in &self.window {
            let op = &w.op;
            write!(f, "  #{} client {} [{}, ", w.index, op.client, op.call)?;
            match &op.response {
                Some(r) => write!(f, "{}] {:?} -> {:?}", r.at, op.input, r.output)?,
                None => write!(f, "pending) {:?}", op.input)?,
            }
            match &w.role {
                Role::Linearized { position } => writeln!(f, "   (linearized {})", position + 1)?,
                Role::Candidate { model_output } if w.index == self.stuck => {
                    writeln!(f, "   <- stuck; the model answers {model_output:?} here")?
                }
                Role::Candidate { model_output } => writeln!(f, "   (model answers {model_output:?} here)")?,
            }
        }
        Ok(())
    }
}

impl<M: Model> fmt::Debug for Violation<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Violation")
            .field("key", &self.key)
            .field("from", &self.from)
            .field("prefix", &self.prefix)
            .field("state", &self.state)
            .field("stuck", &self.stuck)
            .field("window", &self.window)
            .finish()
    }
}

impl<M: Model> Clone for Violation<M> {
    fn clone(&self) -> Self {
        Violation {
            key: self.key.clone(),
            from: self.from,
            prefix: self.prefix.clone(),
            state: self.state.clone(),
            stuck: self.stuck,
            window: self.window.clone(),
        }
    }
}

impl<M: Model> fmt::Display for CheckResult<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckResult::Linearizable => f.write_str("linearizable"),
            CheckResult::NotLinearizable(v) => write!(f, "NOT linearizable: {v}"),
            CheckResult::Unknown { key, steps } => {
                write!(f, "unknown: the search of key {key:?} ran out of its budget after {steps} steps")
            }
        }
    }
}

impl<M: Model> fmt::Debug for CheckResult<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckResult::Linearizable => f.write_str("Linearizable"),
            CheckResult::NotLinearizable(v) => f.debug_tuple("NotLinearizable").field(v).finish(),
            CheckResult::Unknown { key, steps } => {
                f.debug_struct("Unknown").field("key", key).field("steps", steps).finish()
            }
        }
    }
}
