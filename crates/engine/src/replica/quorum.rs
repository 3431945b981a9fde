//! Quorum (DRBD's `quorum` resource option): a Primary completes application I/O only while
//! the replicas it reaches are a majority (or what the configuration asks for), so that two
//! sides of a partition can never both acknowledge writes.
//!
//! Counted per volume, as DRBD does: the voters are the nodes that keep a replica of the
//! volume; one reached (this node, or a connected peer) votes, up to date or not; nodes
//! without a replica (diskless clients) are tiebreakers: with an even number of voters, a
//! partition short of a majority by exactly one vote keeps its quorum if it reaches a
//! majority of the tiebreakers, and only if it held quorum before (a partition that lost it
//! cannot regain it through a tiebreaker, which may be the one the other half counted on).
//! `quorum-minimum-redundancy` asks in addition for that many up-to-date replicas reached.
//!
//! DRBD's "last man standing": a Secondary that stops cleanly tells its peers
//! (`Msg::Leaving`), its replicas Outdated from then on (they restart Outdated and are
//! proven only by meeting the others); when every voter we do not reach left that way,
//! they drop out of the voters. So stopping two of three nodes one after the other leaves
//! the third with quorum, while a node that vanished (dead, cut off) still counts: it may
//! be on the other side of a partition.

use super::action::RAction;
use super::bitmap::Bitmap;
use super::event::{DiskChange, Event};
use super::local::LocalVol;
use super::nodeset::NodeSet;
use super::peer::Peer;
use super::replicas::Replicas;
use super::spec::ResourceSpec;
use tandem_wire::packet::{DiskState, Role};

/// How many votes (or up-to-date replicas) a partition needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Votes {
    Off,
    /// More than half of the voters.
    Majority,
    /// Every voter.
    All,
    /// At least this many.
    Count(u8),
}

impl Votes {
    fn needed(self, voters: u8) -> u8 {
        match self {
            Votes::Off => 0,
            Votes::Majority => voters / 2 + 1,
            Votes::All => voters,
            Votes::Count(n) => n,
        }
    }
}

/// What a Primary does with application I/O while it has no quorum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNoQuorum {
    /// Fail it (EIO): new requests at once, writes in flight instead of completing.
    IoError,
    /// Hold it until quorum returns.
    SuspendIo,
}

/// A resource's quorum settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuorumSpec {
    pub quorum: Votes,
    pub min_redundancy: Votes,
    pub on_loss: OnNoQuorum,
}

impl QuorumSpec {
    /// No quorum: a Primary goes on alone (DRBD's default, and tandem's for two nodes).
    pub const OFF: QuorumSpec = QuorumSpec {
        quorum: Votes::Off,
        min_redundancy: Votes::Off,
        on_loss: OnNoQuorum::IoError,
    };

    pub fn is_off(&self) -> bool {
        self.quorum == Votes::Off && self.min_redundancy == Votes::Off
    }
}

/// One volume's count as this node sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuorumCount {
    /// Nodes keeping a replica of the volume.
    pub voters: u8,
    /// Of those reached, up to date.
    pub up_to_date: u8,
    /// Of those reached, not up to date (being synced, or outdated).
    pub present: u8,
    /// Votes the partition needs.
    pub needed: u8,
    /// Up-to-date replicas it needs (`quorum-minimum-redundancy`).
    pub redundancy_needed: u8,
    /// Nodes without a replica of the volume, and how many of them are reached (this node
    /// included).
    pub tiebreakers: u8,
    pub tiebreakers_reached: u8,
    /// Voters not reached that left cleanly, dropped from `voters` because every voter
    /// not reached did (last man standing).
    pub departed: u8,
}

impl QuorumCount {
    pub fn votes(&self) -> u8 {
        self.up_to_date + self.present
    }

    /// With `held`: whether the partition held quorum until now (the tiebreaker rule).
    pub fn quorate(&self, held: bool) -> bool {
        let redundancy = self.up_to_date >= self.redundancy_needed;
        let votes = self.votes() >= self.needed;
        let tiebreak = held
            && self.voters.is_multiple_of(2)
            && self.votes() + 1 == self.needed
            && self.tiebreakers_reached * 2 > self.tiebreakers;
        redundancy && (votes || tiebreak)
    }

