//! The event loop: accepts clients, runs their handshakes, turns requests into engine
//! submissions, executes the engine's disk actions and writes replies.

use crate::bufpool::BufPool;
use crate::busy_poll::Waiter;
use crate::conn::{Conn, Phase, ReadOutcome, Streaming};
use crate::listener::Listener;
use crate::nbd_glue::{self, Served};
use crate::serve_core::{Core, Current, VolumeCtx, LARGE_WRITE};
use crate::tls::{self, NbdTls};
use crate::worker::Workers;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;
use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_frontend::nbd::{
    reply, Command, Decoded, HandshakeStep, Request, RequestDecoder, TransmissionParams,
};
use tracing::{debug, error, info, warn};

const WAKER: Token = Token(usize::MAX - 1);
const SIGNAL: Token = Token(usize::MAX - 2);
const LISTENER_BASE: usize = 1 << 40;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

pub struct Reactor {
    poll: Poll,
    listeners: Vec<Listener>,
    conns: Slab<Conn>,
    core: Core,
    signal_rx: mio::net::UnixStream,
    next_conn_id: u64,
    dirty: Vec<usize>,
    shutting_down: Option<Instant>,
    busy_poll: std::time::Duration,
    tls: Option<NbdTls>,
}

impl Reactor {
    pub fn new(
        volumes: Vec<VolumeCtx>,
        mut listeners: Vec<Listener>,
        workers: usize,
        busy_poll: std::time::Duration,
        tls: Option<NbdTls>,
    ) -> io::Result<Reactor> {
        let poll = Poll::new()?;
        for (i, l) in listeners.iter_mut().enumerate() {
            poll.registry()
                .register(l.source(), Token(LISTENER_BASE + i), Interest::READABLE)?;
        }
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (signal_rx, signal_tx) = std::os::unix::net::UnixStream::pair()?;
        signal_rx.set_nonblocking(true)?;
        let mut signal_rx = mio::net::UnixStream::from_std(signal_rx);
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            let tx = signal_tx.try_clone()?;
            signal_hook::low_level::pipe::register(sig, tx)?;
        }
        poll.registry()
            .register(&mut signal_rx, SIGNAL, Interest::READABLE)?;
        let exports = volumes.iter().map(|v| v.export.clone()).collect();
        Ok(Reactor {
            poll,
            listeners,
            conns: Slab::new(),
            core: Core {
                volumes,
                exports,
                slots: Slab::with_capacity(1024),
                pool: BufPool::default(),
                workers: Workers::start(workers, waker),
                actions: Vec::with_capacity(64),
                completions: Vec::with_capacity(64),
                submitted: 0,
                jobs: Slab::new(),
                waiting: Default::default(),
            },
            signal_rx,
            next_conn_id: 0,
            dirty: Vec::new(),
            shutting_down: None,
            busy_poll,
            tls,
        })
    }

    /// Serves until SIGTERM/SIGINT, then drains and flushes.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        let mut active: Vec<usize> = Vec::new();
        let mut waiter = Waiter::new(self.busy_poll);
        loop {
            let timeout = self.next_timeout();
            let handled = std::mem::take(&mut self.core.submitted);
            waiter.wait(&mut self.poll, &mut events, timeout, handled)?;
            active.clear();
            for ev in events.iter() {
                match ev.token() {
                    WAKER => self.worker_completions(),
                    SIGNAL => self.begin_shutdown(),
                    Token(t) if t >= LISTENER_BASE => self.accept(t - LISTENER_BASE),
                    Token(k) => {
                        if let Some(c) = self.conns.get_mut(k) {
                            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                                c.readable = true;
                            }
                            if ev.is_writable() {
                                self.mark_dirty(k);
                            }
                            active.push(k);
                        }
                    }
                }
            }
            for &k in &active {
                self.service(k);
            }
            self.deliver_completions();
            self.flush_dirty();
            self.expire_handshakes();
            if self.shutting_down.is_some() && self.drained() {
                return self.final_flush();
            }
        }
    }

    fn next_timeout(&self) -> Option<Duration> {
        let mut t = self
            .conns
            .iter()
            .filter_map(|(_, c)| c.handshake_deadline)
            .min();
        if let Some(start) = self.shutting_down {
            t = Some(t.map_or(start + SHUTDOWN_GRACE, |d| d.min(start + SHUTDOWN_GRACE)));
        }
        t.map(|d| d.saturating_duration_since(Instant::now()) + Duration::from_millis(1))
    }

    fn accept(&mut self, i: usize) {
        loop {
            let (mut stream, peer) = match self.listeners[i].accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE and friends: log and keep serving the clients we have.
                    warn!(listener = %self.listeners[i].describe(), "accept failed: {e}");
                    return;
                }
            };
            self.next_conn_id += 1;
            let name = format!("{peer}#{}", self.next_conn_id);
            let entry = self.conns.vacant_entry();
            let k = entry.key();
            if let Err(e) = self.poll.registry().register(
                stream.source(),
                Token(k),
                // Writability is only asked for while replies are stuck (see flush_dirty): with
                // it always on, every reply the client reads would wake the loop once more.
                Interest::READABLE,
            ) {
                warn!(client = %name, "cannot register connection: {e}");
                continue;
            }
            debug!(client = %name, "connected");
            entry.insert(Conn::new(
                stream,
                name,
                Instant::now() + HANDSHAKE_TIMEOUT,
                self.tls.as_ref(),
            ));
            self.dirty.push(k);
            self.service(k);
        }
    }

    fn mark_dirty(&mut self, k: usize) {
        if let Some(c) = self.conns.get_mut(k) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(k);
            }
        }
    }

    /// Reads and processes input until the socket is drained or the connection must wait.
    fn service(&mut self, k: usize) {
        loop {
            self.process_input(k);
            let Some(c) = self.conns.get_mut(k) else {
                return;
            };
            if !c.wants_input() {
                break;
            }
            match c.read_some() {
                ReadOutcome::Data => {}
                ReadOutcome::WouldBlock => {
                    c.readable = false;
                    break;
                }
                ReadOutcome::Eof => {
                    debug!(client = %c.name, in_flight = c.in_flight, buffered = c.input().len(), "client closed its side");
                    c.eof = true;
                    // Serve what is buffered; a partial request left over is a truncated stream.
                }
                ReadOutcome::Error(e) => {
                    match tls::failure(&e) {
                        Some(t) => warn!(client = %c.name, "TLS failed, closing: {t}"),
                        None => info!(client = %c.name, "connection failed: {e}"),
                    }
                    c.dead = true;
                    break;
                }
            }
        }
        if let Some(c) = self.conns.get_mut(k) {
            c.maybe_shrink();
        }
        self.mark_dirty(k);
    }

    fn process_input(&mut self, k: usize) {
        let shutting_down = self.shutting_down.is_some();
        let Some(c) = self.conns.get_mut(k) else {
            return;
        };
        if c.dead {
            return;
        }
        if let Phase::Handshake(h) = &mut c.phase {
            let input = &c.inbuf[c.in_start..c.in_end];
            let (n, step) = h.feed(input, &self.core.exports, shutting_down, &mut c.out);
            for r in h.take_refusals() {
                // Clients probe optional features (meta contexts, extended headers) on
                // every connection; only refusals of what they needed are worth a log line.
                if r.contains("ERR_UNSUP") {
                    debug!(client = %c.name, "{r}");
                } else {
                    info!(client = %c.name, "{r}");
                }
            }
            c.consume(n);
            match step {
                HandshakeStep::NeedMore => {
                    if c.eof {
                        debug!(client = %c.name, "client left during the handshake");
                        c.read_closed = true;
                    }
                    return;
                }
                HandshakeStep::Close(reason) => {
                    match reason {
                        tandem_frontend::nbd::CloseReason::Aborted => {
                            debug!(client = %c.name, "client aborted the handshake")
                        }
                        reason => warn!(client = %c.name, "handshake refused: {reason}"),
                    }
                    c.read_closed = true;
                    return;
                }
                HandshakeStep::StartTls => {
                    debug!(client = %c.name, "STARTTLS accepted: TLS handshake");
                    if let Err(e) = c.start_tls() {
                        warn!(client = %c.name, "cannot start TLS: {e}");
                        c.dead = true;
                    }
                    return;
                }
                HandshakeStep::Done(neg) => {
                    let export = &self.core.exports[neg.export];
                    let tls = c.tls_description().unwrap_or_else(|| "off".into());
                    info!(client = %c.name, export = %export.name, structured = neg.structured_replies, block_status = neg.meta_context.is_some(), block_sizes = neg.block_sizes, tls = %tls, "transmission phase");
                    let params = TransmissionParams {
                        size: export.size,
                        read_only: export.read_only,
                        block: export.block,
                        structured_replies: neg.structured_replies,
                        meta_context: neg.meta_context,
                        block_sizes: neg.block_sizes,
                    };
                    let mut decoder = RequestDecoder::new(params);
                    decoder.stream_writes_from(LARGE_WRITE);
                    c.phase = Phase::Transmission {
                        volume: neg.export,
                        decoder,
                        structured: neg.structured_replies,
                    };
                    c.handshake_deadline = None;
                }
            }
        }
        self.process_requests(k, shutting_down);
    }

    fn process_requests(&mut self, k: usize, shutting_down: bool) {
        let Reactor { conns, core, .. } = self;
        let Some(c) = conns.get_mut(k) else { return };
        while next_request(c, core, k, shutting_down).is_continue() {}
    }

    fn worker_completions(&mut self) {
        while let Ok(done) = self.core.workers.done.try_recv() {
            self.core.worker_done(done);
        }
    }

    /// Turns completed requests into replies on their connections.
    fn deliver_completions(&mut self) {
        let mut resume = Vec::new();
        // Handling a part of an unaligned request, or leaving a gate, submits more, whose
        // inline completions are taken up by the next round below.
        let mut batch = std::mem::take(&mut self.core.completions);
        for (req, result) in batch.drain(..) {
            let slot = self.core.slots.remove(req.0 as usize);
            if let Some((job, io)) = slot.part {
                self.core.part_done(job, io, result, slot.data);
                continue;
            }
            if let Some(t) = slot.ticket {
                self.core.leave_gate(slot.volume, t);
            }
            let c = self
                .conns
                .get_mut(slot.conn)
                .expect("a connection with requests in flight was dropped");
            c.in_flight -= 1;
            if !c.read_closed && !c.dead {
                // It may have stopped taking requests at the in-flight limit.
                resume.push(slot.conn);
            }
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot.conn);
            }
            if slot.replied {
                // Only successful reads are answered early, and nothing fails a read after
                // its data was read.
                assert!(
                    result.is_ok(),
                    "request {req:?} failed after its reply was sent"
                );
                continue;
            }
            match result {
                Ok(()) => match (slot.read, slot.data) {
                    (Some((offset, len)), Some(data)) => {
                        if slot.structured {
                            reply::read_data_chunk(&mut c.out, slot.cookie, offset, len);
                        } else {
                            reply::simple(&mut c.out, slot.cookie, 0);
                        }
                        c.out.extend_from_slice(&data);
                        self.core.pool.put(data);
                    }
                    (_, data) => {
                        reply::simple(&mut c.out, slot.cookie, 0);
                        if let Some(d) = data {
                            self.core.pool.put(d);
                        }
                    }
                },
                Err(e) => {
                    let (errno, msg) = nbd_glue::describe(e, Served::Local);
                    warn!(client = %c.name, cookie = slot.cookie, errno = ?errno, "request failed: {msg}");
                    reply::error(&mut c.out, slot.structured, slot.cookie, errno, &msg);
                    if let Some(d) = slot.data {
                        self.core.pool.put(d);
                    }
                }
            }
        }
        if self.core.completions.is_empty() {
            self.core.completions = batch;
        }
        resume.sort_unstable();
        resume.dedup();
        for k in resume {
            self.service(k);
        }
        if !self.core.completions.is_empty() {
            self.deliver_completions();
        }
    }

    fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut resume = Vec::new();
        for &k in &dirty {
            let Some(c) = self.conns.get_mut(k) else {
                continue;
            };
            c.dirty = false;
            if !c.dead && c.out_pending() {
                let was_full = !c.has_room();
                if let Err(e) = c.flush_out() {
                    // A client that hangs up without waiting for replies is common (probes,
                    // killed processes) and not our failure.
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) {
                        debug!(client = %c.name, "client went away before its replies: {e}");
                    } else {
                        info!(client = %c.name, "connection failed while replying: {e}");
                    }
                    c.dead = true;
                } else if was_full && c.has_room() {
                    resume.push(k);
                }
            }
            let stuck = !c.dead && c.out_pending();
            if stuck != c.write_interest && !c.deregistered {
                if let Err(e) = c.stream.watch(self.poll.registry(), Token(k), stuck) {
                    info!(client = %c.name, "cannot watch the connection: {e}");
                    c.dead = true;
                }
                c.write_interest = stuck;
            }
            if c.finished() {
                let mut c = self.conns.remove(k);
                if !c.deregistered {
                    let _ = self.poll.registry().deregister(c.stream.source());
                }
                c.stream.shutdown();
                debug!(client = %c.name, "closed");
                continue;
            }
            if c.dead && !c.deregistered {
                // Keep the slot until its requests complete, but stop hearing from it.
                let _ = self.poll.registry().deregister(c.stream.source());
                c.deregistered = true;
            }
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
        for k in resume {
            self.service(k);
        }
        if !self.core.completions.is_empty() {
            self.deliver_completions();
        }
        if !self.dirty.is_empty() {
            self.flush_dirty();
        }
    }

    fn expire_handshakes(&mut self) {
        let now = Instant::now();
        let expired: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.handshake_deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| k)
            .collect();
        for k in expired {
            let c = &mut self.conns[k];
            warn!(client = %c.name, "handshake not finished within {HANDSHAKE_TIMEOUT:?}, closing");
            c.handshake_deadline = None;
            c.dead = true;
            self.mark_dirty(k);
        }
        if !self.dirty.is_empty() {
            self.flush_dirty();
        }
        if let Some(start) = self.shutting_down {
            if start.elapsed() > SHUTDOWN_GRACE {
                for (k, c) in self.conns.iter_mut() {
                    if !c.dead {
                        warn!(client = %c.name, "still busy {SHUTDOWN_GRACE:?} after shutdown began, closing");
                        c.dead = true;
                        self.dirty.push(k);
                    }
                }
                self.flush_dirty();
            }
        }
    }

    fn begin_shutdown(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(io::Read::read(&mut self.signal_rx, &mut buf), Ok(n) if n > 0) {}
        if self.shutting_down.is_some() {
            return;
        }
        info!("shutting down: no new clients, finishing requests in flight");
        self.shutting_down = Some(Instant::now());
        for mut l in self.listeners.drain(..) {
            let _ = self.poll.registry().deregister(l.source());
        }
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for k in keys {
            let c = &mut self.conns[k];
            if matches!(c.phase, Phase::Handshake(_)) {
                c.read_closed = true;
                self.mark_dirty(k);
            } else {
                // Answer what is already buffered with ESHUTDOWN, then stop reading.
                self.service(k);
                if let Some(c) = self.conns.get_mut(k) {
                    c.read_closed = true;
                }
                self.mark_dirty(k);
            }
        }
    }

    fn drained(&self) -> bool {
        self.conns.is_empty() && self.core.slots.is_empty()
    }

    fn final_flush(self) -> io::Result<()> {
        for v in &self.core.volumes {
            if !v.export.read_only {
                v.backing.sync_data().map_err(|e| {
                    error!(export = %v.export.name, "final flush failed: {e}");
                    e
                })?;
            }
        }
        info!("all requests finished and flushed; exiting");
        Ok(())
    }
}

