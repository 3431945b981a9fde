//! Tests of the server handshake state machine against hand-built client byte streams.
//! Replies are compared byte for byte with what `doc/proto.md` prescribes.

use proptest::prelude::*;
use tandem_frontend::nbd::handshake::{MAX_OPTIONS, MAX_OPTION_LEN};
use tandem_frontend::nbd::wire::*;
use tandem_frontend::nbd::{
    BlockSizes, CloseReason, ExportInfo, Handshake, HandshakeStep, Negotiated,
};

const GIB: u64 = 1 << 30;

/// Transmission flags we expect, spelled out as numbers so a change of
/// `ExportInfo::transmission_flags` has to be deliberate.
/// HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | CAN_MULTI_CONN | SEND_CACHE | SEND_FAST_ZERO
const RW_FLAGS: u16 = 0x0d6d;
/// ... plus SEND_DF.
const RW_FLAGS_STRUCTURED: u16 = 0x0ded;
/// HAS_FLAGS | READ_ONLY | SEND_FLUSH | SEND_FUA | CAN_MULTI_CONN | SEND_CACHE
const RO_FLAGS: u16 = 0x050f;
const RO_FLAGS_STRUCTURED: u16 = 0x058f;

fn export(name: &str, description: &str, size: u64, read_only: bool, minimum: u32) -> ExportInfo {
    ExportInfo {
        name: name.to_string(),
        description: description.to_string(),
        size,
        read_only,
        block: BlockSizes::new(minimum),
    }
}

/// exports[0] is the default; the table has a read-only export without description.
fn exports() -> Vec<ExportInfo> {
    vec![
        export("disk0", "the first disk", GIB, false, 512),
        export("archive", "", 3 * GIB + 4096, true, 4096),
        export("scratch", "temp", 64 << 20, false, 1),
    ]
}

fn flags(f: u32) -> Vec<u8> {
    f.to_be_bytes().to_vec()
}

/// The client flags every well-behaved modern client sends.
fn modern() -> Vec<u8> {
    flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
}

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Payload of NBD_OPT_INFO / NBD_OPT_GO.
fn info_data(name: &[u8], items: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name);
    v.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    option: u32,
    kind: u32,
    payload: Vec<u8>,
}

/// Splits the server's output into option replies; panics on anything malformed.
fn replies(mut out: &[u8]) -> Vec<Reply> {
    let mut v = Vec::new();
    while !out.is_empty() {
        assert!(out.len() >= 20, "truncated reply header: {out:?}");
        let magic = u64::from_be_bytes(out[0..8].try_into().unwrap());
        assert_eq!(magic, OPTION_REPLY_MAGIC, "bad reply magic");
        let option = u32::from_be_bytes(out[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(out.len() >= 20 + len, "truncated reply payload");
        v.push(Reply {
            option,
            kind,
            payload: out[20..20 + len].to_vec(),
        });
        out = &out[20 + len..];
    }
    v
}

fn kinds(out: &[u8]) -> Vec<(u32, u32)> {
    replies(out)
        .into_iter()
        .map(|r| (r.option, r.kind))
        .collect()
}

fn run_with(
    input: &[u8],
    exports: &[ExportInfo],
    shutting_down: bool,
) -> (usize, HandshakeStep, Vec<u8>) {
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let (n, step) = hs.feed(input, exports, shutting_down, &mut out);
    assert!(n <= input.len());
    // Once finished, the state machine takes nothing more.
    if step != HandshakeStep::NeedMore {
        let before = out.len();
        let (n2, step2) = hs.feed(&input[n..], exports, shutting_down, &mut out);
        assert_eq!((n2, step2), (0, HandshakeStep::NeedMore));
        let (n3, step3) = hs.feed(&modern(), exports, shutting_down, &mut out);
        assert_eq!((n3, step3), (0, HandshakeStep::NeedMore));
        assert_eq!(out.len(), before, "output after the handshake ended");
    }
    (n, step, out)
}

fn run(input: &[u8]) -> (usize, HandshakeStep, Vec<u8>) {
    run_with(input, &exports(), false)
}

fn done(export: usize, structured_replies: bool, transmission_flags: u16) -> HandshakeStep {
    HandshakeStep::Done(Negotiated {
        export,
        structured_replies,
        transmission_flags,
        meta_context: None,
        block_sizes: false,
    })
}

/// `step` (a `Done`) for a client that asked for `NBD_INFO_BLOCK_SIZE` in its GO.
fn sized(step: HandshakeStep) -> HandshakeStep {
    match step {
        HandshakeStep::Done(n) => HandshakeStep::Done(Negotiated {
            block_sizes: true,
            ..n
        }),
        other => other,
    }
}

/// [`done`] with `base:allocation` selected (id 1).
fn done_meta(export: usize, transmission_flags: u16) -> HandshakeStep {
    HandshakeStep::Done(Negotiated {
        export,
        structured_replies: true,
        transmission_flags,
        meta_context: Some(1),
        block_sizes: false,
    })
}

fn info_export(size: u64, flags: u16) -> Vec<u8> {
    cat(&[
        &INFO_EXPORT.to_be_bytes(),
        &size.to_be_bytes(),
        &flags.to_be_bytes(),
    ])
}

fn info_block(min: u32, pref: u32, max: u32) -> Vec<u8> {
    cat(&[
        &INFO_BLOCK_SIZE.to_be_bytes(),
        &min.to_be_bytes(),
        &pref.to_be_bytes(),
        &max.to_be_bytes(),
    ])
}

fn rep(option: u32, kind: u32, payload: &[u8]) -> Reply {
    Reply {
        option,
        kind,
        payload: payload.to_vec(),
    }
}

// ---------------------------------------------------------------------------------------------
// Greeting and client flags

#[test]
fn greeting_is_fixed_newstyle_with_no_zeroes() {
    let mut out = vec![0xaa];
    Handshake::greeting(&mut out);
    assert_eq!(
        out,
        [
            &[0xaa][..],
            b"NBDMAGIC",
            b"IHAVEOPT",
            &[0x00, 0x03], // FIXED_NEWSTYLE | NO_ZEROES
        ]
        .concat()
    );
}

#[test]
fn partial_client_flags_wait() {
    for len in 0..4 {
        let (n, step, out) = run(&modern()[..len]);
        assert_eq!((n, step), (0, HandshakeStep::NeedMore), "{len} bytes");
        assert!(out.is_empty());
    }
    // Complete flags and nothing else: consumed, still waiting for options.
    let (n, step, out) = run(&modern());
    assert_eq!((n, step), (4, HandshakeStep::NeedMore));
    assert!(out.is_empty());
}

#[test]
fn unknown_client_flags_close() {
    for f in [
        1u32 << 2,
        1 << 31,
        0xffff_ffff,
        FLAG_C_FIXED_NEWSTYLE | 1 << 5,
    ] {
        let input = cat(&[&flags(f), &opt(OPT_GO, &info_data(b"", &[]))]);
        let (n, step, out) = run(&input);
        assert_eq!(n, 4, "flags {f:#x}");
        assert_eq!(step, HandshakeStep::Close(CloseReason::BadClientFlags(f)));
        assert!(out.is_empty());
    }
}

#[test]
fn client_without_fixed_newstyle_is_closed() {
    for f in [0, FLAG_C_NO_ZEROES] {
        let input = cat(&[&flags(f), &opt(OPT_EXPORT_NAME, b"")]);
        let (n, step, out) = run(&input);
        assert_eq!(
            (n, step),
            (4, HandshakeStep::Close(CloseReason::NotFixedNewstyle)),
            "flags {f:#x}"
        );
        assert!(out.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// Option framing

#[test]
fn bad_option_magic_closes() {
    let mut bad = opt(OPT_GO, &info_data(b"", &[]));
    bad[7] ^= 1;
    let magic = u64::from_be_bytes(bad[0..8].try_into().unwrap());
    let (n, step, out) = run(&cat(&[&modern(), &bad]));
    assert_eq!(n, 4 + 16);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::BadOptionMagic(magic))
    );
    assert!(out.is_empty());

    // After a good option too; the replies to the good one stay in the output.
    let input = cat(&[&modern(), &opt(OPT_STRUCTURED_REPLY, b""), &bad]);
    let (n, step, out) = run(&input);
    assert_eq!(n, 4 + 16 + 16);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::BadOptionMagic(magic))
    );
    assert_eq!(replies(&out), vec![rep(OPT_STRUCTURED_REPLY, REP_ACK, b"")]);
}

#[test]
fn partial_option_waits_without_consuming() {
    let full = cat(&[
        &modern(),
        &opt(OPT_LIST, b""),
        &opt(OPT_GO, &info_data(b"disk0", &[])),
    ]);
    let list_end = 4 + 16;
    for cut in list_end..full.len() {
        let (n, step, out) = run(&full[..cut]);
        assert_eq!(step, HandshakeStep::NeedMore, "cut at {cut}");
        assert_eq!(n, list_end);
        assert_eq!(
            kinds(&out),
            vec![
                (OPT_LIST, REP_SERVER),
                (OPT_LIST, REP_SERVER),
                (OPT_LIST, REP_SERVER),
                (OPT_LIST, REP_ACK)
            ]
        );
    }
    let (n, step, _) = run(&full);
    assert_eq!((n, step), (full.len(), done(0, false, RW_FLAGS)));
}

#[test]
fn option_too_long_closes_without_waiting_for_data() {
    for len in [MAX_OPTION_LEN + 1, 1 << 20, u32::MAX] {
        let mut input = modern();
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&OPT_INFO.to_be_bytes());
        input.extend_from_slice(&len.to_be_bytes());
        // No data at all: must not wait for it.
        let (n, step, out) = run(&input);
        assert_eq!(n, 4 + 16);
        assert_eq!(
            step,
            HandshakeStep::Close(CloseReason::OptionTooLong {
                option: OPT_INFO,
                len
            })
        );
        assert!(out.is_empty());
    }
}

