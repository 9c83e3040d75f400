//! pDPM-Central (pDPM, Tsai, Shan, Zhang, ATC'20, §4.2): a key-value store
//! on passive memory whose every access goes through a central
//! *coordinator*, a server beside a memory node that holds the index, does
//! all allocation, and serializes accesses to each entry with per-key
//! reader-writer locks.
//!
//! - [`coordinator`]: the coordinator, a `Service` on the server layer
//!   (`crate::substrate::msg::server`): its state, locks, replication and
//!   frees;
//! - [`client`]: the clients: a get is an RPC and a READ (2 roundtrips), a
//!   write an RPC with the value, out of place, committed at the
//!   coordinator (2 roundtrips: the RPC and the coordinator's WRITE to the
//!   data nodes); deletes and inserts are RPCs too;
//! - [`wire`]: what they exchange and what the coordinator records.
//!
//! # Where the coordinator runs
//!
//! Beside node 0 ([`COORDINATOR`]), the node that already holds every
//! store's record and the one-copy index of RAW and pDPM-Direct
//! (`crate::kv::place::INDEX_NODE`): its durable metadata (index, cells,
//! records) is the paper's "local PM", and its accesses there are local
//! (not counted as roundtrips, as the paper counts its metadata flush).
//! Its index is not replicated (`SystemInfo::replicated_index` is false),
//! so the campaigns crash nodes other than node 0, as for RAW and
//! pDPM-Direct.
//!
//! # Guarantee: linearizable
//!
//! The paper promises atomic single-entry writes and read-committed reads;
//! with the coordinator's locks the store gives more. Every write commits
//! at one point, the CAS of the key's cell made by the coordinator while it
//! serves the request (one request at a time); every read takes its
//! version at one point, when the coordinator serves its RPC; and the read
//! lock keeps that version's copies allocated (not freed, so not reused)
//! until the client's READ is done, so the READ returns exactly that
//! version's value. A value is committed only once a majority of its data
//! nodes acknowledged it, and a version names only the acknowledged copies,
//! so a minority of crashed data nodes loses nothing. Hence histories are
//! linearizable (`Guarantee::Linearizable`), checked by the simulator
//! campaigns with crashing clients, data nodes and coordinators.
//!
//! # A coordinator that dies
//!
//! Its state is on node 0's memory, which outlives its process: a standby
//! (any process that reaches node 0, `swarm serve --node 0`) starts a new
//! incarnation of the server, which supersedes the dead one's channels and
//! loads each key from node 0 on its first request
//! ([`coordinator::Paths::loaded`]). A call in flight to the dead one fails
//! after [`client::call_timeout_ns`] with [`KvError::Down`] naming node 0:
//! its operation may or may not have taken effect (the campaigns leave it
//! pending in the history), and the client's next call reaches the standby.
//! Versions the dead one committed, once superseded, are freed by the
//! standby after their readers' time is over
//! ([`coordinator::foreign_wait_ns`]: a client drops a READ done later
//! than [`client::answer_lifetime_ns`] after its call began, and asks
//! again), so a takeover leaks nothing on a memory that keeps time.
//!
//! # A coordinator that was only paused
//!
//! One paused (SIGSTOP, a long stall) rather than dead comes back in the
//! middle of a request, with a map that a standby may have made stale, or
//! has a commit in flight that lands after the standby loaded the key. It
//! stops at its next pass over its channels (superseded), but what it
//! does before must stay right, and so must the standby. So every answer
//! the map gives is checked against the key's cell, a local read, before
//! it is given (a get's version, a deleted key, an update or delete of a
//! deleted key), and takes effect at that read; every commit is a CAS of
//! the cell from the word the map holds. A check or a CAS that finds
//! another word means that another incarnation changed the key: the key
//! is loaded again and the request served again from it
//! ([`coordinator::Paths::fenced`]; the client counts such answers), and
//! after a few such tries the coordinator answers that it is down (its
//! client reconnects, to the successor). Every load is followed by a read
//! of the server's state word (local): an incarnation that finds a newer
//! one began answers that it is down rather than answer for what it
//! loaded, which the newer one may have committed and will free at once
//! (it knows no reader of the older one's). And a commit's pipeline reads
//! the state word last: if a newer incarnation had begun, the version the
//! commit superseded may have been answered for by it, and is freed only
//! after its readers' time, as the newer one frees an older one's
//! versions ([`coordinator`], "Frees"). A cell's word does not come back
//! to a key in the meantime: each incarnation commits records from chunks
//! of its own, and although it reuses the records it frees, each word is
//! stamped with its count of commits then (16 bits: a record would have
//! to come back to the same key after a multiple of 65,536 commits, all
//! while the other incarnation serves its last requests); a deleted key's word is
//! the same tombstone whoever deleted it, which any incarnation may insert
//! over. So a check or a CAS that finds the map's word found the key as
//! the map says. This needs no timing assumption. Without the stamp, a
//! key this incarnation loaded from another one's commit could read as
//! unchanged after the other superseded that record and reused it for
//! the key's next version (test
//! `a_reused_record_does_not_pass_for_the_version_it_held`). The campaigns
//! pause the coordinator (half the runs whose coordinator fails) past
//! its standby's start; the mutant `central-no-fence` (answers from the
//! map unchecked) answers a key the other incarnation inserted again as
//! deleted, and another's old value (test
//! `a_coordinator_answers_nothing_from_its_map_that_another_changed`).
//!
//! # Not done
//!
//! - A replicated backup: the coordinator's durable state is on node 0
//!   only, which is a single point of failure here (SWARM-KV and DM-ABD
//!   keep theirs in the replicated `crate::index::snapshot` index).

