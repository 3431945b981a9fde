//! Peer connections: accepting and dialing (`links` decides when), the handshake, binding
//! an authenticated connection to its resource, packets into the engine, a connection's
//! end, and split brain reports.

use super::links::Attempt;
use super::peer::PeerConn;
use super::repeats::{human, Repeats};
use super::setup::{connect_from, random_challenge};
use super::state::*;
use crate::listener::Stream;
use mio::{Interest, Token as MioToken};
use std::io;
use std::time::Instant;
use tandem_engine::driver::SplitBrain;
use tandem_engine::replica::{Event, NodeId};
use tandem_wire::handshake::{
    HandshakeConfig, HandshakeError, HandshakeStep as PeerStep, PeerHandshake, PeerTls,
};
use tandem_wire::packet::{Decoded as Frame, Packet};
use tracing::{debug, error, info, warn};

/// An error of a TLS stream that TLS itself raised (or clear bytes where TLS should be).
fn tls_failure(e: &io::Error) -> bool {
    crate::tls::failure(e).is_some() || crate::tls::not_tls(e).is_some()
}

impl NodeReactor {
    pub(super) fn accept_peer(&mut self, k: usize) {
        loop {
            let Some(Entry::PeerListener { res, l }) = self.entries.get(k) else {
                return;
            };
            let (s, addr) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("peer accept failed: {e}"),
            };
            let _ = s.set_nodelay(true);
            match res[..] {
                [r] => {
                    self.new_peer_conn(r, Stream::tcp(s), format!("{addr}"), None);
                }
                _ => {
                    let res = res.clone();
                    self.route_peer_later(s, addr, res);
                }
            }
        }
    }

    pub(super) fn new_peer_conn(
        &mut self,
        r: usize,
        mut stream: Stream,
        addr: String,
        dialed: Option<NodeId>,
    ) -> Option<usize> {
        let res = &self.res[r];
        let cfg = HandshakeConfig {
            me: res.me,
            resource: res.cfg.name.clone(),
            secret: res.cfg.secret.clone(),
            allowed_peers: res.peers.iter().map(|p| p.id).collect(),
            expect: dialed,
            features: tandem_wire::features::SYNC_PROGRESS,
            standalone_towards: res
                .peers
                .iter()
                .filter(|p| !p.wanted)
                .map(|p| p.id)
                .collect(),
        };
        let challenge = match random_challenge() {
            Ok(c) => c,
            Err(e) => {
                error!(resource = %res.cfg.name, "no random bytes for a handshake challenge ({e}); not connecting");
                return None;
            }
        };
        let mut greeting = Vec::new();
        let tls = res.peer_tls.as_ref().map_or(PeerTls::Off, |t| t.mode);
        let hs = PeerHandshake::with_tls(cfg, tls, challenge, &mut greeting);
        let key = self.entries.vacant_key();
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .poll
            .registry()
            .register(stream.source(), MioToken(key), interest)
        {
            warn!("cannot register peer connection: {e}");
            return None;
        }
        self.next_conn_id += 1;
        let name = format!("{addr}#{}", self.next_conn_id);
        let net = &self.res[r].cfg.net;
        // A dial gives up after the retry interval (at least a second, at most
        // `timeout`), so attempts keep the configured pace whatever the kernel does.
        let patience = match dialed.and_then(|d| self.res[r].peers.iter().find(|p| p.id == d)) {
            Some(slot) => slot.link.patience().min(net.timeout),
            None => net.timeout,
        };
        let deadline = Instant::now() + patience;
        let mut pc = PeerConn::new(stream, r, name, hs, greeting, dialed, deadline);
        pc.write_interest = true;
        self.entries.insert(Entry::Peer(Box::new(pc)));
        self.dirty.push(key);
        Some(key)
    }

    pub(super) fn service_peer(&mut self, k: usize) {
        loop {
            self.process_peer(k);
            let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
                return;
            };
            if pc.dead || !pc.readable {
                break;
            }
            match pc.read_some() {
                Ok(0) => {
                    debug!(peer = %pc.name, "connection closed by the peer");
                    // What arrived before the close (often an Error saying why) counts.
                    self.process_peer(k);
                    if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                        pc.dead = true;
                    }
                    break;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    pc.readable = false;
                    // The read may have brought TLS up without plaintext: the handshake
                    // goes on now (our Auth), not at the peer's next bytes (it waits for it).
                    if pc.hs.as_ref().is_some_and(|h| h.awaits_tls()) {
                        self.process_peer(k);
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if pc.hs.is_some() && pc.stream.tls().is_some() && tls_failure(&e) => {
                    self.peer_tls_failed(k, &e);
                    break;
                }
                Err(e) => {
                    // A session that breaks is a state change; an attempt that fails is
                    // reported by the dialer, once per reason (see dial_failed).
                    if pc.peer.is_some() {
                        let resource = &self.res[pc.res].cfg.name;
                        info!(resource = %resource, peer = %pc.name, "connection failed: {e}");
                    } else {
                        debug!(peer = %pc.name, "connection failed: {e}");
                        pc.failure = Some(e.to_string());
                    }
                    pc.dead = true;
                }
            }
        }
        self.mark_dirty(k);
    }

    pub(super) fn process_peer(&mut self, k: usize) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        if pc.dead || (pc.hs.is_some() && !self.peer_handshake(k)) {
            return;
        }
        self.peer_packets(k);
    }

    /// The handshake of peer connection `k`: true once it is authenticated and bound, and
    /// packets may follow.
    fn peer_handshake(&mut self, k: usize) -> bool {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return false;
        };
        let r = pc.res;
        let Some(hs) = pc.hs.as_mut() else {
            return true;
        };
        if hs.awaits_tls() {
            let Some(t) = pc.stream.tls().filter(|t| t.established()) else {
                return false;
            };
            let tls = self.res[r].peer_tls.as_ref().expect("TLS started with it");
            // A caller's certificate must be the node its Hello claimed (the dialer's
            // verifier checked the other way round during the TLS handshake).
            let checked = match (pc.dialed, pc.claimed) {
                (None, Some(id)) => match self.res[r].peers.iter().find(|p| p.id == id) {
                    Some(slot) => tls.check_client(
                        t.connection(),
                        &crate::tls::peer_names(&slot.name, slot.address.ip()),
                    ),
                    None => Err(format!("node {id} is not a peer")),
                },
                _ => Ok(()),
            };
            let step = match (checked, t.channel_binding()) {
                (Ok(()), Some(binding)) => {
                    debug!(peer = %pc.name, "TLS up: {}", t.describe());
                    hs.tls_up(&binding, &mut pc.out);
                    None
                }
                (Err(why), _) => Some(hs.tls_failed(why, true, &mut pc.out)),
                (Ok(()), None) => {
                    let why = format!("no channel binding ({}; TLS 1.3 is needed)", t.describe());
                    Some(hs.tls_failed(why, true, &mut pc.out))
                }
            };
            if let Some(PeerStep::Failed(e)) = step {
                self.peer_handshake_ended(k, e);
                return false;
            }
            // Our Auth goes out.
            self.mark_dirty(k);
        }
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return false;
        };
        let Some(hs) = pc.hs.as_mut() else {
            return false;
        };
        let (n, step) = hs.feed(&pc.inbuf[pc.in_start..pc.in_end], &mut pc.out);
        if let Some(id) = hs.peer() {
            pc.claimed = Some(id);
        }
        pc.advance(n);
        match step {
            PeerStep::NeedMore => false,
            PeerStep::StartTls => {
                self.start_peer_tls(k);
                false
            }
            PeerStep::Failed(e) => {
                self.peer_handshake_ended(k, e);
                false
            }
            PeerStep::Established(est) => {
                pc.hs = None;
                pc.deadline = None;
                pc.features = est.features;
                let dialed = pc.dialed.is_some();
                self.bind_peer_conn(r, k, est.peer, dialed);
                true
            }
        }
    }

    /// Peer connection `k`'s handshake failed with `e`: the connection is dropped (after
    /// what is queued, an `Error` telling the peer why, went out: see flush_entry), and the
    /// failure reported.
    fn peer_handshake_ended(&mut self, k: usize, e: HandshakeError) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        pc.hs = None;
        pc.dead = true;
        let (r, name, dialed, claimed) = (pc.res, pc.name.clone(), pc.dialed, pc.claimed);
        self.handshake_failed(r, &name, dialed, claimed, &e);
        self.mark_dirty(k);
    }

    /// Both ends want TLS (`HandshakeStep::StartTls`): what is queued (our Hello, if not
    /// all sent yet) goes out in the clear, everything after is TLS, and bytes the peer sent
    /// past its Hello are TLS too. We are the client on a connection we dialed.
    fn start_peer_tls(&mut self, k: usize) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let res = &self.res[pc.res];
        let tls = res
            .peer_tls
            .as_ref()
            .expect("the handshake starts TLS only with it");
        let conn = match pc.dialed {
            None => tls.server(),
            Some(d) => match res.peers.iter().find(|p| p.id == d) {
                Some(slot) => tls.client(crate::tls::peer_names(&slot.name, slot.address.ip())),
                None => Err(io::Error::other(format!("node {d} is not a peer"))),
            },
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                let step =
                    (pc.hs.as_mut()).map(|h| h.tls_failed(e.to_string(), false, &mut pc.out));
                if let Some(PeerStep::Failed(e)) = step {
                    self.peer_handshake_ended(k, e);
                }
                return;
            }
        };
        let clear = pc.out.split_off(pc.out_pos);
        pc.out.clear();
        pc.out_pos = 0;
        let received = pc.inbuf[pc.in_start..pc.in_end].to_vec();
        pc.advance(received.len());
        // What rustls is handed is read with the socket's next bytes.
        pc.readable = true;
        pc.stream.start_tls_peer(conn, clear, &received);
        // The client's first flight goes out now.
        self.mark_dirty(k);
    }

    /// Peer connection `k`'s TLS failed before the session began: the TLS error (an
    /// untrusted certificate, the peer's alert) ends the handshake, reported as any
    /// handshake failure; a peer that refused us in the clear instead of starting TLS is
    /// heard (its `Error`).
    fn peer_tls_failed(&mut self, k: usize, e: &io::Error) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let Some(hs) = pc.hs.as_mut() else {
            return;
        };
        let mut ignored = Vec::new();
        let step = match crate::tls::not_tls(e) {
            Some(bytes) => match hs.feed(bytes, &mut ignored) {
                (_, PeerStep::Failed(e)) => PeerStep::Failed(e),
                _ => hs.tls_failed(e.to_string(), false, &mut ignored),
            },
            None => {
                let why = match crate::tls::failure(e) {
                    Some(t) => t.to_string(),
                    None => e.to_string(),
                };
                hs.tls_failed(why, false, &mut ignored)
            }
        };
        if let PeerStep::Failed(e) = step {
            self.peer_handshake_ended(k, e);
        }
    }

    /// The packets of peer connection `k`'s session, handed to the engine one by one.
    fn peer_packets(&mut self, k: usize) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let r = pc.res;
        let Some(peer) = pc.peer else { return };
        // Take the input so packet payloads can be borrowed while the engine's actions
        // touch any entry (this connection's queue among them).
        let input = std::mem::take(&mut pc.inbuf);
        let (mut start, end) = (pc.in_start, pc.in_end);
        let mut failed = None;
        while start < end {
            match tandem_wire::decode(&input[start..end]) {
                Ok(Frame::NeedMore(need)) => {
                    if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                        pc.need = need;
                    }
                    break;
                }
                Ok(Frame::Packet(p, n)) => {
                    self.peer_packet(r, peer, &p);
                    start += n;
                    if !matches!(self.entries.get(k), Some(Entry::Peer(pc)) if !pc.dead) {
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
            pc.inbuf = input;
            pc.in_start = start;
            pc.in_end = end;
            if start == end {
                pc.in_start = 0;
                pc.in_end = 0;
            }
            if let Some(e) = failed {
                error!(resource = %self.res[r].cfg.name, peer = %pc.name, "ProtocolError: {e}; dropping the connection");
                pc.dead = true;
            }
        }
    }

    /// One packet of `peer` into resource `r`'s engine, its payload borrowed where it lies.
    fn peer_packet(&mut self, r: usize, peer: NodeId, p: &Packet<'_>) {
        self.handled += 1;
        if let Some(slot) = self.res[r].peers.iter_mut().find(|s| s.id == peer) {
            match *p {
                Packet::Write { volume, data, .. } | Packet::ResyncReply { volume, data, .. } => {
                    slot.stats.received(volume, data.len())
                }
                Packet::RecvAck { seq } | Packet::WriteAck { seq } | Packet::NegAck { seq, .. } => {
                    slot.stats.acked(seq, std::time::Instant::now())
                }
                _ => {}
            }
        }
        let data = match *p {
            Packet::Write { data, .. }
            | Packet::ReadReply { data, .. }
            | Packet::ResyncReply { data, .. }
            | Packet::AllocReply { extents: data, .. } => Some(data),
            _ => None,
        };
        if matches!(p, Packet::SyncProgress { .. }) {
            self.peer_sync_progress(r, peer, p);
        }
        let mut actions = Vec::new();
        self.res[r].engine.packet(peer, p, &mut actions);
        let ctx = Ctx {
            incoming: data,
            payload: None,
        };
        self.run_actions(r, actions, ctx);
    }

    /// A peer's handshake failed: said once per reason, and a dial that was refused backs
    /// off.
    fn handshake_failed(
        &mut self,
        r: usize,
        name: &str,
        dialed: Option<NodeId>,
        claimed: Option<NodeId>,
        e: &HandshakeError,
    ) {
        let reason = e.to_string();
        let res = &mut self.res[r];
        if matches!(e, HandshakeError::StandAlone { .. }) {
            // We refused it, as the administrator asked: not news.
            debug!(resource = %res.cfg.name, peer = %name, "{reason}");
        } else if let Some(d) = dialed {
            self.dial_failed(r, d, reason, Attempt::Refused);
        } else if let Some(slot) = claimed.and_then(|id| res.peers.iter_mut().find(|p| p.id == id))
        {
            // Its own dials fail the same way every interval: said once, then summed up.
            let now = Instant::now();
            if slot.last_error.as_deref() != Some(reason.as_str()) {
                error!(resource = %res.cfg.name, peer = %name, "peer handshake failed: {reason}");
                slot.failing = Some(Repeats::begin(now));
            } else if let Some(s) = slot.failing.as_mut().and_then(|f| f.again(now)) {
                error!(resource = %res.cfg.name, peer = %name, "peer handshake still failing after {} ({} attempts): {reason}", human(s.lasted), s.count);
            }
            slot.last_error = Some(reason);
        } else {
            error!(resource = %res.cfg.name, peer = %name, "peer handshake failed: {reason}");
        }
    }

    /// A connection to `peer` authenticated: it becomes the peer's session, unless one is
    /// bound already. Both ends dial, so when both succeed both keep the one the lower node
    /// id dialed (see links.rs) and drop the other without a word.
    pub(super) fn bind_peer_conn(&mut self, r: usize, k: usize, peer: NodeId, dialed: bool) {
        let res = &mut self.res[r];
        let me = res.me;
        let slot = res
            .peers
            .iter_mut()
            .find(|p| p.id == peer)
            .expect("the handshake checks the node id");
        if dialed {
            slot.dialing = None;
        }
        let old = slot.conn.and_then(|o| match self.entries.get(o) {
            Some(Entry::Peer(opc)) => Some((o, opc.dialed.is_some())),
            _ => None,
        });
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        if !slot.wanted {
            // Made StandAlone while this handshake ran.
            debug!(resource = %res.cfg.name, peer = %pc.name, "not connecting: StandAlone towards node {peer}");
            pc.dead = true;
            return;
        }
        if let Some((o, old_dialed)) = old {
            if !super::links::replaces(me, peer, dialed, old_dialed) {
                debug!(resource = %res.cfg.name, peer = %pc.name, "dropping a second connection to node {peer}");
                pc.dead = true;
                return;
            }
            debug!(resource = %res.cfg.name, peer = %pc.name, "this connection to node {peer} replaces the one bound");
            slot.conn = None;
            let mut actions = Vec::new();
            res.engine.peer_down(peer, &mut actions);
            self.run_actions(r, actions, Ctx::default());
            if let Some(Entry::Peer(opc)) = self.entries.get_mut(o) {
                opc.dead = true;
            }
            self.mark_dirty(o);
        }
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let res = &mut self.res[r];
        let slot = res
            .peers
            .iter_mut()
            .find(|p| p.id == peer)
            .expect("checked above");
        pc.peer = Some(peer);
        pc.name = format!("{} (node {} {})", pc.name, peer, slot.name);
        slot.conn = Some(k);
        slot.stats.connected();
        slot.link.connected();
        slot.last_error = None;
        let failed_for = (slot.failing.take()).map(|f| f.lasted(Instant::now()));
        if old.is_none() {
            let tls = pc.stream.tls().map_or("off".into(), |t| t.describe());
            match failed_for.filter(|d| d.as_secs() >= 60) {
                Some(d) => {
                    info!(resource = %res.cfg.name, peer = %pc.name, tls = %tls, "connected, after {} without a connection", human(d))
                }
                None => info!(resource = %res.cfg.name, peer = %pc.name, tls = %tls, "connected"),
            }
        }
        let mut actions = Vec::new();
        res.engine.peer_up(peer, &mut actions);
        self.run_actions(r, actions, Ctx::default());
        self.touch(r);
    }

    /// An attempt to reach `peer` failed. Logged when the reason changes, not at every
    /// attempt: a peer that stays down costs one line, not one per interval.
    pub(super) fn dial_failed(&mut self, r: usize, peer: NodeId, reason: String, how: Attempt) {
        let res = &mut self.res[r];
        let Some(slot) = res.peers.iter_mut().find(|p| p.id == peer) else {
            return;
        };
        slot.dialing = None;
        let now = Instant::now();
        slot.link.failed(how, now);
        let (name, addr) = (&slot.name, slot.address);
        if slot.last_error.as_deref() != Some(reason.as_str()) {
            match how {
                Attempt::Unreachable => {
                    info!(resource = %res.cfg.name, peer = %name, "cannot reach node {peer} at {addr}: {reason}; trying again every {:?}", res.cfg.net.connect_interval)
                }
                Attempt::Refused => {
                    warn!(resource = %res.cfg.name, peer = %name, "node {peer} at {addr} refused the connection: {reason}; trying again at up to {:?} intervals", res.cfg.net.max_connect_interval)
                }
            }
            // Counted from the first failure since the last connection, whatever the
            // reasons met since.
            if slot.failing.is_none() {
                slot.failing = Some(Repeats::begin(now));
            }
        } else if let Some(s) = slot.failing.as_mut().and_then(|f| f.again(now)) {
            let (lasted, count) = (human(s.lasted), s.count);
            match how {
                Attempt::Unreachable => {
                    info!(resource = %res.cfg.name, peer = %name, "still cannot reach node {peer} at {addr} after {lasted} ({count} attempts): {reason}")
                }
                Attempt::Refused => {
                    warn!(resource = %res.cfg.name, peer = %name, "node {peer} at {addr} still refuses the connection after {lasted} ({count} attempts): {reason}")
                }
            }
        }
        slot.last_error = Some(reason);
    }

    /// A peer connection's entry is going away.
    pub(super) fn peer_closed(&mut self, k: usize, pc: &PeerConn) {
        let r = pc.res;
        if let Some(peer) = pc.peer {
            let res = &mut self.res[r];
            if let Some(slot) = res
                .peers
                .iter_mut()
                .find(|p| p.id == peer && p.conn == Some(k))
            {
                slot.conn = None;
                slot.link.failed(Attempt::Unreachable, Instant::now());
                slot.last_error
                    .get_or_insert_with(|| "connection lost".into());
                info!(resource = %res.cfg.name, peer = %pc.name, "disconnected");
                self.peer_syncs
                    .retain(|&(pr, p, _), _| (pr, p) != (r, peer));
                let mut actions = Vec::new();
                res.engine.peer_down(peer, &mut actions);
                self.run_actions(r, actions, Ctx::default());
                self.relieve_congestion(r);
                self.touch(r);
            }
        } else if let Some(d) = pc.dialed {
            let still = self.res[r]
                .peers
                .iter()
                .any(|p| p.id == d && p.dialing == Some(k));
            if still {
                let reason = pc
                    .failure
                    .clone()
                    .unwrap_or_else(|| "could not connect".into());
                self.dial_failed(r, d, reason, Attempt::Unreachable);
            }
        }
    }

    pub(super) fn dial(&mut self) {
        if self.shutting_down {
            return;
        }
        let now = Instant::now();
        for r in 0..self.res.len() {
            for i in 0..self.res[r].peers.len() {
                let slot = &self.res[r].peers[i];
                // Both ends dial (see links.rs): whichever comes back first is found at once.
                if slot.conn.is_some()
                    || slot.dialing.is_some()
                    || !slot.wanted
                    || !slot.link.due(now)
                {
                    continue;
                }
                let (addr, id) = (slot.address, slot.id);
                self.res[r].peers[i].link.dialing(now);
                match connect_from(self.res[r].my_address.ip(), addr) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let key = self.new_peer_conn(r, Stream::tcp(s), addr.to_string(), Some(id));
                        self.res[r].peers[i].dialing = key;
                        if key.is_none() {
                            let why = "could not start the connection".to_string();
                            self.dial_failed(r, id, why, Attempt::Unreachable);
                        }
                    }
                    Err(e) => self.dial_failed(r, id, e.to_string(), Attempt::Unreachable),
                }
            }
        }
    }

    /// Stops replicating with a peer whose replica diverged from ours when no
    /// after-split-brain policy resolved it, once: logged, shown in status, not redialled
    /// (nor accepted) until an administrator runs `tandem connect`.
    pub(super) fn split_brain(&mut self, r: usize, f: SplitBrain) {
        let res = &mut self.res[r];
        let name = res.peer_name(f.peer);
        let number = res.cfg.volumes[f.volume as usize].number;
        let Some(slot) = res.peers.iter_mut().find(|p| p.id == f.peer) else {
            return;
        };
        if slot.split_brain.is_none() {
            let reason = format!(
                "split brain on volume {number}: both nodes were Primary while apart; this node has {} blocks ({} KiB) {} lacks, it has {} blocks ({} KiB) this node lacks{}; not resolved: {}",
                f.mine,
                f.mine * 4,
                slot.name,
                f.theirs,
                f.theirs * 4,
                if f.reported { " (found by the peer)" } else { "" },
                f.why,
            );
            error!(resource = %res.cfg.name, peer = %name,
                "{reason}. Replication with it stopped until an administrator discards one side's writes (`tandem connect {} {} --discard-my-data` on that side; README: Split brain)", res.cfg.name, slot.name);
            slot.split_brain = Some(reason.clone());
            slot.last_error = Some(reason);
        }
        slot.wanted = false;
        if let Some(k) = slot.conn.or(slot.dialing) {
            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                pc.dead = true;
            }
            self.mark_dirty(k);
        }
    }

    /// A split brain with a peer was resolved (see `Event::SplitBrainResolved`): said once
    /// at WARN, naming the side whose changes are discarded, and kept for status.
    pub(super) fn split_brain_resolved(&mut self, r: usize, e: &Event) {
        let Event::SplitBrainResolved {
            peer,
            volume,
            policy,
            victim,
            discarded_blocks,
            pulled_blocks,
        } = *e
        else {
            return;
        };
        let res = &mut self.res[r];
        let me = res.me;
        let number = res.cfg.volumes[volume as usize].number;
        let Some(slot) = res.peers.iter_mut().find(|p| p.id == peer) else {
            return;
        };
        let kib = discarded_blocks * 4;
        let what = if victim == me {
            format!(
                "this node's {discarded_blocks} changed blocks ({kib} KiB) discarded, pulling {pulled_blocks} blocks from {}",
                slot.name
            )
        } else {
            format!(
                "{}'s {discarded_blocks} changed blocks ({kib} KiB) discarded, it pulls {pulled_blocks} blocks from this node",
                slot.name
            )
        };
        let line = format!(
            "split brain on volume {number} with {} resolved by {policy}: {what}",
            slot.name
        );
        warn!(resource = %res.cfg.name, peer = %slot.name, "{line}");
        slot.split_brain_resolved = Some(line);
    }
}
