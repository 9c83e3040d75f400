//! `swarm kv` at the edges of a store (issue #19): a full store read by a
//! new process, sizes on which no key fits, node 0 down, a writer log
//! whose node is full, time running out or a clock ahead, and the shell's
//! input that is not UTF-8 or ends in spaces. Each ends in one line that
//! names the problem with its numbers, and loses nothing.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ShmDir, fails, ok};
use swarm_backend_shm::{Fault, ShmCluster};
use swarm_core::kv::record::{self, Found};
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::space::{Region, roots};
use swarm_core::{Memory, NodeId, systems};

/// A cluster of 3 nodes with `args` for `memnode create`.
fn cluster(tag: &str, args: &[&str]) -> ShmDir {
    let (dir, _) = ShmDir::named(tag);
    let mut all = vec!["memnode", "create", "--dir", dir.arg(), "--nodes", "3"];
    all.extend_from_slice(args);
    ok(&all);
    dir
}

/// Runs `swarm kv --dir DIR shell` with `input` on stdin; its stdout.
fn shell(dir: &str, input: &[u8]) -> String {
    shell_paced(dir, vec![input.to_vec()], Duration::ZERO)
}

/// [`shell`] with its input given in `parts`, `gap` apart: a client that
/// writes at most so fast, whatever the machine.
fn shell_paced(dir: &str, parts: Vec<Vec<u8>>, gap: Duration) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["kv", "--dir", dir, "shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start swarm kv shell");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for part in parts {
            let _ = stdin.write_all(&part);
            std::thread::sleep(gap);
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "shell failed ({}): {stderr}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

/// Rewrites the clients' clock epoch in the store record of every node of
/// `dir`: what a store set up long ago (or clients with a clock ahead)
/// looks like.
fn set_epoch(dir: &Path, epoch_us: u64) {
    let cluster = ShmCluster::open(dir).unwrap();
    let mem = cluster.memory();
    for n in 0..3 {
        let node = NodeId(n);
        let Ok(Found::Record(mut r)) = block_on(record::read(&mem, node, systems::from_name)) else {
            panic!("no store record on {node}");
        };
        r.epoch_us = epoch_us;
        let at = Region::root_slot(node, roots::STORE_RECORD).unwrap();
        block_on(mem.write(at, &record::encode(&r))).unwrap();
    }
}

/// The clients' clock epoch of the store on `dir`.
fn epoch(dir: &Path) -> u64 {
    let cluster = ShmCluster::open(dir).unwrap();
    block_on(systems::open(&cluster.memory())).unwrap().epoch_us
}

/// A store filled by one shell: a new process (a client id never used)
/// connects and reads; its put fails naming the node and the bytes, and
/// so do the shell's, once the nodes are full.
#[test]
fn a_full_store_stays_readable_by_a_new_process() {
    let dir = cluster("full", &["--size", "8M", "--chunk", "64K", "--max-value", "1K"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--writers", "2", "--keys", "5000", "--max-value", "1K"]);
    let value = "v".repeat(1000);
    let input: String = (0..5000).map(|i| format!("put key{i} {value}\n")).collect();
    let out = shell(d, input.as_bytes());
    // One answer per line of input: key i's is line i.
    let (written, full): (Vec<_>, Vec<_>) = out.lines().enumerate().partition(|(_, l)| *l == "OK");
    assert!(written.len() > 1000 && !full.is_empty(), "{} written; {full:?}", written.len());
    for (_, line) in &full {
        assert!(line.contains("is full: 64 KiB needed,") && line.contains("KiB free"), "{line}");
        assert!(line.starts_with("error: put 'key") && line.contains("gets still work"), "{line}");
    }
    // Client id 2 was never used: connecting claims nothing.
    let (first, last, lost) = (written[0].0, written[written.len() - 1].0, full[0].0);
    assert_eq!(ok(&["kv", "--dir", d, "--id", "2", "get", &format!("key{first}")]), format!("{value}\n"));
    assert_eq!(ok(&["kv", "--dir", d, "--id", "2", "get", &format!("key{last}")]), format!("{value}\n"));
    assert_eq!(fails(&["kv", "--dir", d, "get", &format!("key{lost}")], 1), format!("error: 'key{lost}' not found"));
    let e = fails(&["kv", "--dir", d, "--id", "2", "put", "another", "x"], 1);
    assert!(e.starts_with("error: put 'another': node ") && e.contains("is full: 64 KiB needed, "), "{e}");
}

/// `memnode create` refuses nodes on which no store takes a key, and `kv
/// init` nodes on which some client of its store could not write one,
/// both with the numbers of one computation and what would fit; on what
/// they accept, every client writes.
#[test]
fn sizes_on_which_no_key_fits_are_refused() {
    let (dir, _) = ShmDir::named("small");
    let d = dir.arg();
    // The smallest store is FUSEE's with one client: its values go in its
    // index's arena, no client chunk beside it.
    for size in ["2052K", "4M"] {
        let e = fails(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", size], 1);
        assert!(e.contains("too small for any key-value store") && e.contains("needs 4100 KiB on node 0"), "{e}");
        assert!(e.contains("(fusee, one client") && e.contains("use --size 5M or more, or a smaller --chunk"), "{e}");
        assert!(!dir.0.exists());
    }
    // Chunks of 12 KiB, not a power of two, hold values of 8 KiB as
    // pDPM-Central keeps them (a copy is the value's bytes), and a
    // SWARM-KV store: its log segments take a size class that fits.
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "16M", "--chunk", "12K"]);
    ok(&["kv", "--dir", d, "init", "--keys", "100", "--writers", "2"]);
    assert_eq!(ok(&["kv", "--dir", d, "put", "k", "v"]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), "v\n");
    ok(&["memnode", "remove", "--dir", d]);
    // RAW with one client fits 6 MiB.
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "6M"]);
    let e = fails(&["kv", "--dir", d, "init", "--keys", "100"], 1);
    assert!(e.contains("the store does not fit in node 0") && e.contains("--size 7M or more"), "{e}");
    ok(&["kv", "--dir", d, "init", "--system", "raw", "--keys", "100", "--writers", "1"]);
    assert_eq!(ok(&["kv", "--dir", d, "put", "k", "v"]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), "v\n");
    ok(&["memnode", "remove", "--dir", d]);

    // 16 MiB nodes, 8 writers: refused, with how many clients fit.
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "16M"]);
    let e = fails(&["kv", "--dir", d, "init"], 1);
    assert!(
        e.contains(
            "nodes of 16 MiB are too small for this store: swarm-kv with 8 client ids needs 25604 KiB on node 0"
        ) && e.contains("2 MiB per client to write one key of up to 1 KiB")
            && e.contains("--size 26M or more (or a smaller --chunk), or use --writers 3"),
        "{e}"
    );
    ok(&["kv", "--dir", d, "init", "--writers", "3"]);
    // Each client writes keys on every node (and the first keeps going).
    for id in ["1", "2", "3"] {
        for k in 0..12 {
            assert_eq!(ok(&["kv", "--dir", d, "--id", id, "put", &format!("{id}-{k}"), "v"]), "OK\n");
        }
    }
}

