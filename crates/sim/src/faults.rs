//! The fault families a run is drawn from, the engine knobs they draw, and the faults a
//! run injects (links cut, restarts, power losses, disks failing; crashes of every node or
//! of the Primary are in `crash.rs`).

use crate::rng::Rng;
use crate::{spec, Crash, Ev, Scenario, Sim};
use tandem_engine::driver::Inputs;
use tandem_engine::replica::{
    GenIds, IdsAtCrash, NodeId, NotQuiet, OnNoQuorum, Protocol, QuorumSpec, ReplicaAtStart,
    Resource, ResyncRates, Role, Votes,
};
use tandem_engine::sync_plan::SyncPlan;

/// A peer's bitmap as a crashed node's metadata keeps it: the peer, the words (with the
/// activity log's extents), the bitmap's id.
pub(crate) type KeptBitmap = (NodeId, Vec<u64>, Option<u64>);

/// Which failures a batch of runs injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Cut links and restarts (kill -9), one failure at a time.
    Single,
    /// The same, a new failure while earlier ones still heal.
    Overlapping,
    /// One at a time, plus the disk of one node failing: for good (every later write,
    /// read and fdatasync on it returns EIO) or, in half the runs, at one write or one
    /// fdatasync only. Its replicas detach, the rest go on.
    DiskErrors,
    /// One at a time, restarts being power losses: what a node wrote and did not
    /// fdatasync is kept, lost or torn per 4 KiB block.
    PowerLoss,
    /// Single faults (with the engine's knobs drawn, as the two families above), plus one
    /// crash in the middle of the workload (see [`Scenario::crash`]): of every node at
    /// once, the Primary included (in 70% of the runs), or of the Primary alone. With no
    /// Primary left the replicas settle among themselves by their generation ids, then
    /// node 0 is promoted again.
    ClusterCrash,
    /// The power-loss family with that crash: a node crashing loses power in 70% of the
    /// cases, and so what it did not fdatasync.
    PowerLossClusterCrash,
    /// Overlapping faults (partitions of every shape, the Primary often cut off from all
    /// its peers) with quorum on (a majority; `on-no-quorum` io-error or suspend-io, half
    /// the runs each) and the engine's knobs drawn: a write is acknowledged only once it
    /// is on a majority of the replicas (protocol C), nothing acknowledged is lost, and
    /// every request held for quorum is answered once it returns.
    Quorum,
    /// The quorum family on three nodes (node 0 diskful or a diskless client), with any
    /// node becoming Primary: partitions of every shape (asymmetric ones too: two nodes
    /// cut apart, both still reaching the third), kills of the Primary (kill -9, back
    /// later), the Primary cut off from everyone, Secondaries restarted; a cluster
    /// manager that, when the Primary is dead or has lost quorum (or, now and then, when
    /// a node merely cannot see it), detaches its clients and promotes another node,
    /// refusals counted (`failover.rs`). Checked against one history across Primaries:
    /// no acknowledged write lost, reads never older than a write acknowledged before
    /// they began, and writes acknowledged by two Primaries ordered by their tenures
    /// (`history.rs`). Protocol C, or B in a quarter of the runs.
    Failover,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::Single,
        Family::Overlapping,
        Family::DiskErrors,
        Family::PowerLoss,
        Family::ClusterCrash,
        Family::PowerLossClusterCrash,
        Family::Quorum,
        Family::Failover,
    ];

    /// The run of `seed` in this family. The new families also draw the engine's knobs
    /// (ping interval, timeouts, resync chunk and window), from a stream of their own, so
    /// the first two families keep their schedules.
    pub fn scenario(self, seed: u64) -> Scenario {
        let mut sc = Scenario::random(seed);
        match self {
            Family::Single => {}
            Family::Overlapping => sc.overlapping_faults = true,
            Family::ClusterCrash | Family::PowerLossClusterCrash => {
                if self == Family::ClusterCrash {
                    sc.knobs = Knobs::drawn(seed);
                } else {
                    sc = Family::PowerLoss.scenario(seed);
                }
                // A stream of its own: the base family's draws stay as they are.
                sc.crash = Some(Crash::draw(&mut Rng::new(seed ^ 0xc7a5_0001), sc.ops));
            }
            Family::Quorum => {
                sc.overlapping_faults = true;
                sc.knobs = Knobs::drawn(seed);
                // A stream of its own.
                let on_loss = if Rng::new(seed ^ 0x9a0_0001).chance(0.5) {
                    OnNoQuorum::IoError
                } else {
                    OnNoQuorum::SuspendIo
                };
                sc.knobs.quorum = QuorumSpec {
                    quorum: Votes::Majority,
                    min_redundancy: Votes::Off,
                    on_loss,
                };
            }
            Family::Failover => {
                sc = Family::Quorum.scenario(seed);
                // Streams of their own.
                let mut r = Rng::new(seed ^ 0xfa11_0e55);
                sc.failover = true;
                sc.faults = true;
                sc.restarts = true;
                sc.lose_disks = false;
                sc.protocol = if r.chance(0.25) {
                    Protocol::B
                } else {
                    Protocol::C
                };
                // Three nodes: two cannot fail over with a majority.
                if sc.diskful.len() == 2 {
                    sc.diskful.push(true);
                    sc.no_replica.clear();
                }
                sc.ops = 400;
            }
            Family::DiskErrors | Family::PowerLoss => {
                sc.knobs = Knobs::drawn(seed);
                if self == Family::DiskErrors {
                    sc.disk_errors = true;
                    // A stream of its own: the runs whose disk dies keep their schedules.
                    sc.one_off_eio = Rng::new(seed ^ 0x0e10_5eed).chance(0.5);
                } else {
                    sc.power_loss = true;
                    sc.restarts = true;
                    sc.clean_stops = false;
                }
            }
        }
        sc
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Single => "single",
            Family::Overlapping => "overlapping",
            Family::DiskErrors => "disk-errors",
            Family::PowerLoss => "power-loss",
            Family::ClusterCrash => "cluster-crash",
            Family::PowerLossClusterCrash => "power-loss+cluster-crash",
            Family::Quorum => "quorum",
            Family::Failover => "failover",
        }
    }
}

