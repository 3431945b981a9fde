//! A sync target's resync of one volume: what is left to pull, what is asked for, which
//! sectors the application wrote meanwhile, and how it waits when no peer can serve.

use super::bitmap::{Bitmap, BLOCK};
use super::generation::GenIds;
use super::nodeset::NodeSet;
use super::spec::NodeId;
use std::collections::BTreeMap;

/// How long a sync target waits before asking again peers that lacked what it needs,
/// at first and at most (see [`Resync::retry_ms`]).
const RESYNC_RETRY_MS: u64 = 20;
const RESYNC_RETRY_MAX_MS: u64 = 2_000;
pub(super) const SECTOR: u64 = 512;

#[derive(Debug)]
pub(super) struct Resync {
    /// The up-to-date peer we pull from.
    pub(super) source: Option<NodeId>,
    /// Ranges still to pull.
    pub(super) to_pull: Bitmap,
    pub(super) cursor: u64,
    pub(super) outstanding: BTreeMap<u64, (u64, u32)>,
    pub(super) writes_pending: usize,
    /// Sectors written by the application since the resync started (here as Primary, or
    /// replicated to us): current here, so resync data (possibly read before that write
    /// reached the source) must not overwrite them.
    pub(super) fresh: Bitmap,
    /// Fresh sectors whose writer is gone: the Primary that wrote them here lost its
    /// connection to us, or our own tenure as Primary ended (`writer_gone`). No later
    /// write of that run can come, and one that was not acknowledged may be on no other
    /// replica: a list naming the range after that may void their protection (`listed`).
    pub(super) fresh_orphan: Option<Bitmap>,
    /// Each writer of `fresh_orphan`: a list voids the orphans' protection only from a
    /// lister that holds what they all wrote (see `OrphanWriter`).
    pub(super) orphan_writers: Vec<OrphanWriter>,
    /// Peers that started listing what we lack and have not ended their list: until they
    /// do, we do not know all we lack.
    pub(super) lists_open: Vec<NodeId>,
    /// Everything is pulled; the final flush runs.
    pub(super) finishing: bool,
    /// Peers that lacked a range we asked for, not asked again before `retry_at_ms`.
    pub(super) refused: Vec<NodeId>,
    pub(super) retry_at_ms: u64,
    /// Wait before asking again: doubles while every peer keeps refusing (no replica
    /// within reach has the data: a steady state until a current one returns, which must
    /// not cost a request every few milliseconds), back to the minimum once data arrives.
    pub(super) retry_ms: u64,
    /// No up-to-date replica is within reach and every peer asked lacked the data: said
    /// once in the log, until data arrives again.
    pub(super) stalled: bool,
    /// The wait for a replica newer than the up-to-date ones within reach was logged
    /// (`Event::ResyncWaitsForNewer`), once until data arrives again.
    pub(super) waits_for_newer: bool,
    /// Only live notices (not a list after a connect) made this resync: a routine
    /// catch-up, logged as detail.
    pub(super) live: bool,
    /// Bytes received from sources so far.
    pub(super) pulled: u64,
    /// Blocks some peer listed (or told live) that we lack: known missing, not merely
    /// suspect.
    pub(super) named: Bitmap,
    /// How fast it may pull (see `pace.rs`).
    pub(super) pace: super::pace::Pace,
    /// We were up to date under this connection of the Primary (its list to us ended)
    /// when its live notice began this resync: outside `to_pull`, we hold every write it
    /// completed (see `Replicas::current_but_for`).
    pub(super) current_under: Option<(NodeId, u32)>,
    /// A split brain's verdict made us its victim and this the pull of what we discard
    /// from the survivor: at its end we take the survivor's generation ids.
    pub(super) after_split_brain: Option<NodeId>,
    /// The Primary whose list to us had ended stepped down while we pulled: that
    /// connection of it, and its ids then. Our list was a Primary's (everything its tenure
    /// wrote that we lacked), and no write came after: at the end we hold its data, so
    /// its ids, if it still holds them and we pulled from it (see `Replicas::resync_finished`).
    pub(super) listed_by_demoted: Option<DemotedLister>,
    /// The ids a Primary whose list to us had ended rotated to while we pulled, which we
    /// could not adopt (not up to date) though we take every write it makes under them:
    /// taken at our end if no Primary lists us by then (`Replicas::take_writer_ids`).
    pub(super) writer_ids: Option<GenIds>,
    /// The administrator invalidated our replica (`tandem invalidate`): everything is
    /// pulled from a source the operator trusts, whatever its ids.
    pub(super) invalidated: bool,
}

