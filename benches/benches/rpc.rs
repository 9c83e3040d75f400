//! One RPC against one READ on the in-process shared-memory backend: a
//! server thread beside node 0 (the bare server, spinning while requests
//! come), a client on this thread calling `ping` with a 64-byte body, and
//! the same client reading 64 bytes. Without injected latency the ratio is
//! what an RPC costs in CPU and cache-line transfers between two cores over
//! a read; with a 1 µs roundtrip injected it is what a call costs over the
//! network roundtrip it counts as (the request's WRITE; the answer lands in
//! the client's inbox, polled locally).
//!
//! `cargo bench -p swarm-benches --bench rpc` (the ratio: divide the
//! `rpc_ping` times by the `read_64B` times of the same latency)

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swarm_backend_shm::ShmCluster;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::msg::area::Geometry;
use swarm_core::substrate::msg::rpc::{Channel, method};
use swarm_core::substrate::msg::server::{self, Bare, ThreadShell};
use swarm_core::substrate::space::Region;
use swarm_core::{Memory, NodeId, RemoteAddr};

const NODE: NodeId = NodeId(0);
const SIZE: u64 = 16 << 20;
/// A call's time-out: long enough never to fire here.
const TIMEOUT_NS: u64 = 1_000_000_000;

fn rpc(c: &mut Criterion) {
    let cluster = ShmCluster::in_process(1, SIZE).expect("in-process cluster");
    block_on(Region::format(&cluster.memory(), NODE, SIZE, 1 << 20)).expect("format");
    let stop = Arc::new(AtomicBool::new(false));
    let shell = ThreadShell::new(stop.clone());
    let server_mem = cluster.memory();
    let server = thread::spawn(move || block_on(server::serve(server_mem, NODE, Geometry::default(), Bare, &shell)));
    let body = [0x5au8; 64];
    let clock = SystemClock::starting_now();
    let mut g = c.benchmark_group("rpc");
    g.throughput(Throughput::Elements(1));
    for rtt_us in [0u64, 1] {
        let mem = cluster.memory().with_latency(Duration::from_micros(rtt_us));
        let mut ch = loop {
            match block_on(Channel::connect(&mem, NODE, 1)) {
                Ok(ch) => break ch,
                // The server is still starting.
                Err(_) => thread::sleep(Duration::from_millis(1)),
            }
        };
        g.bench_function(format!("read_64B_rtt{rtt_us}us"), |b| {
            b.iter(|| block_on(mem.read(RemoteAddr::new(NODE, black_box(4096)), 64)).expect("read"))
        });
        g.bench_function(format!("rpc_ping_64B_rtt{rtt_us}us"), |b| {
            b.iter(|| {
                let r = block_on(ch.call(&mem, &clock, TIMEOUT_NS, method::PING, black_box(&body))).expect("call");
                assert_eq!(r.body.len(), 64);
            })
        });
    }
    g.finish();
    stop.store(true, Ordering::Relaxed);
    server.join().expect("server thread").expect("server");
}

criterion_group!(benches, rpc);
criterion_main!(benches);
