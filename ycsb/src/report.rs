//! The comparison, for people (a table per in-flight setting, the load
//! phase, throughput per client thread across the sweep) and for programs
//! (JSON of the shape the issue fixes:
//! `{"config": {...}, "systems": [{"name", "throughput_ops", "ops": {"get":
//! {"count", "p50_us", "p99_us", "rtt_p50", "rtt_p99", ...}, ...}}]}`).
//!
//! Ratios are to RAW, the latency floor (SWARM §7): for an operation type,
//! its median latency over RAW's; for a system, its throughput over RAW's.
//!
//! A timed run adds each run's timeline to the JSON (`timeline`: every
//! bucket; `availability`: before, during and after the faults) and a
//! table of the same to the text.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};
use swarm_core::kv::System;
use swarm_core::swarm::client::Paths;

use crate::fault;
use crate::runner::{MemoryUse, RunSpec, SystemRun};
use crate::stats::{OpSummary, PhaseStats, paths_json, round3};
use crate::timeline::{Span, Timeline};
use crate::workload::OpKind;

/// One system at one in-flight setting, summarised.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// Operations in flight per client.
    pub inflight: usize,
    /// Measured operations per second, all clients.
    pub throughput_ops: f64,
    /// The measured window, s.
    pub window_s: f64,
    /// Per operation type that occurred (or failed).
    pub ops: Vec<(OpKind, OpSummary)>,
    /// A timed run's timeline.
    pub timeline: Option<Timeline>,
    /// A timed run whose clients ran out of operations before the time
    /// was up.
    pub capped: bool,
    /// The rare paths its operations took.
    pub paths: Paths,
}

impl RunSummary {
    fn new(inflight: usize, p: &PhaseStats) -> RunSummary {
        let w = p.window_ns();
        let ops = OpKind::ALL
            .into_iter()
            .map(|k| (k, p.op(k).summary(w)))
            .filter(|(_, s)| s.count > 0 || s.errors > 0)
            .collect();
        let throughput_ops = if w == 0 { 0.0 } else { p.count() as f64 * 1e9 / w as f64 };
        RunSummary {
            inflight,
            throughput_ops,
            window_s: w as f64 / 1e9,
            ops,
            timeline: p.timeline.clone(),
            capped: p.capped,
            paths: p.paths,
        }
    }

    /// The summary of `kind`, if any ran.
    pub fn op(&self, kind: OpKind) -> Option<&OpSummary> {
        self.ops.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
    }

    /// Operations of every type.
    pub fn count(&self) -> u64 {
        self.ops.iter().map(|(_, s)| s.count).sum()
    }

    /// The operations that read a key's chain and those that write it:
    /// gets and updates, a read-modify-write counting as one of each.
    pub fn hop_ops(&self) -> (u64, u64) {
        let n = |k: OpKind| self.op(k).map_or(0, |s| s.count);
        (n(OpKind::Get) + n(OpKind::Rmw), n(OpKind::Update) + n(OpKind::Rmw))
    }

    /// Chain hops per get and per update ([`RunSummary::hop_ops`]), where
    /// there were such operations; none at all if nothing walked a chain.
    pub fn hops(&self) -> Option<(Option<f64>, Option<f64>)> {
        let (gets, writes) = self.hop_ops();
        let per = |n: u64, ops: u64| (ops > 0).then(|| n as f64 / ops as f64);
        (self.paths.read_hops + self.paths.write_hops > 0)
            .then(|| (per(self.paths.read_hops, gets), per(self.paths.write_hops, writes)))
    }
}

/// One system's figures.
#[derive(Clone, Debug)]
pub struct SystemSummary {
    /// The system.
    pub system: System,
    /// The load phase (inserts).
    pub load: OpSummary,
    /// Load window, s.
    pub load_s: f64,
    /// One per in-flight setting, in sweep order.
    pub runs: Vec<RunSummary>,
    /// Its store's memory after the run (of the last round).
    pub memory: Option<MemoryUse>,
    /// Operations of the warm-ups that failed with an error the run
    /// tolerates (RAW's torn copies).
    pub warmup_errors: u64,
}

