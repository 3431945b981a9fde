//! The connection handshake, driven without sockets: two `PeerHandshake`s wired back to back,
//! or one of them against a scripted peer.

use proptest::prelude::*;
use tandem_wire::auth;
use tandem_wire::handshake::{
    Established, HandshakeConfig, HandshakeError, HandshakeStep, PeerHandshake, ProtocolError,
    AUTH_FAILED_MESSAGE, ERR_AUTH, ERR_NODE, ERR_PROTOCOL, ERR_RESOURCE, ERR_STANDALONE,
    ERR_VERSION, MAX_HANDSHAKE_BODY,
};
use tandem_wire::packet::Role;
use tandem_wire::{
    decode, encode, Decoded, Packet, WireError, HEADER_LEN, MAGIC, VERSION_MAX, VERSION_MIN,
};

const CH_A: [u8; 32] = [0xa1; 32];
const CH_B: [u8; 32] = [0xb2; 32];

/// Every feature bit (62 and 63 are not features: they carry the TLS mode).
const ALL_FEATURES: u64 =
    !(tandem_wire::handshake::TLS_CERTIFICATES | tandem_wire::handshake::TLS_SECRET);

fn cfg(me: u8, resource: &str, secret: &[u8], allowed: &[u8]) -> HandshakeConfig {
    HandshakeConfig {
        me,
        resource: resource.to_owned(),
        secret: secret.to_vec(),
        allowed_peers: allowed.to_vec(),
        expect: None,
        features: ALL_FEATURES,
        standalone_towards: Vec::new(),
    }
}

fn is_terminal(step: &HandshakeStep) -> bool {
    !matches!(step, HandshakeStep::NeedMore)
}

/// One end of a connection, with everything it sent and everything it left unconsumed.
struct Side {
    hs: PeerHandshake,
    out: Vec<u8>,
    /// How much of `out` was delivered to the other side.
    sent: usize,
    step: HandshakeStep,
    /// Bytes delivered to this side that it did not consume.
    leftover: Vec<u8>,
    /// Session bytes this side "sends" once established.
    session: Vec<u8>,
    feeds: usize,
}

impl Side {
    fn new(cfg: HandshakeConfig, challenge: [u8; 32]) -> Side {
        let mut out = Vec::new();
        let hs = PeerHandshake::new(cfg, challenge, &mut out);
        Side {
            hs,
            out,
            sent: 0,
            step: HandshakeStep::NeedMore,
            leftover: Vec::new(),
            session: Vec::new(),
            feeds: 0,
        }
    }

    fn with_session(mut self, session: Vec<u8>) -> Side {
        self.session = session;
        self
    }

    /// Feeds `chunk`, checking the consumption contract.
    fn deliver(&mut self, chunk: &[u8]) {
        if is_terminal(&self.step) {
            let before = self.out.len();
            let (n, step) = self.hs.feed(chunk, &mut self.out);
            assert_eq!(n, 0, "a finished handshake consumes nothing");
            assert_eq!(step, self.step, "a finished handshake keeps its outcome");
            assert_eq!(self.out.len(), before, "a finished handshake sends nothing");
            self.leftover.extend_from_slice(chunk);
            return;
        }
        self.feeds += 1;
        let (n, step) = self.hs.feed(chunk, &mut self.out);
        assert!(n <= chunk.len(), "consumed {n} of {} bytes", chunk.len());
        if step == HandshakeStep::NeedMore {
            assert_eq!(n, chunk.len(), "NeedMore leaves nothing unconsumed");
        }
        self.leftover.extend_from_slice(&chunk[n..]);
        if matches!(step, HandshakeStep::Established(_)) {
            let session = self.session.clone();
            self.out.extend_from_slice(&session);
        }
        self.step = step;
    }

    fn has_unsent(&self) -> bool {
        self.sent < self.out.len()
    }

