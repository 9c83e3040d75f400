//! A server as a thread beside its clients, on real shared memory: client
//! threads call a counter service (fetch-and-add on a word of the server's
//! node) and ping it at once; every answer must be right, no addition may
//! run twice or be lost, and the server stops cleanly.
#![cfg(not(loom))]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use swarm_backend_shm::ShmCluster;
use swarm_core::check::rpc::{ADD, Counter};
use swarm_core::substrate::clock::SystemClock;
use swarm_core::substrate::exec::block_on;
use swarm_core::substrate::memory::{read_word, word_at};
use swarm_core::substrate::msg::area::Geometry;
use swarm_core::substrate::msg::rpc::{Channel, method};
use swarm_core::substrate::msg::server::{self, ThreadShell};
use swarm_core::substrate::space::Region;
use swarm_core::{Memory, NodeId};

const NODE: NodeId = NodeId(1);
const CLIENTS: u16 = 4;
const CALLS: u64 = 2_000;
const TIMEOUT_NS: u64 = 5_000_000_000;

#[test]
fn client_threads_and_a_server_thread_on_shared_memory() {
    let cluster = ShmCluster::in_process(2, 8 << 20).unwrap();
    let admin = cluster.memory();
    let word = block_on(async {
        for n in 0..2 {
            Region::format(&admin, NodeId(n), 8 << 20, 64 << 10).await.unwrap();
        }
        Region::open(&admin, NODE).await.unwrap().alloc_chunk(&admin).await.unwrap()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let shell = ThreadShell::new(stop.clone());
    let mem = cluster.memory();
    // Small rings: they wrap and fill while four clients call.
    let geo = Geometry { channels: 8, ring_bytes: 512 };
    let server = thread::spawn(move || block_on(server::serve(mem, NODE, geo, Counter { word }, &shell)));
    let sums: Vec<Vec<u64>> = thread::scope(|s| {
        let handles: Vec<_> = (1..=CLIENTS)
            .map(|id| {
                let mem = cluster.memory();
                s.spawn(move || {
                    let clock = SystemClock::starting_now();
                    let mut ch = loop {
                        match block_on(Channel::connect(&mem, NODE, id)) {
                            Ok(ch) => break ch,
                            Err(_) => thread::sleep(Duration::from_millis(1)),
                        }
                    };
                    let mut got = Vec::new();
                    for i in 0..CALLS {
                        let sum = block_on(ch.call(&mem, &clock, TIMEOUT_NS, ADD, &[])).unwrap().ok().unwrap();
                        got.push(word_at(&sum, 0).unwrap());
                        let body: Vec<u8> = (0..(i % 97) as u8).map(|b| b ^ id as u8).collect();
                        let echo = block_on(ch.call(&mem, &clock, TIMEOUT_NS, method::PING, &body)).unwrap();
                        assert_eq!(&echo.ok().unwrap()[..], &body[..], "client {id} ping {i}");
                    }
                    assert!(ch.stats().wraps > 0, "the rings wrapped");
                    got
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: BTreeSet<u64> = sums.iter().flatten().copied().collect();
    let total = CLIENTS as u64 * CALLS;
    assert_eq!(all.len() as u64, total, "every addition answered a value of its own");
    assert_eq!(all, (0..total).collect(), "no addition lost or run twice");
    assert_eq!(block_on(read_word(&cluster.memory(), word)).unwrap(), total);
    for s in &sums {
        assert!(s.windows(2).all(|w| w[0] < w[1]), "each client's additions in its own order");
    }
    stop.store(true, Ordering::Relaxed);
    let stats = server.join().unwrap().unwrap();
    assert_eq!(stats.served, 2 * total);
    assert_eq!(stats.dropped, 0);
    assert_eq!(cluster.memory().node_count(), 2);
}
