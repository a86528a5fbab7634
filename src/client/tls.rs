//! Ready-made rustls client configurations for [`Client::connect_tls`](super::Client::connect_tls)
//! (docs/protocol.md §13.4). Both use the `ring` crypto provider, rustls' safe default protocol versions
//! (the reference server speaks TLS 1.3 only), no ALPN and no client certificate.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

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
/// certificate first, as in `tls.cert`) when they trust that very file: one warning per
/// reason they refuse it, empty when they accept it. The reasons judged:
/// - outside its validity dates (`notAfter` passed, or `notBefore` still ahead, each named as
///   a UTC date), which every verifying client refuses;
/// - a CA certificate (`basicConstraints` CA:TRUE, what `openssl req -x509` makes without
///   `-addext basicConstraints=critical,CA:FALSE`), judged at a time inside its validity
///   window so an expired CA certificate gets both warnings (webpki reports the dates first).
///   OpenSSL- and Go-based clients accept one, so the server still serves it, as the
///   reference does.
///
/// The name in the certificate and the rest of the chain are not judged.
pub fn server_certificate_warnings(chain: &[rustls::pki_types::CertificateDer<'static>]) -> Vec<String> {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::UnixTime;
    use rustls::CertificateError as C;
    let mut warnings = Vec::new();
    let Some(end_entity) = chain.first() else { return warnings };
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(chain.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(verifier) = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build() else { return warnings };
    let Ok(name) = rustls::pki_types::ServerName::try_from("localhost") else { return warnings };
    let date = |t: UnixTime| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t.as_secs())).to_string();
    let mut at = UnixTime::now();
    // A date verdict moves the judging time to the certificate's own bound, so the checks
    // after the dates (basicConstraints) still run; two moves cover notBefore and notAfter.
    for _ in 0..3 {
        match verifier.verify_server_cert(end_entity, &chain[1..], &name, &[], at) {
            Err(rustls::Error::InvalidCertificate(C::ExpiredContext { not_after, .. })) if warnings.len() < 2 => {
                warnings.push(format!("tls.cert expired at {}: clients that verify certificates refuse it; renew it", date(not_after)));
                at = not_after;
            }
            Err(rustls::Error::InvalidCertificate(C::NotValidYetContext { not_before, .. })) if warnings.len() < 2 => {
                warnings.push(format!(
                    "tls.cert is not valid until {}: clients that verify certificates refuse it until then (is this host's clock right?)",
                    date(not_before)
                ));
                at = not_before;
            }
            // webpki's InvalidCertValidity (notBefore after notAfter) reaches rustls's callers
            // as a bare `Expired`, without dates (review: such a certificate drew no warning).
            Err(rustls::Error::InvalidCertificate(C::Expired)) if warnings.is_empty() => {
                warnings.push("tls.cert is never valid (its notBefore is after its notAfter): clients that verify certificates refuse it; renew it".to_owned());
                break;
            }
            // webpki's CaUsedAsEndEntity reaches rustls's callers only inside its catch-all
            // `CertificateError::Other`, so its name is all there is to match (as in `tls_hint`).
            Err(e) if format!("{e:?}").contains("CaUsedAsEndEntity") => {
                warnings.push(
                    "tls.cert is a CA certificate (basicConstraints CA:TRUE): clients that verify with rustls/webpki (the tephra-client crate, the tephra CLI) refuse it as a server's own certificate; give the server a certificate issued by a CA, or make a self-signed one with -addext basicConstraints=critical,CA:FALSE".to_owned(),
                );
                break;
            }
            _ => break,
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::server_certificate_warnings;

    /// A self-signed `localhost` certificate valid from `from` to `until` (years, 1 January),
    /// a CA certificate when `ca`.
    fn cert(ca: bool, from: i32, until: i32) -> Vec<rustls::pki_types::CertificateDer<'static>> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        if ca {
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        vec![params.self_signed(&key).unwrap().der().clone()]
    }

    #[test]
    fn a_certificate_in_date_and_not_a_ca_draws_no_warning() {
        assert_eq!(server_certificate_warnings(&cert(false, 2020, 4000)), Vec::<String>::new());
        assert_eq!(server_certificate_warnings(&[]), Vec::<String>::new());
    }

    #[test]
    fn a_ca_certificate_is_warned_of_in_and_out_of_its_dates() {
        let w = server_certificate_warnings(&cert(true, 2020, 4000));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("tls.cert is a CA certificate"), "{w:?}");
        // Out of date: both reasons (webpki reports the dates first; the CA check was lost).
        let w = server_certificate_warnings(&cert(true, 2001, 2002));
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(w[0], "tls.cert expired at 2002-01-01T00:00:00Z: clients that verify certificates refuse it; renew it");
        assert!(w[1].starts_with("tls.cert is a CA certificate"), "{w:?}");
        let w = server_certificate_warnings(&cert(true, 3999, 4000));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("tls.cert is not valid until 3999-01-01T00:00:00Z: "), "{w:?}");
        assert!(w[1].starts_with("tls.cert is a CA certificate"), "{w:?}");
    }

    #[test]
    fn a_certificate_whose_dates_are_inverted_is_warned_of() {
        for ca in [false, true] {
            let w = server_certificate_warnings(&cert(ca, 2030, 2020));
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].starts_with("tls.cert is never valid (its notBefore is after its notAfter)"), "{w:?}");
        }
    }

    #[test]
    fn an_end_entity_certificate_out_of_its_dates_is_warned_of_once() {
        let w = server_certificate_warnings(&cert(false, 2001, 2002));
        assert_eq!(w, vec!["tls.cert expired at 2002-01-01T00:00:00Z: clients that verify certificates refuse it; renew it".to_owned()]);
        let w = server_certificate_warnings(&cert(false, 3999, 4000));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("(is this host's clock right?)"), "{w:?}");
    }
}
