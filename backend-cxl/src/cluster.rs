//! A cluster: memory nodes laid out on one or more devices or files, mapped
//! once per process, reached through [`CxlMemory`] handles.
//!
//! Each path (device or file) starts with a header, and holds a run of
//! nodes after it:
//!
//! ```text
//! 0            header (one page, or one alignment unit of a device-dax)
//! D            node f      (node_size bytes)
//! D + S        node f + 1
//! ...
//! ```
//!
//! Header words: magic "SWARMCXL" (stored last, after the rest is written
//! back), layout version, cluster id (random: paths of different clusters
//! are not mixed up), total nodes, node size `S`, data offset `D`, this
//! path's index and the number of paths, its first node `f` and its node
//! count. Nodes are distributed evenly: one path holding every node
//! (partitions of one device or file), one node per path, or the same
//! number on each.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use swarm_mapped::{MAX_NODES, MappedError, Nodes, Persistence, Words};

use crate::flush::{FlushMode, Flusher};
use crate::map::{self, BackingKind, PAGE, Target};
use crate::{CxlError, CxlMemory};

/// "SWARMCXL", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"SWARMCXL");
const VERSION: u64 = 1;
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 1;
const ID_AT: usize = 2;
const NODES_AT: usize = 3;
const SIZE_AT: usize = 4;
const DATA_AT: usize = 5;
const INDEX_AT: usize = 6;
const PATHS_AT: usize = 7;
const FIRST_AT: usize = 8;
const HERE_AT: usize = 9;
const HEADER_WORDS: usize = 10;

/// The most bytes a node may have (1 TiB).
pub const MAX_NODE_SIZE: u64 = 1 << 40;

/// How to open or create a cluster.
#[derive(Clone, Debug)]
pub struct CxlConfig {
    /// The flush mode of the handles ([`FlushMode`]: when to use which).
    pub mode: FlushMode,
    /// Refuse files whose stores are not durable without `msync` (files
    /// that are not on a DAX file system, tmpfs included), instead of
    /// mapping them with a warning.
    pub require_durable: bool,
    /// Where sysfs is mounted (device-dax size and alignment); `/sys`.
    pub sysfs: PathBuf,
}

impl Default for CxlConfig {
    fn default() -> Self {
        CxlConfig { mode: FlushMode::default(), require_durable: false, sysfs: map::default_sysfs() }
    }
}

impl CxlConfig {
    /// The default configuration with flush mode `mode`.
    pub fn with_mode(mode: FlushMode) -> CxlConfig {
        CxlConfig { mode, ..CxlConfig::default() }
    }
}

/// One device or file of a cluster, as mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingInfo {
    /// Its path.
    pub path: PathBuf,
    /// What it turned out to be.
    pub kind: BackingKind,
    /// Its first node.
    pub first_node: usize,
    /// Its number of nodes.
    pub nodes: usize,
}

struct Backing {
    info: BackingInfo,
    /// The whole mapping (header and nodes), for `sync`.
    words: Words,
}

/// The memory nodes of one cluster on devices or files, shared by the
/// threads of a process (other processes open the same paths).
///
/// Cloning is cheap; the mappings go away with the last clone and the last
/// handle.
#[derive(Clone)]
pub struct CxlCluster {
    nodes: Nodes,
    mode: FlushMode,
    backings: Arc<[Backing]>,
}

/// The shape of a cluster as written in (or read from) a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    id: u64,
    nodes: usize,
    node_size: u64,
    data: u64,
    paths: usize,
}