/// A writer of orphaned fresh sectors (see `Resync::writer_gone`).
#[derive(Clone, Copy, Debug)]
pub(super) struct OrphanWriter {
    /// Its current id when it went, with the id before it (0 if none): a lister whose
    /// lineage holds the first holds what it wrote.
    pub(super) ids: (u64, u64),
    /// The Primary's run (node, incarnation); `None` for our own tenure.
    pub(super) run: Option<(NodeId, u64)>,
    /// Peers that received every write of that run we did (their `PrimaryLost` named a
    /// last write no earlier than ours), whatever their ids say.
    pub(super) held_by: NodeSet,
}

/// A Primary whose list to us had ended when it stepped down: on which connection, and
/// the ids it stepped down with.
#[derive(Clone, Copy, Debug)]
pub(super) struct DemotedLister {
    pub(super) node: NodeId,
    pub(super) conn: u32,
    pub(super) gen: GenIds,
}

impl Resync {
    /// Never more requests out than the window; its bitmaps fit the volume.
    pub(super) fn check(&self, size: u64, window: usize) -> Result<(), String> {
        if self.outstanding.len() > window {
            return Err(format!(
                "{} requests outstanding, window {window}",
                self.outstanding.len()
            ));
        }
        self.to_pull
            .check(size)
            .and_then(|()| self.fresh.check(size))
            .and_then(|()| self.pace.check())
    }

    pub(super) fn new(size: u64, live: bool) -> Resync {
        Resync {
            source: None,
            to_pull: Bitmap::new(size),
            cursor: 0,
            outstanding: BTreeMap::new(),
            writes_pending: 0,
            fresh: Bitmap::with_block(size, SECTOR),
            fresh_orphan: None,
            orphan_writers: Vec::new(),
            lists_open: Vec::new(),
            finishing: false,
            refused: Vec::new(),
            retry_at_ms: 0,
            retry_ms: RESYNC_RETRY_MS,
            stalled: false,
            waits_for_newer: false,
            live,
            pulled: 0,
            named: Bitmap::new(size),
            pace: Default::default(),
            current_under: None,
            after_split_brain: None,
            listed_by_demoted: None,
            writer_ids: None,
            invalidated: false,
        }
    }

    /// Bytes still to pull. A range asked for may be listed again (a newer write at the
    /// source) while its reply is on the way: counted once.
    pub(super) fn remaining(&self) -> u64 {
        self.to_pull.count() * self.to_pull.block_size()
            + self
                .outstanding
                .values()
                .map(|&(o, l)| self.to_pull.bytes_clear_in(o, u64::from(l)))
                .sum::<u64>()
    }

    /// Nothing left to learn, pull or write: every list that started has ended, and no
    /// request or write is outstanding. (The caller also checks that every connected
    /// peer has listed.)
    pub(super) fn drained(&self) -> bool {
        self.lists_open.is_empty()
            && self.to_pull.count() == 0
            && self.outstanding.is_empty()
            && self.writes_pending == 0
    }

    /// This replica holds current data for the range, as far as the lists heard tell.
    pub(super) fn holds(&self, offset: u64, len: u64) -> bool {
        self.lists_open.is_empty()
            && !self.to_pull.any_in(offset, len)
            && !self
                .outstanding
                .values()
                .any(|&(o, l)| o < offset + len && offset < o + u64::from(l))
    }

    /// The next range to ask for, at most `chunk_blocks` blocks from the cursor on
    /// (wrapping once), taken off `to_pull` and recorded as outstanding under `id`.
    pub(super) fn take_next(
        &mut self,
        id: u64,
        size: u64,
        chunk_blocks: u64,
    ) -> Option<(u64, u32)> {
        let first = self
            .to_pull
            .next_set(self.cursor)
            .or_else(|| self.to_pull.next_set(0))?;
        let blocks = size.div_ceil(BLOCK);
        let mut end = first + 1;
        while end < blocks && end - first < chunk_blocks && self.to_pull.is_set(end) {
            end += 1;
        }
        let offset = first * BLOCK;
        let len = ((end - first) * BLOCK).min(size - offset) as u32;
        self.to_pull.clear_range(offset, u64::from(len));
        self.cursor = end;
        self.outstanding.insert(id, (offset, len));
        Some((offset, len))
    }

