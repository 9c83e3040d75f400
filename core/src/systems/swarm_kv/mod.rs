//! SWARM-KV (SWARM §5): a Safe-Guess register per key, replicated on the
//! key's 2f+1 nodes, located through the index and cached by clients, so
//! that gets and updates take one roundtrip in the common case while staying
//! linearizable and wait-free. The store itself is the replicated-register
//! store of [`crate::kv::replicated`]; this folder declares it and plugs in
//! its protocol, Safe-Guess over In-n-Out ([`crate::swarm::safeguess`]).

use crate::Memory;
use crate::kv::replicated::Protocol;
use crate::kv::{Choice, Guarantee, KvError, Roundtrips, StoreConfig, SystemInfo};
use crate::substrate::clock::Clock;
use crate::substrate::value::Value;
use crate::swarm::client::ClientCtx;
use crate::swarm::inout::Layout;
use crate::swarm::maxreg::{RegCache, RegError, Register};
use crate::swarm::meta::Meta;
use crate::swarm::safeguess;

/// SWARM-KV.
pub struct SwarmKv;

/// Most metadata words per In-n-Out object: one per writer up to this many
/// (SWARM §4.4), then writers share words (`client mod words`).
pub const MAX_META_WORDS: u32 = 8;

/// Where SWARM-KV keeps in-place copies of values (SWARM §4, §6): its
/// option `in-place`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InPlace {
    /// On the key's first replica only (the paper's implementation, §6):
    /// a third of the memory for values, and majorities start there.
    #[default]
    First,
    /// On every replica (§4 as written): a get stays one roundtrip whichever
    /// majority answers.
    Every,
}

/// SWARM-KV's options.
const OPTIONS: &[Choice] = &[Choice {
    name: "in-place",
    about: "which replicas keep an in-place copy of the value: the first (the paper's implementation, §6) or every one (§4)",
    values: &["first", "every"],
}];

impl InPlace {
    /// The choice in `cfg`.
    pub fn of(cfg: &StoreConfig) -> InPlace {
        if cfg.options.get(0) == 1 { InPlace::Every } else { InPlace::First }
    }
}

impl Protocol for SwarmKv {
    const INFO: &'static SystemInfo = &SystemInfo {
        name: "swarm-kv",
        about: "a Safe-Guess register per key over 2f+1 nodes: 1-roundtrip gets and updates, linearizable (SWARM §5)",
        replicated: true,
        replicated_index: true,
        rejoins: true,
        floor: false,
        guarantee: Guarantee::Linearizable,
        roundtrips: Roundtrips { get: 1, update: 1, insert: 3, delete: 2 },
        options: OPTIONS,
    };

    /// One metadata word per writer (up to [`MAX_META_WORDS`]), the value in
    /// place on the first replica or on all.
    fn layout(cfg: &StoreConfig) -> Result<Layout, KvError> {
        let words = (cfg.writers as u32).clamp(1, MAX_META_WORDS);
        let layout = Layout::new(words, cfg.max_value as u64)
            .map_err(|_| KvError::BadConfig("values may have at most 64 KiB"))?;
        Ok(if InPlace::of(cfg) == InPlace::First { layout.in_place_on_first() } else { layout })
    }

    async fn read<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
    ) -> Result<(Meta, Value<M::Buf>), RegError> {
        safeguess::read(ctx, mem, reg, rc).await
    }

    async fn write<M: Memory, C: Clock>(
        ctx: &mut ClientCtx<C>,
        mem: &M,
        reg: &Register,
        rc: &mut RegCache,
        value: &[u8],
    ) -> Result<(), RegError> {
        safeguess::write(ctx, mem, reg, rc, value).await.map(|_| ())
    }
}
