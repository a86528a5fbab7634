//! Ready-made rustls client configurations for [`Client::connect_tls`](super::Client::connect_tls)
//! (spec §3.5). Both use the `ring` crypto provider, rustls' safe default protocol versions
//! (the reference server speaks TLS 1.3 only), no ALPN and no client certificate.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

fn build(roots: RootCertStore) -> io::Result<Arc<ClientConfig>> {
    let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A configuration trusting the platform's root certificates.
///
/// # Errors
/// `NotFound` when no usable root certificate was found; `Other` if rustls refuses the
/// provider setup.
pub fn config_with_native_roots() -> io::Result<Arc<ClientConfig>> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map_or_else(|| "none installed".to_owned(), |e| e.to_string());
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no native root certificates found ({why})")));
    }
    build(roots)
}

/// A configuration trusting exactly the PEM certificates in `ca_pem` (for example a
/// self-signed server certificate).
///
/// # Errors
/// The file's I/O error; `InvalidData` when it holds no certificate or one that rustls
/// rejects.
pub fn config_with_custom_ca(ca_pem: &Path) -> io::Result<Arc<ClientConfig>> {
    let mut reader = BufReader::new(File::open(ca_pem)?);
    let certs = rustls_pemfile::certs(&mut reader).collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("no PEM certificate in {}", ca_pem.display())));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    build(roots)
}

/// True when a TLS handshake failed because the server's first bytes were not a TLS record
/// (rustls sees an invalid content type): the server, or that port, speaks plaintext.
pub fn answered_without_tls(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| matches!(r, rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)))
}

/// What clients that verify certificates as webpki does (rustls, the published
/// `tephra-client`, our `tephra` CLI) say of a server presenting `chain` (its end-entity
/// certificate first, as in `tls.cert`) when they trust that very file: the warning to give
/// when they refuse it as a CA certificate (`basicConstraints` CA:TRUE, what
/// `openssl req -x509` makes without `-addext basicConstraints=critical,CA:FALSE`), or `None`.
/// The name in the certificate and the rest of the chain are not judged. A certificate
/// outside its validity dates gives `None` whatever its basicConstraints: webpki reports the
/// dates first. OpenSSL- and Go-based clients accept a CA certificate as a server's own, so
/// the server still serves one (as the reference does).
pub fn ca_used_as_server_certificate(chain: &[rustls::pki_types::CertificateDer<'static>]) -> Option<String> {
    let end_entity = chain.first()?;
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(chain.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    use rustls::client::danger::ServerCertVerifier;
    let verdict = verifier.verify_server_cert(end_entity, &chain[1..], &name, &[], rustls::pki_types::UnixTime::now());
    // webpki's CaUsedAsEndEntity reaches rustls's callers only inside its catch-all
    // `CertificateError::Other`, so its name is all there is to match (as in `tls_hint`).
    match verdict {
        Err(e) if format!("{e:?}").contains("CaUsedAsEndEntity") => Some(
            "tls.cert is a CA certificate (basicConstraints CA:TRUE): clients that verify with rustls/webpki (the tephra-client crate, the tephra CLI) refuse it as a server's own certificate; give the server a certificate issued by a CA, or make a self-signed one with -addext basicConstraints=critical,CA:FALSE".to_owned(),
        ),
        _ => None,
    }
}
