//! A deterministic simulator for the replicated engine.
//!
//! Several [`Resource`] engines run in one process over a simulated network (per-connection
//! FIFO links with random delay, cut and healed at random) and simulated disks (`disk.rs`:
//! per volume what the page cache holds and, per sector, what the last fdatasync made
//! durable; operations complete after random delays, in any order). A resource has one to
//! three volumes of different sizes; a seeded workload of overlapping writes, zeroing,
//! reads and flushes runs on the Primary, each request on a volume of its own. Packets
//! really go through the wire codec.
//!
//! Checked while running (`check.rs`), per volume: every read returns, per sector, the
//! latest write completed before the read began or a write in flight meanwhile; no request
//! fails while an up-to-date replica is reachable; a completed FLUSH has made every volume
//! durable (per sector, some replica's last fdatasync covered that latest write or a newer
//! one) and a completed FUA write is durable somewhere; the engines' own invariants
//! (`Resource::check_invariants`) hold after every step; a replica an engine detached gets
//! no more reads or writes (`disk_errors.rs`). Checked at the end, after healing every link
//! and letting resync finish: every live replica of every volume is up to date and
//! byte-identical to the model (so nothing acknowledged was lost); every replica given an
//! EIO is detached, and the Primary knows it lacks what was written after. The same seed
//! always gives the same run. Fault families ([`Family`], `faults.rs`): single failures,
//! overlapping ones, a disk failing with EIO (for good, or one write or fdatasync), power
//! losses (unsynced writes kept, lost or torn per 4 KiB block), crashes of every node at
//! once or of the Primary alone (`crash.rs`), and failover (`failover.rs`: partitions of
//! every shape, kills of the Primary, a cluster manager promoting another node, checked
//! against one history across Primaries in `history.rs`); see `docs/ARCHITECTURE.md` for
//! what each must keep. [`Scenario::pending_checks`] adds the checks of engine gaps not
//! closed yet.

mod batch;
mod check;
mod crash;
mod disk;
mod disk_errors;
mod driver;
mod failover;
mod faults;
mod history;
mod rng;
mod stall;

pub use batch::{
    digest_family, digest_seeds, run_family, run_family_keep_going, run_family_with, run_seeds,
    run_seeds_with, Batch, Coverage, Extra,
};
pub use crash::Crash;
pub use faults::{Family, Knobs};

use check::{ReadRec, WriteRec};
use disk::{stamp_of, Covers, Disk, SECTOR};
use rng::Rng;
use std::collections::{BTreeMap, BinaryHeap};
use tandem_engine::driver::{DataStore, Inputs};
use tandem_engine::replica::{
    DataRef, DiskState, Msg, NodeId, PromoteError, Protocol, RAction, ReplicaAtStart, Resource,
    ResourceSpec, Role, Token,
};
use tandem_engine::sync_plan::{SyncPlan, SyncStart};
use tandem_engine::{DiskKind, Io, IoError, ReqId};
use tandem_wire::packet::{AllocExtent, Decoded, Packet, ALLOC_EXTENT_LEN};

/// What a run looks like.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub protocol: Protocol,
    /// Node 0 is the first Primary (the only one but with [`Scenario::failover`]);
    /// `diskful[i]` says whether node i keeps replicas.
    pub diskful: Vec<bool>,
    /// The volumes' sizes (multiples of 4 KiB, at least 16 KiB); volume numbers 0, 1, ...
    pub sizes: Vec<u64>,
    /// Volumes a diskful node keeps no replica of (`disk = "none"` for that volume only):
    /// `(node, volume)`. Every volume keeps replicas on at least two nodes.
    pub no_replica: Vec<(NodeId, u16)>,
    pub ops: usize,
    pub max_in_flight: usize,
    /// Cut and heal links at random.
    pub faults: bool,
    /// Restart (kill -9) secondaries at random: they come back Outdated and resync.
    pub restarts: bool,
    /// Inject a fault while an earlier one is still healing. Off: one failure at a time.
    /// (Overlapping failures of different diskful nodes under a diskless Primary need the
    /// peer acknowledgements and data generation tags of the metadata work; see the notes.)
    pub overlapping_faults: bool,
    /// Every replica starts created empty (a new cluster): none is UpToDate until all
    /// diskful nodes have met.
    pub fresh_start: bool,
    /// A restart may lose the node's whole disk (a replaced disk, a deleted backing file):
    /// it comes back created empty and must be synced in full before it counts. Only with
    /// one failure at a time (a lost disk while the only other replica lags loses data no
    /// engine can bring back).
    pub lose_disks: bool,
    /// The disk of one node fails at some point (see [`Family::DiskErrors`]).
    pub disk_errors: bool,
    /// That failure is one write or one fdatasync answered with EIO, the disk working
    /// again after (the engine detaches the replica all the same, and its other operations
    /// in flight land); otherwise the disk dies for good.
    pub one_off_eio: bool,
    /// Restarts may be power losses (see [`Family::PowerLoss`]).
    pub power_loss: bool,
    /// Half the restarts that are no power loss and keep the disk are clean stops: the
    /// node drops its links, its engine hands over what it keeps (`Resource::persisted`,
    /// as the daemon writes it to the metadata) and the new engine starts from it
    /// (`ReplicaAtStart::Consistent`, `restore_peer`), as `tandem node` does after
    /// SIGTERM. Drawn from a stream of its own; not in the power-loss family.
    pub clean_stops: bool,
    /// Also check what the engine does not do yet (gaps a family found, listed in
    /// `docs/ARCHITECTURE.md` with their first failing seed), kept out of the test command
    /// until closed (`tandem-sim --pending-checks` runs them). None is pending now: the
    /// last (a Secondary that lost power lacked writes it had acknowledged and the Primary
    /// did not mark, power-loss seed 299) is closed by the activity log: such a node starts
    /// [`ReplicaAtStart::Crashed`](tandem_engine::replica::ReplicaAtStart::Crashed) and
    /// pulls what its log names; and a Primary's log that let a write go once answered,
    /// before every peer had it, is closed by peer acks. The disk-errors gaps (seeds 683,
    /// 90004521, 94003653, 94017354, 94000749, 94021068) are closed too and always checked.
    pub pending_checks: bool,
    pub knobs: Knobs,
    /// A crash in the middle of the workload: of every node at once, or of the Primary
    /// alone (see [`Family::ClusterCrash`]).
    pub crash: Option<Crash>,
    /// Faults may be stalls of a Secondary (SIGSTOP, then SIGCONT; see `stall.rs`). Off
    /// in every family (`tandem-sim --stalls` turns it on), which keeps their schedules.
    pub stalls: bool,
    /// Any node may become Primary: partitions of every shape, kills of the Primary, and
    /// a cluster manager that fails over to another node (see [`Family::Failover`] and
    /// `failover.rs`). Off in every other family: node 0 stays the only Primary there.
    pub failover: bool,
    /// With `failover`: half the clients that auto-promote a node are probes that leave at
    /// once (see `failover.rs`). Off unless asked (`tandem-sim --failover --probes`), which
    /// keeps the failover family's schedules.
    pub probes: bool,
}

