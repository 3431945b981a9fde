//! What this node knows of the resource's replicas: its own (one per volume) and the
//! peers' (their connection, what each lacks), with the operations every room shares:
//! changing our disk state and telling everyone, and whether a range here is current.
//!
//! The rooms that decide (`sync`: who syncs whom and what is pulled next; `receive`: the
//! writes and reads peers send us; `requests`: the application's I/O on the Primary)
//! work on this state; it knows none of them.

use super::acks::LostPrimary;
use super::action::RAction;
use super::apply::Refused;
use super::barriers::{Barriers, FlushWaiter};
use super::event::{DiskChange, Event, LocalFailure, ProtocolError};
use super::local::LocalVol;
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::peer::{Peer, Peers};
use super::spec::{ReplicaAtStart, ResourceSpec};
use tandem_wire::packet::{DiskState, Role};

#[derive(Debug)]
pub(super) struct Replicas {
    pub(super) spec: ResourceSpec,
    pub(super) role: Role,
    pub(super) vols: Vec<LocalVol>,
    pub(super) peers: Peers,
    /// Ids of requests to peers and of local flush waiters.
    pub(super) next_id: u64,
    /// Generation ids made so far (see [`Replicas::next_gi`]).
    pub(super) gis_made: u64,
    pub(super) now_ms: u64,
    /// Writes (per volume) that waited in the apply queue of a replica that detached:
    /// completed as failed at the end of the event, by the rooms that issued them.
    pub(super) refused: Vec<(u16, Refused)>,
    /// Volumes whose replica here turned UpToDate during this event: the application
    /// writes in flight it takes are on a current replica (`Writes::local_current`).
    pub(super) turned_current: Vec<usize>,
    /// Primaries we lost with writes not settled, not yet compared (see `settle.rs`).
    pub(super) lost: Vec<LostPrimary>,
    /// Peers' `PrimaryLost` we answer once we know whether we are connected to that run
    /// (see `settle.rs`, `answer_asked_lost`).
    pub(super) lost_asked: Vec<super::acks::LostAsked>,
    /// Peers' `PrimaryLost` about the run we are still connected to: compared once we lose
    /// it too (see `settle.rs`, `primary_lost`). At most one per peer.
    pub(super) asked_early: Vec<super::acks::LostAsked>,
    /// Runs of other Primaries we lost and asked our peers about: meeting one again
    /// withdraws those questions (see `settle.rs`, `met_run_again`). At most one per node.
    pub(super) runs_asked: Vec<(super::spec::NodeId, u64)>,
    /// Whose writes we take, as the metadata records (see `writer.rs`).
    pub(super) writer: super::run::Writer,
    /// As Primary: stepping down, and for what (see `primaries.rs`).
    pub(super) yielding: Option<super::primaries::StepDown>,
    /// The runs of other Primaries we followed since our start, or heard of while no
    /// Primary ourselves, the latest last (see `primaries.rs`, `followed_elsewhere`).
    pub(super) runs_known: Vec<(super::spec::NodeId, u64)>,
}

impl Replicas {
    /// This run of the engine, as peers know it (see `settle.rs`): new at every start, and
    /// not the seed itself, which names generation ids to come.
    pub(super) fn incarnation(&self) -> u64 {
        self.spec.gi_seed.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15
    }

    /// `found` says per volume what the driver found of the local replica at start.
    pub(super) fn new(spec: ResourceSpec, found: Vec<ReplicaAtStart>) -> Replicas {
        assert_eq!(
            found.len(),
            spec.sizes.len(),
            "one initial replica state per volume"
        );
        assert!(
            spec.nodes.iter().all(|(id, _)| u32::from(*id) < 32),
            "node ids are below 32"
        );
        let me = spec
            .nodes
            .iter()
            .find(|(id, _)| *id == spec.me)
            .expect("this node is in the resource");
        let vols = spec
            .sizes
            .iter()
            .zip(&found)
            .enumerate()
            .map(|(v, (&size, &found))| {
                assert_eq!(
                    me.1[v],
                    found != ReplicaAtStart::None,
                    "volume {v}: no replica exactly when the node keeps none"
                );
                let alone = !spec
                    .nodes
                    .iter()
                    .any(|(id, replicas)| *id != spec.me && replicas[v]);
                LocalVol::at_start(size, found, alone)
            })
            .collect();
        let peers = spec
            .nodes
            .iter()
            .filter(|(id, _)| *id != spec.me)
            .map(|(id, diskful)| Peer::new(*id, diskful, &spec.sizes))
            .collect();
        Replicas {
            spec,
            role: Role::Secondary,
            vols,
            peers: Peers::new(peers),
            next_id: 1,
            gis_made: 0,
            now_ms: 0,
            refused: Vec::new(),
            turned_current: Vec::new(),
            lost: Vec::new(),
            lost_asked: Vec::new(),
            asked_early: Vec::new(),
            runs_asked: Vec::new(),
            writer: Default::default(),
            yielding: None,
            runs_known: Vec::new(),
        }
    }

