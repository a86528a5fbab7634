//! The `async_client` cases run against OUR `tephra-server` binary (the same cases pass against the
//! reference in `async_client_reference.rs`).

use tephra_test_support as support;

fn server_binary() -> Option<std::path::PathBuf> {
    Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")))
}

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

include!("async_client/cases.rs");

/// Connects a client with no bulk sockets through `connector` to `srv` (capped at one
/// connection) while `held` is connected there: the connect fails with the connection-limit
/// hint, the cut step named as `when`.
fn expect_refused_at_the_cap<C: tephra::client::async_client::Connector>(held: tephra::client::Client, connector: C, when: &str) {
    run(|_ex| async move {
        let err = AsyncClient::connect_with(connector, config(0)).await.err().expect("refused at the cap");
        let text = err.to_string();
        assert!(text.contains(&format!("closed the connection {when} (a server at its connection limit, server.limits.max_connections")), "{text}");
    });
    drop(held);
}

/// A server at its connection cap closes new connections without a word (docs/protocol.md §11);
/// the async client names that likely cause, as the blocking client does.
#[test]
fn a_server_at_its_connection_cap_is_named_as_a_likely_cause() {
    let Some(srv) = start(&[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")]) else { return };
    let held = tephra::client::Client::connect(srv.addr).unwrap();
    let addr = srv.addr;
    let tcp = move || async move { Async::<TcpStream>::connect(addr).await };
    expect_refused_at_the_cap(held, tcp, "before answering the Hello");
}

/// The same over TLS: the server cuts the TLS handshake.
#[test]
fn a_tls_server_at_its_connection_cap_is_named_as_a_likely_cause() {
    let Some(bin) = server_binary() else { return };
    let (srv, cert, _certs, held) = support::tls_server_at_its_connection_cap(&bin);
    let addr = srv.addr;
    let tcp = move || async move { Async::<TcpStream>::connect(addr).await };
    let config = tls::config_with_custom_ca(&cert).unwrap();
    expect_refused_at_the_cap(held, TlsConnector::new(tcp, "localhost", config).unwrap(), "during the TLS handshake");
}