impl Scenario {
    /// A scenario drawn from the seed: 2–3 nodes, diskful or diskless primary, any protocol,
    /// one volume (half the seeds: these runs are exactly those of the single-volume
    /// simulator) or two or three of different sizes, sometimes with a node that keeps a
    /// replica of only some of them.
    pub fn random(seed: u64) -> Scenario {
        let mut r = Rng::new(seed ^ 0x5eed);
        let protocol = [Protocol::A, Protocol::B, Protocol::C][r.below(3) as usize];
        let nodes = 2 + r.below(2) as usize;
        let mut diskful = vec![true; nodes];
        if nodes == 3 && r.chance(0.5) {
            diskful[0] = false; // a diskless client as Primary
        }
        let mut sc = Scenario {
            seed,
            protocol,
            diskful,
            sizes: vec![256 << 10],
            no_replica: Vec::new(),
            ops: 200,
            max_in_flight: 1 + r.below(12) as usize,
            faults: r.chance(0.7),
            restarts: r.chance(0.3),
            overlapping_faults: false,
            fresh_start: false,
            lose_disks: false,
            disk_errors: false,
            one_off_eio: false,
            power_loss: false,
            clean_stops: false,
            pending_checks: false,
            knobs: Knobs::default(),
            crash: None,
            stalls: false,
            failover: false,
            probes: false,
        };
        // Drawn after everything else, so single-volume seeds keep their old schedules.
        let volumes = match r.below(10) {
            0..=4 => 1,
            5..=7 => 2,
            _ => 3,
        };
        for _ in 1..volumes {
            // 100 KiB is no multiple of the resync chunk: a short last chunk.
            sc.sizes
                .push([128 << 10, 256 << 10, 100 << 10][r.below(3) as usize]);
        }
        // With three diskful nodes, one of them may keep only some volumes (each volume
        // still has two replicas, so one failure at a time never leaves it without one).
        if volumes > 1 && nodes == 3 && sc.diskful[0] && r.chance(0.3) {
            sc.no_replica
                .push((r.below(3) as NodeId, r.below(volumes) as u16));
        }
        // Drawn last, so older seeds keep their schedules.
        sc.fresh_start = r.chance(0.2);
        sc.lose_disks = sc.restarts && r.chance(0.5);
        sc.clean_stops = sc.restarts && Rng::new(seed ^ 0xc1ea_5709).chance(0.5);
        sc
    }

    /// Whether `node` keeps a replica of `volume`.
    pub fn replica(&self, node: usize, volume: usize) -> bool {
        self.diskful[node] && !self.no_replica.contains(&(node as NodeId, volume as u16))
    }

    /// Whether `node` keeps a replica of some volume.
    fn any_replica(&self, node: usize) -> bool {
        (0..self.sizes.len()).any(|v| self.replica(node, v))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub completed: usize,
    pub failed: usize,
    /// Of those, failed for want of quorum; and times the Primary lost quorum.
    pub failed_for_quorum: usize,
    pub quorum_losses: usize,
    pub resyncs: usize,
    /// Restarts that lost the node's disks (see [`Scenario::lose_disks`]).
    pub disks_lost: usize,
    pub restarts: usize,
    /// Restarts that were clean stops (see [`Scenario::clean_stops`]).
    pub clean_stops: usize,
    /// Crash restarts of a consistent replica (started `Crashed`), and the bytes their
    /// activity logs named.
    pub crash_starts: usize,
    pub suspect_bytes: u64,
    /// Nodes whose disk failed (see [`Scenario::disk_errors`]), and whether one was the
    /// Primary's; of those, failures of one operation only (see [`Scenario::one_off_eio`]).
    pub disk_failures: usize,
    pub primary_disk_failed: bool,
    pub one_off_eios: usize,
    /// Replicas the engines said they detached after an I/O error.
    pub replicas_detached: usize,
    pub power_losses: usize,
    pub sectors_reverted: usize,
    pub inline_ops: usize,
    pub planned_syncs: usize,
    pub flushes_without_sync: usize,
    pub events: u64,
    /// Every replica ended UpToDate and identical. Only overlapping-fault runs may end
    /// without: they then stop after [`STUCK_AFTER_US`] and are checked for safety only.
    pub converged: bool,
    /// Crashes of every node at once, and of the Primary alone (see [`Scenario::crash`]),
    /// and whether that Primary kept a replica.
    pub cluster_crashes: usize,
    pub primary_crashes: usize,
    pub diskful_primary_crashed: bool,
    /// Requests in flight at a crash: never answered, so they may or may not have happened.
    pub abandoned: usize,
    /// Acknowledged writes a crash may have taken (a power loss before a flush, or a
    /// protocol the crash of every node does not cover), checked as in flight since.
    pub lossy: usize,
    /// Promotions of node 0 refused after a crash (no replica UpToDate yet), and the
    /// simulated µs from the crash to its promotion.
    pub promote_refusals: usize,
    pub promoted_after_us: u64,
    /// Replicas made UpToDate by their generation ids (no Primary, no up-to-date replica),
    /// and changes of a generation id the engines reported.
    pub proven_by_generation: usize,
    pub generation_changes: usize,
    /// Older replicas met after a restart with no Primary around, listed only a bitmap or
    /// everything (`Event::OlderPeerListed`).
    pub older_listed_bitmap: usize,
    pub older_listed_full: usize,
    /// What stalls did (see `stall.rs`).
    pub(crate) stalls: stall::Stalls,
    /// What failovers did (see `failover.rs`).
    pub(crate) failover: failover::FailoverStats,
}

/// How long (simulated) an overlapping-fault run may stay unconverged after the workload
/// is done, every request answered and every link healed (or until the event limit, when
/// it flaps); and how long node 0 may take to be Primary again after a crash.
pub const STUCK_AFTER_US: u64 = 20_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Deliver {
        from: NodeId,
        to: NodeId,
        conn: u64,
    },
    DiskDone {
        node: NodeId,
        op: u64,
    },
    Tick,
    Workload,
    Fault,
    Heal {
        a: NodeId,
        b: NodeId,
    },
    Restart {
        node: NodeId,
    },
    Promote,
    Crash,
    Repromote,
    /// A stopped node learns, once it runs again, that a connection dropped (see
    /// `stall.rs`).
    NoticeDown {
        node: NodeId,
        peer: NodeId,
        conn: u64,
    },
    /// The cluster manager looks at the Primary, and fails over (see `failover.rs`).
    Manage,
    Failover,
    /// The client after a probe attaches (see `failover.rs`).
    Reattach,
}

struct DiskOpState {
    volume: u16,
    token: Token,
    kind: DiskKind,
    data: Option<Vec<u8>>,
    incarnation: u64,
    /// A flush: per volume, the stamp of every sector when it was issued (what an
    /// fdatasync issued then makes durable at least).
    covers: Option<Covers>,
    /// A sync planned by the node's [`SyncPlan`], covering writes up to this generation.
    sync_gen: Option<u64>,
}

struct Node {
    engine: Resource,
    disk: Disk,
    /// Kept payloads and finished reads (the driver core's store, as in the daemon).
    data: DataStore<Vec<u8>>,
    /// Which fdatasync answers which flush (the daemon's plan), when the knobs say so.
    syncs: SyncPlan<(u16, Token)>,
    ops: BTreeMap<u64, DiskOpState>,
    incarnation: u64,
}