#[test]
fn option_of_exactly_max_len_is_read() {
    let data = vec![7u8; MAX_OPTION_LEN as usize];
    let input = cat(&[&modern(), &opt(0x4242, &data)]);
    // One byte short: waits for the rest.
    let (n, step, out) = run(&input[..input.len() - 1]);
    assert_eq!((n, step), (4, HandshakeStep::NeedMore));
    assert!(out.is_empty());
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(kinds(&out), vec![(0x4242, REP_ERR_UNSUP)]);
}

#[test]
fn more_than_max_options_closes() {
    let mut input = modern();
    for _ in 0..MAX_OPTIONS {
        input.extend_from_slice(&opt(99, b""));
    }
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(replies(&out).len(), MAX_OPTIONS as usize);

    let mut more = input.clone();
    more.extend_from_slice(&opt(OPT_GO, &info_data(b"", &[])));
    let (n, step, out) = run(&more);
    assert_eq!(
        (n, step),
        (
            more.len(),
            HandshakeStep::Close(CloseReason::TooManyOptions)
        )
    );
    // The 1025th option gets no reply.
    assert_eq!(replies(&out).len(), MAX_OPTIONS as usize);
    assert!(replies(&out)
        .iter()
        .all(|r| r.option == 99 && r.kind == REP_ERR_UNSUP));
}

#[test]
fn the_max_th_option_may_still_be_go() {
    let mut input = modern();
    for _ in 0..MAX_OPTIONS - 1 {
        input.extend_from_slice(&opt(99, b""));
    }
    input.extend_from_slice(&opt(OPT_GO, &info_data(b"", &[])));
    let (n, step, _) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, false, RW_FLAGS)));
}

// ---------------------------------------------------------------------------------------------
// Individual options

