//! Stalls (`Scenario::stalls`, `tandem-sim --stalls`): a Secondary's process stops for a
//! while (SIGSTOP) and goes on (SIGCONT). While stopped it handles nothing: packets to it
//! wait in order (the network still carries what it sent before), its disk completions
//! and its timers wait, and a connection a peer drops is noticed only once it runs again.
//! Back, it reads what arrived before its timers run, as the daemon does. Half the stalls
//! are shorter than the request timeout (a busy peer the engine must not take for a dead
//! one while it owes answers, see `peer::Judge`), half up to twice it.
//!
//! The simulator's network and faults run in microseconds to milliseconds (the workload
//! polls every few µs per request completed), so stalls of the default timings' seconds
//! would cost millions of events: runs with stalls scale the timers down instead
//! ([`Scenario::with_stalls`]: a ping after 20 ms of silence, 10 ms for its answer, 100 ms
//! for a request), keeping their ratios to the network's delays.

use crate::{Ev, Scenario, Sim};
use tandem_engine::replica::{LinkLoss, NodeId};

/// What stalls did in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stalls {
    pub(crate) stalls: usize,
    /// Stalls shorter than the request timeout.
    pub(crate) short: usize,
    /// Connections to a stalled node its peers dropped, by the timer that fired: a write
    /// unacknowledged, a ping unanswered within the ping timeout, within the request
    /// timeout.
    pub(crate) write_timeouts: usize,
    pub(crate) ping_timeouts: usize,
    pub(crate) silent: usize,
    /// Connections to a stalled node dropped during a stall shorter than the request
    /// timeout (idle links to the Primary are judged by pings: allowed).
    pub(crate) short_dropped: usize,
}

impl Scenario {
    /// This scenario with stalls among its faults, and timers scaled to them.
    pub fn with_stalls(mut self) -> Scenario {
        self.stalls = true;
        self.knobs.ping_interval_ms = 20;
        self.knobs.ping_timeout_ms = 10;
        self.knobs.timeout_ms = 100;
        self
    }
}

impl Sim {
    /// Whether node `n` is stopped now; until when (simulated µs).
    pub(crate) fn stalled(&self, n: NodeId) -> Option<u64> {
        let until = self.stalled_until[n as usize];
        (until > self.now).then_some(until)
    }

    /// Whether node `n` is stopped or goes on just now, with what waited for it not yet
    /// handled: a link to it is not healed before it has learned the old one dropped.
    pub(crate) fn stopped_or_resuming(&self, n: NodeId) -> bool {
        let until = self.stalled_until[n as usize];
        until != 0 && self.now <= until
    }

    /// Stops node `n` for a drawn time.
    pub(crate) fn stall(&mut self, n: NodeId) {
        let timeout = self.sc.knobs.timeout_ms;
        let ms = if self.stall_rng.chance(0.5) {
            self.sc.knobs.ping_timeout_ms + self.stall_rng.below(timeout)
        } else {
            timeout + self.stall_rng.below(timeout + 1)
        };
        let short = ms < timeout;
        self.stall_stats.stalls += 1;
        self.stall_stats.short += usize::from(short);
        self.stall_short[n as usize] = short;
        self.stalled_until[n as usize] = self.now + ms * 1000;
        self.note(format!("node {n} stalls for {ms} ms"));
    }

    /// Node `n`'s stall ends early (it is killed or stopped): what it was to learn of its
    /// dropped connections, it learns now, so a clean stop finds every peer gone.
    pub(crate) fn end_stall(&mut self, n: NodeId) {
        if self.stalled(n).is_none() {
            return;
        }
        self.stalled_until[n as usize] = 0;
        for y in (0..self.nodes.len() as NodeId).filter(|&y| y != n) {
            if let Some(conn) = self.links.get(&(n, y)).filter(|l| !l.up).map(|l| l.conn) {
                self.notice_down(n, y, conn);
            }
        }
    }

    /// An event for a stopped node waits until it runs again (`true`: put back).
    pub(crate) fn hold_for_stall(&mut self, ev: Ev) -> bool {
        let node = match ev {
            Ev::Deliver { to, .. } => to,
            Ev::DiskDone { node, .. } | Ev::NoticeDown { node, .. } | Ev::Restart { node } => node,
            Ev::Heal { a, b } => match (self.stalled(a), self.stalled(b)) {
                (Some(_), _) => a,
                (None, _) => b,
            },
            _ => return false,
        };
        let Some(until) = self.stalled(node) else {
            return false;
        };
        self.at(until - self.now, ev);
        true
    }

    /// Node `x` learns that its link to `y` (connection `conn`) dropped: now, or once it
    /// runs again.
    pub(crate) fn notice_down(&mut self, x: NodeId, y: NodeId, conn: u64) {
        if let Some(until) = self.stalled(x) {
            self.at(
                until - self.now,
                Ev::NoticeDown {
                    node: x,
                    peer: y,
                    conn,
                },
            );
            return;
        }
        let same = self
            .links
            .get(&(x, y))
            .is_some_and(|l| !l.up && l.conn == conn);
        if same {
            let mut out = Vec::new();
            self.nodes[x as usize].engine.peer_down(y, &mut out);
            self.run_actions(x, out, &tandem_engine::driver::Inputs::default());
        }
    }

    /// Before `a` and `b` connect again, each learns that their last connection dropped, if
    /// the news still waited for the end of a stall (as a daemon reads the old socket's
    /// close before it binds the new one).
    pub(crate) fn old_links_down(&mut self, a: NodeId, b: NodeId) {
        for (x, y) in [(a, b), (b, a)] {
            if let Some(conn) = self.links.get(&(x, y)).filter(|l| !l.up).map(|l| l.conn) {
                self.notice_down(x, y, conn);
            }
        }
    }

    /// `node` dropped `peer`: counted if `peer` is stopped.
    pub(crate) fn count_stall_drop(&mut self, peer: NodeId, reason: &LinkLoss) {
        if self.stalled(peer).is_none() {
            return;
        }
        let s = &mut self.stall_stats;
        match reason {
            LinkLoss::WriteTimeout(_) => s.write_timeouts += 1,
            LinkLoss::PingTimeout(_) => s.ping_timeouts += 1,
            LinkLoss::Silent(_) => s.silent += 1,
            _ => {}
        }
        s.short_dropped += usize::from(self.stall_short[peer as usize]);
    }
}
