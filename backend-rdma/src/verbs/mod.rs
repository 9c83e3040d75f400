//! Real verbs, through rdma-core (`ibverbs-sys`, the FFI crate of the
//! `ibverbs` project, whose safe API covers only two-sided SEND/RECV).
//!
//! This module owns every `unsafe` call into libibverbs. Each verbs object
//! is wrapped in a type that frees it on drop, and owners declare their
//! fields so that queue pairs go before completion queues, memory regions
//! before protection domains, and those before the device context, which is
//! the order libibverbs requires.
//!
//! - [`Device`]: an opened device and port (LID, GID, MTU, limits).
//! - [`node::VerbsNode`]: the memory node's side, the daemon's
//!   [`Acceptor`](crate::daemon::Acceptor).
//! - [`nic::VerbsNic`]: the client's side, a [`Nic`](crate::Nic); with
//!   [`nic::connect`] it becomes an [`RdmaMemory`](crate::RdmaMemory).

pub mod nic;
pub mod node;

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;

use ibverbs_sys as ffi;

use crate::bootstrap::Endpoint;

/// Transport retries before a request fails with `RETRY_EXC_ERR`.
const RETRY_COUNT: u8 = 7;
/// Local ACK timeout, 4.096 µs × 2^14 ≈ 67 ms per try.
const ACK_TIMEOUT: u8 = 14;
/// Outstanding READs and atomics a queue pair may have (clamped to the device's).
const RD_ATOMIC: i32 = 16;

/// The device, port and addressing to use.
#[derive(Clone, Debug, Default)]
pub struct DeviceChoice {
    /// Device name; `None`: the first.
    pub name: Option<String>,
    /// Port number (from 1); 0 means 1.
    pub port: u8,
    /// GID index (RoCE); `None`: by LID, or index 0 on an Ethernet port.
    pub gid_index: Option<u8>,
}

/// An opened RDMA device with the port it uses.
pub struct Device {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    port: u8,
    lid: u16,
    mtu: ffi::ibv_mtu,
    gid: Option<(u8, [u8; 16])>,
    rd_atomic: u8,
    max_qp_wr: u32,
}

// SAFETY: libibverbs contexts may be used from any thread (the library
// locks internally); this type only reads its own copied attributes.
unsafe impl Send for Device {}
// SAFETY: as above; every method takes `&self` and calls thread-safe verbs.
unsafe impl Sync for Device {}

/// "no RDMA device found", with why if the library said.
fn no_device(detail: &str) -> String {
    if detail.is_empty() { "no RDMA device found".into() } else { format!("no RDMA device found ({detail})") }
}

