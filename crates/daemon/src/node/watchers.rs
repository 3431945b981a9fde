//! The events stream's watchers (`tandem events`): each gets every object's line as it
//! exists, the end marker, then the changes. A resource is diffed (`crate::events::diff`)
//! only after something touched it (an engine event, a peer connected or lost, an admin
//! verb, or the tick's sweep), and only while someone watches. A watcher that falls behind by more than
//! `BACKLOG_MAX` is dropped, with a line in the log: it never holds up I/O or memory.

use super::state::{Entry, NodeReactor};
use crate::events::{diff, lines, EventLine};
use tracing::warn;

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

    /// Control connection `k` asked for the events stream.
    pub(super) fn watch_events(&mut self, k: usize, now: bool) {
        // Earlier watchers first get what changed up to here.
        self.send_events();
        let mut dump = Vec::new();
        let mut sent = Vec::new();
        for status in self.status(None) {
            let ls = lines(&status);
            dump.extend(ls.iter().cloned());
            sent.push((status.name, ls));
        }
        let Some(Entry::Control(c)) = self.entries.get_mut(k) else {
            return;
        };
        for l in &dump {
            c.queue_json(l);
        }
        c.queue_json(&EventLine::end_of_dump());
        if now {
            c.finish();
            return;
        }
        if self.watchers.is_empty() {
            self.events_sent = sent.into_iter().collect();
        }
        self.watchers.push(k);
    }

    /// The changes of every touched resource, to every watcher.
    pub(super) fn send_events(&mut self) {
        let touched = std::mem::take(&mut self.events_touched);
        if self.watchers.is_empty() {
            return;
        }
        let mut changes = Vec::new();
        for r in touched {
            let name = self.res[r].cfg.name.clone();
            let Some(status) = self.status(Some(&name)).into_iter().next() else {
                continue;
            };
            let now = lines(&status);
            let before = self.events_sent.remove(&name).unwrap_or_default();
            changes.extend(diff(&before, &now));
            self.events_sent.insert(name, now);
        }
        if changes.is_empty() {
            return;
        }
        for k in self.watchers.clone() {
            let Some(Entry::Control(c)) = self.entries.get_mut(k) else {
                continue;
            };
            for l in &changes {
                c.queue_json(l);
            }
            if c.backlog() > BACKLOG_MAX {
                warn!(
                    "an events watcher fell {} bytes behind: dropped (it never slows I/O)",
                    c.backlog()
                );
                self.remove_entry(k);
                continue;
            }
            self.mark_dirty(k);
        }
    }
}
