//! Recycling in a store: a client's log stays bounded however much it
//! writes, and nothing it recycled is ever read as a value.

use alloc::format;
use alloc::vec::Vec;

use crate::check::clock;
use crate::check::kv::CHUNK;
use crate::kv::{AnyClient, Got, KvClient, StoreConfig, Who};
use crate::sim::{Sim, SimConfig};
use crate::substrate::clock::Clock;
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::{HEADER_SIZE, Region};
use crate::swarm::client::Paths;
use crate::systems::{connect_any, format, from_name};
use crate::{Memory, NodeId};

const NODE: u64 = 4 << 20;

fn config(name: &str, keys: u64) -> StoreConfig {
    let mut cfg = StoreConfig::new(from_name(name).unwrap(), keys);
    cfg.replicas = 3;
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = 4;
    cfg.cache_capacity = 64;
    cfg
}

/// Bytes claimed from the nodes' regions (chunks handed out), in all.
async fn claimed<M: Memory>(mem: &M, nodes: usize) -> u64 {
    let mut total = 0;
    for n in 0..nodes {
        total += Region::open(mem, NodeId(n as u16)).await.unwrap().cursor - HEADER_SIZE;
    }
    total
}

fn value(key: u64, seq: u64) -> Vec<u8> {
    format!("k{key}-v{seq:08}").into_bytes()
}

/// One client updates 16 keys 30,000 times, about 30 MB of log entries
/// over nodes of 4 MiB: with recycling (its `keep` between operations)
/// the memory it claims stops growing once its log has warmed up, and a
/// fresh client reads every key's last value.
#[test]
fn a_client_s_log_stays_bounded_as_it_writes() {
    for name in ["swarm-kv", "dm-abd"] {
        let cfg = config(name, 64);
        let mut sim = Sim::new(SimConfig { nodes: 3, node_size: NODE, ..SimConfig::default() }.fixed_latency(2_000));
        let admin = sim.client();
        let c = cfg.clone();
        sim.block_on(async move {
            for n in 0..3 {
                Region::format_fresh(&admin, NodeId(n), NODE, CHUNK).await.unwrap();
            }
            format(&admin, &c, 1).await.unwrap();
        })
        .unwrap();
        let (mem, check) = (Counted::new(sim.client()), Counted::new(sim.client()));
        let c = cfg.clone();
        let (warm, end, paths) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mem, &c, Who::Id(1), clock(mem.inner(), 0)).await.unwrap();
                let mut warm = 0;
                for seq in 0..30_000u64 {
                    let key = format!("key{}", seq % 16).into_bytes();
                    s.insert(&key, &value(seq % 16, seq)).await.unwrap_or_else(|e| panic!("{name}: write {seq}: {e}"));
                    if seq % 16 == 15 {
                        s.keep().await.unwrap();
                    }
                    if seq == 5_000 {
                        warm = claimed(mem.inner(), 3).await;
                    }
                }
                (warm, claimed(mem.inner(), 3).await, s.paths())
            })
            .unwrap();
        let c = cfg.clone();
        let got = sim
            .block_on(async move {
                let mut r = connect_any(&check, &c, Who::Id(2), clock(check.inner(), 0)).await.unwrap();
                let mut got = Vec::new();
                for k in 0..16u64 {
                    let g = r.get(format!("key{k}").as_bytes()).await.unwrap();
                    got.push(match g {
                        Got::Found(v) => Some(v.to_vec()),
                        _ => None,
                    });
                }
                got
            })
            .unwrap();
        let p: Paths = paths;
        std::println!(
            "{name}: claimed {warm} B after 5,000 writes, {end} B after 30,000; recycled {} entries ({} moved home), {} segments",
            p.entries_recycled,
            p.moved_home,
            p.segments_recycled
        );
        assert_eq!(warm, end, "{name}: memory grew after warm-up");
        assert!(p.entries_recycled > 25_000 && p.segments_recycled > 100, "{name}: {p:?}");
        for k in 0..16u64 {
            assert_eq!(got[k as usize], Some(value(k, 29_984 + k)), "{name}: key {k}");
        }
    }
}

