//! The systems of the toolkit, one folder each, and the registry that lists
//! them: the one place a system is registered.
//!
//! | system | folder | what |
//! |---|---|---|
//! | `raw` | [`raw`] | one unreplicated copy, the latency floor (SWARM §7) |
//! | `dm-abd` | [`dm_abd`] | ABD over 2f+1 nodes (SWARM §2.3, §7) |
//! | `swarm-kv` | [`swarm_kv`] | Safe-Guess per key over 2f+1 nodes (SWARM §5) |
//! | `pdpm-direct` | [`pdpm_direct`] | committed and redo spaces over 2f+1 nodes, a leased lock on the primary (pDPM §4.1) |
//! | `pdpm-central` | [`pdpm_central`] | a coordinator beside node 0 orders every access (pDPM §4.2) |
//! | `clover` | [`clover`] | per-key chains of out-of-place versions committed by CAS, a metadata server beside node 0 (pDPM §5) |
//! | `fusee` | [`fusee`] | immutable objects out of place, a SNAPSHOT-replicated index, cached entries (FUSEE §4) |
//!
//! # Adding a system
//!
//! Write its folder here: a type implementing [`KvSystem`] (its
//! [`SystemInfo`], configuration check, sizing, `format` and `connect`),
//! and add that type to the `registry!` line below. The harness (`swarm
//! bench --systems`), `swarm kv init --system`, the backend suites and the
//! simulator campaigns list systems from [`ALL`] and reach their code
//! through [`visit`]; `registry_walk` tests in `backend-shm` run the
//! key-value suite and a campaign for every entry.

use alloc::boxed::Box;
use core::future::Future;
use core::ops::ControlFlow;
use core::pin::Pin;

#[cfg(doc)]
use crate::kv::SystemInfo;
use crate::kv::place::lease_nodes;
use crate::kv::record::{self, Found, Record};
use crate::kv::{AnyClient, KvError, KvSystem, StoreConfig, System, Visit, Who};
use crate::substrate::clock::Clock;
use crate::substrate::late::in_turn;
use crate::substrate::lease::{self, Held, LeaseError, LeaseTable, Want};
use crate::substrate::msg::MsgError;
use crate::substrate::msg::server::{Shell, Stats};
use crate::substrate::quorum::MAX_REPLICAS;
use crate::substrate::space::{Region, roots};
use crate::substrate::value::Value;
use crate::{Memory, NodeId};

pub mod clover;
pub mod dm_abd;
pub mod fusee;
pub mod pdpm_central;
pub mod pdpm_direct;
pub mod raw;
pub mod swarm_kv;

#[cfg(all(test, feature = "sim"))]
mod edge_tests;
#[cfg(all(test, feature = "sim"))]
mod tests;

/// Declares the registered systems: [`ALL`] and [`visit`].
macro_rules! registry {
    ($($system:ty),+ $(,)?) => {
        /// Every registered system, in the order reports list them.
        pub const ALL: &[System] = &[$(System::of::<$system>()),+];

        /// Runs `v` with the type of `system`.
        pub fn visit<V: Visit>(system: System, v: V) -> V::Out {
            $(if system == System::of::<$system>() {
                return v.visit::<$system>();
            })+
            // `System` values are made by this registry only.
            unreachable!("{system} is not registered")
        }
    };
}

registry![
    raw::Raw,
    dm_abd::DmAbd,
    swarm_kv::SwarmKv,
    pdpm_direct::PdpmDirect,
    pdpm_central::PdpmCentral,
    clover::Clover,
    fusee::Fusee
];

/// The system called `name`.
pub fn from_name(name: &str) -> Option<System> {
    ALL.iter().copied().find(|s| s.name() == name)
}

/// The names of every system, comma-separated (for messages).
pub fn names() -> alloc::string::String {
    ALL.iter().map(|s| s.name()).collect::<alloc::vec::Vec<_>>().join(", ")
}

/// A boxed future of a visit (its type depends on the system).
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Sets up a store of shape `cfg` on the formatted nodes of `mem` (see
/// [`KvSystem::format`]) and records its configuration and the clients'
/// clock epoch (`epoch_us`, µs since the Unix epoch) on every node
/// ([`crate::kv::record`]), so that [`open`] finds it. On nodes that hold a
/// store already: nothing changes if it has the same configuration, and
/// otherwise the error says so.
pub async fn format<M: Memory>(mem: &M, cfg: &StoreConfig, epoch_us: u64) -> Result<(), KvError> {
    cfg.check(mem.node_count())?;
    let same = |r: &Record| StoreConfig { cache_capacity: cfg.cache_capacity, ..r.config.clone() } == *cfg;
    if let Found::Record(r) = record::read(mem, NodeId(0), from_name).await?
        && !same(&r)
    {
        return Err(KvError::BadConfig("the nodes hold a store of another configuration"));
    }
    struct Setup<'a, M> {
        mem: &'a M,
        cfg: &'a StoreConfig,
    }
    impl<'a, M: Memory> Visit for Setup<'a, M> {
        type Out = Boxed<'a, Result<(), KvError>>;
        fn visit<S: KvSystem>(self) -> Self::Out {
            Box::pin(S::format(self.mem, self.cfg))
        }
    }
    visit(cfg.system, Setup { mem, cfg }).await?;
    for n in 0..lease_nodes(cfg, mem.node_count()) {
        let node = NodeId(n as u16);
        if Region::read_root(mem, node, roots::LEASES).await? == 0 {
            lease::format(mem, node, cfg.writers, cfg.lease_ms as u64 * 1_000_000).await.map_err(|e| match e {
                LeaseError::Region(e) => e.into(),
                LeaseError::Mem(e) => e.into(),
                e => KvError::Lease(e),
            })?;
        }
    }
    let mine = Record { config: cfg.clone(), epoch_us };
    for n in 0..mem.node_count() {
        let node = NodeId(n as u16);
        if !record::write(mem, node, &mine).await? {
            match record::read(mem, node, from_name).await? {
                Found::Record(r) if same(&r) => {}
                Found::Claimed => return Err(KvError::BadConfig("another process is setting up a store here")),
                _ => return Err(KvError::BadConfig("the nodes hold a store of another configuration")),
            }
        }
    }
    Ok(())
}