    /// This node's replica of volume `v` or a connected peer's is UpToDate: reads can be
    /// served and writes vouched for.
    pub(super) fn up_to_date_within_reach(&self, v: usize) -> bool {
        self.vols[v].up_to_date() || self.peers.up_to_date(v)
    }

    /// A write of this range of volume `v` can be vouched for: our replica is up to date,
    /// or a connected peer's is and holds every block the write covers only in part (see
    /// `PeerVol::current_for`).
    pub(super) fn current_within_reach(&self, v: usize, offset: u64, len: u64) -> bool {
        self.vols[v].up_to_date() || self.peers.up().any(|p| p.vols[v].current_for(offset, len))
    }

    pub(super) fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub(super) fn local_disk_failed(
        &mut self,
        v: usize,
        why: LocalFailure,
        out: &mut Vec<RAction>,
    ) {
        if !self.vols[v].attached() {
            return;
        }
        // Like DRBD's on-io-error detach: stop using a replica that failed; the application
        // carries on with the peers.
        self.vols[v].resync = None;
        self.set_disk(v, DiskState::Diskless, DiskChange::Failed(why), out);
        // Nothing more reaches the failed disk, not even what waited behind a write in
        // flight (simulator seed 683: a peer's write queued there was issued after the
        // detach).
        self.refuse_applying(v, out);
    }

    /// Completes as failed the writes waiting in a detached replica's apply queue whose
    /// turn came, and answers the reads waiting there again.
    pub(super) fn refuse_applying(&mut self, v: usize, out: &mut Vec<RAction>) {
        let (refused, reads) = self.vols[v].apply.refuse(out);
        self.refused
            .extend(refused.into_iter().map(|r| (v as u16, r)));
        for read in reads {
            self.serve_read(v as u16, read, out);
        }
    }

    /// An fdatasync covers every local replica: all of them failed.
    pub(super) fn fdatasync_failed(&mut self, out: &mut Vec<RAction>) {
        for v in 0..self.vols.len() {
            if self.vols[v].diskful {
                self.local_disk_failed(v, LocalFailure::Fdatasync, out);
            }
        }
    }

    /// Changes a volume's disk state and tells the driver and every connected peer.
    pub(super) fn set_disk(
        &mut self,
        v: usize,
        disk: DiskState,
        why: DiskChange,
        out: &mut Vec<RAction>,
    ) {
        let from = self.vols[v].disk;
        self.vols[v].set_disk(disk);
        if disk == DiskState::UpToDate && from != DiskState::UpToDate {
            self.turned_current.push(v);
        }
        out.push(RAction::Event(Event::DiskChanged {
            volume: v as u16,
            from,
            to: disk,
            why,
        }));
        self.broadcast_volume(v, out);
    }

