//! What a read of a value returns: a window into the backend's read buffer,
//! so that a value is never copied between the node's answer and the caller.

use core::ops::Deref;

/// A value read from memory: a window into a backend buffer (no copy).
pub struct Value<B> {
    buf: Option<B>,
    start: usize,
    len: usize,
}

impl<B: Deref<Target = [u8]>> Value<B> {
    /// The bytes `range` of `buf` (checked: an empty value if out of range).
    pub fn in_buf(buf: B, range: core::ops::Range<usize>) -> Self {
        match buf.get(range.clone()) {
            Some(_) => Value { buf: Some(buf), start: range.start, len: range.len() },
            None => Self::empty(),
        }
    }

    /// The initial value of every register (no write yet).
    pub fn empty() -> Self {
        Value { buf: None, start: 0, len: 0 }
    }
}

impl<B: Deref<Target = [u8]>> Deref for Value<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[self.start..self.start + self.len],
            None => &[],
        }
    }
}

impl<B: Deref<Target = [u8]>> core::fmt::Debug for Value<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Value({} bytes)", self.len)
    }
}
