//! Split brain: two replicas of a volume each took writes as Primary while apart, so each
//! has changes the other lacks. This room holds the after-split-brain policies (DRBD's
//! `after-sb-0pri`, `after-sb-1pri`, `after-sb-2pri` and `--discard-my-data`), the pure
//! function that decides from both sides' facts, and what one connection knows of it.
//!
//! Both sides must reach the same verdict, or each would discard the other's changes (or
//! keep its own while the other pulls them). So each side sends exactly one report per
//! connection and volume — when it finds the split brain at the end of the peer's list, or
//! in answer to the peer's report — carrying its facts, and decides only once it holds
//! both reports, with [`decide`], which is symmetric in its two sides.
//!
//! A resolved split brain keeps the connection: the *victim* (a Secondary keeping a
//! replica) pulls from the *survivor* every block either changed apart (its own changes,
//! which it claimed the survivor lacks, and the survivor's, which the survivor's list
//! named), and takes the survivor's generation ids when that pull ends. The survivor
//! marks the victim as lacking both, never pulls from it, and takes what the victim lists
//! after the verdict as more the victim lacks.

use super::action::RAction;
use super::barriers::Barriers;
use super::bitmap::Bitmap;
use super::event::{DiskChange, Event};
use super::msg::Msg;
use super::replicas::Replicas;
use super::spec::NodeId;
use std::fmt;
use tandem_wire::packet::{split_brain_flags, DiskState, Role};

/// `after-sb-0pri`: neither node Primary when the split brain is found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AfterSb0Pri {
    #[default]
    Disconnect,
    /// The node that was not Primary when the two lost each other (promoted apart)
    /// discards; neither or both were: as `DiscardLeastChanges`.
    DiscardYoungerPrimary,
    /// The node that was Primary when the two lost each other discards; neither or both
    /// were: as `DiscardLeastChanges`.
    DiscardOlderPrimary,
    /// A node that changed nothing discards (both nothing: the higher node id); both
    /// changed blocks: disconnect.
    DiscardZeroChanges,
    /// The node with fewer changed blocks discards; a tie keeps the lower node id's data.
    DiscardLeastChanges,
}

/// `after-sb-1pri`: one of the two nodes Primary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AfterSb1Pri {
    #[default]
    Disconnect,
    /// The `after-sb-0pri` verdict if it discards the Secondary, else disconnect.
    Consensus,
    /// The Secondary discards.
    DiscardSecondary,
}

/// `after-sb-2pri`: both Primary. A Primary's data is never discarded under it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AfterSb2Pri {
    #[default]
    Disconnect,
}

/// The resource's after-split-brain policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AfterSplitBrain {
    pub zero: AfterSb0Pri,
    pub one: AfterSb1Pri,
    pub two: AfterSb2Pri,
}

/// Why `Resource::discard_my_data` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscardMyDataError {
    /// This node is Primary: demote it first.
    Primary,
    UnknownPeer(NodeId),
}

impl fmt::Display for DiscardMyDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscardMyDataError::Primary => f.write_str(
                "this node is Primary and a Primary never discards its data: demote first",
            ),
            DiscardMyDataError::UnknownPeer(p) => write!(f, "node {p} is not a peer"),
        }
    }
}

/// One side's facts, as its report tells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub node: NodeId,
    /// Blocks (4 KiB) it changed that the other lacks: what it would lose as victim.
    pub changed: u64,
    pub primary: bool,
    /// Primary when the two lost each other: DRBD's older Primary.
    pub was_primary: bool,
    pub discard_my_data: bool,
    /// It keeps no replica: nothing to discard, never a victim.
    pub diskless: bool,
    /// Its replica is UpToDate: only then can it be the survivor (the victim pulls from
    /// it; one being synced may be pulling from the other side itself).
    pub up_to_date: bool,
}

