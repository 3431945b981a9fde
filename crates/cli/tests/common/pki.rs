//! Test certificates (rcgen): a CA written as PEM and the leaf certificates it signs, for
//! NBD clients and servers (`tls.rs`) and for nodes' peer links (`peer_tls.rs`).

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub use rcgen::ExtendedKeyUsagePurpose as Usage;

/// A certificate authority whose files live in `dir`.
pub struct TestCa {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    ca_file: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/ca_file`.
    pub fn new(dir: &Path, name: &str, ca_file: &str) -> TestCa {
        fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tandem test CA {name}"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_file = dir.join(ca_file);
        fs::write(&ca_file, ca.pem()).unwrap();
        TestCa {
            ca,
            dir: dir.to_path_buf(),
            ca_file,
        }
    }

    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A certificate signed by this CA with `names` as its subject alternative names and
    /// `usages` as its extended key usages, as `dir/<file>-cert.pem` and
    /// `dir/<file>-key.pem`: (certificate, key).
    pub fn leaf(&self, file: &str, names: &[&str], usages: &[Usage]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tandem test {file}"));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages.to_vec();
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

/// Server and client use at once (a node's certificate on its peer links).
pub const BOTH: [ExtendedKeyUsagePurpose; 2] = [
    ExtendedKeyUsagePurpose::ServerAuth,
    ExtendedKeyUsagePurpose::ClientAuth,
];
