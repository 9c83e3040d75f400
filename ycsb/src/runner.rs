//! The run: what every client agrees on ([`RunSpec`]), and what one client
//! does ([`run_client`]), whatever drives it (OS threads, worker processes
//! or simulator tasks; see [`crate::threads`] and [`crate::sim`]).
//!
//! A client owns `max(inflight)` store handles, each with its own client id
//! (Safe-Guess needs one outstanding operation per writer id), and keeps
//! `k` operations in flight by polling `k` handles' operation loops in turn
//! on one thread ([`join_all`]), as the paper's coroutines do (§7.2).
//!
//! Phases, with every client meeting at a gate ([`Env::gate`]) after each:
//! 1. **load**: every key inserted once, the keys dealt round-robin over all
//!    handles of all clients;
//! 2. for each in-flight setting `k` of the sweep: **warm-up** (`warmup`
//!    operations per client, unmeasured, and for at least the store's
//!    [`KvClient::settle_ns`], with its background work after every
//!    operation, so that the recycling of what came before (the load's
//!    writes among it) is done before measuring: the measured run sees
//!    the steady state), then
//!    **measured** (`ops` operations per client), split over the client's
//!    first `k` handles.
//!
//! Every operation is timed ([`Env::now_ns`]) and its sequential roundtrips
//! counted ([`Counting`], over [`Counted`] memory).
//!
//! A timed run ([`RunSpec::timed`]) measures for a fixed time from the
//! gate that opens the measured phase (its origin, the same for every
//! client of a process), `ops` then being only a cap, and records a
//! [`Timeline`]; with faults ([`crate::fault`]), the driver's injector
//! learns the origin ([`Env::measure_begins`]) and operations that fail
//! for want of memory nodes are counted, not fatal.

use core::future::{Future, poll_fn};
use core::pin::Pin;
use core::task::Poll;

use serde_json::{Value, json};
use swarm_core::Memory;
use swarm_core::kv::{Got, Handle, KvClient, KvError, StoreConfig, System};
use swarm_core::substrate::lease::LeaseError;
use swarm_core::substrate::rtt::Counted;
use swarm_core::swarm::client::Paths;
use swarm_core::systems;

use crate::choose::{Chooser, Gen, KeyNames, ScrambledZipfian, Zipfian};
use crate::fault::{self, NodeFault};
use crate::stats::PhaseStats;
use crate::timeline::{MAX_BUCKETS, Timeline};
use crate::workload::{Distribution, OpKind, Workload};

/// Most store handles of one run: client ids 1..=126.
pub const MAX_HANDLES: usize = 126;

/// A measured phase of fixed length, and what happens during it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    /// Length of each measured phase, ns from its origin.
    pub run_ns: u64,
    /// Width of the timeline's buckets, ns.
    pub bucket_ns: u64,
    /// Memory-node faults, after the origin.
    pub faults: Vec<NodeFault>,
}

impl Timed {
    /// As JSON (in the run's description).
    fn to_json(&self) -> Value {
        json!({
            "run_ns": self.run_ns,
            "bucket_ns": self.bucket_ns,
            "faults": self.faults.iter().map(NodeFault::to_json).collect::<Vec<_>>(),
        })
    }

    fn from_json(v: &Value) -> Result<Timed, String> {
        let bad = |what: &str| format!("malformed run description ({what})");
        let faults = v["faults"].as_array().ok_or_else(|| bad("faults"))?;
        Ok(Timed {
            run_ns: v["run_ns"].as_u64().ok_or_else(|| bad("run_ns"))?,
            bucket_ns: v["bucket_ns"].as_u64().ok_or_else(|| bad("bucket_ns"))?,
            faults: faults.iter().map(NodeFault::from_json).collect::<Result<_, _>>()?,
        })
    }
}

/// What every client of a run agrees on.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    /// The workload.
    pub workload: Workload,
    /// How keys are chosen (workload D always reads the latest).
    pub distribution: Distribution,
    /// Keys loaded.
    pub keys: u64,
    /// Bytes per key.
    pub key_size: usize,
    /// Bytes per value: the largest, where values vary ([`RunSpec::value_min`]).
    pub value_size: usize,
    /// Bytes of the smallest value: each operation's value has a length
    /// drawn uniformly from `value_min..=value_size` (YCSB's uniform field
    /// length), or `value_size` where they are equal.
    pub value_min: usize,
    /// Replicas of each key (RAW keeps one copy); also the memory nodes.
    pub replicas: usize,
    /// Client threads in the whole run.
    pub clients: usize,
    /// Operations in flight per client: one measured run per entry.
    pub inflight: Vec<usize>,
    /// Unmeasured operations per client before each measured run.
    pub warmup: u64,
    /// Measured operations per client in each run.
    pub ops: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// After the load, every handle reads every key it did not insert, so
    /// that its location cache holds every key (the paper's setting: "index
    /// caches large enough to cache all key locations", after a warm-up of
    /// a million operations); otherwise the measured operations include the
    /// index lookups of first accesses.
    pub warm_cache: bool,
    /// Measure for a fixed time rather than `ops` operations (`ops` caps
    /// each client's), with a timeline and maybe faults.
    pub timed: Option<Timed>,
}

