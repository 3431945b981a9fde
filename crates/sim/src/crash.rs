//! Crashes in the middle of the workload: of every node at once (kill -9, or a power loss
//! per node in the power-loss family), or of the Primary alone. Requests in flight are
//! abandoned: the application saw no answer, so they may or may not have happened. Every
//! crashed node starts a new engine from what its metadata kept at that instant (consistent
//! or not, its activity log's extents, its bitmaps, its generation ids, the Primary flag);
//! with no Primary left the replicas must settle among themselves (the engine's generation
//! ids rank them) before node 0 is promoted again and the workload goes on.

use crate::disk::stamp_of;
use crate::faults::KeptBitmap;
use crate::rng::Rng;
use crate::{spec, Ev, Pending, Sim, WriteRec, STUCK_AFTER_US};
use tandem_engine::driver::Inputs;
use tandem_engine::replica::{
    DiskState, IdsAtCrash, Msg, NodeId, Protocol, ReplicaAtStart, Resource, Role,
};
use tandem_engine::DiskKind;

/// A crash in the middle of the workload (see [`crate::Scenario::crash`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    /// It comes `delay_us` (simulated) after the workload issued its `after_ops`-th
    /// request.
    pub after_ops: usize,
    pub delay_us: u64,
    /// Only node 0, the Primary, crashes, once the cluster is healthy: one failure at a
    /// time, as in the single family (a Secondary cut off then is still UpToDate, and
    /// promoting node 0 with it alone in reach is the failover quorum is to guard). Else
    /// every node crashes at once, whatever else is failing then: ordering such replicas
    /// is what generation ids are for.
    pub primary_only: bool,
    /// Node 0 asks to be Primary again from the restart on, and is refused until some
    /// replica of every volume is UpToDate; else it waits until every replica is, settled
    /// among themselves with no Primary.
    pub eager_promote: bool,
}