/// The engine's knobs a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    pub ping_interval_ms: u64,
    pub ping_timeout_ms: u64,
    pub timeout_ms: u64,
    pub resync_chunk: u32,
    pub resync_window: usize,
    /// Per cent of writes, zeroings and fdatasyncs that complete inline, while the daemon
    /// carries out the engine's actions (as buffered writes and small syncs do there), the
    /// rest later: both orders the daemon can produce.
    pub inline_disk_pct: u8,
    /// The resync-rate controller's rates (see `tandem_engine::replica::ResyncRates`).
    pub resync_rates: ResyncRates,
    /// Flushes go through the daemon's `tandem_engine::sync_plan` (which fdatasync answers
    /// which flush, syncing ahead) instead of one fdatasync each.
    pub sync_plan: bool,
    /// Quorum (off in the families that predate it).
    pub quorum: QuorumSpec,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            ping_interval_ms: 200,
            ping_timeout_ms: 100,
            timeout_ms: 2_000,
            resync_chunk: 16 << 10,
            resync_window: 4,
            inline_disk_pct: 0,
            sync_plan: false,
            resync_rates: ResyncRates::UNLIMITED,
            quorum: QuorumSpec::OFF,
        }
    }
}

impl Knobs {
    /// The knobs of the families that draw them, from streams of their own (so the first
    /// two families keep their schedules): half the runs pace their resyncs (volumes are
    /// 256 KiB here).
    fn drawn(seed: u64) -> Knobs {
        let mut knobs = Knobs::default();
        knobs.randomize(&mut Rng::new(seed ^ 0xfa17_5eed));
        let mut r = Rng::new(seed ^ 0x7a7e_5eed);
        if r.chance(0.5) {
            let min = [0, 64 << 10, 512 << 10][r.below(3) as usize];
            let max = [0, 1 << 20][r.below(2) as usize];
            knobs.resync_rates = ResyncRates {
                min,
                max,
                plan_ahead_ms: [0, 300, 2_000][r.below(3) as usize],
                fill_target: [0, 0, 64 << 10][r.below(3) as usize],
                delay_target_ms: [5, 20, 100][r.below(3) as usize],
            };
        }
        knobs
    }

