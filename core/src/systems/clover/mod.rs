//! Clover (pDPM, Tsai, Shan, Zhang, ATC'20, §5): a key-value store on
//! passive memory whose data path is one-sided and lock-free, and whose
//! metadata (which key exists, where its chain starts, which buffers are
//! free) is kept by a *metadata server* (MS) beside node 0.
//!
//! - [`header`]: a buffer's header word, the pointer to the next version
//!   (or the tail, or the tail of a deleted key), self-checked and seeded
//!   by the key;
//! - [`buffer`]: a data buffer, one version of one key, checksummed with
//!   the key;
//! - [`wire`]: what clients and the MS exchange;
//! - [`ms`]: the metadata server, a `Service` on the server layer
//!   (`crate::substrate::msg::server`), as pDPM-Central's coordinator;
//! - [`client`]: the clients: cursors, chain walks, out-of-place writes
//!   committed by a CAS of the tail's header, background ALLOC refills
//!   that carry the versions they retired.
//!
//! # The protocol (§5, Figure 4)
//!
//! Each version of a key is a buffer written once, out of place, to free
//! buffers on the key's R nodes (`crate::kv::place::node_of`), then
//! linked by a CAS of the previous version's header word on the key's
//! *primary* (its first node, where the chain lives) from "tail" to a link
//! to the new version's primary copy: the commit point. A client keeps a
//! *cursor* per key, the last version it knows; a get READs it (1
//! roundtrip) and returns it if its header says tail, else hops along the
//! links; an update is the WRITE and the CAS (2 roundtrips), and a CAS
//! that lost hops to the version that won and tries again there. Clients
//! get free buffers from the MS in batches, on every node at once, asked
//! for beside a write's WRITE when they run low and collected beside a
//! later one: allocation adds no roundtrip to a write, and no wait for the
//! MS (unless a client's pool runs dry). A version's buffers are as large
//! as its key and value need (the slab's size classes, named in every
//! link: [`header`]), and a client keeps a pool per size class it writes.
//! Table 1's figures without replication of the chain: get 1, update 2
//! (the paper's 3 with replication is its all-way chaining, not done
//! here).
//!
//! # Choices the paper leaves open, and why
//!
//! - **Deletes** swing the tail's header from "tail" to "deleted" (one
//!   CAS, 1 roundtrip): a get that finds it answers deleted, an update and
//!   a delete answer not found, and an insert swings it on to a new
//!   version. So a key has one chain for ever and the MS only creates a
//!   chain for a key that never had one. A deleted key keeps its deleted
//!   tail (one group of buffers, as the index keeps its entry); the
//!   versions before it are retired as any.
//! - **Creates** go through the MS (§5): it writes the first version to
//!   the key's R nodes itself and maps the key to it in the store's index
//!   on node 0 (`RaceIndex`): insert of a new key = the RPC and the MS's
//!   WRITE, 2 roundtrips (as pDPM-Central's write).
//! - **Cursors and lookups.** The cursor is the key's entry in the
//!   client's location cache, with the address of the key's *cell*; on a
//!   miss, the MS answers the chain's head and the cell (1 roundtrip
//!   more) and the client walks from there.
//! - **Shortcuts.** The cell, a word on the key's primary, holds the
//!   chain's head, which the MS writes there as it frees versions (GC
//!   keeps it near the tail). A get reads it beside its first READ, and a
//!   cursor found recycled or too old starts again from it, one-sided,
//!   rather than from a call to the MS. The paper's shortcut is written by
//!   each writer instead; why that one is unsound once GC versions wrap,
//!   and this one is not, is in [`ms`].
//! - **Replication.** A version is written to its R nodes, and the write
//!   waits for the primary and a majority of the R copies; the chain's
//!   links exist on the primary only, and reads and CASes go there. So,
//!   as pDPM-Direct, each key is served by its primary
//!   ([`Guarantee::LinearizablePrimary`]): while it is down the key's
//!   operations fail naming it, and the crash of other nodes costs
//!   nothing. The other copies are for durability and never read (a key
//!   whose primary is lost for good is not rebuilt from them).
//! - **Untrusted memory.** Header words carry a check seeded by the key,
//!   buffers a sum seeded by the key over its key and value; every pointer
//!   and length is checked before it is used: a garbled word gives a
//!   retry, then [`KvError::Corrupt`], never a panic nor another key's
//!   value.
//!
//! # Garbage collection (pDPM §5.2)
//!
//! - **GC versions.** Every buffer has an 8-bit GC version, raised by the
//!   MS each time it hands the buffer out again: in the buffer's meta word
//!   (under its sum, [`buffer`]), in its own tail or deleted word, and in
//!   every link to it ([`header`]: offset / 64 in 33 bits, node in 5,
//!   kind in 2, GC version in 8, size class in 6, a 10-bit check). A cursor holds the GC version
//!   it expects; a READ that finds another one, or bytes whose sum fails
//!   for the key (a buffer recycled for another key, or torn between two
//!   incarnations), drops the cursor and starts again from the MS's head
//!   (`stale_gc` counts it); a CAS that commits expects the tail word with
//!   the cursor's GC version, so it fails on a recycled buffer (no ABA)
//!   and its answer, another GC version or another key's word, starts the
//!   write again from the head too.
//! - **Retire and free** ([`ms`]). The writer whose CAS links N+1 from N
//!   retires N, sent with its next ALLOC (beside a later WRITE: no
//!   roundtrip of its own; a client closing sends what waits, and gives
//!   its free groups back). The MS frees a key's versions in chain order
//!   only, moving the key's head past each (written in place to the key's
//!   head cell before), so a walk from the head never meets a recycled
//!   buffer; retires that never come (a crashed client) are found by
//!   reading the head's word when later ones pile up. A version's R
//!   copies are one *group*, freed and handed out together.
//! - **Time-outs.** A freed group is handed out again only
//!   [`REUSE_AFTER_TIMEOUTS`] read time-outs later ([`READ_TIMEOUT_NS`],
//!   or the memory's own time-out): a READ that began before the free and
//!   still samples the buffer when its new owner writes it took longer
//!   than the time-out, and a client discards such a READ (measured with
//!   its `Clock`) and reads the same cursor again (not the chain from its
//!   head: on a long chain, a slow node would make every walk start over;
//!   a node whose every READ is late fails the get as timed out, naming
//!   it). This is the paper's argument; here it
//!   is a second line, as the sum and the tail word's GC version already
//!   reject such a torn READ (the paper's reader, which reads a header
//!   and a value that are not atomic together, needs the time-out).
//! - **Wrap.** A group whose GC version wraps (255 to 0) waits
//!   [`epoch_ns`] instead (the paper's overflow list), longer than a
//!   client uses a cursor it has not found right on its own word
//!   ([`CURSOR_LIFETIME_NS`], then only with the key's cell: the paper's
//!   T_e, with no epoch message, as each client times its own cursors). So no cursor of GC version g
//!   meets the buffer's next incarnation with version g, 256 hand-outs
//!   and an epoch later. No counter here runs out: GC versions wrap under
//!   this rule, and the MS's lists hold what is freed.
//! - **Old cursors.** A cursor older than its lifetime is not used on
//!   its own word, yet most are still right: a key nobody wrote since
//!   keeps its version, and GC moves the key's head up to it. So a get
//!   READs an old cursor's buffer anyway, beside the key's cell as
//!   always, and uses it if the cell names it (same buffer, same GC
//!   version): then at the cell's read that incarnation was the key's
//!   head, linked and not freed, and a READ within the read time-out of it
//!   that finds its GC version (and a sum that holds) read that
//!   incarnation, as the MS waits an epoch between incarnations of one GC
//!   version. If the READ came before the version was linked (the two go
//!   in one roundtrip), the get takes effect at the CAS that linked it,
//!   inside its interval: the bytes are the same, and nothing links after
//!   it before. An update whose cursor is too old reads the cell beside
//!   its WRITE and CASes at the head it names. So a cursor's age costs no
//!   roundtrip while GC keeps up (Table 1's 1 and 2); a cell that names
//!   another version sends the get there (2 roundtrips), and the mutant
//!   `clover-old-cursor`, a get that uses an old cursor unvouched, returns
//!   a never-linked incarnation
//!   (`clover::tests::an_old_cursor_is_used_only_if_its_cell_names_it`).
//! - **Memory** stays flat: a store holds a version per key, the clients'
//!   pools and what was freed in the last delay ([`Clover::node_bytes`]);
//!   `clover::tests` runs 7,000 updates through a few dozen groups, with
//!   wraps, and no chunk is claimed after the warm-up. A crashed client's
//!   free groups come back when its id is claimed again ([`ms`]: the MS
//!   takes back what it lent the id's earlier holder and that holds no
//!   version). Lost for good, a bounded amount per failure: a version a
//!   crashed client wrote and had not linked, the pool of a crashed client
//!   without a lease (a fixed id), and an MS incarnation's free lists and
//!   what it had lent (a standby frees the groups it did not make without
//!   their backups, and tops them up when it hands them out).
//!
//! # Guarantee: linearizable, each key by its primary
//!
//! A key's versions form one chain on its primary, extended only by a CAS
//! that expects the tail word of the version it links from, with that
//! buffer's GC version: each CAS that succeeds makes its version the
//! latest, so the chain is the key's history in commit order, and a
//! version is whole (all its bytes written) before it can be linked. A get
//! returns the version whose header it read as the tail (or deleted): at
//! that instant it was the latest, so the get takes effect at its READ of
//! that word (header words are read atomically: one aligned word). An
//! update or delete takes effect at its CAS; one that answers not found at
//! the CAS that found "deleted". The campaigns (`systems::tests`,
//! `clover::tests`) check the histories, with small pools in half of their
//! runs (the `pool` option), so that buffers are recycled within runs.
//!
//! **With garbage collection, a get never returns a recycled buffer's
//! bytes as a value.** It returns bytes only from a READ whose sum holds
//! for the key (so they are one whole incarnation of a buffer of this
//! key), whose meta word has the cursor's GC version, and whose header
//! word is a tail (or deleted) word of that same GC version. A cursor
//! (B, g) is taken only where B held incarnation g: from the MS (its head
//! is never freed), from the key's cell (the MS writes a head there before
//! it frees what is behind it, so B was not freed when the cell was read),
//! from the client's own commit, or from a link read in
//! a buffer reached this way (a link in incarnation g of B was written
//! while B's successor lived; one in a later incarnation of B, for the
//! same key, leads to a later version still), and it is used only within
//! [`CURSOR_LIFETIME_NS`] of that, or later if the cell names it again
//! ("Old cursors" above). Incarnation g of B is the only one with
//! GC version g within an epoch, so the bytes are incarnation g's, and the
//! tail word read says that incarnation was the key's latest version at
//! that instant: a committed version (an unlinked version has a tail word
//! too, but no cursor to it exists before its CAS, and a recycled one has
//! another GC version). The mutant `clover-no-gcver` (a reader that skips
//! the check) returns such a never-linked version's bytes
//! (`clover::tests::a_recycled_buffer_is_never_read_as_a_value`), and the
//! loom check `loom-tests/tests/clover.rs` races the reads of a get with
//! such a buffer's new owner, and with two writers extending one chain,
//! through every way a WRITE can tear a READ.
//!
//! # Not done (pDPM §5 has them; they stay open)
//!
//! - **All-way chaining** across replicas (every copy of version N linked
//!   to every copy of N+1, the paper's 3-roundtrip replicated write), so
//!   that reads survive the primary's loss and can spread over replicas.
//!   The paper's version is not linearizable: its writer links the copies
//!   one by one, so a reader of a linked copy and a later reader of one not
//!   linked yet see the new and then the old value. A linearizable one
//!   needs a commit that readers of any copy agree on. The design chosen
//!   (the stop-57 note in issue #22 argues it against two others):
//!   - *Layout.* A node's group memory is cut into R columns, and the R
//!     copies of a version lie at one offset, in column j on node p + j
//!     (p the key's primary): one link word names every copy.
//!   - *Write* (3 roundtrips): WRITE the R copies (a majority, the
//!     primary's among them); CAS the primary copy of the tail from tail
//!     to an *intent* naming the new version (the paper's in-progress bit,
//!     which orders writers); CAS the backup copies from tail to a link.
//!     The version is committed once a majority of the old tail's copies
//!     name it, the intent counting for the primary; the intent becomes a
//!     link in the background.
//!   - *Read, primary up* (1 roundtrip): the primary copy's word; an
//!     intent is helped to a majority (a reader of a backup may have
//!     returned its version already) before the reader goes on.
//!   - *Read, primary down:* a majority of each version's copies, following
//!     any link among them (a committed version is linked on a majority,
//!     so every majority meets one), helping a link found on fewer. Holes
//!     in one backup's chain do not matter: a walk reads copies per
//!     version, not one backup's chain.
//!   - *Also:* the key's cell written to every copy's column; GC freeing a
//!     group only once its successor is committed; campaigns that crash the
//!     primary. Writes still need the primary; their failover needs a view
//!     change with a fence, as the replicated index's.
//! - **Shortcuts ahead of the head**: the paper's shortcut may name a
//!   version newer than the oldest one not freed (the writers write it);
//!   ours is the MS's head, which serves restarts, not a cursor that is
//!   behind (it follows links, a roundtrip per version).
//! - **Backup metadata servers**: the MS's state is the index and the
//!   head cells on node 0 (a standby takes over from them, as
//!   pDPM-Central's coordinator).

