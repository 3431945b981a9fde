//! A stalled Secondary is a busy peer, not a dead one (issue 15, items 4 and 5): with the
//! default timings (ping every 1 s of silence, 500 ms for its answer, 6 s for a request),
//! beta stopped for 3 s (SIGSTOP) while gamma, the diskless Primary, writes is kept by
//! every node — gamma owes its writes an answer from beta and judges it by the request
//! timeout, alpha (a Secondary like it) judges their link by it too — and the writes go on
//! once it runs again. Stopped for 10 s, it is dropped by the request timeout (gamma's
//! write to it times out), gamma's writes go on to alpha alone, and back, beta reconnects
//! and resyncs: the replicas end byte for byte identical.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;

/// SIGSTOP / SIGCONT to a daemon this test started; a stopped one runs again when this is
/// dropped (a failing test must not leave it stopped).
struct Stopped(i32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: signalling a child this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Stopped(pid as i32)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above; harmless if it already runs or is gone.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Writes through gamma, one 4 KiB block at a time over the first 16 MiB, each block
/// holding its round number, until told to stop; counts the writes completed.
struct Writer {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Writer {
    fn start(gamma: &Node) -> Writer {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut nbd = Nbd::go(Conn::unix(&gamma.nbd), RESOURCE, true);
        let (d, s) = (done.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let blocks = 16 * MIB / BLOCK;
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                let data = vec![(i / blocks) as u8 + 1; BLOCK as usize];
                nbd.write((i % blocks) * BLOCK, &data);
                i += 1;
                d.fetch_add(1, Ordering::SeqCst);
                if i.is_multiple_of(64) {
                    nbd.flush();
                }
            }
        });
        Writer {
            done,
            stop,
            thread: Some(thread),
        }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }

    /// Until `n` more writes than now completed, within `timeout`.
    fn progresses(&self, n: u64, timeout: Duration) -> bool {
        let from = self.done();
        wait_until(timeout, || self.done() >= from + n)
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.take().unwrap();
        assert!(
            t.join().is_ok(),
            "the writer failed (a write or flush was refused)"
        );
    }
}

/// How `me` sees `peer`'s connection.
fn connection(c: &Cluster, me: &str, peer: &str) -> String {
    let st = c.node(me).status();
    let p = peer_of(&st, peer).unwrap_or_else(|| panic!("{me}'s status lists no peer {peer}"));
    str_of(p, "connection").to_string()
}

/// Lines of every daemon's log that say a peer connection dropped.
fn drops(c: &Cluster) -> Vec<String> {
    let mut found = Vec::new();
    for n in &c.nodes {
        for line in n.daemon.log().lines() {
            let l = line.to_lowercase();
            if l.contains("dropping node")
                || l.contains("connection failed")
                || (l.contains("connection to node") && l.contains("lost"))
            {
                found.push(format!("{}: {line}", n.name));
            }
        }
    }
    found
}

/// The drops logged since `before` (two nodes dialing each other at start may log one when
/// the connection the lower node id dialed replaces the other: not a drop of interest).
fn drops_since(c: &Cluster, before: &[String]) -> Vec<String> {
    let mut found = drops(c);
    found.retain(|d| !before.contains(d));
    found
}

#[test]
fn a_secondary_stalled_3s_is_kept_and_one_stalled_10s_is_dropped_and_resyncs() {
    const TEST: &str =
        "stall::a_secondary_stalled_3s_is_kept_and_one_stalled_10s_is_dropped_and_resyncs";
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            size: SIZE,
            ..Setup::new("C", &[ALPHA, BETA, GAMMA])
        },
    );
    c.wait_connected();
    let at_start = drops(&c);
    let beta_pid = c.node("beta").daemon.pid().expect("beta runs");
    let writer = Writer::start(c.node("gamma"));
    assert!(
        writer.progresses(200, Duration::from_secs(10)),
        "no writes through gamma"
    );

    // 3 s: less than the request timeout, six ping timeouts.
    let stopped = Stopped::stop(beta_pid);
    let t0 = Instant::now();
    let before = writer.done();
    while t0.elapsed() < Duration::from_secs(3) {
        for me in ["alpha", "gamma"] {
            let conn = connection(&c, me, "beta");
            assert_eq!(
                conn,
                "Connected",
                "{me} lost the stalled beta: {:?}",
                drops_since(&c, &at_start)
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
    // Protocol C: gamma's write waits for beta.
    assert!(
        writer.done() <= before + 1,
        "writes completed while beta was stopped"
    );
    drop(stopped);
    assert!(
        writer.progresses(200, Duration::from_secs(5)),
        "writes did not go on after beta ran again"
    );
    thread::sleep(Duration::from_millis(1500));
    assert!(
        drops_since(&c, &at_start).is_empty(),
        "a connection dropped: {:?}",
        drops_since(&c, &at_start)
    );
    for (me, peer) in [
        ("alpha", "beta"),
        ("gamma", "beta"),
        ("beta", "alpha"),
        ("beta", "gamma"),
    ] {
        assert_eq!(connection(&c, me, peer), "Connected", "{me} -> {peer}");
    }

    // 10 s: gamma drops beta once its write is 6 s old, and writes on to alpha alone.
    let stopped = Stopped::stop(beta_pid);
    let t0 = Instant::now();
    let dropped = wait_until(Duration::from_secs(9), || {
        connection(&c, "gamma", "beta") != "Connected"
    });
    let after = t0.elapsed();
    assert!(dropped, "gamma kept a beta stopped for 9 s");
    assert!(
        after >= Duration::from_secs(5),
        "gamma dropped the stalled beta after {after:?}, before the request timeout"
    );
    assert!(
        writer.progresses(200, Duration::from_secs(3)),
        "writes did not go on without beta"
    );
    // By the request timeout: a write it owed (or, stopped while it owed only a flush's
    // barrier, its ping unanswered that long).
    let log = c.node("gamma").daemon.log();
    assert!(
        log.lines().any(|l| l.contains("dropping node beta")
            && (l.contains("a replicated write was not acknowledged within 6000 ms")
                || l.contains("silent for 6000 ms"))),
        "gamma's log does not say the request timeout dropped beta:\n{log}"
    );
    thread::sleep(Duration::from_secs(10).saturating_sub(t0.elapsed()));
    drop(stopped);
    assert!(
        writer.progresses(200, Duration::from_secs(5)),
        "writes stopped after beta returned"
    );
    writer.finish();
    c.wait_in_sync(SYNC_TIMEOUT);
    c.assert_replicas_identical();
    eprintln!("{TEST}: drops: {:#?}", drops(&c));
    c.stop_all();
}