    fn randomize(&mut self, r: &mut Rng) {
        self.ping_interval_ms = [50, 200, 1_000][r.below(3) as usize];
        self.ping_timeout_ms = [50, 100, 500][r.below(3) as usize];
        self.timeout_ms = [500, 2_000, 6_000][r.below(3) as usize];
        self.resync_chunk = [4 << 10, 16 << 10, 64 << 10][r.below(3) as usize];
        self.resync_window = 1 + r.below(8) as usize;
        self.inline_disk_pct = [0, 50, 100][r.below(3) as usize];
        self.sync_plan = r.chance(0.5);
    }
}

/// One volume's replica as a clean stop left it.
pub(crate) struct KeptVolume {
    consistent: bool,
    gen: GenIds,
    /// Per diskful peer: what it lacks, whether we wrote apart from it, the bitmap's id.
    peers: Vec<(NodeId, Vec<u64>, bool, Option<u64>)>,
}

impl Sim {
    pub(crate) fn fault(&mut self) {
        if self.sc.failover {
            self.failover_fault();
            return;
        }
        if !self.sc.overlapping_faults && !self.healthy() {
            // One failure at a time: the next waits until the last one has healed.
            self.at(5_000, Ev::Fault);
            return;
        }
        let n = self.nodes.len() as NodeId;
        let a = self.rng.below(u64::from(n)) as NodeId;
        let b = (a + 1 + self.rng.below(u64::from(n) - 1) as NodeId) % n;
        if self.sc.stalls
            && a != 0
            && self.stalled(a).is_none()
            && !self.node_failed(a as usize)
            && self.stall_rng.chance(0.4)
        {
            self.stall(a);
        } else if self.sc.disk_errors && !self.disk_fault && self.fault_rng.chance(0.3) {
            self.fail_disk();
        } else if self.sc.restarts
            && a != 0
            && !self.node_failed(a as usize)
            && self.rng.chance(0.4)
        {
            self.restart(a);
        } else if self.sc.faults {
            self.cut(a.min(b), a.max(b), None);
            let t = 2_000 + self.rng.below(60_000);
            self.at(
                t,
                Ev::Heal {
                    a: a.min(b),
                    b: a.max(b),
                },
            );
        }
        if self.issued < self.sc.ops {
            let t = 5_000 + self.rng.below(40_000);
            self.at(t, Ev::Fault);
        }
    }

