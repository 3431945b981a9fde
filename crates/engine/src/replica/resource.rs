//! One replicated resource as its local node sees it: the dispatcher over the rooms.
//!
//! Each event (an application request, a disk completion, a packet, a peer going up or
//! down, the clock, an administrator verb) is routed to the rooms that own its state —
//! `writes` (the Primary's write ordering), `reads`, `barriers` (durability), `apply`
//! (a receiving replica's disk queue), `peer` (each peer's connection, what it lacks and
//! our list of it), `resync` (a sync target's progress), `local` (our replica) — and what
//! one room's outcome means for another is decided here, in one place.
//!
//! The write path: the Primary writes locally (if it has a replica) and sends the write to
//! every connected diskful peer; the application's write completes when the local write is
//! done and every targeted peer satisfies the protocol (A: sent, B: received, C: written).
//! FLUSH and FUA become a barrier on every replica. Out-of-sync tracking: every write a
//! peer may lack sets bits in that peer's bitmap; on reconnect, the up-to-date side lists
//! those ranges to the peer, which pulls them in block order.

use super::action::{PromoteError, RAction};
use super::apply::WaitingRead;
use super::barriers::{Barriers, FlushOp, FlushWaiter};
use super::bitmap::{Bitmap, BLOCK};
use super::local::LocalVol;
use super::msg::{DataRef, Msg, Token};
use super::nodeset::NodeSet;
use super::peer::{out_of_sync, ListState, Peer, Peers, Timer, Unacked};
use super::reads::Reads;
use super::resync::Resync;
use super::spec::{NodeId, Protocol, ReplicaAtStart, ResourceSpec};
use super::status::{PeerStatus, PeerVolumeStatus, Repl, Status, VolumeStatus};
use super::writes::{AppWrite, Next, Shape, Stage, Writes};
use crate::io::{DiskKind, Io, IoError, ReqId};
use tandem_wire::packet::{volume_flags, write_flags as wf, Packet};
use tandem_wire::packet::{DiskState, Role};
use tandem_wire::Errno;

mod invariants;

const EIO: u32 = Errno::Io.code();
const EAGAIN: u32 = Errno::Again.code();

/// The replicated engine of one resource on one node.
#[derive(Debug)]
pub struct Resource {
    spec: ResourceSpec,
    role: Role,
    vols: Vec<LocalVol>,
    peers: Peers,
    writes: Writes,
    reads: Reads,
    barriers: Barriers,
    next_id: u64,
    now_ms: u64,
}

