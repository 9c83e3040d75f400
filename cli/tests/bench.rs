//! `swarm bench-register` on both backends: the table is printed, the JSON report
//! holds the same numbers, and uncontended operations take one roundtrip.

mod common;

use common::{ShmDir, ok};
use serde_json::Value;

/// Runs `swarm bench ARGS --json FILE`; returns stdout and the JSON.
fn bench(args: &[&str]) -> (String, Value) {
    let (dir, _) = ShmDir::named("json");
    std::fs::create_dir(&dir.0).unwrap();
    let file = dir.0.join("out.json");
    let mut all = vec!["bench-register"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", file.to_str().unwrap()]);
    let out = ok(&all);
    let json = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("valid JSON");
    (out, json)
}

/// The table has a header and rows for reads, writes and both.
fn assert_table(out: &str) {
    let header = out.lines().find(|l| l.starts_with("op ")).unwrap_or_else(|| panic!("no table:\n{out}"));
    for col in ["count", "ops/s", "p50 µs", "p99.9 µs", "rtt p50", "rtt max"] {
        assert!(header.contains(col), "{header}");
    }
    for row in ["read ", "write ", "all "] {
        assert!(out.lines().any(|l| l.starts_with(row)), "no {row} row:\n{out}");
    }
    assert!(out.contains("writes: fast"), "{out}");
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Counts add up and every figure is plausible.
fn assert_consistent(j: &Value, total_ops: u64) {
    let ops = &j["ops"];
    let (r, w) = (&ops["read"], &ops["write"]);
    assert_eq!(num(&r["count"]) + num(&w["count"]), total_ops as f64, "{j}");
    assert_eq!(num(&ops["all"]["count"]), total_ops as f64);
    let p = &w["paths"];
    assert_eq!(num(&p["fast"]) + num(&p["rewritten"]) + num(&p["reader_locked"]), num(&w["count"]));
    for op in [r, w] {
        let lat = &op["latency_us"];
        assert!(num(&lat["p50"]) > 0.0 && num(&lat["p50"]) <= num(&lat["p99"]) && num(&lat["p99"]) <= num(&lat["max"]));
        assert!(num(&op["roundtrips"]["p50"]) >= 1.0 && num(&op["throughput_ops_per_s"]) > 0.0);
    }
}

#[test]
fn sim_uncontended_ops_take_one_roundtrip() {
    let (out, j) = bench(&["--backend", "sim", "--ops", "200", "--clients", "1"]);
    assert_table(&out);
    assert_consistent(&j, 200);
    assert_eq!(j["time_base"], "virtual");
    for op in ["read", "write"] {
        assert_eq!(j["ops"][op]["roundtrips"]["p50"], 1, "{op}: {}", j["ops"][op]);
        // The fixed 2 µs network: one roundtrip is 2 virtual µs.
        assert_eq!(j["ops"][op]["latency_us"]["p50"], 2.0, "{op}");
    }
    assert_eq!(j["ops"]["write"]["paths"]["fast_share"], 1.0, "one writer never guesses stale");
}

#[test]
fn sim_runs_replay_from_their_seed() {
    let args =
        ["--backend", "sim", "--ops", "200", "--clients", "3", "--registers", "2", "--sim-jitter", "--seed", "7"];
    let (out, a) = bench(&args);
    assert_table(&out);
    assert_consistent(&a, 600);
    let (_, b) = bench(&args);
    assert_eq!(a["ops"], b["ops"], "same seed, same virtual run");
}

#[test]
fn shm_runs_and_uncontended_ops_take_one_roundtrip() {
    let (out, j) = bench(&["--ops", "500"]);
    assert_table(&out);
    assert_consistent(&j, 1000);
    assert_eq!(j["time_base"], "wall");
    assert_eq!(j["config"]["clients"], 2);
    let (_, j) = bench(&["--ops", "500", "--clients", "1", "--replicas", "5", "--value-size", "1K"]);
    assert_consistent(&j, 500);
    for op in ["read", "write"] {
        assert_eq!(j["ops"][op]["roundtrips"]["p50"], 1, "{op}: {}", j["ops"][op]);
    }
}

#[test]
fn shm_injected_latency_shows_in_the_latency() {
    let (_, j) = bench(&["--ops", "200", "--clients", "1", "--inject-rtt-us", "50", "--read-ratio", "1"]);
    assert_eq!(j["ops"]["write"]["count"], 0);
    assert!(j["ops"]["write"]["latency_us"].is_null());
    let p50 = num(&j["ops"]["read"]["latency_us"]["p50"]);
    assert!((50.0..5_000.0).contains(&p50), "a one-roundtrip read with 50 µs injected took {p50} µs");
}
