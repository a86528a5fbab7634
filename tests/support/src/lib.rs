//! What the integration tests (`tests/*.rs`), the crash harness (`tests/crash`) and the bench
//! harness (`bench-harness`) share: launching a server binary (ours or the reference) and
//! waiting for it to listen ([`process`]), a server under test with a watchdog ([`Server`]),
//! events built from plain values ([`ev`]), raw-frame connections ([`RawConn`]), a
//! linearizability checker ([`linearizable`]) with the sequential journal it judges journal
//! histories by ([`journal_model`]), clusters of server processes ([`cluster`]) with a
//! fault-injecting proxy on each peer link ([`proxy`]), and TLS certificates ([`tls`]).
//!
//! An integration test uses it as `use tephra_test_support as support;`.
#![warn(missing_docs)]

pub mod cluster;
pub mod events;
pub mod journal;
pub mod journal_model;
pub mod linearizable;
pub mod process;
pub mod proxy;
pub mod raw;
pub mod server;
pub mod tls;

pub use cluster::Cluster;
pub use events::ev;
/// The seeded random numbers of the fault tests.
pub use fastrand;
pub use journal::JournalConn;
pub use process::{parse_listening, scratch_dir, Launch, Process, Readiness};
pub use raw::{frame_level_error, RawConn};
pub use server::{crash_points_binary, reference_binary, run_to_exit, sample, stats_until, Exited, Server, FAST_WAIT_TICK};
pub use tls::{ca_self_signed, self_signed, tls_config_with_tokens, tls_server_at_its_connection_cap, tls_toml, TestCa, AUTH_TOML};
