//! `tandem check`: the resource files validated offline, every problem at once, before a
//! node (re)starts on them.

use anyhow::{bail, Result};
use std::path::Path;

/// Prints each file's verdict; fails if any file is wrong, or if `node` is given and no
/// resource names it (the node would refuse to start).
pub fn check(config_dir: &Path, node: Option<&str>) -> Result<()> {
    let files = tandem_config::check_dir(config_dir)?;
    if files.is_empty() {
        bail!("no *.toml resource file in {}", config_dir.display());
    }
    let (mut errors, mut named) = (0, 0);
    for (file, loaded) in &files {
        let shown = file
            .file_name()
            .unwrap_or(file.as_os_str())
            .to_string_lossy();
        match loaded {
            Ok(cfg) => {
                // The node's own TLS files are on this machine: read them too.
                let tls = node.and_then(|n| cfg.node(n)).map(|me| {
                    tandem_daemon::tls::node_nbd_tls(&me.tls)?;
                    tandem_daemon::tls::PeerTls::load(cfg, me)
                        .map_err(|e| e.context(format!("tls of node {}", me.name)))
                });
                if let Some(Err(e)) = tls {
                    errors += 1;
                    println!("error  {shown}: {}", tandem_daemon::error_chain(&e));
                    continue;
                }
                let here = node.map(|n| match cfg.node(n) {
                    Some(_) => {
                        named += 1;
                        format!("; node {n} is in it")
                    }
                    None => format!("; node {n} is not in it"),
                });
                println!(
                    "ok     {shown}: resource {}, {} nodes, {} volume(s){}",
                    cfg.name,
                    cfg.nodes.len(),
                    cfg.volumes.len(),
                    here.unwrap_or_default()
                );
            }
            Err(e) => {
                errors += 1;
                println!("error  {e}");
            }
        }
    }
    // Settings of a node, not of a resource, that several files may set: they must agree.
    let loaded: Vec<_> = files
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok())
        .cloned()
        .collect();
    let mut nodes: Vec<&str> = match node {
        Some(n) => vec![n],
        None => loaded
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.name.as_str()))
            .collect(),
    };
    nodes.sort_unstable();
    nodes.dedup();
    let mut node_errors = 0;
    for n in nodes {
        if let Err(e) = tandem_config::node_metrics(&loaded, n) {
            node_errors += 1;
            println!("error  {e}");
        }
    }
    if errors > 0 {
        bail!("{errors} of {} resource files have errors", files.len());
    }
    if node_errors > 0 {
        bail!("the resource files disagree on {node_errors} node setting(s)");
    }
    if let Some(n) = node.filter(|_| named == 0) {
        bail!("no resource in {} names node {n:?}", config_dir.display());
    }
    Ok(())
}
