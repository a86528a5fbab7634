//! One group's log as consensus reads it (raft's `Storage`): the hard state, the voters, and
//! per entry its term and either the entry itself (not yet durable here) or where its payload
//! lies in the node's command log (durable), read back when consensus asks for it. So a node
//! holds about 40 bytes of memory per entry, not the records, however long its groups' logs.
//!
//! Source: docs/journals.md §9.6.

use std::collections::VecDeque;
use std::sync::Arc;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use super::durable;
use super::replica::Durable;
use crate::journal::held::Loc;

/// Reads the payload of a durable item back from the node's command log.
pub type EntryReader = Arc<dyn Fn(Loc) -> std::io::Result<Vec<u8>> + Send + Sync>;

/// One entry of the log.
#[derive(Clone, Debug)]
enum Slot {
    /// Not yet durable here: the entry itself.
    Memory(Entry),
    /// Durable: its term and where its payload lies.
    Disk { term: u64, loc: Loc },
}

impl Slot {
    fn term(&self) -> u64 {
        match self {
            Slot::Memory(e) => e.term,
            Slot::Disk { term, .. } => *term,
        }
    }
}

/// A group's log. See the module documentation.
pub struct GroupLog {
    hard_state: HardState,
    /// The configuration as applied here.
    conf_state: ConfState,
    /// The index of the last configuration change entry applied here (0: none), or the one a
    /// snapshot's configuration reflects.
    conf_index: u64,
    /// The snapshot the log starts after (index 0: none yet, the log starts at 1).
    snap: Snapshot,
    /// The index of `slots[0]`.
    first: u64,
    slots: VecDeque<Slot>,
    reader: Option<EntryReader>,
}

/// Why an entry could not be added.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("entry {index} does not follow the last entry held, {last}: the group log has a gap")]
pub struct Gap {
    /// The entry's index.
    pub index: u64,
    /// The last index held before it.
    pub last: u64,
}

fn other(why: String) -> raft::Error {
    raft::Error::Store(StorageError::Other(why.into()))
}

impl GroupLog {
    /// An empty log of a group of `voters`; durable entries are read with `reader` (without
    /// one every entry stays in memory, as a test's log does).
    pub fn new(voters: &[u64], reader: Option<EntryReader>) -> GroupLog {
        GroupLog {
            hard_state: HardState::default(),
            conf_state: ConfState::from((voters.to_vec(), Vec::<u64>::new())),
            conf_index: 0,
            snap: Snapshot::default(),
            first: 1,
            slots: VecDeque::new(),
            reader,
        }
    }

    /// The hard state held.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Replaces the hard state.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Replaces the configuration after the configuration change entry at `index` was applied.
    pub fn set_conf_state(&mut self, cs: ConfState, index: u64) {
        self.conf_state = cs;
        self.conf_index = index;
    }

    /// The index of the last configuration change entry the configuration holds.
    pub fn conf_index(&self) -> u64 {
        self.conf_index
    }

