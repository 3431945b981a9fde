//! TLS on the event loops' nonblocking, edge-triggered sockets, with rustls (the `ring`
//! provider; no OpenSSL): NBD clients after `NBD_OPT_STARTTLS`, and peer links.
//!
//! A [`TlsSession`] sits inside a [`crate::listener::Stream`] once `start_tls` wrapped it;
//! the connection code keeps reading and writing plaintext through `Stream`'s `Read` and
//! `Write` and keeps its readiness rules, which this module makes hold under TLS:
//!
//! - **A read that comes back short has drained the socket.** The loops stop reading a
//!   connection when a read does not fill their buffer (the next bytes raise a new edge).
//!   So [`TlsSession::read`] fills the caller's buffer from decrypted records, reading and
//!   decrypting more until the buffer is full or the socket says `WouldBlock`: plaintext
//!   rustls still holds is never left behind a short read. The one exception, data with
//!   the end of the stream behind it, is reported by `input_pending` (the loops read again).
//! - **Ciphertext is read in large pieces.** The socket is read 64 KiB at a time into a
//!   buffer of ours and handed to rustls from there (rustls itself reads 4 KiB to one
//!   record per call), so a 1 MiB write costs a few `read`s as in the clear.
//! - **Nothing waits in rustls for an event that never comes.** Plaintext written is
//!   encrypted at once and sent as far as the socket takes it; what is left (records,
//!   handshake messages the peer's bytes called for, alerts) is `output_pending`, which the
//!   loops add to their own queued bytes when they decide to watch for room, and
//!   `Stream::write_queued` sends it when room comes.
//! - **A failed handshake or a corrupt record** is an `InvalidData` error carrying the
//!   `rustls::Error` ([`failure`] finds it, for the log line), after the alert telling the
//!   peer was sent if the socket took it. A peer that closes without close_notify is
//!   an end of stream, as a plain socket's close: NBD and the peer protocol frame their
//!   messages, and a truncated one is found there.

