//! Benchmark results: latency and roundtrip distributions per operation
//! type, printed as a table and written as JSON.
//!
//! Every sample is kept and sorted (a run has at most a few million), so
//! percentiles are exact (nearest rank), not estimated from buckets.

use serde_json::{Value, json};

/// One measured operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// From invocation to response, ns (virtual ns in the simulator).
    pub latency_ns: u64,
    /// Sequential roundtrips ([`swarm_core::substrate::rtt::Counted`]).
    pub roundtrips: u32,
}

/// How the measured writes completed ([`swarm_core::swarm::safeguess::WritePath`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Fresh guess: one roundtrip.
    pub fast: u64,
    /// Stale guess, rewritten under a lock that kept readers out.
    pub rewritten: u64,
    /// Stale guess that a reader had locked first.
    pub reader_locked: u64,
}

impl Paths {
    /// Adds another client's counts.
    pub fn add(&mut self, o: Paths) {
        self.fast += o.fast;
        self.rewritten += o.rewritten;
        self.reader_locked += o.reader_locked;
    }

    fn total(&self) -> u64 {
        self.fast + self.rewritten + self.reader_locked
    }

    /// `n` as a percentage of all writes.
    fn share(&self, n: u64) -> f64 {
        if self.total() == 0 { 0.0 } else { 100.0 * n as f64 / self.total() as f64 }
    }
}

/// Which clock the latencies were taken on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeBase {
    /// `std::time::Instant`: real time on this machine.
    Wall,
    /// The simulator's virtual nanoseconds.
    Virtual,
}

/// What a run measured, from all clients together.
#[derive(Debug)]
pub struct Measured {
    /// Measured reads.
    pub reads: Vec<Sample>,
    /// Measured writes.
    pub writes: Vec<Sample>,
    /// How the measured writes completed.
    pub paths: Paths,
    /// From the first measured operation's start to the last one's end, ns.
    pub window_ns: u64,
    /// The clock of `window_ns` and of the latencies.
    pub time: TimeBase,
}

/// Summary of one operation type.
#[derive(Clone, Debug, PartialEq)]
pub struct OpStats {
    /// Operations.
    pub count: usize,
    /// Operations per second over the measured window (all clients).
    pub throughput: f64,
    /// Latency percentiles p50, p90, p99, p99.9 and the maximum, µs.
    pub latency_us: Option<[f64; 5]>,
    /// Mean latency, µs.
    pub mean_us: Option<f64>,
    /// Roundtrips p50, p99 and maximum.
    pub roundtrips: Option<[u32; 3]>,
    /// Mean roundtrips.
    pub mean_roundtrips: Option<f64>,
}

