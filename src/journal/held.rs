//! Where each held record of a journal lies in the command log, and which log segments still
//! hold a live record. Pure: the store fills it while it logs or replays writes.
//!
//! Source: docs/journals.md §4.3.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::model::{JournalId, Seq};

/// Where one record's bytes lie: in the command-log segment with this base position, at this
/// file offset, this long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    /// The base position of the segment (its file name).
    pub segment: u64,
    /// The file offset of the record's first byte.
    pub offset: u64,
    /// The record's length in bytes.
    pub len: u32,
}

/// The held records of one journal: `locs[i]` is seq `first + i`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    first: Seq,
    locs: VecDeque<Loc>,
}

/// The records of one read page: `[from, from + locs.len())`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// The seq of the first record.
    pub from: Seq,
    /// Where each record lies.
    pub locs: Vec<Loc>,
}

impl Held {
    /// The first seq held.
    pub fn first(&self) -> Seq {
        self.first
    }

    /// The seq after the last record held.
    pub fn end(&self) -> Seq {
        self.first + self.locs.len() as u64
    }

    /// Adds the record at `seq`, which must be [`Held::end`] (records are dense).
    ///
    /// # Panics
    /// When `seq` is not the end: a bug in the caller, which adds only accepted writes.
    pub fn push(&mut self, seq: Seq, loc: Loc) {
        if self.locs.is_empty() && seq >= self.first {
            self.first = seq;
        }
        assert_eq!(seq, self.end(), "held records must be dense");
        self.locs.push_back(loc);
    }

    /// Drops every record below `first_seq` (never raises past the end: a journal truncated
    /// to its tail keeps `first == end`).
    pub fn trim(&mut self, first_seq: Seq) {
        self.trim_with(first_seq, |_| {});
    }

    /// [`Held::trim`], handing each dropped record's location to `dropped`.
    pub fn trim_with(&mut self, first_seq: Seq, mut dropped: impl FnMut(Loc)) {
        while self.first < first_seq {
            let Some(loc) = self.locs.pop_front() else { break };
            dropped(loc);
            self.first += 1;
        }
        if self.locs.is_empty() {
            self.first = self.first.max(first_seq);
        }
    }

    /// The page from `from` (at least [`Held::first`], below [`Held::end`]): at most
    /// `max_records` records and at most `max_bytes` bytes, but always at least one record.
    /// `None` when `from` is not held.
    pub fn page(&self, from: Seq, max_records: u64, max_bytes: u64) -> Option<Page> {
        if from < self.first || from >= self.end() {
            return None;
        }
        let mut locs = Vec::new();
        let mut bytes = 0u64;
        for loc in self.locs.iter().skip((from - self.first) as usize) {
            if !locs.is_empty() && (locs.len() as u64 >= max_records || bytes + u64::from(loc.len) > max_bytes) {
                break;
            }
            bytes += u64::from(loc.len);
            locs.push(*loc);
        }
        Some(Page { from, locs })
    }

    /// The records from `seq` (at least [`Held::first`]) to the end, with their seqs.
    pub fn from(&self, seq: Seq) -> impl Iterator<Item = (Seq, Loc)> + '_ {
        let skip = seq.saturating_sub(self.first) as usize;
        self.locs.iter().enumerate().skip(skip).map(move |(i, l)| (self.first + i as u64, *l))
    }

    /// The segments holding records of this journal, with how many records each holds.
    pub fn segments(&self) -> BTreeMap<u64, u64> {
        let mut m = BTreeMap::new();
        for l in &self.locs {
            *m.entry(l.segment).or_insert(0) += 1;
        }
        m
    }
}

/// Every journal's held records and, per segment, how many of them it holds: what the
/// sequencer needs to read pages and to know which segments can go (docs/journals.md §4.3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    journals: HashMap<JournalId, Held>,
    live: Liveness,
    records: u64,
    /// Set when a segment may have lost its last held record (see [`Holdings::take_freed`]).
    freed: bool,
}

impl Holdings {
    /// The held records of `journal`, if it ever held any.
    pub fn get(&self, journal: JournalId) -> Option<&Held> {
        self.journals.get(&journal)
    }

    /// Records held, all journals together.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Adds the record `seq` of `journal` at `loc` (see [`Held::push`]).
    pub fn push(&mut self, journal: JournalId, seq: Seq, loc: Loc) {
        self.journals.entry(journal).or_default().push(seq, loc);
        self.live.add(loc.segment, journal, 1);
        self.records += 1;
    }

    /// Drops the records of `journal` below `first_seq` (see [`Held::trim`]).
    pub fn trim(&mut self, journal: JournalId, first_seq: Seq) {
        let Self { journals, live, records, freed } = self;
        journals.entry(journal).or_default().trim_with(first_seq, |loc| {
            *freed |= live.remove(loc.segment, journal, 1);
            *records -= 1;
        });
    }

    /// Forgets `journal` and its records (it was deleted).
    pub fn remove(&mut self, journal: JournalId) {
        let Some(held) = self.journals.remove(&journal) else { return };
        for (segment, n) in held.segments() {
            self.freed |= self.live.remove(segment, journal, n);
            self.records -= n;
        }
    }

