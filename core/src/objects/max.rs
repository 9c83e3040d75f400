//! The MAX operation on one memory word, emulated with CAS (SWARM §4.4,
//! Algorithm "max").
//!
//! Memory nodes offer no native MAX, so a writer CASes its value in as long
//! as the word holds something smaller. Seeding the first CAS with the last
//! value this client saw makes MAX one roundtrip in the common case; each
//! failed CAS returns a strictly larger value, so the loop is bounded by the
//! number of concurrent writers.

use crate::{MemError, Memory, RemoteAddr};

/// What a MAX found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MaxOutcome {
    /// Our value was installed over the smaller `prev`.
    Installed {
        /// What the word held just before.
        prev: u64,
    },
    /// The word already held `found`, at least as large as ours.
    Superseded {
        /// The larger (or equal) value found.
        found: u64,
    },
}

impl MaxOutcome {
    /// The largest value the word is known to have held: ours if
    /// installed, else the one found.
    pub fn max_seen(self, new: u64) -> u64 {
        match self {
            MaxOutcome::Installed { .. } => new,
            MaxOutcome::Superseded { found } => found,
        }
    }

    /// Classifies the result of `CAS(word, expected, new)`.
    pub fn of_cas(expected: u64, new: u64, prev: u64) -> Result<MaxOutcome, u64> {
        if prev == expected && prev < new {
            Ok(MaxOutcome::Installed { prev })
        } else if prev >= new {
            Ok(MaxOutcome::Superseded { found: prev })
        } else {
            Err(prev)
        }
    }
}

/// MAX(`word`, `new`), with `seed` the value this client believes the word
/// holds.
pub async fn cas_max<M: Memory>(mem: &M, word: RemoteAddr, seed: u64, new: u64) -> Result<MaxOutcome, MemError> {
    let mut cur = seed;
    loop {
        if cur >= new {
            return Ok(MaxOutcome::Superseded { found: cur });
        }
        let prev = mem.cas(word, cur, new).await?;
        match MaxOutcome::of_cas(cur, new, prev) {
            Ok(out) => return Ok(out),
            Err(smaller) => cur = smaller,
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::rc::Rc;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    use super::*;
    use crate::NodeId;
    use crate::sim::{Sim, SimConfig};
    use crate::substrate::memory::read_word;

    #[test]
    fn concurrent_maxes_leave_the_largest_and_report_truthfully() {
        for seed in 0..300 {
            let mut sim = Sim::new(SimConfig { seed, ..SimConfig::default() });
            let word = RemoteAddr::new(NodeId(0), 0);
            let outcomes = Rc::new(RefCell::new(Vec::new()));
            for w in 0..4u64 {
                let c = sim.client();
                let (m, out) = (c.clone(), outcomes.clone());
                sim.spawn(&c, async move {
                    for i in 0..5u64 {
                        let new = 1 + i * 10 + w;
                        let seed = if i % 2 == 0 { 0 } else { read_word(&m, word).await.unwrap() };
                        let o = cas_max(&m, word, seed, new).await.unwrap();
                        let after = read_word(&m, word).await.unwrap();
                        assert!(after >= new, "a completed MAX is visible to a later read");
                        out.borrow_mut().push((new, o));
                    }
                });
            }
            sim.run().unwrap();
            let fin = u64::from_le_bytes(sim.peek(0, 0, 8).unwrap().try_into().unwrap());
            assert_eq!(fin, 1 + 4 * 10 + 3);
            for &(new, o) in outcomes.borrow().iter() {
                match o {
                    MaxOutcome::Installed { prev } => assert!(prev < new),
                    MaxOutcome::Superseded { found } => assert!(found >= new),
                }
            }
        }
    }
}
