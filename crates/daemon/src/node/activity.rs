//! The activity log on the write path: every write that changes a consistent replica (an
//! application write here, or a peer's replicated write) first has its 4 MiB extents in the
//! replica's activity log, so a crash names where the replica may differ from its peers
//! (`ReplicaAtStart::Crashed`). A write to an extent not in the log waits for the
//! transaction that adds it (`VolumeMeta::write_transaction`, written on the loop: a few
//! microseconds on persistent memory, one synchronous write on a disk). A write keeps its
//! extents until it is settled — every replica it went to wrote it, or is marked as lacking
//! it (the engine's peer acks, `RAction::WriteSettled` and `RAction::Settled`) — and, an
//! application write, answered; a peer's write, written here. Until then a crash of every
//! node must find it in a log: some replica may hold it while another lacks it. Resync
//! writes pass without: a replica being synced is not consistent, and a crash resyncs it
//! in full.
//!
//! A write that misses the log waits, its bytes copied, and the event loop writes one
//! transaction for every write that missed in its round, after the round's packets are
//! sent (`al_commit_pending`): at iodepth 16 sixteen misses cost one metadata write, not
//! sixteen, and the peers already have the writes while the transaction is written. A
//! write that finds every extent of the log in use waits until one is freed. Released
//! writes are issued by the loop in the order they arrived (`issue_al_ready`).
//!
//! A transaction that must evict an extent whose writes may not be durable yet records it
//! in the unsynced map (`unsynced`, where the metadata has one and is not internal) or
//! syncs the data first (see `tandem_meta::ActivityLog`). Without a map, to keep that sync
//! off the write path, one is started ahead, on a worker, whenever fewer than `CLEAN_LOW`
//! unused extents are clean (`al_sync_ahead`); with one, when its oldest bit is as old as
//! the kernel's write-back age (`al_unsynced_due`). Every data sync marks the extents it
//! makes clean and clears the map's bits recorded before it (`al_sync_started`,
//! `al_sync_finished`).

use super::metadata::extents_of;
use super::state::*;
use super::unsynced;
use std::time::Instant;
use tandem_engine::replica::{NodeId, RAction, Token};
use tandem_engine::{DiskKind, ReqId};
use tandem_meta::{Begin, WaitId};
use tracing::error;

/// Fewer clean unused extents than this (or than half the log) start a data sync ahead.
const CLEAN_LOW: usize = 128;

/// An application write's hold on its activity-log extents (DRBD's transfer log), from
/// its gate until it is answered; then, until settled (every replica it went to has it,
/// or is marked lacking it), in `al_answered`.
#[derive(Clone, Copy, Debug)]
pub(super) struct AppHold {
    pub(super) volume: u16,
    /// (first extent, last extent), once it is issued.
    pub(super) extents: Option<(u32, u32)>,
}

/// How far a peer's writes on one connection are settled, and how many of them are on
/// their way to the disk (the mark is kept until none is, after the connection's end).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PeerMark {
    pub(super) upto: u64,
    pub(super) in_flight: u32,
}

/// Answered application writes not yet settled, by (request id, volume, answer number),
/// with the extents each holds (none if it failed before it was issued): one ordered map,
/// no allocation per write beyond its nodes, the oldest of a (request id, volume) first.
#[derive(Debug, Default)]
pub(super) struct AnsweredHolds {
    by: std::collections::BTreeMap<(ReqId, u16, u64), Option<(u32, u32)>>,
    answered: u64,
}

impl AnsweredHolds {
    fn push(&mut self, req: ReqId, v: u16, extents: Option<(u32, u32)>) {
        self.answered += 1;
        self.by.insert((req, v, self.answered), extents);
    }

    /// The oldest answered write of `req` and `v` (`None`: no such write was gated).
    fn pop(&mut self, req: ReqId, v: u16) -> Option<Option<(u32, u32)>> {
        let key = *self.by.range((req, v, 0)..=(req, v, u64::MAX)).next()?.0;
        self.by.remove(&key)
    }
}

/// A write waiting for an activity-log transaction.
#[derive(Debug)]
pub(super) struct AlWaiting {
    pub(super) id: WaitId,
    pub(super) volume: u16,
    pub(super) token: Token,
    pub(super) kind: DiskKind,
    /// A write's bytes (copied: the packet or request they came in is gone by then).
    pub(super) data: Option<Vec<u8>>,
    pub(super) failed: bool,
}

/// What the gate says of a write.
pub(super) enum Gate {
    /// Its extents are in the log (or it needs none): issue it.
    Go,
    /// It waits for a transaction: the caller hands over its bytes (`defer`).
    Wait(WaitId),
}

