//! Tests of the transmission-phase request decoder: every rejection, payload skipping, framing,
//! and property tests (robustness over arbitrary streams, and a model of the whole stream).

use proptest::prelude::*;
use tandem_frontend::nbd::request::{encode_request, ProtocolError, REQUEST_HEADER_LEN};
use tandem_frontend::nbd::wire::*;
use tandem_frontend::nbd::{
    BlockSizes, Command, Decoded, Errno, Rejection, Request, RequestDecoder, TransmissionParams,
};

const MIB: u32 = 1 << 20;
const SIZE: u64 = 1 << 30;

fn params(
    size: u64,
    read_only: bool,
    minimum: u32,
    structured_replies: bool,
) -> TransmissionParams {
    TransmissionParams {
        size,
        read_only,
        block: BlockSizes::new(minimum),
        structured_replies,
        meta_context: None,
        block_sizes: true,
    }
}

/// A 1 GiB writable export with 512-byte blocks and simple replies.
fn rw() -> TransmissionParams {
    params(SIZE, false, 512, false)
}

fn hdr(flags: u16, typ: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request(&mut v, flags, typ, cookie, offset, len);
    v
}

fn payload(cookie: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (cookie as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// A full request as sent: header plus, for writes, `len` bytes of payload.
fn wire(flags: u16, typ: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut v = hdr(flags, typ, cookie, offset, len);
    if typ == CMD_WRITE {
        v.extend_from_slice(&payload(cookie, len as usize));
    }
    v
}

/// An owned copy of a decoder result, minus the rejection's free-text reason.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Req(Request, Vec<u8>),
    Rej {
        cookie: u64,
        command: u16,
        offset: u64,
        len: u32,
        errno: Errno,
    },
    NeedMore(usize),
    Fatal(ProtocolError),
}

fn own(d: Decoded<'_>) -> Out {
    match d {
        Decoded::Request(r, p) => Out::Req(r, p.to_vec()),
        Decoded::Rejected(Rejection {
            cookie,
            command,
            offset,
            len,
            errno,
            reason,
        }) => {
            assert!(!reason.is_empty());
            Out::Rej {
                cookie,
                command,
                offset,
                len,
                errno,
            }
        }
        Decoded::NeedMore { need } => Out::NeedMore(need),
        Decoded::Fatal(e) => Out::Fatal(e),
        Decoded::WriteHeader(r) => unreachable!("streaming is not enabled here: {r:?}"),
    }
}

fn rej(cookie: u64, command: u16, offset: u64, len: u32, errno: Errno) -> Out {
    Out::Rej {
        cookie,
        command,
        offset,
        len,
        errno,
    }
}

fn req(cookie: u64, offset: u64, len: u32, command: Command) -> Out {
    let p = if matches!(command, Command::Write { .. }) {
        payload(cookie, len as usize)
    } else {
        Vec::new()
    };
    Out::Req(
        Request {
            cookie,
            offset,
            len,
            command,
        },
        p,
    )
}

/// Decodes one item from a fresh decoder.
fn one(p: TransmissionParams, bytes: &[u8]) -> (usize, Out) {
    let mut d = RequestDecoder::new(p);
    let (n, out) = d.decode(bytes);
    (n, own(out))
}

/// Decodes a single complete request and checks it consumed all of `bytes`.
fn single(p: TransmissionParams, bytes: &[u8]) -> Out {
    let (n, out) = one(p, bytes);
    assert_eq!(
        n,
        bytes.len(),
        "consumed {n} of {} bytes: {out:?}",
        bytes.len()
    );
    out
}

/// A driver as the daemon would write it: feeds `chunks` in order, keeps unconsumed bytes,
/// decodes everything it can, and stops at a fatal error. Checks the decoder's contract on
/// every call.
fn drive(p: TransmissionParams, chunks: &[&[u8]]) -> (Vec<Out>, usize) {
    let mut d = RequestDecoder::new(p);
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0;
    let mut results = Vec::new();
    let mut total_consumed = 0;
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let avail = &buf[start..];
            let (n, out) = d.decode(avail);
            assert!(n <= avail.len(), "consumed {n} of {}", avail.len());
            check_item(d.params(), avail, n, &out);
            start += n;
            total_consumed += n;
            match out {
                Decoded::NeedMore { .. } => break,
                Decoded::Fatal(e) => {
                    results.push(Out::Fatal(e));
                    return (results, total_consumed);
                }
                other => results.push(own(other)),
            }
        }
        if start > 4096 && start * 2 > buf.len() {
            buf.drain(..start);
            start = 0;
        }
    }
    (results, total_consumed)
}

/// The decoder's contract for one call that consumed `n` of `avail` bytes.
fn check_item(p: &TransmissionParams, avail: &[u8], n: usize, out: &Decoded<'_>) {
    match out {
        Decoded::Request(r, payload) => {
            let payload_len = if matches!(r.command, Command::Write { .. }) {
                r.len as usize
            } else {
                0
            };
            assert_eq!(payload.len(), payload_len, "{r:?}");
            assert_eq!(n, REQUEST_HEADER_LEN + payload_len);
            assert_eq!(*payload, &avail[REQUEST_HEADER_LEN..n]);
            check_accepted(p, r);
        }
        Decoded::Rejected(r) => {
            assert!(n > 0);
            assert_ne!(r.errno, Errno::Io);
        }
        Decoded::WriteHeader(r) => unreachable!("streaming is not enabled here: {r:?}"),
        Decoded::NeedMore { need } => {
            // Either nothing was consumed and `need` is more than there is, or skipped payload
            // used up everything.
            if n == 0 {
                assert!(
                    *need > avail.len(),
                    "need {need} but {} available",
                    avail.len()
                );
            } else {
                assert_eq!(n, avail.len());
                assert!(*need >= 1);
            }
        }
        Decoded::Fatal(_) => assert_eq!(n, 0),
    }
}

