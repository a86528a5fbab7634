//! Layout lock of the replica's durable items in the command log (docs/journals.md §9.3):
//! golden bytes, round trips, and every refusal. If a golden test fails, the on-disk format
//! changed: never regenerate the bytes.

use raft::eraftpb::{Entry, EntryType, HardState};
use tephra::cluster::durable::{decode, encode, group_of, DurableError, DIRECTORY, HARD_STATE_LEN};
use tephra::cluster::replica::Durable;
use tephra::journal::{Command, EntryId, JournalId, LeaderUuid, Mode, StoreDurability};

const J: JournalId = JournalId { tenant: 0x1122334455667788, journal: 0x0102030405060708 };

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn enc(item: &Durable) -> Vec<u8> {
    let mut out = Vec::new();
    encode(item, &mut out).unwrap();
    out
}

fn command(cmd: &Command<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    cmd.encode(EntryId::default(), &mut out);
    out
}

fn entry(term: u64, index: u64, data: Vec<u8>) -> Entry {
    Entry { entry_type: EntryType::EntryNormal as i32, term, index, data, ..Entry::default() }
}

#[test]
fn golden_hard_state() {
    let item = Durable::HardState { journal: J, state: HardState { term: 3, vote: 2, commit: 9 } };
    let bytes = enc(&item);
    assert_eq!(bytes.len(), HARD_STATE_LEN);
    let want = concat!(
        "0106000000000000",                 // version 1, kind 6, reserved
        "00000000000000000000000000000000", // no entry term or index
        "8877665544332211",
        "0807060504030201",
        "0300000000000000", // term 3
        "0200000000000000", // vote 2
        "0900000000000000", // commit 9
    );
    assert_eq!(hex(&bytes), want);
    assert_eq!(decode(&bytes).unwrap(), item);
}

#[test]
fn golden_entries_carry_their_term_and_index_in_the_command_head() {
    let write = command(&Command::Write { journal: J, leader: Some(LeaderUuid(0xa)), seq: 2, records: vec![b"r2"] });
    let bytes = enc(&Durable::Entry { journal: J, entry: entry(3, 9, write.clone()) });
    let mut want = write.clone();
    want[8..16].copy_from_slice(&3u64.to_le_bytes());
    want[16..24].copy_from_slice(&9u64.to_le_bytes());
    assert_eq!(bytes, want);
    assert_eq!(&hex(&bytes)[..48], "010100000000000003000000000000000900000000000000");
    // Read back: the same entry, its data the command as logged.
    let Durable::Entry { journal, entry: e } = decode(&bytes).unwrap() else { panic!("not an entry") };
    assert_eq!((journal, e.term, e.index, e.get_entry_type()), (J, 3, 9, EntryType::EntryNormal));
    assert_eq!(e.data, want);
    // A new leader's empty entry is a Noop of its group.
    let noop = enc(&Durable::Entry { journal: J, entry: entry(4, 10, Vec::new()) });
    assert_eq!(hex(&noop), format!("0104000000000000{}{}{}{}", "0400000000000000", "0a00000000000000", "8877665544332211", "0807060504030201"));
    let Durable::Entry { journal, entry: e } = decode(&noop).unwrap() else { panic!("not an entry") };
    assert_eq!((journal, e.term, e.index, e.data.len()), (J, 4, 10, 0));
}

#[test]
fn directory_commands_belong_to_the_directory_group() {
    let create = Command::CreateJournal { journal: J, name: "orders", mode: Mode::Single, durability: StoreDurability::Ordered };
    assert_eq!(group_of(&create), DIRECTORY);
    assert_eq!(group_of(&Command::CreateTenant { tenant: 5, name: "acme" }), DIRECTORY);
    assert_eq!(group_of(&Command::DeleteJournal { journal: J }), J);
    assert_eq!(group_of(&Command::ReleaseName { journal: J }), DIRECTORY);
    assert_eq!(group_of(&Command::Noop { journal: DIRECTORY }), DIRECTORY);
    assert_eq!(group_of(&Command::Truncate { journal: J, leader: None, up_to: 1 }), J);
    let bytes = enc(&Durable::Entry { journal: DIRECTORY, entry: entry(1, 1, command(&create)) });
    assert!(matches!(decode(&bytes).unwrap(), Durable::Entry { journal: DIRECTORY, .. }));
    let noop = enc(&Durable::Entry { journal: DIRECTORY, entry: entry(1, 2, Vec::new()) });
    assert!(matches!(decode(&noop).unwrap(), Durable::Entry { journal: DIRECTORY, .. }));
}

#[test]
fn every_refusal_is_its_own() {
    let mut out = Vec::new();
    let not_a_command = Durable::Entry { journal: J, entry: entry(1, 1, b"hello".to_vec()) };
    assert!(matches!(encode(&not_a_command, &mut out), Err(DurableError::NotACommand { index: 1, .. })));
    let other = command(&Command::Truncate { journal: DIRECTORY, leader: None, up_to: 0 });
    let wrong = Durable::Entry { journal: J, entry: entry(1, 2, other) };
    assert!(matches!(encode(&wrong, &mut out), Err(DurableError::WrongGroup { index: 2, .. })));
    // Configuration changes: raft's ConfChangeV2 in a journal's group only; v1 never.
    let mut conf = entry(1, 3, vec![0xff]);
    conf.entry_type = EntryType::EntryConfChangeV2 as i32;
    assert!(matches!(encode(&Durable::Entry { journal: J, entry: conf.clone() }, &mut out), Err(DurableError::BadConfChange { index: 3, .. })));
    conf.data = Vec::new();
    assert!(matches!(encode(&Durable::Entry { journal: DIRECTORY, entry: conf }, &mut out), Err(DurableError::Unsupported { index: 3, .. })));
    let mut v1 = entry(1, 4, Vec::new());
    v1.entry_type = EntryType::EntryConfChange as i32;
    assert!(matches!(encode(&Durable::Entry { journal: J, entry: v1 }, &mut out), Err(DurableError::Unsupported { index: 4, .. })));
    assert!(out.is_empty(), "a refused item appends nothing");
    let hs = enc(&Durable::HardState { journal: J, state: HardState::default() });
    assert_eq!(decode(&hs[..HARD_STATE_LEN - 1]), Err(DurableError::HardState("wrong length")));
    let mut reserved = hs.clone();
    reserved[5] = 1;
    assert_eq!(decode(&reserved), Err(DurableError::HardState("non-zero reserved bytes")));
    assert!(matches!(decode(b"\x01\x63"), Err(DurableError::Payload(_))));
}

