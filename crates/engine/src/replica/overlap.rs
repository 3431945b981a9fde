//! Ordering of overlapping writes.
//!
//! Two writes to overlapping ranges must land in the same order on every replica. The simplest
//! way that needs no coordination between replicas: never have two overlapping writes in
//! flight. A write that overlaps one in flight waits (in arrival order) until it completes
//! everywhere.

use std::collections::{BTreeMap, VecDeque};

/// Disjoint byte ranges in flight, keyed by start.
#[derive(Debug)]
pub struct InFlight<K: Copy + Eq> {
    ranges: BTreeMap<u64, (u64, K)>,
}

impl<K: Copy + Eq> Default for InFlight<K> {
    fn default() -> Self {
        InFlight {
            ranges: BTreeMap::new(),
        }
    }
}

impl<K: Copy + Eq + std::fmt::Debug> InFlight<K> {
    pub fn overlaps(&self, offset: u64, len: u64) -> bool {
        let end = offset + len;
        self.ranges
            .range(..end)
            .next_back()
            .is_some_and(|(_, (e, _))| *e > offset)
    }

    pub fn insert(&mut self, offset: u64, len: u64, key: K) {
        debug_assert!(!self.overlaps(offset, len), "overlapping writes in flight");
        self.ranges.insert(offset, (offset + len, key));
    }

    pub fn remove(&mut self, offset: u64, key: K) {
        let removed = self.ranges.remove(&offset);
        debug_assert!(
            removed.is_some_and(|(_, k)| k == key),
            "removing a range that is not in flight"
        );
    }

    /// Whether `key` is in flight at `offset`.
    pub fn holds(&self, offset: u64, key: K) -> bool {
        self.ranges.get(&offset).is_some_and(|&(_, k)| k == key)
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The ranges are disjoint and not empty.
    pub fn check(&self) -> Result<(), String> {
        let mut prev_end = 0;
        for (&start, &(end, key)) in &self.ranges {
            if end <= start {
                return Err(format!("empty range {start}..{end} in flight ({key:?})"));
            }
            if start < prev_end {
                return Err(format!("overlapping ranges in flight at {start} ({key:?})"));
            }
            prev_end = end;
        }
        Ok(())
    }
}

/// Writes waiting for an overlapping one to finish, in arrival order.
#[derive(Debug)]
pub struct Waiting<T> {
    queue: VecDeque<(u64, u64, T)>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            queue: VecDeque::new(),
        }
    }
}

impl<T> Waiting<T> {
    pub fn push(&mut self, offset: u64, len: u64, item: T) {
        self.queue.push_back((offset, len, item));
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a new write must queue behind a waiting one (to keep arrival order).
    pub fn blocks(&self, offset: u64, len: u64) -> bool {
        self.queue
            .iter()
            .any(|(o, l, _)| *o < offset + len && offset < o + l)
    }

    /// Removes and returns the waiting writes that may start now: those that overlap neither
    /// a write in flight, nor an earlier waiting write, nor one started in this same pass.
    pub fn ready<K: Copy + Eq + std::fmt::Debug>(&mut self, in_flight: &InFlight<K>) -> Vec<T> {
        let mut ready = Vec::new();
        let mut blockers: Vec<(u64, u64)> = Vec::new();
        let mut still = VecDeque::with_capacity(self.queue.len());
        while let Some((o, l, item)) = self.queue.pop_front() {
            let blocked = in_flight.overlaps(o, l)
                || blockers.iter().any(|&(bo, bl)| bo < o + l && o < bo + bl);
            blockers.push((o, l));
            if blocked {
                still.push_back((o, l, item));
            } else {
                ready.push(item);
            }
        }
        self.queue = still;
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_wait_in_arrival_order() {
        let mut f: InFlight<u32> = InFlight::default();
        let mut w: Waiting<u32> = Waiting::default();
        f.insert(0, 8192, 1);
        assert!(f.overlaps(4096, 4096));
        assert!(!f.overlaps(8192, 4096));
        w.push(4096, 4096, 2); // overlaps 1
        assert!(
            w.blocks(4096, 512),
            "a later write behind a waiting one must queue too"
        );
        w.push(4096, 512, 3); // overlaps 2, which waits
        w.push(65536, 4096, 4); // independent
        assert_eq!(w.ready(&f), vec![4]);
        f.remove(0, 1);
        assert_eq!(
            w.ready(&f),
            vec![2],
            "3 stays behind 2 although nothing is in flight"
        );
        f.insert(4096, 4096, 2);
        assert_eq!(w.ready(&f), Vec::<u32>::new());
        f.remove(4096, 2);
        assert_eq!(w.ready(&f), vec![3]);
        assert!(w.is_empty());
    }
}
