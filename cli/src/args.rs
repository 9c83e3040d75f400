//! The command line of `swarm`: clap definitions, and the value parsers that
//! check every number and name a user types.
//!
//! All validation of single values happens here, so that a bad flag becomes
//! one `error: ...` line from clap (see `main.rs`) before any work starts.
//! Checks that involve several flags (`--replicas` against a cluster's node
//! count, `--inject-rtt-us` with the simulator) are made by the commands.

use std::path::PathBuf;
pub use swarm_units::{format_size, parse_size};

use clap::{Args, Parser, Subcommand, ValueEnum};
use swarm_backend_cxl::FlushMode;
use swarm_backend_shm::{MAX_NODE_SIZE, MAX_NODES, PAGE_SIZE};
use swarm_core::swarm::inout::{MAX_META_WORDS, MAX_VALUE};
use swarm_core::swarm::meta::MAX_CLIENT;

/// Where clusters named by a bare name live, and where `memnode list` looks.
pub const SHM_ROOT: &str = "/dev/shm";
/// Prefix of the directory of a cluster named by a bare name.
pub const NAME_PREFIX: &str = "swarm-";
/// Most benchmark clients: ids `1..=MAX_CLIENT - 1`; the last id belongs to
/// the setup client that creates the registers.
pub const MAX_CLIENTS: u8 = MAX_CLIENT - 1;
/// Most measured (or warm-up) operations per client: bounds the memory of
/// the latency samples and of the writers' logs (never recycled).
pub const MAX_OPS: u64 = 100_000_000;
/// Most registers in one benchmark.
pub const MAX_REGISTERS: u32 = 1_000_000;
/// Largest injected roundtrip latency, µs (one second).
pub const MAX_RTT_US: f64 = 1e6;

/// `swarm`: memory nodes and benchmarks for replicated data in
/// disaggregated memory (SWARM, Safe-Guess, In-n-Out).
#[derive(Parser, Debug)]
#[command(name = "swarm", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create, list and remove clusters of memory nodes: in shared memory
    /// (`--backend shm`, a directory in /dev/shm) or on DAX devices and
    /// files (`--backend cxl`); or serve one RDMA memory node
    /// (`swarm memnode --backend rdma --listen ADDR --size SIZE`).
    Memnode(MemnodeArgs),
    /// Compare the key-value stores side by side on a YCSB workload:
    /// throughput, latency percentiles, roundtrips, plots.
    Bench(crate::bench::ycsb::YcsbArgs),
    /// Benchmark Safe-Guess registers: latency, throughput and roundtrips
    /// of reads and writes.
    BenchRegister(BenchArgs),
    /// Get, put and delete keys of a store on a shm cluster, or open a
    /// small shell on it.
    Kv(crate::kv::KvArgs),
    /// Serve beside a memory node (the store's server role, or pings and
    /// counters) until SIGINT or SIGTERM.
    Serve(crate::serve::ServerArgs),
    /// Call the server beside a memory node: ping it, or read its counters.
    Rpc(crate::serve::RpcArgs),
    /// A worker process of `swarm bench --processes` (internal).
    #[command(hide = true)]
    YcsbWorker,
}

/// `swarm memnode ...`: a subcommand for shm and cxl clusters, or the
/// flags of an RDMA memory-node daemon.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MemnodeArgs {
    /// What to do with a shm or cxl cluster.
    #[command(subcommand)]
    pub action: Option<Memnode>,
    /// Or: serve one RDMA memory node.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `swarm memnode --backend rdma ...`: one memory node as a daemon that
/// RDMA clients connect to (runs until SIGINT or SIGTERM).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// rdma: serve one memory node over RDMA verbs (shm and cxl clusters
    /// are made with `swarm memnode create`).
    #[arg(long, value_name = "BACKEND", value_parser = parse_serve_backend)]
    pub backend: Option<ServeBackend>,
    /// rdma: the TCP address clients bootstrap through, HOST:PORT or HOST
    /// (port 7471).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// rdma: bytes of the node's registered region, a multiple of 4 KiB;
    /// suffixes K, M, G, T.
    #[arg(long, value_name = "SIZE", value_parser = parse_node_size)]
    pub size: Option<u64>,
    /// rdma: the RDMA device (`ibv_devices`) [default: the first].
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// rdma: the device's port, from 1.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_ib_port)]
    pub port: u8,
    /// rdma: the GID index for RoCE (`show_gids`) [default: none, InfiniBand LIDs].
    #[arg(long, value_name = "N")]
    pub gid_index: Option<u8>,
    /// rdma: clients served at once; more are turned away.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = parse_max_clients)]
    pub max_clients: usize,
}

/// What `swarm memnode` without a subcommand serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeBackend {
    /// An RDMA memory node.
    Rdma,
}

