//! TLS on the peer links (`tls` of the resource) between real `tandem node` daemons: a pair
//! with `tls = "secret"` and with `tls = "certificates"` replicates writes and a resync
//! over TLS; a node with TLS refuses a peer without it (either way round) and both say
//! why; a peer whose certificate another CA signed, or that names another node, is
//! refused with the TLS error in the logs. Certificates are made here (rcgen).
//!
//! Three nodes in network namespaces (see `common::netns`) with TLS on lose a cable under
//! writes and resync over TLS once it is back; relays in the test, placed between the two
//! nodes of a pair, record the peer link's bytes, in which data written with TLS is not
//! found (and without TLS, as a control, is).

mod common;

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::netns::NetLab;
use common::pki::{TestCa, BOTH};
use common::*;

/// How long refused nodes are watched not connecting.
const REFUSAL_WATCH: Duration = Duration::from_secs(3);
const SIZE: u64 = 32 * MIB;

/// A CA, as PEM files in `dir`, and node certificates it signs.
struct Ca(TestCa);

impl Ca {
    fn new(dir: PathBuf, name: &str) -> Ca {
        Ca(TestCa::new(&dir, name, "ca.pem"))
    }

    fn file(&self) -> PathBuf {
        self.0.ca_file().to_path_buf()
    }

    /// A node certificate (server and client use) with `names` as its subject alternative
    /// names, as `<file>-cert.pem` and `<file>-key.pem`: (certificate, key).
    fn node(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        self.0.leaf(file, names, &BOTH)
    }
}

/// `text` with `tls = "certificates"` trusting `ca`, alpha's and beta's certificate files
/// `files` in their `[[node]]`s.
fn with_certificates(text: String, ca: &Path, files: &[(PathBuf, PathBuf); 2]) -> String {
    let lines = format!("tls = \"certificates\"\ntls-ca = \"{}\"", ca.display());
    let text = with_resource_lines(text, &lines);
    let text = with_node_files(text, "alpha", &files[0]);
    with_node_files(text, "beta", &files[1])
}

/// `text` (a node's copy of the resource file) with `lines` added to `[resource]`.
fn with_resource_lines(text: String, lines: &str) -> String {
    let at = format!("shared-secret = \"{SECRET}\"\n");
    assert!(text.contains(&at), "test bug: no {at:?} in the file");
    text.replacen(&at, &format!("{at}{lines}\n"), 1)
}

/// `text` with node `name`'s certificate and key set in its `[[node]]` table.
fn with_node_files(text: String, name: &str, files: &(PathBuf, PathBuf)) -> String {
    let at = format!("name = \"{name}\"\n");
    assert!(text.contains(&at), "test bug: no {at:?} in the file");
    text.replacen(
        &at,
        &format!(
            "{at}tls-certificate = \"{}\"\ntls-key = \"{}\"\n",
            files.0.display(),
            files.1.display()
        ),
        1,
    )
}

/// Certificates for alpha and beta signed by `ca`, holding `names` ("IP": the node's
/// address in `placement`).
fn certificate_files(
    ca: &Ca,
    placement: &[Placement],
    names: [&[&str]; 2],
) -> [(PathBuf, PathBuf); 2] {
    let ip = |i: usize| placement[i].address.rsplit_once(':').unwrap().0.to_string();
    let (a, b) = (ip(0), ip(1));
    let alpha: Vec<&str> = names[0]
        .iter()
        .map(|n| if *n == "IP" { &a } else { *n })
        .collect();
    let beta: Vec<&str> = names[1]
        .iter()
        .map(|n| if *n == "IP" { &b } else { *n })
        .collect();
    [ca.node("alpha", &alpha), ca.node("beta", &beta)]
}

