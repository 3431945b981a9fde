//! A sync target pulling: from whom (`pick_source`), what next and how fast
//! (`pump_resync`, with `Resync::take_next` and `pace.rs`), a resync reply, the end of a
//! resync (proof, ids adopted, claims dropped), `invalidate`, and offering ourselves to
//! peers that wait for an up-to-date source.

use super::action::RAction;
use super::barriers::{Barriers, FlushWaiter};
use super::bitmap::{Bitmap, BLOCK};
use super::event::{DiskChange, Event, LocalFailure, ProtocolError};
use super::generation::{lineage, GenIds, Lineage};
use super::msg::{DataRef, Msg, Token};
use super::nodeset::NodeSet;
use super::peer::{KeptClaims, Peer};
use super::replicas::Replicas;
use super::resync::{DemotedLister, Resync};
use super::spec::NodeId;
use super::status::Repl;
use crate::io::DiskKind;
use tandem_wire::packet::{DiskState, Role};
use tandem_wire::{Errno, MAX_DATA};

const EAGAIN: u32 = Errno::Again.code();

impl Replicas {
    /// A peer to pull from: the Primary if it keeps an up-to-date replica (it has every
    /// write; a Secondary cut off from it may not know what it missed yet would serve it:
    /// seed 5603 of the overlapping-fault runs), else an up-to-date one, else a diskful one
    /// being synced itself (it serves what it has and refuses the rest), skipping those
    /// that just refused.
    pub(super) fn pick_source(&self, v: usize) -> Option<NodeId> {
        if self.vols[v].suspect.is_some() && self.peers.primary().is_none() && !self.all_met(v) {
            // Back from a crash: what one Secondary lists us is not all we missed, and it
            // may be behind where we are suspect. Wait for a Primary, or for every node to
            // have met us and listed (none Primary: then all they know is told).
            return None;
        }
        let rs = self.vols[v].resync.as_ref();
        // A replica that restarted waits for an up-to-date source: one being synced may
        // serve data older than the contest's winner holds.
        // Not once the run that settled our crash is connected: its lists name all each
        // replica lacks (overlapping seed 39262: each of two replicas held what the other
        // lacked, and neither pulled from the other).
        let contender = self.vols[v].standing.is_some() && !self.settled_by_primary(v);
        let refused = |id: &NodeId| {
            rs.is_some_and(|r| r.refused.contains(id)) || self.lacks_what_we_lack(*id, v)
        };
        let has = |p: &&Peer, want: DiskState| p.vols[v].diskful && p.vols[v].disk == Some(want);
        if let Some(p) = self
            .peers
            .up()
            .find(|p| p.role == Role::Primary && has(p, DiskState::UpToDate))
        {
            // Refused (it has not heard every list yet): ask it again later, not another.
            return (!refused(&p.id)).then_some(p.id);
        }
        let current = rs.and_then(|r| r.source).filter(|s| {
            !refused(s)
                && self
                    .peers
                    .get(*s)
                    .is_some_and(|p| p.up && has(&p, DiskState::UpToDate))
        });
        let candidate = |want: DiskState| {
            self.peers
                .up()
                .find(|p| has(p, want) && !refused(&p.id))
                .map(|p| p.id)
        };
        // Under a connected Primary whose list to us ended, no contest ranks replicas: one
        // back from a clean stop serves what it holds once every connected peer listed to
        // it, as one that never restarted (overlapping seed 238083584: it was a failed
        // write's reference, the replica told to pull the write back from it waited for it,
        // and it for that replica in turn).
        let under_primary = self.peers.primary_listed(v).is_some();
        let settled = |p: &Peer| {
            p.vols[v]
                .standing
                .as_ref()
                .is_none_or(|s| under_primary && s.clean)
        };
        current
            .or_else(|| candidate(DiskState::UpToDate))
            .or_else(|| {
                // Nor from a replica that restarted and is being synced itself: unsettled
                // (crash-family seed 2925: a replica pulled from one, was UpToDate before
                // the contest ended, and the winner then took its older ids).
                (!contender)
                    .then(|| candidate(DiskState::Inconsistent))
                    .flatten()
                    .filter(|&id| self.peers.get(id).is_none_or(settled))
            })
    }

