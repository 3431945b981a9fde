//! Replicas that restarted consistent, meeting with no Primary and no up-to-date replica
//! around (a whole cluster back from a stop or a crash): which one is the sync source,
//! from their generation ids (see `generation.rs`); and how a replica's ids follow the
//! data it holds (adopted from the Primary, or from the source of a resync).
//!
//! Each side ranks the pair from the same facts (both sides' ids and standings, sent in
//! `Volume` before any list), so the decisions agree: the one outranked yields what its
//! metadata claims the other lacks (pulls it instead of listing it), the one outranking
//! ignores such claims, and a replica that outranks every other once all have met is
//! UpToDate. Diverged ids stop the connection as a split brain.

use super::action::RAction;
use super::bitmap::Bitmap;
use super::event::{DiskChange, Event};
use super::generation::{lineage, outranks, unrotated, GenIds, Lineage, Standing};
use super::msg::Msg;
use super::replicas::Replicas;
use super::spec::NodeId;
use super::status::Repl;
use tandem_wire::packet::{DiskState, Role};

/// How we rank against a peer while the contest is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rank {
    /// Not both contenders, or a Primary is around: the usual rules apply.
    NotContested,
    Above,
    Below,
    Diverged,
}

impl Replicas {
    /// The ids and standing peer `i` told with its state of volume `v`.
    pub(super) fn peer_gen(
        &mut self,
        i: usize,
        v: usize,
        gen: GenIds,
        contender: bool,
        was_primary: bool,
        lost_power: bool,
    ) {
        let pv = &mut self.peers[i].vols[v];
        pv.gen = gen;
        pv.standing = contender.then_some(Standing {
            gen,
            clean: !pv.unproven,
            was_primary,
            rotated_from: pv.abandoned,
            lost_power,
        });
    }

    /// Replicas rank each other only while no node is Primary (under a Primary, its lists
    /// say who lacks what).
    pub(super) fn rank(&self, i: usize, v: usize) -> Rank {
        let (Some(me), Some(them)) = (&self.vols[v].standing, &self.peers[i].vols[v].standing)
        else {
            return Rank::NotContested;
        };
        if self.role == Role::Primary || self.peers.primary().is_some() {
            return Rank::NotContested;
        }
        match outranks(me, self.spec.me, them, self.peers[i].id) {
            Some(true) => Rank::Above,
            Some(false) => Rank::Below,
            None => Rank::Diverged,
        }
    }

    /// At the peer's first state of volume `v`, before our list to it: if it outranks us,
    /// what we claim it lacks becomes ours to pull from it (a crashed replica's suspect
    /// ranges, or blocks it is behind on). Returns whether the two diverged.
    pub(super) fn yield_if_outranked(
        &mut self,
        i: usize,
        v: usize,
        out: &mut Vec<RAction>,
    ) -> bool {
        match self.rank(i, v) {
            Rank::Diverged => {
                let (peer, pv) = (self.peers[i].id, &self.peers[i].vols[v]);
                let volume = v as u16;
                out.push(RAction::Event(Event::GenerationsDiverged {
                    volume,
                    peer,
                    mine: self.vols[v].gen.current,
                    theirs: pv.gen.current,
                }));
                self.split_brain_diverged(i, v, out);
                true
            }
            Rank::Below => {
                self.yield_claims(i, v, out);
                false
            }
            Rank::Above | Rank::NotContested => false,
        }
    }

    /// What we claim peer `i` lacks becomes ours to pull from it.
    pub(super) fn yield_claims(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let peer = self.peers[i].id;
        let size = self.vols[v].size;
        let claims = std::mem::replace(&mut self.peers[i].vols[v].oos, Bitmap::new(size));
        if claims.count() == 0 {
            return;
        }
        if let Some(suspect) = self.vols[v].suspect.as_mut() {
            suspect.union_with(&claims);
            return;
        }
        for (offset, len) in claims.runs(size, u64::MAX) {
            self.mark_behind(v, peer, offset, len, false, out);
        }
        // Marked as if it listed them; if its list on this connection has ended, no end
        // marker is to come (overlapping seed 1799: the resync waited for one for ever).
        if self.peers[i].vols[v].listed {
            if let Some(rs) = self.vols[v].resync.as_mut() {
                rs.lists_open.retain(|&n| n != peer);
            }
        }
    }

