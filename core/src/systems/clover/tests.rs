//! Clover in the simulator, beyond the registry's tests (`systems::tests`:
//! the table and its roundtrips, corrupt memory, the campaigns with
//! crashing clients, data nodes and metadata servers): cursors behind the
//! tail, CASes that lose, concurrent writers on one key, background
//! refills, a crashed data node, and a model-checked property.

use alloc::boxed::Box;
use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;

use proptest::prelude::*;

use super::*;
use crate::check::clock;
use crate::check::kv::{CHUNK, NODE_SIZE, start_server};
use crate::kv::place::node_of;
use crate::kv::{Got, KvClient, Missing, Written};
use crate::sim::{CrashMode, ServerShell, Sim, SimConfig, SimMemory};
use crate::substrate::rtt::Counted;
use crate::substrate::space::region::Region;
use crate::substrate::space::slab::class_size;
use crate::systems::from_name;
use crate::{MemError, MemErrorKind};

fn config() -> StoreConfig {
    let mut cfg = StoreConfig::new(from_name("clover").unwrap(), 64);
    cfg.replicas = 3;
    cfg.max_key = 16;
    cfg.max_value = 256;
    cfg.writers = 8;
    cfg
}

/// `nodes` formatted nodes with the store, and its metadata server running.
fn setup(cfg: &StoreConfig, nodes: usize, seed: u64) -> (Sim, ServerShell) {
    let sc = SimConfig { seed, nodes, node_size: NODE_SIZE, ..SimConfig::default() };
    let mut sim = Sim::new(sc.fixed_latency(2_000));
    let admin = sim.client();
    let c = cfg.clone();
    sim.block_on(async move {
        for n in 0..nodes {
            Region::format(&admin, NodeId(n as u16), NODE_SIZE, CHUNK).await.unwrap();
        }
        crate::systems::format(&admin, &c, 1).await.unwrap();
    })
    .unwrap();
    let shell = start_server(&mut sim, cfg).unwrap();
    (sim, shell)
}

type Client<M> = Box<CloverClient<M, crate::check::SimClock>>;

async fn connect<M: Memory>(mem: M, clock_of: &SimMemory, cfg: &StoreConfig, id: u8) -> Client<M> {
    Clover::connect(mem, cfg, Who::Id(id), clock(clock_of, 0)).await.unwrap()
}

fn value<B: core::ops::Deref<Target = [u8]>>(g: Result<Got<B>, KvError>) -> Option<Vec<u8>> {
    match g {
        Ok(Got::Found(v)) => Some(v.to_vec()),
        _ => None,
    }
}

/// The interface's table on one key, and a client's first batch of free
/// buffers on every node.
#[test]
fn gets_updates_deletes_and_inserts() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 1);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = connect(mem.clone(), &mem, &cfg, 1).await;
        for n in 0..3 {
            assert_eq!(a.free_buffers(NodeId(n)), client::BATCH, "node {n}");
        }
        assert_eq!(value(a.get(b"k").await), None);
        assert_eq!(a.update(b"k", b"x").await, Ok(Err(Missing::NotFound)));
        assert_eq!(a.delete(b"k").await, Ok(Err(Missing::NotFound)));
        a.insert(b"k", b"v1").await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v1"[..]));
        assert_eq!(a.update(b"k", b"v2").await, Ok(Ok(Written)));
        assert_eq!(a.insert(b"k", b"v3").await, Ok(Written));
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v3"[..]));
        assert_eq!(a.delete(b"k").await, Ok(Ok(Written)));
        assert_eq!(a.get(b"k").await.map(|g| matches!(g, Got::Deleted)), Ok(true));
        assert_eq!(a.delete(b"k").await, Ok(Err(Missing::NotFound)));
        assert_eq!(a.update(b"k", b"no").await, Ok(Err(Missing::NotFound)));
        assert_eq!(a.insert(b"k", b"v4").await, Ok(Written));
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v4"[..]));
        // An empty value and a largest one.
        a.insert(b"e", b"").await.unwrap();
        assert_eq!(value(a.get(b"e").await).as_deref(), Some(&b""[..]));
        a.update(b"e", &[7; 256]).await.unwrap().unwrap();
        assert_eq!(value(a.get(b"e").await), Some(alloc::vec![7; 256]));
        // Another client finds all of it through the metadata server.
        let mut b = connect(mem.clone(), &mem, &cfg, 2).await;
        assert_eq!(value(b.get(b"k").await).as_deref(), Some(&b"v4"[..]));
        assert_eq!(value(b.get(b"e").await), Some(alloc::vec![7; 256]));
        assert_eq!(value(b.get(b"none").await), None);
    })
    .unwrap();
}

