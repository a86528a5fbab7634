//! `tephra-bench index`: the benchmark of the index issue (issue 6), side by side with the
//! reference server on the same log.
//!
//! - [`layout`]: the deterministic log (bulk tags, rare tags, common and rare types) and
//!   its manifest, `prepare.json`;
//! - [`prepare`]: `index prepare` writes that log through our server;
//! - [`run`]: `index run` times opening the store (cold and warm), selective and type-only
//!   reads, and conditional appends whose condition names a rare tag, on our server, the
//!   reference and our server forced to scan, and checks every read against the manifest.

pub mod layout;
pub mod prepare;
pub mod run;
