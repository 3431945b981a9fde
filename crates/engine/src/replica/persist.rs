//! What a replica keeps across a clean restart: whether it was consistent, and per peer
//! the blocks that peer lacks from it (and whether it wrote them as Primary apart from it).
//! The driver writes it to the volume's metadata when the node stops cleanly and hands it
//! back at the next start ([`ReplicaAtStart::Consistent`] and [`Resource::restore_peer`]).
//! A clean stop while not consistent keeps them too ([`ReplicaAtStart::Inconsistent`]);
//! after a crash of a consistent replica the driver restores the bitmap pages with its
//! activity log's extents ([`ReplicaAtStart::Crashed`]): it starts unproven, but what it
//! knew its peers lack is kept.

use super::bitmap::Bitmap;
use super::generation::{lineage, GenIds, Lineage, Standing};
use super::local::{LocalVol, SetBack};
use super::resource::Resource;
use super::run::{CrashedUnder, PrimaryRun};
use super::spec::{NodeId, ReplicaAtStart};
use tandem_wire::packet::{DiskState, Role};

/// One volume's replica as it stops.
#[derive(Debug)]
pub struct Persisted<'a> {
    /// It may start again as [`ReplicaAtStart::Consistent`].
    pub consistent: bool,
    /// It was UpToDate (reported in the metadata for operators; the start is Outdated
    /// all the same unless it is the only replica).
    pub up_to_date: bool,
    /// It was created empty and has received nothing: it may start as
    /// [`ReplicaAtStart::Created`] again (a new cluster whose nodes did not all meet
    /// before this stop is still new).
    pub created: bool,
    pub peers: Vec<PersistedPeer<'a>>,
}

#[derive(Debug)]
pub struct PersistedPeer<'a> {
    pub node: NodeId,
    /// Blocks the peer may lack from us ([`Bitmap::words`]).
    pub out_of_sync: &'a Bitmap,
    /// We wrote some of them as Primary while apart from it (a split brain if it did too).
    pub wrote_apart: bool,
    /// The generation id from which `out_of_sync` names all the peer may lack, if any
    /// (DRBD's bitmap UUID; 0 is the first id of every lineage).
    pub bitmap_gi: Option<u64>,
}

/// A volume's generation ids as the metadata must keep them (`Resource::ids_at_crash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdsAtCrash {
    /// The ids a restart starts with.
    pub gen: GenIds,
    /// The id they were set back from as Primary (at a crash, or without quorum).
    pub abandoned: Option<AbandonedId>,
}

/// An id we rotated to as Primary and left: no acknowledged write of ours is under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbandonedId {
    pub gi: u64,
    /// Set aside without quorum (`Rotations::hold_back`): told to peers as such, it ranks
    /// us no higher among equal ids (`Standing::rotated_from`).
    pub without_quorum: bool,
}

impl From<GenIds> for IdsAtCrash {
    /// Ids with nothing abandoned (after a clean stop, or as a Secondary).
    fn from(gen: GenIds) -> IdsAtCrash {
        IdsAtCrash {
            gen,
            abandoned: None,
        }
    }
}

/// Why the state cannot be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotQuiet {
    #[error("peer {0} is still connected")]
    PeerUp(NodeId),
    #[error("{0} application requests are in flight")]
    Requests(usize),
    #[error("the node keeps no replica of volume {0}")]
    NoReplica(u16),
    /// Writes a Primary sent us are not settled (it did not tell us yet which replicas
    /// have them, or it was lost first): another replica may lack them, and only our
    /// activity log names them. A clean mark would forget them (cluster-crash seed
    /// 300200352: a Secondary shut down as the Primary died kept a write its peer never
    /// received, won the contest as the cleanly stopped one, and the two replicas stayed
    /// different). The driver leaves the metadata as after a crash: the next start pulls
    /// the log's extents, or meets the same Primary run again and trusts its list.
    #[error("{0} writes received from a Primary are not settled on every replica")]
    Unsettled(usize),
    /// Back from a crash and not yet proven: only the activity log (or what the driver
    /// kept with it, [`Resource::suspect_ranges`]) names where the replica may differ from
    /// its peers, and a clean mark would forget them (it would start as proven). The
    /// driver leaves the metadata as after a crash, as for `Unsettled`.
    #[error("back from a crash and not yet proven: {0} bytes may differ from the peers")]
    Unproven(u64),
}

