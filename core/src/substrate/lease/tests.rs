use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use super::*;
use crate::check::{SimClock, clock};
use crate::sim::{CrashMode, Sim, SimConfig, SimMemory};

const NODES: [NodeId; 3] = [NodeId(0), NodeId(1), NodeId(2)];
/// Lease length of these tests: 1 ms of virtual time.
const LENGTH_NS: u64 = 1_000_000;
/// How long the tests stall a node.
const STALL_NS: u64 = 300_000;
/// Past a lease's expiry and its grace.
const AFTER_GRACE_NS: u64 = LENGTH_NS + 3 * MAX_SKEW_NS + 1_000_000;

fn sim(seed: u64) -> Sim {
    let mut sim = Sim::new(SimConfig { seed, nodes: 3, node_size: 1 << 20, ..SimConfig::default() });
    let admin = sim.client();
    sim.block_on(async move {
        for n in NODES {
            Region::format(&admin, n, 1 << 20, 16 << 10).await.unwrap();
            format(&admin, n, 8, LENGTH_NS).await.unwrap();
        }
    })
    .unwrap();
    sim
}

async fn table(mem: &SimMemory) -> LeaseTable {
    LeaseTable::open(mem, &NODES).await.unwrap()
}

fn clk(mem: &SimMemory) -> SimClock {
    clock(mem, 0)
}

/// What a holder records is what the next holder resumes: nothing for a
/// fresh id; the released payload; after a crash, the last recorded one,
/// marked crashed, with a floor above the crashed holder's times.
#[test]
fn the_next_holder_resumes_what_the_last_one_left() {
    let mut sim = sim(1);
    let mem = sim.client();
    let out = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let a = t.claim(&mem, &c, Want::Any, 1).await.unwrap();
            let first = (a.id, a.resume());
            a.release(&mem, &[1, 2, 3]).await.unwrap();
            let mut b = t.claim(&mem, &c, Want::Any, 2).await.unwrap();
            let released = (b.id, b.resume());
            b.record(&mem, &[4, 5, 6]).await.unwrap();
            let expiry = b.expiry();
            // b stops without releasing: the id is held until its lease and
            // the grace have passed.
            let held = t.claim(&mem, &c, Want::Id(b.id), 3).await.unwrap_err();
            let other = t.claim(&mem, &c, Want::Any, 3).await.unwrap();
            mem.sleep(AFTER_GRACE_NS).await;
            let d = t.claim(&mem, &c, Want::Id(b.id), 4).await.unwrap();
            (first, released, held, other.id, d.resume(), expiry)
        })
        .unwrap();
    let ((id, fresh), (id2, released), held, other, crashed, expiry) = out;
    assert_eq!((id, fresh.state), (1, Resumed::Fresh), "the lowest free id, never held");
    assert_eq!((id2, released.state, &released.payload[..4]), (1, Resumed::Released, &[1, 2, 3, 0][..]));
    assert!(matches!(held, LeaseError::Taken { id: 1, free_in_ms } if free_in_ms >= 3_000), "{held:?}");
    assert_eq!(other, 2, "another id meanwhile");
    assert_eq!((crashed.state, &crashed.payload[..3]), (Resumed::Crashed, &[4, 5, 6][..]));
    assert!(crashed.floor > expiry, "the floor is above the crashed holder's times");
}

