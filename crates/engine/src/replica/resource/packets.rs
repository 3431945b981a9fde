//! A packet from a peer, routed to the room it is about (`handle`, a routing table), and
//! a peer's `Volume`: the state of its replica.

use super::Resource;
use crate::replica::action::RAction;
use crate::replica::event::{LinkLoss, ProtocolError};
use crate::replica::msg::Msg;
use crate::replica::nodeset::NodeSet;
use crate::replica::primaries::StepDown;
use crate::replica::spec::NodeId;
use tandem_wire::packet::{volume_flags, DiskState, Packet, Role};

impl Resource {
    /// A packet from an authenticated peer. A packet that breaks the protocol drops the
    /// connection (never the node).
    pub fn packet(&mut self, peer: NodeId, packet: &Packet<'_>, out: &mut Vec<RAction>) {
        self.packet_event(peer, packet, out);
        self.after_event(out);
    }

    fn packet_event(&mut self, peer: NodeId, packet: &Packet<'_>, out: &mut Vec<RAction>) {
        let Some(i) = self.rep.peers.index(peer).filter(|&i| self.rep.peers[i].up) else {
            return;
        };
        self.rep.peers[i].last_rx_ms = self.rep.now_ms;
        if let Err(why) = self.handle(i, packet, out) {
            self.drop_peer(peer, LinkLoss::Misbehaved(why), out);
        }
    }

