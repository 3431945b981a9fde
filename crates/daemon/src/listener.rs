//! Listening sockets (TCP and Unix) and the byte streams they accept.

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use std::io::{self, Read, Write};
use std::path::PathBuf;

use crate::tls::TlsSession;

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept()?;
                // Replies are batched by the event loop already; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok((Stream::tcp(s), addr.to_string()))
            }
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                Ok((Stream::unix(s), format!("unix:{}", path.display())))
            }
        }
    }

    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Listener::Tcp(l) => l,
            Listener::Unix(l, _) => l,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A connected socket, plain.
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write_vectored(bufs),
            Socket::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A client's or peer's byte stream: a socket, in the clear or under TLS once
/// [`Stream::start_tls`] wrapped it (`crate::tls`). Reads and writes carry plaintext either
/// way; the readiness rules of the event loops hold for both (see `crate::tls`).
pub struct Stream {
    sock: Socket,
    tls: Option<Box<TlsSession>>,
}

impl Stream {
    pub fn tcp(s: TcpStream) -> Stream {
        Stream {
            sock: Socket::Tcp(s),
            tls: None,
        }
    }

    pub fn unix(s: UnixStream) -> Stream {
        Stream {
            sock: Socket::Unix(s),
            tls: None,
        }
    }

    /// The TCP socket underneath, if it is one (TLS or not).
    pub fn tcp_socket(&self) -> Option<&TcpStream> {
        match &self.sock {
            Socket::Tcp(s) => Some(s),
            Socket::Unix(_) => None,
        }
    }

    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        match &mut self.sock {
            Socket::Tcp(s) => s,
            Socket::Unix(s) => s,
        }
    }

    /// Runs TLS over this socket from now on. `clear` is sent in the clear first (what was
    /// queued before TLS began: NBD's ACK to STARTTLS); `received` are bytes already read
    /// from the socket that belong to TLS.
    pub fn start_tls(&mut self, conn: rustls::Connection, clear: Vec<u8>, received: &[u8]) {
        self.tls = Some(Box::new(TlsSession::new(conn, clear, received)));
    }

    /// [`Stream::start_tls`] on a peer link: the peer's first bytes may be a refusal in the
    /// clear instead of TLS (`crate::tls::not_tls`).
    pub fn start_tls_peer(&mut self, conn: rustls::Connection, clear: Vec<u8>, received: &[u8]) {
        let mut t = Box::new(TlsSession::new(conn, clear, received));
        t.sniff_clear();
        self.tls = Some(t);
    }

    pub fn tls(&self) -> Option<&TlsSession> {
        self.tls.as_deref()
    }

    /// Bytes that must still go out on the socket below the plaintext the caller queues
    /// (TLS records, handshake messages, alerts): the socket must be watched for room
    /// while there are.
    pub fn output_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.output_pending())
    }

    /// Input the caller has not seen although the socket may be drained (a read came back
    /// short with the end of the stream behind it): read again without waiting for an event.
    pub fn input_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.input_pending())
    }

    /// Watches the socket for input, and for room to write too while `writable` (replies
    /// stuck behind a full socket): with writability always watched, every reply the other
    /// side reads would wake the loop once more.
    pub fn watch(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        writable: bool,
    ) -> io::Result<()> {
        let interest = if writable {
            mio::Interest::READABLE | mio::Interest::WRITABLE
        } else {
            mio::Interest::READABLE
        };
        registry.reregister(self.source(), token, interest)
    }

    /// Writes `out[*pos..]` until it is all sent (then clears `out`) or the socket is full;
    /// under TLS, also what TLS still holds (see [`Stream::output_pending`]).
    pub fn write_queued(&mut self, out: &mut Vec<u8>, pos: &mut usize) -> io::Result<()> {
        while *pos < out.len() {
            match self.write(&out[*pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => *pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        out.clear();
        *pos = 0;
        if let Some(t) = &mut self.tls {
            t.flush(&mut self.sock)?;
        }
        Ok(())
    }

    /// Closes the connection: under TLS a close_notify first, if the socket takes it.
    pub fn shutdown(&mut self) {
        if let Some(t) = &mut self.tls {
            t.close(&mut self.sock);
        }
        let _ = match &self.sock {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(t) => t.read(&mut self.sock, buf),
            None => self.sock.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(t) => t.write(&mut self.sock, buf),
            None => self.sock.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
