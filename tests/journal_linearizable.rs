//! Histories of concurrent real clients against a real server, with the server SIGKILLed and
//! restarted mid-run (calls in flight then have no answer: ambiguous), checked for
//! linearizability against a sequential model of the journal (`tephra::journal::apply` plus the
//! records) by the memoising checker of the test-support crate, one journal at a time.
//!
//! What it proves (issue: journals on one node): no acknowledged write is lost across the
//! kill, seqs are dense, no single-writer write is applied twice, `first_seq` never goes back,
//! and every answer is one a sequential journal could give at some point inside the call.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::journal::{leader_of, uuid_bytes, write_call, Ids};
use support::linearizable::{check, Call as Recorded, Model};
use support::{JournalConn as Conn, Server};
use tephra::journal::{apply, Call, JournalState, LeaderUuid, Mode, Outcome, Records, StoreDurability};
use tephra::proto::*;
use tephra_test_support as support;

/// The sequential journal: its state and the records it holds (each record a unique token),
/// `first_seq..next_seq`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Journal {
    state: JournalState,
    records: VecDeque<u64>,
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

/// The journal's sequential specification, for a journal created in `mode`.
struct Spec(Mode);

impl Journal {
    fn invoke(&mut self, op: &Op) -> Ret {
        let viewed = |name, v: tephra::journal::View| Ret::Viewed(name, v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
        let call = match *op {
            Op::Read { from } => {
                let v = self.state.view();
                if from < v.first_seq {
                    return Ret::ReadTruncated(v.first_seq);
                }
                let at = (from.min(v.next_seq) - v.first_seq) as usize;
                return Ret::Page(self.records.iter().skip(at).copied().collect(), v.leader.map_or(0, |l| l.0), v.next_seq, v.first_seq);
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
                    self.records.push_back(*token);
                }
                Ret::Verdict("accepted", seq, count)
            }
            Outcome::Duplicate { seq, count } => Ret::Verdict("duplicate", seq, count),
            Outcome::Refused(v) => viewed("refused", v),
            Outcome::Truncated(v) => viewed("truncated", v),
            Outcome::WrongMode(v) => viewed("wrong_mode", v),
            Outcome::Leader(v) => viewed("leader", v),
            Outcome::LeaderRefused(v) => viewed("lost", v),
            Outcome::Trimmed(v) => {
                while self.records.len() as u64 > v.next_seq - v.first_seq {
                    self.records.pop_front();
                }
                viewed("trimmed", v)
            }
            Outcome::TruncateRefused(v) => viewed("truncate_refused", v),
            Outcome::Noop => Ret::Verdict("noop", 0, 0),
        }
    }
}

impl Model for Spec {
    type State = Journal;
    type Op = Op;
    type Ret = Ret;

    fn init(&self) -> Journal {
        Journal { state: JournalState::new(self.0, StoreDurability::Ordered), records: VecDeque::new() }
    }

