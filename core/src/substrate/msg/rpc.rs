//! Requests and responses on a channel of a server area.
//!
//! ```text
//! request   method (2) | 0 (2) | 0 (4), body
//! response  request's sequence number (4) | status (2) | 0 (2)
//!           | server's memory operations for it (4) | 0 (4), body
//! ```
//!
//! A request's id is its sequence number on the channel's request ring;
//! the response names it, so a late answer to a request that timed out is
//! recognised and skipped. A client has one request outstanding at a time
//! per channel (as it has one operation at a time per client id).
//!
//! A call writes its request (one WRITE, counted as the call's roundtrip)
//! and polls its response ring ([`Memory::read_inbox`], not counted) until
//! the answer or the deadline. After a call that timed out, the next call
//! skips the late answer if it comes; a call that finds the server gone or
//! replaced says so, and the next one reconnects (a new generation: both
//! rings start over), as does the next call after a write that failed.

use core::fmt;

use crate::substrate::clock::Clock;
use crate::substrate::exec::{yield_now, yield_to_peers};
use crate::substrate::memory::word_at;
use crate::substrate::mutant::mutant;
use crate::substrate::value::Value;
use crate::{Memory, NodeId};

use super::MsgError;
use super::area::{Area, State};
use super::ring::{Consumer, Producer};

/// Bytes of a request's header.
pub const REQUEST_HEADER: usize = 8;
/// Bytes of a response's header.
pub const RESPONSE_HEADER: usize = 16;
/// Bytes a client reads at once when polling for its answer.
const WINDOW: u64 = 256;

/// How long a call spins on its response ring before it yields the CPU
/// between polls, ns: a few times a running server's answer on shm (about
/// 2 µs), so a call seldom yields where the server has a core of its own,
/// and one that shares its core with the server soon lets it run.
const SPIN_NS: u64 = 10_000;

/// Methods every server answers.
pub mod method {
    /// Echoes the request's body: liveness, and what benchmarks time.
    pub const PING: u16 = 0;
    /// The server's counters ([`crate::substrate::msg::server::Stats`]).
    pub const STATS: u16 = 1;
    /// The name of the service the server serves (`Service::name`): a
    /// client checks it is talking to the role it needs, not a bare server
    /// or another store's.
    pub const SERVICE: u16 = 2;
    /// The first method a service may define.
    pub const FIRST_SERVICE: u16 = 16;
}

/// How a server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Served.
    Ok,
    /// The server has no such method.
    NoSuchMethod,
    /// The request's body is not what the method takes.
    BadRequest,
    /// The method failed (its body may say why).
    Failed,
    /// A status this client does not know (from a newer server, or garbage).
    Unknown(u16),
}

impl Status {
    /// Its code on the wire.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 0,
            Status::NoSuchMethod => 1,
            Status::BadRequest => 2,
            Status::Failed => 3,
            Status::Unknown(c) => c,
        }
    }

    /// The status of code `c`.
    pub fn of(c: u16) -> Status {
        match c {
            0 => Status::Ok,
            1 => Status::NoSuchMethod,
            2 => Status::BadRequest,
            3 => Status::Failed,
            c => Status::Unknown(c),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Ok => write!(f, "ok"),
            Status::NoSuchMethod => write!(f, "no such method"),
            Status::BadRequest => write!(f, "bad request"),
            Status::Failed => write!(f, "failed"),
            Status::Unknown(c) => write!(f, "unknown status {c}"),
        }
    }
}

/// The request header for `method`.
pub fn request_header(method: u16) -> [u8; REQUEST_HEADER] {
    let mut h = [0u8; REQUEST_HEADER];
    h[..2].copy_from_slice(&method.to_le_bytes());
    h
}

/// The method of a request's payload and its body; `None` if too short.
pub fn parse_request(payload: &[u8]) -> Option<(u16, &[u8])> {
    let method = u16::from_le_bytes(payload.get(..2)?.try_into().ok()?);
    Some((method, payload.get(REQUEST_HEADER..)?))
}

