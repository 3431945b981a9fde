//! The activity log's state, sans IO: which 4 MiB extents are hot, how many writes use
//! each, which writes wait for a transaction, and the transaction that brings their
//! extents in.
//!
//! The caller (the replication engine's driver) runs one loop:
//! - `begin(first, last)` before a data write: `Hot` → issue it; `Wait(id)` → hold it;
//! - whenever a write waited, a transaction committed, or `end` freed an extent, ask
//!   `next_transaction()`; if it gives one: write the bitmap pages of its `evicted`
//!   extents, then the transaction block (synced), then call `committed(seq)` and issue
//!   the writes it names;
//! - `end(first, last)` when a data write is done.
//!
//! Only one transaction is in flight at a time: a replay tolerates losing the newest
//! block only, so the next may not be written before the one before it is durable.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::al::format::{
    AlBlock, AlKind, AlUpdate, EXTENT_NONE, MAX_EXTENTS, UPDATES_PER_TRANSACTION,
};
use crate::al::replay::AlReplay;
use crate::error::{AlBusy, AlError};
use crate::layout::{Geometry, MD_BLOCK_BYTES};

/// Names a write that waits for a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Every extent is in the log and counted as used: the write may go now.
    Hot,
    /// Some extent must be added first; `committed` names this id when it may go.
    Wait(WaitId),
}

/// A transaction to write: one 4 KiB block at `block_index` of the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    pub seq: u64,
    pub kind: AlKind,
    pub block_index: u32,
    pub block: Box<[u8; MD_BLOCK_BYTES]>,
    /// Extents this transaction brings in.
    pub added: Vec<u32>,
    /// Extents it drops. **Their bitmap pages must be written (and synced) before this
    /// block**: once the block is durable a crash no longer marks them, so their bits must
    /// already be on disk.
    pub evicted: Vec<u32>,
    /// The waiting writes it was built for (`committed` may release more: any whose
    /// extents are all hot by then).
    pub releases: Vec<WaitId>,
}

#[derive(Clone, Debug)]
struct Waiter {
    id: WaitId,
    first: u32,
    last: u32,
}

#[derive(Clone, Debug)]
struct InFlight {
    seq: u64,
    slots: Vec<u32>,
}

#[derive(Clone, Debug)]
pub struct ActivityLog {
    al_extents: u32,
    ring_blocks: u32,
    /// Slot → extent, including the changes of the transaction in flight.
    table: Vec<u32>,
    slot_of: HashMap<u32, u32>,
    /// Writes using each slot's extent.
    in_use: Vec<u32>,
    /// LRU clock value of each slot's last use.
    last_use: Vec<u64>,
    /// Slots the transaction in flight changes: their extent is not hot yet (added) or
    /// no longer (evicted, and so no longer in `table`).
    pending: Vec<bool>,
    clock: u64,
    next_seq: u64,
    waiting: VecDeque<Waiter>,
    in_flight: Option<InFlight>,
    next_wait: u64,
}

impl ActivityLog {
    /// `table` is the slot → extent table as replayed (`AlReplay::table`), or empty for an
    /// empty log. Slot positions matter: the ring's older context windows still name the
    /// replayed slots, so an extent kept hot must stay in its slot.
    pub fn new(
        al_extents: u32,
        ring_blocks: u32,
        table: &[u32],
        next_seq: u64,
    ) -> Result<ActivityLog, AlError> {
        Geometry {
            max_peers: 1,
            al_extents,
            al_ring_blocks: ring_blocks,
        }
        .validate()
        .map_err(AlError::Geometry)?;
        let n = al_extents as usize;
        let table = match table.len() {
            0 => vec![EXTENT_NONE; n],
            len if len == n => table.to_vec(),
            len => return Err(AlError::TableSize { len, al_extents }),
        };
        let mut slot_of = HashMap::new();
        for (slot, &e) in table.iter().enumerate() {
            let slot = slot as u32;
            if e == EXTENT_NONE {
                continue;
            }
            if u64::from(e) >= MAX_EXTENTS {
                return Err(AlError::BadExtent { slot, extent: e });
            }
            if let Some(first) = slot_of.insert(e, slot) {
                return Err(AlError::DuplicateExtent {
                    extent: e,
                    first,
                    second: slot,
                });
            }
        }
        Ok(ActivityLog {
            al_extents,
            ring_blocks,
            table,
            slot_of,
            in_use: vec![0; n],
            last_use: vec![0; n],
            pending: vec![false; n],
            clock: 0,
            next_seq,
            waiting: VecDeque::new(),
            in_flight: None,
            next_wait: 0,
        })
    }

