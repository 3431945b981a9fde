//! `tandem node`: the node daemon. It loads the resources that name this node, keeps a
//! connection to every other node of each (full mesh: the lower node id dials), serves each
//! volume over NBD, and answers the administration verbs on a control socket.
//!
//! Like `serve`, one event loop owns everything; the replicated engine of each resource
//! ([`tandem_engine::replica::Resource`]) decides, this module executes.

mod actions;
mod activity;
mod clients;
mod control;
mod control_conn;
mod event_loop;
mod limits;
mod links;
mod metadata;
mod metrics_http;
mod peer;
mod peers;
mod progress;
mod reload;
mod repeats;
mod routing;
mod sd_notify;
mod setup;
mod state;
mod status_page;
mod sync_reports;
mod transport;
mod unaligned;
mod unsynced;
mod watchers;

pub use metadata::{create_md, dump_md, invalidate};

use anyhow::{bail, Result};
use state::NodeReactor;
use std::path::PathBuf;
use std::time::Duration;
use tandem_config::ResourceConfig;

/// How the daemon is started.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's name in the resource files.
    pub node: String,
    /// Directory of resource files (`*.toml`).
    pub config_dir: PathBuf,
    /// The control socket for the administration verbs.
    pub control: PathBuf,
    pub disk_threads: usize,
    /// After handling events, keep polling (without sleeping) this long for more before
    /// blocking. Zero: always block.
    pub busy_poll: Duration,
    /// Off only for benchmarks (`--unsafe-no-activity-log`): writes skip the activity log
    /// and a running replica is never marked consistent, so a crash resyncs it in full.
    pub activity_log: bool,
    /// Where to serve Prometheus metrics (`--metrics`); `None`: the resource files' `metrics`
    /// key for this node, if any sets it.
    pub metrics: Option<std::net::SocketAddr>,
}

/// Loads the resources naming this node and serves them until SIGTERM/SIGINT.
pub fn run(opts: NodeOptions) -> Result<()> {
    let all = tandem_config::load_dir(&opts.config_dir)?;
    let mine: Vec<ResourceConfig> = all
        .into_iter()
        .filter(|c| c.node(&opts.node).is_some())
        .collect();
    if mine.is_empty() {
        bail!(
            "no resource in {} names node {:?}",
            opts.config_dir.display(),
            opts.node
        );
    }
    let mut opts = opts;
    if opts.metrics.is_none() {
        opts.metrics = tandem_config::node_metrics(&mine, &opts.node)?;
    }
    limits::raise_open_files(mine.len());
    NodeReactor::new(mine, &opts)?.run()
}