/// Everything a report shows.
#[derive(Clone, Debug)]
pub struct Report {
    /// The run.
    pub spec: RunSpec,
    /// The backend, in words (table title).
    pub backend: String,
    /// The backend's settings (merged into `config`).
    pub backend_json: Value,
    /// Whether latencies are virtual (simulator) or wall-clock.
    pub virtual_time: bool,
    /// Per system, in the order run.
    pub systems: Vec<SystemSummary>,
}

impl Report {
    /// Summarises the runs.
    pub fn new(spec: &RunSpec, backend: String, backend_json: Value, virtual_time: bool, runs: &[SystemRun]) -> Report {
        let systems = runs
            .iter()
            .map(|r| {
                let l = &r.result.load;
                SystemSummary {
                    system: r.system,
                    load: l.op(OpKind::Insert).summary(l.window_ns()),
                    load_s: l.window_ns() as f64 / 1e9,
                    runs: spec.inflight.iter().zip(&r.result.runs).map(|(&k, p)| RunSummary::new(k, p)).collect(),
                    memory: r.result.memory,
                    warmup_errors: r.result.warmup_errors,
                }
            })
            .collect();
        Report { spec: spec.clone(), backend, backend_json, virtual_time, systems }
    }

    fn raw(&self) -> Option<&SystemSummary> {
        self.systems.iter().find(|s| s.system.is_floor())
    }

    /// From the first fault's start to the last one's end, ns after the
    /// origin.
    fn fault_window(&self) -> Option<(u64, u64)> {
        self.spec.timed.as_ref().and_then(|t| fault::window(&t.faults, t.run_ns))
    }

    /// The timelines' table: per in-flight setting and system, throughput
    /// before, during and after the faults, the worst bucket's p99, and
    /// the operations that failed.
    fn availability_text(&self, out: &mut String) {
        let Some(t) = &self.spec.timed else { return };
        let w = self.name_width();
        let faults: Vec<String> = t.faults.iter().map(ToString::to_string).collect();
        let faults = if faults.is_empty() { "no faults".to_string() } else { format!("faults {}", faults.join(", ")) };
        let window = self.fault_window();
        for (i, &k) in self.spec.inflight.iter().enumerate() {
            let _ = writeln!(
                out,
                "
over time ({k} in flight; {} run, {} buckets; {faults}):",
                fault::time(t.run_ns),
                fault::time(t.bucket_ns)
            );
            let _ = writeln!(
                out,
                "{:<w$} {:>12} {:>12} {:>5} {:>12} {:>5} {:>13} {:>7} {:>12} {:>7}",
                "system",
                "before ops/s",
                "during ops/s",
                "%",
                "after ops/s",
                "%",
                "worst p99 µs",
                "at s",
                "max µs",
                "errors"
            );
            for sys in &self.systems {
                let Some(tl) = sys.runs.get(i).and_then(|r| r.timeline.as_ref()) else { continue };
                let a = tl.availability(window);
                let ops = |s: Option<Span>| s.map_or("-".into(), |s| format!("{:.0}", s.throughput_ops));
                let pct = |s: Option<Span>| a.of_before(s).map_or("-".into(), |r| format!("{:.0}%", r * 100.0));
                let _ = writeln!(
                    out,
                    "{:<w$} {:>12} {:>12} {:>5} {:>12} {:>5} {:>13.2} {:>7.2} {:>12.2} {:>7}",
                    sys.system.name(),
                    ops(a.before),
                    ops(a.during),
                    pct(a.during),
                    ops(a.after),
                    pct(a.after),
                    a.worst_p99_us,
                    a.worst_at_s,
                    a.max_us,
                    a.errors
                );
            }
        }
        let _ = writeln!(
            out,
            "(mean throughput over the whole buckets before the first fault, from its start to the last fault's \
             end, and after; the highest p99 of a bucket, where it starts, the slowest operation and the failed \
             ones; every bucket is in the JSON and the availability plot)"
        );
        for sys in &self.systems {
            if sys.runs.iter().any(|r| r.capped) {
                let _ = writeln!(
                    out,
                    "note: {}: clients ran out of operations ({} per client, --ops) before the time was up: the end \
                     of its timeline is empty; give a larger --ops",
                    sys.system.name(),
                    self.spec.ops
                );
            }
        }
    }