/// Clients that claim at once: each gets its own id, and of those that ask
/// for the same id exactly one gets it.
#[test]
fn concurrent_claims_never_share_an_id() {
    for seed in 0..40 {
        let mut sim = sim(seed);
        let got = Rc::new(RefCell::new(Vec::new()));
        for i in 0..6u32 {
            let m = sim.client();
            let got = got.clone();
            sim.spawn(&m.clone(), async move {
                m.sleep(m.random(0, 3_000)).await;
                let t = table(&m).await;
                let want = if i % 2 == 0 { Want::Id(5) } else { Want::Any };
                let r = t.claim(&m, &clk(&m), want, i).await;
                got.borrow_mut().push((want, r.map(|h| h.id)));
            });
        }
        sim.run().unwrap();
        let got = got.borrow();
        let ids: Vec<u8> = got.iter().filter_map(|(_, r)| r.as_ref().ok().copied()).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "seed {seed}: an id given twice: {got:?}");
        let fives = got.iter().filter(|(w, r)| *w == Want::Id(5) && r.is_ok()).count();
        assert!(fives <= 1, "seed {seed}: {got:?}");
        let any_failed = got.iter().any(|(w, r)| *w == Want::Any && r.is_err());
        assert!(!any_failed, "seed {seed}: a claim of any id failed with ids free: {got:?}");
        for (w, r) in got.iter() {
            if let (Want::Id(5), Err(e)) = (w, r) {
                assert!(matches!(e, LeaseError::Taken { id: 5, .. }), "seed {seed}: {e:?}");
            }
        }
    }
}

/// A holder that stops renewing loses its id to a later claim; renewing
/// then says so. One that renews keeps it.
#[test]
fn a_lapsed_lease_is_lost_and_a_renewed_one_kept() {
    let mut sim = sim(2);
    let mem = sim.client();
    let (kept, lost) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let mut a = t.claim(&mem, &c, Want::Id(3), 1).await.unwrap();
            for _ in 0..10 {
                mem.sleep(LENGTH_NS / 3).await;
                a.keep(&mem, c.now()).await.unwrap();
            }
            let kept = t.claim(&mem, &c, Want::Id(3), 2).await.err();
            mem.sleep(AFTER_GRACE_NS).await;
            let _b = t.claim(&mem, &c, Want::Id(3), 2).await.unwrap();
            (kept, a.renew(&mem, c.now()).await)
        })
        .unwrap();
    assert!(matches!(kept, Some(LeaseError::Taken { id: 3, .. })), "{kept:?}");
    assert_eq!(lost, Err(LeaseError::Lost { id: 3 }));
}

/// A holder whose id was taken over while it was paused stays without it,
/// even once the next holder gave the id back: what it knew of the id's
/// use (a log's cursor, its last time) is stale, so only a new claim,
/// which reads the record the next holder left, may use the id again.
/// Its renewals, records and release all fail, and the id stays free.
#[test]
fn a_lease_lost_to_another_holder_stays_lost_after_that_holder_leaves() {
    let mut sim = sim(3);
    let mem = sim.client();
    let (first, again, kept, record, release, free) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let mut a = t.claim(&mem, &c, Want::Id(3), 1).await.unwrap();
            mem.sleep(AFTER_GRACE_NS).await;
            let b = t.claim(&mem, &c, Want::Id(3), 2).await.unwrap();
            b.release(&mem, &[7]).await.unwrap();
            let first = a.renew(&mem, c.now()).await;
            let again = a.renew(&mem, c.now()).await;
            let kept = a.keep(&mem, c.now()).await;
            let record = a.record(&mem, &[9]).await;
            let release = a.release(&mem, &[9]).await;
            let free = t.claim(&mem, &c, Want::Id(3), 3).await.map(|h| (h.resume().state, h.resume().payload[0]));
            (first, again, kept, record, release, free)
        })
        .unwrap();
    let lost = Err(LeaseError::Lost { id: 3 });
    assert_eq!(first, lost, "the first renewal after the pause");
    assert_eq!(again, lost, "a second renewal took the id back from under its next holder's record");
    assert_eq!(kept, lost);
    assert_eq!(record, lost, "a lost holder's record");
    assert_eq!(release, lost, "a lost holder's release");
    assert_eq!(free, Ok((Resumed::Released, 7)), "the next claim resumes from the next holder's release");
}