    fn failed(&self) -> &HandshakeError {
        match &self.step {
            HandshakeStep::Failed(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    fn established(&self) -> Established {
        match &self.step {
            HandshakeStep::Established(e) => *e,
            other => panic!("expected an established handshake, got {other:?}"),
        }
    }
}

/// Sends one chunk from `src` to `dst`; `size` picks its length from what is pending.
fn send_chunk(src: &mut Side, dst: &mut Side, size: &mut impl FnMut(usize) -> usize) -> bool {
    if !src.has_unsent() {
        return false;
    }
    let pending = src.out.len() - src.sent;
    let n = size(pending).clamp(1, pending);
    let chunk = src.out[src.sent..src.sent + n].to_vec();
    src.sent += n;
    dst.deliver(&chunk);
    true
}

/// Moves bytes both ways, one chunk at a time in turn, until neither side has more to send.
fn pump(a: &mut Side, b: &mut Side, mut size: impl FnMut(usize) -> usize) {
    for _ in 0..100_000 {
        let ab = send_chunk(a, b, &mut size);
        let ba = send_chunk(b, a, &mut size);
        if !ab && !ba {
            return;
        }
    }
    panic!("the handshake does not settle");
}

fn whole(pending: usize) -> usize {
    pending
}

/// Decodes a byte stream that must consist of complete packets only.
fn packets(mut b: &[u8]) -> Vec<Packet<'_>> {
    let mut v = Vec::new();
    while !b.is_empty() {
        match decode(b).unwrap() {
            Decoded::Packet(p, n) => {
                v.push(p);
                b = &b[n..];
            }
            Decoded::NeedMore(_) => panic!("incomplete packet in stream"),
        }
    }
    v
}

fn enc(p: &Packet<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    encode(p, &mut b);
    b
}

fn hello(node_id: u8, resource: &str, vmin: u16, vmax: u16, challenge: [u8; 32]) -> Vec<u8> {
    enc(&Packet::Hello {
        version_min: vmin,
        version_max: vmax,
        features: 0,
        node_id,
        resource,
        challenge,
    })
}

/// The Error packet a side sent last.
fn last_error(out: &[u8]) -> (u32, String) {
    match packets(out).last() {
        Some(Packet::Error { code, message }) => (*code, message.to_string()),
        other => panic!("expected an Error packet last, got {other:?}"),
    }
}

fn pair(a: HandshakeConfig, b: HandshakeConfig) -> (Side, Side) {
    (Side::new(a, CH_A), Side::new(b, CH_B))
}

// ---------------------------------------------------------------------------------------------
// Success

#[test]
fn back_to_back_sides_establish() {
    let mut ca = cfg(1, "r0", b"s3cret", &[2, 3]);
    ca.expect = Some(2);
    ca.features = 0b1011;
    let mut cb = cfg(2, "r0", b"s3cret", &[1, 3]);
    cb.features = 0b0110;
    let (mut a, mut b) = pair(ca, cb);
    pump(&mut a, &mut b, whole);
    assert_eq!(
        a.established(),
        Established {
            peer: 2,
            version: VERSION_MAX,
            features: 0b0010
        }
    );
    assert_eq!(
        b.established(),
        Established {
            peer: 1,
            version: VERSION_MAX,
            features: 0b0010
        }
    );
    assert!(a.leftover.is_empty() && b.leftover.is_empty());
    assert_eq!(a.hs.peer(), Some(2));
    assert_eq!(a.hs.outcome(), Some(&a.step));
    // What went over the wire: exactly Hello, Auth, AuthOk each way.
    for (side, me, ch) in [(&a, 1, CH_A), (&b, 2, CH_B)] {
        let p = packets(&side.out);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            matches!(p[0], Packet::Hello { node_id, resource: "r0", challenge, version_min: VERSION_MIN, version_max: VERSION_MAX, .. } if node_id == me && challenge == ch)
        );
        assert!(matches!(p[1], Packet::Auth { .. }));
        assert_eq!(p[2], Packet::AuthOk);
    }
}

#[test]
fn hello_is_written_at_construction() {
    let mut out = vec![0xee];
    let hs = PeerHandshake::new(cfg(4, "data", b"k", &[5]), CH_A, &mut out);
    assert_eq!(out[0], 0xee, "appends, keeps what was there");
    assert_eq!(
        packets(&out[1..]),
        vec![Packet::Hello {
            version_min: VERSION_MIN,
            version_max: VERSION_MAX,
            features: ALL_FEATURES,
            node_id: 4,
            resource: "data",
            challenge: CH_A,
        }]
    );
    assert_eq!(hs.peer(), None);
    assert_eq!(hs.outcome(), None);
}

#[test]
fn one_byte_at_a_time_establishes() {
    let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"s3cret", &[1]));
    pump(&mut a, &mut b, |_| 1);
    assert_eq!(a.established().peer, 2);
    assert_eq!(b.established().peer, 1);
    assert_eq!(a.established().version, VERSION_MAX);
    assert!(a.leftover.is_empty() && b.leftover.is_empty());
    // Every byte went through its own feed call.
    assert_eq!(a.feeds, b.out.len());
    assert_eq!(b.feeds, a.out.len());
}

