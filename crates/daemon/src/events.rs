//! `tandem events`, in the spirit of `drbdsetup events2`: one line per object (resource,
//! device, connection, peer device) as it `exists` when the watcher connects, an end
//! marker, then a `change` line whenever one of its states changes (`create` and `destroy`
//! for objects that come and go). The lines are made from `tandem status`'s own answer, so
//! the two never disagree: the daemon diffs each touched resource's lines against what it
//! last sent (`diff`). With `--statistics` the lines also carry the counters status has
//! (`statistics`), and a change of counters alone is a `change` line too
//! (`statistics_diff`, at most one a second per resource). Pure: no sockets here.

use crate::control_api::{ResourceStatus, ResyncProgress};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Exists,
    Create,
    Change,
    Destroy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventObject {
    Resource,
    Device,
    Connection,
    PeerDevice,
}

/// One line of the stream. `object: None` is the end of the initial `exists` dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<EventObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_node_id: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The object's states, in a fixed order (`role`, `disk`, `connection`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<(String, String)>,
    /// Its counters, after the states, for watchers that asked for them (events2's
    /// `--statistics` names, in its units): a device's `size` (KiB) and `upper-pending`
    /// (application writes in flight); a connection's `pending` (writes sent to the peer
    /// and not acknowledged, all volumes); a peer device's `out-of-sync` (KiB) and,
    /// while it resyncs, `done` (percent), `dbdt1` (MiB/s) and `eta` (seconds) as far
    /// as they are known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statistics: Vec<(String, String)>,
}

/// What the watchers were last sent about one resource.
#[derive(Clone, Debug, Default)]
pub struct Sent {
    pub lines: Vec<EventLine>,
    /// When a change of counters alone was last sent (the daemon's clock, ms).
    pub statistics_ms: u64,
}

impl EventLine {
    /// The end of the initial dump (events2's `exists -`).
    pub fn end_of_dump() -> EventLine {
        EventLine {
            kind: EventKind::Exists,
            object: None,
            resource: None,
            volume: None,
            peer_node_id: None,
            peer: None,
            states: Vec::new(),
            statistics: Vec::new(),
        }
    }

    /// The line for a watcher that did not ask for the counters.
    pub fn without_statistics(&self) -> EventLine {
        EventLine {
            statistics: Vec::new(),
            ..self.clone()
        }
    }

    /// Which object it is about: lines with the same key describe the same object.
    fn key(&self) -> (Option<EventObject>, Option<u16>, Option<u8>) {
        (self.object, self.volume, self.peer_node_id)
    }

    /// As an operator reads it: `change connection name:r0 peer-node-id:1 conn-name:beta
    /// connection:Connecting role:Unknown`.
    pub fn text(&self) -> String {
        let kind = match self.kind {
            EventKind::Exists => "exists",
            EventKind::Create => "create",
            EventKind::Change => "change",
            EventKind::Destroy => "destroy",
        };
        let Some(object) = self.object else {
            return format!("{kind} -");
        };
        let object = match object {
            EventObject::Resource => "resource",
            EventObject::Device => "device",
            EventObject::Connection => "connection",
            EventObject::PeerDevice => "peer-device",
        };
        let mut s = format!("{kind} {object}");
        if let Some(r) = &self.resource {
            s += &format!(" name:{r}");
        }
        if let Some(id) = self.peer_node_id {
            s += &format!(" peer-node-id:{id}");
        }
        if let Some(p) = &self.peer {
            s += &format!(" conn-name:{p}");
        }
        if let Some(v) = self.volume {
            s += &format!(" volume:{v}");
        }
        for (k, v) in self.states.iter().chain(&self.statistics) {
            s += &format!(" {k}:{v}");
        }
        s
    }
}

