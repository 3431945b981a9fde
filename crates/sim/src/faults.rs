//! The fault families a run is drawn from, what a power loss does to a disk, and the
//! coverage a batch of runs reached.

use crate::rng::Rng;
use crate::{Scenario, SECTOR};

/// Which failures a batch of runs injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Cut links and restarts (kill -9), one failure at a time.
    Single,
    /// The same, a new failure while earlier ones still heal.
    Overlapping,
    /// One at a time, plus the disk of one node failing for good (every later write,
    /// read and fdatasync on it returns EIO): its replicas detach, the rest go on.
    DiskErrors,
    /// One at a time, restarts being power losses: what a node wrote and did not
    /// fdatasync is kept, lost or torn per 4 KiB block.
    PowerLoss,
}

impl Family {
    pub const ALL: [Family; 4] = [
        Family::Single,
        Family::Overlapping,
        Family::DiskErrors,
        Family::PowerLoss,
    ];

    /// The run of `seed` in this family. The new families also draw the engine's knobs
    /// (ping interval, timeouts, resync chunk and window), from a stream of their own, so
    /// the first two families keep their schedules.
    pub fn scenario(self, seed: u64) -> Scenario {
        let mut sc = Scenario::random(seed);
        match self {
            Family::Single => {}
            Family::Overlapping => sc.overlapping_faults = true,
            Family::DiskErrors | Family::PowerLoss => {
                let mut r = Rng::new(seed ^ 0xfa17_5eed);
                sc.knobs.randomize(&mut r);
                if self == Family::DiskErrors {
                    sc.disk_errors = true;
                } else {
                    sc.power_loss = true;
                    sc.restarts = true;
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
    /// Flushes go through the daemon's `tandem_engine::sync_plan` (which fdatasync answers
    /// which flush, syncing ahead) instead of one fdatasync each.
    pub sync_plan: bool,
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
        }
    }
}

impl Knobs {
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

/// A power loss: per 4 KiB block of `disk`, what was written since the last fdatasync
/// (`durable` holds, per sector, the stamp that sync made durable) is kept, lost, or torn
/// (each 512-byte sector kept or lost on its own). Returns the sectors that went back.
pub fn lose_power(disk: &mut [u8], durable: &[u64], r: &mut Rng) -> usize {
    let mut reverted = 0;
    let per_block = (4096 / SECTOR) as usize;
    for (b, block) in disk.chunks_mut(4096).enumerate() {
        let fate = r.below(3);
        for (s, sector) in block.chunks_mut(SECTOR as usize).enumerate() {
            let lost = match fate {
                0 => false,
                1 => true,
                _ => r.chance(0.5),
            };
            let want = durable[b * per_block + s];
            if lost && crate::stamp_of(sector) != want {
                // A sector's content is its stamp (zeroes for 0).
                sector.fill(0);
                if want != 0 {
                    sector[..8].copy_from_slice(&want.to_le_bytes());
                }
                reverted += 1;
            }
        }
    }
    reverted
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
