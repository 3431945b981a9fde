//! DRBD's dynamic resync controller (`drbd_rs_controller`, c-plan-ahead), sans I/O: once
//! a step (`STEP_MS`, DRBD's 100 ms) it is told what arrived in the step and what is
//! still in flight, and says how much to ask for in the next one.
//!
//! It steers the bytes in flight toward `want`: the fill target if one is set, else what
//! arrives in `delay_target` at the rate that arrived in the step (by Little's law, the
//! resync's requests then take about `delay_target` to be answered: data queued beyond it
//! on the link or the source's disk would delay the application's writes behind it). The
//! gap (`want − in flight − what is already planned`) is not closed at once but spread in
//! equal shares over the `steps` coming steps (a FIFO of planned corrections, the plan
//! ahead), so a measurement that lags (what arrives now was asked for a round trip ago)
//! does not make it overshoot. This step asks for what arrived plus this step's share
//! (never less than nothing). The floor (`resync-min-rate`) and the ceiling
//! (`resync-max-rate`) are applied by the caller (`pace.rs`).

use std::collections::VecDeque;

/// The controller's step (ms).
pub(super) const STEP_MS: u64 = 100;

/// What the controller steers toward.
#[derive(Clone, Copy, Debug)]
pub(super) struct Targets {
    /// Bytes in flight to keep (0: derived from `delay_ms`).
    pub fill: u64,
    /// Without a fill target, keep this many ms worth of the arrival rate in flight.
    pub delay_ms: u64,
    /// Steps the corrections are spread over (at least 1).
    pub steps: usize,
}

/// The plan: corrections (bytes) for the coming steps, this one's first.
#[derive(Debug, Default)]
pub(super) struct PlanAhead {
    fifo: VecDeque<i64>,
    /// The sum of `fifo`.
    planned: i64,
}

impl PlanAhead {
    /// One step: `arrived` bytes answered in the last step (scaled to `STEP_MS`) and
    /// `in_flight` bytes asked and not answered; the bytes to ask for in this step.
    pub(super) fn step(&mut self, arrived: u64, in_flight: u64, t: Targets) -> u64 {
        let steps = t.steps.max(1);
        if self.fifo.len() != steps {
            self.fifo = vec![0; steps].into();
            self.planned = 0;
        }
        let want = if t.fill != 0 {
            t.fill
        } else {
            arrived.saturating_mul(t.delay_ms) / STEP_MS
        };
        let want = i64::try_from(want).unwrap_or(i64::MAX / 4);
        let in_flight = i64::try_from(in_flight).unwrap_or(i64::MAX / 4);
        let correction = want - in_flight - self.planned;
        let share = correction / steps as i64;
        for slot in &mut self.fifo {
            *slot += share;
        }
        self.planned += share * steps as i64;
        let now = self.fifo.pop_front().unwrap_or(0);
        self.fifo.push_back(0);
        self.planned -= now;
        u64::try_from(i64::try_from(arrived).unwrap_or(i64::MAX / 4) + now).unwrap_or(0)
    }

    /// Forgets the plan (the controller starts over).
    pub(super) fn reset(&mut self) {
        self.fifo.clear();
        self.planned = 0;
    }

    pub(super) fn check(&self) -> Result<(), String> {
        let sum: i64 = self.fifo.iter().sum();
        if sum != self.planned {
            return Err(format!(
                "resync plan sums to {sum}, its total says {}",
                self.planned
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Targets = Targets {
        fill: 0,
        delay_ms: 20,
        steps: 20,
    };

    #[test]
    fn on_target_it_asks_for_what_arrived() {
        let mut p = PlanAhead::default();
        // 1 MB a step arrives, 200 KB (20 ms of it) in flight: nothing to correct.
        for _ in 0..50 {
            assert_eq!(p.step(1_000_000, 200_000, T), 1_000_000);
        }
        p.check().unwrap();
    }

    #[test]
    fn a_gap_is_closed_in_shares_over_the_plan_not_at_once() {
        let mut p = PlanAhead::default();
        // Nothing in flight, 200 KB wanted: a twentieth of it this step.
        let first = p.step(1_000_000, 0, T);
        assert_eq!(first, 1_000_000 + 10_000);
        // The same measurement again: the gap is planned already, the next share comes.
        assert_eq!(p.step(1_000_000, 0, T), 1_000_000 + 10_000 + 500);
        p.check().unwrap();
        // Too much in flight: it asks for less than arrived, never less than nothing.
        let mut p = PlanAhead::default();
        assert!(p.step(1_000_000, 5_000_000, T) < 1_000_000);
        let mut p = PlanAhead::default();
        assert_eq!(p.step(0, 100_000_000, T), 0);
    }

    #[test]
    fn a_fill_target_overrides_the_delay_target() {
        let mut p = PlanAhead::default();
        let fill = Targets {
            fill: 2_000_000,
            ..T
        };
        // 2 MB wanted, none in flight: 100 KB more this step, though nothing arrived.
        assert_eq!(p.step(0, 0, fill), 100_000);
    }
}