    /// kill -9 of a secondary: the page cache keeps what was written; the engine's memory is
    /// gone, so it comes back not knowing whether it is current. A power loss (see
    /// [`Scenario::power_loss`]) loses, per 4 KiB block, some of what was not fdatasync'ed.
    pub(crate) fn restart(&mut self, node: NodeId) {
        self.note(format!("restart node {node}"));
        self.restarts += 1;
        // kill -9 ends a stall too: the new process runs.
        self.end_stall(node);
        // After a disk failed, a replica may be the last of its volume: losing what it
        // holds too would be a second failure at once, which loses data no engine can keep.
        let one_failure = !self.disk_fault;
        // What its metadata says at the crash: per volume whether the replica was
        // consistent (the daemon writes that flag before any write could change it) and
        // what its activity log names (see `Disk::unsynced_blocks`).
        // The generation ids and the Primary flag: the daemon writes both to the metadata
        // (synced) before the actions that follow their change.
        let gens: Vec<Option<IdsAtCrash>> = (0..self.sc.sizes.len() as u16)
            .map(|v| self.nodes[node as usize].engine.ids_at_crash(v))
            .collect();
        let was_primary = self.nodes[node as usize].engine.role() == Role::Primary;
        // The Primary's run it took writes from: the daemon writes it to the metadata
        // (synced) before the actions that follow its change, and trusts it only after a
        // crash of the process alone (the same boot).
        let writer = self.nodes[node as usize].engine.writer();
        // The bitmaps' ids, written before the actions that follow their change: as they
        // are before the links drop (a crashed engine hears of no drop).
        let bitmap_gis: Vec<Vec<Option<u64>>> = (0..self.sc.sizes.len() as u16)
            .map(|v| {
                (0..self.nodes.len() as NodeId)
                    .map(|p| self.nodes[node as usize].engine.bitmap_gi(v, p))
                    .collect()
            })
            .collect();
        let held_power_loss: Vec<bool> = (0..self.sc.sizes.len() as u16)
            .map(|v| self.nodes[node as usize].engine.lost_power(v))
            .collect();
        let at_crash: Vec<(bool, Vec<(u64, u64)>)> = (0..self.sc.sizes.len())
            .map(|v| {
                let n = &self.nodes[node as usize];
                let replica = self.sc.replica(node as usize, v);
                let consistent = replica && n.engine.consistent(v as u16);
                let suspect = if consistent {
                    // With the suspect ranges of a crash not proven yet: the daemon keeps
                    // them in the log (or the unsynced map) until proven.
                    let mut s = n.disk.unsynced_blocks(v);
                    s.extend(n.engine.suspect_ranges(v as u16));
                    s
                } else {
                    Vec::new()
                };
                (consistent, suspect)
            })
            .collect();
        let mut power_lost = false;
        if self.sc.power_loss && one_failure && self.fault_rng.chance(0.7) {
            power_lost = true;
            let (reverted, _) = self.nodes[node as usize]
                .disk
                .lose_power(&mut self.fault_rng);
            self.power_losses += 1;
            self.sectors_reverted += reverted;
            self.note(format!(
                "node {node} lost power: {reverted} sectors back to their last fdatasync"
            ));
        }
        for other in 0..self.nodes.len() as NodeId {
            if other != node {
                self.cut(node.min(other), node.max(other), None);
            }
        }
        // What its metadata kept of what each peer lacks: `tandem node` writes a bitmap
        // page when its extent leaves the activity log and, after a crash, restores the
        // pages plus the log's extents for every peer, a superset of the bitmap at the
        // crash; here, that bitmap (links down: unconfirmed writes are marked) and the
        // suspect blocks.
        let kept_bitmaps: Vec<Vec<KeptBitmap>> = at_crash
            .iter()
            .enumerate()
            .map(|(v, (consistent, suspect))| {
                let n = &self.nodes[node as usize];
                (0..self.nodes.len() as NodeId)
                    .filter(|&p| *consistent && p != node && self.sc.replica(p as usize, v))
                    .filter_map(|p| {
                        let mut words = n.engine.out_of_sync_words(v as u16, p)?.to_vec();
                        // Its activity log's extents, for every peer, as the daemon does.
                        for &(offset, len) in suspect {
                            for b in offset / 4096..(offset + len).div_ceil(4096) {
                                words[(b / 64) as usize] |= 1 << (b % 64);
                            }
                        }
                        Some((p, words, bitmap_gis[v][p as usize]))
                    })
                    .collect()
            })
            .collect();
        let lost = self.sc.lose_disks
            && !self.sc.overlapping_faults
            && self.rng.chance(0.5)
            && one_failure;
        let clean = self.sc.clean_stops && !power_lost && !lost && self.clean_rng.chance(0.5);
        let kept = clean.then(|| self.stop_cleanly(node)).flatten();
        self.new_process(node, lost);
        let n = &mut self.nodes[node as usize];
        let found = (0..self.sc.sizes.len())
            .map(|v| match () {
                _ if !self.sc.replica(node as usize, v) => ReplicaAtStart::None,
                _ if lost => ReplicaAtStart::Created,
                _ if at_crash[v].0 => ReplicaAtStart::Crashed,
                _ => ReplicaAtStart::Existing,
            })
            .collect();
        n.engine = Resource::new(spec(&self.sc, node, n.incarnation), found);
        if !lost && kept.is_none() {
            for (v, (consistent, suspect)) in at_crash.into_iter().enumerate() {
                if consistent {
                    self.crash_starts += 1;
                    self.suspect_bytes += suspect.iter().map(|&(_, len)| len).sum::<u64>();
                    // The only replica (nothing to pull from) keeps none.
                    let _ = n.engine.restore_suspect(v as u16, suspect);
                    // Suspect ranges of a power loss still held, or this crash is one:
                    // the daemon finds the boot unknown, and trusts no run.
                    let lost_power = power_lost || held_power_loss[v];
                    if let Some(run) = writer.filter(|_| !lost_power) {
                        let _ = n.engine.restore_writer(v as u16, run);
                    }
                    if lost_power {
                        let _ = n.engine.restore_lost_power(v as u16);
                    }
                    for (peer, words, gi) in &kept_bitmaps[v] {
                        n.engine
                            .restore_peer(v as u16, *peer, words, false, *gi)
                            .expect("restored into a crashed start");
                    }
                }
                // The daemon restores every replica's ids, consistent or not (as
                // `start_after_crash` does): one that crashed Inconsistent came back
                // here with none, which no daemon does.
                if let Some(ids) = gens[v] {
                    n.engine
                        .restore_ids(v as u16, ids, was_primary)
                        .expect("a replica's generation ids");
                }
            }
        }
        if let Some(kept) = kept {
            self.start_from_metadata(node, kept);
        }
        if lost {
            self.disks_lost += 1;
            self.note(format!("node {node} lost its disks"));
        }
        self.at(30_000, Ev::Restart { node });
    }