impl RunSpec {
    /// Handles per client.
    pub fn max_inflight(&self) -> usize {
        self.inflight.iter().copied().max().unwrap_or(1)
    }

    /// Handles in the run (client ids `1..=handles`).
    pub fn handles(&self) -> usize {
        self.clients * self.max_inflight()
    }

    /// Operations per client over the whole sweep, warm-ups included.
    pub fn ops_per_client(&self) -> u64 {
        self.inflight.len() as u64 * (self.warmup + self.ops)
    }

    /// Operations of every client over the whole sweep, warm-ups included.
    fn run_ops(&self) -> u64 {
        self.clients as u64 * self.ops_per_client()
    }

    /// Round `r` of `rounds` of this run (see [`ClientResult::append`]): a
    /// share of the measured operations (the first `ops % rounds` rounds
    /// take one more), after the whole run's warm-up (a shorter one would
    /// measure more of the time the caches take to settle after the load,
    /// which costs the systems that touch more memory more), with a seed
    /// of its own. `None` if a round would measure nothing. A timed run's
    /// rounds each measure for the whole time (with the whole cap).
    pub fn round(&self, r: u64, rounds: u64) -> Option<RunSpec> {
        if rounds == 0 || r >= rounds || self.ops < rounds {
            return None;
        }
        let ops = match self.timed {
            Some(_) => self.ops,
            None => self.ops / rounds + u64::from(r < self.ops % rounds),
        };
        Some(RunSpec { ops, seed: self.seed.wrapping_add(r), ..self.clone() })
    }

    /// The faults of a timed run (none otherwise).
    pub fn faults(&self) -> &[NodeFault] {
        self.timed.as_ref().map_or(&[], |t| &t.faults)
    }

    /// Operations of the whole run, load and cache warming included (for
    /// progress bars).
    pub fn total_ops(&self) -> u64 {
        let warm = if self.warm_cache { self.handles() as u64 * self.keys } else { 0 };
        self.keys + warm + self.run_ops()
    }

    /// At most how many keys workload D inserts: twice the expected number,
    /// and some (the index is sized for it; running out would end the run).
    pub fn max_inserts(&self) -> u64 {
        let n = self.run_ops();
        let expect = (n as f64 * self.workload.mix().insert * 2.0) as u64;
        if expect == 0 { 0 } else { (expect + 1024).min(n) }
    }

    /// The highest key number any handle may insert, plus one.
    pub fn key_bound(&self) -> u64 {
        if self.workload.mix().insert == 0.0 {
            return self.keys;
        }
        let per_handle = self.ops_per_client() + 1;
        self.keys + self.handles() as u64 * per_handle
    }

    /// Key names, checked against the key size.
    pub fn key_names(&self) -> Result<KeyNames, String> {
        KeyNames::new(self.key_size, self.key_bound())
    }

    /// Checks what no single flag can: an error in words if the run is
    /// impossible.
    pub fn check(&self) -> Result<(), String> {
        if self.clients == 0 || self.inflight.is_empty() || self.inflight.contains(&0) {
            return Err("a run needs at least one client and one operation in flight".into());
        }
        if self.handles() > MAX_HANDLES {
            return Err(format!(
                "{} clients x {} operations in flight need {} client ids; the stores have {MAX_HANDLES}",
                self.clients,
                self.max_inflight(),
                self.handles()
            ));
        }
        if self.keys == 0 {
            return Err("the store needs at least one key".into());
        }
        if self.value_min > self.value_size {
            return Err(format!(
                "the smallest value ({} B) is larger than the largest ({} B)",
                self.value_min, self.value_size
            ));
        }
        self.key_names()?;
        for &system in systems::ALL {
            self.store_config(system).check(self.replicas).map_err(|e| format!("{system}: {e}"))?;
        }
        if let Some(t) = &self.timed {
            if t.run_ns == 0 || t.bucket_ns == 0 {
                return Err("a timed run needs a length and a bucket width above zero".into());
            }
            if t.bucket_ns > t.run_ns {
                return Err(format!(
                    "the timeline's buckets ({}) are longer than the run ({})",
                    fault::time(t.bucket_ns),
                    fault::time(t.run_ns)
                ));
            }
            if t.run_ns.div_ceil(t.bucket_ns) > MAX_BUCKETS {
                return Err(format!("a timeline has at most {MAX_BUCKETS} buckets: use wider ones"));
            }
            if !t.faults.is_empty() && self.inflight.len() > 1 {
                return Err("a run with faults measures one in-flight setting, not a list".into());
            }
            fault::check(&t.faults, self.replicas, t.run_ns)?;
        }
        Ok(())
    }

    /// The shape of `system`'s store for this run.
    pub fn store_config(&self, system: System) -> StoreConfig {
        // Every client may cache every key, as the paper's clients do once
        // warm (bounded, to keep each handle's memory in check).
        let mut cfg = StoreConfig::new(system, self.keys + self.max_inserts());
        cfg.replicas = self.replicas;
        cfg.max_key = self.key_size;
        cfg.max_value = self.value_size;
        cfg.writers = self.handles().min(MAX_HANDLES) as u8;
        cfg
    }

