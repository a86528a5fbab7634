//! Layout lock of the journal messages on protocol v1 (`src/proto/journal.rs`,
//! docs/journals.md §6): our kinds sit at field 20 of `Request` and `Response`. If a
//! golden test fails, the wire format changed: never regenerate the bytes.

use prost::Message;
use tephra::proto::{journal_request, request, response, JournalOutcome, JournalRequest, JournalResponse, JournalView, JournalWrite, Request, Response};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const LEADER: [u8; 16] = [0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0x0f];

#[test]
fn golden_single_writer_write_request() {
    let w = JournalWrite { tenant: 1, journal: 2, leader: LEADER.to_vec(), seq: 0, records: vec![b"r0".to_vec()] };
    let req = Request::new(5, request::Kind::Journal(JournalRequest { call: Some(journal_request::Call::Write(w)) }));
    let want = concat!(
        "0805",   // request_id 5
        "a2011c", // field 20, 28 bytes
        "0a1a",   // JournalRequest.write, 26 bytes
        "0801",
        "1002", // tenant 1, journal 2
        "1a10",
        "a00102030405060708090a0b0c0d0e0f", // leader, 16 bytes
        "2a02",
        "7230", // one record "r0"; seq 0 omitted
    );
    assert_eq!(hex(&req.encode_to_vec()), want);
    assert_eq!(Request::decode(&*req.encode_to_vec()).unwrap(), req);
}

#[test]
fn golden_accepted_response() {
    let state = JournalView { leader: LEADER.to_vec(), next_seq: 1, first_seq: 0 };
    let r = JournalResponse { outcome: JournalOutcome::Accepted as i32, state: Some(state), seq: 0, count: 1, ..Default::default() };
    let resp = Response::new(5, response::Kind::Journal(r));
    let want = concat!(
        "0805",
        "a2011a", // id 5, field 20, 26 bytes
        "0801",   // outcome ACCEPTED
        "1214",
        "0a10",
        "a00102030405060708090a0b0c0d0e0f",
        "1001", // state: leader, next_seq 1
        "2001", // count 1
    );
    assert_eq!(hex(&resp.encode_to_vec()), want);
}

#[test]
fn outcome_numbers_are_fixed() {
    // Index i is the outcome numbered i on the wire.
    let names = "Unspecified Accepted Duplicate Refused Truncated WrongMode TooLarge UnknownJournal Busy Leader Lost Trimmed \
                 TruncateRefused Page Unserved Created NameTaken InvalidName Deleted Listed UnknownTenant NotLeader Invalid Unavailable Ambiguous Unplaceable Configured";
    for (n, name) in names.split_whitespace().enumerate() {
        let o = JournalOutcome::try_from(n as i32).unwrap_or_else(|_| panic!("no outcome numbered {n}"));
        assert_eq!(format!("{o:?}"), name, "outcome {n}");
    }
    assert!(JournalOutcome::try_from(27).is_err());
}

#[test]
fn a_dcb_request_is_unchanged_by_the_journal_kinds() {
    // The Hello frame of protocol v1, byte for byte.
    assert_eq!(hex(&Request::hello(7, None).encode_to_vec()), "08073a020801");
}
