//! Records beside the replicated index: immutable bytes that a store's
//! index entries point to (SWARM-KV's and DM-ABD's descriptors of a key's
//! replicas, SWARM §5.2), kept in the index's arena so that they are
//! replicated on the index's nodes and survive what the index survives.
//!
//! A record sits at the same arena offset on every replica
//! ([`super::arena`]); its writer posts it to every replica of the current
//! view and counts it written once a majority has it. It is never changed
//! afterwards, so a reader needs any one copy: it reads one replica (one
//! roundtrip; the first replica rotates with the offset, so that readers
//! spread over the nodes) and, if that copy is missing (a write still in
//! flight, a replica that missed it: the arena reads as zero until written)
//! or the replica failed, all the others at once. Records carry their own
//! check: `accept` tells a whole record from a missing or torn one.
//!
//! A store publishes a record only after writing it (the index entry that
//! names it is written once the record is on a majority), so every record
//! a reader can reach is on a majority, and on at least one replica of any
//! later view.

use super::arena::{ALIGN, HEADER, Site};
use super::header::Header;
use crate::index::IndexError;
use crate::substrate::late::{Watch, late};
use crate::substrate::quorum::{MAX_REPLICAS, join_all, join_timely, majority};
use crate::{MemError, Memory, Op, RemoteAddr};

/// Where a replicated index keeps its records: every replica's arena, and
/// the replicas the view excludes (copied from the index, so that records
/// are read and written while the index itself is borrowed).
#[derive(Clone, Debug)]
pub struct Records {
    sites: heapless::Vec<Site, MAX_REPLICAS>,
    arena: u64,
    /// Replicas (bit `i`) left out of the view: not written, read last.
    excluded: u8,
}

impl Records {
    pub(super) fn new(header: &Header, excluded: u8) -> Records {
        Records { sites: header.sites(), arena: header.arena_size, excluded }
    }

    /// The address of `len` bytes at arena offset `off` on replica `i`,
    /// if they lie within the arena (past its header).
    fn addr(&self, i: usize, off: u64, len: usize) -> Option<RemoteAddr> {
        let end = off.checked_add(len as u64)?;
        let site = self.sites.get(i)?;
        (off >= HEADER && end <= self.arena).then(|| RemoteAddr::new(site.node, site.base + off))
    }

