//! Properties of the peer wire format over generated packets (a bounded run of what the
//! `peer_packet` fuzz target checks on arbitrary bytes): every well-formed packet
//! round-trips, a stream of them decodes back in order whatever the split, and a corrupted
//! frame is an error or a different valid packet, never a panic.

use proptest::prelude::*;
use tandem_wire::packet::{
    split_brain_flags, volume_flags, write_flags, AllocExtent, DiskState, GenIds, Role, GI_HISTORY,
    MAX_ALLOC_EXTENTS,
};
use tandem_wire::{decode, encode, Decoded, Packet};

/// The fields a packet is built from (packets borrow their payload).
#[derive(Clone, Debug)]
struct Fields {
    kind: u8,
    a: u64,
    b: u64,
    c: u32,
    d: u16,
    flags: u32,
    data: Vec<u8>,
    text: String,
    /// A block status answer's extents, well formed (see `alloc_extents`).
    extents: Vec<u8>,
}

/// Up to `MAX_ALLOC_EXTENTS` whole (length, flags) pairs from arbitrary bytes: nonzero
/// lengths, known flags.
fn alloc_extents(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in raw.chunks_exact(5).take(MAX_ALLOC_EXTENTS) {
        let e = AllocExtent {
            len: u32::from_be_bytes([c[0], c[1], c[2], c[3]]).max(1),
            hole: c[4] % 2 == 1,
        };
        e.encode(&mut out);
    }
    out
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        0u8..33,
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u16>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 1..300),
        "[ -~]{0,40}",
    )
        .prop_map(|(kind, a, b, c, d, flags, data, text)| Fields {
            extents: alloc_extents(&data),
            kind,
            a,
            b,
            c,
            d,
            flags,
            data,
            text,
        })
}

/// Read and resync requests ask for 1 byte to 32 MiB.
fn request_len(c: u32) -> u32 {
    c % tandem_wire::MAX_DATA + 1
}

fn gen_ids(f: &Fields) -> GenIds {
    let mut history = [0; GI_HISTORY];
    for (i, h) in history.iter_mut().enumerate() {
        *h = f.b.rotate_left(i as u32 * 7) ^ u64::from(f.c);
    }
    GenIds {
        current: f.a,
        history,
    }
}

