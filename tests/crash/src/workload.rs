//! Concurrent seeded writers, subscribers and readers over real connections.

use crate::gen::{self, Rng};
use crate::witness::{Kind, Witness};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tephra::client::{Client, ClientError, SubEvent, SubscribeCancel};
use tephra::proto::ErrorCode;
use tephra::{AppendCondition, Position, Query};

/// How long a writer waits for an answer before calling the server hung.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// The four workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Unconditional appends only.
    Pure,
    /// Uniqueness guards, idempotency claims and boundary guards that race each other.
    Conditional,
    /// Plain writers plus subscribers following the log from random positions.
    Subscription,
    /// Plain and conditional writers, a subscriber and a reader.
    Mixed,
}

impl Workload {
    /// All four, in order.
    pub const ALL: [Workload; 4] = [Workload::Pure, Workload::Conditional, Workload::Subscription, Workload::Mixed];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Pure => "pure",
            Workload::Conditional => "conditional",
            Workload::Subscription => "subscription",
            Workload::Mixed => "mixed",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// `(plain writers, conditional writers, subscribers, readers)`.
    fn shape(self) -> (usize, usize, usize, usize) {
        match self {
            Workload::Pure => (4, 0, 0, 0),
            Workload::Conditional => (1, 3, 0, 0),
            Workload::Subscription => (3, 0, 2, 0),
            Workload::Mixed => (2, 2, 1, 1),
        }
    }
}

/// Shared state of one run of a workload.
#[derive(Clone)]
pub struct Ctx {
    /// Event seed.
    pub seed: u64,
    /// Server address.
    pub addr: std::net::SocketAddr,
    /// Witness directory.
    pub witness_dir: PathBuf,
    /// Next unused sequence number (shared by every writer of a round).
    pub next_seq: Arc<AtomicU64>,
    /// A name unique to this run (cycle), used in witness file names.
    pub tag: String,
    /// Writers stop after this many error answers that are not condition verdicts (`None`:
    /// such an answer is a violation and the writer stops).
    pub errors_expected: Option<u32>,
    /// Whether a writer's append may be acknowledged after it had an error answer: not under
    /// fail-stop (a failed write or sync), yes when the fault only refuses the appends that
    /// met it (a rollover that could not create its segment; a later, smaller append can still
    /// fit the old segment).
    pub acks_after_errors: bool,
}

/// What the workload saw.
#[derive(Default, Debug)]
pub struct Outcome {
    /// Acknowledged appends.
    pub acks: u64,
    /// Condition verdicts (CONFLICT / ALREADY_EXISTS).
    pub rejects: u64,
    /// Other error answers, with their codes.
    pub errors: Vec<ErrorCode>,
    /// Events delivered to subscribers and readers.
    pub served: u64,
    /// Violations noticed on the fly.
    pub violations: Vec<String>,
    /// Highest acknowledged position.
    pub max_acked: u64,
}

/// A running workload.
pub struct Running {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    outcome: Arc<Mutex<Outcome>>,
    cancels: mpsc::Receiver<SubscribeCancel>,
}

impl Running {
    /// Number of writer/reader threads still running.
    pub fn live(&self) -> usize {
        self.handles.iter().filter(|h| !h.is_finished()).count()
    }

    /// Snapshot of acks so far.
    pub fn acks(&self) -> u64 {
        self.outcome.lock().unwrap().acks
    }

    /// Error answers so far.
    pub fn errors(&self) -> usize {
        self.outcome.lock().unwrap().errors.len()
    }

    /// Asks every thread to stop (cancelling subscriptions) and joins them.
    pub fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::SeqCst);
        while let Ok(c) = self.cancels.try_recv() {
            c.cancel();
        }
        for h in self.handles {
            let _ = h.join();
        }
        while let Ok(c) = self.cancels.try_recv() {
            c.cancel();
        }
        std::mem::take(&mut *self.outcome.lock().unwrap())
    }
}

