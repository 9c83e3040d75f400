//! The YCSB harness of the toolkit: every key-value store side by side on
//! one backend, one workload and one seed (`swarm bench`).
//!
//! - [`workload`]: YCSB's core workloads A, B, C, D, F and the load phase;
//! - [`choose`]: YCSB's key choosers (scrambled Zipfian 0.99, latest, uniform),
//!   key names and seeded generators;
//! - [`runner`]: what a client does, with several operations in flight;
//!   [`threads`] and [`sim`] drive clients as OS threads on real memory or
//!   as tasks of the deterministic simulator;
//! - [`stats`], [`report`], [`plot`], [`progress`]: latency and roundtrip
//!   histograms, the table and JSON, SVG/PNG plots, the progress bar;
//! - [`fault`], [`timeline`]: memory nodes failed or stalled during a timed
//!   measured phase, and what the clients did over time (the availability
//!   experiment, SWARM §7.7).
//!
//! The harness is generic over the store ([`swarm_core::kv::KvClient`],
//! with roundtrips from [`runner::Counting`]) and over the memory
//! ([`swarm_core::Memory`]); the command line picks the backend.
#![forbid(unsafe_code)]

pub mod choose;
pub mod fault;
pub mod plot;
pub mod progress;
pub mod report;
pub mod runner;
pub mod sim;
pub mod stats;
pub mod threads;
pub mod timeline;
pub mod workload;

pub use runner::{ClientResult, RunSpec, SystemRun};
pub use workload::{Distribution, OpKind, Workload};
