//! `swarm memnode`: clusters of memory nodes in shared memory or on DAX
//! devices and files.
//!
//! A shm cluster is what [`ShmCluster::create`] makes (a private directory
//! with one file per node and a control file); a cxl cluster is what
//! [`CxlCluster::create`] makes on `--path` devices or files (a header, then
//! nodes). Either way every node is formatted for SWARM: a region header
//! ([`Region::format`]) and a writer-log directory ([`writerlog::format`])
//! sized for values up to `--max-value`. Clients in any process can then
//! open it (`swarm bench --dir`, `swarm bench --backend cxl --path`).
//!
//! `list` recognises a cluster by its control file, and shows it when every
//! node carries a region and a log directory (so clusters that other tools
//! create and do not format are left out); a directory named `swarm-*` that
//! cannot be opened is shown with the reason, so that it can be removed.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use swarm_backend_cxl::{CxlCluster, CxlConfig};
use swarm_backend_shm::{Fault, ShmCluster};
use swarm_core::kv::{KvError, MinNode, NodeShape, StoreConfig, System};
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::region::{HEADER_SIZE, Region, RegionError};
use swarm_core::swarm::writerlog::{self, LogError, LogGeometry, Logs, MAX_SEGMENTS};
use swarm_core::systems;
use swarm_core::{Memory, NodeId};

use crate::args::{
    CreateArgs, FaultArgs, FaultState, ListArgs, NAME_PREFIX, NodeBackend, Place, RemoveArgs, StatsArgs, format_size,
};

/// The control file every cluster directory holds.
const CONTROL: &str = "control";
/// The log directory takes 2 KiB per segment (a two-word descriptor in
/// each of the 129 client rows); it is kept to about 1/8 of a node by
/// allowing one segment per this many bytes of node.
const BYTES_PER_SEGMENT_LIMIT: u64 = 16 << 10;

/// The writer-log geometry for a node of `size` bytes: entries for values up
/// to `max_value`, and enough segments that one client could fill the node,
/// within the directory's limits above.
pub fn log_geometry(size: u64, chunk: u64, max_value: u64) -> Result<LogGeometry, String> {
    let segments = (size / chunk).min(size / BYTES_PER_SEGMENT_LIMIT).clamp(1, MAX_SEGMENTS);
    LogGeometry::new(max_value, chunk, segments).map_err(|_| {
        format!(
            "a chunk of {} cannot hold one writer-log entry for values of {}",
            format_size(chunk),
            format_size(max_value)
        )
    })
}

/// Formats every node of `mem`'s memory: region header (with zeros over
/// the rest of the region, whatever an earlier run left there), then log
/// directory.
pub async fn format_nodes<M: Memory>(mem: &M, size: u64, chunk: u64, geo: LogGeometry) -> Result<(), String> {
    format_each(mem, size, chunk, geo, false).await
}

/// [`format_nodes`] of nodes that their backend has just created zeroed
/// (`ShmCluster::create`, `CxlCluster::create`): only the headers and log
/// directories are written ([`Region::format_fresh`]), so that the node
/// files of a new shm cluster stay sparse (RAM is taken as the store
/// grows) and a device is not zeroed twice.
pub async fn format_new_nodes<M: Memory>(mem: &M, size: u64, chunk: u64, geo: LogGeometry) -> Result<(), String> {
    format_each(mem, size, chunk, geo, true).await
}

/// [`format_nodes`], or [`format_new_nodes`] if `fresh`.
async fn format_each<M: Memory>(mem: &M, size: u64, chunk: u64, geo: LogGeometry, fresh: bool) -> Result<(), String> {
    let too_small = || {
        format!(
            "nodes of {} are too small for chunks of {} and their writer-log directory",
            format_size(size),
            format_size(chunk)
        )
    };
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        let region = if fresh {
            Region::format_fresh(mem, node, size, chunk).await
        } else {
            Region::format(mem, node, size, chunk).await
        };
        region.map_err(|e| match e {
            RegionError::BadLayout(_) => too_small(),
            e => format!("cannot format {node}: {e}"),
        })?;
        writerlog::format(mem, node, geo).await.map_err(|e| match e {
            LogError::Alloc(_) => too_small(),
            e => format!("cannot create the writer log of {node}: {e}"),
        })?;
    }
    Ok(())
}

/// The directory of a shm command (`--dir`, and no `--path`).
pub fn shm_dir(p: &Place) -> Result<&Path, String> {
    if !p.path.is_empty() {
        return Err("--path applies to --backend cxl; shm clusters are directories (--dir)".into());
    }
    p.dir.as_deref().ok_or_else(|| "--backend shm needs --dir DIR".into())
}