    /// The index of the snapshot the log starts after (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.snap.get_metadata().index
    }

    /// Drops the entries up to `snapshot`'s index, which this node has applied and holds
    /// durable (docs/journals.md §9.9); `snapshot` is what a follower that needs them gets.
    ///
    /// # Errors
    /// [`Gap`] when the snapshot's index is past the last entry held; nothing changes then.
    pub fn compact(&mut self, snapshot: Snapshot) -> Result<(), Gap> {
        let index = snapshot.get_metadata().index;
        if index > self.last() {
            return Err(Gap { index, last: self.last() });
        }
        if index >= self.first {
            self.slots.drain(..(index + 1 - self.first) as usize);
            self.first = index + 1;
        }
        self.snap = snapshot;
        Ok(())
    }

    /// Replaces the whole log with `snapshot` from the group's leader (or found durable at a
    /// restart): the log starts after its index, with its configuration.
    pub fn install(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        self.slots.clear();
        self.first = meta.index + 1;
        self.conf_state = meta.get_conf_state().clone();
        self.conf_index = super::snapshot::decode(&snapshot.data).map_or(0, |(conf_index, _)| conf_index);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.snap = snapshot;
    }

    /// Takes `snapshot` as the base of a log replayed at a restart whose entries all follow
    /// its index: they were written before it (a compaction comes after the entries it
    /// passes over, and a snapshot moved to the log's head comes after them all) and those
    /// it covers lay in segments given back. The entries held stay (docs/journals.md §9.9).
    pub fn rebase(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        self.conf_state = meta.get_conf_state().clone();
        self.conf_index = super::snapshot::decode(&snapshot.data).map_or(0, |(conf_index, _)| conf_index);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.snap = snapshot;
    }

    /// Sets the commit index of the hard state.
    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// The last index held (0 for none).
    pub fn last(&self) -> u64 {
        self.first + self.slots.len() as u64 - 1
    }

    /// Makes room for an entry at `index`: an entry at an index already held replaces it and
    /// everything after it (a new leader overwrote an undecided suffix). When `replaying` the
    /// command log, an entry past the end starts the log over at its index: the entries
    /// before it lay in segments given back, compacted by a snapshot found later
    /// ([`GroupLog::check_start`] says whether one was).
    fn truncate_to(&mut self, index: u64, replaying: bool) -> Result<(), Gap> {
        let last = self.last();
        if index > last + 1 && replaying {
            self.slots.clear();
            self.first = index;
            return Ok(());
        }
        if index > last + 1 {
            return Err(Gap { index, last });
        }
        if index < self.first {
            // Below what is held: only the start of a log can be replaced whole.
            self.slots.clear();
            self.first = index;
        } else {
            self.slots.truncate((index - self.first) as usize);
        }
        Ok(())
    }

    /// Appends entries (not yet durable here).
    ///
    /// # Errors
    /// [`Gap`] when the first entry leaves a gap after the last held.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), Gap> {
        let Some(e) = entries.first() else { return Ok(()) };
        self.truncate_to(e.index, false)?;
        self.slots.extend(entries.iter().cloned().map(Slot::Memory));
        Ok(())
    }

    /// Adds an entry found durable at `loc` (a restart, replaying the command log in order;
    /// see [`GroupLog::truncate_to`] for an entry past the end).
    pub fn append_stored(&mut self, index: u64, term: u64, loc: Loc) {
        let _ = self.truncate_to(index, true);
        self.slots.push_back(Slot::Disk { term, loc });
    }

    /// Adds an entry found durable without a location (a test's log), as
    /// [`GroupLog::append_stored`].
    pub fn append_replayed(&mut self, entry: &Entry) {
        let _ = self.truncate_to(entry.index, true);
        self.slots.push_back(Slot::Memory(entry.clone()));
    }

    /// After a replay: whether the log starts right after its snapshot (or at 1 without one).
    ///
    /// # Errors
    /// [`Gap`] naming the first index held and the snapshot's: entries between them were
    /// lost, not compacted.
    pub fn check_start(&self) -> Result<(), Gap> {
        let snapshot = self.snapshot_index();
        if self.first == snapshot + 1 {
            return Ok(());
        }
        Err(Gap { index: self.first, last: snapshot })
    }

    /// Adds the segment of every entry held on disk to `out`.
    pub fn segments(&self, out: &mut std::collections::BTreeSet<u64>) {
        let mut last = None;
        for slot in &self.slots {
            if let Slot::Disk { loc, .. } = slot {
                if last != Some(loc.segment) {
                    out.insert(loc.segment);
                    last = Some(loc.segment);
                }
            }
        }
    }

    /// The index of the first entry held on disk in segment `segment`, if any.
    pub fn first_in(&self, segment: u64) -> Option<u64> {
        self.slots.iter().position(|s| matches!(s, Slot::Disk { loc, .. } if loc.segment == segment)).map(|i| self.first + i as u64)
    }

    /// Bytes of the entries from `index` to the last, as they lie on disk; `None` when one of
    /// them is not durable yet.
    pub fn bytes_from(&self, index: u64) -> Option<u64> {
        let skip = index.saturating_sub(self.first) as usize;
        self.slots.iter().skip(skip).map(|s| if let Slot::Disk { loc, .. } = s { Some(u64::from(loc.len)) } else { None }).sum()
    }

    /// The snapshot the log starts after, as it was made durable (index 0: none).
    pub fn durable_snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// Notes that the entry at `index` of `term` is durable at `loc`: its copy in memory goes.
    pub fn stored(&mut self, index: u64, term: u64, loc: Loc) {
        if index < self.first {
            return;
        }
        if let Some(slot) = self.slots.get_mut((index - self.first) as usize) {
            if slot.term() == term {
                *slot = Slot::Disk { term, loc };
            }
        }
    }

    /// The entry at `index`, read back from disk when it is durable.
    ///
    /// # Errors
    /// Compacted or unavailable indexes; a payload that cannot be read or is not the entry.
    pub fn entry(&self, index: u64) -> raft::Result<Entry> {
        if index < self.first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let slot = self.slots.get((index - self.first) as usize).ok_or(raft::Error::Store(StorageError::Unavailable))?;
        match slot {
            Slot::Memory(e) => Ok(e.clone()),
            Slot::Disk { term, loc } => {
                let reader = self.reader.as_ref().ok_or_else(|| other("an entry on disk and no reader".into()))?;
                let payload = reader(*loc).map_err(|e| other(format!("reading entry {index} at {loc:?}: {e}")))?;
                match durable::decode(&payload) {
                    Ok(Durable::Entry { entry, .. }) if entry.index == index && entry.term == *term => Ok(entry),
                    Ok(_) => Err(other(format!("the payload at {loc:?} is not entry {index} of term {term}"))),
                    Err(e) => Err(other(format!("entry {index} at {loc:?}: {e}"))),
                }
            }
        }
    }
}

impl Storage for GroupLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState { hard_state: self.hard_state.clone(), conf_state: self.conf_state.clone() })
    }

    fn entries(&self, low: u64, high: u64, max_size: impl Into<Option<u64>>, _context: GetEntriesContext) -> raft::Result<Vec<Entry>> {
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity((high.saturating_sub(low)).min(1024) as usize);
        let mut size = 0u64;
        for i in low..high {
            let e = self.entry(i)?;
            size += prost_011::Message::encoded_len(&e) as u64;
            // At least one entry, then as many as fit.
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e);
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.first - 1 {
            // The snapshot's (0 for the empty log's index 0).
            return Ok(self.snap.get_metadata().term);
        }
        if idx < self.first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.slots.get((idx - self.first) as usize).map(Slot::term).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    /// The snapshot the log starts after, with the configuration as applied here now (and
    /// the index of the last change it holds), so a voter added after the snapshot's index
    /// finds itself in it; the receiver skips the changes up to that index when it applies
    /// the entries after the snapshot (docs/journals.md §9.9).
    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snap.get_metadata().index == 0 {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let (_, state) = super::snapshot::decode(&self.snap.data).map_err(|e| other(format!("the group's snapshot: {e}")))?;
        let mut snap = self.snap.clone();
        snap.data = super::snapshot::encode(self.conf_index, &state);
        snap.mut_metadata().set_conf_state(self.conf_state.clone());
        Ok(snap)
    }
}
