//! Journals served by a real `tephra-server` process on loopback, over protocol v1 frames: the
//! seed's sequence diagram, reads and tail waits, limits, bad input, and a restart that keeps
//! every acknowledged write.

use std::time::{Duration, Instant};

use support::journal::leader_of;
use support::{JournalConn as Conn, Server};
use tephra::proto::*;
use tephra_test_support as support;

fn server_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

#[test]
fn the_seeds_sequence_diagram_over_the_wire_and_after_a_kill() {
    let mut server = Server::start(&server_bin(), &[]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    let (a, b) = (0xa, 0xb);
    let r = c.set_leader(j, a, 0);
    assert_eq!((r.outcome(), leader_of(&r), r.state.as_ref().unwrap().next_seq), (JournalOutcome::Leader, a, 0));
    let r = c.write(j, a, 0, &[b"r0", b"r1"]);
    assert_eq!((r.outcome(), r.seq, r.count), (JournalOutcome::Accepted, 0, 2), "{r:?}");
    let r = c.set_leader(j, b, a);
    assert_eq!((r.outcome(), leader_of(&r), r.state.as_ref().unwrap().next_seq), (JournalOutcome::Leader, b, 2));
    let r = c.write(j, a, 2, &[b"r2"]);
    assert_eq!((r.outcome(), leader_of(&r), r.state.as_ref().unwrap().next_seq), (JournalOutcome::Refused, b, 2));
    let r = c.write(j, b, 2, &[b"r2'"]);
    assert_eq!((r.outcome(), r.seq, r.count), (JournalOutcome::Accepted, 2, 1));
    // An exact retry is a duplicate.
    let r = c.write(j, a, 0, &[b"r0", b"r1"]);
    assert_eq!((r.outcome(), r.seq, r.count), (JournalOutcome::Duplicate, 0, 2));
    let r = c.read(j, 0, 0, 0);
    assert_eq!(r.outcome(), JournalOutcome::Page);
    assert_eq!(r.records, vec![b"r0".to_vec(), b"r1".to_vec(), b"r2'".to_vec()]);

    // SIGKILL, restart: every acknowledged call is there.
    server.kill();
    server.restart(&server_bin(), &[]);
    let mut c = Conn::open(server.addr);
    let r = c.read(j, 1, 0, 0);
    assert_eq!(r.records, vec![b"r1".to_vec(), b"r2'".to_vec()]);
    assert_eq!((leader_of(&r), r.state.as_ref().unwrap().next_seq), (b, 3));
    let r = c.write(j, b, 2, &[b"r2'"]);
    assert_eq!(r.outcome(), JournalOutcome::Duplicate, "the dedup table survives a restart");
    let r = c.call(journal_request::Call::List(JournalList { tenant_name: "acme".into() }));
    assert_eq!((r.outcome(), r.journals.len(), r.journals[0].name.as_str()), (JournalOutcome::Listed, 1, "orders"));
}

#[test]
fn a_read_at_the_tail_waits_and_wakes_on_a_write() {
    let server = Server::start(&server_bin(), &[]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "events", JournalMode::Multi, JournalDurability::Batched);
    // Nothing there, no wait: an empty page at once.
    let r = c.read(j, 0, 0, 0);
    assert_eq!((r.outcome(), r.records.len()), (JournalOutcome::Page, 0));
    // A wait that runs out: an empty page after about the wait.
    let t = Instant::now();
    let r = c.read(j, 0, 0, 200);
    assert!(r.records.is_empty() && t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
    // A wait that a write ends.
    let addr = server.addr;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut w = Conn::open(addr);
        w.write(j, 0, 0, &[b"hello"])
    });
    let t = Instant::now();
    let r = c.read(j, 0, 0, 900);
    assert_eq!(r.records, vec![b"hello".to_vec()]);
    assert!(t.elapsed() < Duration::from_millis(850), "answered at once, not at the end of the wait: {:?}", t.elapsed());
    assert_eq!(writer.join().unwrap().outcome(), JournalOutcome::Accepted);
}

