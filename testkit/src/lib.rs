//! Test suites that every backend runs over its own memory: the same checks over shared memory, DAX/CXL mappings and,
//! later, RDMA.
//!
//! [`kv_suite`] does the same for a key-value store ([`swarm_core::kv`]):
//! threads insert, update, get and delete a few shared keys, and the
//! history must be linearizable for [`swarm_lincheck::Kv::lazy_unmap`].
//!
//! [`register_suite`] formats the given nodes, creates one Safe-Guess
//! register replicated on them, and runs real OS threads as SWARM clients
//! (ids `1..=clients`, each with its own [`ClientCtx`], [`SystemClock`] and
//! memory handle) doing a seeded random mix of reads and writes of unique
//! values. It records the history on the wall clock (nanoseconds since a
//! common [`Instant`]) and checks it with [`swarm_lincheck`]: every history
//! must be linearizable for a register whose initial value is 0, and every
//! value read must be exactly a value some client wrote.
//!
//! ```no_run
//! use swarm_testkit::{RegisterTest, register_suite};
//! use swarm_core::{Memory, NodeId};
//!
//! /// The suite over three nodes of any backend; `make` gives each client
//! /// thread its own memory handle.
//! fn check<M: Memory>(make: impl Fn() -> M + Sync) -> Result<(), String> {
//!     let nodes = [NodeId(0), NodeId(1), NodeId(2)];
//!     let report = register_suite(make, &nodes, &RegisterTest::default())?;
//!     println!("{report}");
//!     Ok(())
//! }
//! ```

pub mod procs;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use swarm_core::sim::Rng;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::region::Region;
use swarm_core::swarm::client::ClientCtx;
use swarm_core::swarm::inout::Layout;
use swarm_core::swarm::maxreg::{RegCache, Register};
use swarm_core::swarm::meta::MAX_CLIENT;
use swarm_core::swarm::safeguess::{self, WritePath};
use swarm_core::swarm::writerlog::{self, LogGeometry};
use swarm_core::{Memory, NodeId};
use swarm_lincheck::{CheckResult, Checker, Operation, Register as RegisterModel, RegisterOp, RegisterRet};

/// What [`register_suite`] runs.
#[derive(Clone, Copy, Debug)]
pub struct RegisterTest {
    /// Client threads, ids `1..=clients` (at most `MAX_CLIENT - 1`: the last
    /// id is the setup client's).
    pub clients: u8,
    /// Operations per client.
    pub ops_per_client: u64,
    /// Share of reads, in percent.
    pub read_percent: u64,
    /// Bytes of every written value (at least 8: the value's id comes first).
    pub value_len: usize,
    /// Seed of the operation mix.
    pub seed: u64,
    /// Bytes of every node (what the caller's memory offers).
    pub node_size: u64,
    /// Allocation chunk of the nodes (also one writer-log segment).
    pub chunk: u64,
    /// Metadata words of the register's In-n-Out objects.
    pub meta_words: u32,
}

impl Default for RegisterTest {
    /// Four clients of 1500 operations, half reads, 64-byte values, on nodes
    /// of 8 MiB with 256 KiB chunks: well under a second on two cores.
    fn default() -> Self {
        RegisterTest {
            clients: 4,
            ops_per_client: 1500,
            read_percent: 50,
            value_len: 64,
            seed: 1,
            node_size: 8 << 20,
            chunk: 256 << 10,
            meta_words: 4,
        }
    }
}

/// What one run of [`register_suite`] did.
#[derive(Clone, Debug, Default)]
pub struct RegisterReport {
    /// Operations recorded (and checked).
    pub operations: usize,
    /// Of which reads.
    pub reads: usize,
    /// Writes that took the fast path, were rewritten, or stood because a
    /// reader had locked their timestamp.
    pub writes: [usize; 3],
    /// Reads that returned the initial value (no write seen yet).
    pub initial_reads: usize,
    /// Wall-clock time of the client threads' operations.
    pub elapsed: Duration,
}

impl core::fmt::Display for RegisterReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let [fast, rewritten, locked] = self.writes;
        write!(
            f,
            "{} operations linearizable ({} reads, {} of them of the initial value; {} writes: {fast} fast, \
             {rewritten} rewritten, {locked} reader-locked) in {:.1} ms",
            self.operations,
            self.reads,
            self.initial_reads,
            fast + rewritten + locked,
            self.elapsed.as_secs_f64() * 1e3
        )
    }
}