/// Every accepted request lies within the export, and is aligned if the client agreed to
/// block sizes.
fn check_accepted(p: &TransmissionParams, r: &Request) {
    match r.command {
        Command::Disconnect => {}
        Command::Flush => assert_eq!((r.offset, r.len), (0, 0)),
        c => {
            assert!(r.len > 0);
            let min = if p.block_sizes {
                u64::from(p.block.minimum)
            } else {
                1
            };
            assert_eq!(r.offset % min, 0, "{r:?}");
            assert_eq!(u64::from(r.len) % min, 0, "{r:?}");
            assert!(
                u128::from(r.offset) + u128::from(r.len) <= u128::from(p.size),
                "{r:?}"
            );
            if matches!(c, Command::Read | Command::Write { .. }) {
                assert!(r.len <= p.block.maximum);
            }
            if p.read_only {
                assert!(!c.is_write(), "{r:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Accepted requests

#[test]
fn accepts_every_command() {
    let p = params(SIZE, false, 512, true);
    let cases = [
        (0, CMD_READ, 0, 4096, Command::Read),
        (CMD_FLAG_FUA, CMD_READ, 512, 512, Command::Read),
        (
            CMD_FLAG_DF,
            CMD_READ,
            SIZE - 32 * u64::from(MIB),
            32 * MIB,
            Command::Read,
        ),
        (
            0,
            CMD_WRITE,
            SIZE - 1024,
            1024,
            Command::Write { fua: false },
        ),
        (
            CMD_FLAG_FUA,
            CMD_WRITE,
            4096,
            512,
            Command::Write { fua: true },
        ),
        (0, CMD_FLUSH, 0, 0, Command::Flush),
        (CMD_FLAG_FUA, CMD_FLUSH, 0, 0, Command::Flush),
        (
            0,
            CMD_TRIM,
            0,
            SIZE as u32 - 512,
            Command::Trim { fua: false },
        ),
        (
            CMD_FLAG_FUA,
            CMD_TRIM,
            1 << 20,
            64 * MIB,
            Command::Trim { fua: true },
        ),
        (0, CMD_CACHE, 0, 64 * MIB, Command::Cache),
        (
            0,
            CMD_WRITE_ZEROES,
            0,
            512,
            Command::WriteZeroes {
                fua: false,
                no_hole: false,
                fast: false,
            },
        ),
        (
            CMD_FLAG_FUA,
            CMD_WRITE_ZEROES,
            0,
            512,
            Command::WriteZeroes {
                fua: true,
                no_hole: false,
                fast: false,
            },
        ),
        (
            CMD_FLAG_NO_HOLE,
            CMD_WRITE_ZEROES,
            0,
            512,
            Command::WriteZeroes {
                fua: false,
                no_hole: true,
                fast: false,
            },
        ),
        (
            CMD_FLAG_FAST_ZERO,
            CMD_WRITE_ZEROES,
            0,
            512,
            Command::WriteZeroes {
                fua: false,
                no_hole: false,
                fast: true,
            },
        ),
        (
            CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_WRITE_ZEROES,
            SIZE - 100 * 512,
            100 * 512,
            Command::WriteZeroes {
                fua: true,
                no_hole: true,
                fast: true,
            },
        ),
        (0, CMD_DISC, 0, 0, Command::Disconnect),
    ];
    for (i, (flags, typ, offset, len, command)) in cases.into_iter().enumerate() {
        let cookie = 0x1122_3344_5566_7700 + i as u64;
        let bytes = wire(flags, typ, cookie, offset, len);
        assert_eq!(
            single(p, &bytes),
            req(cookie, offset, len, command),
            "case {i}"
        );
    }
}

#[test]
fn header_fields_are_big_endian() {
    let bytes = [
        0x25, 0x60, 0x95, 0x13, // magic
        0x00, 0x01, // FUA
        0x00, 0x00, // READ
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // cookie
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x02, 0x00, // offset
        0x00, 0x00, 0x10, 0x00, // length
    ];
    assert_eq!(
        bytes.to_vec(),
        hdr(
            CMD_FLAG_FUA,
            CMD_READ,
            0x0102_0304_0506_0708,
            0x10_0200,
            4096
        )
    );
    assert_eq!(
        single(rw(), &bytes),
        req(0x0102_0304_0506_0708, 0x10_0200, 4096, Command::Read)
    );
}

#[test]
fn read_payload_is_empty_and_following_bytes_are_not_consumed() {
    let mut bytes = hdr(0, CMD_READ, 1, 0, 512);
    bytes.extend_from_slice(&hdr(0, CMD_FLUSH, 2, 0, 0));
    let (n, out) = one(rw(), &bytes);
    assert_eq!(n, 28);
    assert_eq!(out, req(1, 0, 512, Command::Read));
}

#[test]
fn write_payload_is_exactly_len_bytes() {
    let mut bytes = wire(0, CMD_WRITE, 9, 1024, 1536);
    bytes.extend_from_slice(b"next request");
    let mut d = RequestDecoder::new(rw());
    let (n, out) = d.decode(&bytes);
    assert_eq!(n, 28 + 1536);
    let Decoded::Request(r, p) = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        r,
        Request {
            cookie: 9,
            offset: 1024,
            len: 1536,
            command: Command::Write { fua: false }
        }
    );
    assert_eq!(p, &payload(9, 1536)[..]);
    assert_eq!(p.as_ptr(), bytes[28..].as_ptr());
}

// ---------------------------------------------------------------------------------------------
// Rejections

#[test]
fn unknown_command_is_einval() {
    for typ in [8u16, 9, 0x80, 0xffff] {
        let bytes = hdr(0, typ, 77, 0, 512);
        assert_eq!(
            single(rw(), &bytes),
            rej(77, typ, 0, 512, Errno::Inval),
            "type {typ}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Block status

/// A 1 GiB export with structured replies and `base:allocation` selected as context `id`.
fn with_context(id: u32, minimum: u32, read_only: bool) -> TransmissionParams {
    TransmissionParams {
        meta_context: Some(id),
        ..params(SIZE, read_only, minimum, true)
    }
}

#[test]
fn block_status_without_a_metadata_context_is_einval() {
    let no_context = params(SIZE, false, 512, true);
    // Only reachable through a confused driver (the handshake selects contexts only with
    // structured replies): still no structured reply may be promised.
    let unstructured = TransmissionParams {
        meta_context: Some(1),
        ..params(SIZE, false, 512, false)
    };
    for (i, p) in [no_context, unstructured, rw()].into_iter().enumerate() {
        for flags in [0, CMD_FLAG_REQ_ONE] {
            let cookie = 10 + i as u64;
            assert_eq!(
                single(p, &hdr(flags, CMD_BLOCK_STATUS, cookie, 0, 4096)),
                rej(cookie, CMD_BLOCK_STATUS, 0, 4096, Errno::Inval),
                "{p:?}"
            );
        }
    }
}

#[test]
fn block_status_carries_req_one_and_the_context_id() {
    let p = with_context(7, 512, false);
    assert_eq!(
        single(p, &hdr(0, CMD_BLOCK_STATUS, 1, 4096, 8192)),
        req(
            1,
            4096,
            8192,
            Command::BlockStatus {
                req_one: false,
                context: 7
            }
        )
    );
    assert_eq!(
        single(p, &hdr(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 2, 0, 512)),
        req(
            2,
            0,
            512,
            Command::BlockStatus {
                req_one: true,
                context: 7
            }
        )
    );
    // Nothing about it writes: a read-only export answers it too.
    let ro = with_context(7, 512, true);
    assert!(matches!(
        single(ro, &hdr(0, CMD_BLOCK_STATUS, 3, 0, 512)),
        Out::Req(..)
    ));
    for flags in [
        CMD_FLAG_FUA,
        CMD_FLAG_DF,
        CMD_FLAG_NO_HOLE,
        CMD_FLAG_FAST_ZERO,
        1 << 9,
    ] {
        assert_eq!(
            single(p, &hdr(flags, CMD_BLOCK_STATUS, 4, 0, 512)),
            rej(4, CMD_BLOCK_STATUS, 0, 512, Errno::Inval),
            "flags {flags:#x}"
        );
    }
}

#[test]
fn block_status_lengths_are_checked_like_a_trim() {
    let p = with_context(1, 4096, false);
    let bs = |offset, len| single(p, &hdr(0, CMD_BLOCK_STATUS, 9, offset, len));
    let ok = |offset, len| {
        req(
            9,
            offset,
            len,
            Command::BlockStatus {
                req_one: false,
                context: 1,
            },
        )
    };
    let einval = |offset, len| rej(9, CMD_BLOCK_STATUS, offset, len, Errno::Inval);
    // No payload either way: the maximum payload size does not bound it.
    let large = TransmissionParams {
        size: 16 << 30,
        ..p
    };
    let big = (u32::MAX / 4096) * 4096;
    assert_eq!(
        single(large, &hdr(0, CMD_BLOCK_STATUS, 9, 4096, big)),
        ok(4096, big)
    );
    assert_eq!(bs(SIZE - 4096, 4096), ok(SIZE - 4096, 4096));
    assert_eq!(bs(0, 0), einval(0, 0));
    assert_eq!(bs(512, 4096), einval(512, 4096));
    assert_eq!(bs(0, 4096 + 512), einval(0, 4096 + 512));
    // Past the end is EINVAL (the spec's word for block status), never ENOSPC.
    assert_eq!(bs(SIZE - 4096, 8192), einval(SIZE - 4096, 8192));
    assert_eq!(bs(SIZE, 4096), einval(SIZE, 4096));
    let near = u64::MAX / 4096 * 4096;
    assert_eq!(bs(near, 8192), einval(near, 8192));
}

#[test]
fn invalid_flags_are_einval() {
    let p = rw();
    let cases = [
        (CMD_FLAG_NO_HOLE, CMD_WRITE),
        (CMD_FLAG_NO_HOLE, CMD_READ),
        (CMD_FLAG_NO_HOLE, CMD_TRIM),
        (CMD_FLAG_DF, CMD_READ), // not structured
        (CMD_FLAG_DF, CMD_WRITE),
        (CMD_FLAG_FAST_ZERO, CMD_TRIM),
        (CMD_FLAG_FAST_ZERO, CMD_WRITE),
        (CMD_FLAG_FAST_ZERO, CMD_READ),
        (1 << 3, CMD_READ), // REQ_ONE is for BLOCK_STATUS
        (1 << 5, CMD_WRITE),
        (1 << 9, CMD_READ),
        (1 << 9, CMD_WRITE),
        (1 << 9, CMD_FLUSH),
        (1 << 9, CMD_TRIM),
        (1 << 9, CMD_CACHE),
        (1 << 9, CMD_WRITE_ZEROES),
        (1 << 9, CMD_DISC),
        (1 << 15, CMD_WRITE_ZEROES),
        (0xffff, CMD_READ),
    ];
    for (i, (flags, typ)) in cases.into_iter().enumerate() {
        let cookie = 1000 + i as u64;
        let (offset, len) = if typ == CMD_FLUSH || typ == CMD_DISC {
            (0, 0)
        } else {
            (4096, 512)
        };
        let bytes = wire(flags, typ, cookie, offset, len);
        assert_eq!(
            single(p, &bytes),
            rej(cookie, typ, offset, len, Errno::Inval),
            "flags {flags:#x} on type {typ}"
        );
    }
    // DF on a read is fine with structured replies, but not on anything else.
    let s = params(SIZE, false, 512, true);
    assert_eq!(
        single(s, &hdr(CMD_FLAG_DF, CMD_READ, 1, 0, 512)),
        req(1, 0, 512, Command::Read)
    );
    assert_eq!(
        single(s, &hdr(CMD_FLAG_DF, CMD_CACHE, 2, 0, 512)),
        rej(2, CMD_CACHE, 0, 512, Errno::Inval)
    );
    assert_eq!(
        single(s, &wire(CMD_FLAG_DF, CMD_WRITE, 3, 0, 512)),
        rej(3, CMD_WRITE, 0, 512, Errno::Inval)
    );
}

#[test]
fn read_only_refuses_writes_with_eperm() {
    let p = params(SIZE, true, 512, false);
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 1, 0, 4096)),
        rej(1, CMD_WRITE, 0, 4096, Errno::Perm)
    );
    assert_eq!(
        single(p, &wire(0, CMD_TRIM, 2, 0, 4096)),
        rej(2, CMD_TRIM, 0, 4096, Errno::Perm)
    );
    assert_eq!(
        single(p, &wire(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 3, 0, 4096)),
        rej(3, CMD_WRITE_ZEROES, 0, 4096, Errno::Perm)
    );
    // EPERM wins over later faults (length, alignment, bounds).
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 4, SIZE, 513)),
        rej(4, CMD_WRITE, SIZE, 513, Errno::Perm)
    );
    assert_eq!(
        single(p, &hdr(0, CMD_TRIM, 5, 0, 0)),
        rej(5, CMD_TRIM, 0, 0, Errno::Perm)
    );
    // ... but not over a bad flag.
    assert_eq!(
        single(p, &wire(CMD_FLAG_DF, CMD_WRITE, 6, 0, 512)),
        rej(6, CMD_WRITE, 0, 512, Errno::Inval)
    );
    // Reads, cache, flush and disconnect are fine.
    assert_eq!(
        single(p, &hdr(0, CMD_READ, 7, 0, 512)),
        req(7, 0, 512, Command::Read)
    );
    assert_eq!(
        single(p, &hdr(0, CMD_CACHE, 8, 0, 512)),
        req(8, 0, 512, Command::Cache)
    );
    assert_eq!(
        single(p, &hdr(CMD_FLAG_FUA, CMD_FLUSH, 9, 0, 0)),
        req(9, 0, 0, Command::Flush)
    );
    assert_eq!(
        single(p, &hdr(0, CMD_DISC, 10, 0, 0)),
        req(10, 0, 0, Command::Disconnect)
    );
}

#[test]
fn zero_length_is_einval() {
    for typ in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES] {
        // A zero-length write has no payload: the next request follows the header directly.
        let mut bytes = hdr(0, typ, 5, 512, 0);
        bytes.extend_from_slice(&hdr(0, CMD_READ, 6, 0, 512));
        let (results, consumed) = drive(rw(), &[&bytes]);
        assert_eq!(
            results,
            vec![
                rej(5, typ, 512, 0, Errno::Inval),
                req(6, 0, 512, Command::Read)
            ],
            "type {typ}"
        );
        assert_eq!(consumed, 56);
    }
}

