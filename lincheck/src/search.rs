//! The search for a linearization of one key's sub-history (Wing & Gong,
//! with Lowe's memoization; see the [module docs](super)).

use alloc::vec;
use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash, Hasher};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::Model;

/// What a search found (returned with the steps it took).
pub(super) enum Outcome<S> {
    /// A linearization exists.
    Linearizable,
    /// The budget ran out.
    Unknown,
    /// None exists; where the search got furthest.
    Stuck(Stuck<S>),
}

/// An operation as the search sees it. The search decides whether some
/// order of the operations, starting from a given state, gives every
/// `required` operation its place; the others may be left out.
pub(super) struct SearchOp<'a, I, O> {
    /// Its index in the whole history (for reports).
    pub index: usize,
    /// What it asks.
    pub input: &'a I,
    /// What it answered, if that is to be checked.
    pub expected: Option<&'a O>,
    /// Whether it must be linearized (a completed operation), or may be
    /// left out (a pending one, or one that may have taken effect before
    /// the part of the history searched).
    pub required: bool,
    /// Its invocation.
    pub call: u64,
    /// Its response, `None` if it has none (pending).
    pub ret: Option<u64>,
}

/// The deepest point the search reached in a non-linearizable history.
pub(super) struct Stuck<S> {
    /// The longest prefix of a linearization found, as history indices.
    pub prefix: Vec<usize>,
    /// The model state after `prefix`.
    pub state: S,
    /// The completed operation (history index) that no order could fit in
    /// after `prefix`: the search met its response without having
    /// linearized it.
    pub stuck: usize,
}

/// The end of the event list.
const NIL: usize = usize::MAX;

/// The time-ordered invocation and response events of the sub-history, as a
/// doubly linked list from which linearized operations are unlinked and
/// relinked on backtracking ("dancing links"). Event `e` of operation `op`
/// is `call_ev[op]` or `ret_ev[op]`; node `head` is a sentinel before all.
struct Events {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For each event: its operation (local index), and whether a call.
    op: Vec<usize>,
    is_call: Vec<bool>,
    call_ev: Vec<usize>,
    ret_ev: Vec<usize>,
    head: usize,
}

impl Events {
    /// Orders the events: by time, a pending operation's response after
    /// every other event, and at equal times invocations before responses
    /// (closed intervals: touching operations are concurrent).
    fn new(calls: &[u64], rets: &[Option<u64>]) -> Self {
        let n = calls.len();
        // (pending response, time, response, operation)
        let mut order: Vec<(bool, u64, bool, usize)> = Vec::with_capacity(2 * n);
        for op in 0..n {
            order.push((false, calls[op], false, op));
            match rets[op] {
                Some(t) => order.push((false, t, true, op)),
                None => order.push((true, 0, true, op)),
            }
        }
        order.sort_unstable();
        let head = 2 * n;
        let mut ev = Events {
            next: vec![NIL; 2 * n + 1],
            prev: vec![NIL; 2 * n + 1],
            op: vec![0; 2 * n],
            is_call: vec![false; 2 * n],
            call_ev: vec![0; n],
            ret_ev: vec![0; n],
            head,
        };
        let mut last = head;
        for (e, &(_, _, is_ret, op)) in order.iter().enumerate() {
            ev.op[e] = op;
            ev.is_call[e] = !is_ret;
            if is_ret {
                ev.ret_ev[op] = e;
            } else {
                ev.call_ev[op] = e;
            }
            ev.next[last] = e;
            ev.prev[e] = last;
            last = e;
        }
        ev
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        if n != NIL {
            self.prev[n] = e;
        }
    }

    /// Takes a linearized operation out of the list.
    fn lift(&mut self, op: usize) {
        self.unlink(self.call_ev[op]);
        self.unlink(self.ret_ev[op]);
    }

    /// Puts it back; must undo the latest [`lift`](Self::lift).
    fn unlift(&mut self, op: usize) {
        self.relink(self.ret_ev[op]);
        self.relink(self.call_ev[op]);
    }
}

/// The configurations already explored: (linearized set, model state).
/// A configuration once explored without success fails again, whatever
/// order led to it, so the search never enters one twice.
struct Memo<S> {
    table: HashTable<(Vec<u64>, S)>,
    hasher: DefaultHashBuilder,
}

impl<S: Hash + Eq + Clone> Memo<S> {
    fn new() -> Self {
        Memo { table: HashTable::new(), hasher: DefaultHashBuilder::default() }
    }

    fn hash(hasher: &DefaultHashBuilder, bits: &[u64], state: &S) -> u64 {
        let mut h = hasher.build_hasher();
        bits.hash(&mut h);
        state.hash(&mut h);
        h.finish()
    }

    /// Records the configuration; `false` if it was already there.
    fn insert(&mut self, bits: &[u64], state: &S) -> bool {
        let hash = Self::hash(&self.hasher, bits, state);
        if self.table.find(hash, |(b, s)| b == bits && s == state).is_some() {
            return false;
        }
        let hasher = &self.hasher;
        self.table.insert_unique(hash, (bits.to_vec(), state.clone()), |(b, s)| Self::hash(hasher, b, s));
        true
    }
}

/// One level of the search: a configuration, the move that led to it from
/// the level below, and the choices for the next move.
struct Level<S> {
    /// The operation linearized to reach this level, the state before it,
    /// and how many optional operations the move left out (the top of
    /// `dropped`); `None` at the root.
    via: Option<(usize, S, usize)>,
    /// The optional operations whose response precedes the first
    /// required response: a move to a candidate invoked after such a
    /// response leaves it out for good.
    passed: Vec<usize>,
    /// This level's candidates are `arena[start..]`, each with how many of
    /// `passed` choosing it leaves out; `next` is the next to try.
    start: usize,
    next: usize,
    /// The required operation whose response comes first among those not
    /// linearized: it, or some candidate, must go next.
    urgent: usize,
}

