//! The conformance cases of `client_reference.rs`, run against OUR `tephra-server` binary: the
//! same client calls, error codes, texts and connection rules the reference server passes.

use tephra_test_support as support;

fn server_binary() -> Option<std::path::PathBuf> {
    Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")))
}

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

include!("conformance/cases.rs");
