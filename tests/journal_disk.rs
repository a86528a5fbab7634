//! Truncation and deletion give disk back (docs/journals.md §4.3-§4.4): the command log's
//! segments that hold no held record are deleted once a checkpoint covers them, the state
//! survives restarts and crashes around the checkpoint, and a damaged checkpoint or a missing
//! segment stops the start with a clear message and changes nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{JournalConn as Conn, Server};
use tephra::proto::*;
use tephra_test_support as support;

fn server_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

const SMALL_SEGMENTS: (&str, &str) = ("TEPHRA__JOURNAL__SEGMENT_SIZE", "65536");
const METRICS: (&str, &str) = ("TEPHRA__METRICS__BIND", "127.0.0.1:0");

/// The journal log's segment files, ascending by name.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(data.join("journals")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect();
    v.sort();
    v
}

/// Waits until the sequencer finished what follows the last answer it sent: it answers a
/// call only after the commit and the reclamation of the calls before it.
fn settle(c: &mut Conn) {
    let r = c.call(journal_request::Call::List(JournalList { tenant_name: "acme".into() }));
    assert_eq!(r.outcome(), JournalOutcome::Listed, "{r:?}");
}

/// The value of the unlabelled sample `name`, a count.
fn sample(body: &str, name: &str) -> u64 {
    support::sample(body, name).parse().unwrap()
}

/// Three records of 3 KiB, each naming its write.
fn batch(i: u64) -> Vec<Vec<u8>> {
    (0..3).map(|k| format!("write {i} record {k} ").into_bytes().into_iter().chain(std::iter::repeat(b'.')).take(3 * 1024).collect()).collect()
}

fn refs(b: &[Vec<u8>]) -> Vec<&[u8]> {
    b.iter().map(|r| r.as_slice()).collect()
}

/// A pinned journal (two records, never truncated, in the first segment) and a churning one
/// written `writes` times under leader 7, truncated after each write to keep its last 12
/// records.
fn churn(c: &mut Conn, writes: u64) -> ((u64, u64), (u64, u64)) {
    let pinned = c.create("acme", "pinned", JournalMode::Multi, JournalDurability::Ordered);
    assert_eq!(c.write(pinned, 0, 0, &[b"old one", b"old two"]).outcome(), JournalOutcome::Accepted);
    let j = c.create("acme", "churn", JournalMode::Single, JournalDurability::Batched);
    assert_eq!(c.set_leader(j, 7, 0).outcome(), JournalOutcome::Leader);
    for i in 0..writes {
        let r = c.write(j, 7, i * 3, &refs(&batch(i)));
        assert_eq!(r.outcome(), JournalOutcome::Accepted, "{r:?}");
        let t = c.truncate(j, 7, (i * 3 + 3).saturating_sub(12));
        assert_eq!(t.outcome(), JournalOutcome::Trimmed, "{t:?}");
    }
    (pinned, j)
}

/// What the two journals of [`churn`] must hold after `writes` writes.
fn check_churned(c: &mut Conn, pinned: (u64, u64), j: (u64, u64), writes: u64) {
    let r = c.read(pinned, 0, 0, 0);
    assert_eq!(r.records, vec![b"old one".to_vec(), b"old two".to_vec()]);
    let end = writes * 3;
    let r = c.read(j, end - 12, 0, 0);
    assert_eq!(r.outcome(), JournalOutcome::Page, "{r:?}");
    let want: Vec<Vec<u8>> = (writes - 4..writes).flat_map(batch).collect();
    assert_eq!(r.records, want, "the last 12 records, in order");
    let st = r.state.unwrap();
    assert_eq!((st.first_seq, st.next_seq), (end - 12, end));
    assert_eq!(c.read(j, end - 13, 0, 0).outcome(), JournalOutcome::Truncated);
    // The log is the dedup table: the last write's exact retry is still a duplicate.
    let last = writes - 1;
    let d = c.write(j, 7, last * 3, &refs(&batch(last)));
    assert_eq!((d.outcome(), d.seq, d.count), (JournalOutcome::Duplicate, last * 3, 3), "{d:?}");
}