/// The configuration of the store on `mem`, from the first node whose
/// record can be read: node 0, unless it is down or late, then the next.
/// Every command and client starts here: a stalled node is passed over
/// once it is late ([`in_turn`]), not waited for until its time-out. The
/// cache capacity is the caller's to choose (it starts as
/// [`StoreConfig::new`]'s).
pub async fn open<M: Memory>(mem: &M) -> Result<Record, KvError> {
    let mut last = KvError::NoStore;
    let ask = |n: usize| record::read(mem, NodeId(n as u16), from_name);
    let found = in_turn(mem, mem.node_count(), ask, |found| match found {
        Ok(Found::Record(r)) => ControlFlow::Break(r.config.check(mem.node_count()).map(|()| r)),
        Ok(Found::Empty | Found::Claimed) => ControlFlow::Break(Err(KvError::NoStore)),
        Err(e @ (KvError::Unavailable | KvError::Down(_))) => {
            last = e;
            ControlFlow::Continue(())
        }
        Err(e) => ControlFlow::Break(Err(e)),
    })
    .await;
    found.unwrap_or(Err(last))
}

/// Claims a client id of the store of shape `cfg` on `mem` from its lease
/// table: `want`, or the lowest free one. `nonce` tells this claimer from
/// others (a process id). The id is the client's until it closes, or its
/// lease expires if it stops renewing it ([`crate::substrate::lease`]).
pub async fn claim<M: Memory, C: Clock>(
    mem: &M,
    cfg: &StoreConfig,
    clock: &C,
    want: Want,
    nonce: u32,
) -> Result<Held, KvError> {
    let nodes: heapless::Vec<NodeId, MAX_REPLICAS> =
        (0..lease_nodes(cfg, mem.node_count()).min(MAX_REPLICAS)).map(|n| NodeId(n as u16)).collect();
    let table = LeaseTable::open(mem, &nodes).await.map_err(KvError::Lease)?;
    table.claim(mem, clock, want, nonce).await.map_err(KvError::Lease)
}

/// Serves the server role of `cfg`'s system beside node `node` until
/// `shell` says stop ([`KvSystem::serve`]; the bare server for systems
/// without one).
pub async fn serve<M: Memory, H: Shell>(mem: M, node: NodeId, cfg: &StoreConfig, shell: &H) -> Result<Stats, MsgError> {
    struct Serve<'a, M, H> {
        mem: M,
        node: NodeId,
        cfg: &'a StoreConfig,
        shell: &'a H,
    }
    impl<'a, M: Memory + 'a, H: Shell> Visit for Serve<'a, M, H> {
        type Out = Boxed<'a, Result<Stats, MsgError>>;
        fn visit<S: KvSystem>(self) -> Self::Out {
            Box::pin(S::serve(self.mem, self.node, self.cfg, self.shell))
        }
    }
    visit(cfg.system, Serve { mem, node, cfg, shell }).await
}

/// Runs `f` while the server that `cfg`'s system needs
/// ([`KvSystem::SERVER`]: pDPM-Central's coordinator) serves beside its
/// node on a thread of its own, with a memory from `make`, as `swarm
/// serve` would; just `f` for a system without one.
#[cfg(feature = "std")]
pub fn with_server<M: Memory, F: Fn() -> M + Sync, T>(cfg: &StoreConfig, make: &F, f: impl FnOnce() -> T) -> T {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(node) = cfg.system.server() else { return f() };
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let shell = crate::substrate::msg::server::ThreadShell::new(stop.clone());
        let server = s.spawn(move || crate::substrate::exec::block_on(serve(make(), node, cfg, &shell)));
        let out = f();
        stop.store(true, Ordering::Relaxed);
        let _ = server.join();
        out
    })
}

/// Connects a client of the store of shape `cfg`, whichever system it is,
/// behind one client type (each operation's future boxed: for callers off
/// the measured path; the harness uses [`visit`]).
pub async fn connect_any<'a, M: Memory + 'a, C: Clock + 'a>(
    mem: M,
    cfg: &StoreConfig,
    who: Who,
    clock: C,
) -> Result<AnyClient<'a, Value<M::Buf>>, KvError> {
    struct Connect<'c, 'a, M, C> {
        mem: M,
        cfg: &'c StoreConfig,
        who: Who,
        clock: C,
        client: core::marker::PhantomData<&'a ()>,
    }
    impl<'c, 'a: 'c, M: Memory + 'a, C: Clock + 'a> Visit for Connect<'c, 'a, M, C> {
        type Out = Boxed<'c, Result<AnyClient<'a, Value<M::Buf>>, KvError>>;
        fn visit<S: KvSystem>(self) -> Self::Out {
            Box::pin(async move { Ok(AnyClient::new(S::connect(self.mem, self.cfg, self.who, self.clock).await?)) })
        }
    }
    visit(cfg.system, Connect { mem, cfg, who, clock, client: core::marker::PhantomData }).await
}