    /// The log as the ring left it.
    pub fn from_replay(r: &AlReplay) -> Result<ActivityLog, AlError> {
        ActivityLog::new(r.al_extents, r.ring_blocks, &r.table, r.next_seq)
    }

    /// The most extents one write may span: one transaction's worth, and never more than
    /// the log holds.
    pub fn max_span(&self) -> u32 {
        self.al_extents.min(UPDATES_PER_TRANSACTION as u32)
    }

    /// A write to extents `first..=last` is about to be issued.
    ///
    /// # Panics
    /// If `first > last` or the range spans more than `max_span()` extents (the caller
    /// splits larger writes).
    pub fn begin(&mut self, first: u32, last: u32) -> Begin {
        self.assert_range(first, last);
        if (first..=last).all(|e| self.is_hot(e)) {
            self.use_range(first, last);
            return Begin::Hot;
        }
        let id = WaitId(self.next_wait);
        self.next_wait += 1;
        self.waiting.push_back(Waiter { id, first, last });
        Begin::Wait(id)
    }

    /// A write begun on `first..=last` is done.
    ///
    /// # Panics
    /// If no write holds one of these extents (an `end` without its `begin`).
    pub fn end(&mut self, first: u32, last: u32) {
        self.assert_range(first, last);
        self.clock += 1;
        for e in first..=last {
            let slot = match self.slot_of.get(&e) {
                Some(&s) if self.in_use[s as usize] > 0 => s as usize,
                _ => panic!("AL end({first}, {last}): extent {e} is not in use"),
            };
            self.in_use[slot] -= 1;
            self.last_use[slot] = self.clock;
        }
    }

    /// The next transaction, if none is in flight and some waiting write can be served:
    /// every extent the waiting writes need, in arrival order, as long as they fit in one
    /// transaction and victims (unused extents, least recently used first) are found. A
    /// write that does not fit waits for a later one, and so does every write behind it.
    pub fn next_transaction(&mut self) -> Option<Transaction> {
        if self.in_flight.is_some() || self.waiting.is_empty() {
            return None;
        }
        // Victim candidates: slots no write uses (chosen among below, by `victim_order`).
        let candidates: Vec<u32> = (0..self.al_extents)
            .filter(|&s| self.in_use[s as usize] == 0)
            .collect();
        let mut needed: Vec<u32> = Vec::new();
        let mut releases = Vec::new();
        // Extents of the writes served: never victims. `shielded` counts candidates among them.
        let mut protected: HashSet<u32> = HashSet::new();
        let mut shielded = 0usize;
        for w in &self.waiting {
            let missing: Vec<u32> = (w.first..=w.last)
                .filter(|e| !self.is_hot(*e) && !needed.contains(e))
                .collect();
            let newly: Vec<u32> = (w.first..=w.last)
                .filter(|e| !protected.contains(e))
                .collect();
            let newly_shielded = newly
                .iter()
                .filter(|e| {
                    self.slot_of
                        .get(e)
                        .is_some_and(|&s| self.in_use[s as usize] == 0)
                })
                .count();
            let want = needed.len() + missing.len();
            if want > UPDATES_PER_TRANSACTION
                || want > candidates.len().saturating_sub(shielded + newly_shielded)
            {
                break;
            }
            needed.extend(missing);
            protected.extend(newly);
            shielded += newly_shielded;
            releases.push(w.id);
        }
        if releases.is_empty() {
            return None;
        }
        let mut victims: Vec<u32> = candidates
            .into_iter()
            .filter(|&s| !protected.contains(&self.table[s as usize]))
            .collect();
        // The `needed` first in victim order, without sorting the whole table (it may hold
        // 65534 slots).
        let n = needed.len();
        if n < victims.len() {
            if n > 0 {
                victims.select_nth_unstable_by_key(n - 1, |&s| self.victim_order(s));
            }
            victims.truncate(n);
        }
        victims.sort_by_key(|&s| self.victim_order(s));
        assert_eq!(victims.len(), needed.len(), "victims were counted");
        Some(self.build(needed, victims, releases))
    }