fn pairs(v: Vec<(&str, String)>) -> Vec<(String, String)> {
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn line(r: &ResourceStatus, object: EventObject, states: Vec<(&str, String)>) -> EventLine {
    EventLine {
        kind: EventKind::Exists,
        object: Some(object),
        resource: Some(r.name.clone()),
        volume: None,
        peer_node_id: None,
        peer: None,
        states: pairs(states),
        statistics: Vec::new(),
    }
}

/// A resync's progress as events2 prints it: `done` (percent, two decimals), `dbdt1`
/// (MiB/s over the last seconds) and `eta` (seconds), the last two once measured.
fn resync_statistics(p: &ResyncProgress) -> Vec<(&'static str, String)> {
    let mut out = vec![("done", format!("{:.2}", p.percent))];
    if let Some(r) = p.rate_kib_s {
        out.push(("dbdt1", format!("{:.2}", r as f64 / 1024.0)));
    }
    if let Some(e) = p.eta_s {
        out.push(("eta", e.to_string()));
    }
    out
}

/// A resource's objects and their states, as `exists` lines.
pub fn lines(r: &ResourceStatus) -> Vec<EventLine> {
    let mut out = Vec::new();
    let attached = match &r.not_attached {
        Some(_) => "no",
        None => "yes",
    };
    out.push(line(
        r,
        EventObject::Resource,
        vec![("role", r.role.to_string()), ("attached", attached.into())],
    ));
    for v in &r.volumes {
        let mut states = vec![("disk", v.disk.to_string())];
        if let Some(q) = &v.quorum {
            let quorate = if q.quorate { "yes" } else { "no" };
            states.push(("quorum", quorate.into()));
        }
        let mut l = line(r, EventObject::Device, states);
        l.volume = Some(v.volume);
        l.statistics = pairs(vec![
            ("size", (v.size / 1024).to_string()),
            ("upper-pending", v.writes_in_flight.to_string()),
        ]);
        out.push(l);
    }
    for p in &r.peers {
        let mut l = line(
            r,
            EventObject::Connection,
            vec![
                ("connection", p.connection.to_string()),
                ("role", p.role.to_string()),
            ],
        );
        l.peer_node_id = Some(p.node_id);
        l.peer = Some(p.name.clone());
        l.statistics = pairs(vec![("pending", p.unacked.to_string())]);
        out.push(l.clone());
        for pv in &p.volumes {
            let mut d = line(
                r,
                EventObject::PeerDevice,
                vec![
                    ("replication", pv.replication.to_string()),
                    ("peer-disk", pv.peer_disk.to_string()),
                ],
            );
            d.peer_node_id = l.peer_node_id;
            d.peer = l.peer.clone();
            d.volume = Some(pv.volume);
            let mut statistics = vec![("out-of-sync", pv.out_of_sync_kib.to_string())];
            statistics.extend(
                pv.resync
                    .as_ref()
                    .map(resync_statistics)
                    .unwrap_or_default(),
            );
            d.statistics = pairs(statistics);
            out.push(d);
        }
    }
    out
}

/// What changed from `before` to `after` (one resource's lines): `change` for an object
/// whose states differ, `create` for a new one, `destroy` for one gone (a peer's devices
/// while it is not connected).
pub fn diff(before: &[EventLine], after: &[EventLine]) -> Vec<EventLine> {
    let mut out = Vec::new();
    for a in after {
        match before.iter().find(|b| b.key() == a.key()) {
            Some(b) if b.states == a.states => {}
            Some(_) => out.push(EventLine {
                kind: EventKind::Change,
                ..a.clone()
            }),
            None => out.push(EventLine {
                kind: EventKind::Create,
                ..a.clone()
            }),
        }
    }
    for b in before {
        if !after.iter().any(|a| a.key() == b.key()) {
            out.push(EventLine {
                kind: EventKind::Destroy,
                states: Vec::new(),
                statistics: Vec::new(),
                ..b.clone()
            });
        }
    }
    out
}

/// The objects whose counters alone changed from `before` to `after` (their states did
/// not: those are `diff`'s), as `change` lines if `send`; if not, `after` takes back the
/// counters sent before, so the change is still found when it is sent.
pub fn statistics_diff(
    before: &[EventLine],
    after: &mut [EventLine],
    send: bool,
) -> Vec<EventLine> {
    let mut out = Vec::new();
    for a in after.iter_mut() {
        let Some(b) = before.iter().find(|b| b.key() == a.key()) else {
            continue;
        };
        if b.states != a.states || b.statistics == a.statistics {
            continue;
        }
        if send {
            out.push(EventLine {
                kind: EventKind::Change,
                ..a.clone()
            });
        } else {
            a.statistics = b.statistics.clone();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(state: &str) -> EventLine {
        EventLine {
            kind: EventKind::Exists,
            object: Some(EventObject::Connection),
            resource: Some("r0".into()),
            volume: None,
            peer_node_id: Some(1),
            peer: Some("beta".into()),
            states: vec![("connection".into(), state.into())],
            statistics: Vec::new(),
        }
    }

    #[test]
    fn a_changed_state_is_one_change_line_and_an_unchanged_one_none() {
        let before = vec![conn("Connected")];
        assert!(diff(&before, &before).is_empty());
        let after = vec![conn("Connecting")];
        let d = diff(&before, &after);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].text(),
            "change connection name:r0 peer-node-id:1 conn-name:beta connection:Connecting"
        );
    }

    #[test]
    fn objects_that_come_and_go_are_created_and_destroyed() {
        let mut dev = conn("Connected");
        dev.object = Some(EventObject::PeerDevice);
        dev.volume = Some(0);
        dev.states = vec![("replication".into(), "Established".into())];
        let d = diff(&[conn("Connected")], &[conn("Connected"), dev.clone()]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, EventKind::Create);
        let d = diff(&[conn("Connected"), dev], &[conn("Connecting")]);
        let kinds: Vec<_> = d.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, vec![EventKind::Change, EventKind::Destroy]);
        assert_eq!(
            d[1].text(),
            "destroy peer-device name:r0 peer-node-id:1 conn-name:beta volume:0"
        );
        assert_eq!(EventLine::end_of_dump().text(), "exists -");
    }

    #[test]
    fn a_resync_reads_as_events2_prints_it() {
        let mut p = ResyncProgress {
            peer: Some("beta".into()),
            done_kib: 3,
            left_kib: 5,
            percent: 37.5,
            rate_kib_s: None,
            eta_s: None,
        };
        assert_eq!(resync_statistics(&p), [("done", "37.50".to_string())]);
        (p.rate_kib_s, p.eta_s) = (Some(3 * 512), Some(17));
        let pairs: Vec<_> = resync_statistics(&p)
            .into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        assert_eq!(pairs, ["done:37.50", "dbdt1:1.50", "eta:17"]);
    }

    fn pending(state: &str, n: u32) -> EventLine {
        EventLine {
            statistics: vec![("pending".into(), n.to_string())],
            ..conn(state)
        }
    }

    #[test]
    fn counters_follow_the_states_and_change_alone_only_when_sent() {
        assert_eq!(
            pending("Connected", 3).text(),
            "exists connection name:r0 peer-node-id:1 conn-name:beta connection:Connected pending:3"
        );
        assert_eq!(
            pending("Connected", 3).without_statistics().text(),
            conn("Connected").text()
        );
        // A state change is `diff`'s (with the counters of the moment), not also a
        // change of counters.
        let before = vec![pending("Connected", 3)];
        let mut after = vec![pending("Connecting", 0)];
        assert_eq!(diff(&before, &after)[0].statistics, after[0].statistics);
        assert!(statistics_diff(&before, &mut after, true).is_empty());
        // Counters alone: no `diff` line; a line when sent, else the old ones kept.
        let mut after = vec![pending("Connected", 5)];
        assert!(diff(&before, &after).is_empty());
        assert!(statistics_diff(&before, &mut after, false).is_empty());
        assert_eq!(after, before);
        let mut after = vec![pending("Connected", 5)];
        let d = statistics_diff(&before, &mut after, true);
        assert_eq!(
            d.iter().map(EventLine::text).collect::<Vec<_>>(),
            ["change connection name:r0 peer-node-id:1 conn-name:beta connection:Connected pending:5"]
        );
    }
}
