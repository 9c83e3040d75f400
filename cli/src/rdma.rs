//! The RDMA backend's commands: `swarm memnode --backend rdma` (one memory
//! node, served as a daemon until SIGINT or SIGTERM) and `swarm bench
//! --backend rdma --cluster FILE` (the YCSB comparison on the memory nodes
//! that a cluster file lists).
//!
//! Both check everything the user gave (flags, the cluster file, whether
//! the nodes are large enough for the run) before they touch hardware.
//! Then a build without the `rdma` feature says how to get one, and a build
//! with it on a machine without a device says "no RDMA device found".

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use swarm_backend_rdma::ClusterConfig;
use swarm_backend_rdma::config::DEFAULT_PORT;
use swarm_core::Memory;
use swarm_core::kv::System;
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_ycsb::ClientResult;
use swarm_ycsb::runner::RunSpec;
use swarm_ycsb::sim::format_cluster;
use swarm_ycsb::threads::{Extras, run_threads};

use crate::args::{ServeArgs, ServeBackend, format_size};

/// `swarm memnode --backend rdma --listen ADDR --size SIZE`.
pub fn serve(a: &ServeArgs) -> Result<(), String> {
    let Some(ServeBackend::Rdma) = a.backend else {
        return Err("swarm memnode needs a subcommand (create, list, remove) for shm and cxl clusters, or \
                    --backend rdma --listen ADDR --size SIZE to serve an RDMA memory node"
            .into());
    };
    let listen = a.listen.as_deref().ok_or("--backend rdma needs --listen ADDR (HOST:PORT, e.g. 0.0.0.0:7471)")?;
    let addr = listen_addr(listen)?;
    let size = a.size.ok_or("--backend rdma needs --size SIZE (bytes of the node's region, e.g. 1G)")?;
    verbs::serve(a, addr, size)
}

/// The address a daemon listens on: `HOST:PORT`, or `HOST` on the
/// default port.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let bad = || format!("'{s}' is not an address to listen on (HOST:PORT or HOST, e.g. 0.0.0.0:{DEFAULT_PORT})");
    if let Ok(ip) = s.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    if s.is_empty() || s.starts_with(':') {
        return Err(bad());
    }
    let mut found = match s.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() => s.to_socket_addrs(),
        Some(_) => return Err(bad()),
        None => (s, DEFAULT_PORT).to_socket_addrs(),
    }
    .map_err(|e| format!("{}: {e}", bad()))?;
    found.next().ok_or_else(bad)
}

/// Reads the cluster file of `swarm bench --backend rdma` and keeps its
/// first `replicas` nodes (the stores use exactly that many).
pub fn load_cluster(path: &Path, replicas: usize) -> Result<ClusterConfig, String> {
    let mut config = ClusterConfig::load(path)?;
    if config.nodes.len() < replicas {
        return Err(format!(
            "{} lists {} memory node(s), and --replicas {replicas} needs {replicas}",
            path.display(),
            config.nodes.len()
        ));
    }
    config.nodes.truncate(replicas);
    Ok(config)
}

/// A handle on every memory node of the cluster file at `path`, for one
/// client named `label` (`swarm serve --cluster`).
pub fn connect_one(path: &Path, label: &str) -> Result<impl Memory + use<>, String> {
    let config = ClusterConfig::load(path)?;
    let _ = label;
    verbs::connect(&config, 1)?.pop().ok_or_else(|| format!("{}: no memory nodes", path.display()))
}

/// Runs `system` on the memory nodes of `config`: checks that each is
/// large enough, connects a handle per client and operation in flight (and
/// one to set up), clears and formats the nodes, and measures. Whatever
/// the nodes held is lost: they are the run's scratch memory.
pub fn bench(
    config: &ClusterConfig,
    spec: &RunSpec,
    system: System,
    progress: Arc<AtomicU64>,
) -> Result<ClientResult, String> {
    let need = spec.node_bytes(system);
    for (i, node) in config.nodes.iter().enumerate() {
        if node.size < need {
            return Err(format!(
                "{}: memory node {i} ({}) has {}, and this run needs {} per node (start it with a larger --size, \
                 or use fewer --keys or --ops, or a smaller --value-size)",
                system.name(),
                node.address,
                format_size(node.size),
                format_size(need)
            ));
        }
    }
    let handles = verbs::connect(config, spec.handles() + 1)?;
    bench_on(handles, spec, system, need, progress)
}

/// [`bench()`] on connected handles, whatever memory they reach (tests use
/// the software NIC): the last handle formats the first `need` bytes of
/// every node (`Region::format` writes zeros over whatever an earlier run
/// left there), then serves as the system's server if it has one
/// (pDPM-Central's coordinator, a thread of this process whose accesses to
/// its node go through the NIC, where the paper's is beside the memory);
/// the others become the clients.
pub fn bench_on<M: Memory + Send>(
    mut handles: Vec<M>,
    spec: &RunSpec,
    system: System,
    need: u64,
    progress: Arc<AtomicU64>,
) -> Result<ClientResult, String> {
    let admin = handles.pop().ok_or("no connected handles")?;
    block_on(format_cluster(&admin, &spec.store_config(system), need, SystemClock::unix_us()))?;
    let serve = system.server().is_some();
    if serve {
        handles.push(admin);
    }
    let pool = Mutex::new(handles);
    // `run_threads` asks for exactly `spec.handles()` handles: one per
    // client and operation in flight, all connected beforehand.
    let make =
        || pool.lock().unwrap_or_else(PoisonError::into_inner).pop().expect("a connected handle for every client");
    let extras = Extras { progress: Some(progress), serve, ..Extras::default() };
    run_threads(spec, system, 0..spec.clients, make, SystemClock::starting_now(), extras)
}

