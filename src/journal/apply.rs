//! The journal verdict: `apply(state, call) -> outcome`, judged in log order.
//!
//! Every call that changes a journal is a command in the node's command log. Each node
//! applies the same commands in the same order with this function, so each node gives the
//! same answer to the same call. Nothing here touches a runtime, a file or a clock.
//!
//! Source: docs/journals.md §2 (seed 002, "The data plane", "Two writer modes",
//! "Truncation").

use super::model::{BatchMark, JournalState, LeaderUuid, Mode, Seq, View};

/// One call that changes a journal, as the verdict needs it. The records themselves travel
/// in the command log; the verdict needs only their count and digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// A write. Single-writer shape: `leader` is set and `seq` names the first record's
    /// position. Multi-writer shape: no `leader` (the wire's 0) and `seq` is ignored.
    Write {
        /// The writer's leader uuid; `None` for the multi-writer shape.
        leader: Option<LeaderUuid>,
        /// The position of the first record (single-writer only).
        seq: Seq,
        /// How many records (0 is refused).
        count: u32,
        /// [`super::Records::digest`] of the records.
        digest: u128,
    },
    /// `SetLeader(new, old)`: a compare-and-set of the leader uuid.
    SetLeader {
        /// The uuid that wants to lead (0 is refused).
        new: LeaderUuid,
        /// The leader it expects to replace; `None` on a journal that never had one.
        old: Option<LeaderUuid>,
    },
    /// `Truncate(up_to)`: drop every record below `up_to` (clamped to `next_seq`).
    Truncate {
        /// The leader uuid (single-writer shape) or `None` (multi-writer shape).
        leader: Option<LeaderUuid>,
        /// The first seq to keep.
        up_to: Seq,
    },
    /// A command that changes nothing (consensus no-ops, padding).
    Noop,
}

/// The verdict on one [`Call`]. Refusals, duplicates and `Noop` move nothing; every refusal
/// carries the view it was judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The write took `[seq, seq + count)`.
    Accepted {
        /// The first record's seq.
        seq: Seq,
        /// How many records.
        count: u32,
    },
    /// The exact retry of a write accepted at `seq` (same uuid, same position, same
    /// records): nothing moved.
    Duplicate {
        /// The first record's seq.
        seq: Seq,
        /// How many records.
        count: u32,
    },
    /// A write from a uuid that does not lead, at a seq other than `next_seq`, a retry whose
    /// records differ, or an empty batch.
    Refused(View),
    /// A write below `first_seq`: whether it was written can no longer be known.
    Truncated(View),
    /// A call shaped for the other writer mode.
    WrongMode(View),
    /// `SetLeader` won; the view names the new leader.
    Leader(View),
    /// `SetLeader` lost: `old` is not the leader, `new` already leads, or `new` is 0.
    LeaderRefused(View),
    /// `Truncate` applied (clamped to `next_seq`, never lowering `first_seq`); the view is
    /// the state after it.
    Trimmed(View),
    /// `Truncate` from a uuid that does not lead.
    TruncateRefused(View),
    /// A [`Call::Noop`].
    Noop,
}

/// Judges `call` against `state` and applies it: the state after, and the answer.
///
/// Rules (seed 002, "Two writer modes" and "Truncation"; docs/journals.md §2):
///
/// | call | verdict |
/// |---|---|
/// | any call shaped for the other mode | `WrongMode`, nothing moves |
/// | write, 0 records | `Refused` |
/// | single write below `first_seq` | `Truncated` |
/// | single write below `next_seq`, the exact batch accepted there | `Duplicate` |
/// | single write otherwise below `next_seq`, past it, or from a uuid that does not lead | `Refused` |
/// | single write at `next_seq` from the leader; any multi write | `Accepted` at `next_seq` |
/// | `SetLeader(new, old)` with `old` the leader, `new` not the leader and not 0 | `Leader`, term + 1 |
/// | `Truncate(up_to)` by the leader (single) or anyone (multi) | `Trimmed`: `first_seq = max(first_seq, min(up_to, next_seq))` |
///
/// # Panics
/// When the transition breaks an invariant ([`JournalState::check_transition`]): a bug,
/// never a consequence of the call.
pub fn apply(state: &mut JournalState, call: &Call) -> Outcome {
    let before = state.summary();
    let outcome = judge(state, call);
    state.check_transition(&before);
    outcome
}

/// [`apply`] without the invariant check, for callers that check in bulk.
fn judge(state: &mut JournalState, call: &Call) -> Outcome {
    match *call {
        Call::Noop => Outcome::Noop,
        Call::Write { leader, seq, count, digest } => write(state, leader, seq, count, digest),
        Call::SetLeader { new, old } => set_leader(state, new, old),
        Call::Truncate { leader, up_to } => truncate(state, leader, up_to),
    }
}

/// Whether a call with (`Some`) or without (`None`) a uuid is shaped for `mode`.
fn shaped_for(mode: Mode, leader: Option<LeaderUuid>) -> bool {
    match mode {
        Mode::Single => leader.is_some_and(|u| u != LeaderUuid::NONE),
        Mode::Multi => leader.is_none_or(|u| u == LeaderUuid::NONE),
    }
}

fn write(state: &mut JournalState, leader: Option<LeaderUuid>, seq: Seq, count: u32, digest: u128) -> Outcome {
    if !shaped_for(state.mode, leader) {
        return Outcome::WrongMode(state.view());
    }
    if count == 0 {
        return Outcome::Refused(state.view());
    }
    let at = match (state.mode, leader) {
        (Mode::Multi, _) => state.next_seq,
        (Mode::Single, Some(uuid)) => {
            if seq < state.first_seq {
                return Outcome::Truncated(state.view());
            }
            if seq < state.next_seq {
                let same = |b: &BatchMark| b.leader == uuid && b.count == count && b.digest == digest;
                return match state.batch_at(seq) {
                    Some(b) if same(b) => Outcome::Duplicate { seq, count },
                    _ => Outcome::Refused(state.view()),
                };
            }
            if state.leader != Some(uuid) || seq != state.next_seq {
                return Outcome::Refused(state.view());
            }
            state.batches.push_back(BatchMark { seq, count, leader: uuid, digest });
            seq
        }
        (Mode::Single, None) => unreachable!("shaped_for refuses a single-writer call without a uuid"),
    };
    state.next_seq = at.checked_add(u64::from(count)).expect("next_seq overflowed u64");
    Outcome::Accepted { seq: at, count }
}

fn set_leader(state: &mut JournalState, new: LeaderUuid, old: Option<LeaderUuid>) -> Outcome {
    if state.mode != Mode::Single {
        return Outcome::WrongMode(state.view());
    }
    let old = old.and_then(LeaderUuid::set);
    if new == LeaderUuid::NONE || state.leader == Some(new) || state.leader != old {
        return Outcome::LeaderRefused(state.view());
    }
    state.leader = Some(new);
    state.term += 1;
    Outcome::Leader(state.view())
}

fn truncate(state: &mut JournalState, leader: Option<LeaderUuid>, up_to: Seq) -> Outcome {
    if !shaped_for(state.mode, leader) {
        return Outcome::WrongMode(state.view());
    }
    if state.mode == Mode::Single && state.leader != leader {
        return Outcome::TruncateRefused(state.view());
    }
    let first = state.first_seq.max(up_to.min(state.next_seq));
    state.first_seq = first;
    while state.batches.front().is_some_and(|b| b.seq < first) {
        state.batches.pop_front();
    }
    Outcome::Trimmed(state.view())
}