#[test]
fn steady_write_and_truncate_keeps_the_journal_files_bounded_and_survives_restarts() {
    let mut server = Server::start(&server_bin(), &[SMALL_SEGMENTS, METRICS]);
    let mut c = Conn::open(server.addr);
    let writes = 300; // about 2.7 MiB of records through 64 KiB segments
    let (pinned, j) = churn(&mut c, writes);
    settle(&mut c);
    let files = segments(&server.data_dir());
    // Live: the pinned journal's segment and the 36 KiB of the churning one's (one or two
    // segments), plus the active one and the sealed ones not yet worth a checkpoint.
    assert!(files.len() <= 6, "the journal log kept {} segments: {files:?}", files.len());
    assert_eq!(files[0].file_name().unwrap(), format!("{:020}.log", 1).as_str(), "the pinned journal's segment stays");
    let metrics = server.metrics();
    assert!(sample(&metrics, "tephra_journal_segments_deleted_total") >= 30, "{metrics}");
    assert!(sample(&metrics, "tephra_journal_checkpoints_total") >= 1, "{metrics}");
    assert_eq!(sample(&metrics, "tephra_journal_log_segments"), files.len() as u64, "{metrics}");
    check_churned(&mut c, pinned, j, writes);

    // A clean restart and a SIGKILL restart both come back from the checkpoint and the log
    // after it, the pinned segment read through the gap.
    server.restart(&server_bin(), &[SMALL_SEGMENTS, METRICS]);
    check_churned(&mut Conn::open(server.addr), pinned, j, writes);
    let mut c = Conn::open(server.addr);
    let r = c.write(j, 7, writes * 3, &refs(&batch(writes)));
    assert_eq!(r.outcome(), JournalOutcome::Accepted, "{r:?}");
    assert_eq!(c.truncate(j, 7, writes * 3 + 3 - 12).outcome(), JournalOutcome::Trimmed);
    server.kill();
    server.restart(&server_bin(), &[SMALL_SEGMENTS]);
    check_churned(&mut Conn::open(server.addr), pinned, j, writes + 1);
}

#[test]
fn deleting_a_journal_gives_its_segments_back() {
    let server = Server::start(&server_bin(), &[SMALL_SEGMENTS]);
    let mut c = Conn::open(server.addr);
    let keep = c.create("acme", "keep", JournalMode::Multi, JournalDurability::Batched);
    let gone = c.create("acme", "gone", JournalMode::Multi, JournalDurability::Batched);
    for i in 0..60 {
        assert_eq!(c.write(gone, 0, 0, &refs(&batch(i))).outcome(), JournalOutcome::Accepted);
    }
    settle(&mut c);
    let before = segments(&server.data_dir()).len();
    assert!(before >= 8, "60 writes of 9 KiB fill several 64 KiB segments, saw {before}");
    assert_eq!(c.delete(gone).outcome(), JournalOutcome::Deleted);
    // The deletion's own commit gives the disk back; a later write lands in the active one.
    assert_eq!(c.write(keep, 0, 0, &[b"still here"]).outcome(), JournalOutcome::Accepted);
    settle(&mut c);
    let after = segments(&server.data_dir()).len();
    assert!(after <= 2, "after the delete {after} of {before} segments are left");
    assert_eq!(c.read(keep, 0, 0, 0).records, vec![b"still here".to_vec()]);
    assert_eq!(c.read(gone, 0, 0, 0).outcome(), JournalOutcome::UnknownJournal);
}

