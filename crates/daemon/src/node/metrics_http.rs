//! The metrics endpoint (`metrics = "IP:PORT"`, or `tandem node --metrics`): a TCP
//! listener on the node's own event loop, HTTP/1.0 and 1.1 reduced to what a Prometheus
//! scraper does: one request (`GET /metrics`), one answer, the connection closed. The
//! same address serves the status page (`GET /` and `GET /status.json`,
//! `status_page.rs`) and the events stream the page updates itself from (`GET /events`:
//! Server-Sent Events, open until the client leaves, fed by `watchers.rs`).
//!
//! A request is at most `REQUEST_MAX` bytes and must arrive within `HTTP_TIMEOUT`; a
//! malformed one gets 400, another path 404, another method 405, and at most `MAX_CONNS`
//! connections are served at once (more get 503). The answer is built from each
//! resource's `tandem status` answer and its counters (`crate::metrics`), `CHUNK`
//! resources per round of the loop, so a scrape of 1000 resources never holds I/O up for
//! the whole of it; then it is written as the socket takes it (the loop watches for room,
//! as for the control socket's large answers).
//!
//! The counters live beside what they count: `ResStats` (application latency per
//! operation, bytes read and written per volume) in each resource, `PeerStats` (data sent
//! and received per volume, replicated writes' round trips) in each peer slot.

use super::state::{Entry, NodeReactor, Presence};
use crate::metrics::{Exposition, Histogram, Op, PeerCounters, ResourceCounters, VolumeCounters};
use anyhow::{Context, Result};
use mio::{Interest, Token as MioToken};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};
use tandem_config::{NodeConfig, OnNoQuorum};
use tandem_engine::DiskKind;
use tracing::{debug, info, warn};

/// Longest request (request line and headers) read.
const REQUEST_MAX: usize = 8 << 10;
/// A connection is closed this long after it was accepted, whatever it is doing.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
const MAX_CONNS: usize = 16;
/// An events stream (`/events`) is not timed out by `HTTP_TIMEOUT`: its page may stay
/// open for days. A client gone without a word is found when a write to it fails.
const STREAM_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 86400);
/// Resources added to a scrape per round of the loop: 0.25-0.55 ms of CPU on this 2-core VM
/// (1000 resources, one volume and one peer each: 4-7.5 ms in all, 3.7 MB of text).
const CHUNK: usize = 32;
/// Bytes of an answer written per round of the loop: a scrape of 1000 resources (3.7 MB)
/// written at once held the loop up for a millisecond or two.
const WRITE_PER_ROUND: usize = 256 << 10;
/// Replicated writes whose sending time is kept per peer (protocol A writes are never
/// acknowledged: the oldest go).
const ROUND_TRIPS_KEPT: usize = 4096;

/// A resource's counters.
pub(crate) struct ResStats {
    /// Application requests from arrival to reply, per [`Op`].
    pub(crate) io: [Histogram; 3],
    pub(crate) volumes: Vec<VolumeCounters>,
    /// Bytes per second read from and written to its local replicas over the last second
    /// (for the status page: a browser's clock can be far from the node's), and the
    /// totals they were taken from.
    pub(crate) rates: (u64, u64),
    sampled: (u64, u64),
}

impl ResStats {
    pub(crate) fn new(my: &NodeConfig) -> ResStats {
        ResStats {
            io: Default::default(),
            volumes: (my.volumes.iter())
                .map(|v| VolumeCounters {
                    client: v.is_diskless(),
                    ..Default::default()
                })
                .collect(),
            rates: (0, 0),
            sampled: (0, 0),
        }
    }

    /// The rates since the last sample, `since_ms` ago.
    pub(crate) fn sample_rates(&mut self, since_ms: u64) {
        let read = self.volumes.iter().map(|v| v.read_bytes).sum();
        let written = self.volumes.iter().map(|v| v.written_bytes).sum();
        let per_s = |now: u64, was: u64| (now - was) * 1000 / since_ms.max(1);
        self.rates = (per_s(read, self.sampled.0), per_s(written, self.sampled.1));
        self.sampled = (read, written);
    }
}

