//! Replication between real `tandem node` daemons on this machine: each node on its own
//! 127.0.0.X address, NBD on Unix sockets, real NBD clients (fio, qemu-io, the harness's raw
//! client). Every test compares bytes of the backing files, not just exit codes.
//!
//! Tests run in parallel: each cluster gets its own addresses (127.0.0.X, a port derived from
//! the test process's pid) and its own scratch directory.

mod common;

use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use tandem_frontend::nbd::wire::{CMD_READ, CMD_WRITE};

/// How long the refusal tests watch two misconfigured nodes fail to connect: with a 200 ms
/// reconnect interval doubling up to 1 s, about five attempts.
const REFUSAL_WATCH: Duration = Duration::from_secs(3);

const VOLUME_SIZE: u64 = 256 * MIB;

// ---------------------------------------------------------------------------------------
// Checks and loads of these tests

/// The load of the fio tests wrote every block of the first 128 MiB (fio's random map covers
/// each block once) and nothing past it.
#[track_caller]
fn assert_fio_footprint(node: &Node) {
    let written = nonzero_blocks(&node.disk, 0, 128 * MIB);
    assert_eq!(
        written,
        128 * MIB / BLOCK,
        "{}'s replica: {written} non-zero blocks of 4 KiB in the first 128 MiB that fio wrote",
        node.name
    );
    let beyond = nonzero_blocks(&node.disk, 128 * MIB, VOLUME_SIZE);
    assert_eq!(
        beyond, 0,
        "{}'s replica: {beyond} non-zero blocks past the 128 MiB that fio wrote",
        node.name
    );
}

/// 4 KiB random writes by two jobs (two NBD connections) on disjoint 64 MiB halves of the
/// first 128 MiB, each block with a crc32c header that fio checks afterwards.
fn randwrite_job() -> Vec<String> {
    strings(&[
        "--name=replication",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--numjobs=2",
        "--size=64M",
        "--offset_increment=64M",
        "--verify=crc32c",
        "--verify_fatal=1",
        // fio would otherwise leave verify state files in the working directory.
        "--verify_state_save=0",
        "--group_reporting",
        "--output-format=json",
    ])
}

/// Sequential 64 KiB writes of 32 MiB from 16 MiB on, with verification.
fn sequential_job() -> Vec<String> {
    strings(&[
        "--name=sequential",
        "--rw=write",
        "--bs=64k",
        "--iodepth=8",
        "--offset=16M",
        "--size=32M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
        "--output-format=json",
    ])
}

// ---------------------------------------------------------------------------------------
// The tests

/// fio writes and verifies through `through`; then the replicas are identical, `footprint`'s
/// file shows fio's writes, and beta's file holds exactly what fio wrote.
fn write_and_verify_replicas(c: &mut Cluster, through: &str, footprint: &str) {
    let load = fio(randwrite_job(), nbd_engine(c.node(through)), &[]);
    check_fio(&load, "write", Some(128 * MIB));
    check_fio(&load, "read", Some(128 * MIB));
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    assert_fio_footprint(c.node(footprint));
    let check = fio(
        randwrite_job(),
        file_engine(&c.node("beta").disk),
        &["--verify_only"],
    );
    check_fio(&check, "read", Some(128 * MIB));
}

#[test]
fn diskless_primary_protocol_c() {
    const TEST: &str = "replication::diskless_primary_protocol_c";
    if !require_fio_nbd(TEST) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();

    // Writes and verifying reads through the diskless node: both go over the network.
    write_and_verify_replicas(&mut c, "gamma", "alpha");
    c.stop_all();
}

#[test]
fn diskful_primary_protocols_a_b_c() {
    const TEST: &str = "replication::diskful_primary_protocols_a_b_c";
    if !require_fio_nbd(TEST) {
        return;
    }
    for protocol in ["A", "B", "C"] {
        eprintln!("{TEST}: protocol {protocol}");
        let mut c = Cluster::start(TEST, protocol, &[ALPHA, BETA], &no_tweak);
        c.wait_connected();
        write_and_verify_replicas(&mut c, "alpha", "beta");
        c.stop_all();
    }
}

/// 8 s of 4 KiB random writes (QD16, plus `extra` fio options) through `engine`; beta is
/// killed (SIGKILL) 2 s in. The writes must succeed and go on for at least 3 s after the kill.
/// A commit-style load: a FLUSH after every write (fio `--fsync=1`), first one writer
/// through the diskless node, then four through a diskful Primary. The Secondaries see small
/// flushes and start syncing ahead of the barriers, so flushes find syncs already running,
/// some of which started before their last write: every flush must still complete, with
/// the data verified and the replicas identical.
#[test]
fn flush_after_every_write() {
    const TEST: &str = "replication::flush_after_every_write";
    if !require_fio_nbd(TEST) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();
    for (i, (through, iodepth)) in [("gamma", 1), ("alpha", 4)].into_iter().enumerate() {
        let job = vec![
            "--name=commits".to_string(),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            format!("--iodepth={iodepth}"),
            "--fsync=1".into(),
            format!("--offset={}M", 4 * i),
            "--size=4M".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--verify_state_save=0".into(),
            "--output-format=json".into(),
        ];
        let load = fio(job, nbd_engine(c.node(through)), &[]);
        check_fio(&load, "write", Some(4 * MIB));
        let flushes = fio_json(&load)
            .get("jobs")
            .and_then(Json::as_array)
            .and_then(|j| j.first()?.at(&["sync", "total_ios"])?.as_u64());
        // fio counts one flush less than writes (it folds the last into its final sync).
        assert!(
            flushes.is_some_and(|n| n >= 1023),
            "through {through}: fio sent {flushes:?} flushes for 1024 writes"
        );
        // The Primary steps down with its last client, so the next writer can promote.
        c.wait_for(
            "without a Primary",
            READY_TIMEOUT,
            |statuses| match statuses
                .iter()
                .find(|(_, st)| str_of(st, "role") == "Primary")
            {
                Some((n, _)) => Err(format!("{n} is still Primary")),
                None => Ok(()),
            },
        );
    }
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let written = nonzero_blocks(&c.node("beta").disk, 0, 8 * MIB);
    assert_eq!(written, 8 * MIB / BLOCK, "beta's replica: blocks fio wrote");
    c.stop_all();
}

fn kill_beta_during_writes(c: &mut Cluster, extra: &[&str], engine: Vec<String>, what: &str) {
    let fio_out = c.dir.join("fio-load.json");
    let fio_err = c.dir.join("fio-load.err");
    let mut cmd = tool("fio");
    cmd.args(strings(&[
        "--name=load",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--time_based",
        "--runtime=8",
        "--output-format=json",
    ]))
    .args(extra)
    .args(engine)
    .stdin(Stdio::null())
    .stdout(File::create(&fio_out).unwrap())
    .stderr(File::create(&fio_err).unwrap());
    let started = Instant::now();
    let mut load = KillOnDrop(cmd.spawn().expect("starting fio"));
    thread::sleep(Duration::from_secs(2));
    if let Some(status) = load.0.try_wait().unwrap() {
        panic!(
            "fio ended ({status}) before beta was killed:\n{}{}",
            std::fs::read_to_string(&fio_out).unwrap_or_default(),
            std::fs::read_to_string(&fio_err).unwrap_or_default()
        );
    }
    c.node_mut("beta").daemon.kill9();
    let killed_at = started.elapsed();
    let status = wait_timeout(&mut load.0, Duration::from_secs(60))
        .expect("fio still running 60 s after its 8 s run time");
    let load_run = Run {
        what: what.into(),
        status,
        stdout: std::fs::read_to_string(&fio_out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&fio_err).unwrap_or_default(),
    };
    check_fio(&load_run, "write", None);
    assert!(
        started.elapsed() > killed_at + Duration::from_secs(3),
        "fio ended {:?} after the kill: it did not keep writing",
        started.elapsed() - killed_at
    );
}

/// Waits until alpha sees beta disconnected and `check` accepts alpha's out-of-sync KiB
/// with beta, per volume.
fn alpha_tracks_beta_missing(
    c: &mut Cluster,
    check: impl Fn(&[Option<u64>]) -> Result<(), String>,
) {
    c.wait_for(
        "aware of what beta missed",
        Duration::from_secs(10),
        |statuses| {
            let alpha = &statuses.iter().find(|(n, _)| *n == "alpha").unwrap().1;
            let beta = peer_of(alpha, "beta").ok_or("alpha lists no peer beta")?;
            if str_of(beta, "connection") == "Connected" {
                return Err("alpha still sees beta Connected".into());
            }
            let oos: Vec<Option<u64>> = arr_of(beta, "volumes")
                .iter()
                .map(|v| num_of(v, "out_of_sync_kib"))
                .collect();
            check(&oos)
        },
    );
}