/// A simulation (`seed`) whose client holds id 3 on the two sites other
/// than `stalled`, which was stalled at its claim; and the table.
fn held_on_two_sites(seed: u64, stalled: usize) -> (Sim, SimMemory, LeaseTable, Held) {
    let mut sim = sim(seed);
    let mem = sim.client();
    let m = mem.clone();
    let t = sim.block_on(async move { table(&m).await }).unwrap();
    let at = sim.now();
    sim.stall_node_at(stalled, at, STALL_NS);
    let m = mem.clone();
    let (t, a) = sim
        .block_on(async move {
            let a = t.claim(&m, &clk(&m), Want::Id(3), 1).await.unwrap();
            m.sleep(STALL_NS).await;
            (t, a)
        })
        .unwrap();
    let held: Vec<usize> = (0..3).filter(|&s| a.words[s] != 0).collect();
    assert_eq!(held.len(), 2, "the claim holds two sites");
    assert!(!held.contains(&stalled), "the stalled site is not held");
    (sim, mem, t, a)
}

/// Past its expiry, a holder renews only on its own words: a site it
/// takes then proves nothing. A holds sites 0 and 1 (site 2 stalled at
/// its claim), and is paused past its lease; B claims the id on sites 1
/// and 2 (site 0 stalled) and gives it back, which clears both. A's
/// renewal with site 1 silent finds its word on site 0 and site 2 free:
/// a majority of words, but not of its own, so the id is not renewed (no
/// majority); once site 1 answers, A learns that the id was taken over.
#[test]
fn past_its_expiry_a_lease_is_renewed_only_on_its_own_words() {
    let (mut sim, mem, t, mut a) = held_on_two_sites(7, 2);
    let m = mem.clone();
    sim.block_on(async move { m.sleep(AFTER_GRACE_NS).await }).unwrap();
    let at = sim.now();
    sim.stall_node_at(0, at, STALL_NS);
    {
        let m = mem.clone();
        sim.block_on(async move {
            let b = t.claim(&m, &clk(&m), Want::Id(3), 2).await.unwrap();
            m.sleep(STALL_NS).await;
            b.release(&m, &[7]).await.unwrap();
        })
        .unwrap();
    }
    let at = sim.now();
    sim.stall_node_at(1, at, STALL_NS);
    let (silent, told) = sim
        .block_on(async move {
            let c = clk(&mem);
            let silent = a.renew(&mem, c.now()).await;
            mem.sleep(STALL_NS).await;
            let told = a.renew(&mem, c.now()).await;
            (silent, told, a.renew(&mem, c.now()).await)
        })
        .map(|(s, t, again)| {
            assert_eq!(again, t, "lost for good");
            (s, t)
        })
        .unwrap();
    assert_eq!(silent, Err(LeaseError::NoQuorum), "renewed on a site taken past the expiry");
    assert_eq!(told, Err(LeaseError::Lost { id: 3 }));
}

/// A claim of the id that lost can leave its word on a site, until its
/// expiry and the grace, where it could not take it back in time (SWARM-KV
/// campaigns of pDPM-Direct: a claimer whose give-back met a stalled
/// node). The holder,
/// on a bare majority, takes that site at its renewals while its lease holds
/// (no other claim can win then), and so survives the crash of one of the
/// sites it held.
#[test]
fn a_site_held_by_a_claim_that_lost_is_taken_while_the_lease_holds() {
    let (mut sim, mem, t, mut a) = held_on_two_sites(8, 0);
    let m = mem.clone();
    let t = sim
        .block_on(async move {
            // The loser's word, left on site 0 (free when it read it).
            let orphan = word(2, clk(&m).now() + clk(&m).ticks(LENGTH_NS));
            assert_eq!(m.cas(t.word(0, 3), 0, orphan).await, Ok(0));
            t
        })
        .unwrap();
    let kept = sim
        .block_on(async move {
            let c = clk(&mem);
            // The first renewal finds the word, the second takes it.
            for _ in 0..2 {
                mem.sleep(LENGTH_NS / 2).await;
                a.keep(&mem, c.now()).await.unwrap();
            }
            (a.words[0] != 0, a)
        })
        .unwrap();
    assert!(kept.0, "site 0 taken at the renewal");
    let renewed = renew_after_crash(&mut sim, kept.1, 1);
    let mem = sim.client();
    let claimed = sim.block_on(async move { t.claim(&mem, &clk(&mem), Want::Id(3), 2).await.err() }).unwrap();
    assert_eq!(renewed, Ok(()), "renewed with site 1 down");
    assert!(matches!(claimed, Some(LeaseError::Taken { id: 3, .. })), "{claimed:?}");
}