    /// Replicas in the order a reader of offset `off` tries them: those in
    /// the view, starting from one that rotates with the offset, then the
    /// excluded ones (a last resort: they may lack recent records).
    fn order(&self, off: u64) -> impl Iterator<Item = usize> + '_ {
        let r = self.sites.len();
        let first = ((off / ALIGN) % r as u64) as usize;
        let rotated = move |k: usize| (first + k) % r;
        let inside = move |i: &usize| self.excluded & (1 << i) == 0;
        (0..r).map(rotated).filter(inside).chain((0..r).map(rotated).filter(move |i| !inside(i)))
    }

    /// Writes `bytes` at arena offset `off` (taken with
    /// [`super::SnapshotIndex::alloc_record`]) on every replica of the view,
    /// until a majority of all replicas has it; those late then are left
    /// to land. [`IndexError::Unavailable`] if no majority could be had.
    pub async fn write<M: Memory>(&self, mem: &M, off: u64, bytes: &[u8]) -> Result<(), IndexError> {
        self.write_with(mem, None, off, bytes).await
    }

    /// [`write`](Self::write), with `before` (bytes at another arena
    /// offset: FUSEE's commit of the writer's previous object) written
    /// ahead of it in the same pipeline to each replica: no roundtrip of
    /// its own, and every replica that has the record has `before` too
    /// (a pipeline applies in order).
    pub async fn write_with<M: Memory>(
        &self,
        mem: &M,
        before: Option<(u64, &[u8])>,
        off: u64,
        bytes: &[u8],
    ) -> Result<(), IndexError> {
        let bad = IndexError::BadConfig("a record outside the index's arena");
        let targets: heapless::Vec<usize, MAX_REPLICAS> =
            (0..self.sites.len()).filter(|i| self.excluded & (1 << i) == 0).collect();
        let mut futs = heapless::Vec::<_, MAX_REPLICAS>::new();
        for &i in &targets {
            let at = self.addr(i, off, bytes.len()).ok_or(bad)?;
            let mut ops: heapless::Vec<Op<'_>, 2> = heapless::Vec::new();
            if let Some((o, b)) = before {
                let _ = ops.push(Op::Write { offset: self.addr(i, o, b.len()).ok_or(bad)?.offset, data: b });
            }
            let _ = ops.push(Op::Write { offset: at.offset, data: bytes });
            let _ = futs.push(async move { mem.pipeline(at.node, &ops).await.map(drop) });
        }
        let need = majority(self.sites.len());
        let (replies, _) = join_timely(futs, need, Watch::on(mem), |k| late(self.sites[targets[k]].node)).await;
        if replies.ok >= need {
            return Ok(());
        }
        Err(IndexError::Unavailable(replies.first_error().copied().unwrap_or(late(self.sites[targets[0]].node))))
    }

    /// Reads `len` bytes at arena offset `off` from every replica of the
    /// view at once (one roundtrip; FUSEE's recovery reads a crashed
    /// client's chunk so): each replica's copy, `None` where it failed,
    /// and whether every replica of the view answered.
    pub async fn read_each<M: Memory>(
        &self,
        mem: &M,
        off: u64,
        len: usize,
    ) -> Result<(heapless::Vec<Option<M::Buf>, MAX_REPLICAS>, bool), IndexError> {
        let bad = IndexError::BadConfig("a read outside the index's arena");
        let targets: heapless::Vec<usize, MAX_REPLICAS> =
            (0..self.sites.len()).filter(|i| self.excluded & (1 << i) == 0).collect();
        let mut futs = heapless::Vec::<_, MAX_REPLICAS>::new();
        for &i in &targets {
            let _ = futs.push(mem.read(self.addr(i, off, len).ok_or(bad)?, len));
        }
        let replies = join_all(futs).await;
        let mut out = heapless::Vec::new();
        let mut all = true;
        for r in replies.results {
            let copy = match r {
                Some(Ok(b)) => Some(b),
                _ => None,
            };
            all &= copy.is_some();
            let _ = out.push(copy);
        }
        Ok((out, all))
    }

    /// Reads the record of `len` bytes at arena offset `off`: the first
    /// copy `accept` decodes, from one replica if its copy is whole, else
    /// from the others (read at once), and once more from those that
    /// failed (a time-out may be a late replica, not a dead one).
    /// [`IndexError::Corrupt`] if every replica answered and none holds a
    /// whole copy; [`IndexError::Unavailable`] if those that could not
    /// answer might.
    pub async fn read<M: Memory, T>(
        &self,
        mem: &M,
        off: u64,
        len: usize,
        accept: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<T, IndexError> {
        self.read_buf(mem, off, len, accept).await.map(|(_, t)| t)
    }

    /// [`read`](Self::read), answering the buffer the accepted copy was
    /// read into with what `accept` made of it (FUSEE's objects are
    /// records: their values are answered in place).
    pub async fn read_buf<M: Memory, T>(
        &self,
        mem: &M,
        off: u64,
        len: usize,
        accept: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<(M::Buf, T), IndexError> {
        let corrupt = |node| IndexError::Corrupt { node, what: "an index entry names a record no replica holds" };
        let mut order = self.order(off);
        let first = order.next().unwrap_or(0);
        let at = |i: usize| self.addr(i, off, len).ok_or_else(|| corrupt(self.sites[i].node));
        let mut failed: heapless::Vec<usize, MAX_REPLICAS> = heapless::Vec::new();
        let mut error: Option<MemError> = None;
        match mem.read(at(first)?, len).await {
            Ok(buf) => {
                if let Some(t) = accept(&buf) {
                    return Ok((buf, t));
                }
            }
            Err(e) => {
                let _ = failed.push(first);
                error = Some(e);
            }
        }
        let mut batch: heapless::Vec<usize, MAX_REPLICAS> = order.collect();
        for round in 0..2 {
            let mut futs = heapless::Vec::<_, MAX_REPLICAS>::new();
            for &i in &batch {
                let _ = futs.push(mem.read(at(i)?, len));
            }
            let replies = join_all(futs).await;
            for (k, r) in replies.results.into_iter().enumerate() {
                match r {
                    Some(Ok(buf)) => {
                        if let Some(t) = accept(&buf) {
                            return Ok((buf, t));
                        }
                    }
                    Some(Err(e)) => {
                        let _ = failed.push(batch[k]);
                        error = error.or(Some(e));
                    }
                    None => {}
                }
            }
            if round == 0 {
                batch = core::mem::take(&mut failed);
            }
        }
        match error {
            Some(e) => Err(IndexError::Unavailable(e)),
            None => Err(corrupt(self.sites[first].node)),
        }
    }
}
