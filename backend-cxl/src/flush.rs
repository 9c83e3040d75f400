//! The flush and fence layer: cache-line write-back, invalidation and store
//! fences, chosen at run time, counted per handle, and plugged into the
//! operations of `swarm-mapped`'s handle as its [`Persistence`] hooks.
//!
//! # Instructions (x86_64)
//!
//! - Write-back: `clwb` (writes a dirty line back and may keep it cached:
//!   the cheapest), else `clflushopt` (writes back and evicts, weakly
//!   ordered), else `clflush` (writes back and evicts, ordered with other
//!   `clflush`es: the slowest, but in every x86_64 CPU). Which ones exist is
//!   read from CPUID leaf 7 once, at run time. (`is_x86_feature_detected!`
//!   does not know these two features on stable Rust, and neither does
//!   `#[target_feature]`; the instructions are issued by inline assembly,
//!   which does not need the feature enabled at compile time.)
//! - Invalidation before reads (non-coherent mode): `clflushopt`, else
//!   `clflush`, then `mfence` so that no later load is served from before
//!   the eviction.
//! - Fence: `sfence` waits for the write-backs issued before it (Intel
//!   SDM: `clwb`/`clflushopt` are ordered by `sfence` and `mfence`).
//!
//! On other architectures there is no line write-back here: write-backs
//! are no-ops (not counted) and the fence is a sequentially consistent
//! fence. That is right for coherent memory whose caches are in the
//! persistence domain (eADR-like), and says nothing about durability
//! otherwise; [`FlushMode::NonCoherent`] is refused there
//! ([`crate::CxlError::Unsupported`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use swarm_mapped::Persistence;

use crate::CxlError;

/// How a handle keeps memory durable, or visible to other hosts: a
/// configuration choice, made when opening a cluster
/// ([`crate::CxlCluster::open`]) and the same for every process that uses
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FlushMode {
    /// No flushes: plain coherent memory, exactly as the shared-memory
    /// backend. Use it for DRAM, tmpfs files used as emulated pmem when
    /// durability does not matter, and pmem or CXL memory on platforms
    /// whose CPU caches are inside the persistence domain (eADR, GPF with
    /// caches flushed on power loss).
    None,
    /// Every line a write or CAS stores is written back (`clwb`, else
    /// `clflushopt`, else `clflush`) and fenced (`sfence`) before a later
    /// CAS of the same pipeline is issued and before the operation
    /// completes: if the CAS of a write-then-CAS is visible, or durable, so
    /// is the data, and a completed operation is durable. Use it for pmem,
    /// fsdax files, device-dax and CXL memory that must survive a power
    /// failure on an ADR platform (caches not persistent), and for CXL
    /// memory shared between hosts *with* hardware coherence. The default.
    #[default]
    Persist,
    /// [`Persist`](FlushMode::Persist), and in addition every line is
    /// invalidated (`clflushopt`, else `clflush`, then `mfence`) before it
    /// is read or CASed, so that stale copies in this host's caches are not
    /// used. Use it for a CXL memory pool shared by several hosts without
    /// hardware coherence (CXL 2.0 pooled or multi-headed devices, software
    /// managed coherence). Every process on every host must use it. Reads
    /// and writes then see each other as on a remote memory; a CAS is
    /// atomic among this host's processes, but between hosts only if the
    /// device makes that line coherent (CXL 3 back-invalidation, or memory
    /// mapped uncached): the protocols' CAS words need that. x86_64 only.
    NonCoherent,
}

impl FlushMode {
    /// The mode's name on command lines: `none`, `persist`, `noncoherent`.
    pub fn name(self) -> &'static str {
        match self {
            FlushMode::None => "none",
            FlushMode::Persist => "persist",
            FlushMode::NonCoherent => "noncoherent",
        }
    }
}

impl std::str::FromStr for FlushMode {
    type Err = String;

    fn from_str(s: &str) -> Result<FlushMode, String> {
        match s {
            "none" => Ok(FlushMode::None),
            "persist" => Ok(FlushMode::Persist),
            "noncoherent" | "non-coherent" => Ok(FlushMode::NonCoherent),
            _ => Err(format!("unknown flush mode '{s}' (use none, persist or noncoherent)")),
        }
    }
}

/// A cache-line instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushInstr {
    /// `clwb`: write back, may keep the line.
    Clwb,
    /// `clflushopt`: write back and evict, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and evict, strongly ordered.
    Clflush,
    /// Nothing (not x86_64).
    Nop,
}

/// What the CPU offers, read once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFlush {
    /// `clwb` exists.
    pub clwb: bool,
    /// `clflushopt` exists.
    pub clflushopt: bool,
    /// `clflush` exists (every x86_64 CPU).
    pub clflush: bool,
    /// Bytes per cache line that the flush instructions act on.
    pub line: usize,
}

impl CpuFlush {
    /// What this CPU offers (CPUID, read once per process).
    pub fn detect() -> CpuFlush {
        static CPU: std::sync::OnceLock<CpuFlush> = std::sync::OnceLock::new();
        *CPU.get_or_init(arch::detect)
    }

