//! Listening sockets (TCP and Unix) and the byte streams they accept.

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use std::io::{self, Read, Write};
use std::path::PathBuf;

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
                Ok((Stream::Tcp(s), addr.to_string()))
            }
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                Ok((Stream::Unix(s), format!("unix:{}", path.display())))
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

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
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

    /// Writes `out[*pos..]` until it is all sent (then clears `out`) or the socket is full.
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
        Ok(())
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
