//! The metrics endpoint of real daemons, scraped over real TCP sockets and read by the
//! Prometheus client's own text parser: drbd-reactor's names and labels, values that agree
//! with `tandem status --json` and with the bytes an NBD client wrote, tandem's latency
//! histograms; and an endpoint that answers garbage with errors and goes on serving.

mod common;

use common::cluster::{Cluster, Setup, ALPHA, BETA, RESOURCE};
use common::prom::{http, parse_metrics, prometheus_python, scrape, Parsed};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Every node's metrics on its replication IP, port + 10000, set in the resource file's
/// `[[node]]` tables.
fn with_metrics(_node: &str, text: String) -> String {
    text.lines()
        .map(|l| match metrics_of_line(l) {
            Some(m) => format!("{l}\nmetrics = \"{m}\""),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `address = "IP:PORT"` → the metrics address that goes with it.
fn metrics_of_line(line: &str) -> Option<String> {
    let a = line.strip_prefix("address = \"")?.strip_suffix('"')?;
    let (ip, port) = a.rsplit_once(':')?;
    Some(format!("{ip}:{}", port.parse::<u32>().ok()? + 10000))
}

fn metrics_addr(c: &Cluster, node: &str) -> String {
    metrics_of_line(&format!("address = \"{}\"", c.node(node).address)).unwrap()
}

/// `s`'s value for key `k` as a string (status JSON).
fn s<'a>(v: &'a Json, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// The scrape agrees with the node's `tandem status --json` on every state it shows, one
/// sample per state with 1 on the state it is in, as drbd-reactor's "enums".
#[track_caller]
fn check_against_status(node: &str, m: &Parsed, st: &Json) {
    let name = RESOURCE;
    let role = s(st, "role");
    for r in ["Primary", "Secondary", "Unknown"] {
        let want = f64::from(u8::from(r == role));
        let got = m.value(
            "drbd_resource_role",
            &[("name", name), ("drbd_resource_role", r)],
        );
        assert_eq!(
            got, want,
            "{node}: drbd_resource_role {r} (status says {role})"
        );
    }
    for v in st["volumes"].as_array().unwrap() {
        let vol = v["volume"].to_string();
        let dev = [("name", name), ("volume", vol.as_str())];
        let disk = s(v, "disk");
        let with = |state: &str| {
            let mut l = dev.to_vec();
            l.push(("drbd_device_state", state));
            m.value("drbd_device_state", &l)
        };
        assert_eq!(with(disk), 1.0, "{node}: drbd_device_state {disk}");
        let ones = m
            .find("drbd_device_state", &dev)
            .iter()
            .filter(|&&x| x == 1.0)
            .count();
        assert_eq!(ones, 1, "{node}: one device state at 1");
        assert_eq!(
            m.value("drbd_device_size_bytes", &dev),
            v["size"].as_f64().unwrap(),
            "{node}: size"
        );
        assert_eq!(
            m.value("drbd_device_quorum", &dev),
            1.0,
            "{node}: quorum off = has it"
        );
    }
    for p in st["peers"].as_array().unwrap() {
        let id = p["node_id"].to_string();
        let conn = [
            ("name", name),
            ("conn_name", s(p, "name")),
            ("peer_node_id", id.as_str()),
        ];
        let state = s(p, "connection");
        let mut l = conn.to_vec();
        l.push(("drbd_connection_state", state));
        assert_eq!(
            m.value("drbd_connection_state", &l),
            1.0,
            "{node}: drbd_connection_state {state}"
        );
        for pv in p["volumes"].as_array().unwrap() {
            let vol = pv["volume"].to_string();
            let mut pd = conn.to_vec();
            pd.push(("volume", vol.as_str()));
            assert_eq!(
                m.value("drbd_peerdevice_outofsync_bytes", &pd),
                pv["out_of_sync_kib"].as_f64().unwrap() * 1024.0,
                "{node}: out of sync"
            );
            let repl = s(pv, "replication");
            pd.push(("tandem_peerdevice_replication_state", repl));
            assert_eq!(
                m.value("tandem_peerdevice_replication_state", &pd),
                1.0,
                "{node}: replication {repl}"
            );
        }
    }
}

#[test]
fn metrics_agree_with_status_and_parse_as_prometheus_text() {
    const TEST: &str = "metrics::metrics_agree_with_status_and_parse_as_prometheus_text";
    let Some(python) = prometheus_python(TEST) else {
        return;
    };
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            tweak: &with_metrics,
            size: 16 * MIB,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    c.wait_connected();
    c.wait_in_sync(Duration::from_secs(60));
    let (a, b) = (metrics_addr(&c, "alpha"), metrics_addr(&c, "beta"));

    // An application writes and reads through alpha (its client makes it Primary).
    let mut nbd = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, true);
    const WRITES: u64 = 48;
    const LEN: u64 = 64 << 10;
    for i in 0..WRITES {
        nbd.write(i * LEN, &random_bytes(i, LEN as usize));
    }
    nbd.flush();
    let mut read = 0;
    for i in 0..8 {
        read += nbd.read(i * LEN, LEN as u32).len() as u64;
    }
    let written = WRITES * LEN;

    let alpha = parse_metrics(&python, &scrape(&a));
    let beta = parse_metrics(&python, &scrape(&b));
    for (node, m) in [("alpha", &alpha), ("beta", &beta)] {
        let st = c.node(node).status();
        check_against_status(node, m, &st);
        for (family, kind) in [
            ("drbd_resource_role", "gauge"),
            ("drbd_device_written_bytes", "counter"),
            ("drbd_peerdevice_sent_bytes", "counter"),
            ("tandem_io_duration_seconds", "histogram"),
            ("tandem_replication_round_trip_seconds", "histogram"),
        ] {
            assert_eq!(
                m.families.get(family).map(String::as_str),
                Some(kind),
                "{node}: {family}"
            );
        }
        assert_eq!(m.value("drbdreactor_up", &[]), 1.0);
        assert_eq!(m.value("drbd_resource_resources", &[]), 1.0);
        let dev = [("name", RESOURCE), ("volume", "0")];
        let on_disk = m.value("drbd_device_written_bytes_total", &dev);
        assert!(
            on_disk >= written as f64,
            "{node}: {on_disk} written on disk, {written} by the client"
        );
    }
    assert_eq!(s(&c.node("alpha").status(), "role"), "Primary");
    let to_beta = [("name", RESOURCE), ("conn_name", "beta"), ("volume", "0")];
    let from_alpha = [("name", RESOURCE), ("conn_name", "alpha"), ("volume", "0")];
    // drbd-reactor's counters without `_total`: the Python parser names their samples with
    // it (Prometheus itself keeps the name as written).
    let sent = alpha.value("drbd_peerdevice_sent_bytes_total", &to_beta);
    let received = beta.value("drbd_peerdevice_received_bytes_total", &from_alpha);
    assert!(
        sent >= written as f64,
        "alpha sent {sent} to beta, {written} written"
    );
    assert!(
        received >= written as f64,
        "beta received {received}, {written} written"
    );
    let local_read = alpha.value("drbd_device_read_bytes_total", &[("name", RESOURCE)]);
    assert!(
        local_read >= read as f64,
        "alpha read {local_read} from disk, {read} asked"
    );
    // The application's latencies: every request counted, cumulative buckets ending in +Inf.
    let count = |m: &Parsed, op: &str| m.value("tandem_io_duration_seconds_count", &[("op", op)]);
    assert!(count(&alpha, "write") >= WRITES as f64, "writes counted");
    assert!(count(&alpha, "flush") >= 1.0, "flush counted");
    assert!(count(&alpha, "read") >= 8.0, "reads counted");
    let buckets = alpha.find("tandem_io_duration_seconds_bucket", &[("op", "write")]);
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "cumulative: {buckets:?}"
    );
    assert_eq!(buckets.last(), Some(&count(&alpha, "write")));
    assert_eq!(
        alpha.value(
            "tandem_resource_requests_total",
            &[("name", RESOURCE), ("op", "write")]
        ),
        count(&alpha, "write")
    );
    let rtt = alpha.value(
        "tandem_replication_round_trip_seconds_count",
        &[("conn_name", "beta")],
    );
    assert!(
        rtt >= WRITES as f64,
        "every replicated write's round trip: {rtt}"
    );
    drop(nbd);

    // beta gone: alpha's scrape says so, as its status does.
    c.node_mut("beta").daemon.kill9();
    c.wait_for("beta lost", Duration::from_secs(20), |sts| {
        let p = &sts[0].1["peers"][0];
        match s(p, "connection") {
            "Connected" => Err("still connected".into()),
            _ => Ok(()),
        }
    });
    let m = parse_metrics(&python, &scrape(&a));
    check_against_status("alpha", &m, &c.node("alpha").status());
    let conn = [
        ("name", RESOURCE),
        ("conn_name", "beta"),
        ("drbd_connection_state", "Connected"),
    ];
    assert_eq!(m.value("drbd_connection_state", &conn), 0.0);
    c.node_mut("alpha").daemon.assert_running();
}

/// Bad requests get an error status and a closed connection; the node goes on serving
/// metrics and I/O. The address comes from `tandem node --metrics` here.
#[test]
fn bad_http_requests_get_errors_and_the_endpoint_keeps_serving() {
    const TEST: &str = "metrics::bad_http_requests_get_errors_and_the_endpoint_keeps_serving";
    let python = prometheus_python(TEST);
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            size: 16 * MIB,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    let addr = metrics_addr(&c, "alpha");
    let alpha = &mut c.node_mut("alpha").daemon;
    alpha.stop(Duration::from_secs(20));
    alpha.extra_args = vec!["--metrics".into(), addr.clone()];
    alpha.restart();
    alpha.wait_ready(Duration::from_secs(20));
    c.wait_connected();
    let t = Duration::from_secs(10);
    let huge = vec![b'A'; 100 << 10];
    for (request, want) in [
        (&b"\x00\x01\x02 garbage \xff\r\n\r\n"[..], 400),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /nothing-here HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /metrics/../etc HTTP/1.1\r\n\r\n", 404),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
        (&huge[..], 431),
    ] {
        let (status, head, _) = http(&addr, request, t);
        let shown = String::from_utf8_lossy(&request[..request.len().min(40)]).into_owned();
        assert_eq!(status, want, "{shown:?}: {head}");
    }
    // A client that shuts its side once its request is sent still gets the answer.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    half.shutdown(std::net::Shutdown::Write).unwrap();
    half.set_read_timeout(Some(t)).unwrap();
    let mut answer = String::new();
    half.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("\ndrbdreactor_up 1\n"), "{answer}");
    // HEAD: the head alone.
    let (status, head, body) = http(&addr, b"HEAD /metrics HTTP/1.0\r\n\r\n", t);
    assert_eq!((status, body.len()), (200, 0), "{head}");
    // One that connects and closes without a word, one that stays silent: neither holds
    // the endpoint up, and the silent one is closed after 10 s.
    drop(TcpStream::connect(&addr).unwrap());
    let mut silent = TcpStream::connect(&addr).unwrap();
    let mut partial = TcpStream::connect(&addr).unwrap();
    partial.write_all(b"GET /metr").unwrap();
    let text = scrape(&addr);
    assert!(text.contains("drbd_resource_role{name=\"r0\""), "{text}");
    let began = Instant::now();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(silent.read(&mut buf), Ok(0)),
        "the silent client is closed"
    );
    let waited = began.elapsed();
    assert!(waited < Duration::from_secs(12), "closed after {waited:?}");
    partial
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        matches!(partial.read(&mut buf), Ok(0)),
        "the partial request is closed"
    );
    // Still serving: metrics that parse, and I/O.
    if let Some(py) = &python {
        parse_metrics(py, &scrape(&addr));
    }
    let mut nbd = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, true);
    nbd.write(0, &random_bytes(7, 4096));
    nbd.flush();
    c.node_mut("alpha").daemon.assert_running();
    let log = c.node("alpha").daemon.log();
    assert!(
        log.contains(&format!("metrics on http://{addr}/metrics")),
        "{log}"
    );
}

