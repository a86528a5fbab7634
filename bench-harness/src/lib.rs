//! `tephra-bench`: the benchmark harness bundled with Tephra.
//!
//! Subcommands:
//! - `fsync` ([`fsync`]): what the storage under a directory can commit (write +
//!   fdatasync latency, buffered vs O_DIRECT through glommio, preallocated vs growing
//!   files). It deliberately uses nothing from the `tephra` crate: it measures the disk,
//!   not our server.
//! - `append` ([`append`]): closed-loop append load against a running server, with the
//!   workload of the reference's published table ([`workload`]).
//! - `read` ([`read`]): full scans, selective reads and subscription fan-out lag.
//! - `compare` ([`compare`]): the append matrix against our server and the reference
//!   server side by side ([`server`] starts and stops them), with an SVG chart ([`chart`]).

#![deny(missing_docs)]

pub mod append;
pub mod chart;
pub mod cli;
pub mod compare;
pub mod fsync;
pub mod logcapture;
pub mod machine;
pub mod metrics;
pub mod read;
pub mod report;
pub mod server;
pub mod signals;
pub mod workload;