struct Link {
    up: bool,
    conn: u64,
    /// When it came up.
    since: u64,
    queue: std::collections::VecDeque<Vec<u8>>,
    last_delivery: u64,
}

enum Pending {
    Write {
        idx: usize,
        submitted: u64,
    },
    Read {
        volume: u16,
        offset: u64,
        len: u64,
        submitted: u64,
    },
    Flush {
        volume: u16,
        submitted: u64,
    },
}

pub struct Sim {
    sc: Scenario,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<std::cmp::Reverse<(u64, u64, Ev)>>,
    nodes: Vec<Node>,
    links: BTreeMap<(NodeId, NodeId), Link>,
    pending: BTreeMap<ReqId, Pending>,
    /// The node each pending request was submitted to (always node 0 but with failover).
    req_node: BTreeMap<ReqId, NodeId>,
    /// The node the workload runs through: node 0 but with failover.
    primary: NodeId,
    /// Failover: the cluster manager, the Primaries' tenures (see `failover.rs`).
    fo: failover::FailoverState,
    writes: Vec<WriteRec>,
    /// Reads, checked at the end when it is known which writes reached a replica.
    reads: Vec<ReadRec>,
    /// Per volume and sector: the stamp and completion order of the last successful write.
    model: Vec<Vec<(u64, u64)>>,
    next_req: u64,
    next_op: u64,
    next_conn: u64,
    issued: usize,
    /// Counts submissions and completions: orders events that share a simulated instant.
    clock: u64,
    completed: usize,
    failed: usize,
    /// Requests failed with `IoError::NoQuorum`, and times the Primary lost quorum.
    failed_for_quorum: usize,
    quorum_losses: usize,
    resyncs: usize,
    disks_lost: usize,
    /// The earliest tick queued (simulated µs).
    tick_at: Option<u64>,
    /// Draws the failures of the new families, apart from `rng` (which keeps the
    /// schedules of the older ones).
    fault_rng: Rng,
    /// A disk failure was injected (one per run).
    disk_fault: bool,
    /// Draws what only one-off disk errors need, so runs whose disk dies for good keep
    /// their schedules.
    eio_rng: Rng,
    /// Per node and volume: when the simulator made that replica fail (its disk died, or
    /// an operation on it returned EIO). It is out of the final convergence checks.
    failed_at: Vec<Vec<Option<u64>>>,
    /// Per node and volume: when the engine was first given an EIO for that replica (it
    /// must have detached it).
    eio_told: Vec<Vec<Option<u64>>>,
    /// Per node and volume: the engine said it detached that replica (it then must issue
    /// no more I/O on it). Forgotten at a restart.
    detached: Vec<Vec<bool>>,
    replicas_detached: usize,
    one_off_eios: usize,
    restarts: usize,
    clean_stops: usize,
    /// Decides which restarts are clean stops (see [`Scenario::clean_stops`]).
    clean_rng: Rng,
    /// Disk operations completed inline (see [`Knobs::inline_disk_pct`]).
    inline_ops: usize,
    /// fdatasyncs the nodes' sync plans started, and flushes they answered without one.
    planned_syncs: usize,
    flushes_without_sync: usize,
    power_losses: usize,
    sectors_reverted: usize,
    crash_starts: usize,
    suspect_bytes: u64,
    /// The crash of [`Scenario::crash`]: where it stands, its draws, what it did.
    crash: crash::CrashState,
    /// Flushes that succeeded, by volume and submission order: what a power loss of every
    /// replica must keep.
    flushes_done: Vec<(u16, u64)>,
    /// Resync requests sent: a run stuck without an up-to-date replica must not spin.
    resync_reqs: u64,
    /// Connections a node dropped (a conflict it cannot settle yet, then redialled).
    drops: u64,
    events: u64,
    log: std::collections::VecDeque<String>,
    /// `TANDEM_SIM_TRACE=1`: every delivered packet and disk completion goes to the log
    /// (for reading a failing seed's history; changes nothing else).
    trace: bool,
    /// How many history lines are kept: every one under `TANDEM_SIM_FULL` (to read why a
    /// long run never converged), else the last few thousand.
    log_cap: usize,
    /// Per node: until when (simulated µs) it is stopped, and whether that stall is
    /// shorter than the request timeout; draws of the stalls; what they did.
    stalled_until: Vec<u64>,
    stall_short: Vec<bool>,
    stall_rng: Rng,
    stall_stats: stall::Stalls,
}

fn spec(sc: &Scenario, me: NodeId, incarnation: u64) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: (0..sc.diskful.len())
            .map(|i| {
                let replicas = (0..sc.sizes.len()).map(|v| sc.replica(i, v)).collect();
                (i as NodeId, replicas)
            })
            .collect(),
        sizes: sc.sizes.clone(),
        protocol: sc.protocol,
        ping_interval_ms: sc.knobs.ping_interval_ms,
        ping_timeout_ms: sc.knobs.ping_timeout_ms,
        timeout_ms: sc.knobs.timeout_ms,
        resync_chunk: sc.knobs.resync_chunk,
        resync_window: sc.knobs.resync_window,
        resync_rates: sc.knobs.resync_rates,
        // Distinct per node and start, fixed by the seed.
        gi_seed: sc.seed.rotate_left(17)
            ^ (u64::from(me) << 56)
            ^ incarnation.wrapping_mul(0x9e37_79b9),
        quorum: sc.knobs.quorum,
        // The simulator makes no split brain (one Primary at a time): the default.
        after_sb: Default::default(),
    }
}

/// What a node's engine finds at start: `have` for its replicas.
fn disks(sc: &Scenario, node: usize, have: ReplicaAtStart) -> Vec<ReplicaAtStart> {
    (0..sc.sizes.len())
        .map(|v| {
            if sc.replica(node, v) {
                have
            } else {
                ReplicaAtStart::None
            }
        })
        .collect()
}

