//! Leased client ids across processes (issue #18): two processes that ask
//! for one id at once, an id whose holder was killed with SIGKILL, and a
//! shell that keeps its id while it waits for input.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{ShmDir, fails, ok};

/// A 3-node cluster of 48 MiB nodes with a SWARM-KV store whose leases
/// last `lease`.
fn store(tag: &str, lease: &str) -> ShmDir {
    store_of(tag, lease, "48M")
}

/// [`store`] on nodes of `size`.
fn store_of(tag: &str, lease: &str, size: &str) -> ShmDir {
    store_of_system(tag, "swarm-kv", lease, size)
}

/// [`store_of`], of `system`.
fn store_of_system(tag: &str, system: &str, lease: &str, size: &str) -> ShmDir {
    let (dir, _) = ShmDir::named(tag);
    ok(&["memnode", "create", "--dir", dir.arg(), "--nodes", "3", "--size", size]);
    ok(&["kv", "--dir", dir.arg(), "init", "--system", system, "--keys", "100", "--lease", lease]);
    dir
}

/// `swarm kv --id ID shell` on `dir`, its stdin and stdout piped.
fn shell(dir: &str, id: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["kv", "--dir", dir, "--id", id, "shell"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start swarm kv shell")
}

/// Sends `line` to a shell and returns the line it answers.
fn say(stdin: &mut ChildStdin, out: &mut impl BufRead, line: &str) -> String {
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
    let mut answer = String::new();
    out.read_line(&mut answer).unwrap();
    answer
}

/// Two shells started at once ask for id 5: exactly one holds it (its
/// writes work), the other stops with one line saying the id is held.
/// Then the holder quits, giving the id back, and a third process gets it
/// at once. Eight rounds, so that the claims really race.
#[test]
fn two_processes_asking_for_one_id_at_once_never_both_get_it() {
    let dir = store("race", "10s");
    let d = dir.arg();
    for round in 0..8 {
        let mut pair = [shell(d, "5"), shell(d, "5")];
        // The loser exits by itself; the winner waits for commands.
        let deadline = Instant::now() + Duration::from_secs(20);
        let loser = loop {
            if let Some(i) = pair.iter_mut().position(|c| c.try_wait().unwrap().is_some()) {
                break i;
            }
            assert!(Instant::now() < deadline, "round {round}: neither process gave up");
            thread::sleep(Duration::from_millis(10));
        };
        let lost = pair[loser].wait_with_output_ref();
        assert_eq!(lost.0, Some(1), "round {round}: the loser's exit status");
        assert!(
            lost.1.starts_with("error: cannot claim a client id: client id 5 is held by a live client (free in"),
            "round {round}: {}",
            lost.1
        );
        let winner = &mut pair[1 - loser];
        assert!(winner.try_wait().unwrap().is_none(), "round {round}: both processes stopped");
        let mut stdin = winner.stdin.take().unwrap();
        let mut out = BufReader::new(winner.stdout.take().unwrap());
        let value = format!("v{round}");
        assert_eq!(say(&mut stdin, &mut out, &format!("put k {value}")), "OK\n");
        assert_eq!(say(&mut stdin, &mut out, "get k"), format!("{value}\n"));
        drop(stdin);
        assert!(winner.wait().unwrap().success(), "round {round}: the holder quits cleanly");
        // Given back: the id is free at once.
        assert_eq!(ok(&["kv", "--dir", d, "--id", "5", "get", "k"]), format!("{value}\n"));
    }
}

/// A shell holding id 5 is killed with SIGKILL: the id stays held until
/// its lease (1 s) and the grace for clock skew (3 s) have passed, then it
/// is claimed again, and what the killed process acknowledged is there.
#[test]
fn a_killed_client_s_id_is_claimed_again_after_its_lease() {
    let dir = store("kill", "1s");
    let d = dir.arg();
    let mut holder = shell(d, "5");
    let mut stdin = holder.stdin.take().unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    assert_eq!(say(&mut stdin, &mut out, "put k acknowledged"), "OK\n");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let killed = Instant::now();
    let e = fails(&["kv", "--dir", d, "--id", "5", "get", "k"], 1);
    assert!(e.contains("client id 5 is held by a live client"), "{e}");
    // Any other id is free meanwhile.
    assert_eq!(ok(&["kv", "--dir", d, "get", "k"]), "acknowledged\n");
    let deadline = killed + Duration::from_secs(15);
    loop {
        let tried = common::swarm(&["kv", "--dir", d, "--id", "5", "put", "k", "after"]);
        if tried.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&tried.stderr);
        assert!(err.contains("is held by a live client"), "{err}");
        assert!(Instant::now() < deadline, "id 5 still held 15 s after its holder was killed");
        thread::sleep(Duration::from_millis(200));
    }
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_millis(2_500), "claimed again after only {waited:?}: before the grace");
    assert_eq!(ok(&["kv", "--dir", d, "--id", "5", "get", "k"]), "after\n");
}