    /// A new generation id: never 0 (the root), unique across nodes and starts as long as
    /// their seeds are (splitmix64 of the seed and a counter).
    pub(super) fn next_gi(&mut self) -> u64 {
        loop {
            self.gis_made += 1;
            let mut z = self
                .spec
                .gi_seed
                .wrapping_add(self.gis_made.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }

    /// Our state of volume `v`, as told to the peer at index `i`.
    pub(super) fn volume_msg(&self, i: usize, v: usize) -> Msg {
        let p = &self.peers[i];
        self.vols[v].msg(v as u16, p.id, p.vols[v].wrote_apart, p.conn > 1)
    }

    pub(super) fn broadcast_volume(&self, v: usize, out: &mut Vec<RAction>) {
        for (i, p) in self.peers.iter().enumerate().filter(|(_, p)| p.up) {
            out.push(RAction::Send {
                peer: p.id,
                msg: self.volume_msg(i, v),
            });
        }
    }

    /// Data reaches a replica created empty at start: it no longer holds nothing, so it
    /// must not count towards a new cluster (see [`Resource::fresh_cluster`]).
    pub(super) fn data_arrives(&mut self, v: usize, out: &mut Vec<RAction>) {
        if self.vols[v].created {
            self.vols[v].created = false;
            self.broadcast_volume(v, out);
        }
    }

    /// Lists the out-of-sync ranges of the peer at index `i` to it, then ends the list.
    pub(super) fn send_list(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let (id, size) = (self.peers[i].id, self.vols[v].size);
        self.peers[i].vols[v].send_list(id, v, size, out);
    }

    /// Whether our replica holds current data for this range, as far as every connected
    /// peer has told us what we lack: what a resync may copy from us. An up-to-date replica
    /// that has not heard every list yet may lack the range without knowing it (it just
    /// came back, and the Primary's list is on its way).
    pub(super) fn has_range(&self, v: usize, offset: u64, len: u64) -> bool {
        let vol = &self.vols[v];
        if !self.peers.all_listed(v) {
            return false;
        }
        let Some(rs) = vol.resync.as_ref() else {
            return vol.disk == DiskState::UpToDate;
        };
        // Wholly unproven, none of it is known current until it is UpToDate, whatever a
        // list that made it Inconsistent left out (failover seed 430002177: a Primary
        // killed mid-resync came back so, was listed two blocks by a peer, and served
        // that peer a block it had never pulled, without an acknowledged write).
        vol.disk == DiskState::Inconsistent && !vol.whole_unproven() && rs.holds(offset, len)
    }

    pub(super) fn check_volume(&self, volume: u16) -> Result<usize, ProtocolError> {
        let v = volume as usize;
        if v < self.vols.len() {
            Ok(v)
        } else {
            Err(ProtocolError::UnknownVolume(volume))
        }
    }

    pub(super) fn check_range(
        &self,
        volume: u16,
        offset: u64,
        len: u64,
    ) -> Result<usize, ProtocolError> {
        let v = volume as usize;
        let vol = self
            .vols
            .get(v)
            .ok_or(ProtocolError::UnknownVolume(volume))?;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > vol.size) {
            return Err(ProtocolError::OutOfRange {
                volume,
                offset,
                len,
                size: vol.size,
            });
        }
        Ok(v)
    }

    /// Whether a completed barrier makes volume `v` durable. A replica that flushed says
    /// nothing about a volume it does not keep (with volumes on different nodes, our
    /// fdatasync of volume 0 must not answer for volume 1), nor about one it is still
    /// syncing: that one is flushed too, but may lack a write only a replica gone meanwhile
    /// had. So only a replica UpToDate now answers: a peer's state reaches us in order with
    /// its acknowledgement, and one that finished its resync first flushed all it pulled.
    /// And only one we know lacks none of what the barrier vouches for: for a FLUSH,
    /// nothing at all (back after a cut, a replica says UpToDate until our list reaches
    /// it, and flushed only what it holds: overlapping seed 286090154, the replica that
    /// held a write had gone, the one back without it answered the barrier, and the FLUSH
    /// completed with that write durable nowhere); for a FUA write (`range`), its own
    /// blocks.
    pub(super) fn barrier_answers_for(
        &self,
        v: usize,
        local_ok: bool,
        peers_ok: NodeSet,
        range: Option<(u64, u64)>,
    ) -> bool {
        (local_ok && self.vols[v].up_to_date())
            || self.peers.up().any(|p| {
                let pv = &p.vols[v];
                let lacks = match range {
                    None => pv.oos.count() > 0,
                    Some((offset, len)) => pv.oos.any_in(offset, len),
                };
                peers_ok.contains(p.id)
                    && pv.diskful
                    && pv.disk == Some(DiskState::UpToDate)
                    && !lacks
            })
    }

    pub(super) fn flush_locally(
        &mut self,
        b: &mut Barriers,
        waiter: FlushWaiter,
        out: &mut Vec<RAction>,
    ) {
        let key = self.alloc_id();
        b.flush_locally(key, waiter, out);
    }
}
