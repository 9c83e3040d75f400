//! Timed runs with memory-node faults (the availability experiment): in
//! the simulator (virtual time, so what each bucket holds is exact and
//! replays), and on in-process shared memory with a stall that the
//! injector heals. No timing is asserted on real memory.

use swarm_backend_shm::{Fault, ShmCluster};
use swarm_core::NodeId;
use swarm_core::kv::{Guarantee, System};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::systems;
use swarm_ycsb::fault::{FaultKind, NodeFault};
use swarm_ycsb::plot::write_plots;
use swarm_ycsb::report::Report;
use swarm_ycsb::runner::{RunSpec, SystemRun, Timed};
use swarm_ycsb::sim::{format_cluster, run_sim};
use swarm_ycsb::threads::{Extras, run_threads};
use swarm_ycsb::timeline::{Point, Timeline};
use swarm_ycsb::{Distribution, Workload};

const MS: u64 = 1_000_000;

/// YCSB-B on 200 keys, 2 clients, measured for `run_ms` in buckets of
/// `bucket_ms` with `faults`; at most `ops` operations per client.
fn spec(run_ms: u64, bucket_ms: u64, faults: Vec<NodeFault>, ops: u64) -> RunSpec {
    RunSpec {
        workload: Workload::B,
        distribution: Distribution::Zipf,
        keys: 200,
        key_size: 24,
        value_size: 64,
        value_min: 64,
        replicas: 3,
        clients: 2,
        inflight: vec![1],
        warmup: 50,
        ops,
        seed: 9,
        warm_cache: true,
        timed: Some(Timed { run_ns: run_ms * MS, bucket_ns: bucket_ms * MS, faults }),
    }
}

fn timeline(r: &SystemRun) -> &Timeline {
    r.result.runs[0].timeline.as_ref().expect("a timed run has a timeline")
}

/// The buckets that start in `from_ms..to_ms`.
fn between(points: &[Point], from_ms: u64, to_ms: u64) -> Vec<Point> {
    points.iter().filter(|p| (from_ms as f64 / 1e3..to_ms as f64 / 1e3).contains(&p.t_s)).copied().collect()
}

/// Runs every system in the simulator; checks what every timed run
/// shares: buckets that cover the run, operations in every bucket before
/// the fault, none failed there, and the same run again from the seed.
fn sim_runs(s: &RunSpec, fault_ms: u64) -> Vec<SystemRun> {
    let t = s.timed.as_ref().unwrap();
    let mut runs = Vec::new();
    for &system in systems::ALL {
        let result = run_sim(s, system, None).unwrap_or_else(|e| panic!("{system}: {e}"));
        let run = SystemRun { system, result };
        let tl = timeline(&run);
        let points = tl.points();
        assert_eq!(points.len() as u64, t.run_ns / t.bucket_ns, "{system}: buckets cover the run");
        assert_eq!(points.last().unwrap().t_s, (t.run_ns - t.bucket_ns) as f64 / 1e9);
        assert!(!run.result.runs[0].capped, "{system}: the cap is never reached in virtual time");
        for p in between(&points, 0, fault_ms) {
            assert!(p.ops > 0 && p.errors == 0, "{system}: before the fault: {p:?}");
        }
        let again = run_sim(s, system, None).unwrap();
        assert_eq!(timeline(&SystemRun { system, result: again }).points(), points, "{system}: replays");
        runs.push(run);
    }
    runs
}

fn named(runs: &[SystemRun], name: &str) -> System {
    runs.iter().map(|r| r.system).find(|s| s.name() == name).unwrap()
}

