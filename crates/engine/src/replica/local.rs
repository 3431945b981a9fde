//! This node's replica of one volume: its disk state and where it came from, its apply
//! queue and, while it is a sync target, its resync.

use super::apply::ApplyQueue;
use super::bitmap::Bitmap;
use super::generation::{GenIds, Standing};
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::resync::Resync;
use super::spec::ReplicaAtStart;
use std::collections::BTreeSet;
use tandem_wire::packet::DiskState;

/// Ids we rotated to as Primary and acknowledged nothing under, left behind for the ids
/// before (`LocalVol::set_back_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SetBack {
    /// The id abandoned.
    pub(super) gi: u64,
    /// The ids set back to.
    pub(super) to: GenIds,
    /// Set aside without quorum (`Rotations::hold_back`): a majority may have gone on
    /// without us, so the ids set back to name no more than any peer holding them (no
    /// `Standing::rotated_from`).
    pub(super) without_quorum: bool,
}

#[derive(Debug)]
pub(super) struct LocalVol {
    pub(super) size: u64,
    pub(super) disk: DiskState,
    pub(super) diskful: bool,
    /// Created empty at start, no data received since (see [`ReplicaAtStart::Created`]).
    pub(super) created: bool,
    /// What the driver found at start: without metadata ([`ReplicaAtStart::Existing`]) it
    /// knows nothing of what its peers lack; back [`ReplicaAtStart::Inconsistent`], its
    /// claims on peers are restored, but what told them apart (which were a Primary's
    /// writes that missed a peer, `PeerVol::relayed`) was memory only.
    pub(super) found: ReplicaAtStart,
    /// Found at start (Outdated: currency unknown) and not yet synced under a Primary's
    /// list: peers with current data list everything to it, even once it is being synced
    /// (simulator seed 60032299: a restarted replica pulled everything from a peer cut off
    /// from the Primary, which lacked a write the restarted one had; the Primary, meeting
    /// it mid-resync, listed only what it knew it had missed, and the write was gone), and
    /// a diskful Primary lists everything to it even once it is UpToDate (seed 80045903:
    /// the same, with the resync finished before the Primary came back). Cleared when a
    /// resync ends after a connected Primary's list, or when this node becomes Primary.
    pub(super) unproven: bool,
    /// Back from a crash ([`ReplicaAtStart::Crashed`]) and not yet synced under a
    /// Primary: the ranges where it may differ from every peer, pulled under each Primary
    /// it meets (a Secondary cut off from the Primary may hold older data there).
    pub(super) suspect: Option<Bitmap>,
    /// Back from a crash in the same boot, having taken writes from a Primary's run: met
    /// again as Primary, that run settles the activity log's extents (see `writer.rs`).
    pub(super) crashed_under: Option<super::run::CrashedUnder>,
    /// Back from a crash in another boot (a power loss): ranks below a replica with the
    /// same ids that kept its page cache (`Standing::lost_power`).
    pub(super) lost_power: bool,
    /// The run that, met again as Primary, settled those extents (see `writer.rs`): while
    /// it is connected, its lists name all each replica lacks (`settled_by_primary`).
    pub(super) settled_by: Option<super::run::PrimaryRun>,
    pub(super) apply: ApplyQueue,
    pub(super) resync: Option<Resync>,
    /// When the application last wrote to this volume (here as Primary, or replicated to
    /// us): a resync is held to its minimum rate while it writes (see `pace.rs`).
    pub(super) written_ms: Option<u64>,
    /// Resync requests still unanswered when their resync was dropped (a new cluster
    /// found meanwhile): their replies are ignored.
    pub(super) abandoned: BTreeSet<u64>,
    /// Our generation ids (on a diskless node: those of the data our writes make while
    /// Primary, taken from an up-to-date peer at promotion).
    pub(super) gen: GenIds,
    /// The id our ids were set back from as Primary, with the ids set back to: we had
    /// rotated to it and acknowledged nothing under it, and a crash (or quorum lost, then
    /// a crash or a demotion) left us with the ids before (`Resource::ids_at_crash`).
    /// While we hold those ids, told to every peer at connect (`Msg::Abandoned`, see
    /// `abandoned`).
    pub(super) set_back_from: Option<SetBack>,
    /// Restarted consistent and not UpToDate since: ranked against other such replicas
    /// when no Primary and no up-to-date replica is around (see `generation.rs`).
    pub(super) standing: Option<Standing>,
    /// Nodes whose resync data landed here since this node started and the replica was
    /// not UpToDate since: a peer keeping a bitmap for us since our ids must not trust it
    /// if data from another node landed (`volume_flags::PULLED_ELSEWHERE`), since that
    /// bitmap does not name those blocks.
    pub(super) pulled_from: NodeSet,
    /// The volume had quorum as of the end of the last event (see `quorum.rs`): a
    /// tiebreaker keeps a quorum, it does not give one.
    pub(super) quorum_held: bool,
    /// As a tiebreaker: voters that missed writes of the Primary we vouch for (`tiebreak.rs`).
    pub(super) voters_behind: super::tiebreak::VotersBehind,
    /// As Primary: what our tenure began from and wrote.
    pub(super) tenure: Option<Tenure>,
}

