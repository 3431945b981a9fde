//! Who is Primary beyond the peers we reach. DRBD settles a promotion with a cluster-wide
//! two-phase state change; tandem has every node tell each peer which Primaries it is
//! connected to (`Msg::Primaries`, after its `Role` and on every change), and three rules
//! use those reports:
//!
//! - A node does not become Primary while a peer follows another Primary it cannot reach
//!   itself (an asymmetric partition: A and B cut apart, both still reaching C):
//!   `PromoteError::PrimaryBeyond`.
//! - A Secondary that follows a Primary refuses a second one (`ProtocolError::SecondPrimary`,
//!   the link to the newcomer dropped): two promotions at once, each seeing no other
//!   Primary, still leave every replica following one Primary, and the newcomer's writes
//!   reach no replica of the first one's.
//! - A Primary, with quorum on, that learns of another Primary (met directly, or followed
//!   by a peer) and has no quorum without the nodes that follow that one, steps down
//!   (`Replicas::yielding`): its held requests fail, new ones fail, and once nothing is in
//!   flight it is Secondary (`RoleChange::Yielded`), converging from the new Primary as
//!   any node demoted without quorum (`quorum.rs`, `left_without_quorum`). Without this,
//!   an old Primary cut off with suspended I/O, back among a majority that went on, would
//!   be refused by every peer and hold its clients' requests for ever.

use super::action::RAction;
use super::event::{Event, ProtocolError};
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use tandem_wire::packet::Role;

/// Why a Primary steps down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StepDown {
    /// Another Primary, with the nodes following it, holds the quorum.
    Yield(NodeId),
    /// A connected peer's replica of `volume` is newer by its ids than ours: another
    /// Primary went on without us (`Rotations::superseded`).
    Superseded { peer: NodeId, volume: u16 },
    /// `peer`, met while we had no quorum, followed a run of `primary` we never knew of
    /// (`followed_elsewhere`).
    Outrun { peer: NodeId, primary: NodeId },
}

impl Replicas {
    /// The connected peers that are Primary.
    fn connected_primaries(&self) -> NodeSet {
        let mut set = NodeSet::EMPTY;
        for p in self.peers.up().filter(|p| p.role == Role::Primary) {
            set.insert(p.id);
        }
        set
    }

    /// Tells every connected peer the Primaries we follow, when that changed since we last
    /// told it on this connection (a peer is never told of itself).
    pub(super) fn tell_primaries(&mut self, out: &mut Vec<RAction>) {
        let primaries = self.connected_primaries();
        for p in self.peers.iter_mut().filter(|p| p.up) {
            let nodes = primaries.minus(NodeSet::one(p.id));
            if p.primaries_told != Some(nodes) {
                p.primaries_told = Some(nodes);
                out.push(RAction::Send {
                    peer: p.id,
                    msg: Msg::Primaries { nodes },
                });
            }
        }
    }

    /// Peer `i` follows these Primaries. Ids that are not nodes of the resource, or the
    /// peer itself, break the protocol.
    pub(super) fn on_primaries(
        &mut self,
        i: usize,
        nodes: NodeSet,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let peer = self.peers[i].id;
        let mut known = NodeSet::one(self.spec.me);
        for (id, _) in &self.spec.nodes {
            known.insert(*id);
        }
        if !nodes.is_subset(known) || nodes.contains(peer) {
            return Err(ProtocolError::BadPrimaries(nodes.bits()));
        }
        let before = std::mem::replace(&mut self.peers[i].primaries, nodes);
        self.peers[i].primaries_heard = true;
        for primary in before.minus(nodes).iter() {
            self.stopped_following(i, primary, out);
        }
        if nodes.is_empty() {
            // It follows no Primary now: a notice it set aside under one applies.
            self.tell_outdated_on_connect(i, out);
        }
        Ok(())
    }

    /// A connected peer that has not yet said which Primaries it follows (it does right
    /// after connecting, after any `Outdated` notice it has for us: `tiebreak.rs`).
    pub(super) fn peer_unheard(&self) -> Option<NodeId> {
        self.peers.up().find(|p| !p.primaries_heard).map(|p| p.id)
    }

    /// A Primary some connected peer follows that we do not reach ourselves: the Primary
    /// and the peer that follows it.
    pub(super) fn primary_beyond(&self) -> Option<(NodeId, NodeId)> {
        let me = self.spec.me;
        self.peers.up().find_map(|p| {
            let primary = p.primaries.minus(NodeSet::one(me)).iter().next()?;
            Some((primary, p.id))
        })
    }