/// A FUSEE shell holding id 5 is killed with SIGKILL after its writes:
/// the next process to claim id 5 (after the lease and grace) recovers
/// its log (FUSEE §5.3) and says what the walk and the redo took, and
/// what the killed process acknowledged is there.
#[test]
fn a_killed_fusee_client_s_log_is_recovered_by_the_next_holder() {
    let (dir, _) = ShmDir::named("fusee-kill");
    let d = dir.arg();
    ok(&["memnode", "create", "--dir", d, "--nodes", "3", "--size", "48M"]);
    ok(&["kv", "--dir", d, "init", "--system", "fusee", "--keys", "100", "--lease", "1s"]);
    let mut holder = shell(d, "5");
    let mut stdin = holder.stdin.take().unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    assert_eq!(say(&mut stdin, &mut out, "put k first"), "OK\n");
    assert_eq!(say(&mut stdin, &mut out, "get k"), "first\n");
    assert_eq!(say(&mut stdin, &mut out, "put k acknowledged"), "OK\n");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let err = loop {
        let tried = common::swarm(&["kv", "--dir", d, "--id", "5", "get", "k"]);
        let err = String::from_utf8_lossy(&tried.stderr).into_owned();
        if tried.status.success() {
            assert_eq!(String::from_utf8_lossy(&tried.stdout), "acknowledged\n");
            break err;
        }
        assert!(err.contains("is held by a live client"), "{err}");
        assert!(Instant::now() < deadline, "id 5 still held 15 s after its holder was killed");
        thread::sleep(Duration::from_millis(200));
    };
    assert!(err.contains("recovered the log of client id 5's crashed holder: walk"), "{err}");
    eprintln!("{err}");
    // Given back after the recovery: the next holder has nothing to recover.
    let again = common::swarm(&["kv", "--dir", d, "--id", "5", "get", "k"]);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("recovered"));
}

/// A shell that waits for input longer than its lease and grace keeps
/// its id (it renews while idle): another process cannot claim it, and the
/// shell's next write works.
#[test]
fn an_idle_shell_keeps_its_id() {
    let dir = store("idle", "1s");
    let d = dir.arg();
    let mut holder = shell(d, "5");
    let mut stdin = holder.stdin.take().unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    assert_eq!(say(&mut stdin, &mut out, "put k first"), "OK\n");
    thread::sleep(Duration::from_secs(6));
    let e = fails(&["kv", "--dir", d, "--id", "5", "get", "k"], 1);
    assert!(e.contains("client id 5 is held by a live client"), "{e}");
    assert_eq!(say(&mut stdin, &mut out, "put k second"), "OK\n");
    drop(stdin);
    assert!(holder.wait().unwrap().success());
    assert_eq!(ok(&["kv", "--dir", d, "--id", "5", "get", "k"]), "second\n");
}

/// More `swarm kv` processes at once than the store has ids (8): each
/// waits for an id to be given back, and every one succeeds. (Nodes of
/// 256 MiB: all 8 ids writing at once each take chunks of their own.)
#[test]
fn more_processes_than_ids_wait_their_turn() {
    let dir = store_of("crowd", "10s", "256M");
    let d = dir.arg().to_string();
    let puts: Vec<_> = (0..16)
        .map(|p| {
            let d = d.clone();
            thread::spawn(move || {
                for i in 0..5 {
                    let (k, v) = (format!("k{p}-{i}"), format!("v{p}-{i}"));
                    assert_eq!(ok(&["kv", "--dir", &d, "put", &k, &v]), "OK\n");
                }
            })
        })
        .collect();
    for p in puts {
        p.join().unwrap();
    }
    for p in 0..16 {
        assert_eq!(ok(&["kv", "--dir", &d, "get", &format!("k{p}-4")]), format!("v{p}-4\n"));
    }
}

/// `wait_with_output` for a child kept in an array: its exit code and the
/// first line of its stderr.
trait WaitRef {
    fn wait_with_output_ref(&mut self) -> (Option<i32>, String);
}

impl WaitRef for Child {
    fn wait_with_output_ref(&mut self) -> (Option<i32>, String) {
        let status = self.wait().unwrap();
        let mut err = String::new();
        BufReader::new(self.stderr.take().unwrap()).read_line(&mut err).unwrap();
        (status.code(), err)
    }
}

/// Sends `line` to a shell and returns its answer, skipping the lines it
/// printed meanwhile about its id (a shell whose lease lapsed says so when
/// it next tries to keep it).
fn answer(stdin: &mut ChildStdin, out: &mut impl BufRead, line: &str) -> String {
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
    loop {
        let mut answer = String::new();
        out.read_line(&mut answer).unwrap();
        if !answer.starts_with("error: cannot keep the client id") {
            return answer;
        }
    }
}

