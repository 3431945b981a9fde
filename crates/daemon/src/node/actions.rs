//! Carrying out the engine's actions: disk operations on the worker threads (or inline),
//! fdatasyncs planned by `tandem_engine::sync_plan`, packets to peers (and congestion),
//! data references resolved to bytes.

use super::links::Attempt;
use super::state::*;
use crate::bufpool::DataBuf;
use crate::worker::{os_error, Done, Job};
use anyhow::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_engine::driver::{execute, DataStore, DiskRequest, Driver, SplitBrain};
use tandem_engine::replica::{DataRef, Event, LinkLoss, Msg, NodeId, RAction, Role, Token};
use tandem_engine::sync_plan::{FlushPlan, SyncStart};
use tandem_engine::ReqId;
use tandem_engine::{DiskKind, IoError};
use tandem_storage::Backing;
use tracing::{debug, error, info, warn};

/// A write's bytes: in the engine's store or the packet being handled, or copied while
/// it waited for the activity log.
pub(super) enum Bytes<'a, 'c> {
    Ref(Option<DataRef>, &'c Ctx<'a>),
    Owned(Option<&'c [u8]>),
}

/// A disk operation the engine of resource `r` asked for (`RAction::Disk`).
#[derive(Clone, Copy, Debug)]
pub(super) struct DiskAction {
    pub(super) r: usize,
    pub(super) volume: u16,
    pub(super) token: Token,
    pub(super) kind: DiskKind,
}

impl DiskAction {
    /// What a worker's completion of it is for.
    fn tag(self) -> Tag {
        Tag::Op(self.r, self.volume, self.token)
    }
}

impl NodeReactor {
    pub(super) fn resolve<'a>(&'a self, r: usize, d: DataRef, ctx: &Ctx<'a>) -> Option<&'a [u8]> {
        self.res[r].data.resolve(d, ctx)
    }

    /// Carries out the engine's actions (and those of inline disk completions). Never
    /// nests: nothing it calls runs actions itself, which is what lets it release the spent
    /// read buffers at the end.
    pub(super) fn run_actions(&mut self, r: usize, actions: Vec<RAction>, ctx: Ctx<'_>) {
        execute(&mut ResourceDriver { node: self, r }, actions, &ctx);
        if let Some(ms) = self.res[r].engine.poll_timeout() {
            let at = self.started + Duration::from_millis(ms);
            self.engine_wake = Some(self.engine_wake.map_or(at, |w| w.min(at)));
        }
        if self.res[r].demote_pending {
            self.finish_forced_demote(r);
        }
        if self.res[r].meta_failed == MetaFailed::Untold {
            // Never nested: the second call finds it told.
            self.res[r].meta_failed = MetaFailed::Told;
            let mut out = Vec::new();
            self.res[r].engine.sync_failed(&mut out);
            self.run_actions(r, out, Ctx::default());
        }
        for (r, token) in std::mem::take(&mut self.spent_reads) {
            if let Some(b) = self.res[r].data.take_read(token) {
                self.pool.put(b);
            }
        }
    }

    fn disconnect(&mut self, r: usize, peer: NodeId, reason: LinkLoss) {
        let name = self.res[r].peer_name(peer);
        warn!(resource = %self.res[r].cfg.name, "dropping node {name}: {reason}");
        if let Some(slot) = self.res[r].peers.iter_mut().find(|p| p.id == peer) {
            slot.last_error = Some(reason.to_string());
            // Not a peer that went away: redialling at once would meet the
            // same conflict, so this counts as a refusal (backs off).
            slot.link.failed(Attempt::Refused, Instant::now());
        }
        if let Some(k) = self.res[r]
            .peers
            .iter()
            .find(|p| p.id == peer)
            .and_then(|p| p.conn)
        {
            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                pc.dead = true;
            }
            self.mark_dirty(k);
        }
    }