impl Device {
    /// Opens the device and port `choice` names.
    pub fn open(choice: &DeviceChoice) -> Result<Device, String> {
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = io::Error::last_os_error();
            return Err(no_device(&format!("ibv_get_device_list: {e}")));
        }
        // SAFETY: the list holds `n` valid device pointers.
        let devices = unsafe { std::slice::from_raw_parts(list, n.max(0) as usize) };
        let name_of = |d: *mut ffi::ibv_device| {
            // SAFETY: `d` is from the list; the name is a NUL-terminated
            // string owned by the library while the list lives.
            unsafe { CStr::from_ptr(ffi::ibv_get_device_name(d)) }.to_string_lossy().into_owned()
        };
        let names: Vec<String> = devices.iter().map(|&d| name_of(d)).collect();
        let pick = match &choice.name {
            None => devices.first().copied().zip(names.first().cloned()),
            Some(want) => names.iter().position(|n| n == want).map(|i| (devices[i], names[i].clone())),
        };
        let opened = pick.map(|(dev, name)| {
            // SAFETY: `dev` is a valid device of the live list.
            (unsafe { ffi::ibv_open_device(dev) }, name)
        });
        // SAFETY: the list came from ibv_get_device_list; opened contexts
        // stay valid after it is freed.
        unsafe { ffi::ibv_free_device_list(list) };
        let (ctx, name) = match (opened, &choice.name) {
            (Some(opened), _) => opened,
            (None, None) => return Err(no_device("")),
            (None, Some(want)) => {
                return Err(format!("no RDMA device named {want} (found: {})", names.join(", ")));
            }
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| format!("cannot open {name}: {}", io::Error::last_os_error()))?;
        let mut dev = Device {
            ctx,
            name,
            port: choice.port.max(1),
            lid: 0,
            mtu: ffi::IBV_MTU_1024,
            gid: None,
            rd_atomic: 1,
            max_qp_wr: 0,
        };
        dev.query(choice.gid_index)?;
        Ok(dev)
    }

    /// Reads the port's and device's attributes.
    fn query(&mut self, gid_index: Option<u8>) -> Result<(), String> {
        let ctx = self.ctx.as_ptr();
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `attr` is a valid out-pointer of the layout the library
        // writes (the compat type is the same struct).
        let errno = unsafe { ffi::ibv_query_port(ctx, self.port, &mut attr as *mut ffi::ibv_port_attr as *mut _) };
        if errno != 0 {
            return Err(format!("{} port {}: {}", self.name, self.port, io::Error::from_raw_os_error(errno)));
        }
        if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(format!("{} port {} is not active (state {})", self.name, self.port, attr.state));
        }
        self.lid = attr.lid;
        self.mtu = attr.active_mtu;
        let ethernet = u32::from(attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
        let index = gid_index.or(ethernet.then_some(0));
        if let Some(i) = index {
            if i32::from(i) >= attr.gid_tbl_len {
                return Err(format!(
                    "{} port {} has {} GIDs; gid_index {i} does not exist",
                    self.name, self.port, attr.gid_tbl_len
                ));
            }
            let mut gid = ffi::ibv_gid { raw: [0; 16] };
            // SAFETY: `gid` is a valid out-pointer; the index is in the table.
            let errno = unsafe { ffi::ibv_query_gid(ctx, self.port, i32::from(i), &mut gid) };
            if errno != 0 {
                return Err(format!("{} GID {i}: {}", self.name, io::Error::from_raw_os_error(errno)));
            }
            // SAFETY: every bit pattern of the union is a valid byte array.
            self.gid = Some((i, unsafe { gid.raw }));
        }
        let mut dattr = ffi::ibv_device_attr::default();
        // SAFETY: `dattr` is a valid out-pointer.
        let errno = unsafe { ffi::ibv_query_device(ctx, &mut dattr) };
        if errno != 0 {
            return Err(format!("{}: {}", self.name, io::Error::from_raw_os_error(errno)));
        }
        if dattr.atomic_cap == ffi::IBV_ATOMIC_NONE {
            return Err(format!("{} has no atomic operations, which every protocol here needs (CAS)", self.name));
        }
        if dattr.max_qp_rd_atom < 1 || dattr.max_qp_init_rd_atom < 1 {
            return Err(format!("{} allows no outstanding RDMA READ or atomic per queue pair", self.name));
        }
        self.rd_atomic = RD_ATOMIC.min(dattr.max_qp_rd_atom).min(dattr.max_qp_init_rd_atom) as u8;
        self.max_qp_wr = dattr.max_qp_wr.max(1) as u32;
        Ok(())
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The largest send queue the device allows.
    pub fn max_queue_depth(&self) -> usize {
        self.max_qp_wr as usize
    }

    /// A protection domain on this device.
    /// (Crate-only: the owner must drop the domain before the device.)
    pub(crate) fn alloc_pd(&self) -> Result<Pd, String> {
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(self.ctx.as_ptr()) };
        NonNull::new(pd)
            .map(|pd| Pd { pd })
            .ok_or_else(|| format!("cannot allocate a protection domain: {}", io::Error::last_os_error()))
    }

    /// A completion queue of at least `entries` entries.
    /// (Crate-only: the owner must drop the queue before the device, and
    /// after its queue pairs.)
    pub(crate) fn create_cq(&self, entries: usize) -> Result<Cq, String> {
        // SAFETY: the context is open; no channel, no context pointer.
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx.as_ptr(),
                entries.min(i32::MAX as usize) as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        NonNull::new(cq)
            .map(|cq| Cq { cq })
            .ok_or_else(|| format!("cannot create a completion queue of {entries}: {}", io::Error::last_os_error()))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every object made from it is
        // owned by fields declared before this one in its owners.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    pd: NonNull<ffi::ibv_pd>,
}

