//! What a timed measured phase did over time: per bucket of
//! `bucket_ns` from the phase's origin, the operations completed in it
//! (throughput), their latencies (p50, p99) and the operations that
//! failed in it. What the availability plot draws (SWARM Figure 11).
//!
//! Each handle records into its own timeline as operations complete (a
//! histogram per bucket: no lock, no sample kept); the phase merges its
//! handles', the run its clients' and processes' (each relative to its
//! own origin: the gate that opened the phase), and rounds are overlaid
//! ([`Timeline::overlay`]: throughput is then the mean of the rounds).
//!
//! Histograms have two significant digits (1%): plenty for a plot, and
//! small enough for a bucket per 100 ms of every handle.

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::stats::round3;

/// Significant digits of the buckets' latency histograms.
const SIGFIG: u8 = 2;

/// Most buckets a timeline may have.
pub const MAX_BUCKETS: u64 = 100_000;

/// One bucket: latencies of the operations completed in it, and failures.
#[derive(Clone, Debug, Default)]
struct Bucket {
    /// `None` until an operation completes in it (most handles' buckets
    /// stay small that way).
    lat: Option<Histogram<u64>>,
    errors: u64,
}

impl Bucket {
    fn count(&self) -> u64 {
        self.lat.as_ref().map_or(0, Histogram::len)
    }

    fn merge(&mut self, o: &Bucket) {
        if let Some(l) = &o.lat {
            match &mut self.lat {
                // Auto-resizing histograms of one precision always add.
                Some(mine) => {
                    let _ = mine.add(l);
                }
                None => self.lat = Some(l.clone()),
            }
        }
        self.errors += o.errors;
    }
}

/// A measured phase over time.
#[derive(Clone, Debug)]
pub struct Timeline {
    bucket_ns: u64,
    run_ns: u64,
    buckets: Vec<Bucket>,
    /// Operations that completed after the run's end (in flight when it
    /// ended): counted in the phase's figures, not in any bucket.
    late: u64,
    /// Runs overlaid (rounds).
    runs: u64,
}

/// One bucket, summarised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Its start, s after the origin.
    pub t_s: f64,
    /// Operations completed in it.
    pub ops: u64,
    /// Per second (mean over overlaid runs).
    pub throughput_ops: f64,
    /// Median latency of those operations, µs (0 if none).
    pub p50_us: f64,
    /// 99th percentile, µs (0 if none).
    pub p99_us: f64,
    /// Slowest, µs (0 if none).
    pub max_us: f64,
    /// Operations that failed in it.
    pub errors: u64,
}

/// Mean throughput and tail over a span of buckets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    /// Operations per second.
    pub throughput_ops: f64,
    /// Highest p99 of a bucket of the span, µs.
    pub worst_p99_us: f64,
    /// Slowest operation of the span, µs.
    pub max_us: f64,
    /// Operations that failed.
    pub errors: u64,
}

/// A timed phase around its faults: mean throughput in the whole buckets
/// before the first fault, during the faults and after the last one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Availability {
    /// Before the first fault starts (the whole run without faults).
    pub before: Option<Span>,
    /// From the first fault's start to the last one's end.
    pub during: Option<Span>,
    /// After the last fault ends.
    pub after: Option<Span>,
    /// The highest p99 of any bucket, µs.
    pub worst_p99_us: f64,
    /// Where that bucket starts, s.
    pub worst_at_s: f64,
    /// The slowest operation, µs.
    pub max_us: f64,
    /// Operations that failed in the run.
    pub errors: u64,
}

impl Availability {
    /// Throughput of `span` as a share of the throughput before the faults.
    pub fn of_before(&self, span: Option<Span>) -> Option<f64> {
        let before = self.before?.throughput_ops;
        span.filter(|_| before > 0.0).map(|s| s.throughput_ops / before)
    }

    /// As JSON (the report's `availability`).
    pub fn to_json(&self) -> Value {
        let span = |s: Option<Span>| {
            s.map(|s| {
                json!({
                    "throughput_ops": round3(s.throughput_ops),
                    "worst_p99_us": round3(s.worst_p99_us),
                    "max_us": round3(s.max_us),
                    "errors": s.errors,
                })
            })
        };
        json!({
            "before": span(self.before),
            "during": span(self.during),
            "after": span(self.after),
            "during_of_before": self.of_before(self.during).map(round3),
            "after_of_before": self.of_before(self.after).map(round3),
            "worst_p99_us": round3(self.worst_p99_us),
            "worst_at_s": self.worst_at_s,
            "max_us": round3(self.max_us),
            "errors": self.errors,
        })
    }
}

