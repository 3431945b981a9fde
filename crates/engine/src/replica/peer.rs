//! One peer as the engine sees it: its connection's state, and per volume what it has,
//! what it lacks (out-of-sync blocks) and where our list of that stands.

use super::acks::Received;
use super::action::RAction;
use super::bitmap::Bitmap;
use super::event::LinkLoss;
use super::generation::{GenIds, Standing};
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::spec::{NodeId, ResourceSpec};
use super::status::Repl;
use crate::io::ReqId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tandem_wire::packet::{DiskState, Role};

/// Claims on an away peer kept under a Primary's run (see `PeerVol::kept`).
#[derive(Clone, Debug)]
pub(super) struct KeptClaims {
    pub(super) run: super::run::PrimaryRun,
    /// Only these blocks (a crash's activity log), or every claim.
    pub(super) within: Option<Bitmap>,
}

/// Where our list of what a peer lacks stands, on the current connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListState {
    NotSent,
    /// Waiting for in-flight writes that missed the peer to mark their bits.
    Deferred,
    /// Sent and complete.
    Sent,
    /// Sent, but bits were added after it: they are not cleared when the peer reports
    /// UpToDate, and are listed again on the next connection.
    Stale,
}

#[derive(Debug)]
pub(super) struct PeerVol {
    pub(super) diskful: bool,
    /// Our list of what the peer lacks, on this connection.
    pub(super) list: ListState,
    /// The peer ended its list of what we lack, on this connection.
    pub(super) listed: bool,
    /// Ranges it wrote here (as Primary) on this connection before its list ended: newer
    /// than any resync data, even where its list then says a block is out of sync (see
    /// [`Resource::mark_behind`]).
    pub(super) written_before_list: Vec<(u64, u64)>,
    pub(super) disk: Option<DiskState>,
    /// It said its replica was created empty at start and has received nothing since.
    pub(super) created: bool,
    /// It said its replica was found at its start and has not been UpToDate since.
    pub(super) unproven: bool,
    /// It said it came back from a crash knowing its suspect ranges and pulls them itself
    /// ([`volume_flags::PULLS_SUSPECT`]): listed only what it missed, not everything.
    pub(super) pulls_suspect: bool,
    pub(super) oos: Bitmap,
    /// Blocks we served it for its resync on this connection (taken out of `oos`): put
    /// back if the connection ends before it reports UpToDate, since the reply may have
    /// been lost with the link (soak seed 80087183: the source forgot blocks the target
    /// never received, and the target filled them from a replica cut off from the Primary).
    pub(super) served: Option<Bitmap>,
    pub(super) repl: Repl,
    /// We completed a write as Primary that it missed (it was away, or its link dropped),
    /// kept until its next list shows whether it was Primary apart from us too. A flag, not
    /// the blocks: which ones it lacks is `oos` (a diskful peer; a diskless one lacks
    /// none), and a bitmap of them cost a node as much memory again per peer away
    /// (BENCHMARKS.md, issue 14).
    pub(super) wrote_apart: bool,
    /// It said it wrote as Primary while apart from us ([`volume_flags::WROTE_APART`]).
    pub(super) peer_wrote_apart: bool,
    /// Blocks its list says we lack while we hold writes it lacks and one of us wrote as
    /// Primary apart from the other: recorded (in `sb`), not pulled, until its list ends
    /// (then it is a split brain); their count.
    pub(super) claimed: u64,
    /// A split brain with it on this connection: the blocks it claimed, the reports and
    /// the verdict (see `split_brain.rs`).
    pub(super) sb: Option<Box<super::split_brain::SbConn>>,
    /// Its generation ids, as it last told them (this connection or an earlier one).
    pub(super) gen: GenIds,
    /// It told us on this connection that it rotated from its ids as Primary and crashed
    /// before acknowledging under the new ones, with quorum (`Msg::Abandoned`; see
    /// `Standing`).
    pub(super) abandoned: bool,
    /// The id from which `oos` names all it may lack of ours, if any (see `bitmap_gi.rs`).
    pub(super) bitmap_gi: Option<u64>,
    /// It said resync data from a node other than us landed on its replica since it
    /// started ([`volume_flags::PULLED_ELSEWHERE`]): `bitmap_gi` does not cover it.
    pub(super) pulled_elsewhere: bool,
    /// It restarted consistent and is not settled: how it ranks (see `generation.rs`).
    pub(super) standing: Option<Standing>,
    /// Writes it alone may hold, unconfirmed when its link dropped (see
    /// `Replicas::sole_holder`): marked out of sync at its return only if it restarted
    /// since (it says so: no `volume_flags::MET_BEFORE`).
    pub(super) unconfirmed: Option<Bitmap>,
    /// Writes in flight to it, unanswered, when its link dropped: each then landed
    /// elsewhere (and marked it) or failed; it may or may not have written them (see
    /// `Replicas::unanswered_lost`).
    pub(super) unanswered: Option<Bitmap>,
    /// Diskful peers that were not sent one of the writes in `unanswered` (their links
    /// were down): this peer, if it received the write, told them live that they lack
    /// it (`Replicas::note_third_parties`), so none of them is where it pulls the range
    /// back from (see `Replicas::unanswered_lost`).
    pub(super) unanswered_missed: NodeSet,
    /// Blocks told it live on this connection (after our list) since its last UpToDate
    /// report: an UpToDate it sent before hearing them crosses them (see `synced` in
    /// `Replicas::peer_volume`).
    pub(super) told_live: Option<Bitmap>,
    /// Blocks told live before an UpToDate report that may have crossed them: kept out of
    /// sync until the answer to the ping we sent then (its number on this connection)
    /// shows whether it heard them first (`Replicas::settle_unsure`).
    pub(super) unsure: Option<(Bitmap, u64)>,
    /// Failed writes it holds and is to pull back from their reference, marked before our
    /// list to it on this connection: the list names them, but the peer keeps what we
    /// wrote it on this connection before its list ended; told live again after the list,
    /// which voids that (see `references_for_failed`).
    pub(super) pull_back: Option<Bitmap>,
    /// Ranges we claim it lacks from the connected Primary's own writes that did not go to
    /// it, received after that Primary's list to us ended (see `Replicas::primary_relays`).
    /// A capped list, not a bitmap: past the cap a claim is not recorded, and is yielded
    /// to newer ids as any other.
    pub(super) relayed: Option<Relayed>,
    /// Claims on it we kept while it was away from the Primary whose run vouched for what
    /// we lack (at our resync's end, `pull.rs`; at our crash settled by that run,
    /// `met_writer`): moot if it returns while that run is connected.
    pub(super) kept: Option<KeptClaims>,
    /// Those claims, out of our list since it returned while that run was connected: they
    /// go once it is UpToDate following that run's Primary (`Replicas::settle_held_claims`),
    /// and are listed if that Primary is gone first (`release_held_claims`).
    pub(super) held: Option<(super::run::PrimaryRun, Bitmap)>,
}

