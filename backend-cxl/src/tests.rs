//! Unit tests: the flushes that operations issue (counted), mapping and
//! re-mapping clusters on files, device-dax detection on a fake sysfs, and
//! every setup error naming its path.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::read_word;
use swarm_core::{Memory, NodeId, Op, RemoteAddr};

use crate::*;

const NODE_SIZE: u64 = 64 << 10;

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(root: &str, name: &str) -> Scratch {
        let dir = PathBuf::from(format!("{root}/swarm-cxl-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn at(node: u16, offset: u64) -> RemoteAddr {
    RemoteAddr::new(NodeId(node), offset)
}

fn stats(mem: &CxlMemory) -> FlushStats {
    mem.persistence().stats()
}

fn x86() -> bool {
    cfg!(target_arch = "x86_64")
}

#[test]
fn handles_and_clusters_can_move_between_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<CxlMemory>();
    send_sync::<CxlCluster>();
}

#[test]
fn the_cpu_offers_a_writeback_instruction() {
    let cpu = CpuFlush::detect();
    if x86() {
        assert!(cpu.clflush, "every x86_64 CPU has clflush");
        assert!(cpu.line >= 64 && cpu.line.is_power_of_two());
        assert_ne!(cpu.writeback(), FlushInstr::Nop);
        println!("cpu: {cpu:?}, write-back with {:?}", cpu.writeback());
    }
}

/// The "the flush instructions really run": a 64-byte write and a
/// CAS in one ordered pipeline write back exactly two lines (the data's and
/// the CAS word's) and fence twice (before the CAS, and at the end).
#[test]
fn a_write_then_cas_pipeline_flushes_its_lines_and_fences_before_the_cas() {
    let s = Scratch::new("/dev/shm", "count");
    let c = CxlCluster::create(&[s.path("pool")], 2, NODE_SIZE, &CxlConfig::default()).unwrap();
    let mem = c.memory();
    assert_eq!(stats(&mem), FlushStats::default());
    let data = [0xabu8; 64];
    let ops = [Op::Write { offset: 4096, data: &data }, Op::Cas { offset: 64, expected: 0, new: 1 }];
    let out = block_on(mem.pipeline(NodeId(1), &ops)).unwrap();
    assert_eq!(out[1].cas(), Some(0));
    let want = if x86() { 2 } else { 0 };
    assert_eq!(stats(&mem), FlushStats { lines_written_back: want, lines_invalidated: 0, fences: 2 });

    // An unaligned 64-byte write spans two lines; a read flushes nothing.
    mem.persistence().reset_stats();
    block_on(mem.write(at(0, 4100), &data)).unwrap();
    block_on(mem.read(at(0, 4100), 64)).unwrap();
    assert_eq!(stats(&mem), FlushStats { lines_written_back: want, lines_invalidated: 0, fences: 1 });

    // A lone CAS writes its line back and fences; so does a failed one.
    mem.persistence().reset_stats();
    block_on(mem.cas(at(0, 8), 0, 5)).unwrap();
    block_on(mem.cas(at(0, 8), 0, 6)).unwrap();
    assert_eq!(stats(&mem), FlushStats { lines_written_back: want, lines_invalidated: 0, fences: 2 });

    // A 1000-byte write at 4090 covers lines 63..=79 (of 64 bytes): 17.
    if x86() && CpuFlush::detect().line == 64 {
        mem.persistence().reset_stats();
        block_on(mem.write(at(0, 4090), &[1; 1000])).unwrap();
        assert_eq!(stats(&mem).lines_written_back, 17);
    }

    // Every handle counts its own; background operations count too.
    let other = c.memory();
    other.post_background(NodeId(0), &[Op::Write { offset: 8192, data: &data }]);
    assert_eq!(stats(&other).lines_written_back, want / 2);
    assert_eq!(stats(&mem).lines_written_back, if x86() { 17 } else { 0 });
}

#[test]
fn every_writeback_instruction_works_and_is_counted() {
    let s = Scratch::new("/dev/shm", "instr");
    let c = CxlCluster::create(&[s.path("pool")], 1, NODE_SIZE, &CxlConfig::default()).unwrap();
    let cpu = CpuFlush::detect();
    for instr in [FlushInstr::Clwb, FlushInstr::Clflushopt, FlushInstr::Clflush, FlushInstr::Nop] {
        let Ok(f) = Flusher::with_writeback(FlushMode::Persist, instr) else {
            assert!(!cpu.supports(instr));
            continue;
        };
        let mem = c.memory_with(f);
        let ops = [Op::Write { offset: 128, data: &[3; 64] }, Op::Cas { offset: 0, expected: 0, new: 0 }];
        block_on(mem.pipeline(NodeId(0), &ops)).unwrap();
        let lines = if instr == FlushInstr::Nop { 0 } else { 2 };
        assert_eq!(stats(&mem).lines_written_back, lines, "{instr:?}");
        assert_eq!(block_on(mem.read(at(0, 128), 64)).unwrap().to_vec(), vec![3; 64], "{instr:?}");
    }
}

#[test]
fn mode_none_flushes_nothing_and_noncoherent_invalidates_before_reads() {
    let s = Scratch::new("/dev/shm", "modes");
    let c = CxlCluster::create(&[s.path("pool")], 1, NODE_SIZE, &CxlConfig::with_mode(FlushMode::None)).unwrap();
    let mem = c.memory();
    block_on(
        mem.pipeline(
            NodeId(0),
            &[Op::Write { offset: 0, data: &[1; 64] }, Op::Cas { offset: 64, expected: 0, new: 1 }],
        ),
    )
    .unwrap();
    assert_eq!(stats(&mem), FlushStats::default());

    let Ok(nc) = Flusher::new(FlushMode::NonCoherent) else {
        assert!(!x86(), "x86_64 has the non-coherent mode");
        return;
    };
    let mem = c.memory_with(nc);
    assert_eq!(block_on(mem.read(at(0, 0), 128)).unwrap().to_vec()[..64], [1; 64]);
    assert_eq!(stats(&mem), FlushStats { lines_written_back: 0, lines_invalidated: 2, fences: 0 });
    mem.persistence().reset_stats();
    block_on(mem.cas(at(0, 64), 1, 2)).unwrap();
    assert_eq!(stats(&mem), FlushStats { lines_written_back: 1, lines_invalidated: 1, fences: 1 });
    // A read inside one word still invalidates its line.
    mem.persistence().reset_stats();
    assert_eq!(block_on(read_word(&mem, at(0, 64))).unwrap(), 2);
    assert_eq!(stats(&mem).lines_invalidated, 1);
}

#[test]
fn nodes_partition_one_file_and_survive_remapping() {
    let s = Scratch::new("/dev/shm", "remap");
    let paths = [s.path("pool")];
    let c = CxlCluster::create(&paths, 3, NODE_SIZE, &CxlConfig::default()).unwrap();
    assert_eq!((c.node_count(), c.node_size()), (3, NODE_SIZE));
    let len = std::fs::metadata(&paths[0]).unwrap().len();
    assert_eq!(len, PAGE + 3 * NODE_SIZE, "a header page, then the nodes");
    let mem = c.memory();
    for n in 0..3u16 {
        block_on(mem.write(at(n, NODE_SIZE - 8), &[n as u8 + 1; 8])).unwrap();
    }
    assert_eq!(block_on(mem.read(at(0, NODE_SIZE - 8), 8)).unwrap().to_vec(), [1; 8], "nodes are separate");
    assert!(block_on(mem.read(at(3, 0), 8)).is_err(), "no fourth node");
    assert!(block_on(mem.read(at(0, NODE_SIZE - 4), 8)).is_err(), "a node ends at its size");
    // Another mapping of the same file (as another process would make).
    let again = CxlCluster::open(&paths, &CxlConfig::default()).unwrap();
    let m2 = again.memory();
    for n in 0..3u16 {
        assert_eq!(block_on(m2.read(at(n, NODE_SIZE - 8), 8)).unwrap().to_vec(), [n as u8 + 1; 8]);
    }
    block_on(m2.cas(at(2, 0), 0, 42)).unwrap();
    assert_eq!(block_on(read_word(&mem, at(2, 0))).unwrap(), 42, "both mappings share the memory");
    drop((c, again, mem, m2));
    CxlCluster::remove(&paths, &CxlConfig::default()).unwrap();
    assert!(!paths[0].exists());
}

#[test]
fn nodes_spread_over_several_files() {
    let s = Scratch::new("/tmp", "multi");
    let paths: Vec<PathBuf> = (0..3).map(|i| s.path(&format!("n{i}"))).collect();
    let c = CxlCluster::create(&paths, 3, NODE_SIZE, &CxlConfig::default()).unwrap();
    let infos: Vec<_> = c.backings().cloned().collect();
    assert_eq!(infos.iter().map(|b| (b.first_node, b.nodes)).collect::<Vec<_>>(), [(0, 1), (1, 1), (2, 1)]);
    // /tmp is on an ordinary file system here: mapped without MAP_SYNC, and said so.
    println!("backings: {:?}", infos.iter().map(|b| b.kind.describe()).collect::<Vec<_>>());
    if infos[0].kind == (BackingKind::File { tmpfs: false }) {
        assert!(c.warnings()[0].contains("MAP_SYNC"), "{:?}", c.warnings());
        let strict = CxlConfig { require_durable: true, ..CxlConfig::default() };
        let e = CxlCluster::open(&paths, &strict).unwrap_err();
        assert!(e.to_string().contains("durability was required"), "{e}");
    }
    block_on(c.memory().write(at(2, 0), b"third")).unwrap();
    c.sync().unwrap();
    let again = CxlCluster::open(&paths, &CxlConfig::default()).unwrap();
    assert_eq!(&*block_on(again.memory().read(at(2, 0), 5)).unwrap(), b"third");

    // The paths must come in their order, all of them.
    let swapped = [paths[1].clone(), paths[0].clone(), paths[2].clone()];
    let e = CxlCluster::open(&swapped, &CxlConfig::default()).unwrap_err();
    assert!(e.to_string().contains("is part 2 of a cluster of 3"), "{e}");
    let e = CxlCluster::open(&paths[..2], &CxlConfig::default()).unwrap_err();
    assert!(e.to_string().contains("given as part 1 of 2"), "{e}");
    // A file of another cluster is not mixed in.
    let other =
        CxlCluster::create(&[s.path("o0"), s.path("o1"), s.path("o2")], 3, NODE_SIZE, &CxlConfig::default()).unwrap();
    drop(other);
    let mixed = [paths[0].clone(), s.path("o1"), paths[2].clone()];
    let e = CxlCluster::open(&mixed, &CxlConfig::default()).unwrap_err();
    assert!(e.to_string().contains("belongs to another cluster"), "{e}");
    // Two nodes per file.
    let c2 = CxlCluster::create(&[s.path("p0"), s.path("p1")], 4, NODE_SIZE, &CxlConfig::default()).unwrap();
    assert_eq!(c2.backings().map(|b| b.first_node).collect::<Vec<_>>(), [0, 2]);
}

#[test]
fn tmpfs_files_are_said_to_be_volatile() {
    let s = Scratch::new("/dev/shm", "warn");
    let c = CxlCluster::create(&[s.path("pool")], 1, NODE_SIZE, &CxlConfig::default()).unwrap();
    assert_eq!(c.backings().next().unwrap().kind, BackingKind::File { tmpfs: true });
    let w = c.warnings();
    assert!(w.len() == 1 && w[0].contains("tmpfs") && w[0].contains(&s.path("pool").display().to_string()), "{w:?}");
}

fn err_of(r: Result<CxlCluster, CxlError>) -> CxlError {
    r.expect_err("expected an error")
}

/// Writes `bytes` to a new file `path` of mode 0600 (this user's alone, as
/// the backend requires of any file it opens).
fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    chmod(path, 0o600);
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn setup_errors_name_the_path_and_the_cause() {
    let s = Scratch::new("/dev/shm", "errors");
    let cfg = CxlConfig::default();
    let missing = s.path("nope");
    let e = err_of(CxlCluster::open(&[&missing], &cfg));
    assert!(matches!(e, CxlError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains(&*missing.to_string_lossy()) && e.to_string().contains("no such"), "{e}");
    let e = err_of(CxlCluster::create(&[s.path("no-dir/x")], 1, NODE_SIZE, &cfg));
    assert!(matches!(e, CxlError::NotFound { .. }), "{e:?}");

    // Sizes.
    let e = err_of(CxlCluster::create(&[s.path("a")], 1, 5000, &cfg));
    assert!(matches!(e, CxlError::Config(_)) && e.to_string().contains("multiple of 4096"), "{e}");
    let e = err_of(CxlCluster::create(&[s.path("a"), s.path("b")], 3, NODE_SIZE, &cfg));
    assert!(e.to_string().contains("do not divide evenly"), "{e}");
    assert!(!s.path("a").exists(), "nothing is left behind");

    // A file that holds something else, or too little.
    write_private(&s.path("data"), b"precious");
    let e = err_of(CxlCluster::create(&[s.path("data")], 1, NODE_SIZE, &cfg));
    assert!(matches!(e, CxlError::AlreadyExists { .. }) && e.to_string().contains("remove it first"), "{e}");
    assert_eq!(std::fs::read(s.path("data")).unwrap(), b"precious", "not overwritten");
    let e = err_of(CxlCluster::open(&[s.path("data")], &cfg));
    assert!(e.to_string().contains("holds no cluster (only 8 bytes)"), "{e}");
    write_private(&s.path("zeros"), &[0u8; 8192]);
    let e = err_of(CxlCluster::open(&[s.path("zeros")], &cfg));
    assert!(e.to_string().contains("no SWARMCXL header"), "{e}");
    let e = CxlCluster::remove(&[s.path("zeros")], &cfg).unwrap_err();
    assert!(e.to_string().contains("no SWARMCXL header"), "{e}");
    assert!(s.path("zeros").exists(), "remove refuses what is not a cluster");

    // A cluster file cut short (someone truncated it).
    let pool = s.path("pool");
    drop(CxlCluster::create(&[&pool], 2, NODE_SIZE, &cfg).unwrap());
    std::fs::OpenOptions::new().write(true).open(&pool).unwrap().set_len(PAGE + NODE_SIZE).unwrap();
    let e = err_of(CxlCluster::open(&[&pool], &cfg));
    assert!(
        matches!(e, CxlError::TooSmall { size, needed, .. } if size == PAGE + NODE_SIZE && needed == PAGE + 2 * NODE_SIZE),
        "{e:?}"
    );
    assert!(e.to_string().contains("too small"), "{e}");

    // Not a file nor a DAX device.
    let e = err_of(CxlCluster::open(&[&s.0], &cfg));
    assert!(e.to_string().contains("is a directory, not a device-dax"), "{e}");
    let e = err_of(CxlCluster::open(&["/dev/null"], &cfg));
    assert!(e.to_string().contains("not a device-dax instance"), "{e}");
}

/// A file that others may reach, or that another user owns (tried as
/// root, who would otherwise use anything), is refused by `create` and
/// `open` alike, before anything is mapped; a device is not checked (it is
/// root's and a group's by design: `device_dax_geometry_comes_from_sysfs`).
#[test]
fn files_that_are_not_ours_alone_are_refused() {
    let s = Scratch::new("/dev/shm", "owner");
    let cfg = CxlConfig::default();
    // Someone made an empty file, writable by all, where a cluster will go.
    let planted = s.path("planted");
    std::fs::write(&planted, b"").unwrap();
    chmod(&planted, 0o666);
    let e = err_of(CxlCluster::create(&[&planted], 1, NODE_SIZE, &cfg));
    let text = e.to_string();
    assert!(matches!(e, CxlError::Invalid { .. }), "{e:?}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with(&format!("{}: file mode is 666", planted.display())), "{text}");
    assert_eq!(std::fs::metadata(&planted).unwrap().len(), 0, "nothing written to it");
    // A cluster's own file, opened to others afterwards.
    let pool = s.path("pool");
    drop(CxlCluster::create(&[&pool], 2, NODE_SIZE, &cfg).unwrap());
    for mode in [0o644, 0o640, 0o604, 0o620] {
        chmod(&pool, mode);
        let e = err_of(CxlCluster::open(&[&pool], &cfg)).to_string();
        assert!(e.starts_with(&format!("{}: file mode is {mode:o}; a cluster's must be 600", pool.display())), "{e}");
    }
    chmod(&pool, 0o600);
    assert!(CxlCluster::open(&[&pool], &cfg).is_ok());
    // Another user's file (the owner check itself is `swarm_mapped::private`'s test).
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&s.0).unwrap()) == 0 {
        std::os::unix::fs::chown(&pool, Some(4_000_000_001), None).unwrap();
        let e = err_of(CxlCluster::open(&[&pool], &cfg)).to_string();
        assert!(e.contains("owned by uid 4000000001, not by you (uid 0); refusing to use a cluster"), "{e}");
    }
}

#[test]
fn permission_errors_are_recognised() {
    let e = CxlError::io(Path::new("/dev/dax9.9"), "open", std::io::Error::from_raw_os_error(13));
    assert!(matches!(e, CxlError::PermissionDenied { .. }));
    assert!(e.to_string().starts_with("/dev/dax9.9: permission denied"), "{e}");
    // A real refusal, where DAC applies (not to root).
    let s = Scratch::new("/dev/shm", "perm");
    let pool = s.path("pool");
    drop(CxlCluster::create(&[&pool], 1, NODE_SIZE, &CxlConfig::default()).unwrap());
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o400)).unwrap();
    match CxlCluster::open(&[&pool], &CxlConfig::default()) {
        Err(e) => assert!(matches!(e, CxlError::PermissionDenied { .. }), "{e:?}"),
        Ok(_) => println!("running as root: file modes do not refuse access, only the error mapping was tested"),
    }
}

