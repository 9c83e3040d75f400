//! Checking one key's sub-history: the search from the initial state, and,
//! when that takes long, searches of short windows of the history from
//! every state that matters, which find most violations far faster.

use alloc::vec::Vec;

use super::search::{self, Outcome, SearchOp, Stuck};
use super::{Model, Operation};

/// The budget of the first search from the initial state: linearizable
/// histories of a few hundred operations rarely need more.
const FIRST_STEPS: u64 = 200_000;

/// Operations per window (in invocation order) and the stride between
/// windows' starts.
const WINDOW_OPS: usize = 24;
const WINDOW_STRIDE: usize = 12;

/// The budget of one window search from one starting state.
const WINDOW_STEPS: u64 = 20_000;

/// What checking a key found.
pub(super) enum KeyOutcome<S> {
    /// Linearizable.
    Linearizable,
    /// The budget ran out.
    Unknown { steps: u64 },
    /// Not linearizable; `from` is `None` if the search from the initial
    /// state proved it, or the window's start if a window did.
    Violation { stuck: Stuck<S>, from: Option<u64> },
}

/// Checks the operations `indices` of `history` (those of one key) within
/// about `max_steps` steps.
pub(super) fn check_key<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    indices: &[usize],
    max_steps: u64,
) -> KeyOutcome<M::State> {
    let mine: Vec<&Operation<M::Input, M::Output>> = indices.iter().map(|&i| &history[i]).collect();
    if model.proves_linearizable(&mine) {
        return KeyOutcome::Linearizable;
    }
    let ops = search_ops(model, history, indices);
    let (outcome, mut spent) = search::search(model, &ops, model.init(), FIRST_STEPS.min(max_steps));
    match outcome {
        Outcome::Linearizable => return KeyOutcome::Linearizable,
        Outcome::Stuck(stuck) => return KeyOutcome::Violation { stuck, from: None },
        Outcome::Unknown => {}
    }
    // A hard history: look for a violation inside a window, cheap if there
    // is one, before the long search.
    if let Some((stuck, from)) = refute_locally(model, &ops, max_steps.saturating_sub(spent) / 2, &mut spent) {
        return KeyOutcome::Violation { stuck, from: Some(from) };
    }
    let (outcome, steps) = search::search(model, &ops, model.init(), max_steps.saturating_sub(spent));
    match outcome {
        Outcome::Linearizable => KeyOutcome::Linearizable,
        Outcome::Stuck(stuck) => KeyOutcome::Violation { stuck, from: None },
        Outcome::Unknown => KeyOutcome::Unknown { steps: spent + steps },
    }
}

/// The operations `indices` of `history` as the search sees them. Pending
/// reads can neither change the state nor be checked: they are dropped.
fn search_ops<'a, M: Model>(
    model: &M,
    history: &'a [Operation<M::Input, M::Output>],
    indices: &[usize],
) -> Vec<SearchOp<'a, M::Input, M::Output>> {
    indices
        .iter()
        .map(|&index| {
            let op = &history[index];
            SearchOp {
                index,
                input: &op.input,
                expected: op.response.as_ref().map(|r| &r.output),
                required: op.response.is_some(),
                call: op.call,
                ret: op.response.as_ref().map(|r| r.at),
            }
        })
        .filter(|op| op.required || !model.is_read_only(op.input))
        .collect()
}

/// For tests: whether the windows alone refute `history` (all of one key),
/// and if so the operation where and the window's start.
#[cfg(test)]
pub(super) fn refute_by_windows<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
) -> Option<(usize, u64)> {
    let indices: Vec<usize> = (0..history.len()).collect();
    let ops = search_ops(model, history, &indices);
    refute_locally(model, &ops, u64::MAX / 2, &mut 0).map(|(stuck, from)| (stuck.stuck, from))
}

