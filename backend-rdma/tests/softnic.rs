//! The RDMA client over the software NIC: how operations become work
//! requests, who owns the buffers until completions arrive, time-outs,
//! failed queue pairs, and the register and key-value suites every backend
//! runs, all without hardware.

use std::pin::pin;
use std::time::Duration;

use proptest::prelude::*;
use swarm_backend_rdma::RdmaMemory;
use swarm_backend_rdma::nic::{Wr, WrKind};
use swarm_backend_rdma::softnic::{Posted, SoftNic};
use swarm_core::substrate::exec::{block_on, poll_once};
use swarm_core::systems;
use swarm_core::{MemErrorKind, Memory, NodeId, Op, OpOutput, RemoteAddr};
use swarm_mapped::{Fault, Nodes};
use swarm_testkit::{KvTest, RegisterTest, kv_suite, register_suite};

const N0: NodeId = NodeId(0);

fn rdma(cluster: &Nodes) -> RdmaMemory<SoftNic> {
    RdmaMemory::new(SoftNic::new(cluster.memory(), 4 << 20, 64))
}

fn at(offset: u64) -> RemoteAddr {
    RemoteAddr { node: N0, offset }
}

#[test]
fn reads_writes_and_cas_do_what_shared_memory_does() {
    let cluster = Nodes::anonymous(2, 1 << 16).unwrap();
    let m = rdma(&cluster);
    block_on(m.write(at(100), b"hello, rdma")).unwrap();
    assert_eq!(&*block_on(m.read(at(100), 11)).unwrap(), b"hello, rdma");
    assert_eq!(block_on(m.cas(at(8), 0, 7)).unwrap(), 0);
    assert_eq!(block_on(m.cas(at(8), 0, 9)).unwrap(), 7, "a failed CAS returns what the word holds");
    assert_eq!(block_on(m.cas(at(8), 7, 9)).unwrap(), 7);
    // What the client wrote is what another backend's handle sees.
    assert_eq!(&*block_on(cluster.memory().read(at(8), 8)).unwrap(), &9u64.to_le_bytes());
    assert!(block_on(m.read(at(0), 0)).unwrap().is_empty());
    assert_eq!((m.in_flight(), m.chunks_held()), (0, 0));
}

#[test]
fn a_pipeline_is_one_doorbell_with_only_its_last_request_signaled() {
    let cluster = Nodes::anonymous(1, 1 << 16).unwrap();
    let m = rdma(&cluster);
    let ops = [Op::Write { offset: 64, data: &[1; 32] }, Op::Cas { offset: 0, expected: 0, new: 5 }];
    let out = block_on(m.pipeline(N0, &ops)).unwrap();
    assert_eq!(out[1], OpOutput::Cas(0));
    assert_eq!(m.nic().posted(), Posted { doorbells: 1, wrs: 2, signaled: 1 });
    let chain = m.nic().last_chain();
    assert_eq!(chain.iter().map(|w| (w.signaled, w.fence)).collect::<Vec<_>>(), [(false, false), (true, false)]);
    assert!(matches!(chain[1].kind, WrKind::Cas { expected: 0, new: 5 }));
}

#[test]
fn requests_after_a_read_or_an_atomic_are_fenced_and_writes_before_a_cas_are_not() {
    let cluster = Nodes::anonymous(1, 1 << 16).unwrap();
    let m = rdma(&cluster);
    let fences = |ops: &[Op<'_>]| {
        block_on(m.pipeline(N0, ops)).unwrap();
        m.nic().last_chain().iter().map(|w: &Wr| w.fence).collect::<Vec<_>>()
    };
    let (w, r, c) = (
        Op::Write { offset: 64, data: &[2; 8] },
        Op::Read { offset: 64, len: 8 },
        Op::Cas { offset: 0, expected: 0, new: 0 },
    );
    assert_eq!(fences(&[w, w, c]), [false, false, false]);
    assert_eq!(fences(&[r, w]), [false, true]);
    assert_eq!(fences(&[c, r, w]), [false, true, true]);
    assert_eq!(fences(&[w, r, w]), [false, false, true]);
}

