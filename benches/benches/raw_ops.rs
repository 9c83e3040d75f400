//! Raw memory operations on the in-process shared-memory backend, without
//! injected latency: what one operation costs the client's CPU (the atomics,
//! bounds checks, buffer recycling and future machinery), the floor under
//! every protocol's cost on this backend.
//!
//! `cargo bench -p swarm-benches --bench raw_ops`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swarm_backend_shm::ShmCluster;
use swarm_core::substrate::exec::block_on;
use swarm_core::{Memory, NodeId, Op, RemoteAddr};

const NODE: NodeId = NodeId(0);
const DATA: u64 = 4096;
const WORD: u64 = 64;

fn raw_ops(c: &mut Criterion) {
    let cluster = ShmCluster::in_process(1, 1 << 20).expect("in-process cluster");
    let mem = cluster.memory();
    let data = [0x5au8; 64];
    let mut g = c.benchmark_group("raw_ops");
    g.throughput(Throughput::Elements(1));

    g.bench_function("read_64B", |b| {
        b.iter(|| block_on(mem.read(RemoteAddr::new(NODE, black_box(DATA)), 64)).expect("read"))
    });
    g.bench_function("write_64B", |b| {
        b.iter(|| block_on(mem.write(RemoteAddr::new(NODE, black_box(DATA)), black_box(&data))).expect("write"))
    });
    let mut v = 0;
    g.bench_function("cas", |b| {
        b.iter(|| {
            let prev = block_on(mem.cas(RemoteAddr::new(NODE, black_box(WORD)), v, v + 1)).expect("cas");
            v = prev + 1;
        })
    });
    let mut t = block_on(swarm_core::substrate::memory::read_word(&mem, RemoteAddr::new(NODE, WORD))).expect("read");
    g.bench_function("write_64B+cas_pipeline", |b| {
        b.iter(|| {
            let ops =
                [Op::Write { offset: DATA, data: black_box(&data) }, Op::Cas { offset: WORD, expected: t, new: t + 1 }];
            let outs = block_on(mem.pipeline(NODE, &ops)).expect("pipeline");
            t = outs[1].cas().expect("cas output") + 1;
        })
    });
    g.finish();
}

criterion_group!(benches, raw_ops);
criterion_main!(benches);
