//! `tandem adjust` (and SIGHUP): what the resource files say now against what the node
//! runs, as a plan. Pure: the node applies it (`node/reload.rs`).
//!
//! What applies online: a new resource starts; the protocol (each write keeps the one it
//! began under), the timing and resync-rate settings (`[net]`) and the after-split-brain
//! policies of a running one change in place, and a node added to it joins. What does not
//! (it changes what the peers agreed on at connect, or what is on disk) is named and left
//! for the next start: the shared secret, volumes, quorum, peer TLS (`tls`, `tls-ca`), and a node removed or changed. A resource removed from the files stops, if it is a Secondary
//! nobody uses. Nothing is half-applied: a resource's change is taken whole or not at
//! all.

use tandem_config::{NodeConfig, ResourceConfig};

/// A setting whose change needs the node restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeedsRestart {
    SharedSecret,
    Volumes,
    Nodes,
    Quorum,
    Tls,
}

impl NeedsRestart {
    pub fn key(self) -> &'static str {
        match self {
            NeedsRestart::SharedSecret => "shared-secret",
            NeedsRestart::Volumes => "[[volume]]",
            NeedsRestart::Nodes => "[[node]]",
            NeedsRestart::Quorum => "quorum",
            NeedsRestart::Tls => "tls",
        }
    }
}

/// What to do, per resource name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// New resources, to start.
    pub add: Vec<ResourceConfig>,
    /// Running resources whose protocol, `[net]` or after-split-brain settings changed,
    /// and nothing that needs a restart: applied in place.
    pub retune: Vec<ResourceConfig>,
    /// Running resources with a change that needs a restart (nothing of theirs applied).
    pub restart: Vec<(String, Vec<NeedsRestart>)>,
    /// Running resources in no file for this node any more: stopped, if they may be.
    pub remove: Vec<String>,
    /// Running (or left not attached) and unchanged.
    pub unchanged: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty()
            && self.retune.is_empty()
            && self.restart.is_empty()
            && self.remove.is_empty()
    }
}

/// The plan from `running` (this node's resources as started, or as last adjusted) to
/// `wanted` (the files' resources naming this node). `idle` names resources left not
/// attached at start: listed in the files, they count as unchanged (their replica needs
/// the administrator, then a restart).
pub fn plan(running: &[&ResourceConfig], idle: &[&str], wanted: &[ResourceConfig]) -> Plan {
    let mut p = Plan::default();
    for w in wanted {
        match running.iter().find(|r| r.name == w.name) {
            None if idle.contains(&w.name.as_str()) => p.unchanged += 1,
            None => p.add.push(w.clone()),
            Some(r) => {
                let needs = needs_restart(r, w);
                if !needs.is_empty() {
                    p.restart.push((w.name.clone(), needs));
                } else if r.net != w.net
                    || r.after_sb != w.after_sb
                    || r.protocol != w.protocol
                    || r.nodes != w.nodes
                {
                    p.retune.push(w.clone());
                } else {
                    p.unchanged += 1;
                }
            }
        }
    }
    for r in running {
        if !wanted.iter().any(|w| w.name == r.name) {
            p.remove.push(r.name.clone());
        }
    }
    p
}

/// The nodes `w` has that `r` lacks, when that is all that differs in the nodes (none
/// removed, none changed): those join while the resource runs. `None`: a node was
/// removed or changed (its address, name or volumes), which needs a restart.
pub fn added_nodes<'a>(r: &ResourceConfig, w: &'a ResourceConfig) -> Option<Vec<&'a NodeConfig>> {
    let kept = (r.nodes.iter()).all(|n| w.nodes.contains(n));
    kept.then(|| {
        (w.nodes.iter())
            .filter(|m| !r.nodes.iter().any(|n| n.node_id == m.node_id))
            .collect()
    })
}

