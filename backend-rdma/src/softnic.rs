//! A NIC in software: the [`Nic`] interface over memory nodes in this
//! process's memory (a [`MappedMemory`] handle on `swarm-mapped`'s nodes,
//! such as a shared-memory cluster's), so that the RDMA client runs, and is
//! tested, without hardware.
//!
//! It behaves like a reliable-connected queue pair in the ways the client
//! depends on, and no better:
//! - a chain is executed in order; completions come back later (after
//!   [`SoftNic::with_delay`] polls), in order per queue pair, and read
//!   results land in the arena only when their completion is delivered;
//! - only signaled requests complete, unless they fail;
//! - a node failed by the cluster's fault injection fails the first request
//!   with `RETRY_EXC_ERR` and puts the queue pair in the error state: every
//!   later chain on it completes with `WR_FLUSH_ERR`, as on hardware, where
//!   a queue pair does not come back by itself;
//! - a stalled node holds its chains until it is healthy (then they run) or
//!   failed (then they fail as above);
//! - an access outside the region completes with `REM_ACCESS_ERR` and
//!   breaks the queue pair.
//!
//! It counts doorbells and work requests and keeps the last chain posted,
//! so tests can check how operations are batched.

use core::cell::RefCell;
use std::collections::VecDeque;

use swarm_core::substrate::exec::block_on;
use swarm_core::{MemError, MemErrorKind, Memory, NodeId, Op, OpOutput};
use swarm_mapped::{Fault, MappedMemory};

use crate::nic::{Nic, PostError, Wc, Wr, WrKind, status};

/// Doorbells and work requests a [`SoftNic`] was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Posted {
    /// Calls of [`Nic::post`] (one doorbell each).
    pub doorbells: u64,
    /// Work requests in them.
    pub wrs: u64,
    /// Of which signaled.
    pub signaled: u64,
}

/// A software NIC over mapped memory nodes.
pub struct SoftNic {
    mem: MappedMemory,
    arena: RefCell<Vec<u8>>,
    depth: usize,
    delay: u64,
    state: RefCell<SoftState>,
}

#[derive(Default)]
struct SoftState {
    polls: u64,
    /// Completions not yet delivered, in order.
    queue: VecDeque<Pending>,
    /// Chains waiting on a stalled node.
    held: Vec<(NodeId, Vec<Wr>)>,
    /// Queue pairs in the error state.
    broken: Vec<bool>,
    posted: Posted,
    last: Vec<Wr>,
    /// The next post takes only this many requests, and refuses the rest.
    refuse_after: Option<usize>,
}

struct Pending {
    due: u64,
    wc: Wc,
    /// Bytes to land in the arena on delivery (a READ's data, a CAS's old value).
    land: Option<(u32, Vec<u8>)>,
}

impl SoftNic {
    /// A NIC with an arena of `arena` bytes and send queues of `depth`
    /// requests, to the nodes `mem` reaches.
    pub fn new(mem: MappedMemory, arena: u32, depth: usize) -> SoftNic {
        let nodes = mem.node_count();
        let state = SoftState { broken: vec![false; nodes], ..SoftState::default() };
        SoftNic { mem, arena: RefCell::new(vec![0; arena as usize]), depth, delay: 1, state: RefCell::new(state) }
    }

    /// Delivers each completion `polls` polls after its chain was posted (1
    /// by default, so every operation waits at least once).
    pub fn with_delay(mut self, polls: u64) -> Self {
        self.delay = polls;
        self
    }

    /// What was posted so far.
    pub fn posted(&self) -> Posted {
        self.state.borrow().posted
    }

    /// The last chain posted.
    pub fn last_chain(&self) -> Vec<Wr> {
        self.state.borrow().last.clone()
    }

    /// Makes the next post take only the chain's first `n` requests and
    /// refuse the rest (`ENOMEM`), as `ibv_post_send` does when it meets a
    /// request it cannot queue.
    pub fn refuse_next_after(&self, n: usize) {
        self.state.borrow_mut().refuse_after = Some(n);
    }

    /// Whether `node`'s queue pair is in the error state.
    pub fn broken(&self, node: NodeId) -> bool {
        self.state.borrow().broken.get(usize::from(node.0)).copied().unwrap_or(true)
    }

