//! Which fdatasync makes which local writes durable, and starting one before it is asked for.
//!
//! The engine asks for a flush only once every write it must cover has completed, and a
//! sync covers the writes that completed before it started. So each completed local write
//! bumps a generation, each sync is stamped with the generation at its start, and a flush
//! needing generation `g` is answered by any successful sync stamped `>= g` — possibly one
//! already running, or already finished if nothing was written since.
//!
//! **Sync ahead.** When a workload flushes after every few writes (a database committing),
//! the barrier reaches a Secondary a whole round trip after the write it covers (ack to the
//! Primary, reply to the application, its FLUSH, the Barrier: 50–100 µs on loopback, more
//! across a network). Once the recent flushes each covered little data, a write that lands
//! while no sync runs starts one at once, so the barrier finds it under way. A workload
//! that stops flushing stops this after [`AHEAD_WRITES`] writes.
//!
//! Syncs never overlap: Linux reports a writeback error to one fdatasync of a file
//! description, so a sync that returned success while a concurrent one was handed the error
//! would acknowledge a write that never reached the disk. For the same reason, once any
//! sync failed every later flush fails too (the engine fails the disk on the first).

/// A flush covering at most this much written data counts as "small".
const SMALL_FLUSH: u64 = 256 << 10;
/// Syncing ahead starts after this many consecutive small flushes...
const AHEAD_AFTER: u32 = 2;
/// ...and stops after this many writes without a flush.
const AHEAD_WRITES: u32 = 16;

/// Whether a workload flushes after every few small writes.
#[derive(Debug, Default)]
pub struct FlushPattern {
    bytes_since_flush: u64,
    writes_since_flush: u32,
    small_flushes: u32,
}

impl FlushPattern {
    pub fn wrote(&mut self, bytes: u64) {
        self.bytes_since_flush = self.bytes_since_flush.saturating_add(bytes);
        self.writes_since_flush = self.writes_since_flush.saturating_add(1);
    }

    pub fn flushed(&mut self) {
        if self.bytes_since_flush <= SMALL_FLUSH {
            self.small_flushes = self.small_flushes.saturating_add(1);
        } else {
            self.small_flushes = 0;
        }
        self.bytes_since_flush = 0;
        self.writes_since_flush = 0;
    }

    /// The recent flushes each covered little data, and another is probably coming.
    pub fn flush_heavy(&self) -> bool {
        self.small_flushes >= AHEAD_AFTER && self.writes_since_flush <= AHEAD_WRITES
    }
}

/// A sync to start now, covering the writes up to this generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncStart {
    pub gen: u64,
    /// Bytes written since the previous sync started: what this one may have to write
    /// back (saturating; zeroing and trims count as "a lot").
    pub bytes: u64,
}

/// A flush and whether it is durable (`Err`: a sync failed).
pub type Answer<F> = (F, Result<(), ()>);

/// What to do about a flush the engine asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum FlushPlan<F> {
    /// Already durable (or already known to have failed): answer now.
    Answer(F, Result<(), ()>),
    /// A running sync covers it: answered when that sync finishes.
    Wait,
    /// Start this sync; the flush is answered when it finishes.
    Start(SyncStart),
}

#[derive(Debug)]
pub struct SyncPlan<F> {
    /// Local writes (and zeroings, trims) completed.
    written: u64,
    /// Every write up to here is durable.
    synced: u64,
    /// The sync in flight and the generation it covers.
    running: Option<u64>,
    /// The engine's flush in flight (it has one at a time) and the generation it needs.
    pending: Option<(F, u64)>,
    failed: bool,
    /// Bytes written since the last sync started (saturating; zeroing and trims count as
    /// "a lot").
    unsynced: u64,
    pattern: FlushPattern,
}

impl<F> Default for SyncPlan<F> {
    fn default() -> Self {
        SyncPlan {
            written: 0,
            synced: 0,
            running: None,
            pending: None,
            failed: false,
            unsynced: 0,
            pattern: FlushPattern::default(),
        }
    }
}

impl<F> SyncPlan<F> {
    /// A local write of `bytes` completed (`u64::MAX` for work of unknown size). Returns a
    /// sync to start ahead, if the workload calls for one.
    pub fn wrote(&mut self, bytes: u64) -> Option<SyncStart> {
        self.written += 1;
        self.unsynced = self.unsynced.saturating_add(bytes);
        self.pattern.wrote(bytes);
        let ahead = self.flush_heavy() && self.running.is_none() && !self.failed;
        ahead.then(|| self.start())
    }

    /// A sync wanted now for the driver's own reasons (the activity log running short of
    /// extents whose writes are durable), if none runs and something was written since
    /// the last one started.
    pub fn sync_now(&mut self) -> Option<SyncStart> {
        let due = self.running.is_none() && !self.failed && self.written > self.synced;
        due.then(|| self.start())
    }

    /// The local writes follow a flush-heavy pattern (see [`FlushPattern`]).
    pub fn flush_heavy(&self) -> bool {
        self.pattern.flush_heavy()
    }

