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
