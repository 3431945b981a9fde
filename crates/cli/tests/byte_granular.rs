//! Byte-granular requests (issue 17): a client that did not ask for `NBD_INFO_BLOCK_SIZE`
//! (GO without it, or `NBD_OPT_EXPORT_NAME`) may read, write, zero and trim single bytes,
//! on `tandem serve` and on a replicated `tandem node` pair; a client that asked is held to
//! the 512-byte minimum as before. Unaligned writes are read-modify-writes: concurrent
//! ones from two connections to adjacent bytes of one sector must all survive. Checked
//! byte for byte through reads and in the backing files (both replicas).

mod common;

use std::fs;
use std::path::Path;

use common::cluster::*;
use common::*;
use tandem_frontend::nbd::wire::*;

const SIZE: u64 = 4 * MIB;
/// The start of the export is random data, so a read-modify-write that wrote back the
/// wrong bytes shows.
const RANDOM: usize = 256 * KIB as usize;
const ENOTSUP: u32 = 95;

fn initial() -> Vec<u8> {
    let mut model = vec![0u8; SIZE as usize];
    model[..RANDOM].copy_from_slice(&random_bytes(17, RANDOM));
    model
}

#[track_caller]
fn expect_ok(r: &Reply, what: &str) {
    assert_eq!(r.error, 0, "{what}: {}", r.describe());
}

/// A write through `nbd`, mirrored in `model`.
#[track_caller]
fn write(nbd: &mut Nbd, model: &mut [u8], offset: u64, data: &[u8], fua: bool) {
    let flags = if fua { CMD_FLAG_FUA } else { 0 };
    let r = nbd.request(flags, CMD_WRITE, offset, data.len() as u32, data);
    expect_ok(&r, &format!("WRITE {offset}+{}", data.len()));
    model[offset as usize..offset as usize + data.len()].copy_from_slice(data);
}

#[track_caller]
fn check_read(nbd: &mut Nbd, model: &[u8], offset: u64, len: u32) {
    let data = nbd.read(offset, len);
    let want = &model[offset as usize..offset as usize + len as usize];
    assert_same_data(&format!("READ {offset}+{len}"), want, &data);
}

/// Every kind of unaligned request from a client not bound to block sizes, each checked
/// by reads of its own bytes and of the sectors around them.
fn byte_requests(nbd: &mut Nbd, model: &mut [u8]) {
    // One byte at offset 1, three across the first sector boundary.
    write(nbd, model, 1, &[0xab], false);
    write(nbd, model, 510, &[1, 2, 3], false);
    check_read(nbd, model, 1, 1);
    check_read(nbd, model, 510, 3);
    check_read(nbd, model, 0, 1024);
    // Reads of any alignment, some across many sectors.
    for (offset, len) in [(0, 1), (511, 1), (511, 2), (7, 5000), (4095, 4098)] {
        check_read(nbd, model, offset, len);
    }
    // A FUA write, and a larger one cut at both ends.
    write(nbd, model, 4097, &[9; 7], true);
    let big = random_bytes(23, 100_000);
    write(nbd, model, 12_345, &big, false);
    check_read(nbd, model, 12_000, 101_000);
    // Zeroing: inside one sector, and with edges and whole sectors between.
    for (offset, len) in [(1000u64, 100u32), (20_001, 9000)] {
        let r = nbd.request(0, CMD_WRITE_ZEROES, offset, len, &[]);
        expect_ok(&r, &format!("WRITE_ZEROES {offset}+{len}"));
        model[offset as usize..(offset + u64::from(len)) as usize].fill(0);
        check_read(nbd, model, offset - 1000, len + 2000);
    }
    // A fast zeroing of an unaligned range would write its edges: refused, nothing done.
    let r = nbd.request(CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 3, 4096, &[]);
    assert_eq!(
        r.error,
        ENOTSUP,
        "fast WRITE_ZEROES 3+4096: {}",
        r.describe()
    );
    check_read(nbd, model, 0, 8192);
    // A trim only drops the whole sectors inside it (their contents are then undefined:
    // written over at once); the bytes around them stay.
    let r = nbd.request(0, CMD_TRIM, 40_000, 3000, &[]);
    expect_ok(&r, "TRIM 40000+3000");
    write(nbd, model, 40_448, &[0x5c; 2048], false);
    check_read(nbd, model, 39_000, 5000);
    let r = nbd.request(0, CMD_TRIM, 50_001, 10, &[]);
    expect_ok(&r, "TRIM 50001+10");
    check_read(nbd, model, 49_000, 2000);
    let r = nbd.request(0, CMD_CACHE, 3, 5, &[]);
    expect_ok(&r, "CACHE 3+5");
    // The last byte, and one past it.
    write(nbd, model, SIZE - 1, &[0xee], false);
    check_read(nbd, model, SIZE - 3, 3);
    let r = nbd.request(0, CMD_WRITE, SIZE - 1, 2, &[1, 2]);
    assert_eq!(r.error, ENOSPC, "WRITE past the end: {}", r.describe());
    nbd.flush();
}