impl Report {
    pub(super) fn flags(&self) -> u8 {
        let mut f = 0;
        for (on, bit) in [
            (self.primary, split_brain_flags::PRIMARY),
            (self.was_primary, split_brain_flags::WAS_PRIMARY),
            (self.discard_my_data, split_brain_flags::DISCARD_MY_DATA),
            (self.diskless, split_brain_flags::DISKLESS),
            (!self.up_to_date, split_brain_flags::NOT_UP_TO_DATE),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }

    pub(super) fn from_packet(node: NodeId, changed: u64, flags: u8) -> Report {
        Report {
            node,
            changed,
            primary: flags & split_brain_flags::PRIMARY != 0,
            was_primary: flags & split_brain_flags::WAS_PRIMARY != 0,
            discard_my_data: flags & split_brain_flags::DISCARD_MY_DATA != 0,
            diskless: flags & split_brain_flags::DISKLESS != 0,
            up_to_date: flags & split_brain_flags::NOT_UP_TO_DATE == 0,
        }
    }
}

/// What decided a resolved split brain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SbPolicy {
    /// `tandem connect --discard-my-data` on the victim.
    DiscardMyData,
    ZeroPri(AfterSb0Pri),
    OnePri(AfterSb1Pri),
}

/// Why a split brain was left to the administrator (the connection stops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// The policy for this many Primaries is `disconnect`.
    Policy { primaries: u8 },
    /// `discard-zero-changes`, and both changed blocks.
    BothChanged,
    /// `consensus`: the `after-sb-0pri` verdict would discard the Primary (or none).
    NoConsensus,
    /// Both sides asked to discard their data.
    BothDiscardMyData,
    /// The policy named a Primary as victim: a Primary never discards its data (demote
    /// it first).
    VictimPrimary { victim: NodeId, policy: SbPolicy },
    /// The policy named a node keeping no replica: it has nothing to discard.
    VictimDiskless { victim: NodeId, policy: SbPolicy },
    /// The policy named a survivor whose replica is not UpToDate: nothing to pull from.
    SurvivorNotUpToDate { survivor: NodeId, policy: SbPolicy },
    /// Both replicas restarted and their generation ids diverged: found before any list,
    /// not resolved automatically.
    GenerationsDiverged,
    /// The connection ended after we found the split brain, before the peer's report
    /// came (it stopped the connection on its verdict, or died): as before policies,
    /// we keep our data and stop.
    NoVerdict,
}

/// The verdict on one split brain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Discard { victim: NodeId, policy: SbPolicy },
    Disconnect(Unresolved),
}

/// The verdict from both reports: the same whichever side is `a` (both sides call it).
pub fn decide(a: &Report, b: &Report, p: &AfterSplitBrain) -> Verdict {
    let (lo, hi) = if a.node < b.node { (a, b) } else { (b, a) };
    let named = match (lo.discard_my_data, hi.discard_my_data) {
        (true, true) => return Verdict::Disconnect(Unresolved::BothDiscardMyData),
        (true, false) => Some((lo.node, SbPolicy::DiscardMyData)),
        (false, true) => Some((hi.node, SbPolicy::DiscardMyData)),
        (false, false) => None,
    };
    let named = match named {
        Some(n) => n,
        None => match policy_victim(lo, hi, p) {
            Ok(n) => n,
            Err(why) => return Verdict::Disconnect(why),
        },
    };
    let (victim, policy) = named;
    let v = if victim == lo.node { lo } else { hi };
    if v.primary {
        return Verdict::Disconnect(Unresolved::VictimPrimary { victim, policy });
    }
    if v.diskless {
        return Verdict::Disconnect(Unresolved::VictimDiskless { victim, policy });
    }
    let s = if victim == lo.node { hi } else { lo };
    if !s.up_to_date {
        let survivor = s.node;
        return Verdict::Disconnect(Unresolved::SurvivorNotUpToDate { survivor, policy });
    }
    Verdict::Discard { victim, policy }
}