/// Runs `f` on a fresh simulated store of `name`'s, with clients made by
/// `sim.client()`: the store's shape, the simulator.
fn store(name: &str, keys: u64) -> (StoreConfig, Sim) {
    let cfg = config(name, keys);
    let mut sim = Sim::new(
        SimConfig { nodes: 3, node_size: NODE, time_limit_ns: 200_000_000_000, ..SimConfig::default() }
            .fixed_latency(2_000),
    );
    let admin = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        for n in 0..3 {
            Region::format_fresh(&admin, NodeId(n), NODE, CHUNK).await.unwrap();
        }
        format(&admin, &c, 1).await.unwrap();
    })
    .unwrap();
    (cfg, sim)
}

/// A writer that never runs `keep`, writing about twice the nodes' memory
/// in log entries: when its log has no segment left, or a node no room
/// for another, it recycles and waits for a segment of its own to be given
/// back (backpressure) instead of failing; every write succeeds, and the
/// memory claimed stays within the nodes.
#[test]
fn a_writer_out_of_room_waits_for_its_log_to_be_recycled() {
    for name in ["swarm-kv", "dm-abd"] {
        let (cfg, mut sim) = store(name, 64);
        let mem = Counted::new(sim.client());
        let (end, p) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mem, &cfg, Who::Id(1), clock(mem.inner(), 0)).await.unwrap();
                for seq in 0..30_000u64 {
                    let key = format!("key{}", seq % 16).into_bytes();
                    s.insert(&key, &value(seq % 16, seq)).await.unwrap_or_else(|e| panic!("{name}: write {seq}: {e}"));
                }
                (claimed(mem.inner(), 3).await, s.paths())
            })
            .unwrap();
        std::println!("{name}: {} waits for room; {end} B claimed; {p:?}", p.room_waits);
        assert!(p.room_waits > 0 && p.segments_recycled > 10, "{name}: {p:?}");
        assert!(end <= 3 * (NODE - HEADER_SIZE), "{name}");
    }
}

/// A writer's burst takes every chunk of the nodes for its log; once it is
/// recycled, the segments it gave back beyond a few go to the nodes' pools,
/// and a second client, whose new keys and log find no chunk left, takes
/// its memory from there: every write of both succeeds, and a fresh client
/// reads every key's last value.
#[test]
fn a_burst_s_log_goes_to_the_pool_for_other_clients() {
    use crate::substrate::space::pool;

    for name in ["swarm-kv", "dm-abd"] {
        let (cfg, mut sim) = store(name, 64);
        let mem = Counted::new(sim.client());
        let c = cfg.clone();
        let (pooled, released, free) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mem, &c, Who::Id(1), clock(mem.inner(), 0)).await.unwrap();
                for seq in 0..30_000u64 {
                    let key = format!("key{}", seq % 16).into_bytes();
                    s.insert(&key, &value(seq % 16, seq)).await.unwrap_or_else(|e| panic!("{name}: write {seq}: {e}"));
                }
                // Idle: recycling gives the log back, and once the
                // segments have been unused for HOLD_R delays, to the pools.
                let delay = crate::swarm::client::recycle_delay_ns(mem.inner().timeout_ns());
                for _ in 0..2 * crate::swarm::recycle::HOLD_R {
                    mem.inner().sleep(delay).await;
                    s.keep().await.unwrap();
                }
                let mut pooled = [0; 3];
                let mut free = [0; 3];
                for n in 0..3 {
                    pooled[n] = pool::bytes(mem.inner(), NodeId(n as u16)).await.unwrap();
                    let r = Region::open(mem.inner(), NodeId(n as u16)).await.unwrap();
                    free[n] = r.size - r.cursor;
                }
                (pooled, s.paths().segments_released, free)
            })
            .unwrap();
        std::println!("{name}: {released} segments released; pools {pooled:?} B; never claimed {free:?} B");
        assert!(pooled.iter().all(|&b| b > NODE / 2), "{name}: the burst's log went to the pools: {pooled:?}");
        assert!(free.iter().all(|&b| b < CHUNK), "{name}: the burst took every chunk: {free:?}");
        let mem = Counted::new(sim.client());
        let c = cfg.clone();
        sim.block_on(async move {
            let mut s: AnyClient<'_, _> = connect_any(&mem, &c, Who::Id(2), clock(mem.inner(), 0)).await.unwrap();
            for seq in 0..5_000u64 {
                let key = format!("new{}", seq % 16).into_bytes();
                s.insert(&key, &value(100 + seq % 16, seq))
                    .await
                    .unwrap_or_else(|e| panic!("{name}: new key write {seq}: {e}"));
                if seq % 16 == 15 {
                    s.keep().await.unwrap();
                }
            }
        })
        .unwrap();
        let check = sim.client();
        sim.block_on(async move {
            let mut r = connect_any(&check, &cfg, Who::Id(3), clock(&check, 0)).await.unwrap();
            for k in 0..16u64 {
                let got = r.get(format!("key{k}").as_bytes()).await.unwrap();
                assert!(matches!(got, Got::Found(v) if v.to_vec() == value(k, 29_984 + k)), "{name}: key{k}");
                let got = r.get(format!("new{k}").as_bytes()).await.unwrap();
                assert!(
                    matches!(got, Got::Found(v) if v.to_vec() == value(100 + k, (4_999 - k) / 16 * 16 + k)),
                    "{name}: new{k}"
                );
            }
        })
        .unwrap();
    }
}

