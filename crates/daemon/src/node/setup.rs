//! Starting a node: the engine's spec from a resource's config, opening or creating the
//! backing files (and telling the engine what was found), listening for clients, peers
//! and the control socket.

use super::links::Link;
use super::metadata;
use super::state::*;
use super::NodeOptions;
use crate::bufpool::BufPool;
use crate::listener::Listener;
use crate::worker::Workers;
use anyhow::{bail, Context, Result};
use mio::{Interest, Poll, Token as MioToken, Waker};
use rustc_hash::FxHashMap as HashMap;
use slab::Slab;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_config::{Endpoint, NodeConfig, ResourceConfig};
use tandem_engine::replica::{
    AfterSb0Pri, AfterSb1Pri, AfterSb2Pri, AfterSplitBrain, NodeId, Protocol, ReplicaAtStart,
    Resource, ResourceSpec,
};
use tandem_engine::sync_plan::{FlushPattern, SyncPlan};
use tandem_frontend::nbd::{BlockSizes, ExportInfo};
use tracing::{error, info};

pub(super) fn spec_of(cfg: &ResourceConfig, me: NodeId, gi_seed: u64) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: cfg
            .nodes
            .iter()
            .map(|n| {
                (
                    n.node_id,
                    n.volumes.iter().map(|v| !v.is_diskless()).collect(),
                )
            })
            .collect(),
        sizes: cfg.volumes.iter().map(|v| v.size).collect(),
        protocol: match cfg.protocol {
            tandem_config::Protocol::A => Protocol::A,
            tandem_config::Protocol::B => Protocol::B,
            tandem_config::Protocol::C => Protocol::C,
        },
        ping_interval_ms: cfg.net.ping_interval.as_millis() as u64,
        ping_timeout_ms: cfg.net.ping_timeout.as_millis() as u64,
        timeout_ms: cfg.net.timeout.as_millis() as u64,
        resync_chunk: 256 << 10,
        resync_window: 8,
        resync_rates: tandem_engine::replica::ResyncRates {
            min: cfg.net.resync_min_rate,
            max: cfg.net.resync_max_rate,
            plan_ahead_ms: cfg.net.resync_plan_ahead.as_millis() as u64,
            fill_target: cfg.net.resync_fill_target,
            delay_target_ms: cfg.net.resync_delay_target.as_millis() as u64,
        },
        gi_seed,
        quorum: quorum_of(cfg),
        after_sb: after_sb_of(cfg),
    }
}

/// The configuration's after-split-brain policies, as the engine's.
fn after_sb_of(cfg: &ResourceConfig) -> AfterSplitBrain {
    use tandem_config::{AfterSb0Pri as C0, AfterSb1Pri as C1, AfterSb2Pri as C2};
    AfterSplitBrain {
        zero: match cfg.after_sb.zero {
            C0::Disconnect => AfterSb0Pri::Disconnect,
            C0::DiscardYoungerPrimary => AfterSb0Pri::DiscardYoungerPrimary,
            C0::DiscardOlderPrimary => AfterSb0Pri::DiscardOlderPrimary,
            C0::DiscardZeroChanges => AfterSb0Pri::DiscardZeroChanges,
            C0::DiscardLeastChanges => AfterSb0Pri::DiscardLeastChanges,
        },
        one: match cfg.after_sb.one {
            C1::Disconnect => AfterSb1Pri::Disconnect,
            C1::Consensus => AfterSb1Pri::Consensus,
            C1::DiscardSecondary => AfterSb1Pri::DiscardSecondary,
        },
        two: match cfg.after_sb.two {
            C2::Disconnect => AfterSb2Pri::Disconnect,
        },
    }
}

pub(super) fn export_name(cfg: &ResourceConfig, vol: usize) -> String {
    let n = cfg.volumes[vol].number;
    if n == 0 {
        cfg.name.clone()
    } else {
        format!("{}-{n}", cfg.name)
    }
}

/// Starts a non-blocking connection to `to` from `from` (the node's configured address,
/// so firewalls and multi-homed hosts see the right source; any port). An unspecified
/// address (0.0.0.0, ::) leaves the choice to the kernel.
pub(super) fn connect_from(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> io::Result<mio::net::TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_nonblocking(true)?;
    if !from.is_unspecified() {
        socket.bind(&std::net::SocketAddr::new(from, 0).into())?;
    }
    match socket.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(mio::net::TcpStream::from_std(socket.into()))
}