/// Why a peer's bitmap cannot be restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("node {0} is not a diskful peer of volume {1}")]
    NotAPeer(NodeId, u16),
    #[error("volume {0} started with nothing kept of its peers (no metadata, or created now)")]
    NotConsistent(u16),
    #[error("volume {0} did not start Crashed with peers")]
    NotCrashed(u16),
    #[error("the node keeps no replica of volume {0}")]
    NoReplica(u16),
    #[error("{got} bitmap words for volume {volume}, at least {want} needed")]
    Short {
        volume: u16,
        got: usize,
        want: usize,
    },
}

impl Resource {
    /// What volume `volume`'s replica keeps across a clean restart. Only once every peer
    /// is disconnected and no application request is in flight: the transfer log has then
    /// marked every write a peer did not confirm.
    pub fn persisted(&self, volume: u16) -> Result<Persisted<'_>, NotQuiet> {
        let rep = &self.rep;
        if let Some(p) = rep.peers.up().next() {
            return Err(NotQuiet::PeerUp(p.id));
        }
        if self.app_in_flight() > 0 {
            return Err(NotQuiet::Requests(self.app_in_flight()));
        }
        let unsettled = rep.unsettled(volume as usize).len();
        if unsettled > 0 {
            return Err(NotQuiet::Unsettled(unsettled));
        }
        let vol = rep
            .vols
            .get(volume as usize)
            .filter(|v| v.diskful)
            .ok_or(NotQuiet::NoReplica(volume))?;
        let up_to_date = vol.disk == DiskState::UpToDate;
        let peers = rep
            .peers
            .iter()
            .filter(|p| p.vols[volume as usize].diskful)
            .map(|p| {
                let pv = &p.vols[volume as usize];
                PersistedPeer {
                    node: p.id,
                    out_of_sync: &pv.oos,
                    wrote_apart: pv.wrote_apart,
                    bitmap_gi: pv.bitmap_gi,
                }
            })
            .collect();
        // A write still to land (a peer's, received before its link went) may never land:
        // the replica cannot vouch for it (crash-family seed 141005682: a Secondary stopped
        // with a protocol-B write received and unwritten, was the cleanest after every node
        // crashed, and the contest made it the source: the write was lost).
        let landing = vol.apply.busy(0, vol.size);
        if let Some(s) = vol.suspect.as_ref().filter(|_| vol.keeps_consistent()) {
            return Err(NotQuiet::Unproven(s.count() * s.block_size()));
        }
        Ok(Persisted {
            consistent: vol.keeps_consistent() && !landing,
            up_to_date,
            created: vol.created,
            peers,
        })
    }

    /// Before the first event: what a replica that started [`ReplicaAtStart::Consistent`],
    /// [`ReplicaAtStart::Crashed`] or [`ReplicaAtStart::Inconsistent`] knew of peer `node`
    /// when it stopped (`bitmap_gi`: see [`PersistedPeer::bitmap_gi`], the last
    /// [`Event::BitmapGiChanged`](super::Event::BitmapGiChanged) after a crash).
    pub fn restore_peer(
        &mut self,
        volume: u16,
        node: NodeId,
        words: &[u64],
        wrote_apart: bool,
        bitmap_gi: Option<u64>,
    ) -> Result<(), RestoreError> {
        let v = volume as usize;
        let rep = &mut self.rep;
        let vol = rep
            .vols
            .get(v)
            .ok_or(RestoreError::NotAPeer(node, volume))?;
        // A replica back from a crash, or stopped Inconsistent, is unproven, but what it
        // knew its peers lack (the bitmap its metadata kept, which with its activity log
        // covers every block it marked) is still true, and may be known nowhere else.
        if !vol.diskful || vol.found == ReplicaAtStart::Existing || vol.created {
            return Err(RestoreError::NotConsistent(volume));
        }
        let i = rep
            .peers
            .index(node)
            .filter(|&i| rep.peers[i].vols[v].diskful)
            .ok_or(RestoreError::NotAPeer(node, volume))?;
        let pv = &mut rep.peers[i].vols[v];
        let want = pv.oos.words().len();
        if words.len() < want {
            return Err(RestoreError::Short {
                volume,
                got: words.len(),
                want,
            });
        }
        pv.oos.load_words(words);
        pv.bitmap_gi = bitmap_gi;
        // The flag stands while it lacks some of our blocks (which of them we wrote apart
        // is not kept: a split brain counts all it lacks, see `PeerVol::list_ended`).
        pv.wrote_apart = wrote_apart && pv.oos.count() > 0;
        Ok(())
    }
}

impl Resource {
    /// Whether volume `volume`'s replica is consistent now, as its metadata must say
    /// before any write that could make it otherwise lands (see
    /// [`LocalVol::keeps_consistent`](super::local::LocalVol::keeps_consistent)): a crash
    /// then starts it [`ReplicaAtStart::Crashed`], else [`ReplicaAtStart::Existing`] (and a
    /// clean stop [`ReplicaAtStart::Inconsistent`]).
    pub fn consistent(&self, volume: u16) -> bool {
        self.rep
            .vols
            .get(volume as usize)
            .is_some_and(|v| v.keeps_consistent())
    }