impl Resource {
    /// `found` says per volume what the driver found of the local replica at start; the
    /// engine derives the initial disk state from it (see [`ReplicaAtStart`]).
    pub fn new(spec: ResourceSpec, found: Vec<ReplicaAtStart>) -> Resource {
        assert_eq!(
            found.len(),
            spec.sizes.len(),
            "one initial replica state per volume"
        );
        assert!(
            spec.nodes.iter().all(|(id, _)| u32::from(*id) < 32),
            "node ids are below 32"
        );
        let me = spec
            .nodes
            .iter()
            .find(|(id, _)| *id == spec.me)
            .expect("this node is in the resource");
        let vols = spec
            .sizes
            .iter()
            .zip(&found)
            .enumerate()
            .map(|(v, (&size, &found))| {
                assert_eq!(
                    me.1[v],
                    found != ReplicaAtStart::None,
                    "volume {v}: no replica exactly when the node keeps none"
                );
                let alone = !spec
                    .nodes
                    .iter()
                    .any(|(id, replicas)| *id != spec.me && replicas[v]);
                LocalVol::at_start(size, found, alone)
            })
            .collect();
        let peers = spec
            .nodes
            .iter()
            .filter(|(id, _)| *id != spec.me)
            .map(|(id, diskful)| Peer::new(*id, diskful, &spec.sizes))
            .collect();
        Resource {
            writes: Writes::new(spec.sizes.len()),
            spec,
            role: Role::Secondary,
            vols,
            peers: Peers::new(peers),
            reads: Reads::default(),
            barriers: Barriers::default(),
            next_id: 1,
            now_ms: 0,
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn me(&self) -> NodeId {
        self.spec.me
    }

    pub fn disk(&self, volume: u16) -> DiskState {
        self.vols[volume as usize].disk
    }

    /// Application requests in flight.
    pub fn app_in_flight(&self) -> usize {
        self.writes.len() + self.reads.len() + self.barriers.requests()
    }

    pub fn status(&self) -> Status {
        let volumes = self.vols.iter().enumerate().map(|(v, vol)| VolumeStatus {
            disk: vol.disk,
            size: vol.size,
            writes_in_flight: self.writes.in_flight(v),
            resync_remaining: vol.resync.as_ref().map(Resync::remaining),
            up_to_date_within_reach: self.up_to_date_within_reach(v),
        });
        let peers = self.peers.iter().map(|p| PeerStatus {
            id: p.id,
            connected: p.up,
            role: p.role,
            unacked: p.unacked.len(),
            volumes: p
                .vols
                .iter()
                .map(|pv| PeerVolumeStatus {
                    disk: pv.disk,
                    repl: pv.repl,
                    out_of_sync_bytes: pv.oos.count() * pv.oos.block_size(),
                })
                .collect(),
        });
        Status {
            role: self.role,
            volumes: volumes.collect(),
            peers: peers.collect(),
            app_in_flight: self.app_in_flight(),
        }
    }

    /// This node's replica of volume `v` or a connected peer's is UpToDate: reads can be
    /// served and writes vouched for.
    fn up_to_date_within_reach(&self, v: usize) -> bool {
        self.vols[v].up_to_date() || self.peers.up_to_date(v)
    }

    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    // ------------------------------------------------------------------ roles

    /// Makes this node Primary. Refused while another node is Primary, or when a volume has
    /// no up-to-date replica within reach. `force` declares this node's own replicas up to
    /// date first (the administrator's choice of a sync source, as with DRBD's
    /// `primary --force`).
    pub fn promote(&mut self, force: bool, out: &mut Vec<RAction>) -> Result<(), PromoteError> {
        if self.role == Role::Primary {
            return Ok(());
        }
        if let Some(p) = self.peers.primary() {
            return Err(PromoteError::PeerPrimary(p));
        }
        if force {
            for v in 0..self.vols.len() {
                let vol = &mut self.vols[v];
                if vol.diskful && matches!(vol.disk, DiskState::Outdated | DiskState::Inconsistent)
                {
                    vol.resync = None;
                    let note = format!("volume {v}: forced UpToDate by the administrator");
                    self.set_disk(v, DiskState::UpToDate, note, out);
                    self.offer_to_outdated(v, out);
                }
            }
        }
        if let Some(v) = (0..self.vols.len()).find(|&v| !self.up_to_date_within_reach(v)) {
            return Err(PromoteError::NoUpToDate(v as u16));
        }
        self.role = Role::Primary;
        out.push(RAction::Note("promoted to Primary".into()));
        self.peers.broadcast(Msg::Role(Role::Primary), out);
        Ok(())
    }

    /// Makes this node Secondary; refused while application requests are in flight.
    pub fn demote(&mut self, out: &mut Vec<RAction>) -> Result<(), String> {
        if self.role == Role::Secondary {
            return Ok(());
        }
        if self.app_in_flight() > 0 {
            return Err(format!(
                "{} application requests in flight",
                self.app_in_flight()
            ));
        }
        self.role = Role::Secondary;
        out.push(RAction::Note("demoted to Secondary".into()));
        self.peers.broadcast(Msg::Role(Role::Secondary), out);
        Ok(())
    }

    /// Whether any connected peer is Primary.
    pub fn peer_primary(&self) -> Option<NodeId> {
        self.peers.primary()
    }

    // ------------------------------------------------------------------ application I/O

    /// A new application request on `volume`, already validated by the frontend.
    pub fn submit(&mut self, req: ReqId, volume: u16, io: Io, out: &mut Vec<RAction>) {
        self.submit_event(req, volume, io, out);
        self.debug_check();
    }

    fn submit_event(&mut self, req: ReqId, volume: u16, io: Io, out: &mut Vec<RAction>) {
        let complete = |result| RAction::Complete {
            req,
            result,
            data: None,
        };
        if self.role != Role::Primary {
            return out.push(complete(Err(IoError::ReadOnly)));
        }
        let v = volume as usize;
        match io {
            Io::Read { offset, len } => {
                self.reads.begin(req, volume, offset, len);
                self.route_read(req, out);
            }
            Io::Cache { .. } => out.push(complete(Ok(()))),
            Io::Flush => self.start_barrier(vec![(req, volume)], out),
            // No replica can promise that every other one zeroes fast too, and a zero done
            // on some replicas and refused on others would make them differ.
            Io::Zero { fast: true, .. } => out.push(complete(Err(IoError::NotFast))),
            Io::Write { offset, len, .. }
            | Io::Trim { offset, len, .. }
            | Io::Zero { offset, len, .. } => {
                // Writes need a replica that is current somewhere.
                if !self.up_to_date_within_reach(v) {
                    return out.push(complete(Err(IoError::NoData)));
                }
                let (o, l) = (offset, u64::from(len));
                if self.writes.must_wait(v, o, l) {
                    if matches!(io, Io::Write { .. }) {
                        out.push(RAction::Retain {
                            from: DataRef::Request(req),
                            key: Token::App(req),
                        });
                    }
                    return self.writes.queue(v, req, io, o, l);
                }
                self.start_write(req, volume, io, DataRef::Request(req), out);
            }
        }
    }

    fn start_write(
        &mut self,
        req: ReqId,
        volume: u16,
        io: Io,
        data: DataRef,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        let seq = self.writes.next_seq();
        let shape = Shape::of(io);
        let local = self.vols[v].takes_writes();
        let mut w = AppWrite::new(volume, &shape, local);
        if local {
            self.data_arrives(v, out);
            let data = matches!(shape.kind, DiskKind::Write { .. }).then_some(data);
            // A Primary being synced: a resync write to this range may be on its way to
            // the disk, and disks complete in any order, so this newer write waits for it
            // (else the older resync data may land last: simulator seed 40014553, a new
            // cluster's Primary still pulling).
            let token = Token::App(req);
            self.vols[v]
                .apply
                .write(volume, token, shape.kind, data, false, out);
        }
        self.replicate(req, &shape, &mut w, seq, data, out);
        self.writes.begin(req, w);
        self.check_write(req, out);
    }

    /// Sends a new write to every connected diskful peer; the others missed it.
    fn replicate(
        &mut self,
        req: ReqId,
        shape: &Shape,
        w: &mut AppWrite,
        seq: u64,
        data: DataRef,
        out: &mut Vec<RAction>,
    ) {
        let (volume, v) = (w.volume, w.volume as usize);
        let local = w.local != Stage::NotApplicable;
        // Protocol A completes a write once it is in the send buffer, which is safe only
        // because the local replica has it. Without one, wait for receipt (protocol B).
        let protocol = match self.spec.protocol {
            Protocol::A if !local => Protocol::B,
            p => p,
        };
        let mut targets = if local {
            NodeSet::one(self.spec.me)
        } else {
            NodeSet::EMPTY
        };
        for p in self.peers.up().filter(|p| p.vols[v].diskful) {
            targets.insert(p.id);
        }
        // Receipt is always acknowledged (protocol B completes on it); it does not make
        // the write in sync there: the peer may die before writing it (see peer_down).
        let mut flags = wf::ACK_WRITE | shape.flags | wf::ACK_RECV;
        if shape.fua {
            flags |= wf::FUA;
        }
        let msg = shape.msg(volume, seq, flags, targets.bits(), data);
        let now = self.now_ms;
        for p in self.peers.iter_mut().filter(|p| p.vols[v].diskful) {
            if !p.up {
                w.missing.insert(p.id);
                continue;
            }
            out.push(RAction::Send { peer: p.id, msg });
            let (offset, len, sent_ms) = (shape.offset, shape.len, now);
            let unacked = Unacked {
                volume,
                offset,
                len,
                sent_ms,
                req,
            };
            p.unacked.insert(seq, unacked);
            if protocol == Protocol::A {
                w.peers_ok.insert(p.id);
            } else {
                w.peers_pending.insert(p.id);
                p.app_waiting.insert(seq, req);
            }
        }
    }

    fn check_write(&mut self, req: ReqId, out: &mut Vec<RAction>) {
        match self.writes.next(req) {
            Next::Wait => {}
            Next::Barrier(volume) => self.start_barrier(vec![(req, volume)], out),
            Next::Finish(result) => self.finish_write(req, result, out),
        }
    }

    fn finish_write(&mut self, req: ReqId, result: Result<(), IoError>, out: &mut Vec<RAction>) {
        let w = self.writes.end(req);
        let v = w.volume as usize;
        let size = self.vols[v].size;
        let (landed, (offset, len)) = (w.landed(), (w.offset, u64::from(w.len)));
        for p in self.peers.iter_mut() {
            let up = p.up;
            let pv = &mut p.vols[v];
            // Written as Primary without it: if it was Primary apart from us too, this
            // is half of a split brain (a diskless one holds none of it, but its own
            // writes went to replicas that lack ours).
            let missed = w.missing.contains(p.id);
            if result.is_ok() && (missed || (!pv.diskful && !up)) {
                pv.apart
                    .get_or_insert_with(|| Bitmap::new(size))
                    .set_range(offset, len);
            }
            // A failed write may still have landed on some replica (simulator seed
            // 3017270: written on a Secondary being synced, whose flush could not vouch
            // for it, while the other was cut off), so the replicas that missed it differ.
            if landed && missed {
                pv.oos.set_range(offset, len);
                if pv.list == ListState::Sent {
                    pv.list = ListState::Stale;
                }
            }
        }
        // Lists that waited for this write to mark its bits.
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            if p.up && p.vols[v].list == ListState::Deferred && !self.writes.missing(v, p.id) {
                self.send_list(i, v, out);
            }
        }
        out.push(RAction::Complete {
            req,
            result,
            data: None,
        });
        self.start_ready_writes(w.volume, out);
    }

    /// A waiting write that fails at once never enters the in-flight set, so the writes
    /// queued behind it are free to go too: ask again until nothing more is ready (once
    /// was not enough: the third of three overlapping writes waited forever after the
    /// last replica went away, and its client hung).
    fn start_ready_writes(&mut self, volume: u16, out: &mut Vec<RAction>) {
        let v = volume as usize;
        loop {
            let ready = self.writes.ready(v);
            if ready.is_empty() {
                break;
            }
            for (r, io) in ready {
                if self.role != Role::Primary || !self.up_to_date_within_reach(v) {
                    out.push(RAction::Complete {
                        req: r,
                        result: Err(IoError::NoData),
                        data: None,
                    });
                    continue;
                }
                let data = DataRef::Held {
                    key: Token::App(r),
                    at: 0,
                };
                self.start_write(r, volume, io, data, out);
            }
        }
    }

    /// Sends a read to the local replica if it is up to date, else to an up-to-date peer
    /// (round robin), else fails it.
    fn route_read(&mut self, req: ReqId, out: &mut Vec<RAction>) {
        let r = self.reads.get(req).expect("routing an unknown read");
        let v = r.volume as usize;
        let (volume, offset, len) = (r.volume, r.offset, r.len);
        if self.vols[v].disk == DiskState::UpToDate {
            self.reads.read_locally(req);
            let kind = DiskKind::Read { offset, len };
            return out.push(RAction::Disk {
                volume,
                token: Token::App(req),
                kind,
                data: None,
            });
        }
        // A peer says UpToDate until it hears what it missed: never read from it where we
        // know it lacks writes.
        let candidates: Vec<NodeId> = self
            .peers
            .up()
            .filter(|p| {
                p.vols[v].disk == Some(DiskState::UpToDate)
                    && !p.vols[v].oos.any_in(offset, u64::from(len))
                    && !self.reads.tried(req, p.id)
            })
            .map(|p| p.id)
            .collect();
        if candidates.is_empty() {
            self.reads.end(req);
            return out.push(RAction::Complete {
                req,
                result: Err(IoError::NoData),
                data: None,
            });
        }
        let peer = self.reads.ask_one_of(req, &candidates);
        let id = self.alloc_id();
        let i = self.peers.index(peer).expect("a candidate is a peer");
        self.peers[i].reads_out.insert(id, req);
        let msg = Msg::ReadReq {
            volume,
            id,
            offset,
            len,
        };
        out.push(RAction::Send { peer, msg });
    }

    // ------------------------------------------------------------------ durability

    /// Whether a completed barrier makes volume `v` durable. A replica that flushed says
    /// nothing about a volume it does not keep (with volumes on different nodes, our
    /// fdatasync of volume 0 must not answer for volume 1), nor about one it is still
    /// syncing: that one is flushed too, but may lack a write only a replica gone meanwhile
    /// had. So only a replica UpToDate now answers: a peer's state reaches us in order with
    /// its acknowledgement, and one that finished its resync first flushed all it pulled.
    fn barrier_answers_for(&self, v: usize, local_ok: bool, peers_ok: NodeSet) -> bool {
        (local_ok && self.vols[v].up_to_date())
            || self.peers.up().any(|p| {
                peers_ok.contains(p.id)
                    && p.vols[v].diskful
                    && p.vols[v].disk == Some(DiskState::UpToDate)
            })
    }

    /// Starts a barrier over every replica for these waiters.
    fn start_barrier(&mut self, waiters: Vec<(ReqId, u16)>, out: &mut Vec<RAction>) {
        let id = self.alloc_id();
        let mut op = FlushOp {
            waiters,
            ..FlushOp::default()
        };
        if self.vols.iter().any(LocalVol::takes_writes) {
            op.local_pending = true;
            self.flush_locally(FlushWaiter::Op(id), out);
        }
        for p in self.peers.iter_mut() {
            if p.up && p.vols.iter().any(|pv| pv.diskful) {
                op.peers_pending.insert(p.id);
                p.barriers_out.insert(id, id);
                let msg = Msg::Barrier { id };
                out.push(RAction::Send { peer: p.id, msg });
            }
        }
        self.barriers.open(id, op);
        self.check_flush(id, out);
    }

    fn check_flush(&mut self, id: u64, out: &mut Vec<RAction>) {
        let Some(op) = self.barriers.take_done(id) else {
            return;
        };
        for (req, volume) in op.waiters {
            let result = if self.barrier_answers_for(volume as usize, op.local_ok, op.peers_ok) {
                Ok(())
            } else {
                Err(IoError::Os(EIO as i32))
            };
            if self.writes.contains(req) {
                self.finish_write(req, result, out);
            } else {
                out.push(RAction::Complete {
                    req,
                    result,
                    data: None,
                });
            }
        }
    }

    fn flush_locally(&mut self, waiter: FlushWaiter, out: &mut Vec<RAction>) {
        let key = self.alloc_id();
        self.barriers.flush_locally(key, waiter, out);
    }

    /// The local fdatasync `seq` finished: answers everyone it covered.
    fn flushed(&mut self, seq: u64, ok: bool, out: &mut Vec<RAction>) {
        if !ok {
            for v in 0..self.vols.len() {
                if self.vols[v].diskful {
                    self.local_disk_failed(v, "fdatasync failed", out);
                }
            }
        }
        let (waiters, next) = self.barriers.flushed(seq);
        for waiter in waiters {
            match waiter {
                FlushWaiter::Op(id) => {
                    self.barriers.local_answered(id, ok);
                    self.check_flush(id, out);
                }
                FlushWaiter::PeerBarrier { peer, id } => {
                    let errno = if ok { 0 } else { EIO };
                    let msg = Msg::BarrierAck { id, errno };
                    out.push(RAction::Send { peer, msg });
                }
                FlushWaiter::ResyncDone { volume } => self.resync_finished(volume, ok, out),
            }
        }
        self.barriers.issue_next(next, out);
    }

    // ------------------------------------------------------------------ disk completions

    /// A disk operation issued with [`RAction::Disk`] finished.
    pub fn disk_done(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        self.disk_done_event(volume, token, kind, result, out);
        self.debug_check();
    }

    fn disk_done_event(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        match token {
            Token::App(req) => self.app_io_done(v, req, kind, result, out),
            Token::Flush(seq) => self.flushed(seq, result.is_ok(), out),
            Token::PeerWrite { peer, conn, seq } => {
                self.vols[v].apply.landed(kind.offset(), token);
                let msg = match result {
                    Ok(()) => Msg::WriteAck { seq },
                    Err(e) => {
                        self.local_disk_failed(v, &format!("replicated write failed: {e:?}"), out);
                        Msg::NegAck { seq, errno: EIO }
                    }
                };
                if let Some(i) = self
                    .peers
                    .index(peer)
                    .filter(|&i| self.peers[i].conn == conn)
                {
                    self.peers[i].rx_pending.remove(&seq);
                    if self.peers[i].up {
                        out.push(RAction::Send { peer, msg });
                    }
                    self.process_barriers_in(i, out);
                }
                self.release_applying(v, out);
            }
            Token::PeerRead { .. } | Token::ResyncRead { .. } => {
                self.peer_read_done(volume, token, kind, result, out)
            }
            Token::ResyncWrite { .. } => {
                self.vols[v].apply.landed(kind.offset(), token);
                if let Some(rs) = self.vols[v].resync.as_mut() {
                    rs.writes_pending -= 1;
                }
                if result.is_err() {
                    self.local_disk_failed(v, "resync write failed", out);
                }
                self.release_applying(v, out);
                self.pump_resync(volume, out);
            }
        }
    }

    /// An application read or write of ours finished on the local replica.
    fn app_io_done(
        &mut self,
        v: usize,
        req: ReqId,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let token = Token::App(req);
        if let Some(r) = self.reads.get(req) {
            debug_assert!(r.from.is_none());
            return match result {
                Ok(()) => {
                    self.reads.end(req);
                    out.push(RAction::Complete {
                        req,
                        result: Ok(()),
                        data: Some(DataRef::Disk(token)),
                    })
                }
                Err(e) => {
                    self.local_disk_failed(v, &format!("read failed: {e:?}"), out);
                    self.route_read(req, out)
                }
            };
        }
        if self.vols[v].apply.landed(kind.offset(), token) {
            // It had waited for a resync write (see `start_write`).
            self.release_applying(v, out);
        }
        let Some(w) = self.writes.get_mut(req) else {
            return;
        };
        w.local = Stage::Done(result.is_ok());
        if let Err(e) = result {
            self.local_disk_failed(v, &format!("write failed: {e:?}"), out);
        }
        self.check_write(req, out);
    }

    /// A read we did for a peer (a read or a resync read) finished: answer it.
    fn peer_read_done(
        &mut self,
        volume: u16,
        token: Token,
        kind: DiskKind,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        let (Token::PeerRead { peer, conn, id } | Token::ResyncRead { peer, conn, id }) = token
        else {
            unreachable!("a peer read's token")
        };
        let DiskKind::Read { offset, len } = kind else {
            unreachable!("a peer read is a read")
        };
        let current = self.peers.on_conn(peer, conn);
        let resync = matches!(token, Token::ResyncRead { .. });
        // A source may learn it lacks the range while the read runs (a peer that
        // connected meanwhile lists it, or has not ended its list yet): then the
        // data it read is not to be trusted, and the target asks again (simulator
        // seed 60017710: a replica cut off from the Primary served a stale block
        // to a restarted one, which overwrote its own newer copy).
        let stale = resync && !self.has_range(v, offset, u64::from(len));
        let (errno, data) = match result {
            Ok(()) if stale => (EAGAIN, None),
            Ok(()) => (0, Some(DataRef::Disk(token))),
            Err(_) => (EIO, None),
        };
        if let (true, Ok(()), Some(i), false) = (resync, result, current, stale) {
            // The peer pulls this range now; if it misses it, it asks again. Not
            // if the connection that asked is gone: the reply goes nowhere, and
            // the range may hold writes made since (simulator seed 30028803: a
            // write the peer missed while away was forgotten).
            self.peers[i].vols[v]
                .oos
                .clear_range(offset, u64::from(len));
        }
        let msg = if resync {
            Msg::ResyncReply {
                volume,
                id,
                offset,
                errno,
                len,
                data,
            }
        } else {
            Msg::ReadReply {
                id,
                errno,
                len,
                data,
            }
        };
        if current.is_some() {
            out.push(RAction::Send { peer, msg });
        }
    }

    fn local_disk_failed(&mut self, v: usize, why: &str, out: &mut Vec<RAction>) {
        if !self.vols[v].attached() {
            return;
        }
        // Like DRBD's on-io-error detach: stop using a replica that failed; the application
        // carries on with the peers.
        self.vols[v].resync = None;
        let note = format!("volume {v}: local replica failed ({why}); detached");
        self.set_disk(v, DiskState::Diskless, note, out);
    }

    /// Changes a volume's disk state and tells the log and every connected peer.
    fn set_disk(&mut self, v: usize, disk: DiskState, note: String, out: &mut Vec<RAction>) {
        self.set_disk_logged(v, disk, note, false, out);
    }

    /// `set_disk`, the line logged as a `Detail` (debug) if `detail`, else as a `Note`.
    fn set_disk_logged(
        &mut self,
        v: usize,
        disk: DiskState,
        note: String,
        detail: bool,
        out: &mut Vec<RAction>,
    ) {
        self.vols[v].set_disk(disk);
        out.push(if detail {
            RAction::Detail(note)
        } else {
            RAction::Note(note)
        });
        self.broadcast_volume(v, out);
    }

    /// Our state of volume `v`, as told to the peer at index `i`.
    fn volume_msg(&self, i: usize, v: usize) -> Msg {
        self.vols[v].msg(v as u16, self.peers[i].vols[v].wrote_apart())
    }

    fn broadcast_volume(&self, v: usize, out: &mut Vec<RAction>) {
        for (i, p) in self.peers.iter().enumerate().filter(|(_, p)| p.up) {
            out.push(RAction::Send {
                peer: p.id,
                msg: self.volume_msg(i, v),
            });
        }
    }

    /// Data reaches a replica created empty at start: it no longer holds nothing, so it
    /// must not count towards a new cluster (see [`Resource::fresh_cluster`]).
    fn data_arrives(&mut self, v: usize, out: &mut Vec<RAction>) {
        if self.vols[v].created {
            self.vols[v].created = false;
            self.broadcast_volume(v, out);
        }
    }

    /// Starts peer writes (and serves peer reads) that waited for an overlapping one.
    fn release_applying(&mut self, v: usize, out: &mut Vec<RAction>) {
        for read in self.vols[v].apply.release(v as u16, out) {
            // A request of a connection that has since gone is forgotten by the peer.
            if self.peers.on_conn(read.peer, read.conn).is_some() {
                self.serve_read(v as u16, read, out);
            }
        }
    }

    // ------------------------------------------------------------------ peers

    /// An authenticated connection to `peer` is up.
    pub fn peer_up(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        self.peer_up_event(peer, out);
        self.debug_check();
    }

    fn peer_up_event(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        let Some(i) = self.peers.index(peer) else {
            return;
        };
        self.peers[i].connected(self.now_ms);
        for (v, vol) in self.vols.iter_mut().enumerate() {
            if vol.resync.as_mut().is_some_and(|rs| rs.list_cut(peer)) {
                out.push(RAction::Note(format!(
                    "volume {v}: list from node {peer} was interrupted; full resync"
                )));
            }
        }
        out.push(RAction::Send {
            peer,
            msg: Msg::Role(self.role),
        });
        for v in 0..self.vols.len() {
            out.push(RAction::Send {
                peer,
                msg: self.volume_msg(i, v),
            });
        }
    }

    /// The connection to `peer` is gone (closed, failed, timed out or dropped by us).
    pub fn peer_down(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        self.peer_down_event(peer, out);
        self.debug_check();
    }

    fn peer_down_event(&mut self, peer: NodeId, out: &mut Vec<RAction>) {
        let Some(i) = self.peers.index(peer).filter(|&i| self.peers[i].up) else {
            return;
        };
        let orphans = self.peers[i].disconnected();
        // Everything not confirmed written there may be missing there: even a write it
        // received (protocol B's acknowledgement) is lost if the link dropped because the
        // node died before writing it (simulator seed 5001807: the only other replica
        // then pulled the range back from the one that had lost it, and an acknowledged
        // write was gone). Like DRBD, only a write acknowledgement counts.
        for u in orphans.unacked.into_values() {
            match self.writes.get_mut(u.req) {
                Some(w) => w.missing.insert(peer),
                // Completed (protocol A/B): it is on some replica, and maybe not on this one.
                None => self.peers[i].vols[u.volume as usize]
                    .oos
                    .set_range(u.offset, u64::from(u.len)),
            }
        }
        out.push(RAction::Note(format!("connection to node {peer} lost")));
        for (_, req) in orphans.app_waiting {
            self.writes.answered(req, peer, false);
            self.check_write(req, out);
        }
        for (id, _) in orphans.barriers_out {
            self.barriers.peer_answered(id, peer, false);
            self.check_flush(id, out);
        }
        for (_, req) in orphans.reads_out {
            if self.reads.get(req).is_some() {
                self.route_read(req, out);
            }
        }
        for (v, vol) in self.vols.iter_mut().enumerate() {
            if vol.resync.as_mut().is_some_and(|rs| rs.source_lost(peer)) {
                out.push(RAction::Note(format!(
                    "volume {v}: resync from node {peer} interrupted"
                )));
            }
        }
    }

    /// A packet from an authenticated peer. A packet that breaks the protocol drops the
    /// connection (never the node).
    pub fn packet(&mut self, peer: NodeId, packet: &Packet<'_>, out: &mut Vec<RAction>) {
        self.packet_event(peer, packet, out);
        self.debug_check();
    }

    fn packet_event(&mut self, peer: NodeId, packet: &Packet<'_>, out: &mut Vec<RAction>) {
        let Some(i) = self.peers.index(peer).filter(|&i| self.peers[i].up) else {
            return;
        };
        self.peers[i].last_rx_ms = self.now_ms;
        if let Err(reason) = self.handle(i, packet, out) {
            out.push(RAction::Disconnect {
                peer,
                reason: reason.clone(),
            });
            out.push(RAction::Note(format!(
                "protocol error from node {peer}: {reason}"
            )));
            self.peer_down(peer, out);
        }
    }

    fn check_range(&self, volume: u16, offset: u64, len: u64) -> Result<usize, String> {
        let v = volume as usize;
        let vol = self
            .vols
            .get(v)
            .ok_or_else(|| format!("unknown volume {volume}"))?;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > vol.size) {
            return Err(format!(
                "range {offset}+{len} outside volume {volume} of {} bytes",
                vol.size
            ));
        }
        Ok(v)
    }