    fn build(&mut self, needed: Vec<u32>, victims: Vec<u32>, releases: Vec<WaitId>) -> Transaction {
        self.clock += 1;
        let mut evicted = Vec::new();
        let mut updates = Vec::with_capacity(needed.len());
        for (&e, &slot) in needed.iter().zip(&victims) {
            let s = slot as usize;
            let old = self.table[s];
            if old != EXTENT_NONE {
                self.slot_of.remove(&old);
                evicted.push(old);
            }
            self.table[s] = e;
            self.slot_of.insert(e, slot);
            self.pending[s] = true;
            self.last_use[s] = self.clock;
            updates.push(AlUpdate {
                slot: u16::try_from(slot).expect("slots fit u16"),
                extent: e,
            });
        }
        let seq = self.take_seq();
        let block = AlBlock::update(seq, updates, &self.table).encode();
        self.in_flight = Some(InFlight {
            seq,
            slots: victims,
        });
        Transaction {
            seq,
            kind: AlKind::Update,
            block_index: (seq % u64::from(self.ring_blocks)) as u32,
            block,
            added: needed,
            evicted,
            releases,
        }
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = seq.checked_add(1).expect("AL seq overflow");
        seq
    }

    /// Transaction `seq` is durable. Returns the waiting writes that may go now (their
    /// extents are counted as used).
    ///
    /// # Panics
    /// If `seq` is not the transaction in flight.
    pub fn committed(&mut self, seq: u64) -> Vec<WaitId> {
        let f = match self.in_flight.take() {
            Some(f) if f.seq == seq => f,
            other => panic!(
                "AL committed({seq}) but the transaction in flight is {:?}",
                other.map(|f| f.seq)
            ),
        };
        for s in f.slots {
            self.pending[s as usize] = false;
        }
        let mut released = Vec::new();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        for w in std::mem::take(&mut self.waiting) {
            if (w.first..=w.last).all(|e| self.is_hot(e)) {
                self.use_range(w.first, w.last);
                released.push(w.id);
            } else {
                still.push_back(w);
            }
        }
        self.waiting = still;
        released
    }

    /// For a clean shutdown: an `Init` transaction that empties the log. Every hot extent
    /// is in `evicted` (the caller flushes the whole bitmap first).
    pub fn clean(&mut self) -> Result<Transaction, AlBusy> {
        let in_use: u64 = self.in_use.iter().map(|&n| u64::from(n)).sum();
        if in_use > 0 || !self.waiting.is_empty() || self.in_flight.is_some() {
            return Err(AlBusy {
                in_use,
                waiting: self.waiting.len(),
                in_flight: self.in_flight.is_some(),
            });
        }
        let mut evicted: Vec<u32> = self.slot_of.keys().copied().collect();
        evicted.sort_unstable();
        self.table.fill(EXTENT_NONE);
        self.slot_of.clear();
        self.pending.fill(true);
        let seq = self.take_seq();
        self.in_flight = Some(InFlight {
            seq,
            slots: (0..self.al_extents).collect(),
        });
        Ok(Transaction {
            seq,
            kind: AlKind::Init,
            block_index: (seq % u64::from(self.ring_blocks)) as u32,
            block: AlBlock::init(seq, self.al_extents).encode(),
            added: Vec::new(),
            evicted,
            releases: Vec::new(),
        })
    }

    /// Extents writes may use without a transaction, ascending.
    pub fn hot_extents(&self) -> Vec<u32> {
        let mut hot: Vec<u32> = self
            .slot_of
            .iter()
            .filter(|(_, &s)| !self.pending[s as usize])
            .map(|(&e, _)| e)
            .collect();
        hot.sort_unstable();
        hot
    }

