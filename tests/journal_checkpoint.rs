//! Layout lock of the journal checkpoint (docs/journals.md §4.4): golden bytes, a round trip,
//! and every decode error. If the golden test fails, the on-disk format changed: never
//! regenerate the bytes.

use tephra::journal::checkpoint::{decode, encode, CheckpointError, HEAD_LEN};
use tephra::journal::held::{Holdings, Loc};
use tephra::journal::{Answer, Command, Directory, JournalId, LeaderUuid, Mode, StoreDurability};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const T: u64 = 0x1122334455667788;
const J: JournalId = JournalId { tenant: T, journal: 0x0102030405060708 };
const M: JournalId = JournalId { tenant: T, journal: 0x0a };

/// Tenant "t" with a single-writer journal "s" (leader 0xa, records 0..3 written in two
/// batches, 0 truncated) and an empty multi-writer journal "m".
fn state() -> (Directory, Holdings) {
    let mut d = Directory::new();
    let mut h = Holdings::default();
    assert!(matches!(d.apply(&Command::CreateTenant { tenant: T, name: "t" }), Answer::TenantCreated { .. }));
    d.apply(&Command::CreateJournal { journal: J, name: "s", mode: Mode::Single, durability: StoreDurability::Ordered });
    d.apply(&Command::CreateJournal { journal: M, name: "m", mode: Mode::Multi, durability: StoreDurability::Batched });
    d.apply(&Command::SetLeader { journal: J, new: LeaderUuid(0xa), old: None });
    d.apply(&Command::Write { journal: J, leader: Some(LeaderUuid(0xa)), seq: 0, records: vec![b"r0", b"r1"] });
    d.apply(&Command::Write { journal: J, leader: Some(LeaderUuid(0xa)), seq: 2, records: vec![b"r2"] });
    d.apply(&Command::Truncate { journal: J, leader: Some(LeaderUuid(0xa)), up_to: 1 });
    h.push(J, 0, Loc { segment: 1, offset: 0x100, len: 2 });
    h.push(J, 1, Loc { segment: 1, offset: 0x102, len: 2 });
    h.push(J, 2, Loc { segment: 7, offset: 0x40, len: 2 });
    h.trim(J, 1);
    (d, h)
}

/// Each journal's held records from its `first_seq`.
fn held(d: &Directory, h: &Holdings) -> Vec<(JournalId, Vec<Loc>)> {
    d.entries().map(|(id, e)| (id, h.get(id).map(|x| x.from(e.state.first_seq).map(|(_, l)| l).collect()).unwrap_or_default())).collect()
}

#[test]
fn golden_checkpoint() {
    let (d, h) = state();
    let bytes = encode(9, &d, &h);
    let body = concat!(
        "01000000",         // 1 tenant
        "8877665544332211", // its id
        "0100",
        "74",       // "t"
        "02000000", // 2 journals, in id order: "m" (0x0a) first
        "8877665544332211",
        "0a00000000000000",
        "0100",
        "6d",                               // "m"
        "01",                               // multi
        "01",                               // batched
        "00000000000000000000000000000000", // no leader
        "0000000000000000",                 // term 0
        "0000000000000000",                 // first_seq 0
        "0000000000000000",                 // next_seq 0
        "00000000",                         // no batch marks
        "00000000",                         // no runs
        "8877665544332211",
        "0807060504030201",
        "0100",
        "73",                               // "s"
        "00",                               // single
        "00",                               // ordered
        "0a000000000000000000000000000000", // leader 0xa
        "0100000000000000",                 // term 1
        "0100000000000000",                 // first_seq 1
        "0300000000000000",                 // next_seq 3
        "01000000",                         // 1 batch mark (the first batch's was trimmed with seq 0)
    );
    let mark_and_runs = concat!(
        "02000000", // 2 runs
        "0100000000000000",
        "01000000",
        "02010000",
        "02000000", // segment 1: seq 1 at 0x102, 2 bytes
        "0700000000000000",
        "01000000",
        "40000000",
        "02000000", // segment 7: seq 2 at 0x40, 2 bytes
    );
    let got = hex(&bytes);
    assert_eq!(&got[..16], "544a435001000000", "magic TJCP, version 1, reserved");
    assert_eq!(&got[16..32], "0900000000000000", "position 9");
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize, bytes.len() - HEAD_LEN);
    assert_eq!(&got[48..56], hex(&crc32fast::hash(&bytes[HEAD_LEN..]).to_le_bytes()), "body CRC");
    assert_eq!(&got[56..64], hex(&crc32fast::hash(&bytes[..28]).to_le_bytes()), "head CRC");
    let body_hex = &got[HEAD_LEN * 2..];
    assert!(body_hex.starts_with(body), "\n got {body_hex}\nwant {body}...");
    // The batch mark: seq 2, count 1, leader 0xa, then the digest of ["r2"] (16 bytes).
    let mark = &body_hex[body.len()..body.len() + 2 * (8 + 4 + 16 + 16)];
    assert_eq!(&mark[..56], "0200000000000000010000000a000000000000000000000000000000");
    assert_eq!(&mark[56..], hex(&tephra::journal::digest_records([b"r2".as_slice()].into_iter()).to_le_bytes()));
    assert_eq!(&body_hex[body.len() + mark.len()..], mark_and_runs);
}

#[test]
fn a_checkpoint_decodes_to_the_state_it_was_made_of() {
    let (d, h) = state();
    let cp = decode(&encode(9, &d, &h)).unwrap();
    assert_eq!(cp.position, 9);
    assert_eq!(cp.directory, d);
    assert_eq!(held(&cp.directory, &cp.holdings), held(&d, &h));
    assert_eq!(cp.holdings.records(), 2);
    assert!(cp.holdings.is_live(1) && cp.holdings.is_live(7) && !cp.holdings.is_live(2));
    // An empty state too.
    let empty = decode(&encode(0, &Directory::new(), &Holdings::default())).unwrap();
    assert_eq!((empty.position, empty.directory), (0, Directory::new()));
}

#[test]
fn every_decode_error_is_its_own() {
    let (d, h) = state();
    let good = encode(9, &d, &h);
    assert!(matches!(decode(&good[..10]), Err(CheckpointError::Length { need: 32, got: 10 })));
    assert!(matches!(decode(&good[..good.len() - 1]), Err(CheckpointError::Length { .. })));
    let mut longer = good.clone();
    longer.push(0);
    assert!(matches!(decode(&longer), Err(CheckpointError::Length { .. })), "a byte past the body is refused too");
    let mut magic = good.clone();
    magic[0] = b'X';
    assert_eq!(decode(&magic), Err(CheckpointError::Magic));
    let mut head = good.clone();
    head[9] ^= 1;
    assert!(matches!(decode(&head), Err(CheckpointError::Crc { what: "head", .. })));
    let mut body = good.clone();
    let n = body.len();
    body[n - 3] ^= 1;
    assert!(matches!(decode(&body), Err(CheckpointError::Crc { what: "body", .. })));
    // A version this code does not read, with a head CRC that matches it.
    let mut version = good.clone();
    version[4] = 2;
    let crc = crc32fast::hash(&version[..28]);
    version[28..32].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode(&version), Err(CheckpointError::Version(2)));
    // A body whose CRCs match but whose contents do not hold together: records missing.
    let short = encode(9, &d, &Holdings::default());
    match decode(&short) {
        Err(CheckpointError::Body(why)) => assert!(why.contains("held records end at 1, next_seq is 3"), "{why}"),
        other => panic!("{other:?}"),
    }
}
