//! Memory-node faults during the measured phase: the availability
//! experiment (SWARM §7.7, Figure 11).
//!
//! A [`NodeFault`] fails or stalls one node at a time after the measured
//! phase began, for a while or to the end of the run. The schedule is one
//! type for every backend; each backend applies it its own way:
//! - mapped memory (shm threads and worker processes, cxl): an
//!   [`Injector`] on a thread of its own sets the nodes' [`Fault`] state
//!   through a [`FaultControl`] (the cluster's [`Nodes`], which every
//!   process mapping the cluster sees), at the schedule's times after the
//!   measured phase's origin, and heals every node it touched before the
//!   run returns, so that the next system or round starts healthy;
//! - the simulator: [`crate::sim`] schedules the node's crash or stall in
//!   virtual time (a crash there is permanent, so a failure with a
//!   duration cannot be modelled and is refused).
//!
//! The load phase and the warm-up are never faulted. Node 0 holds RAW's
//! index, of which RAW keeps one copy (the replicated stores replicate
//! theirs): faulting it would stop RAW, the floor every run is measured
//! against, so it is refused.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use swarm_core::NodeId;
use swarm_core::kv::System;
use swarm_core::kv::place::INDEX_NODE;
use swarm_core::systems;
use swarm_mapped::{Fault, Nodes};

/// What happens to the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The node is down: operations on it fail at once.
    Fail,
    /// The node is frozen: operations on it wait, unapplied, until it
    /// resumes (or their client's timeout).
    Stall,
}

impl FaultKind {
    /// As the command line writes it.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Fail => "fail",
            FaultKind::Stall => "stall",
        }
    }

    /// From its name.
    pub fn from_name(s: &str) -> Option<FaultKind> {
        match s {
            "fail" => Some(FaultKind::Fail),
            "stall" => Some(FaultKind::Stall),
            _ => None,
        }
    }

    /// The state the node is put in.
    fn state(self) -> Fault {
        match self {
            FaultKind::Fail => Fault::Failed,
            FaultKind::Stall => Fault::Stalled,
        }
    }
}

/// One fault of one node: from `start_ns` after the measured phase began,
/// for `duration_ns` or to the end of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFault {
    /// The node (never 0, which holds the index).
    pub node: usize,
    /// Failed or stalled.
    pub kind: FaultKind,
    /// When it begins, ns after the measured phase's origin.
    pub start_ns: u64,
    /// How long it lasts; `None`: to the end of the run.
    pub duration_ns: Option<u64>,
}

impl NodeFault {
    /// When it ends in a run of `run_ns`, ns after the origin.
    pub fn end_ns(&self, run_ns: u64) -> u64 {
        self.duration_ns.map_or(run_ns, |d| self.start_ns.saturating_add(d).min(run_ns))
    }

    /// As JSON (the report's `config.faults`).
    pub fn to_json(&self) -> Value {
        json!({
            "node": self.node,
            "kind": self.kind.name(),
            "start_ns": self.start_ns,
            "duration_ns": self.duration_ns,
        })
    }

    /// Reads what [`NodeFault::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<NodeFault, String> {
        let bad = || "malformed run description (faults)".to_string();
        Ok(NodeFault {
            node: v["node"].as_u64().ok_or_else(bad)? as usize,
            kind: v["kind"].as_str().and_then(FaultKind::from_name).ok_or_else(bad)?,
            start_ns: v["start_ns"].as_u64().ok_or_else(bad)?,
            duration_ns: if v["duration_ns"].is_null() {
                None
            } else {
                Some(v["duration_ns"].as_u64().ok_or_else(bad)?)
            },
        })
    }
}

/// `1:stall@2s+500ms`, as the command line takes it (whole milliseconds
/// where they are exact, nanoseconds otherwise).
impl fmt::Display for NodeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}", self.node, self.kind.name(), time(self.start_ns))?;
        if let Some(d) = self.duration_ns {
            write!(f, "+{}", time(d))?;
        }
        Ok(())
    }
}