    /// Peer `i`'s notices of volume `v` are live (its list to us ended) and it follows a
    /// Primary while we follow none and are none: what it tells us we lack is a write of
    /// that Primary, which we missed.
    pub(super) fn relays_primary_beyond(&self, i: usize, v: usize) -> bool {
        let p = &self.peers[i];
        p.vols[v].listed
            && self.role != Role::Primary
            && self.peers.primary().is_none()
            && !p.primaries.minus(NodeSet::one(self.spec.me)).is_empty()
    }

    /// Peer `i` announced itself Primary: another connected Primary we follow already.
    pub(super) fn second_primary(&self, i: usize) -> Option<NodeId> {
        let newcomer = self.peers[i].id;
        (self.role != Role::Primary)
            .then(|| self.connected_primaries().minus(NodeSet::one(newcomer)))
            .and_then(|others| others.iter().next())
    }

    /// As Primary with quorum on, having learnt that `other` is Primary too: whether we
    /// must step down, some volume having no quorum once `other` and the peers following
    /// it are not counted (they vote for it, not for us).
    pub(super) fn must_yield_to(&self, other: NodeId) -> bool {
        if self.role != Role::Primary || self.spec.quorum.is_off() {
            return false;
        }
        let theirs = |id: NodeId, follows: NodeSet| id == other || follows.contains(other);
        (0..self.vols.len()).any(|v| {
            let c = self.quorum_count_reaching(v, |p| p.up && !theirs(p.id, p.primaries));
            !c.quorate(self.vols[v].quorum_held)
        })
    }

    /// As Primary: the first other Primary a peer follows that we must step down for.
    pub(super) fn yield_due(&self) -> Option<NodeId> {
        if self.yielding.is_some() || self.role != Role::Primary {
            return None;
        }
        let me = self.spec.me;
        let mut others = NodeSet::EMPTY;
        for p in self.peers.up() {
            others = others.union(p.primaries.minus(NodeSet::one(me)));
        }
        // Nearly always empty: this runs at the end of every event of a Primary.
        if others.is_empty() {
            return None;
        }
        others.iter().find(|&n| self.must_yield_to(n))
    }

    /// `node`'s run `incarnation` is one we follow as our Primary, or heard of before any
    /// tenure of ours began: no run of ours overlapped it.
    pub(super) fn know_run(&mut self, node: NodeId, incarnation: u64) {
        /// Enough for every node of a resource to have restarted a few times.
        const KEPT: usize = 128;
        let run = (node, incarnation);
        self.runs_known.retain(|r| *r != run);
        if self.runs_known.len() == KEPT {
            self.runs_known.remove(0);
        }
        self.runs_known.push(run);
    }

    /// As Primary with quorum on and without it now: peer `i` says (its `PrimaryLost`) it
    /// followed `run` of another Primary, one we never followed ourselves. That run began
    /// while we were cut off, for all we can tell: a majority promoted it, so what we hold
    /// must not complete, whatever the peer's ids say (failover soak seed 337009897: the
    /// peer had been a sync target of that Primary, with no ids of its own, so
    /// `Rotations::superseded` found nothing newer, and it gave us our quorum back).
    ///
    /// A run we heard of as a Secondary ended before our tenure began, for all the peer
    /// that told us knew, and it keeps telling each connection until that run is settled:
    /// heard again while our quorum is briefly gone it is no news (failover soak seed
    /// 414000809: a Primary quorate through a tiebreaker stepped down when the tiebreaker,
    /// reconnecting, named a run that ended long before, and then pulled its own
    /// acknowledged writes back from an older replica).
    pub(super) fn followed_elsewhere(
        &mut self,
        i: usize,
        run: (NodeId, u64),
        out: &mut Vec<RAction>,
    ) {
        if run.0 == self.spec.me {
            return;
        }
        if self.role != Role::Primary {
            self.know_run(run.0, run.1);
            return;
        }
        if self.spec.quorum.is_off() {
            return;
        }
        if self.runs_known.contains(&run) || (0..self.vols.len()).all(|v| self.has_quorum(v)) {
            return;
        }
        let peer = self.peers[i].id;
        self.start_yielding(
            StepDown::Outrun {
                peer,
                primary: run.0,
            },
            out,
        );
    }

    /// Starts stepping down (see the module's notes).
    pub(super) fn start_yielding(&mut self, why: StepDown, out: &mut Vec<RAction>) {
        if self.yielding.is_some() {
            return;
        }
        self.yielding = Some(why);
        out.push(RAction::Event(match why {
            StepDown::Yield(primary) => Event::YieldingTo { primary },
            StepDown::Outrun { peer, primary } => Event::Outrun { peer, primary },
            StepDown::Superseded { peer, volume } => {
                let v = volume as usize;
                let theirs = self.peers.get(peer).map_or(0, |p| p.vols[v].gen.current);
                Event::Superseded {
                    peer,
                    volume,
                    ours: self.vols[v].gen.current,
                    theirs,
                }
            }
        }));
    }
}
