//! Byte-granular NBD requests on a replicated volume (`crate::rmw`): each volume's gate,
//! and unaligned requests served as jobs whose parts are ordinary aligned engine requests
//! (so they are replicated, ordered and logged like any other).
//!
//! A part's completion arrives among the engine's actions, which never nest: what it sets
//! off (a job's writes, a write its gate lets go) is queued in `deferred` and issued once
//! those actions have run (`issue_deferred`, from the event loop).

use super::state::*;
use crate::rmw::{self, Ticket, Unaligned};
use tandem_engine::{Io, IoError, ReqId};
use tandem_frontend::nbd::Request;

impl NodeReactor {
    /// Passes write `io` of slot `id` on resource `r` (`len` bytes at `offset`, its payload
    /// `payload`) through its volume's gate: false if it waits, its payload copied.
    pub(super) fn enter_gate(
        &mut self,
        r: usize,
        id: usize,
        io: Io,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> bool {
        let v = self.slots[id].vol;
        let end = offset + u64::from(len);
        let (ticket, go) = self.res[r].gates[v as usize].enter(offset, end, false);
        self.slots[id].ticket = Some(ticket);
        if !go {
            let payload = matches!(io, Io::Write { .. }).then(|| payload.to_vec());
            self.held
                .insert((r, v, ticket), Held::Plain { id, io, payload });
        }
        go
    }

    /// A write that went through volume `v`'s gate ended: those it held back are issued
    /// after the actions being run.
    pub(super) fn leave_gate(&mut self, r: usize, v: u16, ticket: Ticket) {
        let mut released = Vec::new();
        self.res[r].gates[v as usize].leave(ticket, &mut released);
        for t in released {
            let d = match self.held.remove(&(r, v, t)) {
                Some(Held::Plain { id, io, payload }) => Deferred::Plain {
                    r,
                    v,
                    id,
                    io,
                    payload,
                },
                Some(Held::Job(key)) => Deferred::JobReads(key),
                None => unreachable!("a released write that was not held"),
            };
            self.deferred.push_back(d);
        }
    }

    /// An NBD request on resource `r` not aligned to its volume's blocks (from a client
    /// that did not agree to block sizes), `slot` describing it.
    pub(super) fn submit_unaligned(&mut self, r: usize, req: Request, payload: &[u8], slot: Slot) {
        let v = slot.vol;
        let export = &self.res[r].exports[v as usize];
        let (grain, max) = (export.block.minimum, export.block.maximum);
        let route = rmw::unaligned(&req, payload, grain, max);
        let io = match route {
            Unaligned::Engine(io) => io,
            Unaligned::Gated(io) => {
                let Io::Trim { offset, len, .. } = io else {
                    unreachable!("only a trim's whole blocks are gated as is: {io:?}")
                };
                let id = self.slots.insert(slot);
                if self.enter_gate(r, id, io, offset, len, &[]) {
                    self.submit_part_or_request(r, v, id, io, None);
                }
                return;
            }
            Unaligned::Nothing => return self.answer(r, slot, Ok(()), None),
            Unaligned::Fail(e) => return self.answer(r, slot, Err(e), None),
            Unaligned::Job(job) => {
                let (start, stop) = job.blocks();
                let gated = job.writes_data();
                let id = self.slots.insert(slot);
                let key = self.jobs.insert(NodeJob {
                    job,
                    r,
                    v,
                    slot: id,
                    ticket: None,
                });
                if gated {
                    let (ticket, go) = self.res[r].gates[v as usize].enter(start, stop, true);
                    self.jobs[key].ticket = Some(ticket);
                    if !go {
                        self.held.insert((r, v, ticket), Held::Job(key));
                        return;
                    }
                }
                return self.job_reads(key);
            }
        };
        let id = self.slots.insert(slot);
        self.submit_part_or_request(r, v, id, io, None);
    }

    /// Hands request `io` of slot `id` (with its bytes if a write) to resource `r`'s engine.
    fn submit_part_or_request(&mut self, r: usize, v: u16, id: usize, io: Io, data: Option<&[u8]>) {
        let id = ReqId(id as u64);
        let mut actions = Vec::new();
        self.res[r].engine.submit(id, v, io, &mut actions);
        let ctx = Ctx {
            incoming: None,
            payload: data.map(|d| (id, d)),
        };
        self.run_actions(r, actions, ctx);
    }

    /// Submits aligned part `io` of job `key`.
    fn submit_part(&mut self, key: usize, io: Io, data: Option<&[u8]>) {
        let NodeJob { r, v, slot, .. } = self.jobs[key];
        let client = &self.slots[slot];
        let part = Slot {
            entry: client.entry,
            cookie: client.cookie,
            structured: false,
            answer: Answer::Done,
            arrived: client.arrived,
            op: None,
            vol: v,
            ticket: None,
            part: Some((key, io)),
        };
        let id = self.slots.insert(part);
        self.submit_part_or_request(r, v, id, io, data);
    }

    fn job_reads(&mut self, key: usize) {
        let reads = self.jobs[key].job.reads();
        debug_assert!(!reads.is_empty(), "an unaligned request reads something");
        for io in reads {
            self.submit_part(key, io, None);
        }
    }

    fn job_writes(&mut self, key: usize) {
        for part in self.jobs[key].job.writes() {
            self.submit_part(key, part.io, part.data.as_deref());
        }
    }

    /// A part of job `key` completed, a read with `bytes`. Runs among the engine's actions.
    pub(super) fn part_done(
        &mut self,
        key: usize,
        io: Io,
        result: Result<(), IoError>,
        bytes: Option<&[u8]>,
    ) {
        let job = &mut self.jobs[key].job;
        let read = matches!(io, Io::Read { .. });
        let all = if read {
            let bytes = result.and_then(|()| bytes.ok_or(IoError::Os(libc::EIO)));
            job.read_done(io, bytes)
        } else {
            job.write_done(result)
        };
        if !all {
            return;
        }
        if read && job.error().is_none() && job.writes_data() {
            return self.deferred.push_back(Deferred::JobWrites(key));
        }
        let NodeJob {
            job,
            r,
            v,
            slot,
            ticket,
        } = self.jobs.remove(key);
        let slot = self.slots.remove(slot);
        match job.error() {
            Some(e) => self.answer(r, slot, Err(e), None),
            None if job.writes_data() => self.answer(r, slot, Ok(()), None),
            None => self.answer(r, slot, Ok(()), Some(job.answer())),
        }
        if let Some(t) = ticket {
            self.leave_gate(r, v, t);
        }
    }

    /// Issues what engine actions set off (see the module's text), until nothing is left.
    pub(super) fn issue_deferred(&mut self) {
        while let Some(d) = self.deferred.pop_front() {
            match d {
                Deferred::Plain {
                    r,
                    v,
                    id,
                    io,
                    payload,
                } => self.submit_part_or_request(r, v, id, io, payload.as_deref()),
                Deferred::JobReads(key) => self.job_reads(key),
                Deferred::JobWrites(key) => self.job_writes(key),
            }
        }
    }
}