/// A fresh handshake challenge from the OS's random source. No fallback: a predictable
/// challenge would let a recorded answer be replayed, so without randomness there is no
/// connection.
pub(super) fn random_challenge() -> Result<[u8; 32], getrandom::Error> {
    let mut c = [0u8; 32];
    getrandom::fill(&mut c)?;
    Ok(c)
}

impl NodeReactor {
    pub(super) fn new(configs: Vec<ResourceConfig>, opts: &NodeOptions) -> Result<NodeReactor> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (signal_rx, signal_tx) = std::os::unix::net::UnixStream::pair()?;
        signal_rx.set_nonblocking(true)?;
        let mut signal_rx = mio::net::UnixStream::from_std(signal_rx);
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::low_level::pipe::register(sig, signal_tx.try_clone()?)?;
        }
        poll.registry()
            .register(&mut signal_rx, SIGNAL, Interest::READABLE)?;
        // SIGHUP (a terminal gone, or `systemctl reload`) no longer ends the node unflushed.
        let (reload_rx, reload_tx) = std::os::unix::net::UnixStream::pair()?;
        reload_rx.set_nonblocking(true)?;
        let mut reload_rx = mio::net::UnixStream::from_std(reload_rx);
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGHUP, reload_tx)?;
        poll.registry()
            .register(&mut reload_rx, RELOAD, Interest::READABLE)?;
        let mut me = NodeReactor {
            poll,
            entries: Slab::new(),
            nbd_listener_of: HashMap::default(),
            peer_listener_at: HashMap::default(),
            res: Vec::new(),
            not_attached: Vec::new(),
            slots: Slab::with_capacity(1024),
            workers: Workers::start(opts.disk_threads, waker),
            pool: BufPool::default(),
            spent_reads: Vec::new(),
            dirty: Vec::new(),
            resume: Vec::new(),
            signal_rx,
            reload_rx,
            config_dir: opts.config_dir.clone(),
            node_name: opts.node.clone(),
            shutting_down: false,
            left_peers: false,
            started: Instant::now(),
            next_tick: Instant::now(),
            engine_wake: None,
            next_conn_id: 0,
            busy_poll: opts.busy_poll,
            syncs_ahead: Vec::new(),
            al_ready: Default::default(),
            al_commits: Vec::new(),
            activity_log: opts.activity_log,
            resyncs: Default::default(),
            resyncs_sampled_ms: 0,
            sync_began: HashMap::default(),
            watchers: Vec::new(),
            events_touched: Vec::new(),
            events_sent: HashMap::default(),
            events_sweep: 0,
            peer_syncs: HashMap::default(),
            progress_told: Vec::new(),
            scrapes: Vec::new(),
            last_scrape_build: Duration::ZERO,
            scrape_sizes: Vec::new(),
            handled: 0,
            jobs: Slab::new(),
            held: HashMap::default(),
            deferred: Default::default(),
        };
        for cfg in configs {
            me.add_resource(cfg, &opts.node, false)?;
        }
        me.listen_control(&opts.control)?;
        if let Some(addr) = opts.metrics {
            me.listen_metrics(addr)?;
        }
        Ok(me)
    }

    /// Attaches resource `cfg`'s replicas and serves it. A replica whose metadata or
    /// backing file cannot be used (corrupted, unreadable) leaves that resource not
    /// attached, with the reason in the log and in `tandem status`, and the node serves its
    /// other resources: one bad file does not take down every volume the node holds.
    /// A listener that cannot bind refuses the resource whole (nothing of it registered);
    /// at start that stops the node, as it is the node's configuration, not one replica's
    /// state. Added while running (`tandem adjust`, `online`), every listener is bound
    /// before the metadata is even opened, so a refusal leaves the replica as it was. At
    /// start the metadata comes first, as before: binding first shifted when peers met at
    /// a whole-cluster restart, and cli `a_whole_cluster_killed_lists_an_older_replica_only_its_bitmap_and_log`
    /// then saw beta listed everything in 8 of 12 runs. Traced since: both nodes' dials
    /// succeeded, the second connection replaced the first just after the lists, and the
    /// engine voided the bitmap id at that disconnect (fixed in `bitmap_gi.rs`, and made
    /// rare by `Link::yielding`); the order here no longer matters for it.
    pub(super) fn add_resource(
        &mut self,
        cfg: ResourceConfig,
        node: &str,
        online: bool,
    ) -> Result<()> {
        let my = cfg.node(node).expect("filtered on this node").clone();
        let mut attached = None;
        if !online {
            match self.attach_or_note(&cfg, &my) {
                Some(a) => attached = Some(a),
                None => return Ok(()),
            }
        }
        let nbd_tls = nbd_tls(&cfg, &my)?;
        let peer_tls = peer_tls(&cfg, &my)?;
        let mut nbd = Vec::new();
        for (v, vc) in cfg.volumes.iter().enumerate() {
            for ep in &my.volumes[v].nbd {
                nbd.push((bind_nbd(ep)?, vc.number, v));
            }
        }
        // An address another resource of this node listens on already is shared.
        let peers_l = match self.peer_listener_at.contains_key(&my.address) {
            true => None,
            false => Some(mio::net::TcpListener::bind(my.address).with_context(|| {
                format!(
                    "resource {}: cannot listen for peers on {}",
                    cfg.name, my.address
                )
            })?),
        };
        let attached = match attached {
            Some(a) => a,
            None => match self.attach_or_note(&cfg, &my) {
                Some(a) => a,
                None => return Ok(()),
            },
        };
        let r = self.res.len();
        for (l, number, v) in nbd {
            self.register_nbd(&cfg, number, l, (r, v))?;
        }
        match peers_l {
            Some(l) => self.register_peer_listener(l, my.address, r)?,
            None => {
                let e = self.peer_listener_at[&my.address];
                if let Some(Entry::PeerListener { res, .. }) = self.entries.get_mut(e) {
                    res.push(r);
                }
                info!(resource = %cfg.name, "sharing the replication address {} with this node's other resources", my.address);
            }
        }
        let peers = peer_slots(&cfg, my.node_id);
        let Attached {
            engine,
            backings,
            metas,
            exports,
        } = attached;
        let states: Vec<_> = (0..cfg.volumes.len())
            .map(|v| engine.disk(v as u16))
            .collect();
        info!(resource = %cfg.name, node = %my.name, node_id = my.node_id, "replication on {}; disks {states:?}", my.address);
        let n_volumes = exports.len();
        self.res.push(ResCtx {
            me: my.node_id,
            my_address: my.address,
            cfg,
            engine,
            data: Default::default(),
            backings,
            metas,
            exports,
            peers,
            demote_pending: false,
            congested: false,
            stalled: Vec::new(),
            syncs: SyncPlan::default(),
            nbd_flushes: FlushPattern::default(),
            al_app: Default::default(),
            al_answered: Default::default(),
            al_peer: Default::default(),
            al_settled: Default::default(),
            al_waiting: Vec::new(),
            al_sync: None,
            meta_failed: MetaFailed::No,
            presence: Presence::Serving,
            stats: super::metrics_http::ResStats::new(&my),
            gates: (0..n_volumes).map(|_| Default::default()).collect(),
            nbd_tls,
            peer_tls,
        });
        Ok(())
    }

    /// The resource's replicas attached, or the reason they cannot be noted for status.
    fn attach_or_note(&mut self, cfg: &ResourceConfig, my: &NodeConfig) -> Option<Attached> {
        match attach(cfg, my, self.activity_log) {
            Ok(a) => Some(a),
            Err(e) => {
                let why = crate::error_chain(&e);
                error!(resource = %cfg.name, node = %my.name, "not attached: {why}");
                self.not_attached.push(NotAttached {
                    name: cfg.name.clone(),
                    node_id: my.node_id,
                    why,
                });
                None
            }
        }
    }

    /// The listener for resource `r`'s peers, on this node's replication address `at`.
    fn register_peer_listener(
        &mut self,
        mut pl: mio::net::TcpListener,
        at: std::net::SocketAddr,
        r: usize,
    ) -> Result<()> {
        let e = self.entries.vacant_key();
        self.poll
            .registry()
            .register(&mut pl, MioToken(e), Interest::READABLE)?;
        self.entries.insert(Entry::PeerListener {
            res: vec![r],
            l: pl,
        });
        self.peer_listener_at.insert(at, e);
        Ok(())
    }

    /// An NBD listener for volume `rv` = (resource, volume index).
    fn register_nbd(
        &mut self,
        cfg: &ResourceConfig,
        number: u16,
        mut l: Listener,
        rv: (usize, usize),
    ) -> Result<()> {
        let e = self.entries.vacant_key();
        self.poll
            .registry()
            .register(l.source(), MioToken(e), Interest::READABLE)?;
        info!(resource = %cfg.name, volume = number, "NBD on {}", l.describe());
        self.entries.insert(Entry::NbdListener { l });
        self.nbd_listener_of.insert(e, rv);
        Ok(())
    }

    pub(super) fn listen_control(&mut self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).ok();
        }
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!(
                    "control socket {} is in use by a running daemon",
                    path.display()
                );
            }
            std::fs::remove_file(path).ok();
        }
        let mut l = mio::net::UnixListener::bind(path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let e = self.entries.vacant_key();
        self.poll
            .registry()
            .register(&mut l, MioToken(e), Interest::READABLE)?;
        self.entries
            .insert(Entry::ControlListener(l, path.to_path_buf()));
        info!("control socket {}", path.display());
        Ok(())
    }
}

