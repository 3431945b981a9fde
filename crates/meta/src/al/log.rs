//! The activity log's state, sans IO: which 4 MiB extents are hot, how many writes use
//! each, which writes wait for a transaction, and the transaction that brings their
//! extents in.
//!
//! The caller (the replication engine's driver) runs one loop:
//! - `begin(first, last)` before a data write: `Hot` → issue it; `Wait(id)` → hold it;
//! - whenever a write waited, a transaction committed, or `end` freed an extent, ask
//!   `next_transaction()`; if it gives one: write the bitmap pages of its `evicted`
//!   extents and, if `evicts_dirty`, fdatasync the data; then write the transaction block
//!   (synced), call `committed(seq)` and issue the writes it names;
//! - `end(first, last)` when a data write is done (completed, maybe only into a cache);
//! - `sync_started()` just before each fdatasync of the data, `sync_done(mark)` when it
//!   succeeded (a failed one is simply never reported).
//!
//! Only one transaction is in flight at a time: a replay tolerates losing the newest
//! block only, so the next may not be written before the one before it is durable.
//!
//! **Clean and dirty.** Once a transaction that evicts an extent is durable, a crash no
//! longer marks that extent; that is only safe if every write to it is already durable on
//! the data disk, else a power loss could drop a completed but unflushed write there, on
//! this replica only, where nobody marks it. Rather than a data fdatasync before every
//! evicting transaction (DRBD's pre-flush), the log knows which extents are *clean*: no
//! write to them ended since the start of the newest data sync that completed. An extent
//! is *dirty* from the `end` of a write to it until a sync that started after that `end`
//! completes. Victims are clean extents first, and a transaction that must evict a dirty
//! one says so (`evicts_dirty`). `clean_unused()` / `dirty_unused()` let the driver start
//! a data sync ahead, in the background, when clean victims run low. Extents of a replayed
//! table start dirty: the process before may have crashed with writes still in the page
//! cache; the first data sync cleans them.
//!
//! **Cost.** The driver asks on every write that misses, so nothing on that path scans
//! the table: the unused slots are kept in victim order (`idle`), the waiting writes are
//! indexed by extent (`waiters_of`), and the dirty ones among the unused are counted
//! (`dirty_idle`). `begin`, `end`, `committed` cost O(log n) per extent they touch,
//! `next_transaction` O(k log n) for the k extents it brings in plus the waiting writes
//! it looks at, `clean_unused` / `dirty_unused` O(1), and `sync_done` O(log n) plus a
//! walk over the extents it cleans (each ended extent is cleaned at most once). Only
//! `clean`, `hot_extents` and `check` go through every slot.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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

/// Names the start of a data sync (`ActivityLog::sync_started`); give it back to
/// `sync_done` of the same log once that sync succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyncMark(u64);

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
    /// The `evicted` extents that are dirty: a write to them ended after the start of the
    /// newest data sync that completed. **Before this block is written, the data must be
    /// synced (fdatasync), or these extents recorded where a crash finds them (the
    /// unsynced map)**, like the bitmap pages: once the block is durable the log no longer
    /// names them, so a write to them lost at a power loss would leave the replicas
    /// different where nobody looks. Wrap such a sync in `sync_started` / `sync_done` too:
    /// it cleans every other extent as well. Empty: nothing to do.
    pub evicted_dirty: Vec<u32>,
    /// The waiting writes it was built for (`committed` may release more: any whose
    /// extents are all hot by then).
    pub releases: Vec<WaitId>,
}

impl Transaction {
    /// Some evicted extent is dirty (`evicted_dirty`).
    pub fn evicts_dirty(&self) -> bool {
        !self.evicted_dirty.is_empty()
    }
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    first: u32,
    last: u32,
}

#[derive(Clone, Debug)]
struct InFlight {
    seq: u64,
    slots: Vec<u32>,
}

