//! The handshake's STARTTLS rules (`doc/proto.md`, "TLS support"), one test per rule: what
//! a server without TLS, with TLS at the client's choice, and requiring TLS answers to each
//! option before and after `NBD_OPT_STARTTLS`.

use tandem_frontend::nbd::wire::*;
use tandem_frontend::nbd::{
    BlockSizes, CloseReason, ExportInfo, Handshake, HandshakeStep, Negotiated, TlsMode,
};

fn exports() -> Vec<ExportInfo> {
    vec![ExportInfo {
        name: "disk0".into(),
        description: String::new(),
        size: 1 << 30,
        read_only: false,
        block: BlockSizes::new(512),
    }]
}

fn modern() -> Vec<u8> {
    (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec()
}

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn go(name: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name);
    v.extend_from_slice(&0u16.to_be_bytes());
    opt(OPT_GO, &v)
}

/// (option, reply type) of each option reply in `out`.
fn kinds(mut out: &[u8]) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    while !out.is_empty() {
        assert_eq!(
            u64::from_be_bytes(out[0..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let option = u32::from_be_bytes(out[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        v.push((option, kind));
        out = &out[20 + len..];
    }
    v
}

/// Feeds `input` in one piece to a handshake in `mode`: (consumed, step, output).
fn feed(hs: &mut Handshake, input: &[u8]) -> (usize, HandshakeStep, Vec<u8>) {
    let mut out = Vec::new();
    let (n, step) = hs.feed(input, &exports(), false, &mut out);
    (n, step, out)
}

fn done(structured_replies: bool) -> HandshakeStep {
    HandshakeStep::Done(Negotiated {
        export: 0,
        structured_replies,
        transmission_flags: exports()[0].transmission_flags(structured_replies),
        meta_context: None,
        block_sizes: false,
    })
}

#[test]
fn starttls_when_off_is_refused_by_policy_and_the_client_goes_on_in_the_clear() {
    let mut hs = Handshake::with_tls(TlsMode::Off);
    let input = [modern(), opt(OPT_STARTTLS, b""), go(b"")].concat();
    let (n, step, out) = feed(&mut hs, &input);
    assert_eq!((n, step), (input.len(), done(false)));
    assert_eq!(kinds(&out)[0], (OPT_STARTTLS, REP_ERR_POLICY));
    assert!(!hs.tls_started());
}

#[test]
fn starttls_is_acknowledged_and_the_driver_told_to_start_tls() {
    for mode in [TlsMode::On, TlsMode::Require] {
        let mut hs = Handshake::with_tls(mode);
        // Bytes after STARTTLS are TLS (a ClientHello): not the handshake's to take.
        let input = [modern(), opt(OPT_STARTTLS, b""), vec![0x16, 3, 1, 0, 5]].concat();
        let (n, step, out) = feed(&mut hs, &input);
        assert_eq!((n, step), (4 + 16, HandshakeStep::StartTls), "{mode:?}");
        assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ACK)]);
        assert!(hs.tls_started());
        // The options continue over TLS (the driver feeds the decrypted bytes).
        let (n, step, out) = feed(&mut hs, &go(b"disk0"));
        assert_eq!((n, step), (go(b"disk0").len(), done(false)), "{mode:?}");
        assert_eq!(kinds(&out).last(), Some(&(OPT_GO, REP_ACK)));
    }
}

#[test]
fn require_refuses_every_option_before_starttls_but_abort() {
    let mut hs = Handshake::with_tls(TlsMode::Require);
    let options = [
        opt(OPT_LIST, b""),
        opt(OPT_STRUCTURED_REPLY, b""),
        opt(OPT_INFO, &go(b"disk0")[16..]),
        go(b"disk0"),
        opt(OPT_LIST_META_CONTEXT, b""),
        opt(42, b"unknown"),
    ];
    let input = [vec![modern()], options.to_vec()].concat().concat();
    let (n, step, out) = feed(&mut hs, &input);
    assert_eq!((n, step), (input.len(), HandshakeStep::NeedMore));
    assert_eq!(
        kinds(&out),
        vec![
            (OPT_LIST, REP_ERR_TLS_REQD),
            (OPT_STRUCTURED_REPLY, REP_ERR_TLS_REQD),
            (OPT_INFO, REP_ERR_TLS_REQD),
            (OPT_GO, REP_ERR_TLS_REQD),
            (OPT_LIST_META_CONTEXT, REP_ERR_TLS_REQD),
            (42, REP_ERR_TLS_REQD),
        ]
    );
    // Logged once, not per option.
    let refusals = hs.take_refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("ERR_TLS_REQD"), "{refusals:?}");
    // ABORT is still answered.
    let (_, step, out) = feed(&mut hs, &opt(OPT_ABORT, b""));
    assert_eq!(step, HandshakeStep::Close(CloseReason::Aborted));
    assert_eq!(kinds(&out), vec![(OPT_ABORT, REP_ACK)]);
}