impl Sim {
    pub fn new(sc: Scenario) -> Sim {
        assert!(
            sc.sizes.iter().all(|&s| s % 4096 == 0 && s >= 16 << 10),
            "volume sizes are multiples of 4 KiB, at least 16 KiB"
        );
        let nodes = (0..sc.diskful.len())
            .map(|i| {
                let size = |v: usize| {
                    if sc.replica(i, v) {
                        sc.sizes[v] as usize
                    } else {
                        0
                    }
                };
                Node {
                    engine: Resource::new(
                        spec(&sc, i as NodeId, 0),
                        disks(
                            &sc,
                            i,
                            if sc.fresh_start {
                                ReplicaAtStart::Created
                            } else {
                                ReplicaAtStart::UpToDate
                            },
                        ),
                    ),
                    disk: Disk::new((0..sc.sizes.len()).map(size)),
                    data: DataStore::default(),
                    syncs: SyncPlan::default(),
                    ops: BTreeMap::new(),
                    incarnation: 0,
                }
            })
            .collect();
        let (sc_seed, n_nodes, n_vols) = (sc.seed, sc.diskful.len(), sc.sizes.len());
        let crashes = sc.crash.is_some();
        let mut sim = Sim {
            rng: Rng::new(sc.seed),
            sc,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            links: BTreeMap::new(),
            pending: BTreeMap::new(),
            req_node: BTreeMap::new(),
            primary: 0,
            fo: failover::FailoverState::new(sc_seed, n_nodes),
            writes: Vec::new(),
            reads: Vec::new(),
            model: Vec::new(),
            next_req: 1,
            next_op: 1,
            next_conn: 1,
            issued: 0,
            clock: 0,
            completed: 0,
            failed: 0,
            failed_for_quorum: 0,
            quorum_losses: 0,
            resyncs: 0,
            disks_lost: 0,
            fault_rng: Rng::new(sc_seed ^ 0xd15c_fa17),
            disk_fault: false,
            eio_rng: Rng::new(sc_seed ^ 0x0e10_0e10),
            failed_at: vec![vec![None; n_vols]; n_nodes],
            eio_told: vec![vec![None; n_vols]; n_nodes],
            detached: vec![vec![false; n_vols]; n_nodes],
            replicas_detached: 0,
            one_off_eios: 0,
            restarts: 0,
            clean_stops: 0,
            clean_rng: Rng::new(sc_seed ^ 0xc1ea_c1ea),
            inline_ops: 0,
            planned_syncs: 0,
            flushes_without_sync: 0,
            power_losses: 0,
            sectors_reverted: 0,
            crash_starts: 0,
            suspect_bytes: 0,
            crash: crash::CrashState::new(sc_seed, crashes),
            stalled_until: vec![0; n_nodes],
            stall_short: vec![false; n_nodes],
            stall_rng: Rng::new(sc_seed ^ 0x5a11_5a11),
            stall_stats: Default::default(),
            flushes_done: Vec::new(),
            resync_reqs: 0,
            tick_at: None,
            drops: 0,
            events: 0,
            log: Default::default(),
            trace: std::env::var_os("TANDEM_SIM_TRACE").is_some(),
            log_cap: if std::env::var_os("TANDEM_SIM_FULL").is_some() {
                usize::MAX
            } else if std::env::var_os("TANDEM_SIM_TRACE").is_some() {
                1_000_000
            } else {
                5_000
            },
        };
        sim.model = sim
            .sc
            .sizes
            .iter()
            .map(|&s| vec![(0, 0); (s / SECTOR) as usize])
            .collect();
        let n = sim.nodes.len() as NodeId;
        for a in 0..n {
            for b in (a + 1)..n {
                sim.connect(a, b);
            }
        }
        // Promote once the peers have told each other their state.
        sim.at(5_000, Ev::Promote);
        sim.at(1, Ev::Tick);
        // A new cluster's faults start once it is up (see `Ev::Promote`): a node restarted
        // before the replicas met finds a file it cannot prove current, next to created
        // ones, and no replica may then call itself UpToDate until an administrator says.
        if (sim.sc.faults || sim.sc.restarts) && !sim.sc.fresh_start {
            let t = 1_000 + sim.rng.below(20_000);
            sim.at(t, Ev::Fault);
        }
        sim
    }

    /// Ticks when the engines ask for it (`Resource::poll_timeout`), not at a fixed rate;
    /// none once everything is in sync and idle.
    fn schedule_tick(&mut self) {
        if self.quiet() {
            return;
        }
        // A stopped node's timers run once it goes on, after what waited for it.
        let Some(want) = (0..self.nodes.len())
            .filter_map(|i| match self.stalled(i as NodeId) {
                Some(until) => Some(until + 1),
                None => (self.nodes[i].engine.poll_timeout()).map(|ms| ms * 1000),
            })
            .min()
            .map(|us| us.max(self.now + 1))
        else {
            return;
        };
        if self.tick_at.is_none_or(|at| want < at) {
            self.tick_at = Some(want);
            self.at(want - self.now, Ev::Tick);
        }
    }

    fn at(&mut self, delay_us: u64, ev: Ev) {
        self.seq += 1;
        self.queue
            .push(std::cmp::Reverse((self.now + delay_us, self.seq, ev)));
    }

    fn note(&mut self, s: String) {
        if self.log.len() == self.log_cap {
            self.log.pop_front();
        }
        self.log.push_back(format!("{:>10} {s}", self.now));
    }

    /// The recent history, for a failing seed.
    pub fn tail_log(&self, n: usize) -> String {
        let n = if std::env::var_os("TANDEM_SIM_FULL").is_some() {
            usize::MAX
        } else {
            n
        };
        let skip = self.log.len().saturating_sub(n);
        self.log
            .iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn connect(&mut self, a: NodeId, b: NodeId) {
        if self.sc.stalls {
            self.old_links_down(a, b);
        }
        let conn = self.next_conn;
        self.next_conn += 1;
        for (x, y) in [(a, b), (b, a)] {
            self.links.insert(
                (x, y),
                Link {
                    up: true,
                    conn,
                    since: self.now,
                    queue: Default::default(),
                    last_delivery: self.now,
                },
            );
        }
        self.note(format!("link {a}<->{b} up"));
        for (x, y) in [(a, b), (b, a)] {
            let mut out = Vec::new();
            self.nodes[x as usize].engine.peer_up(y, &mut out);
            self.run_actions(x, out, &Inputs::default());
        }
    }

    /// Cuts the link; `except` already knows (it dropped the connection itself).
    fn cut(&mut self, a: NodeId, b: NodeId, except: Option<NodeId>) {
        if !self.links.get(&(a, b)).is_some_and(|l| l.up) {
            return;
        }
        let mut conn = 0;
        for (x, y) in [(a, b), (b, a)] {
            let l = self.links.get_mut(&(x, y)).expect("link exists");
            l.up = false;
            l.queue.clear();
            conn = l.conn;
        }
        self.note(format!("link {a}<->{b} cut"));
        for (x, y) in [(a, b), (b, a)] {
            if Some(x) != except {
                self.notice_down(x, y, conn);
            }
        }
    }

    // ------------------------------------------------------------------ driver

    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg, inputs: &Inputs<'_>) {
        if !self.links.get(&(from, to)).is_some_and(|l| l.up) {
            return;
        }
        if matches!(msg, Msg::ResyncReq { .. }) {
            self.resync_reqs += 1;
        }
        let mut buf = Vec::new();
        // Payloads are copied out first: the packet borrows them while `self` is used again.
        let payload: Option<Vec<u8>> = match msg {
            Msg::Write { data, len, .. } => Some(self.resolve(from, data, inputs, len as usize)),
            Msg::ReadReply {
                data: Some(d), len, ..
            }
            | Msg::ResyncReply {
                data: Some(d), len, ..
            } => Some(self.resolve(from, d, inputs, len as usize)),
            Msg::AllocReply {
                data: Some(d),
                extents,
                ..
            } => Some(self.resolve(from, d, inputs, extents as usize * ALLOC_EXTENT_LEN)),
            _ => None,
        };
        if from == 0 || self.sc.failover {
            self.sent_write(from, to, &msg, payload.as_deref());
        }
        let packet = msg.to_packet(|_, _| payload.as_deref().unwrap_or(&[]));
        tandem_wire::encode(&packet, &mut buf);
        let delay = 20 + self.rng.below(200);
        let link = self.links.get_mut(&(from, to)).expect("link");
        // FIFO per connection: never deliver before the previous packet.
        let when = (self.now + delay).max(link.last_delivery);
        link.last_delivery = when;
        link.queue.push_back(buf);
        let conn = link.conn;
        let d = when - self.now;
        self.at(d, Ev::Deliver { from, to, conn });
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, conn: u64) {
        let Some(link) = self.links.get_mut(&(from, to)) else {
            return;
        };
        if !link.up || link.conn != conn {
            return;
        }
        let Some(bytes) = link.queue.pop_front() else {
            return;
        };
        let packet = match tandem_wire::decode(&bytes) {
            Ok(Decoded::Packet(p, n)) if n == bytes.len() => p,
            other => panic!("the codec failed on its own packet: {other:?}"),
        };
        let data: Option<&[u8]> = match packet {
            Packet::Write { data, .. }
            | Packet::ReadReply { data, .. }
            | Packet::ResyncReply { data, .. }
            | Packet::AllocReply { extents: data, .. } => Some(data),
            _ => None,
        };
        let data = data.map(|d| d.to_vec());
        if self.trace && !matches!(packet, Packet::Ping | Packet::PingAck) {
            let text = match (&packet, &data) {
                (_, Some(d)) => {
                    let shown = format!("{packet:?}");
                    let cut = shown.find("data:").unwrap_or(shown.len());
                    let stamp = if d.len() >= 8 { stamp_of(d) } else { 0 };
                    format!("{}data: {} bytes, stamp {stamp}", &shown[..cut], d.len())
                }
                _ => format!("{packet:?}"),
            };
            self.note(format!("  {from} -> {to}: {text}"));
        }
        let mut out = Vec::new();
        self.nodes[to as usize]
            .engine
            .packet(from, &packet, &mut out);
        let inputs = Inputs {
            incoming: data.as_deref(),
            payload: None,
        };
        self.run_actions(to, out, &inputs);
    }