    /// Routes a packet to the room it is about: one arm per packet kind, a routing table
    /// (long only because rustfmt spreads each pattern over lines).
    fn handle(
        &mut self,
        i: usize,
        packet: &Packet<'_>,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let peer = self.rep.peers[i].id;
        match *packet {
            Packet::Role { role, incarnation } => {
                if role == Role::Primary && self.rep.role == Role::Primary {
                    // Never to a run we followed or heard of as a Secondary: it began
                    // before our tenure, and it is the one to step down (failover seed
                    // 347003671: both Primaries without quorum apart from the other, the
                    // later one heard the older first and yielded; the older completed
                    // what it held after the later one's acknowledged writes).
                    let older = self.rep.runs_known.contains(&(peer, incarnation));
                    if self.rep.must_yield_to(peer) && !older {
                        self.rep.start_yielding(StepDown::Yield(peer), out);
                    }
                    return Err(ProtocolError::BothPrimary);
                }
                if role == Role::Primary {
                    if let Some(first) = self.rep.second_primary(i) {
                        return Err(ProtocolError::SecondPrimary { first });
                    }
                }
                self.rep.peers[i].incarnation = incarnation;
                self.rep.peers[i].role_heard = true;
                if role == Role::Primary {
                    self.rep.know_run(peer, incarnation);
                }
                self.rep.met_run_again(i, out);
                if role == Role::Primary {
                    // Before its list and our suspect ranges' pull under it.
                    self.rep.met_writer(i, out);
                }
                let was = std::mem::replace(&mut self.rep.peers[i].role, role);
                if was == Role::Primary && role != Role::Primary {
                    // Its relays stand for one tenure: another may write apart from us next.
                    self.rep.forget_relays(peer);
                    self.rep.release_held_claims(peer, true, out);
                    self.rep.listing_primary_demoted(i);
                    for v in 0..self.rep.vols.len() {
                        self.rep.send_deferred_lists(v, out);
                    }
                }
                if role == Role::Primary && was != Role::Primary {
                    // Promoted while connected: its list came already; our suspect ranges
                    // are pulled under it now.
                    for v in 0..self.rep.vols.len() {
                        if self.rep.peers[i].vols[v].disk.is_some() {
                            self.rep.pull_suspect(v, Some(peer), out);
                            self.rep.pump_resync(&mut self.app.barriers, v as u16, out);
                        }
                    }
                }
            }
            Packet::Volume {
                volume,
                size,
                disk,
                flags,
                gen,
            } => self.on_volume(i, volume, size, disk, flags, gen, out)?,
            Packet::Generation { volume, gen } => {
                let v = self.rep.check_volume(volume)?;
                self.rep.on_generation(i, v, gen, out);
            }
            Packet::Abandoned {
                volume,
                gi,
                without_quorum,
            } => {
                let v = self.rep.check_volume(volume)?;
                self.rep.on_abandoned(i, v, gi, without_quorum, out);
            }
            Packet::GenAck {
                volume,
                gi,
                adopted,
            } => {
                let v = self.rep.check_volume(volume)?;
                if self.rep.role == Role::Primary {
                    self.app
                        .gen_answered(&mut self.rep, v, peer, gi, adopted, out);
                }
            }
            Packet::Write { .. }
            | Packet::Zero { .. }
            | Packet::Barrier { .. }
            | Packet::ReadReq { .. }
            | Packet::ResyncReq { .. }
            | Packet::AllocReq { .. } => {
                self.rep
                    .on_request(&mut self.app.barriers, i, packet, out)?
            }
            Packet::RecvAck { .. }
            | Packet::WriteAck { .. }
            | Packet::NegAck { .. }
            | Packet::BarrierAck { .. }
            | Packet::ReadReply { .. }
            | Packet::AllocReply { .. } => self.app.on_answer(&mut self.rep, i, packet, out)?,
            Packet::ResyncReply {
                volume,
                id,
                offset,
                errno,
                lacking,
                data,
            } => self.rep.resync_reply(
                &mut self.app.barriers,
                i,
                volume,
                id,
                (offset, errno, NodeSet::from_bits(lacking)),
                data.len(),
                out,
            )?,
            Packet::OutOfSync {
                volume,
                offset: 0,
                len: 0,
            } => self
                .rep
                .on_list_end(&mut self.app.barriers, i, volume, out)?,
            Packet::OutOfSync {
                volume,
                offset,
                len,
            } => self
                .rep
                .on_out_of_sync(&mut self.app.barriers, i, volume, offset, len, out)?,
            Packet::PeerAck { seq, missing } => {
                let missing = NodeSet::from_bits(missing);
                self.rep.on_peer_ack(i, seq, missing, out);
            }
            Packet::PrimaryLost {
                primary,
                incarnation,
                seq,
            } => {
                let known = self.rep.peers.index(primary).is_some();
                if !known {
                    return Err(ProtocolError::UnknownNode(primary));
                }
                self.rep
                    .on_primary_lost(i, (primary, incarnation), seq, out);
                self.rep.followed_elsewhere(i, (primary, incarnation), out);
            }
            Packet::InSync { volume, node } => self.rep.on_in_sync(i, volume, node)?,
            Packet::Primaries { nodes } => {
                self.rep.on_primaries(i, NodeSet::from_bits(nodes), out)?
            }
            Packet::Leaving => self.rep.peers[i].departed = true,
            Packet::VotersBehind { volume, gi, nodes } => {
                let v = self.rep.check_volume(volume)?;
                self.rep
                    .on_voters_behind(i, v, gi, NodeSet::from_bits(nodes), out)?;
            }
            Packet::Outdated { volume } => {
                let v = self.rep.check_volume(volume)?;
                self.rep.on_outdated(i, v, out);
            }
            Packet::Ping => out.push(RAction::Send {
                peer,
                msg: Msg::PingAck,
            }),
            Packet::PingAck => {
                let p = &mut self.rep.peers[i];
                p.ping_sent_ms = None;
                p.pongs += 1;
                self.rep.settle_unsure(i, out);
            }
            Packet::SplitBrain {
                volume,
                mine,
                yours: _,
                flags,
            } => {
                if volume as usize >= self.rep.vols.len() {
                    return Err(ProtocolError::UnknownVolume(volume));
                }
                let b = &mut self.app.barriers;
                self.rep
                    .on_split_brain_report(b, i, volume as usize, mine, flags, out);
            }
            Packet::Error { code, message } => {
                return Err(ProtocolError::PeerReported {
                    code,
                    message: message.to_string(),
                });
            }
            Packet::Hello { .. } | Packet::Auth { .. } | Packet::AuthOk => {
                return Err(ProtocolError::HandshakeAfterHandshake);
            }
            // Status for the operator, kept by the driver (it changes nothing here).
            Packet::SyncProgress { .. } => {}
        }
        Ok(())
    }

