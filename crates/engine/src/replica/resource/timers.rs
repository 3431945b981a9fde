//! Time: the resync retries and pacing, and each peer's keepalive and timeouts, judged
//! by pings or by the request timeout (see [`Judge`]).

use super::Resource;
use crate::replica::action::RAction;
use crate::replica::event::LinkLoss;
use crate::replica::msg::Msg;
use crate::replica::peer::{Judge, Timer};
use crate::replica::spec::NodeId;
use tandem_wire::packet::Role;

impl Resource {
    /// Advances the clock: keepalive pings and timeouts.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<RAction>) {
        self.tick_event(now_ms, out);
        self.after_event(out);
    }

    /// Tells the engine the time without running its timers: a driver that ticks only at
    /// [`Resource::poll_timeout`] keeps the clock current for the events in between (a
    /// write's send time, a retry's deadline, when a peer was last heard).
    pub fn advance(&mut self, now_ms: u64) {
        self.rep.now_ms = self.rep.now_ms.max(now_ms);
    }

    /// When the engine next needs [`Resource::tick`] (the clock `tick` is given), or `None`
    /// while nothing is timed: a resync retry, a ping to send or one unanswered for too
    /// long, a replicated write unacknowledged for too long. Drivers wake for it instead
    /// of ticking at a fixed rate.
    pub fn poll_timeout(&self) -> Option<u64> {
        let resyncs = self
            .rep
            .vols
            .iter()
            .filter_map(|v| v.resync.as_ref())
            .flat_map(|r| {
                let retry = (!r.refused.is_empty()).then_some(r.retry_at_ms);
                retry.into_iter().chain(r.pace.wake_ms)
            });
        let peers = (0..self.rep.peers.len())
            .filter(|&i| self.rep.peers[i].up)
            .flat_map(|i| self.rep.peers[i].next_timer(&self.rep.spec, self.judge(i)));
        let settling = self.app.settling.next_timer();
        resyncs.chain(peers).chain(settling).min()
    }

    /// The driver's word on `peer`'s transport: bytes we sent it have been in flight for
    /// `ms` with none acknowledged by its host (Linux `TCP_INFO`). A peer that owes us
    /// answers is judged by the request timeout (`judge`), since its process may be busy
    /// or stopped; but a stopped process's kernel still acknowledges what arrives, so a
    /// host that acknowledges nothing for the ping timeout is gone (dead, or the network
    /// cut) and is dropped then: a cut cable is found within ping-interval + ping-timeout
    /// even while a write waits for the peer.
    pub fn transport_silent(&mut self, peer: NodeId, ms: u64, out: &mut Vec<RAction>) {
        let up = self
            .rep
            .peers
            .index(peer)
            .is_some_and(|i| self.rep.peers[i].up);
        if up && ms >= self.rep.spec.ping_timeout_ms {
            self.drop_peer(peer, LinkLoss::Unreachable(ms), out);
            self.after_event(out);
        }
    }

    /// How peer `i`'s silence is judged: by the request timeout while it owes us an
    /// answer (a replicated write, barrier or read; a resync request; a generation id a
    /// rotation waits for) or while neither it nor we are Primary; else by pings.
    fn judge(&self, i: usize) -> Judge {
        let p = &self.rep.peers[i];
        let pulled_from = self.rep.vols.iter().any(|v| {
            v.resync
                .as_ref()
                .is_some_and(|rs| rs.source == Some(p.id) && !rs.outstanding.is_empty())
        });
        let owes = p.owes_answers() || pulled_from || self.app.rotations.awaits(p.id);
        let with_primary = self.rep.role == Role::Primary || p.role == Role::Primary;
        if owes || !with_primary {
            Judge::Timeout
        } else {
            Judge::Ping
        }
    }

    pub(super) fn tick_event(&mut self, now_ms: u64, out: &mut Vec<RAction>) {
        self.rep.now_ms = now_ms;
        for v in 0..self.rep.vols.len() {
            let Some(rs) = self.rep.vols[v].resync.as_mut() else {
                continue;
            };
            let retry = !rs.refused.is_empty() && now_ms >= rs.retry_at_ms;
            if retry {
                rs.refused.clear();
            }
            let paced = rs.pace.wake_ms.is_some_and(|w| now_ms >= w);
            if retry || paced {
                self.rep.pump_resync(&mut self.app.barriers, v as u16, out);
            }
        }
        let mut drop = Vec::new();
        for i in 0..self.rep.peers.len() {
            if !self.rep.peers[i].up {
                continue;
            }
            let judge = self.judge(i);
            let p = &mut self.rep.peers[i];
            match p.timer(now_ms, &self.rep.spec, judge) {
                Timer::Quiet => {}
                Timer::Ping => out.push(RAction::Send {
                    peer: p.id,
                    msg: Msg::Ping,
                }),
                Timer::Drop(reason) => drop.push((p.id, reason)),
            }
        }
        for (peer, reason) in drop {
            self.drop_peer(peer, reason, out);
        }
    }
}
