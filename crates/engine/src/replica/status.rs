//! What a resource reports about itself and its peers (`tandem status`).

use super::spec::NodeId;
use tandem_wire::packet::{DiskState, Role};

/// Replication state towards one peer, per volume (DRBD's vocabulary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repl {
    Off,
    Established,
    SyncSource,
    SyncTarget,
}

/// Per-peer figures for status output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    pub id: NodeId,
    pub connected: bool,
    pub role: Role,
    pub volumes: Vec<PeerVolumeStatus>,
    pub unacked: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerVolumeStatus {
    pub disk: Option<DiskState>,
    pub repl: Repl,
    pub out_of_sync_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStatus {
    pub disk: DiskState,
    pub size: u64,
    pub writes_in_flight: usize,
    /// Bytes still to pull while we are a sync target.
    pub resync_remaining: Option<u64>,
    /// Bytes pulled so far by that resync, and the peer it pulls from now.
    pub resync_pulled: Option<u64>,
    pub resync_source: Option<NodeId>,
    /// This replica or a connected peer's is UpToDate. When not, reads fail, writes fail
    /// (no up-to-date replica vouches for them) and a resync waits for one to return.
    pub up_to_date_within_reach: bool,
    /// With quorum on: whether the volume has it, and the count (see `quorum.rs`).
    pub quorum: Option<VolumeQuorum>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeQuorum {
    pub quorate: bool,
    pub count: super::quorum::QuorumCount,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub role: Role,
    pub volumes: Vec<VolumeStatus>,
    pub peers: Vec<PeerStatus>,
    pub app_in_flight: usize,
}
