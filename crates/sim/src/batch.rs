//! Runs of many seeds: a digest that proves a refactoring changed nothing, and the
//! coverage a family reached.

use crate::{Family, Outcome, Sim};

/// A fingerprint of how seeds `from..from + count` ran (requests completed and failed,
/// resyncs, events, convergence): equal before and after a refactoring that must not
/// change behaviour. `tandem-sim FROM COUNT [--overlapping] --digest` prints it.
pub fn digest_seeds(from: u64, count: u64, overlapping: bool) -> u64 {
    let family = if overlapping {
        Family::Overlapping
    } else {
        Family::Single
    };
    digest_family(from, count, family)
}

/// [`digest_seeds`] for any fault family.
pub fn digest_family(from: u64, count: u64, family: Family) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for seed in from..from + count {
        let o = Sim::new(family.scenario(seed)).run();
        for x in [
            seed,
            o.completed as u64,
            o.failed as u64,
            o.resyncs as u64,
            o.events,
            u64::from(o.converged),
        ] {
            h = (h ^ x).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Runs seeds `from..from + count` with single faults; returns the seeds that ended
/// without an up-to-date replica (see [`run_seeds_with`]), or the first failing seed's
/// panic message.
pub fn run_seeds(from: u64, count: u64) -> Result<Vec<u64>, String> {
    run_seeds_with(from, count, false)
}

/// Runs seeds `from..from + count`, with overlapping faults if asked; returns the seeds
/// that ended unconverged (checked for safety only: with overlapping faults, or when no
/// replica of a volume was left up to date), or the first failing seed's panic message.
pub fn run_seeds_with(from: u64, count: u64, overlapping: bool) -> Result<Vec<u64>, String> {
    let family = if overlapping {
        Family::Overlapping
    } else {
        Family::Single
    };
    run_family(from, count, family).map(|(stuck, _)| stuck)
}

/// Runs seeds `from..from + count` of a fault family; returns the seeds that ended
/// unconverged (checked for safety only) and the coverage reached, or the first failing
/// seed's panic message.
pub fn run_family(from: u64, count: u64, family: Family) -> Result<(Vec<u64>, Coverage), String> {
    run_family_with(from, count, family, Extra::default())
}

/// What a batch adds to its family's scenarios.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extra {
    /// The checks of engine gaps not yet fixed (see
    /// [`Scenario::pending_checks`](crate::Scenario::pending_checks)).
    pub pending_checks: bool,
    /// Stalls of Secondaries among the faults (see
    /// [`Scenario::stalls`](crate::Scenario::stalls)).
    pub stalls: bool,
    /// Probing clients in the failover family (see
    /// [`Scenario::probes`](crate::Scenario::probes)).
    pub probes: bool,
}

/// [`run_family`], with what `extra` adds.
pub fn run_family_with(
    from: u64,
    count: u64,
    family: Family,
    extra: Extra,
) -> Result<(Vec<u64>, Coverage), String> {
    let mut stuck = Vec::new();
    let mut cov = Coverage::default();
    for seed in from..from + count {
        match run_one(seed, family, extra) {
            Ok(out) => {
                cov.add(&out);
                if !out.converged {
                    stuck.push(seed);
                }
            }
            Err(msg) => return Err(format!("seed {seed} ({}) failed: {msg}", family.name())),
        }
    }
    Ok((stuck, cov))
}

/// What [`run_family_keep_going`] found.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Seeds that ended unconverged (checked for safety only).
    pub stuck: Vec<u64>,
    /// What the runs that passed reached.
    pub coverage: Coverage,
    /// Seeds that failed, with the first line of their panic message.
    pub failed: Vec<(u64, String)>,
}

/// [`run_family_with`], going on past failing seeds (to see how many fail, and how).
pub fn run_family_keep_going(from: u64, count: u64, family: Family, extra: Extra) -> Batch {
    let mut b = Batch::default();
    for seed in from..from + count {
        match run_one(seed, family, extra) {
            Ok(out) => {
                b.coverage.add(&out);
                if !out.converged {
                    b.stuck.push(seed);
                }
            }
            Err(msg) => b
                .failed
                .push((seed, msg.lines().next().unwrap_or_default().to_string())),
        }
    }
    b
}

