//! Layout lock of the peer frame (docs/journals.md §9.4): golden bytes (ours, and raft's own
//! message bytes inside: two nodes of different builds must still understand each other), a
//! round trip, and every refusal. If a golden test fails, the wire changed: never regenerate
//! the bytes.

use prost_011::Message as _;
use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use tephra::cluster::durable::DurableError;
use tephra::cluster::peer::{
    decode_frame, decode_frame_removals, encode_frame, encode_frame_removals, encode_hello, encode_refusal, Frame, GroupMessage, PeerError, PeerFrame,
};
use tephra::journal::{Command, EntryId, JournalId};

const G: JournalId = JournalId { tenant: 1, journal: 2 };

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn heartbeat() -> Message {
    Message { msg_type: MessageType::MsgHeartbeat as i32, to: 2, from: 1, term: 3, commit: 5, ..Message::default() }
}

fn append(data: Vec<u8>) -> Message {
    let entry = Entry { entry_type: EntryType::EntryNormal as i32, term: 3, index: 7, data, ..Entry::default() };
    Message { msg_type: MessageType::MsgAppend as i32, to: 2, from: 1, term: 3, entries: vec![entry], ..Message::default() }
}

#[test]
fn golden_frame() {
    let bytes = encode_frame(0x0a, 1, 2, &[(G, heartbeat())]);
    let raft_heartbeat = "0808100218012003 4005".replace(' ', ""); // type 8, to 2, from 1, term 3, commit 5
    let want = format!("080a10011802 2210 0801 1002 1a0a {raft_heartbeat}").replace(' ', "");
    assert_eq!(hex(&bytes), want);
    assert_eq!(decode_frame(&bytes, 0x0a, 2).unwrap(), (1, vec![(G, heartbeat())]));
}

#[test]
fn golden_frame_with_a_removal() {
    // Field 5: the group (tenant 1, journal 2) whose leader, at term 3, no longer counts node 2
    // among its voters.
    let bytes = encode_frame_removals(0x0a, 1, 2, &[], &[(G, 3)]);
    assert_eq!(hex(&bytes), "080a10011802 2a06 0801 1002 1803".replace(' ', ""));
    assert_eq!(
        decode_frame_removals(&bytes, 0x0a, 2).unwrap(),
        Frame { from: 1, messages: vec![], removed: vec![(G, 3)], incarnation: 0, refused: String::new() }
    );
    // A frame may carry both, and one without removals decodes with none.
    let both = encode_frame_removals(0x0a, 1, 2, &[(G, heartbeat())], &[(G, 3)]);
    assert_eq!(
        decode_frame_removals(&both, 0x0a, 2).unwrap(),
        Frame { from: 1, messages: vec![(G, heartbeat())], removed: vec![(G, 3)], incarnation: 0, refused: String::new() }
    );
    assert_eq!(decode_frame(&both, 0x0a, 2).unwrap(), (1, vec![(G, heartbeat())]));
    let none = encode_frame(0x0a, 1, 2, &[(G, heartbeat())]);
    assert_eq!(decode_frame_removals(&none, 0x0a, 2).unwrap().removed, vec![]);
}

#[test]
fn golden_handshake_and_refusal() {
    // Field 6: the dialer's data directory incarnation (0x1122), in its handshake.
    let hello = encode_hello(0x0a, 1, 2, 0x1122);
    assert_eq!(hex(&hello), "080a10011802 30a222".replace(' ', ""));
    let f = decode_frame_removals(&hello, 0x0a, 2).unwrap();
    assert_eq!((f.from, f.incarnation, f.messages.len(), f.refused.as_str()), (1, 0x1122, 0, ""));
    // Field 7: the acceptor's refusal of that handshake, saying why ("no").
    let refusal = encode_refusal(0x0a, 2, 1, "no");
    assert_eq!(hex(&refusal), "080a10021801 3a026e6f".replace(' ', ""));
    let f = decode_frame_removals(&refusal, 0x0a, 1).unwrap();
    assert_eq!((f.from, f.incarnation, f.refused.as_str()), (2, 0, "no"));
    // A frame of messages tells neither.
    let plain = decode_frame_removals(&encode_frame(0x0a, 1, 2, &[(G, heartbeat())]), 0x0a, 2).unwrap();
    assert_eq!((plain.incarnation, plain.refused.as_str()), (0, ""));
}

#[test]
fn appends_of_journal_commands_pass() {
    let mut cmd = Vec::new();
    Command::Truncate { journal: G, leader: None, up_to: 4 }.encode(EntryId::default(), &mut cmd);
    let m = append(cmd);
    let bytes = encode_frame(9, 1, 2, &[(G, m.clone()), (G, append(Vec::new()))]);
    let (from, got) = decode_frame(&bytes, 9, 2).unwrap();
    assert_eq!((from, got.len()), (1, 2));
    assert_eq!(got[0], (G, m));
}