#[test]
fn long_transfers_are_split_into_requests_of_one_chunk_and_reassembled() {
    let cluster = Nodes::anonymous(1, 8 << 20).unwrap();
    let m = rdma(&cluster);
    let data: Vec<u8> = (0..(3 << 20) + 100).map(|i| (i * 7 % 251) as u8).collect();
    block_on(m.write(at(4096), &data)).unwrap();
    assert_eq!(m.nic().last_chain().len(), 4, "3 MiB + 100 B in pieces of 1 MiB");
    let back = block_on(m.read(at(4096), data.len())).unwrap();
    assert!(*back == *data);
    assert_eq!(m.chunks_held(), 0);
    // A transfer that would not fit the queue pair is refused, not posted.
    let small_queue = RdmaMemory::new(SoftNic::new(cluster.memory(), 4 << 20, 4));
    let e = block_on(small_queue.read(at(0), 5 << 20)).unwrap_err();
    assert!(matches!(e.kind, MemErrorKind::TooLarge { .. }), "{e:?}");
    assert_eq!(small_queue.nic().posted().doorbells, 0);
}

#[test]
fn bad_requests_are_refused_before_anything_is_posted() {
    fn kind<T: std::fmt::Debug>(r: Result<T, swarm_core::MemError>) -> MemErrorKind {
        r.unwrap_err().kind
    }
    let cluster = Nodes::anonymous(2, 1 << 12).unwrap();
    let m = rdma(&cluster);
    assert_eq!(kind(block_on(m.read(RemoteAddr { node: NodeId(2), offset: 0 }, 8))), MemErrorKind::NoSuchNode);
    assert!(matches!(kind(block_on(m.read(at(4090), 8))), MemErrorKind::OutOfBounds { .. }));
    assert!(matches!(kind(block_on(m.read(at(u64::MAX), 8))), MemErrorKind::OutOfBounds { .. }));
    assert_eq!(kind(block_on(m.cas(at(4), 0, 1))), MemErrorKind::Misaligned { offset: 4 });
    assert_eq!(kind(block_on(m.pipeline(N0, &[]))), MemErrorKind::BadPipeline { len: 0 });
    m.post_background(N0, &[Op::Write { offset: 4095, data: &[1, 2] }]);
    assert_eq!(m.nic().posted().doorbells, 0);
}

#[test]
fn a_dropped_operation_keeps_its_buffer_until_the_completion_arrives() {
    let cluster = Nodes::anonymous(1, 1 << 16).unwrap();
    block_on(cluster.memory().write(at(0), &[0xaa; 64])).unwrap();
    let m = RdmaMemory::new(SoftNic::new(cluster.memory(), 4 << 20, 64).with_delay(3));
    {
        let mut read = pin!(m.read(at(0), 64));
        assert!(poll_once(read.as_mut()).is_none(), "posted, completion not yet delivered");
        assert_eq!((m.in_flight(), m.chunks_held()), (1, 1));
    } // dropped while the NIC may still write into its chunk
    assert_eq!((m.in_flight(), m.chunks_held()), (1, 1), "the chunk stays the NIC's");
    let abandoned = m.nic().last_chain()[0].local;
    // A new operation gets another chunk, so the late read cannot land in it.
    block_on(m.write(at(128), &[0x55; 64])).unwrap();
    assert_ne!(m.nic().last_chain()[0].local, abandoned);
    assert_eq!((m.in_flight(), m.chunks_held()), (0, 0), "freed once its completion was polled");
}

#[test]
fn a_stalled_node_times_out_and_its_late_completion_is_reaped() {
    let cluster = Nodes::anonymous(2, 1 << 16).unwrap();
    let m = rdma(&cluster).with_timeout(Duration::from_millis(20));
    cluster.set_fault(N0, Fault::Stalled).unwrap();
    let e = block_on(m.write(at(0), &[1; 8])).unwrap_err();
    assert_eq!(e.kind, MemErrorKind::TimedOut);
    assert_eq!(m.chunks_held(), 1, "the timed-out write's buffer is still the NIC's");
    // The other node is served meanwhile.
    block_on(m.write(RemoteAddr { node: NodeId(1), offset: 0 }, &[2; 8])).unwrap();
    cluster.set_fault(N0, Fault::Healthy).unwrap();
    block_on(m.read(at(0), 8)).unwrap();
    assert_eq!(m.chunks_held(), 0);
    assert_eq!(&*block_on(cluster.memory().read(at(0), 8)).unwrap(), &[1; 8], "the late write was applied, in order");
}