impl CxlCluster {
    /// Creates a cluster of `nodes` zeroed nodes of `node_size` bytes on
    /// `paths`, and maps it.
    ///
    /// Each path is a device-dax instance (its used part is zeroed: a
    /// second or so per GiB; one that holds a cluster is refused), an
    /// empty file of this user's that no one else may reach (mode 0600),
    /// or a path that does not exist (a file is created, mode 0600). The
    /// nodes are divided evenly among the paths. `node_size` must
    /// be a positive multiple of the page size (4 KiB) and of every device's
    /// alignment. On failure the files it created are removed.
    pub fn create(
        paths: &[impl AsRef<Path>],
        nodes: usize,
        node_size: u64,
        config: &CxlConfig,
    ) -> Result<CxlCluster, CxlError> {
        let per_path = check_shape(paths.len(), nodes, node_size)?;
        let flusher = Flusher::new(config.mode)?;
        let mut created = Vec::new();
        let made = (|| {
            let mut targets = Vec::new();
            for p in paths {
                let path = p.as_ref();
                let existed = std::fs::symlink_metadata(path).is_ok();
                let t = map::open(path, true, &config.sysfs)?;
                if !existed {
                    created.push(path.to_path_buf());
                }
                targets.push(t);
            }
            let data = targets.iter().map(|t| t.dax.map_or(PAGE, |(_, a)| a)).max().unwrap_or(PAGE);
            let shape = Shape { id: cluster_id(), nodes, node_size, data, paths: paths.len() };
            let mut mapped = Vec::new();
            for (i, t) in targets.iter_mut().enumerate() {
                let len = shape.data + per_path as u64 * node_size;
                match t.dax {
                    Some((_, align)) if !node_size.is_multiple_of(align) => {
                        return Err(CxlError::Misaligned {
                            path: t.path.clone(),
                            what: "node size",
                            value: node_size,
                            align,
                        });
                    }
                    // A device always holds something; refuse one that holds a cluster.
                    Some(_) if read_header(t).is_ok() => return Err(CxlError::AlreadyExists { path: t.path.clone() }),
                    Some(_) => {}
                    None if t.size != 0 => return Err(CxlError::AlreadyExists { path: t.path.clone() }),
                    None => {
                        t.file.set_len(len).map_err(|e| CxlError::io(&t.path, "set the file's size", e))?;
                        t.size = len;
                    }
                }
                let (words, kind) = map::map(t, len)?;
                check_durable(config, &t.path, &kind)?;
                if t.dax.is_some() {
                    zero(&flusher, &words);
                }
                write_header(&flusher, &words, &shape, i, per_path);
                mapped.push((t.path.clone(), words, kind));
            }
            let c = assemble(mapped, &shape, per_path, config.mode)?;
            c.sync()?;
            Ok(c)
        })();
        if made.is_err() {
            for p in &created {
                let _ = std::fs::remove_file(p);
            }
        }
        made
    }

    /// Opens and maps the cluster that [`create`](Self::create) made on
    /// `paths` (the same paths, in the same order), checking every header,
    /// and that every file is this user's alone.
    pub fn open(paths: &[impl AsRef<Path>], config: &CxlConfig) -> Result<CxlCluster, CxlError> {
        if paths.is_empty() {
            return Err(CxlError::Config("no device or file given".into()));
        }
        // Checked before anything is mapped.
        Flusher::new(config.mode)?;
        let mut shape: Option<Shape> = None;
        let mut mapped = Vec::new();
        let mut next_node = 0;
        let mut per_path = 0;
        for (i, p) in paths.iter().enumerate() {
            let path = p.as_ref();
            let t = map::open(path, false, &config.sysfs)?;
            let (s, index, first, here) = read_header(&t)?;
            let mismatch = |what: String| CxlError::invalid(path, what);
            if index != i || s.paths != paths.len() {
                return Err(mismatch(format!(
                    "is part {} of a cluster of {} path(s), given as part {} of {}",
                    index + 1,
                    s.paths,
                    i + 1,
                    paths.len()
                )));
            }
            if let Some(first_shape) = shape
                && first_shape != s
            {
                return Err(mismatch(format!("belongs to another cluster than {}", paths[0].as_ref().display())));
            }
            if first != next_node || (i > 0 && here != per_path) {
                return Err(mismatch(format!("holds nodes {first}..{} out of order", first + here)));
            }
            shape = Some(s);
            per_path = here;
            next_node += here;
            let (words, kind) = map::map(&t, s.data + here as u64 * s.node_size)?;
            check_durable(config, path, &kind)?;
            mapped.push((path.to_path_buf(), words, kind));
        }
        let shape = shape.expect("at least one path");
        if next_node != shape.nodes {
            return Err(CxlError::invalid(
                paths[0].as_ref(),
                format!("the header says {} nodes, the paths hold {next_node}", shape.nodes),
            ));
        }
        assemble(mapped, &shape, per_path, config.mode)
    }

