//! pDPM-Direct (pDPM, Tsai et al., ATC'20, §4.1): clients reach passive
//! memory nodes directly, with one-sided operations only; each key has a
//! committed space and a redo space, replicated on its 2f+1 nodes, and a
//! lock word on its first node (its *primary*); reads are lock-free and
//! checked by a checksum, writes take the lock.
//!
//! ```text
//! get(k):     READ lock | committed payload of the primary                   # 1 RTT
//!             lock held: wait (held past its lease: take it over, below);
//!             payload torn (a write in progress): read again
//! update(k):  CAS(lock, 0 -> me | expiry) and READ both spaces, pipelined   # 1
//!             WRITE version | value | sum to the redo space of every replica # 2
//!             WRITE the same to the committed space of every replica        # 3
//!             CAS(lock, me | expiry -> 0)                                    # 4
//! ```
//!
//! A round of writes waits for the primary and a majority of the replicas
//! (the writes to the others are posted all the same, and land on their
//! own, as those to a crashed minority never do).
//!
//! # Choices the paper leaves open, and why
//!
//! - **Where a key's entry is.** The paper fixes each entry's spaces when
//!   the key is created, by consensus among the clients, and every client
//!   keeps all the metadata. Here, as for RAW, the toolkit's index on node
//!   0 maps a key to its primary's object, whose header names every
//!   replica's ([`entry`]), and each client caches that (an LRU cache of
//!   the store's capacity; every key by default): a cached key costs no
//!   roundtrip to find, an uncached one three (the index's two, and the
//!   header read with the first get). Objects are sized when the store is
//!   set up, from its largest value, and replicas go on the key's nodes
//!   ([`crate::kv::place::node_of`]).
//! - **A client that dies holding a lock** ([`lock`]): the lock word holds
//!   its holder and the expiry of a lease; once past the expiry and the
//!   toolkit's clock-skew grace, anyone may take the lock over by CAS.
//!   Readers take it over too, rather than wait: a key whose writer died
//!   would otherwise stay unreadable until some client writes it.
//! - **Replaying the redo copy.** Whoever takes a lock, fresh or over,
//!   reads both of the primary's spaces in the same pipeline as its CAS. A
//!   redo payload that is whole and newer than the committed one (by its
//!   version, inside the checksummed payload; each holder writes one above
//!   every version the primary holds), or a committed payload that is
//!   torn, is a write that did not finish: it is written again, redo then
//!   committed, to every replica, before anything else. The paper's
//!   "old-or-new after a crash", with new where the redo copy made it.
//! - **Replica failures.** A round needs the primary and a majority of the
//!   replicas (the primary counts), so the crash of any minority of a
//!   key's other replicas costs nothing. The primary is different: it
//!   holds the lock and answers reads. Reading a majority of the other
//!   replicas instead and picking the highest version is not
//!   linearizable without writing back (two readers can see a write that
//!   is in progress on different minorities, one its new value and the
//!   next the old one), and writing back races the lock holder. So while a
//!   key's primary is down its operations fail with [`KvError::Down`]
//!   naming it ([`Guarantee::LinearizablePrimary`]). A primary that times
//!   out is retried while a round's patience lasts ([`lock::PATIENCE_NS`]),
//!   so that a stalled node costs time, not a lock left behind. The
//!   backups are written for durability and never read; one that missed
//!   a round (down, or a write of it overtaken) is not repaired, and a key
//!   whose primary is lost for good is not rebuilt from its backups (not
//!   implemented).
//! - **Deletes** write a tombstone payload under the lock (the same four
//!   roundtrips) and unmap the key in the background, as SWARM-KV's do
//!   (see [`crate::kv`] for what deletes answer). A tombstoned entry is
//!   never written again: an insert puts the key in fresh objects and
//!   swings the index to them; operations that meet a tombstone through a
//!   stale cached location retry through the index.
//!
//! # Guarantee: linearizable
//!
//! Every payload is written under the lock, with a version above every
//! version the primary holds, and a round of the committed space reaches
//! the primary before the lock is released; a replay writes a payload that
//! is already there, unchanged, or one that is newer. So the primary's
//! committed space only moves forward, one whole payload after another. A
//! get returns a payload only if it read the lock free and every byte of
//! the payload whole (its sum): the version word it read was written by
//! that payload's write, so the payload was in place at the read, and no
//! later read can find an older one. A completed write's payload is on the
//! primary before it returns. So each get takes effect when it read, each
//! write when its committed round reached the primary (a write that failed
//! may take effect later, through its redo copy). The histories of the
//! simulator campaigns (`systems::tests`) are checked against this.
//!
//! Costs, as the paper says: twice the space per entry, and gets of a key
//! that is being written wait for its writer.

mod client;
pub mod entry;
pub mod lock;
#[cfg(all(test, feature = "sim"))]
mod tests;

use alloc::boxed::Box;

pub use client::PdpmClient;

use crate::kv::place::INDEX_NODE;
use crate::kv::seat;
use crate::kv::{Guarantee, KvError, KvSystem, NodeChunks, NodeShape, Roundtrips, StoreConfig, SystemInfo, Who};
use crate::substrate::clock::Clock;
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::class_of;
use crate::{Memory, NodeId};
use entry::Shape;

/// pDPM-Direct: the first of the pDPM paper's designs (§4.1).
pub struct PdpmDirect;

impl PdpmDirect {
    /// The shape of a store's entries.
    pub fn shape(cfg: &StoreConfig) -> Shape {
        Shape { max_value: cfg.max_value as u64 }
    }
}

impl KvSystem for PdpmDirect {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "pdpm-direct",
        about: "committed and redo spaces per key on 2f+1 nodes, a leased lock on the primary; checksummed \
                lock-free reads, writes under the lock (pDPM §4.1)",
        replicated: true,
        replicated_index: false,
        rejoins: false,
        floor: false,
        guarantee: Guarantee::LinearizablePrimary,
        roundtrips: Roundtrips { get: 1, update: 4, insert: 2, delete: 4 },
        options: &[],
    };

    /// Boxed: a client holds its allocator's state (about 50 KiB).
    type Client<M: Memory, C: Clock> = Box<PdpmClient<M, C>>;

    fn check(_: &StoreConfig, _: usize) -> Result<(), KvError> {
        Ok(())
    }

    /// Each key's 2f+1 objects spread over the nodes, and the index on
    /// node 0.
    fn node_bytes(cfg: &StoreConfig, nodes: usize, _writes: u64) -> u64 {
        let object = Self::shape(cfg).object();
        let object = class_of(object).map_or(object, |(_, c)| c);
        let copies = cfg.keys * cfg.replicas.max(1) as u64;
        let values = copies.div_ceil(nodes.max(1) as u64) * object;
        let slack = cfg.writers as u64 * 6 * StoreConfig::CHUNK;
        let total = values + cfg.index_bytes() + slack;
        (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
    }

    /// Per client: a chunk of objects on any node, and one of key blocks
    /// on the index node.
    fn node_chunks(cfg: &StoreConfig, _: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        match class_of(Self::shape(cfg).object()) {
            Some((_, obj)) if obj <= shape.chunk => {
                Ok(NodeChunks { own: 0, per_client: 1 + (node == INDEX_NODE) as u64 })
            }
            _ => Err(KvError::BadConfig("an entry does not fit in a chunk (use bigger chunks or smaller values)")),
        }
    }

    async fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> Result<(), KvError> {
        seat::format(mem, cfg).await
    }

    async fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> Result<Box<PdpmClient<M, C>>, KvError> {
        Ok(Box::new(PdpmClient::open(mem, cfg, who, clock).await?))
    }
}