#[test]
fn require_hangs_up_on_export_name_before_starttls() {
    let mut hs = Handshake::with_tls(TlsMode::Require);
    let input = [modern(), opt(OPT_EXPORT_NAME, b"disk0")].concat();
    let (n, step, out) = feed(&mut hs, &input);
    assert_eq!(
        (n, step),
        (input.len(), HandshakeStep::Close(CloseReason::TlsRequired))
    );
    assert!(out.is_empty(), "EXPORT_NAME has no error reply: {out:?}");
}

#[test]
fn require_accepts_everything_after_starttls_and_never_sends_tls_reqd() {
    let mut hs = Handshake::with_tls(TlsMode::Require);
    let (_, step, _) = feed(&mut hs, &[modern(), opt(OPT_STARTTLS, b"")].concat());
    assert_eq!(step, HandshakeStep::StartTls);
    let input = [
        opt(OPT_LIST, b""),
        opt(OPT_STRUCTURED_REPLY, b""),
        opt(42, b""),
        go(b"disk0"),
    ]
    .concat();
    let (n, step, out) = feed(&mut hs, &input);
    assert_eq!((n, step), (input.len(), done(true)));
    assert!(
        kinds(&out).iter().all(|&(_, k)| k != REP_ERR_TLS_REQD),
        "{:?}",
        kinds(&out)
    );
    // EXPORT_NAME after TLS enters transmission as usual.
    let mut hs = Handshake::with_tls(TlsMode::Require);
    feed(&mut hs, &[modern(), opt(OPT_STARTTLS, b"")].concat());
    let (_, step, _) = feed(&mut hs, &opt(OPT_EXPORT_NAME, b"disk0"));
    assert!(matches!(step, HandshakeStep::Done(_)), "{step:?}");
}

#[test]
fn on_serves_a_client_that_never_starts_tls() {
    let mut hs = Handshake::with_tls(TlsMode::On);
    let input = [modern(), opt(OPT_STRUCTURED_REPLY, b""), go(b"disk0")].concat();
    let (n, step, out) = feed(&mut hs, &input);
    assert_eq!((n, step), (input.len(), done(true)));
    assert!(kinds(&out).iter().all(|&(_, k)| k != REP_ERR_TLS_REQD));
    let mut hs = Handshake::with_tls(TlsMode::On);
    let (_, step, _) = feed(
        &mut hs,
        &[modern(), opt(OPT_EXPORT_NAME, b"disk0")].concat(),
    );
    assert!(matches!(step, HandshakeStep::Done(_)), "{step:?}");
}

#[test]
fn starttls_twice_is_invalid() {
    for mode in [TlsMode::On, TlsMode::Require] {
        let mut hs = Handshake::with_tls(mode);
        feed(&mut hs, &[modern(), opt(OPT_STARTTLS, b"")].concat());
        let (n, step, out) = feed(&mut hs, &opt(OPT_STARTTLS, b""));
        assert_eq!((n, step), (16, HandshakeStep::NeedMore), "{mode:?}");
        assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ERR_INVALID)]);
    }
}

#[test]
fn starttls_with_data_is_invalid_and_tls_not_started() {
    for mode in [TlsMode::On, TlsMode::Require] {
        let mut hs = Handshake::with_tls(mode);
        let input = [modern(), opt(OPT_STARTTLS, b"x")].concat();
        let (n, step, out) = feed(&mut hs, &input);
        assert_eq!(
            (n, step),
            (input.len(), HandshakeStep::NeedMore),
            "{mode:?}"
        );
        assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ERR_INVALID)]);
        assert!(!hs.tls_started());
        // Still in the clear: a proper STARTTLS then works.
        let (_, step, _) = feed(&mut hs, &opt(OPT_STARTTLS, b""));
        assert_eq!(step, HandshakeStep::StartTls);
    }
}

#[test]
fn nothing_negotiated_before_starttls_survives_it() {
    let mut hs = Handshake::with_tls(TlsMode::On);
    let before = [
        modern(),
        opt(OPT_STRUCTURED_REPLY, b""),
        opt(OPT_STARTTLS, b""),
    ]
    .concat();
    let (_, step, _) = feed(&mut hs, &before);
    assert_eq!(step, HandshakeStep::StartTls);
    // Structured replies negotiated in the clear are forgotten: GO gets simple replies, and
    // SET_META_CONTEXT (which needs them) is refused.
    let mut meta = Vec::new();
    meta.extend_from_slice(&5u32.to_be_bytes());
    meta.extend_from_slice(b"disk0");
    meta.extend_from_slice(&0u32.to_be_bytes());
    let input = [opt(OPT_SET_META_CONTEXT, &meta), go(b"disk0")].concat();
    let (_, step, out) = feed(&mut hs, &input);
    assert_eq!(step, done(false));
    assert_eq!(kinds(&out)[0], (OPT_SET_META_CONTEXT, REP_ERR_INVALID));
}

#[test]
fn shutting_down_refuses_starttls_too() {
    let mut hs = Handshake::with_tls(TlsMode::Require);
    let mut out = Vec::new();
    let input = [modern(), opt(OPT_STARTTLS, b"")].concat();
    let (_, step) = hs.feed(&input, &exports(), true, &mut out);
    assert_eq!(step, HandshakeStep::NeedMore);
    assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ERR_SHUTDOWN)]);
}
