//! A decision without search for registers whose written values are all
//! distinct: Gibbons and Korach's zones ("Testing shared memories", SIAM J.
//! Computing 26(4), 1997; the form used here is Golab, Li and Shah's,
//! "Analyzing consistency properties for fun and profit", PODC 2011).
//!
//! With distinct values, a read names the write it read from. A value's
//! *cluster* is its write and the reads of it; the cluster's *zone* runs
//! from the earliest response `f` in it to the latest invocation `s`: a
//! forward zone if `f < s` (some of the cluster must come before some
//! other of it), else a backward zone `[s, f]`. The history is
//! linearizable if and only if no read ends before its write starts, no
//! two forward zones overlap, and no backward zone lies inside a forward
//! one. Sorting the zones makes this `O(n log n)`, where the search is
//! exponential in the number of concurrent writes.
//!
//! Only a proof of linearizability is answered: ties, repeated values,
//! reads of unwritten values and anything else unusual answer `false` and
//! leave the history to the search, which also explains violations.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::Operation;
use super::register::{RegisterOp, RegisterRet};

/// A cluster: its write's invocation and response (times shifted by one,
/// so that the initial value's write is at 0; a pending write answers at
/// `u64::MAX`), and the span of its reads.
struct Cluster {
    write: Option<(u64, u64)>,
    first_ret: u64,
    last_call: u64,
    reads: bool,
}

impl Cluster {
    const EMPTY: Cluster = Cluster { write: None, first_ret: u64::MAX, last_call: 0, reads: false };
}

/// Whether the zones prove `ops`, the history of one register starting at
/// `initial`, linearizable. Ties between a response and an invocation count
/// as an order here (the checker takes them as concurrent), which can only
/// turn a proof into "not proven".
pub(crate) fn proves_linearizable(initial: u64, ops: &[&Operation<RegisterOp, RegisterRet>]) -> bool {
    let mut clusters: BTreeMap<u64, Cluster> = BTreeMap::new();
    clusters.insert(initial, Cluster { write: Some((0, 0)), ..Cluster::EMPTY });
    for op in ops {
        let call = op.call.saturating_add(1);
        match (op.input, op.response.as_ref().map(|r| (r.at.saturating_add(1), r.output))) {
            (RegisterOp::Write(v), response) => {
                let c = clusters.entry(v).or_insert(Cluster::EMPTY);
                if c.write.is_some() {
                    return false;
                }
                c.write = Some((call, response.map_or(u64::MAX, |(at, _)| at)));
            }
            (RegisterOp::Read, None) => {}
            (RegisterOp::Read, Some((at, RegisterRet::Value(v)))) => {
                let c = clusters.entry(v).or_insert(Cluster::EMPTY);
                c.first_ret = c.first_ret.min(at);
                c.last_call = c.last_call.max(call);
                c.reads = true;
            }
            (RegisterOp::Read, Some((_, RegisterRet::Ack))) => return false,
        }
    }
    let mut forward: Vec<(u64, u64)> = Vec::new();
    let mut backward: Vec<(u64, u64)> = Vec::new();
    for c in clusters.values() {
        let Some((w_call, w_ret)) = c.write else { return false };
        if !c.reads {
            if w_ret == u64::MAX {
                // Pending and never read: it may take effect last, or never.
                continue;
            }
        } else if c.first_ret <= w_call {
            return false;
        }
        let f = w_ret.min(c.first_ret);
        let s = w_call.max(c.last_call);
        if f <= s {
            forward.push((f, s));
        } else {
            backward.push((s, f));
        }
    }
    // Forward zones, by start: each must start after every earlier one ended.
    forward.sort_unstable();
    let mut reach = None;
    for &(f, s) in &forward {
        if reach.is_some_and(|end| f <= end) {
            return false;
        }
        reach = Some(reach.map_or(s, |end: u64| end.max(s)));
    }
    // Disjoint now: the only forward zone that may hold a backward one
    // `[s, f]` is the last one starting at or before `s`.
    backward.iter().all(|&(s, f)| {
        let i = forward.partition_point(|&(start, _)| start <= s);
        i == 0 || f > forward[i - 1].1
    })
}