/// The victim the configured policy names; `lo` has the lower node id.
fn policy_victim(
    lo: &Report,
    hi: &Report,
    p: &AfterSplitBrain,
) -> Result<(NodeId, SbPolicy), Unresolved> {
    match (lo.primary, hi.primary) {
        (false, false) => zero_pri(lo, hi, p.zero)
            .map(|n| (n, SbPolicy::ZeroPri(p.zero)))
            .ok_or(match p.zero {
                AfterSb0Pri::DiscardZeroChanges => Unresolved::BothChanged,
                _ => Unresolved::Policy { primaries: 0 },
            }),
        (true, true) => match p.two {
            AfterSb2Pri::Disconnect => Err(Unresolved::Policy { primaries: 2 }),
        },
        (lo_primary, _) => {
            let secondary = if lo_primary { hi.node } else { lo.node };
            let policy = SbPolicy::OnePri(p.one);
            match p.one {
                AfterSb1Pri::Disconnect => Err(Unresolved::Policy { primaries: 1 }),
                AfterSb1Pri::DiscardSecondary => Ok((secondary, policy)),
                AfterSb1Pri::Consensus => match zero_pri(lo, hi, p.zero) {
                    Some(n) if n == secondary => Ok((n, policy)),
                    _ => Err(Unresolved::NoConsensus),
                },
            }
        }
    }
}

/// The victim `after-sb-0pri` names, if any.
fn zero_pri(lo: &Report, hi: &Report, p: AfterSb0Pri) -> Option<NodeId> {
    // Fewer changes discards; a tie keeps the lower node id's data.
    let least = || {
        if lo.changed < hi.changed {
            lo.node
        } else {
            hi.node
        }
    };
    match p {
        AfterSb0Pri::Disconnect => None,
        AfterSb0Pri::DiscardYoungerPrimary | AfterSb0Pri::DiscardOlderPrimary => {
            if lo.was_primary == hi.was_primary {
                return Some(least());
            }
            let older = if lo.was_primary { lo.node } else { hi.node };
            let younger = if lo.was_primary { hi.node } else { lo.node };
            Some(if p == AfterSb0Pri::DiscardOlderPrimary {
                older
            } else {
                younger
            })
        }
        AfterSb0Pri::DiscardZeroChanges => match (lo.changed, hi.changed) {
            (0, _) => Some(if hi.changed == 0 { hi.node } else { lo.node }),
            (_, 0) => Some(hi.node),
            _ => None,
        },
        AfterSb0Pri::DiscardLeastChanges => Some(least()),
    }
}

/// One connection's split brain on one volume, from our side (in `PeerVol::sb`).
#[derive(Debug)]
pub(super) struct SbConn {
    /// What the peer listed we lack while its changes and ours conflicted: its changes.
    pub(super) claimed: Bitmap,
    /// We found the split brain at the end of its list (else we answer its report).
    pub(super) found: bool,
    /// The end of the peer's list arrived (it is not marked `listed` until the verdict).
    pub(super) list_ended: bool,
    pub(super) sent: Option<Report>,
    pub(super) got: Option<Report>,
    pub(super) verdict: Option<Verdict>,
    /// As victim: the pull the verdict started has not ended.
    pub(super) pulling: bool,
}

impl SbConn {
    pub(super) fn new(size: u64) -> SbConn {
        SbConn {
            claimed: Bitmap::new(size),
            found: false,
            list_ended: false,
            sent: None,
            got: None,
            verdict: None,
            pulling: false,
        }
    }

    /// We are the survivor of a verdict on this connection.
    pub(super) fn survivor(&self, me: NodeId) -> bool {
        matches!(self.verdict, Some(Verdict::Discard { victim, .. }) if victim != me)
    }

    /// We are the victim of a verdict on this connection.
    pub(super) fn victim(&self, me: NodeId) -> bool {
        matches!(self.verdict, Some(Verdict::Discard { victim, .. }) if victim == me)
    }
}

