//! How a key-value system is declared: once, in its own folder under
//! `systems/`, as a type implementing [`KvSystem`], and registered in one
//! line of `systems::registry!`. The YCSB harness, `swarm bench
//! --systems`, `swarm kv init --system`, the backend suites and the
//! simulator campaigns all list systems from the registry, so a new system
//! is benchmarked and checked the moment it is registered.
//!
//! A declaration has two halves:
//! - what can be known without a memory: [`SystemInfo`] (name, what it is,
//!   whether it replicates, its consistency model, its options) and the
//!   configuration check and sizing of [`KvSystem`]; [`System`] is a
//!   runtime handle on them that callers pass around and compare;
//! - what runs over a memory: [`KvSystem::format`] and
//!   [`KvSystem::connect`], generic over the backend. Code that holds a
//!   [`System`] reaches them through `systems::visit`, which calls a
//!   [`Visit`] with the system's type, so that the hot path stays
//!   statically dispatched.

use core::fmt;
use core::future::Future;
use core::hash::{Hash, Hasher};

use super::config::{Choice, NodeChunks, NodeShape, StoreConfig};
use super::{KvClient, KvError};
use crate::substrate::clock::Clock;
use crate::substrate::lease::Held;
#[cfg(feature = "alloc")]
use crate::substrate::msg::{
    MsgError,
    area::Geometry,
    server::{self, Bare, Shell, Stats},
};
use crate::substrate::value::Value;
use crate::{Memory, NodeId};

/// The consistency a system promises, which the campaigns check its
/// histories against (`swarm-lincheck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guarantee {
    /// Linearizable, deleted keys unmapped in the background
    /// (`swarm_lincheck::Kv::lazy_unmap`), through crashes of any
    /// minority of the nodes that hold its values.
    Linearizable,
    /// Linearizable, as [`Guarantee::Linearizable`], but each key is served
    /// by one node among its replicas, its *primary*, which holds what
    /// orders its operations (pDPM-Direct's lock, pDPM §4.1) and answers
    /// its reads: while a key's primary is down, its operations fail with
    /// [`KvError::Down`](super::KvError::Down) naming that node (they may
    /// or may not have taken effect), and the crash of any minority of its
    /// other replicas costs nothing. Its campaigns crash a minority of the
    /// nodes that hold no index, as for [`Guarantee::Linearizable`], and
    /// accept exactly those failures.
    LinearizablePrimary,
    /// No concurrency control (RAW): linearizable only while each key is
    /// used by one client at a time; a node's crash loses its keys. Its
    /// campaigns give every key one client and crash no node.
    OneClientPerKey,
}

impl Guarantee {
    /// Whether clients may share keys (a linearizable store): suites and
    /// campaigns then give every client every key, and otherwise each key
    /// one client.
    pub fn shares_keys(self) -> bool {
        self != Guarantee::OneClientPerKey
    }

    /// Whether every operation goes on through the crash of any minority
    /// of the nodes that hold its key's values.
    pub fn survives_minority(self) -> bool {
        self == Guarantee::Linearizable
    }
}

/// Sequential roundtrips of a system's operations when a client works
/// alone on a key whose location it has cached: the figures the papers
/// compare (SWARM Table 2, Clover Table 1), which the registry's tests
/// check and reports can quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roundtrips {
    /// A get.
    pub get: u32,
    /// An update.
    pub update: u32,
    /// An insert of a new key.
    pub insert: u32,
    /// A delete.
    pub delete: u32,
}

/// What can be known of a system without a memory.
#[derive(Debug)]
pub struct SystemInfo {
    /// The name reports and flags use, lower case with dashes.
    pub name: &'static str,
    /// What it is, in a line, with the paper section it reproduces.
    pub about: &'static str,
    /// Whether values are replicated (`StoreConfig::replicas` applies).
    pub replicated: bool,
    /// Whether its index is replicated too, so that the store survives the
    /// crash of any minority of its nodes (`crate::index::snapshot`), or
    /// kept on [`crate::kv::place::INDEX_NODE`] alone.
    pub replicated_index: bool,
    /// Whether a crashed node that comes back with its memory (a restart
    /// over persistent memory, a healed partition) is taken into use
    /// again, having missed what was written meanwhile. The campaigns
    /// bring crashed nodes back for such systems.
    pub rejoins: bool,
    /// Whether this is the latency floor the others are compared to (RAW):
    /// reports give every figure as a ratio to it.
    pub floor: bool,
    /// What its histories must satisfy.
    pub guarantee: Guarantee,
    /// Its operations' roundtrips in the common case.
    pub roundtrips: Roundtrips,
    /// The options it takes (`StoreConfig::set_option`).
    pub options: &'static [Choice],
}

