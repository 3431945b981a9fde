//! Peer acks' state (DRBD's `P_PEER_ACK`): the sender's writes not yet settled on every
//! replica (`Settling`), a write received from the Primary until settled (`Received`), and
//! the writes of a Primary lost before they settled (`LostPrimary`). What a replica does
//! with them is in `settle.rs`.
//!
//! The sender tells settled writes with its next write (the same batch of packets), or
//! once `BATCH` of them wait, or `DELAY_MS` after the first when no write follows.

use super::action::RAction;
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::spec::NodeId;
use crate::io::ReqId;
use std::collections::BTreeMap;

/// Settled writes are told with the next write, or once this many are waiting...
const BATCH: u64 = 64;
/// ...or once the first of them has waited this long with no write to go with (a
/// Secondary holds their extents in its activity log until then).
pub const DELAY_MS: u64 = 10;

/// The sender's side: writes sent and not yet settled, and settled ones not yet told.
#[derive(Debug, Default)]
pub(super) struct Settling {
    open: BTreeMap<u64, Open>,
    /// Settled, not told yet: (up to this sequence number, the nodes lacking those
    /// writes), consecutive writes with the same nodes lacking them merged.
    untold: Vec<(u64, NodeSet)>,
    /// The last sequence number told.
    told: u64,
    untold_writes: u64,
    since_ms: Option<u64>,
    /// Application writes with a local part, settled and answered (see
    /// [`RAction::WriteSettled`]), to be told.
    settled_local: Vec<Local>,
    /// Settled, not answered yet: by sequence number.
    unanswered: BTreeMap<u64, Local>,
    /// A write went out since the last acknowledgement: one goes with it.
    writing: bool,
}

#[derive(Debug)]
struct Open {
    /// Peers that have not answered.
    pending: NodeSet,
    /// Peers that failed it or lost their link before answering.
    missing: NodeSet,
    /// Peers not told as lacking it even so (see [`Settling::forgive`]).
    forgiven: NodeSet,
    /// The application write, if it has a local part.
    local: Option<Local>,
}

/// An application write of ours that is written here too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Local {
    pub(super) req: ReqId,
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// The application has its answer: the request id may be in use again, so
    /// [`RAction::WriteSettled`] waits for this (a driver matches it to the answered one).
    pub(super) answered: bool,
}

impl Settling {
    /// Write `seq` went to these peers; `local`: the application write, if it is written
    /// here too.
    pub(super) fn sent(&mut self, seq: u64, to: NodeSet, local: Option<Local>) {
        self.writing |= !to.is_empty();
        if to.is_empty() {
            self.unanswered.extend(local.map(|l| (seq, l)));
            return;
        }
        debug_assert!(self.open.last_key_value().is_none_or(|(&s, _)| s < seq));
        let missing = NodeSet::EMPTY;
        let open = Open {
            pending: to,
            missing,
            forgiven: NodeSet::EMPTY,
            local,
        };
        self.open.insert(seq, open);
    }

    /// Application write `seq` was answered.
    pub(super) fn local_answered(&mut self, seq: u64) {
        if let Some(l) = self.unanswered.remove(&seq) {
            self.settled_local.push(l);
        } else if let Some(l) = self.open.get_mut(&seq).and_then(|o| o.local.as_mut()) {
            l.answered = true;
        }
    }