/// A client bound to block sizes gets EINVAL for the same requests, and nothing changes.
fn sized_client_refused(nbd: &mut Nbd, model: &[u8]) {
    // 512, or the device's logical block with O_DIRECT.
    let minimum = nbd.details.block.map(|b| b[0]);
    assert!(
        minimum.is_some_and(|m| (512..=4096).contains(&m)),
        "{minimum:?}"
    );
    for (command, offset, len) in [
        (CMD_WRITE, 1, 1),
        (CMD_WRITE, 510, 3),
        (CMD_READ, 1, 1),
        (CMD_WRITE_ZEROES, 1000, 100),
        (CMD_TRIM, 1, 4096),
    ] {
        let payload = if command == CMD_WRITE {
            vec![0x77; len as usize]
        } else {
            Vec::new()
        };
        let r = nbd.request(0, command, offset, len, &payload);
        assert_eq!(
            r.error,
            EINVAL,
            "command {command} {offset}+{len} from a client bound to 512-byte blocks: {}",
            r.describe()
        );
    }
    check_read(nbd, model, 0, 8192);
}

/// Rounds of unaligned one-byte writes, pipelined from two connections to interleaved
/// bytes of one sector (`a` the even ones, `b` the odd ones), plus 512-byte writes of the
/// next sector from `c` (aligned, unless the blocks are larger). Every byte of every round
/// must be there: a read-modify-write that read before another's write landed would write
/// back the old byte.
fn concurrent_rounds(a: &mut Nbd, b: &mut Nbd, c: &mut Nbd, model: &mut [u8], rounds: u64) {
    const BASE: u64 = 1024 * 1024;
    for round in 0..rounds {
        let sector = BASE + (round % 8) * 1024;
        let value = |i: u64| (round as u8).wrapping_mul(13).wrapping_add(i as u8) | 1;
        let mut batch_a = Vec::new();
        let mut batch_b = Vec::new();
        for i in 0..16u64 {
            let (oa, ob) = (sector + 2 * i, sector + 2 * i + 1);
            a.encode(0, CMD_WRITE, oa, 1, &[value(2 * i)], &mut batch_a);
            b.encode(0, CMD_WRITE, ob, 1, &[value(2 * i + 1)], &mut batch_b);
            model[oa as usize] = value(2 * i);
            model[ob as usize] = value(2 * i + 1);
        }
        let neighbour = vec![round as u8; 512];
        let mut batch_c = Vec::new();
        c.encode(0, CMD_WRITE, sector + 512, 512, &neighbour, &mut batch_c);
        model[(sector + 512) as usize..(sector + 1024) as usize].copy_from_slice(&neighbour);
        // Interleaved on the wire as far as two sockets allow.
        let half = batch_a.len() / 2;
        a.conn.send(&batch_a[..half]);
        b.conn.send(&batch_b[..half]);
        c.conn.send(&batch_c);
        a.conn.send(&batch_a[half..]);
        b.conn.send(&batch_b[half..]);
        for n in [&mut *a, &mut *b] {
            for _ in 0..16 {
                let r = n.recv();
                expect_ok(&r, &format!("round {round}: a one-byte write"));
            }
        }
        expect_ok(&c.recv(), &format!("round {round}: the aligned write"));
        let got = a.read(sector, 1024);
        let want = &model[sector as usize..(sector + 1024) as usize];
        assert_same_data(&format!("round {round}: sector {sector}"), want, &got);
    }
}

/// The data of a backing file (internal metadata, if any, lies past it) is the model.
#[track_caller]
fn assert_file(path: &Path, model: &[u8], what: &str) {
    let data = fs::read(path).unwrap();
    assert!(data.len() >= model.len(), "{what}: {} bytes", data.len());
    assert_same_data(what, model, &data[..model.len()]);
}

