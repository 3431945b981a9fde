//! The driver core of `tandem serve`: everything but the connections (volumes and their
//! engines, requests in flight, buffers, disk workers), so request handling can borrow a
//! connection's input while it works on the rest. Submits requests to the engine and
//! carries out its disk actions, inline or on a worker.

use crate::bufpool::{BufPool, DataBuf};
use crate::nbd_glue;
use crate::rmw::{self, Gate, Ticket, Unaligned};
use crate::worker::{os_error, Done, Job, Workers};
use rustc_hash::FxHashMap as HashMap;
use slab::Slab;
use std::sync::Arc;
use tandem_engine::{Action, DiskKind, DiskOp, DiskState, DiskToken, Io, IoError, ReqId, Volume};
use tandem_frontend::nbd::{reply, Command, ExportInfo, Request};
use tandem_storage::Backing;

/// A served volume: the engine deciding what happens and the store it happens on.
pub struct VolumeCtx {
    pub export: ExportInfo,
    pub backing: Arc<Backing>,
    pub engine: Volume,
    /// Buffered stores serve reads and writes inline on the event loop: the page cache
    /// answers in microseconds and a thread hop would cost more than the I/O.
    pub inline_rw: bool,
    /// Orders its writes around read-modify-writes (`rmw`).
    pub(crate) gate: Gate,
}

/// An in-flight request, or a part of one (`part`).
pub(crate) struct Slot {
    pub(crate) conn: usize,
    pub(crate) cookie: u64,
    pub(crate) structured: bool,
    pub(crate) read: Option<(u64, u32)>,
    /// Owned payload (writes that leave the event loop) or read data.
    pub(crate) data: Option<DataBuf>,
    /// The reply (read data) is already in the connection's output buffer.
    pub(crate) replied: bool,
    pub(crate) volume: usize,
    /// A write's place in its volume's gate, left when it completes.
    pub(crate) ticket: Option<Ticket>,
    /// An aligned part (this engine request) of an unaligned request's job: its
    /// completion goes to the job (`Core::part_done`), not to a client.
    pub(crate) part: Option<(usize, Io)>,
}

impl Slot {
    fn new(conn: usize, cookie: u64, structured: bool, volume: usize) -> Slot {
        Slot {
            conn,
            cookie,
            structured,
            read: None,
            data: None,
            replied: false,
            volume,
            ticket: None,
            part: None,
        }
    }
}

/// An unaligned request served in aligned parts (`rmw::Job`), answered as slot `slot`.
pub(crate) struct JobCtx {
    job: rmw::Job,
    slot: usize,
    volume: usize,
    ticket: Option<Ticket>,
}