fn start_pair(test: &'static str, placement: Vec<Placement>, tweak: Tweak<'_>) -> Cluster {
    Cluster::start_with(
        test,
        Setup {
            tweak,
            size: SIZE,
            placement,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    )
}

/// Writes through alpha, stops beta, writes more, starts beta again (a resync, over TLS),
/// and checks that both replicas hold what was written and that every connection of
/// either node ran TLS 1.3.
fn replicate_and_resync(c: &mut Cluster) {
    c.wait_connected();
    let first = random_bytes(0x7150, 4 * MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(0, &first);
    client.flush();
    drop(client);
    c.wait_in_sync(SYNC_TIMEOUT);
    assert_same_data(
        "beta's replica after writes through alpha",
        &first,
        &read_at(&c.node("beta").disk, 0, first.len()),
    );

    c.node_mut("beta").daemon.stop(Duration::from_secs(10));
    let second = random_bytes(0x7151, 8 * MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(8 * MIB, &second);
    client.flush();
    drop(client);
    let beta = c.node_mut("beta");
    beta.daemon.restart();
    beta.daemon.wait_ready(READY_TIMEOUT);
    c.wait_in_sync(SYNC_TIMEOUT);
    // Beta pulled what it missed. (Not its status once ready: on loopback the resync may
    // be over by then.)
    let log = c.node("beta").daemon.log();
    let since_restart = &log[log.rfind("==== test harness: start").unwrap_or(0)..];
    let pulled = kib_pulled(since_restart);
    assert!(
        pulled * KIB >= second.len() as u64,
        "beta pulled {pulled} KiB after its restart, having missed {} KiB:\n{log}",
        second.len() as u64 / KIB
    );
    c.stop_all();
    c.assert_replicas_identical();
    assert_same_data(
        "beta's replica after the resync",
        &second,
        &read_at(&c.node("beta").disk, 8 * MIB, second.len()),
    );
    for n in ["alpha", "beta"] {
        let log = c.node(n).daemon.log();
        let connected: Vec<&str> = log.lines().filter(|l| l.contains(" connected")).collect();
        // Alpha met beta twice (before and after beta's restart), beta alpha once per start.
        assert!(
            connected.len() >= 2,
            "{n}'s log has {} \"connected\" lines:\n{log}",
            connected.len()
        );
        for l in &connected {
            assert!(
                l.contains("tls=TLSv1_3"),
                "{n}: a connection without TLS: {l}"
            );
        }
        assert!(log.contains("TLS on the peer links"), "{n}:\n{log}");
    }
}

#[test]
fn a_pair_with_tls_secret_replicates_and_resyncs_over_tls() {
    const TEST: &str = "peer_tls::a_pair_with_tls_secret_replicates_and_resyncs_over_tls";
    let tweak = |_: &str, text: String| with_resource_lines(text, "tls = \"secret\"");
    let mut c = start_pair(TEST, Vec::new(), &tweak);
    replicate_and_resync(&mut c);
}

#[test]
fn a_pair_with_tls_certificates_replicates_and_resyncs_over_tls() {
    const TEST: &str = "peer_tls::a_pair_with_tls_certificates_replicates_and_resyncs_over_tls";
    let scratch = TestDir::new(&format!("{TEST}-pki"));
    let ca = Ca::new(scratch.join("pki"), "one");
    let placement = loopback_placement(2);
    // Alpha's certificate names the node, beta's its address: either will do.
    let files = certificate_files(&ca, &placement, [&["alpha"], &["IP"]]);
    let tweak = |_: &str, text: String| with_certificates(text, &ca.file(), &files);
    let mut c = start_pair(TEST, placement, &tweak);
    replicate_and_resync(&mut c);
}

/// Neither node sees the other Connected for a while, both keep running, and each node's
/// log has a line holding every fragment of its entry in `says`.
fn refused(c: &mut Cluster, says: [&[&str]; 2]) {
    c.assert_alpha_and_beta_never_connect(REFUSAL_WATCH, "one refuses the other");
    for (i, me) in ["alpha", "beta"].into_iter().enumerate() {
        let node = c.node(me);
        assert!(
            wait_log_line(node, &[says[i]], Duration::from_secs(5)),
            "{me}'s log has no line with {:?}:\n{}",
            says[i],
            node.daemon.log()
        );
    }
    c.assert_running(&["alpha", "beta"]);
    c.stop_all();
}

/// One node with `tls = "secret"`, the other without: each refuses the other, saying so.
fn mismatch(test: &'static str, with_tls: &'static str) {
    let tweak = |node: &str, text: String| match node == with_tls {
        true => with_resource_lines(text, "tls = \"secret\""),
        false => text,
    };
    let mut c = start_pair(test, Vec::new(), &tweak);
    let (a, b) = match with_tls {
        "alpha" => ("secret", "off"),
        _ => ("off", "secret"),
    };
    let alpha_says = format!("node 0 has tls = \"{a}\", node 1 has tls = \"{b}\"");
    let beta_says = format!("node 1 has tls = \"{b}\", node 0 has tls = \"{a}\"");
    refused(
        &mut c,
        [
            &["TLS mismatch", &alpha_says],
            &["TLS mismatch", &beta_says],
        ],
    );
    for (n, other) in [("alpha", "beta"), ("beta", "alpha")] {
        assert!(
            !c.node(n).daemon.log().contains("connected"),
            "{n} connected to {other}"
        );
    }
}

#[test]
fn a_node_with_tls_refuses_a_peer_without_it() {
    mismatch(
        "peer_tls::a_node_with_tls_refuses_a_peer_without_it",
        "alpha",
    );
}

#[test]
fn a_node_without_tls_refuses_a_peer_with_it() {
    mismatch(
        "peer_tls::a_node_without_tls_refuses_a_peer_with_it",
        "beta",
    );
}

/// Beta trusts another CA than the one that signed alpha's certificate (and its own):
/// each end's TLS fails, beta's because alpha's certificate has an unknown issuer, and
/// alpha's with beta's alert; no data crosses.
#[test]
fn a_peer_certificate_from_another_ca_is_refused() {
    const TEST: &str = "peer_tls::a_peer_certificate_from_another_ca_is_refused";
    let scratch = TestDir::new(&format!("{TEST}-pki"));
    let ca = Ca::new(scratch.join("pki"), "one");
    let other = Ca::new(scratch.join("other"), "two");
    let placement = loopback_placement(2);
    let files = certificate_files(&ca, &placement, [&["alpha"], &["beta"]]);
    let tweak = |node: &str, text: String| {
        let trusted = if node == "beta" {
            other.file()
        } else {
            ca.file()
        };
        with_certificates(text, &trusted, &files)
    };
    let mut c = start_pair(TEST, placement, &tweak);
    refused(
        &mut c,
        [
            &["TLS with node 1 failed", "alert"],
            &["TLS with node 0 failed", "UnknownIssuer"],
        ],
    );
}

/// Beta's certificate (signed by the right CA) names neither beta nor its address. Alpha
/// refuses it both ways: dialing beta, during the TLS handshake; dialed by beta, once TLS
/// is up and beta's Hello claimed node 1, telling beta why.
#[test]
fn a_peer_certificate_naming_another_node_is_refused() {
    const TEST: &str = "peer_tls::a_peer_certificate_naming_another_node_is_refused";
    let scratch = TestDir::new(&format!("{TEST}-pki"));
    let ca = Ca::new(scratch.join("pki"), "one");
    let placement = loopback_placement(2);
    let files = certificate_files(&ca, &placement, [&["alpha", "IP"], &["gamma"]]);
    let tweak = |_: &str, text: String| with_certificates(text, &ca.file(), &files);
    let mut c = start_pair(TEST, placement, &tweak);
    refused(
        &mut c,
        [
            // Alpha dials beta: beta's certificate is not beta's.
            &[
                "TLS with node 1 failed",
                "certificate not valid for name \"beta\"",
            ],
            // Beta dials alpha: alpha finds beta's certificate is not beta's, and says so.
            &[
                "refused",
                "TLS with node 1 failed",
                "names neither \"beta\" nor",
            ],
        ],
    );
}

/// `tls = "certificates"` with a CA file that does not exist stops the node at start,
/// naming the file.
#[test]
fn a_missing_tls_ca_stops_the_node_at_start() {
    const TEST: &str = "peer_tls::a_missing_tls_ca_stops_the_node_at_start";
    let dir = TestDir::new(TEST);
    let ca = Ca::new(dir.join("pki"), "one");
    let (cert, key) = ca.node("alpha", &["alpha"]);
    let cfg = dir.join("cfg");
    fs::create_dir_all(&cfg).unwrap();
    let node = |name: &str, id: u8, port: u16| {
        format!(
            "[[node]]\nname = \"{name}\"\nnode-id = {id}\naddress = \"127.0.0.1:{port}\"\n\
             tls-certificate = \"{}\"\ntls-key = \"{}\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"{}\"\n",
            cert.display(),
            key.display(),
            dir.join(format!("{name}.img")).display(),
        )
    };
    fs::write(
        cfg.join("r0.toml"),
        format!(
            "[resource]\nname = \"r0\"\nshared-secret = \"x\"\n\
             tls = \"certificates\"\ntls-ca = \"{}\"\n\
             [[volume]]\nnumber = 0\nsize = \"4M\"\n{}{}",
            dir.join("no-such-ca.pem").display(),
            node("alpha", 0, 1),
            node("beta", 1, 2),
        ),
    )
    .unwrap();
    let r = run(
        std::process::Command::new(tandem_bin())
            .arg("node")
            .args(["--name", "alpha", "--config-dir"])
            .arg(&cfg)
            .arg("--control")
            .arg(dir.join("ctl")),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "{}", r.describe());
    let said = format!("{}{}", r.stdout, r.stderr);
    assert!(
        said.contains("no-such-ca.pem") && said.contains("tls-ca"),
        "{said}"
    );
    // `tandem check` on the node's machine reads it too.
    let r = run(
        std::process::Command::new(tandem_bin())
            .args(["check", "--name", "alpha", "--config-dir"])
            .arg(&cfg),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "{}", r.describe());
    assert!(r.stdout.contains("no-such-ca.pem"), "{}", r.describe());
}

// ---------------------------------------------------------------------------------------
// Network namespaces: a cable cut and healed under TLS

const NETNS_NODES: [Spec; 3] = [ALPHA, BETA, GAMMA];
const NETNS_PORT: u16 = 7789;
/// Short keepalives, as in `netns.rs`: a pulled cable is noticed within seconds.
const NETNS_OPTS: &str = "ping-interval = \"700ms\"\nping-timeout = \"500ms\"\ntimeout = \"3s\"\n";
/// The longest a pulled cable may go unnoticed (keepalive or write timeout, and slack).
const DETECT_LIMIT: Duration = Duration::from_secs(8);

/// KiB pulled by the resyncs a node's `log` says it finished ("resync from node N
/// finished (K KiB pulled)").
fn kib_pulled(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("resync from node") && l.contains("KiB pulled"))
        .filter_map(|l| {
            let at = l.find(" finished (")? + " finished (".len();
            l[at..].split(' ').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Alpha and beta (diskful) and gamma (diskless, the Primary), each in its own network
/// namespace, with the resource's TLS set by `tweak`. Gamma writes; `victim`'s cable is
/// pulled and gamma writes on (the first writes wait until the keepalive gives up on the
/// victim, later ones go to the other replica alone, and gamma counts what the victim
/// misses); the cable back, the victim reconnects and pulls what it missed, over TLS. The
/// replicas end identical, the victim holds every write, and every `connected` line of
/// every node (at least two with each peer across the cut) says TLS 1.3.
fn cut_and_heal_over_tls(test: &'static str, victim: &'static str, tweak: Tweak<'_>) {
    let net = match NetLab::new(NETNS_NODES.len()) {
        Ok(net) => net,
        Err(e) => {
            skip(test, &format!("needs network namespaces: {e}"));
            return;
        }
    };
    // Declared after the lab: the daemons stop before their namespaces go.
    let mut c = Cluster::start_with(
        test,
        Setup {
            size: SIZE,
            net: NETNS_OPTS,
            placement: net.placement(NETNS_PORT),
            tweak,
            ..Setup::new("C", &NETNS_NODES)
        },
    );
    let v = NETNS_NODES.iter().position(|s| s.name == victim).unwrap();
    c.wait_connected();
    c.wait_in_sync(SYNC_TIMEOUT);

    let first = random_bytes(0x7152, 4 * MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("gamma").nbd), RESOURCE, false);
    client.write(0, &first);
    client.flush();

    net.cut(v);
    let cut_at = Instant::now();
    let second = random_bytes(0x7153, 8 * MIB as usize);
    for (i, chunk) in second.chunks(MIB as usize).enumerate() {
        client.write(8 * MIB + i as u64 * MIB, chunk);
    }
    client.flush();
    c.wait_for("aware of the cut", DETECT_LIMIT, |statuses| {
        for (me, st) in statuses {
            for s in NETNS_NODES.iter().filter(|s| s.name != *me) {
                let cut_off = *me == victim || s.name == victim;
                if cut_off && connection(st, s.name) == "Connected" {
                    return Err(format!("{me} still sees {} Connected", s.name));
                }
            }
        }
        Ok(())
    });
    eprintln!(
        "{test}: the cut was noticed everywhere {:?} after it",
        cut_at.elapsed()
    );
    let third = random_bytes(0x7154, 4 * MIB as usize);
    client.write(20 * MIB, &third);
    client.flush();
    let missed = out_of_sync_kib(&c.node("gamma").status(), victim);
    assert!(
        missed >= 4 * 1024,
        "gamma records {missed} KiB out of sync with {victim}, cut off while 12 MiB were written\n{}",
        c.describe()
    );

    net.heal(v);
    let healed_at = Instant::now();
    c.wait_connected();
    c.wait_in_sync(SYNC_TIMEOUT);
    eprintln!(
        "{test}: reconnected and in sync {:?} after the heal",
        healed_at.elapsed()
    );
    drop(client);
    c.stop_all();
    c.assert_replicas_identical();
    let disk = &c.node(victim).disk;
    for (what, at, data) in [
        ("first", 0, &first),
        ("second", 8 * MIB, &second),
        ("third", 20 * MIB, &third),
    ] {
        assert_same_data(
            &format!("{victim}'s replica: the {what} writes"),
            data,
            &read_at(disk, at, data.len()),
        );
    }
    let pulled = kib_pulled(&c.node(victim).daemon.log());
    assert!(
        pulled > 0,
        "{victim} pulled nothing after the heal:\n{}",
        c.node(victim).daemon.log()
    );
    for me in NETNS_NODES.iter().map(|s| s.name) {
        let log = c.node(me).daemon.log();
        let connected: Vec<&str> = log.lines().filter(|l| l.contains(" connected")).collect();
        for l in &connected {
            assert!(
                l.contains("tls=TLSv1_3"),
                "{me}: a connection without TLS: {l}"
            );
        }
        for peer in NETNS_NODES.iter().map(|s| s.name).filter(|&p| p != me) {
            let with_peer = connected
                .iter()
                .filter(|l| l.contains(&format!(" {peer})")))
                .count();
            let want = if me == victim || peer == victim { 2 } else { 1 };
            assert!(
                with_peer >= want,
                "{me}'s log has {with_peer} \"connected\" lines with {peer}, not {want}:\n{log}"
            );
        }
    }
    drop(c);
    drop(net);
}

#[test]
fn three_namespaces_with_tls_secret_cut_heal_and_resync_over_tls() {
    const TEST: &str = "peer_tls::three_namespaces_with_tls_secret_cut_heal_and_resync_over_tls";
    let tweak = |_: &str, text: String| with_resource_lines(text, "tls = \"secret\"");
    cut_and_heal_over_tls(TEST, "beta", &tweak);
}

/// With certificates (each naming its node), and alpha, which dials both its peers, cut off.
#[test]
fn three_namespaces_with_tls_certificates_cut_heal_and_resync_over_tls() {
    const TEST: &str =
        "peer_tls::three_namespaces_with_tls_certificates_cut_heal_and_resync_over_tls";
    let scratch = TestDir::new(&format!("{TEST}-pki"));
    let ca = Ca::new(scratch.join("pki"), "one");
    let files: Vec<(&str, (PathBuf, PathBuf))> = NETNS_NODES
        .iter()
        .map(|s| (s.name, ca.node(s.name, &[s.name])))
        .collect();
    let tweak = |_: &str, text: String| {
        let lines = format!(
            "tls = \"certificates\"\ntls-ca = \"{}\"",
            ca.file().display()
        );
        let mut text = with_resource_lines(text, &lines);
        for (name, f) in &files {
            text = with_node_files(text, name, f);
        }
        text
    };
    cut_and_heal_over_tls(TEST, "alpha", &tweak);
}

// ---------------------------------------------------------------------------------------
// What crosses the wire

/// What one direction of one relayed connection carried.
type Recording = Arc<Mutex<Vec<u8>>>;

/// A TCP relay on 127.0.0.1: each connection it accepts it forwards to `target`, recording
/// every byte either way.
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepter: Option<thread::JoinHandle<()>>,
    /// Per connection and direction (to the target, from it), what crossed.
    recorded: Arc<Mutex<Vec<[Recording; 2]>>>,
}

/// Copies `from` to `to`, recording, until either end closes; then closes the other.
fn pump(mut from: TcpStream, mut to: TcpStream, rec: Recording) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        rec.lock().unwrap().extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the relay's listener");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let recorded: Arc<Mutex<Vec<[Recording; 2]>>> = Arc::default();
        let accepter = {
            let (stop, recorded) = (stop.clone(), recorded.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let client = match listener.accept() {
                        Ok((s, _)) => s,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                        Err(e) => panic!("the relay's accept: {e}"),
                    };
                    client.set_nonblocking(false).unwrap();
                    // The target not listening yet: the dialer sees its connection closed
                    // and tries again.
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    let rec = [Arc::default(), Arc::default()];
                    recorded.lock().unwrap().push(rec.clone());
                    let [to_target, from_target] = rec;
                    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    thread::spawn(move || pump(client, server, to_target));
                    thread::spawn(move || pump(s2, c2, from_target));
                }
            })
        };
        Relay {
            addr,
            stop,
            accepter: Some(accepter),
            recorded,
        }
    }

    /// Stops accepting; what was recorded, one buffer per connection and direction.
    fn finish(mut self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accepter.take() {
            t.join().expect("the relay's accepting thread");
        }
        let conns = self.recorded.lock().unwrap();
        conns
            .iter()
            .flat_map(|c| c.iter().map(|r| r.lock().unwrap().clone()))
            .collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// 16 bytes written over and over, to be looked for on the wire.
const MARKER: &[u8; 16] = b"tandem-plaintxt!";

/// A pair whose links run through [`Relay`]s: each node's copy of the resource file gives
/// its peer's address as that of a relay to the peer (both ends dial; either connection
/// may be the one kept). 1 MiB of [`MARKER`] is written through alpha and synced; both
/// replicas hold it and end identical, the connections say `tls=<want_tls>`, and more than
/// the data crossed the relays. Returns whether the marker is in what the relays recorded
/// (any connection, either way).
fn marker_on_the_wire(test: &'static str, tls: &str, want_tls: &str) -> bool {
    let placement = loopback_placement(2);
    let real: Vec<String> = placement.iter().map(|p| p.address.clone()).collect();
    let relays: Vec<Relay> = real
        .iter()
        .map(|a| Relay::start(a.parse().unwrap()))
        .collect();
    let tweak = |node: &str, text: String| {
        let mut text = match tls {
            "off" => text,
            _ => with_resource_lines(text, &format!("tls = \"{tls}\"")),
        };
        let peer = if node == "alpha" { 1 } else { 0 };
        let at = format!("address = \"{}\"\n", real[peer]);
        assert!(text.contains(&at), "test bug: no {at:?} in the file");
        text = text.replacen(&at, &format!("address = \"{}\"\n", relays[peer].addr), 1);
        text
    };
    let mut c = start_pair(test, placement, &tweak);
    c.wait_connected();
    c.wait_in_sync(SYNC_TIMEOUT);
    let data = MARKER.repeat((MIB / 16) as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(MIB, &data);
    client.flush();
    drop(client);
    c.wait_in_sync(SYNC_TIMEOUT);
    c.stop_all();
    c.assert_replicas_identical();
    assert_same_data(
        "beta's replica",
        &data,
        &read_at(&c.node("beta").disk, MIB, data.len()),
    );
    for n in ["alpha", "beta"] {
        let log = c.node(n).daemon.log();
        let connected: Vec<&str> = log.lines().filter(|l| l.contains(" connected")).collect();
        assert!(!connected.is_empty(), "{n} never connected:\n{log}");
        for l in &connected {
            assert!(l.contains(&format!("tls={want_tls}")), "{n}: {l}");
        }
    }
    let recorded: Vec<Vec<u8>> = relays.into_iter().flat_map(Relay::finish).collect();
    let carried: usize = recorded.iter().map(Vec::len).sum();
    eprintln!(
        "{test}: the relays carried {} connection(s), {carried} bytes",
        recorded.len() / 2
    );
    assert!(
        carried > data.len(),
        "only {carried} bytes crossed the relays, for {} written: the link bypassed them",
        data.len()
    );
    recorded
        .iter()
        .any(|r| r.windows(MARKER.len()).any(|w| w == MARKER))
}

/// With `tls = "secret"` the data written is nowhere in the bytes the peer link carried.
#[test]
fn the_peer_link_with_tls_secret_carries_no_plaintext() {
    const TEST: &str = "peer_tls::the_peer_link_with_tls_secret_carries_no_plaintext";
    assert!(
        !marker_on_the_wire(TEST, "secret", "TLSv1_3"),
        "the marker written through alpha crossed the TLS link in clear"
    );
}

/// The control: without TLS the relays do see the data written (the test above can fail).
#[test]
fn the_peer_link_without_tls_carries_plaintext() {
    const TEST: &str = "peer_tls::the_peer_link_without_tls_carries_plaintext";
    assert!(
        marker_on_the_wire(TEST, "off", "off"),
        "the marker written through alpha is not in what the plain link carried"
    );
}
