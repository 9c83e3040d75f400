//! The memory-node daemon's bootstrap server: accepts clients over TCP,
//! makes a queue pair for each, and tears it down when the client leaves.
//!
//! The server is generic over an [`Acceptor`], the part that owns the
//! verbs (the real one registers the region and creates queue pairs; tests
//! use one without hardware), so everything about the network side, which
//! faces whoever can reach the port, runs in CI: malformed, truncated and
//! stalled bootstraps are rejected, and none of them stops the server from
//! serving the next client.
//!
//! One thread per connection. A connection's life:
//! 1. read one [`Hello`] frame within [`ServeOptions::hello_timeout`];
//! 2. ask the acceptor for a queue pair connected to the client's endpoint;
//! 3. answer [`Welcome`] (or [`Reject`] with the reason, and close);
//! 4. hold the queue pair until the client closes the connection, sends
//!    anything more, or the daemon is stopped; then drop it.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use crate::bootstrap::{BootError, Hello, Message, Reject, Welcome};

/// What makes a queue pair for a client: the verbs side of a daemon.
pub trait Acceptor: Sync {
    /// What keeps a client's queue pair alive; dropped when it leaves.
    type Conn: Send;

    /// Makes a queue pair connected to `hello`'s endpoint and says how to
    /// reach it and the region, or why not (in words for the client).
    fn accept(&self, hello: &Hello) -> Result<(Welcome, Self::Conn), String>;
}

/// How a daemon serves.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// How long a new connection may take to send its hello.
    pub hello_timeout: Duration,
    /// Clients served at once; more are rejected.
    pub max_clients: usize,
    /// How often idle threads look at the stop flag.
    pub tick: Duration,
}

impl Default for ServeOptions {
    /// 5 s for a hello, 1024 clients, a 50 ms tick.
    fn default() -> Self {
        ServeOptions { hello_timeout: Duration::from_secs(5), max_clients: 1024, tick: Duration::from_millis(50) }
    }
}

/// What a daemon did, when it stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Clients welcomed.
    pub accepted: usize,
    /// Connections refused (bad frames, acceptor errors, too many clients).
    pub rejected: usize,
}

struct Counters {
    accepted: AtomicUsize,
    rejected: AtomicUsize,
    live: AtomicUsize,
}