pub mod buffer;
pub mod client;
pub mod header;
pub mod ms;
pub mod wire;

#[cfg(all(test, feature = "sim"))]
mod tests;

use alloc::boxed::Box;

use crate::index::RaceIndex;
use crate::kv::{
    Choice, Guarantee, KvError, KvSystem, NodeChunks, NodeShape, Roundtrips, StoreConfig, SystemInfo, Who, seat,
};
use crate::substrate::clock::Clock;
use crate::substrate::msg::MsgError;
use crate::substrate::msg::area::Geometry;
use crate::substrate::msg::rpc::{REQUEST_HEADER, RESPONSE_HEADER};
use crate::substrate::msg::server::{self, Bare, Shell, Stats};
use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::region::HEADER_SIZE;
use crate::substrate::space::slab::{MAX_NODES, class_of, class_size};
use crate::{Memory, NodeId};

pub use client::CloverClient;
pub use ms::MetadataServer;

/// The node the metadata server runs beside (its index is there).
pub const MS: NodeId = crate::kv::place::INDEX_NODE;

/// The read time-out (pDPM §5.2: "we abort a read operation after two
/// RTTs"), ns, where the memory sets no time-out of its own: a READ of a
/// chain that takes longer is discarded and the get starts again from the
/// MS's head. Where the memory has a time-out (`Memory::timeout_ns`: the
/// longest an operation may stay pending, and land, after its posting),
/// that is the read time-out, as a READ pending longer fails anyway.
pub const READ_TIMEOUT_NS: u64 = 1_000_000;

