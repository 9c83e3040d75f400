//! `swarm bench`, the YCSB comparison: bad input is one line of error, a
//! simulated run gives SWARM Table 2's roundtrips in the JSON shape the
//! issue fixes, and shared-memory runs with threads and with worker
//! processes complete.

mod common;

use common::{ShmDir, fails, ok};
use serde_json::Value;

/// Runs `swarm bench ARGS --json FILE --plots DIR`; returns stdout, the
/// JSON and the files written.
fn bench(args: &[&str]) -> (String, Value, Vec<String>) {
    let (dir, _) = ShmDir::named("ycsb");
    std::fs::create_dir(&dir.0).unwrap();
    let file = dir.0.join("out.json");
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", file.to_str().unwrap()]);
    let out = ok(&all);
    let json = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("valid JSON");
    let mut files: Vec<String> =
        std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    (out, json, files)
}

fn system<'a>(j: &'a Value, name: &str) -> &'a Value {
    j["systems"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name}: {j}"))
}

#[test]
fn bad_flags_are_one_line_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--workload", "e"], "'e' is not a workload"),
        (&["bench", "--distribution", "latest"], "not a distribution"),
        (&["bench", "--systems", "raw,nosuch"], "'nosuch' is not a system"),
        (&["bench", "--inflight", "1,0"], "operations in flight must be between 1 and 126"),
        (&["bench", "--inflight", "two"], "not a whole number"),
        (&["bench", "--key-size", "300"], "keys may have 1 to 255 bytes"),
        (&["bench", "--value-size", "70000"], "at most 65536 bytes"),
        (&["bench", "--value-size", "1K..32"], "the range 1K..32 is empty"),
        (&["bench", "--replicas", "4"], "replicas must be 3, 5 or 7"),
        (&["bench", "--clients", "0"], "clients must be between 1 and 126"),
        (&["bench", "--keys", "0"], "keys must be between 1"),
        (&["bench", "--ops", "0"], "operations must be between 1"),
        (&["bench", "--rounds", "0"], "rounds must be between 1 and 1000"),
        (&["bench", "--inject-rtt-us", "-1"], "injected latency must be between 0"),
        (&["bench", "--backend", "tcp"], "invalid value 'tcp'"),
        (&["bench", "--plots", "x", "--no-plots"], "cannot be used with"),
        (&["bench", "--fault-node", "1:stall"], "lacks @START"),
        (&["bench", "--fault-node", "1@2s"], "lacks :KIND"),
        (&["bench", "--fault-node", "one:stall@2s"], "'one' is not a node number"),
        (&["bench", "--fault-node", "1:crash@2s"], "'crash' is not a kind of fault (use fail or stall)"),
        (&["bench", "--fault-node", "1:stall@2 seconds"], "bad start time"),
        (&["bench", "--fault-node", "1:stall@2s+1.5s"], "bad duration"),
        (&["bench", "--duration", "0s"], "the duration must be positive"),
        (&["bench", "--bucket", "0ms"], "at least 1ms"),
    ];
    for (args, expect) in cases {
        let line = fails(args, 2);
        assert!(line.contains(expect), "swarm {args:?}: {line:?} lacks {expect:?}");
    }
}

