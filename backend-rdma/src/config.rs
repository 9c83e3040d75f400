//! The cluster file: which memory nodes there are and how clients reach
//! them, shared by `swarm bench --backend rdma` and any client program.
//!
//! ```toml
//! # Optional; every field has a default.
//! [client]
//! device = "mlx5_0"     # RDMA device (default: the first one found)
//! port = 1              # its port
//! gid_index = 3         # RoCE: the GID to use (InfiniBand: leave out)
//! timeout_ms = 1000     # an operation without a completion by then fails
//! buffer = "4MiB"       # registered buffer arena per client handle
//! queue_depth = 128     # work requests per queue pair
//!
//! # One table per memory node, in node-id order (node 0 first).
//! [[node]]
//! address = "10.0.0.1:7471"   # where its `swarm memnode --backend rdma` listens
//! size = "1GiB"               # its region; must match what the daemon serves
//! ```
//!
//! Unknown keys are errors (a misspelt key would otherwise be ignored), as
//! are duplicate addresses, sizes that are zero or not whole pages, and
//! values outside their ranges; every message names the file and the key.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use swarm_core::substrate::space::slab::MAX_NODES;
use swarm_units::{format_size, parse_size};

use crate::arena::MIN_CHUNK;

/// Page size regions are made of.
pub const PAGE: u64 = 4096;
/// The largest buffer arena (what one registration should pin).
pub const MAX_BUFFER: u64 = 1 << 30;
/// The TCP port daemons listen on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7471;

/// A validated cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The memory nodes, node 0 first.
    pub nodes: Vec<NodeSpec>,
    /// How clients use the NIC.
    pub client: ClientOptions,
}

/// One memory node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// `host:port` of its daemon.
    pub address: String,
    /// Bytes of its region.
    pub size: u64,
}

/// How a client uses its NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Device name (`ibv_devices`); `None`: the first.
    pub device: Option<String>,
    /// Port number on the device (from 1).
    pub port: u8,
    /// GID index for RoCE (`show_gids`); `None`: address by LID (InfiniBand).
    pub gid_index: Option<u8>,
    /// How long an operation waits for its completion.
    pub timeout: Duration,
    /// Bytes of the registered buffer arena of each handle.
    pub buffer: u32,
    /// Work requests per queue pair.
    pub queue_depth: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            device: None,
            port: 1,
            gid_index: None,
            timeout: crate::DEFAULT_TIMEOUT,
            buffer: 4 << 20,
            queue_depth: 128,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    client: Option<ClientFile>,
    #[serde(default)]
    node: Vec<NodeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFile {
    device: Option<String>,
    port: Option<u8>,
    gid_index: Option<u8>,
    timeout_ms: Option<u64>,
    buffer: Option<String>,
    queue_depth: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    address: String,
    size: String,
}

impl ClusterConfig {
    /// Reads and validates the cluster file at `path`.
    pub fn load(path: &Path) -> Result<ClusterConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        ClusterConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and validates a cluster file's text.
    pub fn parse(text: &str) -> Result<ClusterConfig, String> {
        let file: File = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        if file.node.is_empty() {
            return Err("no memory nodes: add a [[node]] table with an address and a size for each".into());
        }
        if file.node.len() > MAX_NODES {
            return Err(format!("{} memory nodes, but clients handle at most {MAX_NODES}", file.node.len()));
        }
        let mut nodes = Vec::with_capacity(file.node.len());
        for (i, n) in file.node.iter().enumerate() {
            let address = check_address(&n.address).map_err(|e| format!("node {i}: address: {e}"))?;
            if let Some(j) = nodes.iter().position(|m: &NodeSpec| m.address == address) {
                return Err(format!("node {i}: address {address} is node {j}'s too"));
            }
            let size = parse_size(&n.size).map_err(|e| format!("node {i}: size: {e}"))?;
            if size == 0 || !size.is_multiple_of(PAGE) {
                return Err(format!("node {i}: size must be a positive multiple of 4 KiB, not {size} bytes"));
            }
            nodes.push(NodeSpec { address, size });
        }
        let client = match file.client {
            None => ClientOptions::default(),
            Some(c) => client_options(c)?,
        };
        Ok(ClusterConfig { nodes, client })
    }