/// One tenure as Primary, for one volume.
#[derive(Debug)]
pub(super) struct Tenure {
    /// The ids we were promoted with (see `Replicas::lacks_all_before_tenure`).
    pub(super) from: GenIds,
    /// The blocks the application wrote since our promotion (through us, to any
    /// replica). Demoted without quorum, only our claims there are our tenure's writes,
    /// which a majority may have written over since (`left_without_quorum`).
    pub(super) written: Bitmap,
}

impl LocalVol {
    /// We became Primary with our current ids: nothing written in this tenure yet.
    pub(super) fn tenure_begins(&mut self) {
        self.tenure = Some(Tenure {
            from: self.gen,
            written: Bitmap::new(self.size),
        });
    }

    /// The replica as the driver found it at start. `alone`: no other node keeps one.
    pub(super) fn at_start(size: u64, found: ReplicaAtStart, alone: bool) -> LocalVol {
        let (disk, created, resync) = match found {
            ReplicaAtStart::None => (DiskState::Diskless, false, None),
            // The only replica of the volume, created now: a new cluster of one.
            ReplicaAtStart::Created if alone => (DiskState::UpToDate, false, None),
            ReplicaAtStart::Created => {
                // It lacks everything, whatever the peers list.
                let mut rs = Resync::new(size, false);
                rs.to_pull.set_all();
                (DiskState::Inconsistent, true, Some(rs))
            }
            ReplicaAtStart::Existing | ReplicaAtStart::Inconsistent => {
                (DiskState::Outdated, false, None)
            }
            // The only replica there is: nothing anywhere can be newer.
            ReplicaAtStart::Consistent if alone => (DiskState::UpToDate, false, None),
            ReplicaAtStart::Consistent => (DiskState::Outdated, false, None),
            ReplicaAtStart::Crashed if alone => (DiskState::UpToDate, false, None),
            ReplicaAtStart::Crashed => (DiskState::Outdated, false, None),
            ReplicaAtStart::UpToDate => (DiskState::UpToDate, false, None),
        };
        LocalVol {
            size,
            disk,
            diskful: found != ReplicaAtStart::None,
            created,
            found,
            unproven: matches!(
                found,
                ReplicaAtStart::Existing | ReplicaAtStart::Inconsistent
            ) || (found == ReplicaAtStart::Crashed && !alone),
            suspect: (found == ReplicaAtStart::Crashed && !alone).then(|| Bitmap::new(size)),
            crashed_under: None,
            lost_power: false,
            settled_by: None,
            apply: ApplyQueue::default(),
            resync,
            abandoned: BTreeSet::new(),
            written_ms: None,
            gen: GenIds::default(),
            set_back_from: None,
            standing: None,
            pulled_from: Default::default(),
            quorum_held: false,
            voters_behind: Default::default(),
            tenure: None,
        }
    }

    /// Its own invariants: the apply queue's, and a resync only while Inconsistent.
    pub(super) fn check(&self, resync_window: usize) -> Result<(), String> {
        self.apply.check().map_err(|e| format!("applying: {e}"))?;
        if let Some(s) = &self.suspect {
            if !self.unproven || !self.diskful {
                return Err("suspect ranges kept by a proven or diskless replica".into());
            }
            s.check(self.size).map_err(|e| format!("suspect: {e}"))?;
        }
        if let Some(rs) = &self.resync {
            if self.disk != DiskState::Inconsistent {
                return Err(format!("a resync while {:?}", self.disk));
            }
            rs.check(self.size, resync_window)
                .map_err(|e| format!("resync: {e}"))?;
        }
        Ok(())
    }

