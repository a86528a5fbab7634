//! A journal group's snapshot data: the journal's state after the snapshot's index, and the
//! index of the last configuration change the snapshot's configuration reflects. Pure over
//! bytes.
//!
//! A snapshot is taken only at an index below every entry that still holds a record the
//! journal keeps (its `next_seq` there is at most the journal's `first_seq` now), so it carries
//! no records: a node that installs one gets every record it must hold from the entries after
//! it. Layout (little-endian; docs/journals.md §9.9):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | format version, 1 |
//! | 1 | 7 | reserved, zero |
//! | 8 | 8 | `conf_index`: the last configuration change entry the snapshot's configuration holds |
//! | 16 | 1 | mode (0 single, 1 multi) |
//! | 17 | 1 | store durability (0 ordered, 1 batched) |
//! | 18 | 6 | reserved, zero |
//! | 24 | 16 | leader uuid (0: none) |
//! | 40 | 8 | term (won `SetLeader`s) |
//! | 48 | 8 | `first_seq` |
//! | 56 | 8 | `next_seq` |
//! | 64 | 4 | batch marks |
//! | 68 | .. | each mark: `seq u64`, `count u32`, `leader u128`, `digest u128` (44 bytes) |

use std::collections::VecDeque;

use crate::journal::command::{durability_byte, mode_byte};
use crate::journal::{BatchMark, JournalState, LeaderUuid, Mode, StoreDurability};

/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the batch marks.
pub const HEAD_LEN: usize = 68;
/// Bytes of one batch mark.
pub const MARK_LEN: usize = 44;

/// Why snapshot data did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Fewer or more bytes than the head and its marks call for.
    #[error("journal snapshot is {got} bytes, its head calls for {need}")]
    Length {
        /// Bytes the head calls for.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// A version this code does not read.
    #[error("journal snapshot has format version {0}, this server reads version {VERSION}")]
    Version(u8),
    /// Reserved bytes that are not zero.
    #[error("journal snapshot has non-zero reserved bytes")]
    Reserved,
    /// An unknown mode or durability byte.
    #[error("journal snapshot has unknown {0} byte {1}")]
    UnknownEnum(&'static str, u8),
    /// A state that breaks the journal's invariants (`first_seq > next_seq`, a leader without
    /// a term or the reverse).
    #[error("journal snapshot state does not hold together: {0}")]
    State(&'static str),
}

/// Encodes `state` with `conf_index`.
pub fn encode(conf_index: u64, state: &JournalState) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN + state.batches.len() * MARK_LEN);
    out.extend_from_slice(&[VERSION, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&conf_index.to_le_bytes());
    out.push(mode_byte(state.mode));
    out.push(durability_byte(state.durability));
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(&state.leader.unwrap_or(LeaderUuid::NONE).0.to_le_bytes());
    for v in [state.term, state.first_seq, state.next_seq] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(state.batches.len() as u32).to_le_bytes());
    for b in &state.batches {
        out.extend_from_slice(&b.seq.to_le_bytes());
        out.extend_from_slice(&b.count.to_le_bytes());
        out.extend_from_slice(&b.leader.0.to_le_bytes());
        out.extend_from_slice(&b.digest.to_le_bytes());
    }
    out
}

/// Decodes snapshot data: `(conf_index, state)`.
///
/// # Errors
/// [`SnapshotError`] naming what was wrong.
pub fn decode(data: &[u8]) -> Result<(u64, JournalState), SnapshotError> {
    if data.len() < HEAD_LEN {
        return Err(SnapshotError::Length { need: HEAD_LEN, got: data.len() });
    }
    if data[0] != VERSION {
        return Err(SnapshotError::Version(data[0]));
    }
    if data[1..8].iter().any(|&b| b != 0) || data[18..24].iter().any(|&b| b != 0) {
        return Err(SnapshotError::Reserved);
    }
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    let u128_at = |at: usize| u128::from_le_bytes(data[at..at + 16].try_into().unwrap());
    let marks = u32::from_le_bytes(data[64..68].try_into().unwrap()) as usize;
    let need = HEAD_LEN + marks * MARK_LEN;
    if data.len() != need {
        return Err(SnapshotError::Length { need, got: data.len() });
    }
    let mode = match data[16] {
        0 => Mode::Single,
        1 => Mode::Multi,
        b => return Err(SnapshotError::UnknownEnum("mode", b)),
    };
    let durability = match data[17] {
        0 => StoreDurability::Ordered,
        1 => StoreDurability::Batched,
        b => return Err(SnapshotError::UnknownEnum("store durability", b)),
    };
    let leader = LeaderUuid(u128_at(24)).set();
    let (term, first_seq, next_seq) = (u64_at(40), u64_at(48), u64_at(56));
    if first_seq > next_seq {
        return Err(SnapshotError::State("first_seq is past next_seq"));
    }
    if leader.is_some() != (term > 0) {
        return Err(SnapshotError::State("a leader without a term, or a term without a leader"));
    }
    let batches: VecDeque<BatchMark> = (0..marks)
        .map(|i| {
            let at = HEAD_LEN + i * MARK_LEN;
            BatchMark {
                seq: u64_at(at),
                count: u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()),
                leader: LeaderUuid(u128_at(at + 12)),
                digest: u128_at(at + 28),
            }
        })
        .collect();
    Ok((u64_at(8), JournalState { mode, durability, leader, term, first_seq, next_seq, batches }))
}