    /// Whether `instr` can run here.
    pub fn supports(&self, instr: FlushInstr) -> bool {
        match instr {
            FlushInstr::Clwb => self.clwb,
            FlushInstr::Clflushopt => self.clflushopt,
            FlushInstr::Clflush => self.clflush,
            FlushInstr::Nop => true,
        }
    }

    /// The best write-back instruction: `clwb`, else `clflushopt`, else
    /// `clflush`, else none.
    pub fn writeback(&self) -> FlushInstr {
        [FlushInstr::Clwb, FlushInstr::Clflushopt, FlushInstr::Clflush]
            .into_iter()
            .find(|&i| self.supports(i))
            .unwrap_or(FlushInstr::Nop)
    }

    /// The best invalidating instruction: `clflushopt`, else `clflush`, else
    /// none.
    pub fn invalidate(&self) -> FlushInstr {
        [FlushInstr::Clflushopt, FlushInstr::Clflush].into_iter().find(|&i| self.supports(i)).unwrap_or(FlushInstr::Nop)
    }
}

/// What a handle's flushes did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushStats {
    /// Cache lines written back after writes and CASes.
    pub lines_written_back: u64,
    /// Cache lines invalidated before reads and CASes.
    pub lines_invalidated: u64,
    /// Store fences (`sfence`) that drained write-backs.
    pub fences: u64,
}

/// The flush layer of one handle: the [`Persistence`] hooks of
/// [`crate::CxlMemory`], with counters of what it did.
///
/// Cloning gives a flusher with the same configuration and fresh counters
/// (a clone is another handle's).
#[derive(Debug)]
pub struct Flusher {
    mode: FlushMode,
    writeback: FlushInstr,
    invalidate: FlushInstr,
    line: usize,
    written_back: AtomicU64,
    invalidated: AtomicU64,
    fences: AtomicU64,
}

impl Clone for Flusher {
    fn clone(&self) -> Flusher {
        Flusher { written_back: AtomicU64::new(0), invalidated: AtomicU64::new(0), fences: AtomicU64::new(0), ..*self }
    }
}

impl Flusher {
    /// A flusher for `mode` with the best instructions of this CPU.
    /// [`FlushMode::NonCoherent`] needs x86_64.
    pub fn new(mode: FlushMode) -> Result<Flusher, CxlError> {
        Flusher::with_writeback(mode, CpuFlush::detect().writeback())
    }

    /// A flusher for `mode` that writes lines back with `writeback` (to
    /// compare instructions), if this CPU has it.
    pub fn with_writeback(mode: FlushMode, writeback: FlushInstr) -> Result<Flusher, CxlError> {
        let cpu = CpuFlush::detect();
        if !cpu.supports(writeback) {
            return Err(CxlError::Unsupported(format!("this CPU has no {writeback:?} instruction")));
        }
        if mode == FlushMode::NonCoherent && cpu.invalidate() == FlushInstr::Nop {
            return Err(CxlError::Unsupported(
                "the non-coherent mode needs cache-line invalidation (clflush), which only x86_64 has here".into(),
            ));
        }
        Ok(Flusher {
            mode,
            writeback,
            invalidate: cpu.invalidate(),
            line: cpu.line,
            written_back: AtomicU64::new(0),
            invalidated: AtomicU64::new(0),
            fences: AtomicU64::new(0),
        })
    }

    /// The mode.
    pub fn mode(&self) -> FlushMode {
        self.mode
    }

    /// The write-back instruction.
    pub fn writeback_instr(&self) -> FlushInstr {
        self.writeback
    }

    /// What this flusher did so far.
    pub fn stats(&self) -> FlushStats {
        FlushStats {
            lines_written_back: self.written_back.load(Relaxed),
            lines_invalidated: self.invalidated.load(Relaxed),
            fences: self.fences.load(Relaxed),
        }
    }

    /// Sets the counters back to zero.
    pub fn reset_stats(&self) {
        self.written_back.store(0, Relaxed);
        self.invalidated.store(0, Relaxed);
        self.fences.store(0, Relaxed);
    }

    /// Runs `instr` on every cache line of bytes `offset..offset + len` of
    /// `words`; returns how many lines.
    fn lines(&self, instr: FlushInstr, words: &[std::sync::atomic::AtomicU64], offset: u64, len: usize) -> u64 {
        if len == 0 || instr == FlushInstr::Nop {
            return 0;
        }
        // The hooks get checked ranges, but a hook must not panic, nor touch
        // anything outside `words`: clamp to the slice.
        let bytes = std::mem::size_of_val(words);
        let Ok(start) = usize::try_from(offset) else { return 0 };
        if start >= bytes {
            return 0;
        }
        let end = start.saturating_add(len).min(bytes);
        let base = words.as_ptr() as usize;
        let mask = !(self.line - 1);
        let (first, last) = ((base + start) & mask, (base + end - 1) & mask);
        let mut n = 0;
        let mut line = first;
        while line <= last {
            // Each line holds a byte of `words` (the first and last by
            // construction, the ones between are inside the range), and
            // rounding an address down to its line start stays in its page,
            // so every address flushed is mapped, readable memory.
            arch::flush_line(instr, line);
            n += 1;
            line += self.line;
        }
        n
    }
}