    /// The node's links are down: what its engine keeps per volume across a clean stop
    /// (the metadata the daemon writes): consistent or not, and per peer the blocks it
    /// lacks and whether we wrote them as Primary apart from it. `None` if writes of a
    /// Primary are not settled here: the daemon then leaves that volume's metadata as
    /// after a crash (`NotQuiet::Unsettled`); here the whole node restarts as after a
    /// crash of its process (every volume: a superset of what the daemon pulls).
    fn stop_cleanly(&mut self, node: NodeId) -> Option<Vec<Option<KeptVolume>>> {
        self.note(format!("node {node} stops cleanly"));
        // `tandem node` lets the peers' writes it received land before it takes the state
        // (`peers_gone`): a replica stopped with writes still landing would start unproven,
        // and the only replica of a volume would then never be proven again (disk-errors
        // seed 4826: the Primary's own disk had failed).
        for _ in 0..10_000 {
            let n = &self.nodes[node as usize];
            if !n.engine.writes_landing() {
                break;
            }
            let Some(op) = n
                .ops
                .iter()
                .find(|(_, st)| st.incarnation == n.incarnation)
                .map(|(&op, _)| op)
            else {
                break;
            };
            self.disk_done(node, op);
        }
        let engine = &self.nodes[node as usize].engine;
        // Per volume, taken once: a refusal as Unsettled leaves the node as after a crash.
        let kept: Result<Vec<Option<KeptVolume>>, NotQuiet> = (0..self.sc.sizes.len() as u16)
            .map(|v| {
                if !self.sc.replica(node as usize, v as usize) {
                    return Ok(None);
                }
                let kept = engine.persisted(v)?;
                let peers = (kept.peers.iter())
                    .map(|p| {
                        let words = p.out_of_sync.words().to_vec();
                        (p.node, words, p.wrote_apart, p.bitmap_gi)
                    })
                    .collect();
                Ok(Some(KeptVolume {
                    consistent: kept.consistent,
                    gen: *engine.generation(v).expect("a replica"),
                    peers,
                }))
            })
            .collect();
        let kept = match kept {
            Ok(kept) => kept,
            Err(e @ (NotQuiet::Unsettled(_) | NotQuiet::Unproven(_))) => {
                self.note(format!("node {node}: {e}; left as after a crash"));
                return None;
            }
            Err(e) => panic!("seed {}: a clean stop: {e}", self.sc.seed),
        };
        self.clean_stops += 1;
        Some(kept)
    }