    /// Writes currently using `extent`.
    pub fn in_use(&self, extent: u32) -> u32 {
        self.slot_of
            .get(&extent)
            .map_or(0, |&s| self.in_use[s as usize])
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The seq of the transaction in flight.
    pub fn in_flight(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|f| f.seq)
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn al_extents(&self) -> u32 {
        self.al_extents
    }

    /// The invariants between any two calls.
    pub fn check(&self) -> Result<(), String> {
        let n = self.al_extents as usize;
        if [
            self.table.len(),
            self.in_use.len(),
            self.last_use.len(),
            self.pending.len(),
        ] != [n; 4]
        {
            return Err(format!("per-slot vectors are not {n} long"));
        }
        let used = self.table.iter().filter(|&&e| e != EXTENT_NONE).count();
        if used != self.slot_of.len() {
            return Err(format!(
                "{used} slots hold an extent but {} extents are mapped (an extent twice?)",
                self.slot_of.len()
            ));
        }
        for (&e, &s) in &self.slot_of {
            if self.table.get(s as usize) != Some(&e) {
                return Err(format!(
                    "extent {e} is mapped to slot {s}, which does not hold it"
                ));
            }
        }
        for s in 0..n {
            if self.in_use[s] > 0 && (self.table[s] == EXTENT_NONE || self.pending[s]) {
                return Err(format!("slot {s} is in use but not hot"));
            }
        }
        let pending: Vec<u32> = (0..n as u32)
            .filter(|&s| self.pending[s as usize])
            .collect();
        match &self.in_flight {
            None if !pending.is_empty() => {
                return Err(format!("slots {pending:?} pending, nothing in flight"))
            }
            Some(f)
                if {
                    let mut slots = f.slots.clone();
                    slots.sort_unstable();
                    slots != pending
                } =>
            {
                return Err(format!(
                    "transaction {} changes other slots than those pending",
                    f.seq
                ))
            }
            Some(f) if f.seq >= self.next_seq => {
                return Err(format!(
                    "transaction {} in flight but next seq {}",
                    f.seq, self.next_seq
                ))
            }
            _ => {}
        }
        for w in &self.waiting {
            if w.first > w.last || w.last - w.first >= self.max_span() {
                return Err(format!("waiting write {:?} has a bad range", w.id));
            }
            if (w.first..=w.last).all(|e| self.is_hot(e)) {
                return Err(format!("waiting write {:?} could go", w.id));
            }
        }
        Ok(())
    }

    /// Empty slots first, then the least recently used.
    fn victim_order(&self, slot: u32) -> (bool, u64, u32) {
        let s = slot as usize;
        (self.table[s] != EXTENT_NONE, self.last_use[s], slot)
    }

    fn is_hot(&self, extent: u32) -> bool {
        self.slot_of
            .get(&extent)
            .is_some_and(|&s| !self.pending[s as usize])
    }

    fn use_range(&mut self, first: u32, last: u32) {
        self.clock += 1;
        for e in first..=last {
            let s = self.slot_of[&e] as usize;
            self.in_use[s] += 1;
            self.last_use[s] = self.clock;
        }
    }

    fn assert_range(&self, first: u32, last: u32) {
        assert!(
            first <= last && last - first < self.max_span() && u64::from(last) < MAX_EXTENTS,
            "AL range {first}..={last}: at most {} extents below {MAX_EXTENTS}",
            self.max_span()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::al::replay::replay;

    fn log(e: u32) -> ActivityLog {
        let ring = crate::layout::min_ring_blocks(e);
        ActivityLog::new(e, ring, &[], 1).unwrap()
    }

    fn commit(log: &mut ActivityLog) -> (Transaction, Vec<WaitId>) {
        let tx = log.next_transaction().expect("a transaction");
        let released = log.committed(tx.seq);
        log.check().unwrap();
        (tx, released)
    }

    #[test]
    fn cold_write_waits_then_goes() {
        let mut l = log(7);
        let Begin::Wait(id) = l.begin(3, 4) else {
            panic!("cold extents")
        };
        assert!(l.next_transaction().is_some_and(|tx| {
            assert_eq!(
                (tx.seq, tx.block_index, tx.added.clone()),
                (1, 1, vec![3, 4])
            );
            assert!(tx.evicted.is_empty());
            assert_eq!(tx.releases, vec![id]);
            assert_eq!(l.committed(1), vec![id]);
            true
        }));
        assert_eq!(l.in_use(3), 1);
        assert_eq!(l.begin(4, 4), Begin::Hot);
        assert_eq!(l.in_use(4), 2);
        assert_eq!(l.hot_extents(), vec![3, 4]);
        l.end(3, 4);
        l.end(4, 4);
        assert_eq!(l.in_use(4), 0);
        l.check().unwrap();
    }

    #[test]
    fn waiting_writes_are_batched_in_one_transaction() {
        let mut l = log(1237);
        let ids: Vec<WaitId> = (0..10)
            .map(|i| match l.begin(i * 2, i * 2 + 1) {
                Begin::Wait(id) => id,
                Begin::Hot => panic!("cold"),
            })
            .collect();
        let (tx, released) = commit(&mut l);
        assert_eq!(tx.added.len(), 20);
        assert_eq!(released, ids);
        assert!(l.next_transaction().is_none());
    }

    #[test]
    fn a_transaction_holds_at_most_64_changes() {
        let mut l = log(1237);
        for i in 0..40 {
            assert!(matches!(l.begin(i * 2, i * 2 + 1), Begin::Wait(_)));
        }
        let (tx, released) = commit(&mut l);
        assert_eq!((tx.added.len(), released.len()), (64, 32));
        let (tx, released) = commit(&mut l);
        assert_eq!((tx.added.len(), released.len()), (16, 8));
    }

    #[test]
    fn victims_are_the_least_recently_used_unused_extents() {
        let mut l = log(7);
        for e in 0..7 {
            l.begin(e, e);
        }
        commit(&mut l);
        // Use order: 0..7 were used at once; now touch 2, 0, 5 again, ending all.
        for e in 0..7 {
            l.end(e, e);
        }
        for e in [2, 0, 5] {
            assert_eq!(l.begin(e, e), Begin::Hot);
            l.end(e, e);
        }
        l.begin(6, 6); // 6 stays in use: never a victim
        l.begin(100, 101);
        let (tx, _) = commit(&mut l);
        let mut evicted = tx.evicted.clone();
        evicted.sort_unstable();
        assert_eq!(evicted, vec![1, 3]);
    }

    #[test]
    fn no_victim_means_waiting_until_an_end() {
        let mut l = log(7);
        l.begin(0, 6);
        commit(&mut l);
        assert!(matches!(l.begin(10, 10), Begin::Wait(_)));
        assert!(l.next_transaction().is_none());
        l.end(0, 6);
        let (tx, released) = commit(&mut l);
        assert_eq!(tx.evicted.len(), 1);
        assert_eq!(released.len(), 1);
    }

    #[test]
    fn an_extent_being_evicted_or_added_is_not_hot() {
        let mut l = log(7);
        l.begin(0, 6);
        commit(&mut l);
        l.end(0, 6);
        l.begin(20, 20);
        let tx = l.next_transaction().unwrap();
        let victim = tx.evicted[0];
        // While the transaction is in flight, neither the victim nor the newcomer is hot.
        let Begin::Wait(a) = l.begin(victim, victim) else {
            panic!("victim is leaving")
        };
        let Begin::Wait(b) = l.begin(20, 20) else {
            panic!("20 is not in yet")
        };
        assert!(l.next_transaction().is_none(), "one transaction at a time");
        l.check().unwrap();
        let released = l.committed(tx.seq);
        assert!(released.contains(&b) && !released.contains(&a));
        let (tx2, released) = commit(&mut l);
        assert_eq!(tx2.added, vec![victim]);
        assert_eq!(released, vec![a]);
    }

    #[test]
    fn clean_empties_the_log_with_one_init() {
        let mut l = log(1237);
        l.begin(5, 6);
        commit(&mut l);
        let busy = l.clean().unwrap_err();
        assert_eq!(busy.in_use, 2);
        l.end(5, 6);
        let tx = l.clean().unwrap();
        assert_eq!((tx.kind, tx.evicted.clone()), (AlKind::Init, vec![5, 6]));
        assert!(l.hot_extents().is_empty());
        l.check().unwrap();
        assert!(l.committed(tx.seq).is_empty());
        l.check().unwrap();
        assert!(matches!(l.begin(5, 5), Begin::Wait(_)));
    }

    /// The blocks a log writes replay to its table.
    #[test]
    fn its_blocks_replay_to_its_table() {
        let e = 1237;
        let ring_n = 8u32;
        let mut ring = vec![[0u8; MD_BLOCK_BYTES]; ring_n as usize];
        ring[0] = *AlBlock::init(0, e).encode();
        let mut l = ActivityLog::new(e, ring_n, &[], 1).unwrap();
        for round in 0..30u32 {
            for k in 0..3 {
                l.begin(round * 50 + k, round * 50 + k);
            }
            let (tx, _) = {
                let tx = l.next_transaction().unwrap();
                ring[tx.block_index as usize] = *tx.block;
                let r = l.committed(tx.seq);
                (tx, r)
            };
            assert_eq!(tx.added.len(), 3);
            for k in 0..3 {
                l.end(round * 50 + k, round * 50 + k);
            }
            let r = replay(&ring).unwrap();
            assert_eq!(r.hot, l.hot_extents());
            assert_eq!(r.next_seq, l.next_seq());
            let again = ActivityLog::from_replay(&r).unwrap();
            assert_eq!(again.hot_extents(), l.hot_extents());
        }
    }

    #[test]
    fn new_validates_its_table() {
        assert!(matches!(
            ActivityLog::new(7, 5, &[1, 2], 0).unwrap_err(),
            AlError::TableSize {
                len: 2,
                al_extents: 7
            }
        ));
        let dup = [1, 2, 1, EXTENT_NONE, EXTENT_NONE, EXTENT_NONE, EXTENT_NONE];
        assert!(matches!(
            ActivityLog::new(7, 5, &dup, 0).unwrap_err(),
            AlError::DuplicateExtent { extent: 1, .. }
        ));
        assert!(matches!(
            ActivityLog::new(7, 2, &[], 0).unwrap_err(),
            AlError::Geometry(_)
        ));
    }

    #[test]
    #[should_panic(expected = "not in use")]
    fn end_without_begin_panics() {
        log(7).end(1, 1);
    }
}