#[test]
fn bytes_after_auth_ok_stay_unconsumed() {
    let ping = enc(&Packet::Ping);
    let mut out_a = Vec::new();
    let mut a = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[2]), CH_A, &mut out_a);
    let mut out_b = Vec::new();
    let mut b = PeerHandshake::new(cfg(2, "r0", b"s3cret", &[1]), CH_B, &mut out_b);

    // B gets A's Hello, answers with Auth.
    let hello_a = std::mem::take(&mut out_a);
    assert_eq!(
        b.feed(&hello_a, &mut out_b),
        (hello_a.len(), HandshakeStep::NeedMore)
    );
    // A gets B's Hello and Auth, answers with Auth and AuthOk.
    let from_b = std::mem::take(&mut out_b);
    assert_eq!(
        a.feed(&from_b, &mut out_a),
        (from_b.len(), HandshakeStep::NeedMore)
    );
    assert_eq!(
        packets(&out_a)
            .iter()
            .map(|p| matches!(p, Packet::Auth { .. }) || *p == Packet::AuthOk)
            .collect::<Vec<_>>(),
        vec![true, true]
    );
    // B gets A's Auth, AuthOk and then the first session packet.
    let mut input = std::mem::take(&mut out_a);
    let handshake_len = input.len();
    input.extend_from_slice(&ping);
    let (n, step) = b.feed(&input, &mut out_b);
    assert_eq!(
        step,
        HandshakeStep::Established(Established {
            peer: 1,
            version: VERSION_MAX,
            features: ALL_FEATURES
        })
    );
    assert_eq!(n, handshake_len);
    assert_eq!(&input[n..], &ping[..]);
    assert_eq!(
        decode(&input[n..]).unwrap(),
        Decoded::Packet(Packet::Ping, ping.len())
    );
    assert_eq!(packets(&out_b), vec![Packet::AuthOk]);
    // Nothing more is consumed.
    assert_eq!(b.feed(&input[n..], &mut out_b), (0, step.clone()));
    // A gets B's AuthOk followed by a partial session packet: that stays unconsumed too.
    let mut input = std::mem::take(&mut out_b);
    let handshake_len = input.len();
    input.extend_from_slice(&ping[..5]);
    let (n, step) = a.feed(&input, &mut out_a);
    assert_eq!(
        step,
        HandshakeStep::Established(Established {
            peer: 2,
            version: VERSION_MAX,
            features: ALL_FEATURES
        })
    );
    assert_eq!(n, handshake_len);
    assert!(out_a.is_empty());
}

#[test]
fn session_bytes_sent_right_after_establishing_stay_unconsumed() {
    let mut session_a = enc(&Packet::Role {
        role: Role::Primary,
        incarnation: 1,
    });
    session_a.extend_from_slice(&enc(&Packet::Ping));
    let session_b = enc(&Packet::PingAck);
    for chunk in [usize::MAX, 1, 7] {
        let (a, b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"s3cret", &[1]));
        let (mut a, mut b) = (
            a.with_session(session_a.clone()),
            b.with_session(session_b.clone()),
        );
        pump(&mut a, &mut b, |_| chunk);
        assert_eq!(a.established().peer, 2);
        assert_eq!(b.established().peer, 1);
        assert_eq!(b.leftover, session_a, "chunks of {chunk}");
        assert_eq!(a.leftover, session_b, "chunks of {chunk}");
    }
}

/// A scripted peer whose Hello offers a wide version range: the highest common one is chosen.
#[test]
fn highest_common_version_is_chosen() {
    let mut out = Vec::new();
    let mut ca = cfg(1, "r0", b"s3cret", &[2]);
    ca.features = 0b1100;
    let mut a = PeerHandshake::new(ca, CH_A, &mut out);
    out.clear();
    let mut input = enc(&Packet::Hello {
        version_min: 0,
        version_max: u16::MAX,
        features: 0b0101,
        node_id: 2,
        resource: "r0",
        challenge: CH_B,
    });
    input.extend(enc(&Packet::Auth {
        response: auth::respond(b"s3cret", "r0", 2, &CH_A),
    }));
    input.extend(enc(&Packet::AuthOk));
    let (n, step) = a.feed(&input, &mut out);
    assert_eq!(n, input.len());
    assert_eq!(
        step,
        HandshakeStep::Established(Established {
            peer: 2,
            version: VERSION_MAX,
            features: 0b0100
        })
    );
    // Our response answers the peer's challenge and verifies with the shared secret.
    match packets(&out)[..] {
        [Packet::Auth { response }, Packet::AuthOk] => {
            assert!(auth::verify(b"s3cret", "r0", 1, &CH_B, &response))
        }
        ref other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals

#[test]
fn wrong_secret_fails_on_both_sides() {
    let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"other", &[1]));
    pump(&mut a, &mut b, whole);
    // Each side verifies the other's response, so both detect the mismatch themselves.
    assert_eq!(
        *a.failed(),
        HandshakeError::AuthFailed {
            peer: 2,
            resource: "r0".into()
        }
    );
    assert_eq!(
        *b.failed(),
        HandshakeError::AuthFailed {
            peer: 1,
            resource: "r0".into()
        }
    );
    for side in [&a, &b] {
        assert_eq!(side.failed().code(), ERR_AUTH);
        assert!(side.failed().to_string().contains("secret"));
        assert_eq!(
            last_error(&side.out),
            (ERR_AUTH, AUTH_FAILED_MESSAGE.to_string())
        );
        assert!(!packets(&side.out).contains(&Packet::AuthOk));
    }
    assert!(a.failed().to_string().contains("node 2"));
}