    /// Whether a claim from peer `i` that we lack something is void: we outrank it, and
    /// it pulls what it claims from us instead. Not while it follows a Primary (one we do
    /// not reach): it relays that Primary's writes we missed, newer than anything we hold
    /// (failover seed 2270: a replica back from a crash, cut off from the new Primary,
    /// outranked the relaying replica by ids, dropped the notice of an acknowledged write,
    /// and was promoted later without it).
    pub(super) fn claim_void(&self, i: usize, v: usize) -> bool {
        self.rank(i, v) == Rank::Above && self.peers[i].primaries.is_empty()
    }

    /// Once every diskful node has met us and listed, none is up to date nor a Primary
    /// keeping a replica, and we outrank every one of them: our replica is the reference.
    pub(super) fn check_gen_proven(&mut self, v: usize, out: &mut Vec<RAction>) {
        let vol = &self.vols[v];
        if vol.standing.is_none() || vol.disk != DiskState::Outdated || vol.resync.is_some() {
            return;
        }
        if self.role == Role::Primary {
            return;
        }
        let Some(primary) = self.contest_primary(v) else {
            return;
        };
        if !self.outranks_every_peer(v, primary) {
            return;
        }
        let current = self.vols[v].gen.current;
        let vol = &mut self.vols[v];
        vol.unproven = false;
        let suspect = vol.suspect.take();
        for p in self.peers.iter_mut() {
            if p.vols[v].repl == Repl::SyncTarget {
                p.vols[v].repl = Repl::Established;
            }
        }
        let why = DiskChange::ProvenByGeneration { current };
        self.set_disk(v, DiskState::UpToDate, why, out);
        // Our suspect ranges (activity-log extents of writes that may be here alone) are
        // the reference's now: the others take them, as DRBD resyncs a crashed Primary's
        // extents from the source. Kept out of their lists (we meant to pull them), a
        // write of ours that failed stayed here alone (failover soak seed 370002353).
        // Not where a peer is marked already (listed, or to be): pulled once.
        if let Some(suspect) = suspect.filter(|s| s.count() > 0) {
            let size = self.vols[v].size;
            for p in self.peers.iter_mut().filter(|p| p.vols[v].diskful) {
                let mut rest = suspect.clone();
                rest.subtract(&p.vols[v].oos);
                for (offset, len) in rest.runs(size, u64::from(tandem_wire::MAX_DATA)) {
                    p.lacks(v, offset, len as u32, out);
                }
            }
        }
        self.offer_to_outdated(v, out);
    }

    /// Back from a crash under a Primary that keeps no replica of `v`, with no replica of
    /// it up to date anywhere: our suspect ranges (activity-log extents we must pull) have
    /// no source. Once every diskful node has met us and listed, and we outrank each one
    /// by ids (it missed writes we hold: the Primary rotated them), no replica can be newer
    /// there than ours, as the contest decides with no Primary around: they are settled
    /// here (not pulled), and what the Primary's list named stays to pull.
    pub(super) fn settle_suspect_by_generation(&mut self, v: usize) {
        let vol = &self.vols[v];
        if vol.standing.is_none() || vol.suspect.is_none() || vol.resync.is_none() {
            return;
        }
        if self.role == Role::Primary || vol.disk != DiskState::Inconsistent {
            return;
        }
        // Only under a Primary, one that keeps no replica (with none, the contest's winner
        // pulls from no one: see `pull_suspect`).
        if self.contest_primary(v) != Some(ContestPrimary::Diskless)
            || !self.outranks_every_peer(v, ContestPrimary::Diskless)
        {
            return;
        }
        let vol = &mut self.vols[v];
        let mut suspect = vol.suspect.take().expect("checked above");
        vol.crashed_under = None;
        if let Some(rs) = vol.resync.as_mut() {
            // What a peer listed we do lack (the Primary's writes we missed): still pulled.
            suspect.subtract(&rs.named);
            rs.to_pull.subtract(&suspect);
            rs.cursor = 0;
        }
    }