#[test]
fn impossible_runs_are_one_line_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--backend", "rdma"], "--backend rdma needs"),
        (&["bench", "--backend", "sim", "--inject-rtt-us", "1"], "applies to --backend shm and cxl"),
        (&["bench", "--backend", "sim", "--processes", "2", "--clients", "2"], "--processes applies"),
        (&["bench", "--processes", "3", "--clients", "2"], "needs at least 3 clients"),
        (&["bench", "--backend", "cxl"], "needs --path"),
        (&["bench", "--path", "/dev/shm/x"], "--path applies to --backend cxl"),
        (&["bench", "--flush", "none"], "--flush applies"),
        (&["bench", "--rounds", "10", "--ops", "5"], "--rounds 10 needs at least as many --ops"),
        (&["bench", "--clients", "64", "--inflight", "1,2"], "need 128 client ids"),
        (&["bench", "--key-size", "6", "--keys", "1000"], "keys of 6 bytes cannot name 1000 keys"),
        (&["bench", "--keys", "100000000", "--value-size", "64K", "--ops", "1"], "need up to"),
        (&["bench", "--ops", "10", "--json", "/nonexistent-dir/x.json"], "cannot write /nonexistent-dir/x.json"),
        (&["bench", "--fault-node", "3:stall@1s"], "there is no node 3 (the cluster has nodes 0 to 2)"),
        (
            &["bench", "--fault-node", "0:fail@1s"],
            "node 0 holds the one copy of the index of raw, pdpm-direct, pdpm-central",
        ),
        (
            &["bench", "--fault-node", "0:stall@1s", "--systems", "swarm-kv,raw"],
            "of the index of raw; fault a node from 1",
        ),
        (&["bench", "--fault-node", "1:stall@5s", "--duration", "2s"], "starts at or after the end of the 2s run"),
        (&["bench", "--fault-node", "1:stall@1s", "--fault-node", "1:fail@2s"], "overlap on node 1"),
        (&["bench", "--fault-node", "1:stall@1s", "--inflight", "1,2"], "one in-flight setting"),
        (&["bench", "--backend", "rdma", "--fault-node", "1:stall@1s"], "--backend rdma does not have"),
        (&["bench", "--backend", "sim", "--fault-node", "1:fail@1s+1s"], "cannot bring a failed node back"),
        (&["bench", "--bucket", "10ms"], "--bucket applies to timed runs"),
        (&["bench", "--duration", "1s", "--bucket", "2s"], "longer than the run"),
    ];
    for (args, expect) in cases {
        let line = fails(args, 1);
        assert!(line.contains(expect), "swarm {args:?}: {line:?} lacks {expect:?}");
    }
}

/// SWARM Table 2 in the simulator, in the JSON shape the issue fixes.
#[test]
fn sim_gives_table_2_in_the_fixed_json_shape() {
    let args = ["--backend", "sim", "--keys", "500", "--ops", "2000", "--seed", "3"];
    let (out, j, files) = bench(&args);
    assert!(out.contains("rtt p50") && out.contains("vs raw"), "{out}");
    // pDPM Table 1: pDPM-Direct 1 / 4; pDPM-Central an RPC and a READ, or
    // an RPC and the coordinator's WRITE to the data nodes; Clover a READ
    // of the cursor, and a WRITE and a CAS. FUSEE: a get
    // reads the object and the slot (a lapsed view lease is renewed in
    // that roundtrip), an update writes the object, then SNAPSHOT's two
    // phases; in this run an update takes one roundtrip more at p99 (a
    // renewal of the view lease before its CASes takes one, as does
    // SNAPSHOT's Rule 2).
    // (name, [get p50, p99], [update p50, p99])
    let table = [
        ("raw", [1, 1], [1, 1]),
        ("dm-abd", [2, 2], [2, 2]),
        ("swarm-kv", [1, 1], [1, 1]),
        ("pdpm-direct", [1, 1], [4, 4]),
        ("pdpm-central", [2, 2], [2, 2]),
        ("clover", [1, 1], [2, 2]),
        ("fusee", [1, 1], [3, 4]),
    ];
    for (name, get, update) in table {
        let s = system(&j, name);
        assert!(s["throughput_ops"].as_f64().unwrap() > 0.0);
        for (op, rtt) in [("get", get), ("update", update)] {
            let o = &s["ops"][op];
            assert!(o["count"].as_u64().unwrap() > 0, "{name} {op}");
            assert!(
                o["p50_us"].as_f64().unwrap() > 0.0 && o["p99_us"].as_f64().unwrap() >= o["p50_us"].as_f64().unwrap()
            );
            assert_eq!((o["rtt_p50"].as_u64(), o["rtt_p99"].as_u64()), (Some(rtt[0]), Some(rtt[1])), "{name} {op}");
        }
        let ops = s["ops"].as_object().unwrap();
        assert_eq!(ops.keys().collect::<Vec<_>>(), ["get", "update"], "YCSB-B has gets and updates only");
    }
    assert_eq!(j["config"]["workload"], "b");
    assert_eq!(j["config"]["backend"], "sim");
    assert_eq!(j["systems"].as_array().unwrap().len(), table.len());
    for plot in ["ycsb-b-get-cdf", "ycsb-b-update-cdf", "ycsb-b-throughput-inflight"] {
        for ext in ["svg", "png"] {
            assert!(files.contains(&format!("{plot}.{ext}")), "{plot}.{ext} missing: {files:?}");
        }
    }
    // The same seed replays the same virtual run.
    let (_, again, _) = bench(&args);
    assert_eq!(j["systems"], again["systems"]);
}