/// Claims relayed from one run of a connected Primary (its node and connection): sorted,
/// disjoint, block-aligned byte ranges `[start, end)`, at most `Relayed::CAP` of them.
#[derive(Debug)]
pub(super) struct Relayed {
    pub(super) node: NodeId,
    pub(super) conn: u32,
    pub(super) ranges: Vec<(u64, u64)>,
}

impl Relayed {
    /// At most this many ranges (16 bytes each: 16 KiB per peer and volume, whatever the
    /// volume's size). Adjacent and overlapping writes merge into one.
    pub(super) const CAP: usize = 1024;

    pub(super) fn new(node: NodeId, conn: u32) -> Relayed {
        Relayed {
            node,
            conn,
            ranges: Vec::new(),
        }
    }

    /// Records the blocks the byte range touches (as `Bitmap::set_range` marks them). Past
    /// the cap it is not recorded: that claim falls back to being yielded.
    pub(super) fn add(&mut self, offset: u64, len: u64, block: u64) {
        let start = offset / block * block;
        let end = (offset + len).div_ceil(block) * block;
        if start >= end {
            return;
        }
        // The ranges that touch or overlap [start, end) merge with it.
        let first = self.ranges.partition_point(|&(_, e)| e < start);
        let last = self.ranges.partition_point(|&(s, _)| s <= end);
        if first == last && self.ranges.len() >= Self::CAP {
            return;
        }
        let (mut s, mut e) = (start, end);
        if first < last {
            s = s.min(self.ranges[first].0);
            e = e.max(self.ranges[last - 1].1);
        }
        self.ranges.splice(first..last, [(s, e)]);
    }

