//! The activity log as it was before its indexes (`tandem_meta::al::log` at the commit
//! that added them), kept verbatim but for the imports and `SyncMark`: the differential
//! test drives both with the same calls and wants the same answers, and the timing test
//! compares their cost. Every operation here scans the slots, which is why it was
//! replaced; do not optimise it.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};

use tandem_meta::al::format::{
    AlBlock, AlKind, AlUpdate, EXTENT_NONE, MAX_EXTENTS, UPDATES_PER_TRANSACTION,
};
use tandem_meta::al::{Begin, Transaction, WaitId};
use tandem_meta::error::{AlBusy, AlError};
use tandem_meta::layout::Geometry;

/// The reference's own mark: the crate's has a private field. Both logs tick the same
/// clock, so both hand out the same numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyncMark(u64);

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
    /// Clock value of the last `end` on each slot's extent since it came into the slot: 0
    /// for none (an empty slot, a newcomer), 1 for a replayed extent (dirty until a sync).
    last_end: Vec<u64>,
    /// The newest mark whose data sync completed: a slot is dirty iff its `last_end` is
    /// above it (marks and ends share `clock`, so they never tie).
    synced: u64,
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
            unsynced_map: false,
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
        // Replayed extents are dirty (`last_end` 1) until a data sync started after now.
        let last_end: Vec<u64> = table.iter().map(|&e| u64::from(e != EXTENT_NONE)).collect();
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
            last_end,
            synced: 0,
            pending: vec![false; n],
            clock: 1,
            next_seq,
            waiting: VecDeque::new(),
            in_flight: None,
            next_wait: 0,
        })
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

    /// A write begun on `first..=last` is done: it completed, maybe only into the page
    /// cache or the disk's cache, so its extents are dirty until a data sync started after
    /// this call completes.
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
            self.last_end[slot] = self.clock;
        }
    }

    /// The driver is about to start a data sync (fdatasync of the data file). Every write
    /// `end`ed before this call is durable once that sync succeeds: tell `sync_done`.
    pub fn sync_started(&mut self) -> SyncMark {
        self.clock += 1;
        SyncMark(self.clock)
    }

    /// The data sync started at `mark` succeeded: every extent whose writes all ended
    /// before `mark` is clean. Syncs may overlap and finish in any order; an older mark
    /// reported after a newer one changes nothing.
    ///
    /// # Panics
    /// If `mark` is newer than anything this log handed out (it came from another log).
    pub fn sync_done(&mut self, mark: SyncMark) {
        assert!(
            mark.0 <= self.clock,
            "AL sync_done({mark:?}) but the clock is {}: a mark from another log?",
            self.clock
        );
        self.synced = self.synced.max(mark.0);
    }

    /// Slots no write uses and the transaction in flight does not change, whose extent is
    /// dirty: victims that would need a data sync first. O(al_extents).
    pub fn dirty_unused(&self) -> usize {
        (0..self.al_extents as usize)
            .filter(|&s| self.is_unused(s) && self.is_dirty(s))
            .count()
    }

    /// Slots no write uses and the transaction in flight does not change, empty or with a
    /// clean extent: victims that need no data sync. O(al_extents).
    pub fn clean_unused(&self) -> usize {
        (0..self.al_extents as usize)
            .filter(|&s| self.is_unused(s) && !self.is_dirty(s))
            .count()
    }

    /// The next transaction, if none is in flight and some waiting write can be served:
    /// every extent the waiting writes need, in arrival order, as long as they fit in one
    /// transaction and victims (unused slots: empty ones first, then clean extents, then
    /// dirty ones, each least recently used first) are found. A write that does not fit
    /// waits for a later one, and so does every write behind it.
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
        let mut evicted_dirty = Vec::new();
        let mut updates = Vec::with_capacity(needed.len());
        for (&e, &slot) in needed.iter().zip(&victims) {
            let s = slot as usize;
            let old = self.table[s];
            if old != EXTENT_NONE {
                self.slot_of.remove(&old);
                evicted.push(old);
                if self.is_dirty(s) {
                    evicted_dirty.push(old);
                }
            }
            self.table[s] = e;
            self.slot_of.insert(e, slot);
            self.pending[s] = true;
            self.last_use[s] = self.clock;
            self.last_end[s] = 0;
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
            evicted_dirty,
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
    /// is in `evicted` (the caller flushes the whole bitmap first, and syncs the data first
    /// if `evicts_dirty`).
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
        let mut evicted_dirty: Vec<u32> = (0..self.al_extents as usize)
            .filter(|&s| self.is_dirty(s))
            .map(|s| self.table[s])
            .collect();
        evicted_dirty.sort_unstable();
        self.table.fill(EXTENT_NONE);
        self.last_end.fill(0);
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
            evicted_dirty,
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
            self.last_end.len(),
            self.pending.len(),
        ] != [n; 5]
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
        if self.synced > self.clock {
            return Err(format!(
                "synced up to {} but the clock is {}",
                self.synced, self.clock
            ));
        }
        for s in 0..n {
            if self.in_use[s] > 0 && (self.table[s] == EXTENT_NONE || self.pending[s]) {
                return Err(format!("slot {s} is in use but not hot"));
            }
            if self.last_end[s] > self.clock || self.last_use[s] > self.clock {
                return Err(format!("slot {s} was used or ended after the clock"));
            }
            if self.last_end[s] != 0 && (self.table[s] == EXTENT_NONE || self.pending[s]) {
                return Err(format!(
                    "slot {s} is empty or being changed, but a write ended on it"
                ));
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

    /// Clean before dirty (no data sync needed), among them empty slots first, then the
    /// least recently used.
    ///
    /// Today the first key changes no choice: an unused slot was last used by an `end` (or
    /// is a replayed one, unused since), and a sync cleans everything that ended before
    /// it, so the clean unused slots are always the least recently used ones. The key
    /// keeps the preference should the LRU order ever change (e.g. to begin times).
    fn victim_order(&self, slot: u32) -> (bool, bool, u64, u32) {
        let s = slot as usize;
        (
            self.is_dirty(s),
            self.table[s] != EXTENT_NONE,
            self.last_use[s],
            slot,
        )
    }

    /// A write to this slot's extent ended after the start of the newest completed sync.
    fn is_dirty(&self, s: usize) -> bool {
        self.last_end[s] > self.synced
    }

    /// No write uses the slot and the transaction in flight does not change it.
    fn is_unused(&self, s: usize) -> bool {
        self.in_use[s] == 0 && !self.pending[s]
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
