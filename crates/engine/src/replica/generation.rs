//! Generation ids: whose data is newer when replicas that restarted meet with no Primary
//! and no up-to-date replica around (a whole cluster back from a crash), and the Primary's
//! rotation of them.
//!
//! A replica's `current` id names the data it holds; its history names what it held
//! before. The Primary changes the id (`Rotations`) before it answers a write that missed
//! a replica which may hold the current id: every replica that got the write and is up to
//! date under the Primary adopts the new id durably first (the driver writes it to the
//! metadata when [`Event::GenerationChanged`] passes, before the actions after it), so
//! the replica that missed the write is older by its ids afterwards, even if every node
//! crashes. Replicas synced later adopt the id of their source (or of the Primary).
//!
//! Two replicas with the same id hold the same writes, except where an activity log or a
//! bitmap says otherwise; one whose current id is in the other's history is older; neither
//! is a split brain.

use super::action::RAction;
use super::event::Event;
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use crate::io::ReqId;
pub use tandem_wire::packet::{GenIds, GI_HISTORY};

/// How two replicas' ids relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lineage {
    Same,
    /// Ours descends from theirs.
    Newer,
    Older,
    /// Each changed apart from the other: a split brain.
    Diverged,
}

pub fn lineage(mine: &GenIds, theirs: &GenIds) -> Lineage {
    let knows = |g: &GenIds, gi: u64| gi == 0 || g.history.contains(&gi);
    if mine.current == theirs.current {
        Lineage::Same
    } else if knows(mine, theirs.current) {
        Lineage::Newer
    } else if knows(theirs, mine.current) {
        Lineage::Older
    } else {
        Lineage::Diverged
    }
}

/// `g` with `gi` as its current id, the old one first in the history.
pub(super) fn rotated(g: &GenIds, gi: u64) -> GenIds {
    let mut history = [0; GI_HISTORY];
    history[0] = g.current;
    history[1..].copy_from_slice(&g.history[..GI_HISTORY - 1]);
    GenIds {
        current: gi,
        history,
    }
}

/// What a replica that restarted consistent brings to the ranking: fixed from its start
/// until it is settled (UpToDate), so both sides of a connection rank from the same facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Standing {
    pub(super) gen: GenIds,
    /// It stopped cleanly (else it crashed, and its activity log names where it may
    /// differ from the others).
    pub(super) clean: bool,
    /// It was Primary when it stopped: with the same ids, its data is the reference (it
    /// may hold writes it completed that the others never received, under protocol A).
    pub(super) was_primary: bool,
}

/// Whether replica `a` (of node `a_id`) is the better source than `b`: newer ids first;
/// with the same ids, the one that was Primary, then the one that stopped cleanly, then
/// the lower node id. `None`: they diverged.
pub(super) fn outranks(a: &Standing, a_id: NodeId, b: &Standing, b_id: NodeId) -> Option<bool> {
    match lineage(&a.gen, &b.gen) {
        Lineage::Newer => Some(true),
        Lineage::Older => Some(false),
        Lineage::Diverged => None,
        Lineage::Same => {
            let key = |s: &Standing, id: NodeId| (s.was_primary, s.clean, std::cmp::Reverse(id));
            Some(key(a, a_id) > key(b, b_id))
        }
    }
}

/// One volume's rotation on the Primary.
#[derive(Debug, Default)]
struct VolRotation {
    /// Nodes (this one included) that may hold the current id: a write that misses one
    /// must not complete before the id has changed.
    holders: NodeSet,
    /// While a rotation runs: the holders of the id before it (writes that missed only
    /// those complete once this rotation has).
    before: NodeSet,
    running: Option<Rotation>,
    /// Writes that missed a node that may hold the id being rotated to: they wait for the
    /// next rotation.
    queued: Vec<ReqId>,
    /// A holder was lost while a rotation ran: another one follows.
    again: bool,
}

#[derive(Debug)]
struct Rotation {
    gi: u64,
    /// Connected peers that have not answered yet.
    waiting: NodeSet,
    /// Writes completed once it is done.
    parked: Vec<ReqId>,
}

/// What a write that missed some replicas must do before it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Missed {
    /// Complete it now.
    Complete,
    /// It waits for a rotation (parked or queued).
    Waits,
}

/// The Primary's rotations, per volume.
#[derive(Debug)]
pub(super) struct Rotations {
    vols: Vec<VolRotation>,
}

impl Rotations {
    pub(super) fn new(volumes: usize) -> Rotations {
        Rotations {
            vols: (0..volumes).map(|_| VolRotation::default()).collect(),
        }
    }

    /// This node became Primary: any diskful node may hold the current id.
    pub(super) fn promoted(&mut self, rep: &Replicas) {
        for (v, vr) in self.vols.iter_mut().enumerate() {
            *vr = VolRotation::default();
            for (id, keeps) in &rep.spec.nodes {
                if keeps[v] {
                    vr.holders.insert(*id);
                }
            }
        }
    }

    /// A rotation waits for `peer`'s answer (its `GenAck`).
    pub(super) fn awaits(&self, peer: NodeId) -> bool {
        (self.vols.iter()).any(|vr| {
            vr.running
                .as_ref()
                .is_some_and(|r| r.waiting.contains(peer))
        })
    }

    /// A peer's replica reported our current id.
    pub(super) fn holds(&mut self, v: usize, peer: NodeId) {
        self.vols[v].holders.insert(peer);
    }

