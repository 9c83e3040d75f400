//! DM-ABD, the SWARM paper's replicated baseline (§2.3, §7): ABD over
//! 2f+1 nodes, values out of place, one CAS-emulated max word per replica;
//! two roundtrips per get and per update. The store is the
//! replicated-register store of [`crate::kv::replicated`], with ABD
//! ([`crate::baselines::abd`]) as its protocol.

use crate::Memory;
use crate::baselines::abd;
use crate::kv::replicated::Protocol;
use crate::kv::{Guarantee, KvError, Roundtrips, StoreConfig, SystemInfo};
use crate::substrate::clock::Clock;
use crate::substrate::value::Value;
use crate::swarm::client::ClientCtx;
use crate::swarm::inout::Layout;
use crate::swarm::maxreg::{RegCache, RegError, Register};
use crate::swarm::meta::Meta;

/// DM-ABD.
pub struct DmAbd;

impl Protocol for DmAbd {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "dm-abd",
        about: "ABD over 2f+1 nodes, values out of place: 2-roundtrip gets and updates, linearizable (SWARM §2.3, §7)",
        replicated: true,
        replicated_index: true,
        rejoins: true,
        floor: false,
        guarantee: Guarantee::Linearizable,
        roundtrips: Roundtrips { get: 2, update: 2, insert: 3, delete: 2 },
        options: &[],
    };

    /// Values out of place; the metadata word points to them (SWARM §7).
    fn layout(cfg: &StoreConfig) -> Result<Layout, KvError> {
        abd::layout(cfg.max_value as u64).map_err(|_| KvError::BadConfig("values may have at most 64 KiB"))
    }

    async fn read<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
    ) -> Result<(Meta, Value<M::Buf>), RegError> {
        abd::read(ctx, mem, reg, rc).await
    }

    async fn write<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
        value: &[u8],
    ) -> Result<(), RegError> {
        abd::write(ctx, mem, reg, rc, value).await.map(|_| ())
    }
}