#[test]
fn failed_side_still_names_the_claimed_peer() {
    // B's Hello and its (wrong) Auth reach A in one read: A still knows who claimed to
    // call, so the daemon can record the failure against that peer.
    let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"other", &[1]));
    let a_hello = std::mem::take(&mut a.out);
    b.deliver(&a_hello);
    let b_out = std::mem::take(&mut b.out);
    a.deliver(&b_out);
    assert!(matches!(
        a.failed(),
        HandshakeError::AuthFailed { peer: 2, .. }
    ));
    assert_eq!(a.hs.peer(), Some(2));
    // Before any Hello nobody is claimed.
    let (fresh, _) = fresh();
    assert_eq!(fresh.peer(), None);
}

#[test]
fn verifiers_refusal_reaches_the_other_side() {
    // A has the wrong secret and refuses B's response.
    let (mut a, mut b) = pair(cfg(1, "r0", b"wrong", &[2]), cfg(2, "r0", b"s3cret", &[1]));
    pump(&mut a, &mut b, whole);
    assert!(matches!(
        a.failed(),
        HandshakeError::AuthFailed { peer: 2, .. }
    ));
    // Replay A's Hello and its refusal (without its Auth) to a fresh B.
    let a_packets = packets(&a.out);
    let mut input = enc(&a_packets[0]);
    input.extend(enc(a_packets.last().unwrap()));
    let mut b = Side::new(cfg(2, "r0", b"s3cret", &[1]), CH_B);
    b.deliver(&input);
    let e = b.failed();
    assert_eq!(
        *e,
        HandshakeError::PeerRefused {
            code: ERR_AUTH,
            message: AUTH_FAILED_MESSAGE.into()
        }
    );
    assert!(e.to_string().contains("secret"), "{e}");
    assert_eq!(e.code(), ERR_AUTH);
    // No Error answers an Error.
    assert!(!packets(&b.out)
        .iter()
        .any(|p| matches!(p, Packet::Error { .. })));
}

#[test]
fn tampered_response_fails_authentication() {
    let mut out = Vec::new();
    let mut a = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[2]), CH_A, &mut out);
    let mut response = auth::respond(b"s3cret", "r0", 2, &CH_A);
    response[31] ^= 1;
    let mut input = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    input.extend(enc(&Packet::Auth { response }));
    let (n, step) = a.feed(&input, &mut out);
    assert_eq!(n, input.len());
    assert_eq!(
        step,
        HandshakeStep::Failed(HandshakeError::AuthFailed {
            peer: 2,
            resource: "r0".into()
        })
    );
    // A response by another node id (a reflected one) fails too.
    let mut out = Vec::new();
    let mut a = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[2]), CH_A, &mut out);
    let mut input = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    input.extend(enc(&Packet::Auth {
        response: auth::respond(b"s3cret", "r0", 1, &CH_A),
    }));
    assert!(matches!(
        a.feed(&input, &mut out).1,
        HandshakeStep::Failed(HandshakeError::AuthFailed { peer: 2, .. })
    ));
}

#[test]
fn different_resources_fail_on_both_sides() {
    let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r1", b"s3cret", &[1]));
    pump(&mut a, &mut b, whole);
    assert_eq!(
        *a.failed(),
        HandshakeError::ResourceMismatch {
            me: 1,
            peer: 2,
            ours: "r0".into(),
            theirs: "r1".into()
        }
    );
    assert_eq!(
        *b.failed(),
        HandshakeError::ResourceMismatch {
            me: 2,
            peer: 1,
            ours: "r1".into(),
            theirs: "r0".into()
        }
    );
    for side in [&a, &b] {
        assert_eq!(side.failed().code(), ERR_RESOURCE);
        let (code, message) = last_error(&side.out);
        assert_eq!(code, ERR_RESOURCE);
        assert!(
            message.contains("\"r0\"") && message.contains("\"r1\""),
            "{message}"
        );
        assert!(packets(&side.out).len() == 2, "Hello and Error only");
    }
    assert_eq!(
        a.failed().to_string(),
        "resource mismatch: node 2 asked for resource \"r1\", node 1 is configured for resource \"r0\""
    );
}

