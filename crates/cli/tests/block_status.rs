//! Block status (`base:allocation`) with real clients: `nbdinfo --map`, `qemu-img map`, and
//! copies by `nbdcopy` and `qemu-img convert` that skip the holes; for `tandem serve` and
//! for a replicated resource (answered from an up-to-date Primary's replica, and by a
//! diskless Primary from an up-to-date peer's). A raw client checks the protocol's edges: the negotiation,
//! EINVAL without a context, REQ_ONE, and that an answer sees the writes answered before
//! it was asked.

mod common;

use common::cluster::*;
use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;
use tandem_frontend::nbd::wire::*;

const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
const DATA: u32 = 0;
const HOLE: u32 = STATE_HOLE | STATE_ZERO;

/// Where the tests write: (offset, length), whole file system blocks, apart from each other
/// and from the end of a 64 MiB volume.
const WRITES: [(u64, u64); 3] = [(MIB, 64 * KIB), (10 * MIB, MIB), (63 * MIB, 4 * KIB)];
const VOLUME: u64 = 64 * MIB;

/// The map a volume of `size` bytes has after `writes` to a sparse file: (start, length,
/// flags), adjacent entries of one kind merged.
fn expected_map(size: u64, writes: &[(u64, u64)]) -> Vec<(u64, u64, u32)> {
    let mut map = Vec::new();
    let mut at = 0;
    for &(offset, len) in writes {
        if offset > at {
            map.push((at, offset - at, HOLE));
        }
        map.push((offset, len, DATA));
        at = offset + len;
    }
    if at < size {
        map.push((at, size - at, HOLE));
    }
    map
}

/// The volume's contents after writing `random_bytes(i, len)` at the `i`-th of `writes`.
fn expected_contents(size: u64, writes: &[(u64, u64)]) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let data = random_bytes(i as u64 + 1, len as usize);
        v[offset as usize..(offset + len) as usize].copy_from_slice(&data);
    }
    v
}

fn write_all(nbd: &mut Nbd, writes: &[(u64, u64)]) {
    for (i, &(offset, len)) in writes.iter().enumerate() {
        nbd.write(offset, &random_bytes(i as u64 + 1, len as usize));
    }
}

fn merge(entries: impl IntoIterator<Item = (u64, u64, u32)>) -> Vec<(u64, u64, u32)> {
    let mut map: Vec<(u64, u64, u32)> = Vec::new();
    for (start, len, flags) in entries {
        match map.last_mut() {
            Some(last) if last.2 == flags && last.0 + last.1 == start => last.1 += len,
            _ => map.push((start, len, flags)),
        }
    }
    map
}

/// `nbdinfo --map`: "start length type description" per line.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let run = run(tool("nbdinfo").arg("--map").arg(uri), TOOL_TIMEOUT);
    run.expect_success();
    let entries = run.stdout.lines().map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 {
            f.get(i)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("nbdinfo --map line {line:?}:\n{}", run.stdout))
        };
        (num(0), num(1), num(2) as u32)
    });
    merge(entries.collect::<Vec<_>>())
}

/// `qemu-img map --output=json`, as (start, length, flags): data is 0, a zero range that
/// holds no data a hole.
fn qemu_img_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let run = run(
        tool("qemu-img").args(["map", "--output=json", "-f", "raw", uri]),
        TOOL_TIMEOUT,
    );
    run.expect_success();
    let json = Json::parse(&run.stdout)
        .unwrap_or_else(|e| panic!("qemu-img map printed invalid JSON ({e}):\n{}", run.stdout));
    let entries = json
        .as_array()
        .expect("qemu-img map: not an array")
        .iter()
        .map(|e| {
            let num = |k: &str| e.get(k).and_then(Json::as_u64).expect(k);
            let flag = |k: &str| e.get(k).and_then(Json::as_bool).expect(k);
            let flags = match (flag("data"), flag("zero")) {
                (false, true) => HOLE,
                (true, _) => DATA,
                (false, false) => panic!("qemu-img map: neither data nor zero: {e:?}"),
            };
            (num("start"), num("length"), flags)
        });
    merge(entries.collect::<Vec<_>>())
}

