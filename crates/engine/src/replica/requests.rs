//! The application's requests on the Primary: writes (ordered, replicated, answered
//! once every replica did as the protocol asks), reads (routed to a current replica),
//! barriers (FLUSH and FUA made durable on every replica) and block statuses (reads,
//! barriers and block statuses in `requests/reading.rs`, `requests/flushing.rs` and
//! `requests/block_status.rs`).

use super::acks::{Local, Settling};
use super::action::RAction;
use super::barriers::Barriers;
use super::bitmap::Bitmap;
use super::event::{Event, LocalFailure, ProtocolError};
use super::generation::{Missed, Rotations};
use super::msg::{DataRef, Token};
use super::nodeset::NodeSet;
use super::peer::{ListState, Unacked};
use super::reads::Reads;
use super::replicas::Replicas;
use super::spec::{NodeId, Protocol};
use super::writes::{AppWrite, Next, Shape, Stage, Writes};
use crate::io::{DiskKind, Io, IoError, ReqId};
use rustc_hash::FxHashMap as HashMap;
use tandem_wire::packet::{write_flags as wf, DiskState, Packet, Role};
use tandem_wire::Errno;

mod block_status;
mod flushing;
mod reading;
mod suspended;

pub use block_status::AllocationMap;
use block_status::BlockStatuses;
use suspended::{Gate, Suspended};

const EIO: u32 = Errno::Io.code();

/// The Primary's application requests in flight.
#[derive(Debug)]
pub(super) struct Requests {
    pub(super) writes: Writes,
    pub(super) reads: Reads,
    pub(super) barriers: Barriers,
    /// Block statuses asked of peers (see `requests/block_status.rs`).
    pub(super) block_statuses: BlockStatuses,
    /// Generation ids changed before a write that missed a replica completes.
    pub(super) rotations: Rotations,
    /// Writes sent and not yet settled everywhere (see `settle.rs`).
    pub(super) settling: Settling,
    /// FLUSH requests waiting for the ids to change, with the number of volumes whose
    /// rotation they still wait for (see `Requests::flush_waits_for_ids`).
    pub(super) flushes_parked: HashMap<ReqId, usize>,
    /// Requests held while their volume has no quorum (see `requests/suspended.rs`).
    pub(super) suspended: Suspended,
}

impl Requests {
    pub(super) fn new(volumes: usize) -> Requests {
        Requests {
            writes: Writes::new(volumes),
            reads: Reads::default(),
            barriers: Barriers::default(),
            block_statuses: BlockStatuses::default(),
            rotations: Rotations::new(volumes),
            settling: Settling::default(),
            flushes_parked: HashMap::default(),
            suspended: Suspended::default(),
        }
    }

    /// A peer's answer to a write, barrier, read or block status we sent it. A packet that breaks the
    /// protocol drops the connection.
    pub(super) fn on_answer(
        &mut self,
        rep: &mut Replicas,
        i: usize,
        packet: &Packet<'_>,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let peer = rep.peers[i].id;
        match *packet {
            Packet::RecvAck { seq } => {
                let mut protocol = rep.spec.protocol;
                if let Some(w) = rep.peers[i]
                    .app_waiting
                    .get(&seq)
                    .and_then(|req| self.writes.get_mut(*req))
                {
                    w.received.insert(peer);
                    protocol = w.protocol;
                }
                // Satisfies a write waiting under protocol B (including protocol A writes of
                // a diskless Primary, see start_write); for others nothing waits on it.
                if protocol != Protocol::C {
                    self.peer_satisfied(rep, i, seq, true, out);
                }
            }
            Packet::WriteAck { seq } => self.on_write_ack(rep, i, seq, true, out)?,
            Packet::NegAck { seq, .. } => self.on_write_ack(rep, i, seq, false, out)?,
            Packet::BarrierAck { id, errno } => {
                if rep.peers[i].barriers_out.remove(&id).is_none() {
                    return Err(ProtocolError::UnknownBarrier(id));
                }
                if errno != 0 {
                    self.flush_failed_on(rep, i, id);
                }
                self.barriers.peer_answered(id, peer, errno == 0);
                self.check_flush(rep, id, out);
            }
            Packet::ReadReply { id, errno, data } => {
                self.on_read_reply(rep, i, id, errno, data.len(), out)?
            }
            Packet::AllocReply {
                volume,
                id,
                errno,
                extents,
            } => {
                let mapped = errno == 0 && !extents.is_empty();
                self.on_alloc_reply(rep, i, volume, id, mapped, out)?
            }
            _ => unreachable!("not an answer: {packet:?}"),
        }
        Ok(())
    }

