//! `swarm serve` and `swarm rpc`: a server beside a memory node, as its own
//! process, and a client that calls it.
//!
//! ```text
//! swarm memnode create --dir demo --nodes 3 --size 256M
//! swarm serve --dir demo --node 0 &          # until SIGINT or SIGTERM
//! swarm rpc --dir demo --node 0 ping --count 1000
//! swarm rpc --dir demo --node 0 stats
//! ```
//!
//! The server serves the server role of the store on the cluster, if one
//! was set up (`swarm kv init`) and its system has one (`KvSystem::serve`),
//! and otherwise the bare server: pings and its counters. It runs on a shm
//! cluster (`--dir`), a cxl cluster (`--path`), or an RDMA cluster
//! (`--cluster FILE`, in a build with `--features rdma`), where it reaches
//! its node as an RDMA client. SIGINT or SIGTERM stop it cleanly: it ends
//! its incarnation, so that clients are told the server stopped instead of
//! timing out.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use swarm_backend_cxl::{CxlCluster, CxlConfig};
use swarm_backend_shm::ShmCluster;
use swarm_core::kv::{KvError, StoreConfig};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::msg::MsgError;
use swarm_core::substrate::msg::area::Geometry;
use swarm_core::substrate::msg::rpc::{Channel, method};
use swarm_core::substrate::msg::server::{self, Bare, Shell, Stats, ThreadShell};
use swarm_core::systems;
use swarm_core::{Memory, NodeId};

use crate::args::{NodeBackend, Place, format_size, parse_size};

/// `swarm serve`.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The cluster.
    #[command(flatten)]
    pub place: Place,
    /// rdma: the cluster file of the RDMA memory nodes (instead of --dir or --path).
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// The memory node to serve beside.
    #[arg(long, value_name = "N", value_parser = parse_node)]
    pub node: u16,
}

/// `swarm rpc`.
#[derive(Args, Debug)]
pub struct RpcArgs {
    /// The cluster.
    #[command(flatten)]
    pub place: Place,
    /// The node whose server to call.
    #[arg(long, value_name = "N", value_parser = parse_node)]
    pub node: u16,
    /// The channel to call on: a client id, 0 to 127 (127, the default, is
    /// the setup id; processes calling at once need different ones).
    #[arg(long, value_name = "N", default_value_t = 127, value_parser = parse_channel)]
    pub id: u16,
    /// How long a call waits for its answer, ms.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = parse_timeout)]
    pub timeout_ms: u64,
    /// What to call.
    #[command(subcommand)]
    pub call: RpcCall,
}

/// `swarm rpc ...`.
#[derive(Subcommand, Debug)]
pub enum RpcCall {
    /// Ping the server and print the calls' latency.
    Ping {
        /// Calls.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_count)]
        count: u64,
        /// Bytes of each ping's body (echoed back).
        #[arg(long, value_name = "BYTES", default_value = "8", value_parser = parse_body)]
        size: usize,
    },
    /// Print the server's counters.
    Stats,
}

fn parse_node(s: &str) -> Result<u16, String> {
    s.trim().parse::<u16>().map_err(|_| format!("'{s}' is not a node number"))
}

fn parse_channel(s: &str) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(n @ 0..=127) => Ok(n),
        _ => Err("channels (client ids) go from 0 to 127".into()),
    }
}

fn parse_timeout(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n @ 1..=3_600_000) => Ok(n),
        _ => Err("the time-out is 1 to 3600000 ms".into()),
    }
}

fn parse_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n @ 1..=100_000_000) => Ok(n),
        _ => Err("the count is 1 to 100000000".into()),
    }
}

fn parse_body(s: &str) -> Result<usize, String> {
    let max = Geometry::default().max_message() - 8;
    match parse_size(s)? {
        n if n <= max => Ok(n as usize),
        _ => Err(format!("a ping's body has at most {max} bytes")),
    }
}

/// A cluster a server or client opened, whichever backend.
enum Opened {
    Shm(ShmCluster),
    Cxl(CxlCluster),
}

