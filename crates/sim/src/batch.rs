//! Runs of many seeds: a digest that proves a refactoring changed nothing, and the
//! coverage a family reached.

use crate::{Family, Sim};

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
    let mut stuck = Vec::new();
    let mut cov = Coverage::default();
    for seed in from..from + count {
        let sc = family.scenario(seed);
        match std::panic::catch_unwind(|| Sim::new(sc).run()) {
            Ok(out) => {
                cov.seeds += 1;
                cov.resynced += u64::from(out.resyncs > 0);
                cov.restarts += out.restarts as u64;
                cov.disks_lost += out.disks_lost as u64;
                cov.disk_failures += out.disk_failures as u64;
                cov.primary_disk_failures += u64::from(out.primary_disk_failed);
                cov.power_losses += out.power_losses as u64;
                cov.sectors_reverted += out.sectors_reverted as u64;
                cov.inline_ops += out.inline_ops as u64;
                cov.planned_syncs += out.planned_syncs as u64;
                cov.flushes_without_sync += out.flushes_without_sync as u64;
                if !out.converged {
                    cov.unconverged += 1;
                    stuck.push(seed);
                }
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                return Err(format!("seed {seed} ({}) failed: {msg}", family.name()));
            }
        }
    }
    Ok((stuck, cov))
}

/// What a batch of runs reached: a family that never hits its fault proves nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub seeds: u64,
    /// Runs in which some replica finished a resync.
    pub resynced: u64,
    pub restarts: u64,
    pub disks_lost: u64,
    pub disk_failures: u64,
    pub power_losses: u64,
    /// Sectors a power loss took back to their last synced content.
    pub sectors_reverted: u64,
    /// Disk operations completed inline rather than later.
    pub inline_ops: u64,
    /// fdatasyncs started by the nodes' sync plans, and flushes they answered without one.
    pub planned_syncs: u64,
    pub flushes_without_sync: u64,
    /// Runs whose Primary failed its own disk and went on diskless.
    pub primary_disk_failures: u64,
    pub unconverged: u64,
}

impl std::fmt::Display for Coverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "coverage: {} seeds, {} with a resync, {} restarts ({} lost their disks), {} disk failures ({} of the Primary), {} power losses ({} sectors reverted), {} disk operations completed inline, {} planned fdatasyncs ({} flushes answered without one), failovers: not modelled (node 0 stays Primary), {} unconverged",
            self.seeds,
            self.resynced,
            self.restarts,
            self.disks_lost,
            self.disk_failures,
            self.primary_disk_failures,
            self.power_losses,
            self.sectors_reverted,
            self.inline_ops,
            self.planned_syncs,
            self.flushes_without_sync,
            self.unconverged
        )
    }
}
