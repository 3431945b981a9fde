//! The checker: what every request's answer, every FLUSH and FUA write, and the replicas
//! at the end must show, against the model of the writes the application made.

use crate::disk::SECTOR;
use crate::Sim;
use tandem_engine::replica::{NodeId, Protocol};
use tandem_engine::ReqId;

/// A write as the checker sees it.
#[derive(Clone, Debug)]
pub(crate) struct WriteRec {
    pub(crate) stamp: u64,
    pub(crate) volume: u16,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) completed: Option<u64>,
    /// Completion order (several completions share a simulated instant).
    pub(crate) order: u64,
    pub(crate) ok: bool,
    /// Some replica's disk applied it. Under protocol A a diskless Primary acknowledges a
    /// write once sent, so a write that no replica ever received may be lost: only such
    /// writes are exempt from the checks.
    pub(crate) applied: bool,
    /// The nodes whose disk applied it (bit n: node n).
    pub(crate) applied_on: u8,
    /// The peers the Primary sent it to, and on which connection: whether a crash of
    /// every node may take it (see `crash.rs`).
    pub(crate) sent: Vec<(NodeId, u64)>,
    pub(crate) zero: bool,
    pub(crate) fua: bool,
    pub(crate) submitted: u64,
    /// The clock when it was submitted: a write completed (`order`) at or before it was
    /// over by then (see `failover.rs`, the history check of reads).
    pub(crate) submit_order: u64,
    /// The node that answered it (a Primary).
    pub(crate) acked_by: Option<NodeId>,
}

pub(crate) struct ReadRec {
    pub(crate) req: ReqId,
    pub(crate) volume: u16,
    pub(crate) offset: u64,
    pub(crate) stamps: Vec<u64>,
    pub(crate) submitted: u64,
}

