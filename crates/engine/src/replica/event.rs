//! What the engine tells the world happened, as types: drivers turn these into log lines
//! (and, later, an events stream and metrics); tests and the simulator match on them,
//! never on text. `Display` gives the operator's sentence.

use super::quorum::QuorumCount;
use super::run::PrimaryRun;
use super::spec::NodeId;
use crate::io::IoError;
use std::fmt;
use tandem_wire::packet::{DiskState, Role};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    RoleChanged {
        from: Role,
        to: Role,
        why: RoleChange,
    },
    /// Our replica of `volume` changed disk state.
    DiskChanged {
        volume: u16,
        from: DiskState,
        to: DiskState,
        why: DiskChange,
    },
    /// The connection to `peer` ended.
    PeerLost { peer: NodeId, reason: LinkLoss },
    /// As Primary without quorum, we learnt that node `primary` is Primary with the
    /// nodes we lack: we step down (see `primaries.rs`), failing our requests held and new.
    YieldingTo { primary: NodeId },
    /// As Primary: `peer`'s replica of `volume` is newer by its ids (`theirs` descends
    /// from our `ours`): another Primary was promoted and went on without us. We step down
    /// as for [`Event::YieldingTo`]: held and new requests fail, then Secondary.
    Superseded {
        peer: NodeId,
        volume: u16,
        ours: u64,
        theirs: u64,
    },
    /// As Primary without quorum: `peer` says it followed a run of node `primary` we never
    /// followed, so a majority promoted that one while we were cut off. We step down as
    /// for [`Event::YieldingTo`]: held and new requests fail, then Secondary.
    Outrun { peer: NodeId, primary: NodeId },
    /// `peer` reconnected while its list of what we lack was still coming: we cannot know
    /// all we lack, so everything is pulled.
    ListCutOff { volume: u16, peer: NodeId },
    /// The connection to our sync source dropped; the resync goes on from another peer or
    /// when it returns.
    ResyncInterrupted { volume: u16, peer: NodeId },
    /// No up-to-date replica is within reach and no peer has the blocks we lack: the
    /// resync waits (said once until data arrives again).
    ResyncStalled { volume: u16 },
    /// The up-to-date replica `older` is within reach, but our ids descend from its own,
    /// so it never held what we lack (`Replicas::lacks_what_we_lack`): the resync waits
    /// for a replica that does (said once until data arrives again).
    ResyncWaitsForNewer { volume: u16, older: NodeId },
    /// Data arrived again after [`Event::ResyncStalled`] or [`Event::ResyncWaitsForNewer`].
    ResyncResumed { volume: u16, peer: NodeId },
    /// The sync source could not read a range we asked for.
    ResyncReadFailed {
        volume: u16,
        peer: NodeId,
        offset: u64,
        len: u32,
    },
    /// An application write failed on every replica that could vouch for it.
    WriteFailed { volume: u16, offset: u64, len: u32 },
    /// Our replica of `volume` (or, on a diskless Primary, the data its writes make) has a
    /// new current generation id. The driver must make it durable (the metadata) before it
    /// carries out the actions that follow this event.
    GenerationChanged { volume: u16, from: u64, to: u64 },
    /// A Primary without quorum set the ids of `volume` back to those it last acknowledged
    /// a request under (`restored: false`; it acknowledged nothing under `from`), or, its
    /// quorum back, forward again to those it had rotated to (`restored: true`). Made
    /// durable like [`Event::GenerationChanged`].
    GenerationSetBack {
        volume: u16,
        from: u64,
        to: u64,
        restored: bool,
    },
    /// Peer `peer` told us it rotated its ids of `volume` to `from` as Primary and left
    /// them (a crash, or quorum lost) before it acknowledged anything under them; we held
    /// `from` as our current id (adopted from it) and set our ids back to `to`, the ones
    /// before. Made durable like [`Event::GenerationChanged`].
    GenerationAbandoned {
        volume: u16,
        peer: NodeId,
        from: u64,
        to: u64,
    },
    /// As Primary, the first request of `volume` since our ids rotated to `current` is about
    /// to be acknowledged: the metadata's ids (`Resource::ids_at_crash`) move to those, made
    /// durable like [`Event::GenerationChanged`] before the completion that follows.
    GenerationAcked { volume: u16, current: u64 },
    /// A split brain on `volume` with `peer` was resolved by `policy`: `victim` (this node
    /// or the peer) discards its `discarded_blocks` changed blocks and pulls
    /// `pulled_blocks` (its changes and the survivor's) from the survivor.
    SplitBrainResolved {
        peer: NodeId,
        volume: u16,
        policy: super::split_brain::SbPolicy,
        victim: NodeId,
        discarded_blocks: u64,
        pulled_blocks: u64,
    },
    /// Our replica of `volume` and `peer`'s both restarted, and each changed apart from
    /// the other since their last common generation: a split brain (the connection stops).
    GenerationsDiverged {
        volume: u16,
        peer: NodeId,
        mine: u64,
        theirs: u64,
    },
    /// Back from a restart with no Primary around, we met `peer`'s replica of `volume`, older
    /// by its generation ids: it is listed what our bitmap names since generation `since`
    /// (`bytes`), or everything (`since` is `None`: no bitmap of ours names all it lacks).
    OlderPeerListed {
        volume: u16,
        peer: NodeId,
        since: Option<u64>,
        bytes: u64,
    },
    /// From now on our bitmap for `peer`'s replica of `volume` names all it lacks of the
    /// data since generation `gi` (`None`: since no id we know). The driver must make it
    /// durable (the metadata) before it carries out the actions that follow this event.
    BitmapGiChanged {
        volume: u16,
        peer: NodeId,
        gi: Option<u64>,
    },
    /// We take writes from this Primary's run now (`None`: from none we may record). The
    /// driver must make it durable (the metadata) before it carries out the actions that
    /// follow this event (see `writer.rs`).
    WriterChanged { run: Option<PrimaryRun> },
    /// Back from a crash in the same boot, we met again as Primary the run we took writes
    /// from: the `bytes` of our activity log's extents need no pull.
    CrashSettledByRun {
        volume: u16,
        primary: NodeId,
        bytes: u64,
    },
    /// Volume `volume` gained or lost quorum (see `quorum.rs`): without it a Primary fails
    /// or holds application I/O (`on-no-quorum`) and this node cannot be promoted.
    QuorumChanged {
        volume: u16,
        quorate: bool,
        count: QuorumCount,
    },
}

