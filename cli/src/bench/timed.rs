//! `swarm bench --duration`, `--bucket` and `--fault-node`: a measured
//! phase of fixed length with its timeline, and memory nodes failed or
//! stalled during it (the availability experiment, SWARM §7.7). The
//! harness does the work ([`swarm_ycsb::fault`], [`swarm_ycsb::timeline`]);
//! this is the command line's side: the flags' values and the checks
//! between them and the backend.

use swarm_units::parse_duration_ms;
use swarm_ycsb::fault::{self, FaultKind, NodeFault};
use swarm_ycsb::runner::Timed;
use swarm_ycsb::sim::{RTT_NS, check_faults};

use super::ycsb::{YcsbArgs, YcsbBackend};
use crate::args::MAX_OPS;

/// Width of the timeline's buckets without `--bucket`, ms.
const DEFAULT_BUCKET_MS: u64 = 100;
/// Operations per second and operation in flight that a timed run's nodes
/// are sized for on real memory, without `--ops`: above what one client
/// does on one core (RAW: about 1.5 million on shm without injected
/// latency; RAW on cxl without flushes, 2.9 million). A faster client runs
/// out, and the report says so.
const CAP_PER_S: u64 = 3_000_000;

/// A time as the flags take it (`500ms`, `2s`, `1m`), in ns.
fn time_ns(s: &str) -> Result<u64, String> {
    parse_duration_ms(s)?.checked_mul(1_000_000).ok_or_else(|| format!("'{s}' is too long"))
}

/// `--duration`: a positive time, in ns.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    match time_ns(s)? {
        0 => Err("the duration must be positive".into()),
        n => Ok(n),
    }
}

/// `--bucket`: a positive time, in ns.
pub fn parse_bucket(s: &str) -> Result<u64, String> {
    match time_ns(s)? {
        0 => Err("the timeline's buckets must be at least 1ms wide".into()),
        n => Ok(n),
    }
}

/// `--fault-node NODE:KIND@START[+DURATION]`: `1:stall@2s`,
/// `2:fail@1s+500ms`. The node is checked against the cluster later
/// ([`fault::check`]), once the replicas are known.
pub fn parse_fault(s: &str) -> Result<NodeFault, String> {
    const FORM: &str = "NODE:KIND@START[+DURATION], e.g. 1:stall@2s or 2:fail@1s+500ms";
    let (what, when) = s.split_once('@').ok_or_else(|| format!("'{s}' lacks @START ({FORM})"))?;
    let (node, kind) = what.split_once(':').ok_or_else(|| format!("'{s}' lacks :KIND ({FORM})"))?;
    let node: usize = node.trim().parse().map_err(|_| format!("'{node}' is not a node number ({FORM})"))?;
    let kind = FaultKind::from_name(&kind.trim().to_ascii_lowercase())
        .ok_or_else(|| format!("'{kind}' is not a kind of fault (use fail or stall)"))?;
    let (start, duration) = match when.split_once('+') {
        Some((start, d)) => (start, Some(d)),
        None => (when, None),
    };
    let start_ns = time_ns(start).map_err(|e| format!("bad start time in '{s}': {e}"))?;
    let duration_ns = match duration {
        None => None,
        Some(d) => match time_ns(d).map_err(|e| format!("bad duration in '{s}': {e}"))? {
            0 => return Err(format!("'{s}' lasts no time (leave +DURATION out for a fault to the end of the run)")),
            n => Some(n),
        },
    };
    Ok(NodeFault { node, kind, start_ns, duration_ns })
}