/// A client's cursor left behind by another client's writes: its get
/// hops along the chain to the tail (a roundtrip per version), and then
/// reads the tail in one roundtrip (mutant `clover-stale-cursor` returns
/// the old version instead). Its update's CAS loses at the old tail,
/// follows the chain and commits at the new one, and a delete does the
/// same.
#[test]
fn a_cursor_behind_the_tail_follows_the_chain() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 2);
    let mem = sim.client();
    sim.block_on(async move {
        let mut a = connect(mem.clone(), &mem, &cfg, 1).await;
        let counted = Counted::new(mem.clone());
        let mut b = connect(&counted, &mem, &cfg, 2).await;
        a.insert(b"k", b"v0").await.unwrap();
        assert_eq!(value(b.get(b"k").await).as_deref(), Some(&b"v0"[..]));
        for i in 1..=5u8 {
            a.update(b"k", &[b'v', b'0' + i]).await.unwrap().unwrap();
        }
        counted.reset();
        assert_eq!(value(b.get(b"k").await).as_deref(), Some(&b"v5"[..]), "the tail, not the cursor's version");
        assert_eq!((b.paths().read_hops, counted.roundtrips()), (5, 6), "five hops after the cursor's READ");
        counted.reset();
        assert_eq!(value(b.get(b"k").await).as_deref(), Some(&b"v5"[..]));
        assert_eq!(counted.roundtrips(), 1, "the cursor is the tail now");
        // b's update from a stale cursor: the CAS loses to a's writes.
        a.update(b"k", b"a6").await.unwrap().unwrap();
        a.update(b"k", b"a7").await.unwrap().unwrap();
        counted.reset();
        assert_eq!(b.update(b"k", b"b8").await, Ok(Ok(Written)));
        assert_eq!(b.paths().cas_retries, 2, "two CASes lost, at v5 and a6");
        assert_eq!(counted.roundtrips(), 4, "the WRITE, then a CAS per version");
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"b8"[..]));
        // a deletes from its cursor (a7), behind b8: one hop.
        assert_eq!(a.delete(b"k").await, Ok(Ok(Written)));
        assert_eq!(b.get(b"k").await.map(|g| matches!(g, Got::Deleted)), Ok(true));
        // b's update meets the deletion at its CAS: not found.
        assert_eq!(b.update(b"k", b"no").await, Ok(Err(Missing::NotFound)));
        // An insert from a's cursor revives the key past the deletion.
        assert_eq!(a.insert(b"k", b"a9").await, Ok(Written));
        assert_eq!(value(b.get(b"k").await).as_deref(), Some(&b"a9"[..]));
    })
    .unwrap();
}

/// Writers race on one key: every update commits (a CAS that lost
/// follows the chain), the chain holds every version once, and a fresh
/// client walks it from the head to the last one.
#[test]
fn concurrent_writers_on_one_key_all_commit() {
    let cfg = config();
    let (mut sim, shell) = setup(&cfg, 3, 3);
    let m = sim.client();
    let c = cfg.clone();
    sim.block_on(async move { connect(m.clone(), &m, &c, 1).await.insert(b"k", b"first").await.unwrap() }).unwrap();
    let retries: Rc<RefCell<u64>> = Rc::default();
    let done: Rc<RefCell<u32>> = Rc::default();
    const WRITERS: u8 = 4;
    const EACH: u32 = 10;
    for id in 2..2 + WRITERS {
        let m = sim.client();
        let (mm, c, retries, done, shell) = (m.clone(), cfg.clone(), retries.clone(), done.clone(), shell.clone());
        sim.spawn(&m, async move {
            let mut w = connect(mm.clone(), &mm, &c, id).await;
            for i in 0..EACH {
                assert_eq!(w.update(b"k", &[id, i as u8]).await, Ok(Ok(Written)));
            }
            *retries.borrow_mut() += w.paths().cas_retries;
            *done.borrow_mut() += 1;
            if *done.borrow() == WRITERS as u32 {
                shell.stop();
            }
        });
    }
    sim.run().unwrap();
    assert!(*retries.borrow() > 0, "no CAS lost: the writers did not race");
    let _again = start_server(&mut sim, &cfg);
    let m = sim.client();
    let (hops, last) = sim
        .block_on(async move {
            let mut r = connect(m.clone(), &m, &cfg, 7).await;
            let v = value(r.get(b"k").await).unwrap();
            (r.paths().read_hops, v)
        })
        .unwrap();
    // One version per update after the first, less those the MS freed
    // (the head moved past them).
    assert!(hops <= (WRITERS as u64) * EACH as u64, "{hops} hops");
    assert_eq!(last[1], EACH as u8 - 1, "the last version is some writer's last update");
}

/// Writes fetch batches of buffers beside their WRITE once the pool runs
/// low, so that every update takes two roundtrips and none waits for
/// allocation.
#[test]
fn writes_refill_their_buffers_in_the_background() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 4);
    let mem = sim.client();
    sim.block_on(async move {
        let counted = Counted::new(mem.clone());
        let mut a = connect(&counted, &mem, &cfg, 1).await;
        a.insert(b"k", b"v").await.unwrap();
        for i in 0..5 * client::BATCH {
            counted.reset();
            assert_eq!(a.update(b"k", &i.to_le_bytes()).await, Ok(Ok(Written)));
            assert_eq!(counted.roundtrips(), 2, "update {i}");
            assert!(a.free_buffers(NodeId(0)) > 0);
        }
        assert!(a.paths().refills >= 4, "{:?}", a.paths());
        assert_eq!(value(a.get(b"k").await), Some((5 * client::BATCH - 1).to_le_bytes().to_vec()));
    })
    .unwrap();
}

