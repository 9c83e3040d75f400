//! The client's side of the verbs: a queue pair per memory node on one
//! completion queue, and one registered buffer arena.

use core::cell::RefCell;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use ibverbs_sys as ffi;
use memmap2::MmapMut;
use swarm_core::NodeId;

use super::{Access, Cq, Device, DeviceChoice, Mr, Pd, Qp, fresh_psn};
use crate::RdmaMemory;
use crate::bootstrap::Hello;
use crate::config::ClusterConfig;
use crate::daemon::greet;
use crate::nic::{Nic, PostError, Wc, Wr, WrKind};

/// How long connecting to a memory node and its bootstrap may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One memory node as a client sees it.
struct Remote {
    // The queue pair goes before the connection closes, so the daemon
    // tears down its side after this one.
    qp: Qp,
    _bootstrap: TcpStream,
    addr: u64,
    rkey: u32,
    size: u64,
}

/// A client's NIC: the [`Nic`] of real hardware.
pub struct VerbsNic {
    // Dropped in this order: queue pairs, their completion queue, the
    // arena's registration, the arena, the protection domain, the device.
    remotes: Vec<Remote>,
    cq: Cq,
    mr: Mr,
    arena: MmapMut,
    /// The arena's first byte, taken once from the mapping's mutable
    /// pointer: every CPU access to the arena goes through it.
    base: *mut u8,
    _pd: Pd,
    _dev: Device,
    depth: usize,
    scratch: RefCell<Scratch>,
}

#[derive(Default)]
struct Scratch {
    sges: Vec<ffi::ibv_sge>,
    wrs: Vec<ffi::ibv_send_wr>,
    wcs: Vec<ffi::ibv_wc>,
}

// SAFETY: the NIC is owned by one client handle and used by one thread at a
// time (the handle is not `Sync`); the verbs objects it holds may be used
// from any thread, and the arena is plain memory it owns.
unsafe impl Send for VerbsNic {}

