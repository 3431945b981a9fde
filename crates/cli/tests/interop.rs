//! Real NBD clients against the real server: libnbd's tools, QEMU's tools and fio. Each test
//! compares data (or parsed capabilities), not just exit codes.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

fn nbdinfo_json(test: &str, uri: &str) -> Json {
    let run = run(tool("nbdinfo").arg("--json").arg(uri), TOOL_TIMEOUT);
    run.expect_success();
    Json::parse(&run.stdout).unwrap_or_else(|e| {
        panic!(
            "{test}: nbdinfo --json printed invalid JSON ({e}):\n{}",
            run.stdout
        )
    })
}

/// The one export in `nbdinfo --json` output.
fn single_export(info: &Json) -> &Json {
    let exports = info
        .get("exports")
        .and_then(Json::as_array)
        .expect("nbdinfo JSON without \"exports\"");
    assert_eq!(
        exports.len(),
        1,
        "nbdinfo --json on one export listed {}",
        exports.len()
    );
    &exports[0]
}

#[track_caller]
fn expect_bool(export: &Json, key: &str, want: bool) {
    assert_eq!(
        export.get(key).and_then(Json::as_bool),
        Some(want),
        "nbdinfo {key}; export: {export:?}"
    );
}

#[track_caller]
fn expect_u64(export: &Json, key: &str, want: u64) {
    assert_eq!(
        export.get(key).and_then(Json::as_u64),
        Some(want),
        "nbdinfo {key}; export: {export:?}"
    );
}

