//! One replicated resource as its local node sees it: the dispatcher over the rooms.
//!
//! Each event (an application request, a disk completion, a packet, a peer going up or
//! down, the clock, an administrator verb) is routed to the rooms that own its state —
//! `writes` (the Primary's write ordering), `reads`, `barriers` (durability), `apply`
//! (a receiving replica's disk queue), `peer` (each peer's connection, what it lacks and
//! our list of it), `resync` (a sync target's progress), `local` (our replica) — and what
//! one room's outcome means for another is decided here, in one place: this file for
//! requests, disk completions, roles and time; `resource/packets.rs` for packets (the
//! routing table) and a peer's `Volume`; `resource/links.rs` for connections coming and
//! going; `resource/invariants.rs` for what must hold between events.
//!
//! The write path: the Primary writes locally (if it has a replica) and sends the write to
//! every connected diskful peer; the application's write completes when the local write is
//! done and every targeted peer satisfies the protocol (A: sent, B: received, C: written).
//! FLUSH and FUA become a barrier on every replica. Out-of-sync tracking: every write a
//! peer may lack sets bits in that peer's bitmap; on reconnect, the up-to-date side lists
//! those ranges to the peer, which pulls them in block order.

use super::action::{AutoPromote, DemoteError, InvalidateError, PromoteError, RAction};
use super::event::{DiskChange, Event, LocalFailure, RoleChange};
use super::msg::{Msg, Token};
use super::peer::ListState;
use super::primaries::StepDown;
use super::replicas::Replicas;
use super::requests::Requests;
use super::resync::Resync;
use super::role::AutoRole;
use super::spec::{NodeId, ReplicaAtStart, ResourceSpec};
use super::split_brain::DiscardMyDataError;
use super::status::{PeerStatus, PeerVolumeStatus, Status, VolumeQuorum, VolumeStatus};
use crate::io::{DiskKind, Io, IoError, ReqId};
use tandem_wire::packet::{DiskState, Role};

mod invariants;
mod links;
mod membership;
pub use membership::AddPeerError;
mod packets;
mod timers;

const EIO: u32 = tandem_wire::Errno::Io.code();

/// The replicated engine of one resource on one node.
#[derive(Debug)]
pub struct Resource {
    pub(super) rep: Replicas,
    pub(super) app: Requests,
    auto: AutoRole,
}

impl Resource {
    /// `found` says per volume what the driver found of the local replica at start; the
    /// engine derives the initial disk state from it (see [`ReplicaAtStart`]).
    pub fn new(spec: ResourceSpec, found: Vec<ReplicaAtStart>) -> Resource {
        Resource {
            app: Requests::new(spec.sizes.len()),
            rep: Replicas::new(spec, found),
            auto: AutoRole::default(),
        }
    }

    pub fn role(&self) -> Role {
        self.rep.role
    }

    pub fn me(&self) -> NodeId {
        self.rep.spec.me
    }

    pub fn disk(&self, volume: u16) -> DiskState {
        self.rep.vols[volume as usize].disk
    }

    /// Application requests in flight.
    pub fn app_in_flight(&self) -> usize {
        self.app.in_flight()
    }

    pub fn status(&self) -> Status {
        let volumes = self
            .rep
            .vols
            .iter()
            .enumerate()
            .map(|(v, vol)| VolumeStatus {
                disk: vol.disk,
                size: vol.size,
                writes_in_flight: self.app.writes.in_flight(v),
                resync_remaining: vol.resync.as_ref().map(Resync::remaining),
                resync_pulled: vol.resync.as_ref().map(|r| r.pulled),
                resync_source: vol.resync.as_ref().and_then(|r| r.source),
                up_to_date_within_reach: self.rep.up_to_date_within_reach(v),
                quorum: (!self.rep.spec.quorum.is_off()).then(|| VolumeQuorum {
                    quorate: self.rep.has_quorum(v),
                    count: self.rep.quorum_count(v),
                }),
            });
        let peers = self.rep.peers.iter().map(|p| PeerStatus {
            id: p.id,
            connected: p.up,
            role: p.role,
            unacked: p.unacked.len(),
            volumes: p
                .vols
                .iter()
                .map(|pv| PeerVolumeStatus {
                    disk: pv.disk,
                    repl: pv.repl,
                    out_of_sync_bytes: pv.oos.count() * pv.oos.block_size(),
                })
                .collect(),
        });
        Status {
            role: self.rep.role,
            volumes: volumes.collect(),
            peers: peers.collect(),
            app_in_flight: self.app_in_flight(),
        }
    }