#[test]
fn unknown_option_is_unsupported_and_haggling_continues() {
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let input = cat(&[
        &modern(),
        &opt(11, b"ext"), // EXTENDED_HEADERS
        &opt(0xdead_beef, b""),
        &opt(OPT_GO, &info_data(b"scratch", &[])),
    ]);
    let (n, step) = hs.feed(&input, &exports(), false, &mut out);
    assert_eq!((n, step), (input.len(), done(2, false, RW_FLAGS)));
    let r = replies(&out);
    assert_eq!((r[0].option, r[0].kind), (11, REP_ERR_UNSUP));
    assert_eq!((r[1].option, r[1].kind), (0xdead_beef, REP_ERR_UNSUP));
    // Error payloads are human-readable UTF-8.
    assert!(std::str::from_utf8(&r[0].payload).is_ok());
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    let refusals = hs.take_refusals();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(refusals[0].contains("EXTENDED_HEADERS"), "{refusals:?}");
    assert!(hs.take_refusals().is_empty());
}

#[test]
fn list_with_data_is_invalid() {
    let (n, step, out) = run(&cat(&[&modern(), &opt(OPT_LIST, b"x")]));
    assert_eq!((n, step), (4 + 17, HandshakeStep::NeedMore));
    assert_eq!(kinds(&out), vec![(OPT_LIST, REP_ERR_INVALID)]);
}

#[test]
fn list_lists_named_exports() {
    let mut table = exports();
    // An unnamed default export is reachable but not listed.
    table.insert(0, export("", "default", GIB, false, 512));
    let (n, step, out) = run_with(&cat(&[&modern(), &opt(OPT_LIST, b"")]), &table, false);
    assert_eq!((n, step), (20, HandshakeStep::NeedMore));
    assert_eq!(
        replies(&out),
        vec![
            rep(
                OPT_LIST,
                REP_SERVER,
                &cat(&[&5u32.to_be_bytes(), b"disk0", b"the first disk"])
            ),
            rep(
                OPT_LIST,
                REP_SERVER,
                &cat(&[&7u32.to_be_bytes(), b"archive"])
            ),
            rep(
                OPT_LIST,
                REP_SERVER,
                &cat(&[&7u32.to_be_bytes(), b"scratch", b"temp"])
            ),
            rep(OPT_LIST, REP_ACK, b""),
        ]
    );
    // Exact framing of the first reply.
    let mut expect = Vec::new();
    expect.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    expect.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 23, 0, 0, 0, 5]);
    expect.extend_from_slice(b"disk0the first disk");
    assert_eq!(&out[..expect.len()], &expect[..]);

    // No exports at all: just the ACK.
    let (_, _, out) = run_with(&cat(&[&modern(), &opt(OPT_LIST, b"")]), &[], false);
    assert_eq!(replies(&out), vec![rep(OPT_LIST, REP_ACK, b"")]);
}

#[test]
fn structured_reply_twice_is_invalid() {
    let input = cat(&[
        &modern(),
        &opt(OPT_STRUCTURED_REPLY, b""),
        &opt(OPT_STRUCTURED_REPLY, b""),
        &opt(OPT_GO, &info_data(b"", &[])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, true, RW_FLAGS_STRUCTURED)));
    let k = kinds(&out);
    assert_eq!(k[0], (OPT_STRUCTURED_REPLY, REP_ACK));
    assert_eq!(k[1], (OPT_STRUCTURED_REPLY, REP_ERR_INVALID));
    assert_eq!(replies(&out)[0].payload, b"");
}

#[test]
fn structured_reply_with_data_is_invalid_and_not_negotiated() {
    let input = cat(&[
        &modern(),
        &opt(OPT_STRUCTURED_REPLY, b"\0"),
        &opt(OPT_GO, &info_data(b"", &[])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, false, RW_FLAGS)));
    assert_eq!(kinds(&out)[0], (OPT_STRUCTURED_REPLY, REP_ERR_INVALID));
}

#[test]
fn starttls_is_refused_by_policy() {
    let (n, step, out) = run(&cat(&[&modern(), &opt(OPT_STARTTLS, b"")]));
    assert_eq!((n, step), (20, HandshakeStep::NeedMore));
    assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ERR_POLICY)]);
}

#[test]
fn info_for_unknown_export_is_unknown() {
    let input = cat(&[&modern(), &opt(OPT_INFO, &info_data(b"nope", &[INFO_NAME]))]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(kinds(&out), vec![(OPT_INFO, REP_ERR_UNKNOWN)]);

    let input = cat(&[
        &modern(),
        &opt(OPT_GO, &info_data(b"nope", &[])),
        &opt(OPT_GO, &info_data(b"disk0", &[])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, false, RW_FLAGS)));
    assert_eq!(kinds(&out)[0], (OPT_GO, REP_ERR_UNKNOWN));

    // The empty name with no exports at all.
    let input = cat(&[&modern(), &opt(OPT_GO, &info_data(b"", &[]))]);
    let (n, step, out) = run_with(&input, &[], false);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(kinds(&out), vec![(OPT_GO, REP_ERR_UNKNOWN)]);
}

#[test]
fn info_with_inconsistent_lengths_is_invalid() {
    let good = info_data(b"disk0", &[INFO_NAME]);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short name length", vec![0, 0, 0]),
        ("no count", good[..4 + 5].to_vec()),
        ("half a count", good[..4 + 5 + 1].to_vec()),
        ("missing request", good[..good.len() - 1].to_vec()),
        ("trailing byte", cat(&[&good, &[0]])),
        ("trailing request", cat(&[&good, &[0, 2]])),
        (
            "name longer than data",
            cat(&[&100u32.to_be_bytes(), b"disk0", &[0, 0]]),
        ),
        (
            "name length huge",
            cat(&[&u32::MAX.to_be_bytes(), b"disk0", &[0, 0]]),
        ),
        (
            "name over 4096 bytes",
            info_data(&vec![b'a'; MAX_STRING + 1], &[]),
        ),
        ("name not utf-8", info_data(b"disk\xff", &[])),
        ("name with NUL", info_data(b"disk0\0", &[])),
    ];
    // Count says 2 requests, data has 1.
    let mut c = info_data(b"disk0", &[INFO_NAME]);
    c[4 + 5 + 1] = 2;
    cases.push(("count too high", c));
    for option in [OPT_INFO, OPT_GO] {
        for (what, data) in &cases {
            let input = cat(&[&modern(), &opt(option, data)]);
            let (n, step, out) = run(&input);
            assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore), "{what}");
            assert_eq!(kinds(&out), vec![(option, REP_ERR_INVALID)], "{what}");
        }
    }
    // A name of exactly 4096 bytes is well-formed (and unknown).
    let input = cat(&[
        &modern(),
        &opt(OPT_INFO, &info_data(&vec![b'a'; MAX_STRING], &[])),
    ]);
    assert_eq!(kinds(&run(&input).2), vec![(OPT_INFO, REP_ERR_UNKNOWN)]);
}