fn needs_restart(r: &ResourceConfig, w: &ResourceConfig) -> Vec<NeedsRestart> {
    let mut needs = Vec::new();
    if r.secret != w.secret {
        needs.push(NeedsRestart::SharedSecret);
    }
    if r.volumes != w.volumes {
        needs.push(NeedsRestart::Volumes);
    }
    if r.nodes != w.nodes && added_nodes(r, w).is_none() {
        needs.push(NeedsRestart::Nodes);
    }
    if r.quorum != w.quorum {
        needs.push(NeedsRestart::Quorum);
    }
    // Peers agree on it at connect; its files are read at start.
    if r.tls != w.tls || r.tls_ca != w.tls_ca {
        needs.push(NeedsRestart::Tls);
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(name: &str, extra: &str) -> ResourceConfig {
        let text = format!(
            "[resource]\nname = \"{name}\"\nshared-secret = \"s\"\n{extra}\n\
             [[volume]]\nnumber = 0\nsize = \"4M\"\n\
             [[node]]\nname = \"a\"\nnode-id = 0\naddress = \"127.0.0.1:7000\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"/tmp/a.img\"\n\
             [[node]]\nname = \"b\"\nnode-id = 1\naddress = \"127.0.0.2:7000\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"/tmp/b.img\"\n"
        );
        tandem_config::parse(&text, Path::new("/etc/tandem/x.toml")).expect("valid")
    }

    #[test]
    fn new_resources_start_and_unchanged_ones_stay() {
        let r0 = cfg("r0", "");
        let wanted = [cfg("r0", ""), cfg("r1", "")];
        let p = plan(&[&r0], &[], &wanted);
        assert_eq!(p.add.len(), 1);
        assert_eq!(p.add[0].name, "r1");
        assert_eq!(p.unchanged, 1);
        assert!(p.retune.is_empty() && p.restart.is_empty());
        assert!(plan(&[&r0], &[], &[cfg("r0", "")]).is_empty());
    }

    #[test]
    fn net_settings_and_policies_are_retuned_the_rest_needs_a_restart() {
        let r0 = cfg("r0", "");
        let p = plan(
            &[&r0],
            &[],
            &[cfg("r0", "[net]\nping-timeout = \"700ms\"\n")],
        );
        assert_eq!(p.retune.len(), 1, "{p:?}");
        let p = plan(
            &[&r0],
            &[],
            &[cfg("r0", "after-sb-0pri = \"discard-zero-changes\"\n")],
        );
        assert_eq!(p.retune.len(), 1, "{p:?}");
        let p = plan(&[&r0], &[], &[cfg("r0", "protocol = \"B\"\n")]);
        assert_eq!(p.retune.len(), 1, "{p:?}");
        let p = plan(
            &[&r0],
            &[],
            &[cfg(
                "r0",
                "quorum = \"majority\"\n[net]\nping-timeout = \"700ms\"\n",
            )],
        );
        assert!(p.retune.is_empty(), "a change is taken whole or not at all");
        let p = plan(&[&r0], &[], &[cfg("r0", "quorum = \"majority\"\n")]);
        assert_eq!(p.restart, vec![("r0".into(), vec![NeedsRestart::Quorum])]);
        let p = plan(&[&r0], &[], &[cfg("r0", "tls = \"secret\"\n")]);
        assert_eq!(p.restart, vec![("r0".into(), vec![NeedsRestart::Tls])]);
    }

    const GAMMA: &str = "[[node]]\nname = \"c\"\nnode-id = 2\naddress = \"127.0.0.3:7000\"\n\
                         [[node.volume]]\nnumber = 0\ndisk = \"/tmp/c.img\"\n";

    #[test]
    fn a_node_added_joins_online_one_removed_or_moved_needs_a_restart() {
        // Quorum set in both, so that the third node does not change its default.
        let q = "quorum = \"majority\"\n";
        let r0 = cfg("r0", q);
        let grown = cfg("r0", &format!("{q}\n{GAMMA}"));
        let p = plan(&[&r0], &[], std::slice::from_ref(&grown));
        assert_eq!(p.retune.len(), 1, "{p:?}");
        let added = added_nodes(&r0, &grown).expect("only added");
        assert_eq!(added.iter().map(|n| n.node_id).collect::<Vec<_>>(), [2]);
        // Back to two: node 2 removed.
        let p = plan(&[&grown], &[], std::slice::from_ref(&r0));
        assert_eq!(p.restart, vec![("r0".into(), vec![NeedsRestart::Nodes])]);
        // Node 1 moved to another address, node 2 added.
        let mut changed = grown.clone();
        let beta = (changed.nodes.iter_mut()).find(|n| n.node_id == 1).unwrap();
        beta.address = "127.0.0.9:7000".parse().unwrap();
        assert!(added_nodes(&r0, &changed).is_none());
        let p = plan(&[&r0], &[], &[changed]);
        assert_eq!(p.restart, vec![("r0".into(), vec![NeedsRestart::Nodes])]);
    }

    #[test]
    fn a_removed_resource_is_named_and_an_idle_one_is_left_alone() {
        let r0 = cfg("r0", "");
        let r1 = cfg("r1", "");
        let p = plan(&[&r0, &r1], &[], &[cfg("r0", "")]);
        assert_eq!(p.remove, vec!["r1".to_string()]);
        assert!(p.restart.is_empty());
        let p = plan(&[&r0], &["r1"], &[cfg("r0", ""), cfg("r1", "")]);
        assert!(p.is_empty(), "{p:?}");
    }
}
