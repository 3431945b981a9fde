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
use super::peer::ListState;
use super::replicas::Replicas;
use super::spec::NodeId;
use tandem_wire::packet::{DiskState, Role};

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

    /// As Primary: peer `i`'s replica of `v` holds all our writes now (`tell_in_sync`
    /// told the others), and it may have missed our word of another replica we synced while
    /// it was away from us: it hears it now, of each connected one that holds all our writes
    /// (UpToDate after our complete list, no block marked, none unsure). Our link to `i`
    /// carries our writes and peer acks in order, so a claim of `i` made after this word is
    /// from a later write and stays. Before, of two Secondaries that each missed writes in
    /// turn, the one we synced while the other was away from us was never named to it, its
    /// claims on the first outlived the gap, and the two redialled for ever at their next
    /// meeting (overlapping seed 238001624).
    pub(super) fn tell_in_sync_peers(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        if self.role != Role::Primary {
            return;
        }
        let to = self.peers[i].id;
        for p in self.peers.up().filter(|p| p.id != to) {
            let pv = &p.vols[v];
            let holds_all = pv.diskful
                && pv.disk == Some(DiskState::UpToDate)
                && pv.list == ListState::Sent
                && pv.oos.count() == 0
                && pv.unsure.is_none();
            if holds_all {
                out.push(RAction::Send {
                    peer: to,
                    msg: Msg::InSync {
                        volume: v as u16,
                        node: p.id,
                    },
                });
            }
        }
    }

    /// From Primary peer `i`: node `node`'s replica of `volume` holds all its writes now.
    /// What we claimed that node lacks goes, where we claim nothing on the Primary (there,
    /// we may hold a write the Primary lacks too: ours is kept). Not if we wrote some of the
    /// blocks as Primary apart from it (a split brain is told by those).
    /// While that node is connected to us, only if it said on this connection that it is
    /// UpToDate and not unproven: the word is about the replica it keeps now (one that
    /// restarted since the word says Outdated or unproven first, and what we claim on it
    /// stays for this meeting's lists), and our claims on a replica that says it is current
    /// are of the Primary's writes (older than the word, or after it on the Primary's link)
    /// or where we claim something on the Primary too. Overlapping seed 232068286: back
    /// from a clean stop, a Secondary listed claims kept from before it on a replica the
    /// Primary had synced meanwhile, the word coming just after the two met; each then
    /// claimed the other lacked the Primary's writes, and they redialled for ever.
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
        let pj = &self.peers[j].vols[v];
        if self.peers[j].up && (pj.disk != Some(DiskState::UpToDate) || pj.unproven) {
            return Ok(());
        }
        let on_primary = self.peers[i].vols[v].oos.clone();
        let run = self.peers[i].run();
        let pv = &mut self.peers[j].vols[v];
        if !pv.diskful || pv.wrote_apart {
            return Ok(());
        }
        // Claims held out of our list under this Primary's run (`drop_kept_claims`: our
        // activity log's extents at a crash that run settled) are settled by its word
        // too. Kept, they came back as claims when that Primary went, against a replica
        // that held all its writes, and the two redialled for ever (cluster-crash soak
        // seed 475010969).
        if let Some((_, held)) = (pv.held.as_mut()).filter(|(r, _)| *r == run) {
            held.intersect_with(&on_primary);
            if held.count() == 0 {
                pv.held = None;
            }
        }
        pv.oos.intersect_with(&on_primary);
        Ok(())
    }
}
