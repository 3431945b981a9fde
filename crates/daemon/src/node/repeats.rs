//! A steady condition (a peer that stays unreachable, one that keeps refusing us) is logged
//! once when it begins, then summed up at growing intervals: after 1 minute, 2, 4, ... up
//! to an hour, then every hour. An operator reading the log long after the first line sees
//! that it still holds and how often it was met, and a peer that is away for a week costs
//! about 170 lines, not one per attempt. Pure: the caller passes the time.

use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_secs(60);
const LONGEST: Duration = Duration::from_secs(3600);

/// One condition met again and again since `since`.
#[derive(Clone, Debug)]
pub struct Repeats {
    since: Instant,
    /// Times met, the first included.
    count: u64,
    gap: Duration,
    next_summary: Instant,
}

/// What a summary line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Since the condition began.
    pub lasted: Duration,
    /// Times met since it began.
    pub count: u64,
}

impl Repeats {
    /// The condition begins (its first line is the caller's).
    pub fn begin(now: Instant) -> Repeats {
        Repeats {
            since: now,
            count: 1,
            gap: FIRST,
            next_summary: now + FIRST,
        }
    }

    /// How long it has held at `now`.
    pub fn lasted(&self, now: Instant) -> Duration {
        now - self.since
    }

    /// Met again: a summary when one is due.
    pub fn again(&mut self, now: Instant) -> Option<Summary> {
        self.count += 1;
        if now < self.next_summary {
            return None;
        }
        self.gap = (self.gap * 2).min(LONGEST);
        self.next_summary = now + self.gap;
        Some(Summary {
            lasted: now - self.since,
            count: self.count,
        })
    }
}

/// "45 s", "3 min", "2 h 5 min", "3 d 4 h": as precise as a summary needs.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h} h"),
            (h, m) => format!("{h} h {m} min"),
        },
        _ => match (s / 86400, s % 86400 / 3600) {
            (d, 0) => format!("{d} d"),
            (d, h) => format!("{d} d {h} h"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_come_at_growing_intervals_up_to_an_hour() {
        let t0 = Instant::now();
        let mut r = Repeats::begin(t0);
        let mut lines = Vec::new();
        // An attempt every 200 ms for a day.
        let step = Duration::from_millis(200);
        let mut now = t0;
        for _ in 0..(86400 * 5) {
            now += step;
            if let Some(s) = r.again(now) {
                lines.push(s);
            }
        }
        let minutes: Vec<u64> = lines
            .iter()
            .take(8)
            .map(|s| s.lasted.as_secs() / 60)
            .collect();
        assert_eq!(minutes, [1, 3, 7, 15, 31, 63, 123, 183]);
        // After the first hour's worth of doubling, one an hour: about 24 + 6 in a day.
        assert!((28..=31).contains(&lines.len()), "{} lines", lines.len());
        let last = lines.last().unwrap();
        assert_eq!(last.count, 1 + (last.lasted.as_millis() / 200) as u64);
    }

    #[test]
    fn nothing_is_said_within_the_first_minute() {
        let t0 = Instant::now();
        let mut r = Repeats::begin(t0);
        for k in 1..300 {
            assert_eq!(r.again(t0 + Duration::from_millis(k * 200)), None);
        }
        assert_eq!(
            r.again(t0 + FIRST),
            Some(Summary {
                lasted: FIRST,
                count: 301
            })
        );
    }

    #[test]
    fn durations_read_as_an_operator_would_say_them() {
        let h = |s| human(Duration::from_secs(s));
        assert_eq!(h(45), "45 s");
        assert_eq!(h(180), "3 min");
        assert_eq!(h(7500), "2 h 5 min");
        assert_eq!(h(7200), "2 h");
        assert_eq!(h(3 * 86400 + 4 * 3600 + 59), "3 d 4 h");
    }
}
