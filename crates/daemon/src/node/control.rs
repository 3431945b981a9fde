//! The control socket's verbs carried out: a typed [`Request`] in, an [`Answer`] out (the
//! JSON shapes are in `crate::control_api`, shared with the CLI).

use super::state::{Ctx, Entry, NodeReactor, PeerSlot, Presence, ResCtx};
use crate::control_api::{
    Answer, Connection, Disk, PeerStatus, PeerVolumeStatus, QuorumStatus, Replication, Request,
    ResourceStatus, ResyncProgress, Role, VolumeStatus,
};
use tandem_engine::replica::{self as engine, DiskState, PeerStatus as EnginePeer, Repl};
use tracing::info;

fn disk_of(d: DiskState) -> Disk {
    match d {
        DiskState::Diskless => Disk::Diskless,
        DiskState::Inconsistent => Disk::Inconsistent,
        DiskState::Outdated => Disk::Outdated,
        DiskState::UpToDate => Disk::UpToDate,
    }
}

fn role_of(r: engine::Role) -> Role {
    match r {
        engine::Role::Primary => Role::Primary,
        engine::Role::Secondary => Role::Secondary,
    }
}

fn replication_of(r: Repl) -> Replication {
    match r {
        Repl::Off => Replication::Off,
        Repl::Established => Replication::Established,
        Repl::SyncSource => Replication::SyncSource,
        Repl::SyncTarget => Replication::SyncTarget,
    }
}

