//! A memory node's space: the region header every node starts with and
//! chunk allocation by CAS ([`region`]), clients' sub-allocation of their
//! chunks ([`slab`]), the blocks clients give back for any client to take
//! ([`pool`]), and the one registry of the header's root slots
//! ([`roots`]), where protocols find their well-known objects.

pub mod pool;
pub mod region;
pub mod roots;
pub mod slab;

pub use region::{Region, RegionError};
pub use slab::{AllocError, SlabAllocator};
