//! Durability: FLUSH requests and FUA writes become a barrier over every replica (a local
//! fdatasync plus a Barrier packet each peer answers once every write it received before
//! it is written and flushed), and the local fdatasyncs are shared by whoever waits.

use super::action::RAction;
use super::msg::Token;
use super::nodeset::NodeSet;
use super::spec::NodeId;
use crate::flush::FlushBatcher;
use crate::io::{DiskKind, ReqId};
use rustc_hash::FxHashMap as HashMap;

/// A durability barrier over every replica.
#[derive(Debug, Default)]
pub(super) struct FlushOp {
    /// FLUSH requests and FUA writes waiting for it, with the volume each is about.
    pub(super) waiters: Vec<(ReqId, u16)>,
    pub(super) local_pending: bool,
    pub(super) local_ok: bool,
    /// The peers it was sent to: those not in `peers_ok` missed it.
    pub(super) peers_asked: NodeSet,
    pub(super) peers_pending: NodeSet,
    pub(super) peers_ok: NodeSet,
}

/// Who waits for a local fdatasync.
#[derive(Debug)]
pub(super) enum FlushWaiter {
    Op(u64),
    /// A peer's barrier: answered once our replica is flushed, on the connection it came
    /// on (overlapping seed 17794: an answer that went out on the next one named a barrier
    /// that connection never sent, and the Primary dropped it).
    PeerBarrier {
        peer: NodeId,
        conn: u32,
        id: u64,
    },
    /// A resync finished: flush before declaring the replica up to date.
    ResyncDone {
        volume: u16,
    },
}

#[derive(Debug, Default)]
pub(super) struct Barriers {
    ops: HashMap<u64, FlushOp>,
    flusher: FlushBatcher,
    local_waiters: HashMap<u64, FlushWaiter>,
}

impl Barriers {
    /// Application requests waiting for a barrier.
    pub(super) fn requests(&self) -> usize {
        self.ops.values().map(|f| f.waiters.len()).sum()
    }

    pub(super) fn open(&mut self, id: u64, op: FlushOp) {
        self.ops.insert(id, op);
    }

    /// The requests (and their volumes) barrier `id` answers, if it is open.
    pub(super) fn waiters(&self, id: u64) -> &[(ReqId, u16)] {
        self.ops.get(&id).map_or(&[], |op| &op.waiters)
    }

    /// Queues `waiter` (under the fresh `key`) for the next local fdatasync, issued now if
    /// none runs.
    pub(super) fn flush_locally(&mut self, key: u64, waiter: FlushWaiter, out: &mut Vec<RAction>) {
        self.local_waiters.insert(key, waiter);
        if let Some(seq) = self.flusher.request(ReqId(key)) {
            issue(seq, out);
        }
    }

    /// The local fdatasync `seq` finished: who it answers, and the next one to issue once
    /// they are answered ([`issue_next`](Self::issue_next)).
    pub(super) fn flushed(&mut self, seq: u64) -> (Vec<FlushWaiter>, Option<u64>) {
        let (covered, next) = self.flusher.finished(seq);
        let waiters = covered
            .iter()
            .filter_map(|key| {
                let w = self.local_waiters.remove(&key.0);
                debug_assert!(w.is_some(), "unknown flush waiter");
                w
            })
            .collect();
        self.flusher.recycle(covered);
        (waiters, next)
    }

    pub(super) fn issue_next(&mut self, next: Option<u64>, out: &mut Vec<RAction>) {
        if let Some(seq) = next {
            issue(seq, out);
        }
    }

    /// Our replica's part of barrier `id` is done.
    pub(super) fn local_answered(&mut self, id: u64, ok: bool) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.local_pending = false;
            op.local_ok = ok;
        }
    }

    /// `peer` answered barrier `id` (or is gone: not ok).
    pub(super) fn peer_answered(&mut self, id: u64, peer: NodeId, ok: bool) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.peers_pending.remove(peer);
            if ok {
                op.peers_ok.insert(peer);
            }
        }
    }

    /// Barrier `id`, taken out once every replica answered.
    pub(super) fn take_done(&mut self, id: u64) -> Option<FlushOp> {
        let op = self.ops.get(&id)?;
        if op.local_pending || !op.peers_pending.is_empty() {
            return None;
        }
        self.ops.remove(&id)
    }
}

fn issue(seq: u64, out: &mut Vec<RAction>) {
    out.push(RAction::Disk {
        volume: 0,
        token: Token::Flush(seq),
        kind: DiskKind::Flush,
        data: None,
    });
}