/// The events stream the status page updates itself from (`GET /events`): Server-Sent
/// Events, one `data:` line of JSON per change, as `tandem events --json` says it; here
/// alpha's connection to beta going StandAlone (`tandem disconnect`) and coming back. The
/// stream stays open past the 10 s an ordinary request may take.
#[test]
fn the_events_endpoint_streams_changes_as_server_sent_events() {
    const TEST: &str = "metrics::the_events_endpoint_streams_changes_as_server_sent_events";
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            tweak: &with_metrics,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    c.wait_connected();
    let a = metrics_addr(&c, "alpha");
    let mut s = TcpStream::connect(&a).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    // Reads until `until` is in what arrived, or `within` passed.
    let mut read_until = |got: &mut Vec<u8>, until: &str, within: Duration| -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if String::from_utf8_lossy(got).contains(until) {
                return true;
            }
            match s.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        String::from_utf8_lossy(got).contains(until)
    };
    assert!(read_until(&mut got, "\r\n\r\n", Duration::from_secs(5)));
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("Content-Type: text/event-stream"), "{text}");
    // Quiet for longer than an ordinary request may take: still open.
    std::thread::sleep(Duration::from_secs(11));
    c.node("alpha")
        .daemon
        .admin(&["disconnect", "r0"])
        .expect_success();
    assert!(
        read_until(&mut got, "StandAlone", Duration::from_secs(10)),
        "no change streamed: {}",
        String::from_utf8_lossy(&got)
    );
    c.node("alpha")
        .daemon
        .admin(&["connect", "r0"])
        .expect_success();
    assert!(
        read_until(&mut got, "Connected", Duration::from_secs(20)),
        "no reconnection streamed: {}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8_lossy(&got).to_string();
    let events: Vec<Json> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    assert!(
        events.iter().any(|e| e.to_string().contains("StandAlone")),
        "{events:?}"
    );
    let page = http(&a, b"GET / HTTP/1.1\r\n\r\n", Duration::from_secs(10)).2;
    assert!(
        String::from_utf8_lossy(&page).contains("new EventSource(\"/events\")"),
        "the page listens to the stream"
    );
}

