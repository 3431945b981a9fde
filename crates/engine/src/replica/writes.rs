//! The Primary's application writes: their ordering (overlapping writes are never in
//! flight together; later ones wait in arrival order), what each replica made of them,
//! and when one is done.

use super::bitmap::Bitmap;
use super::msg::{DataRef, Msg};
use super::nodeset::NodeSet;
use super::overlap::{InFlight, Waiting};
use super::spec::{NodeId, Protocol};
use crate::io::{DiskKind, Io, IoError, ReqId};
use rustc_hash::FxHashMap as HashMap;
use tandem_wire::packet::write_flags as wf;
use tandem_wire::Errno;

/// The local replica's part of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Pending,
    Done(bool),
    NotApplicable,
}

#[derive(Debug)]
pub(super) struct AppWrite {
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) fua: bool,
    pub(super) local: Stage,
    pub(super) peers_pending: NodeSet,
    pub(super) peers_ok: NodeSet,
    /// Diskful peers that did not get it (down, failed, dropped before confirming): their
    /// out-of-sync bits are set once the write landed somewhere, even if it then failed
    /// (its FUA flush not vouched for by an up-to-date replica). A write that reached
    /// nobody changed nothing, so it marks nothing (bits set for it would make every
    /// replica believe it lacks the block).
    pub(super) missing: NodeSet,
    /// Peers its FUA barrier missed (their link dropped first, or their fdatasync
    /// failed): they may hold it, but not durably. Like `missing`, they make it wait for
    /// the generation ids to change (see `Requests::flush_waits_for_ids`); unlike it,
    /// they are not marked as lacking it.
    pub(super) unflushed: NodeSet,
    /// Peers that acknowledged receipt: one whose link then dropped may have written it
    /// (see [`AppWrite::may_hold`]).
    pub(super) received: NodeSet,
    /// Peers it went to whose replica was up to date then, or when they answered.
    pub(super) current: NodeSet,
    /// Our own replica was up to date when it started.
    pub(super) local_current: bool,
    /// The peers it was sent to (the others were not connected: they missed it).
    pub(super) sent_to: NodeSet,
    /// Set once the FUA barrier started.
    barrier: bool,
    /// Its completion was checked against the generation ids (it may wait for them to
    /// change: `parked`).
    pub(super) rotated: bool,
    parked: bool,
    /// Its sequence number, once sent (see `settle.rs`).
    pub(super) seq: u64,
    /// When a peer's answer satisfies it (set when sent, see `Requests::start_write`).
    pub(super) protocol: Protocol,
}

impl AppWrite {
    pub(super) fn new(volume: u16, shape: &Shape, local: bool) -> AppWrite {
        AppWrite {
            volume,
            offset: shape.offset,
            len: shape.len,
            fua: shape.fua,
            local: if local {
                Stage::Pending
            } else {
                Stage::NotApplicable
            },
            peers_pending: NodeSet::EMPTY,
            peers_ok: NodeSet::EMPTY,
            missing: NodeSet::EMPTY,
            unflushed: NodeSet::EMPTY,
            received: NodeSet::EMPTY,
            current: NodeSet::EMPTY,
            local_current: false,
            sent_to: NodeSet::EMPTY,
            barrier: false,
            rotated: false,
            parked: false,
            seq: 0,
            protocol: Protocol::C,
        }
    }

    /// It is on some replica (so replicas that missed it now differ).
    pub(super) fn landed(&self) -> bool {
        self.local == Stage::Done(true) || !self.peers_ok.is_empty()
    }

    /// It landed on a replica that was up to date: one that can vouch for it. A write that
    /// landed only on replicas being synced fails (as one whose FUA flush none of them
    /// can vouch for does): such a replica, restarted, forgets what it was written apart
    /// from its resync, and the range's newest data would lie split between replicas none
    /// of which is current (overlapping seed 3164: the up-to-date replica's link dropped
    /// under a write that then landed only on the one being synced; each then lacked
    /// blocks only the other held).
    /// `attached`: our replica is still attached (one that failed since, as its
    /// fdatasync's error detached it, holds it no more: disk-errors soak seed 175058684,
    /// acknowledged after the detach with no other copy).
    pub(super) fn vouched(&self, attached: bool) -> bool {
        (self.local == Stage::Done(true) && self.local_current && attached)
            || self.peers_ok.intersects(self.current)
    }

