//! The pure journal verdict (`tephra::journal::apply`) against the seed's rules: the seed's
//! sequence diagram, every answer, and a property test against a brute-force model that
//! keeps every record and every accepted write whole.

use proptest::prelude::*;
use tephra::journal::{apply, digest_records, Call, JournalState, LeaderUuid, Mode, Outcome, Records, StoreDurability, View};

fn single() -> JournalState {
    JournalState::new(Mode::Single, StoreDurability::Ordered)
}

fn u(n: u128) -> LeaderUuid {
    LeaderUuid(n)
}

fn write(leader: u128, seq: u64, records: &[&[u8]]) -> Call {
    Call::Write { leader: LeaderUuid(leader).set(), seq, count: records.len() as u32, digest: Records(records).digest() }
}

fn view(leader: Option<u128>, next_seq: u64, first_seq: u64) -> View {
    View { leader: leader.map(LeaderUuid), next_seq, first_seq }
}

/// The seed's sequence diagram, step by step.
#[test]
fn the_seeds_sequence_diagram() {
    let mut j = single();
    let (a, b) = (0xa, 0xb);
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(a), old: None }), Outcome::Leader(view(Some(a), 0, 0)));
    assert_eq!(apply(&mut j, &write(a, 0, &[b"r0", b"r1"])), Outcome::Accepted { seq: 0, count: 2 });
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(b), old: Some(u(a)) }), Outcome::Leader(view(Some(b), 2, 0)));
    assert_eq!(apply(&mut j, &write(a, 2, &[b"r2"])), Outcome::Refused(view(Some(b), 2, 0)));
    assert_eq!(apply(&mut j, &write(b, 2, &[b"r2'"])), Outcome::Accepted { seq: 2, count: 1 });
    assert_eq!(j.term, 2);
}

#[test]
fn an_exact_retry_is_a_duplicate_and_anything_else_below_next_seq_is_refused() {
    let mut j = single();
    apply(&mut j, &Call::SetLeader { new: u(1), old: None });
    apply(&mut j, &write(1, 0, &[b"x", b"y"]));
    apply(&mut j, &write(1, 2, &[b"z"]));
    let before = j.clone();
    assert_eq!(apply(&mut j, &write(1, 0, &[b"x", b"y"])), Outcome::Duplicate { seq: 0, count: 2 });
    assert_eq!(apply(&mut j, &write(1, 2, &[b"z"])), Outcome::Duplicate { seq: 2, count: 1 });
    // Other bytes, another split of the same bytes, a position inside a batch, another uuid.
    assert_eq!(apply(&mut j, &write(1, 0, &[b"x", b"Y"])), Outcome::Refused(view(Some(1), 3, 0)));
    assert_eq!(apply(&mut j, &write(1, 0, &[b"xy"])), Outcome::Refused(view(Some(1), 3, 0)));
    assert_eq!(apply(&mut j, &write(1, 1, &[b"y"])), Outcome::Refused(view(Some(1), 3, 0)));
    assert_eq!(apply(&mut j, &write(2, 0, &[b"x", b"y"])), Outcome::Refused(view(Some(1), 3, 0)));
    // Past the tail, and an empty batch.
    assert_eq!(apply(&mut j, &write(1, 4, &[b"w"])), Outcome::Refused(view(Some(1), 3, 0)));
    assert_eq!(apply(&mut j, &write(1, 3, &[])), Outcome::Refused(view(Some(1), 3, 0)));
    assert_eq!(j, before, "refusals and duplicates move nothing");
    // A superseded writer's exact retry is still its accepted write.
    apply(&mut j, &Call::SetLeader { new: u(2), old: Some(u(1)) });
    assert_eq!(apply(&mut j, &write(1, 2, &[b"z"])), Outcome::Duplicate { seq: 2, count: 1 });
}

#[test]
fn truncation_is_fenced_clamped_and_never_lowers_first_seq() {
    let mut j = single();
    apply(&mut j, &Call::SetLeader { new: u(1), old: None });
    apply(&mut j, &write(1, 0, &[b"a", b"b", b"c"]));
    apply(&mut j, &write(1, 3, &[b"d"]));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: Some(u(2)), up_to: 2 }), Outcome::TruncateRefused(view(Some(1), 4, 0)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: None, up_to: 2 }), Outcome::WrongMode(view(Some(1), 4, 0)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: Some(u(1)), up_to: 2 }), Outcome::Trimmed(view(Some(1), 4, 2)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: Some(u(1)), up_to: 1 }), Outcome::Trimmed(view(Some(1), 4, 2)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: Some(u(1)), up_to: 99 }), Outcome::Trimmed(view(Some(1), 4, 4)));
    // The batch at 0 is gone: its retry can no longer be judged.
    assert_eq!(apply(&mut j, &write(1, 0, &[b"a", b"b", b"c"])), Outcome::Truncated(view(Some(1), 4, 4)));
    assert_eq!(apply(&mut j, &write(1, 3, &[b"d"])), Outcome::Truncated(view(Some(1), 4, 4)));
    assert!(j.batches.is_empty());
}