    /// Makes this node Primary. Refused while another node is Primary, or when a volume has
    /// no up-to-date replica within reach. `force` declares this node's own replicas up to
    /// date first (the administrator's choice of a sync source, as with DRBD's
    /// `primary --force`).
    pub fn promote(&mut self, force: bool, out: &mut Vec<RAction>) -> Result<(), PromoteError> {
        self.auto.clear();
        self.promote_for(RoleChange::Administrator, force, out)
    }

    fn promote_for(
        &mut self,
        why: RoleChange,
        force: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), PromoteError> {
        if self.rep.role == Role::Primary {
            return Ok(());
        }
        if let Some(p) = self.rep.peers.primary() {
            return Err(PromoteError::PeerPrimary(p));
        }
        if let Some(peer) = self.rep.peer_unheard() {
            return Err(PromoteError::PeerUnheard(peer));
        }
        if let Some((volume, peer)) = self.rep.awaiting_list() {
            return Err(PromoteError::PeerListing { volume, peer });
        }
        if let Some((primary, via)) = self.rep.primary_beyond() {
            return Err(PromoteError::PrimaryBeyond { primary, via });
        }
        // Not even forced: the other side of a partition may have quorum and a Primary.
        if let Some(v) = (0..self.rep.vols.len()).find(|&v| !self.rep.has_quorum(v)) {
            return Err(PromoteError::NoQuorum(v as u16));
        }
        if force {
            for v in 0..self.rep.vols.len() {
                let vol = &mut self.rep.vols[v];
                if vol.diskful && matches!(vol.disk, DiskState::Outdated | DiskState::Inconsistent)
                {
                    vol.resync = None;
                    let why = DiskChange::ForcedByAdministrator;
                    self.rep.set_disk(v, DiskState::UpToDate, why, out);
                    self.rep.offer_to_outdated(v, out);
                }
            }
        }
        if let Some(v) = (0..self.rep.vols.len()).find(|&v| !self.rep.up_to_date_within_reach(v)) {
            return Err(PromoteError::NoUpToDate(v as u16));
        }
        self.set_role(Role::Primary, why, out);
        Ok(())
    }

    /// Throws our replica of `volume` away (DRBD's `invalidate`): Inconsistent, pulled in
    /// full from a connected up-to-date peer (reads go to peers meanwhile, writes still
    /// land here). Refused without such a peer.
    pub fn invalidate(
        &mut self,
        volume: u16,
        out: &mut Vec<RAction>,
    ) -> Result<(), InvalidateError> {
        let v = volume as usize;
        if !self.rep.vols.get(v).is_some_and(|vol| vol.diskful) {
            return Err(InvalidateError::NoReplica(volume));
        }
        let source = self
            .rep
            .peers
            .up()
            .any(|p| p.vols[v].diskful && p.vols[v].disk == Some(DiskState::UpToDate));
        if !source {
            return Err(InvalidateError::NoSource(volume));
        }
        self.rep.invalidate(v, out);
        self.rep.pump_resync(&mut self.app.barriers, volume, out);
        self.after_event(out);
        Ok(())
    }

    /// The after-split-brain policies from now on (a configuration change).
    pub fn set_after_split_brain(&mut self, p: super::split_brain::AfterSplitBrain) {
        self.rep.spec.after_sb = p;
    }

