//! How fast a sync target pulls: the resync-rate controller.
//!
//! The window of requests in flight (`resync_window` × `resync_chunk`) is the fill target:
//! each reply lets the next request go, so an idle resync runs at the rate the source, the
//! link and the disk give, up to `resync_max_rate`. While the application writes to the
//! volume (a write submitted here or replicated to us in the last `LOAD_WINDOW_MS`), the
//! resync is held to `resync_min_rate`: the application's writes keep most of the disk
//! and the link, and the resync still moves at that rate, so it always finishes (DRBD's
//! c-min-rate only backs off, and a resync under steady load may never end). A token
//! bucket per resync: the budget grows with time at the rate in force, up to a tenth of a
//! second of it (at least one request), and each request spends its length.

/// Writes this recent (ms) mean the application is writing to the volume.
pub(super) const LOAD_WINDOW_MS: u64 = 200;

/// Rates in bytes per second; 0 means unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResyncRates {
    /// While the application writes to the volume (0: not held back).
    pub min: u64,
    /// At most, always (0: unlimited).
    pub max: u64,
}

impl ResyncRates {
    pub const UNLIMITED: ResyncRates = ResyncRates { min: 0, max: 0 };

    /// The rate in force: `loaded` when the application wrote lately.
    fn now(self, loaded: bool) -> u64 {
        let held = if loaded { self.min } else { 0 };
        match (held, self.max) {
            (0, m) | (m, 0) => m,
            (h, m) => h.min(m),
        }
    }
}

/// One resync's budget.
#[derive(Debug, Default)]
pub(super) struct Pace {
    budget: u64,
    /// When `budget` was last refilled; `None` until the first refill.
    at_ms: Option<u64>,
    /// The rate of the last refill (0: unlimited), and the most budget it allows.
    rate: u64,
    cap: u64,
    /// Held back: ask again (tick) at this time.
    pub(super) wake_ms: Option<u64>,
}

impl Pace {
    /// Refills for the time since the last refill, at the rate `rates` give now.
    pub(super) fn refill(&mut self, now_ms: u64, rates: ResyncRates, loaded: bool, chunk: u64) {
        let rate = rates.now(loaded);
        let first = self.at_ms.is_none();
        let elapsed = self.at_ms.map_or(0, |t| now_ms.saturating_sub(t));
        self.at_ms = Some(now_ms);
        self.rate = rate;
        if rate == 0 {
            return;
        }
        let cap = (rate / 10).max(chunk);
        self.cap = cap;
        let grown = if first {
            cap
        } else {
            rate.saturating_mul(elapsed) / 1000
        };
        self.budget = self.budget.saturating_add(grown).min(cap);
    }

    /// Whether a request of up to `len` bytes may go now; if not, when to ask again.
    pub(super) fn allows(&mut self, now_ms: u64, len: u64) -> bool {
        if self.rate == 0 || self.budget >= len {
            self.wake_ms = None;
            return true;
        }
        let missing = len - self.budget;
        let wait = (missing.saturating_mul(1000)).div_ceil(self.rate).max(1);
        self.wake_ms = Some(now_ms + wait);
        false
    }

    /// A request of `len` bytes went.
    pub(super) fn spend(&mut self, len: u64) {
        if self.rate != 0 {
            self.budget = self.budget.saturating_sub(len);
        }
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if self.rate != 0 && self.budget > self.cap {
            return Err(format!(
                "resync budget {} above its cap {}",
                self.budget, self.cap
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn unlimited_never_holds_back() {
        let mut p = Pace::default();
        p.refill(0, ResyncRates::UNLIMITED, true, MIB);
        for _ in 0..1000 {
            assert!(p.allows(0, MIB));
            p.spend(MIB);
        }
    }

    #[test]
    fn under_load_the_minimum_rate_holds_and_still_moves() {
        let rates = ResyncRates {
            min: 10 * MIB,
            max: 0,
        };
        let chunk = 256 << 10;
        let mut p = Pace::default();
        let mut sent = 0;
        let mut now = 0;
        while now <= 10_000 {
            p.refill(now, rates, true, chunk);
            while p.allows(now, chunk) {
                p.spend(chunk);
                sent += chunk;
            }
            p.check().unwrap();
            now = p.wake_ms.expect("held back until then");
        }
        // 10 s at 10 MiB/s, plus the first tenth of a second's burst.
        assert!((100 * MIB..=102 * MIB).contains(&sent), "{sent}");
    }

    #[test]
    fn idle_goes_at_the_maximum_and_load_never_raises_it() {
        let rates = ResyncRates {
            min: 50 * MIB,
            max: 20 * MIB,
        };
        assert_eq!(rates.now(false), 20 * MIB);
        assert_eq!(rates.now(true), 20 * MIB);
        let rates = ResyncRates { min: 5, max: 0 };
        assert_eq!(rates.now(false), 0);
        assert_eq!(rates.now(true), 5);
    }
}
