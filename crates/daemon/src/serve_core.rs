//! The driver core of `tandem serve`: everything but the connections (volumes and their
//! engines, requests in flight, buffers, disk workers), so request handling can borrow a
//! connection's input while it works on the rest. Submits requests to the engine and
//! carries out its disk actions, inline or on a worker.

use crate::bufpool::{BufPool, DataBuf};
use crate::nbd_glue;
use crate::worker::{os_error, Done, Job, Workers};
use slab::Slab;
use std::sync::Arc;
use tandem_engine::{Action, DiskKind, DiskOp, DiskState, DiskToken, Io, IoError, ReqId, Volume};
use tandem_frontend::nbd::{reply, ExportInfo, Request};
use tandem_storage::Backing;

/// A served volume: the engine deciding what happens and the store it happens on.
pub struct VolumeCtx {
    pub export: ExportInfo,
    pub backing: Arc<Backing>,
    pub engine: Volume,
    /// Buffered stores serve reads and writes inline on the event loop: the page cache
    /// answers in microseconds and a thread hop would cost more than the I/O.
    pub inline_rw: bool,
}

/// An in-flight request.
pub(crate) struct Slot {
    pub(crate) conn: usize,
    pub(crate) cookie: u64,
    pub(crate) structured: bool,
    pub(crate) read: Option<(u64, u32)>,
    /// Owned payload (writes that leave the event loop) or read data.
    pub(crate) data: Option<DataBuf>,
    /// The reply (read data) is already in the connection's output buffer.
    pub(crate) replied: bool,
}

/// The request being submitted: its payload where it lies in the connection's input
/// buffer, and that connection's reply buffer.
pub(crate) struct Current<'a> {
    /// `None` when the payload was streamed into a buffer the request owns.
    pub(crate) payload: Option<&'a [u8]>,
    pub(crate) out: &'a mut Vec<u8>,
}

/// Writes at least this large are received straight into their own buffer and written by a
/// worker thread, so copying a megabyte into the page cache does not stall every other
/// client, and the event loop receives the next request meanwhile.
pub(crate) const LARGE_WRITE: u32 = 256 << 10;

/// Everything but the connections, so request handling can borrow a connection's input
/// while it works on the rest.
pub(crate) struct Core {
    pub(crate) volumes: Vec<VolumeCtx>,
    pub(crate) exports: Vec<ExportInfo>,
    pub(crate) slots: Slab<Slot>,
    pub(crate) pool: BufPool,
    pub(crate) workers: Workers<(usize, DiskOp)>,
    pub(crate) actions: Vec<Action>,
    pub(crate) completions: Vec<(ReqId, Result<(), IoError>)>,
    /// Requests submitted since the last wait (see `busy_poll::BURST`).
    pub(crate) submitted: usize,
}

impl Core {
    pub(crate) fn submit(
        &mut self,
        conn: usize,
        volume: usize,
        structured: bool,
        req: Request,
        current: Current,
        owned: Option<DataBuf>,
    ) {
        self.submitted += 1;
        let io = nbd_glue::io_of(&req);
        let read = matches!(io, Io::Read { .. }).then_some((req.offset, req.len));
        let id = self.slots.insert(Slot {
            conn,
            cookie: req.cookie,
            structured,
            read,
            data: owned,
            replied: false,
        });
        if let (Some(payload), false) = (current.payload, self.volumes[volume].inline_rw) {
            if matches!(io, Io::Write { .. }) {
                let mut buf = self.pool.get(payload.len());
                buf.copy_from_slice(payload);
                self.slots[id].data = Some(buf);
            }
        }
        debug_assert!(self.actions.is_empty());
        self.volumes[volume]
            .engine
            .submit(ReqId(id as u64), io, &mut self.actions);
        self.run_actions(volume, Some((id, current)));
    }

    /// Answers a block status request into its connection's reply buffer `out`, from the
    /// file's allocation map, on the spot. That orders it as a read is: every write
    /// answered before it arrived has been carried out (a write is answered after its
    /// pwrite or fallocate returns), so lseek sees it; writes still in flight need no
    /// order. A volume whose disk failed answers it as it answers reads.
    pub(crate) fn block_status(&mut self, volume: usize, req: &Request, out: &mut Vec<u8>) {
        self.submitted += 1;
        let v = &self.volumes[volume];
        if v.engine.disk_state() == DiskState::Failed {
            let (errno, msg) = nbd_glue::describe(IoError::NoData, nbd_glue::Served::Local);
            return reply::structured_error(out, req.cookie, errno.code(), &msg);
        }
        nbd_glue::block_status(out, req, v.export.block.minimum, Some(&v.backing));
    }