    /// Deletes the cluster on `paths`: removes the files, and clears the
    /// header of devices (their data stays). Refuses, changing nothing, if
    /// any path does not hold part of a cluster, so a mistyped path cannot
    /// destroy other data. Processes that have the cluster mapped keep their
    /// memory until they drop it (a device's data stays in any case).
    pub fn remove(paths: &[impl AsRef<Path>], config: &CxlConfig) -> Result<(), CxlError> {
        let mut found = Vec::new();
        for p in paths {
            let t = map::open(p.as_ref(), false, &config.sysfs)?;
            read_header(&t)?;
            found.push(t);
        }
        let flusher = Flusher::new(FlushMode::Persist).or_else(|_| Flusher::new(FlushMode::None))?;
        for t in found {
            if t.dax.is_some() {
                let (words, _) = map::map(&t, t.dax.map_or(PAGE, |(_, a)| a))?;
                words.as_slice()[MAGIC_AT].store(0, Release);
                flusher.after_write(words.as_slice(), 0, 8);
                flusher.drain();
            } else {
                std::fs::remove_file(&t.path).map_err(|e| CxlError::io(&t.path, "remove", e))?;
            }
        }
        Ok(())
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.node_count()
    }

    /// Bytes per node: valid offsets are `0..node_size()`.
    pub fn node_size(&self) -> u64 {
        self.nodes.node_size()
    }

    /// The flush mode of the handles this cluster makes.
    pub fn mode(&self) -> FlushMode {
        self.mode
    }

    /// The devices and files, in order, with what each turned out to be.
    pub fn backings(&self) -> impl Iterator<Item = &BackingInfo> {
        self.backings.iter().map(|b| &b.info)
    }

