//! The connection handshake, sans-IO: from connect to "authenticated" for one peer connection.
//!
//! Both sides run the same steps; there is no client/server asymmetry on the wire:
//!
//! 1. each side sends `Hello` (versions, features, node id, resource, a fresh challenge);
//! 2. on the peer's `Hello`, a side checks that a protocol version is in common, that the
//!    resource is the same and that the node id is one it accepts, then answers the peer's
//!    challenge with `Auth`;
//! 3. on the peer's `Auth`, a side verifies the response and sends `AuthOk`;
//! 4. a side is established once it has sent `AuthOk` and received the peer's.
//!
//! **TLS** ([`PeerHandshake::with_tls`]). The `Hello`s stay in the clear (a port several
//! resources share routes a caller by its `Hello`) and carry each side's TLS mode
//! ([`PeerTls`], in two of the `features` bits: [`TLS_CERTIFICATES`], [`TLS_SECRET`]).
//! Modes are not negotiated: a side whose mode differs from the peer's refuses it
//! ([`HandshakeError::TlsMismatch`], an `Error` packet in the clear), so neither end
//! ever talks to the other in the clear when one of them wants TLS, and both log why.
//! With the same mode on, step 2 becomes [`HandshakeStep::StartTls`]: the driver runs TLS
//! over the socket (the dialer is the client), bytes after the `Hello` belong to TLS, and
//! once TLS is up it calls [`PeerHandshake::tls_up`] with the channel's `tls-exporter`
//! value; `Auth` is sent then, inside TLS, bound to that channel (`auth::respond_bound`),
//! and steps 3 and 4 go on inside TLS. A driver that finds TLS failed (or the peer's
//! certificate wrong) ends the handshake with [`PeerHandshake::tls_failed`].
//!
//! A side that refuses the peer sends an `Error` packet saying why before it gives up, so both
//! ends can log the reason; a peer's `Error` ends the handshake with
//! [`HandshakeError::PeerRefused`].
//!
//! [`PeerHandshake`] does no I/O. The daemon writes the bytes it produces to the socket and
//! feeds it the bytes it reads; after [`HandshakeStep::Established`], bytes that were not
//! consumed belong to the session and are decoded with [`crate::decode`].

use std::fmt;

use crate::auth::{self, CHALLENGE_LEN, RESPONSE_LEN};
use crate::packet::{decode, encode, Decoded, Packet, WireError};
use crate::{HEADER_LEN, MAGIC, VERSION_MAX, VERSION_MIN};

// Codes of the `Error` packets the handshake sends.

/// The peer's response to our challenge did not verify: the shared secrets differ.
pub const ERR_AUTH: u32 = 1;
/// The peer asked for another resource.
pub const ERR_RESOURCE: u32 = 2;
/// The peer's node id is not acceptable (unknown, ours, or not the node we dialed).
pub const ERR_NODE: u32 = 3;
/// No protocol version in common.
pub const ERR_VERSION: u32 = 4;
/// The peer broke the protocol (malformed frame, unexpected packet).
pub const ERR_PROTOCOL: u32 = 5;
/// The peer authenticated, but this side is StandAlone towards it (an administrator's
/// `tandem disconnect`, or a split brain): it accepts no session until `tandem connect`.
/// Not a fault: the dialer retries at its longest interval and says so once.
pub const ERR_STANDALONE: u32 = 6;

/// The two ends' TLS modes differ, or TLS failed (the peer's certificate refused).
pub const ERR_TLS: u32 = 7;

/// `Hello` feature bit: the sender's peer links run TLS with certificates.
pub const TLS_CERTIFICATES: u64 = 1 << 62;
/// `Hello` feature bit: the sender's peer links run TLS authenticated by the shared secret.
pub const TLS_SECRET: u64 = 1 << 63;
const TLS_BITS: u64 = TLS_CERTIFICATES | TLS_SECRET;

/// TLS on a resource's peer links (its `tls` setting), the same on every node of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerTls {
    /// In the clear.
    #[default]
    Off,
    /// Mutual X.509: each node's certificate signed by the resource's CA.
    Certificates,
    /// Ephemeral certificates trusted by no one; the shared secret's challenge-response,
    /// bound to the TLS channel, authenticates both ends.
    Secret,
}

impl PeerTls {
    fn bits(self) -> u64 {
        match self {
            PeerTls::Off => 0,
            PeerTls::Certificates => TLS_CERTIFICATES,
            PeerTls::Secret => TLS_SECRET,
        }
    }

    /// The mode a `Hello`'s features say; `None` for both bits at once.
    fn of_bits(features: u64) -> Option<PeerTls> {
        match features & TLS_BITS {
            0 => Some(PeerTls::Off),
            TLS_CERTIFICATES => Some(PeerTls::Certificates),
            TLS_SECRET => Some(PeerTls::Secret),
            _ => None,
        }
    }
}

impl fmt::Display for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerTls::Off => "off",
            PeerTls::Certificates => "certificates",
            PeerTls::Secret => "secret",
        })
    }
}

