//! What a run measures: per operation type, a latency histogram
//! (HdrHistogram, three significant digits: percentiles within 0.1%) and
//! an exact histogram of sequential roundtrips, merged over clients (and
//! over processes, through [`OpHist::to_json`]); and, for a timed phase,
//! its [`Timeline`].

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use swarm_core::swarm::client::Paths;

use crate::timeline::Timeline;
use crate::workload::OpKind;

/// Roundtrip counts at or above this share the last bucket.
pub const RTT_BUCKETS: usize = 64;

/// The measurements of one operation type.
#[derive(Clone, Debug)]
pub struct OpHist {
    /// Latencies, ns (at least 1).
    lat: Histogram<u64>,
    /// `rtt[n]`: operations that took `n` sequential roundtrips.
    rtt: Vec<u64>,
    /// Gets that found no value, updates of missing keys.
    not_found: u64,
    /// Operations that failed because too few memory nodes answered (a
    /// run with faults goes on after them); not in the latencies.
    errors: u64,
}

impl Default for OpHist {
    fn default() -> Self {
        OpHist::new()
    }
}

impl OpHist {
    /// Empty.
    pub fn new() -> OpHist {
        // Three significant digits, auto-resizing: cannot fail.
        let lat = Histogram::new(3).expect("3 significant digits are valid");
        OpHist { lat, rtt: vec![0; RTT_BUCKETS], not_found: 0, errors: 0 }
    }

    /// Records one failed operation.
    pub fn record_error(&mut self) {
        self.errors += 1;
    }

    /// Records one operation.
    pub fn record(&mut self, latency_ns: u64, roundtrips: u32, found: bool) {
        // Auto-resizing: grows to any value; clamped only if that fails.
        if self.lat.record(latency_ns.max(1)).is_err() {
            self.lat.saturating_record(latency_ns.max(1));
        }
        self.rtt[(roundtrips as usize).min(RTT_BUCKETS - 1)] += 1;
        self.not_found += u64::from(!found);
    }

    /// Adds another's measurements.
    pub fn merge(&mut self, o: &OpHist) {
        // Auto-resizing histograms of one precision always add.
        let _ = self.lat.add(&o.lat);
        for (a, b) in self.rtt.iter_mut().zip(&o.rtt) {
            *a += b;
        }
        self.not_found += o.not_found;
        self.errors += o.errors;
    }

    /// Operations recorded (that did not fail).
    pub fn count(&self) -> u64 {
        self.lat.len()
    }

    /// The latency histogram, ns.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.lat
    }

    /// Roundtrips at quantile `q` (nearest rank); 0 if empty.
    pub fn rtt_quantile(&self, q: f64) -> u32 {
        let total: u64 = self.rtt.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (n, c) in self.rtt.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return n as u32;
            }
        }
        (RTT_BUCKETS - 1) as u32
    }

    /// The summary over a measured window of `window_ns`.
    pub fn summary(&self, window_ns: u64) -> OpSummary {
        let us = |ns: u64| ns as f64 / 1e3;
        let q = |p: f64| us(self.lat.value_at_quantile(p));
        let count = self.count();
        OpSummary {
            count,
            throughput_ops: if window_ns == 0 { 0.0 } else { count as f64 * 1e9 / window_ns as f64 },
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: us(self.lat.max()),
            mean_us: self.lat.mean() / 1e3,
            rtt_p50: self.rtt_quantile(0.5),
            rtt_p99: self.rtt_quantile(0.99),
            rtt_max: self.rtt.iter().rposition(|&c| c > 0).unwrap_or(0) as u32,
            not_found: self.not_found,
            errors: self.errors,
        }
    }

    /// The measurements as JSON, to send from a worker process.
    pub fn to_json(&self) -> Value {
        let lat: Vec<[u64; 2]> =
            self.lat.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]).collect();
        json!({ "lat": lat, "rtt": self.rtt, "not_found": self.not_found, "errors": self.errors })
    }

    /// Reads what [`OpHist::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<OpHist, String> {
        let bad = || "a worker sent malformed measurements".to_string();
        let mut h = OpHist::new();
        for pair in v["lat"].as_array().ok_or_else(bad)? {
            let (Some(value), Some(n)) = (pair[0].as_u64(), pair[1].as_u64()) else { return Err(bad()) };
            h.lat.record_n(value.max(1), n).map_err(|_| bad())?;
        }
        for (i, c) in v["rtt"].as_array().ok_or_else(bad)?.iter().enumerate().take(RTT_BUCKETS) {
            h.rtt[i] = c.as_u64().ok_or_else(bad)?;
        }
        h.not_found = v["not_found"].as_u64().ok_or_else(bad)?;
        h.errors = v["errors"].as_u64().ok_or_else(bad)?;
        Ok(h)
    }
}

