//! Fuzzes one side of the peer handshake (`tandem_wire::handshake::PeerHandshake`).
//!
//! Input layout: byte 0 picks the configuration (which node we dialed, whether we are
//! StandAlone towards the peer), bytes 1..5 the chunk sizes; the rest is what the peer
//! sends. Invariants: no panic; never more consumed than given; nothing consumed or sent
//! after the handshake ended; an established peer is an allowed one and not ourselves;
//! the same outcome whether the bytes arrive in chunks or whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_wire::handshake::{HandshakeConfig, HandshakeStep, PeerHandshake};

fn config(choice: u8) -> HandshakeConfig {
    HandshakeConfig {
        me: 1,
        resource: "r0".into(),
        secret: b"s3cret".to_vec(),
        allowed_peers: vec![0, 2],
        expect: if choice & 1 != 0 { Some(2) } else { None },
        features: 0b11,
        standalone_towards: if choice & 2 != 0 { vec![0] } else { vec![] },
    }
}

fn drive(input: &[u8], sizes: &[usize], choice: u8) -> (usize, HandshakeStep, Vec<u8>) {
    let mut out = Vec::new();
    let mut hs = PeerHandshake::new(config(choice), [7; 32], &mut out);
    let (mut start, mut end, mut i) = (0usize, 0usize, 0usize);
    loop {
        let (n, step) = hs.feed(&input[start..end], &mut out);
        assert!(n <= end - start);
        start += n;
        match &step {
            HandshakeStep::NeedMore => {}
            terminal => {
                if let HandshakeStep::Established(e) = terminal {
                    assert!([0, 2].contains(&e.peer));
                    assert!(choice & 1 == 0 || e.peer == 2, "not the node we dialed");
                    assert!(choice & 2 == 0 || e.peer != 0, "a peer we are StandAlone towards");
                }
                let sent = out.len();
                let (n, again) = hs.feed(&input[start..], &mut out);
                assert_eq!(n, 0);
                assert_eq!(&again, terminal);
                assert_eq!(out.len(), sent);
                return (start, step, out);
            }
        }
        if end == input.len() {
            return (start, HandshakeStep::NeedMore, out);
        }
        end = (end + sizes[i % sizes.len()]).min(input.len());
        i += 1;
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let choice = data[0];
    let sizes: Vec<usize> = data[1..5].iter().map(|&b| usize::from(b) + 1).collect();
    let input = &data[5..];
    let chunked = drive(input, &sizes, choice);
    let whole = drive(input, &[input.len().max(1)], choice);
    assert_eq!(chunked.1, whole.1);
    assert_eq!(chunked.2, whole.2);
});