    /// The peer told us the state of its replica of a volume.
    #[allow(clippy::too_many_arguments)]
    fn on_volume(
        &mut self,
        i: usize,
        volume: u16,
        size: u64,
        disk: DiskState,
        flags: u16,
        gen: tandem_wire::packet::GenIds,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let v = volume as usize;
        let ours = self
            .rep
            .vols
            .get(v)
            .ok_or(ProtocolError::UnknownVolume(volume))?
            .size;
        if size != ours {
            return Err(ProtocolError::SizeMismatch {
                volume,
                theirs: size,
                ours,
            });
        }
        let created = flags & volume_flags::CREATED != 0;
        let pv = &mut self.rep.peers[i].vols[v];
        pv.unproven = flags & volume_flags::UNPROVEN != 0;
        pv.pulls_suspect = pv.unproven && flags & volume_flags::PULLS_SUSPECT != 0;
        pv.peer_wrote_apart = flags & volume_flags::WROTE_APART != 0;
        pv.pulled_elsewhere = flags & volume_flags::PULLED_ELSEWHERE != 0;
        let before = pv.disk;
        let contender = flags & volume_flags::CONTENDER != 0 && pv.diskful;
        let was_primary = flags & volume_flags::WAS_PRIMARY != 0;
        let lost_power = flags & volume_flags::LOST_POWER != 0;
        self.rep
            .peer_gen(i, v, gen, contender, was_primary, lost_power);
        if self.rep.role == Role::Primary && gen.current == self.rep.vols[v].gen.current {
            self.app.rotations.holds(v, self.rep.peers[i].id);
        }
        // Writes in flight that missed it: its list waits for them to mark their bits.
        let first = self.rep.peers[i].vols[v].disk.is_none();
        if first {
            // Writes only it may hold, unconfirmed when its last link dropped: it holds
            // them unless it crashed since (or its replica failed).
            let pv = &mut self.rep.peers[i].vols[v];
            // Back from a clean stop: consistent, so every write it received landed first
            // (`Resource::persisted`), as a node that never restarted.
            let clean = flags & volume_flags::CONTENDER != 0 && !pv.unproven;
            let met = flags & volume_flags::MET_BEFORE != 0 || clean;
            let restarted = !met || disk == DiskState::Diskless;
            let unconfirmed = pv.unconfirmed.take();
            let unanswered = pv.unanswered.take();
            let missed = std::mem::replace(&mut pv.unanswered_missed, NodeSet::EMPTY);
            if let Some(u) = unconfirmed.filter(|_| restarted) {
                // It crashed: it holds them or lost them, and no other replica may hold
                // them; settled as writes in flight at its loss.
                self.rep
                    .unanswered_lost(i, v, &u, disk, NodeSet::EMPTY, out);
            }
            // Restarted or not: it may have written them, and a run of ours it meets
            // again settles its own record of them (`met_run_again`; overlapping soak
            // seed 168082195: a failed write it alone had written stayed there).
            // Its live notices to the peers it knew missed them stand only if it kept its
            // state (back from a crash, its claims on an up-to-date peer are pulled instead,
            // see `claims_become_suspect`, and its own data may have lost what it wrote).
            let missed = if restarted { NodeSet::EMPTY } else { missed };
            if let Some(u) = unanswered {
                self.rep.unanswered_lost(i, v, &u, disk, missed, out);
            }
        }
        let deferred = first && self.app.writes.missing(v, self.rep.peers[i].id);
        let b = &mut self.app.barriers;
        self.rep
            .peer_volume(b, i, v, disk, created, deferred, out)?;
        // A peer that refused may have what we lack now: ask it again soon.
        let id = self.rep.peers[i].id;
        if disk == DiskState::UpToDate {
            // Its resync ended: the writes it took meanwhile are on a current replica.
            let lacks = &self.rep.peers[i].vols[v].oos;
            self.app.writes.peer_current(v, id, lacks);
        }
        if let Some(rs) = self.rep.vols[v]
            .resync
            .as_mut()
            .filter(|_| before != Some(disk))
        {
            rs.peer_changed(id);
        }
        // A new state may end a list, or offer a source to pull from.
        self.rep.pump_resync(&mut self.app.barriers, volume, out);
        self.rep.forget_caught_up(i, v);
        Ok(())
    }
}