    /// `tandem connect --discard-my-data`: the next split brain found with `peer` (on the
    /// next connection to it) makes this node the victim whatever the policies. Refused
    /// on a Primary: a Primary never discards its data.
    pub fn discard_my_data(&mut self, peer: NodeId) -> Result<(), DiscardMyDataError> {
        if self.rep.role == Role::Primary {
            return Err(DiscardMyDataError::Primary);
        }
        let i = (self.rep.peers.index(peer)).ok_or(DiscardMyDataError::UnknownPeer(peer))?;
        self.rep.peers[i].discard_my_data = true;
        Ok(())
    }

    /// Makes this node Secondary; refused while application requests are in flight.
    pub fn demote(&mut self, out: &mut Vec<RAction>) -> Result<(), DemoteError> {
        self.auto.clear();
        self.demote_for(RoleChange::Administrator, out)
    }

    fn demote_for(&mut self, why: RoleChange, out: &mut Vec<RAction>) -> Result<(), DemoteError> {
        if self.rep.role == Role::Secondary {
            return Ok(());
        }
        if self.app_in_flight() > 0 {
            return Err(DemoteError::RequestsInFlight(self.app_in_flight()));
        }
        // Stepping down now, we would forget the answers on their way: promoted again
        // before they came, we took a peer's ids from before its adoption, rotated apart
        // from them, and took its report of the adopted ones for another Primary's
        // (real-daemon test `cut_link_and_heal`: a diskless Primary auto-promoted for a
        // client's probe, demoted as it left, and promoted again 100 ms later stepped down
        // and failed the client's writes with EIO).
        if let Some((volume, peer)) = self.app.rotations.unanswered() {
            return Err(DemoteError::IdsChanging { volume, peer });
        }
        self.set_role(Role::Secondary, why, out);
        Ok(())
    }

    fn set_role(&mut self, to: Role, why: RoleChange, out: &mut Vec<RAction>) {
        let from = std::mem::replace(&mut self.rep.role, to);
        if to == Role::Primary {
            let me = self.rep.spec.me;
            for v in 0..self.rep.vols.len() {
                self.rep.vols[v].crashed_under = None;
                self.rep.take_newest_gen(v, out);
                // Back from a crash and not yet synced: pulled under ourselves now, from
                // an up-to-date replica; or, forced UpToDate, our data is the reference
                // there and every peer may lack it.
                if self.rep.vols[v].disk == DiskState::UpToDate {
                    if let Some(suspect) = self.rep.vols[v].suspect.take() {
                        for p in self.rep.peers.iter_mut().filter(|p| p.vols[v].diskful) {
                            p.vols[v].oos.union_with(&suspect);
                        }
                    }
                } else {
                    self.rep.pull_suspect(v, Some(me), out);
                    self.rep.vols[v].suspect = None;
                    self.rep.pump_resync(&mut self.app.barriers, v as u16, out);
                }
                // Its replicas are the reference now.
                self.rep.vols[v].unproven = false;
                self.rep.vols[v].standing = None;
            }
        }
        if to == Role::Primary {
            self.app.rotations.promoted(&self.rep);
            self.rep.vols.iter_mut().for_each(|vol| vol.tenure_begins());
            // Peers that had our list as a Secondary hear it again if our tenure began
            // after their ids (a diskless Primary's list settles them).
            for v in 0..self.rep.vols.len() {
                for i in 0..self.rep.peers.len() {
                    let listed = self.rep.peers[i].up
                        && matches!(
                            self.rep.peers[i].vols[v].list,
                            ListState::Sent | ListState::Stale
                        );
                    if self.rep.lacks_all_before_tenure(i, v) && listed {
                        self.rep.send_list(i, v, out);
                    }
                }
            }
        } else {
            self.app.rotations.demoted(&mut self.rep);
            // Our tenure's writes end here: what they made fresh in a resync is orphaned.
            self.rep.fresh_writer_gone(None);
            self.rep.left_without_quorum(out);
            self.rep.vols.iter_mut().for_each(|vol| vol.tenure = None);
        }
        out.push(RAction::Event(Event::RoleChanged { from, to, why }));
        let incarnation = self.rep.incarnation();
        self.rep.peers.broadcast(
            Msg::Role {
                role: to,
                incarnation,
            },
            out,
        );
        if to == Role::Primary {
            self.app.rotations.rotate_if_away(&mut self.rep, out);
        }
    }