/// Starts `w` against `ctx.addr`.
pub fn start(w: Workload, ctx: &Ctx, rng: &mut Rng) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let (ctx_tx, cancels) = mpsc::channel();
    let (plain, cond, subs, readers) = w.shape();
    let mut handles = Vec::new();
    for i in 0..plain + cond {
        let (ctx, stop, outcome, r) = (ctx.clone(), stop.clone(), outcome.clone(), rng.fork(i as u64));
        let conditional = i >= plain;
        handles.push(std::thread::spawn(move || writer(ctx, i, conditional, r, stop, outcome)));
    }
    for i in 0..subs {
        let (ctx, stop, outcome, r, tx) = (ctx.clone(), stop.clone(), outcome.clone(), rng.fork(100 + i as u64), ctx_tx.clone());
        handles.push(std::thread::spawn(move || subscriber(ctx, i, r, stop, outcome, tx)));
    }
    for i in 0..readers {
        let (ctx, stop, outcome, r) = (ctx.clone(), stop.clone(), outcome.clone(), rng.fork(200 + i as u64));
        handles.push(std::thread::spawn(move || reader(ctx, i, r, stop, outcome)));
    }
    Running { stop, handles, outcome, cancels }
}

/// Connects (Hello included) with [`ANSWER_TIMEOUT`] on the handshake and on every later
/// answer. `Client::connect` has no timeout for its Hello, so it runs on a helper thread; a
/// server that accepts but never answers is reported as a hang (the thread ends when the
/// server is killed).
pub fn connect_timeout(addr: std::net::SocketAddr) -> Result<Client, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Client::connect(addr));
    });
    match rx.recv_timeout(ANSWER_TIMEOUT) {
        Ok(Ok(mut c)) => {
            c.set_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| format!("connect: {e}"))?;
            Ok(c)
        }
        Ok(Err(e)) => Err(format!("connect: {e}")),
        Err(_) => Err(format!("HANG: the Hello got no answer within {} s", ANSWER_TIMEOUT.as_secs())),
    }
}

fn connect(ctx: &Ctx) -> Option<Client> {
    match connect_timeout(ctx.addr) {
        Ok(c) => Some(c),
        Err(e) if e.starts_with("HANG") => {
            crate::record_hang(format!("workload connect ({}): {e}", ctx.witness_dir.display()));
            None
        }
        Err(_) => None,
    }
}

fn code_name(c: ErrorCode) -> &'static str {
    c.short_name()
}

fn writer(ctx: Ctx, id: usize, conditional: bool, mut rng: Rng, stop: Arc<AtomicBool>, outcome: Arc<Mutex<Outcome>>) {
    let Some(mut client) = connect(&ctx) else { return };
    let mut wit = Witness::open(&ctx.witness_dir, &format!("{}-w{id}.wit", ctx.tag)).expect("witness");
    let mut last_pos = match client.stats() {
        Ok(s) => s.event_count,
        Err(_) => return,
    };
    let mut errors = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let kind = if !conditional {
            Kind::Plain
        } else {
            match rng.below(3) {
                0 => Kind::Uniq,
                1 => Kind::Claim(rng.below(2048)),
                _ => Kind::Bound { after: last_pos, entity: 0 },
            }
        };
        let n = match kind {
            Kind::Claim(_) => 1,
            _ if rng.chance(1, 25) => rng.range(10, 40),
            _ => rng.range(1, 4),
        };
        let seq = ctx.next_seq.fetch_add(n, Ordering::SeqCst);
        let kind = match kind {
            Kind::Bound { after, .. } => Kind::Bound { after, entity: seq % gen::ENTITIES },
            k => k,
        };
        let events: Vec<_> = (seq..seq + n).map(|s| gen::event(ctx.seed, s, kind.claim())).collect();
        let condition = match &kind {
            Kind::Plain | Kind::Probe => None,
            Kind::Uniq => Some(AppendCondition::new(gen::tag_query(&format!("uniq:{seq}")))),
            Kind::Claim(k) => Some(AppendCondition::exists_only(gen::tag_query(&format!("claim:{k}")))),
            Kind::Bound { after, entity } => Some(AppendCondition::new(gen::tag_query(&format!("entity:{entity}"))).after(Position(*after))),
        };
        wit.sent(seq, n, &kind);
        match client.append(events, condition) {
            Ok(r) => {
                wit.acked(seq, r.first.get(), r.last.get());
                last_pos = r.last.get();
                let mut o = outcome.lock().unwrap();
                if errors > 0 && !ctx.acks_after_errors {
                    o.violations
                        .push(format!("append seq {seq} acknowledged at {}..={} after this writer had an error answer (fail-stop broken)", r.first, r.last));
                }
                o.acks += 1;
                o.max_acked = o.max_acked.max(r.last.get());
                if r.last.get() + 1 - r.first.get() != n {
                    o.violations.push(format!("append of {n} events (seq {seq}) acknowledged as {}..={}", r.first, r.last));
                }
            }
            Err(ClientError::Server { code: code @ (ErrorCode::Conflict | ErrorCode::AlreadyExists), conflict_position, .. }) => {
                let pos = conflict_position.map(|p| p.get()).unwrap_or(0);
                wit.rejected(seq, code_name(code), pos);
                let mut o = outcome.lock().unwrap();
                o.rejects += 1;
                if matches!(kind, Kind::Plain | Kind::Uniq) {
                    o.violations.push(format!("{kind:?} append seq {seq} rejected with {code:?} at {pos}"));
                }
                if pos > last_pos {
                    last_pos = pos;
                }
            }
            Err(ClientError::Server { code, message, .. }) => {
                wit.failed(seq, &format!("{}: {message}", code_name(code)));
                errors += 1;
                let mut o = outcome.lock().unwrap();
                o.errors.push(code);
                match ctx.errors_expected {
                    None => {
                        o.violations.push(format!("append seq {seq} answered {code:?}: {message}"));
                        return;
                    }
                    Some(k) if errors >= k => return,
                    Some(_) => {}
                }
            }
            Err(ClientError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                crate::record_hang(format!("append seq {seq} ({}) got no answer within {} s", ctx.witness_dir.display(), ANSWER_TIMEOUT.as_secs()));
                return;
            }
            // The connection died (the server was killed): the batch stays in doubt.
            Err(_) => return,
        }
    }
}

