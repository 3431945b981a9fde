//! The activity log against the implementation it replaced (`al_reference`, which scanned
//! every slot on every call): under the same random calls both must give the same
//! answers (`Begin` results, transactions byte for byte, released writes, `AlBusy`), the
//! same counts of clean and dirty victims, the same hot extents and uses, and both pass
//! `check` (which also holds the new indexes to a recomputation from scratch).
//!
//! `timing` (ignored; run it by hand, in release) compares their cost per write:
//! `cargo test -p tandem-meta --release --test al_differential -- --ignored --nocapture`
//! (`AL_TIMING_CYCLES`, `AL_TIMING_REF_CYCLES`, `AL_TIMING_REF_BIG_CYCLES` change the
//! writes timed: new, reference on 1237 extents, reference on 65534).

mod al_reference;

use std::collections::VecDeque;
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use tandem_meta::al::{ActivityLog, Begin, SyncMark, Transaction, WaitId, EXTENT_NONE};
use tandem_meta::layout::min_ring_blocks;

use al_reference::ActivityLog as RefLog;

#[derive(Clone, Debug)]
enum Op {
    /// `first` is scaled to the extents in play, `span` clamped to `max_span`.
    Begin {
        first: Index,
        span: u32,
    },
    End(Index),
    Next,
    Commit,
    SyncStart,
    SyncDone(Index),
    SyncFail(Index),
    /// A clean shutdown attempt: busy most of the time, which must be said the same way.
    Clean,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (any::<Index>(), prop_oneof![6 => 1u32..=3, 1 => 1u32..=64])
            .prop_map(|(first, span)| Op::Begin { first, span }),
        6 => any::<Index>().prop_map(Op::End),
        3 => Just(Op::Next),
        3 => Just(Op::Commit),
        2 => Just(Op::SyncStart),
        2 => any::<Index>().prop_map(Op::SyncDone),
        1 => any::<Index>().prop_map(Op::SyncFail),
        1 => Just(Op::Clean),
    ]
}