#[test]
fn bad_input_gets_a_clear_answer_and_moves_nothing() {
    let server = Server::start(&server_bin(), &[("PAROS_MAX_BATCH_RECORDS", "2"), ("PAROS_MAX_BATCH_BYTES", "100")]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    c.set_leader(j, 7, 0);
    // Zero halves and unknown ids.
    assert_eq!(c.write((0, j.1), 7, 0, &[b"x"]).outcome(), JournalOutcome::UnknownJournal);
    assert_eq!(c.write((j.0, 0), 7, 0, &[b"x"]).outcome(), JournalOutcome::UnknownJournal);
    assert_eq!(c.write((j.0, j.1 ^ 1), 7, 0, &[b"x"]).outcome(), JournalOutcome::UnknownJournal);
    assert_eq!(c.read((j.0, j.1 ^ 1), 0, 0, 0).outcome(), JournalOutcome::UnknownJournal);
    // Over the limits: both limits named.
    let r = c.write(j, 7, 0, &[b"a", b"b", b"c"]);
    assert_eq!((r.outcome(), r.max_records, r.max_bytes), (JournalOutcome::TooLarge, 2, 100));
    let r = c.write(j, 7, 0, &[&[0u8; 101]]);
    assert_eq!(r.outcome(), JournalOutcome::TooLarge);
    // Empty batch, wrong mode, 0 uuid, bad uuid length.
    assert_eq!(c.write(j, 7, 0, &[]).outcome(), JournalOutcome::Refused);
    assert_eq!(c.write(j, 0, 0, &[b"x"]).outcome(), JournalOutcome::WrongMode);
    assert_eq!(c.set_leader(j, 0, 7).outcome(), JournalOutcome::Lost);
    let r = c.call(journal_request::Call::Write(JournalWrite { tenant: j.0, journal: j.1, leader: vec![1, 2, 3], seq: 0, records: vec![b"x".to_vec()] }));
    assert_eq!(r.outcome(), JournalOutcome::Invalid);
    assert!(r.message.contains("16 bytes"), "{}", r.message);
    // Names: malformed, taken.
    let create = |name: &str, survive: Option<u32>| JournalCreate { tenant_name: "acme".into(), journal_name: name.into(), mode: 1, durability: 0, survive };
    let r = c.call(journal_request::Call::Create(create("a/b", None)));
    assert_eq!(r.outcome(), JournalOutcome::InvalidName);
    let r = c.call(journal_request::Call::Create(create("orders", None)));
    assert_eq!((r.outcome(), r.tenant, r.journal), (JournalOutcome::NameTaken, j.0, j.1));
    // A single node keeps one copy: --survive machines=1 cannot be placed, 0 can; F past 127
    // is malformed. A refused create leaves no journal behind.
    let r = c.call(journal_request::Call::Create(create("copies", Some(1))));
    assert_eq!(r.outcome(), JournalOutcome::Unplaceable, "{r:?}");
    assert!(r.message.contains("needs 3 nodes"), "{}", r.message);
    let r = c.call(journal_request::Call::Create(create("copies", Some(128))));
    assert_eq!(r.outcome(), JournalOutcome::Invalid, "{r:?}");
    let r = c.call(journal_request::Call::Create(create("copies", Some(0))));
    assert_eq!(r.outcome(), JournalOutcome::Created, "{r:?}");
    // So does a tenant's default; names and ids together, a bad name and F past 127 are refused.
    let tenant = |name: &str, ids: u64, survive: u32| JournalConfigure { tenant: ids, journal: ids, survive, tenant_name: name.into() };
    assert_eq!(c.call(journal_request::Call::Configure(tenant("acme", 0, 0))).outcome(), JournalOutcome::Configured);
    let r = c.call(journal_request::Call::Configure(tenant("acme", 0, 1)));
    assert!(r.outcome() == JournalOutcome::Unplaceable && r.message.contains("needs 3 nodes"), "{r:?}");
    assert_eq!(c.call(journal_request::Call::Configure(tenant("a/b", 0, 0))).outcome(), JournalOutcome::InvalidName);
    assert_eq!(c.call(journal_request::Call::Configure(tenant("acme", 5, 0))).outcome(), JournalOutcome::Invalid);
    assert_eq!(c.call(journal_request::Call::Configure(tenant("acme", 0, 128))).outcome(), JournalOutcome::Invalid);
    // Truncate past next_seq is clamped; a read far past the tail is an empty page.
    let r = c.call(journal_request::Call::Truncate(JournalTruncate { tenant: j.0, journal: j.1, up_to: 99, leader: 7u128.to_be_bytes().to_vec() }));
    assert_eq!((r.outcome(), r.state.as_ref().unwrap().first_seq), (JournalOutcome::Trimmed, 0));
    let r = c.read(j, 1_000_000, 0, 0);
    assert_eq!((r.outcome(), r.records.len()), (JournalOutcome::Page, 0));
    // Nothing moved.
    let r = c.read(j, 0, 0, 0);
    let s = r.state.unwrap();
    assert_eq!((s.next_seq, s.first_seq), (0, 0));
}

#[test]
fn a_page_never_outgrows_the_frame_limit() {
    // A page limit far above the frame limit: pages are cut to fit the frame instead.
    let env = [("PAROS_MAX_READ_BYTES", "100000000"), ("TEPHRA__SERVER__MAX_FRAME_LEN", "65536")];
    let server = Server::start(&server_bin(), &env);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "big", JournalMode::Multi, JournalDurability::Batched);
    let record = vec![7u8; 20_000];
    for _ in 0..5 {
        assert_eq!(c.write(j, 0, 0, &[&record]).outcome(), JournalOutcome::Accepted);
    }
    let mut from = 0;
    while from < 5 {
        let r = c.read(j, from, 0, 0);
        assert_eq!(r.outcome(), JournalOutcome::Page);
        assert!(!r.records.is_empty() && r.records.len() < 5, "a page of {} records", r.records.len());
        from += r.records.len() as u64;
    }
}

#[test]
fn metrics_count_journal_calls_by_kind_and_outcome() {
    let server = Server::start(&server_bin(), &[("TEPHRA__METRICS__BIND", "127.0.0.1:0")]);
    let mut c = Conn::open(server.addr);
    let j = c.create("acme", "m", JournalMode::Single, JournalDurability::Ordered);
    c.set_leader(j, 1, 0);
    c.write(j, 1, 0, &[b"a"]);
    c.write(j, 2, 1, &[b"b"]); // refused: 2 does not lead
    c.read(j, 0, 0, 0);
    let body = server.metrics();
    for want in [
        "tephra_journal_calls_total{call=\"write\",outcome=\"Accepted\"} 1",
        "tephra_journal_calls_total{call=\"write\",outcome=\"Refused\"} 1",
        "tephra_journal_calls_total{call=\"set_leader\",outcome=\"Leader\"} 1",
        "tephra_journal_calls_total{call=\"read\",outcome=\"Page\"} 1",
        "tephra_journal_calls_total{call=\"create\",outcome=\"Created\"} 1",
        "tephra_journal_waiting_reads 0",
        "tephra_journal_write_latency_seconds_count 2",
    ] {
        assert!(body.contains(want), "no `{want}` in:\n{body}");
    }
    assert!(body.contains("tephra_journal_commit_commands_count"), "{body}");
}
