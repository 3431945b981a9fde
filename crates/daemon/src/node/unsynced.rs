//! The unsynced map in memory: extents that left the activity log while a write to them
//! may still sit in the page cache. Recording such an extent (a bit in the metadata,
//! written before the transaction that evicts it) replaces the data sync an eviction
//! would otherwise need first: on persistent memory that is a store and a fence instead
//! of an fdatasync of the volume on the write path.
//!
//! A data sync that started after an extent was recorded makes its writes durable, so
//! its bit is cleared when that sync completes (`started` / `synced`, epochs like the
//! activity log's sync marks). Nothing waits for these syncs: the map has a bit for every
//! extent and never fills. The daemon syncs when the oldest bit is as old as the kernel's
//! own write-back age (`vm.dirty_expire_centisecs`, see `interval`), by when the kernel
//! has written those pages itself and the sync costs a journal commit and a cache flush.
//! An application's flush clears the map as well.
//!
//! After a crash in another boot (a power loss, a kernel crash) the recorded extents may
//! have lost writes the peers have: they are resynced with the activity log's. After a
//! crash of the process alone the page cache kept them, and the start-up fdatasync made
//! them durable: nothing is lost there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tandem_meta::MD_BLOCK;

/// Extents one map page holds.
const EXTENTS_PER_PAGE: u64 = MD_BLOCK * 8;

/// The epoch of a held extent: no sync covers it (see `Unsynced::hold`).
const HELD: u64 = u64::MAX;

#[derive(Debug, Default)]
pub(super) struct Unsynced {
    /// The map, one bit per extent (empty: the metadata has none, version 1).
    words: Vec<u64>,
    /// Each recorded extent's epoch: a sync started in a later epoch covers it.
    epoch_of: HashMap<u32, u64>,
    epoch: u64,
    /// When the oldest bit still set was recorded (roughly: after a sync, its start).
    since: Option<Instant>,
}

impl Unsynced {
    /// A map of `words` words as read from the metadata. Its bits are not known to be
    /// covered by anything yet: they count as recorded now.
    pub(super) fn new(words: Vec<u64>, now: Instant) -> Unsynced {
        let epoch_of: HashMap<u32, u64> = set_extents(&words).map(|e| (e, 0)).collect();
        Unsynced {
            since: (!epoch_of.is_empty()).then_some(now),
            words,
            epoch_of,
            epoch: 0,
        }
    }

    /// The metadata has a map.
    pub(super) fn present(&self) -> bool {
        !self.words.is_empty()
    }

    pub(super) fn words(&self) -> &[u64] {
        &self.words
    }

    /// Extents recorded and not yet covered by a completed sync.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.epoch_of.len()
    }

    /// Records `extents`; the pages to write (sorted, each once).
    pub(super) fn record(&mut self, extents: &[u32], now: Instant) -> Vec<u64> {
        assert!(self.present(), "recording extents without an unsynced map");
        let mut pages = Vec::new();
        for &e in extents {
            let epoch = self.epoch_of.entry(e).or_insert(self.epoch);
            if *epoch != HELD {
                *epoch = self.epoch;
            }
            let (w, bit) = ((e / 64) as usize, e % 64);
            if self.words[w] & (1 << bit) == 0 {
                self.words[w] |= 1 << bit;
                pages.push(u64::from(e) / EXTENTS_PER_PAGE);
            }
        }
        self.since.get_or_insert(now);
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    /// A data sync starts: give the mark back to `synced` when it succeeded.
    pub(super) fn started(&mut self) -> u64 {
        let mark = self.epoch;
        self.epoch += 1;
        mark
    }

    /// The sync marked `mark` succeeded: what was recorded before it started is durable.
    /// The pages to write (clearing a bit needs no sync: a bit left set only costs a
    /// resync after a power loss).
    pub(super) fn synced(&mut self, mark: u64, started: Instant) -> Vec<u64> {
        let mut pages = Vec::new();
        let words = &mut self.words;
        self.epoch_of.retain(|&e, &mut epoch| {
            if epoch > mark {
                return true;
            }
            words[(e / 64) as usize] &= !(1 << (e % 64));
            pages.push(u64::from(e) / EXTENTS_PER_PAGE);
            false
        });
        if !self.epoch_of.values().any(|&e| e != HELD) {
            self.since = None;
        } else if !pages.is_empty() {
            self.since = Some(started);
        }
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    /// Keeps every extent recorded so far until `release`, whatever syncs complete: they
    /// were read back after a crash in another boot, and the replica, not yet proven, keeps
    /// them among the ranges where it may differ from its peers (its suspect ranges). A
    /// second crash must find them again; the start-up fdatasync made their data durable,
    /// so no sync is due for them.
    pub(super) fn hold(&mut self) {
        for e in self.epoch_of.values_mut() {
            *e = HELD;
        }
        self.since = None;
    }

    /// Some extents are held.
    pub(super) fn holds(&self) -> bool {
        self.epoch_of.values().any(|&e| e == HELD)
    }

    /// The held extents go with the next sync that completes.
    pub(super) fn release(&mut self, now: Instant) {
        let mut released = false;
        for e in self.epoch_of.values_mut().filter(|e| **e == HELD) {
            *e = self.epoch;
            released = true;
        }
        if released {
            self.since.get_or_insert(now);
        }
    }

    /// Everything is durable (the start-up fdatasync, a clean stop): the map empties. The
    /// pages to write.
    pub(super) fn clear(&mut self) -> Vec<u64> {
        let mark = self.started();
        self.synced(mark, Instant::now())
    }

    /// A sync is due: the oldest bit is `interval` old.
    pub(super) fn due(&self, now: Instant, interval: Duration) -> bool {
        self.since
            .is_some_and(|t| now.saturating_duration_since(t) >= interval)
    }
}

/// The extents whose bit is set in `words`, ascending.
pub(super) fn set_extents(words: &[u64]) -> impl Iterator<Item = u32> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        (0..64)
            .filter(move |b| w & (1 << b) != 0)
            .map(move |b| (i * 64 + b) as u32)
    })
}

