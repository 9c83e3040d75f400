//! The flush modes of the cxl backend compared on one file mapping (tmpfs,
//! so the cost measured is the CPU's: the write-backs, invalidations and
//! fences that each mode adds to an operation, not a device's latency):
//! the write-then-CAS pipeline that publishes a value, a 64-byte read and a
//! lone CAS, in mode `none`, `persist` with each write-back instruction the
//! CPU has (`clwb`, `clflushopt`, `clflush`) and `noncoherent`. Each
//! benchmark also checks, once, that its handle flushed the lines the mode
//! promises.
//!
//! `cargo bench -p swarm-benches --bench cxl_flush`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swarm_backend_cxl::{CpuFlush, CxlCluster, CxlConfig, CxlMemory, FlushInstr, FlushMode, Flusher};
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::read_word;
use swarm_core::{Memory, NodeId, Op, RemoteAddr};

const NODE: NodeId = NodeId(0);
const DATA: u64 = 4096;
const WORD: u64 = 64;

/// The handles to compare: a name and a flusher.
fn variants() -> Vec<(String, Flusher)> {
    let cpu = CpuFlush::detect();
    let mut v = vec![("none".to_string(), Flusher::new(FlushMode::None).expect("mode none"))];
    for instr in [FlushInstr::Clwb, FlushInstr::Clflushopt, FlushInstr::Clflush] {
        if cpu.supports(instr) {
            let f = Flusher::with_writeback(FlushMode::Persist, instr).expect("supported");
            v.push((format!("persist_{instr:?}").to_lowercase(), f));
        }
    }
    if let Ok(f) = Flusher::new(FlushMode::NonCoherent) {
        v.push(("noncoherent".to_string(), f));
    }
    v
}

fn publish(mem: &CxlMemory, t: &mut u64, data: &[u8; 64]) {
    let ops = [Op::Write { offset: DATA, data: black_box(data) }, Op::Cas { offset: WORD, expected: *t, new: *t + 1 }];
    let outs = block_on(mem.pipeline(NODE, &ops)).expect("pipeline");
    *t = outs[1].cas().expect("cas output") + 1;
}

fn cxl_flush(c: &mut Criterion) {
    let path = PathBuf::from(format!("/dev/shm/swarm-cxl-flush-bench-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cluster = CxlCluster::create(&[&path], 1, 1 << 20, &CxlConfig::default()).expect("cluster on /dev/shm");
    let data = [0x5au8; 64];
    let mut g = c.benchmark_group("cxl_flush");
    g.throughput(Throughput::Elements(1));
    for (name, flusher) in variants() {
        let mode = flusher.mode();
        let mem = cluster.memory_with(flusher);
        let mut t = block_on(read_word(&mem, RemoteAddr::new(NODE, WORD))).expect("read");

        // What one publication costs in flushes, checked before timing it.
        mem.persistence().reset_stats();
        publish(&mem, &mut t, &data);
        let s = mem.persistence().stats();
        let lines = if mode == FlushMode::None || !cfg!(target_arch = "x86_64") { 0 } else { 2 };
        assert_eq!(s.lines_written_back, lines, "{name}: {s:?}");
        println!("{name}: one write+CAS pipeline = {s:?}");

        g.bench_function(format!("write_64B+cas_pipeline/{name}"), |b| b.iter(|| publish(&mem, &mut t, &data)));
        g.bench_function(format!("read_64B/{name}"), |b| {
            b.iter(|| block_on(mem.read(RemoteAddr::new(NODE, black_box(DATA)), 64)).expect("read"))
        });
        g.bench_function(format!("cas/{name}"), |b| {
            b.iter(|| {
                let prev = block_on(mem.cas(RemoteAddr::new(NODE, black_box(WORD)), t, t + 1)).expect("cas");
                t = prev + 1;
            })
        });
    }
    g.finish();
    drop(cluster);
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, cxl_flush);
criterion_main!(benches);
