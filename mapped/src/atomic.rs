//! The atomic layer: the one place that decides what the words of memory
//! nodes are made of, for every backend over mapped memory.
//!
//! Memory is only ever touched as a slice of [`AtomicU64`] ([`Words::as_slice`]):
//! another process may write any byte of a shared mapping at any time, so a
//! plain load or store would be a data race, and mixing atomic accesses of
//! different sizes on the same bytes is not allowed by Rust's memory model
//! either. Everything above this module works on `&[AtomicU64]`.
//!
//! - Normally the words live in a page-aligned mapping: a `memmap2` mapping
//!   of a file (shared between processes) or of anonymous memory (one
//!   process), or a mapping made elsewhere and handed over as a
//!   [`RawMapping`] (`swarm-backend-cxl` maps DAX devices and `MAP_SYNC`
//!   files that way). A [`Words`] may be a view of part of a mapping
//!   ([`Words::slice`]), so that several memory nodes can share one.
//! - Under `--cfg loom` they are a boxed slice of `loom` atomics, so that loom
//!   can explore the interleavings of the code above; only in-process memory
//!   exists then.

#![allow(unsafe_code)]

use std::sync::Arc;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, fence};

/// Bytes per word.
pub const WORD: usize = 8;

/// Granularity of the control block's size: a page for mappings; a word under
/// loom, where every word is a modelled object that costs exploration time.
pub(crate) const CONTROL_GRAIN: usize = if cfg!(loom) { WORD } else { 4096 };

/// Memory that something other than this crate mapped (for instance with
/// `mmap` flags that `memmap2` does not offer, such as `MAP_SYNC`), handed
/// to [`Words::from_raw`] to be used as atomic words.
///
/// # Safety
///
/// An implementor promises that, for as long as the value lives (until its
/// `Drop`, which should unmap the memory):
/// - [`as_ptr`](RawMapping::as_ptr) always returns the same pointer, aligned
///   to 8 bytes, and the [`len`](RawMapping::len) bytes from it are mapped
///   readable and writable, and stay so;
/// - nothing in this process accesses those bytes except through the atomic
///   words of [`Words`] (no `&[u8]` or `&mut [u8]` to them is ever formed;
///   other processes may of course write them, as with any shared mapping);
/// - the memory does not fault on access (a file behind it is not truncated
///   while mapped).
#[cfg(not(loom))]
pub unsafe trait RawMapping: Send + Sync + 'static {
    /// Start of the mapping.
    fn as_ptr(&self) -> *mut u8;

    /// Length of the mapping in bytes.
    fn len(&self) -> usize;

    /// Whether the mapping is empty (never, for a usable one).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes dirty pages of bytes `offset..offset + len` back to the file
    /// behind the mapping (`msync`); nothing by default.
    fn sync(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// Asks the CPU to start fetching the cache line that holds `word` (see
/// [`crate::bytes::prefetch`]); nothing where there is no such hint.
#[inline]
pub(crate) fn prefetch_line(word: &AtomicU64) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: `_mm_prefetch` needs SSE, part of every x86_64 CPU (the
    // target's baseline, which the compiler already assumes). A prefetch is
    // a hint: it never faults and makes no access the memory model sees,
    // whatever the address; this one is anyway that of a live word.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(word.as_ptr().cast_const().cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = word;
}

/// What a [`Words`] (and every view sliced from it) keeps alive.
enum Backing {
    #[cfg(not(loom))]
    Map(memmap2::MmapRaw),
    #[cfg(not(loom))]
    Raw(Box<dyn RawMapping>),
    #[cfg(loom)]
    Loom(Box<[AtomicU64]>),
}

impl Backing {
    /// The whole backing as words.
    #[inline]
    fn words(&self) -> &[AtomicU64] {
        #[cfg(not(loom))]
        {
            let (ptr, len) = match self {
                Backing::Map(m) => (m.as_mut_ptr(), m.len()),
                Backing::Raw(r) => (r.as_ptr(), r.len()),
            };
            debug_assert_eq!(ptr as usize % align_of::<AtomicU64>(), 0);
            // SAFETY:
            // - alignment: `memmap2` mappings start on a page boundary (4096
            //   or more), a multiple of `align_of::<AtomicU64>()` (8); a
            //   `RawMapping` promises 8-byte alignment, and `from_raw`
            //   checked it;
            // - length: the constructors made the length a non-zero
            //   multiple of 8, so `len / 8` words cover the mapping exactly
            //   and stay inside it; its size is far below `isize::MAX`
            //   (memmap2 checks; the kernel cannot map more);
            // - validity: `AtomicU64` has the size and bit validity of `u64`,
            //   for which every bit pattern is valid, so whatever another
            //   process wrote is a valid value;
            // - aliasing and mutation: `AtomicU64` is an `UnsafeCell`, so
            //   mutation through this shared slice (by us, other threads or
            //   other processes) is allowed; the pointer comes from `mmap`
            //   (`MmapRaw` hands out its raw pointer, never a reference, and
            //   a `RawMapping` promises the same), and the mapping is
            //   writable, so it may be written through; no other reference
            //   to the bytes exists;
            // - lifetime: the slice borrows `self`, which owns the mapping,
            //   so it cannot outlive the `munmap` in its `Drop`.
            unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), len / WORD) }
        }
        #[cfg(loom)]
        {
            let Backing::Loom(words) = self;
            words
        }
    }
}