    /// The generation id from which our bitmap for peer `node` names all it may lack of
    /// our replica of `volume` (what the metadata must say after each
    /// [`Event::BitmapGiChanged`](super::Event::BitmapGiChanged)).
    pub fn bitmap_gi(&self, volume: u16, node: NodeId) -> Option<u64> {
        let p = self.rep.peers.get(node)?;
        p.vols.get(volume as usize)?.bitmap_gi
    }

    /// What peer `node` may lack of our replica of `volume` now ([`Bitmap::words`]): the
    /// driver writes the pages an activity-log transaction evicts before that transaction.
    pub fn out_of_sync_words(&self, volume: u16, node: NodeId) -> Option<&[u64]> {
        let p = self.rep.peers.get(node)?;
        p.vols.get(volume as usize).map(|pv| pv.oos.words())
    }

    /// The ranges of volume `volume` where a replica back from a crash and not yet
    /// proven may differ from its peers (what [`Resource::restore_suspect`] gave it), while
    /// [`Resource::consistent`] says so with them: a crash now must find them again (in the
    /// activity log, or wherever the driver kept them), with the log's extents of any
    /// write since. Empty once proven or being synced.
    pub fn suspect_ranges(&self, volume: u16) -> Vec<(u64, u64)> {
        let Some(vol) = self.rep.vols.get(volume as usize) else {
            return Vec::new();
        };
        match &vol.suspect {
            Some(s) if vol.keeps_consistent() => s.runs(vol.size, u64::MAX).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether volume `volume`'s replica still keeps suspect ranges from a crash in
    /// another boot ([`Resource::restore_lost_power`]): a crash now must say so again at
    /// the restart (the daemon writes the boot as unknown while it holds them).
    pub fn lost_power(&self, volume: u16) -> bool {
        (self.rep.vols.get(volume as usize)).is_some_and(|v| v.lost_power)
            && !self.suspect_ranges(volume).is_empty()
    }

    /// Before the first event: the ranges where a replica that started
    /// [`ReplicaAtStart::Crashed`] may differ from its peers (its activity log's extents).
    pub fn restore_suspect(
        &mut self,
        volume: u16,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<(), RestoreError> {
        let vol = self
            .rep
            .vols
            .get_mut(volume as usize)
            .ok_or(RestoreError::NotCrashed(volume))?;
        let size = vol.size;
        let suspect = vol
            .suspect
            .as_mut()
            .ok_or(RestoreError::NotCrashed(volume))?;
        for (offset, len) in ranges {
            let end = offset.saturating_add(len).min(size);
            if offset < end {
                suspect.set_range(offset, end - offset);
            }
        }
        Ok(())
    }
}

impl Resource {
    /// Before the first event, after [`Resource::restore_suspect`]: the Primary's run a
    /// replica that started [`ReplicaAtStart::Crashed`] took writes from, as its metadata
    /// recorded it, if the crash was the process's alone (the same boot: the page cache
    /// kept every write it made). Met again as Primary, that run settles the suspect
    /// ranges (see `writer.rs`).
    pub fn restore_writer(&mut self, volume: u16, run: PrimaryRun) -> Result<(), RestoreError> {
        let vol = self
            .rep
            .vols
            .get_mut(volume as usize)
            .ok_or(RestoreError::NotCrashed(volume))?;
        let log = vol
            .suspect
            .clone()
            .ok_or(RestoreError::NotCrashed(volume))?;
        vol.crashed_under = Some(CrashedUnder { run, log });
        Ok(())
    }

    /// Before the first event, after [`Resource::restore_suspect`]: the replica's node
    /// crashed in another boot (a power loss), so writes to its suspect ranges may be
    /// gone. With the same generation ids, a replica that kept its page cache is the
    /// better source (see `Standing::lost_power`).
    pub fn restore_lost_power(&mut self, volume: u16) -> Result<(), RestoreError> {
        let vol = (self.rep.vols.get_mut(volume as usize))
            .filter(|v| v.suspect.is_some())
            .ok_or(RestoreError::NotCrashed(volume))?;
        vol.lost_power = true;
        if let Some(s) = vol.standing.as_mut() {
            s.lost_power = true;
        }
        Ok(())
    }

    /// Our replica of `volume`, for a restore before the first event.
    fn replica_mut(&mut self, volume: u16) -> Result<&mut LocalVol, RestoreError> {
        (self.rep.vols.get_mut(volume as usize))
            .filter(|v| v.diskful)
            .ok_or(RestoreError::NoReplica(volume))
    }

    /// The Primary's run whose writes we take, as the metadata must say (see `writer.rs`).
    pub fn writer(&self) -> Option<PrimaryRun> {
        self.rep.writer.run
    }

    /// Before the first event: the generation ids volume `volume`'s replica kept, and
    /// whether it was Primary when it stopped. A replica that restarted consistent and
    /// is not the only one ranks with them against the others that did (see
    /// `standing.rs`).
    pub fn restore_generation(
        &mut self,
        volume: u16,
        gen: GenIds,
        was_primary: bool,
    ) -> Result<(), RestoreError> {
        let vol = self.replica_mut(volume)?;
        vol.gen = gen;
        let consistent_start = !vol.unproven || vol.suspect.is_some();
        if vol.disk == DiskState::Outdated && consistent_start && !vol.created {
            vol.standing = Some(Standing {
                gen,
                clean: !vol.unproven,
                was_primary,
                rotated_from: false,
                lost_power: vol.lost_power,
            });
        }
        Ok(())
    }

    /// The generation ids the metadata must hold for volume `volume` (what a crash of this
    /// node now must find; the driver writes them, synced, before the actions that follow
    /// `Event::GenerationChanged`, `Event::GenerationSetBack` or `Event::GenerationAcked`).
    /// As Primary, those under which it last acknowledged a request there (or was
    /// promoted), when it rotated since: no write of ours needed the newer ones, and a
    /// restart with them made a split brain of a meeting with the next Primary's rotation
    /// from the same ancestor (failover seed 1077: promoted with a voter away, the ids
    /// rotated at once, two writes on our own disk, killed before answering either). What
    /// we wrote under them is in the activity log, suspect after the crash. Kept so, the
    /// id rotated to is `abandoned` (told to peers after the restart).
    pub fn ids_at_crash(&self, volume: u16) -> Option<IdsAtCrash> {
        let vol = self.rep.vols.get(volume as usize).filter(|v| v.diskful)?;
        let gen = vol.gen;
        let acked = (self.rep.role == Role::Primary)
            .then(|| self.app.rotations.acked_gen(volume as usize))
            .flatten()
            .filter(|acked| *acked != gen && lineage(acked, &gen) == Lineage::Older);
        Some(match acked {
            Some(acked) => IdsAtCrash {
                gen: acked,
                abandoned: Some(AbandonedId {
                    gi: gen.current,
                    without_quorum: false,
                }),
            },
            None => {
                // Set back without quorum, the id set aside is abandoned too (see
                // `Rotations::demoted`).
                let set_aside = (self.rep.role == Role::Primary)
                    .then(|| self.app.rotations.set_aside(volume as usize))
                    .flatten()
                    .map(|gi| SetBack {
                        gi,
                        to: gen,
                        without_quorum: true,
                    });
                let abandoned = vol.abandoned().or(set_aside).map(|s| AbandonedId {
                    gi: s.gi,
                    without_quorum: s.without_quorum,
                });
                IdsAtCrash { gen, abandoned }
            }
        })
    }

    /// Before the first event: the ids the metadata kept (`ids_at_crash`) and whether it
    /// was Primary (see `restore_generation`); with an id abandoned as Primary, told to
    /// peers while we hold these ids (`LocalVol::abandoned`), and, unless it was set aside
    /// without quorum, first among equal ids in the contest (`Standing::rotated_from`).
    pub fn restore_ids(
        &mut self,
        volume: u16,
        ids: IdsAtCrash,
        was_primary: bool,
    ) -> Result<(), RestoreError> {
        self.restore_generation(volume, ids.gen, was_primary)?;
        let vol = self.replica_mut(volume)?;
        if let Some(AbandonedId { gi, without_quorum }) = ids.abandoned {
            vol.set_back_from = Some(SetBack {
                gi,
                to: vol.gen,
                without_quorum,
            });
            if let Some(s) = vol.standing.as_mut() {
                s.rotated_from = !without_quorum;
            }
        }
        Ok(())
    }

    /// The generation ids of volume `volume`'s replica (what the metadata must say).
    pub fn generation(&self, volume: u16) -> Option<&GenIds> {
        self.rep
            .vols
            .get(volume as usize)
            .filter(|v| v.diskful)
            .map(|v| &v.gen)
    }
}

impl ReplicaAtStart {
    /// The start a replica's clean stop allows.
    pub fn after_clean_stop(consistent: bool) -> ReplicaAtStart {
        if consistent {
            ReplicaAtStart::Consistent
        } else {
            ReplicaAtStart::Inconsistent
        }
    }
}
