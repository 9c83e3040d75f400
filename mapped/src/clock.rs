//! The process's monotonic clock, the time of [`swarm_core::Memory::now_ns`]
//! for every handle of the process: precise ([`monotonic_ns`]) and coarse
//! ([`coarse_ns`], for the times that are only ever compared, on the
//! cautious side, with a later precise reading).
//!
//! Both count from the first reading of the process, on Linux's
//! `CLOCK_MONOTONIC` and `CLOCK_MONOTONIC_COARSE`, which share one origin:
//! the coarse clock is the precise one as of the last timer tick (a few
//! milliseconds at most), and costs a fifth as much to read (about 5 ns
//! against 25 here). Elsewhere, and under loom, the coarse clock is the
//! precise one.

/// Nanoseconds since this process first read its clock.
pub fn monotonic_ns() -> u64 {
    imp::precise().saturating_sub(imp::origin())
}

/// [`monotonic_ns`] as of up to a clock tick ago: never more than what
/// [`monotonic_ns`] reads at the same moment or after.
pub fn coarse_ns() -> u64 {
    imp::coarse().saturating_sub(imp::origin())
}

#[cfg(all(target_os = "linux", not(loom)))]
#[allow(unsafe_code)] // one FFI call, which std does not wrap
mod imp {
    use std::sync::OnceLock;

    /// `clock_gettime(id)`, in ns, if the kernel has that clock. Through
    /// libc (glibc's vDSO call), not rustix, whose own vDSO reader crashes
    /// under valgrind (bytecodealliance/rustix#1559).
    fn read(id: libc::clockid_t) -> Option<u64> {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid, writable timespec that outlives the call,
        // which writes nothing else.
        let rc = unsafe { libc::clock_gettime(id, &mut t) };
        (rc == 0).then(|| (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64))
    }

    pub fn origin() -> u64 {
        static ORIGIN: OnceLock<u64> = OnceLock::new();
        *ORIGIN.get_or_init(precise)
    }

    /// Every Linux has it (std's `Instant` relies on it the same way).
    pub fn precise() -> u64 {
        read(libc::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is readable")
    }

    /// A kernel without it (or that refuses it) gets the precise clock.
    pub fn coarse() -> u64 {
        read(libc::CLOCK_MONOTONIC_COARSE).unwrap_or_else(precise)
    }
}

#[cfg(not(all(target_os = "linux", not(loom))))]
mod imp {
    use std::sync::OnceLock;
    use std::time::Instant;

    fn start() -> Instant {
        static START: OnceLock<Instant> = OnceLock::new();
        *START.get_or_init(Instant::now)
    }

    pub fn origin() -> u64 {
        0
    }

    pub fn precise() -> u64 {
        start().elapsed().as_nanos() as u64
    }

    pub fn coarse() -> u64 {
        precise()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_never_reads_ahead_of_the_precise_one() {
        let mut last = 0;
        for _ in 0..100_000 {
            let c = coarse_ns();
            let p = monotonic_ns();
            assert!(c <= p, "coarse {c} ns after precise {p} ns");
            assert!(p >= last, "the precise clock went back: {p} < {last}");
            last = p;
        }
    }

    #[test]
    fn the_coarse_clock_lags_the_precise_one_by_at_most_a_tick() {
        let p = monotonic_ns();
        let c = coarse_ns();
        // A tick is 1 to 10 ms (HZ of 1000 to 100); a descheduled thread
        // may add to that, so the bound is loose.
        assert!(p.saturating_sub(c) < 200_000_000, "coarse {c} ns, {p} ns precise");
    }
}