/// Who a client is: an id it was given (the caller makes sure no other live
/// client has it: tests, one process that owns the store), or a lease on an
/// id claimed from the store's lease table (`systems::claim`), which it
/// renews while it runs and gives back when it closes.
#[derive(Debug)]
// Made once per client and moved into it: no reason to box the lease.
#[allow(clippy::large_enum_variant)]
pub enum Who {
    /// A fixed id.
    Id(u8),
    /// A leased id.
    Lease(Held),
}

impl Who {
    /// The id.
    pub fn id(&self) -> u8 {
        match self {
            Who::Id(id) => *id,
            Who::Lease(h) => h.id,
        }
    }
}

/// One client of a system's store, beside its operations: the memory it
/// works on (a `Counted` one tells each operation's roundtrips) and its id.
pub trait Handle {
    /// Its memory.
    type Mem;
    /// The memory this client works on.
    fn mem(&self) -> &Self::Mem;
    /// The client's id.
    fn id(&self) -> u8;
}

#[cfg(feature = "alloc")]
impl<H: Handle + ?Sized> Handle for alloc::boxed::Box<H> {
    type Mem = H::Mem;

    fn mem(&self) -> &H::Mem {
        (**self).mem()
    }

    fn id(&self) -> u8 {
        (**self).id()
    }
}

/// A key-value system of the toolkit.
pub trait KvSystem: 'static {
    /// What can be known of it without a memory.
    const INFO: &'static SystemInfo;

    /// One client of its store over memory `M`, with clock `C`.
    type Client<M: Memory, C: Clock>: KvClient<Value = Value<M::Buf>> + Handle<Mem = M>;

    /// The node whose server this system's clients need running (its
    /// coordinator or metadata server), if any: the campaigns, the
    /// harness and the backend suites start [`KvSystem::serve`] beside it
    /// before clients connect. `None` (the default) for systems of
    /// passive memory only.
    const SERVER: Option<NodeId> = None;

    /// Checks what this system needs of a configuration that passed the
    /// checks every store shares ([`StoreConfig::check`] calls it).
    fn check(cfg: &StoreConfig, nodes: usize) -> Result<(), KvError>;

    /// Bytes each of `nodes` nodes needs for `cfg.keys` keys and `writes`
    /// writes by all clients together, region header and spare included.
    fn node_bytes(cfg: &StoreConfig, nodes: usize, writes: u64) -> u64;

    /// Chunks this system takes on node `node` of a cluster of `nodes`
    /// nodes shaped `shape`, beyond what every store takes there (the
    /// region header, the log directory the nodes hold, the lease table,
    /// the index: [`StoreConfig::min_node_bytes`] counts those):
    /// its own structures, and what one client claims there to write one
    /// key of `cfg.max_value` bytes. Each size class a client carves takes a
    /// chunk of its own on each node, and a client's keys may land on any
    /// node. An error names an object that no chunk of `shape` can hold.
    fn node_chunks(cfg: &StoreConfig, nodes: usize, node: NodeId, shape: &NodeShape) -> Result<NodeChunks, KvError>;

    /// Sets up the store on every node of `mem`, once, by one client,
    /// after `Region::format` of each node (with [`StoreConfig::CHUNK`]
    /// chunks, or any size that holds a value). Running it again on a
    /// formatted cluster changes nothing.
    fn format<M: Memory>(mem: &M, cfg: &StoreConfig) -> impl Future<Output = Result<(), KvError>>;

    /// Connects a client (its id in `1..=cfg.writers`) to the store that
    /// [`KvSystem::format`] set up.
    fn connect<M: Memory, C: Clock>(
        mem: M,
        cfg: &StoreConfig,
        who: Who,
        clock: C,
    ) -> impl Future<Output = Result<Self::Client<M, C>, KvError>>;

    /// Serves this system's server role beside memory node `node` until
    /// `shell` says stop ([`crate::substrate::msg::server`]): an allocator,
    /// a coordinator, a metadata server. A system that needs no CPU beside
    /// memory keeps the default: the bare server, which answers pings and
    /// its statistics, so that `swarm serve` works on every store.
    #[cfg(feature = "alloc")]
    fn serve<M: Memory, H: Shell>(
        mem: M,
        node: NodeId,
        cfg: &StoreConfig,
        shell: &H,
    ) -> impl Future<Output = Result<Stats, MsgError>> {
        let _ = cfg;
        server::serve(mem, node, Geometry::default(), Bare, shell)
    }
}