#[test]
fn info_replies_export_and_block_size() {
    let input = cat(&[
        &modern(),
        &opt(OPT_INFO, &info_data(b"disk0", &[INFO_BLOCK_SIZE])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(
        replies(&out),
        vec![
            rep(OPT_INFO, REP_INFO, &info_export(GIB, RW_FLAGS)),
            rep(OPT_INFO, REP_INFO, &info_block(512, 4096, 32 << 20)),
            rep(OPT_INFO, REP_ACK, b""),
        ]
    );
    // Byte-exact check of the first reply.
    let mut expect = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
    expect.extend_from_slice(&[0, 0, 0, 6, 0, 0, 0, 3, 0, 0, 0, 12, 0, 0]);
    expect.extend_from_slice(&[0, 0, 0, 0, 0x40, 0, 0, 0, 0x0d, 0x6d]);
    assert_eq!(&out[..expect.len()], &expect[..]);
}

#[test]
fn info_replies_name_and_description_when_asked() {
    let input = cat(&[
        &modern(),
        &opt(OPT_STRUCTURED_REPLY, b""),
        // Unknown info items are ignored; the order of the request does not matter.
        &opt(
            OPT_INFO,
            &info_data(b"", &[INFO_DESCRIPTION, 77, INFO_NAME, INFO_BLOCK_SIZE]),
        ),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(
        replies(&out)[1..],
        [
            rep(OPT_INFO, REP_INFO, &info_export(GIB, RW_FLAGS_STRUCTURED)),
            rep(
                OPT_INFO,
                REP_INFO,
                &cat(&[&INFO_NAME.to_be_bytes(), b"disk0"])
            ),
            rep(
                OPT_INFO,
                REP_INFO,
                &cat(&[&INFO_DESCRIPTION.to_be_bytes(), b"the first disk"])
            ),
            rep(OPT_INFO, REP_INFO, &info_block(512, 4096, 32 << 20)),
            rep(OPT_INFO, REP_ACK, b""),
        ]
    );

    // An export without description gets no DESCRIPTION item.
    let input = cat(&[
        &modern(),
        &opt(
            OPT_INFO,
            &info_data(b"archive", &[INFO_NAME, INFO_DESCRIPTION]),
        ),
    ]);
    let (_, _, out) = run(&input);
    assert_eq!(
        replies(&out),
        vec![
            rep(OPT_INFO, REP_INFO, &info_export(3 * GIB + 4096, RO_FLAGS)),
            rep(
                OPT_INFO,
                REP_INFO,
                &cat(&[&INFO_NAME.to_be_bytes(), b"archive"])
            ),
            rep(OPT_INFO, REP_ACK, b""),
        ]
    );
}

/// Block sizes go only to a client that asks: one that does not is served at any byte
/// granularity (the spec's default minimum of 1), which an unasked 512 would contradict.
/// A GO that asks binds the client to them (`Negotiated::block_sizes`); an INFO that asked
/// before a GO that does not binds nothing.
#[test]
fn block_sizes_are_sent_to_clients_that_ask_and_bind_only_their_go() {
    for (options, export, sized_go) in [
        (
            opt(OPT_GO, &info_data(b"archive", &[INFO_BLOCK_SIZE])),
            1,
            true,
        ),
        (opt(OPT_GO, &info_data(b"archive", &[])), 1, false),
        (
            cat(&[
                &opt(OPT_INFO, &info_data(b"", &[INFO_BLOCK_SIZE])),
                &opt(OPT_GO, &info_data(b"", &[INFO_NAME])),
            ]),
            0,
            false,
        ),
    ] {
        let input = cat(&[&modern(), &options]);
        let (n, step, out) = run(&input);
        let HandshakeStep::Done(neg) = step else {
            panic!("not done: {step:?}");
        };
        assert_eq!(
            (n, neg.export, neg.block_sizes),
            (input.len(), export, sized_go)
        );
        let blocks: Vec<_> = replies(&out)
            .into_iter()
            .filter(|r| r.kind == REP_INFO && r.payload[..2] == INFO_BLOCK_SIZE.to_be_bytes())
            .map(|r| r.option)
            .collect();
        let e = &exports()[export];
        let asked: Vec<u32> = match (sized_go, export) {
            (true, _) => vec![OPT_GO],
            (false, 0) => vec![OPT_INFO],
            _ => vec![],
        };
        assert_eq!(blocks, asked, "{options:?}");
        if sized_go {
            let r = replies(&out);
            assert!(r.contains(&rep(
                OPT_GO,
                REP_INFO,
                &info_block(e.block.minimum, e.block.preferred, e.block.maximum)
            )));
        }
    }
    // NBD_OPT_EXPORT_NAME cannot ask: never bound.
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"scratch")]);
    let (_, step, _) = run(&input);
    assert_eq!(step, done(2, false, RW_FLAGS));
}

#[test]
fn go_ends_in_done_with_export_and_structured_flag() {
    // Each GO once without and once with NBD_INFO_BLOCK_SIZE asked for.
    for asked in [false, true] {
        let items: &[u16] = if asked { &[INFO_BLOCK_SIZE] } else { &[] };
        let go = |name: &[u8]| opt(OPT_GO, &info_data(name, items));
        let cases: Vec<(Vec<u8>, HandshakeStep)> = vec![
            (go(b"disk0"), done(0, false, RW_FLAGS)),
            (go(b"archive"), done(1, false, RO_FLAGS)),
            (go(b"scratch"), done(2, false, RW_FLAGS)),
            (go(b""), done(0, false, RW_FLAGS)),
            (
                cat(&[&opt(OPT_STRUCTURED_REPLY, b""), &go(b"archive")]),
                done(1, true, RO_FLAGS_STRUCTURED),
            ),
            (
                cat(&[&opt(OPT_STRUCTURED_REPLY, b""), &go(b"scratch")]),
                done(2, true, RW_FLAGS_STRUCTURED),
            ),
        ];
        for (options, expect) in cases {
            let expect = if asked { sized(expect) } else { expect };
            let input = cat(&[&modern(), &options]);
            // Bytes after GO belong to the transmission phase and are not consumed.
            let with_tail = cat(&[&input, &[0x25, 0x60, 0x95, 0x13]]);
            let (n, step, out) = run(&with_tail);
            assert_eq!((n, &step), (input.len(), &expect));
            let HandshakeStep::Done(neg) = step else {
                unreachable!()
            };
            let e = &exports()[neg.export];
            let r = replies(&out);
            let go: Vec<_> = r.iter().filter(|r| r.option == OPT_GO).cloned().collect();
            let mut want = vec![rep(
                OPT_GO,
                REP_INFO,
                &info_export(e.size, neg.transmission_flags),
            )];
            if asked {
                let block = info_block(e.block.minimum, e.block.preferred, e.block.maximum);
                want.push(rep(OPT_GO, REP_INFO, &block));
            }
            want.push(rep(OPT_GO, REP_ACK, b""));
            assert_eq!(go, want);
            assert_eq!(
                neg.transmission_flags,
                e.transmission_flags(neg.structured_replies)
            );
        }
    }
}

#[test]
fn info_then_go_on_another_export() {
    let input = cat(&[
        &modern(),
        &opt(OPT_INFO, &info_data(b"archive", &[])),
        &opt(OPT_GO, &info_data(b"scratch", &[INFO_NAME])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(2, false, RW_FLAGS)));
    assert_eq!(
        kinds(&out),
        vec![
            (OPT_INFO, REP_INFO),
            (OPT_INFO, REP_ACK),
            (OPT_GO, REP_INFO),
            (OPT_GO, REP_INFO),
            (OPT_GO, REP_ACK),
        ]
    );
}

#[test]
fn export_name_without_no_zeroes_pads_124_zeroes() {
    let input = cat(&[
        &flags(FLAG_C_FIXED_NEWSTYLE),
        &opt(OPT_EXPORT_NAME, b"archive"),
        b"tail",
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len() - 4, done(1, false, RO_FLAGS)));
    let mut expect = (3 * GIB + 4096).to_be_bytes().to_vec();
    expect.extend_from_slice(&RO_FLAGS.to_be_bytes());
    expect.extend_from_slice(&[0u8; 124]);
    assert_eq!(out.len(), 134);
    assert_eq!(out, expect);
}

#[test]
fn export_name_with_no_zeroes_sends_size_and_flags_only() {
    let input = cat(&[
        &modern(),
        &opt(OPT_STRUCTURED_REPLY, b""),
        &opt(OPT_EXPORT_NAME, b"disk0"),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, true, RW_FLAGS_STRUCTURED)));
    let ack_len = 20;
    assert_eq!(
        kinds(&out[..ack_len]),
        vec![(OPT_STRUCTURED_REPLY, REP_ACK)]
    );
    assert_eq!(&out[ack_len..], &[0, 0, 0, 0, 0x40, 0, 0, 0, 0x0d, 0xed]);
}

#[test]
fn export_name_empty_is_the_default_export() {
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"")]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, false, RW_FLAGS)));
    assert_eq!(out, cat(&[&GIB.to_be_bytes(), &RW_FLAGS.to_be_bytes()]));
}