    /// `peer` lacks the range it was asked for: pull it again, from another peer or from
    /// it later; the wait before asking it again doubles while every peer refuses.
    pub(super) fn refused_by(&mut self, peer: NodeId, offset: u64, len: u32, now_ms: u64) {
        self.to_pull.set_range(offset, u64::from(len));
        // Not the blocks written whole here while it was asked for (`written_whole`).
        self.written_whole(offset, u64::from(len));
        self.cursor = self.cursor.min(offset / BLOCK);
        if !self.refused.contains(&peer) {
            self.refused.push(peer);
        }
        self.retry_at_ms = now_ms + self.retry_ms;
        self.retry_ms = (self.retry_ms * 2).min(RESYNC_RETRY_MAX_MS);
        if self.outstanding.is_empty() {
            self.source = None;
        }
    }

    /// `peer`'s disk state changed: it may have what it lacked, ask it again soon.
    pub(super) fn peer_changed(&mut self, peer: NodeId) {
        self.refused.retain(|&r| r != peer);
        self.retry_ms = RESYNC_RETRY_MS;
    }

    /// Nothing is asked of a source and something is left to pull: the resync waits.
    pub(super) fn waiting(&self) -> bool {
        self.source.is_none() && self.outstanding.is_empty() && self.to_pull.count() > 0
    }

    /// Data arrived: the full pace again. True if it ends a wait that was logged.
    pub(super) fn data_arrived(&mut self) -> bool {
        self.retry_ms = RESYNC_RETRY_MS;
        let waited = std::mem::take(&mut self.waits_for_newer);
        std::mem::take(&mut self.stalled) || waited
    }

    /// Requests in flight at once: the window, or a single probe while no peer within
    /// reach has what we lack.
    pub(super) fn window(&self, full: usize) -> usize {
        if self.stalled {
            1
        } else {
            full
        }
    }

