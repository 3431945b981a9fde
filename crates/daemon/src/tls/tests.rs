//! TlsSession over real nonblocking sockets, driven the way the event loops drive a
//! connection (edge-triggered; a short read means drained): nothing stalls, bytes arrive
//! intact, bad credentials fail the handshake with a TLS error.

use super::*;
use crate::listener::Stream;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use std::time::{Duration, Instant};

/// A CA and certificates it signs, as PEM files in a temporary directory.
pub(crate) struct Pki {
    pub dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A leaf named `name` (and its SAN), for servers and clients alike.
    pub fn leaf(&self, name: &str) -> CertFiles {
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let files = CertFiles {
            certificate: self.dir.path().join(format!("{name}-cert.pem")),
            key: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.certificate, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

fn client_config(ca: &Path, cert: Option<&CertFiles>) -> Arc<rustls::ClientConfig> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca).unwrap());
    Arc::new(match cert {
        Some(c) => b
            .with_client_auth_cert(
                load_certificates(&c.certificate).unwrap(),
                load_key(&c.key).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

/// A connected pair of nonblocking TCP streams, registered edge-triggered on `poll`
/// (tokens 0 and 1).
fn pair(poll: &Poll) -> (Stream, Stream) {
    let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut b = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    };
    let rw = Interest::READABLE | Interest::WRITABLE;
    poll.registry().register(&mut a, Token(0), rw).unwrap();
    poll.registry().register(&mut b, Token(1), rw).unwrap();
    (Stream::tcp(a), Stream::tcp(b))
}

/// One end as a loop drives it: a queue to send, what it received.
struct End {
    s: Stream,
    out: Vec<u8>,
    pos: usize,
    got: Vec<u8>,
    readable: bool,
    eof: bool,
    err: Option<io::Error>,
}

impl End {
    fn new(s: Stream, out: Vec<u8>) -> End {
        End {
            s,
            out,
            pos: 0,
            got: Vec::new(),
            readable: true,
            eof: false,
            err: None,
        }
    }

    fn service(&mut self) {
        if self.err.is_some() {
            return;
        }
        let mut buf = vec![0u8; 100_000];
        while self.readable && !self.eof {
            match self.s.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.got.extend_from_slice(&buf[..n]);
                    if n < buf.len() && !self.s.input_pending() {
                        self.readable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
                Err(e) => return self.err = Some(e),
            }
        }
        if let Err(e) = self.s.write_queued(&mut self.out, &mut self.pos) {
            self.err = Some(e);
        }
    }
}

/// Runs both ends until each has `want` bytes, one fails, or nothing happens for 2 s.
fn drive(poll: &mut Poll, ends: &mut [End; 2], want: [usize; 2]) {
    drive_until(poll, ends, |e| {
        e[0].got.len() >= want[0] && e[1].got.len() >= want[1]
    })
}

/// Runs both ends until `done`, one fails, or nothing happens for 2 s (a failure).
fn drive_until(poll: &mut Poll, ends: &mut [End; 2], done: impl Fn(&[End; 2]) -> bool) {
    let mut events = Events::with_capacity(16);
    for e in ends.iter_mut() {
        e.service();
    }
    loop {
        if ends.iter().any(|e| e.err.is_some()) || done(ends) {
            return;
        }
        poll.poll(&mut events, Some(Duration::from_secs(2)))
            .unwrap();
        assert!(
            !events.is_empty(),
            "stalled: got {} and {} bytes, {} and {} queued, output pending {} {}",
            ends[0].got.len(),
            ends[1].got.len(),
            ends[0].out.len() - ends[0].pos,
            ends[1].out.len() - ends[1].pos,
            ends[0].s.output_pending(),
            ends[1].s.output_pending(),
        );
        for ev in events.iter() {
            let e = &mut ends[ev.token().0];
            if ev.is_readable() || ev.is_read_closed() {
                e.readable = true;
            }
            e.service();
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn tls_pair(
    poll: &Poll,
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
    clear: Vec<u8>,
) -> (Stream, Stream) {
    let (mut c, mut s) = pair(poll);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let cc = rustls::ClientConnection::new(client.clone(), name).unwrap();
    c.start_tls(cc.into(), Vec::new(), &[]);
    s.start_tls(server_connection(server).unwrap(), clear, &[]);
    (c, s)
}

#[test]
fn bulk_both_ways_under_edge_triggered_readiness() {
    let pki = Pki::new();
    let server = server_config(&pki.leaf("localhost"), None).unwrap();
    let client = client_config(&pki.ca(), None);
    let mut poll = Poll::new().unwrap();
    let (c, s) = tls_pair(&poll, &server, &client, Vec::new());
    // More than every buffer on the way (socket, rustls, ours) in both directions at once.
    let (up, down) = (pattern(9 << 20, 1), pattern(7 << 20, 2));
    let mut ends = [End::new(c, up.clone()), End::new(s, down.clone())];
    drive(&mut poll, &mut ends, [down.len(), up.len()]);
    assert!(ends[0].err.is_none() && ends[1].err.is_none());
    assert!(ends[0].got == down, "server to client bytes differ");
    assert!(ends[1].got == up, "client to server bytes differ");
    assert!(ends.iter().all(|e| e.s.tls().unwrap().established()));
    // Both ends of the channel see one binding; another connection has another.
    let binding = ends[0].s.tls().unwrap().channel_binding().unwrap();
    assert_eq!(ends[1].s.tls().unwrap().channel_binding(), Some(binding));
    let mut poll2 = Poll::new().unwrap();
    let (c2, s2) = tls_pair(&poll2, &server, &client, Vec::new());
    let mut other = [End::new(c2, b"x".to_vec()), End::new(s2, b"y".to_vec())];
    drive(&mut poll2, &mut other, [1, 1]);
    let b2 = other[0].s.tls().unwrap().channel_binding().unwrap();
    assert_eq!(other[1].s.tls().unwrap().channel_binding(), Some(b2));
    assert_ne!(binding, b2);
    let v = ends[1].s.tls().unwrap().describe();
    assert!(v.starts_with("TLSv1_3"), "{v}");
    // A close_notify is an end of stream.
    ends[0].s.shutdown();
    drive_until(&mut poll, &mut ends, |e| e[1].eof);
    assert!(ends[1].err.is_none(), "{:?}", ends[1].err);
}

#[test]
fn clear_bytes_go_first_and_bytes_read_early_are_tls() {
    let pki = Pki::new();
    let server = server_config(&pki.leaf("localhost"), None).unwrap();
    let client = client_config(&pki.ca(), None);
    let mut poll = Poll::new().unwrap();
    let (mut c, mut s) = pair(&poll);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut cc = rustls::ClientConnection::new(client, name).unwrap();
    // The client's first flight, already read by the server before TLS began (NBD's
    // STARTTLS ACK queued, not yet sent).
    let mut hello = Vec::new();
    cc.write_tls(&mut hello).unwrap();
    s.start_tls(server_connection(&server).unwrap(), b"ACK".to_vec(), &hello);
    let mut buf = [0u8; 4096];
    let e = s.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    // In the clear, the client gets the ACK first, then the server's TLS flight.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() <= 3 {
        match c.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "nothing came");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&got[..3], b"ACK");
    assert_eq!(got[3], 0x16, "a TLS handshake record follows");
    c.start_tls(cc.into(), Vec::new(), &got[3..]);
    let mut ends = [End::new(c, b"hi".to_vec()), End::new(s, b"hello".to_vec())];
    drive(&mut poll, &mut ends, [5, 2]);
    assert_eq!(ends[0].got, b"hello");
    assert_eq!(ends[1].got, b"hi");
}

#[test]
fn a_client_without_the_ca_fails_the_handshake_with_a_tls_error() {
    let pki = Pki::new();
    let other = Pki::new();
    let server = server_config(&pki.leaf("localhost"), None).unwrap();
    let client = client_config(&other.ca(), None);
    let mut poll = Poll::new().unwrap();
    let (c, s) = tls_pair(&poll, &server, &client, Vec::new());
    let mut ends = [End::new(c, b"x".to_vec()), End::new(s, Vec::new())];
    drive(&mut poll, &mut ends, [1, 1]);
    let e = ends[0].err.take().expect("the client refuses the server");
    assert!(
        matches!(failure(&e), Some(rustls::Error::InvalidCertificate(_))),
        "{e}"
    );
    // The server hears of it (the client's alert), as a TLS error too.
    ends[0].err = None;
    ends[0].readable = false;
    drive_until(&mut poll, &mut ends, |e| e[1].err.is_some());
    let e = ends[1].err.take().expect("the server sees the alert");
    assert!(failure(&e).is_some(), "{e}");
}

#[test]
fn mutual_auth_refuses_a_client_without_a_certificate_and_takes_one_with() {
    let pki = Pki::new();
    let server = server_config(&pki.leaf("localhost"), Some(&pki.ca())).unwrap();
    let mut poll = Poll::new().unwrap();
    let client = client_config(&pki.ca(), None);
    let (c, s) = tls_pair(&poll, &server, &client, Vec::new());
    let mut ends = [End::new(c, b"x".to_vec()), End::new(s, Vec::new())];
    drive(&mut poll, &mut ends, [1, 1]);
    let e = ends[1].err.take().expect("the server refuses the client");
    assert!(
        matches!(failure(&e), Some(rustls::Error::NoCertificatesPresented)),
        "{e}"
    );

    let client = client_config(&pki.ca(), Some(&pki.leaf("client")));
    let (c, s) = tls_pair(&poll, &server, &client, Vec::new());
    let mut ends = [End::new(c, b"x".to_vec()), End::new(s, b"y".to_vec())];
    drive(&mut poll, &mut ends, [1, 1]);
    assert_eq!((&ends[0].got[..], &ends[1].got[..]), (&b"y"[..], &b"x"[..]));
}

#[test]
fn bad_files_are_errors_naming_them() {
    let pki = Pki::new();
    let good = pki.leaf("localhost");
    let missing = CertFiles {
        certificate: pki.dir.path().join("nope.pem"),
        key: good.key.clone(),
    };
    let e = server_config(&missing, None).unwrap_err().to_string();
    assert!(e.contains("nope.pem"), "{e}");
    let swapped = CertFiles {
        certificate: good.key.clone(),
        key: good.certificate.clone(),
    };
    let e = server_config(&swapped, None).unwrap_err().to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
    // A key that is not the certificate's.
    let other = pki.leaf("other");
    let mismatched = CertFiles {
        certificate: good.certificate.clone(),
        key: other.key.clone(),
    };
    let e = server_config(&mismatched, None).unwrap_err().to_string();
    assert!(e.contains("localhost-cert.pem"), "{e}");
    let e = server_config(&good, Some(&good.key))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
}