#[test]
fn oversized_read_and_write_are_einval() {
    let max = MAX_PAYLOAD;
    assert_eq!(max, 32 * MIB);
    assert_eq!(
        single(rw(), &hdr(0, CMD_READ, 1, 0, max)),
        req(1, 0, max, Command::Read)
    );
    assert_eq!(
        single(rw(), &hdr(0, CMD_READ, 2, 0, max + 512)),
        rej(2, CMD_READ, 0, max + 512, Errno::Inval)
    );
    assert_eq!(
        single(rw(), &wire(0, CMD_WRITE, 3, 0, max)),
        req(3, 0, max, Command::Write { fua: false })
    );
    assert_eq!(
        single(rw(), &wire(0, CMD_WRITE, 4, 0, max + 512)),
        rej(4, CMD_WRITE, 0, max + 512, Errno::Inval)
    );
    // The limit is the advertised maximum, not a constant.
    let mut p = rw();
    p.block.maximum = 64 * 1024;
    assert_eq!(
        single(p, &hdr(0, CMD_READ, 5, 0, 65536)),
        req(5, 0, 65536, Command::Read)
    );
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 6, 0, 65536 + 512)),
        rej(6, CMD_WRITE, 0, 65536 + 512, Errno::Inval)
    );
    // TRIM, WRITE_ZEROES and CACHE carry no payload and may be larger.
    assert_eq!(
        single(p, &hdr(0, CMD_TRIM, 7, 0, 64 * MIB)),
        req(7, 0, 64 * MIB, Command::Trim { fua: false })
    );
    assert_eq!(
        single(p, &hdr(0, CMD_CACHE, 8, 0, 64 * MIB)),
        req(8, 0, 64 * MIB, Command::Cache)
    );
    assert_eq!(
        single(p, &hdr(0, CMD_WRITE_ZEROES, 9, 0, 64 * MIB)),
        req(
            9,
            0,
            64 * MIB,
            Command::WriteZeroes {
                fua: false,
                no_hole: false,
                fast: false
            }
        )
    );
}