#[test]
fn a_failed_node_is_unreachable_for_good_and_the_others_are_not() {
    let cluster = Nodes::anonymous(2, 1 << 16).unwrap();
    let m = rdma(&cluster);
    cluster.set_fault(N0, Fault::Failed).unwrap();
    let ops = [Op::Write { offset: 64, data: &[1; 8] }, Op::Cas { offset: 0, expected: 0, new: 1 }];
    assert_eq!(block_on(m.pipeline(N0, &ops)).unwrap_err().kind, MemErrorKind::Unreachable);
    assert!(m.nic().broken(N0));
    // Like a real queue pair, it stays in the error state after the node heals.
    cluster.set_fault(N0, Fault::Healthy).unwrap();
    assert_eq!(block_on(m.read(at(0), 8)).unwrap_err().kind, MemErrorKind::Unreachable);
    block_on(m.write(RemoteAddr { node: NodeId(1), offset: 0 }, &[2; 8])).unwrap();
    assert_eq!((m.in_flight(), m.chunks_held()), (0, 0));
}

#[test]
fn a_partly_posted_chain_keeps_its_buffers_and_fails_its_queue_pair() {
    let cluster = Nodes::anonymous(2, 1 << 16).unwrap();
    let m = rdma(&cluster);
    let ops = [
        Op::Write { offset: 64, data: &[1; 8] },
        Op::Read { offset: 128, len: 8 },
        Op::Cas { offset: 0, expected: 0, new: 1 },
    ];
    // The NIC takes the write and refuses the rest: the write is in flight
    // unsignaled, so nothing will say when its buffer is free again.
    m.nic().refuse_next_after(1);
    let e = block_on(m.pipeline(N0, &ops)).unwrap_err();
    assert!(matches!(e.kind, MemErrorKind::Backend { code } if code == 0x10000 + 12), "{e:?}");
    assert_eq!(m.chunks_held(), 3, "every chunk of the chain stays with the backend");
    assert!(m.nic().broken(N0), "the queue pair was put in the error state");
    // Nothing more is ordered after requests nobody tracks.
    assert_eq!(block_on(m.read(at(0), 8)).unwrap_err().kind, MemErrorKind::Unreachable);
    assert_eq!(m.nic().posted().wrs, 1, "the later read was never posted");
    // The other node is untouched; a refusal of the whole chain keeps nothing.
    let n1 = RemoteAddr { node: NodeId(1), offset: 0 };
    block_on(m.write(n1, &[2; 8])).unwrap();
    m.nic().refuse_next_after(0);
    assert!(block_on(m.pipeline(NodeId(1), &ops)).is_err());
    assert_eq!(m.chunks_held(), 3);
    assert_eq!(&*block_on(m.read(n1, 8)).unwrap(), &[2; 8], "node 1 still serves");
}

#[test]
fn a_full_queue_pair_makes_operations_wait_not_fail() {
    let cluster = Nodes::anonymous(1, 1 << 16).unwrap();
    let m = RdmaMemory::new(SoftNic::new(cluster.memory(), 4 << 20, 4).with_delay(2));
    for i in 0..16u64 {
        m.post_background(N0, &[Op::Write { offset: i * 8, data: &i.to_le_bytes() }]);
    }
    block_on(m.read(at(0), 8)).unwrap();
    while m.in_flight() > 0 {
        block_on(m.read(at(0), 8)).unwrap();
    }
    let words = block_on(cluster.memory().read(at(0), 128)).unwrap();
    for i in 0..16u64 {
        assert_eq!(words[i as usize * 8..][..8], i.to_le_bytes(), "background write {i}");
    }
}