#[test]
fn kill_and_resync() {
    const TEST: &str = "replication::kill_and_resync";
    if !require_fio_nbd(TEST) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();

    // 8 s of random writes through gamma; beta dies (SIGKILL) 2 s in.
    let engine = nbd_engine(c.node("gamma"));
    kill_beta_during_writes(
        &mut c,
        &[
            "--numjobs=2",
            "--size=64M",
            "--offset_increment=64M",
            "--group_reporting",
        ],
        engine,
        "fio (randwrite through gamma while beta is killed)",
    );

    // Alpha noticed and kept track of what beta missed.
    alpha_tracks_beta_missing(&mut c, |oos| match oos.iter().flatten().sum::<u64>() {
        0 => Err("alpha records nothing out of sync with beta after writes without it".into()),
        _ => Ok(()),
    });

    // Same command again: the existing file starts Outdated and is resynced from alpha.
    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    let first = beta.status();
    let disk = str_of(&arr_of(&first, "volumes")[0], "disk").to_string();
    assert_ne!(
        disk, "UpToDate",
        "beta's replica missed writes but came back UpToDate before any resync"
    );
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let written = nonzero_blocks(&c.node("beta").disk, 0, 128 * MIB);
    assert!(
        written > 128 * MIB / BLOCK / 2,
        "beta's replica holds only {written} written blocks after the resync"
    );

    // And the resynced cluster keeps replicating: a verified pass through gamma.
    let pass = fio(
        sequential_job(),
        nbd_engine(c.node("gamma")),
        &["--do_verify=1"],
    );
    check_fio(&pass, "write", Some(32 * MIB));
    check_fio(&pass, "read", Some(32 * MIB));
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let check = fio(
        sequential_job(),
        file_engine(&c.node("beta").disk),
        &["--verify_only"],
    );
    check_fio(&check, "read", Some(32 * MIB));
    c.stop_all();
}

/// After a resync every node's view of every peer is back to replication "Established" (the
/// data criteria of [`Cluster::wait_in_sync`] hold long before).
#[test]
fn resync_returns_to_established() {
    const TEST: &str = "replication::resync_returns_to_established";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();
    let mut client = Nbd::go(Conn::unix(&c.node("gamma").nbd), RESOURCE, false);
    let before = random_bytes(0x1, MIB as usize);
    client.write(0, &before);
    client.flush();

    c.node_mut("beta").daemon.kill9();
    c.wait_for(
        "aware of beta's absence",
        Duration::from_secs(10),
        |statuses| {
            for (me, st) in statuses {
                if peer_of(st, "beta").is_some_and(|p| str_of(p, "connection") == "Connected") {
                    return Err(format!("{me} still sees beta Connected"));
                }
            }
            Ok(())
        },
    );
    let during = random_bytes(0x2, 2 * MIB as usize);
    client.write(8 * MIB, &during);
    client.flush();
    drop(client);

    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    assert_same_data(
        "beta's replica after the resync",
        &during,
        &read_at(&c.node("beta").disk, 8 * MIB, during.len()),
    );
    // Its end says how much, how long and how fast ("9.6 MiB in 2.0 s (4.8 MiB/s)").
    let log = c.node("beta").daemon.log();
    let took = (log.lines())
        .find(|l| l.contains("volume 0: resync took "))
        .unwrap_or_else(|| panic!("no resync duration in beta's log:\n{log}"));
    assert!(
        took.contains(" MiB in ") && took.contains(" MiB/s)"),
        "{took}"
    );
    c.wait_for(
        "Established everywhere",
        Duration::from_secs(10),
        |statuses| {
            for (me, st) in statuses {
                for p in arr_of(st, "peers") {
                    for pv in arr_of(p, "volumes") {
                        let repl = str_of(pv, "replication");
                        if repl != "Established" {
                            return Err(format!(
                                "{me} sees {} replication {repl}",
                                str_of(p, "name")
                            ));
                        }
                    }
                }
            }
            Ok(())
        },
    );
    c.stop_all();
}

/// Alpha and beta with different shared secrets. `both_ends`: each node says so itself, in its
/// log and in its status; otherwise one clear line on either side suffices.
fn wrong_secret(test: &'static str, both_ends: bool) {
    let tweak = |node: &str, text: String| {
        if node == "beta" {
            let changed = text.replace(
                &format!("shared-secret = \"{SECRET}\""),
                "shared-secret = \"not-the-same\"",
            );
            assert_ne!(changed, text);
            changed
        } else {
            text
        }
    };
    let mut c = Cluster::start(test, "C", &[ALPHA, BETA], &tweak);

    c.assert_alpha_and_beta_never_connect(REFUSAL_WATCH, "their shared secrets differ");
    for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
        let st = c.node(me).status();
        assert_eq!(
            peer_of(&st, other).map(|p| str_of(p, "connection")),
            Some("Connecting"),
            "{me}'s view of {other}\n{}",
            c.describe()
        );
    }

    let secret: &[&str] = &["shared secret"];
    let mentions: Vec<&str> = c
        .nodes
        .iter()
        .filter(|n| wait_log_line(n, &[secret], Duration::from_secs(2)))
        .map(|n| n.name)
        .collect();
    if both_ends {
        assert_eq!(
            mentions,
            ["alpha", "beta"],
            "the logs of these nodes say why they refuse each other (a line with \"shared secret\")"
        );
        for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
            let st = c.node(me).status();
            let err = peer_of(&st, other)
                .and_then(|p| p.get("last_error"))
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_lowercase();
            assert!(
                err.contains("secret") || err.contains("authentic"),
                "{me}'s status gives last_error {err:?} for {other}, not the secrets\n{}",
                c.describe()
            );
        }
    } else {
        assert!(
            !mentions.is_empty(),
            "neither log has a line about the shared secret"
        );
    }

    // Alpha works alone, and nothing reaches beta. Its replica was created at this start
    // and it never met beta: it cannot tell a new cluster from a lost disk, so the
    // administrator declares it current (as for any new DRBD resource).
    c.node("alpha")
        .daemon
        .admin(&["primary", RESOURCE, "--force"])
        .expect_success();
    let data = random_bytes(0x5ec2e7, MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(0, &data);
    client.flush();
    assert_same_data(
        "alpha's replica after a write through alpha",
        &data,
        &read_at(&c.node("alpha").disk, 0, data.len()),
    );
    thread::sleep(Duration::from_secs(1));
    let leaked = nonzero_blocks(&c.node("beta").disk, 0, VOLUME_SIZE);
    assert_eq!(
        leaked, 0,
        "{leaked} blocks of beta's replica were written although beta never authenticated"
    );
    drop(client);
    c.stop_all();
}

#[test]
fn wrong_secret_is_refused() {
    wrong_secret("replication::wrong_secret_is_refused", false);
}

#[test]
fn wrong_secret_is_reported_on_both_ends() {
    wrong_secret("replication::wrong_secret_is_reported_on_both_ends", true);
}