    /// What the user should know about durability, one sentence per
    /// concern: files that are not on a DAX file system (durable only after
    /// [`sync`](Self::sync)), tmpfs (never durable), and the `none` mode on
    /// persistent memory. Empty when every store that an operation
    /// completed is durable.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for b in self.backings() {
            let path = b.path.display();
            match b.kind {
                BackingKind::File { tmpfs: true } => w.push(format!(
                    "{path} is on tmpfs: emulated pmem in RAM, nothing survives a reboot \
                     (a crashed process loses nothing); cache-line flushes run but make nothing durable"
                )),
                BackingKind::File { tmpfs: false } => w.push(format!(
                    "{path} is not on a DAX file system (the kernel refused MAP_SYNC): stores go to the page \
                     cache and survive a crashed process, but a power failure only after msync \
                     (CxlCluster::sync); cache-line flushes alone do not make them durable"
                )),
                BackingKind::DeviceDax { .. } | BackingKind::FsDax if self.mode == FlushMode::None => w.push(format!(
                    "{path}: flush mode none: stores are durable only if this platform's CPU caches are \
                     in the persistence domain (eADR)"
                )),
                _ => {}
            }
        }
        w
    }

    /// Faults every node's pages in, in this process (see
    /// [`Nodes::prefault`]); nothing for memory that is not a plain file
    /// or device mapping.
    pub fn prefault(&self) -> Result<(), CxlError> {
        self.nodes.prefault().map_err(|e| match e {
            MappedError::Io { node: Some(i), what, source } => {
                CxlError::io(Path::new(&format!("<node {i}>")), what, source)
            }
            e => CxlError::Config(e.to_string()),
        })
    }

    /// A new client handle (no injected latency, 1 s timeout for stalled
    /// nodes) with a fresh [`Flusher`] of the cluster's mode.
    pub fn memory(&self) -> CxlMemory {
        let flusher = Flusher::new(self.mode).expect("the mode was checked when the cluster was opened");
        self.memory_with(flusher)
    }

    /// A new client handle with the given flusher (another mode or
    /// write-back instruction, e.g. to compare them).
    pub fn memory_with(&self, flusher: Flusher) -> CxlMemory {
        self.nodes.memory().with_persistence(flusher)
    }

    /// The nodes, as every backend over mapped memory sees them: fault
    /// injection ([`Nodes::set_fault`], seen by this process's handles),
    /// and handles with other persistence hooks.
    pub fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    /// Writes every page of every file back to its storage (`msync`): what
    /// makes a file that is not on a DAX file system durable. Cheap on
    /// device-dax and `MAP_SYNC` files, where it has nothing to do.
    pub fn sync(&self) -> Result<(), CxlError> {
        for b in self.backings.iter() {
            if !b.info.kind.is_synchronous() {
                b.words.sync().map_err(|e| CxlError::io(&b.info.path, "msync", e))?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for CxlCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CxlCluster")
            .field("nodes", &self.node_count())
            .field("node_size", &self.node_size())
            .field("mode", &self.mode)
            .field("backings", &self.backings().collect::<Vec<_>>())
            .finish()
    }
}

/// Checks a cluster's shape; returns the nodes per path.
fn check_shape(paths: usize, nodes: usize, node_size: u64) -> Result<usize, CxlError> {
    if paths == 0 {
        return Err(CxlError::Config("no device or file given".into()));
    }
    if !(1..=MAX_NODES).contains(&nodes) {
        return Err(CxlError::Config(format!("{nodes} nodes; a cluster has 1 to {MAX_NODES}")));
    }
    if !nodes.is_multiple_of(paths) {
        return Err(CxlError::Config(format!(
            "{nodes} nodes do not divide evenly among {paths} devices or files \
             (give one path, one per node, or a divisor of the node count)"
        )));
    }
    if node_size == 0 || !node_size.is_multiple_of(PAGE) || node_size > MAX_NODE_SIZE {
        return Err(CxlError::Config(format!(
            "node size {node_size}; it must be a positive multiple of {PAGE} bytes, at most {MAX_NODE_SIZE}"
        )));
    }
    Ok(nodes / paths)
}

/// Refuses a mapping that is not durable without msync, if asked to.
fn check_durable(config: &CxlConfig, path: &Path, kind: &BackingKind) -> Result<(), CxlError> {
    if config.require_durable && !kind.is_synchronous() {
        return Err(CxlError::invalid(
            path,
            format!(
                "is a {}, and durability was required (a device-dax, or a file on a DAX file system)",
                kind.describe()
            ),
        ));
    }
    Ok(())
}

/// A random cluster id (never 0).
fn cluster_id() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    // splitmix64 finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) | 1
}

/// Zeroes `words` and writes them back.
fn zero(flusher: &Flusher, words: &Words) {
    for w in words.as_slice() {
        w.store(0, Relaxed);
    }
    flusher.after_write(words.as_slice(), 0, words.bytes());
    flusher.drain();
}

