//! Layout lock of the journal command codec (docs/journals.md §4.2): golden bytes for every
//! kind, a round trip over random commands, and every decode error. If a golden test fails,
//! the on-disk format changed: never regenerate the bytes.

use proptest::prelude::*;
use tephra::journal::{decode_command, Command, CommandError, EntryId, JournalId, LeaderUuid, Mode, StoreDurability};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn enc(c: &Command<'_>, e: EntryId) -> Vec<u8> {
    let mut out = Vec::new();
    c.encode(e, &mut out);
    assert_eq!(out.len(), c.encoded_len());
    out
}

const J: JournalId = JournalId { tenant: 0x1122334455667788, journal: 0x0102030405060708 };
fn head(kind: u8, term: u64, index: u64, tenant: u64, journal: u64) -> String {
    format!("01{kind:02x}000000000000{}{}{}{}", hex(&term.to_le_bytes()), hex(&index.to_le_bytes()), hex(&tenant.to_le_bytes()), hex(&journal.to_le_bytes()))
}

#[test]
fn golden_write() {
    let c = Command::Write { journal: J, leader: Some(LeaderUuid(0xa)), seq: 2, records: vec![b"r2", b""] };
    let got = hex(&enc(&c, EntryId { term: 3, index: 9 }));
    let want = concat!(
        "01",
        "01",
        "000000000000",
        "0300000000000000",
        "0900000000000000",
        "8877665544332211",
        "0807060504030201",
        "0a000000000000000000000000000000", // leader uuid 0xa, u128 LE
        "0200000000000000",                 // seq 2
        "02000000",                         // 2 records
        "02000000",
        "7232",     // "r2"
        "00000000", // ""
    );
    assert_eq!(got, want);
}

#[test]
fn golden_multi_write_set_leader_truncate_noop_delete() {
    let z = EntryId::default();
    let multi = Command::Write { journal: J, leader: None, seq: 0, records: vec![b"x"] };
    assert_eq!(
        hex(&enc(&multi, z)),
        format!("{}{}{}{}{}{}", head(1, 0, 0, J.tenant, J.journal), "0".repeat(32), "0000000000000000", "01000000", "01000000", "78")
    );
    let sl = Command::SetLeader { journal: J, new: LeaderUuid(0xb), old: Some(LeaderUuid(0xa)) };
    assert_eq!(hex(&enc(&sl, z)), format!("{}0b{}0a{}", head(2, 0, 0, J.tenant, J.journal), "0".repeat(30), "0".repeat(30)));
    let first = Command::SetLeader { journal: J, new: LeaderUuid(1 << 127), old: None };
    assert_eq!(hex(&enc(&first, z)), format!("{}{}80{}", head(2, 0, 0, J.tenant, J.journal), "0".repeat(30), "0".repeat(32)));
    let tr = Command::Truncate { journal: J, leader: Some(LeaderUuid(0xb)), up_to: 0x0100 };
    assert_eq!(hex(&enc(&tr, z)), format!("{}0b{}0001000000000000", head(3, 0, 0, J.tenant, J.journal), "0".repeat(30)));
    assert_eq!(hex(&enc(&Command::Noop { journal: J }, z)), head(4, 0, 0, J.tenant, J.journal));
    assert_eq!(hex(&enc(&Command::DeleteJournal { journal: J }, z)), head(18, 0, 0, J.tenant, J.journal));
    assert_eq!(hex(&enc(&Command::ReleaseName { journal: J }, z)), head(19, 0, 0, J.tenant, J.journal));
}

#[test]
fn golden_directory_commands() {
    let z = EntryId::default();
    let t = Command::CreateTenant { tenant: 7, name: "acme" };
    assert_eq!(hex(&enc(&t, z)), format!("{}0400{}", head(16, 0, 0, 7, 0), hex(b"acme")));
    let j = Command::CreateJournal { journal: J, name: "orders", mode: Mode::Multi, durability: StoreDurability::Batched };
    assert_eq!(hex(&enc(&j, z)), format!("{}01010600{}", head(17, 0, 0, J.tenant, J.journal), hex(b"orders")));
    let j = Command::CreateJournal { journal: J, name: "o", mode: Mode::Single, durability: StoreDurability::Ordered };
    assert_eq!(hex(&enc(&j, z)), format!("{}00000100{}", head(17, 0, 0, J.tenant, J.journal), hex(b"o")));
}

/// A cluster's create with its placement (kind 21) and a member's join with its zone (kind 22):
/// docs/journals.md §9.3 and §9.5.
#[test]
fn golden_cluster_placement_commands() {
    let e = EntryId { term: 2, index: 9 };
    let j = Command::CreatePlaced { journal: J, name: "orders", mode: Mode::Multi, durability: StoreDurability::Ordered, survive: 1, voters: vec![1, 3, 4] };
    assert_eq!(
        hex(&enc(&j, e)),
        format!("{}01000103{}{}{}0600{}", head(21, 2, 9, J.tenant, J.journal), "0100000000000000", "0300000000000000", "0400000000000000", hex(b"orders"))
    );
    let c = Command::Configure { journal: J, survive: 2, voters: vec![2, 5] };
    assert_eq!(hex(&enc(&c, e)), format!("{}0202{}{}", head(23, 2, 9, J.tenant, J.journal), "0200000000000000", "0500000000000000"));
    let z = Command::JoinZone { node: 5, incarnation: 0x1122, zone: "eu-1" };
    assert_eq!(hex(&enc(&z, EntryId::default())), format!("{}{}0400{}", head(22, 0, 0, 5, 0), "2211000000000000", hex(b"eu-1")));
}

