//! The node daemon's state: one event loop's registry of connections (`Entry`), the
//! resources it runs (`ResCtx`: engine, backing files, exports, peers), and the limits it
//! works to.

use super::links::Link;
use super::peer::PeerConn;
use crate::bufpool::{BufPool, DataBuf};
use crate::conn::Conn;
use crate::listener::Listener;
use crate::rmw::Ticket;
use crate::worker::Workers;
use mio::{Poll, Token as MioToken};
use rustc_hash::FxHashMap as HashMap;
use slab::Slab;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_config::ResourceConfig;
use tandem_engine::driver::DataStore;
use tandem_engine::replica::{NodeId, PromoteError, Resource, Token};
use tandem_engine::sync_plan::{FlushPattern, SyncPlan, SyncStart};
use tandem_frontend::nbd::ExportInfo;
use tandem_storage::Backing;

pub(super) const WAKER: MioToken = MioToken(usize::MAX - 1);
pub(super) const SIGNAL: MioToken = MioToken(usize::MAX - 2);
pub(super) const RELOAD: MioToken = MioToken(usize::MAX - 3);
pub(super) const TICK: Duration = Duration::from_millis(100);
/// The most written data a Secondary flushes on its event loop (see `disk`).
pub(super) const INLINE_SYNC_MAX: u64 = 256 << 10;
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a client fenced by `tandem secondary --force` is told for each request.
pub(super) const FENCED: &str = "the administrator made this node Secondary (--force): the volume is no longer served to this client";
/// How many times the usual busy-poll window a node polls while its resources see a
/// flush after every few writes. Between a write and the next one there are then two
/// round trips (the write's, then the FLUSH's with an fdatasync in the middle): with the
/// usual window every node went to sleep in between and paid a wakeup per hop. Measured
/// on this 2-core VM with fio `fsync=1` through the diskless Primary, ×1/×4/×8:
/// 2,160–2,410 / 2,880–2,990 / 3,050–3,130 IOPS.
pub(super) const FLUSH_HEAVY_POLL: u32 = 8;

/// One peer of a resource as the daemon sees it.
pub(super) struct PeerSlot {
    pub(super) id: NodeId,
    pub(super) name: String,
    pub(super) address: std::net::SocketAddr,
    /// The entry of its live connection, once authenticated.
    pub(super) conn: Option<usize>,
    /// An outgoing attempt in progress.
    pub(super) dialing: Option<usize>,
    pub(super) link: Link,
    /// `tandem disconnect` keeps it StandAlone until `tandem connect`.
    pub(super) wanted: bool,
    /// Why the last connection ended, for status.
    pub(super) last_error: Option<String>,
    /// While `last_error` is met again at every attempt: when to sum it up in the log.
    pub(super) failing: Option<super::repeats::Repeats>,
    /// Our replicas diverged (two Primaries while apart): not reconnected (`wanted` is
    /// off) until `tandem connect`; what happened, for status.
    pub(super) split_brain: Option<String>,
    /// The last split brain with it that was resolved (policy, victim, blocks), for status.
    pub(super) split_brain_resolved: Option<String>,
    /// Its counters for the metrics (`metrics_http.rs`).
    pub(super) stats: super::metrics_http::PeerStats,
}

