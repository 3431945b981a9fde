//! When to dial a peer, and which of two connections to the same peer to keep: pure
//! decisions over time and node ids, no sockets (the daemon does the I/O).
//!
//! Both ends of a pair dial, so a node that comes back (restart, healed cable) is
//! connected as soon as either side's next attempt reaches it, not when the other side's
//! backoff runs out. A peer that does not answer is tried again every `connect-interval`:
//! a connection attempt costs one SYN, and backing off would only delay the rejoin. Only a
//! peer that answers and refuses (StandAlone, wrong secret, another resource) is tried at
//! a doubling interval up to `max-connect-interval`: it will not change its mind soon, and
//! each attempt costs it a handshake. When both dials succeed, both ends keep the one the
//! lower node id dialed, so they agree without a word; the higher id dials half an
//! interval later after a start or a drop, so that both rarely succeed at once.

use std::time::{Duration, Instant};

/// How an attempt to reach the peer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// No answer, connection refused, or the link dropped: the peer is away.
    Unreachable,
    /// The peer answered and refused the session (a handshake error).
    Refused,
}

/// Dialing schedule of one peer.
#[derive(Clone, Debug)]
pub struct Link {
    base: Duration,
    max: Duration,
    /// Wait after the next refusal.
    refusal_wait: Duration,
    next_dial: Instant,
    /// When the last attempt started: an unanswered one already waited its patience.
    last_attempt: Option<Instant>,
    /// How long this end holds back its first dial after a start or a drop (see
    /// [`Link::yielding`]).
    defer: Duration,
}

impl Link {
    pub fn new(base: Duration, max: Duration, now: Instant) -> Link {
        debug_assert!(base <= max, "the config checks connect-interval <= max");
        Link {
            base,
            max,
            refusal_wait: base,
            next_dial: now,
            last_attempt: None,
            defer: Duration::ZERO,
        }
    }

    /// This end has the higher node id, so the connection both ends keep is the one the
    /// peer dials ([`preferred`]): after a start or a dropped session it dials half an
    /// interval after the peer would, not at the same moment. Two dials that both succeed
    /// cost a session that begins and is replaced at once (the engine sees a connection
    /// come and go, and the log a quorum lost and regained); the peer's dial, if it can
    /// reach us, comes first. If it cannot (a one-way firewall), ours still does.
    pub fn yielding(mut self) -> Link {
        self.defer = self.base / 2;
        self.next_dial += self.defer;
        self
    }

    /// A dial is due (the caller checks that no connection or attempt exists).
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_dial
    }

    /// An attempt starts now.
    pub fn dialing(&mut self, now: Instant) {
        self.last_attempt = Some(now);
    }

    /// How long one attempt may take before it counts as unanswered: at least a second
    /// (a SYN and its answer across a busy link), at most the retry interval.
    pub fn patience(&self) -> Duration {
        self.base.max(Duration::from_secs(1))
    }

    /// An attempt (or a live connection) ended. An unreachable peer is tried again one
    /// interval after the last attempt started (at once if that is past: an attempt that
    /// went unanswered for its patience, or a session that just dropped), but never
    /// sooner than a refusal already said (a session we dropped over a conflict is a
    /// refusal, and its close comes after).
    pub fn failed(&mut self, how: Attempt, now: Instant) {
        self.next_dial = match how {
            Attempt::Unreachable => self
                .last_attempt
                .map_or(now, |t| t + self.base)
                .max(now + self.defer)
                .max(self.next_dial),
            Attempt::Refused => {
                let w = self.refusal_wait;
                self.refusal_wait = (w * 2).min(self.max);
                now + w
            }
        };
    }

    /// A session is established: later failures start from the shortest wait again.
    pub fn connected(&mut self) {
        self.refusal_wait = self.base;
    }

    /// An administrator asked for the connection (`tandem connect`): dial now.
    pub fn dial_now(&mut self, now: Instant) {
        self.refusal_wait = self.base;
        self.next_dial = now;
    }
}

/// Whether the connection to `peer` that `me` dialed (`dialed`) or accepted is the one
/// both ends keep when there are two: the one the lower node id dialed.
pub fn preferred(me: u8, peer: u8, dialed: bool) -> bool {
    debug_assert_ne!(me, peer);
    if dialed {
        me < peer
    } else {
        peer < me
    }
}

