//! One replicated resource as its local node sees it.
//!
//! The write path: the Primary writes locally (if it has a replica) and sends the write to
//! every connected diskful peer; the application's write completes when the local write is
//! done and every targeted peer satisfies the protocol (A: sent, B: received, C: written).
//! Overlapping writes are never in flight together (see `overlap`), and each peer applies a
//! connection's overlapping writes in arrival order, so every replica sees the same order.
//! FLUSH and FUA become a barrier on every replica: a local fdatasync plus a Barrier packet
//! that each peer answers once every write received before it is written and flushed.
//!
//! Out-of-sync tracking: every write a peer may lack (it was disconnected, it failed the
//! write, the connection dropped before its WriteAck) sets bits in that peer's bitmap. On
//! reconnect, the up-to-date side lists those ranges to the peer, which pulls them in block
//! order (a peer whose state is unknown, such as one that restarted, is resynced in full).

use super::action::{PromoteError, RAction};
use super::bitmap::Bitmap;
use super::msg::{DataRef, Msg, Token};
use super::nodeset::NodeSet;
use super::overlap::{InFlight, Waiting};
use super::peer::{ListState, Peer, PeerVol, Unacked};
use super::resync::{Resync, SECTOR};
use super::spec::{NodeId, Protocol, ReplicaAtStart, ResourceSpec};
use super::status::{PeerStatus, PeerVolumeStatus, Repl, Status, VolumeStatus};
use crate::flush::FlushBatcher;
use crate::io::{DiskKind, Io, IoError, ReqId};
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tandem_wire::packet::{volume_flags, write_flags as wf, Packet};
use tandem_wire::packet::{DiskState, Role};

mod invariants;