impl Crash {
    pub(crate) fn draw(r: &mut Rng, ops: usize) -> Crash {
        Crash {
            after_ops: 1 + r.below(ops as u64 - 1) as usize,
            delay_us: r.below(2_000),
            primary_only: r.chance(0.3),
            eager_promote: r.chance(0.5),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not yet: the workload has not issued enough requests.
    Ahead,
    /// Scheduled (or, for the Primary alone, waiting for the cluster to be healthy).
    Due,
    /// Node 0 is not Primary again yet.
    Promoting { since: u64 },
    /// Done, or none in this run.
    Over,
}

/// Where a run's crash stands, its draws, and what it did.
pub(crate) struct CrashState {
    phase: Phase,
    /// Which nodes lose power, and when they dial again: a stream of its own, apart
    /// from the other families' schedules.
    rng: Rng,
    pub(crate) cluster_crashes: usize,
    pub(crate) primary_crashes: usize,
    pub(crate) diskful_primary_crashed: bool,
    pub(crate) abandoned: usize,
    pub(crate) lossy: usize,
    pub(crate) promote_refusals: usize,
    pub(crate) promoted_after_us: u64,
    pub(crate) proven_by_generation: usize,
    pub(crate) generation_changes: usize,
    pub(crate) older_listed_bitmap: usize,
    pub(crate) older_listed_full: usize,
}

impl CrashState {
    pub(crate) fn new(seed: u64, configured: bool) -> CrashState {
        CrashState {
            phase: if configured {
                Phase::Ahead
            } else {
                Phase::Over
            },
            rng: Rng::new(seed ^ 0xc7a5_5eed),
            cluster_crashes: 0,
            primary_crashes: 0,
            diskful_primary_crashed: false,
            abandoned: 0,
            lossy: 0,
            promote_refusals: 0,
            promoted_after_us: 0,
            proven_by_generation: 0,
            generation_changes: 0,
            older_listed_bitmap: 0,
            older_listed_full: 0,
        }
    }

    /// Node 0 crashed and is not Primary again: no request can be submitted.
    pub(crate) fn awaits_promotion(&self) -> bool {
        matches!(self.phase, Phase::Promoting { .. })
    }

    /// The run must not end yet: its crash, or the promotion after it, is still to come.
    pub(crate) fn outstanding(&self) -> bool {
        self.phase != Phase::Over
    }
}

/// What a crashed node's metadata says of its replica of one volume.
struct KeptVolume {
    replica: bool,
    consistent: bool,
    /// Its activity log's extents: at least every block no fdatasync made durable, and
    /// the writes in flight here (see [`Sim::held_in_log`]).
    suspect: Vec<(u64, u64)>,
    gen: Option<IdsAtCrash>,
    /// Its suspect ranges are still those of a crash in another boot (or this crash is
    /// one): the daemon finds the boot unknown then, and says so to the engine.
    lost_power: bool,
    /// Per diskful peer, the blocks it may lack: the bitmap at the crash and the log's
    /// extents, as `tandem node` restores them; and the bitmap's id.
    peers: Vec<KeptBitmap>,
}

pub(crate) struct KeptNode {
    was_primary: bool,
    /// The Primary's run it took writes from (see `Sim::restart`); none after a power
    /// loss (another boot: the daemon does not trust it then).
    writer: Option<tandem_engine::replica::PrimaryRun>,
    vols: Vec<KeptVolume>,
}

impl KeptNode {
    /// The crash took the page cache too (another boot).
    fn lost_power(&mut self) {
        self.writer = None;
        for k in &mut self.vols {
            k.lost_power = k.consistent;
        }
    }
}

impl Sim {
    /// The workload issued enough requests: the crash is scheduled.
    pub(crate) fn crash_when_due(&mut self) {
        if self.crash.phase != Phase::Ahead {
            return;
        }
        let c = self.sc.crash.expect("a crash when its phase is Ahead");
        if self.issued >= c.after_ops {
            self.crash.phase = Phase::Due;
            self.at(c.delay_us, Ev::Crash);
        }
    }

    pub(crate) fn crash(&mut self) {
        let c = self.sc.crash.expect("a crash scheduled");
        if c.primary_only && !self.healthy() {
            self.at(5_000, Ev::Crash);
            return;
        }
        let since = self.now;
        if c.primary_only {
            self.crash_primary();
            // Its first try comes right after it rejoins (`Ev::Restart` at the same instant).
            self.at(30_000, Ev::Repromote);
        } else {
            self.crash_cluster();
            self.at(5_000, Ev::Repromote);
        }
        self.crash.phase = Phase::Promoting { since };
    }

    /// Every node at once: no engine hears of it (each dies with its links), and no
    /// answer reaches the application for what was in flight. Some Secondaries keeping a
    /// replica stop cleanly instead (a shutdown, while the others crash): what they keep
    /// is their metadata's, bitmap ids included.
    fn crash_cluster(&mut self) {
        let n = self.nodes.len();
        self.note("every node crashes".into());
        self.crash.cluster_crashes += 1;
        self.check_reads_so_far();
        let kept: Vec<KeptNode> = (0..n).map(|i| self.kept_at_crash(i)).collect();
        let power: Vec<bool> = (0..n)
            .map(|i| self.sc.power_loss && self.sc.any_replica(i) && self.crash.rng.chance(0.7))
            .collect();
        let clean: Vec<bool> = (0..n)
            .map(|i| i != 0 && !power[i] && self.sc.any_replica(i) && self.crash.rng.chance(0.4))
            .collect();
        self.mark_lossy(0, true, power.contains(&true));
        self.abandon_requests(None);
        for l in self.links.values_mut() {
            l.up = false;
            l.queue.clear();
        }
        for (i, &lost) in power.iter().enumerate() {
            if lost {
                self.lose_power(i);
            }
        }
        for (i, mut k) in kept.into_iter().enumerate() {
            if clean[i] {
                self.note(format!("node {i} stops cleanly instead"));
                if self.stop_and_start_cleanly(i as NodeId) {
                    continue;
                }
            }
            if power[i] {
                k.lost_power();
            }
            self.start_after_crash(i as NodeId, k);
        }
        // Each pair meets when the later of the two is back and dials: in any order.
        for a in 0..n as NodeId {
            for b in a + 1..n as NodeId {
                let t = 10_000 + self.crash.rng.below(50_000);
                self.at(t, Ev::Heal { a, b });
            }
        }
    }

    /// The Primary alone: its peers see it go (and keep what they received), it comes back
    /// 30 ms later as a Secondary.
    fn crash_primary(&mut self) {
        self.note("node 0, the Primary, crashes".into());
        self.crash.primary_crashes += 1;
        self.crash.diskful_primary_crashed = self.sc.any_replica(0);
        self.check_reads_so_far();
        let mut kept = self.kept_at_crash(0);
        let power = self.sc.power_loss && self.sc.any_replica(0) && self.crash.rng.chance(0.7);
        if power {
            kept.lost_power();
        }
        self.mark_lossy(0, false, power);
        self.abandon_requests(None);
        for other in 1..self.nodes.len() as NodeId {
            self.cut(0, other, Some(0));
        }
        if power {
            self.lose_power(0);
        }
        self.start_after_crash(0, kept);
        self.at(30_000, Ev::Restart { node: 0 });
    }

    /// Node 0 asks to be Primary again (see [`Crash::eager_promote`]), until it is; not
    /// within [`STUCK_AFTER_US`] of the crash fails the run.
    pub(crate) fn repromote(&mut self) {
        let Phase::Promoting { since } = self.crash.phase else {
            return;
        };
        let c = self.sc.crash.expect("a crash happened");
        let ready = c.eager_promote || self.settled_without_primary();
        let mut refused = None;
        if ready {
            let mut out = Vec::new();
            let result = self.nodes[0].engine.promote(false, &mut out);
            self.run_actions(0, out, &Inputs::default());
            match result {
                Ok(()) => {
                    let after = self.now - since;
                    self.note(format!("node 0 Primary again, {after} µs after the crash"));
                    self.crash.promoted_after_us = after;
                    self.crash.phase = Phase::Over;
                    self.at(1, Ev::Workload);
                    return;
                }
                Err(e) => {
                    self.crash.promote_refusals += 1;
                    refused = Some(e);
                }
            }
        }
        if self.now - since > STUCK_AFTER_US {
            let status: Vec<_> = self.nodes.iter().map(|n| n.engine.status()).collect();
            panic!(
                "seed {}: node 0 is not Primary again {} s after the crash ({}; last refusal {refused:?})\n{:?}\n{status:#?}\n{}",
                self.sc.seed,
                STUCK_AFTER_US / 1_000_000,
                if ready {
                    "promotion refused"
                } else {
                    "the replicas never all became UpToDate among themselves"
                },
                self.sc,
                self.tail_log(300)
            );
        }
        self.at(5_000, Ev::Repromote);
    }

    /// Every live replica is UpToDate by its own engine's account.
    fn settled_without_primary(&self) -> bool {
        (0..self.nodes.len()).all(|i| {
            (0..self.sc.sizes.len()).all(|v| {
                !self.live_replica(i, v)
                    || self.nodes[i].engine.disk(v as u16) == DiskState::UpToDate
            })
        })
    }

    /// Reads answered before the crash, checked against what was acknowledged then (a
    /// write the crash may take counts as in flight afterwards, which would let these
    /// pass with less).
    pub(crate) fn check_reads_so_far(&self) {
        for r in &self.reads {
            self.check_read(r);
        }
    }

    /// What node `i`'s metadata says at this instant. The daemon writes the consistent
    /// flag, the generation ids, the Primary flag and the bitmaps' ids before the actions
    /// that follow their change, and a bitmap page when its extent leaves the activity log.
    pub(crate) fn kept_at_crash(&self, i: usize) -> KeptNode {
        let n = &self.nodes[i];
        let vols = (0..self.sc.sizes.len())
            .map(|v| {
                let replica = self.sc.replica(i, v);
                let consistent = replica && n.engine.consistent(v as u16);
                let suspect = if consistent {
                    self.held_in_log(i, v)
                } else {
                    Vec::new()
                };
                let peers = (0..self.nodes.len() as NodeId)
                    .filter(|&p| consistent && p as usize != i && self.sc.replica(p as usize, v))
                    .filter_map(|p| {
                        let mut words = n.engine.out_of_sync_words(v as u16, p)?.to_vec();
                        for &(offset, len) in &suspect {
                            for b in offset / 4096..(offset + len).div_ceil(4096) {
                                words[(b / 64) as usize] |= 1 << (b % 64);
                            }
                        }
                        Some((p, words, n.engine.bitmap_gi(v as u16, p)))
                    })
                    .collect();
                KeptVolume {
                    replica,
                    consistent,
                    suspect,
                    gen: n.engine.ids_at_crash(v as u16),
                    lost_power: consistent && n.engine.lost_power(v as u16),
                    peers,
                }
            })
            .collect();
        KeptNode {
            was_primary: n.engine.role() == Role::Primary,
            writer: n.engine.writer(),
            vols,
        }
    }

    /// The least node `i`'s activity log names for volume `v` at a crash: blocks written
    /// since the last fdatasync (what a power loss may take; a block a write then a
    /// zeroing left as it was durable counts too, since a peer may hold the write), writes
    /// issued to its disk and not completed, a Primary's writes received here and not
    /// settled (see `RAction::Settled`), and on the Primary its application writes issued locally and not yet
    /// answered (held until answered: a peer may have them when this node does not).
    fn held_in_log(&self, i: usize, v: usize) -> Vec<(u64, u64)> {
        let n = &self.nodes[i];
        let mut ranges = n.disk.unsynced_blocks(v);
        ranges.extend(n.disk.written_since_sync(v));
        for st in n.ops.values() {
            if st.volume as usize != v || st.incarnation != n.incarnation {
                continue;
            }
            match st.kind {
                DiskKind::Write { offset, len }
                | DiskKind::Zero { offset, len, .. }
                | DiskKind::Trim { offset, len } => ranges.push((offset, u64::from(len))),
                _ => {}
            }
        }
        // A Primary's writes stay in a receiving replica's log until settled everywhere
        // (the engine's peer acks, `RAction::Settled`), or compared with the other
        // replicas once that Primary is lost.
        ranges.extend(n.engine.unsettled_writes(v as u16));
        // A replica back from a crash and not proven yet keeps its suspect ranges (the
        // daemon keeps those extents in the log, or in the unsynced map, until proven).
        ranges.extend(n.engine.suspect_ranges(v as u16));
        if i == 0 || self.sc.failover {
            for (req, p) in &self.pending {
                if self.req_node.get(req) != Some(&(i as NodeId)) {
                    continue;
                }
                if let Pending::Write { idx, .. } = p {
                    let w = &self.writes[*idx];
                    if w.volume as usize == v && w.applied_on & (1 << i) != 0 {
                        ranges.push((w.offset, w.len));
                    }
                }
            }
            // DRBD's transfer log: a write stays in the log until every replica it went to
            // wrote it or is marked lacking it (`RAction::WriteSettled`), even once
            // answered (under protocol A that is before a peer has it).
            ranges.extend(n.engine.unsettled_own_writes(v as u16));
        }
        ranges
    }

    /// Acknowledged writes this crash may take: checked from now on as writes that were in
    /// flight (allowed, not required). Every node at once: with a power loss, those no
    /// FLUSH or FUA made durable; and, the Primary keeping no replica of the volume (it
    /// wins no contest), those acknowledged under protocol B (received, not yet written)
    /// while a peer they went to had not written them, connected or not (seed 147009225:
    /// a Secondary whose link dropped just before the crash had received a write and not
    /// written it, won the contest by its node id, and its version stood: what protocol B
    /// allows whether or not the link dropped first). The Primary alone: under
    /// protocol A, those a peer still connected had not written (maybe not received); with
    /// its power lost, those not durable that no peer still connected had written.
    pub(crate) fn mark_lossy(&mut self, node: NodeId, every_node: bool, power_lost: bool) {
        let two_failures = self.sc.overlapping_faults || self.any_failed();
        for k in 0..self.writes.len() {
            let w = &self.writes[k];
            if !w.ok || w.completed.is_none() {
                continue;
            }
            // With failover, only the writes the crashed Primary acknowledged.
            if self.sc.failover && w.acked_by != Some(node) {
                continue;
            }
            let primary_keeps = self.sc.replica(node as usize, w.volume as usize);
            let unwritten = self.unwritten_on_a_peer(node, w);
            let lossy = if every_node {
                let unwritten_anywhere =
                    w.sent.iter().any(|&(to, _)| w.applied_on & (1 << to) == 0);
                (power_lost && !self.durable_promised(w, two_failures))
                    || (!primary_keeps && self.sc.protocol != Protocol::C && unwritten_anywhere)
            } else {
                primary_keeps
                    && ((self.sc.protocol == Protocol::A && unwritten)
                        || (power_lost
                            && !self.durable_promised(w, two_failures)
                            && !self.written_on_a_peer(node, w)))
            };
            if lossy {
                self.note(format!(
                    "write {} (volume {} {}+{}) acknowledged, may be lost with the crash",
                    w.stamp, w.volume, w.offset, w.len
                ));
                self.writes[k].ok = false;
                self.crash.lossy += 1;
            }
        }
    }

    /// Some peer still connected on the connection it was sent on has not written it.
    fn unwritten_on_a_peer(&self, node: NodeId, w: &WriteRec) -> bool {
        w.sent
            .iter()
            .any(|&(to, conn)| w.applied_on & (1 << to) == 0 && self.still_on(node, to, conn))
    }

    /// Some peer still connected on the connection it was sent on has written it.
    fn written_on_a_peer(&self, node: NodeId, w: &WriteRec) -> bool {
        w.sent
            .iter()
            .any(|&(to, conn)| w.applied_on & (1 << to) != 0 && self.still_on(node, to, conn))
    }

    fn still_on(&self, node: NodeId, peer: NodeId, conn: u64) -> bool {
        self.links
            .get(&(node, peer))
            .is_some_and(|l| l.up && l.conn == conn)
    }

    /// A FUA write, or one completed before a successful FLUSH was submitted (for every
    /// volume, as `check_flush` holds, unless two failures at once).
    fn durable_promised(&self, w: &WriteRec, two_failures: bool) -> bool {
        w.fua
            || self
                .flushes_done
                .iter()
                .any(|&(v, submitted)| w.order < submitted && (!two_failures || v == w.volume))
    }

    /// The application sees no answer to what was in flight: a write among them may have
    /// landed anywhere, or nowhere.
    /// Those of node `only` alone, if given.
    pub(crate) fn abandon_requests(&mut self, only: Option<NodeId>) {
        let all = std::mem::take(&mut self.pending);
        for (req, p) in all {
            if only.is_some_and(|n| self.req_node.get(&req) != Some(&n)) {
                self.pending.insert(req, p);
                continue;
            }
            self.req_node.remove(&req);
            self.crash.abandoned += 1;
            self.note(format!("{req:?} abandoned (no answer)"));
            if let Pending::Write { idx, .. } = p {
                self.clock += 1;
                let w = &mut self.writes[idx];
                w.completed = Some(self.now);
                w.order = self.clock;
                w.ok = false;
            }
        }
    }

    fn lose_power(&mut self, i: usize) {
        let (reverted, _) = self.nodes[i].disk.lose_power(&mut self.crash.rng);
        self.power_losses += 1;
        self.sectors_reverted += reverted;
        self.note(format!(
            "node {i} lost power: {reverted} sectors back to their last fdatasync"
        ));
    }

    /// A new engine for a crashed node, from what its metadata kept (as `tandem node`
    /// restores it); its links come up later.
    pub(crate) fn start_after_crash(&mut self, node: NodeId, kept: KeptNode) {
        let i = node as usize;
        self.new_process(node, false);
        let n = &mut self.nodes[i];
        let found = kept
            .vols
            .iter()
            .map(|k| match () {
                _ if !k.replica => ReplicaAtStart::None,
                _ if k.consistent => ReplicaAtStart::Crashed,
                _ => ReplicaAtStart::Existing,
            })
            .collect();
        n.engine = Resource::new(spec(&self.sc, node, n.incarnation), found);
        for (v, k) in kept.vols.into_iter().enumerate() {
            let volume = v as u16;
            if k.consistent {
                self.crash_starts += 1;
                self.suspect_bytes += k.suspect.iter().map(|&(_, len)| len).sum::<u64>();
                // The only replica (nothing to pull from) keeps none.
                let _ = n.engine.restore_suspect(volume, k.suspect);
                // The daemon trusts the run only after a crash of the process alone.
                if let Some(run) = kept.writer.filter(|_| !k.lost_power) {
                    let _ = n.engine.restore_writer(volume, run);
                }
                if k.lost_power {
                    let _ = n.engine.restore_lost_power(volume);
                }
                for (peer, words, gi) in &k.peers {
                    n.engine
                        .restore_peer(volume, *peer, words, false, *gi)
                        .expect("restored into a crashed start");
                }
            }
            // The daemon restores every replica's ids, consistent or not.
            if let Some(ids) = k.gen {
                n.engine
                    .restore_ids(volume, ids, kept.was_primary)
                    .expect("a replica's generation ids");
            }
        }
    }

    /// The Primary sent a write to `to`: which peers may hold it is known at a crash.
    pub(crate) fn sent_write(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: &Msg,
        payload: Option<&[u8]>,
    ) {
        let Some(conn) = self.links.get(&(from, to)).map(|l| l.conn) else {
            return;
        };
        let w = match *msg {
            Msg::Write { .. } => {
                let stamp = stamp_of(payload.expect("a write's payload"));
                self.writes
                    .iter_mut()
                    .rev()
                    .find(|w| w.stamp == stamp && !w.zero)
            }
            // Never two overlapping writes in flight: the range names it.
            Msg::Zero {
                volume,
                offset,
                len,
                ..
            } => self.writes.iter_mut().rev().find(|w| {
                w.zero
                    && w.completed.is_none()
                    && w.volume == volume
                    && w.offset == offset
                    && w.len == u64::from(len)
            }),
            _ => None,
        };
        if let Some(w) = w {
            w.sent.push((to, conn));
        }
    }
}