    /// Executes (or fails, or holds) `chain` on `node`.
    fn execute(&self, s: &mut SoftState, node: NodeId, chain: Vec<Wr>) {
        let n = usize::from(node.0);
        let due = s.polls + self.delay;
        if s.held.iter().any(|(m, _)| *m == node) {
            // Behind chains a stalled node holds: stay in order.
            return s.held.push((node, chain));
        }
        if !s.broken[n] {
            match self.mem.nodes().fault(node) {
                Some(Fault::Stalled) => return s.held.push((node, chain)),
                Some(Fault::Failed) | None => {
                    s.broken[n] = true;
                    let wc = Wc { id: chain[0].id, status: status::RETRY_EXC_ERR, vendor: 0 };
                    s.queue.push_back(Pending { due, wc, land: None });
                    return flush(s, &chain[1..], due);
                }
                Some(Fault::Healthy) => {}
            }
        }
        for (k, wr) in chain.iter().enumerate() {
            if s.broken[n] {
                return flush(s, &chain[k..], due);
            }
            match self.apply(node, wr) {
                Ok(land) => {
                    if wr.signaled {
                        let wc = Wc { id: wr.id, status: status::SUCCESS, vendor: 0 };
                        s.queue.push_back(Pending { due, wc, land });
                    } else if let Some((at, bytes)) = land {
                        // Unsignaled results land with the next completion.
                        s.queue.push_back(Pending {
                            due,
                            wc: Wc { id: u64::MAX, ..Wc::default() },
                            land: Some((at, bytes)),
                        });
                    }
                }
                Err(e) => {
                    s.broken[n] = true;
                    let code = match e.kind {
                        MemErrorKind::OutOfBounds { .. } | MemErrorKind::Misaligned { .. } => status::REM_ACCESS_ERR,
                        _ => status::RETRY_EXC_ERR,
                    };
                    let wc = Wc { id: wr.id, status: code, vendor: 0 };
                    s.queue.push_back(Pending { due, wc, land: None });
                    return flush(s, &chain[k + 1..], due);
                }
            }
        }
    }

    /// Applies one request to the node; returns the bytes it brings back.
    fn apply(&self, node: NodeId, wr: &Wr) -> Result<Option<(u32, Vec<u8>)>, MemError> {
        let mut data = Vec::new();
        let op = match wr.kind {
            WrKind::Read => Op::Read { offset: wr.remote, len: wr.len as usize },
            WrKind::Write => {
                data.resize(wr.len as usize, 0);
                // SAFETY: the client posted this request, so the range is its
                // own chunk of the arena (`Nic::put`'s contract).
                unsafe { self.get(wr.local, &mut data) };
                Op::Write { offset: wr.remote, data: &data }
            }
            WrKind::Cas { expected, new } => Op::Cas { offset: wr.remote, expected, new },
        };
        // A healthy mapped node applies the request at the first poll and
        // completes at the second.
        let out = block_on(self.mem.pipeline(node, core::slice::from_ref(&op)))?;
        Ok(match out.into_iter().next() {
            Some(OpOutput::Read(buf)) => Some((wr.local, buf.to_vec())),
            Some(OpOutput::Cas(old)) => Some((wr.local, old.to_ne_bytes().to_vec())),
            _ => None,
        })
    }
}

/// Completes the signaled requests of `rest` with `WR_FLUSH_ERR`.
fn flush(s: &mut SoftState, rest: &[Wr], due: u64) {
    for wr in rest.iter().filter(|w| w.signaled) {
        s.queue.push_back(Pending { due, wc: Wc { id: wr.id, status: status::WR_FLUSH_ERR, vendor: 0 }, land: None });
    }
}

impl Nic for SoftNic {
    fn node_count(&self) -> usize {
        self.mem.node_count()
    }

    fn node_size(&self, _node: NodeId) -> u64 {
        self.mem.nodes().node_size()
    }

    fn arena_size(&self) -> u32 {
        self.arena.borrow().len() as u32
    }

    fn queue_depth(&self) -> usize {
        self.depth
    }

    fn post(&self, node: NodeId, chain: &[Wr]) -> Result<(), PostError> {
        const EINVAL: i32 = 22;
        const ENOMEM: i32 = 12;
        let mut s = self.state.borrow_mut();
        if chain.is_empty() || usize::from(node.0) >= s.broken.len() {
            return Err(PostError { errno: EINVAL, posted: 0 });
        }
        let (chain, refused) = match s.refuse_after.take() {
            Some(n) if n < chain.len() => (&chain[..n], true),
            _ => (chain, false),
        };
        if !chain.is_empty() {
            s.posted.doorbells += 1;
            s.posted.wrs += chain.len() as u64;
            s.posted.signaled += chain.iter().filter(|w| w.signaled).count() as u64;
            s.last = chain.to_vec();
            self.execute(&mut s, node, chain.to_vec());
        }
        if refused { Err(PostError { errno: ENOMEM, posted: chain.len() }) } else { Ok(()) }
    }

    fn fail(&self, node: NodeId) {
        if let Some(b) = self.state.borrow_mut().broken.get_mut(usize::from(node.0)) {
            *b = true;
        }
    }

    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut s = self.state.borrow_mut();
        s.polls += 1;
        // Chains held by a stalled node run once it is healthy or failed.
        let held = core::mem::take(&mut s.held);
        for (node, chain) in held {
            self.execute(&mut s, node, chain);
        }
        let mut n = 0;
        while n < out.len() && s.queue.front().is_some_and(|p| p.due <= s.polls) {
            let p = s.queue.pop_front().expect("checked");
            if let Some((at, bytes)) = p.land {
                self.arena.borrow_mut()[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
            }
            if p.wc.id != u64::MAX {
                out[n] = p.wc;
                n += 1;
            }
        }
        n
    }

    unsafe fn put(&self, at: u32, data: &[u8]) {
        self.arena.borrow_mut()[at as usize..at as usize + data.len()].copy_from_slice(data);
    }

    unsafe fn get(&self, at: u32, out: &mut [u8]) {
        out.copy_from_slice(&self.arena.borrow()[at as usize..at as usize + out.len()]);
    }
}