/// Serves clients on `listener` until `stop` is set, then waits for every
/// connection thread to drop its queue pair. `log` gets one line per
/// connection event (who connected or was rejected, and why).
pub fn serve<A: Acceptor>(
    listener: &TcpListener,
    acceptor: &A,
    opts: &ServeOptions,
    stop: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) -> io::Result<Served> {
    listener.set_nonblocking(true)?;
    let counters = Counters { accepted: AtomicUsize::new(0), rejected: AtomicUsize::new(0), live: AtomicUsize::new(0) };
    std::thread::scope(|s| -> io::Result<()> {
        while !stop.load(SeqCst) {
            let (stream, peer) = match listener.accept() {
                Ok(conn) => conn,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(opts.tick);
                    continue;
                }
                // A connection that was reset before it was accepted, or a
                // transient lack of descriptors, is not the daemon's end.
                Err(e) if transient(&e) => {
                    log(&format!("accept failed: {e}"));
                    std::thread::sleep(opts.tick);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if counters.live.fetch_add(1, SeqCst) >= opts.max_clients {
                counters.live.fetch_sub(1, SeqCst);
                counters.rejected.fetch_add(1, Relaxed);
                let why = format!("too many clients (this daemon serves {})", opts.max_clients);
                log(&format!("rejected {peer}: {why}"));
                // Inline, bounded by the tick: take the hello if it is
                // already there, so that closing does not reset the
                // connection before the client has read why.
                if stream.set_nonblocking(false).and_then(|()| stream.set_read_timeout(Some(opts.tick))).is_ok() {
                    let _ = Message::read_from(&mut &stream);
                }
                refuse(&stream, why, opts.tick);
                continue;
            }
            let counters = &counters;
            s.spawn(move || {
                connection(stream, peer, acceptor, opts, stop, log, counters);
                counters.live.fetch_sub(1, SeqCst);
            });
        }
        Ok(())
    })?;
    Ok(Served { accepted: counters.accepted.into_inner(), rejected: counters.rejected.into_inner() })
}

fn transient(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | OutOfMemory)
        || matches!(e.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}

fn connection<A: Acceptor>(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: &A,
    opts: &ServeOptions,
    stop: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
    counters: &Counters,
) {
    let reject = |stream: &TcpStream, why: String| {
        counters.rejected.fetch_add(1, Relaxed);
        log(&format!("rejected {peer}: {why}"));
        refuse(stream, why, opts.tick);
    };
    if let Err(e) = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(opts.hello_timeout)))
        .and_then(|()| stream.set_write_timeout(Some(opts.hello_timeout)))
    {
        return reject(&stream, format!("cannot set up the connection: {e}"));
    }
    let hello = match Message::read_from(&mut &stream) {
        Ok(Message::Hello(h)) => h,
        Ok(other) => return reject(&stream, format!("expected a hello, got {}", kind_name(&other))),
        Err(BootError::Io(io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)) => {
            return reject(&stream, format!("no hello within {:?}", opts.hello_timeout));
        }
        Err(e) => return reject(&stream, e.to_string()),
    };
    let (welcome, conn) = match acceptor.accept(&hello) {
        Ok(ok) => ok,
        Err(why) => return reject(&stream, why),
    };
    if let Err(e) = Message::Welcome(welcome).write_to(&mut &stream) {
        counters.rejected.fetch_add(1, Relaxed);
        log(&format!("lost {peer} ({}) before it was welcomed: {e}", hello.label));
        return;
    }
    counters.accepted.fetch_add(1, Relaxed);
    log(&format!(
        "connected {peer} ({}): client qpn {:#x}, daemon qpn {:#x}",
        hello.label, hello.endpoint.qpn, welcome.endpoint.qpn
    ));
    let why = hold(&stream, opts, stop);
    drop(conn);
    log(&format!("disconnected {peer} ({}): {why}", hello.label));
}

/// Tells the client why it is refused (best effort: it may not listen),
/// then closes gracefully: our side first, then up to a tick draining what
/// the client still sends, since closing with unread input would reset the
/// connection and could destroy the answer before the client reads it.
fn refuse(stream: &TcpStream, reason: String, tick: Duration) {
    let _ = stream.set_write_timeout(Some(tick));
    let _ = Message::Reject(Reject { reason }).write_to(&mut &*stream);
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(tick));
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match (&mut &*stream).read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// Waits until the client leaves (or misbehaves) or the daemon stops.
fn hold(stream: &TcpStream, opts: &ServeOptions, stop: &AtomicBool) -> String {
    if let Err(e) = stream.set_read_timeout(Some(opts.tick)) {
        return format!("cannot watch the connection: {e}");
    }
    let mut byte = [0u8; 1];
    loop {
        if stop.load(SeqCst) {
            let _ = stream.shutdown(Shutdown::Both);
            return "the daemon is stopping".into();
        }
        match (&mut &*stream).read(&mut byte) {
            Ok(0) => return "closed by the client".into(),
            Ok(_) => {
                let _ = stream.shutdown(Shutdown::Both);
                return "the client sent bytes after its hello (closed)".into();
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return format!("connection error: {e}"),
        }
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "a hello",
        Message::Welcome(_) => "a welcome",
        Message::Reject(_) => "a reject",
    }
}

/// The client side of the exchange: sends `hello` on `stream` and waits
/// (up to `timeout`) for the answer. The stream must stay open for as long
/// as the queue pair is used.
pub fn greet(stream: &TcpStream, hello: Hello, timeout: Duration) -> Result<Welcome, String> {
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("cannot set up the connection: {e}"))?;
    Message::Hello(hello).write_to(&mut &*stream).map_err(|e| format!("cannot send the hello: {e}"))?;
    match Message::read_from(&mut &*stream) {
        Ok(Message::Welcome(w)) => Ok(w),
        Ok(Message::Reject(r)) => Err(format!("the memory node refused: {}", r.reason)),
        Ok(other) => Err(format!("the memory node answered with {}", kind_name(&other))),
        Err(e) => Err(format!("no answer from the memory node: {e}")),
    }
}