/// How long a recorded extent may wait for a data sync: the kernel's write-back age
/// (`vm.dirty_expire_centisecs`, 30 s by default), within 1..=60 s.
pub(super) fn interval() -> Duration {
    static INTERVAL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *INTERVAL.get_or_init(|| {
        let centis = std::fs::read_to_string("/proc/sys/vm/dirty_expire_centisecs")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(3000);
        Duration::from_millis(centis.saturating_mul(10))
            .clamp(Duration::from_secs(1), Duration::from_secs(60))
    })
}

/// This kernel boot's id (`/proc/sys/kernel/random/boot_id`), zero if unknown.
pub(super) fn boot_id() -> [u8; 16] {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .and_then(|s| parse_uuid(s.trim()))
        .unwrap_or([0; 16])
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_clears_only_what_was_recorded_before_it_started() {
        let t0 = Instant::now();
        let mut u = Unsynced::new(vec![0; 2], t0);
        assert!(!u.due(t0, Duration::ZERO), "empty: never due");
        assert_eq!(u.record(&[3, 70], t0), vec![0]);
        let mark = u.started();
        // Recorded while the sync runs: that sync may have missed its writes.
        assert_eq!(u.record(&[5, 3], t0), vec![0], "5 is new; 3 again");
        assert_eq!(u.synced(mark, t0), vec![0]);
        assert_eq!(set_extents(u.words()).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(u.len(), 2);
        let mark = u.started();
        assert_eq!(u.synced(mark, t0), vec![0]);
        assert_eq!(u.len(), 0);
        assert!(u.words().iter().all(|&w| w == 0));
        assert!(!u.due(t0 + Duration::from_secs(100), Duration::ZERO));
    }

    #[test]
    fn an_older_sync_finishing_late_clears_nothing_newer() {
        let t0 = Instant::now();
        let mut u = Unsynced::new(vec![0; 1], t0);
        let old = u.started();
        u.record(&[1], t0);
        let new = u.started();
        assert!(u.synced(old, t0).is_empty());
        assert_eq!(u.len(), 1);
        assert_eq!(u.synced(new, t0), vec![0]);
        assert_eq!(u.len(), 0);
    }

    #[test]
    fn due_when_the_oldest_bit_is_old_enough() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut u = Unsynced::new(vec![0; 1], t0);
        u.record(&[2], t0);
        assert!(!u.due(t0, s));
        assert!(u.due(t0 + s, s));
        // Bits read back at start count from the start.
        let u = Unsynced::new(vec![1 << 9], t0);
        assert_eq!(u.len(), 1);
        assert!(u.due(t0 + s, s));
    }

    #[test]
    fn held_extents_outlive_every_sync_until_released() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut u = Unsynced::new(vec![1 << 4 | 1 << 9], t0);
        u.hold();
        assert!(u.holds());
        assert!(!u.due(t0 + s * 100, s), "nothing to sync for held extents");
        let mark = u.started();
        assert!(u.synced(mark, t0).is_empty());
        assert!(u.clear().is_empty(), "not even a clear");
        u.record(&[4, 20], t0);
        let mark = u.started();
        assert_eq!(u.synced(mark, t0), vec![0], "20 goes, 4 stays held");
        assert_eq!(set_extents(u.words()).collect::<Vec<_>>(), vec![4, 9]);
        assert!(!u.due(t0 + s * 100, s));
        u.release(t0);
        assert!(!u.holds());
        assert!(u.due(t0 + s, s));
        let mark = u.started();
        assert_eq!(u.synced(mark, t0), vec![0]);
        assert_eq!(u.len(), 0);
    }

    #[test]
    fn boot_ids_parse_as_the_kernel_prints_them() {
        let id = parse_uuid("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(id[15], 0xf0);
        assert_eq!(
            tandem_meta::uuid_text(&id),
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
        );
        assert!(parse_uuid("nonsense").is_none());
        assert_ne!(boot_id(), [0; 16], "this machine has a boot id");
    }
}