    /// Whether peer `id` cannot hold what we lack of `v`: no Primary is connected (its
    /// lists would say), and our ids descend from its own. We took our ids up to date
    /// (from a Primary, or from a source that held them), so what we lack since was
    /// written under them or later ids, which a replica with older ids never held.
    /// Pulled from it, a block we lacked took its older data, and we called ourselves
    /// up to date (engine test `a_primary_back_from_a_crash_keeps_the_writes_of_its_tenure`:
    /// a replica being synced by a Primary that crashed pulled the Primary's last write
    /// from a replica cut off before its tenure, and the Primary, back, pulled its
    /// activity log's extents from them in turn; found tracing failover seed 497000244).
    /// Not after `tandem invalidate`: the operator names the data to take.
    fn lacks_what_we_lack(&self, id: NodeId, v: usize) -> bool {
        let invalidated = self.vols[v].resync.as_ref().is_some_and(|r| r.invalidated);
        !invalidated
            && self.peers.primary().is_none()
            && self
                .peers
                .get(id)
                .is_some_and(|p| lineage(&self.vols[v].gen, &p.vols[v].gen) == Lineage::Newer)
    }

    /// Being synced only since the connected Primary's live notice (`current_but_for`: up
    /// to date under that Primary when told, we hold every write it completed, outside
    /// what we pull and inside it too: we took every later write on that connection, so a
    /// notice there names only failed writes' ranges), with no replica up to date in
    /// reach, and every other diskful replica connected, listed to us, back from a crash
    /// (not cleanly) and pulling its suspect ranges: none of them serves us what we pull (a
    /// restarted replica is no source while being synced), and each waits for an
    /// up-to-date source. What we pull is ours: we keep it and mark them as lacking it
    /// (told live), so they pull it from us once we are up to date. Before, a failed
    /// write's reference back from a power loss pulled its activity log's extents, the
    /// write's range among them, and we waited to pull that range back from it
    /// (cluster-crash + power-loss seed 279028646; engine test
    /// `a_pull_back_whose_reference_lost_power_is_kept_by_its_holder`).
    fn keep_pull_back(&mut self, v: usize, out: &mut Vec<RAction>) {
        let Some(pulling) = self.current_but_for(v) else {
            return;
        };
        let rs = self.vols[v]
            .resync
            .as_ref()
            .expect("current_but_for says so");
        if pulling.count() == 0 || !rs.outstanding.is_empty() || self.peers.up_to_date(v) {
            return;
        }
        let waiting = |p: &Peer| {
            let pv = &p.vols[v];
            let crashed = pv.standing.as_ref().is_some_and(|s| !s.clean);
            p.up && pv.listed
                && crashed
                && pv.pulls_suspect
                && pv.disk == Some(DiskState::Inconsistent)
        };
        let mut diskful = self.peers.iter().filter(|p| p.vols[v].diskful).peekable();
        if diskful.peek().is_none() || !diskful.all(waiting) || !self.peers.all_listed(v) {
            return;
        }
        self.diskful_peers_lack(v, &pulling, out);
        let rs = self.vols[v].resync.as_mut().expect("checked above");
        rs.to_pull.subtract(&pulling);
    }

    /// Every diskful peer of `v` is marked as lacking the blocks set in `bits` (told live
    /// where our list to it has ended, else named by that list).
    pub(super) fn diskful_peers_lack(&mut self, v: usize, bits: &Bitmap, out: &mut Vec<RAction>) {
        let size = self.vols[v].size;
        let runs: Vec<_> = bits.runs(size, u64::from(MAX_DATA)).collect();
        for p in self.peers.iter_mut().filter(|p| p.vols[v].diskful) {
            for &(offset, len) in &runs {
                p.lacks(v, offset, len as u32, out);
            }
        }
    }