    /// A clean stop, the application's requests answered: as a Secondary, tells every
    /// connected peer that we leave and our replicas are Outdated from now on (DRBD's
    /// graceful departure: they may drop us from their quorum count, `quorum.rs`). The
    /// driver closes the connections after these sends. Returns whether it was told: a
    /// Primary does not leave this way (its replica may be the only one holding writes).
    pub fn leave(&mut self, out: &mut Vec<RAction>) -> bool {
        if self.rep.role != Role::Secondary {
            return false;
        }
        self.rep.peers.broadcast(Msg::Leaving, out);
        true
    }

    /// An application (NBD) client attached: the first one makes this node Primary when no
    /// other node is (DRBD's auto-promote).
    pub fn client_attached(&mut self, out: &mut Vec<RAction>) -> AutoPromote {
        self.auto.attach();
        if self.rep.role == Role::Primary || self.rep.peers.primary().is_some() {
            return AutoPromote::Unchanged;
        }
        let result = self.promote_for(RoleChange::ClientAttached, false, out);
        self.debug_check();
        match result {
            Ok(()) => {
                self.auto.promoted();
                AutoPromote::Promoted
            }
            Err(e) => {
                if e.is_momentary() {
                    self.auto.retry_later();
                }
                AutoPromote::Refused(e)
            }
        }
    }

    /// Application clients attached.
    pub fn clients(&self) -> usize {
        self.auto.clients()
    }

    /// An application client left (or was fenced off): the last one takes back a Primary
    /// role its clients gave, once every request it took is answered.
    pub fn client_detached(&mut self, out: &mut Vec<RAction>) {
        self.auto.detach();
        self.after_event(out);
    }

    /// What every event ends with: the auto-demotion a last request may allow, and the
    /// invariants (debug builds).
    fn after_event(&mut self, out: &mut Vec<RAction>) {
        let regained = self.rep.update_quorum(out);
        if self.rep.role == Role::Primary && !self.rep.spec.quorum.is_off() {
            // Before held requests go on: they complete under the ids taken up again.
            self.app.rotations.hold_back(&mut self.rep, out);
        }
        if regained {
            self.app.resume_suspended(&mut self.rep, out);
        }
        self.step_down_if_yielding(out);
        // The flag first: this runs at the end of every event, I/O included.
        if self.auto.retry_pending()
            && self.rep.peer_unheard().is_none()
            && self.rep.awaiting_list().is_none()
            && self.auto.take_retry()
        {
            let retried = self.rep.role == Role::Secondary && self.rep.peers.primary().is_none();
            if retried
                && self
                    .promote_for(RoleChange::ClientAttached, false, out)
                    .is_ok()
            {
                self.auto.promoted();
            }
        }
        while !self.rep.refused.is_empty() {
            for (volume, r) in std::mem::take(&mut self.rep.refused) {
                let failed = Err(IoError::Os(EIO as i32));
                self.disk_done_event(volume, r.token, r.kind, failed, out);
            }
        }
        for v in std::mem::take(&mut self.rep.turned_current) {
            self.app.writes.local_current(v);
        }
        if self.auto.should_demote() && self.demote_for(RoleChange::LastClientLeft, out).is_ok() {
            self.auto.clear();
        }
        for l in self.app.settling.take_settled_local() {
            let (req, volume) = (l.req, l.volume);
            out.push(RAction::WriteSettled { req, volume });
        }
        for (seq, missing) in self.app.settling.due(self.rep.now_ms) {
            let msg = Msg::PeerAck {
                seq,
                missing: missing.bits(),
            };
            for p in self
                .rep
                .peers
                .up()
                .filter(|p| p.vols.iter().any(|v| v.diskful))
            {
                out.push(RAction::Send { peer: p.id, msg });
            }
        }
        self.rep.answer_asked_lost(out);
        self.rep.check_writer(out);
        self.rep.tell_primaries(out);
        self.debug_check();
    }

