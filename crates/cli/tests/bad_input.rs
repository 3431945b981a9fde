//! Hostile and broken clients over raw sockets: every refusal must carry the right error,
//! leave the data alone, and leave the connection (or at least the server) usable.

mod common;

use std::fs;
use std::thread;
use std::time::Duration;

use common::*;
use tandem_frontend::nbd::wire::*;

/// Larger than the 33 MiB of the oversized write, so that request has exactly one fault.
const SIZE: u64 = 40 * MIB;

struct Fixture {
    // Field order is drop order: the server goes before its directory.
    server: Server,
    model: Vec<u8>,
    path: std::path::PathBuf,
    min_block: u32,
    _dir: TestDir,
}

/// A 40 MiB export `disk` (also the default export) with random data at both ends.
fn fixture(test: &str, extra: &[&str]) -> Fixture {
    fixture_env(test, extra, &[])
}

fn fixture_env(test: &str, extra: &[&str], env: &[(&str, &str)]) -> Fixture {
    let dir = TestDir::new(test);
    let path = dir.join("disk.img");
    sparse_file(&path, SIZE);
    let mut model = vec![0u8; SIZE as usize];
    let head = random_bytes(1, MIB as usize);
    let tail = random_bytes(2, MIB as usize);
    write_at(&path, 0, &head);
    write_at(&path, SIZE - MIB, &tail);
    model[..MIB as usize].copy_from_slice(&head);
    model[(SIZE - MIB) as usize..].copy_from_slice(&tail);
    let mut b = Server::builder(&dir).export("disk", &path);
    for a in extra {
        b = b.arg(a);
    }
    for (k, v) in env {
        b = b.env(k, v);
    }
    let server = b.start();
    let min_block = extra
        .iter()
        .position(|a| *a == "--block-size")
        .map_or(512, |i| extra[i + 1].parse().unwrap());
    Fixture {
        server,
        model,
        path,
        min_block,
        _dir: dir,
    }
}

impl Fixture {
    fn connect(&self, structured: bool) -> Nbd {
        Nbd::go(Conn::unix(self.server.socket()), "disk", structured)
    }

    /// Valid reads at both ends and in the middle return what the model says.
    #[track_caller]
    fn assert_usable(&self, nbd: &mut Nbd, after: &str) {
        // The smallest valid read, too.
        for (offset, len) in [
            (0, 4096),
            (SIZE - 8192, 8192),
            (MIB / 2, self.min_block),
            (SIZE / 2, 4096),
        ] {
            let data = nbd.read(offset, len);
            let want = &self.model[offset as usize..offset as usize + len as usize];
            assert_same_data(&format!("READ {offset}+{len} after {after}"), want, &data);
        }
    }

    /// The backing file still holds the model (nothing was written by a refused request).
    #[track_caller]
    fn assert_file_unchanged(&self) {
        let data = fs::read(&self.path).unwrap();
        assert_same_data("backing file", &self.model, &data);
    }
}

/// Checks a refusal: the errno, and with structured replies an error chunk with a message.
#[track_caller]
fn expect_error(nbd: &Nbd, reply: &Reply, errno: u32, what: &str) {
    assert_eq!(
        reply.error,
        errno,
        "{what} (structured replies: {}): expected {errno} ({}), got {}",
        nbd.structured,
        errno_name(errno),
        reply.describe()
    );
    if nbd.structured {
        assert!(
            reply.chunks.contains(&REPLY_TYPE_ERROR),
            "{what}: with structured replies the error should be an NBD_REPLY_TYPE_ERROR chunk, got chunks {:x?}",
            reply.chunks
        );
        assert!(
            !reply.message.is_empty(),
            "{what}: structured error chunk without a message"
        );
    }
}

#[test]
fn read_beyond_end_is_einval() {
    let f = fixture("read_beyond_end_is_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        for (offset, len) in [
            (SIZE - 512, 1024),
            (SIZE, 512),
            (SIZE + MIB, 4096),
            (u64::MAX - 511, 512),
        ] {
            let what = format!("READ {offset}+{len} on a {SIZE}-byte export");
            let r = nbd.request(0, CMD_READ, offset, len, &[]);
            expect_error(&nbd, &r, EINVAL, &what);
            f.assert_usable(&mut nbd, &what);
        }
    }
    f.server.expect_log(
        &["beyond", "past the end", "out of range"],
        "the refused out-of-range reads",
    );
}