    /// At most how many writes the run makes, all clients together (the
    /// writers' logs are never recycled, so nodes are sized for it): the
    /// load, and twice the writes the mix expects, and some (a write that
    /// loses a race writes again; the mix's share is a mean).
    pub fn writes_bound(&self) -> u64 {
        let n = self.run_ops();
        let mix = self.workload.mix();
        let expect = (n as f64 * (mix.update + mix.insert + mix.rmw) * 2.0) as u64;
        self.keys + if expect == 0 { 0 } else { (expect + 1024).min(n) }
    }

    /// Bytes per memory node for `system`.
    pub fn node_bytes(&self, system: System) -> u64 {
        self.store_config(system).node_bytes(self.replicas, self.writes_bound())
    }

    /// As JSON (the report's `config`, and what workers are sent).
    pub fn to_json(&self) -> Value {
        json!({
            "workload": self.workload.name(),
            "distribution": if self.workload.latest() { "latest" } else { self.distribution.name() },
            "keys": self.keys,
            "key_size": self.key_size,
            "value_size": self.value_size,
            "value_min": self.value_min,
            "replicas": self.replicas,
            "clients": self.clients,
            "inflight": self.inflight,
            "warmup": self.warmup,
            "ops": self.ops,
            "seed": self.seed,
            "warm_cache": self.warm_cache,
            "timed": self.timed.as_ref().map(Timed::to_json),
        })
    }

    /// Reads what [`RunSpec::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<RunSpec, String> {
        let bad = |what: &str| format!("malformed run description ({what})");
        let u = |k: &str| v[k].as_u64().ok_or_else(|| bad(k));
        let s = |k: &str| v[k].as_str().ok_or_else(|| bad(k));
        let distribution = match s("distribution")? {
            "latest" => Distribution::Zipf,
            d => Distribution::from_name(d).ok_or_else(|| bad("distribution"))?,
        };
        let inflight = v["inflight"]
            .as_array()
            .ok_or_else(|| bad("inflight"))?
            .iter()
            .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| bad("inflight")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RunSpec {
            workload: Workload::from_name(s("workload")?).ok_or_else(|| bad("workload"))?,
            distribution,
            keys: u("keys")?,
            key_size: u("key_size")? as usize,
            value_size: u("value_size")? as usize,
            value_min: match v["value_min"].as_u64() {
                Some(n) => n as usize,
                None => u("value_size")? as usize,
            },
            replicas: u("replicas")? as usize,
            clients: u("clients")? as usize,
            inflight,
            warmup: u("warmup")?,
            ops: u("ops")?,
            seed: u("seed")?,
            warm_cache: v["warm_cache"].as_bool().ok_or_else(|| bad("warm_cache"))?,
            timed: if v["timed"].is_null() { None } else { Some(Timed::from_json(&v["timed"])?) },
        })
    }
}

/// A store handle whose operations' roundtrips can be read.
pub trait Counting: KvClient {
    /// Starts counting from zero, before an operation.
    fn begin(&self);
    /// Sequential roundtrips since [`Counting::begin`].
    fn roundtrips(&self) -> u32;
}

/// Every client of a store over [`Counted`] memory counts.
impl<M: Memory, K: KvClient + Handle<Mem = Counted<M>>> Counting for K {
    fn begin(&self) {
        self.mem().reset();
    }

    fn roundtrips(&self) -> u32 {
        self.mem().roundtrips()
    }
}

/// What drives the clients: their clock, their meeting points, and the
/// run's shared state.
pub trait Env {
    /// Nanoseconds on the run's clock (wall or virtual).
    fn now_ns(&self) -> u64;
    /// Waits until every client of the run reached this gate: when it
    /// opened on the run's clock (the same for every client that passes
    /// it), or `None` if the run was aborted meanwhile.
    fn gate(&self) -> impl Future<Output = Option<u64>>;
    /// The measured phase of a timed run began at `origin_ns` (the gate
    /// that opened it); every client says so, once the gate let it pass.
    /// What injects faults starts its clock here.
    fn measure_begins(&self, _origin_ns: u64) {}
    /// Tells the others that this client failed.
    fn abort(&self);
    /// Whether a client failed.
    fn aborted(&self) -> bool;
    /// `n` more operations are done (progress bars).
    fn progress(&self, _n: u64) {}
}

/// What one client (or, merged, a group of them) measured.
#[derive(Clone, Debug, Default)]
pub struct ClientResult {
    /// The load phase.
    pub load: PhaseStats,
    /// The measured phase of each in-flight setting, in sweep order.
    pub runs: Vec<PhaseStats>,
    /// The store's memory once its clients were done (the runners that see
    /// its nodes whole: simulator, threads).
    pub memory: Option<MemoryUse>,
    /// Operations of the warm-ups that failed with an error the run
    /// tolerates (RAW's torn copies), reported beside the measured ones.
    pub warmup_errors: u64,
}