pub(super) struct ResCtx {
    pub(super) cfg: ResourceConfig,
    pub(super) me: NodeId,
    /// Our replication address: outgoing peer connections come from its IP.
    pub(super) my_address: std::net::SocketAddr,
    pub(super) engine: Resource,
    /// Payloads the engine kept and finished reads it names (the driver core's store).
    pub(super) data: DataStore<DataBuf>,
    pub(super) backings: Vec<Option<Arc<Backing>>>,
    /// Each replica's metadata (`None` where the node keeps no replica).
    pub(super) metas: Vec<Option<super::metadata::VolumeMeta>>,
    pub(super) exports: Vec<ExportInfo>,
    pub(super) peers: Vec<PeerSlot>,
    /// `tandem secondary --force` with requests in flight: the clients are fenced, and the
    /// engine is demoted once those requests are answered.
    pub(super) demote_pending: bool,
    /// A peer's send queue passed `max-buffer`: NBD clients of this resource are not read
    /// until every queue is back under half of it (memory stays bounded behind a slow
    /// peer; applications wait instead).
    pub(super) congested: bool,
    /// NBD client entries that stopped reading because of it.
    pub(super) stalled: Vec<usize>,
    /// Which fdatasync covers which local writes; the engine's flush waiting for one.
    pub(super) syncs: SyncPlan<(u16, Token)>,
    /// Whether this resource's NBD clients flush after every few writes.
    pub(super) nbd_flushes: FlushPattern,
    /// Application writes holding activity-log extents until they are answered.
    pub(super) al_app: std::collections::HashMap<tandem_engine::ReqId, super::activity::AppHold>,
    /// Then until settled: per (request id, volume), answered writes in answer order, and
    /// the extents each holds (none if it failed before it was issued).
    pub(super) al_answered: super::activity::AnsweredHolds,
    /// Peers' writes written here and held in the activity log (volume, first, last)
    /// until the engine says they are settled, by (peer, connection, sequence number).
    pub(super) al_peer: std::collections::BTreeMap<(NodeId, u32, u64), (u16, u32, u32)>,
    /// Per (peer, connection): how far its writes are settled, and how many are on their
    /// way to the disk (dropped once its connection is over and none is).
    pub(super) al_settled: std::collections::HashMap<(NodeId, u32), super::activity::PeerMark>,
    /// Writes waiting for an activity-log transaction.
    pub(super) al_waiting: Vec<super::activity::AlWaiting>,
    /// The data sync in flight (its generation) and the activity logs' marks taken at
    /// its start: once it succeeds, the extents no write ended in since are clean.
    pub(super) al_sync: Option<(u64, Vec<(u16, super::metadata::DataSyncMark)>)>,
    /// A metadata write of this resource failed (see `MetaFailed`).
    pub(super) meta_failed: MetaFailed,
    /// Whether it still runs here (`tandem adjust` stops a resource removed from the
    /// files; its slot stays, so that other resources' indices hold).
    pub(super) presence: Presence,
    /// Its counters for the metrics (`metrics_http.rs`).
    pub(super) stats: super::metrics_http::ResStats,
    /// Per volume: its NBD writes ordered around read-modify-writes (`crate::rmw`).
    pub(super) gates: Vec<crate::rmw::Gate>,
    /// TLS for its NBD clients (`nbd-tls`), loaded at start.
    pub(super) nbd_tls: Option<crate::tls::NbdTls>,
    /// TLS on its peer links (`tls`), loaded at start.
    pub(super) peer_tls: Option<crate::tls::PeerTls>,
}

/// A resource's life on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
    Serving,
    /// Removed from the files: its peers are let go (told it leaves cleanly), then its
    /// metadata is marked stopped cleanly (`reload.rs`).
    Leaving,
    /// Stopped: nothing of it is open any more; status and events no longer show it.
    Gone,
}

/// Whether the metadata could not be written. Its flags then may say "consistent" of a
/// replica that no longer is (a crash would trust its activity log), so no write reaches
/// the replica after the failure: each fails, which detaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MetaFailed {
    No,
    /// Failed; the engine is yet to be told (at the end of the actions being run).
    Untold,
    Told,
}

impl ResCtx {
    /// Flushes come after every few small writes, here or at the Primary: the next
    /// request is due a whole round trip after a barrier (see `FLUSH_HEAVY_POLL`).
    pub(super) fn flush_heavy(&self) -> bool {
        self.syncs.flush_heavy() || self.nbd_flushes.flush_heavy()
    }
}

impl ResCtx {
    /// "beta (node-id 1)" for logs.
    pub(super) fn peer_name(&self, id: NodeId) -> String {
        match self.peers.iter().find(|p| p.id == id) {
            Some(p) => format!("{} (node-id {id})", p.name),
            None => format!("node-id {id}"),
        }
    }

    /// A promotion refusal in the administrator's terms (node names, not ids).
    pub(super) fn explain(&self, e: PromoteError) -> String {
        match e {
            PromoteError::PeerPrimary(id) => format!("node {} is Primary", self.peer_name(id)),
            PromoteError::NoUpToDate(_) => e.to_string(),
            PromoteError::PeerUnheard(peer) => format!(
                "{} just connected and has not yet said which Primary it follows; try again",
                self.peer_name(peer)
            ),
            PromoteError::PeerListing { volume, peer } => format!(
                "{} has not yet listed what volume {volume} lacks here; try again",
                self.peer_name(peer)
            ),
            PromoteError::PrimaryBeyond { primary, via } => format!(
                "node {} is Primary: {} follows it, and this node does not reach it (a partition?)",
                self.peer_name(primary),
                self.peer_name(via)
            ),
            PromoteError::NoQuorum(v) => {
                let status = self.engine.status();
                match status.volumes.get(usize::from(v)).and_then(|s| s.quorum) {
                    Some(q) => format!(
                        "volume {v} has no quorum: this node reaches {} of its {} replicas, {} needed ({} up to date)",
                        q.count.votes(),
                        q.count.voters,
                        q.count.needed,
                        q.count.up_to_date
                    ),
                    None => e.to_string(),
                }
            }
        }
    }
}