#[test]
fn nbdinfo_lists_named_exports() {
    const TEST: &str = "interop::nbdinfo_lists_named_exports";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    sparse_file(&dir.join("a.img"), MIB);
    sparse_file(&dir.join("b.img"), 3 * MIB);
    let server = Server::builder(&dir)
        .export("alpha", &dir.join("a.img"))
        .export("beta", &dir.join("b.img"))
        .start();

    let text = run(
        tool("nbdinfo").arg("--list").arg(server.uri("")),
        TOOL_TIMEOUT,
    );
    text.expect_success();
    for needle in [
        "export=\"alpha\"",
        "export=\"beta\"",
        "export-size: 1048576",
        "export-size: 3145728",
    ] {
        assert!(
            text.stdout.contains(needle),
            "nbdinfo --list output lacks {needle:?}:\n{}",
            text.stdout
        );
    }

    let list = run(
        tool("nbdinfo")
            .arg("--list")
            .arg("--json")
            .arg(server.uri("")),
        TOOL_TIMEOUT,
    );
    list.expect_success();
    let json =
        Json::parse(&list.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{}", list.stdout));
    let mut seen: Vec<(String, u64)> = json
        .get("exports")
        .and_then(Json::as_array)
        .expect("no \"exports\" array")
        .iter()
        .map(|e| {
            let name = e
                .get("export-name")
                .and_then(Json::as_str)
                .expect("export without a name")
                .to_string();
            let size = e
                .get("export-size")
                .and_then(Json::as_u64)
                .unwrap_or_else(|| panic!("export {name} without a size"));
            (name, size)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [("alpha".to_string(), MIB), ("beta".to_string(), 3 * MIB)],
        "nbdinfo --list --json"
    );
}

#[test]
fn nbdinfo_reports_capabilities() {
    const TEST: &str = "interop::nbdinfo_reports_capabilities";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    sparse_file(&dir.join("a.img"), 8 * MIB);
    sparse_file(&dir.join("b.img"), 2 * MIB);
    let server = Server::builder(&dir)
        .export("a", &dir.join("a.img"))
        .export("b", &dir.join("b.img"))
        .start();

    for (export, size) in [("a", 8 * MIB), ("b", 2 * MIB), ("", 8 * MIB)] {
        let info = nbdinfo_json(TEST, &server.uri(export));
        let e = single_export(&info);
        expect_u64(e, "export-size", size);
        expect_u64(e, "block_size_minimum", 512);
        expect_u64(e, "block_size_preferred", 4096);
        expect_u64(e, "block_size_maximum", 33554432);
        for key in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_multi_conn",
            "can_cache",
            "can_df",
        ] {
            expect_bool(e, key, true);
        }
        expect_bool(e, "is_read_only", false);
        assert_eq!(
            info.get("structured").and_then(Json::as_bool),
            Some(true),
            "structured replies not negotiated"
        );
    }
}

#[test]
fn nbdinfo_sees_read_only() {
    const TEST: &str = "interop::nbdinfo_sees_read_only";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    sparse_file(&dir.join("ro.img"), 4 * MIB);
    let server = Server::builder(&dir)
        .export("ro", &dir.join("ro.img"))
        .arg("--read-only")
        .start();
    let info = nbdinfo_json(TEST, &server.uri("ro"));
    let e = single_export(&info);
    expect_bool(e, "is_read_only", true);
    expect_u64(e, "export-size", 4 * MIB);
    expect_bool(e, "can_flush", true);
}

#[test]
fn nbdcopy_round_trip() {
    const TEST: &str = "interop::nbdcopy_round_trip";
    if !require_tools(TEST, &["nbdcopy"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let size = 64 * MIB;
    let src = dir.join("src.img");
    let data = random_bytes(42, size as usize);
    fs::write(&src, &data).unwrap();
    let backing = dir.join("disk.img");
    sparse_file(&backing, size);
    let server = Server::builder(&dir).export("disk", &backing).start();

    run(
        tool("nbdcopy").arg(&src).arg(server.uri("disk")),
        TOOL_TIMEOUT,
    )
    .expect_success();
    let out = dir.join("out.img");
    sparse_file(&out, 0);
    run(
        tool("nbdcopy").arg(server.uri("disk")).arg(&out),
        TOOL_TIMEOUT,
    )
    .expect_success();

    assert_same_data(
        "nbdcopy round trip (out.img vs src.img)",
        &data,
        &fs::read(&out).unwrap(),
    );
    assert_same_data(
        "backing file after nbdcopy",
        &data,
        &fs::read(&backing).unwrap(),
    );
}

/// Drops a file's (clean) pages from the page cache.
fn evict_from_page_cache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a plain advisory call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED) on {}", path.display());
}

/// Reads of data that is not in the page cache go to the disk threads (the event loop only
/// reads what is cached): evict the backing file's pages, then read it all back over
/// several connections.
#[test]
fn reads_of_evicted_data() {
    const TEST: &str = "interop::reads_of_evicted_data";
    if !require_tools(TEST, &["nbdcopy"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let size = 32 * MIB;
    let data = random_bytes(7, size as usize);
    let backing = dir.join("disk.img");
    fs::write(&backing, &data).unwrap();
    evict_from_page_cache(&backing);
    let server = Server::builder(&dir).export("disk", &backing).start();
    let out = dir.join("out.img");
    sparse_file(&out, 0);
    run(
        tool("nbdcopy")
            .args(["--connections=4", "--requests=16", "--request-size=65536"])
            .arg(server.uri("disk"))
            .arg(&out),
        TOOL_TIMEOUT,
    )
    .expect_success();
    assert_same_data(
        "evicted backing file read over NBD",
        &data,
        &fs::read(&out).unwrap(),
    );
}

#[test]
fn qemu_img_convert_and_compare() {
    const TEST: &str = "interop::qemu_img_convert_and_compare";
    if !require_tools(TEST, &["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let size = 16 * MIB;
    let src = dir.join("src.img");
    let data = random_bytes(7, size as usize);
    fs::write(&src, &data).unwrap();
    let backing = dir.join("disk.img");
    sparse_file(&backing, size);
    let server = Server::builder(&dir).export("disk", &backing).start();
    let legacy = format!("nbd:unix:{}:exportname=disk", server.socket().display());

    run(
        tool("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&legacy),
        TOOL_TIMEOUT,
    )
    .expect_success();
    assert_same_data(
        "backing file after qemu-img convert",
        &data,
        &fs::read(&backing).unwrap(),
    );

    let compare = |image: &std::path::Path| {
        run(
            tool("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(image)
                .arg(server.uri("disk")),
            TOOL_TIMEOUT,
        )
    };
    let same = compare(&src);
    assert!(
        same.success() && same.stdout.contains("identical"),
        "qemu-img compare of equal images: {}",
        same.describe()
    );

    // The comparison must be able to fail: one byte off in the local image...
    let mut modified = data.clone();
    modified[5 * MIB as usize + 123] ^= 0x01;
    let changed = dir.join("changed.img");
    fs::write(&changed, &modified).unwrap();
    let diff = compare(&changed);
    assert_eq!(
        diff.status.code(),
        Some(1),
        "qemu-img compare missed a changed byte: {}",
        diff.describe()
    );

    // ...and one byte off on the server.
    run(
        tool("qemu-io").args([
            "-f",
            "raw",
            &server.uri("disk"),
            "-c",
            "write -P 0x00 8M 512",
        ]),
        TOOL_TIMEOUT,
    )
    .expect_success();
    let diff = compare(&src);
    assert_eq!(
        diff.status.code(),
        Some(1),
        "qemu-img compare missed a change made over NBD: {}",
        diff.describe()
    );
    assert!(
        diff.stdout.contains("8388608"),
        "qemu-img compare should report offset 8388608: {}",
        diff.describe()
    );
}

#[test]
fn qemu_io_commands() {
    const TEST: &str = "interop::qemu_io_commands";
    if !require_tools(TEST, &["qemu-io"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let size = 8 * MIB;
    let backing = dir.join("disk.img");
    // Random data everywhere, so zeroes read back were written by the server.
    let data = random_bytes(9, size as usize);
    fs::write(&backing, &data).unwrap();
    let server = Server::builder(&dir).export("disk", &backing).start();
    let uri = server.uri("disk");

    let ok = run(
        tool("qemu-io").args([
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "write -z 1M 1M",
            "-c",
            "read -P 0 1M 1M",
            "-c",
            "discard 2M 1M",
            "-c",
            "write -f -P 0xcd 3M 64k",
            "-c",
            "write -z -u 4M 1M",
            "-c",
            "read -P 0 4M 1M",
            "-c",
            "flush",
            "-c",
            "read -P 0x00 1M 1M",
        ]),
        TOOL_TIMEOUT,
    );
    ok.expect_success();
    for bad in ["failed", "error", "Error"] {
        assert!(
            !ok.stdout.contains(bad) && !ok.stderr.contains(bad),
            "qemu-io reported {bad:?}: {}",
            ok.describe()
        );
    }

    // A wrong pattern must fail: the check is real.
    let wrong = run(
        tool("qemu-io").args(["-f", "raw", &uri, "-c", "read -P 0xac 0 1M"]),
        TOOL_TIMEOUT,
    );
    assert!(
        !wrong.success(),
        "qemu-io accepted the wrong pattern: {}",
        wrong.describe()
    );
    assert!(
        wrong.stdout.contains("Pattern verification failed"),
        "{}",
        wrong.describe()
    );

    let file = fs::read(&backing).unwrap();
    assert_same_data(
        "backing file 0..1M",
        &[0xab; MIB as usize],
        &file[..MIB as usize],
    );
    assert_same_data(
        "backing file 1M..2M (write -z)",
        &[0u8; MIB as usize],
        &file[MIB as usize..2 * MIB as usize],
    );
    let (fua, fua_end) = (3 * MIB as usize, (3 * MIB + 64 * KIB) as usize);
    assert_same_data(
        "backing file 3M..3M+64k (FUA write)",
        &[0xcd; 64 * KIB as usize],
        &file[fua..fua_end],
    );
    assert_same_data(
        "backing file between the writes",
        &data[fua_end..4 * MIB as usize],
        &file[fua_end..4 * MIB as usize],
    );
    assert_same_data(
        "backing file 4M..5M (write -z -u)",
        &[0u8; MIB as usize],
        &file[4 * MIB as usize..5 * MIB as usize],
    );
    assert_same_data(
        "backing file past the writes",
        &data[5 * MIB as usize..],
        &file[5 * MIB as usize..],
    );
}

fn fio_args(uri: &str) -> Vec<String> {
    [
        "--name=verify".to_string(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        // Two jobs are two NBD connections, on disjoint halves.
        "--numjobs=2".into(),
        "--size=64M".into(),
        "--offset_increment=64M".into(),
        "--verify=crc32c".into(),
        "--verify_fatal=1".into(),
        // fio would otherwise leave verify state files in the test's working directory.
        "--verify_state_save=0".into(),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ]
    .into()
}

#[test]
fn fio_verify_over_two_connections() {
    const TEST: &str = "interop::fio_verify_over_two_connections";
    if !require_fio_nbd(TEST) {
        return;
    }
    let dir = TestDir::new(TEST);
    let backing = dir.join("disk.img");
    sparse_file(&backing, 128 * MIB);
    let mut server = Server::builder(&dir).export("disk", &backing).start();

    let write = run(
        tool("fio")
            .args(fio_args(&server.uri("disk")))
            .arg("--do_verify=1"),
        Duration::from_secs(300),
    );
    check_fio(&write, "write", Some(128 * MIB));
    check_fio(&write, "read", Some(128 * MIB));

    // Read it back through a new server: the data must have reached the file.
    server.stop(Duration::from_secs(10));
    let server = Server::builder(&dir).export("disk", &backing).start();
    let verify = run(
        tool("fio")
            .args(fio_args(&server.uri("disk")))
            .arg("--verify_only"),
        Duration::from_secs(300),
    );
    check_fio(&verify, "read", Some(128 * MIB));
}