#[test]
fn set_leader_is_a_compare_and_set() {
    let mut j = single();
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(0), old: None }), Outcome::LeaderRefused(view(None, 0, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(1), old: Some(u(5)) }), Outcome::LeaderRefused(view(None, 0, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(1), old: None }), Outcome::Leader(view(Some(1), 0, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(1), old: Some(u(1)) }), Outcome::LeaderRefused(view(Some(1), 0, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(2), old: None }), Outcome::LeaderRefused(view(Some(1), 0, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(2), old: Some(u(1)) }), Outcome::Leader(view(Some(2), 0, 0)));
    // A uuid that led before may win again (decision C); the fence still holds.
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(1), old: Some(u(2)) }), Outcome::Leader(view(Some(1), 0, 0)));
    assert_eq!(j.term, 3);
    assert_eq!(apply(&mut j, &write(2, 0, &[b"late"])), Outcome::Refused(view(Some(1), 0, 0)));
    assert_eq!(apply(&mut j, &write(1, 0, &[b"ok"])), Outcome::Accepted { seq: 0, count: 1 });
}

#[test]
fn multi_writer_appends_at_the_tail_without_dedup_and_refuses_single_writer_shapes() {
    let mut j = JournalState::new(Mode::Multi, StoreDurability::Batched);
    let m = |recs: &[&[u8]]| Call::Write { leader: None, seq: 0, count: recs.len() as u32, digest: Records(recs).digest() };
    assert_eq!(apply(&mut j, &m(&[b"a"])), Outcome::Accepted { seq: 0, count: 1 });
    assert_eq!(apply(&mut j, &m(&[b"a"])), Outcome::Accepted { seq: 1, count: 1 });
    assert_eq!(apply(&mut j, &m(&[])), Outcome::Refused(view(None, 2, 0)));
    assert_eq!(apply(&mut j, &write(7, 2, &[b"b"])), Outcome::WrongMode(view(None, 2, 0)));
    assert_eq!(apply(&mut j, &Call::SetLeader { new: u(7), old: None }), Outcome::WrongMode(view(None, 2, 0)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: Some(u(7)), up_to: 1 }), Outcome::WrongMode(view(None, 2, 0)));
    assert_eq!(apply(&mut j, &Call::Truncate { leader: None, up_to: 1 }), Outcome::Trimmed(view(None, 2, 1)));
    // A single-writer journal refuses the multi-writer shape.
    let mut s = single();
    assert_eq!(apply(&mut s, &m(&[b"a"])), Outcome::WrongMode(view(None, 0, 0)));
    assert_eq!(apply(&mut s, &Call::Noop), Outcome::Noop);
}

#[test]
fn the_digest_separates_splits_and_orders() {
    let d = |r: &[&[u8]]| digest_records(r.iter().copied());
    assert_ne!(d(&[b"ab"]), d(&[b"a", b"b"]));
    assert_ne!(d(&[b"a", b"b"]), d(&[b"b", b"a"]));
    assert_ne!(d(&[b""]), d(&[]));
    assert_eq!(d(&[b"a", b"b"]), d(&[b"a", b"b"]));
}

// ---- the brute-force model ----

/// The seed's rules over whole data: every held record with the write that put it there.
#[derive(Clone, Debug, Default)]
struct Model {
    multi: bool,
    leader: Option<u128>,
    term: u64,
    first: u64,
    /// Every record ever accepted, by seq: (the write's first seq, its uuid, its records).
    log: Vec<(u64, u128, Vec<Vec<u8>>)>,
}

#[derive(Clone, Debug)]
enum Op {
    Write { leader: u128, seq_from_tail: i64, recs: Vec<Vec<u8>> },
    SetLeader { new: u128, old: Option<u128> },
    Truncate { leader: u128, up_to_from_tail: i64 },
}

impl Model {
    fn view(&self) -> View {
        View { leader: self.leader.map(LeaderUuid), next_seq: self.log.len() as u64, first_seq: self.first }
    }