/// Values whose lengths vary (`--value-size MIN..MAX`, YCSB's uniform
/// field length): every write draws its length from the range, the report
/// and its JSON say so, and the stores size themselves for the largest.
/// (What Clover's buffers sized by the value save shows over many keys,
/// where the chunks of each size class are filled: the README's figures.)
#[test]
fn values_whose_lengths_vary() {
    let (out, j, _) = bench(&[
        "--backend",
        "sim",
        "--systems",
        "raw,clover,swarm-kv",
        "--workload",
        "a",
        "--keys",
        "500",
        "--ops",
        "1000",
        "--seed",
        "5",
        "--value-size",
        "32..1K",
    ]);
    assert!(out.contains("values of 32 to 1024 B"), "{out}");
    assert_eq!((j["config"]["value_min"].as_u64(), j["config"]["value_size"].as_u64()), (Some(32), Some(1024)));
    for name in ["raw", "clover", "swarm-kv"] {
        assert!(system(&j, name)["ops"]["update"]["count"].as_u64().unwrap() > 0, "{name}");
    }
}

#[test]
fn sim_sweeps_inflight_and_runs_the_other_workloads() {
    let (out, j, _) = bench(&[
        "--backend",
        "sim",
        "--keys",
        "200",
        "--ops",
        "400",
        "--inflight",
        "1,2",
        "--clients",
        "2",
        "--no-plots",
    ]);
    assert!(out.contains("2 in flight"), "{out}");
    let s = system(&j, "swarm-kv");
    let sweep = s["sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 2);
    assert_eq!(sweep[1]["inflight"], 2);
    assert_eq!(s["throughput_ops"], sweep[0]["throughput_ops"]);
    for w in ["a", "c", "d", "f"] {
        let (_, j, _) = bench(&["--backend", "sim", "--keys", "100", "--ops", "200", "--workload", w, "--no-plots"]);
        let ops = system(&j, "dm-abd")["ops"].as_object().unwrap().clone();
        let expect: &[&str] = match w {
            "a" => &["get", "update"],
            "c" => &["get"],
            "d" => &["get", "insert"],
            _ => &["get", "rmw"],
        };
        assert_eq!(ops.keys().collect::<Vec<_>>(), expect, "workload {w}");
    }
}

/// Rounds: every measured operation counted once, the systems taking
/// turns on fresh stores, with the same roundtrips as one round.
#[test]
fn rounds_add_up_to_the_whole_run() {
    let args = ["--backend", "sim", "--keys", "300", "--ops", "1000", "--rounds", "3", "--no-plots"];
    let (_, j, _) = bench(&args);
    assert_eq!(j["config"]["rounds"], 3);
    for (name, rtt) in [("raw", 1), ("dm-abd", 2), ("swarm-kv", 1)] {
        let s = system(&j, name);
        let count = s["ops"]["get"]["count"].as_u64().unwrap() + s["ops"]["update"]["count"].as_u64().unwrap();
        assert_eq!(count, 1000, "{name}: 334 + 333 + 333 measured operations");
        assert_eq!(s["load"]["count"], 900, "{name}: each round loads its own store");
        assert_eq!(s["ops"]["get"]["rtt_p50"], rtt, "{name}");
        assert!(s["throughput_ops"].as_f64().unwrap() > 0.0);
    }
}

/// The availability experiment in the simulator: a stall of node 1 in
/// each system's 20 ms of virtual time, a timeline of 1 ms buckets in the
/// JSON, the summary in the text, and the availability plot.
#[test]
fn sim_fault_run_has_a_timeline_and_a_plot() {
    let args = [
        "--backend",
        "sim",
        "--keys",
        "500",
        "--fault-node",
        "1:stall@5ms+5ms",
        "--duration",
        "20ms",
        "--bucket",
        "1ms",
    ];
    let (out, j, files) = bench(&args);
    assert!(out.contains("over time") && out.contains("faults 1:stall@5ms+5ms"), "{out}");
    assert_eq!(j["config"]["timed"]["faults"][0]["node"], 1);
    assert_eq!(j["config"]["rounds"], 1);
    for name in ["raw", "dm-abd", "swarm-kv"] {
        let s = system(&j, name);
        let buckets = s["timeline"]["buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), 20, "{name}");
        assert!(buckets.iter().all(|b| b["ops"].as_u64().unwrap() > 0), "{name}: every bucket has operations");
        assert!(s["availability"]["before"]["throughput_ops"].as_f64().unwrap() > 0.0, "{name}");
        assert!(s["availability"]["during_of_before"].as_f64().is_some(), "{name}");
        assert_eq!(s["capped"], false, "{name}");
    }
    let raw = system(&j, "raw");
    assert!(raw["ops"]["get"]["errors"].as_u64().unwrap() > 0, "RAW's keys on the stalled node time out");
    for ext in ["svg", "png"] {
        assert!(files.contains(&format!("ycsb-b-availability.{ext}")), "{files:?}");
    }
}

/// A stall on a shm cluster shared by worker processes: the parent
/// injects it, the run completes, each worker's timeline is merged.
#[test]
fn shm_processes_with_a_stall() {
    let (out, j, _) = bench(&[
        "--keys",
        "1000",
        "--clients",
        "2",
        "--processes",
        "2",
        "--systems",
        "swarm-kv",
        "--fault-node",
        "1:stall@100ms+100ms",
        "--duration",
        "300ms",
        "--bucket",
        "50ms",
        "--no-plots",
    ]);
    assert!(out.contains("over time"), "{out}");
    let s = system(&j, "swarm-kv");
    assert_eq!(s["timeline"]["buckets"].as_array().unwrap().len(), 6);
    assert!(s["ops"]["get"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn shm_threads_and_processes() {
    let (out, j, _) = bench(&["--keys", "1000", "--ops", "2000", "--clients", "2", "--systems", "raw,swarm-kv"]);
    assert!(out.contains("swarm-kv") && !out.contains("dm-abd"), "{out}");
    assert_eq!(j["systems"].as_array().unwrap().len(), 2);
    assert_eq!(system(&j, "raw")["ops"]["get"]["rtt_p50"], 1);
    let (_, j, _) = bench(&[
        "--keys",
        "1000",
        "--ops",
        "1000",
        "--clients",
        "2",
        "--processes",
        "2",
        "--systems",
        "dm-abd",
        "--workload",
        "a",
        "--no-plots",
    ]);
    let s = system(&j, "dm-abd");
    let count = s["ops"]["get"]["count"].as_u64().unwrap() + s["ops"]["update"]["count"].as_u64().unwrap();
    assert_eq!(count, 2000, "both processes' clients are counted");
    assert_eq!(s["ops"]["update"]["rtt_p50"], 2);
    assert_eq!(s["load"]["count"], 5000, "five rounds by default, each loading its store");
}