/// Crashes `node`, then renews `a` half a lease later.
fn renew_after_crash(sim: &mut Sim, mut a: Held, node: usize) -> Result<(), LeaseError> {
    let now = sim.now();
    sim.crash_node_at(node, now, CrashMode::FailFast);
    let mem = sim.client();
    sim.block_on(async move {
        let c = clk(&mem);
        mem.sleep(LENGTH_NS / 2).await;
        a.renew(&mem, c.now()).await
    })
    .unwrap()
}

/// A crashed minority of the table's nodes changes nothing; a crashed
/// majority is an error, not a hang.
#[test]
fn a_minority_of_nodes_may_be_down() {
    let mut sim = sim(3);
    sim.crash_node_at(2, 0, CrashMode::Hang);
    let mem = sim.client();
    let (one_down, released) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let a = t.claim(&mem, &c, Want::Any, 1).await.unwrap();
            let id = a.id;
            a.release(&mem, &[7, 7, 7]).await.unwrap();
            let b = t.claim(&mem, &c, Want::Any, 2).await.unwrap();
            (id, (b.id, b.resume().payload[..3].to_vec()))
        })
        .unwrap();
    assert_eq!((one_down, released), (1, (1, vec![7, 7, 7])));
    let mut sim = self::sim(4);
    sim.crash_node_at(1, 0, CrashMode::FailFast);
    sim.crash_node_at(2, 0, CrashMode::FailFast);
    let mem = sim.client();
    let err = sim.block_on(async move { LeaseTable::open(&mem, &NODES).await.err() }).unwrap();
    assert_eq!(err, Some(LeaseError::NoQuorum));
}

/// An id whose holder stopped, with one site of its three down and its
/// word gone from another (a claim there that never landed): a claim of
/// it loses, and says when the holder's word on the third runs out, not
/// that it is free now; after that, it is claimed.
#[test]
fn a_claim_that_loses_says_when_the_id_frees() {
    let mut sim = sim(5);
    sim.crash_node_at(2, 100_000, CrashMode::FailFast);
    let mem = sim.client();
    let (taken, later) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let a = t.claim(&mem, &c, Want::Id(2), 1).await.unwrap();
            mem.write(t.word(0, a.id), &0u64.to_le_bytes()).await.unwrap();
            mem.sleep(200_000).await;
            let taken = t.claim(&mem, &c, Want::Id(2), 2).await.unwrap_err();
            mem.sleep(AFTER_GRACE_NS).await;
            let later = t.claim(&mem, &c, Want::Id(2), 3).await.map(|h| h.id);
            (taken, later)
        })
        .unwrap();
    let LeaseError::Taken { id: 2, free_in_ms } = taken else { panic!("{taken:?}") };
    assert!(free_in_ms > 0 && free_in_ms * 1_000_000 <= AFTER_GRACE_NS, "{free_in_ms} ms");
    assert_eq!(later, Ok(2));
}

/// Damaged tables are errors; a damaged record counts as absent.
#[test]
fn damaged_tables_are_errors() {
    let mut sim = sim(5);
    let mem = sim.client();
    let (header, resumed) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let a = t.claim(&mem, &c, Want::Id(2), 1).await.unwrap();
            a.release(&mem, &[9, 9, 9]).await.unwrap();
            // Record 2's body garbled on one node: the others still say it.
            mem.write(t.record(0, 2), &[0xee; 8]).await.unwrap();
            let b = t.claim(&mem, &c, Want::Id(2), 2).await.unwrap();
            // Every header garbled.
            for n in NODES {
                let base = Region::read_root(&mem, n, roots::LEASES).await.unwrap();
                mem.write(RemoteAddr::new(n, base + 8), &[0xff; 8]).await.unwrap();
            }
            (LeaseTable::open(&mem, &NODES).await.err(), b.resume())
        })
        .unwrap();
    assert!(matches!(header, Some(LeaseError::Corrupt { what: "bad header", .. })), "{header:?}");
    assert_eq!((resumed.state, &resumed.payload[..3]), (Resumed::Released, &[9, 9, 9][..]));
}