/// A data node crashes: keys whose primary it is fail naming it; the
/// others, replicated on it, go on with the majority left.
#[test]
fn a_crashed_data_node_fails_only_the_keys_it_is_primary_of() {
    for mode in [CrashMode::FailFast, CrashMode::Hang] {
        let cfg = config();
        let (mut sim, _shell) = setup(&cfg, 3, 5);
        let keys: Vec<Vec<u8>> = (0..12u8).map(|i| alloc::vec![b'k', i]).collect();
        let (m, c, ks) = (sim.client(), cfg.clone(), keys.clone());
        sim.block_on(async move {
            let mut a = connect(m.clone(), &m, &c, 1).await;
            for k in &ks {
                a.insert(k, k).await.unwrap();
            }
        })
        .unwrap();
        let now = sim.now();
        sim.crash_node_at(2, now, mode);
        let m = sim.client();
        let (lost, kept) = sim
            .block_on(async move {
                let mut b = connect(m.clone(), &m, &cfg, 2).await;
                let (mut lost, mut kept) = (0, 0);
                for k in &keys {
                    if node_of(k, 0, 3) == NodeId(2) {
                        match b.get(k).await {
                            Err(KvError::Down(e)) if e.node == NodeId(2) => lost += 1,
                            r => panic!("{mode:?}: {:?}", r.map(|g| matches!(g, Got::Found(_)))),
                        }
                        assert!(matches!(b.update(k, b"x").await, Err(KvError::Down(e)) if e.node == NodeId(2)));
                    } else {
                        assert_eq!(value(b.get(k).await).as_deref(), Some(&k[..]), "{mode:?}");
                        assert_eq!(b.update(k, b"after").await, Ok(Ok(Written)), "{mode:?}");
                        assert_eq!(value(b.get(k).await).as_deref(), Some(&b"after"[..]), "{mode:?}");
                        kept += 1;
                    }
                }
                (lost, kept)
            })
            .unwrap();
        assert!(lost > 0 && kept > 0, "{mode:?}: {lost} lost, {kept} kept");
    }
}

/// An operation of the property below.
#[derive(Clone, Debug)]
enum Op {
    Get(u8),
    Insert(u8, u8),
    Update(u8, u8),
    Delete(u8),
}

fn op() -> impl Strategy<Value = (u8, Op)> {
    let key = 0u8..3;
    let op = prop_oneof![
        key.clone().prop_map(Op::Get),
        (key.clone(), any::<u8>()).prop_map(|(k, v)| Op::Insert(k, v)),
        (key.clone(), any::<u8>()).prop_map(|(k, v)| Op::Update(k, v)),
        key.prop_map(Op::Delete),
    ];
    (0u8..3, op)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Three clients, each with its own cursors, take turns on three keys:
    /// every answer is the model's (a map), whoever wrote last.
    #[test]
    fn clients_taking_turns_agree_with_a_map(ops in proptest::collection::vec(op(), 1..40)) {
        let cfg = config();
        let (mut sim, _shell) = setup(&cfg, 3, 6);
        let mem = sim.client();
        let out = sim.block_on(async move {
            let mut cs = Vec::new();
            for id in 1..=3 {
                cs.push(connect(mem.clone(), &mem, &cfg, id).await);
            }
            let mut model: hashbrown::HashMap<u8, Option<u8>> = hashbrown::HashMap::new();
            for (who, op) in ops {
                let c = &mut cs[who as usize];
                let key = |k: u8| [b'k', k];
                let ok = match op {
                    Op::Get(k) => {
                        let got = c.get(&key(k)).await.unwrap();
                        let want = model.get(&k).copied().flatten();
                        match got {
                            Got::Found(v) => want == Some(v[0]) && v.len() == 1,
                            Got::Deleted => want.is_none() && model.contains_key(&k),
                            Got::NotFound => !model.contains_key(&k),
                        }
                    }
                    Op::Insert(k, v) => {
                        model.insert(k, Some(v));
                        c.insert(&key(k), &[v]).await == Ok(Written)
                    }
                    Op::Update(k, v) => {
                        let live = matches!(model.get(&k), Some(Some(_)));
                        if live {
                            model.insert(k, Some(v));
                        }
                        c.update(&key(k), &[v]).await == Ok(if live { Ok(Written) } else { Err(Missing::NotFound) })
                    }
                    Op::Delete(k) => {
                        let live = matches!(model.get(&k), Some(Some(_)));
                        if live {
                            model.insert(k, None);
                        }
                        c.delete(&key(k)).await == Ok(if live { Ok(Written) } else { Err(Missing::NotFound) })
                    }
                };
                if !ok {
                    return false;
                }
            }
            true
        }).unwrap();
        prop_assert!(out);
    }
}

