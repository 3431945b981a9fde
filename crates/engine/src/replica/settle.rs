//! Peer acks (DRBD's `P_PEER_ACK`): when a replicated write is settled — written on every
//! replica it went to, or known to be missing on the ones that failed it or lost their link
//! first — and what a replica does with a Primary's writes that never settled.
//!
//! A receiving replica keeps a write's extents in its activity log until the Primary says
//! the write is settled ([`RAction::Settled`]): then, if every node crashes at once, every
//! write some replica may hold and another may lack is in the log of a replica that holds
//! it (simulator crash-family seed 2693: a write in flight at a cluster crash was on one
//! Secondary only, its log had let go of it once written, and nothing named the block).
//!
//! A Secondary that loses the Primary with writes not settled (the Primary died, or their
//! link did) keeps them as a [`LostPrimary`] and compares with every other diskful node
//! ([`Msg::PrimaryLost`]): writes reach the Secondaries in the Primary's order, so the one
//! that received the later last write holds every write the other holds and lists them to
//! it (seed 52: the Primary alone crashed with a write that had reached one Secondary; the
//! two Secondaries stayed UpToDate and different for ever). A node still connected to that
//! run of the Primary does not compare yet: the Primary knows what each lacks and its
//! lists settle it; it keeps the question and compares once it loses that run too.
//! Meeting that run again settles what was kept (`Role` names the run), and withdraws the
//! questions it asked, which by then name a stale last write. Whether
//! it is connected to that run a node knows once the Primary's node sent its `Role` on
//! their connection: a question asked before that waits for it (`answer_asked_lost`).

use super::acks::{LostAsked, LostPrimary, Received};
use super::action::RAction;
use super::msg::Msg;
use super::nodeset::NodeSet;
use super::replicas::Replicas;
use super::spec::NodeId;
use tandem_wire::packet::Role;

/// A `PrimaryLost` whose `seq` is this withdraws the question (`met_run_again`): no write
/// is numbered so.
const WITHDRAWN: u64 = u64::MAX;

/// The answer of a node that keeps nothing unsettled of `run`: the asker is the source.
fn nothing_kept((primary, incarnation): (NodeId, u64)) -> Msg {
    Msg::PrimaryLost {
        primary,
        incarnation,
        seq: 0,
    }
}

impl Replicas {
    /// A write from the Primary (peer `i`) that we apply: held until settled.
    pub(super) fn received(&mut self, i: usize, seq: u64, w: Received) {
        self.peers[i].rx_unsettled.insert(seq, w);
    }

    /// Peer `i` settled its writes up to `seq`; `missing` lack some of them.
    pub(super) fn on_peer_ack(
        &mut self,
        i: usize,
        seq: u64,
        missing: NodeSet,
        out: &mut Vec<RAction>,
    ) {
        let p = &mut self.peers[i];
        let (peer, conn) = (p.id, p.conn);
        // A hostile u64::MAX settles all but a write numbered u64::MAX (none is).
        let later = p.rx_unsettled.split_off(&seq.saturating_add(1));
        let settled = std::mem::replace(&mut p.rx_unsettled, later);
        if settled.is_empty() {
            return;
        }
        if !missing.is_empty() {
            for w in settled.values() {
                for x in missing.iter().filter(|&x| x != peer) {
                    self.mark_lacking(x, w, out);
                }
            }
        }
        out.push(RAction::Settled {
            peer,
            conn,
            upto: seq,
        });
    }

    /// Node `x` lacks this write: marked in its bitmap, and told at once if it has our list.
    /// Not if our replica of the volume is detached: it holds nothing, and its claim
    /// would leave the peer waiting for a source that cannot serve it (disk-errors seed
    /// 245032910: a Secondary whose disk failed the write marked the one replica holding
    /// it, from the Primary's peer ack naming both as missing it, and that replica, the
    /// only one left, turned Inconsistent with no source). A replica that holds the write
    /// marks the peer itself, and the Primary marks it where the write landed.
    fn mark_lacking(&mut self, x: NodeId, w: &Received, out: &mut Vec<RAction>) {
        let v = w.volume as usize;
        if !self.vols[v].attached() {
            return;
        }
        let Some(j) = self.peers.index(x) else {
            return; // ourselves
        };
        if self.peers[j].vols[v].diskful {
            self.peers[j].lacks(v, w.offset, w.len, out);
        }
    }