#[test]
fn misaligned_requests_are_einval() {
    let p = params(SIZE, false, 4096, false);
    for typ in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES] {
        for (offset, len) in [
            (512, 4096),
            (4096, 512),
            (1, 4096),
            (4096, 4097),
            (8191, 8193),
        ] {
            assert_eq!(
                single(p, &wire(0, typ, 42, offset, len)),
                rej(42, typ, offset, len, Errno::Inval),
                "{typ} {offset} {len}"
            );
        }
        assert!(matches!(
            single(p, &wire(0, typ, 43, 8192, 4096)),
            Out::Req(..)
        ));
    }
    // Minimum block size 1 accepts anything in bounds.
    let p1 = params(SIZE, false, 1, false);
    assert_eq!(
        single(p1, &wire(0, CMD_WRITE, 44, 3, 5)),
        req(44, 3, 5, Command::Write { fua: false })
    );
    assert_eq!(
        single(p1, &hdr(0, CMD_READ, 45, SIZE - 1, 1)),
        req(45, SIZE - 1, 1, Command::Read)
    );
}

/// A client that did not agree to block sizes may address single bytes: the same
/// requests the test above refuses are accepted, while bounds, zero lengths and the
/// maximum payload still hold.
#[test]
fn a_client_without_block_sizes_may_address_single_bytes() {
    let p = TransmissionParams {
        block_sizes: false,
        ..params(SIZE, false, 4096, false)
    };
    for typ in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES] {
        for (offset, len) in [
            (512, 4096),
            (4096, 512),
            (1, 4096),
            (4096, 4097),
            (8191, 8193),
            (1, 1),
            (510, 3),
        ] {
            let Out::Req(r, payload) = single(p, &wire(0, typ, 42, offset, len)) else {
                panic!("{typ} {offset} {len} refused");
            };
            assert_eq!((r.offset, r.len), (offset, len));
            if typ == CMD_WRITE {
                assert_eq!(payload.len(), len as usize);
            }
        }
        let writes_data = typ == CMD_WRITE || typ == CMD_WRITE_ZEROES;
        let past = if writes_data {
            Errno::NoSpc
        } else {
            Errno::Inval
        };
        assert_eq!(
            single(p, &wire(0, typ, 43, SIZE - 1, 2)),
            rej(43, typ, SIZE - 1, 2, past),
            "{typ}"
        );
        assert!(matches!(
            single(p, &wire(0, typ, 44, SIZE - 1, 1)),
            Out::Req(..)
        ));
        assert_eq!(
            single(p, &wire(0, typ, 45, 3, 0)),
            rej(45, typ, 3, 0, Errno::Inval)
        );
    }
    let over = MAX_PAYLOAD + 1;
    assert_eq!(
        single(p, &hdr(0, CMD_READ, 46, 1, over)),
        rej(46, CMD_READ, 1, over, Errno::Inval)
    );
    // Bytes of a refused unaligned write are skipped as for any refused write.
    let agreed = params(SIZE, false, 4096, false);
    let stream = [wire(0, CMD_WRITE, 47, 1, 3), hdr(0, CMD_FLUSH, 48, 0, 0)].concat();
    let (items, _) = drive(agreed, &[&stream]);
    assert_eq!(
        items,
        vec![
            rej(47, CMD_WRITE, 1, 3, Errno::Inval),
            req(48, 0, 0, Command::Flush)
        ]
    );
}