/// Copies `uri` with `nbdcopy` and with `qemu-img convert` to new files (named after
/// `from`): both equal `contents`, and both are sparse, allocating about what was written
/// (`written` bytes) rather than the volume's size: the copies skipped the holes.
fn copies_are_equal_and_sparse(
    dir: &TestDir,
    from: &str,
    uri: &str,
    contents: &[u8],
    written: u64,
) {
    let by_nbdcopy = dir.join(format!("{from}-nbdcopy.img"));
    sparse_file(&by_nbdcopy, 0);
    run(tool("nbdcopy").arg(uri).arg(&by_nbdcopy), TOOL_TIMEOUT).expect_success();
    let by_qemu = dir.join(format!("{from}-convert.img"));
    run(
        tool("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw", uri])
            .arg(&by_qemu),
        TOOL_TIMEOUT,
    )
    .expect_success();
    for copy in [&by_nbdcopy, &by_qemu] {
        let name = copy.display().to_string();
        assert_same_data(&name, contents, &fs::read(copy).unwrap());
        let allocated = allocated(copy);
        eprintln!("{name}: {allocated} bytes allocated for {written} written");
        assert!(
            allocated >= written && allocated <= written + MIB,
            "{name}: {allocated} bytes allocated, {written} written: the copy did not skip the holes"
        );
    }
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

/// The data of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
fn meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(export.len() as u32).to_be_bytes());
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

/// The (id, name) of each NBD_REP_META_CONTEXT up to the ACK of `option`.
#[track_caller]
fn contexts(conn: &mut Conn, option: u32) -> Vec<(u32, String)> {
    let mut v = Vec::new();
    loop {
        let r = conn.option_reply();
        assert_eq!(r.option, option);
        match r.kind {
            REP_ACK => return v,
            REP_META_CONTEXT => {
                assert!(
                    r.data.len() > 4,
                    "META_CONTEXT reply of {} bytes",
                    r.data.len()
                );
                let id = u32::from_be_bytes(r.data[..4].try_into().unwrap());
                v.push((id, String::from_utf8(r.data[4..].to_vec()).unwrap()));
            }
            k => panic!("option {option}: reply {k:#x} {:?}", r.message()),
        }
    }
}

/// Structured replies, `base:allocation` selected for `export`, then NBD_OPT_GO: the
/// client and the context id the server gave.
#[track_caller]
fn go_with_block_status(socket: &Path, export: &str) -> (Nbd, u32) {
    let mut conn = Conn::unix(socket);
    conn.greeting();
    conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    conn.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(conn.option_reply().kind, REP_ACK);
    conn.option(OPT_LIST_META_CONTEXT, &meta_request(export, &[]));
    let listed = contexts(&mut conn, OPT_LIST_META_CONTEXT);
    assert_eq!(listed, [(0, "base:allocation".to_string())]);
    let queries = ["qemu:dirty-bitmap:x", "base:allocation"];
    conn.option(OPT_SET_META_CONTEXT, &meta_request(export, &queries));
    let selected = contexts(&mut conn, OPT_SET_META_CONTEXT);
    assert_eq!(selected.len(), 1, "{selected:?}");
    assert_eq!(selected[0].1, "base:allocation");
    let id = selected[0].0;
    conn.option(OPT_GO, &info_request(export, &[INFO_BLOCK_SIZE]));
    let details = conn
        .info_replies(OPT_GO)
        .unwrap_or_else(|r| panic!("NBD_OPT_GO {export:?}: {:#x} {:?}", r.kind, r.message()));
    (Nbd::transmission(conn, true, details), id)
}