impl Replicas {
    /// Our facts on volume `v` for peer `i`.
    fn report(&self, i: usize, v: usize) -> Report {
        let p = &self.peers[i];
        Report {
            node: self.spec.me,
            changed: p.vols[v].oos.count(),
            primary: self.role == Role::Primary,
            was_primary: p.primary_at_loss,
            discard_my_data: p.discard_my_data,
            diskless: !self.vols[v].diskful,
            up_to_date: self.vols[v].disk == DiskState::UpToDate,
        }
    }

    /// We found a split brain with peer `i` on `v` at the end of its list: report it,
    /// and decide if the peer's report came already.
    pub(super) fn split_brain_found(
        &mut self,
        b: &mut Barriers,
        i: usize,
        v: usize,
        out: &mut Vec<RAction>,
    ) {
        let size = self.vols[v].size;
        let sb = self.peers[i].vols[v]
            .sb
            .get_or_insert_with(|| Box::new(SbConn::new(size)));
        sb.found = true;
        sb.list_ended = true;
        self.send_report(i, v, out);
        self.decide_if_ready(b, i, v, out);
    }

    /// Both restarted with diverged generation ids: reported, and the connection stops
    /// (no list tells which blocks differ).
    pub(super) fn split_brain_diverged(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let size = self.vols[v].size;
        let sb = self.peers[i].vols[v]
            .sb
            .get_or_insert_with(|| Box::new(SbConn::new(size)));
        sb.found = true;
        sb.verdict = Some(Verdict::Disconnect(Unresolved::GenerationsDiverged));
        self.send_report(i, v, out);
        let mine = self.peers[i].vols[v].oos.count();
        out.push(RAction::SplitBrain {
            peer: self.peers[i].id,
            volume: v as u16,
            mine,
            theirs: 0,
            reported: false,
            why: Unresolved::GenerationsDiverged,
        });
    }

    /// The connection to peer `i` is ending: a split brain we found and reported that no
    /// verdict settled stops the connection (the peer may have stopped it on its verdict
    /// before our report reached it, or died).
    pub(super) fn split_brain_unsettled(&mut self, i: usize, out: &mut Vec<RAction>) {
        let peer = self.peers[i].id;
        for (v, pv) in self.peers[i].vols.iter().enumerate() {
            let Some(sb) = pv.sb.as_ref().filter(|sb| sb.found && sb.verdict.is_none()) else {
                continue;
            };
            out.push(RAction::SplitBrain {
                peer,
                volume: v as u16,
                mine: sb.sent.map_or(pv.oos.count(), |r| r.changed),
                theirs: sb.claimed.count(),
                reported: false,
                why: Unresolved::NoVerdict,
            });
        }
    }

    /// Our one report on this connection and volume.
    fn send_report(&mut self, i: usize, v: usize, out: &mut Vec<RAction>) {
        let report = self.report(i, v);
        let peer = self.peers[i].id;
        let sb = self.peers[i].vols[v]
            .sb
            .as_mut()
            .expect("split brain state");
        if sb.sent.is_some() {
            return;
        }
        sb.sent = Some(report);
        out.push(RAction::Send {
            peer,
            msg: Msg::SplitBrain {
                volume: v as u16,
                mine: report.changed,
                yours: sb.claimed.count(),
                flags: report.flags(),
            },
        });
    }

    /// Peer `i`'s report on `v`: answered with ours if we sent none, then decided.
    pub(super) fn on_split_brain_report(
        &mut self,
        b: &mut Barriers,
        i: usize,
        v: usize,
        changed: u64,
        flags: u8,
        out: &mut Vec<RAction>,
    ) {
        let size = self.vols[v].size;
        let report = Report::from_packet(self.peers[i].id, changed, flags);
        let sb = self.peers[i].vols[v]
            .sb
            .get_or_insert_with(|| Box::new(SbConn::new(size)));
        if sb.got.is_some() || sb.verdict.is_some() {
            // One report per connection; a verdict already reached (diverged ids) stands.
            return;
        }
        sb.got = Some(report);
        self.send_report(i, v, out);
        self.decide_if_ready(b, i, v, out);
    }