/// Keys written once and never again keep their values at home: their
/// writer moves them there, and gives their entries back with the rest of
/// their segments, while it goes on writing other keys; fresh clients
/// read them (from the in-place copy, and with the first replica's node
/// down, from another replica's home).
#[test]
fn values_that_stay_are_moved_home_and_their_segments_recycled() {
    for name in ["swarm-kv", "dm-abd"] {
        let (cfg, mut sim) = store(name, 256);
        let (mem, a, b) = (Counted::new(sim.client()), Counted::new(sim.client()), Counted::new(sim.client()));
        let c = cfg.clone();
        let (warm, end, p) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mem, &c, Who::Id(1), clock(mem.inner(), 0)).await.unwrap();
                for k in 0..200u64 {
                    s.insert(format!("cold{k}").as_bytes(), &value(k, 0)).await.unwrap();
                }
                let mut warm = 0;
                for seq in 0..20_000u64 {
                    s.insert(format!("hot{}", seq % 4).as_bytes(), &value(seq % 4, seq)).await.unwrap();
                    if seq % 16 == 15 {
                        s.keep().await.unwrap();
                    }
                    if seq == 5_000 {
                        warm = claimed(mem.inner(), 3).await;
                    }
                }
                (warm, claimed(mem.inner(), 3).await, s.paths())
            })
            .unwrap();
        std::println!(
            "{name}: claimed {warm} B, then {end} B; recycled {} entries ({} moved home), {} segments; {} home reads",
            p.entries_recycled,
            p.moved_home,
            p.segments_recycled,
            p.home_reads
        );
        assert_eq!(warm, end, "{name}: memory grew after warm-up");
        assert!(p.moved_home >= 200, "{name}: the cold keys' values were moved home: {p:?}");
        let read_all = async |mem: Counted<crate::sim::SimMemory>, cfg: StoreConfig, id: u8| {
            let mut r = connect_any(&mem, &cfg, Who::Id(id), clock(mem.inner(), 0)).await.unwrap();
            let mut wrong = Vec::new();
            for k in 0..200u64 {
                match r.get(format!("cold{k}").as_bytes()).await {
                    Ok(Got::Found(v)) if v.to_vec() == value(k, 0) => {}
                    other => wrong.push((k, format!("{:?}", other.map(|g| matches!(g, Got::Found(_)))))),
                }
            }
            (wrong, r.paths())
        };
        let c = cfg.clone();
        let (wrong, _) = sim.block_on(async move { read_all(a, c, 2).await }).unwrap();
        assert!(wrong.is_empty(), "{name}: {wrong:?}");
        // The node of the keys' first replicas (and in-place copies) down:
        // the values come from the other replicas' homes.
        let now = sim.now();
        sim.crash_node_at(0, now, crate::sim::CrashMode::FailFast);
        let (wrong, p) = sim.block_on(async move { read_all(b, cfg, 3).await }).unwrap();
        assert!(wrong.is_empty(), "{name} with node 0 down: {wrong:?}");
        std::println!("{name}: with node 0 down, {} home reads", p.home_reads);
    }
}

