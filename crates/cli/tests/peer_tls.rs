//! TLS on the peer links (`tls` of the resource) between real `tandem node` daemons: a pair
//! with `tls = "secret"` and with `tls = "certificates"` replicates writes and a resync
//! over TLS; a node with TLS refuses a peer without it (either way round) and both say
//! why; a peer whose certificate another CA signed, or that names another node, is
//! refused with the TLS error in the logs. Certificates are made here (rcgen).

mod common;

use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// How long refused nodes are watched not connecting.
const REFUSAL_WATCH: Duration = Duration::from_secs(3);
const SIZE: u64 = 32 * MIB;

/// A CA, as PEM files in `dir`, and node certificates it signs.
struct Ca {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

impl Ca {
    fn new(dir: PathBuf, name: &str) -> Ca {
        fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tandem peers CA {name}"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Ca { ca, dir }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A node certificate (server and client use) with `names` as its subject alternative
    /// names, as `<file>-cert.pem` and `<file>-key.pem`: (certificate, key).
    fn node(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tandem node {file}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}-cert.pem")),
            self.dir.join(format!("{file}-key.pem")),
        );
        fs::write(&c, cert.pem()).unwrap();
        fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
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
    let st = beta.status();
    let disk = str_of(&arr_of(&st, "volumes")[0], "disk").to_string();
    assert_ne!(
        disk, "UpToDate",
        "beta missed writes but came back UpToDate before any resync"
    );
    c.wait_in_sync(SYNC_TIMEOUT);
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
    let tweak = |_: &str, text: String| {
        let lines = format!(
            "tls = \"certificates\"\ntls-ca = \"{}\"",
            ca.file().display()
        );
        let text = with_resource_lines(text, &lines);
        let text = with_node_files(text, "alpha", &files[0]);
        with_node_files(text, "beta", &files[1])
    };
    let mut c = start_pair(TEST, placement, &tweak);
    replicate_and_resync(&mut c);
}

/// Neither node sees the other Connected for a while, both keep running, and each node's
/// log has a line holding every fragment of its entry in `says`.
fn refused(c: &mut Cluster, says: [&[&str]; 2]) {
    let deadline = Instant::now() + REFUSAL_WATCH;
    while Instant::now() < deadline {
        c.assert_running(&["alpha", "beta"]);
        for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
            let st = c.node(me).status();
            let conn = peer_of(&st, other).map(|p| str_of(p, "connection"));
            assert!(
                conn.is_some_and(|s| s != "Connected"),
                "{me} sees {other} {conn:?}\n{}",
                c.describe()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
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
        let lines = format!("tls = \"certificates\"\ntls-ca = \"{}\"", trusted.display());
        let text = with_resource_lines(text, &lines);
        let text = with_node_files(text, "alpha", &files[0]);
        with_node_files(text, "beta", &files[1])
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
    let tweak = |_: &str, text: String| {
        let lines = format!(
            "tls = \"certificates\"\ntls-ca = \"{}\"",
            ca.file().display()
        );
        let text = with_resource_lines(text, &lines);
        let text = with_node_files(text, "alpha", &files[0]);
        with_node_files(text, "beta", &files[1])
    };
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