impl NodeReactor {
    pub(super) fn control_command(&mut self, line: &str) -> Answer {
        let req: Request = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => return Answer::refused(format!("not a valid request: {e}")),
        };
        let Some(name) = req.resource().map(str::to_string) else {
            return match &req {
                Request::Status { resource } => Answer::status(
                    self.status(resource.as_deref()),
                    super::limits::open_files(),
                ),
                Request::Adjust => match self.adjust() {
                    Ok(said) => Answer::said(said),
                    Err(why) => Answer::refused(why),
                },
                // A stream, not an answer: `service_control` starts it (`watchers.rs`).
                _ => Answer::refused("events are a stream: ask for them alone on a connection"),
            };
        };
        let Some(r) =
            (self.res.iter()).position(|x| x.presence != Presence::Gone && x.cfg.name == name)
        else {
            if let Some(n) = self.not_attached.iter().find(|n| n.name == name) {
                return Answer::refused(format!(
                    "resource {name} is not attached on this node: {}",
                    n.why
                ));
            }
            return Answer::refused(format!("no resource {name:?} on this node"));
        };
        let peer_name = match &req {
            Request::Connect { peer, .. } | Request::Disconnect { peer, .. } => peer.clone(),
            _ => None,
        };
        if let Some(p) = &peer_name {
            if !self.res[r].peers.iter().any(|s| &s.name == p) {
                return Answer::refused(format!("resource {name} has no peer {p:?}"));
            }
        }
        let mut actions = Vec::new();
        let mut momentary = false;
        let result = match req {
            Request::Status { .. } | Request::Events { .. } | Request::Adjust => {
                unreachable!("answered above")
            }
            Request::Primary { force, .. } => {
                let res = &mut self.res[r];
                res.engine.promote(force, &mut actions).map_err(|e| {
                    momentary = e.is_momentary();
                    res.explain(e)
                })
            }
            Request::Secondary { force, .. } => {
                self.secondary(r, force, &mut actions, &mut momentary)
            }
            Request::Invalidate { volume, .. } => {
                let res = &mut self.res[r];
                match res.cfg.volumes.iter().position(|v| v.number == volume) {
                    None => Err(format!("resource {name} has no volume {volume}")),
                    Some(v) => res
                        .engine
                        .invalidate(v as u16, &mut actions)
                        .map_err(|e| format!("volume {volume}: {e}")),
                }
            }
            Request::Connect { .. } | Request::Up { .. } => {
                let discard = matches!(
                    req,
                    Request::Connect {
                        discard_my_data: true,
                        ..
                    }
                );
                let res = &mut self.res[r];
                let ids: Vec<tandem_engine::replica::NodeId> = (res.peers.iter())
                    .filter(|s| peer_name.as_ref().is_none_or(|p| *p == s.name))
                    .map(|s| s.id)
                    .collect();
                // Refused whole (nothing reconnected) if it cannot be honoured.
                let refused = discard
                    .then(|| {
                        ids.iter()
                            .find_map(|&id| res.engine.discard_my_data(id).err())
                    })
                    .flatten();
                match refused {
                    Some(e) => Err(format!("--discard-my-data refused: {e}")),
                    None => {
                        for s in res.peers.iter_mut().filter(|s| ids.contains(&s.id)) {
                            s.wanted = true;
                            s.split_brain = None;
                            s.last_error = None;
                            s.failing = None;
                            s.link.dial_now(std::time::Instant::now());
                        }
                        Ok(())
                    }
                }
            }
            Request::Disconnect { .. } | Request::Down { .. } => {
                let keys: Vec<usize> = self.res[r]
                    .peers
                    .iter_mut()
                    .filter(|s| peer_name.as_ref().is_none_or(|p| *p == s.name))
                    .filter_map(|s| {
                        s.wanted = false;
                        // Why it is StandAlone, in `status` (not "connection lost").
                        s.last_error = Some(format!(
                            "tandem {} by the administrator; tandem connect (or up) to reconnect",
                            req.verb()
                        ));
                        s.conn.or(s.dialing)
                    })
                    .collect();
                for k in keys {
                    if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                        pc.dead = true;
                    }
                    self.mark_dirty(k);
                }
                Ok(())
            }
        };
        self.run_actions(r, actions, Ctx::default());
        self.touch(r);
        match result {
            Ok(()) => {
                match &peer_name {
                    Some(p) => {
                        info!(resource = %name, peer = %p, "administrator: {} done", req.verb())
                    }
                    None => info!(resource = %name, "administrator: {} done", req.verb()),
                }
                Answer::done()
            }
            Err(e) => Answer {
                momentary,
                ..Answer::refused(e)
            },
        }
    }

    /// A replica here changed its disk state: turning Inconsistent starts a resync's clock,
    /// and the end of that resync logs its amount, duration and rate.
    pub(super) fn time_resync(
        &mut self,
        r: usize,
        volume: u16,
        to: DiskState,
        why: &engine::DiskChange,
    ) {
        match (to, why) {
            (DiskState::Inconsistent, _) => {
                let now = std::time::Instant::now();
                self.sync_began.entry((r, volume)).or_insert(now);
            }
            (_, engine::DiskChange::Synced { bytes, .. }) => {
                if let Some(began) = self.sync_began.remove(&(r, volume)) {
                    let secs = began.elapsed().as_secs_f64();
                    info!(
                        resource = %self.res[r].cfg.name,
                        "volume {volume}: resync took {}",
                        super::progress::amount_and_rate(*bytes, secs)
                    );
                }
            }
            _ => {
                self.sync_began.remove(&(r, volume));
            }
        }
    }

    /// Samples every resync's progress (see `progress.rs`). Returns ours as a target with
    /// a source, for the peers (`tell_sync_progress`): (resource, volume, source, left,
    /// done).
    pub(super) fn sample_resyncs(
        &mut self,
        now: u64,
    ) -> Vec<(usize, u16, tandem_engine::replica::NodeId, u64, u64)> {
        let mut seen = Vec::new();
        let mut ours = Vec::new();
        for (r, res) in self.res.iter().enumerate() {
            if res.presence == Presence::Gone {
                continue;
            }
            let st = res.engine.status();
            for (v, vs) in st.volumes.iter().enumerate() {
                if let (Some(left), Some(done)) = (vs.resync_remaining, vs.resync_pulled) {
                    seen.push(((r, v as u16, None), Some(done), left));
                    if let Some(source) = vs.resync_source {
                        ours.push((r, v as u16, source, left, done));
                    }
                }
            }
            for p in &st.peers {
                for (v, pv) in p.volumes.iter().enumerate() {
                    if pv.repl == Repl::SyncSource {
                        seen.push(((r, v as u16, Some(p.id)), None, pv.out_of_sync_bytes));
                    }
                }
            }
        }
        self.resyncs.sample(now, seen);
        ours
    }

    /// A resync's progress now: ours as a target (`peer` None), or peer's from us.
    fn resync_view(
        &self,
        r: usize,
        v: u16,
        peer: Option<tandem_engine::replica::NodeId>,
        done: Option<u64>,
        left: u64,
        other: Option<String>,
    ) -> ResyncProgress {
        let view = self
            .resyncs
            .get(&(r, v, peer))
            .map(|p| p.view(self.now_ms(), done, left));
        let done = view.map_or(done.unwrap_or(0), |w| w.done);
        ResyncProgress {
            peer: other,
            done_kib: done / 1024,
            left_kib: left / 1024,
            percent: view.map_or_else(|| super::progress::percent(done, left), |w| w.percent),
            rate_kib_s: view.and_then(|w| w.rate).map(|b| b / 1024),
            eta_s: view.and_then(|w| w.eta_s),
        }
    }

    pub(super) fn status(&self, only: Option<&str>) -> Vec<ResourceStatus> {
        let down = (0..self.not_attached.len())
            .filter(|&i| only.is_none_or(|o| o == self.not_attached[i].name))
            .map(|i| self.not_attached_status(i));
        (0..self.res.len())
            .filter(|&r| self.res[r].presence != Presence::Gone)
            .filter(|&r| only.is_none_or(|n| n == self.res[r].cfg.name))
            .map(|r| self.resource_status(r))
            .chain(down)
            .collect()
    }

    /// The status of resource `r`, one of `tandem status`'s answer.
    pub(super) fn resource_status(&self, r: usize) -> ResourceStatus {
        let res = &self.res[r];
        let st = res.engine.status();
        let target = |v: usize| {
            let vs = &st.volumes[v];
            let left = vs.resync_remaining?;
            let source = vs.resync_source.map(|s| res.peer_name(s));
            Some(self.resync_view(r, v as u16, None, vs.resync_pulled, left, source))
        };
        let volumes = st
            .volumes
            .iter()
            .enumerate()
            .map(|(i, v)| VolumeStatus {
                volume: res.cfg.volumes[i].number,
                disk: disk_of(v.disk),
                size: v.size,
                writes_in_flight: v.writes_in_flight,
                resync_remaining_kib: v.resync_remaining.map(|b| b / 1024),
                resync: target(i),
                up_to_date_within_reach: v.up_to_date_within_reach,
                quorum: v.quorum.map(|q| QuorumStatus {
                    quorate: q.quorate,
                    voters: q.count.voters,
                    reached: q.count.votes(),
                    needed: q.count.needed,
                    up_to_date: q.count.up_to_date,
                    departed: q.count.departed,
                }),
            })
            .collect();
        let peers = res
            .peers
            .iter()
            .map(|slot| {
                let ps = st.peers.iter().find(|p| p.id == slot.id);
                let mut status = peer_status(res, slot, ps);
                for (i, pv) in status.volumes.iter_mut().enumerate() {
                    let engine_pv = ps.and_then(|p| p.volumes.get(i));
                    pv.resync = match engine_pv.map(|e| (e.repl, e.out_of_sync_bytes)) {
                        Some((Repl::SyncSource, left)) => Some(self.resync_view(
                            r,
                            i as u16,
                            Some(slot.id),
                            None,
                            left,
                            Some(res.peer_name(slot.id)),
                        )),
                        Some((Repl::SyncTarget, _))
                            if st.volumes[i].resync_source == Some(slot.id) =>
                        {
                            target(i)
                        }
                        // Its resync as it told us (`sync_reports.rs`): from another node,
                        // or from us where our own view has none.
                        _ => self.peer_syncs.get(&(r, slot.id, i as u16)).map(|s| {
                            let source = match s.source == res.me {
                                true => res.peer_name(slot.id),
                                false => res.peer_name(s.source),
                            };
                            let rate = (s.rate > 0).then_some(s.rate);
                            ResyncProgress {
                                peer: Some(source),
                                done_kib: s.done / 1024,
                                left_kib: s.left / 1024,
                                percent: super::progress::percent(s.done, s.left),
                                rate_kib_s: rate.map(|b| b / 1024),
                                eta_s: rate.map(|b| s.left.div_ceil(b)),
                            }
                        }),
                    };
                }
                status
            })
            .collect();
        ResourceStatus {
            name: res.cfg.name.clone(),
            node_id: res.me,
            role: role_of(st.role),
            app_in_flight: st.app_in_flight,
            nbd_clients: res.engine.clients(),
            volumes,
            peers,
            not_attached: None,
        }
    }

    /// The status of the `i`th resource left down at start.
    pub(super) fn not_attached_status(&self, i: usize) -> ResourceStatus {
        let n = &self.not_attached[i];
        ResourceStatus {
            name: n.name.clone(),
            node_id: n.node_id,
            role: Role::Secondary,
            app_in_flight: 0,
            nbd_clients: 0,
            volumes: Vec::new(),
            peers: Vec::new(),
            not_attached: Some(n.why.clone()),
        }
    }
}

