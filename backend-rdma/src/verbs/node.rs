//! The memory node's side of the verbs: one registered region, and a queue
//! pair per client, made by the daemon's bootstrap server.

use memmap2::{MmapMut, MmapOptions};

use super::{Access, Cq, Device, DeviceChoice, Mr, Pd, Qp, fresh_psn};
use crate::bootstrap::{Hello, Welcome};
use crate::daemon::Acceptor;

/// A memory node: its device and its registered region.
pub struct VerbsNode {
    // Dropped in this order: the registration before its memory, both
    // before the protection domain, that before the device.
    mr: Mr,
    region: MmapMut,
    pd: Pd,
    dev: Device,
    huge: bool,
}

/// A client's queue pair on the node, kept while the client is connected.
pub struct NodeConn {
    _qp: Qp,
    _cq: Cq,
}

impl VerbsNode {
    /// Opens the device, allocates `size` zeroed bytes (on hugepages when
    /// the system has them to give, else on ordinary pages) and registers
    /// them for remote READ, WRITE and atomics.
    pub fn new(choice: &DeviceChoice, size: u64) -> Result<VerbsNode, String> {
        let dev = Device::open(choice)?;
        let len = usize::try_from(size).map_err(|_| format!("{size} bytes do not fit this machine's address space"))?;
        let (mut region, huge) = match MmapOptions::new().len(len).huge(None).populate().map_anon() {
            Ok(m) => (m, true),
            Err(_) => {
                let m = MmapOptions::new()
                    .len(len)
                    .populate()
                    .map_anon()
                    .map_err(|e| format!("cannot allocate {size} bytes: {e}"))?;
                (m, false)
            }
        };
        let pd = dev.alloc_pd()?;
        // SAFETY: the mapping is a field of the node, declared after the
        // registration, so it outlives it; it is never remapped.
        let mr = unsafe { pd.register(region.as_mut_ptr(), len, Access::Remote)? };
        Ok(VerbsNode { mr, region, pd, dev, huge })
    }

    /// The device, region and key, in words for the daemon's log.
    pub fn describe(&self) -> String {
        format!(
            "device {}, region of {} bytes at {:#x} ({}), rkey {:#x}",
            self.dev.name(),
            self.region.len(),
            self.region.as_ptr() as u64,
            if self.huge { "hugepages" } else { "ordinary pages: no hugepages were free" },
            self.mr.rkey()
        )
    }
}

impl Acceptor for VerbsNode {
    type Conn = NodeConn;

    fn accept(&self, hello: &Hello) -> Result<(Welcome, NodeConn), String> {
        // The node posts nothing: its queue pair only answers the client's
        // one-sided requests, so a one-entry queue is enough.
        let cq = self.dev.create_cq(1)?;
        let qp = self.pd.create_qp(&self.dev, &cq, 1, Access::Remote)?;
        let psn = fresh_psn();
        qp.connect(&self.dev, &hello.endpoint, psn)?;
        let welcome = Welcome {
            endpoint: qp.endpoint(&self.dev, psn),
            addr: self.region.as_ptr() as u64,
            rkey: self.mr.rkey(),
            size: self.region.len() as u64,
        };
        Ok((welcome, NodeConn { _qp: qp, _cq: cq }))
    }
}