/// The message sent with [`ERR_AUTH`].
pub const AUTH_FAILED_MESSAGE: &str = "authentication failed: the shared secrets differ";

/// Longest string the packet layer carries (longer ones are cut by `encode`).
const MAX_STRING: usize = 4096;
/// Longest message this side puts into an `Error` packet.
const MAX_ERROR_MESSAGE: usize = 1024;

/// Largest body of a packet exchanged during the handshake (a `Hello` with the longest
/// resource name). Longer frames are refused from their header, before their body is buffered.
pub const MAX_HANDSHAKE_BODY: u32 = (2 + 2 + 8 + 1 + 2 + MAX_STRING + CHALLENGE_LEN) as u32;

/// On a port several resources share, the resource a caller asks for: the one its first
/// frame, a `Hello`, names. `Ok(None)` while that frame is not whole in `input` (the
/// bytes are peeked, not taken: the handshake of that resource then reads them). A first
/// frame that is not a `Hello`, or too large for one, is a protocol error.
pub fn hello_resource(input: &[u8]) -> Result<Option<String>, ProtocolError> {
    let Some(hdr) = input.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let magic = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    if magic != MAGIC {
        return Err(ProtocolError::Wire(WireError::BadMagic(magic)));
    }
    let kind = u16::from_be_bytes([hdr[4], hdr[5]]);
    let len = u32::from_be_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]);
    if len > MAX_HANDSHAKE_BODY {
        return Err(ProtocolError::FrameTooLarge { kind, len });
    }
    let Some(frame) = input.get(..HEADER_LEN + len as usize) else {
        return Ok(None);
    };
    match decode(frame)? {
        Decoded::Packet(Packet::Hello { resource, .. }, _) => Ok(Some(resource.to_owned())),
        Decoded::Packet(p, _) => Err(ProtocolError::Unexpected {
            expected: "Hello",
            got: packet_name(&p),
        }),
        Decoded::NeedMore(_) => Ok(None),
    }
}

/// The `Error` packet refusing a caller on a shared port before any handshake began (no
/// resource of that name there, or a first frame that is not a `Hello`).
pub fn refusal(code: u32, message: &str, out: &mut Vec<u8>) {
    let message = truncate(sanitize(message), MAX_ERROR_MESSAGE);
    encode(
        &Packet::Error {
            code,
            message: &message,
        },
        out,
    );
}

/// What one side of a connection needs for the handshake.
#[derive(Clone, PartialEq, Eq)]
pub struct HandshakeConfig {
    /// Our node id.
    pub me: u8,
    pub resource: String,
    /// The resource's shared secret.
    pub secret: Vec<u8>,
    /// Node ids configured for this resource, not including `me`.
    pub allowed_peers: Vec<u8>,
    /// For outgoing connections: the node we dialed.
    pub expect: Option<u8>,
    /// Feature bits this side supports.
    pub features: u64,
    /// Peers this side is StandAlone towards: refused with [`ERR_STANDALONE`] once they
    /// proved they know the secret (an unauthenticated caller learns nothing of our state).
    pub standalone_towards: Vec<u8>,
}

impl fmt::Debug for HandshakeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandshakeConfig")
            .field("me", &self.me)
            .field("resource", &self.resource)
            .field("secret", &"<redacted>")
            .field("allowed_peers", &self.allowed_peers)
            .field("expect", &self.expect)
            .field("features", &self.features)
            .field("standalone_towards", &self.standalone_towards)
            .finish()
    }
}

/// The outcome of a successful handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Established {
    /// The peer's (authenticated) node id.
    pub peer: u8,
    /// The protocol version of the session: the highest both sides speak.
    pub version: u16,
    /// Features both sides support.
    pub features: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Send what was produced, then feed more bytes.
    NeedMore,
    /// Both ends want TLS: send what was produced in the clear, then run TLS over the
    /// socket (the dialer as the client); bytes not consumed are the start of TLS. Once
    /// TLS is up, call [`PeerHandshake::tls_up`] and feed what TLS decrypts.
    StartTls,
    /// Authenticated. Bytes not consumed belong to the session.
    Established(Established),
    /// The connection is to be closed (after sending what was produced: it may hold an
    /// `Error` packet telling the peer why).
    Failed(HandshakeError),
}

/// A breach of the protocol by the peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    #[error(
        "a frame of kind {kind} with {len} bytes during the handshake, where packets have at most {} bytes",
        MAX_HANDSHAKE_BODY
    )]
    FrameTooLarge { kind: u16, len: u32 },
    #[error("expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
}

