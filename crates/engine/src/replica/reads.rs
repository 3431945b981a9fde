//! The Primary's application reads: served by the local replica when it is up to date,
//! else by an up-to-date peer (round robin), another one if that one fails.

use super::nodeset::NodeSet;
use super::spec::NodeId;
use crate::io::ReqId;
use rustc_hash::FxHashMap as HashMap;

#[derive(Debug, Clone, Copy)]
pub(super) struct AppRead {
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// The peer asked, or `None` for the local replica.
    pub(super) from: Option<NodeId>,
    tried: NodeSet,
}

#[derive(Debug, Default)]
pub(super) struct Reads {
    by_req: HashMap<ReqId, AppRead>,
    round_robin: usize,
}

impl Reads {
    pub(super) fn begin(&mut self, req: ReqId, volume: u16, offset: u64, len: u32) {
        let read = AppRead {
            volume,
            offset,
            len,
            from: None,
            tried: NodeSet::EMPTY,
        };
        self.by_req.insert(req, read);
    }

    pub(super) fn get(&self, req: ReqId) -> Option<AppRead> {
        self.by_req.get(&req).copied()
    }

    pub(super) fn end(&mut self, req: ReqId) -> Option<AppRead> {
        self.by_req.remove(&req)
    }

    pub(super) fn len(&self) -> usize {
        self.by_req.len()
    }

    /// Whether `peer` was already asked for this read.
    pub(super) fn tried(&self, req: ReqId, peer: NodeId) -> bool {
        self.by_req
            .get(&req)
            .is_some_and(|r| r.tried.contains(peer))
    }

    pub(super) fn read_locally(&mut self, req: ReqId) {
        if let Some(r) = self.by_req.get_mut(&req) {
            r.from = None;
        }
    }

    /// Picks the next of `candidates` in turn and records it as asked.
    pub(super) fn ask_one_of(&mut self, req: ReqId, candidates: &[NodeId]) -> NodeId {
        self.round_robin = self.round_robin.wrapping_add(1);
        let peer = candidates[self.round_robin % candidates.len()];
        let r = self
            .by_req
            .get_mut(&req)
            .expect("asking for an unknown read");
        r.tried.insert(peer);
        r.from = Some(peer);
        peer
    }
}