    /// A peer lists this range as lacking here (`live`: a write we missed on a running
    /// connection, not a list after a connect). `protect`: the lister is the Primary,
    /// with the ranges it wrote here on this connection before its list. `claimed`: what
    /// we claim the lister lacks; `lister_gen`: its generation ids.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn listed(
        &mut self,
        lister: NodeId,
        offset: u64,
        len: u64,
        live: bool,
        protect: Option<&[(u64, u64)]>,
        claimed: Option<&Bitmap>,
        lister_gen: Option<&GenIds>,
    ) {
        self.live &= live;
        if let (None, Some(gen)) = (protect, lister_gen) {
            // A live notice names a write we missed, not the lister's lineage: only its
            // record of the writer's run counts then (see `OrphanWriter::held_by`).
            self.orphan_listed(lister, offset, len, claimed, (!live).then_some(gen));
        }
        if !self.lists_open.contains(&lister) {
            self.lists_open.push(lister);
        }
        if let Some(written) = protect {
            // Sectors the application wrote here during the resync are protected from
            // older resync data. A range the Primary lists again holds writes we missed
            // after those (our link to it dropped and came back), so the protection is
            // void there, except for what it wrote on this connection: those writes are
            // newer than whatever its list is about, even when they came before the list
            // (simulator seed 2021338: the list waited for writes in flight, a new write
            // went out first, and a resync from a replica cut off from the Primary
            // overwrote it).
            self.fresh.clear_range(offset, len);
            for &(o, l) in written {
                let (a, b) = (o.max(offset), (o + l).min(offset + len));
                if a < b {
                    self.fresh.set_range(a, b - a);
                }
            }
        }
        self.named_to_pull(offset, len);
    }

    /// `offset..+len` is known missing here (named by a peer, or ours to pull back): pulled
    /// again, the cursor back to it.
    fn named_to_pull(&mut self, offset: u64, len: u64) {
        self.to_pull.set_range(offset, len);
        self.named.set_range(offset, len);
        self.cursor = self.cursor.min(offset / BLOCK);
    }

    /// Our own writes on `offset..+len`, as a Primary demoted without quorum, may be on no
    /// other replica, and a majority may have written there since: no longer newer than
    /// what a source serves, they are pulled again (see `Replicas::left_without_quorum`).
    pub(super) fn pull_back(&mut self, offset: u64, len: u64) {
        self.fresh.clear_range(offset, len);
        if let Some(orphan) = self.fresh_orphan.as_mut() {
            orphan.clear_range(offset, len);
        }
        self.named_to_pull(offset, len);
    }

    /// The application wrote `offset..+len` here during the resync: its sectors are fresh
    /// (see `written_whole` for what that returns).
    pub(super) fn wrote(&mut self, offset: u64, len: u64) -> bool {
        self.fresh.set_range(offset, len);
        if let Some(orphan) = self.fresh_orphan.as_mut() {
            orphan.clear_range(offset, len);
        }
        self.written_whole(offset, len)
    }

    /// The writer of our fresh sectors is gone (the Primary's connection to us ended, or
    /// our tenure as Primary), its current id then `gen`: they are orphans, protected
    /// until a list from a replica holding that id names them (`orphan_listed`).
    ///
    /// A writer that wrote none of them (every fresh sector already an orphan) adds no
    /// ids: the lister need not hold them (failover soak seed 414007734: a Primary that
    /// wrote nothing here went with ids set back, no lister ever held them, and an
    /// orphan of an older run kept out a later acknowledged write to the same sector).
    pub(super) fn writer_gone(&mut self, gen: &GenIds, run: Option<(NodeId, u64)>) {
        if self.fresh.count() == 0 {
            return;
        }
        let wrote_some = (self.fresh_orphan.as_ref()).is_none_or(|o| !self.fresh.within(o));
        let ids = (gen.current, gen.history[0]);
        let known = |o: &OrphanWriter| o.ids == ids && o.run == run;
        if wrote_some && !self.orphan_writers.iter().any(known) {
            self.orphan_writers.push(OrphanWriter {
                ids,
                run,
                held_by: NodeSet::EMPTY,
            });
        }
        let fresh = &self.fresh;
        self.fresh_orphan
            .get_or_insert_with(|| fresh.cleared())
            .union_with(fresh);
    }

    /// A peer lists this range, not as the Primary, and holds what every writer of our
    /// orphaned fresh sectors wrote: its ids (`gen`, of a list after a connect, not a live
    /// notice) hold the id each had when it went, or newer ones, or it told us a last write
    /// of that writer's run no earlier than ours (`OrphanWriter::held_by`). Those sectors
    /// are no longer newer than what the lister serves. That writer completes nothing more;
    /// a write of it that missed the lister and succeeded rotated the writer's ids first
    /// (the rotation waits for our `GenAck` while we are connected, so we heard the newer
    /// id), leaving the lister's older; one that failed may be on us alone (either content
    /// is right, but the replicas must agree: the lister's is the range's now). Not where
    /// we claim the lister lacks the block (`claimed`): it is behind there. Kept, they
    /// outlived the resync and the replicas stayed different (failover seeds 124, 132, 162,
    /// 223, 294: a write of a Primary killed or demoted before it answered landed on a sync
    /// target, and the replica that later won the contest, which lacked it, listed the
    /// range; the target took every other sector of the block from it and kept the dead
    /// Primary's). Why the ids: with a rule that also listed more to older peers, failover
    /// seed 262 lost an acknowledged write held by the dead Primary and the sync target
    /// alone, listed by a replica current with ids older than that Primary's.
    pub(super) fn orphan_listed(
        &mut self,
        lister: NodeId,
        offset: u64,
        len: u64,
        claimed: Option<&Bitmap>,
        gen: Option<&GenIds>,
    ) {
        let holds = |o: &OrphanWriter| {
            let gi = o.ids.0;
            let by_ids = |g: &GenIds| gi == 0 || gi == g.current || g.history.contains(&gi);
            o.held_by.contains(lister) || gen.is_some_and(by_ids)
        };
        if !self.orphan_writers.iter().all(holds) {
            return;
        }
        let Some(orphan) = self.fresh_orphan.as_mut() else {
            return;
        };
        let end = (offset + len).div_ceil(SECTOR);
        let mut from = offset / SECTOR;
        while let Some(s) = orphan.next_set(from).filter(|&s| s < end) {
            from = s + 1;
            let at = s * SECTOR;
            if claimed.is_some_and(|c| c.is_set(at / c.block_size())) {
                continue;
            }
            self.fresh.clear_range(at, SECTOR);
            orphan.clear_range(at, SECTOR);
        }
    }

    /// `peer` received every write of `run` we did (see `OrphanWriter::held_by`).
    pub(super) fn run_held_by(&mut self, run: (NodeId, u64), peer: NodeId) {
        for o in self
            .orphan_writers
            .iter_mut()
            .filter(|o| o.run == Some(run))
        {
            o.held_by.insert(peer);
        }
    }

    /// Our connection to `peer` ended: what it held, a crash of it may have lost since.
    pub(super) fn holder_gone(&mut self, peer: NodeId) {
        for o in &mut self.orphan_writers {
            o.held_by.remove(peer);
        }
    }

    /// A live notice relays a write of a Primary we do not reach to this range: it was
    /// sent after that Primary's link to us ended (it went to the lister, not to us), so
    /// our fresh sectors there, written by that Primary before or by an older one, are
    /// older than what the lister serves (failover seed 406006296: a sync target kept
    /// the sectors a Primary had written to it before their link dropped against the
    /// reply holding that Primary's later write, acknowledged with the lister, and lost
    /// it).
    pub(super) fn relayed_newer(&mut self, offset: u64, len: u64) {
        self.fresh.clear_range(offset, len);
        if let Some(orphan) = self.fresh_orphan.as_mut() {
            orphan.clear_range(offset, len);
        }
    }

    /// A peer tells us it crashed as Primary under `gi` before acknowledging anything
    /// there (`Msg::Abandoned`): orphans written under `gi` hold no acknowledged write,
    /// and a lister holding the id before it holds every write that writer acknowledged
    /// (one that missed such a lister would have waited for a rotation, and the writer
    /// would have acknowledged under the id rotated to). Failover CI seeds 124 and 132,
    /// once a crash set such ids back: the writer, back with the ids before, never held
    /// `gi` again, and neither did any lister; the orphans outlived the resync.
    /// Nor do ids rotated to under `gi` name any write we would hold at our end.
    pub(super) fn abandoned(&mut self, gi: u64) {
        if self.writer_ids.is_some_and(|g| g.current == gi) {
            self.writer_ids = None;
        }
        for o in &mut self.orphan_writers {
            if o.ids.0 == gi {
                o.ids = (o.ids.1, 0);
            }
        }
    }

    /// The application wrote `offset..+len` here during the resync (fresh sectors): a
    /// 4 KiB block still to pull whose every sector is fresh holds its newest data whole,
    /// and a reply would write none of it (`unwritten_parts`), so it leaves `to_pull`.
    /// Kept there, it needed a source that holds it: two sync targets, one holding the
    /// block whole from the Primary's write and lacking the blocks after it, the other
    /// the reverse, each refused the other's chunk for ever (overlapping seed 232031512).
    /// True if that left nothing to pull: the caller pumps, and the resync may end.
    pub(super) fn written_whole(&mut self, offset: u64, len: u64) -> bool {
        if self.to_pull.count() == 0 {
            return false;
        }
        let first = offset / BLOCK;
        let end = (offset + len).div_ceil(BLOCK);
        for k in first..end {
            let at = k * BLOCK;
            if self.to_pull.any_in(at, BLOCK) && self.fresh.bytes_clear_in(at, BLOCK) == 0 {
                self.to_pull.clear_range(at, BLOCK);
            }
        }
        self.to_pull.count() == 0
    }

    /// The sector ranges of a reply to write: those the application has not written
    /// since the resync began. Counted as writes pending.
    pub(super) fn unwritten_parts(&mut self, offset: u64, len: u32) -> Vec<(u64, u64)> {
        let end = offset + u64::from(len);
        let mut parts = Vec::new();
        let mut s = offset;
        while s < end {
            if self.fresh.is_set(s / SECTOR) {
                s += SECTOR;
                continue;
            }
            let mut e = s + SECTOR;
            while e < end && !self.fresh.is_set(e / SECTOR) {
                e += SECTOR;
            }
            parts.push((s, e));
            s = e;
        }
        self.writes_pending += parts.len();
        parts
    }

    /// The connection to `peer` dropped. If it was our source, what was asked of it and
    /// not answered is still missing: true then.
    pub(super) fn source_lost(&mut self, peer: NodeId) -> bool {
        if self.source != Some(peer) {
            return false;
        }
        for (_, (off, len)) in std::mem::take(&mut self.outstanding) {
            self.to_pull.set_range(off, u64::from(len));
        }
        self.source = None;
        true
    }

    /// `peer` reconnected. If its list was cut off, we cannot know all we lack: pull
    /// everything (true then).
    pub(super) fn list_cut(&mut self, peer: NodeId) -> bool {
        if !self.lists_open.contains(&peer) {
            return false;
        }
        self.lists_open.retain(|&n| n != peer);
        self.to_pull.set_all();
        true
    }
}