/// The disaggregated memory a store holds (SWARM Table 3), all nodes
/// together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Bytes claimed from the nodes' regions (chunks handed out).
    pub claimed: u64,
    /// Of which writer-log segments given back, which their client id's
    /// next segments reuse.
    pub reclaimable: u64,
    /// Keys the store holds (loaded and inserted).
    pub keys: u64,
}

impl MemoryUse {
    /// What `mem`'s nodes hold for a store of `keys` keys.
    pub async fn of<M: Memory>(mem: &M, keys: u64) -> Result<MemoryUse, String> {
        let mut out = MemoryUse { keys, ..MemoryUse::default() };
        let mut logs = swarm_core::swarm::writerlog::Logs::new();
        for n in 0..mem.node_count() {
            let node = swarm_core::NodeId(n as u16);
            let m = logs.memory(mem, node).await.map_err(|e| format!("{node}: {e}"))?;
            out.claimed += m.claimed;
            out.reclaimable += m.reclaimable;
        }
        Ok(out)
    }

    /// Bytes live (claimed, less what is reclaimable) per key.
    pub fn live_per_key(&self) -> f64 {
        self.claimed.saturating_sub(self.reclaimable) as f64 / self.keys.max(1) as f64
    }

    /// Bytes claimed per key.
    pub fn claimed_per_key(&self) -> f64 {
        self.claimed as f64 / self.keys.max(1) as f64
    }

    /// The keys of the store of a run of `spec` that measured `result`:
    /// those loaded and those its clients inserted.
    pub fn keys_after(spec: &RunSpec, result: &ClientResult) -> u64 {
        spec.keys + result.runs.iter().map(|r| r.op(OpKind::Insert).count()).sum::<u64>()
    }
}

impl ClientResult {
    /// Adds a client on the same clock.
    pub fn merge(&mut self, o: &ClientResult) {
        self.combine(o, PhaseStats::merge);
        self.memory = self.memory.or(o.memory);
    }

    /// Adds a later round of the same clients (see [`RunSpec::round`]): the
    /// operations add up, and so do the measured windows; the memory is the
    /// last round's.
    pub fn append(&mut self, o: &ClientResult) {
        self.combine(o, PhaseStats::append);
        self.memory = o.memory.or(self.memory);
    }

    /// Adds the clients of another process (its own clock).
    pub fn merge_foreign(&mut self, o: &ClientResult) {
        self.combine(o, PhaseStats::merge_foreign);
    }

    /// Adds `o` phase by phase with `add`.
    fn combine(&mut self, o: &ClientResult, add: fn(&mut PhaseStats, &PhaseStats)) {
        add(&mut self.load, &o.load);
        self.warmup_errors += o.warmup_errors;
        self.runs.resize_with(self.runs.len().max(o.runs.len()), PhaseStats::default);
        for (a, b) in self.runs.iter_mut().zip(&o.runs) {
            add(a, b);
        }
    }

    /// As JSON, from a worker.
    pub fn to_json(&self) -> Value {
        json!({
            "load": self.load.to_json(),
            "runs": self.runs.iter().map(PhaseStats::to_json).collect::<Vec<_>>(),
            "warmup_errors": self.warmup_errors,
        })
    }

    /// Reads what [`ClientResult::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<ClientResult, String> {
        let malformed = "a worker sent malformed measurements";
        let runs = v["runs"].as_array().ok_or(malformed)?;
        Ok(ClientResult {
            load: PhaseStats::from_json(&v["load"])?,
            runs: runs.iter().map(PhaseStats::from_json).collect::<Result<_, _>>()?,
            memory: None,
            warmup_errors: v["warmup_errors"].as_u64().ok_or(malformed)?,
        })
    }
}

/// One handle and its own random state.
struct Slot<S> {
    store: S,
    /// Index among all handles of the run (client id minus one).
    global: u64,
    rng: Gen,
    chooser: Chooser,
    /// Keys this handle inserted in the run phases (workload D).
    inserts: u64,
    /// Operations so far (tags the values written).
    seq: u64,
    key: Vec<u8>,
    /// A buffer of the largest value, and the length of the next one.
    value: Vec<u8>,
    len: usize,
    /// When this handle next runs its store's background work
    /// ([`KvClient::keep`]: leases, recycling), ns of the run's clock.
    keep_at: u64,
}

/// How often a handle runs its store's background work between
/// operations ([`KvClient::keep`]): renewing its lease, and recycling
/// (SWARM-KV's and DM-ABD's logs: `swarm_core::swarm::recycle`). Ten times
/// a second, where the paper's Table 3 assumes once: a log holds the
/// writes of a little more than this period, so a client that writes a
/// hundred thousand values a second needs a tenth of the memory.
pub const KEEP_EVERY_NS: u64 = 100_000_000;

/// What the slots share: the run and its derived constants.
struct Shared<'a> {
    spec: &'a RunSpec,
    names: KeyNames,
    handles: u64,
    /// Whether two handles' updates of one key may leave its copy torn for
    /// good: a store without concurrency control (RAW), run by more than
    /// one handle. A get that finds such a copy ([`KvError::Torn`]) is
    /// counted as failed and the run goes on.
    tears: bool,
}

impl<S> Slot<S> {
    /// The key number of this handle's `j`-th insert of the run phases.
    fn inserted_key(&self, sh: &Shared<'_>, j: u64) -> u64 {
        sh.spec.keys + self.global + j * sh.handles
    }

