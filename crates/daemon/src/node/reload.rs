//! SIGHUP: the resource files are read again and what differs from the running
//! configuration is named. Nothing is applied while the node runs yet (a change takes
//! effect at its next start): never half-applied, and the node no longer ends on SIGHUP
//! without flushing, as it did when SIGHUP's default action killed it.

use super::state::NodeReactor;
use std::io;
use tracing::{info, warn};

impl NodeReactor {
    pub(super) fn reread_config(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(io::Read::read(&mut self.reload_rx, &mut buf), Ok(n) if n > 0) {}
        let dir = self.config_dir.display().to_string();
        let all = match tandem_config::load_dir(&self.config_dir) {
            Ok(all) => all,
            Err(e) => {
                return warn!("SIGHUP: {dir} has errors; nothing changed: {e}");
            }
        };
        let mine: Vec<_> = (all.into_iter())
            .filter(|c| c.node(&self.node_name).is_some())
            .collect();
        let mut changes = 0;
        for cfg in &mine {
            let running = self.res.iter().find(|r| r.cfg.name == cfg.name);
            let idle = self.not_attached.iter().any(|n| n.name == cfg.name);
            match running {
                Some(r) if r.cfg == *cfg => {}
                Some(_) => {
                    changes += 1;
                    warn!(resource = %cfg.name, "SIGHUP: its file in {dir} changed");
                }
                None if idle => {}
                None => {
                    changes += 1;
                    warn!(resource = %cfg.name, "SIGHUP: new in {dir}");
                }
            }
        }
        let names =
            (self.res.iter().map(|r| &r.cfg.name)).chain(self.not_attached.iter().map(|n| &n.name));
        for name in names {
            if !mine.iter().any(|c| &c.name == name) {
                changes += 1;
                warn!(resource = %name, "SIGHUP: no longer in {dir} for node {}", self.node_name);
            }
        }
        if changes == 0 {
            info!("SIGHUP: {dir} read again: no change");
        } else {
            warn!("SIGHUP: {dir} read again: {changes} resource(s) differ from what runs; they take effect when `tandem node` next starts (a running node does not apply configuration changes yet); nothing changed now");
        }
    }
}
