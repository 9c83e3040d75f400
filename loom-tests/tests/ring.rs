//! The message ring of `swarm_core::substrate::msg::ring` under loom's
//! memory model: one sender and one receiver on a 128-byte ring, three
//! messages of which the third wraps around (a wrap marker, then the
//! message at the start, once the receiver has published its head): the
//! receiver gets every message once, whole and in order, whatever it sees
//! of writes in progress. The ring's own code runs here, not a copy: the
//! broken variant is the core built with `SWARM_MUTANT=ring-unchecked`
//! (a receiver that trusts the tag without the checksum), which this check
//! fails (scripts/mutants.sh).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p swarm-loom-tests --release`.

#[cfg(loom)]
mod checks {
    use swarm_backend_shm::ShmCluster;
    use swarm_core::substrate::exec::block_on;
    use swarm_core::substrate::msg::ring::{Consumer, Link, Producer, RingAt, RingError};
    use swarm_core::{NodeId, RemoteAddr};
    use swarm_loom_tests::explore_bounded;

    const LINK: Link = Link { epoch: 1, generation: 1 };
    const MESSAGES: u64 = 3;

    fn ring() -> RingAt {
        RingAt { addr: RemoteAddr::new(NodeId(0), 64), size: 128, head: RemoteAddr::new(NodeId(0), 0) }
    }

    /// Message `i`: 24 bytes, each saying which message it is.
    fn message(i: u64) -> [u8; 24] {
        [(i + 1) as u8; 24]
    }

    #[test]
    fn a_receiver_gets_every_message_once_whole_and_in_order() {
        let runs = explore_bounded(Some(2), || {
            let cluster = ShmCluster::in_process(1, 192).unwrap();
            let tx = cluster.memory();
            let sender = loom::thread::spawn(move || {
                let mut p = Producer::new(ring(), LINK);
                for i in 0..MESSAGES {
                    loop {
                        match block_on(p.send(&tx, &[&message(i)])) {
                            Ok(()) => break,
                            Err(RingError::Full) => loom::thread::yield_now(),
                            Err(e) => panic!("send {i}: {e}"),
                        }
                    }
                }
                assert!(p.wraps() >= 1, "the third message wrapped around");
            });
            let rx = cluster.memory();
            let mut c = Consumer::new(ring(), LINK);
            let mut got = 0;
            while got < MESSAGES {
                match block_on(c.poll(&rx, 128)).unwrap() {
                    Some(m) => {
                        assert_eq!(m.seq as u64, got, "messages in order, none skipped");
                        assert_eq!(m.payload(), &message(got)[..], "a torn or foreign message was delivered");
                        got += 1;
                        c.publish(&rx);
                    }
                    None => loom::thread::yield_now(),
                }
            }
            sender.join().unwrap();
            assert!(block_on(c.poll(&rx, 128)).unwrap().is_none(), "nothing more than was sent");
        });
        eprintln!("explored {runs} executions");
        assert!(runs > 1, "loom explored a single execution: the check would be vacuous");
    }
}
