//! `tandem node`: the node daemon. It loads the resources that name this node, keeps a
//! connection to every other node of each (full mesh: the lower node id dials), serves each
//! volume over NBD, and answers the administration verbs on a control socket.
//!
//! Like `serve`, one event loop owns everything; the replicated engine of each resource
//! ([`tandem_engine::replica::Resource`]) decides, this module executes.

mod control;
mod links;
mod peer;

use crate::bufpool::{BufPool, DataBuf};
use crate::busy_poll::Waiter;
use crate::conn::{Conn, Phase, ReadOutcome};
use crate::listener::{Listener, Stream};
use crate::worker::{Done, Job, Workers};
use anyhow::{bail, Context, Result};
use links::{Attempt, Link};
use mio::{Events, Interest, Poll, Token as MioToken, Waker};
use peer::PeerConn;
use rustc_hash::FxHashMap as HashMap;
use slab::Slab;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_config::{Endpoint, ResourceConfig};
use tandem_engine::replica::{
    AutoPromote, DataRef, Msg, NodeId, PromoteError, Protocol, RAction, ReplicaAtStart, Resource,
    ResourceSpec, Role, Token,
};
use tandem_engine::sync_plan::{FlushPattern, FlushPlan, SyncPlan, SyncStart};
use tandem_engine::{DiskKind, Io, IoError, ReqId};
use tandem_frontend::nbd::{
    reply, BlockSizes, Command, Decoded, Errno, ExportInfo, HandshakeStep, RequestDecoder,
    TransmissionParams,
};
use tandem_storage::{Backing, OpenOptions};
use tandem_wire::handshake::{
    HandshakeConfig, HandshakeError, HandshakeStep as PeerStep, PeerHandshake,
};
use tandem_wire::packet::{Decoded as Frame, Packet};
use tracing::{debug, error, info, warn};

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
    NodeReactor::new(mine, &opts)?.run()
}

const WAKER: MioToken = MioToken(usize::MAX - 1);
const SIGNAL: MioToken = MioToken(usize::MAX - 2);
const TICK: Duration = Duration::from_millis(100);
/// The most written data a Secondary flushes on its event loop (see `disk`).
const INLINE_SYNC_MAX: u64 = 256 << 10;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a client fenced by `tandem secondary --force` is told for each request.
const FENCED: &str = "the administrator made this node Secondary (--force): the volume is no longer served to this client";
/// How many times the usual busy-poll window a node polls while its resources see a
/// flush after every few writes. Between a write and the next one there are then two
/// round trips (the write's, then the FLUSH's with an fdatasync in the middle): with the
/// usual window every node went to sleep in between and paid a wakeup per hop. Measured
/// on this 2-core VM with fio `fsync=1` through the diskless Primary, ×1/×4/×8:
/// 2,160–2,410 / 2,880–2,990 / 3,050–3,130 IOPS.
const FLUSH_HEAVY_POLL: u32 = 8;

/// One peer of a resource as the daemon sees it.
struct PeerSlot {
    id: NodeId,
    name: String,
    address: std::net::SocketAddr,
    /// The entry of its live connection, once authenticated.
    conn: Option<usize>,
    /// An outgoing attempt in progress.
    dialing: Option<usize>,
    link: Link,
    /// `tandem disconnect` keeps it StandAlone until `tandem connect`.
    wanted: bool,
    /// Why the last connection ended, for status.
    last_error: Option<String>,
    /// Our replicas diverged (two Primaries while apart): not reconnected (`wanted` is
    /// off) until `tandem connect`; what happened, for status.
    split_brain: Option<String>,
}

struct ResCtx {
    cfg: ResourceConfig,
    me: NodeId,
    /// Our replication address: outgoing peer connections come from its IP.
    my_address: std::net::SocketAddr,
    engine: Resource,
    backings: Vec<Option<Arc<Backing>>>,
    exports: Vec<ExportInfo>,
    peers: Vec<PeerSlot>,
    /// `tandem secondary --force` with requests in flight: the clients are fenced, and the
    /// engine is demoted once those requests are answered.
    demote_pending: bool,
    /// A peer's send queue passed `max-buffer`: NBD clients of this resource are not read
    /// until every queue is back under half of it (memory stays bounded behind a slow
    /// peer; applications wait instead).
    congested: bool,
    /// NBD client entries that stopped reading because of it.
    stalled: Vec<usize>,
    /// Which fdatasync covers which local writes; the engine's flush waiting for one.
    syncs: SyncPlan<(u16, Token)>,
    /// Whether this resource's NBD clients flush after every few writes.
    nbd_flushes: FlushPattern,
}

impl ResCtx {
    /// Flushes come after every few small writes, here or at the Primary: the next
    /// request is due a whole round trip after a barrier (see `FLUSH_HEAVY_POLL`).
    fn flush_heavy(&self) -> bool {
        self.syncs.flush_heavy() || self.nbd_flushes.flush_heavy()
    }
}

impl ResCtx {
    /// "beta (node-id 1)" for logs.
    fn peer_name(&self, id: NodeId) -> String {
        match self.peers.iter().find(|p| p.id == id) {
            Some(p) => format!("{} (node-id {id})", p.name),
            None => format!("node-id {id}"),
        }
    }

    /// A promotion refusal in the administrator's terms (node names, not ids).
    fn explain(&self, e: PromoteError) -> String {
        match e {
            PromoteError::PeerPrimary(id) => format!("node {} is Primary", self.peer_name(id)),
            PromoteError::NoUpToDate(_) => e.to_string(),
        }
    }
}

enum Entry {
    NbdListener {
        l: Listener,
    },
    Nbd {
        res: usize,
        vol: usize,
        conn: Box<Conn>,
    },
    PeerListener {
        res: usize,
        l: mio::net::TcpListener,
    },
    Peer(Box<PeerConn>),
    ControlListener(mio::net::UnixListener, PathBuf),
    Control(Box<control::ControlConn>),
}

/// An in-flight NBD request.
struct Slot {
    entry: usize,
    cookie: u64,
    structured: bool,
    read: Option<(u64, u32)>,
}

/// Bytes the engine may name while its actions run.
#[derive(Clone, Copy, Default)]
struct Ctx<'a> {
    incoming: Option<&'a [u8]>,
    payload: Option<(ReqId, &'a [u8])>,
}

/// What a disk worker's job was for.
#[derive(Clone, Copy, Debug)]
enum Tag {
    /// An operation the engine asked for: (resource, volume, token).
    Op(usize, u16, Token),
    /// An fdatasync of every local replica of a resource, covering its writes up to `gen`
    /// (see [`tandem_engine::sync_plan`]).
    Sync { r: usize, gen: u64 },
}

struct NodeReactor {
    poll: Poll,
    entries: Slab<Entry>,
    /// Which entry is the NBD listener for (resource, volume).
    nbd_listener_of: HashMap<usize, (usize, usize)>,
    res: Vec<ResCtx>,
    slots: Slab<Slot>,
    workers: Workers<Tag>,
    pool: BufPool,
    held: HashMap<(usize, Token), Vec<u8>>,
    disk_bufs: HashMap<(usize, Token), DataBuf>,
    /// Reads whose completion went to the engine: the engine uses their buffers only in
    /// the actions of that completion, so whatever is left once those ran goes back to
    /// the pool (an answer to a connection that dropped meanwhile is never sent).
    spent_reads: Vec<(usize, Token)>,
    dirty: Vec<usize>,
    /// NBD clients to read from again once the current round of work is done.
    resume: Vec<usize>,
    signal_rx: mio::net::UnixStream,
    shutting_down: bool,
    started: Instant,
    /// Housekeeping (dialing, handshake deadlines) and the engines' timers run then...
    next_tick: Instant,
    /// ...or earlier, when an engine asked for it (`Resource::poll_timeout`: a resync
    /// retry after 20 ms should not wait for the next 100 ms tick).
    engine_wake: Option<Instant>,
    next_conn_id: u64,
    busy_poll: Duration,
    /// Syncs ahead of a flush (see [`tandem_engine::sync_plan`]), started after this round's sends.
    syncs_ahead: Vec<(usize, SyncStart)>,
    /// NBD requests and peer packets handled since the last wait (see `busy_poll::BURST`).
    handled: usize,
}

