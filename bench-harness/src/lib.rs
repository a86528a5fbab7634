//! `tephra-bench`: the benchmark harness bundled with Tephra.
//!
//! Today it has one working subcommand, `fsync`, a probe of what the storage under a
//! directory can commit (write + fdatasync latency, buffered vs O_DIRECT through glommio,
//! preallocated vs growing files). `append`, `read` and `compare` are placeholders.
//!
//! The probe deliberately uses nothing from the `tephra` crate: it measures the disk,
//! not our server.

#![deny(missing_docs)]

pub mod cli;
pub mod fsync;
pub mod logcapture;
pub mod machine;
pub mod report;