/// Why this node's role changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    Administrator,
    /// An application client attached and no other node was Primary.
    ClientAttached,
    /// The last client of a node promoted for it left.
    LastClientLeft,
    /// Without quorum, it stepped down for another Primary (see `primaries.rs`).
    Yielded {
        to: NodeId,
    },
    /// It stepped down for `peer`, whose replica is newer by its ids: another Primary
    /// went on without us.
    Superseded {
        peer: NodeId,
    },
    /// It stepped down when `peer` said it had followed `primary` (another node) as
    /// Primary while we had no quorum.
    Outrun {
        peer: NodeId,
        primary: NodeId,
    },
}

/// Why our replica's disk state changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskChange {
    /// `tandem primary --force`.
    ForcedByAdministrator,
    /// `tandem invalidate` on the running node: resynced in full from an up-to-date peer.
    Invalidated,
    /// A local operation failed: the replica is detached (DRBD's on-io-error detach).
    Failed(LocalFailure),
    /// A peer told of a write we missed on a running connection.
    MissedWrite { peer: NodeId },
    /// A peer's list after a connect names writes we lack.
    Behind { peer: NodeId },
    /// A quorum tiebreaker (`told_by`) says a Primary acknowledged writes we missed while
    /// it kept quorum through that tiebreaker (see `tiebreak.rs`).
    MissedWritesOfAPrimary { told_by: NodeId },
    /// Every replica was created empty at its node's start and all have met.
    NewCluster,
    /// Back from a crash: the `bytes` its activity log names (where it may differ from
    /// every peer) are pulled under Primary node `primary` (this node, if it was promoted),
    /// or (`None`) with no Primary anywhere, once every node has met it and listed.
    CrashedExtents { primary: Option<NodeId>, bytes: u64 },
    /// Back from a clean restart, proven current: `by` an up-to-date peer whose list
    /// named nothing we lack, or (`None`) every diskful node has met and listed to us and
    /// none restarted without proof.
    Proven { by: Option<NodeId> },
    /// Back from a restart with no Primary and no up-to-date replica anywhere: every
    /// diskful node has met and listed, and none has newer data by its generation ids
    /// (`current`; with the same ids, this one ranks first: it was Primary, stopped
    /// cleanly, or has the lowest node id). The others pull from it.
    ProvenByGeneration { current: u64 },
    /// Demoted while the volume had no quorum: what we wrote as Primary since our peers
    /// last had it may differ from what a majority promoted elsewhere wrote; the `bytes` of
    /// it we claimed they lack are pulled back under the next Primary we meet, as after a
    /// crash (see `quorum.rs`).
    LostQuorum { bytes: u64 },
    /// Up to date with no Primary around, we met `peer`, whose generation ids are newer:
    /// it took writes we missed while cut off. It syncs us.
    OlderThan { peer: NodeId },
    /// A split brain with `survivor` was resolved with this node as victim: its changes
    /// are discarded, pulled back from the survivor with the survivor's.
    DiscardedAfterSplitBrain { survivor: NodeId },
    /// A resync finished, after pulling `bytes` from `source`.
    Synced {
        source: Option<NodeId>,
        bytes: u64,
        /// Only live notices (writes missed on a running connection) made this resync.
        live: bool,
    },
}

