//! TLS on a resource's peer links (`tls` of the resource): the configurations both ends of
//! a link use. The dialer is the TLS client, the node it dialed the server; TLS 1.3 only,
//! so that every link has an RFC 9266 `tls-exporter` channel binding, to which the peer
//! handshake binds its HMAC challenge-response (`tandem_wire::handshake`).
//!
//! - **`certificates`**: mutual X.509. Each node shows its `tls-certificate`; the other end
//!   checks it against the resource's `tls-ca` and checks that its subject alternative
//!   names hold the node: its `name` as a DNS name, or its `address`'s IP (either will
//!   do). The dialer knows the node it dialed and checks the server's certificate during
//!   the TLS handshake ([`NamedPeer`]); the node dialed learns who calls from the caller's
//!   `Hello` and checks the client's certificate against that node's names once TLS is up
//!   ([`PeerTls::check_client`]), refusing it with an `Error` the caller logs. The shared
//!   secret's challenge-response runs inside TLS as well.
//! - **`secret`**: no certificate files. Each node makes a throwaway self-signed
//!   certificate at start ([`rcgen`]) and accepts any peer certificate, so TLS alone
//!   authenticates nobody. What authenticates is the challenge-response over the shared
//!   secret that follows inside TLS, bound to the channel's `tls-exporter` value: both ends
//!   of one TLS connection compute the same value; a man in the middle terminating TLS
//!   towards each side has two connections with two values, so the responses it relays do
//!   not verify and neither side ever sends it data (no packet but the handshake's flows
//!   before both responses verified). This gives what TLS-PSK with a key derived from the
//!   shared secret would (rustls implements no external PSK): confidentiality and
//!   integrity against anyone without the secret. Unlike PSK, an eavesdropper learns
//!   nothing, but an active attacker may complete the TLS handshake with a node and see
//!   its challenge (as on a link in the clear; the HMAC does not reveal the secret).

use super::{load_certificates, load_key, provider, roots, tls_error};
use anyhow::{anyhow, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use tandem_config::{NodeConfig, ResourceConfig};

pub use tandem_wire::PeerTls as PeerTlsMode;

/// TLS 1.3 only: the channel binding needs it.
static VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// A resource's peer-link TLS, loaded at start (`None` with `tls = "off"`).
pub struct PeerTls {
    pub mode: PeerTlsMode,
    server: Arc<rustls::ServerConfig>,
    client: Client,
}

enum Client {
    /// The CA and this node's certificate and key: a client configuration is made for each
    /// dial, its verifier expecting the node dialed.
    Certificates {
        verifier: Arc<WebPkiServerVerifier>,
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    },
    /// Any server certificate will do (see the module's documentation).
    Secret(Arc<rustls::ClientConfig>),
}

/// The names a peer's certificate may hold for it: its node name (if it is a DNS name) and
/// its replication address's IP.
pub fn peer_names(name: &str, ip: IpAddr) -> Vec<ServerName<'static>> {
    let mut names = Vec::with_capacity(2);
    if let Ok(n) = ServerName::try_from(name.to_string()) {
        if matches!(n, ServerName::DnsName(_)) {
            names.push(n);
        }
    }
    names.push(ServerName::IpAddress(ip.into()));
    names
}