// SAFETY: protection domains are thread-safe in libibverbs.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; its MRs and QPs are gone first.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Remote access a registration allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The NIC may write it locally (a client's buffers: READ results, CAS old values).
    Local,
    /// Remote READ, WRITE and atomics (a memory node's region).
    Remote,
}

impl Pd {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory must stay mapped, and not be moved or freed, until the
    /// returned registration is dropped.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr, String> {
        use ffi::ibv_access_flags as A;
        let flags = match access {
            Access::Local => A::IBV_ACCESS_LOCAL_WRITE,
            Access::Remote => {
                A::IBV_ACCESS_LOCAL_WRITE
                    | A::IBV_ACCESS_REMOTE_READ
                    | A::IBV_ACCESS_REMOTE_WRITE
                    | A::IBV_ACCESS_REMOTE_ATOMIC
            }
        };
        // SAFETY: the caller keeps the memory alive for the registration.
        let mr = unsafe { ffi::ibv_reg_mr(self.pd.as_ptr(), addr.cast(), len, flags.0 as i32) };
        NonNull::new(mr).map(|mr| Mr { mr }).ok_or_else(|| {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(12) || e.raw_os_error() == Some(1) {
                " (the memlock limit is probably too low: see `ulimit -l`, and the README)"
            } else {
                ""
            };
            format!("cannot register {len} bytes with the NIC: {e}{hint}")
        })
    }

    /// A reliable-connected queue pair on `cq`, with room for `depth` work
    /// requests, in the INIT state with `access` for incoming requests.
    /// (Crate-only: the owner must drop the queue pair before `cq`, this
    /// domain and `dev`.)
    pub(crate) fn create_qp(&self, dev: &Device, cq: &Cq, depth: usize, access: Access) -> Result<Qp, String> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: depth as u32,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `init` is valid and names live CQs of this device.
        let qp = unsafe { ffi::ibv_create_qp(self.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp)
            .map(|qp| Qp { qp })
            .ok_or_else(|| format!("cannot create a queue pair: {}", io::Error::last_os_error()))?;
        use ffi::ibv_access_flags as A;
        let flags = match access {
            Access::Local => A(0),
            Access::Remote => A::IBV_ACCESS_REMOTE_READ | A::IBV_ACCESS_REMOTE_WRITE | A::IBV_ACCESS_REMOTE_ATOMIC,
        };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: dev.port,
            qp_access_flags: flags.0,
            ..Default::default()
        };
        use ffi::ibv_qp_attr_mask as M;
        qp.modify(&mut attr, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS, "INIT")?;
        Ok(qp)
    }
}

/// A memory registration.
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
}

// SAFETY: registrations are immutable after creation; reading their keys is thread-safe.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// The local key (for work requests' scatter/gather entries).
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration is live; lkey is set once by the library.
        unsafe { self.mr.as_ref() }.lkey
    }

    /// The remote key (for peers' work requests).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref() }.rkey
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and not yet deregistered.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue.
pub struct Cq {
    cq: NonNull<ffi::ibv_cq>,
}

// SAFETY: polling is done by one thread at a time (the owner is not
// `Sync`); creation and destruction are thread-safe in libibverbs.
unsafe impl Send for Cq {}

