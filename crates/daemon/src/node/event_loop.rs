//! The event loop: wait for readiness or the next timer (the housekeeping tick or the
//! engines' `poll_timeout`), hand ready connections to their room, write out what is
//! queued, and the control socket.

use super::links::Attempt;
use super::state::*;
use crate::busy_poll::{poll_once, Waiter};
use crate::conn::Phase;
use crate::control_api::Request;
use anyhow::{Context, Result};
use mio::{Events, Interest, Token as MioToken};
use std::io;
use std::time::{Duration, Instant};
use tandem_engine::replica::NotQuiet;
use tracing::{debug, info, warn};

impl NodeReactor {
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(super) fn run(mut self) -> Result<()> {
        let mut events = Events::with_capacity(256);
        // Every resource's listeners and the control socket are bound (`NodeReactor::new`).
        super::sd_notify::notify(&format!(
            "READY=1\nSTATUS=serving {} resource(s)",
            self.res.len()
        ));
        // Measured here: iodepth-1 replicated writes 101-111 us -> 48-56 us.
        let mut waiter = Waiter::new(self.busy_poll);
        loop {
            let wake = self
                .engine_wake
                .map_or(self.next_tick, |w| w.min(self.next_tick));
            // Something a sync ahead set off waits to be issued: only a look for I/O.
            let timeout = match self.deferred.is_empty() {
                true => wake.saturating_duration_since(Instant::now()),
                false => Duration::ZERO,
            };
            let stretch = if self.res.iter().any(ResCtx::flush_heavy) {
                FLUSH_HEAVY_POLL
            } else {
                1
            };
            let handled = std::mem::take(&mut self.handled);
            if self.scrapes.is_empty() {
                waiter.wait_stretched(
                    &mut self.poll,
                    &mut events,
                    Some(timeout),
                    handled,
                    stretch,
                )?;
            } else {
                // A scrape is being built, a few resources a round: only a look for I/O.
                poll_once(&mut self.poll, &mut events, Some(Duration::ZERO))?;
            }
            self.advance_engines();
            self.dispatch(&events);
            if Instant::now() >= wake {
                // What arrived while this process could not run (stopped, or the wait
                // interrupted by SIGCONT) is read before the timers judge the peers that
                // sent it: a node back from a stall must not drop peers that spoke.
                poll_once(&mut self.poll, &mut events, Some(Duration::ZERO))?;
                self.advance_engines();
                self.dispatch(&events);
                self.next_tick = Instant::now() + TICK;
                self.engine_wake = None;
                self.tick();
            }
            self.send_events();
            self.advance_scrapes();
            self.flush_dirty();
            loop {
                while !self.resume.is_empty() {
                    for k in std::mem::take(&mut self.resume) {
                        self.service_nbd(k);
                    }
                    self.flush_dirty();
                }
                while !self.al_commits.is_empty() || !self.al_ready.is_empty() {
                    self.al_commit_pending();
                    self.issue_al_ready();
                    self.flush_dirty();
                }
                if self.deferred.is_empty() {
                    break;
                }
                self.issue_deferred();
                self.flush_dirty();
            }
            if !self.syncs_ahead.is_empty() {
                self.start_syncs_ahead();
                self.flush_dirty();
            }
            if self.shutting_down
                && self.slots.is_empty()
                && !self
                    .entries
                    .iter()
                    .any(|(_, e)| matches!(e, Entry::Nbd { .. }))
                && self.peers_gone()
            {
                for r in &self.res {
                    for b in r.backings.iter().flatten() {
                        b.sync_data().context("final flush")?;
                    }
                }
                self.write_metadata_at_stop();
                info!("all requests finished and flushed; exiting");
                return Ok(());
            }
        }
    }

    /// Every engine's clock to now, before it handles what arrived: when a peer was last
    /// heard, and when a write went, count from the moment it happened, not from the
    /// last tick (a node back from a stall would judge its peers by a stale clock).
    fn advance_engines(&mut self) {
        let now = self.now_ms();
        for r in self.res.iter_mut().filter(|r| r.presence != Presence::Gone) {
            r.engine.advance(now);
        }
    }