    fn disk_done(&mut self, node: NodeId, op: u64) {
        let is_read = self.nodes[node as usize].ops.get(&op).is_some_and(|st| {
            matches!(st.kind, DiskKind::Read { .. } | DiskKind::Allocation { .. })
        });
        let token = self.nodes[node as usize].ops.get(&op).map(|st| st.token);
        let out = self.finish_disk_op(node, op);
        self.run_actions(node, out, &Inputs::default());
        // Read buffers are consumed by the actions above (a reply or a completion).
        if let (true, Some(token)) = (is_read, token) {
            self.nodes[node as usize].data.take_read(token);
        }
    }

    /// A disk operation lands (or fails, on a dead disk): the engine is told; its actions
    /// are returned for the caller to carry out.
    fn finish_disk_op(&mut self, node: NodeId, op: u64) -> Vec<RAction> {
        let n = &mut self.nodes[node as usize];
        let Some(st) = n.ops.remove(&op) else {
            return Vec::new();
        };
        if st.incarnation != n.incarnation {
            return Vec::new(); // issued before a restart
        }
        if let Some(gen) = st.sync_gen {
            return self.sync_done(node, gen, st.covers.expect("a sync knows what it covers"));
        }
        let volume = st.volume;
        if self.failing(node, st.kind) {
            return self.fail_disk_op(node, st);
        }
        let n = &mut self.nodes[node as usize];
        let v = volume as usize;
        match st.kind {
            DiskKind::Write { offset, len } => {
                let data = st.data.expect("write data captured at issue");
                n.disk.write(v, offset, &data[..len as usize]);
                let stamp = stamp_of(&data);
                if let Some(w) = self.writes.iter_mut().find(|w| w.stamp == stamp && !w.zero) {
                    w.applied = true;
                    w.applied_on |= 1 << node;
                }
            }
            DiskKind::Zero { offset, len, .. } | DiskKind::Trim { offset, len } => {
                n.disk.zero(v, offset, u64::from(len));
                for w in self.writes.iter_mut().filter(|w| {
                    w.zero && w.volume == volume && w.offset == offset && w.len == u64::from(len)
                }) {
                    w.applied = true;
                    w.applied_on |= 1 << node;
                }
            }
            DiskKind::Read { offset, len } => {
                let bytes = n.disk.read(v, offset, u64::from(len));
                n.data.read_done(st.token, bytes);
            }
            DiskKind::Flush => {
                n.disk
                    .synced(st.covers.expect("a flush knows what it covers"));
            }
            DiskKind::Cache { .. } => {}
            // The simulated disk keeps no allocation map: one data extent, always true.
            // (The simulator issues no block status; a peer's request could still ask.)
            DiskKind::Allocation { len, .. } => {
                let mut map = Vec::new();
                AllocExtent { len, hole: false }.encode(&mut map);
                n.data.read_done(st.token, map);
            }
        }
        let n = &mut self.nodes[node as usize];
        let ahead = match st.kind {
            _ if !self.sc.knobs.sync_plan => None,
            DiskKind::Write { len, .. } => n.syncs.wrote(u64::from(len)),
            DiskKind::Zero { .. } | DiskKind::Trim { .. } => n.syncs.wrote(u64::MAX),
            _ => None,
        };
        n.data.write_ended(st.token);
        if self.trace {
            self.note(format!(
                "  node {node} disk done: {:?} {:?}",
                st.token, st.kind
            ));
        }
        let mut out = Vec::new();
        let engine = &mut self.nodes[node as usize].engine;
        match st.kind {
            DiskKind::Allocation { .. } => {
                engine.allocation_done(volume, st.token, Ok(1), &mut out)
            }
            _ => engine.disk_done(volume, st.token, st.kind, Ok(()), &mut out),
        }
        if let Some(s) = ahead {
            // Syncing ahead of a flush that is probably coming (see `sync_plan`).
            self.start_sync(node, s);
        }
        out
    }

    /// Starts an fdatasync the node's [`SyncPlan`] asked for: it makes durable what every
    /// volume held now.
    fn start_sync(&mut self, node: NodeId, s: SyncStart) {
        self.planned_syncs += 1;
        let n = &mut self.nodes[node as usize];
        let covers = n.disk.covers();
        let op = self.next_op;
        self.next_op += 1;
        let st = DiskOpState {
            volume: 0,
            token: Token::Flush(s.gen),
            kind: DiskKind::Flush,
            data: None,
            incarnation: n.incarnation,
            covers: Some(covers),
            sync_gen: Some(s.gen),
        };
        n.ops.insert(op, st);
        let d = 5 + self.fault_rng.below(300);
        self.at(d, Ev::DiskDone { node, op });
    }

    /// A planned sync finished: the flush it answers (if any) is told to the engine, and
    /// the next sync the plan needs is started.
    fn sync_done(&mut self, node: NodeId, gen: u64, covers: Covers) -> Vec<RAction> {
        let ok = !self.failing(node, DiskKind::Flush);
        if !ok {
            self.replicas_fail(node as usize, None);
        }
        let n = &mut self.nodes[node as usize];
        if ok {
            n.disk.synced(covers);
        }
        let (answer, next) = n.syncs.sync_done(gen, ok);
        let mut out = Vec::new();
        if let Some(((v, t), r)) = answer {
            let r = r.map_err(|()| IoError::Os(5));
            if r.is_err() {
                self.told_eio(node, None);
            }
            let n = &mut self.nodes[node as usize];
            n.engine.disk_done(v, t, DiskKind::Flush, r, &mut out);
        } else if !ok {
            // As the daemon does: a failed sync nobody waits for detaches at once.
            self.told_eio(node, None);
            self.nodes[node as usize].engine.sync_failed(&mut out);
        }
        if let Some(s) = next {
            self.start_sync(node, s);
        }
        out
    }