    /// Carries out a disk operation once the activity log admits it (see `activity.rs`).
    fn disk(
        &mut self,
        a: DiskAction,
        data: Option<DataRef>,
        ctx: &Ctx<'_>,
        out: &mut Vec<RAction>,
    ) {
        let changes = matches!(
            a.kind,
            DiskKind::Write { .. } | DiskKind::Trim { .. } | DiskKind::Zero { .. }
        );
        if changes && self.res[a.r].meta_failed != MetaFailed::No {
            return self.fail_unlogged(a, out);
        }
        if let Some(range) = super::activity::gated(a.token, a.kind) {
            self.al_peer_write(a.r, a.token);
            match self.al_gate(a.r, a.volume, a.token, range) {
                super::activity::Gate::Go => {}
                super::activity::Gate::Wait(id) => {
                    let copy = match a.kind {
                        DiskKind::Write { len, .. } => data
                            .and_then(|d| self.resolve(a.r, d, ctx))
                            .map(|b| b[..len as usize].to_vec()),
                        _ => None,
                    };
                    return self.al_defer(a.r, id, a.volume, a.token, a.kind, copy);
                }
            }
        }
        self.issue(a, Bytes::Ref(data, ctx), out);
    }

    /// Carries out a disk operation: reads the page cache holds and buffered writes on the
    /// loop, fdatasyncs as the sync plan says, everything else on a worker.
    pub(super) fn issue(&mut self, a: DiskAction, data: Bytes<'_, '_>, out: &mut Vec<RAction>) {
        let res = &self.res[a.r];
        // Flushes go to every replica this node keeps; the engine names volume 0.
        let backing = match a.kind {
            DiskKind::Flush => res.backings.iter().flatten().next().cloned(),
            _ => res.backings.get(a.volume as usize).cloned().flatten(),
        };
        let Some(backing) = backing else {
            error!("disk operation on a volume without a local replica");
            return self.disk_done(a, Err(IoError::NoData), out);
        };
        match a.kind {
            DiskKind::Read { offset, len } => self.read(a, backing, offset, len, out),
            DiskKind::Allocation { offset, len } => self.allocation(a, &backing, offset, len, out),
            DiskKind::Write { offset, len } => {
                let bytes = match data {
                    Bytes::Ref(d, ctx) => d
                        .and_then(|d| self.resolve(a.r, d, ctx))
                        .map(|b| &b[..len as usize]),
                    Bytes::Owned(b) => b,
                };
                let result = match bytes {
                    Some(b) => backing.write_at(b, offset).map_err(os_error),
                    None => {
                        error!("write without its data ({:?}); failing it", a.token);
                        Err(IoError::Os(libc::EIO))
                    }
                };
                self.written(a, len, result, out);
            }
            DiskKind::Flush => match self.res[a.r].syncs.flush((a.volume, a.token)) {
                FlushPlan::Answer((volume, token), result) => {
                    let result = result.map_err(|()| IoError::Os(libc::EIO));
                    self.res[a.r]
                        .engine
                        .disk_done(volume, token, a.kind, result, out);
                }
                FlushPlan::Wait => {}
                FlushPlan::Start(s) => self.sync(a.r, s, out),
            },
            _ => self.workers.submit(Job {
                tag: a.tag(),
                backing,
                kind: a.kind,
                buf: None,
                also: Vec::new(),
            }),
        }
    }

    /// A read of `len` bytes at `offset`: on the loop if the page cache holds all of it,
    /// else on a worker, which waits for the disk instead of the loop.
    fn read(
        &mut self,
        a: DiskAction,
        backing: Arc<Backing>,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        let mut buf = self.pool.get(len as usize);
        let result = match backing.read_cached(&mut buf, offset) {
            Ok(true) => Ok(()),
            Ok(false) => {
                return self.workers.submit(Job {
                    tag: a.tag(),
                    backing,
                    kind: a.kind,
                    buf: Some(buf),
                    also: Vec::new(),
                })
            }
            Err(e) => Err(os_error(e)),
        };
        if result.is_ok() {
            self.res[a.r].data.read_done(a.token, buf);
            self.spent_reads.push((a.r, a.token));
        } else {
            self.pool.put(buf);
        }
        self.disk_done(a, result, out);
    }

