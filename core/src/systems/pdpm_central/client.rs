//! A pDPM-Central client (pDPM §4.2): every operation is an RPC to the
//! coordinator over the server layer's rings; a get then READs the value
//! from a data node itself.
//!
//! # The read's two roundtrips
//!
//! The paper's read is `RPC -> rdlock -> READ DN -> unlock -> reply`: the
//! coordinator reads the data node, and the client sees 2 RTTs (its RPC,
//! and the coordinator's READ nested in it). Here the coordinator answers
//! the RPC with the committed version's copies, read-locked for this client
//! (roundtrip 1), and the client READs one copy (roundtrip 2): the same two
//! network roundtrips in sequence, the value crossing the network once
//! instead of twice, and the coordinator's CPU freed of the READ. The read
//! lock is released by this client's next request (no roundtrip of its
//! own; see [`super::coordinator`]): until then the coordinator frees
//! neither the version's record nor its copies, so the READ finds the
//! value that was committed when the coordinator answered. A successor
//! incarnation of the coordinator knows none of its predecessor's locks:
//! it frees what the predecessor answered for only after
//! [`answer_lifetime_ns`] (and a margin), and a client drops a READ done
//! later than that after its call began, and asks again
//! ([`Paths::late_reads`]).
//!
//! The copy read is checked against the version's checksum: with the lock
//! it always matches unless memory was garbled, so a mismatch is an error
//! ([`KvError::Corrupt`]), never retried away. A copy whose node fails is
//! replaced by the next one ([`Paths::other_copies`]).
//!
//! # Writes
//!
//! An update or insert is one RPC with the value; the coordinator writes
//! the copies (one roundtrip to the data nodes, in parallel) and commits on
//! its own node before answering, and reports its roundtrips, which count
//! as this client's ([`Memory::note_server_roundtrips`]): 2, as pDPM
//! Table 1. A delete is one RPC.

use crate::kv::seat::{check_id, give_back, keep_lease};
use crate::kv::{Got, Handle, KvClient, KvError, Limits, Missing, StoreConfig, Who, Written};
use crate::substrate::clock::Clock;
use crate::substrate::lease::Held;
use crate::substrate::msg::MsgError;
use crate::substrate::msg::rpc::{Channel, Status};
use crate::substrate::value::Value;
use crate::{MemError, MemErrorKind, Memory, NodeId};

use super::wire::{self, Answer, Mode, Version, value_sum};
use super::{COORDINATOR, PdpmCentral};
use crate::kv::KvSystem;
use crate::substrate::mutant::mutant;

/// How long a call waits for the coordinator at most: longer than its
/// slowest write (a data node that hangs until its time-out, then the
/// commit), on a memory that states no time-out ([`call_timeout_ns`]).
pub const CALL_TIMEOUT_NS: u64 = 1_000_000_000;
/// Sequential memory operations of the coordinator's longest request (the
/// allocations, the copies, the commit and an index insert), each of which
/// may wait out the memory's time-out.
const REQUEST_OPS: u64 = 8;

/// How long a call waits for the coordinator on `mem`: its longest request
/// behind one of every other client's (`channels`), twice over, where the
/// memory states its time-out ([`Memory::timeout_ns`], the simulator's
/// tens of µs); else, or if longer, [`CALL_TIMEOUT_NS`], but never less
/// than the server's own wait for a data node that hangs (its memory's
/// time-out, twice, and a little): so that the server answers which node
/// failed, rather than the client blaming the server's node. A call to a
/// coordinator that died fails after this long, and the next one reaches
/// its successor.
pub fn call_timeout_ns<M: Memory>(mem: &M, channels: u16) -> u64 {
    mem.timeout_ns().map_or(CALL_TIMEOUT_NS, |t| {
        t.saturating_mul(REQUEST_OPS * 2 * (channels as u64 + 1)).min(CALL_TIMEOUT_NS.max(t.saturating_mul(3)))
    })
}
/// How long after its call began a client may still use a get's answer:
/// the call's time-out ([`call_timeout_ns`]) and one READ's (the memory's
/// time-out, or [`CALL_TIMEOUT_NS`] where it states none). A READ of the
/// answered copy that is done later than this is dropped, and the get asks
/// again; so a version that an incarnation answered for before it was
/// superseded may be freed by its successor this long (and a margin) after
/// the supersession ([`super::coordinator`], "Frees").
pub fn answer_lifetime_ns<M: Memory>(mem: &M, channels: u16) -> u64 {
    call_timeout_ns(mem, channels).saturating_add(mem.timeout_ns().unwrap_or(CALL_TIMEOUT_NS))
}

