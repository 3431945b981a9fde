//! How fast a sync target pulls: the resync-rate controller.
//!
//! The window of requests in flight (`resync_window` × `resync_chunk`) is the fill target:
//! each reply lets the next request go, so an idle resync runs at the rate the source, the
//! link and the disk give, up to `resync_max_rate`. While the application writes to the
//! volume (a write submitted here or replicated to us in the last `LOAD_WINDOW_MS`), a
//! controller sets the rate every `STEP_MS` (DRBD's 100 ms step): it starts at
//! `resync_min_rate`, grows by a quarter per step while every resync request of the step
//! was answered within `DELAY_TARGET_MS`, and halves (never below the minimum) when one
//! was slower: a slow answer means the resync queues behind the application's writes on
//! the disk or the link, which then wait behind it too (DRBD's c-delay-target, with a
//! floor: c-min-rate only backs off, and a resync under steady load may never end; this
//! one always moves at the minimum at least). A token bucket per resync: the budget grows
//! with time at the rate in force, up to a tenth of a second of it (at least one
//! request), and each request spends its length.

use std::collections::BTreeMap;

/// Writes this recent (ms) mean the application is writing to the volume.
pub(super) const LOAD_WINDOW_MS: u64 = 200;

/// A resync request answered slower than this (ms) under load: the resync competes with
/// the application's writes, and the rate backs off.
pub(super) const DELAY_TARGET_MS: u64 = 20;

/// How often the controller sets the rate under load.
const STEP_MS: u64 = 100;

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
    /// Under load: the controller's rate, and when its step began (`None`: not loaded).
    loaded_rate: u64,
    step_at_ms: Option<u64>,
    /// The slowest answer in this step (ms), and when each request in flight was sent.
    slowest_ms: u64,
    asked: BTreeMap<u64, u64>,
}

impl Pace {
    /// Refills for the time since the last refill, at the rate in force now.
    pub(super) fn refill(&mut self, now_ms: u64, rates: ResyncRates, loaded: bool, chunk: u64) {
        let rate = if loaded && rates.min != 0 {
            self.controlled(now_ms, rates, chunk)
        } else {
            self.step_at_ms = None;
            rates.now(loaded)
        };
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

    /// The rate under load: the minimum at first, then set once a step by how fast the
    /// step's requests were answered.
    fn controlled(&mut self, now_ms: u64, rates: ResyncRates, chunk: u64) -> u64 {
        match self.step_at_ms {
            None => {
                self.loaded_rate = rates.min;
                self.step_at_ms = Some(now_ms);
                self.slowest_ms = 0;
            }
            Some(t) if now_ms.saturating_sub(t) >= STEP_MS => {
                self.loaded_rate = if self.slowest_ms > DELAY_TARGET_MS {
                    (self.loaded_rate / 2).max(rates.min)
                } else {
                    // A quarter more, and at least a request more per step.
                    let grown = self.loaded_rate / 4;
                    self.loaded_rate
                        .saturating_add(grown.max(chunk * 1000 / STEP_MS))
                };
                if rates.max != 0 {
                    self.loaded_rate = self.loaded_rate.min(rates.max);
                }
                self.step_at_ms = Some(now_ms);
                self.slowest_ms = 0;
            }
            Some(_) => {}
        }
        self.loaded_rate
    }

    /// Request `id` was sent now.
    pub(super) fn asked(&mut self, id: u64, now_ms: u64) {
        self.asked.insert(id, now_ms);
    }

    /// Request `id` was answered now.
    pub(super) fn answered(&mut self, id: u64, now_ms: u64) {
        if let Some(sent) = self.asked.remove(&id) {
            self.slowest_ms = self.slowest_ms.max(now_ms.saturating_sub(sent));
        }
    }

    /// Forgets requests no longer in flight (their source went away).
    pub(super) fn keep_only<V>(&mut self, in_flight: &BTreeMap<u64, V>) {
        if self.asked.len() > in_flight.len() {
            self.asked.retain(|id, _| in_flight.contains_key(id));
        }
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
        if self.step_at_ms.is_some() && self.loaded_rate == 0 {
            return Err("a controlled rate of 0 under load".into());
        }
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

    /// Steps of 100 ms under load, each request answered after `answer_ms`; the bytes
    /// allowed over `steps` steps.
    fn under_load(rates: ResyncRates, answer_ms: u64, steps: u64) -> (u64, u64) {
        let chunk = 256 << 10;
        let mut p = Pace::default();
        let (mut sent, mut id) = (0, 0);
        for step in 0..steps {
            let now = step * STEP_MS;
            p.refill(now, rates, true, chunk);
            while p.allows(now, chunk) {
                p.spend(chunk);
                p.asked(id, now);
                p.answered(id, now + answer_ms);
                id += 1;
                sent += chunk;
            }
            p.check().unwrap();
        }
        (sent, p.loaded_rate)
    }

    #[test]
    fn under_load_fast_answers_raise_the_rate_and_slow_ones_hold_it_at_the_minimum() {
        let rates = ResyncRates {
            min: 10 * MIB,
            max: 0,
        };
        let (fast, fast_rate) = under_load(rates, 1, 20);
        let (slow, slow_rate) = under_load(rates, DELAY_TARGET_MS + 5, 20);
        assert_eq!(slow_rate, 10 * MIB, "slow answers keep the minimum");
        // 2 s at 10 MiB/s, plus the first tenth of a second's burst: it always moves.
        assert!((20 * MIB..=22 * MIB).contains(&slow), "{slow}");
        assert!(fast_rate > 500 * MIB, "fast answers raise it: {fast_rate}");
        assert!(fast > 10 * slow, "{fast} vs {slow}");
        let capped = ResyncRates {
            min: 10 * MIB,
            max: 40 * MIB,
        };
        assert_eq!(
            under_load(capped, 1, 20).1,
            40 * MIB,
            "never above the maximum"
        );
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
