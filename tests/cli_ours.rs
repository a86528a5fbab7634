//! The `cli` cases run against OUR `tephra-server` binary (the same cases pass against the
//! reference in `cli_reference.rs`).

mod support;

fn server_binary() -> Option<std::path::PathBuf> {
    Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")))
}

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

include!("cli/cases.rs");