    /// Forgets the blocks entirely inside the byte range (as `Bitmap::clear_range` clears
    /// them). A range it would split past the cap is forgotten whole.
    pub(super) fn remove(&mut self, offset: u64, len: u64, block: u64) {
        let start = offset.div_ceil(block) * block;
        let end = (offset + len) / block * block;
        if start >= end {
            return;
        }
        let first = self.ranges.partition_point(|&(_, e)| e <= start);
        let last = self.ranges.partition_point(|&(s, _)| s < end);
        if first == last {
            return;
        }
        let mut keep = Vec::with_capacity(2);
        if self.ranges[first].0 < start {
            keep.push((self.ranges[first].0, start));
        }
        if self.ranges[last - 1].1 > end {
            keep.push((end, self.ranges[last - 1].1));
        }
        if self.ranges.len() - (last - first) + keep.len() > Self::CAP {
            keep.clear();
        }
        self.ranges.splice(first..last, keep);
    }
}

impl PeerVol {
    /// Our claim that it lacks this byte range comes from a write of the Primary `run`
    /// (node, connection) received after that Primary's list to us ended (see
    /// `Replicas::primary_relays`).
    pub(super) fn relayed_by(&mut self, run: (NodeId, u32), offset: u64, len: u64) {
        let block = self.oos.block_size();
        if self
            .relayed
            .as_ref()
            .is_none_or(|r| (r.node, r.conn) != run)
        {
            self.relayed = Some(Relayed::new(run.0, run.1));
        }
        let relayed = self.relayed.as_mut().expect("set above");
        relayed.add(offset, len, block);
    }

    /// Its replica can vouch for a write of this range: it is up to date, and we do not
    /// know it to lack a block the write covers only in part. (A peer says UpToDate until
    /// it hears what it missed; one written there would hold the write's sectors and lack
    /// the block's others, and the replica holding those, away, would lack the write:
    /// overlapping seed 15630, the block's newest data split between two replicas.)
    pub(super) fn current_for(&self, offset: u64, len: u64) -> bool {
        self.diskful && self.disk == Some(DiskState::UpToDate) && !self.oos.any_partial(offset, len)
    }

    /// Its replica must be listed in full: it restarted without proof of being current
    /// (unproven: a crash, or no metadata), or it was created empty at its start. A replica
    /// back from a clean restart (Outdated, not unproven) kept what it knew: it is listed
    /// only what it missed.
    pub(super) fn needs_everything(&self) -> bool {
        let behind = matches!(
            self.disk,
            Some(DiskState::Outdated | DiskState::Inconsistent)
        );
        (self.unproven && !self.pulls_suspect && behind)
            || (self.created && self.disk == Some(DiskState::Inconsistent))
    }
}

/// A replicated write the peer has not confirmed written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unacked {
    pub(super) volume: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) sent_ms: u64,
    /// The application write it belongs to.
    pub(super) req: ReqId,
}

#[derive(Debug)]
pub(super) struct Peer {
    pub(super) id: NodeId,
    pub(super) up: bool,
    pub(super) role: Role,
    /// Its run, as its `Role` said (see [`Packet::Role`](tandem_wire::Packet::Role)).
    pub(super) incarnation: u64,
    /// Its `Role` arrived on this connection: until then `role` and `incarnation` may be
    /// an earlier connection's (see `settle.rs`, `connected_to`).
    pub(super) role_heard: bool,
    /// The Primaries it follows, as it told on this connection (see `primaries.rs`).
    pub(super) primaries: NodeSet,
    /// What we told it of ours on this connection (`None`: nothing yet).
    pub(super) primaries_told: Option<NodeSet>,
    /// Its first `Primaries` report on this connection arrived.
    pub(super) primaries_heard: bool,
    /// It told us it stopped cleanly, its replicas Outdated (`Msg::Leaving`), and has not
    /// connected since: a voter that may drop out of our quorum count (`quorum.rs`).
    pub(super) departed: bool,
    pub(super) vols: Vec<PeerVol>,
    // As sender: writes not yet confirmed written (the transfer log).
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// Writes whose protocol acknowledgement an application write waits for.
    pub(super) app_waiting: BTreeMap<u64, ReqId>,
    pub(super) barriers_out: BTreeMap<u64, u64>,
    pub(super) reads_out: BTreeMap<u64, ReqId>,
    /// Block statuses asked of it (`block_status.rs`).
    pub(super) allocs_out: BTreeMap<u64, ReqId>,
    // As receiver.
    pub(super) rx_pending: BTreeSet<u64>,
    /// Writes it sent us (as Primary) that it has not told settled (see `settle.rs`).
    pub(super) rx_unsettled: BTreeMap<u64, Received>,
    /// Counts connections: answers to requests of an earlier connection are not sent on a
    /// later one (the peer has forgotten them).
    pub(super) conn: u32,
    pub(super) rx_last_seq: u64,
    pub(super) barriers_in: VecDeque<(u64, u64)>,
    pub(super) last_rx_ms: u64,
    pub(super) ping_sent_ms: Option<u64>,
    /// Pings sent on this connection, and answers received (answered in order: answer
    /// `n` follows everything we sent before ping `n`).
    pub(super) pings: u64,
    pub(super) pongs: u64,
    /// We were Primary when the last connection to it ended (DRBD's older Primary in a
    /// split brain found at the next one).
    pub(super) primary_at_loss: bool,
    /// The administrator asked us to discard our data at the next split brain with it
    /// (`tandem connect --discard-my-data`): spent by that connection's verdict, or by
    /// the end of the first connection that follows on which every list ended.
    pub(super) discard_my_data: bool,
    /// `discard_my_data` was set before this connection came up.
    pub(super) discard_armed: bool,
}