    /// The engine asks for a flush covering every write completed so far.
    pub fn flush(&mut self, f: F) -> FlushPlan<F> {
        assert!(
            self.pending.is_none(),
            "the engine has one local flush in flight at a time"
        );
        self.pattern.flushed();
        let need = self.written;
        if self.failed {
            return FlushPlan::Answer(f, Err(()));
        }
        if self.synced >= need {
            return FlushPlan::Answer(f, Ok(()));
        }
        self.pending = Some((f, need));
        match self.running {
            // Covered by it, or else the next sync starts when it ends.
            Some(_) => FlushPlan::Wait,
            None => FlushPlan::Start(self.start()),
        }
    }

    /// The sync covering `gen` finished. Returns the flush it answers, if any, and the next
    /// sync to start, if one is needed.
    pub fn sync_done(&mut self, gen: u64, ok: bool) -> (Option<Answer<F>>, Option<SyncStart>) {
        assert_eq!(
            self.running,
            Some(gen),
            "sync completions match the running sync"
        );
        self.running = None;
        if ok {
            self.synced = self.synced.max(gen);
        } else {
            self.failed = true;
        }
        let answer = match self.pending.take() {
            Some((f, _)) if self.failed => Some((f, Err(()))),
            Some((f, need)) if need <= gen => Some((f, Ok(()))),
            Some(p) => {
                // Started before some of its writes completed: it needs the next one.
                self.pending = Some(p);
                None
            }
            None => None,
        };
        let next = self.pending.is_some().then(|| self.start());
        (answer, next)
    }