/// One peer's counters.
pub(crate) struct PeerStats {
    /// Per volume: data bytes sent to it, received from it.
    pub(crate) bytes: Vec<(u64, u64)>,
    pub(crate) round_trips: Histogram,
    /// Replicated writes sent on the current connection and not acknowledged: (sequence
    /// number, when).
    unacked: VecDeque<(u64, Instant)>,
}

impl PeerStats {
    pub(crate) fn new(volumes: usize) -> PeerStats {
        PeerStats {
            bytes: vec![(0, 0); volumes],
            round_trips: Histogram::default(),
            unacked: VecDeque::new(),
        }
    }

    pub(crate) fn sent(&mut self, volume: u16, len: u32) {
        if let Some(b) = self.bytes.get_mut(usize::from(volume)) {
            b.0 += u64::from(len);
        }
    }

    pub(crate) fn received(&mut self, volume: u16, len: usize) {
        if let Some(b) = self.bytes.get_mut(usize::from(volume)) {
            b.1 += len as u64;
        }
    }

    /// A write that the peer will acknowledge went out.
    pub(crate) fn write_sent(&mut self, seq: u64, at: Instant) {
        if self.unacked.len() == ROUND_TRIPS_KEPT {
            self.unacked.pop_front();
        }
        self.unacked.push_back((seq, at));
    }

    /// The first acknowledgement of write `seq` (they arrive nearly in order).
    pub(crate) fn acked(&mut self, seq: u64, at: Instant) {
        if let Some(i) = self.unacked.iter().position(|&(s, _)| s == seq) {
            let (_, sent) = self.unacked.remove(i).expect("found");
            self.round_trips.observe(at.saturating_duration_since(sent));
        }
    }

    /// A new connection: sequence numbers of the last one mean nothing.
    pub(crate) fn connected(&mut self) {
        self.unacked.clear();
    }
}

/// The CPU time this thread has used: what building a scrape costs the loop, without the
/// time the scheduler gave to other processes meanwhile (on a busy 2-core VM a round of 32
/// resources took 0.2-0.3 ms, or 4.2 or 8.3 ms of wall clock when preempted for a tick).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Parsed<'a> {
    NeedMore,
    Get { path: &'a str, head: bool },
    Error(u16, &'static str),
}

/// The request line of a complete request (request line and headers, up to the empty
/// line); the headers are not needed.
fn parse(buf: &[u8]) -> Parsed<'_> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"));
    if end.is_none() {
        return if buf.len() > REQUEST_MAX {
            Parsed::Error(431, "Request Header Fields Too Large")
        } else {
            Parsed::NeedMore
        };
    }
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let Ok(line) = std::str::from_utf8(&buf[..line_end]) else {
        return Parsed::Error(400, "Bad Request");
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Parsed::Error(400, "Bad Request");
    };
    if !target.starts_with('/') || !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Parsed::Error(400, "Bad Request");
    }
    let path = target.split('?').next().unwrap_or(target);
    match method {
        "GET" => Parsed::Get { path, head: false },
        "HEAD" => Parsed::Get { path, head: true },
        m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => {
            Parsed::Error(405, "Method Not Allowed")
        }
        _ => Parsed::Error(400, "Bad Request"),
    }
}

/// An HTTP answer's head; the connection closes after the answer.
fn head(status: u16, reason: &str, content_type: &str, length: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n",
    )
    .into_bytes()
}

/// An error's head and body.
fn error_response(status: u16, reason: &str) -> (Vec<u8>, Vec<u8>) {
    let body = format!("{status} {reason}\n").into_bytes();
    let head = head(status, reason, "text/plain; charset=utf-8", body.len());
    (head, body)
}