/// The read time-out on `mem`, ns: its own time-out, or
/// [`READ_TIMEOUT_NS`].
pub fn read_timeout_ns<M: Memory>(mem: &M) -> u64 {
    mem.timeout_ns().unwrap_or(READ_TIMEOUT_NS)
}

/// A freed group is handed out again this many read time-outs after it
/// was freed: a READ posted before the free and still sampling the buffer
/// when its new owner WRITEs to it would have taken longer than the read
/// time-out (discarded), whatever the clocks' offsets (both are durations).
pub const REUSE_AFTER_TIMEOUTS: u64 = 2;

/// How long a client uses a cursor that it has not found right since on
/// its own word, ns (the paper's T_e for clients; later, only if the
/// key's cell names it): what makes the 8-bit GC version safe when it
/// wraps ([`epoch_ns`]).
pub const CURSOR_LIFETIME_NS: u64 = 100_000_000;

/// The store's option: how long a client uses a cursor on its own word
/// ([`CURSOR_LIFETIME_NS`] by default; shorter in the campaigns, so that
/// old cursors are common there). It must be longer than a roundtrip
/// takes, as a chain walk uses each link it reads a roundtrip later.
const LIFETIME: Choice = Choice {
    name: "cursor-life",
    about: "how long a client uses a cursor on its own word, after which it asks the key's cell \
            (and how long a buffer whose GC version wraps waits); longer than a roundtrip",
    values: &["100ms", "100us"],
};