    fn step(&mut self, call: &Call, recs: &[Vec<u8>]) -> Outcome {
        let next = self.log.len() as u64;
        match *call {
            Call::Write { leader, seq, .. } => {
                let uuid = leader.map(|l| l.0).unwrap_or(0);
                if self.multi != (uuid == 0) {
                    return Outcome::WrongMode(self.view());
                }
                if recs.is_empty() {
                    return Outcome::Refused(self.view());
                }
                if self.multi {
                    for _ in recs {
                        self.log.push((next, 0, recs.to_vec()));
                    }
                    return Outcome::Accepted { seq: next, count: recs.len() as u32 };
                }
                if seq < self.first {
                    return Outcome::Truncated(self.view());
                }
                if seq < next {
                    let (start, by, batch) = &self.log[seq as usize];
                    return if *start == seq && *by == uuid && batch == recs {
                        Outcome::Duplicate { seq, count: recs.len() as u32 }
                    } else {
                        Outcome::Refused(self.view())
                    };
                }
                if self.leader != Some(uuid) || seq != next {
                    return Outcome::Refused(self.view());
                }
                for _ in recs {
                    self.log.push((seq, uuid, recs.to_vec()));
                }
                Outcome::Accepted { seq, count: recs.len() as u32 }
            }
            Call::SetLeader { new, old } => {
                if self.multi {
                    return Outcome::WrongMode(self.view());
                }
                let old = old.map(|o| o.0).filter(|&o| o != 0);
                if new.0 == 0 || self.leader == Some(new.0) || self.leader != old {
                    return Outcome::LeaderRefused(self.view());
                }
                self.leader = Some(new.0);
                self.term += 1;
                Outcome::Leader(self.view())
            }
            Call::Truncate { leader, up_to } => {
                let uuid = leader.map(|l| l.0).unwrap_or(0);
                if self.multi != (uuid == 0) {
                    return Outcome::WrongMode(self.view());
                }
                if !self.multi && self.leader != Some(uuid) {
                    return Outcome::TruncateRefused(self.view());
                }
                self.first = self.first.max(up_to.min(next));
                Outcome::Trimmed(self.view())
            }
            Call::Noop => Outcome::Noop,
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    // Few uuids (0 = none, so multi-shaped), few record values: retries, reinstated uuids and
    // shape mismatches all happen often.
    let uuid = 0u128..4;
    let rec = prop::collection::vec(prop::sample::select(vec![b"a".to_vec(), b"b".to_vec(), b"ab".to_vec(), Vec::new()]), 0..4);
    prop_oneof![
        4 => (uuid.clone(), -4i64..2, rec).prop_map(|(leader, seq_from_tail, recs)| Op::Write { leader, seq_from_tail, recs }),
        2 => (uuid.clone(), prop::option::of(uuid.clone())).prop_map(|(new, old)| Op::SetLeader { new, old }),
        1 => (uuid, -4i64..3).prop_map(|(leader, up_to_from_tail)| Op::Truncate { leader, up_to_from_tail }),
    ]
}

fn at(next: u64, from_tail: i64) -> u64 {
    (next as i64 + from_tail).max(0) as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn apply_matches_the_brute_force_model(multi in any::<bool>(), ops in prop::collection::vec(op(), 1..60)) {
        let mode = if multi { Mode::Multi } else { Mode::Single };
        let mut j = JournalState::new(mode, StoreDurability::Ordered);
        let mut m = Model { multi, ..Model::default() };
        // Writes a leader actually accepted, to replay later as exact retries.
        let mut accepted: Vec<(u128, u64, Vec<Vec<u8>>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let next = j.next_seq;
            let (call, recs) = match op {
                Op::Write { leader, seq_from_tail, recs } => {
                    // Every third write replays an accepted one, when there is one.
                    let (leader, seq, recs) = if i % 3 == 0 && !accepted.is_empty() {
                        accepted[(i / 3) % accepted.len()].clone()
                    } else {
                        (*leader, at(next, *seq_from_tail), recs.clone())
                    };
                    let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
                    (Call::Write { leader: LeaderUuid(leader).set(), seq, count: recs.len() as u32, digest: Records(&refs).digest() }, recs)
                }
                Op::SetLeader { new, old } => (Call::SetLeader { new: LeaderUuid(*new), old: old.map(LeaderUuid) }, vec![]),
                Op::Truncate { leader, up_to_from_tail } => (Call::Truncate { leader: LeaderUuid(*leader).set(), up_to: at(next, *up_to_from_tail) }, vec![]),
            };
            let got = apply(&mut j, &call);
            let want = m.step(&call, &recs);
            prop_assert_eq!(got, want, "call {:?}", call);
            prop_assert_eq!(j.view(), m.view());
            prop_assert_eq!(j.term, m.term);
            j.check_marks();
            if let (Outcome::Accepted { seq, .. }, Call::Write { leader: Some(l), .. }) = (got, call) {
                accepted.push((l.0, seq, recs));
            }
        }
    }
}

// ---- the directory ----

mod directory {
    use tephra::journal::{valid_name, Answer, Command, Directory, JournalId, LeaderUuid, Mode, Outcome, StoreDurability, View};

    const ACME: u64 = 0xac;
    const ORDERS: JournalId = JournalId { tenant: ACME, journal: 0x0d };

    fn acme_orders() -> Directory {
        let mut d = Directory::new();
        assert_eq!(d.apply(&Command::CreateTenant { tenant: ACME, name: "acme" }), Answer::TenantCreated { tenant: ACME });
        let create = Command::CreateJournal { journal: ORDERS, name: "orders", mode: Mode::Single, durability: StoreDurability::Ordered };
        assert_eq!(d.apply(&create), Answer::JournalCreated { journal: ORDERS });
        d
    }

    #[test]
    fn names_are_unique_and_ids_are_never_reused_or_zero() {
        let mut d = acme_orders();
        assert_eq!(d.apply(&Command::CreateTenant { tenant: 5, name: "acme" }), Answer::NameTaken { existing: JournalId { tenant: ACME, journal: 0 } });
        assert_eq!(d.apply(&Command::CreateTenant { tenant: ACME, name: "globex" }), Answer::NameTaken { existing: JournalId { tenant: ACME, journal: 0 } });
        assert_eq!(d.apply(&Command::CreateTenant { tenant: 0, name: "globex" }), Answer::NameTaken { existing: JournalId { tenant: 0, journal: 0 } });
        let again =
            Command::CreateJournal { journal: JournalId { tenant: ACME, journal: 9 }, name: "orders", mode: Mode::Multi, durability: StoreDurability::Batched };
        assert_eq!(d.apply(&again), Answer::NameTaken { existing: ORDERS });
        let same_id = Command::CreateJournal { journal: ORDERS, name: "other", mode: Mode::Multi, durability: StoreDurability::Batched };
        assert_eq!(d.apply(&same_id), Answer::NameTaken { existing: ORDERS });
        let zero =
            Command::CreateJournal { journal: JournalId { tenant: ACME, journal: 0 }, name: "z", mode: Mode::Multi, durability: StoreDurability::Batched };
        assert_eq!(d.apply(&zero), Answer::NameTaken { existing: JournalId { tenant: ACME, journal: 0 } });
        let orphan =
            Command::CreateJournal { journal: JournalId { tenant: 77, journal: 1 }, name: "x", mode: Mode::Multi, durability: StoreDurability::Batched };
        assert_eq!(d.apply(&orphan), Answer::UnknownTenant);
        assert_eq!(d.apply(&Command::CreateTenant { tenant: 6, name: "bad/name" }), Answer::InvalidName);
        assert_eq!(d.journals_of(ACME).count(), 1);
    }

    #[test]
    fn calls_reach_their_journal_and_unknown_or_zero_ids_are_unknown() {
        let mut d = acme_orders();
        let sl = Command::SetLeader { journal: ORDERS, new: LeaderUuid(7), old: None };
        assert_eq!(d.apply(&sl), Answer::Journal(Outcome::Leader(View { leader: Some(LeaderUuid(7)), next_seq: 0, first_seq: 0 })));
        let w = Command::Write { journal: ORDERS, leader: Some(LeaderUuid(7)), seq: 0, records: vec![b"hello"] };
        assert_eq!(d.apply(&w), Answer::Journal(Outcome::Accepted { seq: 0, count: 1 }));
        assert_eq!(d.apply(&w), Answer::Journal(Outcome::Duplicate { seq: 0, count: 1 }));
        for id in [JournalId { tenant: 0, journal: 0x0d }, JournalId { tenant: ACME, journal: 0 }, JournalId { tenant: ACME, journal: 0x0e }] {
            assert_eq!(d.apply(&Command::Write { journal: id, leader: None, seq: 0, records: vec![b"x"] }), Answer::UnknownJournal);
        }
        assert_eq!(d.journal_named("acme", "orders").map(|(id, e)| (id, e.state.next_seq)), Some((ORDERS, 1)));
    }

    #[test]
    fn a_deleted_journal_is_unknown_and_its_name_is_free() {
        let mut d = acme_orders();
        assert!(matches!(d.apply(&Command::DeleteJournal { journal: ORDERS }), Answer::Deleted { .. }));
        assert_eq!(d.apply(&Command::DeleteJournal { journal: ORDERS }), Answer::UnknownJournal);
        assert_eq!(d.apply(&Command::Truncate { journal: ORDERS, leader: None, up_to: 0 }), Answer::UnknownJournal);
        assert!(d.journal_named("acme", "orders").is_none());
        let again = Command::CreateJournal {
            journal: JournalId { tenant: ACME, journal: 0x0f },
            name: "orders",
            mode: Mode::Multi,
            durability: StoreDurability::Batched,
        };
        assert_eq!(d.apply(&again), Answer::JournalCreated { journal: JournalId { tenant: ACME, journal: 0x0f } });
    }

    #[test]
    fn name_rules() {
        for ok in ["acme", "a", "orders-2026.v1", "A_b", &"x".repeat(64)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", "id:12", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