#[test]
fn unknown_node_is_refused() {
    // A is configured with peers 3 and 4 only; B (node 2) knows A.
    let (mut a, mut b) = pair(
        cfg(1, "r0", b"s3cret", &[3, 4]),
        cfg(2, "r0", b"s3cret", &[1]),
    );
    pump(&mut a, &mut b, whole);
    assert_eq!(
        *a.failed(),
        HandshakeError::UnknownPeer {
            me: 1,
            peer: 2,
            resource: "r0".into()
        }
    );
    let msg = a.failed().to_string();
    assert_eq!(
        msg,
        "node 2 is not configured as a peer of node 1 for resource \"r0\""
    );
    assert_eq!(
        *b.failed(),
        HandshakeError::PeerRefused {
            code: ERR_NODE,
            message: msg
        }
    );
    assert_eq!(a.failed().code(), ERR_NODE);
    assert_eq!(b.failed().code(), ERR_NODE);
    assert!(!packets(&a.out)
        .iter()
        .any(|p| matches!(p, Packet::Auth { .. })));
}

#[test]
fn unexpected_node_is_refused() {
    // A dialed node 3, but node 2 (also a configured peer) answered.
    let mut ca = cfg(1, "r0", b"s3cret", &[2, 3]);
    ca.expect = Some(3);
    let (mut a, mut b) = pair(ca, cfg(2, "r0", b"s3cret", &[1, 3]));
    pump(&mut a, &mut b, whole);
    assert_eq!(
        *a.failed(),
        HandshakeError::UnexpectedPeer {
            me: 1,
            expected: 3,
            peer: 2
        }
    );
    assert_eq!(
        a.failed().to_string(),
        "node 1 dialed node 3, but node 2 answered"
    );
    match b.failed() {
        HandshakeError::PeerRefused { code, message } => {
            assert_eq!(*code, ERR_NODE);
            assert_eq!(message, "node 1 dialed node 3, but node 2 answered");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn peer_claiming_my_id_is_refused() {
    // Both nodes configured with id 1.
    let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(1, "r0", b"s3cret", &[2]));
    pump(&mut a, &mut b, whole);
    for side in [&a, &b] {
        assert_eq!(*side.failed(), HandshakeError::SameNodeId { id: 1 });
        assert_eq!(last_error(&side.out).0, ERR_NODE);
    }
    // Even if the configuration lists the own id as a peer.
    let mut out = Vec::new();
    let mut a = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[1, 2]), CH_A, &mut out);
    let input = hello(1, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    assert_eq!(
        a.feed(&input, &mut out),
        (
            input.len(),
            HandshakeStep::Failed(HandshakeError::SameNodeId { id: 1 })
        )
    );
    assert_eq!(last_error(&out).0, ERR_NODE);
}

#[test]
fn versions_without_overlap_are_refused() {
    for (vmin, vmax) in [
        (VERSION_MAX + 1, VERSION_MAX + 5),
        (VERSION_MIN - 1, VERSION_MIN - 1),
        (VERSION_MAX, VERSION_MIN - 1), // an empty range
    ] {
        let mut out = Vec::new();
        let mut a = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[2]), CH_A, &mut out);
        out.clear();
        let input = hello(2, "r0", vmin, vmax, CH_B);
        let (n, step) = a.feed(&input, &mut out);
        assert_eq!(n, input.len());
        let expected = HandshakeError::VersionMismatch {
            me: 1,
            peer: 2,
            peer_min: vmin,
            peer_max: vmax,
            our_min: VERSION_MIN,
            our_max: VERSION_MAX,
        };
        assert_eq!(step, HandshakeStep::Failed(expected.clone()));
        assert_eq!(expected.code(), ERR_VERSION);
        let (code, message) = last_error(&out);
        assert_eq!(code, ERR_VERSION);
        assert_eq!(message, expected.to_string());
        assert!(message.starts_with("no common protocol version: node 2 speaks versions"));
        assert_eq!(packets(&out).len(), 1, "only the Error: no Auth");
    }
}

// ---------------------------------------------------------------------------------------------
// Protocol violations

fn fresh() -> (PeerHandshake, Vec<u8>) {
    let mut out = Vec::new();
    let hs = PeerHandshake::new(cfg(1, "r0", b"s3cret", &[2]), CH_A, &mut out);
    out.clear();
    (hs, out)
}