/// A reader's cursor whose buffer the MS freed (the writer retired it)
/// and handed out again, here to a write of the same key that was never
/// linked (it met a deletion): the buffer holds a whole version of the
/// key, as the tail, with the next GC version. The reader finds another
/// GC version than its cursor's, drops it and starts again from the head
/// in the key's cell, read beside its READ: 2 roundtrips and no call to
/// the MS (mutant `clover-no-gcver` returns the recycled bytes). A writer
/// whose CAS meets a recycled buffer reads the cell too; a garbled cell
/// sends the restart to the MS.
#[test]
fn a_recycled_buffer_is_never_read_as_a_value() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 7);
    let mem = sim.client();
    sim.block_on(async move {
        let counted = Counted::new(mem.clone());
        let mut a = connect(&counted, &mem, &cfg, 1).await;
        let mut w = connect(mem.clone(), &mem, &cfg, 2).await;
        a.insert(b"k", b"v0").await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v0"[..]));
        // Versions 1-3 of `k` by a writer that closes (its retires reach
        // the MS, which frees them up to the tail), then a's cursor's
        // buffer handed out again and written, never linked.
        let recycle = async |old: header::Cursor, i: u8| {
            let mut w = connect(mem.clone(), &mem, &cfg, 2).await;
            for j in 1..=3u8 {
                w.update(b"k", &[b'v', b'0' + i + j]).await.unwrap().unwrap();
            }
            assert_eq!(w.retires_waiting(), 3);
            w.close().await.unwrap();
            // The MS frees after it answered.
            mem.sleep(50_000).await;
            let tag = crate::kv::place::key_hash(b"k");
            mem.write(old.at, &buffer::encode(b"k", b"never", tag, old.gc.wrapping_add(1))).await.unwrap();
        };
        w.close().await.unwrap();
        recycle(a.cursor(b"k").unwrap(), 0).await;
        counted.reset();
        let got = value(a.get(b"k").await);
        assert!(got.as_deref() != Some(&b"never"[..]), "a recycled buffer's bytes were returned");
        assert_eq!(got.as_deref(), Some(&b"v3"[..]));
        let p = a.paths();
        assert_eq!((p.stale_gc, p.shortcuts), (1, 1), "{p:?}");
        assert_eq!((counted.roundtrips(), counted.ops()), (2, 4), "READ + cell, twice: the cursor, the head");
        // A garbled cell: the restart asks the MS.
        recycle(a.cursor(b"k").unwrap(), 3).await;
        mem.write(a.cell(b"k").unwrap(), &[0xab; 8]).await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v6"[..]));
        let p = a.paths();
        assert_eq!((p.stale_gc, p.shortcuts), (2, 1), "{p:?}");
        // An update too: the CAS finds another tail word there.
        let mut b = connect(mem.clone(), &mem, &cfg, 3).await;
        b.insert(b"j", b"j0").await.unwrap();
        let counted = Counted::new(mem.clone());
        let mut c = connect(&counted, &mem, &cfg, 4).await;
        assert_eq!(value(c.get(b"j").await).as_deref(), Some(&b"j0"[..]));
        let old = c.cursor(b"j").unwrap();
        b.update(b"j", b"j1").await.unwrap().unwrap();
        b.close().await.unwrap();
        let tag = crate::kv::place::key_hash(b"j");
        mem.write(old.at, &buffer::encode(b"j", b"never", tag, old.gc.wrapping_add(1))).await.unwrap();
        counted.reset();
        assert_eq!(c.update(b"j", b"j2").await, Ok(Ok(Written)));
        let p = c.paths();
        assert_eq!((p.stale_gc, p.shortcuts), (1, 1), "{p:?}");
        assert_eq!(counted.roundtrips(), 4, "WRITE, CAS, the cell, CAS at the head");
        assert_eq!(value(a.get(b"j").await).as_deref(), Some(&b"j2"[..]));
    })
    .unwrap();
}

/// A cursor older than its lifetime (its buffer may have come round to
/// the same GC version since) costs no roundtrip when the key's cell,
/// read beside, names it as the key's head: a get takes 1 roundtrip, an
/// update 2 (the cell read beside its WRITE). When the cell names another
/// head, the get starts again from it, and a buffer handed out again with
/// the cursor's own GC version, never linked, is not read as the value
/// (mutant `clover-old-cursor` returns it).
#[test]
fn an_old_cursor_is_used_only_if_its_cell_names_it() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 9);
    let mem = sim.client();
    sim.block_on(async move {
        let counted = Counted::new(mem.clone());
        let mut a = connect(&counted, &mem, &cfg, 1).await;
        a.insert(b"k", b"v0").await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v0"[..]));
        mem.sleep(CURSOR_LIFETIME_NS + 1).await;
        counted.reset();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v0"[..]));
        let p = a.paths();
        assert_eq!((p.vouched_cursors, p.gc_timeouts, p.shortcuts), (1, 0, 0), "{p:?}");
        assert_eq!((counted.roundtrips(), counted.ops()), (1, 2), "the cursor's READ and the cell");
        // Another writer's versions, its retires sent (the MS frees up to
        // the tail); then a's cursor's buffer handed out again with its
        // GC version (as after 256 hand-outs) and written, never linked.
        let old = a.cursor(b"k").unwrap();
        let mut w = connect(mem.clone(), &mem, &cfg, 2).await;
        for j in 1..=3u8 {
            w.update(b"k", &[b'v', b'0' + j]).await.unwrap().unwrap();
        }
        w.close().await.unwrap();
        mem.sleep(50_000).await;
        let tag = crate::kv::place::key_hash(b"k");
        mem.write(old.at, &buffer::encode(b"k", b"never", tag, old.gc)).await.unwrap();
        mem.sleep(CURSOR_LIFETIME_NS + 1).await;
        counted.reset();
        let got = value(a.get(b"k").await);
        assert!(got.as_deref() != Some(&b"never"[..]), "an old cursor's recycled buffer was read as the value");
        assert_eq!(got.as_deref(), Some(&b"v3"[..]));
        let p = a.paths();
        assert_eq!((p.vouched_cursors, p.gc_timeouts, p.shortcuts), (1, 1, 1), "{p:?}");
        assert_eq!(counted.roundtrips(), 2, "READ + cell, then the head");
        // An update from an old cursor: the cell read beside the WRITE.
        mem.sleep(CURSOR_LIFETIME_NS + 1).await;
        counted.reset();
        assert_eq!(a.update(b"k", b"v4").await, Ok(Ok(Written)));
        let p = a.paths();
        assert_eq!((p.gc_timeouts, p.shortcuts, p.cas_retries), (2, 2, 0), "{p:?}");
        assert_eq!(counted.roundtrips(), 2, "the WRITE with the cell, the CAS at the head");
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v4"[..]));
    })
    .unwrap();
}