impl PeerVol {
    pub(super) fn new(diskful: bool, size: u64) -> PeerVol {
        PeerVol {
            diskful,
            list: ListState::NotSent,
            listed: false,
            written_before_list: Vec::new(),
            disk: None,
            created: false,
            unproven: false,
            pulls_suspect: false,
            oos: Bitmap::new(size),
            served: None,
            repl: Repl::Off,
            wrote_apart: false,
            peer_wrote_apart: false,
            pulled_elsewhere: false,
            claimed: 0,
            sb: None,
            gen: GenIds::default(),
            abandoned: false,
            bitmap_gi: None,
            standing: None,
            unconfirmed: None,
            unanswered: None,
            unanswered_missed: NodeSet::EMPTY,
            told_live: None,
            unsure: None,
            pull_back: None,
            relayed: None,
            kept: None,
            held: None,
        }
    }

    /// What we knew of the peer's replica on a connection that ended.
    fn connection_ended(&mut self) {
        if let Some(served) = self.served.take() {
            self.oos.union_with(&served);
        }
        if let Some((run, held)) = self.held.take() {
            // Gone before it said whom it follows: kept as they were.
            self.oos.union_with(&held);
            self.kept = Some(KeptClaims {
                run,
                within: Some(held),
            });
        }
        self.disk = None;
        self.created = false;
        self.unproven = false;
        self.pulls_suspect = false;
        self.standing = None;
        self.repl = Repl::Off;
        self.listed = false;
        self.written_before_list.clear();
        self.list = ListState::NotSent;
        // Their bits stay: listed again on the next connection.
        self.told_live = None;
        self.unsure = None;
        // Listed on the next connection, where nothing is written before the list.
        self.pull_back = None;
    }

    /// A live notice of this range went to it (see `told_live`).
    pub(super) fn told(&mut self, offset: u64, len: u64) {
        self.told_live
            .get_or_insert_with(|| self.oos.cleared())
            .set_range(offset, len);
    }

    /// Our list of what it lacks, then its end (possibly an empty list): the peer then
    /// knows all we know it lacks.
    pub(super) fn send_list(&mut self, peer: NodeId, v: usize, size: u64, out: &mut Vec<RAction>) {
        // Blocks served on this connection before the list are listed too: the list is
        // what voids the peer's protection of sectors a Primary wrote it on an earlier
        // connection, which may have kept older ones than the served data (overlapping
        // soak seed 180025125: a target asked the Primary before its list came, kept a
        // sector from before its link dropped, and an acknowledged write was gone).
        match self.served.as_ref().filter(|s| s.count() > 0) {
            Some(served) => {
                let mut all = self.oos.clone();
                all.union_with(served);
                send_ranges(peer, v, &all, size, out);
            }
            None => send_ranges(peer, v, &self.oos, size, out),
        }
        let served = self.served.as_ref().is_some_and(|s| s.count() > 0);
        self.repl = if self.oos.count() > 0 || served {
            Repl::SyncSource
        } else {
            Repl::Established
        };
        self.list = ListState::Sent;
        // After its end: a live notice, so the peer's protection of what we wrote it
        // before the list is void there.
        if let Some(mut back) = self.pull_back.take() {
            back.intersect_with(&self.oos);
            if back.count() > 0 {
                self.told_live
                    .get_or_insert_with(|| back.cleared())
                    .union_with(&back);
                send_ranges(peer, v, &back, size, out);
            }
        }
    }

