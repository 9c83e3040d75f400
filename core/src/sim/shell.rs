//! A server's shell in the simulator: a server task stops when its flag
//! is set and, with nothing to do, waits a little virtual time before it
//! polls again (`crate::substrate::msg::server::Shell`), longer the longer
//! it has been idle, as a real server's shell sleeps once it has spun for
//! a while: a server left idle for seconds of virtual time (its clients
//! stopped, waiting out a lease) then costs thousands of polls, not
//! millions.

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

    async fn idle(&self, idle: u32) {
        self.mem.sleep(idle_gap(self.gap_ns, idle)).await
    }
}

/// Passes with nothing served after which an idle server starts to poll
/// less often: at the shell's gap of 200 ns, about a millisecond.
const PATIENT_PASSES: u32 = 4096;
/// The longest an idle server waits between two polls, in gaps (about
/// 0.8 ms at 200 ns: what an answer waits at worst after a long silence).
const MAX_GAPS: u64 = 4096;

/// How long a server waits after `idle` passes with nothing served: the
/// gap, doubled every [`PATIENT_PASSES`] / 16 passes past the first
/// [`PATIENT_PASSES`], up to [`MAX_GAPS`] gaps.
fn idle_gap(gap_ns: u64, idle: u32) -> u64 {
    let doublings = idle.saturating_sub(PATIENT_PASSES).div_ceil(PATIENT_PASSES / 16).min(63);
    gap_ns.saturating_mul((1u64 << doublings).min(MAX_GAPS))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Busy or briefly idle, a server polls every gap; after a long
    /// silence, at most every [`MAX_GAPS`] gaps.
    #[test]
    fn an_idle_server_polls_less_often_up_to_a_bound() {
        assert_eq!(idle_gap(200, 0), 200);
        assert_eq!(idle_gap(200, PATIENT_PASSES), 200);
        assert_eq!(idle_gap(200, PATIENT_PASSES + 1), 400);
        assert_eq!(idle_gap(200, PATIENT_PASSES + PATIENT_PASSES / 16), 400);
        assert_eq!(idle_gap(200, PATIENT_PASSES + PATIENT_PASSES / 8), 800);
        assert_eq!(idle_gap(200, u32::MAX), 200 * MAX_GAPS);
        // Idle for 3 s of virtual time: about 11,000 polls, not 15 million.
        let (mut t, mut polls) = (0u64, 0u32);
        while t < 3_000_000_000 {
            t += idle_gap(200, polls);
            polls += 1;
        }
        assert!(polls < 12_000, "{polls} polls");
    }
}