/// The value that `client` writes as its `seq`-th write (`seq >= 1`): its
/// id `client << 32 | seq` in the first 8 bytes, then filler bytes derived
/// from the id, `len` bytes in all (at least 8).
pub fn value_of(client: u8, seq: u64, len: usize) -> Vec<u8> {
    let id = ((client as u64) << 32) | seq;
    let mut v: Vec<u8> = (0..len.max(8)).map(|i| (id.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8).collect();
    v[..8].copy_from_slice(&id.to_le_bytes());
    v
}

/// The id of a value [`value_of`] made, if `bytes` is exactly such a value
/// (0 for the empty initial value); `None` for anything else (a torn or
/// foreign value).
pub fn id_of_value(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return Some(0);
    }
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let (client, seq) = ((id >> 32) as u8, id & 0xFFFF_FFFF);
    (id >> 40 == 0 && client != 0 && seq != 0 && value_of(client, seq, bytes.len()) == bytes).then_some(id)
}

/// Formats `nodes` (a region header and a writer-log directory each, with
/// `t.chunk`-byte chunks and logs that hold `t.ops_per_client` writes of
/// `t.value_len` bytes per client) through `mem`. The nodes must be zeroed.
pub fn format_nodes<M: Memory>(mem: &M, nodes: &[NodeId], t: &RegisterTest) -> Result<LogGeometry, String> {
    let value = t.value_len.max(8) as u64;
    let per_segment = LogGeometry::new(value, t.chunk, 1).map_err(|e| format!("log geometry: {e}"))?.per_segment;
    let segments = t.ops_per_client.div_ceil(per_segment) + 2;
    let geo = LogGeometry::new(value, t.chunk, segments).map_err(|e| format!("log geometry: {e}"))?;
    for &node in nodes {
        block_on(Region::format(mem, node, t.node_size, t.chunk)).map_err(|e| format!("format {node}: {e}"))?;
        block_on(writerlog::format(mem, node, geo)).map_err(|e| format!("writer log of {node}: {e}"))?;
    }
    Ok(geo)
}

type Op = Operation<RegisterOp, RegisterRet>;

/// What one client thread recorded.
struct ClientLog {
    ops: Vec<Op>,
    writes: [usize; 3],
    initial_reads: usize,
}

/// The shared register suite: formats `nodes` through a handle from `make`,
/// creates a Safe-Guess register replicated on all of them, runs
/// `t.clients` client threads (each calls `make` for its own handle) doing
/// `t.ops_per_client` random reads and writes, and checks the history for
/// linearizability. Returns what ran, or a description of the failure: an
/// operation that failed, a value never written, or a violation with its
/// explanation.
///
/// The memory's nodes must be zeroed, and every node of it must be in
/// `nodes` or already formatted (a client prepares its log on every node).
pub fn register_suite<M, F>(make: F, nodes: &[NodeId], t: &RegisterTest) -> Result<RegisterReport, String>
where
    M: Memory,
    F: Fn() -> M + Sync,
{
    if t.clients == 0 || t.clients >= MAX_CLIENT {
        return Err(format!("{} clients: the suite runs 1 to {}", t.clients, MAX_CLIENT - 1));
    }
    let layout = Layout::new(t.meta_words, t.value_len.max(8) as u64).map_err(|e| format!("layout: {e}"))?;
    let admin = make();
    format_nodes(&admin, nodes, t)?;
    let clock = SystemClock::starting_now();
    let reg = {
        let mut ctx = std::boxed::Box::new(ClientCtx::new(MAX_CLIENT, clock).map_err(|e| format!("setup: {e}"))?);
        block_on(Register::create(&mut ctx, &admin, nodes, layout)).map_err(|e| format!("create register: {e}"))?
    };
    let origin = Instant::now();
    let start = Barrier::new(t.clients as usize);
    let logs: Vec<Result<ClientLog, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=t.clients)
            .map(|id| {
                let (make, reg, start) = (&make, &reg, &start);
                s.spawn(move || client(id, make(), reg, t, clock, start, origin))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a client thread panicked".into()))).collect()
    });
    let elapsed = origin.elapsed();
    let mut report = RegisterReport { elapsed, ..RegisterReport::default() };
    let mut history = Vec::new();
    for log in logs {
        let log = log?;
        for (total, n) in report.writes.iter_mut().zip(log.writes) {
            *total += n;
        }
        report.initial_reads += log.initial_reads;
        history.extend(log.ops);
    }
    report.operations = history.len();
    report.reads = history.iter().filter(|op| op.input == RegisterOp::Read).count();
    match Checker::new().check(&RegisterModel::new(0), &history) {
        CheckResult::Linearizable => Ok(report),
        CheckResult::NotLinearizable(v) => {
            Err(format!("history of {} operations is not linearizable:\n{v}", history.len()))
        }
        CheckResult::Unknown { steps, .. } => Err(format!(
            "the checker could not decide a history of {} operations in {steps} steps (use fewer clients or operations)",
            history.len()
        )),
    }
}