    /// Some replica may hold it: it landed, or a peer received it before its link
    /// dropped (and may have written it). The replicas that never got it may then differ
    /// from that one (soak seed 109066599: a write failed after its only target received
    /// and wrote it; nobody marked the replica that was away, whose protection of an
    /// older write in that range then kept the two different).
    pub(super) fn may_hold(&self) -> bool {
        self.landed() || !self.received.is_empty()
    }

    /// `peer`'s replica failed it after the peer said it received or wrote it (its disk
    /// rejected the write, or the flush under it, and detached): it holds nothing and
    /// vouches for nothing. Only while the write is open (not `rotated`): a write already
    /// decided keeps its answer.
    pub(super) fn failed_on(&mut self, peer: NodeId) {
        self.missing.insert(peer);
        if !self.rotated {
            self.peers_ok.remove(peer);
            self.current.remove(peer);
            self.received.remove(peer);
        }
    }
}

/// What an application write does to a replica, whatever its NBD command.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) fua: bool,
    pub(super) kind: DiskKind,
    /// Write flags every replica gets beyond the acknowledgement ones.
    pub(super) flags: u32,
}

impl Shape {
    pub(super) fn of(io: Io) -> Shape {
        match io {
            Io::Write { offset, len, fua } => Shape {
                offset,
                len,
                fua,
                kind: DiskKind::Write { offset, len },
                flags: 0,
            },
            // TRIM is carried out as zeroing on every replica, so replicas stay identical
            // whatever each store's hole-punching support.
            Io::Trim { offset, len, fua } => Shape {
                offset,
                len,
                fua,
                kind: DiskKind::Zero {
                    offset,
                    len,
                    may_punch: true,
                    fast: false,
                },
                flags: wf::MAY_PUNCH,
            },
            Io::Zero {
                offset,
                len,
                fua,
                may_punch,
                fast,
            } => Shape {
                offset,
                len,
                fua,
                kind: DiskKind::Zero {
                    offset,
                    len,
                    may_punch,
                    fast,
                },
                flags: if may_punch { wf::MAY_PUNCH } else { 0 },
            },
            _ => unreachable!("not a write"),
        }
    }
}

impl Shape {
    /// The write as sent to a replica.
    pub(super) fn msg(
        &self,
        volume: u16,
        seq: u64,
        flags: u32,
        targets: u32,
        data: DataRef,
    ) -> Msg {
        let (offset, len) = (self.offset, self.len);
        match self.kind {
            DiskKind::Write { .. } => Msg::Write {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
                data,
            },
            _ => Msg::Zero {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
            },
        }
    }
}

/// What a write needs next, once no replica's answer is pending.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    Wait,
    /// A FUA write that landed: a barrier over every replica makes it durable.
    Barrier(u16),
    Finish(Result<(), IoError>),
}

/// One volume's ordering of writes.
#[derive(Debug, Default)]
struct VolWrites {
    in_flight: InFlight<ReqId>,
    waiting: Waiting<(ReqId, Io)>,
}

#[derive(Debug)]
pub(super) struct Writes {
    by_req: HashMap<ReqId, AppWrite>,
    vols: Vec<VolWrites>,
    next_seq: u64,
}

impl Writes {
    pub(super) fn new(volumes: usize) -> Writes {
        Writes {
            by_req: HashMap::default(),
            vols: (0..volumes).map(|_| VolWrites::default()).collect(),
            next_seq: 1,
        }
    }

    /// The sequence number of the next replicated write (peers apply in this order).
    pub(super) fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Whether a write of this range must wait for an overlapping one in flight or queued.
    pub(super) fn must_wait(&self, v: usize, offset: u64, len: u64) -> bool {
        let w = &self.vols[v];
        w.in_flight.overlaps(offset, len) || w.waiting.blocks(offset, len)
    }

    pub(super) fn queue(&mut self, v: usize, req: ReqId, io: Io, offset: u64, len: u64) {
        self.vols[v].waiting.push(offset, len, (req, io));
    }

    /// Queued writes free to start now.
    pub(super) fn ready(&mut self, v: usize) -> Vec<(ReqId, Io)> {
        let w = &mut self.vols[v];
        w.waiting.ready(&w.in_flight)
    }

    pub(super) fn begin(&mut self, req: ReqId, w: AppWrite) {
        self.vols[w.volume as usize]
            .in_flight
            .insert(w.offset, u64::from(w.len), req);
        self.by_req.insert(req, w);
    }

    /// Takes a write out, done.
    pub(super) fn end(&mut self, req: ReqId) -> AppWrite {
        let w = self
            .by_req
            .remove(&req)
            .expect("finishing an unknown write");
        self.vols[w.volume as usize].in_flight.remove(w.offset, req);
        w
    }