#[test]
fn writes_beyond_end_are_enospc_and_trims_einval() {
    let f = fixture("writes_beyond_end_are_enospc_and_trims_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        // Straddles the end: must not be half-applied.
        let payload = random_bytes(3, 1024);
        let what = format!("WRITE {}+1024 (straddling the end)", SIZE - 512);
        let r = nbd.request(0, CMD_WRITE, SIZE - 512, 1024, &payload);
        expect_error(&nbd, &r, ENOSPC, &what);
        f.assert_usable(&mut nbd, &what);

        let what = format!("WRITE {}+4096 (past the end)", SIZE);
        let r = nbd.request(0, CMD_WRITE, SIZE, 4096, &random_bytes(4, 4096));
        expect_error(&nbd, &r, ENOSPC, &what);
        f.assert_usable(&mut nbd, &what);

        // proto.md: ENOSPC for writes past the end, but EINVAL for "a read or trim request".
        let what = format!("TRIM {}+1024", SIZE - 512);
        let r = nbd.request(0, CMD_TRIM, SIZE - 512, 1024, &[]);
        expect_error(&nbd, &r, EINVAL, &what);
        f.assert_usable(&mut nbd, &what);

        let what = format!("WRITE_ZEROES {}+1024", SIZE - 512);
        let r = nbd.request(0, CMD_WRITE_ZEROES, SIZE - 512, 1024, &[]);
        expect_error(&nbd, &r, ENOSPC, &what);
        f.assert_usable(&mut nbd, &what);
    }
    f.assert_file_unchanged();
    f.server.expect_log(
        &["beyond", "past the end", "out of range"],
        "the refused out-of-range writes",
    );
}

#[test]
fn misaligned_requests_are_einval() {
    let f = fixture("misaligned_requests_are_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        for (command, offset, len) in [
            (CMD_READ, 100, 512),
            (CMD_READ, 0, 100),
            (CMD_WRITE, 256, 512),
            (CMD_WRITE, 0, 1000),
            (CMD_TRIM, 512, 100),
            (CMD_WRITE_ZEROES, 1, 4096),
        ] {
            let payload = if command == CMD_WRITE {
                random_bytes(5, len as usize)
            } else {
                Vec::new()
            };
            let what = format!("command {command} at {offset}+{len} (block size 512)");
            let r = nbd.request(0, command, offset, len, &payload);
            expect_error(&nbd, &r, EINVAL, &what);
            f.assert_usable(&mut nbd, &what);
        }
    }
    f.assert_file_unchanged();
    f.server
        .expect_log(&["align"], "the refused misaligned requests");
}

#[test]
fn oversized_requests_are_einval_and_the_payload_is_skipped() {
    let f = fixture(
        "oversized_requests_are_einval_and_the_payload_is_skipped",
        &[],
    );
    let len = 33 * MIB as u32;
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        // The payload really goes on the wire: the server must read past it to find the next
        // request header.
        let what = "WRITE 0+33MiB (over the 32 MiB maximum)";
        let r = nbd.request(0, CMD_WRITE, 0, len, &vec![0x5au8; len as usize]);
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);

        let what = "READ 0+33MiB";
        let r = nbd.request(0, CMD_READ, 0, len, &[]);
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);
    }
    f.assert_file_unchanged();
    f.server.expect_log(
        &["maximum", "too large", "too long", "exceeds"],
        "the refused oversized requests",
    );
}

#[test]
fn unknown_command_is_einval() {
    let f = fixture("unknown_command_is_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        for command in [99u16, 7, 0xffff] {
            let what = format!("command type {command}");
            let r = nbd.request(0, command, 0, 512, &[]);
            expect_error(&nbd, &r, EINVAL, &what);
            f.assert_usable(&mut nbd, &what);
        }
    }
    f.server.expect_log(
        &["unknown command", "unsupported command", "invalid command"],
        "the refused unknown commands",
    );
}

