//! How a device or file becomes mapped memory: what it is (device-dax,
//! a file on a DAX file system, any other file), its size and alignment,
//! and the mapping that suits it.
//!
//! - **device-dax** (`/dev/daxX.Y`, a character device of the `dax` bus):
//!   its size and alignment come from sysfs
//!   (`/sys/dev/char/MAJ:MIN/{size,align}`, or the region's `align` on older
//!   kernels); a mapping must be a whole number of `align` units (the kernel
//!   places it at an aligned address itself). Mapped `MAP_SHARED` with
//!   memmap2; there is no page cache, stores that are written back from the
//!   CPU caches are durable.
//! - **file on a DAX file system** (ext4/xfs mounted `-o dax`, on pmem or a
//!   `memmap=` emulated region): mapped `MAP_SHARED_VALIDATE | MAP_SYNC`
//!   (memmap2 cannot ask for `MAP_SYNC`, so rustix's `mmap` makes this one
//!   mapping), which guarantees that the file's metadata is durable before
//!   a page can be written, so written-back stores are durable.
//! - **any other file**: the kernel refuses `MAP_SYNC`; it is mapped
//!   `MAP_SHARED` with memmap2, stores go to the page cache, and durability
//!   across power loss needs `msync` ([`crate::CxlCluster::sync`]). On
//!   tmpfs (`/dev/shm`) it is RAM: emulated pmem for tests, nothing
//!   survives a reboot, but everything survives the crash of a process.
//!
//! A block device (`/dev/pmem0`) is refused with advice: mount it with
//! `-o dax` and use a file on it, or make the namespace device-dax.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use swarm_mapped::Words;

use crate::CxlError;

/// Page size every file mapping is made of.
pub const PAGE: u64 = 4096;

/// What backs a part of a cluster, as found when mapping it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingKind {
    /// A device-dax character device, mapped directly (no page cache).
    DeviceDax {
        /// Its size in bytes (sysfs).
        size: u64,
        /// Its mapping alignment in bytes (sysfs).
        align: u64,
    },
    /// A file on a DAX file system, mapped with `MAP_SYNC`.
    FsDax,
    /// Any other file: page cache (durable only after `msync`).
    File {
        /// On tmpfs, i.e. in RAM: nothing is ever durable.
        tmpfs: bool,
    },
}

impl BackingKind {
    /// A short description, for listings.
    pub fn describe(&self) -> String {
        match self {
            BackingKind::DeviceDax { size, align } => format!("device-dax ({size} bytes, align {align})"),
            BackingKind::FsDax => "file on a DAX file system (MAP_SYNC)".into(),
            BackingKind::File { tmpfs: true } => "file on tmpfs (emulated pmem, volatile)".into(),
            BackingKind::File { tmpfs: false } => "file in the page cache (durable after msync)".into(),
        }
    }

    /// Whether stores reach a persistence domain once written back from
    /// the CPU caches (no `msync` needed).
    pub fn is_synchronous(&self) -> bool {
        matches!(self, BackingKind::DeviceDax { .. } | BackingKind::FsDax)
    }

    /// The device's alignment (a page for files).
    pub fn align(&self) -> u64 {
        match self {
            BackingKind::DeviceDax { align, .. } => *align,
            _ => PAGE,
        }
    }
}

/// An open device or file, before mapping.
pub(crate) struct Target {
    pub path: PathBuf,
    pub file: File,
    /// A device-dax instance: its size and alignment.
    pub dax: Option<(u64, u64)>,
    /// Bytes available: the device's size or the file's length.
    pub size: u64,
}

/// Where sysfs is (a test may fake it).
pub(crate) fn default_sysfs() -> PathBuf {
    PathBuf::from("/sys")
}