#[test]
fn export_name_unknown_closes() {
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"nope")]);
    let (n, step, out) = run(&input);
    assert_eq!(
        (n, step),
        (
            input.len(),
            HandshakeStep::Close(CloseReason::UnknownExport("nope".into()))
        )
    );
    assert!(out.is_empty());

    // Empty name without any export.
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"")]);
    let (n, step, out) = run_with(&input, &[], false);
    assert_eq!(
        (n, step),
        (
            input.len(),
            HandshakeStep::Close(CloseReason::UnknownExport(String::new()))
        )
    );
    assert!(out.is_empty());

    // Not UTF-8.
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"\xc3\x28")]);
    let (n, step, out) = run(&input);
    assert_eq!(n, input.len());
    assert!(
        matches!(
            step,
            HandshakeStep::Close(CloseReason::ExportNameRefused(_))
        ),
        "{step:?}"
    );
    assert!(out.is_empty());
}

#[test]
fn abort_acks_then_closes() {
    for shutting_down in [false, true] {
        let input = cat(&[
            &modern(),
            &opt(OPT_ABORT, b""),
            &opt(OPT_GO, &info_data(b"", &[])),
        ]);
        let (n, step, out) = run_with(&input, &exports(), shutting_down);
        assert_eq!(
            (n, step),
            (4 + 16, HandshakeStep::Close(CloseReason::Aborted))
        );
        assert_eq!(
            out,
            cat(&[
                &OPTION_REPLY_MAGIC.to_be_bytes(),
                &[0, 0, 0, 2],
                &[0, 0, 0, 1],
                &[0, 0, 0, 0]
            ])
        );
    }
}

#[test]
fn shutting_down_refuses_every_option() {
    let options = [
        opt(OPT_LIST, b""),
        opt(OPT_STRUCTURED_REPLY, b""),
        opt(OPT_STARTTLS, b""),
        opt(OPT_INFO, &info_data(b"disk0", &[])),
        opt(OPT_GO, &info_data(b"disk0", &[])),
        opt(1234, b""),
    ];
    let input = cat(&[&modern(), &options.concat()]);
    let (n, step, out) = run_with(&input, &exports(), true);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(
        kinds(&out),
        vec![
            (OPT_LIST, REP_ERR_SHUTDOWN),
            (OPT_STRUCTURED_REPLY, REP_ERR_SHUTDOWN),
            (OPT_STARTTLS, REP_ERR_SHUTDOWN),
            (OPT_INFO, REP_ERR_SHUTDOWN),
            (OPT_GO, REP_ERR_SHUTDOWN),
            (1234, REP_ERR_SHUTDOWN),
        ]
    );

    // EXPORT_NAME cannot be answered with an error: the server hangs up.
    let input = cat(&[&modern(), &opt(OPT_EXPORT_NAME, b"disk0")]);
    let (n, step, out) = run_with(&input, &exports(), true);
    assert_eq!(n, input.len());
    assert!(
        matches!(
            step,
            HandshakeStep::Close(CloseReason::ExportNameRefused(_))
        ),
        "{step:?}"
    );
    assert!(out.is_empty());
}

