//! Out-of-sync tracking: what a peer's state and lists mean for who syncs whom, the
//! new-cluster rule, split brain found in lists, what a live notice of a missed write does,
//! and becoming a sync target (`mark_behind`). Pulling itself is in `pull.rs`.

use super::action::RAction;
use super::barriers::Barriers;
use super::bitmap::Bitmap;
use super::bitmap::BLOCK;
use super::event::{DiskChange, ProtocolError};
use super::generation::{lineage, Lineage};
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::peer::{send_ranges, ListState, Peer};
use super::replicas::Replicas;
use super::resync::Resync;
use super::spec::NodeId;
use super::status::Repl;
use tandem_wire::packet::{DiskState, Role};

impl Replicas {
    /// The peer told us the state of its replica of volume `v`: decide who syncs whom.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn peer_volume(
        &mut self,
        b: &mut Barriers,
        i: usize,
        v: usize,
        disk: DiskState,
        created: bool,
        deferred: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let was = self.peers[i].vols[v].disk.replace(disk);
        if was.is_none() {
            self.drop_kept_claims(i, v);
        }
        if disk == DiskState::UpToDate {
            self.settle_held_claims(i, v);
        }
        // Both restarted and no Primary around: their ids say which is the source.
        if was.is_none() && self.yield_if_outranked(i, v, out) {
            return Ok(());
        }
        if was.is_none() && self.peers[i].role == Role::Primary {
            // Its list (to come) names what we missed; our own suspect ranges we pull too.
            self.pull_suspect(v, Some(self.peers[i].id), out);
        }
        // An up-to-date peer whose ids are older than ours (it was cut off while we took
        // writes, then every Primary went) is behind us, not the reference. Our relays of
        // a gone Primary's writes that missed it stay claims, as against newer ids
        // (failover soak seed 467009619: a replica back from a restart, being synced,
        // was the Primary's only peer to take a write; it met a peer with equal ids after
        // the Primary went and pulled that write's range from it).
        if was.is_none() && disk == DiskState::UpToDate && !self.newer_than(i, v) {
            self.claims_but_relays_become_suspect(i, v);
        }
        if was.is_none() {
            self.stale_if_older(i, v, out);
            self.full_sync_if_older(i, v, out);
            self.crashed_meets_newer(i, v);
        }
        if disk == DiskState::UpToDate
            && self.role != Role::Primary
            && self.peer_newer(i, v)
            && !self.current_under_primary(v)
            && !self.restored_relays_stand(v)
        {
            // It is current with newer ids: what we claim it lacks is older than its
            // data, or from writes that failed; we take its version. Not when we are
            // current under a connected Primary ourselves: we then hold every write it
            // completed, and our claims are its writes the peer missed (our ids may be
            // older only because we were synced with no Primary around and took none:
            // cluster-crash soak seed 201015450, a replica that alone held a Primary's
            // acknowledged write yielded it to a peer that lacked it, and both waited).
            // Nor our claims from the connected Primary's own writes that missed it, sent
            // us after its list to us ended (`primary_relays`; overlapping soak seed
            // 204004523: a replica being synced alone held such a write, acknowledged,
            // and pulled it from the peer that lacked it while that Primary listed it).
            // Nor claims restored at a restart while Inconsistent, which may be such
            // relays (`restored_relays_stand`; failover seed 430004651: a replica being
            // synced held an acknowledged write its up-to-date peer with newer ids
            // lacked, stopped, and yielded the claim at its return: the write was gone).
            let kept = self.take_primary_relays(i, v);
            self.yield_claims(i, v, out);
            if let Some(kept) = kept {
                self.peers[i].vols[v].oos.union_with(&kept);
            }
        }
        let mine = self.vols[v].disk;
        // A write unanswered on another peer's dropped link that was not sent to it (see
        // `caught_up_after_failure`): rare, so its marks are copied only then.
        let id = self.peers[i].id;
        let missed_one = self.role == Role::Primary
            && (self.peers.iter()).any(|p| p.vols[v].unanswered_missed.contains(id));
        let pv = &mut self.peers[i].vols[v];
        pv.created =
            created && pv.diskful && matches!(disk, DiskState::Inconsistent | DiskState::UpToDate);
        if !pv.diskful || disk == DiskState::Diskless {
            pv.repl = Repl::Established;
            return Ok(());
        }
        let mut synced = false;
        let mut barrier = false;
        let mut caught_up = None;
        if disk == DiskState::UpToDate
            && was.is_some_and(|w| w != DiskState::UpToDate)
            && pv.list == ListState::Sent
        {
            // It finished a resync after our complete list: all of it is there now. (Bits
            // set after the list stay until a later list or write covers them.)
            let before = missed_one.then(|| pv.oos.clone());
            pv.oos.clear_range(0, self.vols[v].size);
            pv.served = None;
            pv.repl = Repl::Established;
            synced = true;
            // Except what we told it live since its last UpToDate: it may have sent this
            // one before hearing those (overlapping seed 15630: a failed write's holder
            // being synced, marked to pull the range back from the reference, reported
            // UpToDate as the notice crossed it; cleared, the Primary took it as current
            // there, and a write it alone then received split a block's newest sectors
            // between it and the reference). A ping settles which: its answer comes after
            // the replica handled the notices, and after its new state if they made it
            // Inconsistent. Only as Primary: our view of a replica vouches for writes and
            // serves reads; a Secondary's claims need no more than today's clearing (kept
            // a moment longer, they met a peer's newer ids and were yielded as ours to pull).
            let told = pv.told_live.take();
            if let Some(told) = told.filter(|t| t.count() > 0 && self.role == Role::Primary) {
                pv.oos.union_with(&told);
                let mut unsure = told;
                if let Some((earlier, _)) = pv.unsure.take() {
                    unsure.union_with(&earlier);
                }
                pv.unsure = Some((unsure, 0));
                barrier = true;
                synced = false;
            }
            if synced {
                caught_up = before;
            }
        }
        if let Some(before) = caught_up {
            self.caught_up_after_failure(i, v, &before);
        }
        let pv = &mut self.peers[i].vols[v];
        // An UpToDate replica that restarted and was synced by a peer while we were away
        // may hold what that peer lacked (see `LocalVol::unproven`): only the Primary
        // knows, and it lists everything.
        let unproven_current = self.role == Role::Primary
            && pv.unproven
            && !pv.pulls_suspect
            && disk == DiskState::UpToDate;
        // Both created empty and ours has received nothing: both hold zeroes, and the
        // peer reaches the new-cluster rule from the same facts. (Two connections racing
        // at a new cluster's start once made one replica list everything to the other,
        // a needless full resync.)
        let both_empty = pv.created && self.vols[v].created;
        if mine == DiskState::UpToDate
            && ((pv.needs_everything() && !both_empty) || unproven_current)
        {
            // Its currency is unknown (it restarted), or it holds nothing (created empty):
            // it needs everything. Already listed on this connection (we became Primary
            // since: crash-family seed 74, a replica the contest's winner synced before
            // every node had met stayed unproven, and the winner, promoted, marked all of
            // it without telling it), it hears the new list now.
            let before = pv.oos.count();
            pv.oos.set_all();
            let relist = was.is_some()
                && matches!(pv.list, ListState::Sent | ListState::Stale)
                && pv.oos.count() > before;
            if relist {
                self.send_list(i, v, out);
            }
        }
        if was.is_none() {
            self.lacks_all_before_tenure(i, v);
            // List what it lacks from us (writes made while it was away, or everything),
            // and end the list even when empty: then it knows all it lacks. Diskless
            // Primaries list too: they know what they wrote; the peer pulls from a replica.
            // Writes still in flight that missed it mark their bits when they complete, so
            // the list waits for them. Under the run that settled our crash, it waits for
            // that Primary's list to us (see `waits_for_primary_list`).
            if deferred || self.waits_for_primary_list(i, v) {
                self.peers[i].vols[v].list = ListState::Deferred;
            } else {
                self.send_list(i, v, out);
            }
        }
        if disk == DiskState::UpToDate
            && was.is_some_and(|w| w != DiskState::UpToDate)
            && self.peers.primary().is_none()
            && self.all_met(v)
        {
            // The source the contest chose (see `standing.rs`): what we kept and may
            // differ in is pulled from it, with what it listed (one pass: asked before
            // the resync starts).
            self.pull_suspect(v, None, out);
        }
        if matches!(mine, DiskState::Outdated | DiskState::Inconsistent)
            && disk == DiskState::UpToDate
        {
            self.peers[i].vols[v].repl = Repl::SyncTarget;
            self.pump_resync(b, v as u16, out);
        }
        if synced {
            self.tell_in_sync(i, v, out);
            self.tell_in_sync_peers(i, v, out);
        }
        if barrier {
            let p = &mut self.peers[i];
            p.pings += 1;
            p.ping_sent_ms.get_or_insert(self.now_ms);
            if let Some(u) = p.vols[v].unsure.as_mut() {
                u.1 = p.pings;
            }
            out.push(RAction::Send {
                peer: p.id,
                msg: Msg::Ping,
            });
        }
        self.check_fresh_cluster(v, out);
        self.check_proven(v, out);
        self.check_gen_proven(v, out);
        self.adopt_from_primary(v, out);
        Ok(())
    }

    /// As a diskless Primary: peer `i`'s replica of `v` has ids strictly older than those
    /// we were promoted with, so it missed writes from before our tenure. Only the diskful
    /// replicas' bitmaps name those; ours, kept for this tenure's writes, do not, and our
    /// list would settle it without them (a replica back from a crash under a Primary's
    /// list is current once it pulled what that list names, `resync_finished`). It is
    /// listed everything instead and pulls from an up-to-date replica. Failover soak seed
    /// 422008346: a replica that had missed an acknowledged write while down met the
    /// restarted diskless Primary before the replica holding the write, was called
    /// UpToDate on its empty list, and the Primary's word that it held all its writes
    /// (`InSync`) then cleared the holder's claim: the write was lost.
    /// True if that marked more than before.
    pub(super) fn lacks_all_before_tenure(&mut self, i: usize, v: usize) -> bool {
        let Some(tenure) = self.vols[v].tenure.as_ref() else {
            return false;
        };
        let pv = &mut self.peers[i].vols[v];
        let keeps = pv.diskful && pv.disk.is_some_and(|d| d != DiskState::Diskless);
        if self.vols[v].diskful || !keeps || lineage(&pv.gen, &tenure.from) != Lineage::Older {
            return false;
        }
        let before = pv.oos.count();
        pv.oos.set_all();
        pv.oos.count() > before
    }

    /// A new cluster: our replica of `v` and every other one were created empty at their
    /// nodes' start and have received nothing, and every node keeping one is connected
    /// and has said so. Then all are equal (zeroes) and all are UpToDate without a sync.
    /// Anything less (a node keeping a replica that is down, or one that holds data) and
    /// the created replicas are pulled in full from an up-to-date one instead.
    pub(super) fn fresh_cluster(&self, v: usize) -> bool {
        self.vols[v].created
            && self
                .peers
                .iter()
                .all(|p| !p.vols[v].diskful || (p.up && p.vols[v].created))
    }

    /// Applies the new-cluster rule once its condition holds.
    pub(super) fn check_fresh_cluster(&mut self, v: usize, out: &mut Vec<RAction>) {
        if self.vols[v].disk == DiskState::UpToDate || !self.fresh_cluster(v) {
            return;
        }
        if let Some(rs) = self.vols[v].resync.take() {
            // Replies to what we asked for may still come: they are moot, not errors.
            self.vols[v].abandoned.extend(rs.outstanding.keys());
        }
        let size = self.vols[v].size;
        for p in self.peers.iter_mut() {
            let pv = &mut p.vols[v];
            if pv.diskful {
                // They make the same decision from the same facts.
                pv.oos.clear_range(0, size);
                pv.served = None;
                pv.repl = Repl::Established;
            }
        }
        self.set_disk(v, DiskState::UpToDate, DiskChange::NewCluster, out);
    }

    /// The peer's list of what we lack in `volume` ended.
    pub(super) fn on_list_end(
        &mut self,
        b: &mut Barriers,
        i: usize,
        volume: u16,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let (v, peer) = (volume as usize, self.peers[i].id);
        if v < self.vols.len() {
            self.void_ordered_apart(i, v);
        }
        let pv = self.peers[i]
            .vols
            .get_mut(v)
            .ok_or(ProtocolError::UnknownVolume(volume))?;
        if pv.list_ended().is_err() {
            // Each side reports; both decide from both reports (see `split_brain.rs`).
            self.split_brain_found(b, i, v, out);
            return Ok(());
        }
        if let Some(rs) = self.vols[v].resync.as_mut() {
            rs.lists_open.retain(|&n| n != peer);
        }
        let current_peer = self
            .peers
            .up()
            .any(|p| p.vols[v].diskful && p.vols[v].disk == Some(DiskState::UpToDate));
        if current_peer && self.peers.primary().is_none() && self.all_met(v) {
            // The last list: every node has told what it knows we missed.
            self.pull_suspect(v, None, out);
        }
        self.send_deferred_lists(v, out);
        self.pump_resync(b, volume, out);
        self.check_proven(v, out);
        self.check_gen_proven(v, out);
        self.adopt_from_primary(v, out);
        Ok(())
    }

    /// Back from a crash that the connected Primary's run settled, our list to another
    /// replica waits for that Primary's list to us: a block it names we lack is one we
    /// claim no peer lacks (`on_out_of_sync`), and a claim listed before it came could
    /// not be taken back (overlapping seed 30003616: restored from a write that failed,
    /// it was listed just before the Primary listed us the block, the failed write
    /// settled against us; each replica then refused the other the block).
    fn waits_for_primary_list(&self, i: usize, v: usize) -> bool {
        self.role != Role::Primary
            && self.peers[i].role != Role::Primary
            && self.settled_by_primary(v)
            && self.peers.primary_peer().is_some_and(|p| !p.vols[v].listed)
    }

    /// Lists that waited for the Primary's (`waits_for_primary_list`) go once it ended,
    /// or once it no longer applies (that Primary gone or demoted).
    pub(super) fn send_deferred_lists(&mut self, v: usize, out: &mut Vec<RAction>) {
        if self.role == Role::Primary {
            return; // a Primary's lists wait for its writes (`Requests`)
        }
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            if p.up && p.vols[v].list == ListState::Deferred && !self.waits_for_primary_list(i, v) {
                self.send_list(i, v, out);
            }
        }
    }

    /// A replica back from a clean restart (Outdated, not unproven) that lacks nothing
    /// any connected peer knows of becomes UpToDate once that knowledge is complete: an
    /// up-to-date peer (itself proven: one that restarted without proof may have forgotten
    /// writes we missed) has listed to us, or every node keeping a replica has met and
    /// listed to us and each kept what it knew (none unproven or created empty). Anything
    /// listed makes it a sync target instead, and the resync's end makes it UpToDate.
    pub(super) fn check_proven(&mut self, v: usize, out: &mut Vec<RAction>) {
        let vol = &self.vols[v];
        let waiting = vol.diskful
            && vol.disk == DiskState::Outdated
            && !vol.unproven
            && !vol.created
            && vol.resync.is_none();
        if !waiting || !self.peers.all_listed(v) {
            return;
        }
        let by_peer = self
            .peers
            .up()
            .find(|p| {
                let pv = &p.vols[v];
                pv.diskful && pv.listed && pv.disk == Some(DiskState::UpToDate) && !pv.unproven
            })
            .map(|p| p.id);
        let all_met = || {
            self.peers.iter().all(|p| {
                let pv = &p.vols[v];
                !pv.diskful
                    || (p.up && pv.listed && pv.disk.is_some() && !pv.unproven && !pv.created)
            })
        };
        if by_peer.is_none() && !all_met() {
            return;
        }
        if let Some(gen) = by_peer
            .and_then(|id| self.peers.get(id))
            .map(|p| p.vols[v].gen)
            .filter(|g| lineage(&self.vols[v].gen, g) == Lineage::Older)
        {
            // It lists nothing we lack: we hold its data, under its newer ids.
            self.adopt_gen(v, gen, out);
        }
        for p in self.peers.iter_mut() {
            if p.vols[v].repl == Repl::SyncTarget {
                p.vols[v].repl = Repl::Established;
            }
        }
        self.set_disk(
            v,
            DiskState::UpToDate,
            DiskChange::Proven { by: by_peer },
            out,
        );
        self.offer_to_outdated(v, out);
    }

    /// A volume we keep a replica of while a connected diskful peer's list to us has not
    /// ended, and that peer: until it ends, we do not know what we lack, and a promotion
    /// waits for it.
    /// - Outdated here, the list may prove our replica current (`check_proven`). A
    ///   Primary's writes skip an Outdated replica, and a list sent before they reached
    ///   the peer names none of them (failover seed 1930: promoted in that moment, a
    ///   node's own replica was called UpToDate without the writes it had sent to its
    ///   peer alone, and the replicas differed).
    /// - UpToDate here, the list may name writes of the last Primary that we missed: a
    ///   sync target of that Primary, dead since, holds them (failover seed 406007080: an
    ///   up-to-date replica that missed an acknowledged write was promoted between two
    ///   of the redials of `LackPrimaryWrites`, and the write was lost).
    pub(super) fn awaiting_list(&self) -> Option<(u16, NodeId)> {
        (0..self.vols.len()).find_map(|v| {
            let vol = &self.vols[v];
            if !vol.attached() {
                return None;
            }
            (self.peers.up())
                .find(|p| p.vols[v].diskful && !p.vols[v].listed)
                .map(|p| (v as u16, p.id))
        })
    }

    /// The peer says we lack this range (in its list, or live: a write we missed).
    pub(super) fn on_out_of_sync(
        &mut self,
        b: &mut Barriers,
        i: usize,
        volume: u16,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let v = self.check_range(volume, offset, u64::from(len))?;
        self.void_ordered_apart(i, v);
        if self.split_brain_claim(i, v, offset, len, out) {
            return Ok(());
        }
        if self.claim_void(i, v) {
            // We outrank it: it pulls what it claims from us.
            return Ok(());
        }
        let peer = self.peers[i].id;
        let newer = self.newer_than(i, v);
        let current = self.current_under_primary(v);
        // Being synced since the Primary told us live of a write we missed: the same,
        // outside what we pull (overlapping seed 238083584: told to pull a failed write
        // back from its holder, away, a replica took that holder's stale claims at its
        // return, and each then waited for the other).
        let but_for = (!current).then(|| self.current_but_for(v)).flatten();
        let pv = &self.peers[i].vols[v];
        let behind = matches!(pv.disk, Some(DiskState::Outdated | DiskState::Inconsistent));
        let counters = !pv.listed && !pv.wrote_apart && !pv.peer_wrote_apart;
        // Our ids against a consistent peer's (`newer_than`, our replica being current
        // but for what we pull).
        let newer_ids =
            pv.standing.is_some() && lineage(&self.vols[v].gen, &pv.gen) == Lineage::Newer;
        let but_for = but_for
            .filter(|_| counters && behind && newer_ids && self.peers[i].role != Role::Primary);
        let counters = counters && newer && behind;
        if let Some(pulling) = but_for {
            // Its claims where we pull are ours to pull too; elsewhere it pulls ours.
            let (mut k, end) = (offset / BLOCK, (offset + u64::from(len)).div_ceil(BLOCK));
            while k < end {
                let ours = !pulling.is_set(k);
                let mut e = k + 1;
                while e < end && pulling.is_set(e) != ours {
                    e += 1;
                }
                let lo = (k * BLOCK).max(offset);
                let hi = (e * BLOCK).min(offset + u64::from(len));
                if ours {
                    self.peers[i].lacks(v, lo, (hi - lo) as u32, out);
                } else {
                    self.mark_behind(v, peer, lo, hi - lo, false, out);
                }
                k = e;
            }
            self.pump_resync(b, volume, out);
            return Ok(());
        }
        let pv = &mut self.peers[i].vols[v];
        if counters && current {
            // Its list, while it is behind with older ids and we are current under a
            // connected Primary whose list to us ended: we hold every write that Primary
            // completed, and a write of an earlier one we lack would have left our ids
            // older than its holder's. What it claims is stale (disk-errors soak seed
            // 193051170: a Secondary stopped cleanly as the other, synced from it, said
            // UpToDate; its metadata kept what it had served as claims, and the other
            // became a sync target of a replica that could serve nothing). It pulls ours.
            self.peers[i].lacks(v, offset, len, out);
            return Ok(());
        }
        let apart = pv.wrote_apart || pv.peer_wrote_apart;
        if self.vols[v].disk == DiskState::UpToDate && apart && pv.oos.count() > 0 {
            match self.strict_descent(i, v) {
                Some(Lineage::Newer) if newer => {
                    // Our ids descend from its: it lacks nothing acknowledged that we
                    // hold (a replica that missed such a write is older by its ids than
                    // one holding it), and what it wrote apart is in our data
                    // (`void_ordered_apart`). Its claims are stale: it pulls ours (failover
                    // seed 109, the new Primary's side).
                    self.peers[i].lacks(v, offset, len, out);
                    return Ok(());
                }
                Some(Lineage::Older) if !current => {
                    // Its ids descend from ours and it wrote apart after: it holds every
                    // acknowledged write we hold, and ours there is older. What we claim
                    // it lacks is stale: we pull it instead, with what it lists (failover
                    // seed 109, the old Primary's side). Not while current under a
                    // connected Primary, which ids do not outrank (cluster-crash soak
                    // seed 201015450, see `current_under_primary`).
                    self.yield_claims(i, v, out);
                }
                _ => {}
            }
        }
        let relay = self.relays_primary_beyond(i, v);
        let pv = &mut self.peers[i].vols[v];
        if self.vols[v].disk == DiskState::UpToDate && (pv.oos.count() > 0 || pv.wrote_apart) {
            if pv.wrote_apart || pv.peer_wrote_apart {
                // Each has writes the other lacks, and one of us made them as Primary
                // apart from the other, their ids diverged (or not comparable): two
                // Primaries. Count what it lists; at the end of its list, stop (see
                // `SplitBrain`).
                self.record_claim(i, v, offset, len);
                return Ok(());
            }
            // A live notice relaying a write of a Primary we do not reach: that write is
            // newer than anything we hold, whatever the relay's own ids say (a sync
            // target keeps its old ids until its resync ends). Failover soak seed
            // 370004285: an up-to-date replica cut off from the Primary turned such a
            // relay back as the sync target's lack, stayed up to date without the write,
            // and served the range to the Primary back from its crash.
            if newer && !relay {
                // Its ids are older than ours: what it claims we lack it kept from before
                // it fell behind, or holds from a write that failed. Ours is newer there:
                // it pulls ours (soak seed 110042041: a replica back from a clean stop
                // claimed blocks the up-to-date one had since pulled from the Primary, and
                // the two redialled forever).
                self.peers[i].lacks(v, offset, len, out);
                return Ok(());
            }
            // Each lacks writes of a third node, the Primary, which it missed while apart
            // from it: only that Primary knows which is newer where they overlap. Retry
            // later (the Primary's lists settle it). Not if the peer's replica failed: it
            // holds none of the writes it tells us of but relays what the Primary sent
            // it, so we are simply behind (disk-errors seed 93076773: an up-to-date
            // Secondary took the relay for a conflict and redialled forever). Nor if it
            // relays a Primary we do not reach (`relay`): the newest write there is the
            // one it tells of (failover soak, 5000 seeds from 370,000,000: 98 failed
            // with the retry kept for relays, 79 without).
            if pv.disk != Some(DiskState::Diskless) && !relay {
                return Err(ProtocolError::LackPrimaryWrites { volume });
            }
        }
        // Restarted Inconsistent, we claim the lister lacks some of this range, and the
        // claim may relay a gone Primary's write that reached us alone
        // (`restored_relays_stand`): which of the two is newer there, neither ids nor
        // anything we kept tell. Only a Primary's lists settle it; pulled, an acknowledged
        // write could be lost (engine test
        // `claims_restored_after_a_stop_while_inconsistent_are_not_yielded_to_newer_ids`).
        if self.restored_relays_stand(v) && self.peers[i].vols[v].oos.any_in(offset, u64::from(len))
        {
            return Err(ProtocolError::LackPrimaryWrites { volume });
        }
        // After the end of its list, a peer's notices are live: a write we missed.
        let live = self.peers[i].vols[v].listed;
        if self.peers[i].role == Role::Primary && self.settled_by_primary(v) {
            // The run that settled our crash says we lack this: it missed no write a peer
            // lacks here (it marked that peer too), and a write that failed it settled
            // against us. What we claim the others lack here is no claim (overlapping seed
            // 30003616: a claim kept from a failed write the Primary then listed us left
            // the block lacking on both replicas, each refusing the other).
            for p in self.peers.iter_mut().filter(|p| p.id != peer) {
                p.vols[v].oos.clear_range(offset, u64::from(len));
            }
        }
        self.mark_behind(v, peer, offset, u64::from(len), live, out);
        self.pump_resync(b, volume, out);
        Ok(())
    }

    /// As Primary: peer `i`, which was not sent a write that then went unanswered on
    /// another peer's dropped link (`PeerVol::unanswered_missed`), reported UpToDate after
    /// our complete list, and that list named every block of those writes (`before`: what
    /// we marked it as lacking): it pulled them after the failure, from the holder that
    /// told it it lacked them or from a replica as current, so that holder's notice is
    /// settled and it is a source for them again at the holder's return like any up-to-date
    /// replica (`unanswered_lost`). Before, it stayed no source: the holder, back with older
    /// ids, was the reference, the up-to-date replica was marked to pull the range back from
    /// it, and each, syncing, refused the other for ever (overlapping seed 232029211).
    pub(super) fn caught_up_after_failure(&mut self, i: usize, v: usize, before: &Bitmap) {
        let id = self.peers[i].id;
        for (k, p) in self.peers.iter_mut().enumerate() {
            let pv = &mut p.vols[v];
            if k == i || !pv.unanswered_missed.contains(id) {
                continue;
            }
            let covered = pv.unanswered.as_ref().is_some_and(|u| {
                let mut rest = u.clone();
                rest.subtract(before);
                rest.count() == 0
            });
            if covered {
                pv.unanswered_missed.remove(id);
            }
        }
    }

    /// Some replica other than peer `i`'s may hold the newest data of this range: ours
    /// (we keep one), or another peer's that we do not know to lack all of it.
    pub(super) fn elsewhere(&self, i: usize, v: usize, offset: u64, len: u64) -> bool {
        self.vols[v].attached()
            || self.peers.iter().enumerate().any(|(j, p)| {
                j != i && p.vols[v].diskful && p.vols[v].oos.bytes_clear_in(offset, len) > 0
            })
    }

    /// The one replica that may hold a write it has not confirmed (`missing`, but it
    /// received or answered it: `reached`), when we keep none and every other diskful peer
    /// missed it without receiving it: marking it would leave the range without a source.
    pub(super) fn sole_holder(
        &self,
        v: usize,
        missing: super::nodeset::NodeSet,
        reached: super::nodeset::NodeSet,
    ) -> Option<NodeId> {
        if self.vols[v].attached() {
            return None;
        }
        let mut holders = self
            .peers
            .iter()
            .filter(|p| p.vols[v].diskful && (!missing.contains(p.id) || reached.contains(p.id)));
        match (holders.next(), holders.next()) {
            (Some(p), None) if missing.contains(p.id) => Some(p.id),
            _ => None,
        }
    }

    /// Peer `i`'s link dropped with writes `u` in flight to it, unanswered: it may have
    /// written them or not (restarted, it may have lost them too). One that landed
    /// elsewhere marked it already; the others failed, so any content is right there as
    /// long as the replicas agree. It pulls the range from a replica that is up to date
    /// there (ours, or a connected peer's we know lacks nothing there). With none, if it lacks nothing else there, its
    /// content is the range's and the others pull it from it: when it is up to date
    /// (overlapping seed 2942: otherwise both replicas lacked the range), or, back from a
    /// restart, when no peer is away (one away may be current: we cannot know; seed 3731:
    /// a crashed Secondary, the only replica up to date, was marked for a write in flight
    /// at its crash, and the other one, behind, could not serve it). A peer in `missed`
    /// was not sent one of those writes: the returning replica, if it received it, told
    /// that peer it lacks the range (its live notice of a write the peer missed), so that
    /// peer is no source for it, however current we know it to be (overlapping seeds
    /// 7542, 11606, 13206: each of the two then refused the other the range for ever).
    /// Nor is a peer whose ids are strictly older than the returning replica's, back
    /// consistent from a restart (overlapping seed 244057993, see below).
    pub(super) fn unanswered_lost(
        &mut self,
        i: usize,
        v: usize,
        u: &Bitmap,
        disk: DiskState,
        missed: NodeSet,
        out: &mut Vec<RAction>,
    ) {
        let others = |j: usize, p: &Peer| j != i && p.vols[v].diskful;
        // An away peer we already mark as lacking a block is no current replica of it:
        // it pulls the block at its return, whatever it holds (a failed write whose
        // receipt reached a diskless Primary marked the away replica, then, its crashed
        // holder back first, the holder too: the block had no source left).
        let away_at = |k: u64| {
            self.peers
                .iter()
                .enumerate()
                .any(|(j, p)| others(j, p) && !p.up && !p.vols[v].oos.is_set(k))
        };
        let may_be_reference = disk != DiskState::Diskless;
        // A source for the whole range, as one replica's claims on another cover it whole
        // (overlapping seed 15345: split block by block, the range's blocks went to two
        // sources, and the returning replica's claims on one of them, kept from its crash,
        // named a block it was told to pull from that one).
        // Nor is a peer whose ids are strictly older than those of the returning replica,
        // back from a restart consistent (a contender): meeting that peer with no Primary
        // in its view (before us), it listed it in full (`full_sync_if_older`), so the
        // peer refuses it every block and pulls from it first (overlapping seed
        // 244057993: told to pull a failed write's range from such a peer, the returning
        // replica waited for it, and the peer for the returning replica, for ever).
        let returning = &self.peers[i].vols[v];
        let outdone = |pv: &super::peer::PeerVol| {
            returning.standing.is_some() && lineage(&returning.gen, &pv.gen) == Lineage::Newer
        };
        let current = self.vols[v].disk == DiskState::UpToDate
            || self.peers.iter().enumerate().any(|(j, p)| {
                let pv = &p.vols[v];
                others(j, p)
                    && !missed.contains(p.id)
                    && p.up
                    && pv.disk == Some(DiskState::UpToDate)
                    && !pv.oos.intersects(u)
                    && !outdone(pv)
            });
        // With none, its own marks count block by block (overlapping seed 34041: a mark it
        // had on one block of the range made it pull every other too, where it was the
        // only replica that held them: both lacked them).
        let (mut pull, mut mine) = (u.cleared(), u.cleared());
        let block = u.block_size();
        let mut b = 0;
        while let Some(k) = u.next_set(b) {
            b = k + 1;
            let reference = may_be_reference && (disk == DiskState::UpToDate || !away_at(k));
            let theirs = current || !reference || self.peers[i].vols[v].oos.is_set(k);
            let to = if theirs { &mut pull } else { &mut mine };
            to.set_range(k * block, block);
        }
        let size = self.vols[v].size;
        self.peers[i].vols[v].oos.union_with(&pull);
        if mine.count() == 0 {
            return;
        }
        for (j, p) in self.peers.iter_mut().enumerate() {
            if j == i || !p.vols[v].diskful {
                continue;
            }
            let pv = &mut p.vols[v];
            pv.oos.union_with(&mine);
            if p.up && matches!(pv.list, ListState::Sent | ListState::Stale) {
                pv.told_live
                    .get_or_insert_with(|| mine.cleared())
                    .union_with(&mine);
                send_ranges(p.id, v, &mine, size, out);
            }
        }
    }

    /// Every other node is connected and has listed what it knows we lack in `v`.
    pub(super) fn all_met(&self, v: usize) -> bool {
        self.peers.iter().all(|p| p.up && p.vols[v].listed)
    }

    /// Back from a crash, under Primary `primary` (a peer, or this node once promoted;
    /// `None`: no node is Primary and every one has met us and listed):
    /// pull the ranges where our replica may differ from every other (kept until a resync
    /// ends under a Primary's list: a Primary met later has them pulled again).
    pub(super) fn pull_suspect(
        &mut self,
        v: usize,
        primary: Option<NodeId>,
        out: &mut Vec<RAction>,
    ) {
        let vol = &mut self.vols[v];
        let pulls = vol.attached() && vol.disk != DiskState::UpToDate;
        let Some(suspect) = vol.suspect.as_ref().filter(|_| pulls) else {
            return;
        };
        let bytes = suspect.count() * suspect.block_size();
        // Pulled now: no run met later settles them (see `writer.rs`).
        vol.crashed_under = None;
        let suspect = suspect.clone();
        let rs = self.resync_mut(v, false);
        rs.to_pull.union_with(&suspect);
        rs.cursor = 0;
        rs.live = false;
        if self.vols[v].disk != DiskState::Inconsistent {
            let why = DiskChange::CrashedExtents { primary, bytes };
            self.set_disk(v, DiskState::Inconsistent, why, out);
        }
    }

    /// Back from a crash, under a Primary, we meet a peer back from a crash too whose ids
    /// descend from ours: it went on with a Primary after we were gone, so what our bitmap
    /// says it lacks predates its newer run, and ours to pull (as with no Primary around,
    /// where the contest ranks us below it). Kept: claims from that Primary's own writes
    /// that missed it (`primary_relays`), which newer ids do not make stale. (Overlapping
    /// soak seed 384011407: a replica crashed twice claimed its activity log's ranges on
    /// such a peer, which took them before the Primary's list; that peer claimed on it what
    /// the Primary listed, and each waited for the other, with no up-to-date replica left.)
    fn crashed_meets_newer(&mut self, i: usize, v: usize) {
        let pv = &self.peers[i].vols[v];
        if self.role == Role::Primary
            || self.peers.primary().is_none()
            || self.vols[v].standing.is_none()
            || pv.standing.is_none()
            || !self.peer_newer(i, v)
        {
            return;
        }
        self.claims_but_relays_become_suspect(i, v);
    }

    /// `claims_become_suspect`, but for the claims `primary_relays` keeps.
    fn claims_but_relays_become_suspect(&mut self, i: usize, v: usize) {
        let kept = self.take_primary_relays(i, v);
        self.claims_become_suspect(i, v);
        if let Some(kept) = kept {
            self.peers[i].vols[v].oos.union_with(&kept);
        }
    }

    /// Takes out of our claims on peer `i` those `primary_relays` keeps, to be put back
    /// once the rest is yielded.
    fn take_primary_relays(&mut self, i: usize, v: usize) -> Option<Bitmap> {
        let ranges = self.primary_relays(i, v).filter(|r| !r.is_empty())?;
        let pv = &mut self.peers[i].vols[v];
        let mut kept = pv.oos.cleared();
        for (start, end) in ranges {
            pv.oos.move_range(start, end - start, &mut kept);
        }
        Some(kept)
    }

    /// Back from a crash, what our metadata kept of what peer `i` lacks (bitmap pages
    /// written long ago, our activity log's extents) is no claim against an up-to-date
    /// replica: unproven, we are no proof of being newer anywhere, and listing it would
    /// meet the peer's own list of what we missed as a conflict no Primary settles (the
    /// kill -9 test looped on it). Those blocks are where we may differ: we pull them from
    /// a current replica, as our activity log's. Claims against a peer that is itself
    /// behind stay (soak seed 101022420: they may be all anyone knows of what it missed).
    fn claims_become_suspect(&mut self, i: usize, v: usize) {
        let vol = &mut self.vols[v];
        let lister = self.peers[i].id;
        let pv = &mut self.peers[i].vols[v];
        let Some(suspect) = vol.suspect.as_mut().filter(|_| vol.unproven) else {
            return;
        };
        if !pv.diskful || pv.oos.count() == 0 {
            return;
        }
        suspect.union_with(&pv.oos);
        if let Some(rs) = vol.resync.as_mut() {
            vol.crashed_under = None;
            rs.to_pull.union_with(&pv.oos);
            rs.cursor = 0;
            // Our fresh sectors there whose writer is gone are pulled too, as if the peer
            // had listed them: pulled but protected, they stayed here alone (failover seed
            // 183: a write of a dead diskless Primary that reached us only, which we
            // claimed on the peer when it told us its last write of that run).
            for (offset, len) in pv.oos.runs(vol.size, u64::MAX) {
                rs.orphan_listed(lister, offset, len, None, Some(&pv.gen));
            }
        }
        pv.oos.clear_range(0, vol.size);
        pv.wrote_apart = false;
    }

    /// Peer `i` answered a ping: blocks kept out of sync at an UpToDate report that may
    /// have crossed our live notices of them are settled once the answer follows that
    /// report's ping. Still UpToDate: it had handled them before the report (a notice
    /// handled after it makes it Inconsistent, and its new state comes before this
    /// answer), so it holds them. Otherwise they stay, for its next UpToDate to clear.
    pub(super) fn settle_unsure(&mut self, i: usize, out: &mut Vec<RAction>) {
        for v in 0..self.vols.len() {
            let p = &mut self.peers[i];
            let pongs = p.pongs;
            let pv = &mut p.vols[v];
            let Some((mut unsure, _)) = pv.unsure.take_if(|(_, n)| *n <= pongs) else {
                continue;
            };
            if pv.disk != Some(DiskState::UpToDate) || pv.list != ListState::Sent {
                continue;
            }
            if let Some(told) = pv.told_live.as_ref() {
                unsure.subtract(told);
            }
            pv.oos.subtract(&unsure);
            self.tell_in_sync(i, v, out);
            self.tell_in_sync_peers(i, v, out);
        }
    }

    /// The resync of `v`, begun now if none runs. Writes a connected Primary sent us that
    /// are not settled are fresh in a new one, as if they came during it: a replica that
    /// serves our resync may not have them yet (the Primary's own write may still be
    /// on its way to its disk), and its older data would overwrite ours (overlapping
    /// soak seed 326058706: a Primary's write reached us before our resync began, and its
    /// resync read of the block, served before its own write landed, replaced it here).
    pub(super) fn resync_mut(&mut self, v: usize, live: bool) -> &mut Resync {
        if self.vols[v].resync.is_none() {
            let mut rs = Resync::new(self.vols[v].size, live);
            for (offset, len) in self.received_unsettled(v) {
                rs.wrote(offset, len);
            }
            self.vols[v].resync = Some(rs);
        }
        self.vols[v].resync.as_mut().expect("begun above")
    }

    /// We lack this range (a peer says so): become a sync target for it.
    pub(super) fn mark_behind(
        &mut self,
        v: usize,
        lister: NodeId,
        offset: u64,
        len: u64,
        live: bool,
        out: &mut Vec<RAction>,
    ) {
        if !self.vols[v].attached() {
            return;
        }
        // Up to date under the connected Primary, which tells us live of a write we missed:
        // outside what we pull, we still hold every write it completed.
        let current_under = (live && self.vols[v].resync.is_none())
            .then(|| self.peers.primary_listed(v))
            .flatten()
            .filter(|p| p.id == lister && self.current_under_primary(v))
            .map(|p| (p.id, p.conn));
        if self.vols[v].disk != DiskState::Inconsistent {
            let why = if live {
                DiskChange::MissedWrite { peer: lister }
            } else {
                DiskChange::Behind { peer: lister }
            };
            self.set_disk(v, DiskState::Inconsistent, why, out);
        }
        if self.vols[v].resync.is_none() {
            self.resync_mut(v, live).current_under = current_under;
        }
        let protect = self
            .peers
            .get(lister)
            .filter(|p| p.role == Role::Primary)
            .map(|p| p.vols[v].written_before_list.as_slice());
        // What we claim the lister lacks: it is behind there, our fresh sectors stay.
        let claimed = self.peers.get(lister).map(|p| &p.vols[v].oos);
        let lister_gen = self.peers.get(lister).map(|p| &p.vols[v].gen);
        let relay =
            live && (self.peers.index(lister)).is_some_and(|i| self.relays_primary_beyond(i, v));
        let rs = self.vols[v].resync.as_mut().expect("created above");
        rs.listed(lister, offset, len, live, protect, claimed, lister_gen);
        if relay {
            rs.relayed_newer(offset, len);
        }
    }

    /// A Secondary whose resync began with the live notice of the connected Primary (same
    /// connection, its list to us ended) while we were up to date under it: outside what
    /// we pull, we hold every write that Primary completed, as `current_under_primary`
    /// (we take its writes while being synced, and whatever else we learn we lack is added
    /// to the pull). The blocks we pull (still to ask for, or asked for) are returned.
    pub(super) fn current_but_for(&self, v: usize) -> Option<Bitmap> {
        let vol = &self.vols[v];
        let rs = vol.resync.as_ref()?;
        let (node, conn) = rs.current_under?;
        let p = self.peers.primary_listed(v)?;
        let holds = self.role != Role::Primary
            && vol.diskful
            && vol.disk == DiskState::Inconsistent
            && (p.id, p.conn) == (node, conn);
        holds.then(|| {
            let mut pulling = rs.to_pull.clone();
            for &(o, l) in rs.outstanding.values() {
                pulling.set_range(o, u64::from(l));
            }
            pulling
        })
    }
}
