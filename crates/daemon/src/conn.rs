//! One client connection: its socket, its buffers and where it is in the protocol.

use crate::bufpool::DataBuf;
use crate::listener::Stream;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::Instant;
use tandem_frontend::nbd::{Handshake, Request, RequestDecoder};

/// Requests one connection may have in flight before we stop reading from it.
pub const MAX_IN_FLIGHT: u32 = 512;
/// Reply bytes queued for one connection before we stop reading from it.
pub const MAX_QUEUED_OUT: usize = 16 << 20;
const INITIAL_IN: usize = 256 << 10;

/// A large write whose payload is read straight into its own buffer.
pub struct Streaming {
    pub req: Request,
    pub buf: DataBuf,
    pub filled: usize,
}

impl Streaming {
    pub fn complete(&self) -> bool {
        self.filled == self.buf.len()
    }
}

pub enum Phase {
    Handshake(Handshake),
    Transmission {
        volume: usize,
        decoder: RequestDecoder,
        structured: bool,
    },
}

pub struct Conn {
    pub stream: Stream,
    /// "peer-address#id", used in every log line about this client.
    pub name: String,
    pub phase: Phase,
    pub inbuf: Vec<u8>,
    pub in_start: usize,
    pub in_end: usize,
    /// Bytes the decoder needs before it can make progress.
    pub need: usize,
    pub out: Vec<u8>,
    pub out_pos: usize,
    pub in_flight: u32,
    /// The client closed its sending side; what is buffered is still served.
    pub eof: bool,
    /// No more requests will be taken (DISC, protocol error, truncated stream, shutdown).
    pub read_closed: bool,
    /// The socket failed: nothing more can be sent; the connection goes once idle.
    pub dead: bool,
    /// Edge-triggered readiness: the socket may hold unread bytes.
    pub readable: bool,
    /// Registered for writability because replies could not all be sent.
    pub write_interest: bool,
    pub deregistered: bool,
    pub handshake_deadline: Option<Instant>,
    /// Queued on the reactor's list of connections with replies to send.
    pub dirty: bool,
    pub streaming: Option<Streaming>,
    /// The volume was taken from this client (`tandem secondary --force`): every request
    /// it has in flight or sends later is answered EIO.
    pub fenced: bool,
    /// The listener's TLS, if it offers it: used when the client sends STARTTLS.
    tls: Option<Arc<rustls::ServerConfig>>,
}

pub enum ReadOutcome {
    Data,
    WouldBlock,
    Eof,
    Error(io::Error),
}

impl Conn {
    pub fn new(
        stream: Stream,
        name: String,
        deadline: Instant,
        tls: Option<&crate::tls::NbdTls>,
    ) -> Conn {
        let mut out = Vec::with_capacity(64 << 10);
        Handshake::greeting(&mut out);
        let mode = tls.map_or(Default::default(), |t| t.mode);
        Conn {
            stream,
            name,
            phase: Phase::Handshake(Handshake::with_tls(mode)),
            inbuf: vec![0; INITIAL_IN],
            in_start: 0,
            in_end: 0,
            need: 0,
            out,
            out_pos: 0,
            in_flight: 0,
            eof: false,
            read_closed: false,
            dead: false,
            readable: true,
            write_interest: false,
            deregistered: false,
            handshake_deadline: Some(deadline),
            dirty: true,
            streaming: None,
            fenced: false,
            tls: tls.map(|t| t.config.clone()),
        }
    }

    /// The handshake accepted STARTTLS (`HandshakeStep::StartTls`): what is queued (the
    /// ACK) goes out in the clear, everything after is TLS, and bytes the client already
    /// sent past its STARTTLS are TLS too.
    pub fn start_tls(&mut self) -> io::Result<()> {
        let config = self
            .tls
            .as_ref()
            .expect("the handshake accepts STARTTLS only where TLS is configured");
        let conn = crate::tls::server_connection(config)?;
        let clear = self.out.split_off(self.out_pos);
        self.out.clear();
        self.out_pos = 0;
        let received = self.input().to_vec();
        self.consume(received.len());
        if !received.is_empty() {
            self.readable = true;
        }
        self.stream.start_tls(conn, clear, &received);
        Ok(())
    }

