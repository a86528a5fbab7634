//! Certificates for TLS tests: self-signed `localhost` certificates written as PEM files, the
//! `[tls]` table naming them, a TLS server held at its connection cap, and a CA that signs
//! node certificates ([`TestCa`]).

use std::path::{Path, PathBuf};

use crate::server::Server;

/// A configuration accepting the tokens `s3cret` and `next` without TLS
/// (`auth.allow_insecure`).
pub const AUTH_TOML: &str = r#"
[auth]
allow_insecure = true

[[auth.tokens]]
token = "s3cret"

[[auth.tokens]]
token = "next"
"#;

/// A self-signed certificate for `localhost`, written as `cert.pem` and `key.pem` into `dir`.
pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

/// A self-signed CA certificate (`basicConstraints` CA:TRUE, what `openssl req -x509` makes by
/// default) for `localhost`, written as `ca.pem` and `ca-key.pem` into `dir`.
pub fn ca_self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let ca = params.self_signed(&key).unwrap();
    let (cert, key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    std::fs::write(&cert, ca.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert, key_path)
}

/// A `[tls]` table naming `cert` and `key`.
pub fn tls_toml(cert: &Path, key: &Path) -> String {
    format!("[tls]\ncert = {:?}\nkey = {:?}\n", cert.display().to_string(), key.display().to_string())
}

/// A TLS configuration accepting `tokens`, with a fresh self-signed `localhost` certificate:
/// the TOML, the certificate's path, and the directory holding the certificate and its key
/// (keep it alive).
pub fn tls_config_with_tokens(tokens: &[&str]) -> (String, PathBuf, tempfile::TempDir) {
    let certs = crate::scratch_dir();
    let (cert, key) = self_signed(certs.path());
    let mut toml = tls_toml(&cert, &key);
    for t in tokens {
        toml.push_str(&format!("\n[[auth.tokens]]\ntoken = {t:?}\n"));
    }
    (toml, cert, certs)
}

/// `binary` serving TLS (a self-signed `localhost` certificate) and capped at one connection,
/// which a client holds: its Hello was answered, so the server has accepted and counted it.
/// Returns the server, the certificate's path, the directory holding it (keep it alive) and
/// the held client.
pub fn tls_server_at_its_connection_cap(binary: &Path) -> (Server, PathBuf, tempfile::TempDir, tephra::client::Client) {
    let certs = crate::scratch_dir();
    let (cert, key) = self_signed(certs.path());
    let srv = Server::start_with(binary, &[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")], Some(&tls_toml(&cert, &key)));
    let config = tephra::client::tls::config_with_custom_ca(&cert).expect("trust the certificate");
    let held = tephra::client::Client::connect_tls_with(srv.addr, "localhost", config, None).expect("the one connection");
    (srv, cert, certs, held)
}

/// A certificate authority for tests: a self-signed CA certificate that signs node
/// certificates. The node certificates carry no extended key usage, so each serves both as a
/// TLS server's and as a TLS client's (as a node's does on the peer links).
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    /// A fresh CA whose certificate's common name is `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate valid for `names` (DNS names; IP addresses become IP address names),
    /// signed by this CA, and its private key: `(certificate PEM, key PEM)`.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes this CA's certificate as `ca.pem` and a certificate for `names` it signed as
    /// `cert.pem` with its key as `key.pem`, into `dir`: their paths `(ca, cert, key)`.
    pub fn write(&self, dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        let (cert_pem, key_pem) = self.issue(names);
        let (ca, cert, key) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&ca, self.pem()).unwrap();
        std::fs::write(&cert, cert_pem).unwrap();
        std::fs::write(&key, key_pem).unwrap();
        (ca, cert, key)
    }
}