    /// Whether `segment` holds a held record.
    pub fn is_live(&self, segment: u64) -> bool {
        self.live.is_live(segment)
    }

    /// Whether a segment lost its last held record since the last call (and clears it).
    pub fn take_freed(&mut self) -> bool {
        std::mem::take(&mut self.freed)
    }

    /// Notes that segments may be free without a record having gone (a rollover sealed one,
    /// or the log was just opened).
    pub fn note_maybe_freed(&mut self) {
        self.freed = true;
    }

    /// Every segment that holds a held record.
    pub fn live_segments(&self) -> impl Iterator<Item = u64> + '_ {
        self.live.live.keys().copied()
    }
}

/// For each command-log segment, how many held records of each journal it holds: a segment
/// with none left (and below the latest checkpoint) can be deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    live: BTreeMap<u64, BTreeMap<JournalId, u64>>,
}

impl Liveness {
    /// Counts `n` more held records of `journal` in `segment`.
    pub fn add(&mut self, segment: u64, journal: JournalId, n: u64) {
        *self.live.entry(segment).or_default().entry(journal).or_insert(0) += n;
    }

    /// Counts `n` fewer (records trimmed or the journal deleted); true when `segment` then
    /// holds none.
    ///
    /// # Panics
    /// When more are removed than were added: a bug in the caller.
    pub fn remove(&mut self, segment: u64, journal: JournalId, n: u64) -> bool {
        let seg = self.live.get_mut(&segment).expect("removing records of a segment never added");
        let c = seg.get_mut(&journal).expect("removing records of a journal never added");
        *c = c.checked_sub(n).expect("removing more records than were added");
        if *c == 0 {
            seg.remove(&journal);
        }
        if seg.is_empty() {
            self.live.remove(&segment);
            return true;
        }
        false
    }

    /// Whether `segment` holds any held record.
    pub fn is_live(&self, segment: u64) -> bool {
        self.live.contains_key(&segment)
    }

    /// Held records in `segment`, all journals together.
    pub fn records_in(&self, segment: u64) -> u64 {
        self.live.get(&segment).map_or(0, |m| m.values().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(segment: u64, len: u32) -> Loc {
        Loc { segment, offset: 64, len }
    }

    #[test]
    fn pages_are_dense_cut_by_records_and_bytes_and_never_empty() {
        let mut h = Held::default();
        for (i, len) in [10, 10, 100, 10].into_iter().enumerate() {
            h.push(i as u64, loc(1, len));
        }
        assert_eq!(h.page(0, 256, 1 << 16).unwrap().locs.len(), 4);
        assert_eq!(h.page(0, 2, 1 << 16).unwrap().locs.len(), 2);
        assert_eq!(h.page(0, 256, 25).unwrap().locs.len(), 2);
        // A record larger than the byte cap still comes, alone.
        let p = h.page(2, 256, 5).unwrap();
        assert_eq!((p.from, p.locs.len()), (2, 1));
        assert!(h.page(4, 256, 1 << 16).is_none());
        h.trim(3);
        assert_eq!((h.first(), h.end()), (3, 4));
        assert!(h.page(2, 256, 1 << 16).is_none());
        h.trim(9);
        assert_eq!((h.first(), h.end()), (9, 9));
        h.push(9, loc(2, 1));
        assert_eq!(h.end(), 10);
    }

    #[test]
    fn a_fresh_journal_may_start_past_zero_after_a_truncation_to_its_tail() {
        let mut h = Held::default();
        h.trim(5);
        h.push(5, loc(1, 1));
        assert_eq!((h.first(), h.end()), (5, 6));
    }

    #[test]
    fn liveness_counts_per_segment_and_journal() {
        let (a, b) = (JournalId { tenant: 1, journal: 1 }, JournalId { tenant: 1, journal: 2 });
        let mut l = Liveness::default();
        l.add(1, a, 3);
        l.add(1, b, 1);
        l.add(2, a, 1);
        assert_eq!(l.records_in(1), 4);
        assert!(!l.remove(1, a, 3));
        assert!(l.is_live(1));
        assert!(l.remove(1, b, 1));
        assert!(!l.is_live(1) && l.is_live(2));
    }

    #[test]
    fn holdings_free_a_segment_when_its_last_record_goes() {
        let (a, b) = (JournalId { tenant: 1, journal: 1 }, JournalId { tenant: 1, journal: 2 });
        let mut h = Holdings::default();
        h.push(a, 0, loc(1, 1));
        h.push(a, 1, loc(2, 1));
        h.push(b, 0, loc(1, 1));
        assert_eq!(h.records(), 3);
        h.trim(a, 1);
        assert!(!h.take_freed() && h.is_live(1));
        h.remove(b);
        assert!(h.take_freed() && !h.is_live(1) && h.is_live(2));
        assert!(!h.take_freed());
        assert_eq!((h.records(), h.live_segments().collect::<Vec<_>>()), (1, vec![2]));
        h.trim(a, 2);
        assert!(h.take_freed() && h.live_segments().next().is_none());
        assert_eq!(h.get(a).map(|x| (x.first(), x.end())), Some((2, 2)));
    }
}