    /// A peer's block status: the map of `len` bytes at `offset`, made on the loop as a
    /// local one is (a bounded number of `lseek` calls), into a read buffer the reply takes.
    fn allocation(
        &mut self,
        a: DiskAction,
        backing: &Backing,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        let mut map = Vec::new();
        let n = crate::nbd_glue::allocation_extents(backing, offset, len, &mut map);
        let mut buf = self.pool.get(map.len());
        buf.copy_from_slice(&map);
        self.res[a.r].data.read_done(a.token, buf);
        self.spent_reads.push((a.r, a.token));
        (self.res[a.r].engine).allocation_done(a.volume, a.token, Ok(n), out);
    }

    /// A write of `len` bytes done on the loop: its held bytes go, the sync plan counts it.
    fn written(
        &mut self,
        a: DiskAction,
        len: u32,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        self.res[a.r].data.write_ended(a.token);
        let ahead = self.res[a.r].syncs.wrote(u64::from(len));
        self.disk_done(a, result, out);
        // Started once the ack is on its way, so the sync never delays it.
        self.syncs_ahead
            .extend(ahead.map(|s| (a.r, s, Ahead::OfFlush)));
    }

    fn disk_done(&mut self, a: DiskAction, result: Result<(), IoError>, out: &mut Vec<RAction>) {
        self.op_done(a, result, out);
    }

    /// A disk operation finished: the activity log frees a peer write's extents, the
    /// engine hears of it.
    /// Fails (EIO) a write that never entered the activity log: it holds no extents,
    /// so unlike [`Self::op_done`] nothing is released there (a peer's write failed
    /// after a failed metadata write once ended extents it never began: a panic).
    pub(super) fn fail_unlogged(&mut self, a: DiskAction, out: &mut Vec<RAction>) {
        self.res[a.r]
            .engine
            .disk_done(a.volume, a.token, a.kind, Err(IoError::Os(libc::EIO)), out);
    }

    pub(super) fn op_done(
        &mut self,
        a: DiskAction,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        self.al_op_done(a.r, a.volume, a.token, a.kind);
        self.count_disk(a.r, a.volume, a.kind, result.is_ok());
        self.res[a.r]
            .engine
            .disk_done(a.volume, a.token, a.kind, result, out);
    }

    /// Runs a sync of resource `r`: a Secondary's sync over little written data on the
    /// event loop, the rest on a disk worker.
    ///
    /// On the loop the fdatasync costs about one device cache flush; handing it to a
    /// thread costs two wakeups, and on a busy machine the first of them is slow: with
    /// fio `fsync=1` through a diskless Primary on this 2-core VM a sync ahead started
    /// 60–115 µs after the write's ack (perf trace), and moving it onto the loop took the
    /// flush cycle from 10.1k–11.0k to 11.1k–15.0k IOPS on tmpfs, 3.9k–4.2k to 4.1k–4.3k
    /// on the disk. A Secondary's loop serves only its peers, which wait for this sync
    /// anyway. Larger syncs go to a worker so a long writeback never stalls pings.
    pub(super) fn sync(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        if self.res[r].engine.role() == Role::Secondary && s.bytes <= INLINE_SYNC_MAX {
            self.sync_inline(r, s, out);
        } else {
            self.start_sync(r, s, out);
        }
    }

    /// Starts an fdatasync of every local replica of resource `r` on a disk worker.
    pub(super) fn start_sync(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        self.al_sync_started(r, s.gen);
        let mut backings = self.res[r].backings.iter().flatten().cloned();
        let Some(backing) = backings.next() else {
            error!("a sync of a resource without local replicas");
            return self.sync_done(r, s.gen, Err(IoError::NoData), out);
        };
        self.workers.submit(Job {
            tag: Tag::Sync { r, gen: s.gen },
            backing,
            kind: DiskKind::Flush,
            buf: None,
            also: backings.collect(),
        });
    }

    /// Syncs every local replica of resource `r` on the event loop.
    pub(super) fn sync_inline(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        // Every replica is synced even if one fails; the flush fails if any did.
        self.al_sync_started(r, s.gen);
        let mut result = Ok(());
        for b in self.res[r].backings.iter().flatten() {
            if let Err(e) = b.sync_data() {
                result = Err(os_error(e));
            }
        }
        self.sync_done(r, s.gen, result, out);
    }