    /// The peer's list of what we lack ended. If both of us wrote as Primary apart from
    /// the other, that is a split brain: the blocks each side lacks (ours, theirs).
    pub(super) fn list_ended(&mut self) -> Result<(), (u64, u64)> {
        let decided = self.sb.as_ref().is_some_and(|sb| sb.verdict.is_some());
        if !decided && (self.claimed > 0 || (self.wrote_apart && self.peer_wrote_apart)) {
            // Ours: the blocks we know it lacks, as DRBD counts them for its
            // discard-least-changes policy (each side's bits set in its bitmap for the
            // other, sent at the handshake: `drbd_send_uuids` puts
            // `drbd_bm_total_weight` in `dirty_bits`, `drbd_asb_recover_0p` compares
            // them). That is what a resync from us would write over on it. A diskless
            // peer lacks none (it keeps no replica: DRBD holds no bitmap for it).
            return Err((self.oos.count(), self.claimed));
        }
        // Not both Primary apart: what we wrote without it is in its list now (diskful)
        // or needs no tracking (diskless).
        self.wrote_apart = false;
        self.listed = true;
        self.written_before_list = Vec::new();
        Ok(())
    }
}

/// Tells `peer` it lacks this range of volume `v`; `(0, 0)` ends a list.
impl Peer {
    /// It lacks this range of volume `v`: marked, and told at once (a live notice) if it
    /// has our list on this connection already (else the list names it).
    pub(super) fn lacks(&mut self, v: usize, offset: u64, len: u32, out: &mut Vec<RAction>) {
        let pv = &mut self.vols[v];
        if let Some(kept) = pv.kept.as_mut() {
            // A claim made now, from a later write it missed, is not one of those kept:
            // it stays when they go (`drop_kept_claims`). Dropped with them, it relied on
            // that run's Primary to list it, and one demoted without quorum forgets its
            // claims (failover soak seed 406002809: an acknowledged write lost).
            let within = kept.within.get_or_insert_with(|| pv.oos.clone());
            // Every block it touches (`clear_range` clears whole blocks only).
            let block = within.block_size();
            let start = offset / block * block;
            let end = (offset + u64::from(len)).div_ceil(block) * block;
            within.clear_range(start, end - start);
        }
        pv.oos.set_range(offset, u64::from(len));
        if self.up && matches!(pv.list, ListState::Sent | ListState::Stale) {
            pv.told(offset, u64::from(len));
            out.push(out_of_sync(self.id, v, offset, len));
            out.push(out_of_sync(self.id, v, 0, 0));
        }
    }
}

/// The blocks set in `bits` as out-of-sync notices, then their end (an empty one).
pub(super) fn send_ranges(
    peer: NodeId,
    v: usize,
    bits: &Bitmap,
    size: u64,
    out: &mut Vec<RAction>,
) {
    for (offset, len) in bits.runs(size, u64::from(tandem_wire::MAX_DATA)) {
        out.push(out_of_sync(peer, v, offset, len as u32));
    }
    out.push(out_of_sync(peer, v, 0, 0));
}

pub(super) fn out_of_sync(peer: NodeId, v: usize, offset: u64, len: u32) -> RAction {
    RAction::Send {
        peer,
        msg: Msg::OutOfSync {
            volume: v as u16,
            offset,
            len,
        },
    }
}

/// How a silent peer is judged: whether a busy peer may be silent longer than a ping.
///
/// A peer that owes us answers (a replicated write, a barrier, a read, a resync request, a
/// generation id) may be silent because its disk is slow or its process stalled: it is
/// judged by the request timeout, not by the ping timeout (its ping may go unanswered
/// that long), so a Secondary busy for less than `timeout` is not dropped. So is a link
/// between two nodes neither of which is Primary: no application request waits on it,
/// and what does is judged by the request timeout anyway. A link to or from the Primary
/// that carries nothing owed is judged by pings: a dead or cut-off peer is found within
/// `ping_interval + ping_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judge {
    /// A ping unanswered within the ping timeout drops the peer.
    Ping,
    /// A ping unanswered within the request timeout drops it.
    Timeout,
}

/// What a peer's timers ask for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Timer {
    Quiet,
    Ping,
    /// The connection is dead: why.
    Drop(LinkLoss),
}

impl Peer {
    /// Its run as a Primary: this incarnation of it (what a crash, a claim or a record
    /// of the writer is tied to).
    pub(super) fn run(&self) -> super::run::PrimaryRun {
        super::run::PrimaryRun {
            node: self.id,
            incarnation: self.incarnation,
        }
    }