/// A configuration change entry (kind 7): its term, index and group in the head, raft's
/// `ConfChangeV2` after it (docs/journals.md §9.3); an empty change (leave the joint
/// configuration) is a bare head.
#[test]
fn golden_configuration_change() {
    let mut e = entry(3, 12, vec![0x08, 0x01]);
    e.entry_type = EntryType::EntryConfChangeV2 as i32;
    let item = Durable::Entry { journal: J, entry: e };
    let bytes = enc(&item);
    let head =
        format!("0107000000000000{}{}{}{}", hex(&3u64.to_le_bytes()), hex(&12u64.to_le_bytes()), hex(&J.tenant.to_le_bytes()), hex(&J.journal.to_le_bytes()));
    assert_eq!(hex(&bytes), format!("{head}0801"));
    assert_eq!(decode(&bytes), Ok(item));
    let mut leave = entry(3, 13, Vec::new());
    leave.entry_type = EntryType::EntryConfChangeV2 as i32;
    let bytes = enc(&Durable::Entry { journal: J, entry: leave.clone() });
    assert_eq!(bytes.len(), 40);
    assert_eq!(decode(&bytes), Ok(Durable::Entry { journal: J, entry: leave }));
}

/// A journal group's snapshot data and its record in the command log (kind 8):
/// docs/journals.md §9.9.
#[test]
fn golden_snapshot() {
    use tephra::cluster::snapshot;
    use tephra::journal::{BatchMark, JournalState};
    let state = JournalState {
        mode: Mode::Single,
        durability: StoreDurability::Batched,
        leader: Some(LeaderUuid(0xab)),
        term: 2,
        first_seq: 5,
        next_seq: 9,
        batches: [BatchMark { seq: 7, count: 2, leader: LeaderUuid(0xab), digest: 0x1234 }].into(),
    };
    let data = snapshot::encode(4, &state);
    let u64s = |v: &[u64]| v.iter().map(|x| hex(&x.to_le_bytes())).collect::<String>();
    let want = format!(
        "0100000000000000{}0001000000000000{}{}{}{}{}{}{}",
        u64s(&[4]),
        hex(&0xabu128.to_le_bytes()),
        u64s(&[2, 5, 9]),
        "01000000",
        u64s(&[7]),
        "02000000",
        hex(&0xabu128.to_le_bytes()),
        hex(&0x1234u128.to_le_bytes()),
    );
    assert_eq!(hex(&data), want);
    assert_eq!(snapshot::decode(&data), Ok((4, state.clone())));

    let mut snap = raft::eraftpb::Snapshot { data: data.clone(), ..Default::default() };
    snap.mut_metadata().term = 3;
    snap.mut_metadata().index = 40;
    snap.mut_metadata().set_conf_state(raft::eraftpb::ConfState::from((vec![1, 2, 3], vec![])));
    let item = Durable::Snapshot { journal: J, snapshot: snap };
    let bytes = enc(&item);
    let head = format!("0108000000000000{}{}{}", u64s(&[3, 40]), hex(&J.tenant.to_le_bytes()), hex(&J.journal.to_le_bytes()));
    assert_eq!(hex(&bytes), format!("{head}050000000a03010203{}", hex(&data)));
    assert_eq!(decode(&bytes).unwrap(), item);

    // Every refusal of the data, and a record whose data or configuration is cut short.
    let refused = |mut d: Vec<u8>, at: usize, b: u8| {
        d[at] = b;
        snapshot::decode(&d).unwrap_err()
    };
    assert_eq!(refused(data.clone(), 0, 2), snapshot::SnapshotError::Version(2));
    assert_eq!(refused(data.clone(), 3, 1), snapshot::SnapshotError::Reserved);
    assert_eq!(refused(data.clone(), 20, 1), snapshot::SnapshotError::Reserved);
    assert_eq!(refused(data.clone(), 16, 2), snapshot::SnapshotError::UnknownEnum("mode", 2));
    assert_eq!(refused(data.clone(), 17, 9), snapshot::SnapshotError::UnknownEnum("store durability", 9));
    assert_eq!(refused(data.clone(), 48, 10), snapshot::SnapshotError::State("first_seq is past next_seq"));
    assert!(matches!(refused(data.clone(), 40, 0), snapshot::SnapshotError::State(_)), "a leader without a term");
    assert_eq!(snapshot::decode(&data[..67]), Err(snapshot::SnapshotError::Length { need: 68, got: 67 }));
    assert_eq!(snapshot::decode(&data[..100]), Err(snapshot::SnapshotError::Length { need: 112, got: 100 }));
    for cut in [10, 43, 46, bytes.len() - 1] {
        assert!(matches!(decode(&bytes[..cut]), Err(DurableError::SnapshotRecord(_))), "cut at {cut}");
    }
}
