//! What must hold between any two events, checked by the simulator after every step and
//! by debug builds after every event: a violation is a bug in the engine, named here
//! before it turns into a lost write somewhere else. Each room checks its own state
//! (`LocalVol::check`, `Resync::check`, `Peer::check`, `Writes::check`); what spans
//! rooms is checked here.

use super::Resource;
use crate::replica::nodeset::NodeSet;
use crate::replica::writes::Stage;

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
        let window = self.rep.spec.resync_window;
        for (v, vol) in self.rep.vols.iter().enumerate() {
            vol.check(window).map_err(|e| format!("volume {v}: {e}"))?;
            self.rep.check_split_brain(v)?;
        }
        for p in self.rep.peers.iter() {
            p.check(&self.rep.spec.sizes)
                .map_err(|e| format!("node {}: {e}", p.id))?;
        }
        self.app.writes.check(peers, down)?;
        (self.app.block_statuses).check(self.rep.peers.iter().map(|p| &p.allocs_out))?;
        self.app.settling.check()?;
        for (req, w) in self.app.writes.iter() {
            if w.local == Stage::Done(false) && !self.rep.vols[w.volume as usize].diskful {
                return Err(format!("{req:?}: a local result without a local replica"));
            }
        }
        for req in self.app.rotations.waiting() {
            if !self.app.writes.contains(req) && !self.app.flushes_parked.contains_key(&req) {
                return Err(format!(
                    "{req:?} waits for a generation change but is not in flight"
                ));
            }
        }
        for (v, vol) in self.rep.vols.iter().enumerate() {
            if vol.standing.is_some() && self.rep.role == tandem_wire::packet::Role::Primary {
                return Err(format!(
                    "volume {v}: Primary while still ranked by its start"
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