/// A SWARM-KV shell holding id 5 is stopped with SIGSTOP past its lease;
/// a second process claims id 5, overwrites every key, and recycles what
/// the first left in its log (moving on into the same segments). The
/// first is then continued: its writes fail with a lease error, and
/// nothing it does corrupts the memory the second recycled: every key
/// reads the second's values.
#[test]
fn a_client_stopped_past_its_lease_fails_cleanly_and_corrupts_nothing() {
    stopped_past_its_lease("sigstop", "swarm-kv", false);
}

/// The same in the stores whose clients call a server process (pDPM-Central's
/// coordinator, Clover's metadata server) on a channel of their id: the
/// continued client is told its id was lost, rather than calling on the
/// channel its id's next holder now uses (and waiting for answers that
/// never come).
#[test]
fn a_client_of_a_server_stopped_past_its_lease_fails_cleanly() {
    for system in ["pdpm-central", "clover"] {
        stopped_past_its_lease(&format!("sigstop-{system}"), system, false);
    }
}

/// The same, with the second process gone (its id given back) before the
/// first is continued: the id is free, and the first must not take it
/// back with what it knew before its stop (its log's cursor and times,
/// stale since the second used the id). All its writes fail, not only
/// the first.
#[test]
fn a_client_stopped_past_its_lease_stays_out_after_the_next_holder_leaves() {
    stopped_past_its_lease("sigstop-left", "swarm-kv", true);
}

fn stopped_past_its_lease(tag: &str, system: &str, second_leaves: bool) {
    let dir = store_of_system(tag, system, "1s", "48M");
    let d = dir.arg();
    let mut server = (system != "swarm-kv").then(|| Server(Some(common::start_server(d, "0").0)));
    let mut first = shell(d, "5");
    let mut stdin = first.stdin.take().unwrap();
    let mut out = BufReader::new(first.stdout.take().unwrap());
    for k in 0..40 {
        assert_eq!(say(&mut stdin, &mut out, &format!("put k{k} first-{k}")), "OK\n");
    }
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &first.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {sig}");
    };
    signal("-STOP");
    let stopped = Instant::now();
    // The second holder of id 5, once the lease and the grace are over.
    let mut second = loop {
        let mut child = shell(d, "5");
        thread::sleep(Duration::from_millis(300));
        match child.try_wait().unwrap() {
            None => break child,
            Some(_) => {
                let (_, err) = child.wait_with_output_ref();
                assert!(err.contains("is held by a live client"), "{err}");
                assert!(stopped.elapsed() < Duration::from_secs(15), "id 5 still held 15 s after its holder stopped");
            }
        }
    };
    let mut stdin2 = second.stdin.take().unwrap();
    let mut out2 = BufReader::new(second.stdout.take().unwrap());
    for round in 0..3 {
        for k in 0..40 {
            assert_eq!(answer(&mut stdin2, &mut out2, &format!("put k{k} second-{round}-{k}")), "OK\n");
        }
        // Idle for a while: the shell keeps its id and recycles its log
        // (and what the first holder left in it).
        thread::sleep(Duration::from_millis(700));
    }
    // The second gives id 5 back as it ends.
    let mut end_second = Some(move || {
        drop(stdin2);
        assert!(second.wait().unwrap().success());
    });
    if second_leaves {
        end_second.take().unwrap()();
    }
    signal("-CONT");
    // A get: pDPM-Central's calls on the id's channel, and is refused;
    // the others' (Clover's at a cached chain's tail) use nothing the id
    // names, and read what is there (or meet the lease in a write-back).
    let got = answer(&mut stdin, &mut out, "get k0");
    let refused = got.starts_with("error:") && got.contains("lease");
    let calls = system == "pdpm-central";
    assert!(refused || (!calls && got == "second-2-0\n"), "{system}: the stopped holder's get answered {got:?}");
    for k in 0..40 {
        let got = answer(&mut stdin, &mut out, &format!("put k{k} late-{k}"));
        assert!(
            got.starts_with("error:") && got.contains("lease"),
            "{system}: the stopped holder's put answered {got:?}"
        );
    }
    drop(stdin);
    let _ = first.wait();
    if let Some(end) = end_second {
        end();
    }
    for k in 0..40 {
        assert_eq!(ok(&["kv", "--dir", d, "get", &format!("k{k}")]), format!("second-2-{k}\n"), "key k{k}");
    }
    if let Some(server) = server.as_mut().and_then(|s| s.0.take()) {
        common::signal(&server, "TERM");
        assert!(server.wait_with_output().unwrap().status.success(), "{system}'s server");
    }
}

/// A server process that is killed when dropped: a test that fails
/// leaves none running (polling a cluster that is gone).
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
