//! TLS for NBD clients (`NBD_OPT_STARTTLS` with X.509) against real clients: libnbd's
//! `nbdinfo` and `nbdcopy` (GnuTLS) and `qemu-img` (GnuTLS through QEMU's crypto layer),
//! on `tandem serve` and on a `tandem node`'s export. Certificates are made here (rcgen) in
//! the layout both clients read from a directory: `ca-cert.pem`, `client-cert.pem`,
//! `client-key.pem`.

mod common;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cluster::*;
use common::pki::{TestCa, Usage};
use common::*;

const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// A certificate authority and the files one server and its clients use:
/// `ca-cert.pem`, `server-cert.pem`, `server-key.pem`, `client-cert.pem`,
/// `client-key.pem` in one directory, a server's files and a client's directory at once.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: PathBuf, name: &str) -> Pki {
        let ca = TestCa::new(&dir, name, "ca-cert.pem");
        ca.leaf("server", &["localhost", "127.0.0.1"], &[Usage::ServerAuth]);
        ca.leaf("client", &[], &[Usage::ClientAuth]);
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A client directory trusting this CA, without a client certificate.
    fn anonymous_client(&self, dir: PathBuf) -> PathBuf {
        fs::create_dir_all(&dir).unwrap();
        fs::copy(self.file("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
        dir
    }

    /// `tandem serve` arguments for this server certificate.
    fn serve_args(&self, mode: &str) -> Vec<String> {
        vec![
            format!("--tls={mode}"),
            "--tls-certificate".into(),
            self.file("server-cert.pem").display().to_string(),
            "--tls-key".into(),
            self.file("server-key.pem").display().to_string(),
        ]
    }
}

/// A TCP port free right now on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `tandem serve` of one 8 MiB export `disk` on a Unix socket and 127.0.0.1:port, with
/// `args`: (server, port, backing file).
fn serve(dir: &TestDir, args: &[String]) -> (Server, u16, PathBuf) {
    let img = dir.join("disk.img");
    if !img.exists() {
        sparse_file(&img, 8 * MIB);
    }
    let port = free_port();
    let mut b = Server::builder(dir)
        .export("disk", &img)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    for a in args {
        b = b.arg(a);
    }
    (b.start(), port, img)
}

fn nbds(port: u16, certs: &Path) -> String {
    nbds_export(port, "disk", certs)
}

fn nbds_export(port: u16, export: &str, certs: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{port}/{export}?tls-certificates={}",
        certs.display()
    )
}

fn nbdinfo(uri: &str) -> Run {
    run(tool("nbdinfo").arg("--json").arg(uri), TOOL_TIMEOUT)
}

/// Writes `data` through `uri` with nbdcopy, reads it back through `uri` with nbdcopy, and
/// checks both the copy and the backing file.
fn copy_through(dir: &TestDir, uri: &str, data: &[u8], backing: &Path) {
    let src = dir.join("src.raw");
    fs::write(&src, data).unwrap();
    run(tool("nbdcopy").arg(&src).arg(uri), TOOL_TIMEOUT).expect_success();
    let back = dir.join("back.raw");
    let _ = fs::remove_file(&back);
    run(tool("nbdcopy").arg(uri).arg(&back), TOOL_TIMEOUT).expect_success();
    assert_same_data("read back through TLS", data, &fs::read(&back).unwrap());
    assert_same_data("the backing file", data, &read_at(backing, 0, data.len()));
}

