//! Opening Postgres connections, with TLS when the URL asks for it.
//!
//! Every Postgres connection of the workspace (the pools, the dispatcher's
//! listener, migrations, the operator CLI, xtask) is opened here, so that
//! they all read `sslmode` and `sslrootcert` from the URL the same way.
//! diesel-async's own `establish` speaks plain text only; this module opens
//! the connection with tokio-postgres over rustls and hands it to
//! diesel-async.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::AsyncPgConnection;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a connection negotiates TLS: the `sslmode` parameter of the database
/// URL, with libpq's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, plain text when it refuses. The
    /// certificate is not checked (unless `sslrootcert` is given, as for
    /// [`SslMode::Require`]). The default.
    Prefer,
    /// TLS or no connection. Encrypts but does not check who answers,
    /// unless `sslrootcert` is given: then the chain is verified as with
    /// [`SslMode::VerifyCa`].
    Require,
    /// TLS, and the server's certificate must chain to a trusted root
    /// (`sslrootcert`, or the system's roots). The host name is not checked.
    VerifyCa,
    /// As [`SslMode::VerifyCa`], and the certificate must also name the host
    /// of the URL (a DNS name, or an IP address in its subject alternative
    /// names).
    VerifyFull,
}

impl SslMode {
    /// The mode of a URL without `sslmode`: libpq's default, so that plain
    /// text servers keep working and TLS is used where the server offers it.
    pub const DEFAULT: Self = Self::Prefer;

    /// The value as written in a URL (`verify-full`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = DatabaseUrlError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(DatabaseUrlError::UnknownSslMode(other.to_owned())),
        }
    }
}

/// Why a database URL cannot be used. Found before any connection is
/// attempted, so a process can refuse to start on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatabaseUrlError {
    /// `sslmode` has a value this workspace does not know (libpq's `allow`
    /// included: it is not supported).
    #[error("unknown sslmode `{0}`: expected disable, prefer, require, verify-ca or verify-full")]
    UnknownSslMode(String),
    /// The `sslrootcert` file cannot be read.
    #[error("cannot read sslrootcert {}: {source}", .path.display())]
    RootCertUnreadable {
        /// The path as given.
        path: PathBuf,
        /// The reading error.
        source: std::io::Error,
    },
    /// The `sslrootcert` file holds no usable PEM certificate.
    #[error(
        "sslrootcert {} holds no usable PEM certificate{}",
        .path.display(),
        reason_suffix(.reason.as_deref())
    )]
    RootCertInvalid {
        /// The path as given.
        path: PathBuf,
        /// What the parser said, when it said something.
        reason: Option<String>,
    },
    /// Certificates are to be verified against the system's roots, and the
    /// system has none that rustls can use.
    #[error(
        "sslmode={mode} needs trusted root certificates: none were found on this system; set sslrootcert to a CA file"
    )]
    NoSystemRoots {
        /// The mode that needed them.
        mode: SslMode,
    },
    /// The rest of the URL does not parse (tokio-postgres' message).
    #[error("invalid database URL: {0}")]
    Invalid(String),
    /// rustls refused the TLS settings (should not happen with its own
    /// provider's defaults).
    #[error("cannot set up TLS: {0}")]
    Tls(String),
}

fn reason_suffix(reason: Option<&str>) -> String {
    reason.map(|r| format!(": {r}")).unwrap_or_default()
}

/// Where trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// The system's store (`sslrootcert=system`, or no `sslrootcert` with a
    /// verify mode).
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// `DATABASE_URL`: the URL [`PgConnectOptions::from_url`] reads.
pub const DATABASE_URL: outbox_env::Text = outbox_env::Text {
    name: "DATABASE_URL",
    default: "required",
    form: "postgres://user:password@host:port/database[?sslmode=disable|prefer|require|verify-ca|verify-full&sslrootcert=<CA file>|system]",
    meaning: "Postgres; sslmode prefer (TLS when offered, unverified) unless the URL says otherwise",
};

/// A parsed database URL, ready to open connections: the tokio-postgres
/// settings, the [`SslMode`] and the TLS client configuration it needs.
/// Parse once (at start, where a mistake should stop the process), connect
/// many times.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let options = outbox_pg::PgConnectOptions::from_url(
///     "postgres://app@db.example.com/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )?;
/// let conn = options.connect().await?;
/// # drop(conn); Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgConnectOptions {
    config: tokio_postgres::Config,
    ssl_mode: SslMode,
    tls: Option<MakeRustlsConnect>,
}

