//! One replication address for several resources of a node: the caller's `Hello` names the
//! resource it wants (the handshake always said it; see `tandem_wire::handshake`), so a
//! connection accepted on a shared address waits for that frame, peeking at it without
//! taking it, and then becomes that resource's peer connection, whose handshake reads the
//! `Hello` as on a port of its own. The listening side speaks second, so it may wait. An
//! address used by one resource only skips this and works as before.

use super::state::{Entry, NodeReactor, HANDSHAKE_TIMEOUT};
use crate::listener::Stream;
use mio::{Interest, Token as MioToken};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Instant;
use tandem_wire::handshake::{
    hello_resource, refusal, ERR_PROTOCOL, ERR_RESOURCE, MAX_HANDSHAKE_BODY,
};
use tracing::{debug, info};

/// A caller on a shared address, before its `Hello`.
pub(super) struct Routing {
    pub(super) stream: mio::net::TcpStream,
    pub(super) addr: SocketAddr,
    /// The resources listening on that address.
    pub(super) res: Vec<usize>,
    /// A caller that says nothing is let go then.
    pub(super) deadline: Instant,
}

impl NodeReactor {
    pub(super) fn route_peer_later(
        &mut self,
        mut s: mio::net::TcpStream,
        addr: SocketAddr,
        res: Vec<usize>,
    ) {
        let key = self.entries.vacant_key();
        if let Err(e) = (self.poll.registry()).register(&mut s, MioToken(key), Interest::READABLE) {
            return debug!(peer = %addr, "cannot register a peer connection: {e}");
        }
        self.entries.insert(Entry::PeerRouting(Box::new(Routing {
            stream: s,
            addr,
            res,
            deadline: Instant::now() + HANDSHAKE_TIMEOUT,
        })));
        self.route_peer(key);
    }

    /// The caller's first frame, if whole, decides which resource it is for.
    pub(super) fn route_peer(&mut self, k: usize) {
        let Some(Entry::PeerRouting(c)) = self.entries.get_mut(k) else {
            return;
        };
        let mut buf = vec![0u8; tandem_wire::HEADER_LEN + MAX_HANDSHAKE_BODY as usize];
        let n = match c.stream.peek(&mut buf) {
            Ok(0) => return self.remove_entry(k),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => {
                debug!(peer = %c.addr, "connection failed before its Hello: {e}");
                return self.remove_entry(k);
            }
        };
        let asked = match hello_resource(&buf[..n]) {
            Ok(None) => return,
            Ok(Some(name)) => name,
            Err(e) => {
                let why = format!("protocol violation: {e}");
                debug!(peer = %c.addr, "refused on a shared replication address: {why}");
                return self.refuse_routing(k, ERR_PROTOCOL, &why);
            }
        };
        let found = (c.res.iter().copied()).find(|&r| self.res[r].cfg.name == asked);
        let Some(r) = found else {
            let serves: Vec<&str> = c
                .res
                .iter()
                .map(|&r| self.res[r].cfg.name.as_str())
                .collect();
            let why = format!(
                "resource mismatch: the caller asked for resource {asked:?}, this address serves {}",
                serves.join(", ")
            );
            info!(peer = %c.addr, "refused: {why}");
            return self.refuse_routing(k, ERR_RESOURCE, &why);
        };
        let Some(Entry::PeerRouting(mut c)) = self.entries.try_remove(k) else {
            unreachable!("matched above");
        };
        let _ = self.poll.registry().deregister(&mut c.stream);
        self.new_peer_conn(r, Stream::tcp(c.stream), c.addr.to_string(), None);
    }

    /// Says why (as a handshake's `Error` would, best effort: the packet is small and the
    /// socket's buffer empty), then closes.
    fn refuse_routing(&mut self, k: usize, code: u32, why: &str) {
        if let Some(Entry::PeerRouting(c)) = self.entries.get_mut(k) {
            let mut out = Vec::new();
            refusal(code, why, &mut out);
            let _ = c.stream.write(&out);
        }
        self.remove_entry(k);
    }
}