    /// Back from a crash that the connected Primary's same run settled
    /// (`settled_by_primary`: the page cache kept every write, and that run's list to us
    /// names exactly what we lack), under that Primary keeping no replica of `v`, with every
    /// diskful peer met, listed, Outdated (it serves nothing) and outranked by our ids: what
    /// the list named has no source. A write that Primary completed and we missed would
    /// have left our ids older than those of a replica holding it (the rotation), no
    /// diskful peer is newer than us, and the Primary holds none: the named blocks are a
    /// failed write's settled against us (either content is right) or a completed write no
    /// replica holds. They are settled here, and the peers marked as lacking them (they
    /// take ours). Before, a failed write's reference, made Outdated by our newer ids
    /// before it met the Primary, waited to be proven, and we to pull the write's range
    /// back from it (engine test
    /// `a_failed_writes_holder_outranking_its_outdated_reference_keeps_the_range`).
    pub(super) fn settle_named_by_generation(&mut self, v: usize, out: &mut Vec<RAction>) {
        let vol = &self.vols[v];
        let Some(rs) = vol.resync.as_ref() else {
            return;
        };
        if vol.standing.is_none() || vol.suspect.is_some() || !rs.outstanding.is_empty() {
            return;
        }
        if self.role == Role::Primary || vol.disk != DiskState::Inconsistent {
            return;
        }
        if !self.settled_by_primary(v) || self.contest_primary(v) != Some(ContestPrimary::Diskless)
        {
            return;
        }
        let outdated = self.peers.iter().all(|p| {
            let pv = &p.vols[v];
            !pv.diskful || pv.disk == Some(DiskState::Outdated)
        });
        if !outdated || !self.outranks_every_peer(v, ContestPrimary::Diskless) {
            return;
        }
        // Ours now: the peers take it from us (a failed write's reference, not marked
        // there, may hold the write's content where we do not).
        let named = rs.to_pull.clone();
        self.diskful_peers_lack(v, &named, out);
        let size = self.vols[v].size;
        let rs = self.vols[v].resync.as_mut().expect("checked above");
        rs.to_pull.clear_range(0, size);
        rs.cursor = 0;
    }

    /// What the connected Primary means for the contest over `v` (`None`: it is off). A
    /// Primary that keeps no replica of `v` holds none of its data: once its list to us
    /// ended, the ids decide as with no Primary (non-contenders too: they must have missed
    /// writes we hold). One that keeps a replica, or has not listed yet, decides by its
    /// lists.
    fn contest_primary(&self, v: usize) -> Option<ContestPrimary> {
        match self.peers.primary_peer() {
            None => Some(ContestPrimary::None),
            Some(p) if !p.vols[v].diskful && p.vols[v].listed => Some(ContestPrimary::Diskless),
            Some(_) => None,
        }
    }

    /// Every diskful peer of `v` has met us and listed, none is up to date, and our
    /// standing is above each one's: a contender's by the contest, a non-contender's (under
    /// a diskless Primary) by strictly older ids.
    fn outranks_every_peer(&self, v: usize, primary: ContestPrimary) -> bool {
        let vol = &self.vols[v];
        let Some(me) = vol.standing else {
            return false;
        };
        let diskless_primary = primary == ContestPrimary::Diskless;
        self.peers.iter().enumerate().all(|(i, p)| {
            let pv = &p.vols[v];
            if !pv.diskful {
                return true;
            }
            if !p.up || !pv.listed || pv.disk.is_none() || pv.disk == Some(DiskState::UpToDate) {
                return false;
            }
            match &pv.standing {
                Some(them) if diskless_primary => {
                    outranks(&me, self.spec.me, them, p.id) == Some(true)
                }
                Some(_) => self.rank(i, v) == Rank::Above,
                None => !diskless_primary || lineage(&vol.gen, &pv.gen) == Lineage::Newer,
            }
        })
    }

    /// Our replica of `v` was restarted consistent (or is up to date) and its ids are
    /// strictly newer than peer `i`'s (a consistent replica).
    pub(super) fn newer_than(&self, i: usize, v: usize) -> bool {
        let pv = &self.peers[i].vols[v];
        let consistent = pv.standing.is_some() || pv.disk == Some(DiskState::UpToDate);
        let mine = self.vols[v].standing.is_some() || self.vols[v].up_to_date();
        mine && consistent && lineage(&self.vols[v].gen, &pv.gen) == Lineage::Newer
    }