/// Region bytes claimed on the store's nodes.
async fn claimed(mem: &SimMemory, nodes: u16) -> u64 {
    let mut total = 0;
    for n in 0..nodes {
        total += Region::open(mem, NodeId(n)).await.unwrap().cursor;
    }
    total
}

/// Versions take buffers of the size class their key and value need,
/// where pDPM's all had room for the largest value. In a store whose
/// values may take 4 KiB, keys of 32-byte values claim 64-byte buffers;
/// a write of a size class the client has no group of yet takes a larger
/// group rather than a roundtrip (and fetches its class beside the
/// WRITE), and so updates of sizes that vary take 2 roundtrips each; a
/// freed group is handed out again for its own class only (the mutant
/// `clover-any-class`, which hands it out for any, lets a large version
/// run over the next buffers: values come back wrong or not at all); every
/// get reads its version's class and returns the last value.
#[test]
fn versions_take_buffers_of_their_size_class() {
    let mut cfg = config();
    cfg.max_value = 4096;
    let (mut sim, _shell) = setup(&cfg, 3, 12);
    let mem = sim.client();
    sim.block_on(async move {
        let counted = Counted::new(mem.clone());
        let mut w = connect(&counted, &mem, &cfg, 1).await;
        let mut r = connect(mem.clone(), &mem, &cfg, 2).await;
        let keys: Vec<Vec<u8>> = (0..60u8).map(|i| alloc::vec![b'k', i]).collect();
        let small = buffer::class(2, 32).unwrap();
        let large = buffer::class(2, 4000).unwrap();
        assert_eq!((class_size(small as usize), class_size(large as usize)), (64, 4096));
        let before = claimed(&mem, 3).await;
        for (i, k) in keys.iter().enumerate() {
            w.insert(k, &[i as u8; 32]).await.unwrap();
            assert_eq!(w.cursor(k).map(|c| c.class), Some(small), "key {i}'s first version");
        }
        let grown = claimed(&mem, 3).await - before;
        // 60 keys x 3 copies x 64 B, and the cells, in 64 KiB chunks: a
        // chunk of each on each node (7 in all). In buffers of the largest
        // value's class (5 KiB) they took 6 chunks a node.
        assert!(grown <= 3 * 3 * CHUNK, "60 small keys claimed {grown} bytes");
        let sizes = [32usize, 1000, 4000, 8, 300];
        let mut last = alloc::vec![alloc::vec![]; keys.len()];
        for round in 0..10usize {
            for (i, k) in keys.iter().enumerate().take(20) {
                let len = sizes[(i + round) % sizes.len()];
                let v: Vec<u8> = (0..len).map(|j| (i + j + round) as u8).collect();
                counted.reset();
                assert_eq!(
                    w.update(k, &v).await,
                    Ok(Ok(Written)),
                    "key {i} round {round}: an update of another size class"
                );
                assert_eq!(counted.roundtrips(), 2, "key {i} round {round}: {len} bytes");
                last[i] = v;
            }
            // Past the reuse delay: what the last rounds freed is handed
            // out again.
            mem.sleep(3 * super::read_timeout_ns(&mem)).await;
        }
        for (i, k) in keys.iter().enumerate().take(20) {
            let got = value(r.get(k).await);
            assert!(got.as_ref() == Some(&last[i]), "key {i}: a value of another size class came back wrong");
            let class = r.cursor(k).unwrap().class;
            assert_eq!(class, buffer::class(k.len(), last[i].len()).unwrap(), "key {i}: not the version's class");
        }
        assert!(w.classes().len() >= sizes.len() - 1, "pools of {:?}", w.classes());
        assert!(w.paths().recycled > 0, "no group was handed out again");
    })
    .unwrap();
}

