//! YCSB's core workloads (`workloads/workload{a,b,c,d,f}` of YCSB) and the
//! operation types the reports name.

use core::fmt;

use crate::choose::Gen;

/// A YCSB core workload. The load phase (every key inserted once) comes
/// before each of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Update heavy: 50% reads, 50% updates.
    A,
    /// Read mostly: 95% reads, 5% updates.
    B,
    /// Read only.
    C,
    /// Read latest: 95% reads, 5% inserts, reads favouring recent inserts.
    D,
    /// Read-modify-write: 50% reads, 50% read-modify-writes.
    F,
}

impl Workload {
    /// Every workload.
    pub const ALL: [Workload; 5] = [Workload::A, Workload::B, Workload::C, Workload::D, Workload::F];

    /// The letter, lower case.
    pub const fn name(self) -> &'static str {
        match self {
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::F => "f",
        }
    }

    /// The workload of letter `s` (either case).
    pub fn from_name(s: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Shares of each operation, as YCSB's workload files set them.
    pub const fn mix(self) -> Mix {
        match self {
            Workload::A => Mix { get: 0.5, update: 0.5, insert: 0.0, rmw: 0.0 },
            Workload::B => Mix { get: 0.95, update: 0.05, insert: 0.0, rmw: 0.0 },
            Workload::C => Mix { get: 1.0, update: 0.0, insert: 0.0, rmw: 0.0 },
            Workload::D => Mix { get: 0.95, update: 0.0, insert: 0.05, rmw: 0.0 },
            Workload::F => Mix { get: 0.5, update: 0.0, insert: 0.0, rmw: 0.5 },
        }
    }

    /// Whether reads choose keys by recency (workload D's `latest`
    /// request distribution, whatever `--distribution` says).
    pub const fn latest(self) -> bool {
        matches!(self, Workload::D)
    }

    /// Whether operations may write: the upper bound of writes per
    /// operation is one for every workload but C.
    pub const fn writes(self) -> bool {
        !matches!(self, Workload::C)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ycsb-{}", self.name())
    }
}

/// How read and update keys are drawn among the loaded keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// YCSB's scrambled Zipfian, constant 0.99.
    Zipf,
    /// Every key alike.
    Uniform,
}

impl Distribution {
    /// The flag's spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Distribution::Zipf => "zipf",
            Distribution::Uniform => "uniform",
        }
    }

    /// The distribution called `s`.
    pub fn from_name(s: &str) -> Option<Distribution> {
        match s.trim().to_ascii_lowercase().as_str() {
            "zipf" | "zipfian" => Some(Distribution::Zipf),
            "uniform" => Some(Distribution::Uniform),
            _ => None,
        }
    }
}

/// The share of each operation type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    /// Reads.
    pub get: f64,
    /// Updates of existing keys.
    pub update: f64,
    /// Inserts of new keys.
    pub insert: f64,
    /// Read-modify-writes: a get, then an update of the same key.
    pub rmw: f64,
}

impl Mix {
    /// The type of the next operation.
    pub fn pick(&self, g: &mut Gen) -> OpKind {
        let u = g.unit();
        if u < self.get {
            OpKind::Get
        } else if u < self.get + self.update {
            OpKind::Update
        } else if u < self.get + self.update + self.insert {
            OpKind::Insert
        } else if self.rmw > 0.0 {
            OpKind::Rmw
        } else {
            // Rounding at the top of [0, 1): the last type with a share.
            [(self.insert, OpKind::Insert), (self.update, OpKind::Update)]
                .into_iter()
                .find(|(s, _)| *s > 0.0)
                .map_or(OpKind::Get, |(_, k)| k)
        }
    }
}

/// The operation types a report has rows for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// A get.
    Get,
    /// An update of an existing key.
    Update,
    /// An insert of a new key (load phase, workload D).
    Insert,
    /// A get and an update of one key, timed together (workload F).
    Rmw,
}

impl OpKind {
    /// Every type, in report order.
    pub const ALL: [OpKind; 4] = [OpKind::Get, OpKind::Update, OpKind::Insert, OpKind::Rmw];

    /// The name reports use.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Rmw => "rmw",
        }
    }

    /// Index into per-type arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(Workload::from_name(w.name()), Some(w));
            let m = w.mix();
            assert!((m.get + m.update + m.insert + m.rmw - 1.0).abs() < 1e-12, "{w}");
        }
        assert_eq!(Workload::from_name("B"), Some(Workload::B));
        assert_eq!(Workload::from_name("e"), None);
        assert_eq!(Distribution::from_name("zipfian"), Some(Distribution::Zipf));
        assert_eq!(Distribution::from_name("latest"), None);
    }

    #[test]
    fn the_mix_follows_the_shares() {
        for w in Workload::ALL {
            let m = w.mix();
            let mut g = Gen::new(11, 0);
            let mut counts = [0u32; 4];
            let n = 100_000;
            for _ in 0..n {
                counts[m.pick(&mut g).index()] += 1;
            }
            let shares = [m.get, m.update, m.insert, m.rmw];
            for (k, share) in OpKind::ALL.into_iter().zip(shares) {
                let got = counts[k.index()] as f64 / n as f64;
                assert!((got - share).abs() < 0.01, "{w} {}: {got} vs {share}", k.name());
            }
        }
    }
}