/// Recycling marks a client's own words (VERIFIED, then H once the value
/// is home), which its cache does not know from the write: the marks reach
/// the keys' cache between operations, so a key's next write still
/// expects its word and takes its usual roundtrips (SWARM-KV one, DM-ABD
/// two), not one more for a failed CAS.
#[test]
fn writes_after_recycling_marked_their_words_take_no_extra_roundtrip() {
    for (name, usual) in [("swarm-kv", 1), ("dm-abd", 2)] {
        let (cfg, mut sim) = store(name, 64);
        let mem = Counted::new(sim.client());
        let (rtts, p) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mem, &cfg, Who::Id(1), clock(mem.inner(), 0)).await.unwrap();
                for k in 0..32u64 {
                    s.insert(format!("k{k}").as_bytes(), &value(k, 0)).await.unwrap();
                }
                // A few times R (400 µs here): every value moves home.
                for _ in 0..10 {
                    mem.inner().sleep(1_000_000).await;
                    s.keep().await.unwrap();
                }
                let mut rtts = Vec::new();
                for k in 0..32u64 {
                    mem.reset();
                    s.update(format!("k{k}").as_bytes(), &value(k, 1)).await.unwrap().unwrap();
                    rtts.push(mem.roundtrips());
                }
                (rtts, s.paths())
            })
            .unwrap();
        assert!(p.moved_home >= 32, "{name}: the values were moved home: {p:?}");
        assert!(rtts.iter().all(|&r| r == usual), "{name}: roundtrips per update {rtts:?}, not {usual}");
    }
}

/// An id's next holder recycles what its previous holder left: a client
/// that wrote without ever recycling (as one that crashed), then a new one
/// with its id, which reads the segments left in use, resolves the writes
/// it finds there from their entries (moving the values that stay home)
/// and gives the segments back.
#[test]
fn the_next_holder_of_an_id_recycles_what_the_last_one_left() {
    for name in ["swarm-kv", "dm-abd"] {
        let (cfg, mut sim) = store(name, 256);
        let (ma, mb, mc) = (Counted::new(sim.client()), Counted::new(sim.client()), Counted::new(sim.client()));
        let c = cfg.clone();
        let left = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&ma, &c, Who::Id(1), clock(ma.inner(), 0)).await.unwrap();
                for k in 0..100u64 {
                    s.insert(format!("cold{k}").as_bytes(), &value(k, 0)).await.unwrap();
                }
                for seq in 0..3_000u64 {
                    s.insert(format!("hot{}", seq % 4).as_bytes(), &value(seq % 4, seq)).await.unwrap();
                }
                claimed(ma.inner(), 3).await
            })
            .unwrap();
        let c = cfg.clone();
        let (warm, end, p) = sim
            .block_on(async move {
                let mut s: AnyClient<'_, _> = connect_any(&mb, &c, Who::Id(1), clock(mb.inner(), 0)).await.unwrap();
                let mut warm = 0;
                for seq in 3_000..23_000u64 {
                    s.insert(format!("hot{}", seq % 4).as_bytes(), &value(seq % 4, seq)).await.unwrap();
                    if seq % 16 == 15 {
                        s.keep().await.unwrap();
                    }
                    if seq == 8_000 {
                        warm = claimed(mb.inner(), 3).await;
                    }
                }
                (warm, claimed(mb.inner(), 3).await, s.paths())
            })
            .unwrap();
        std::println!(
            "{name}: the first holder left {left} B claimed; the second {warm} B after 5,000 writes, {end} B at the \
             end; it recycled {} entries ({} moved home), {} segments, {} stuck",
            p.entries_recycled,
            p.moved_home,
            p.segments_recycled,
            p.entries_stuck
        );
        // The segments left are reused: the second holder's own working
        // set comes on top of them only while they are being resolved.
        assert_eq!(warm, end, "{name}: memory grew after the second holder's warm-up");
        assert!(end < left + left / 4, "{name}: {end} B claimed in all, against {left} B left");
        assert!(p.entries_recycled >= 23_000 - 200 && p.moved_home >= 100, "{name}: {p:?}");
        let wrong = sim
            .block_on(async move {
                let mut r = connect_any(&mc, &cfg, Who::Id(2), clock(mc.inner(), 0)).await.unwrap();
                let mut wrong = Vec::new();
                for k in 0..100u64 {
                    match r.get(format!("cold{k}").as_bytes()).await {
                        Ok(Got::Found(v)) if v.to_vec() == value(k, 0) => {}
                        _ => wrong.push(k),
                    }
                }
                wrong
            })
            .unwrap();
        assert!(wrong.is_empty(), "{name}: cold keys not read back: {wrong:?}");
    }
}