    // ------------------------------------------------------------------ workload and checks

    fn workload(&mut self) {
        if self.crash.awaits_promotion() {
            // Node 0 is no Primary until promoted again, which restarts the workload.
            return;
        }
        while self.issued < self.sc.ops && self.pending.len() < self.sc.max_in_flight {
            if self.nodes[self.primary as usize].engine.role() != Role::Primary || !self.fo.attached
            {
                break;
            }
            let req = ReqId(self.next_req);
            self.next_req += 1;
            self.issued += 1;
            // No draw with one volume: such seeds run as they did before volumes.
            let volume = match self.sc.sizes.len() {
                1 => 0,
                n => self.rng.below(n as u64) as u16,
            };
            let sectors = self.sc.sizes[volume as usize] / SECTOR;
            let offset = self.rng.below(sectors - 16) * SECTOR;
            let len = (1 + self.rng.below(16)) * SECTOR;
            let roll = self.rng.below(100);
            let mut payload = None;
            let io = if roll < 55 {
                let stamp = req.0;
                let mut data = vec![0u8; len as usize];
                for chunk in data.chunks_mut(SECTOR as usize) {
                    chunk[..8].copy_from_slice(&stamp.to_le_bytes());
                }
                payload = Some(data);
                let fua = self.rng.chance(0.1);
                self.writes.push(WriteRec {
                    stamp,
                    volume,
                    offset,
                    len,
                    completed: None,
                    order: 0,
                    ok: false,
                    applied: false,
                    applied_on: 0,
                    sent: Vec::new(),
                    zero: false,
                    fua,
                    submitted: self.now,
                    submit_order: 0,
                    acked_by: None,
                });
                self.pending.insert(
                    req,
                    Pending::Write {
                        idx: self.writes.len() - 1,
                        submitted: self.now,
                    },
                );
                Io::Write {
                    offset,
                    len: len as u32,
                    fua,
                }
            } else if roll < 62 {
                self.writes.push(WriteRec {
                    stamp: 0,
                    volume,
                    offset,
                    len,
                    completed: None,
                    order: 0,
                    ok: false,
                    applied: false,
                    applied_on: 0,
                    sent: Vec::new(),
                    zero: true,
                    fua: false,
                    submitted: self.now,
                    submit_order: 0,
                    acked_by: None,
                });
                self.pending.insert(
                    req,
                    Pending::Write {
                        idx: self.writes.len() - 1,
                        submitted: self.now,
                    },
                );
                let trim = self.rng.chance(0.5);
                if trim {
                    Io::Trim {
                        offset,
                        len: len as u32,
                        fua: false,
                    }
                } else {
                    Io::Zero {
                        offset,
                        len: len as u32,
                        fua: false,
                        may_punch: self.rng.chance(0.5),
                        fast: false,
                    }
                }
            } else if roll < 92 {
                self.clock += 1;
                self.pending.insert(
                    req,
                    Pending::Read {
                        volume,
                        offset,
                        len,
                        submitted: self.clock,
                    },
                );
                Io::Read {
                    offset,
                    len: len as u32,
                }
            } else {
                self.clock += 1;
                self.pending.insert(
                    req,
                    Pending::Flush {
                        volume,
                        submitted: self.clock,
                    },
                );
                Io::Flush
            };
            let p = self.primary;
            if self.sc.failover {
                self.note(format!("submit {req:?} to node {p} volume {volume} {io:?}"));
            } else {
                self.note(format!("submit {req:?} volume {volume} {io:?}"));
            }
            self.req_node.insert(req, p);
            if let Some(Pending::Write { idx, .. }) = self.pending.get(&req) {
                self.writes[*idx].submit_order = self.clock;
            }
            let mut out = Vec::new();
            self.nodes[p as usize]
                .engine
                .submit(req, volume, io, &mut out);
            let inputs = Inputs {
                incoming: None,
                payload: payload.as_deref().map(|p| (req, p)),
            };
            self.run_actions(p, out, &inputs);
        }
        self.crash_when_due();
        if self.sc.failover {
            // One polling chain (every completion also calls: with no Primary for long,
            // a chain per call would pile up).
            if self.fo.next_poll.is_some_and(|t| t <= self.now) {
                self.fo.next_poll = None;
            }
            if self.issued < self.sc.ops && self.fo.next_poll.is_none() {
                let d = 10 + self.rng.below(100);
                self.fo.next_poll = Some(self.now + d);
                self.at(d, Ev::Workload);
            }
        } else if self.issued < self.sc.ops {
            let d = 10 + self.rng.below(100);
            self.at(d, Ev::Workload);
        }
    }

