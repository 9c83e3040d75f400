//! A server's shell in the simulator: a server task stops when its flag
//! is set and, with nothing to do, waits a little virtual time before it
//! polls again (`crate::substrate::msg::server::Shell`).

use alloc::rc::Rc;
use core::cell::Cell;

use super::SimMemory;
use crate::substrate::msg::server::Shell;

/// The shell of a server task.
#[derive(Clone)]
pub struct ServerShell {
    mem: SimMemory,
    stop: Rc<Cell<bool>>,
    gap_ns: u64,
}

impl ServerShell {
    /// A shell for a server on `mem`'s client that polls every `gap_ns`
    /// of virtual time when idle, until [`ServerShell::stop`].
    pub fn new(mem: &SimMemory, gap_ns: u64) -> Self {
        ServerShell { mem: mem.clone(), stop: Rc::default(), gap_ns }
    }

    /// Tells the server to stop (it ends its incarnation cleanly).
    pub fn stop(&self) {
        self.stop.set(true);
    }

    /// The simulated client its server runs on (crash it to crash the
    /// server).
    pub fn memory(&self) -> &SimMemory {
        &self.mem
    }

    /// A shell sharing this one's stop flag, for another server task (a
    /// restarted one) on `mem`'s client.
    pub fn for_client(&self, mem: &SimMemory) -> Self {
        ServerShell { mem: mem.clone(), stop: self.stop.clone(), gap_ns: self.gap_ns }
    }
}

impl Shell for ServerShell {
    fn stopped(&self) -> bool {
        self.stop.get()
    }

    async fn idle(&self, _idle: u32) {
        self.mem.sleep(self.gap_ns).await
    }
}
