//! The apply queue of one volume's local replica: writes on their way to the disk for
//! peers (replication and resync) and the writes and reads that wait for an overlapping
//! one to land first.
//!
//! Disks complete in any order, so two overlapping writes in flight together may land in
//! either order: a later one waits here until the earlier one completed. Reads a peer asks
//! for wait the same way, so they see every write that reached us before them.

use super::action::RAction;
use super::msg::{DataRef, Token};
use super::overlap::{InFlight, Waiting};
use super::spec::NodeId;
use crate::io::DiskKind;

/// A write held back behind an overlapping one, its payload kept by the driver.
#[derive(Debug, Clone, Copy)]
struct HeldWrite {
    token: Token,
    offset: u64,
    len: u32,
    kind: DiskKind,
    data: Option<DataRef>,
}

/// A write that waited here when its replica detached: it is never issued, and completes
/// as a failed disk write would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) token: Token,
    pub(super) kind: DiskKind,
}

/// What a peer asked to see of a range of our replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    /// Its bytes, for a Primary's application read.
    Read,
    /// Its bytes, for a sync target's pull.
    Resync,
    /// Its allocation map, for a Primary's block status (`block_status.rs`).
    Allocation,
}

/// A peer's read (resync read, block status) waiting for an overlapping write to land
/// here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WaitingRead {
    pub(super) peer: NodeId,
    /// The connection that asked: a later one has forgotten the request.
    pub(super) conn: u32,
    pub(super) id: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) what: Asked,
}

#[derive(Debug, Default)]
pub(super) struct ApplyQueue {
    applying: InFlight<Token>,
    held: Waiting<HeldWrite>,
    reads: Vec<WaitingRead>,
}

impl ApplyQueue {
    /// Whether a write or read of this range must wait.
    pub(super) fn busy(&self, offset: u64, len: u64) -> bool {
        self.applying.overlaps(offset, len) || self.held.blocks(offset, len)
    }

    /// Sends a write to the disk, or holds it (and its payload) behind an overlapping one.
    /// `track`: later writes wait for this one (replication and resync writes); an
    /// application write of the Primary is ordered by the write path instead and only
    /// waits here itself.
    pub(super) fn write(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        data: Option<DataRef>,
        track: bool,
        out: &mut Vec<RAction>,
    ) {
        let (offset, len) = (kind.offset(), kind.len());
        if self.busy(offset, u64::from(len)) {
            let data = data.map(|d| keep(d, token, out));
            let held = HeldWrite {
                token,
                offset,
                len,
                kind,
                data,
            };
            return self.held.push(offset, u64::from(len), held);
        }
        if track {
            self.applying.insert(offset, u64::from(len), token);
        }
        out.push(RAction::Disk {
            volume,
            token,
            kind,
            data,
        });
    }

    /// A write of ours landed (or failed). Returns whether this queue tracked it.
    pub(super) fn landed(&mut self, offset: u64, token: Token) -> bool {
        let tracked = self.applying.holds(offset, token);
        if tracked {
            self.applying.remove(offset, token);
        }
        tracked
    }

    /// Starts the held writes that no longer overlap one in flight, and hands back the
    /// waiting reads to serve again.
    pub(super) fn release(&mut self, volume: u16, out: &mut Vec<RAction>) -> Vec<WaitingRead> {
        for h in self.held.ready(&self.applying) {
            self.applying.insert(h.offset, u64::from(h.len), h.token);
            out.push(RAction::Disk {
                volume,
                token: h.token,
                kind: h.kind,
                data: h.data,
            });
        }
        std::mem::take(&mut self.reads)
    }

    /// The replica detached: nothing waiting here will be issued. Hands back the held
    /// writes whose turn came (to be completed as failed, their kept bytes dropped) and
    /// the waiting reads (to be answered again: a detached replica serves none). A write
    /// still behind one in flight keeps its place until that one lands, so the peer hears
    /// of the two in order (soak seed 94003653: with protocol B, the refusal of a later
    /// write overtook the acknowledgement of the earlier one it overlapped, and the
    /// Primary took that acknowledgement for the newest data of the range).
    pub(super) fn refuse(&mut self, out: &mut Vec<RAction>) -> (Vec<Refused>, Vec<WaitingRead>) {
        let mut refused = Vec::new();
        loop {
            // Refused writes never enter `applying`: those behind them are free next pass.
            let ready = self.held.ready(&self.applying);
            if ready.is_empty() {
                break;
            }
            refused.extend(ready.into_iter().map(|h| {
                // An application write's bytes live as long as its request.
                match h.data {
                    Some(DataRef::Held { key, .. }) if !matches!(key, Token::App(_)) => {
                        out.push(RAction::Forget { key })
                    }
                    _ => {}
                }
                Refused {
                    token: h.token,
                    kind: h.kind,
                }
            }));
        }
        (refused, std::mem::take(&mut self.reads))
    }

    /// A write that arrived after the replica detached, behind an overlapping one still
    /// in flight: refused in its turn (see [`refuse`](Self::refuse)).
    pub(super) fn hold_refused(&mut self, token: Token, kind: DiskKind) {
        let (offset, len) = (kind.offset(), kind.len());
        let held = HeldWrite {
            token,
            offset,
            len,
            kind,
            data: None,
        };
        self.held.push(offset, u64::from(len), held);
    }

    pub(super) fn wait_read(&mut self, read: WaitingRead) {
        self.reads.push(read);
    }

    pub(super) fn check(&self) -> Result<(), String> {
        self.applying.check()
    }
}

/// Has the driver keep a payload that must outlive the event it came with.
fn keep(d: DataRef, key: Token, out: &mut Vec<RAction>) -> DataRef {
    let (from, at) = match d {
        DataRef::Held { .. } => return d,
        // The whole packet is kept; the write starts `at` bytes into it.
        DataRef::Incoming { at } => (DataRef::Incoming { at: 0 }, at),
        other => (other, 0),
    };
    out.push(RAction::Retain { from, key });
    DataRef::Held { key, at }
}