/// The devices or files of a cxl command (`--path`, and no `--dir`).
pub fn cxl_paths(p: &[PathBuf], dir: Option<&Path>) -> Result<Vec<PathBuf>, String> {
    if dir.is_some() {
        return Err("--dir applies to --backend shm; cxl clusters live on devices or files (--path)".into());
    }
    if p.is_empty() {
        return Err("--backend cxl needs --path PATH (a device-dax or a file; repeat for several)".into());
    }
    Ok(p.to_vec())
}

/// Prints what a cxl cluster says about durability, as warnings.
pub fn print_warnings(c: &CxlCluster) {
    for w in c.warnings() {
        eprintln!("warning: {w}");
    }
}

/// A byte count exactly, for sizes compared against a limit: whole MiB,
/// else whole KiB, else bytes (`5124 KiB`, not `5.0 MiB`).
pub fn exact_size(bytes: u64) -> String {
    match bytes {
        b if b.is_multiple_of(1 << 20) && b > 0 => format!("{} MiB", b >> 20),
        b if b.is_multiple_of(1 << 10) && b > 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// A node size people can type that is at least `bytes`: whole MiB, or
/// whole 4 KiB pages below 1 MiB (for `--size`).
pub fn size_at_least(bytes: u64) -> String {
    if bytes >= 1 << 20 { format!("{}M", bytes.div_ceil(1 << 20)) } else { format!("{}K", bytes.div_ceil(4096) * 4) }
}

/// Refuses nodes on which no key-value store could take a key: the
/// smallest store of any system (one key, one client, values up to
/// `max_value`) must fit, as [`StoreConfig::min_node_bytes`] counts it
/// (`swarm kv init` checks its own store the same way).
fn check_fits(nodes: usize, size: u64, chunk: u64, max_value: u64, geo: LogGeometry) -> Result<(), String> {
    let shape = NodeShape { size, chunk, log: Some(geo) };
    let mut best: Option<(MinNode, System)> = None;
    let mut why = None;
    for &system in systems::ALL {
        let mut cfg = StoreConfig::new(system, 1);
        cfg.replicas = if nodes >= 3 { 3 } else { 1 };
        cfg.writers = 1;
        cfg.max_value = max_value as usize;
        match cfg.min_node_bytes(nodes, &shape) {
            Ok(m) if best.is_none_or(|(b, _)| m.bytes < b.bytes) => best = Some((m, system)),
            Ok(_) => {}
            Err(e) => why = why.or(Some(e)),
        }
    }
    let Some((m, system)) = best else {
        let why = match why {
            Some(KvError::BadConfig(why)) => format!(": {why}"),
            Some(e) => format!(": {e}"),
            None => String::new(),
        };
        return Err(format!("chunks of {} hold no key-value store{why}", format_size(chunk)));
    };
    if m.bytes > size {
        return Err(format!(
            "nodes of {} are too small for any key-value store: the smallest ({system}, one client, values up to {}) \
             needs {} on {} ({} for the region header, log directory, lease table and index, {} for the client's \
             chunks); use --size {} or more, or a smaller --chunk",
            exact_size(size),
            format_size(max_value),
            exact_size(m.bytes),
            m.node,
            exact_size(m.structures),
            exact_size(m.per_client),
            size_at_least(m.bytes)
        ));
    }
    Ok(())
}

/// `swarm memnode create`.
pub fn create(a: &CreateArgs) -> Result<(), String> {
    let min = HEADER_SIZE + 2 * a.chunk;
    if a.size < min {
        return Err(format!(
            "nodes of {} are too small: chunks of {} need at least {} (a header, a log directory and a chunk of data)",
            format_size(a.size),
            format_size(a.chunk),
            format_size(min)
        ));
    }
    let geo = log_geometry(a.size, a.chunk, a.max_value)?;
    let place = match a.place.backend {
        NodeBackend::Shm => create_shm(a, shm_dir(&a.place)?, geo)?,
        NodeBackend::Cxl => create_cxl(a, &cxl_paths(&a.place.path, a.place.dir.as_deref())?, geo)?,
    };
    println!(
        "created {place}: {} node(s) of {}, chunks of {}, values up to {}",
        a.nodes,
        format_size(a.size),
        format_size(a.chunk),
        format_size(a.max_value)
    );
    Ok(())
}

fn create_shm(a: &CreateArgs, dir: &Path, geo: LogGeometry) -> Result<String, String> {
    if fs::symlink_metadata(dir).is_ok() {
        return Err(format!("{} already exists (remove it with `swarm memnode remove --dir {0}`)", dir.display()));
    }
    check_fits(a.nodes, a.size, a.chunk, a.max_value, geo)?;
    check_free_space(parent_of(dir), a.nodes as u64, a.size)?;
    let cluster = ShmCluster::create(dir, a.nodes, a.size).map_err(|e| e.to_string())?;
    if let Err(e) = block_on(format_new_nodes(&cluster.memory(), a.size, a.chunk, geo)) {
        drop(cluster);
        let _ = ShmCluster::remove(dir);
        return Err(e);
    }
    Ok(dir.display().to_string())
}

fn create_cxl(a: &CreateArgs, paths: &[PathBuf], geo: LogGeometry) -> Result<String, String> {
    check_fits(a.nodes, a.size, a.chunk, a.max_value, geo)?;
    // New files are sparse: check that they fit where they go (devices
    // bring their own memory).
    let new_files = paths.iter().filter(|p| fs::symlink_metadata(p).is_err()).count() as u64;
    if new_files > 0 && a.nodes.is_multiple_of(paths.len()) {
        let per_file = (a.nodes / paths.len()) as u64;
        check_free_space(parent_of(&paths[0]), new_files * per_file, a.size)?;
    }
    let cluster = CxlCluster::create(paths, a.nodes, a.size, &CxlConfig::default()).map_err(|e| e.to_string())?;
    print_warnings(&cluster);
    if let Err(e) = block_on(format_new_nodes(&cluster.memory(), a.size, a.chunk, geo)) {
        drop(cluster);
        let _ = CxlCluster::remove(paths, &CxlConfig::default());
        return Err(e);
    }
    cluster.sync().map_err(|e| e.to_string())?;
    Ok(paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}

/// The directory a new path goes into.
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Refuses a cluster larger than the free space of the file system that
/// would hold it: node files are sparse, and on tmpfs touching a page that
/// no longer fits kills the process with SIGBUS, long after creation.
fn check_free_space(parent: &Path, nodes: u64, size: u64) -> Result<(), String> {
    let st = rustix::fs::statvfs(parent).map_err(|e| format!("{}: cannot check free space: {e}", parent.display()))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let need = nodes.saturating_mul(size);
    if need > free {
        return Err(format!(
            "{nodes} node(s) of {} need {}, but {} has only {} free",
            format_size(size),
            format_size(need),
            parent.display(),
            format_size(free)
        ));
    }
    Ok(())
}

/// What `list` shows of one cluster.
struct Info {
    nodes: usize,
    node_size: u64,
    chunk: u64,
    max_value: u64,
    /// Bytes allocated on the fullest node (header included).
    used: u64,
}

/// Reads every node's region and log directory: the chunk size, the log
/// geometry (of node 0) and the bytes allocated on the fullest node.
pub fn inspect_cluster(cluster: &ShmCluster) -> Result<(u64, LogGeometry, u64), String> {
    inspect_nodes(&cluster.memory())
}

/// [`inspect_cluster`] through any memory.
pub fn inspect_nodes<M: Memory>(mem: &M) -> Result<(u64, LogGeometry, u64), String> {
    let (mut chunk, mut geo, mut used) = (0, None, 0);
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        let region = block_on(Region::open(mem, node)).map_err(|e| match e {
            RegionError::Mem(e) if !e.is_request_error() => KvError::Down(e).to_string(),
            e => format!("{node} is not formatted ({e})"),
        })?;
        let g = block_on(Logs::new().geometry(mem, node)).map_err(|e| match e {
            LogError::Mem(e) if !e.is_request_error() => KvError::Down(e).to_string(),
            e => format!("{node} has no writer log ({e})"),
        })?;
        chunk = region.chunk;
        geo.get_or_insert(g);
        used = used.max(region.cursor);
    }
    let geo = geo.ok_or("the cluster has no nodes")?;
    Ok((chunk, geo, used))
}

fn inspect(dir: &Path) -> Result<Info, String> {
    let cluster = ShmCluster::open(dir).map_err(|e| e.to_string())?;
    let (chunk, geo, used) = inspect_cluster(&cluster)?;
    Ok(Info { nodes: cluster.node_count(), node_size: cluster.node_size(), chunk, max_value: geo.max_value(), used })
}

/// `swarm memnode list --path ...`: the cxl cluster on those paths.
fn list_cxl(paths: &[PathBuf]) -> Result<(), String> {
    let cluster = CxlCluster::open(paths, &CxlConfig::default()).map_err(|e| e.to_string())?;
    let (chunk, geo, used) = inspect_nodes(&cluster.memory())?;
    let size = cluster.node_size();
    let mut rows =
        vec![["PATH", "KIND", "NODES", "NODE SIZE", "CHUNK", "MAX VALUE", "USED (FULLEST NODE)"].map(String::from)];
    for b in cluster.backings() {
        rows.push([
            b.path.display().to_string(),
            b.kind.describe(),
            format!("{}..{}", b.first_node, b.first_node + b.nodes),
            format_size(size),
            format_size(chunk),
            format!("{} B", geo.max_value()),
            format!("{} ({:.1}%)", format_size(used), 100.0 * used as f64 / size as f64),
        ]);
    }
    print!("{}", crate::report::table(&rows));
    print_warnings(&cluster);
    Ok(())
}

/// `swarm memnode list`.
pub fn list(a: &ListArgs) -> Result<(), String> {
    if !a.path.is_empty() {
        return list_cxl(&a.path);
    }
    let dirs = match &a.dir {
        Some(dir) if !dir.join(CONTROL).is_file() => {
            return Err(format!("no cluster at {} (it has no control file)", dir.display()));
        }
        Some(dir) => vec![dir.clone()],
        None => {
            let entries = fs::read_dir(&a.root).map_err(|e| format!("cannot list {}: {e}", a.root.display()))?;
            let mut dirs: Vec<_> = entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.path().join(CONTROL).is_file())
                .map(|e| e.path())
                .collect();
            dirs.sort();
            dirs
        }
    };
    let mut rows = vec![["PATH", "NODES", "NODE SIZE", "CHUNK", "MAX VALUE", "USED (FULLEST NODE)"].map(String::from)];
    let mut broken = Vec::new();
    for dir in dirs {
        match inspect(&dir) {
            Ok(i) => rows.push([
                dir.display().to_string(),
                i.nodes.to_string(),
                format_size(i.node_size),
                format_size(i.chunk),
                format!("{} B", i.max_value),
                format!("{} ({:.1}%)", format_size(i.used), 100.0 * i.used as f64 / i.node_size as f64),
            ]),
            // One cluster named as the other subcommands name it: what is
            // wrong with it is the answer, not a row left out.
            Err(e) if a.dir.is_some() => return Err(format!("{}: unusable: {e}", dir.display())),
            Err(e) if dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(NAME_PREFIX)) => {
                broken.push(format!("{}: unusable: {e}", dir.display()));
            }
            Err(_) => {}
        }
    }
    if rows.len() == 1 && broken.is_empty() {
        println!("no clusters under {}", a.root.display());
        return Ok(());
    }
    if rows.len() > 1 {
        print!("{}", crate::report::table(&rows));
    }
    for b in broken {
        println!("{b}");
    }
    Ok(())
}