/// Opens `path` for reading and writing and finds out what it is. With
/// `create`, a path that does not exist becomes a new regular file (mode
/// 0600, empty). A regular file must be this user's alone
/// ([`swarm_mapped::check_private`]: another user's, or one that group or
/// others may reach, is refused); a device-dax device is not checked.
pub(crate) fn open(path: &Path, create: bool, sysfs: &Path) -> Result<Target, CxlError> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
    if create {
        opts.create(true).mode(0o600);
    }
    let file = opts.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::IsADirectory => {
            CxlError::invalid(path, "is a directory, not a device-dax character device or a file")
        }
        _ => CxlError::io(path, "open", e),
    })?;
    let meta = file.metadata().map_err(|e| CxlError::io(path, "stat", e))?;
    let ft = meta.file_type();
    if ft.is_block_device() {
        return Err(CxlError::invalid(
            path,
            "is a block device (fsdax namespace): mount it with -o dax and give a file on it, \
             or reconfigure the namespace as device-dax (ndctl create-namespace -m devdax)",
        ));
    }
    if ft.is_char_device() {
        let (size, align) = dax_geometry(sysfs, meta.rdev()).map_err(|r| CxlError::invalid(path, r))?;
        return Ok(Target { path: path.to_path_buf(), file, dax: Some((size, align)), size });
    }
    if !ft.is_file() {
        return Err(CxlError::invalid(path, "is neither a device-dax character device nor a regular file"));
    }
    // A file must be ours alone (devices are root's, shared with a group, by design).
    swarm_mapped::check_private(&meta).map_err(|r| CxlError::invalid(path, r))?;
    Ok(Target { path: path.to_path_buf(), file, dax: None, size: meta.len() })
}

/// Size and alignment of the device-dax instance with device number `rdev`,
/// from sysfs; an error in words if it is not device-dax.
pub(crate) fn dax_geometry(sysfs: &Path, rdev: u64) -> Result<(u64, u64), String> {
    let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    let dir = sysfs.join(format!("dev/char/{major}:{minor}"));
    let not_dax = || format!("is a character device ({major}:{minor}) but not a device-dax instance");
    let subsystem = std::fs::canonicalize(dir.join("subsystem")).map_err(|_| not_dax())?;
    if subsystem.file_name().and_then(|n| n.to_str()) != Some("dax") {
        return Err(not_dax());
    }
    let read_u64 = |p: PathBuf| -> Option<Result<u64, String>> {
        let text = std::fs::read_to_string(&p).ok()?;
        let t = text.trim();
        let n = match t.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => t.parse(),
        };
        Some(n.map_err(|_| format!("sysfs {} holds '{t}', not a number", p.display())))
    };
    let size =
        read_u64(dir.join("size")).ok_or_else(|| format!("sysfs {} is missing", dir.join("size").display()))??;
    // `align` of the instance (Linux 5.10+), else of its region.
    let align = ["align", "dax_region/align", "device/dax_region/align"]
        .iter()
        .find_map(|a| read_u64(dir.join(a)))
        .transpose()?
        // Unknown: 2 MiB, the kernel's default, a multiple of 4 KiB; a
        // device with 1 GiB alignment then fails to map, with its error.
        .unwrap_or(2 << 20);
    if align == 0 || !align.is_power_of_two() || !align.is_multiple_of(PAGE) {
        return Err(format!("sysfs gives an impossible alignment of {align} bytes"));
    }
    if size == 0 {
        return Err("the device-dax instance has size 0 (not configured)".into());
    }
    Ok((size, align))
}

/// Maps the first `len` bytes of `t` (which must have them), and says what
/// the mapping is.
pub(crate) fn map(t: &Target, len: u64) -> Result<(Words, BackingKind), CxlError> {
    if len > t.size {
        return Err(CxlError::TooSmall { path: t.path.clone(), size: t.size, needed: len });
    }
    let bytes = usize::try_from(len).map_err(|_| CxlError::Config(format!("{len} bytes exceed the address space")))?;
    if let Some((size, align)) = t.dax {
        if !len.is_multiple_of(align) {
            return Err(CxlError::Misaligned { path: t.path.clone(), what: "mapping length", value: len, align });
        }
        let words = Words::map_file(&t.file, bytes).map_err(|e| CxlError::io(&t.path, "map the device", e))?;
        return Ok((words, BackingKind::DeviceDax { size, align }));
    }
    #[cfg(target_os = "linux")]
    match sync_map::map_sync(&t.file, bytes) {
        Ok(m) => {
            let words = Words::from_raw(Box::new(m)).map_err(|e| CxlError::io(&t.path, "map the file", e))?;
            return Ok((words, BackingKind::FsDax));
        }
        // Not a DAX file system (EOPNOTSUPP), or a kernel older than 4.15
        // that knows no MAP_SHARED_VALIDATE (EINVAL): an ordinary mapping.
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::INVAL => {}
        Err(e) => return Err(CxlError::io(&t.path, "map the file with MAP_SYNC", e.into())),
    }
    let words = Words::map_file(&t.file, bytes).map_err(|e| CxlError::io(&t.path, "map the file", e))?;
    Ok((words, BackingKind::File { tmpfs: is_tmpfs(&t.file) }))
}

