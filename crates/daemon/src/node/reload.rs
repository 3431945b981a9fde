//! `tandem adjust` and SIGHUP: the resource files are read again and what changed is
//! applied while the node runs, as `crate::adjust::plan` says: a new resource starts, a
//! running one takes a new protocol, timeouts, resync rates and after-split-brain
//! policies, one removed from the files stops; the rest
//! is named as needing a restart and nothing of it is applied. The files having errors
//! changes nothing. The node no longer ends on SIGHUP without flushing, as it did when
//! SIGHUP's default action killed it.

use super::setup::{peer_slot, spec_of};
use super::state::{Ctx, Entry, NodeReactor, Presence};
use std::io;
use std::time::Instant;
use tandem_config::{NodeConfig, ResourceConfig};
use tandem_engine::replica::Bitmap;
use tandem_engine::replica::Role;
use tracing::{error, info, warn};

impl NodeReactor {
    pub(super) fn reread_config(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(io::Read::read(&mut self.reload_rx, &mut buf), Ok(n) if n > 0) {}
        match self.adjust() {
            Ok(said) => info!("SIGHUP: {said}"),
            Err(why) => warn!("SIGHUP: {why}"),
        }
    }

    /// Applies what changed in the files; says what was done, or why nothing was.
    pub(super) fn adjust(&mut self) -> Result<String, String> {
        let dir = self.config_dir.display().to_string();
        let all = tandem_config::load_dir(&self.config_dir)
            .map_err(|e| format!("{dir} has errors; nothing changed: {e}"))?;
        let mine: Vec<_> = (all.into_iter())
            .filter(|c| c.node(&self.node_name).is_some())
            .collect();
        if let Some(r) = (self.res.iter()).find(|r| r.presence == Presence::Leaving) {
            return Err(format!(
                "{} is still stopping (removed from the files): adjust again in a moment; nothing changed",
                r.cfg.name
            ));
        }
        let plan = {
            let running: Vec<_> = (self.res.iter())
                .filter(|r| r.presence == Presence::Serving)
                .map(|r| &r.cfg)
                .collect();
            let idle: Vec<_> = self.not_attached.iter().map(|n| n.name.as_str()).collect();
            crate::adjust::plan(&running, &idle, &mine)
        };
        if plan.is_empty() {
            return Ok(format!("{dir} read again: no change"));
        }
        let mut said = Vec::new();
        let mut failed = false;
        for cfg in plan.retune {
            let r = self
                .serving(&cfg.name)
                .expect("planned from the running resources");
            let name = cfg.name.clone();
            let added: Vec<NodeConfig> = crate::adjust::added_nodes(&self.res[r].cfg, &cfg)
                .expect("planned: nodes only added")
                .into_iter()
                .cloned()
                .collect();
            if let Err(why) = self.add_nodes(r, &cfg, &added) {
                error!(resource = %name, "adjust: {why}; nothing of this resource changed");
                said.push(format!("{name}: {why}; nothing of it changed"));
                failed = true;
                continue;
            }
            let res = &mut self.res[r];
            res.engine.retune(&spec_of(&cfg, res.me, 0));
            info!(resource = %name, "adjust: protocol, timeouts, resync rates and policies now as {} says", cfg.path.display());
            said.push(format!(
                "{name}: protocol, timeouts, resync rates and policies applied"
            ));
            for n in &added {
                said.push(format!("{name}: node {} ({}) added", n.node_id, n.name));
            }
            res.cfg = cfg;
            self.touch(r);
        }
        for cfg in plan.add {
            let name = cfg.name.clone();
            let before = self.res.len();
            match self.add_resource(cfg, &self.node_name.clone(), true) {
                Ok(()) if self.res.len() > before => {
                    info!(resource = %name, "adjust: started");
                    said.push(format!("{name}: started"));
                    self.touch(before);
                }
                Ok(()) => said.push(format!("{name}: not attached (see `tandem status {name}`)")),
                Err(e) => {
                    error!(resource = %name, "adjust: not started: {e:#}");
                    said.push(format!("{name}: not started: {e:#}"));
                    failed = true;
                }
            }
        }
        for name in plan.remove {
            let r = self
                .serving(&name)
                .expect("planned from the running resources");
            let res = &self.res[r];
            let busy = match (
                res.engine.role(),
                res.engine.clients(),
                res.engine.app_in_flight(),
            ) {
                (Role::Primary, ..) => {
                    Some("it is Primary here: make it Secondary first".to_string())
                }
                (_, 0, 0) => None,
                (_, clients, _) => Some(format!(
                    "{clients} NBD client(s) attached here: detach them first"
                )),
            };
            match busy {
                Some(why) => {
                    warn!(resource = %name, "adjust: removed from the files, but {why}; nothing of it changed");
                    said.push(format!(
                        "{name}: removed from the files, but {why}; nothing of it changed"
                    ));
                }
                None => {
                    self.begin_leaving(r);
                    said.push(format!(
                        "{name}: removed from the files: stopping (its peers are told it leaves cleanly)"
                    ));
                }
            }
        }
        for (name, needs) in plan.restart {
            let keys: Vec<_> = needs.iter().map(|n| n.key()).collect();
            let what = format!("{} changed", keys.join(", "));
            warn!(resource = %name, "adjust: {what}; applied when `tandem node` next starts (nothing of this resource changed now)");
            said.push(format!(
                "{name}: {what}: needs a restart of the node (nothing of it changed now)"
            ));
        }
        // What could not be done makes the command fail (exit status 1), after what
        // could was done and said.
        if failed {
            Err(said.join("\n"))
        } else {
            Ok(said.join("\n"))
        }
    }