/// A fake sysfs in which `/dev/null` (1:3) is a device-dax instance.
fn fake_sysfs(s: &Scratch, size: &str, align: Option<&str>, region_align: Option<&str>) -> PathBuf {
    let root = s.path("sys");
    let dev = root.join("devices/platform/dax0.0");
    std::fs::create_dir_all(dev.join("dax_region")).unwrap();
    std::fs::create_dir_all(root.join("bus/dax")).unwrap();
    std::fs::create_dir_all(root.join("dev/char")).unwrap();
    symlink("../../../bus/dax", dev.join("subsystem")).unwrap();
    symlink("../../devices/platform/dax0.0", root.join("dev/char/1:3")).unwrap();
    std::fs::write(dev.join("size"), size).unwrap();
    if let Some(a) = align {
        std::fs::write(dev.join("align"), a).unwrap();
    }
    if let Some(a) = region_align {
        std::fs::write(dev.join("dax_region/align"), a).unwrap();
    }
    root
}

#[test]
fn device_dax_geometry_comes_from_sysfs() {
    let null_rdev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/dev/null").unwrap().rdev()
    };
    let s = Scratch::new("/dev/shm", "sysfs1");
    let root = fake_sysfs(&s, "1073741824\n", Some("2097152\n"), Some("4096"));
    assert_eq!(map::dax_geometry(&root, null_rdev), Ok((1 << 30, 2 << 20)));
    let s = Scratch::new("/dev/shm", "sysfs2");
    let root = fake_sysfs(&s, "1073741824", None, Some("0x40000000"));
    assert_eq!(map::dax_geometry(&root, null_rdev), Ok((1 << 30, 1 << 30)), "older kernels: the region's align");
    let s = Scratch::new("/dev/shm", "sysfs3");
    let root = fake_sysfs(&s, "1073741824", None, None);
    assert_eq!(map::dax_geometry(&root, null_rdev), Ok((1 << 30, 2 << 20)), "unknown: 2 MiB");
    let s = Scratch::new("/dev/shm", "sysfs4");
    let root = fake_sysfs(&s, "lots", Some("4096"), None);
    assert!(map::dax_geometry(&root, null_rdev).unwrap_err().contains("not a number"));
    let s = Scratch::new("/dev/shm", "sysfs5");
    let root = fake_sysfs(&s, "4096", Some("3000"), None);
    assert!(map::dax_geometry(&root, null_rdev).unwrap_err().contains("impossible alignment"));
    assert!(map::dax_geometry(Path::new("/sys"), null_rdev).unwrap_err().contains("not a device-dax"));
}