pub mod client;
pub mod coordinator;
pub mod wire;

#[cfg(all(test, feature = "sim"))]
mod tests;

use alloc::boxed::Box;

use crate::index::RaceIndex;
use crate::kv::{Guarantee, KvError, KvSystem, NodeChunks, NodeShape, Roundtrips, StoreConfig, SystemInfo, Who, seat};
use crate::substrate::clock::Clock;
use crate::substrate::msg::MsgError;
use crate::substrate::msg::area::Geometry;
use crate::substrate::msg::rpc::REQUEST_HEADER;
use crate::substrate::msg::server::{self, Bare, Shell, Stats};
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::class_of;
use crate::{Memory, NodeId};

pub use client::CentralClient;
pub use coordinator::{Coordinator, Shape};

/// The node the coordinator runs beside.
pub const COORDINATOR: NodeId = crate::kv::place::INDEX_NODE;

/// pDPM-Central.
pub struct PdpmCentral;

/// The coordinator's server area for `cfg`: a channel per client id, and
/// rings that carry a write of the largest value.
pub fn geometry(cfg: &StoreConfig) -> Geometry {
    let need = (REQUEST_HEADER + 2 + cfg.max_key + cfg.max_value) as u64;
    let mut geo = Geometry { channels: cfg.writers as u16 + 1, ring_bytes: 4096 };
    while geo.max_message() < need {
        geo.ring_bytes *= 2;
    }
    geo
}

/// The coordinator's shape for `cfg`.
pub fn shape(cfg: &StoreConfig) -> Shape {
    Shape {
        node: COORDINATOR,
        replicas: cfg.replicas,
        max_key: cfg.max_key,
        max_value: cfg.max_value,
        channels: geometry(cfg).channels,
    }
}

fn object(size: u64) -> u64 {
    class_of(size.max(1)).map_or(size, |(_, c)| c)
}

impl KvSystem for PdpmCentral {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "pdpm-central",
        about: "a coordinator beside node 0 holds the index and per-key locks; reads RPC + READ, writes out of place \
                through it (pDPM §4.2)",
        replicated: true,
        replicated_index: false,
        rejoins: true,
        floor: false,
        guarantee: Guarantee::Linearizable,
        roundtrips: Roundtrips { get: 2, update: 2, insert: 2, delete: 1 },
        options: &[],
    };

    const SERVER: Option<NodeId> = Some(COORDINATOR);

    type Client<M: Memory, C: Clock> = Box<CentralClient<M, C>>;

    fn check(cfg: &StoreConfig, _: usize) -> Result<(), KvError> {
        if geometry(cfg).check().is_err() {
            return Err(KvError::BadConfig("values too large for the coordinator's rings"));
        }
        Ok(())
    }

    /// Copies of the values spread over the nodes, and on node 0 a record
    /// and a cell per key, the index and the server area.
    fn node_bytes(cfg: &StoreConfig, nodes: usize, _writes: u64) -> u64 {
        let copies = cfg.keys * cfg.replicas as u64;
        let values = copies.div_ceil(nodes.max(1) as u64) * object(cfg.max_value as u64);
        let meta = cfg.keys * (object(wire::RECORD_BYTES as u64) + object(8));
        let slack = (cfg.writers as u64 + 4) * 2 * StoreConfig::CHUNK;
        let total = values + meta + cfg.index_bytes() + geometry(cfg).bytes() + slack;
        (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
    }

    /// The coordinator's chunks (clients allocate nothing): on every node a
    /// chunk of copies of the largest value; on node 0 also its server
    /// area and a chunk each of records, cells and index key blocks.
    fn node_chunks(cfg: &StoreConfig, _: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        if object(cfg.max_value as u64) > shape.chunk {
            return Err(KvError::BadConfig("a value does not fit in a chunk (use bigger chunks or smaller values)"));
        }
        let own = match node == COORDINATOR {
            true => 4 + geometry(cfg).bytes().div_ceil(shape.chunk),
            false => 1,
        };
        Ok(NodeChunks { own, per_client: 0 })
    }

    async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
        seat::format(mem, cfg).await
    }

    async fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> Result<Box<CentralClient<M, C>>, KvError> {
        Ok(Box::new(CentralClient::open(mem, cfg, who, clock).await?))
    }

    /// The coordinator beside node 0; the bare server beside the others.
    async fn serve<M: Memory, H: Shell>(mem: M, node: NodeId, cfg: &StoreConfig, shell: &H) -> Result<Stats, MsgError> {
        if node != COORDINATOR {
            return server::serve(mem, node, Geometry::default(), Bare, shell).await;
        }
        let index = RaceIndex::open(&mem, node)
            .await
            .map_err(|_| MsgError::BadConfig("no pDPM-Central index on node 0 (set the store up first)"))?;
        server::serve(mem, node, geometry(cfg), Coordinator::new(shape(cfg), index), shell).await
    }
}