/// How long a client of `cfg` uses a cursor on its own word, ns (its
/// `cursor-life` option).
pub fn cursor_lifetime_ns(cfg: &StoreConfig) -> u64 {
    match cfg.option(LIFETIME.name) {
        Some("100us") => 100_000,
        _ => CURSOR_LIFETIME_NS,
    }
}

/// How long a group whose GC version wraps (255 to 0) waits before it is
/// handed out again (the paper's overflow list), ns: longer than a cursor
/// lives and its last READ or CAS takes. So no cursor taken at GC version
/// g of a buffer meets the next incarnation with version g (256 hand-outs
/// later, one of them after this wait): no ABA.
pub fn epoch_ns<M: Memory>(mem: &M, lifetime_ns: u64) -> u64 {
    lifetime_ns + 2 * read_timeout_ns(mem)
}

/// The store's option: free groups a client keeps per node (batches it
/// fetches from the MS). Small pools recycle buffers sooner.
const POOL: Choice = Choice {
    name: "pool",
    about: "free buffer groups each client keeps per node, fetched from the metadata server in batches",
    values: &["16", "2"],
};

/// Free groups a client of `cfg` keeps per node (its `pool` option).
pub fn pool(cfg: &StoreConfig) -> usize {
    cfg.option(POOL.name).and_then(|v| v.parse().ok()).unwrap_or(client::BATCH).clamp(1, wire::MAX_BATCH)
}