/// A tenant's default F (kind 24): `survive u8 | name_len u16 | name`, the tenant id in the
/// head (docs/journals.md §4.2, §9.8).
#[test]
fn golden_tenant_default_command() {
    let t = Command::ConfigureTenant { tenant: 7, name: "acme", survive: 2 };
    assert_eq!(hex(&enc(&t, EntryId { term: 3, index: 4 })), format!("{}020400{}", head(24, 3, 4, 7, 0), hex(b"acme")));
}

#[test]
fn every_decode_error() {
    let good = enc(&Command::CreateJournal { journal: J, name: "orders", mode: Mode::Single, durability: StoreDurability::Ordered }, EntryId::default());
    assert_eq!(decode_command(&[]), Err(CommandError::Short("version")));
    let mut v = good.clone();
    v[0] = 2;
    assert_eq!(decode_command(&v), Err(CommandError::Version(2)));
    let mut v = good.clone();
    v[1] = 99;
    assert_eq!(decode_command(&v), Err(CommandError::UnknownKind(99)));
    let mut v = good.clone();
    v[5] = 1;
    assert_eq!(decode_command(&v), Err(CommandError::Reserved));
    let mut v = good.clone();
    v.push(0);
    assert_eq!(decode_command(&v), Err(CommandError::Trailing(1)));
    assert_eq!(decode_command(&good[..good.len() - 1]), Err(CommandError::Short("name")));
    assert_eq!(decode_command(&good[..30]), Err(CommandError::Short("tenant id")));
    let mut v = good.clone();
    v[40] = 5;
    assert_eq!(decode_command(&v), Err(CommandError::UnknownEnum("mode", 5)));
    let mut v = good.clone();
    v[41] = 2;
    assert_eq!(decode_command(&v), Err(CommandError::UnknownEnum("store durability", 2)));
    let mut v = good.clone();
    let n = v.len();
    v[n - 1] = 0xff;
    assert_eq!(decode_command(&v), Err(CommandError::NameNotUtf8));
    // A record count far beyond the bytes fails on the bytes, without a huge allocation.
    let mut w = enc(&Command::Write { journal: J, leader: None, seq: 0, records: vec![] }, EntryId::default());
    w[64..68].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_command(&w), Err(CommandError::Short("record length")));
}

fn command() -> impl Strategy<Value = (u8, u64, u64, u128, u128, u64, Vec<Vec<u8>>, String)> {
    (
        0u8..12,
        any::<u64>(),
        any::<u64>(),
        any::<u128>(),
        any::<u128>(),
        any::<u64>(),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 0..6),
        "[a-z0-9._-]{1,40}",
    )
}

proptest! {
    #[test]
    fn every_command_round_trips((kind, a, b, u1, u2, n, recs, name) in command(), term in any::<u64>(), index in any::<u64>()) {
        let journal = JournalId { tenant: a, journal: b };
        let records: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
        let c = match kind {
            0 => Command::Write { journal, leader: LeaderUuid(u1).set(), seq: n, records },
            1 => Command::SetLeader { journal, new: LeaderUuid(u1), old: LeaderUuid(u2).set() },
            2 => Command::Truncate { journal, leader: LeaderUuid(u1).set(), up_to: n },
            3 => Command::Noop { journal },
            4 => Command::CreateTenant { tenant: a, name: &name },
            5 => Command::CreateJournal { journal, name: &name, mode: if n % 2 == 0 { Mode::Single } else { Mode::Multi }, durability: if u1 % 2 == 0 { StoreDurability::Ordered } else { StoreDurability::Batched } },
            6 => Command::DeleteJournal { journal },
            7 => Command::ReleaseName { journal },
            8 => Command::Join { node: a, incarnation: n },
            9 => Command::CreatePlaced {
                journal,
                name: &name,
                mode: Mode::Multi,
                durability: StoreDurability::Batched,
                survive: (n % 128) as u8,
                voters: recs.iter().map(|r| r.len() as u64).collect(),
            },
            10 => Command::Configure { journal, survive: (n % 128) as u8, voters: recs.iter().map(|r| r.len() as u64).collect() },
            11 => Command::ConfigureTenant { tenant: a, name: &name, survive: (n % 128) as u8 },
            _ => Command::JoinZone { node: a, incarnation: n, zone: &name },
        };
        let entry = EntryId { term, index };
        let bytes = enc(&c, entry);
        prop_assert_eq!(decode_command(&bytes), Ok((entry, c)));
        // Every strict prefix is refused, never misread.
        for cut in 0..bytes.len() {
            prop_assert!(decode_command(&bytes[..cut]).is_err());
        }
    }
}