/// Garbage collection: a store with small pools takes about 25 times
/// more updates than it has groups of buffers in use. Its memory stays
/// flat (no chunk claimed after the first updates), the MS hands the same
/// buffers out again and again, their 8-bit GC version wraps, and a group
/// that wrapped is handed out again only an epoch after it was freed; a
/// reader that comes back now and then meets recycled buffers behind its
/// cursors and still reads every key's last value.
#[test]
fn memory_stays_flat_as_buffers_are_recycled() {
    let mut cfg = config();
    cfg.set_option("pool", "2").unwrap();
    let (mut sim, _shell) = setup(&cfg, 3, 8);
    let mem = sim.client();
    sim.block_on(async move {
        let mut w = connect(mem.clone(), &mem, &cfg, 1).await;
        let mut r = connect(mem.clone(), &mem, &cfg, 2).await;
        let keys: Vec<Vec<u8>> = (0..4u8).map(|i| alloc::vec![b'k', i]).collect();
        for k in &keys {
            w.insert(k, b"first").await.unwrap();
            assert_eq!(value(r.get(k).await).as_deref(), Some(&b"first"[..]));
        }
        // Per buffer of key 0's versions: when it was last written with
        // GC version 255.
        let mut at_255: hashbrown::HashMap<crate::RemoteAddr, u64> = hashbrown::HashMap::new();
        let (mut wraps, mut warm, mut first_255) = (0, 0, None);
        let mut last: Vec<u32> = alloc::vec![0; keys.len()];
        const UPDATES: u32 = 7_000;
        for i in 1..=UPDATES {
            // Mostly key 0, so that its buffers wrap.
            let k = if i % 8 == 0 { (i / 8) as usize % keys.len() } else { 0 };
            w.update(&keys[k], &i.to_le_bytes()).await.unwrap().unwrap();
            last[k] = i;
            // A writer's pace that keeps a few groups in their reuse delay
            // (the MS's answers no longer hold writes up).
            mem.sleep(25_000).await;
            let c = w.cursor(&keys[k]).unwrap();
            if k == 0 {
                if c.gc == 255 {
                    at_255.insert(c.at, mem.now());
                    first_255.get_or_insert(i);
                } else if c.gc == 0
                    && let Some(t) = at_255.remove(&c.at)
                {
                    assert!(mem.now() - t > CURSOR_LIFETIME_NS, "a wrapped buffer was handed out within an epoch");
                    wraps += 1;
                }
                // Once buffers have wrapped, wait out an epoch (the MS
                // makes fresh groups meanwhile).
                if first_255.is_some_and(|f| i == f + 200) {
                    mem.sleep(2 * CURSOR_LIFETIME_NS).await;
                }
            }
            if i % 97 == 0 {
                let k = (i / 97) as usize % keys.len();
                assert_eq!(value(r.get(&keys[k]).await), Some(last[k].to_le_bytes().to_vec()), "update {i}");
            }
            if i == UPDATES / 4 {
                warm = claimed(&mem, 3).await;
            }
        }
        let end = claimed(&mem, 3).await;
        let (wp, rp) = (w.paths(), r.paths());
        std::println!(
            "writer {wp:?}\nreader {rp:?}\n{wraps} wraps seen; {warm} bytes claimed after warm-up, {end} at the end"
        );
        assert!(wraps > 0, "no GC version wrapped");
        assert_eq!(end, warm, "memory grew after the warm-up");
        assert!(wp.recycled > UPDATES as u64 / 2, "{wp:?}");
        assert!(rp.stale_gc > 0, "the reader never met a recycled buffer: {rp:?}");
        // A fresh client reads every key's last value.
        let mut f = connect(mem.clone(), &mem, &cfg, 3).await;
        for (k, &v) in keys.iter().zip(&last) {
            let want = if v == 0 { b"first".to_vec() } else { v.to_le_bytes().to_vec() };
            assert_eq!(value(f.get(k).await), Some(want));
        }
    })
    .unwrap();
}

/// Bounded losses (what garbage collection cannot get back after a
/// crash, `super::ms`): a client that crashes with a fixed id (no lease,
/// so the MS cannot tell when it is gone) loses the free groups in
/// its pool (at most `pool` per node) and a version it wrote but had not
/// linked; the retires it had not sent are found by the MS from the
/// keys' heads. A metadata server that crashes loses its free lists, and
/// its standby claims chunks of its own and tops up the backups of the
/// groups it did not make. So memory grows by a bounded amount per
/// crash, and stays flat between crashes however many writes there are.
#[test]
fn a_crash_loses_a_bounded_amount_of_memory() {
    let mut cfg = config();
    cfg.set_option("pool", "2").unwrap();
    let (mut sim, shell) = setup(&cfg, 3, 9);
    let keys: Vec<Vec<u8>> = (0..4u8).map(|i| alloc::vec![b'k', i]).collect();
    let mem = sim.client();
    let writer: Rc<core::cell::Cell<Option<Client<SimMemory>>>> = Rc::default();
    // The writer's updates, `n` of them from `from` on, round the keys;
    // one that meets a restarted MS (its channel found the old one gone)
    // is tried again.
    let updates = |sim: &mut Sim, from: u32, n: u32| {
        let (w, keys, mem) = (writer.clone(), keys.clone(), mem.clone());
        sim.block_on(async move {
            let mut client = w.take().unwrap();
            for i in from..from + n {
                let k = &keys[i as usize % keys.len()];
                let mut tries = 0;
                while client.update(k, &i.to_le_bytes()).await != Ok(Ok(Written)) {
                    tries += 1;
                    assert!(tries < 8, "update {i} kept failing");
                }
            }
            w.set(Some(client));
            claimed(&mem, 3).await
        })
        .unwrap()
    };
    let (w, c, m, ks) = (writer.clone(), cfg.clone(), mem.clone(), keys.clone());
    sim.block_on(async move {
        let mut c = connect(m.clone(), &m, &c, 1).await;
        for k in &ks {
            c.insert(k, b"first").await.unwrap();
        }
        w.set(Some(c));
    })
    .unwrap();
    let warm = updates(&mut sim, 0, 600);
    // Clients that crash in the middle of their updates, ids 2..=7.
    const CRASHES: u32 = 6;
    for crash in 0..CRASHES {
        let m = sim.client();
        let at = sim.now() + 200_000 + crash as u64 * 37_000;
        sim.crash_client_at(&m, at);
        let (c, k) = (cfg.clone(), keys[crash as usize % keys.len()].clone());
        sim.spawn(&m.clone(), async move {
            let mut c = connect(m.clone(), &m, &c, 2 + crash as u8).await;
            for i in 0u32.. {
                let _ = c.update(&k, &i.to_le_bytes()).await;
            }
        });
        updates(&mut sim, 1_000 + crash * 300, 300);
    }
    let clients = updates(&mut sim, 4_000, 600);
    // What the crashes may have lost: per node, a buffer of each group of
    // a pool (2 per node) and of a version not linked, per crash.
    let object = super::object(buffer::size(cfg.max_key, cfg.max_value) as u64);
    let per_node = CRASHES as u64 * (2 * 3 + 1) * object;
    let bound = 3 * per_node.div_ceil(CHUNK) * CHUNK;
    std::println!("claimed: {warm} after warm-up, {clients} after {CRASHES} client crashes (bound {bound} more)");
    assert!(clients - warm <= bound, "{} bytes more after {CRASHES} client crashes", clients - warm);
    // Metadata servers that crash: each standby's growth is bounded, and
    // memory is flat again once it has topped up what it took over.
    let mut shell = shell;
    let mut last = clients;
    for crash in 0..2u32 {
        shell.stop();
        shell = start_server(&mut sim, &cfg).unwrap();
        let base = 10_000 + crash * 2_000;
        let settled = updates(&mut sim, base, 600);
        let end = updates(&mut sim, base + 600, 600);
        std::println!("MS crash {crash}: {settled} claimed after 600 updates, {end} after 1200");
        assert_eq!(end, settled, "memory grew between crashes of the MS");
        assert!(settled - last <= 2 * 3 * CHUNK, "an MS crash cost {} bytes", settled - last);
        last = end;
    }
    // Every key reads its last value.
    let (m, c) = (sim.client(), cfg.clone());
    sim.block_on(async move {
        let mut r = connect(m.clone(), &m, &c, 8).await;
        // The writer's last updates were 12,600..13,200, round the keys.
        for (i, k) in keys.iter().enumerate() {
            let last = 13_196 + i as u32;
            assert_eq!(value(r.get(k).await), Some(last.to_le_bytes().to_vec()), "key {i}");
        }
    })
    .unwrap();
}