use crate::listener::Socket;
use anyhow::{anyhow, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Ciphertext read from the socket per call.
const RAW_LEN: usize = 64 << 10;
/// Encrypted bytes rustls may hold unsent before writes of plaintext are refused
/// (`WouldBlock`): the connection's own queue holds the rest, counted against its limits.
const SEND_LIMIT: usize = 256 << 10;

/// One connection's TLS state (see the module's documentation).
pub struct TlsSession {
    conn: rustls::Connection,
    raw: Box<[u8]>,
    raw_start: usize,
    raw_end: usize,
    /// Sent in the clear before the first TLS byte.
    clear: Vec<u8>,
    clear_pos: usize,
    /// The socket's end of stream was seen (and told to rustls).
    sock_eof: bool,
    /// Plaintext was returned with the end of the stream behind it.
    eof_next: bool,
    /// No byte of the peer's went to rustls yet, and bytes that cannot start TLS are
    /// handed back as [`NotTls`] (a peer link's refusal in the clear).
    sniff: bool,
}

impl TlsSession {
    pub(crate) fn new(mut conn: rustls::Connection, clear: Vec<u8>, received: &[u8]) -> Self {
        conn.set_buffer_limit(Some(SEND_LIMIT));
        let mut raw = vec![0u8; RAW_LEN.max(received.len())].into_boxed_slice();
        raw[..received.len()].copy_from_slice(received);
        TlsSession {
            conn,
            raw,
            raw_start: 0,
            raw_end: received.len(),
            clear,
            clear_pos: 0,
            sock_eof: false,
            eof_next: false,
            sniff: false,
        }
    }

    /// The peer's first bytes, if they cannot start TLS (neither a handshake record nor an
    /// alert), are an error carrying them ([`not_tls`]) instead of a TLS failure: a peer
    /// that refused us in the clear (its `Error` packet) is heard.
    pub(crate) fn sniff_clear(&mut self) {
        self.sniff = true;
    }

    pub fn connection(&self) -> &rustls::Connection {
        &self.conn
    }

    /// The handshake is over (both sides authenticated as configured).
    pub fn established(&self) -> bool {
        !self.conn.is_handshaking()
    }

    /// "TLSv1_3 TLS13_AES_256_GCM_SHA384" once established, for log lines.
    pub fn describe(&self) -> String {
        match (
            self.conn.protocol_version(),
            self.conn.negotiated_cipher_suite(),
        ) {
            (Some(v), Some(s)) => format!("{v:?} {:?}", s.suite()),
            _ => "handshaking".into(),
        }
    }

    /// The channel's RFC 9266 `tls-exporter` value, the same at both ends of one TLS 1.3
    /// connection and different on any other (`tandem_wire::auth::respond_bound`); `None`
    /// before the handshake is over, or under TLS 1.2.
    pub fn channel_binding(&self) -> Option<[u8; tandem_wire::auth::EXPORTER_LEN]> {
        if self.conn.is_handshaking()
            || self.conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3)
        {
            return None;
        }
        let out = [0u8; tandem_wire::auth::EXPORTER_LEN];
        self.conn
            .export_keying_material(out, tandem_wire::auth::EXPORTER_LABEL, None)
            .ok()
    }

    pub(crate) fn output_pending(&self) -> bool {
        self.clear_pos < self.clear.len() || self.conn.wants_write()
    }

    pub(crate) fn input_pending(&self) -> bool {
        self.eof_next
    }

    pub(crate) fn read(&mut self, sock: &mut Socket, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut filled = 0;
        loop {
            match self.conn.reader().read(&mut buf[filled..]) {
                Ok(0) => {
                    // close_notify: the end of the stream.
                    self.eof_next = filled > 0;
                    return Ok(filled);
                }
                Ok(n) => {
                    filled += n;
                    if filled == buf.len() {
                        return Ok(filled);
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // UnexpectedEof: the socket closed without close_notify.
                Err(_) => {
                    self.eof_next = filled > 0;
                    return Ok(filled);
                }
            }
            if self.raw_start == self.raw_end {
                if self.sock_eof {
                    return Ok(filled);
                }
                match sock.read(&mut self.raw) {
                    Ok(0) => {
                        self.sock_eof = true;
                        // An empty read tells rustls the stream ended.
                        let _ = self.conn.read_tls(&mut io::empty());
                        if let Err(e) = self.conn.process_new_packets() {
                            return partial(filled, tls_error(e));
                        }
                        continue;
                    }
                    Ok(n) => {
                        self.raw_start = 0;
                        self.raw_end = n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return partial(filled, e),
                }
            }
            if self.sniff {
                // TLS records of type handshake (22) or alert (21).
                if !matches!(self.raw[self.raw_start], 21 | 22) {
                    let bytes = self.raw[self.raw_start..self.raw_end].to_vec();
                    return partial(
                        filled,
                        io::Error::new(io::ErrorKind::InvalidData, NotTls(bytes)),
                    );
                }
                self.sniff = false;
            }
            let n = self
                .conn
                .read_tls(&mut &self.raw[self.raw_start..self.raw_end])?;
            self.raw_start += n;
            if self.raw_start == self.raw_end {
                (self.raw_start, self.raw_end) = (0, 0);
            }
            let processed = self.conn.process_new_packets();
            // Handshake messages, alerts and key updates the peer's records called for.
            let flushed = self.flush(sock);
            if let Err(e) = processed {
                return partial(filled, tls_error(e));
            }
            if let Err(e) = flushed {
                return partial(filled, e);
            }
        }
    }

    /// Takes plaintext as far as rustls has room for it (`SEND_LIMIT`), and sends. Before
    /// the handshake is over, plaintext waits in rustls, and once that is full `WouldBlock`
    /// until the peer's handshake messages came (the loops flush every connection they read
    /// from, so the rest goes then).
    pub(crate) fn write(&mut self, sock: &mut Socket, buf: &[u8]) -> io::Result<usize> {
        loop {
            let n = self.conn.writer().write(buf)?;
            let drained = self.flush(sock)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            if !drained || self.conn.is_handshaking() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Sends what is pending as far as the socket takes it: `Ok(true)` when all of it went.
    pub(crate) fn flush(&mut self, sock: &mut Socket) -> io::Result<bool> {
        while self.clear_pos < self.clear.len() {
            match sock.write(&self.clear[self.clear_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.clear_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if !self.clear.is_empty() {
            self.clear = Vec::new();
            self.clear_pos = 0;
        }
        while self.conn.wants_write() {
            match self.conn.write_tls(sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// close_notify, sent if the socket takes it now (the connection is closing).
    pub(crate) fn close(&mut self, sock: &mut Socket) {
        self.conn.send_close_notify();
        let _ = self.flush(sock);
    }
}

/// Plaintext already read goes up first; the error comes with the next read (the socket
/// or rustls says it again).
fn partial(filled: usize, e: io::Error) -> io::Result<usize> {
    if filled > 0 {
        Ok(filled)
    } else {
        Err(e)
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// What a peer sent where TLS should have begun (see `TlsSession::sniff_clear`).
#[derive(Debug)]
pub struct NotTls(pub Vec<u8>);

impl std::fmt::Display for NotTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the peer sent {} bytes that are not TLS", self.0.len())
    }
}

impl std::error::Error for NotTls {}

/// The bytes a peer sent instead of TLS, behind an I/O error of a TLS stream.
pub fn not_tls(e: &io::Error) -> Option<&[u8]> {
    Some(&e.get_ref()?.downcast_ref::<NotTls>()?.0)
}

/// The TLS failure behind an I/O error of a TLS stream (a handshake refused, a certificate
/// not trusted, a corrupt record), for a log line that says so.
pub fn failure(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The provider every configuration uses: ring (aws-lc-rs would need cmake to build).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where a server's (or node's) identity comes from: PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain, leaf first.
    pub certificate: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no PEM certificate in it", path.display());
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            anyhow!("{}: no PEM private key in it", path.display())
        }
        e => anyhow!("{}: {e}", path.display()),
    })
}

fn roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certificates(ca)? {
        roots
            .add(c)
            .map_err(|e| anyhow!("{}: not a usable CA certificate: {e}", ca.display()))?;
    }
    Ok(Arc::new(roots))
}

/// A TLS server's configuration (TLS 1.3 and 1.2): its certificate and key, and with
/// `client_ca` mutual authentication: only clients with a certificate that CA signed are
/// accepted. Every file is read and checked now, so a bad one is an error at start.
pub fn server_config(
    files: &CertFiles,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>> {
    let certs = load_certificates(&files.certificate)?;
    let key = load_key(&files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS provider")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .with_context(|| format!("client CA {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        anyhow!(
            "certificate {} with key {}: {e}",
            files.certificate.display(),
            files.key.display()
        )
    })?;
    Ok(Arc::new(config))
}

pub use tandem_frontend::nbd::TlsMode;

/// TLS for NBD clients, as configured: the mode, the certificate and key, and the CA of
/// client certificates for mutual authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdTlsConfig {
    pub mode: TlsMode,
    pub files: CertFiles,
    pub client_ca: Option<PathBuf>,
}

/// TLS for NBD clients, loaded: what a listener's connections use.
#[derive(Clone)]
pub struct NbdTls {
    pub mode: TlsMode,
    pub config: Arc<rustls::ServerConfig>,
}

impl NbdTls {
    /// Reads and checks the files (`None` with TLS off): a missing or bad file is an error
    /// now, not at the first client.
    pub fn load(cfg: &NbdTlsConfig) -> Result<Option<NbdTls>> {
        if cfg.mode == TlsMode::Off {
            return Ok(None);
        }
        Ok(Some(NbdTls {
            mode: cfg.mode,
            config: server_config(&cfg.files, cfg.client_ca.as_deref())?,
        }))
    }
}

/// The NBD TLS of a node's `[[node]]` table (`nbd-tls`, `tls-certificate`, `tls-key`,
/// `nbd-tls-client-ca`), its files read and checked; `None` with `nbd-tls` off.
pub fn node_nbd_tls(t: &tandem_config::NodeTls) -> Result<Option<NbdTls>> {
    let mode = match t.nbd {
        tandem_config::NbdTls::Off => return Ok(None),
        tandem_config::NbdTls::On => TlsMode::On,
        tandem_config::NbdTls::Require => TlsMode::Require,
    };
    let (Some(certificate), Some(key)) = (&t.certificate, &t.key) else {
        anyhow::bail!("nbd-tls needs tls-certificate and tls-key");
    };
    NbdTls::load(&NbdTlsConfig {
        mode,
        files: CertFiles {
            certificate: certificate.clone(),
            key: key.clone(),
        },
        client_ca: t.nbd_client_ca.clone(),
    })
}

/// A server side of one connection.
pub fn server_connection(config: &Arc<rustls::ServerConfig>) -> io::Result<rustls::Connection> {
    rustls::ServerConnection::new(config.clone())
        .map(rustls::Connection::from)
        .map_err(tls_error)
}

mod peer;
pub use peer::{peer_names, PeerTls, PeerTlsMode};

#[cfg(test)]
mod tests;
