//! The segment log: format, recovery on open, and the directory lock.
//!
//! Byte-compatible with the reference (docs/format.md §1-§9): segment header ([`header`]),
//! record framing and the commit rule ([`record`]), segment files ([`segment`]), the `LOCK`
//! file ([`lock`]). [`open`] runs the recovery sequence and returns one of the three outcomes
//! as a value.

pub(crate) mod aligned;
pub mod column;
pub mod header;
pub mod lock;
pub mod record;
pub mod segment;

mod open;
pub use open::{open_log, open_log_covered, OpenOutcome, Recovered, WalkedSegment, KEEP_DISCARDED_MAX, RECOVERED_DIR};

use std::path::PathBuf;

/// Errors of the log layer.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The segment geometry is invalid.
    #[error("invalid configuration: {reason}")]
    InvalidConfig { reason: String },
    /// An I/O error on a file or directory.
    #[error("I/O error on {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A segment header is unusable.
    #[error("segment {} has an invalid header: {source}", path.display())]
    Header { path: PathBuf, source: header::HeaderError },
    /// A segment's header base differs from its file name.
    #[error("segment {} has base position {header} in its header but {name} in its name", path.display())]
    BasePositionMismatch { path: PathBuf, header: u64, name: u64 },
    /// A never-written segment sits before written ones.
    #[error("segment {} was never written but later segments exist", path.display())]
    UnwrittenNonLast { path: PathBuf },
    /// A gap or overlap between segments; `hint` (empty, or starting with " (") says what the
    /// segment before it holds.
    #[error("non-contiguous segments: {} has base position {found}, expected {expected}{hint}", path.display())]
    NonContiguous { path: PathBuf, found: u64, expected: u64, hint: String },
    /// A commit marker disagrees with the record count.
    #[error("segment {} commit marker says position {found}, records say {expected}", path.display())]
    PositionMismatch { path: PathBuf, found: u64, expected: u64 },
    /// Damage that is not a torn tail: refusing to open rather than drop acknowledged events.
    #[error("segment {} is corrupt at byte offset {offset}: {detail}", path.display())]
    Corrupt { path: PathBuf, offset: u64, detail: String },
    /// The data directory is locked by another writer.
    #[error(transparent)]
    Lock(#[from] lock::LockError),
}
