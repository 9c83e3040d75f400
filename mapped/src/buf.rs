//! Read buffers, recycled so that the fast path allocates nothing.
//!
//! A [`MappedBuf`] owns a `Vec<u8>`; when dropped it gives the vector back to a
//! small pool of the thread that drops it, and the next read on that thread
//! takes it from there. A thread-local pool (rather than one per handle)
//! keeps both handles and buffers `Send` without any locking, and since
//! handles are per thread it amounts to the same.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;

/// Vectors a thread keeps for reuse.
const POOL: usize = 16;
/// Vectors with more capacity than this are freed rather than kept.
const MAX_POOLED: usize = 64 * 1024;

thread_local! {
    static FREE: RefCell<heapless::Vec<Vec<u8>, POOL>> = const { RefCell::new(heapless::Vec::new()) };
}

/// Bytes read from a memory node: the [`swarm_core::Memory::Buf`] of
/// [`crate::MappedMemory`], and of `swarm-backend-rdma`'s client (which
/// fills it with [`filled`](MappedBuf::filled)).
pub struct MappedBuf {
    data: Vec<u8>,
}

impl MappedBuf {
    /// An empty buffer with room for `len` bytes, recycled when possible.
    pub(crate) fn with_capacity(len: usize) -> MappedBuf {
        let recycled = FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten();
        let mut data = recycled.unwrap_or_default();
        data.clear();
        data.reserve(len);
        MappedBuf { data }
    }

    /// The vector, for the read to fill.
    pub(crate) fn vec_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    /// A recycled buffer of `len` bytes that `fill` writes: for backends
    /// (RDMA) whose hardware reads into memory of their own, copied out on
    /// completion.
    pub fn filled(len: usize, fill: impl FnOnce(&mut [u8])) -> MappedBuf {
        let mut b = MappedBuf::with_capacity(len);
        b.data.resize(len, 0);
        fill(&mut b.data);
        b
    }
}

impl Deref for MappedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl AsRef<[u8]> for MappedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl fmt::Debug for MappedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MappedBuf").field(&self.data).finish()
    }
}

impl PartialEq for MappedBuf {
    fn eq(&self, other: &MappedBuf) -> bool {
        self.data == other.data
    }
}

impl Eq for MappedBuf {}

impl Drop for MappedBuf {
    fn drop(&mut self) {
        if self.data.capacity() == 0 || self.data.capacity() > MAX_POOLED {
            return;
        }
        let data = std::mem::take(&mut self.data);
        // During thread teardown the pool may be gone; the vector is then
        // simply freed, as it is when the pool is full.
        let _ = FREE.try_with(|f| f.borrow_mut().push(data));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_recycled_on_the_same_thread() {
        let mut a = MappedBuf::with_capacity(64);
        a.vec_mut().extend_from_slice(&[1; 64]);
        let ptr = a.as_ptr();
        drop(a);
        let b = MappedBuf::with_capacity(32);
        assert_eq!(b.as_ptr(), ptr, "the dropped buffer's vector is reused");
        assert!(b.is_empty(), "a recycled buffer starts empty");
    }

    #[test]
    fn huge_buffers_are_not_kept() {
        drop(MappedBuf::with_capacity(MAX_POOLED + 1));
        let kept = FREE.with(|f| f.borrow().iter().any(|v| v.capacity() > MAX_POOLED));
        assert!(!kept);
    }
}