fn parse_serve_backend(s: &str) -> Result<ServeBackend, String> {
    match s.trim() {
        "rdma" => Ok(ServeBackend::Rdma),
        b @ ("shm" | "cxl") => Err(format!(
            "{b} clusters are made with a subcommand: `swarm memnode create --backend {b} ...` (list, remove)"
        )),
        _ => Err(format!("'{s}' is not a backend (`swarm memnode --backend rdma` serves an RDMA memory node)")),
    }
}

fn parse_ib_port(s: &str) -> Result<u8, String> {
    int_in(s, "the device port", 1, 255)
}

fn parse_max_clients(s: &str) -> Result<usize, String> {
    int_in(s, "the number of clients", 1, 65536)
}

/// `swarm memnode create|list|remove`.
#[derive(Subcommand, Debug)]
pub enum Memnode {
    /// Create a cluster and format its nodes for SWARM clients.
    Create(CreateArgs),
    /// List the clusters this tool created (shm: under --root; cxl: the one on --path).
    List(ListArgs),
    /// Remove a cluster (shm: its node files and directory; cxl: its files, or a device's header).
    Remove(RemoveArgs),
    /// Fail, stall or heal a node of a running shm cluster, for every process using it (experiments).
    Fault(FaultArgs),
    /// Show how each node's memory is used: claimed, free, writer logs in use and given back.
    Stats(StatsArgs),
}

/// Where `swarm memnode` lays out nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeBackend {
    /// A directory of node files in shared memory (`--dir`).
    Shm,
    /// DAX devices or files (`--path`, once per device or file; nodes are
    /// divided among them, or partition the only one).
    Cxl,
}

/// Where a memnode command finds its cluster: `--backend` with `--dir`
/// (shm) or `--path` (cxl).
#[derive(Args, Debug)]
pub struct Place {
    /// The kind of memory.
    #[arg(long, value_enum, default_value_t = NodeBackend::Shm)]
    pub backend: NodeBackend,
    /// shm: the cluster's directory, a path or a bare NAME for /dev/shm/swarm-NAME.
    #[arg(long, value_name = "DIR", value_parser = parse_dir)]
    pub dir: Option<PathBuf>,
    /// cxl: a device-dax (/dev/daxX.Y) or file; repeat for several.
    #[arg(long, value_name = "PATH")]
    pub path: Vec<PathBuf>,
}

/// `swarm memnode create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Where.
    #[command(flatten)]
    pub place: Place,
    /// Number of memory nodes.
    #[arg(long, value_name = "N", value_parser = parse_nodes)]
    pub nodes: usize,
    /// Bytes per node, a multiple of 4 KiB; suffixes K, M, G, T (powers of 1024).
    #[arg(long, value_name = "SIZE", value_parser = parse_node_size)]
    pub size: u64,
    /// Allocation chunk (also one writer-log segment), a multiple of 4 KiB.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_chunk)]
    pub chunk: u64,
    /// Largest value a register on this cluster may hold (sizes its writer-log entries).
    #[arg(long, value_name = "SIZE", default_value = "8K", value_parser = parse_max_value)]
    pub max_value: u64,
}

/// `swarm memnode list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// The directory to look in (shm).
    #[arg(long, value_name = "DIR", default_value = SHM_ROOT)]
    pub root: PathBuf,
    /// Show this shm cluster only (a path or a bare NAME for /dev/shm/swarm-NAME), as the other subcommands name it.
    #[arg(long, value_name = "DIR", value_parser = parse_dir, conflicts_with_all = ["root", "path"])]
    pub dir: Option<PathBuf>,
    /// Show the cxl cluster on these devices or files instead; repeat for several.
    #[arg(long, value_name = "PATH")]
    pub path: Vec<PathBuf>,
}

/// `swarm memnode stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Where.
    #[command(flatten)]
    pub place: Place,
    /// Print the table again every DURATION (e.g. 1s, 500ms), until interrupted: a store left running.
    #[arg(long, value_name = "DURATION", value_parser = crate::bench::timed::parse_duration)]
    pub every: Option<u64>,
}

/// `swarm memnode remove`.
#[derive(Args, Debug)]
pub struct RemoveArgs {
    /// Where.
    #[command(flatten)]
    pub place: Place,
}

/// `swarm memnode fault`.
#[derive(Args, Debug)]
pub struct FaultArgs {
    /// Where (shm only: its control file is shared by every process).
    #[command(flatten)]
    pub place: Place,
    /// The node.
    #[arg(long, value_name = "N")]
    pub node: u16,
    /// fail (operations fail at once), stall (they wait, unapplied, until
    /// the node heals or their client's timeout) or heal.
    #[arg(value_enum)]
    pub state: FaultState,
}

