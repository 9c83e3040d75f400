//! `swarm memnode create/list/remove` round trips in /dev/shm, a
//! benchmark on a created cluster, and faults set on a running cluster.

mod common;

use common::{ShmDir, fails, ok};

/// The line of `memnode list` that describes `path`, if any.
fn listed(path: &str) -> Option<String> {
    ok(&["memnode", "list"]).lines().find(|l| l.split_whitespace().next() == Some(path)).map(str::to_string)
}

#[test]
fn create_list_bench_remove() {
    let (dir, _) = ShmDir::named("roundtrip");
    let out = ok(&["memnode", "create", "--dir", dir.arg(), "--nodes", "3", "--size", "32M"]);
    assert!(out.contains("3 node(s) of 32 MiB, chunks of 1 MiB, values up to 8 KiB"), "{out}");
    for f in ["control", "node-0", "node-1", "node-2"] {
        assert!(dir.0.join(f).is_file(), "{f} missing");
    }
    let line = listed(dir.arg()).expect("the new cluster is listed");
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cols[1..8], ["3", "32", "MiB", "1", "MiB", "8208", "B"], "{line}");
    let used_before = cols[8].to_string();
    // Named as the other subcommands name it, the cluster alone.
    let one = ok(&["memnode", "list", "--dir", dir.arg()]);
    assert_eq!(one.lines().count(), 2, "{one}");
    assert_eq!(one.lines().nth(1), Some(line.as_str()));

    // Clients of another process use it.
    let out = ok(&["bench-register", "--dir", dir.arg(), "--ops", "200", "--clients", "2", "--value-size", "1K"]);
    assert!(out.contains(dir.arg()) && out.contains("write"), "{out}");
    let after = listed(dir.arg()).unwrap();
    assert_ne!(after.split_whitespace().nth(8).unwrap(), used_before, "the bench allocated: {after}");

    let out = ok(&["memnode", "remove", "--dir", dir.arg()]);
    assert!(out.contains("removed"), "{out}");
    assert!(!dir.0.exists());
    assert_eq!(listed(dir.arg()), None);
    assert!(fails(&["memnode", "remove", "--dir", dir.arg()], 1).contains("no cluster at"));
    assert!(fails(&["memnode", "list", "--dir", dir.arg()], 1).contains("no cluster at"));
}

#[test]
fn bare_names_live_in_dev_shm_with_a_prefix() {
    let (dir, name) = ShmDir::named("bare");
    ok(&["memnode", "create", "--dir", &name, "--nodes", "1", "--size", "4M", "--chunk", "64K"]);
    assert!(dir.0.join("control").is_file(), "{} missing", dir.0.display());
    assert!(listed(dir.arg()).is_some());
    assert!(ok(&["memnode", "list", "--dir", &name]).contains(dir.arg()));
    // The listed name (with its prefix) works as well as the bare one.
    let prefixed = format!("swarm-{name}");
    ok(&["memnode", "remove", "--dir", &prefixed]);
    assert!(!dir.0.exists());
}

#[test]
fn list_shows_broken_clusters_and_skips_foreign_directories() {
    let (broken, _) = ShmDir::named("broken");
    ok(&["memnode", "create", "--dir", broken.arg(), "--nodes", "2", "--size", "4M", "--chunk", "64K"]);
    std::fs::remove_file(broken.0.join("node-1")).unwrap();
    let root = tempdir_in_shm();
    std::fs::create_dir(root.0.join("not-ours")).unwrap();
    std::fs::write(root.0.join("not-ours").join("control"), b"x").unwrap();
    let out = ok(&["memnode", "list", "--root", root.arg()]);
    assert_eq!(out.trim(), format!("no clusters under {}", root.arg()));
    let out = ok(&["memnode", "list"]);
    let line = out.lines().find(|l| l.starts_with(broken.arg())).expect("the broken cluster is listed");
    assert!(line.contains("unusable") && line.contains("node-1"), "{line}");
    // Asked for by name, what is wrong with it is the error.
    let err = fails(&["memnode", "list", "--dir", broken.arg()], 1);
    assert!(err.contains("unusable") && err.contains("node-1") && err.lines().count() == 1, "{err}");
    ok(&["memnode", "remove", "--dir", broken.arg()]);
}

fn tempdir_in_shm() -> ShmDir {
    let (dir, _) = ShmDir::named("root");
    std::fs::create_dir(&dir.0).unwrap();
    dir
}