/// A stall of node 1 from 10 ms to 20 ms of a 30 ms run: RAW's
/// operations on node 1 time out while it lasts (the simulator's clients
/// give up after 50 µs) and only then; the stores that survive a minority
/// lose no operation, and their tail grows in the stall; pDPM-Direct's
/// gets of the keys whose primary is node 1 time out in the stall (its
/// writes there wait for the node, holding the lock), and none after.
#[test]
fn sim_stall_shows_in_its_window() {
    let stall = NodeFault { node: 1, kind: FaultKind::Stall, start_ns: 10 * MS, duration_ns: Some(10 * MS) };
    let s = spec(30, 2, vec![stall], 1_000_000);
    let runs = sim_runs(&s, 10);
    for r in &runs {
        let points = timeline(r).points();
        let during = between(&points, 10, 20);
        let after = between(&points, 22, 30);
        assert!(after.iter().all(|p| p.ops > 0 && p.errors == 0), "{}: after the stall: {after:?}", r.system);
        let before_p99 = between(&points, 0, 10).iter().map(|p| p.p99_us).fold(0.0, f64::max);
        let during_p99 = during.iter().map(|p| p.p99_us).fold(0.0, f64::max);
        let errors: u64 = during.iter().map(|p| p.errors).sum();
        match r.system.guarantee() {
            g if g.survives_minority() => {
                assert_eq!(errors, 0, "{}: a majority stays up", r.system);
                assert!(during_p99 > before_p99, "{}: the tail grows in the stall: {during:?}", r.system);
            }
            Guarantee::LinearizablePrimary => {
                assert!(errors > 0, "{}: the keys whose primary is node 1 time out: {during:?}", r.system)
            }
            _ => {
                assert!(during.iter().all(|p| p.errors > 0), "{}: RAW's keys on node 1 time out: {during:?}", r.system)
            }
        }
    }
    let raw = named(&runs, "raw");
    let a = timeline(&runs[0]).availability(Some((10 * MS, 20 * MS)));
    assert_eq!(runs[0].system, raw);
    assert!(a.of_before(a.during).unwrap() < 1.0 && a.errors > 0, "{a:?}");
    // The report has the timeline and the availability; the plots are
    // written, the availability figure among them.
    let report = Report::new(&s, "sim".into(), serde_json::json!({}), true, &runs);
    let text = report.text();
    assert!(text.contains("over time") && text.contains("1:stall@10ms+10ms"), "{text}");
    let j = report.json();
    let sys = &j["systems"][0];
    assert_eq!(sys["timeline"]["buckets"].as_array().unwrap().len(), 15);
    assert!(sys["availability"]["during_of_before"].as_f64().unwrap() < 1.0);
    let dir = std::env::temp_dir().join(format!("swarm-ycsb-faults-{}", std::process::id()));
    let files = write_plots(&dir, &s, &runs, true).unwrap();
    for ext in ["svg", "png"] {
        let f = dir.join(format!("ycsb-b-availability.{ext}"));
        assert!(files.contains(&f), "{files:?}");
        assert!(std::fs::metadata(&f).unwrap().len() > 1000, "{} is drawn", f.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Node 2 crashes (fail fast) at 10 ms of a 20 ms run, for good: RAW
/// fails the operations of its keys there from then on, and only then,
/// and so does pDPM-Direct those of the keys whose primary is there; the
/// stores that survive a minority go on without a failed operation.
#[test]
fn sim_crash_shows_from_its_start() {
    let crash = NodeFault { node: 2, kind: FaultKind::Fail, start_ns: 10 * MS, duration_ns: None };
    let runs = sim_runs(&spec(20, 2, vec![crash], 1_000_000), 10);
    for r in &runs {
        let points = timeline(r).points();
        let after = between(&points, 10, 20);
        assert!(after.iter().all(|p| p.ops > 0), "{}: the other nodes still answer: {after:?}", r.system);
        let errors: u64 = after.iter().map(|p| p.errors).sum();
        if r.system.guarantee().survives_minority() {
            assert_eq!(errors, 0, "{}: a majority stays up", r.system);
        } else {
            assert!(after.iter().all(|p| p.errors > 0), "{}: the keys on node 2 are lost: {after:?}", r.system);
        }
    }
}

/// Stalls and a failure on in-process shared memory, one system after the
/// other on fresh nodes: the runs complete, and the injector leaves every
/// node healthy.
#[test]
fn shm_run_with_a_stall_completes_and_heals() {
    let faults = vec![
        NodeFault { node: 1, kind: FaultKind::Stall, start_ns: 100 * MS, duration_ns: Some(100 * MS) },
        NodeFault { node: 2, kind: FaultKind::Stall, start_ns: 250 * MS, duration_ns: None },
    ];
    // One client: RAW's values tear under concurrent writers of one key (by
    // design), which it reports as corrupt data, and a run stops at that.
    let s = RunSpec { clients: 1, ..spec(300, 50, faults, 2_000_000) };
    for &system in systems::ALL {
        let size = s.node_bytes(system);
        let cluster = ShmCluster::in_process(s.replicas, size).unwrap();
        block_on(format_cluster(&cluster.memory(), &s.store_config(system), size, SystemClock::unix_us())).unwrap();
        let extras = Extras { faults: Some(cluster.nodes()), serve: true, ..Extras::default() };
        let r = run_threads(&s, system, 0..s.clients, || cluster.memory(), SystemClock::starting_now(), extras)
            .unwrap_or_else(|e| panic!("{system}: {e}"));
        assert_eq!(timeline(&SystemRun { system, result: r.clone() }).points().len(), 6, "{system}");
        assert!(r.runs[0].count() > 0, "{system}");
        for n in 0..3 {
            assert_eq!(cluster.fault(NodeId(n)), Some(Fault::Healthy), "{system}: node {n} healed");
        }
    }
}