#[test]
fn second_primary_refused() {
    const TEST: &str = "replication::second_primary_refused";
    if !require_tools(TEST, &["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();

    // An NBD client on gamma makes it Primary, and the others learn it.
    let mut gamma_client = Nbd::go(Conn::unix(&c.node("gamma").nbd), RESOURCE, false);
    c.wait_for(
        "aware that gamma is Primary",
        Duration::from_secs(10),
        |statuses| {
            for (me, st) in statuses {
                let role = if *me == "gamma" {
                    str_of(st, "role")
                } else {
                    peer_of(st, "gamma")
                        .map(|p| str_of(p, "role"))
                        .unwrap_or("?")
                };
                if role != "Primary" {
                    return Err(format!("{me} sees gamma {role}"));
                }
            }
            Ok(())
        },
    );

    for args in [
        &["primary", RESOURCE][..],
        &["primary", RESOURCE, "--force"][..],
    ] {
        let r = c.node("alpha").daemon.admin(args);
        assert!(
            !r.success(),
            "`tandem {}` on alpha succeeded while gamma is Primary: {}\n{}",
            args.join(" "),
            r.describe(),
            c.describe()
        );
        let msg = r.stderr.to_lowercase();
        assert!(
            msg.contains("node gamma"),
            "`tandem {}` on alpha failed without naming the Primary (gamma): {}",
            args.join(" "),
            r.describe()
        );
    }
    assert_eq!(str_of(&c.node("alpha").status(), "role"), "Secondary");

    // Alpha's own export refuses writes (an attaching client cannot promote it either).
    let write = run(
        tool("qemu-io").args([
            "-f",
            "raw",
            &c.node("alpha").uri(),
            "-c",
            "write -P 0x5a 0 4k",
        ]),
        Duration::from_secs(30),
    );
    let out = format!("{}{}", write.stdout, write.stderr);
    assert!(
        out.contains("write failed"),
        "qemu-io's write through alpha did not fail while gamma is Primary: {}",
        write.describe()
    );
    for n in c.diskful() {
        assert_eq!(
            nonzero_blocks(&n.disk, 0, MIB),
            0,
            "{}'s replica changed after a refused write through alpha",
            n.name
        );
    }
    let st = c.node("gamma").status();
    assert_eq!(
        str_of(&st, "role"),
        "Primary",
        "gamma lost its role\n{}",
        c.describe()
    );

    // Gamma's writes do go everywhere.
    let data = random_bytes(0x6a33a, 256 * KIB as usize);
    gamma_client.write(MIB, &data);
    gamma_client.flush();
    for n in c.diskful() {
        assert_same_data(
            &format!("{}'s replica after a write through gamma", n.name),
            &data,
            &read_at(&n.disk, MIB, data.len()),
        );
    }

    // The refusal was about gamma: once its client leaves (auto-demote), alpha may promote.
    drop(gamma_client);
    c.wait_for(
        "aware that gamma is Secondary",
        Duration::from_secs(10),
        |statuses| {
            let alpha = &statuses.iter().find(|(n, _)| *n == "alpha").unwrap().1;
            match peer_of(alpha, "gamma").map(|p| str_of(p, "role")) {
                Some("Secondary") => Ok(()),
                other => Err(format!("alpha sees gamma {other:?}")),
            }
        },
    );
    c.node("alpha")
        .daemon
        .admin(&["primary", RESOURCE])
        .expect_success();
    assert_eq!(str_of(&c.node("alpha").status(), "role"), "Primary");
    c.node("alpha")
        .daemon
        .admin(&["secondary", RESOURCE])
        .expect_success();
    c.stop_all();
}

#[test]
fn garbage_peer_is_dropped() {
    const TEST: &str = "replication::garbage_peer_is_dropped";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &no_tweak);
    c.wait_connected();
    let addr = c.node("alpha").address.clone();

    // Frames: magic "TNDM", kind u16, reserved u16, length u32.
    let header = |kind: u16, len: u32| {
        let mut h = b"TNDM".to_vec();
        h.extend_from_slice(&kind.to_be_bytes());
        h.extend_from_slice(&0u16.to_be_bytes());
        h.extend_from_slice(&len.to_be_bytes());
        h
    };
    let mut hello_junk = header(1, 200);
    hello_junk.extend(random_bytes(3, 200));
    let mut huge_write = header(10, 32 << 20);
    huge_write.extend(random_bytes(4, 4096));
    let payloads: [(&str, Vec<u8>); 4] = [
        ("4 KiB of random bytes", random_bytes(0x9a5ba6e, 4096)),
        ("another 4 KiB of random bytes", random_bytes(0xdead, 4096)),
        ("a Hello frame of random contents", hello_junk),
        ("a 32 MiB Write frame during the handshake", huge_write),
    ];
    for (what, bytes) in &payloads {
        let s = TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut conn = Conn::Tcp(s);
        // Alpha may hang up before it has read everything: a failed write is fine.
        let _ = conn.write_all(bytes);
        if let Err(e) = conn.wait_closed(Duration::from_secs(10)) {
            panic!("alpha kept a connection open after {what}: {e}");
        }
        c.assert_running(&["alpha", "beta"]);
    }

    // Alpha is unharmed: it answers, beta is still Connected, and writes still replicate.
    c.wait_connected();
    let data = random_bytes(0x6a7ba6e, MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(4 * MIB, &data);
    client.flush();
    drop(client);
    for n in c.diskful() {
        assert_same_data(
            &format!("{}'s replica after the garbage and a write", n.name),
            &data,
            &read_at(&n.disk, 4 * MIB, data.len()),
        );
    }
    c.stop_all();
}

/// Beta's copy of the config says 128M where alpha's says 256M. `both_ends`: both logs name
/// the sizes and both statuses give them as the last error; otherwise one log line suffices.
fn size_mismatch(test: &'static str, both_ends: bool) {
    let tweak = |node: &str, text: String| {
        if node == "beta" {
            let changed = text.replace("size = \"256M\"", "size = \"128M\"");
            assert_ne!(changed, text);
            changed
        } else {
            text
        }
    };
    let mut c = Cluster::start(test, "C", &[ALPHA, BETA], &tweak);

    let deadline = Instant::now() + REFUSAL_WATCH;
    while Instant::now() < deadline {
        c.assert_running(&["alpha", "beta"]);
        for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
            let st = c.node(me).status();
            assert!(
                !replicating_with(&st, other),
                "{me} replicates with {other} although their volume sizes differ\n{}",
                c.describe()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    wait_alpha_and_beta_apart(&mut c);

    let small: &[&str] = &["134217728", "128M", "128 MiB", "131072 KiB"];
    let large: &[&str] = &["268435456", "256M", "256 MiB", "262144 KiB"];
    let mentions: Vec<&str> = c
        .nodes
        .iter()
        .filter(|n| wait_log_line(n, &[small, large], Duration::from_secs(2)))
        .map(|n| n.name)
        .collect();
    if both_ends {
        assert_eq!(
            mentions,
            ["alpha", "beta"],
            "the logs of these nodes name both sizes on one line"
        );
        for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
            let st = c.node(me).status();
            let err = peer_of(&st, other)
                .and_then(|p| p.get("last_error"))
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_string();
            assert!(
                log_line_with(&err, &[small, large]) || err.to_lowercase().contains("size"),
                "{me}'s status gives last_error {err:?} for {other}, not the sizes\n{}",
                c.describe()
            );
        }
    } else {
        assert!(
            !mentions.is_empty(),
            "neither log has a line naming both sizes (128 MiB and 256 MiB)"
        );
    }

    // A replica created at this start that never met its peer: declared current by hand.
    c.node("alpha")
        .daemon
        .admin(&["primary", RESOURCE, "--force"])
        .expect_success();
    let data = random_bytes(0x512e, MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(0, &data);
    client.flush();
    drop(client);
    assert_same_data(
        "alpha's replica after a write through alpha",
        &data,
        &read_at(&c.node("alpha").disk, 0, data.len()),
    );
    thread::sleep(Duration::from_secs(1));
    let beta_disk = &c.node("beta").disk;
    // The volume, then beta's internal metadata (its own, not replicated).
    let beta_size = std::fs::metadata(beta_disk).unwrap().len();
    assert!(
        beta_size > 128 * MIB,
        "beta's backing file: {beta_size} bytes"
    );
    let leaked = nonzero_blocks(beta_disk, 0, 128 * MIB);
    assert_eq!(
        leaked, 0,
        "{leaked} blocks of beta's replica were written although the sizes differ"
    );
    c.stop_all();
}

#[test]
fn size_mismatch_is_refused() {
    size_mismatch("replication::size_mismatch_is_refused", false);
}

#[test]
fn size_mismatch_is_reported_on_both_ends() {
    size_mismatch("replication::size_mismatch_is_reported_on_both_ends", true);
}

/// A link cut by the administrator (`tandem disconnect`) while the Primary writes, then
/// healed (`tandem connect`). The Primary records everything the cut-off replica missed;
/// the other replica, still connected to it, tells it of each write live and it pulls the
/// data from there (so it is not left knowingly stale); after the heal the Primary's list
/// is pulled too, and the replicas end byte-identical.
#[test]
fn cut_link_and_heal() {
    const TEST: &str = "replication::cut_link_and_heal";
    if !require_fio_nbd(TEST) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_connected();
    let gamma_ctl = c.node("gamma").daemon.control.clone();
    let cut = tandem_admin(&gamma_ctl, &["disconnect", RESOURCE, "beta"]);
    assert!(cut.success(), "{}", cut.describe());
    c.wait_for(
        "gamma cut off from beta",
        Duration::from_secs(10),
        |statuses| {
            let gamma = &statuses.iter().find(|(n, _)| *n == "gamma").unwrap().1;
            let beta = peer_of(gamma, "beta").ok_or("gamma lists no peer beta")?;
            match str_of(beta, "connection") {
                "StandAlone" => Ok(()),
                other => Err(format!("gamma sees beta {other}")),
            }
        },
    );
    // Its status says why (not "connection lost"), and the log names the peer.
    let status = tandem_admin(&gamma_ctl, &["status"]);
    assert!(
        status
            .stdout
            .contains("beta connection:StandAlone (tandem disconnect by the administrator"),
        "{}",
        status.stdout
    );
    assert!(
        c.node("gamma")
            .daemon
            .log()
            .contains("administrator: disconnect done resource=r0 peer=beta"),
        "{}",
        c.node("gamma").daemon.log()
    );
    // Writes while cut reach alpha only; gamma remembers what beta lacks.
    let pass = fio(
        sequential_job(),
        nbd_engine(c.node("gamma")),
        &["--do_verify=1"],
    );
    check_fio(&pass, "write", Some(32 * MIB));
    let gamma = c.node("gamma").status();
    let oos: u64 = peer_of(&gamma, "beta")
        .map(|p| {
            arr_of(p, "volumes")
                .iter()
                .filter_map(|v| num_of(v, "out_of_sync_kib"))
                .sum()
        })
        .unwrap_or(0);
    assert!(
        oos >= 32 * 1024,
        "gamma records {oos} KiB out of sync with beta after 32 MiB of writes without it"
    );
    // Beta catches up through alpha while cut off from the Primary.
    c.wait_for("beta caught up through alpha", SYNC_TIMEOUT, |statuses| {
        let beta = &statuses.iter().find(|(n, _)| *n == "beta").unwrap().1;
        let alpha = peer_of(beta, "alpha").ok_or("beta lists no peer alpha")?;
        match str_of(alpha, "connection") {
            "Connected" => {}
            other => return Err(format!("beta sees alpha {other}")),
        }
        let disks: Vec<&str> = arr_of(beta, "volumes")
            .iter()
            .map(|v| str_of(v, "disk"))
            .collect();
        if disks.iter().all(|d| *d == "UpToDate") {
            Ok(())
        } else {
            Err(format!("beta's disks {disks:?}"))
        }
    });
    let gamma = c.node("gamma").status();
    assert!(
        peer_of(&gamma, "beta").is_some_and(|p| str_of(p, "connection") == "StandAlone"),
        "the link stayed cut"
    );
    assert_eq!(
        nonzero_blocks(&c.node("beta").disk, 16 * MIB, 32 * MIB),
        nonzero_blocks(&c.node("alpha").disk, 16 * MIB, 32 * MIB),
        "beta holds what alpha holds"
    );

    let heal = tandem_admin(&gamma_ctl, &["connect", RESOURCE, "beta"]);
    assert!(heal.success(), "{}", heal.describe());
    c.wait_connected();
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let check = fio(
        sequential_job(),
        file_engine(&c.node("beta").disk),
        &["--verify_only"],
    );
    check_fio(&check, "read", Some(32 * MIB));
    c.stop_all();
}

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

/// A peer that stops reading (SIGSTOP: a hung node) must not make the Primary queue
/// without bound. With protocol A nothing else limits it (writes complete locally): past
/// `max-buffer` new requests wait; the unanswered peer is dropped after `timeout`, writes
/// go on without it, and once it runs again it resyncs.
#[test]
fn stopped_peer_back_pressure() {
    const TEST: &str = "replication::stopped_peer_back_pressure";
    if !require_fio_nbd(TEST) {
        return;
    }
    let tweak = |_: &str, text: String| {
        text.replace(
            "[net]\n",
            // Pings slow enough that the queue fills before the peer is declared dead.
            "[net]\nmax-buffer = \"1M\"\nping-interval = \"10s\"\nping-timeout = \"4s\"\ntimeout = \"5s\"\n",
        )
    };
    let mut c = Cluster::start(TEST, "A", &[ALPHA, BETA], &tweak);
    c.wait_connected();
    let alpha_pid = c.node("alpha").daemon.pid().expect("alpha runs");
    let beta_pid = c.node("beta").daemon.pid().expect("beta runs");

    let fio_out = c.dir.join("fio-load.json");
    let mut cmd = tool("fio");
    cmd.args(randwrite_job())
        .args(["--time_based", "--runtime=10", "--do_verify=0"])
        .args(nbd_engine(c.node("alpha")))
        .stdin(Stdio::null())
        .stdout(File::create(&fio_out).unwrap())
        .stderr(Stdio::null());
    let mut load = KillOnDrop(cmd.spawn().expect("starting fio"));
    thread::sleep(Duration::from_secs(1));
    // SAFETY: signalling a child this test started.
    assert_eq!(unsafe { libc::kill(beta_pid as i32, libc::SIGSTOP) }, 0);
    struct Cont(u32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: as above; harmless if it already runs or is gone.
            unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
        }
    }
    let cont = Cont(beta_pid);
    assert!(
        wait_log_line(
            c.node("alpha"),
            &[&["max-buffer"], &["beta"]],
            Duration::from_secs(10)
        ),
        "alpha never hit max-buffer for the stopped beta:\n{}",
        c.node("alpha").daemon.log()
    );
    assert!(
        wait_log_line(
            c.node("alpha"),
            &[
                &["dropping", "disconnected", "timeout", "timed out"],
                &["1", "beta"]
            ],
            Duration::from_secs(15)
        ),
        "alpha never dropped the stopped beta:\n{}",
        c.node("alpha").daemon.log()
    );
    let status = wait_timeout(&mut load.0, Duration::from_secs(60))
        .expect("fio still running 60 s after its 10 s run time");
    let load_run = Run {
        what: "fio (randwrite through alpha while beta is stopped)".into(),
        status,
        stdout: std::fs::read_to_string(&fio_out).unwrap_or_default(),
        stderr: String::new(),
    };
    check_fio(&load_run, "write", None);
    // Without back-pressure alpha would queue everything written in those seconds for
    // beta (hundreds of MiB); with it, the NBD buffers plus about 1 MiB per peer.
    let peak = peak_rss(alpha_pid);
    assert!(
        peak < 160 * MIB,
        "alpha's peak memory {} MiB while beta was stopped: its queue is not bounded",
        peak / MIB
    );
    eprintln!("{TEST}: alpha peak RSS {} MiB", peak / MIB);

    drop(cont);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let check = fio(
        randwrite_job(),
        file_engine(&c.node("beta").disk),
        &["--verify_only"],
    );
    check_fio(&check, "read", Some(128 * MIB));
    c.stop_all();
}

/// The two volumes of [`two_volumes`]: different sizes, so a mix-up of sizes or offsets shows.
const TWO_VOLUMES: [u64; 2] = [64 * MIB, 32 * MIB];

/// Random writes over all of volume `v` (fio's random map covers each block once), each
/// block with a crc32c header. The volumes differ in block size and seed, so no block one
/// writes matches a block of the other.
fn volume_job(v: usize) -> Vec<String> {
    let (bs, seed) = [("4k", 1001), ("16k", 2002)][v];
    let mut job = strings(&[
        "--rw=randwrite",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--output-format=json",
    ]);
    job.extend([
        format!("--name=volume{v}"),
        format!("--bs={bs}"),
        format!("--randseed={seed}"),
        format!("--size={}M", TWO_VOLUMES[v] / MIB),
    ]);
    job
}

/// 4 KiB blocks at the same offset of two files that are equal (and not all zeroes).
fn same_blocks(a: &Path, b: &Path, len: u64) -> u64 {
    let (fa, fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let mut ba = vec![0u8; MIB as usize];
    let mut bb = vec![0u8; MIB as usize];
    let mut same = 0;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(MIB) as usize;
        fa.read_exact_at(&mut ba[..n], off).unwrap();
        fb.read_exact_at(&mut bb[..n], off).unwrap();
        same += ba[..n]
            .chunks(BLOCK as usize)
            .zip(bb[..n].chunks(BLOCK as usize))
            .filter(|(x, y)| x == y && x.iter().any(|&b| b != 0))
            .count() as u64;
        off += n as u64;
    }
    same
}

/// Each diskful node's file of each volume holds exactly what that volume's fio job wrote:
/// every block written, all of it verified by fio, nothing of the other volume.
#[track_caller]
fn assert_volume_files(c: &Cluster) {
    for n in c.diskful() {
        for (v, &size) in TWO_VOLUMES.iter().enumerate() {
            let len = std::fs::metadata(&n.disks[v]).unwrap().len();
            // The volume, then the replica's internal metadata.
            assert!(
                len > size,
                "{}'s replica of volume {v}: {len} bytes for a volume of {size}",
                n.name
            );
            let written = nonzero_blocks(&n.disks[v], 0, size);
            assert_eq!(
                written,
                size / BLOCK,
                "{}'s replica of volume {v}: {written} non-zero blocks of 4 KiB of {}",
                n.name,
                size / BLOCK
            );
            let check = fio(volume_job(v), file_engine(&n.disks[v]), &["--verify_only"]);
            check_fio(&check, "read", Some(size));
        }
        let same = same_blocks(&n.disks[0], &n.disks[1], TWO_VOLUMES[1]);
        assert_eq!(
            same, 0,
            "{}: {same} blocks of volume 1's file equal volume 0's at the same offset",
            n.name
        );
    }
}

/// One verified fio job per volume, both at once; then the replicas are in sync, identical,
/// and hold each volume's data only.
fn write_both_volumes(c: &mut Cluster, engines: &[Vec<String>]) {
    let runs: Vec<Run> = thread::scope(|s| {
        let jobs: Vec<_> = engines
            .iter()
            .enumerate()
            .map(|(v, engine)| s.spawn(move || fio(volume_job(v), engine.clone(), &[])))
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (v, run) in runs.iter().enumerate() {
        check_fio(run, "write", Some(TWO_VOLUMES[v]));
        check_fio(run, "read", Some(TWO_VOLUMES[v]));
    }
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    assert_volume_files(c);
}

/// A resource of two volumes of different sizes on alpha and beta, used through gamma's two
/// NBD endpoints at once: each volume's replicas end identical and hold that volume's data
/// only. Then beta is killed (kill -9) during writes to volume 1, restarted, resynced, and
/// both volumes compared again.
#[test]
fn two_volumes() {
    const TEST: &str = "replication::two_volumes";
    if !require_fio_nbd(TEST) {
        return;
    }
    let mut c = Cluster::start_volumes(TEST, "C", &[ALPHA, BETA, GAMMA], &TWO_VOLUMES, &no_tweak);
    c.wait_connected();
    let st = c.node("alpha").status();
    let sizes: Vec<Option<u64>> = arr_of(&st, "volumes")
        .iter()
        .map(|v| num_of(v, "size"))
        .collect();
    assert_eq!(
        sizes,
        TWO_VOLUMES.map(Some),
        "alpha's status lists the volumes' sizes"
    );

    // One verified fio job per volume, both at once, through the diskless gamma.
    let engines: Vec<Vec<String>> = (0..2)
        .map(|v| nbd_volume_engine(c.node("gamma"), v))
        .collect();
    write_both_volumes(&mut c, &engines);

    // 8 s of writes to volume 1 only; beta dies (SIGKILL) 2 s in.
    let engine = nbd_volume_engine(c.node("gamma"), 1);
    kill_beta_during_writes(
        &mut c,
        &["--size=32M"],
        engine,
        "fio (randwrite to volume 1 through gamma while beta is killed)",
    );

    // Alpha knows what beta missed, per volume: only volume 1 was written.
    alpha_tracks_beta_missing(&mut c, |oos| match oos {
        [Some(0), Some(k)] if *k > 0 => Ok(()),
        _ => Err(format!(
            "alpha's out-of-sync KiB with beta per volume: {oos:?} (want [0, > 0])"
        )),
    });

    // Restarted, beta's replicas of both volumes start Outdated and are resynced in full.
    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    let first = beta.status();
    let disks: Vec<&str> = arr_of(&first, "volumes")
        .iter()
        .map(|v| str_of(v, "disk"))
        .collect();
    assert_eq!(disks.len(), 2, "beta's status lists two volumes: {first:?}");
    assert!(
        !disks.contains(&"UpToDate"),
        "beta came back with {disks:?} before any resync"
    );
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    // Volume 0 was not written meanwhile: its files still verify, on beta after a full resync.
    for n in c.diskful() {
        let check = fio(volume_job(0), file_engine(&n.disks[0]), &["--verify_only"]);
        check_fio(&check, "read", Some(TWO_VOLUMES[0]));
    }

    // And the resynced cluster keeps replicating both volumes.
    write_both_volumes(&mut c, &engines);
    c.stop_all();
}

/// Issue 12's reproducer: a Secondary whose backing file vanished while it was down (a
/// replaced disk, a typo in `disk =`) comes back with an empty file it created. That replica
/// holds nothing: it must start Inconsistent, be synced in full, and never serve a read
/// before, or reads through the Primary return zeroes where acknowledged data was.
#[test]
fn a_secondary_whose_file_was_deleted_is_synced_in_full() {
    const TEST: &str = "replication::a_secondary_whose_file_was_deleted_is_synced_in_full";
    if !require_tools(TEST, &["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_in_sync(SYNC_TIMEOUT);
    let qemu_io = |uri: &str, cmds: &[&str]| {
        let mut cmd = tool("qemu-io");
        cmd.args(["-f", "raw", uri]);
        for c in cmds {
            cmd.args(["-c", c]);
        }
        let r = run(&mut cmd, Duration::from_secs(60));
        let bad = ["failed", "error", "Error"]
            .iter()
            .any(|b| r.stdout.contains(b) || r.stderr.contains(b));
        (r.success() && !bad, r)
    };
    let gamma = c.node("gamma").uri();
    let (ok, r) = qemu_io(&gamma, &["write -P 0x5a 100M 1M"]);
    assert!(ok, "write through gamma: {}", r.describe());
    c.wait_in_sync(SYNC_TIMEOUT);

    let beta = c.node_mut("beta");
    beta.daemon.stop(Duration::from_secs(10));
    std::fs::remove_file(&beta.disk).unwrap();
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    let first = beta.status();
    let disk = str_of(&arr_of(&first, "volumes")[0], "disk").to_string();
    assert_eq!(
        disk, "Inconsistent",
        "beta's replica was created empty at this start but reports {disk}"
    );
    assert!(
        wait_log_line(
            c.node("beta"),
            &[&["did not exist", "created it empty"], &["synced in full"]],
            Duration::from_secs(5)
        ),
        "beta's log does not say its file was created and why it is synced:\n{}",
        c.node("beta").daemon.log()
    );
    // Reads alternate between the replicas: many reads, all must see the data, while the
    // resync runs and after.
    for round in 0..8 {
        let (ok, r) = qemu_io(&gamma, &["read -P 0x5a 100M 1M"]);
        assert!(ok, "read {round} through gamma: {}", r.describe());
    }
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    assert_eq!(
        read_at(&c.node("beta").disk, 100 * MIB, MIB as usize),
        vec![0x5a; MIB as usize],
        "beta's replica lacks the acknowledged write after the resync"
    );
    for round in 0..8 {
        let (ok, r) = qemu_io(&gamma, &["read -P 0x5a 100M 1M"]);
        assert!(ok, "read {round} after the resync: {}", r.describe());
    }
    c.stop_all();
}

/// Issue 12: `tandem secondary` on a Primary whose volume a client holds open used to
/// succeed, and the client's next write failed with EPERM. Like DRBD it is refused, naming
/// the clients; `--force` takes the volume away: the clients' requests in flight and later
/// ones fail with EIO, and the log says so.
#[test]
fn secondary_is_refused_while_a_client_is_attached() {
    const TEST: &str = "replication::secondary_is_refused_while_a_client_is_attached";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_in_sync(SYNC_TIMEOUT);
    let gamma_sock = c.node("gamma").nbd.clone();
    let mut first = Nbd::go(Conn::unix(&gamma_sock), RESOURCE, true);
    first.write(0, &[0x11; 4096]);
    assert_eq!(str_of(&c.node("gamma").status(), "role"), "Primary");

    let mut second = Nbd::go(Conn::unix(&gamma_sock), RESOURCE, true);
    second.flush();
    let refused = |c: &Cluster, expect: &str| {
        let r = c.node("gamma").daemon.admin(&["secondary", RESOURCE]);
        assert!(
            !r.success(),
            "`tandem secondary` succeeded with NBD clients attached: {}",
            r.describe()
        );
        assert!(
            r.stderr.contains(expect) && r.stderr.contains("--force"),
            "the refusal does not say {expect:?} and the way out: {}",
            r.describe()
        );
        assert_eq!(
            str_of(&c.node("gamma").status(), "role"),
            "Primary",
            "a refused demotion changed the role"
        );
    };
    refused(&c, "2 NBD clients attached");
    second.write(4096, &[0x22; 4096]);
    drop(second);
    thread::sleep(Duration::from_millis(300));
    refused(&c, "1 NBD client attached");
    first.write(8192, &[0x33; 4096]);
    let mut second = Nbd::go(Conn::unix(&gamma_sock), RESOURCE, true);
    second.flush();

    // --force with a write in flight: beta is frozen (protocol C waits for it), so the
    // write is still unanswered when the administrator acts.
    let beta_pid = c.node("beta").daemon.pid().expect("beta runs") as i32;
    unsafe { libc::kill(beta_pid, libc::SIGSTOP) };
    let cookie = first.send(0, CMD_WRITE, 12288, 4096, &[0x44; 4096]);
    thread::sleep(Duration::from_millis(100));
    let forced = c
        .node("gamma")
        .daemon
        .admin(&["secondary", RESOURCE, "--force"]);
    unsafe { libc::kill(beta_pid, libc::SIGCONT) };
    forced.expect_success();
    let r = first.recv();
    assert_eq!(r.cookie, cookie);
    assert_eq!(
        r.error,
        5,
        "the write in flight at the forced demotion did not fail with EIO: {}",
        r.describe()
    );
    for client in [&mut first, &mut second] {
        let r = client.request(0, CMD_WRITE, 16384, 4096, &[0x55; 4096]);
        assert_eq!(r.error, 5, "a later write: {}", r.describe());
        let r = client.request(0, CMD_READ, 0, 4096, &[]);
        assert_eq!(r.error, 5, "a later read: {}", r.describe());
    }
    c.wait_for("gamma Secondary", Duration::from_secs(20), |statuses| {
        let gamma = &statuses.iter().find(|(n, _)| *n == "gamma").unwrap().1;
        match str_of(gamma, "role") {
            "Secondary" => Ok(()),
            other => Err(format!("gamma is {other}")),
        }
    });
    assert!(
        wait_log_line(
            c.node("gamma"),
            &[&["secondary forced"], &["EIO"]],
            Duration::from_secs(5)
        ),
        "gamma's log does not say the clients' requests fail:\n{}",
        c.node("gamma").daemon.log()
    );
    // Nothing written after the demotion reached a replica.
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    assert_eq!(
        nonzero_blocks(&c.node("alpha").disk, 16384, 20480),
        0,
        "a write refused after the forced demotion reached alpha"
    );
    drop(first);
    drop(second);
    c.stop_all();
}

/// Issue 12: alpha is cut off by `tandem disconnect`, a client on alpha's own socket
/// promotes it and writes, while gamma goes on writing through beta. On reconnect every
/// pair that diverged finds the split brain on both sides, logs it once, shows
/// `SplitBrain` in status and stops retrying; alpha keeps its data (it used to go
/// Inconsistent while beta dropped it every second). Then the README's manual resolution:
/// discard alpha's writes by giving it an empty file.
#[test]
fn split_brain_is_reported_on_both_sides_and_not_retried() {
    const TEST: &str = "replication::split_brain_is_reported_on_both_sides_and_not_retried";
    // Without quorum the node cut off takes writes too (with it, see the next test).
    let (mut c, mut gamma) = alpha_disconnected(TEST, &quorum_off);
    c.wait_for("alpha cut off", Duration::from_secs(10), |statuses| {
        for (me, st) in statuses.iter().filter(|(n, _)| *n != "alpha") {
            let conn = peer_of(st, "alpha").map(|p| str_of(p, "connection"));
            if conn == Some("Connected") {
                return Err(format!("{me} still sees alpha connected"));
            }
        }
        Ok(())
    });
    {
        let mut alpha = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
        alpha.write(MIB, &[0xaa; 8192]);
        alpha.flush();
    }
    gamma.write(2 * MIB, &[0xbb; 4096]);
    gamma.flush();
    thread::sleep(Duration::from_millis(300));
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE])
        .expect_success();

    let pairs = [
        ("alpha", "beta"),
        ("beta", "alpha"),
        ("alpha", "gamma"),
        ("gamma", "alpha"),
    ];
    c.wait_for("split brain seen", Duration::from_secs(15), |statuses| {
        for (me, other) in pairs {
            let st = &statuses.iter().find(|(n, _)| *n == me).unwrap().1;
            let p = peer_of(st, other).ok_or_else(|| format!("{me}: no peer {other}"))?;
            if str_of(p, "connection") != "SplitBrain" {
                return Err(format!("{me} sees {other} {}", str_of(p, "connection")));
            }
            if !str_of(p, "split_brain").contains("blocks") {
                return Err(format!("{me}: no reason for the split brain with {other}"));
            }
        }
        Ok(())
    });
    // No retries: a few seconds later still one log line per node and pair.
    thread::sleep(Duration::from_secs(3));
    for (me, other) in pairs {
        let log = c.node(me).daemon.log();
        let lines = log
            .lines()
            .filter(|l| l.contains("split brain") && l.contains(other))
            .count();
        assert_eq!(
            lines, 1,
            "{me}'s log mentions the split brain with {other} {lines} times:\n{log}"
        );
    }
    let beta_log = c.node("beta").daemon.log();
    assert!(
        beta_log.contains("this node has 1 blocks") && beta_log.contains("it has 2 blocks"),
        "beta's log does not count the blocks each side changed:\n{beta_log}"
    );
    assert_eq!(
        str_of(&arr_of(&c.node("alpha").status(), "volumes")[0], "disk"),
        "UpToDate",
        "alpha gave up its own writes without an administrator"
    );
    assert_eq!(read_at(&c.node("alpha").disk, MIB, 8192), vec![0xaa; 8192]);
    // Gamma and beta go on serving.
    gamma.write(3 * MIB, &[0xcc; 4096]);

    // Resolution (README): discard alpha's writes. Stop it, move its file aside, let the
    // survivors accept it again, start it: its empty replica is synced in full.
    let alpha = c.node_mut("alpha");
    alpha.daemon.stop(Duration::from_secs(10));
    std::fs::rename(&alpha.disk, alpha.disk.with_extension("split-brain")).unwrap();
    for n in ["beta", "gamma"] {
        c.node(n)
            .daemon
            .admin(&["connect", RESOURCE, "alpha"])
            .expect_success();
    }
    let alpha = c.node_mut("alpha");
    alpha.daemon.restart();
    alpha.daemon.wait_ready(READY_TIMEOUT);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let alpha_disk = &c.node("alpha").disk;
    assert_eq!(read_at(alpha_disk, 2 * MIB, 4096), vec![0xbb; 4096]);
    assert_eq!(read_at(alpha_disk, 3 * MIB, 4096), vec![0xcc; 4096]);
    assert_eq!(
        read_at(alpha_disk, MIB, 8192),
        vec![0; 8192],
        "alpha's discarded writes"
    );
}

/// Alpha, beta and gamma in sync, gamma's client has written block 0, and `tandem
/// disconnect` on alpha has cut it off (the others may not have noticed yet).
fn alpha_disconnected(test: &'static str, tweak: Tweak<'_>) -> (Cluster, Nbd) {
    let mut c = Cluster::start(test, "C", &[ALPHA, BETA, GAMMA], tweak);
    c.wait_in_sync(SYNC_TIMEOUT);
    let mut gamma = Nbd::go(Conn::unix(&c.node("gamma").nbd), RESOURCE, false);
    gamma.write(0, &[0x11; 4096]);
    c.node("alpha")
        .daemon
        .admin(&["disconnect", RESOURCE])
        .expect_success();
    (c, gamma)
}

fn quorum_off(_node: &str, text: String) -> String {
    text.replacen("[resource]\n", "[resource]\nquorum = \"off\"\n", 1)
}

fn wait_alpha_without_quorum(c: &mut Cluster) {
    c.wait_for(
        "alpha without quorum",
        Duration::from_secs(10),
        |statuses| {
            let alpha = &statuses.iter().find(|(n, _)| *n == "alpha").unwrap().1;
            let q = &arr_of(alpha, "volumes")[0]["quorum"];
            if q["quorate"] != serde_json::Value::Bool(false) {
                return Err(format!("alpha's quorum: {q}"));
            }
            Ok(())
        },
    );
}

/// The same partition as above with the default quorum (a majority of the two diskful
/// nodes, the diskless one breaking the tie): the node cut off cannot become Primary, so
/// there is no split brain to report, and it rejoins and converges by itself.
#[test]
fn a_node_cut_off_takes_no_writes_under_quorum() {
    const TEST: &str = "replication::a_node_cut_off_takes_no_writes_under_quorum";
    let (mut c, mut gamma) = alpha_disconnected(TEST, &no_tweak);
    wait_alpha_without_quorum(&mut c);
    {
        let mut alpha = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
        let r = alpha.request(0, CMD_WRITE, MIB, 8192, &[0xaa; 8192]);
        assert_eq!(
            r.error,
            1,
            "alpha took a write without quorum: {}",
            r.describe()
        );
    }
    let alpha_log = c.node("alpha").daemon.log();
    assert!(
        alpha_log.contains("lost quorum"),
        "alpha's log does not say it lost quorum:\n{alpha_log}"
    );
    let admin = c.node("alpha").daemon.admin(&["primary", RESOURCE]);
    assert!(
        !admin.success() && admin.stderr.contains("no quorum"),
        "tandem primary on alpha: {}",
        admin.describe()
    );
    // Gamma reaches beta, and breaks the tie: it goes on.
    gamma.write(2 * MIB, &[0xbb; 4096]);
    gamma.flush();
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE])
        .expect_success();
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let alpha_disk = &c.node("alpha").disk;
    assert_eq!(read_at(alpha_disk, 2 * MIB, 4096), vec![0xbb; 4096]);
    assert_eq!(read_at(alpha_disk, MIB, 8192), vec![0; 8192]);
    drop(gamma);
    c.stop_all();
}

/// The control socket takes typed requests (shared with the CLI): garbage, an unknown
/// verb, a verb without its resource or with a misspelt field each get `ok:false` and a
/// reason on the same connection, and the daemon goes on answering.
#[test]
fn malformed_control_requests_are_refused_and_the_daemon_goes_on() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;
    const TEST: &str = "replication::malformed_control_requests_are_refused_and_the_daemon_goes_on";
    let c = Cluster::start(TEST, "C", &[ALPHA, BETA], &no_tweak);
    let alpha = c.node("alpha");
    let sock = UnixStream::connect(&alpha.daemon.control).expect("control socket");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(sock.try_clone().unwrap());
    let mut ask = |line: &str| -> Json {
        (&sock).write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).expect("an answer");
        Json::parse(&answer).unwrap_or_else(|e| panic!("{line}: answer {answer:?}: {e}"))
    };
    for (bad, why) in [
        ("this is not json", "not a valid request"),
        (r#"{"cmd":"explode","resource":"r0"}"#, "unknown variant"),
        (r#"{"cmd":"primary"}"#, "missing field `resource`"),
        (
            r#"{"cmd":"primary","resource":"r0","forse":true}"#,
            "unknown field",
        ),
        (r#"{"cmd":"secondary","resource":"nope"}"#, "no resource"),
    ] {
        let a = ask(bad);
        assert_eq!(a["ok"].as_bool(), Some(false), "{bad}: {a:?}");
        let error = a["error"].as_str().unwrap_or("");
        assert!(error.contains(why), "{bad}: {error:?} lacks {why:?}");
    }
    let a = ask(r#"{"cmd":"status"}"#);
    assert_eq!(a["ok"].as_bool(), Some(true), "{a:?}");
    assert_eq!(arr_of(&a, "resources").len(), 1, "{a:?}");
    assert!(
        alpha.daemon.status().is_ok(),
        "the CLI's status still works"
    );
}

/// Last man standing (DRBD's graceful departure): with alpha Primary, gamma then beta stop
/// cleanly, each telling the others; alpha keeps its quorum alone and its writes complete.
/// Back, both count again. Killed instead (nothing said), they still count: alpha alone
/// has no quorum and fails the write, since they might be on the other side of a partition.
#[test]
fn nodes_stopped_cleanly_leave_the_last_one_with_quorum() {
    const TEST: &str = "replication::nodes_stopped_cleanly_leave_the_last_one_with_quorum";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA, GAMMA], &no_tweak);
    c.wait_in_sync(SYNC_TIMEOUT);
    let alpha_nbd = c.node("alpha").nbd.clone();
    let quorate = |c: &Cluster| {
        let st = c.node("alpha").status();
        arr_of(&st, "volumes")[0]["quorum"]["quorate"] == serde_json::Value::Bool(true)
    };
    {
        let mut alpha = Nbd::go(Conn::unix(&alpha_nbd), RESOURCE, false);
        alpha.write(0, &[0x11; 4096]);
        for n in ["gamma", "beta"] {
            c.node_mut(n).daemon.stop(Duration::from_secs(20));
            c.wait_for("alpha sees it gone", Duration::from_secs(10), |statuses| {
                let alpha = &statuses.iter().find(|(m, _)| *m == "alpha").unwrap().1;
                match peer_of(alpha, n).map(|p| str_of(p, "connection")) {
                    Some("Connected") => Err(format!("alpha still sees {n}")),
                    _ => Ok(()),
                }
            });
            assert!(quorate(&c), "alpha lost quorum when {n} stopped cleanly");
        }
        let r = alpha.request(0, CMD_WRITE, MIB, 4096, &[0xaa; 4096]);
        assert_eq!(r.error, 0, "alpha alone: {}", r.describe());
        alpha.flush();
        let log = c.node("beta").daemon.log();
        assert!(
            log.contains("leaves cleanly"),
            "beta's log does not say it left:\n{log}"
        );
    }
    for n in ["beta", "gamma"] {
        let node = c.node_mut(n);
        node.daemon.restart();
        node.daemon.wait_ready(READY_TIMEOUT);
    }
    c.wait_in_sync(SYNC_TIMEOUT);
    assert_eq!(read_at(&c.node("beta").disk, MIB, 4096), vec![0xaa; 4096]);
    let mut alpha = Nbd::go(Conn::unix(&alpha_nbd), RESOURCE, false);
    for n in ["gamma", "beta"] {
        c.node_mut(n).daemon.kill9();
    }
    wait_alpha_without_quorum(&mut c);
    let r = alpha.request(0, CMD_WRITE, 2 * MIB, 4096, &[0xbb; 4096]);
    assert_eq!(
        r.error,
        5,
        "alpha alone after the others vanished (EIO expected): {}",
        r.describe()
    );
}

/// `[resource]` policies for the split-brain tests (two nodes: quorum is off by default).
fn after_sb_least_and_secondary(_node: &str, text: String) -> String {
    text.replacen(
        "[resource]\n",
        "[resource]\nafter-sb-0pri = \"discard-least-changes\"\nafter-sb-1pri = \"discard-secondary\"\n",
        1,
    )
}

/// Both roles Secondary (the clients gone, auto-demoted).
fn wait_secondary(c: &mut Cluster) {
    c.wait_for("both Secondary", Duration::from_secs(10), |statuses| {
        for (me, st) in statuses {
            if str_of(st, "role") != "Secondary" {
                return Err(format!("{me} is {}", str_of(st, "role")));
            }
        }
        Ok(())
    });
}

/// Alpha cut off from beta (`tandem disconnect` on alpha), both seeing it.
fn cut_alpha(c: &mut Cluster) {
    c.node("alpha")
        .daemon
        .admin(&["disconnect", RESOURCE])
        .expect_success();
    wait_alpha_and_beta_apart(c);
}

/// Two nodes, alpha and beta: until neither sees the other connected.
fn wait_alpha_and_beta_apart(c: &mut Cluster) {
    c.wait_for(
        "alpha and beta apart",
        Duration::from_secs(10),
        |statuses| {
            for (me, st) in statuses {
                let other = if *me == "alpha" { "beta" } else { "alpha" };
                let conn = peer_of(st, other).map(|p| str_of(p, "connection"));
                if conn == Some("Connected") {
                    return Err(format!("{me} still sees {other} connected"));
                }
            }
            Ok(())
        },
    );
}

/// Writes `data` at `offset` through `node`'s NBD export (it auto-promotes), then closes.
fn write_through(c: &Cluster, node: &str, offset: u64, data: &[u8]) {
    let mut nbd = Nbd::go(Conn::unix(&c.node(node).nbd), RESOURCE, false);
    nbd.write(offset, data);
    nbd.flush();
}

/// Issue 15: split brain made with two nodes (quorum off) and healed under
/// after-sb-0pri = discard-least-changes: beta, with fewer changed blocks, discards them
/// (pulls them and alpha's back from alpha), says so once at WARN in its log and in its
/// status; the connection stays, the replicas end identical with alpha's data. Then the
/// same with beta still Primary (its client open) under after-sb-1pri =
/// discard-secondary: alpha, the Secondary, discards although it changed more.
#[test]
fn split_brain_is_resolved_by_the_configured_policies() {
    const TEST: &str = "replication::split_brain_is_resolved_by_the_configured_policies";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &after_sb_least_and_secondary);
    c.wait_in_sync(SYNC_TIMEOUT);
    write_through(&c, "alpha", 0, &[0x11; 4096]);
    wait_secondary(&mut c);
    cut_alpha(&mut c);
    write_through(&c, "alpha", MIB, &[0xaa; 8192]);
    write_through(&c, "beta", 2 * MIB, &[0xbb; 4096]);
    wait_secondary(&mut c);
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE])
        .expect_success();
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let beta_disk = &c.node("beta").disk;
    assert_eq!(read_at(beta_disk, MIB, 8192), vec![0xaa; 8192]);
    assert_eq!(
        read_at(beta_disk, 2 * MIB, 4096),
        vec![0; 4096],
        "beta's discarded write"
    );
    let want =
        "split brain on volume 0 with alpha resolved by after-sb-0pri=discard-least-changes: \
                this node's 1 changed blocks (4 KiB) discarded, pulling 3 blocks from alpha";
    let log = c.node("beta").daemon.log();
    assert_eq!(log.matches(want).count(), 1, "beta's log:\n{log}");
    assert!(log.contains("WARN"), "at WARN:\n{log}");
    let alpha_log = c.node("alpha").daemon.log();
    assert!(
        alpha_log.contains("beta's 1 changed blocks (4 KiB) discarded"),
        "alpha's log:\n{alpha_log}"
    );
    let st = c.node("beta").status();
    let p = peer_of(&st, "alpha").unwrap();
    assert_eq!(str_of(p, "connection"), "Connected");
    assert!(
        str_of(p, "split_brain_resolved").contains("this node's 1 changed blocks"),
        "{st}"
    );
    let text = c.node("beta").daemon.admin(&["status"]);
    assert!(
        text.stdout.contains("last split brain:") && text.stdout.contains("discard-least-changes"),
        "{}",
        text.stdout
    );

    // One Primary: beta keeps its client (Primary) when they meet.
    cut_alpha(&mut c);
    write_through(&c, "alpha", 3 * MIB, &[0xa2; 8192]);
    wait_secondary(&mut c);
    let mut beta = Nbd::go(Conn::unix(&c.node("beta").nbd), RESOURCE, false);
    beta.write(4 * MIB, &[0xb2; 4096]);
    beta.flush();
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE])
        .expect_success();
    let alpha_said = wait_log_line(
        c.node("alpha"),
        &[&[
            "after-sb-1pri=discard-secondary",
            "this node's 2 changed blocks (8 KiB) discarded",
        ]],
        Duration::from_secs(15),
    );
    assert!(alpha_said, "alpha's log:\n{}", c.node("alpha").daemon.log());
    beta.write(5 * MIB, &[0xb3; 4096]);
    beta.flush();
    drop(beta);
    wait_secondary(&mut c);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let alpha_disk = &c.node("alpha").disk;
    assert_eq!(
        read_at(alpha_disk, 3 * MIB, 8192),
        vec![0; 8192],
        "alpha's discarded writes"
    );
    assert_eq!(read_at(alpha_disk, 4 * MIB, 4096), vec![0xb2; 4096]);
    assert_eq!(read_at(alpha_disk, 5 * MIB, 4096), vec![0xb3; 4096]);
}