#[test]
fn beyond_the_end_is_enospc_for_writes_einval_otherwise() {
    let p = rw();
    let expect = [
        (CMD_WRITE, Errno::NoSpc),
        (CMD_WRITE_ZEROES, Errno::NoSpc),
        (CMD_TRIM, Errno::Inval), // the spec groups trim with read here
        (CMD_READ, Errno::Inval),
        (CMD_CACHE, Errno::Inval),
    ];
    for (typ, errno) in expect {
        for (offset, len) in [
            (SIZE, 512),
            (SIZE - 512, 1024),
            (SIZE + (1 << 20), 512),
            (u64::MAX - 511, 512),
        ] {
            assert_eq!(
                single(p, &wire(0, typ, 3, offset, len)),
                rej(3, typ, offset, len, errno),
                "{typ} {offset} {len}"
            );
        }
        // Exactly at the end is fine.
        assert!(
            matches!(single(p, &wire(0, typ, 4, SIZE - 1024, 1024)), Out::Req(..)),
            "{typ}"
        );
    }
}

#[test]
fn offset_plus_len_overflow_is_beyond_the_end() {
    // On an export as large as it can be, offset + len wraps around u64.
    let size = u64::MAX;
    let p = params(size, false, 512, false);
    let offset = u64::MAX - 511; // aligned to 512
    assert_eq!(offset % 512, 0);
    for (typ, errno) in [
        (CMD_WRITE, Errno::NoSpc),
        (CMD_WRITE_ZEROES, Errno::NoSpc),
        (CMD_READ, Errno::Inval),
        (CMD_CACHE, Errno::Inval),
    ] {
        for len in [1024, 4096, 32 * MIB] {
            assert!(offset.checked_add(u64::from(len)).is_none());
            assert_eq!(
                single(p, &wire(0, typ, 8, offset, len)),
                rej(8, typ, offset, len, errno),
                "{typ} {len}"
            );
        }
    }
    assert_eq!(
        single(p, &hdr(0, CMD_TRIM, 9, offset, u32::MAX - 511)),
        rej(9, CMD_TRIM, offset, u32::MAX - 511, Errno::Inval)
    );
    // The last whole block below u64::MAX is reachable.
    assert_eq!(
        single(p, &hdr(0, CMD_READ, 10, offset - 512, 512)),
        req(10, offset - 512, 512, Command::Read)
    );
}

#[test]
fn flush_with_offset_or_length_is_einval() {
    for (offset, len) in [(512, 0), (0, 512), (4096, 4096), (1, 1)] {
        assert_eq!(
            single(rw(), &hdr(0, CMD_FLUSH, 11, offset, len)),
            rej(11, CMD_FLUSH, offset, len, Errno::Inval)
        );
    }
}

#[test]
fn validation_order_for_multiple_faults() {
    let p = params(SIZE, false, 4096, false);
    // Unknown flag beats zero length.
    assert_eq!(
        single(p, &hdr(1 << 9, CMD_READ, 1, 1, 0)),
        rej(1, CMD_READ, 1, 0, Errno::Inval)
    );
    // Zero length beats misalignment and bounds (both EINVAL for reads, so use a write).
    assert_eq!(
        single(p, &hdr(0, CMD_WRITE, 2, SIZE + 4096, 0)),
        rej(2, CMD_WRITE, SIZE + 4096, 0, Errno::Inval)
    );
    // Too long beats out of bounds.
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 3, SIZE, 32 * MIB + 4096)),
        rej(3, CMD_WRITE, SIZE, 32 * MIB + 4096, Errno::Inval)
    );
    // Misalignment beats out of bounds.
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 4, SIZE + 512, 4096)),
        rej(4, CMD_WRITE, SIZE + 512, 4096, Errno::Inval)
    );
    assert_eq!(
        single(p, &wire(0, CMD_WRITE, 5, SIZE + 4096, 4096)),
        rej(5, CMD_WRITE, SIZE + 4096, 4096, Errno::NoSpc)
    );
}

// ---------------------------------------------------------------------------------------------
// Payload skipping

#[test]
fn rejected_write_payload_is_skipped_exactly() {
    let bad = [
        wire(CMD_FLAG_NO_HOLE, CMD_WRITE, 1, 0, 4096), // bad flag
        wire(0, CMD_WRITE, 2, 100, 4096),              // misaligned
        wire(0, CMD_WRITE, 3, SIZE, 4096),             // beyond the end
        wire(0, CMD_WRITE, 4, 0, 1000),                // misaligned length
    ];
    let expect = [
        rej(1, CMD_WRITE, 0, 4096, Errno::Inval),
        rej(2, CMD_WRITE, 100, 4096, Errno::Inval),
        rej(3, CMD_WRITE, SIZE, 4096, Errno::NoSpc),
        rej(4, CMD_WRITE, 0, 1000, Errno::Inval),
    ];
    for (bytes, expect) in bad.iter().zip(expect) {
        let mut stream = bytes.clone();
        stream.extend_from_slice(&wire(0, CMD_WRITE, 100, 512, 512));
        stream.extend_from_slice(&hdr(0, CMD_READ, 101, 0, 512));
        // All at once: the rejection consumes header and payload in one call.
        let mut d = RequestDecoder::new(rw());
        let (n, out) = d.decode(&stream);
        assert_eq!((n, own(out)), (bytes.len(), expect.clone()));
        let (n2, out2) = d.decode(&stream[n..]);
        assert_eq!(
            (n2, own(out2)),
            (28 + 512, req(100, 512, 512, Command::Write { fua: false }))
        );
        let (n3, out3) = d.decode(&stream[n + n2..]);
        assert_eq!((n3, own(out3)), (28, req(101, 0, 512, Command::Read)));
        assert_eq!(n + n2 + n3, stream.len());

        // And in pieces of every small size.
        for piece in [1, 2, 3, 7, 27, 28, 29, 511, 4095] {
            let chunks: Vec<&[u8]> = stream.chunks(piece).collect();
            let (results, consumed) = drive(rw(), &chunks);
            assert_eq!(
                results,
                vec![
                    expect.clone(),
                    req(100, 512, 512, Command::Write { fua: false }),
                    req(101, 0, 512, Command::Read)
                ],
                "piece {piece}"
            );
            assert_eq!(consumed, stream.len());
        }
    }
}