/// The response header for request `seq`.
pub fn response_header(seq: u32, status: Status, server_ops: u32) -> [u8; RESPONSE_HEADER] {
    let mut h = [0u8; RESPONSE_HEADER];
    h[..4].copy_from_slice(&seq.to_le_bytes());
    h[4..6].copy_from_slice(&status.code().to_le_bytes());
    h[8..12].copy_from_slice(&server_ops.to_le_bytes());
    h
}

/// An answer.
pub struct Reply<B> {
    /// How the server answered.
    pub status: Status,
    /// Memory operations the server made for the request.
    pub server_ops: u32,
    /// Its body (a window into the inbox's read buffer).
    pub body: Value<B>,
}

impl<B> Reply<B> {
    /// The body of a served request; [`MsgError::Refused`] otherwise.
    pub fn ok(self) -> Result<Value<B>, MsgError> {
        match self.status {
            Status::Ok => Ok(self.body),
            s => Err(MsgError::Refused(s)),
        }
    }
}

/// What a channel went through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Reconnections (each starts a new generation of the channel).
    pub reconnects: u64,
    /// Late answers to calls that had timed out, recognised and skipped.
    pub late_answers: u64,
    /// Times the request ring wrapped around (this generation and before).
    pub wraps: u64,
}

/// A request sent on a channel, its answer not collected yet
/// ([`Channel::start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Its sequence number, which the answer names.
    seq: u32,
    /// When it was sent, in the caller's clock's ticks.
    at: u64,
}

impl Sent {
    /// When it was sent, in the caller's clock's ticks.
    pub fn at(&self) -> u64 {
        self.at
    }
}

/// One client's channel to the server beside a node.
#[derive(Debug)]
pub struct Channel {
    area: Area,
    slot: u16,
    req: Producer,
    resp: Consumer,
    /// The rings' state is unknown (a call timed out): reconnect first.
    broken: bool,
    stats: ChannelStats,
}

impl Channel {
    /// Connects channel `slot` (the client's id) of the server beside `node`.
    pub async fn connect<M: Memory>(mem: &M, node: NodeId, slot: u16) -> Result<Channel, MsgError> {
        let area = Area::open(mem, node).await?;
        let link = area.connect(mem, slot).await?;
        Ok(Channel {
            area,
            slot,
            req: Producer::new(area.request_ring(slot), link),
            resp: Consumer::new(area.response_ring(slot), link),
            broken: false,
            stats: ChannelStats::default(),
        })
    }

    /// What it went through.
    pub fn stats(&self) -> ChannelStats {
        ChannelStats { wraps: self.stats.wraps + self.req.wraps(), ..self.stats }
    }

    /// The node whose server this channel reaches.
    pub fn node(&self) -> NodeId {
        self.area.node
    }

    /// The largest request body the channel carries.
    pub fn max_body(&self) -> u64 {
        self.area.geo.max_message().saturating_sub(REQUEST_HEADER as u64)
    }

    /// Sends a request; a write that failed may have landed in part, so
    /// the next call reconnects.
    async fn send<M: Memory>(&mut self, mem: &M, method: u16, body: &[u8]) -> Result<(), MsgError> {
        let sent = self.req.send(mem, &[&request_header(method), body]).await;
        self.broken |= sent.is_err();
        Ok(sent?)
    }

    async fn reconnect<M: Memory>(&mut self, mem: &M) -> Result<(), MsgError> {
        let link = self.area.connect(mem, self.slot).await?;
        self.stats.reconnects += 1;
        self.stats.wraps += self.req.wraps();
        self.req = Producer::new(self.area.request_ring(self.slot), link);
        self.resp = Consumer::new(self.area.response_ring(self.slot), link);
        self.broken = false;
        Ok(())
    }

    /// Calls `method` with `body` and waits for the answer, at most
    /// `timeout_ns` of `clock`'s time. One roundtrip for the caller's
    /// roundtrip accounting; the server's memory operations are reported
    /// with [`Memory::note_served`].
    pub async fn call<M: Memory, C: Clock>(
        &mut self,
        mem: &M,
        clock: &C,
        timeout_ns: u64,
        method: u16,
        body: &[u8],
    ) -> Result<Reply<M::Buf>, MsgError> {
        let sent = self.start(mem, clock, method, body).await?;
        // Mutant `rpc-resend`: a call that times out sends its request
        // again, as a client that retried blindly would (a request then
        // runs twice).
        let resend = mutant!("rpc-resend").then_some((method, body));
        self.finish(mem, clock, timeout_ns, sent, resend).await
    }