fn describe(names: &[ServerName<'_>]) -> String {
    let shown: Vec<String> = names
        .iter()
        .map(|n| match n {
            ServerName::DnsName(d) => format!("{:?}", d.as_ref()),
            ServerName::IpAddress(ip) => format!("{:?}", IpAddr::from(*ip)),
            _ => "?".into(),
        })
        .collect();
    match shown.len() {
        1 => format!("does not name {}", shown[0]),
        _ => format!("names neither {}", shown.join(" nor ")),
    }
}

impl PeerTls {
    /// Resource `cfg`'s peer TLS as node `me` runs it: the files read and checked now (a
    /// missing or bad one is an error at start naming it), or an ephemeral certificate
    /// made. `None` with TLS off.
    pub fn load(cfg: &ResourceConfig, me: &NodeConfig) -> Result<Option<PeerTls>> {
        let (server, client) = match cfg.tls {
            tandem_config::PeerTls::Off => return Ok(None),
            tandem_config::PeerTls::Certificates => {
                let ca = cfg
                    .tls_ca
                    .as_deref()
                    .context("tls = \"certificates\" needs tls-ca")?;
                let (Some(cert), Some(key)) = (&me.tls.certificate, &me.tls.key) else {
                    anyhow::bail!(
                        "tls = \"certificates\" needs tls-certificate and tls-key of node {}",
                        me.name
                    );
                };
                let roots = roots(ca).with_context(|| format!("tls-ca {}", ca.display()))?;
                let certs = load_certificates(cert)?;
                let key = load_key(key)?;
                let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.clone(),
                    provider(),
                )
                .build()
                .with_context(|| format!("tls-ca {}", ca.display()))?;
                let server = rustls::ServerConfig::builder_with_provider(provider())
                    .with_protocol_versions(VERSIONS)
                    .context("TLS provider")?
                    .with_client_cert_verifier(client_verifier)
                    .with_single_cert(certs.clone(), key.clone_key())
                    .map_err(|e| {
                        anyhow!(
                            "certificate {} with key {}: {e}",
                            cert.display(),
                            me.tls
                                .key
                                .as_ref()
                                .map_or(String::new(), |k| k.display().to_string())
                        )
                    })?;
                let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
                    .build()
                    .with_context(|| format!("tls-ca {}", ca.display()))?;
                (
                    server,
                    Client::Certificates {
                        verifier,
                        certs,
                        key,
                    },
                )
            }
            tandem_config::PeerTls::Secret => {
                // Throwaway: trusted by no one, so its names do not matter.
                let made = rcgen::generate_simple_self_signed(vec![me.name.clone()])
                    .context("making an ephemeral certificate")?;
                let cert = made.cert.der().clone();
                let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
                    .map_err(|e| anyhow!("ephemeral key: {e}"))?;
                let server = rustls::ServerConfig::builder_with_provider(provider())
                    .with_protocol_versions(VERSIONS)
                    .context("TLS provider")?
                    .with_no_client_auth()
                    .with_single_cert(vec![cert], key)
                    .context("ephemeral certificate")?;
                let client = rustls::ClientConfig::builder_with_provider(provider())
                    .with_protocol_versions(VERSIONS)
                    .context("TLS provider")?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
                    .with_no_client_auth();
                (server, Client::Secret(Arc::new(client)))
            }
        };
        let mode = match cfg.tls {
            tandem_config::PeerTls::Off => PeerTlsMode::Off,
            tandem_config::PeerTls::Certificates => PeerTlsMode::Certificates,
            tandem_config::PeerTls::Secret => PeerTlsMode::Secret,
        };
        Ok(Some(PeerTls {
            mode,
            server: Arc::new(server),
            client,
        }))
    }

    /// The server side of a connection a peer dialed.
    pub fn server(&self) -> io::Result<rustls::Connection> {
        super::server_connection(&self.server)
    }

    /// The client side of a connection we dialed to the node known by `names` (see
    /// [`peer_names`]; its certificate must hold one of them).
    pub fn client(&self, names: Vec<ServerName<'static>>) -> io::Result<rustls::Connection> {
        let first = names
            .first()
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no name for the peer"))?;
        let config = match &self.client {
            Client::Secret(c) => c.clone(),
            Client::Certificates {
                verifier,
                certs,
                key,
            } => {
                let named = NamedPeer {
                    inner: verifier.clone(),
                    names,
                };
                let c = rustls::ClientConfig::builder_with_provider(provider())
                    .with_protocol_versions(VERSIONS)
                    .map_err(tls_error)?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(named))
                    .with_client_auth_cert(certs.clone(), key.clone_key())
                    .map_err(tls_error)?;
                Arc::new(c)
            }
        };
        rustls::ClientConnection::new(config, first)
            .map(rustls::Connection::from)
            .map_err(tls_error)
    }

    /// Once TLS is up on a connection a peer dialed, whose `Hello` claimed the node known
    /// by `names`: with certificates, its certificate (which the CA signed: rustls checked
    /// that) must hold one of them. `Err` says what is wrong, for both ends' logs.
    pub fn check_client(
        &self,
        conn: &rustls::Connection,
        names: &[ServerName<'static>],
    ) -> Result<(), String> {
        let Client::Certificates { verifier, .. } = &self.client else {
            return Ok(());
        };
        let Some((leaf, intermediates)) = conn.peer_certificates().and_then(|c| c.split_first())
        else {
            return Err("it showed no certificate".into());
        };
        verify_names(verifier, leaf, intermediates, names)
            .map(|_| ())
            .map_err(|e| format!("the certificate it showed {} ({e})", describe(names)))
    }
}

/// `leaf` checked for each of `names` until one passes; the error for the first otherwise.
fn verify_names(
    inner: &WebPkiServerVerifier,
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    names: &[ServerName<'_>],
) -> Result<ServerCertVerified, rustls::Error> {
    let now = UnixTime::now();
    let mut first = None;
    for n in names {
        match inner.verify_server_cert(leaf, intermediates, n, &[], now) {
            Ok(v) => return Ok(v),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or(rustls::Error::General("no name to check".into())))
}

/// A server's certificate checked against the CA and for any of the dialed node's names.
#[derive(Debug)]
struct NamedPeer {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for NamedPeer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        verify_names(&self.inner, end_entity, intermediates, &self.names)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `tls = "secret"`: any certificate is accepted (the handshake's signature is still
/// checked, so the server holds the key of the certificate it showed); the peer is
/// authenticated by the bound challenge-response instead.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