#[test]
fn skipping_reports_progress_piece_by_piece() {
    let mut d = RequestDecoder::new(rw());
    let stream = wire(0, CMD_WRITE, 7, 3, 1024); // misaligned offset
                                                 // The header alone: consumed, skipping starts, nothing left to look at.
    let (n, out) = d.decode(&stream[..28]);
    assert_eq!((n, own(out)), (28, Out::NeedMore(1)));
    // An empty buffer while skipping consumes nothing.
    let (n, out) = d.decode(&[]);
    assert_eq!((n, own(out)), (0, Out::NeedMore(1)));
    // 1000 of the 1024 payload bytes.
    let (n, out) = d.decode(&stream[28..1028]);
    assert_eq!((n, own(out)), (1000, Out::NeedMore(1)));
    // The last 24 plus the start of the next request: only the 24 are taken.
    let mut rest = stream[1028..].to_vec();
    rest.extend_from_slice(&hdr(0, CMD_READ, 8, 0, 512));
    let (n, out) = d.decode(&rest);
    assert_eq!(
        (n, own(out)),
        (24, rej(7, CMD_WRITE, 3, 1024, Errno::Inval))
    );
    let (n, out) = d.decode(&rest[24..]);
    assert_eq!((n, own(out)), (28, req(8, 0, 512, Command::Read)));
}

#[test]
fn oversized_write_payload_over_32_mib_is_skipped() {
    let len = 32 * MIB + 4096;
    let mut stream = hdr(CMD_FLAG_FUA, CMD_WRITE, 0xabc, 0, len);
    stream.resize(stream.len() + len as usize, 0x5a);
    // The payload of the refused write looks like a request header: it must not be parsed.
    stream[28..56].copy_from_slice(&hdr(0, CMD_DISC, 0xdead, 0, 0));
    stream.extend_from_slice(&hdr(0, CMD_READ, 0xdef, 4096, 4096));
    let expect = vec![
        rej(0xabc, CMD_WRITE, 0, len, Errno::Inval),
        req(0xdef, 4096, 4096, Command::Read),
    ];
    for piece in [1 << 20, 65537, 28] {
        let chunks: Vec<&[u8]> = stream.chunks(piece).collect();
        let (results, consumed) = drive(rw(), &chunks);
        assert_eq!(results, expect, "piece {piece}");
        assert_eq!(consumed, stream.len());
    }
    // All at once.
    let mut d = RequestDecoder::new(rw());
    let (n, out) = d.decode(&stream);
    assert_eq!((n, own(out)), (28 + len as usize, expect[0].clone()));
}

// ---------------------------------------------------------------------------------------------
// Framing

#[test]
fn wrong_magic_is_fatal() {
    let mut bytes = hdr(0, CMD_READ, 1, 0, 512);
    bytes[0] = 0x26;
    let magic = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    assert_eq!(
        one(rw(), &bytes),
        (0, Out::Fatal(ProtocolError::BadMagic(magic)))
    );
    // A simple-reply magic (a confused client) too.
    let mut reply_magic = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    reply_magic.extend_from_slice(&[0; 24]);
    assert_eq!(
        one(rw(), &reply_magic),
        (0, Out::Fatal(ProtocolError::BadMagic(SIMPLE_REPLY_MAGIC)))
    );
    // After a skipped payload that was one byte too long, the next header is misframed.
    let mut stream = wire(0, CMD_WRITE, 2, 1, 512);
    stream.push(0);
    stream.extend_from_slice(&hdr(0, CMD_READ, 3, 0, 512));
    let (results, _) = drive(rw(), &[&stream]);
    assert_eq!(results[0], rej(2, CMD_WRITE, 1, 512, Errno::Inval));
    assert!(
        matches!(results[1], Out::Fatal(ProtocolError::BadMagic(_))),
        "{results:?}"
    );
}

#[test]
fn wrong_magic_is_only_detected_on_a_whole_header() {
    let bytes = [0u8; 27];
    assert_eq!(one(rw(), &bytes), (0, Out::NeedMore(28)));
}

#[test]
fn partial_header_needs_28() {
    let bytes = hdr(0, CMD_READ, 1, 0, 512);
    for cut in 0..28 {
        assert_eq!(
            one(rw(), &bytes[..cut]),
            (0, Out::NeedMore(28)),
            "cut {cut}"
        );
    }
}

#[test]
fn partial_write_payload_needs_header_plus_len() {
    let len = 8192u32;
    let bytes = wire(CMD_FLAG_FUA, CMD_WRITE, 12, 4096, len);
    let mut d = RequestDecoder::new(rw());
    for cut in [28, 29, 100, 28 + 8191] {
        let (n, out) = d.decode(&bytes[..cut]);
        assert_eq!(
            (n, own(out)),
            (0, Out::NeedMore(28 + len as usize)),
            "cut {cut}"
        );
    }
    // The same decoder then takes the whole thing.
    let (n, out) = d.decode(&bytes);
    assert_eq!(
        (n, own(out)),
        (
            bytes.len(),
            req(12, 4096, len, Command::Write { fua: true })
        )
    );
}

#[test]
fn long_mixed_stream_byte_by_byte() {
    let p = params(SIZE, false, 512, true);
    let stream = [
        wire(0, CMD_WRITE, 1, 0, 1024),
        wire(0, CMD_WRITE, 2, 1, 1024),
        hdr(CMD_FLAG_DF, CMD_READ, 3, 0, 512),
        hdr(0, 99, 4, 0, 512),
        wire(CMD_FLAG_FAST_ZERO, CMD_WRITE, 5, 0, 512),
        hdr(0, CMD_FLUSH, 6, 0, 0),
        hdr(0, CMD_TRIM, 7, SIZE, 512),
        hdr(0, CMD_DISC, 8, 0, 0),
    ]
    .concat();
    let expect = vec![
        req(1, 0, 1024, Command::Write { fua: false }),
        rej(2, CMD_WRITE, 1, 1024, Errno::Inval),
        req(3, 0, 512, Command::Read),
        rej(4, 99, 0, 512, Errno::Inval),
        rej(5, CMD_WRITE, 0, 512, Errno::Inval),
        req(6, 0, 0, Command::Flush),
        rej(7, CMD_TRIM, SIZE, 512, Errno::Inval),
        req(8, 0, 0, Command::Disconnect),
    ];
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(drive(p, &bytes), (expect.clone(), stream.len()));
    assert_eq!(drive(p, &[&stream]), (expect, stream.len()));
}