#[test]
fn shutdown_that_starts_mid_handshake() {
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let first = cat(&[&modern(), &opt(OPT_STRUCTURED_REPLY, b"")]);
    assert_eq!(
        hs.feed(&first, &exports(), false, &mut out),
        (first.len(), HandshakeStep::NeedMore)
    );
    let go = opt(OPT_GO, &info_data(b"", &[]));
    assert_eq!(
        hs.feed(&go, &exports(), true, &mut out),
        (go.len(), HandshakeStep::NeedMore)
    );
    assert_eq!(
        hs.feed(&go, &exports(), false, &mut out),
        (go.len(), done(0, true, RW_FLAGS_STRUCTURED))
    );
    assert_eq!(
        kinds(&out)[..2],
        [(OPT_STRUCTURED_REPLY, REP_ACK), (OPT_GO, REP_ERR_SHUTDOWN)]
    );
}

// ---------------------------------------------------------------------------------------------
// Metadata contexts

/// Data of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
fn meta_data(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name);
    v.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q);
    }
    v
}

fn context(id: u32, name: &str) -> Vec<u8> {
    cat(&[&id.to_be_bytes(), name.as_bytes()])
}

fn structured() -> Vec<u8> {
    cat(&[&modern(), &opt(OPT_STRUCTURED_REPLY, b"")])
}

/// The replies to the options after `prefix` (structured replies negotiated), and the step.
fn after_structured(options: &[&[u8]]) -> (HandshakeStep, Vec<Reply>) {
    let input = cat(&[&structured(), &options.concat()]);
    let (n, step, out) = run(&input);
    assert_eq!(n, input.len());
    let r = replies(&out);
    assert_eq!(r[0], rep(OPT_STRUCTURED_REPLY, REP_ACK, b""));
    (step, r[1..].to_vec())
}

#[test]
fn list_meta_context_offers_base_allocation() {
    let listed = vec![
        rep(
            OPT_LIST_META_CONTEXT,
            REP_META_CONTEXT,
            &context(0, "base:allocation"),
        ),
        rep(OPT_LIST_META_CONTEXT, REP_ACK, b""),
    ];
    let nothing = vec![rep(OPT_LIST_META_CONTEXT, REP_ACK, b"")];
    let cases: Vec<(Vec<&[u8]>, &Vec<Reply>)> = vec![
        (vec![], &listed),
        (vec![b"base:"], &listed),
        (vec![b"base:allocation"], &listed),
        (
            vec![b"base:", b"base:allocation", b"qemu:dirty-bitmap:x"],
            &listed,
        ),
        (vec![b"base:nothing"], &nothing),
        (vec![b"qemu:dirty-bitmap:x", b"x-foo:"], &nothing),
    ];
    for (queries, expect) in cases {
        for name in [&b"disk0"[..], b"", b"archive"] {
            let list = opt(OPT_LIST_META_CONTEXT, &meta_data(name, &queries));
            let (step, r) = after_structured(&[&list]);
            assert_eq!(step, HandshakeStep::NeedMore);
            assert_eq!(&r, expect, "queries {queries:?} on {name:?}");
        }
    }
    // LIST selects nothing, so it needs no structured replies.
    let input = cat(&[&modern(), &opt(OPT_LIST_META_CONTEXT, &meta_data(b"", &[]))]);
    let (_, _, out) = run(&input);
    assert_eq!(replies(&out), listed);
}

#[test]
fn set_meta_context_selects_base_allocation_for_the_export_entered() {
    let set = |name: &[u8], queries: &[&[u8]]| opt(OPT_SET_META_CONTEXT, &meta_data(name, queries));
    let selected = [
        rep(
            OPT_SET_META_CONTEXT,
            REP_META_CONTEXT,
            &context(1, "base:allocation"),
        ),
        rep(OPT_SET_META_CONTEXT, REP_ACK, b""),
    ];
    let go = |name: &[u8]| opt(OPT_GO, &info_data(name, &[]));

    let (step, r) = after_structured(&[&set(b"scratch", &[b"base:allocation"]), &go(b"scratch")]);
    assert_eq!(step, done_meta(2, RW_FLAGS_STRUCTURED));
    assert_eq!(r[..2], selected[..]);
    // Repeated queries select it once; other namespaces are ignored.
    let (step, r) = after_structured(&[
        &set(
            b"archive",
            &[b"qemu:x", b"base:allocation", b"base:allocation"],
        ),
        &go(b"archive"),
    ]);
    assert_eq!(step, done_meta(1, RO_FLAGS_STRUCTURED));
    assert_eq!(r[..2], selected[..]);
    // The empty name is the default export, whichever way it is named.
    let (step, _) = after_structured(&[&set(b"", &[b"base:allocation"]), &go(b"disk0")]);
    assert_eq!(step, done_meta(0, RW_FLAGS_STRUCTURED));
    // NBD_OPT_EXPORT_NAME enters it too (its answer is no option reply).
    let input = cat(&[
        &structured(),
        &set(b"disk0", &[b"base:allocation"]),
        &opt(OPT_EXPORT_NAME, b"disk0"),
    ]);
    let (n, step, _) = run(&input);
    assert_eq!((n, step), (input.len(), done_meta(0, RW_FLAGS_STRUCTURED)));

    // Selected for another export than the one entered: none.
    let (step, _) = after_structured(&[&set(b"disk0", &[b"base:allocation"]), &go(b"scratch")]);
    assert_eq!(step, done(2, true, RW_FLAGS_STRUCTURED));
    // No query, or only the wildcard (which SET ignores): nothing selected, just an ACK.
    for queries in [&[][..], &[&b"base:"[..]], &[&b"base:other"[..]]] {
        let (step, r) = after_structured(&[&set(b"disk0", queries), &go(b"disk0")]);
        assert_eq!(step, done(0, true, RW_FLAGS_STRUCTURED), "{queries:?}");
        assert_eq!(r[0], rep(OPT_SET_META_CONTEXT, REP_ACK, b""), "{queries:?}");
    }
    // A later SET replaces the selection, even one that fails.
    for later in [
        set(b"disk0", &[]),
        set(b"nope", &[b"base:allocation"]),
        set(b"disk0", &[b"nocolon"]),
    ] {
        let (step, _) =
            after_structured(&[&set(b"disk0", &[b"base:allocation"]), &later, &go(b"disk0")]);
        assert_eq!(step, done(0, true, RW_FLAGS_STRUCTURED));
    }
    // LIST and INFO leave it be.
    let (step, _) = after_structured(&[
        &set(b"disk0", &[b"base:allocation"]),
        &opt(OPT_LIST_META_CONTEXT, &meta_data(b"scratch", &[])),
        &opt(OPT_INFO, &info_data(b"scratch", &[])),
        &go(b"disk0"),
    ]);
    assert_eq!(step, done_meta(0, RW_FLAGS_STRUCTURED));
}