    /// A write of volume `v` that landed somewhere completes with `missing` replicas: now,
    /// or once the id has changed (then [`Rotations::released`] gives it back).
    pub(super) fn missed(
        &mut self,
        rep: &mut Replicas,
        v: usize,
        req: ReqId,
        missing: NodeSet,
        out: &mut Vec<RAction>,
    ) -> Missed {
        let vr = &mut self.vols[v];
        if missing.intersects(vr.holders) {
            if vr.running.is_some() {
                vr.queued.push(req);
                return Missed::Waits;
            }
            self.start(rep, v, vec![req], out);
            // No peer to wait for: done already.
            let released = self.finish_if_answered(rep, v, out);
            debug_assert!(released.iter().all(|&r| r == req));
            return if released.is_empty() {
                Missed::Waits
            } else {
                Missed::Complete
            };
        }
        match vr.running.as_mut() {
            Some(r) if missing.intersects(vr.before) => {
                r.parked.push(req);
                Missed::Waits
            }
            _ => Missed::Complete,
        }
    }

    fn start(&mut self, rep: &mut Replicas, v: usize, parked: Vec<ReqId>, out: &mut Vec<RAction>) {
        let gi = rep.next_gi();
        let vol = &mut rep.vols[v];
        let from = vol.gen.current;
        vol.gen = rotated(&vol.gen, gi);
        let gen = vol.gen;
        let volume = v as u16;
        out.push(RAction::Event(Event::GenerationChanged {
            volume,
            from,
            to: gi,
        }));
        let vr = &mut self.vols[v];
        vr.before = vr.holders;
        vr.holders = NodeSet::EMPTY;
        if rep.vols[v].up_to_date() {
            vr.holders.insert(rep.spec.me);
        }
        let mut waiting = NodeSet::EMPTY;
        for p in rep.peers.up().filter(|p| p.vols[v].diskful) {
            out.push(RAction::Send {
                peer: p.id,
                msg: Msg::Generation { volume, gen },
            });
            waiting.insert(p.id);
        }
        // Until they answer, any of them may adopt it.
        vr.holders = vr.holders.union(waiting);
        // And the tiebreakers learn which voters are away (`tiebreak.rs`).
        waiting = waiting.union(rep.tell_tiebreakers(v, gi, out));
        vr.running = Some(Rotation {
            gi,
            waiting,
            parked,
        });
    }

    /// `peer` answered the rotation to `gi` (`adopted`: its replica holds it now).
    pub(super) fn answered(
        &mut self,
        rep: &mut Replicas,
        v: usize,
        peer: NodeId,
        gi: u64,
        adopted: bool,
        out: &mut Vec<RAction>,
    ) -> Vec<ReqId> {
        let vr = &mut self.vols[v];
        let Some(r) = vr.running.as_mut().filter(|r| r.gi == gi) else {
            return Vec::new();
        };
        if r.waiting.contains(peer) {
            r.waiting.remove(peer);
            if !adopted {
                vr.holders.remove(peer);
            }
        }
        self.finish_if_answered(rep, v, out)
    }

    /// `peer`'s connection dropped. If it may hold the current id, the id changes now
    /// (as DRBD makes a new current UUID when a Primary loses a peer): writes it had
    /// received but not confirmed may already have completed (protocols A and B). If it
    /// was answering a rotation, it may have adopted that id before its answer was lost,
    /// so it stays a holder and another rotation follows.
    ///
    /// Not when the loss leaves the volume without quorum: from then on we acknowledge no
    /// write (`requests/suspended.rs`), and every write acknowledged before is on a
    /// majority that may promote another Primary, whose ids then descend from ours. A
    /// rotation here made our ids diverge from that Primary's: a whole cluster restarted
    /// afterwards saw a split brain where we had acknowledged nothing apart (engine test
    /// `a_primary_losing_quorum_keeps_its_ids_and_a_restarted_cluster_sees_no_split_brain`).
    pub(super) fn peer_lost(
        &mut self,
        rep: &mut Replicas,
        peer: NodeId,
        out: &mut Vec<RAction>,
    ) -> Vec<ReqId> {
        let mut released = Vec::new();
        for v in 0..self.vols.len() {
            let quorate = rep.has_quorum(v);
            let vr = &mut self.vols[v];
            // A tiebreaker a rotation waits for holds no id.
            let holder = vr.holders.contains(peer);
            match vr.running.as_mut() {
                Some(r) => {
                    r.waiting.remove(peer);
                    vr.again |= holder && quorate;
                }
                None if holder && quorate => self.start(rep, v, Vec::new(), out),
                None => {}
            }
            released.extend(self.finish_if_answered(rep, v, out));
        }
        released
    }

    /// Once every peer answered: the writes it held are released, and the next rotation
    /// starts for those queued meanwhile (done at once too if no peer is connected).
    fn finish_if_answered(
        &mut self,
        rep: &mut Replicas,
        v: usize,
        out: &mut Vec<RAction>,
    ) -> Vec<ReqId> {
        let mut released = Vec::new();
        loop {
            let vr = &mut self.vols[v];
            if vr.running.as_ref().is_none_or(|r| !r.waiting.is_empty()) {
                return released;
            }
            let done = vr.running.take().expect("checked above");
            vr.before = NodeSet::EMPTY;
            released.extend(done.parked);
            let queued = std::mem::take(&mut vr.queued);
            if queued.is_empty() && !std::mem::take(&mut vr.again) {
                return released;
            }
            vr.again = false;
            self.start(rep, v, queued, out);
        }
    }

    /// Writes waiting for a rotation.
    pub(super) fn waiting(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.vols.iter().flat_map(|vr| {
            vr.running
                .iter()
                .flat_map(|r| r.parked.iter())
                .chain(vr.queued.iter())
                .copied()
        })
    }
}