/// Why a handshake failed. The messages name both nodes where they are known and are phrased
/// so that they read the same on both ends of the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error(
        "no common protocol version: node {peer} speaks versions {peer_min}..={peer_max}, node {me} speaks {our_min}..={our_max}"
    )]
    VersionMismatch {
        me: u8,
        peer: u8,
        peer_min: u16,
        peer_max: u16,
        our_min: u16,
        our_max: u16,
    },
    #[error(
        "resource mismatch: node {peer} asked for resource {theirs:?}, node {me} is configured for resource {ours:?}"
    )]
    ResourceMismatch {
        me: u8,
        peer: u8,
        ours: String,
        theirs: String,
    },
    #[error(
        "node id conflict: both ends of the connection claim node id {id} (two nodes configured with the same id, or a node connected to itself)"
    )]
    SameNodeId { id: u8 },
    #[error("node {peer} is not configured as a peer of node {me} for resource {resource:?}")]
    UnknownPeer { me: u8, peer: u8, resource: String },
    #[error("node {me} dialed node {expected}, but node {peer} answered")]
    UnexpectedPeer { me: u8, expected: u8, peer: u8 },
    #[error(
        "authentication of node {peer} for resource {resource:?} failed: the shared secrets differ"
    )]
    AuthFailed { peer: u8, resource: String },
    #[error(
        "node {me} is StandAlone towards node {peer} for resource {resource:?}: no connection until `tandem connect` on node {me}"
    )]
    StandAlone { me: u8, peer: u8, resource: String },
    #[error(
        "TLS mismatch on the peer links of resource {resource:?}: node {me} has tls = \"{ours}\", node {peer} has tls = \"{theirs}\" (set the same tls on every node)"
    )]
    TlsMismatch {
        me: u8,
        peer: u8,
        resource: String,
        ours: PeerTls,
        theirs: PeerTls,
    },
    #[error("TLS with node {} failed: {reason}", .peer.map_or("?".to_string(), |p| p.to_string()))]
    Tls { peer: Option<u8>, reason: String },
    #[error("the peer refused the connection: {} (code {code})", sanitize(.message))]
    PeerRefused { code: u32, message: String },
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolError),
}

impl HandshakeError {
    /// The `Error` code that goes with this error: the one this side sends to the peer, or for
    /// [`HandshakeError::PeerRefused`] the one the peer sent.
    pub fn code(&self) -> u32 {
        match self {
            HandshakeError::VersionMismatch { .. } => ERR_VERSION,
            HandshakeError::ResourceMismatch { .. } => ERR_RESOURCE,
            HandshakeError::SameNodeId { .. }
            | HandshakeError::UnknownPeer { .. }
            | HandshakeError::UnexpectedPeer { .. } => ERR_NODE,
            HandshakeError::AuthFailed { .. } => ERR_AUTH,
            HandshakeError::StandAlone { .. } => ERR_STANDALONE,
            HandshakeError::TlsMismatch { .. } | HandshakeError::Tls { .. } => ERR_TLS,
            HandshakeError::PeerRefused { code, .. } => *code,
            HandshakeError::Protocol(_) => ERR_PROTOCOL,
        }
    }
}

