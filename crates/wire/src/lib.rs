//! The peer protocol between tandem nodes.
//!
//! A connection carries length-prefixed frames (`[magic u32][kind u16][flags u16][len u32]`
//! followed by `len` bytes, all big-endian). Decoding never trusts a length before checking it
//! against the limit for its kind, so a hostile or broken peer costs at most the bytes it sends
//! and ends in a [`WireError`], never a panic or an unbounded allocation.
//!
//! - [`packet`]: the packets and their encoding.
//! - [`auth`]: HMAC-SHA256 challenge–response over the resource's shared secret.
//! - [`handshake`]: the sans-IO state machine that takes a connection from connect to
//!   authenticated.

pub mod auth;
pub mod errno;
pub mod handshake;
pub mod packet;

pub use errno::Errno;
pub use handshake::{
    Established, HandshakeConfig, HandshakeError, HandshakeStep, PeerHandshake, PeerTls,
};
pub use packet::{decode, encode, Decoded, Packet, WireError};

/// Feature bits a node offers in its `Hello`; a session uses those both offered.
pub mod features {
    /// `Packet::SyncProgress` may be sent (a node without it would take the unknown
    /// packet kind for a protocol error).
    pub const SYNC_PROGRESS: u64 = 1;
    // Bits 62 and 63 are not features: they carry the sender's TLS mode for its peer links
    // (`handshake::TLS_CERTIFICATES`, `handshake::TLS_SECRET`), which must equal ours.
    // Nodes without TLS support ignore them (and send neither): a node with TLS on refuses
    // them, no version change needed.
}

/// "TNDM".
pub const MAGIC: u32 = 0x544e_444d;
/// Protocol versions this build speaks.
/// Version 2: `Volume` carries flags (a replica created empty at start).
/// Version 3: `Volume` carries generation ids; `Generation` and `GenAck` rotate them.
/// Version 4: `Volume` may carry `MET_BEFORE` (a version-3 node would refuse the flag).
/// Version 5: `PeerAck` (writes settled on every replica) and `PrimaryLost`.
/// Version 6: `InSync` (a replica the Primary synced holds all its writes).
/// Version 7: `Volume` may carry `PULLED_ELSEWHERE` (a version-6 node would refuse the flag).
/// Version 8: `AllocReq` and `AllocReply` (a diskless Primary's block status answered by an
/// up-to-date peer).
/// Version 9: `ResyncReply` carries `lacking` (the nodes the sender marks as lacking the
/// range), four bytes a version-8 node would take as data.
/// Version 10: `Abandoned` (ids a Primary rotated to and crashed under before it
/// acknowledged anything).
/// Version 11: a `PrimaryLost` whose `seq` is `u64::MAX` withdraws the sender's question
/// (it met that Primary's run again); a version-10 node would answer it with a zero, which
/// a node that keeps questions until it loses the run would compare with.
/// Version 12: `Volume`'s flags take two bytes, for `LOST_POWER` (a contender whose node
/// crashed in another boot ranks below one that kept its page cache, ids being equal).
/// Version 13: `Abandoned` carries `without_quorum` (ids set aside when quorum was lost,
/// which rank the sender no higher), a byte a version-12 node does not expect.
pub const VERSION_MIN: u16 = 13;
pub const VERSION_MAX: u16 = 13;
pub const HEADER_LEN: usize = 12;
/// Largest body of a packet without bulk data.
pub const MAX_CONTROL_BODY: u32 = 64 << 10;
/// Largest bulk payload (a replicated write, a read or resync reply).
pub const MAX_DATA: u32 = 32 << 20;
