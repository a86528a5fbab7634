//! Our `tephra-server` with TLS and tokens: rotated tokens, configurations that refuse to start
//! (tokens without TLS, half-configured or unreadable certificates), and the certificate
//! warnings. Seed "Transport security and authentication".

use tephra_test_support as support;
mod server_util;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use server_util::*;
use support::{ev, run_to_exit, Server};
use tephra::client::{tls, Client};
use tephra::proto::{self, Request};
use tephra::{Position, Query};

#[test]
fn tls_with_rotated_tokens() {
    let (toml, cert, _certs) = support::tls_config_with_tokens(&["old-secret", "new-secret"]);
    let srv = Server::start_with(&bin(), &[], Some(&toml));
    assert!(srv.log().contains("tls=true"), "{}", srv.log());
    let config = tls::config_with_custom_ca(&cert).unwrap();
    // Both rotation tokens work, over TLS, for real requests.
    for (i, token) in ["old-secret", "new-secret"].into_iter().enumerate() {
        let mut c = Client::connect_tls_with(srv.addr, "localhost", config.clone(), Some(token)).unwrap();
        let r = c.append(vec![ev("E", &["k:1"], token.as_bytes())], None).unwrap();
        assert_eq!(r.first, Position(i as u64 + 1));
    }
    // A wrong, empty or missing token fails the Hello with PermissionDenied.
    for token in [Some("wrong"), Some(""), None] {
        let err = Client::connect_tls_with(srv.addr, "localhost", config.clone(), token).expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{token:?}: {err}");
    }
    // A plaintext client against the TLS port fails the Hello.
    let err = Client::connect_with(srv.addr, Some("new-secret")).expect_err("plaintext must fail");
    assert_ne!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    // At the byte level: a plaintext Hello frame never gets a HelloAck.
    let mut raw = TcpStream::connect(srv.addr).unwrap();
    let mut hello = Vec::new();
    proto::encode_frame(&Request::hello(1, Some("new-secret")), u32::MAX, &mut hello).unwrap();
    raw.write_all(&hello).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    raw.read_to_end(&mut got).expect("the server closes the connection");
    // Nothing but a TLS alert record (content type 21, RFC 8446 §5.1), which our clients and
    // healthcheck recognise to say the server speaks TLS; the reference sends nothing.
    assert!(
        got.is_empty() || (got[0] == 21 && got.len() <= 64),
        "a plaintext Hello to the TLS port got {} bytes back: {:02x?}",
        got.len(),
        &got[..got.len().min(16)]
    );
    // A TLS client against a plaintext server fails too.
    let plain = Server::start(&bin(), &[]);
    assert!(Client::connect_tls_with(plain.addr, "localhost", config.clone(), None).is_err());
    // The data went through: two events, and stats over TLS.
    let mut c = Client::connect_tls_with(srv.addr, "localhost", config, Some("old-secret")).unwrap();
    let (all, _) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(all.iter().map(|e| e.event.data().to_vec()).collect::<Vec<_>>(), [b"old-secret".to_vec(), b"new-secret".to_vec()]);
}

#[test]
fn tokens_without_tls_refuse_to_start_unless_insecure_is_allowed() {
    let tokens = "[[auth.tokens]]\ntoken = \"s3cret\"\n";
    expect_config_error(Some(tokens), &[], "auth.tokens require tls; set tls.cert and tls.key, or auth.allow_insecure = true");
    // allow_insecure from the file or from the environment lets it start, and tokens apply.
    let srv = Server::start_with(&bin(), &[("TEPHRA__AUTH__ALLOW_INSECURE", "true")], Some(tokens));
    assert!(Client::connect_with(srv.addr, Some("s3cret")).is_ok());
    assert_eq!(Client::connect(srv.addr).err().unwrap().kind(), io::ErrorKind::PermissionDenied);
    let srv = Server::start_with(&bin(), &[], Some(&format!("[auth]\nallow_insecure = true\n{tokens}")));
    assert!(Client::connect_with(srv.addr, Some("s3cret")).is_ok());
    // The start says that tokens are required, and how many (as the reference's does), never
    // which.
    assert!(srv.log_shows("requiring bearer-token authentication tokens=1", Duration::from_secs(5)), "{}", srv.log());
    assert!(!srv.log().contains("s3cret"), "{}", srv.log());
    // An empty token is refused at start-up too.
    expect_config_error(Some("[auth]\nallow_insecure = true\n[[auth.tokens]]\ntoken = \"\"\n"), &[], "auth.tokens entries must have a non-empty token");
}