/// The size class of the largest version of a store of `cfg` (its
/// longest key and largest value); an error if a link cannot name it.
pub fn largest_class(cfg: &StoreConfig) -> Result<u8, KvError> {
    buffer::class(cfg.max_key, cfg.max_value).ok_or(KvError::BadConfig(
        "values too large for Clover's buffers (8 MiB with the key and a 24-byte header at most)",
    ))
}

/// Clover.
pub struct Clover;

/// The metadata server's area for `cfg`: a channel per client id, rings
/// that carry a create of the largest value, an ALLOC with its retires and
/// groups given back, and a batch of groups for every node (the MS sends
/// fewer if more do not fit).
pub fn geometry(cfg: &StoreConfig) -> Geometry {
    let create = (REQUEST_HEADER + 1 + cfg.max_key + cfg.max_value) as u64;
    let alloc = REQUEST_HEADER
        + 3
        + wire::MAX_WANTS * (2 + MAX_NODES)
        + wire::MAX_RETIRES * (17 + cfg.max_key)
        + 8 * wire::MAX_GIVEN
        + 8;
    let group = wire::group_bytes(cfg.replicas.clamp(1, MAX_REPLICAS));
    let batch = RESPONSE_HEADER + wire::ANSWER_HEADER + MAX_NODES * (1 + group * client::BATCH);
    let create = create.max(alloc as u64);
    let batch = batch as u64;
    let mut geo = Geometry { channels: cfg.writers as u16 + 1, ring_bytes: 4096 };
    while geo.max_message() < create.max(batch) {
        geo.ring_bytes *= 2;
    }
    geo
}

/// Versions a store is sized to hold beside one per key
/// ([`KvSystem::node_bytes`]): those written during a reuse delay, freed
/// and not handed out again yet.
pub const RECYCLING: u64 = 16_384;

fn object(size: u64) -> u64 {
    class_of(size.max(1)).map_or(size, |(_, c)| c)
}