/// The range a data-changing disk operation covers, if the activity log gates it.
pub(super) fn gated(token: Token, kind: DiskKind) -> Option<(u64, u64)> {
    if !matches!(token, Token::App(_) | Token::PeerWrite { .. }) {
        return None;
    }
    match kind {
        DiskKind::Write { offset, len }
        | DiskKind::Trim { offset, len }
        | DiskKind::Zero { offset, len, .. } => Some((offset, u64::from(len))),
        _ => None,
    }
}

impl NodeReactor {
    /// Brings the extents of a write of resource `r`, volume `v`, into the log.
    pub(super) fn al_gate(&mut self, r: usize, v: u16, token: Token, range: (u64, u64)) -> Gate {
        if !self.activity_log {
            return Gate::Go;
        }
        let Some(meta) = self.res[r]
            .metas
            .get_mut(v as usize)
            .and_then(Option::as_mut)
        else {
            return Gate::Go;
        };
        let (first, last) = extents_of(range.0, range.1);
        if let Begin::Wait(id) = meta.al.begin(first, last) {
            if !self.al_commits.contains(&(r, v)) {
                self.al_commits.push((r, v));
            }
            if let Token::App(req) = token {
                // Held from its issue on (`issue_al_ready`), or not at all if it fails
                // first; answered either way, and settled after.
                let hold = AppHold {
                    volume: v,
                    extents: None,
                };
                let earlier = self.res[r].al_app.insert(req, hold);
                debug_assert!(earlier.is_none(), "two local writes for {req:?}");
            }
            return Gate::Wait(id);
        }
        if let Token::App(req) = token {
            let hold = AppHold {
                volume: v,
                extents: Some((first, last)),
            };
            let earlier = self.res[r].al_app.insert(req, hold);
            debug_assert!(earlier.is_none(), "two local writes for {req:?}");
        }
        Gate::Go
    }

    /// A write that waited for its transaction is issued: it holds its extents now.
    fn al_hold(&mut self, r: usize, req: ReqId, extents: (u32, u32)) {
        let h = self.res[r].al_app.get_mut(&req);
        debug_assert!(h.is_some(), "{req:?} issued after it was answered");
        if let Some(h) = h {
            h.extents = Some(extents);
        }
    }

    /// Keeps a write that waits for the log, with its bytes.
    pub(super) fn al_defer(
        &mut self,
        r: usize,
        id: WaitId,
        volume: u16,
        token: Token,
        kind: DiskKind,
        data: Option<Vec<u8>>,
    ) {
        self.res[r].al_waiting.push(AlWaiting {
            id,
            volume,
            token,
            kind,
            data,
            failed: false,
        });
    }

    /// Writes the transactions the writes that missed in this round wait for.
    pub(super) fn al_commit_pending(&mut self) {
        for (r, v) in std::mem::take(&mut self.al_commits) {
            self.al_commit(r, v);
        }
    }

    /// Writes transactions while they serve waiting writes; those released (and, if the
    /// metadata write failed, all waiting) move to `al_ready`.
    fn al_commit(&mut self, r: usize, v: u16) {
        loop {
            let Some(meta) = self.res[r].metas.get(v as usize).and_then(Option::as_ref) else {
                return;
            };
            // Victims would be dirty: rather than a data sync on the loop, wait for one
            // on a worker (running, or started now); its end commits. If none can run
            // (nothing new to sync, or syncs failed), the transaction syncs the data
            // itself.
            let short = !meta.records_unsynced()
                && meta.al.clean_unused() < meta.al.waiting()
                && meta.al.dirty_unused() > 0;
            if short && self.al_data_sync(r) {
                return;
            }
            let rc = &mut self.res[r];
            let Some(meta) = rc.metas.get_mut(v as usize).and_then(Option::as_mut) else {
                return;
            };
            let Some(backing) = rc.backings.get(v as usize).cloned().flatten() else {
                return;
            };
            let engine = &rc.engine;
            let mut released = match meta
                .write_transaction(&backing, |p| engine.out_of_sync_words(v, p))
            {
                Ok(Some(released)) => released,
                Ok(None) => break,
                Err(e) => {
                    error!(resource = %rc.cfg.name, volume = v,
                        "activity-log transaction on {} failed: {}; the writes waiting for it fail and the replica detaches", meta.describe(), crate::error_chain(&e));
                    rc.meta_failed = MetaFailed::Untold;
                    let (failed, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut rc.al_waiting)
                        .into_iter()
                        .partition(|w| w.volume == v);
                    rc.al_waiting = kept;
                    self.al_ready.extend(failed.into_iter().map(|mut w| {
                        w.failed = true;
                        (r, w)
                    }));
                    return;
                }
            };
            // Ids grow with arrival: overlapping writes keep their order.
            released.sort_unstable();
            for id in released {
                if let Some(i) = rc
                    .al_waiting
                    .iter()
                    .position(|w| w.id == id && w.volume == v)
                {
                    let w = rc.al_waiting.remove(i);
                    self.al_ready.push_back((r, w));
                }
            }
        }
        self.al_sync_ahead(r, v);
    }

