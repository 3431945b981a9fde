//! What the kernel knows of a peer connection that the protocol cannot tell: whether the
//! peer's host acknowledges the bytes we send it (TCP `TCP_INFO`). A peer process that is
//! busy or stopped answers nothing, yet its kernel acknowledges what arrives; a dead host
//! or a cut network acknowledges nothing. The engine judges a peer that owes answers by
//! the request timeout (a slow disk is not a dead node); this lets it still drop one whose
//! host fell silent within the ping timeout (`Resource::transport_silent`).

use crate::listener::Stream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long bytes we sent on one connection have waited with none acknowledged.
#[derive(Debug, Default)]
pub struct AckWatch {
    /// When we first saw bytes in flight, none acknowledged since (at our ticks).
    since: Option<Instant>,
    /// Bytes were written since the kernel last said nothing was in flight: only then is
    /// there anything to ask it (an idle node with 1000 resources spent 11 % of a core on
    /// `TCP_INFO` at every tick for every connection).
    sent: bool,
}

impl AckWatch {
    /// Bytes went out on the connection.
    pub fn sent(&mut self) {
        self.sent = true;
    }

    /// Reads the socket's TCP state now: `None` with nothing in flight (or not TCP), else
    /// how long the oldest bytes in flight have waited without any acknowledgement (the
    /// time since the last one the kernel received, but no longer than we have seen bytes
    /// in flight: an idle link's last acknowledgement is old news).
    pub fn silent_for(&mut self, stream: &Stream, now: Instant) -> Option<Duration> {
        let s = stream.tcp_socket()?;
        if self.since.is_none() && !self.sent {
            return None;
        }
        self.sent = false;
        let info = tcp_info(s.as_raw_fd())?;
        if info.tcpi_unacked == 0 {
            self.since = None;
            return None;
        }
        let since = *self.since.get_or_insert(now);
        let last_ack = Duration::from_millis(u64::from(info.tcpi_last_ack_recv));
        Some(last_ack.min(now.saturating_duration_since(since)))
    }
}

fn tcp_info(fd: std::os::fd::RawFd) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain data (zeroes are a valid value), and getsockopt writes at
    // most `len` bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

impl super::state::NodeReactor {
    /// At every tick: each session's peer whose host acknowledged nothing for a while is
    /// told to its engine, which drops it past the ping timeout.
    pub(super) fn check_transports(&mut self) {
        let now = Instant::now();
        let mut silent = Vec::new();
        for (k, e) in self.entries.iter_mut() {
            let super::state::Entry::Peer(pc) = e else {
                continue;
            };
            let (Some(peer), false) = (pc.peer, pc.dead) else {
                continue;
            };
            if let Some(d) = pc.acks.silent_for(&pc.stream, now) {
                silent.push((pc.res, k, peer, d));
            }
        }
        for (r, k, peer, d) in silent {
            let bound = self.res[r]
                .peers
                .iter()
                .any(|s| s.id == peer && s.conn == Some(k));
            if bound {
                let mut actions = Vec::new();
                let ms = d.as_millis() as u64;
                self.res[r].engine.transport_silent(peer, ms, &mut actions);
                self.run_actions(r, actions, super::state::Ctx::default());
            }
        }
    }
}