pub(super) enum Entry {
    NbdListener {
        l: Listener,
    },
    Nbd {
        res: usize,
        vol: usize,
        conn: Box<Conn>,
    },
    /// A node's replication address: one resource's, or several resources' that share it
    /// (the caller's `Hello` names the resource, `routing.rs`).
    PeerListener {
        res: Vec<usize>,
        l: mio::net::TcpListener,
    },
    /// A caller on a shared address whose `Hello` has not come yet.
    PeerRouting(Box<super::routing::Routing>),
    Peer(Box<PeerConn>),
    ControlListener(mio::net::UnixListener, PathBuf),
    Control(Box<super::control_conn::ControlConn>),
    /// The metrics endpoint (`metrics_http.rs`) and its HTTP connections.
    MetricsListener(mio::net::TcpListener),
    Http(Box<super::metrics_http::HttpConn>),
}

/// An in-flight NBD request, or an aligned part of one (`part`).
pub(super) struct Slot {
    pub(super) entry: usize,
    pub(super) cookie: u64,
    pub(super) structured: bool,
    pub(super) answer: Answer,
    /// When it arrived, and what it is, for the latency histograms.
    pub(super) arrived: Instant,
    pub(super) op: Option<crate::metrics::Op>,
    pub(super) vol: u16,
    /// A write's place in its volume's gate, left when it completes.
    pub(super) ticket: Option<Ticket>,
    /// A part (this engine request) of an unaligned request's job: (job, request). Its
    /// completion goes to the job, which answers the client once every part has ended.
    pub(super) part: Option<(usize, tandem_engine::Io)>,
}

/// An unaligned NBD request served in aligned parts (`crate::rmw::Job`), answered as
/// slot `slot` once they have all ended.
pub(super) struct NodeJob {
    pub(super) job: crate::rmw::Job,
    pub(super) r: usize,
    pub(super) v: u16,
    pub(super) slot: usize,
    pub(super) ticket: Option<Ticket>,
}

/// A write a volume's gate holds back.
pub(super) enum Held {
    /// The request in slot `id`, to submit as `io` with its payload.
    Plain {
        id: usize,
        io: tandem_engine::Io,
        payload: Option<Vec<u8>>,
    },
    /// A job, to start with its reads.
    Job(usize),
}

/// Engine submissions an engine action decided (a gate let a write go, a job's reads
/// ended), which never nest inside the actions being run: issued right after them.
pub(super) enum Deferred {
    Plain {
        r: usize,
        v: u16,
        id: usize,
        io: tandem_engine::Io,
        payload: Option<Vec<u8>>,
    },
    JobReads(usize),
    JobWrites(usize),
}

/// What a request's reply carries besides its result.
#[derive(Clone, Copy, Debug)]
pub(super) enum Answer {
    /// Nothing (a write, a flush, ...).
    Done,
    /// The `len` bytes read at `offset`.
    Read { offset: u64, len: u32 },
    /// Block status descriptors, from the map an up-to-date peer sent (`req` is the
    /// block status request; `min_block` the export's minimum block size).
    BlockStatus {
        req: tandem_frontend::nbd::Request,
        min_block: u32,
    },
}

/// Bytes the engine may name while its actions run: those of the event being handled.
pub(super) type Ctx<'a> = tandem_engine::driver::Inputs<'a>;

/// Why a sync is started before anyone asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ahead {
    /// The workload flushes often: the next flush will find it under way.
    OfFlush,
    /// The activity log runs short of clean extents to evict.
    OfActivityLog,
}

/// What a disk worker's job was for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Tag {
    /// An operation the engine asked for: (resource, volume, token).
    Op(usize, u16, Token),
    /// An fdatasync of every local replica of a resource, covering its writes up to `gen`
    /// (see [`tandem_engine::sync_plan`]).
    Sync { r: usize, gen: u64 },
}

/// A resource left down at start because a replica of it could not be attached (its
/// metadata corrupted, its backing file unusable): `tandem status` says why.
pub(super) struct NotAttached {
    pub(super) name: String,
    pub(super) node_id: NodeId,
    pub(super) why: String,
}