/// The device-dax path end to end on a stand-in device (`/dev/null` made to
/// look like device-dax through a fake sysfs): the alignment and size
/// checks come before anything touches the device, and a device that
/// cannot be mapped says so.
#[test]
fn device_dax_sizes_must_fit_and_align() {
    let s = Scratch::new("/dev/shm", "fakedax");
    let sysfs = fake_sysfs(&s, "16777216", Some("2097152"), None);
    let cfg = CxlConfig { sysfs, ..CxlConfig::default() };
    let e = err_of(CxlCluster::create(&["/dev/null"], 3, 1 << 20, &cfg));
    assert!(matches!(e, CxlError::Misaligned { what: "node size", value: 1048576, align: 2097152, .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("/dev/null: node size of 1048576 bytes is not a multiple of the device's alignment"),
        "{e}"
    );
    let e = err_of(CxlCluster::create(&["/dev/null"], 8, 2 << 20, &cfg));
    assert!(matches!(e, CxlError::TooSmall { size: 16777216, needed: 18874368, .. }), "{e:?}");
    assert!(e.to_string().contains("too small"), "{e}");
    let e = err_of(CxlCluster::create(&["/dev/null"], 3, 2 << 20, &cfg));
    assert!(e.to_string().starts_with("/dev/null: cannot map the device"), "{e}");
}

#[test]
fn flush_modes_parse() {
    for m in [FlushMode::None, FlushMode::Persist, FlushMode::NonCoherent] {
        assert_eq!(m.name().parse::<FlushMode>(), Ok(m));
    }
    assert!("sometimes".parse::<FlushMode>().is_err());
    assert_eq!(FlushMode::default(), FlushMode::Persist);
}
