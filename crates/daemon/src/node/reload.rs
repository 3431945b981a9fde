//! `tandem adjust` and SIGHUP: the resource files are read again and what changed is
//! applied while the node runs, as `crate::adjust::plan` says: a new resource starts, a
//! running one takes new timeouts, resync rates and after-split-brain policies; the rest
//! is named as needing a restart and nothing of it is applied. The files having errors
//! changes nothing. The node no longer ends on SIGHUP without flushing, as it did when
//! SIGHUP's default action killed it.

use super::setup::spec_of;
use super::state::NodeReactor;
use crate::adjust::NeedsRestart;
use std::io;
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
        let plan = {
            let running: Vec<_> = self.res.iter().map(|r| &r.cfg).collect();
            let idle: Vec<_> = self.not_attached.iter().map(|n| n.name.as_str()).collect();
            crate::adjust::plan(&running, &idle, &mine)
        };
        if plan.is_empty() {
            return Ok(format!("{dir} read again: no change"));
        }
        let mut said = Vec::new();
        for cfg in plan.retune {
            let r = (self.res.iter().position(|x| x.cfg.name == cfg.name))
                .expect("planned from the running resources");
            let res = &mut self.res[r];
            res.engine.retune(&spec_of(&cfg, res.me, 0));
            info!(resource = %cfg.name, "adjust: timeouts, resync rates and policies now as {} says", cfg.path.display());
            said.push(format!(
                "{}: timeouts, resync rates and policies applied",
                cfg.name
            ));
            res.cfg = cfg;
            self.touch(r);
        }
        for cfg in plan.add {
            let name = cfg.name.clone();
            let before = self.res.len();
            match self.add_resource(cfg, &self.node_name.clone()) {
                Ok(()) if self.res.len() > before => {
                    info!(resource = %name, "adjust: started");
                    said.push(format!("{name}: started"));
                    self.touch(before);
                }
                Ok(()) => said.push(format!("{name}: not attached (see `tandem status {name}`)")),
                Err(e) => {
                    error!(resource = %name, "adjust: not started: {e:#}");
                    said.push(format!("{name}: not started: {e:#}"));
                }
            }
        }
        for (name, needs) in plan.restart {
            let what = if needs == [NeedsRestart::Removed] {
                "removed from the files".to_string()
            } else {
                let keys: Vec<_> = needs.iter().map(|n| n.key()).collect();
                format!("{} changed", keys.join(", "))
            };
            warn!(resource = %name, "adjust: {what}; applied when `tandem node` next starts (nothing of this resource changed now)");
            said.push(format!(
                "{name}: {what}: needs a restart of the node (nothing of it changed now)"
            ));
        }
        Ok(said.join("\n"))
    }
}