impl PgConnectOptions {
    /// Parses `url`: a `postgres://` or `postgresql://` URL whose query may
    /// carry `sslmode` (see [`SslMode`]; [`SslMode::DEFAULT`] when absent)
    /// and `sslrootcert` (a PEM file of trusted CA certificates, or
    /// `system` for the system's store), besides what tokio-postgres
    /// accepts (`application_name`, `connect_timeout`, `options`, …).
    /// A `key=value` connection string is passed to tokio-postgres as it
    /// is, which knows `disable`, `prefer` and `require` only.
    ///
    /// The root certificate file is read here, so that a wrong path fails
    /// at start rather than at the first connection.
    ///
    /// # Errors
    ///
    /// A [`DatabaseUrlError`] naming what is wrong.
    pub fn from_url(url: &str) -> Result<Self, DatabaseUrlError> {
        let (rest, ssl_mode, roots) = split_tls_parameters(url)?;
        let mut config = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| DatabaseUrlError::Invalid(describe(&e)))?;
        let ssl_mode = match ssl_mode {
            Some(mode) => mode,
            None if rest.contains("://") => SslMode::DEFAULT,
            // A key=value string: tokio-postgres read its sslmode.
            None => match config.get_ssl_mode() {
                tokio_postgres::config::SslMode::Disable => SslMode::Disable,
                tokio_postgres::config::SslMode::Require => SslMode::Require,
                _ => SslMode::Prefer,
            },
        };
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        let tls = tls_config(ssl_mode, roots.as_ref())?.map(MakeRustlsConnect::new);
        Ok(Self {
            config,
            ssl_mode,
            tls,
        })
    }

    /// The mode in force.
    #[must_use]
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// Opens one connection.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::BadConnection`] with the driver's reason (a
    /// refused connection, a failed TLS handshake or certificate check, a
    /// server that refuses TLS under `require` or stricter, …), followed by
    /// the `sslmode` in force.
    pub async fn connect(&self) -> ConnectionResult<AsyncPgConnection> {
        let mode = self.ssl_mode;
        let failed = |e: tokio_postgres::Error| {
            ConnectionError::BadConnection(format!("{} (sslmode={mode})", describe(&e)))
        };
        match &self.tls {
            None => {
                let (client, connection) = self
                    .config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(failed)?;
                AsyncPgConnection::try_from_client_and_connection(client, connection).await
            }
            Some(tls) => {
                let (client, connection) =
                    self.config.connect(tls.clone()).await.map_err(failed)?;
                AsyncPgConnection::try_from_client_and_connection(client, connection).await
            }
        }
    }
}

impl std::fmt::Debug for PgConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio-postgres' Config debug output hides the password.
        f.debug_struct("PgConnectOptions")
            .field("config", &self.config)
            .field("ssl_mode", &self.ssl_mode)
            .finish_non_exhaustive()
    }
}

/// The driver's error with its causes: tokio-postgres' own message is only
/// the kind ("error performing TLS handshake", "db error"), the reason is
/// in the chain.
fn describe(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Opens one connection to `database_url`, honouring its `sslmode` and
/// `sslrootcert` (see [`PgConnectOptions::from_url`]). Use this in place of
/// `AsyncPgConnection::establish`, which ignores both.
///
/// # Errors
///
/// [`ConnectionError::InvalidConnectionUrl`] with the [`DatabaseUrlError`]'s
/// message when the URL is unusable; otherwise as
/// [`PgConnectOptions::connect`].
pub async fn establish(database_url: &str) -> ConnectionResult<AsyncPgConnection> {
    PgConnectOptions::from_url(database_url)
        .map_err(|e| ConnectionError::InvalidConnectionUrl(e.to_string()))?
        .connect()
        .await
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query (tokio-postgres
/// knows only some modes and no root file), returning the rest of the URL.
fn split_tls_parameters(
    url: &str,
) -> Result<(String, Option<SslMode>, Option<Roots>), DatabaseUrlError> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return Ok((url.to_owned(), None, None));
    };
    let decode = |value: &str| {
        percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map(|v| v.into_owned())
            .map_err(|e| DatabaseUrlError::Invalid(format!("query is not UTF-8: {e}")))
    };
    let (mut mode, mut roots, mut kept) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match decode(key)?.as_str() {
            "sslmode" => mode = Some(decode(value)?.parse::<SslMode>()?),
            "sslrootcert" => {
                let value = decode(value)?;
                roots = Some(if value == "system" {
                    Roots::System
                } else {
                    Roots::File(PathBuf::from(value))
                });
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, mode, roots))
}

/// The crypto provider of every Postgres TLS connection: aws-lc-rs, the one
/// the rest of the workspace's rustls users (reqwest, lettre) run on.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The rustls client configuration `mode` needs, `None` for plain text.
fn tls_config(
    mode: SslMode,
    roots: Option<&Roots>,
) -> Result<Option<rustls::ClientConfig>, DatabaseUrlError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
        (SslMode::Disable, _) => return Ok(None),
        // libpq: prefer and require encrypt without checking, unless a root
        // file is given, in which case the chain is checked.
        (SslMode::Prefer | SslMode::Require, None) => {
            Arc::new(EncryptionOnly(Arc::clone(&provider)))
        }
        (SslMode::Prefer | SslMode::Require | SslMode::VerifyCa, Some(roots)) => {
            Arc::new(ChainOnly(webpki_verifier(mode, roots, &provider)?))
        }
        (SslMode::VerifyCa, None) => {
            Arc::new(ChainOnly(webpki_verifier(mode, &Roots::System, &provider)?))
        }
        (SslMode::VerifyFull, roots) => {
            webpki_verifier(mode, roots.unwrap_or(&Roots::System), &provider)?
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DatabaseUrlError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(config))
}