/// Marks `n` input bytes consumed (field-wise, so a connection's decoder can stay borrowed).
/// Takes the next request of connection `k` (in its transmission phase): a streamed write
/// whose payload is complete, or the next item its decoder frames. Breaks when the
/// connection must wait (limits, a partial request or payload) or sends no more.
fn next_request(c: &mut Conn, core: &mut Core, k: usize, shutting_down: bool) -> ControlFlow<()> {
    let Phase::Transmission {
        volume, structured, ..
    } = c.phase
    else {
        return ControlFlow::Break(());
    };
    if let Some(st) = c.streaming.take_if(|st| st.complete()) {
        submit_streamed(c, core, (k, volume, structured), st, shutting_down);
    }
    if c.streaming.is_some() {
        if c.eof {
            info!(client = %c.name, "client closed the connection in the middle of a write");
            c.read_closed = true;
        }
        return ControlFlow::Break(());
    }
    if !c.has_room() {
        return ControlFlow::Break(());
    }
    let Phase::Transmission { decoder, .. } = &mut c.phase else {
        unreachable!("the phase was Transmission a moment ago")
    };
    // The payload of a request stays where it lies in the input buffer, borrowed until
    // the engine has it: hence the fields of `c`, not its methods, below.
    let (n, decoded) = decoder.decode(&c.inbuf[c.in_start..c.in_end]);
    match decoded {
        Decoded::NeedMore { need } => {
            c.need = need;
            advance(&mut c.in_start, &mut c.in_end, n);
            if c.eof && c.in_end > c.in_start {
                info!(client = %c.name, "client closed the connection in the middle of a request");
            }
            if shutting_down || c.eof {
                c.read_closed = true;
            }
            return ControlFlow::Break(());
        }
        Decoded::Fatal(e) => {
            warn!(client = %c.name, "protocol error, closing: {e}");
            c.read_closed = true;
        }
        Decoded::Rejected(r) => {
            warn!(client = %c.name, cookie = r.cookie, command = r.command, offset = r.offset, len = r.len, errno = ?r.errno, "request refused: {}", r.reason);
            reply::error(&mut c.out, structured, r.cookie, r.errno, r.reason);
        }
        Decoded::Request(req, _) if req.command == Command::Disconnect => {
            debug!(client = %c.name, "client sent NBD_CMD_DISC");
            c.read_closed = true;
        }
        Decoded::Request(req, _) if shutting_down => {
            nbd_glue::refuse_shutting_down(&mut c.out, structured, req.cookie);
        }
        Decoded::Request(req, _) if matches!(req.command, Command::BlockStatus { .. }) => {
            core.block_status(volume, &req, &mut c.out);
        }
        Decoded::Request(req, payload) => {
            c.in_flight += 1;
            let current = Current {
                payload: Some(payload),
                out: &mut c.out,
            };
            core.submit(k, volume, structured, req, current, None);
        }
        Decoded::WriteHeader(req) => {
            start_streaming(c, core, req, n);
            return ControlFlow::Continue(());
        }
    }
    advance(&mut c.in_start, &mut c.in_end, n);
    ControlFlow::Continue(())
}