    /// The key number of the next get, update or read-modify-write.
    fn choose(&mut self, sh: &Shared<'_>) -> u64 {
        let keys = sh.spec.keys;
        match self.chooser {
            Chooser::Latest(_) => {
                // Recency as this handle sees it: its own inserts, newest
                // first, then the loaded keys from the highest number down.
                let l = self.chooser.next(keys + self.inserts, &mut self.rng);
                if l < self.inserts {
                    self.inserted_key(sh, self.inserts - 1 - l)
                } else {
                    keys - 1 - (l - self.inserts).min(keys - 1)
                }
            }
            _ => self.chooser.next(keys, &mut self.rng),
        }
    }

    /// Fills the value for operation `seq`: its length (drawn where
    /// values vary), then the handle and the sequence number first, so
    /// that writes differ.
    fn fill_value(&mut self, min: usize) {
        self.seq += 1;
        let max = self.value.len();
        self.len = match min < max {
            true => min + self.rng.below((max - min + 1) as u64) as usize,
            false => max,
        };
        let tag = (self.global << 48 | self.seq).to_le_bytes();
        let n = self.len.min(8);
        self.value[..n].copy_from_slice(&tag[..n]);
    }
}

/// Runs one operation on `s`: its roundtrips, and whether it found its key.
async fn exec<S: Counting>(s: &mut S, kind: OpKind, key: &[u8], value: &[u8]) -> Result<(u32, bool), KvError> {
    s.begin();
    match kind {
        OpKind::Get => {
            let found = matches!(s.get(key).await?, Got::Found(_));
            Ok((s.roundtrips(), found))
        }
        OpKind::Update => {
            let found = s.update(key, value).await?.is_ok();
            Ok((s.roundtrips(), found))
        }
        OpKind::Insert => {
            s.insert(key, value).await?;
            Ok((s.roundtrips(), true))
        }
        OpKind::Rmw => {
            let found = matches!(s.get(key).await?, Got::Found(_));
            let read = s.roundtrips();
            s.begin();
            let updated = s.update(key, value).await?.is_ok();
            Ok((read + s.roundtrips(), found && updated))
        }
    }
}

/// Which phase a handle is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Load,
    /// Reading every key the handle did not load (see [`RunSpec::warm_cache`]).
    WarmCache,
    /// Unmeasured operations, and more until `until_ns` (the store's
    /// settling time, [`KvClient::settle_ns`]).
    Warmup {
        until_ns: u64,
    },
    Measure,
}

/// A timed measured phase, as the clients of one process run it.
#[derive(Clone, Copy)]
struct Window {
    /// When it began (the gate that opened it), on the run's clock.
    origin_ns: u64,
    /// Its length, ns.
    run_ns: u64,
    /// Whether operations that fail for want of memory nodes are counted
    /// and the run goes on (a run with faults).
    tolerate: bool,
}

/// One handle's loop: `n` operations of `phase` (or, in a timed phase,
/// as many as fit in its window, at most `n`), recorded into `stats`
/// unless warming up.
async fn drive<S: Counting, E: Env>(
    slot: &mut Slot<S>,
    sh: &Shared<'_>,
    env: &E,
    phase: Phase,
    n: u64,
    window: Option<Window>,
    stats: &mut PhaseStats,
) -> Result<(), String> {
    let mix = sh.spec.workload.mix();
    let tolerated = |e: &KvError| match e {
        // Too few nodes, or the one node the store needs, answered (for
        // the operation, or for the renewal of the client's lease).
        KvError::Unavailable | KvError::Down(_) | KvError::Lease(LeaseError::NoQuorum) => {
            window.is_some_and(|w| w.tolerate)
        }
        KvError::Torn { .. } => sh.tears,
        _ => false,
    };
    let settling = |now: u64| matches!(phase, Phase::Warmup { until_ns } if now < until_ns);
    // Progress counts the operations asked for, not those of settling.
    let progress = |i: u64| {
        if i < n {
            env.progress(1)
        }
    };
    for i in (0..).take_while(|&i| i < n || settling(env.now_ns())) {
        if env.aborted() {
            return Err(String::new());
        }
        let (kind, keynum) = match phase {
            Phase::Load => (OpKind::Insert, slot.global + i * sh.handles),
            Phase::WarmCache if i % sh.handles == slot.global => {
                // Loaded (and cached) by this handle.
                progress(i);
                continue;
            }
            Phase::WarmCache => (OpKind::Get, i),
            _ => match mix.pick(&mut slot.rng) {
                OpKind::Insert => {
                    let k = slot.inserted_key(sh, slot.inserts);
                    slot.inserts += 1;
                    (OpKind::Insert, k)
                }
                kind => (kind, slot.choose(sh)),
            },
        };
        sh.names.write(keynum, &mut slot.key);
        slot.fill_value(sh.spec.value_min);
        let t0 = env.now_ns();
        if window.is_some_and(|w| t0 >= w.origin_ns + w.run_ns) {
            return Ok(());
        }
        let out = exec(&mut slot.store, kind, &slot.key, &slot.value[..slot.len]).await;
        let end = env.now_ns();
        let (rtt, found) = match out {
            Ok(r) => r,
            Err(e) if tolerated(&e) => {
                stats.ops[kind.index()].record_error();
                if let (Some(t), Some(w)) = (&mut stats.timeline, window) {
                    t.record_error(end.saturating_sub(w.origin_ns));
                }
                progress(i);
                continue;
            }
            Err(e) => {
                return Err(format!(
                    "client {}: {} of {}: {e}",
                    slot.global + 1,
                    if phase == Phase::Load { "load insert" } else { kind.name() },
                    String::from_utf8_lossy(&slot.key)
                ));
            }
        };
        let latency = end.saturating_sub(t0);
        if matches!(phase, Phase::Load | Phase::Measure) {
            stats.ops[kind.index()].record(latency, rtt, found);
        }
        if let (Some(t), Some(w)) = (&mut stats.timeline, window) {
            t.record(end.saturating_sub(w.origin_ns), latency);
        }
        progress(i);
        // Background work, between operations: not measured. A failure (a
        // lease not renewed while nodes are down) shows in the next
        // operation. The warm-up works off what came before (the load's
        // writes) at once, so that it is done by the store's settling
        // time, without moving the pace's clock: the measured phase meets
        // the passes where a long run would.
        let due = end >= slot.keep_at;
        if due || matches!(phase, Phase::Warmup { .. }) {
            let _ = slot.store.keep().await;
        }
        if due {
            slot.keep_at = env.now_ns() + KEEP_EVERY_NS;
        }
    }
    // Out of operations before the time was up.
    stats.capped = window.is_some_and(|w| env.now_ns() < w.origin_ns + w.run_ns);
    Ok(())
}

