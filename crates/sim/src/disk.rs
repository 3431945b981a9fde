//! A node's simulated disk: per volume, what the page cache holds (what reads see and a
//! kill -9 keeps) and, per sector, what the last fdatasync made durable (all a power loss
//! is sure to keep); and how the disk fails (EIO).
//!
//! Every sector the workload writes starts with its write's stamp and is zero after it (a
//! zeroed sector is stamp 0), so a sector's stamp says all it holds: the durable copy is
//! kept as stamps.

use crate::rng::Rng;

pub(crate) const SECTOR: u64 = 512;
const BLOCK: usize = 4096;

pub(crate) fn stamp_of(sector: &[u8]) -> u64 {
    u64::from_le_bytes(sector[..8].try_into().expect("8 bytes"))
}

/// How a disk fails: every operation answered with EIO from now on, or one only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The disk is gone.
    Dead,
    /// The next write or zeroing fails; the disk works again after (a bad sector
    /// remapped, a path that failed over).
    NextWrite,
    /// The next fdatasync fails (what it should have made durable is not).
    NextSync,
}

/// What a disk operation is, as far as failing goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpClass {
    Write,
    Sync,
    Other,
}

pub(crate) struct Disk {
    /// Per volume; empty where the node keeps no replica.
    vols: Vec<Vec<u8>>,
    /// Per volume and sector: the stamp the last completed fdatasync made durable.
    durable: Vec<Vec<u64>>,
    failure: Option<Failure>,
    /// Writes (and zeroings) so far; per volume and sector, the one that wrote it last;
    /// the writes the last completed fdatasync covered. A block written since is in the
    /// activity log even when it holds what is durable again (written, then zeroed).
    writes: u64,
    written: Vec<Vec<u64>>,
    synced_writes: u64,
}

/// What an fdatasync issued now makes durable at least: per volume the stamp of every
/// sector, and the writes done so far.
pub(crate) struct Covers {
    stamps: Vec<Vec<u64>>,
    writes: u64,
}

impl Disk {
    /// Volumes of these sizes in bytes (0: no replica), all zero and durable.
    pub(crate) fn new(sizes: impl Iterator<Item = usize>) -> Disk {
        let vols: Vec<Vec<u8>> = sizes.map(|s| vec![0; s]).collect();
        let durable: Vec<Vec<u64>> = vols
            .iter()
            .map(|d| vec![0; d.len() / SECTOR as usize])
            .collect();
        Disk {
            vols,
            written: durable.clone(),
            durable,
            failure: None,
            writes: 0,
            synced_writes: 0,
        }
    }

    pub(crate) fn volume(&self, v: usize) -> &[u8] {
        &self.vols[v]
    }

    /// The stamp sector `s` of volume `v` holds now.
    pub(crate) fn stamp(&self, v: usize, s: usize) -> u64 {
        stamp_of(&self.vols[v][s * SECTOR as usize..])
    }

    /// The stamp sector `s` of volume `v` holds durably.
    pub(crate) fn durable(&self, v: usize, s: usize) -> u64 {
        self.durable[v][s]
    }

