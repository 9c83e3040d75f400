//! A server beside a memory node: a task that polls its channels and
//! answers each request with a [`Service`], the thin shell's loop being
//! [`Server::run`].
//!
//! ```text
//! start:  open or make the node's server area; begin a new incarnation
//! pass:   read the state word and every channel's generation   (local)
//!         superseded by a newer incarnation? stop
//!         for each connected channel:
//!           a new generation? the channel starts over
//!           a request waiting? serve it, post the answer (background)
//! ```
//!
//! The server's reads of its own area are [`Memory::read_inbox`] (local to
//! it); its answers are posted without waiting, so that one slow client
//! never holds up the others, and a client whose ring is full is skipped
//! (counted in [`Stats::dropped`]): it times out and reconnects. The
//! service's memory operations for a request are counted and sent back
//! with the answer (`Memory::note_served` on the client's side).
//!
//! The same loop runs as a thread beside the clients, as a process of its
//! own (`swarm serve`), and as a task of the simulator; what differs is the
//! [`Shell`]: when to stop, and how to wait when there is nothing to do.

use alloc::vec::Vec;
use core::future::Future;

use crate::substrate::rtt::Counted;
use crate::{Memory, NodeId, RemoteAddr};

use super::MsgError;
use super::area::{Area, Geometry, State};
use super::ring::{Consumer, Link, Producer};
use super::rpc::{Status, method, parse_request, response_header};

/// Bytes the server reads at once when polling a request ring.
const WINDOW: u64 = 256;

/// A request, as a service sees it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The client's channel (its id).
    pub client: u16,
    /// The method.
    pub method: u16,
    /// The body.
    pub body: &'a [u8],
    /// The incarnation serving it (`None`: a service driven outside a
    /// server, as tests do, which takes itself as current).
    pub incarnation: Option<Incarnation>,
}

/// An incarnation of a server: a service that must not act once a newer
/// one took over (it was paused, and came back) reads its area's state
/// word, locally, where it needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// The area's state word.
    pub word: RemoteAddr,
    /// What the word holds while this incarnation runs.
    pub running: u64,
}

/// What a server serves, beyond [`method::PING`], [`method::STATS`] and
/// [`method::SERVICE`]:
/// a system's server role (an allocator, a coordinator, a metadata server).
pub trait Service {
    /// What it is, for reports.
    fn name(&self) -> &'static str;

    /// Serves `req` (its method is [`method::FIRST_SERVICE`] or above):
    /// writes the answer's body into `out` (at most `max` bytes) and says
    /// how it went. `mem` reaches every node, the server's own included;
    /// what it does there is counted and reported to the client.
    fn handle<M: Memory>(
        &mut self,
        mem: &M,
        req: Request<'_>,
        out: &mut Vec<u8>,
        max: usize,
    ) -> impl Future<Output = Status>;

    /// Work left over from earlier requests, done between passes over the
    /// channels, after their answers were sent: whether it did any (the
    /// loop does not nap then). Nothing by default.
    fn background<M: Memory>(&mut self, mem: &M) -> impl Future<Output = bool> {
        let _ = mem;
        async { false }
    }
}

/// The service of a server with nothing to serve but the built-in methods.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bare;

impl Service for Bare {
    fn name(&self) -> &'static str {
        "bare"
    }

    async fn handle<M: Memory>(&mut self, _: &M, _: Request<'_>, _: &mut Vec<u8>, _: usize) -> Status {
        Status::NoSuchMethod
    }
}

/// What the loop needs from its shell.
pub trait Shell {
    /// Whether to stop now.
    fn stopped(&self) -> bool;

    /// Waits a little: nothing came in the last `idle` passes (0 after a
    /// pass that served something).
    fn idle(&self, idle: u32) -> impl Future<Output = ()>;

    /// The server's area exists and clients may call from now on (a shell
    /// that announces the server does it here, not before).
    fn started(&self) {}
}

/// A server's counters (method [`method::STATS`] answers them, in this
/// order, as little-endian words).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests served (any status).
    pub served: u64,
    /// Of which refused (no such method, bad request, failed).
    pub refused: u64,
    /// Answers not sent: the client's ring was full.
    pub dropped: u64,
    /// Channels that started over (a client connected or reconnected).
    pub resets: u64,
    /// Passes over the channels.
    pub passes: u64,
}

impl Stats {
    const WORDS: usize = 5;

    /// As [`method::STATS`] answers them.
    pub fn encode(&self) -> [u8; 8 * Self::WORDS] {
        let mut b = [0u8; 8 * Self::WORDS];
        for (i, w) in [self.served, self.refused, self.dropped, self.resets, self.passes].into_iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Reads what [`Stats::encode`] wrote; `None` if it is not that.
    pub fn decode(b: &[u8]) -> Option<Stats> {
        let w = |i: usize| crate::substrate::memory::word_at(b, 8 * i);
        Some(Stats { served: w(0)?, refused: w(1)?, dropped: w(2)?, resets: w(3)?, passes: w(4)? })
    }
}

/// One channel as the server knows it.
struct Slot {
    generation: u16,
    req: Consumer,
    resp: Producer,
}

/// A server beside the memory node of its area.
pub struct Server<M, S> {
    mem: Counted<M>,
    area: Area,
    epoch: u16,
    slots: Vec<Option<Slot>>,
    service: S,
    stats: Stats,
    out: Vec<u8>,
}

impl<M: Memory, S: Service> Server<M, S> {
    /// Starts a server beside `node`: opens its area (or makes one of shape
    /// `geo`) and begins a new incarnation, which supersedes any previous
    /// one.
    pub async fn start(mem: M, node: NodeId, geo: Geometry, service: S) -> Result<Self, MsgError> {
        let area = Area::open_or_create(&mem, node, geo).await?;
        let epoch = area.begin(&mem).await?;
        let slots = (0..area.geo.channels).map(|_| None).collect();
        Ok(Server { mem: Counted::new(mem), area, epoch, slots, service, stats: Stats::default(), out: Vec::new() })
    }