/// What reading a connection found.
enum Input {
    /// Nothing more for now.
    Open,
    /// The client sends no more (it may still read: a client may shut its side once its
    /// request is sent).
    Eof,
    /// Reset or failed.
    Gone,
}

/// What is built resource by resource (see `CHUNK`).
enum Body {
    /// `GET /metrics`.
    Metrics(Box<Exposition>),
    /// `GET /status.json`, for the status page (`status_page.rs`).
    Json(Vec<u8>),
}

/// An answer being built (see `CHUNK`).
struct Building {
    body: Body,
    /// The next resource to add: an index into the running resources, then the ones
    /// not attached.
    next: usize,
    /// CPU time spent on it (see `thread_cpu`), in all and in the longest round.
    spent: Duration,
    longest: Duration,
    head: bool,
}

enum HttpState {
    Reading,
    Building(Box<Building>),
    /// The answer is queued; the connection ends once it is sent.
    Writing,
    /// Sent, our side shut: waiting for the client to close (closing first with its bytes
    /// unread could reset the connection before it read the answer).
    Closing,
    /// `GET /events` (Server-Sent Events, for the status page): open until the client
    /// leaves; every change of the events stream is queued as it happens (`watchers.rs`).
    Streaming,
}

pub(crate) struct HttpConn {
    pub(crate) stream: mio::net::TcpStream,
    peer: SocketAddr,
    inbuf: Vec<u8>,
    /// The answer's pieces not sent yet (its head, then its body, a scrape's in many
    /// pieces: its text is never copied into one), and how much of the first is sent.
    out: VecDeque<Vec<u8>>,
    sent: usize,
    state: HttpState,
    deadline: Instant,
    pub(crate) dirty: bool,
    write_interest: bool,
    gone: bool,
}

impl HttpConn {
    /// Reads what arrived; false once the client is gone.
    fn read(&mut self) -> Input {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Input::Eof,
                Ok(n) if matches!(self.state, HttpState::Reading) => {
                    self.inbuf.extend_from_slice(&buf[..n]);
                    if self.inbuf.len() > REQUEST_MAX {
                        return Input::Open;
                    }
                }
                Ok(_) => {} // After the request: ignored.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Input::Open,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Input::Gone,
            }
        }
    }

    /// Queues the answer (`body` left out for a HEAD request).
    fn answer(&mut self, head: Vec<u8>, body: Vec<Vec<u8>>, head_only: bool) {
        self.out = std::iter::once(head)
            .chain(body.into_iter().filter(|_| !head_only))
            .filter(|p| !p.is_empty())
            .collect();
        self.sent = 0;
        self.state = HttpState::Writing;
    }

    /// Writes what the socket takes, at most `WRITE_PER_ROUND`; once all is sent, shuts
    /// our side. True if it stopped for the limit, the socket not full.
    fn flush(&mut self) -> bool {
        let mut budget = WRITE_PER_ROUND;
        while self.out_pending() {
            if budget == 0 {
                return true;
            }
            let rest = &self.out[0][self.sent..];
            match self.stream.write(&rest[..rest.len().min(budget)]) {
                Ok(0) => {
                    self.gone = true;
                    return false;
                }
                Ok(n) => {
                    self.sent += n;
                    budget -= n;
                    if self.sent == self.out[0].len() {
                        self.out.pop_front();
                        self.sent = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.gone = true;
                    return false;
                }
            }
        }
        // A stream stays open; an answer ends with our side shut.
        if matches!(self.state, HttpState::Writing) {
            self.out = Default::default();
            self.sent = 0;
            let _ = self.stream.shutdown(Shutdown::Write);
            self.state = HttpState::Closing;
        }
        false
    }

    fn out_pending(&self) -> bool {
        !self.out.is_empty()
    }

    /// An events-stream line, as a Server-Sent Event (`data: <json>`, a blank line).
    pub(super) fn queue_event(&mut self, value: &impl serde::Serialize) {
        let json = serde_json::to_string(value).expect("an events line serializes");
        self.out.push_back(format!("data: {json}\n\n").into_bytes());
    }

    /// Bytes queued and not sent yet.
    pub(super) fn backlog(&self) -> usize {
        self.out.iter().map(Vec::len).sum::<usize>() - self.sent
    }
}