/// The hardware side, with the `rdma` feature.
#[cfg(feature = "rdma")]
mod verbs {
    use std::net::{SocketAddr, TcpListener};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use signal_hook::consts::{SIGINT, SIGTERM};
    use swarm_backend_rdma::daemon::{ServeOptions, serve as serve_clients};
    use swarm_backend_rdma::verbs::DeviceChoice;
    use swarm_backend_rdma::verbs::nic::{VerbsNic, connect as connect_one};
    use swarm_backend_rdma::verbs::node::VerbsNode;
    use swarm_backend_rdma::{ClusterConfig, RdmaMemory};

    use crate::args::{ServeArgs, format_size};

    /// Serves one node until SIGINT or SIGTERM, logging each client.
    pub fn serve(a: &ServeArgs, addr: SocketAddr, size: u64) -> Result<(), String> {
        let stop = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
        }
        let choice = DeviceChoice { name: a.device.clone(), port: a.port, gid_index: a.gid_index };
        let node = VerbsNode::new(&choice, size)?;
        let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let start = Instant::now();
        let log = move |line: &str| println!("[{:>10.3}s] {line}", start.elapsed().as_secs_f64());
        let at = listener.local_addr().map_or_else(|_| addr.to_string(), |a| a.to_string());
        log(&format!("memory node of {} listening on {at}: {}", format_size(size), node.describe()));
        let opts = ServeOptions { max_clients: a.max_clients, ..ServeOptions::default() };
        let served = serve_clients(&listener, &node, &opts, &stop, &log)
            .map_err(|e| format!("the memory node stopped serving: {e}"))?;
        log(&format!("stopped: {} client(s) served, {} turned away", served.accepted, served.rejected));
        Ok(())
    }

    /// `n` handles on every node of `config`.
    pub fn connect(config: &ClusterConfig, n: usize) -> Result<Vec<RdmaMemory<VerbsNic>>, String> {
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        (0..n).map(|i| connect_one(config, &format!("swarm bench {host}#{} handle {i}", std::process::id()))).collect()
    }
}

/// Without the `rdma` feature: every command says how to build with it.
#[cfg(not(feature = "rdma"))]
mod verbs {
    use std::net::SocketAddr;

    use swarm_backend_rdma::{ClusterConfig, verbs_unavailable};
    use swarm_backend_shm::ShmMemory;

    use crate::args::ServeArgs;

    pub fn serve(_: &ServeArgs, _: SocketAddr, _: u64) -> Result<(), String> {
        Err(verbs_unavailable())
    }

    /// Never connects (the type is any `Memory`, for the caller's sake).
    pub fn connect(_: &ClusterConfig, _: usize) -> Result<Vec<ShmMemory>, String> {
        Err(verbs_unavailable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarm_backend_rdma::RdmaMemory;
    use swarm_backend_rdma::softnic::SoftNic;
    use swarm_backend_shm::ShmCluster;
    use swarm_core::{NodeId, RemoteAddr, systems};
    use swarm_ycsb::{Distribution, Workload};

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_addr("0.0.0.0:9000"), Ok("0.0.0.0:9000".parse().unwrap()));
        assert_eq!(listen_addr("127.0.0.1"), Ok(SocketAddr::new([127, 0, 0, 1].into(), DEFAULT_PORT)));
        assert_eq!(listen_addr("[::1]:80"), Ok("[::1]:80".parse().unwrap()));
        assert_eq!(listen_addr("::"), Ok(SocketAddr::new("::".parse().unwrap(), DEFAULT_PORT)));
        assert!(listen_addr("localhost").is_ok_and(|a| a.port() == DEFAULT_PORT));
        for bad in ["", ":80", "1.2.3.4:x", "1.2.3.4:70000", "no such host!:1"] {
            let e = listen_addr(bad).unwrap_err();
            assert!(e.contains("is not an address to listen on"), "{bad}: {e}");
        }
    }

    fn spec(workload: Workload) -> RunSpec {
        RunSpec {
            workload,
            distribution: Distribution::Zipf,
            keys: 200,
            key_size: 24,
            value_size: 64,
            value_min: 64,
            replicas: 3,
            clients: 2,
            inflight: vec![1, 2],
            warmup: 50,
            ops: 300,
            seed: 7,
            warm_cache: true,
            timed: None,
        }
    }

    /// Every system in turn on the same nodes, as a run on RDMA memory
    /// nodes does: each must find them as if fresh (the earlier system's
    /// store cleared), through the RDMA client over the software NIC.
    #[test]
    fn systems_in_turn_on_the_same_nodes() {
        let spec = spec(Workload::A);
        let need = systems::ALL.iter().map(|&s| spec.node_bytes(s)).max().unwrap();
        let cluster = ShmCluster::in_process(3, need).unwrap();
        // Dirty every byte, as a long-lived daemon's memory may be.
        let admin = cluster.memory();
        for n in 0..3 {
            block_on(admin.write(RemoteAddr::new(NodeId(n), 0), &vec![0xA5; need as usize])).unwrap();
        }
        for &system in systems::ALL {
            let handles =
                (0..=spec.handles()).map(|_| RdmaMemory::new(SoftNic::new(cluster.memory(), 1 << 20, 64))).collect();
            let progress = Arc::new(AtomicU64::new(0));
            let out = bench_on(handles, &spec, system, spec.node_bytes(system), progress.clone())
                .unwrap_or_else(|e| panic!("{}: {e}", system.name()));
            assert_eq!(out.load.count(), spec.keys, "{}", system.name());
            assert_eq!(out.runs.len(), 2);
            for run in &out.runs {
                assert_eq!(run.count(), spec.clients as u64 * spec.ops, "{}", system.name());
            }
            assert!(progress.load(std::sync::atomic::Ordering::Relaxed) > 0);
        }
    }
}