#[test]
fn set_meta_context_needs_structured_replies() {
    let input = cat(&[
        &modern(),
        &opt(
            OPT_SET_META_CONTEXT,
            &meta_data(b"disk0", &[b"base:allocation"]),
        ),
        &opt(OPT_GO, &info_data(b"disk0", &[])),
    ]);
    let (n, step, out) = run(&input);
    assert_eq!((n, step), (input.len(), done(0, false, RW_FLAGS)));
    let r = replies(&out);
    assert_eq!(r[0].kind, REP_ERR_INVALID);
    assert!(String::from_utf8_lossy(&r[0].payload).contains("structured"));
}

#[test]
fn meta_context_for_an_unknown_export_is_unknown() {
    for option in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        let (step, r) =
            after_structured(&[&opt(option, &meta_data(b"nope", &[b"base:allocation"]))]);
        assert_eq!(step, HandshakeStep::NeedMore);
        assert_eq!(kinds_of(&r), vec![(option, REP_ERR_UNKNOWN)]);
    }
}

fn kinds_of(r: &[Reply]) -> Vec<(u32, u32)> {
    r.iter().map(|r| (r.option, r.kind)).collect()
}

#[test]
fn malformed_meta_context_data_is_invalid_and_haggling_continues() {
    let good = meta_data(b"disk0", &[b"base:allocation"]);
    let mut long_name = meta_data(&[b'a'; 4097], &[]);
    long_name.truncate(4 + 4097 + 4);
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short name length", vec![0, 0]),
        ("name past the end", cat(&[&100u32.to_be_bytes(), b"disk0"])),
        ("no query count", cat(&[&5u32.to_be_bytes(), b"disk0"])),
        ("name too long", long_name),
        (
            "count past the end",
            cat(&[&good[..9], &2u32.to_be_bytes(), &good[13..]]),
        ),
        ("huge count", cat(&[&good[..9], &u32::MAX.to_be_bytes()])),
        ("query length cut", good[..15].to_vec()),
        ("query past the end", good[..good.len() - 1].to_vec()),
        ("trailing bytes", cat(&[&good, b"x"])),
        (
            "query too long",
            cat(&[
                &good[..9],
                &1u32.to_be_bytes(),
                &4097u32.to_be_bytes(),
                &[b'b'; 4097],
            ]),
        ),
        ("query not UTF-8", meta_data(b"disk0", &[b"base:\xff"])),
        ("name not UTF-8", meta_data(b"disk\xff", &[])),
        ("name with NUL", meta_data(b"disk\0", &[])),
        (
            "query without namespace",
            meta_data(b"disk0", &[b"allocation"]),
        ),
        (
            "query with empty namespace",
            meta_data(b"disk0", &[b":allocation"]),
        ),
    ];
    for (what, data) in &bad {
        for option in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
            let (step, r) =
                after_structured(&[&opt(option, data), &opt(OPT_GO, &info_data(b"disk0", &[]))]);
            assert_eq!(step, done(0, true, RW_FLAGS_STRUCTURED), "{what}");
            assert_eq!(r[0].option, option, "{what}");
            assert_eq!(r[0].kind, REP_ERR_INVALID, "{what}");
            let msg = String::from_utf8(r[0].payload.clone()).expect("UTF-8 message");
            assert!(!msg.is_empty(), "{what}");
            assert_eq!(r[1].option, OPT_GO, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Split invariance

/// Feeds `input` in the given chunks the way a driver does (keeping unconsumed bytes), and
/// returns total consumed, the terminal step (or NeedMore) and everything sent.
fn feed_chunked(
    input: &[u8],
    cuts: &[usize],
    shutting_down: bool,
) -> (usize, HandshakeStep, Vec<u8>) {
    let table = exports();
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut consumed = 0;
    let mut last = 0;
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c <= input.len()).collect();
    bounds.sort_unstable();
    bounds.push(input.len());
    for end in bounds {
        if end < last {
            continue;
        }
        pending.extend_from_slice(&input[last..end]);
        last = end;
        let (n, step) = hs.feed(&pending, &table, shutting_down, &mut out);
        assert!(n <= pending.len());
        consumed += n;
        pending.drain(..n);
        if step != HandshakeStep::NeedMore {
            // The rest of the input is not the handshake's business.
            let (n2, step2) = hs.feed(&input[last..], &table, shutting_down, &mut out);
            assert_eq!((n2, step2), (0, HandshakeStep::NeedMore));
            return (consumed, step, out);
        }
    }
    (consumed, HandshakeStep::NeedMore, out)
}

fn option_strategy() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just(b"".to_vec()),
        Just(b"disk0".to_vec()),
        Just(b"archive".to_vec()),
        Just(b"scratch".to_vec()),
        Just(b"nope".to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    let items = prop::collection::vec(0u16..5, 0..4);
    prop_oneof![
        4 => (name.clone(), items.clone()).prop_map(|(n, i)| opt(OPT_INFO, &info_data(&n, &i))),
        1 => (name.clone(), items).prop_map(|(n, i)| opt(OPT_GO, &info_data(&n, &i))),
        1 => name.clone().prop_map(|n| opt(OPT_EXPORT_NAME, &n)),
        2 => Just(opt(OPT_LIST, b"")),
        2 => Just(opt(OPT_STRUCTURED_REPLY, b"")),
        2 => (name, prop::collection::vec(meta_query(), 0..3), any::<bool>()).prop_map(
            |(n, q, set)| {
                let q: Vec<&[u8]> = q.iter().map(Vec::as_slice).collect();
                let option = if set { OPT_SET_META_CONTEXT } else { OPT_LIST_META_CONTEXT };
                opt(option, &meta_data(&n, &q))
            }
        ),
        1 => Just(opt(OPT_STARTTLS, b"")),
        1 => Just(opt(OPT_ABORT, b"")),
        3 => (any::<u32>(), prop::collection::vec(any::<u8>(), 0..40)).prop_map(|(o, d)| opt(o, &d)),
        1 => prop::collection::vec(any::<u8>(), 16..40),
        1 => (any::<u32>(), (MAX_OPTION_LEN + 1)..=u32::MAX).prop_map(|(o, len)| {
            cat(&[&IHAVEOPT.to_be_bytes(), &o.to_be_bytes(), &len.to_be_bytes()])
        }),
    ]
}

fn meta_query() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"base:allocation".to_vec()),
        Just(b"base:".to_vec()),
        Just(b"qemu:dirty-bitmap:a".to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ]
}