    fn decide_if_ready(&mut self, b: &mut Barriers, i: usize, v: usize, out: &mut Vec<RAction>) {
        let sb = self.peers[i].vols[v]
            .sb
            .as_ref()
            .expect("split brain state");
        let (Some(ours), Some(theirs), None) = (sb.sent, sb.got, sb.verdict) else {
            return;
        };
        let verdict = decide(&ours, &theirs, &self.spec.after_sb);
        let found = sb.found;
        let peer = self.peers[i].id;
        // The flag is spent on this connection's split brain, whatever the verdict.
        self.peers[i].discard_my_data = false;
        self.peers[i].vols[v].sb.as_mut().expect("checked").verdict = Some(verdict);
        match verdict {
            Verdict::Disconnect(why) => out.push(RAction::SplitBrain {
                peer,
                volume: v as u16,
                mine: ours.changed,
                theirs: theirs.changed,
                reported: !found,
                why,
            }),
            Verdict::Discard { victim, policy } if victim == self.spec.me => {
                self.discard_ours(b, i, v, policy, out)
            }
            Verdict::Discard { policy, .. } => self.keep_ours(b, i, v, policy, theirs, out),
        }
    }

    /// We are the victim: pull our changes and the survivor's from it.
    fn discard_ours(
        &mut self,
        b: &mut Barriers,
        i: usize,
        v: usize,
        policy: SbPolicy,
        out: &mut Vec<RAction>,
    ) {
        let me = self.spec.me;
        let (peer, size) = (self.peers[i].id, self.vols[v].size);
        let pv = &mut self.peers[i].vols[v];
        let sb = pv.sb.as_mut().expect("split brain state");
        let discarded = pv.oos.count();
        let mut pull = std::mem::replace(&mut pv.oos, Bitmap::new(size));
        pull.union_with(&sb.claimed);
        sb.claimed = Bitmap::new(size);
        sb.pulling = true;
        // Its list may have ended and been taken as usual (we had not found a conflict).
        let list_ended = sb.list_ended || pv.listed;
        pv.served = None;
        pv.wrote_apart = false;
        pv.peer_wrote_apart = false;
        pv.claimed = 0;
        out.push(RAction::Event(Event::SplitBrainResolved {
            peer,
            volume: v as u16,
            policy,
            victim: me,
            discarded_blocks: discarded,
            pulled_blocks: pull.count(),
        }));
        if self.vols[v].disk != DiskState::Inconsistent {
            let why = DiskChange::DiscardedAfterSplitBrain { survivor: peer };
            self.set_disk(v, DiskState::Inconsistent, why, out);
        }
        for (offset, len) in pull.runs(size, u64::MAX) {
            self.mark_behind(v, peer, offset, len, false, out);
        }
        let rs = self.resync_mut(v, false);
        rs.after_split_brain = Some(peer);
        if list_ended {
            // Its list ended before the verdict: nothing more of it is to come.
            rs.lists_open.retain(|&n| n != peer);
            self.peers[i].vols[v].listed = true;
            self.peers[i].vols[v].written_before_list = Vec::new();
        } else if !rs.lists_open.contains(&peer) {
            // Its list is still coming (it found the split brain first): the pull must
            // not end before it does (what it names we pull too).
            rs.lists_open.push(peer);
        }
        self.after_list(b, v, out);
    }