/// A block of memory viewed as atomic 64-bit words; its size in bytes is a
/// non-zero multiple of [`WORD`].
///
/// All access goes through [`as_slice`](Words::as_slice). Cloning (or
/// [`slice`](Words::slice)) makes another view of the same memory; the
/// mapping goes away with the last view.
#[derive(Clone)]
pub struct Words {
    backing: Arc<Backing>,
    /// First word of the view.
    start: usize,
    /// Words in the view.
    len: usize,
}

impl Words {
    fn whole(backing: Backing) -> Words {
        let len = backing.words().len();
        Words { backing: Arc::new(backing), start: 0, len }
    }

    /// `bytes` of zeroed memory private to this process (and its threads),
    /// in transparent huge pages where the kernel allows them (Linux with
    /// THP `enabled` set to `madvise` or `always`; best effort). Memory
    /// registered for RDMA usually is in huge pages, and a remote access
    /// never walks the client's page tables: with small pages, an emulated
    /// node would charge each access a TLB miss on the client that no
    /// fabric charges, the more so the more objects an operation touches.
    pub fn anonymous(bytes: usize) -> std::io::Result<Words> {
        check_len(bytes)?;
        #[cfg(not(loom))]
        {
            let map: memmap2::MmapRaw = memmap2::MmapMut::map_anon(bytes)?.into();
            // Only advice: the memory is the same without it.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            Ok(Words::whole(Backing::Map(map)))
        }
        #[cfg(loom)]
        {
            Ok(Words::whole(Backing::Loom((0..bytes / WORD).map(|_| AtomicU64::new(0)).collect())))
        }
    }

    /// Maps the first `bytes` of `file` (a regular file at least that long,
    /// or a device), shared with every other process that maps it
    /// (`MAP_SHARED`, read-write).
    ///
    /// The file must not be truncated while mapped: accesses to the missing
    /// part would fault (SIGBUS). Callers keep their files where only their
    /// owner can reach them, and never truncate them.
    #[cfg(not(loom))]
    pub fn map_file(file: &std::fs::File, bytes: usize) -> std::io::Result<Words> {
        check_len(bytes)?;
        // `map_raw` hands out the mapping only as a raw pointer (no `&[u8]`
        // that concurrent changes by other processes would invalidate),
        // which is why it is a safe function.
        let map = memmap2::MmapOptions::new().len(bytes).map_raw(file)?;
        Ok(Words::whole(Backing::Map(map)))
    }

