//! The sequential journal the linearizability checks judge histories against: the journal's
//! own pure verdict (`tephra::journal::apply`) plus the records it holds, each record a unique
//! 8-byte token, so that a read shows which write put what where. The operations, the answers
//! in the model's terms, and the translation from and to the wire.
//!
//! Used by `tests/journal_linearizable.rs` (one node) and `tests/cluster_faults.rs` (a cluster
//! under faults).

use std::collections::VecDeque;

use tephra::journal::{apply, Call, JournalState, LeaderUuid, Mode, Outcome, Records, StoreDurability, View};
use tephra::proto::*;

use crate::journal::{leader_of, uuid_bytes, write_call, Ids};
use crate::linearizable::Model;

/// The sequential journal: its state and the records it holds, `first_seq..next_seq`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Journal {
    /// The journal's state, moved by `apply`.
    pub state: JournalState,
    /// The tokens of the records held, from `first_seq`.
    pub records: VecDeque<u64>,
}

/// An operation as invoked. Uuids are `u128` (0: none); a write carries one record, its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A write of one record: fenced by `leader` at `seq`, or multi-writer with `leader` 0.
    Write {
        /// The writer's uuid (0 for a multi-writer write).
        leader: u128,
        /// The position it is written at (ignored by a multi-writer journal).
        seq: u64,
        /// The record's token.
        token: u64,
    },
    /// `SetLeader(new, old)`.
    SetLeader {
        /// The uuid that claims the lead.
        new: u128,
        /// The uuid it expects to lead now (0: none).
        old: u128,
    },
    /// `Truncate(up_to)`, fenced by `leader` (0 for a multi-writer journal).
    Truncate {
        /// The truncating uuid.
        leader: u128,
        /// The first seq kept.
        up_to: u64,
    },
    /// A read from `from` of at most `limit` records (0: every record held).
    Read {
        /// The first seq asked for.
        from: u64,
        /// The most records asked for; 0 for all.
        limit: u64,
    },
}

impl Op {
    /// The token a write carries.
    pub fn token(&self) -> Option<u64> {
        match self {
            Op::Write { token, .. } => Some(*token),
            _ => None,
        }
    }
}

/// An answer, as much of it as a sequential journal fixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    /// A write's outcome name (`accepted`, `duplicate`), its seq and count.
    Verdict(&'static str, u64, u32),
    /// A verdict that carries the view it was judged against: leader, next_seq, first_seq.
    Viewed(&'static str, u128, u64, u64),
    /// A read: the records from `from` and the view (leader, next_seq, first_seq).
    Page(Vec<u64>, u128, u64, u64),
    /// A read below `first_seq`, with `first_seq`.
    ReadTruncated(u64),
}

/// A record's bytes: its token, big-endian.
pub fn token_bytes(token: u64) -> [u8; 8] {
    token.to_be_bytes()
}

/// The token a record's bytes carry.
///
/// # Panics
/// When the record is not 8 bytes long.
pub fn token_of(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("an 8-byte token record"))
}

/// The journal's sequential specification, for a journal created in the given mode.
pub struct Spec(pub Mode);