    /// We are the survivor: the victim lacks its changes and ours.
    fn keep_ours(
        &mut self,
        b: &mut Barriers,
        i: usize,
        v: usize,
        policy: SbPolicy,
        theirs: Report,
        out: &mut Vec<RAction>,
    ) {
        let (peer, size) = (self.peers[i].id, self.vols[v].size);
        let pv = &mut self.peers[i].vols[v];
        let sb = pv.sb.as_mut().expect("split brain state");
        let victims = std::mem::replace(&mut sb.claimed, Bitmap::new(size));
        let list_ended = sb.list_ended || pv.listed;
        let mut pull = pv.oos.clone();
        pull.union_with(&victims);
        pv.wrote_apart = false;
        pv.peer_wrote_apart = false;
        pv.claimed = 0;
        out.push(RAction::Event(Event::SplitBrainResolved {
            peer,
            volume: v as u16,
            policy,
            victim: peer,
            discarded_blocks: theirs.changed,
            pulled_blocks: pull.count(),
        }));
        for (offset, len) in victims.runs(size, u64::from(tandem_wire::MAX_DATA)) {
            self.peers[i].lacks(v, offset, len as u32, out);
        }
        if list_ended {
            self.peers[i].vols[v].listed = true;
            self.peers[i].vols[v].written_before_list = Vec::new();
            if let Some(rs) = self.vols[v].resync.as_mut() {
                rs.lists_open.retain(|&n| n != peer);
            }
        }
        self.after_list(b, v, out);
    }

    /// What follows the end of a peer's list (see `on_list_end`).
    fn after_list(&mut self, b: &mut Barriers, v: usize, out: &mut Vec<RAction>) {
        self.send_deferred_lists(v, out);
        self.pump_resync(b, v as u16, out);
        self.check_proven(v, out);
        self.check_gen_proven(v, out);
        self.adopt_from_primary(v, out);
    }

    /// Peer `i` lists that we lack this range of `v` while its changes and ours conflict
    /// (a split brain, or a verdict that made us the survivor): recorded, not pulled.
    /// Returns whether it was taken so.
    pub(super) fn split_brain_claim(
        &mut self,
        i: usize,
        v: usize,
        offset: u64,
        len: u32,
        out: &mut Vec<RAction>,
    ) -> bool {
        let me = self.spec.me;
        let pv = &mut self.peers[i].vols[v];
        if pv.listed {
            return false;
        }
        if pv.sb.as_ref().is_some_and(|sb| sb.survivor(me)) {
            // Its list, after the verdict: its changes, which it discards and pulls back.
            self.peers[i].lacks(v, offset, len, out);
            return true;
        }
        false
    }

    /// Records a conflicting claim of peer `i` on `v` (see `on_out_of_sync`).
    pub(super) fn record_claim(&mut self, i: usize, v: usize, offset: u64, len: u32) {
        let size = self.vols[v].size;
        let pv = &mut self.peers[i].vols[v];
        let sb = pv.sb.get_or_insert_with(|| Box::new(SbConn::new(size)));
        sb.claimed.set_range(offset, u64::from(len));
        pv.claimed = sb.claimed.count();
    }

    /// Our pull after a verdict that made us the victim ended.
    pub(super) fn split_brain_pulled(&mut self, v: usize, survivor: NodeId) {
        let me = self.spec.me;
        if let Some(i) = self.peers.index(survivor) {
            if let Some(sb) = self.peers[i].vols[v].sb.as_mut().filter(|sb| sb.victim(me)) {
                sb.pulling = false;
            }
        }
    }