/// A READ that outlasts the read time-out is read again from the same
/// cursor, not from the key's head: on a long chain and a slow node, gets
/// that started again from the head at every late hop ran out of restarts
/// and answered "corrupt" (campaign seed 12847, 5 replicas). A node whose
/// every READ is late is as good as timed out: the get says so, naming
/// it (the mutant `clover-late-restarts`, which starts again from the
/// head, answers corrupt), and reads again once the node is fast.
#[test]
fn late_reads_are_read_again_and_then_time_out() {
    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 11);
    let mem = sim.client();
    let primary = node_of(b"k", 0, 3);
    let m = mem.clone();
    let c = cfg.clone();
    let a = Rc::new(RefCell::new(None));
    let a2 = a.clone();
    sim.block_on(async move {
        let mut a = connect(m.clone(), &m, &c, 1).await;
        a.insert(b"k", b"v0").await.unwrap();
        assert_eq!(value(a.get(b"k").await).as_deref(), Some(&b"v0"[..]));
        *a2.borrow_mut() = Some(a);
    })
    .unwrap();
    // Every operation on the key's primary takes 40 roundtrips of 2 us:
    // longer than the read time-out (50 us), and answered.
    let now = sim.now();
    sim.slow_node_at(primary.index(), now, 40);
    let (a2, m) = (a.clone(), mem.clone());
    let got = sim
        .block_on(async move {
            let mut a = a2.borrow_mut().take().unwrap();
            m.sleep(1_000).await;
            let got = a.get(b"k").await.map(|g| matches!(g, Got::Found(_)));
            *a2.borrow_mut() = Some(a);
            got
        })
        .unwrap();
    assert_eq!(
        got,
        Err(KvError::Down(MemError::new(primary, MemErrorKind::TimedOut))),
        "a slow node's late READs were answered as something else than its time-out"
    );
    let now = sim.now();
    sim.slow_node_at(primary.index(), now, 1);
    let got = sim
        .block_on(async move {
            let mut a = a.borrow_mut().take().unwrap();
            mem.sleep(1_000).await;
            let p = a.paths();
            (value(a.get(b"k").await), p.gc_timeouts)
        })
        .unwrap();
    assert_eq!(got.0.as_deref(), Some(&b"v0"[..]));
    assert!(got.1 > 16, "every late READ counted: {}", got.1);
}

