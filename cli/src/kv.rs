//! `swarm kv`: a key-value store for a person at a terminal, on a shm
//! cluster that `swarm memnode create` made.
//!
//! ```text
//! swarm memnode create --dir demo --nodes 3 --size 256M
//! swarm kv --dir demo init --system swarm-kv     # once
//! swarm kv --dir demo put greeting hello
//! swarm kv --dir demo get greeting
//! swarm kv --dir demo delete greeting
//! swarm kv --dir demo shell                      # get/put/insert/update/delete/help/quit
//! ```
//!
//! `memnode create` formats regions and writer logs; `kv init` sets up the
//! store of any registered system ([`swarm_core::systems::format`]: its
//! structures, and a record of its configuration, options and the clients'
//! clock epoch on every node), so that every later command, in any process,
//! connects with the same shape ([`swarm_core::systems::open`]). Each
//! process claims a free client id from the store's lease table
//! ([`swarm_core::substrate::lease`]), renews its lease while it works and
//! gives the id back when it exits, with its log where the next holder goes
//! on; a process that is killed keeps its id until its lease expires
//! (`init --lease`, 10 s by default, plus 3 s for clocks that differ).
//! `--id N` asks for one id, and fails, naming when it frees, if a live
//! process holds it.
//!
//! `init` refuses nodes on which some client could not write a key
//! ([`StoreConfig::min_node_bytes`], which `memnode create` checks for the
//! smallest store). Connecting and gets claim no memory, so a full store
//! stays readable; a write that finds a node full names it and the bytes.
//! Errors name what went wrong: a node down (node 0 holds the index), a
//! full node or log, timestamps run out, a clock ahead.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use swarm_backend_shm::{ShmBuf, ShmCluster, ShmMemory};
use swarm_core::kv::place::INDEX_NODE;
use swarm_core::kv::{AnyClient, Got, KvClient, KvError, Missing, NodeShape, StoreConfig, System, Who, Written};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::lease::{Held, LeaseError, Want};
use swarm_core::substrate::msg::MsgError;
use swarm_core::substrate::msg::area::{Area, State};
use swarm_core::substrate::msg::rpc::{Channel, Status, method};
use swarm_core::substrate::msg::server::{Bare, Service};
use swarm_core::substrate::space::region::{Region, RegionError};
use swarm_core::substrate::value::Value;
use swarm_core::swarm::writerlog::{LogError, Logs};
use swarm_core::systems;
use swarm_core::{Memory, NodeId};

use crate::args::{format_size, parse_dir, parse_size};
use crate::memnode::{exact_size, size_at_least};

/// `swarm kv`.
#[derive(Args, Debug)]
pub struct KvArgs {
    /// The cluster (`swarm memnode create --dir`): a path, or a bare NAME
    /// for /dev/shm/swarm-NAME.
    #[arg(long, value_name = "DIR", value_parser = parse_dir)]
    pub dir: PathBuf,
    /// The client id to claim, from 1 to the store's writers (by default
    /// the lowest free one): held by one live process at a time.
    #[arg(long, value_name = "N", value_parser = parse_id)]
    pub id: Option<u8>,
    /// What to do.
    #[command(subcommand)]
    pub command: KvCommand,
}

/// `swarm kv ...`.
#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// Set up a key-value store on the cluster (once).
    Init(InitArgs),
    /// Print a key's value.
    Get {
        /// The key.
        key: String,
    },
    /// Insert a key, or update it if it exists.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Delete a key.
    Delete {
        /// The key.
        key: String,
    },
    /// Show the store's configuration.
    Info,
    /// A small shell reading commands from stdin (type `help`).
    Shell,
}

