//! `tandem events` against real daemons: the objects as they exist, the end marker, then a
//! line for each change as it happens (a peer killed and back), for several watchers at
//! once; `--now` stops after the dump, `--json` gives one JSON object per line.

mod common;

use common::cluster::{no_tweak, Cluster, ALPHA, BETA, READY_TIMEOUT};
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// `tandem events` on `node`'s control socket, its lines sent to the receiver as they come.
fn watch(c: &Cluster, node: &str, args: &[&str]) -> (Child, Receiver<String>) {
    let mut child = Command::new(tandem_bin())
        .arg("events")
        .args(args)
        .arg("--control")
        .arg(&c.node(node).daemon.control)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tandem events starts");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Lines until one contains `needle` (returned), or a panic naming what came.
#[track_caller]
fn expect_line(rx: &Receiver<String>, needle: &str, seen: &mut Vec<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push(line.clone());
                if line.contains(needle) {
                    return line;
                }
            }
            Err(_) => break,
        }
    }
    panic!(
        "no line with {needle:?}; the stream said:\n{}",
        seen.join("\n")
    );
}

#[test]
fn events_show_what_exists_then_each_change_as_it_happens() {
    const TEST: &str = "events::events_show_what_exists_then_each_change_as_it_happens";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &no_tweak);
    c.wait_connected();
    let (mut w1, rx1) = watch(&c, "alpha", &[]);
    let (mut w2, rx2) = watch(&c, "alpha", &["--json"]);
    let mut seen1 = Vec::new();
    let mut seen2 = Vec::new();
    expect_line(&rx1, "exists resource name:r0 role:Secondary", &mut seen1);
    expect_line(
        &rx1,
        "exists device name:r0 volume:0 disk:UpToDate",
        &mut seen1,
    );
    expect_line(
        &rx1,
        "exists connection name:r0 peer-node-id:1 conn-name:beta connection:Connected",
        &mut seen1,
    );
    expect_line(
        &rx1,
        "exists peer-device name:r0 peer-node-id:1 conn-name:beta volume:0 replication:Established peer-disk:UpToDate",
        &mut seen1,
    );
    assert_eq!(expect_line(&rx1, "exists -", &mut seen1), "exists -");
    let end = expect_line(&rx2, "\"kind\":\"exists\"}", &mut seen2);
    let v: serde_json::Value = serde_json::from_str(&end).unwrap();
    assert!(v.get("object").is_none(), "{end}");
    // Beta killed: alpha's watchers see the connection go, and its peer device go off.
    c.node_mut("beta").daemon.kill9();
    expect_line(
        &rx1,
        "change connection name:r0 peer-node-id:1 conn-name:beta connection:Connecting",
        &mut seen1,
    );
    expect_line(
        &rx1,
        "change peer-device name:r0 peer-node-id:1 conn-name:beta volume:0 replication:Off peer-disk:DUnknown",
        &mut seen1,
    );
    let line = expect_line(&rx2, "\"Connecting\"", &mut seen2);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["kind"], "change");
    assert_eq!(v["object"], "connection");
    // Back: connected again, and its peer device replicating again.
    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    expect_line(
        &rx1,
        "change connection name:r0 peer-node-id:1 conn-name:beta connection:Connected",
        &mut seen1,
    );
    expect_line(
        &rx1,
        "change peer-device name:r0 peer-node-id:1 conn-name:beta volume:0 replication:Established peer-disk:UpToDate",
        &mut seen1,
    );
    // `--now`: the dump and its end, then it exits.
    let now = {
        let mut cmd = Command::new(tandem_bin());
        cmd.args(["events", "--now", "--control"])
            .arg(&c.node("alpha").daemon.control);
        run(&mut cmd, Duration::from_secs(20))
    };
    now.expect_success();
    assert_eq!(
        now.stdout.lines().last(),
        Some("exists -"),
        "{}",
        now.stdout
    );
    assert!(now
        .stdout
        .contains("exists resource name:r0 role:Secondary"));
    let _ = w1.kill();
    let _ = w2.kill();
    let _ = w1.wait();
    let _ = w2.wait();
    // The watchers gone, a status is answered as ever (their slots are not reused as
    // watchers).
    c.node("alpha").daemon.admin(&["status"]).expect_success();
}

/// `2026-11-27T04:00:00.123456+00:00`: drbdsetup events2's `--timestamps` (local time,
/// microseconds, the UTC offset).
#[track_caller]
fn assert_timestamp(t: &str, line: &str) {
    let shape = "dddd-dd-ddTdd:dd:dd.dddddd+dd:dd";
    let ok = t.len() == shape.len()
        && t.chars().zip(shape.chars()).all(|(c, s)| match s {
            'd' => c.is_ascii_digit(),
            '+' => c == '+' || c == '-',
            _ => c == s,
        });
    assert!(ok, "{t:?} is not a timestamp like {shape}: {line}");
}