    /// Memory that the caller mapped by other means (see [`RawMapping`]).
    /// Its length must be a positive multiple of 8 and its start 8-byte
    /// aligned.
    #[cfg(not(loom))]
    pub fn from_raw(mapping: Box<dyn RawMapping>) -> std::io::Result<Words> {
        check_len(mapping.len())?;
        if !(mapping.as_ptr() as usize).is_multiple_of(align_of::<AtomicU64>()) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "mapping is not 8-byte aligned"));
        }
        Ok(Words::whole(Backing::Raw(mapping)))
    }

    /// A view of `bytes` bytes starting `offset` bytes into this one, sharing
    /// its memory: both must be multiples of 64 (a cache line, so that
    /// views never share a line), and the range must lie inside this view.
    pub fn slice(&self, offset: usize, bytes: usize) -> std::io::Result<Words> {
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        if !offset.is_multiple_of(64) || !bytes.is_multiple_of(64) || bytes == 0 {
            return Err(bad(format!("view at {offset} of {bytes} bytes is not made of whole 64-byte lines")));
        }
        let end = offset.checked_add(bytes).filter(|&e| e <= self.bytes());
        if end.is_none() {
            return Err(bad(format!("view at {offset} of {bytes} bytes exceeds the {} bytes mapped", self.bytes())));
        }
        Ok(Words { backing: self.backing.clone(), start: self.start + offset / WORD, len: bytes / WORD })
    }

    /// The memory as words.
    #[inline]
    pub fn as_slice(&self) -> &[AtomicU64] {
        &self.backing.words()[self.start..self.start + self.len]
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * WORD
    }

    /// Faults the view's pages in now, writable (`MADV_POPULATE_WRITE` on
    /// Linux; the contents stay as they are), so that no access pays a page
    /// fault later: memory registered for RDMA is pinned, and a node
    /// emulated without this charges the first touch of each page to the
    /// operation that happens to make it. Nothing for memory mapped by
    /// other means, and nothing where the kernel lacks the advice (before
    /// Linux 5.14, other systems): faults are then taken lazily, as before.
    pub fn prefault(&self) -> std::io::Result<()> {
        #[cfg(all(not(loom), target_os = "linux"))]
        if let Backing::Map(m) = &*self.backing {
            return match m.advise_range(memmap2::Advice::PopulateWrite, self.start * WORD, self.bytes()) {
                // EINVAL: a kernel that does not know the advice.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
                other => other,
            };
        }
        Ok(())
    }

    /// Writes the view's dirty pages back to the file behind it (`msync`
    /// with `MS_SYNC`): what makes stores to an ordinary file mapping
    /// durable. Nothing to do for anonymous memory.
    pub fn sync(&self) -> std::io::Result<()> {
        #[cfg(not(loom))]
        {
            let (offset, len) = (self.start * WORD, self.bytes());
            match &*self.backing {
                Backing::Map(m) => m.flush_range(offset, len),
                Backing::Raw(r) => r.sync(offset, len),
            }
        }
        #[cfg(loom)]
        {
            Ok(())
        }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    #[test]
    fn views_share_memory_and_stay_inside() {
        let w = Words::anonymous(4096).unwrap();
        let v = w.slice(1024, 2048).unwrap();
        assert_eq!(v.bytes(), 2048);
        v.as_slice()[0].store(7, Relaxed);
        assert_eq!(w.as_slice()[128].load(Relaxed), 7);
        let vv = v.slice(64, 64).unwrap();
        vv.as_slice()[0].store(9, Relaxed);
        assert_eq!(w.as_slice()[136].load(Relaxed), 9);
        assert!(w.slice(4032, 128).is_err() && w.slice(8, 64).is_err() && w.slice(0, 0).is_err());
        assert!(w.slice(usize::MAX - 63, 64).is_err());
        drop(w);
        assert_eq!(v.as_slice()[0].load(Relaxed), 7, "a view keeps the mapping alive");
    }
}
