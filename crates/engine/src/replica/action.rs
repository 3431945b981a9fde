//! What the engine asks its driver to do ([`RAction`]) and why a promotion is refused.

use super::event::{Event, LinkLoss};
use super::msg::{DataRef, Msg, Token};
use super::spec::NodeId;
use crate::io::{DiskKind, IoError, ReqId};

/// Why this node cannot become Primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromoteError {
    /// Another node (this id) is Primary.
    PeerPrimary(NodeId),
    /// This volume has no UpToDate replica here or on a connected peer.
    NoUpToDate(u16),
    /// This volume has no quorum here (see `quorum.rs`).
    NoQuorum(u16),
    /// `via`, a connected peer, follows `primary`, a Primary this node does not reach
    /// (see `primaries.rs`).
    PrimaryBeyond { primary: NodeId, via: NodeId },
    /// `peer` just connected and has not yet said which Primary it follows (a moment).
    PeerUnheard(NodeId),
    /// `peer` just connected and has not yet listed what our replica of `volume` lacks
    /// (a moment; see `Replicas::awaiting_list`).
    PeerListing { volume: u16, peer: NodeId },
}

impl PromoteError {
    /// Refused for a moment only: a peer just connected and has not yet said which
    /// Primary it follows, or listed what we lack. The same request soon succeeds.
    pub fn is_momentary(&self) -> bool {
        matches!(
            self,
            PromoteError::PeerUnheard(_) | PromoteError::PeerListing { .. }
        )
    }
}

impl std::fmt::Display for PromoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromoteError::PeerPrimary(id) => write!(f, "node {id} is Primary"),
            PromoteError::NoUpToDate(v) => {
                write!(f, "volume {v} has no up-to-date replica within reach")
            }
            PromoteError::NoQuorum(v) => write!(f, "volume {v} has no quorum here"),
            PromoteError::PrimaryBeyond { primary, via } => {
                write!(f, "node {primary} is Primary (node {via} follows it)")
            }
            PromoteError::PeerUnheard(peer) => write!(
                f,
                "node {peer} just connected and has not yet said which Primary it follows; try again"
            ),
            PromoteError::PeerListing { volume, peer } => write!(
                f,
                "node {peer} has not yet listed what volume {volume} lacks here; try again"
            ),
        }
    }
}

impl std::error::Error for PromoteError {}

/// Why this node's replica cannot be thrown away and resynced now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidateError {
    /// The node keeps no replica of this volume.
    NoReplica(u16),
    /// No connected peer keeps an up-to-date replica of this volume to resync from.
    NoSource(u16),
}

impl std::fmt::Display for InvalidateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidateError::NoReplica(v) => write!(f, "this node keeps no replica of volume {v}"),
            InvalidateError::NoSource(v) => write!(
                f,
                "no connected peer has an up-to-date replica of volume {v} to resync from"
            ),
        }
    }
}

impl std::error::Error for InvalidateError {}

/// What an attaching application client did to this node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoPromote {
    /// Already Primary, or another node is: nothing to do.
    Unchanged,
    Promoted,
    Refused(PromoteError),
}

/// Why this node cannot become Secondary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoteError {
    /// Application requests are in flight (this many).
    RequestsInFlight(usize),
    /// Our ids of `volume` are changing and `peer` has not yet said whether it adopted
    /// the new ones (a moment; see `Rotations::unanswered`).
    IdsChanging { volume: u16, peer: NodeId },
}

impl DemoteError {
    /// Refused for a moment only: the same request soon succeeds.
    pub fn is_momentary(&self) -> bool {
        matches!(self, DemoteError::IdsChanging { .. })
    }
}

impl std::fmt::Display for DemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DemoteError::RequestsInFlight(n) => write!(f, "{n} application requests in flight"),
            DemoteError::IdsChanging { volume, peer } => write!(
                f,
                "the generation ids of volume {volume} are changing and node {peer} has not yet answered; try again"
            ),
        }
    }
}

impl std::error::Error for DemoteError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RAction {
    /// Run a disk operation on a volume's local replica; writes take their bytes from `data`.
    Disk {
        volume: u16,
        token: Token,
        kind: DiskKind,
        data: Option<DataRef>,
    },
    /// Answer the application; a successful read's bytes are at `data`.
    Complete {
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
    },
    /// Queue a packet to a peer (dropped by the driver if the peer is not connected).
    Send { peer: NodeId, msg: Msg },
    /// Copy the bytes at `from` and keep them under `key` until an action uses `Held{key}`.
    Retain { from: DataRef, key: Token },
    /// Drop the bytes kept under `key`: the write that was to use them will not be issued
    /// (it waited behind an overlapping one when its replica detached).
    Forget { key: Token },
    /// The writes `peer` sent us on connection `conn` with sequence numbers up to `upto` are
    /// settled (see `settle.rs`): once written here they may leave the activity log (before,
    /// a crash of every node must find them there).
    Settled { peer: NodeId, conn: u32, upto: u64 },
    /// Our application write `req` to `volume`, answered already, is settled: on every
    /// replica it went to, or known to be missing there. Its extents may leave the
    /// activity log (DRBD's transfer log: before, a crash of this node must find them
    /// there, since a peer may hold the write while we do not, or lack it while we do).
    /// `req` may name a newer request by now: this is the oldest answered write of that
    /// id and volume not yet settled (they settle in the order they were answered).
    WriteSettled { req: ReqId, volume: u16 },
    /// Drop the connection to this peer.
    Disconnect { peer: NodeId, reason: LinkLoss },
    /// Our replica of `volume` and the peer's diverged: both were written by a Primary
    /// while the two were apart (two Primaries), so each has writes the other lacks —
    /// `mine` blocks (4 KiB) the peer lacks, `theirs` we lack. No resync direction is
    /// right: drop the connection and do not reconnect until an administrator decides
    /// which replica's writes to discard. `reported`: the peer found it and told us.
    SplitBrain {
        peer: NodeId,
        volume: u16,
        mine: u64,
        theirs: u64,
        reported: bool,
        /// Why no policy resolved it.
        why: super::split_brain::Unresolved,
    },
    /// Something happened that the world may want to know (see [`Event::is_detail`]).
    Event(Event),
}
