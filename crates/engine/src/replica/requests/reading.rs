//! The application's reads on the Primary: served by the local replica if it is up to
//! date, else by an up-to-date peer (round robin), tried elsewhere when one fails.

use super::Requests;
use crate::io::{DiskKind, IoError, ReqId};
use crate::replica::action::RAction;
use crate::replica::event::ProtocolError;
use crate::replica::msg::{DataRef, Msg, Token};
use crate::replica::replicas::Replicas;
use crate::replica::spec::NodeId;
use tandem_wire::packet::DiskState;

impl Requests {
    /// Sends a read to the local replica if it is up to date, else to an up-to-date peer
    /// (round robin), else fails it.
    pub(in crate::replica) fn route_read(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        out: &mut Vec<RAction>,
    ) {
        let r = self.reads.get(req).expect("routing an unknown read");
        let v = r.volume as usize;
        let (volume, offset, len) = (r.volume, r.offset, r.len);
        if rep.vols[v].serves_reads() {
            self.reads.read_locally(req);
            let kind = DiskKind::Read { offset, len };
            return out.push(RAction::Disk {
                volume,
                token: Token::App(req),
                kind,
                data: None,
            });
        }
        let mut candidates: Vec<NodeId> = read_sources(rep, v, offset, u64::from(len))
            .filter(|&p| !self.reads.tried(req, p))
            .collect();
        // Those holding our ids first: an up-to-date peer with older ones may have missed
        // writes of the run that changed them, not knowing (failover seed 370000115: a
        // diskless Primary, restarted, met two up-to-date replicas that had not met each
        // other, took the newer ids, and read from the older one a block without an
        // acknowledged write). One may merely not have taken our newest ids yet: with none
        // holding them, any up-to-date peer serves.
        let ours = rep.vols[v].gen.current;
        let holds_ours = |&p: &NodeId| {
            rep.peers
                .get(p)
                .is_some_and(|p| p.vols[v].gen.current == ours)
        };
        if candidates.iter().any(holds_ours) {
            candidates.retain(holds_ours);
        }
        if candidates.is_empty() {
            self.reads.end(req);
            return out.push(RAction::Complete {
                req,
                result: Err(IoError::NoData),
                data: None,
            });
        }
        let peer = self.reads.ask_one_of(req, &candidates);
        let id = rep.alloc_id();
        let i = rep.peers.index(peer).expect("a candidate is a peer");
        rep.peers[i].reads_out.insert(id, req);
        let msg = Msg::ReadReq {
            volume,
            id,
            offset,
            len,
        };
        out.push(RAction::Send { peer, msg });
    }

    pub(in crate::replica) fn on_read_reply(
        &mut self,
        rep: &mut Replicas,
        i: usize,
        id: u64,
        errno: u32,
        data_len: usize,
        out: &mut Vec<RAction>,
    ) -> Result<(), ProtocolError> {
        let Some(req) = rep.peers[i].reads_out.remove(&id) else {
            return Err(ProtocolError::UnknownRead(id));
        };
        let Some(r) = self.reads.get(req) else {
            return Ok(());
        };
        if errno != 0 {
            self.route_read(rep, req, out);
            return Ok(());
        }
        if data_len != r.len as usize {
            return Err(ProtocolError::ReadReplyLength {
                got: data_len,
                asked: r.len,
            });
        }
        self.reads.end(req);
        out.push(RAction::Complete {
            req,
            result: Ok(()),
            data: Some(DataRef::Incoming { at: 0 }),
        });
        Ok(())
    }
}

/// The connected peers a read of this range of volume `v` may go to: up to date, and not
/// known to lack a block of it (a peer says UpToDate until it hears what it missed: never
/// read from it where we know it lacks writes).
pub(in crate::replica) fn read_sources(
    rep: &Replicas,
    v: usize,
    offset: u64,
    len: u64,
) -> impl Iterator<Item = NodeId> + '_ {
    rep.peers
        .up()
        .filter(move |p| {
            p.vols[v].disk == Some(DiskState::UpToDate) && !p.vols[v].oos.any_in(offset, len)
        })
        .map(|p| p.id)
}