/// A second authenticated connection to the same peer: true if it replaces the one
/// bound now, false if it is dropped. Dropped only when the bound one is the preferred
/// one and the new one is not. Two from the same dialer: the newer wins, since a node
/// dials only when it has no connection (the old one is dead from its side, say after
/// it lost power, though this side has not noticed yet).
pub fn replaces(me: u8, peer: u8, new_dialed: bool, old_dialed: bool) -> bool {
    preferred(me, peer, new_dialed) || !preferred(me, peer, old_dialed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_unreachable_peer_is_tried_every_interval_without_backing_off() {
        let t0 = Instant::now();
        let mut l = Link::new(S, 10 * S, t0);
        assert!(l.due(t0));
        let mut now = t0;
        for _ in 0..20 {
            // Refused at once (the port is closed): again one interval after the attempt.
            l.dialing(now);
            l.failed(Attempt::Unreachable, now);
            assert!(!l.due(now + S / 2));
            assert!(l.due(now + S), "retried after one interval");
            now += S;
        }
        // Unanswered for its patience (a cut cable): again at once.
        l.dialing(now);
        l.failed(Attempt::Unreachable, now + l.patience());
        assert!(l.due(now + l.patience()));
        // A session that drops: redialled at once.
        l.dialing(now);
        l.connected();
        l.failed(Attempt::Unreachable, now + 60 * S);
        assert!(l.due(now + 60 * S));
    }

    #[test]
    fn a_refusing_peer_is_tried_at_a_doubling_interval_up_to_the_maximum() {
        let t0 = Instant::now();
        let mut l = Link::new(S, 10 * S, t0);
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..6 {
            l.failed(Attempt::Refused, now);
            let mut w = S;
            while !l.due(now + w) {
                w += S;
            }
            waits.push(w.as_secs());
            now += w;
        }
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        // A session resets it; so does an administrator's connect.
        l.connected();
        l.failed(Attempt::Refused, now);
        assert!(l.due(now + S));
        l.failed(Attempt::Refused, now);
        l.dial_now(now);
        assert!(l.due(now));
    }

    #[test]
    fn an_unreachable_peer_does_not_inherit_the_refusal_backoff() {
        let t0 = Instant::now();
        let mut l = Link::new(S, 10 * S, t0);
        // Refused five times (a StandAlone peer), each attempt made when due...
        let mut now = t0;
        for _ in 0..5 {
            while !l.due(now) {
                now += S;
            }
            l.dialing(now);
            l.failed(Attempt::Refused, now);
        }
        // ...then the peer goes away: the next attempt finds nobody.
        while !l.due(now) {
            now += S;
        }
        l.dialing(now);
        l.failed(Attempt::Unreachable, now);
        assert!(l.due(now + S), "tried every interval again");
    }

    #[test]
    fn a_session_dropped_over_a_conflict_is_redialled_after_the_refusal_wait() {
        let t0 = Instant::now();
        let mut l = Link::new(S, 10 * S, t0);
        l.dialing(t0);
        l.connected();
        // The engine drops the session (a conflict it cannot settle yet), then it closes.
        for k in 0..4 {
            let now = t0 + 100 * S * k;
            l.failed(Attempt::Refused, now);
            l.failed(Attempt::Unreachable, now);
            assert!(!l.due(now + S / 2), "redialled in a tight loop");
        }
    }

    #[test]
    fn the_higher_id_dials_half_an_interval_after_the_lower_one() {
        let t0 = Instant::now();
        let lower = Link::new(S, 10 * S, t0);
        let mut higher = Link::new(S, 10 * S, t0).yielding();
        assert!(lower.due(t0));
        assert!(!higher.due(t0) && !higher.due(t0 + S / 3) && higher.due(t0 + S / 2));
        // A session that drops: the lower end redials at once, this one half an interval
        // later.
        higher.dialing(t0 + S / 2);
        higher.connected();
        let drop = t0 + 60 * S;
        higher.failed(Attempt::Unreachable, drop);
        assert!(!higher.due(drop) && higher.due(drop + S / 2));
        // A dial of its own refused at once (the peer not up yet): the usual interval.
        higher.dialing(drop + S / 2);
        higher.failed(Attempt::Unreachable, drop + S / 2);
        assert!(!higher.due(drop + S) && higher.due(drop + S / 2 + S));
        // An administrator's connect is not held back.
        higher.dial_now(drop + 2 * S);
        assert!(higher.due(drop + 2 * S));
    }

    #[test]
    fn patience_is_at_least_a_second() {
        let t0 = Instant::now();
        assert_eq!(Link::new(S / 10, S, t0).patience(), S);
        assert_eq!(Link::new(3 * S, 9 * S, t0).patience(), 3 * S);
    }

    #[test]
    fn both_ends_keep_the_connection_the_lower_id_dialed() {
        // Node 1 dialed A (to 4); node 4 dialed B (to 1). Both keep A, whatever order
        // they see them in.
        for (me, peer, a_dialed_here) in [(1, 4, true), (4, 1, false)] {
            let b_dialed_here = !a_dialed_here;
            assert!(preferred(me, peer, a_dialed_here));
            assert!(!preferred(me, peer, b_dialed_here));
            assert!(replaces(me, peer, a_dialed_here, b_dialed_here));
            assert!(!replaces(me, peer, b_dialed_here, a_dialed_here));
        }
    }

    #[test]
    fn a_new_connection_from_the_same_dialer_replaces_the_old_one() {
        for dialed in [true, false] {
            assert!(replaces(1, 4, dialed, dialed));
            assert!(replaces(4, 1, dialed, dialed));
        }
    }
}