    /// Application requests in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.writes.len()
            + self.reads.len()
            + self.block_statuses.len()
            + self.barriers.requests()
            + self.flushes_parked.len()
            + self.suspended.len()
    }

    pub(super) fn submit_event(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        volume: u16,
        io: Io,
        out: &mut Vec<RAction>,
    ) {
        self.submit_io(rep, req, volume, io, false, out);
    }

    /// `held`: the request was held without quorum (a write's payload retained under
    /// `Token::App`) and goes on now.
    fn submit_io(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        volume: u16,
        io: Io,
        held: bool,
        out: &mut Vec<RAction>,
    ) {
        let complete = |result| RAction::Complete {
            req,
            result,
            data: None,
        };
        if rep.role != Role::Primary {
            return out.push(complete(Err(IoError::ReadOnly)));
        }
        let v = volume as usize;
        if !matches!(io, Io::Cache { .. }) {
            match Gate::of(rep, v) {
                Gate::Go => {}
                Gate::Fail => return out.push(complete(Err(IoError::NoQuorum))),
                Gate::Hold => {
                    keep_payload(req, io, held, out);
                    return self.suspended.arrive(req, volume, io);
                }
            }
        }
        let data = if held {
            DataRef::Held {
                key: Token::App(req),
                at: 0,
            }
        } else {
            DataRef::Request(req)
        };
        match io {
            Io::Read { offset, len } => {
                self.reads.begin(req, volume, offset, len);
                self.route_read(rep, req, out);
            }
            Io::Cache { .. } => out.push(complete(Ok(()))),
            Io::Flush => self.start_barrier(rep, vec![(req, volume)], out),
            // No replica can promise that every other one zeroes fast too, and a zero done
            // on some replicas and refused on others would make them differ.
            Io::Zero { fast: true, .. } => out.push(complete(Err(IoError::NotFast))),
            Io::Write { offset, len, .. }
            | Io::Trim { offset, len, .. }
            | Io::Zero { offset, len, .. } => {
                // Writes need a replica that is current somewhere: where they cover a
                // block only in part, one that holds the block's other sectors.
                if !rep.current_within_reach(v, offset, u64::from(len)) {
                    return out.push(complete(Err(IoError::NoData)));
                }
                let (o, l) = (offset, u64::from(len));
                if self.writes.must_wait(v, o, l) {
                    keep_payload(req, io, held, out);
                    return self.writes.queue(v, req, io, o, l);
                }
                self.start_write(rep, req, volume, io, data, out);
            }
        }
    }

    pub(super) fn start_write(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        volume: u16,
        io: Io,
        data: DataRef,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        let shape = Shape::of(io);
        let local = rep.vols[v].takes_writes();
        if let Some(t) = rep.vols[v].tenure.as_mut() {
            t.written.set_range(shape.offset, u64::from(shape.len));
        }
        let mut w = AppWrite::new(volume, &shape, local);
        w.local_current = rep.vols[v].disk == DiskState::UpToDate;
        if local {
            rep.data_arrives(v, out);
            let data = matches!(shape.kind, DiskKind::Write { .. }).then_some(data);
            // A Primary being synced: a resync write to this range may be on its way to
            // the disk, and disks complete in any order, so this newer write waits for it
            // (else the older resync data may land last: simulator seed 40014553, a new
            // cluster's Primary still pulling).
            let token = Token::App(req);
            rep.vols[v]
                .apply
                .write(volume, token, shape.kind, data, false, out);
            // And a resync reply for this range still to come may have been read at its
            // source before this write got there: older data, which must not land over
            // it (DRBD's rule), as a Secondary protects what the Primary wrote to it
            // (`receive_write`). Simulator seed 381: back from a crash and promoted while
            // pulling its activity log's extents, the Primary wrote into one, and the
            // reply, read on the peer before the write reached it, landed after it.
            if let Some(rs) = rep.vols[v].resync.as_mut() {
                if rs.wrote(shape.offset, u64::from(shape.len)) {
                    rep.pump_resync(&mut self.barriers, volume, out);
                }
            }
        }
        self.replicate(rep, req, &shape, &mut w, data, out);
        self.writes.begin(req, w);
        self.check_write(rep, req, out);
    }

    /// Sends a new write to every connected diskful peer; the others missed it.
    fn replicate(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        shape: &Shape,
        w: &mut AppWrite,
        data: DataRef,
        out: &mut Vec<RAction>,
    ) {
        let seq = self.writes.next_seq();
        w.seq = seq;
        let (volume, v) = (w.volume, w.volume as usize);
        let local = w.local != Stage::NotApplicable;
        // Protocol A completes a write once it is in the send buffer, which is safe only
        // because the local replica has it. Without one, wait for receipt (protocol B);
        // and with at most one up-to-date replica to receive it, for it to be written
        // there (protocol C): a kill -9 of that one node before its write would take an
        // acknowledged write no replica holds (simulator overlapping seeds 3459, 17948,
        // disk-errors 2934).
        let (o, l) = (shape.offset, u64::from(shape.len));
        let current = || {
            (rep.peers.up())
                .filter(|p| p.vols[v].current_for(o, l))
                .count()
        };
        let protocol = match rep.spec.protocol {
            Protocol::A | Protocol::B if !local && current() <= 1 => Protocol::C,
            Protocol::A if !local => Protocol::B,
            p => p,
        };
        w.protocol = protocol;
        let mut targets = if local {
            NodeSet::one(rep.spec.me)
        } else {
            NodeSet::EMPTY
        };
        for p in rep.peers.up().filter(|p| p.vols[v].diskful) {
            targets.insert(p.id);
        }
        // Receipt is always acknowledged (protocol B completes on it); it does not make
        // the write in sync there: the peer may die before writing it (see peer_down).
        let mut flags = wf::ACK_WRITE | shape.flags | wf::ACK_RECV;
        if shape.fua {
            flags |= wf::FUA;
        }
        let msg = shape.msg(volume, seq, flags, targets.bits(), data);
        let now = rep.now_ms;
        let mut sent_to = NodeSet::EMPTY;
        for p in rep.peers.iter_mut().filter(|p| p.vols[v].diskful) {
            if !p.up {
                w.missing.insert(p.id);
                continue;
            }
            out.push(RAction::Send { peer: p.id, msg });
            sent_to.insert(p.id);
            if p.vols[v].current_for(o, l) {
                w.current.insert(p.id);
            }
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
        w.sent_to = sent_to;
        let local = local.then_some(Local {
            req,
            volume,
            offset: shape.offset,
            len: shape.len,
            answered: false,
        });
        self.settling.sent(seq, sent_to, local);
    }

    pub(super) fn check_write(&mut self, rep: &mut Replicas, req: ReqId, out: &mut Vec<RAction>) {
        match self.writes.next(req, |v: usize| rep.vols[v].attached()) {
            Next::Wait => {}
            Next::Barrier(volume) => self.start_barrier(rep, vec![(req, volume)], out),
            Next::Finish(result) => self.finish_write(rep, req, result, out),
        }
    }

    /// A write done: a successful one that missed a replica which may hold the current
    /// generation id (or whose FUA barrier missed one) waits for the id to change first
    /// (see `generation.rs`).
    pub(super) fn finish_write(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let w = self
            .writes
            .get_mut(req)
            .expect("finishing an unknown write");
        let v = w.volume as usize;
        // Done on the replicas it reached: without quorum, or on too few of them for one,
        // it fails, before it rotates any ids, under either policy (see
        // `requests/suspended.rs`, `Replicas::quorum_holds`).
        let result = match (result, Gate::of(rep, v)) {
            (Ok(()), Gate::Hold | Gate::Fail) => Err(IoError::NoQuorum),
            (Ok(()), Gate::Go) => {
                let mut holders = w.peers_ok;
                if w.local == Stage::Done(true) {
                    holders.insert(rep.spec.me);
                }
                if rep.quorum_holds(v, holders) {
                    Ok(())
                } else {
                    Err(IoError::NoQuorum)
                }
            }
            (r, _) => r,
        };
        let w = self.writes.get_mut(req).expect("checked above");
        let missed = w.missing.union(w.unflushed);
        if result.is_ok() && !w.rotated && w.landed() && !missed.is_empty() {
            w.rotated = true;
            if self.rotations.missed(rep, v, req, missed, out) == Missed::Waits {
                return self.writes.park(req);
            }
        }
        self.complete_write(rep, req, result, out);
    }

    /// The Primary's ids changed for the writes it held: they complete.
    pub(super) fn gen_answered(
        &mut self,
        rep: &mut Replicas,
        v: usize,
        peer: NodeId,
        gi: u64,
        adopted: bool,
        out: &mut Vec<RAction>,
    ) {
        let released = self.rotations.answered(rep, v, peer, gi, adopted, out);
        self.release_rotated(rep, released, out);
    }

    pub(super) fn release_rotated(
        &mut self,
        rep: &mut Replicas,
        released: Vec<ReqId>,
        out: &mut Vec<RAction>,
    ) {
        for req in released {
            if self.writes.contains(req) {
                // Rotated: `finish_write` completes it, if quorum allows.
                self.finish_write(rep, req, Ok(()), out);
            } else {
                self.flush_released(rep, req, out);
            }
        }
    }

    fn complete_write(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let w = self.writes.end(req);
        self.settling.local_answered(w.seq);
        let v = w.volume as usize;
        let size = rep.vols[v].size;
        let (landed, (offset, len)) = (w.landed(), (w.offset, u64::from(w.len)));
        let may_hold = w.may_hold();
        // Only a write that missed someone needs it: the common write skips the walk.
        let sole = if w.missing.is_empty() {
            None
        } else {
            rep.sole_holder(v, w.missing, w.peers_ok.union(w.received))
        };
        let references = if result.is_err() {
            references_for_failed(rep, v, &w)
        } else {
            NodeSet::EMPTY
        };
        if !references.is_empty() {
            self.settling.forgive(w.seq, references);
        }
        for p in rep.peers.iter_mut() {
            let up = p.up;
            let pv = &mut p.vols[v];
            if references.contains(p.id) {
                // Whatever it holds there is the range's content now: nothing to settle
                // at its return. Unless it received the write (its link dropped before it
                // answered): it may hold it, and the replicas that never received it are
                // settled against it at its return (`unanswered_lost`).
                let received = w.peers_ok.union(w.received).contains(p.id);
                if let Some(u) = pv.unanswered.as_mut().filter(|_| !received) {
                    u.clear_range(offset, len);
                }
                continue;
            }
            if !references.is_empty() && w.peers_ok.union(w.received).contains(p.id) {
                p.lacks(v, w.offset, w.len, out);
                let pv = &mut p.vols[v];
                if up && matches!(pv.list, ListState::NotSent | ListState::Deferred) {
                    pv.pull_back
                        .get_or_insert_with(|| Bitmap::new(size))
                        .set_range(offset, len);
                }
                continue;
            }
            // Written as Primary without it: if it was Primary apart from us too, this
            // is half of a split brain (a diskless one holds none of it, but its own
            // writes went to replicas that lack ours).
            let missed = w.missing.contains(p.id);
            if result.is_ok() && (missed || (!pv.diskful && !up)) {
                pv.wrote_apart = true;
            }
            // A failed write may still have landed on some replica (simulator seed
            // 3017270: written on a Secondary being synced, whose flush could not vouch
            // for it, while the other was cut off), so the replicas that missed it differ.
            // A replica that detached is marked for every write it missed, like DRBD's
            // diskless peers: even one that landed nowhere we know of may be on a replica
            // whose acknowledgement was lost with its link (seed 90004521), and the mark
            // cannot leave the live replicas without a source.
            let detached = pv.diskful && pv.disk == Some(DiskState::Diskless);
            let elsewhere = may_hold && !w.received.contains(p.id);
            if missed && (landed || detached || elsewhere) && sole == Some(p.id) && !up {
                // The only replica that may hold it, and its link dropped: settled at its
                // return (see `PeerVol::unconfirmed`).
                pv.unconfirmed
                    .get_or_insert_with(|| Bitmap::new(size))
                    .set_range(offset, len);
            } else if missed && (landed || detached || elsewhere) {
                pv.oos.set_range(offset, len);
                if pv.list == ListState::Sent {
                    pv.list = ListState::Stale;
                }
            }
        }
        // Lists that waited for this write to mark its bits.
        for i in 0..rep.peers.len() {
            let p = &rep.peers[i];
            if p.up && p.vols[v].list == ListState::Deferred && !self.writes.missing(v, p.id) {
                rep.send_list(i, v, out);
            }
        }
        if result.is_ok() {
            self.rotations.acked(rep, Some(v), out);
        }
        if result.is_err() {
            let (volume, offset, len) = (w.volume, w.offset, w.len);
            out.push(RAction::Event(Event::WriteFailed {
                volume,
                offset,
                len,
            }));
        }
        out.push(RAction::Complete {
            req,
            result,
            data: None,
        });
        self.start_ready_writes(rep, w.volume, out);
    }

    /// A waiting write that fails at once never enters the in-flight set, so the writes
    /// queued behind it are free to go too: ask again until nothing more is ready (once
    /// was not enough: the third of three overlapping writes waited forever after the
    /// last replica went away, and its client hung).
    pub(super) fn start_ready_writes(
        &mut self,
        rep: &mut Replicas,
        volume: u16,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        loop {
            let ready = self.writes.ready(v);
            if ready.is_empty() {
                break;
            }
            for (r, io) in ready {
                let s = Shape::of(io);
                let (o, l) = (s.offset, u64::from(s.len));
                if rep.role != Role::Primary || !rep.current_within_reach(v, o, l) {
                    out.push(RAction::Complete {
                        req: r,
                        result: Err(IoError::NoData),
                        data: None,
                    });
                    continue;
                }
                match Gate::of(rep, v) {
                    Gate::Go => {}
                    Gate::Fail => {
                        out.push(RAction::Complete {
                            req: r,
                            result: Err(IoError::NoQuorum),
                            data: None,
                        });
                        continue;
                    }
                    Gate::Hold => {
                        self.suspended.arrive(r, volume, io);
                        continue;
                    }
                }
                let data = DataRef::Held {
                    key: Token::App(r),
                    at: 0,
                };
                self.start_write(rep, r, volume, io, data, out);
            }
        }
    }

    /// An application read or write of ours finished on the local replica.
    pub(super) fn app_io_done(
        &mut self,
        rep: &mut Replicas,
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
                    rep.local_disk_failed(v, LocalFailure::Read(e), out);
                    self.route_read(rep, req, out)
                }
            };
        }
        if rep.vols[v].apply.landed(kind.offset(), token) {
            // It had waited for a resync write (see `start_write`).
            rep.release_applying(v, out);
        }
        let Some(w) = self.writes.get_mut(req) else {
            return;
        };
        w.local = Stage::Done(result.is_ok());
        if let Err(e) = result {
            rep.local_disk_failed(v, LocalFailure::Write(e), out);
        }
        self.check_write(rep, req, out);
    }

    /// The peer wrote (`ok`) or failed a write we sent it.
    pub(super) fn on_write_ack(
        &mut self,
        rep: &mut Replicas,
        i: usize,
        seq: u64,
        ok: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let peer = rep.peers[i].id;
        let Some(u) = rep.peers[i].unacked.remove(&seq) else {
            let negative = !ok;
            return Err(ProtocolError::UnknownWrite { seq, negative });
        };
        self.settling.answered(seq, peer, ok, rep.now_ms);
        let oos = &mut rep.peers[i].vols[u.volume as usize].oos;
        if ok {
            // It now holds the newest data of every block the write covered whole.
            oos.clear_range(u.offset, u64::from(u.len));
            let protocol = (self.writes.get_mut(u.req))
                .filter(|w| w.seq == seq)
                .map_or(rep.spec.protocol, |w| w.protocol);
            if protocol == Protocol::C {
                self.peer_satisfied(rep, i, seq, true, out);
            }
            return Ok(());
        }
        match self.writes.get_mut(u.req) {
            // A failure after its receipt (protocol B): the failed replica vouches for
            // nothing (disk-errors seed 245032910: a diskless Primary acknowledged a write
            // only the failed replica had received, and marked the one replica that may
            // hold it, cut off unanswered, as lacking it: no source was left).
            Some(w) if w.seq == seq => w.failed_on(peer),
            Some(w) => {
                w.missing.insert(peer);
            }
            None => oos.set_range(u.offset, u64::from(u.len)),
        }
        self.peer_satisfied(rep, i, seq, false, out);
        Ok(())
    }

    /// Peer `i` failed barrier `id`: its fdatasync failed and its replica detached (or it
    /// had none). For each FUA write the barrier answers on a volume we know it detached,
    /// the write failed on it (`AppWrite::failed_on`), as for a `NegAck` after a receipt: it holds
    /// nothing and vouches for nothing (disk-errors seed 251048620: a diskless Primary's
    /// FUA write, written by node 1 whose flush then failed, counted as landed there; node
    /// 2, which received it and whose link dropped before it answered, was marked as
    /// lacking it, and waited for ever for a source, the only other replica detached).
    fn flush_failed_on(&mut self, rep: &Replicas, i: usize, id: u64) {
        let p = &rep.peers[i];
        for &(req, volume) in self.barriers.waiters(id) {
            let pv = &p.vols[volume as usize];
            if !(pv.diskful && pv.disk == Some(DiskState::Diskless)) {
                continue;
            }
            if let Some(w) = self.writes.get_mut(req).filter(|w| !w.rotated) {
                w.failed_on(p.id);
            }
        }
    }

    pub(super) fn peer_satisfied(
        &mut self,
        rep: &mut Replicas,
        i: usize,
        seq: u64,
        ok: bool,
        out: &mut Vec<RAction>,
    ) {
        if let Some(req) = rep.peers[i].app_waiting.remove(&seq) {
            let p = &rep.peers[i];
            let current = |v: usize, o: u64, l: u32| p.vols[v].current_for(o, u64::from(l));
            self.writes.answered(req, p.id, ok, current);
            self.check_write(rep, req, out);
        }
    }
}