    /// Back from a restart ourselves, with no Primary around, a consistent peer whose ids
    /// are older than ours may have missed writes that only a Primary knew of (one in
    /// flight to it when its link dropped, acknowledged by the others: crash-family seed
    /// 738), and that Primary's knowledge is likely gone with the cluster. It is listed
    /// in full unless our bitmap for it counts from an id it holds (DRBD's rule: bitmap
    /// UUID equal to the peer's current UUID), which a clean stop of ours keeps (see
    /// `bitmap_gi.rs`). A running replica meeting an older one lists its bitmap: the
    /// Primary, alive, lists what it knows.
    pub(super) fn full_sync_if_older(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let restarted = self.vols[v].standing.is_some();
        if !restarted
            || self.role == Role::Primary
            || self.peers.primary().is_some()
            || !self.newer_than(i, v)
        {
            return;
        }
        let covers = self.bitmap_covers(i, v);
        let peer = self.peers[i].id;
        let pv = &mut self.peers[i].vols[v];
        if !covers {
            pv.oos.set_all();
        }
        out.push(RAction::Event(Event::OlderPeerListed {
            volume: v as u16,
            peer,
            since: pv.bitmap_gi.filter(|_| covers),
            bytes: pv.oos.count() * pv.oos.block_size(),
        }));
    }

    /// Our replica of `v` is up to date under a connected Primary whose list to us ended:
    /// it holds every write that Primary completed (it sends us each one since).
    pub(super) fn current_under_primary(&self, v: usize) -> bool {
        self.role != Role::Primary
            && self.vols[v].diskful
            && self.vols[v].disk == DiskState::UpToDate
            && self.peers.primary_listed(v).is_some()
    }

    /// What we claim peer `i` lacks from writes of the connected Primary that did not go
    /// to it, sent us on that Primary's current connection after its list to us ended.
    /// That Primary marked the peer for each (a write that missed a diskful node marks
    /// it once it lands anywhere), and the peer can hold nothing newer there: a later
    /// write of that range that went to it came to us too, and cleared our claim. Newer
    /// ids of the peer do not make such a claim stale (they do not order replicas: ours
    /// may be older only because we were being synced when the Primary rotated them).
    /// Byte ranges, block-aligned; past `Relayed::CAP` a claim is not among them.
    ///
    /// With no Primary connected, they stand too while that Primary is gone and the peer's
    /// ids do not hold the last ids we heard from it: that run rotated them past the peer,
    /// so the peer missed writes of it, and our copy of those it relayed may be the only
    /// one left (failover soak seed 370000394: a replica being synced yielded such claims
    /// to a peer with older ids, that peer was promoted without the writes, and the dead
    /// Primary's return met diverged ids).
    pub(super) fn primary_relays(&self, i: usize, v: usize) -> Option<Vec<(u64, u64)>> {
        let r = self.peers[i].vols[v].relayed.as_ref()?;
        if let Some(p) = self.peers.primary_listed(v) {
            return (p.id == r.node && p.conn == r.conn).then(|| r.ranges.clone());
        }
        let writer = self.peers.get(r.node).filter(|w| !w.up)?;
        let last = writer.vols[v].gen.current;
        let theirs = &self.peers[i].vols[v].gen;
        let holds = last == 0 || last == theirs.current || theirs.history.contains(&last);
        (!holds).then(|| r.ranges.clone())
    }

    /// Our replica of `v` restarted Inconsistent and is not proven since, and no Primary is
    /// connected: what it claims its peers lack may relay a gone Primary's writes that
    /// reached it alone, as `primary_relays` keeps them with no Primary connected (which
    /// ones is memory only). Newer ids of a peer do not make those claims stale: a sync
    /// target keeps its older ids while it takes a Primary's writes. A connected Primary
    /// settles them as it settles relays of an earlier connection: by its lists.
    pub(super) fn restored_relays_stand(&self, v: usize) -> bool {
        self.vols[v].claims_may_be_relays() && self.peers.primary().is_none()
    }

    /// The Primary `node` stepped down: its relays are void (another Primary, apart from
    /// us, may write a peer next; a later tenure of that node starts a new record).
    pub(super) fn forget_relays(&mut self, node: NodeId) {
        for pv in self.peers.iter_mut().flat_map(|p| p.vols.iter_mut()) {
            if pv.relayed.as_ref().is_some_and(|r| r.node == node) {
                pv.relayed = None;
            }
        }
    }

    /// Peer `i`'s ids are strictly newer than ours.
    pub(super) fn peer_newer(&self, i: usize, v: usize) -> bool {
        lineage(&self.vols[v].gen, &self.peers[i].vols[v].gen) == Lineage::Older
    }

