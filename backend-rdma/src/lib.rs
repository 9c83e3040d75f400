//! RDMA verbs as memory nodes: a memory-node daemon and a client.
//!
//! - [`RdmaMemory`] is the core's [`Memory`](swarm_core::Memory) over a
//!   [`Nic`]: one reliable-connected queue pair per memory node, ordered
//!   pipelines as one doorbell batch, completions polled inside the
//!   futures, registered buffers owned by the backend until their
//!   completion arrives.
//! - [`daemon::serve`] is the memory node's bootstrap server (TCP): it
//!   accepts clients, exchanges queue-pair endpoints ([`bootstrap`]) and
//!   holds each client's queue pair while it is connected.
//! - [`config::ClusterConfig`] is the cluster file (TOML) that lists the
//!   memory nodes, shared by `swarm bench --backend rdma` and any client.
//! - [`softnic::SoftNic`] puts the [`Nic`] interface over memory nodes in
//!   this process (a `swarm-mapped` handle, with its fault injection), so
//!   everything above runs and is tested without hardware.
//! - Read results are `swarm-mapped`'s pooled read buffers
//!   ([`swarm_mapped::MappedBuf`]), filled from the registered arena when
//!   their completion arrives: the buffers of the shared-memory and CXL
//!   backends too.
//! - With the `verbs` feature, `verbs` drives real hardware through
//!   rdma-core; without it, [`verbs_unavailable`] says how to build it.
//!
//! See this crate's README for running memory nodes and clients.

pub mod arena;
pub mod bootstrap;
pub mod client;
pub mod config;
pub mod daemon;
pub mod nic;
pub mod softnic;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use client::{DEFAULT_TIMEOUT, RdmaMemory};
pub use config::ClusterConfig;
pub use nic::Nic;

/// What to tell a user of a build without the `verbs` feature.
pub fn verbs_unavailable() -> String {
    "this build has no RDMA support: rebuild with `cargo build --release -p swarm-cli --features rdma` \
     (needs rdma-core: run scripts/install-deps.sh, or install cmake clang libclang-dev pkg-config \
     libibverbs-dev libnl-3-dev libnl-route-3-dev)"
        .into()
}