#[test]
fn a_small_arena_serves_transfers_by_waiting_for_room() {
    let cluster = Nodes::anonymous(1, 1 << 20).unwrap();
    // 16 KiB of buffers: pieces of at most 4 KiB.
    let m = RdmaMemory::new(SoftNic::new(cluster.memory(), 16 << 10, 64).with_delay(2));
    let data: Vec<u8> = (0..16_000u32).map(|i| i as u8).collect();
    block_on(m.write(at(0), &data)).unwrap();
    assert!(*block_on(m.read(at(0), data.len())).unwrap() == *data);
    // A transfer the whole arena cannot hold is refused, not waited for.
    let e = block_on(m.read(at(0), 20_000)).unwrap_err();
    assert!(matches!(e.kind, MemErrorKind::TooLarge { .. }), "{e:?}");
    // Eight reads of 4 KiB at once: four fit, the others wait their turn.
    let mut futs: Vec<_> = (0..8).map(|i| Box::pin(m.read(at(i * 4096), 4096))).collect();
    let mut results: Vec<Option<Vec<u8>>> = vec![None; futs.len()];
    while results.iter().any(Option::is_none) {
        for (f, r) in futs.iter_mut().zip(&mut results) {
            if r.is_none() {
                *r = poll_once(f.as_mut()).map(|out| out.unwrap().to_vec());
            }
        }
    }
    let mut model = data.clone();
    model.resize(8 * 4096, 0);
    for (i, r) in results.iter().enumerate() {
        assert!(r.as_deref() == Some(&model[i * 4096..(i + 1) * 4096]), "read {i}");
    }
    assert_eq!(m.chunks_held(), 0);
}

#[test]
fn the_register_suite_passes_over_rdma() {
    let nodes = [NodeId(0), NodeId(1), NodeId(2)];
    let t = RegisterTest { seed: 5, ..RegisterTest::default() };
    let cluster = Nodes::anonymous(nodes.len(), t.node_size).unwrap();
    let report = register_suite(|| rdma(&cluster), &nodes, &t).unwrap();
    println!("rdma over the software NIC: {report}");
}

#[test]
fn every_store_passes_the_kv_suite_over_rdma() {
    for &system in systems::ALL {
        let t = KvTest { system, replicas: 3, seed: 9, ops_per_client: 400, ..KvTest::default() };
        let cluster = Nodes::anonymous(3, t.node_size).unwrap();
        let ops = kv_suite(|| rdma(&cluster), &t).unwrap_or_else(|e| panic!("{}: {e}", system.name()));
        println!("{} over rdma: {ops} operations checked", system.name());
    }
}

#[derive(Clone, Debug)]
enum ModelOp {
    Read(u64, usize),
    Write(u64, Vec<u8>),
    Cas(u64, u64, u64),
}

impl ModelOp {
    fn op(&self) -> Op<'_> {
        match self {
            ModelOp::Read(offset, len) => Op::Read { offset: *offset, len: *len },
            ModelOp::Write(offset, data) => Op::Write { offset: *offset, data },
            ModelOp::Cas(offset, expected, new) => Op::Cas { offset: *offset, expected: *expected, new: *new },
        }
    }
}