/// What `swarm memnode fault` makes of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FaultState {
    /// Operations on the node fail at once (unreachable).
    Fail,
    /// Operations on the node wait, unapplied.
    Stall,
    /// The node serves again.
    Heal,
}

/// Which memory `swarm bench` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Shared memory with real threads: in-process, or the cluster of `--dir`.
    Shm,
    /// DAX devices or files (`--path`) with real threads, cache-line
    /// flushes and fences (`--flush`).
    Cxl,
    /// The deterministic simulator: clients are tasks, time is virtual.
    Sim,
}

/// `swarm bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The memory to run on.
    #[arg(long, value_enum, default_value_t = Backend::Shm)]
    pub backend: Backend,
    /// Client threads (simulator: tasks), each with its own client id.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = parse_clients)]
    pub clients: u8,
    /// Replicas of each register (2f+1, tolerating f crashed nodes).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_replicas)]
    pub replicas: usize,
    /// Bytes of every written value (suffixes allowed, at most 64K).
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_value_size)]
    pub value_size: u64,
    /// Measured operations per client.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = parse_ops)]
    pub ops: u64,
    /// Unmeasured operations per client before the measurement [default: ops / 10].
    #[arg(long, value_name = "N", value_parser = parse_warmup)]
    pub warmup: Option<u64>,
    /// Share of reads among operations, 0 to 1.
    #[arg(long, value_name = "F", default_value_t = 0.5, value_parser = parse_ratio, allow_negative_numbers = true)]
    pub read_ratio: f64,
    /// Registers; each operation picks one uniformly (1: all clients contend).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = parse_registers)]
    pub registers: u32,
    /// Metadata words per In-n-Out object [default: one per client, up to 128].
    #[arg(long, value_name = "N", value_parser = parse_meta_words)]
    pub meta_words: Option<u32>,
    /// Latency injected into every roundtrip, µs (shm and cxl).
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_rtt_us, allow_negative_numbers = true)]
    pub inject_rtt_us: f64,
    /// Simulator: a jittery network (roundtrips of 1-3 µs, one message in 20
    /// ten times slower, operations to one node reordered) instead of a
    /// fixed 2 µs roundtrip.
    #[arg(long)]
    pub sim_jitter: bool,
    /// Seed of the operation mix (and of the whole run with the simulator).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Run on the cluster that `swarm memnode create` made there, instead of
    /// in-process memory (shm only).
    #[arg(long, value_name = "DIR", value_parser = parse_dir)]
    pub dir: Option<PathBuf>,
    /// cxl: the device-dax or file(s) of a cluster that `swarm memnode
    /// create --backend cxl` made, or path(s) that do not exist yet, where the
    /// benchmark lays out nodes for the run and removes them afterwards;
    /// repeat for several.
    #[arg(long, value_name = "PATH")]
    pub path: Vec<PathBuf>,
    /// cxl: how memory is kept durable or coherent: none, persist (write back
    /// and fence before every CAS and completion) or noncoherent (also
    /// invalidate before reads: CXL pools shared by hosts without coherence)
    /// [default: persist].
    #[arg(long, value_name = "MODE", value_parser = parse_flush)]
    pub flush: Option<FlushMode>,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// A size that must be a positive multiple of the page size, at most `max`.
fn page_multiple(s: &str, what: &str, max: u64) -> Result<u64, String> {
    let n = parse_size(s)?;
    if n == 0 {
        return Err(format!("{what} must be positive"));
    }
    if !n.is_multiple_of(PAGE_SIZE) {
        return Err(format!("{what} must be a multiple of 4 KiB ({PAGE_SIZE} bytes), not {n}"));
    }
    if n > max {
        return Err(format!("{what} may be at most {}", format_size(max)));
    }
    Ok(n)
}

fn parse_node_size(s: &str) -> Result<u64, String> {
    page_multiple(s, "node size", MAX_NODE_SIZE)
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    // A chunk is at most 32 MiB: the allocator's largest size class.
    page_multiple(s, "chunk size", 32 << 20)
}

fn parse_max_value(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the largest value must be positive".into()),
        n if n > MAX_VALUE => Err(format!("values may be at most {} (the protocols' limit)", format_size(MAX_VALUE))),
        n => Ok(n),
    }
}

fn parse_value_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        n if n > MAX_VALUE => Err(format!("values may be at most {MAX_VALUE} bytes (the protocols' limit)")),
        n => Ok(n),
    }
}

/// Parses an integer in `lo..=hi`, naming `what` in the error.
pub(crate) fn int_in<T: TryFrom<u64>>(s: &str, what: &str, lo: u64, hi: u64) -> Result<T, String> {
    let n: u64 = s.trim().parse().map_err(|_| format!("'{s}' is not a whole number"))?;
    if n < lo || n > hi {
        return Err(format!("{what} must be between {lo} and {hi}"));
    }
    T::try_from(n).map_err(|_| format!("{what} is too large"))
}

