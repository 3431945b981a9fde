//! NBD block status (`base:allocation`), both ends. On the Primary: where the answer
//! comes from (`allocation_map`, decided as a read is), and, where reads go to an
//! up-to-date peer (a diskless or not up-to-date Primary), the request that asks that peer
//! for its replica's map (`AllocReq` → `AllocReply`). On the peer: the map, computed by its
//! driver (`DiskKind::Allocation`) once every write that reached it before the request has
//! landed (`serve_read`'s rule, `receive.rs`), sent back (`allocation_done`).
//!
//! "All data" is always a true answer, so whatever goes wrong on the way (no peer can
//! answer, it is not up to date, its disk fails, its link drops) completes the request
//! without a map, never with an error: the driver then reports the range as data.

use super::reading::read_sources;
use super::{Gate, Requests};
use crate::io::{IoError, ReqId};
use crate::replica::action::RAction;
use crate::replica::event::ProtocolError;
use crate::replica::msg::{DataRef, Msg, Token};
use crate::replica::replicas::Replicas;
use crate::replica::spec::NodeId;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use tandem_wire::packet::{DiskState, Role, MAX_ALLOC_EXTENTS};
use tandem_wire::Errno;

/// Where the answer to a block status request comes from (see
/// [`Resource::allocation_map`](crate::replica::Resource::allocation_map)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocationMap {
    /// The local replica's: a read would be served here, so its holes are the volume's.
    Local,
    /// An up-to-date peer's, as reads would be: submit the request with
    /// [`Resource::block_status`](crate::replica::Resource::block_status).
    Peer,
    /// None: no replica within reach can say (being synced with no up-to-date peer,
    /// reads held without quorum). The whole range is data, which is always true.
    Unknown,
}

/// The Primary's block statuses asked of peers, by request: the volume asked about.
#[derive(Debug, Default)]
pub(in crate::replica) struct BlockStatuses {
    asked: HashMap<ReqId, u16>,
    round_robin: usize,
}

impl BlockStatuses {
    pub(in crate::replica) fn len(&self) -> usize {
        self.asked.len()
    }

    /// Every request asked is owed by exactly one connected peer (its link's end answers
    /// the rest).
    pub(in crate::replica) fn check<'a>(
        &self,
        owed: impl Iterator<Item = &'a BTreeMap<u64, ReqId>>,
    ) -> Result<(), String> {
        let mut n = 0;
        for ids in owed {
            for req in ids.values() {
                if !self.asked.contains_key(req) {
                    return Err(format!("block status {req:?} owed by a peer, not asked"));
                }
                n += 1;
            }
        }
        if n != self.asked.len() {
            return Err(format!(
                "{} block statuses asked, {n} owed",
                self.asked.len()
            ));
        }
        Ok(())
    }
}

/// The answer that is always true: no map, the whole range is data.
fn unknown(req: ReqId) -> RAction {
    RAction::Complete {
        req,
        result: Ok(()),
        data: None,
    }
}

impl Requests {
    /// A block status request of volume `v`, decided as a read is (see `submit_io` and
    /// `route_read`): refused where a read would be, from the local replica's map where a
    /// read would be served locally, from an up-to-date peer's where a read would go
    /// there. Held reads (no quorum, suspend-io) wait; a block status need not, "all data"
    /// is true meanwhile.
    pub(in crate::replica) fn allocation_map(
        &self,
        rep: &Replicas,
        v: usize,
    ) -> Result<AllocationMap, IoError> {
        if rep.role != Role::Primary {
            return Err(IoError::ReadOnly);
        }
        let peer_up_to_date =
            || (rep.peers.up()).any(|p| p.vols[v].disk == Some(DiskState::UpToDate));
        match Gate::of(rep, v) {
            Gate::Fail => Err(IoError::NoQuorum),
            Gate::Hold => Ok(AllocationMap::Unknown),
            Gate::Go if rep.vols[v].serves_reads() => Ok(AllocationMap::Local),
            Gate::Go if peer_up_to_date() => Ok(AllocationMap::Peer),
            Gate::Go => Ok(AllocationMap::Unknown),
        }
    }

