//! NBD clients: accepting them, decoding their requests into engine submissions, the
//! replies, attaching and detaching (auto-promote and auto-demote are the engine's), and
//! `tandem secondary [--force]` (fencing the clients of a volume taken from them).

use super::state::*;
use crate::conn::{Conn, Phase, ReadOutcome};
use crate::metrics::Op;
use crate::nbd_glue::{self, Served};
use anyhow::Result;
use mio::{Interest, Token as MioToken};
use std::io;
use std::ops::ControlFlow;
use std::time::Instant;
use tandem_engine::replica::{AllocationMap, AutoPromote, DataRef, RAction, Role};
use tandem_engine::{IoError, ReqId};
use tandem_frontend::nbd::{
    reply, Command, Decoded, Errno, HandshakeStep, Request, RequestDecoder, TransmissionParams,
};
use tracing::{debug, error, info, warn};

impl NodeReactor {
    pub(super) fn accept_nbd(&mut self, k: usize) {
        let (r, v) = self.nbd_listener_of[&k];
        loop {
            let Some(Entry::NbdListener { l }) = self.entries.get(k) else {
                return;
            };
            let (mut stream, peer) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("NBD accept failed: {e}"),
            };
            self.next_conn_id += 1;
            let name = format!("{peer}#{}", self.next_conn_id);
            let key = self.entries.vacant_key();
            if let Err(e) =
                self.poll
                    .registry()
                    .register(stream.source(), MioToken(key), Interest::READABLE)
            {
                warn!(client = %name, "cannot register: {e}");
                continue;
            }
            let tls = self.res[r].nbd_tls.as_ref();
            let conn = Conn::new(stream, name, Instant::now() + HANDSHAKE_TIMEOUT, tls);
            self.entries.insert(Entry::Nbd {
                res: r,
                vol: v,
                conn: Box::new(conn),
            });
            self.dirty.push(key);
            self.service_nbd(key);
        }
    }

    pub(super) fn service_nbd(&mut self, k: usize) {
        loop {
            self.process_nbd(k);
            let Some(Entry::Nbd { conn, res, .. }) = self.entries.get_mut(k) else {
                return;
            };
            if !conn.wants_input() || self.res[*res].congested {
                break;
            }
            match conn.read_some() {
                ReadOutcome::Data => {}
                ReadOutcome::WouldBlock => {
                    conn.readable = false;
                    break;
                }
                ReadOutcome::Eof => conn.eof = true,
                ReadOutcome::Error(e) => {
                    match crate::tls::failure(&e) {
                        Some(t) => warn!(client = %conn.name, "TLS failed, closing: {t}"),
                        None => debug!(client = %conn.name, "connection failed: {e}"),
                    }
                    conn.dead = true;
                    break;
                }
            }
        }
        self.mark_dirty(k);
    }

    pub(super) fn process_nbd(&mut self, k: usize) {
        let Some(Entry::Nbd { res, vol, conn }) = self.entries.get_mut(k) else {
            return;
        };
        let (r, v) = (*res, *vol);
        if conn.dead {
            return;
        }
        if matches!(conn.phase, Phase::Handshake(_)) && !self.nbd_handshake(k, r, v) {
            return;
        }
        // Take the input so payloads can be borrowed while the engine's actions touch any
        // entry (replies to this and other clients, packets to peers).
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) else {
            return;
        };
        let input = std::mem::take(&mut conn.inbuf);
        let (mut start, end) = (conn.in_start, conn.in_end);
        loop {
            match self.next_nbd_request(k, r, v, &input[start..end]) {
                ControlFlow::Continue(n) => start += n,
                ControlFlow::Break(n) => {
                    start += n;
                    break;
                }
            }
        }
        if let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) {
            conn.inbuf = input;
            conn.in_start = start;
            conn.in_end = end;
            if conn.in_start == conn.in_end {
                conn.in_start = 0;
                conn.in_end = 0;
            }
        }
    }

    /// Decodes and handles the next request of client `k` from `input`: continues with the
    /// bytes it took, or breaks with them when the client must wait (limits, congestion,
    /// a partial request) or sends no more.
    fn next_nbd_request(
        &mut self,
        k: usize,
        r: usize,
        v: usize,
        input: &[u8],
    ) -> ControlFlow<usize, usize> {
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) else {
            return ControlFlow::Break(0);
        };
        if !conn.has_room() {
            return ControlFlow::Break(0);
        }
        if self.res[r].congested {
            if !self.res[r].stalled.contains(&k) {
                self.res[r].stalled.push(k);
            }
            return ControlFlow::Break(0);
        }
        let Phase::Transmission {
            decoder,
            structured,
            ..
        } = &mut conn.phase
        else {
            return ControlFlow::Break(0);
        };
        let structured = *structured;
        let (n, decoded) = decoder.decode(input);
        match decoded {
            Decoded::NeedMore { need } => {
                conn.need = need;
                if conn.eof || self.shutting_down {
                    conn.read_closed = true;
                }
                return ControlFlow::Break(n);
            }
            Decoded::Fatal(e) => {
                warn!(client = %conn.name, "protocol error, closing: {e}");
                conn.read_closed = true;
                return ControlFlow::Break(0);
            }
            Decoded::Rejected(rj) => {
                warn!(client = %conn.name, cookie = rj.cookie, errno = ?rj.errno, "request refused: {}", rj.reason);
                reply::error(&mut conn.out, structured, rj.cookie, rj.errno, rj.reason);
            }
            Decoded::WriteHeader(_) => {
                unreachable!("streaming is not enabled for replicated volumes")
            }
            Decoded::Request(req, _) if req.command == Command::Disconnect => {
                conn.read_closed = true;
                return ControlFlow::Break(n);
            }
            Decoded::Request(req, _) if conn.fenced => {
                reply::error(&mut conn.out, structured, req.cookie, Errno::Io, FENCED);
            }
            Decoded::Request(req, _) if self.shutting_down => {
                nbd_glue::refuse_shutting_down(&mut conn.out, structured, req.cookie);
            }
            Decoded::Request(req, _) if matches!(req.command, Command::BlockStatus { .. }) => {
                self.block_status(k, r, v, req, structured);
            }
            Decoded::Request(req, payload) => {
                conn.in_flight += 1;
                self.submit_nbd(k, r, v, req, payload, structured);
            }
        }
        ControlFlow::Continue(n)
    }

    /// A block status request (`base:allocation`) of client `k`, answered where
    /// `Resource::allocation_map` says: on the spot from the local replica's map, or with
    /// the whole range as data (see there why that is in order with the writes); from an
    /// up-to-date peer's map through the engine, as a read is; refused as a read would be.
    fn block_status(&mut self, k: usize, r: usize, v: usize, req: Request, structured: bool) {
        self.handled += 1;
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) else {
            return;
        };
        let res = &self.res[r];
        let min_block = res.exports[v].block.minimum;
        match res.engine.allocation_map(v as u16) {
            Ok(AllocationMap::Local) => {
                let store = res.backings.get(v).and_then(Option::as_deref);
                nbd_glue::block_status(&mut conn.out, &req, min_block, store);
            }
            Ok(AllocationMap::Unknown) => {
                nbd_glue::block_status(&mut conn.out, &req, min_block, None);
            }
            Ok(AllocationMap::Peer) => {
                conn.in_flight += 1;
                let id = ReqId(self.slots.insert(Slot {
                    entry: k,
                    cookie: req.cookie,
                    structured,
                    answer: Answer::BlockStatus { req, min_block },
                    arrived: Instant::now(),
                    op: None,
                    vol: v as u16,
                    ticket: None,
                    part: None,
                }) as u64);
                let mut actions = Vec::new();
                (self.res[r].engine).block_status(id, v as u16, req.offset, req.len, &mut actions);
                self.run_actions(r, actions, Ctx::default());
            }
            Err(e) => {
                let (errno, msg) = nbd_glue::describe(e, Served::Replicated);
                debug!(client = %conn.name, cookie = req.cookie, "block status refused: {msg}");
                reply::error(&mut conn.out, structured, req.cookie, errno, &msg);
            }
        }
    }

    /// The NBD handshake of connection `k` (to volume `v` of resource `r`): true once it
    /// is done and requests may follow.
    fn nbd_handshake(&mut self, k: usize, r: usize, v: usize) -> bool {
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) else {
            return false;
        };
        if let Phase::Handshake(h) = &mut conn.phase {
            let exports = std::slice::from_ref(&self.res[r].exports[v]);
            let (n, step) = h.feed(
                &conn.inbuf[conn.in_start..conn.in_end],
                exports,
                self.shutting_down,
                &mut conn.out,
            );
            for refusal in h.take_refusals() {
                if refusal.contains("ERR_UNSUP") {
                    debug!(client = %conn.name, "{refusal}");
                } else {
                    info!(client = %conn.name, "{refusal}");
                }
            }
            conn.consume(n);
            match step {
                HandshakeStep::NeedMore => {
                    if conn.eof {
                        conn.read_closed = true;
                    }
                    return false;
                }
                HandshakeStep::StartTls => {
                    debug!(client = %conn.name, "STARTTLS accepted: TLS handshake");
                    if let Err(e) = conn.start_tls() {
                        warn!(client = %conn.name, "cannot start TLS: {e}");
                        conn.dead = true;
                    }
                    return false;
                }
                HandshakeStep::Close(reason) => {
                    warn!(client = %conn.name, "handshake refused: {reason}");
                    conn.read_closed = true;
                    return false;
                }
                HandshakeStep::Done(neg) => {
                    let export = &self.res[r].exports[v];
                    let params = TransmissionParams {
                        size: export.size,
                        read_only: false,
                        block: export.block,
                        structured_replies: neg.structured_replies,
                        meta_context: neg.meta_context,
                        block_sizes: neg.block_sizes,
                    };
                    conn.phase = Phase::Transmission {
                        volume: v,
                        decoder: RequestDecoder::new(params),
                        structured: neg.structured_replies,
                    };
                    conn.handshake_deadline = None;
                    // Attaching while a forced demotion waits: no longer served here.
                    conn.fenced = self.res[r].demote_pending;
                    let tls = conn.tls_description().unwrap_or_else(|| "off".into());
                    info!(client = %conn.name, export = %export.name, tls = %tls, "NBD client attached");
                    self.client_attached(r);
                }
            }
        }
        true
    }

    /// A decoded request of client `k`, handed to the engine.
    fn submit_nbd(
        &mut self,
        k: usize,
        r: usize,
        v: usize,
        req: Request,
        payload: &[u8],
        structured: bool,
    ) {
        self.handled += 1;
        let flushes = &mut self.res[r].nbd_flushes;
        match req.command {
            Command::Write { fua } | Command::Trim { fua } => {
                flushes.wrote(u64::from(req.len));
                if fua {
                    flushes.flushed();
                }
            }
            Command::WriteZeroes { fua, .. } => {
                flushes.wrote(u64::from(req.len));
                if fua {
                    flushes.flushed();
                }
            }
            Command::Flush => flushes.flushed(),
            _ => {}
        }
        let answer = match req.command {
            Command::Read => Answer::Read {
                offset: req.offset,
                len: req.len,
            },
            _ => Answer::Done,
        };
        let op = match req.command {
            Command::Read => Some(Op::Read),
            Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. } => {
                Some(Op::Write)
            }
            Command::Flush => Some(Op::Flush),
            _ => None,
        };
        let slot = Slot {
            entry: k,
            cookie: req.cookie,
            structured,
            answer,
            arrived: Instant::now(),
            op,
            vol: v as u16,
            ticket: None,
            part: None,
        };
        if !crate::rmw::is_aligned(&req, self.res[r].exports[v].block.minimum) {
            return self.submit_unaligned(r, req, payload, slot);
        }
        let io = nbd_glue::io_of(&req);
        let id = self.slots.insert(slot);
        if io.is_write() && !self.enter_gate(r, id, io, req.offset, req.len, payload) {
            return;
        }
        let id = ReqId(id as u64);
        let mut actions = Vec::new();
        self.res[r].engine.submit(id, v as u16, io, &mut actions);
        self.run_actions(
            r,
            actions,
            Ctx {
                incoming: None,
                payload: Some((id, payload)),
            },
        );
    }

    /// Auto-promote (decided by the engine): the first client of a resource makes this node
    /// Primary when no other node is.
    pub(super) fn client_attached(&mut self, r: usize) {
        let res = &mut self.res[r];
        let mut actions = Vec::new();
        match res.engine.client_attached(&mut actions) {
            AutoPromote::Refused(e) => {
                warn!(resource = %res.cfg.name, "auto-promote refused: {}", res.explain(e))
            }
            AutoPromote::Promoted | AutoPromote::Unchanged => {}
        }
        self.run_actions(r, actions, Ctx::default());
    }

    /// The NBD clients of resource `r` past their handshake and not fenced: "peer#id" names.
    pub(super) fn attached_clients(&self, r: usize) -> Vec<&str> {
        self.entries
            .iter()
            .filter_map(|(_, e)| match e {
                Entry::Nbd { res, conn, .. }
                    if *res == r
                        && !conn.fenced
                        && matches!(conn.phase, Phase::Transmission { .. }) =>
                {
                    Some(conn.name.as_str())
                }
                _ => None,
            })
            .collect()
    }

    /// `tandem secondary`: like DRBD, a volume in use is not taken from its clients (their
    /// next write would fail) unless the administrator insists; then their requests, in
    /// flight and later, fail with EIO, and the demotion completes once the engine has
    /// answered the ones in flight (a replicated write cannot be recalled half-way), and
    /// every peer has answered a change of the ids under way. `momentary`: refused only
    /// for a moment (the ids are changing), the same request soon succeeds.
    pub(super) fn secondary(
        &mut self,
        r: usize,
        force: bool,
        out: &mut Vec<RAction>,
        momentary: &mut bool,
    ) -> Result<(), String> {
        let clients: Vec<String> = self
            .attached_clients(r)
            .into_iter()
            .map(str::to_string)
            .collect();
        let res = &mut self.res[r];
        if res.engine.role() != Role::Primary || clients.is_empty() {
            return res.engine.demote(out).map_err(|e| {
                *momentary = e.is_momentary();
                e.to_string()
            });
        }
        let n = clients.len();
        let list = clients.join(", ");
        if !force {
            return Err(format!(
                "{} is in use: {n} NBD client{} attached ({list}); their next request would fail. \
                 Disconnect them first, or `tandem secondary {} --force` fails their requests in \
                 flight and later ones with EIO",
                res.cfg.name,
                if n == 1 { "" } else { "s" },
                res.cfg.name
            ));
        }
        let in_flight = res.engine.app_in_flight();
        warn!(resource = %res.cfg.name, clients = %list,
            "administrator: Secondary forced with {n} NBD client(s) attached: their {in_flight} request(s) in flight and all later ones fail with EIO");
        for (_, e) in self.entries.iter_mut() {
            if let Entry::Nbd { res, conn, .. } = e {
                if *res == r && matches!(conn.phase, Phase::Transmission { .. }) {
                    conn.fenced = true;
                }
            }
        }
        let res = &mut self.res[r];
        if in_flight > 0 {
            res.demote_pending = true;
            return Ok(());
        }
        match res.engine.demote(out) {
            Err(e) if e.is_momentary() => {
                res.demote_pending = true;
                Ok(())
            }
            done => done.map_err(|e| e.to_string()),
        }
    }

    /// The forced demotion waiting for the engine's requests in flight, once they are done.
    pub(super) fn finish_forced_demote(&mut self, r: usize) {
        let res = &mut self.res[r];
        if !res.demote_pending || res.engine.app_in_flight() > 0 {
            return;
        }
        res.demote_pending = false;
        let mut actions = Vec::new();
        match res.engine.demote(&mut actions) {
            // The ids are changing: tried again after the next event.
            Err(e) if e.is_momentary() => res.demote_pending = true,
            Err(e) => error!(resource = %res.cfg.name, "forced demotion failed: {e}"),
            Ok(()) => {}
        }
        self.run_actions(r, actions, Ctx::default());
    }

    /// The engine demotes a node its clients promoted once the last one left and every
    /// request it took is answered.
    pub(super) fn client_detached(&mut self, r: usize) {
        let mut actions = Vec::new();
        self.res[r].engine.client_detached(&mut actions);
        self.run_actions(r, actions, Ctx::default());
    }

    pub(super) fn complete(
        &mut self,
        r: usize,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        ctx: &Ctx<'_>,
    ) {
        self.al_app_done(r, req);
        let slot = self.slots.remove(req.0 as usize);
        // The read's bytes (or a peer's map), taken out of the store (or borrowed from
        // the packet being handled) so they are copied once, straight into the reply.
        let disk_buf = match data {
            Some(DataRef::Disk(t)) => self.res[r].data.take_read(t),
            _ => None,
        };
        let kept: Option<Vec<u8>>;
        let bytes: Option<&[u8]> = match data {
            Some(DataRef::Disk(_)) => disk_buf.as_deref(),
            Some(DataRef::Incoming { at }) => ctx.incoming.and_then(|b| b.get(at as usize..)),
            // Not what reads complete with: copied, so the store is not borrowed.
            Some(d) => {
                kept = self.res[r].data.resolve(d, ctx).map(<[u8]>::to_vec);
                kept.as_deref()
            }
            None => None,
        };
        if let Some((job, io)) = slot.part {
            self.part_done(job, io, result, bytes);
        } else {
            if let Some(t) = slot.ticket {
                self.leave_gate(r, slot.vol, t);
            }
            self.answer(r, slot, result, bytes);
        }
        if let Some(b) = disk_buf {
            self.pool.put(b);
        }
    }

    /// Answers the request of `slot` (taken out of the table) with `result` and, for a
    /// read, `bytes` (at least its length; `reply_to` cuts them).
    pub(super) fn answer(
        &mut self,
        r: usize,
        slot: Slot,
        result: Result<(), IoError>,
        bytes: Option<&[u8]>,
    ) {
        self.count_request(r, slot.op, slot.arrived);
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(slot.entry) else {
            return;
        };
        if conn.in_flight == crate::conn::MAX_IN_FLIGHT {
            // It stopped taking requests at the limit: take them again after this round.
            self.resume.push(slot.entry);
        }
        conn.in_flight -= 1;
        reply_to(conn, &slot, result, bytes);
        let entry = slot.entry;
        self.mark_dirty(entry);
    }
}

