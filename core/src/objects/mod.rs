//! Small shared objects on single CAS words, used by SWARM and available to
//! any protocol: the max word emulated with CAS ([`max`], SWARM §4.4) and
//! timestamp locks ([`tslock`], SWARM §3.3, App. B).

pub mod max;
pub mod tslock;