fn webpki_verifier(
    mode: SslMode,
    roots: &Roots,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, DatabaseUrlError> {
    let store = match roots {
        Roots::File(path) => root_file(path)?,
        Roots::System => {
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if store.is_empty() {
                return Err(DatabaseUrlError::NoSystemRoots { mode });
            }
            store
        }
    };
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), Arc::clone(provider))
        .build()
        .map_err(|e| DatabaseUrlError::Tls(e.to_string()))
}

fn root_file(path: &Path) -> Result<RootCertStore, DatabaseUrlError> {
    let pem = std::fs::read(path).map_err(|source| DatabaseUrlError::RootCertUnreadable {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |reason: Option<String>| DatabaseUrlError::RootCertInvalid {
        path: path.to_owned(),
        reason,
    };
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| invalid(Some(e.to_string())))?;
        store.add(cert).map_err(|e| invalid(Some(e.to_string())))?;
    }
    if store.is_empty() {
        return Err(invalid(None));
    }
    Ok(store)
}

/// `verify-ca`: the chain must reach a trusted root; the name is not
/// checked. webpki checks the chain before the name, so a name error means
/// the chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root file: the connection is
/// encrypted, and the certificate is accepted whoever issued it (libpq's
/// meaning of these modes). The handshake signature is still checked, so
/// the peer holds the key of the certificate it showed.
#[derive(Debug)]
struct EncryptionOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptionOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sslmode_values_parse_and_unknown_ones_are_named() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(mode.as_str().parse::<SslMode>().unwrap(), mode);
        }
        let err = PgConnectOptions::from_url("postgres://u@h/db?sslmode=allow").unwrap_err();
        assert!(matches!(&err, DatabaseUrlError::UnknownSslMode(v) if v == "allow"));
        assert!(err.to_string().contains("unknown sslmode `allow`"), "{err}");
    }

    #[test]
    fn without_sslmode_a_url_prefers_tls() {
        let options = PgConnectOptions::from_url("postgres://u@h:5432/db").unwrap();
        assert_eq!(options.ssl_mode(), SslMode::Prefer);
        assert!(options.tls.is_some());
    }

    #[test]
    fn tls_parameters_are_taken_out_and_the_rest_kept() {
        let (rest, mode, roots) = split_tls_parameters(
            "postgres://u:p@h/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p@h/db?application_name=x&connect_timeout=3"
        );
        assert_eq!(mode, Some(SslMode::VerifyFull));
        assert_eq!(roots, Some(Roots::File(PathBuf::from("/tmp/ca.pem"))));
        let (rest, _, roots) = split_tls_parameters("postgres://h/db?sslrootcert=system").unwrap();
        assert_eq!(rest, "postgres://h/db");
        assert_eq!(roots, Some(Roots::System));
    }

    #[test]
    fn disable_needs_no_tls_and_ignores_nothing_else() {
        let options =
            PgConnectOptions::from_url("postgres://u@h/db?sslmode=disable&application_name=a")
                .unwrap();
        assert_eq!(options.ssl_mode(), SslMode::Disable);
        assert!(options.tls.is_none());
    }

    #[test]
    fn a_missing_or_empty_root_file_fails_at_parse_time() {
        let err = PgConnectOptions::from_url(
            "postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap_err();
        assert!(
            matches!(err, DatabaseUrlError::RootCertUnreadable { .. }),
            "{err}"
        );
        let empty =
            std::env::temp_dir().join(format!("outbox-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = PgConnectOptions::from_url(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={}",
            empty.display()
        ))
        .unwrap_err();
        let _ = std::fs::remove_file(&empty);
        assert!(
            matches!(err, DatabaseUrlError::RootCertInvalid { .. }),
            "{err}"
        );
    }

    #[test]
    fn key_value_strings_keep_their_own_sslmode() {
        let options = PgConnectOptions::from_url("host=h user=u sslmode=disable").unwrap();
        assert_eq!(options.ssl_mode(), SslMode::Disable);
        let options = PgConnectOptions::from_url("host=h user=u").unwrap();
        assert_eq!(options.ssl_mode(), SslMode::Prefer);
    }

    #[test]
    fn other_url_mistakes_are_invalid() {
        let err = PgConnectOptions::from_url("postgres://h/db?nonsense=1").unwrap_err();
        assert!(matches!(err, DatabaseUrlError::Invalid(_)), "{err}");
        assert!(
            err.to_string().contains("unknown option `nonsense`"),
            "{err}"
        );
    }
}