    /// Nothing waits on a peer that is down; its bitmaps fit the volumes (`sizes`).
    pub(super) fn check(&self, sizes: &[u64]) -> Result<(), String> {
        if !self.up && (!self.unacked.is_empty() || !self.app_waiting.is_empty()) {
            return Err("down, but writes wait on it".into());
        }
        if !self.up && !self.rx_unsettled.is_empty() {
            return Err("down, but writes it sent are held unsettled".into());
        }
        if self.app_waiting.len() > self.unacked.len() {
            return Err("more writes wait on it than it has unacked".into());
        }
        for (v, (pv, &size)) in self.vols.iter().zip(sizes).enumerate() {
            pv.oos
                .check(size)
                .map_err(|e| format!("volume {v}: out-of-sync: {e}"))?;
        }
        Ok(())
    }

    pub(super) fn new(id: NodeId, diskful: &[bool], sizes: &[u64]) -> Peer {
        Peer {
            id,
            up: false,
            role: Role::Secondary,
            incarnation: 0,
            role_heard: false,
            primaries: NodeSet::EMPTY,
            primaries_told: None,
            primaries_heard: false,
            departed: false,
            vols: diskful
                .iter()
                .zip(sizes)
                .map(|(&d, &size)| PeerVol::new(d, size))
                .collect(),
            unacked: BTreeMap::new(),
            app_waiting: BTreeMap::new(),
            barriers_out: BTreeMap::new(),
            reads_out: BTreeMap::new(),
            allocs_out: BTreeMap::new(),
            rx_pending: BTreeSet::new(),
            rx_unsettled: BTreeMap::new(),
            conn: 0,
            rx_last_seq: 0,
            barriers_in: VecDeque::new(),
            last_rx_ms: 0,
            ping_sent_ms: None,
            pings: 0,
            pongs: 0,
            primary_at_loss: false,
            discard_my_data: false,
            discard_armed: false,
        }
    }

    /// A new connection: nothing known of the peer's replicas yet.
    pub(super) fn connected(&mut self, now_ms: u64) {
        self.up = true;
        self.conn = self.conn.wrapping_add(1);
        self.rx_pending.clear();
        self.role = Role::Secondary;
        self.role_heard = false;
        self.primaries = NodeSet::EMPTY;
        self.primaries_told = None;
        self.primaries_heard = false;
        self.departed = false;
        self.last_rx_ms = now_ms;
        self.ping_sent_ms = None;
        self.pings = 0;
        self.pongs = 0;
        self.rx_last_seq = 0;
        self.discard_armed = self.discard_my_data;
        for pv in &mut self.vols {
            pv.connection_ended();
            pv.peer_wrote_apart = false;
            pv.pulled_elsewhere = false;
            pv.claimed = 0;
            pv.sb = None;
            pv.abandoned = false;
        }
    }

    /// Per volume: its replica is being synced or waits to be (as it last told us), so
    /// its resync may end, under a Primary's list, with that Primary's ids adopted.
    pub(super) fn behind(&self) -> Vec<bool> {
        (self.vols.iter())
            .map(|pv| {
                pv.diskful && matches!(pv.disk, Some(DiskState::Inconsistent | DiskState::Outdated))
            })
            .collect()
    }

    /// The connection ended: what was waiting on it, for the caller to settle.
    pub(super) fn disconnected(&mut self) -> Orphans {
        self.up = false;
        self.role = Role::Secondary;
        self.role_heard = false;
        self.primaries = NodeSet::EMPTY;
        self.primaries_told = None;
        self.primaries_heard = false;
        let unacked = std::mem::take(&mut self.unacked);
        // Its lists all ended on this connection without a split brain: the flag was meant
        // for it. One that ended sooner (a second connection replaced at once when both
        // nodes dialed: the fresh-clone run of the cli test) leaves the flag for the next.
        let settled = self.vols.iter().all(|pv| pv.listed || !pv.diskful);
        for pv in &mut self.vols {
            pv.connection_ended();
        }
        if self.discard_armed && settled {
            self.discard_my_data = false;
            self.discard_armed = false;
        }
        self.barriers_in.clear();
        Orphans {
            unacked,
            app_waiting: std::mem::take(&mut self.app_waiting),
            barriers_out: std::mem::take(&mut self.barriers_out),
            reads_out: std::mem::take(&mut self.reads_out),
            allocs_out: std::mem::take(&mut self.allocs_out),
        }
    }

