//! Unit tests of what this crate adds to `swarm-mapped`'s nodes: in-process
//! clusters, and shared clusters in files (the semantics of operations are
//! tested there).

use std::sync::atomic::{AtomicUsize, Ordering};

use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::read_word;
use swarm_core::{MemErrorKind, Memory, NodeId, RemoteAddr};

use crate::{Fault, ShmCluster, ShmError};

fn at(node: u16, offset: u64) -> RemoteAddr {
    RemoteAddr::new(NodeId(node), offset)
}

#[test]
fn clusters_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ShmCluster>();
}

#[test]
fn in_process_shapes_are_checked() {
    assert!(matches!(ShmCluster::in_process(0, 64), Err(ShmError::Config(_))));
    assert!(matches!(ShmCluster::in_process(1, 0), Err(ShmError::Config(_))));
    assert!(matches!(ShmCluster::in_process(1, 12), Err(ShmError::Config(_))));
    assert!(matches!(ShmCluster::in_process(crate::MAX_NODES + 1, 64), Err(ShmError::Config(_))));
    let c = ShmCluster::in_process(3, 64).unwrap();
    assert_eq!((c.node_count(), c.node_size(), c.dir()), (3, 64, None));
}

/// Shared clusters: a fresh directory under /dev/shm, removed on drop.
mod shared {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            TempDir(PathBuf::from(format!("/dev/shm/swarm-unit-{}-{n}-{name}", std::process::id())))
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn create_open_share_and_remove() {
        let dir = TempDir::new("share");
        let a = ShmCluster::create(&dir.0, 2, 8192).unwrap();
        assert_eq!(mode(&dir.0), 0o700);
        for f in ["control", "node-0", "node-1"] {
            assert_eq!(mode(&dir.0.join(f)), 0o600, "{f}");
        }
        assert_eq!(fs::metadata(dir.0.join("node-1")).unwrap().len(), 8192);
        let b = ShmCluster::open(&dir.0).unwrap();
        assert_eq!((b.node_count(), b.node_size(), b.dir()), (2, 8192, Some(dir.0.as_path())));
        // Two separate mappings of the same files see each other's writes...
        block_on(a.memory().write(at(1, 8190), &[1, 2])).unwrap();
        assert_eq!(block_on(b.memory().read(at(1, 8190), 2)).unwrap().to_vec(), [1, 2]);
        assert_eq!(block_on(b.memory().cas(at(0, 0), 0, 11)).unwrap(), 0);
        assert_eq!(block_on(a.memory().cas(at(0, 0), 11, 12)).unwrap(), 11);
        // ...and each other's fault injection.
        a.set_fault(NodeId(1), Fault::Failed).unwrap();
        assert_eq!(b.fault(NodeId(1)), Some(Fault::Failed));
        assert_eq!(block_on(b.memory().read(at(1, 0), 1)).unwrap_err().kind, MemErrorKind::Unreachable);
        ShmCluster::remove(&dir.0).unwrap();
        assert!(!dir.0.exists());
        // Mappings outlive removal.
        assert_eq!(block_on(read_word(&b.memory(), at(0, 0))).unwrap(), 12);
    }

    #[test]
    fn create_refuses_bad_shapes_and_existing_directories() {
        let dir = TempDir::new("create");
        assert!(matches!(ShmCluster::create(&dir.0, 1, 4095), Err(ShmError::Config(_))));
        assert!(matches!(ShmCluster::create(&dir.0, 0, 4096), Err(ShmError::Config(_))));
        assert!(!dir.0.exists(), "a refused configuration creates nothing");
        let _c = ShmCluster::create(&dir.0, 1, 4096).unwrap();
        let again = ShmCluster::create(&dir.0, 1, 4096);
        assert!(matches!(again, Err(ShmError::Io { .. })), "{again:?}", again = again.as_ref().err());
        assert!(dir.0.join("node-0").exists(), "a refused create leaves the existing cluster alone");
        assert!(ShmCluster::create("/dev/shm/no-such-parent-swarm/x", 1, 4096).is_err());
    }

