//! One node with a thousand resources, as an operator with many volumes on a pair of nodes
//! runs it, under the common soft open-file limit of 1024: the node raises it to the hard
//! limit (else it stops near 250 resources with `Too many open files`), and `status` warns
//! when the descriptors in use come near that. The control socket answers every `status`
//! whole: its answer (~1 KB a resource) is larger than the socket's buffer, and the rest
//! used to wait for the client to speak again, which it never did (every other `status`
//! failed after 10 s with `Resource temporarily unavailable`).

mod common;

use common::cluster::SECRET;
use common::prom::{parse_metrics, prometheus_python, scrape};
use common::*;
use std::fmt::Write as _;
use std::time::Duration;

const RESOURCES: usize = 1000;

/// Hard open-file limits: one with room (five descriptors a resource at the peak, when
/// every resource dials its peer at once, four once settled: the peak stays under the 80 %
/// at which `status` warns), and one that leaves the settled node near it (about 4,000 of
/// 4,400). A limit of five a resource was no room: a fresh-clone run under load caught the
/// peak, 5,016 of 5,400, and `status` rightly warned.
const ROOMY: u64 = 7 * RESOURCES as u64 + 400;
const TIGHT: u64 = 4 * RESOURCES as u64 + 400;

/// Sets this process's open-file limits (the node inherits them): a soft limit of 1024, as
/// on many machines, which the node must raise itself, and the hard limit `hard` (lower
/// than the one before: it cannot be raised again). False if it is below `hard` already.
fn limit_nofile(hard: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_max < hard {
            return false;
        }
        lim.rlim_cur = 1024;
        lim.rlim_max = hard;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
    }
}

/// Alpha's metrics endpoint, set in the first resource's file only.
const METRICS: &str = "127.0.1.1:39942";

/// Resource `i`: a 1 MiB volume on alpha; beta, its peer, never starts (alpha dials it
/// every few seconds).
fn resource(dir: &TestDir, i: usize) -> String {
    let port = 40000 + i;
    let mut text = String::new();
    write!(
        text,
        "[resource]\nname = \"r{i}\"\nprotocol = \"C\"\nshared-secret = \"{SECRET}\"\n\n\
         [net]\nconnect-interval = \"1s\"\nmax-connect-interval = \"5s\"\n\n\
         [[volume]]\nnumber = 0\nsize = \"1M\"\n"
    )
    .unwrap();
    for (id, name, octet) in [(0, "alpha", 1), (1, "beta", 2)] {
        let disk = dir.join(format!("{name}-r{i}.img"));
        let nbd = dir.join(format!("{name}-r{i}.sock"));
        write!(
            text,
            "\n[[node]]\nname = \"{name}\"\nnode-id = {id}\naddress = \"127.0.1.{octet}:{port}\"\n{}\
             [[node.volume]]\nnumber = 0\ndisk = \"{}\"\nnbd = [\"unix:{}\"]\n",
            if i == 0 && name == "alpha" {
                format!("metrics = \"{METRICS}\"\n")
            } else {
                String::new()
            },
            disk.display(),
            nbd.display()
        )
        .unwrap();
    }
    text
}