fn protocol_failure(input: &[u8]) -> (usize, ProtocolError, Vec<u8>) {
    let (mut hs, mut out) = fresh();
    let (n, step) = hs.feed(input, &mut out);
    match step {
        HandshakeStep::Failed(HandshakeError::Protocol(p)) => {
            assert_eq!(last_error(&out).0, ERR_PROTOCOL);
            (n, p, out)
        }
        other => panic!("expected a protocol failure, got {other:?}"),
    }
}

#[test]
fn garbage_is_a_protocol_failure() {
    let garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let (n, p, out) = protocol_failure(garbage);
    assert_eq!(
        p,
        ProtocolError::Wire(WireError::BadMagic(u32::from_be_bytes(*b"GET ")))
    );
    assert!(n <= garbage.len());
    let (_, message) = last_error(&out);
    assert!(message.contains("bad frame magic"), "{message}");

    // A valid magic with an unknown kind.
    let mut b = enc(&Packet::Ping);
    b[4..6].copy_from_slice(&999u16.to_be_bytes());
    assert_eq!(
        protocol_failure(&b).1,
        ProtocolError::Wire(WireError::UnknownKind(999))
    );

    // A truncated Hello body.
    let mut b = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    b.truncate(b.len() - 1);
    let len = (b.len() - HEADER_LEN) as u32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    assert!(matches!(
        protocol_failure(&b).1,
        ProtocolError::Wire(WireError::Malformed { kind: 1, .. })
    ));
}

#[test]
fn oversized_frame_fails_from_its_header() {
    // A bulk Write header announcing 1 MiB: refused without waiting for (or buffering) the body.
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC.to_be_bytes());
    b.extend_from_slice(&10u16.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&(1u32 << 20).to_be_bytes());
    b.extend_from_slice(&[0; 100]);
    let (n, p, _) = protocol_failure(&b);
    assert_eq!(
        p,
        ProtocolError::FrameTooLarge {
            kind: 10,
            len: 1 << 20
        }
    );
    assert_eq!(n, HEADER_LEN);
    // The largest possible Hello is not too large.
    let long = "x".repeat(4096);
    let (mut hs, mut out) = fresh();
    let input = hello(2, &long, VERSION_MIN, VERSION_MAX, CH_B);
    assert_eq!(input.len(), HEADER_LEN + MAX_HANDSHAKE_BODY as usize);
    assert!(matches!(
        hs.feed(&input, &mut out).1,
        HandshakeStep::Failed(HandshakeError::ResourceMismatch { .. })
    ));
}

#[test]
fn auth_before_hello_fails() {
    let input = enc(&Packet::Auth {
        response: auth::respond(b"s3cret", "r0", 2, &CH_A),
    });
    let (n, p, out) = protocol_failure(&input);
    assert_eq!(n, input.len());
    assert_eq!(
        p,
        ProtocolError::Unexpected {
            expected: "Hello",
            got: "Auth"
        }
    );
    assert_eq!(
        last_error(&out).1,
        "node 1 saw a protocol violation: expected Hello, got Auth"
    );
}

#[test]
fn packets_out_of_order_fail() {
    let hello_b = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    let auth_b = enc(&Packet::Auth {
        response: auth::respond(b"s3cret", "r0", 2, &CH_A),
    });
    let role = enc(&Packet::Role {
        role: Role::Primary,
        incarnation: 1,
    });
    let cases: Vec<(Vec<Vec<u8>>, &str, &str)> = vec![
        (vec![enc(&Packet::Ping)], "Hello", "Ping"),
        (vec![enc(&Packet::AuthOk)], "Hello", "AuthOk"),
        (vec![role.clone()], "Hello", "Role"),
        (vec![hello_b.clone(), hello_b.clone()], "Auth", "Hello"),
        (
            vec![hello_b.clone(), enc(&Packet::AuthOk)],
            "Auth",
            "AuthOk",
        ),
        (
            vec![hello_b.clone(), auth_b.clone(), auth_b.clone()],
            "AuthOk",
            "Auth",
        ),
        (
            vec![hello_b.clone(), auth_b.clone(), role.clone()],
            "AuthOk",
            "Role",
        ),
    ];
    for (frames, expected, got) in cases {
        let input = frames.concat();
        let (n, p, _) = protocol_failure(&input);
        assert_eq!(n, input.len(), "{expected}/{got}");
        assert_eq!(p, ProtocolError::Unexpected { expected, got });
    }
}