/// Node 0 failed, then stalled: SWARM-KV, whose index is replicated like
/// its values, goes on (gets, updates, deletes, new keys), and `memnode
/// list` names the node that is down.
#[test]
fn node_0_down_is_survived_and_reported() {
    let dir = cluster("down", &["--size", "64M"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--keys", "100"]);
    ok(&["kv", "--dir", d, "put", "a", "b"]);
    let nodes = ShmCluster::open(&dir.0).unwrap();
    nodes.set_fault(NodeId(0), Fault::Failed).unwrap();
    assert_eq!(ok(&["kv", "--dir", d, "get", "a"]), "b\n");
    assert_eq!(ok(&["kv", "--dir", d, "put", "a", "c"]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "get", "a"]), "c\n");
    for k in 0..8 {
        assert_eq!(ok(&["kv", "--dir", d, "put", &format!("new-{k}"), "v"]), "OK\n");
    }
    assert_eq!(ok(&["kv", "--dir", d, "delete", "new-0"]), "deleted\n");
    assert!(ok(&["kv", "--dir", d, "info"]).contains("swarm-kv with 3 replica(s)"));
    let listed = ok(&["memnode", "list"]);
    let line = listed.lines().find(|l| l.starts_with(d)).unwrap();
    assert_eq!(line, format!("{d}: unusable: node 0 is down (unreachable)"));
    nodes.set_fault(NodeId(0), Fault::Stalled).unwrap();
    assert_eq!(ok(&["kv", "--dir", d, "get", "a"]), "c\n");
    nodes.set_fault(NodeId(0), Fault::Healthy).unwrap();
    for k in 1..8 {
        assert_eq!(ok(&["kv", "--dir", d, "get", &format!("new-{k}")]), "v\n");
    }

    // A cluster whose node 0 is down when the store is set up.
    let fresh = cluster("down-init", &["--size", "64M"]);
    ShmCluster::open(&fresh.0).unwrap().set_fault(NodeId(0), Fault::Failed).unwrap();
    let e = fails(&["kv", "--dir", fresh.arg(), "init"], 1);
    assert_eq!(
        e,
        format!("error: {}: node 0 is down (unreachable); a store is set up with every node answering", fresh.arg())
    );
}

/// A writer log written three times over is recycled by the shell, and a
/// log segment with no room on any node is what the error says, with its
/// numbers, not that nodes did not answer.
#[test]
fn a_log_written_over_is_recycled_and_a_full_node_is_not_too_few_nodes() {
    // One client updates one key three times as often as its log has
    // entries (128 segments of 60 on these nodes, 8 MiB of values on 8 MiB
    // nodes), 960 writes per 150 ms at most: the shell keeps its client
    // between commands (every 100 ms), which recycles the log (a write's
    // entries come back 2 to 4 recycling delays of 100 ms after it), so
    // every put succeeds and the nodes do not fill.
    let dir = cluster("log", &["--size", "8M", "--chunk", "64K", "--max-value", "1K"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--writers", "1", "--keys", "100", "--max-value", "1K"]);
    let value = |i: usize| format!("{i:05}{}", "w".repeat(995));
    let parts = (0..24).map(|p| (960 * p..960 * (p + 1)).map(|i| format!("put k {}\n", value(i))).collect::<String>());
    let out = shell_paced(d, parts.map(String::into_bytes).collect(), Duration::from_millis(150));
    let errors: Vec<&str> = out.lines().filter(|l| *l != "OK").collect();
    assert!(errors.is_empty(), "{} errors, the first {:?}", errors.len(), &errors[..errors.len().min(3)]);
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), format!("{}\n", value(24 * 960 - 1)));
    // `memnode stats` shows the log given back segment by segment: on each
    // node, segments in use and given back, with bytes free to spare.
    let stats = ok(&["memnode", "stats", "--dir", d]);
    let lines: Vec<&str> = stats.lines().collect();
    assert!(lines[0].starts_with("NODE") && lines.len() == 4, "{stats}");
    for (n, line) in lines[1..].iter().enumerate() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[..4], ["node", &n.to_string(), "8", "MiB"], "{line}");
        let (in_use, given_back, ids): (u64, u64, u64) = (
            cols[cols.len() - 3].parse().unwrap(),
            cols[cols.len() - 2].parse().unwrap(),
            cols[cols.len() - 1].parse().unwrap(),
        );
        assert!(in_use >= 1 && given_back >= 1 && in_use + given_back < 128 && ids == 1, "{line}");
        assert!(!line.contains("FREE") && !cols[cols.len() - 4].starts_with("(0.0%"), "no memory left: {line}");
    }

    // Every node without a free chunk: client id 1 goes on in its
    // segment and chunks; id 2 needs a new segment on the key's nodes.
    let dir = cluster("segment", &["--size", "64M"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--keys", "100"]);
    ok(&["kv", "--dir", d, "put", "k", "v"]);
    let mem = ShmCluster::open(&dir.0).unwrap().memory();
    for n in 0..3 {
        let mut region = block_on(Region::open(&mem, NodeId(n))).unwrap();
        while block_on(region.alloc_chunk(&mem)).is_ok() {}
    }
    assert_eq!(ok(&["kv", "--dir", d, "put", "k", "w"]), "OK\n");
    let e = fails(&["kv", "--dir", d, "--id", "2", "put", "k", "x"], 1);
    assert!(e.starts_with("error: put 'k': node ") && e.contains(" is full: 1 MiB needed, 1020 KiB free"), "{e}");
    assert_eq!(ok(&["kv", "--dir", d, "--id", "2", "get", "k"]), "w\n");
}

/// A store set up more than 407 days ago has run out of time: writes say
/// so, gets go on. A client whose clock was an hour ahead wrote a key: an
/// honest client's write after it says a clock is wrong.
#[test]
fn time_running_out_is_not_a_full_store() {
    let dir = cluster("time", &["--size", "64M"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--keys", "100"]);
    ok(&["kv", "--dir", d, "put", "k", "v"]);
    let start = epoch(&dir.0);
    set_epoch(&dir.0, start - 500 * 86_400_000_000);
    let e = fails(&["kv", "--dir", d, "put", "k2", "v"], 1);
    assert!(e.starts_with("error: put 'k2': timestamps are exhausted: time "), "{e}");
    assert!(e.contains("passed the limit of 2^45 ticks of 1000 ns (407 days after the store was set up)"), "{e}");
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), "v\n");

    set_epoch(&dir.0, start - 3_600_000_000);
    assert_eq!(ok(&["kv", "--dir", d, "put", "k", "from an hour ahead"]), "OK\n");
    set_epoch(&dir.0, start);
    // Id 1 goes on after its own times (its lease hands them on); id 2 is
    // a client whose clock is right.
    let e = fails(&["kv", "--dir", d, "--id", "2", "put", "k", "now"], 1);
    assert!(e.starts_with("error: put 'k': a write must follow time "), "{e}");
    assert!(e.contains("ms ahead of this client's clock") && e.contains("some client's clock is wrong"), "{e}");
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), "from an hour ahead\n");
}

/// The shell: a line that is not UTF-8 is an error and the shell goes on;
/// a value keeps its spaces at the end (and, in quotes, at either end).
#[test]
fn the_shell_keeps_spaces_and_survives_bad_bytes() {
    let dir = cluster("shell", &["--size", "64M"]);
    let d = dir.arg();
    ok(&["kv", "--dir", d, "init", "--keys", "100"]);
    let input =
        b"put a v  \nget a\nput b \xff\xfe x\nget b\nput c \"  q  \"\nget c\nput e \"\"x\"\"\r\nget e\r\nhelp\n";
    let out = shell(d, input);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..8],
        [
            "OK",
            "v  ",
            "error: the line is not UTF-8 text (byte 0xff at 7); nothing was done",
            "error: 'b' not found",
            "OK",
            "  q  ",
            "OK",
            "\"x\"",
        ],
        "{out}"
    );
    assert!(out.contains("kept as typed, spaces at its end included"), "{out}");
    assert_eq!(ok(&["kv", "--dir", d, "get", "a"]), "v  \n");
    assert_eq!(ok(&["kv", "--dir", d, "put", "f", " x "]), "OK\n");
    assert_eq!(ok(&["kv", "--dir", d, "get", "f"]), " x \n");
}