/// One client thread.
fn client<M: Memory>(
    id: u8,
    mem: M,
    reg: &Register,
    t: &RegisterTest,
    clock: SystemClock,
    start: &Barrier,
    origin: Instant,
) -> Result<ClientLog, String> {
    let prepared = (|| {
        let mut ctx = std::boxed::Box::new(ClientCtx::new(id, clock).map_err(|e| format!("client {id}: {e}"))?);
        block_on(ctx.prepare(&mem)).map_err(|e| format!("client {id}: prepare: {e}"))?;
        Ok::<_, String>(ctx)
    })();
    // Everyone passes the barrier, even a client that failed to start.
    start.wait();
    let mut ctx = prepared?;
    let mut rng = Rng::new(t.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut cache = RegCache::default();
    let mut log = ClientLog { ops: Vec::with_capacity(t.ops_per_client as usize), writes: [0; 3], initial_reads: 0 };
    let now = || origin.elapsed().as_nanos() as u64;
    let mut seq = 0;
    for _ in 0..t.ops_per_client {
        if rng.range(0, 99) < t.read_percent {
            let call = now();
            let (_, value) = block_on(safeguess::read(&mut ctx, &mem, reg, &mut cache))
                .map_err(|e| format!("client {id}: read failed: {e}"))?;
            let ret = now();
            let got = id_of_value(&value).ok_or_else(|| {
                format!("client {id}: read {} bytes that no client wrote: {:02x?}", value.len(), &value[..])
            })?;
            if got != 0 && value.len() != t.value_len.max(8) {
                return Err(format!(
                    "client {id}: read a value of {} bytes; every write has {}",
                    value.len(),
                    t.value_len.max(8)
                ));
            }
            log.initial_reads += (got == 0) as usize;
            log.ops.push(Operation::completed(id as u32, call, ret, RegisterOp::Read, RegisterRet::Value(got)));
        } else {
            seq += 1;
            let v = value_of(id, seq, t.value_len);
            let call = now();
            let (_, path) = block_on(safeguess::write(&mut ctx, &mem, reg, &mut cache, &v))
                .map_err(|e| format!("client {id}: write failed: {e}"))?;
            let ret = now();
            log.writes[match path {
                WritePath::Fast => 0,
                WritePath::Rewritten => 1,
                WritePath::ReaderLocked => 2,
            }] += 1;
            let written = ((id as u64) << 32) | seq;
            log.ops.push(Operation::completed(id as u32, call, ret, RegisterOp::Write(written), RegisterRet::Ack));
        }
    }
    Ok(log)
}

/// What [`kv_suite`] runs.
#[derive(Clone, Debug)]
pub struct KvTest {
    /// The store (from `swarm_core::systems::ALL`).
    pub system: swarm_core::kv::System,
    /// Replicas per key.
    pub replicas: usize,
    /// Client threads, ids `1..=clients`.
    pub clients: u8,
    /// Operations per client.
    pub ops_per_client: u64,
    /// Shared keys.
    pub keys: u64,
    /// Seed of the operation mix.
    pub seed: u64,
    /// Bytes of every node.
    pub node_size: u64,
    /// Allocation chunk of the nodes.
    pub chunk: u64,
}

impl Default for KvTest {
    /// SWARM-KV on 3 replicas, four clients of 1000 operations on 8 keys,
    /// nodes of 16 MiB with 256 KiB chunks.
    fn default() -> Self {
        KvTest {
            system: swarm_core::systems::from_name("swarm-kv").expect("SWARM-KV is registered"),
            replicas: 3,
            clients: 4,
            ops_per_client: 1000,
            keys: 8,
            seed: 1,
            node_size: 16 << 20,
            chunk: 256 << 10,
        }
    }
}

/// The shared key-value suite: formats every node of the memory `make`
/// gives for `t.system` (its options picked by `t.seed`), runs `t.clients`
/// client threads doing a seeded mix of gets (40%), updates (25%), inserts
/// (25%) and deletes (10%), and checks the history against the system's
/// declared guarantee: every client works on `t.keys` shared keys of a
/// linearizable store, and on a key of its own in a store that promises
/// only that (RAW). Returns the number of operations checked, or what went
/// wrong.
pub fn kv_suite<M, F>(make: F, t: &KvTest) -> Result<usize, String>
where
    M: Memory,
    F: Fn() -> M + Sync,
{
    use swarm_core::kv::{Got, KvClient, StoreConfig, Who};
    use swarm_core::substrate::lease::Want;
    use swarm_core::systems;
    use swarm_lincheck::{Kv, KvOp, KvRet};
    let mut cfg = StoreConfig::new(t.system, t.keys.max(16));
    cfg.replicas = t.replicas;
    cfg.max_key = 16;
    cfg.writers = t.clients;
    cfg.cache_capacity = 64;
    cfg.seed_options(t.seed);
    let shared = t.system.guarantee().shares_keys();
    let admin = make();
    for n in 0..admin.node_count() {
        let node = NodeId(n as u16);
        block_on(Region::format(&admin, node, t.node_size, t.chunk)).map_err(|e| format!("format {node}: {e}"))?;
    }
    let clock = SystemClock::starting_now();
    block_on(systems::format(&admin, &cfg, clock.epoch_us))
        .map_err(|e| format!("set up the {} store: {e}", t.system))?;
    let origin = Instant::now();
    let start = Barrier::new(t.clients as usize);
    // The system's server (pDPM-Central's coordinator), if it has one,
    // serves beside its node for the clients' run.
    let logs: Vec<Result<Vec<Operation<KvOp, KvRet>>, String>> = systems::with_server(&cfg, &make, || {
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..=t.clients)
                .map(|id| {
                    let (make, cfg, start) = (&make, &cfg, &start);
                    s.spawn(move || {
                        // Each client claims a leased id, as every process does.
                        let mem = make();
                        let store = block_on(async {
                            let held = systems::claim(&mem, cfg, &clock, Want::Any, id as u32).await?;
                            systems::connect_any(mem, cfg, Who::Lease(held), clock).await
                        });
                        start.wait();
                        let mut store = store.map_err(|e| format!("client {id}: connect: {e}"))?;
                        let mut rng = Rng::new(t.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                        let mut ops = Vec::new();
                        let now = || origin.elapsed().as_nanos() as u64;
                        for seq in 1..=t.ops_per_client {
                            let k = if shared { rng.range(0, t.keys - 1) } else { id as u64 - 1 };
                            let key = format!("key-{k}");
                            let v = value_of(id, seq, 24);
                            let vid = ((id as u64) << 32) | seq;
                            let call = now();
                            let failed = |e| format!("client {id}: operation {seq} on {key}: {e}");
                            let (input, output) = match rng.range(0, 19) {
                                0..=7 => {
                                    let got = block_on(store.get(key.as_bytes())).map_err(failed)?;
                                    let ret = match got {
                                        Got::Found(v) => KvRet::Found(id_of_value(&v).ok_or_else(|| {
                                            format!("client {id}: {key} holds a value no client wrote: {:02x?}", &v[..])
                                        })?),
                                        Got::NotFound => KvRet::NotFound,
                                        Got::Deleted => KvRet::Deleted,
                                    };
                                    (KvOp::Get(k), ret)
                                }
                                8..=12 => {
                                    let r = block_on(store.update(key.as_bytes(), &v)).map_err(failed)?;
                                    (KvOp::Update(k, vid), if r.is_ok() { KvRet::Ok } else { KvRet::NotFound })
                                }
                                13..=17 => {
                                    block_on(store.insert(key.as_bytes(), &v)).map_err(failed)?;
                                    (KvOp::Insert(k, vid), KvRet::Ok)
                                }
                                _ => {
                                    let r = block_on(store.delete(key.as_bytes())).map_err(failed)?;
                                    (KvOp::Delete(k), if r.is_ok() { KvRet::Ok } else { KvRet::NotFound })
                                }
                            };
                            ops.push(Operation::completed(id as u32, call, now(), input, output));
                        }
                        block_on(store.close()).map_err(|e| format!("client {id}: close: {e}"))?;
                        Ok(ops)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a client thread panicked".into()))).collect()
        })
    });
    let mut history = Vec::new();
    for log in logs {
        history.extend(log?);
    }
    match Checker::new().check(&Kv::lazy_unmap(), &history) {
        CheckResult::Linearizable => Ok(history.len()),
        CheckResult::NotLinearizable(v) => {
            Err(format!("history of {} operations is not linearizable:\n{v}", history.len()))
        }
        CheckResult::Unknown { steps, .. } => {
            Err(format!("the checker could not decide a history of {} operations in {steps} steps", history.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_identify_themselves() {
        let v = value_of(3, 9, 40);
        assert_eq!(v.len(), 40);
        assert_eq!(id_of_value(&v), Some((3 << 32) | 9));
        assert_eq!(id_of_value(&[]), Some(0));
        let mut torn = v.clone();
        torn[20] ^= 1;
        assert_eq!(id_of_value(&torn), None);
        assert_eq!(id_of_value(&v[..7]), None, "shorter than an id");
        assert_eq!(id_of_value(&[0; 8]), None);
    }
}
