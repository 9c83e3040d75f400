//! The harness against the real stores: in the simulator (exact
//! roundtrips, SWARM Table 2) and on in-process shared memory with threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use swarm_backend_shm::ShmCluster;

use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::systems;
use swarm_ycsb::report::Report;
use swarm_ycsb::runner::{KEEP_EVERY_NS, RunSpec, SystemRun, Timed};
use swarm_ycsb::sim::{format_cluster, run_sim};
use swarm_ycsb::threads::{Extras, run_threads};
use swarm_ycsb::{Distribution, OpKind, Workload};

fn spec(workload: Workload) -> RunSpec {
    RunSpec {
        workload,
        distribution: Distribution::Zipf,
        keys: 200,
        key_size: 24,
        value_size: 64,
        value_min: 64,
        replicas: 3,
        clients: 2,
        inflight: vec![1, 2],
        warmup: 20,
        ops: 200,
        seed: 5,
        warm_cache: true,
        timed: None,
    }
}

/// SWARM Table 2 once locations are cached: one client whose load phase
/// inserted (and so cached) every key.
#[test]
fn sim_gives_the_papers_roundtrips_for_ycsb_b() {
    let s = RunSpec { clients: 1, inflight: vec![1], ops: 400, ..spec(Workload::B) };
    let progress = Arc::new(AtomicU64::new(0));
    let mut runs = Vec::new();
    for &system in systems::ALL {
        let result = run_sim(&s, system, Some(progress.clone())).unwrap();
        assert_eq!(result.load.op(OpKind::Insert).count(), 200, "{system:?}");
        assert_eq!(result.runs.len(), 1);
        assert_eq!(result.runs[0].count(), 400, "{system:?}");
        runs.push(SystemRun { system, result });
    }
    assert_eq!(progress.load(Ordering::Relaxed), systems::ALL.len() as u64 * s.total_ops());
    let report = Report::new(&s, "sim".into(), serde_json::json!({}), true, &runs);
    let j = report.json();
    let rtt = |name: &str, op: &str, q: &str| {
        let sys = j["systems"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap();
        sys["ops"][op][q].as_u64().unwrap()
    };
    // (pDPM Table 1: pDPM-Direct 1 / 4.)
    for (name, get, update) in [("raw", 1, 1), ("dm-abd", 2, 2), ("swarm-kv", 1, 1), ("pdpm-direct", 1, 4)] {
        assert_eq!((rtt(name, "get", "rtt_p50"), rtt(name, "update", "rtt_p50")), (get, update), "{name}");
        assert_eq!((rtt(name, "get", "rtt_p99"), rtt(name, "update", "rtt_p99")), (get, update), "{name}");
    }
    // Each store's memory per key after the run (SWARM Table 3's measure):
    // RAW's one copy holds less than the replicated stores' three.
    let live = |name: &str| {
        let sys = j["systems"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap();
        assert_eq!(sys["memory"]["keys"].as_u64(), Some(200), "{name}");
        sys["memory"]["live_bytes_per_key"].as_f64().unwrap()
    };
    assert!(live("raw") > 0.0 && live("raw") < live("dm-abd") && live("raw") < live("swarm-kv"));
    assert!(report.text().contains("memory per key after the run"));
    // The same seed replays the same virtual run.
    let again = run_sim(&s, systems::from_name("swarm-kv").unwrap(), None).unwrap();
    let first = &runs[2].result.runs[0];
    assert_eq!(again.runs[0].window_ns(), first.window_ns());
    print!("{}", report.text());
}

#[test]
fn sim_runs_every_workload() {
    for w in Workload::ALL {
        let s = RunSpec { keys: 100, ops: 100, inflight: vec![2], ..spec(w) };
        let mix = w.mix();
        for &system in systems::ALL {
            let r = run_sim(&s, system, None).unwrap_or_else(|e| panic!("{w} {system:?}: {e}"));
            let m = &r.runs[0];
            assert_eq!(m.count(), 200, "{w} {system:?}");
            // Median roundtrips as in SWARM Table 2 (a read-modify-write is
            // a get and an update), the caches warmed; D's gets of keys
            // another handle just inserted miss the cache.
            let (get, update) = (system.info().roundtrips.get, system.info().roundtrips.update);
            assert_eq!(m.op(OpKind::Get).rtt_quantile(0.5), get, "{w} {system:?}");
            // The tail too, but for SWARM-KV and pDPM-Direct only without
            // writes: four writers on 100 Zipfian keys contend, and a
            // contended Safe-Guess read takes more roundtrips (SWARM
            // §7.8), a pDPM-Direct get of a key being written waits for
            // its lock, a Clover get hops along the versions written since
            // its cursor (the pDPM paper measures Clover's p99 on YCSB-A at 6 roundtrips),
            // and a FUSEE get of a key another writer changed finds its
            // cached entry stale and looks the key up again.
            let contended = matches!(system.name(), "swarm-kv" | "pdpm-direct" | "clover" | "fusee");
            if w != Workload::D && (!contended || w == Workload::C) {
                assert_eq!(m.op(OpKind::Get).rtt_quantile(0.99), get, "{w} {system:?}");
            }
            if mix.update > 0.0 {
                assert_eq!(m.op(OpKind::Update).rtt_quantile(0.5), update, "{w} {system:?}");
            }
            if mix.rmw > 0.0 {
                assert_eq!(m.op(OpKind::Rmw).rtt_quantile(0.5), get + update, "{w} {system:?}");
            }
            assert_eq!(m.op(OpKind::Rmw).count() > 0, mix.rmw > 0.0, "{w}");
            assert_eq!(m.op(OpKind::Insert).count() > 0, mix.insert > 0.0, "{w}");
            // Every key read was loaded or inserted before.
            assert_eq!(m.op(OpKind::Get).summary(1).not_found, 0, "{w} {system:?}");
        }
    }
}

/// Clover's chain hops per get and per update, the pDPM paper's measure
/// of its chains under YCSB-A (§6), in the report's text and JSON: writers
/// contending on a few keys make both kinds of hops, and a get hops less
/// often than an update (its cursor is the tail unless another client
/// wrote since; a writer's CAS finds the other writers' versions).
#[test]
fn sim_reports_clovers_chain_hops_per_operation() {
    let s = RunSpec { keys: 20, clients: 4, inflight: vec![1], ops: 2000, ..spec(Workload::A) };
    let system = systems::from_name("clover").unwrap();
    let runs = vec![SystemRun { system, result: run_sim(&s, system, None).unwrap() }];
    let report = Report::new(&s, "sim".into(), serde_json::json!({}), true, &runs);
    let j = report.json();
    let run = &j["systems"][0];
    let (get, update) = (run["hops_per_get"].as_f64().unwrap(), run["hops_per_update"].as_f64().unwrap());
    assert!(get > 0.0 && get < update, "hops per get {get}, per update {update}");
    let text = report.text();
    let line = text.lines().find(|l| l.starts_with("clover") && l.contains("per get")).unwrap();
    assert!(line.contains(&format!("{get:.2} per get")), "{line}");
    assert!(text.contains("chain hops per operation"), "{text}");
}

/// The measured phase sees the steady state: the warm-up works off the
/// recycling of the load's writes, so that a measured phase without
/// writes (YCSB-C) that runs long enough for the background passes to
/// come round recycles nothing. (When the warm-up left the load to those
/// passes, they recycled its writes here.)
#[test]
fn the_warm_up_recycles_the_loads_writes() {
    let run_ns = 3 * KEEP_EVERY_NS;
    let timed = Some(Timed { run_ns, bucket_ns: run_ns, faults: Vec::new() });
    let s = RunSpec { clients: 1, inflight: vec![1], ops: 10_000_000, timed, ..spec(Workload::C) };
    for name in ["swarm-kv", "dm-abd"] {
        let r = run_sim(&s, systems::from_name(name).unwrap(), None).unwrap();
        let m = &r.runs[0];
        assert!(m.count() > 1000 && m.window_ns() >= run_ns, "{name}: {} ops in {} ns", m.count(), m.window_ns());
        assert_eq!(m.paths.entries_recycled, 0, "{name}: the load's writes were recycled while measuring");
    }
}

#[test]
fn threads_on_in_process_shm() {
    let s = RunSpec { clients: 2, inflight: vec![1, 2], ..spec(Workload::A) };
    for &system in systems::ALL {
        let size = s.node_bytes(system);
        let cluster = ShmCluster::in_process(s.replicas, size).unwrap();
        block_on(format_cluster(&cluster.memory(), &s.store_config(system), size, SystemClock::unix_us())).unwrap();
        let extras = Extras { serve: true, ..Extras::default() };
        let r = run_threads(&s, system, 0..s.clients, || cluster.memory(), SystemClock::starting_now(), extras)
            .unwrap_or_else(|e| panic!("{system:?}: {e}"));
        assert_eq!(r.load.count(), 200);
        assert_eq!(r.runs[1].count(), 400);
        assert!(r.runs[1].window_ns() > 0);
    }
}

/// A store without concurrency control (RAW) run by two clients: a get
/// that found a copy torn for good is counted as failed, and the report
/// says why below the table.
#[test]
fn torn_raw_copies_are_counted_and_explained() {
    let s = RunSpec { inflight: vec![1], ..spec(Workload::A) };
    let raw = systems::from_name("raw").unwrap();
    let result = run_sim(&s, raw, None).unwrap();
    let mut report = Report::new(&s, "sim".into(), serde_json::json!({}), true, &[SystemRun { system: raw, result }]);
    assert!(!report.text().contains("left torn"), "no torn copy, no note");
    // Those of the warm-ups are reported too, apart.
    report.systems[0].warmup_errors = 3;
    let text = report.text();
    assert!(text.contains("note: raw: 0 measured get(s) and 3 in the warm-ups found a copy"), "{text}");
    assert_eq!(report.json()["systems"][0]["warmup_errors"], 3);
    let ops = &mut report.systems[0].runs[0].ops;
    ops.iter_mut().find(|(k, _)| *k == OpKind::Get).unwrap().1.errors = 2;
    let text = report.text();
    assert!(
        text.contains("note: raw: 2 measured get(s) and 3 in the warm-ups found a copy that two clients' concurrent updates left torn"),
        "{text}"
    );
}

/// A worker process's result carries its warm-ups' errors to the parent,
/// which adds them up over clients and rounds.
#[test]
fn warm_up_errors_cross_from_workers_and_add_up() {
    let one = swarm_ycsb::ClientResult { warmup_errors: 2, ..Default::default() };
    let back = swarm_ycsb::ClientResult::from_json(&one.to_json()).unwrap();
    assert_eq!(back.warmup_errors, 2);
    let mut all = back.clone();
    all.merge_foreign(&back);
    all.append(&one);
    assert_eq!(all.warmup_errors, 6);
    let mut v = one.to_json();
    v.as_object_mut().unwrap().remove("warmup_errors");
    assert!(swarm_ycsb::ClientResult::from_json(&v).is_err(), "a result without them is malformed");
}