    /// "TLSv1_3 ..." on a connection that started TLS, for its log lines.
    pub fn tls_description(&self) -> Option<String> {
        self.stream.tls().map(|t| t.describe())
    }

    /// Unprocessed input.
    pub fn input(&self) -> &[u8] {
        &self.inbuf[self.in_start..self.in_end]
    }

    pub fn consume(&mut self, n: usize) {
        self.in_start += n;
        debug_assert!(self.in_start <= self.in_end);
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        }
    }

    /// Whether requests may be taken from this connection now (limits not reached).
    pub fn has_room(&self) -> bool {
        !self.read_closed
            && !self.dead
            && self.in_flight < MAX_IN_FLIGHT
            && self.out.len() - self.out_pos < MAX_QUEUED_OUT
    }

    /// Whether to read more from the socket now.
    pub fn wants_input(&self) -> bool {
        self.has_room() && self.readable && !self.eof
    }

    /// Reads once from the socket: into a streamed write's buffer while one is open,
    /// otherwise into the input buffer, making room as needed.
    pub fn read_some(&mut self) -> ReadOutcome {
        if let Some(st) = self.streaming.as_mut().filter(|st| !st.complete()) {
            let room = st.buf.len() - st.filled;
            return match self.stream.read(&mut st.buf[st.filled..]) {
                Ok(0) => ReadOutcome::Eof,
                Ok(n) => {
                    st.filled += n;
                    if n < room && !self.stream.input_pending() {
                        self.readable = false;
                    }
                    ReadOutcome::Data
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReadOutcome::WouldBlock,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => ReadOutcome::Data,
                Err(e) => ReadOutcome::Error(e),
            };
        }
        let want = self.need.max(4096);
        let len = self.inbuf.len();
        if self.in_start > 0 && (len - self.in_start < want || len - self.in_end < 4096) {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        if self.inbuf.len() < want {
            // A large write: grow so the whole request fits (the decoder caps `need` at a
            // header plus the largest payload we accept).
            self.inbuf.resize(want.next_multiple_of(64 << 10), 0);
        }
        let room = self.inbuf.len() - self.in_end;
        match self.stream.read(&mut self.inbuf[self.in_end..]) {
            Ok(0) => ReadOutcome::Eof,
            Ok(n) => {
                self.in_end += n;
                // A read that did not fill the buffer emptied the socket; anything arriving
                // later raises a new edge, so the EAGAIN read that would confirm it is saved.
                if n < room && !self.stream.input_pending() {
                    self.readable = false;
                }
                ReadOutcome::Data
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReadOutcome::WouldBlock,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => ReadOutcome::Data,
            Err(e) => ReadOutcome::Error(e),
        }
    }

    /// Shrinks an input buffer that grew for one large write, once it is empty again.
    pub fn maybe_shrink(&mut self) {
        if self.in_end == 0 && self.inbuf.len() > 4 * INITIAL_IN {
            self.inbuf = vec![0; INITIAL_IN];
        }
    }

    /// Replies queued, or TLS records not yet sent.
    pub fn out_pending(&self) -> bool {
        self.out_pos < self.out.len() || self.stream.output_pending()
    }

    /// Writes queued replies until done or the socket is full. Returns false on a socket
    /// error (the connection is then dead).
    pub fn flush_out(&mut self) -> io::Result<()> {
        self.stream.write_queued(&mut self.out, &mut self.out_pos)?;
        if self.out.is_empty() && self.out.capacity() > MAX_QUEUED_OUT {
            self.out.shrink_to(64 << 10);
        }
        Ok(())
    }

    /// Whether everything is done and the connection can be dropped.
    pub fn finished(&self) -> bool {
        self.in_flight == 0 && (self.dead || (self.read_closed && !self.out_pending()))
    }
}