    /// When the oldest write it has not confirmed went out: writes take their seqs in the
    /// order they are sent, on a clock that never goes back, so it is the first (drivers
    /// ask at every wake-up, with a window of writes in flight).
    fn oldest_unacked_ms(&self) -> Option<u64> {
        let oldest = self.unacked.values().next().map(|u| u.sent_ms);
        debug_assert_eq!(oldest, self.unacked.values().map(|u| u.sent_ms).min());
        oldest
    }

    /// Answers it owes us that this room knows of: replicated writes not confirmed
    /// written, barriers, reads, block statuses (the caller adds resync requests and
    /// generation ids).
    pub(super) fn owes_answers(&self) -> bool {
        !self.unacked.is_empty()
            || !self.barriers_out.is_empty()
            || !self.reads_out.is_empty()
            || !self.allocs_out.is_empty()
    }

    /// When the ping outstanding (if any) is overdue, judged as `judge` says: its
    /// timeout counts from the later of its sending and the last packet heard (a busy
    /// peer may answer much else long after an old ping went, and a ping is answered in
    /// order with what the peer sends).
    fn ping_due(&self, spec: &ResourceSpec, judge: Judge) -> Option<u64> {
        let wait = match judge {
            Judge::Ping => spec.ping_timeout_ms,
            Judge::Timeout => spec.timeout_ms.max(spec.ping_timeout_ms),
        };
        (self.ping_sent_ms).map(|t| t.max(self.last_rx_ms) + wait)
    }

    /// The peer's timers at `now_ms`, judged as `judge` says (see [`Judge`]): a write it
    /// has not confirmed within the request timeout drops it (`WriteTimeout`); so does a
    /// ping unanswered within the ping timeout (`PingTimeout`) or, for a peer judged by
    /// the request timeout, within that (`Silent`). A ping goes after `ping_interval` of
    /// silence either way.
    pub(super) fn timer(&mut self, now_ms: u64, spec: &ResourceSpec, judge: Judge) -> Timer {
        let oldest = self.oldest_unacked_ms();
        if oldest.is_some_and(|t| now_ms.saturating_sub(t) > spec.timeout_ms) {
            return Timer::Drop(LinkLoss::WriteTimeout(spec.timeout_ms));
        }
        if self.ping_due(spec, judge).is_some_and(|due| now_ms > due) {
            return Timer::Drop(match judge {
                Judge::Ping => LinkLoss::PingTimeout(spec.ping_timeout_ms),
                Judge::Timeout => LinkLoss::Silent(spec.timeout_ms.max(spec.ping_timeout_ms)),
            });
        }
        if self.ping_sent_ms.is_none()
            && now_ms.saturating_sub(self.last_rx_ms) >= spec.ping_interval_ms
        {
            self.ping_sent_ms = Some(now_ms);
            self.pings += 1;
            return Timer::Ping;
        }
        Timer::Quiet
    }

    /// When [`timer`](Self::timer) next has something to do, judged as `judge` says.
    pub(super) fn next_timer(
        &self,
        spec: &ResourceSpec,
        judge: Judge,
    ) -> impl Iterator<Item = u64> {
        let unacked = self.oldest_unacked_ms().map(|t| t + spec.timeout_ms + 1);
        let ping = match self.ping_due(spec, judge) {
            Some(due) => due + 1,
            None => self.last_rx_ms + spec.ping_interval_ms,
        };
        unacked.into_iter().chain(std::iter::once(ping))
    }
}

/// What waited on a connection that ended.
pub(super) struct Orphans {
    pub(super) unacked: BTreeMap<u64, Unacked>,
    pub(super) app_waiting: BTreeMap<u64, ReqId>,
    pub(super) barriers_out: BTreeMap<u64, u64>,
    pub(super) reads_out: BTreeMap<u64, ReqId>,
    pub(super) allocs_out: BTreeMap<u64, ReqId>,
}

/// The peers of a resource, and what is asked of them together.
#[derive(Debug)]
pub(super) struct Peers(Vec<Peer>);

impl Peers {
    pub(super) fn new(peers: Vec<Peer>) -> Peers {
        Peers(peers)
    }

    pub(super) fn index(&self, id: NodeId) -> Option<usize> {
        self.0.iter().position(|p| p.id == id)
    }