    /// A node whose links are down stops cleanly and starts again from its metadata (a
    /// Secondary shut down with SIGTERM while the rest of the cluster crashes): its
    /// engine is told each peer is gone, as `tandem node` tells it at a clean stop.
    /// `false`: it could not (writes not settled), and is to start as after a crash.
    pub(crate) fn stop_and_start_cleanly(&mut self, node: NodeId) -> bool {
        for other in (0..self.nodes.len() as NodeId).filter(|&o| o != node) {
            let mut out = Vec::new();
            self.nodes[node as usize].engine.peer_down(other, &mut out);
            self.run_actions(node, out, &Inputs::default());
        }
        let Some(kept) = self.stop_cleanly(node) else {
            return false;
        };
        self.new_process(node, false);
        self.start_from_metadata(node, kept);
        true
    }

    /// Node `node`'s process starts again (its engine is made by the caller): nothing in
    /// flight, nothing detached, its disk wiped if `lost`. `tandem node` fdatasyncs every
    /// backing file before it serves: what the page cache kept through a kill -9 is
    /// durable before the first flush is answered (seed 97 of the crash family: a fresh
    /// sync plan answered it without a sync).
    pub(crate) fn new_process(&mut self, node: NodeId, lost: bool) {
        self.detached[node as usize].fill(false);
        let n = &mut self.nodes[node as usize];
        n.incarnation += 1;
        n.ops.clear();
        n.data.clear();
        n.syncs = SyncPlan::default();
        if lost {
            n.disk.wipe();
        }
        let all = n.disk.covers();
        n.disk.synced(all);
    }

    /// A new engine from what a clean stop kept.
    fn start_from_metadata(&mut self, node: NodeId, kept: Vec<Option<KeptVolume>>) {
        let found = kept
            .iter()
            .map(|k| match k {
                None => ReplicaAtStart::None,
                Some(k) => ReplicaAtStart::after_clean_stop(k.consistent),
            })
            .collect();
        let n = &mut self.nodes[node as usize];
        n.engine = Resource::new(spec(&self.sc, node, n.incarnation), found);
        for (v, k) in kept.iter().enumerate() {
            if let Some(k) = k {
                n.engine
                    .restore_generation(v as u16, k.gen, false)
                    .expect("a replica's generation ids");
            }
            // Consistent or not (`ReplicaAtStart::Inconsistent`): a clean stop writes them.
            for (peer, words, apart, gi) in k.iter().flat_map(|k| &k.peers) {
                n.engine
                    .restore_peer(v as u16, *peer, words, *apart, *gi)
                    .expect("restored at a start from metadata");
            }
        }
    }

    pub(crate) fn rejoin(&mut self, node: NodeId) {
        for other in 0..self.nodes.len() as NodeId {
            if other != node
                && !self.links.get(&(node, other)).is_some_and(|l| l.up)
                // A killed node dials once its process is back (`failover.rs`).
                && !self.fo.dead(other, self.now)
            {
                let (a, b) = (node.min(other), node.max(other));
                if self.stopped_or_resuming(other) {
                    // Met once it runs again (see `stall.rs`).
                    self.at(1, Ev::Heal { a, b });
                } else {
                    self.connect(a, b);
                }
            }
        }
    }
}
