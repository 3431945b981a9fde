//! What a Secondary (or a sync source) does for its peers: applies the Primary's writes
//! in order, answers its barriers once they are written and flushed, and serves reads,
//! resync reads and block statuses (`block_status.rs`) of its replica.

use super::acks::Received;
use super::action::RAction;
use super::apply::{Asked, WaitingRead};
use super::barriers::{Barriers, FlushWaiter};
use super::bitmap::Bitmap;
use super::event::{LocalFailure, ProtocolError};
use super::local::LocalVol;
use super::msg::{DataRef, Msg, Token};
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use crate::io::{DiskKind, IoError};
use tandem_wire::packet::{write_flags as wf, DiskState, Packet, Role};
use tandem_wire::Errno;

const EIO: u32 = Errno::Io.code();
const EAGAIN: u32 = Errno::Again.code();

impl Replicas {
    /// A request of the Primary (a write, a barrier) or of any peer (a read, a resync
    /// read) to our replica. A packet that breaks the protocol drops the connection.
    pub(super) fn on_request(
        &mut self,
        b: &mut Barriers,
        i: usize,
        packet: &Packet<'_>,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let peer = self.peers[i].id;
        match *packet {
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
                if self.receive_write(i, v, seq, flags, targets, kind, out)? {
                    self.pump_resync(b, volume, out);
                }
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
                if self.receive_write(i, v, seq, flags, targets, kind, out)? {
                    self.pump_resync(b, volume, out);
                }
            }
            Packet::Barrier { id } => {
                let last = self.peers[i].rx_last_seq;
                self.peers[i].barriers_in.push_back((id, last));
                self.process_barriers_in(b, i, out);
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
            }
            | Packet::AllocReq {
                volume,
                id,
                offset,
                len,
            } => {
                self.check_range(volume, offset, u64::from(len))?;
                let what = match packet {
                    Packet::ResyncReq { .. } => Asked::Resync,
                    Packet::AllocReq { .. } => Asked::Allocation,
                    _ => Asked::Read,
                };
                let conn = self.peers[i].conn;
                let ask = WaitingRead {
                    peer,
                    conn,
                    id,
                    offset,
                    len,
                    what,
                };
                self.serve_read(volume, ask, out);
            }
            _ => unreachable!("not a request: {packet:?}"),
        }
        Ok(())
    }

    /// A replicated write (or zeroing) from the Primary. True if it left our resync
    /// nothing to pull (`Resync::written_whole`): the caller pumps it, to end it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn receive_write(
        &mut self,
        i: usize,
        v: usize,
        seq: u64,
        flags: u32,
        targets: u32,
        kind: DiskKind,
        out: &mut Vec<RAction>,
    ) -> Result<bool, ProtocolError> {
        let peer = self.peers[i].id;
        if self.peers[i].role != Role::Primary {
            return Err(ProtocolError::WriteFromSecondary);
        }
        if seq <= self.peers[i].rx_last_seq {
            let last = self.peers[i].rx_last_seq;
            return Err(ProtocolError::WriteOutOfOrder { seq, last });
        }
        self.peers[i].rx_last_seq = seq;
        self.vols[v].written_ms = Some(self.now_ms);
        let (offset, len) = (kind.offset(), kind.len());
        self.note_third_parties(peer, v, NodeSet::from_bits(targets), offset, len, out);
        let conn = self.peers[i].conn;
        let token = Token::PeerWrite { peer, conn, seq };
        if !self.vols[v].attached() {
            // Refused, but in its turn behind an overlapping write still in flight: with
            // protocol A or B the Primary sends the next write before this one landed,
            // and an acknowledgement of the older write arriving after our refusal of
            // the newer one would tell it we hold the newest data (soak seed 94003653).
            if self.vols[v].apply.busy(offset, u64::from(len)) {
                self.peers[i].rx_pending.insert(seq);
                self.vols[v].apply.hold_refused(token, kind);
                return Ok(false);
            }
            let msg = Msg::NegAck { seq, errno: EIO };
            out.push(RAction::Send { peer, msg });
            return Ok(false);
        }
        if flags & wf::ACK_RECV != 0 {
            out.push(RAction::Send {
                peer,
                msg: Msg::RecvAck { seq },
            });
        }
        self.data_arrives(v, out);
        let mut emptied = false;
        if let Some(rs) = self.vols[v].resync.as_mut() {
            emptied = rs.wrote(offset, u64::from(len));
        }
        let p = &mut self.peers[i];
        if !p.vols[v].listed {
            p.vols[v].written_before_list.push((offset, u64::from(len)));
        }
        p.rx_pending.insert(seq);
        let (volume, len) = (v as u16, len);
        self.received(
            i,
            seq,
            Received {
                volume,
                offset,
                len,
            },
        );
        let data = matches!(kind, DiskKind::Write { .. }).then_some(DataRef::Incoming { at: 0 });
        self.vols[v]
            .apply
            .write(v as u16, token, kind, data, true, out);
        Ok(emptied)
    }

    /// Diskful nodes the Primary could not send this write to lack it: if the Primary
    /// fails before it can tell them, we can (like DRBD's peer acks). One we are connected
    /// to and have listed what it lacks hears of it now: the Primary tells it only of
    /// writes that succeeded, and this one may yet fail there (its link to us drops) while
    /// we keep it, so only we know the two replicas differ.
    pub(super) fn note_third_parties(
        &mut self,
        primary: NodeId,
        v: usize,
        targets: NodeSet,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        // Its list to us ended: we hold every write it completed (see `primary_relays`).
        let run = (self.peers.iter())
            .find(|p| p.id == primary && p.vols[v].listed)
            .map(|p| (p.id, p.conn));
        for p in self
            .peers
            .iter_mut()
            .filter(|p| p.id != primary && p.vols[v].diskful)
        {
            let block = p.vols[v].oos.block_size();
            if !targets.contains(p.id) {
                p.lacks(v, offset, len, out);
                if let Some(run) = run {
                    p.vols[v].relayed_by(run, offset, u64::from(len));
                }
            } else {
                // It gets this newer write (or the Primary marks it): our old mark is moot.
                let pv = &mut p.vols[v];
                pv.oos.clear_range(offset, u64::from(len));
                if let Some(relayed) = pv.relayed.as_mut() {
                    relayed.remove(offset, u64::from(len), block);
                }
            }
        }
    }

    /// Answers barriers whose preceding writes are all written.
    pub(super) fn process_barriers_in(
        &mut self,
        b: &mut Barriers,
        i: usize,
        out: &mut Vec<RAction>,
    ) {
        loop {
            let p = &mut self.peers[i];
            let Some(&(id, last)) = p.barriers_in.front() else {
                return;
            };
            if p.rx_pending.first().is_some_and(|&s| s <= last) {
                return;
            }
            p.barriers_in.pop_front();
            let (peer, conn) = (p.id, p.conn);
            if self.vols.iter().any(LocalVol::attached) {
                self.flush_locally(b, FlushWaiter::PeerBarrier { peer, conn, id }, out);
            } else {
                let msg = Msg::BarrierAck { id, errno: EIO };
                out.push(RAction::Send { peer, msg });
            }
        }
    }

    /// A peer's read (resync read, block status) of our replica.
    pub(super) fn serve_read(&mut self, volume: u16, ask: WaitingRead, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let WaitingRead {
            peer,
            conn,
            id,
            offset,
            len,
            what,
        } = ask;
        let serve = match what {
            Asked::Resync => self.has_range(v, offset, u64::from(len)),
            Asked::Read | Asked::Allocation => self.vols[v].disk == DiskState::UpToDate,
        };
        if !serve {
            // For a resync, not an error: we lack it too for now; the target asks
            // elsewhere or later.
            let errno = if what == Asked::Resync { EAGAIN } else { EIO };
            let msg = reply(what, volume, id, offset, len, errno, None);
            return out.push(RAction::Send { peer, msg });
        }
        // A read must see every write that reached us before it: wait for overlapping ones.
        // So must a block status: a hole it reports may be a write's range still landing.
        if self.vols[v].apply.busy(offset, u64::from(len)) {
            return self.vols[v].apply.wait_read(ask);
        }
        let (token, kind) = match what {
            Asked::Read => (
                Token::PeerRead { peer, conn, id },
                DiskKind::Read { offset, len },
            ),
            Asked::Resync => (
                Token::ResyncRead { peer, conn, id },
                DiskKind::Read { offset, len },
            ),
            Asked::Allocation => (
                Token::PeerAlloc { peer, conn, id },
                DiskKind::Allocation { offset, len },
            ),
        };
        out.push(RAction::Disk {
            volume,
            token,
            kind,
            data: None,
        });
    }

    /// Starts peer writes (and serves peer reads) that waited for an overlapping one.
    pub(super) fn release_applying(&mut self, v: usize, out: &mut Vec<RAction>) {
        if !self.vols[v].attached() {
            return self.refuse_applying(v, out);
        }
        for read in self.vols[v].apply.release(v as u16, out) {
            // A request of a connection that has since gone is forgotten by the peer.
            if self.peers.on_conn(read.peer, read.conn).is_some() {
                self.serve_read(v as u16, read, out);
            }
        }
    }

    /// A read we did for a peer (a read or a resync read) finished: answer it.
    pub(super) fn peer_read_done(
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
        // A replica that fails a read fails for us too, as for the application's reads
        // (disk-errors soak seed 94017354: a dead disk answered a peer's read with EIO and
        // stayed UpToDate).
        if let Err(e) = result {
            self.local_disk_failed(v, LocalFailure::PeerRead(e), out);
        }
        if let (true, Ok(()), Some(i), false) = (resync, result, current, stale) {
            // The peer pulls this range now; if it misses it, it asks again. Not
            // if the connection that asked is gone: the reply goes nowhere, and
            // the range may hold writes made since (simulator seed 30028803: a
            // write the peer missed while away was forgotten).
            let pv = &mut self.peers[i].vols[v];
            let size = self.vols[v].size;
            let served = pv.served.get_or_insert_with(|| Bitmap::new(size));
            pv.oos.move_range(offset, u64::from(len), served);
        }
        let msg = if resync {
            // Who else lacks what we send (our bitmaps for them), and hears it from no one
            // but the puller, which holds it next: those we reach we list it to ourselves
            // (named too, they were marked by every replica pulling from us at once, and
            // those cross claims counted as changes apart: failover seed 2155).
            let lacking = (self.peers.iter())
                .filter(|p| p.id != peer && !p.up && p.vols[v].diskful)
                .filter(|p| errno == 0 && p.vols[v].oos.any_in(offset, u64::from(len)))
                .fold(NodeSet::EMPTY, |mut s, p| {
                    s.insert(p.id);
                    s
                });
            Msg::ResyncReply {
                volume,
                id,
                offset,
                errno,
                lacking,
                len,
                data,
            }
        } else {
            reply(Asked::Read, volume, id, offset, len, errno, data)
        };
        if current.is_some() {
            out.push(RAction::Send { peer, msg });
        }
    }
}

/// The answer to a peer's read (resync read) of `len` bytes at `offset`; to a block
/// status only an error (see `allocation_done` for the map).
fn reply(
    what: Asked,
    volume: u16,
    id: u64,
    offset: u64,
    len: u32,
    errno: u32,
    data: Option<DataRef>,
) -> Msg {
    match what {
        Asked::Resync => Msg::ResyncReply {
            volume,
            id,
            offset,
            errno,
            lacking: NodeSet::EMPTY,
            len,
            data,
        },
        Asked::Read => Msg::ReadReply {
            id,
            errno,
            len,
            data,
        },
        Asked::Allocation => Msg::AllocReply {
            volume,
            id,
            errno,
            extents: 0,
            data: None,
        },
    }
}
