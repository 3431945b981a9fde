//! The activity log under random begin / end / transaction / commit / data-sync sequences:
//! its invariants hold after every step, a crash at any point (with the transaction in
//! flight lost, written, or torn) replays to a superset of the extents in use, every
//! waiting write is released once the others end, and an extent is evicted without a data
//! sync (`evicts_dirty` false) only if every write to it ended before the start of a data
//! sync that completed.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::Index;
use tandem_meta::al::{replay, ActivityLog, AlBlock, Begin, SyncMark, Transaction, WaitId};
use tandem_meta::layout::{min_ring_blocks, MD_BLOCK_BYTES};

#[derive(Clone, Debug)]
enum Op {
    Begin {
        first: u32,
        span: u32,
    },
    End(Index),
    Next,
    Commit,
    /// The driver starts a data sync.
    SyncStart,
    /// One of the syncs started completes (in any order).
    SyncDone(Index),
    /// One fails: it is never reported.
    SyncFail(Index),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..40, 1u32..=3).prop_map(|(first, span)| Op::Begin { first, span }),
        3 => any::<Index>().prop_map(Op::End),
        2 => Just(Op::Next),
        2 => Just(Op::Commit),
        1 => Just(Op::SyncStart),
        1 => any::<Index>().prop_map(Op::SyncDone),
        1 => any::<Index>().prop_map(Op::SyncFail),
    ]
}

type Block = [u8; MD_BLOCK_BYTES];

struct Model {
    log: ActivityLog,
    ring: Vec<Block>,
    active: Vec<(u32, u32)>,
    waiting: BTreeMap<WaitId, (u32, u32)>,
    in_flight: Option<Transaction>,
    /// The model's own clock: one tick per `end` and per sync start.
    step: u64,
    /// Step of the last `end` on each extent, ever.
    last_end: BTreeMap<u32, u64>,
    /// Syncs started and not yet done or failed: the log's mark, the step it started at.
    syncing: Vec<(SyncMark, u64)>,
    /// The newest start step of a sync that completed: an `end` before it is durable.
    durable: u64,
}

impl Model {
    fn new(al_extents: u32, extra_ring: u32) -> Model {
        let ring_blocks = min_ring_blocks(al_extents) + extra_ring;
        let mut ring = vec![[0u8; MD_BLOCK_BYTES]; ring_blocks as usize];
        ring[0] = *AlBlock::init(0, al_extents).encode();
        let log = ActivityLog::from_replay(&replay(&ring).unwrap()).unwrap();
        Model {
            log,
            ring,
            active: Vec::new(),
            waiting: BTreeMap::new(),
            in_flight: None,
            step: 0,
            last_end: BTreeMap::new(),
            syncing: Vec::new(),
            durable: 0,
        }
    }

    /// Some write to `extent` ended after the start of every sync that completed: it may
    /// not be on the data disk yet.
    fn dirty(&self, extent: u32) -> bool {
        self.last_end
            .get(&extent)
            .is_some_and(|&t| t > self.durable)
    }

    fn end(&mut self, f: u32, l: u32) {
        self.log.end(f, l);
        self.step += 1;
        for e in f..=l {
            self.last_end.insert(e, self.step);
        }
    }

    fn sync_start(&mut self) -> (SyncMark, u64) {
        self.step += 1;
        (self.log.sync_started(), self.step)
    }

    fn sync_done(&mut self, (mark, started): (SyncMark, u64)) {
        self.log.sync_done(mark);
        self.durable = self.durable.max(started);
    }

    /// A data sync from start to end with nothing in between.
    fn sync_now(&mut self) {
        let s = self.sync_start();
        self.sync_done(s);
    }