fn run_one(seed: u64, family: Family, extra: Extra) -> Result<Outcome, String> {
    let mut sc = family.scenario(seed);
    sc.pending_checks = extra.pending_checks;
    if extra.stalls {
        sc = sc.with_stalls();
    }
    sc.probes = extra.probes;
    std::panic::catch_unwind(|| Sim::new(sc).run()).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// What a batch of runs reached, from what the simulator did and what the engines said
/// (typed events), never from log text: a family that never hits its fault proves
/// nothing. Per fault, the runs that hit it and how often.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub seeds: u64,
    /// Runs in which some replica finished a resync, and resyncs finished.
    pub resynced: u64,
    pub resyncs: u64,
    /// Runs with a restart (kill -9 or power loss of a Secondary), and restarts.
    pub restarted: u64,
    pub restarts: u64,
    /// Restarts that were clean stops (metadata kept).
    pub clean_stops: u64,
    /// Runs in which a restart lost the node's disk, and such restarts.
    pub lost_disk: u64,
    pub disks_lost: u64,
    /// Runs in which a disk failed (at most one per run): of the Primary's node, and of one
    /// write or fdatasync only.
    pub crash_starts: u64,
    pub suspect_bytes: u64,
    pub disk_failures: u64,
    pub primary_disk_failures: u64,
    pub one_off_eios: u64,
    /// Runs in which an engine detached a replica after an I/O error, and replicas so
    /// detached.
    pub detached: u64,
    pub replicas_detached: u64,
    /// Runs with a power loss, power losses, and the sectors they took back to their last
    /// synced content.
    pub power_lost: u64,
    pub power_losses: u64,
    pub sectors_reverted: u64,
    /// Disk operations completed inline rather than later.
    pub inline_ops: u64,
    /// fdatasyncs started by the nodes' sync plans, and flushes they answered without one.
    pub planned_syncs: u64,
    pub flushes_without_sync: u64,
    /// Runs in which every node crashed at once, and in which the Primary crashed alone
    /// (keeping a replica in `diskful_primary_crashes` of them).
    pub cluster_crashes: u64,
    pub primary_crashes: u64,
    pub diskful_primary_crashes: u64,
    /// Requests in flight at a crash, never answered; acknowledged writes a crash may
    /// have taken (see `crash.rs`).
    pub abandoned: u64,
    pub lossy: u64,
    /// Promotions of node 0 refused after a crash, and the longest time (simulated) from a
    /// crash to node 0 being Primary again.
    pub promote_refusals: u64,
    pub longest_promotion_us: u64,
    /// Runs in which a replica was made UpToDate by its generation ids, and such replicas;
    /// changes of a generation id.
    pub proven_by_generation_runs: u64,
    pub proven_by_generation: u64,
    pub generation_changes: u64,
    /// Older replicas met after a restart with no Primary around, listed what a bitmap
    /// named since its id, or everything.
    pub older_listed_bitmap: u64,
    pub older_listed_full: u64,
    /// Runs in which the Primary lost quorum, times it did, and requests it failed for it.
    pub quorum_lost_runs: u64,
    pub quorum_losses: u64,
    pub failed_for_quorum: u64,
    /// Failover (see `failover.rs`): runs with a failover, promotions after the first,
    /// attempts refused (another Primary connected, no up-to-date replica in reach, no
    /// quorum, a Primary beyond a peer), attempts by a node that merely could not see a
    /// healthy Primary (and those promoted), promotions by a client attaching.
    pub failover_runs: u64,
    pub failovers: u64,
    pub refused_peer_primary: u64,
    pub refused_no_up_to_date: u64,
    pub refused_no_quorum: u64,
    pub refused_primary_beyond: u64,
    /// ... and for a peer just connected that has not said which Primary it follows.
    pub refused_peer_unheard: u64,
    pub spurious: u64,
    pub spurious_promoted: u64,
    pub auto_promotions: u64,
    /// Of those, probes that left at once, and clients after them that promoted again.
    pub probes: u64,
    pub probes_followed: u64,
    /// Its faults: one link cut (two nodes apart, both reaching the third), a node cut
    /// off (the Primary), every link cut, kills of the Primary, restarts of a Secondary.
    pub asymmetric: u64,
    pub isolated: u64,
    pub isolated_primary: u64,
    pub all_cut: u64,
    pub primary_kills: u64,
    pub secondary_restarts: u64,
    /// Old Primaries that stepped down for a new one, that the manager demoted; links an
    /// engine dropped; writes acknowledged by a Primary after a failover.
    pub yielded: u64,
    pub demoted: u64,
    pub failover_drops: u64,
    pub acked_after_failover: u64,
    /// Runs left with no replica of some volume up to date, no node promotable: the
    /// workload ended early (checked for safety only).
    pub failover_gave_up: u64,
    pub unconverged: u64,
    /// Runs with a stall, and what stalls did (see `stall.rs`).
    pub stalled: u64,
    pub stalls: u64,
    pub short_stalls: u64,
    pub stall_write_timeouts: u64,
    pub stall_ping_timeouts: u64,
    pub stall_silent: u64,
    pub short_stall_drops: u64,
}

