//! What the engine sends to peers ([`Msg`]), how disk operations are named ([`Token`]) and
//! where payload bytes are ([`DataRef`]): they never enter the engine.

use super::nodeset::NodeSet;
use super::spec::NodeId;
use crate::io::ReqId;
use tandem_wire::packet::{volume_flags, DiskState, GenIds, Packet, Role, ALLOC_EXTENT_LEN};

/// Names a disk operation so its completion finds its way back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Token {
    /// The local part of an application request.
    App(ReqId),
    /// A local fdatasync batch.
    Flush(u64),
    /// Applying a peer's replicated write, received on connection `conn`.
    PeerWrite { peer: NodeId, conn: u32, seq: u64 },
    /// Serving a peer's read.
    PeerRead { peer: NodeId, conn: u32, id: u64 },
    /// Serving a peer's resync request.
    ResyncRead { peer: NodeId, conn: u32, id: u64 },
    /// Mapping a range for a peer's block status (`DiskKind::Allocation`).
    PeerAlloc { peer: NodeId, conn: u32, id: u64 },
    /// Applying part of a resync reply (we are the sync target).
    ResyncWrite { id: u64, part: u32 },
}

/// Where payload bytes are. The engine only names them; the driver holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataRef {
    /// The payload of this application write (valid while it is being submitted, or after
    /// a [`RAction::Retain`] of it).
    Request(ReqId),
    /// The data of the packet being handled right now, from byte `at`.
    Incoming { at: u32 },
    /// The buffer filled by the local read with this token.
    Disk(Token),
    /// Bytes kept by an earlier [`RAction::Retain`] under this token, from byte `at`.
    Held { key: Token, at: u32 },
}