    /// Up to date with no Primary around, we meet a consistent replica with strictly newer
    /// ids: we were cut off while it took writes (the Primary changed the ids before they
    /// completed), and every Primary has gone since. We are behind it: Outdated, ranked
    /// like a replica that restarted, and what we claim it lacks is ours to pull.
    pub(super) fn stale_if_older(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        if self.role == Role::Primary || self.peers.primary().is_some() {
            return;
        }
        let vol = &self.vols[v];
        let pv = &self.peers[i].vols[v];
        let consistent = pv.standing.is_some() || pv.disk == Some(DiskState::UpToDate);
        if !vol.up_to_date() || !pv.diskful || !consistent {
            return;
        }
        if lineage(&vol.gen, &pv.gen) != Lineage::Older {
            return;
        }
        let (gen, peer) = (vol.gen, self.peers[i].id);
        self.set_disk(v, DiskState::Outdated, DiskChange::OlderThan { peer }, out);
        self.vols[v].standing = Some(Standing {
            gen,
            clean: true,
            was_primary: false,
            rotated_from: false,
            lost_power: false,
        });
        self.broadcast_volume(v, out);
        self.yield_claims(i, v, out);
    }

    /// Which of us and peer `i` descends from the other's current id on `v` (`Older`: its
    /// ids descend from ours, the root 0 included; `Newer`: ours from its), both keeping a
    /// replica; `None` otherwise (same or diverged ids, a diskless side).
    pub(super) fn strict_descent(&self, i: usize, v: usize) -> Option<Lineage> {
        let (vol, pv) = (&self.vols[v], &self.peers[i].vols[v]);
        let kept = vol.diskful && pv.diskful && pv.disk != Some(DiskState::Diskless);
        if !kept {
            return None;
        }
        match lineage(&vol.gen, &pv.gen) {
            order @ (Lineage::Newer | Lineage::Older) => Some(order),
            Lineage::Same | Lineage::Diverged => None,
        }
    }

    /// Writes made as Primary apart from the other side by a replica whose current id the
    /// other's ids descend from are in the other's data: the other, or the source it took
    /// those ids from, held them (a write that missed a holder of an id completes only
    /// once the id changed, and ids pass on with the data: `adopt_from_primary`, a
    /// resync's end, `take_newest_gen`). They are no half of a split brain (failover seed
    /// 109: node 1, Primary once while node 0 was away, still claimed blocks on node 0
    /// after node 0 caught up through node 2, took node 1's ids there and wrote apart as
    /// Primary in turn; each side saw the other's writes apart and a split brain was
    /// found between ordered ids). Two Primaries that both acknowledged writes apart both
    /// rotated from a common id: diverged, neither flag is cleared.
    pub(super) fn void_ordered_apart(&mut self, i: usize, v: usize) {
        let order = self.strict_descent(i, v);
        let pv = &mut self.peers[i].vols[v];
        match order {
            Some(Lineage::Older) => pv.wrote_apart = false,
            Some(Lineage::Newer) => pv.peer_wrote_apart = false,
            _ => {}
        }
    }

    /// Our replica of `v` holds the data `gen` names now.
    pub(super) fn adopt_gen(&mut self, v: usize, gen: GenIds, out: &mut Vec<RAction>) {
        let vol = &mut self.vols[v];
        if vol.gen == gen {
            return;
        }
        let from = vol.gen.current;
        vol.gen = gen;
        out.push(RAction::Event(Event::GenerationChanged {
            volume: v as u16,
            from,
            to: gen.current,
        }));
        self.broadcast_volume(v, out);
    }

    /// Up to date under a connected Primary whose list to us ended: we hold its data, so
    /// its ids (taken whole: a replica synced through another may have skipped some).
    pub(super) fn adopt_from_primary(&mut self, v: usize, out: &mut Vec<RAction>) {
        if !self.vols[v].diskful || self.vols[v].disk != DiskState::UpToDate {
            return;
        }
        if let Some(gen) = self.peers.primary_listed(v).map(|p| p.vols[v].gen) {
            self.adopt_unless_ours_descend(v, gen, out);
        }
    }

    /// A Primary's ids (or one that stepped down since) for data we now hold, but never
    /// ids our own descend from: our data is newer (failover seed 3091, see ARCHITECTURE
    /// "Adoption").
    pub(super) fn adopt_unless_ours_descend(
        &mut self,
        v: usize,
        gen: GenIds,
        out: &mut Vec<RAction>,
    ) {
        if lineage(&self.vols[v].gen, &gen) != Lineage::Newer {
            self.adopt_gen(v, gen, out);
        }
    }