#[test]
fn a_crash_after_the_checkpoint_and_before_the_deletions_loses_nothing() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    let mut server = Server::start(&crash_bin, &[SMALL_SEGMENTS, ("TEPHRA_CRASH_POINT", "journal_after_checkpoint:abort:1")]);
    let mut c = Conn::open(server.addr);
    let pinned = c.create("acme", "pinned", JournalMode::Multi, JournalDurability::Ordered);
    assert_eq!(c.write(pinned, 0, 0, &[b"old one", b"old two"]).outcome(), JournalOutcome::Accepted);
    let j = c.create("acme", "churn", JournalMode::Single, JournalDurability::Batched);
    c.set_leader(j, 7, 0);
    let mut answered = 0;
    for i in 0..60 {
        if c.try_call(support::journal::write_call(j, 7, i * 3, &refs(&batch(i)))).is_err() {
            break;
        }
        answered = i + 1;
        let up_to = (i * 3 + 3).saturating_sub(12);
        let t = c.try_call(journal_request::Call::Truncate(JournalTruncate { tenant: j.0, journal: j.1, up_to, leader: support::journal::uuid_bytes(7) }));
        if t.is_err() {
            break;
        }
    }
    assert!(server.wait_exit(Duration::from_secs(10)).is_some(), "the crash point fired");
    assert!(answered >= 4, "the first checkpoint comes after a few segments, saw {answered} writes");
    let before = segments(&server.data_dir()).len();
    server.restart(&server_bin(), &[SMALL_SEGMENTS]);
    let mut c = Conn::open(server.addr);
    assert_eq!(c.read(pinned, 0, 0, 0).records, vec![b"old one".to_vec(), b"old two".to_vec()]);
    let st = c.read(j, 0, 0, 0).state.unwrap();
    assert!(st.next_seq >= answered * 3, "every answered write is there: {st:?}");
    // The segments the crash left are given back at the next commit.
    let r = c.write(j, 7, st.next_seq, &[b"after"]);
    assert_eq!(r.outcome(), JournalOutcome::Accepted, "{r:?}");
    settle(&mut c);
    let after = segments(&server.data_dir()).len();
    assert!(after < before, "the crash left {before} segments, still {after} after a commit: {:?}\n{}", segments(&server.data_dir()), server.log());
}

/// Starts the server on `data` expecting it to refuse, and returns what it said.
fn refused_start(data: &Path) -> String {
    let args = ["-b", "127.0.0.1:0", "-d", data.to_str().unwrap()];
    let out = support::run_to_exit(&server_bin(), &args, &[SMALL_SEGMENTS], None, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "the server must refuse to start");
    format!("{}{}", out.stdout, out.stderr)
}

/// A data directory whose journal log has a checkpoint and a gap (segments deleted).
fn reclaimed_store() -> (Server, Vec<PathBuf>) {
    let mut server = Server::start(&server_bin(), &[SMALL_SEGMENTS]);
    let mut c = Conn::open(server.addr);
    churn(&mut c, 120);
    settle(&mut c);
    server.kill();
    let files = segments(&server.data_dir());
    assert!(server.data_dir().join("journals/checkpoint").exists());
    (server, files)
}

#[test]
fn a_damaged_checkpoint_stops_the_start_and_changes_nothing() {
    let (server, files) = reclaimed_store();
    let data = server.data_dir();
    let cp = data.join("journals/checkpoint");
    let mut bytes = std::fs::read(&cp).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    std::fs::write(&cp, &bytes).unwrap();
    let said = refused_start(&data);
    assert!(said.contains("checkpoint") && said.contains("body CRC mismatch"), "{said}");
    assert_eq!(segments(&data), files, "no segment was touched");
    assert_eq!(std::fs::read(&cp).unwrap(), bytes, "the checkpoint was left as it was");
}

#[test]
fn a_missing_checkpoint_over_deleted_segments_stops_the_start() {
    let (server, files) = reclaimed_store();
    let data = server.data_dir();
    std::fs::remove_file(data.join("journals/checkpoint")).unwrap();
    let said = refused_start(&data);
    assert!(said.contains("non-contiguous segments"), "{said}");
    assert_eq!(segments(&data), files);
}