#[test]
fn error_from_the_peer_at_any_stage_is_a_refusal() {
    let hello_b = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    let auth_b = enc(&Packet::Auth {
        response: auth::respond(b"s3cret", "r0", 2, &CH_A),
    });
    let err = enc(&Packet::Error {
        code: 42,
        message: "going away\n[fake log line]",
    });
    for before in [vec![], vec![hello_b.clone()], vec![hello_b, auth_b]] {
        let (mut hs, mut out) = fresh();
        let input = [before.concat(), err.clone()].concat();
        let (n, step) = hs.feed(&input, &mut out);
        assert_eq!(n, input.len());
        let HandshakeStep::Failed(e) = step else {
            panic!("{step:?}")
        };
        assert_eq!(
            e,
            HandshakeError::PeerRefused {
                code: 42,
                message: "going away\n[fake log line]".into()
            }
        );
        assert_eq!(e.code(), 42);
        assert_eq!(
            e.to_string(),
            "the peer refused the connection: going away\\n[fake log line] (code 42)"
        );
        assert!(!packets(&out)
            .iter()
            .any(|p| matches!(p, Packet::Error { .. })));
    }
}

#[test]
fn finished_handshakes_consume_nothing() {
    let (mut hs, mut out) = fresh();
    let (_, step) = hs.feed(b"garbage garbage garbage", &mut out);
    assert!(matches!(
        step,
        HandshakeStep::Failed(HandshakeError::Protocol(_))
    ));
    let sent = out.len();
    for input in [
        &b""[..],
        b"x",
        &hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B),
    ] {
        assert_eq!(hs.feed(input, &mut out), (0, step.clone()));
    }
    assert_eq!(out.len(), sent);
    assert_eq!(hs.outcome(), Some(&step));
}

#[test]
fn empty_and_partial_input_need_more() {
    let (mut hs, mut out) = fresh();
    assert_eq!(hs.feed(&[], &mut out), (0, HandshakeStep::NeedMore));
    let input = hello(2, "r0", VERSION_MIN, VERSION_MAX, CH_B);
    assert_eq!(
        hs.feed(&input[..11], &mut out),
        (11, HandshakeStep::NeedMore)
    );
    assert_eq!(
        hs.feed(&input[11..13], &mut out),
        (2, HandshakeStep::NeedMore)
    );
    assert!(
        out.is_empty(),
        "nothing to answer before the Hello is complete"
    );
    assert_eq!(
        hs.feed(&input[13..], &mut out),
        (input.len() - 13, HandshakeStep::NeedMore)
    );
    assert!(matches!(packets(&out)[..], [Packet::Auth { .. }]));
    assert_eq!(hs.peer(), Some(2));
}

#[test]
fn config_debug_hides_the_secret() {
    let c = cfg(1, "r0", b"hunter2-secret", &[2]);
    let s = format!("{c:?}");
    assert!(!s.contains("hunter2"), "{s}");
    let mut out = Vec::new();
    let hs = PeerHandshake::new(c, CH_A, &mut out);
    assert!(!format!("{hs:?}").contains("hunter2"));
}

// ---------------------------------------------------------------------------------------------
// Properties