fn open(place: &Place) -> Result<Opened, String> {
    match place.backend {
        NodeBackend::Shm => {
            let dir = crate::memnode::shm_dir(place)?;
            let c = ShmCluster::open(dir)
                .map_err(|e| format!("{e} (make a cluster with `swarm memnode create --dir ...`)"))?;
            Ok(Opened::Shm(c))
        }
        NodeBackend::Cxl => {
            let paths = crate::memnode::cxl_paths(&place.path, place.dir.as_deref())?;
            let c = CxlCluster::open(&paths, &CxlConfig::default()).map_err(|e| e.to_string())?;
            crate::memnode::print_warnings(&c);
            Ok(Opened::Cxl(c))
        }
    }
}

/// `swarm serve`.
pub fn serve(a: &ServerArgs) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }
    let shell = ThreadShell::new(stop);
    if let Some(file) = &a.cluster {
        if a.place.dir.is_some() || !a.place.path.is_empty() {
            return Err("--cluster names RDMA memory nodes; give it without --dir or --path".into());
        }
        let mem = crate::rdma::connect_one(file, "swarm serve")?;
        return serve_on(mem, NodeId(a.node), &file.display().to_string(), &shell);
    }
    let place = place_name(&a.place);
    match open(&a.place)? {
        Opened::Shm(c) => serve_on(c.memory(), NodeId(a.node), &place, &shell),
        Opened::Cxl(c) => serve_on(c.memory(), NodeId(a.node), &place, &shell),
    }
}

fn place_name(p: &Place) -> String {
    match (&p.dir, p.path.first()) {
        (Some(d), _) => d.display().to_string(),
        (None, Some(p)) => p.display().to_string(),
        (None, None) => "the cluster".into(),
    }
}

/// Serves `node` of `mem` until `shell` says stop, as the store's server
/// if there is a store, else bare until one is set up (`swarm kv init`
/// after `swarm serve`), then as its server.
fn serve_on<M: Memory>(mem: M, node: NodeId, place: &str, shell: &ThreadShell) -> Result<(), String> {
    if node.index() >= mem.node_count() {
        return Err(format!("{place} has {} node(s); there is no {node}", mem.node_count()));
    }
    let start = Instant::now();
    let store = match store_config(&mem) {
        Ok(store) => store,
        Err(e) => return Err(format!("{place}: cannot read the store's configuration: {e}")),
    };
    let served = match store {
        Some(cfg) => serve_store(&mem, node, place, &cfg, shell),
        None => {
            let line = format!(
                "serving {node} of {place} as bare (ping, stats) until a store is set up; SIGINT or SIGTERM stops it"
            );
            let until = UntilStore {
                inner: shell,
                mem: &mem,
                line,
                next_check: Cell::new(Instant::now()),
                found: RefCell::new(None),
            };
            let bare = block_on(server::serve(&mem, node, Geometry::default(), Bare, &until));
            let bare = bare.map_err(|e| format!("the server beside {node} stopped: {e}"))?;
            match until.found.take() {
                Some(cfg) => {
                    print_stats("a store was set up: bare", start, &bare);
                    serve_store(&mem, node, place, &cfg, shell)
                }
                None => Ok(bare),
            }
        }
    };
    print_stats("stopped", start, &served?);
    Ok(())
}

/// The store's configuration, if a store was set up.
fn store_config<M: Memory>(mem: &M) -> Result<Option<StoreConfig>, KvError> {
    match block_on(systems::open(mem)) {
        Ok(r) => Ok(Some(r.config)),
        Err(KvError::NoStore) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Serves the server role of the store of `cfg`.
fn serve_store<M: Memory>(
    mem: &M,
    node: NodeId,
    place: &str,
    cfg: &StoreConfig,
    shell: &ThreadShell,
) -> Result<Stats, String> {
    let line = format!("serving {node} of {place} as {}'s server; SIGINT or SIGTERM stops it", cfg.system);
    let shell = Announcing { inner: shell, line };
    block_on(systems::serve(mem, node, cfg, &shell)).map_err(|e| format!("the server beside {node} stopped: {e}"))
}

fn print_stats(what: &str, start: Instant, stats: &Stats) {
    println!(
        "{what} after {:.1} s: {} request(s) served ({} refused), {} answer(s) dropped, {} connection(s)",
        start.elapsed().as_secs_f64(),
        stats.served,
        stats.refused,
        stats.dropped,
        stats.resets
    );
}

/// A thread's shell that prints its line once the server can be called
/// (tests and scripts wait for it before they start clients).
struct Announcing<'a> {
    inner: &'a ThreadShell,
    line: String,
}

impl Shell for Announcing<'_> {
    fn stopped(&self) -> bool {
        self.inner.stopped()
    }

    async fn idle(&self, idle: u32) {
        self.inner.idle(idle).await
    }

    fn started(&self) {
        println!("{}", self.line);
    }
}