/// The node's TLS for NBD clients of resource `cfg`, its files read and checked (a bad
/// one refuses the resource, naming the file).
fn nbd_tls(cfg: &ResourceConfig, my: &NodeConfig) -> Result<Option<crate::tls::NbdTls>> {
    let loaded = crate::tls::node_nbd_tls(&my.tls)
        .with_context(|| format!("resource {}: nbd-tls of node {}", cfg.name, my.name))?;
    if let Some(t) = &loaded {
        let certificate = my.tls.certificate.as_ref().map(|c| c.display().to_string());
        let client_ca = my
            .tls
            .nbd_client_ca
            .as_ref()
            .map(|c| c.display().to_string());
        info!(resource = %cfg.name, mode = ?t.mode, certificate = certificate.unwrap_or_default(), client_ca = client_ca.as_deref().unwrap_or("none"), "NBD TLS");
    }
    Ok(loaded)
}

/// TLS on resource `cfg`'s peer links, its files read and checked (a bad one refuses the
/// resource, naming the file) or its ephemeral certificate made.
fn peer_tls(cfg: &ResourceConfig, my: &NodeConfig) -> Result<Option<crate::tls::PeerTls>> {
    let loaded = crate::tls::PeerTls::load(cfg, my)
        .with_context(|| format!("resource {}: tls of node {}", cfg.name, my.name))?;
    if loaded.is_some() {
        let ca = cfg.tls_ca.as_ref().map(|c| c.display().to_string());
        info!(resource = %cfg.name, mode = %cfg.tls, ca = ca.as_deref().unwrap_or("none"), "TLS on the peer links");
    }
    Ok(loaded)
}