fn spec_of(cfg: &ResourceConfig, me: NodeId) -> ResourceSpec {
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
    }
}

fn export_name(cfg: &ResourceConfig, vol: usize) -> String {
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
fn connect_from(
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
fn random_challenge() -> Result<[u8; 32], getrandom::Error> {
    let mut c = [0u8; 32];
    getrandom::fill(&mut c)?;
    Ok(c)
}

impl NodeReactor {
    fn new(configs: Vec<ResourceConfig>, opts: &NodeOptions) -> Result<NodeReactor> {
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
        let mut me = NodeReactor {
            poll,
            entries: Slab::new(),
            nbd_listener_of: HashMap::default(),
            res: Vec::new(),
            slots: Slab::with_capacity(1024),
            workers: Workers::start(opts.disk_threads, waker),
            pool: BufPool::default(),
            held: HashMap::default(),
            disk_bufs: HashMap::default(),
            spent_reads: Vec::new(),
            dirty: Vec::new(),
            resume: Vec::new(),
            signal_rx,
            shutting_down: false,
            started: Instant::now(),
            next_tick: Instant::now(),
            engine_wake: None,
            next_conn_id: 0,
            busy_poll: opts.busy_poll,
            syncs_ahead: Vec::new(),
            handled: 0,
        };
        for cfg in configs {
            me.add_resource(cfg, &opts.node)?;
        }
        me.listen_control(&opts.control)?;
        Ok(me)
    }

    fn add_resource(&mut self, cfg: ResourceConfig, node: &str) -> Result<()> {
        let r = self.res.len();
        let my = cfg.node(node).expect("filtered on this node").clone();
        let mut backings = Vec::new();
        let mut disks = Vec::new();
        let mut exports = Vec::new();
        for (v, vc) in cfg.volumes.iter().enumerate() {
            let nv = &my.volumes[v];
            match &nv.disk {
                None => {
                    backings.push(None);
                    disks.push(ReplicaAtStart::None);
                }
                Some(path) => {
                    let existed = path.exists();
                    let b = Backing::open(&OpenOptions {
                        path: path.clone(),
                        size: Some(vc.size),
                        direct: false,
                        read_only: false,
                    })
                    .with_context(|| format!("resource {} volume {}", cfg.name, vc.number))?;
                    // The engine decides what each may be trusted with (ReplicaAtStart).
                    disks.push(if existed {
                        ReplicaAtStart::Existing
                    } else {
                        warn!(resource = %cfg.name, volume = vc.number,
                            "backing file {} did not exist: created it empty. It holds no data, so it starts Inconsistent and is synced in full from an up-to-date peer before it serves reads, unless every node's replica of this volume is new (a new cluster)",
                            path.display());
                        ReplicaAtStart::Created
                    });
                    backings.push(Some(Arc::new(b)));
                }
            }
            exports.push(ExportInfo {
                name: export_name(&cfg, v),
                description: format!("tandem resource {} volume {}", cfg.name, vc.number),
                size: vc.size,
                read_only: false,
                block: BlockSizes::new(512),
            });
            for ep in &nv.nbd {
                let l = match ep {
                    Endpoint::Tcp(a) => Listener::Tcp(
                        mio::net::TcpListener::bind(*a)
                            .with_context(|| format!("cannot listen for NBD on {a}"))?,
                    ),
                    Endpoint::Unix(p) => {
                        crate::serve::bind(&[crate::serve::ListenAddr::Unix(p.clone())])?
                            .pop()
                            .expect("one listener")
                    }
                };
                let e = self.entries.insert(Entry::NbdListener { l });
                if let Entry::NbdListener { l } = &mut self.entries[e] {
                    self.poll
                        .registry()
                        .register(l.source(), MioToken(e), Interest::READABLE)?;
                    info!(resource = %cfg.name, volume = vc.number, "NBD on {}", l.describe());
                }
                self.nbd_listener_of.insert(e, (r, v));
            }
        }
        let mut pl = mio::net::TcpListener::bind(my.address).with_context(|| {
            format!(
                "resource {}: cannot listen for peers on {}",
                cfg.name, my.address
            )
        })?;
        let e = self.entries.vacant_key();
        self.poll
            .registry()
            .register(&mut pl, MioToken(e), Interest::READABLE)?;
        self.entries.insert(Entry::PeerListener { res: r, l: pl });
        let peers = cfg
            .nodes
            .iter()
            .filter(|n| n.node_id != my.node_id)
            .map(|n| PeerSlot {
                id: n.node_id,
                name: n.name.clone(),
                address: n.address,
                conn: None,
                dialing: None,
                link: Link::new(
                    cfg.net.connect_interval,
                    cfg.net.max_connect_interval,
                    Instant::now(),
                ),
                wanted: true,
                split_brain: None,
                last_error: None,
            })
            .collect();
        let engine = Resource::new(spec_of(&cfg, my.node_id), disks);
        let states: Vec<_> = (0..cfg.volumes.len())
            .map(|v| engine.disk(v as u16))
            .collect();
        info!(resource = %cfg.name, node = %my.name, node_id = my.node_id, "replication on {}; disks {states:?}", my.address);
        self.res.push(ResCtx {
            me: my.node_id,
            my_address: my.address,
            cfg,
            engine,
            backings,
            exports,
            peers,
            demote_pending: false,
            congested: false,
            stalled: Vec::new(),
            syncs: SyncPlan::default(),
            nbd_flushes: FlushPattern::default(),
        });
        Ok(())
    }

    fn listen_control(&mut self, path: &Path) -> Result<()> {
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

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn run(mut self) -> Result<()> {
        let mut events = Events::with_capacity(256);
        // Measured here: iodepth-1 replicated writes 101-111 us -> 48-56 us.
        let mut waiter = Waiter::new(self.busy_poll);
        loop {
            let wake = self
                .engine_wake
                .map_or(self.next_tick, |w| w.min(self.next_tick));
            let timeout = wake.saturating_duration_since(Instant::now());
            let stretch = if self.res.iter().any(ResCtx::flush_heavy) {
                FLUSH_HEAVY_POLL
            } else {
                1
            };
            let handled = std::mem::take(&mut self.handled);
            waiter.wait_stretched(&mut self.poll, &mut events, Some(timeout), handled, stretch)?;
            let mut active = Vec::new();
            for ev in events.iter() {
                match ev.token() {
                    WAKER => self.worker_completions(),
                    SIGNAL => self.begin_shutdown(),
                    MioToken(k) => {
                        if ev.is_writable() {
                            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                                pc.connecting = false;
                            }
                            self.mark_dirty(k);
                        }
                        if ev.is_readable() || ev.is_error() || ev.is_read_closed() {
                            active.push(k);
                        }
                    }
                }
            }
            for k in active {
                self.on_readable(k);
            }
            if Instant::now() >= wake {
                self.next_tick = Instant::now() + TICK;
                self.engine_wake = None;
                self.tick();
            }
            self.flush_dirty();
            while !self.resume.is_empty() {
                for k in std::mem::take(&mut self.resume) {
                    self.service_nbd(k);
                }
                self.flush_dirty();
            }
            if !self.syncs_ahead.is_empty() {
                self.start_syncs_ahead();
                self.flush_dirty();
            }
            if self.shutting_down
                && self.slots.is_empty()
                && !self
                    .entries
                    .iter()
                    .any(|(_, e)| matches!(e, Entry::Nbd { .. }))
            {
                for r in &self.res {
                    for b in r.backings.iter().flatten() {
                        b.sync_data().context("final flush")?;
                    }
                }
                info!("all requests finished and flushed; exiting");
                return Ok(());
            }
        }
    }

    fn mark_dirty(&mut self, k: usize) {
        let dirty = match self.entries.get_mut(k) {
            Some(Entry::Nbd { conn, .. }) => &mut conn.dirty,
            Some(Entry::Peer(pc)) => &mut pc.dirty,
            Some(Entry::Control(c)) => &mut c.dirty,
            _ => return,
        };
        if !*dirty {
            *dirty = true;
            self.dirty.push(k);
        }
    }

    fn begin_shutdown(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(io::Read::read(&mut self.signal_rx, &mut buf), Ok(n) if n > 0) {}
        if self.shutting_down {
            return;
        }
        info!("shutting down: finishing requests in flight");
        self.shutting_down = true;
        let keys: Vec<usize> = self.entries.iter().map(|(k, _)| k).collect();
        for k in keys {
            match &mut self.entries[k] {
                Entry::NbdListener { .. }
                | Entry::ControlListener(..)
                | Entry::PeerListener { .. } => {
                    let e = self.entries.remove(k);
                    if let Entry::ControlListener(_, p) = &e {
                        std::fs::remove_file(p).ok();
                    }
                }
                Entry::Nbd { conn, .. } => {
                    conn.read_closed = true;
                    self.mark_dirty(k);
                }
                _ => {}
            }
        }
    }

    // ------------------------------------------------------------------ readiness

    fn on_readable(&mut self, k: usize) {
        let Some(e) = self.entries.get_mut(k) else {
            return;
        };
        match e {
            Entry::NbdListener { .. } => self.accept_nbd(k),
            Entry::PeerListener { .. } => self.accept_peer(k),
            Entry::ControlListener(..) => self.accept_control(k),
            Entry::Nbd { conn, .. } => {
                conn.readable = true;
                self.service_nbd(k);
            }
            Entry::Peer(pc) => {
                pc.readable = true;
                self.service_peer(k);
            }
            Entry::Control(_) => self.service_control(k),
        }
    }

    fn accept_nbd(&mut self, k: usize) {
        let (r, v) = self.nbd_listener_of[&k];
        loop {
            let Some(Entry::NbdListener { l }) = self.entries.get(k) else {
                return;
            };
            let (mut stream, peer) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("NBD accept failed: {e}"),
            };
            self.next_conn_id += 1;
            let name = format!("{peer}#{}", self.next_conn_id);
            let key = self.entries.vacant_key();
            if let Err(e) =
                self.poll
                    .registry()
                    .register(stream.source(), MioToken(key), Interest::READABLE)
            {
                warn!(client = %name, "cannot register: {e}");
                continue;
            }
            let conn = Conn::new(stream, name, Instant::now() + HANDSHAKE_TIMEOUT);
            self.entries.insert(Entry::Nbd {
                res: r,
                vol: v,
                conn: Box::new(conn),
            });
            self.dirty.push(key);
            self.service_nbd(key);
        }
    }

    fn accept_peer(&mut self, k: usize) {
        loop {
            let Some(Entry::PeerListener { res, l }) = self.entries.get(k) else {
                return;
            };
            let r = *res;
            let (s, addr) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("peer accept failed: {e}"),
            };
            let _ = s.set_nodelay(true);
            self.new_peer_conn(r, Stream::Tcp(s), format!("{addr}"), None);
        }
    }

    fn new_peer_conn(
        &mut self,
        r: usize,
        mut stream: Stream,
        addr: String,
        dialed: Option<NodeId>,
    ) -> Option<usize> {
        let res = &self.res[r];
        let cfg = HandshakeConfig {
            me: res.me,
            resource: res.cfg.name.clone(),
            secret: res.cfg.secret.clone(),
            allowed_peers: res.peers.iter().map(|p| p.id).collect(),
            expect: dialed,
            features: 0,
            standalone_towards: res
                .peers
                .iter()
                .filter(|p| !p.wanted)
                .map(|p| p.id)
                .collect(),
        };
        let challenge = match random_challenge() {
            Ok(c) => c,
            Err(e) => {
                error!(resource = %res.cfg.name, "no random bytes for a handshake challenge ({e}); not connecting");
                return None;
            }
        };
        let mut greeting = Vec::new();
        let hs = PeerHandshake::new(cfg, challenge, &mut greeting);
        let key = self.entries.vacant_key();
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .poll
            .registry()
            .register(stream.source(), MioToken(key), interest)
        {
            warn!("cannot register peer connection: {e}");
            return None;
        }
        self.next_conn_id += 1;
        let name = format!("{addr}#{}", self.next_conn_id);
        let net = &self.res[r].cfg.net;
        // A dial gives up after the retry interval (at least a second, at most
        // `timeout`), so attempts keep the configured pace whatever the kernel does.
        let patience = match dialed.and_then(|d| self.res[r].peers.iter().find(|p| p.id == d)) {
            Some(slot) => slot.link.patience().min(net.timeout),
            None => net.timeout,
        };
        let deadline = Instant::now() + patience;
        let mut pc = PeerConn::new(stream, r, name, hs, greeting, dialed, deadline);
        pc.write_interest = true;
        self.entries.insert(Entry::Peer(Box::new(pc)));
        self.dirty.push(key);
        Some(key)
    }

    fn accept_control(&mut self, k: usize) {
        loop {
            let Some(Entry::ControlListener(l, _)) = self.entries.get(k) else {
                return;
            };
            let (mut s, _) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("control accept failed: {e}"),
            };
            let key = self.entries.vacant_key();
            if self
                .poll
                .registry()
                .register(&mut s, MioToken(key), Interest::READABLE)
                .is_ok()
            {
                self.entries
                    .insert(Entry::Control(Box::new(control::ControlConn::new(s))));
                self.service_control(key);
            }
        }
    }

    // ------------------------------------------------------------------ NBD clients

    fn service_nbd(&mut self, k: usize) {
        loop {
            self.process_nbd(k);
            let Some(Entry::Nbd { conn, res, .. }) = self.entries.get_mut(k) else {
                return;
            };
            if !conn.wants_input() || self.res[*res].congested {
                break;
            }
            match conn.read_some() {
                ReadOutcome::Data => {}
                ReadOutcome::WouldBlock => {
                    conn.readable = false;
                    break;
                }
                ReadOutcome::Eof => conn.eof = true,
                ReadOutcome::Error(e) => {
                    debug!(client = %conn.name, "connection failed: {e}");
                    conn.dead = true;
                    break;
                }
            }
        }
        self.mark_dirty(k);
    }

    fn process_nbd(&mut self, k: usize) {
        let Some(Entry::Nbd { res, vol, conn }) = self.entries.get_mut(k) else {
            return;
        };
        let (r, v) = (*res, *vol);
        if conn.dead {
            return;
        }
        if let Phase::Handshake(h) = &mut conn.phase {
            let exports = std::slice::from_ref(&self.res[r].exports[v]);
            let (n, step) = h.feed(
                &conn.inbuf[conn.in_start..conn.in_end],
                exports,
                self.shutting_down,
                &mut conn.out,
            );
            conn.consume(n);
            match step {
                HandshakeStep::NeedMore => {
                    if conn.eof {
                        conn.read_closed = true;
                    }
                    return;
                }
                HandshakeStep::Close(reason) => {
                    warn!(client = %conn.name, "handshake refused: {reason}");
                    conn.read_closed = true;
                    return;
                }
                HandshakeStep::Done(neg) => {
                    let export = &self.res[r].exports[v];
                    let params = TransmissionParams {
                        size: export.size,
                        read_only: false,
                        block: export.block,
                        structured_replies: neg.structured_replies,
                    };
                    conn.phase = Phase::Transmission {
                        volume: v,
                        decoder: RequestDecoder::new(params),
                        structured: neg.structured_replies,
                    };
                    conn.handshake_deadline = None;
                    // Attaching while a forced demotion waits: no longer served here.
                    conn.fenced = self.res[r].demote_pending;
                    info!(client = %conn.name, export = %export.name, "NBD client attached");
                    self.client_attached(r);
                }
            }
        }
        // Take the input so payloads can be borrowed while the engine's actions touch any
        // entry (replies to this and other clients, packets to peers).
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) else {
            return;
        };
        let input = std::mem::take(&mut conn.inbuf);
        let (mut start, end) = (conn.in_start, conn.in_end);
        while let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) {
            if !conn.has_room() {
                break;
            }
            if self.res[r].congested {
                if !self.res[r].stalled.contains(&k) {
                    self.res[r].stalled.push(k);
                }
                break;
            }
            let Phase::Transmission {
                decoder,
                structured,
                ..
            } = &mut conn.phase
            else {
                break;
            };
            let structured = *structured;
            let (n, decoded) = decoder.decode(&input[start..end]);
            match decoded {
                Decoded::NeedMore { need } => {
                    conn.need = need;
                    start += n;
                    if conn.eof || self.shutting_down {
                        conn.read_closed = true;
                    }
                    break;
                }
                Decoded::Fatal(e) => {
                    warn!(client = %conn.name, "protocol error, closing: {e}");
                    conn.read_closed = true;
                    break;
                }
                Decoded::Rejected(rj) => {
                    warn!(client = %conn.name, cookie = rj.cookie, errno = ?rj.errno, "request refused: {}", rj.reason);
                    reply::error(&mut conn.out, structured, rj.cookie, rj.errno, rj.reason);
                }
                Decoded::WriteHeader(_) => {
                    unreachable!("streaming is not enabled for replicated volumes")
                }
                Decoded::Request(req, _) if req.command == Command::Disconnect => {
                    conn.read_closed = true;
                    start += n;
                    break;
                }
                Decoded::Request(req, _) if conn.fenced => {
                    reply::error(&mut conn.out, structured, req.cookie, Errno::Io, FENCED);
                }
                Decoded::Request(req, _) if self.shutting_down => {
                    reply::error(
                        &mut conn.out,
                        structured,
                        req.cookie,
                        Errno::Shutdown,
                        "server is shutting down",
                    );
                }
                Decoded::Request(req, payload) => {
                    conn.in_flight += 1;
                    self.handled += 1;
                    let flushes = &mut self.res[r].nbd_flushes;
                    match req.command {
                        Command::Write { fua } | Command::Trim { fua } => {
                            flushes.wrote(u64::from(req.len));
                            if fua {
                                flushes.flushed();
                            }
                        }
                        Command::WriteZeroes { fua, .. } => {
                            flushes.wrote(u64::from(req.len));
                            if fua {
                                flushes.flushed();
                            }
                        }
                        Command::Flush => flushes.flushed(),
                        _ => {}
                    }
                    let io = match req.command {
                        Command::Read => Io::Read {
                            offset: req.offset,
                            len: req.len,
                        },
                        Command::Write { fua } => Io::Write {
                            offset: req.offset,
                            len: req.len,
                            fua,
                        },
                        Command::Trim { fua } => Io::Trim {
                            offset: req.offset,
                            len: req.len,
                            fua,
                        },
                        Command::WriteZeroes { fua, no_hole, fast } => Io::Zero {
                            offset: req.offset,
                            len: req.len,
                            fua,
                            may_punch: !no_hole,
                            fast,
                        },
                        Command::Flush => Io::Flush,
                        Command::Cache => Io::Cache {
                            offset: req.offset,
                            len: req.len,
                        },
                        Command::Disconnect => unreachable!("handled above"),
                    };
                    let read = matches!(io, Io::Read { .. }).then_some((req.offset, req.len));
                    let id = ReqId(self.slots.insert(Slot {
                        entry: k,
                        cookie: req.cookie,
                        structured,
                        read,
                    }) as u64);
                    let mut actions = Vec::new();
                    self.res[r].engine.submit(id, v as u16, io, &mut actions);
                    self.run_actions(
                        r,
                        actions,
                        Ctx {
                            incoming: None,
                            payload: Some((id, payload)),
                        },
                    );
                }
            }
            start += n;
        }
        if let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(k) {
            conn.inbuf = input;
            conn.in_start = start;
            conn.in_end = end;
            if conn.in_start == conn.in_end {
                conn.in_start = 0;
                conn.in_end = 0;
            }
        }
    }

    /// Auto-promote (decided by the engine): the first client of a resource makes this node
    /// Primary when no other node is.
    fn client_attached(&mut self, r: usize) {
        let res = &mut self.res[r];
        let mut actions = Vec::new();
        match res.engine.client_attached(&mut actions) {
            AutoPromote::Refused(e) => {
                warn!(resource = %res.cfg.name, "auto-promote refused: {}", res.explain(e))
            }
            AutoPromote::Promoted | AutoPromote::Unchanged => {}
        }
        self.run_actions(r, actions, Ctx::default());
    }

    /// The NBD clients of resource `r` past their handshake and not fenced: "peer#id" names.
    fn attached_clients(&self, r: usize) -> Vec<&str> {
        self.entries
            .iter()
            .filter_map(|(_, e)| match e {
                Entry::Nbd { res, conn, .. }
                    if *res == r
                        && !conn.fenced
                        && matches!(conn.phase, Phase::Transmission { .. }) =>
                {
                    Some(conn.name.as_str())
                }
                _ => None,
            })
            .collect()
    }

    /// `tandem secondary`: like DRBD, a volume in use is not taken from its clients (their
    /// next write would fail) unless the administrator insists; then their requests, in
    /// flight and later, fail with EIO, and the demotion completes once the engine has
    /// answered the ones in flight (a replicated write cannot be recalled half-way).
    fn secondary(&mut self, r: usize, force: bool, out: &mut Vec<RAction>) -> Result<(), String> {
        let clients: Vec<String> = self
            .attached_clients(r)
            .into_iter()
            .map(str::to_string)
            .collect();
        let res = &mut self.res[r];
        if res.engine.role() != Role::Primary || clients.is_empty() {
            res.engine.demote(out).map_err(|e| e.to_string())?;
            return Ok(());
        }
        let n = clients.len();
        let list = clients.join(", ");
        if !force {
            return Err(format!(
                "{} is in use: {n} NBD client{} attached ({list}); their next request would fail. \
                 Disconnect them first, or `tandem secondary {} --force` fails their requests in \
                 flight and later ones with EIO",
                res.cfg.name,
                if n == 1 { "" } else { "s" },
                res.cfg.name
            ));
        }
        let in_flight = res.engine.app_in_flight();
        warn!(resource = %res.cfg.name, clients = %list,
            "administrator: Secondary forced with {n} NBD client(s) attached: their {in_flight} request(s) in flight and all later ones fail with EIO");
        for (_, e) in self.entries.iter_mut() {
            if let Entry::Nbd { res, conn, .. } = e {
                if *res == r && matches!(conn.phase, Phase::Transmission { .. }) {
                    conn.fenced = true;
                }
            }
        }
        let res = &mut self.res[r];
        if in_flight > 0 {
            res.demote_pending = true;
            return Ok(());
        }
        res.engine.demote(out).map_err(|e| e.to_string())
    }

    /// The forced demotion waiting for the engine's requests in flight, once they are done.
    fn finish_forced_demote(&mut self, r: usize) {
        let res = &mut self.res[r];
        if !res.demote_pending || res.engine.app_in_flight() > 0 {
            return;
        }
        res.demote_pending = false;
        let mut actions = Vec::new();
        if let Err(e) = res.engine.demote(&mut actions) {
            error!(resource = %res.cfg.name, "forced demotion failed: {e}");
        }
        self.run_actions(r, actions, Ctx::default());
    }

    /// Stops replicating with a peer whose replica diverged from ours, once: logged, shown
    /// in status, not redialled (nor accepted) until an administrator runs `tandem connect`.
    fn split_brain(
        &mut self,
        r: usize,
        peer: NodeId,
        volume: u16,
        mine: u64,
        theirs: u64,
        reported: bool,
    ) {
        let res = &mut self.res[r];
        let name = res.peer_name(peer);
        let number = res.cfg.volumes[volume as usize].number;
        let Some(slot) = res.peers.iter_mut().find(|p| p.id == peer) else {
            return;
        };
        if slot.split_brain.is_none() {
            let reason = format!(
                "split brain on volume {number}: both nodes were Primary while apart; this node has {mine} blocks ({} KiB) {} lacks, it has {theirs} blocks ({} KiB) this node lacks{}",
                mine * 4,
                slot.name,
                theirs * 4,
                if reported { " (found by the peer)" } else { "" }
            );
            error!(resource = %res.cfg.name, peer = %name,
                "{reason}. Replication with it stopped until an administrator discards one side's writes (README: Split brain)");
            slot.split_brain = Some(reason.clone());
            slot.last_error = Some(reason);
        }
        slot.wanted = false;
        if let Some(k) = slot.conn.or(slot.dialing) {
            if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                pc.dead = true;
            }
            self.mark_dirty(k);
        }
    }

    /// The engine demotes a node its clients promoted once the last one left and every
    /// request it took is answered.
    fn client_detached(&mut self, r: usize) {
        let mut actions = Vec::new();
        self.res[r].engine.client_detached(&mut actions);
        self.run_actions(r, actions, Ctx::default());
    }

    // ------------------------------------------------------------------ peers

    fn service_peer(&mut self, k: usize) {
        loop {
            self.process_peer(k);
            let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
                return;
            };
            if pc.dead || !pc.readable {
                break;
            }
            match pc.read_some() {
                Ok(0) => {
                    debug!(peer = %pc.name, "connection closed by the peer");
                    // What arrived before the close (often an Error saying why) counts.
                    self.process_peer(k);
                    if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                        pc.dead = true;
                    }
                    break;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    pc.readable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // A session that breaks is a state change; an attempt that fails is
                    // reported by the dialer, once per reason (see dial_failed).
                    if pc.peer.is_some() {
                        info!(peer = %pc.name, "connection failed: {e}");
                    } else {
                        debug!(peer = %pc.name, "connection failed: {e}");
                        pc.failure = Some(e.to_string());
                    }
                    pc.dead = true;
                }
            }
        }
        self.mark_dirty(k);
    }

    fn process_peer(&mut self, k: usize) {
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        if pc.dead {
            return;
        }
        let r = pc.res;
        if let Some(hs) = pc.hs.as_mut() {
            let (n, step) = hs.feed(&pc.inbuf[pc.in_start..pc.in_end], &mut pc.out);
            if let Some(id) = hs.peer() {
                pc.claimed = Some(id);
            }
            let claimed = pc.claimed;
            pc.advance(n);
            match step {
                PeerStep::NeedMore => return,
                PeerStep::Failed(e) => {
                    pc.hs = None;
                    // Dead, but what is queued (an Error packet telling the peer why) still
                    // goes out before the close: see flush_entry.
                    pc.dead = true;
                    let reason = e.to_string();
                    let name = pc.name.clone();
                    let dialed = pc.dialed;
                    let res = &mut self.res[r];
                    if matches!(e, HandshakeError::StandAlone { .. }) {
                        // We refused it, as the administrator asked: not news.
                        debug!(resource = %res.cfg.name, peer = %name, "{reason}");
                    } else if let Some(d) = dialed {
                        self.dial_failed(r, d, reason, Attempt::Refused);
                    } else if let Some(slot) =
                        claimed.and_then(|id| res.peers.iter_mut().find(|p| p.id == id))
                    {
                        // Its own dials fail the same way every interval: say it once.
                        if slot.last_error.as_deref() != Some(reason.as_str()) {
                            error!(resource = %res.cfg.name, peer = %name, "peer handshake failed: {reason}");
                        }
                        slot.last_error = Some(reason.to_string());
                    } else {
                        error!(resource = %res.cfg.name, peer = %name, "peer handshake failed: {reason}");
                    }
                    return;
                }
                PeerStep::Established(est) => {
                    pc.hs = None;
                    pc.deadline = None;
                    let peer = est.peer;
                    let dialed = pc.dialed.is_some();
                    self.bind_peer_conn(r, k, peer, dialed);
                }
            }
        }
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let Some(peer) = pc.peer else { return };
        let input = std::mem::take(&mut pc.inbuf);
        let (mut start, end) = (pc.in_start, pc.in_end);
        let mut failed = None;
        while start < end {
            match tandem_wire::decode(&input[start..end]) {
                Ok(Frame::NeedMore(need)) => {
                    if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                        pc.need = need;
                    }
                    break;
                }
                Ok(Frame::Packet(p, n)) => {
                    self.handled += 1;
                    let data = match p {
                        Packet::Write { data, .. }
                        | Packet::ReadReply { data, .. }
                        | Packet::ResyncReply { data, .. } => Some(data),
                        _ => None,
                    };
                    let mut actions = Vec::new();
                    self.res[r].engine.packet(peer, &p, &mut actions);
                    self.run_actions(
                        r,
                        actions,
                        Ctx {
                            incoming: data,
                            payload: None,
                        },
                    );
                    start += n;
                    if !matches!(self.entries.get(k), Some(Entry::Peer(pc)) if !pc.dead) {
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
            pc.inbuf = input;
            pc.in_start = start;
            pc.in_end = end;
            if start == end {
                pc.in_start = 0;
                pc.in_end = 0;
            }
            if let Some(e) = failed {
                error!(resource = %self.res[r].cfg.name, peer = %pc.name, "ProtocolError: {e}; dropping the connection");
                pc.dead = true;
            }
        }
    }

    /// A connection to `peer` authenticated: it becomes the peer's session, unless one is
    /// bound already. Both ends dial, so when both succeed both keep the one the lower node
    /// id dialed (see links.rs) and drop the other without a word.
    fn bind_peer_conn(&mut self, r: usize, k: usize, peer: NodeId, dialed: bool) {
        let res = &mut self.res[r];
        let me = res.me;
        let slot = res
            .peers
            .iter_mut()
            .find(|p| p.id == peer)
            .expect("the handshake checks the node id");
        if dialed {
            slot.dialing = None;
        }
        let old = slot.conn.and_then(|o| match self.entries.get(o) {
            Some(Entry::Peer(opc)) => Some((o, opc.dialed.is_some())),
            _ => None,
        });
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        if !slot.wanted {
            // Made StandAlone while this handshake ran.
            debug!(resource = %res.cfg.name, peer = %pc.name, "not connecting: StandAlone towards node {peer}");
            pc.dead = true;
            return;
        }
        if let Some((o, old_dialed)) = old {
            if !links::replaces(me, peer, dialed, old_dialed) {
                debug!(resource = %res.cfg.name, peer = %pc.name, "dropping a second connection to node {peer}");
                pc.dead = true;
                return;
            }
            debug!(resource = %res.cfg.name, peer = %pc.name, "this connection to node {peer} replaces the one bound");
            slot.conn = None;
            let mut actions = Vec::new();
            res.engine.peer_down(peer, &mut actions);
            self.run_actions(r, actions, Ctx::default());
            if let Some(Entry::Peer(opc)) = self.entries.get_mut(o) {
                opc.dead = true;
            }
            self.mark_dirty(o);
        }
        let Some(Entry::Peer(pc)) = self.entries.get_mut(k) else {
            return;
        };
        let res = &mut self.res[r];
        let slot = res
            .peers
            .iter_mut()
            .find(|p| p.id == peer)
            .expect("checked above");
        pc.peer = Some(peer);
        pc.name = format!("{} (node {} {})", pc.name, peer, slot.name);
        slot.conn = Some(k);
        slot.link.connected();
        slot.last_error = None;
        if old.is_none() {
            info!(resource = %res.cfg.name, peer = %pc.name, "connected");
        }
        let mut actions = Vec::new();
        res.engine.peer_up(peer, &mut actions);
        self.run_actions(r, actions, Ctx::default());
    }

    /// An attempt to reach `peer` failed. Logged when the reason changes, not at every
    /// attempt: a peer that stays down costs one line, not one per interval.
    fn dial_failed(&mut self, r: usize, peer: NodeId, reason: String, how: Attempt) {
        let res = &mut self.res[r];
        let Some(slot) = res.peers.iter_mut().find(|p| p.id == peer) else {
            return;
        };
        slot.dialing = None;
        slot.link.failed(how, Instant::now());
        if slot.last_error.as_deref() != Some(reason.as_str()) {
            let (name, addr) = (&slot.name, slot.address);
            match how {
                Attempt::Unreachable => {
                    info!(resource = %res.cfg.name, peer = %name, "cannot reach node {peer} at {addr}: {reason}; trying again every {:?}", res.cfg.net.connect_interval)
                }
                Attempt::Refused => {
                    warn!(resource = %res.cfg.name, peer = %name, "node {peer} at {addr} refused the connection: {reason}; trying again at up to {:?} intervals", res.cfg.net.max_connect_interval)
                }
            }
        }
        slot.last_error = Some(reason);
    }

    /// A peer connection's entry is going away.
    fn peer_closed(&mut self, k: usize, pc: &PeerConn) {
        let r = pc.res;
        if let Some(peer) = pc.peer {
            let res = &mut self.res[r];
            if let Some(slot) = res
                .peers
                .iter_mut()
                .find(|p| p.id == peer && p.conn == Some(k))
            {
                slot.conn = None;
                slot.link.failed(Attempt::Unreachable, Instant::now());
                slot.last_error
                    .get_or_insert_with(|| "connection lost".into());
                info!(resource = %res.cfg.name, peer = %pc.name, "disconnected");
                let mut actions = Vec::new();
                res.engine.peer_down(peer, &mut actions);
                self.run_actions(r, actions, Ctx::default());
                self.relieve_congestion(r);
            }
        } else if let Some(d) = pc.dialed {
            let still = self.res[r]
                .peers
                .iter()
                .any(|p| p.id == d && p.dialing == Some(k));
            if still {
                let reason = pc
                    .failure
                    .clone()
                    .unwrap_or_else(|| "could not connect".into());
                self.dial_failed(r, d, reason, Attempt::Unreachable);
            }
        }
    }

    fn dial(&mut self) {
        let now = Instant::now();
        for r in 0..self.res.len() {
            for i in 0..self.res[r].peers.len() {
                let slot = &self.res[r].peers[i];
                // Both ends dial (see links.rs): whichever comes back first is found at once.
                if slot.conn.is_some()
                    || slot.dialing.is_some()
                    || !slot.wanted
                    || !slot.link.due(now)
                {
                    continue;
                }
                let (addr, id) = (slot.address, slot.id);
                self.res[r].peers[i].link.dialing(now);
                match connect_from(self.res[r].my_address.ip(), addr) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let key = self.new_peer_conn(r, Stream::Tcp(s), addr.to_string(), Some(id));
                        self.res[r].peers[i].dialing = key;
                        if key.is_none() {
                            let why = "could not start the connection".to_string();
                            self.dial_failed(r, id, why, Attempt::Unreachable);
                        }
                    }
                    Err(e) => self.dial_failed(r, id, e.to_string(), Attempt::Unreachable),
                }
            }
        }
    }

    fn tick(&mut self) {
        let now = self.now_ms();
        for r in 0..self.res.len() {
            let mut actions = Vec::new();
            self.res[r].engine.tick(now, &mut actions);
            self.run_actions(r, actions, Ctx::default());
        }
        self.dial();
        // Handshakes (NBD or peer) that never finish.
        let now = Instant::now();
        let late: Vec<usize> = self
            .entries
            .iter()
            .filter(|(_, e)| match e {
                Entry::Nbd { conn, .. } => conn.handshake_deadline.is_some_and(|d| d <= now),
                Entry::Peer(pc) => !pc.dead && pc.deadline.is_some_and(|d| d <= now),
                _ => false,
            })
            .map(|(k, _)| k)
            .collect();
        for k in late {
            match self.entries.get_mut(k) {
                Some(Entry::Nbd { conn, .. }) => {
                    warn!(client = %conn.name, "NBD handshake not finished in time; closing");
                    conn.dead = true;
                }
                Some(Entry::Peer(pc)) => {
                    pc.dead = true;
                    let (r, dialed) = (pc.res, pc.dialed);
                    let what = if pc.connecting {
                        "no answer to the connection attempt"
                    } else {
                        "authentication not finished"
                    };
                    debug!(peer = %pc.name, "{what} in time; giving up on this connection");
                    if let Some(d) = dialed {
                        self.dial_failed(r, d, format!("{what} in time"), Attempt::Unreachable);
                    }
                }
                _ => {}
            }
            self.mark_dirty(k);
        }
    }

    // ------------------------------------------------------------------ actions

    fn resolve<'a>(&'a self, r: usize, d: DataRef, ctx: &Ctx<'a>) -> Option<&'a [u8]> {
        match d {
            DataRef::Request(req) => match ctx.payload {
                Some((id, p)) if id == req => Some(p),
                _ => self.held.get(&(r, Token::App(req))).map(|v| v.as_slice()),
            },
            DataRef::Incoming { at } => ctx.incoming.map(|b| &b[at as usize..]),
            DataRef::Disk(t) => self.disk_bufs.get(&(r, t)).map(|b| &b[..]),
            DataRef::Held { key, at } => self.held.get(&(r, key)).map(|v| &v[at as usize..]),
        }
    }

    /// Carries out the engine's actions (and those of inline disk completions). Never
    /// nests: nothing it calls runs actions itself, which is what lets it release the spent
    /// read buffers at the end.
    fn run_actions(&mut self, r: usize, actions: Vec<RAction>, ctx: Ctx<'_>) {
        self.run_action_queue(r, actions, ctx);
        if let Some(ms) = self.res[r].engine.poll_timeout() {
            let at = self.started + Duration::from_millis(ms);
            self.engine_wake = Some(self.engine_wake.map_or(at, |w| w.min(at)));
        }
        if self.res[r].demote_pending {
            self.finish_forced_demote(r);
        }
        for key in std::mem::take(&mut self.spent_reads) {
            if let Some(b) = self.disk_bufs.remove(&key) {
                self.pool.put(b);
            }
        }
    }

    fn run_action_queue(&mut self, r: usize, actions: Vec<RAction>, ctx: Ctx<'_>) {
        let mut queue: std::collections::VecDeque<RAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            match a {
                RAction::Disk {
                    volume,
                    token,
                    kind,
                    data,
                } => {
                    let mut more = Vec::new();
                    self.disk(r, volume, token, kind, data, &ctx, &mut more);
                    queue.extend(more);
                }
                RAction::Send { peer, msg } => self.send(r, peer, msg, &ctx),
                RAction::Complete { req, result, data } => {
                    self.complete(r, req, result, data, &ctx)
                }
                RAction::Retain { from, key } => {
                    let bytes = self
                        .resolve(r, from, &ctx)
                        .map(|b| b.to_vec())
                        .unwrap_or_default();
                    self.held.insert((r, key), bytes);
                }
                RAction::Disconnect { peer, reason } => {
                    let name = self.res[r].peer_name(peer);
                    warn!(resource = %self.res[r].cfg.name, "dropping node {name}: {reason}");
                    if let Some(slot) = self.res[r].peers.iter_mut().find(|p| p.id == peer) {
                        slot.last_error = Some(reason.to_string());
                        // Not a peer that went away: redialling at once would meet the
                        // same conflict, so this counts as a refusal (backs off).
                        slot.link.failed(Attempt::Refused, Instant::now());
                    }
                    if let Some(k) = self.res[r]
                        .peers
                        .iter()
                        .find(|p| p.id == peer)
                        .and_then(|p| p.conn)
                    {
                        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                            pc.dead = true;
                        }
                        self.mark_dirty(k);
                    }
                }
                RAction::SplitBrain {
                    peer,
                    volume,
                    mine,
                    theirs,
                    reported,
                } => self.split_brain(r, peer, volume, mine, theirs, reported),
                RAction::Event(e) if e.is_detail() => {
                    debug!(resource = %self.res[r].cfg.name, "{e}")
                }
                RAction::Event(e) => info!(resource = %self.res[r].cfg.name, "{e}"),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn disk(
        &mut self,
        r: usize,
        volume: u16,
        token: Token,
        kind: DiskKind,
        data: Option<DataRef>,
        ctx: &Ctx<'_>,
        out: &mut Vec<RAction>,
    ) {
        let v = volume as usize;
        // Flushes go to every replica this node keeps; the engine names volume 0.
        let backing = match kind {
            DiskKind::Flush => self.res[r].backings.iter().flatten().next().cloned(),
            _ => self.res[r].backings.get(v).cloned().flatten(),
        };
        let Some(backing) = backing else {
            error!("disk operation on a volume without a local replica");
            return self.res[r]
                .engine
                .disk_done(volume, token, kind, Err(IoError::NoData), out);
        };
        let os = |e: io::Error| IoError::Os(e.raw_os_error().unwrap_or(libc::EIO));
        match kind {
            DiskKind::Read { offset, len } => {
                let mut buf = self.pool.get(len as usize);
                let result = match backing.read_cached(&mut buf, offset) {
                    Ok(true) => Ok(()),
                    // Not in the page cache: a worker waits for the disk, not the loop.
                    Ok(false) => {
                        return self.workers.submit(Job {
                            tag: Tag::Op(r, volume, token),
                            backing,
                            kind,
                            buf: Some(buf),
                            also: Vec::new(),
                        })
                    }
                    Err(e) => Err(os(e)),
                };
                if result.is_ok() {
                    self.disk_bufs.insert((r, token), buf);
                    self.spent_reads.push((r, token));
                } else {
                    self.pool.put(buf);
                }
                self.res[r]
                    .engine
                    .disk_done(volume, token, kind, result, out);
            }
            DiskKind::Write { offset, len } => {
                let bytes = data
                    .and_then(|d| self.resolve(r, d, ctx))
                    .map(|b| &b[..len as usize]);
                let result = match bytes {
                    Some(b) => backing.write_at(b, offset).map_err(os),
                    None => {
                        error!("write without its data ({token:?}); failing it");
                        Err(IoError::Os(libc::EIO))
                    }
                };
                self.release_held(r, token);
                let ahead = self.res[r].syncs.wrote(u64::from(len));
                self.res[r]
                    .engine
                    .disk_done(volume, token, kind, result, out);
                // Started once the ack is on its way, so the sync never delays it.
                self.syncs_ahead.extend(ahead.map(|s| (r, s)));
            }
            DiskKind::Flush => match self.res[r].syncs.flush((volume, token)) {
                FlushPlan::Answer((volume, token), result) => {
                    let result = result.map_err(|()| IoError::Os(libc::EIO));
                    self.res[r]
                        .engine
                        .disk_done(volume, token, kind, result, out);
                }
                FlushPlan::Wait => {}
                FlushPlan::Start(s) => self.sync(r, s, out),
            },
            _ => {
                self.workers.submit(Job {
                    tag: Tag::Op(r, volume, token),
                    backing,
                    kind,
                    buf: None,
                    also: Vec::new(),
                });
            }
        }
    }

    /// Runs a sync of resource `r`: a Secondary's sync over little written data on the
    /// event loop, the rest on a disk worker.
    ///
    /// On the loop the fdatasync costs about one device cache flush; handing it to a
    /// thread costs two wakeups, and on a busy machine the first of them is slow: with
    /// fio `fsync=1` through a diskless Primary on this 2-core VM a sync ahead started
    /// 60–115 µs after the write's ack (perf trace), and moving it onto the loop took the
    /// flush cycle from 10.1k–11.0k to 11.1k–15.0k IOPS on tmpfs, 3.9k–4.2k to 4.1k–4.3k
    /// on the disk. A Secondary's loop serves only its peers, which wait for this sync
    /// anyway. Larger syncs go to a worker so a long writeback never stalls pings.
    fn sync(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        if self.res[r].engine.role() == Role::Secondary && s.bytes <= INLINE_SYNC_MAX {
            self.sync_inline(r, s, out);
        } else {
            self.start_sync(r, s, out);
        }
    }

    /// Starts an fdatasync of every local replica of resource `r` on a disk worker.
    fn start_sync(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        let mut backings = self.res[r].backings.iter().flatten().cloned();
        let Some(backing) = backings.next() else {
            error!("a sync of a resource without local replicas");
            return self.sync_done(r, s.gen, Err(IoError::NoData), out);
        };
        self.workers.submit(Job {
            tag: Tag::Sync { r, gen: s.gen },
            backing,
            kind: DiskKind::Flush,
            buf: None,
            also: backings.collect(),
        });
    }

    /// Syncs every local replica of resource `r` on the event loop.
    fn sync_inline(&mut self, r: usize, s: SyncStart, out: &mut Vec<RAction>) {
        // Every replica is synced even if one fails; the flush fails if any did.
        let mut result = Ok(());
        for b in self.res[r].backings.iter().flatten() {
            if let Err(e) = b.sync_data() {
                result = Err(IoError::Os(e.raw_os_error().unwrap_or(libc::EIO)));
            }
        }
        self.sync_done(r, s.gen, result, out);
    }

    fn start_syncs_ahead(&mut self) {
        for (r, s) in std::mem::take(&mut self.syncs_ahead) {
            let mut actions = Vec::new();
            self.sync(r, s, &mut actions);
            self.run_actions(r, actions, Ctx::default());
        }
    }

    /// A sync of resource `r` covering its writes up to `gen` finished.
    fn sync_done(
        &mut self,
        r: usize,
        gen: u64,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        if let Err(e) = result {
            error!(resource = %self.res[r].cfg.name, "fdatasync failed: {e:?}");
        }
        let (answer, next) = self.res[r].syncs.sync_done(gen, result.is_ok());
        if let Some(((volume, token), ok)) = answer {
            let result = ok.map_err(|()| result.err().unwrap_or(IoError::Os(libc::EIO)));
            self.res[r]
                .engine
                .disk_done(volume, token, DiskKind::Flush, result, out);
        }
        // Same rule as any sync. Never recurses more than once: nothing is written while
        // a sync runs on the loop, so the one after it covers every write.
        if let Some(s) = next {
            self.sync(r, s, out);
        }
    }

    /// Held bytes for replicated and resync writes live until their disk write is done.
    fn release_held(&mut self, r: usize, token: Token) {
        if matches!(token, Token::PeerWrite { .. } | Token::ResyncWrite { .. }) {
            self.held.remove(&(r, token));
        }
    }

    fn worker_completions(&mut self) {
        while let Ok(Done {
            tag,
            kind,
            result,
            buf,
        }) = self.workers.done.try_recv()
        {
            let mut actions = Vec::new();
            let r = match tag {
                Tag::Sync { r, gen } => {
                    self.sync_done(r, gen, result, &mut actions);
                    r
                }
                Tag::Op(r, volume, token) => {
                    match (buf, kind, &result) {
                        (Some(b), DiskKind::Read { .. }, Ok(())) => {
                            self.disk_bufs.insert((r, token), b);
                            self.spent_reads.push((r, token));
                        }
                        (Some(b), _, _) => self.pool.put(b),
                        (None, _, _) => {}
                    }
                    // Zeroing and trims change the replica: metadata work of unknown size.
                    let ahead = matches!(kind, DiskKind::Zero { .. } | DiskKind::Trim { .. })
                        .then(|| self.res[r].syncs.wrote(u64::MAX))
                        .flatten();
                    self.res[r]
                        .engine
                        .disk_done(volume, token, kind, result, &mut actions);
                    self.syncs_ahead.extend(ahead.map(|s| (r, s)));
                    r
                }
            };
            self.run_actions(r, actions, Ctx::default());
        }
    }

    fn send(&mut self, r: usize, peer: NodeId, msg: Msg, ctx: &Ctx<'_>) {
        let Some(k) = self.res[r]
            .peers
            .iter()
            .find(|p| p.id == peer)
            .and_then(|p| p.conn)
        else {
            return;
        };
        let mut out = match self.entries.get_mut(k) {
            Some(Entry::Peer(pc)) if !pc.dead => std::mem::take(&mut pc.out),
            _ => return,
        };
        let data = |d: Option<DataRef>, len: u32| -> &[u8] {
            d.and_then(|d| self.resolve(r, d, ctx))
                .map(|b| &b[..len as usize])
                .unwrap_or(&[])
        };
        let packet = msg.to_packet(data);
        tandem_wire::encode(&packet, &mut out);
        if let Msg::ReadReply {
            data: Some(DataRef::Disk(t)),
            ..
        }
        | Msg::ResyncReply {
            data: Some(DataRef::Disk(t)),
            ..
        } = msg
        {
            if let Some(b) = self.disk_bufs.remove(&(r, t)) {
                self.pool.put(b);
            }
        }
        if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
            pc.out = out;
            let max = self.res[r].cfg.net.max_buffer;
            if pc.queued() as u64 > max && !self.res[r].congested {
                info!(resource = %self.res[r].cfg.name, peer = %pc.name,
                    "{} bytes queued for this peer (max-buffer {max}): new requests wait", pc.queued());
                self.res[r].congested = true;
            }
        }
        self.mark_dirty(k);
    }

    /// Lifts the back-pressure once every peer queue of `r` is under half of max-buffer
    /// (or gone).
    fn relieve_congestion(&mut self, r: usize) {
        if !self.res[r].congested {
            return;
        }
        let low = self.res[r].cfg.net.max_buffer / 2;
        let still = self.res[r].peers.iter().filter_map(|p| p.conn).any(|k| {
            matches!(self.entries.get(k), Some(Entry::Peer(pc)) if !pc.dead && pc.queued() as u64 > low)
        });
        if !still {
            debug!(resource = %self.res[r].cfg.name, "peer queues drained: reading requests again");
            self.res[r].congested = false;
            let stalled = std::mem::take(&mut self.res[r].stalled);
            self.resume.extend(stalled);
        }
    }

    fn complete(
        &mut self,
        r: usize,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        ctx: &Ctx<'_>,
    ) {
        let slot = self.slots.remove(req.0 as usize);
        self.held.remove(&(r, Token::App(req)));
        // The read's bytes, taken out of the reactor's maps (or borrowed from the packet
        // being handled) so they are copied once, straight into the reply.
        let disk_buf = match data {
            Some(DataRef::Disk(t)) => self.disk_bufs.remove(&(r, t)),
            _ => None,
        };
        let bytes: Option<&[u8]> = match data {
            Some(DataRef::Disk(_)) => disk_buf.as_deref(),
            Some(DataRef::Incoming { at }) => ctx.incoming.map(|b| &b[at as usize..]),
            Some(DataRef::Held { key, at }) => self.held.get(&(r, key)).map(|v| &v[at as usize..]),
            Some(DataRef::Request(_)) | None => None,
        };
        let bytes = match (result, slot.read) {
            (Ok(()), Some((_, len))) => bytes.map(|b| &b[..len as usize]),
            _ => None,
        };
        let Some(Entry::Nbd { conn, .. }) = self.entries.get_mut(slot.entry) else {
            if let Some(b) = disk_buf {
                self.pool.put(b);
            }
            return;
        };
        if conn.in_flight == crate::conn::MAX_IN_FLIGHT {
            // It stopped taking requests at the limit: take them again after this round.
            self.resume.push(slot.entry);
        }
        conn.in_flight -= 1;
        match (result, slot.read, bytes) {
            // Whatever became of it, a fenced client hears that the volume was taken away.
            _ if conn.fenced => {
                reply::error(
                    &mut conn.out,
                    slot.structured,
                    slot.cookie,
                    Errno::Io,
                    FENCED,
                );
            }
            (Ok(()), Some((offset, len)), Some(b)) => {
                if slot.structured {
                    reply::read_data_chunk(&mut conn.out, slot.cookie, offset, len);
                } else {
                    reply::simple(&mut conn.out, slot.cookie, 0);
                }
                conn.out.extend_from_slice(b);
            }
            (Ok(()), None, _) => reply::simple(&mut conn.out, slot.cookie, 0),
            (Ok(()), Some(_), None) => {
                error!(client = %conn.name, "read completed without data; answering EIO");
                reply::error(
                    &mut conn.out,
                    slot.structured,
                    slot.cookie,
                    Errno::Io,
                    "internal error: read data missing",
                );
            }
            (Err(e), _, _) => {
                let (errno, msg) = match e {
                    IoError::ReadOnly => (Errno::Perm, "this node is not Primary".to_string()),
                    IoError::NoData => {
                        (Errno::Io, "no up-to-date replica is reachable".to_string())
                    }
                    IoError::NotFast => (
                        Errno::NotSup,
                        "zeroing would not be fast on every replica".to_string(),
                    ),
                    IoError::Os(code) => (
                        Errno::from_os(code),
                        format!("I/O error: {}", io::Error::from_raw_os_error(code)),
                    ),
                };
                debug!(client = %conn.name, cookie = slot.cookie, "request failed: {msg}");
                reply::error(&mut conn.out, slot.structured, slot.cookie, errno, &msg);
            }
        }
        if let Some(b) = disk_buf {
            self.pool.put(b);
        }
        let entry = slot.entry;
        self.mark_dirty(entry);
    }

    // ------------------------------------------------------------------ output

    fn flush_dirty(&mut self) {
        while !self.dirty.is_empty() {
            let dirty = std::mem::take(&mut self.dirty);
            for k in dirty {
                self.flush_entry(k);
            }
        }
    }

    fn flush_entry(&mut self, k: usize) {
        let mut remove = false;
        let mut resume = false;
        match self.entries.get_mut(k) {
            Some(Entry::Nbd { conn, .. }) => {
                conn.dirty = false;
                if !conn.dead && conn.out_pending() {
                    let was_full = !conn.has_room();
                    if let Err(e) = conn.flush_out() {
                        debug!(client = %conn.name, "client went away: {e}");
                        conn.dead = true;
                    } else if was_full && conn.has_room() {
                        resume = true;
                    }
                }
                let stuck = !conn.dead && conn.out_pending();
                if stuck != conn.write_interest {
                    let i = if stuck {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    let _ = self
                        .poll
                        .registry()
                        .reregister(conn.stream.source(), MioToken(k), i);
                    conn.write_interest = stuck;
                }
                remove = conn.finished();
            }
            Some(Entry::Peer(pc)) => {
                pc.dirty = false;
                if !pc.connecting && pc.out_pending() {
                    // A connection being dropped still gets one try to send what is queued
                    // (the Error or state packet that tells the peer why).
                    if let Err(e) = pc.flush_out() {
                        if !pc.dead && pc.peer.is_some() {
                            info!(peer = %pc.name, "connection failed while sending: {e}");
                        } else if !pc.dead {
                            debug!(peer = %pc.name, "connection failed while sending: {e}");
                            pc.failure = Some(e.to_string());
                        }
                        pc.dead = true;
                    }
                }
                let want_write = pc.connecting || pc.out_pending();
                if !pc.dead && want_write != pc.write_interest {
                    let i = if want_write {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    let _ = self
                        .poll
                        .registry()
                        .reregister(pc.stream.source(), MioToken(k), i);
                    pc.write_interest = want_write;
                }
                remove = pc.dead;
                let r = pc.res;
                self.relieve_congestion(r);
            }
            Some(Entry::Control(c)) => {
                c.dirty = false;
                remove = c.flush_and_finished();
            }
            _ => {}
        }
        if resume {
            self.service_nbd(k);
        }
        if remove {
            self.remove_entry(k);
        }
    }

    fn remove_entry(&mut self, k: usize) {
        let Some(e) = self.entries.try_remove(k) else {
            return;
        };
        match e {
            Entry::Nbd { res, mut conn, .. } => {
                let _ = self.poll.registry().deregister(conn.stream.source());
                conn.stream.shutdown();
                if matches!(conn.phase, Phase::Transmission { .. }) {
                    info!(client = %conn.name, "NBD client detached");
                    self.client_detached(res);
                }
            }
            Entry::Peer(mut pc) => {
                let _ = self.poll.registry().deregister(pc.stream.source());
                pc.stream.shutdown();
                self.peer_closed(k, &pc);
            }
            Entry::Control(mut c) => {
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
            _ => {}
        }
    }

    fn service_control(&mut self, k: usize) {
        let Some(Entry::Control(c)) = self.entries.get_mut(k) else {
            return;
        };
        let lines = c.read_lines();
        for line in lines {
            let response = self.control_command(&line);
            if let Some(Entry::Control(c)) = self.entries.get_mut(k) {
                c.queue(response);
            }
        }
        self.mark_dirty(k);
    }
}