fn seq_of(ctx: &Ctx, data: &[u8]) -> u64 {
    match gen::payload_id(data) {
        Some((seq, seed)) if seed == ctx.seed => seq,
        _ => u64::MAX,
    }
}

fn subscriber(ctx: Ctx, id: usize, mut rng: Rng, stop: Arc<AtomicBool>, outcome: Arc<Mutex<Outcome>>, cancels: mpsc::Sender<SubscribeCancel>) {
    let Some(mut client) = connect(&ctx) else { return };
    let head = match client.stats() {
        Ok(s) => s.event_count,
        Err(_) => return,
    };
    let mut wit = Witness::open(&ctx.witness_dir, &format!("{}-s{id}.wit", ctx.tag)).expect("witness");
    let from = if rng.chance(1, 2) { rng.below(head + 1) } else { head };
    let Ok((stream, cancel)) = client.subscribe(Query::all(), Position(from)) else { return };
    let _ = cancels.send(cancel.clone());
    if stop.load(Ordering::SeqCst) {
        cancel.cancel();
    }
    let mut expect = from + 1;
    let mut served = 0;
    for item in stream {
        match item {
            Ok(SubEvent::Event(se)) => {
                let pos = se.position.get();
                let seq = seq_of(&ctx, se.event.data());
                wit.seen(pos, seq);
                served += 1;
                if pos != expect {
                    outcome.lock().unwrap().violations.push(format!("subscription after {from} delivered position {pos}, expected {expect}"));
                    break;
                }
                expect += 1;
            }
            Ok(SubEvent::CaughtUp(_)) => {}
            Err(_) => break,
        }
    }
    wit.sync();
    outcome.lock().unwrap().served += served;
}

fn reader(ctx: Ctx, id: usize, mut rng: Rng, stop: Arc<AtomicBool>, outcome: Arc<Mutex<Outcome>>) {
    let Some(mut client) = connect(&ctx) else { return };
    let mut wit = Witness::open(&ctx.witness_dir, &format!("{}-r{id}.wit", ctx.tag)).expect("witness");
    while !stop.load(Ordering::Relaxed) {
        let head = match client.stats() {
            Ok(s) => s.event_count,
            Err(_) => break,
        };
        let after = rng.below(head + 1);
        let q = if rng.chance(1, 2) { Query::all() } else { gen::tag_query(&format!("entity:{}", rng.below(gen::ENTITIES))) };
        let all = matches!(q, Query::All);
        let Ok(stream) = client.read(q, Position(after), Some(200)) else { break };
        let mut expect = after + 1;
        let mut last = None;
        let mut ok = true;
        for item in stream {
            match item {
                Ok(se) => {
                    let pos = se.position.get();
                    if all && pos != expect {
                        outcome.lock().unwrap().violations.push(format!("read after {after} returned position {pos}, expected {expect}"));
                    }
                    expect = pos + 1;
                    last = Some((pos, seq_of(&ctx, se.event.data())));
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if let Some((p, s)) = last {
            wit.seen(p, s);
            outcome.lock().unwrap().served += 1;
        }
        if !ok {
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.range(1, 20)));
    }
    wit.sync();
}