/// Looks for a window of the history that no starting state linearizes,
/// spending at most `budget` steps (added to `spent`).
///
/// A window `[from, to]` is sound evidence: if the history is linearizable,
/// take a linearization; the operations it places in `[from, to]` form an
/// order of the window's operations from the state reached at `from`.
/// Those invoked at or after `from` and returned by `to` are in it; those
/// invoked before `from` (they may have taken effect before) or not
/// returned by `to` (later, or never) may be. So if no state of
/// [`Model::window_states`] can start such an order, the history is not
/// linearizable.
///
/// The windows tried are, first, each completed operation alone (it
/// catches an answer that no state could give), then each one's interval
/// (with the operations overlapping it), then runs of
/// [`WINDOW_OPS`] operations (which catch, say, a read of a value
/// overwritten shortly before).
fn refute_locally<M: Model>(
    model: &M,
    ops: &[SearchOp<'_, M::Input, M::Output>],
    budget: u64,
    spent: &mut u64,
) -> Option<(Stuck<M::State>, u64)> {
    let all: Vec<&M::Input> = ops.iter().map(|op| op.input).collect();
    let mut by_call: Vec<usize> = (0..ops.len()).collect();
    by_call.sort_by_key(|&i| (ops[i].call, i));

    // The smallest windows: one operation alone, at its linearization
    // point, where the state is one that some of the operations lead to.
    let mut used = 0;
    for &i in &by_call {
        let op = &ops[i];
        let Some(expected) = op.expected else { continue };
        let starts = model.window_states(&all, &[(op.input, Some(expected))]);
        used += starts.len() as u64;
        if !starts.is_empty()
            && starts.iter().all(|s| !model.accepts(s, op.input, &model.step(s, op.input).1, expected))
        {
            *spent += used;
            let state = starts.into_iter().next().expect("not empty");
            return Some((Stuck { prefix: Vec::new(), state, stuck: op.index }, op.call));
        }
        if used >= budget {
            *spent += used;
            return None;
        }
    }

    let mut windows: Vec<(u64, u64)> = by_call.iter().filter_map(|&i| Some((ops[i].call, ops[i].ret?))).collect();
    // Each completed operation with the one that returned last before it
    // began (it must precede it).
    let mut by_ret: Vec<(u64, u64)> = ops.iter().filter_map(|op| Some((op.ret?, op.call))).collect();
    by_ret.sort_unstable();
    for &i in &by_call {
        let (call, Some(ret)) = (ops[i].call, ops[i].ret) else { continue };
        let before = by_ret.partition_point(|&(r, _)| r < call);
        if before > 0 {
            windows.push((by_ret[before - 1].1, ret));
        }
    }
    let mut begin = 0;
    while begin < by_call.len() {
        let end = (begin + WINDOW_OPS).min(by_call.len());
        let from = ops[by_call[begin]].call;
        let last_call = ops[by_call[end - 1]].call;
        let to = by_call[begin..end].iter().filter_map(|&i| ops[i].ret).fold(last_call, u64::max);
        windows.push((from, to));
        if end == by_call.len() {
            break;
        }
        begin += WINDOW_STRIDE;
    }

    let mut found = None;
    for (from, to) in windows {
        if used >= budget {
            break;
        }
        if let Some(stuck) = refute_window(model, ops, &all, from, to, budget - used, &mut used) {
            found = Some((stuck, from));
            break;
        }
    }
    *spent += used;
    found
}

/// Searches the window `[from, to]` from each starting state; `Some` with
/// the deepest point reached if none linearizes it.
fn refute_window<M: Model>(
    model: &M,
    ops: &[SearchOp<'_, M::Input, M::Output>],
    all: &[&M::Input],
    from: u64,
    to: u64,
    budget: u64,
    used: &mut u64,
) -> Option<Stuck<M::State>> {
    let window: Vec<SearchOp<'_, M::Input, M::Output>> = ops
        .iter()
        .filter(|op| op.call <= to && op.ret.is_none_or(|r| r >= from))
        .map(|op| {
            let returned = op.ret.is_some_and(|r| r <= to);
            SearchOp {
                index: op.index,
                input: op.input,
                expected: if returned { op.expected } else { None },
                required: returned && op.call >= from,
                call: op.call,
                ret: if returned { op.ret } else { None },
            }
        })
        // One that may be left out and changes nothing (a read) can always
        // be left out.
        .filter(|op| op.required || !model.is_read_only(op.input))
        .collect();
    let inputs: Vec<(&M::Input, Option<&M::Output>)> = window.iter().map(|op| (op.input, op.expected)).collect();
    let starts = model.window_states(all, &inputs);
    if starts.is_empty() {
        return None;
    }
    let mut deepest: Option<Stuck<M::State>> = None;
    let spent_before = *used;
    for start in starts {
        let left = budget - (*used - spent_before);
        if left == 0 {
            return None;
        }
        let (outcome, steps) = search::search(model, &window, start, WINDOW_STEPS.min(left));
        *used += steps;
        match outcome {
            Outcome::Stuck(stuck) => {
                if deepest.as_ref().is_none_or(|d| stuck.prefix.len() > d.prefix.len()) {
                    deepest = Some(stuck);
                }
            }
            Outcome::Linearizable | Outcome::Unknown => return None,
        }
    }
    deepest
}