    /// Routes a packet to the room it is about.
    fn handle(
        &mut self,
        i: usize,
        packet: &Packet<'_>,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let peer = self.peers[i].id;
        match *packet {
            Packet::Role { role } => {
                if role == Role::Primary && self.role == Role::Primary {
                    return Err("both nodes are Primary".into());
                }
                self.peers[i].role = role;
            }
            Packet::Volume {
                volume,
                size,
                disk,
                flags,
            } => self.on_volume(i, volume, size, disk, flags, out)?,
            Packet::Write {
                volume,
                seq,
                offset,
                flags,
                targets,
                data,
            } => {
                let v = self.check_range(volume, offset, data.len() as u64)?;
                let kind = DiskKind::Write {
                    offset,
                    len: data.len() as u32,
                };
                self.receive_write(i, v, seq, flags, targets, kind, out)?;
            }
            Packet::Zero {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
            } => {
                let v = self.check_range(volume, offset, u64::from(len))?;
                let kind = DiskKind::Zero {
                    offset,
                    len,
                    may_punch: flags & wf::MAY_PUNCH != 0,
                    fast: false,
                };
                self.receive_write(i, v, seq, flags, targets, kind, out)?;
            }
            Packet::RecvAck { seq } => {
                // Satisfies a write waiting under protocol B (including protocol A writes of
                // a diskless Primary, see start_write); for others nothing waits on it.
                if self.spec.protocol != Protocol::C {
                    self.peer_satisfied(i, seq, true, out);
                }
            }
            Packet::WriteAck { seq } => self.on_write_ack(i, seq, true, out)?,
            Packet::NegAck { seq, .. } => self.on_write_ack(i, seq, false, out)?,
            Packet::Barrier { id } => {
                let last = self.peers[i].rx_last_seq;
                self.peers[i].barriers_in.push_back((id, last));
                self.process_barriers_in(i, out);
            }
            Packet::BarrierAck { id, errno } => {
                if self.peers[i].barriers_out.remove(&id).is_none() {
                    return Err(format!("acknowledgement of unknown barrier {id}"));
                }
                self.barriers.peer_answered(id, peer, errno == 0);
                self.check_flush(id, out);
            }
            Packet::ReadReq {
                volume,
                id,
                offset,
                len,
            }
            | Packet::ResyncReq {
                volume,
                id,
                offset,
                len,
            } => {
                self.check_range(volume, offset, u64::from(len))?;
                let resync = matches!(packet, Packet::ResyncReq { .. });
                let conn = self.peers[i].conn;
                let ask = WaitingRead {
                    peer,
                    conn,
                    id,
                    offset,
                    len,
                    resync,
                };
                self.serve_read(volume, ask, out);
            }
            Packet::ReadReply { id, errno, data } => {
                self.on_read_reply(i, id, errno, data.len(), out)?
            }
            Packet::ResyncReply {
                volume,
                id,
                offset,
                errno,
                data,
            } => self.resync_reply(i, volume, id, offset, errno, data.len(), out)?,
            Packet::OutOfSync {
                volume,
                offset: 0,
                len: 0,
            } => self.on_list_end(i, volume, out)?,
            Packet::OutOfSync {
                volume,
                offset,
                len,
            } => self.on_out_of_sync(i, volume, offset, len, out)?,
            Packet::Ping => out.push(RAction::Send {
                peer,
                msg: Msg::PingAck,
            }),
            Packet::PingAck => self.peers[i].ping_sent_ms = None,
            Packet::SplitBrain {
                volume,
                mine,
                yours,
            } => {
                if volume as usize >= self.vols.len() {
                    return Err(format!("unknown volume {volume}"));
                }
                out.push(RAction::SplitBrain {
                    peer,
                    volume,
                    mine: yours,
                    theirs: mine,
                    reported: true,
                });
            }
            Packet::Error { code, message } => {
                return Err(format!("peer reported error {code}: {message}"));
            }
            Packet::Hello { .. } | Packet::Auth { .. } | Packet::AuthOk => {
                return Err("handshake packet after the handshake".into());
            }
        }
        Ok(())
    }

