//! A group's log as a restart rebuilds it from the command log (docs/journals.md §9.9): the
//! entries before a group's first one may lie in segments given back, which a snapshot found
//! later must cover; any other hole is refused as a loss.

use raft::eraftpb::{Entry, Snapshot};
use raft::Storage;
use tephra::cluster::group_log::GroupLog;
use tephra::journal::held::Loc;

fn entry(index: u64, term: u64) -> Entry {
    Entry { index, term, ..Entry::default() }
}

fn snapshot(index: u64, term: u64) -> Snapshot {
    let mut s = Snapshot::default();
    s.mut_metadata().index = index;
    s.mut_metadata().term = term;
    s
}

fn loc(offset: u64) -> Loc {
    Loc { segment: 7, offset, len: 10 }
}

#[test]
fn a_log_starting_past_its_first_index_is_whole_once_a_later_snapshot_covers_the_hole() {
    // Entries 1..=4 lay in a segment given back; 5..=9 survive; the snapshot at 6 comes later.
    let mut log = GroupLog::new(&[1, 2, 3], None);
    for i in 5..=9 {
        log.append_stored(i, 2, loc(i));
    }
    assert_eq!(log.first_index().unwrap(), 5);
    assert!(log.check_start().is_err(), "no snapshot covers 1..=4 yet");
    log.compact(snapshot(6, 2)).unwrap();
    assert!(log.check_start().is_ok());
    assert_eq!((log.first_index().unwrap(), log.last()), (7, 9));
}

#[test]
fn entries_written_again_at_the_head_replace_the_suffix_they_start() {
    // The directory's entries 1..=6: 1..=3 in a segment given back, 4..=6 where they were,
    // then 1..=6 written again at the head, in order.
    let mut log = GroupLog::new(&[1], None);
    for i in 4..=6 {
        log.append_stored(i, 1, loc(i));
    }
    for i in 1..=6 {
        log.append_replayed(&entry(i, 1));
    }
    assert!(log.check_start().is_ok());
    assert_eq!((log.first_index().unwrap(), log.last()), (1, 6));
    assert_eq!(log.entry(3).unwrap().index, 3);
}

#[test]
fn a_hole_no_snapshot_covers_is_refused() {
    let mut log = GroupLog::new(&[1], None);
    log.append_replayed(&entry(1, 1));
    log.append_replayed(&entry(2, 1));
    // Entry 3 is missing.
    log.append_replayed(&entry(4, 1));
    let gap = log.check_start().unwrap_err();
    assert_eq!((gap.index, gap.last), (4, 0));
}

#[test]
fn at_run_time_an_entry_past_the_end_is_still_a_gap() {
    let mut log = GroupLog::new(&[1], None);
    log.append(&[entry(1, 1)]).unwrap();
    let gap = log.append(&[entry(3, 1)]).unwrap_err();
    assert_eq!((gap.index, gap.last), (3, 1));
}

#[test]
fn a_snapshot_found_after_the_entries_that_follow_it_becomes_their_base() {
    // Entries 3..=12 survive; the snapshot at 2 lies after them in the log (moved to the
    // head, or written when the group compacted after appending them); 1..=2 were given back.
    let mut log = GroupLog::new(&[1, 2, 3], None);
    for i in 3..=12 {
        log.append_stored(i, 2, loc(i));
    }
    log.rebase(snapshot(2, 2));
    assert!(log.check_start().is_ok());
    assert_eq!((log.first_index().unwrap(), log.last(), log.snapshot_index()), (3, 12, 2));
    assert_eq!(log.term(2).unwrap(), 2);
}
