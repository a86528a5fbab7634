//! The `async_client` cases run against OUR `tephra-server` binary (the same cases pass against the
//! reference in `async_client_reference.rs`).

mod support;

fn server_binary() -> Option<std::path::PathBuf> {
    Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")))
}

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

include!("async_client/cases.rs");