    /// The connection to peer `i` is ending: writes it sent us that it never settled are
    /// compared with the other Secondaries (see the module's comment).
    pub(super) fn primary_lost(&mut self, i: usize, out: &mut Vec<RAction>) {
        let p = &self.peers[i];
        let (primary, incarnation, conn, last) = (p.id, p.incarnation, p.conn, p.rx_last_seq);
        let asked = self.take_asked_early((primary, incarnation));
        let p = &mut self.peers[i];
        let writes: Vec<Received> = std::mem::take(&mut p.rx_unsettled).into_values().collect();
        if writes.is_empty() && p.role != Role::Primary {
            // Ours are settled: whoever asked holds every write we received that could
            // differ, as `answer_nothing_unsettled` says when not connected.
            for a in asked.into_iter().filter(|a| a.seq > 0) {
                let msg = nothing_kept(a.run);
                out.push(RAction::Send { peer: a.asker, msg });
            }
            return;
        }
        let open = self.comparable(primary);
        // Only its latest run can be met again.
        self.runs_asked.retain(|r| r.0 != primary);
        self.runs_asked.push((primary, incarnation));
        let k = self
            .lost
            .iter()
            .position(|l| (l.primary, l.incarnation) == (primary, incarnation));
        let k = match k {
            Some(k) => {
                let l = &mut self.lost[k];
                l.conns.push(conn);
                l.last = l.last.max(last);
                l.writes.extend(writes);
                l.open = open;
                k
            }
            None => {
                self.lost.push(LostPrimary {
                    primary,
                    incarnation,
                    conns: vec![conn],
                    last,
                    writes,
                    open,
                });
                self.lost.len() - 1
            }
        };
        if open.is_empty() {
            return self.lost.swap_remove(k).release(out);
        }
        let msg = self.lost[k].msg();
        for p in self.peers.up().filter(|p| open.contains(p.id)) {
            out.push(RAction::Send { peer: p.id, msg });
        }
        // Those who asked while we were still connected: our message above answers them,
        // and theirs, kept, answers us.
        for a in asked {
            self.compare_lost(a.asker, a.run, a.seq, out);
        }
    }

    /// The questions about `run` kept while we were connected to it, from askers still on
    /// the connection they asked on (one that ended asks again on its next).
    fn take_asked_early(&mut self, run: (NodeId, u64)) -> Vec<LostAsked> {
        if self.asked_early.is_empty() {
            return Vec::new();
        }
        let (asked, kept): (Vec<LostAsked>, _) = std::mem::take(&mut self.asked_early)
            .into_iter()
            .partition(|a| a.run == run);
        self.asked_early = kept;
        asked
            .into_iter()
            .filter(|a| {
                self.peers
                    .get(a.asker)
                    .is_some_and(|p| p.up && p.conn == a.conn)
            })
            .collect()
    }

    /// Every other diskful node but the Primary: those a lost Primary's writes are
    /// compared with.
    fn comparable(&self, primary: NodeId) -> NodeSet {
        let mut set = NodeSet::EMPTY;
        for p in self.peers.iter() {
            if p.id != primary && p.vols.iter().any(|pv| pv.diskful) {
                set.insert(p.id);
            }
        }
        set
    }

    /// A new connection to peer `i`: it hears of every Primary we lost and have not
    /// compared with it, before our `Volume` and so before either list.
    pub(super) fn tell_lost(&self, i: usize, out: &mut Vec<RAction>) {
        let peer = self.peers[i].id;
        for l in self.lost.iter().filter(|l| l.open.contains(peer)) {
            out.push(RAction::Send { peer, msg: l.msg() });
        }
    }