    /// Pulls the next ranges from the sync source, up to the window.
    pub(super) fn pump_resync(&mut self, b: &mut Barriers, volume: u16, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let chunk_blocks = u64::from(self.spec.resync_chunk) / BLOCK;
        let size = self.vols[v].size;
        self.settle_suspect_by_generation(v);
        self.settle_named_by_generation(v, out);
        self.keep_pull_back(v, out);
        let source = self.pick_source(v);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        let window = rs.window(self.spec.resync_window);
        if rs.source != source && rs.outstanding.is_empty() {
            rs.source = source;
        }
        let now = self.now_ms;
        let loaded = self.vols[v]
            .written_ms
            .is_some_and(|t| now.saturating_sub(t) < super::pace::LOAD_WINDOW_MS);
        let chunk = u64::from(self.spec.resync_chunk);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        let in_flight = rs.outstanding.values().map(|&(_, l)| u64::from(l)).sum();
        rs.pace
            .refill(now, self.spec.resync_rates, loaded, chunk, in_flight);
        rs.pace.nothing_waits();
        while let Some(src) = rs
            .source
            .filter(|&s| Some(s) == source && rs.outstanding.len() < window)
        {
            if rs.to_pull.count() == 0 || !rs.pace.allows(now, chunk) {
                break;
            }
            let id = self.next_id;
            let Some((offset, len)) = rs.take_next(id, size, chunk_blocks) else {
                break;
            };
            rs.pace.spend(now, u64::from(len));
            self.next_id += 1;
            let msg = Msg::ResyncReq {
                volume,
                id,
                offset,
                len,
            };
            out.push(RAction::Send { peer: src, msg });
        }
        let all_listed = self.peers.all_listed(v);
        let reach = self.up_to_date_within_reach(v);
        let unlogged =
            (self.vols[v].resync.as_ref()).is_some_and(|r| r.waiting() && !r.waits_for_newer);
        let older = unlogged
            .then(|| {
                self.peers
                    .up_to_date_peers(v)
                    .find(|p| self.lacks_what_we_lack(p.id, v))
            })
            .flatten()
            .map(|p| p.id);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        if let Some(older) = older {
            rs.waits_for_newer = true;
            out.push(RAction::Event(Event::ResyncWaitsForNewer { volume, older }));
        }
        if rs.waiting() && !reach && !rs.stalled {
            rs.stalled = true;
            out.push(RAction::Event(Event::ResyncStalled { volume }));
        }
        if all_listed && rs.drained() && !rs.finishing {
            rs.finishing = true;
            self.flush_locally(b, FlushWaiter::ResyncDone { volume }, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn resync_reply(
        &mut self,
        b: &mut Barriers,
        i: usize,
        volume: u16,
        id: u64,
        (offset, errno, lacking): (u64, u32, NodeSet),
        data_len: usize,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let v = volume as usize;
        let peer = self.peers[i].id;
        if self
            .vols
            .get_mut(v)
            .is_some_and(|vol| vol.abandoned.remove(&id))
        {
            return Ok(());
        }
        let Some(rs) = self.vols.get_mut(v).and_then(|vol| vol.resync.as_mut()) else {
            return Err(ProtocolError::ResyncReplyWithoutResync(id));
        };
        let Some((req_off, req_len)) = rs.outstanding.remove(&id) else {
            return Err(ProtocolError::UnknownResyncRequest(id));
        };
        if req_off != offset || (errno == 0 && data_len != req_len as usize) {
            return Err(ProtocolError::ResyncReplyMismatch(id));
        }
        if errno == EAGAIN {
            // The source lacks it too, for now: ask another one, or the same one later.
            rs.refused_by(peer, req_off, req_len, self.now_ms);
            self.pump_resync(b, volume, out);
            return Ok(());
        }
        if errno != 0 {
            rs.to_pull.set_range(req_off, u64::from(req_len));
            out.push(RAction::Event(Event::ResyncReadFailed {
                volume,
                peer,
                offset: req_off,
                len: req_len,
            }));
            return Err(ProtocolError::SourceReadFailed);
        }
        self.data_arrives(v, out);
        self.pulled(v, out);
        self.vols[v].pulled_from.insert(peer);
        // Our replica takes the source's content here: the nodes its bitmaps say lack it,
        // which it does not reach, lack ours too, and only the source knew. They are
        // marked: those we do not reach either so that they are listed when we meet, even
        // once the source is gone (failover seed 29: a Primary's failed write, pulled
        // here, was marked for the third node only on that Primary; it died, and the third
        // node kept the old block when this one was promoted), those we reach told at once
        // (failover seed 2861: the third node, linked to us alone, kept the old block and
        // the replicas differed). Marking every node we do not reach instead made claims
        // on nodes that held the block, and two replicas each claiming the other lacks it
        // redialled for ever (failover seed 337009897).
        for p in (self.peers.iter_mut()).filter(|p| lacking.contains(p.id)) {
            if p.id != peer && p.vols[v].diskful {
                p.lacks(v, offset, req_len, out);
            }
        }
        let rs = self.vols[v].resync.as_mut().expect("data_arrives keeps it");
        rs.pulled += u64::from(req_len);
        rs.pace.answered(self.now_ms, u64::from(req_len));
        if rs.data_arrived() {
            out.push(RAction::Event(Event::ResyncResumed { volume, peer }));
        }
        // Write the sectors the application has not overwritten since the resync began.
        for (part, (s, e)) in rs.unwritten_parts(offset, req_len).into_iter().enumerate() {
            let part = part as u32;
            let token = Token::ResyncWrite { id, part };
            let len = (e - s) as u32;
            let kind = DiskKind::Write { offset: s, len };
            let data = DataRef::Incoming {
                at: (s - offset) as u32,
            };
            self.vols[v]
                .apply
                .write(volume, token, kind, Some(data), true, out);
        }
        self.pump_resync(b, volume, out);
        Ok(())
    }

    pub(super) fn resync_finished(
        &mut self,
        b: &mut Barriers,
        volume: u16,
        ok: bool,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        rs.finishing = false;
        // A peer that connected while the final flush ran has not ended its list yet: it
        // may name writes we lack (simulator seed 2001780: the diskless Primary came back
        // during the flush, and the replica called itself UpToDate without its list; the
        // Primary, hearing UpToDate after sending that list, took it as received and
        // forgot the block; an acknowledged write was lost).
        if !self.peers.all_listed(v) || !rs.drained() {
            // More was listed while the final flush ran.
            return self.pump_resync(b, volume, out);
        }
        let rs = self.vols[v].resync.take().expect("checked above");
        if !ok {
            return self.local_disk_failed(v, LocalFailure::FlushAfterResync, out);
        }
        if let Some(i) = rs.source.and_then(|s| self.peers.index(s)) {
            self.peers[i].vols[v].repl = Repl::Established;
        }
        // A connected Primary has told us all we lack: what we hold now is proven current.
        let all_met_no_primary = self.peers.primary().is_none() && self.all_met(v);
        let source_current = rs
            .source
            .and_then(|s| self.peers.get(s))
            .is_some_and(|p| p.up && p.vols[v].disk == Some(DiskState::UpToDate));
        if all_met_no_primary && (self.vols[v].suspect.is_some() || source_current) {
            // Pulled what every node knew we missed, and our suspect ranges (or, unproven,
            // everything), from a current replica, with no Primary anywhere to know more:
            // current (crash-family seed 40: a replica synced so stayed unproven, and a
            // Primary met later marked all of it without ever listing it).
            self.vols[v].unproven = false;
            self.vols[v].suspect = None;
        }
        let under_primary = self.peers.primary_listed(v).is_some();
        let settled = (all_met_no_primary && source_current) || under_primary;
        if settled && self.vols[v].standing.is_some() {
            // Back from a restart and synced from the reference (the contest's winner, or
            // under a Primary's list): its own lists, and the Primary's, name what the
            // others lack. What we restored of what they lack is older (crash-family seed
            // 117: two replicas synced so listed each other stale claims and redialled
            // forever). Under a Primary, not our claims on a node we do not reach: the
            // Primary knows what that node lacks, but if it dies before the node returns,
            // ours may be all that is left of it (failover seed 49: a restarted replica
            // dropped its claim on the dead Primary's old peer, which was later taken as
            // current without an acknowledged write). A node we reach has had our list.
            // Kept, they are moot if it returns while that Primary's run is still
            // connected (`drop_kept_claims`): listed then, they were stale, and two
            // replicas each claiming the other lacks a block redialled for ever
            // (cluster-crash soak seeds 330002298, 331013103).
            let size = self.vols[v].size;
            let run = self.peers.primary_listed(v).map(Peer::run);
            for p in self.peers.iter_mut().filter(|p| Some(p.id) != rs.source) {
                match run.filter(|r| p.id != r.node && !p.up) {
                    None => {
                        p.vols[v].oos.clear_range(0, size);
                        p.vols[v].wrote_apart = false;
                    }
                    Some(run) => p.vols[v].kept = Some(KeptClaims { run, within: None }),
                }
            }
        }
        if under_primary {
            self.vols[v].unproven = false;
            self.vols[v].suspect = None;
        }
        let why = DiskChange::Synced {
            source: rs.source,
            bytes: rs.pulled,
            live: rs.live,
        };
        // Unproven with no suspect ranges (no metadata said where we may differ), we need
        // everything from a current replica; a peer not current itself listed only what it
        // knew we lack. Still unproven, we wait Outdated for a current replica's full list
        // (failover seed 237: a replica back from a crash mid-resync, which forgot the
        // blocks a dead Primary had listed to it, pulled what an Inconsistent peer listed,
        // called itself UpToDate, and was promoted without an acknowledged write).
        let whole_unproven = self.vols[v].whole_unproven();
        if whole_unproven && !source_current && !under_primary {
            return self.set_disk(v, DiskState::Outdated, why, out);
        }
        self.set_disk(v, DiskState::UpToDate, why, out);
        // Our ids follow the data: the Primary's under its list, else, with every node
        // met and none Primary, the up-to-date source's. Otherwise they stay older.
        let source_gen = rs
            .source
            .and_then(|s| self.peers.get(s))
            .filter(|p| p.up && p.vols[v].disk == Some(DiskState::UpToDate))
            .map(|p| p.vols[v].gen);
        if let Some(survivor) = rs.after_split_brain {
            self.split_brain_pulled(v, survivor);
        }
        // The victim of a split brain holds the survivor's data where either changed, and
        // what both held before elsewhere: the survivor's (if it was our source).
        let survivor_source = rs.after_split_brain.is_some() && rs.after_split_brain == rs.source;
        // Still the connection that listed as Primary, with the ids it stepped down with.
        let from_demoted_lister = rs.listed_by_demoted.is_some_and(|d| {
            rs.source == Some(d.node)
                && (self.peers.get(d.node))
                    .is_some_and(|p| p.conn == d.conn && p.vols[v].gen == d.gen)
        });
        match source_gen {
            Some(gen) if all_met_no_primary || (survivor_source && !under_primary) => {
                self.adopt_gen(v, gen, out)
            }
            Some(gen) if from_demoted_lister && !under_primary => {
                self.adopt_unless_ours_descend(v, gen, out)
            }
            _ => self.adopt_from_primary(v, out),
        }
        if !under_primary {
            self.take_writer_ids(v, rs.writer_ids, out);
        }
        self.offer_to_outdated(v, out);
    }

    /// Our resync ended with no Primary listing us, after one whose list to us had ended
    /// rotated its ids to `writer` and we could not adopt them (`Resync::writer_ids`). We
    /// took every write it made under them (a Primary that loses a replica being synced
    /// rotates before the next write that replica misses), and what we pulled, from
    /// replicas holding all it had acknowledged before: its data under them is ours, so
    /// are its ids, if ours are older. Kept older, they ranked us below the ids of the
    /// next Primary's rotation, and that Primary's ids diverged from the gone one's: it
    /// met them again as a split brain where no two Primaries wrote apart (failover seed
    /// 477000473 and eight others, the seed-237 class; engine test `writer_ids.rs`). Not
    /// when they would rank us above a connected up-to-date replica: nothing lists what we
    /// hold that it lacks on a link already up, and the sectors of a failed write of that
    /// Primary, kept here, stayed apart from it for good (failover seeds 490004312,
    /// 490008836, with the rule taken alone).
    fn take_writer_ids(&mut self, v: usize, writer: Option<GenIds>, out: &mut Vec<RAction>) {
        let Some(gen) = writer.filter(|g| lineage(g, &self.vols[v].gen) == Lineage::Newer) else {
            return;
        };
        let outranks_up_to_date = (self.peers.up_to_date_peers(v))
            .any(|p| lineage(&gen, &p.vols[v].gen) == Lineage::Newer);
        if !outranks_up_to_date {
            self.adopt_gen(v, gen, out);
        }
    }

    /// Peer `i`, Primary, stepped down: a resync of ours under its ended list holds, once
    /// done, all its tenure wrote (failover seed 430000390: a replica synced so kept its
    /// older ids, as its Primary demoted before the end; a Primary promoted earlier with
    /// its vote, cut off before its `Role` came, met it again, took it for a replica that
    /// had missed that tenure and wrote apart from it).
    pub(super) fn listing_primary_demoted(&mut self, i: usize) {
        let p = &self.peers[i];
        for (v, vol) in self.vols.iter_mut().enumerate() {
            if let Some(rs) = vol.resync.as_mut().filter(|_| p.vols[v].listed) {
                rs.listed_by_demoted = Some(DemotedLister {
                    node: p.id,
                    conn: p.conn,
                    gen: p.vols[v].gen,
                });
            }
        }
    }

    /// The Primary whose writes made sectors of our resyncs fresh is gone (see
    /// `Resync::writer_gone`).
    /// `writer`: the peer that was Primary (its ids are the ones it wrote under), or
    /// `None` for our own tenure.
    pub(super) fn fresh_writer_gone(&mut self, writer: Option<usize>) {
        let run = writer.map(|i| (self.peers[i].id, self.peers[i].incarnation));
        for v in 0..self.vols.len() {
            let gen = match writer {
                Some(i) => self.peers[i].vols[v].gen,
                None => self.vols[v].gen,
            };
            if let Some(rs) = self.vols[v].resync.as_mut() {
                rs.writer_gone(&gen, run);
            }
        }
    }

    /// The administrator threw our replica of `v` away: everything is pulled again.
    pub(super) fn invalidate(&mut self, v: usize, out: &mut Vec<RAction>) {
        let vol = &mut self.vols[v];
        if let Some(rs) = vol.resync.take() {
            // Replies to what the old resync asked for are moot now.
            vol.abandoned.extend(rs.outstanding.keys());
        }
        if vol.unproven {
            // Its suspect ranges are part of everything now.
            vol.suspect = None;
        }
        vol.standing = None;
        let mut rs = Resync::new(vol.size, false);
        rs.to_pull.set_all();
        rs.invalidated = true;
        vol.resync = Some(rs);
        self.set_disk(v, DiskState::Inconsistent, DiskChange::Invalidated, out);
    }

    /// We just became up to date: connected peers whose replica is Outdated (their
    /// currency unknown) or created empty get everything from us.
    pub(super) fn offer_to_outdated(&mut self, v: usize, out: &mut Vec<RAction>) {
        for i in 0..self.peers.len() {
            let up = self.peers[i].up;
            let pv = &mut self.peers[i].vols[v];
            if up && pv.diskful && pv.needs_everything() {
                pv.oos.set_all();
                self.send_list(i, v, out);
            }
        }
    }
}

impl Replicas {
    /// Peer `i` connected: claims on it kept under a Primary's run (`PeerVol::kept`) go
    /// if that run is connected, whether or not its list to us has ended: what the peer
    /// lacks, it knows, and lists it (the fresh-clone run of the cli test
    /// a_secondary_killed_under_a_live_primary_pulls_only_what_it_missed pulled 9,800 KiB
    /// when the peer came before the end of that list). If that run is gone, they are
    /// listed as ours.
    pub(super) fn drop_kept_claims(&mut self, i: usize, v: usize) {
        let Some(kept) = self.peers[i].vols[v].kept.take() else {
            return;
        };
        let live = (self.peers.up()).any(|p| p.role == Role::Primary && p.run() == kept.run);
        if !live {
            return;
        }
        // Held out of our list until the peer says whether it follows that run's Primary
        // (`settle_held_claims`): if not, that Primary cannot list them to it, and if it
        // dies first, ours are all that is left of them.
        let pv = &mut self.peers[i].vols[v];
        let held = match kept.within {
            Some(within) => {
                let mut held = pv.oos.clone();
                held.intersect_with(&within);
                pv.oos.subtract(&within);
                held
            }
            None => {
                pv.wrote_apart = false;
                let none = pv.oos.cleared();
                std::mem::replace(&mut pv.oos, none)
            }
        };
        pv.held = Some((kept.run, held));
    }

    /// Peer `i` says its replica of `v` is UpToDate: claims held out of our list at its
    /// return (`drop_kept_claims`) go if it follows the Primary of the run they were kept
    /// under, which listed them to it. Following it is not enough: that Primary may step
    /// down before its list is pulled, and forget its claims (failover soak seed
    /// 406002809, `left_without_quorum`).
    pub(super) fn settle_held_claims(&mut self, i: usize, v: usize) {
        let follows = self.peers[i].primaries;
        let pv = &mut self.peers[i].vols[v];
        if pv
            .held
            .as_ref()
            .is_some_and(|(run, _)| follows.contains(run.node))
        {
            pv.held = None;
        }
    }

    /// `primary` is no longer a connected Primary here (`demoted`, or its link to us
    /// dropped): claims held under its run go, as writes they missed, to the peers it can
    /// no longer list them to: every one if it demoted (demoted without quorum, it forgets
    /// its claims: failover soak seed 406002809, the write was lost), else those that do
    /// not follow it (an engine test of `claims_outlive_primary.rs`: a peer back among us
    /// alone while that Primary, connected to us, was cut off from it, never learnt of an
    /// acknowledged write it lacked once that Primary died). One that follows it still is
    /// listed by it (single soak seed 407081468: told the held claims at once, a peer the
    /// Primary had synced since turned Inconsistent with no source, and the volume
    /// stalled); if it stops following it, `on_primaries` releases them then.
    pub(super) fn release_held_claims(
        &mut self,
        primary: NodeId,
        demoted: bool,
        out: &mut Vec<RAction>,
    ) {
        for i in 0..self.peers.len() {
            if !demoted && self.peers[i].up && self.peers[i].primaries.contains(primary) {
                continue;
            }
            self.release_held_claims_of(i, primary, out);
        }
    }

    /// Peer `i` no longer follows `primary`: if `primary` is no connected Primary here
    /// either, claims held on `i` under its run go to it (see `release_held_claims`).
    pub(super) fn stopped_following(&mut self, i: usize, primary: NodeId, out: &mut Vec<RAction>) {
        let connected = (self.peers.get(primary)).is_some_and(|p| p.up && p.role == Role::Primary);
        if !connected {
            self.release_held_claims_of(i, primary, out);
        }
    }

    fn release_held_claims_of(&mut self, i: usize, primary: NodeId, out: &mut Vec<RAction>) {
        for v in 0..self.vols.len() {
            let pv = &mut self.peers[i].vols[v];
            if pv.held.as_ref().is_none_or(|(run, _)| run.node != primary) {
                continue;
            }
            let (_, held) = pv.held.take().expect("checked above");
            let size = self.vols[v].size;
            for (offset, len) in held.runs(size, u64::from(MAX_DATA)) {
                self.peers[i].lacks(v, offset, len as u32, out);
            }
        }
    }
}