impl NodeReactor {
    pub(super) fn listen_metrics(&mut self, addr: SocketAddr) -> Result<()> {
        let mut l = mio::net::TcpListener::bind(addr)
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        let e = self.entries.vacant_key();
        self.poll
            .registry()
            .register(&mut l, MioToken(e), Interest::READABLE)?;
        self.entries.insert(Entry::MetricsListener(l));
        info!("metrics on http://{addr}/metrics");
        Ok(())
    }

    pub(super) fn accept_http(&mut self, k: usize) {
        loop {
            let Some(Entry::MetricsListener(l)) = self.entries.get(k) else {
                return;
            };
            let (mut s, peer) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("metrics accept failed: {e}"),
            };
            let open = (self.entries.iter())
                .filter(|(_, e)| matches!(e, Entry::Http(_)))
                .count();
            if open >= MAX_CONNS {
                debug!(client = %peer, "metrics: {open} connections already; refused");
                let (head, body) = error_response(503, "Service Unavailable");
                let _ = s.write(&[head, body].concat());
                continue;
            }
            let key = self.entries.vacant_key();
            if (self.poll.registry())
                .register(&mut s, MioToken(key), Interest::READABLE)
                .is_err()
            {
                continue;
            }
            self.entries.insert(Entry::Http(Box::new(HttpConn {
                stream: s,
                peer,
                inbuf: Vec::new(),
                out: Default::default(),
                sent: 0,
                state: HttpState::Reading,
                deadline: Instant::now() + HTTP_TIMEOUT,
                dirty: false,
                write_interest: false,
                gone: false,
            })));
            self.service_http(key);
        }
    }

    /// Connection `k` is readable: the request, once whole, is answered or its scrape
    /// begins.
    pub(super) fn service_http(&mut self, k: usize) {
        let now_ms = self.now_ms();
        let Some(Entry::Http(h)) = self.entries.get_mut(k) else {
            return;
        };
        let input = h.read();
        match (&input, &h.state) {
            (Input::Gone, _) | (Input::Eof, HttpState::Closing | HttpState::Streaming) => {
                return self.remove_entry(k)
            }
            (_, HttpState::Reading) => {}
            // Still to answer, or answering: a client that shut its side still reads.
            _ => return,
        }
        let (status, reason, head) = match parse(&h.inbuf) {
            // The request never ended.
            Parsed::NeedMore if matches!(input, Input::Eof) => return self.remove_entry(k),
            Parsed::NeedMore => return,
            Parsed::Get {
                path: path @ ("/metrics" | "/status.json"),
                head,
            } => {
                let body = match path {
                    "/metrics" => Body::Metrics(Box::new(Exposition::sized(&self.scrape_sizes))),
                    _ => Body::Json(super::status_page::json_start(&self.node_name, now_ms)),
                };
                h.state = HttpState::Building(Box::new(Building {
                    body,
                    next: 0,
                    spent: Duration::ZERO,
                    longest: Duration::ZERO,
                    head,
                }));
                h.inbuf = Vec::new();
                self.scrapes.push(k);
                return;
            }
            Parsed::Get {
                path: "/events",
                head,
            } => {
                let answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n".to_vec();
                h.answer(answer, vec![b": tandem events\n\n".to_vec()], head);
                h.inbuf = Vec::new();
                if !head {
                    h.state = HttpState::Streaming;
                    h.deadline = Instant::now() + STREAM_TIMEOUT;
                    self.watch_http(k);
                }
                return self.mark_dirty(k);
            }
            Parsed::Get { path: "/", head } => {
                let page = super::status_page::PAGE.as_bytes().to_vec();
                let answer = self::head(200, "OK", "text/html; charset=utf-8", page.len());
                h.answer(answer, vec![page], head);
                h.inbuf = Vec::new();
                return self.mark_dirty(k);
            }
            Parsed::Get { head, .. } => (404, "Not Found", head),
            Parsed::Error(status, reason) => (status, reason, false),
        };
        debug!(client = %h.peer, "metrics: {status} {reason}");
        let (answer, body) = error_response(status, reason);
        h.answer(answer, vec![body], head);
        h.inbuf = Vec::new();
        self.mark_dirty(k);
    }

    /// Every scrape under way takes its next `CHUNK` resources (a finished one is queued
    /// to be sent); every answer being sent, its next `WRITE_PER_ROUND` bytes.
    pub(super) fn advance_scrapes(&mut self) {
        for k in std::mem::take(&mut self.scrapes) {
            let Some(Entry::Http(h)) = self.entries.get_mut(k) else {
                continue;
            };
            let mut b = match std::mem::replace(&mut h.state, HttpState::Writing) {
                HttpState::Building(b) => b,
                other => {
                    // An answer larger than a round's share: the next share.
                    h.state = other;
                    self.mark_dirty(k);
                    continue;
                }
            };
            let began = thread_cpu();
            let total = self.res.len() + self.not_attached.len();
            let end = (b.next + CHUNK).min(total);
            for i in b.next..end {
                match &mut b.body {
                    Body::Metrics(expo) => self.add_to_scrape(expo, i),
                    Body::Json(json) => self.add_to_json(json, i),
                }
            }
            b.next = end;
            if end < total {
                let took = thread_cpu().saturating_sub(began);
                b.spent += took;
                b.longest = b.longest.max(took);
                if let Some(Entry::Http(h)) = self.entries.get_mut(k) {
                    h.state = HttpState::Building(b);
                    self.scrapes.push(k);
                }
                continue;
            }
            let Building {
                body,
                spent,
                longest,
                head: head_only,
                ..
            } = *b;
            let (body, kind) = match body {
                Body::Metrics(expo) => {
                    self.scrape_sizes = expo.sizes();
                    let text = expo.finish(self.last_scrape_build);
                    (text, "text/plain; version=0.0.4; charset=utf-8")
                }
                Body::Json(mut json) => {
                    json.extend_from_slice(b"]}");
                    (vec![json], "application/json")
                }
            };
            let took = thread_cpu().saturating_sub(began);
            let spent = spent + took;
            let longest = longest.max(took);
            let length = body.iter().map(Vec::len).sum();
            if kind.starts_with("text/plain") {
                self.last_scrape_build = spent;
            }
            debug!("{kind}: {total} resources, {length} bytes, built in {spent:?}, {longest:?} in the longest round");
            let answer = head(200, "OK", kind, length);
            if let Some(Entry::Http(h)) = self.entries.get_mut(k) {
                h.answer(answer, body, head_only);
                self.mark_dirty(k);
            }
        }
    }

    /// Resource `i` of the node (the running ones, then those not attached) into `expo`.
    fn add_to_scrape(&self, expo: &mut Exposition, i: usize) {
        if self
            .res
            .get(i)
            .is_some_and(|r| r.presence == Presence::Gone)
        {
            return; // stopped by `tandem adjust`
        }
        let Some(res) = self.res.get(i) else {
            let st = self.not_attached_status(i - self.res.len());
            return expo.resource(&st, &ResourceCounters::default());
        };
        let st = self.resource_status(i);
        let counters = ResourceCounters {
            volumes: res.stats.volumes.clone(),
            peers: (res.peers.iter())
                .map(|p| PeerCounters {
                    bytes: p.stats.bytes.clone(),
                    round_trips: Some(&p.stats.round_trips),
                })
                .collect(),
            io: Some(&res.stats.io),
            suspends_without_quorum: res.cfg.quorum.on_no_quorum == OnNoQuorum::SuspendIo,
        };
        expo.resource(&st, &counters);
    }

    /// Sends what connection `k` has queued; true once it is to be removed.
    pub(super) fn flush_http(&mut self, k: usize) -> bool {
        let Some(Entry::Http(h)) = self.entries.get_mut(k) else {
            return false;
        };
        h.dirty = false;
        let more = h.flush();
        if h.gone {
            return true;
        }
        if more && !self.scrapes.contains(&k) {
            self.scrapes.push(k);
        }
        let want_write = h.out_pending();
        if want_write != h.write_interest {
            let interest = if want_write {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            let _ = (self.poll.registry()).reregister(&mut h.stream, MioToken(k), interest);
            h.write_interest = want_write;
        }
        false
    }

    /// Connections past their time (a client that never finished its request, or never
    /// read or closed after the answer) are closed.
    pub(super) fn expire_http(&mut self) {
        let now = Instant::now();
        let late: Vec<usize> = (self.entries.iter())
            .filter(|(_, e)| matches!(e, Entry::Http(h) if h.deadline <= now))
            .map(|(k, _)| k)
            .collect();
        for k in late {
            if let Some(Entry::Http(h)) = self.entries.get(k) {
                debug!(client = %h.peer, "metrics: connection timed out; closed");
            }
            self.remove_entry(k);
        }
    }

    /// A local disk operation of resource `r` ended: read and written bytes counted.
    pub(super) fn count_disk(&mut self, r: usize, volume: u16, kind: DiskKind, ok: bool) {
        let Some(v) = self.res[r].stats.volumes.get_mut(usize::from(volume)) else {
            return;
        };
        match kind {
            DiskKind::Read { len, .. } if ok => v.read_bytes += u64::from(len),
            DiskKind::Write { len, .. } if ok => v.written_bytes += u64::from(len),
            _ => {}
        }
    }

    /// An application request of resource `r` was answered.
    pub(super) fn count_request(&mut self, r: usize, op: Option<Op>, arrived: Instant) {
        if let Some(op) = op {
            self.res[r].stats.io[op as usize].observe(arrived.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_whole_and_judged_by_their_first_line() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
            Parsed::NeedMore
        );
        assert_eq!(
            parse(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"),
            Parsed::Get {
                path: "/metrics",
                head: false
            }
        );
        assert_eq!(
            parse(b"HEAD / HTTP/1.0\n\n"),
            Parsed::Get {
                path: "/",
                head: true
            }
        );
        for bad in [
            &b"GET /metrics\r\n\r\n"[..],
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/2\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"\x00\xff\xfe garbage\n\n",
            b"get /metrics HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse(bad), Parsed::Error(400, "Bad Request"), "{bad:?}");
        }
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Parsed::Error(405, "Method Not Allowed")
        );
        let huge = vec![b'A'; REQUEST_MAX + 1];
        assert_eq!(
            parse(&huge),
            Parsed::Error(431, "Request Header Fields Too Large")
        );
    }

    #[test]
    fn round_trips_pair_each_write_with_its_acknowledgement() {
        let mut p = PeerStats::new(1);
        let t = Instant::now();
        p.write_sent(1, t);
        p.write_sent(2, t);
        p.acked(2, t + Duration::from_micros(100));
        p.acked(2, t + Duration::from_micros(200)); // a second ack of it: not counted
        p.acked(1, t + Duration::from_millis(1));
        assert_eq!(p.round_trips.count(), 2);
        assert_eq!(p.round_trips.sum(), Duration::from_micros(1100));
        for s in 0..ROUND_TRIPS_KEPT as u64 + 10 {
            p.write_sent(s, t);
        }
        assert_eq!(p.unacked.len(), ROUND_TRIPS_KEPT);
    }
}
