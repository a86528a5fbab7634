//! Journals (seed 002): ordered logs of opaque records with a fenced single-writer mode and
//! an at-least-once multi-writer mode.
//!
//! | module | what it holds |
//! |---|---|
//! | [`model`] | ids, seqs, the leader uuid, modes, the per-journal state and its invariants |
//! | [`mod@apply`] | the pure verdict `apply(state, call) -> outcome`, judged in log order |
//! | [`command`] | the command-log record layout of every command |
//! | [`checkpoint`] | the whole state at one command, so old segments can go |
//! | [`directory`] | tenants, journal names, and every journal's state as one state machine |
//!
//! Everything here is sans-IO: the command log, the sequencer and the wire live at the
//! edges. Source: `docs/journals.md`.

pub mod apply;
pub mod checkpoint;
pub mod command;
pub mod directory;
pub mod held;
pub mod model;
pub mod sequencer;
pub mod store;

pub use apply::{apply, Call, Outcome};
pub use command::{decode as decode_command, Command, CommandError, EntryId};
pub use directory::{valid_name, Answer, Directory};
pub use model::{digest_records, BatchMark, JournalId, JournalState, LeaderUuid, Mode, Records, Seq, StoreDurability, View};