/// `swarm kv init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// The store (one of `swarm bench --systems`' names: raw, dm-abd, swarm-kv,
    /// pdpm-direct, pdpm-central, clover, fusee).
    #[arg(long, value_name = "SYSTEM", default_value = "swarm-kv", value_parser = parse_system)]
    pub system: System,
    /// A system's own option, NAME=VALUE (e.g. swarm-kv's in-place=every); repeatable.
    #[arg(long = "option", value_name = "NAME=VALUE", value_parser = parse_option)]
    pub options: Vec<(String, String)>,
    /// Replicas of each key (odd; at most the cluster's nodes; RAW keeps one copy).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_replicas)]
    pub replicas: usize,
    /// Keys the store must hold (sizes its index).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = parse_keys)]
    pub keys: u64,
    /// Longest key, bytes.
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_max_key)]
    pub max_key: usize,
    /// Largest value, bytes (every key reserves room for one per replica).
    #[arg(long, value_name = "BYTES", default_value = "1K", value_parser = parse_max_value)]
    pub max_value: usize,
    /// Client ids that may be used (1..=N): processes using the store at
    /// the same time.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = parse_id)]
    pub writers: u8,
    /// How long a client id stays leased without renewal (a killed
    /// process's id frees this long after its last renewal, plus 3 s), e.g.
    /// 10s, 500ms.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_lease)]
    pub lease: u32,
}

fn parse_lease(s: &str) -> Result<u32, String> {
    use swarm_core::kv::config::{MAX_LEASE_MS, MIN_LEASE_MS};
    match swarm_units::parse_duration_ms(s)? {
        n if (MIN_LEASE_MS as u64..=MAX_LEASE_MS as u64).contains(&n) => Ok(n as u32),
        _ => Err(format!("leases last from {MIN_LEASE_MS} ms to one hour, not {s}")),
    }
}

fn parse_system(s: &str) -> Result<System, String> {
    systems::from_name(&s.trim().to_ascii_lowercase())
        .ok_or_else(|| format!("'{s}' is not a system (use one of {})", systems::names()))
}

/// `NAME=VALUE`.
fn parse_option(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("'{s}' is not an option (use NAME=VALUE)"))?;
    Ok((name.trim().to_ascii_lowercase(), value.trim().to_ascii_lowercase()))
}

/// Why `system` refused option `name=value`, with what it takes.
fn option_error(system: System, name: &str, value: &str) -> String {
    let opts = system.options();
    match opts.iter().find(|c| c.name == name) {
        Some(c) => format!("{system}'s option {name} takes {}, not '{value}'", c.values.join(", ")),
        None if opts.is_empty() => format!("{system} has no options ('{name}' given)"),
        None => format!(
            "{system} has no option '{name}' (its options: {})",
            opts.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn parse_id(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(n @ 1..=126) => Ok(n),
        _ => Err("client ids go from 1 to 126".into()),
    }
}

fn parse_replicas(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n @ (1 | 3 | 5 | 7)) => Ok(n),
        _ => Err("replicas must be 1, 3, 5 or 7".into()),
    }
}

fn parse_keys(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n @ 1..=100_000_000) => Ok(n),
        _ => Err("the number of keys must be between 1 and 100000000".into()),
    }
}

fn parse_max_key(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        n @ 1..=255 => Ok(n as usize),
        _ => Err("keys may have 1 to 255 bytes".into()),
    }
}

fn parse_max_value(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        n @ 1..=65536 => Ok(n as usize),
        _ => Err("values may have 1 to 65536 bytes".into()),
    }
}

/// The cluster of `dir`, with a reason in words if it cannot be used.
fn open_cluster(dir: &Path) -> Result<ShmCluster, String> {
    ShmCluster::open(dir).map_err(|e| format!("{e} (make a cluster with `swarm memnode create --dir ...`)"))
}

/// The store's configuration and clock epoch, from its record.
fn read_config(mem: &ShmMemory, dir: &Path) -> Result<(StoreConfig, u64), String> {
    match block_on(systems::open(mem)) {
        Ok(r) => Ok((r.config, r.epoch_us)),
        Err(KvError::NoStore) => {
            Err(format!("{} holds no key-value store yet (set one up with `swarm kv --dir {0} init`)", dir.display()))
        }
        Err(KvError::Corrupt) => Err(format!(
            "{}: the store's configuration record is unreadable (not a cluster of `swarm memnode create`, or \
             corrupt)",
            dir.display()
        )),
        Err(e) => Err(format!("{}: cannot read the store's configuration: {e}", dir.display())),
    }
}