    /// Asks a peer a read of the range could go to for its map (round robin). It completes
    /// as a read does: with the peer's extents at `DataRef::Incoming`, or without a map.
    pub(in crate::replica) fn block_status(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        volume: u16,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        match self.allocation_map(rep, v) {
            Ok(AllocationMap::Peer) => {}
            Ok(AllocationMap::Local | AllocationMap::Unknown) => return out.push(unknown(req)),
            Err(e) => {
                let result = Err(e);
                return out.push(RAction::Complete {
                    req,
                    result,
                    data: None,
                });
            }
        }
        // A peer that lacks a block of the range would report its stale holes.
        let candidates: Vec<NodeId> = read_sources(rep, v, offset, u64::from(len)).collect();
        if candidates.is_empty() {
            return out.push(unknown(req));
        }
        let s = &mut self.block_statuses;
        s.round_robin = s.round_robin.wrapping_add(1);
        let peer = candidates[s.round_robin % candidates.len()];
        s.asked.insert(req, volume);
        let id = rep.alloc_id();
        let i = rep.peers.index(peer).expect("a candidate is a peer");
        rep.peers[i].allocs_out.insert(id, req);
        let msg = Msg::AllocReq {
            volume,
            id,
            offset,
            len,
        };
        out.push(RAction::Send { peer, msg });
    }

    /// Peer `i`'s answer: `mapped`, its map (extents in the packet, no error) completes
    /// the request; an error or an empty map completes it without one.
    pub(in crate::replica) fn on_alloc_reply(
        &mut self,
        rep: &mut Replicas,
        i: usize,
        volume: u16,
        id: u64,
        mapped: bool,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let Some(req) = rep.peers[i].allocs_out.remove(&id) else {
            return Err(ProtocolError::UnknownAllocation(id));
        };
        let asked = self.block_statuses.asked.remove(&req);
        if asked != Some(volume) {
            out.push(unknown(req));
            return Err(ProtocolError::AllocReplyVolume { id, volume });
        }
        let data = mapped.then_some(DataRef::Incoming { at: 0 });
        let result = Ok(());
        out.push(RAction::Complete { req, result, data });
        Ok(())
    }

    /// The link to a peer dropped with these block statuses asked of it.
    pub(in crate::replica) fn block_statuses_lost(
        &mut self,
        asked: BTreeMap<u64, ReqId>,
        out: &mut Vec<RAction>,
    ) {
        for req in asked.into_values() {
            if self.block_statuses.asked.remove(&req).is_some() {
                out.push(unknown(req));
            }
        }
    }
}

impl Replicas {
    /// The driver mapped a range for a peer's block status (`Token::PeerAlloc`): `Ok(n)`,
    /// `n` extents at `DataRef::Disk(token)`. A replica that stopped being up to date
    /// meanwhile answers an error instead, as it would have at the request. A failed map
    /// leaves the replica attached: it lost no data (`Backing::allocation` itself answers
    /// "data" when it cannot tell).
    pub(in crate::replica) fn allocation_done(
        &mut self,
        volume: u16,
        token: Token,
        result: Result<u32, IoError>,
        out: &mut Vec<RAction>,
    ) {
        let Token::PeerAlloc { peer, conn, id } = token else {
            unreachable!("a block status's token")
        };
        let v = volume as usize;
        let up_to_date = self.vols[v].disk == DiskState::UpToDate;
        let msg = match result {
            Ok(n) if up_to_date => Msg::AllocReply {
                volume,
                id,
                errno: 0,
                extents: n.min(MAX_ALLOC_EXTENTS as u32),
                data: Some(DataRef::Disk(token)),
            },
            _ => Msg::AllocReply {
                volume,
                id,
                errno: Errno::Io.code(),
                extents: 0,
                data: None,
            },
        };
        if self.peers.on_conn(peer, conn).is_some() {
            out.push(RAction::Send { peer, msg });
        }
    }
}
