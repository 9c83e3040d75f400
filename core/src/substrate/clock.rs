//! Time for protocols: a [`Clock`] in ticks, loosely synchronised across
//! clients, and [`SystemClock`], the wall clock in microseconds.
//!
//! SWARM's `guessTs` (§3.2) only needs a clock that is strictly increasing
//! per client and fresh most of the time; leases and time-outs need one
//! whose drift between clients is bounded. Protocols take any `Clock`; the
//! simulator gives its clients virtual time.

/// What the toolkit assumes of clients' clocks: any two differ by less
/// than this. Leases ([`crate::substrate::lease`]) wait this long past an
/// expiry before giving an id to another client, and a client refuses to
/// adopt a time that runs more than twice this ahead of its own clock
/// (SWARM's re-synchronisation, bounded: a client with a wild clock cannot
/// drag everyone's time with it). NTP keeps clocks within milliseconds.
pub const MAX_SKEW_NS: u64 = 1_000_000_000;

/// A source of time in ticks, loosely synchronised across clients (SWARM
/// §3.2: `guessTs` only needs to be strictly increasing per thread, and
/// fresh most of the time).
pub trait Clock {
    /// The current time in ticks (protocols say how many bits of ticks
    /// they encode and what happens past them).
    fn now(&self) -> u64;

    /// Nanoseconds per tick (a microsecond unless said otherwise), for
    /// time-outs given in time rather than ticks.
    fn tick_ns(&self) -> u64 {
        1_000
    }

    /// `ns` nanoseconds in ticks (at least one).
    fn ticks(&self, ns: u64) -> u64 {
        (ns / self.tick_ns().max(1)).max(1)
    }
}

impl<F: Fn() -> u64> Clock for F {
    fn now(&self) -> u64 {
        self()
    }
}

/// Wall-clock ticks of one microsecond since `epoch_us` (microseconds since
/// the Unix epoch, typically the time the cluster was formatted). Clients on
/// one machine, or on NTP/PTP-synchronised machines, are loosely
/// synchronised, which is all `guessTs` needs.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    /// Microseconds since the Unix epoch at tick 0.
    pub epoch_us: u64,
}

#[cfg(feature = "std")]
impl SystemClock {
    /// Microseconds since the Unix epoch, now.
    pub fn unix_us() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
    }

    /// A clock whose tick 0 is now.
    pub fn starting_now() -> Self {
        SystemClock { epoch_us: Self::unix_us() }
    }
}

#[cfg(feature = "std")]
impl Clock for SystemClock {
    fn now(&self) -> u64 {
        Self::unix_us().saturating_sub(self.epoch_us) + 1
    }
}
