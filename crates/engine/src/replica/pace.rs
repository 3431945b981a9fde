//! How fast a sync target pulls: the resync-rate controller.
//!
//! The window of requests in flight (`resync_window` × `resync_chunk`) bounds what is in
//! flight: each reply lets the next request go, so an idle resync runs at the rate the
//! source, the link and the disk give, up to `resync_max_rate`. While the application
//! writes to the volume (a write submitted here or replicated to us in the last
//! `LOAD_WINDOW_MS`), DRBD's dynamic controller (`plan_ahead.rs`) sets the rate every
//! `STEP_MS` from what arrived in the step and what is in flight, steering the bytes in
//! flight toward the fill target or, without one, toward what arrives in the delay target:
//! queued beyond that the resync would delay the application's writes on the link or the
//! disk. It starts at `resync_min_rate` and never goes below it (DRBD's controller and
//! c-min-rate may starve a resync under steady load; this one always finishes) nor above
//! `resync_max_rate`. With no plan ahead (`plan_ahead_ms` 0) the rate under load is the
//! minimum, fixed. A token bucket per resync: the budget grows with time at the rate in
//! force, up to a step of it (at least one request), and each request spends its length.

use super::plan_ahead::{PlanAhead, Targets, STEP_MS};

/// Writes this recent (ms) mean the application is writing to the volume.
pub(super) const LOAD_WINDOW_MS: u64 = 200;

/// Rates in bytes per second (0 means unlimited) and the controller's targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResyncRates {
    /// While the application writes to the volume, at least (0: not held back).
    pub min: u64,
    /// At most, always (0: unlimited).
    pub max: u64,
    /// The controller spreads its corrections over this (ms, a multiple of 100); 0: no
    /// controller, the resync goes at `min` under load.
    pub plan_ahead_ms: u64,
    /// Bytes in flight the controller keeps (0: derived from `delay_target_ms`).
    pub fill_target: u64,
    /// Without a fill target, the controller keeps this many ms worth of the rate that
    /// arrives in flight: about how long a resync request then waits to be answered.
    pub delay_target_ms: u64,
}

impl ResyncRates {
    /// Never held back; the controller's default targets (used only with a minimum).
    pub const UNLIMITED: ResyncRates = ResyncRates {
        min: 0,
        max: 0,
        plan_ahead_ms: 500,
        fill_target: 0,
        delay_target_ms: 20,
    };

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
    /// Bytes answered since the step began.
    arrived: u64,
    /// Bytes in flight, since when (ms), and their integral over the step (byte·ms): the
    /// controller steers the step's mean, not a sample that a request's phase decides.
    in_flight: u64,
    in_flight_at_ms: u64,
    in_flight_sum: u64,
    plan: PlanAhead,
}

impl Pace {
    /// Refills for the time since the last refill, at the rate in force now; `in_flight`:
    /// bytes asked for and not answered.
    pub(super) fn refill(
        &mut self,
        now_ms: u64,
        rates: ResyncRates,
        loaded: bool,
        chunk: u64,
        in_flight: u64,
    ) {
        self.integrate(now_ms);
        self.in_flight = in_flight;
        let rate = if loaded && rates.min != 0 {
            self.controlled(now_ms, rates)
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
        let cap = (rate * STEP_MS / 1000).max(chunk);
        self.cap = cap;
        let grown = if first {
            cap
        } else {
            rate.saturating_mul(elapsed) / 1000
        };
        self.budget = self.budget.saturating_add(grown).min(cap);
    }

    /// The rate under load: the minimum at first, then set once a step by the controller,
    /// within the minimum and the maximum.
    fn controlled(&mut self, now_ms: u64, rates: ResyncRates) -> u64 {
        match self.step_at_ms {
            None => {
                self.loaded_rate = rates.now(true);
                self.step_at_ms = Some(now_ms);
                self.arrived = 0;
                self.in_flight_sum = 0;
                self.plan.reset();
            }
            Some(t) if now_ms.saturating_sub(t) >= STEP_MS && rates.plan_ahead_ms != 0 => {
                let elapsed = now_ms - t;
                let arrived = self.arrived.saturating_mul(STEP_MS) / elapsed;
                let in_flight = self.in_flight_sum / elapsed;
                let targets = Targets {
                    fill: rates.fill_target,
                    delay_ms: rates.delay_target_ms,
                    steps: (rates.plan_ahead_ms / STEP_MS) as usize,
                };
                let ask = self.plan.step(arrived, in_flight, targets);
                let rate = ask.saturating_mul(1000) / STEP_MS;
                self.loaded_rate = rate.max(rates.min);
                if rates.max != 0 {
                    self.loaded_rate = self.loaded_rate.min(rates.max);
                }
                self.step_at_ms = Some(now_ms);
                self.arrived = 0;
                self.in_flight_sum = 0;
            }
            Some(_) => {}
        }
        self.loaded_rate
    }

    /// Adds the bytes in flight since the last event to the step's integral.
    fn integrate(&mut self, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.in_flight_at_ms);
        self.in_flight_sum = (self.in_flight_sum).saturating_add(self.in_flight.saturating_mul(dt));
        self.in_flight_at_ms = self.in_flight_at_ms.max(now_ms);
    }

