//! Histories of concurrent real clients against a real server, with the server SIGKILLed and
//! restarted mid-run (calls in flight then have no answer: ambiguous), checked for
//! linearizability against a sequential model of the journal (`tephra::journal::apply` plus the
//! records) by the memoising checker of the test-support crate, one journal at a time.
//!
//! What it proves (issue: journals on one node): no acknowledged write is lost across the
//! kill, seqs are dense, no single-writer write is applied twice, `first_seq` never goes back,
//! and every answer is one a sequential journal could give at some point inside the call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::journal::{leader_of, Ids};
use support::journal_model::{self as model, call_of, Op, Ret, Spec};
use support::linearizable::{check, Call as Recorded};
use support::{JournalConn as Conn, Server};
use tephra::journal::Mode;
use tephra::proto::*;
use tephra_test_support as support;

/// The server's answer in the model's terms; an answer that is no verdict fails the test.
fn ret_of(op: &Op, r: &JournalResponse) -> Ret {
    model::ret_of(op, r).unwrap_or_else(|| panic!("unexpected answer {:?} to {op:?}: {r:?}", r.outcome()))
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
            1 => Op::Read { from: first.max(next.saturating_sub(3)), limit: 0 },
            2 => Op::SetLeader { new: 1, old: 0 }, // wrong mode
            3 => Op::Read { from: first, limit: 0 },
            _ => Op::Write { leader: 0, seq: 0, token },
        };
    }
    let uuid = 1 + (me as u128 + i as u128) % 3; // few uuids: reinstated leaders happen
    match i % 6 {
        0 => Op::SetLeader { new: uuid, old: leader },
        1..=3 => Op::Write { leader: if i % 5 == 0 { uuid } else { leader.max(1) }, seq: if i % 7 == 0 { next.saturating_sub(1) } else { next }, token },
        4 => Op::Read { from: first.max(next.saturating_sub(3)), limit: 0 },
        _ if i % 12 == 5 => Op::Truncate { leader, up_to: first + 1 },
        _ => Op::Read { from: first, limit: 0 },
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
        let op = Op::Read { from: c.read(j, 0, 0, 0).state.unwrap().first_seq, limit: 0 };
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
        call(4, Some((5, Ret::Page(vec![], 1, 0, 0))), Op::Read { from: 0, limit: 0 }),
    ];
    assert!(!check(&Spec(Mode::Single), &lost).is_linearizable());
    // The same read while the write had no answer is fine (it may not have happened) ...
    let ambiguous =
        [claim(), call(2, None, Op::Write { leader: 1, seq: 0, token: 7 }), call(4, Some((5, Ret::Page(vec![], 1, 0, 0))), Op::Read { from: 0, limit: 0 })];
    assert!(check(&Spec(Mode::Single), &ambiguous).is_linearizable());
    // ... and a single-writer write applied twice is refused: the retry must be a duplicate.
    let twice = [
        claim(),
        call(2, Some((3, Ret::Verdict("accepted", 0, 1))), Op::Write { leader: 1, seq: 0, token: 7 }),
        call(4, Some((5, Ret::Verdict("accepted", 1, 1))), Op::Write { leader: 1, seq: 0, token: 7 }),
    ];
    assert!(!check(&Spec(Mode::Single), &twice).is_linearizable());
}