impl Sim {
    /// With quorum on, a write acknowledged under protocol C is on a majority of the
    /// replicas of its volume (one fewer when a diskless tiebreaker may have kept the
    /// quorum of an even number): the side of a partition without it never acknowledges
    /// one, so no two sides can.
    pub(crate) fn check_majority(&self, w: &WriteRec) {
        if self.sc.knobs.quorum.is_off() || self.sc.protocol != Protocol::C || w.zero {
            return;
        }
        let v = w.volume as usize;
        let voters: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.sc.replica(i, v))
            .collect();
        let tiebreakers = self.nodes.len() - voters.len();
        let mut needed = voters.len() / 2 + 1;
        if voters.len().is_multiple_of(2) && tiebreakers > 0 {
            needed -= 1;
        }
        let holders = voters
            .iter()
            .filter(|&&i| w.applied_on & (1 << i) != 0)
            .count();
        assert!(
            holders >= needed,
            "seed {}: write {} of volume {v} acknowledged while on {holders} of {} replicas ({needed} needed)\n{}",
            self.sc.seed,
            w.stamp,
            voters.len(),
            self.tail_log(300)
        );
    }

    /// Stamps a replica of `volume` holds durably at `sector`, one per node keeping one.
    pub(crate) fn durable_at(
        &self,
        volume: usize,
        sector: usize,
    ) -> impl Iterator<Item = u64> + '_ {
        (0..self.nodes.len())
            .filter(move |&i| self.sc.replica(i, volume))
            .map(move |i| self.nodes[i].disk.durable(volume, sector))
    }

    /// A FLUSH that succeeded made every write completed before it durable: per sector,
    /// some replica's last fdatasync covered the latest such write (or a newer one). The
    /// engine flushes every replica whatever the volume the FLUSH came on, so this holds for
    /// every volume; but the FLUSH answers for its own volume only (as NBD's FLUSH does for
    /// its export): with overlapping faults another volume may have lost every replica.
    pub(crate) fn check_flush(&self, req: ReqId, volume: u16, submitted: u64) {
        for (v, model) in self.model.iter().enumerate() {
            // With one failure at a time a barrier reaches every volume's replicas; a dead
            // disk plus a cut link is two, and another volume's last replica may be out of
            // reach: then only the FLUSH's own volume is promised.
            let two_failures = self.sc.overlapping_faults || self.any_failed();
            if two_failures && v != volume as usize {
                continue;
            }
            for (s, &(want, _)) in model.iter().enumerate() {
                // Fast path: the latest successful write is durable somewhere.
                if self.durable_at(v, s).any(|got| got == want) {
                    continue;
                }
                let at = s as u64 * SECTOR;
                let allowed = self.allowed_at(v as u16, at, submitted);
                assert!(
                    self.durable_at(v, s).any(|got| allowed.contains(&got)),
                    "seed {}: flush {req:?} completed, but no replica of volume {v} has sector {s} durable: durable stamps {:?}, allowed {allowed:?}\n{:?}\n{}",
                    self.sc.seed,
                    self.durable_at(v, s).collect::<Vec<_>>(),
                    self.sc,
                    self.tail_log(300)
                );
            }
        }
    }

    /// A FUA write that succeeded is durable on some replica.
    pub(crate) fn check_fua(&self, w: &WriteRec) {
        let v = w.volume as usize;
        for s in (w.offset / SECTOR)..((w.offset + w.len) / SECTOR) {
            assert!(
                self.durable_at(v, s as usize).any(|got| got == w.stamp),
                "seed {}: FUA write {} completed, but no replica of volume {v} has sector {s} durable: durable stamps {:?}\n{:?}\n{}",
                self.sc.seed,
                w.stamp,
                self.durable_at(v, s as usize).collect::<Vec<_>>(),
                self.sc,
                self.tail_log(300)
            );
        }
    }

    /// A write that counts: it succeeded, and (see `WriteRec::applied`) reached a replica.
    pub(crate) fn counts(&self, w: &WriteRec) -> bool {
        w.ok
    }

    /// The stamps sector `at` of `volume` may show to a request submitted at clock
    /// `submitted`: the latest write completed before, or a write in flight meanwhile.
    pub(crate) fn allowed_at(&self, volume: u16, at: u64, submitted: u64) -> Vec<u64> {
        let covering = self
            .writes
            .iter()
            .filter(|w| w.volume == volume && w.offset <= at && at < w.offset + w.len);
        let mut last_done: Option<&WriteRec> = None;
        let mut allowed = Vec::new();
        for w in covering {
            match w.completed {
                Some(_) if w.order < submitted && self.counts(w) => {
                    if last_done.is_none_or(|l| l.order < w.order) {
                        last_done = Some(w);
                    }
                }
                // Failed or lost writes may have landed anywhere; others were in flight.
                _ => allowed.push(w.stamp),
            }
        }
        allowed.push(last_done.map_or(0, |w| w.stamp));
        allowed
    }

    /// Every sector holds the latest write completed before the read began, or a write in
    /// flight at some point while the read was.
    pub(crate) fn check_read(&self, r: &ReadRec) {
        for (k, &got) in r.stamps.iter().enumerate() {
            let at = r.offset + k as u64 * SECTOR;
            let allowed = if self.sc.failover {
                self.allowed_in_history(r.volume, at, r.submitted)
            } else {
                self.allowed_at(r.volume, at, r.submitted)
            };
            assert!(
                allowed.contains(&got),
                "seed {}: read {:?} of volume {} sector {at} returned stamp {got}, allowed {allowed:?}\n{:?}\n{}",
                self.sc.seed,
                r.req,
                r.volume,
                self.sc,
                self.tail_log(300)
            );
        }
    }

    /// Per volume and sector, the stamps a replica may hold at the end: the last
    /// acknowledged write, then any failed ones after it (a failed write may have landed on
    /// some replicas; resync must then have spread it to all). Stamps are unique across
    /// volumes: a write that landed in the wrong volume shows. `lost_ok`: a write
    /// acknowledged before any replica applied it (protocols A and B) may be lost, as when
    /// every replica that could still receive it failed meanwhile.
    pub(crate) fn allowed_final(&self, v: usize, lost_ok: bool) -> Vec<Vec<u64>> {
        let mut by_order: Vec<&WriteRec> = self
            .writes
            .iter()
            .filter(|w| w.completed.is_some() && w.volume as usize == v)
            .collect();
        by_order.sort_by_key(|w| w.order);
        let mut allowed: Vec<Vec<u64>> = vec![vec![0]; (self.sc.sizes[v] / SECTOR) as usize];
        for w in by_order {
            for s in (w.offset / SECTOR)..((w.offset + w.len) / SECTOR) {
                let a = &mut allowed[s as usize];
                if self.counts(w) && (w.applied || !lost_ok) {
                    a.clear();
                }
                a.push(w.stamp);
            }
        }
        allowed
    }

    /// The nodes that keep a replica of volume `v` on a disk that works.
    pub(crate) fn replicas_of(&self, v: usize) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.live_replica(i, v))
            .collect()
    }

    /// An overlapping-fault run that could not converge: every request was still answered,
    /// every read returned what it may, and nothing acknowledged that reached a replica is
    /// lost (per sector, some replica holds the last such write or a failed one after it).
    pub(crate) fn check_safety(&self) {
        self.check_detached(false);
        self.check_failed_known_behind(false);
        let seed = self.sc.seed;
        assert!(
            self.pending.is_empty(),
            "seed {seed}: requests never answered: {}",
            self.pending.len()
        );
        for r in &self.reads {
            self.check_read(r);
        }
        for v in 0..self.sc.sizes.len() {
            let replicas = self.replicas_of(v);
            for (s, want) in self.allowed_final(v, true).iter().enumerate() {
                let got: Vec<u64> = replicas
                    .iter()
                    .map(|&i| self.nodes[i].disk.stamp(v, s))
                    .collect();
                assert!(
                    got.iter().any(|g| want.contains(g)),
                    "seed {seed}: volume {v} sector {s}: no replica holds the last acknowledged write: stamps {got:?}, allowed {want:?}\n{:?}\n{}",
                    self.sc,
                    self.tail_log(3000)
                );
            }
        }
    }

    pub(crate) fn check_final(&self) {
        self.check_detached(true);
        self.check_failed_known_behind(true);
        let seed = self.sc.seed;
        assert!(
            self.pending.is_empty(),
            "seed {seed}: requests never answered: {}",
            self.pending.len()
        );
        assert!(
            self.in_sync(),
            "seed {seed}: replicas never converged\n{}",
            self.tail_log(80)
        );
        for r in &self.reads {
            self.check_read(r);
        }
        for v in 0..self.sc.sizes.len() {
            let allowed = self.allowed_final(v, false);
            let replicas = self.replicas_of(v);
            for &i in &replicas {
                for (s, want) in allowed.iter().enumerate() {
                    let got = self.nodes[i].disk.stamp(v, s);
                    assert!(
                        want.contains(&got),
                        "seed {seed}: node {i} volume {v} sector {s}: stamp {got}, allowed (last acknowledged write, then failed ones) {want:?}\n{:?}\n{}",
                        self.sc,
                        self.tail_log(3000)
                    );
                }
            }
            let first = self.nodes[replicas[0]].disk.volume(v);
            for &i in &replicas {
                let this = self.nodes[i].disk.volume(v);
                if let Some(s) = (0..first.len() / SECTOR as usize).find(|&s| {
                    let r = s * SECTOR as usize..(s + 1) * SECTOR as usize;
                    this[r.clone()] != first[r]
                }) {
                    panic!(
                        "seed {seed}: node {i}'s replica of volume {v} differs from node {}'s at sector {s} (stamps {} vs {})\n{:?}\n{}",
                        replicas[0],
                        self.nodes[i].disk.stamp(v, s),
                        self.nodes[replicas[0]].disk.stamp(v, s),
                        self.sc,
                        self.tail_log(3000)
                    );
                }
            }
        }
    }
}