    /// Nodes `added` join running resource `r` (its files now say `cfg`): each one's
    /// bitmap slot in every replica both keep is written first, listing it everything (a
    /// replica without a free slot refuses the whole change before anything is written),
    /// then the engine takes it as a peer and it is dialled like the others. Its vote
    /// counts at once.
    fn add_nodes(
        &mut self,
        r: usize,
        cfg: &ResourceConfig,
        added: &[NodeConfig],
    ) -> Result<(), String> {
        let res = &self.res[r];
        let keeps =
            |n: &NodeConfig| -> Vec<bool> { n.volumes.iter().map(|v| !v.is_diskless()).collect() };
        for n in added {
            for (v, meta) in res.metas.iter().enumerate() {
                let Some(meta) = meta else { continue };
                if keeps(n)[v] && !meta.has_room_for(n.node_id) {
                    return Err(format!(
                        "node {} ({}) not added: {} has no bitmap slot left for it (set `max-peers` on the volume and remake the metadata to keep spare slots)",
                        n.node_id,
                        n.name,
                        meta.describe()
                    ));
                }
            }
        }
        for n in added {
            let res = &mut self.res[r];
            for (v, meta) in res.metas.iter_mut().enumerate() {
                let Some(meta) = meta else { continue };
                if !keeps(n)[v] {
                    continue;
                }
                let mut all = Bitmap::new(cfg.volumes[v].size);
                all.set_all();
                meta.add_peer(n.node_id, all.words()).map_err(|e| {
                    format!(
                        "node {} ({}) not added: its bitmap slot could not be written: {e:#}",
                        n.node_id, n.name
                    )
                })?;
            }
            let mut actions = Vec::new();
            (res.engine)
                .add_peer(n.node_id, keeps(n), &mut actions)
                .map_err(|e| format!("node {} ({}) not added: {e}", n.node_id, n.name))?;
            res.peers.push(peer_slot(cfg, res.me, n, Instant::now()));
            info!(resource = %cfg.name, peer = %n.name, "adjust: node {} added (at {}); listed everything at its first connection", n.node_id, n.address);
            self.run_actions(r, actions, Ctx::default());
        }
        Ok(())
    }

    /// The running resource of that name.
    fn serving(&self, name: &str) -> Option<usize> {
        (self.res.iter()).position(|r| r.presence == Presence::Serving && r.cfg.name == name)
    }

    /// Resource `r` was removed from the files: its peers are told it leaves cleanly (as
    /// at a clean stop) and let go, its listeners close, and `finish_leaving` ends it
    /// once nothing of it is in flight.
    fn begin_leaving(&mut self, r: usize) {
        let mut actions = Vec::new();
        self.res[r].engine.leave(&mut actions);
        self.run_actions(r, actions, Ctx::default());
        let nbd: Vec<usize> = (self.nbd_listener_of.iter())
            .filter(|(_, &(lr, _))| lr == r)
            .map(|(&k, _)| k)
            .collect();
        for k in nbd {
            self.nbd_listener_of.remove(&k);
            if let Some(Entry::NbdListener { mut l }) = self.entries.try_remove(k) {
                // Dropped: a Unix socket's file goes with it.
                let _ = self.poll.registry().deregister(l.source());
            }
        }
        let at = self.res[r].my_address;
        if let Some(&e) = self.peer_listener_at.get(&at) {
            let last = match self.entries.get_mut(e) {
                Some(Entry::PeerListener { res, .. }) => {
                    res.retain(|&x| x != r);
                    res.is_empty()
                }
                _ => false,
            };
            if last {
                self.peer_listener_at.remove(&at);
                if let Some(Entry::PeerListener { mut l, .. }) = self.entries.try_remove(e) {
                    let _ = self.poll.registry().deregister(&mut l);
                }
            }
        }
        for slot in &mut self.res[r].peers {
            slot.wanted = false;
            slot.last_error = Some("removed from the files (tandem adjust)".into());
        }
        let conns: Vec<usize> = (self.entries.iter())
            .filter(|(_, e)| matches!(e, Entry::Peer(pc) if pc.res == r))
            .map(|(k, _)| k)
            .collect();
        for k in conns {
            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                pc.dead = true;
            }
            self.mark_dirty(k);
        }
        self.res[r].presence = Presence::Leaving;
        info!(resource = %self.res[r].cfg.name, "adjust: removed from the files: letting its peers go");
        self.touch(r);
    }

    /// On the tick: a leaving resource whose connections are closed and whose writes have
    /// landed is synced, its metadata marked stopped cleanly, and its files closed.
    pub(super) fn finish_leaving(&mut self) {
        for r in 0..self.res.len() {
            if self.res[r].presence != Presence::Leaving {
                continue;
            }
            let open =
                (self.entries.iter()).any(|(_, e)| matches!(e, Entry::Peer(pc) if pc.res == r));
            if open || self.res[r].engine.writes_landing() {
                continue;
            }
            for b in self.res[r].backings.iter().flatten() {
                if let Err(e) = b.sync_data() {
                    warn!(resource = %self.res[r].cfg.name, "final flush: {e}");
                }
            }
            self.stop_metadata(r);
            let res = &mut self.res[r];
            res.backings.iter_mut().for_each(|b| *b = None);
            res.metas.iter_mut().for_each(|m| *m = None);
            res.presence = Presence::Gone;
            info!(resource = %res.cfg.name, "adjust: stopped and removed from this node");
            self.touch(r);
        }
    }
}