    /// Application writes settled and answered since the last call.
    /// (Drained in place: the buffer is kept for the next ones, no allocation per write.)
    pub(super) fn take_settled_local(&mut self) -> std::vec::Drain<'_, Local> {
        self.settled_local.drain(..)
    }

    /// `peer` wrote write `seq` (`ok`), failed it, or lost its link first.
    pub(super) fn answered(&mut self, seq: u64, peer: NodeId, ok: bool, now_ms: u64) {
        let Some(o) = self.open.get_mut(&seq) else {
            return;
        };
        o.pending.remove(peer);
        if !ok {
            o.missing.insert(peer);
        }
        while let Some(first) = self.open.first_entry() {
            if !first.get().pending.is_empty() {
                break;
            }
            let (seq, o) = first.remove_entry();
            match o.local {
                Some(l) if l.answered => self.settled_local.push(l),
                Some(l) => {
                    self.unanswered.insert(seq, l);
                }
                None => {}
            }
            let missing = o.missing.minus(o.forgiven);
            match self.untold.last_mut() {
                Some((upto, m)) if *m == missing => *upto = seq,
                _ => self.untold.push((seq, missing)),
            }
            self.untold_writes += 1;
            self.since_ms.get_or_insert(now_ms);
        }
    }

    /// Write `seq` failed and `peers` keep the range as it was (see `requests.rs`,
    /// `references_for_failed`): not told yet (still open too: a protocol-B write fails
    /// at receipt, before it settles), it is told without them among the nodes lacking
    /// it, or the replicas would mark them as lacking what only the replicas pulling it
    /// back hold. Told already: too late (they stay marked).
    pub(super) fn forgive(&mut self, seq: u64, peers: NodeSet) {
        if let Some(o) = self.open.get_mut(&seq) {
            o.forgiven = o.forgiven.union(peers);
            return;
        }
        let mut from = self.told;
        for k in 0..self.untold.len() {
            let (upto, missing) = self.untold[k];
            if seq <= from || seq > upto {
                from = upto;
                continue;
            }
            if !missing.intersects(peers) {
                return;
            }
            let mut pieces = Vec::with_capacity(3);
            if seq - 1 > from {
                pieces.push((seq - 1, missing));
            }
            pieces.push((seq, missing.minus(peers)));
            if upto > seq {
                pieces.push((upto, missing));
            }
            self.untold.splice(k..=k, pieces);
            return;
        }
    }

    /// The acknowledgements to send now: with a new write (they go out in the same batch
    /// of packets, and a receiver whose activity log is full of held extents frees them
    /// before that write needs one), a batch is full, or the first untold write waited
    /// long enough (an idle sender). One a node lacks waits like the others: until told,
    /// the receivers hold it, and if this node dies first they compare (see the module's
    /// comment).
    pub(super) fn due(&mut self, now_ms: u64) -> std::vec::Drain<'_, (u64, NodeSet)> {
        let due = (self.writing && !self.untold.is_empty())
            || self.untold_writes >= BATCH
            || self.since_ms.is_some_and(|t| now_ms >= t + DELAY_MS);
        self.writing = false;
        if !due {
            return self.untold.drain(..0);
        }
        self.untold_writes = 0;
        self.since_ms = None;
        self.told = self.untold.last().map_or(self.told, |&(upto, _)| upto);
        self.untold.drain(..)
    }

    /// Ranges of volume `v` our application writes hold in the activity log, unsettled.
    pub(super) fn unsettled_local(&self, v: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.open
            .values()
            .filter_map(|o| o.local)
            .filter(move |l| l.volume as usize == v)
            .map(|l| (l.offset, u64::from(l.len)))
    }

    /// When [`due`](Self::due) has something to send by the clock alone.
    pub(super) fn next_timer(&self) -> Option<u64> {
        self.since_ms.map(|t| t + DELAY_MS)
    }

    pub(super) fn check(&self) -> Result<(), String> {
        // Later ones may be answered everywhere already; they settle after it.
        if self
            .open
            .values()
            .next()
            .is_some_and(|o| o.pending.is_empty())
        {
            return Err("the first open write is settled".into());
        }
        if self.untold.is_empty() != self.since_ms.is_none() {
            return Err("untold acknowledgements without their time".into());
        }
        Ok(())
    }
}

/// A write received from the Primary and not settled yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Received {
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// Writes of a Primary we lost before they settled, until compared with every other
/// diskful node or until we meet the same run of that Primary again (it never forgot what
/// each replica lacks).
#[derive(Debug)]
pub(super) struct LostPrimary {
    pub(super) primary: NodeId,
    /// Its run (see `Replicas::incarnation`): sequence numbers compare only within one.
    pub(super) incarnation: u64,
    /// The connections they came on (their extents leave the log once compared).
    pub(super) conns: Vec<u32>,
    /// The sequence number of the last write received from it.
    pub(super) last: u64,
    pub(super) writes: Vec<Received>,
    /// Diskful nodes not compared with yet.
    pub(super) open: NodeSet,
}

/// A peer's `PrimaryLost` about a run we have nothing unsettled of: asked while that
/// Primary's node was connected to us but had not yet told its run on that connection (the
/// answer waits for its `Role`, or the connection's end), or while we were still connected
/// to that run (kept until we lose it too, then compared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LostAsked {
    pub(super) asker: NodeId,
    /// The asker's connection (it asks again on its next one).
    pub(super) conn: u32,
    pub(super) run: (NodeId, u64),
    /// The last write of that run the asker received.
    pub(super) seq: u64,
}

