//! RAW in the simulator: a copy read while it is torn (a write in flight,
//! or garbled) is read again until it is whole, for a bounded time, and
//! one that stays torn is an error that says so ([`KvError::Torn`]).

use alloc::string::ToString;
use alloc::vec::Vec;

use crate::check::kv::NODE_SIZE;
use crate::check::{SimClock, clock};
use crate::index::{Index, RaceIndex};
use crate::kv::place::{INDEX_NODE, addr_of};
use crate::kv::torn::TORN_PATIENCE_NS;
use crate::kv::{Got, KvClient, KvError, KvSystem, StoreConfig, Who};
use crate::sim::{Sim, SimConfig, SimMemory};
use crate::substrate::join::join2;
use crate::substrate::memory::read_word;
use crate::systems::from_name;
use crate::{Memory, RemoteAddr};

use super::{Raw, RawClient};

const MS: u64 = 1_000_000;

/// Three nodes, 2 µs roundtrips, a RAW store set up.
fn setup() -> (Sim, StoreConfig) {
    let mut cfg = StoreConfig::new(from_name("raw").unwrap(), 64);
    cfg.max_key = 16;
    cfg.max_value = 64;
    cfg.writers = 2;
    let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE_SIZE, ..SimConfig::default() }.fixed_latency(2_000));
    crate::check::kv::setup(&mut sim, &cfg).unwrap();
    (sim, cfg)
}

/// A client that inserted `k`, and `k`'s copy torn: the address and the
/// right value of the word garbled (its checksum).
async fn torn_copy(mem: &SimMemory, cfg: &StoreConfig) -> (RawClient<SimMemory, SimClock>, RemoteAddr, u64) {
    let mut a = *Raw::connect(mem.clone(), cfg, Who::Id(1), clock(mem, 0)).await.unwrap();
    a.insert(b"k", b"value").await.unwrap();
    let mut index = RaceIndex::open(mem, INDEX_NODE).await.unwrap();
    let copy = addr_of(index.lookup(mem, b"k").await.unwrap().unwrap().location, 3).unwrap();
    let at = RemoteAddr::new(copy.node, copy.offset + 8);
    let sum = read_word(mem, at).await.unwrap();
    mem.write(at, &(sum ^ 1).to_le_bytes()).await.unwrap();
    (a, at, sum)
}

fn found(g: Result<Got<crate::substrate::value::Value<Vec<u8>>>, KvError>) -> Result<Option<Vec<u8>>, KvError> {
    g.map(|g| match g {
        Got::Found(v) => Some(v.to_vec()),
        _ => None,
    })
}

/// A copy torn for 5 ms (as a write that keeps landing on it would leave
/// it, many reads in a row): the get reads it again until it is whole and
/// answers its value, never an error. A fixed number of tries at once
/// (what RAW did) gives up within microseconds.
#[test]
fn a_copy_torn_for_a_while_is_read_once_it_is_whole() {
    let (mut sim, cfg) = setup();
    let mem = sim.client();
    sim.block_on(async move {
        let (mut a, at, sum) = torn_copy(&mem, &cfg).await;
        let t0 = mem.now();
        let mend = async {
            mem.sleep(5 * MS).await;
            mem.write(at, &sum.to_le_bytes()).await.unwrap();
        };
        let (got, ()) = join2(a.get(b"k"), mend).await;
        let got = found(got);
        assert_eq!(got, Ok(Some(b"value".to_vec())), "answered {got:?}");
        let took = mem.now() - t0;
        assert!((5 * MS..7 * MS).contains(&took), "answered {took} ns after the first read, the copy whole at 5 ms");
    })
    .unwrap();
}

/// A copy that stays torn (its writer died mid-write: RAW cannot repair
/// it): the get gives up after [`TORN_PATIENCE_NS`], naming the reads and
/// the time, with pauses between its reads (tens of reads, not tens of
/// thousands); the key reads again once the copy is whole.
#[test]
fn a_copy_torn_for_good_is_an_error_that_says_so() {
    let (mut sim, cfg) = setup();
    let mem = sim.client();
    sim.block_on(async move {
        let (mut a, at, sum) = torn_copy(&mem, &cfg).await;
        let t0 = mem.now();
        let got = a.get(b"k").await;
        let took = mem.now() - t0;
        let Err(KvError::Torn { reads, ms }) = got else { panic!("{got:?}") };
        assert!(ms >= TORN_PATIENCE_NS / MS && took < TORN_PATIENCE_NS + 3 * MS, "{ms} ms, took {took} ns");
        assert!((10..200).contains(&reads), "{reads} reads");
        let shown = KvError::Torn { reads, ms }.to_string();
        assert!(shown.contains(&alloc::format!("{reads} reads in {ms} ms")), "{shown}");
        mem.write(at, &sum.to_le_bytes()).await.unwrap();
        assert_eq!(found(a.get(b"k").await), Ok(Some(b"value".to_vec())));
    })
    .unwrap();
}