fn model_op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        (0u64..1100, 0usize..300).prop_map(|(o, l)| ModelOp::Read(o, l)),
        (0u64..1100, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(o, d)| ModelOp::Write(o, d)),
        (0u64..140, 0u64..3, 0u64..3).prop_map(|(w, e, n)| ModelOp::Cas(w * 8 + (w % 5 == 4) as u64, e, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any sequence of pipelines does over RDMA exactly what it does
    /// directly on shared memory: the same outputs, the same errors, the
    /// same bytes left in memory.
    #[test]
    fn rdma_does_what_shared_memory_does(
        pipelines in proptest::collection::vec(proptest::collection::vec(model_op(), 0..6), 1..20),
        delay in 1u64..4,
    ) {
        let (a, b) = (Nodes::anonymous(1, 1024).unwrap(), Nodes::anonymous(1, 1024).unwrap());
        let m = RdmaMemory::new(SoftNic::new(a.memory(), 1 << 16, 16).with_delay(delay));
        let direct = b.memory();
        for p in &pipelines {
            let ops: Vec<Op<'_>> = p.iter().map(ModelOp::op).collect();
            let got = block_on(m.pipeline(N0, &ops));
            let want = block_on(direct.pipeline(N0, &ops));
            prop_assert_eq!(got, want);
        }
        prop_assert_eq!(block_on(m.read(at(0), 1024)).unwrap(), block_on(direct.read(at(0), 1024)).unwrap());
        prop_assert_eq!((m.in_flight(), m.chunks_held()), (0, 0));
    }
}

/// FUSEE's phases are doorbell-batched, with selective signalling (FUSEE
/// §4.7): what one phase sends a node goes as one chain, one doorbell,
/// its last request alone signaled. On 3 replicas, an update from a
/// cached entry is 6 chains of 15 requests in 3 roundtrips: the object
/// (behind the previous object's commit) to each replica, the key block,
/// the evidence mark and the CAS to each backup, the block, the mark and
/// the CAS to the primary; a get
/// from a cached entry is the object's READ and the slot's, 1 or 2
/// chains. A provisional commit, a delete's object or a log anchor rides
/// beside a phase as a chain of its own (not measured here).
#[test]
fn fusee_posts_one_chain_per_node_and_phase() {
    use swarm_core::kv::{KvClient, StoreConfig, Who};
    use swarm_core::substrate::clock::SystemClock;
    use swarm_core::substrate::lease::Want;
    use swarm_core::substrate::space::region::Region;
    let system = systems::from_name("fusee").unwrap();
    let mut cfg = StoreConfig::new(system, 64);
    cfg.replicas = 3;
    cfg.writers = 2;
    let cluster = Nodes::anonymous(3, 16 << 20).unwrap();
    let m = rdma(&cluster);
    for n in 0..3 {
        block_on(Region::format(&m, NodeId(n), 16 << 20, 256 << 10)).unwrap();
    }
    let clock = SystemClock::starting_now();
    block_on(systems::format(&m, &cfg, clock.epoch_us)).unwrap();
    let mut c = block_on(async {
        let held = systems::claim(&&m, &cfg, &clock, Want::Any, 1).await?;
        systems::connect_any(&m, &cfg, Who::Lease(held), clock).await
    })
    .unwrap();
    block_on(c.insert(b"k", b"v0")).unwrap();
    let per = |op: &mut dyn FnMut()| {
        let before = m.nic().posted();
        op();
        let after = m.nic().posted();
        (after.doorbells - before.doorbells, after.wrs - before.wrs, after.signaled - before.signaled)
    };
    for i in 0..20u8 {
        let (doorbells, wrs, signaled) = per(&mut || {
            block_on(c.update(b"k", &[i; 40])).unwrap().unwrap();
        });
        assert_eq!((doorbells, signaled), (6, 6), "update {i}: {wrs} requests");
        // Object (and the last commit, after the first update) ×3; block
        // and CAS ×2; block, mark and CAS.
        // The previous commit and the object ×3; the block, the mark of
        // the word the round starts from and the CAS ×2 backups; the
        // block, its mark and the CAS on the primary (the last chain).
        assert_eq!(wrs, 2 * 3 + 3 * 2 + 3, "update {i}");
        let last: Vec<_> =
            m.nic().last_chain().iter().map(|w| (w.signaled, matches!(w.kind, WrKind::Cas { .. }))).collect();
        assert_eq!(last, [(false, false), (false, true), (true, true)], "update {i}'s commit on the primary");
        let (doorbells, _, signaled) = per(&mut || {
            let got = block_on(c.get(b"k")).unwrap();
            assert!(matches!(got, swarm_core::kv::Got::Found(v) if v[..] == [i; 40]));
        });
        assert!((1..=2).contains(&doorbells) && signaled == doorbells, "get {i}: {doorbells} doorbells");
    }
}