impl LostPrimary {
    pub(super) fn msg(&self) -> Msg {
        Msg::PrimaryLost {
            primary: self.primary,
            incarnation: self.incarnation,
            seq: self.last,
        }
    }

    /// Its writes may leave the activity log.
    pub(super) fn release(self, out: &mut Vec<RAction>) {
        for conn in self.conns {
            out.push(RAction::Settled {
                peer: self.primary,
                conn,
                upto: u64::MAX,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> NodeSet {
        let mut s = NodeSet::EMPTY;
        for &id in ids {
            s.insert(id);
        }
        s
    }

    fn local(req: u64, volume: u16) -> Local {
        Local {
            req: ReqId(req),
            volume,
            offset: 0,
            len: 512,
            answered: false,
        }
    }

    #[test]
    fn writes_settle_in_order_and_merge_while_the_missing_nodes_agree() {
        let mut s = Settling::default();
        for seq in 1..=4 {
            s.sent(seq, set(&[1, 2]), None);
        }
        // 2 answered by both, 1 not yet: nothing settles out of order.
        s.answered(2, 1, true, 0);
        s.answered(2, 2, true, 0);
        assert!(s.due(100).collect::<Vec<_>>().is_empty());
        s.answered(1, 1, true, 5);
        s.answered(1, 2, true, 5);
        s.answered(3, 1, true, 6);
        s.answered(3, 2, false, 6);
        s.answered(4, 1, true, 7);
        s.answered(4, 2, false, 7);
        // Told after the delay (or with the next write), the batch split where the missing
        // nodes change.
        assert!(s.due(5 + DELAY_MS - 1).collect::<Vec<_>>().is_empty());
        assert_eq!(
            s.due(5 + DELAY_MS).collect::<Vec<_>>(),
            vec![(2, NodeSet::EMPTY), (4, set(&[2]))]
        );
        assert!(s.due(1000).collect::<Vec<_>>().is_empty());
        assert_eq!(s.next_timer(), None);
        s.check().unwrap();
    }

    #[test]
    fn settled_writes_wait_for_a_batch_or_the_delay() {
        let mut s = Settling::default();
        s.sent(1, set(&[1]), Some(local(9, 0)));
        assert!(
            s.due(0).collect::<Vec<_>>().is_empty(),
            "sent, nothing settled yet"
        );
        s.answered(1, 1, true, 100);
        assert!(s.due(100 + DELAY_MS - 1).collect::<Vec<_>>().is_empty());
        assert_eq!(s.next_timer(), Some(100 + DELAY_MS));
        assert_eq!(
            s.due(100 + DELAY_MS).collect::<Vec<_>>(),
            vec![(1, NodeSet::EMPTY)]
        );
        assert!(
            s.take_settled_local().collect::<Vec<_>>().is_empty(),
            "settled, not answered"
        );
        s.local_answered(1);
        assert_eq!(
            s.take_settled_local().collect::<Vec<_>>(),
            vec![local(9, 0)]
        );
        // No peer to go to: settled at once; answered first, then settled.
        s.sent(1000, NodeSet::EMPTY, Some(local(10, 1)));
        s.local_answered(1000);
        assert_eq!(
            s.take_settled_local().collect::<Vec<_>>(),
            vec![local(10, 1)]
        );
        s.sent(1001, set(&[1]), Some(local(11, 0)));
        s.local_answered(1001);
        assert!(s.take_settled_local().collect::<Vec<_>>().is_empty());
        s.answered(1001, 1, true, 150);
        let told = s.take_settled_local().collect::<Vec<_>>();
        assert_eq!(
            (told.len(), told[0].req, told[0].answered),
            (1, ReqId(11), true)
        );
        for seq in 1002..1002 + BATCH {
            s.sent(seq, set(&[1]), None);
            s.answered(seq, 1, true, 200);
        }
        assert!(s.due(200).collect::<Vec<_>>().len() == 1, "a full batch");
        // The next write carries what settled before it.
        s.sent(2000, set(&[1]), None);
        assert!(s.due(300).collect::<Vec<_>>().is_empty());
        s.answered(2000, 1, true, 300);
        assert!(
            s.due(300).collect::<Vec<_>>().is_empty(),
            "nothing written since"
        );
        s.sent(2001, set(&[1]), None);
        assert_eq!(s.due(300).collect::<Vec<_>>(), vec![(2000, NodeSet::EMPTY)]);
    }
}