/// The timed part of the run the flags describe, checked against the
/// backend: `None` without `--duration` and `--fault-node`.
pub fn timed(a: &YcsbArgs) -> Result<Option<Timed>, String> {
    let faults = a.fault_node.clone();
    if !faults.is_empty() {
        match a.backend {
            YcsbBackend::Rdma => {
                return Err("--fault-node needs fault control, which --backend rdma does not have (use shm, cxl \
                            or sim)"
                    .into());
            }
            YcsbBackend::Sim => check_faults(&faults)?,
            YcsbBackend::Shm | YcsbBackend::Cxl => {}
        }
    }
    let run_ns = match a.duration {
        Some(d) => d,
        None if faults.is_empty() => {
            if a.bucket.is_some() {
                return Err("--bucket applies to timed runs (--duration or --fault-node)".into());
            }
            return Ok(None);
        }
        None => fault::default_run_ns(&faults),
    };
    let bucket_ns = a.bucket.unwrap_or(DEFAULT_BUCKET_MS * 1_000_000);
    Ok(Some(Timed { run_ns, bucket_ns, faults }))
}

/// Operations per client a timed run may make at most without `--ops`
/// (its nodes are sized for them): in the simulator, one per roundtrip and
/// operation in flight (none is faster); on real memory, [`CAP_PER_S`] a
/// second and operation in flight.
pub fn ops_cap(t: &Timed, backend: YcsbBackend, inflight: usize) -> u64 {
    let per_handle = match backend {
        YcsbBackend::Sim => t.run_ns / RTT_NS + 1,
        _ => (t.run_ns as u128 * CAP_PER_S as u128 / 1_000_000_000) as u64 + 1,
    };
    per_handle.saturating_mul(inflight as u64).min(MAX_OPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn faults_parse() {
        let f = parse_fault("1:stall@2s").unwrap();
        assert_eq!(f, NodeFault { node: 1, kind: FaultKind::Stall, start_ns: 2000 * MS, duration_ns: None });
        let f = parse_fault("2:FAIL@1s+500ms").unwrap();
        assert_eq!(f, NodeFault { node: 2, kind: FaultKind::Fail, start_ns: 1000 * MS, duration_ns: Some(500 * MS) });
        assert_eq!(parse_fault(" 3 : stall @ 0 ").unwrap().start_ns, 0, "spaces and bare milliseconds");
        let cases = [
            ("1:stall", "lacks @START"),
            ("1@2s", "lacks :KIND"),
            ("x:stall@1s", "'x' is not a node number"),
            ("-1:stall@1s", "is not a node number"),
            ("1:crash@1s", "'crash' is not a kind of fault (use fail or stall)"),
            ("1:stall@soon", "bad start time in '1:stall@soon'"),
            ("1:stall@1.5s", "bad start time"),
            ("1:stall@1s+", "bad duration"),
            ("1:stall@1s+2parsecs", "unknown time unit"),
            ("1:stall@1s+0ms", "lasts no time"),
            ("1:stall@99999999999999999h", "too long"),
        ];
        for (bad, expect) in cases {
            let e = parse_fault(bad).unwrap_err();
            assert!(e.contains(expect), "{bad}: {e:?} lacks {expect:?}");
            assert!(!e.contains('\n'), "one line");
        }
    }

    #[test]
    fn times_parse() {
        assert_eq!(parse_duration("4s"), Ok(4000 * MS));
        assert!(parse_duration("0s").unwrap_err().contains("positive"));
        assert_eq!(parse_bucket("250ms"), Ok(250 * MS));
        assert!(parse_bucket("0").unwrap_err().contains("at least 1ms"));
    }

    #[test]
    fn caps_cover_the_fastest_client() {
        let t = Timed { run_ns: 4000 * MS, bucket_ns: 100 * MS, faults: Vec::new() };
        assert_eq!(ops_cap(&t, YcsbBackend::Sim, 2), 2 * (4000 * MS / RTT_NS + 1));
        assert_eq!(ops_cap(&t, YcsbBackend::Shm, 1), 12_000_001);
        let long = Timed { run_ns: 3_600_000 * MS, ..t };
        assert_eq!(ops_cap(&long, YcsbBackend::Shm, 4), MAX_OPS);
    }
}
