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
//! - `index prepare` / `index run` ([`index`]): the index issue's benchmark on a large
//!   prepared log: opening the store, selective and type-only reads, conditional appends
//!   naming a rare tag, on our server, the reference and a full-scan baseline.
//! - `journal` ([`journal`]): the journal API on our server against a one-member etcd 3.4
//!   ([`etcd`] starts it and speaks its JSON gateway), side by side.
//! - `cluster` ([`cluster`]): replicated journals on a three-node cluster of ours against a
//!   three-member etcd 3.4 cluster, side by side, with failover times.

#![deny(missing_docs)]

pub mod append;
pub mod chart;
pub mod cli;
pub mod cluster;
pub mod compare;
pub mod etcd;
pub mod fsync;
pub mod index;
pub mod journal;
pub mod logcapture;
pub mod machine;
pub mod metrics;
pub mod read;
pub mod report;
pub mod server;
pub mod signals;
pub mod workload;
