//! A control-socket connection: newline-delimited JSON requests in, one JSON answer per
//! line out, written as the socket accepts it.

use crate::control_api::Answer;
use std::io::{self, Read, Write};

pub struct ControlConn {
    pub stream: mio::net::UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Bytes of `out` already sent (a large answer goes out over many writes).
    sent: usize,
    pub dirty: bool,
    /// The loop watches the socket for room to write: an answer is still queued.
    pub write_interest: bool,
    eof: bool,
    /// It watches the events stream with the counters (`tandem events --statistics`).
    pub statistics: bool,
}

impl ControlConn {
    pub fn new(stream: mio::net::UnixStream) -> ControlConn {
        ControlConn {
            stream,
            inbuf: Vec::new(),
            out: Vec::new(),
            sent: 0,
            dirty: false,
            write_interest: false,
            eof: false,
            statistics: false,
        }
    }

    /// Complete lines received so far (a request is at most 64 KiB).
    pub fn read_lines(&mut self) -> Vec<String> {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.eof = true;
                    break;
                }
            }
            if self.inbuf.len() > 64 << 10 {
                self.inbuf.clear();
                self.queue(&Answer::refused("request too long"));
                self.eof = true;
                break;
            }
        }
        let mut lines = Vec::new();
        while let Some(i) = self.inbuf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.inbuf.drain(..=i).collect();
            lines.push(String::from_utf8_lossy(&line).trim().to_string());
        }
        lines.retain(|l| !l.is_empty());
        lines
    }

    pub fn queue(&mut self, answer: &Answer) {
        self.queue_json(answer);
    }

    /// One JSON line (an answer, or a line of the events stream).
    pub fn queue_json(&mut self, value: &impl serde::Serialize) {
        let line = serde_json::to_string(value).expect("a control line serializes");
        self.out.extend_from_slice(line.as_bytes());
        self.out.push(b'\n');
    }

    /// Bytes queued and not sent yet.
    pub fn backlog(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Nothing more is read from it: it ends once what is queued is sent.
    pub fn finish(&mut self) {
        self.eof = true;
    }

    /// An answer is queued that the socket has not taken yet.
    pub fn out_pending(&self) -> bool {
        self.sent < self.out.len()
    }

    /// Sends what is queued, until the socket is full (the rest waits for the loop to see
    /// it writable again: `write_interest`); true once the client is gone and nothing is
    /// left to send.
    pub fn flush_and_finished(&mut self) -> bool {
        while self.out_pending() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => return true,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        self.out.clear();
        self.sent = 0;
        self.eof
    }
}