    /// The peer wrote (`ok`) or failed a write we sent it.
    fn on_write_ack(
        &mut self,
        i: usize,
        seq: u64,
        ok: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let peer = self.peers[i].id;
        let Some(u) = self.peers[i].unacked.remove(&seq) else {
            let what = if ok { "" } else { "negative " };
            return Err(format!("{what}acknowledgement of unknown write {seq}"));
        };
        let oos = &mut self.peers[i].vols[u.volume as usize].oos;
        if ok {
            // It now holds the newest data of every block the write covered whole.
            oos.clear_range(u.offset, u64::from(u.len));
            if self.spec.protocol == Protocol::C {
                self.peer_satisfied(i, seq, true, out);
            }
            return Ok(());
        }
        match self.writes.get_mut(u.req) {
            Some(w) => w.missing.insert(peer),
            None => oos.set_range(u.offset, u64::from(u.len)),
        }
        self.peer_satisfied(i, seq, false, out);
        Ok(())
    }

    fn peer_satisfied(&mut self, i: usize, seq: u64, ok: bool, out: &mut Vec<RAction>) {
        if let Some(req) = self.peers[i].app_waiting.remove(&seq) {
            self.writes.answered(req, self.peers[i].id, ok);
            self.check_write(req, out);
        }
    }