    /// A Primary without quorum that learnt of another one steps down (`primaries.rs`):
    /// held requests fail at once, new ones and those in flight as they come and end, and
    /// with none left it is Secondary.
    fn step_down_if_yielding(&mut self, out: &mut Vec<RAction>) {
        if let Some(other) = self.rep.yield_due() {
            self.rep.start_yielding(StepDown::Yield(other), out);
        } else if let Some((peer, volume)) = self.app.rotations.superseded(&self.rep) {
            self.rep
                .start_yielding(StepDown::Superseded { peer, volume }, out);
        }
        let Some(why) = self.rep.yielding else {
            return;
        };
        if self.rep.role != Role::Primary {
            self.rep.yielding = None;
            return;
        }
        self.app.fail_suspended(out);
        if self.app_in_flight() == 0 {
            self.auto.clear();
            self.rep.yielding = None;
            let why = match why {
                StepDown::Yield(to) => RoleChange::Yielded { to },
                StepDown::Superseded { peer, .. } => RoleChange::Superseded { peer },
                StepDown::Outrun { peer, primary } => RoleChange::Outrun { peer, primary },
            };
            self.set_role(Role::Secondary, why, out);
        }
    }

    /// Ranges of `volume` written here from a Primary's writes not yet settled: what the
    /// activity log holds for them (see [`RAction::Settled`]).
    pub fn unsettled_writes(&self, volume: u16) -> Vec<(u64, u64)> {
        self.rep.unsettled(volume as usize)
    }

    /// Ranges of `volume` our own application writes wrote here that are not settled yet
    /// (see [`RAction::WriteSettled`]).
    pub fn unsettled_own_writes(&self, volume: u16) -> Vec<(u64, u64)> {
        self.app.settling.unsettled_local(volume as usize).collect()
    }

    /// Writes issued to a local replica (ours, a peer's, a resync's) have not all landed:
    /// a clean stop waits for them (see [`Resource::persisted`]).
    pub fn writes_landing(&self) -> bool {
        self.rep.vols.iter().any(|v| v.apply.busy(0, v.size))
    }

    /// Peer `peer`'s replica of `volume` can vouch for a write of this range, as we see it
    /// (`PeerVol::current_for`): up to date, and not known to lack a block the range
    /// covers only in part. The simulator's availability check asks it.
    pub fn peer_current_for(&self, peer: NodeId, volume: u16, offset: u64, len: u64) -> bool {
        (self.rep.peers.iter())
            .find(|p| p.id == peer)
            .is_some_and(|p| p.vols[volume as usize].current_for(offset, len))
    }

    /// Whether any connected peer is Primary.
    pub fn peer_primary(&self) -> Option<NodeId> {
        self.rep.peers.primary()
    }

    /// Where a block status request for `volume` is answered from, now: refused as a read
    /// would be, else the local replica's allocation map where reads are served locally,
    /// else an up-to-date peer's where reads go to one ([`Resource::block_status`]), else
    /// nowhere (everything is reported as data). Answered locally, the engine never sees
    /// the request: the driver answers it at once, which orders it after every write
    /// completed before it arrived (a write completes only once written to the local
    /// replica, if there is one), and writes still in flight need no order (NBD gives none
    /// between requests in flight together).
    pub fn allocation_map(&self, volume: u16) -> Result<super::AllocationMap, IoError> {
        self.app.allocation_map(&self.rep, volume as usize)
    }

    /// A block status request for `len` bytes of `volume` at `offset` that
    /// [`Resource::allocation_map`] said an up-to-date peer answers: an application
    /// request, completed with the peer's extents (`tandem_wire::packet::AllocExtent`s, in
    /// their wire form, from `offset`) as a read's data, or, wherever no peer could answer,
    /// `Ok` without data: the whole range is data. The peer answers once every write it
    /// received before the request has landed, so the map shows every write completed
    /// before it was submitted.
    pub fn block_status(
        &mut self,
        req: ReqId,
        volume: u16,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        self.app
            .block_status(&mut self.rep, req, volume, offset, len, out);
        self.after_event(out);
    }