/// The figures of one operation type.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSummary {
    /// Operations.
    pub count: u64,
    /// Operations per second of this type, all clients together.
    pub throughput_ops: f64,
    /// Latency percentiles, µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Sequential roundtrips, median.
    pub rtt_p50: u32,
    /// Sequential roundtrips, 99th percentile.
    pub rtt_p99: u32,
    /// Most roundtrips of one operation.
    pub rtt_max: u32,
    /// Gets that found nothing, updates of missing keys.
    pub not_found: u64,
    /// Operations that failed (too few memory nodes answered).
    pub errors: u64,
}

impl OpSummary {
    /// As JSON (the report's `ops.<type>` objects).
    pub fn to_json(&self) -> Value {
        json!({
            "count": self.count,
            "throughput_ops": round3(self.throughput_ops),
            "p50_us": round3(self.p50_us),
            "p90_us": round3(self.p90_us),
            "p99_us": round3(self.p99_us),
            "p999_us": round3(self.p999_us),
            "max_us": round3(self.max_us),
            "mean_us": round3(self.mean_us),
            "rtt_p50": self.rtt_p50,
            "rtt_p99": self.rtt_p99,
            "rtt_max": self.rtt_max,
            "not_found": self.not_found,
            "errors": self.errors,
        })
    }
}

/// Three decimals are plenty (and keep the JSON readable).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What a group of clients measured in one phase: a histogram per
/// operation type, and the window from the first operation's start to the
/// last one's end; for a timed phase, its timeline.
#[derive(Clone, Debug, Default)]
pub struct PhaseStats {
    /// Indexed by [`OpKind::index`].
    pub ops: [OpHist; 4],
    /// Start of the first operation, ns on the run's clock.
    pub start_ns: u64,
    /// End of the last operation, ns on the run's clock.
    pub end_ns: u64,
    /// A timed phase's operations over time.
    pub timeline: Option<Timeline>,
    /// A timed phase: some handle ran out of operations (its share of
    /// `RunSpec::ops`) before the time was up.
    pub capped: bool,
    /// The rare paths the clients' operations took in the phase (chain
    /// hops, slow writes, retries: [`Paths`]).
    pub paths: Paths,
}

impl PhaseStats {
    /// The histogram of `kind`.
    pub fn op(&self, kind: OpKind) -> &OpHist {
        &self.ops[kind.index()]
    }

    /// Operations of every type.
    pub fn count(&self) -> u64 {
        self.ops.iter().map(OpHist::count).sum()
    }

    /// Failed operations of every type (see [`OpHist::record_error`]).
    pub fn errors(&self) -> u64 {
        self.ops.iter().map(|o| o.errors).sum()
    }

    /// The window, ns.
    pub fn window_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// Adds the measurements of clients on the same clock: the window
    /// spans both.
    pub fn merge(&mut self, o: &PhaseStats) {
        if self.count() == 0 && self.window_ns() == 0 {
            (self.start_ns, self.end_ns) = (o.start_ns, o.end_ns);
        } else if o.count() > 0 || o.window_ns() > 0 {
            self.start_ns = self.start_ns.min(o.start_ns);
            self.end_ns = self.end_ns.max(o.end_ns);
        }
        self.add_ops(o, Timeline::merge);
    }

    /// Adds the measurements of a later phase of the same clients: the
    /// windows, one after the other, add up.
    pub fn append(&mut self, o: &PhaseStats) {
        let window = self.window_ns() + o.window_ns();
        self.add_ops(o, Timeline::overlay);
        self.end_ns = self.start_ns + window;
    }

    /// Adds the measurements of another process, whose clock is its own:
    /// the windows (started at one gate) are taken as overlapping, and the
    /// longer one counts.
    pub fn merge_foreign(&mut self, o: &PhaseStats) {
        let window = self.window_ns().max(o.window_ns());
        self.add_ops(o, Timeline::merge);
        self.end_ns = self.start_ns + window;
    }

    /// Adds `o`'s histograms to these, and its timeline with `timeline`.
    pub(crate) fn add_ops(&mut self, o: &PhaseStats, timeline: fn(&mut Timeline, &Timeline)) {
        for (a, b) in self.ops.iter_mut().zip(&o.ops) {
            a.merge(b);
        }
        match (&mut self.timeline, &o.timeline) {
            (Some(a), Some(b)) => timeline(a, b),
            (None, Some(b)) => self.timeline = Some(b.clone()),
            _ => {}
        }
        self.capped |= o.capped;
        self.paths.add(&o.paths);
    }

    /// As JSON, to send from a worker.
    pub fn to_json(&self) -> Value {
        json!({
            "window_ns": self.window_ns(),
            "ops": self.ops.iter().map(OpHist::to_json).collect::<Vec<_>>(),
            "timeline": self.timeline.as_ref().map(Timeline::to_json),
            "capped": self.capped,
            "paths": paths_json(&self.paths),
        })
    }