impl Persistence for Flusher {
    fn before_read(&self, words: &[std::sync::atomic::AtomicU64], offset: u64, len: usize) {
        if self.mode == FlushMode::NonCoherent {
            let n = self.lines(self.invalidate, words, offset, len);
            arch::full_fence();
            self.invalidated.fetch_add(n, Relaxed);
        }
    }

    fn after_write(&self, words: &[std::sync::atomic::AtomicU64], offset: u64, len: usize) {
        if self.mode != FlushMode::None {
            let n = self.lines(self.writeback, words, offset, len);
            self.written_back.fetch_add(n, Relaxed);
        }
    }

    fn drain(&self) {
        if self.mode != FlushMode::None {
            arch::store_fence();
            self.fences.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod arch {
    use std::arch::asm;
    use std::arch::x86_64::__cpuid_count;

    use super::{CpuFlush, FlushInstr};

    pub(super) fn detect() -> CpuFlush {
        // SAFETY: `cpuid` exists on every x86_64 CPU and only reads
        // identification registers; leaf 7 is valid when the highest leaf
        // (leaf 0's EAX) is at least 7, checked first. (The intrinsic is an
        // `unsafe fn` on older toolchains, a safe one on newer.)
        #[allow(unused_unsafe)]
        let (leaf1, leaf7) = unsafe {
            let max = __cpuid_count(0, 0).eax;
            (__cpuid_count(1, 0), (max >= 7).then(|| __cpuid_count(7, 0)))
        };
        // CPUID.1:EBX[15:8] is the CLFLUSH line size in 8-byte units
        // (CPUID.1:EDX[19] says CLFLUSH exists, as on every x86_64 CPU).
        let line = (((leaf1.ebx >> 8) & 0xFF) as usize * 8).max(64);
        let line = if line.is_power_of_two() { line } else { 64 };
        CpuFlush {
            clflush: leaf1.edx & (1 << 19) != 0,
            // CPUID.7.0:EBX[23] CLFLUSHOPT, [24] CLWB.
            clflushopt: leaf7.is_some_and(|l| l.ebx & (1 << 23) != 0),
            clwb: leaf7.is_some_and(|l| l.ebx & (1 << 24) != 0),
            line,
        }
    }

    /// Writes back (and for the `clflush*` kinds evicts) the cache line
    /// holding address `addr`.
    pub(super) fn flush_line(instr: FlushInstr, addr: usize) {
        // SAFETY (all three): the instruction exists on this CPU: a
        // `Flusher` holds only instructions that `CpuFlush::detect` (CPUID)
        // reported, so none raises #UD. `addr` is an address of mapped,
        // readable memory (see `Flusher::lines`), so none faults. None
        // changes the contents of memory as any program observes it (they
        // move a line between cache and memory), so nothing Rust assumes
        // about memory is broken. The blocks are not `nomem`/`readonly`, so
        // the compiler keeps them after the stores that precede them in
        // program order, whose lines they must write back; they use no
        // stack and leave the flags alone.
        unsafe {
            match instr {
                FlushInstr::Clwb => asm!("clwb [{0}]", in(reg) addr, options(nostack, preserves_flags)),
                FlushInstr::Clflushopt => asm!("clflushopt [{0}]", in(reg) addr, options(nostack, preserves_flags)),
                FlushInstr::Clflush => asm!("clflush [{0}]", in(reg) addr, options(nostack, preserves_flags)),
                FlushInstr::Nop => {}
            }
        }
    }

    /// `sfence`: the write-backs issued before it complete before any store
    /// after it.
    pub(super) fn store_fence() {
        // SAFETY: `sfence` exists on every x86_64 CPU (SSE is part of the
        // base ISA), touches no memory and no flags; not `nomem`, so that
        // the compiler does not move memory accesses across it.
        unsafe { asm!("sfence", options(nostack, preserves_flags)) }
    }

    /// `mfence`: the evictions before it complete before any load after it.
    pub(super) fn full_fence() {
        // SAFETY: as for `sfence` (`mfence` is SSE2, also in the base ISA).
        unsafe { asm!("mfence", options(nostack, preserves_flags)) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod arch {
    //! No cache-line instructions: write-backs do nothing, fences are
    //! sequentially consistent fences (see the module documentation).
    use std::sync::atomic::{Ordering::SeqCst, fence};

    use super::{CpuFlush, FlushInstr};

    pub(super) fn detect() -> CpuFlush {
        CpuFlush { clwb: false, clflushopt: false, clflush: false, line: 64 }
    }

    pub(super) fn flush_line(_instr: FlushInstr, _addr: usize) {}

    pub(super) fn store_fence() {
        fence(SeqCst);
    }

    pub(super) fn full_fence() {
        fence(SeqCst);
    }
}
