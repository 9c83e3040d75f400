//! Several OS processes on one shared cluster: the backend's real use.
//!
//! The test re-executes its own binary as child processes
//! (`swarm_testkit::procs`). Three children share two nodes in a fresh directory under `/dev/shm` and, all at once:
//!
//! - increment one CAS counter on each node 170,000 times each (1,020,000
//!   increments in all), checking that every value a CAS returns is one some
//!   increment wrote (counters carry a check sum, so a torn word shows);
//! - publish 64-byte records to slots they own, as an ordered pipeline
//!   write-then-CAS of the record's sequence number, and read the others'
//!   slots: after seeing sequence number `P` published, a reader must find
//!   every word of the record well-formed, from its owner, and no older
//!   than `P` (the ordering guarantee of pipelines across processes);
//! - write their own few bytes of words they share with the others (heads,
//!   tails, spans of two words) and read them back unchanged.
//!
//! In the end no increment may be lost. The directory is removed even if the
//! test fails, and children that outlive their time are killed.
#![cfg(not(loom))]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use swarm_backend_shm::{ShmCluster, ShmMemory};
use swarm_core::sim::Rng;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::{read_word, word_at};
use swarm_core::{Memory, NodeId, Op, RemoteAddr};
use swarm_testkit::procs::{self, Children};

const TEST_NAME: &str = "three_processes_share_two_nodes";

const PROCESSES: u64 = 3;
const NODES: u16 = 2;
const NODE_SIZE: u64 = 64 * 1024;
/// Increments of each counter by each process.
const INCREMENTS: u64 = 170_000;
/// How long children may take before they are killed (a hang guard, far
/// above the few seconds the test takes).
const CHILD_DEADLINE: Duration = Duration::from_secs(300);

/// Counter word (one per node).
const COUNTER: u64 = 64;
/// Start barrier: each child increments it, then waits for all (node 0).
const READY: u64 = 128;
/// Slot `s`: published sequence word at `SLOTS + 128 s`, 64-byte record at +64.
const SLOTS: u64 = 4096;
const SLOTS_PER_PROCESS: u64 = 4;
/// Byte lanes: 8 groups of 24 bytes; process `p` owns `LANES[p]` of each.
const LANE_AREA: u64 = 8192;
const LANES: [(u64, usize); 3] = [(3, 5), (8, 5), (13, 6)];
const LANE_GROUPS: u64 = 8;

fn addr(node: u16, offset: u64) -> RemoteAddr {
    RemoteAddr::new(NodeId(node), offset)
}

/// A counter value with a check sum in its low half: `count << 32 | check`.
fn counter(count: u64) -> u64 {
    (count << 32) | u64::from((count as u32).wrapping_mul(0x9E37_79B9) ^ 0xA5A5_A5A5)
}

fn decode_counter(word: u64) -> Option<u64> {
    let count = word >> 32;
    (counter(count) == word).then_some(count)
}

/// A record word: owner tag, sequence number and check bits.
fn record_word(tag: u64, seq: u64) -> u64 {
    (tag << 56) | (seq << 24) | (tag.wrapping_mul(0x2545_F491) ^ seq.wrapping_mul(0x9E37_79B9)) & 0xFF_FFFF
}

fn decode_record_word(word: u64) -> Option<(u64, u64)> {
    let (tag, seq) = (word >> 56, (word >> 24) & 0xFFFF_FFFF);
    (record_word(tag, seq) == word).then_some((tag, seq))
}

fn lane_bytes(p: usize, seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8) ^ (p as u8 * 0x55) ^ 0x80).collect()
}

