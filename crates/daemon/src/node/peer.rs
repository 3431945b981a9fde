//! A connection to another node of a resource: authenticating handshake, then packets.

use crate::listener::Stream;
use std::io::{self, Read};
use tandem_engine::replica::NodeId;
use tandem_wire::handshake::PeerHandshake;

pub struct PeerConn {
    pub stream: Stream,
    pub res: usize,
    /// "address#id (node N)" for logs.
    pub name: String,
    /// Until the handshake ends.
    pub hs: Option<PeerHandshake>,
    /// The authenticated peer.
    pub peer: Option<NodeId>,
    /// Set for connections we dialed: the node we meant to reach.
    pub dialed: Option<NodeId>,
    /// The node id the peer's Hello claimed (for status if authentication then fails).
    pub claimed: Option<NodeId>,
    pub inbuf: Vec<u8>,
    pub in_start: usize,
    pub in_end: usize,
    pub need: usize,
    pub out: Vec<u8>,
    pub out_pos: usize,
    pub dead: bool,
    pub readable: bool,
    pub write_interest: bool,
    pub dirty: bool,
    /// Still connecting (an outgoing connection not yet writable).
    pub connecting: bool,
    /// Connect and authentication must be done by then: a SYN lost to a cut link would
    /// otherwise stay pending for as long as the kernel retries (minutes), and an accepted
    /// connection that never speaks would hold its slot forever.
    pub deadline: Option<std::time::Instant>,
    /// Why the socket failed before a session began (for the dialer's status line).
    pub failure: Option<String>,
    /// Whether the peer's host acknowledges what we send (see `transport.rs`).
    pub acks: super::transport::AckWatch,
    /// The features both ends offered (`tandem_wire::features`), once authenticated.
    pub features: u64,
}

/// A connection's input buffer starts small and doubles while reads fill it, up to
/// `GROWN_IN`: an idle link holds 16 KiB, not 256 (a node with 1000 resources held about
/// 400 MiB, most of it these buffers, once the allocator zeroed them from its heap), while
/// a busy one reads a quarter MiB a call as before. One grown past `SHRINK_ABOVE` for a
/// large packet goes back to the start once drained; a link carrying 1 MiB writes keeps
/// its buffer (it used to be freed and zeroed again for every such write).
const INITIAL_IN: usize = 16 << 10;
const GROWN_IN: usize = 256 << 10;
const SHRINK_ABOVE: usize = 4 << 20;

impl PeerConn {
    pub fn new(
        stream: Stream,
        res: usize,
        name: String,
        hs: PeerHandshake,
        greeting: Vec<u8>,
        dialed: Option<NodeId>,
        deadline: std::time::Instant,
    ) -> PeerConn {
        PeerConn {
            stream,
            res,
            name,
            hs: Some(hs),
            peer: None,
            dialed,
            claimed: None,
            inbuf: vec![0; INITIAL_IN],
            in_start: 0,
            failure: None,
            in_end: 0,
            need: 0,
            out: greeting,
            out_pos: 0,
            dead: false,
            readable: true,
            write_interest: false,
            dirty: true,
            connecting: dialed.is_some(),
            deadline: Some(deadline),
            acks: Default::default(),
            features: 0,
        }
    }

    /// Reads once into the input buffer, growing it for a large packet. `Ok(0)` is EOF.
    pub fn read_some(&mut self) -> io::Result<usize> {
        let want = self.need.max(4096);
        if self.in_start > 0
            && (self.inbuf.len() - self.in_start < want || self.inbuf.len() - self.in_end < 4096)
        {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        if self.inbuf.len() < want {
            self.inbuf.resize(want.next_multiple_of(64 << 10), 0);
        }
        let room = self.inbuf.len() - self.in_end;
        let n = self.stream.read(&mut self.inbuf[self.in_end..])?;
        self.in_end += n;
        // Under TLS a short read drained the socket too, unless the end of the stream is
        // behind the plaintext it returned (`crate::tls`).
        if n > 0 && n < room && !self.stream.input_pending() {
            self.readable = false;
        }
        if n == room && self.inbuf.len() < GROWN_IN {
            let len = (self.inbuf.len() * 2).min(GROWN_IN);
            self.inbuf.resize(len, 0);
        }
        Ok(n)
    }

    pub fn advance(&mut self, n: usize) {
        self.in_start += n;
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
            if self.inbuf.len() > SHRINK_ABOVE {
                self.inbuf = vec![0; INITIAL_IN];
            }
        }
    }

    /// Bytes queued for sending.
    pub fn queued(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Bytes queued, or TLS records not yet sent.
    pub fn out_pending(&self) -> bool {
        self.out_pos < self.out.len() || self.stream.output_pending()
    }

    pub fn flush_out(&mut self) -> io::Result<()> {
        let queued = self.queued();
        let result = self.stream.write_queued(&mut self.out, &mut self.out_pos);
        if self.queued() < queued {
            self.acks.sent();
        }
        result
    }
}