impl Timeline {
    /// Empty, for a phase of `run_ns` in buckets of `bucket_ns` (the last
    /// one shorter if they do not divide).
    pub fn new(run_ns: u64, bucket_ns: u64) -> Timeline {
        let bucket_ns = bucket_ns.max(1);
        let n = run_ns.div_ceil(bucket_ns).clamp(1, MAX_BUCKETS);
        Timeline { bucket_ns, run_ns, buckets: vec![Bucket::default(); n as usize], late: 0, runs: 1 }
    }

    /// Width of a bucket, ns.
    pub fn bucket_ns(&self) -> u64 {
        self.bucket_ns
    }

    /// Length of the phase, ns.
    pub fn run_ns(&self) -> u64 {
        self.run_ns
    }

    /// Operations that completed after the end of the run.
    pub fn late(&self) -> u64 {
        self.late
    }

    fn bucket(&mut self, done_ns: u64) -> Option<&mut Bucket> {
        if done_ns >= self.run_ns {
            self.late += 1;
            return None;
        }
        self.buckets.get_mut((done_ns / self.bucket_ns) as usize)
    }

    /// An operation completed `done_ns` after the origin, taking
    /// `latency_ns`.
    pub fn record(&mut self, done_ns: u64, latency_ns: u64) {
        if let Some(b) = self.bucket(done_ns) {
            let h = b.lat.get_or_insert_with(|| Histogram::new(SIGFIG).expect("2 significant digits are valid"));
            // Auto-resizing: grows to any value; clamped only if that fails.
            if h.record(latency_ns.max(1)).is_err() {
                h.saturating_record(latency_ns.max(1));
            }
        }
    }

    /// An operation failed `done_ns` after the origin.
    pub fn record_error(&mut self, done_ns: u64) {
        if let Some(b) = self.bucket(done_ns) {
            b.errors += 1;
        }
    }