/// Polls every future in turn until all complete; the first error ends
/// the others (they are dropped mid-operation).
pub async fn join_all<F: Future<Output = Result<(), String>>>(futs: Vec<F>) -> Result<(), String> {
    let mut futs: Vec<Option<Pin<Box<F>>>> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for slot in futs.iter_mut() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(Ok(())) => *slot = None,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(Ok(())) }
    })
    .await
}

/// Runs `phase` on the first `k` slots, `total` operations split among
/// them (`per_slot` gives slot `i`'s share), within `window` if timed (with
/// a timeline); the phase's measurements, its window from the first start
/// to the last end.
async fn phase<S: Counting, E: Env>(
    slots: &mut [Slot<S>],
    sh: &Shared<'_>,
    env: &E,
    phase: Phase,
    window: Option<Window>,
    per_slot: impl Fn(usize) -> u64,
) -> Result<PhaseStats, String> {
    let timeline = || sh.spec.timed.as_ref().zip(window).map(|(t, w)| Timeline::new(w.run_ns, t.bucket_ns));
    let mut stats: Vec<PhaseStats> =
        slots.iter().map(|_| PhaseStats { timeline: timeline(), ..PhaseStats::default() }).collect();
    let before: Vec<Paths> = slots.iter().map(|s| s.store.paths()).collect();
    let start = env.now_ns();
    let futs = slots
        .iter_mut()
        .zip(stats.iter_mut())
        .enumerate()
        .map(|(i, (slot, st))| drive(slot, sh, env, phase, per_slot(i), window, st))
        .collect();
    join_all(futs).await?;
    let end = env.now_ns();
    let mut merged = PhaseStats { start_ns: start, end_ns: end, ..PhaseStats::default() };
    for s in &stats {
        merged.add_ops(s, Timeline::merge);
    }
    for (slot, before) in slots.iter().zip(&before) {
        merged.paths.add(&slot.store.paths().since(before));
    }
    Ok(merged)
}

/// Operation `n` of `total` split over `k` parts: part `i`'s share.
fn share(total: u64, k: usize, i: usize) -> u64 {
    total / k as u64 + u64::from((i as u64) < total % k as u64)
}

/// The chooser every handle starts from (cloned: computing Zipf's zeta over
/// the loaded keys takes time proportional to their number).
pub fn chooser(spec: &RunSpec) -> Chooser {
    if spec.workload.latest() {
        Chooser::Latest(Zipfian::new(spec.keys))
    } else {
        match spec.distribution {
            Distribution::Zipf => Chooser::Zipf(ScrambledZipfian::new(spec.keys)),
            Distribution::Uniform => Chooser::Uniform { items: spec.keys },
        }
    }
}

/// Client number `client` (0-based) of the run, with its handles (client ids
/// `client * max_inflight + 1 ..`, in order): load, then each in-flight
/// setting's warm-up and measurement, meeting the other clients at the
/// gate after each phase. `Err(None)`: it stopped because another client
/// failed (or the run was aborted).
pub async fn run_client<S: Counting, E: Env>(
    spec: &RunSpec,
    client: usize,
    stores: Vec<S>,
    base: &Chooser,
    env: &E,
) -> Result<ClientResult, Option<String>> {
    let out = client_phases(spec, client, stores, base, env).await;
    if matches!(out, Err(Some(_))) {
        env.abort();
    }
    out
}

