//! The events stream's watchers (`tandem events`, and the status page's `/events`): each
//! gets every object's line as it exists, the end marker, then the changes (the page gets
//! only the changes, as Server-Sent Events). A resource is diffed (`crate::events::diff`)
//! only after something touched it (an engine event, a peer connected or lost, an admin
//! verb, or the tick's sweep), and only while someone watches. A watcher that falls behind by more than
//! `BACKLOG_MAX` is dropped, with a line in the log: it never holds up I/O or memory.
//! Watchers that asked for `--statistics` get the counters on every line, and a line for
//! a change of counters alone, at most every `STATISTICS_EVERY_MS` per resource; the
//! others get the lines without them, as before.

use super::state::{Entry, NodeReactor};
use crate::events::{diff, lines, statistics_diff, EventLine, Sent};
use rustc_hash::FxHashMap as HashMap;
use tracing::warn;

/// A resource's counters alone change a line at most this often (writes in flight and
/// out-of-sync move with every write).
const STATISTICS_EVERY_MS: u64 = 1000;

/// Bytes queued for one watcher before it is dropped.
const BACKLOG_MAX: usize = 4 << 20;

/// Resources diffed at each housekeeping tick (100 ms) besides the touched ones: a peer's
/// disk and replication states change without an engine event (its reports arrive as
/// packets), so a sweep finds them, within 100 ms for up to this many resources and
/// within 2 s for 1000. Bounded, so that watching 1000 resources never stalls the loop
/// (their status takes ~10 ms all at once).
const SWEEP: usize = 50;

impl NodeReactor {
    /// Resource `r` may have changed: diffed at the end of this round if anyone watches.
    pub(super) fn touch(&mut self, r: usize) {
        if !self.watchers.is_empty() && !self.events_touched.contains(&r) {
            self.events_touched.push(r);
        }
    }

    /// The tick's share of the sweep (see `SWEEP`).
    pub(super) fn sweep_events(&mut self) {
        if self.watchers.is_empty() || self.res.is_empty() {
            return;
        }
        let n = self.res.len();
        for i in 0..SWEEP.min(n) {
            self.touch((self.events_sweep + i) % n);
        }
        self.events_sweep = (self.events_sweep + SWEEP) % n;
    }

    /// Control connection `k` asked for the events stream (with the counters if
    /// `statistics`).
    pub(super) fn watch_events(&mut self, k: usize, now: bool, statistics: bool) {
        // Earlier watchers first get what changed up to here.
        self.send_events();
        let mut dump = Vec::new();
        let mut sent = Vec::new();
        for status in self.status(None) {
            let ls = lines(&status);
            dump.extend(ls.iter().cloned());
            sent.push((status.name, ls));
        }
        let now_ms = self.now_ms();
        let Some(Entry::Control(c)) = self.entries.get_mut(k) else {
            return;
        };
        c.statistics = statistics;
        for l in &dump {
            match statistics {
                true => c.queue_json(l),
                false => c.queue_json(&l.without_statistics()),
            }
        }
        c.queue_json(&EventLine::end_of_dump());
        if now {
            c.finish();
            return;
        }
        if self.watchers.is_empty() {
            self.events_sent = baseline(sent, now_ms);
        }
        self.watchers.push(k);
    }

    /// Metrics connection `k` asked for `/events` (the status page): the changes from
    /// now on, as Server-Sent Events; the page reads the state itself (`/status.json`).
    pub(super) fn watch_http(&mut self, k: usize) {
        self.send_events();
        if self.watchers.is_empty() {
            let sent = (self.status(None).into_iter())
                .map(|status| {
                    let ls = lines(&status);
                    (status.name, ls)
                })
                .collect();
            self.events_sent = baseline(sent, self.now_ms());
        }
        self.watchers.push(k);
    }

    /// Whether any watcher wants the counters.
    fn statistics_watched(&self) -> bool {
        self.watchers
            .iter()
            .any(|&k| matches!(self.entries.get(k), Some(Entry::Control(c)) if c.statistics))
    }

    /// The changes of every touched resource, to every watcher.
    pub(super) fn send_events(&mut self) {
        let touched = std::mem::take(&mut self.events_touched);
        if self.watchers.is_empty() {
            return;
        }
        let watched = self.statistics_watched();
        let now_ms = self.now_ms();
        // Each line, and whether it is a change of counters alone (for `--statistics`).
        let mut changes: Vec<(EventLine, bool)> = Vec::new();
        for r in touched {
            let name = self.res[r].cfg.name.clone();
            // None for a resource stopped here (`tandem adjust`): its lines are destroyed.
            let status = self.status(Some(&name)).into_iter().next();
            let mut now = status.as_ref().map(lines).unwrap_or_default();
            let mut sent = self.events_sent.remove(&name).unwrap_or_default();
            changes.extend(diff(&sent.lines, &now).into_iter().map(|l| (l, false)));
            let due = watched && now_ms >= sent.statistics_ms + STATISTICS_EVERY_MS;
            let counters = statistics_diff(&sent.lines, &mut now, due);
            if !counters.is_empty() {
                sent.statistics_ms = now_ms;
            }
            changes.extend(counters.into_iter().map(|l| (l, true)));
            sent.lines = now;
            self.events_sent.insert(name, sent);
        }
        if changes.is_empty() {
            return;
        }
        for k in self.watchers.clone() {
            let backlog = match self.entries.get_mut(k) {
                Some(Entry::Control(c)) => {
                    for (l, counters_alone) in &changes {
                        match (c.statistics, counters_alone) {
                            (true, _) => c.queue_json(l),
                            (false, false) => c.queue_json(&l.without_statistics()),
                            (false, true) => {}
                        }
                    }
                    c.backlog()
                }
                Some(Entry::Http(h)) => {
                    for (l, _) in changes.iter().filter(|(_, counters_alone)| !counters_alone) {
                        h.queue_event(&l.without_statistics());
                    }
                    h.backlog()
                }
                _ => continue,
            };
            if backlog > BACKLOG_MAX {
                warn!(
                    "an events watcher fell {backlog} bytes behind: dropped (it never slows I/O)"
                );
                self.remove_entry(k);
                continue;
            }
            self.mark_dirty(k);
        }
    }
}

/// What every watcher is taken to have been sent when the first one starts: each
/// resource's lines as they are now.
fn baseline(sent: Vec<(String, Vec<EventLine>)>, now_ms: u64) -> HashMap<String, Sent> {
    (sent.into_iter())
        .map(|(name, lines)| {
            let statistics_ms = now_ms;
            (
                name,
                Sent {
                    lines,
                    statistics_ms,
                },
            )
        })
        .collect()
}