impl Journal {
    /// Carries out `op` on the sequential journal and returns its answer.
    pub fn invoke(&mut self, op: &Op) -> Ret {
        let viewed = |name, v: View| Ret::Viewed(name, v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
        let call = match *op {
            Op::Read { from, limit } => {
                let v = self.state.view();
                if from < v.first_seq {
                    return Ret::ReadTruncated(v.first_seq);
                }
                let at = (from.min(v.next_seq) - v.first_seq) as usize;
                let take = if limit == 0 { usize::MAX } else { limit as usize };
                let records = self.records.iter().skip(at).take(take).copied().collect();
                return Ret::Page(records, v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
            }
            Op::Write { leader, seq, token } => {
                let bytes = token_bytes(token);
                Call::Write { leader: LeaderUuid(leader).set(), seq, count: 1, digest: Records(&[&bytes]).digest() }
            }
            Op::SetLeader { new, old } => Call::SetLeader { new: LeaderUuid(new), old: LeaderUuid(old).set() },
            Op::Truncate { leader, up_to } => Call::Truncate { leader: LeaderUuid(leader).set(), up_to },
        };
        match apply(&mut self.state, &call) {
            Outcome::Accepted { seq, count } => {
                if let Op::Write { token, .. } = op {
                    self.records.push_back(*token);
                }
                Ret::Verdict("accepted", seq, count)
            }
            Outcome::Duplicate { seq, count } => Ret::Verdict("duplicate", seq, count),
            Outcome::Refused(v) => viewed("refused", v),
            Outcome::Truncated(v) => viewed("truncated", v),
            Outcome::WrongMode(v) => viewed("wrong_mode", v),
            Outcome::Leader(v) => viewed("leader", v),
            Outcome::LeaderRefused(v) => viewed("lost", v),
            Outcome::Trimmed(v) => {
                while self.records.len() as u64 > v.next_seq - v.first_seq {
                    self.records.pop_front();
                }
                viewed("trimmed", v)
            }
            Outcome::TruncateRefused(v) => viewed("truncate_refused", v),
            Outcome::Noop => Ret::Verdict("noop", 0, 0),
        }
    }
}

impl Model for Spec {
    type State = Journal;
    type Op = Op;
    type Ret = Ret;

    fn init(&self) -> Journal {
        Journal { state: JournalState::new(self.0, StoreDurability::Ordered), records: VecDeque::new() }
    }

    fn step(&self, state: &Journal, op: &Op, ret: Option<&Ret>) -> Option<Journal> {
        let mut next = state.clone();
        let got = next.invoke(op);
        (ret.is_none() || ret == Some(&got)).then_some(next)
    }
}

/// A server's answer in the model's terms; `None` for an outcome that is no verdict on `op`
/// (`NOT_LEADER`, `UNSERVED`, `BUSY`, `AMBIGUOUS`, `UNKNOWN_JOURNAL`, `INVALID`, `UNAVAILABLE`, ...).
pub fn ret_of(op: &Op, r: &JournalResponse) -> Option<Ret> {
    let view = r.state.as_ref().map(|s| (leader_of(r), s.next_seq, s.first_seq)).unwrap_or_default();
    let name = match r.outcome() {
        JournalOutcome::Accepted => return Some(Ret::Verdict("accepted", r.seq, r.count)),
        JournalOutcome::Duplicate => return Some(Ret::Verdict("duplicate", r.seq, r.count)),
        JournalOutcome::Page => {
            let records = r.records.iter().map(|b| token_of(b)).collect();
            return Some(Ret::Page(records, view.0, view.1, view.2));
        }
        JournalOutcome::Truncated if matches!(op, Op::Read { .. }) => return Some(Ret::ReadTruncated(view.2)),
        JournalOutcome::Refused => "refused",
        JournalOutcome::Truncated => "truncated",
        JournalOutcome::WrongMode => "wrong_mode",
        JournalOutcome::Leader => "leader",
        JournalOutcome::Lost => "lost",
        JournalOutcome::Trimmed => "trimmed",
        JournalOutcome::TruncateRefused => "truncate_refused",
        _ => return None,
    };
    Some(Ret::Viewed(name, view.0, view.1, view.2))
}

/// The wire call that carries `op` on journal `j`.
pub fn call_of(j: Ids, op: &Op) -> journal_request::Call {
    match *op {
        Op::Write { leader, seq, token } => write_call(j, leader, seq, &[&token_bytes(token)]),
        Op::SetLeader { new, old } => {
            journal_request::Call::SetLeader(JournalSetLeader { tenant: j.0, journal: j.1, new: new.to_be_bytes().to_vec(), old: uuid_bytes(old) })
        }
        Op::Truncate { leader, up_to } => journal_request::Call::Truncate(JournalTruncate { tenant: j.0, journal: j.1, up_to, leader: uuid_bytes(leader) }),
        Op::Read { from, limit } => journal_request::Call::Read(JournalRead { tenant: j.0, journal: j.1, from_seq: from, limit, wait_ms: 0 }),
    }
}
