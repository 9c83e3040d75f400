//! What one SWARM client owns, shared by every object it accesses: its id,
//! its view of the writer logs, its allocator, its log ids and its clock.

use crate::substrate::clock::Clock;
use crate::substrate::space::slab::SlabAllocator;
use crate::swarm::meta::{MAX_CLIENT, MAX_TIME, Meta};
use crate::swarm::writerlog::{LogError, Logs};
use crate::{Memory, NodeId};

/// One client's state.
pub struct ClientCtx<C> {
    /// This client's id, `1..=MAX_CLIENT`; it names its writes and its log.
    pub id: u8,
    /// The writer logs (directories and cached segments).
    pub logs: Logs,
    /// Remote memory allocation.
    pub slab: SlabAllocator,
    /// Nodes this client last saw fail (bit `n` for node `n < 32`): the
    /// replicated objects start their majority with the others (SWARM §6).
    pub suspects: u32,
    clock: C,
    /// Added to the clock after a stale guess (re-synchronisation).
    offset: u64,
    last_time: u64,
    next_id: u32,
    end_id: u32,
}

/// Why a client could not be set up or could not name a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClientError {
    /// The id is 0 or above [`MAX_CLIENT`].
    BadId(u8),
    /// Timestamps ran out (the clock passed [`MAX_TIME`]).
    TimeExhausted,
    /// The log could not be used.
    Log(LogError),
}

impl core::fmt::Display for ClientError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ClientError::BadId(id) => write!(f, "client id {id} is not in 1..={MAX_CLIENT}"),
            ClientError::TimeExhausted => write!(f, "timestamps are exhausted (the clock passed 2^32 ticks)"),
            ClientError::Log(e) => write!(f, "{e}"),
        }
    }
}

impl<C: Clock> ClientCtx<C> {
    /// A client with id `id` (unique among live clients) and clock `clock`.
    pub fn new(id: u8, clock: C) -> Result<Self, ClientError> {
        if id == 0 || id > MAX_CLIENT {
            return Err(ClientError::BadId(id));
        }
        Ok(ClientCtx {
            id,
            logs: Logs::new(),
            slab: SlabAllocator::new(),
            suspects: 0,
            clock,
            offset: 0,
            last_time: 0,
            next_id: 0,
            end_id: 0,
        })
    }

    /// guessTs(): the local clock, but strictly above every time this
    /// client used before.
    pub fn guess_time(&mut self) -> Result<u64, ClientError> {
        let t = (self.clock.now() + self.offset).max(self.last_time + 1);
        if t >= MAX_TIME {
            return Err(ClientError::TimeExhausted);
        }
        self.last_time = t;
        Ok(t)
    }

    /// Whether `node` failed the last time this client used it.
    pub fn suspects(&self, node: crate::NodeId) -> bool {
        node.0 < 32 && self.suspects & (1 << node.0) != 0
    }

    /// Remembers how `node` answered: failed (unreachable or timed out),
    /// or not.
    pub fn note(&mut self, node: crate::NodeId, failed: bool) {
        if node.0 < 32 {
            if failed {
                self.suspects |= 1 << node.0;
            } else {
                self.suspects &= !(1 << node.0);
            }
        }
    }

    /// After a stale guess: move the clock past `seen` so that the next
    /// guesses are fresh again.
    pub fn resync(&mut self, seen: Meta) {
        let now = self.clock.now() + self.offset;
        if seen.time() >= now {
            self.offset += seen.time() + 1 - now;
        }
        self.last_time = self.last_time.max(seen.time());
    }

    /// Uses `time` (a slow-path rewrite) so later guesses stay above it.
    pub fn used_time(&mut self, time: u64) {
        self.last_time = self.last_time.max(time);
    }

    /// Takes, before the client's first operation, the roundtrips that
    /// would otherwise fall on it: reserving log ids, opening every node's
    /// region and log directory, and claiming the log segment of the next
    /// writes on every node (the paper's clients pre-allocate, §4.3).
    /// Unreachable nodes are skipped. A write that later starts a new log
    /// segment still pays for claiming it (a few roundtrips per node, once
    /// per segment).
    pub async fn prepare<M: Memory>(&mut self, mem: &M) -> Result<(), ClientError> {
        if self.next_id == self.end_id {
            let id = self.next_log_id(mem).await?;
            self.next_id = id;
        }
        let nodes: heapless::Vec<NodeId, { 4 * crate::substrate::quorum::MAX_REPLICAS }> =
            (0..mem.node_count().min(4 * crate::substrate::quorum::MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
        for group in nodes.chunks(crate::substrate::quorum::MAX_REPLICAS) {
            for entry in self.logs.entries(mem, group, self.id, self.next_id, Some(&mut self.slab)).await {
                match entry {
                    Ok(_) | Err(LogError::Mem(_)) => {}
                    Err(e) => return Err(ClientError::Log(e)),
                }
            }
        }
        Ok(())
    }

    /// A fresh log id, reserving a batch on a majority of the cluster's
    /// nodes when the current batch is used up (one or two roundtrips every
    /// [`ID_BATCH`](crate::swarm::writerlog::ID_BATCH) writes).
    pub async fn next_log_id<M: Memory>(&mut self, mem: &M) -> Result<u32, ClientError> {
        if self.next_id == self.end_id {
            let nodes: heapless::Vec<NodeId, { crate::substrate::quorum::MAX_REPLICAS }> =
                (0..mem.node_count().min(crate::substrate::quorum::MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
            let reserve = self.logs.reserve_ids(mem, &nodes, self.id);
            let (start, end) = crate::substrate::exec::cold(|| reserve).await.map_err(ClientError::Log)?;
            self.next_id = start;
            self.end_id = end;
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(id)
    }
}
