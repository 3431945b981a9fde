//! What must hold between any two events, checked by the simulator after every step and
//! by debug builds after every event: a violation is a bug in the engine, named here
//! before it turns into a lost write somewhere else.

use super::Resource;
use crate::replica::nodeset::NodeSet;
use crate::replica::spec::NodeId;
use crate::replica::writes::Stage;
use tandem_wire::packet::DiskState;

impl Resource {
    /// Checks the engine's invariants; the first violation, described.
    pub fn check_invariants(&self) -> Result<(), String> {
        let me = self.rep.spec.me;
        if u32::from(me) >= 32 || self.rep.peers.iter().any(|p| u32::from(p.id) >= 32) {
            return Err("a node id is 32 or more".into());
        }
        if self.rep.peers.iter().any(|p| p.id == me) {
            return Err(format!("node {me} is its own peer"));
        }
        let peers: NodeSet = self.rep.peers.iter().map(|p| p.id).collect();
        let down: NodeSet = self
            .rep
            .peers
            .iter()
            .filter(|p| !p.up)
            .map(|p| p.id)
            .collect();
        for (v, vol) in self.rep.vols.iter().enumerate() {
            vol.apply
                .check()
                .map_err(|e| format!("volume {v}: applying: {e}"))?;
            if let Some(rs) = &vol.resync {
                if vol.disk != DiskState::Inconsistent {
                    return Err(format!("volume {v}: a resync while {:?}", vol.disk));
                }
                if rs.outstanding.len() > self.rep.spec.resync_window {
                    return Err(format!(
                        "volume {v}: {} resync requests outstanding, window {}",
                        rs.outstanding.len(),
                        self.rep.spec.resync_window
                    ));
                }
                rs.to_pull
                    .check(vol.size)
                    .and_then(|()| rs.fresh.check(vol.size))
                    .map_err(|e| format!("volume {v}: resync: {e}"))?;
            }
            for p in self.rep.peers.iter() {
                p.vols[v]
                    .oos
                    .check(vol.size)
                    .map_err(|e| format!("volume {v}: node {}'s out-of-sync: {e}", p.id))?;
            }
        }
        self.app.writes.check(peers, down)?;
        for (req, w) in self.app.writes.iter() {
            if w.local == Stage::Done(false) && !self.rep.vols[w.volume as usize].diskful {
                return Err(format!("{req:?}: a local result without a local replica"));
            }
        }
        for p in self.rep.peers.iter() {
            let id: NodeId = p.id;
            if !p.up && (!p.unacked.is_empty() || !p.app_waiting.is_empty()) {
                return Err(format!("node {id} is down but writes wait on it"));
            }
            if p.app_waiting.len() > p.unacked.len() {
                return Err(format!(
                    "node {id}: more writes wait on it than it has unacked"
                ));
            }
        }
        Ok(())
    }

    /// Debug builds check the invariants after every event.
    pub(super) fn debug_check(&self) {
        if cfg!(debug_assertions) {
            if let Err(e) = self.check_invariants() {
                panic!("engine invariant broken on node {}: {e}", self.rep.spec.me);
            }
        }
    }
}