/// The status page (`GET /` on the metrics address) in a real browser, headless Chromium,
/// during a resync: it fetches `/status.json` itself and shows each node, its states and
/// the resync's progress bar, on the sync target and on the source; a screenshot is taken.
/// The page is loaded as `/?poll` (no events stream): Chromium's virtual clock, which
/// makes the dump deterministic, stands still while a request is open, and the stream
/// never ends (it is tested on its own above).
#[test]
fn the_status_page_shows_a_resync_in_a_headless_browser() {
    const TEST: &str = "metrics::the_status_page_shows_a_resync_in_a_headless_browser";
    if !require_tools(TEST, &["chromium"]) {
        return;
    }
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            tweak: &with_metrics,
            size: 64 * MIB,
            net: "resync-min-rate = \"2M\"\nresync-max-rate = \"4M\"\n",
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    c.wait_connected();
    c.wait_in_sync(Duration::from_secs(60));
    let (a, b) = (metrics_addr(&c, "alpha"), metrics_addr(&c, "beta"));
    // The page is served whole, with nothing to fetch from elsewhere.
    let (status, head, page) = http(
        &a,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(10),
    );
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("Content-Type: text/html"), "{head}");
    let page = String::from_utf8(page).unwrap();
    assert!(page.contains("fetch(\"/status.json\""), "{page}");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "nothing from elsewhere"
    );
    // Beta's replica thrown away: resynced in full from alpha at 4 MiB/s (16 s: chromium
    // on a loaded machine took long enough to see 8 s end, in one fresh-clone run).
    c.node("beta")
        .daemon
        .admin(&["invalidate", "r0"])
        .expect_success();
    c.wait_for("a resync under way", Duration::from_secs(20), |sts| {
        let beta = &sts.iter().find(|(n, _)| *n == "beta").unwrap().1;
        let done = beta["volumes"][0]["resync"]["done_kib"]
            .as_u64()
            .unwrap_or(0);
        match done {
            1.. => Ok(()),
            0 => Err(format!("beta: {}", beta["volumes"][0])),
        }
    });
    // The node's rates over its last second: beta writes what the resync brings.
    let status_json = |addr: &str| -> Json {
        let (status, head, json) = http(
            addr,
            b"GET /status.json HTTP/1.1\r\n\r\n",
            Duration::from_secs(10),
        );
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        serde_json::from_slice(&json).expect("status.json is JSON")
    };
    assert!(
        wait_until(Duration::from_secs(5), || status_json(&b)["resources"][0]
            ["write_rate"]
            .as_u64()
            > Some(0)),
        "beta's write rate stays 0: {}",
        status_json(&b)
    );
    let shot = c.dir.join("beta-status.png");
    let dom = |addr: &str| {
        let mut cmd = tool("chromium");
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=3000",
        ])
        .arg("--dump-dom")
        .arg(format!("http://{addr}/?poll"));
        let r = run(&mut cmd, Duration::from_secs(60));
        r.expect_success();
        r.stdout
    };
    let on_beta = dom(&b);
    let on_alpha = dom(&a);
    let mut cmd = tool("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=3000",
    ])
    .args(["--window-size=1100,400", "--hide-scrollbars"])
    .arg(format!("--screenshot={}", shot.display()))
    .arg(format!("http://{b}/?poll"));
    run(&mut cmd, Duration::from_secs(60)).expect_success();
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5000,
        "{} bytes",
        png.len()
    );
    eprintln!(
        "{TEST}: screenshot of beta's page during the resync: {} bytes",
        png.len()
    );
    // To look at it: TANDEM_TEST_SCREENSHOTS=DIR keeps a copy.
    if let Some(keep) = std::env::var_os("TANDEM_TEST_SCREENSHOTS") {
        let to = std::path::Path::new(&keep).join("status-page-resync.png");
        std::fs::copy(&shot, &to).unwrap_or_else(|e| panic!("copying to {}: {e}", to.display()));
    }

    // The percent the page shows: 0 < p < 100, with a bar that wide.
    let percent = |dom: &str, role: &str| -> f64 {
        let key = format!("class=\"resync\" data-role=\"{role}\" data-percent=\"");
        let at = dom
            .find(&key)
            .unwrap_or_else(|| panic!("no {role} progress in:\n{dom}"));
        let rest = &dom[at + key.len()..];
        let p: f64 = rest[..rest.find('"').unwrap()].parse().unwrap();
        assert!(
            rest.contains(&format!("style=\"width:{p:.1}%\"")),
            "a bar {p}% wide: {rest}"
        );
        p
    };
    // (The source's status has no progress of a resync its target pulls yet, issue 16
    // item 3: its page shows the peer's disk Inconsistent, and no bar.)
    let target = percent(&on_beta, "target");
    assert!(
        target > 0.0 && target < 100.0,
        "beta's page shows {target}% done"
    );
    eprintln!("{TEST}: beta's page shows {target}% done");
    // Beta writes the resync's data: a rate that is not nothing.
    assert!(
        !on_beta.contains("<span class=\"rate-write\">0 B/s"),
        "{on_beta}"
    );
    for (dom, words) in [
        (
            &on_beta,
            [
                "tandem node <span id=\"node\">beta</span>",
                "data-resource=\"r0\"",
                ">Inconsistent<",
                ">UpToDate<",
                "data-peer=\"alpha\"",
                ">Connected<",
            ],
        ),
        (
            &on_alpha,
            [
                "tandem node <span id=\"node\">alpha</span>",
                "data-resource=\"r0\"",
                ">UpToDate<",
                ">Inconsistent<",
                "data-peer=\"beta\"",
                ">Connected<",
            ],
        ),
    ] {
        for w in words {
            assert!(dom.contains(w), "{w} not in:\n{dom}");
        }
        assert!(dom.contains("class=\"rate-write\""), "{dom}");
    }
    // What the page reads: status --json's resources with their byte counters (the
    // resync's writes on beta's replica among them).
    let v = status_json(&b);
    assert_eq!(v["node"], "beta");
    let r = &v["resources"][0];
    assert_eq!(r["name"], "r0");
    assert_eq!(r["volumes"][0]["disk"], "Inconsistent", "{r}");
    let written = r["written_bytes"][0].as_u64().unwrap();
    assert!(written > 0, "the resync's writes counted: {r}");
    c.wait_in_sync(Duration::from_secs(60));
}