#[test]
fn unknown_command_flag_is_einval() {
    let f = fixture("unknown_command_flag_is_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        let what = "READ with flag bit 9";
        let r = nbd.request(1 << 9, CMD_READ, 0, 4096, &[]);
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);

        // A refused write's payload must still be consumed, and nothing written.
        let what = "WRITE with flag bit 9";
        let r = nbd.request(1 << 9, CMD_WRITE, 0, 4096, &random_bytes(6, 4096));
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);

        let what = "FLUSH with flag bit 9";
        let r = nbd.request(1 << 9, CMD_FLUSH, 0, 0, &[]);
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);
    }
    f.assert_file_unchanged();
    f.server
        .expect_log(&["flag"], "the refused unknown command flags");
}

#[test]
fn zero_length_is_einval() {
    let f = fixture("zero_length_is_einval", &[]);
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        for command in [CMD_READ, CMD_WRITE] {
            let what = format!("command {command} with length 0");
            let r = nbd.request(0, command, 4096, 0, &[]);
            expect_error(&nbd, &r, EINVAL, &what);
            f.assert_usable(&mut nbd, &what);
        }
    }
    f.assert_file_unchanged();
    f.server.expect_log(
        &["zero-length", "zero length", "length 0"],
        "the refused zero-length requests",
    );
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let f = fixture(
        "read_only_export_refuses_writes_with_eperm",
        &["--read-only"],
    );
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        assert!(
            nbd.flags() & FLAG_READ_ONLY != 0,
            "read-only export without NBD_FLAG_READ_ONLY (flags {:#x})",
            nbd.flags()
        );
        let what = "WRITE 0+4096 to a read-only export";
        let r = nbd.request(0, CMD_WRITE, 0, 4096, &random_bytes(7, 4096));
        expect_error(&nbd, &r, EPERM, what);
        f.assert_usable(&mut nbd, what);
        for (command, name) in [(CMD_TRIM, "TRIM"), (CMD_WRITE_ZEROES, "WRITE_ZEROES")] {
            let what = format!("{name} 0+4096 to a read-only export");
            let r = nbd.request(0, command, 0, 4096, &[]);
            expect_error(&nbd, &r, EPERM, &what);
            f.assert_usable(&mut nbd, &what);
        }
        // Flushing a read-only export is harmless and allowed.
        nbd.flush();
    }
    f.assert_file_unchanged();
    f.server.expect_log(
        &["read-only", "read only"],
        "the refused writes to a read-only export",
    );
}

#[test]
fn block_size_option_is_advertised_and_enforced() {
    let f = fixture(
        "block_size_option_is_advertised_and_enforced",
        &["--block-size", "4096"],
    );
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        assert_eq!(
            nbd.details.block,
            Some([4096, 4096, 32 * MIB as u32]),
            "advertised block sizes"
        );
        for (offset, len) in [(512, 4096), (0, 512), (4096, 6144)] {
            let what = format!("READ {offset}+{len} with --block-size 4096");
            let r = nbd.request(0, CMD_READ, offset, len, &[]);
            expect_error(&nbd, &r, EINVAL, &what);
            f.assert_usable(&mut nbd, &what);
        }
        let what = "WRITE 512+512 with --block-size 4096";
        let r = nbd.request(0, CMD_WRITE, 512, 512, &random_bytes(8, 512));
        expect_error(&nbd, &r, EINVAL, what);
        f.assert_usable(&mut nbd, what);
    }
    f.assert_file_unchanged();
}

#[test]
fn default_negotiation_advertises_contract_flags_and_block_sizes() {
    let f = fixture(
        "default_negotiation_advertises_contract_flags_and_block_sizes",
        &[],
    );
    for structured in [false, true] {
        let nbd = f.connect(structured);
        assert_eq!(nbd.size(), SIZE);
        assert_eq!(
            nbd.details.block,
            Some([512, 4096, 32 * MIB as u32]),
            "advertised block sizes"
        );
        let mut want = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_SEND_FAST_ZERO
            | FLAG_SEND_CACHE
            | FLAG_CAN_MULTI_CONN;
        if structured {
            want |= FLAG_SEND_DF;
        }
        assert_eq!(
            nbd.flags(),
            want,
            "transmission flags (structured replies: {structured})"
        );
    }
}