    /// It waits for the generation ids to change; nothing else may finish it meanwhile.
    pub(super) fn park(&mut self, req: ReqId) {
        if let Some(w) = self.by_req.get_mut(&req) {
            w.parked = true;
        }
    }

    pub(super) fn get_mut(&mut self, req: ReqId) -> Option<&mut AppWrite> {
        self.by_req.get_mut(&req)
    }

    pub(super) fn contains(&self, req: ReqId) -> bool {
        self.by_req.contains_key(&req)
    }

    pub(super) fn len(&self) -> usize {
        self.by_req.len()
    }

    pub(super) fn in_flight(&self, v: usize) -> usize {
        self.vols[v].in_flight.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&ReqId, &AppWrite)> {
        self.by_req.iter()
    }

    /// A write in flight on volume `v` missed `peer`: its bits are not set yet.
    pub(super) fn missing(&self, v: usize, peer: NodeId) -> bool {
        self.by_req
            .values()
            .any(|w| w.volume as usize == v && w.missing.contains(peer))
    }

    /// A peer answered for the write (`ok`: as its protocol asks; `current(volume)`: its
    /// replica is up to date now, having written it).
    pub(super) fn answered(
        &mut self,
        req: ReqId,
        peer: NodeId,
        ok: bool,
        current: impl Fn(usize, u64, u32) -> bool,
    ) {
        if let Some(w) = self.by_req.get_mut(&req) {
            w.peers_pending.remove(peer);
            if ok {
                w.peers_ok.insert(peer);
                if current(w.volume as usize, w.offset, w.len) {
                    w.current.insert(peer);
                }
            }
        }
    }

    /// Our replica of volume `v` is up to date now: the writes in flight it takes (written
    /// as fresh sectors during its resync, never overwritten by the resync's older data)
    /// are on a current replica, as for a peer (`peer_current`). A diskful Primary whose
    /// own resync ended while a write was in flight failed that write when the one peer
    /// that was current went away (cluster-crash + power-loss soak seed 215025115).
    pub(super) fn local_current(&mut self, v: usize) {
        for w in self.by_req.values_mut() {
            if w.volume as usize == v && w.local != Stage::NotApplicable {
                w.local_current = true;
            }
        }
    }

    /// `peer`'s replica of volume `v` is up to date now: the writes in flight it wrote
    /// (protected from its resync's older data) are on a current replica.
    pub(super) fn peer_current(&mut self, v: usize, peer: NodeId, lacks: &Bitmap) {
        for w in self.by_req.values_mut() {
            if w.volume as usize == v
                && w.peers_ok.contains(peer)
                && !lacks.any_partial(w.offset, u64::from(w.len))
            {
                w.current.insert(peer);
            }
        }
    }

    /// What the write needs next; a barrier is started once. `attached(volume)`: see
    /// [`AppWrite::vouched`].
    pub(super) fn next(&mut self, req: ReqId, attached: impl Fn(usize) -> bool) -> Next {
        let Some(w) = self.by_req.get_mut(&req) else {
            return Next::Wait;
        };
        if w.local == Stage::Pending || !w.peers_pending.is_empty() || w.barrier || w.parked {
            return Next::Wait;
        }
        let ok = w.vouched(attached(w.volume as usize));
        if ok && w.fua {
            w.barrier = true;
            return Next::Barrier(w.volume);
        }
        Next::Finish(if ok {
            Ok(())
        } else {
            Err(IoError::Os(Errno::Io.code() as i32))
        })
    }

    pub(super) fn check(&self, peers: NodeSet, down: NodeSet) -> Result<(), String> {
        for (v, vw) in self.vols.iter().enumerate() {
            vw.in_flight
                .check()
                .map_err(|e| format!("volume {v}: writes: {e}"))?;
        }
        for (req, w) in &self.by_req {
            if w.peers_pending.intersects(w.peers_ok) {
                return Err(format!("{req:?}: a peer both pending and done"));
            }
            if !w
                .peers_pending
                .union(w.peers_ok)
                .union(w.missing)
                .is_subset(peers)
            {
                return Err(format!("{req:?}: a peer bit beyond the peers"));
            }
            if !self.vols[w.volume as usize].in_flight.holds(w.offset, *req) {
                return Err(format!("{req:?}: started but not in flight"));
            }
            if w.peers_pending.intersects(down) {
                return Err(format!("{req:?} waits on a peer that is down"));
            }
        }
        Ok(())
    }
}