/// The value of rank `q` (0..=1) of the sorted `v`, nearest-rank method.
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (q * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

impl OpStats {
    /// Summarises `samples`, measured over `window_ns`.
    pub fn of(samples: &[Sample], window_ns: u64) -> OpStats {
        let mut lat: Vec<u64> = samples.iter().map(|s| s.latency_ns).collect();
        let mut rtt: Vec<u32> = samples.iter().map(|s| s.roundtrips).collect();
        lat.sort_unstable();
        rtt.sort_unstable();
        let us = |q| percentile(&lat, q).map(|ns| ns as f64 / 1e3);
        let n = samples.len();
        let mean = |sum: f64| (n > 0).then(|| sum / n as f64);
        OpStats {
            count: n,
            throughput: if window_ns == 0 { 0.0 } else { n as f64 * 1e9 / window_ns as f64 },
            latency_us: (n > 0).then(|| [0.5, 0.9, 0.99, 0.999, 1.0].map(|q| us(q).unwrap_or(0.0))),
            mean_us: mean(lat.iter().map(|&l| l as f64).sum::<f64>() / 1e3),
            roundtrips: (n > 0).then(|| [0.5, 0.99, 1.0].map(|q| percentile(&rtt, q).unwrap_or(0))),
            mean_roundtrips: mean(rtt.iter().map(|&r| r as f64).sum()),
        }
    }

    fn json(&self) -> Value {
        let lat = self.latency_us.map(|l| json!({"p50": l[0], "p90": l[1], "p99": l[2], "p999": l[3], "max": l[4]}));
        let rtt = self.roundtrips.map(|r| json!({"p50": r[0], "p99": r[1], "max": r[2]}));
        json!({
            "count": self.count,
            "throughput_ops_per_s": self.throughput,
            "latency_us": lat,
            "mean_latency_us": self.mean_us,
            "roundtrips": rtt,
            "mean_roundtrips": self.mean_roundtrips,
        })
    }

    fn row(&self, name: &str) -> [String; 11] {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let l = |i: usize| f(self.latency_us.map(|l| l[i]));
        let r = |i: usize| self.roundtrips.map_or("-".to_string(), |r| r[i].to_string());
        [
            name.to_string(),
            self.count.to_string(),
            format!("{:.0}", self.throughput),
            l(0),
            l(1),
            l(2),
            l(3),
            l(4),
            r(0),
            r(1),
            r(2),
        ]
    }
}

/// A finished benchmark: what was run and what it measured.
pub struct Report {
    /// One line saying what ran (printed above the table).
    pub title: String,
    /// The configuration, as JSON.
    pub config: Value,
    /// Reads.
    pub read: OpStats,
    /// Writes.
    pub write: OpStats,
    /// Reads and writes together.
    pub all: OpStats,
    /// How writes completed.
    pub paths: Paths,
    /// The measured window, seconds.
    pub window_s: f64,
    /// The clock of the measurements.
    pub time: TimeBase,
}

impl Report {
    /// Summarises `m`.
    pub fn new(title: String, config: Value, m: &Measured) -> Report {
        let all: Vec<Sample> = m.reads.iter().chain(&m.writes).copied().collect();
        Report {
            title,
            config,
            read: OpStats::of(&m.reads, m.window_ns),
            write: OpStats::of(&m.writes, m.window_ns),
            all: OpStats::of(&all, m.window_ns),
            paths: m.paths,
            window_s: m.window_ns as f64 / 1e9,
            time: m.time,
        }
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let clock = match self.time {
            TimeBase::Wall => "wall-clock",
            TimeBase::Virtual => "virtual (simulated)",
        };
        let mut rows = vec![
            [
                "op",
                "count",
                "ops/s",
                "p50 µs",
                "p90 µs",
                "p99 µs",
                "p99.9 µs",
                "max µs",
                "rtt p50",
                "rtt p99",
                "rtt max",
            ]
            .map(String::from),
        ];
        rows.push(self.read.row("read"));
        rows.push(self.write.row("write"));
        rows.push(self.all.row("all"));
        let p = &self.paths;
        format!(
            "{}\n{}writes: fast {:.1}% ({}), rewritten {:.1}% ({}), reader-locked {:.1}% ({})\nmeasured {} of {clock} time\n",
            self.title,
            table(&rows),
            p.share(p.fast),
            p.fast,
            p.share(p.rewritten),
            p.rewritten,
            p.share(p.reader_locked),
            p.reader_locked,
            duration(self.window_s),
        )
    }

    /// The same numbers as JSON.
    pub fn json(&self) -> Value {
        let p = &self.paths;
        let mut write = self.write.json();
        write["paths"] = json!({
            "fast": p.fast,
            "rewritten": p.rewritten,
            "reader_locked": p.reader_locked,
            "fast_share": p.share(p.fast) / 100.0,
            "rewritten_share": p.share(p.rewritten) / 100.0,
            "reader_locked_share": p.share(p.reader_locked) / 100.0,
        });
        json!({
            "config": self.config,
            "time_base": match self.time { TimeBase::Wall => "wall", TimeBase::Virtual => "virtual" },
            "measured_s": self.window_s,
            "ops": { "read": self.read.json(), "write": write, "all": self.all.json() },
        })
    }
}

/// `s` seconds for people, in s, ms or µs.
fn duration(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Lays out `rows` as aligned columns: the first left-aligned, the others
/// right-aligned; the first row is the header.
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut width = [0usize; N];
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(width).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            if i == 0 {
                line.push_str(cell);
                line.push_str(&pad);
            } else {
                line.push_str("  ");
                line.push_str(&pad);
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(latency_ns: u64, roundtrips: u32) -> Sample {
        Sample { latency_ns, roundtrips }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), Some(500));
        assert_eq!(percentile(&v, 0.999), Some(999));
        assert_eq!(percentile(&v, 1.0), Some(1000));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile::<u32>(&[], 0.5), None);
        assert_eq!(percentile(&[7], 0.99), Some(7));
    }

    #[test]
    fn stats_of_samples() {
        let st = OpStats::of(&[s(3_000, 1), s(1_000, 1), s(2_000, 2), s(10_000, 3)], 1_000_000_000);
        assert_eq!(st.count, 4);
        assert_eq!(st.throughput, 4.0);
        assert_eq!(st.latency_us, Some([2.0, 10.0, 10.0, 10.0, 10.0]));
        assert_eq!(st.roundtrips, Some([1, 3, 3]));
        assert_eq!(st.mean_roundtrips, Some(1.75));
        let none = OpStats::of(&[], 0);
        assert_eq!((none.count, none.latency_us, none.roundtrips), (0, None, None));
        assert_eq!(none.row("read")[3], "-");
    }

    #[test]
    fn report_text_and_json_agree() {
        let m = Measured {
            reads: vec![s(1_000, 1); 3],
            writes: vec![s(2_000, 1)],
            paths: Paths { fast: 1, ..Paths::default() },
            window_ns: 2_000_000_000,
            time: TimeBase::Wall,
        };
        let r = Report::new("t".into(), json!({"clients": 1}), &m);
        let text = r.text();
        assert!(text.contains("writes: fast 100.0% (1)"), "{text}");
        let j = r.json();
        assert_eq!(j["ops"]["read"]["count"], 3);
        assert_eq!(j["ops"]["all"]["throughput_ops_per_s"], 2.0);
        assert_eq!(j["ops"]["write"]["paths"]["fast_share"], 1.0);
        assert_eq!(j["ops"]["read"]["roundtrips"]["p50"], 1);
        assert_eq!(j["config"]["clients"], 1);
    }

    #[test]
    fn durations() {
        assert_eq!(duration(2.0), "2.000 s");
        assert_eq!(duration(0.0125), "12.500 ms");
        assert_eq!(duration(0.000_042), "42.0 µs");
    }

    #[test]
    fn tables_align() {
        let rows = [["a", "bb"].map(String::from), ["ccc", "d"].map(String::from)];
        assert_eq!(table(&rows), "a    bb\nccc   d\n");
    }
}