    /// The width of the system column: the longest name (at least 9).
    fn name_width(&self) -> usize {
        self.systems.iter().map(|s| s.system.name().len()).fold(9, usize::max)
    }

    /// Per-client-thread throughput of `r`.
    fn per_client(&self, r: &RunSummary) -> f64 {
        r.throughput_ops / self.spec.clients as f64
    }

    /// The title line.
    pub fn title(&self) -> String {
        let s = &self.spec;
        let dist = if s.workload.latest() { "latest" } else { s.distribution.name() };
        let values = match s.value_min < s.value_size {
            true => format!("{} to {}", s.value_min, s.value_size),
            false => s.value_size.to_string(),
        };
        format!(
            "{} ({dist}): {} keys of {} B, values of {} B, {} replicas; {} client(s); {} ops/client after {} warm-up; seed {}\nbackend: {}",
            s.workload, s.keys, s.key_size, values, s.replicas, s.clients, s.ops, s.warmup, s.seed, self.backend
        )
    }

    /// The tables, as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let w = self.name_width();
        let _ = writeln!(out, "{}", self.title());
        let unit = if self.virtual_time { " (virtual time)" } else { "" };
        for (i, &k) in self.spec.inflight.iter().enumerate() {
            let _ = writeln!(out, "\n{k} operation(s) in flight per client{unit}:");
            let _ = writeln!(
                out,
                "{:<w$} {:<7} {:>9} {:>11} {:>8} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7}",
                "system",
                "op",
                "count",
                "ops/s",
                "p50 µs",
                "p90 µs",
                "p99 µs",
                "p99.9 µs",
                "rtt p50",
                "rtt p99",
                "vs raw"
            );
            let raw = self.raw().and_then(|r| r.runs.get(i));
            for sys in &self.systems {
                let Some(run) = sys.runs.get(i) else { continue };
                for (kind, s) in &run.ops {
                    let ratio = raw.and_then(|r| r.op(*kind)).map(|r| ratio(s.p50_us, r.p50_us));
                    let _ = writeln!(
                        out,
                        "{:<w$} {:<7} {:>9} {:>11.0} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>7} {:>7} {:>7}",
                        sys.system.name(),
                        kind.name(),
                        s.count,
                        s.throughput_ops,
                        s.p50_us,
                        s.p90_us,
                        s.p99_us,
                        s.p999_us,
                        s.rtt_p50,
                        s.rtt_p99,
                        ratio.map_or("-".into(), |r| format!("{r:.2}x")),
                    );
                }
                let ratio = raw.map(|r| ratio(run.throughput_ops, r.throughput_ops));
                let _ = writeln!(
                    out,
                    "{:<w$} {:<7} {:>9} {:>11.0} {:>60}",
                    sys.system.name(),
                    "all",
                    run.count(),
                    run.throughput_ops,
                    ratio.map_or("-".into(), |r| format!("{r:.2}x")),
                );
            }
        }
        let _ = writeln!(out, "\n(vs raw: median latency over RAW's for an operation; throughput over RAW's for all)");
        for sys in self.systems.iter().filter(|s| !s.system.guarantee().shares_keys()) {
            // A timed run with faults counts operations that found too few
            // nodes too: its availability table shows them.
            let untimed = sys.runs.iter().filter(|r| r.timeline.is_none());
            let failed: u64 = untimed.flat_map(|r| &r.ops).map(|(_, s)| s.errors).sum();
            if failed > 0 || sys.warmup_errors > 0 {
                let _ = writeln!(
                    out,
                    "note: {}: {failed} measured get(s) and {} in the warm-ups found a copy that two clients' \
                     concurrent updates left torn (it has no concurrency control: updates of one key by two clients at \
                     once can mix); each read it again for {} ms, then was counted as failed, not in the latencies",
                    sys.system.name(),
                    sys.warmup_errors,
                    swarm_core::kv::torn::TORN_PATIENCE_NS / 1_000_000
                );
            }
        }
        let _ = writeln!(out, "\nload phase (every key inserted once into each round's fresh store):");
        for sys in &self.systems {
            let l = &sys.load;
            let _ = writeln!(
                out,
                "{:<w$} {} inserts in {:.2} s ({:.0} ops/s), p50 {:.2} µs, p99 {:.2} µs, rtt p50 {} p99 {}",
                sys.system.name(),
                l.count,
                sys.load_s,
                l.throughput_ops,
                l.p50_us,
                l.p99_us,
                l.rtt_p50,
                l.rtt_p99
            );
        }
        let _ = writeln!(out, "\nthroughput per client thread (ops/s) by operations in flight:");
        let mut header = format!("{:<w$}", "system");
        for k in &self.spec.inflight {
            let _ = write!(header, " {:>11}", format!("{k} in flight"));
        }
        if self.spec.inflight.len() > 1 {
            let _ = write!(header, " {:>8}", "last/1st");
        }
        let _ = writeln!(out, "{header}");
        for sys in &self.systems {
            let mut line = format!("{:<w$}", sys.system.name());
            for r in &sys.runs {
                let _ = write!(line, " {:>11.0}", self.per_client(r));
            }
            if let (Some(first), Some(last)) = (sys.runs.first(), sys.runs.last())
                && sys.runs.len() > 1
            {
                let _ = write!(line, " {:>7.2}x", ratio(last.throughput_ops, first.throughput_ops));
            }
            let _ = writeln!(out, "{line}");
        }
        self.paths_text(&mut out);
        self.memory_text(&mut out);
        self.availability_text(&mut out);
        out
    }

    /// Each store's memory after its run, per key (SWARM Table 3), with
    /// recycling running as the clients ran it: live (claimed less log
    /// segments given back), claimed, and live against RAW's.
    fn memory_text(&self, out: &mut String) {
        if self.systems.iter().all(|s| s.memory.is_none()) {
            return;
        }
        let w = self.name_width();
        let raw = self.raw().and_then(|r| r.memory).map(|m| m.live_per_key());
        let _ =
            writeln!(out, "\nmemory per key after the run (all nodes; live: claimed less log segments given back):");
        for sys in &self.systems {
            let Some(m) = sys.memory else { continue };
            let vs = raw.map_or("-".into(), |r| format!("{:.2}x raw", ratio(m.live_per_key(), r)));
            let _ = writeln!(
                out,
                "{:<w$} {:>9.0} B live, {:>9.0} B claimed ({} keys), {vs}",
                sys.system.name(),
                m.live_per_key(),
                m.claimed_per_key(),
                m.keys
            );
        }
    }

    /// The rare paths each system's measured operations took (chain hops,
    /// slow writes, retries), per 1,000 operations, at the first in-flight
    /// setting: the protocol's behaviour behind its latencies.
    fn paths_text(&self, out: &mut String) {
        let w = self.name_width();
        let _ = writeln!(
            out,
            "
rare paths per 1,000 measured operations ({} in flight):",
            self.spec.inflight[0]
        );
        for sys in &self.systems {
            let Some(run) = sys.runs.first() else { continue };
            let per = |n: u64| 1000.0 * n as f64 / run.count().max(1) as f64;
            let taken: Vec<String> =
                run.paths.each().filter(|&(_, n)| n > 0).map(|(name, n)| format!("{name} {:.1}", per(n))).collect();
            let line = if taken.is_empty() { "none".to_string() } else { taken.join(", ") };
            let _ = writeln!(out, "{:<w$} {line}", sys.system.name());
        }
        self.hops_text(out);
    }

    /// Chain hops per get and per write of each store that walks chains
    /// (Clover), at the first in-flight setting: what the pDPM paper
    /// measured under YCSB-A (§6: 0.2-0.3 per read, 3.7-3.9 per write).
    fn hops_text(&self, out: &mut String) {
        let w = self.name_width();
        if !self.systems.iter().filter_map(|s| s.runs.first()).any(|r| r.hops().is_some()) {
            return;
        }
        let _ =
            writeln!(out, "\nchain hops per operation (pDPM §6 under YCSB-A: 0.2-0.3 per read, 3.7-3.9 per write):");
        for sys in &self.systems {
            let Some((run, (get, update))) = sys.runs.first().and_then(|r| Some((r, r.hops()?))) else { continue };
            let (gets, writes) = run.hop_ops();
            let shown = |h: Option<f64>| h.map_or("-".to_string(), |h| format!("{h:.2}"));
            let _ = writeln!(
                out,
                "{:<w$} {} per get ({gets} gets), {} per update ({writes} updates)",
                sys.system.name(),
                shown(get),
                shown(update),
            );
        }
    }

    /// The ops object of one run: `{"get": {...}, ...}`, with the ratio to
    /// RAW's median where RAW ran.
    fn ops_json(&self, run: &RunSummary, raw: Option<&RunSummary>) -> Value {
        let mut ops = Map::new();
        for (kind, s) in &run.ops {
            let mut o = s.to_json();
            if let Some(r) = raw.and_then(|r| r.op(*kind)) {
                o["vs_raw_p50"] = json!(round3(ratio(s.p50_us, r.p50_us)));
            }
            ops.insert(kind.name().into(), o);
        }
        Value::Object(ops)
    }

    fn run_json(&self, run: &RunSummary, raw: Option<&RunSummary>) -> Value {
        let mut v = json!({
            "inflight": run.inflight,
            "throughput_ops": round3(run.throughput_ops),
            "throughput_per_client_ops": round3(self.per_client(run)),
            "window_s": run.window_s,
            "ops": self.ops_json(run, raw),
            "paths": paths_json(&run.paths),
        });
        if let Some(r) = raw {
            v["vs_raw_throughput"] = json!(round3(ratio(run.throughput_ops, r.throughput_ops)));
        }
        if let Some((get, update)) = run.hops() {
            v["hops_per_get"] = json!(get.map(round3));
            v["hops_per_update"] = json!(update.map(round3));
        }
        if let Some(t) = &run.timeline {
            v["availability"] = t.availability(self.fault_window()).to_json();
            v["timeline"] = t.report_json();
            v["capped"] = json!(run.capped);
        }
        v
    }

    /// The JSON report. Each system's top-level figures are those of the
    /// first in-flight setting; `sweep` holds every setting's.
    pub fn json(&self) -> Value {
        let mut config = self.spec.to_json();
        if let (Some(c), Some(b)) = (config.as_object_mut(), self.backend_json.as_object()) {
            c.extend(b.clone());
        }
        config["time_base"] = json!(if self.virtual_time { "virtual" } else { "wall" });
        let raw = self.raw();
        let systems: Vec<Value> = self
            .systems
            .iter()
            .map(|sys| {
                let raw_run = |i: usize| raw.and_then(|r| r.runs.get(i));
                let sweep: Vec<Value> =
                    sys.runs.iter().enumerate().map(|(i, r)| self.run_json(r, raw_run(i))).collect();
                let mut v = sweep.first().cloned().unwrap_or_else(|| json!({}));
                v["name"] = json!(sys.system.name());
                v["load"] = sys.load.to_json();
                v["load"]["window_s"] = json!(sys.load_s);
                v["sweep"] = Value::Array(sweep);
                v["warmup_errors"] = json!(sys.warmup_errors);
                if let Some(m) = sys.memory {
                    v["memory"] = json!({
                        "claimed_bytes": m.claimed,
                        "reclaimable_bytes": m.reclaimable,
                        "keys": m.keys,
                        "live_bytes_per_key": round3(m.live_per_key()),
                        "claimed_bytes_per_key": round3(m.claimed_per_key()),
                    });
                }
                v
            })
            .collect();
        json!({ "config": config, "systems": systems })
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}
