//! Fuzzes the transmission-phase request decoder.
//!
//! Input layout: byte 0 picks the export's flags and block sizes, bytes 1..9 its size, bytes
//! 9..13 the chunk sizes the stream is fed in (byte 9's low bit also whether a metadata
//! context was negotiated); the rest is the stream. Invariants: no panic,
//! never more consumed than given, the payload contract, every accepted request aligned and
//! inside the export, `NeedMore` only when more bytes are really needed, and the same items
//! whether the stream arrives in chunks or whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem_frontend::nbd::request::REQUEST_HEADER_LEN;
use tandem_frontend::nbd::wire::MAX_PAYLOAD;
use tandem_frontend::nbd::{
    BlockSizes, Command, Decoded, Errno, RequestDecoder, TransmissionParams,
};

#[derive(Debug, PartialEq, Eq)]
enum Item {
    Request {
        cookie: u64,
        offset: u64,
        len: u32,
        command: Command,
        payload: Vec<u8>,
    },
    Rejected {
        cookie: u64,
        command: u16,
        offset: u64,
        len: u32,
        errno: Errno,
    },
    Fatal,
}

fn params(data: &[u8]) -> TransmissionParams {
    let b = data[0];
    let minimum = [1u32, 512, 4096, 65536][usize::from(b >> 2 & 3)];
    let mut block = BlockSizes::new(minimum);
    block.maximum = match b >> 4 & 3 {
        0 => block.preferred,
        1 => block.preferred * 2,
        2 => 1 << 20,
        _ => MAX_PAYLOAD,
    };
    let raw = u64::from_be_bytes(data[1..9].try_into().unwrap());
    let size = match b >> 6 {
        0 => raw,
        1 => raw % (1 << 24) * 512,
        2 => u64::MAX - raw % 65536,
        _ => raw % (1 << 20),
    };
    TransmissionParams {
        size,
        read_only: b & 1 != 0,
        block,
        structured_replies: b & 2 != 0,
        meta_context: (data[9] & 1 != 0).then_some(1),
        block_sizes: data[9] & 2 == 0,
    }
}

fn check_accepted(p: &TransmissionParams, offset: u64, len: u32, command: Command) {
    match command {
        Command::Disconnect => {}
        Command::Flush => assert_eq!((offset, len), (0, 0)),
        c => {
            let min = if p.block_sizes {
                u64::from(p.block.minimum)
            } else {
                1
            };
            assert!(len > 0);
            assert_eq!(offset % min, 0);
            assert_eq!(u64::from(len) % min, 0);
            assert!(u128::from(offset) + u128::from(len) <= u128::from(p.size));
            if matches!(c, Command::Read | Command::Write { .. }) {
                assert!(len <= p.block.maximum);
            }
            if let Command::BlockStatus { context, .. } = c {
                assert!(p.structured_replies);
                assert_eq!(Some(context), p.meta_context);
            }
            assert!(!(p.read_only && c.is_write()));
        }
    }
}

/// Feeds `stream` in chunks whose sizes cycle through `sizes`; returns the items and the
/// number of bytes consumed.
fn drive(p: TransmissionParams, stream: &[u8], sizes: &[usize]) -> (Vec<Item>, usize) {
    let mut d = RequestDecoder::new(p);
    let mut items = Vec::new();
    let (mut start, mut end, mut i) = (0usize, 0usize, 0usize);
    while end < stream.len() {
        end = (end + sizes[i % sizes.len()]).min(stream.len());
        i += 1;
        loop {
            let avail = &stream[start..end];
            let (n, decoded) = d.decode(avail);
            assert!(n <= avail.len());
            start += n;
            match decoded {
                Decoded::Request(r, payload) => {
                    let expect = if matches!(r.command, Command::Write { .. }) {
                        r.len as usize
                    } else {
                        0
                    };
                    assert_eq!(payload.len(), expect);
                    assert_eq!(n, REQUEST_HEADER_LEN + expect);
                    assert_eq!(payload, &avail[REQUEST_HEADER_LEN..n]);
                    check_accepted(&p, r.offset, r.len, r.command);
                    items.push(Item::Request {
                        cookie: r.cookie,
                        offset: r.offset,
                        len: r.len,
                        command: r.command,
                        payload: payload.to_vec(),
                    });
                }
                Decoded::Rejected(r) => {
                    assert!(n > 0);
                    assert!(!r.reason.is_empty());
                    items.push(Item::Rejected {
                        cookie: r.cookie,
                        command: r.command,
                        offset: r.offset,
                        len: r.len,
                        errno: r.errno,
                    });
                }
                Decoded::WriteHeader(r) => unreachable!("streaming is not enabled here: {r:?}"),
                Decoded::NeedMore { need } => {
                    if n == 0 {
                        assert!(need > avail.len());
                    } else {
                        assert_eq!(n, avail.len());
                    }
                    break;
                }
                Decoded::Fatal(_) => {
                    assert_eq!(n, 0);
                    items.push(Item::Fatal);
                    return (items, start);
                }
            }
        }
    }
    (items, start)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 13 {
        return;
    }
    let p = params(data);
    let sizes: Vec<usize> = data[9..13]
        .iter()
        .map(|&b| match b {
            0 => 1 << 16,
            b if b >= 0xf0 => usize::from(b - 0xef) * 997,
            b => usize::from(b),
        })
        .collect();
    let stream = &data[13..];
    let chunked = drive(p, stream, &sizes);
    let whole = drive(p, stream, &[usize::MAX / 2]);
    assert_eq!(chunked, whole);
});
