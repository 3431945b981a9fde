//! What the control socket says, as types shared by the daemon (which parses requests and
//! answers) and the CLI (which sends requests and reads answers): one JSON object per
//! line each way, e.g. `{"cmd":"primary","resource":"r0","force":false}` and
//! `{"ok":true}` or `{"ok":false,"error":"..."}`; `status` answers with `resources`.

use serde::{Deserialize, Serialize};

/// An administration request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Every resource, or the one named.
    Status {
        #[serde(default)]
        resource: Option<String>,
    },
    Primary {
        resource: String,
        #[serde(default)]
        force: bool,
    },
    Secondary {
        resource: String,
        #[serde(default)]
        force: bool,
    },
    /// Connect to every peer, or the one named.
    Connect {
        resource: String,
        #[serde(default)]
        peer: Option<String>,
        /// The next split brain found with it (them) discards this node's changes
        /// (DRBD's `connect --discard-my-data`); refused on a Primary.
        #[serde(default)]
        discard_my_data: bool,
    },
    Disconnect {
        resource: String,
        #[serde(default)]
        peer: Option<String>,
    },
    Up {
        resource: String,
    },
    Down {
        resource: String,
    },
    /// The events stream (`crate::events`): every object as it exists, an end marker,
    /// then a line per change; with `now`, only the first two. With `statistics`, the
    /// lines carry the counters too (`EventLine::statistics`), and a change of those alone
    /// is a line.
    Events {
        #[serde(default)]
        now: bool,
        /// Left out when false, so a daemon older than it still answers.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        statistics: bool,
    },
    /// Read the resource files again and apply what changed (`crate::adjust`).
    Adjust,
    /// Throw this node's replica of volume `volume` (its number) away and resync it in
    /// full from a connected up-to-date peer.
    Invalidate {
        resource: String,
        #[serde(default)]
        volume: u16,
    },
}

impl Request {
    /// The resource a verb acts on (`None` for `status`).
    pub fn resource(&self) -> Option<&str> {
        match self {
            Request::Status { .. } | Request::Events { .. } | Request::Adjust => None,
            Request::Primary { resource, .. }
            | Request::Secondary { resource, .. }
            | Request::Connect { resource, .. }
            | Request::Disconnect { resource, .. }
            | Request::Up { resource }
            | Request::Down { resource }
            | Request::Invalidate { resource, .. } => Some(resource),
        }
    }

    /// The verb's name, as an operator typed it.
    pub fn verb(&self) -> &'static str {
        match self {
            Request::Status { .. } => "status",
            Request::Events { .. } => "events",
            Request::Adjust => "adjust",
            Request::Primary { .. } => "primary",
            Request::Secondary { .. } => "secondary",
            Request::Connect { .. } => "connect",
            Request::Disconnect { .. } => "disconnect",
            Request::Up { .. } => "up",
            Request::Down { .. } => "down",
            Request::Invalidate { .. } => "invalidate",
        }
    }
}

/// The daemon's answer to one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceStatus>>,
    /// With a status: the node's open files and its limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<OpenFiles>,
    /// What was done, for the operator (`adjust`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Refused for a moment only (a promotion while a peer that just connected has not
    /// yet said which Primary it follows, or listed what we lack): `tandem primary`
    /// asks again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub momentary: bool,
}

/// File descriptors the node holds, and the (soft) limit it runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenFiles {
    pub open: u64,
    pub limit: u64,
}

impl OpenFiles {
    /// Four fifths of the limit or more in use: a few more resources or connections and
    /// some will fail with `Too many open files`.
    pub fn near_limit(&self) -> bool {
        self.open.saturating_mul(5) >= self.limit.saturating_mul(4)
    }
}

impl Answer {
    pub fn done() -> Answer {
        Answer {
            ok: true,
            error: None,
            resources: None,
            files: None,
            message: None,
            momentary: false,
        }
    }

    /// Done, with what was done in the operator's words.
    pub fn said(message: impl Into<String>) -> Answer {
        Answer {
            message: Some(message.into()),
            ..Answer::done()
        }
    }

    pub fn refused(why: impl Into<String>) -> Answer {
        Answer {
            ok: false,
            error: Some(why.into()),
            resources: None,
            files: None,
            message: None,
            momentary: false,
        }
    }

    pub fn status(resources: Vec<ResourceStatus>, files: Option<OpenFiles>) -> Answer {
        Answer {
            ok: true,
            error: None,
            resources: Some(resources),
            files,
            message: None,
            momentary: false,
        }
    }
}

/// One resource in `tandem status --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResourceStatus {
    pub name: String,
    pub node_id: u8,
    /// `Primary` or `Secondary`.
    pub role: Role,
    pub app_in_flight: usize,
    pub nbd_clients: usize,
    pub volumes: Vec<VolumeStatus>,
    pub peers: Vec<PeerStatus>,
    /// The resource is down on this node: a replica of it could not be attached at start
    /// (why, with the file and the way out). It then has no volumes or peers here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_attached: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub volume: u16,
    /// Our replica's disk state (never `DUnknown`).
    pub disk: Disk,
    pub size: u64,
    pub writes_in_flight: usize,
    pub resync_remaining_kib: Option<u64>,
    /// While this replica is a sync target.
    #[serde(default)]
    pub resync: Option<ResyncProgress>,
    pub up_to_date_within_reach: bool,
    /// With quorum on (see the configuration's `quorum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<QuorumStatus>,
}