    /// Counts volume `v` from our replica and the peers' (a peer's vote counts if
    /// `reached` says so of it).
    pub(super) fn of<'a>(
        spec: &ResourceSpec,
        vol: &LocalVol,
        peers: impl Iterator<Item = &'a Peer>,
        v: usize,
        reached: impl Fn(&Peer) -> bool,
    ) -> QuorumCount {
        let mut c = QuorumCount {
            voters: 0,
            up_to_date: 0,
            present: 0,
            needed: 0,
            redundancy_needed: 0,
            tiebreakers: 0,
            tiebreakers_reached: 0,
            departed: 0,
        };
        let mut vanished = 0;
        let vote = |c: &mut QuorumCount, disk: Option<DiskState>| match disk {
            Some(DiskState::UpToDate) => c.up_to_date += 1,
            Some(DiskState::Inconsistent | DiskState::Outdated) => c.present += 1,
            // Detached: a replica that holds nothing anyone may count on.
            Some(DiskState::Diskless) | None => {}
        };
        if vol.diskful {
            c.voters += 1;
            vote(&mut c, Some(vol.disk));
        } else {
            c.tiebreakers += 1;
            c.tiebreakers_reached += 1;
        }
        for p in peers {
            let pv = &p.vols[v];
            if pv.diskful {
                c.voters += 1;
                if reached(p) {
                    vote(&mut c, pv.disk);
                } else if p.departed {
                    c.departed += 1;
                } else {
                    vanished += 1;
                }
            } else {
                c.tiebreakers += 1;
                c.tiebreakers_reached += u8::from(reached(p));
            }
        }
        if vanished == 0 {
            c.voters -= c.departed;
        } else {
            c.departed = 0;
        }
        c.needed = spec.quorum.quorum.needed(c.voters);
        c.redundancy_needed = spec.quorum.min_redundancy.needed(c.voters);
        c
    }
}

impl Replicas {
    /// Volume `v`'s count now. A Primary counts a peer's vote only once the peer said
    /// which Primaries it follows (`Msg::Primaries`, right after its `Volume`) and none
    /// is another: a voter that follows another Primary votes for that one (failover soak
    /// seed 337009897: an old Primary cut off with a flush held took its quorum back at
    /// the `Volume` of a peer that followed the Primary promoted meanwhile, and completed
    /// the flush before the peer's next packet said so).
    pub(super) fn quorum_count(&self, v: usize) -> QuorumCount {
        if self.role == Role::Primary {
            let me = NodeSet::one(self.spec.me);
            self.quorum_count_reaching(v, |p| {
                p.up && p.primaries_heard && p.primaries.minus(me).is_empty()
            })
        } else {
            self.quorum_count_reaching(v, |p| p.up)
        }
    }

    /// Volume `v`'s count if only the peers `reached` says of were connected.
    pub(super) fn quorum_count_reaching(
        &self,
        v: usize,
        reached: impl Fn(&Peer) -> bool,
    ) -> QuorumCount {
        QuorumCount::of(&self.spec, &self.vols[v], self.peers.iter(), v, reached)
    }

    /// Whether volume `v` has quorum now (always, with quorum off).
    pub(super) fn has_quorum(&self, v: usize) -> bool {
        self.spec.quorum.is_off() || self.quorum_count(v).quorate(self.vols[v].quorum_held)
    }