/// Which local operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalFailure {
    Read(IoError),
    /// A read for a peer (its read, or a resync read of a sync target).
    PeerRead(IoError),
    Write(IoError),
    ReplicatedWrite(IoError),
    ResyncWrite,
    Fdatasync,
    FlushAfterResync,
}

/// Why a connection to a peer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkLoss {
    /// Closed, failed or timed out in the driver.
    Closed,
    /// The peer broke the protocol: the connection is dropped, never the node.
    Misbehaved(ProtocolError),
    /// A replicated write was not acknowledged within the request timeout (ms).
    WriteTimeout(u64),
    /// A ping was not answered within the ping timeout (ms).
    PingTimeout(u64),
    /// A ping was not answered within the request timeout (ms): the peer was judged by
    /// it rather than by the ping timeout, since it owed us answers (a busy peer may be
    /// silent that long) or neither end of the link is Primary.
    Silent(u64),
    /// The peer's host acknowledged none of the bytes we had sent it for this long (ms,
    /// the driver's transport statistics; see `Resource::transport_silent`): dead, or the
    /// network between us cut, whatever it owed us.
    Unreachable(u64),
}

impl Event {
    /// Routine detail for a debug log rather than an operator's line: a live catch-up
    /// resync (a replica cut off from the Primary pulling through another replica) starts
    /// and ends once per burst of writes.
    pub fn is_detail(&self) -> bool {
        matches!(
            self,
            Event::DiskChanged {
                why: DiskChange::MissedWrite { .. },
                ..
            } | Event::DiskChanged {
                why: DiskChange::Synced { live: true, .. },
                ..
            } | Event::WriteFailed { .. }
                | Event::WriterChanged { .. }
                | Event::BitmapGiChanged { .. }
                | Event::GenerationAcked { .. }
        )
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::RoleChanged {
                to: Role::Primary, ..
            } => write!(f, "promoted to Primary"),
            Event::RoleChanged {
                why: RoleChange::Yielded { to },
                ..
            } => write!(f, "demoted to Secondary: node {to} is Primary with a quorum"),
            Event::RoleChanged {
                why: RoleChange::Superseded { peer },
                ..
            } => write!(
                f,
                "demoted to Secondary: node {peer} holds newer data, written under another Primary"
            ),
            Event::RoleChanged {
                why: RoleChange::Outrun { peer, primary },
                ..
            } => write!(
                f,
                "demoted to Secondary: node {peer} followed node {primary} as Primary while this one had no quorum"
            ),
            Event::RoleChanged { .. } => write!(f, "demoted to Secondary"),
            Event::Superseded {
                peer,
                volume,
                ours,
                theirs,
            } => write!(
                f,
                "volume {volume}: node {peer} holds newer data (generation {theirs:016x}, ours \
                 {ours:016x}): another Primary went on without this one; stepping down (held \
                 and new requests fail with EIO)"
            ),
            Event::Outrun { peer, primary } => write!(
                f,
                "node {peer} followed node {primary} as Primary while this Primary had no \
                 quorum (a majority promoted it meanwhile): stepping down (held and new \
                 requests fail with EIO)"
            ),
            Event::YieldingTo { primary } => write!(
                f,
                "node {primary} is Primary and this Primary has no quorum without the nodes \
                 following it: stepping down (held and new requests fail with EIO)"
            ),
            Event::QuorumChanged {
                volume,
                quorate,
                count: c,
            } => {
                let what = if *quorate { "has quorum" } else { "lost quorum" };
                write!(
                    f,
                    "volume {volume}: {what}: {} of {} replicas reached ({} needed), {} up to date",
                    c.votes(),
                    c.voters,
                    c.needed,
                    c.up_to_date
                )?;
                if c.redundancy_needed > 0 {
                    write!(f, " ({} needed)", c.redundancy_needed)?;
                }
                if c.tiebreakers > 0 {
                    write!(
                        f,
                        ", {} of {} diskless tiebreakers",
                        c.tiebreakers_reached, c.tiebreakers
                    )?;
                }
                if c.departed > 0 {
                    write!(f, "; {} stopped cleanly and count no more", c.departed)?;
                }
                Ok(())
            }
            Event::DiskChanged {
                volume,
                to,
                why,
                from: _,
            } => write!(f, "volume {volume}: {}", DiskLine(why, *to)),
            Event::PeerLost {
                peer,
                reason: LinkLoss::Closed,
            } => write!(f, "connection to node {peer} lost"),
            Event::PeerLost {
                peer,
                reason: LinkLoss::Misbehaved(why),
            } => write!(f, "protocol error from node {peer}: {why}"),
            Event::PeerLost { peer, reason } => write!(f, "node {peer}: {reason}"),
            Event::ListCutOff { volume, peer } => write!(
                f,
                "volume {volume}: list from node {peer} was interrupted; full resync"
            ),
            Event::ResyncInterrupted { volume, peer } => {
                write!(f, "volume {volume}: resync from node {peer} interrupted")
            }
            Event::ResyncStalled { volume } => write!(
                f,
                "volume {volume}: no up-to-date replica within reach, and no peer has the \
                 blocks we lack; the resync waits for one to return (I/O that needs one fails)"
            ),
            Event::ResyncWaitsForNewer { volume, older } => write!(
                f,
                "volume {volume}: node {older} is up to date, but older by generation ids than \
                 the writes we lack; the resync waits for a replica that holds them"
            ),
            Event::ResyncResumed { volume, peer } => write!(
                f,
                "volume {volume}: node {peer} has blocks we lack; the resync goes on"
            ),
            Event::ResyncReadFailed {
                volume,
                peer,
                offset,
                len,
            } => write!(
                f,
                "volume {volume}: node {peer} could not read {offset}+{len} for resync"
            ),
            Event::WriteFailed {
                volume,
                offset,
                len,
            } => write!(f, "volume {volume}: write {offset}+{len} failed"),
            Event::SplitBrainResolved {
                peer,
                volume,
                policy,
                victim,
                discarded_blocks,
                pulled_blocks,
            } if victim == peer => write!(
                f,
                "volume {volume}: split brain with node {peer} resolved by {policy}: node {peer}'s {discarded_blocks} changed blocks ({} KiB) discarded, it pulls {pulled_blocks} blocks from this node",
                discarded_blocks * 4
            ),
            Event::SplitBrainResolved {
                peer,
                volume,
                policy,
                discarded_blocks,
                pulled_blocks,
                ..
            } => write!(
                f,
                "volume {volume}: split brain with node {peer} resolved by {policy}: this node's {discarded_blocks} changed blocks ({} KiB) discarded, pulling {pulled_blocks} blocks from node {peer}",
                discarded_blocks * 4
            ),
            Event::GenerationsDiverged {
                volume,
                peer,
                mine,
                theirs,
            } => write!(
                f,
                "volume {volume}: split brain with node {peer}: our generation {mine:016x} and its {theirs:016x} each changed apart from the other"
            ),
            Event::OlderPeerListed {
                volume,
                peer,
                since: Some(gi),
                bytes,
            } => write!(
                f,
                "volume {volume}: node {peer} is older by its generation ids; it is listed the {} KiB our bitmap names since generation {gi:016x}",
                bytes >> 10
            ),
            Event::OlderPeerListed {
                volume,
                peer,
                since: None,
                bytes,
            } => write!(
                f,
                "volume {volume}: node {peer} is older by its generation ids and no bitmap of ours names all it lacks; it is listed everything ({} KiB)",
                bytes >> 10
            ),
            Event::BitmapGiChanged {
                volume,
                peer,
                gi: Some(gi),
            } => write!(
                f,
                "volume {volume}: our bitmap for node {peer} counts from generation {gi:016x}"
            ),
            Event::BitmapGiChanged {
                volume,
                peer,
                gi: None,
            } => write!(
                f,
                "volume {volume}: our bitmap for node {peer} is tied to no generation (it would be synced in full after a whole-cluster restart)"
            ),
            Event::GenerationChanged { volume, from, to } => write!(
                f,
                "volume {volume}: generation {from:016x} -> {to:016x} (a replica missed a write)"
            ),
            Event::GenerationAbandoned {
                volume,
                peer,
                from,
                to,
            } => write!(
                f,
                "volume {volume}: generation {from:016x} -> {to:016x} (set back: node {peer} rotated to it as Primary and left it, by a crash or without quorum, before acknowledging any write under it)"
            ),
            Event::GenerationAcked { volume, current } => write!(
                f,
                "volume {volume}: first request acknowledged under generation {current:016x} (a crash now keeps it)"
            ),
            Event::GenerationSetBack {
                volume,
                from,
                to,
                restored: false,
            } => write!(
                f,
                "volume {volume}: generation {from:016x} -> {to:016x} (set back: no quorum, and nothing acknowledged since)"
            ),
            Event::GenerationSetBack {
                volume,
                from,
                to,
                restored: true,
            } => write!(
                f,
                "volume {volume}: generation {from:016x} -> {to:016x} (taken up again: quorum back)"
            ),
            Event::WriterChanged { run: Some(r) } => write!(
                f,
                "takes writes from node {} (run {:016x}), as the metadata now says",
                r.node, r.incarnation
            ),
            Event::WriterChanged { run: None } => {
                write!(f, "takes writes from no Primary a crash could trust")
            }
            Event::CrashSettledByRun {
                volume,
                primary,
                bytes,
            } => write!(
                f,
                "volume {volume}: node {primary} is Primary in the run we took writes from before the crash: its list names all we lack, and the {} KiB of our activity log's extents need no pull",
                bytes / 1024
            ),
        }
    }
}