impl KvSystem for Clover {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "clover",
        about: "a chain of out-of-place versions per key, committed by a CAS of the tail's header; lock-free \
                one-sided reads, a metadata server beside node 0 for creates and allocation (pDPM §5)",
        replicated: true,
        replicated_index: false,
        rejoins: false,
        floor: false,
        guarantee: Guarantee::LinearizablePrimary,
        roundtrips: Roundtrips { get: 1, update: 2, insert: 2, delete: 1 },
        options: &[POOL, LIFETIME],
    };

    const SERVER: Option<NodeId> = Some(MS);

    /// Boxed: a client holds its cache and its pools of buffers.
    type Client<M: Memory, C: Clock> = Box<CloverClient<M, C>>;

    fn check(cfg: &StoreConfig, _: usize) -> Result<(), KvError> {
        largest_class(cfg)?;
        if geometry(cfg).check().is_err() {
            return Err(KvError::BadConfig("values too large for the metadata server's rings"));
        }
        Ok(())
    }

    /// A version per key (each as large as the largest: buffers are sized
    /// by the value they hold, so this is an upper bound), the clients'
    /// free groups (of the largest class), and the versions
    /// waiting to be recycled (garbage collection: freed versions are
    /// handed out again after a delay), at most as many as `writes`
    /// (memory stays flat however long the store runs: a store sized for
    /// [`RECYCLING`] writes in a delay serves any number), spread over
    /// the nodes; on node 0 also the index, the keys' head cells and the
    /// server area.
    fn node_bytes(cfg: &StoreConfig, nodes: usize, writes: u64) -> u64 {
        let buffer = object(buffer::size(cfg.max_key, cfg.max_value) as u64);
        let copies = (cfg.keys + writes.min(RECYCLING)) * cfg.replicas as u64;
        let values = copies.div_ceil(nodes.max(1) as u64) * buffer;
        // Versions take the size class their value needs: every class up
        // to the largest may be in use, with a pool of each in every client
        // and a chunk of each, partly used, on every node (the MS's), and
        // as much again.
        let top = largest_class(cfg).map_or(0, |c| c as usize);
        let every_class: u64 = (0..=top).map(class_size).sum();
        let pools = (cfg.writers as u64 + 1) * (pool(cfg) * nodes.max(1)) as u64 * every_class;
        let slack = 2 * (top as u64 + 3) * StoreConfig::CHUNK;
        let cells = cfg.keys * object(8);
        let total = values + pools + cells + cfg.index_bytes() + geometry(cfg).bytes() + slack;
        (total + total / 4 + HEADER_SIZE).next_multiple_of(StoreConfig::CHUNK)
    }

    /// The MS's chunks (clients allocate nothing themselves): on every
    /// node a chunk of buffers (of each size class in use: one at least)
    /// and one of keys' cells; on node 0 also its
    /// server area and a chunk of index key blocks. (With power-of-two
    /// size classes a 256-byte value's buffer took 512 bytes, and the
    /// buffers the MS carves for a few keys' groups took a second chunk.)
    fn node_chunks(cfg: &StoreConfig, _: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError> {
        if object(buffer::size(cfg.max_key, cfg.max_value) as u64) > shape.chunk {
            return Err(KvError::BadConfig("a buffer does not fit in a chunk (use bigger chunks or smaller values)"));
        }
        let own = match node == MS {
            true => 3 + geometry(cfg).bytes().div_ceil(shape.chunk),
            false => 2,
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
    ) -> Result<Box<CloverClient<M, C>>, KvError> {
        Ok(Box::new(CloverClient::open(mem, cfg, who, clock).await?))
    }

    /// The metadata server beside node 0; the bare server beside the others.
    async fn serve<M: Memory, H: Shell>(mem: M, node: NodeId, cfg: &StoreConfig, shell: &H) -> Result<Stats, MsgError> {
        if node != MS {
            return server::serve(mem, node, Geometry::default(), Bare, shell).await;
        }
        let index = RaceIndex::open(&mem, node)
            .await
            .map_err(|_| MsgError::BadConfig("no Clover index on node 0 (set the store up first)"))?;
        server::serve(mem, node, geometry(cfg), MetadataServer::new(ms::Shape::of(cfg), index), shell).await
    }
}