/// A write that reached a minority (its writer's other replicas were down)
/// is settled before its value moves home: the mark says a majority holds
/// the tuple, so a reader that meets it does not write it back. Moved home
/// unsettled (the mutant `home-unsettled`), a reader returns it from one
/// replica, and once that replica's node crashes the next read returns the
/// value before it: a new value, then an old one.
#[test]
fn a_write_on_a_minority_is_settled_before_its_value_moves_home() {
    use crate::check::register::setup;
    use crate::sim::CrashMode;
    use crate::swarm::inout::Layout;
    use crate::swarm::maxreg::RegCache;
    use crate::swarm::safeguess;

    let mut sim = Sim::new(SimConfig { seed: 5, nodes: 3, node_size: 8 << 20, ..SimConfig::default() });
    let reg = setup(&mut sim, 3, Layout::new(1, 64).unwrap());
    let (w, r) = (sim.client(), sim.client());
    let (reg_w, reg_r) = (reg.clone(), reg.clone());
    let delay = crate::swarm::client::recycle_delay_ns(w.timeout_ns());
    let at = sim.now();
    // Nodes 1 and 2 are down while the second write is made, and back
    // (with their memory) before the writer recycles.
    sim.crash_node_at(1, at + 100_000, CrashMode::FailFast);
    sim.crash_node_at(2, at + 100_000, CrashMode::FailFast);
    sim.heal_node_at(1, at + 300_000);
    sim.heal_node_at(2, at + 300_000);
    sim.spawn(&w.clone(), async move {
        let mut ctx = crate::swarm::client::ClientCtx::new(1, clock(&w, 0)).unwrap();
        ctx.configure(delay, reg_w.layout);
        let mut cache = RegCache::default();
        safeguess::write(&mut ctx, &w, &reg_w, &mut cache, b"old").await.unwrap();
        w.sleep(150_000).await;
        assert!(safeguess::write(&mut ctx, &w, &reg_w, &mut cache, b"new").await.is_err(), "one replica of three");
        w.sleep(250_000).await;
        for _ in 0..8 {
            ctx.recycle(&w).await;
            w.sleep(delay).await;
        }
        assert!(ctx.paths.entries_recycled == 2 && ctx.paths.moved_home >= 1, "{:?}", ctx.paths);
    });
    sim.run().unwrap();
    let r2 = sim.client();
    let first = sim
        .block_on(async move {
            let mut ctx = crate::swarm::client::ClientCtx::new(2, clock(&r, 0)).unwrap();
            let (_, v) = safeguess::read(&mut ctx, &r, &reg, &mut RegCache::default()).await.unwrap();
            v.to_vec()
        })
        .unwrap();
    let now = sim.now();
    sim.crash_node_at(0, now + 1, CrashMode::FailFast);
    let then = sim
        .block_on(async move {
            r2.sleep(10).await;
            let mut ctx = crate::swarm::client::ClientCtx::new(3, clock(&r2, 0)).unwrap();
            let (_, v) = safeguess::read(&mut ctx, &r2, &reg_r, &mut RegCache::default()).await.unwrap();
            v.to_vec()
        })
        .unwrap();
    assert!(first == then || first == b"old", "read {first:?}, then {then:?}: not linearizable");
}