    /// Sends a request (one WRITE) and returns without waiting for its
    /// answer: collected later with [`Channel::poll`] or
    /// [`Channel::finish`], before the channel's next request (one
    /// outstanding at a time).
    pub async fn start<M: Memory, C: Clock>(
        &mut self,
        mem: &M,
        clock: &C,
        method: u16,
        body: &[u8],
    ) -> Result<Sent, MsgError> {
        if body.len() as u64 > self.max_body() {
            return Err(MsgError::TooLarge { len: body.len() as u64, max: self.max_body() });
        }
        if self.broken {
            self.reconnect(mem).await?;
        }
        let sent = Sent { seq: self.req.next_seq(), at: clock.now() };
        self.send(mem, method, body).await?;
        Ok(sent)
    }

    /// Looks once for the answer to `sent` (one READ of the response
    /// ring, skipping late answers to earlier requests): `None` if it has
    /// not come yet.
    pub async fn poll<M: Memory>(&mut self, mem: &M, sent: &Sent) -> Result<Option<Reply<M::Buf>>, MsgError> {
        loop {
            match self.resp.poll(mem, WINDOW).await {
                Ok(Some(msg)) => {
                    self.resp.publish(mem);
                    let p = msg.payload();
                    let (Some(h0), Some(h1)) = (word_at(p, 0), word_at(p, 8)) else { continue };
                    if h0 as u32 != sent.seq {
                        // The late answer to a call that timed out.
                        self.stats.late_answers += 1;
                        continue;
                    }
                    let status = Status::of((h0 >> 32) as u16);
                    let server_ops = h1 as u32;
                    mem.note_served(server_ops);
                    return Ok(Some(Reply { status, server_ops, body: msg.into_value(RESPONSE_HEADER) }));
                }
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.broken = true;
                    return Err(e.into());
                }
            }
        }
    }

    /// Waits for the answer to `sent`, until `timeout_ns` of `clock`'s
    /// time after it was sent; `resend`: a request to send again once, at
    /// the time-out, then wait as long again (only the mutant does).
    pub async fn finish<M: Memory, C: Clock>(
        &mut self,
        mem: &M,
        clock: &C,
        timeout_ns: u64,
        mut sent: Sent,
        mut resend: Option<(u16, &[u8])>,
    ) -> Result<Reply<M::Buf>, MsgError> {
        let limit = timeout_ns / clock.tick_ns().max(1);
        let spin = SPIN_NS / clock.tick_ns().max(1);
        loop {
            if let Some(reply) = self.poll(mem, &sent).await? {
                return Ok(reply);
            }
            if clock.now().wrapping_sub(sent.at) > limit {
                if let Some((method, body)) = resend.take() {
                    sent = Sent { seq: self.req.next_seq(), at: clock.now() };
                    self.send(mem, method, body).await?;
                    continue;
                }
                // A caller that did not run for a while (a process
                // stopped, or descheduled) looks once more: the answer may
                // have come meanwhile. (Mutant `rpc-no-last-look`: it
                // times out on a look it took before its pause.)
                if !mutant!("rpc-no-last-look")
                    && let Some(reply) = self.poll(mem, &sent).await?
                {
                    return Ok(reply);
                }
                // The same server may still answer (late: the next call
                // skips that answer); another incarnation never will.
                let why = match self.area.state(mem).await? {
                    State::Running(e) if e == self.req.link().epoch => return Err(MsgError::TimedOut),
                    State::Running(_) => "its server restarted",
                    State::Stopped(_) => "its server stopped",
                    State::Never => "no server ever ran beside it",
                };
                self.broken = true;
                return Err(MsgError::NoServer { node: self.area.node, why });
            }
            // The server is another thread or process: past a short spin,
            // let it have the CPU.
            if clock.now().wrapping_sub(sent.at) > spin { yield_to_peers().await } else { yield_now().await }
        }
    }
}