fn chunker(sizes: Vec<usize>) -> impl FnMut(usize) -> usize {
    let mut i = 0;
    move |_| {
        let s = sizes[i % sizes.len()];
        i += 1;
        s
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any split of the streams establishes both sides with the same outcome, and whatever a
    /// side sends after establishing (arbitrary bytes) is left to the session, byte for byte.
    #[test]
    fn random_splits_and_session_suffixes(
        sizes in prop::collection::vec(1usize..40, 1..20),
        suffix_a in prop::collection::vec(any::<u8>(), 0..64),
        suffix_b in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let (a, b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"s3cret", &[1]));
        let (mut a, mut b) = (a.with_session(suffix_a.clone()), b.with_session(suffix_b.clone()));
        pump(&mut a, &mut b, chunker(sizes));
        prop_assert_eq!(a.established(), Established { peer: 2, version: VERSION_MAX, features: ALL_FEATURES });
        prop_assert_eq!(b.established(), Established { peer: 1, version: VERSION_MAX, features: ALL_FEATURES });
        prop_assert_eq!(&b.leftover, &suffix_a);
        prop_assert_eq!(&a.leftover, &suffix_b);
    }

    /// Garbage before the peer's stream: never a panic, never more consumed than given, and a
    /// protocol failure unless the garbage happens to start like a frame.
    #[test]
    fn garbage_prefix_fails_cleanly(
        sizes in prop::collection::vec(1usize..40, 1..20),
        prefix in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2]), cfg(2, "r0", b"s3cret", &[1]));
        // B's first bytes from A are the garbage.
        a.out.splice(0..0, prefix.iter().copied());
        pump(&mut a, &mut b, chunker(sizes));
        let magic = MAGIC.to_be_bytes();
        let n = prefix.len().min(4);
        if prefix[..n] != magic[..n] {
            prop_assert!(
                matches!(b.step, HandshakeStep::Failed(HandshakeError::Protocol(_))),
                "{:?}", b.step
            );
        }
    }

    /// Arbitrary bytes, split anywhere: no panic, consumption within bounds (checked by
    /// `deliver`), and a bad magic is reported as such.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        splits in prop::collection::vec(0usize..300, 0..10),
    ) {
        let mut side = Side::new(cfg(1, "r0", b"s3cret", &[2]), CH_A);
        let mut cuts: Vec<usize> = splits.into_iter().map(|s| s.min(bytes.len())).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        for w in cuts.windows(2) {
            side.deliver(&bytes[w[0]..w[1]]);
        }
        if bytes.len() >= HEADER_LEN && bytes[..4] != MAGIC.to_be_bytes() {
            let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            prop_assert_eq!(
                side.step,
                HandshakeStep::Failed(HandshakeError::Protocol(ProtocolError::Wire(WireError::BadMagic(magic))))
            );
        }
    }

    /// Valid frames with random magic-preserving corruption, split anywhere: no panic, no
    /// overconsumption, and never established as someone else.
    #[test]
    fn corrupted_streams_never_panic(
        sizes in prop::collection::vec(1usize..40, 1..20),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let (mut a, mut b) = pair(cfg(1, "r0", b"s3cret", &[2, 3]), cfg(2, "r0", b"s3cret", &[1]));
        // Run once cleanly to learn A's full stream, then replay it corrupted to a fresh B.
        pump(&mut a, &mut b, whole);
        let mut stream = a.out.clone();
        for (at, x) in &flips {
            let i = at.index(stream.len());
            stream[i] ^= x;
        }
        let mut b = Side::new(cfg(2, "r0", b"s3cret", &[1]), CH_B);
        let mut at = 0;
        let mut next = chunker(sizes);
        while at < stream.len() {
            let n = next(0).min(stream.len() - at);
            b.deliver(&stream[at..at + n]);
            at += n;
        }
        if let HandshakeStep::Established(e) = b.step {
            prop_assert_eq!(e.peer, 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// StandAlone

#[test]
fn a_standalone_side_refuses_an_authenticated_peer_with_a_code_of_its_own() {
    let mut ca = cfg(1, "r0", b"s3cret", &[2]);
    ca.standalone_towards = vec![2];
    let mut cb = cfg(2, "r0", b"s3cret", &[1]);
    cb.expect = Some(1);
    let (mut a, mut b) = pair(ca, cb);
    pump(&mut a, &mut b, whole);
    assert_eq!(
        *a.failed(),
        HandshakeError::StandAlone {
            me: 1,
            peer: 2,
            resource: "r0".into()
        }
    );
    assert!(!packets(&a.out).contains(&Packet::AuthOk));
    let (code, message) = last_error(&a.out);
    assert_eq!(code, ERR_STANDALONE);
    assert!(message.contains("StandAlone"), "{message}");
    match b.failed() {
        HandshakeError::PeerRefused { code, message } => {
            assert_eq!(*code, ERR_STANDALONE);
            assert!(message.contains("tandem connect"), "{message}");
        }
        other => panic!("expected the peer's refusal, got {other:?}"),
    }
}

#[test]
fn a_standalone_side_tells_an_unauthenticated_caller_nothing_of_it() {
    let mut ca = cfg(1, "r0", b"s3cret", &[2]);
    ca.standalone_towards = vec![2];
    let (mut a, mut b) = pair(ca, cfg(2, "r0", b"guess", &[1]));
    pump(&mut a, &mut b, whole);
    assert_eq!(a.failed().code(), ERR_AUTH);
    assert_eq!(last_error(&a.out).0, ERR_AUTH);
    assert!(!matches!(
        b.failed(),
        HandshakeError::PeerRefused {
            code: ERR_STANDALONE,
            ..
        }
    ));
}

#[test]
fn standalone_towards_one_peer_accepts_the_others() {
    let mut ca = cfg(1, "r0", b"s3cret", &[2, 3]);
    ca.standalone_towards = vec![3];
    let (mut a, mut b) = pair(ca, cfg(2, "r0", b"s3cret", &[1, 3]));
    pump(&mut a, &mut b, whole);
    assert_eq!(a.established().peer, 2);
    assert_eq!(b.established().peer, 1);
}
