//! Fault injection in the style of Jepsen against clusters of real `tephra-server` processes on
//! loopback (docs/journals.md §9; issue 31, "Tests"), and the failover time of a journal whose
//! leader dies.
//!
//! **Faults.** Clusters of 3 and 5 nodes, every peer link behind a [`Proxy`]. Concurrent
//! clients call a single-writer journal (writers competing with set-leader claims, fenced
//! writes, identical re-sends of writes whose answer was lost, truncates, reads) and a
//! multi-writer journal, each call sent over a raw connection to one node at a time and recorded
//! exactly: its invocation, and its answer or none. A nemesis draws faults from a seeded RNG:
//! SIGKILL of any node (then a restart), SIGSTOP of a group's leader (then SIGCONT), a node
//! isolated or the cluster split into a minority and a majority (links cut, or held silent), and
//! delays on every link; never more than F nodes failed at once. Some rounds also reconfigure a
//! journal (`JournalConfigure`, docs/journals.md §9.8), before their faults or while they hold,
//! through any node as the clients find one: its F flips between 1 and 0 on three nodes (three
//! voters and one, so the group's leader is often moved out, and the nodes moved back in come
//! with their old copies on disk) and between 1 and 2 on five. `CONFIGURED`, a lost answer,
//! `AMBIGUOUS` and nothing done within [`CALL_TIMEOUT`] go to the nemesis log; any other answer
//! is a problem. At the end everything is healed and every node read. Then:
//!
//! | check | how |
//! |---|---|
//! | (a) linearizable | each journal's history by the memoising checker against `tephra::journal::apply` plus the records ([`support::journal_model`]) |
//! | (b) no acknowledged write lost | every accepted or duplicate answer's token is at its seq in what the reads showed, the last read of every node included |
//! | (c) same on every node | every voter of a journal serves the same records, `first_seq`, `next_seq` and leader at the end; the voters are those the directory records (a list call's `voters`) |
//! | (d) no write applied twice | no token at two seqs, no two acceptances of one token, no seq showing two tokens |
//! | (e) `first_seq` monotone | in the reads of each client |
//! | (f) reconfiguration finishes | within 30 s of the heal, each journal's group leader reports exactly the voters the directory records, and no other node keeps a copy |
//! | liveness | both journals accepted writes; no `UNAVAILABLE` or `INVALID` answer |
//!
//! An answer `AMBIGUOUS` (24), a lost connection or a timeout leaves the call ambiguous: it may
//! take effect at any time after it was sent, or never. `NOT_LEADER`, `UNSERVED`, `BUSY` and
//! `UNKNOWN_JOURNAL` mean the call was not done and it is not recorded (it is sent again,
//! following the leader hint). Before the check, an ambiguous write is settled from what the
//! reads showed (every token is unique, truncations never drop a seq no read has shown, and a
//! write has no effect unless its token lands): a write whose token was seen at seq `s` gets the
//! answer `accepted s` at the time of the first read that showed it; a write whose token was
//! never seen, or was accepted by an identical re-send, is dropped as having done nothing. This
//! keeps the checker's search small and claims nothing a correct journal does not guarantee.
//!
//! Seeds: `TEPHRA_FAULT_SEEDS` (`"7"`, `"1-200"`, `"1,5,9-12"`) replaces the default seeds of
//! both cluster sizes; `TEPHRA_FAULT_SECS` the seconds of faults per seed (default 10). A
//! violation prints its seed and the file holding the nemesis log and the histories
//! (`VIOLATION nodes=N seed=S ...`); `scripts/soak-cluster.sh` runs many seeds.
//!
//! **Failover.** Three nodes, one single-writer journal written continuously; its group's
//! leader is SIGKILLed `TEPHRA_FAILOVER_TRIALS` times (default 10), restarted after each: the
//! time from the kill to the next acknowledged write is at most 2 s in every trial, and every
//! acknowledged write is on every node at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::fastrand::Rng;
use support::journal::{leader_of, Ids};
use support::journal_model::{call_of, ret_of, Op, Ret, Spec};
use support::linearizable::{check, Call as Recorded, Verdict};
use support::proxy::{Mode as LinkMode, Proxy};
use support::JournalConn as Conn;
use tephra::journal::Mode;
use tephra::proto::*;
use tephra_test_support as support;

/// How long one call may go unanswered before it is taken as lost.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The default seeds: two on three nodes, one on five.
const DEFAULT_SEEDS_3: &[u64] = &[1, 2];
const DEFAULT_SEEDS_5: &[u64] = &[1];
/// Journal indexes in a run.
const SINGLE: usize = 0;
const MULTI: usize = 1;
const MODES: [Mode; 2] = [Mode::Single, Mode::Multi];

fn server_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

/// The tests of this file run one at a time: each runs a cluster, and timing faults of one
/// against the others' load on two cores would measure the machine, not the cluster.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `"1-3,7"` as `[1, 2, 3, 7]`.
fn parse_seeds(s: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<u64>().expect("a seed")..=b.trim().parse::<u64>().expect("a seed")),
            None => out.push(part.parse().expect("a seed")),
        }
    }
    out
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().filter(|v| !v.is_empty()).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

/// The running nodes' client addresses and the run's clock, shared by the clients and the
/// thread that kills and restarts nodes.
struct Nodes {
    origin: Instant,
    /// Client address by node id - 1; `None` while the node is down.
    addrs: Mutex<Vec<Option<SocketAddr>>>,
}

impl Nodes {
    fn new(cluster: &Cluster) -> Nodes {
        let addrs = (1..=cluster.size() as u64).map(|id| cluster.node(id).map(|s| s.addr)).collect();
        Nodes { origin: Instant::now(), addrs: Mutex::new(addrs) }
    }

    /// Nanoseconds since the run began.
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn set(&self, id: u64, addr: Option<SocketAddr>) {
        lock(&self.addrs)[id as usize - 1] = addr;
    }

    fn size(&self) -> u64 {
        lock(&self.addrs).len() as u64
    }
}

/// What became of one send of a call.
enum Sent {
    /// A verdict: the answer and when it came.
    Answer(u64, JournalResponse),
    /// Sent, and no verdict came: lost, timed out, or `AMBIGUOUS`.
    Lost,
    /// No verdict and nothing done (`NOT_LEADER`, `UNSERVED`, `BUSY`, `UNKNOWN_JOURNAL`, no
    /// node reachable): the caller may send it again. Why, for a message.
    NotDone(String),
    /// An answer that must never come (`UNAVAILABLE`, `INVALID`, or one that does not fit).
    Wrong(String),
}

/// A client's way to the cluster: one connection at a time, to the node it believes leads,
/// moving on as the answers say.
struct Router<'a> {
    nodes: &'a Nodes,
    target: u64,
    conn: Option<(u64, SocketAddr, Conn)>,
}

