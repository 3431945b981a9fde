//! The control socket's verbs carried out: a typed [`Request`] in, an [`Answer`] out (the
//! JSON shapes are in `crate::control_api`, shared with the CLI).

use super::state::{Ctx, Entry, NodeReactor, PeerSlot, ResCtx};
use crate::control_api::{
    Answer, PeerStatus, PeerVolumeStatus, Request, ResourceStatus, VolumeStatus,
};
use tandem_engine::replica::{DiskState, PeerStatus as EnginePeer, Repl, Role};
use tracing::info;

fn disk_name(d: DiskState) -> &'static str {
    match d {
        DiskState::Diskless => "Diskless",
        DiskState::Inconsistent => "Inconsistent",
        DiskState::Outdated => "Outdated",
        DiskState::UpToDate => "UpToDate",
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Primary => "Primary",
        Role::Secondary => "Secondary",
    }
}

fn repl_name(r: Repl) -> &'static str {
    match r {
        Repl::Off => "Off",
        Repl::Established => "Established",
        Repl::SyncSource => "SyncSource",
        Repl::SyncTarget => "SyncTarget",
    }
}

impl NodeReactor {
    pub(super) fn control_command(&mut self, line: &str) -> Answer {
        let req: Request = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => return Answer::refused(format!("not a valid request: {e}")),
        };
        let Some(name) = req.resource().map(str::to_string) else {
            let Request::Status { resource } = &req else {
                unreachable!("only status names no resource")
            };
            return Answer::status(self.status(resource.as_deref()));
        };
        let Some(r) = self.res.iter().position(|x| x.cfg.name == name) else {
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
        let result = match req {
            Request::Status { .. } => unreachable!("answered above"),
            Request::Primary { force, .. } => {
                let res = &mut self.res[r];
                res.engine
                    .promote(force, &mut actions)
                    .map_err(|e| res.explain(e))
            }
            Request::Secondary { force, .. } => self.secondary(r, force, &mut actions),
            Request::Connect { .. } | Request::Up { .. } => {
                for s in self.res[r]
                    .peers
                    .iter_mut()
                    .filter(|s| peer_name.as_ref().is_none_or(|p| *p == s.name))
                {
                    s.wanted = true;
                    s.split_brain = None;
                    s.link.dial_now(std::time::Instant::now());
                }
                Ok(())
            }
            Request::Disconnect { .. } | Request::Down { .. } => {
                let keys: Vec<usize> = self.res[r]
                    .peers
                    .iter_mut()
                    .filter(|s| peer_name.as_ref().is_none_or(|p| *p == s.name))
                    .filter_map(|s| {
                        s.wanted = false;
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
        match result {
            Ok(()) => {
                info!(resource = %name, "administrator: {} done", req.verb());
                Answer::done()
            }
            Err(e) => Answer::refused(e),
        }
    }

    fn status(&self, only: Option<&str>) -> Vec<ResourceStatus> {
        self.res
            .iter()
            .filter(|r| only.is_none_or(|n| n == r.cfg.name))
            .map(|res| {
                let st = res.engine.status();
                let volumes = st
                    .volumes
                    .iter()
                    .enumerate()
                    .map(|(i, v)| VolumeStatus {
                        volume: res.cfg.volumes[i].number,
                        disk: disk_name(v.disk).into(),
                        size: v.size,
                        writes_in_flight: v.writes_in_flight,
                        resync_remaining_kib: v.resync_remaining.map(|b| b / 1024),
                        up_to_date_within_reach: v.up_to_date_within_reach,
                    })
                    .collect();
                let peers = res
                    .peers
                    .iter()
                    .map(|slot| peer_status(res, slot, st.peers.iter().find(|p| p.id == slot.id)))
                    .collect();
                ResourceStatus {
                    name: res.cfg.name.clone(),
                    node_id: res.me,
                    role: role_name(st.role).into(),
                    app_in_flight: st.app_in_flight,
                    nbd_clients: res.engine.clients(),
                    volumes,
                    peers,
                }
            })
            .collect()
    }
}

fn peer_status(res: &ResCtx, slot: &PeerSlot, ps: Option<&EnginePeer>) -> PeerStatus {
    let connection = if ps.is_some_and(|p| p.connected) {
        "Connected"
    } else if slot.split_brain.is_some() {
        "SplitBrain"
    } else if !slot.wanted {
        "StandAlone"
    } else {
        "Connecting"
    };
    let volumes = ps
        .map(|p| {
            p.volumes
                .iter()
                .enumerate()
                .map(|(i, pv)| PeerVolumeStatus {
                    volume: res.cfg.volumes[i].number,
                    peer_disk: pv.disk.map(disk_name).unwrap_or("DUnknown").into(),
                    replication: repl_name(pv.repl).into(),
                    out_of_sync_kib: pv.out_of_sync_bytes / 1024,
                })
                .collect()
        })
        .unwrap_or_default();
    PeerStatus {
        name: slot.name.clone(),
        node_id: slot.id,
        connection: connection.into(),
        role: ps
            .filter(|p| p.connected)
            .map(|p| role_name(p.role))
            .unwrap_or("Unknown")
            .into(),
        unacked: ps.map(|p| p.unacked).unwrap_or(0),
        last_error: slot.last_error.clone(),
        split_brain: slot.split_brain.clone(),
        volumes,
    }
}