/// A packet to send, with its payload named rather than carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    Role {
        role: Role,
        incarnation: u64,
    },
    Volume {
        volume: u16,
        size: u64,
        disk: DiskState,
        /// The replica was created empty at start and has received no data since.
        created: bool,
        /// Found on disk at start (currency unknown), not UpToDate since.
        unproven: bool,
        /// Back from a crash, it pulls its suspect ranges itself (see
        /// [`volume_flags::PULLS_SUSPECT`]).
        pulls_suspect: bool,
        /// We were Primary and completed writes the receiver missed.
        wrote_apart: bool,
        /// Our generation ids (see `generation.rs`).
        gen: GenIds,
        /// Restarted consistent and not settled since ([`volume_flags::CONTENDER`]).
        contender: bool,
        /// With `contender`: we were Primary when we stopped.
        was_primary: bool,
        /// With `contender`: our node crashed in another boot ([`volume_flags::LOST_POWER`]).
        lost_power: bool,
        /// A connection to the receiver ended since we started ([`volume_flags::MET_BEFORE`]).
        met_before: bool,
        /// Resync data from another node than the receiver landed since we started, and
        /// we were not UpToDate since ([`volume_flags::PULLED_ELSEWHERE`]).
        pulled_elsewhere: bool,
    },
    /// The Primary's new generation ids for `volume`.
    Generation {
        volume: u16,
        gen: GenIds,
    },
    GenAck {
        volume: u16,
        gi: u64,
        adopted: bool,
    },
    /// Ids we rotated to as Primary and left before acknowledging anything under them:
    /// at a crash, or set aside without quorum (`without_quorum`; see
    /// `LocalVol::set_back_from`).
    Abandoned {
        volume: u16,
        gi: u64,
        without_quorum: bool,
    },
    /// Our replica of `volume` and the receiver's diverged (see [`RAction::SplitBrain`]).
    SplitBrain {
        volume: u16,
        mine: u64,
        yours: u64,
        flags: u8,
    },
    Write {
        volume: u16,
        seq: u64,
        offset: u64,
        len: u32,
        flags: u32,
        targets: u32,
        data: DataRef,
    },
    Zero {
        volume: u16,
        seq: u64,
        offset: u64,
        len: u32,
        flags: u32,
        targets: u32,
    },
    RecvAck {
        seq: u64,
    },
    WriteAck {
        seq: u64,
    },
    NegAck {
        seq: u64,
        errno: u32,
    },
    /// Writes up to `seq` are settled; `missing` lack some of them (see `settle.rs`).
    PeerAck {
        seq: u64,
        missing: u32,
    },
    /// We lost Primary `primary` in its run `incarnation`; `seq`: the last write
    /// received from it (`u64::MAX`: we met that run again and withdraw the question; see
    /// `settle.rs`).
    PrimaryLost {
        primary: NodeId,
        incarnation: u64,
        seq: u64,
    },
    /// The Primaries we follow (see `primaries.rs`).
    Primaries {
        nodes: NodeSet,
    },
    /// As Primary: node `node`'s replica of `volume` holds all our writes now.
    InSync {
        volume: u16,
        node: NodeId,
    },
    Barrier {
        id: u64,
    },
    BarrierAck {
        id: u64,
        errno: u32,
    },
    ReadReq {
        volume: u16,
        id: u64,
        offset: u64,
        len: u32,
    },
    /// `data` is `None` on error.
    ReadReply {
        id: u64,
        errno: u32,
        len: u32,
        data: Option<DataRef>,
    },
    /// A block status of `volume`, asked of an up-to-date peer.
    AllocReq {
        volume: u16,
        id: u64,
        offset: u64,
        len: u32,
    },
    /// The answer: `extents` extents in their wire form at `data` (`None` on error).
    AllocReply {
        volume: u16,
        id: u64,
        errno: u32,
        extents: u32,
        data: Option<DataRef>,
    },
    ResyncReq {
        volume: u16,
        id: u64,
        offset: u64,
        len: u32,
    },
    ResyncReply {
        volume: u16,
        id: u64,
        offset: u64,
        errno: u32,
        /// Diskful nodes the sender marks as lacking its content of the range and does
        /// not reach.
        lacking: NodeSet,
        len: u32,
        data: Option<DataRef>,
    },
    OutOfSync {
        volume: u16,
        offset: u64,
        len: u32,
    },
    Ping,
    /// We stop cleanly, as a Secondary (see `quorum.rs`, last man standing).
    Leaving,
    /// As Primary rotating `volume`'s id to `gi`, to a tiebreaker (see `tiebreak.rs`).
    VotersBehind {
        volume: u16,
        gi: u64,
        nodes: NodeSet,
    },
    /// As a tiebreaker: the receiver's replica of `volume` missed writes (`tiebreak.rs`).
    Outdated {
        volume: u16,
    },
    PingAck,
}

