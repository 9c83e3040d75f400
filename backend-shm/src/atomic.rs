//! The atomic layer: the one place where the backend decides what its words
//! are made of.
//!
//! Memory is only ever touched as a slice of [`AtomicU64`] ([`Words::as_slice`]):
//! another process may write any byte of a shared mapping at any time, so a
//! plain load or store would be a data race, and mixing atomic accesses of
//! different sizes on the same bytes is not allowed by Rust's memory model
//! either. Everything above this module works on `&[AtomicU64]`.
//!
//! - Normally the words live in a page-aligned `memmap2` mapping: of a file
//!   (shared between processes) or anonymous (one process).
//! - Under `--cfg loom` they are a boxed slice of `loom` atomics, so that loom
//!   can explore the interleavings of the code above; only in-process memory
//!   exists then.

#![allow(unsafe_code)]

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, fence};

/// Bytes per word.
pub(crate) const WORD: usize = 8;

/// Granularity of the control block's size: a page for mappings; a word under
/// loom, where every word is a modelled object that costs exploration time.
pub(crate) const CONTROL_GRAIN: usize = if cfg!(loom) { WORD } else { 4096 };

/// A block of memory viewed as atomic 64-bit words; its size in bytes is a
/// non-zero multiple of [`WORD`].
pub(crate) struct Words {
    #[cfg(not(loom))]
    map: memmap2::MmapMut,
    #[cfg(loom)]
    words: Box<[AtomicU64]>,
}

impl Words {
    /// `bytes` of zeroed memory private to this process (and its threads).
    pub(crate) fn anonymous(bytes: usize) -> std::io::Result<Words> {
        check_len(bytes)?;
        #[cfg(not(loom))]
        {
            Ok(Words { map: memmap2::MmapMut::map_anon(bytes)? })
        }
        #[cfg(loom)]
        {
            Ok(Words { words: (0..bytes / WORD).map(|_| AtomicU64::new(0)).collect() })
        }
    }

    /// Maps `file`, whose length must be `bytes`, shared with every other
    /// process that maps it.
    ///
    /// The file must not be truncated while mapped (that would make accesses
    /// fault with SIGBUS); the backend keeps its files in a directory only
    /// their owner can enter, and never truncates them.
    #[cfg(not(loom))]
    pub(crate) fn map_file(file: &std::fs::File, bytes: usize) -> std::io::Result<Words> {
        check_len(bytes)?;
        // SAFETY: `map_mut` is unsafe because the file may be changed behind
        // the mapping's back (by other processes, or by truncation). We never
        // form a `&[u8]`/`&mut [u8]` to the mapping (no `Deref` of `MmapMut`
        // anywhere in this crate): every access goes through the atomic view
        // of `as_slice`, for which concurrent changes by other processes are
        // ordinary atomic races. Truncation is excluded by construction (see
        // above); the caller checked the file's length.
        let map = unsafe { memmap2::MmapOptions::new().len(bytes).map_mut(file)? };
        Ok(Words { map })
    }

    /// The memory as words.
    pub(crate) fn as_slice(&self) -> &[AtomicU64] {
        #[cfg(not(loom))]
        {
            let ptr = self.map.as_ptr();
            debug_assert_eq!(ptr as usize % align_of::<AtomicU64>(), 0);
            // SAFETY:
            // - alignment: mappings start on a page boundary (4096 or more),
            //   a multiple of `align_of::<AtomicU64>()` (8);
            // - length: `check_len` made the mapping's length a non-zero
            //   multiple of 8, so `len / 8` words cover it exactly and stay
            //   inside it; its size is far below `isize::MAX` (memmap2 checks);
            // - validity: `AtomicU64` has the size and bit validity of `u64`,
            //   for which every bit pattern is valid, so whatever another
            //   process wrote is a valid value;
            // - aliasing and mutation: `AtomicU64` is an `UnsafeCell`, so
            //   mutation through this shared slice (by us, other threads or
            //   other processes) is allowed; the pointer comes from `mmap`
            //   (not from a reference) and the mapping is writable, so it may
            //   be written through; no other reference to the bytes exists,
            //   since this crate never dereferences the `MmapMut`;
            // - lifetime: the slice borrows `self`, which owns the mapping,
            //   so it cannot outlive the `munmap` in `MmapMut::drop`.
            unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), self.map.len() / WORD) }
        }
        #[cfg(loom)]
        {
            &self.words
        }
    }

    /// Size in bytes.
    #[cfg_attr(loom, allow(dead_code))] // used by opening files, which loom mode lacks
    pub(crate) fn bytes(&self) -> usize {
        self.as_slice().len() * WORD
    }
}

fn check_len(bytes: usize) -> std::io::Result<()> {
    if bytes == 0 || !bytes.is_multiple_of(WORD) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("memory size {bytes} is not a positive multiple of {WORD} bytes"),
        ));
    }
    Ok(())
}