    /// Adds the timeline of other clients of the same run.
    pub fn merge(&mut self, o: &Timeline) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize_with(o.buckets.len(), Bucket::default);
        }
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            a.merge(b);
        }
        self.late += o.late;
    }

    /// Adds a later round of the same run, bucket by bucket: the
    /// throughput becomes the rounds' mean.
    pub fn overlay(&mut self, o: &Timeline) {
        self.merge(o);
        self.runs += o.runs;
    }

    /// Width of bucket `i`, ns (the last one may be cut by the run's end).
    fn width_ns(&self, i: usize) -> u64 {
        let start = i as u64 * self.bucket_ns;
        self.bucket_ns.min(self.run_ns.saturating_sub(start)).max(1)
    }

    /// Every bucket, summarised.
    pub fn points(&self) -> Vec<Point> {
        let q = |b: &Bucket, p: f64| b.lat.as_ref().map_or(0.0, |h| h.value_at_quantile(p) as f64 / 1e3);
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let secs = self.width_ns(i) as f64 / 1e9 * self.runs as f64;
                Point {
                    t_s: (i as u64 * self.bucket_ns) as f64 / 1e9,
                    ops: b.count(),
                    throughput_ops: b.count() as f64 / secs,
                    p50_us: q(b, 0.5),
                    p99_us: q(b, 0.99),
                    max_us: b.lat.as_ref().map_or(0.0, |h| h.max() as f64 / 1e3),
                    errors: b.errors,
                }
            })
            .collect()
    }

    /// The buckets wholly inside `from_ns..to_ns`, together; `None` if
    /// there are none.
    pub fn span(&self, from_ns: u64, to_ns: u64) -> Option<Span> {
        let first = from_ns.div_ceil(self.bucket_ns) as usize;
        let (mut ops, mut ns, mut worst, mut max, mut errors, mut any) = (0u64, 0u64, 0f64, 0f64, 0u64, false);
        for (i, p) in self.points().iter().enumerate().skip(first) {
            let end = i as u64 * self.bucket_ns + self.width_ns(i);
            if end > to_ns.min(self.run_ns) {
                break;
            }
            any = true;
            ops += p.ops;
            ns += self.width_ns(i);
            worst = worst.max(p.p99_us);
            max = max.max(p.max_us);
            errors += p.errors;
        }
        any.then(|| Span {
            throughput_ops: ops as f64 / (ns as f64 / 1e9 * self.runs as f64),
            worst_p99_us: worst,
            max_us: max,
            errors,
        })
    }

    /// The phase before, during and after `faults` (from the first
    /// fault's start to the last one's end; the whole run without faults
    /// is "before").
    pub fn availability(&self, faults: Option<(u64, u64)>) -> Availability {
        let points = self.points();
        // The first bucket with the highest p99.
        let worst = points.iter().fold(None::<Point>, |w, p| match w {
            Some(w) if w.p99_us >= p.p99_us => Some(w),
            _ => Some(*p),
        });
        let (start, end) = faults.unwrap_or((self.run_ns, self.run_ns));
        Availability {
            before: self.span(0, start),
            during: faults.and_then(|(s, e)| self.span(s, e)),
            after: faults.and_then(|_| self.span(end, self.run_ns)),
            worst_p99_us: worst.map_or(0.0, |p| p.p99_us),
            worst_at_s: worst.map_or(0.0, |p| p.t_s),
            max_us: points.iter().map(|p| p.max_us).fold(0.0, f64::max),
            errors: points.iter().map(|p| p.errors).sum(),
        }
    }

    /// The report's JSON: every bucket.
    pub fn report_json(&self) -> Value {
        let buckets: Vec<Value> = self
            .points()
            .iter()
            .map(|p| {
                json!({
                    "t_s": p.t_s,
                    "ops": p.ops,
                    "throughput_ops": round3(p.throughput_ops),
                    "p50_us": round3(p.p50_us),
                    "p99_us": round3(p.p99_us),
                    "max_us": round3(p.max_us),
                    "errors": p.errors,
                })
            })
            .collect();
        json!({
            "bucket_s": self.bucket_ns as f64 / 1e9,
            "run_s": self.run_ns as f64 / 1e9,
            "rounds": self.runs,
            "late": self.late,
            "buckets": buckets,
        })
    }

    /// Everything, to send from a worker process.
    pub fn to_json(&self) -> Value {
        let buckets: Vec<Value> = self
            .buckets
            .iter()
            .map(|b| {
                let lat: Vec<[u64; 2]> = b
                    .lat
                    .iter()
                    .flat_map(|h| h.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]))
                    .collect();
                json!({ "lat": lat, "errors": b.errors })
            })
            .collect();
        json!({
            "bucket_ns": self.bucket_ns,
            "run_ns": self.run_ns,
            "late": self.late,
            "runs": self.runs,
            "buckets": buckets,
        })
    }

    /// Reads what [`Timeline::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<Timeline, String> {
        let bad = || "a worker sent a malformed timeline".to_string();
        let u = |k: &str| v[k].as_u64().ok_or_else(bad);
        let mut t = Timeline::new(u("run_ns")?, u("bucket_ns")?);
        t.late = u("late")?;
        t.runs = u("runs")?;
        let buckets = v["buckets"].as_array().filter(|b| b.len() == t.buckets.len()).ok_or_else(bad)?;
        for (slot, b) in t.buckets.iter_mut().zip(buckets) {
            slot.errors = b["errors"].as_u64().ok_or_else(bad)?;
            for pair in b["lat"].as_array().ok_or_else(bad)? {
                let (Some(value), Some(n)) = (pair[0].as_u64(), pair[1].as_u64()) else { return Err(bad()) };
                let h = slot.lat.get_or_insert_with(|| Histogram::new(SIGFIG).expect("2 significant digits are valid"));
                h.record_n(value.max(1), n).map_err(|_| bad())?;
            }
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn buckets_count_throughput_and_tails() {
        // 1 s in buckets of 300 ms: 300, 300, 300, 100.
        let mut t = Timeline::new(1000 * MS, 300 * MS);
        for i in 0..1000u64 {
            // One operation a millisecond, 10 µs each, but 1 ms in the
            // second bucket.
            let lat = if (300..600).contains(&i) { 1_000_000 } else { 10_000 };
            t.record(i * MS + MS / 2, lat);
        }
        t.record_error(450 * MS);
        t.record(1000 * MS, 5);
        let p = t.points();
        assert_eq!(p.len(), 4);
        assert_eq!(p.iter().map(|p| p.ops).collect::<Vec<_>>(), [300, 300, 300, 100]);
        assert!(p.iter().all(|p| (p.throughput_ops - 1000.0).abs() < 1e-6), "{p:?}");
        assert!((p[1].p99_us - 1000.0).abs() <= 10.0 && (p[0].p50_us - 10.0).abs() <= 0.1, "{p:?}");
        assert_eq!((p[1].errors, p[3].t_s, t.late()), (1, 0.9, 1));
        // Before 300 ms, in 300..600 ms, after 600 ms.
        let before = t.span(0, 300 * MS).unwrap();
        let during = t.span(300 * MS, 600 * MS).unwrap();
        let after = t.span(600 * MS, u64::MAX).unwrap();
        assert!((before.throughput_ops - 1000.0).abs() < 1e-6 && (after.throughput_ops - 1000.0).abs() < 1e-6);
        assert!((during.worst_p99_us - 1000.0).abs() <= 10.0 && during.errors == 1);
        assert!(t.span(100 * MS, 500 * MS).is_none(), "no whole bucket");
        // Rounds overlaid: the same per-round throughput.
        let mut two = t.clone();
        two.overlay(&t);
        assert!((two.points()[0].throughput_ops - 1000.0).abs() < 1e-6);
        assert_eq!(two.points()[0].ops, 600);
        let back = Timeline::from_json(&t.to_json()).unwrap();
        assert_eq!(back.points(), t.points());
        assert_eq!(back.late(), 1);
    }
}