/// A write the gate holds back, by (volume, ticket).
pub(crate) enum Waiting {
    /// The request in slot `.0`, its payload owned, to submit as `.1`.
    Plain(usize, Io),
    /// A job, to start with its reads.
    Job(usize),
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
    pub(crate) jobs: Slab<JobCtx>,
    pub(crate) waiting: HashMap<(usize, Ticket), Waiting>,
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
        if !rmw::is_aligned(&req, self.volumes[volume].export.block.minimum) {
            return self.submit_unaligned(conn, volume, structured, req, current, owned);
        }
        let io = nbd_glue::io_of(&req);
        let id = self.slots.insert(Slot {
            read: matches!(io, Io::Read { .. }).then_some((req.offset, req.len)),
            data: owned,
            ..Slot::new(conn, req.cookie, structured, volume)
        });
        if let (Some(payload), false) = (current.payload, self.volumes[volume].inline_rw) {
            if matches!(io, Io::Write { .. }) {
                let mut buf = self.pool.get(payload.len());
                buf.copy_from_slice(payload);
                self.slots[id].data = Some(buf);
            }
        }
        if io.is_write() && !self.enter_gate(volume, id, io, req.offset, req.len, current.payload) {
            return;
        }
        debug_assert!(self.actions.is_empty());
        self.volumes[volume]
            .engine
            .submit(ReqId(id as u64), io, &mut self.actions);
        self.run_actions(volume, Some((id, current)));
    }

    /// Passes write `io` of slot `id` (`len` bytes at `offset`; its payload in the input
    /// buffer or owned) through its volume's gate: false if it waits, its payload copied.
    fn enter_gate(
        &mut self,
        volume: usize,
        id: usize,
        io: Io,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> bool {
        let end = offset + u64::from(len);
        let (ticket, go) = self.volumes[volume].gate.enter(offset, end, false);
        self.slots[id].ticket = Some(ticket);
        if go {
            return true;
        }
        if let (Io::Write { .. }, None, Some(p)) = (io, &self.slots[id].data, payload) {
            let mut buf = self.pool.get(p.len());
            buf.copy_from_slice(p);
            self.slots[id].data = Some(buf);
        }
        self.waiting
            .insert((volume, ticket), Waiting::Plain(id, io));
        false
    }

    /// A request of a client that did not agree to block sizes, not aligned to them.
    fn submit_unaligned(
        &mut self,
        conn: usize,
        volume: usize,
        structured: bool,
        req: Request,
        current: Current,
        owned: Option<DataBuf>,
    ) {
        let v = &self.volumes[volume];
        let (grain, max) = (v.export.block.minimum, v.export.block.maximum);
        let payload = owned.as_deref().or(current.payload).unwrap_or_default();
        let route = rmw::unaligned(&req, payload, grain, max);
        if let Some(b) = owned {
            self.pool.put(b);
        }
        let read = (req.command == Command::Read).then_some((req.offset, req.len));
        let id = self.slots.insert(Slot {
            read,
            ..Slot::new(conn, req.cookie, structured, volume)
        });
        let io = match route {
            Unaligned::Engine(io) => io,
            Unaligned::Gated(io) => {
                let (offset, len) = match io {
                    Io::Trim { offset, len, .. } => (offset, len),
                    _ => unreachable!("only a trim's whole blocks are gated as is: {io:?}"),
                };
                if !self.enter_gate(volume, id, io, offset, len, None) {
                    return;
                }
                io
            }
            Unaligned::Nothing => return self.completions.push((ReqId(id as u64), Ok(()))),
            Unaligned::Fail(e) => return self.completions.push((ReqId(id as u64), Err(e))),
            Unaligned::Job(job) => {
                let (start, stop) = job.blocks();
                let gated = job.writes_data();
                let key = self.jobs.insert(JobCtx {
                    job,
                    slot: id,
                    volume,
                    ticket: None,
                });
                if gated {
                    let (ticket, go) = self.volumes[volume].gate.enter(start, stop, true);
                    self.jobs[key].ticket = Some(ticket);
                    if !go {
                        self.waiting.insert((volume, ticket), Waiting::Job(key));
                        return;
                    }
                }
                return self.job_reads(key);
            }
        };
        debug_assert!(self.actions.is_empty());
        self.volumes[volume]
            .engine
            .submit(ReqId(id as u64), io, &mut self.actions);
        self.run_actions(volume, None);
    }

    /// Submits an aligned part `io` of job `key`, with its bytes if it is a write.
    fn submit_part(&mut self, key: usize, io: Io, data: Option<&[u8]>) {
        let (volume, slot) = (self.jobs[key].volume, self.jobs[key].slot);
        let conn = self.slots[slot].conn;
        let data = data.map(|d| {
            let mut buf = self.pool.get(d.len());
            buf.copy_from_slice(d);
            buf
        });
        let id = self.slots.insert(Slot {
            data,
            part: Some((key, io)),
            ..Slot::new(conn, 0, false, volume)
        });
        debug_assert!(self.actions.is_empty());
        self.volumes[volume]
            .engine
            .submit(ReqId(id as u64), io, &mut self.actions);
        self.run_actions(volume, None);
    }

    fn job_reads(&mut self, key: usize) {
        let reads = self.jobs[key].job.reads();
        debug_assert!(!reads.is_empty(), "an unaligned request reads something");
        for io in reads {
            self.submit_part(key, io, None);
        }
    }

    /// A part of job `key` completed (the slot it was in is gone; `data` is what a read
    /// read). Once all its reads have, its writes go; once those have, it is answered.
    pub(crate) fn part_done(
        &mut self,
        key: usize,
        io: Io,
        result: Result<(), IoError>,
        data: Option<DataBuf>,
    ) {
        let job = &mut self.jobs[key].job;
        let all = match io {
            Io::Read { .. } => {
                let bytes = result.map(|()| data.as_deref().expect("a read's data"));
                job.read_done(io, bytes)
            }
            _ => job.write_done(result),
        };
        if let Some(d) = data {
            self.pool.put(d);
        }
        if !all {
            return;
        }
        if !matches!(io, Io::Read { .. }) || job.error().is_some() || !job.writes_data() {
            return self.finish_job(key);
        }
        for part in job.writes() {
            self.submit_part(key, part.io, part.data.as_deref());
        }
    }

    /// Job `key` has ended: its client is answered, and the writes it held back go.
    fn finish_job(&mut self, key: usize) {
        let JobCtx {
            job,
            slot,
            volume,
            ticket,
        } = self.jobs.remove(key);
        let result = job.error().map_or(Ok(()), Err);
        if result.is_ok() && !job.writes_data() {
            let answer = job.answer();
            let mut buf = self.pool.get(answer.len());
            buf.copy_from_slice(answer);
            self.slots[slot].data = Some(buf);
        }
        self.completions.push((ReqId(slot as u64), result));
        if let Some(t) = ticket {
            self.leave_gate(volume, t);
        }
    }

    /// A write that went through `volume`'s gate ended: those it held back go now.
    pub(crate) fn leave_gate(&mut self, volume: usize, ticket: Ticket) {
        let mut released = Vec::new();
        self.volumes[volume].gate.leave(ticket, &mut released);
        for t in released {
            match self.waiting.remove(&(volume, t)) {
                Some(Waiting::Plain(id, io)) => {
                    debug_assert!(self.actions.is_empty());
                    self.volumes[volume]
                        .engine
                        .submit(ReqId(id as u64), io, &mut self.actions);
                    self.run_actions(volume, None);
                }
                Some(Waiting::Job(key)) => self.job_reads(key),
                None => unreachable!("a released write that was not waiting"),
            }
        }
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