    /// Reads what [`PhaseStats::to_json`] wrote (window from 0).
    pub fn from_json(v: &Value) -> Result<PhaseStats, String> {
        let bad = || "a worker sent malformed measurements".to_string();
        let mut p = PhaseStats { end_ns: v["window_ns"].as_u64().ok_or_else(bad)?, ..PhaseStats::default() };
        let ops = v["ops"].as_array().filter(|a| a.len() == 4).ok_or_else(bad)?;
        for (slot, o) in p.ops.iter_mut().zip(ops) {
            *slot = OpHist::from_json(o)?;
        }
        if !v["timeline"].is_null() {
            p.timeline = Some(Timeline::from_json(&v["timeline"])?);
        }
        p.capped = v["capped"].as_bool().ok_or_else(bad)?;
        for (name, n) in v["paths"].as_object().ok_or_else(bad)? {
            if !p.paths.set(name, n.as_u64().ok_or_else(bad)?) {
                return Err(format!("a worker sent an unknown path counter '{name}'"));
            }
        }
        Ok(p)
    }
}

/// The counters of `paths` that are not zero, by name.
pub fn paths_json(paths: &Paths) -> Value {
    Value::Object(paths.each().filter(|&(_, n)| n > 0).map(|(name, n)| (name.to_string(), json!(n))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percentiles_and_roundtrips() {
        let mut h = OpHist::new();
        for i in 1..=1000u64 {
            h.record(i * 1000, if i <= 990 { 1 } else { 3 }, i != 7);
        }
        let s = h.summary(1_000_000_000);
        assert_eq!(s.count, 1000);
        assert_eq!(s.throughput_ops, 1000.0);
        assert!((s.p50_us - 500.0).abs() <= 0.5, "{}", s.p50_us);
        assert!((s.p99_us - 990.0).abs() <= 1.0, "{}", s.p99_us);
        assert!((s.max_us - 1000.0).abs() <= 1.0);
        assert_eq!((s.rtt_p50, s.rtt_p99, s.rtt_max, s.not_found), (1, 1, 3, 1));
        assert_eq!(h.rtt_quantile(0.995), 3);
        let empty = OpHist::new().summary(0);
        assert_eq!((empty.count, empty.rtt_p50, empty.throughput_ops), (0, 0, 0.0));
    }

    #[test]
    fn windows_merge() {
        let mut a = PhaseStats { start_ns: 100, end_ns: 200, ..PhaseStats::default() };
        a.ops[0].record(5, 1, true);
        let mut b = PhaseStats { start_ns: 150, end_ns: 400, ..PhaseStats::default() };
        b.ops[1].record(5, 2, true);
        let mut m = PhaseStats::default();
        m.merge(&a);
        m.merge(&b);
        assert_eq!((m.start_ns, m.end_ns, m.count()), (100, 400, 2));
        let mut f = a.clone();
        f.merge_foreign(&b);
        assert_eq!((f.window_ns(), f.count()), (250, 2));
        // Rounds one after the other: 100 ns, then 250 ns of measurement.
        let mut r = a.clone();
        r.append(&b);
        assert_eq!((r.window_ns(), r.count()), (350, 2));
        let mut e = PhaseStats::default();
        e.append(&a);
        assert_eq!((e.window_ns(), e.count()), (100, 1));
    }

    proptest! {
        #[test]
        fn json_round_trip_keeps_every_figure(
            samples in prop::collection::vec((1u64..10_000_000, 0u32..80, any::<bool>()), 0..200),
            counts in prop::collection::vec(0u64..3, 32),
        ) {
            let mut p = PhaseStats { start_ns: 0, end_ns: 1_000_000, ..PhaseStats::default() };
            for (i, (lat, rtt, found)) in samples.iter().enumerate() {
                p.ops[i % 4].record(*lat, *rtt, *found);
            }
            let names: Vec<&str> = p.paths.each().map(|(name, _)| name).collect();
            for (name, n) in names.into_iter().zip(counts) {
                p.paths.set(name, n);
            }
            let back = PhaseStats::from_json(&p.to_json()).unwrap();
            prop_assert_eq!(back.window_ns(), p.window_ns());
            prop_assert_eq!(back.paths, p.paths);
            for (a, b) in p.ops.iter().zip(&back.ops) {
                prop_assert_eq!(a.summary(1000), b.summary(1000));
            }
        }

        #[test]
        fn merging_adds_counts(a in 0u64..500, b in 0u64..500) {
            let (mut x, mut y) = (OpHist::new(), OpHist::new());
            (0..a).for_each(|i| x.record(i + 1, 1, true));
            (0..b).for_each(|i| y.record(i + 1, 2, false));
            x.merge(&y);
            prop_assert_eq!(x.count(), a + b);
            prop_assert_eq!(x.summary(1).not_found, b);
        }
    }
}
