//! DAX devices, CXL memory pools and emulated persistent memory as memory
//! nodes.
//!
//! This crate is empty: the backend is the subject of issue #6 and exports
//! nothing yet. Use `swarm-backend-shm` meanwhile; a file on tmpfs mapped by
//! it behaves like emulated pmem without the flushes.