// ---------------------------------------------------------------------------------------------
// Property tests

fn block_sizes() -> impl Strategy<Value = BlockSizes> {
    (
        prop_oneof![Just(1u32), Just(512), Just(4096), Just(65536)],
        0u32..3,
    )
        .prop_map(|(minimum, k)| {
            let mut b = BlockSizes::new(minimum);
            // Small maxima keep oversized writes cheap; 32 MiB stays possible.
            b.maximum = match k {
                0 => b.preferred,
                1 => b.preferred * 4,
                _ => MAX_PAYLOAD,
            };
            b
        })
}

fn params_strategy() -> impl Strategy<Value = TransmissionParams> {
    let size = prop_oneof![
        Just(0u64),
        (1u64..=256).prop_map(|k| k * 4096),
        any::<u64>(),
        Just(u64::MAX),
        Just(u64::MAX - 65535),
    ];
    // A metadata context is only ever negotiated with structured replies; the decoder must
    // still refuse block status if handed one without them.
    let meta = prop_oneof![Just(None), (1u32..4).prop_map(Some)];
    (
        size,
        any::<bool>(),
        block_sizes(),
        any::<bool>(),
        meta,
        any::<bool>(),
    )
        .prop_map(
            |(size, read_only, block, structured_replies, meta_context, agreed)| {
                TransmissionParams {
                    size,
                    read_only,
                    block,
                    structured_replies,
                    meta_context,
                    block_sizes: agreed,
                }
            },
        )
}

/// Splits `stream` into chunks whose sizes cycle through `sizes`.
fn split<'a>(stream: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut chunks = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < stream.len() {
        let n = sizes[i % sizes.len()].max(1).min(stream.len() - at);
        chunks.push(&stream[at..at + n]);
        at += n;
        i += 1;
    }
    chunks
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![8 => 1usize..40, 3 => 40usize..600, 1 => 600usize..20000],
        1..16,
    )
}

/// A segment of a hostile stream: random bytes, or a header with random fields (the magic
/// right) followed by a random amount of payload.
fn segment() -> impl Strategy<Value = Vec<u8>> {
    let len = prop_oneof![any::<u32>(), 0u32..70000, (0u32..64).prop_map(|k| k * 512)];
    let offset = prop_oneof![
        any::<u64>(),
        (0u64..4096).prop_map(|k| k * 4096),
        u64::MAX - 70000..=u64::MAX
    ];
    let flags = prop_oneof![any::<u16>(), 0u16..32];
    let typ = prop_oneof![0u16..8, any::<u16>()];
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..64),
        6 => (flags, typ, any::<u64>(), offset, len, 0usize..70000).prop_map(|(f, t, c, o, l, body)| {
            let mut v = hdr(f, t, c, o, l);
            let body = if t == CMD_WRITE { body.min(l as usize) } else { body % 8 };
            v.extend((0..body).map(|i| i as u8));
            v
        }),
    ]
}

// ---- The model

#[derive(Clone, Debug)]
struct ModelReq {
    flags: u16,
    typ: u16,
    offset: u64,
    len: u32,
}

/// The spec's rules, written independently of the decoder, in the decoder's documented order.
fn model(p: &TransmissionParams, r: &ModelReq) -> Result<Command, Errno> {
    let ModelReq {
        flags,
        typ,
        offset,
        len,
    } = *r;
    if typ > CMD_BLOCK_STATUS {
        return Err(Errno::Inval);
    }
    let block_status = typ == CMD_BLOCK_STATUS;
    if block_status && (p.meta_context.is_none() || !p.structured_replies) {
        return Err(Errno::Inval);
    }
    let mut allowed = if block_status {
        CMD_FLAG_REQ_ONE
    } else {
        CMD_FLAG_FUA
    };
    if typ == CMD_WRITE_ZEROES {
        allowed |= CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO;
    }
    if typ == CMD_READ && p.structured_replies {
        allowed |= CMD_FLAG_DF;
    }
    if flags & !allowed != 0 {
        return Err(Errno::Inval);
    }
    let fua = flags & CMD_FLAG_FUA != 0;
    match typ {
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH if offset == 0 && len == 0 => return Ok(Command::Flush),
        CMD_FLUSH => return Err(Errno::Inval),
        _ => {}
    }
    let modifies = [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES].contains(&typ);
    if p.read_only && modifies {
        return Err(Errno::Perm);
    }
    if len == 0 {
        return Err(Errno::Inval);
    }
    if (typ == CMD_READ || typ == CMD_WRITE) && len > p.block.maximum {
        return Err(Errno::Inval);
    }
    let min = u64::from(p.block.minimum);
    if p.block_sizes && (offset % min != 0 || u64::from(len) % min != 0) {
        return Err(Errno::Inval);
    }
    if u128::from(offset) + u128::from(len) > u128::from(p.size) {
        return Err(if typ == CMD_WRITE || typ == CMD_WRITE_ZEROES {
            Errno::NoSpc
        } else {
            Errno::Inval
        });
    }
    Ok(match typ {
        CMD_READ => Command::Read,
        CMD_WRITE => Command::Write { fua },
        CMD_TRIM => Command::Trim { fua },
        CMD_CACHE => Command::Cache,
        CMD_BLOCK_STATUS => Command::BlockStatus {
            req_one: flags & CMD_FLAG_REQ_ONE != 0,
            context: p.meta_context.unwrap(),
        },
        _ => Command::WriteZeroes {
            fua,
            no_hole: flags & CMD_FLAG_NO_HOLE != 0,
            fast: flags & CMD_FLAG_FAST_ZERO != 0,
        },
    })
}

