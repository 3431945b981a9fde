//! A quorum tiebreaker vouches for one side only. With an even number of voters, a
//! partition one vote short keeps its quorum if it reaches most of the nodes keeping no
//! replica (`quorum.rs`). A Primary that keeps quorum that way acknowledges writes the
//! voters it lost lack; had the tiebreaker later counted for one of those (once the Primary
//! died, say), that voter, up to date in its own eyes, could have been promoted without
//! them. DRBD propagates such an outdating through the other nodes in its cluster-wide
//! state changes; tandem does it within the generation-id rotation:
//!
//! - Every rotation of a volume's id (the Primary changes it at once when it loses a
//!   holder, and before completing a write a holder missed) with voters not connected to
//!   the Primary also waits for the connected nodes keeping no replica of the volume: each
//!   learns which voters are away (`VotersBehind`), records them (`LocalVol::voters_behind`),
//!   and answers (`GenAck`). So no write those voters miss is acknowledged before the
//!   tiebreakers know; one unreachable makes the rotation wait until its link is judged
//!   dead, and then the Primary has no quorum left.
//! - A tiebreaker tells each recorded voter it reaches, at once, on every new connection
//!   (before its `Primaries` report, which promotion waits for) and whenever that voter
//!   reports following no Primary, that its replica is Outdated (`Outdated`). A voter told so while no Primary is connected to it
//!   turns Outdated (a connected Primary's lists say what it lacks instead), and can be
//!   promoted only after it met that Primary or a replica holding its writes.
//! - The tiebreaker forgets a voter once it reports itself up to date with the id of that
//!   rotation or a newer one (made while it was away: it holds it only once synced).

use super::action::RAction;
use super::event::{DiskChange, ProtocolError};
use super::generation::{lineage, Lineage};
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use tandem_wire::packet::{DiskState, Role};

/// Voters of a volume a tiebreaker counts behind, each with the id the Primary rotated to
/// while it was away.
#[derive(Clone, Debug, Default)]
pub(super) struct VotersBehind(Vec<(NodeId, u64)>);

impl VotersBehind {
    fn mark(&mut self, node: NodeId, gi: u64) {
        match self.0.iter_mut().find(|(n, _)| *n == node) {
            Some(e) => e.1 = gi,
            None => self.0.push((node, gi)),
        }
    }

    pub(super) fn contains(&self, node: NodeId) -> bool {
        self.0.iter().any(|(n, _)| *n == node)
    }

    fn gi(&self, node: NodeId) -> Option<u64> {
        self.0.iter().find(|(n, _)| *n == node).map(|e| e.1)
    }

    fn forget(&mut self, node: NodeId) {
        self.0.retain(|(n, _)| *n != node);
    }
}

impl Replicas {
    /// The voters of volume `v` (nodes keeping a replica of it) we do not reach.
    pub(super) fn voters_away(&self, v: usize) -> NodeSet {
        let mut away = NodeSet::EMPTY;
        for (id, keeps) in &self.spec.nodes {
            let reached = *id == self.spec.me || self.peers.get(*id).is_some_and(|p| p.up);
            if keeps[v] && !reached {
                away.insert(*id);
            }
        }
        away
    }

    /// As Primary rotating `v`'s id to `gi`: the connected tiebreakers of `v` told which
    /// voters are away, and so awaited (none when every voter is connected).
    pub(super) fn tell_tiebreakers(&self, v: usize, gi: u64, out: &mut Vec<RAction>) -> NodeSet {
        let away = self.voters_away(v);
        let mut told = NodeSet::EMPTY;
        if away.is_empty() {
            return told;
        }
        for p in self.peers.up().filter(|p| !p.vols[v].diskful) {
            let msg = Msg::VotersBehind {
                volume: v as u16,
                gi,
                nodes: away,
            };
            out.push(RAction::Send { peer: p.id, msg });
            told.insert(p.id);
        }
        told
    }

    /// Peer `i`, our Primary, rotated `v`'s id to `gi` while the voters `nodes` were away
    /// from it: they are behind; those we reach are told; the Primary gets its answer.
    pub(super) fn on_voters_behind(
        &mut self,
        i: usize,
        v: usize,
        gi: u64,
        nodes: NodeSet,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        if self.peers[i].role != Role::Primary {
            return Err(ProtocolError::VotersBehindFromSecondary);
        }
        let nodes = nodes.minus(NodeSet::one(self.spec.me));
        for n in nodes.iter() {
            self.vols[v].voters_behind.mark(n, gi);
            // It may have caught up already (its report overtook this notice).
            if let Some(j) = self.peers.index(n).filter(|&j| self.peers[j].up) {
                self.forget_caught_up(j, v);
            }
        }
        let behind = &self.vols[v].voters_behind;
        for p in (self.peers.up()).filter(|p| nodes.contains(p.id) && behind.contains(p.id)) {
            let msg = Msg::Outdated { volume: v as u16 };
            out.push(RAction::Send { peer: p.id, msg });
        }
        let peer = self.peers[i].id;
        let msg = Msg::GenAck {
            volume: v as u16,
            gi,
            adopted: false,
        };
        out.push(RAction::Send { peer, msg });
        Ok(())
    }

    /// A new connection to peer `i`, or its report that it follows no Primary any more
    /// (a notice that came while it did was set aside, `on_outdated`): if we count it
    /// behind, it is told.
    pub(super) fn tell_outdated_on_connect(&self, i: usize, out: &mut Vec<RAction>) {
        let peer = self.peers[i].id;
        for (v, vol) in self.vols.iter().enumerate() {
            if vol.voters_behind.contains(peer) {
                let msg = Msg::Outdated { volume: v as u16 };
                out.push(RAction::Send { peer, msg });
            }
        }
    }

    /// A tiebreaker says our replica of `v` missed writes of the Primary it vouched for.
    pub(super) fn on_outdated(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let vol = &self.vols[v];
        let under_primary = self.role == Role::Primary || self.peers.primary().is_some();
        if vol.diskful && vol.disk == DiskState::UpToDate && !under_primary {
            let why = DiskChange::MissedWritesOfAPrimary {
                told_by: self.peers[i].id,
            };
            self.set_disk(v, DiskState::Outdated, why, out);
        }
    }

    /// Peer `i` told the state of its replica of `v`: up to date with the id it was away
    /// for, or a newer one, it holds those writes and is behind no more.
    pub(super) fn forget_caught_up(&mut self, i: usize, v: usize) {
        let (node, pv) = (self.peers[i].id, &self.peers[i].vols[v]);
        let Some(gi) = self.vols[v].voters_behind.gi(node) else {
            return;
        };
        let marked = super::generation::GenIds {
            current: gi,
            history: Default::default(),
        };
        let holds = matches!(lineage(&pv.gen, &marked), Lineage::Same | Lineage::Newer);
        if pv.disk == Some(DiskState::UpToDate) && holds {
            self.vols[v].voters_behind.forget(node);
        }
    }
}
