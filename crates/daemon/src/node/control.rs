//! The control socket: one JSON object per line in, one per line out.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"primary","resource":"r0","force":false}`,
//! `{"cmd":"secondary","resource":"r0"}`, `{"cmd":"connect"|"disconnect","resource":"r0",
//! "peer":"beta"}` (peer optional: all), `{"cmd":"up"|"down","resource":"r0"}`.
//! Answers: `{"ok":true,...}` or `{"ok":false,"error":"..."}`.

use super::state::{Ctx, Entry, NodeReactor};
use serde_json::{json, Value};
use tandem_engine::replica::{DiskState, Repl, Role};
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
    pub(super) fn control_command(&mut self, line: &str) -> Value {
        let req: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return json!({"ok": false, "error": format!("not a JSON request: {e}")}),
        };
        let cmd = req.get("cmd").and_then(Value::as_str).unwrap_or("");
        if cmd == "status" {
            return json!({"ok": true, "resources": self.status_json(req.get("resource").and_then(Value::as_str))});
        }
        let Some(name) = req.get("resource").and_then(Value::as_str) else {
            return json!({"ok": false, "error": format!("{cmd:?} needs a resource")});
        };
        let Some(r) = self.res.iter().position(|x| x.cfg.name == name) else {
            return json!({"ok": false, "error": format!("no resource {name:?} on this node")});
        };
        let peer_name = req.get("peer").and_then(Value::as_str);
        if let Some(p) = peer_name {
            if !self.res[r].peers.iter().any(|s| s.name == p) {
                return json!({"ok": false, "error": format!("resource {name} has no peer {p:?}")});
            }
        }
        let mut actions = Vec::new();
        let result = match cmd {
            "primary" => {
                let force = req.get("force").and_then(Value::as_bool).unwrap_or(false);
                let res = &mut self.res[r];
                res.engine
                    .promote(force, &mut actions)
                    .map_err(|e| res.explain(e))
            }
            "secondary" => {
                let force = req.get("force").and_then(Value::as_bool).unwrap_or(false);
                self.secondary(r, force, &mut actions)
            }
            "connect" | "up" => {
                for s in self.res[r]
                    .peers
                    .iter_mut()
                    .filter(|s| peer_name.is_none_or(|p| p == s.name))
                {
                    s.wanted = true;
                    s.split_brain = None;
                    s.link.dial_now(std::time::Instant::now());
                }
                Ok(())
            }
            "disconnect" | "down" => {
                let keys: Vec<usize> = self.res[r]
                    .peers
                    .iter_mut()
                    .filter(|s| peer_name.is_none_or(|p| p == s.name))
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
            other => Err(format!("unknown command {other:?}")),
        };
        self.run_actions(r, actions, Ctx::default());
        match result {
            Ok(()) => {
                info!(resource = %name, "administrator: {cmd} done");
                json!({"ok": true})
            }
            Err(e) => json!({"ok": false, "error": e}),
        }
    }

    fn status_json(&self, only: Option<&str>) -> Value {
        let mut out = Vec::new();
        for res in self
            .res
            .iter()
            .filter(|r| only.is_none_or(|n| n == r.cfg.name))
        {
            let st = res.engine.status();
            let volumes: Vec<Value> = st
                .volumes
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    json!({
                        "volume": res.cfg.volumes[i].number,
                        "disk": disk_name(v.disk),
                        "size": v.size,
                        "writes_in_flight": v.writes_in_flight,
                        "resync_remaining_kib": v.resync_remaining.map(|b| b / 1024),
                        "up_to_date_within_reach": v.up_to_date_within_reach,
                    })
                })
                .collect();
            let peers: Vec<Value> = res
                .peers
                .iter()
                .map(|slot| {
                    let ps = st.peers.iter().find(|p| p.id == slot.id);
                    let connection = if ps.is_some_and(|p| p.connected) {
                        "Connected"
                    } else if slot.split_brain.is_some() {
                        "SplitBrain"
                    } else if !slot.wanted {
                        "StandAlone"
                    } else {
                        "Connecting"
                    };
                    let vols: Vec<Value> = ps
                        .map(|p| {
                            p.volumes
                                .iter()
                                .enumerate()
                                .map(|(i, pv)| {
                                    json!({
                                        "volume": res.cfg.volumes[i].number,
                                        "peer_disk": pv.disk.map(disk_name).unwrap_or("DUnknown"),
                                        "replication": repl_name(pv.repl),
                                        "out_of_sync_kib": pv.out_of_sync_bytes / 1024,
                                    })
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    json!({
                        "name": slot.name,
                        "node_id": slot.id,
                        "connection": connection,
                        "role": ps.filter(|p| p.connected).map(|p| role_name(p.role)).unwrap_or("Unknown"),
                        "unacked": ps.map(|p| p.unacked).unwrap_or(0),
                        "last_error": slot.last_error,
                        "split_brain": slot.split_brain,
                        "volumes": vols,
                    })
                })
                .collect();
            out.push(json!({
                "name": res.cfg.name,
                "node_id": res.me,
                "role": role_name(st.role),
                "app_in_flight": st.app_in_flight,
                "nbd_clients": res.engine.clients(),
                "volumes": volumes,
                "peers": peers,
            }));
        }
        Value::Array(out)
    }
}