fn stream_strategy() -> impl Strategy<Value = Vec<u8>> {
    let client_flags = prop_oneof![
        8 => Just(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES),
        4 => Just(FLAG_C_FIXED_NEWSTYLE),
        1 => Just(0u32),
        1 => any::<u32>(),
    ];
    (
        client_flags,
        prop::collection::vec(option_strategy(), 0..12),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(f, opts, tail)| cat(&[&f.to_be_bytes(), &opts.concat(), &tail]))
}

#[test]
fn byte_by_byte_equals_all_at_once_for_a_full_session() {
    let input = cat(&[
        &modern(),
        &opt(OPT_LIST, b""),
        &opt(77, b"abc"),
        &opt(OPT_STRUCTURED_REPLY, b""),
        &opt(
            OPT_INFO,
            &info_data(b"archive", &[INFO_NAME, INFO_DESCRIPTION]),
        ),
        &opt(OPT_GO, &info_data(b"scratch", &[INFO_DESCRIPTION])),
        b"transmission bytes",
    ]);
    let once = run(&input);
    let cuts: Vec<usize> = (0..input.len()).collect();
    let chunked = feed_chunked(&input, &cuts, false);
    assert_eq!(once, chunked);
    assert_eq!(once.1, done(2, true, RW_FLAGS_STRUCTURED));
    assert_eq!(once.0, input.len() - b"transmission bytes".len());
}

#[test]
fn option_limit_counts_options_not_feeds() {
    // 1023 options and a GO, byte by byte: exactly MAX_OPTIONS options however they arrive.
    let mut input = modern();
    for i in 0..MAX_OPTIONS - 1 {
        input.extend_from_slice(&opt(1000 + i, &[i as u8; 3]));
    }
    input.extend_from_slice(&opt(OPT_GO, &info_data(b"archive", &[])));
    let cuts: Vec<usize> = (0..input.len()).collect();
    let (n, step, out) = feed_chunked(&input, &cuts, false);
    assert_eq!((n, step), (input.len(), done(1, false, RO_FLAGS)));
    assert_eq!(replies(&out).len(), MAX_OPTIONS as usize - 1 + 2);
    // One more option before the GO is one too many, also byte by byte.
    let mut more = modern();
    more.extend_from_slice(&opt(5000, b""));
    more.extend_from_slice(&input[4..]);
    let cuts: Vec<usize> = (0..more.len()).collect();
    let (n, step, out) = feed_chunked(&more, &cuts, false);
    assert_eq!(
        (n, step),
        (
            more.len(),
            HandshakeStep::Close(CloseReason::TooManyOptions)
        )
    );
    assert_eq!(replies(&out).len(), MAX_OPTIONS as usize);
}

proptest! {
    #[test]
    fn split_points_do_not_matter(
        input in stream_strategy(),
        cuts in prop::collection::vec(0usize..600, 0..40),
        shutting_down in prop::bool::weighted(0.1),
    ) {
        let mut hs = Handshake::new();
        let mut out = Vec::new();
        let (n, step) = hs.feed(&input, &exports(), shutting_down, &mut out);
        prop_assert!(n <= input.len());
        let chunked = feed_chunked(&input, &cuts, shutting_down);
        prop_assert_eq!(&(n, step.clone(), out.clone()), &chunked);
        let every: Vec<usize> = (0..input.len()).collect();
        prop_assert_eq!(&(n, step.clone(), out.clone()), &feed_chunked(&input, &every, shutting_down));
        // Everything before an EXPORT_NAME answer is well-formed option replies.
        let is_export_name_done = matches!(step, HandshakeStep::Done(_))
            && !out.is_empty()
            && replies_prefix_len(&out) != out.len();
        if !is_export_name_done {
            let r = replies(&out);
            for reply in &r {
                prop_assert!(
                    [REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT, REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID, REP_ERR_UNKNOWN, REP_ERR_SHUTDOWN]
                        .contains(&reply.kind)
                );
                if shutting_down {
                    prop_assert!(reply.kind == REP_ERR_SHUTDOWN || (reply.option == OPT_ABORT && reply.kind == REP_ACK));
                }
            }
        }
    }
}

/// How many leading bytes of `out` parse as whole option replies.
fn replies_prefix_len(mut out: &[u8]) -> usize {
    let mut total = 0;
    while out.len() >= 20 && u64::from_be_bytes(out[0..8].try_into().unwrap()) == OPTION_REPLY_MAGIC
    {
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        if out.len() < 20 + len {
            break;
        }
        total += 20 + len;
        out = &out[20 + len..];
    }
    total
}
