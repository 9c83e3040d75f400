//! SWARM's core objects on the in-process shared-memory backend, without
//! injected latency: what one operation costs the client's CPU beyond the
//! raw memory operations it issues (`raw_ops` measures those), one client,
//! no contention.
//!
//! - In-n-Out (§4): WRITE of one replica (value out of place and MAX of the
//!   metadata word in one pipeline, in-place copy in the background) and READ;
//! - Safe-Guess (§3.2) over 3 replicas: write and read;
//! - timestamp lock (§3.3): TRYLOCK over 3 words;
//! - max register (App. A) over 3 replicas: write and read; and MAX
//!   emulated with CAS (§4.4) on one word.
//!
//! Writer logs are never recycled, so the nodes are large (in-process
//! memory is only touched as it is written) and the measurement short.
//!
//! `cargo bench -p swarm-benches --bench core_objects`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swarm_backend_shm::{ShmCluster, ShmMemory};
use swarm_core::objects::max::cas_max;
use swarm_core::objects::tslock::{Mode, try_lock};
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::region::Region;
use swarm_core::swarm::client::ClientCtx;
use swarm_core::swarm::inout::{Layout, Replica, ReplicaCache};
use swarm_core::swarm::maxreg::{RegCache, Register};
use swarm_core::swarm::meta::Meta;
use swarm_core::swarm::safeguess;
use swarm_core::swarm::writerlog::{self, EntryHeader, LogCopy, LogGeometry};
use swarm_core::{NodeId, RemoteAddr};

const NODES: usize = 3;
/// Bytes per node: room for millions of never-recycled log entries.
const NODE_SIZE: u64 = 4 << 30;
const CHUNK: u64 = 1 << 20;
const VALUE: usize = 64;

/// A microsecond clock from the start of the benchmark (never 0).
type Clock = Box<dyn Fn() -> u64>;

fn clock() -> Clock {
    let t0 = Instant::now();
    Box::new(move || t0.elapsed().as_micros() as u64 + 1)
}

/// Three formatted in-process nodes and a client on them.
fn setup() -> (ShmCluster, ShmMemory, ClientCtx<Clock>) {
    let cluster = ShmCluster::in_process(NODES, NODE_SIZE).expect("in-process cluster");
    let mem = cluster.memory();
    let geo = LogGeometry::new(VALUE as u64, CHUNK, NODE_SIZE / CHUNK / 2).expect("log geometry");
    for n in 0..NODES {
        let node = NodeId(n as u16);
        block_on(Region::format(&mem, node, NODE_SIZE, CHUNK)).expect("format");
        block_on(writerlog::format(&mem, node, geo)).expect("writer log");
    }
    let mut ctx = ClientCtx::new(1, clock()).expect("client");
    block_on(ctx.prepare(&mem)).expect("prepare");
    (cluster, mem, ctx)
}

fn nodes() -> Vec<NodeId> {
    (0..NODES).map(|n| NodeId(n as u16)).collect()
}

/// The next tuple this client writes (fresh time, its next log entry), and
/// that entry with the header of `value`.
fn next_meta(ctx: &mut ClientCtx<Clock>, mem: &ShmMemory, value: &[u8]) -> (Meta, LogCopy) {
    let (time, place) = block_on(ctx.next_write(mem, Meta::BOTTOM)).expect("next write");
    let meta = Meta::new(time, place.slot, ctx.id);
    (meta, LogCopy { place, header: EntryHeader::of(meta, 0, 1, value) })
}

fn inout(c: &mut Criterion) {
    let (_cluster, mem, mut ctx) = setup();
    let layout = Layout::new(1, VALUE as u64).expect("layout");
    let node = NodeId(0);
    let obj = block_on(ctx.slab.alloc(&mem, node, layout.size())).expect("alloc");
    let replica = Replica { node, base: obj.offset };
    let value = [7u8; VALUE];
    let mut cache = ReplicaCache::default();
    let mut g = c.benchmark_group("inout");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write", |b| {
        b.iter(|| {
            let (meta, copy) = next_meta(&mut ctx, &mem, &value);
            let entry = block_on(ctx.logs.entries(&mem, &[node], ctx.id, copy.place, Some(ctx.slab.unleased()), 1))[0]
                .expect("entry")
                .expect("segment");
            let reply =
                block_on(replica.write(&mem, &layout, entry, cache.mine, meta, &copy.header, black_box(&value)))
                    .expect("write");
            cache.mine = meta.0.max(reply.seen.0);
        })
    });
    g.bench_function("read", |b| {
        b.iter(|| black_box(block_on(replica.read(&mem, layout, ctx.id)).expect("read").meta))
    });
    g.finish();
}

fn safe_guess(c: &mut Criterion) {
    let (_cluster, mem, mut ctx) = setup();
    let layout = Layout::new(1, VALUE as u64).expect("layout");
    let reg = block_on(Register::create(&mut ctx, &mem, &nodes(), layout)).expect("register");
    let mut cache = RegCache::default();
    let value = [7u8; VALUE];
    let mut g = c.benchmark_group("safeguess");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write", |b| {
        b.iter(|| block_on(safeguess::write(&mut ctx, &mem, &reg, &mut cache, black_box(&value))).expect("write"))
    });
    g.bench_function("read", |b| {
        b.iter(|| black_box(block_on(safeguess::read(&mut ctx, &mem, &reg, &mut cache)).expect("read").0))
    });
    g.finish();
}

fn timestamp_lock(c: &mut Criterion) {
    let (_cluster, mem, mut ctx) = setup();
    let words: Vec<Option<RemoteAddr>> =
        nodes().into_iter().map(|n| Some(block_on(ctx.slab.alloc(&mem, n, 8)).expect("alloc"))).collect();
    let mut ts = 0;
    let mut g = c.benchmark_group("tslock");
    g.throughput(Throughput::Elements(1));
    g.bench_function("try_lock", |b| {
        b.iter(|| {
            ts += 1;
            black_box(block_on(try_lock(&mem, &words, ts, Mode::Write)).expect("lock"))
        })
    });
    g.finish();
}

fn max_register(c: &mut Criterion) {
    let (_cluster, mem, mut ctx) = setup();
    let layout = Layout::new(1, VALUE as u64).expect("layout");
    let reg = block_on(Register::create(&mut ctx, &mem, &nodes(), layout)).expect("register");
    let mut cache = RegCache::default();
    let value = [7u8; VALUE];
    let mut g = c.benchmark_group("maxreg");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write", |b| {
        b.iter(|| {
            let (meta, copy) = next_meta(&mut ctx, &mem, &value);
            block_on(reg.write(&mut ctx, &mem, &mut cache, meta, &copy, black_box(&value))).expect("write")
        })
    });
    g.bench_function("read", |b| b.iter(|| black_box(block_on(reg.read(&mut ctx, &mem, &mut cache)).expect("read").0)));
    let word = block_on(ctx.slab.alloc(&mem, NodeId(0), 8)).expect("alloc");
    let mut seed = 0;
    g.bench_function("cas_max", |b| {
        b.iter(|| {
            let new = seed + 1;
            block_on(cas_max(&mem, word, seed, new)).expect("cas_max");
            seed = new;
        })
    });
    g.finish();
}

fn config() -> Criterion {
    // Short: every write takes a fresh log entry that is never recycled.
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group!(name = benches; config = config(); targets = inout, safe_guess, timestamp_lock, max_register);
criterion_main!(benches);