    fn complete(
        &mut self,
        node: NodeId,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        inputs: &Inputs<'_>,
    ) {
        let p = self
            .pending
            .remove(&req)
            .unwrap_or_else(|| panic!("{req:?} completed twice or never submitted"));
        let to = self.req_node.remove(&req);
        assert_eq!(
            to,
            Some(node),
            "seed {}: {req:?} completed by node {node}, submitted to {to:?}",
            self.sc.seed
        );
        self.note(format!("complete {req:?} {result:?}"));
        if result == Err(IoError::NoQuorum) {
            // Failed for want of quorum: allowed only with quorum on (and then whatever
            // replicas were reachable: the other side of a partition may have one).
            assert!(
                !self.sc.knobs.quorum.is_off(),
                "seed {}: {req:?} failed for want of quorum with quorum off\n{}",
                self.sc.seed,
                self.tail_log(300)
            );
            self.failed += 1;
            self.failed_for_quorum += 1;
        } else if result.is_err() {
            self.failed += 1;
            // Failing is allowed only when no up-to-date replica of the request's volume was
            // within reach: UpToDate, connected since before the request was submitted
            // (a request goes to the replicas connected when it starts; one that connects
            // meanwhile is not sent it: seed 30093754), and the Primary told so (a replica
            // that has just finished its resync says so on a link that may still carry a
            // backlog of acknowledgements). For a write, also one the Primary does not know
            // to lack a block the write covers in part: written there, the block would hold
            // the write's sectors and miss its others (rule F, overlapping seed 15630; soak
            // seed 204006330: a replica back from away said UpToDate before it heard the
            // Primary's list naming such a block).
            let (v, submitted) = match p {
                Pending::Write { idx, submitted } => (self.writes[idx].volume, submitted),
                Pending::Read {
                    volume, submitted, ..
                }
                | Pending::Flush {
                    volume, submitted, ..
                } => (volume, submitted),
            };
            let primary = self.nodes[node as usize].engine.status();
            let range = match p {
                Pending::Write { idx, .. } => Some((self.writes[idx].offset, self.writes[idx].len)),
                _ => None,
            };
            // A FLUSH vouches for every write before it: a replica the Primary knows lacks
            // blocks answers for none (overlapping seed 286090154), so it may fail then.
            let flush = matches!(p, Pending::Flush { .. });
            let told = |i: usize| {
                let id = i as NodeId;
                primary.peers.iter().any(|p| {
                    let pv = &p.volumes[v as usize];
                    p.id == id
                        && pv.disk == Some(DiskState::UpToDate)
                        && (!flush || pv.out_of_sync_bytes == 0)
                }) && range.is_none_or(|(o, l)| {
                    self.nodes[node as usize]
                        .engine
                        .peer_current_for(id, v, o, l)
                })
            };
            let reachable = (0..self.nodes.len()).any(|i| {
                self.live_replica(i, v as usize)
                    && (i == node as usize
                        || (self
                            .links
                            .get(&(node, i as NodeId))
                            .is_some_and(|l| l.up && l.since <= submitted)
                            && told(i)))
                    && self.nodes[i].engine.disk(v) == DiskState::UpToDate
            });
            // A Primary stepping down for another fails what it held (`primaries.rs`).
            let yielded = self.fo.yielded(node);
            assert!(
                !reachable || yielded || matches!(p, Pending::Read { .. }),
                "seed {}: {req:?} failed with {result:?} while an up-to-date replica was reachable\n{}",
                self.sc.seed,
                self.tail_log(300)
            );
        } else {
            self.completed += 1;
        }
        match p {
            Pending::Write { idx, .. } => {
                self.clock += 1;
                let order = self.clock;
                let w = &mut self.writes[idx];
                w.completed = Some(self.now);
                w.order = order;
                w.ok = result.is_ok();
                w.acked_by = Some(node);
                if w.ok {
                    let w = w.clone();
                    self.check_majority(&w);
                    self.check_tenures(node, &w);
                    for s in (w.offset / SECTOR)..((w.offset + w.len) / SECTOR) {
                        self.model[w.volume as usize][s as usize] = (w.stamp, w.order);
                    }
                    if w.fua {
                        self.check_fua(&w);
                    }
                }
            }
            Pending::Read {
                volume,
                offset,
                len,
                submitted,
            } => {
                if result.is_ok() {
                    let bytes = self.resolve(node, data.expect("read data"), inputs, len as usize);
                    let stamps = bytes.chunks(SECTOR as usize).map(stamp_of).collect();
                    self.clock += 1;
                    self.reads.push(ReadRec {
                        req,
                        volume,
                        offset,
                        stamps,
                        submitted,
                    });
                }
            }
            Pending::Flush { volume, submitted } => {
                if result.is_ok() {
                    self.check_flush(req, volume, submitted);
                    self.flushes_done.push((volume, submitted));
                }
            }
        }
        self.at(1, Ev::Workload);
    }

    fn step(&mut self) -> bool {
        let more = self.step_event();
        self.schedule_tick();
        for (i, n) in self.nodes.iter().enumerate() {
            if let Err(e) = n.engine.check_invariants() {
                panic!(
                    "seed {}: node {i}: engine invariant broken: {e}\n{}",
                    self.sc.seed,
                    self.tail_log(80)
                );
            }
        }
        more
    }

    fn step_event(&mut self) -> bool {
        let Some(std::cmp::Reverse((t, _, ev))) = self.queue.pop() else {
            return false;
        };
        self.now = t;
        self.events += 1;
        for n in &mut self.nodes {
            n.engine.advance(t / 1000);
        }
        if self.sc.stalls && self.hold_for_stall(ev) {
            return true;
        }
        match ev {
            Ev::Deliver { from, to, conn } => self.deliver(from, to, conn),
            Ev::DiskDone { node, op } => self.disk_done(node, op),
            Ev::Tick => {
                if self.tick_at.is_some_and(|at| at <= t) {
                    self.tick_at = None;
                }
                for i in 0..self.nodes.len() {
                    if self.stalled(i as NodeId).is_some() {
                        continue;
                    }
                    let mut out = Vec::new();
                    self.nodes[i].engine.tick(self.now / 1000, &mut out);
                    self.run_actions(i as NodeId, out, &Inputs::default());
                }
            }
            Ev::Workload => self.workload(),
            Ev::Fault => self.fault(),
            Ev::Heal { a, b } => {
                if !self.links.get(&(a, b)).is_some_and(|l| l.up)
                    && !self.fo.dead(a, t)
                    && !self.fo.dead(b, t)
                {
                    self.connect(a, b);
                }
            }
            Ev::Restart { node } => self.rejoin(node),
            Ev::Crash => self.crash(),
            Ev::Repromote => self.repromote(),
            Ev::NoticeDown { node, peer, conn } => self.notice_down(node, peer, conn),
            Ev::Manage => self.manage(),
            Ev::Failover => self.failover(),
            Ev::Reattach => self.reattach(),
            Ev::Promote => {
                let mut out = Vec::new();
                match self.nodes[0].engine.promote(false, &mut out) {
                    Ok(()) => {}
                    // Quorum comes once enough links are up; a peer just connected says
                    // which Primary it follows a moment later.
                    Err(
                        PromoteError::NoQuorum(_)
                        | PromoteError::PeerUnheard(_)
                        | PromoteError::PeerListing { .. },
                    ) if self.now < 1_000_000 => {
                        self.at(5_000, Ev::Promote);
                        return true;
                    }
                    // A new cluster is UpToDate once all its replicas have met.
                    Err(_) if self.sc.fresh_start && self.now < 1_000_000 => {
                        self.at(5_000, Ev::Promote);
                        return true;
                    }
                    // The failover family's faults may come first (restarted replicas
                    // settle among themselves once they meet again).
                    Err(_) if self.sc.failover && self.now < STUCK_AFTER_US => {
                        self.at(5_000, Ev::Promote);
                        return true;
                    }
                    Err(e) => panic!(
                        "seed {}: node 0 cannot promote at start: {e:?}\n{}",
                        self.sc.seed,
                        self.tail_log(300)
                    ),
                }
                self.run_actions(0, out, &Inputs::default());
                self.at(1, Ev::Workload);
                if self.sc.failover {
                    self.first_tenure();
                }
                if self.sc.fresh_start && (self.sc.faults || self.sc.restarts) {
                    let t = 1_000 + self.rng.below(20_000);
                    self.at(t, Ev::Fault);
                }
            }
        }
        true
    }

    /// Nothing left to do: workload done, all requests answered, every replica in sync.
    fn quiet(&self) -> bool {
        self.issued >= self.sc.ops && self.pending.is_empty() && self.in_sync()
    }

    /// Some volume has no UpToDate replica on any node: until persistent metadata proves
    /// which one is current, nothing can converge it.
    pub(crate) fn no_up_to_date_replica(&self) -> bool {
        let st: Vec<_> = self.nodes.iter().map(|n| n.engine.status()).collect();
        (0..self.sc.sizes.len()).any(|v| {
            (0..self.nodes.len())
                .all(|i| !self.live_replica(i, v) || st[i].volumes[v].disk != DiskState::UpToDate)
        })
    }

