//! The journal's values and its per-journal state: ids, seqs, the leader uuid, the writer
//! mode, the store durability, and the invariants every transition keeps.
//!
//! Source: docs/journals.md §1 (seed 002, "The journal API", "Two writer modes", "Ids",
//! "Store durability").

use std::collections::VecDeque;
use std::fmt;

/// A position in a journal: the dense, 0-based index of a record. A new journal's first
/// record gets seq 0.
pub type Seq = u64;

/// Names one journal: a `(tenant, journal)` pair of random u64s. A 0 in either half means
/// "not set"; a call naming such a pair is refused as an unknown journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JournalId {
    /// The tenant half.
    pub tenant: u64,
    /// The journal half.
    pub journal: u64,
}

impl JournalId {
    /// Whether both halves are set (non-zero); only such an id can name a journal.
    pub fn is_set(&self) -> bool {
        self.tenant != 0 && self.journal != 0
    }
}

impl fmt::Display for JournalId {
    /// `id:TTTTTTTTTTTTTTTT/JJJJJJJJJJJJJJJJ`, both halves as 16 hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "id:{:016x}/{:016x}", self.tenant, self.journal)
    }
}

/// A writer's leader uuid: 128 bits, drawn at random once per leadership term. It is not a
/// secret; it is the only fence of a single-writer journal. The value 0 is "no leader" and
/// never leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LeaderUuid(pub u128);

impl LeaderUuid {
    /// The unset uuid (0): no leader.
    pub const NONE: LeaderUuid = LeaderUuid(0);

    /// `Some(self)` unless this is the unset uuid.
    pub fn set(self) -> Option<LeaderUuid> {
        (self.0 != 0).then_some(self)
    }
}

impl fmt::Display for LeaderUuid {
    /// Lower-case hex without leading zeros (`0` for the unset uuid).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// Who may write a journal; chosen at creation and never changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One writer at a time, fenced by its leader uuid; writes name their seq and an exact
    /// retry is answered `Duplicate`.
    Single,
    /// Anyone appends at the tail; no fence, no deduplication (at-least-once delivery).
    Multi,
}

/// How each machine's store commits a batch of a journal; chosen at creation and never
/// changed (seed 002, "Store durability").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreDurability {
    /// Records, sync, commit marker, sync: a marker on disk proves its batch is intact, so
    /// damage before a marker is corruption, never a torn tail. The default.
    Ordered,
    /// Records and commit marker, one sync: a crash inside a commit can lose the last batch
    /// (it was never acknowledged).
    Batched,
}

/// What a client sees of a journal: the leader and the two positions. Every refusal carries
/// the view it was judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct View {
    /// The current leader uuid, `None` before the first `SetLeader` (and always in a
    /// multi-writer journal).
    pub leader: Option<LeaderUuid>,
    /// The seq the next accepted record gets.
    pub next_seq: Seq,
    /// The first seq still held; reads below it are `Truncated`.
    pub first_seq: Seq,
}

/// An accepted single-writer batch, kept while its first record is held, so that an exact
/// retry can be recognised ("the log is the dedup table": no session table, nothing expires).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchMark {
    /// The seq of the batch's first record.
    pub seq: Seq,
    /// How many records the batch holds.
    pub count: u32,
    /// The uuid that wrote it.
    pub leader: LeaderUuid,
    /// [`Records::digest`] of its records.
    pub digest: u128,
}

/// The state of one journal, as every node holds it after applying the same commands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JournalState {
    /// The writer mode (fixed).
    pub mode: Mode,
    /// The store durability (fixed).
    pub durability: StoreDurability,
    /// The current leader, `None` until the first won `SetLeader`.
    pub leader: Option<LeaderUuid>,
    /// Won `SetLeader`s so far; `leader.is_some() == (term > 0)`.
    pub term: u64,
    /// The first seq still held.
    pub first_seq: Seq,
    /// The seq the next accepted record gets.
    pub next_seq: Seq,
    /// Accepted single-writer batches whose first record is still held, oldest first.
    pub batches: VecDeque<BatchMark>,
}

impl JournalState {
    /// A new, empty journal: no leader, term 0, `first_seq == next_seq == 0`.
    pub fn new(mode: Mode, durability: StoreDurability) -> JournalState {
        JournalState { mode, durability, leader: None, term: 0, first_seq: 0, next_seq: 0, batches: VecDeque::new() }
    }

    /// The client-visible view of this state.
    pub fn view(&self) -> View {
        View { leader: self.leader, next_seq: self.next_seq, first_seq: self.first_seq }
    }

    /// The mark of the accepted batch that starts exactly at `seq`, if it is still held.
    pub fn batch_at(&self, seq: Seq) -> Option<&BatchMark> {
        let i = self.batches.partition_point(|b| b.seq < seq);
        self.batches.get(i).filter(|b| b.seq == seq)
    }

    /// The scalar part of the state, what [`JournalState::check_transition`] compares against.
    pub fn summary(&self) -> Summary {
        (self.mode, self.durability, self.leader, self.term, self.first_seq, self.next_seq)
    }