    /// A request of `len` bytes was answered now.
    pub(super) fn answered(&mut self, now_ms: u64, len: u64) {
        self.integrate(now_ms);
        self.in_flight = self.in_flight.saturating_sub(len);
        self.arrived = self.arrived.saturating_add(len);
    }

    /// No request waits for the budget (until [`Pace::allows`] says otherwise): the wake-up
    /// it asked for is moot. Left set once the source went away, it stayed in the past
    /// and a driver was woken without end (failover seed 1231).
    pub(super) fn nothing_waits(&mut self) {
        self.wake_ms = None;
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

    /// A request of `len` bytes went now.
    pub(super) fn spend(&mut self, now_ms: u64, len: u64) {
        self.integrate(now_ms);
        self.in_flight = self.in_flight.saturating_add(len);
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
        self.plan.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;

    #[test]
    fn unlimited_never_holds_back() {
        let mut p = Pace::default();
        p.refill(0, ResyncRates::UNLIMITED, true, MIB, 0);
        for _ in 0..1000 {
            assert!(p.allows(0, MIB));
            p.spend(0, MIB);
        }
    }

    /// A link of `bytes_per_s` (0: unlimited) to a source that answers at once; the round
    /// trip (ms) at each time (ms) is `rtt`. Requests are carried and answered in order.
    struct Link {
        bytes_per_s: u64,
        rtt: fn(u64) -> u64,
    }

    /// What a run saw from a time on.
    #[derive(Debug, Default)]
    struct Seen {
        /// Bytes answered, per second.
        rate: u64,
        /// The slowest answer (ms).
        slowest_ms: u64,
    }

    /// A loaded resync of `chunk`-byte requests, at most `window` in flight, over `link`
    /// for `run_ms`: what it saw in the last `last_ms`, and the slowest answer of the
    /// whole run.
    fn over_link(
        rates: ResyncRates,
        link: Link,
        chunk: u64,
        window: usize,
        run_ms: u64,
        last_ms: u64,
    ) -> (Seen, u64) {
        let mut p = Pace::default();
        let (mut answered, mut seen_slowest, mut slowest) = (0, 0, 0);
        // When the link is free to carry the next request (µs); requests in flight:
        // (answered at µs, sent at ms, length).
        let mut busy_until_us = 0;
        let mut in_flight: VecDeque<(u64, u64, u64)> = VecDeque::new();
        for now in 0..run_ms {
            while let Some(&(at_us, sent, len)) = in_flight.front() {
                if at_us > now * 1000 {
                    break;
                }
                in_flight.pop_front();
                p.answered(now, len);
                slowest = slowest.max(now - sent);
                if now >= run_ms - last_ms {
                    answered += len;
                    seen_slowest = seen_slowest.max(now - sent);
                }
            }
            let bytes = in_flight.iter().map(|r| r.2).sum();
            p.refill(now, rates, true, chunk, bytes);
            while in_flight.len() < window && p.allows(now, chunk) {
                p.spend(now, chunk);
                let rtt_us = (link.rtt)(now) * 1000;
                let start = busy_until_us.max(now * 1000 + rtt_us / 2);
                let done = match link.bytes_per_s {
                    0 => start,
                    b => start + chunk * 1_000_000 / b,
                };
                busy_until_us = done;
                in_flight.push_back((done + rtt_us / 2, now, chunk));
            }
            p.check().unwrap();
        }
        let seen = Seen {
            rate: answered * 1000 / last_ms,
            slowest_ms: seen_slowest,
        };
        (seen, slowest)
    }

    fn loaded(min: u64, max: u64) -> ResyncRates {
        ResyncRates {
            min,
            max,
            ..ResyncRates::UNLIMITED
        }
    }

    fn fixed(bytes_per_s: u64, rtt: fn(u64) -> u64) -> Link {
        Link { bytes_per_s, rtt }
    }

    /// Under load on a link of 20 MiB/s and 2 ms, with the defaults (delay target 20 ms,
    /// plan ahead 500 ms): from the minimum (2 MiB/s) it reaches the link's rate, and
    /// keeps about the delay target in flight: never much more on the way (no
    /// overshoot), and the link used, not starved, once there.
    #[test]
    fn under_load_it_converges_to_the_link_rate_without_overshoot() {
        let rates = loaded(2 * MIB, 0);
        let (seen, slowest) = over_link(rates, fixed(20 * MIB, |_| 2), 64 * KIB, 64, 8_000, 2_000);
        assert!(seen.rate >= 19 * MIB, "{seen:?}");
        // 20 ms in flight, with a request's own 3 ms on the link and the round trip.
        assert!((15..=25).contains(&seen.slowest_ms), "{seen:?}");
        assert!(
            slowest <= 25,
            "overshoot on the way: an answer took {slowest} ms"
        );
        // With a fill target of 1 MiB: about 50 ms in flight at 20 MiB/s.
        let fill = ResyncRates {
            fill_target: MIB,
            ..rates
        };
        let (seen, slowest) = over_link(fill, fixed(20 * MIB, |_| 2), 64 * KIB, 64, 8_000, 2_000);
        assert!(seen.rate >= 19 * MIB, "{seen:?}");
        assert!((45..=60).contains(&seen.slowest_ms), "{seen:?}");
        assert!(
            slowest <= 60,
            "overshoot on the way: an answer took {slowest} ms"
        );
        // A longer delay target on a slow link (5 MiB/s, 256 KiB requests of 50 ms each):
        // the link's rate with about 100 ms in flight.
        let slow_link = ResyncRates {
            delay_target_ms: 100,
            ..loaded(MIB, 0)
        };
        let (seen, slowest) =
            over_link(slow_link, fixed(5 * MIB, |_| 2), 256 * KIB, 8, 8_000, 2_000);
        assert!(seen.rate >= 4_900 * KIB, "{seen:?}");
        assert!((90..=115).contains(&seen.slowest_ms), "{seen:?}");
        assert!(
            slowest <= 115,
            "overshoot on the way: an answer took {slowest} ms"
        );
    }

    /// Answers slower than the delay target (the round trip goes from 1 ms to 60 ms after
    /// 3 s: the resync queues behind something) bring it back down to the minimum, and
    /// no lower.
    #[test]
    fn slow_answers_back_off_to_the_minimum_and_never_below() {
        let rates = loaded(4 * MIB, 0);
        let fast = |_| 1;
        let (up, _) = over_link(rates, fixed(0, fast), 64 * KIB, 256, 3_000, 1_000);
        assert!(up.rate > 16 * MIB, "fast answers raise it: {up:?}");
        let slowing = |now| if now < 3_000 { 1 } else { 60 };
        let (down, _) = over_link(rates, fixed(0, slowing), 64 * KIB, 256, 9_000, 2_000);
        assert!(
            (3_900 * KIB..=4_400 * KIB).contains(&down.rate),
            "slow answers: {} KiB/s, minimum 4 MiB/s",
            down.rate / KIB
        );
        // A minimum above the link's rate: the minimum is asked for (the configuration
        // wants it), queued on the link, and the resync moves at the link's rate.
        let (over, _) = over_link(
            loaded(40 * MIB, 0),
            fixed(20 * MIB, |_| 2),
            64 * KIB,
            1024,
            4_000,
            2_000,
        );
        assert!(over.rate >= 19 * MIB, "{over:?}");
    }

    /// Never above the maximum, loaded or idle; never held back when idle without one.
    #[test]
    fn the_maximum_caps_it_and_idle_without_one_is_unlimited() {
        let capped = loaded(MIB, 8 * MIB);
        let (seen, _) = over_link(capped, fixed(0, |_| 1), 64 * KIB, 256, 5_000, 2_000);
        assert!(
            (7 * MIB..=8 * MIB + 64 * KIB).contains(&seen.rate),
            "{} KiB/s, maximum 8 MiB/s",
            seen.rate / KIB
        );
        let rates = loaded(50 * MIB, 20 * MIB);
        assert_eq!(rates.now(false), 20 * MIB);
        assert_eq!(rates.now(true), 20 * MIB);
        let idle = loaded(5, 0);
        assert_eq!(idle.now(false), 0);
        assert_eq!(idle.now(true), 5);
        let mut p = Pace::default();
        p.refill(0, idle, false, MIB, 0);
        p.refill(100, idle, false, MIB, 100 * MIB);
        for _ in 0..1000 {
            assert!(p.allows(100, MIB));
            p.spend(100, MIB);
        }
    }

    /// Without a plan ahead the rate under load is the minimum, fixed.
    #[test]
    fn no_plan_ahead_holds_it_at_the_minimum() {
        let fixed_rate = ResyncRates {
            plan_ahead_ms: 0,
            ..loaded(4 * MIB, 0)
        };
        let (seen, _) = over_link(fixed_rate, fixed(0, |_| 1), 64 * KIB, 256, 5_000, 2_000);
        assert!(
            (3_900 * KIB..=4_200 * KIB).contains(&seen.rate),
            "{} KiB/s",
            seen.rate / KIB
        );
    }
}