    pub(super) fn start_syncs_ahead(&mut self) {
        for (r, s, why) in std::mem::take(&mut self.syncs_ahead) {
            let mut actions = Vec::new();
            match why {
                Ahead::OfFlush => self.sync(r, s, &mut actions),
                // Nobody waits for it: never on the loop, whatever the role.
                Ahead::OfActivityLog => self.start_sync(r, s, &mut actions),
            }
            self.run_actions(r, actions, Ctx::default());
        }
    }

    /// A sync of resource `r` covering its writes up to `gen` finished.
    pub(super) fn sync_done(
        &mut self,
        r: usize,
        gen: u64,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        if let Err(e) = result {
            error!(resource = %self.res[r].cfg.name, "fdatasync failed: {e:?}");
        }
        self.al_sync_finished(r, gen, result.is_ok());
        let (answer, next) = self.res[r].syncs.sync_done(gen, result.is_ok());
        if let Some(((volume, token), ok)) = answer {
            let result = ok.map_err(|()| result.err().unwrap_or(IoError::Os(libc::EIO)));
            self.res[r]
                .engine
                .disk_done(volume, token, DiskKind::Flush, result, out);
        } else if result.is_err() {
            // A sync ahead that failed with no flush waiting: the replicas detach now.
            self.res[r].engine.sync_failed(out);
        }
        // Same rule as any sync. Never recurses more than once: nothing is written while
        // a sync runs on the loop, so the one after it covers every write.
        if let Some(s) = next {
            self.sync(r, s, out);
        }
    }

    pub(super) fn worker_completions(&mut self) {
        while let Ok(Done {
            tag,
            kind,
            result,
            buf,
        }) = self.workers.done.try_recv()
        {
            let mut actions = Vec::new();
            let r = match tag {
                Tag::Sync { r, gen } => {
                    self.sync_done(r, gen, result, &mut actions);
                    r
                }
                Tag::Op(r, volume, token) => {
                    match (buf, kind, &result) {
                        (Some(b), DiskKind::Read { .. }, Ok(())) => {
                            self.res[r].data.read_done(token, b);
                            self.spent_reads.push((r, token));
                        }
                        (Some(b), _, _) => self.pool.put(b),
                        (None, _, _) => {}
                    }
                    // Zeroing and trims change the replica: metadata work of unknown size.
                    let ahead = matches!(kind, DiskKind::Zero { .. } | DiskKind::Trim { .. })
                        .then(|| self.res[r].syncs.wrote(u64::MAX))
                        .flatten();
                    self.al_op_done(r, volume, token, kind);
                    self.count_disk(r, volume, kind, result.is_ok());
                    self.res[r]
                        .engine
                        .disk_done(volume, token, kind, result, &mut actions);
                    self.syncs_ahead
                        .extend(ahead.map(|s| (r, s, Ahead::OfFlush)));
                    r
                }
            };
            self.run_actions(r, actions, Ctx::default());
        }
    }