/// Latencies of 4 KiB writes through r0's NBD socket for 2 s, sorted; with `scraping`,
/// while another thread scrapes the metrics of every resource 20 times a second (a
/// Prometheus server scrapes every 15 s by default).
fn write_latencies(dir: &TestDir, scraping: bool) -> Vec<Duration> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicUsize::new(0));
    let scraper = scraping.then(|| {
        let (stop, scrapes) = (stop.clone(), scrapes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                scrape(METRICS);
                scrapes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    });
    let mut nbd = Nbd::go(Conn::unix(&dir.join("alpha-r0.sock")), "r0", true);
    let block = random_bytes(1, 4096);
    let mut lat = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < end {
        let t = std::time::Instant::now();
        nbd.write(0, &block);
        lat.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = scraper {
        s.join().unwrap();
        assert!(scrapes.load(Ordering::Relaxed) > 0, "no scrape finished");
    }
    lat.sort();
    lat
}

#[test]
fn status_of_a_thousand_resources_is_answered_whole_every_time() {
    const TEST: &str = "scale::status_of_a_thousand_resources_is_answered_whole_every_time";
    if !limit_nofile(ROOMY) {
        return skip(
            TEST,
            "the open-file hard limit is below what 1000 resources need",
        );
    }
    let dir = TestDir::new(TEST);
    let cfg = dir.join("cfg");
    std::fs::create_dir_all(&cfg).unwrap();
    for i in 0..RESOURCES {
        std::fs::write(cfg.join(format!("r{i}.toml")), resource(&dir, i)).unwrap();
    }
    let mut alpha = NodeDaemon::start("alpha", &cfg, &dir.join("ctl"), &dir.join("node.log"));
    alpha.wait_ready(Duration::from_secs(60));
    for round in 0..5 {
        let text = alpha.admin(&["status"]);
        text.expect_success();
        assert_eq!(
            text.stdout.matches("role:").count(),
            RESOURCES,
            "round {round}: status names every resource"
        );
        assert!(!text.stdout.contains("warning:"), "{}", text.stdout);
        let json = alpha.admin(&["status", "--json"]);
        json.expect_success();
        let v: serde_json::Value = serde_json::from_str(&json.stdout)
            .unwrap_or_else(|e| panic!("round {round}: status --json: {e}"));
        eprintln!(
            "{TEST}: round {round}: status {} bytes, status --json {} bytes",
            text.stdout.len(),
            json.stdout.len()
        );
        let resources = v.as_array().map(Vec::len);
        assert_eq!(resources, Some(RESOURCES), "round {round}: status --json");
    }
    // The events stream's dump: four objects a resource (resource, device, connection,
    // peer device), then the end marker.
    let events = {
        let mut cmd = std::process::Command::new(tandem_bin());
        cmd.args(["events", "--now", "--control"])
            .arg(&alpha.control);
        run(&mut cmd, Duration::from_secs(30))
    };
    events.expect_success();
    assert_eq!(events.stdout.lines().count(), 4 * RESOURCES + 1);
    assert_eq!(events.stdout.lines().last(), Some("exists -"));
    // The metrics of 1000 resources: the Prometheus parser reads them whole, one role
    // at 1 per resource (and one sample per role each); each scrape reports how long the
    // one before took to build.
    if let Some(python) = prometheus_python(TEST) {
        for round in 0..3 {
            let began = std::time::Instant::now();
            let text = scrape(METRICS);
            let took = began.elapsed();
            let m = parse_metrics(&python, &text);
            let roles = m.find("drbd_resource_role", &[]);
            assert_eq!(roles.len(), 3 * RESOURCES, "round {round}");
            assert_eq!(roles.iter().filter(|&&v| v == 1.0).count(), RESOURCES);
            let secondary = m.find("drbd_resource_role", &[("drbd_resource_role", "Secondary")]);
            assert_eq!(secondary, vec![1.0; RESOURCES], "round {round}");
            assert_eq!(m.value("drbd_resource_resources", &[]), RESOURCES as f64);
            let built = m.value("tandem_metrics_build_seconds", &[]);
            eprintln!(
                "{TEST}: round {round}: metrics of {RESOURCES} resources, {} bytes, scraped in {took:?}; the previous scrape took {:.1} ms of the loop's CPU",
                text.len(),
                built * 1000.0
            );
        }
    }
    // The status page's data, built the same way: every resource, as status --json has it.
    let began = std::time::Instant::now();
    let (code, head, json) = common::prom::http(
        METRICS,
        b"GET /status.json HTTP/1.1\r\n\r\n",
        Duration::from_secs(20),
    );
    let took = began.elapsed();
    assert_eq!(code, 200, "{head}");
    let v: serde_json::Value = serde_json::from_slice(&json).expect("status.json");
    assert_eq!(v["resources"].as_array().map(Vec::len), Some(RESOURCES));
    eprintln!(
        "{TEST}: /status.json of {RESOURCES} resources: {} bytes in {took:?}",
        json.len()
    );
    // What scraping costs the application: 4 KiB writes to r0 for a while without
    // scrapes, then while another thread scrapes without pause.
    // (alpha's replica of r0 is new, its peer's unknown: it is made the one to trust.)
    alpha.admin(&["primary", "r0", "--force"]).expect_success();
    let idle = write_latencies(&dir, false);
    let scraped = write_latencies(&dir, true);
    for (what, l) in [("no scrape", &idle), ("scraping", &scraped)] {
        eprintln!(
            "{TEST}: 4 KiB writes to r0, {what}: {} writes, median {:?}, p99 {:?}, max {:?}",
            l.len(),
            l[l.len() / 2],
            l[l.len() * 99 / 100],
            l[l.len() - 1]
        );
    }
    let log = alpha.log();
    assert!(
        log.contains(&format!(
            "open-file limit 1024 raised to the hard limit {ROOMY}"
        )),
        "{log}"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    alpha.assert_running();
    // Under a hard limit the settled node comes near, `status` says so.
    alpha.stop(Duration::from_secs(60));
    assert!(limit_nofile(TIGHT));
    alpha.restart();
    alpha.wait_ready(Duration::from_secs(60));
    let text = alpha.admin(&["status"]);
    text.expect_success();
    assert!(
        text.stdout
            .contains(&format!("open files of its limit {TIGHT}")),
        "status warns that the limit is near:\n{}",
        text.stdout.lines().last().unwrap_or_default()
    );
}
