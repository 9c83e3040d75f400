//! The register protocols of the SWARM paper's baselines (§7): ABD over
//! disaggregated memory ([`abd`]), and RAW's single unreplicated copy
//! ([`raw`]), the latency floor.

pub mod abd;
pub mod raw;