/// Free lists are kept per size class, so a workload whose values shrink
/// leaves the groups of its larger values on their lists. Once a node has
/// no room for new buffers, the MS hands those out for the smaller class
/// (they keep their own): here 20 keys of 1,000-byte values, updated a
/// few times, leave their freed groups listed; the nodes are then filled
/// to the last chunk, and a new client writes 300-byte values, a class
/// the MS has no buffers of, faster than its reuse delay gives its own
/// groups back. Every update succeeds, in the listed groups of the
/// 1,000-byte class (named by its own class, as every version is), and
/// every key reads back its last value. (The mutant
/// `clover-strands` hands out none: an update fails with the node full;
/// `clover-larger-batch` answers a batch of them each time: they pile up
/// in the client's pool.)
#[test]
fn a_full_node_hands_out_larger_freed_groups() {
    let mut cfg = config();
    cfg.max_value = 4096;
    cfg.set_option("pool", "2").unwrap();
    let (mut sim, _shell) = setup(&cfg, 3, 14);
    let mem = sim.client();
    sim.block_on(async move {
        let keys: Vec<Vec<u8>> = (0..20u8).map(|i| alloc::vec![b'k', i]).collect();
        let (mid, small) = (buffer::class(2, 1000).unwrap(), buffer::class(2, 300).unwrap());
        let mut w = connect(mem.clone(), &mem, &cfg, 1).await;
        for round in 0..4u8 {
            for k in &keys {
                let v = [round; 1000];
                match round {
                    0 => w.insert(k, &v).await.map(Ok),
                    _ => w.update(k, &v).await,
                }
                .unwrap()
                .unwrap();
            }
            mem.sleep(3 * super::read_timeout_ns(&mem)).await;
        }
        w.close().await.unwrap();
        mem.sleep(3 * super::read_timeout_ns(&mem)).await;
        for n in 0..3 {
            let mut region = Region::open(&mem, NodeId(n)).await.unwrap();
            while region.alloc_chunk(&mem).await.is_ok() {}
        }
        let mut w = connect(mem.clone(), &mem, &cfg, 2).await;
        let mut last = alloc::vec![alloc::vec![]; keys.len()];
        for round in 0..4usize {
            for (i, k) in keys.iter().enumerate() {
                let v: Vec<u8> = (0..300).map(|j| (i + j + round) as u8).collect();
                let done = w.update(k, &v).await;
                assert_eq!(done, Ok(Ok(Written)), "key {i} round {round}: a full node refused a smaller class");
                last[i] = v;
            }
        }
        assert!(w.classes().contains(&mid), "no freed group of {mid} was handed out: pools of {:?}", w.classes());
        assert!(w.paths().larger_groups > 0, "no version of {small} was written in a larger group");
        // The larger groups a client gets for its class stay within a
        // batch (they do not pile up in its pool, out of other clients'
        // reach: 4 groups a node here if each answer carried a batch).
        for n in 0..3 {
            let held = w.free_buffers(NodeId(n));
            assert!(held <= super::pool(&cfg), "node {n}: the client holds {held} groups");
        }
        // A version in a larger group is named by its own class: a READ of
        // it reads no more than it holds.
        assert!(keys.iter().all(|k| w.cursor(k).unwrap().class == small), "a version named by its group's class");
        let mut r = connect(mem.clone(), &mem, &cfg, 3).await;
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(value(r.get(k).await).as_ref(), Some(&last[i]), "key {i}");
        }
    })
    .unwrap();
}

/// A client that crashes loses no free groups for good: the next holder
/// of its id names a new claim of it in its ALLOCs (`wire::Alloc::holder`),
/// and the MS takes back the groups it lent to the earlier holder that
/// hold no version: after the reuse delay they are handed out again, with
/// their GC version raised. One that holds a version (linked, or written
/// and never linked) is left to garbage collection. The MS is driven
/// directly here, with the ALLOCs of two holders of id 2 (claims 5 and 6).
/// (The mutant `clover-keeps-lent` takes nothing back.)
#[test]
fn a_crashed_holders_unwritten_groups_come_back() {
    use crate::substrate::msg::rpc::Status;
    use crate::substrate::msg::server::{Request, Service};
    use header::Cursor;
    use wire::{Alloc, Answer, Want};

    let cfg = config();
    let (mut sim, _shell) = setup(&cfg, 3, 22);
    let mem = sim.client();
    sim.block_on(async move {
        let index = crate::index::RaceIndex::open(&mem, MS).await.unwrap();
        let mut ms = MetadataServer::new(ms::Shape::of(&cfg), index);
        let class = buffer::class(2, 8).unwrap();
        let body = |per_node: u8, holder: u64| {
            let want = match per_node {
                0 => Vec::new(),
                n => alloc::vec![Want { class, nodes: alloc::vec![n; 3] }],
            };
            Alloc { want, retires: Vec::new(), given: Vec::new(), holder }.encode()
        };
        let mut alloc = async |client: u16, body: Vec<u8>| {
            let mut out = Vec::new();
            let req = Request { client, method: wire::ALLOC, body: &body, incarnation: None };
            assert_eq!(ms.handle(&mem, req, &mut out, 1 << 16).await, Status::Ok);
            let Some((Answer::Buffers { groups, .. }, _)) = Answer::decode(&out, 3) else { panic!("not groups") };
            (groups.into_iter().flatten().map(|g| g.primary).collect::<Vec<Cursor>>(), ms.paths().reclaimed)
        };
        // The first holder of id 2 takes 4 groups a node, writes a version
        // in one of them, and crashes.
        let (lent, _) = alloc(2, body(4, 5)).await;
        assert_eq!(lent.len(), 12);
        let written = lent[0];
        mem.write(written.at, &buffer::encode(b"k0", b"v", crate::kv::place::key_hash(b"k0"), written.gc))
            .await
            .unwrap();
        // The same holder's next ALLOC takes nothing back.
        assert_eq!(alloc(2, body(0, 5)).await.1, 0, "groups taken back from a live holder");
        // The id's next holder.
        let (_, reclaimed) = alloc(2, body(0, 6)).await;
        assert_eq!(reclaimed, 11, "groups taken back from the crashed holder");
        // Past the reuse delay, another client gets them, not the written one.
        mem.sleep(3 * super::read_timeout_ns(&mem)).await;
        let (again, _) = alloc(3, body(8, 1)).await;
        for c in &lent[1..] {
            let next = Cursor { gc: c.gc.wrapping_add(1), ..*c };
            assert!(again.contains(&next), "{c:?} did not come back");
        }
        assert!(again.iter().all(|c| c.at != written.at), "a group holding a version was handed out again");
    })
    .unwrap();
}