/// The line's statistic `key` (`key:value`), if it has it.
fn stat<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix(':'))
}

/// `--timestamps` puts the arrival time before each line (a `"time"` field first in JSON);
/// `--statistics` adds the counters status has (device size and writes in flight, a
/// connection's unacknowledged writes, a peer device's out-of-sync) to every line, and a
/// `change` line when only they changed (writes while the peer is away). A watcher
/// without them sees the lines as before: no time, no counters, no line for counters.
#[test]
fn events_with_timestamps_and_statistics() {
    const TEST: &str = "events::events_with_timestamps_and_statistics";
    let mut c = Cluster::start(TEST, "C", &[ALPHA, BETA], &no_tweak);
    c.wait_connected();
    let (mut w1, rx1) = watch(&c, "alpha", &["--timestamps", "--statistics"]);
    let (mut w2, rx2) = watch(&c, "alpha", &["--json", "--timestamps", "--statistics"]);
    let (mut w3, rx3) = watch(&c, "alpha", &[]);
    let (mut seen1, mut seen2, mut seen3) = (Vec::new(), Vec::new(), Vec::new());
    let size_kib = (c.sizes[0] / 1024).to_string();

    let device = expect_line(
        &rx1,
        " exists device name:r0 volume:0 disk:UpToDate",
        &mut seen1,
    );
    let (time, rest) = device.split_once(' ').unwrap();
    assert_timestamp(time, &device);
    assert_eq!(stat(rest, "size"), Some(size_kib.as_str()), "{device}");
    assert_eq!(stat(rest, "upper-pending"), Some("0"), "{device}");
    let conn = expect_line(&rx1, " exists connection name:r0", &mut seen1);
    assert_eq!(stat(&conn, "pending"), Some("0"), "{conn}");
    let pd = expect_line(&rx1, " exists peer-device name:r0", &mut seen1);
    assert!(
        pd.ends_with("replication:Established peer-disk:UpToDate out-of-sync:0"),
        "{pd}"
    );
    let end = expect_line(&rx1, "exists -", &mut seen1);
    let (time, rest) = end.split_once(' ').unwrap();
    assert_timestamp(time, &end);
    assert_eq!(rest, "exists -");

    let device = expect_line(&rx2, "\"object\":\"device\"", &mut seen2);
    assert!(device.starts_with("{\"time\":\""), "{device}");
    let v: serde_json::Value = serde_json::from_str(&device).unwrap();
    assert_timestamp(v["time"].as_str().unwrap(), &device);
    assert_eq!(v["kind"], "exists");
    assert_eq!(v["statistics"][0], serde_json::json!(["size", size_kib]));
    let end = expect_line(&rx2, "\"kind\":\"exists\"}", &mut seen2);
    let v: serde_json::Value = serde_json::from_str(&end).unwrap();
    assert_timestamp(v["time"].as_str().unwrap(), &end);

    expect_line(&rx3, "exists -", &mut seen3);

    // Beta away, 64 KiB written on alpha: its peer device for beta counts them out of
    // sync, a change of counters alone.
    c.node_mut("beta").daemon.kill9();
    expect_line(&rx1, "connection:Connecting", &mut seen1);
    let data = random_bytes(7, 64 * 1024);
    let mut nbd = Nbd::go(Conn::unix(&c.node("alpha").nbd), "r0", false);
    nbd.write(0, &data);
    nbd.flush();
    drop(nbd);
    let change = expect_line(&rx1, "out-of-sync:64", &mut seen1);
    assert!(
        change.contains(" change peer-device name:r0 peer-node-id:1 conn-name:beta volume:0 replication:Off peer-disk:DUnknown out-of-sync:64"),
        "{change}"
    );
    let change = expect_line(&rx2, "[\"out-of-sync\",\"64\"]", &mut seen2);
    let v: serde_json::Value = serde_json::from_str(&change).unwrap();
    assert_eq!(v["kind"], "change");
    // Back: in sync again.
    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    expect_line(
        &rx1,
        "replication:Established peer-disk:UpToDate out-of-sync:0",
        &mut seen1,
    );
    expect_line(
        &rx3,
        "replication:Established peer-disk:UpToDate",
        &mut seen3,
    );
    // The plain watcher saw the states change, never a time or a counter.
    for l in &seen3 {
        assert!(l.starts_with("exists ") || l.starts_with("change "), "{l}");
        for key in ["size", "pending", "upper-pending", "out-of-sync"] {
            assert!(
                stat(l, key).is_none(),
                "{key} in a plain watcher's line: {l}"
            );
        }
    }
    assert!(seen3.iter().any(|l| l.contains("connection:Connecting")));
    for w in [&mut w1, &mut w2, &mut w3] {
        let _ = w.kill();
        let _ = w.wait();
    }
}
