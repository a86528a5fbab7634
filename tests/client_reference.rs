//! Our client and codec against the REFERENCE server binary (`TEPHRA_REFERENCE_SERVER`).
//!
//! These prove wire compatibility: every client call, the error codes and texts, and the
//! connection-level rules of docs/protocol.md §6/§11 checked with raw frames. The same cases run against
//! our own server in `server_conformance.rs`.

use tephra_test_support as support;

fn server_binary() -> Option<std::path::PathBuf> {
    support::reference_binary()
}

const SERVER_VERSION: &str = "0.4.4";

include!("conformance/cases.rs");