    /// The file's text for these settings (what [`ClusterConfig::parse`]
    /// reads back to the same configuration).
    pub fn to_toml(&self) -> String {
        let c = &self.client;
        let mut s = String::from("[client]\n");
        if let Some(d) = &c.device {
            s += &format!("device = {d:?}\n");
        }
        s += &format!("port = {}\n", c.port);
        if let Some(g) = c.gid_index {
            s += &format!("gid_index = {g}\n");
        }
        s += &format!("timeout_ms = {}\n", c.timeout.as_millis());
        s += &format!("buffer = \"{}\"\n", c.buffer);
        s += &format!("queue_depth = {}\n", c.queue_depth);
        for n in &self.nodes {
            s += &format!("\n[[node]]\naddress = {:?}\nsize = \"{}\"\n", n.address, n.size);
        }
        s
    }
}

fn client_options(c: ClientFile) -> Result<ClientOptions, String> {
    let d = ClientOptions::default();
    let port = c.port.unwrap_or(d.port);
    if port == 0 {
        return Err("client.port: ports are numbered from 1".into());
    }
    let timeout_ms = c.timeout_ms.unwrap_or(d.timeout.as_millis() as u64);
    if !(1..=3_600_000).contains(&timeout_ms) {
        return Err("client.timeout_ms: must be between 1 and 3600000 (an hour)".into());
    }
    let buffer = match c.buffer {
        None => d.buffer,
        Some(b) => {
            let n = parse_size(&b).map_err(|e| format!("client.buffer: {e}"))?;
            if n < u64::from(MIN_CHUNK) * 16 || n > MAX_BUFFER {
                return Err(format!(
                    "client.buffer: must be between {} and {}",
                    format_size(u64::from(MIN_CHUNK) * 16),
                    format_size(MAX_BUFFER)
                ));
            }
            n as u32
        }
    };
    let queue_depth = c.queue_depth.unwrap_or(d.queue_depth);
    if !(4..=16384).contains(&queue_depth) {
        return Err("client.queue_depth: must be between 4 and 16384".into());
    }
    if let Some(dev) = &c.device
        && (dev.is_empty() || dev.len() > 64)
    {
        return Err("client.device: a device name as `ibv_devices` lists it".into());
    }
    Ok(ClientOptions {
        device: c.device,
        port,
        gid_index: c.gid_index,
        timeout: Duration::from_millis(timeout_ms),
        buffer,
        queue_depth,
    })
}

/// A TOML error on one line: where, and what.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            let text: String = text.lines().nth(line - 1).unwrap_or("").trim().chars().take(60).collect();
            format!("line {line}, column {column} (`{text}`): {what}")
        }
        None => what,
    }
}

