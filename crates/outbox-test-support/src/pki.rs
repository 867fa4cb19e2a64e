//! [`TestPki`]: a private certificate authority and a server certificate
//! for TLS tests, made fresh in memory and written to a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA certificate, a server certificate it signed for `localhost` and
/// `127.0.0.1`, the server's key, and a second CA that signed nothing (the
/// "wrong root" of negative tests), as PEM files in a directory.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate that signed the server certificate.
    pub ca_file: PathBuf,
    /// A CA certificate that signed nothing here.
    pub other_ca_file: PathBuf,
    /// The server certificate.
    pub cert_file: PathBuf,
    /// The server's private key (PKCS#8, mode 0600).
    pub key_file: PathBuf,
}

impl TestPki {
    /// Makes the certificates and writes them as `ca.pem`, `other-ca.pem`,
    /// `server.crt` and `server.key` under `dir` (created if missing).
    ///
    /// # Panics
    ///
    /// When a certificate cannot be made or written.
    #[must_use]
    pub fn create(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {dir:?}: {e}"));
        let (ca_params, ca_key) = ca("outbox test CA");
        let ca_pem = ca_params
            .self_signed(&ca_key)
            .unwrap_or_else(|e| panic!("cannot sign the test CA: {e}"))
            .pem();
        let (other_params, other_key) = ca("outbox unrelated CA");
        let other_pem = other_params
            .self_signed(&other_key)
            .unwrap_or_else(|e| panic!("cannot sign the second CA: {e}"))
            .pem();

        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap_or_else(|e| panic!("bad server names: {e}"));
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().unwrap_or_else(|e| panic!("no key: {e}"));
        let issuer = Issuer::new(ca_params, ca_key);
        let server_pem = server
            .signed_by(&server_key, &issuer)
            .unwrap_or_else(|e| panic!("cannot sign the server certificate: {e}"))
            .pem();

        let pki = Self {
            ca_file: dir.join("ca.pem"),
            other_ca_file: dir.join("other-ca.pem"),
            cert_file: dir.join("server.crt"),
            key_file: dir.join("server.key"),
        };
        for (path, text) in [
            (&pki.ca_file, ca_pem),
            (&pki.other_ca_file, other_pem),
            (&pki.cert_file, server_pem),
            (&pki.key_file, server_key.serialize_pem()),
        ] {
            std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
        }
        // Postgres refuses a key file others can read.
        set_mode(&pki.key_file, 0o600);
        pki
    }
}

fn ca(name: &str) -> (CertificateParams, KeyPair) {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("bad CA: {e}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("no key: {e}"));
    (params, key)
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("cannot chmod {path:?}: {e}"));
}