/// Where an unused slot sorts in `idle`: `(holds an extent, when, slot)`, `when` being
/// the last use of an empty slot and the last `end` of a full one.
///
/// That is `victim_order` without a key that changes when a sync completes. Empty slots
/// (never dirty) sort first. An unused full slot was last used by an `end` (`last_use ==
/// last_end`), or is a replayed one never used since (`last_use` 0, `last_end` 1, below
/// any clock an `end` sees): ordering by `last_end` is ordering by `last_use`. And as
/// dirty means `last_end > synced`, the clean ones are a prefix of that order and the
/// dirty ones the rest, whatever `synced` is: completing a sync moves the boundary, not
/// the slots. `check` compares this order with `victim_order`.
type IdleKey = (bool, u64, u32);

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
    /// In arrival order (ids grow with arrival).
    waiting: BTreeMap<WaitId, Waiter>,
    /// `(extent, id)` for every extent of every waiting write: a commit makes only its
    /// added extents hot, so only their waiters can go, and it looks at those alone.
    waiters_of: BTreeSet<(u32, WaitId)>,
    /// The unused slots (`is_unused`), in victim order: see `IdleKey`.
    idle: BTreeSet<IdleKey>,
    /// How many `idle` slots are dirty, so that `dirty_unused` / `clean_unused` need no
    /// scan.
    dirty_idle: usize,
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
        let mut log = ActivityLog {
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
            waiting: BTreeMap::new(),
            waiters_of: BTreeSet::new(),
            idle: BTreeSet::new(),
            dirty_idle: 0,
            in_flight: None,
            next_wait: 0,
        };
        for s in 0..n {
            log.enter_idle(s);
        }
        Ok(log)
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
        self.waiting.insert(id, Waiter { first, last });
        self.waiters_of.extend((first..=last).map(|e| (e, id)));
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
            if self.in_use[slot] == 0 {
                self.enter_idle(slot);
            }
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
        if mark.0 <= self.synced {
            return;
        }
        // The unused slots this sync cleans are those ended after the last sync and
        // before this one: a run of `idle`, counted in place (nothing moves).
        let cleaned = self
            .idle
            .range((true, self.synced + 1, 0)..=(true, mark.0, u32::MAX))
            .count();
        self.dirty_idle -= cleaned;
        self.synced = mark.0;
    }

    /// Slots no write uses and the transaction in flight does not change, whose extent is
    /// dirty: victims that would need a data sync first. O(1).
    pub fn dirty_unused(&self) -> usize {
        self.dirty_idle
    }

    /// Slots no write uses and the transaction in flight does not change, empty or with a
    /// clean extent: victims that need no data sync. O(1).
    pub fn clean_unused(&self) -> usize {
        self.idle.len() - self.dirty_idle
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
        // Victim candidates: slots no write uses. With nothing in flight no slot is
        // pending, so they are exactly `idle`.
        let candidates = self.idle.len();
        let mut needed: Vec<u32> = Vec::new();
        let mut releases = Vec::new();
        // Extents of the writes served: never victims. `shielded` counts candidates among them.
        let mut protected: HashSet<u32> = HashSet::new();
        let mut shielded = 0usize;
        for (&id, w) in &self.waiting {
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
                || want > candidates.saturating_sub(shielded + newly_shielded)
            {
                break;
            }
            needed.extend(missing);
            protected.extend(newly);
            shielded += newly_shielded;
            releases.push(id);
        }
        if releases.is_empty() {
            return None;
        }
        // `idle` is in victim order; what is skipped is shielded, so this walks at most
        // `needed.len() + shielded` slots.
        let victims: Vec<u32> = self
            .idle
            .iter()
            .map(|&(_, _, s)| s)
            .filter(|&s| !protected.contains(&self.table[s as usize]))
            .take(needed.len())
            .collect();
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
            self.leave_idle(s);
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
        // Every waiting write has an extent that is not hot, and the only extents this
        // commit makes hot are the ones it added: only their waiters may go.
        let mut woken = Vec::new();
        for &s in &f.slots {
            let s = s as usize;
            self.pending[s] = false;
            // No write uses a pending slot; those the released writes use leave again
            // below.
            self.enter_idle(s);
            let e = self.table[s];
            if e != EXTENT_NONE {
                woken.extend(
                    self.waiters_of
                        .range((e, WaitId(0))..=(e, WaitId(u64::MAX)))
                        .map(|&(_, id)| id),
                );
            }
        }
        // In arrival order, like the queue: each release ticks the LRU clock.
        woken.sort_unstable();
        woken.dedup();
        let mut released = Vec::new();
        for id in woken {
            let w = self.waiting[&id];
            if (w.first..=w.last).all(|e| self.is_hot(e)) {
                self.waiting.remove(&id);
                for e in w.first..=w.last {
                    self.waiters_of.remove(&(e, id));
                }
                self.use_range(w.first, w.last);
                released.push(id);
            }
        }
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
        // Every slot is pending now: none is a victim candidate until the commit.
        self.idle.clear();
        self.dirty_idle = 0;
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
        for (&id, w) in &self.waiting {
            if w.first > w.last || w.last - w.first >= self.max_span() {
                return Err(format!("waiting write {id:?} has a bad range"));
            }
            if (w.first..=w.last).all(|e| self.is_hot(e)) {
                return Err(format!("waiting write {id:?} could go"));
            }
            if id.0 >= self.next_wait {
                return Err(format!("waiting write {id:?} was never handed out"));
            }
        }
        // The indexes, against what they index.
        let waiters_of: BTreeSet<(u32, WaitId)> = self
            .waiting
            .iter()
            .flat_map(|(&id, w)| (w.first..=w.last).map(move |e| (e, id)))
            .collect();
        if waiters_of != self.waiters_of {
            return Err("the waiting writes by extent are not the waiting writes".into());
        }
        let idle: BTreeSet<IdleKey> = (0..n)
            .filter(|&s| self.is_unused(s))
            .map(|s| self.idle_key(s))
            .collect();
        if idle != self.idle {
            return Err("the idle slots are not the unused slots".into());
        }
        let dirty = (0..n)
            .filter(|&s| self.is_unused(s) && self.is_dirty(s))
            .count();
        if dirty != self.dirty_idle {
            return Err(format!(
                "{dirty} unused slots are dirty but {} are counted",
                self.dirty_idle
            ));
        }
        // `next_transaction` takes victims in `idle` order: it must be `victim_order`.
        let mut by_order: Vec<u32> = (0..n as u32)
            .filter(|&s| self.is_unused(s as usize))
            .collect();
        by_order.sort_by_key(|&s| self.victim_order(s));
        if !by_order.iter().copied().eq(self.idle.iter().map(|k| k.2)) {
            return Err("the idle slots are not in victim order".into());
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
    ///
    /// `next_transaction` follows `idle` instead (see `IdleKey`), which `check` holds to
    /// this order. Should the LRU order ever change, keep the clean and the dirty unused
    /// slots in two sets by last use, and move slots from one to the other on
    /// `sync_done`.
    fn victim_order(&self, slot: u32) -> (bool, bool, u64, u32) {
        let s = slot as usize;
        (
            self.is_dirty(s),
            self.table[s] != EXTENT_NONE,
            self.last_use[s],
            slot,
        )
    }

    fn idle_key(&self, s: usize) -> IdleKey {
        let full = self.table[s] != EXTENT_NONE;
        let when = if full {
            self.last_end[s]
        } else {
            self.last_use[s]
        };
        (full, when, s as u32)
    }

    /// Slot `s` just became unused (call after updating its fields).
    fn enter_idle(&mut self, s: usize) {
        let fresh = self.idle.insert(self.idle_key(s));
        debug_assert!(fresh, "slot {s} was idle already");
        if self.is_dirty(s) {
            self.dirty_idle += 1;
        }
    }

    /// Slot `s`, unused, is about to be used or changed (call before changing its
    /// fields: they name its place in `idle`).
    fn leave_idle(&mut self, s: usize) {
        let was = self.idle.remove(&self.idle_key(s));
        debug_assert!(was, "slot {s} was not idle");
        if self.is_dirty(s) {
            self.dirty_idle -= 1;
        }
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
            // A hot slot no write uses is idle.
            if self.in_use[s] == 0 {
                self.leave_idle(s);
            }
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

    /// Whether `extent`'s slot is dirty (white box).
    fn dirty(l: &ActivityLog, extent: u32) -> bool {
        l.is_dirty(l.slot_of[&extent] as usize)
    }

    /// A log of 7 holding 0..7, every write ended in order (0 first): all dirty.
    fn full_and_ended() -> ActivityLog {
        let mut l = log(7);
        for e in 0..7 {
            l.begin(e, e);
        }
        commit(&mut l);
        for e in 0..7 {
            l.end(e, e);
        }
        l
    }

    #[test]
    fn an_end_makes_its_extents_dirty_until_a_sync_started_after_it_completes() {
        let mut l = log(7);
        assert_eq!((l.clean_unused(), l.dirty_unused()), (7, 0));
        l.begin(2, 3);
        let tx = l.next_transaction().unwrap();
        assert!(!tx.evicts_dirty());
        // The two slots being filled are neither clean nor dirty victims.
        assert_eq!((l.clean_unused(), l.dirty_unused()), (5, 0));
        l.committed(tx.seq);
        assert_eq!((l.clean_unused(), l.dirty_unused()), (5, 0));
        assert!(!dirty(&l, 2), "a newcomer has no write ended yet");
        l.end(2, 3);
        assert!(dirty(&l, 2) && dirty(&l, 3));
        assert_eq!((l.clean_unused(), l.dirty_unused()), (5, 2));
        let m = l.sync_started();
        assert_eq!(l.dirty_unused(), 2, "started is not done");
        l.sync_done(m);
        assert!(!dirty(&l, 2) && !dirty(&l, 3));
        assert_eq!((l.clean_unused(), l.dirty_unused()), (7, 0));
        l.check().unwrap();
    }

    #[test]
    fn a_write_in_use_across_a_whole_sync_stays_dirty() {
        let mut l = full_and_ended();
        let m0 = l.sync_started();
        l.sync_done(m0);
        assert_eq!(l.begin(4, 4), Begin::Hot);
        let m = l.sync_started();
        l.sync_done(m);
        // In use: counted as neither.
        assert_eq!((l.clean_unused(), l.dirty_unused()), (6, 0));
        l.end(4, 4);
        assert!(dirty(&l, 4), "it may have completed after the sync started");
        assert_eq!((l.clean_unused(), l.dirty_unused()), (6, 1));
        l.check().unwrap();
    }

    #[test]
    fn overlapping_syncs_clean_only_what_ended_before_their_start() {
        let mut l = full_and_ended();
        let old = l.sync_started();
        l.begin(1, 1);
        l.end(1, 1); // after `old`
        let new = l.sync_started();
        l.begin(2, 2);
        l.end(2, 2); // after `new`

        // The older sync finishing cleans what ended before it only.
        l.sync_done(old);
        assert_eq!(
            (0..7).filter(|&e| dirty(&l, e)).collect::<Vec<_>>(),
            vec![1, 2]
        );
        l.sync_done(new);
        assert_eq!(
            (0..7).filter(|&e| dirty(&l, e)).collect::<Vec<_>>(),
            vec![2]
        );
        // Newer first, then the older one late: it must not clean 2 (nor dirty 1 again).
        let mut l = full_and_ended();
        let old = l.sync_started();
        l.begin(1, 1);
        l.end(1, 1);
        let new = l.sync_started();
        l.begin(2, 2);
        l.end(2, 2);
        l.sync_done(new);
        l.sync_done(old);
        assert_eq!(
            (0..7).filter(|&e| dirty(&l, e)).collect::<Vec<_>>(),
            vec![2]
        );
        l.check().unwrap();
        // The same mark twice changes nothing either.
        l.sync_done(new);
        assert_eq!(l.dirty_unused(), 1);
    }

    #[test]
    fn evicts_dirty_says_whether_a_victim_has_an_unsynced_write() {
        let mut l = full_and_ended();
        l.begin(10, 10);
        let (tx, _) = commit(&mut l);
        assert_eq!(tx.evicted, vec![0]);
        assert!(tx.evicts_dirty(), "0 was never synced");
        l.end(10, 10);
        let m = l.sync_started();
        l.sync_done(m);
        l.begin(11, 12);
        let (tx, _) = commit(&mut l);
        assert_eq!(tx.evicted, vec![1, 2]);
        assert!(!tx.evicts_dirty());
        l.end(11, 12);
        // 3..7 and 10 are clean, 11 and 12 dirty: the clean go first, then a dirty one.
        for e in 20..24 {
            l.begin(e, e);
        }
        let (tx, _) = commit(&mut l);
        let mut evicted = tx.evicted.clone();
        evicted.sort_unstable();
        assert_eq!(evicted, vec![3, 4, 5, 6]);
        assert!(!tx.evicts_dirty());
        for e in 20..24 {
            l.end(e, e);
        }
        l.begin(30, 30);
        let (tx, _) = commit(&mut l);
        assert_eq!(tx.evicted, vec![10]);
        assert!(!tx.evicts_dirty());
        l.begin(31, 31);
        let (tx, _) = commit(&mut l);
        assert_eq!(tx.evicted, vec![11]);
        assert!(tx.evicts_dirty());
    }

    #[test]
    fn a_clean_victim_goes_before_an_older_dirty_one() {
        let mut l = full_and_ended();
        let m = l.sync_started();
        l.sync_done(m);
        l.begin(3, 3);
        l.end(3, 3);
        // Through the API a dirty slot is never older than a clean one (an unused slot's
        // last use is its last end); make 3 the least recently used by hand, as an LRU by
        // begin time would, to see the preference itself.
        let s3 = l.slot_of[&3] as usize;
        l.last_use[s3] = 0;
        assert!(dirty(&l, 3));
        l.begin(20, 20);
        let (tx, _) = commit(&mut l);
        assert_eq!(tx.evicted, vec![0]);
        assert!(!tx.evicts_dirty());
        // Only dirty victims left beside 3? Then 3 goes, and says so.
        l.end(20, 20);
        for e in [1, 2, 4, 5, 6, 20] {
            l.begin(e, e);
        }
        l.begin(21, 21);
        let (tx, _) = commit(&mut l);
        assert_eq!((tx.evicted.clone(), tx.evicts_dirty()), (vec![3], true));
    }

    #[test]
    fn replayed_extents_are_dirty_until_a_sync() {
        let ring = crate::layout::min_ring_blocks(7);
        let table = [4, 9, EXTENT_NONE, 2, EXTENT_NONE, EXTENT_NONE, 7];
        let mut l = ActivityLog::new(7, ring, &table, 5).unwrap();
        l.check().unwrap();
        assert_eq!((l.clean_unused(), l.dirty_unused()), (3, 4));
        // Empty slots go first: no eviction at all.
        l.begin(20, 22);
        let (tx, _) = commit(&mut l);
        assert!(tx.evicted.is_empty() && !tx.evicts_dirty());
        l.end(20, 22);
        l.begin(30, 30);
        let (tx, _) = commit(&mut l);
        assert_eq!((tx.evicted.clone(), tx.evicts_dirty()), (vec![4], true));
        l.end(30, 30);
        let m = l.sync_started();
        l.sync_done(m);
        assert_eq!((l.clean_unused(), l.dirty_unused()), (7, 0));
        l.begin(31, 31);
        let (tx, _) = commit(&mut l);
        assert_eq!((tx.evicted.clone(), tx.evicts_dirty()), (vec![9], false));
    }

    #[test]
    fn clean_says_whether_it_evicts_a_dirty_extent() {
        let mut l = log(1237);
        l.begin(5, 6);
        commit(&mut l);
        l.end(5, 6);
        let tx = l.clean().unwrap();
        assert!(tx.evicts_dirty());
        l.committed(tx.seq);
        l.check().unwrap();
        assert_eq!((l.clean_unused(), l.dirty_unused()), (1237, 0));

        let mut l = log(1237);
        l.begin(5, 6);
        commit(&mut l);
        l.end(5, 6);
        let m = l.sync_started();
        l.sync_done(m);
        let tx = l.clean().unwrap();
        assert!(!tx.evicts_dirty());
        assert!(!log(7).clean().unwrap().evicts_dirty(), "an empty log");
    }

    #[test]
    #[should_panic(expected = "another log")]
    fn a_mark_from_another_log_panics() {
        let mut a = log(7);
        let mut b = log(7);
        for _ in 0..5 {
            a.sync_started();
        }
        let m = a.sync_started();
        b.sync_done(m);
    }
}
