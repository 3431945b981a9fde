//! Resync progress as an operator reads it: percent done, rate, time left. The engine
//! says how much is left (and, on a sync target, how much it pulled); the rate needs time,
//! so the loop samples every resync once a second (`NodeReactor::sample_resyncs`) and
//! `tandem status` reads the samples. Pure: time comes in as milliseconds.

use std::collections::{HashMap, VecDeque};

/// Samples kept per resync: the rate is measured over the last ~10 s, so it follows a
/// resync slowed by foreground writes rather than averaging since the start.
const WINDOW: usize = 10;

/// One resync seen from this node: ours from a source, or a peer's from us.
#[derive(Debug)]
pub(super) struct Progress {
    /// (time, bytes done) samples, oldest first.
    samples: VecDeque<(u64, u64)>,
    /// The most bytes left seen at once: a sync source, which counts nothing, has done
    /// this less what is left.
    most_left: u64,
}

/// What `tandem status` shows of one resync.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct View {
    pub(super) done: u64,
    pub(super) left: u64,
    pub(super) percent: f64,
    /// Bytes per second over the window; `None` until two samples are a moment apart.
    pub(super) rate: Option<u64>,
    /// Seconds left at that rate.
    pub(super) eta_s: Option<u64>,
}

impl Progress {
    fn new(now_ms: u64, done: Option<u64>, left: u64) -> Progress {
        let mut p = Progress {
            samples: VecDeque::with_capacity(WINDOW),
            most_left: left,
        };
        p.sample(now_ms, done, left);
        p
    }

    fn sample(&mut self, now_ms: u64, done: Option<u64>, left: u64) {
        self.most_left = self.most_left.max(left);
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        let done = self.done(done, left);
        self.samples.push_back((now_ms, done));
    }

    fn done(&self, done: Option<u64>, left: u64) -> u64 {
        done.unwrap_or_else(|| self.most_left.saturating_sub(left))
    }

    /// With `done` bytes pulled (`None` on a source: derived from what is left).
    pub(super) fn view(&self, now_ms: u64, done: Option<u64>, left: u64) -> View {
        let done = self.done(done, left);
        let percent = percent(done, left);
        let &(t0, d0) = self.samples.front().expect("a progress has a sample");
        let elapsed = now_ms.saturating_sub(t0);
        let rate = (elapsed >= 500).then(|| done.saturating_sub(d0) * 1000 / elapsed);
        let eta_s = rate.filter(|&r| r > 0).map(|r| left.div_ceil(r));
        View {
            done,
            left,
            percent,
            rate,
            eta_s,
        }
    }
}

/// How far a resync with `done` bytes done and `left` to go is (100 when there was
/// nothing to do).
pub(super) fn percent(done: u64, left: u64) -> f64 {
    match done.saturating_add(left) {
        0 => 100.0,
        total => done as f64 * 100.0 / total as f64,
    }
}

/// Every resync this node takes part in, by a key the caller chooses.
#[derive(Debug, Default)]
pub(super) struct Resyncs<K> {
    live: HashMap<K, Progress>,
}

impl<K: std::hash::Hash + Eq + Copy> Resyncs<K> {
    /// One round of samples: `seen` names every resync running now (key, bytes done as
    /// the engine counts them or `None` on a source, bytes left); resyncs not named ended
    /// and are forgotten.
    pub(super) fn sample(
        &mut self,
        now_ms: u64,
        seen: impl IntoIterator<Item = (K, Option<u64>, u64)>,
    ) {
        let mut keep = Vec::new();
        for (k, done, left) in seen {
            keep.push(k);
            match self.live.get_mut(&k) {
                // A new resync (the target's count went back): start over.
                Some(p) if done.is_some_and(|d| p.samples.back().is_some_and(|&(_, l)| l > d)) => {
                    *p = Progress::new(now_ms, done, left)
                }
                Some(p) => p.sample(now_ms, done, left),
                None => {
                    self.live.insert(k, Progress::new(now_ms, done, left));
                }
            }
        }
        self.live.retain(|k, _| keep.contains(k));
    }

    pub(super) fn get(&self, k: &K) -> Option<&Progress> {
        self.live.get(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_reports_percent_rate_and_time_left() {
        let mut r = Resyncs::default();
        r.sample(0, [(1, Some(0), 1000 << 20)]);
        r.sample(1000, [(1, Some(100 << 20), 900 << 20)]);
        r.sample(2000, [(1, Some(200 << 20), 800 << 20)]);
        let v = r.get(&1).unwrap().view(2000, Some(200 << 20), 800 << 20);
        assert_eq!(v.done, 200 << 20);
        assert!((v.percent - 20.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.rate, Some(100 << 20));
        assert_eq!(v.eta_s, Some(8));
    }

    #[test]
    fn a_source_counts_from_the_most_it_had_left() {
        let mut r = Resyncs::default();
        r.sample(0, [(7, None, 400)]);
        r.sample(1000, [(7, None, 100)]);
        let v = r.get(&7).unwrap().view(1000, None, 100);
        assert_eq!((v.done, v.left), (300, 100));
        assert!((v.percent - 75.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.rate, Some(300));
        assert_eq!(v.eta_s, Some(1));
    }

    #[test]
    fn no_rate_before_half_a_second_and_ended_resyncs_are_forgotten() {
        let mut r = Resyncs::default();
        r.sample(0, [(1, Some(0), 10), (2, Some(0), 10)]);
        assert_eq!(r.get(&1).unwrap().view(100, Some(5), 5).rate, None);
        r.sample(1000, [(2, Some(5), 5)]);
        assert!(r.get(&1).is_none());
        // A count that goes back is a new resync.
        r.sample(2000, [(2, Some(1), 9)]);
        let v = r.get(&2).unwrap().view(2000, Some(1), 9);
        assert_eq!(v.rate, None);
    }
}

/// `bytes` in `secs` seconds, as the log says it: "9.6 MiB in 2.0 s (4.8 MiB/s)".
pub(super) fn amount_and_rate(bytes: u64, secs: f64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if secs < 0.001 {
        return format!("{mib:.1} MiB at once");
    }
    let places = if secs < 1.0 { 3 } else { 1 };
    format!(
        "{mib:.1} MiB in {secs:.places$} s ({:.1} MiB/s)",
        mib / secs
    )
}

#[cfg(test)]
mod amount_tests {
    use super::amount_and_rate;

    #[test]
    fn amounts_and_rates_read_as_an_operator_expects() {
        assert_eq!(
            amount_and_rate(10 << 20, 2.0),
            "10.0 MiB in 2.0 s (5.0 MiB/s)"
        );
        assert_eq!(
            amount_and_rate(6 << 20, 0.014),
            "6.0 MiB in 0.014 s (428.6 MiB/s)"
        );
        assert_eq!(amount_and_rate(0, 0.0), "0.0 MiB at once");
    }
}