async fn client_phases<S: Counting, E: Env>(
    spec: &RunSpec,
    client: usize,
    stores: Vec<S>,
    base: &Chooser,
    env: &E,
) -> Result<ClientResult, Option<String>> {
    let names = spec.key_names().map_err(Some)?;
    let handles = spec.handles() as u64;
    let unguarded =
        stores.first().and_then(|s| systems::from_name(s.name())).is_some_and(|s| !s.guarantee().shares_keys());
    let sh = Shared { spec, names, handles, tears: unguarded && handles > 1 };
    let first = (client * spec.max_inflight()) as u64;
    let mut slots: Vec<Slot<S>> = stores
        .into_iter()
        .enumerate()
        .map(|(h, store)| {
            let global = first + h as u64;
            Slot {
                store,
                global,
                rng: Gen::new(spec.seed, global),
                chooser: base.clone(),
                inserts: 0,
                seq: 0,
                key: Vec::with_capacity(spec.key_size),
                value: vec![0x5a; spec.value_size],
                len: spec.value_size,
                keep_at: 0,
            }
        })
        .collect();
    // An empty error is an abort seen by a handle: another client failed.
    let fail = |e: String| if e.is_empty() { None } else { Some(e) };
    let load = phase(&mut slots, &sh, env, Phase::Load, None, |i| {
        // Keys g, g + H, g + 2H, ... below `keys`.
        let g = first + i as u64;
        if g >= spec.keys { 0 } else { (spec.keys - 1 - g) / sh.handles + 1 }
    })
    .await
    .map_err(fail)?;
    env.gate().await.ok_or(None)?;
    if spec.warm_cache {
        phase(&mut slots, &sh, env, Phase::WarmCache, None, |_| spec.keys).await.map_err(fail)?;
        env.gate().await.ok_or(None)?;
    }
    let (mut runs, mut warmup_errors) = (Vec::with_capacity(spec.inflight.len()), 0);
    for &k in &spec.inflight {
        let active = &mut slots[..k];
        let settle = active.iter().map(|s| s.store.settle_ns()).max().unwrap_or(0);
        let warm = Phase::Warmup { until_ns: env.now_ns().saturating_add(settle) };
        let warmed = phase(active, &sh, env, warm, None, |i| share(spec.warmup, k, i)).await.map_err(fail)?;
        warmup_errors += warmed.errors();
        let origin_ns = env.gate().await.ok_or(None)?;
        let window =
            spec.timed.as_ref().map(|t| Window { origin_ns, run_ns: t.run_ns, tolerate: !t.faults.is_empty() });
        if window.is_some() {
            env.measure_begins(origin_ns);
        }
        let measured =
            phase(active, &sh, env, Phase::Measure, window, |i| share(spec.ops, k, i)).await.map_err(fail)?;
        runs.push(measured);
        env.gate().await.ok_or(None)?;
    }
    // The ids go back to the store, each log where its next holder goes on.
    for slot in &mut slots {
        slot.store.close().await.map_err(|e| Some(format!("client {client}: close: {e}")))?;
    }
    Ok(ClientResult { load, runs, memory: None, warmup_errors })
}

/// What one system measured in a run.
#[derive(Clone, Debug)]
pub struct SystemRun {
    /// The system.
    pub system: System,
    /// All clients together.
    pub result: ClientResult,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::{HashMap, HashSet};
    use std::rc::Rc;
    use swarm_core::kv::{Missing, Written};
    use swarm_core::substrate::exec::{block_on, yield_now};

    pub(crate) fn spec() -> RunSpec {
        RunSpec {
            workload: Workload::B,
            distribution: Distribution::Zipf,
            keys: 1000,
            key_size: 24,
            value_size: 64,
            value_min: 64,
            replicas: 3,
            clients: 2,
            inflight: vec![1, 2],
            warmup: 10,
            ops: 100,
            seed: 1,
            warm_cache: true,
            timed: None,
        }
    }

    /// A store in a shared map: counts what the runner asks of it.
    struct Mock {
        map: Rc<RefCell<HashMap<Vec<u8>, Vec<u8>>>>,
        inserts: Rc<RefCell<Vec<Vec<u8>>>>,
    }