/// How often a bare server looks for a store set up since it started.
const STORE_CHECK: Duration = Duration::from_millis(200);

/// The shell of a bare server on a cluster with no store yet: it stops
/// serving bare once a store is set up, so that the server takes the
/// store's role (a new incarnation: clients that called it bare are told
/// to reconnect).
struct UntilStore<'a, M> {
    inner: &'a ThreadShell,
    mem: &'a M,
    line: String,
    next_check: Cell<Instant>,
    found: RefCell<Option<StoreConfig>>,
}

impl<M: Memory> Shell for UntilStore<'_, M> {
    fn stopped(&self) -> bool {
        self.inner.stopped() || self.found.borrow().is_some()
    }

    async fn idle(&self, idle: u32) {
        if Instant::now() >= self.next_check.get() {
            self.next_check.set(Instant::now() + STORE_CHECK);
            if let Ok(Some(cfg)) = systems::open(self.mem).await.map(|r| Some(r.config)) {
                *self.found.borrow_mut() = Some(cfg);
                return;
            }
        }
        self.inner.idle(idle).await
    }

    fn started(&self) {
        println!("{}", self.line);
    }
}

/// `swarm rpc`.
pub fn rpc(a: &RpcArgs) -> Result<(), String> {
    match open(&a.place)? {
        Opened::Shm(c) => rpc_on(&c.memory(), a),
        Opened::Cxl(c) => rpc_on(&c.memory(), a),
    }
}

fn rpc_on<M: Memory>(mem: &M, a: &RpcArgs) -> Result<(), String> {
    let node = NodeId(a.node);
    if node.index() >= mem.node_count() {
        return Err(format!("the cluster has {} node(s); there is no {node}", mem.node_count()));
    }
    let said = |e: MsgError| match e {
        MsgError::TimedOut => format!("the server beside {node} did not answer within {} ms", a.timeout_ms),
        e => e.to_string(),
    };
    let mut ch = block_on(Channel::connect(mem, node, a.id)).map_err(said)?;
    let clock = SystemClock::starting_now();
    let timeout = Duration::from_millis(a.timeout_ms).as_nanos() as u64;
    match a.call {
        RpcCall::Stats => {
            let body =
                block_on(ch.call(mem, &clock, timeout, method::STATS, &[])).and_then(|r| r.ok()).map_err(said)?;
            let s = Stats::decode(&body).ok_or("the server's counters are malformed")?;
            println!(
                "{node}: {} request(s) served ({} refused), {} answer(s) dropped, {} connection(s), {} pass(es)",
                s.served, s.refused, s.dropped, s.resets, s.passes
            );
        }
        RpcCall::Ping { count, size } => {
            let body: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let mut lat = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let t = Instant::now();
                let echo =
                    block_on(ch.call(mem, &clock, timeout, method::PING, &body)).and_then(|r| r.ok()).map_err(said)?;
                lat.push(t.elapsed());
                if echo[..] != body[..] {
                    return Err(format!("{node}'s server echoed {} bytes that are not the ping's", echo.len()));
                }
            }
            lat.sort();
            let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
            println!(
                "{count} ping(s) of {} answered by {node}'s server: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
                format_size(size as u64),
                pct(0.5),
                pct(0.99),
                pct(1.0)
            );
        }
    }
    Ok(())
}