/// Checks that `a` is `host:port` (a name, an IPv4 address, or an IPv6
/// address in brackets) without resolving it.
fn check_address(a: &str) -> Result<String, String> {
    let a = a.trim();
    let (host, port) = a.rsplit_once(':').ok_or_else(|| format!("'{a}' has no port (expected host:port)"))?;
    let port: u16 = port.parse().map_err(|_| format!("'{a}' has no valid port"))?;
    if port == 0 {
        return Err(format!("'{a}': port 0 cannot be connected to"));
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let ok = match bare {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        }
    };
    if !ok {
        return Err(format!("'{a}' is not host:port"));
    }
    Ok(a.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [client]
        device = "mlx5_0"
        gid_index = 3
        timeout_ms = 250
        buffer = "8MiB"

        [[node]]
        address = "10.0.0.1:7471"
        size = "1GiB"

        [[node]]
        address = "[fe80::1]:7471"
        size = "64M"
    "#;

    #[test]
    fn a_good_file_is_read_with_defaults_for_what_it_leaves_out() {
        let c = ClusterConfig::parse(GOOD).unwrap();
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.nodes[1], NodeSpec { address: "[fe80::1]:7471".into(), size: 64 << 20 });
        assert_eq!(c.client.device.as_deref(), Some("mlx5_0"));
        assert_eq!((c.client.port, c.client.gid_index, c.client.buffer), (1, Some(3), 8 << 20));
        assert_eq!(c.client.timeout, Duration::from_millis(250));
        assert_eq!(c.client.queue_depth, 128);
        let minimal = ClusterConfig::parse("[[node]]\naddress = \"mem0:7471\"\nsize = \"4K\"\n").unwrap();
        assert_eq!(minimal.client, ClientOptions::default());
    }

    #[test]
    fn to_toml_reads_back_to_the_same_configuration() {
        let c = ClusterConfig::parse(GOOD).unwrap();
        assert_eq!(ClusterConfig::parse(&c.to_toml()), Ok(c));
    }

    #[test]
    fn every_mistake_gets_a_message_that_names_it() {
        let node = |addr: &str, size: &str| format!("[[node]]\naddress = \"{addr}\"\nsize = \"{size}\"\n");
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "no memory nodes"),
            ("[[node]]\naddress = \"a:1\"\n".into(), "size"),
            ("[[node]]\naddress = \"a:1\"\nsize = \"4K\"\nsise = 1\n".into(), "sise"),
            ("[client]\ntimeout = 5\n".to_owned() + &node("a:1", "4K"), "timeout"),
            (node("a", "4K"), "no port"),
            (node("a:0", "4K"), "port 0"),
            (node("a:99999", "4K"), "valid port"),
            (node("a b:1", "4K"), "not host:port"),
            (node("[zz]:1", "4K"), "not host:port"),
            (node("a:1", "0"), "positive multiple"),
            (node("a:1", "5000"), "positive multiple"),
            (node("a:1", "1Q"), "suffix"),
            (node("a:1", "4K") + &node("a:1", "8K"), "node 0's too"),
            ("[client]\nport = 0\n".to_owned() + &node("a:1", "4K"), "client.port"),
            ("[client]\ntimeout_ms = 0\n".to_owned() + &node("a:1", "4K"), "client.timeout_ms"),
            ("[client]\nbuffer = \"2G\"\n".to_owned() + &node("a:1", "4K"), "client.buffer"),
            ("[client]\nqueue_depth = 1\n".to_owned() + &node("a:1", "4K"), "client.queue_depth"),
            ("[client]\ndevice = \"\"\n".to_owned() + &node("a:1", "4K"), "client.device"),
            ("[client]\ngid_index = 300\n".to_owned() + &node("a:1", "4K"), "gid_index"),
            ("[[node]]\naddress = 5\nsize = \"4K\"\n".into(), "address"),
            ("this is not toml".into(), "expected"),
            ((0..=MAX_NODES).map(|i| node(&format!("h{i}:1"), "4K")).collect(), "at most"),
        ];
        for (text, want) in cases {
            let e = ClusterConfig::parse(&text).expect_err(&text);
            assert!(e.contains(want), "{text:?}: {e:?} does not mention {want:?}");
            assert!(!e.contains('\n'), "{text:?}: the message is not one line: {e:?}");
        }
        let e = ClusterConfig::parse("[[node]]\naddress = \"a:1\"\nsize = 4096\n").unwrap_err();
        assert!(e.starts_with("line 3, column 8 (`size = 4096`): "), "{e}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = ClusterConfig::load(Path::new("/nonexistent/cluster.toml")).unwrap_err();
        assert!(e.contains("/nonexistent/cluster.toml"), "{e}");
    }
}