#[test]
fn nbdinfo_and_nbdcopy_through_tls_read_back_what_they_wrote() {
    const TEST: &str = "tls::nbdinfo_and_nbdcopy_through_tls_read_back_what_they_wrote";
    if !require_tools(TEST, &["nbdinfo", "nbdcopy"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let (server, port, img) = serve(&dir, &pki.serve_args("require"));
    let uri = nbds(port, &pki.dir);
    let info = nbdinfo(&uri);
    info.expect_success();
    assert!(
        info.stdout.contains("\"TLS\": true"),
        "nbdinfo does not see TLS:\n{}",
        info.stdout
    );
    copy_through(&dir, &uri, &random_bytes(17, 8 * MIB as usize), &img);
    // TLS over the Unix socket too.
    let unix = format!(
        "nbds+unix:///disk?socket={}&tls-certificates={}",
        server.socket().display(),
        pki.dir.display()
    );
    copy_through(&dir, &unix, &random_bytes(18, 8 * MIB as usize), &img);
    server.expect_log(
        &["tls=TLSv1_3"],
        "the TLS version of the transmission phase",
    );
}

#[test]
fn qemu_img_with_tls_creds_x509_writes_and_reads() {
    const TEST: &str = "tls::qemu_img_with_tls_creds_x509_writes_and_reads";
    if !require_tools(TEST, &["qemu-img"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    // Mutual authentication: qemu presents the client certificate of its directory.
    let mut args = pki.serve_args("require");
    args.push("--tls-client-ca".into());
    args.push(pki.file("ca-cert.pem").display().to_string());
    let (server, port, img) = serve(&dir, &args);
    let object = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        pki.dir.display()
    );
    let target = format!(
        "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export=disk,tls-creds=tls0"
    );
    let data = random_bytes(19, 8 * MIB as usize);
    let src = dir.join("src.raw");
    fs::write(&src, &data).unwrap();
    run(
        tool("qemu-img")
            .args(["convert", "-n", "-f", "raw", "--object", &object])
            .arg(&src)
            .args(["--target-image-opts", &target]),
        TOOL_TIMEOUT,
    )
    .expect_success();
    assert_same_data("the backing file", &data, &read_at(&img, 0, data.len()));
    let back = dir.join("back.raw");
    run(
        tool("qemu-img")
            .args(["convert", "-O", "raw", "--object", &object, "--image-opts"])
            .arg(&target)
            .arg(&back),
        TOOL_TIMEOUT,
    )
    .expect_success();
    assert_same_data("read back by qemu-img", &data, &fs::read(&back).unwrap());
    drop(server);
}

#[test]
fn a_client_trusting_another_ca_is_refused_and_the_server_goes_on() {
    const TEST: &str = "tls::a_client_trusting_another_ca_is_refused_and_the_server_goes_on";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let other = Pki::new(dir.join("other"), "b");
    let (mut server, port, _) = serve(&dir, &pki.serve_args("require"));
    let refused = nbdinfo(&nbds(port, &other.dir));
    assert!(!refused.success(), "{}", refused.describe());
    // The client refuses the server's certificate; the server only sees the connection end
    // during the TLS handshake, and goes on serving.
    server.assert_running();
    nbdinfo(&nbds(port, &pki.dir)).expect_success();
    server.assert_running();
}

#[test]
fn mutual_auth_refuses_a_client_without_a_certificate() {
    const TEST: &str = "tls::mutual_auth_refuses_a_client_without_a_certificate";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let stranger = Pki::new(dir.join("stranger"), "c");
    let mut args = pki.serve_args("require");
    args.push("--tls-client-ca".into());
    args.push(pki.file("ca-cert.pem").display().to_string());
    let (mut server, port, _) = serve(&dir, &args);
    let anonymous = pki.anonymous_client(dir.join("anonymous"));
    let refused = nbdinfo(&nbds(port, &anonymous));
    assert!(!refused.success(), "{}", refused.describe());
    server.expect_log(
        &["TLS failed, closing: peer sent no certificates"],
        "the refused client",
    );
    // A client certificate of another CA is refused too.
    let foreign = dir.join("foreign");
    fs::create_dir_all(&foreign).unwrap();
    fs::copy(pki.file("ca-cert.pem"), foreign.join("ca-cert.pem")).unwrap();
    for f in ["client-cert.pem", "client-key.pem"] {
        fs::copy(stranger.file(f), foreign.join(f)).unwrap();
    }
    let refused = nbdinfo(&nbds(port, &foreign));
    assert!(!refused.success(), "{}", refused.describe());
    // GnuTLS does not even offer a certificate the server's CA list does not name: refused
    // as one without.
    assert!(
        wait_until(Duration::from_secs(5), || server
            .log()
            .matches("TLS failed, closing")
            .count()
            == 2),
        "{}",
        server.log()
    );
    server.assert_running();
    nbdinfo(&nbds(port, &pki.dir)).expect_success();
}

#[test]
fn a_plaintext_client_is_refused_under_require_and_served_under_on() {
    const TEST: &str = "tls::a_plaintext_client_is_refused_under_require_and_served_under_on";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let (mut server, port, _) = serve(&dir, &pki.serve_args("require"));
    let plain = format!("nbd://127.0.0.1:{port}/disk");
    let refused = nbdinfo(&plain);
    assert!(!refused.success(), "{}", refused.describe());
    server.expect_log(&["ERR_TLS_REQD"], "the plaintext client");
    let lines = server
        .log()
        .lines()
        .filter(|l| l.contains("ERR_TLS_REQD"))
        .count();
    assert_eq!(lines, 1, "logged once per client:\n{}", server.log());
    server.assert_running();
    drop(server);

    let dir = TestDir::new(&format!("{TEST}-on"));
    let (server, port, _) = serve(&dir, &pki.serve_args("on"));
    let plain = nbdinfo(&format!("nbd://127.0.0.1:{port}/disk"));
    plain.expect_success();
    assert!(plain.stdout.contains("\"TLS\": false"), "{}", plain.stdout);
    let tls = nbdinfo(&nbds(port, &pki.dir));
    tls.expect_success();
    assert!(tls.stdout.contains("\"TLS\": true"), "{}", tls.stdout);
    drop(server);
}

#[test]
fn a_tls_client_of_a_server_without_tls_is_told_so() {
    const TEST: &str = "tls::a_tls_client_of_a_server_without_tls_is_told_so";
    if !require_tools(TEST, &["nbdinfo"]) {
        return;
    }
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let (server, port, _) = serve(&dir, &[]);
    let refused = nbdinfo(&nbds(port, &pki.dir));
    assert!(!refused.success(), "{}", refused.describe());
    server.expect_log(
        &["STARTTLS refused (ERR_POLICY)"],
        "the TLS client of a plaintext server",
    );
}

#[test]
fn bad_certificate_files_stop_the_server_at_start_naming_them() {
    const TEST: &str = "tls::bad_certificate_files_stop_the_server_at_start_naming_them";
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    sparse_file(&dir.join("disk.img"), MIB);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--tls=on".into(),
                "--tls-certificate".into(),
                dir.join("missing.pem").display().to_string(),
                "--tls-key".into(),
                pki.file("server-key.pem").display().to_string(),
            ],
            "missing.pem",
        ),
        (
            vec![
                "--tls=require".into(),
                "--tls-certificate".into(),
                pki.file("server-cert.pem").display().to_string(),
                "--tls-key".into(),
                pki.file("client-key.pem").display().to_string(),
            ],
            "server-cert.pem",
        ),
        (
            vec![
                "--tls=require".into(),
                "--tls-certificate".into(),
                pki.file("server-key.pem").display().to_string(),
                "--tls-key".into(),
                pki.file("server-key.pem").display().to_string(),
            ],
            "no PEM certificate",
        ),
        (vec!["--tls=on".into()], "--tls-certificate"),
        (
            vec![
                "--tls-client-ca".into(),
                pki.file("ca-cert.pem").display().to_string(),
            ],
            "--tls=on",
        ),
    ];
    for (args, needle) in cases {
        let mut b = Server::builder(&dir).export("disk", &dir.join("disk.img"));
        for a in &args {
            b = b.arg(a);
        }
        let (status, log) = b.run_to_exit(Duration::from_secs(20));
        let status = status.unwrap_or_else(|| panic!("{args:?}: still running\n{log}"));
        assert!(!status.success(), "{args:?}: exited 0\n{log}");
        assert!(
            log.contains(needle),
            "{args:?}: {needle:?} not said:\n{log}"
        );
    }
}

