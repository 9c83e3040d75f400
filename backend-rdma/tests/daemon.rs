//! The memory-node daemon's bootstrap server against whatever can reach its
//! port: random bytes, truncated frames, wrong versions, huge lengths,
//! silent and stalled connections. Each is rejected (with a reason, where
//! the peer can still hear one), and the daemon goes on serving good
//! clients, during and after. The acceptor here needs no hardware: it hands
//! out queue-pair numbers and counts live connections.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use swarm_backend_rdma::bootstrap::{Endpoint, HEADER, Hello, MAGIC, MAX_BODY, Message, VERSION};
use swarm_backend_rdma::daemon::{Acceptor, ServeOptions, Served, greet, serve};

/// Hands out queue pairs that are only numbers; refuses label "refuse me".
#[derive(Default)]
struct Fake {
    next_qpn: AtomicU32,
    live: Arc<AtomicUsize>,
}

struct FakeQp(Arc<AtomicUsize>);

impl Drop for FakeQp {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Acceptor for Fake {
    type Conn = FakeQp;

    fn accept(&self, hello: &Hello) -> Result<(swarm_backend_rdma::bootstrap::Welcome, FakeQp), String> {
        if hello.label == "refuse me" {
            return Err("refused as asked".into());
        }
        self.live.fetch_add(1, SeqCst);
        let qpn = 0x100 + self.next_qpn.fetch_add(1, SeqCst);
        let endpoint = Endpoint { lid: 1, qpn, psn: 7, ..Endpoint::default() };
        Ok((
            swarm_backend_rdma::bootstrap::Welcome { endpoint, addr: 1 << 40, rkey: 42, size: 1 << 20 },
            FakeQp(self.live.clone()),
        ))
    }
}

/// A daemon on a free loopback port, served by a background thread.
struct Daemon {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<Served>>,
}

impl Daemon {
    fn start(opts: ServeOptions) -> Daemon {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let fake = Fake::default();
        let live = fake.live.clone();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stop2, log2) = (stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            serve(&listener, &fake, &opts, &stop2, &|line: &str| log2.lock().unwrap().push(line.to_owned())).unwrap()
        });
        Daemon { addr, stop, live, log, thread: Some(thread) }
    }

    fn quick() -> Daemon {
        Daemon::start(ServeOptions {
            hello_timeout: Duration::from_millis(300),
            max_clients: 64,
            tick: Duration::from_millis(5),
        })
    }

    fn stop(mut self) -> Served {
        self.stop.store(true, SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

fn hello(label: &str) -> Hello {
    Hello { endpoint: Endpoint { lid: 2, qpn: 0x77, psn: 9, gid: [1; 16], ..Endpoint::default() }, label: label.into() }
}

/// A good client: connects, is welcomed, and keeps its connection.
fn good_client(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    let w = greet(&s, hello("good"), Duration::from_secs(5)).expect("a good client is welcomed");
    assert_eq!((w.rkey, w.size), (42, 1 << 20));
    s
}

/// Sends `bytes` (then half-closes if `close`), and returns what the daemon
/// answered before closing its end: a reject's reason, or `None` if it sent
/// nothing decodable.
fn send_raw(addr: SocketAddr, bytes: &[u8], close: bool) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    if close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    match Message::decode(&answer) {
        Ok(Message::Reject(r)) => Some(r.reason),
        Ok(other) => panic!("answered {other:?} to {bytes:02x?}"),
        Err(_) => None,
    }
}

fn frame(version: u16, kind: u8, len: u32, body: &[u8]) -> Vec<u8> {
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(&[kind, 0]);
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(body);
    f
}

#[test]
fn a_good_client_is_welcomed_and_its_queue_pair_lives_as_long_as_its_connection() {
    let d = Daemon::quick();
    let s = good_client(d.addr);
    assert_eq!(d.live.load(SeqCst), 1);
    drop(s);
    // The daemon tears the queue pair down, then logs why: wait for both.
    let t = Instant::now();
    while d.live.load(SeqCst) > 0 || !d.logged("closed by the client") {
        assert!(t.elapsed() < Duration::from_secs(5), "the queue pair outlived its client, or nothing said why");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(d.logged("connected"));
    assert_eq!(d.stop(), Served { accepted: 1, rejected: 0 });
}

#[test]
fn malformed_bootstraps_are_rejected_and_the_daemon_keeps_serving() {
    let d = Daemon::quick();
    let hello_frame = Message::Hello(hello("x")).encode();
    let cases: Vec<(&str, Vec<u8>, bool, Option<&str>)> = vec![
        ("an HTTP request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), true, Some("not a SWARM")),
        ("a version from the future", frame(VERSION + 1, 1, 0, &[]), true, Some("version 3")),
        ("the last version", frame(VERSION - 1, 1, 0, &[]), true, Some("version 1")),
        ("version 0", frame(0, 1, 0, &[]), true, Some("version 0")),
        ("an unknown kind", frame(VERSION, 9, 0, &[]), true, Some("kind 9")),
        ("a huge length", frame(VERSION, 1, u32::MAX, &[]), true, Some("longer than the limit")),
        (
            "a length just over the limit",
            frame(VERSION, 1, MAX_BODY as u32 + 1, &[0; 64]),
            true,
            Some("longer than the limit"),
        ),
        ("a body too short for a hello", frame(VERSION, 1, 4, &[0; 4]), true, Some("not 30")),
        (
            "a welcome sent by a client",
            Message::Welcome(swarm_backend_rdma::bootstrap::Welcome {
                endpoint: Endpoint::default(),
                addr: 0,
                rkey: 0,
                size: 1,
            })
            .encode(),
            true,
            Some("expected a hello"),
        ),
        ("a header cut short", hello_frame[..HEADER - 3].to_vec(), true, Some("truncated")),
        ("a body cut short", hello_frame[..hello_frame.len() - 2].to_vec(), true, Some("truncated")),
        ("nothing at all", Vec::new(), true, Some("truncated")),
        ("an acceptor's refusal", Message::Hello(hello("refuse me")).encode(), true, Some("refused as asked")),
        // Silent after a partial frame: the hello time-out ends it.
        ("a stalled half frame", hello_frame[..5].to_vec(), false, Some("no hello within")),
    ];
    let malformed = cases.len();
    for (what, bytes, close, want) in cases {
        // A good client before, during and after each bad one.
        let before = good_client(d.addr);
        let answer = send_raw(d.addr, &bytes, close);
        match (want, &answer) {
            (Some(w), Some(got)) => assert!(got.contains(w), "{what}: reason {got:?} does not say {w:?}"),
            (w, got) => assert_eq!(w.map(str::to_owned), got.clone(), "{what}"),
        }
        let after = good_client(d.addr);
        drop((before, after));
    }
    // Random bytes, not even a frame.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20 {
        let junk: Vec<u8> = (0..(x % 300) as usize)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        send_raw(d.addr, &junk, true);
        drop(good_client(d.addr));
    }
    // A client that sends more after its hello loses its queue pair.
    let mut chatty = good_client(d.addr);
    chatty.write_all(b"more").unwrap();
    let mut rest = Vec::new();
    let _ = chatty.read_to_end(&mut rest);
    let t = Instant::now();
    while !d.logged("sent bytes after its hello") {
        assert!(t.elapsed() < Duration::from_secs(5), "the chatty client kept its queue pair");
        std::thread::sleep(Duration::from_millis(5));
    }
    let served = d.stop();
    assert_eq!(served.rejected, malformed + 20, "{served:?}");
    assert_eq!(served.accepted, 2 * malformed + 20 + 1);
}

#[test]
fn a_stalled_client_does_not_hold_up_the_others() {
    let d = Daemon::start(ServeOptions {
        hello_timeout: Duration::from_secs(10),
        max_clients: 64,
        tick: Duration::from_millis(5),
    });
    let stalled: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(d.addr).unwrap()).collect();
    let t = Instant::now();
    drop(good_client(d.addr));
    assert!(t.elapsed() < Duration::from_secs(5), "a good client waited behind stalled ones");
    drop(stalled);
    d.stop();
}

#[test]
fn clients_beyond_the_limit_are_told_so() {
    let d = Daemon::start(ServeOptions {
        hello_timeout: Duration::from_secs(5),
        max_clients: 2,
        tick: Duration::from_millis(5),
    });
    let (a, b) = (good_client(d.addr), good_client(d.addr));
    let s = TcpStream::connect(d.addr).unwrap();
    let e = greet(&s, hello("third"), Duration::from_secs(5)).unwrap_err();
    assert!(e.contains("too many clients"), "{e}");
    drop((a, b));
    let t = Instant::now();
    while d.live.load(SeqCst) > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Room again once they left: the daemon counts a client out when its
    // connection thread ends, which a loaded machine may delay.
    loop {
        let s = TcpStream::connect(d.addr).unwrap();
        match greet(&s, hello("again"), Duration::from_secs(5)) {
            Ok(_) => break,
            Err(e) if e.contains("too many clients") && t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("a client after the others left was refused: {e}"),
        }
    }
    d.stop();
}

#[test]
fn stopping_tears_down_every_queue_pair() {
    let d = Daemon::quick();
    let clients: Vec<TcpStream> = (0..4).map(|_| good_client(d.addr)).collect();
    assert_eq!(d.live.load(SeqCst), 4);
    let live = d.live.clone();
    let served = d.stop();
    assert_eq!((served.accepted, live.load(SeqCst)), (4, 0));
    drop(clients);
}

#[test]
fn greet_explains_a_daemon_that_is_not_one() {
    // Something that answers garbage, then closes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let s = TcpStream::connect(addr).unwrap();
    let e = greet(&s, hello("c"), Duration::from_secs(5)).unwrap_err();
    assert!(e.contains("not a SWARM bootstrap frame"), "{e}");
    t.join().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Any frame cut anywhere, or with any one byte changed, is answered
    /// (welcome or reject) or dropped, and a good client is served next.
    #[test]
    fn mangled_hellos_never_stop_the_daemon(cut in 0usize..60, flip in 0usize..60, bits in 1u8..=255) {
        static DAEMON: std::sync::OnceLock<(SocketAddr, Arc<AtomicBool>)> = std::sync::OnceLock::new();
        let (addr, _) = DAEMON.get_or_init(|| {
            let d = Daemon::quick();
            let out = (d.addr, d.stop.clone());
            std::mem::forget(d); // lives for the rest of the test binary
            out
        });
        let mut f = Message::Hello(hello("mangled")).encode();
        if flip < f.len() {
            f[flip] ^= bits;
        }
        f.truncate(cut.max(1));
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(&f);
        let _ = s.shutdown(Shutdown::Write);
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        prop_assert!(answer.is_empty() || Message::decode(&answer).is_ok(), "garbled answer {:02x?}", answer);
        drop(good_client(*addr));
    }
}