    /// The driver mapped a range for a peer's block status ([`DiskKind::Allocation`]):
    /// `Ok(n)`, `n` extents (at most `tandem_wire::packet::MAX_ALLOC_EXTENTS`) in their
    /// wire form in the read buffer of `token`, as [`super::DataRef::Disk`] names it.
    pub fn allocation_done(
        &mut self,
        volume: u16,
        token: Token,
        result: Result<u32, IoError>,
        out: &mut Vec<RAction>,
    ) {
        self.rep.allocation_done(volume, token, result, out);
        self.after_event(out);
    }

    /// A new application request on `volume`, already validated by the frontend.
    pub fn submit(&mut self, req: ReqId, volume: u16, io: Io, out: &mut Vec<RAction>) {
        if io.is_write() {
            if let Some(vol) = self.rep.vols.get_mut(volume as usize) {
                vol.written_ms = Some(self.rep.now_ms);
            }
        }
        self.app.submit_event(&mut self.rep, req, volume, io, out);
        self.after_event(out);
    }

    /// An fdatasync the driver ran on its own (one started ahead of a flush, see
    /// [`crate::sync_plan`]) failed, and no flush the engine asked for waits on it: every
    /// local replica detaches now, not at the next flush (disk-errors soak seed 94021068:
    /// a failed sync ahead was known only to the driver, and writes kept going to a disk
    /// that had lost some).
    pub fn sync_failed(&mut self, out: &mut Vec<RAction>) {
        self.rep.fdatasync_failed(out);
        self.after_event(out);
    }

    /// A disk operation issued with [`RAction::Disk`] finished.
    pub fn disk_done(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        self.disk_done_event(volume, token, kind, result, out);
        self.after_event(out);
    }

    fn disk_done_event(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        match token {
            Token::App(req) => self
                .app
                .app_io_done(&mut self.rep, v, req, kind, result, out),
            Token::Flush(seq) => self.app.flushed(&mut self.rep, seq, result.is_ok(), out),
            Token::PeerWrite { peer, conn, seq } => {
                self.rep.vols[v].apply.landed(kind.offset(), token);
                let msg = match result {
                    Ok(()) => Msg::WriteAck { seq },
                    Err(e) => {
                        let why = LocalFailure::ReplicatedWrite(e);
                        self.rep.local_disk_failed(v, why, out);
                        Msg::NegAck { seq, errno: EIO }
                    }
                };
                if let Some(i) = self
                    .rep
                    .peers
                    .index(peer)
                    .filter(|&i| self.rep.peers[i].conn == conn)
                {
                    self.rep.peers[i].rx_pending.remove(&seq);
                    if self.rep.peers[i].up {
                        out.push(RAction::Send { peer, msg });
                    }
                    self.rep.process_barriers_in(&mut self.app.barriers, i, out);
                }
                self.rep.release_applying(v, out);
            }
            Token::PeerRead { .. } | Token::ResyncRead { .. } => {
                self.rep.peer_read_done(volume, token, kind, result, out)
            }
            // Completed as any other operation (a failure, say): no extents to send.
            Token::PeerAlloc { .. } => {
                self.rep
                    .allocation_done(volume, token, result.map(|()| 0), out)
            }
            Token::ResyncWrite { .. } => {
                self.rep.vols[v].apply.landed(kind.offset(), token);
                if let Some(rs) = self.rep.vols[v].resync.as_mut() {
                    rs.writes_pending -= 1;
                }
                if result.is_err() {
                    self.rep
                        .local_disk_failed(v, LocalFailure::ResyncWrite, out);
                }
                self.rep.release_applying(v, out);
                self.rep.pump_resync(&mut self.app.barriers, volume, out);
            }
        }
    }
}