/// Whether `file` lives on tmpfs.
fn is_tmpfs(file: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        const TMPFS_MAGIC: u64 = 0x0102_1994;
        #[allow(clippy::unnecessary_cast)] // the field's type differs between libc and linux_raw
        rustix::fs::fstatfs(file).is_ok_and(|st| st.f_type as u64 == TMPFS_MAGIC)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        false
    }
}

/// The one mapping memmap2 cannot make: `MAP_SHARED_VALIDATE | MAP_SYNC`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sync_map {
    use std::ffi::c_void;
    use std::fs::File;

    use rustix::mm::{MapFlags, MsyncFlags, ProtFlags};
    use swarm_mapped::RawMapping;

    /// A `MAP_SYNC` mapping, unmapped on drop.
    pub(crate) struct SyncMap {
        ptr: *mut c_void,
        len: usize,
    }

    // SAFETY: the mapping is plain shared memory, not tied to a thread; the
    // struct only holds its address and length, and all access to the
    // memory goes through atomics (see `RawMapping`).
    unsafe impl Send for SyncMap {}
    // SAFETY: as for `Send`: `&SyncMap` hands out only the address.
    unsafe impl Sync for SyncMap {}

    /// Maps the first `len` bytes of `file` read-write, shared, with
    /// synchronous page faults; fails with `EOPNOTSUPP` off a DAX file system.
    pub(crate) fn map_sync(file: &File, len: usize) -> rustix::io::Result<SyncMap> {
        // SAFETY: a null address lets the kernel place a fresh mapping,
        // which no Rust reference can point into; the memory is only ever
        // accessed through the atomic words of `Words` (see the
        // `RawMapping` impl below), never through references, so no
        // reference invariant can be broken by other processes writing it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED_VALIDATE | MapFlags::SYNC,
                file,
                0,
            )?
        };
        Ok(SyncMap { ptr, len })
    }

    // SAFETY: `ptr` comes from a successful `mmap` of `len` bytes, readable
    // and writable, page-aligned (so 8-byte aligned), and stays mapped until
    // `drop` unmaps it; it never changes. This crate never forms a
    // reference to the bytes (only `Words` reads and writes them, as
    // atomics). The file behind it is the cluster's own, checked to hold
    // `len` bytes before mapping and never truncated by this backend.
    unsafe impl RawMapping for SyncMap {
        fn as_ptr(&self) -> *mut u8 {
            self.ptr.cast()
        }

        fn len(&self) -> usize {
            self.len
        }

        fn sync(&self, offset: usize, len: usize) -> std::io::Result<()> {
            let page = super::PAGE as usize;
            let start = offset / page * page;
            let end = offset.saturating_add(len).min(self.len);
            if end <= start {
                return Ok(());
            }
            // SAFETY: `start` is page-aligned and `start..end` lies inside
            // the mapping, which is alive; msync changes no memory contents.
            unsafe { rustix::mm::msync(self.ptr.cast::<u8>().add(start).cast(), end - start, MsyncFlags::SYNC) }
                .map_err(Into::into)
        }
    }

    impl Drop for SyncMap {
        fn drop(&mut self) {
            // SAFETY: the mapping is ours and nothing uses it any more:
            // every `Words` view holds the `Arc` that owns this value, so it
            // is dropped only after the last view.
            let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
        }
    }
}