    fn on_read_reply(
        &mut self,
        i: usize,
        id: u64,
        errno: u32,
        data_len: usize,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let Some(req) = self.peers[i].reads_out.remove(&id) else {
            return Err(format!("reply to unknown read {id}"));
        };
        let Some(r) = self.reads.get(req) else {
            return Ok(());
        };
        if errno != 0 {
            self.route_read(req, out);
            return Ok(());
        }
        if data_len != r.len as usize {
            return Err(format!("read reply of {data_len} bytes for {}", r.len));
        }
        self.reads.end(req);
        out.push(RAction::Complete {
            req,
            result: Ok(()),
            data: Some(DataRef::Incoming { at: 0 }),
        });
        Ok(())
    }

    /// The peer told us the state of its replica of a volume.
    fn on_volume(
        &mut self,
        i: usize,
        volume: u16,
        size: u64,
        disk: DiskState,
        flags: u8,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let v = volume as usize;
        let ours = self
            .vols
            .get(v)
            .ok_or_else(|| format!("unknown volume {volume}"))?
            .size;
        if size != ours {
            return Err(format!(
                "volume {volume}: peer has {size} bytes, we have {ours}"
            ));
        }
        let created = flags & volume_flags::CREATED != 0;
        let pv = &mut self.peers[i].vols[v];
        pv.unproven = flags & volume_flags::UNPROVEN != 0;
        pv.peer_wrote_apart = flags & volume_flags::WROTE_APART != 0;
        let before = pv.disk;
        self.peer_volume(i, v, disk, created, out)?;
        // A peer that refused may have what we lack now: ask it again soon.
        let id = self.peers[i].id;
        if let Some(rs) = self.vols[v]
            .resync
            .as_mut()
            .filter(|_| before != Some(disk))
        {
            rs.peer_changed(id);
        }
        // A new state may end a list, or offer a source to pull from.
        self.pump_resync(volume, out);
        Ok(())
    }