/// Connects a client handle to every memory node of `config`: opens the
/// device, registers the buffer arena, and makes one queue pair per node
/// through its daemon's bootstrap. `label` names the client in the
/// daemons' logs.
pub fn connect(config: &ClusterConfig, label: &str) -> Result<RdmaMemory<VerbsNic>, String> {
    let c = &config.client;
    let dev = Device::open(&DeviceChoice { name: c.device.clone(), port: c.port, gid_index: c.gid_index })?;
    let depth = c.queue_depth.min(dev.max_queue_depth());
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(depth * config.nodes.len())?;
    let mut arena =
        MmapMut::map_anon(c.buffer as usize).map_err(|e| format!("cannot allocate the buffer arena: {e}"))?;
    // SAFETY: the arena is a field of the NIC declared after the
    // registration, so it outlives it; it is never remapped.
    let base = arena.as_mut_ptr();
    let mr = unsafe { pd.register(base, arena.len(), Access::Local)? };
    let mut remotes = Vec::with_capacity(config.nodes.len());
    for (i, spec) in config.nodes.iter().enumerate() {
        let at = |e: String| format!("memory node {i} ({}): {e}", spec.address);
        let addr = spec
            .address
            .to_socket_addrs()
            .map_err(|e| at(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| at("resolves to no address".into()))?;
        let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .map_err(|e| at(format!("cannot connect: {e} (is `swarm memnode --backend rdma` running there?)")))?;
        let _ = stream.set_nodelay(true);
        let qp = pd.create_qp(&dev, &cq, depth, Access::Local).map_err(at)?;
        let psn = fresh_psn();
        let hello = Hello { endpoint: qp.endpoint(&dev, psn), label: label.to_owned() };
        let welcome = greet(&stream, hello, CONNECT_TIMEOUT).map_err(at)?;
        if welcome.addr % 8 != 0 {
            return Err(at(format!("its region starts at {:#x}, not 8-byte aligned (no CAS could run)", welcome.addr)));
        }
        if welcome.size != spec.size {
            return Err(at(format!("it serves {} bytes, but the cluster file says {}", welcome.size, spec.size)));
        }
        qp.connect(&dev, &welcome.endpoint, psn).map_err(at)?;
        remotes.push(Remote { qp, _bootstrap: stream, addr: welcome.addr, rkey: welcome.rkey, size: welcome.size });
    }
    let nic = VerbsNic { remotes, cq, mr, arena, base, _pd: pd, _dev: dev, depth, scratch: RefCell::default() };
    Ok(RdmaMemory::new(nic).with_timeout(c.timeout))
}

impl Nic for VerbsNic {
    fn node_count(&self) -> usize {
        self.remotes.len()
    }

    fn node_size(&self, node: NodeId) -> u64 {
        self.remotes.get(usize::from(node.0)).map_or(0, |r| r.size)
    }

    fn arena_size(&self) -> u32 {
        self.arena.len() as u32
    }

    fn queue_depth(&self) -> usize {
        self.depth
    }

    fn post(&self, node: NodeId, chain: &[Wr]) -> Result<(), PostError> {
        const EINVAL: PostError = PostError { errno: 22, posted: 0 };
        let Some(remote) = self.remotes.get(usize::from(node.0)) else { return Err(EINVAL) };
        if chain.is_empty() {
            return Err(EINVAL);
        }
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { sges, wrs, .. } = &mut *scratch;
        sges.clear();
        wrs.clear();
        let base = self.base as u64;
        for wr in chain {
            if u64::from(wr.local) + u64::from(wr.len) > self.arena.len() as u64 {
                return Err(EINVAL);
            }
            sges.push(ffi::ibv_sge { addr: base + u64::from(wr.local), length: wr.len, lkey: self.mr.lkey() });
        }
        let sge_base = sges.as_mut_ptr();
        for (k, wr) in chain.iter().enumerate() {
            // The client checks ranges against the node's size; a caller
            // that did not gets a refusal, not an overflow.
            let end = wr.remote.checked_add(u64::from(wr.len)).filter(|&e| e <= remote.size);
            let Some(remote_addr) = end.and_then(|_| remote.addr.checked_add(wr.remote)) else { return Err(EINVAL) };
            let (opcode, union) = match wr.kind {
                WrKind::Read => (
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                    ffi::ibv_send_wr__bindgen_ty_2 {
                        rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: remote.rkey },
                    },
                ),
                WrKind::Write => (
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                    ffi::ibv_send_wr__bindgen_ty_2 {
                        rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: remote.rkey },
                    },
                ),
                WrKind::Cas { expected, new } => (
                    ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                    ffi::ibv_send_wr__bindgen_ty_2 {
                        atomic: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                            remote_addr,
                            compare_add: expected,
                            swap: new,
                            rkey: remote.rkey,
                        },
                    },
                ),
            };
            let mut flags = 0;
            if wr.signaled {
                flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if wr.fence {
                flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
            }
            wrs.push(ffi::ibv_send_wr {
                wr_id: wr.id,
                next: std::ptr::null_mut(),
                // SAFETY: `k < sges.len()`; the pointer comes from one
                // `as_mut_ptr` of the complete vector (no re-borrow of it
                // follows, so it stays valid until the post).
                sg_list: unsafe { sge_base.add(k) },
                num_sge: 1,
                opcode,
                send_flags: flags,
                wr: union,
                ..Default::default()
            });
        }
        // Link the list only now, through one pointer to the complete
        // vector: it no longer moves.
        let first = wrs.as_mut_ptr();
        for k in 1..wrs.len() {
            // SAFETY: `k < wrs.len()`: both entries exist.
            unsafe { (*first.add(k - 1)).next = first.add(k) };
        }
        // SAFETY: the list is linked above within `wrs`, each entry's one
        // scatter/gather entry lies in `sges` and names the registered arena
        // inside its bounds (checked above); the client does not touch those
        // chunks until their completion (`Nic::put`'s contract). The list
        // itself may be reused once ibv_post_send returns.
        unsafe { remote.qp.post_send(first) }.map_err(|(errno, posted)| PostError { errno, posted })
    }

    fn fail(&self, node: NodeId) {
        if let Some(remote) = self.remotes.get(usize::from(node.0)) {
            // Failing to fail leaves the queue pair as it was: the handle
            // refuses the node's operations all the same.
            let _ = remote.qp.to_error();
        }
    }

    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut scratch = self.scratch.borrow_mut();
        let wcs = &mut scratch.wcs;
        if wcs.len() < out.len() {
            // SAFETY: ibv_wc is plain integers; all-zero is a valid value.
            wcs.resize(out.len(), unsafe { std::mem::zeroed() });
        }
        // A failing poll leaves completions undelivered: the waiting
        // operations then time out, as they would on a dead device.
        let n = self.cq.poll(&mut wcs[..out.len()]).unwrap_or(0);
        for (o, wc) in out.iter_mut().zip(&wcs[..n]) {
            let (status, vendor) = wc.error().unwrap_or((0, 0));
            *o = Wc { id: wc.wr_id(), status, vendor };
        }
        n
    }

    unsafe fn put(&self, at: u32, data: &[u8]) {
        debug_assert!(at as usize + data.len() <= self.arena.len(), "arena range out of bounds");
        // SAFETY: in bounds (the caller's contract, checked in debug builds); no request in flight uses the range
        // (the caller's contract), so nothing else writes it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(at as usize), data.len()) };
    }

    unsafe fn get(&self, at: u32, out: &mut [u8]) {
        debug_assert!(at as usize + out.len() <= self.arena.len(), "arena range out of bounds");
        // SAFETY: in bounds (the caller's contract, checked in debug builds); the NIC finished writing the range
        // (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at as usize), out.as_mut_ptr(), out.len()) };
    }
}
