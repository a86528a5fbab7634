//! The pipelined `AsyncClient` against the REFERENCE server (`TEPHRA_REFERENCE_SERVER`).
//! The cases live in `async_client/cases.rs`; to run them against another server binary, copy
//! this file and change `server_binary` and `SERVER_VERSION`.

use tephra_test_support as support;

fn server_binary() -> Option<std::path::PathBuf> {
    support::reference_binary()
}

const SERVER_VERSION: &str = "0.4.4";

include!("async_client/cases.rs");