/// An NBD listener bound (not yet registered).
fn bind_nbd(ep: &Endpoint) -> Result<Listener> {
    Ok(match ep {
        Endpoint::Tcp(a) => Listener::Tcp(
            mio::net::TcpListener::bind(*a)
                .with_context(|| format!("cannot listen for NBD on {a}"))?,
        ),
        Endpoint::Unix(p) => crate::serve::bind(&[crate::serve::ListenAddr::Unix(p.clone())])?
            .pop()
            .expect("one listener"),
    })
}

/// The other nodes of a resource, not yet connected, each to be dialled at once.
fn peer_slots(cfg: &ResourceConfig, me: NodeId) -> Vec<PeerSlot> {
    let now = Instant::now();
    (cfg.nodes.iter())
        .filter(|n| n.node_id != me)
        .map(|n| peer_slot(cfg, me, n, now))
        .collect()
}

/// Node `n` of the resource as a peer of node `me`, not yet connected, to be dialled at
/// once (half an interval later if `me` has the higher id: `Link::yielding`).
pub(super) fn peer_slot(
    cfg: &ResourceConfig,
    me: NodeId,
    n: &NodeConfig,
    now: Instant,
) -> PeerSlot {
    let net = &cfg.net;
    let link = Link::new(net.connect_interval, net.max_connect_interval, now);
    PeerSlot {
        id: n.node_id,
        name: n.name.clone(),
        address: n.address,
        conn: None,
        dialing: None,
        link: if me > n.node_id {
            link.yielding()
        } else {
            link
        },
        wanted: true,
        split_brain: None,
        split_brain_resolved: None,
        last_error: None,
        failing: None,
        stats: super::metrics_http::PeerStats::new(cfg.volumes.len()),
    }
}

/// A resource's replicas opened and its engine restored from their metadata, before
/// anything of it is registered.
struct Attached {
    engine: Resource,
    backings: Vec<Option<Arc<tandem_storage::Backing>>>,
    metas: Vec<Option<metadata::VolumeMeta>>,
    exports: Vec<ExportInfo>,
}