#[test]
fn a_missing_segment_that_holds_records_stops_the_start() {
    let (server, files) = reclaimed_store();
    let data = server.data_dir();
    // The first segment holds the pinned journal's records; the checkpoint covers it.
    std::fs::remove_file(&files[0]).unwrap();
    let said = refused_start(&data);
    assert!(said.contains("whose file is missing"), "{said}");
}

#[test]
fn a_failed_checkpoint_deletes_nothing_and_a_later_one_gives_the_disk_back() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    let mut server = Server::start(&crash_bin, &[SMALL_SEGMENTS, METRICS, ("TEPHRA_CRASH_POINT", "journal_checkpoint_write:eio:0:1")]);
    let mut c = Conn::open(server.addr);
    let (pinned, j) = churn(&mut c, 60);
    settle(&mut c);
    assert!(server.log_shows("checkpoint failed; no segment deleted", Duration::from_secs(5)), "{}", server.log());
    let metrics = server.metrics();
    assert!(sample(&metrics, "tephra_journal_checkpoints_total") >= 1, "{metrics}");
    assert!(sample(&metrics, "tephra_journal_segments_deleted_total") >= 1, "{metrics}");
    check_churned(&mut c, pinned, j, 60);
    server.kill();
    server.restart(&server_bin(), &[SMALL_SEGMENTS]);
    check_churned(&mut Conn::open(server.addr), pinned, j, 60);
}

/// A store whose journal log spans several segments (nothing truncated), killed.
fn grown_store() -> (Server, Vec<PathBuf>) {
    let mut server = Server::start(&server_bin(), &[SMALL_SEGMENTS]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "grown", JournalMode::Multi, JournalDurability::Ordered);
    for i in 0..30 {
        assert_eq!(c.write(j, 0, 0, &refs(&batch(i))).outcome(), JournalOutcome::Accepted);
    }
    server.kill();
    let files = segments(&server.data_dir());
    assert!(files.len() >= 3, "{files:?}");
    (server, files)
}

#[test]
fn losing_the_newest_segment_file_stops_the_start() {
    let (server, files) = grown_store();
    let data = server.data_dir();
    std::fs::remove_file(files.last().unwrap()).unwrap();
    let said = refused_start(&data);
    assert!(said.contains("sealed for a successor") && said.contains("newest segment file is missing"), "{said}");
    assert_eq!(segments(&data), files[..files.len() - 1].to_vec(), "nothing was changed");
}

#[test]
fn a_segment_file_cut_short_stops_the_start() {
    let (server, files) = grown_store();
    let data = server.data_dir();
    let newest = files.last().unwrap();
    let bytes = std::fs::read(newest).unwrap();
    let data_end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    let cut = (data_end - 100) as u64;
    std::fs::OpenOptions::new().write(true).open(newest).unwrap().set_len(cut).unwrap();
    let said = refused_start(&data);
    assert!(said.contains("cut short"), "{said}");
    assert_eq!(std::fs::metadata(newest).unwrap().len(), cut, "the file was left as it was");
    assert!(!data.join("journals/recovered").exists(), "nothing was copied aside");
}

#[test]
fn a_write_too_large_for_a_small_segment_is_too_large_not_unavailable() {
    let server = Server::start(&server_bin(), &[SMALL_SEGMENTS]);
    assert!(server.log_shows("journal.max_batch_bytes does not fit a journal segment", Duration::from_secs(5)), "{}", server.log());
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "big", JournalMode::Multi, JournalDurability::Ordered);
    let record = vec![b'x'; 30_000];
    let r = c.write(j, 0, 0, &[&record, &record, &record]);
    assert_eq!(r.outcome(), JournalOutcome::TooLarge, "{r:?}");
    assert!(r.max_bytes < 65_536 && r.max_bytes > 50_000, "the limit named is what a segment holds: {}", r.max_bytes);
    // The largest write the limit lets through is taken.
    let fits = vec![b'y'; r.max_bytes as usize];
    assert_eq!(c.write(j, 0, 0, &[&fits]).outcome(), JournalOutcome::Accepted);
}