    /// Its area.
    pub fn area(&self) -> Area {
        self.area
    }

    /// Its incarnation.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Its counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// One pass over the channels: the number of requests served, or
    /// [`MsgError::Superseded`] if a newer incarnation took over.
    pub async fn poll(&mut self) -> Result<usize, MsgError> {
        self.stats.passes += 1;
        let (at, len) = self.area.control_span();
        let control = self.mem.inner().read_inbox(at, len).await?;
        let (state, conns) = self.area.decode_control(&control);
        if state != State::Running(self.epoch) {
            return Err(MsgError::Superseded);
        }
        let mut served = 0;
        for (c, generation) in conns.enumerate() {
            let c = c as u16;
            let slot = &mut self.slots[c as usize];
            if generation == 0 {
                *slot = None;
                continue;
            }
            if slot.as_ref().is_none_or(|s| s.generation != generation) {
                let link = Link { epoch: self.epoch, generation };
                *slot = Some(Slot {
                    generation,
                    req: Consumer::new(self.area.request_ring(c), link),
                    resp: Producer::new(self.area.response_ring(c), link),
                });
                self.stats.resets += 1;
            }
            served += self.serve_one(c).await? as usize;
        }
        Ok(served)
    }

    /// Serves the next request of channel `c`, if one came.
    async fn serve_one(&mut self, c: u16) -> Result<bool, MsgError> {
        let Some(slot) = self.slots[c as usize].as_mut() else { return Ok(false) };
        let msg = match slot.req.poll(self.mem.inner(), WINDOW).await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        slot.req.publish(self.mem.inner());
        let max = self.area.geo.max_message() as usize - super::rpc::RESPONSE_HEADER;
        self.out.clear();
        self.mem.reset();
        let status = match parse_request(msg.payload()) {
            None => Status::BadRequest,
            Some((method::PING, body)) if body.len() <= max => {
                self.out.extend_from_slice(body);
                Status::Ok
            }
            Some((method::PING, _)) => Status::BadRequest,
            Some((method::STATS, _)) => {
                self.out.extend_from_slice(&self.stats.encode());
                Status::Ok
            }
            Some((method::SERVICE, _)) => {
                self.out.extend_from_slice(self.service.name().as_bytes());
                Status::Ok
            }
            Some((m, _)) if m < method::FIRST_SERVICE => Status::NoSuchMethod,
            Some((method, body)) => {
                let incarnation =
                    Incarnation { word: self.area.state_word(), running: State::Running(self.epoch).encode() };
                let req = Request { client: c, method, body, incarnation: Some(incarnation) };
                let status = self.service.handle(&self.mem, req, &mut self.out, max).await;
                if self.out.len() > max {
                    self.out.clear();
                    Status::Failed
                } else {
                    status
                }
            }
        };
        let ops = self.mem.ops();
        self.stats.served += 1;
        self.stats.refused += (status != Status::Ok) as u64;
        let header = response_header(msg.seq, status, ops);
        let Some(slot) = self.slots[c as usize].as_mut() else { return Ok(true) };
        match slot.resp.post(self.mem.inner(), &[&header, &self.out]).await {
            Ok(()) => {}
            Err(super::ring::RingError::Full | super::ring::RingError::Corrupt(_)) => self.stats.dropped += 1,
            Err(e) => return Err(e.into()),
        }
        Ok(true)
    }

    /// Serves until `shell` says stop, then ends the incarnation cleanly
    /// (clients are told the server stopped). Ends with an error if the
    /// node cannot be reached or a newer incarnation took over.
    pub async fn run<H: Shell>(&mut self, shell: &H) -> Result<(), MsgError> {
        let mut idle = 0u32;
        while !shell.stopped() {
            let served = self.poll().await?;
            self.mem.reset();
            let worked = self.service.background(&self.mem).await;
            if served > 0 || worked {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
            }
            shell.idle(idle).await;
        }
        self.area.end(self.mem.inner(), self.epoch).await
    }
}

/// Serves `service` beside `node` until `shell` says stop: [`Server::start`]
/// then [`Server::run`].
pub async fn serve<M: Memory, S: Service, H: Shell>(
    mem: M,
    node: NodeId,
    geo: Geometry,
    service: S,
    shell: &H,
) -> Result<Stats, MsgError> {
    let mut server = Server::start(mem, node, geo, service).await?;
    shell.started();
    server.run(shell).await?;
    Ok(server.stats())
}

/// The shell of a server on an OS thread: stops when its flag is set;
/// spins while requests keep coming, then yields the CPU, then sleeps in
/// short naps (a server shares the machine with its clients).
#[cfg(feature = "std")]
pub struct ThreadShell {
    stop: alloc::sync::Arc<core::sync::atomic::AtomicBool>,
}

#[cfg(feature = "std")]
impl ThreadShell {
    /// A shell that stops when `stop` is set.
    pub fn new(stop: alloc::sync::Arc<core::sync::atomic::AtomicBool>) -> Self {
        ThreadShell { stop }
    }
}

#[cfg(feature = "std")]
impl Shell for ThreadShell {
    fn stopped(&self) -> bool {
        self.stop.load(core::sync::atomic::Ordering::Relaxed)
    }

    async fn idle(&self, idle: u32) {
        match idle {
            0..64 => core::hint::spin_loop(),
            64..4096 => std::thread::yield_now(),
            _ => std::thread::sleep(core::time::Duration::from_micros(20)),
        }
    }
}