    fn step(&self, state: &Journal, op: &Op, ret: Option<&Ret>) -> Option<Journal> {
        let mut next = state.clone();
        let got = next.invoke(op);
        (ret.is_none() || ret == Some(&got)).then_some(next)
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

/// The calls recorded so far, per journal (0: the single-writer one, 1: the multi-writer one),
/// timed on one clock.
struct History {
    origin: Instant,
    calls: [Vec<Recorded<Op, Ret>>; 2],
}

impl History {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// Calls per client at most: enough for a few hundred concurrent calls per journal.
const CALLS: u64 = 400;

/// The next call of client `me` on journal `k`, from what it last saw there.
fn next_op(me: u64, i: u64, k: usize, seen: (u128, u64, u64)) -> Op {
    let (leader, next, first) = seen;
    let token = me << 32 | i;
    if k == 1 {
        return match i % 7 {
            0 => Op::Truncate { leader: 0, up_to: first + 2 },
            1 => Op::Read { from: first.max(next.saturating_sub(3)) },
            2 => Op::SetLeader { new: 1, old: 0 }, // wrong mode
            3 => Op::Read { from: first },
            _ => Op::Write { leader: 0, seq: 0, token },
        };
    }
    let uuid = 1 + (me as u128 + i as u128) % 3; // few uuids: reinstated leaders happen
    match i % 6 {
        0 => Op::SetLeader { new: uuid, old: leader },
        1..=3 => Op::Write { leader: if i % 5 == 0 { uuid } else { leader.max(1) }, seq: if i % 7 == 0 { next.saturating_sub(1) } else { next }, token },
        4 => Op::Read { from: first.max(next.saturating_sub(3)) },
        _ if i % 12 == 5 => Op::Truncate { leader, up_to: first + 1 },
        _ => Op::Read { from: first },
    }
}

/// One client: a loop of calls on both journals chosen from what it last saw, recorded in
/// `history`. A call without an answer is recorded as ambiguous, and the client goes on on a
/// new connection.
fn client(me: u64, journals: [Ids; 2], addr: Arc<Mutex<std::net::SocketAddr>>, history: Arc<Mutex<History>>, until: Instant) {
    let mut conn: Option<Conn> = None;
    let mut seen = [(0u128, 0u64, 0u64); 2];
    let mut n = [0u64; 2];
    for i in 1..=CALLS {
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(3));
        let k = usize::from(i % 3 == 0);
        n[k] += 1;
        let op = next_op(me, n[k], k, seen[k]);
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
        let invoked = history.lock().unwrap().now();
        let answered = match c.try_call(call_of(journals[k], &op)) {
            Ok(r) => {
                if let Some(s) = &r.state {
                    seen[k] = (leader_of(&r), s.next_seq, s.first_seq);
                }
                if r.outcome() == JournalOutcome::Accepted {
                    seen[k].1 = r.seq + u64::from(r.count);
                }
                Some((history.lock().unwrap().now(), ret_of(&op, &r)))
            }
            Err(_) => {
                conn = None;
                None
            }
        };
        history.lock().unwrap().calls[k].push(Recorded { invoked, answered, op });
    }
}

#[test]
fn concurrent_clients_across_a_kill_see_linearizable_journals() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let mut server = Server::start(&bin, &[]);
    let mut c = Conn::open(server.addr);
    let single = c.create("acme", "orders", JournalMode::Single, JournalDurability::Ordered);
    let multi = c.create("acme", "events", JournalMode::Multi, JournalDurability::Batched);
    let addr = Arc::new(Mutex::new(server.addr));
    let history = Arc::new(Mutex::new(History { origin: Instant::now(), calls: [Vec::new(), Vec::new()] }));
    let until = Instant::now() + Duration::from_millis(2500);
    let clients: Vec<_> = (1..=4)
        .map(|me| {
            let (addr, history) = (Arc::clone(&addr), Arc::clone(&history));
            std::thread::spawn(move || client(me, [single, multi], addr, history, until))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(600));
    server.kill();
    server.restart(&bin, &[]);
    *addr.lock().unwrap() = server.addr;
    for c in clients {
        c.join().unwrap();
    }
    // A last read of each journal, after every call: what is held must explain every answer.
    let mut c = Conn::open(server.addr);
    let mut h = history.lock().unwrap();
    for (k, j) in [single, multi].into_iter().enumerate() {
        let op = Op::Read { from: c.read(j, 0, 0, 0).state.unwrap().first_seq };
        let invoked = h.now();
        let r = c.call(call_of(j, &op));
        let answered = Some((h.now(), ret_of(&op, &r)));
        h.calls[k].push(Recorded { invoked, answered, op });
    }
    let mode = [Mode::Single, Mode::Multi];
    for (k, calls) in h.calls.iter().enumerate() {
        let answered = calls.iter().filter(|c| c.answered.is_some()).count();
        assert!(answered > 60, "too short a history to mean anything: {answered} answered calls on journal {k}");
        let accepted = calls.iter().filter(|c| matches!(c.answered, Some((_, Ret::Verdict("accepted", ..))))).count();
        assert!(accepted > 10, "only {accepted} accepted writes on journal {k}");
        let started = Instant::now();
        let verdict = check(&Spec(mode[k]), calls);
        let ambiguous = calls.len() - answered;
        eprintln!("journal {k}: {} calls, {answered} answered, {accepted} accepted, {ambiguous} ambiguous, checked in {:?}", calls.len(), started.elapsed());
        assert!(verdict.is_linearizable(), "journal {k} ({} calls) is not linearizable: {verdict:?}\n{calls:#?}", calls.len());
    }
}

#[test]
fn the_checker_refuses_a_lost_acknowledged_write() {
    let call = |invoked, answered, op| Recorded { invoked, answered, op };
    let claim = || call(0, Some((1, Ret::Viewed("leader", 1, 0, 0))), Op::SetLeader { new: 1, old: 0 });
    // A write acknowledged, then a later read that does not hold it: no order explains it.
    let lost = [
        claim(),
        call(2, Some((3, Ret::Verdict("accepted", 0, 1))), Op::Write { leader: 1, seq: 0, token: 7 }),
        call(4, Some((5, Ret::Page(vec![], 1, 0, 0))), Op::Read { from: 0 }),
    ];
    assert!(!check(&Spec(Mode::Single), &lost).is_linearizable());
    // The same read while the write had no answer is fine (it may not have happened) ...
    let ambiguous = [claim(), call(2, None, Op::Write { leader: 1, seq: 0, token: 7 }), call(4, Some((5, Ret::Page(vec![], 1, 0, 0))), Op::Read { from: 0 })];
    assert!(check(&Spec(Mode::Single), &ambiguous).is_linearizable());
    // ... and a single-writer write applied twice is refused: the retry must be a duplicate.
    let twice = [
        claim(),
        call(2, Some((3, Ret::Verdict("accepted", 0, 1))), Op::Write { leader: 1, seq: 0, token: 7 }),
        call(4, Some((5, Ret::Verdict("accepted", 1, 1))), Op::Write { leader: 1, seq: 0, token: 7 }),
    ];
    assert!(!check(&Spec(Mode::Single), &twice).is_linearizable());
}