#[test]
fn three_processes_share_two_nodes() {
    if let Some((role, dir)) = procs::role() {
        child(role.parse().expect("bad child role"), &dir);
        return;
    }

    let dir = PathBuf::from(format!("/dev/shm/swarm-mp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir); // a stale one from a crashed run with the same pid
    let cluster = ShmCluster::create(&dir, usize::from(NODES), NODE_SIZE).expect("create cluster");
    let _cleanup = RemoveOnDrop(dir.clone());
    let mem = cluster.memory();
    for n in 0..NODES {
        block_on(mem.cas(addr(n, COUNTER), 0, counter(0))).unwrap();
    }

    Children::spawn(TEST_NAME, &dir, (0..PROCESSES).map(|p| p.to_string()), CHILD_DEADLINE).wait_success();
    for n in 0..NODES {
        let word = block_on(read_word(&mem, addr(n, COUNTER))).unwrap();
        assert_eq!(decode_counter(word), Some(PROCESSES * INCREMENTS), "node {n}: increments were lost");
    }
}

/// Removes the cluster directory, also when the test fails.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if ShmCluster::remove(&self.0).is_err() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn child(p: usize, dir: &std::path::Path) {
    let cluster = ShmCluster::open(dir).expect("child: open cluster");
    let mem = cluster.memory();
    let mut rng = Rng::new(p as u64 + 1);
    let tag = p as u64 + 1;

    // Start together, so that the processes really overlap.
    let mut seen = 0;
    loop {
        let prev = block_on(mem.cas(addr(0, READY), seen, seen + 1)).unwrap();
        if prev == seen {
            break;
        }
        seen = prev;
    }
    let start = Instant::now();
    while block_on(read_word(&mem, addr(0, READY))).unwrap() < PROCESSES {
        assert!(start.elapsed() < CHILD_DEADLINE, "child {p}: the others never came");
        std::hint::spin_loop();
    }

    let mut guess = [counter(0); NODES as usize];
    let mut last_count = [0u64; NODES as usize];
    let mut retries = 0u64;
    let mut seq = 0u64;
    let mut published = [[0u64; SLOTS_PER_PROCESS as usize]; NODES as usize];
    let mut lanes_written = vec![None; (NODES as u64 * LANE_GROUPS) as usize];
    for i in 0..INCREMENTS {
        for n in 0..NODES {
            retries += increment(&mem, p, n, &mut guess[n as usize], &mut last_count[n as usize]);
        }
        match i % 16 {
            0 => {
                let n = (i / 16 % 2) as u16;
                let s = rng.below(SLOTS_PER_PROCESS);
                seq += 1;
                publish(&mem, n, p as u64 * SLOTS_PER_PROCESS + s, tag, seq, &mut published[n as usize][s as usize]);
            }
            5 => check_slot(&mem, (rng.below(2)) as u16, rng.below(PROCESSES * SLOTS_PER_PROCESS)),
            10 => {
                let (n, g) = (rng.below(u64::from(NODES)) as u16, rng.below(LANE_GROUPS));
                let (off, len) = LANES[p];
                let at = addr(n, LANE_AREA + g * 24 + off);
                let bytes = lane_bytes(p, i, len);
                block_on(mem.write(at, &bytes)).unwrap();
                let back = block_on(mem.read(at, len)).unwrap();
                assert_eq!(&*back, &bytes[..], "child {p}: a neighbour clobbered my bytes");
                lanes_written[(u64::from(n) * LANE_GROUPS + g) as usize] = Some(bytes);
            }
            _ => {}
        }
    }
    // Nobody else writes my lanes: they still hold what I wrote last.
    for (k, want) in lanes_written.iter().enumerate() {
        if let Some(want) = want {
            let (n, g) = ((k as u64 / LANE_GROUPS) as u16, k as u64 % LANE_GROUPS);
            let back = block_on(mem.read(addr(n, LANE_AREA + g * 24 + LANES[p].0), LANES[p].1)).unwrap();
            assert_eq!(&*back, &want[..], "child {p}: lane {k} was overwritten");
        }
    }
    eprintln!("child {p}: {} increments, {retries} CAS retries, {seq} records", INCREMENTS * u64::from(NODES));
}

/// One increment of node `n`'s counter by CAS, starting from `guess`; checks
/// every value seen. Returns the number of failed CASes.
fn increment(mem: &ShmMemory, p: usize, n: u16, guess: &mut u64, last_count: &mut u64) -> u64 {
    let mut retries = 0;
    loop {
        let count = decode_counter(*guess).unwrap_or_else(|| panic!("child {p}: torn counter {guess:#x}"));
        assert!(count >= *last_count, "child {p}: counter went back from {last_count} to {count}");
        *last_count = count;
        let new = counter(count + 1);
        let prev = block_on(mem.cas(addr(n, COUNTER), *guess, new)).unwrap();
        if prev == *guess {
            *guess = new;
            return retries;
        }
        retries += 1;
        *guess = prev;
    }
}

/// Writes record `seq` to `slot` and publishes it, in one ordered pipeline.
fn publish(mem: &ShmMemory, n: u16, slot: u64, tag: u64, seq: u64, published: &mut u64) {
    let base = SLOTS + slot * 128;
    let mut record = [0u8; 64];
    for w in record.chunks_exact_mut(8) {
        w.copy_from_slice(&record_word(tag, seq).to_le_bytes());
    }
    let ops =
        [Op::Write { offset: base + 64, data: &record }, Op::Cas { offset: base, expected: *published, new: seq }];
    let outs = block_on(mem.pipeline(NodeId(n), &ops)).unwrap();
    assert_eq!(outs[1].cas(), Some(*published), "only the owner publishes to its slot");
    *published = seq;
}

/// Reads `slot`'s published number, then its record: each word must be the
/// owner's, well formed, and no older than what was published.
fn check_slot(mem: &ShmMemory, n: u16, slot: u64) {
    let base = SLOTS + slot * 128;
    let owner = slot / SLOTS_PER_PROCESS + 1;
    let published = block_on(read_word(mem, addr(n, base))).unwrap();
    let record = block_on(mem.read(addr(n, base + 64), 64)).unwrap();
    for k in 0..8 {
        let word = word_at(&record, k * 8).unwrap();
        if published == 0 && word == 0 {
            continue;
        }
        let (tag, seq) =
            decode_record_word(word).unwrap_or_else(|| panic!("slot {slot} word {k}: {word:#x} was never written"));
        assert_eq!(tag, owner, "slot {slot} holds another process's record");
        assert!(seq >= published, "slot {slot} word {k}: record {seq} is older than the published {published}");
    }
}
