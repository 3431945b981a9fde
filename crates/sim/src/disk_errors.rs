//! Disk errors: a node's disk failing (for good, or one write or fdatasync), what the
//! simulator then counts as failed, and what the engine must do about it: detach the
//! replica (DRBD's on-io-error detach), issue no more I/O on it, and know, on the Primary,
//! every block it lacks.

use crate::disk::{Failure, OpClass, SECTOR};
use crate::{DiskOpState, Sim};
use tandem_engine::replica::{DiskState, NodeId, RAction, Token};
use tandem_engine::{DiskKind, IoError};

const EIO: IoError = IoError::Os(5);

fn class(kind: DiskKind) -> OpClass {
    match kind {
        DiskKind::Write { .. } | DiskKind::Zero { .. } | DiskKind::Trim { .. } => OpClass::Write,
        DiskKind::Flush => OpClass::Sync,
        DiskKind::Read { .. } | DiskKind::Cache { .. } | DiskKind::Allocation { .. } => {
            OpClass::Other
        }
    }
}

impl Sim {
    /// The disk of a node that keeps replicas starts failing (each volume keeps a replica
    /// elsewhere, so one failed disk loses nothing): for good, or at its next write or
    /// fdatasync only (see [`crate::Scenario::one_off_eio`]).
    pub(crate) fn fail_disk(&mut self) {
        let keepers: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.sc.any_replica(i))
            .collect();
        let i = keepers[self.fault_rng.below(keepers.len() as u64) as usize];
        self.disk_fault = true;
        if self.sc.one_off_eio {
            let (f, what) = if self.eio_rng.chance(0.5) {
                (Failure::NextWrite, "write")
            } else {
                (Failure::NextSync, "fdatasync")
            };
            self.nodes[i].disk.fail(f);
            self.note(format!(
                "node {i}: its disk will fail its next {what} (EIO)"
            ));
        } else {
            self.nodes[i].disk.fail(Failure::Dead);
            self.replicas_fail(i, None);
            self.note(format!(
                "node {i}: its disk fails for good (EIO from now on)"
            ));
        }
    }

    /// Whether an operation of `kind` completing now on `node` fails. A one-off failure
    /// waits until nothing else is failing: one failure at a time (a resync source failing
    /// under its target loses data no engine can keep).
    pub(crate) fn failing(&mut self, node: NodeId, kind: DiskKind) -> bool {
        let (i, op) = (node as usize, class(kind));
        let disk = &self.nodes[i].disk;
        if !disk.armed_for(op) || (!disk.dead() && !self.healthy()) {
            return false;
        }
        self.nodes[i].disk.fails(op)
    }

    /// An operation on a failing disk: the engine gets EIO. A write failing once may have
    /// reached some of its sectors (a dead disk writes nothing).
    pub(crate) fn fail_disk_op(&mut self, node: NodeId, st: DiskOpState) -> Vec<RAction> {
        let (i, v) = (node as usize, st.volume as usize);
        if !self.nodes[i].disk.dead() {
            self.one_off_eios += 1;
            let landing = match st.kind {
                DiskKind::Write { offset, len } => {
                    let data = st.data.as_ref().expect("write data captured at issue");
                    Some((offset, data[..len as usize].to_vec()))
                }
                DiskKind::Zero { offset, len, .. } | DiskKind::Trim { offset, len } => {
                    Some((offset, vec![0; len as usize]))
                }
                _ => None,
            };
            if let Some((offset, data)) = landing {
                let disk = &mut self.nodes[i].disk;
                disk.write_some(v, offset, &data, &mut self.eio_rng);
            }
            self.note(format!(
                "node {node}: {:?} {:?} fails with EIO",
                st.token, st.kind
            ));
        }
        let which = (st.kind != DiskKind::Flush).then_some(v);
        self.replicas_fail(i, which);
        self.told_eio(node, which);
        let n = &mut self.nodes[i];
        n.data.write_ended(st.token);
        let mut out = Vec::new();
        n.engine
            .disk_done(st.volume, st.token, st.kind, Err(EIO), &mut out);
        out
    }

    /// Node `i`'s replica of volume `which` (every replica it keeps: `None`) failed now,
    /// unless it already had.
    pub(crate) fn replicas_fail(&mut self, i: usize, which: Option<usize>) {
        for v in 0..self.sc.sizes.len() {
            if which.is_none_or(|w| w == v) && self.sc.replica(i, v) {
                self.failed_at[i][v].get_or_insert(self.now);
            }
        }
    }

    /// The engine of `node` is given an EIO for its replica of volume `which` (an
    /// fdatasync: `None`, all of them).
    pub(crate) fn told_eio(&mut self, node: NodeId, which: Option<usize>) {
        let i = node as usize;
        for v in 0..self.sc.sizes.len() {
            if which.is_none_or(|w| w == v) && self.sc.replica(i, v) {
                self.eio_told[i][v].get_or_insert(self.now);
            }
        }
    }

    pub(crate) fn is_failed(&self, i: usize, v: usize) -> bool {
        self.failed_at[i][v].is_some()
    }

    /// Some replica of node `i` failed, or its disk is dead.
    pub(crate) fn node_failed(&self, i: usize) -> bool {
        self.nodes[i].disk.dead() || self.failed_at[i].iter().any(Option::is_some)
    }

    pub(crate) fn any_failed(&self) -> bool {
        self.failed_at.iter().flatten().any(Option::is_some)
    }

    /// Whether node `i` keeps a replica of volume `v` on a disk that works.
    pub(crate) fn live_replica(&self, i: usize, v: usize) -> bool {
        self.sc.replica(i, v) && !self.is_failed(i, v)
    }

    /// A replica the engine detached gets no more reads or writes, not even one that was
    /// queued behind an overlapping write when it detached (seed 683). (An fdatasync may
    /// still come: one queued behind the one that failed is issued when that one ends,
    /// `Requests::flushed`; nothing it answers is believed, since a replica that is not
    /// UpToDate vouches for no barrier.)
    pub(crate) fn check_no_io_when_detached(
        &self,
        node: NodeId,
        volume: u16,
        token: Token,
        kind: DiskKind,
    ) {
        if kind == DiskKind::Flush {
            return;
        }
        assert!(
            !self.detached[node as usize][volume as usize],
            "seed {}: node {node} issued {kind:?} ({token:?}) on volume {volume}, a replica it had detached\n{}",
            self.sc.seed,
            self.tail_log(200)
        );
    }

    /// Every replica whose engine was given an EIO is detached: it said so, its node calls
    /// it Diskless, and (`settled`: every link up, everything said) the Primary does not
    /// take it for UpToDate.
    pub(crate) fn check_detached(&self, settled: bool) {
        let primary = self.nodes[0].engine.status();
        for (i, n) in self.nodes.iter().enumerate() {
            for v in (0..self.sc.sizes.len()).filter(|&v| self.eio_told[i][v].is_some()) {
                let disk = n.engine.status().volumes[v].disk;
                let seen = primary
                    .peers
                    .iter()
                    .find(|p| p.id as usize == i)
                    .and_then(|p| p.volumes[v].disk);
                assert!(
                    self.detached[i][v]
                        && disk == DiskState::Diskless
                        && !(settled && seen == Some(DiskState::UpToDate)),
                    "seed {}: node {i} was given EIO for volume {v} but did not detach it (detached event: {}, disk {disk:?}, as the Primary sees it {seen:?})\n{}",
                    self.sc.seed,
                    self.detached[i][v],
                    self.tail_log(200)
                );
            }
        }
    }

    /// A failed replica lacks what was written after it failed: the Primary must know (its
    /// out-of-sync bits for it), or a replica repaired and brought back would be taken for
    /// current where it is not. With `converged` (the live replicas identical), precisely:
    /// the Primary has a bit set for every 4 KiB block in which the failed replica differs
    /// from them, failed writes included (seed 90004521: one whose only acknowledgement was
    /// lost with its link had landed on a live replica; soak seed 94003653: with protocol
    /// B, the refusal of a write overtook the acknowledgement of an older overlapping one).
    pub(crate) fn check_failed_known_behind(&self, converged: bool) {
        let primary = self.nodes[0].engine.status();
        for d in 1..self.nodes.len() {
            for v in 0..self.sc.sizes.len() {
                let Some(at) = self.failed_at[d][v] else {
                    continue;
                };
                // The engine hears of every failure when it happens (a failed sync ahead
                // too: `Resource::sync_failed`, soak seeds 94000749 and 94021068), so every
                // write submitted after it must be marked.
                let told = self.eio_told[d][v].unwrap_or(at);
                let since = at;
                let known = primary
                    .peers
                    .iter()
                    .find(|p| p.id as usize == d)
                    .map_or(0, |p| p.volumes[v].out_of_sync_bytes);
                let written = self
                    .writes
                    .iter()
                    .any(|w| w.ok && w.volume as usize == v && w.submitted > since);
                assert!(
                    !written || known > 0,
                    "seed {}: node {d}'s replica of volume {v} failed (at {at} µs, the engine told at {told} µs), volume {v} was written after, and the Primary does not know node {d} lacks it\n{}",
                    self.sc.seed,
                    self.tail_log(200)
                );
                let precise = converged;
                let Some(&good) = self.replicas_of(v).first().filter(|_| precise) else {
                    continue;
                };
                let (mine, theirs) = (
                    self.nodes[d].disk.volume(v),
                    self.nodes[good].disk.volume(v),
                );
                let differ = mine
                    .chunks(4096)
                    .zip(theirs.chunks(4096))
                    .filter(|(a, b)| a != b)
                    .count() as u64;
                assert!(
                    known >= differ * 4096,
                    "seed {}: node {d}'s failed replica of volume {v} differs from node {good}'s in {differ} blocks of 4 KiB, the Primary knows of {} (first at sector {:?})\n{}",
                    self.sc.seed,
                    known / 4096,
                    mine.chunks(SECTOR as usize)
                        .zip(theirs.chunks(SECTOR as usize))
                        .position(|(a, b)| a != b),
                    self.tail_log(200)
                );
            }
        }
    }
}