/// A node stalled while a client opens the table or claims (SWARM §7.7)
/// costs the claim a few roundtrips, not the stall; the lease starts on
/// the other two sites, takes the stalled one at its renewals once it
/// answers, and so survives the crash of another node afterwards.
#[test]
fn a_site_left_out_as_late_is_taken_at_renewal() {
    // Stalled from the start (the table has no site there), and stalled
    // after the table was opened (the claim's CAS lands late).
    for stall_after_open in [false, true] {
        let mut sim = sim(6);
        let mem = sim.client();
        let t = if stall_after_open {
            let m = mem.clone();
            Some(sim.block_on(async move { table(&m).await }).unwrap())
        } else {
            None
        };
        let at = sim.now();
        sim.stall_node_at(1, at, STALL_NS);
        let (took, sites, renewed) = sim
            .block_on(async move {
                let t0 = mem.now();
                let t = match t {
                    Some(t) => t,
                    None => table(&mem).await,
                };
                let c = clk(&mem);
                let mut a = t.claim(&mem, &c, Want::Any, 1).await.unwrap();
                let took = mem.now() - t0;
                let at_claim = a.words.iter().filter(|&&w| w != 0).count();
                for _ in 0..6 {
                    mem.sleep(LENGTH_NS / 2).await;
                    a.keep(&mem, c.now()).await.unwrap();
                }
                let sites = (at_claim, a.words.iter().filter(|&&w| w != 0).count());
                (took, sites, a)
            })
            .unwrap();
        assert!(took < STALL_NS / 3, "claiming took {took} ns");
        assert_eq!(sites, (2, 3), "sites held at the claim, and after renewals");
        let kept = renew_after_crash(&mut sim, renewed, 2);
        assert_eq!(kept, Ok(()), "stalled after open: {stall_after_open}");
    }
}

/// A holder that records only marks (its allocator's, before it writes
/// words of its own) repeats the words its claim resumed: after it crashes
/// too, the id's next holder still finds where the last holder with words
/// stood (a SWARM client's log cursor), and the chunks from their marks.
#[test]
fn a_record_of_marks_keeps_the_words_the_claim_resumed() {
    use crate::substrate::space::slab::{HEAD_WORDS, SlabAllocator};
    let mut sim = sim(4);
    let mem = sim.client();
    let (head, chunks) = sim
        .block_on(async move {
            let t = table(&mem).await;
            let c = clk(&mem);
            let mut a = t.claim(&mem, &c, Want::Id(1), 1).await.unwrap();
            let mut slab = SlabAllocator::new();
            slab.record(&mem, &mut a, [7, 8, 9], None).await.unwrap();
            mem.sleep(AFTER_GRACE_NS).await;
            // A crashed; B takes its id over and carves before any words.
            let mut b = t.claim(&mem, &c, Want::Id(1), 2).await.unwrap();
            let mut slab = SlabAllocator::new();
            slab.resume_from(&b.resume().payload);
            slab.take_over_marked(&b.resume().payload);
            slab.alloc(&mem, NodeId(0), 64).await.unwrap();
            assert!(slab.unrecorded());
            slab.record_marks(&mem, Some(&mut b)).await.unwrap();
            mem.sleep(AFTER_GRACE_NS).await;
            // B crashed too.
            let next = t.claim(&mem, &c, Want::Id(1), 3).await.unwrap();
            let p = next.resume().payload;
            let mut words = [0; HEAD_WORDS];
            words.copy_from_slice(&p[..HEAD_WORDS]);
            (words, p[HEAD_WORDS])
        })
        .unwrap();
    assert_eq!(head, [7, 8, 9], "the words A recorded");
    assert_eq!(chunks, 1, "B's chunk, from its mark");
}
