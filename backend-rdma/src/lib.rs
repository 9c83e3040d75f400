//! RDMA verbs as memory nodes: a memory-node daemon and a client.
//!
//! This crate is empty: the backend is the subject of issue #7 and exports
//! nothing yet.
