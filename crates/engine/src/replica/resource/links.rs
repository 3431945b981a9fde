//! Connections to peers coming and going: what a new connection is told, and what waited
//! on one that ended (its unacknowledged writes, barriers, reads, the resync it served).

use super::Resource;
use crate::replica::action::RAction;
use crate::replica::bitmap::Bitmap;
use crate::replica::event::{Event, LinkLoss};
use crate::replica::msg::Msg;
use crate::replica::nodeset::NodeSet;
use crate::replica::spec::NodeId;
use tandem_wire::packet::Role;

impl Resource {
    /// An authenticated connection to `peer` is up.
    pub fn peer_up(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        self.peer_up_event(peer, out);
        self.after_event(out);
    }

    fn peer_up_event(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        let Some(i) = self.rep.peers.index(peer) else {
            return;
        };
        self.rep.peers[i].connected(self.rep.now_ms);
        for (v, vol) in self.rep.vols.iter_mut().enumerate() {
            if vol.resync.as_mut().is_some_and(|rs| rs.list_cut(peer)) {
                let volume = v as u16;
                out.push(RAction::Event(Event::ListCutOff { volume, peer }));
            }
        }
        out.push(RAction::Send {
            peer,
            msg: Msg::Role {
                role: self.rep.role,
                incarnation: self.rep.incarnation(),
            },
        });
        self.rep.tell_lost(i, out);
        for v in 0..self.rep.vols.len() {
            // Before our ids, which the peer ranks against its own, and any list of ours
            // (see `Replicas::on_abandoned`).
            if let Some(s) = self.rep.vols[v].abandoned() {
                let msg = Msg::Abandoned {
                    volume: v as u16,
                    gi: s.gi,
                    without_quorum: s.without_quorum,
                };
                out.push(RAction::Send { peer, msg });
            }
            out.push(RAction::Send {
                peer,
                msg: self.rep.volume_msg(i, v),
            });
        }
        // Before our `Primaries` report (end of this event), which promotion waits for.
        self.rep.tell_outdated_on_connect(i, out);
    }

    /// The connection to `peer` is gone (closed, failed, timed out or dropped by us).
    pub fn peer_down(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        self.peer_down_event(peer, LinkLoss::Closed, out);
        self.after_event(out);
    }

    pub(super) fn peer_down_event(
        &mut self,
        peer: NodeId,
        reason: LinkLoss,
        out: &mut Vec<RAction>,
    ) {
        let Some(i) = self.rep.peers.index(peer).filter(|&i| self.rep.peers[i].up) else {
            return;
        };
        if self.rep.peers[i].role == Role::Primary {
            // Its writes to us end here: what they made fresh in a resync is orphaned.
            self.rep.fresh_writer_gone(Some(i));
        }
        self.rep.primary_lost(i, out);
        self.rep.run_holder_gone(peer);
        self.rep.peers[i].primary_at_loss = self.rep.role == Role::Primary;
        self.rep.split_brain_unsettled(i, out);
        let in_sync = self.rep.in_sync_at_disconnect(i);
        let behind = self.rep.peers[i].behind();
        let orphans = self.rep.peers[i].disconnected();
        self.rep.release_held_claims(peer, false, out);
        let now = self.rep.now_ms;
        for &seq in orphans.unacked.keys() {
            self.app.settling.answered(seq, peer, false, now);
        }
        // Everything not confirmed written there may be missing there: even a write it
        // received (protocol B's acknowledgement) is lost if the link dropped because the
        // node died before writing it (simulator seed 5001807: the only other replica
        // then pulled the range back from the one that had lost it, and an acknowledged
        // write was gone). Like DRBD, only a write acknowledgement counts.
        for u in orphans.unacked.into_values() {
            match self.app.writes.get_mut(u.req) {
                // In flight: it may have written it, unanswered, and nothing else may hold
                // it (the write then fails, and marks nothing): settled at its return
                // (`Replicas::unanswered_lost`), since neither its activity log (see
                // `writer.rs`) nor its record of a lost Primary (met again) may name it.
                Some(w) => {
                    w.missing.insert(peer);
                    let (v, offset, len) = (u.volume as usize, u.offset, u64::from(u.len));
                    let size = self.rep.vols[v].size;
                    let mut missed = NodeSet::EMPTY;
                    for p in self.rep.peers.iter() {
                        if p.id != peer && p.vols[v].diskful && !w.sent_to.contains(p.id) {
                            missed.insert(p.id);
                        }
                    }
                    let pv = &mut self.rep.peers[i].vols[v];
                    pv.unanswered
                        .get_or_insert_with(|| Bitmap::new(size))
                        .set_range(offset, len);
                    pv.unanswered_missed = pv.unanswered_missed.union(missed);
                }
                // Completed (protocol A/B): it is on some replica, and maybe not on this one.
                // If no other replica can hold it (we keep none, and every other one lacks
                // the range), this one holds it unless it died before writing it: a mark
                // now would leave the range without a source and this replica behind
                // forever (overlapping-fault seed 621: a diskless Primary's last replica,
                // cut off before its write acknowledgement came, was told on its return
                // that it lacked a write only it held). Settled at its return.
                None => {
                    let (v, offset, len) = (u.volume as usize, u.offset, u64::from(u.len));
                    if self.rep.elsewhere(i, v, offset, len) {
                        self.rep.peers[i].vols[v].oos.set_range(offset, len);
                    } else {
                        let size = self.rep.vols[v].size;
                        let pv = &mut self.rep.peers[i].vols[v];
                        pv.unconfirmed
                            .get_or_insert_with(|| Bitmap::new(size))
                            .set_range(offset, len);
                    }
                }
            }
        }
        self.rep.bitmap_gi_at_disconnect(i, &in_sync, out);
        out.push(RAction::Event(Event::PeerLost { peer, reason }));
        if self.rep.role == Role::Primary {
            let released = (self.app.rotations).peer_lost(&mut self.rep, peer, behind, out);
            self.app.release_rotated(&mut self.rep, released, out);
        }
        for (_, req) in orphans.app_waiting {
            self.app.writes.answered(req, peer, false, |_, _, _| false);
            self.app.check_write(&mut self.rep, req, out);
        }
        for (id, _) in orphans.barriers_out {
            self.app.barriers.peer_answered(id, peer, false);
            self.app.check_flush(&mut self.rep, id, out);
        }
        for (_, req) in orphans.reads_out {
            if self.app.reads.get(req).is_some() {
                self.app.route_read(&mut self.rep, req, out);
            }
        }
        self.app.block_statuses_lost(orphans.allocs_out, out);
        for (v, vol) in self.rep.vols.iter_mut().enumerate() {
            if vol.resync.as_mut().is_some_and(|rs| rs.source_lost(peer)) {
                let volume = v as u16;
                out.push(RAction::Event(Event::ResyncInterrupted { volume, peer }));
            }
        }
        for v in 0..self.rep.vols.len() {
            self.rep.send_deferred_lists(v, out);
        }
    }

    /// We end the connection to `peer`: the driver closes it.
    pub(super) fn drop_peer(&mut self, peer: NodeId, reason: LinkLoss, out: &mut Vec<RAction>) {
        out.push(RAction::Disconnect {
            peer,
            reason: reason.clone(),
        });
        self.peer_down_event(peer, reason, out);
    }
}
