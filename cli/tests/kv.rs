//! `swarm kv` on a cluster of `swarm memnode create`: init once, then get,
//! put, delete and the shell, from separate processes.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{ShmDir, fails, ok};

fn cluster(tag: &str) -> ShmDir {
    let (dir, _) = ShmDir::named(tag);
    ok(&["memnode", "create", "--dir", dir.arg(), "--nodes", "3", "--size", "64M", "--max-value", "1K"]);
    dir
}

#[test]
fn a_person_at_a_terminal() {
    let dir = cluster("kv");
    let d = dir.arg();
    assert!(fails(&["kv", "--dir", d, "get", "k"], 1).contains("holds no key-value store yet"));
    let e = fails(&["kv", "--dir", d, "init", "--system", "swarm-kv", "--option", "in-place=most"], 1);
    assert!(e.contains("swarm-kv's option in-place takes first, every, not 'most'"), "{e}");
    let e = fails(&["kv", "--dir", d, "init", "--system", "raw", "--option", "in-place=every"], 1);
    assert!(e.contains("raw has no options"), "{e}");
    let out = ok(&["kv", "--dir", d, "init", "--system", "swarm-kv", "--keys", "1000", "--max-value", "256"]);
    assert!(out.contains("swarm-kv store for 1000 keys"), "{out}");
    assert!(fails(&["kv", "--dir", d, "init"], 1).contains("already holds a key-value store"));
    let info = ok(&["kv", "--dir", d, "info"]);
    assert!(info.contains("swarm-kv with 3 replica(s)") && info.contains("options in-place=first"), "{info}");
    assert_eq!(ok(&["kv", "--dir", d, "put", "greeting", "hello world"]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "--id", "2", "get", "greeting"]), "hello world\n");
    assert_eq!(ok(&["kv", "--dir", d, "put", "greeting", "bye"]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "get", "greeting"]), "bye\n");
    assert_eq!(ok(&["kv", "--dir", d, "delete", "greeting"]), "deleted\n");
    assert!(fails(&["kv", "--dir", d, "get", "greeting"], 1).contains("'greeting' not found"));
    assert!(fails(&["kv", "--dir", d, "put", "k", &"v".repeat(300)], 1).contains("values may have up to 256 bytes"));
    assert!(fails(&["kv", "--dir", d, "--id", "9", "get", "k"], 1).contains("not a client id of this store"));

    let mut shell = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["kv", "--dir", d, "shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    shell
        .stdin
        .take()
        .unwrap()
        .write_all(b"put a one two\nget a\nupdate a three\nget a\nupdate zz x\nfrob\nget\ndelete a\nget a\nhelp\nquit\nget a\n")
        .unwrap();
    let out = shell.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..9],
        [
            "OK",
            "one two",
            "OK",
            "three",
            "error: 'zz' not found (insert it with put)",
            "error: unknown command 'frob' (type help)",
            "error: get needs a KEY (type help)",
            "deleted",
            "error: 'a' not found",
        ]
    );
    assert!(text.contains("commands:"), "{text}");
}

#[test]
fn bad_input_and_missing_clusters() {
    let (missing, _) = ShmDir::named("nokv");
    assert!(fails(&["kv", "--dir", missing.arg(), "get", "k"], 1).contains("swarm memnode create"));
    assert!(fails(&["kv", "--dir", "x", "init", "--system", "nosuch"], 2).contains("'nosuch' is not a system"));
    assert!(fails(&["kv", "--dir", "x", "--id", "0", "get", "k"], 2).contains("client ids go from 1 to 126"));
    let dir = cluster("kvbad");
    let d = dir.arg();
    assert!(fails(&["kv", "--dir", d, "init", "--replicas", "5"], 1).contains("more replicas than memory nodes"));
    assert!(fails(&["kv", "--dir", d, "init", "--max-value", "2K"], 1).contains("values of up to"));
    assert!(fails(&["kv", "--dir", d, "init", "--keys", "100000000"], 1).contains("does not fit in node 0"));
    ok(&["kv", "--dir", d, "init", "--system", "raw", "--keys", "100", "--max-key", "8"]);
    assert!(fails(&["kv", "--dir", d, "put", "much-too-long", "v"], 1).contains("keys must have 1 to 8 bytes"));
    // The cluster can still be removed: the store lives in its nodes.
    ok(&["memnode", "remove", "--dir", d]);
}