    /// All links up and every replica of every volume UpToDate, no known out-of-sync block.
    fn healthy(&self) -> bool {
        // A stall is a failure until it ends (see `stall.rs`).
        (0..self.nodes.len()).all(|i| self.stalled(i as NodeId).is_none())
            && self.links.values().all(|l| l.up)
            && (0..self.nodes.len()).all(|i| {
                let st = self.nodes[i].engine.status();
                (0..self.sc.sizes.len()).all(|v| {
                    (!self.live_replica(i, v) || st.volumes[v].disk == DiskState::UpToDate)
                        && st.peers.iter().all(|p| {
                            p.connected
                                && (p.volumes[v].out_of_sync_bytes == 0
                                    || self.is_failed(p.id as usize, v))
                        })
                })
            })
    }

    /// Every link up and idle, no disk operation pending, every replica of every volume
    /// UpToDate, and no node knowing of a block another lacks.
    fn in_sync(&self) -> bool {
        self.links.values().all(|l| l.up && l.queue.is_empty())
            && self.nodes.iter().all(|n| n.ops.is_empty())
            && (0..self.nodes.len()).all(|i| {
                let st = self.nodes[i].engine.status();
                st.peers.iter().all(|p| p.connected && p.unacked == 0)
                    && (0..self.sc.sizes.len()).all(|v| {
                        (!self.live_replica(i, v) || st.volumes[v].disk == DiskState::UpToDate)
                            && (st.volumes[v].resync_remaining.is_none() || self.is_failed(i, v))
                            && st.peers.iter().all(|p| {
                                p.volumes[v].out_of_sync_bytes == 0
                                    || self.is_failed(p.id as usize, v)
                            })
                    })
            })
    }

    /// Runs the scenario to the end and checks the final state. Panics with the seed and the
    /// recent history on any violation.
    pub fn run(mut self) -> Outcome {
        let limit = std::env::var("TANDEM_SIM_EVENT_LIMIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000_000u64);
        // Since when the workload is done, every request answered and every link healed.
        let mut settled_at: Option<u64> = None;
        let mut converged = true;
        // Resync requests sent and connections dropped by the middle of the stuck window.
        let mut at_half: Option<(u64, u64)> = None;
        while self.step() {
            if let Some(t) = settled_at {
                if self.now - t > STUCK_AFTER_US / 2 {
                    at_half.get_or_insert((self.resync_reqs, self.drops));
                }
            }
            // Overlapping faults: a known gap until persistent metadata (see
            // `Scenario::overlapping_faults`) can keep a settled run from converging, idle
            // or flapping (a false split brain dropped and redialled). So can a volume
            // whose every replica is Outdated or Inconsistent (restarts without metadata
            // outdate replicas), with single faults too: then the cluster must sit still,
            // not spin on resync requests no peer can answer.
            let overdue =
                settled_at.is_some_and(|t| self.now - t > STUCK_AFTER_US || self.events >= limit);
            let no_current = overdue && self.no_up_to_date_replica();
            if overdue && (self.sc.overlapping_faults || no_current) {
                self.note("stuck: checking safety only".into());
                if self.trace {
                    for n in &self.nodes {
                        eprintln!("{:?}", n.engine.status());
                    }
                }
                let (reqs, drops) = at_half.unwrap_or((self.resync_reqs, self.drops));
                // A connection that keeps being dropped and redialled (a known gap with
                // overlapping faults) restarts its resync each time: not this check's case.
                if no_current && drops == self.drops {
                    let spun = self.resync_reqs - reqs;
                    assert!(
                        spun <= 100,
                        "seed {}: {spun} resync requests in {} s without an up-to-date replica\n{}",
                        self.sc.seed,
                        STUCK_AFTER_US / 2_000_000,
                        self.tail_log(80)
                    );
                }
                // Why it never converged: the whole history and every engine's state.
                if std::env::var_os("TANDEM_SIM_FULL").is_some() {
                    eprintln!("{}", self.tail_log(0));
                    for (i, n) in self.nodes.iter().enumerate() {
                        eprintln!("node {i}'s engine: {:#?}", n.engine);
                    }
                }
                converged = false;
                break;
            }
            if self.events >= limit {
                let status: Vec<_> = self.nodes.iter().map(|n| n.engine.status()).collect();
                // A timer that stays due (an engine asking for a tick it does nothing
                // with) shows as a poll timeout at or before now.
                let timers: Vec<_> = self.nodes.iter().map(|n| n.engine.poll_timeout()).collect();
                panic!(
                    "seed {}: no quiescence after {limit} events (now {} ms, engines' next timers {timers:?} ms)\n{:?}\n{status:#?}\n{}",
                    self.sc.seed,
                    self.now / 1000,
                    self.sc,
                    self.tail_log(if self.trace { 1_000_000 } else { 60 })
                );
            }
            if self.issued >= self.sc.ops && self.pending.is_empty() && !self.crash.outstanding() {
                // Heal everything so the replicas can converge.
                let cut: Vec<(NodeId, NodeId)> = self
                    .links
                    .iter()
                    .filter(|(&(a, b), l)| a < b && !l.up)
                    .map(|(&k, _)| k)
                    // A stopped node is met again once it runs (see `stall.rs`).
                    .filter(|&(a, b)| !self.stopped_or_resuming(a) && !self.stopped_or_resuming(b))
                    // A killed node dials once its process is back (`failover.rs`).
                    .filter(|&(a, b)| !self.fo.dead(a, self.now) && !self.fo.dead(b, self.now))
                    .collect();
                for (a, b) in cut {
                    self.connect(a, b);
                }
                if self.in_sync() {
                    break;
                }
                settled_at.get_or_insert(self.now);
            }
        }
        if converged {
            if std::env::var_os("TANDEM_SIM_ALWAYS").is_some() {
                eprintln!("{}", self.tail_log(0));
                eprintln!("converged");
            }
            self.check_final();
        } else {
            self.check_safety();
        }
        Outcome {
            completed: self.completed,
            failed: self.failed,
            failed_for_quorum: self.failed_for_quorum,
            quorum_losses: self.quorum_losses,
            resyncs: self.resyncs,
            disks_lost: self.disks_lost,
            restarts: self.restarts,
            clean_stops: self.clean_stops,
            crash_starts: self.crash_starts,
            suspect_bytes: self.suspect_bytes,
            disk_failures: (0..self.nodes.len())
                .filter(|&i| self.node_failed(i))
                .count(),
            primary_disk_failed: self.node_failed(0),
            one_off_eios: self.one_off_eios,
            replicas_detached: self.replicas_detached,
            power_losses: self.power_losses,
            sectors_reverted: self.sectors_reverted,
            inline_ops: self.inline_ops,
            planned_syncs: self.planned_syncs,
            flushes_without_sync: self.flushes_without_sync,
            events: self.events,
            converged,
            cluster_crashes: self.crash.cluster_crashes,
            primary_crashes: self.crash.primary_crashes,
            diskful_primary_crashed: self.crash.diskful_primary_crashed,
            abandoned: self.crash.abandoned,
            lossy: self.crash.lossy,
            promote_refusals: self.crash.promote_refusals,
            promoted_after_us: self.crash.promoted_after_us,
            proven_by_generation: self.crash.proven_by_generation,
            generation_changes: self.crash.generation_changes,
            older_listed_bitmap: self.crash.older_listed_bitmap,
            older_listed_full: self.crash.older_listed_full,
            stalls: self.stall_stats,
            failover: self.fo.stats,
        }
    }
}