/// Replayed slots: `Some(pick)` fills the slot with an extent picked among those in play
/// (duplicates are dropped), `None` leaves it empty.
fn table(al_extents: u32, extents: u32, picks: &[Option<Index>]) -> Vec<u32> {
    if picks.is_empty() {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    (0..al_extents as usize)
        .map(|s| match picks.get(s).copied().flatten() {
            Some(i) => {
                let e = i.index(extents as usize) as u32;
                if seen.insert(e) {
                    e
                } else {
                    EXTENT_NONE
                }
            }
            None => EXTENT_NONE,
        })
        .collect()
}

struct Pair {
    new: ActivityLog,
    old: RefLog,
    /// Extents begun here are `0..extents`.
    extents: u32,
    active: Vec<(u32, u32)>,
    waiting: std::collections::BTreeMap<WaitId, (u32, u32)>,
    in_flight: Option<Transaction>,
    syncing: Vec<(SyncMark, al_reference::SyncMark)>,
}

impl Pair {
    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Begin { first, span } => {
                let span = span.min(self.new.max_span()).min(self.extents);
                let first = first.index((self.extents - span + 1) as usize) as u32;
                let last = first + span - 1;
                let got = self.new.begin(first, last);
                prop_assert_eq!(
                    got,
                    self.old.begin(first, last),
                    "begin({}, {})",
                    first,
                    last
                );
                match got {
                    Begin::Hot => self.active.push((first, last)),
                    Begin::Wait(id) => {
                        self.waiting.insert(id, (first, last));
                    }
                }
            }
            Op::End(i) => {
                if !self.active.is_empty() {
                    let (f, l) = self.active.swap_remove(i.index(self.active.len()));
                    self.new.end(f, l);
                    self.old.end(f, l);
                }
            }
            Op::Next => {
                let got = self.new.next_transaction();
                prop_assert_eq!(&got, &self.old.next_transaction());
                if let Some(tx) = got {
                    prop_assert!(self.in_flight.is_none());
                    self.in_flight = Some(tx);
                }
            }
            Op::Commit => {
                if let Some(tx) = self.in_flight.take() {
                    let released = self.new.committed(tx.seq);
                    prop_assert_eq!(&released, &self.old.committed(tx.seq));
                    for id in released {
                        let range = self.waiting.remove(&id).expect("a waiting write");
                        self.active.push(range);
                    }
                }
            }
            Op::SyncStart => {
                let pair = (self.new.sync_started(), self.old.sync_started());
                prop_assert_eq!(format!("{:?}", pair.0), format!("{:?}", pair.1));
                self.syncing.push(pair);
            }
            Op::SyncDone(i) => {
                if !self.syncing.is_empty() {
                    let (a, b) = self.syncing.swap_remove(i.index(self.syncing.len()));
                    self.new.sync_done(a);
                    self.old.sync_done(b);
                }
            }
            Op::SyncFail(i) => {
                if !self.syncing.is_empty() {
                    self.syncing.swap_remove(i.index(self.syncing.len()));
                }
            }
            Op::Clean => {
                let got = self.new.clean();
                prop_assert_eq!(&got, &self.old.clean());
                if let Ok(tx) = got {
                    prop_assert!(self.in_flight.is_none());
                    self.in_flight = Some(tx);
                }
            }
        }
        self.compare()
    }

    fn compare(&self) -> Result<(), TestCaseError> {
        self.new.check().map_err(TestCaseError::fail)?;
        self.old.check().map_err(TestCaseError::fail)?;
        prop_assert_eq!(self.new.clean_unused(), self.old.clean_unused());
        prop_assert_eq!(self.new.dirty_unused(), self.old.dirty_unused());
        prop_assert_eq!(self.new.hot_extents(), self.old.hot_extents());
        prop_assert_eq!(self.new.waiting(), self.old.waiting());
        prop_assert_eq!(self.new.in_flight(), self.old.in_flight());
        prop_assert_eq!(self.new.next_seq(), self.old.next_seq());
        for e in 0..self.extents {
            prop_assert_eq!(self.new.in_use(e), self.old.in_use(e), "in_use({})", e);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn same_answers_as_the_reference(
        al_extents in prop_oneof![
            4 => Just(7u32), 3 => Just(8), 3 => Just(13), 3 => Just(20), 2 => Just(64),
            2 => Just(100), 1 => Just(300),
        ],
        // Extents in play per slot (in eighths): from half the log to four times it.
        spread in prop_oneof![Just(4u32), Just(8), Just(12), Just(16), Just(32)],
        extra_ring in 0u32..3,
        replayed in prop_oneof![
            1 => Just(Vec::new()),
            1 => prop::collection::vec(prop::option::of(any::<Index>()), 1..300),
        ],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let extents = (al_extents * spread / 8).max(2);
        let table = table(al_extents, extents, &replayed);
        let ring = min_ring_blocks(al_extents) + extra_ring;
        let mut p = Pair {
            new: ActivityLog::new(al_extents, ring, &table, 5).unwrap(),
            old: RefLog::new(al_extents, ring, &table, 5).unwrap(),
            extents,
            active: Vec::new(),
            waiting: Default::default(),
            in_flight: None,
            syncing: Vec::new(),
        };
        p.compare()?;
        for op in ops {
            p.apply(op)?;
        }
        // Drain: every write ends, every transaction commits, until nothing waits; then a
        // clean shutdown.
        for round in 0.. {
            prop_assert!(round < 1000, "writes stuck");
            for (f, l) in std::mem::take(&mut p.active) {
                p.new.end(f, l);
                p.old.end(f, l);
            }
            p.compare()?;
            if p.in_flight.is_some() {
                p.apply(Op::Commit)?;
            } else if p.waiting.is_empty() {
                break;
            } else {
                p.apply(Op::Next)?;
                prop_assert!(p.in_flight.is_some(), "nothing built for {:?}", p.waiting);
            }
        }
        p.apply(Op::Clean)?;
        prop_assert!(p.in_flight.is_some(), "clean after drain");
        p.apply(Op::Commit)?;
    }
}

/// The calls the timing loop makes, on either log.
trait Log {
    fn begin(&mut self, first: u32, last: u32) -> Begin;
    fn end(&mut self, first: u32, last: u32);
    fn transaction(&mut self) -> Option<u64>;
    fn committed(&mut self, seq: u64) -> Vec<WaitId>;
    fn sync(&mut self);
    fn clean_unused(&self) -> usize;
    fn dirty_unused(&self) -> usize;
    fn waiting(&self) -> usize;
}

impl Log for ActivityLog {
    fn begin(&mut self, first: u32, last: u32) -> Begin {
        ActivityLog::begin(self, first, last)
    }
    fn end(&mut self, first: u32, last: u32) {
        ActivityLog::end(self, first, last)
    }
    fn transaction(&mut self) -> Option<u64> {
        self.next_transaction().map(|t| t.seq)
    }
    fn committed(&mut self, seq: u64) -> Vec<WaitId> {
        ActivityLog::committed(self, seq)
    }
    fn sync(&mut self) {
        let m = self.sync_started();
        self.sync_done(m);
    }
    fn clean_unused(&self) -> usize {
        ActivityLog::clean_unused(self)
    }
    fn dirty_unused(&self) -> usize {
        ActivityLog::dirty_unused(self)
    }
    fn waiting(&self) -> usize {
        ActivityLog::waiting(self)
    }
}

impl Log for RefLog {
    fn begin(&mut self, first: u32, last: u32) -> Begin {
        RefLog::begin(self, first, last)
    }
    fn end(&mut self, first: u32, last: u32) {
        RefLog::end(self, first, last)
    }
    fn transaction(&mut self) -> Option<u64> {
        self.next_transaction().map(|t| t.seq)
    }
    fn committed(&mut self, seq: u64) -> Vec<WaitId> {
        RefLog::committed(self, seq)
    }
    fn sync(&mut self) {
        let m = self.sync_started();
        self.sync_done(m);
    }
    fn clean_unused(&self) -> usize {
        RefLog::clean_unused(self)
    }
    fn dirty_unused(&self) -> usize {
        RefLog::dirty_unused(self)
    }
    fn waiting(&self) -> usize {
        RefLog::waiting(self)
    }
}

/// Random 4 KiB writes over `volume` extents, `depth` in flight, each one extent: the
/// oldest ends, a new one begins and, if it misses, gets its transaction at once, with
/// the driver's checks for a data sync ahead around it (`al_commit`, `al_sync_ahead` of
/// the daemon; the sync completes at once). The first `2 × al_extents` writes fill the
/// log and are not timed. Returns ns per write and the miss ratio.
fn run(log: &mut impl Log, al_extents: u32, volume: u32, depth: usize, cycles: u64) -> (f64, f64) {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let low = 64.min(al_extents as usize / 2);
    let mut active: VecDeque<u32> = VecDeque::with_capacity(depth);
    let warmup = 2 * u64::from(al_extents);
    let mut misses = 0u64;
    let mut t = Instant::now();
    for i in 0..warmup + cycles {
        if i == warmup {
            misses = 0;
            t = Instant::now();
        }
        if active.len() == depth {
            let e = active.pop_front().unwrap();
            log.end(e, e);
        }
        let e = (next() % u64::from(volume)) as u32;
        if let Begin::Wait(id) = log.begin(e, e) {
            misses += 1;
            if log.clean_unused() < log.waiting() && log.dirty_unused() > 0 {
                log.sync();
            }
            let seq = log.transaction().expect("a victim");
            assert_eq!(log.committed(seq), vec![id]);
            if log.clean_unused() < low && log.dirty_unused() > 0 {
                log.sync();
            }
        }
        active.push_back(e);
    }
    let ns = t.elapsed().as_nanos() as f64 / cycles as f64;
    (ns, misses as f64 / cycles as f64)
}

#[test]
#[ignore = "timing: run by hand in release, with --nocapture"]
fn timing() {
    let cycles: u64 = std::env::var("AL_TIMING_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let ref_small: u64 = std::env::var("AL_TIMING_REF_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cycles);
    // The reference scans 65534 slots several times per miss: fewer cycles for it.
    let ref_big: u64 = std::env::var("AL_TIMING_REF_BIG_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    // 1237 over 16 GiB (4096 extents), as measured on the daemon; 65534 over four times
    // as many extents.
    for (al_extents, volume, ref_cycles) in
        [(1237u32, 4096u32, ref_small), (65534, 262_136, ref_big)]
    {
        let ring = min_ring_blocks(al_extents);
        let mut new = ActivityLog::new(al_extents, ring, &[], 1).unwrap();
        let (ns_new, miss) = run(&mut new, al_extents, volume, 32, cycles);
        new.check().unwrap();
        let mut old = RefLog::new(al_extents, ring, &[], 1).unwrap();
        let (ns_old, miss_old) = run(&mut old, al_extents, volume, 32, ref_cycles);
        println!(
            "al_extents {al_extents:>5}, {volume} extents, depth 32: \
             new {ns_new:>9.0} ns/write ({cycles} writes, {:.0} % miss), \
             reference {ns_old:>9.0} ns/write ({ref_cycles} writes, {:.0} % miss)",
            miss * 100.0,
            miss_old * 100.0
        );
    }
}
