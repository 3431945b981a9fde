//! The Primary's word that a replica it synced holds all its writes now (DRBD's
//! peers-in-sync), and what the other replicas do with it.
//!
//! A Secondary's claims on another (blocks it holds that the other lacks) come from the
//! Primary's peer acks, made while the other was away. When the other comes back and pulls
//! them from the Primary (or another source), nothing tells the first one, which may be
//! away from it meanwhile: its claims outlive the gap. Two replicas that each missed writes
//! in turn, each synced by the Primary, then list each other stale claims and redial
//! forever (overlapping seed 5730: `LackPrimaryWrites`). The Primary knows when the gap
//! closed, and its link to each Secondary carries its writes and peer acks in order: a claim
//! made after this word is from a later write and stays.

use super::action::RAction;
use super::event::ProtocolError;
use super::msg::Msg;
use super::replicas::Replicas;
use super::spec::NodeId;
use tandem_wire::packet::Role;

impl Replicas {
    /// As Primary: peer `i`'s replica of `v` holds all our writes now (it became UpToDate
    /// after our complete list): the other connected peers hear it.
    pub(super) fn tell_in_sync(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        if self.role != Role::Primary {
            return;
        }
        let node = self.peers[i].id;
        for p in self
            .peers
            .up()
            .filter(|p| p.id != node && p.vols[v].diskful)
        {
            out.push(RAction::Send {
                peer: p.id,
                msg: Msg::InSync {
                    volume: v as u16,
                    node,
                },
            });
        }
    }

    /// From Primary peer `i`: node `node`'s replica of `volume` holds all its writes now.
    /// What we claimed that node lacks goes, where we claim nothing on the Primary (there,
    /// we may hold a write the Primary lacks too: ours is kept). Only while that node is
    /// away from us: connected, it hears our list and tells us when it is synced. Not if we
    /// wrote some of the blocks as Primary apart from it (a split brain is told by those).
    pub(super) fn on_in_sync(
        &mut self,
        i: usize,
        volume: u16,
        node: NodeId,
    ) -> Result<(), ProtocolError> {
        let v = volume as usize;
        if v >= self.vols.len() {
            return Err(ProtocolError::UnknownVolume(volume));
        }
        if self.peers[i].role != Role::Primary {
            return Err(ProtocolError::InSyncFromSecondary);
        }
        let j = self
            .peers
            .index(node)
            .filter(|&j| j != i)
            .ok_or(ProtocolError::UnknownNode(node))?;
        if self.peers[j].up {
            return Ok(());
        }
        let on_primary = self.peers[i].vols[v].oos.clone();
        let pv = &mut self.peers[j].vols[v];
        if !pv.diskful || pv.apart.is_some() || pv.oos.count() == 0 {
            return Ok(());
        }
        pv.oos.intersect_with(&on_primary);
        Ok(())
    }
}