/// The manual path: with the default policies the split brain stops both sides; `tandem
/// connect r0 --discard-my-data` is refused on a Primary, and on beta (Secondary) makes it
/// the victim at the next meeting, once alpha connects too.
#[test]
fn discard_my_data_resolves_a_split_brain_by_hand() {
    const TEST: &str = "replication::discard_my_data_resolves_a_split_brain_by_hand";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &no_tweak);
    c.wait_in_sync(SYNC_TIMEOUT);
    cut_alpha(&mut c);
    write_through(&c, "alpha", MIB, &[0xaa; 4096]);
    write_through(&c, "beta", 2 * MIB, &[0xbb; 8192]);
    wait_secondary(&mut c);
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE])
        .expect_success();
    c.wait_for("split brain seen", Duration::from_secs(15), |statuses| {
        for (me, st) in statuses {
            let other = if *me == "alpha" { "beta" } else { "alpha" };
            let p = peer_of(st, other).ok_or_else(|| format!("{me}: no peer {other}"))?;
            if str_of(p, "connection") != "SplitBrain" {
                return Err(format!("{me} sees {other} {}", str_of(p, "connection")));
            }
        }
        Ok(())
    });
    // Refused on a Primary.
    let mut beta = Nbd::go(Conn::unix(&c.node("beta").nbd), RESOURCE, false);
    let refused = c
        .node("beta")
        .daemon
        .admin(&["connect", RESOURCE, "alpha", "--discard-my-data"]);
    assert!(
        !refused.success() && refused.describe().contains("demote first"),
        "{}",
        refused.describe()
    );
    drop(beta);
    wait_secondary(&mut c);
    c.node("beta")
        .daemon
        .admin(&["connect", RESOURCE, "alpha", "--discard-my-data"])
        .expect_success();
    c.node("alpha")
        .daemon
        .admin(&["connect", RESOURCE, "beta"])
        .expect_success();
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    let beta_disk = &c.node("beta").disk;
    assert_eq!(read_at(beta_disk, MIB, 4096), vec![0xaa; 4096]);
    assert_eq!(
        read_at(beta_disk, 2 * MIB, 8192),
        vec![0; 8192],
        "beta's discarded writes"
    );
    let log = c.node("beta").daemon.log();
    assert!(
        log.contains(
            "resolved by --discard-my-data: this node's 2 changed blocks (8 KiB) discarded"
        ),
        "beta's log:\n{log}"
    );
    beta = Nbd::go(Conn::unix(&c.node("beta").nbd), RESOURCE, false);
    beta.write(0, &[0x33; 4096]);
    beta.flush();
}