fn peer_status(res: &ResCtx, slot: &PeerSlot, ps: Option<&EnginePeer>) -> PeerStatus {
    let connection = if ps.is_some_and(|p| p.connected) {
        Connection::Connected
    } else if slot.split_brain.is_some() {
        Connection::SplitBrain
    } else if !slot.wanted {
        Connection::StandAlone
    } else {
        Connection::Connecting
    };
    let volumes = ps
        .map(|p| {
            p.volumes
                .iter()
                .enumerate()
                .map(|(i, pv)| PeerVolumeStatus {
                    volume: res.cfg.volumes[i].number,
                    peer_disk: pv.disk.map_or(Disk::DUnknown, disk_of),
                    replication: replication_of(pv.repl),
                    out_of_sync_kib: pv.out_of_sync_bytes / 1024,
                    resync: None,
                })
                .collect()
        })
        .unwrap_or_default();
    PeerStatus {
        name: slot.name.clone(),
        node_id: slot.id,
        connection,
        role: ps
            .filter(|p| p.connected)
            .map_or(Role::Unknown, |p| role_of(p.role)),
        unacked: ps.map(|p| p.unacked).unwrap_or(0),
        last_error: slot.last_error.clone(),
        split_brain: slot.split_brain.clone(),
        split_brain_resolved: slot.split_brain_resolved.clone(),
        volumes,
    }
}