/// A volume's quorum as this node counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumStatus {
    pub quorate: bool,
    /// Nodes keeping a replica of the volume, how many this node reaches (itself
    /// included), how many it needs, and how many of those reached are up to date.
    pub voters: u8,
    pub reached: u8,
    pub needed: u8,
    pub up_to_date: u8,
    /// Nodes that stopped cleanly, dropped from `voters` (last man standing).
    #[serde(default)]
    pub departed: u8,
}

/// A resync as `tandem status` shows it, on the target (its volume line and the source's
/// peer line) and on the source (the target's peer line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// The other end: the source on a target, the target on a source (`None`: a target
    /// waiting for a source). On the line of a peer that syncs from a third node (as it
    /// told us: a diskless Primary sees its replicas' resyncs), that source.
    pub peer: Option<String>,
    pub done_kib: u64,
    pub left_kib: u64,
    /// Of what this resync had to copy (done + left), 0.0..=100.0.
    pub percent: f64,
    /// Over the last ~10 s; `None` in its first half second.
    pub rate_kib_s: Option<u64>,
    /// Time left at that rate.
    pub eta_s: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub node_id: u8,
    pub connection: Connection,
    /// `Primary`, `Secondary`, or `Unknown` while not connected.
    pub role: Role,
    pub unacked: usize,
    pub last_error: Option<String>,
    pub split_brain: Option<String>,
    /// The last split brain with it that a policy (or `--discard-my-data`) resolved.
    #[serde(default)]
    pub split_brain_resolved: Option<String>,
    pub volumes: Vec<PeerVolumeStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerVolumeStatus {
    pub volume: u16,
    /// The peer's disk state, or `DUnknown`.
    pub peer_disk: Disk,
    pub replication: Replication,
    pub out_of_sync_kib: u64,
    /// While we sync it or it syncs us.
    #[serde(default)]
    pub resync: Option<ResyncProgress>,
}

/// The words of `tandem status`, DRBD's; each is written as its name (`"UpToDate"`).
macro_rules! status_words {
    ($(#[$doc:meta])* $name:ident { $($word:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $name {
            $($word),+
        }

        impl $name {
            /// The word as written (`"UpToDate"`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$word => stringify!($word)),+
                }
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_words!(
    /// A node's role; `Unknown` for a peer that is not connected.
    Role { Primary, Secondary, Unknown }
);
status_words!(
    /// A replica's disk state; `DUnknown` for a peer's that we have not heard.
    Disk { Diskless, Inconsistent, Outdated, UpToDate, DUnknown }
);
status_words!(
    /// Our link to a peer.
    Connection { Connected, Connecting, StandAlone, SplitBrain }
);
status_words!(
    /// What a volume's replication with a peer is doing.
    Replication { Off, Established, SyncSource, SyncTarget }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_as_the_cli_writes_them() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"secondary","resource":"r0","force":true}"#).unwrap();
        assert_eq!(
            r,
            Request::Secondary {
                resource: "r0".into(),
                force: true
            }
        );
        let back: Request = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let s: Request = serde_json::from_str(r#"{"cmd":"status","resource":null}"#).unwrap();
        assert_eq!(s, Request::Status { resource: None });
        let events = |statistics| Request::Events {
            now: false,
            statistics,
        };
        let plain = serde_json::to_string(&events(false)).unwrap();
        assert_eq!(plain, r#"{"cmd":"events","now":false}"#);
        let with = serde_json::to_string(&events(true)).unwrap();
        assert_eq!(
            serde_json::from_str::<Request>(&with).unwrap(),
            events(true)
        );
    }

    #[test]
    fn status_words_are_written_as_their_names() {
        let pv = PeerVolumeStatus {
            volume: 0,
            peer_disk: Disk::DUnknown,
            replication: Replication::SyncTarget,
            out_of_sync_kib: 4,
            resync: None,
        };
        assert_eq!(
            serde_json::to_string(&pv).unwrap(),
            r#"{"volume":0,"peer_disk":"DUnknown","replication":"SyncTarget","out_of_sync_kib":4,"resync":null}"#
        );
        assert_eq!(Connection::StandAlone.to_string(), "StandAlone");
        let role: Role = serde_json::from_str(r#""Unknown""#).unwrap();
        assert_eq!(role, Role::Unknown);
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        for bad in [
            r#"{"cmd":"explode","resource":"r0"}"#,
            r#"{"cmd":"primary"}"#,
            r#"{"cmd":"primary","resource":"r0","forse":true}"#,
            r#"{"resource":"r0"}"#,
            r#"not json"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}