/// A time for people: `2s`, `1500ms`, `250us`, `12ns`.
pub fn time(ns: u64) -> String {
    match ns {
        0 => "0s".into(),
        n if n.is_multiple_of(1_000_000_000) => format!("{}s", n / 1_000_000_000),
        n if n.is_multiple_of(1_000_000) => format!("{}ms", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// Checks `faults` against the `systems` of the run: a fault of the node
/// that holds the one copy of some system's index ([`INDEX_NODE`]: RAW,
/// pDPM's stores, Clover) would only measure that system's outage, so it is
/// refused, naming them; the stores that replicate their index
/// (`SystemInfo::replicated_index`) may lose node 0 like any other.
pub fn check_index_node(faults: &[NodeFault], systems: &[System], nodes: usize) -> Result<(), String> {
    let Some(f) = faults.iter().find(|f| f.node == INDEX_NODE.0 as usize) else { return Ok(()) };
    let one_copy: Vec<&str> = systems.iter().filter(|s| !s.replicated_index()).map(|s| s.name()).collect();
    if one_copy.is_empty() {
        return Ok(());
    }
    let replicated: Vec<&str> = systems::ALL.iter().filter(|s| s.replicated_index()).map(|s| s.name()).collect();
    Err(format!(
        "fault {f}: node 0 holds the one copy of the index of {}; fault a node from 1 to {}, or leave them out \
         with --systems (the index of {} is replicated)",
        one_copy.join(", "),
        nodes - 1,
        replicated.join(", ")
    ))
}

/// Checks `faults` against a cluster of `nodes` memory nodes and a
/// measured phase of `run_ns`: an error in words for the first that
/// cannot be.
pub fn check(faults: &[NodeFault], nodes: usize, run_ns: u64) -> Result<(), String> {
    for f in faults {
        if f.node >= nodes {
            return Err(format!("fault {f}: there is no node {} (the cluster has nodes 0 to {})", f.node, nodes - 1));
        }
        if f.start_ns >= run_ns {
            return Err(format!("fault {f} starts at or after the end of the {} run (--duration)", time(run_ns)));
        }
        if f.duration_ns == Some(0) {
            return Err(format!("fault {f} lasts no time"));
        }
    }
    for (i, a) in faults.iter().enumerate() {
        for b in &faults[i + 1..] {
            if a.node == b.node && a.start_ns < b.end_ns(run_ns) && b.start_ns < a.end_ns(run_ns) {
                return Err(format!("faults {a} and {b} overlap on node {}", a.node));
            }
        }
    }
    Ok(())
}

/// The span from the first fault's start to the last one's end, in a run
/// of `run_ns`; `None` without faults.
pub fn window(faults: &[NodeFault], run_ns: u64) -> Option<(u64, u64)> {
    let start = faults.iter().map(|f| f.start_ns).min()?;
    let end = faults.iter().map(|f| f.end_ns(run_ns)).max()?;
    Some((start, end))
}

/// A measured phase long enough to see the throughput before, during and
/// after the faults: 3 s after the last start of a fault to the end, 2 s
/// after the last end of one that ends.
pub fn default_run_ns(faults: &[NodeFault]) -> u64 {
    const S: u64 = 1_000_000_000;
    faults
        .iter()
        .map(|f| match f.duration_ns {
            None => f.start_ns.saturating_add(3 * S),
            Some(d) => f.start_ns.saturating_add(d).saturating_add(2 * S),
        })
        .max()
        .unwrap_or(0)
}

/// One change of a node's state, `at_ns` after the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// When, ns after the measured phase's origin.
    pub at_ns: u64,
    /// The node.
    pub node: usize,
    /// Its new state.
    pub state: Fault,
}

/// The state changes of `faults` in a run of `run_ns`, in time order:
/// each fault's start, and its end (the node healed) at its end or at the
/// end of the run.
pub fn transitions(faults: &[NodeFault], run_ns: u64) -> Vec<Transition> {
    let mut out: Vec<Transition> = faults
        .iter()
        .flat_map(|f| {
            [
                Transition { at_ns: f.start_ns, node: f.node, state: f.kind.state() },
                Transition { at_ns: f.end_ns(run_ns), node: f.node, state: Fault::Healthy },
            ]
        })
        .collect();
    // Stable: a node healed and faulted again at one instant heals first.
    out.sort_by_key(|t| (t.at_ns, t.state != Fault::Healthy));
    out
}

/// What can set a memory node's state: the clusters over mapped memory.
pub trait FaultControl: Sync {
    /// Puts `node` in `state`, for every client of the cluster.
    fn set(&self, node: usize, state: Fault) -> Result<(), String>;
}

impl FaultControl for Nodes {
    fn set(&self, node: usize, state: Fault) -> Result<(), String> {
        self.set_fault(NodeId(node as u16), state).map_err(|e| format!("cannot set node {node} {state:?}: {e}"))
    }
}

/// How often a waiting injector looks whether it was told to stop.
const POLL: Duration = Duration::from_millis(1);

/// Applies a schedule in real time on one thread ([`Injector::run`]),
/// from the origin another thread gives it ([`Injector::begin`]: the
/// measured phase began), until it is done or told to stop
/// ([`Injector::stop`]); either way every node it faulted is healthy again
/// when `run` returns.
pub struct Injector<'a> {
    transitions: Vec<Transition>,
    control: &'a dyn FaultControl,
    origin: OnceLock<Instant>,
    stop: AtomicBool,
}

impl<'a> Injector<'a> {
    /// For `faults` in a measured phase of `run_ns`, on `control`.
    pub fn new(faults: &[NodeFault], run_ns: u64, control: &'a dyn FaultControl) -> Injector<'a> {
        Injector {
            transitions: transitions(faults, run_ns),
            control,
            origin: OnceLock::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// The measured phase began at `origin` (the first call counts).
    pub fn begin(&self, origin: Instant) {
        let _ = self.origin.set(origin);
    }

    /// The run is over: `run` heals what it faulted and returns.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps until `t`; `false` if told to stop first.
    fn sleep_until(&self, t: Instant) -> bool {
        loop {
            if self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= t {
                return true;
            }
            thread::sleep((t - now).min(POLL));
        }
    }

    /// Waits for the origin, then applies each transition at its time;
    /// heals the nodes it faulted on the way out.
    pub fn run(&self) -> Result<(), String> {
        let mut touched: Vec<usize> = Vec::new();
        let out = self.apply(&mut touched);
        let mut healed = Ok(());
        for &node in &touched {
            healed = healed.and(self.control.set(node, Fault::Healthy));
        }
        out.and(healed)
    }

    fn apply(&self, touched: &mut Vec<usize>) -> Result<(), String> {
        let origin = loop {
            if let Some(o) = self.origin.get() {
                break *o;
            }
            if self.stopped() {
                return Ok(());
            }
            thread::sleep(POLL);
        };
        for t in &self.transitions {
            if !self.sleep_until(origin + Duration::from_nanos(t.at_ns)) {
                return Ok(());
            }
            self.control.set(t.node, t.state)?;
            if t.state != Fault::Healthy && !touched.contains(&t.node) {
                touched.push(t.node);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const MS: u64 = 1_000_000;

    fn fault(node: usize, kind: FaultKind, start_ms: u64, dur_ms: Option<u64>) -> NodeFault {
        NodeFault { node, kind, start_ns: start_ms * MS, duration_ns: dur_ms.map(|d| d * MS) }
    }

    #[test]
    fn faults_are_checked_in_words() {
        let ok = [fault(1, FaultKind::Stall, 100, Some(50)), fault(2, FaultKind::Fail, 120, None)];
        assert_eq!(check(&ok, 3, 1000 * MS), Ok(()));
        let node_0 = [fault(0, FaultKind::Fail, 1, None)];
        assert_eq!(check(&node_0, 3, 1000 * MS), Ok(()));
        let (raw, swarm_kv) = (systems::from_name("raw").unwrap(), systems::from_name("swarm-kv").unwrap());
        let e = check_index_node(&node_0, &[swarm_kv, raw], 3).unwrap_err();
        assert!(e.contains("node 0 holds the one copy of the index of raw;"), "{e}");
        assert!(e.contains("fault a node from 1 to 2, or leave them out with --systems"), "{e}");
        assert_eq!(check_index_node(&node_0, &[swarm_kv], 3), Ok(()));
        assert_eq!(check_index_node(&ok, &[raw], 3), Ok(()));
        let e = check(&[fault(3, FaultKind::Fail, 1, None)], 3, 1000 * MS).unwrap_err();
        assert!(e.contains("there is no node 3"), "{e}");
        let e = check(&[fault(1, FaultKind::Stall, 1000, None)], 3, 1000 * MS).unwrap_err();
        assert!(e.contains("starts at or after the end of the 1s run"), "{e}");
        let e = check(&[fault(1, FaultKind::Stall, 10, Some(0))], 3, 1000 * MS).unwrap_err();
        assert!(e.contains("lasts no time"), "{e}");
        let e = check(&[fault(1, FaultKind::Stall, 10, None), fault(1, FaultKind::Fail, 500, Some(1))], 3, 1000 * MS)
            .unwrap_err();
        assert!(e.contains("overlap on node 1"), "{e}");
        // One after the other on one node is fine.
        let seq = [fault(1, FaultKind::Stall, 10, Some(10)), fault(1, FaultKind::Fail, 20, None)];
        assert_eq!(check(&seq, 3, 1000 * MS), Ok(()));
    }

    #[test]
    fn schedule_and_window() {
        let f = [fault(2, FaultKind::Fail, 300, None), fault(1, FaultKind::Stall, 100, Some(50))];
        assert_eq!(window(&f, 1000 * MS), Some((100 * MS, 1000 * MS)));
        assert_eq!(window(&[], 1000 * MS), None);
        let t = transitions(&f, 1000 * MS);
        let seen: Vec<(u64, usize, Fault)> = t.iter().map(|t| (t.at_ns / MS, t.node, t.state)).collect();
        assert_eq!(
            seen,
            [(100, 1, Fault::Stalled), (150, 1, Fault::Healthy), (300, 2, Fault::Failed), (1000, 2, Fault::Healthy)]
        );
        assert_eq!(default_run_ns(&f), 3300 * MS);
        assert_eq!(default_run_ns(&[fault(1, FaultKind::Stall, 2000, Some(500))]), 4500 * MS);
        assert_eq!(f[1].to_string(), "1:stall@100ms+50ms");
        assert_eq!(fault(2, FaultKind::Fail, 2000, None).to_string(), "2:fail@2s");
        for x in f {
            assert_eq!(NodeFault::from_json(&x.to_json()), Ok(x));
        }
    }

    /// Records what it is told.
    struct Log(Mutex<Vec<(usize, Fault)>>);

    impl FaultControl for Log {
        fn set(&self, node: usize, state: Fault) -> Result<(), String> {
            self.0.lock().unwrap().push((node, state));
            Ok(())
        }
    }

    #[test]
    fn the_injector_applies_in_order_and_heals_when_stopped() {
        let log = Log(Mutex::new(Vec::new()));
        let f = [fault(1, FaultKind::Stall, 0, Some(1)), fault(2, FaultKind::Fail, 2, None)];
        // The run ends (stop) long before the schedule's end at 1 hour.
        let inj = Injector::new(&f, 3_600_000 * MS, &log);
        thread::scope(|s| {
            let h = s.spawn(|| inj.run());
            inj.begin(Instant::now());
            while log.0.lock().unwrap().len() < 3 {
                thread::sleep(POLL);
            }
            inj.stop();
            h.join().unwrap().unwrap();
        });
        let seen = log.0.into_inner().unwrap();
        assert_eq!(
            seen,
            [(1, Fault::Stalled), (1, Fault::Healthy), (2, Fault::Failed), (1, Fault::Healthy), (2, Fault::Healthy)]
        );
        // Stopped before the measured phase began: nothing is touched.
        let log = Log(Mutex::new(Vec::new()));
        let inj = Injector::new(&f, 1000 * MS, &log);
        inj.stop();
        assert_eq!(inj.run(), Ok(()));
        assert!(log.0.into_inner().unwrap().is_empty());
    }
}