/// The sentence for a disk state change.
struct DiskLine<'a>(&'a DiskChange, DiskState);

impl fmt::Display for DiskLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            DiskChange::ForcedByAdministrator => write!(f, "forced UpToDate by the administrator"),
            DiskChange::Invalidated => write!(
                f,
                "invalidated by the administrator: resynced in full from an up-to-date peer"
            ),
            DiskChange::Failed(what) => {
                write!(f, "local replica failed ({what}); detached")
            }
            DiskChange::MissedWrite { peer } => {
                write!(f, "node {peer} tells of a write we missed; catching up")
            }
            DiskChange::Behind { peer } => {
                write!(f, "node {peer} lists writes we lack; resync needed")
            }
            DiskChange::MissedWritesOfAPrimary { told_by } => write!(
                f,
                "node {told_by}, a quorum tiebreaker, says a Primary acknowledged writes \
                 this replica missed: Outdated until it meets that Primary or a replica \
                 holding them (no promotion here meanwhile, unless forced)"
            ),
            DiskChange::CrashedExtents { primary, bytes } => {
                let kib = bytes >> 10;
                write!(f, "back from a crash; pulling the {kib} KiB its activity log names, ")?;
                match primary {
                    Some(p) => write!(f, "under Primary node {p}"),
                    None => write!(f, "every node having met it and listed (none is Primary)"),
                }
            }
            DiskChange::LostQuorum { bytes } => write!(
                f,
                "demoted without quorum: Outdated; the {} KiB written as Primary that the peers may lack are pulled back under the next Primary (a majority may have written there since)",
                bytes >> 10
            ),
            DiskChange::NewCluster => write!(
                f,
                "every replica was created empty at its node's start (a new cluster): UpToDate without a sync"
            ),
            DiskChange::Proven { by: Some(peer) } => write!(
                f,
                "back from a clean restart; node {peer} (up to date) lists nothing we lack: UpToDate"
            ),
            DiskChange::Proven { by: None } => write!(
                f,
                "back from a clean restart; every node keeping a replica has met and listed what we lack (nothing): UpToDate"
            ),
            DiskChange::DiscardedAfterSplitBrain { survivor } => write!(
                f,
                "split brain with node {survivor} resolved against this node: its changes are discarded and pulled back from node {survivor}"
            ),
            DiskChange::OlderThan { peer } => write!(
                f,
                "node {peer} holds newer data by generation ids (we were cut off while it took writes): Outdated, synced from it"
            ),
            DiskChange::ProvenByGeneration { current } => write!(
                f,
                "every node keeping a replica has met, none is Primary or up to date, and none holds newer data by generation ids (ours: {current:016x}): UpToDate, the others sync from us"
            ),
            DiskChange::Synced {
                source, bytes, ..
            } => {
                let kib = bytes >> 10;
                if self.1 == DiskState::Outdated {
                    // `Replicas::resync_finished`: unproven, synced by peers not current.
                    return write!(
                        f,
                        "resync finished ({kib} KiB pulled), but no source was up to date and this replica's currency is unknown: Outdated until an up-to-date replica lists it everything"
                    );
                }
                match source {
                    Some(source) => write!(
                        f,
                        "resync from node {source} finished ({kib} KiB pulled); {:?}",
                        self.1
                    ),
                    // Its source left, and nothing was left to pull (the application's
                    // writes covered the rest whole: `Resync::written_whole`).
                    None => write!(
                        f,
                        "resync finished ({kib} KiB pulled) with no source connected: nothing left to pull; {:?}",
                        self.1
                    ),
                }
            }
        }
    }
}

