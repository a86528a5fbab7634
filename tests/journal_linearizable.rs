//! Histories of concurrent real clients against a real server, with the server SIGKILLed and
//! restarted mid-run (calls in flight then have no answer: ambiguous), checked for
//! linearizability against a sequential model of the journal (stateright's
//! `LinearizabilityTester`; the model is `tephra::journal::apply` plus the records).
//!
//! What it proves (issue: journals on one node): no acknowledged write is lost across the
//! kill, seqs are dense, no single-writer write is applied twice, `first_seq` never goes back,
//! and every answer is one a sequential journal could give at some point inside the call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use support::journal::{leader_of, uuid_bytes, write_call, Ids};
use support::{JournalConn as Conn, Server};
use tephra::journal::{apply, Call, JournalState, LeaderUuid, Mode, Outcome, Records, StoreDurability};
use tephra::proto::*;
use tephra_test_support as support;

/// The sequential journal: its state and the records it holds (each record a unique token).
#[derive(Clone, Debug)]
struct Journal {
    state: JournalState,
    records: Vec<u64>,
}

#[derive(Clone, Debug)]
enum Op {
    Write { leader: u128, seq: u64, token: u64 },
    SetLeader { new: u128, old: u128 },
    Truncate { leader: u128, up_to: u64 },
    Read { from: u64 },
}

/// An answer, as much of it as a sequential journal fixes.
#[derive(Clone, Debug, PartialEq)]
enum Ret {
    /// A write's or truncate's or set-leader's outcome name, its seq and count (writes).
    Verdict(&'static str, u64, u32),
    /// A verdict that carries the view it was judged against: leader, next_seq, first_seq.
    Viewed(&'static str, u128, u64, u64),
    /// A read: the records from `from` and the view.
    Page(Vec<u64>, u128, u64, u64),
    /// A read below `first_seq`.
    ReadTruncated(u64),
}

fn token_bytes(token: u64) -> [u8; 8] {
    token.to_be_bytes()
}

impl SequentialSpec for Journal {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        let viewed = |name, v: tephra::journal::View| Ret::Viewed(name, v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
        let call = match *op {
            Op::Read { from } => {
                let v = self.state.view();
                if from < v.first_seq {
                    return Ret::ReadTruncated(v.first_seq);
                }
                let at = (from.min(v.next_seq) - v.first_seq) as usize;
                let held = &self.records[self.records.len() - (v.next_seq - v.first_seq) as usize..];
                return Ret::Page(held[at..].to_vec(), v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
            }
            Op::Write { leader, seq, token } => {
                let bytes = token_bytes(token);
                Call::Write { leader: LeaderUuid(leader).set(), seq, count: 1, digest: Records(&[&bytes]).digest() }
            }
            Op::SetLeader { new, old } => Call::SetLeader { new: LeaderUuid(new), old: LeaderUuid(old).set() },
            Op::Truncate { leader, up_to } => Call::Truncate { leader: LeaderUuid(leader).set(), up_to },
        };
        match apply(&mut self.state, &call) {
            Outcome::Accepted { seq, count } => {
                if let Op::Write { token, .. } = op {
                    self.records.push(*token);
                }
                Ret::Verdict("accepted", seq, count)
            }
            Outcome::Duplicate { seq, count } => Ret::Verdict("duplicate", seq, count),
            Outcome::Refused(v) => viewed("refused", v),
            Outcome::Truncated(v) => viewed("truncated", v),
            Outcome::WrongMode(v) => viewed("wrong_mode", v),
            Outcome::Leader(v) => viewed("leader", v),
            Outcome::LeaderRefused(v) => viewed("lost", v),
            Outcome::Trimmed(v) => viewed("trimmed", v),
            Outcome::TruncateRefused(v) => viewed("truncate_refused", v),
            Outcome::Noop => Ret::Verdict("noop", 0, 0),
        }
    }
}

/// The server's answer in the model's terms.
fn ret_of(op: &Op, r: &JournalResponse) -> Ret {
    let view = r.state.as_ref().map(|s| (leader_of(r), s.next_seq, s.first_seq)).unwrap_or_default();
    let name = match r.outcome() {
        JournalOutcome::Accepted => return Ret::Verdict("accepted", r.seq, r.count),
        JournalOutcome::Duplicate => return Ret::Verdict("duplicate", r.seq, r.count),
        JournalOutcome::Page => {
            let records = r.records.iter().map(|b| u64::from_be_bytes(b.as_slice().try_into().unwrap())).collect();
            return Ret::Page(records, view.0, view.1, view.2);
        }
        JournalOutcome::Truncated if matches!(op, Op::Read { .. }) => return Ret::ReadTruncated(view.2),
        JournalOutcome::Refused => "refused",
        JournalOutcome::Truncated => "truncated",
        JournalOutcome::WrongMode => "wrong_mode",
        JournalOutcome::Leader => "leader",
        JournalOutcome::Lost => "lost",
        JournalOutcome::Trimmed => "trimmed",
        JournalOutcome::TruncateRefused => "truncate_refused",
        other => panic!("unexpected answer {other:?} to {op:?}: {r:?}"),
    };
    Ret::Viewed(name, view.0, view.1, view.2)
}

fn call_of(j: Ids, op: &Op) -> journal_request::Call {
    match *op {
        Op::Write { leader, seq, token } => write_call(j, leader, seq, &[&token_bytes(token)]),
        Op::SetLeader { new, old } => {
            journal_request::Call::SetLeader(JournalSetLeader { tenant: j.0, journal: j.1, new: new.to_be_bytes().to_vec(), old: uuid_bytes(old) })
        }
        Op::Truncate { leader, up_to } => journal_request::Call::Truncate(JournalTruncate { tenant: j.0, journal: j.1, up_to, leader: uuid_bytes(leader) }),
        Op::Read { from } => journal_request::Call::Read(JournalRead { tenant: j.0, journal: j.1, from_seq: from, limit: 0, wait_ms: 0 }),
    }
}

type Tester = LinearizabilityTester<u64, Journal>;

/// One client: a loop of calls chosen from what it last saw, recorded in `history`. A call
/// without an answer stays in flight for good (ambiguous), and the client goes on as a new
/// thread of the history on a new connection.
fn client(me: u64, j: Ids, addr: Arc<Mutex<std::net::SocketAddr>>, history: Arc<Mutex<Tester>>, until: Instant) {
    let mut thread = me * 1000;
    let mut conn: Option<Conn> = None;
    let (mut leader, mut next, mut first) = (0u128, 0u64, 0u64);
    let mut i = 0u64;
    // A short history per client: the checker's search grows fast with concurrent calls.
    while Instant::now() < until && i < 25 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(15));
        }
        i += 1;
        let uuid = 1 + (me as u128 + i as u128) % 3; // few uuids: reinstated leaders happen
        let op = match i % 6 {
            0 => Op::SetLeader { new: uuid, old: leader },
            1..=3 => Op::Write {
                leader: if i % 5 == 0 { uuid } else { leader.max(1) },
                seq: if i % 7 == 0 { next.saturating_sub(1) } else { next },
                token: me << 32 | i,
            },
            4 => Op::Read { from: first.max(next.saturating_sub(3)) },
            _ if i % 12 == 5 => Op::Truncate { leader, up_to: first + 1 },
            _ => Op::Read { from: first },
        };
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::try_open(*addr.lock().unwrap()) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            },
        };
        history.lock().unwrap().on_invoke(thread, op.clone()).unwrap();
        match c.try_call(call_of(j, &op)) {
            Ok(r) => {
                if let Some(s) = &r.state {
                    (leader, next, first) = (leader_of(&r), s.next_seq, s.first_seq);
                }
                if r.outcome() == JournalOutcome::Accepted {
                    next = r.seq + u64::from(r.count);
                }
                history.lock().unwrap().on_return(thread, ret_of(&op, &r)).unwrap();
            }
            Err(_) => {
                // No answer: ambiguous. The call stays in flight; go on as a new thread.
                thread += 1;
                conn = None;
            }
        }
    }
}