    /// A node added while running (`Resource::add_peer`): last, so no index moves.
    pub(super) fn push(&mut self, peer: Peer) {
        debug_assert!(self.index(peer.id).is_none());
        self.0.push(peer);
    }

    pub(super) fn get(&self, id: NodeId) -> Option<&Peer> {
        self.0.iter().find(|p| p.id == id)
    }

    /// The connected peer `id`, on connection `conn`.
    pub(super) fn on_conn(&self, id: NodeId, conn: u32) -> Option<usize> {
        self.index(id)
            .filter(|&i| self.0[i].up && self.0[i].conn == conn)
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, Peer> {
        self.0.iter()
    }

    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Peer> {
        self.0.iter_mut()
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn up(&self) -> impl Iterator<Item = &Peer> {
        self.0.iter().filter(|p| p.up)
    }

    /// The connected Primary, if any.
    pub(super) fn primary(&self) -> Option<NodeId> {
        self.primary_peer().map(|p| p.id)
    }

    /// The connected peer that is Primary.
    pub(super) fn primary_peer(&self) -> Option<&Peer> {
        self.up().find(|p| p.role == Role::Primary)
    }

    /// The connected Primary, once its list of volume `v` to us has ended: from then on
    /// it sends us every write it completes.
    pub(super) fn primary_listed(&self, v: usize) -> Option<&Peer> {
        self.primary_peer().filter(|p| p.vols[v].listed)
    }

    /// A connected peer keeps an up-to-date replica of volume `v`.
    pub(super) fn up_to_date(&self, v: usize) -> bool {
        self.up_to_date_peers(v).next().is_some()
    }

    /// The connected peers keeping an up-to-date replica of volume `v`.
    pub(super) fn up_to_date_peers(&self, v: usize) -> impl Iterator<Item = &Peer> {
        self.up()
            .filter(move |p| p.vols[v].diskful && p.vols[v].disk == Some(DiskState::UpToDate))
    }

    /// Every connected peer has ended its list of what we lack in volume `v`.
    pub(super) fn all_listed(&self, v: usize) -> bool {
        self.0.iter().all(|p| !p.up || p.vols[v].listed)
    }

    pub(super) fn broadcast(&self, msg: Msg, out: &mut Vec<RAction>) {
        for p in self.up() {
            out.push(RAction::Send { peer: p.id, msg });
        }
    }
}

impl std::ops::Index<usize> for Peers {
    type Output = Peer;
    fn index(&self, i: usize) -> &Peer {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for Peers {
    fn index_mut(&mut self, i: usize) -> &mut Peer {
        &mut self.0[i]
    }
}

#[cfg(test)]
mod tests {
    use super::Relayed;

    const B: u64 = 4096;

    #[test]
    fn relayed_ranges_merge_split_and_stay_under_the_cap() {
        let mut r = Relayed::new(0, 1);
        r.add(3 * B + 100, 10, B);
        r.add(5 * B, 2 * B, B);
        assert_eq!(r.ranges, vec![(3 * B, 4 * B), (5 * B, 7 * B)]);
        r.add(4 * B, B, B);
        assert_eq!(r.ranges, vec![(3 * B, 7 * B)], "adjacent ranges merge");
        r.remove(4 * B + 1, 2 * B, B);
        assert_eq!(
            r.ranges,
            vec![(3 * B, 5 * B), (6 * B, 7 * B)],
            "whole blocks only"
        );
        r.remove(0, 10 * B, B);
        assert!(r.ranges.is_empty());
        // Three blocks at 0, then one block in every other up to the cap.
        r.add(0, 3 * B, B);
        for b in 2..Relayed::CAP as u64 + 10 {
            r.add(2 * b * B, B, B);
        }
        assert_eq!(r.ranges.len(), Relayed::CAP, "past the cap, not recorded");
        assert_eq!(r.ranges.last(), Some(&(2048 * B, 2049 * B)));
        r.add(3 * B, B, B);
        assert_eq!(r.ranges[0], (0, 5 * B), "a merge still records");
        assert_eq!(r.ranges.len(), Relayed::CAP - 1);
        r.add(1 << 40, B, B);
        assert_eq!(r.ranges.len(), Relayed::CAP);
        r.remove(2 * B, B, B);
        assert_eq!(
            r.ranges[0],
            (6 * B, 7 * B),
            "split past the cap: forgotten whole"
        );
        r.remove(6 * B, B, B);
        r.remove(0, B, B);
        assert_eq!(r.ranges[0], (8 * B, 9 * B));
    }
}