#[test]
fn wrong_request_magic_closes_only_that_connection() {
    let f = fixture("wrong_request_magic_closes_only_that_connection", &[]);
    for structured in [false, true] {
        let mut bystander = f.connect(structured);
        let mut victim = f.connect(structured);
        f.assert_usable(&mut victim, "the handshake");
        let mut header = Vec::new();
        tandem_frontend::nbd::request::encode_request(&mut header, 0, CMD_READ, 1, 0, 512);
        header[..4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        victim.conn.send(&header);
        if let Err(e) = victim.conn.wait_closed(Duration::from_secs(5)) {
            panic!("request with magic 0xdeadbeef: {e}");
        }
        f.assert_usable(&mut bystander, "another client's bad magic");
        let mut fresh = f.connect(structured);
        f.assert_usable(&mut fresh, "another client's bad magic");
    }
    f.server.expect_log(&["magic"], "the bad request magic");
}

#[test]
fn truncated_request_stream_does_not_hurt_others() {
    let mut f = fixture("truncated_request_stream_does_not_hurt_others", &[]);
    let mut bystander = f.connect(true);
    for structured in [false, true] {
        let mut victim = f.connect(structured);
        let mut header = Vec::new();
        victim.encode(0, CMD_WRITE, 0, 4096, &[], &mut header);
        // Half a header, then hang up.
        victim.conn.send(&header[..14]);
        drop(victim);

        // A write whose payload is cut short.
        let mut victim = f.connect(structured);
        let mut req = Vec::new();
        victim.encode(
            0,
            CMD_WRITE,
            0,
            4096,
            &random_bytes(9, 4096)[..1000],
            &mut req,
        );
        victim.conn.send(&req);
        drop(victim);

        // Hang up in the middle of the handshake, too.
        let mut conn = Conn::unix(f.server.socket());
        conn.greeting();
        conn.send(&[0, 0]);
        drop(conn);

        thread::sleep(Duration::from_millis(100));
        f.server.assert_running();
        f.assert_usable(&mut bystander, "a client hung up mid-request");
        let mut fresh = f.connect(structured);
        f.assert_usable(&mut fresh, "a client hung up mid-request");
    }
    f.assert_file_unchanged();
}

/// Sends `garbage` after the greeting and expects the server to hang up on that client only.
fn expect_handshake_refused(f: &mut Fixture, garbage: &[u8], what: &str, log_needles: &[&str]) {
    let mut conn = Conn::unix(f.server.socket());
    conn.greeting();
    conn.send(garbage);
    if let Err(e) = conn.wait_closed(Duration::from_secs(5)) {
        panic!("{what}: {e}");
    }
    f.server.assert_running();
    let mut fresh = f.connect(true);
    f.assert_usable(&mut fresh, what);
    f.server.expect_log(log_needles, what);
}

fn option_header(magic: u64, option: u32, len: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

#[test]
fn handshake_garbage_closes_the_connection() {
    let mut f = fixture("handshake_garbage_closes_the_connection", &[]);
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();

    let mut bad_magic = flags.to_vec();
    bad_magic.extend(option_header(0x1122_3344_5566_7788, OPT_GO, 0));
    expect_handshake_refused(&mut f, &bad_magic, "bad option magic", &["option magic"]);

    let unknown_flags = (FLAG_C_FIXED_NEWSTYLE | 1 << 5).to_be_bytes();
    expect_handshake_refused(
        &mut f,
        &unknown_flags,
        "unknown client flags",
        &["client flags"],
    );

    // Only the header: the server must not wait for (or buffer) 100 MiB.
    let mut huge = flags.to_vec();
    huge.extend(option_header(IHAVEOPT, OPT_GO, 100 << 20));
    expect_handshake_refused(
        &mut f,
        &huge,
        "a 100 MiB option",
        &["exceeds", "too long", "too large", "limit"],
    );
}

#[test]
fn unknown_option_is_unsupported_and_the_handshake_continues() {
    // Refusals with ERR_UNSUP are logged at debug level only: libnbd probes optional
    // options on every connection, and those would flood an info-level log.
    let f = fixture_env(
        "unknown_option_is_unsupported_and_the_handshake_continues",
        &[],
        &[("RUST_LOG", "debug")],
    );
    for structured in [false, true] {
        let mut conn = Conn::unix(f.server.socket());
        conn.greeting();
        conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        conn.option(42, b"whatever");
        let r = conn.option_reply();
        assert_eq!(r.option, 42, "reply to option 42 names option {}", r.option);
        assert_eq!(
            r.kind,
            REP_ERR_UNSUP,
            "option 42: expected NBD_REP_ERR_UNSUP, got {:#x} {:?}",
            r.kind,
            r.message()
        );
        // STARTTLS on a server without TLS is refused, not a hang-up.
        conn.option(OPT_STARTTLS, &[]);
        let r = conn.option_reply();
        assert!(
            r.kind & 0x8000_0000 != 0,
            "STARTTLS without TLS configured: got {:#x}",
            r.kind
        );
        let mut nbd = Nbd::go_after_flags(conn, "disk", structured);
        f.assert_usable(&mut nbd, "an unknown option");
    }
    f.server.expect_log(
        &["#42", "option 42", "not supported", "unsupported"],
        "the refused option 42",
    );
}

#[test]
fn opt_list_and_opt_info() {
    let dir = TestDir::new("opt_list_and_opt_info");
    let a = dir.join("a.img");
    let b = dir.join("b.img");
    sparse_file(&a, MIB);
    sparse_file(&b, 2 * MIB);
    let data = random_bytes(10, 4096);
    write_at(&b, 4096, &data);
    let server = Server::builder(&dir)
        .export("alpha", &a)
        .export("beta", &b)
        .arg("--description")
        .arg("test disk")
        .start();

    let mut conn = Conn::unix(server.socket());
    conn.greeting();
    conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);

    conn.option(OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let r = conn.option_reply();
        assert_eq!(r.option, OPT_LIST);
        match r.kind {
            REP_ACK => break,
            REP_SERVER => {
                let len = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
                names.push(String::from_utf8_lossy(&r.data[4..4 + len]).into_owned());
            }
            kind => panic!("NBD_OPT_LIST: unexpected reply {kind:#x} {:?}", r.message()),
        }
    }
    names.sort();
    assert_eq!(names, ["alpha", "beta"], "NBD_OPT_LIST");

    conn.option(OPT_INFO, &info_request("nope", &[]));
    let err = conn
        .info_replies(OPT_INFO)
        .expect_err("NBD_OPT_INFO for a missing export succeeded");
    assert_eq!(
        err.kind,
        REP_ERR_UNKNOWN,
        "NBD_OPT_INFO \"nope\": {:#x} {:?}",
        err.kind,
        err.message()
    );

    conn.option(
        OPT_INFO,
        &info_request("beta", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    let d = conn
        .info_replies(OPT_INFO)
        .unwrap_or_else(|r| panic!("NBD_OPT_INFO beta: {:#x} {:?}", r.kind, r.message()));
    assert_eq!(d.size, Some(2 * MIB));
    assert_eq!(d.block, Some([512, 4096, 32 * MIB as u32]));
    assert_eq!(
        d.description.as_deref(),
        Some("test disk"),
        "NBD_INFO_DESCRIPTION"
    );
    if let Some(name) = &d.name {
        assert_eq!(name, "beta", "NBD_INFO_NAME");
    }

    // INFO does not end the handshake; GO on the same connection does.
    let mut nbd = Nbd::go_after_flags(conn, "beta", true);
    assert_eq!(nbd.size(), 2 * MIB);
    assert_same_data("READ 4096+4096 of beta", &data, &nbd.read(4096, 4096));
}

#[test]
fn export_name_legacy_path() {
    let f = fixture("export_name_legacy_path", &[]);
    for (no_zeroes, structured) in [(false, false), (true, false), (true, true)] {
        let mut conn = Conn::unix(f.server.socket());
        conn.greeting();
        let flags = if no_zeroes {
            FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES
        } else {
            FLAG_C_FIXED_NEWSTYLE
        };
        conn.client_flags(flags);
        if structured {
            conn.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(conn.option_reply().kind, REP_ACK);
        }
        conn.option(OPT_EXPORT_NAME, b"disk");
        let size = conn.recv_u64("the NBD_OPT_EXPORT_NAME reply");
        let tflags = conn.recv_u16("the NBD_OPT_EXPORT_NAME reply");
        if !no_zeroes {
            let zeroes = conn.recv_exact(124, "the 124 zero bytes");
            assert!(
                zeroes.iter().all(|&b| b == 0),
                "the 124 bytes after NBD_OPT_EXPORT_NAME are not zero"
            );
        }
        assert_eq!(size, SIZE, "export size from NBD_OPT_EXPORT_NAME");
        assert!(tflags & FLAG_HAS_FLAGS != 0);
        let details = ExportDetails {
            size: Some(size),
            flags: tflags,
            ..Default::default()
        };
        let mut nbd = Nbd::transmission(conn, structured, details);
        f.assert_usable(&mut nbd, "NBD_OPT_EXPORT_NAME");
    }

    // An unknown name cannot be refused politely on this path: the server hangs up.
    let mut conn = Conn::unix(f.server.socket());
    conn.greeting();
    conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    conn.option(OPT_EXPORT_NAME, b"nope");
    if let Err(e) = conn.wait_closed(Duration::from_secs(5)) {
        panic!("NBD_OPT_EXPORT_NAME for a missing export: {e}");
    }
}

#[test]
fn pipelined_requests_all_get_answers() {
    let f = fixture("pipelined_requests_all_get_answers", &[]);
    const N: u64 = 64;
    let write_base = 4 * MIB;
    for structured in [false, true] {
        let mut nbd = f.connect(structured);
        let mut stream = Vec::new();
        let mut expected = std::collections::HashMap::new();
        let writes: Vec<Vec<u8>> = (0..N)
            .map(|i| random_bytes(100 + i + u64::from(structured) * N, 4096))
            .collect();
        for i in 0..N {
            let w = nbd.encode(
                0,
                CMD_WRITE,
                write_base + i * 4096,
                4096,
                &writes[i as usize],
                &mut stream,
            );
            expected.insert(w, None);
            // Reads of a region no write touches: requests in flight together may execute in
            // any order.
            let offset = i * 16 * KIB;
            let r = nbd.encode(0, CMD_READ, offset, 4096, &[], &mut stream);
            expected.insert(r, Some(offset));
        }
        // A flush only covers writes already answered, so its reply may come at any point.
        let flush = nbd.encode(0, CMD_FLUSH, 0, 0, &[], &mut stream);
        expected.insert(flush, None);

        // Sending from another thread: replies to the reads may fill the socket buffer before
        // the last request is sent, and both sides must keep moving.
        let mut tx = nbd.conn.try_clone();
        let sender = thread::spawn(move || tx.send(&stream));
        for _ in 0..2 * N + 1 {
            let r = nbd.recv();
            let Some(read_at) = expected.remove(&r.cookie) else {
                panic!("reply for cookie {:#x}, which is not outstanding", r.cookie);
            };
            assert_eq!(
                r.error,
                0,
                "pipelined request {:#x}: {}",
                r.cookie,
                r.describe()
            );
            if let Some(offset) = read_at {
                let want = &f.model[offset as usize..offset as usize + 4096];
                assert_same_data(&format!("pipelined READ {offset}+4096"), want, &r.data);
            }
        }
        sender.join().unwrap();
        assert!(
            expected.is_empty(),
            "{} requests got no reply",
            expected.len()
        );

        let back = nbd.read(write_base, (N * 4096) as u32);
        for (i, w) in writes.iter().enumerate() {
            assert_same_data(
                &format!("pipelined WRITE #{i}"),
                w,
                &back[i * 4096..(i + 1) * 4096],
            );
        }
        f.assert_usable(&mut nbd, "pipelining");
    }
}