/// Waits (up to 2 s) while the server beside `node` serves bare: one
/// started before the store was set up takes the store's role within
/// 200 ms of `swarm kv init` (`swarm serve`). Any other answer, or none,
/// is left to the client's own calls to report. It asks on channel 0, the
/// setup channel, which no client id uses.
fn wait_for_role(mem: &ShmMemory, node: NodeId) {
    let clock = SystemClock::starting_now();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let Ok(mut ch) = block_on(Channel::connect(mem, node, 0)) else { return };
        match block_on(ch.call(mem, &clock, 100_000_000, method::SERVICE, &[])) {
            Ok(r) if r.status == Status::Ok && *r.body == *Bare.name().as_bytes() => {}
            Err(MsgError::NoServer { .. } | MsgError::Superseded) => {}
            _ => return,
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `swarm kv`.
pub fn run(a: &KvArgs) -> Result<(), String> {
    let cluster = open_cluster(&a.dir)?;
    let mem = cluster.memory();
    if let KvCommand::Init(i) = &a.command {
        return init(&mem, &a.dir, i);
    }
    let (cfg, epoch_us) = read_config(&mem, &a.dir)?;
    if let Some(node) = cfg.system.server() {
        wait_for_role(&mem, node);
    }
    if let KvCommand::Info = a.command {
        let options: Vec<String> =
            cfg.system.options().iter().map(|c| format!("{}={}", c.name, cfg.option(c.name).unwrap_or("?"))).collect();
        println!(
            "{}: {} with {} replica(s), up to {} keys of at most {} B, values of at most {}, client ids 1 to {} \
             (leased for {} ms){}",
            a.dir.display(),
            cfg.system.name(),
            if cfg.system.replicated() { cfg.replicas } else { 1 },
            cfg.keys,
            cfg.max_key,
            format_size(cfg.max_value as u64),
            cfg.writers,
            cfg.lease_ms,
            if options.is_empty() { String::new() } else { format!(", options {}", options.join(" ")) }
        );
        return Ok(());
    }
    let want = match a.id {
        Some(id) if id > cfg.writers => {
            return Err(format!("--id {id} is not a client id of this store (1 to {})", cfg.writers));
        }
        Some(id) => Want::Id(id),
        None => Want::Any,
    };
    let clock = SystemClock { epoch_us };
    let held = claim(&mem, &cfg, &clock, want)?;
    let id = held.id;
    let why = Why { mem: mem.clone(), server: cfg.system.server(), dir: a.dir.clone() };
    let mut store = block_on(systems::connect_any(mem.clone(), &cfg, Who::Lease(held), clock))
        .map_err(|e| format!("cannot connect: {}", why.explain(e)))?;
    // A store that recovers a crashed holder's log at connect (FUSEE)
    // says so, with what it took.
    let p = store.paths();
    if p.log_recoveries > 0 {
        eprintln!(
            "recovered the log of client id {}'s crashed holder: walk {} us, redo {} us ({} in-doubt operation \
             redone)",
            id,
            p.log_walk_ns / 1_000,
            p.log_redo_ns / 1_000,
            p.log_redos
        );
    }
    let done = match &a.command {
        KvCommand::Get { key } => get(&mut store, &why, key).map(|out| print!("{out}")),
        KvCommand::Put { key, value } => put(&mut store, &why, key, value).map(|out| print!("{out}")),
        KvCommand::Delete { key } => delete(&mut store, &why, key).map(|out| print!("{out}")),
        KvCommand::Shell => shell(&mut store, &why, std::time::Duration::from_millis((cfg.lease_ms as u64 / 4).max(1))),
        KvCommand::Init(_) | KvCommand::Info => Ok(()),
    };
    // The id goes back whether the command succeeded or not.
    let closed = block_on(store.close()).map_err(|e| format!("cannot give the client id back: {e}"));
    done.and(closed)
}

/// `swarm kv init`: checks the cluster can hold the store, sets it up and
/// records its configuration.
fn init(mem: &ShmMemory, dir: &Path, i: &InitArgs) -> Result<(), String> {
    let mut cfg = StoreConfig::new(i.system, i.keys);
    cfg.replicas = if i.system.replicated() { i.replicas } else { 1 };
    cfg.max_key = i.max_key;
    cfg.max_value = i.max_value;
    cfg.writers = i.writers;
    cfg.lease_ms = i.lease;
    for (name, value) in &i.options {
        cfg.set_option(name, value).map_err(|_| option_error(i.system, name, value))?;
    }
    let nodes = mem.node_count();
    cfg.check(nodes).map_err(|e| e.to_string())?;
    if read_config(mem, dir).is_ok() {
        return Err(format!(
            "{} already holds a key-value store (see `swarm kv --dir {0} info`; `swarm memnode remove` and \
             create to start afresh)",
            dir.display()
        ));
    }
    let mut logs = Logs::new();
    let mut shape: Option<NodeShape> = None;
    for n in 0..nodes {
        let node = NodeId(n as u16);
        let not_formatted = |e: String| {
            format!("{}: {node} is not formatted ({e}); make clusters with `swarm memnode create`", dir.display())
        };
        let down = |e| format!("{}: {}; a store is set up with every node answering", dir.display(), KvError::Down(e));
        let region = block_on(Region::open(mem, node)).map_err(|e| match e {
            RegionError::Mem(e) if !e.is_request_error() => down(e),
            e => not_formatted(e.to_string()),
        })?;
        let geo = block_on(logs.geometry(mem, node)).map_err(|e| match e {
            LogError::Mem(e) if !e.is_request_error() => down(e),
            e => not_formatted(e.to_string()),
        })?;
        if i.max_value as u64 > geo.max_value() {
            return Err(format!(
                "the cluster holds values of up to {} bytes, not {} (see `swarm memnode create --max-value`)",
                geo.max_value(),
                i.max_value
            ));
        }
        let size = shape.map_or(region.size, |s| s.size.min(region.size));
        shape = Some(NodeShape { size, chunk: region.chunk, log: Some(geo) });
    }
    if let Some(shape) = shape {
        check_fits(&cfg, nodes, &shape)?;
    }
    // Values are allocated as keys are inserted, and a full node fails
    // that put, naming the node and the bytes.
    let epoch_us = SystemClock::unix_us().max(1);
    block_on(systems::format(mem, &cfg, epoch_us)).map_err(|e| format!("cannot set up the store: {e}"))?;
    println!(
        "{}: {} store for {} keys (keys up to {} B, values up to {}), client ids 1 to {}",
        dir.display(),
        cfg.system.name(),
        cfg.keys,
        cfg.max_key,
        format_size(cfg.max_value as u64),
        cfg.writers
    );
    if let Some(node) = cfg.system.server() {
        println!("its clients need its server: start `swarm serve --dir {} --node {}`", dir.display(), node.0);
    }
    Ok(())
}

/// Refuses nodes on which some client of the store could not write a key:
/// [`StoreConfig::min_node_bytes`] (what `swarm memnode create` checks
/// for the smallest store), with the numbers and what would fit.
fn check_fits(cfg: &StoreConfig, nodes: usize, shape: &NodeShape) -> Result<(), String> {
    let min = |c: &StoreConfig| {
        c.min_node_bytes(nodes, shape).map_err(|e| match e {
            KvError::BadConfig(why) => {
                format!("cannot set up the store on chunks of {}: {why}", format_size(shape.chunk))
            }
            e => format!("cannot set up the store: {e}"),
        })
    };
    let m = min(cfg)?;
    if m.bytes <= shape.size {
        return Ok(());
    }
    if m.structures + m.per_client > shape.size {
        return Err(format!(
            "the store does not fit in {}: the region header, log directory, lease table and the index for {} keys \
             take {}, and one client needs {} more to write a key, but nodes have {}; use fewer --keys, or \
             recreate the cluster with --size {} or more",
            m.node,
            cfg.keys,
            exact_size(m.structures),
            exact_size(m.per_client),
            exact_size(shape.size),
            size_at_least(m.structures + m.per_client)
        ));
    }
    let fewer = (1..cfg.writers).rev().find(|&w| {
        let c = StoreConfig { writers: w, ..cfg.clone() };
        min(&c).is_ok_and(|m| m.bytes <= shape.size)
    });
    Err(format!(
        "nodes of {} are too small for this store: {} with {} client ids needs {} on {} ({} for the region header, \
         log directory, lease table and index, then {} per client to write one key of up to {}); recreate the \
         cluster with --size {} or more (or a smaller --chunk), or use --writers {}",
        exact_size(shape.size),
        cfg.system,
        cfg.writers,
        exact_size(m.bytes),
        m.node,
        exact_size(m.structures),
        exact_size(m.per_client),
        format_size(cfg.max_value as u64),
        size_at_least(m.bytes),
        fewer.unwrap_or(1)
    ))
}

/// A client of a store on shared memory, whichever system it is.
type Client = AnyClient<'static, Value<ShmBuf>>;

/// What a store's errors need to be told to a person: the cluster, to
/// look at the server area of a store that has a server (an operation
/// that finds node 0 silent may have found its server gone, at connect or
/// at any later operation), and the directory, to say how to start one.
struct Why {
    mem: ShmMemory,
    server: Option<NodeId>,
    dir: PathBuf,
}

impl Why {
    /// A store error in words.
    fn explain(&self, e: KvError) -> String {
        match self.server.and_then(|node| no_server(&self.mem, node, &e).map(|why| (node, why))) {
            Some((node, why)) => {
                format!("{why}: start one with `swarm serve --dir {} --node {}`", self.dir.display(), node.0)
            }
            None => explain(e),
        }
    }

    /// A failed operation on `key`, in words.
    fn error(&self, what: &str, key: &str, e: KvError) -> String {
        format!("{what} '{key}': {}", self.explain(e))
    }
}

/// Why the store's server beside `node` did not answer a client's
/// connection that failed with `e`, if it is the server and not the node:
/// the node's memory answers, and no server runs beside it.
fn no_server(mem: &ShmMemory, node: NodeId, e: &KvError) -> Option<String> {
    let KvError::Down(d) = e else { return None };
    if d.node != node {
        return None;
    }
    let area = match block_on(Area::open(mem, node)) {
        Ok(area) => area,
        Err(MsgError::NoServer { .. }) => return Some(not_running(node, "no server ever ran beside it")),
        Err(_) => return None,
    };
    let why = match block_on(area.state(mem)).ok()? {
        State::Never => "no server ever ran beside it",
        State::Stopped(_) => "its server stopped",
        State::Running(_) => "its server does not answer (killed, or hung)",
    };
    Some(not_running(node, why))
}

fn not_running(node: NodeId, why: &str) -> String {
    format!("the store's server beside {node} is not running ({why})")
}

/// A store error in words, with what the core's message cannot know of
/// this command line: node 0 holds the index, and a full node takes no
/// more writes until the cluster is made again.
fn explain(e: KvError) -> String {
    match e {
        KvError::Down(m) if m.node == INDEX_NODE => {
            format!(
                "{e}: it holds the store's index, which every operation needs (RAW, pDPM-Direct, pDPM-Central and \
                 Clover keep one copy of it)"
            )
        }
        KvError::NodeFull { .. } => {
            format!("{e}; gets still work, and a bigger cluster takes more (`swarm memnode create --size`)")
        }
        e => e.to_string(),
    }
}

fn get(s: &mut Client, why: &Why, key: &str) -> Result<String, String> {
    match block_on(s.get(key.as_bytes())).map_err(|e| why.error("get", key, e))? {
        Got::Found(v) => Ok(format!("{}\n", String::from_utf8_lossy(&v))),
        Got::NotFound | Got::Deleted => Err(format!("'{key}' not found")),
    }
}

fn put(s: &mut Client, why: &Why, key: &str, value: &str) -> Result<String, String> {
    let Written = block_on(s.insert(key.as_bytes(), value.as_bytes())).map_err(|e| why.error("put", key, e))?;
    Ok("OK\n".into())
}

fn update(s: &mut Client, why: &Why, key: &str, value: &str) -> Result<String, String> {
    match block_on(s.update(key.as_bytes(), value.as_bytes())).map_err(|e| why.error("update", key, e))? {
        Ok(Written) => Ok("OK\n".into()),
        Err(Missing::NotFound) => Err(format!("'{key}' not found (insert it with put)")),
    }
}

fn delete(s: &mut Client, why: &Why, key: &str) -> Result<String, String> {
    match block_on(s.delete(key.as_bytes())).map_err(|e| why.error("delete", key, e))? {
        Ok(Written) => Ok("deleted\n".into()),
        Err(Missing::NotFound) => Err(format!("'{key}' not found")),
    }
}

const HELP: &str = r#"commands:
  get KEY            print KEY's value
  put KEY VALUE      insert KEY, or update it
  insert KEY VALUE   the same as put
  update KEY VALUE   update KEY if it exists
  delete KEY         delete KEY
  help               this text
  quit               leave (so does end of input)
a KEY is one word; a VALUE is the rest of the line after the spaces that
follow KEY, kept as typed, spaces at its end included. In double quotes,
a VALUE is what is between them, so that spaces at either end show:
  put k v  two spaces     stores 'v  two spaces'
  put k "  v  "           stores '  v  '
  put k ""quoted""        stores '"quoted"'
lines must be UTF-8 text; one that is not is an error, and the shell goes on.
"#;

/// The value a shell line gives: the rest of the line as typed, or what is
/// between the double quotes that start and end it.
fn unquote(value: &str) -> &str {
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => inner,
        None => value,
    }
}

/// One shell line, without its line end: the text to print, or an error to
/// print; `None` to quit.
fn shell_line(s: &mut Client, why: &Why, line: &str) -> Option<Result<String, String>> {
    let line = line.trim_start();
    let (cmd, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim_start();
    let (key, value) = rest.split_once(char::is_whitespace).map_or((rest, ""), |(k, v)| (k, v.trim_start()));
    let need_key = || Err(format!("{cmd} needs a KEY (type help)"));
    let need_value = || Err(format!("{cmd} needs a KEY and a VALUE (type help)"));
    Some(match cmd.to_ascii_lowercase().as_str() {
        "" => Ok(String::new()),
        "quit" | "exit" => return None,
        "help" | "?" => Ok(HELP.into()),
        "get" | "delete" | "del" if key.is_empty() || !value.is_empty() => need_key(),
        "get" => get(s, why, key),
        "delete" | "del" => delete(s, why, key),
        "put" | "insert" | "update" if key.is_empty() || value.is_empty() => need_value(),
        "put" | "insert" => put(s, why, key, unquote(value)),
        "update" => update(s, why, key, unquote(value)),
        other => Err(format!("unknown command '{other}' (type help)")),
    })
}

/// A line of the shell's input as text, without its line end (`\n` or
/// `\r\n`; spaces before it are the value's): an error naming where it
/// stops being UTF-8.
fn line_text(bytes: Vec<u8>) -> Result<String, String> {
    let mut text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "the line is not UTF-8 text (byte {:#04x} at {}); nothing was done",
            e.as_bytes()[e.utf8_error().valid_up_to()],
            e.utf8_error().valid_up_to() + 1
        )
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// Claims a client id for this process. With no `--id`, while every id is
/// held by a live process it waits for one to be given back (a `swarm kv`
/// command holds its id for a few milliseconds), for up to the lease
/// length, then says so.
fn claim(mem: &ShmMemory, cfg: &StoreConfig, clock: &SystemClock, want: Want) -> Result<Held, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(u64::from(cfg.lease_ms));
    let mut pause = 1;
    loop {
        match block_on(systems::claim(mem, cfg, clock, want, std::process::id())) {
            Err(KvError::Lease(LeaseError::NoFreeId { .. }))
                if want == Want::Any && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(pause + u64::from(std::process::id() % 3)));
                pause = (pause * 2).min(50);
            }
            claimed => return claimed.map_err(|e| format!("cannot claim a client id: {e}")),
        }
    }
}