    /// Starts a data sync ahead when clean victims run low, so that a transaction seldom
    /// has to sync the data itself, on the write path.
    fn al_sync_ahead(&mut self, r: usize, v: u16) {
        let rc = &mut self.res[r];
        let Some(meta) = rc.metas.get(v as usize).and_then(Option::as_ref) else {
            return;
        };
        // With an unsynced map dirty victims cost a record, not a sync: the map is synced
        // on its own schedule (`al_unsynced_due`).
        if meta.records_unsynced() {
            return;
        }
        let low = CLEAN_LOW.min(meta.al.al_extents() as usize / 2);
        if meta.al.clean_unused() < low && meta.al.dirty_unused() > 0 {
            self.al_data_sync(r);
        }
    }

    /// On the housekeeping tick: a data sync for every resource whose unsynced map has
    /// held an extent for the kernel's write-back age (see `unsynced`).
    pub(super) fn al_unsynced_due(&mut self) {
        let now = Instant::now();
        let interval = unsynced::interval();
        for r in 0..self.res.len() {
            let due = self.res[r]
                .metas
                .iter()
                .flatten()
                .any(|m| m.unsynced_due(now, interval));
            if due {
                self.al_data_sync(r);
            }
        }
    }

    /// A data sync of resource `r` that will make extents clean: running, or started now
    /// (on a worker). False if none can run.
    fn al_data_sync(&mut self, r: usize) -> bool {
        let rc = &mut self.res[r];
        if rc.al_sync.is_some() {
            return true;
        }
        match rc.syncs.sync_now() {
            Some(s) => {
                self.syncs_ahead.push((r, s, Ahead::OfActivityLog));
                true
            }
            None => false,
        }
    }

    /// A data sync of every replica of resource `r` covering its writes up to `gen` starts.
    pub(super) fn al_sync_started(&mut self, r: usize, gen: u64) {
        let rc = &mut self.res[r];
        let marks = rc
            .metas
            .iter_mut()
            .enumerate()
            .filter_map(|(v, m)| Some((v as u16, m.as_mut()?.sync_started())))
            .collect();
        rc.al_sync = Some((gen, marks));
    }

    /// That sync finished: if it succeeded, the extents it covers are clean. Writes that
    /// waited for it get their transaction (if it failed, one that syncs itself, and
    /// fails them if that fails too).
    pub(super) fn al_sync_finished(&mut self, r: usize, gen: u64, ok: bool) {
        let rc = &mut self.res[r];
        if let Some((g, marks)) = rc.al_sync.take() {
            debug_assert_eq!(g, gen, "one data sync at a time");
            if ok && g == gen {
                for (v, mark) in marks {
                    let Some(m) = rc.metas.get_mut(v as usize).and_then(Option::as_mut) else {
                        continue;
                    };
                    if let Err(e) = m.sync_done(mark) {
                        error!(resource = %rc.cfg.name, volume = v,
                            "writing the unsynced map of {} failed: {}; the replicas of this resource detach", m.describe(), crate::error_chain(&e));
                        if rc.meta_failed == MetaFailed::No {
                            rc.meta_failed = MetaFailed::Untold;
                        }
                    }
                }
            }
        }
        let waiting: Vec<u16> = (0..rc.metas.len() as u16)
            .filter(|&v| {
                rc.metas[v as usize]
                    .as_ref()
                    .is_some_and(|m| m.al.waiting() > 0)
            })
            .collect();
        for v in waiting {
            self.al_commit(r, v);
        }
    }

    /// Application request `req` of resource `r` was answered: a write's extents wait for
    /// it to be settled (its request id may be reused meanwhile).
    pub(super) fn al_app_done(&mut self, r: usize, req: ReqId) {
        if let Some(h) = self.res[r].al_app.remove(&req) {
            self.res[r].al_answered.push(req, h.volume, h.extents);
        }
    }

    /// The oldest answered write `req` of volume `v` not yet settled is settled (see
    /// [`RAction::WriteSettled`]): its extents are free.
    pub(super) fn al_write_settled(&mut self, r: usize, req: ReqId, v: u16) {
        // Nothing: not gated (no activity log for this volume), or failed before issued.
        if let Some((first, last)) = self.res[r].al_answered.pop(req, v).flatten() {
            self.al_end(r, v, first, last);
        }
    }

    /// A peer's write of connection `conn` goes to the disk (or waits for the log).
    pub(super) fn al_peer_write(&mut self, r: usize, token: Token) {
        if let Token::PeerWrite { peer, conn, .. } = token {
            self.res[r]
                .al_settled
                .entry((peer, conn))
                .or_default()
                .in_flight += 1;
        }
    }