/// `swarm memnode remove`.
pub fn remove(a: &RemoveArgs) -> Result<(), String> {
    if a.place.backend == NodeBackend::Cxl {
        let paths = cxl_paths(&a.place.path, a.place.dir.as_deref())?;
        CxlCluster::remove(&paths, &CxlConfig::default()).map_err(|e| e.to_string())?;
        for p in &paths {
            println!("removed {}", p.display());
        }
        return Ok(());
    }
    let dir = shm_dir(&a.place)?;
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(format!("no cluster at {}", dir.display())),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => return Err(format!("{} is not a cluster directory", dir.display())),
        Ok(_) => {}
    }
    if !dir.join(CONTROL).is_file() {
        return Err(format!("{} is not a cluster (it has no control file); nothing removed", dir.display()));
    }
    ShmCluster::remove(dir).map_err(|e| e.to_string())?;
    println!("removed {}", dir.display());
    Ok(())
}

/// `swarm memnode fault`.
pub fn fault(a: &FaultArgs) -> Result<(), String> {
    if a.place.backend == NodeBackend::Cxl {
        return Err("faults are for shm clusters (a cxl cluster's fault states are each process's own)".into());
    }
    let dir = shm_dir(&a.place)?;
    let cluster = ShmCluster::open(dir).map_err(|e| e.to_string())?;
    let node = NodeId(a.node);
    if node.index() >= cluster.node_count() {
        return Err(format!("{} has {} node(s); there is no {node}", dir.display(), cluster.node_count()));
    }
    let (state, said) = match a.state {
        FaultState::Fail => (Fault::Failed, "failed: its operations fail at once"),
        FaultState::Stall => (Fault::Stalled, "stalled: its operations wait, unapplied"),
        FaultState::Heal => (Fault::Healthy, "healthy"),
    };
    cluster.set_fault(node, state).map_err(|e| e.to_string())?;
    println!("{node} of {} is {said}", dir.display());
    Ok(())
}