    /// Peer `i` told us its run (its `Role`): a Primary we lost in that run is alive and
    /// knows what each replica lacks of its writes, which settles ours.
    ///
    /// Those we asked hear that we withdraw the question, whether we compared with them
    /// or not: one still connected to that run kept it to compare when it loses the run
    /// too, and by then our last write of it is stale (cluster-crash seed 424: it marked
    /// us lacking every write it received after ours, which we had received too once back
    /// under the Primary, and the two claimed each other's blocks for ever; failover seed
    /// 151: the same with a peer we had compared with before it met the run again itself).
    pub(super) fn met_run_again(&mut self, i: usize, out: &mut Vec<RAction>) {
        let run = (self.peers[i].id, self.peers[i].incarnation);
        while let Some(k) = self
            .lost
            .iter()
            .position(|l| (l.primary, l.incarnation) == run)
        {
            self.lost.swap_remove(k).release(out);
        }
        if let Some(k) = self.runs_asked.iter().position(|&r| r == run) {
            self.runs_asked.swap_remove(k);
            let msg = Msg::PrimaryLost {
                primary: run.0,
                incarnation: run.1,
                seq: WITHDRAWN,
            };
            let asked = self.comparable(run.0);
            for p in self.peers.up().filter(|p| asked.contains(p.id)) {
                out.push(RAction::Send { peer: p.id, msg });
            }
        }
    }

    /// Peer `asker` met `run` again and withdraws its question: the Primary settles what
    /// it kept. Nothing is marked on either side: that Primary knows what each lacks, and
    /// compared, `WITHDRAWN` is past any write we kept.
    fn withdrawn(&mut self, asker: NodeId, run: (NodeId, u64), out: &mut Vec<RAction>) {
        let other = |a: &LostAsked| !(a.asker == asker && a.run == run);
        self.asked_early.retain(other);
        self.lost_asked.retain(other);
        self.compare_lost(asker, run, WITHDRAWN, out);
    }

    /// Peer `i` lost Primary `run.0` in its run `run.1`; the last write it received from
    /// it was `seq`.
    pub(super) fn on_primary_lost(
        &mut self,
        i: usize,
        run: (NodeId, u64),
        seq: u64,
        out: &mut Vec<RAction>,
    ) {
        let (asker, conn) = (self.peers[i].id, self.peers[i].conn);
        if seq == WITHDRAWN {
            return self.withdrawn(asker, run, out);
        }
        if !self.compare_lost(asker, run, seq, out) {
            let a = LostAsked {
                asker,
                conn,
                run,
                seq,
            };
            self.answer_nothing_unsettled(a, out);
        }
    }

    /// Compares what we kept of `run` with `peer`, whose last write of it was `seq`: the
    /// later holds every write the other holds, and marks them on it. False if we keep
    /// nothing of that run not yet compared with `peer`.
    fn compare_lost(
        &mut self,
        peer: NodeId,
        run: (NodeId, u64),
        seq: u64,
        out: &mut Vec<RAction>,
    ) -> bool {
        let Some(k) = self
            .lost
            .iter()
            .position(|l| (l.primary, l.incarnation) == run && l.open.contains(peer))
        else {
            return false;
        };
        let l = &mut self.lost[k];
        l.open.remove(peer);
        if l.last > seq {
            let writes = l.writes.clone();
            if !writes.is_empty() {
                self.claimed_from_lost_writes(out);
            }
            for w in &writes {
                self.mark_lacking(peer, w, out);
            }
        } else if seq != WITHDRAWN {
            self.run_held_by(run, peer);
        }
        if self.lost[k].open.is_empty() {
            self.lost.swap_remove(k).release(out);
        }
        true
    }

    /// Peer `peer` received every write of `run` we did (it told us a last write no
    /// earlier than ours): it holds that writer of our orphaned fresh sectors, whatever
    /// its ids (`Resync::orphan_listed`; failover seed 497002182: a sync target kept a
    /// dead Primary's zeroes, written during its resync, against the list of the
    /// Secondary that had received that Primary's later write there too; the lister,
    /// syncing as well, had not adopted the Primary's newest id, and the replicas stayed
    /// different).
    fn run_held_by(&mut self, run: (NodeId, u64), peer: NodeId) {
        for rs in self.vols.iter_mut().filter_map(|vol| vol.resync.as_mut()) {
            rs.run_held_by(run, peer);
        }
    }