    /// Checks the invariants of one state on its own, in constant time: the batch marks are
    /// checked at their ends (the oldest and the newest), which are the only ones a transition
    /// touches. [`JournalState::check_marks`] walks them all.
    ///
    /// # Panics
    /// When `first_seq > next_seq`, when a leader exists without a term (or a term without a
    /// leader), when the unset uuid leads, or when a batch mark lies outside
    /// `[first_seq, next_seq)`. Each is a bug in [`super::apply()`], never bad input, so the
    /// sequencer stops rather than answer from a broken state.
    pub fn check(&self) {
        assert!(self.first_seq <= self.next_seq, "first_seq {} > next_seq {}", self.first_seq, self.next_seq);
        assert_eq!(self.leader.is_some(), self.term > 0, "leader {:?} with term {}", self.leader, self.term);
        assert!(self.leader != Some(LeaderUuid::NONE), "the unset uuid leads");
        assert!(self.mode == Mode::Single || (self.leader.is_none() && self.batches.is_empty()), "a multi-writer journal has a leader or batch marks");
        if let (Some(first), Some(last)) = (self.batches.front(), self.batches.back()) {
            assert!(first.seq >= self.first_seq, "batch mark {first:?} below first_seq {}", self.first_seq);
            assert!(last.count > 0 && last.seq + u64::from(last.count) <= self.next_seq, "batch mark {last:?} past next_seq {}", self.next_seq);
        }
    }

    /// Walks every batch mark: in order, not overlapping, none empty, inside
    /// `[first_seq, next_seq)`.
    ///
    /// # Panics
    /// On the first mark that breaks one of those.
    /// Every invariant of [`JournalState::check`] and [`JournalState::check_marks`], as a
    /// verdict rather than a panic: for state read back from disk (a checkpoint), where a
    /// violation is damage to refuse, not a bug.
    ///
    /// # Errors
    /// A sentence naming the first invariant that does not hold.
    pub fn validate(&self) -> Result<(), String> {
        if self.first_seq > self.next_seq {
            return Err(format!("first_seq {} > next_seq {}", self.first_seq, self.next_seq));
        }
        if self.leader.is_some() != (self.term > 0) || self.leader == Some(LeaderUuid::NONE) {
            return Err(format!("leader {:?} with term {}", self.leader, self.term));
        }
        if self.mode == Mode::Multi && (self.leader.is_some() || !self.batches.is_empty()) {
            return Err("a multi-writer journal has a leader or batch marks".into());
        }
        let mut end = self.first_seq;
        for b in &self.batches {
            if b.seq < end || b.count == 0 {
                return Err(format!("batch mark {b:?} overlaps the one before it, lies below first_seq or is empty"));
            }
            end = b.seq + u64::from(b.count);
        }
        if end > self.next_seq {
            return Err(format!("batch marks end at {end} past next_seq {}", self.next_seq));
        }
        Ok(())
    }

    pub fn check_marks(&self) {
        let mut end = self.first_seq;
        for b in &self.batches {
            assert!(b.seq >= end && b.count > 0, "batch mark {b:?} overlaps or is empty");
            end = b.seq + u64::from(b.count);
        }
        assert!(end <= self.next_seq, "batch marks end at {end} past next_seq {}", self.next_seq);
    }

    /// Checks one transition from `before` to `self`: the state is valid and nothing went
    /// backwards (term, `first_seq`, `next_seq`), and the mode and durability did not change.
    ///
    /// # Panics
    /// As [`JournalState::check`], and when the transition lowers or changes what must not be.
    pub fn check_transition(&self, before: &Summary) {
        self.check();
        let &(mode, durability, leader, term, first_seq, next_seq) = before;
        assert_eq!(self.mode, mode, "the writer mode changed");
        assert_eq!(self.durability, durability, "the store durability changed");
        assert!(self.term >= term, "term went back from {term} to {}", self.term);
        assert!(self.first_seq >= first_seq, "first_seq went back from {first_seq} to {}", self.first_seq);
        assert!(self.next_seq >= next_seq, "next_seq went back from {next_seq} to {}", self.next_seq);
        assert!(self.term == term || self.leader != leader, "a new term kept its leader");
    }
}

/// The scalar part of a [`JournalState`], what a transition must not lower or change: mode,
/// store durability, leader, term, `first_seq`, `next_seq`.
pub type Summary = (Mode, StoreDurability, Option<LeaderUuid>, u64, Seq, Seq);

/// The records of one write, borrowed: each record is an opaque byte string.
#[derive(Clone, Copy, Debug)]
pub struct Records<'a>(pub &'a [&'a [u8]]);

impl Records<'_> {
    /// The 128-bit digest that identifies a batch for retry detection: XXH3-128 over the
    /// record count, then each record's length (u32 little-endian) and bytes, so that two
    /// batches differing only in where records split get different digests.
    pub fn digest(&self) -> u128 {
        digest_records(self.0.iter().copied())
    }
}

/// [`Records::digest`] over any sequence of records.
pub fn digest_records<'r>(records: impl ExactSizeIterator<Item = &'r [u8]>) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(records.len() as u64).to_le_bytes());
    for r in records {
        h.update(&(r.len() as u32).to_le_bytes());
        h.update(r);
    }
    h.digest128()
}