/// Writes the header of part `index` (nodes `index * per_path ..`), the
/// magic last, each written back and fenced.
fn write_header(flusher: &Flusher, words: &Words, s: &Shape, index: usize, per_path: usize) {
    let w = words.as_slice();
    let fields = [
        (VERSION_AT, VERSION),
        (ID_AT, s.id),
        (NODES_AT, s.nodes as u64),
        (SIZE_AT, s.node_size),
        (DATA_AT, s.data),
        (INDEX_AT, index as u64),
        (PATHS_AT, s.paths as u64),
        (FIRST_AT, (index * per_path) as u64),
        (HERE_AT, per_path as u64),
    ];
    for (at, v) in fields {
        w[at].store(v, Relaxed);
    }
    flusher.after_write(w, 0, 8 * HEADER_WORDS);
    flusher.drain();
    w[MAGIC_AT].store(MAGIC, Release);
    flusher.after_write(w, 0, 8);
    flusher.drain();
}

/// Reads and checks the header of `t`: the shape, this part's index, first
/// node and node count.
fn read_header(t: &Target) -> Result<(Shape, usize, usize, usize), CxlError> {
    let first_map = t.dax.map_or(PAGE, |(_, a)| a);
    if t.size < first_map {
        return Err(CxlError::invalid(&t.path, format!("holds no cluster (only {} bytes)", t.size)));
    }
    let (words, _) = map::map(t, first_map)?;
    let w = words.as_slice();
    let bad = |what: String| CxlError::invalid(&t.path, what);
    if w[MAGIC_AT].load(Acquire) != MAGIC {
        return Err(bad(
            "holds no cluster (no SWARMCXL header; create one with `swarm memnode create --backend cxl`)".into()
        ));
    }
    let word = |at: usize| w[at].load(Relaxed);
    if word(VERSION_AT) != VERSION {
        return Err(bad(format!("unknown layout version {} (expected {VERSION})", word(VERSION_AT))));
    }
    let small = |at: usize, max: usize| usize::try_from(word(at)).ok().filter(|&n| n <= max);
    let (Some(nodes), Some(paths)) = (small(NODES_AT, MAX_NODES), small(PATHS_AT, MAX_NODES)) else {
        return Err(bad("header holds an impossible node or path count".into()));
    };
    let (Some(index), Some(first), Some(here)) =
        (small(INDEX_AT, MAX_NODES), small(FIRST_AT, MAX_NODES), small(HERE_AT, MAX_NODES))
    else {
        return Err(bad("header holds an impossible node range".into()));
    };
    let shape = Shape { id: word(ID_AT), nodes, node_size: word(SIZE_AT), data: word(DATA_AT), paths };
    let per = check_shape(paths, nodes, shape.node_size).map_err(|e| bad(format!("header: {e}")))?;
    if index >= paths || here != per || first != index * per {
        return Err(bad("header holds an impossible node range".into()));
    }
    if shape.data < PAGE || !shape.data.is_power_of_two() || !shape.data.is_multiple_of(first_map) {
        return Err(bad(format!("header holds an impossible data offset of {} bytes", shape.data)));
    }
    let needed = shape.data.saturating_add((here as u64).saturating_mul(shape.node_size));
    if t.size < needed {
        return Err(CxlError::TooSmall { path: t.path.clone(), size: t.size, needed });
    }
    Ok((shape, index, first, here))
}

/// The cluster over the mapped parts.
fn assemble(
    mapped: Vec<(PathBuf, Words, BackingKind)>,
    s: &Shape,
    per_path: usize,
    mode: FlushMode,
) -> Result<CxlCluster, CxlError> {
    let mut nodes = Vec::with_capacity(s.nodes);
    let mut backings = Vec::with_capacity(mapped.len());
    for (i, (path, words, kind)) in mapped.into_iter().enumerate() {
        for j in 0..per_path {
            let at = (s.data + j as u64 * s.node_size) as usize;
            nodes.push(words.slice(at, s.node_size as usize).map_err(|e| CxlError::io(&path, "cut nodes", e))?);
        }
        backings.push(Backing { info: BackingInfo { path, kind, first_node: i * per_path, nodes: per_path }, words });
    }
    let nodes = Nodes::from_words(nodes).map_err(|e| CxlError::Config(e.to_string()))?;
    Ok(CxlCluster { nodes, mode, backings: backings.into() })
}
