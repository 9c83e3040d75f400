//! Names of remote memory: which node, and where in the region it exposes.

use core::fmt;

/// A memory node, numbered from 0 in the order the backend was configured.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct NodeId(pub u16);

impl NodeId {
    /// The node's index, for arrays indexed by node.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// A byte address in the region a memory node exposes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct RemoteAddr {
    /// The node that holds the byte.
    pub node: NodeId,
    /// Offset from the start of that node's region.
    pub offset: u64,
}

impl RemoteAddr {
    /// The address `offset` bytes into `node`'s region.
    pub const fn new(node: NodeId, offset: u64) -> Self {
        Self { node, offset }
    }

    /// The address `delta` bytes further on the same node, or `None` if the
    /// offset would overflow (offsets are often computed from remote data).
    pub const fn checked_add(self, delta: u64) -> Option<Self> {
        match self.offset.checked_add(delta) {
            Some(offset) => Some(Self { node: self.node, offset }),
            None => None,
        }
    }

    /// Whether the address is aligned for a CAS word.
    pub const fn is_word_aligned(self) -> bool {
        self.offset.is_multiple_of(8)
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{:#x}", self.node, self.offset)
    }
}

/// Checks that `[offset, offset + len)` lies inside a region of `size` bytes.
///
/// Every backend calls this before touching memory, so that an offset or
/// length decoded from remote data can never reach past the mapping.
pub fn check_range(node: NodeId, offset: u64, len: usize, size: u64) -> Result<(), crate::MemError> {
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= size => Ok(()),
        _ => Err(crate::MemError::new(node, crate::MemErrorKind::OutOfBounds { offset, len: len as u64 })),
    }
}

/// Checks that a CAS word at `offset` is aligned and inside the region.
pub fn check_word(node: NodeId, offset: u64, size: u64) -> Result<(), crate::MemError> {
    if !offset.is_multiple_of(8) {
        return Err(crate::MemError::new(node, crate::MemErrorKind::Misaligned { offset }));
    }
    check_range(node, offset, 8, size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemErrorKind;

    #[test]
    fn ranges_at_the_edges() {
        let n = NodeId(1);
        assert!(check_range(n, 0, 16, 16).is_ok());
        assert!(check_range(n, 16, 0, 16).is_ok());
        assert!(matches!(check_range(n, 1, 16, 16).unwrap_err().kind, MemErrorKind::OutOfBounds { .. }));
        assert!(check_range(n, u64::MAX, 1, u64::MAX).is_err());
        assert!(matches!(check_word(n, 4, 64).unwrap_err().kind, MemErrorKind::Misaligned { offset: 4 }));
        assert!(check_word(n, 56, 64).is_ok());
        assert!(check_word(n, 64, 64).is_err());
    }

    #[test]
    fn checked_add_overflows_to_none() {
        let a = RemoteAddr::new(NodeId(0), u64::MAX - 1);
        assert!(a.checked_add(1).is_some());
        assert!(a.checked_add(2).is_none());
    }
}