impl fmt::Display for LocalFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LocalFailure::Read(e) => return write!(f, "read failed: {e:?}"),
            LocalFailure::PeerRead(e) => return write!(f, "read for a peer failed: {e:?}"),
            LocalFailure::Write(e) => return write!(f, "write failed: {e:?}"),
            LocalFailure::ReplicatedWrite(e) => return write!(f, "replicated write failed: {e:?}"),
            LocalFailure::ResyncWrite => "resync write failed",
            LocalFailure::Fdatasync => "fdatasync failed",
            LocalFailure::FlushAfterResync => "flush after resync failed",
        })
    }
}

impl fmt::Display for LinkLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLoss::Closed => f.write_str("connection closed"),
            LinkLoss::Misbehaved(why) => write!(f, "{why}"),
            LinkLoss::WriteTimeout(ms) => {
                write!(f, "a replicated write was not acknowledged within {ms} ms")
            }
            LinkLoss::PingTimeout(ms) => write!(f, "no answer to a ping within {ms} ms"),
            LinkLoss::Silent(ms) => write!(
                f,
                "silent for {ms} ms (judged by the request timeout: it owed us answers, or \
                 no Primary is on the link)"
            ),
            LinkLoss::Unreachable(ms) => write!(
                f,
                "its host acknowledged nothing we sent for {ms} ms (dead, or the network \
                 between us cut)"
            ),
        }
    }
}