    /// Answers barriers whose preceding writes are all written.
    fn process_barriers_in(&mut self, i: usize, out: &mut Vec<RAction>) {
        loop {
            let p = &mut self.peers[i];
            let Some(&(id, last)) = p.barriers_in.front() else {
                return;
            };
            if p.rx_pending.first().is_some_and(|&s| s <= last) {
                return;
            }
            p.barriers_in.pop_front();
            let peer = p.id;
            if self.vols.iter().any(LocalVol::attached) {
                self.flush_locally(FlushWaiter::PeerBarrier { peer, id }, out);
            } else {
                let msg = Msg::BarrierAck { id, errno: EIO };
                out.push(RAction::Send { peer, msg });
            }
        }
    }

    /// A peer's read (or resync read) of our replica.
    fn serve_read(&mut self, volume: u16, ask: WaitingRead, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let WaitingRead {
            peer,
            conn,
            id,
            offset,
            len,
            resync,
        } = ask;
        let serve = if resync {
            self.has_range(v, offset, u64::from(len))
        } else {
            self.vols[v].disk == DiskState::UpToDate
        };
        if !serve {
            let msg = if resync {
                // Not an error: we lack it too for now; the target asks elsewhere or later.
                let (errno, data) = (EAGAIN, None);
                Msg::ResyncReply {
                    volume,
                    id,
                    offset,
                    errno,
                    len,
                    data,
                }
            } else {
                let (errno, data) = (EIO, None);
                Msg::ReadReply {
                    id,
                    errno,
                    len,
                    data,
                }
            };
            return out.push(RAction::Send { peer, msg });
        }
        // A read must see every write that reached us before it: wait for overlapping ones.
        if self.vols[v].apply.busy(offset, u64::from(len)) {
            return self.vols[v].apply.wait_read(ask);
        }
        let token = if resync {
            Token::ResyncRead { peer, conn, id }
        } else {
            Token::PeerRead { peer, conn, id }
        };
        out.push(RAction::Disk {
            volume,
            token,
            kind: DiskKind::Read { offset, len },
            data: None,
        });
    }

    // ------------------------------------------------------------------ out of sync, resync

    /// The peer told us the state of its replica of volume `v`: decide who syncs whom.
    fn peer_volume(
        &mut self,
        i: usize,
        v: usize,
        disk: DiskState,
        created: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let was = self.peers[i].vols[v].disk.replace(disk);
        let mine = self.vols[v].disk;
        let pv = &mut self.peers[i].vols[v];
        pv.created =
            created && pv.diskful && matches!(disk, DiskState::Inconsistent | DiskState::UpToDate);
        if !pv.diskful || disk == DiskState::Diskless {
            pv.repl = Repl::Established;
            return Ok(());
        }
        if disk == DiskState::UpToDate
            && was.is_some_and(|w| w != DiskState::UpToDate)
            && pv.list == ListState::Sent
        {
            // It finished a resync after our complete list: all of it is there now. (Bits
            // set after the list stay until a later list or write covers them.)
            pv.oos.clear_range(0, self.vols[v].size);
            pv.repl = Repl::Established;
        }
        if mine == DiskState::UpToDate && pv.needs_everything() {
            // Its currency is unknown (it restarted), or it holds nothing (created empty):
            // it needs everything.
            pv.oos.set_all();
        }
        if was.is_none() {
            // List what it lacks from us (writes made while it was away, or everything),
            // and end the list even when empty: then it knows all it lacks. Diskless
            // Primaries list too: they know what they wrote; the peer pulls from a replica.
            // Writes still in flight that missed it mark their bits when they complete, so
            // the list waits for them.
            if self.writes.missing(v, self.peers[i].id) {
                self.peers[i].vols[v].list = ListState::Deferred;
            } else {
                self.send_list(i, v, out);
            }
        }
        if matches!(mine, DiskState::Outdated | DiskState::Inconsistent)
            && disk == DiskState::UpToDate
        {
            self.peers[i].vols[v].repl = Repl::SyncTarget;
            self.pump_resync(v as u16, out);
        }
        self.check_fresh_cluster(v, out);
        Ok(())
    }

    /// Lists the out-of-sync ranges of the peer at index `i` to it, then ends the list.
    fn send_list(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let (id, size) = (self.peers[i].id, self.vols[v].size);
        self.peers[i].vols[v].send_list(id, v, size, out);
    }

    /// A new cluster: our replica of `v` and every other one were created empty at their
    /// nodes' start and have received nothing, and every node keeping one is connected
    /// and has said so. Then all are equal (zeroes) and all are UpToDate without a sync.
    /// Anything less (a node keeping a replica that is down, or one that holds data) and
    /// the created replicas are pulled in full from an up-to-date one instead.
    fn fresh_cluster(&self, v: usize) -> bool {
        self.vols[v].created
            && self
                .peers
                .iter()
                .all(|p| !p.vols[v].diskful || (p.up && p.vols[v].created))
    }

    /// Applies the new-cluster rule once its condition holds.
    fn check_fresh_cluster(&mut self, v: usize, out: &mut Vec<RAction>) {
        if self.vols[v].disk == DiskState::UpToDate || !self.fresh_cluster(v) {
            return;
        }
        if let Some(rs) = self.vols[v].resync.take() {
            // Replies to what we asked for may still come: they are moot, not errors.
            self.vols[v].abandoned.extend(rs.outstanding.keys());
        }
        let size = self.vols[v].size;
        for p in self.peers.iter_mut() {
            let pv = &mut p.vols[v];
            if pv.diskful {
                // They make the same decision from the same facts.
                pv.oos.clear_range(0, size);
                pv.repl = Repl::Established;
            }
        }
        let note = format!(
            "volume {v}: every replica was created empty at its node's start (a new cluster): UpToDate without a sync"
        );
        self.set_disk(v, DiskState::UpToDate, note, out);
    }

    /// The peer's list of what we lack in `volume` ended.
    fn on_list_end(&mut self, i: usize, volume: u16, out: &mut Vec<RAction>) -> Result<(), String> {
        let (v, peer) = (volume as usize, self.peers[i].id);
        let pv = self.peers[i]
            .vols
            .get_mut(v)
            .ok_or_else(|| format!("unknown volume {volume}"))?;
        if let Err((mine, theirs)) = pv.list_ended() {
            let msg = Msg::SplitBrain {
                volume,
                mine,
                yours: theirs,
            };
            out.push(RAction::Send { peer, msg });
            out.push(RAction::SplitBrain {
                peer,
                volume,
                mine,
                theirs,
                reported: false,
            });
            return Ok(());
        }
        if let Some(rs) = self.vols[v].resync.as_mut() {
            rs.lists_open.retain(|&n| n != peer);
        }
        self.pump_resync(volume, out);
        Ok(())
    }