impl Coverage {
    /// Promotions refused, every reason.
    pub fn refusals(&self) -> u64 {
        self.refused_peer_primary
            + self.refused_no_up_to_date
            + self.refused_no_quorum
            + self.refused_primary_beyond
            + self.refused_peer_unheard
    }

    fn add(&mut self, o: &Outcome) {
        let hit = |n: usize| u64::from(n > 0);
        self.seeds += 1;
        self.resynced += hit(o.resyncs);
        self.resyncs += o.resyncs as u64;
        self.restarted += hit(o.restarts);
        self.restarts += o.restarts as u64;
        self.clean_stops += o.clean_stops as u64;
        self.crash_starts += o.crash_starts as u64;
        self.suspect_bytes += o.suspect_bytes;
        self.lost_disk += hit(o.disks_lost);
        self.disks_lost += o.disks_lost as u64;
        self.disk_failures += hit(o.disk_failures);
        self.primary_disk_failures += u64::from(o.primary_disk_failed);
        self.one_off_eios += hit(o.one_off_eios);
        self.detached += hit(o.replicas_detached);
        self.replicas_detached += o.replicas_detached as u64;
        self.power_lost += hit(o.power_losses);
        self.power_losses += o.power_losses as u64;
        self.sectors_reverted += o.sectors_reverted as u64;
        self.inline_ops += o.inline_ops as u64;
        self.planned_syncs += o.planned_syncs as u64;
        self.flushes_without_sync += o.flushes_without_sync as u64;
        self.cluster_crashes += hit(o.cluster_crashes);
        self.stalled += hit(o.stalls.stalls);
        self.stalls += o.stalls.stalls as u64;
        self.short_stalls += o.stalls.short as u64;
        self.stall_write_timeouts += o.stalls.write_timeouts as u64;
        self.stall_ping_timeouts += o.stalls.ping_timeouts as u64;
        self.stall_silent += o.stalls.silent as u64;
        self.short_stall_drops += o.stalls.short_dropped as u64;
        self.primary_crashes += hit(o.primary_crashes);
        self.diskful_primary_crashes += u64::from(o.diskful_primary_crashed);
        self.abandoned += o.abandoned as u64;
        self.lossy += o.lossy as u64;
        self.promote_refusals += o.promote_refusals as u64;
        self.longest_promotion_us = self.longest_promotion_us.max(o.promoted_after_us);
        self.proven_by_generation_runs += hit(o.proven_by_generation);
        self.proven_by_generation += o.proven_by_generation as u64;
        self.generation_changes += o.generation_changes as u64;
        self.older_listed_bitmap += o.older_listed_bitmap as u64;
        self.older_listed_full += o.older_listed_full as u64;
        self.quorum_lost_runs += hit(o.quorum_losses);
        self.quorum_losses += o.quorum_losses as u64;
        self.failed_for_quorum += o.failed_for_quorum as u64;
        let f = &o.failover;
        self.failover_runs += hit(f.failovers);
        self.failovers += f.failovers as u64;
        self.refused_peer_primary += f.refused_peer_primary as u64;
        self.refused_no_up_to_date += f.refused_no_up_to_date as u64;
        self.refused_no_quorum += f.refused_no_quorum as u64;
        self.refused_primary_beyond += f.refused_primary_beyond as u64;
        self.refused_peer_unheard += f.refused_peer_unheard as u64;
        self.spurious += f.spurious as u64;
        self.spurious_promoted += f.spurious_promoted as u64;
        self.auto_promotions += f.auto_promotions as u64;
        self.probes += f.probes as u64;
        self.probes_followed += f.probes_followed as u64;
        self.asymmetric += f.asymmetric as u64;
        self.isolated += f.isolated as u64;
        self.isolated_primary += f.isolated_primary as u64;
        self.all_cut += f.all_cut as u64;
        self.primary_kills += f.kills as u64;
        self.secondary_restarts += f.secondary_restarts as u64;
        self.yielded += f.yielded as u64;
        self.demoted += f.demoted as u64;
        self.failover_drops += f.drops as u64;
        self.acked_after_failover += f.acked_after_failover as u64;
        self.failover_gave_up += u64::from(f.gave_up);
        self.unconverged += u64::from(!o.converged);
    }
}