/// A streamed write whose payload has all arrived, submitted (for connection `k` to
/// `volume`, replying `structured` or not).
fn submit_streamed(
    c: &mut Conn,
    core: &mut Core,
    (k, volume, structured): (usize, usize, bool),
    st: Streaming,
    shutting_down: bool,
) {
    if shutting_down {
        nbd_glue::refuse_shutting_down(&mut c.out, structured, st.req.cookie);
        core.pool.put(st.buf);
        return;
    }
    c.in_flight += 1;
    let current = Current {
        payload: None,
        out: &mut c.out,
    };
    core.submit(k, volume, structured, st.req, current, Some(st.buf));
}

/// A large write's header (its `n` bytes taken): its payload goes straight into a buffer
/// of its own, starting with what the input buffer already holds.
fn start_streaming(c: &mut Conn, core: &mut Core, req: Request, n: usize) {
    advance(&mut c.in_start, &mut c.in_end, n);
    let mut buf = core.pool.get(req.len as usize);
    let have = (c.in_end - c.in_start).min(buf.len());
    buf[..have].copy_from_slice(&c.inbuf[c.in_start..c.in_start + have]);
    advance(&mut c.in_start, &mut c.in_end, have);
    c.streaming = Some(Streaming {
        req,
        buf,
        filled: have,
    });
    c.need = 0;
}

fn advance(start: &mut usize, end: &mut usize, n: usize) {
    *start += n;
    debug_assert!(*start <= *end);
    if *start == *end {
        *start = 0;
        *end = 0;
    }
}