    /// The peer says we lack this range (in its list, or live: a write we missed).
    fn on_out_of_sync(
        &mut self,
        i: usize,
        volume: u16,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let v = self.check_range(volume, offset, u64::from(len))?;
        let peer = self.peers[i].id;
        let pv = &mut self.peers[i].vols[v];
        if self.vols[v].disk == DiskState::UpToDate && (pv.oos.count() > 0 || pv.wrote_apart()) {
            if pv.wrote_apart() || pv.peer_wrote_apart {
                // Each has writes the other lacks, and one of us made them as Primary
                // apart from the other: two Primaries. Count what it lists; at the end of
                // its list, stop (see `SplitBrain`).
                pv.claimed += u64::from(len).div_ceil(BLOCK);
                return Ok(());
            }
            // Each lacks writes of a third node, the Primary, which it missed while apart
            // from it: only that Primary knows which is newer where they overlap. Retry
            // later (the Primary's lists settle it).
            return Err(format!(
                "volume {v}: each replica lacks writes of the Primary that the other has; reconnecting"
            ));
        }
        // After the end of its list, a peer's notices are live: a write we missed.
        let live = pv.listed;
        self.mark_behind(v, peer, offset, u64::from(len), live, out);
        self.pump_resync(volume, out);
        Ok(())
    }

    /// We lack this range (a peer says so): become a sync target for it.
    fn mark_behind(
        &mut self,
        v: usize,
        lister: NodeId,
        offset: u64,
        len: u64,
        live: bool,
        out: &mut Vec<RAction>,
    ) {
        if !self.vols[v].attached() {
            return;
        }
        if self.vols[v].disk != DiskState::Inconsistent {
            let note = if live {
                format!("volume {v}: node {lister} tells of a write we missed; catching up")
            } else {
                format!("volume {v}: node {lister} lists writes we lack; resync needed")
            };
            self.set_disk_logged(v, DiskState::Inconsistent, note, live, out);
        }
        let protect = self
            .peers
            .get(lister)
            .filter(|p| p.role == Role::Primary)
            .map(|p| p.vols[v].written_before_list.as_slice());
        let vol = &mut self.vols[v];
        vol.resync
            .get_or_insert_with(|| Resync::new(vol.size, live))
            .listed(lister, offset, len, live, protect);
    }

    /// Whether our replica holds current data for this range, as far as every connected
    /// peer has told us what we lack: what a resync may copy from us. An up-to-date replica
    /// that has not heard every list yet may lack the range without knowing it (it just
    /// came back, and the Primary's list is on its way).
    fn has_range(&self, v: usize, offset: u64, len: u64) -> bool {
        let vol = &self.vols[v];
        if !self.peers.all_listed(v) {
            return false;
        }
        let Some(rs) = vol.resync.as_ref() else {
            return vol.disk == DiskState::UpToDate;
        };
        vol.disk == DiskState::Inconsistent && rs.holds(offset, len)
    }

    /// A peer to pull from: the Primary if it keeps an up-to-date replica (it has every
    /// write; a Secondary cut off from it may not know what it missed yet would serve it:
    /// seed 5603 of the overlapping-fault runs), else an up-to-date one, else a diskful one
    /// being synced itself (it serves what it has and refuses the rest), skipping those
    /// that just refused.
    fn pick_source(&self, v: usize) -> Option<NodeId> {
        let rs = self.vols[v].resync.as_ref();
        let refused = |id: &NodeId| rs.is_some_and(|r| r.refused.contains(id));
        let has = |p: &&Peer, want: DiskState| p.vols[v].diskful && p.vols[v].disk == Some(want);
        if let Some(p) = self
            .peers
            .up()
            .find(|p| p.role == Role::Primary && has(p, DiskState::UpToDate))
        {
            // Refused (it has not heard every list yet): ask it again later, not another.
            return (!refused(&p.id)).then_some(p.id);
        }
        let current = rs.and_then(|r| r.source).filter(|s| {
            !refused(s)
                && self
                    .peers
                    .get(*s)
                    .is_some_and(|p| p.up && has(&p, DiskState::UpToDate))
        });
        let candidate = |want: DiskState| {
            self.peers
                .up()
                .find(|p| has(p, want) && !refused(&p.id))
                .map(|p| p.id)
        };
        current
            .or_else(|| candidate(DiskState::UpToDate))
            .or_else(|| candidate(DiskState::Inconsistent))
    }