#[test]
fn serve_answers_clients_without_block_sizes_byte_for_byte() {
    const TEST: &str = "byte_granular::serve_answers_clients_without_block_sizes_byte_for_byte";
    for direct in [false, true] {
        let dir = TestDir::new(TEST);
        let path = dir.join("disk.img");
        sparse_file(&path, SIZE);
        let mut model = initial();
        write_at(&path, 0, &model[..RANDOM]);
        let mut b = Server::builder(&dir).export("disk", &path);
        if direct {
            b = b.arg("--direct");
        }
        let server = b.start();
        let sock = server.socket();
        for structured in [false, true] {
            let mut nbd = Nbd::go_unsized(Conn::unix(sock), "disk", structured);
            assert_eq!(nbd.details.block, None, "block sizes sent unasked");
            byte_requests(&mut nbd, &mut model);
        }
        let mut old = Nbd::export_name(Conn::unix(sock), "disk");
        write(&mut old, &mut model, 77, b"export name", false);
        check_read(&mut old, &model, 0, 1024);
        let mut sized = Nbd::go(Conn::unix(sock), "disk", true);
        sized_client_refused(&mut sized, &model);
        let mut a = Nbd::go_unsized(Conn::unix(sock), "disk", false);
        let mut b = Nbd::export_name(Conn::unix(sock), "disk");
        let mut c = Nbd::go_unsized(Conn::unix(sock), "disk", true);
        concurrent_rounds(&mut a, &mut b, &mut c, &mut model, 300);
        sized.flush();
        drop((a, b, c, sized, old));
        assert_file(
            &path,
            &model,
            &format!("the backing file (direct: {direct})"),
        );
        drop(server);
    }
}

#[test]
fn a_replicated_pair_answers_clients_without_block_sizes_byte_for_byte() {
    const TEST: &str =
        "byte_granular::a_replicated_pair_answers_clients_without_block_sizes_byte_for_byte";
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            size: SIZE,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    c.wait_connected();
    let sock = c.node("alpha").nbd.clone();
    let mut model = initial();
    let mut sized = Nbd::go(Conn::unix(&sock), RESOURCE, true);
    sized.write(0, &model[..RANDOM]);
    for structured in [false, true] {
        let mut nbd = Nbd::go_unsized(Conn::unix(&sock), RESOURCE, structured);
        assert_eq!(nbd.details.block, None, "block sizes sent unasked");
        byte_requests(&mut nbd, &mut model);
    }
    sized_client_refused(&mut sized, &model);
    let mut a = Nbd::go_unsized(Conn::unix(&sock), RESOURCE, true);
    let mut b = Nbd::export_name(Conn::unix(&sock), RESOURCE);
    concurrent_rounds(&mut a, &mut b, &mut sized, &mut model, 200);
    sized.flush();
    drop((a, b, sized));
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    for n in ["alpha", "beta"] {
        assert_file(&c.node(n).disk, &model, &format!("{n}'s replica"));
    }
    c.stop_all();
}

/// libnbd with block sizes not asked for and strict mode off sends unaligned requests as
/// they are; with block sizes asked for (its default) it learns 512 and is held to it.
#[test]
fn libnbd_without_block_sizes_reads_and_writes_single_bytes() {
    const TEST: &str = "byte_granular::libnbd_without_block_sizes_reads_and_writes_single_bytes";
    // nbdsh's own interpreter may not be the one with the bindings; any python3 that
    // imports `nbd` runs the same script (libnbd 1.12 or later: set_request_block_size).
    let probe = "import nbd; nbd.NBD().set_request_block_size(False)";
    let python = ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        std::process::Command::new(p)
            .args(["-c", probe])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        return skip(
            TEST,
            "no python3 with libnbd's bindings, 1.12 or later (python3-libnbd)",
        );
    };
    let dir = TestDir::new(TEST);
    let path = dir.join("disk.img");
    sparse_file(&path, SIZE);
    let mut model = initial();
    write_at(&path, 0, &model[..RANDOM]);
    let server = Server::builder(&dir).export("disk", &path).start();
    let script = r#"
import errno, sys, nbd
uri = sys.argv[1]
h = nbd.NBD()
h.set_request_block_size(False)
h.set_strict_mode(0)
h.connect_uri(uri)
assert h.get_block_size(nbd.SIZE_MINIMUM) == 0, h.get_block_size(nbd.SIZE_MINIMUM)
h.pwrite(b"\xab", 1)
h.pwrite(b"\x01\x02\x03", 510)
h.pwrite(b"\x5a" * 1000, 3001, nbd.CMD_FLAG_FUA)
assert h.pread(1, 1) == b"\xab"
assert h.pread(3, 510) == b"\x01\x02\x03"
assert h.pread(1002, 3000)[1:1001] == b"\x5a" * 1000
h.zero(6000, 6)
h.flush()
print(h.pread(8192, 0).hex())
h.shutdown()
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(uri)
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
try:
    h.pwrite(b"\x77", 7)
    raise SystemExit("an unaligned write from a client bound to 512-byte blocks was accepted")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
h.shutdown()
"#;
    let out = run(
        std::process::Command::new(python)
            .args(["-c", script])
            .arg(server.uri("disk")),
        std::time::Duration::from_secs(60),
    );
    out.expect_success();
    model[1] = 0xab;
    model[510..513].copy_from_slice(&[1, 2, 3]);
    model[3001..4001].fill(0x5a);
    model[6..6006].fill(0);
    let hex = out.stdout.trim();
    let read: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    assert_same_data("pread 0+8192", &model[..8192], &read);
    drop(server);
    assert_file(&path, &model, "the backing file");
}