impl Msg {
    /// The wire packet, with payloads taken from `data(reference, len)` (the driver's
    /// buffers; `None` stands for "no payload", as in an error reply).
    /// One arm per message kind, field for field: long, not complex.
    pub fn to_packet<'a>(&self, data: impl Fn(Option<DataRef>, u32) -> &'a [u8]) -> Packet<'a> {
        match *self {
            Msg::Role { role, incarnation } => Packet::Role { role, incarnation },
            Msg::Volume {
                volume,
                size,
                disk,
                created,
                unproven,
                pulls_suspect,
                wrote_apart,
                gen,
                contender,
                was_primary,
                lost_power,
                met_before,
                pulled_elsewhere,
            } => Packet::Volume {
                volume,
                size,
                disk,
                gen,
                flags: if created { volume_flags::CREATED } else { 0 }
                    | if contender {
                        volume_flags::CONTENDER
                    } else {
                        0
                    }
                    | if was_primary {
                        volume_flags::WAS_PRIMARY
                    } else {
                        0
                    }
                    | if lost_power {
                        volume_flags::LOST_POWER
                    } else {
                        0
                    }
                    | if unproven { volume_flags::UNPROVEN } else { 0 }
                    | if pulls_suspect {
                        volume_flags::PULLS_SUSPECT
                    } else {
                        0
                    }
                    | if wrote_apart {
                        volume_flags::WROTE_APART
                    } else {
                        0
                    }
                    | if met_before {
                        volume_flags::MET_BEFORE
                    } else {
                        0
                    }
                    | if pulled_elsewhere {
                        volume_flags::PULLED_ELSEWHERE
                    } else {
                        0
                    },
            },
            Msg::Generation { volume, gen } => Packet::Generation { volume, gen },
            Msg::Abandoned {
                volume,
                gi,
                without_quorum,
            } => Packet::Abandoned {
                volume,
                gi,
                without_quorum,
            },
            Msg::GenAck {
                volume,
                gi,
                adopted,
            } => Packet::GenAck {
                volume,
                gi,
                adopted,
            },
            Msg::SplitBrain {
                volume,
                mine,
                yours,
                flags,
            } => Packet::SplitBrain {
                volume,
                mine,
                yours,
                flags,
            },
            Msg::Write {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
                data: d,
            } => Packet::Write {
                volume,
                seq,
                offset,
                flags,
                targets,
                data: data(Some(d), len),
            },
            Msg::Zero {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
            } => Packet::Zero {
                volume,
                seq,
                offset,
                len,
                flags,
                targets,
            },
            Msg::RecvAck { seq } => Packet::RecvAck { seq },
            Msg::WriteAck { seq } => Packet::WriteAck { seq },
            Msg::NegAck { seq, errno } => Packet::NegAck { seq, errno },
            Msg::PeerAck { seq, missing } => Packet::PeerAck { seq, missing },
            Msg::PrimaryLost {
                primary,
                incarnation,
                seq,
            } => Packet::PrimaryLost {
                primary,
                incarnation,
                seq,
            },
            Msg::InSync { volume, node } => Packet::InSync { volume, node },
            Msg::Primaries { nodes } => Packet::Primaries {
                nodes: nodes.bits(),
            },
            Msg::Barrier { id } => Packet::Barrier { id },
            Msg::BarrierAck { id, errno } => Packet::BarrierAck { id, errno },
            Msg::ReadReq {
                volume,
                id,
                offset,
                len,
            } => Packet::ReadReq {
                volume,
                id,
                offset,
                len,
            },
            Msg::ReadReply {
                id,
                errno,
                len,
                data: d,
            } => Packet::ReadReply {
                id,
                errno,
                data: data(d, len),
            },
            Msg::AllocReq {
                volume,
                id,
                offset,
                len,
            } => Packet::AllocReq {
                volume,
                id,
                offset,
                len,
            },
            Msg::AllocReply {
                volume,
                id,
                errno,
                extents,
                data: d,
            } => Packet::AllocReply {
                volume,
                id,
                errno,
                extents: data(d, extents * ALLOC_EXTENT_LEN as u32),
            },
            Msg::ResyncReq {
                volume,
                id,
                offset,
                len,
            } => Packet::ResyncReq {
                volume,
                id,
                offset,
                len,
            },
            Msg::ResyncReply {
                volume,
                id,
                offset,
                errno,
                lacking,
                len,
                data: d,
            } => Packet::ResyncReply {
                volume,
                id,
                offset,
                errno,
                lacking: lacking.bits(),
                data: data(d, len),
            },
            Msg::OutOfSync {
                volume,
                offset,
                len,
            } => Packet::OutOfSync {
                volume,
                offset,
                len,
            },
            Msg::Ping => Packet::Ping,
            Msg::Leaving => Packet::Leaving,
            Msg::VotersBehind { volume, gi, nodes } => Packet::VotersBehind {
                volume,
                gi,
                nodes: nodes.bits(),
            },
            Msg::Outdated { volume } => Packet::Outdated { volume },
            Msg::PingAck => Packet::PingAck,
        }
    }
}