/// Escapes control characters of a message that came from the peer, so it cannot forge
/// log lines.
fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn packet_name(p: &Packet<'_>) -> &'static str {
    match p {
        Packet::Hello { .. } => "Hello",
        Packet::Auth { .. } => "Auth",
        Packet::AuthOk => "AuthOk",
        Packet::Role { .. } => "Role",
        Packet::Volume { .. } => "Volume",
        Packet::Generation { .. } => "Generation",
        Packet::GenAck { .. } => "GenAck",
        Packet::Abandoned { .. } => "Abandoned",
        Packet::Write { .. } => "Write",
        Packet::Zero { .. } => "Zero",
        Packet::RecvAck { .. } => "RecvAck",
        Packet::WriteAck { .. } => "WriteAck",
        Packet::NegAck { .. } => "NegAck",
        Packet::Barrier { .. } => "Barrier",
        Packet::BarrierAck { .. } => "BarrierAck",
        Packet::PeerAck { .. } => "PeerAck",
        Packet::PrimaryLost { .. } => "PrimaryLost",
        Packet::InSync { .. } => "InSync",
        Packet::Primaries { .. } => "Primaries",
        Packet::Leaving => "Leaving",
        Packet::SyncProgress { .. } => "SyncProgress",
        Packet::VotersBehind { .. } => "VotersBehind",
        Packet::Outdated { .. } => "Outdated",
        Packet::ReadReq { .. } => "ReadReq",
        Packet::ReadReply { .. } => "ReadReply",
        Packet::AllocReq { .. } => "AllocReq",
        Packet::AllocReply { .. } => "AllocReply",
        Packet::ResyncReq { .. } => "ResyncReq",
        Packet::ResyncReply { .. } => "ResyncReply",
        Packet::OutOfSync { .. } => "OutOfSync",
        Packet::Ping => "Ping",
        Packet::PingAck => "PingAck",
        Packet::SplitBrain { .. } => "SplitBrain",
        Packet::Error { .. } => "Error",
    }
}

/// What the peer has told us so far (from its `Hello`).
#[derive(Clone, Copy, Debug)]
struct Peer {
    id: u8,
    version: u16,
    features: u64,
}

#[derive(Clone, Debug)]
enum State {
    /// Hello sent; waiting for the peer's Hello.
    AwaitHello,
    /// Both want TLS: waiting for the driver's `tls_up`, with the peer's challenge.
    AwaitTls(Peer, [u8; CHALLENGE_LEN]),
    /// Auth sent; waiting for the peer's Auth.
    AwaitAuth(Peer),
    /// AuthOk sent; waiting for the peer's AuthOk.
    AwaitAuthOk(Peer),
    /// Established or failed; nothing more is consumed.
    Done(HandshakeStep),
}

/// The handshake of one peer connection. See the [module documentation](self).
pub struct PeerHandshake {
    cfg: HandshakeConfig,
    tls: PeerTls,
    /// The TLS channel's `tls-exporter` value, once TLS is up: `Auth` is bound to it.
    binding: Option<[u8; auth::EXPORTER_LEN]>,
    challenge: [u8; CHALLENGE_LEN],
    state: State,
    /// The node id of an accepted `Hello`, kept after a later failure so the caller can
    /// say which peer failed even when Hello and the bad Auth arrived in one read.
    claimed: Option<u8>,
    /// The part of the next frame received so far (at most one frame, bounded by
    /// [`MAX_HANDSHAKE_BODY`]).
    pending: Vec<u8>,
}

impl fmt::Debug for PeerHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerHandshake")
            .field("cfg", &self.cfg)
            .field("state", &self.state)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl PeerHandshake {
    /// Starts the handshake: appends our `Hello` to `out`. `challenge` must be fresh random
    /// bytes for every connection.
    pub fn new(cfg: HandshakeConfig, challenge: [u8; 32], out: &mut Vec<u8>) -> PeerHandshake {
        PeerHandshake::with_tls(cfg, PeerTls::Off, challenge, out)
    }

    /// [`PeerHandshake::new`] for peer links with TLS mode `tls` (see the module's
    /// documentation): the `Hello` says it, and a peer with another mode is refused.
    pub fn with_tls(
        cfg: HandshakeConfig,
        tls: PeerTls,
        challenge: [u8; 32],
        out: &mut Vec<u8>,
    ) -> PeerHandshake {
        debug_assert!(
            cfg.resource.len() <= MAX_STRING,
            "resource names are at most {MAX_STRING} bytes on the wire"
        );
        encode(
            &Packet::Hello {
                version_min: VERSION_MIN,
                version_max: VERSION_MAX,
                features: (cfg.features & !TLS_BITS) | tls.bits(),
                node_id: cfg.me,
                resource: &cfg.resource,
                challenge,
            },
            out,
        );
        PeerHandshake {
            cfg,
            tls,
            binding: None,
            challenge,
            state: State::AwaitHello,
            claimed: None,
            pending: Vec::new(),
        }
    }

    /// Feeds bytes received from the peer; appends what is to be sent to `out`. Returns how
    /// many bytes of `input` were consumed and where the handshake stands:
    ///
    /// - [`HandshakeStep::NeedMore`]: all of `input` was consumed (a partial frame is kept
    ///   internally, so `input` may be split anywhere);
    /// - [`HandshakeStep::Established`]: `input[consumed..]` is the start of the session;
    /// - [`HandshakeStep::StartTls`]: send `out`, then start TLS; `input[consumed..]` is
    ///   the start of it;
    /// - [`HandshakeStep::Failed`]: send `out`, then close the connection.
    ///
    /// Once established or failed, further calls consume nothing and return the same step.
    /// While TLS starts, bytes fed are taken for packets sent in the clear instead of TLS:
    /// the peer's `Error` (it refused our `Hello`) ends the handshake with its reason,
    /// anything else is a protocol violation.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> (usize, HandshakeStep) {
        if let State::Done(step) = &self.state {
            return (0, step.clone());
        }
        let mut used = 0;
        loop {
            let need = match self.frame_need() {
                Ok(n) => n,
                Err(e) => return (used, self.fail(e, out)),
            };
            if self.pending.len() < need {
                let rest = &input[used..];
                let take = (need - self.pending.len()).min(rest.len());
                self.pending.extend_from_slice(&rest[..take]);
                used += take;
                if self.pending.len() < need {
                    return (used, HandshakeStep::NeedMore);
                }
                // The header may just have completed: find out how long the frame is.
                continue;
            }
            let frame = std::mem::take(&mut self.pending);
            let step = self.on_frame(&frame, out);
            self.pending = frame;
            self.pending.clear();
            if let Some(step) = step {
                return (used, step);
            }
        }
    }

    /// The peer's node id, once its `Hello` was accepted — also after the handshake failed
    /// later (it is not authenticated before [`HandshakeStep::Established`]).
    pub fn peer(&self) -> Option<u8> {
        match &self.state {
            State::Done(HandshakeStep::Established(e)) => Some(e.peer),
            _ => self.claimed,
        }
    }

    /// Waiting for TLS to come up ([`HandshakeStep::StartTls`] was returned).
    pub fn awaits_tls(&self) -> bool {
        matches!(self.state, State::AwaitTls(..))
    }

    /// TLS is up; `binding` is its RFC 9266 `tls-exporter` value. Appends our `Auth`,
    /// bound to the channel, to `out` (to be sent inside TLS); then feed what TLS
    /// decrypts. Does nothing unless [`PeerHandshake::awaits_tls`].
    pub fn tls_up(&mut self, binding: &[u8; auth::EXPORTER_LEN], out: &mut Vec<u8>) {
        let State::AwaitTls(peer, their_challenge) = self.state.clone() else {
            return;
        };
        let response = auth::respond_bound(
            &self.cfg.secret,
            &self.cfg.resource,
            self.cfg.me,
            &their_challenge,
            binding,
        );
        encode(&Packet::Auth { response }, out);
        self.binding = Some(*binding);
        self.state = State::AwaitAuth(peer);
    }

    /// TLS failed (`reason`: the TLS error, or what is wrong with the peer's certificate):
    /// the handshake ends. With `tell`, TLS is up and an `Error` saying why is appended to
    /// `out` (for the peer to log); a failed TLS handshake has no channel left to say it.
    pub fn tls_failed(&mut self, reason: String, tell: bool, out: &mut Vec<u8>) -> HandshakeStep {
        if let State::Done(step) = &self.state {
            return step.clone();
        }
        let e = HandshakeError::Tls {
            peer: self.claimed,
            reason,
        };
        if !tell {
            let step = HandshakeStep::Failed(e);
            self.state = State::Done(step.clone());
            return step;
        }
        self.fail(e, out)
    }

    /// The final step, once established or failed.
    pub fn outcome(&self) -> Option<&HandshakeStep> {
        match &self.state {
            State::Done(step) => Some(step),
            _ => None,
        }
    }

    /// How many bytes `pending` must hold to make the next step: the header, then the frame.
    fn frame_need(&self) -> Result<usize, HandshakeError> {
        let Some(hdr) = self.pending.get(..HEADER_LEN) else {
            return Ok(HEADER_LEN);
        };
        let magic = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        if magic != MAGIC {
            return Err(ProtocolError::Wire(WireError::BadMagic(magic)).into());
        }
        let kind = u16::from_be_bytes([hdr[4], hdr[5]]);
        let len = u32::from_be_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]);
        if len > MAX_HANDSHAKE_BODY {
            return Err(ProtocolError::FrameTooLarge { kind, len }.into());
        }
        Ok(HEADER_LEN + len as usize)
    }

    /// Handles one complete frame; returns the step if the handshake ended.
    fn on_frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Option<HandshakeStep> {
        let packet = match decode(frame) {
            Ok(Decoded::Packet(p, _)) => p,
            // Cannot happen: `frame` holds as many bytes as its header announces.
            Ok(Decoded::NeedMore(_)) => {
                let e = WireError::Malformed {
                    kind: 0,
                    what: "incomplete frame",
                };
                return Some(self.fail(ProtocolError::Wire(e).into(), out));
            }
            Err(e) => return Some(self.fail(ProtocolError::Wire(e).into(), out)),
        };
        let result = match (packet, self.state.clone()) {
            (Packet::Error { code, message }, _) => Err(HandshakeError::PeerRefused {
                code,
                message: message.to_owned(),
            }),
            (
                Packet::Hello {
                    version_min,
                    version_max,
                    features,
                    node_id,
                    resource,
                    challenge,
                },
                State::AwaitHello,
            ) => match self.check_hello(version_min, version_max, node_id, resource, features) {
                Ok(version) => {
                    let peer = Peer {
                        id: node_id,
                        version,
                        features: features & self.cfg.features & !TLS_BITS,
                    };
                    self.claimed = Some(node_id);
                    if self.tls != PeerTls::Off {
                        // Auth goes inside TLS, bound to it (`tls_up`).
                        self.state = State::AwaitTls(peer, challenge);
                        return Some(HandshakeStep::StartTls);
                    }
                    let response = auth::respond(
                        &self.cfg.secret,
                        &self.cfg.resource,
                        self.cfg.me,
                        &challenge,
                    );
                    encode(&Packet::Auth { response }, out);
                    self.state = State::AwaitAuth(peer);
                    Ok(())
                }
                Err(e) => {
                    // A configured peer: its failures are told apart from strangers' (the
                    // driver says a repeated one once).
                    if matches!(e, HandshakeError::TlsMismatch { .. }) {
                        self.claimed = Some(node_id);
                    }
                    Err(e)
                }
            },
            (Packet::Auth { response }, State::AwaitAuth(peer)) => {
                self.check_auth(peer.id, &response).and_then(|()| {
                    if self.cfg.standalone_towards.contains(&peer.id) {
                        return Err(HandshakeError::StandAlone {
                            me: self.cfg.me,
                            peer: peer.id,
                            resource: self.cfg.resource.clone(),
                        });
                    }
                    encode(&Packet::AuthOk, out);
                    self.state = State::AwaitAuthOk(peer);
                    Ok(())
                })
            }
            (Packet::AuthOk, State::AwaitAuthOk(peer)) => {
                let step = HandshakeStep::Established(Established {
                    peer: peer.id,
                    version: peer.version,
                    features: peer.features,
                });
                self.state = State::Done(step.clone());
                return Some(step);
            }
            (p, state) => Err(ProtocolError::Unexpected {
                expected: match state {
                    State::AwaitHello => "Hello",
                    State::AwaitTls(..) => "TLS",
                    State::AwaitAuth(_) => "Auth",
                    State::AwaitAuthOk(_) => "AuthOk",
                    State::Done(_) => "nothing",
                },
                got: packet_name(&p),
            }
            .into()),
        };
        match result {
            Ok(()) => None,
            Err(e) => Some(self.fail(e, out)),
        }
    }

    /// Checks the peer's Hello; returns the version of the session.
    fn check_hello(
        &self,
        version_min: u16,
        version_max: u16,
        node_id: u8,
        resource: &str,
        features: u64,
    ) -> Result<u16, HandshakeError> {
        let me = self.cfg.me;
        let version = version_max.min(VERSION_MAX);
        if version < version_min.max(VERSION_MIN) {
            return Err(HandshakeError::VersionMismatch {
                me,
                peer: node_id,
                peer_min: version_min,
                peer_max: version_max,
                our_min: VERSION_MIN,
                our_max: VERSION_MAX,
            });
        }
        if resource != self.cfg.resource {
            return Err(HandshakeError::ResourceMismatch {
                me,
                peer: node_id,
                ours: self.cfg.resource.clone(),
                theirs: resource.to_owned(),
            });
        }
        if node_id == me {
            return Err(HandshakeError::SameNodeId { id: me });
        }
        match self.cfg.expect {
            Some(expected) if expected != node_id => {
                return Err(HandshakeError::UnexpectedPeer {
                    me,
                    expected,
                    peer: node_id,
                });
            }
            _ => {}
        }
        if !self.cfg.allowed_peers.contains(&node_id) {
            return Err(HandshakeError::UnknownPeer {
                me,
                peer: node_id,
                resource: self.cfg.resource.clone(),
            });
        }
        match PeerTls::of_bits(features) {
            Some(theirs) if theirs == self.tls => {}
            Some(theirs) => {
                return Err(HandshakeError::TlsMismatch {
                    me,
                    peer: node_id,
                    resource: self.cfg.resource.clone(),
                    ours: self.tls,
                    theirs,
                })
            }
            None => {
                let e = WireError::Malformed {
                    kind: 1, // Hello
                    what: "a Hello with two TLS modes",
                };
                return Err(ProtocolError::Wire(e).into());
            }
        }
        Ok(version)
    }

    fn check_auth(&self, peer: u8, response: &[u8; RESPONSE_LEN]) -> Result<(), HandshakeError> {
        let (secret, resource) = (&self.cfg.secret, &self.cfg.resource);
        let ok = match &self.binding {
            // Under TLS always bound: a response relayed from another channel fails.
            Some(b) => auth::verify_bound(secret, resource, peer, &self.challenge, b, response),
            None => auth::verify(secret, resource, peer, &self.challenge, response),
        };
        if ok {
            Ok(())
        } else {
            Err(HandshakeError::AuthFailed {
                peer,
                resource: self.cfg.resource.clone(),
            })
        }
    }

    /// Ends the handshake with `e`; unless the peer refused us, tells it why first.
    fn fail(&mut self, e: HandshakeError, out: &mut Vec<u8>) -> HandshakeStep {
        let message = match &e {
            HandshakeError::PeerRefused { .. } => None,
            HandshakeError::AuthFailed { .. } => Some(AUTH_FAILED_MESSAGE.to_owned()),
            HandshakeError::Protocol(p) => Some(format!(
                "node {} saw a protocol violation: {p}",
                self.cfg.me
            )),
            other => Some(other.to_string()),
        };
        if let Some(message) = message {
            let message = truncate(message, MAX_ERROR_MESSAGE);
            encode(
                &Packet::Error {
                    code: e.code(),
                    message: &message,
                },
                out,
            );
        }
        let step = HandshakeStep::Failed(e);
        self.state = State::Done(step.clone());
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_port_finds_the_resource_of_a_whole_hello_only() {
        let cfg = HandshakeConfig {
            me: 1,
            resource: "r7".into(),
            secret: b"s".to_vec(),
            allowed_peers: vec![0],
            expect: None,
            features: 0,
            standalone_towards: Vec::new(),
        };
        let mut hello = Vec::new();
        let _ = PeerHandshake::new(cfg, [7; 32], &mut hello);
        for cut in 0..hello.len() {
            assert_eq!(hello_resource(&hello[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(hello_resource(&hello), Ok(Some("r7".into())));
        let mut err = Vec::new();
        refusal(ERR_RESOURCE, "no", &mut err);
        assert!(matches!(
            hello_resource(&err),
            Err(ProtocolError::Unexpected {
                expected: "Hello",
                ..
            })
        ));
        assert!(hello_resource(b"GET / HTTP/1.1\r\n\r\n").is_err());
        let mut huge = hello.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            hello_resource(&huge),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc".into(), 5), "abc");
        assert_eq!(truncate("abcdef".into(), 3), "abc");
        // 'é' is two bytes: cutting at 2 would split it.
        assert_eq!(truncate("aé".into(), 2), "a");
        assert_eq!(truncate("aé".into(), 3), "aé");
    }

    #[test]
    fn sanitize_escapes_control_characters() {
        assert_eq!(sanitize("ok: \"r0\""), "ok: \"r0\"");
        assert_eq!(sanitize("a\nb\x1b[2J"), "a\\nb\\u{1b}[2J");
    }

    #[test]
    fn max_handshake_body_fits_the_largest_hello_and_error() {
        let long = "x".repeat(MAX_STRING);
        let mut b = Vec::new();
        encode(
            &Packet::Hello {
                version_min: 1,
                version_max: 1,
                features: 0,
                node_id: 0,
                resource: &long,
                challenge: [0; 32],
            },
            &mut b,
        );
        assert_eq!(b.len() - HEADER_LEN, MAX_HANDSHAKE_BODY as usize);
        b.clear();
        encode(
            &Packet::Error {
                code: 1,
                message: &long,
            },
            &mut b,
        );
        assert!(b.len() - HEADER_LEN <= MAX_HANDSHAKE_BODY as usize);
    }

    #[test]
    fn error_messages_we_send_are_bounded_and_valid_utf8() {
        // A peer with a huge, multi-byte resource name: our refusal must still decode.
        let theirs = "é".repeat(2000);
        let mut out = Vec::new();
        let mut hs = PeerHandshake::new(
            HandshakeConfig {
                me: 1,
                resource: "r0".into(),
                secret: b"s".to_vec(),
                allowed_peers: vec![2],
                expect: None,
                features: 0,
                standalone_towards: Vec::new(),
            },
            [1; 32],
            &mut out,
        );
        out.clear();
        let mut hello = Vec::new();
        encode(
            &Packet::Hello {
                version_min: VERSION_MIN,
                version_max: VERSION_MAX,
                features: 0,
                node_id: 2,
                resource: &theirs,
                challenge: [2; 32],
            },
            &mut hello,
        );
        let (n, step) = hs.feed(&hello, &mut out);
        assert_eq!(n, hello.len());
        assert!(matches!(
            step,
            HandshakeStep::Failed(HandshakeError::ResourceMismatch { .. })
        ));
        match decode(&out).unwrap() {
            Decoded::Packet(Packet::Error { code, message }, len) => {
                assert_eq!(len, out.len());
                assert_eq!(code, ERR_RESOURCE);
                assert!(message.len() <= MAX_ERROR_MESSAGE);
                assert!(message.starts_with("resource mismatch: node 2"));
            }
            other => panic!("expected an Error packet, got {other:?}"),
        }
    }

    fn tls_cfg(me: u8, peer: u8) -> HandshakeConfig {
        HandshakeConfig {
            me,
            resource: "r0".into(),
            secret: b"s3cret".to_vec(),
            allowed_peers: vec![peer],
            expect: None,
            features: crate::features::SYNC_PROGRESS,
            standalone_towards: Vec::new(),
        }
    }

    /// Two sides after their Hellos crossed: (side, its step, what it sent since).
    fn hellos(a: PeerTls, b: PeerTls) -> [(PeerHandshake, HandshakeStep, Vec<u8>); 2] {
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        let mut x = PeerHandshake::with_tls(tls_cfg(1, 2), a, [1; 32], &mut ha);
        let mut y = PeerHandshake::with_tls(tls_cfg(2, 1), b, [2; 32], &mut hb);
        let (mut ox, mut oy) = (Vec::new(), Vec::new());
        let (n, sx) = x.feed(&hb, &mut ox);
        assert_eq!(n, hb.len());
        let (n, sy) = y.feed(&ha, &mut oy);
        assert_eq!(n, ha.len());
        [(x, sx, ox), (y, sy, oy)]
    }

    #[test]
    fn tls_starts_after_the_hellos_and_auth_is_bound_to_the_channel() {
        for mode in [PeerTls::Certificates, PeerTls::Secret] {
            let [(mut x, sx, ox), (mut y, sy, oy)] = hellos(mode, mode);
            assert_eq!((sx, sy), (HandshakeStep::StartTls, HandshakeStep::StartTls));
            assert!(
                ox.is_empty() && oy.is_empty(),
                "nothing in the clear after Hello"
            );
            assert!(x.awaits_tls() && y.awaits_tls());
            let binding = [9u8; auth::EXPORTER_LEN];
            let (mut ax, mut ay) = (Vec::new(), Vec::new());
            x.tls_up(&binding, &mut ax);
            y.tls_up(&binding, &mut ay);
            let (mut okx, mut oky) = (Vec::new(), Vec::new());
            assert_eq!(x.feed(&ay, &mut okx).1, HandshakeStep::NeedMore);
            assert_eq!(y.feed(&ax, &mut oky).1, HandshakeStep::NeedMore);
            let ex = x.feed(&oky, &mut Vec::new()).1;
            let ey = y.feed(&okx, &mut Vec::new()).1;
            match (ex, ey) {
                (HandshakeStep::Established(a), HandshakeStep::Established(b)) => {
                    assert_eq!((a.peer, b.peer), (2, 1));
                    assert_eq!(
                        a.features,
                        crate::features::SYNC_PROGRESS,
                        "TLS bits masked"
                    );
                }
                other => panic!("{mode}: not established: {other:?}"),
            }
        }
    }

    #[test]
    fn an_auth_relayed_from_another_tls_channel_fails() {
        let [(mut x, _, _), (mut y, _, _)] = hellos(PeerTls::Secret, PeerTls::Secret);
        // A man in the middle terminates TLS towards each side: two channels.
        let (mut ax, mut ay) = (Vec::new(), Vec::new());
        x.tls_up(&[1; auth::EXPORTER_LEN], &mut ax);
        y.tls_up(&[2; auth::EXPORTER_LEN], &mut ay);
        let mut out = Vec::new();
        let (_, step) = x.feed(&ay, &mut out);
        assert!(
            matches!(
                step,
                HandshakeStep::Failed(HandshakeError::AuthFailed { peer: 2, .. })
            ),
            "{step:?}"
        );
    }

    #[test]
    fn a_tls_mode_mismatch_is_refused_by_both_sides_in_the_clear() {
        for (a, b) in [
            (PeerTls::Secret, PeerTls::Off),
            (PeerTls::Off, PeerTls::Certificates),
            (PeerTls::Certificates, PeerTls::Secret),
        ] {
            let sides = hellos(a, b);
            for (side, step, out) in &sides {
                let HandshakeStep::Failed(e) = step else {
                    panic!("{a} vs {b}: {step:?}");
                };
                assert!(
                    matches!(e, HandshakeError::TlsMismatch { .. }),
                    "{a} vs {b}: {e:?}"
                );
                let msg = e.to_string();
                assert!(
                    msg.contains("TLS mismatch") && msg.contains("tls = "),
                    "{msg}"
                );
                assert!(!side.awaits_tls());
                match decode(out).unwrap() {
                    Decoded::Packet(Packet::Error { code, message }, _) => {
                        assert_eq!(code, ERR_TLS);
                        assert_eq!(message, msg);
                    }
                    other => panic!("not an Error: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn an_error_in_the_clear_instead_of_tls_ends_with_the_peers_reason() {
        let [(mut x, _, _), _] = hellos(PeerTls::Secret, PeerTls::Secret);
        let mut err = Vec::new();
        refusal(ERR_NODE, "node 1 is not configured", &mut err);
        let (_, step) = x.feed(&err, &mut Vec::new());
        assert!(
            matches!(&step, HandshakeStep::Failed(HandshakeError::PeerRefused { code: ERR_NODE, message }) if message.contains("not configured")),
            "{step:?}"
        );
    }

    #[test]
    fn tls_failed_ends_the_handshake_and_tells_the_peer_only_when_asked() {
        let [(mut x, _, _), (mut y, _, _)] = hellos(PeerTls::Secret, PeerTls::Secret);
        let mut out = Vec::new();
        let step = x.tls_failed("UnknownIssuer".into(), false, &mut out);
        assert!(out.is_empty());
        assert!(
            matches!(&step, HandshakeStep::Failed(e @ HandshakeError::Tls { peer: Some(2), .. }) if e.to_string() == "TLS with node 2 failed: UnknownIssuer"),
            "{step:?}"
        );
        assert_eq!(x.feed(b"more", &mut out), (0, step));
        y.tls_up(&[3; auth::EXPORTER_LEN], &mut Vec::new());
        let step = y.tls_failed("not its name".into(), true, &mut out);
        assert!(matches!(
            step,
            HandshakeStep::Failed(HandshakeError::Tls { .. })
        ));
        assert!(matches!(
            decode(&out).unwrap(),
            Decoded::Packet(Packet::Error { code: ERR_TLS, .. }, _)
        ));
    }

    #[test]
    fn without_tls_the_hello_carries_no_tls_bits() {
        let mut out = Vec::new();
        let _ = PeerHandshake::new(tls_cfg(1, 2), [1; 32], &mut out);
        match decode(&out).unwrap() {
            Decoded::Packet(Packet::Hello { features, .. }, _) => {
                assert_eq!(features, crate::features::SYNC_PROGRESS)
            }
            other => panic!("{other:?}"),
        }
    }
}