    /// It may start again as [`ReplicaAtStart::Consistent`] after a clean stop, or as
    /// [`ReplicaAtStart::Crashed`] after a crash: UpToDate, or Outdated after a clean
    /// restart and waiting for proof, or Outdated back from a crash with its suspect
    /// ranges (an Outdated replica takes no writes: a second crash finds it as the first
    /// left it, and the driver keeps those ranges, [`Resource::suspect_ranges`]). Not
    /// while being synced, failed, created empty, or unproven without suspect ranges (no
    /// metadata). Before, a second crash before the proof restarted it Existing, its ids
    /// dropped: holding the only copy of an acknowledged write, it lost the contest to an
    /// older replica and the write was pulled over (failover seed 370003279).
    ///
    /// [`Resource::suspect_ranges`]: super::Resource::suspect_ranges
    pub(super) fn keeps_consistent(&self) -> bool {
        self.diskful
            && (self.disk == DiskState::UpToDate
                || (self.disk == DiskState::Outdated && !self.whole_unproven() && !self.created))
    }

    /// Unproven with no suspect ranges (found without metadata, or back from a crash
    /// while Inconsistent): nothing says where it is current, so none of it is.
    pub(super) fn whole_unproven(&self) -> bool {
        self.unproven && self.suspect.is_none()
    }

    /// Restarted Inconsistent and not proven since: its claims on peers are kept from its
    /// last run, where some may have been a Primary's writes that missed the peer and
    /// reached us alone (`PeerVol::relayed`, not kept across the restart; see
    /// `Replicas::restored_relays_stand`).
    pub(super) fn claims_may_be_relays(&self) -> bool {
        self.found == ReplicaAtStart::Inconsistent && self.unproven
    }

    /// The Primary reads here rather than asking a peer: every block of the replica is
    /// current. Block status answers from its allocation map on the same condition.
    pub(super) fn serves_reads(&self) -> bool {
        self.disk == DiskState::UpToDate
    }

    pub(super) fn up_to_date(&self) -> bool {
        self.diskful && self.disk == DiskState::UpToDate
    }

    /// It takes writes: current, or being synced.
    pub(super) fn takes_writes(&self) -> bool {
        self.diskful && matches!(self.disk, DiskState::UpToDate | DiskState::Inconsistent)
    }

    /// The id we abandoned as Primary (`set_back_from`), while our ids are still the ones
    /// set back to: from them we rotated to it.
    pub(super) fn abandoned(&self) -> Option<SetBack> {
        self.set_back_from.filter(|s| s.to == self.gen)
    }

    /// It keeps a replica that has not failed.
    pub(super) fn attached(&self) -> bool {
        self.diskful && self.disk != DiskState::Diskless
    }

    pub(super) fn set_disk(&mut self, disk: DiskState) {
        self.disk = disk;
        if !matches!(disk, DiskState::Outdated | DiskState::Inconsistent) {
            // Settled (UpToDate) or failed: no longer ranked by its start.
            self.standing = None;
            self.settled_by = None;
            self.pulled_from = Default::default();
        }
        // A new cluster's replicas stay "created" when UpToDate (they still hold nothing
        // but zeroes) until data arrives, so nodes that meet later still see a new
        // cluster; any other UpToDate came with data, which cleared it.
        if !matches!(disk, DiskState::Inconsistent | DiskState::UpToDate) {
            self.created = false;
        }
    }

    /// What we tell peer `to` of it; `wrote_apart`: we completed writes that peer missed.
    pub(super) fn msg(
        &self,
        volume: u16,
        to: super::spec::NodeId,
        wrote_apart: bool,
        met_before: bool,
    ) -> Msg {
        Msg::Volume {
            volume,
            size: self.size,
            disk: self.disk,
            created: self.created,
            unproven: self.unproven,
            pulls_suspect: self.unproven && self.suspect.is_some(),
            wrote_apart,
            gen: self.gen,
            contender: self.standing.is_some(),
            was_primary: self.standing.is_some_and(|s| s.was_primary),
            lost_power: self.standing.is_some_and(|s| s.lost_power),
            met_before,
            pulled_elsewhere: !self.pulled_from.minus(NodeSet::one(to)).is_empty(),
        }
    }
}
