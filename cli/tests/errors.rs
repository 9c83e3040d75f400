//! Bad input of every kind ends in one `error: ...` line on stderr and a
//! non-zero status (2 for the command line, 1 for a failed command), never
//! a panic.

mod common;

use common::{ShmDir, fails, ok, swarm};

#[test]
fn bad_flags_are_one_line_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench-register", "--frobnicate"], "unexpected argument '--frobnicate'"),
        (&["bench-register", "--replicas", "4"], "replicas must be 3, 5 or 7"),
        (&["bench-register", "--replicas", "9"], "replicas must be 3, 5 or 7"),
        (&["bench-register", "--clients", "0"], "clients must be between 1 and 126"),
        (&["bench-register", "--clients", "many"], "not a whole number"),
        (&["bench-register", "--read-ratio", "1.5"], "read ratio must be between 0 and 1"),
        (&["bench-register", "--value-size", "70000"], "at most 65536 bytes"),
        (&["bench-register", "--ops", "0"], "operations must be between 1"),
        (&["bench-register", "--backend", "rdma"], "invalid value 'rdma'"),
        (&["bench-register", "--inject-rtt-us", "-1"], "injected latency must be between 0"),
        (&["bench-register", "--read-ratio", "-0.5"], "read ratio must be between 0 and 1"),
        (&["memnode", "create", "--dir", "x", "--nodes", "3", "--size", "0"], "node size must be positive"),
        (&["memnode", "create", "--dir", "x", "--nodes", "3", "--size", "4097"], "multiple of 4 KiB"),
        (&["memnode", "create", "--dir", "x", "--nodes", "3", "--size", "12Q"], "unknown size suffix"),
        (&["memnode", "create", "--dir", "x", "--nodes", "3", "--size", "4T"], "at most 1 TiB"),
        (&["memnode", "create", "--dir", "x", "--nodes", "0", "--size", "1M"], "nodes must be between 1 and 1024"),
        (&["memnode", "create", "--dir", "x", "--nodes", "3"], "--size <SIZE>"),
        (&["memnode", "create", "--dir", "", "--nodes", "3", "--size", "1M"], "must not be empty"),
        (&["memnode", "frob"], "unrecognized subcommand 'frob'"),
    ];
    for (args, expect) in cases {
        let line = fails(args, 2);
        assert!(line.contains(expect), "swarm {args:?}: {line:?} lacks {expect:?}");
    }
}

#[test]
fn help_and_version_are_not_errors() {
    assert!(ok(&["--help"]).contains("memnode"));
    assert!(ok(&["bench-register", "--help"]).contains("--read-ratio"));
    assert!(ok(&["--version"]).starts_with("swarm "));
    // A missing subcommand prints the help, as a usage error.
    let out = swarm(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage:"));
}

#[test]
fn flags_that_do_not_go_together() {
    assert!(fails(&["bench-register", "--backend", "sim", "--inject-rtt-us", "3"], 1).contains("shm and cxl"));
    assert!(fails(&["bench-register", "--backend", "sim", "--dir", "somewhere"], 1).contains("shm only"));
    assert!(fails(&["bench-register", "--sim-jitter"], 1).contains("sim only"));
    assert!(fails(&["bench-register", "--path", "/dev/shm/x"], 1).contains("--backend cxl only"));
    assert!(fails(&["bench-register", "--flush", "none"], 1).contains("--backend cxl only"));
    assert!(fails(&["bench-register", "--backend", "cxl"], 1).contains("needs --path"));
    assert!(
        fails(&["bench-register", "--backend", "cxl", "--path", "/dev/shm/x", "--dir", "y"], 1).contains("shm only")
    );
    assert!(
        fails(&["bench-register", "--backend", "cxl", "--path", "/dev/shm/x", "--flush", "maybe"], 2)
            .contains("unknown flush mode")
    );
    assert!(
        fails(&["memnode", "create", "--backend", "cxl", "--nodes", "1", "--size", "4M"], 1).contains("needs --path")
    );
    assert!(
        fails(&["memnode", "create", "--path", "/dev/shm/x", "--nodes", "1", "--size", "4M"], 1)
            .contains("--path applies")
    );
    assert!(
        fails(&["memnode", "remove", "--backend", "cxl", "--path", "/dev/shm/no-such-swarm-pool"], 1)
            .contains("no such device or file")
    );
    let line = fails(&["bench-register", "--ops", "10", "--json", "/nonexistent-dir/x.json"], 1);
    assert!(line.contains("cannot write /nonexistent-dir/x.json"), "{line}");
}

#[test]
fn impossible_clusters_are_refused_before_anything_is_made() {
    let (dir, _) = ShmDir::named("bad");
    let create = |extra: &[&str]| {
        let mut args = vec!["memnode", "create", "--dir", dir.arg(), "--nodes", "3"];
        args.extend_from_slice(extra);
        let line = fails(&args, 1);
        assert!(!dir.0.exists(), "swarm {args:?} left {} behind", dir.0.display());
        line
    };
    assert!(create(&["--size", "1T"]).contains("free"), "larger than /dev/shm");
    assert!(create(&["--size", "8K"]).contains("too small"));
    assert!(
        create(&["--size", "1M", "--chunk", "4K", "--max-value", "8K"]).contains("cannot hold one writer-log entry")
    );
}

#[test]
fn missing_and_foreign_directories() {
    let (missing, name) = ShmDir::named("missing");
    assert!(fails(&["memnode", "remove", "--dir", missing.arg()], 1).contains("no cluster at"));
    assert!(fails(&["memnode", "remove", "--dir", &name], 1).contains("no cluster at"));
    assert!(fails(&["bench-register", "--dir", missing.arg(), "--ops", "10"], 1).contains(missing.arg()));
    // A directory that is not a cluster is not removed.
    let (foreign, _) = ShmDir::named("foreign");
    std::fs::create_dir(&foreign.0).unwrap();
    std::fs::write(foreign.0.join("data"), b"precious").unwrap();
    assert!(fails(&["memnode", "remove", "--dir", foreign.arg()], 1).contains("not a cluster"));
    assert!(foreign.0.join("data").exists());
}

#[test]
fn bench_checks_the_cluster_it_is_given() {
    let (dir, _) = ShmDir::named("small");
    ok(&[
        "memnode",
        "create",
        "--dir",
        dir.arg(),
        "--nodes",
        "3",
        "--size",
        "4M",
        "--chunk",
        "64K",
        "--max-value",
        "64",
    ]);
    let line = fails(&["bench-register", "--dir", dir.arg(), "--replicas", "5", "--ops", "10"], 1);
    assert!(line.contains("--replicas 5 needs 5 nodes"), "{line}");
    let line = fails(&["bench-register", "--dir", dir.arg(), "--value-size", "200", "--ops", "10"], 1);
    assert!(line.contains("values of up to 80 bytes, not 200"), "{line}");
    let line = fails(&["bench-register", "--dir", dir.arg(), "--ops", "100000"], 1);
    assert!(line.contains("exceed"), "{line}");
    let line = fails(&["bench-register", "--dir", dir.arg(), "--ops", "20000"], 1);
    assert!(line.contains("free"), "{line}");
    let line = fails(&["memnode", "create", "--dir", dir.arg(), "--nodes", "3", "--size", "4M"], 1);
    assert!(line.contains("already exists"), "{line}");
}