/// Gets asked again whose READ was done too late ([`answer_lifetime_ns`])
/// before one fails.
const LATE_TRIES: usize = 4;

/// How long connecting waits for the coordinator to start.
pub const CONNECT_TIMEOUT_NS: u64 = 2_000_000_000;

/// The rare paths a client took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Reads that went to another copy after a data node failed.
    pub other_copies: u64,
    /// Calls that failed (time-out, no coordinator).
    pub failed_calls: u64,
    /// Writes whose superseded version's free waited for its readers.
    pub deferred_frees: u64,
    /// Answers the coordinator gave after finding the key changed by
    /// another incarnation ([`super::coordinator::Paths::fenced`]).
    pub fenced_answers: u64,
    /// Writes whose copy went to a data node the coordinator had marked
    /// down, and which is back ([`super::coordinator::Paths::readmitted`]).
    pub readmitted: u64,
    /// Gets whose READ was done later than their answer may be used
    /// ([`answer_lifetime_ns`]), asked again.
    pub late_reads: u64,
    /// Requests during which the coordinator freed versions an earlier
    /// incarnation committed ([`super::coordinator::Paths::foreign_frees`]).
    pub foreign_frees: u64,
}

/// One pDPM-Central client.
pub struct CentralClient<M, C> {
    mem: M,
    id: u8,
    lease: Option<Held>,
    clock: C,
    channel: Channel,
    call_timeout_ns: u64,
    /// [`answer_lifetime_ns`], in the clock's ticks.
    answer_lifetime: u64,
    limits: Limits,
    paths: Paths,
}

/// A failed call to the server beside `server` as the key-value interface
/// says it (a server that is gone as that node down).
pub fn call_error(e: MsgError, server: NodeId) -> KvError {
    let down = |kind| KvError::Down(MemError::new(server, kind));
    match e {
        MsgError::Mem(e) => KvError::Down(e),
        MsgError::TimedOut => down(MemErrorKind::TimedOut),
        MsgError::NoServer { .. } | MsgError::Superseded => down(MemErrorKind::Unreachable),
        MsgError::Refused(Status::Failed) => KvError::Unavailable,
        MsgError::Refused(Status::NoSuchMethod) => KvError::NotServed(server),
        MsgError::Refused(_) => KvError::Bug("the server refused a well-formed request"),
        MsgError::TooLarge { .. } => KvError::BadConfig("the server's rings are too small for this value"),
        MsgError::Corrupt { .. } => KvError::Corrupt,
        MsgError::Full | MsgError::Region(_) | MsgError::BadConfig(_) => KvError::Unavailable,
    }
}

/// What a client of a store with a server (pDPM-Central's coordinator,
/// Clover's metadata server) does first: checks its id, checks that the
/// store is there, and connects its channel (its id's) to the server
/// beside `server`, waiting for it to start (up to
/// [`CONNECT_TIMEOUT_NS`]). Its id, its lease (if it has one) and the
/// channel; a leased id is given back if this fails.
pub async fn open_channel<M: Memory, C: Clock>(
    mem: &M,
    cfg: &StoreConfig,
    who: Who,
    clock: &C,
    server: NodeId,
) -> Result<(u8, Option<Held>, Channel), KvError> {
    let id = check_id(&who, cfg)?;
    let lease = match who {
        Who::Id(_) => None,
        Who::Lease(h) => Some(h),
    };
    if let Err(e) = crate::systems::open(mem).await {
        let _ = give_back(lease, mem).await;
        return Err(e);
    }
    let start = clock.now();
    let limit = CONNECT_TIMEOUT_NS / clock.tick_ns().max(1);
    loop {
        match Channel::connect(mem, server, id as u16).await {
            Ok(c) => return Ok((id, lease, c)),
            Err(MsgError::NoServer { .. }) if clock.now().wrapping_sub(start) <= limit => {
                crate::substrate::exec::yield_now().await
            }
            Err(e) => {
                let _ = give_back(lease, mem).await;
                return Err(call_error(e, server));
            }
        }
    }
}