/// Tells `peer` it lacks this range of volume `v`; `(0, 0)` ends a list.
fn out_of_sync(peer: NodeId, v: usize, offset: u64, len: u32) -> RAction {
    RAction::Send {
        peer,
        msg: Msg::OutOfSync {
            volume: v as u16,
            offset,
            len,
        },
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Pending,
    Done(bool),
    NotApplicable,
}

#[derive(Debug)]
struct AppWrite {
    volume: u16,
    offset: u64,
    fua: bool,
    local: Stage,
    peers_pending: NodeSet,
    peers_ok: NodeSet,
    /// Diskful peers that did not get it (down, failed, dropped before confirming): their
    /// out-of-sync bits are set once the write landed somewhere, even if it then failed
    /// (its FUA flush not vouched for by an up-to-date replica). A write that reached
    /// nobody changed nothing, so it marks nothing (bits set for it would make every
    /// replica believe it lacks the block).
    missing: NodeSet,
    len: u32,
    /// Set once the FUA barrier started.
    barrier: bool,
}

#[derive(Debug)]
struct AppRead {
    volume: u16,
    offset: u64,
    len: u32,
    /// The peer asked, or `None` for the local replica.
    from: Option<NodeId>,
    tried: NodeSet,
}

/// A durability barrier over every replica: local fdatasync plus a Barrier per peer.
#[derive(Debug, Default)]
struct FlushOp {
    /// FLUSH requests and FUA writes waiting for it, with the volume each is about.
    waiters: Vec<(ReqId, u16)>,
    local_pending: bool,
    local_ok: bool,
    peers_pending: NodeSet,
    peers_ok: NodeSet,
}

#[derive(Debug)]
enum FlushWaiter {
    Op(u64),
    PeerBarrier {
        peer: NodeId,
        id: u64,
    },
    /// A resync finished: flush before declaring the replica up to date.
    ResyncDone {
        volume: u16,
    },
}

#[derive(Debug)]
struct Vol {
    size: u64,
    disk: DiskState,
    diskful: bool,
    /// Created empty at start, no data received since (see [`ReplicaAtStart::Created`]).
    created: bool,
    /// Found at start (Outdated: currency unknown) and not UpToDate since: peers with
    /// current data list everything to it, even once it is being synced (simulator seed
    /// 60032299: a restarted replica pulled everything from a peer cut off from the
    /// Primary, which lacked a write the restarted one had; the Primary, meeting it
    /// mid-resync, listed only what it knew it had missed, and the write was gone).
    unproven: bool,
    in_flight: InFlight<ReqId>,
    waiting: Waiting<(ReqId, Io)>,
    /// Writes applied here for peers (replication and resync), in flight on the disk.
    applying: InFlight<Token>,
    held: Waiting<HeldWrite>,
    /// Reads from peers waiting for an overlapping write to finish here.
    /// (peer, its connection, id, offset, len, resync?)
    reads_waiting: Vec<(NodeId, u32, u64, u64, u32, bool)>,
    resync: Option<Resync>,
    /// Resync requests still unanswered when their resync was dropped (a new cluster
    /// found meanwhile): their replies are ignored.
    abandoned: BTreeSet<u64>,
}

#[derive(Debug, Clone, Copy)]
struct HeldWrite {
    token: Token,
    offset: u64,
    len: u32,
    kind: DiskKind,
    data: Option<DataRef>,
}

/// The replicated engine of one resource on one node.
#[derive(Debug)]
pub struct Resource {
    spec: ResourceSpec,
    role: Role,
    vols: Vec<Vol>,
    peers: Vec<Peer>,
    writes: HashMap<ReqId, AppWrite>,
    reads: HashMap<ReqId, AppRead>,
    next_seq: u64,
    next_id: u64,
    flush_ops: HashMap<u64, FlushOp>,
    flusher: FlushBatcher,
    flush_waiters: HashMap<u64, FlushWaiter>,
    read_rr: usize,
    now_ms: u64,
}

const EIO: u32 = 5;
const EAGAIN: u32 = 11;

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
                // The only replica of the volume, created now: a new cluster of one.
                let alone = !spec
                    .nodes
                    .iter()
                    .any(|(id, replicas)| *id != spec.me && replicas[v]);
                let (disk, created, resync) = match found {
                    ReplicaAtStart::None => (DiskState::Diskless, false, None),
                    ReplicaAtStart::Created if alone => (DiskState::UpToDate, false, None),
                    ReplicaAtStart::Created => {
                        // It lacks everything, whatever the peers list.
                        let mut rs = Resync::new(size, false);
                        rs.to_pull.set_all();
                        (DiskState::Inconsistent, true, Some(rs))
                    }
                    ReplicaAtStart::Existing => (DiskState::Outdated, false, None),
                    ReplicaAtStart::UpToDate => (DiskState::UpToDate, false, None),
                };
                Vol {
                    size,
                    disk,
                    created,
                    unproven: found == ReplicaAtStart::Existing,
                    diskful: me.1[v],
                    in_flight: InFlight::default(),
                    waiting: Waiting::default(),
                    applying: InFlight::default(),
                    held: Waiting::default(),
                    reads_waiting: Vec::new(),
                    resync,
                    abandoned: BTreeSet::new(),
                }
            })
            .collect();
        let peers = spec
            .nodes
            .iter()
            .filter(|(id, _)| *id != spec.me)
            .map(|(id, diskful)| Peer {
                id: *id,
                up: false,
                role: Role::Secondary,
                vols: diskful
                    .iter()
                    .zip(&spec.sizes)
                    .map(|(&d, &size)| PeerVol {
                        diskful: d,
                        list: ListState::NotSent,
                        listed: false,
                        written_before_list: Vec::new(),
                        disk: None,
                        created: false,
                        unproven: false,
                        oos: Bitmap::new(size),
                        repl: Repl::Off,
                        apart: None,
                        peer_wrote_apart: false,
                        claimed: 0,
                    })
                    .collect(),
                unacked: BTreeMap::new(),
                app_waiting: BTreeMap::new(),
                barriers_out: BTreeMap::new(),
                reads_out: BTreeMap::new(),
                rx_pending: BTreeSet::new(),
                conn: 0,
                rx_last_seq: 0,
                barriers_in: VecDeque::new(),
                last_rx_ms: 0,
                ping_sent_ms: None,
            })
            .collect();
        Resource {
            spec,
            role: Role::Secondary,
            vols,
            peers,
            writes: HashMap::default(),
            reads: HashMap::default(),
            next_seq: 1,
            next_id: 1,
            flush_ops: HashMap::default(),
            flusher: FlushBatcher::default(),
            flush_waiters: HashMap::default(),
            read_rr: 0,
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
        self.writes.len()
            + self.reads.len()
            + self
                .flush_ops
                .values()
                .map(|f| f.waiters.len())
                .sum::<usize>()
    }

    pub fn status(&self) -> Status {
        let mut st = Status {
            role: self.role,
            volumes: self
                .vols
                .iter()
                .map(|v| VolumeStatus {
                    disk: v.disk,
                    size: v.size,
                    writes_in_flight: v.in_flight.len(),
                    resync_remaining: v.resync.as_ref().map(Resync::remaining),
                    up_to_date_within_reach: false,
                })
                .collect(),
            peers: self
                .peers
                .iter()
                .map(|p| PeerStatus {
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
                })
                .collect(),
            app_in_flight: self.app_in_flight(),
        };
        for (v, vs) in st.volumes.iter_mut().enumerate() {
            vs.up_to_date_within_reach = self.up_to_date_within_reach(v);
        }
        st
    }

    /// This node's replica of volume `v` or a connected peer's is UpToDate: reads can be
    /// served and writes vouched for.
    fn up_to_date_within_reach(&self, v: usize) -> bool {
        let vol = &self.vols[v];
        (vol.diskful && vol.disk == DiskState::UpToDate)
            || self
                .peers
                .iter()
                .any(|p| p.up && p.vols[v].diskful && p.vols[v].disk == Some(DiskState::UpToDate))
    }

    fn peer_index(&self, id: NodeId) -> Option<usize> {
        self.peers.iter().position(|p| p.id == id)
    }

    /// The set holding the peer at index `idx`.
    fn bit(&self, idx: usize) -> NodeSet {
        NodeSet::one(self.peers[idx].id)
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
        if let Some(p) = self.peers.iter().find(|p| p.up && p.role == Role::Primary) {
            return Err(PromoteError::PeerPrimary(p.id));
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
        for (v, vol) in self.vols.iter().enumerate() {
            let local = vol.disk == DiskState::UpToDate;
            let remote = self
                .peers
                .iter()
                .any(|p| p.up && p.vols[v].disk == Some(DiskState::UpToDate));
            if !local && !remote {
                return Err(PromoteError::NoUpToDate(v as u16));
            }
        }
        self.role = Role::Primary;
        out.push(RAction::Note("promoted to Primary".into()));
        self.broadcast(Msg::Role(Role::Primary), out);
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
        self.broadcast(Msg::Role(Role::Secondary), out);
        Ok(())
    }

    /// Whether any connected peer is Primary.
    pub fn peer_primary(&self) -> Option<NodeId> {
        self.peers
            .iter()
            .find(|p| p.up && p.role == Role::Primary)
            .map(|p| p.id)
    }

    fn broadcast(&self, msg: Msg, out: &mut Vec<RAction>) {
        for p in self.peers.iter().filter(|p| p.up) {
            out.push(RAction::Send { peer: p.id, msg });
        }
    }

    // ------------------------------------------------------------------ application I/O

    /// A new application request on `volume`, already validated by the frontend.
    pub fn submit(&mut self, req: ReqId, volume: u16, io: Io, out: &mut Vec<RAction>) {
        self.submit_event(req, volume, io, out);
        self.debug_check();
    }

    fn submit_event(&mut self, req: ReqId, volume: u16, io: Io, out: &mut Vec<RAction>) {
        if self.role != Role::Primary {
            return out.push(RAction::Complete {
                req,
                result: Err(IoError::ReadOnly),
                data: None,
            });
        }
        let v = volume as usize;
        match io {
            Io::Read { offset, len } => self.start_read(req, volume, offset, len, out),
            Io::Cache { .. } => out.push(RAction::Complete {
                req,
                result: Ok(()),
                data: None,
            }),
            Io::Flush => self.start_barrier(vec![(req, volume)], out),
            // No replica can promise that every other one zeroes fast too, and a zero done
            // on some replicas and refused on others would make them differ.
            Io::Zero { fast: true, .. } => out.push(RAction::Complete {
                req,
                result: Err(IoError::NotFast),
                data: None,
            }),
            Io::Write { offset, len, .. }
            | Io::Trim { offset, len, .. }
            | Io::Zero { offset, len, .. } => {
                if !self.writable(v) {
                    return out.push(RAction::Complete {
                        req,
                        result: Err(IoError::NoData),
                        data: None,
                    });
                }
                let vol = &mut self.vols[v];
                let (o, l) = (offset, u64::from(len));
                if vol.in_flight.overlaps(o, l) || vol.waiting.blocks(o, l) {
                    if matches!(io, Io::Write { .. }) {
                        out.push(RAction::Retain {
                            from: DataRef::Request(req),
                            key: Token::App(req),
                        });
                    }
                    vol.waiting.push(o, l, (req, io));
                    return;
                }
                self.start_write(req, volume, io, DataRef::Request(req), out);
            }
        }
    }

    /// Writes need a replica that is current somewhere.
    fn writable(&self, v: usize) -> bool {
        self.vols[v].disk == DiskState::UpToDate
            || self
                .peers
                .iter()
                .any(|p| p.up && p.vols[v].disk == Some(DiskState::UpToDate))
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
        let seq = self.next_seq;
        self.next_seq += 1;
        let (offset, len, fua, kind, flags_extra) = match io {
            Io::Write { offset, len, fua } => {
                (offset, len, fua, DiskKind::Write { offset, len }, 0)
            }
            // TRIM is carried out as zeroing on every replica, so replicas stay identical
            // whatever each store's hole-punching support.
            Io::Trim { offset, len, fua } => (
                offset,
                len,
                fua,
                DiskKind::Zero {
                    offset,
                    len,
                    may_punch: true,
                    fast: false,
                },
                wf::MAY_PUNCH,
            ),
            Io::Zero {
                offset,
                len,
                fua,
                may_punch,
                fast,
            } => (
                offset,
                len,
                fua,
                DiskKind::Zero {
                    offset,
                    len,
                    may_punch,
                    fast,
                },
                if may_punch { wf::MAY_PUNCH } else { 0 },
            ),
            _ => unreachable!("not a write"),
        };
        let local_writes = self.vols[v].diskful
            && matches!(
                self.vols[v].disk,
                DiskState::UpToDate | DiskState::Inconsistent
            );
        let mut w = AppWrite {
            volume,
            offset,
            fua,
            local: if local_writes {
                Stage::Pending
            } else {
                Stage::NotApplicable
            },
            peers_pending: NodeSet::EMPTY,
            peers_ok: NodeSet::EMPTY,
            missing: NodeSet::EMPTY,
            len,
            barrier: false,
        };
        if local_writes {
            self.data_arrives(v, out);
            let data = matches!(kind, DiskKind::Write { .. }).then_some(data);
            let token = Token::App(req);
            let vol = &mut self.vols[v];
            let (o, l) = (kind.offset(), u64::from(kind.len()));
            if vol.applying.overlaps(o, l) || vol.held.blocks(o, l) {
                // A Primary being synced: a resync write to this range is on its way to
                // the disk, and disks complete in any order, so this newer write waits
                // for it (else the older resync data may land last: simulator seed
                // 40014553, a new cluster's Primary still pulling).
                let data = data.map(|d| match d {
                    DataRef::Held { .. } => d,
                    _ => {
                        out.push(RAction::Retain {
                            from: d,
                            key: token,
                        });
                        DataRef::Held { key: token, at: 0 }
                    }
                });
                vol.held.push(
                    o,
                    l,
                    HeldWrite {
                        token,
                        offset: o,
                        len: kind.len(),
                        kind,
                        data,
                    },
                );
            } else {
                out.push(RAction::Disk {
                    volume,
                    token,
                    kind,
                    data,
                });
            }
        }
        // Protocol A completes a write once it is in the send buffer, which is safe only
        // because the local replica has it. Without one, wait for receipt (protocol B).
        let protocol = match self.spec.protocol {
            Protocol::A if !local_writes => Protocol::B,
            p => p,
        };
        let now = self.now_ms;
        let mut targets = if local_writes {
            NodeSet::one(self.spec.me)
        } else {
            NodeSet::EMPTY
        };
        for p in self.peers.iter().filter(|p| p.up && p.vols[v].diskful) {
            targets.insert(p.id);
        }
        let targets = targets.bits();
        for i in 0..self.peers.len() {
            let bit = self.bit(i);
            let p = &mut self.peers[i];
            if !p.vols[v].diskful {
                continue;
            }
            if !p.up {
                w.missing |= bit;
                continue;
            }
            let mut flags = wf::ACK_WRITE | flags_extra;
            if fua {
                flags |= wf::FUA;
            }
            // Receipt is always acknowledged (protocol B completes on it); it does not make
            // the write in sync there: the peer may die before writing it (see peer_down).
            flags |= wf::ACK_RECV;
            let msg = match kind {
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
            };
            out.push(RAction::Send { peer: p.id, msg });
            p.unacked.insert(
                seq,
                Unacked {
                    volume,
                    offset,
                    len,
                    sent_ms: now,
                    req,
                },
            );
            if protocol == Protocol::A {
                w.peers_ok |= bit;
            } else {
                w.peers_pending |= bit;
                p.app_waiting.insert(seq, req);
            }
        }
        self.vols[v].in_flight.insert(offset, u64::from(len), req);
        self.writes.insert(req, w);
        self.check_write(req, out);
    }

    fn check_write(&mut self, req: ReqId, out: &mut Vec<RAction>) {
        let Some(w) = self.writes.get_mut(&req) else {
            return;
        };
        if w.local == Stage::Pending || !w.peers_pending.is_empty() || w.barrier {
            return;
        }
        let ok = w.local == Stage::Done(true) || !w.peers_ok.is_empty();
        if ok && w.fua {
            w.barrier = true;
            let volume = w.volume;
            return self.start_barrier(vec![(req, volume)], out);
        }
        self.finish_write(
            req,
            if ok {
                Ok(())
            } else {
                Err(IoError::Os(EIO as i32))
            },
            out,
        );
    }

    fn finish_write(&mut self, req: ReqId, result: Result<(), IoError>, out: &mut Vec<RAction>) {
        let w = self
            .writes
            .remove(&req)
            .expect("finishing an unknown write");
        let size = self.vols[w.volume as usize].size;
        let landed = w.local == Stage::Done(true) || !w.peers_ok.is_empty();
        for p in self.peers.iter_mut() {
            let up = p.up;
            let pv = &mut p.vols[w.volume as usize];
            // Written as Primary without it: if it was Primary apart from us too, this
            // is half of a split brain (a diskless one holds none of it, but its own
            // writes went to replicas that lack ours).
            let missed = w.missing.contains(p.id);
            if result.is_ok() && (missed || (!pv.diskful && !up)) {
                pv.apart
                    .get_or_insert_with(|| Bitmap::new(size))
                    .set_range(w.offset, u64::from(w.len));
            }
            // A failed write may still have landed on some replica (simulator seed
            // 3017270: written on a Secondary being synced, whose flush could not vouch
            // for it, while the other was cut off), so the replicas that missed it differ.
            if landed && missed {
                pv.oos.set_range(w.offset, u64::from(w.len));
                if pv.list == ListState::Sent {
                    pv.list = ListState::Stale;
                }
            }
        }
        // Lists that waited for this write to mark its bits.
        for i in 0..self.peers.len() {
            let id = self.peers[i].id;
            let v = w.volume as usize;
            if self.peers[i].up
                && self.peers[i].vols[v].list == ListState::Deferred
                && !self
                    .writes
                    .values()
                    .any(|o| o.volume == w.volume && o.missing.contains(id))
            {
                self.send_out_of_sync(i, v, out);
            }
        }
        let vol = &mut self.vols[w.volume as usize];
        vol.in_flight.remove(w.offset, req);
        out.push(RAction::Complete {
            req,
            result,
            data: None,
        });
        // A waiting write that fails at once never enters the in-flight set, so the writes
        // queued behind it are free to go too: ask again until nothing more is ready (once
        // was not enough: the third of three overlapping writes waited forever after the
        // last replica went away, and its client hung).
        loop {
            let vol = &mut self.vols[w.volume as usize];
            let ready = vol.waiting.ready(&vol.in_flight);
            if ready.is_empty() {
                break;
            }
            for (r, io) in ready {
                if self.role != Role::Primary || !self.writable(w.volume as usize) {
                    out.push(RAction::Complete {
                        req: r,
                        result: Err(IoError::NoData),
                        data: None,
                    });
                    continue;
                }
                self.start_write(
                    r,
                    w.volume,
                    io,
                    DataRef::Held {
                        key: Token::App(r),
                        at: 0,
                    },
                    out,
                );
            }
        }
    }

    fn start_read(
        &mut self,
        req: ReqId,
        volume: u16,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        let read = AppRead {
            volume,
            offset,
            len,
            from: None,
            tried: NodeSet::EMPTY,
        };
        self.reads.insert(req, read);
        self.route_read(req, out);
    }

    /// Sends a read to the local replica if it is up to date, else to an up-to-date peer
    /// (round robin), else fails it.
    fn route_read(&mut self, req: ReqId, out: &mut Vec<RAction>) {
        let r = self.reads.get_mut(&req).expect("routing an unknown read");
        let v = r.volume as usize;
        if self.vols[v].disk == DiskState::UpToDate {
            r.from = None;
            let kind = DiskKind::Read {
                offset: r.offset,
                len: r.len,
            };
            return out.push(RAction::Disk {
                volume: r.volume,
                token: Token::App(req),
                kind,
                data: None,
            });
        }
        let candidates: Vec<usize> = (0..self.peers.len())
            .filter(|&i| {
                let p = &self.peers[i];
                // A peer says UpToDate until it hears what it missed: never read from it
                // where we know it lacks writes.
                p.up && p.vols[v].disk == Some(DiskState::UpToDate)
                    && !p.vols[v].oos.any_in(r.offset, u64::from(r.len))
                    && !r.tried.contains(p.id)
            })
            .collect();
        if candidates.is_empty() {
            self.reads.remove(&req);
            return out.push(RAction::Complete {
                req,
                result: Err(IoError::NoData),
                data: None,
            });
        }
        self.read_rr = self.read_rr.wrapping_add(1);
        let i = candidates[self.read_rr % candidates.len()];
        r.tried.insert(self.peers[i].id);
        r.from = Some(self.peers[i].id);
        let (volume, offset, len) = (r.volume, r.offset, r.len);
        let id = self.alloc_id();
        let p = &mut self.peers[i];
        p.reads_out.insert(id, req);
        out.push(RAction::Send {
            peer: p.id,
            msg: Msg::ReadReq {
                volume,
                id,
                offset,
                len,
            },
        });
    }

    /// Whether a completed barrier makes volume `v` durable. A replica that flushed says
    /// nothing about a volume it does not keep (with volumes on different nodes, our
    /// fdatasync of volume 0 must not answer for volume 1), nor about one it is still
    /// syncing: that one is flushed too, but may lack a write only a replica gone meanwhile
    /// had. So only a replica UpToDate now answers: a peer's state reaches us in order with
    /// its acknowledgement, and one that finished its resync first flushed all it pulled.
    fn barrier_answers_for(&self, v: usize, local_ok: bool, peers_ok: NodeSet) -> bool {
        let vol = &self.vols[v];
        (local_ok && vol.diskful && vol.disk == DiskState::UpToDate)
            || self.peers.iter().any(|p| {
                peers_ok.contains(p.id)
                    && p.up
                    && p.vols[v].diskful
                    && p.vols[v].disk == Some(DiskState::UpToDate)
            })
    }

    /// Starts a barrier over every replica for these waiters.
    fn start_barrier(&mut self, waiters: Vec<(ReqId, u16)>, out: &mut Vec<RAction>) {
        let id = self.alloc_id();
        let local = self
            .vols
            .iter()
            .any(|v| v.diskful && matches!(v.disk, DiskState::UpToDate | DiskState::Inconsistent));
        let mut op = FlushOp {
            waiters,
            ..FlushOp::default()
        };
        if local {
            op.local_pending = true;
            self.request_local_flush(FlushWaiter::Op(id), out);
        } else {
            op.local_ok = false;
        }
        for i in 0..self.peers.len() {
            let bit = self.bit(i);
            let p = &mut self.peers[i];
            if p.up && p.vols.iter().any(|pv| pv.diskful) {
                op.peers_pending |= bit;
                p.barriers_out.insert(id, id);
                out.push(RAction::Send {
                    peer: p.id,
                    msg: Msg::Barrier { id },
                });
            }
        }
        self.flush_ops.insert(id, op);
        self.check_flush(id, out);
    }

    fn check_flush(&mut self, id: u64, out: &mut Vec<RAction>) {
        let Some(op) = self.flush_ops.get(&id) else {
            return;
        };
        if op.local_pending || !op.peers_pending.is_empty() {
            return;
        }
        let op = self.flush_ops.remove(&id).expect("checked above");
        for (req, volume) in op.waiters {
            let result = if self.barrier_answers_for(volume as usize, op.local_ok, op.peers_ok) {
                Ok(())
            } else {
                Err(IoError::Os(EIO as i32))
            };
            if self.writes.contains_key(&req) {
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

    fn request_local_flush(&mut self, waiter: FlushWaiter, out: &mut Vec<RAction>) {
        let key = self.alloc_id();
        self.flush_waiters.insert(key, waiter);
        if let Some(seq) = self.flusher.request(ReqId(key)) {
            out.push(RAction::Disk {
                volume: 0,
                token: Token::Flush(seq),
                kind: DiskKind::Flush,
                data: None,
            });
        }
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
            Token::App(req) => {
                if let Some(r) = self.reads.get(&req) {
                    debug_assert!(r.from.is_none());
                    return match result {
                        Ok(()) => {
                            self.reads.remove(&req);
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
                if self.vols[v].applying.holds(kind.offset(), token) {
                    // It had waited for a resync write (see `start_write`).
                    self.vols[v].applying.remove(kind.offset(), token);
                    self.release_applying(v, out);
                }
                let Some(w) = self.writes.get_mut(&req) else {
                    return;
                };
                w.local = Stage::Done(result.is_ok());
                if let Err(e) = result {
                    self.local_disk_failed(v, &format!("write failed: {e:?}"), out);
                }
                self.check_write(req, out);
            }
            Token::Flush(seq) => {
                if result.is_err() {
                    for v in 0..self.vols.len() {
                        if self.vols[v].diskful {
                            self.local_disk_failed(v, "fdatasync failed", out);
                        }
                    }
                }
                let (covered, next) = self.flusher.finished(seq);
                for key in &covered {
                    match self.flush_waiters.remove(&key.0) {
                        Some(FlushWaiter::Op(id)) => {
                            if let Some(op) = self.flush_ops.get_mut(&id) {
                                op.local_pending = false;
                                op.local_ok = result.is_ok();
                            }
                            self.check_flush(id, out);
                        }
                        Some(FlushWaiter::PeerBarrier { peer, id }) => {
                            let errno = if result.is_ok() { 0 } else { EIO };
                            out.push(RAction::Send {
                                peer,
                                msg: Msg::BarrierAck { id, errno },
                            });
                        }
                        Some(FlushWaiter::ResyncDone { volume }) => {
                            self.resync_finished(volume, result.is_ok(), out)
                        }
                        None => debug_assert!(false, "unknown flush waiter"),
                    }
                }
                self.flusher.recycle(covered);
                if let Some(seq) = next {
                    out.push(RAction::Disk {
                        volume: 0,
                        token: Token::Flush(seq),
                        kind: DiskKind::Flush,
                        data: None,
                    });
                }
            }
            Token::PeerWrite { peer, conn, seq } => {
                self.vols[v].applying.remove(kind.offset(), token);
                let msg = match result {
                    Ok(()) => Msg::WriteAck { seq },
                    Err(e) => {
                        self.local_disk_failed(v, &format!("replicated write failed: {e:?}"), out);
                        Msg::NegAck { seq, errno: EIO }
                    }
                };
                if let Some(i) = self
                    .peer_index(peer)
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
            Token::PeerRead { peer, conn, id } | Token::ResyncRead { peer, conn, id } => {
                let current = self
                    .peer_index(peer)
                    .is_some_and(|i| self.peers[i].up && self.peers[i].conn == conn);
                let DiskKind::Read { offset, len } = kind else {
                    unreachable!("a peer read is a read")
                };
                // A source may learn it lacks the range while the read runs (a peer that
                // connected meanwhile lists it, or has not ended its list yet): then the
                // data it read is not to be trusted, and the target asks again (simulator
                // seed 60017710: a replica cut off from the Primary served a stale block
                // to a restarted one, which overwrote its own newer copy).
                let stale = matches!(token, Token::ResyncRead { .. })
                    && !self.has_range(v, offset, u64::from(len));
                let (errno, data) = match result {
                    Ok(()) if stale => (EAGAIN, None),
                    Ok(()) => (0, Some(DataRef::Disk(token))),
                    Err(_) => (EIO, None),
                };
                if let (Token::ResyncRead { .. }, Ok(()), Some(i), true, false) =
                    (token, result, self.peer_index(peer), current, stale)
                {
                    // The peer pulls this range now; if it misses it, it asks again. Not
                    // if the connection that asked is gone: the reply goes nowhere, and
                    // the range may hold writes made since (simulator seed 30028803: a
                    // write the peer missed while away was forgotten).
                    self.peers[i].vols[v]
                        .oos
                        .clear_range(offset, u64::from(len));
                }
                let msg = if matches!(token, Token::PeerRead { .. }) {
                    Msg::ReadReply {
                        id,
                        errno,
                        len,
                        data,
                    }
                } else {
                    Msg::ResyncReply {
                        volume,
                        id,
                        offset,
                        errno,
                        len,
                        data,
                    }
                };
                if current {
                    out.push(RAction::Send { peer, msg });
                }
            }
            Token::ResyncWrite { .. } => {
                self.vols[v].applying.remove(kind.offset(), token);
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

    fn local_disk_failed(&mut self, v: usize, why: &str, out: &mut Vec<RAction>) {
        if !self.vols[v].diskful || self.vols[v].disk == DiskState::Diskless {
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
        self.vols[v].disk = disk;
        if disk == DiskState::UpToDate {
            self.vols[v].unproven = false;
        }
        // A new cluster's replicas stay "created" when UpToDate (they still hold nothing
        // but zeroes) until data arrives, so nodes that meet later still see a new
        // cluster; any other UpToDate came with data, which cleared it.
        if !matches!(disk, DiskState::Inconsistent | DiskState::UpToDate) {
            self.vols[v].created = false;
        }
        out.push(if detail {
            RAction::Detail(note)
        } else {
            RAction::Note(note)
        });
        self.broadcast_volume(v, out);
    }

    /// What we tell peers of volume `v`.
    /// Our state of volume `v`, as told to the peer at index `i`.
    fn volume_msg(&self, i: usize, v: usize) -> Msg {
        let vol = &self.vols[v];
        Msg::Volume {
            volume: v as u16,
            size: vol.size,
            disk: vol.disk,
            created: vol.created,
            unproven: vol.unproven
                && matches!(vol.disk, DiskState::Outdated | DiskState::Inconsistent),
            wrote_apart: self.peers[i].vols[v].wrote_apart(),
        }
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
        for p in &mut self.peers {
            let pv = &mut p.vols[v];
            if pv.diskful {
                // They make the same decision from the same facts.
                pv.oos.clear_range(0, self.vols[v].size);
                pv.repl = Repl::Established;
            }
        }
        let note = format!(
            "volume {v}: every replica was created empty at its node's start (a new cluster): UpToDate without a sync"
        );
        self.set_disk(v, DiskState::UpToDate, note, out);
    }

    /// Starts peer writes (and serves peer reads) that waited for an overlapping one.
    fn release_applying(&mut self, v: usize, out: &mut Vec<RAction>) {
        let vol = &mut self.vols[v];
        let ready = vol.held.ready(&vol.applying);
        for h in ready {
            vol.applying.insert(h.offset, u64::from(h.len), h.token);
            out.push(RAction::Disk {
                volume: v as u16,
                token: h.token,
                kind: h.kind,
                data: h.data,
            });
        }
        let waiting = std::mem::take(&mut vol.reads_waiting);
        for (peer, conn, id, offset, len, resync) in waiting {
            // A request of a connection that has since gone is forgotten by the peer.
            if self
                .peer_index(peer)
                .is_some_and(|i| self.peers[i].up && self.peers[i].conn == conn)
            {
                self.serve_read(v as u16, peer, id, offset, len, resync, out);
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
        let Some(i) = self.peer_index(peer) else {
            return;
        };
        let now = self.now_ms;
        let p = &mut self.peers[i];
        p.up = true;
        p.conn = p.conn.wrapping_add(1);
        p.rx_pending.clear();
        p.role = Role::Secondary;
        p.last_rx_ms = now;
        p.ping_sent_ms = None;
        p.rx_last_seq = 0;
        for pv in &mut p.vols {
            pv.disk = None;
            pv.created = false;
            pv.unproven = false;
            pv.repl = Repl::Off;
            pv.listed = false;
            pv.written_before_list.clear();
            pv.list = ListState::NotSent;
            pv.peer_wrote_apart = false;
            pv.claimed = 0;
        }
        for (v, vol) in self.vols.iter_mut().enumerate() {
            if let Some(rs) = vol
                .resync
                .as_mut()
                .filter(|rs| rs.lists_open.contains(&peer))
            {
                // Its list was cut off: we cannot know all we lack, so pull everything.
                rs.lists_open.retain(|&n| n != peer);
                rs.to_pull.set_all();
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
        let Some(i) = self.peer_index(peer) else {
            return;
        };
        if !self.peers[i].up {
            return;
        }
        let bit = self.bit(i);
        let p = &mut self.peers[i];
        p.up = false;
        p.role = Role::Secondary;
        // Everything not confirmed written there may be missing there: even a write it
        // received (protocol B's acknowledgement) is lost if the link dropped because the
        // node died before writing it (simulator seed 5001807: the only other replica
        // then pulled the range back from the one that had lost it, and an acknowledged
        // write was gone). Like DRBD, only a write acknowledgement counts.
        let unacked = std::mem::take(&mut p.unacked);
        for u in unacked.into_values() {
            match self.writes.get_mut(&u.req) {
                Some(w) => w.missing |= bit,
                // Completed (protocol A/B): it is on some replica, and maybe not on this one.
                None => self.peers[i].vols[u.volume as usize]
                    .oos
                    .set_range(u.offset, u64::from(u.len)),
            }
        }
        let p = &mut self.peers[i];
        for pv in &mut p.vols {
            pv.disk = None;
            pv.created = false;
            pv.unproven = false;
            pv.repl = Repl::Off;
            pv.listed = false;
            pv.written_before_list.clear();
            pv.list = ListState::NotSent;
        }
        let waiting = std::mem::take(&mut p.app_waiting);
        let barriers = std::mem::take(&mut p.barriers_out);
        let reads = std::mem::take(&mut p.reads_out);
        p.barriers_in.clear();
        out.push(RAction::Note(format!("connection to node {peer} lost")));
        for (_, req) in waiting {
            if let Some(w) = self.writes.get_mut(&req) {
                w.peers_pending -= bit;
            }
            self.check_write(req, out);
        }
        for (id, _) in barriers {
            if let Some(op) = self.flush_ops.get_mut(&id) {
                op.peers_pending -= bit;
            }
            self.check_flush(id, out);
        }
        for (_, req) in reads {
            if self.reads.contains_key(&req) {
                self.route_read(req, out);
            }
        }
        for v in 0..self.vols.len() {
            if self.vols[v]
                .resync
                .as_ref()
                .is_some_and(|r| r.source == Some(peer))
            {
                // Whatever was requested and not written is still missing.
                let rs = self.vols[v].resync.as_mut().expect("checked");
                for (_, (off, len)) in std::mem::take(&mut rs.outstanding) {
                    rs.to_pull.set_range(off, u64::from(len));
                }
                rs.source = None;
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
        let Some(i) = self.peer_index(peer) else {
            return;
        };
        if !self.peers[i].up {
            return;
        }
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
            } => {
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
                self.peers[i].vols[v].unproven = flags & volume_flags::UNPROVEN != 0;
                self.peers[i].vols[v].peer_wrote_apart = flags & volume_flags::WROTE_APART != 0;
                let before = self.peers[i].vols[v].disk;
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
            }
            Packet::Write {
                volume,
                seq,
                offset,
                flags,
                targets,
                data,
            } => {
                let v = self.check_range(volume, offset, data.len() as u64)?;
                let len = data.len() as u32;
                self.receive_write(
                    i,
                    v,
                    seq,
                    flags,
                    targets,
                    DiskKind::Write { offset, len },
                    out,
                )?;
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
            Packet::WriteAck { seq } => {
                let Some(u) = self.peers[i].unacked.remove(&seq) else {
                    return Err(format!("acknowledgement of unknown write {seq}"));
                };
                // It now holds the newest data of every block the write covered whole.
                self.peers[i].vols[u.volume as usize]
                    .oos
                    .clear_range(u.offset, u64::from(u.len));
                if self.spec.protocol == Protocol::C {
                    self.peer_satisfied(i, seq, true, out);
                }
            }
            Packet::NegAck { seq, .. } => {
                let p = &mut self.peers[i];
                let Some(u) = p.unacked.remove(&seq) else {
                    return Err(format!("negative acknowledgement of unknown write {seq}"));
                };
                match self.writes.get_mut(&u.req) {
                    Some(w) => w.missing.insert(p.id),
                    None => self.peers[i].vols[u.volume as usize]
                        .oos
                        .set_range(u.offset, u64::from(u.len)),
                }
                self.peer_satisfied(i, seq, false, out);
            }
            Packet::Barrier { id } => {
                let last = self.peers[i].rx_last_seq;
                self.peers[i].barriers_in.push_back((id, last));
                self.process_barriers_in(i, out);
            }
            Packet::BarrierAck { id, errno } => {
                let bit = self.bit(i);
                if self.peers[i].barriers_out.remove(&id).is_none() {
                    return Err(format!("acknowledgement of unknown barrier {id}"));
                }
                if let Some(op) = self.flush_ops.get_mut(&id) {
                    op.peers_pending -= bit;
                    if errno == 0 {
                        op.peers_ok |= bit;
                    }
                }
                self.check_flush(id, out);
            }
            Packet::ReadReq {
                volume,
                id,
                offset,
                len,
            } => {
                self.check_range(volume, offset, u64::from(len))?;
                self.serve_read(volume, peer, id, offset, len, false, out);
            }
            Packet::ResyncReq {
                volume,
                id,
                offset,
                len,
            } => {
                self.check_range(volume, offset, u64::from(len))?;
                self.serve_read(volume, peer, id, offset, len, true, out);
            }
            Packet::ReadReply { id, errno, data } => {
                let Some(req) = self.peers[i].reads_out.remove(&id) else {
                    return Err(format!("reply to unknown read {id}"));
                };
                let Some(r) = self.reads.get(&req) else {
                    return Ok(());
                };
                if errno == 0 {
                    if data.len() != r.len as usize {
                        return Err(format!("read reply of {} bytes for {}", data.len(), r.len));
                    }
                    self.reads.remove(&req);
                    out.push(RAction::Complete {
                        req,
                        result: Ok(()),
                        data: Some(DataRef::Incoming { at: 0 }),
                    });
                } else {
                    self.route_read(req, out);
                }
            }
            Packet::ResyncReply {
                volume,
                id,
                offset,
                errno,
                data,
            } => {
                self.resync_reply(i, volume, id, offset, errno, data.len(), out)?;
            }
            Packet::OutOfSync {
                volume,
                offset,
                len,
            } => {
                if len == 0 && offset == 0 {
                    let v = volume as usize;
                    let pv = self.peers[i]
                        .vols
                        .get_mut(v)
                        .ok_or_else(|| format!("unknown volume {volume}"))?;
                    if pv.claimed > 0 || (pv.wrote_apart() && pv.peer_wrote_apart) {
                        let (mine, theirs) = (
                            pv.oos
                                .count()
                                .max(pv.apart.as_ref().map_or(0, Bitmap::count)),
                            pv.claimed,
                        );
                        out.push(RAction::Send {
                            peer,
                            msg: Msg::SplitBrain {
                                volume,
                                mine,
                                yours: theirs,
                            },
                        });
                        out.push(RAction::SplitBrain {
                            peer,
                            volume,
                            mine,
                            theirs,
                            reported: false,
                        });
                        return Ok(());
                    }
                    // Not both Primary apart: what we wrote without it is in its list now
                    // (diskful) or needs no tracking (diskless).
                    pv.apart = None;
                    pv.listed = true;
                    pv.written_before_list = Vec::new();
                    if let Some(rs) = self.vols[v].resync.as_mut() {
                        rs.lists_open.retain(|&n| n != peer);
                    }
                    self.pump_resync(volume, out);
                    return Ok(());
                }
                let v = self.check_range(volume, offset, u64::from(len))?;
                let pv = &mut self.peers[i].vols[v];
                if self.vols[v].disk == DiskState::UpToDate
                    && (pv.oos.count() > 0 || pv.wrote_apart())
                {
                    if pv.wrote_apart() || pv.peer_wrote_apart {
                        // Each has writes the other lacks, and one of us made them as
                        // Primary apart from the other: two Primaries. Count what it
                        // lists; at the end of its list, stop (see `SplitBrain`).
                        pv.claimed += u64::from(len).div_ceil(super::bitmap::BLOCK);
                        return Ok(());
                    }
                    // Each lacks writes of a third node, the Primary, which it missed
                    // while apart from it: only that Primary knows which is newer where
                    // they overlap. Retry later (the Primary's lists settle it).
                    return Err(format!(
                        "volume {v}: each replica lacks writes of the Primary that the other has; reconnecting"
                    ));
                }
                // After the end of its list, a peer's notices are live: a write we missed.
                let live = self.peers[i].vols[v].listed;
                self.mark_behind(v, peer, offset, u64::from(len), live, out);
                self.pump_resync(volume, out);
            }
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

    fn peer_satisfied(&mut self, i: usize, seq: u64, ok: bool, out: &mut Vec<RAction>) {
        let bit = self.bit(i);
        if let Some(req) = self.peers[i].app_waiting.remove(&seq) {
            if let Some(w) = self.writes.get_mut(&req) {
                w.peers_pending -= bit;
                if ok {
                    w.peers_ok |= bit;
                }
            }
            self.check_write(req, out);
        }
    }

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
        let first = was.is_none();
        if mine == DiskState::UpToDate && pv.needs_everything() {
            // Its currency is unknown (it restarted), or it holds nothing (created empty):
            // it needs everything.
            pv.oos.set_all();
        }
        if first {
            // List what it lacks from us (writes made while it was away, or everything),
            // and end the list even when empty: then it knows all it lacks. Diskless
            // Primaries list too: they know what they wrote; the peer pulls from a replica.
            // Writes still in flight that missed it mark their bits when they complete, so
            // the list waits for them.
            let id = self.peers[i].id;
            if self
                .writes
                .values()
                .any(|w| w.volume as usize == v && w.missing.contains(id))
            {
                self.peers[i].vols[v].list = ListState::Deferred;
            } else {
                self.send_out_of_sync(i, v, out);
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

    /// Lists the peer's out-of-sync ranges to it, then ends the list.
    fn send_out_of_sync(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let p = &self.peers[i];
        let oos = &p.vols[v].oos;
        let size = self.vols[v].size;
        let block = oos.block_size();
        let blocks = size.div_ceil(block);
        let max_blocks = u64::from(tandem_wire::MAX_DATA) / block;
        let mut b = 0;
        while let Some(first) = oos.next_set(b) {
            let mut end = first + 1;
            while end < blocks && end - first < max_blocks && oos.is_set(end) {
                end += 1;
            }
            let offset = first * block;
            let len = ((end - first) * block).min(size - offset) as u32;
            out.push(out_of_sync(p.id, v, offset, len));
            b = end;
        }
        self.peers[i].vols[v].repl = if self.peers[i].vols[v].oos.count() > 0 {
            Repl::SyncSource
        } else {
            Repl::Established
        };
        self.peers[i].vols[v].list = ListState::Sent;
        // The end of the list (possibly empty): the peer now knows all we know it lacks.
        out.push(out_of_sync(self.peers[i].id, v, 0, 0));
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
        let vol = &mut self.vols[v];
        if !vol.diskful || vol.disk == DiskState::Diskless {
            return;
        }
        if vol.disk != DiskState::Inconsistent {
            let note = if live {
                format!("volume {v}: node {lister} tells of a write we missed; catching up")
            } else {
                format!("volume {v}: node {lister} lists writes we lack; resync needed")
            };
            self.set_disk_logged(v, DiskState::Inconsistent, note, live, out);
        }
        let primary = self
            .peer_index(lister)
            .filter(|&i| self.peers[i].role == Role::Primary);
        let vol = &mut self.vols[v];
        let rs = vol
            .resync
            .get_or_insert_with(|| Resync::new(vol.size, live));
        rs.live &= live;
        if !rs.lists_open.contains(&lister) {
            rs.lists_open.push(lister);
        }
        if let Some(i) = primary {
            // Sectors the application wrote here during the resync are protected from
            // older resync data. A range the Primary lists again holds writes we missed
            // after those (our link to it dropped and came back), so the protection is
            // void there, except for what it wrote on this connection: those writes are
            // newer than whatever its list is about, even when they came before the list
            // (simulator seed 2021338: the list waited for writes in flight, a new write
            // went out first, and a resync from a replica cut off from the Primary
            // overwrote it).
            rs.fresh.clear_range(offset, len);
            for &(o, l) in &self.peers[i].vols[v].written_before_list {
                let (a, b) = (o.max(offset), (o + l).min(offset + len));
                if a < b {
                    rs.fresh.set_range(a, b - a);
                }
            }
        }
        rs.to_pull.set_range(offset, len);
        rs.cursor = rs.cursor.min(offset / super::bitmap::BLOCK);
    }

    /// Every connected peer has ended its list of what we lack in volume `v`.
    fn all_listed(&self, v: usize) -> bool {
        self.peers.iter().all(|p| !p.up || p.vols[v].listed)
    }

    /// Whether our replica holds current data for this range, as far as every connected
    /// peer has told us what we lack: what a resync may copy from us. An up-to-date replica
    /// that has not heard every list yet may lack the range without knowing it (it just
    /// came back, and the Primary's list is on its way).
    fn has_range(&self, v: usize, offset: u64, len: u64) -> bool {
        let vol = &self.vols[v];
        if !self.all_listed(v) {
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
        let refused = self.vols[v]
            .resync
            .as_ref()
            .map(|r| r.refused.clone())
            .unwrap_or_default();
        let candidate = |want: DiskState| {
            self.peers
                .iter()
                .find(|p| {
                    p.up && p.vols[v].diskful
                        && p.vols[v].disk == Some(want)
                        && !refused.contains(&p.id)
                })
                .map(|p| p.id)
        };
        let current = self.vols[v]
            .resync
            .as_ref()
            .and_then(|r| r.source)
            .filter(|&s| {
                !refused.contains(&s)
                    && self.peer_index(s).is_some_and(|i| {
                        let p = &self.peers[i];
                        p.up && p.vols[v].diskful && p.vols[v].disk == Some(DiskState::UpToDate)
                    })
            });
        if let Some(p) = self.peers.iter().find(|p| {
            p.up && p.role == Role::Primary
                && p.vols[v].diskful
                && p.vols[v].disk == Some(DiskState::UpToDate)
        }) {
            // Refused (it has not heard every list yet): ask it again later, not another.
            return (!refused.contains(&p.id)).then_some(p.id);
        }
        current
            .or_else(|| candidate(DiskState::UpToDate))
            .or_else(|| candidate(DiskState::Inconsistent))
    }

    /// Pulls the next ranges from the sync source, up to the window.
    fn pump_resync(&mut self, volume: u16, out: &mut Vec<RAction>) {
        let v = volume as usize;
        let chunk_blocks = u64::from(self.spec.resync_chunk) / super::bitmap::BLOCK;
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
            out.push(RAction::Send {
                peer: src,
                msg: Msg::ResyncReq {
                    volume,
                    id,
                    offset,
                    len,
                },
            });
        }
        let all_listed = self.all_listed(v);
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
            self.request_local_flush(FlushWaiter::ResyncDone { volume }, out);
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
        let Some(rs) = self.vols[v].resync.as_mut() else {
            unreachable!("checked above; data_arrives keeps the resync")
        };
        if rs.data_arrived() {
            out.push(RAction::Note(format!(
                "volume {v}: node {peer} has blocks we lack; the resync goes on"
            )));
        }
        // Write the sectors the application has not overwritten since the resync began.
        let end = offset + u64::from(req_len);
        let mut parts = Vec::new();
        let mut s = offset;
        while s < end {
            if rs.fresh.is_set(s / SECTOR) {
                s += SECTOR;
                continue;
            }
            let mut e = s + SECTOR;
            while e < end && !rs.fresh.is_set(e / SECTOR) {
                e += SECTOR;
            }
            parts.push((s, e));
            s = e;
        }
        rs.writes_pending += parts.len();
        let vol = &mut self.vols[v];
        for (part, (s, e)) in parts.into_iter().enumerate() {
            let token = Token::ResyncWrite {
                id,
                part: part as u32,
            };
            let kind = DiskKind::Write {
                offset: s,
                len: (e - s) as u32,
            };
            let at = (s - offset) as u32;
            if vol.applying.overlaps(s, e - s) || vol.held.blocks(s, e - s) {
                out.push(RAction::Retain {
                    from: DataRef::Incoming { at: 0 },
                    key: token,
                });
                let data = Some(DataRef::Held { key: token, at });
                vol.held.push(
                    s,
                    e - s,
                    HeldWrite {
                        token,
                        offset: s,
                        len: (e - s) as u32,
                        kind,
                        data,
                    },
                );
            } else {
                vol.applying.insert(s, e - s, token);
                out.push(RAction::Disk {
                    volume,
                    token,
                    kind,
                    data: Some(DataRef::Incoming { at }),
                });
            }
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
        let all_listed = self.all_listed(v);
        let Some(rs) = self.vols[v].resync.as_mut() else {
            return;
        };
        if !all_listed || !rs.drained() {
            // More was listed while the final flush ran.
            return self.pump_resync(volume, out);
        }
        let rs = self.vols[v].resync.take().expect("checked above");
        if !ok {
            return self.local_disk_failed(v, "flush after resync failed", out);
        }
        let source = rs.source.map_or("-".to_string(), |s| s.to_string());
        if let Some(i) = rs.source.and_then(|s| self.peer_index(s)) {
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
                self.send_out_of_sync(i, v, out);
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
        // Diskful nodes the Primary could not send this to lack it: if the Primary fails
        // before it can tell them, we can (like DRBD's peer acks). One we are connected to
        // and have listed what it lacks hears of it now: the Primary tells it only of writes
        // that succeeded, and this one may yet fail there (its link to us drops) while we
        // keep it, so only we know the two replicas differ.
        let (offset, len) = (kind.offset(), kind.len());
        for p in self
            .peers
            .iter_mut()
            .filter(|p| p.id != peer && p.vols[v].diskful)
        {
            if !NodeSet::from_bits(targets).contains(p.id) {
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
        let vol = &mut self.vols[v];
        if !vol.diskful || vol.disk == DiskState::Diskless {
            out.push(RAction::Send {
                peer,
                msg: Msg::NegAck { seq, errno: EIO },
            });
            return Ok(());
        }
        if flags & wf::ACK_RECV != 0 {
            out.push(RAction::Send {
                peer,
                msg: Msg::RecvAck { seq },
            });
        }
        self.data_arrives(v, out);
        let vol = &mut self.vols[v];
        if let Some(rs) = vol.resync.as_mut() {
            rs.fresh.set_range(offset, u64::from(len));
        }
        let pv = &mut self.peers[i].vols[v];
        if !pv.listed {
            pv.written_before_list.push((offset, u64::from(len)));
        }
        self.peers[i].rx_pending.insert(seq);
        let token = Token::PeerWrite {
            peer,
            conn: self.peers[i].conn,
            seq,
        };
        let is_write = matches!(kind, DiskKind::Write { .. });
        if vol.applying.overlaps(offset, u64::from(len)) || vol.held.blocks(offset, u64::from(len))
        {
            if is_write {
                out.push(RAction::Retain {
                    from: DataRef::Incoming { at: 0 },
                    key: token,
                });
            }
            let data = is_write.then_some(DataRef::Held { key: token, at: 0 });
            vol.held.push(
                offset,
                u64::from(len),
                HeldWrite {
                    token,
                    offset,
                    len,
                    kind,
                    data,
                },
            );
        } else {
            vol.applying.insert(offset, u64::from(len), token);
            let data = is_write.then_some(DataRef::Incoming { at: 0 });
            out.push(RAction::Disk {
                volume: v as u16,
                token,
                kind,
                data,
            });
        }
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
            let has_disk = self
                .vols
                .iter()
                .any(|v| v.diskful && v.disk != DiskState::Diskless);
            if has_disk {
                self.request_local_flush(FlushWaiter::PeerBarrier { peer, id }, out);
            } else {
                out.push(RAction::Send {
                    peer,
                    msg: Msg::BarrierAck { id, errno: EIO },
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn serve_read(
        &mut self,
        volume: u16,
        peer: NodeId,
        id: u64,
        offset: u64,
        len: u32,
        resync: bool,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        let serve = if resync {
            self.has_range(v, offset, u64::from(len))
        } else {
            self.vols[v].disk == DiskState::UpToDate
        };
        let vol = &mut self.vols[v];
        if !serve {
            let msg = if resync {
                // Not an error: we lack it too for now; the target asks elsewhere or later.
                Msg::ResyncReply {
                    volume,
                    id,
                    offset,
                    errno: EAGAIN,
                    len,
                    data: None,
                }
            } else {
                Msg::ReadReply {
                    id,
                    errno: EIO,
                    len,
                    data: None,
                }
            };
            return out.push(RAction::Send { peer, msg });
        }
        // A read must see every write that reached us before it: wait for overlapping ones.
        if vol.applying.overlaps(offset, u64::from(len)) || vol.held.blocks(offset, u64::from(len))
        {
            let conn = self
                .peers
                .iter()
                .find(|p| p.id == peer)
                .map_or(0, |p| p.conn);
            return self.vols[v]
                .reads_waiting
                .push((peer, conn, id, offset, len, resync));
        }
        let conn = self.peer_index(peer).map_or(0, |i| self.peers[i].conn);
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
        let peers = self.peers.iter().filter(|p| p.up).flat_map(|p| {
            let unacked = p
                .unacked
                .values()
                .map(|u| u.sent_ms)
                .min()
                .map(|t| t + self.spec.timeout_ms + 1);
            let ping = match p.ping_sent_ms {
                Some(t) => t + self.spec.ping_timeout_ms + 1,
                None => p.last_rx_ms + self.spec.ping_interval_ms,
            };
            unacked.into_iter().chain(std::iter::once(ping))
        });
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
        let (interval, ping_timeout, timeout) = (
            self.spec.ping_interval_ms,
            self.spec.ping_timeout_ms,
            self.spec.timeout_ms,
        );
        let mut drop = Vec::new();
        for p in self.peers.iter_mut().filter(|p| p.up) {
            let oldest = p.unacked.values().map(|u| u.sent_ms).min();
            if oldest.is_some_and(|t| now_ms.saturating_sub(t) > timeout) {
                drop.push((
                    p.id,
                    format!("a replicated write was not acknowledged within {timeout} ms"),
                ));
            } else if p
                .ping_sent_ms
                .is_some_and(|t| now_ms.saturating_sub(t) > ping_timeout)
            {
                drop.push((
                    p.id,
                    format!("no answer to a ping within {ping_timeout} ms"),
                ));
            } else if p.ping_sent_ms.is_none() && now_ms.saturating_sub(p.last_rx_ms) >= interval {
                p.ping_sent_ms = Some(now_ms);
                out.push(RAction::Send {
                    peer: p.id,
                    msg: Msg::Ping,
                });
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