fn parse_nodes(s: &str) -> Result<usize, String> {
    int_in(s, "the number of nodes", 1, MAX_NODES as u64)
}

fn parse_clients(s: &str) -> Result<u8, String> {
    int_in(s, "the number of clients", 1, MAX_CLIENTS as u64)
}

pub(crate) fn parse_replicas(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n @ (3 | 5 | 7)) => Ok(n),
        _ => Err("replicas must be 3, 5 or 7".into()),
    }
}

pub(crate) fn parse_ops(s: &str) -> Result<u64, String> {
    int_in(s, "the number of operations", 1, MAX_OPS)
}

pub(crate) fn parse_warmup(s: &str) -> Result<u64, String> {
    int_in(s, "the number of warm-up operations", 0, MAX_OPS)
}

fn parse_registers(s: &str) -> Result<u32, String> {
    int_in(s, "the number of registers", 1, MAX_REGISTERS as u64)
}

fn parse_meta_words(s: &str) -> Result<u32, String> {
    int_in(s, "the number of metadata words", 1, MAX_META_WORDS as u64)
}

/// A finite float in `lo..=hi`.
fn float_in(s: &str, what: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let f: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !f.is_finite() || f < lo || f > hi {
        return Err(format!("{what} must be between {lo} and {hi}"));
    }
    Ok(f)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    float_in(s, "the read ratio", 0.0, 1.0)
}

fn parse_flush(s: &str) -> Result<FlushMode, String> {
    s.trim().parse()
}

pub(crate) fn parse_rtt_us(s: &str) -> Result<f64, String> {
    float_in(s, "the injected latency", 0.0, MAX_RTT_US)
}

/// Resolves a cluster directory: a bare name (no `/`) is
/// `/dev/shm/swarm-NAME` (a name that already starts with `swarm-` is not
/// prefixed twice, so the names `memnode list` prints work too); anything
/// else is a path.
pub fn parse_dir(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("the directory must not be empty".into());
    }
    if s.contains('/') {
        return Ok(PathBuf::from(s));
    }
    if s == "." || s == ".." {
        return Err(format!("'{s}' is not a cluster name"));
    }
    let name = if s.starts_with(NAME_PREFIX) { s.to_string() } else { format!("{NAME_PREFIX}{s}") };
    Ok(PathBuf::from(SHM_ROOT).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn node_sizes() {
        assert_eq!(parse_node_size("64M"), Ok(64 << 20));
        assert!(parse_node_size("0").unwrap_err().contains("positive"));
        assert!(parse_node_size("4097").unwrap_err().contains("multiple of 4 KiB"));
        assert!(parse_node_size("2T").unwrap_err().contains("at most"));
        assert!(parse_chunk("64M").is_err());
        assert!(parse_max_value("65K").is_err() && parse_max_value("0").is_err());
        assert_eq!(parse_value_size("0"), Ok(0));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_replicas("5"), Ok(5));
        assert!(parse_replicas("4").is_err() && parse_replicas("9").is_err() && parse_replicas("x").is_err());
        assert!(parse_clients("0").is_err() && parse_clients("127").is_err());
        assert_eq!(parse_clients("126"), Ok(126));
        assert!(parse_ratio("1.01").is_err() && parse_ratio("NaN").is_err() && parse_ratio("-0.1").is_err());
        assert_eq!(parse_ratio("1"), Ok(1.0));
        assert!(parse_rtt_us("inf").is_err());
        assert!(parse_ops("0").is_err());
    }

    #[test]
    fn dirs() {
        assert_eq!(parse_dir("a"), Ok(PathBuf::from("/dev/shm/swarm-a")));
        assert_eq!(parse_dir("swarm-a"), Ok(PathBuf::from("/dev/shm/swarm-a")));
        assert_eq!(parse_dir("/tmp/x"), Ok(PathBuf::from("/tmp/x")));
        assert_eq!(parse_dir("./x"), Ok(PathBuf::from("./x")));
        assert!(parse_dir("").is_err() && parse_dir("..").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_defaults() {
        let cli = Cli::try_parse_from(["swarm", "bench-register"]).unwrap();
        let Command::BenchRegister(b) = cli.command else { panic!("not bench-register") };
        assert_eq!((b.backend, b.clients, b.replicas, b.value_size, b.ops), (Backend::Shm, 2, 3, 64, 20_000));
        assert_eq!((b.warmup, b.read_ratio, b.registers, b.inject_rtt_us, b.seed), (None, 0.5, 1, 0.0, 1));
    }
}