/// The same round trip on the cxl backend: nodes partitioning one file
/// (here on tmpfs, emulated pmem), created, listed, benchmarked by another
/// process and removed; and a benchmark on paths of its own.
#[test]
fn cxl_create_list_bench_remove() {
    let (dir, _) = ShmDir::named("cxl");
    std::fs::create_dir(&dir.0).unwrap();
    let pool = dir.0.join("pool");
    let pool = pool.to_str().unwrap();
    let out = ok(&["memnode", "create", "--backend", "cxl", "--path", pool, "--nodes", "3", "--size", "16M"]);
    assert!(out.contains("3 node(s) of 16 MiB"), "{out}");
    let listed = ok(&["memnode", "list", "--path", pool]);
    assert!(listed.contains("tmpfs") && listed.contains("0..3"), "{listed}");
    let out = ok(&["bench-register", "--backend", "cxl", "--path", pool, "--ops", "200", "--value-size", "256"]);
    assert!(out.contains("cxl (") && out.contains("flush persist") && out.contains("lines written back"), "{out}");
    assert!(
        fails(&["memnode", "create", "--backend", "cxl", "--path", pool, "--nodes", "3", "--size", "16M"], 1)
            .contains("already holds data")
    );
    ok(&["memnode", "remove", "--backend", "cxl", "--path", pool]);
    assert!(!std::path::Path::new(pool).exists());

    // Paths of its own, in each flush mode; removed afterwards.
    let own = dir.0.join("own");
    let own = own.to_str().unwrap();
    for mode in ["none", "persist", "noncoherent"] {
        let out = ok(&["bench-register", "--backend", "cxl", "--path", own, "--flush", mode, "--ops", "100"]);
        assert!(out.contains(&format!("flush {mode}")), "{out}");
        assert!(!std::path::Path::new(own).exists(), "the bench's own nodes are removed");
    }
}

#[test]
fn a_fault_set_by_one_process_is_seen_by_the_others() {
    let (dir, _) = ShmDir::named("fault");
    let d = dir.arg();
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "32M"]);
    ok(&["kv", "--dir", d, "init", "--system", "raw"]);
    ok(&["kv", "--dir", d, "put", "k", "v"]);
    let out = ok(&["memnode", "fault", "--dir", d, "--node", "0", "fail"]);
    assert!(out.contains("node 0 of ") && out.contains("is failed"), "{out}");
    let e = fails(&["kv", "--dir", d, "get", "k"], 1);
    assert!(e.contains("node 0 is down (unreachable)"), "{e}");
    ok(&["memnode", "fault", "--dir", d, "--node", "0", "heal"]);
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]).trim_end(), "v");
    let e = fails(&["memnode", "fault", "--dir", d, "--node", "3", "stall"], 1);
    assert!(e.contains("has 3 node(s); there is no node 3"), "{e}");
    let e = fails(&["memnode", "fault", "--dir", d, "--node", "1", "explode"], 2);
    assert!(e.contains("invalid value 'explode'"), "{e}");
}

/// The user's sequence on a store over the replicated index: a node fails
/// (the index leaves it out), comes back (a later command brings it back),
/// then another fails. Every command answers right throughout: the node
/// that came back is a full member of the index again, so the store
/// survives the second failure (before, it answered "too few memory nodes
/// answered"). Each view change pauses one command for a few seconds.
#[test]
fn a_healed_node_rejoins_and_the_store_survives_the_next_failure() {
    let (dir, _) = ShmDir::named("rejoin");
    let d = dir.arg();
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "32M"]);
    ok(&["kv", "--dir", d, "init", "--system", "swarm-kv", "--keys", "1000"]);
    let put = |k: &str, v: &str| assert_eq!(ok(&["kv", "--dir", d, "put", k, v]), "OK\n");
    let get = |k: &str| ok(&["kv", "--dir", d, "get", k]).trim_end().to_string();
    for i in 0..5 {
        put(&format!("k{i}"), &format!("v{i}"));
    }
    ok(&["memnode", "fault", "--dir", d, "--node", "1", "fail"]);
    assert_eq!(get("k0"), "v0");
    put("k5", "while node 1 is out");
    ok(&["memnode", "fault", "--dir", d, "--node", "1", "heal"]);
    assert_eq!(get("k5"), "while node 1 is out");
    put("k6", "after node 1 came back");
    ok(&["memnode", "fault", "--dir", d, "--node", "2", "fail"]);
    for i in 0..5 {
        assert_eq!(get(&format!("k{i}")), format!("v{i}"));
    }
    assert_eq!(get("k5"), "while node 1 is out");
    assert_eq!(get("k6"), "after node 1 came back");
    put("k7", "with node 2 out");
    assert_eq!(get("k7"), "with node 2 out");
}
