//! Configuration changes applied while the resource runs (`tandem adjust`): new settings
//! (`retune`) and a node added (`add_peer`). What else may change (volumes, quorum, a
//! node removed or moved) waits for a restart.

use super::Resource;
use crate::replica::action::RAction;
use crate::replica::peer::Peer;
use crate::replica::spec::{NodeId, ResourceSpec};
use std::fmt;

/// Why [`Resource::add_peer`] was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddPeerError {
    /// The node is in the resource already (this one included).
    Known(NodeId),
    /// Node ids are below 32.
    IdOutOfRange(NodeId),
    /// One flag per volume is needed.
    Volumes { got: usize, want: usize },
}

impl fmt::Display for AddPeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddPeerError::Known(id) => write!(f, "node {id} is in the resource already"),
            AddPeerError::IdOutOfRange(id) => write!(f, "node id {id} is not below 32"),
            AddPeerError::Volumes { got, want } => {
                write!(f, "{got} volume flags given for {want} volumes")
            }
        }
    }
}

impl std::error::Error for AddPeerError {}

impl Resource {
    /// A configuration change applied while running (`tandem adjust`): the protocol, the
    /// timeouts, the resync rates and the after-split-brain policies of `spec` from now
    /// on. They are read afresh at each use; a write keeps the protocol it began under
    /// (`Write::protocol`), and its flags tell the peers how to answer it. Nothing else of
    /// `spec` may differ: the nodes (in any order; [`Resource::add_peer`] adds one), the
    /// volumes and the quorum.
    pub fn retune(&mut self, spec: &ResourceSpec) {
        let mine = &mut self.rep.spec;
        let sorted = |s: &ResourceSpec| {
            let mut n = s.nodes.clone();
            n.sort();
            n
        };
        assert!(
            mine.me == spec.me
                && sorted(mine) == sorted(spec)
                && mine.sizes == spec.sizes
                && mine.quorum == spec.quorum,
            "retune changes only the protocol, timeouts, rates and policies"
        );
        mine.protocol = spec.protocol;
        mine.ping_interval_ms = spec.ping_interval_ms;
        mine.ping_timeout_ms = spec.ping_timeout_ms;
        mine.timeout_ms = spec.timeout_ms;
        mine.resync_rates = spec.resync_rates;
        mine.after_sb = spec.after_sb;
    }

    /// Node `id` joins the resource while it runs (`tandem adjust`), keeping a replica of
    /// volume `v` where `keeps[v]`. It is a peer from now on, not connected. We hold no
    /// record of what its replicas hold, so each is listed everything at its first
    /// connection: a new node pulls all of it anyway, and one that brings old data must
    /// not be taken for current (the driver writes the full bitmap to the peer's metadata
    /// slot, so a restart of ours keeps that). Its vote counts at once: with `quorum =
    /// all`, a Primary suspends or fails I/O until it connects and is UpToDate, as if it
    /// had been configured and away.
    pub fn add_peer(
        &mut self,
        id: NodeId,
        keeps: Vec<bool>,
        out: &mut Vec<RAction>,
    ) -> Result<(), AddPeerError> {
        let spec = &self.rep.spec;
        if u32::from(id) >= 32 {
            return Err(AddPeerError::IdOutOfRange(id));
        }
        if spec.nodes.iter().any(|(n, _)| *n == id) {
            return Err(AddPeerError::Known(id));
        }
        if keeps.len() != spec.sizes.len() {
            return Err(AddPeerError::Volumes {
                got: keeps.len(),
                want: spec.sizes.len(),
            });
        }
        let mut peer = Peer::new(id, &keeps, &spec.sizes);
        for (v, pv) in peer.vols.iter_mut().enumerate() {
            if pv.diskful && self.rep.vols[v].diskful {
                pv.oos.set_all();
            }
        }
        self.rep.spec.nodes.push((id, keeps));
        self.rep.peers.push(peer);
        self.after_event(out);
        Ok(())
    }
}