    /// Whether the replicas in `holders` (nodes whose replica of `v` took a write: wrote
    /// it, or received it under protocol B, sent under A) are enough votes for a quorum
    /// (a held one kept by a tiebreaker one vote short, as `QuorumCount::quorate`): a write
    /// is acknowledged only then, so every majority that may promote another Primary
    /// holds it. Being connected to a majority is not enough: a replica that connected
    /// while the write was in flight was never sent it (quorum + stalls seed 303006807: a
    /// write landed on the Primary alone, its one holder peer stalled and then cut off,
    /// and the peer back meanwhile made the count while lacking it).
    pub(super) fn quorum_holds(&self, v: usize, holders: NodeSet) -> bool {
        if self.spec.quorum.is_off() {
            return true;
        }
        let mut c = self.quorum_count(v);
        let votes = (self.spec.nodes.iter())
            .filter(|(id, keeps)| keeps[v] && holders.contains(*id))
            .count() as u8;
        c.up_to_date = votes;
        c.present = 0;
        c.quorate(self.vols[v].quorum_held)
    }

    /// A node demoted while a volume has no quorum forgets what it claims its peers lack
    /// there: a majority may have promoted another Primary and written on since, and the
    /// replicas that may hold those writes settle them among themselves (a Secondary marks
    /// the third parties a write missed; Secondaries that lose their Primary compare its
    /// unsettled writes, `settle.rs`). Kept, they made a split brain of its return (cli
    /// `the_primary_cut_off_stops_and_the_majority_goes_on`: a write in flight when its
    /// cable was cut, failed, claimed the new Primary lacked it). A replica it keeps may
    /// hold such writes (failed ones, landed here only): it turns Outdated and unproven
    /// and pulls those ranges back under the next Primary it meets, as a replica back from
    /// a crash pulls its activity log's extents (`LocalVol::suspect`). Only the ranges
    /// our tenure wrote (`Tenure::written`): a claim from before it (a peer back
    /// with an empty replica lacks everything) names data we hold as current as anyone,
    /// and pulled back it was lost where we were its only holder (failover soak seed
    /// 370002771: the whole volume pulled back from replicas that lacked an
    /// acknowledged write).
    pub(super) fn left_without_quorum(&mut self, out: &mut Vec<RAction>) {
        if self.spec.quorum.is_off() {
            return;
        }
        for v in 0..self.vols.len() {
            if self.has_quorum(v) {
                continue;
            }
            let mut claimed = Bitmap::new(self.vols[v].size);
            for p in self.peers.iter_mut() {
                let pv = &mut p.vols[v];
                if pv.diskful {
                    claimed.union_with(&pv.oos);
                }
                pv.oos = pv.oos.cleared();
                pv.unanswered = None;
                pv.unconfirmed = None;
                pv.wrote_apart = false;
            }
            let vol = &mut self.vols[v];
            if let Some(t) = vol.tenure.as_ref() {
                claimed.intersect_with(&t.written);
            }
            if let Some(rs) = vol.resync.as_mut().filter(|_| vol.diskful) {
                // Being synced, it holds them too, protected as written during the resync:
                // they are pulled back with the rest (failover seed 1439: a Primary being
                // synced kept a failed write of its tenure that no other replica had, its
                // claims on the source forgotten here, and the replicas differed).
                for (offset, len) in claimed.runs(vol.size, u64::MAX) {
                    rs.pull_back(offset, len);
                }
                continue;
            }
            if !vol.diskful || vol.disk != DiskState::UpToDate {
                continue;
            }
            let bytes = claimed.count() * claimed.block_size();
            vol.unproven = true;
            vol.suspect = Some(claimed);
            self.set_disk(
                v,
                DiskState::Outdated,
                DiskChange::LostQuorum { bytes },
                out,
            );
        }
    }

    /// At the end of every event: records whether each volume has quorum, saying so when
    /// that changed. Returns whether a volume regained it (held I/O may go on).
    pub(super) fn update_quorum(&mut self, out: &mut Vec<RAction>) -> bool {
        if self.spec.quorum.is_off() {
            return false;
        }
        let mut regained = false;
        for v in 0..self.vols.len() {
            let count = self.quorum_count(v);
            let now = count.quorate(self.vols[v].quorum_held);
            if now != self.vols[v].quorum_held {
                self.vols[v].quorum_held = now;
                regained |= now;
                out.push(RAction::Event(Event::QuorumChanged {
                    volume: v as u16,
                    quorate: now,
                    count,
                }));
            }
        }
        regained
    }
}