impl<'a> Router<'a> {
    fn new(nodes: &'a Nodes, first: u64) -> Router<'a> {
        Router { nodes, target: first, conn: None }
    }

    fn next_node(&mut self) {
        self.target = self.target % self.nodes.size() + 1;
    }

    fn connection(&mut self) -> Option<&mut Conn> {
        let addr = lock(&self.nodes.addrs)[self.target as usize - 1]?;
        if !matches!(&self.conn, Some((id, a, _)) if *id == self.target && *a == addr) {
            self.conn = None;
            let c = Conn::try_open_timeout(addr, CALL_TIMEOUT).ok()?;
            self.conn = Some((self.target, addr, c));
        }
        self.conn.as_mut().map(|(_, _, c)| c)
    }

    /// Sends `call` once (to the current target) and sorts out what came back. The invocation
    /// time is taken right before the send.
    fn send(&mut self, call: journal_request::Call) -> (u64, Sent) {
        let nodes = self.nodes;
        let Some(conn) = self.connection() else {
            self.next_node();
            std::thread::sleep(Duration::from_millis(20));
            return (nodes.now(), Sent::NotDone("no connection".to_owned()));
        };
        let invoked = nodes.now();
        let resp = match conn.try_call(call) {
            Ok(r) => r,
            Err(_) => {
                self.conn = None;
                self.next_node();
                return (invoked, Sent::Lost);
            }
        };
        let why = format!("node {} answered {:?}: {}", self.target, resp.outcome(), resp.message);
        let sent = match resp.outcome() {
            JournalOutcome::Ambiguous => Sent::Lost,
            JournalOutcome::NotLeader => {
                match leader_hint(&resp.message) {
                    Some(l) if l >= 1 && l <= self.nodes.size() && l != self.target => self.target = l,
                    _ => {
                        self.next_node();
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                Sent::NotDone(why)
            }
            JournalOutcome::Unserved | JournalOutcome::UnknownJournal => {
                self.next_node();
                std::thread::sleep(Duration::from_millis(10));
                Sent::NotDone(why)
            }
            JournalOutcome::Busy => {
                std::thread::sleep(Duration::from_millis(20));
                Sent::NotDone(why)
            }
            JournalOutcome::Unavailable | JournalOutcome::Invalid => Sent::Wrong(format!("node {} answered {resp:?}", self.target)),
            _ => Sent::Answer(self.nodes.now(), resp),
        };
        (invoked, sent)
    }
}

/// The node a `NOT_LEADER` answer names: "node N leads this journal's group; ask it".
fn leader_hint(message: &str) -> Option<u64> {
    message.strip_prefix("node ")?.split_whitespace().next()?.parse().ok()
}

/// One fault-injection run's shared state.
struct Run<'a> {
    nodes: &'a Nodes,
    journals: [Ids; 2],
    /// The calls of each journal, as recorded.
    history: [Mutex<Vec<Recorded<Op, Ret>>>; 2],
    /// Per journal: every seq below it has been shown by some read. Truncations never go past
    /// it, so every record ever held is seen by some read.
    covered: [AtomicU64; 2],
    /// Answers that must never come, and `first_seq` going back, as they happen.
    problems: Mutex<Vec<String>>,
    /// What the nemesis did, timed.
    log: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Run<'_> {
    fn note(&self, what: String) {
        let ms = self.nodes.origin.elapsed().as_millis();
        lock(&self.log).push(format!("{ms:>6} ms  {what}"));
    }

    fn problem(&self, what: String) {
        self.note(format!("PROBLEM {what}"));
        lock(&self.problems).push(what);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn covered(&self, k: usize) -> u64 {
        self.covered[k].load(Ordering::SeqCst)
    }
}

/// One client of a run: its router, its view of each journal and its reads' `first_seq`.
struct Client<'r, 'a> {
    run: &'r Run<'a>,
    me: u64,
    router: Router<'a>,
    rng: Rng,
    /// Per journal: the leader, next_seq and first_seq of the last answer with a view.
    seen: [(u128, u64, u64); 2],
    /// Per journal: the highest `first_seq` a read of this client showed.
    read_first: [u64; 2],
}

impl<'r, 'a> Client<'r, 'a> {
    fn new(run: &'r Run<'a>, me: u64, seed: u64) -> Client<'r, 'a> {
        let first = me % run.nodes.size() + 1;
        Client {
            run,
            me,
            router: Router::new(run.nodes, first),
            rng: Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ me),
            seen: [(0, 0, 0); 2],
            read_first: [0; 2],
        }
    }

    /// Carries out `op` on journal `k`: sent until it gets a verdict or is lost (at most 8
    /// sends that did nothing), recorded. `Some(Some(ret))`: answered; `Some(None)`: lost;
    /// `None`: not done.
    fn perform(&mut self, k: usize, op: &Op) -> Option<Option<Ret>> {
        // Any voter serves a read: half of them go to a node drawn at random.
        if matches!(op, Op::Read { .. }) && self.rng.bool() {
            self.router.target = self.rng.u64(1..=self.run.nodes.size());
        }
        for _ in 0..8 {
            if self.run.stopping() {
                return None;
            }
            let (invoked, sent) = self.router.send(call_of(self.run.journals[k], op));
            match sent {
                Sent::NotDone(_) => continue,
                Sent::Wrong(why) => {
                    self.run.problem(format!("client {} {op:?}: {why}", self.me));
                    return None;
                }
                Sent::Lost => {
                    // A read that got no answer changed nothing: it is left out.
                    if !matches!(op, Op::Read { .. }) {
                        lock(&self.run.history[k]).push(Recorded { invoked, answered: None, op: op.clone() });
                    }
                    return Some(None);
                }
                Sent::Answer(at, resp) => {
                    let Some(ret) = ret_of(op, &resp) else {
                        self.run.problem(format!("client {} {op:?}: answered {resp:?}", self.me));
                        return None;
                    };
                    self.saw(k, op, &resp, &ret);
                    lock(&self.run.history[k]).push(Recorded { invoked, answered: Some((at, ret.clone())), op: op.clone() });
                    return Some(Some(ret));
                }
            }
        }
        None
    }

    /// Takes in an answer: the view, the reads' `first_seq`, the seqs reads have shown.
    fn saw(&mut self, k: usize, op: &Op, resp: &JournalResponse, ret: &Ret) {
        if let Some(s) = &resp.state {
            self.seen[k] = (leader_of(resp), s.next_seq, s.first_seq);
        }
        if let Ret::Verdict("accepted", seq, count) = ret {
            self.seen[k].1 = self.seen[k].1.max(seq + u64::from(*count));
        }
        let first = match ret {
            Ret::Page(records, _, _, first) => {
                if let Op::Read { from, .. } = op {
                    let end = from + records.len() as u64;
                    let covered = &self.run.covered[k];
                    let mut at = covered.load(Ordering::SeqCst);
                    while *from <= at && at < end {
                        match covered.compare_exchange(at, end, Ordering::SeqCst, Ordering::SeqCst) {
                            Ok(_) => break,
                            Err(now) => at = now,
                        }
                    }
                }
                *first
            }
            Ret::ReadTruncated(first) => *first,
            _ => return,
        };
        if first < self.read_first[k] {
            self.run.problem(format!("client {}: journal {k}'s first_seq went back from {} to {first} ({op:?})", self.me, self.read_first[k]));
        }
        self.read_first[k] = self.read_first[k].max(first);
    }

    fn token(&self, i: u64) -> u64 {
        self.me << 40 | i
    }

    /// A read of journal `k`: near the tail, from `first_seq`, from the first seq no read has
    /// shown yet, or (rarely) below `first_seq`.
    fn read_op(&mut self, k: usize) -> Op {
        let (_, next, first) = self.seen[k];
        match self.rng.u32(0..10) {
            0..=2 => Op::Read { from: first.max(next.saturating_sub(4)), limit: 8 },
            3..=4 => Op::Read { from: first, limit: 8 },
            5 if first > 0 => Op::Read { from: first - 1, limit: 4 },
            _ => Op::Read { from: self.run.covered(k), limit: 32 },
        }
    }

    /// A truncation to at most a few seqs past `first_seq`, never past what reads have shown.
    fn up_to(&mut self, k: usize) -> u64 {
        (self.seen[k].2 + self.rng.u64(1..4)).min(self.run.covered(k))
    }

    /// A writer of the single-writer journal: it claims the lead now and then under a fresh
    /// uuid, writes at the tail while it leads (sometimes at a wrong seq), sends a write whose
    /// answer was lost again unchanged (up to twice), truncates, reads; sometimes it writes
    /// under a uuid that no longer leads.
    fn single_writer(&mut self) {
        let mut mine: u128 = 0;
        let mut claims = 0u64;
        let mut resend: Option<(Op, u32)> = None;
        let mut i = 0u64;
        while !self.run.stopping() {
            std::thread::sleep(Duration::from_millis(self.rng.u64(1..6)));
            i += 1;
            let token = self.token(i);
            let (leader, next, _) = self.seen[SINGLE];
            let op = if let Some((op, _)) = &resend {
                op.clone()
            } else if leader != mine || mine == 0 {
                match self.rng.u32(0..10) {
                    0..=1 => {
                        claims += 1;
                        mine = (u128::from(self.me) << 64) | u128::from(claims);
                        let old = if self.rng.u32(0..8) == 0 { leader ^ 1 } else { leader };
                        Op::SetLeader { new: mine, old }
                    }
                    2 if mine != 0 => Op::Write { leader: mine, seq: next, token },
                    _ => self.read_op(SINGLE),
                }
            } else {
                match self.rng.u32(0..20) {
                    0..=12 => Op::Write { leader: mine, seq: next, token },
                    13 => Op::Write { leader: mine, seq: (next + 1).saturating_sub(self.rng.u64(0..3)), token },
                    14 => Op::Truncate { leader: mine, up_to: self.up_to(SINGLE) },
                    _ => self.read_op(SINGLE),
                }
            };
            let result = self.perform(SINGLE, &op);
            resend = match (result, resend.take()) {
                (Some(None), Some((op, n))) if n < 2 => Some((op, n + 1)),
                (Some(None), None) if matches!(op, Op::Write { .. }) => Some((op, 1)),
                _ => None,
            };
        }
    }

    /// A client of the multi-writer journal: writes mostly, reads, truncates, and calls shaped
    /// for the other mode.
    fn multi_writer(&mut self) {
        let mut i = 0u64;
        while !self.run.stopping() {
            std::thread::sleep(Duration::from_millis(self.rng.u64(1..6)));
            i += 1;
            let token = self.token(i);
            let op = match self.rng.u32(0..20) {
                0..=10 => Op::Write { leader: 0, seq: 0, token },
                11 => Op::Truncate { leader: 0, up_to: self.up_to(MULTI) },
                12 => Op::SetLeader { new: 1, old: 0 },
                13 => Op::Write { leader: 7, seq: self.seen[MULTI].1, token },
                _ => self.read_op(MULTI),
            };
            self.perform(MULTI, &op);
        }
    }
}

/// What one node serves of a journal once the faults are over: every record from `first_seq`
/// (pages put together), and the view.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    records: Vec<u64>,
    leader: u128,
    next_seq: u64,
    first_seq: u64,
}

/// Where two nodes' copies of a journal part: their views, and the first seq whose records
/// differ with a few records from there on each side.
fn differ_at(a: &Held, b: &Held) -> String {
    let views = format!("leader {:#x} vs {:#x}, first_seq {} vs {}, next_seq {} vs {}", a.leader, b.leader, a.first_seq, b.first_seq, a.next_seq, b.next_seq);
    let seq_a = |s: u64| s.checked_sub(a.first_seq).and_then(|i| a.records.get(i as usize)).copied();
    let seq_b = |s: u64| s.checked_sub(b.first_seq).and_then(|i| b.records.get(i as usize)).copied();
    let from = a.first_seq.max(b.first_seq);
    let to = a.next_seq.max(b.next_seq);
    match (from..to).find(|&s| seq_a(s) != seq_b(s)) {
        Some(s) => {
            let show = |f: &dyn Fn(u64) -> Option<u64>| (s..s + 4).map(|x| f(x).map_or("-".to_owned(), |t| format!("{t:#x}"))).collect::<Vec<_>>().join(" ");
            format!("{views}; from seq {s}: [{}] vs [{}]", show(&seq_a), show(&seq_b))
        }
        None => views,
    }
}

/// Reads all of journal `j` from the node at `addr` alone, asking again until it serves (up
/// to `patience`). The times are those of the first and the last page.
fn read_everything(nodes: &Nodes, addr: SocketAddr, j: Ids, patience: Duration) -> Result<(u64, u64, Held), String> {
    let deadline = Instant::now() + patience;
    let mut last = String::new();
    while Instant::now() < deadline {
        let attempt = (|| -> Result<(u64, u64, Held), String> {
            let mut c = Conn::try_open_timeout(addr, CALL_TIMEOUT).map_err(|e| e.to_string())?;
            let invoked = nodes.now();
            let mut from = 0;
            let mut held: Option<Held> = None;
            loop {
                let r = c.try_call(call_of(j, &Op::Read { from, limit: 0 })).map_err(|e| e.to_string())?;
                match r.outcome() {
                    JournalOutcome::Truncated if held.is_none() => from = r.state.as_ref().ok_or("a truncated read without a state")?.first_seq,
                    JournalOutcome::Page => {
                        let s = r.state.as_ref().ok_or("a page without a state")?;
                        let h = held.get_or_insert(Held { records: Vec::new(), leader: leader_of(&r), next_seq: s.next_seq, first_seq: s.first_seq });
                        if (h.leader, h.next_seq, h.first_seq) != (leader_of(&r), s.next_seq, s.first_seq) {
                            return Err(format!("the journal moved while it was read: {h:?} then {r:?}"));
                        }
                        h.records.extend(r.records.iter().map(|b| support::journal_model::token_of(b)));
                        from = h.first_seq + h.records.len() as u64;
                        if from >= h.next_seq || r.records.is_empty() {
                            return Ok((invoked, nodes.now(), held.unwrap()));
                        }
                    }
                    other => return Err(format!("{other:?}: {}", r.message)),
                }
            }
        })();
        match attempt {
            Ok(v) => return Ok(v),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("node at {addr} did not serve {j:?} within {patience:?}: {last}"))
}

/// Creates `tenant/name` through any node, asking again until one takes it (20 s at most;
/// then the last answer).
fn try_create(nodes: &Nodes, name: &str, mode: JournalMode, durability: JournalDurability) -> Result<Ids, String> {
    let mut router = Router::new(nodes, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let call = journal_request::Call::Create(JournalCreate {
            tenant_name: "acme".into(),
            journal_name: name.into(),
            mode: mode as i32,
            durability: durability as i32,
            survive: None,
        });
        let last = match router.send(call) {
            (_, Sent::Answer(_, r)) if matches!(r.outcome(), JournalOutcome::Created | JournalOutcome::NameTaken) => return Ok((r.tenant, r.journal)),
            (_, Sent::Answer(_, r)) => format!("{r:?}"),
            (_, Sent::Wrong(why)) => why,
            (_, Sent::Lost) => "no answer".to_owned(),
            (_, Sent::NotDone(why)) => why,
        };
        if Instant::now() > deadline {
            return Err(format!("no node created {name} within 20 s; the last answer: {last}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`try_create`] that must succeed.
fn create(nodes: &Nodes, name: &str, mode: JournalMode, durability: JournalDurability) -> Ids {
    try_create(nodes, name, mode, durability).unwrap_or_else(|e| panic!("{e}"))
}

/// What the directory records for journal `j` (a list call, `JournalInfo` fields 8 and 9): its
/// F and its voters, from any node that serves the list, asking again up to `patience`.
fn recorded_placement(nodes: &Nodes, j: Ids, patience: Duration) -> Result<(Option<u32>, Vec<u64>), String> {
    let mut router = Router::new(nodes, 1);
    let deadline = Instant::now() + patience;
    loop {
        let last = match router.send(journal_request::Call::List(JournalList { tenant_name: "acme".into() })) {
            (_, Sent::Answer(_, r)) if r.outcome() == JournalOutcome::Listed => match r.journals.iter().find(|i| (i.tenant, i.journal) == j) {
                Some(i) => return Ok((i.survive, i.voters.clone())),
                None => format!("the list does not show {j:?}: {r:?}"),
            },
            (_, Sent::Answer(_, r)) => format!("{r:?}"),
            (_, Sent::Wrong(why) | Sent::NotDone(why)) => why,
            (_, Sent::Lost) => "no answer".to_owned(),
        };
        if Instant::now() > deadline {
            return Err(format!("no node listed {j:?} within {patience:?}; the last answer: {last}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How node `id` reports journal `j`'s group (`cluster status`): `None` when it holds no
/// copy, `Some((role, voters))` else; `Err` when it does not answer.
fn group_report(cluster: &Cluster, id: u64, j: Ids) -> Result<Option<(String, Vec<u64>)>, String> {
    let addr = cluster.node(id).ok_or_else(|| format!("node {id} is not running"))?.addr;
    let mut c = Conn::try_open_timeout(addr, CALL_TIMEOUT).map_err(|e| format!("node {id}: {e}"))?;
    let r = c.try_call(journal_request::Call::Status(NodeStatusRequest {})).map_err(|e| format!("node {id}: {e}"))?;
    let Some(node) = r.node.clone() else { return Err(format!("node {id} answered the status without a report: {:?} {}", r.outcome(), r.message)) };
    Ok(node.groups.into_iter().find(|g| (g.tenant, g.journal) == j).map(|g| {
        let mut v = g.voters;
        v.sort_unstable();
        (g.role, v)
    }))
}

/// The voters of journal `j` once the faults are over: those the directory records, once the
/// group has moved there (its leader reports exactly them) and every other node has stopped
/// its copy. `Err` when that does not happen within `patience` (a reconfiguration that never
/// finishes), saying how far it got.
fn settled_voters(nodes: &Nodes, cluster: &Cluster, j: Ids, patience: Duration) -> Result<(Option<u32>, Vec<u64>), String> {
    let deadline = Instant::now() + patience;
    loop {
        let (survive, recorded) = recorded_placement(nodes, j, patience)?;
        let mut leaders = Vec::new();
        let mut strays = Vec::new();
        let mut silent = Vec::new();
        for id in 1..=cluster.size() as u64 {
            match group_report(cluster, id, j) {
                Ok(Some((role, voters))) => {
                    if role == "leader" {
                        leaders.push((id, voters.clone()));
                    }
                    if !recorded.contains(&id) {
                        strays.push((id, role, voters));
                    }
                }
                Ok(None) => {}
                Err(e) => silent.push(e),
            }
        }
        let moved = leaders.iter().any(|(_, v)| *v == recorded);
        if moved && strays.is_empty() && silent.is_empty() {
            return Ok((survive, recorded));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the group did not settle on the recorded voters {recorded:?} (F = {survive:?}) within {patience:?}: leaders (node, voters) {leaders:?}; \
                 copies on nodes that are not recorded voters (node, role, voters) {strays:?}; unanswered {silent:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The two F a run's configures flip a journal between on an `n`-node cluster: 1 and 0 on
/// three nodes (three voters and one: the move drops two voters, often the group's leader,
/// and brings them back with their old copies on disk), 1 and 2 on five.
fn survive_choices(n: u64) -> [u32; 2] {
    if n >= 5 {
        [1, 2]
    } else {
        [1, 0]
    }
}

/// When a round sends its configure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConfigureAt {
    /// Before its faults.
    Before,
    /// While its faults hold.
    During,
}

/// A configure of journal `k` to survive `survive` machines, sent first to node `first` and
/// on as the answers say (a redirect, no copy yet, no node reachable) for up to
/// [`CALL_TIMEOUT`]; what came of it goes to the nemesis log. `CONFIGURED` and no verdict (a
/// lost answer, `AMBIGUOUS`, nothing done in time) are what faults may bring; any other answer
/// is a problem, `UNPLACEABLE` included (the cluster always has the 2F+1 nodes asked for).
fn configure(run: &Run, first: u64, k: usize, survive: u32) {
    let j = run.journals[k];
    let what = format!("configure journal {k} to survive {survive}");
    let mut router = Router::new(run.nodes, first);
    let deadline = Instant::now() + CALL_TIMEOUT;
    loop {
        let call = journal_request::Call::Configure(JournalConfigure { tenant: j.0, journal: j.1, survive, ..Default::default() });
        match router.send(call).1 {
            Sent::Answer(_, r) if r.outcome() == JournalOutcome::Configured => return run.note(format!("{what}: CONFIGURED by node {}", router.target)),
            Sent::Answer(_, r) => return run.problem(format!("{what}: answered {r:?}")),
            Sent::Wrong(why) => return run.problem(format!("{what}: {why}")),
            Sent::Lost => return run.note(format!("{what}: no verdict (lost or AMBIGUOUS)")),
            Sent::NotDone(why) if Instant::now() >= deadline => return run.note(format!("{what}: not done within {CALL_TIMEOUT:?}; last: {why}")),
            Sent::NotDone(_) => {}
        }
    }
}

/// The nemesis: rounds of a quiet gap, then faults on at most F nodes (drawn from `rng`)
/// held for a while, then everything healed; until `until`. Some rounds also reconfigure one
/// journal (before their faults or while they hold), flipping its F between the two of
/// [`survive_choices`]; at least one does after the third round. Returns the rounds and the
/// configures sent.
fn nemesis(cluster: &mut Cluster, run: &Run, rng: &mut Rng, until: Instant) -> (usize, usize) {
    let n = cluster.size() as u64;
    let f = (n - 1) / 2;
    let choices = survive_choices(n);
    // Per journal: the F last asked for (the default, 1, at first); each configure asks for
    // the other one, whatever became of the last.
    let mut asked = [1u32; 2];
    let mut configures = 0;
    let mut rounds = 0;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.u64(100..600)));
        rounds += 1;
        // Drawn whatever happens later in the round, so the other draws stay the seed's.
        let drawn = rng.u32(0..5) < 2;
        let (k, first, at) = (rng.usize(0..2), rng.u64(1..=n), if rng.bool() { ConfigureAt::Before } else { ConfigureAt::During });
        let reconfigure = (drawn || (configures == 0 && rounds > 3)).then(|| {
            asked[k] = if asked[k] == choices[0] { choices[1] } else { choices[0] };
            (k, first, at, asked[k])
        });
        if let Some((k, first, ConfigureAt::Before, survive)) = reconfigure {
            configure(run, first, k, survive);
        }
        configures += usize::from(reconfigure.is_some());
        let budget = if f > 1 && rng.bool() { f } else { 1 };
        let mut failed: Vec<u64> = Vec::new();
        let mut isolated: Vec<u64> = Vec::new();
        let mut link_mode = LinkMode::Cut;
        let mut together = false;
        let pick = |rng: &mut Rng, failed: &[u64]| loop {
            let id = rng.u64(1..=n);
            if !failed.contains(&id) {
                break id;
            }
        };
        while (failed.len() as u64) < budget {
            let leader = {
                let k = rng.usize(0..2);
                cluster.group_leader(run.journals[k].0, run.journals[k].1).filter(|l| !failed.contains(l))
            };
            match rng.u32(0..12) {
                0..=2 => {
                    let id = pick(rng, &failed);
                    cluster.kill(id);
                    run.nodes.set(id, None);
                    run.note(format!("kill node {id}"));
                    failed.push(id);
                }
                3 => {
                    let id = leader.unwrap_or_else(|| pick(rng, &failed));
                    cluster.kill(id);
                    run.nodes.set(id, None);
                    run.note(format!("kill node {id} (a leader)"));
                    failed.push(id);
                }
                4..=6 => {
                    let id = leader.unwrap_or_else(|| pick(rng, &failed));
                    cluster.pause(id);
                    run.note(format!("SIGSTOP node {id} (a leader: {})", leader == Some(id)));
                    failed.push(id);
                }
                7..=9 => {
                    let id = if rng.bool() { leader.unwrap_or_else(|| pick(rng, &failed)) } else { pick(rng, &failed) };
                    if rng.bool() {
                        link_mode = LinkMode::Hold;
                    }
                    isolated.push(id);
                    failed.push(id);
                }
                10 if budget - (failed.len() as u64) >= 2 => {
                    // A minority of two against a majority of three.
                    for _ in 0..2 {
                        let id = pick(rng, &failed);
                        isolated.push(id);
                        failed.push(id);
                    }
                    together = true;
                }
                _ => {
                    let d = Duration::from_millis(rng.u64(5..60));
                    cluster.set_delay(d);
                    run.note(format!("delay every link by {d:?}"));
                    if rng.bool() {
                        break;
                    }
                }
            }
        }
        if !isolated.is_empty() {
            let majority: Vec<u64> = (1..=n).filter(|id| !isolated.contains(id)).collect();
            let mut sides: Vec<Vec<u64>> = vec![majority];
            if together {
                sides.push(isolated.clone());
            } else {
                sides.extend(isolated.iter().map(|&id| vec![id]));
            }
            let refs: Vec<&[u64]> = sides.iter().map(Vec::as_slice).collect();
            cluster.partition(&refs, link_mode);
            run.note(format!("partition {sides:?} ({link_mode:?})"));
        }
        let hold = Duration::from_millis(rng.u64(300..2000));
        let held = Instant::now();
        if let Some((k, first, ConfigureAt::During, survive)) = reconfigure {
            configure(run, first, k, survive);
        }
        std::thread::sleep(hold.saturating_sub(held.elapsed()));
        heal(cluster, run);
    }
    (rounds, configures)
}

/// Opens every link, resumes every paused node and starts every killed one. A node that
/// stopped by itself is a problem (its last lines go to the log) and is started again.
fn heal(cluster: &mut Cluster, run: &Run) {
    cluster.heal();
    for id in 1..=cluster.size() as u64 {
        exited(cluster, run, id);
        if cluster.is_paused(id) {
            cluster.resume(id);
            run.note(format!("SIGCONT node {id}"));
        }
        if cluster.node(id).is_none() {
            cluster.start_node(id);
            run.nodes.set(id, cluster.node(id).map(|s| s.addr));
            run.note(format!("restart node {id}"));
        }
    }
    run.note("heal".into());
}

/// Whether node `id` stopped by itself (nobody killed it): then a problem, with its last
/// lines, and the node counts as stopped.
fn exited(cluster: &mut Cluster, run: &Run, id: u64) -> bool {
    if cluster.is_paused(id) {
        return false;
    }
    let Some(log) = cluster.node(id).map(|s| s.log()) else { return false };
    let Some(status) = cluster.wait_exit(id, Duration::ZERO) else { return false };
    run.nodes.set(id, None);
    let tail: Vec<&str> = log.lines().rev().take(8).collect();
    run.problem(format!("node {id} stopped by itself ({status}); its last lines: {:?}", tail.into_iter().rev().collect::<Vec<_>>()));
    true
}

/// The counts printed for a run that held.
struct Summary {
    rounds: usize,
    configures: usize,
    /// Segments the nodes running at the end gave back.
    given_back: u64,
    /// Segment files in each node's command log at the end.
    segments: Vec<usize>,
    lines: Vec<String>,
}

/// One seed on an `n`-node cluster: faults for `secs` seconds while the clients call, then
/// the checks. `Err` names the first violation.
fn run_seed(n: usize, seed: u64, secs: u64) -> Result<Summary, (String, String)> {
    // Groups compact their logs every few dozen entries once the clients' truncations pass
    // them, so nodes back from a kill or a partition catch up by snapshots; segments of
    // 32 KiB fill every few seconds, so every node judges its segments (moving what pins
    // them, giving back those with nothing live) many times a run (docs/journals.md §9.9).
    // All under the same checks.
    let env = [("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("TEPHRA__CLUSTER__SNAPSHOT_ENTRIES", "32"), ("TEPHRA__JOURNAL__SEGMENT_SIZE", "32768")];
    let mut cluster = Cluster::start_proxied(&server_bin(), n, &env);
    let nodes = Nodes::new(&cluster);
    let created = try_create(&nodes, "orders", JournalMode::Single, JournalDurability::Ordered)
        .and_then(|single| Ok((single, try_create(&nodes, "events", JournalMode::Multi, JournalDurability::Batched)?)));
    let (single, multi) = match created {
        Ok(ids) => ids,
        Err(e) => {
            let kept = keep_artifacts(&mut cluster, &artifacts(n, seed));
            return Err((format!("{e} ({kept})"), String::new()));
        }
    };
    let run = Run {
        nodes: &nodes,
        journals: [single, multi],
        history: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
        covered: [AtomicU64::new(0), AtomicU64::new(0)],
        problems: Mutex::new(Vec::new()),
        log: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    };
    let placed = |j| recorded_placement(&nodes, j, Duration::from_secs(10)).map_or_else(|e| e, |(f, v)| format!("F = {f:?}, voters {v:?}"));
    run.note(format!("{n} nodes, seed {seed}; single: {}; multi: {}", placed(single), placed(multi)));
    let mut rng = Rng::with_seed(seed);
    let until = Instant::now() + Duration::from_secs(secs);
    let (rounds, configures) = std::thread::scope(|s| {
        let run = &run;
        let mut clients = Vec::new();
        for me in 1..=3 {
            clients.push(s.spawn(move || Client::new(run, me, seed).single_writer()));
        }
        for me in 4..=5 {
            clients.push(s.spawn(move || Client::new(run, me, seed).multi_writer()));
        }
        let done = nemesis(&mut cluster, run, &mut rng, until);
        heal(&mut cluster, run);
        // A last second of calls on the healed cluster, then stop.
        std::thread::sleep(Duration::from_secs(1));
        run.stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().expect("a client thread");
        }
        for id in 1..=n as u64 {
            if exited(&mut cluster, run, id) {
                cluster.start_node(id);
                run.nodes.set(id, cluster.node(id).map(|s| s.addr));
            }
        }
        done
    });
    let mut violations = Vec::new();
    let problems = lock(&run.problems).clone();
    if let Some(p) = problems.first() {
        violations.push(format!("{} problem(s) while running; first: {p}", problems.len()));
    }
    let mut lines = Vec::new();
    for k in [SINGLE, MULTI] {
        // (f) a reconfiguration finishes once the faults are over; the checks read the
        // voters it left.
        let voters = match settled_voters(&nodes, &cluster, run.journals[k], Duration::from_secs(30)) {
            Ok((survive, voters)) => {
                run.note(format!("journal {k} settled: F = {survive:?}, voters {voters:?}"));
                voters
            }
            Err(e) => {
                violations.push(format!("journal {k}: {e}"));
                continue;
            }
        };
        match check_journal(&run, &cluster, k, &voters, secs) {
            Ok(line) => lines.push(line),
            Err(e) => violations.push(format!("journal {k}: {e}")),
        }
    }
    if !violations.is_empty() {
        let kept = keep_artifacts(&mut cluster, &artifacts(n, seed));
        return Err((format!("{} ({kept})", violations.join("; ")), dump(&run)));
    }
    lines.extend(lock(&run.log).iter().map(|l| format!("  {l}")));
    // Segments the running nodes gave back (a node restarted meanwhile counts from its start).
    let given_back = cluster
        .ids()
        .filter_map(|id| cluster.metrics(id, Duration::from_secs(2)))
        .filter_map(|m| m.lines().find_map(|l| l.strip_prefix("tephra_journal_segments_deleted_total ")?.trim().parse::<u64>().ok()))
        .sum();
    let segments = (1..=n as u64)
        .map(|id| {
            std::fs::read_dir(cluster.data_dir(id).join("journals"))
                .map_or(0, |d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().ends_with(".log")).count())
        })
        .collect();
    Ok(Summary { rounds, configures, given_back, segments, lines })
}

/// The checks of journal `k` once the faults are over (see the module's table): its line of
/// counts, or the violation found. The journal's history is left settled in `run`.
fn check_journal(run: &Run, cluster: &Cluster, k: usize, voters: &[u64], secs: u64) -> Result<String, String> {
    let j = run.journals[k];
    // (c) the same on every voter (non-voters hold no copy). A write whose caller gave up may
    // still land between two nodes' reads: a difference counts when it is still there on the
    // third look, a second apart.
    let mut looks = 0;
    let (invoked, answered, held) = loop {
        looks += 1;
        let mut held: Option<(u64, u64, Held, u64)> = None;
        let mut differ = None;
        for &id in voters {
            let addr = cluster.node(id).expect("every node runs after the heal").addr;
            let (invoked, answered, h) = read_everything(run.nodes, addr, j, Duration::from_secs(30))?;
            match &held {
                None => held = Some((invoked, answered, h, id)),
                Some((_, _, first, fid)) if *first != h => differ = Some(format!("node {fid} and node {id} differ: {}", differ_at(first, &h))),
                Some(_) => {}
            }
        }
        match differ {
            Some(d) if looks >= 3 => return Err(d),
            Some(_) => std::thread::sleep(Duration::from_secs(1)),
            None => {
                let (invoked, answered, held, _) = held.expect("a journal has voters");
                break (invoked, answered, held);
            }
        }
    };
    if held.records.len() as u64 != held.next_seq - held.first_seq {
        return Err(format!("seqs not dense: {} records in {}..{}", held.records.len(), held.first_seq, held.next_seq));
    }
    let last = Op::Read { from: held.first_seq, limit: 0 };
    let ret = Ret::Page(held.records.clone(), held.leader, held.next_seq, held.first_seq);
    let mut calls = std::mem::take(&mut *lock(&run.history[k]));
    calls.push(Recorded { invoked, answered: Some((answered, ret)), op: last });
    let recorded = calls.len();
    let ambiguous = calls.iter().filter(|c| c.answered.is_none()).count();
    let accepted = calls.iter().filter(|c| matches!(c.answered, Some((_, Ret::Verdict("accepted", ..))))).count();
    // (b), (d) and the settling of ambiguous writes.
    let calls = match settle(calls.clone()) {
        Ok(settled) => settled,
        Err(e) => {
            *lock(&run.history[k]) = calls;
            return Err(e);
        }
    };
    let left = calls.iter().filter(|c| c.answered.is_none()).count();
    // (a) linearizable.
    let started = Instant::now();
    let verdict = check(&Spec(MODES[k]), &calls);
    let took = started.elapsed();
    *lock(&run.history[k]) = calls;
    if let Verdict::NotLinearizable(longest) = verdict {
        let h = lock(&run.history[k]);
        let stuck = longest.last().map(|&i| format!("{:?}", h[i]));
        return Err(format!("not linearizable ({} calls after settling); the longest order found places {} calls, the last {stuck:?}", h.len(), longest.len()));
    }
    if accepted < 10 {
        return Err(format!("only {accepted} writes accepted in {secs} s of faults"));
    }
    Ok(format!(
        "journal {k} ({:?}): {recorded} calls, {accepted} accepted, {ambiguous} ambiguous ({left} left after settling), {} records held from {}, checked in {took:?}",
        MODES[k],
        held.records.len(),
        held.first_seq
    ))
}

/// Settles ambiguous writes from what the reads showed (see the module's notes), after
/// checking that no seq showed two tokens, no token lies at two seqs, and every acknowledged
/// write lies at its seq.
fn settle(calls: Vec<Recorded<Op, Ret>>) -> Result<Vec<Recorded<Op, Ret>>, String> {
    // Every seq any read showed, its token and when it was first shown.
    let mut at_seq: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for c in &calls {
        if let (Op::Read { from, .. }, Some((t, Ret::Page(records, ..)))) = (&c.op, &c.answered) {
            for (i, &token) in records.iter().enumerate() {
                let seq = from + i as u64;
                let e = at_seq.entry(seq).or_insert((token, *t));
                if e.0 != token {
                    return Err(format!("seq {seq} showed token {:#x} and token {token:#x}", e.0));
                }
                e.1 = e.1.min(*t);
            }
        }
    }
    let mut seq_of: HashMap<u64, (u64, u64)> = HashMap::new();
    for (&seq, &(token, t)) in &at_seq {
        if let Some((other, _)) = seq_of.insert(token, (seq, t)) {
            return Err(format!("token {token:#x} lies at seq {other} and at seq {seq}: a write applied twice"));
        }
    }
    let shown_to = at_seq.last_key_value().map_or(0, |(s, _)| s + 1);
    let gaps = (0..shown_to).any(|s| !at_seq.contains_key(&s));
    // Acknowledged writes.
    let mut acknowledged: HashSet<u64> = HashSet::new();
    for c in &calls {
        if let (Op::Write { token, .. }, Some((_, Ret::Verdict(v @ ("accepted" | "duplicate"), seq, _)))) = (&c.op, &c.answered) {
            match at_seq.get(seq) {
                Some((t, _)) if t == token => {}
                other => {
                    return Err(format!(
                        "the write of token {token:#x} was answered {v} at seq {seq}, but that seq showed {other:?}: an acknowledged write lost"
                    ))
                }
            }
            if *v == "accepted" && !acknowledged.insert(*token) {
                return Err(format!("token {token:#x} was accepted twice"));
            }
        }
    }
    // Which ambiguous call of each seen token took effect: the earliest sent before it was
    // first shown.
    let mut chosen: HashMap<u64, usize> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        if let (Op::Write { token, .. }, None) = (&c.op, &c.answered) {
            if let Some(&(_, shown)) = seq_of.get(token) {
                if c.invoked <= shown && !acknowledged.contains(token) {
                    chosen.entry(*token).and_modify(|j| *j = if calls[*j].invoked <= c.invoked { *j } else { i }).or_insert(i);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(calls.len());
    for (i, mut c) in calls.into_iter().enumerate() {
        if let (Op::Write { leader, seq, token }, None) = (&c.op, &c.answered) {
            if let Some(&(shown_seq, shown)) = seq_of.get(token) {
                if chosen.get(token) == Some(&i) {
                    c.answered = Some((shown, Ret::Verdict("accepted", shown_seq, 1)));
                } else if chosen.contains_key(token) || acknowledged.contains(token) {
                    continue;
                }
                // Else: shown, but no call could have put it there; left for the checker.
            } else if !gaps && (*leader == 0 || *seq >= shown_to || at_seq.contains_key(seq)) {
                // Never shown although every seq held was: it did nothing.
                continue;
            }
        }
        out.push(c);
    }
    Ok(out)
}

/// The nemesis log and every history, for the file a violation names.
fn dump(run: &Run) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# nemesis");
    for l in lock(&run.log).iter() {
        let _ = writeln!(s, "{l}");
    }
    for k in [SINGLE, MULTI] {
        let _ = writeln!(s, "\n# journal {k} ({:?}) {:?}: invoked_ns answered_ns op -> answer", MODES[k], run.journals[k]);
        for c in lock(&run.history[k]).iter() {
            match &c.answered {
                Some((t, r)) => writeln!(s, "{} {} {:?} -> {:?}", c.invoked, t, c.op, r),
                None => writeln!(s, "{} - {:?} -> (ambiguous)", c.invoked, c.op),
            }
            .unwrap();
        }
    }
    s
}

/// Where a violation of `seed` on `n` nodes leaves its files: `<dir>.txt` for the report,
/// `<dir>/` for the nodes' logs and data.
fn artifacts(n: usize, seed: u64) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-faults").join(format!("nodes{n}-seed{seed}"))
}

/// Stops every node and keeps what each printed (every process, killed ones included) and a
/// copy of its data directory under `dir`; says where, or what failed.
fn keep_artifacts(cluster: &mut Cluster, dir: &std::path::Path) -> String {
    fn copy(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                copy(&e.path(), &to.join(e.file_name()))?;
            } else {
                std::fs::copy(e.path(), to.join(e.file_name()))?;
            }
        }
        Ok(())
    }
    let _ = std::fs::remove_dir_all(dir);
    let mut kept = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for id in 1..=cluster.size() as u64 {
            cluster.resume(id);
            cluster.kill(id);
            std::fs::write(dir.join(format!("node{id}.log")), cluster.log(id))?;
            copy(&cluster.data_dir(id), &dir.join(format!("node{id}-data")))?;
        }
        Ok(())
    };
    match kept() {
        Ok(()) => format!("node logs and data in {}", dir.display()),
        Err(e) => format!("node logs and data not kept: {e}"),
    }
}

/// Runs every seed on `n` nodes; panics naming each seed that found a violation.
fn fault_seeds(n: usize, default: &[u64]) {
    let _serial = serial();
    let seeds = std::env::var("TEPHRA_FAULT_SEEDS").ok().filter(|s| !s.trim().is_empty()).map_or_else(|| default.to_vec(), |s| parse_seeds(&s));
    let secs = env_number("TEPHRA_FAULT_SECS", 10);
    let mut failed = Vec::new();
    for seed in seeds {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(|| run_seed(n, seed, secs)).unwrap_or_else(|p| {
            let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err((format!("panicked: {why}"), String::new()))
        });
        match outcome {
            Ok(s) => {
                eprintln!(
                    "seed {seed} on {n} nodes: held, {} fault rounds, {} configures, {} segments given back, segments held {:?}, {:?}",
                    s.rounds,
                    s.configures,
                    s.given_back,
                    s.segments,
                    started.elapsed()
                );
                for l in s.lines {
                    eprintln!("  {l}");
                }
            }
            Err((why, detail)) => {
                let path = artifacts(n, seed).with_extension("txt");
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, format!("seed {seed} on {n} nodes: {why}\n\n{detail}")).unwrap();
                eprintln!("VIOLATION nodes={n} seed={seed}: {why} (history: {})", path.display());
                failed.push(seed);
            }
        }
    }
    assert!(failed.is_empty(), "violations on {n} nodes with seeds {failed:?} (see VIOLATION lines above)");
}

#[test]
fn faults_on_three_nodes_keep_every_journal_linearizable() {
    fault_seeds(3, DEFAULT_SEEDS_3);
}

#[test]
fn faults_on_five_nodes_keep_every_journal_linearizable() {
    fault_seeds(5, DEFAULT_SEEDS_5);
}

#[test]
fn the_next_write_after_the_leader_dies_is_acknowledged_within_two_seconds() {
    let _serial = serial();
    let trials = env_number("TEPHRA_FAILOVER_TRIALS", 10) as usize;
    let mut cluster = Cluster::start(&server_bin(), 3, &[("TEPHRA__METRICS__BIND", "127.0.0.1:0")]);
    let nodes = Nodes::new(&cluster);
    let j = create(&nodes, "orders", JournalMode::Single, JournalDurability::Ordered);
    const ME: u128 = 0xa11ce;
    // Every acknowledged write: its seq and when its answer came.
    let acks: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let mut latencies = Vec::new();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut router = Router::new(&nodes, 1);
            let claim = Op::SetLeader { new: ME, old: 0 };
            loop {
                match router.send(call_of(j, &claim)).1 {
                    Sent::Answer(_, r) if r.outcome() == JournalOutcome::Leader || leader_of(&r) == ME => break,
                    Sent::Answer(_, r) => panic!("the claim was answered {r:?}"),
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            let mut seq = 0;
            while !stop.load(Ordering::SeqCst) {
                // The same write until it is known written: an ambiguous one is sent again
                // unchanged, and a duplicate answer settles it.
                let op = Op::Write { leader: ME, seq, token: seq };
                match router.send(call_of(j, &op)) {
                    (_, Sent::Answer(at, r)) => match r.outcome() {
                        JournalOutcome::Accepted | JournalOutcome::Duplicate => {
                            assert_eq!(r.seq, seq, "{r:?}");
                            lock(&acks).push((seq, at));
                            seq += 1;
                        }
                        _ => panic!("the write at {seq} was answered {r:?}"),
                    },
                    (_, Sent::Wrong(why)) => panic!("the write at {seq}: {why}"),
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        for trial in 0..trials {
            let before = lock(&acks).len();
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock(&acks).len() < before + 20 {
                assert!(Instant::now() < deadline, "trial {trial}: the writer made no progress");
                std::thread::sleep(Duration::from_millis(10));
            }
            let leader = loop {
                if let Some(l) = cluster.group_leader(j.0, j.1) {
                    break l;
                }
                assert!(Instant::now() < deadline, "trial {trial}: no node leads the journal");
                std::thread::sleep(Duration::from_millis(10));
            };
            cluster.kill(leader);
            nodes.set(leader, None);
            let killed = nodes.now();
            let deadline = Instant::now() + Duration::from_secs(10);
            let took = loop {
                if let Some(&(_, at)) = lock(&acks).iter().rev().take_while(|(_, at)| *at > killed).last() {
                    break Duration::from_nanos(at - killed);
                }
                if Instant::now() > deadline {
                    break Duration::from_secs(10);
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            eprintln!("trial {trial}: node {leader} killed; the next write acknowledged after {took:?}");
            latencies.push(took);
            cluster.start_node(leader);
            nodes.set(leader, cluster.node(leader).map(|s| s.addr));
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        writer.join().expect("the writer");
    });
    let acks = lock(&acks).clone();
    let tokens: Vec<u64> = acks.iter().map(|(seq, _)| *seq).collect();
    for id in 1..=3 {
        let addr = cluster.node(id).unwrap().addr;
        let (_, _, held) = read_everything(&nodes, addr, j, Duration::from_secs(30)).unwrap();
        assert_eq!(held.first_seq, 0);
        assert_eq!(held.records, tokens, "node {id} does not hold exactly the acknowledged writes");
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[(latencies.len() * 99).div_ceil(100) - 1];
    let max = *latencies.last().unwrap();
    eprintln!("failover over {trials} kills of the leader: p50 {p50:?}, p99 {p99:?}, max {max:?}; {} writes acknowledged, all on every node", acks.len());
    assert!(p99 <= Duration::from_secs(2), "failover p99 {p99:?} is above 2 s: {latencies:?}");
}

#[test]
fn the_proxy_forwards_cuts_holds_and_heals() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    // An echo server behind the proxy.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    if s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let proxy = Proxy::start(target);
    assert_eq!(proxy.target(), target);
    let echo = |c: &mut TcpStream, msg: &[u8]| -> std::io::Result<Vec<u8>> {
        c.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got)?;
        Ok(got)
    };
    let connect = || {
        let c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    };
    let mut c = connect();
    assert_eq!(echo(&mut c, b"open").unwrap(), b"open");
    // A cut closes the live connection, and every new one at once.
    proxy.cut();
    assert_eq!(proxy.mode(), LinkMode::Cut);
    let mut buf = [0u8; 4];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "a cut connection ends");
    let mut d = connect();
    assert!(echo(&mut d, b"gone").is_err(), "a connection made while cut is closed");
    // Healed: new connections flow again.
    proxy.heal();
    let mut e = connect();
    assert_eq!(echo(&mut e, b"back").unwrap(), b"back");
    // Held: bytes wait, and arrive in order once healed.
    proxy.hold();
    e.write_all(b"held").unwrap();
    proxy.set_delay(Duration::from_millis(1));
    proxy.set_mode(LinkMode::Open);
    let mut got = [0u8; 4];
    e.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"held");
    assert_eq!(proxy.live(), 1);
    assert!(proxy.accepted() >= 3);
}

#[test]
fn settling_finds_lost_and_doubled_writes_and_settles_ambiguous_ones() {
    let call = |invoked, answered, op| Recorded { invoked, answered, op };
    let write = |token| Op::Write { leader: 0, seq: 0, token };
    let read = Op::Read { from: 0, limit: 0 };
    // An acknowledged write that no read shows at its seq: lost.
    let lost = vec![call(0, Some((1, Ret::Verdict("accepted", 0, 1))), write(7)), call(2, Some((3, Ret::Page(vec![], 0, 0, 0))), read.clone())];
    assert!(settle(lost).unwrap_err().contains("acknowledged write lost"));
    // One token at two seqs: applied twice.
    let twice = vec![call(0, None, write(7)), call(2, Some((3, Ret::Page(vec![7, 7], 0, 2, 0))), read.clone())];
    assert!(settle(twice).unwrap_err().contains("applied twice"));
    // One seq showing two tokens.
    let changed = vec![call(2, Some((3, Ret::Page(vec![7], 0, 1, 0))), read.clone()), call(4, Some((5, Ret::Page(vec![8], 0, 1, 0))), read.clone())];
    assert!(settle(changed).unwrap_err().contains("seq 0 showed"));
    // An ambiguous write a read shows is accepted at that seq by the read's answer; one no read
    // shows (every seq was shown) did nothing and is dropped.
    let ambiguous = vec![call(0, None, write(7)), call(1, None, write(9)), call(2, Some((3, Ret::Page(vec![7], 0, 1, 0))), read.clone())];
    let settled = settle(ambiguous).unwrap();
    assert_eq!(settled.len(), 2);
    assert_eq!(settled[0].answered, Some((3, Ret::Verdict("accepted", 0, 1))));
    assert!(check(&Spec(Mode::Multi), &settled).is_linearizable());
    // An ambiguous single-writer write whose identical re-send was accepted did nothing.
    let fenced = |token| Op::Write { leader: 1, seq: 0, token };
    let resent = vec![
        call(0, Some((1, Ret::Viewed("leader", 1, 0, 0))), Op::SetLeader { new: 1, old: 0 }),
        call(2, None, fenced(7)),
        call(4, Some((5, Ret::Verdict("accepted", 0, 1))), fenced(7)),
        call(6, Some((7, Ret::Page(vec![7], 1, 1, 0))), read),
    ];
    let settled = settle(resent).unwrap();
    assert_eq!(settled.len(), 3);
    assert!(check(&Spec(Mode::Single), &settled).is_linearizable());
}