    /// Our connection to `peer` ended: what it held of a run it told us on that
    /// connection, a crash of it may have lost since.
    pub(super) fn run_holder_gone(&mut self, peer: NodeId) {
        for rs in self.vols.iter_mut().filter_map(|vol| vol.resync.as_mut()) {
            rs.holder_gone(peer);
        }
    }

    /// A peer asked about `a.run`, of which we keep nothing unsettled. Still connected to
    /// that run of the Primary: it knows what each of us lacks, and we compare once we lose
    /// it too. Else the peer holds every write we received that could differ (ours are
    /// settled): it is the source, and a zero tells it so.
    ///
    /// Which of the two holds is known once the Primary's node told its run on its
    /// connection to us (its `Role`, the first thing it sends): until then the answer
    /// waits (`answer_asked_lost`). A zero sent before a `Role` naming that same run has
    /// the peer claim on us every write it kept, which that run, met again, settles
    /// without taking back the claims (overlapping soak seeds 204041558, 204040083: back
    /// from a crash, we answered while the Primary's `Role` was on its way; the claim on
    /// the only replica holding the blocks the asker lacked left both waiting for good).
    ///
    /// A question kept while we are connected is compared once we lose that run too
    /// (`primary_lost`): until then the asker's own record waits for ours, and ours must
    /// know its last write (the real-daemon test `ext4_survives_the_death_of_its_diskless_
    /// primary`: the Secondary that lost the Primary last, with the later writes, dropped
    /// the other's question and never listed them to it; the replicas differed).
    fn answer_nothing_unsettled(&mut self, a: LostAsked, out: &mut Vec<RAction>) {
        match self.connected_to(a.run) {
            Some(true) => {
                let same = |e: &LostAsked| e.asker == a.asker && e.run.0 == a.run.0;
                self.asked_early.retain(|e| !same(e));
                self.asked_early.push(a);
            }
            // A zero needs no answer.
            Some(false) if a.seq == 0 => {}
            Some(false) => {
                let msg = nothing_kept(a.run);
                out.push(RAction::Send { peer: a.asker, msg });
            }
            None if self.lost_asked.contains(&a) => {}
            None => self.lost_asked.push(a),
        }
    }

    /// Whether we are connected to `run` of a Primary; `None` while its node is connected
    /// but has not told its run on this connection yet (what we know of it may be an
    /// earlier connection's).
    fn connected_to(&self, run: (NodeId, u64)) -> Option<bool> {
        match self.peers.get(run.0) {
            Some(p) if p.up && !p.role_heard => None,
            Some(p) => Some(p.up && p.incarnation == run.1),
            None => Some(false),
        }
    }

    /// After every event: questions that waited for the Primary's node's `Role` are
    /// answered once it came (or its connection ended). One whose asker's connection ended
    /// is dropped: it asks again on the next.
    pub(super) fn answer_asked_lost(&mut self, out: &mut Vec<RAction>) {
        if self.lost_asked.is_empty() {
            return;
        }
        for a in std::mem::take(&mut self.lost_asked) {
            let asking = self
                .peers
                .get(a.asker)
                .is_some_and(|p| p.up && p.conn == a.conn);
            if asking {
                self.answer_nothing_unsettled(a, out);
            }
        }
    }

    /// Ranges of volume `v` written by a connected Primary and not settled yet.
    pub(super) fn received_unsettled(&self, v: usize) -> Vec<(u64, u64)> {
        (self.peers.iter().flat_map(|p| p.rx_unsettled.values()))
            .filter(|w| w.volume as usize == v)
            .map(|w| (w.offset, u64::from(w.len)))
            .collect()
    }

    /// Ranges of volume `v` whose writes are not settled here (held in the activity log).
    pub(super) fn unsettled(&self, v: usize) -> Vec<(u64, u64)> {
        let received = self.peers.iter().flat_map(|p| p.rx_unsettled.values());
        let lost = self.lost.iter().flat_map(|l| l.writes.iter());
        received
            .chain(lost)
            .filter(|w| w.volume as usize == v)
            .map(|w| (w.offset, u64::from(w.len)))
            .collect()
    }
}