    fn open_err(dir: &Path) -> String {
        match ShmCluster::open(dir) {
            Ok(_) => panic!("{} opened", dir.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn open_validates_everything() {
        let dir = TempDir::new("open");
        assert!(open_err(&dir.0).contains("cannot open directory"));
        drop(ShmCluster::create(&dir.0, 3, 4096).unwrap());
        assert!(ShmCluster::open(&dir.0).is_ok());

        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(open_err(&dir.0).contains("mode is 755"));
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o700)).unwrap();

        let node = dir.0.join("node-2");
        fs::OpenOptions::new().write(true).open(&node).unwrap().set_len(8192).unwrap();
        assert!(open_err(&dir.0).contains("is 8192 bytes"));
        fs::remove_file(&node).unwrap();
        assert!(open_err(&dir.0).contains("node-2"));

        let control = dir.0.join("control");
        fs::write(&control, vec![0u8; 4096]).unwrap();
        assert!(open_err(&dir.0).contains("bad magic"));
        fs::write(&control, b"short").unwrap();
        assert!(open_err(&dir.0).contains("impossible size"));
        let mut garbled = vec![0u8; 4096];
        garbled[..8].copy_from_slice(b"SWARMSHM");
        garbled[8..16].copy_from_slice(&1u64.to_le_bytes());
        garbled[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        fs::write(&control, &garbled).unwrap();
        assert!(open_err(&dir.0).contains("impossible node count"));
        garbled[16..24].copy_from_slice(&3u64.to_le_bytes());
        garbled[24..32].copy_from_slice(&4097u64.to_le_bytes());
        fs::write(&control, &garbled).unwrap();
        assert!(open_err(&dir.0).contains("impossible shape"));
        fs::remove_file(&control).unwrap();
        assert!(open_err(&dir.0).contains("control"));
    }

    /// Whether this process runs as root, who may give files away (and
    /// whom modes do not stop, which is why the owner must be checked).
    fn root() -> bool {
        use std::os::unix::fs::MetadataExt;
        let probe = TempDir::new("probe");
        fs::create_dir(&probe.0).unwrap();
        fs::metadata(&probe.0).unwrap().uid() == 0
    }

    /// A uid that no one has.
    const STRANGER: u32 = 4_000_000_001;

    /// A cluster is used only if it is ours alone: its directory, control
    /// file and node files owned by this user and reachable by no one else.
    #[test]
    fn open_refuses_what_others_can_reach_or_own() {
        let dir = TempDir::new("owner");
        drop(ShmCluster::create(&dir.0, 2, 4096).unwrap());
        let shown = dir.0.display().to_string();

        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
        let e = open_err(&dir.0);
        assert!(
            e.starts_with(&format!("{shown}: not a usable cluster: directory mode is 755; a cluster's must be 700"))
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o700)).unwrap();

        for f in ["node-1", "control"] {
            let file = dir.0.join(f);
            for m in [0o644, 0o660, 0o606] {
                fs::set_permissions(&file, fs::Permissions::from_mode(m)).unwrap();
                let e = open_err(&dir.0);
                let want =
                    format!("{}: not a usable cluster: file mode is {m:o}; a cluster's must be 600", file.display());
                assert!(e.starts_with(&want), "{e}");
            }
            fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert!(ShmCluster::open(&dir.0).is_ok());

        if !root() {
            println!("not root: cannot give files away; the owner check is swarm_mapped::private's test");
            return;
        }
        for f in [None, Some("node-0"), Some("control")] {
            let path = f.map_or_else(|| dir.0.clone(), |f| dir.0.join(f));
            std::os::unix::fs::chown(&path, Some(STRANGER), None).unwrap();
            let e = open_err(&dir.0);
            let want = format!(
                "{}: not a usable cluster: owned by uid {STRANGER}, not by you (uid 0); \
                 refusing to use a cluster someone else can control",
                path.display()
            );
            assert_eq!(e, want);
            std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        }
        assert!(ShmCluster::open(&dir.0).is_ok());
    }

    fn create_err(dir: &Path) -> String {
        match ShmCluster::create(dir, 1, 4096) {
            Ok(_) => panic!("{} created", dir.display()),
            Err(e) => e.to_string(),
        }
    }

    /// `create` never adopts what is already there: a directory someone
    /// made under the cluster's name, a file, a symbolic link.
    #[test]
    fn create_refuses_any_existing_path() {
        let dir = TempDir::new("planted");
        fs::create_dir(&dir.0).unwrap();
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).unwrap();
        let e = create_err(&dir.0);
        assert!(e.starts_with(&format!("{}: cannot create directory: ", dir.0.display())), "{e}");
        assert_eq!(fs::read_dir(&dir.0).unwrap().count(), 0, "nothing made in it");
        assert_eq!(mode(&dir.0), 0o777, "its mode left alone");
        fs::remove_dir(&dir.0).unwrap();

        fs::write(&dir.0, b"").unwrap();
        assert!(create_err(&dir.0).contains("cannot create directory"));
        fs::remove_file(&dir.0).unwrap();

        let target = TempDir::new("target");
        fs::create_dir(&target.0).unwrap();
        std::os::unix::fs::symlink(&target.0, &dir.0).unwrap();
        assert!(create_err(&dir.0).contains("cannot create directory"));
        assert_eq!(fs::read_dir(&target.0).unwrap().count(), 0, "nothing made through the link");
        fs::remove_file(&dir.0).unwrap();
    }

    #[test]
    fn remove_refuses_foreign_files() {
        let dir = TempDir::new("remove");
        drop(ShmCluster::create(&dir.0, 2, 4096).unwrap());
        fs::write(dir.0.join("precious.txt"), b"keep me").unwrap();
        assert!(matches!(ShmCluster::remove(&dir.0), Err(ShmError::Invalid { .. })));
        assert!(dir.0.join("node-0").exists() && dir.0.join("precious.txt").exists(), "nothing was removed");
        fs::remove_file(dir.0.join("precious.txt")).unwrap();
        ShmCluster::remove(&dir.0).unwrap();
        assert!(!dir.0.exists());
    }
}