/// Why we drop a connection over what the peer sent: it broke the protocol (a malformed or
/// impossible packet), or our replicas are in a state only a reconnect can settle. The
/// connection is dropped, never the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    BothPrimary,
    /// The peer announced itself Primary while we follow another one (`first`).
    SecondPrimary {
        first: NodeId,
    },
    /// A `Primaries` report naming unknown nodes or the sender (the bits).
    BadPrimaries(u32),
    /// `VotersBehind` from a node that is not Primary.
    VotersBehindFromSecondary,
    WriteFromSecondary,
    WriteOutOfOrder {
        seq: u64,
        last: u64,
    },
    UnknownVolume(u16),
    OutOfRange {
        volume: u16,
        offset: u64,
        len: u64,
        size: u64,
    },
    SizeMismatch {
        volume: u16,
        theirs: u64,
        ours: u64,
    },
    UnknownBarrier(u64),
    UnknownWrite {
        seq: u64,
        negative: bool,
    },
    UnknownRead(u64),
    UnknownAllocation(u64),
    /// A block status answer about another volume than the one asked.
    AllocReplyVolume {
        id: u64,
        volume: u16,
    },
    ReadReplyLength {
        got: usize,
        asked: u32,
    },
    ResyncReplyWithoutResync(u64),
    UnknownResyncRequest(u64),
    ResyncReplyMismatch(u64),
    /// The sync source could not read what we asked for (its disk failed).
    SourceReadFailed,
    /// Each replica lacks writes of a third node, the Primary, that the other has: only
    /// the Primary's lists settle which is newer, so retry later.
    LackPrimaryWrites {
        volume: u16,
    },
    /// The peer sent an error packet.
    PeerReported {
        code: u32,
        message: String,
    },
    HandshakeAfterHandshake,
    /// An `InSync` from a node that is not Primary (only the Primary knows what its
    /// replicas hold).
    InSyncFromSecondary,
    /// A node id that is not in the resource (or is the receiver's own).
    UnknownNode(u8),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ProtocolError::*;
        match self {
            BothPrimary => write!(f, "both nodes are Primary"),
            SecondPrimary { first } => write!(
                f,
                "it became Primary while this node follows node {first} as Primary \
                 (a partition that only this node bridges?): refused"
            ),
            BadPrimaries(bits) => write!(f, "Primaries report {bits:#x} names unknown nodes"),
            VotersBehindFromSecondary => write!(f, "voters-behind notice from a Secondary"),
            WriteFromSecondary => write!(f, "replicated write from a node that is not Primary"),
            WriteOutOfOrder { seq, last } => write!(f, "write sequence {seq} not after {last}"),
            UnknownNode(id) => write!(f, "node {id} is not another node of the resource"),
            UnknownVolume(v) => write!(f, "unknown volume {v}"),
            OutOfRange {
                volume,
                offset,
                len,
                size,
            } => write!(
                f,
                "range {offset}+{len} outside volume {volume} of {size} bytes"
            ),
            SizeMismatch {
                volume,
                theirs,
                ours,
            } => write!(f, "volume {volume}: peer has {theirs} bytes, we have {ours}"),
            UnknownBarrier(id) => write!(f, "acknowledgement of unknown barrier {id}"),
            UnknownWrite { seq, negative } => {
                let what = if *negative { "negative " } else { "" };
                write!(f, "{what}acknowledgement of unknown write {seq}")
            }
            UnknownRead(id) => write!(f, "reply to unknown read {id}"),
            UnknownAllocation(id) => write!(f, "reply to unknown block status request {id}"),
            AllocReplyVolume { id, volume } => {
                write!(f, "block status reply {id} about volume {volume}, not the one asked")
            }
            ReadReplyLength { got, asked } => write!(f, "read reply of {got} bytes for {asked}"),
            ResyncReplyWithoutResync(id) => write!(f, "resync reply {id} without a resync"),
            UnknownResyncRequest(id) => write!(f, "resync reply to unknown request {id}"),
            ResyncReplyMismatch(id) => write!(f, "resync reply {id} does not match its request"),
            SourceReadFailed => write!(f, "sync source failed a resync read"),
            LackPrimaryWrites { volume } => write!(
                f,
                "volume {volume}: each replica lacks writes of the Primary that the other has; reconnecting"
            ),
            PeerReported { code, message } => write!(f, "peer reported error {code}: {message}"),
            HandshakeAfterHandshake => write!(f, "handshake packet after the handshake"),
            InSyncFromSecondary => write!(f, "in-sync notice from a node that is not Primary"),
        }
    }
}

impl std::error::Error for ProtocolError {}