#[test]
fn half_configured_or_unreadable_tls_refuses_to_start() {
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key) = support::self_signed(certs.path());
    let c = cert.display().to_string();
    let k = key.display().to_string();
    expect_config_error(Some(&format!("[tls]\ncert = {c:?}\n")), &[], "tls.cert and tls.key must be set together");
    expect_config_error(Some(&format!("[tls]\nkey = {k:?}\n")), &[], "tls.cert and tls.key must be set together");
    expect_config_error(None, &[("TEPHRA__TLS__CERT", &c)], "tls.cert and tls.key must be set together");
    // Both set but unusable: a start-up error (exit 1), not a server without TLS.
    let missing = certs.path().join("missing.pem").display().to_string();
    let garbage = certs.path().join("garbage.pem");
    std::fs::write(&garbage, "not a pem file\n").unwrap();
    let garbage = garbage.display().to_string();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other_key = certs.path().join("other-key.pem");
    std::fs::write(&other_key, other.key_pair.serialize_pem()).unwrap();
    let other_key = other_key.display().to_string();
    // The same certificate marked X.509 v1 (the TBS's explicit version 2, "v3", set to 0),
    // what `openssl x509 -req` makes without -extfile: rustls refuses it, and the error says
    // so rather than that the key does not match (review).
    let v1 = certs.path().join("v1.pem");
    let mut der = pem_body(&std::fs::read_to_string(&cert).unwrap());
    assert_eq!(der[8..13], [0xa0, 0x03, 0x02, 0x01, 0x02], "rcgen's layout changed: {:02x?}", &der[..16]);
    der[12] = 0;
    use base64::Engine as _;
    std::fs::write(&v1, format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", base64::engine::general_purpose::STANDARD.encode(&der)))
        .unwrap();
    let v1 = v1.display().to_string();
    // Passphrase-protected keys, in PKCS#8 and in OpenSSL's legacy form (the bodies need not
    // decrypt: the PEM reader skips both as no key).
    let body = base64::engine::general_purpose::STANDARD.encode([7u8; 96]);
    let encrypted = certs.path().join("encrypted.pem");
    std::fs::write(&encrypted, format!("-----BEGIN ENCRYPTED PRIVATE KEY-----\n{body}\n-----END ENCRYPTED PRIVATE KEY-----\n")).unwrap();
    let encrypted = encrypted.display().to_string();
    let legacy = certs.path().join("legacy.pem");
    std::fs::write(&legacy, format!("-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00112233445566778899AABBCCDDEEFF\n\n{body}\n-----END EC PRIVATE KEY-----\n")).unwrap();
    let legacy = legacy.display().to_string();
    let encrypted_msg = format!("tls.key {encrypted} is encrypted (passphrase-protected)");
    let legacy_msg = format!("tls.key {legacy} is encrypted (passphrase-protected)");
    let cert_only_msg = format!("tls.key {c} holds no private key");
    for (cert, key, want) in [
        (&c, &encrypted, encrypted_msg.as_str()),
        (&c, &legacy, legacy_msg.as_str()),
        (&c, &c, cert_only_msg.as_str()),
        (&missing, &k, "tls.cert"),
        (&c, &missing, "tls.key"),
        (&garbage, &k, "tls.cert"),
        (&c, &garbage, "tls.key"),
        (&c, &other_key, "do not match: the key is not the certificate's"),
        (&v1, &k, "it is an X.509 v1 certificate (as `openssl x509 -req` makes without -extfile)"),
    ] {
        let out = run_to_exit(&bin(), &["--bind", "127.0.0.1:0"], &[("TEPHRA__TLS__CERT", cert), ("TEPHRA__TLS__KEY", key)], None, Duration::from_secs(20));
        assert_eq!(out.code, Some(1), "{cert} {key}: {out:?}");
        assert!(out.stderr.contains(want), "{cert} {key}: {}", out.stderr);
        assert!(!out.stdout.contains("listening addr="), "{out:?}");
    }
}

/// The DER bytes of the one PEM block in `pem`.
fn pem_body(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body).unwrap()
}

/// A CA certificate as `tls.cert` (what `openssl req -x509` makes without
/// `basicConstraints=critical,CA:FALSE`): the server starts and serves it, as the reference
/// does (OpenSSL- and Go-based clients accept it), but warns at start that rustls-based
/// clients refuse it, and `--healthcheck` passes with the same warning on stderr (review: both
/// were silent while every rustls client failed its handshake).
#[test]
fn a_ca_certificate_as_the_servers_own_is_warned_of() {
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert_path, key_path) = support::ca_self_signed(certs.path());
    let toml = support::tls_toml(&cert_path, &key_path);
    let srv = Server::start_with(&bin(), &[], Some(&toml));
    let warned: Vec<String> = srv.log().lines().filter(|l| l.contains("tls.cert is a CA certificate")).map(str::to_owned).collect();
    assert_eq!(warned.len(), 1, "{}", srv.log());
    assert!(warned[0].contains("WARN") && warned[0].contains("basicConstraints=critical,CA:FALSE"), "{}", warned[0]);
    let out = healthcheck(&srv.addr.to_string(), Some(&toml));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("healthcheck: warning: tls.cert is a CA certificate"), "{}", out.stderr);
}

/// An expired `tls.cert` is still served (as the reference does), but the server warns at
/// start and `--healthcheck` passes with the same warning on stderr, naming the date: every
/// verifying client refuses it.
#[test]
fn an_expired_server_certificate_is_warned_of() {
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2001, 1, 1);
    params.not_after = rcgen::date_time_ymd(2002, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let (cert_path, key_path) = (certs.path().join("old.pem"), certs.path().join("old-key.pem"));
    std::fs::write(&cert_path, params.self_signed(&key).unwrap().pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let toml = support::tls_toml(&cert_path, &key_path);
    let srv = Server::start_with(&bin(), &[], Some(&toml));
    let log = srv.log();
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("tls.cert expired at 2002-01-01T00:00:00Z")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("WARN"), "{}", warned[0]);
    let out = healthcheck(&srv.addr.to_string(), Some(&toml));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("healthcheck: warning: tls.cert expired at 2002-01-01T00:00:00Z"), "{}", out.stderr);
}