#[test]
fn every_refusal_is_its_own() {
    let good = encode_frame(9, 1, 2, &[(G, heartbeat())]);
    assert!(matches!(decode_frame(&good[..good.len() - 3], 9, 2), Err(PeerError::Malformed(_))));
    assert_eq!(decode_frame(&good, 8, 2), Err(PeerError::ForeignCluster { theirs: 9, ours: 8 }));
    assert_eq!(decode_frame(&good, 9, 3), Err(PeerError::NotForMe { to: 2, me: 3 }));
    // A message inside that claims another sender than its frame.
    let forged = encode_frame(9, 3, 2, &[(G, heartbeat())]);
    assert!(matches!(decode_frame(&forged, 9, 2), Err(PeerError::Misaddressed { from: 1, frame_from: 3, .. })));
    // Raft bytes that do not decode.
    let junk = PeerFrame {
        cluster: 9,
        from: 1,
        to: 2,
        messages: vec![GroupMessage { tenant: 1, journal: 2, message: vec![0xff; 4] }],
        removed: vec![],
        ..PeerFrame::default()
    };
    assert!(matches!(decode_frame(&prost::Message::encode_to_vec(&junk), 9, 2), Err(PeerError::BadMessage { .. })));
    // An entry that is not a journal command, or not one of its group.
    let not_cmd = encode_frame(9, 1, 2, &[(G, append(b"hello".to_vec()))]);
    assert!(matches!(decode_frame(&not_cmd, 9, 2), Err(PeerError::BadEntry(DurableError::NotACommand { index: 7, .. }))));
    let mut other = Vec::new();
    Command::Truncate { journal: JournalId { tenant: 1, journal: 3 }, leader: None, up_to: 4 }.encode(EntryId::default(), &mut other);
    let wrong = encode_frame(9, 1, 2, &[(G, append(other))]);
    assert!(matches!(decode_frame(&wrong, 9, 2), Err(PeerError::BadEntry(DurableError::WrongGroup { .. }))));
    // The raft bytes of the golden test decode as raft's message.
    assert_eq!(Message::decode(&hex_bytes("080810021801200340 05")[..]).unwrap(), heartbeat());
}

fn hex_bytes(s: &str) -> Vec<u8> {
    let s = s.replace(' ', "");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn a_read_index_request_carries_its_context_in_an_entry_that_is_never_logged() {
    // A follower's read asks the leader with its context (node and tag) as the entry's data.
    let ctx = Entry { data: [1u64.to_le_bytes(), 9u64.to_le_bytes()].concat(), ..Entry::default() };
    let read = Message { msg_type: MessageType::MsgReadIndex as i32, to: 2, from: 1, term: 3, entries: vec![ctx.clone()], ..Message::default() };
    let resp = Message { msg_type: MessageType::MsgReadIndexResp as i32, to: 2, from: 1, term: 3, index: 12, entries: vec![ctx], ..Message::default() };
    let bytes = encode_frame(9, 1, 2, &[(G, read.clone()), (G, resp.clone())]);
    assert_eq!(decode_frame(&bytes, 9, 2).unwrap(), (1, vec![(G, read.clone()), (G, resp)]));
    // A follower (1) forwards node 3's read to its leader (2) under node 3's name.
    let forwarded = Message { from: 3, ..read };
    let bytes = encode_frame(9, 1, 2, &[(G, forwarded.clone())]);
    assert_eq!(decode_frame(&bytes, 9, 2).unwrap(), (1, vec![(G, forwarded)]));
}

/// A snapshot passes only for a journal group and with data that decodes as a journal
/// snapshot (docs/journals.md §9.9): the directory group is never compacted.
#[test]
fn snapshots_pass_only_for_journal_groups_with_journal_state() {
    use tephra::cluster::durable::DIRECTORY;
    use tephra::journal::{JournalState, Mode, StoreDurability};
    let data = tephra::cluster::snapshot::encode(0, &JournalState::new(Mode::Multi, StoreDurability::Ordered));
    let snap = |data: Vec<u8>| {
        let mut m = Message { msg_type: MessageType::MsgSnapshot as i32, to: 2, from: 1, term: 3, ..Message::default() };
        m.mut_snapshot().data = data;
        m.mut_snapshot().mut_metadata().index = 9;
        m
    };
    let good = encode_frame(9, 1, 2, &[(G, snap(data.clone()))]);
    assert_eq!(decode_frame(&good, 9, 2).unwrap(), (1, vec![(G, snap(data.clone()))]));
    let directory = encode_frame(9, 1, 2, &[(DIRECTORY, snap(data.clone()))]);
    assert!(matches!(decode_frame(&directory, 9, 2), Err(PeerError::BadSnapshot { .. })));
    let junk = encode_frame(9, 1, 2, &[(G, snap(vec![1, 2, 3]))]);
    assert!(matches!(decode_frame(&junk, 9, 2), Err(PeerError::BadSnapshot { .. })));
}