/// The reply to a completed request: one per kind of outcome.
fn reply_to(conn: &mut Conn, slot: &Slot, result: Result<(), IoError>, bytes: Option<&[u8]>) {
    let (out, structured, cookie) = (&mut conn.out, slot.structured, slot.cookie);
    match (result, slot.answer) {
        // Whatever became of it, a fenced client hears that the volume was taken away.
        _ if conn.fenced => reply::error(out, structured, cookie, Errno::Io, FENCED),
        (Err(e), _) => {
            let (errno, msg) = nbd_glue::describe(e, Served::Replicated);
            debug!(client = %conn.name, cookie, "request failed: {msg}");
            reply::error(out, structured, cookie, errno, &msg);
        }
        (Ok(()), Answer::Done) => reply::simple(out, cookie, 0),
        (Ok(()), Answer::Read { offset, len }) => match bytes {
            Some(b) => {
                if structured {
                    reply::read_data_chunk(out, cookie, offset, len);
                } else {
                    reply::simple(out, cookie, 0);
                }
                out.extend_from_slice(&b[..len as usize]);
            }
            None => {
                error!(client = %conn.name, "read completed without data; answering EIO");
                let why = "internal error: read data missing";
                reply::error(out, structured, cookie, Errno::Io, why);
            }
        },
        // Without a map (no peer could answer) the whole range is data: always true.
        (Ok(()), Answer::BlockStatus { req, min_block }) => {
            nbd_glue::block_status_from_peer(out, &req, min_block, bytes);
        }
    }
}