    /// Hands what `events` says is ready to its room.
    fn dispatch(&mut self, events: &Events) {
        let mut active = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                WAKER => self.worker_completions(),
                SIGNAL => self.begin_shutdown(),
                RELOAD => self.reread_config(),
                MioToken(k) => {
                    if ev.is_writable() {
                        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                            pc.connecting = false;
                        }
                        self.mark_dirty(k);
                    }
                    if ev.is_readable() || ev.is_error() || ev.is_read_closed() {
                        active.push(k);
                    }
                }
            }
        }
        for k in active {
            self.on_readable(k);
        }
    }

    /// A clean stop: every peer is let go (the engine marks what they did not confirm),
    /// and each replica's metadata takes what the engine keeps and says "stopped
    /// cleanly". A replica whose state cannot be taken stays marked as crashed (the next
    /// start resyncs it in full): never a clean mark over doubtful state.
    fn write_metadata_at_stop(&mut self) {
        for r in 0..self.res.len() {
            self.stop_metadata(r);
        }
    }

    /// Resource `r`'s part of a clean stop (see `write_metadata_at_stop`).
    pub(super) fn stop_metadata(&mut self, r: usize) {
        let r = &mut self.res[r];
        {
            let mut out = Vec::new();
            for p in &r.peers {
                r.engine.peer_down(p.id, &mut out);
            }
            for (v, m) in r.metas.iter_mut().enumerate() {
                let Some(m) = m else { continue };
                let done = r
                    .engine
                    .persisted(v as u16)
                    .map_err(anyhow::Error::from)
                    .and_then(|kept| m.stop_cleanly(&kept));
                match done {
                    Ok(()) => {
                        info!(resource = %r.cfg.name, volume = v, "metadata of {}: stopped cleanly", m.describe())
                    }
                    Err(e)
                        if matches!(
                            e.downcast_ref(),
                            Some(NotQuiet::Unsettled(_) | NotQuiet::Unproven(_))
                        ) =>
                    {
                        info!(resource = %r.cfg.name, volume = v,
                        "metadata of {}: not marked clean ({}); left as after a crash: the next start pulls what the activity log names, unless it meets the same Primary run again", m.describe(), crate::error_chain(&e))
                    }
                    Err(e) => warn!(resource = %r.cfg.name, volume = v,
                        "metadata of {}: not marked clean ({}); the next start treats it as after a crash (a consistent replica pulls what its activity log names)", m.describe(), crate::error_chain(&e)),
                }
            }
        }
    }

    pub(super) fn mark_dirty(&mut self, k: usize) {
        let dirty = match self.entries.get_mut(k) {
            Some(Entry::Nbd { conn, .. }) => &mut conn.dirty,
            Some(Entry::Peer(pc)) => &mut pc.dirty,
            Some(Entry::Control(c)) => &mut c.dirty,
            Some(Entry::Http(h)) => &mut h.dirty,
            _ => return,
        };
        if !*dirty {
            *dirty = true;
            self.dirty.push(k);
        }
    }

    pub(super) fn begin_shutdown(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(io::Read::read(&mut self.signal_rx, &mut buf), Ok(n) if n > 0) {}
        if self.shutting_down {
            return;
        }
        info!("shutting down: finishing requests in flight");
        super::sd_notify::notify("STOPPING=1");
        self.shutting_down = true;
        let keys: Vec<usize> = self.entries.iter().map(|(k, _)| k).collect();
        for k in keys {
            match &mut self.entries[k] {
                Entry::NbdListener { .. }
                | Entry::ControlListener(..)
                | Entry::MetricsListener(_)
                | Entry::PeerListener { .. }
                | Entry::PeerRouting(_) => {
                    let e = self.entries.remove(k);
                    if let Entry::ControlListener(_, p) = &e {
                        std::fs::remove_file(p).ok();
                    }
                }
                Entry::Nbd { conn, .. } => {
                    conn.read_closed = true;
                    self.mark_dirty(k);
                }
                _ => {}
            }
        }
    }

    /// A clean stop, once no application request is left: every peer connection closes
    /// first (its last answers still sent), so peers see the node go at once instead of
    /// waiting out a ping timeout while it syncs (a Primary's writes stalled ~0.7 s at a
    /// Secondary's stop); then the stop waits for the peers' writes already received to
    /// land (a replica with writes still landing is not kept consistent). True once both
    /// are done.
    fn peers_gone(&mut self) -> bool {
        let open: Vec<usize> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Peer(pc) if !pc.dead))
            .map(|(k, _)| k)
            .collect();
        if !open.is_empty() {
            info!("shutting down: letting every peer go");
        }
        if !open.is_empty() && !self.left_peers {
            // Before the connections close, so that the last sends carry it.
            self.left_peers = true;
            for r in 0..self.res.len() {
                if self.res[r].presence == Presence::Gone {
                    continue;
                }
                let mut actions = Vec::new();
                if self.res[r].engine.leave(&mut actions) {
                    info!(resource = %self.res[r].cfg.name,
                        "telling the peers this node leaves cleanly: its replicas are Outdated until it is back, and a peer may count it out of its quorum");
                }
                self.run_actions(r, actions, Ctx::default());
            }
        }
        for k in open {
            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                pc.dead = true;
            }
            self.mark_dirty(k);
        }
        self.flush_dirty();
        let peers = self
            .entries
            .iter()
            .any(|(_, e)| matches!(e, Entry::Peer(_)));
        !peers && !self.res.iter().any(|r| r.engine.writes_landing())
    }

    pub(super) fn on_readable(&mut self, k: usize) {
        let Some(e) = self.entries.get_mut(k) else {
            return;
        };
        match e {
            Entry::NbdListener { .. } => self.accept_nbd(k),
            Entry::PeerListener { .. } => self.accept_peer(k),
            Entry::PeerRouting(_) => self.route_peer(k),
            Entry::ControlListener(..) => self.accept_control(k),
            Entry::Nbd { conn, .. } => {
                conn.readable = true;
                self.service_nbd(k);
            }
            Entry::Peer(pc) => {
                pc.readable = true;
                self.service_peer(k);
            }
            Entry::Control(_) => self.service_control(k),
            Entry::MetricsListener(_) => self.accept_http(k),
            Entry::Http(_) => self.service_http(k),
        }
    }

    pub(super) fn accept_control(&mut self, k: usize) {
        loop {
            let Some(Entry::ControlListener(l, _)) = self.entries.get(k) else {
                return;
            };
            let (mut s, _) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("control accept failed: {e}"),
            };
            let key = self.entries.vacant_key();
            if self
                .poll
                .registry()
                .register(&mut s, MioToken(key), Interest::READABLE)
                .is_ok()
            {
                self.entries.insert(Entry::Control(Box::new(
                    super::control_conn::ControlConn::new(s),
                )));
                self.service_control(key);
            }
        }
    }

    pub(super) fn tick(&mut self) {
        let now = self.now_ms();
        for r in 0..self.res.len() {
            if self.res[r].presence == Presence::Gone {
                continue;
            }
            // Only an engine whose timers are due: its clock is kept current by `advance`,
            // and the simulator ticks engines only then too. Ticking all 1000 resources of
            // a node every 100 ms was most of its idle CPU.
            match self.res[r].engine.poll_timeout() {
                Some(due) if due <= now => {}
                Some(due) => {
                    let at = self.started + Duration::from_millis(due);
                    self.engine_wake = Some(self.engine_wake.map_or(at, |w| w.min(at)));
                    continue;
                }
                None => continue,
            }
            let mut actions = Vec::new();
            self.res[r].engine.tick(now, &mut actions);
            self.run_actions(r, actions, Ctx::default());
        }
        if now >= self.resyncs_sampled_ms + 1000 {
            let since = now - self.resyncs_sampled_ms;
            self.resyncs_sampled_ms = now;
            for r in &mut self.res {
                r.stats.sample_rates(since);
            }
            let ours = self.sample_resyncs(now);
            self.tell_sync_progress(&ours);
        }
        self.al_unsynced_due();
        self.finish_leaving();
        self.sweep_events();
        self.expire_http();
        self.check_transports();
        self.dial();
        // Handshakes (NBD or peer) that never finish.
        let now = Instant::now();
        let late: Vec<usize> = self
            .entries
            .iter()
            .filter(|(_, e)| match e {
                Entry::Nbd { conn, .. } => conn.handshake_deadline.is_some_and(|d| d <= now),
                Entry::Peer(pc) => !pc.dead && pc.deadline.is_some_and(|d| d <= now),
                Entry::PeerRouting(c) => c.deadline <= now,
                _ => false,
            })
            .map(|(k, _)| k)
            .collect();
        for k in late {
            match self.entries.get_mut(k) {
                Some(Entry::Nbd { conn, .. }) => {
                    warn!(client = %conn.name, "NBD handshake not finished in time; closing");
                    conn.dead = true;
                }
                Some(Entry::PeerRouting(c)) => {
                    debug!(peer = %c.addr, "no Hello in time on a shared replication address; closing");
                    self.remove_entry(k);
                    continue;
                }
                Some(Entry::Peer(pc)) => {
                    pc.dead = true;
                    let (r, dialed) = (pc.res, pc.dialed);
                    let what = if pc.connecting {
                        "no answer to the connection attempt"
                    } else {
                        "authentication not finished"
                    };
                    debug!(peer = %pc.name, "{what} in time; giving up on this connection");
                    if let Some(d) = dialed {
                        self.dial_failed(r, d, format!("{what} in time"), Attempt::Unreachable);
                    }
                }
                _ => {}
            }
            self.mark_dirty(k);
        }
    }

    pub(super) fn flush_dirty(&mut self) {
        while !self.dirty.is_empty() {
            let dirty = std::mem::take(&mut self.dirty);
            for k in dirty {
                self.flush_entry(k);
            }
        }
    }

    pub(super) fn flush_entry(&mut self, k: usize) {
        let mut remove = false;
        let mut resume = false;
        match self.entries.get_mut(k) {
            Some(Entry::Nbd { conn, .. }) => {
                conn.dirty = false;
                if !conn.dead && conn.out_pending() {
                    let was_full = !conn.has_room();
                    if let Err(e) = conn.flush_out() {
                        debug!(client = %conn.name, "client went away: {e}");
                        conn.dead = true;
                    } else if was_full && conn.has_room() {
                        resume = true;
                    }
                }
                let stuck = !conn.dead && conn.out_pending();
                if stuck != conn.write_interest {
                    let _ = conn.stream.watch(self.poll.registry(), MioToken(k), stuck);
                    conn.write_interest = stuck;
                }
                remove = conn.finished();
            }
            Some(Entry::Peer(pc)) => {
                pc.dirty = false;
                if !pc.connecting && pc.out_pending() {
                    // A connection being dropped still gets one try to send what is queued
                    // (the Error or state packet that tells the peer why).
                    if let Err(e) = pc.flush_out() {
                        if !pc.dead && pc.peer.is_some() {
                            let resource = &self.res[pc.res].cfg.name;
                            info!(resource = %resource, peer = %pc.name, "connection failed while sending: {e}");
                        } else if !pc.dead {
                            debug!(peer = %pc.name, "connection failed while sending: {e}");
                            pc.failure = Some(e.to_string());
                        }
                        pc.dead = true;
                    }
                }
                let want_write = pc.connecting || pc.out_pending();
                if !pc.dead && want_write != pc.write_interest {
                    let _ = pc
                        .stream
                        .watch(self.poll.registry(), MioToken(k), want_write);
                    pc.write_interest = want_write;
                }
                remove = pc.dead;
                let r = pc.res;
                self.relieve_congestion(r);
            }
            Some(Entry::Control(c)) => {
                c.dirty = false;
                remove = c.flush_and_finished();
                // A large answer (status --json of 1000 resources, ~1 MB) fills the socket: the
                // rest goes when it has room, not when the client next speaks (it waits
                // for the answer, and gave up after 10 s with EAGAIN).
                let want_write = !remove && c.out_pending();
                if want_write != c.write_interest {
                    let interest = if want_write {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    let _ = (self.poll.registry()).reregister(&mut c.stream, MioToken(k), interest);
                    c.write_interest = want_write;
                }
            }
            Some(Entry::Http(_)) => remove = self.flush_http(k),
            _ => {}
        }
        if resume {
            self.service_nbd(k);
        }
        if remove {
            self.remove_entry(k);
        }
    }

    pub(super) fn remove_entry(&mut self, k: usize) {
        let Some(e) = self.entries.try_remove(k) else {
            return;
        };
        match e {
            Entry::Nbd { res, mut conn, .. } => {
                let _ = self.poll.registry().deregister(conn.stream.source());
                conn.stream.shutdown();
                if matches!(conn.phase, Phase::Transmission { .. }) {
                    info!(client = %conn.name, "NBD client detached");
                    self.client_detached(res);
                }
            }
            Entry::Peer(mut pc) => {
                let _ = self.poll.registry().deregister(pc.stream.source());
                pc.stream.shutdown();
                self.peer_closed(k, &pc);
            }
            Entry::PeerRouting(mut c) => {
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
            Entry::Control(mut c) => {
                let _ = self.poll.registry().deregister(&mut c.stream);
                // Its key may be reused by another connection, which watches nothing.
                self.watchers.retain(|&w| w != k);
                if self.watchers.is_empty() {
                    self.events_sent.clear();
                }
            }
            Entry::Http(mut h) => {
                let _ = self.poll.registry().deregister(&mut h.stream);
                self.scrapes.retain(|&s| s != k);
                self.watchers.retain(|&w| w != k);
                if self.watchers.is_empty() {
                    self.events_sent.clear();
                }
            }
            _ => {}
        }
    }

    pub(super) fn service_control(&mut self, k: usize) {
        let Some(Entry::Control(c)) = self.entries.get_mut(k) else {
            return;
        };
        let lines = c.read_lines();
        for line in lines {
            if let Ok(Request::Events { now, statistics }) = serde_json::from_str(&line) {
                self.watch_events(k, now, statistics);
                continue;
            }
            let response = self.control_command(&line);
            if let Some(Entry::Control(c)) = self.entries.get_mut(k) {
                c.queue(&response);
            }
        }
        self.mark_dirty(k);
    }
}
