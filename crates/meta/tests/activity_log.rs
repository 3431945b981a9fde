//! The activity log under random begin / end / transaction / commit sequences: its
//! invariants hold after every step, a crash at any point (with the transaction in flight
//! lost, written, or torn) replays to a superset of the extents in use, and every waiting
//! write is released once the others end.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::Index;
use tandem_meta::al::{replay, ActivityLog, AlBlock, Begin, Transaction, WaitId};
use tandem_meta::layout::{min_ring_blocks, MD_BLOCK_BYTES};

#[derive(Clone, Debug)]
enum Op {
    Begin { first: u32, span: u32 },
    End(Index),
    Next,
    Commit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..40, 1u32..=3).prop_map(|(first, span)| Op::Begin { first, span }),
        3 => any::<Index>().prop_map(Op::End),
        2 => Just(Op::Next),
        2 => Just(Op::Commit),
    ]
}

type Block = [u8; MD_BLOCK_BYTES];

struct Model {
    log: ActivityLog,
    ring: Vec<Block>,
    active: Vec<(u32, u32)>,
    waiting: BTreeMap<WaitId, (u32, u32)>,
    in_flight: Option<Transaction>,
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
        }
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
                    self.log.end(f, l);
                }
            }
            Op::Next => self.next(),
            Op::Commit => self.commit(),
        }
    }

    fn next(&mut self) {
        if self.in_flight.is_some() {
            assert!(self.log.next_transaction().is_none(), "two in flight");
            return;
        }
        if let Some(tx) = self.log.next_transaction() {
            let used = self.in_use();
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

    /// Every other write ends; each released write ends at once. All waiting writes must
    /// get through.
    fn drain(&mut self) {
        for (f, l) in std::mem::take(&mut self.active) {
            self.log.end(f, l);
        }
        let mut rounds = 0;
        while !self.waiting.is_empty() || self.in_flight.is_some() {
            rounds += 1;
            assert!(rounds < 1000, "writes stuck: {:?}", self.waiting);
            if self.in_flight.is_some() {
                self.commit();
                for (f, l) in std::mem::take(&mut self.active) {
                    self.log.end(f, l);
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
    ) {
        let mut m = Model::new(al_extents, extra_ring);
        for op in ops {
            m.apply(op);
            m.log.check().map_err(TestCaseError::fail)?;
            m.check_crash()?;
        }
        m.drain();
        m.check_crash()?;
        // A clean shutdown empties it.
        let tx = m.log.clean().unwrap();
        m.ring[tx.block_index as usize] = *tx.block;
        m.log.committed(tx.seq);
        prop_assert!(replay(&m.ring).unwrap().hot.is_empty());
    }
}