/// A pair of nodes whose NBD export on alpha requires TLS (mutual authentication), the
/// replica on beta written through it.
#[test]
fn a_node_export_requires_tls_and_replicates_what_comes_through_it() {
    const TEST: &str = "tls::a_node_export_requires_tls_and_replicates_what_comes_through_it";
    if !require_tools(TEST, &["nbdcopy", "nbdinfo"]) {
        return;
    }
    let scratch = TestDir::new(&format!("{TEST}-pki"));
    let pki = Pki::new(scratch.join("pki"), "a");
    let port = free_port();
    let tweak = |node: &str, text: String| -> String {
        if node != "alpha" {
            return text;
        }
        text.replace(
            "name = \"alpha\"\n",
            &format!(
                "name = \"alpha\"\n\
                 nbd-tls = \"require\"\n\
                 tls-certificate = \"{}\"\n\
                 tls-key = \"{}\"\n\
                 nbd-tls-client-ca = \"{}\"\n",
                pki.file("server-cert.pem").display(),
                pki.file("server-key.pem").display(),
                pki.file("ca-cert.pem").display(),
            ),
        )
        .replacen(
            "nbd = [\"unix:",
            &format!("nbd = [\"tcp:127.0.0.1:{port}\", \"unix:"),
            1,
        )
    };
    let mut c = Cluster::start_with(
        TEST,
        Setup {
            tweak: &tweak,
            size: 16 * MIB,
            ..Setup::new("C", &[ALPHA, BETA])
        },
    );
    c.wait_connected();
    // Plaintext is refused on both of alpha's endpoints.
    let plain = nbdinfo(&c.node("alpha").uri());
    assert!(!plain.success(), "{}", plain.describe());
    let uri = nbds_export(port, "", &pki.dir);
    let data = random_bytes(23, 16 * MIB as usize);
    let src = c.dir.join("src.raw");
    fs::write(&src, &data).unwrap();
    run(tool("nbdcopy").arg(&src).arg(&uri), TOOL_TIMEOUT).expect_success();
    let back = c.dir.join("back.raw");
    run(tool("nbdcopy").arg(&uri).arg(&back), TOOL_TIMEOUT).expect_success();
    assert_same_data("read back through TLS", &data, &fs::read(&back).unwrap());
    c.wait_in_sync(SYNC_TIMEOUT);
    c.stop_all();
    c.assert_replicas_identical();
    assert_same_data(
        "beta's replica",
        &data,
        &read_at(&c.node("beta").disk, 0, data.len()),
    );
    let log = c.node("alpha").daemon.log();
    assert!(log.contains("tls=TLSv1_3"), "{log}");
}