impl<M: Memory, C: Clock> CentralClient<M, C> {
    /// Connects a client to the coordinator, waiting for it to start (up
    /// to [`CONNECT_TIMEOUT_NS`]).
    pub async fn open(mem: M, cfg: &StoreConfig, who: Who, clock: C) -> Result<Self, KvError> {
        let (id, lease, channel) = open_channel(&mem, cfg, who, &clock, COORDINATOR).await?;
        let channels = super::geometry(cfg).channels;
        let call_timeout_ns = call_timeout_ns(&mem, channels);
        let answer_lifetime = clock.ticks(answer_lifetime_ns(&mem, channels));
        Ok(CentralClient {
            mem,
            id,
            lease,
            clock,
            channel,
            call_timeout_ns,
            answer_lifetime,
            limits: cfg.limits(),
            paths: Paths::default(),
        })
    }

    /// The rare paths it took.
    pub fn central_paths(&self) -> Paths {
        self.paths
    }

    async fn keep_lease(&mut self) -> Result<(), KvError> {
        keep_lease(&mut self.lease, &self.mem, self.clock.now()).await
    }

    /// Calls the coordinator: its answer (its own roundtrips to data nodes
    /// noted as this client's). The channel is the id's: the lease is kept
    /// first, so that a client whose id went to another while it was
    /// stopped is told so, and does not call on a channel that is no
    /// longer its own.
    async fn call(&mut self, method: u16, body: &[u8]) -> Result<Answer, KvError> {
        // (Mutant `server-call-unleased`: a stopped client, continued,
        // calls on its lost id's channel, and waits for an answer that
        // never comes.)
        if !mutant!("server-call-unleased") {
            self.keep_lease().await?;
        }
        let reply = match self.channel.call(&self.mem, &self.clock, self.call_timeout_ns, method, body).await {
            Ok(r) => r,
            Err(e) => {
                self.paths.failed_calls += 1;
                return Err(call_error(e, COORDINATOR));
            }
        };
        let body = match reply.status {
            Status::Ok => reply.body,
            Status::Failed => return Err(wire::decode_failure(&reply.body)),
            s => return Err(call_error(MsgError::Refused(s), COORDINATOR)),
        };
        let (answer, rounds, flags) =
            Answer::decode(&body, self.mem.node_count(), self.limits.max_value).ok_or(KvError::Corrupt)?;
        self.mem.note_server_roundtrips(rounds as u32);
        self.paths.deferred_frees += flags.deferred as u64;
        self.paths.fenced_answers += flags.fenced as u64;
        self.paths.readmitted += flags.readmitted as u64;
        self.paths.foreign_frees += flags.foreign_freed as u64;
        Ok(answer)
    }
}

impl<M: Memory, C: Clock> CentralClient<M, C> {
    /// Whether an answer to a call made at `asked` may no longer be used
    /// ([`answer_lifetime_ns`]).
    fn late(&self, asked: u64) -> bool {
        // Mutant `central-reads-late`: a READ done however late is used,
        // and may return a copy that the coordinator's successor freed
        // and wrote again meanwhile.
        self.clock.now().wrapping_sub(asked) > self.answer_lifetime && !mutant!("central-reads-late")
    }

