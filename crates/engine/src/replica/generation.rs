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
use super::local::SetBack;
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use crate::io::ReqId;
use tandem_wire::packet::{DiskState, Role};
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

/// `g` as before its last rotation: its current id the first of its history (the oldest
/// entry, pushed out by that rotation, is not known again: 0, the root of every lineage).
pub(super) fn unrotated(g: &GenIds) -> GenIds {
    let mut history = [0; GI_HISTORY];
    history[..GI_HISTORY - 1].copy_from_slice(&g.history[1..]);
    GenIds {
        current: g.history[0],
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
    /// It was promoted with these ids, rotated from them, and crashed before it
    /// acknowledged anything under the new ones (`Msg::Abandoned`): with the same ids it
    /// is the reference before one merely Primary with them, since it held all they name
    /// when promoted. Failover seed 370000341: two Primaries back from crashes with the
    /// same ids, the earlier one Inconsistent (it had been pulling its log's extents under
    /// the later one), outranked the later one by node id, and no replica was up to date
    /// again.
    pub(super) rotated_from: bool,
    /// Its node crashed in another boot (a power loss): writes to its activity log's
    /// extents may have gone with the page cache. With the same ids, one that kept its
    /// page cache is the better source (cluster-crash soak seed 456019065: both replicas
    /// back from crashes with equal ids, the one that lost power outranked the other by
    /// node id, and its reverted block overwrote an acknowledged write the other held).
    pub(super) lost_power: bool,
}

/// Whether replica `a` (of node `a_id`) is the better source than `b`: newer ids first;
/// with the same ids, the one that was Primary, then the one that stopped cleanly, then
/// the one whose node kept its page cache, then the lower node id. `None`: they diverged.
pub(super) fn outranks(a: &Standing, a_id: NodeId, b: &Standing, b_id: NodeId) -> Option<bool> {
    match lineage(&a.gen, &b.gen) {
        Lineage::Newer => Some(true),
        Lineage::Older => Some(false),
        Lineage::Diverged => None,
        Lineage::Same => {
            let key = |s: &Standing, id: NodeId| {
                let Standing {
                    rotated_from,
                    was_primary,
                    clean,
                    lost_power,
                    ..
                } = *s;
                let kept_cache = !lost_power;
                (
                    rotated_from,
                    was_primary,
                    clean,
                    kept_cache,
                    std::cmp::Reverse(id),
                )
            };
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
    /// Replicas being synced lost since the current id was made (`peer_lost`): any may
    /// have adopted it unheard at the end of its resync. A write that misses one waits for
    /// the id to change, as for a holder; losing one again changes nothing at once.
    unheard: NodeSet,
    /// While a rotation runs: the holders of the id before it (writes that missed only
    /// those complete once this rotation has).
    before: NodeSet,
    running: Option<Rotation>,
    /// Writes that missed a node that may hold the id being rotated to: they wait for the
    /// next rotation.
    queued: Vec<ReqId>,
    /// A holder was lost while a rotation ran: another one follows.
    again: bool,
    /// Our ids when we last acknowledged a request of the volume (or were promoted): every
    /// rotation since made an id no completed request of ours needed.
    acked: GenIds,
    /// While we are without quorum with ids set back to `acked`: the ids we rotated to,
    /// taken up again by the next rotation or when quorum returns (`hold_back`).
    set_back: Option<GenIds>,
}

#[derive(Debug)]
struct Rotation {
    gi: u64,
    /// Connected peers that have not answered yet.
    waiting: NodeSet,
    /// Writes completed once it is done.
    parked: Vec<ReqId>,
    /// The ids set back without quorum, taken up again as it returned (`hold_back`):
    /// nothing we acknowledge counts as acknowledged under them (`acked`) until every
    /// peer connected then answered.
    taken_up: bool,
}

/// Our ids of volume `v`, set back or taken up again, to every connected diskful peer: one
/// up to date under us adopts them as it does a rotation's (seed 109: a replica that
/// adopted the ids set back from our `Volume` as quorum returned kept them while we wrote
/// on under those taken up again, and the next Primary's rotation from them diverged from
/// ours). Its `GenAck` answers no rotation and is ignored.
fn tell_gen(rep: &Replicas, v: usize, out: &mut Vec<RAction>) {
    let gen = rep.vols[v].gen;
    for p in rep.peers.up().filter(|p| p.vols[v].diskful) {
        out.push(RAction::Send {
            peer: p.id,
            msg: Msg::Generation {
                volume: v as u16,
                gen,
            },
        });
    }
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
    /// We acknowledged a request since our promotion (see `superseded`).
    acked_in_tenure: bool,
}

impl Rotations {
    pub(super) fn new(volumes: usize) -> Rotations {
        Rotations {
            vols: (0..volumes).map(|_| VolRotation::default()).collect(),
            acked_in_tenure: false,
        }
    }

    /// This node became Primary: any diskful node may hold the current id.
    pub(super) fn promoted(&mut self, rep: &Replicas) {
        self.acked_in_tenure = false;
        for (v, vr) in self.vols.iter_mut().enumerate() {
            *vr = VolRotation {
                acked: rep.vols[v].gen,
                ..VolRotation::default()
            };
            for (id, keeps) in &rep.spec.nodes {
                if keeps[v] {
                    vr.holders.insert(*id);
                }
            }
        }
    }

    /// Right after our promotion was told to the peers: with a node away, the ids
    /// change at once (DRBD makes a new current UUID at the first write after such a
    /// promotion). The replicas with us adopt them, so an old Primary cut off with
    /// requests held, meeting one of them again, finds newer data there and steps down
    /// (`superseded`) instead of completing what it held under the application we were
    /// promoted for (failover soak seed 320013211: node 2, following no Primary by then,
    /// gave it back its quorum, and it synced node 2 from itself). A diskless node away
    /// counts too: it may be that old Primary, and it has no replica to hold the ids it
    /// would compare (failover soak seed 406008806).
    pub(super) fn rotate_if_away(&mut self, rep: &mut Replicas, out: &mut Vec<RAction>) {
        for v in 0..self.vols.len() {
            let me = rep.spec.me;
            let away = (rep.spec.nodes.iter())
                .any(|(id, _)| *id != me && !rep.peers.get(*id).is_some_and(|p| p.up));
            if away && self.vols[v].running.is_none() {
                self.start(rep, v, Vec::new(), out);
                let released = self.finish_if_answered(rep, v, out);
                debug_assert!(released.is_empty());
            }
        }
    }

    /// As Primary with quorum on: a connected peer whose replica of a volume shows that
    /// another Primary was promoted and went on without us (its promotion changed the ids,
    /// `rotate_if_away`), so we must not complete what we held, nor serve data older than
    /// theirs. Either its ids are newer than those of our up-to-date replica (and than the
    /// ids we set aside without quorum, `hold_back`, which a replica may have adopted from
    /// us), or they diverged from ours and we have no quorum without it: its vote went to
    /// that other Primary (failover seed 398: node 0, cut off with writes held, met node 1,
    /// which had followed node 2 since, and completed them with node 1 as its quorum), or
    /// we have acknowledged nothing since our promotion: another Primary wrote within our
    /// tenure, and anything we complete now overlaps its writes (failover seed 406001429:
    /// node 2, which gave us its vote to be promoted, met the old Primary first and
    /// refused us; the old one completed what it held with node 2 as its quorum, and we
    /// took up our ids again once all met and completed writes after).
    /// A diskless Primary is checked by the ids it keeps for the replicas it writes to.
    pub(super) fn superseded(&self, rep: &Replicas) -> Option<(NodeId, u16)> {
        if rep.role != Role::Primary || rep.spec.quorum.is_off() {
            return None;
        }
        (0..self.vols.len()).find_map(|v| {
            let vol = &rep.vols[v];
            if vol.diskful && vol.disk != DiskState::UpToDate {
                return None;
            }
            let ahead = self.vols[v].set_back.unwrap_or(vol.gen);
            let went_on = |p: &super::peer::Peer| {
                let g = &p.vols[v].gen;
                match (lineage(&vol.gen, g), lineage(&ahead, g)) {
                    (Lineage::Older, Lineage::Older | Lineage::Diverged) => true,
                    (Lineage::Diverged, Lineage::Diverged) => {
                        !self.acked_in_tenure
                            || !rep
                                .quorum_count_reaching(v, |q| q.up && q.id != p.id)
                                .quorate(vol.quorum_held)
                    }
                    _ => false,
                }
            };
            (rep.peers.up())
                .find(|p| p.vols[v].diskful && went_on(p))
                .map(|p| (p.id, v as u16))
        })
    }

    /// A volume whose rotation waits for a peer's answer, and that peer.
    pub(super) fn unanswered(&self) -> Option<(u16, NodeId)> {
        self.vols.iter().enumerate().find_map(|(v, vr)| {
            let r = vr.running.as_ref()?;
            Some((v as u16, r.waiting.iter().next()?))
        })
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
        if missing.intersects(vr.holders.union(vr.unheard)) {
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
        // Set back without quorum (`hold_back`): the new id follows the ones we had
        // rotated to, so a replica that adopted one of those is older, not apart.
        let base = self.vols[v].set_back.take().unwrap_or(vol.gen);
        vol.gen = rotated(&base, gi);
        let gen = vol.gen;
        let volume = v as u16;
        out.push(RAction::Event(Event::GenerationChanged {
            volume,
            from,
            to: gi,
        }));
        let vr = &mut self.vols[v];
        vr.before = vr.holders.union(std::mem::take(&mut vr.unheard));
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
            taken_up: false,
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
    /// A replica being synced (`behind`, per volume) holds another id, but its resync
    /// under our list ends with ours adopted, and its report of that may be lost with the
    /// link: it is `unheard` from now on, so the next write it misses changes the ids
    /// (`missed`, the write waiting for the other replicas to adopt them), as DRBD makes a
    /// new current UUID at the first write after losing a peer disk. Kept, our ids named
    /// data that replica lacked (overlapping soak seed 451053910: its resync ended as the
    /// link dropped; a write then landed on the other replica alone under the ids both
    /// held, and a restart of both settled the block the wrong way). Not at once, nor at
    /// its next loss: a write in flight then completed under new ids no other replica took
    /// when the rest of a partition followed (failover seed 2206: a false split brain).
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
        behind: Vec<bool>,
        out: &mut Vec<RAction>,
    ) -> Vec<ReqId> {
        let mut released = Vec::new();
        debug_assert_eq!(behind.len(), self.vols.len());
        for (v, behind) in behind.into_iter().enumerate() {
            let quorate = rep.has_quorum(v);
            let vr = &mut self.vols[v];
            // A tiebreaker a rotation waits for holds no id.
            let holder = vr.holders.contains(peer);
            if behind {
                vr.unheard.insert(peer);
            }
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

    /// A request of volume `v` (a write, or a FLUSH: every volume) was acknowledged under
    /// our current ids.
    /// Before the completion is pushed: ids new to `acked` are announced
    /// (`Event::GenerationAcked`), for the metadata to hold them first.
    pub(super) fn acked(&mut self, rep: &Replicas, v: Option<usize>, out: &mut Vec<RAction>) {
        self.acked_in_tenure = true;
        for (u, vr) in self.vols.iter_mut().enumerate() {
            let taking_up = vr.running.as_ref().is_some_and(|r| r.taken_up);
            if v.is_none_or(|v| v == u) && vr.acked != rep.vols[u].gen && !taking_up {
                vr.acked = rep.vols[u].gen;
                out.push(RAction::Event(Event::GenerationAcked {
                    volume: u as u16,
                    current: vr.acked.current,
                }));
            }
        }
    }

    /// Our ids of volume `v` when we last acknowledged a request there (or were promoted).
    pub(super) fn acked_gen(&self, v: usize) -> Option<GenIds> {
        self.vols.get(v).map(|vr| vr.acked)
    }

    /// The id volume `v` was set back from without quorum (`hold_back`), while it stays
    /// set aside: nothing we acknowledged is under it.
    pub(super) fn set_aside(&self, v: usize) -> Option<u64> {
        self.vols.get(v)?.set_back.map(|ahead| ahead.current)
    }

    /// This node is Secondary now: ids set back stay so (it acknowledged nothing under
    /// the ones it had rotated to), and are not taken up again. The id set aside is
    /// abandoned as a crash's is (`LocalVol::set_back_from`), told to every peer that
    /// connects while we hold the ids set back to: a replica away at the set-back keeps
    /// it among the ids of its orphans' writers (`Resync::orphan_writers`), and no lister
    /// ever holds it (failover soak seed 422002317).
    pub(super) fn demoted(&mut self, rep: &mut Replicas) {
        for (vr, vol) in self.vols.iter_mut().zip(&mut rep.vols) {
            if let Some(ahead) = vr.set_back.take() {
                vol.set_back_from = Some(SetBack {
                    gi: ahead.current,
                    to: vol.gen,
                    without_quorum: true,
                });
            }
        }
    }

    /// At the end of every event, as Primary. A volume without quorum, no rotation
    /// running or queued, whose ids moved on since we last acknowledged a request there,
    /// sets them back to those (`Event::GenerationSetBack`, persisted like a rotation): we
    /// acknowledge nothing without quorum, so the ids rotated to since name no write of
    /// ours, and no peer may hold them but as adopted. Kept, they diverged from those of
    /// the Primary the majority promotes next, and a whole cluster meeting again saw a
    /// split brain where we had acknowledged nothing apart (failover seeds 86, 163, 175,
    /// 204: the first loss rotated the ids with quorum, the second, in the same instant,
    /// took it before any peer adopted them; seed 109: a FLUSH parked behind a rotation
    /// rotated them again after quorum was gone). DRBD marks such ids instead
    /// (`UUID_FLAG_PRIMARY_LOST_QUORUM`); set back, they need no mark on the wire or in
    /// the metadata, and every rule that compares ids sees us as older than the replicas
    /// that went on. The rotation's purpose holds: a replica that missed a write we
    /// completed is older than `acked`, since the write completed under those ids or
    /// later ones we keep.
    ///
    /// Quorum back, the ids rotated to are taken up again, unless a connected peer's
    /// diverged from them (another Primary wrote on from an older id): a replica that
    /// adopted one of them while we had it stays older than us rather than apart.
    pub(super) fn hold_back(&mut self, rep: &mut Replicas, out: &mut Vec<RAction>) {
        for (v, vr) in self.vols.iter_mut().enumerate() {
            let vol = &rep.vols[v];
            // Nearly always: nothing set aside, nothing rotated since the last
            // acknowledgement. Decided before the quorum is counted (every event).
            if vr.set_back.is_none() && vol.gen == vr.acked {
                continue;
            }
            let (from, volume) = (vol.gen.current, v as u16);
            if rep.has_quorum(v) {
                let Some(ahead) = vr.set_back.take() else {
                    continue;
                };
                let diverged = (rep.peers.up())
                    .filter(|p| p.vols[v].diskful)
                    .any(|p| lineage(&ahead, &p.vols[v].gen) == Lineage::Diverged);
                if diverged || ahead == vol.gen {
                    continue;
                }
                rep.vols[v].gen = ahead;
                out.push(RAction::Event(Event::GenerationSetBack {
                    volume,
                    from,
                    to: ahead.current,
                    restored: true,
                }));
                tell_gen(rep, v, out);
                // Answered like a rotation: a request acknowledged before a connected
                // peer adopted them must not make them the ids a crash keeps. Failover
                // soak seed 422002192: a FLUSH held without quorum completed as it came
                // back, the peer's link dropped before our ids reached it, and we crashed
                // keeping them; that peer, promoted later from the ids before, met us back
                // with ids apart from its own, took them for a Primary that went on
                // without it, stepped down and pulled its tenure's acknowledged writes
                // back from our older replica.
                let waiting: NodeSet = (rep.peers.up())
                    .filter(|p| p.vols[v].diskful)
                    .map(|p| p.id)
                    .collect();
                if !waiting.is_empty() {
                    vr.before = vr.holders;
                    vr.running = Some(Rotation {
                        gi: ahead.current,
                        waiting,
                        parked: Vec::new(),
                        taken_up: true,
                    });
                }
                continue;
            }
            if vr.running.is_some() || !vr.queued.is_empty() || vol.gen == vr.acked {
                continue;
            }
            if vr.set_back.is_none() {
                vr.set_back = Some(vol.gen);
            }
            // Any diskful node may hold the ids set back to (a holder lost since they
            // were current among them): a write that misses one waits for a rotation,
            // whether or not quorum back takes up the others.
            for (id, keeps) in &rep.spec.nodes {
                if keeps[v] {
                    vr.holders.insert(*id);
                }
            }
            rep.vols[v].gen = vr.acked;
            out.push(RAction::Event(Event::GenerationSetBack {
                volume,
                from,
                to: vr.acked.current,
                restored: false,
            }));
            tell_gen(rep, v, out);
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