/// A failed write whose only holders are replicas being synced, while up-to-date ones that
/// never received it were cut off: those up-to-date replicas keep the range as it was (the
/// write was not acknowledged, so either content is right), and the holders are marked to
/// pull it back from them. Marking the up-to-date ones instead leaves the newest data of
/// the range split between replicas none of which is up to date (simulator seed 1574: a
/// FUA write landed only on the replica being synced, its barrier could not vouch for it,
/// and the current replica, marked as lacking it, had no source left). A holder whose list
/// from us has not ended is told live right after it (`PeerVol::pull_back`): the list alone
/// leaves its protection of what we wrote it before the list, this write among them
/// (overlapping soak seed 204080907: given up, the fallback marked the up-to-date holder
/// whose link dropped, and the other holder, its list naming a block of the range from its
/// time away, lacked that block too). Empty when the rule does not apply: a holder is up
/// to date, or no up-to-date replica is known to hold the range's older writes (one marked
/// as lacking a write there does not).
fn references_for_failed(rep: &Replicas, v: usize, w: &AppWrite) -> NodeSet {
    let holders = w.peers_ok.union(w.received);
    if w.local == Stage::Done(true) || holders.is_empty() {
        return NodeSet::EMPTY;
    }
    let (offset, len) = (w.offset, u64::from(w.len));
    let mut references = NodeSet::EMPTY;
    for p in rep.peers.iter() {
        let pv = &p.vols[v];
        if holders.contains(p.id) {
            // Up to date when the write went out, or since (a holder whose link dropped
            // is known only by the former).
            let current = w.current.contains(p.id) || pv.current_for(offset, len);
            // Up to date, it received the write and its link dropped before it answered:
            // it keeps the range as it was or with the write (either is right for a
            // failed write), and holds the range's older writes whole where a holder
            // being synced may hold only this write's sectors of a block (seed 7391):
            // the reference, not marked.
            if current
                && pv.diskful
                && !p.up
                && w.missing.contains(p.id)
                && !pv.oos.any_in(offset, len)
            {
                references.insert(p.id);
                continue;
            }
            // Our list to it has ended, the notice is live there and voids its protection
            // of the write; else it is told live after the list (`pull_back`).
            if !pv.diskful || current {
                return NodeSet::EMPTY;
            }
        } else if w.missing.contains(p.id)
            && w.current.contains(p.id)
            && !p.up
            && !pv.oos.any_in(offset, len)
        {
            references.insert(p.id);
        }
    }
    references
}

/// A write that waits before it starts keeps its payload (under `Token::App`), unless it
/// already did (`held`).
fn keep_payload(req: ReqId, io: Io, held: bool, out: &mut Vec<RAction>) {
    if matches!(io, Io::Write { .. }) && !held {
        out.push(RAction::Retain {
            from: DataRef::Request(req),
            key: Token::App(req),
        });
    }
}
