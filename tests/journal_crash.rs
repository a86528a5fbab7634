//! Crashes and damage under both store durabilities (docs/journals.md §3): under `ordered`,
//! damage before a commit marker on disk is refused, and a crash between the two syncs leaves
//! a tail that is rolled back; under `batched`, damage in the last batch is a torn tail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::journal::write_call;
use support::{JournalConn as Conn, Server};
use tephra::log::record::{read_record, Record};
use tephra::proto::*;
use tephra_test_support as support;

fn server_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

/// The journal log's only segment, and the offset of the last data record's payload in it.
fn last_command(data: &Path) -> (PathBuf, usize, usize) {
    let seg = data.join("journals").join(format!("{:020}.log", 1));
    let bytes = std::fs::read(&seg).unwrap();
    let (mut off, mut last) = (64, None);
    while let Ok((rec, end)) = read_record(&bytes, off) {
        if let Record::Data(p) = rec {
            last = Some((end - p.len(), p.len()));
        }
        off = end;
    }
    let (at, len) = last.expect("a command in the journal log");
    (seg, at, len)
}

/// Flips a byte in the middle of the last command's payload.
fn damage_last_command(data: &Path) {
    let (seg, at, len) = last_command(data);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[at + len / 2] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
}

fn journal_with_a_write(server: &Server, durability: JournalDurability) -> (u64, u64) {
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "orders", JournalMode::Single, durability);
    c.set_leader(j, 7, 0);
    assert_eq!(c.write(j, 7, 0, &[b"first"]).outcome(), JournalOutcome::Accepted);
    assert_eq!(c.write(j, 7, 1, &[b"second, the last batch"]).outcome(), JournalOutcome::Accepted);
    j
}

#[test]
fn under_ordered_damage_before_a_commit_marker_is_refused() {
    let mut server = Server::start(&server_bin(), &[]);
    journal_with_a_write(&server, JournalDurability::Ordered);
    server.kill();
    damage_last_command(&server.data_dir());
    let out = support::run_to_exit(&server_bin(), &["-b", "127.0.0.1:0", "-d", server.data_dir().to_str().unwrap()], &[], None, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "a store with a damaged ordered batch must not open");
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(said.contains("ordered") && said.contains("refusing to roll back an acknowledged batch"), "{said}");
}

#[test]
fn under_batched_damage_in_the_last_batch_is_a_torn_tail() {
    let mut server = Server::start(&server_bin(), &[]);
    let j = journal_with_a_write(&server, JournalDurability::Batched);
    server.kill();
    damage_last_command(&server.data_dir());
    server.restart(&server_bin(), &[]);
    assert!(server.log_shows("rolled back", Duration::from_secs(5)), "{}", server.log());
    let mut c = Conn::open(server.addr);
    let r = c.read(j, 0, 0, 0);
    assert_eq!(r.records, vec![b"first".to_vec()]);
    assert_eq!(r.state.unwrap().next_seq, 1);
}

#[test]
fn a_crash_between_the_two_syncs_of_ordered_loses_only_the_unanswered_write() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    // The create (one commit) and the set-leader (another) pass; the write's commit aborts
    // after its records are durable and before its marker.
    let mut server = Server::start(&crash_bin, &[("TEPHRA_CRASH_POINT", "journal_between_syncs:abort:2")]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    assert_eq!(c.set_leader(j, 7, 0).outcome(), JournalOutcome::Leader);
    assert!(c.try_call(write_call(j, 7, 0, &[b"never answered"])).is_err(), "the server died before answering");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    server.restart(&server_bin(), &[]);
    let mut c = Conn::open(server.addr);
    let r = c.read(j, 0, 0, 0);
    assert!(r.records.is_empty(), "the unanswered write was rolled back");
    assert_eq!(r.state.as_ref().unwrap().next_seq, 0);
    // Everything answered is there, and the journal goes on.
    assert_eq!(support::journal::leader_of(&r), 7);
    assert_eq!(c.write(j, 7, 0, &[b"again"]).outcome(), JournalOutcome::Accepted);
}

#[test]
fn a_rollover_that_finds_no_room_refuses_the_call_and_the_journal_goes_on() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    // The event log's first segment and the journal log's first one take the first two
    // preallocations; the third, the journal log's first rollover, finds no room.
    let env = [("TEPHRA__JOURNAL__SEGMENT_SIZE", "65536"), ("TEPHRA_CRASH_POINT", "segment_extend:enospc:2:1")];
    let mut server = Server::start(&crash_bin, &env);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "events", JournalMode::Multi, JournalDurability::Batched);
    let record = vec![b'x'; 8 * 1024];
    let (mut accepted, mut refused) = (0u64, 0);
    for _ in 0..20 {
        let r = c.write(j, 0, 0, &[&record]);
        match r.outcome() {
            JournalOutcome::Accepted => {
                assert_eq!(r.seq, accepted, "dense seqs");
                accepted += 1;
            }
            JournalOutcome::Unavailable => {
                assert!(r.message.contains("No space left"), "{}", r.message);
                refused += 1;
            }
            other => panic!("unexpected {other:?}: {r:?}"),
        }
    }
    assert_eq!(refused, 1, "only the call that met the full disk is refused");
    assert_eq!(accepted, 19);
    let check = |c: &mut Conn| {
        let mut from = 0;
        while from < accepted {
            let r = c.read(j, from, 0, 0);
            assert!(!r.records.is_empty() && r.records.iter().all(|x| *x == record));
            from += r.records.len() as u64;
        }
        assert_eq!(c.read(j, 0, 0, 0).state.unwrap().next_seq, accepted);
    };
    check(&mut c);
    server.kill();
    server.restart(&server_bin(), &[("TEPHRA__JOURNAL__SEGMENT_SIZE", "65536")]);
    check(&mut Conn::open(server.addr));
}

#[test]
fn a_failed_sync_stops_the_journal_log_and_loses_nothing_answered() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    // Syncs 1-6 pass (the create, the set-leader and the first write, two each under
    // `ordered`); the seventh, the second write's records, fails.
    let mut server = Server::start(&crash_bin, &[("TEPHRA_CRASH_POINT", "journal_sync:eio:6")]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    assert_eq!(c.set_leader(j, 7, 0).outcome(), JournalOutcome::Leader);
    assert_eq!(c.write(j, 7, 0, &[b"kept"]).outcome(), JournalOutcome::Accepted);
    let failed = c.write(j, 7, 1, &[b"never answered"]);
    assert_eq!(failed.outcome(), JournalOutcome::Unavailable, "{failed:?}");
    assert!(failed.message.contains("fdatasync"), "{}", failed.message);
    // Fail-stop: every later call is refused too, and reads still serve what was durable.
    assert_eq!(c.write(j, 7, 1, &[b"again"]).outcome(), JournalOutcome::Unavailable);
    assert_eq!(c.read(j, 0, 0, 0).records, vec![b"kept".to_vec()]);
    server.kill();
    server.restart(&server_bin(), &[]);
    let mut c = Conn::open(server.addr);
    let r = c.read(j, 0, 0, 0);
    assert_eq!(r.records, vec![b"kept".to_vec()], "the write whose sync failed was never answered and is not there");
    assert_eq!(c.write(j, 7, 1, &[b"after"]).outcome(), JournalOutcome::Accepted);
}