impl std::fmt::Display for Coverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "coverage of {} seeds (runs that hit it, and how often):",
            self.seeds
        )?;
        writeln!(
            f,
            "  resync finished    {:>7} runs, {} resyncs",
            self.resynced, self.resyncs
        )?;
        writeln!(
            f,
            "  restart            {:>7} runs, {} restarts ({} clean stops)",
            self.restarted, self.restarts, self.clean_stops
        )?;
        writeln!(
            f,
            "  crash, consistent  {:>7} replicas restarted Crashed, pulling what their activity logs named ({} KiB)",
            self.crash_starts,
            self.suspect_bytes >> 10
        )?;
        writeln!(
            f,
            "  disk lost          {:>7} runs, {} restarts with a new empty disk",
            self.lost_disk, self.disks_lost
        )?;
        writeln!(
            f,
            "  disk failed (EIO)  {:>7} runs ({} the Primary's, {} one write or fdatasync only); {} runs, {} replicas detached by the engines",
            self.disk_failures,
            self.primary_disk_failures,
            self.one_off_eios,
            self.detached,
            self.replicas_detached
        )?;
        writeln!(
            f,
            "  power loss         {:>7} runs, {} power losses, {} sectors reverted",
            self.power_lost, self.power_losses, self.sectors_reverted
        )?;
        writeln!(
            f,
            "  crash              {:>7} runs of every node at once, {} of the Primary alone ({} keeping a replica); {} requests abandoned, {} acknowledged writes it may take (power lost before a flush, protocol A/B)",
            self.cluster_crashes,
            self.primary_crashes,
            self.diskful_primary_crashes,
            self.abandoned,
            self.lossy
        )?;
        writeln!(
            f,
            "  after a crash      {:>7} runs with replicas proven by generation ids ({} replicas); {} promotions refused, Primary again within {} ms at most; {} generation changes",
            self.proven_by_generation_runs,
            self.proven_by_generation,
            self.promote_refusals,
            self.longest_promotion_us / 1000,
            self.generation_changes
        )?;
        writeln!(
            f,
            "  older replica      {:>7} listed only a bitmap (its id held), {} listed everything",
            self.older_listed_bitmap, self.older_listed_full
        )?;
        writeln!(
            f,
            "  quorum             {:>7} runs in which the Primary lost it ({} times), {} requests failed for it",
            self.quorum_lost_runs, self.quorum_losses, self.failed_for_quorum
        )?;
        if self.failovers + self.refusals() > 0 {
            writeln!(
                f,
                "  failover           {:>7} runs, {} failovers ({} by a client attaching, {} of them a probe that left, followed by a client that promoted again {} times); refused: {} another Primary, {} no up-to-date replica, {} no quorum, {} a Primary beyond a peer, {} a peer not heard (or not listed) yet; {} attempts by a node not seeing a fit Primary ({} promoted)",
                self.failover_runs,
                self.failovers,
                self.auto_promotions,
                self.probes,
                self.probes_followed,
                self.refused_peer_primary,
                self.refused_no_up_to_date,
                self.refused_no_quorum,
                self.refused_primary_beyond,
                self.refused_peer_unheard,
                self.spurious,
                self.spurious_promoted
            )?;
            writeln!(
                f,
                "  failover faults    {} asymmetric partitions (one link), {} nodes cut off ({} the Primary), {} all links cut, {} Primaries killed, {} Secondaries restarted",
                self.asymmetric,
                self.isolated,
                self.isolated_primary,
                self.all_cut,
                self.primary_kills,
                self.secondary_restarts
            )?;
            writeln!(
                f,
                "  after failover     {} old Primaries stepped down by themselves, {} demoted by the manager; {} links dropped by an engine; {} writes acknowledged by a later Primary; {} runs left with no replica up to date (workload ended early)",
                self.yielded,
                self.demoted,
                self.failover_drops,
                self.acked_after_failover,
                self.failover_gave_up
            )?;
        } else {
            writeln!(
                f,
                "  failover           not in this family (node 0 is the only Primary)"
            )?;
        }
        if self.stalls > 0 {
            writeln!(
                f,
                "  stalls             {:>7} runs, {} stalls ({} shorter than the request timeout); links to a stalled node dropped: {} write timeouts, {} ping timeouts, {} silent past the request timeout ({} in short stalls)",
                self.stalled,
                self.stalls,
                self.short_stalls,
                self.stall_write_timeouts,
                self.stall_ping_timeouts,
                self.stall_silent,
                self.short_stall_drops
            )?;
        }
        writeln!(
            f,
            "  unconverged        {:>7} runs (checked for safety only)",
            self.unconverged
        )?;
        write!(
            f,
            "  disk operations completed inline {}, fdatasyncs planned {} ({} flushes answered without one)",
            self.inline_ops, self.planned_syncs, self.flushes_without_sync
        )
    }
}