/// CPU time (user + system, in clock ticks) a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after its ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A paced resync whose source dies leaves its target idle. The engine's wake-up for the
/// next paced request stayed set once the source was gone: in the past, so the daemon's
/// loop ticked without pause and kept a core busy until a source came back (found by the
/// simulator's failover family, seeds 1231, 2588 and 3175).
#[test]
fn a_paced_resync_whose_source_died_leaves_its_target_idle() {
    const TEST: &str = "replication::a_paced_resync_whose_source_died_leaves_its_target_idle";
    let paced = |_: &str, text: String| {
        let rates = "[net]\nresync-min-rate = \"1M\"\nresync-max-rate = \"1M\"\n";
        text.replacen("[net]\n", rates, 1)
    };
    if !require_tools(TEST, &["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &paced);
    c.wait_in_sync(SYNC_TIMEOUT);
    // Data, so the replica created empty below is not a new cluster's.
    let mut cmd = tool("qemu-io");
    cmd.args([
        "-f",
        "raw",
        &c.node("alpha").uri(),
        "-c",
        "write -P 0x5a 0 16M",
    ]);
    let r = run(&mut cmd, Duration::from_secs(60));
    assert!(r.success(), "write through alpha: {}", r.describe());
    c.wait_in_sync(SYNC_TIMEOUT);
    let beta = c.node_mut("beta");
    beta.daemon.stop(Duration::from_secs(10));
    std::fs::remove_file(&beta.disk).unwrap();
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    // Synced in full at 1 MiB/s: it takes minutes, and each request waits for the budget.
    assert!(
        wait_log_line(
            c.node("beta"),
            &[&["synced in full"]],
            Duration::from_secs(5)
        ),
        "beta's log does not say it is synced in full:\n{}",
        c.node("beta").daemon.log()
    );
    thread::sleep(Duration::from_millis(1500));
    let st = c.node("beta").status();
    let disk = str_of(&arr_of(&st, "volumes")[0], "disk").to_string();
    assert_eq!(
        disk,
        "Inconsistent",
        "beta is not being synced: {st:?}\n{}",
        c.node("beta").daemon.log()
    );
    c.node_mut("alpha").daemon.kill9();
    let beta = c.node("beta");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let st = beta.status();
            peer_of(&st, "alpha").is_some_and(|p| str_of(p, "connection") != "Connected")
        }),
        "beta never noticed alpha's death: {:?}\n{}",
        beta.status(),
        beta.daemon.log()
    );
    let pid = beta.daemon.pid().expect("beta runs");
    let hz = 100; // USER_HZ on Linux
    let before = cpu_ticks(pid);
    let t = Instant::now();
    thread::sleep(Duration::from_secs(3));
    let used = (cpu_ticks(pid) - before) as f64 / hz as f64;
    let share = used / t.elapsed().as_secs_f64();
    eprintln!(
        "{TEST}: beta used {used:.2} s of CPU in 3 s with no sync source ({:.0} %)",
        share * 100.0
    );
    assert!(
        share < 0.3,
        "beta kept {:.0} % of a core busy while its resync had no source",
        share * 100.0
    );
    let st = beta.status();
    let disk = str_of(&arr_of(&st, "volumes")[0], "disk").to_string();
    assert_ne!(disk, "UpToDate", "beta cannot be synced without alpha");
    c.stop_all();
}