    /// A disk operation finished: a peer's write frees its extents once settled (see
    /// [`RAction::Settled`]), which may be now.
    pub(super) fn al_op_done(&mut self, r: usize, v: u16, token: Token, kind: DiskKind) {
        let (Token::PeerWrite { peer, conn, seq }, Some(range)) = (token, gated(token, kind))
        else {
            return;
        };
        let (first, last) = extents_of(range.0, range.1);
        let upto = self.al_peer_landed(r, (peer, conn));
        if seq <= upto {
            return self.al_end(r, v, first, last);
        }
        let earlier = self.res[r]
            .al_peer
            .insert((peer, conn, seq), (v, first, last));
        debug_assert!(earlier.is_none(), "two writes {seq} from {peer}");
    }

    /// A peer's write of `conn` is off the disk path (done, or failed before it was
    /// issued): what is settled of that connection, the mark dropped once nothing more can
    /// come of it.
    pub(super) fn al_peer_landed(&mut self, r: usize, key: (NodeId, u32)) -> u64 {
        let marks = &mut self.res[r].al_settled;
        let Some(m) = marks.get_mut(&key) else {
            return 0;
        };
        m.in_flight = m.in_flight.saturating_sub(1);
        let upto = m.upto;
        if upto == u64::MAX && m.in_flight == 0 {
            marks.remove(&key);
        }
        upto
    }

    /// The engine settled `peer`'s writes on connection `conn` up to `upto`: those written
    /// here leave the log; those still to be written leave it once written.
    pub(super) fn al_settled(&mut self, r: usize, peer: NodeId, conn: u32, upto: u64) {
        let marks = &mut self.res[r].al_settled;
        let m = marks.entry((peer, conn)).or_default();
        m.upto = m.upto.max(upto);
        // The connection is over and nothing of it is on the way to the disk: done with it.
        if m.upto == u64::MAX && m.in_flight == 0 {
            marks.remove(&(peer, conn));
        }
        let held = &mut self.res[r].al_peer;
        let mut settled = held.split_off(&(peer, conn, 0));
        held.append(&mut settled.split_off(&(peer, conn, upto.saturating_add(1))));
        for (v, first, last) in settled.into_values() {
            self.al_end(r, v, first, last);
        }
    }

    fn al_end(&mut self, r: usize, v: u16, first: u32, last: u32) {
        if !self.activity_log {
            return;
        }
        let Some(meta) = self.res[r]
            .metas
            .get_mut(v as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        meta.al.end(first, last);
        if meta.al.waiting() > 0 {
            self.al_commit(r, v);
        }
    }

    /// Issues the writes a transaction released since (or fails them).
    pub(super) fn issue_al_ready(&mut self) {
        while let Some((r, w)) = self.al_ready.pop_front() {
            let mut out: Vec<RAction> = Vec::new();
            let a = super::actions::DiskAction {
                r,
                volume: w.volume,
                token: w.token,
                kind: w.kind,
            };
            if w.failed {
                if let Token::PeerWrite { peer, conn, .. } = w.token {
                    self.al_peer_landed(r, (peer, conn));
                }
                self.fail_unlogged(a, &mut out);
            } else {
                // The transaction counted its extents as used: an application write holds
                // them until answered, as on the direct path.
                if let (Token::App(req), Some(range)) = (w.token, gated(w.token, w.kind)) {
                    self.al_hold(r, req, extents_of(range.0, range.1));
                }
                self.issue(a, super::actions::Bytes::Owned(w.data.as_deref()), &mut out);
            }
            self.run_actions(r, out, Ctx::default());
        }
    }

    /// The flags a crash is judged by follow the engine (see `VolumeMeta::set_state`).
    pub(super) fn al_state_changed(&mut self, r: usize) {
        let rc = &mut self.res[r];
        let primary = rc.engine.role() == tandem_engine::replica::Role::Primary;
        for (v, m) in rc.metas.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            // Without the log a crash cannot be bounded: never "consistent" while running.
            let consistent = self.activity_log && rc.engine.consistent(v as u16);
            let (ids, writer) = (rc.engine.ids_at_crash(v as u16), rc.engine.writer());
            let engine = &rc.engine;
            let bitmap_gi = |node| engine.bitmap_gi(v as u16, node);
            // Proven, or being synced: what the map held for a second crash may go.
            let proven = engine.suspect_ranges(v as u16).is_empty();
            let done = m
                .set_state(consistent, primary, ids, writer, bitmap_gi)
                .and_then(|()| if proven { m.release_unsynced() } else { Ok(()) });
            if let Err(e) = done {
                error!(resource = %rc.cfg.name, volume = v,
                    "writing the metadata of {} failed: {}; the replicas of this resource detach", m.describe(), crate::error_chain(&e));
                if rc.meta_failed == MetaFailed::No {
                    rc.meta_failed = MetaFailed::Untold;
                }
            }
        }
    }
}
