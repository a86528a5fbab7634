//! Loading `tls.cert` and `tls.key` into the server's TLS 1.3 configuration, and with
//! `cluster.tls_ca` into the peer links' ([`crate::cluster::tls::PeerTls`]).

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
    /// The CA bundle cannot be read.
    #[error("cannot read cluster.tls_ca {}: {source}", path.display())]
    ReadCa {
        /// `cluster.tls_ca`.
        path: PathBuf,
        /// The error opening it.
        source: std::io::Error,
    },
    /// The CA bundle is not PEM.
    #[error("invalid cluster.tls_ca {}: {source}", path.display())]
    InvalidCa {
        /// `cluster.tls_ca`.
        path: PathBuf,
        /// The PEM reader's error.
        source: std::io::Error,
    },
    /// The CA bundle holds no certificate.
    #[error("cluster.tls_ca {} holds no certificate", path.display())]
    NoCa {
        /// `cluster.tls_ca`.
        path: PathBuf,
    },
    /// A certificate of the CA bundle cannot be a trust root.
    #[error("invalid cluster.tls_ca {}: {source}", path.display())]
    CaRejected {
        /// `cluster.tls_ca`.
        path: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// This node's own certificate would be refused by its peers: not signed by the CA (or
    /// through the chain `tls.cert` holds), expired, or not usable both to serve and to dial.
    #[error(
        "tls.cert {} would be refused by the other nodes, which check it against cluster.tls_ca {} (it must be signed by that CA, be current, and serve both as a TLS server's and a client's certificate): {source}",
        cert.display(),
        ca.display()
    )]
    NotSignedByCa {
        /// `tls.cert`.
        cert: PathBuf,
        /// `cluster.tls_ca`.
        ca: PathBuf,
        /// rustls' reason (an unknown issuer, an expired certificate, ...).
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
    let (certs, key_der) = read_pair(cert, key)?;
    for warning in crate::client::tls::server_certificate_warnings(&certs) {
        tracing::warn!(cert = %cert.display(), "{warning}");
    }
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Provider)?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| unusable_pair(e, cert, key))?;
    Ok(Some(Arc::new(cfg)))
}

/// The peer links' TLS from `tls.cert`, `tls.key` and `cluster.tls_ca`; `None` without
/// `[cluster]` or `[tls]` (validation has refused a `cluster.tls_ca` without `[tls]`, and
/// `[tls]` without `cluster.tls_ca`). The node's certificate is checked against the CA as its
/// peers will check it, so that a certificate they would refuse stops the start instead.
///
/// # Errors
/// [`TlsError`]: which file, and what is wrong with it.
pub(super) fn load_peer(settings: &Settings) -> Result<Option<crate::cluster::tls::PeerTls>, TlsError> {
    let (Some((cert, key)), Some(ca)) = (settings.tls.paths(), settings.cluster.as_ref().and_then(|c| c.tls_ca.as_deref())) else { return Ok(None) };
    let (certs, key_der) = read_pair(cert, key)?;
    let roots = read_roots(ca)?;
    let own_chain_refused = |source| TlsError::NotSignedByCa { cert: cert.into(), ca: ca.into(), source };
    check_chain(&certs, &roots).map_err(own_chain_refused)?;
    crate::cluster::tls::PeerTls::new(certs, key_der, roots).map_err(|e| unusable_pair(e, cert, key)).map(Some)
}

/// The trust roots of the PEM bundle `ca` (`cluster.tls_ca`).
fn read_roots(ca: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let file = std::fs::File::open(ca).map_err(|source| TlsError::ReadCa { path: ca.into(), source })?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(file))
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::InvalidCa { path: ca.into(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCa { path: ca.into() });
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|source| TlsError::CaRejected { path: ca.into(), source })?;
    }
    Ok(roots)
}

/// Whether the chain `certs` (its end-entity first) leads to `roots` and can serve as both a
/// TLS server and a TLS client certificate now, as the peers verify it (without the name,
/// which each peer checks against its own `cluster.peers`).
fn check_chain(certs: &[rustls::pki_types::CertificateDer<'static>], roots: &rustls::RootCertStore) -> Result<(), rustls::Error> {
    let provider = rustls::crypto::ring::default_provider();
    let (end, intermediates) = certs.split_first().ok_or(rustls::Error::NoCertificatesPresented)?;
    let now = rustls::pki_types::UnixTime::now();
    let parsed = rustls::server::ParsedCertificate::try_from(end)?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(&parsed, roots, intermediates, now, provider.signature_verification_algorithms.all)?;
    let roots = Arc::new(roots.clone());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, Arc::new(provider)).build().map_err(|e| rustls::Error::General(e.to_string()))?;
    verifier.verify_client_cert(end, intermediates, now).map(|_| ())
}

/// The certificate chain of `cert` (`tls.cert`) and the private key of `key` (`tls.key`).
fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>), TlsError> {
    let certs: Vec<_> =
        rustls_pemfile::certs(&mut std::io::BufReader::new(std::fs::File::open(cert).map_err(|source| TlsError::ReadCert { path: cert.into(), source })?))
            .collect::<Result<_, _>>()
            .map_err(|source| TlsError::InvalidCert { path: cert.into(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCert { path: cert.into() });
    }
    let key_der =
        rustls_pemfile::private_key(&mut std::io::BufReader::new(std::fs::File::open(key).map_err(|source| TlsError::ReadKey { path: key.into(), source })?))
            .map_err(|source| if encrypted(key) { TlsError::EncryptedKey { path: key.into() } } else { TlsError::InvalidKey { path: key.into(), source } })?
            .ok_or_else(|| if encrypted(key) { TlsError::EncryptedKey { path: key.into() } } else { TlsError::NoKey { path: key.into() } })?;
    Ok((certs, key_der))
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