impl Cq {
    /// Moves up to `out.len()` completions into `out`.
    pub fn poll(&self, out: &mut [ffi::ibv_wc]) -> Result<usize, String> {
        let cq = self.cq.as_ptr();
        // SAFETY: the CQ is live; `ibv_poll_cq` is an inline function of
        // verbs.h that calls the provider's `poll_cq` op, as done here, with
        // an out-array of `out.len()` entries.
        let n = unsafe {
            let ctx = (*cq).context;
            let poll_cq = (*ctx).ops.poll_cq.ok_or("the provider has no poll_cq")?;
            poll_cq(cq, out.len().min(i32::MAX as usize) as i32, out.as_mut_ptr())
        };
        if n < 0 { Err(format!("ibv_poll_cq failed ({n})")) } else { Ok(n as usize) }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; its QPs are destroyed first.
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A reliable-connected queue pair.
pub struct Qp {
    qp: NonNull<ffi::ibv_qp>,
}

// SAFETY: a client's queue pairs are used by its one handle (not `Sync`);
// the daemon's are only kept alive.
unsafe impl Send for Qp {}

impl Qp {
    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask, state: &str) -> Result<(), String> {
        // SAFETY: the QP is live and `attr` is valid for `mask`.
        let errno = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if errno == 0 {
            Ok(())
        } else {
            Err(format!("cannot move the queue pair to {state}: {}", io::Error::from_raw_os_error(errno)))
        }
    }

    /// This queue pair's endpoint on `dev`, with first sequence number `psn`.
    pub fn endpoint(&self, dev: &Device, psn: u32) -> Endpoint {
        // SAFETY: the QP is live; qp_num is set once at creation.
        let qpn = unsafe { self.qp.as_ref() }.qp_num;
        Endpoint {
            lid: dev.lid,
            qpn,
            psn: psn & 0xff_ffff,
            gid: dev.gid.map(|g| g.1).unwrap_or_default(),
            mtu: dev.mtu as u8,
            rd_atomic: dev.rd_atomic,
        }
    }

    /// Connects to `remote` (INIT → RTR → RTS); `psn` is this side's.
    pub fn connect(&self, dev: &Device, remote: &Endpoint, psn: u32) -> Result<(), String> {
        use ffi::ibv_qp_attr_mask as M;
        let mut ah =
            ffi::ibv_ah_attr { dlid: remote.lid, sl: 0, src_path_bits: 0, port_num: dev.port, ..Default::default() };
        let global = remote.gid != [0; 16] || dev.gid.is_some();
        if global {
            let (sgid_index, _) =
                dev.gid.ok_or("the other end addresses by GID (RoCE) but this one has none: set a GID index (the cluster file's client.gid_index, the memory node's --gid-index)")?;
            ah.is_global = 1;
            ah.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            ah.grh.sgid_index = sgid_index;
            ah.grh.hop_limit = 0xff;
        }
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            // Both ends pick the smaller port's MTU, so packets fit both.
            path_mtu: dev.mtu.min(ffi::ibv_mtu::from(remote.mtu)),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: dev.rd_atomic,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut rtr, mask, "RTR")?;
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: psn & 0xff_ffff,
            timeout: ACK_TIMEOUT,
            retry_cnt: RETRY_COUNT,
            rnr_retry: 7,
            // No more outstanding than the other end takes as responder.
            max_rd_atomic: dev.rd_atomic.min(remote.rd_atomic),
            ..Default::default()
        };
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut rts, mask, "RTS")
    }

    /// Posts the linked list starting at `first` with one doorbell. A
    /// refusal gives the `errno` and how many of the list's first requests
    /// were posted before the one refused (`bad_wr`).
    ///
    /// # Safety
    /// `first` must start a valid list (its `next` pointers, scatter/gather
    /// entries and their registered buffers), and the buffers must stay
    /// untouched by the CPU until the requests complete.
    pub unsafe fn post_send(&self, first: *mut ffi::ibv_send_wr) -> Result<(), (i32, usize)> {
        let qp = self.qp.as_ptr();
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `ibv_post_send` is an inline function of verbs.h that calls
        // the provider's `post_send` op, as done here; the caller vouches for
        // the list.
        let errno = unsafe {
            let ctx = (*qp).context;
            match (*ctx).ops.post_send {
                Some(post) => post(qp, first, &mut bad),
                None => 95, // EOPNOTSUPP
            }
        };
        if errno == 0 {
            return Ok(());
        }
        // The requests before `bad` went to the NIC (a null or foreign
        // `bad`: count none, and the whole list if it is not found).
        let mut posted = 0;
        let mut wr = first;
        while !bad.is_null() && !wr.is_null() && wr != bad {
            posted += 1;
            // SAFETY: `wr` is an entry of the caller's valid list.
            wr = unsafe { (*wr).next };
        }
        Err((errno, if wr == bad { posted } else { 0 }))
    }

    /// Moves the queue pair to the error state: its outstanding requests
    /// complete with flush errors.
    pub fn to_error(&self) -> Result<(), String> {
        let mut attr = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_ERR, ..Default::default() };
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE, "ERR")
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp; destroyed once, before its CQ and PD.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// A packet sequence number nobody else picks at the same moment.
pub fn fresh_psn() -> u32 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let x = t ^ (u64::from(std::process::id()) << 32);
    (xorshift(x) & 0xff_ffff) as u32
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^ (x << 17)
}