/// The shell: one command per line of stdin; errors are printed and the
/// shell goes on. A prompt when stdin is a terminal. Stdin is read on a
/// thread of its own, so that the shell keeps its client (renews its lease,
/// recycles its log: `KvClient::keep`) every `renew` or
/// [`swarm_ycsb::runner::KEEP_EVERY_NS`], whichever is shorter, whether commands come
/// (between two of them) or not: a shell waiting for input keeps its id,
/// and one fed a stream of writes reuses its log.
fn shell(s: &mut Client, why: &Why, renew: std::time::Duration) -> Result<(), String> {
    use std::sync::mpsc::{RecvTimeoutError, channel};
    use std::time::{Duration, Instant};

    let every = renew.min(Duration::from_nanos(swarm_ycsb::runner::KEEP_EVERY_NS));
    let keep = |s: &mut Client, out: &mut std::io::Stdout| {
        if let Err(e) = block_on(s.keep()) {
            let _ = writeln!(out, "error: cannot keep the client id: {e}");
        }
        Instant::now()
    };

    let interactive = std::io::stdin().is_terminal();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            // Bytes, not a String: a line that is not UTF-8 is the shell's
            // to report, and the lines after it are still read.
            let mut line = Vec::new();
            let read = stdin.lock().read_until(b'\n', &mut line).map(|n| (n > 0).then_some(line));
            let more = matches!(read, Ok(Some(_)));
            if tx.send(read).is_err() || !more {
                return;
            }
        }
    });
    let mut out = std::io::stdout();
    let mut kept = Instant::now();
    loop {
        if interactive {
            let _ = write!(out, "swarm> ");
            let _ = out.flush();
        }
        let line = loop {
            match rx.recv_timeout(every.saturating_sub(kept.elapsed())) {
                Ok(read) => break read,
                Err(RecvTimeoutError::Timeout) => kept = keep(s, &mut out),
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        };
        if kept.elapsed() >= every {
            kept = keep(s, &mut out);
        }
        let line = match line {
            Ok(Some(line)) => line_text(line),
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("cannot read stdin: {e}")),
        };
        let done = match &line {
            Ok(line) => shell_line(s, why, line),
            Err(e) => Some(Err(e.clone())),
        };
        match done {
            None => return Ok(()),
            Some(Ok(text)) => {
                let _ = write!(out, "{text}");
            }
            Some(Err(e)) => {
                let _ = writeln!(out, "error: {e}");
            }
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_and_named_in_errors() {
        assert_eq!(parse_option("in-place=every"), Ok(("in-place".into(), "every".into())));
        assert!(parse_option("in-place").unwrap_err().contains("NAME=VALUE"));
        let swarm = systems::from_name("swarm-kv").unwrap();
        let e = option_error(swarm, "in-place", "most");
        assert!(e.contains("first, every"), "{e}");
        let e = option_error(systems::from_name("raw").unwrap(), "in-place", "every");
        assert!(e.contains("raw has no options"), "{e}");
    }
}