fn packet(f: &Fields) -> Packet<'_> {
    let disk = [
        DiskState::Diskless,
        DiskState::Inconsistent,
        DiskState::Outdated,
        DiskState::UpToDate,
    ][(f.a % 4) as usize];
    let role = if f.a.is_multiple_of(2) {
        Role::Primary
    } else {
        Role::Secondary
    };
    match f.kind {
        0 => Packet::AuthOk,
        1 => Packet::Role {
            role,
            incarnation: f.b,
        },
        2 => Packet::Volume {
            volume: f.d,
            size: f.b,
            disk,
            flags: (f.flags as u16) & volume_flags::ALL,
            gen: gen_ids(f),
        },
        3 => Packet::Write {
            volume: f.d,
            seq: f.a,
            offset: f.b,
            flags: f.flags & write_flags::ALL,
            targets: f.c,
            data: &f.data,
        },
        4 => Packet::Zero {
            volume: f.d,
            seq: f.a,
            offset: f.b,
            len: f.c,
            flags: f.flags & write_flags::ALL,
            targets: f.c.rotate_left(7),
        },
        5 => Packet::RecvAck { seq: f.a },
        6 => Packet::WriteAck { seq: f.a },
        7 => Packet::NegAck {
            seq: f.a,
            errno: f.c,
        },
        8 => Packet::Barrier { id: f.a },
        9 => Packet::BarrierAck {
            id: f.a,
            errno: f.c,
        },
        10 => Packet::ReadReq {
            volume: f.d,
            id: f.a,
            offset: f.b,
            len: request_len(f.c),
        },
        11 => Packet::ReadReply {
            id: f.a,
            errno: 0,
            data: &f.data,
        },
        12 => Packet::ResyncReq {
            volume: f.d,
            id: f.a,
            offset: f.b,
            len: request_len(f.c),
        },
        13 => Packet::ResyncReply {
            volume: f.d,
            id: f.a,
            offset: f.b,
            errno: 0,
            lacking: f.c,
            data: &f.data,
        },
        14 => Packet::OutOfSync {
            volume: f.d,
            offset: f.b,
            len: f.c,
        },
        15 => Packet::Ping,
        16 => Packet::PingAck,
        17 => Packet::SplitBrain {
            volume: f.d,
            mine: f.a,
            yours: f.b,
            flags: (f.flags as u8) & split_brain_flags::ALL,
        },
        18 => Packet::Error {
            code: f.c,
            message: &f.text,
        },
        20 => Packet::Generation {
            volume: f.d,
            gen: gen_ids(f),
        },
        21 => Packet::GenAck {
            volume: f.d,
            gi: f.a,
            adopted: f.c % 2 == 1,
        },
        22 => Packet::PeerAck {
            seq: f.a,
            missing: f.c,
        },
        24 => Packet::Primaries { nodes: f.c },
        25 => Packet::Leaving,
        26 => Packet::VotersBehind {
            volume: f.d,
            gi: f.a,
            nodes: f.c,
        },
        27 => Packet::Outdated { volume: f.d },
        28 => Packet::SyncProgress {
            volume: f.d,
            source: f.flags as u8,
            left: f.a,
            done: f.b,
            rate: u64::from(f.c),
        },
        23 => Packet::PrimaryLost {
            primary: f.d as u8,
            incarnation: f.b,
            seq: f.a,
        },
        29 => Packet::AllocReq {
            volume: f.d,
            id: f.a,
            offset: f.b,
            len: f.c.max(1),
        },
        30 => Packet::AllocReply {
            volume: f.d,
            id: f.a,
            errno: 0,
            extents: &f.extents,
        },
        31 => Packet::AllocReply {
            volume: f.d,
            id: f.a,
            errno: f.c.max(1),
            extents: &[],
        },
        32 => Packet::Abandoned {
            volume: f.d,
            gi: f.a,
            without_quorum: f.c & 1 == 1,
        },
        19 => Packet::ReadReply {
            id: f.a,
            errno: f.c.max(1),
            data: &[],
        },
        _ => Packet::ResyncReply {
            volume: f.d,
            id: f.a,
            offset: f.b,
            errno: f.c.max(1),
            lacking: 0,
            data: &[],
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn well_formed_packets_round_trip(f in fields()) {
        let p = packet(&f);
        let mut buf = Vec::new();
        encode(&p, &mut buf);
        match decode(&buf) {
            Ok(Decoded::Packet(q, n)) => {
                prop_assert_eq!(q, p);
                prop_assert_eq!(n, buf.len());
            }
            other => prop_assert!(false, "{:?} encoded does not decode: {:?}", p, other),
        }
    }

    #[test]
    fn a_stream_decodes_in_order_at_any_split(
        fs in proptest::collection::vec(fields(), 1..6),
        split in any::<proptest::sample::Index>(),
    ) {
        let packets: Vec<Packet<'_>> = fs.iter().map(packet).collect();
        let mut buf = Vec::new();
        for p in &packets {
            encode(p, &mut buf);
        }
        // What a reader sees if the bytes arrive in two reads.
        let cut = split.index(buf.len() + 1);
        let mut at = 0;
        let mut got = Vec::new();
        for avail in [cut, buf.len()] {
            while at < avail {
                match decode(&buf[at..avail]).expect("well formed") {
                    Decoded::Packet(p, n) => {
                        got.push(p);
                        at += n;
                    }
                    Decoded::NeedMore(n) => {
                        prop_assert!(n > avail - at);
                        break;
                    }
                }
            }
        }
        prop_assert_eq!(got, packets);
    }

    #[test]
    fn a_corrupted_frame_never_panics(f in fields(), at in any::<proptest::sample::Index>(), x in 1u8..) {
        let p = packet(&f);
        let mut buf = Vec::new();
        encode(&p, &mut buf);
        let i = at.index(buf.len());
        buf[i] ^= x;
        match decode(&buf) {
            Ok(Decoded::Packet(q, n)) => {
                prop_assert!(n <= buf.len());
                // Whatever it decoded to encodes back to the same bytes.
                let mut again = Vec::new();
                encode(&q, &mut again);
                prop_assert_eq!(&again[..], &buf[..n]);
            }
            Ok(Decoded::NeedMore(n)) => prop_assert!(n > buf.len()),
            Err(_) => {}
        }
    }
}