    /// Pulls the next ranges from the sync source, up to the window.
    fn pump_resync(&mut self, volume: u16, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let chunk_blocks = u64::from(self.spec.resync_chunk) / BLOCK;
        let size = self.vols[v].size;
        let source = self.pick_source(v);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        let window = rs.window(self.spec.resync_window);
        if rs.source != source && rs.outstanding.is_empty() {
            rs.source = source;
        }
        while let Some(src) = rs
            .source
            .filter(|&s| Some(s) == source && rs.outstanding.len() < window)
        {
            let id = self.next_id;
            let Some((offset, len)) = rs.take_next(id, size, chunk_blocks) else {
                break;
            };
            self.next_id += 1;
            let msg = Msg::ResyncReq {
                volume,
                id,
                offset,
                len,
            };
            out.push(RAction::Send { peer: src, msg });
        }
        let all_listed = self.peers.all_listed(v);
        let reach = self.up_to_date_within_reach(v);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        if rs.source.is_none()
            && rs.outstanding.is_empty()
            && rs.to_pull.count() > 0
            && !reach
            && !rs.stalled
        {
            rs.stalled = true;
            out.push(RAction::Note(format!(
                "volume {v}: no up-to-date replica within reach, and no peer has the blocks \
                 we lack; the resync waits for one to return (I/O that needs one fails)"
            )));
        }
        if all_listed && rs.drained() && !rs.finishing {
            rs.finishing = true;
            self.flush_locally(FlushWaiter::ResyncDone { volume }, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn resync_reply(
        &mut self,
        i: usize,
        volume: u16,
        id: u64,
        offset: u64,
        errno: u32,
        data_len: usize,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let v = volume as usize;
        let peer = self.peers[i].id;
        if self
            .vols
            .get_mut(v)
            .is_some_and(|vol| vol.abandoned.remove(&id))
        {
            return Ok(());
        }
        let Some(rs) = self.vols.get_mut(v).and_then(|vol| vol.resync.as_mut()) else {
            return Err(format!("resync reply {id} without a resync"));
        };
        let Some((req_off, req_len)) = rs.outstanding.remove(&id) else {
            return Err(format!("resync reply to unknown request {id}"));
        };
        if req_off != offset || (errno == 0 && data_len != req_len as usize) {
            return Err(format!("resync reply {id} does not match its request"));
        }
        if errno == EAGAIN {
            // The source lacks it too, for now: ask another one, or the same one later.
            rs.refused_by(peer, req_off, req_len, self.now_ms);
            self.pump_resync(volume, out);
            return Ok(());
        }
        if errno != 0 {
            rs.to_pull.set_range(req_off, u64::from(req_len));
            out.push(RAction::Note(format!(
                "volume {v}: node {peer} could not read {req_off}+{req_len} for resync"
            )));
            return Err("sync source failed a resync read".into());
        }
        self.data_arrives(v, out);
        let rs = self.vols[v].resync.as_mut().expect("data_arrives keeps it");
        if rs.data_arrived() {
            out.push(RAction::Note(format!(
                "volume {v}: node {peer} has blocks we lack; the resync goes on"
            )));
        }
        // Write the sectors the application has not overwritten since the resync began.
        for (part, (s, e)) in rs.unwritten_parts(offset, req_len).into_iter().enumerate() {
            let part = part as u32;
            let token = Token::ResyncWrite { id, part };
            let len = (e - s) as u32;
            let kind = DiskKind::Write { offset: s, len };
            let data = DataRef::Incoming {
                at: (s - offset) as u32,
            };
            self.vols[v]
                .apply
                .write(volume, token, kind, Some(data), true, out);
        }
        self.pump_resync(volume, out);
        Ok(())
    }

    fn resync_finished(&mut self, volume: u16, ok: bool, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        rs.finishing = false;
        // A peer that connected while the final flush ran has not ended its list yet: it
        // may name writes we lack (simulator seed 2001780: the diskless Primary came back
        // during the flush, and the replica called itself UpToDate without its list; the
        // Primary, hearing UpToDate after sending that list, took it as received and
        // forgot the block; an acknowledged write was lost).
        if !self.peers.all_listed(v) || !rs.drained() {
            // More was listed while the final flush ran.
            return self.pump_resync(volume, out);
        }
        let rs = self.vols[v].resync.take().expect("checked above");
        if !ok {
            return self.local_disk_failed(v, "flush after resync failed", out);
        }
        let source = rs.source.map_or("-".to_string(), |s| s.to_string());
        if let Some(i) = rs.source.and_then(|s| self.peers.index(s)) {
            self.peers[i].vols[v].repl = Repl::Established;
        }
        let note = format!("volume {v}: resync from node {source} finished; UpToDate");
        self.set_disk_logged(v, DiskState::UpToDate, note, rs.live, out);
        self.offer_to_outdated(v, out);
    }

    /// We just became up to date: connected peers whose replica is Outdated (their
    /// currency unknown) or created empty get everything from us.
    fn offer_to_outdated(&mut self, v: usize, out: &mut Vec<RAction>) {
        for i in 0..self.peers.len() {
            let up = self.peers[i].up;
            let pv = &mut self.peers[i].vols[v];
            if up && pv.diskful && pv.needs_everything() {
                pv.oos.set_all();
                self.send_list(i, v, out);
            }
        }
    }

    /// A replicated write (or zeroing) from the Primary.
    #[allow(clippy::too_many_arguments)]
    fn receive_write(
        &mut self,
        i: usize,
        v: usize,
        seq: u64,
        flags: u32,
        targets: u32,
        kind: DiskKind,
        out: &mut Vec<RAction>,
    ) -> Result<(), String> {
        let peer = self.peers[i].id;
        if self.peers[i].role != Role::Primary {
            return Err("replicated write from a node that is not Primary".into());
        }
        if seq <= self.peers[i].rx_last_seq {
            return Err(format!(
                "write sequence {seq} not after {}",
                self.peers[i].rx_last_seq
            ));
        }
        self.peers[i].rx_last_seq = seq;
        let (offset, len) = (kind.offset(), kind.len());
        self.note_third_parties(peer, v, NodeSet::from_bits(targets), offset, len, out);
        if !self.vols[v].attached() {
            let msg = Msg::NegAck { seq, errno: EIO };
            out.push(RAction::Send { peer, msg });
            return Ok(());
        }
        if flags & wf::ACK_RECV != 0 {
            out.push(RAction::Send {
                peer,
                msg: Msg::RecvAck { seq },
            });
        }
        self.data_arrives(v, out);
        if let Some(rs) = self.vols[v].resync.as_mut() {
            rs.fresh.set_range(offset, u64::from(len));
        }
        let p = &mut self.peers[i];
        if !p.vols[v].listed {
            p.vols[v].written_before_list.push((offset, u64::from(len)));
        }
        p.rx_pending.insert(seq);
        let token = Token::PeerWrite {
            peer,
            conn: p.conn,
            seq,
        };
        let data = matches!(kind, DiskKind::Write { .. }).then_some(DataRef::Incoming { at: 0 });
        self.vols[v]
            .apply
            .write(v as u16, token, kind, data, true, out);
        Ok(())
    }

    /// Diskful nodes the Primary could not send this write to lack it: if the Primary
    /// fails before it can tell them, we can (like DRBD's peer acks). One we are connected
    /// to and have listed what it lacks hears of it now: the Primary tells it only of
    /// writes that succeeded, and this one may yet fail there (its link to us drops) while
    /// we keep it, so only we know the two replicas differ.
    fn note_third_parties(
        &mut self,
        primary: NodeId,
        v: usize,
        targets: NodeSet,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        for p in self
            .peers
            .iter_mut()
            .filter(|p| p.id != primary && p.vols[v].diskful)
        {
            if !targets.contains(p.id) {
                p.vols[v].oos.set_range(offset, u64::from(len));
                if p.up && matches!(p.vols[v].list, ListState::Sent | ListState::Stale) {
                    out.push(out_of_sync(p.id, v, offset, len));
                    out.push(out_of_sync(p.id, v, 0, 0));
                }
            } else {
                // It gets this newer write (or the Primary marks it): our old mark is moot.
                p.vols[v].oos.clear_range(offset, u64::from(len));
            }
        }
    }

    // ------------------------------------------------------------------ time

    /// Advances the clock: keepalive pings and timeouts.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<RAction>) {
        self.tick_event(now_ms, out);
        self.debug_check();
    }

    /// Tells the engine the time without running its timers: a driver that ticks only at
    /// [`Resource::poll_timeout`] keeps the clock current for the events in between (a
    /// write's send time, a retry's deadline).
    pub fn advance(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// When the engine next needs [`Resource::tick`] (the clock `tick` is given), or `None`
    /// while nothing is timed: a resync retry, a ping to send or one unanswered for too
    /// long, a replicated write unacknowledged for too long. Drivers wake for it instead
    /// of ticking at a fixed rate.
    pub fn poll_timeout(&self) -> Option<u64> {
        let resyncs = self
            .vols
            .iter()
            .filter_map(|v| v.resync.as_ref())
            .filter(|r| !r.refused.is_empty())
            .map(|r| r.retry_at_ms);
        let peers = self.peers.up().flat_map(|p| p.next_timer(&self.spec));
        resyncs.chain(peers).min()
    }

    fn tick_event(&mut self, now_ms: u64, out: &mut Vec<RAction>) {
        self.now_ms = now_ms;
        for v in 0..self.vols.len() {
            if let Some(rs) = self.vols[v]
                .resync
                .as_mut()
                .filter(|r| !r.refused.is_empty() && now_ms >= r.retry_at_ms)
            {
                rs.refused.clear();
                self.pump_resync(v as u16, out);
            }
        }
        let mut drop = Vec::new();
        for p in self.peers.iter_mut().filter(|p| p.up) {
            match p.timer(now_ms, &self.spec) {
                Timer::Quiet => {}
                Timer::Ping => out.push(RAction::Send {
                    peer: p.id,
                    msg: Msg::Ping,
                }),
                Timer::Drop(reason) => drop.push((p.id, reason)),
            }
        }
        for (peer, reason) in drop {
            out.push(RAction::Disconnect {
                peer,
                reason: reason.clone(),
            });
            out.push(RAction::Note(format!("node {peer}: {reason}")));
            self.peer_down(peer, out);
        }
    }
}