/// A resource file whose TLS files are wrong stops the node at start, naming the file.
#[test]
fn a_node_with_a_bad_tls_key_does_not_start() {
    const TEST: &str = "tls::a_node_with_a_bad_tls_key_does_not_start";
    let dir = TestDir::new(TEST);
    let pki = Pki::new(dir.join("pki"), "a");
    let cfg = dir.join("cfg");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(
        cfg.join("r0.toml"),
        format!(
            "[resource]\nname = \"r0\"\nshared-secret = \"x\"\n\
             [[volume]]\nnumber = 0\nsize = \"4M\"\n\
             [[node]]\nname = \"alpha\"\nnode-id = 0\naddress = \"127.0.0.1:{}\"\n\
             nbd-tls = \"on\"\ntls-certificate = \"pki/server-cert.pem\"\ntls-key = \"pki/nope.pem\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"{}\"\nnbd = [\"unix:{}\"]\n\
             [[node]]\nname = \"beta\"\nnode-id = 1\naddress = \"127.0.0.1:{}\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"none\"\n",
            free_port(),
            dir.join("a.img").display(),
            dir.join("a.sock").display(),
            free_port(),
        ),
    )
    .unwrap();
    // The configuration is in the test's directory, so `pki/` is relative to it.
    fs::rename(dir.join("pki"), cfg.join("pki")).unwrap();
    let _ = &pki;
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
    assert!(said.contains("nope.pem"), "{said}");
    // `tandem check` on the node's machine reads them too.
    let r = run(
        std::process::Command::new(tandem_bin())
            .args(["check", "--name", "alpha", "--config-dir"])
            .arg(&cfg),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "{}", r.describe());
    assert!(r.stdout.contains("nope.pem"), "{}", r.describe());
}