/// Searches, within `max_steps` steps, an order of `ops` (all of one key)
/// that starts from `init`, respects real time (an operation that returned
/// before another's invocation comes first), gives every operation its
/// expected answer, and includes every required operation.
pub(super) fn search<M: Model>(
    model: &M,
    ops: &[SearchOp<'_, M::Input, M::Output>],
    init: M::State,
    max_steps: u64,
) -> (Outcome<M::State>, u64) {
    let n = ops.len();
    let calls: Vec<u64> = ops.iter().map(|op| op.call).collect();
    let rets: Vec<Option<u64>> = ops.iter().map(|op| op.ret).collect();
    let read_only: Vec<bool> = ops.iter().map(|op| model.is_read_only(op.input)).collect();
    let fits = |op: usize, state: &M::State, output: &M::Output| {
        ops[op].expected.is_none_or(|e| model.accepts(state, ops[op].input, output, e))
    };
    let mut ev = Events::new(&calls, &rets);

    // The operations linearized or left out, which the memo keys on.
    let mut done = vec![0u64; n.div_ceil(64)];
    let flip = |done: &mut [u64], op: usize| done[op / 64] ^= 1 << (op % 64);
    let mut memo = Memo::new();
    let mut state = init;
    let mut required_left = ops.iter().filter(|op| op.required).count();
    let mut steps = 0u64;
    let mut deepest: Option<Stuck<M::State>> = None;
    // Candidates of all levels, each with how many passed optionals it drops.
    let mut arena: Vec<(usize, usize)> = Vec::new();
    // The optional operations left out by the moves on the stack.
    let mut dropped: Vec<usize> = Vec::new();
    let mut levels: Vec<Level<M::State>> = Vec::new();
    // `Some(how)` when the search just entered a configuration, `how` being
    // the move that led there.
    let mut entered: Option<Option<(usize, M::State, usize)>> = Some(None);

    loop {
        if required_left == 0 {
            return (Outcome::Linearizable, steps);
        }
        if let Some(via) = entered.take() {
            // A new configuration: list its candidates, the operations
            // invoked before the first required response still in the list
            // (real-time order allows each of them next). A read that fits,
            // with nothing to drop, is taken at once and alone: if any order
            // works, one with the read first does (it changes nothing, and
            // nothing left had to precede it).
            let start = arena.len();
            let mut passed = Vec::new();
            let mut forced = None;
            let mut e = ev.next[ev.head];
            // A required operation is left, and its response is in the list
            // before every missing (pending) response, so this ends there.
            loop {
                let op = ev.op[e];
                if !ev.is_call[e] {
                    if ops[op].required {
                        break;
                    }
                    passed.push(op);
                } else if read_only[op] {
                    if forced.is_none() && passed.is_empty() && fits(op, &state, &model.step(&state, ops[op].input).1) {
                        forced = Some(op);
                    } else if !passed.is_empty() {
                        arena.push((op, passed.len()));
                    }
                } else {
                    arena.push((op, passed.len()));
                }
                e = ev.next[e];
            }
            let urgent = ev.op[e];
            if let Some(op) = forced {
                arena.truncate(start);
                arena.push((op, 0));
            } else if let Some(p) = arena[start..].iter().position(|&(op, _)| op == urgent) {
                // The urgent operation first: no need to guess what else
                // goes before it, if nothing does.
                arena[start..=start + p].rotate_right(1);
            }
            levels.push(Level { via, passed, start, next: start, urgent });
        }

        let top = levels.last_mut().expect("the root level stays until the end");
        if top.next < arena.len() {
            let (op, drops) = arena[top.next];
            top.next += 1;
            if steps >= max_steps {
                return (Outcome::Unknown, steps);
            }
            steps += 1;
            let (after, output) = model.step(&state, ops[op].input);
            if !fits(op, &state, &output) {
                continue;
            }
            flip(&mut done, op);
            for &d in &top.passed[..drops] {
                flip(&mut done, d);
            }
            if !memo.insert(&done, &after) {
                // Explored before, and failed.
                flip(&mut done, op);
                for &d in &top.passed[..drops] {
                    flip(&mut done, d);
                }
                continue;
            }
            for &d in &top.passed[..drops] {
                ev.lift(d);
                dropped.push(d);
            }
            ev.lift(op);
            required_left -= usize::from(ops[op].required);
            entered = Some(Some((op, core::mem::replace(&mut state, after), drops)));
            continue;
        }

        // Every candidate failed: no linearization extends this
        // configuration; undo the move that led here.
        let urgent = top.urgent;
        let depth = levels.len() - 1;
        if deepest.as_ref().is_none_or(|d| depth > d.prefix.len()) {
            deepest = Some(Stuck {
                prefix: levels.iter().filter_map(|l| l.via.as_ref().map(|(op, _, _)| ops[*op].index)).collect(),
                state: state.clone(),
                stuck: ops[urgent].index,
            });
        }
        let Level { via, start, .. } = levels.pop().expect("not empty");
        arena.truncate(start);
        let Some((undo, before, drops)) = via else {
            return (Outcome::Stuck(deepest.expect("recorded just above")), steps);
        };
        state = before;
        flip(&mut done, undo);
        ev.unlift(undo);
        required_left += usize::from(ops[undo].required);
        for _ in 0..drops {
            let d = dropped.pop().expect("pushed by the move");
            flip(&mut done, d);
            ev.unlift(d);
        }
    }
}