    fn start(&mut self) -> SyncStart {
        assert!(self.running.is_none(), "syncs never overlap");
        self.running = Some(self.written);
        SyncStart {
            gen: self.written,
            bytes: std::mem::take(&mut self.unsynced),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Ev {
        Write(u64),
        Flush,
        SyncDone(bool),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            6 => (1u64..(SMALL_FLUSH * 2)).prop_map(Ev::Write),
            3 => Just(Ev::Flush),
            3 => prop::bool::weighted(0.97).prop_map(Ev::SyncDone),
        ]
    }

    proptest! {
        /// Against a model that knows which writes each sync could see: a flush answered
        /// Ok covers every write completed before it was asked for; nothing is answered
        /// Ok after a failure; syncs never overlap; a waiting flush is always answered
        /// once the syncs in flight finish.
        #[test]
        fn every_flush_answered_ok_covers_the_writes_before_it(
            evs in prop::collection::vec(ev(), 1..300)
        ) {
            let mut p = SyncPlan::<u32>::default();
            let mut completed = 0u64; // writes completed, counted by the model
            let mut running: Option<u64> = None; // writes the running sync can see
            let mut durable = 0u64;
            let mut failed = false;
            let mut waiting: Option<(u32, u64)> = None;
            let mut next_flush = 0u32;
            let mut answered: Vec<(u32, Result<(), ()>, u64)> = Vec::new();
            let start = |s: SyncStart, running: &mut Option<u64>, completed: u64| {
                assert!(running.is_none(), "a second sync while one runs");
                assert_eq!(s.gen, completed, "a sync covers exactly the writes done so far");
                *running = Some(completed);
            };
            let evs = evs.into_iter().chain(std::iter::repeat_n(Ev::SyncDone(true), 4));
            for e in evs {
                match e {
                    Ev::Write(bytes) => {
                        completed += 1;
                        if let Some(s) = p.wrote(bytes) {
                            start(s, &mut running, completed);
                        }
                    }
                    Ev::Flush if waiting.is_none() => {
                        next_flush += 1;
                        match p.flush(next_flush) {
                            FlushPlan::Answer(f, r) => answered.push((f, r, completed)),
                            FlushPlan::Wait => {
                                prop_assert!(running.is_some(), "waiting with no sync running");
                                waiting = Some((next_flush, completed));
                            }
                            FlushPlan::Start(s) => {
                                start(s, &mut running, completed);
                                waiting = Some((next_flush, completed));
                            }
                        }
                    }
                    Ev::Flush => {}
                    Ev::SyncDone(ok) => {
                        let Some(seen) = running.take() else { continue };
                        if ok { durable = durable.max(seen) } else { failed = true }
                        let (answer, next) = p.sync_done(seen, ok);
                        if let Some((f, r)) = answer {
                            let (w, need) = waiting.take().expect("an answer nobody waited for");
                            prop_assert_eq!(f, w);
                            answered.push((f, r, need));
                        }
                        if let Some(s) = next {
                            start(s, &mut running, completed);
                        }
                    }
                }
                for (f, r, need) in answered.drain(..) {
                    if r.is_ok() {
                        prop_assert!(!failed, "flush {} answered Ok after a sync failed", f);
                        prop_assert!(
                            need <= durable,
                            "flush {} answered Ok before writes up to {} were durable ({})",
                            f, need, durable
                        );
                    }
                }
            }
            prop_assert!(waiting.is_none(), "a flush left waiting after the syncs finished");
        }
    }

    fn start(p: FlushPlan<u32>) -> u64 {
        match p {
            FlushPlan::Start(s) => s.gen,
            other => panic!("expected a sync to start, got {other:?}"),
        }
    }

    #[test]
    fn a_sync_knows_how_much_it_may_write_back() {
        let mut p = SyncPlan::<u32>::default();
        p.wrote(4096);
        p.wrote(8192);
        let FlushPlan::Start(s) = p.flush(1) else {
            panic!("expected a sync")
        };
        assert_eq!(s.bytes, 12288);
        // Written while it runs: for the next one.
        p.wrote(u64::MAX); // a zeroing: size unknown
        p.wrote(4096);
        assert_eq!(p.sync_done(s.gen, true), (Some((1, Ok(()))), None));
        let FlushPlan::Start(s) = p.flush(2) else {
            panic!("expected a sync")
        };
        assert_eq!(s.bytes, u64::MAX, "saturates");
    }

    #[test]
    fn a_flush_with_nothing_written_since_the_last_sync_is_answered_at_once() {
        let mut p = SyncPlan::default();
        assert_eq!(p.wrote(4096), None);
        let g = start(p.flush(1));
        assert_eq!(p.sync_done(g, true), (Some((1, Ok(()))), None));
        assert_eq!(p.flush(2), FlushPlan::Answer(2, Ok(())));
    }

    #[test]
    fn a_sync_started_before_a_write_does_not_cover_it() {
        let mut p = SyncPlan::default();
        p.wrote(4096);
        let g1 = start(p.flush(1));
        assert_eq!(p.sync_done(g1, true).0, Some((1, Ok(()))));
        // Flush-heavy now? Not yet: one small flush.
        assert_eq!(p.wrote(4096), None);
        let g2 = start(p.flush(2));
        // The next write completes while the sync for flush 2 runs...
        assert!(p.wrote(4096).is_none(), "never two syncs at once");
        assert_eq!(p.sync_done(g2, true).0, Some((2, Ok(()))));
        // ...so flush 3 needs a sync of its own.
        let g3 = start(p.flush(3));
        assert!(g3 > g2);
        assert_eq!(p.sync_done(g3, true).0, Some((3, Ok(()))));
    }

    #[test]
    fn a_flush_waits_for_the_running_sync_and_then_the_next_one_if_it_started_too_early() {
        let mut p = SyncPlan::<u32>::default();
        for _ in 0..AHEAD_AFTER {
            p.wrote(4096);
            let g = start(p.flush(0));
            p.sync_done(g, true);
        }
        let ahead = p.wrote(4096).expect("flush-heavy: sync ahead");
        p.wrote(4096); // lands while the sync ahead runs
        assert_eq!(p.flush(7), FlushPlan::Wait);
        let (answer, next) = p.sync_done(ahead.gen, true);
        assert_eq!(answer, None, "the sync ahead missed the second write");
        let next = next.expect("a sync for the waiting flush");
        assert_eq!(p.sync_done(next.gen, true), (Some((7, Ok(()))), None));
    }

    #[test]
    fn a_sync_ahead_answers_the_flush_that_follows_it() {
        let mut p = SyncPlan::<u32>::default();
        for _ in 0..AHEAD_AFTER {
            p.wrote(4096);
            let g = start(p.flush(0));
            p.sync_done(g, true);
        }
        for f in 1..100 {
            let ahead = p.wrote(4096).expect("sync ahead");
            assert_eq!(p.flush(f), FlushPlan::Wait);
            assert_eq!(p.sync_done(ahead.gen, true), (Some((f, Ok(()))), None));
        }
    }

    #[test]
    fn syncing_ahead_stops_when_flushes_stop_or_grow() {
        let mut p = SyncPlan::<u32>::default();
        for _ in 0..AHEAD_AFTER {
            p.wrote(4096);
            let g = start(p.flush(0));
            p.sync_done(g, true);
        }
        let mut started = 0;
        for _ in 0..1000 {
            if let Some(s) = p.wrote(4096) {
                started += 1;
                p.sync_done(s.gen, true);
            }
        }
        assert_eq!(started, AHEAD_WRITES, "only the first writes after a flush");
        // A flush over a lot of data ends flush-heavy mode.
        let g = start(p.flush(1));
        p.sync_done(g, true);
        assert_eq!(p.wrote(4096), None);
    }

    #[test]
    fn after_a_failed_sync_every_flush_fails() {
        let mut p = SyncPlan::default();
        p.wrote(4096);
        let g = start(p.flush(1));
        assert_eq!(p.sync_done(g, false), (Some((1, Err(()))), None));
        assert_eq!(p.flush(2), FlushPlan::Answer(2, Err(())));
        p.wrote(4096);
        assert_eq!(p.flush(3), FlushPlan::Answer(3, Err(())));
    }

    #[test]
    fn a_failed_sync_ahead_fails_the_flush_waiting_for_it() {
        let mut p = SyncPlan::<u32>::default();
        for _ in 0..AHEAD_AFTER {
            p.wrote(4096);
            let g = start(p.flush(0));
            p.sync_done(g, true);
        }
        let ahead = p.wrote(4096).unwrap();
        p.wrote(4096);
        assert_eq!(p.flush(5), FlushPlan::Wait);
        assert_eq!(p.sync_done(ahead.gen, false), (Some((5, Err(()))), None));
    }
}