/// Requests that are mostly plausible: offsets and lengths near block multiples, near the
/// end of the export, or overflowing; payloads stay small.
fn model_req(p: TransmissionParams) -> impl Strategy<Value = ModelReq> {
    let min = u64::from(p.block.minimum);
    let max = p.block.maximum;
    let size = p.size;
    let typ = prop_oneof![
        3 => Just(CMD_READ),
        4 => Just(CMD_WRITE),
        1 => Just(CMD_DISC),
        2 => Just(CMD_FLUSH),
        2 => Just(CMD_TRIM),
        1 => Just(CMD_CACHE),
        2 => Just(CMD_WRITE_ZEROES),
        2 => Just(CMD_BLOCK_STATUS),
        1 => 8u16..=u16::MAX,
    ];
    let flags = prop_oneof![
        6 => Just(0u16),
        2 => Just(CMD_FLAG_FUA),
        1 => Just(CMD_FLAG_DF),
        1 => Just(CMD_FLAG_NO_HOLE),
        1 => Just(CMD_FLAG_FAST_ZERO),
        1 => Just(CMD_FLAG_REQ_ONE),
        1 => Just(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO),
        1 => (0u32..16).prop_map(|b| 1u16 << b),
    ];
    let len = prop_oneof![
        6 => (1u64..=8).prop_map(move |k| (k * min) as u32),
        1 => Just(0u32),
        1 => (1u64..=8).prop_map(move |k| (k * min + 1) as u32),
        1 => Just(max),
        1 => Just(max.saturating_add(p.block.minimum)),
        1 => Just(u32::MAX),
    ];
    (typ, flags, len, 0u32..8, 0u64..64).prop_map(move |(typ, flags, len, where_, k)| {
        // Writes carry their length as payload; keep it reasonable.
        let len = if typ == CMD_WRITE && len > 256 * 1024 {
            max.saturating_add(p.block.minimum).min(256 * 1024)
        } else {
            len
        };
        let l = u64::from(len);
        let offset = match where_ {
            0..=2 => k * min,
            3 => size.saturating_sub(l) / min * min, // at the end
            4 => size,
            5 => k * min + 1,
            6 => u64::MAX / min * min - k * min, // aligned, overflows with most lengths
            _ => size.saturating_add(k * min),
        };
        let (offset, len) = if typ == CMD_FLUSH || typ == CMD_DISC {
            if where_ < 6 {
                (0, 0)
            } else {
                (offset, len)
            }
        } else {
            (offset, len)
        };
        ModelReq {
            flags,
            typ,
            offset,
            len,
        }
    })
}

fn model_case() -> impl Strategy<Value = (TransmissionParams, Vec<ModelReq>, Vec<usize>, bool)> {
    params_strategy().prop_flat_map(|p| {
        (
            Just(p),
            prop::collection::vec(model_req(p), 0..40),
            chunk_sizes(),
            prop::bool::weighted(0.2),
        )
    })
}

proptest! {
    /// Arbitrary streams in arbitrary chunks: no panic, never more consumed than given, the
    /// payload contract, every accepted request in bounds and aligned (checked in `drive`).
    #[test]
    fn decoder_is_robust(
        p in params_strategy(),
        segments in prop::collection::vec(segment(), 0..12),
        sizes in chunk_sizes(),
    ) {
        let stream = segments.concat();
        let chunks = split(&stream, &sizes);
        let (results, consumed) = drive(p, &chunks);
        prop_assert!(consumed <= stream.len());
        // A fatal error can only be the last item.
        for r in results.iter().rev().skip(1) {
            prop_assert!(!matches!(r, Out::Fatal(_)));
        }
        // The same stream in one piece gives the same items.
        let whole = drive(p, &[&stream]);
        prop_assert_eq!(&whole, &(results, consumed));
    }

    /// A random sequence of valid and invalid requests, encoded and fed in random chunks,
    /// decodes to exactly what the model says, in order.
    #[test]
    fn decoder_matches_model((p, reqs, sizes, bad_tail) in model_case()) {
        let mut stream = Vec::new();
        let mut expect = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let cookie = (i as u64) << 32 | u64::from(r.typ);
            stream.extend_from_slice(&wire(r.flags, r.typ, cookie, r.offset, r.len));
            expect.push(match model(&p, r) {
                Ok(command) => req(cookie, r.offset, r.len, command),
                Err(errno) => rej(cookie, r.typ, r.offset, r.len, errno),
            });
        }
        if bad_tail {
            stream.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            stream.extend_from_slice(&[0; 24]);
            expect.push(Out::Fatal(ProtocolError::BadMagic(0xdead_beef)));
        }
        let full = stream.len() - if bad_tail { 28 } else { 0 };
        let chunks = split(&stream, &sizes);
        let (results, consumed) = drive(p, &chunks);
        prop_assert_eq!(consumed, full);
        prop_assert_eq!(results.len(), expect.len());
        for (i, (got, want)) in results.iter().zip(&expect).enumerate() {
            prop_assert_eq!(got, want, "item {} of {:?}", i, reqs.get(i));
        }
    }
}

#[test]
fn large_writes_can_be_streamed_by_the_caller() {
    let params = TransmissionParams {
        size: 64 << 20,
        read_only: false,
        block: tandem_frontend::nbd::BlockSizes::new(512),
        structured_replies: false,
        meta_context: None,
        block_sizes: true,
    };
    let mut d = RequestDecoder::new(params);
    d.stream_writes_from(1 << 20);
    let mut buf = Vec::new();
    tandem_frontend::nbd::request::encode_request(&mut buf, 0, 1, 7, 4096, 1 << 20);
    buf.extend_from_slice(&[5u8; 1000]);
    // Payload incomplete: only the header is taken and the caller reads the payload.
    let (n, out) = d.decode(&buf);
    assert_eq!(n, REQUEST_HEADER_LEN);
    assert_eq!(
        out,
        Decoded::WriteHeader(Request {
            cookie: 7,
            offset: 4096,
            len: 1 << 20,
            command: Command::Write { fua: false }
        })
    );
    // Smaller writes, and large ones already complete, decode as usual.
    let mut small = Vec::new();
    tandem_frontend::nbd::request::encode_request(&mut small, 0, 1, 8, 0, 4096);
    small.extend_from_slice(&[1u8; 4096]);
    assert!(
        matches!(d.decode(&small), (n, Decoded::Request(..)) if n == 4096 + REQUEST_HEADER_LEN)
    );
    let mut whole = Vec::new();
    tandem_frontend::nbd::request::encode_request(&mut whole, 0, 1, 9, 0, 1 << 20);
    whole.resize(REQUEST_HEADER_LEN + (1 << 20), 3);
    assert!(matches!(d.decode(&whole), (_, Decoded::Request(..))));
    // A refused large write is still skipped by the decoder, never handed over.
    let mut bad = Vec::new();
    tandem_frontend::nbd::request::encode_request(&mut bad, 0, 1, 10, 63 << 20, 2 << 20);
    assert!(matches!(d.decode(&bad), (n, Decoded::NeedMore { .. }) if n == REQUEST_HEADER_LEN));
}