/// Opens (or creates) every replica of `cfg` on this node and restores the engine from
/// what their metadata says; marks each running (not clean) last, once all opened.
fn attach(cfg: &ResourceConfig, my: &NodeConfig, activity_log: bool) -> Result<Attached> {
    let mut backings = Vec::new();
    let mut metas = Vec::new();
    let mut disks = Vec::new();
    let mut restore = Vec::new();
    let mut suspect = Vec::new();
    let mut exports = Vec::new();
    for (v, vc) in cfg.volumes.iter().enumerate() {
        let nv = &my.volumes[v];
        match &nv.disk {
            None => {
                backings.push(None);
                metas.push(None);
                disks.push(ReplicaAtStart::None);
            }
            Some(path) => {
                let o = metadata::open_replica(cfg, v, my.node_id, path, &nv.meta, nv.al_extents)?;
                disks.push(o.found);
                backings.push(Some(o.backing));
                metas.push(Some(o.meta));
                restore.extend(o.restore.into_iter().map(|r| (v as u16, r)));
                suspect.push((v as u16, o.suspect, o.writer, o.lost_power));
            }
        }
        exports.push(ExportInfo {
            name: export_name(cfg, v),
            description: format!("tandem resource {} volume {}", cfg.name, vc.number),
            size: vc.size,
            read_only: false,
            block: BlockSizes::new(512),
        });
    }
    let gi_seed = u64::from_le_bytes(random_challenge()?[..8].try_into().expect("8 bytes"));
    let mut engine = Resource::new(spec_of(cfg, my.node_id, gi_seed), disks);
    for (v, (peer, words, apart, gi)) in restore {
        engine
            .restore_peer(v, peer, &words, apart, gi)
            .context("restoring metadata")?;
    }
    for (v, ranges, writer, lost_power) in suspect {
        if !ranges.is_empty() {
            engine
                .restore_suspect(v, ranges)
                .context("restoring metadata")?;
        }
        // Not for the only replica (it keeps no suspect ranges): nothing to settle, and
        // nobody to rank against.
        if let Some(run) = writer {
            let _ = engine.restore_writer(v, run);
        }
        if lost_power {
            let _ = engine.restore_lost_power(v);
        }
    }
    for (v, m) in metas.iter().enumerate() {
        if let Some(m) = m {
            engine
                .restore_ids(v as u16, m.kept_ids(), m.was_primary())
                .context("restoring metadata")?;
        }
    }
    for (v, m) in metas.iter_mut().enumerate() {
        if let Some(m) = m {
            m.mark_running(&metadata::diskful_peers(cfg, v, my.node_id))
                .and_then(|()| {
                    let consistent = activity_log && engine.consistent(v as u16);
                    let ids = engine.ids_at_crash(v as u16);
                    let bitmap_gi = |node| engine.bitmap_gi(v as u16, node);
                    m.set_state(consistent, false, ids, None, bitmap_gi)
                })
                // Only now: a crash before this line still found the suspects. A crashed
                // replica stays consistent until proven or synced (it takes no writes
                // meanwhile, and its log's extents stay in the log), and keeps the map's
                // extents it counted among them.
                .and_then(|()| {
                    let keeps = activity_log && !engine.suspect_ranges(v as u16).is_empty();
                    m.unsynced_after_start(keeps)
                })
                .with_context(|| format!("volume {}", cfg.volumes[v].number))?;
        }
    }
    Ok(Attached {
        engine,
        backings,
        metas,
        exports,
    })
}

/// The engine's quorum settings from the configuration's.
fn quorum_of(cfg: &ResourceConfig) -> tandem_engine::replica::QuorumSpec {
    use tandem_engine::replica::{OnNoQuorum, QuorumSpec, Votes};
    let votes = |v: tandem_config::Votes| match v {
        tandem_config::Votes::Off => Votes::Off,
        tandem_config::Votes::Majority => Votes::Majority,
        tandem_config::Votes::All => Votes::All,
        tandem_config::Votes::Count(n) => Votes::Count(n),
    };
    QuorumSpec {
        quorum: votes(cfg.quorum.quorum),
        min_redundancy: votes(cfg.quorum.minimum_redundancy),
        on_loss: match cfg.quorum.on_no_quorum {
            tandem_config::OnNoQuorum::IoError => OnNoQuorum::IoError,
            tandem_config::OnNoQuorum::SuspendIo => OnNoQuorum::SuspendIo,
        },
    }
}