pub(super) struct NodeReactor {
    pub(super) poll: Poll,
    pub(super) entries: Slab<Entry>,
    /// Which entry is the NBD listener for (resource, volume).
    pub(super) nbd_listener_of: HashMap<usize, (usize, usize)>,
    /// The peer listener (its entry) bound on each replication address.
    pub(super) peer_listener_at: HashMap<std::net::SocketAddr, usize>,
    pub(super) res: Vec<ResCtx>,
    /// Resources of this node whose replicas could not be attached at start.
    pub(super) not_attached: Vec<NotAttached>,
    pub(super) slots: Slab<Slot>,
    pub(super) workers: Workers<Tag>,
    pub(super) pool: BufPool,
    /// Reads whose completion went to the engine: the engine uses their buffers only in
    /// the actions of that completion, so whatever is left once those ran goes back to
    /// the pool (an answer to a connection that dropped meanwhile is never sent).
    pub(super) spent_reads: Vec<(usize, Token)>,
    pub(super) dirty: Vec<usize>,
    /// NBD clients to read from again once the current round of work is done.
    pub(super) resume: Vec<usize>,
    pub(super) signal_rx: mio::net::UnixStream,
    /// SIGHUP: the configuration is read again (`reload.rs`).
    pub(super) reload_rx: mio::net::UnixStream,
    /// Where the resources came from, and this node's name in them.
    pub(super) config_dir: std::path::PathBuf,
    pub(super) node_name: String,
    pub(super) shutting_down: bool,
    /// The engines told their peers of a clean stop (`Resource::leave`).
    pub(super) left_peers: bool,
    pub(super) started: Instant,
    /// Housekeeping (dialing, handshake deadlines) and the engines' timers run then...
    pub(super) next_tick: Instant,
    /// ...or earlier, when an engine asked for it (`Resource::poll_timeout`: a resync
    /// retry after 20 ms should not wait for the next 100 ms tick).
    pub(super) engine_wake: Option<Instant>,
    pub(super) next_conn_id: u64,
    pub(super) busy_poll: Duration,
    /// Syncs ahead of a flush (see [`tandem_engine::sync_plan`]), started after this round's sends.
    pub(super) syncs_ahead: Vec<(usize, SyncStart, Ahead)>,
    /// NBD requests and peer packets handled since the last wait (see `busy_poll::BURST`).
    pub(super) handled: usize,
    /// Writes an activity-log transaction released (or failed), issued after this round
    /// in the order they arrived.
    pub(super) al_ready: std::collections::VecDeque<(usize, super::activity::AlWaiting)>,
    /// Volumes (resource, volume) with writes waiting for a transaction not yet written:
    /// written after this round's sends, one transaction for all the writes that missed.
    pub(super) al_commits: Vec<(usize, u16)>,
    /// Off only for benchmarks (`NodeOptions::activity_log`).
    pub(super) activity_log: bool,
    /// Every resync here, sampled once a second for `tandem status`: (resource, volume,
    /// `None` for ours as a target or the peer we sync).
    pub(super) resyncs: super::progress::Resyncs<(usize, u16, Option<NodeId>)>,
    pub(super) resyncs_sampled_ms: u64,
    /// When each (resource, volume) replica here last turned Inconsistent: its resync's
    /// duration and rate are logged when it ends.
    pub(super) sync_began: HashMap<(usize, u16), Instant>,
    /// Control connections that watch the events stream (`watchers.rs`).
    pub(super) watchers: Vec<usize>,
    /// Resources that may have changed since the last diff, and the lines last sent per
    /// resource name.
    pub(super) events_touched: Vec<usize>,
    pub(super) events_sent: HashMap<String, crate::events::Sent>,
    /// Where the tick's sweep of resources goes on (`watchers::SWEEP`).
    pub(super) events_sweep: usize,
    /// What peers said of their resyncs, by (resource, peer, volume) (`sync_reports.rs`).
    pub(super) peer_syncs: HashMap<(usize, NodeId, u16), super::sync_reports::PeerSync>,
    /// Our resyncs told to the peers at the last report, by (resource, volume).
    pub(super) progress_told: Vec<(usize, u16)>,
    /// HTTP connections with work to go on with at the next round: metrics being built, a
    /// few resources a round, or an answer being written, a share a round
    /// (`metrics_http.rs`).
    pub(super) scrapes: Vec<usize>,
    /// How long the last scrape took to build (the loop's share), and how large each of
    /// its families was (the next one makes room for as much).
    pub(super) last_scrape_build: Duration,
    pub(super) scrape_sizes: Vec<usize>,
    /// Unaligned NBD requests being served in parts (`crate::rmw`).
    pub(super) jobs: Slab<NodeJob>,
    /// Writes their volume's gate holds back, by (resource, volume, ticket).
    pub(super) held: HashMap<(usize, u16, Ticket), Held>,
    pub(super) deferred: std::collections::VecDeque<Deferred>,
}