    /// As victim, a pull not ended; as survivor, a pull from the victim: either is a bug.
    pub(super) fn check_split_brain(&self, v: usize) -> Result<(), String> {
        let me = self.spec.me;
        for p in self.peers.iter() {
            let Some(sb) = p.vols[v].sb.as_ref() else {
                continue;
            };
            if sb.victim(me) && sb.pulling && self.vols[v].disk == DiskState::UpToDate {
                return Err(format!(
                    "volume {v}: UpToDate as split-brain victim of node {} before its pull ended",
                    p.id
                ));
            }
            let from_victim = self.vols[v]
                .resync
                .as_ref()
                .is_some_and(|rs| rs.source == Some(p.id));
            if sb.survivor(me) && from_victim {
                return Err(format!(
                    "volume {v}: split-brain survivor pulling from its victim node {}",
                    p.id
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for SbPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SbPolicy::DiscardMyData => f.write_str("--discard-my-data"),
            SbPolicy::ZeroPri(p) => write!(f, "after-sb-0pri={}", p.name()),
            SbPolicy::OnePri(p) => write!(f, "after-sb-1pri={}", p.name()),
        }
    }
}

impl AfterSb0Pri {
    /// The configuration's name.
    pub fn name(self) -> &'static str {
        match self {
            AfterSb0Pri::Disconnect => "disconnect",
            AfterSb0Pri::DiscardYoungerPrimary => "discard-younger-primary",
            AfterSb0Pri::DiscardOlderPrimary => "discard-older-primary",
            AfterSb0Pri::DiscardZeroChanges => "discard-zero-changes",
            AfterSb0Pri::DiscardLeastChanges => "discard-least-changes",
        }
    }
}

impl AfterSb1Pri {
    /// The configuration's name.
    pub fn name(self) -> &'static str {
        match self {
            AfterSb1Pri::Disconnect => "disconnect",
            AfterSb1Pri::Consensus => "consensus",
            AfterSb1Pri::DiscardSecondary => "discard-secondary",
        }
    }
}

impl fmt::Display for Unresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unresolved::Policy { primaries } => {
                write!(f, "after-sb-{primaries}pri is disconnect")
            }
            Unresolved::BothChanged => {
                f.write_str("after-sb-0pri=discard-zero-changes, and both nodes changed blocks")
            }
            Unresolved::NoConsensus => f.write_str(
                "after-sb-1pri=consensus, and after-sb-0pri would not discard the Secondary's changes",
            ),
            Unresolved::BothDiscardMyData => {
                f.write_str("both nodes asked to discard their data (--discard-my-data)")
            }
            Unresolved::VictimPrimary { victim, policy } => write!(
                f,
                "{policy} would discard node {victim}'s changes, but it is Primary (demote it first)"
            ),
            Unresolved::VictimDiskless { victim, policy } => write!(
                f,
                "{policy} would discard node {victim}'s changes, but it keeps no replica"
            ),
            Unresolved::SurvivorNotUpToDate { survivor, policy } => write!(
                f,
                "{policy} would keep node {survivor}'s data, but its replica is not UpToDate"
            ),
            Unresolved::NoVerdict => f.write_str(
                "the connection ended before the peer's split-brain report came",
            ),
            Unresolved::GenerationsDiverged => f.write_str(
                "both replicas restarted with diverged generation ids (not resolved automatically)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(node: NodeId, changed: u64) -> Report {
        Report {
            node,
            changed,
            primary: false,
            was_primary: false,
            discard_my_data: false,
            diskless: false,
            up_to_date: true,
        }
    }

    fn both(a: Report, b: Report, p: AfterSplitBrain) -> Verdict {
        let v = decide(&a, &b, &p);
        assert_eq!(v, decide(&b, &a, &p), "the same verdict from either side");
        v
    }

    fn zero(p: AfterSb0Pri) -> AfterSplitBrain {
        AfterSplitBrain {
            zero: p,
            ..Default::default()
        }
    }

    fn victim(v: Verdict) -> Option<NodeId> {
        match v {
            Verdict::Discard { victim, .. } => Some(victim),
            Verdict::Disconnect(_) => None,
        }
    }

    #[test]
    fn least_changes_discards_fewer_and_a_tie_keeps_the_lower_node_id() {
        let p = zero(AfterSb0Pri::DiscardLeastChanges);
        assert_eq!(victim(both(r(0, 3), r(1, 5), p)), Some(0));
        assert_eq!(victim(both(r(0, 5), r(1, 3), p)), Some(1));
        assert_eq!(victim(both(r(0, 4), r(1, 4), p)), Some(1));
        assert_eq!(victim(both(r(3, 4), r(1, 4), p)), Some(3));
    }

    #[test]
    fn zero_changes_discards_the_unchanged_side_only() {
        let p = zero(AfterSb0Pri::DiscardZeroChanges);
        assert_eq!(victim(both(r(0, 0), r(1, 5), p)), Some(0));
        assert_eq!(victim(both(r(0, 5), r(1, 0), p)), Some(1));
        assert_eq!(victim(both(r(0, 0), r(1, 0), p)), Some(1));
        assert_eq!(
            both(r(0, 1), r(1, 5), p),
            Verdict::Disconnect(Unresolved::BothChanged)
        );
    }