    pub(super) fn send(&mut self, r: usize, peer: NodeId, msg: Msg, ctx: &Ctx<'_>) {
        let Some(slot) = self.res[r].peers.iter_mut().find(|p| p.id == peer) else {
            return;
        };
        let Some(k) = slot.conn else {
            return;
        };
        match msg {
            Msg::Write {
                volume,
                seq,
                len,
                flags,
                ..
            } => {
                slot.stats.sent(volume, len);
                use tandem_wire::packet::write_flags::{ACK_RECV, ACK_WRITE};
                if flags & (ACK_RECV | ACK_WRITE) != 0 {
                    slot.stats.write_sent(seq, Instant::now());
                }
            }
            Msg::ResyncReply {
                volume,
                len,
                data: Some(_),
                ..
            } => slot.stats.sent(volume, len),
            _ => {}
        }
        let mut out = match self.entries.get_mut(k) {
            Some(Entry::Peer(pc)) if !pc.dead => std::mem::take(&mut pc.out),
            _ => return,
        };
        let data = |d: Option<DataRef>, len: u32| -> &[u8] {
            d.and_then(|d| self.resolve(r, d, ctx))
                .map(|b| &b[..len as usize])
                .unwrap_or(&[])
        };
        let packet = msg.to_packet(data);
        tandem_wire::encode(&packet, &mut out);
        if let Msg::ReadReply {
            data: Some(DataRef::Disk(t)),
            ..
        }
        | Msg::ResyncReply {
            data: Some(DataRef::Disk(t)),
            ..
        }
        | Msg::AllocReply {
            data: Some(DataRef::Disk(t)),
            ..
        } = msg
        {
            if let Some(b) = self.res[r].data.take_read(t) {
                self.pool.put(b);
            }
        }
        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
            pc.out = out;
            let max = self.res[r].cfg.net.max_buffer;
            if pc.queued() as u64 > max && !self.res[r].congested {
                info!(resource = %self.res[r].cfg.name, peer = %pc.name,
                    "{} bytes queued for this peer (max-buffer {max}): new requests wait", pc.queued());
                self.res[r].congested = true;
            }
        }
        self.mark_dirty(k);
    }

    /// Lifts the back-pressure once every peer queue of `r` is under half of max-buffer
    /// (or gone).
    pub(super) fn relieve_congestion(&mut self, r: usize) {
        if !self.res[r].congested {
            return;
        }
        let low = self.res[r].cfg.net.max_buffer / 2;
        let still = self.res[r].peers.iter().filter_map(|p| p.conn).any(|k| {
            matches!(self.entries.get(k), Some(Entry::Peer(pc)) if !pc.dead && pc.queued() as u64 > low)
        });
        if !still {
            debug!(resource = %self.res[r].cfg.name, "peer queues drained: reading requests again");
            self.res[r].congested = false;
            let stalled = std::mem::take(&mut self.res[r].stalled);
            self.resume.extend(stalled);
        }
    }
}

/// One resource of the node as the driver core sees it ([`Driver`]).
struct ResourceDriver<'a> {
    node: &'a mut NodeReactor,
    r: usize,
}

impl Driver for ResourceDriver<'_> {
    type Buf = DataBuf;

    fn store(&mut self) -> &mut DataStore<DataBuf> {
        &mut self.node.res[self.r].data
    }

    fn disk(&mut self, op: DiskRequest, ctx: &Ctx<'_>, then: &mut Vec<RAction>) {
        let a = DiskAction {
            r: self.r,
            volume: op.volume,
            token: op.token,
            kind: op.kind,
        };
        self.node.disk(a, op.data, ctx, then);
    }

    fn send(&mut self, peer: NodeId, msg: Msg, ctx: &Ctx<'_>) {
        self.node.send(self.r, peer, msg, ctx);
    }

    fn complete(
        &mut self,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        ctx: &Ctx<'_>,
    ) {
        self.node.complete(self.r, req, result, data, ctx);
    }

    fn disconnect(&mut self, peer: NodeId, reason: LinkLoss) {
        self.node.disconnect(self.r, peer, reason);
    }

    fn settled(&mut self, peer: NodeId, conn: u32, upto: u64) {
        self.node.al_settled(self.r, peer, conn, upto);
    }

    fn write_settled(&mut self, req: ReqId, volume: u16) {
        self.node.al_write_settled(self.r, req, volume);
    }

    fn split_brain(&mut self, f: SplitBrain) {
        let r = self.r;
        self.node.split_brain(r, f);
    }

    fn event(&mut self, e: Event) {
        if matches!(
            e,
            Event::DiskChanged { .. }
                | Event::RoleChanged { .. }
                | Event::GenerationChanged { .. }
                | Event::GenerationSetBack { .. }
                | Event::GenerationAcked { .. }
                | Event::GenerationAbandoned { .. }
                | Event::WriterChanged { .. }
                | Event::BitmapGiChanged { .. }
        ) {
            // Before any write that follows in these actions.
            self.node.al_state_changed(self.r);
        }
        if let Event::SplitBrainResolved { .. } = e {
            return self.node.split_brain_resolved(self.r, &e);
        }
        let name = &self.node.res[self.r].cfg.name;
        if e.is_detail() {
            debug!(resource = %name, "{e}");
        } else {
            info!(resource = %name, "{e}");
            self.node.touch(self.r);
        }
        if let Event::DiskChanged {
            volume, to, why, ..
        } = e
        {
            self.node.time_resync(self.r, volume, to, &why);
        }
    }
}