#[test]
fn concurrent_clients_across_a_kill_see_a_linearizable_journal() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let mut server = Server::start(&bin, &[]);
    let j = Conn::open(server.addr).create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    let addr = Arc::new(Mutex::new(server.addr));
    let initial = Journal { state: JournalState::new(Mode::Single, StoreDurability::Ordered), records: Vec::new() };
    let history = Arc::new(Mutex::new(LinearizabilityTester::new(initial)));
    let until = Instant::now() + Duration::from_millis(1500);
    let clients: Vec<_> = (1..=2)
        .map(|me| {
            let (addr, history) = (Arc::clone(&addr), Arc::clone(&history));
            std::thread::spawn(move || client(me, j, addr, history, until))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(250));
    server.kill();
    server.restart(&bin, &[]);
    *addr.lock().unwrap() = server.addr;
    for c in clients {
        c.join().unwrap();
    }
    let h = history.lock().unwrap();
    assert!(h.len() > 20, "too short a history to mean anything: {} calls", h.len());
    assert!(h.serialized_history().is_some(), "not linearizable:\n{h:#?}");
}

#[test]
fn the_checker_refuses_a_lost_acknowledged_write() {
    // A write acknowledged, then a later read that does not hold it: no order explains it.
    let initial = Journal { state: JournalState::new(Mode::Single, StoreDurability::Ordered), records: Vec::new() };
    let mut h = LinearizabilityTester::new(initial);
    h.on_invret(1, Op::SetLeader { new: 1, old: 0 }, Ret::Viewed("leader", 1, 0, 0)).unwrap();
    h.on_invret(1, Op::Write { leader: 1, seq: 0, token: 7 }, Ret::Verdict("accepted", 0, 1)).unwrap();
    h.on_invret(2, Op::Read { from: 0 }, Ret::Page(vec![], 1, 0, 0)).unwrap();
    assert!(h.serialized_history().is_none());
    // The same read while the write was still in flight is fine.
    let initial = Journal { state: JournalState::new(Mode::Single, StoreDurability::Ordered), records: Vec::new() };
    let mut h = LinearizabilityTester::new(initial);
    h.on_invret(1, Op::SetLeader { new: 1, old: 0 }, Ret::Viewed("leader", 1, 0, 0)).unwrap();
    h.on_invoke(1, Op::Write { leader: 1, seq: 0, token: 7 }).unwrap();
    h.on_invret(2, Op::Read { from: 0 }, Ret::Page(vec![], 1, 0, 0)).unwrap();
    assert!(h.serialized_history().is_some());
}