    #[test]
    fn younger_and_older_primary() {
        let older = Report {
            was_primary: true,
            ..r(0, 9)
        };
        let younger = r(1, 1);
        let y = zero(AfterSb0Pri::DiscardYoungerPrimary);
        let o = zero(AfterSb0Pri::DiscardOlderPrimary);
        assert_eq!(victim(both(older, younger, y)), Some(1));
        assert_eq!(victim(both(older, younger, o)), Some(0));
        // Neither (or both) Primary at the split: fewer changes discards.
        assert_eq!(victim(both(r(0, 9), r(1, 1), o)), Some(1));
    }

    #[test]
    fn one_primary() {
        let pri = Report {
            primary: true,
            ..r(0, 1)
        };
        let sec = r(1, 9);
        let mut p = AfterSplitBrain::default();
        assert_eq!(
            both(pri, sec, p),
            Verdict::Disconnect(Unresolved::Policy { primaries: 1 })
        );
        p.one = AfterSb1Pri::DiscardSecondary;
        assert_eq!(victim(both(pri, sec, p)), Some(1));
        p.one = AfterSb1Pri::Consensus;
        p.zero = AfterSb0Pri::DiscardLeastChanges;
        assert_eq!(
            both(pri, sec, p),
            Verdict::Disconnect(Unresolved::NoConsensus)
        );
        let sec = r(1, 0);
        assert_eq!(victim(both(pri, sec, p)), Some(1));
    }

    #[test]
    fn two_primaries_and_discard_my_data() {
        let pri = |n| Report {
            primary: true,
            ..r(n, 1)
        };
        let p = AfterSplitBrain {
            zero: AfterSb0Pri::DiscardLeastChanges,
            one: AfterSb1Pri::DiscardSecondary,
            two: AfterSb2Pri::Disconnect,
        };
        assert_eq!(
            both(pri(0), pri(1), p),
            Verdict::Disconnect(Unresolved::Policy { primaries: 2 })
        );
        let dmd = |rep: Report| Report {
            discard_my_data: true,
            ..rep
        };
        // Whatever the policy: the side that asked (even with more changes).
        assert_eq!(
            both(dmd(r(0, 9)), r(1, 1), p),
            Verdict::Discard {
                victim: 0,
                policy: SbPolicy::DiscardMyData
            }
        );
        assert_eq!(
            both(dmd(r(0, 1)), dmd(r(1, 1)), p),
            Verdict::Disconnect(Unresolved::BothDiscardMyData)
        );
        // A Primary is never a victim, nor a node keeping no replica.
        assert!(matches!(
            both(dmd(pri(0)), r(1, 1), p),
            Verdict::Disconnect(Unresolved::VictimPrimary { victim: 0, .. })
        ));
        let diskless = Report {
            diskless: true,
            ..r(0, 0)
        };
        assert!(matches!(
            both(diskless, r(1, 1), zero(AfterSb0Pri::DiscardZeroChanges)),
            Verdict::Disconnect(Unresolved::VictimDiskless { victim: 0, .. })
        ));
        // Nothing to pull from a survivor being synced itself.
        let syncing = Report {
            up_to_date: false,
            ..r(0, 5)
        };
        assert!(matches!(
            both(syncing, r(1, 1), zero(AfterSb0Pri::DiscardLeastChanges)),
            Verdict::Disconnect(Unresolved::SurvivorNotUpToDate { survivor: 0, .. })
        ));
        let syncing = Report {
            up_to_date: false,
            ..r(0, 0)
        };
        assert_eq!(
            victim(both(
                syncing,
                r(1, 1),
                zero(AfterSb0Pri::DiscardLeastChanges)
            )),
            Some(0),
            "a victim being synced is fine"
        );
    }
}
