//! Benchmarks of the toolkit: criterion micro-benchmarks of the memory
//! backends (`benches/raw_ops.rs`: `cargo bench -p swarm-benches --bench
//! raw_ops`), and later the YCSB harness that compares the systems.
#![warn(missing_docs)]
