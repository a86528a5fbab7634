//! Loading `tls.cert` and `tls.key` into the server's TLS 1.3 configuration.

use crate::config::Settings;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why `tls.cert` and `tls.key` could not be loaded, each saying which file and what is wrong
/// with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read.
    #[error("cannot read tls.cert {}: {source}", path.display())]
    ReadCert {
        /// `tls.cert`.
        path: PathBuf,
        /// The error opening it.
        source: std::io::Error,
    },
    /// The certificate file is not PEM.
    #[error("invalid tls.cert {}: {source}", path.display())]
    InvalidCert {
        /// `tls.cert`.
        path: PathBuf,
        /// The PEM reader's error.
        source: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("tls.cert {} holds no certificate", path.display())]
    NoCert {
        /// `tls.cert`.
        path: PathBuf,
    },
    /// The key file cannot be read.
    #[error("cannot read tls.key {}: {source}", path.display())]
    ReadKey {
        /// `tls.key`.
        path: PathBuf,
        /// The error opening it.
        source: std::io::Error,
    },
    /// The key is passphrase-protected (PKCS#8 `ENCRYPTED PRIVATE KEY`, or OpenSSL's legacy
    /// `Proc-Type: 4,ENCRYPTED` header).
    #[error("tls.key {} is encrypted (passphrase-protected), which the server cannot read: give it the key unencrypted, e.g. `openssl pkey -in {} -out key.pem`", path.display(), path.display())]
    EncryptedKey {
        /// `tls.key`.
        path: PathBuf,
    },
    /// The key file is not PEM.
    #[error("invalid tls.key {}: {source}", path.display())]
    InvalidKey {
        /// `tls.key`.
        path: PathBuf,
        /// The PEM reader's error.
        source: std::io::Error,
    },
    /// The key file holds no private key.
    #[error("tls.key {} holds no private key", path.display())]
    NoKey {
        /// `tls.key`.
        path: PathBuf,
    },
    /// The crypto provider refused TLS 1.3 (not expected with ring).
    #[error("{0}")]
    Provider(rustls::Error),
    /// The key is not the certificate's.
    #[error("tls.cert {} and tls.key {} do not match: the key is not the certificate's", cert.display(), key.display())]
    Mismatch {
        /// `tls.cert`.
        cert: PathBuf,
        /// `tls.key`.
        key: PathBuf,
    },
    /// An X.509 v1 certificate (as `openssl x509 -req` makes without `-extfile`).
    #[error("invalid tls.cert {}: it is an X.509 v1 certificate (as `openssl x509 -req` makes without -extfile); TLS here needs a v3 certificate", cert.display())]
    CertV1 {
        /// `tls.cert`.
        cert: PathBuf,
    },
    /// A certificate rustls cannot use for another reason.
    #[error("invalid tls.cert {}: {reason:?}", cert.display())]
    CertRejected {
        /// `tls.cert`.
        cert: PathBuf,
        /// rustls' reason.
        reason: rustls::CertificateError,
    },
    /// A key of a kind rustls cannot sign with, or another refusal of the pair.
    #[error("cannot use tls.key {} with tls.cert {}: {source}", key.display(), cert.display())]
    Unusable {
        /// `tls.cert`.
        cert: PathBuf,
        /// `tls.key`.
        key: PathBuf,
        /// rustls' error.
        source: rustls::Error,
    },
}

/// The server's TLS configuration from `tls.cert` and `tls.key`, `None` when TLS is off. Warns
/// of a certificate that rustls-based clients will refuse (a CA certificate, an expired one).
///
/// # Errors
/// [`TlsError`]: which file, and what is wrong with it.
pub(super) fn load(settings: &Settings) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
    let Some((cert, key)) = settings.tls.paths() else { return Ok(None) };
    let certs: Vec<_> =
        rustls_pemfile::certs(&mut std::io::BufReader::new(std::fs::File::open(cert).map_err(|source| TlsError::ReadCert { path: cert.into(), source })?))
            .collect::<Result<_, _>>()
            .map_err(|source| TlsError::InvalidCert { path: cert.into(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCert { path: cert.into() });
    }
    for warning in crate::client::tls::server_certificate_warnings(&certs) {
        tracing::warn!(cert = %cert.display(), "{warning}");
    }
    let key_der =
        rustls_pemfile::private_key(&mut std::io::BufReader::new(std::fs::File::open(key).map_err(|source| TlsError::ReadKey { path: key.into(), source })?))
            .map_err(|source| if encrypted(key) { TlsError::EncryptedKey { path: key.into() } } else { TlsError::InvalidKey { path: key.into(), source } })?
            .ok_or_else(|| if encrypted(key) { TlsError::EncryptedKey { path: key.into() } } else { TlsError::NoKey { path: key.into() } })?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Provider)?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| unusable_pair(e, cert, key))?;
    Ok(Some(Arc::new(cfg)))
}

/// Whether the key file `key` is passphrase-protected: a PKCS#8 `ENCRYPTED PRIVATE KEY`
/// (which the PEM reader skips as no key) or OpenSSL's legacy `Proc-Type: 4,ENCRYPTED` header
/// (which it fails to decode), named as such (new-user review: "holds no private key").
fn encrypted(key: &Path) -> bool {
    let text = std::fs::read(key).unwrap_or_default();
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED")
}

/// Why rustls would not take `tls.cert` with `tls.key`: the key is not the certificate's, the
/// certificate is not one rustls can use (an X.509 v1 certificate, which `openssl x509 -req`
/// makes without `-extfile`, named so; the reference refuses one too), or the key is of a kind
/// it cannot sign with (review: every case said "do not match").
fn unusable_pair(e: rustls::Error, cert: &Path, key: &Path) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::Mismatch { cert: cert.into(), key: key.into() },
        rustls::Error::InvalidCertificate(c) if format!("{c:?}").contains("UnsupportedCertVersion") => TlsError::CertV1 { cert: cert.into() },
        rustls::Error::InvalidCertificate(reason) => TlsError::CertRejected { cert: cert.into(), reason },
        source => TlsError::Unusable { cert: cert.into(), key: key.into(), source },
    }
}