    pub(crate) fn worker_done(&mut self, done: Done<(usize, DiskOp)>) {
        let (volume, op) = done.tag;
        if let (DiskToken::Req(req), Some(buf)) = (op.token, done.buf) {
            match op.kind {
                DiskKind::Read { .. } => self.slots[req.0 as usize].data = Some(buf),
                _ => self.pool.put(buf),
            }
        }
        debug_assert!(self.actions.is_empty());
        self.volumes[volume]
            .engine
            .disk_done(op, done.result, &mut self.actions);
        self.run_actions(volume, None);
    }

    /// Executes the engine's actions, feeding inline completions straight back.
    pub(crate) fn run_actions(&mut self, volume: usize, mut current: Option<(usize, Current)>) {
        let mut i = 0;
        while i < self.actions.len() {
            let action = self.actions[i];
            i += 1;
            match action {
                Action::Complete { req, result } => self.completions.push((req, result)),
                Action::Disk(op) => {
                    if let Some(result) = self.try_inline(volume, op, current.as_mut()) {
                        self.volumes[volume]
                            .engine
                            .disk_done(op, result, &mut self.actions);
                    } else {
                        self.hand_to_worker(volume, op);
                    }
                }
            }
        }
        self.actions.clear();
    }

    /// Runs a cheap disk operation on the event loop; `None` means it must go to a worker.
    pub(crate) fn try_inline(
        &mut self,
        volume: usize,
        op: DiskOp,
        current: Option<&mut (usize, Current)>,
    ) -> Option<Result<(), IoError>> {
        if !self.volumes[volume].inline_rw {
            return None;
        }
        let DiskToken::Req(req) = op.token else {
            return None;
        };
        let id = req.0 as usize;
        match (op.kind, current) {
            (DiskKind::Read { offset, len }, Some((cur, c))) if *cur == id => {
                self.read_into_reply(volume, id, c.out, offset, len)
            }
            (DiskKind::Read { offset, len }, _) => {
                let mut buf = self.pool.get(len as usize);
                let backing = &self.volumes[volume].backing;
                match backing.read_cached(&mut buf, offset) {
                    Ok(true) => {
                        self.slots[id].data = Some(buf);
                        Some(Ok(()))
                    }
                    Ok(false) => {
                        self.pool.put(buf);
                        None
                    }
                    Err(e) => {
                        self.pool.put(buf);
                        Some(Err(os_error(e)))
                    }
                }
            }
            (DiskKind::Write { offset, len }, current) => {
                let payload: &[u8] = match (&self.slots[id].data, current) {
                    (Some(_), _) if len >= LARGE_WRITE => return None,
                    (Some(owned), _) => owned,
                    (
                        None,
                        Some((
                            cur,
                            Current {
                                payload: Some(p), ..
                            },
                        )),
                    ) if *cur == id => p,
                    _ => unreachable!("a write's payload is neither at hand nor owned"),
                };
                let backing = &self.volumes[volume].backing;
                Some(backing.write_at(payload, offset).map_err(os_error))
            }
            _ => None,
        }
    }

    /// A read of the request being submitted (slot `id`), straight into its connection's
    /// reply buffer `out` behind a reply header, so the data is copied once, page cache to
    /// socket buffer. `None`: the page cache does not hold it all, a worker must wait for
    /// the disk.
    fn read_into_reply(
        &mut self,
        volume: usize,
        id: usize,
        out: &mut Vec<u8>,
        offset: u64,
        len: u32,
    ) -> Option<Result<(), IoError>> {
        let slot = &mut self.slots[id];
        let start = out.len();
        if slot.structured {
            reply::read_data_chunk(out, slot.cookie, offset, len);
        } else {
            reply::simple(out, slot.cookie, 0);
        }
        let data_at = out.len();
        out.resize(data_at + len as usize, 0);
        match self.volumes[volume]
            .backing
            .read_cached(&mut out[data_at..], offset)
        {
            Ok(true) => {
                slot.replied = true;
                Some(Ok(()))
            }
            Ok(false) => {
                out.truncate(start);
                None
            }
            Err(e) => {
                out.truncate(start);
                Some(Err(os_error(e)))
            }
        }
    }

    pub(crate) fn hand_to_worker(&mut self, volume: usize, op: DiskOp) {
        let buf = match (op.token, op.kind) {
            (DiskToken::Req(_), DiskKind::Read { len, .. }) => Some(self.pool.get(len as usize)),
            (DiskToken::Req(req), DiskKind::Write { .. }) => Some(
                self.slots[req.0 as usize]
                    .data
                    .take()
                    .expect("an asynchronous write owns its payload"),
            ),
            _ => None,
        };
        let backing = Arc::clone(&self.volumes[volume].backing);
        self.workers.submit(Job {
            tag: (volume, op),
            backing,
            kind: op.kind,
            buf,
            also: Vec::new(),
        });
    }
}