    /// Peer `i` rotated its ids to `gi` as Primary and crashed before it acknowledged
    /// anything under them (`Msg::Abandoned`). Our orphans written under `gi` hold no
    /// acknowledged write (`Resync::abandoned`). As a Secondary still holding `gi` as our
    /// current id (adopted from it), we set our ids back to those before, as it did: as
    /// if it had set them back in time and told us (`Rotations::hold_back`). Kept, they
    /// ranked us newer than every replica with nothing newer to give (failover seed 1071:
    /// the only holder was Inconsistent, listed everything to the rest, and no replica
    /// was up to date again), or apart from the next Primary's rotation (a split brain).
    /// Not as Primary: we may have acknowledged under them since.
    ///
    /// Ids set aside without quorum (`without_quorum`) rank it no higher: a majority may
    /// have gone on without it, and a Primary it had outrun may have acknowledged more
    /// under the ids set back to (failover seed 414006758: ranked first, it was the source
    /// of a replica missing an acknowledged write).
    pub(super) fn on_abandoned(
        &mut self,
        i: usize,
        v: usize,
        gi: u64,
        without_quorum: bool,
        out: &mut Vec<RAction>,
    ) {
        let peer = self.peers[i].id;
        self.peers[i].vols[v].abandoned = !without_quorum;
        let vol = &mut self.vols[v];
        if let Some(rs) = vol.resync.as_mut() {
            rs.abandoned(gi);
        }
        if self.role == Role::Primary || !vol.diskful || vol.gen.current != gi || gi == 0 {
            return;
        }
        let gen = unrotated(&vol.gen);
        vol.gen = gen;
        if let Some(s) = vol.standing.as_mut().filter(|s| s.gen.current == gi) {
            s.gen = gen;
        }
        out.push(RAction::Event(Event::GenerationAbandoned {
            volume: v as u16,
            peer,
            from: gi,
            to: gen.current,
        }));
        self.broadcast_volume(v, out);
    }

    /// The Primary (peer `i`) changed its ids: adopted if we are up to date under it, and
    /// answered either way.
    pub(super) fn on_generation(
        &mut self,
        i: usize,
        v: usize,
        gen: GenIds,
        out: &mut Vec<RAction>,
    ) {
        // Never ids our own descend from (as `adopt_from_primary`): our data is newer
        // (failover seed 3091: an old Primary, superseded as it took up the ids it had set
        // aside, sent them; node 0, whose ids had gone on from them under another
        // Primary, took them, and its later ids diverged from that Primary's).
        let ancestor = lineage(&self.vols[v].gen, &gen) == Lineage::Newer;
        let p = &mut self.peers[i];
        p.vols[v].gen = gen;
        let adopted = p.role == Role::Primary
            && p.vols[v].listed
            && self.vols[v].diskful
            && self.vols[v].disk == DiskState::UpToDate
            && !ancestor;
        let peer = p.id;
        if adopted {
            self.adopt_gen(v, gen, out);
        } else if p.role == Role::Primary && p.vols[v].listed && !ancestor {
            // Being synced under its list: its writes under them come to us all the same.
            if let Some(rs) = self.vols[v].resync.as_mut() {
                rs.writer_ids = Some(gen);
            }
        }
        let msg = Msg::GenAck {
            volume: v as u16,
            gi: gen.current,
            adopted,
        };
        out.push(RAction::Send { peer, msg });
    }

    /// Becoming Primary: the ids our writes carry are the newest of our replica's (if up
    /// to date) and the connected up-to-date replicas' (equal data, maybe older ids).
    pub(super) fn take_newest_gen(&mut self, v: usize, out: &mut Vec<RAction>) {
        let mut best = self.vols[v].up_to_date().then_some(self.vols[v].gen);
        for p in self.peers.up() {
            let pv = &p.vols[v];
            if pv.diskful && pv.disk == Some(DiskState::UpToDate) {
                best = match best {
                    Some(b) if lineage(&b, &pv.gen) != Lineage::Older => Some(b),
                    _ => Some(pv.gen),
                };
            }
        }
        if let Some(gen) = best {
            self.adopt_gen(v, gen, out);
        }
    }
}

/// The Primary a contest over a volume runs under (see `Replicas::contest_primary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ContestPrimary {
    None,
    Diskless,
}
