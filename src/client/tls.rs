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