    fn in_use(&self) -> BTreeSet<u32> {
        self.active.iter().flat_map(|&(f, l)| f..=l).collect()
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Begin { first, span } => {
                let last = first + span - 1;
                match self.log.begin(first, last) {
                    Begin::Hot => self.active.push((first, last)),
                    Begin::Wait(id) => assert!(self.waiting.insert(id, (first, last)).is_none()),
                }
            }
            Op::End(i) => {
                if !self.active.is_empty() {
                    let (f, l) = self.active.swap_remove(i.index(self.active.len()));
                    self.end(f, l);
                }
            }
            Op::Next => self.next(),
            Op::Commit => self.commit(),
            Op::SyncStart => {
                let s = self.sync_start();
                self.syncing.push(s);
            }
            Op::SyncDone(i) => {
                if !self.syncing.is_empty() {
                    let s = self.syncing.swap_remove(i.index(self.syncing.len()));
                    self.sync_done(s);
                }
            }
            Op::SyncFail(i) => {
                if !self.syncing.is_empty() {
                    self.syncing.swap_remove(i.index(self.syncing.len()));
                }
            }
        }
    }

    fn next(&mut self) {
        if self.in_flight.is_some() {
            assert!(self.log.next_transaction().is_none(), "two in flight");
            return;
        }
        // Victim candidates before: hot extents no write uses.
        let used = self.in_use();
        let unused_before: Vec<u32> = self
            .log
            .hot_extents()
            .into_iter()
            .filter(|e| !used.contains(e))
            .collect();
        if let Some(tx) = self.log.next_transaction() {
            // The property: no data sync needed only if every write to every victim is
            // durable; and one asked for only if some victim has a write that may not be.
            assert_eq!(
                tx.evicts_dirty(),
                tx.evicted.iter().any(|&e| self.dirty(e)),
                "evicted {:?} (dirty: {:?})",
                tx.evicted,
                tx.evicted
                    .iter()
                    .filter(|&&e| self.dirty(e))
                    .collect::<Vec<_>>()
            );
            if tx.evicts_dirty() {
                // Clean victims first: none was left over, but the extents of the writes
                // this transaction serves (never victims).
                let protected: BTreeSet<u32> = tx
                    .releases
                    .iter()
                    .flat_map(|id| {
                        let (f, l) = self.waiting[id];
                        f..=l
                    })
                    .collect();
                for e in &unused_before {
                    assert!(
                        self.dirty(*e) || tx.evicted.contains(e) || protected.contains(e),
                        "evicted dirty {:?} but left clean {e}",
                        tx.evicted
                    );
                }
                let clean_protected = protected
                    .iter()
                    .filter(|&&e| unused_before.contains(&e) && !self.dirty(e))
                    .count();
                assert_eq!(
                    self.log.clean_unused(),
                    clean_protected,
                    "evicted dirty but a clean slot is left"
                );
            }
            assert!(
                tx.evicted.iter().all(|e| !used.contains(e)),
                "evicted {:?} while in use",
                tx.evicted
            );
            assert!(tx.releases.iter().all(|id| self.waiting.contains_key(id)));
            assert!(!tx.releases.is_empty());
            assert_eq!(tx.block_index as usize, tx.seq as usize % self.ring.len());
            self.in_flight = Some(tx);
        }
    }

    fn commit(&mut self) {
        let Some(tx) = self.in_flight.take() else {
            return;
        };
        if tx.evicts_dirty() {
            // The driver syncs the data before the block.
            self.sync_now();
        }
        self.ring[tx.block_index as usize] = *tx.block;
        let released = self.log.committed(tx.seq);
        for id in &tx.releases {
            assert!(
                released.contains(id),
                "{id:?} was built for but not released"
            );
        }
        for id in released {
            let (f, l) = self.waiting.remove(&id).expect("released a waiting write");
            for e in f..=l {
                assert!(self.log.in_use(e) > 0);
            }
            self.active.push((f, l));
        }
    }

    /// A crash now: the ring as it is, with the transaction in flight written, or with
    /// half of it written, must replay to every extent in use.
    fn check_crash(&self) -> Result<(), TestCaseError> {
        let used = self.in_use();
        let mut rings = vec![self.ring.clone()];
        if let Some(tx) = &self.in_flight {
            let i = tx.block_index as usize;
            let mut whole = self.ring.clone();
            whole[i] = *tx.block;
            let mut torn = self.ring.clone();
            torn[i][..2048].copy_from_slice(&tx.block[..2048]);
            rings.push(whole);
            rings.push(torn);
        }
        for ring in rings {
            let r = replay(&ring).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let hot: BTreeSet<u32> = r.hot.iter().copied().collect();
            prop_assert!(used.is_subset(&hot), "in use {used:?}, replayed {hot:?}");
            for e in self.log.hot_extents() {
                let pending_evict = self
                    .in_flight
                    .as_ref()
                    .is_some_and(|t| t.evicted.contains(&e));
                prop_assert!(hot.contains(&e) || pending_evict);
            }
        }
        Ok(())
    }

    /// `dirty_unused` and `clean_unused` count the slots no write uses and no transaction
    /// changes, by the model's notion of dirty.
    fn check_counts(&self) -> Result<(), TestCaseError> {
        let used = self.in_use();
        let dirty = self
            .log
            .hot_extents()
            .into_iter()
            .filter(|&e| !used.contains(&e) && self.dirty(e))
            .count();
        prop_assert_eq!(self.log.dirty_unused(), dirty);
        let changing = self.in_flight.as_ref().map_or(0, |t| t.added.len());
        prop_assert_eq!(
            self.log.clean_unused(),
            self.log.al_extents() as usize - used.len() - changing - dirty
        );
        Ok(())
    }

    /// Every other write ends; each released write ends at once. All waiting writes must
    /// get through.
    fn drain(&mut self) {
        for (f, l) in std::mem::take(&mut self.active) {
            self.end(f, l);
        }
        let mut rounds = 0;
        while !self.waiting.is_empty() || self.in_flight.is_some() {
            rounds += 1;
            assert!(rounds < 1000, "writes stuck: {:?}", self.waiting);
            if self.in_flight.is_some() {
                self.commit();
                for (f, l) in std::mem::take(&mut self.active) {
                    self.end(f, l);
                }
            } else {
                self.next();
                assert!(
                    self.in_flight.is_some(),
                    "nothing built for {:?}",
                    self.waiting
                );
            }
            self.log.check().unwrap();
        }
        assert_eq!(self.log.waiting(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_sequences(
        al_extents in prop_oneof![Just(7u32), Just(8), Just(20), Just(900)],
        extra_ring in 0u32..3,
        ops in prop::collection::vec(op(), 1..250),
        sync_before_clean in any::<bool>(),
    ) {
        let mut m = Model::new(al_extents, extra_ring);
        for op in ops {
            m.apply(op);
            m.log.check().map_err(TestCaseError::fail)?;
            m.check_crash()?;
            m.check_counts()?;
        }
        m.drain();
        m.check_crash()?;
        m.check_counts()?;
        if sync_before_clean {
            m.sync_now();
        }
        // A clean shutdown empties it, and needs a data sync first iff some extent is dirty.
        let dirty: Vec<u32> = m.log.hot_extents().into_iter().filter(|&e| m.dirty(e)).collect();
        let tx = m.log.clean().unwrap();
        prop_assert_eq!(tx.evicts_dirty(), !dirty.is_empty(), "dirty {:?}", dirty);
        m.ring[tx.block_index as usize] = *tx.block;
        m.log.committed(tx.seq);
        prop_assert!(replay(&m.ring).unwrap().hot.is_empty());
    }
}