    pub(crate) fn write(&mut self, v: usize, offset: u64, data: &[u8]) {
        self.vols[v][offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.wrote(v, offset, data.len() as u64);
    }

    pub(crate) fn zero(&mut self, v: usize, offset: u64, len: u64) {
        self.vols[v][offset as usize..(offset + len) as usize].fill(0);
        self.wrote(v, offset, len);
    }

    fn wrote(&mut self, v: usize, offset: u64, len: u64) {
        self.writes += 1;
        let sectors = (offset / SECTOR) as usize..(offset + len).div_ceil(SECTOR) as usize;
        self.written[v][sectors].fill(self.writes);
    }

    pub(crate) fn read(&self, v: usize, offset: u64, len: u64) -> Vec<u8> {
        self.vols[v][offset as usize..(offset + len) as usize].to_vec()
    }

    /// What an fdatasync issued now makes durable at least.
    pub(crate) fn covers(&self) -> Covers {
        Covers {
            stamps: self
                .vols
                .iter()
                .map(|d| d.chunks(SECTOR as usize).map(stamp_of).collect())
                .collect(),
            writes: self.writes,
        }
    }

    /// The 4 KiB blocks of volume `v` written since the writes the last completed
    /// fdatasync covered, as byte ranges: what the activity log still holds (an extent
    /// leaves it only once what was written there is durable).
    pub(crate) fn written_since_sync(&self, v: usize) -> Vec<(u64, u64)> {
        let per_block = BLOCK / SECTOR as usize;
        self.written[v]
            .chunks(per_block)
            .enumerate()
            .filter(|(_, sectors)| sectors.iter().any(|&w| w > self.synced_writes))
            .map(|(b, _)| ((b * BLOCK) as u64, BLOCK as u64))
            .collect()
    }

    /// The 4 KiB blocks of volume `v` holding something no fdatasync made durable, as
    /// byte ranges: what a power loss may take, and so the least a crashed node's activity
    /// log must name (its extents are coarser; the simulator gives the engine the least).
    pub(crate) fn unsynced_blocks(&self, v: usize) -> Vec<(u64, u64)> {
        let per_block = BLOCK / SECTOR as usize;
        (0..self.durable[v].len() / per_block)
            .filter(|&b| {
                (b * per_block..(b + 1) * per_block).any(|s| self.stamp(v, s) != self.durable[v][s])
            })
            .map(|b| ((b * BLOCK) as u64, BLOCK as u64))
            .collect()
    }

    /// An fdatasync issued when the disk held `covers` (see [`Disk::covers`]) completed.
    pub(crate) fn synced(&mut self, covers: Covers) {
        self.durable = covers.stamps;
        self.synced_writes = covers.writes;
    }

    /// A replaced disk (or a deleted backing file): nothing left.
    pub(crate) fn wipe(&mut self) {
        for d in &mut self.vols {
            d.fill(0);
        }
        for d in &mut self.durable {
            d.fill(0);
        }
        self.synced_writes = self.writes;
    }

    /// A power loss: per 4 KiB block, what was written since the last fdatasync is kept,
    /// lost, or torn (each 512-byte sector kept or lost on its own). Returns the sectors
    /// that went back, and per volume the blocks that lost something.
    pub(crate) fn lose_power(&mut self, r: &mut Rng) -> (usize, Vec<u64>) {
        let mut reverted = 0;
        let mut blocks = Vec::new();
        let per_block = BLOCK / SECTOR as usize;
        for (disk, durable) in self.vols.iter_mut().zip(&self.durable) {
            let mut hit = 0;
            for (b, block) in disk.chunks_mut(BLOCK).enumerate() {
                let before = reverted;
                let fate = r.below(3);
                for (s, sector) in block.chunks_mut(SECTOR as usize).enumerate() {
                    let lost = match fate {
                        0 => false,
                        1 => true,
                        _ => r.chance(0.5),
                    };
                    let want = durable[b * per_block + s];
                    if lost && stamp_of(sector) != want {
                        set_stamp(sector, want);
                        reverted += 1;
                    }
                }
                hit += u64::from(reverted > before);
            }
            blocks.push(hit);
        }
        (reverted, blocks)
    }

    /// From now on the disk fails as `f` says.
    pub(crate) fn fail(&mut self, f: Failure) {
        self.failure = Some(f);
    }

    /// Whether every operation on it fails.
    pub(crate) fn dead(&self) -> bool {
        self.failure == Some(Failure::Dead)
    }

    /// A failure waits for an operation of this class.
    pub(crate) fn armed_for(&self, op: OpClass) -> bool {
        matches!(
            (self.failure, op),
            (Some(Failure::Dead), _)
                | (Some(Failure::NextWrite), OpClass::Write)
                | (Some(Failure::NextSync), OpClass::Sync)
        )
    }

    /// An operation of this class completes now: whether it fails with EIO. A one-off
    /// failure is used up by the operation it hits.
    pub(crate) fn fails(&mut self, op: OpClass) -> bool {
        if !self.armed_for(op) {
            return false;
        }
        if !self.dead() {
            self.failure = None;
        }
        true
    }

    /// A write that failed may have reached some of its sectors and not others, as a
    /// device's failed request may: each sector of `data` lands or not.
    pub(crate) fn write_some(&mut self, v: usize, offset: u64, data: &[u8], r: &mut Rng) {
        for (k, sector) in data.chunks(SECTOR as usize).enumerate() {
            if r.chance(0.5) {
                self.write(v, offset + k as u64 * SECTOR, sector);
            }
        }
    }
}

/// A sector's content is its stamp (zeroes for 0).
fn set_stamp(sector: &mut [u8], stamp: u64) {
    sector.fill(0);
    if stamp != 0 {
        sector[..8].copy_from_slice(&stamp.to_le_bytes());
    }
}