/// Leased clients that follow one another on one id, each releasing it
/// (the next goes on in the same segment) or crashing (the next opens a
/// new one once the lease ran out): the memory the nodes have claimed
/// stops growing after the first few, and every key reads its last value.
#[test]
fn holders_of_a_leased_id_in_turn_keep_the_log_bounded() {
    use crate::substrate::lease::Want;
    use crate::systems::claim;
    for name in ["swarm-kv", "dm-abd"] {
        for crash in [false, true] {
            let (cfg, mut sim) = store(name, 256);
            let lease_ns = cfg.lease_ms as u64 * 1_000_000;
            let mem = Counted::new(sim.client());
            let c = cfg.clone();
            let (claims, got, p) = sim
                .block_on(async move {
                    let clk = clock(mem.inner(), 0);
                    let mut claims = Vec::new();
                    let mut p = Paths::default();
                    let mut seq = 0u64;
                    for _turn in 0..8 {
                        let held = claim(&mem, &c, &clk, Want::Id(1), 7).await.unwrap();
                        let mut s: AnyClient<'_, _> =
                            connect_any(&mem, &c, Who::Lease(held), clock(mem.inner(), 0)).await.unwrap();
                        for _ in 0..2_000 {
                            let k = seq % 16;
                            s.insert(format!("k{k}").as_bytes(), &value(k, seq)).await.unwrap();
                            seq += 1;
                            if seq.is_multiple_of(16) {
                                s.keep().await.unwrap();
                            }
                        }
                        // The first holder's last writes stay its keys' values:
                        // they are in the segment the next holder goes on in.
                        if claims.is_empty() {
                            for k in 0..8u64 {
                                s.insert(format!("cold{k}").as_bytes(), &value(k, 7)).await.unwrap();
                            }
                        }
                        p = s.paths();
                        if crash {
                            drop(s);
                            let grace = crate::substrate::lease::grace(&clk) * clk.tick_ns();
                            mem.inner().sleep(lease_ns + grace + 1_000_000).await;
                        } else {
                            s.close().await.unwrap();
                        }
                        claims.push(claimed(mem.inner(), 3).await);
                    }
                    let held = claim(&mem, &c, &clk, Want::Id(2), 7).await.unwrap();
                    let mut r: AnyClient<'_, _> =
                        connect_any(&mem, &c, Who::Lease(held), clock(mem.inner(), 0)).await.unwrap();
                    let mut got = Vec::new();
                    for k in (0..16u64).map(|k| format!("k{k}")).chain((0..8u64).map(|k| format!("cold{k}"))) {
                        got.push(match r.get(k.as_bytes()).await {
                            Ok(Got::Found(v)) => Some(v.to_vec()),
                            _ => None,
                        });
                    }
                    (claims, got, p)
                })
                .unwrap();
            std::println!("{name}, crash {crash}: claimed after each holder {claims:?}; the last one's paths {p:?}");
            if !crash {
                // At most one segment more on each node (the ring's high
                // water mark), not one per holder.
                let chunks = (claims[7] - claims[3]) / (3 * CHUNK);
                assert!(chunks <= 1, "{name}: memory grew holder after holder: {claims:?}");
            }
            for k in 0..16u64 {
                assert_eq!(got[k as usize], Some(value(k, 16_000 - 16 + k)), "{name} (crash {crash}): key {k}");
            }
            for k in 0..8u64 {
                assert_eq!(got[16 + k as usize], Some(value(k, 7)), "{name} (crash {crash}): cold key {k}");
            }
        }
    }
}

/// A write's record is stored on the write's path, into memory the CPU has
/// not touched since the last pass: it must stay within two cache lines.
#[test]
fn a_write_s_record_takes_two_cache_lines() {
    assert!(size_of::<super::Pending>() <= 128, "{} bytes", size_of::<super::Pending>());
}