/// `swarm memnode stats`: how each node's memory is used, once or every
/// `--every`.
pub fn stats(a: &StatsArgs) -> Result<(), String> {
    let table = || -> Result<String, String> {
        if a.place.backend == NodeBackend::Cxl {
            let paths = cxl_paths(&a.place.path, a.place.dir.as_deref())?;
            let cluster = CxlCluster::open(&paths, &CxlConfig::default()).map_err(|e| e.to_string())?;
            Ok(usage_table(&cluster.memory()))
        } else {
            let cluster = ShmCluster::open(shm_dir(&a.place)?).map_err(|e| e.to_string())?;
            Ok(usage_table(&cluster.memory()))
        }
    };
    let Some(every) = a.every else {
        print!("{}", table()?);
        return Ok(());
    };
    let began = std::time::Instant::now();
    loop {
        println!("at {:.1} s", began.elapsed().as_secs_f64());
        print!("{}", table()?);
        std::thread::sleep(std::time::Duration::from_nanos(every));
    }
}

/// The table of [`stats`]: per node, its bytes live (claimed and not given
/// back), reclaimable (writer-log segments given back, which their client
/// id reuses, and the node's pool, which any client takes from once no
/// chunk is left), pooled, and free (never claimed), and its log segments;
/// a node that does not answer says so.
pub fn usage_table<M: Memory>(mem: &M) -> String {
    let mut rows = vec![
        ["NODE", "SIZE", "LIVE", "RECLAIMABLE", "POOLED", "FREE", "LOG SEGMENTS IN USE", "GIVEN BACK", "CLIENT IDS"]
            .map(String::from),
    ];
    let mut logs = Logs::new();
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        rows.push(match block_on(logs.memory(mem, node)) {
            Ok(m) => {
                let share = |b: u64| format!("{} ({:.1}%)", format_size(b), 100.0 * b as f64 / m.size as f64);
                [
                    node.to_string(),
                    format_size(m.size),
                    share(m.live()),
                    share(m.reclaimable),
                    format_size(m.pooled),
                    share(m.free()),
                    m.log.in_use.to_string(),
                    m.log.free.to_string(),
                    m.log.ids.to_string(),
                ]
            }
            Err(e) => {
                let mut row = [node.to_string(), format!("unusable: {e}")].to_vec();
                row.resize(9, String::new());
                row.try_into().expect("nine columns")
            }
        });
    }
    crate::report::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fills_a_node_and_keeps_the_directory_small() {
        let g = log_geometry(64 << 20, 1 << 20, 8192).unwrap();
        assert_eq!((g.segments, g.max_value() >= 8192), (64, true));
        // 4 KiB chunks: limited by the most segments a log may have, not
        // the chunk count.
        assert_eq!(log_geometry(64 << 20, 4096, 64).unwrap().segments, MAX_SEGMENTS);
        // Small nodes: by the directory's share.
        assert_eq!(log_geometry(4 << 20, 4096, 64).unwrap().segments, 256);
        assert_eq!(log_geometry(12 << 10, 4096, 64).unwrap().segments, 1);
        assert!(log_geometry(1 << 20, 4096, 8192).is_err());
    }

    #[test]
    fn a_formatted_in_process_cluster_inspects() {
        let (size, chunk) = (4 << 20, 64 << 10);
        let cluster = ShmCluster::in_process(3, size).unwrap();
        let geo = log_geometry(size, chunk, 1024).unwrap();
        block_on(format_nodes(&cluster.memory(), size, chunk, geo)).unwrap();
        let (c, g, used) = inspect_cluster(&cluster).unwrap();
        assert_eq!((c, g), (chunk, geo));
        assert!(used > HEADER_SIZE && used < size);
        let empty = ShmCluster::in_process(1, size).unwrap();
        assert!(inspect_cluster(&empty).unwrap_err().contains("not formatted"));
    }

    #[test]
    fn too_small_nodes_fail_cleanly() {
        let size = 8 << 10;
        let cluster = ShmCluster::in_process(1, size).unwrap();
        let geo = log_geometry(size, 8192, 64).unwrap();
        assert!(block_on(format_nodes(&cluster.memory(), size, 8192, geo)).unwrap_err().contains("too small"));
    }
}
