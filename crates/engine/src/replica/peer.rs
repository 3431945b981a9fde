//! One peer as the engine sees it: its connection's state, and per volume what it has,
//! what it lacks (out-of-sync blocks) and where our list of that stands.

use super::bitmap::Bitmap;
use super::spec::NodeId;
use super::status::Repl;
use crate::io::ReqId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tandem_wire::packet::{DiskState, Role};

/// Where our list of what a peer lacks stands, on the current connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListState {
    NotSent,
    /// Waiting for in-flight writes that missed the peer to mark their bits.
    Deferred,
    /// Sent and complete.
    Sent,
    /// Sent, but bits were added after it: they are not cleared when the peer reports
    /// UpToDate, and are listed again on the next connection.
    Stale,
}

#[derive(Debug)]
pub(super) struct PeerVol {
    pub(super) diskful: bool,
    /// Our list of what the peer lacks, on this connection.
    pub(super) list: ListState,
    /// The peer ended its list of what we lack, on this connection.
    pub(super) listed: bool,
    /// Ranges it wrote here (as Primary) on this connection before its list ended: newer
    /// than any resync data, even where its list then says a block is out of sync (see
    /// [`Resource::mark_behind`]).
    pub(super) written_before_list: Vec<(u64, u64)>,
    pub(super) disk: Option<DiskState>,
    /// It said its replica was created empty at start and has received nothing since.
    pub(super) created: bool,
    /// It said its replica was found at its start and has not been UpToDate since.
    pub(super) unproven: bool,
    pub(super) oos: Bitmap,
    pub(super) repl: Repl,
    /// Blocks we wrote as Primary that it missed (it was away, or its link dropped), kept
    /// until its next list shows whether it was Primary apart from us too (allocated only
    /// then: the common case is none).
    pub(super) apart: Option<Bitmap>,
    /// It said it wrote as Primary while apart from us ([`volume_flags::WROTE_APART`]).
    pub(super) peer_wrote_apart: bool,
    /// Blocks its list says we lack while we hold writes it lacks and one of us wrote as
    /// Primary apart from the other: counted, not pulled, until its list ends (then it is
    /// a split brain).
    pub(super) claimed: u64,
}

impl PeerVol {
    pub(super) fn wrote_apart(&self) -> bool {
        self.apart.as_ref().is_some_and(|b| b.count() > 0)
    }

    /// Its replica must be listed in full: it restarted without proof of being current
    /// (Outdated), or it was created empty at its start.
    pub(super) fn needs_everything(&self) -> bool {
        self.disk == Some(DiskState::Outdated)
            || ((self.created || self.unproven) && self.disk == Some(DiskState::Inconsistent))
    }
}

/// A replicated write the peer has not confirmed written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unacked {
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) sent_ms: u64,
    /// The application write it belongs to.
    pub(super) req: ReqId,
}

#[derive(Debug)]
pub(super) struct Peer {
    pub(super) id: NodeId,
    pub(super) up: bool,
    pub(super) role: Role,
    pub(super) vols: Vec<PeerVol>,
    // As sender: writes not yet confirmed written (the transfer log).
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// Writes whose protocol acknowledgement an application write waits for.
    pub(super) app_waiting: BTreeMap<u64, ReqId>,
    pub(super) barriers_out: BTreeMap<u64, u64>,
    pub(super) reads_out: BTreeMap<u64, ReqId>,
    // As receiver.
    pub(super) rx_pending: BTreeSet<u64>,
    /// Counts connections: answers to requests of an earlier connection are not sent on a
    /// later one (the peer has forgotten them).
    pub(super) conn: u32,
    pub(super) rx_last_seq: u64,
    pub(super) barriers_in: VecDeque<(u64, u64)>,
    pub(super) last_rx_ms: u64,
    pub(super) ping_sent_ms: Option<u64>,
}