    impl KvClient for Mock {
        type Value = Vec<u8>;
        fn name(&self) -> &'static str {
            "mock"
        }
        fn limits(&self) -> swarm_core::kv::Limits {
            swarm_core::kv::Limits { max_key: 255, max_value: 1 << 16 }
        }
        async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
            self.inserts.borrow_mut().push(key.to_vec());
            self.map.borrow_mut().insert(key.to_vec(), value.to_vec());
            Ok(Written)
        }
        async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
            yield_now().await;
            Ok(match self.map.borrow_mut().get_mut(key) {
                Some(v) => {
                    *v = value.to_vec();
                    Ok(Written)
                }
                None => Err(Missing::NotFound),
            })
        }
        async fn get(&mut self, key: &[u8]) -> Result<Got<Vec<u8>>, KvError> {
            yield_now().await;
            Ok(self.map.borrow().get(key).map_or(Got::NotFound, |v| Got::Found(v.clone())))
        }
        async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
            Ok(self.map.borrow_mut().remove(key).map(|_| Written).ok_or(Missing::NotFound))
        }
    }

    impl Counting for Mock {
        fn begin(&self) {}
        fn roundtrips(&self) -> u32 {
            1
        }
    }

    /// One client alone: gates open at once.
    struct Alone(Cell<u64>);

    impl Env for Alone {
        fn now_ns(&self) -> u64 {
            self.0.set(self.0.get() + 10);
            self.0.get()
        }
        async fn gate(&self) -> Option<u64> {
            Some(self.now_ns())
        }
        fn abort(&self) {}
        fn aborted(&self) -> bool {
            false
        }
    }

    #[test]
    fn the_runner_loads_every_key_once_and_reads_only_existing_keys() {
        for workload in Workload::ALL {
            let s = RunSpec { workload, clients: 1, inflight: vec![1, 3], keys: 500, ops: 3000, ..spec() };
            let map = Rc::new(RefCell::new(HashMap::new()));
            let inserts = Rc::new(RefCell::new(Vec::new()));
            let stores = (0..3).map(|_| Mock { map: map.clone(), inserts: inserts.clone() }).collect();
            let r = block_on(run_client(&s, 0, stores, &chooser(&s), &Alone(Cell::new(0)))).unwrap();
            let names = s.key_names().unwrap();
            let inserted = inserts.borrow();
            let loaded: HashSet<&Vec<u8>> = inserted[..500].iter().collect();
            assert_eq!(loaded.len(), 500, "every key once");
            assert!((0..500).all(|n| loaded.contains(&names.name(n))));
            let all: HashSet<&Vec<u8>> = inserted.iter().collect();
            assert_eq!(all.len(), inserted.len(), "{workload}: run inserts are new keys");
            assert_eq!(r.load.count(), 500);
            for m in &r.runs {
                assert_eq!(m.count(), 3000, "{workload}");
                assert_eq!(m.op(OpKind::Get).summary(1).not_found, 0, "{workload}: reads of missing keys");
                assert_eq!(m.op(OpKind::Update).summary(1).not_found, 0, "{workload}");
                assert!(m.window_ns() > 0);
            }
        }
    }

    proptest::proptest! {
        /// Rounds split the measured operations exactly, each with its own
        /// seed, and nothing else of the run changes.
        #[test]
        fn rounds_share_the_operations(ops in 1u64..10_000, rounds in 1u64..20) {
            let s = RunSpec { ops, ..spec() };
            let parts: Vec<RunSpec> = (0..rounds).filter_map(|r| s.round(r, rounds)).collect();
            if ops < rounds {
                proptest::prop_assert!(parts.is_empty());
                return Ok(());
            }
            proptest::prop_assert_eq!(parts.len() as u64, rounds);
            proptest::prop_assert_eq!(parts.iter().map(|p| p.ops).sum::<u64>(), ops);
            for (r, p) in parts.iter().enumerate() {
                proptest::prop_assert!(p.ops >= 1 && p.ops.abs_diff(ops / rounds) <= 1);
                proptest::prop_assert_eq!(p.seed, s.seed + r as u64);
                proptest::prop_assert_eq!(&RunSpec { ops, seed: s.seed, ..p.clone() }, &s);
            }
            proptest::prop_assert!(s.round(rounds, rounds).is_none());
        }
    }

    #[test]
    fn spec_json_round_trips() {
        let s = spec();
        assert_eq!(RunSpec::from_json(&s.to_json()), Ok(s.clone()));
        let d = RunSpec { workload: Workload::D, warm_cache: false, ..s };
        assert_eq!(RunSpec::from_json(&d.to_json()), Ok(d));
    }

    #[test]
    fn impossible_runs_are_refused_in_words() {
        assert_eq!(spec().check(), Ok(()));
        let e = RunSpec { clients: 64, inflight: vec![1, 2], ..spec() }.check().unwrap_err();
        assert!(e.contains("need 128 client ids"), "{e}");
        let e = RunSpec { key_size: 5, ..spec() }.check().unwrap_err();
        assert!(e.contains("cannot name"), "{e}");
        let e = RunSpec { key_size: 300, ..spec() }.check().unwrap_err();
        assert!(e.contains("255"), "{e}");
        let e = RunSpec { value_size: 1 << 20, ..spec() }.check().unwrap_err();
        assert!(e.contains("64 KiB"), "{e}");
    }

    #[test]
    fn shares_add_up() {
        for total in [0u64, 1, 7, 100] {
            for k in 1..5 {
                assert_eq!((0..k).map(|i| share(total, k, i)).sum::<u64>(), total);
            }
        }
    }

    #[test]
    fn inserts_are_bounded_and_only_in_d() {
        assert_eq!(spec().max_inserts(), 0);
        assert_eq!(spec().key_bound(), 1000);
        let d = RunSpec { workload: Workload::D, ..spec() };
        assert!(d.max_inserts() > 0 && d.max_inserts() <= 2 * 2 * 110);
        assert!(d.key_bound() > 1000 + 4 * 220);
        assert_eq!(RunSpec { workload: Workload::C, ..spec() }.writes_bound(), 1000);
    }
}