/// Code to run with a system's type: `systems::visit` calls
/// [`Visit::visit`] with the type of the [`System`] it is given.
pub trait Visit {
    /// What the visit gives.
    type Out;
    /// Runs with system `S`.
    fn visit<S: KvSystem>(self) -> Self::Out;
}

/// A registered system: its [`SystemInfo`] and the parts of its
/// declaration that need no memory. Made by the registry
/// (`systems::ALL`, `systems::from_name`); compared by name.
#[derive(Clone, Copy)]
pub struct System {
    info: &'static SystemInfo,
    server: Option<NodeId>,
    check: fn(&StoreConfig, usize) -> Result<(), KvError>,
    node_bytes: fn(&StoreConfig, usize, u64) -> u64,
    node_chunks: fn(&StoreConfig, usize, NodeId, &NodeShape) -> Result<NodeChunks, KvError>,
}

impl System {
    /// The handle of system `S` (the registry makes these).
    #[cfg(feature = "alloc")]
    pub(crate) const fn of<S: KvSystem>() -> System {
        System {
            info: S::INFO,
            server: S::SERVER,
            check: S::check,
            node_bytes: S::node_bytes,
            node_chunks: S::node_chunks,
        }
    }

    /// Its declaration.
    pub fn info(self) -> &'static SystemInfo {
        self.info
    }

    /// Its name, lower case with dashes (`raw`, `dm-abd`, `swarm-kv`).
    pub fn name(self) -> &'static str {
        self.info.name
    }

    /// Whether values are replicated.
    pub fn replicated(self) -> bool {
        self.info.replicated
    }

    /// Whether its index is replicated (any minority of nodes may crash).
    pub fn replicated_index(self) -> bool {
        self.info.replicated_index
    }

    /// Whether a crashed node that comes back is taken into use again.
    pub fn rejoins(self) -> bool {
        self.info.rejoins
    }

    /// Whether this is the latency floor reports compare to.
    pub fn is_floor(self) -> bool {
        self.info.floor
    }

    /// The node whose server its clients need ([`KvSystem::SERVER`]).
    pub fn server(self) -> Option<NodeId> {
        self.server
    }

    /// Its consistency model.
    pub fn guarantee(self) -> Guarantee {
        self.info.guarantee
    }

    /// The options it declares.
    pub fn options(self) -> &'static [Choice] {
        self.info.options
    }

    pub(crate) fn check(self, cfg: &StoreConfig, nodes: usize) -> Result<(), KvError> {
        (self.check)(cfg, nodes)
    }

    pub(crate) fn node_bytes(self, cfg: &StoreConfig, nodes: usize, writes: u64) -> u64 {
        (self.node_bytes)(cfg, nodes, writes)
    }

    pub(crate) fn node_chunks(
        self,
        cfg: &StoreConfig,
        nodes: usize,
        node: NodeId,
        shape: &NodeShape,
    ) -> Result<NodeChunks, KvError> {
        (self.node_chunks)(cfg, nodes, node, shape)
    }
}

impl PartialEq for System {
    fn eq(&self, other: &System) -> bool {
        self.name() == other.name()
    }
}

impl Eq for System {}

impl Hash for System {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.name().hash(h)
    }
}

impl fmt::Debug for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