    /// Reads version `v`, answered to a call made at `asked`, from one of
    /// its copies (spread over clients; the next one if a node fails); or
    /// the node of a READ done too late, whose bytes are not used.
    async fn read_copy(&mut self, v: &Version, asked: u64) -> Result<Result<Got<Value<M::Buf>>, NodeId>, KvError> {
        let len = v.len as usize;
        if len == 0 {
            return if v.sum == value_sum(&[]) { Ok(Ok(Got::Found(Value::empty()))) } else { Err(KvError::Corrupt) };
        }
        let n = v.copies.len();
        let mut last = KvError::Unavailable;
        for k in 0..n {
            let copy = v.copies[(self.id as usize + k) % n];
            let read = self.mem.read(copy, len).await;
            if self.late(asked) {
                return Ok(Err(copy.node));
            }
            match read {
                Ok(buf) => {
                    if buf.len() != len || value_sum(&buf) != v.sum {
                        return Err(KvError::Corrupt);
                    }
                    return Ok(Ok(Got::Found(Value::in_buf(buf, 0..len))));
                }
                Err(e) if e.is_request_error() => return Err(KvError::Corrupt),
                Err(e) => {
                    self.paths.other_copies += 1;
                    last = KvError::Down(e);
                }
            }
        }
        Err(last)
    }
}

impl<M: Memory, C: Clock> KvClient for CentralClient<M, C> {
    type Value = Value<M::Buf>;

    fn name(&self) -> &'static str {
        PdpmCentral::INFO.name
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<Value<M::Buf>>, KvError> {
        self.limits.check_key(key)?;
        let mut late = KvError::Unavailable;
        for _ in 0..LATE_TRIES {
            let asked = self.clock.now();
            let v = match self.call(wire::GET, key).await? {
                Answer::Absent => return Ok(Got::NotFound),
                Answer::Deleted => return Ok(Got::Deleted),
                Answer::Found(v) => v,
                _ => return Err(KvError::Corrupt),
            };
            match self.read_copy(&v, asked).await? {
                Ok(got) => return Ok(got),
                Err(node) => {
                    self.paths.late_reads += 1;
                    late = KvError::Down(MemError::new(node, MemErrorKind::TimedOut));
                }
            }
        }
        Err(late)
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check(key, value)?;
        match self.call(wire::PUT, &wire::put_body(Mode::Update, key, value)).await? {
            Answer::Written => Ok(Ok(Written)),
            Answer::NotFound => Ok(Err(Missing::NotFound)),
            _ => Err(KvError::Corrupt),
        }
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.limits.check(key, value)?;
        match self.call(wire::PUT, &wire::put_body(Mode::Insert, key, value)).await? {
            Answer::Written => Ok(Written),
            _ => Err(KvError::Corrupt),
        }
    }

    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.limits.check_key(key)?;
        match self.call(wire::DELETE, key).await? {
            Answer::Written => Ok(Ok(Written)),
            Answer::NotFound => Ok(Err(Missing::NotFound)),
            _ => Err(KvError::Corrupt),
        }
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.keep_lease().await
    }

    /// Its reads from another copy as read restarts, its late READs as
    /// time-outs, its deferred frees, fenced answers, readmitted nodes and
    /// earlier incarnations' versions freed.
    fn paths(&self) -> crate::swarm::client::Paths {
        crate::swarm::client::Paths {
            read_restarts: self.paths.other_copies,
            deferred_frees: self.paths.deferred_frees,
            fenced_answers: self.paths.fenced_answers,
            nodes_readmitted: self.paths.readmitted,
            gc_timeouts: self.paths.late_reads,
            foreign_frees: self.paths.foreign_frees,
            ..Default::default()
        }
    }

    /// Gives the leased id back. The read lock of its last get, if any, is
    /// released by the id's next holder's first request.
    async fn close(&mut self) -> Result<(), KvError> {
        give_back(self.lease.take(), &self.mem).await
    }
}

impl<M: Memory, C> Handle for CentralClient<M, C> {
    type Mem = M;

    fn mem(&self) -> &M {
        &self.mem
    }

    fn id(&self) -> u8 {
        self.id
    }
}
