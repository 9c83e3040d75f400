//! `swarm serve` as a process of its own, serving clients in other
//! processes on one shm cluster: pings from several processes at once, its
//! counters, a clean stop on SIGTERM (clients are told), and a server
//! killed with SIGKILL and started again (clients time out, then reach the
//! new incarnation); a server started before the store was set up takes
//! the store's role.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::thread;

use common::{ShmDir, fails, ok, signal, start_server};

#[test]
fn a_server_process_serves_client_processes_and_stops_cleanly() {
    let (dir, _) = ShmDir::named("serve");
    let d = dir.arg().to_string();
    ok(&["memnode", "create", "--dir", &d, "--nodes", "3", "--size", "64M"]);
    assert!(fails(&["rpc", "--dir", &d, "--node", "1", "ping"], 1).contains("no server area"));
    let mut server = start_server(&d, "1").0;

    // Three client processes at once, each on its own channel.
    let clients: Vec<_> = (1..=3)
        .map(|id| {
            let d = d.clone();
            thread::spawn(move || {
                let id = id.to_string();
                ok(&["rpc", "--dir", &d, "--node", "1", "--id", &id, "ping", "--count", "300", "--size", "100"])
            })
        })
        .collect();
    for c in clients {
        let out = c.join().unwrap();
        assert!(out.starts_with("300 ping(s) of 100 B answered by node 1's server"), "{out}");
    }
    let stats = ok(&["rpc", "--dir", &d, "--node", "1", "stats"]);
    assert!(stats.starts_with("node 1: 900 request(s) served (0 refused), 0 answer(s) dropped"), "{stats}");

    signal(&server, "TERM");
    let out = server.wait_with_output().unwrap();
    assert!(out.status.success(), "the server's exit: {:?}", out.status);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("901 request(s) served"), "{said}");
    assert!(fails(&["rpc", "--dir", &d, "--node", "1", "ping"], 1).contains("no server on node 1: its server stopped"));

    // Killed: its clients time out; a new server serves them again.
    let killed = start_server(&d, "1").0;
    ok(&["rpc", "--dir", &d, "--node", "1", "ping"]);
    signal(&killed, "KILL");
    let _ = killed.wait_with_output();
    let e = fails(&["rpc", "--dir", &d, "--node", "1", "--timeout-ms", "200", "ping"], 1);
    assert!(e.contains("did not answer within 200 ms"), "{e}");
    let mut again = start_server(&d, "1").0;
    assert!(ok(&["rpc", "--dir", &d, "--node", "1", "ping", "--count", "10"]).starts_with("10 ping(s)"));
    signal(&again, "INT");
    assert!(again.wait().unwrap().success());
    server = start_server(&d, "0").0;
    assert!(fails(&["rpc", "--dir", &d, "--node", "9", "ping"], 1).contains("there is no node 9"));
    signal(&server, "TERM");
    assert!(server.wait().unwrap().success());
}

#[test]
fn a_server_started_before_the_store_takes_its_role() {
    let (dir, _) = ShmDir::named("serve-first");
    let d = dir.arg().to_string();
    ok(&["memnode", "create", "--dir", &d, "--nodes", "3", "--size", "64M"]);
    let (server, first) = start_server(&d, "0");
    assert!(first.contains("as bare (ping, stats) until a store is set up"), "{first}");
    ok(&["kv", "--dir", &d, "init", "--system", "pdpm-central"]);
    // The first client may meet the bare server: it waits for the role.
    ok(&["kv", "--dir", &d, "put", "k", "v"]);
    assert_eq!(ok(&["kv", "--dir", &d, "get", "k"]).trim_end(), "v");
    signal(&server, "TERM");
    let out = server.wait_with_output().unwrap();
    assert!(out.status.success(), "the server's exit: {:?}", out.status);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("a store was set up: bare after"), "{said}");
    assert!(said.contains("as pdpm-central's server"), "{said}");
}

/// A client of a store whose server is not running says so, and how to
/// start it, rather than that node 0 is down: before any server ran, and
/// after one stopped.
#[test]
fn a_client_without_its_server_says_how_to_start_it() {
    let (dir, _) = ShmDir::named("no-server");
    let d = dir.arg().to_string();
    ok(&["memnode", "create", "--dir", &d, "--nodes", "3", "--size", "64M"]);
    ok(&["kv", "--dir", &d, "init", "--system", "clover"]);
    let start = format!("start one with `swarm serve --dir {d} --node 0`");
    let line = fails(&["kv", "--dir", &d, "get", "k"], 1);
    assert!(line.contains("the store's server beside node 0 is not running (no server ever ran beside it)"), "{line}");
    assert!(line.contains(&start), "{line}");
    let (server, _) = start_server(&d, "0");
    ok(&["kv", "--dir", &d, "put", "k", "v"]);
    signal(&server, "TERM");
    assert!(server.wait_with_output().unwrap().status.success());
    let line = fails(&["kv", "--dir", &d, "get", "k"], 1);
    assert!(line.contains("is not running (its server stopped)"), "{line}");
    assert!(line.contains(&start), "{line}");

    // A session whose server is killed after it connected: its next call
    // to the server says so too, rather than blaming node 0.
    let (server, _) = start_server(&d, "0");
    let mut shell = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["kv", "--dir", &d, "shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shell.stdin.take().unwrap();
    let mut out = BufReader::new(shell.stdout.take().unwrap());
    writeln!(stdin, "put k w").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "OK\n");
    signal(&server, "KILL");
    server.wait_with_output().unwrap();
    // A key this session never saw: its cursor comes from the server.
    writeln!(stdin, "get other").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("error: get 'other': the store's server beside node 0 is not running"), "{line}");
    assert!(line.contains("(its server does not answer (killed, or hung))") && line.contains(&start), "{line}");
    drop(stdin);
    // It still gives its id back (memory alone), and ends cleanly.
    let end = shell.wait_with_output().unwrap();
    assert!(end.status.success(), "{}", String::from_utf8_lossy(&end.stderr));
}
