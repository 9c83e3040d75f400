//! A client's handle on the simulated memory.

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::future::{Future, poll_fn};
use core::task::{Context, Poll};

use super::world::{Event, OpResult, Slot, World};
use crate::{MemError, MemErrorKind, Memory, NodeId, Op, OpOutput, Outputs, RemoteAddr};

/// One simulated client: implements [`Memory`] over the simulated nodes and
/// gives access to virtual time. Cheap to clone; clones are the same client
/// (a client crash drops every task spawned for it).
#[derive(Clone)]
pub struct SimMemory {
    pub(crate) world: Rc<RefCell<World>>,
    pub(crate) client: u32,
}

impl SimMemory {
    /// This client's id.
    pub fn id(&self) -> u32 {
        self.client
    }

    /// Virtual time, in nanoseconds since the start of the run.
    pub fn now(&self) -> u64 {
        self.world.borrow().now
    }

    /// Waits `ns` nanoseconds of virtual time.
    pub async fn sleep(&self, ns: u64) {
        let slot = Slot::new();
        {
            let mut w = self.world.borrow_mut();
            let at = w.now + ns;
            w.schedule(at, Event::Timer { slot: slot.clone() });
        }
        wait(&slot).await
    }

    /// Crashes this client `ns` from now (as [`super::Sim::crash_client_at`]):
    /// a workload that crashes a client in the middle of a chosen
    /// operation.
    pub fn crash_in(&self, ns: u64) {
        let mut w = self.world.borrow_mut();
        let at = w.now.saturating_add(ns);
        w.schedule(at, Event::CrashClient { client: self.client });
    }

    /// A random number from the run's seeded generator, for workloads that
    /// must replay exactly from the seed.
    pub fn random(&self, lo: u64, hi: u64) -> u64 {
        self.world.borrow_mut().rng.range(lo, hi)
    }

    async fn exec(&self, node: NodeId, ops: &[Op<'_>], local: bool) -> OpResult {
        let slot = Slot::new();
        self.world.borrow_mut().post(self.client, node, ops, Some(slot.clone()), local)?;
        wait(&slot).await
    }
}

async fn wait<T>(slot: &Rc<RefCell<Slot<T>>>) -> T {
    poll_fn(|cx| {
        let mut s = slot.borrow_mut();
        match s.result.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await
}

fn only(node: NodeId, out: Outputs<Vec<u8>>) -> Result<OpOutput<Vec<u8>>, MemError> {
    out.into_iter().next().ok_or(MemError::new(node, MemErrorKind::Backend { code: 0 }))
}

impl Memory for SimMemory {
    type Buf = Vec<u8>;

    fn node_count(&self) -> usize {
        self.world.borrow().cfg.nodes
    }

    async fn read(&self, addr: RemoteAddr, len: usize) -> Result<Vec<u8>, MemError> {
        let out = only(addr.node, self.exec(addr.node, &[Op::Read { offset: addr.offset, len }], false).await?)?;
        Ok(out.into_read().unwrap_or_default())
    }

    async fn write(&self, addr: RemoteAddr, data: &[u8]) -> Result<(), MemError> {
        self.exec(addr.node, &[Op::Write { offset: addr.offset, data }], false).await.map(|_| ())
    }

    async fn cas(&self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, MemError> {
        let out =
            only(addr.node, self.exec(addr.node, &[Op::Cas { offset: addr.offset, expected, new }], false).await?)?;
        Ok(out.cas().unwrap_or(expected ^ 1))
    }

    fn pipeline(&self, node: NodeId, ops: &[Op<'_>]) -> impl Future<Output = Result<Outputs<Vec<u8>>, MemError>> {
        self.exec(node, ops, false)
    }

    fn post_background(&self, node: NodeId, ops: &[Op<'_>]) {
        let _ = self.world.borrow_mut().post(self.client, node, ops, None, false);
    }

    fn now_ns(&self) -> Option<u64> {
        Some(self.now())
    }

    fn timeout_ns(&self) -> Option<u64> {
        Some(self.world.borrow().cfg.timeout_ns)
    }

    fn poll_alarm(&self, cx: &mut Context<'_>, at_ns: u64) -> Poll<()> {
        let mut w = self.world.borrow_mut();
        if w.now >= at_ns {
            return Poll::Ready(());
        }
        w.alarm(self.client, at_ns, cx.waker());
        Poll::Pending
    }

    /// A local access: [`crate::sim::SimConfig::local_latency_ns`], no tail.
    async fn read_inbox(&self, addr: RemoteAddr, len: usize) -> Result<Vec<u8>, MemError> {
        let out = only(addr.node, self.exec(addr.node, &[Op::Read { offset: addr.offset, len }], true).await?)?;
        Ok(out.into_read().unwrap_or_default())
    }
}