#[test]
fn serve_maps_data_and_holes_for_nbdinfo_and_qemu_and_copies_skip_the_holes() {
    const TEST: &str =
        "block_status::serve_maps_data_and_holes_for_nbdinfo_and_qemu_and_copies_skip_the_holes";
    if !require_tools(TEST, &["nbdinfo", "qemu-img", "nbdcopy"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let backing = dir.join("disk.img");
    sparse_file(&backing, VOLUME);
    let server = Server::builder(&dir).export("disk", &backing).start();
    write_all(
        &mut Nbd::go(Conn::unix(server.socket()), "disk", true),
        &WRITES,
    );
    let uri = server.uri("disk");
    let want = expected_map(VOLUME, &WRITES);
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map");
    assert_eq!(qemu_img_map(&uri), want, "qemu-img map");
    let written = WRITES.iter().map(|w| w.1).sum();
    let contents = expected_contents(VOLUME, &WRITES);
    copies_are_equal_and_sparse(&dir, "serve", &uri, &contents, written);
}

/// With a minimum block size of 64 KiB, holes are reported in whole blocks only: a block
/// that holds 4 KiB of data is data for all of its 64 KiB.
#[test]
fn serve_reports_holes_in_whole_minimum_blocks() {
    const TEST: &str = "block_status::serve_reports_holes_in_whole_minimum_blocks";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let backing = dir.join("disk.img");
    sparse_file(&backing, 4 * MIB);
    // Written around the server: 4 KiB in the middle of the second 64 KiB block.
    write_at(&backing, 64 * KIB + 8 * KIB, &random_bytes(3, 4096));
    let server = Server::builder(&dir)
        .export("disk", &backing)
        .arg("--block-size")
        .arg("65536")
        .start();
    assert_eq!(
        nbdinfo_map(&server.uri("disk")),
        [
            (0, 64 * KIB, HOLE),
            (64 * KIB, 64 * KIB, DATA),
            (128 * KIB, 4 * MIB - 128 * KIB, HOLE)
        ]
    );
}

/// The protocol's edges with a raw client: no context, no block status (EINVAL); with one,
/// the id the server gave, REQ_ONE, bounds; and an answer sees every write and trim
/// answered before it was asked, on this connection or another.
#[test]
fn serve_block_status_follows_answered_writes_and_needs_a_context() {
    const TEST: &str =
        "block_status::serve_block_status_follows_answered_writes_and_needs_a_context";
    let dir = TestDir::new(TEST);
    let backing = dir.join("disk.img");
    let size = 8 * MIB;
    sparse_file(&backing, size);
    let server = Server::builder(&dir).export("disk", &backing).start();

    for structured in [false, true] {
        let mut plain = Nbd::go(Conn::unix(server.socket()), "disk", structured);
        for flags in [0, CMD_FLAG_REQ_ONE] {
            let r = plain.request(flags, CMD_BLOCK_STATUS, 0, 4096, &[]);
            assert_eq!(r.error, EINVAL, "without a context: {}", r.describe());
        }
        // The connection goes on.
        assert_eq!(plain.read(0, 512), vec![0; 512]);
    }
    server.expect_log(&["metadata context"], "the refused block status");

    let (mut bs, id) = go_with_block_status(server.socket(), "disk");
    let mut writer = Nbd::go(Conn::unix(server.socket()), "disk", false);
    assert_eq!(
        bs.block_status(0, size as u32, false),
        [(size as u32, HOLE)]
    );
    let r = bs.request(0, CMD_BLOCK_STATUS, 0, 4096, &[]);
    assert_eq!(r.context, Some(id), "the id SET_META_CONTEXT gave");

    // Another connection's write, answered: seen at once.
    writer.write(MIB, &random_bytes(1, 8192));
    assert_eq!(
        bs.block_status(0, size as u32, false),
        [
            (MIB as u32, HOLE),
            (8192, DATA),
            (size as u32 - MIB as u32 - 8192, HOLE)
        ]
    );
    // REQ_ONE: exactly one descriptor, within the request.
    assert_eq!(bs.block_status(0, size as u32, true), [(MIB as u32, HOLE)]);
    assert_eq!(bs.block_status(MIB, 4096, true), [(4096, DATA)]);
    assert_eq!(bs.block_status(MIB + 4096, 8192, true), [(4096, DATA)]);
    // This connection's own write, then a trim of the other one.
    bs.write(2 * MIB, &random_bytes(2, 4096));
    let r = writer.request(0, CMD_TRIM, MIB, 8192, &[]);
    assert_eq!(r.error, 0, "TRIM: {}", r.describe());
    assert_eq!(
        bs.block_status(MIB, MIB as u32 + 8192, false),
        [(MIB as u32, HOLE), (4096, DATA), (4096, HOLE)]
    );
    // Bounds and alignment are checked as for a trim.
    for (offset, len) in [(size - 4096, 8192), (size, 512), (100, 512), (0, 0)] {
        let r = bs.request(0, CMD_BLOCK_STATUS, offset, len, &[]);
        assert_eq!(
            r.error,
            EINVAL,
            "BLOCK_STATUS {offset}+{len}: {}",
            r.describe()
        );
    }
    assert_eq!(bs.block_status(size - 4096, 4096, false), [(4096, HOLE)]);
}

/// A resource of two diskful nodes and a diskless one: the up-to-date Primary answers from
/// its replica (holes where nothing was written), and the diskless Primary, which has no
/// replica, from an up-to-date peer's (`AllocReq`): the same map, so copies through it
/// skip the holes too. Both serve the same bytes, and a write answered through the
/// diskless Primary is in its next answer.
#[test]
fn replicated_resource_maps_holes_on_an_up_to_date_primary_and_through_a_diskless_one() {
    const TEST: &str = "block_status::replicated_resource_maps_holes_on_an_up_to_date_primary_and_through_a_diskless_one";
    if !require_tools(TEST, &["nbdinfo", "qemu-img", "nbdcopy"]) {
        return;
    }
    let setup = Setup {
        size: VOLUME,
        ..Setup::new("C", &[ALPHA, BETA, GAMMA])
    };
    let mut c = Cluster::start_with(TEST, setup);
    c.wait_in_sync(SYNC_TIMEOUT);

    let (mut client, _) = go_with_block_status(&c.node("alpha").nbd, RESOURCE);
    write_all(&mut client, &WRITES);
    // An answered write is in the map at once.
    let (offset, len) = WRITES[1];
    assert_eq!(
        client.block_status(offset - 4096, len as u32 + 8192, false),
        [(4096, HOLE), (len as u32, DATA), (4096, HOLE)]
    );
    drop(client);

    let uri = c.node("alpha").uri();
    let want = expected_map(VOLUME, &WRITES);
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map on the Primary");
    assert_eq!(qemu_img_map(&uri), want, "qemu-img map on the Primary");
    let contents = expected_contents(VOLUME, &WRITES);
    let written = WRITES.iter().map(|w| w.1).sum();
    copies_are_equal_and_sparse(&c.dir, "alpha", &uri, &contents, written);

    // Alpha steps down once its last client left; gamma's first client promotes it.
    c.wait_for("alpha Secondary", READY_TIMEOUT, |statuses| {
        let alpha = &statuses.iter().find(|(n, _)| *n == "alpha").unwrap().1;
        match str_of(alpha, "role") {
            "Secondary" => Ok(()),
            role => Err(format!("alpha is {role}")),
        }
    });
    let uri = c.node("gamma").uri();
    assert_eq!(
        nbdinfo_map(&uri),
        want,
        "nbdinfo --map on the diskless Primary"
    );
    assert_eq!(
        qemu_img_map(&uri),
        want,
        "qemu-img map on the diskless Primary"
    );
    copies_are_equal_and_sparse(&c.dir, "gamma", &uri, &contents, written);

    let (mut client, _) = go_with_block_status(&c.node("gamma").nbd, RESOURCE);
    assert_eq!(
        client.block_status(0, VOLUME as u32, true),
        [(MIB as u32, HOLE)],
        "REQ_ONE: the first descriptor only"
    );
    // A write answered through the diskless Primary is in the peer's map it asks next.
    let (offset, len) = (20 * MIB, 64 * KIB);
    client.write(offset, &random_bytes(9, len as usize));
    assert_eq!(
        client.block_status(offset - 4096, len as u32 + 8192, false),
        [(4096, HOLE), (len as u32, DATA), (4096, HOLE)]
    );
    drop(client);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.stop_all();
}
