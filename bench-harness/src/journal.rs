//! `tephra-bench journal`: the journal API on our server against etcd 3.4, side by side in one
//! run (docs/benchmarks.md §7; the workloads are issue 30's "Benchmark").
//!
//! | workload | ours | etcd |
//! |---|---|---|
//! | `single × B` | `W` single-writer journals, one writer each (a won `SetLeader`), `B` records per fenced write at the writer's `next_seq` | per writer, `txn(if mod_revision(head) == r then put B record keys and head)`: one key per record, `B + 1` puts in one txn |
//! | `multi × 1` | one multi-writer journal, `W` writers, one record per write | `put` of a fresh key per record (etcd's revision orders them; no fence, as a multi-writer journal has none) |
//! | `tail` | one writer (closed loop, 1 record per fenced write) and one reader waiting at the tail (`read` with `wait_ms`): delay from the write's ack to the reader holding the record | the same writer as `single × 1`, a watch on the record keys |
//! | `dcb 64 × 1` | our DCB server's `W` × 1 conditional append (the `append` workload), ours only | none |
//!
//! Every run starts its server fresh on a new data directory under `--dir` (the same disk for
//! both), measures a closed loop (one request in flight per writer) after a warm-up, stops the
//! server by pid and removes the directory. Systems alternate (A B, then B A) and the table
//! quotes medians over rounds. After an ours run the journals' `next_seq` must add up to the
//! records acknowledged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tephra::client::journal::{
    fresh_leader, CreateOutcome, JournalError, Journals, JournalsConfig, ListOutcome, ReadOutcome, Resolution, SetLeaderOutcome, WriteOutcome,
};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};

use crate::append::{self, fmt_us, Clock, Tally};
use crate::etcd::{b64, unb64, EtcdProcess, Http};
use crate::metrics::{self, ErrorCounts, Latency};
use crate::report::thousands;
use crate::server::{ServerProcess, ServerSpec};
use crate::workload::WorkloadSpec;

/// The tenant the benchmark's journals live in.
pub const TENANT: &str = "bench";

/// One workload of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// `writers` single-writer journals, one writer each, `batch` records per fenced write.
    Single(usize),
    /// One multi-writer journal, `writers` writers, one record per write.
    Multi,
    /// One fenced writer and one reader at the tail: ack-to-seen delay.
    Tail,
    /// Our DCB server's `writers` × 1 conditional append.
    Dcb,
}

impl Workload {
    /// Its label in tables and JSON.
    pub fn label(self, writers: usize) -> String {
        match self {
            Workload::Single(b) => format!("{writers} single-writer journals × {b} record{}", if b == 1 { "" } else { "s" }),
            Workload::Multi => format!("1 multi-writer journal, {writers} writers × 1 record"),
            Workload::Tail => "tail reader: ack → seen (1 writer × 1 record)".into(),
            Workload::Dcb => format!("our DCB server, {writers} × 1 conditional append"),
        }
    }

    /// Whether etcd runs it.
    pub fn on_etcd(self) -> bool {
        !matches!(self, Workload::Dcb)
    }
}

/// The two systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// Our `tephra-server`.
    Ours,
    /// etcd 3.4, one member.
    Etcd,
}

impl System {
    /// `ours` or `etcd`.
    pub fn name(self) -> &'static str {
        match self {
            System::Ours => "ours",
            System::Etcd => "etcd",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct JournalBenchConfig {
    /// Our `tephra-server`.
    pub ours: PathBuf,
    /// The etcd binary, or `None` for ours only.
    pub etcd: Option<PathBuf>,
    /// Scratch root for the data directories (one disk for both; never a tmpfs).
    pub dir: PathBuf,
    /// Where `journal.md`, `journal.json` and `logs/` go.
    pub out: PathBuf,
    /// Writers (and journals of the single-writer workloads).
    pub writers: usize,
    /// Bytes per record.
    pub record_size: usize,
    /// Records per write of the single-writer workloads.
    pub batches: Vec<usize>,
    /// Run the multi-writer workload.
    pub multi: bool,
    /// Run the tail-reader workload.
    pub tail: bool,
    /// Run our DCB server's `writers` × 1 conditional append.
    pub dcb: bool,
    /// Rounds.
    pub rounds: usize,
    /// Unmeasured seconds before each window.
    pub warmup: Duration,
    /// Measured window of each run.
    pub duration: Duration,
    /// Pause between runs.
    pub settle: Duration,
    /// The journals' store durability.
    pub durability: StoreDurability,
}

impl JournalBenchConfig {
    /// The workloads in the order each round runs them.
    pub fn workloads(&self) -> Vec<Workload> {
        let mut w: Vec<Workload> = self.batches.iter().map(|&b| Workload::Single(b)).collect();
        if self.multi {
            w.push(Workload::Multi);
        }
        if self.tail {
            w.push(Workload::Tail);
        }
        if self.dcb {
            w.push(Workload::Dcb);
        }
        w
    }
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The workload's label.
    pub workload: String,
    /// `ours` or `etcd`.
    pub system: String,
    /// Round, from 1.
    pub round: usize,
    /// Records acknowledged per second in the window (the tail workload: the writer's rate).
    pub records_per_sec: f64,
    /// Writes (requests) acknowledged per second in the window.
    pub writes_per_sec: f64,
    /// Write latency from sent to acknowledged, µs; the tail workload: the delay from a
    /// write's ack to the reader holding the record.
    pub latency: Option<Latency>,
    /// Records acknowledged over the whole run.
    pub records_acked_total: u64,
    /// Failed writes by kind.
    pub errors: ErrorCounts,
    /// The after-run check: `held = acked`, a mismatch, or `-`.
    pub check: String,
    /// Tail workload: records the reader held before their writer saw the ack (counted as 0).
    pub seen_before_ack: u64,
    /// Set when the run failed: why.
    pub failed: Option<String>,
    /// Records acknowledged per 100 ms since the start of the run (warm-up included): shows
    /// a rate that drifts as the journals grow.
    pub timeline_records: Vec<u64>,
}

/// Medians over rounds of one workload on one system.
#[derive(Debug, Clone, Serialize)]
pub struct Median {
    /// Records per second.
    pub records_per_sec: f64,
    /// p50, µs.
    pub p50_us: u64,
    /// p99, µs.
    pub p99_us: u64,
    /// Runs behind it.
    pub runs: usize,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct JournalReport {
    /// Writers.
    pub writers: usize,
    /// Bytes per record.
    pub record_size: usize,
    /// Rounds.
    pub rounds: usize,
    /// Warm-up seconds per run.
    pub warmup_seconds: f64,
    /// Window seconds per run.
    pub duration_seconds: f64,
    /// The journals' store durability.
    pub store_durability: String,
    /// The etcd binary, if any.
    pub etcd: Option<String>,
    /// Every run.
    pub runs: Vec<Run>,
    /// `workload label -> system -> median`.
    pub medians: BTreeMap<String, BTreeMap<String, Median>>,
    /// The rendered table (markdown).
    pub table: String,
    /// True when a signal stopped the run.
    pub interrupted: bool,
}

/// The first record's bytes: all `x` (a fixed payload keeps the client's cost flat).
pub(crate) fn records(batch: usize, size: usize) -> Vec<Vec<u8>> {
    vec![vec![b'x'; size]; batch]
}

pub(crate) fn journal_error(e: &JournalError) -> String {
    match e {
        JournalError::Unreachable(_) => "unreachable".into(),
        other => {
            let s = other.to_string();
            s.chars().take(60).collect()
        }
    }
}

pub(crate) fn write_outcome_name(o: &WriteOutcome) -> &'static str {
    match o {
        WriteOutcome::Written { .. } => "duplicate",
        WriteOutcome::Refused { .. } => "refused",
        WriteOutcome::Truncated { .. } => "truncated",
        WriteOutcome::WrongMode { .. } => "wrong_mode",
        WriteOutcome::TooLarge { .. } => "too_large",
        WriteOutcome::UnknownJournal => "unknown_journal",
        WriteOutcome::Busy => "busy",
        WriteOutcome::NotLeader { .. } => "not_leader",
        WriteOutcome::Ambiguous => "ambiguous",
    }
}

/// Runs `step` on one thread per connection in `conns`, closed loop, until the window ends
/// or `stop` is set. `step` sends one write and returns the records acknowledged (or an
/// error's name, after which the writer pauses 100 ms).
pub(crate) fn closed_loop<C: Send>(
    conns: Vec<C>,
    warmup: Duration,
    duration: Duration,
    stop: &AtomicBool,
    step: impl Fn(&mut C) -> Result<u64, String> + Sync,
) -> (Clock, Vec<Tally>) {
    let barrier = Arc::new(Barrier::new(conns.len() + 1));
    let clock_cell: Arc<OnceLock<Clock>> = Arc::new(OnceLock::new());
    let step = &step;
    let tallies = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                let barrier = Arc::clone(&barrier);
                let clock_cell = Arc::clone(&clock_cell);
                std::thread::Builder::new()
                    .name(format!("jwriter-{i}"))
                    .stack_size(512 << 10)
                    .spawn_scoped(s, move || {
                        barrier.wait();
                        let clock = *clock_cell.get().expect("clock set before the barrier opens");
                        let mut t = Tally::default();
                        while !stop.load(Ordering::Relaxed) {
                            let sent = Instant::now();
                            if sent > clock.window_end {
                                break;
                            }
                            match step(&mut c) {
                                Ok(n) => t.ok(&clock, sent, Instant::now(), n),
                                Err(e) => {
                                    t.err(e);
                                    std::thread::sleep(Duration::from_millis(100));
                                }
                            }
                        }
                        t
                    })
                    .expect("spawn writer thread")
            })
            .collect();
        clock_cell.set(Clock::starting_now(warmup, duration)).expect("set once");
        barrier.wait();
        handles.into_iter().map(|h| h.join().expect("writer thread panicked")).collect::<Vec<_>>()
    });
    (*clock_cell.get().expect("set"), tallies)
}

/// Sums tallies into a run of `system` (its name in tables).
pub(crate) fn summarise(workload: String, system: &str, round: usize, clock: &Clock, tallies: &[Tally], stop: &AtomicBool) -> Run {
    let mut all = Tally::default();
    for t in tallies {
        all.merge(t);
    }
    let end = if stop.load(Ordering::Relaxed) { Instant::now().min(clock.window_end) } else { clock.window_end };
    let window = end.saturating_duration_since(clock.window_start).as_secs_f64();
    let per_sec = |x: u64| if window > 0.0 { x as f64 / window } else { 0.0 };
    Run {
        workload,
        system: system.into(),
        round,
        records_per_sec: per_sec(all.events_window),
        writes_per_sec: per_sec(all.requests_window),
        latency: Latency::from_histogram(&all.hist),
        records_acked_total: all.events_total,
        errors: all.errors,
        check: "-".into(),
        seen_before_ack: 0,
        failed: None,
        timeline_records: all.timeline,
    }
}

// ---------------------------------------------------------------------------------------
// Ours.

fn journals(addr: &str) -> Journals {
    Journals::new(JournalsConfig::new([addr.to_owned()]))
}

/// Creates `n` journals named `prefix-<i>` in [`TENANT`] through `j`.
pub(crate) fn create_journals(j: &mut Journals, prefix: &str, n: usize, mode: Mode, durability: StoreDurability) -> Result<Vec<JournalId>, String> {
    (0..n)
        .map(|i| match j.create(TENANT, &format!("{prefix}-{i}"), mode, durability) {
            Ok(CreateOutcome::Created { id }) => Ok(id),
            Ok(o) => Err(format!("create {prefix}-{i}: {o:?}")),
            Err(e) => Err(format!("create {prefix}-{i}: {e}")),
        })
        .collect()
}

/// A single-writer session that has won its journal (or shares the uuid of one that has).
pub(crate) struct Fenced {
    j: Journals,
    id: JournalId,
    leader: LeaderUuid,
    seq: u64,
}

impl Fenced {
    /// Wins `id` for a fresh leader uuid through `j` (a `SetLeader` with no previous leader).
    pub(crate) fn claim(mut j: Journals, id: JournalId) -> Result<Fenced, String> {
        let leader = fresh_leader();
        match j.set_leader(id, leader, None) {
            Ok(SetLeaderOutcome::Won { .. }) => Ok(Fenced { j, id, leader, seq: 0 }),
            Ok(o) => Err(format!("set-leader: {o:?}")),
            Err(e) => Err(format!("set-leader: {e}")),
        }
    }

    /// A second session under `self`'s uuid, talking through `j`: both write at the seq they
    /// believe next, so at most one of two racing writes is accepted.
    pub(crate) fn join(&self, j: Journals) -> Fenced {
        Fenced { j, id: self.id, leader: self.leader, seq: self.seq }
    }

    /// The journal it writes.
    pub(crate) fn id(&self) -> JournalId {
        self.id
    }

    /// One fenced write at the session's `next_seq`; `Ok((seq, count))`. A refusal moves
    /// the session to the journal's `next_seq` and is the error `refused`. An ambiguous
    /// write is settled as the client settles one (docs/journals.md §8.3: read back, identical
    /// re-sends): written is acknowledged, not written is `refused` (another writer under the
    /// same uuid holds the position, or the write is to be sent again), and one the budget
    /// could not settle is the error `ambiguous`. A duplicate answer (the identical write sent
    /// again after that) acknowledges it.
    pub(crate) fn write(&mut self, recs: &[Vec<u8>]) -> Result<(u64, u64), String> {
        match self.j.write_single(self.id, self.leader, self.seq, recs) {
            Ok(WriteOutcome::Written { seq, count, .. }) => {
                self.seq = seq + u64::from(count);
                Ok((seq, u64::from(count)))
            }
            Ok(WriteOutcome::Refused { state }) => {
                self.seq = state.next_seq;
                Err("refused".into())
            }
            Ok(WriteOutcome::Ambiguous) => match self.j.resolve(self.id, self.leader, self.seq, recs) {
                Resolution::Written { seq, count } => {
                    self.seq = seq + u64::from(count);
                    Ok((seq, u64::from(count)))
                }
                Resolution::NotWritten { state } | Resolution::Truncated { state } => {
                    self.seq = state.next_seq;
                    Err("refused".into())
                }
                Resolution::Unresolved => Err("ambiguous".into()),
            },
            Ok(o) => Err(write_outcome_name(&o).into()),
            Err(e) => Err(journal_error(&e)),
        }
    }
}

/// The records the journals of [`TENANT`] hold, as `j` lists them (the sum of
/// `next_seq - first_seq`).
pub(crate) fn ours_held(j: &mut Journals) -> Result<u64, String> {
    match j.list(Some(TENANT)) {
        Ok(ListOutcome::Listed(l)) => Ok(l.iter().map(|i| i.state.next_seq - i.state.first_seq).sum()),
        Ok(o) => Err(format!("list: {o:?}")),
        Err(e) => Err(format!("list: {e}")),
    }
}

fn run_ours(cfg: &JournalBenchConfig, w: Workload, round: usize, addr: &str, stop: &AtomicBool) -> Result<Run, String> {
    let label = w.label(cfg.writers);
    let mut run = match w {
        Workload::Single(batch) => {
            let ids = create_journals(&mut journals(addr), "single", cfg.writers, Mode::Single, cfg.durability)?;
            let sessions = ids.into_iter().map(|id| Fenced::claim(journals(addr), id)).collect::<Result<Vec<_>, _>>()?;
            let recs = records(batch, cfg.record_size);
            let (clock, tallies) = closed_loop(sessions, cfg.warmup, cfg.duration, stop, |s| s.write(&recs).map(|(_, n)| n));
            summarise(label, System::Ours.name(), round, &clock, &tallies, stop)
        }
        Workload::Multi => {
            let id = create_journals(&mut journals(addr), "multi", 1, Mode::Multi, cfg.durability)?[0];
            let recs = records(1, cfg.record_size);
            let conns: Vec<Journals> = (0..cfg.writers).map(|_| journals(addr)).collect();
            let (clock, tallies) = closed_loop(conns, cfg.warmup, cfg.duration, stop, |j| match j.write_multi(id, &recs) {
                Ok(WriteOutcome::Written { count, .. }) => Ok(u64::from(count)),
                Ok(o) => Err(write_outcome_name(&o).into()),
                Err(e) => Err(journal_error(&e)),
            });
            summarise(label, System::Ours.name(), round, &clock, &tallies, stop)
        }
        Workload::Tail => {
            let id = create_journals(&mut journals(addr), "tail", 1, Mode::Single, cfg.durability)?[0];
            let session = Fenced::claim(journals(addr), id)?;
            tail_ours(cfg, label, round, addr, id, session, stop)?
        }
        Workload::Dcb => {
            let acfg = append::AppendConfig {
                addr: addr.to_owned(),
                connections: cfg.writers,
                inflight: 1,
                workload: WorkloadSpec { batch: 1, event_size: cfg.record_size, conditional: true },
                warmup: cfg.warmup,
                duration: cfg.duration,
                error_backoff: Duration::from_millis(100),
                executor_threads: 1,
            };
            let r = append::run(&acfg, append::ClientKind::Blocking.backend(), stop)?;
            return Ok(Run {
                workload: label,
                system: System::Ours.name().into(),
                round,
                records_per_sec: r.events_per_sec,
                writes_per_sec: r.requests_per_sec,
                latency: r.latency,
                records_acked_total: r.events_acked_total,
                errors: r.errors,
                check: "-".into(),
                seen_before_ack: 0,
                failed: None,
                timeline_records: r.timeline_events,
            });
        }
    };
    let held = ours_held(&mut journals(addr))?;
    run.check = if held == run.records_acked_total { "held = acked".into() } else { format!("MISMATCH held {held} acked {}", run.records_acked_total) };
    Ok(run)
}

/// Delays from ack to seen, µs, and how many were seen before their ack.
fn tail_delays(acks: &BTreeMap<u64, Instant>, seen: &BTreeMap<u64, Instant>, clock: &Clock) -> (hdrhistogram::Histogram<u64>, u64) {
    let mut h = metrics::latency_histogram();
    let mut before = 0;
    for (seq, ack) in acks {
        if !clock.in_window(*ack) {
            continue;
        }
        if let Some(s) = seen.get(seq) {
            if s < ack {
                before += 1;
            }
            metrics::record_us(&mut h, s.saturating_duration_since(*ack).as_micros() as u64);
        }
    }
    (h, before)
}

fn tail_ours(cfg: &JournalBenchConfig, label: String, round: usize, addr: &str, id: JournalId, session: Fenced, stop: &AtomicBool) -> Result<Run, String> {
    let acks: Mutex<BTreeMap<u64, Instant>> = Mutex::new(BTreeMap::new());
    let done = AtomicBool::new(false);
    let recs = records(1, cfg.record_size);
    let mut reader = journals(addr);
    let (clock, tallies, seen) = std::thread::scope(|s| {
        let done = &done;
        let r = s.spawn(move || {
            let mut seen = BTreeMap::new();
            let mut from = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let Ok(ReadOutcome::Page { from: f, records, .. }) = reader.read(id, from, 0, 200) {
                    let now = Instant::now();
                    for k in 0..records.len() as u64 {
                        seen.insert(f + k, now);
                    }
                    from = f + records.len() as u64;
                }
            }
            seen
        });
        let (clock, tallies) = closed_loop(vec![session], cfg.warmup, cfg.duration, stop, |s| {
            let (seq, n) = s.write(&recs)?;
            acks.lock().expect("acks").insert(seq, Instant::now());
            Ok(n)
        });
        done.store(true, Ordering::Relaxed);
        (clock, tallies, r.join().expect("reader thread panicked"))
    });
    let mut run = summarise(label, System::Ours.name(), round, &clock, &tallies, stop);
    let (h, before) = tail_delays(&acks.lock().expect("acks"), &seen, &clock);
    run.latency = Latency::from_histogram(&h);
    run.seen_before_ack = before;
    Ok(run)
}

// ---------------------------------------------------------------------------------------
// etcd.

/// A fenced etcd writer: `txn(if mod_revision(<prefix>head) == rev then put records and head
/// else get head)`.
pub(crate) struct EtcdFenced {
    http: Http,
    prefix: String,
    rev: i64,
    seq: u64,
}

impl EtcdFenced {
    /// A writer of the keys under `prefix`, on a new connection to `addr`.
    pub(crate) fn new(addr: std::net::SocketAddr, prefix: String) -> Result<EtcdFenced, String> {
        Ok(EtcdFenced { http: Http::connect(addr).map_err(|e| format!("connect etcd: {e}"))?, prefix, rev: 0, seq: 0 })
    }

    /// The key prefix it writes under.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Bounds how long a request waits for etcd's answer (none by default).
    pub(crate) fn set_timeout(&self, limit: Duration) -> Result<(), String> {
        self.http.set_timeout(Some(limit)).map_err(|e| format!("set timeout: {e}"))
    }

    /// One fenced write of `batch` records (each `value_b64`); `Ok((seq, count))`. When the
    /// head moved under it (another writer of the same prefix), the writer takes the head's
    /// revision and seq from the txn's failure branch and the error is `refused`.
    pub(crate) fn write(&mut self, batch: usize, value_b64: &str) -> Result<(u64, u64), String> {
        let mut body = String::with_capacity(batch * (value_b64.len() + 80) + 256);
        let head = b64(format!("{}head", self.prefix).as_bytes());
        body.push_str(&format!(r#"{{"compare":[{{"target":"MOD","key":"{head}","result":"EQUAL","mod_revision":"{}"}}],"success":["#, self.rev));
        for k in 0..batch as u64 {
            let key = b64(format!("{}r/{:016x}", self.prefix, self.seq + k).as_bytes());
            body.push_str(&format!(r#"{{"request_put":{{"key":"{key}","value":"{value_b64}"}}}},"#));
        }
        let next = b64((self.seq + batch as u64).to_string().as_bytes());
        body.push_str(&format!(r#"{{"request_put":{{"key":"{head}","value":"{next}"}}}}],"failure":[{{"request_range":{{"key":"{head}"}}}}]}}"#));
        let v = self.http.post_json("/v3/kv/txn", &body)?;
        if v.get("succeeded").and_then(|s| s.as_bool()) != Some(true) {
            let kv = v.pointer("/responses/0/response_range/kvs/0").ok_or("txn failed")?;
            self.rev = kv.get("mod_revision").and_then(|r| r.as_str()).and_then(|r| r.parse().ok()).ok_or("txn failed: no mod_revision")?;
            let value = kv.get("value").and_then(|x| x.as_str()).and_then(unb64).unwrap_or_default();
            self.seq = std::str::from_utf8(&value).ok().and_then(|x| x.parse().ok()).ok_or("txn failed: head is no seq")?;
            return Err("refused".into());
        }
        let rev = v.pointer("/header/revision").and_then(|r| r.as_str()).and_then(|r| r.parse().ok()).ok_or("txn: no revision")?;
        self.rev = rev;
        let seq = self.seq;
        self.seq += batch as u64;
        Ok((seq, batch as u64))
    }
}

/// The first word of an error (`io`, `http 503`...), for the error counts.
pub(crate) fn io_name(e: String) -> String {
    e.split(':').next().unwrap_or("error").to_owned()
}

fn run_etcd(cfg: &JournalBenchConfig, w: Workload, round: usize, addr: std::net::SocketAddr, stop: &AtomicBool) -> Result<Run, String> {
    let label = w.label(cfg.writers);
    let value = b64(&vec![b'x'; cfg.record_size]);
    match w {
        Workload::Single(batch) => {
            let ws = (0..cfg.writers).map(|i| EtcdFenced::new(addr, format!("j{i}/"))).collect::<Result<Vec<_>, _>>()?;
            let (clock, tallies) = closed_loop(ws, cfg.warmup, cfg.duration, stop, |w| w.write(batch, &value).map(|(_, n)| n).map_err(io_name));
            Ok(summarise(label, System::Etcd.name(), round, &clock, &tallies, stop))
        }
        Workload::Multi => {
            let conns =
                (0..cfg.writers).map(|i| Http::connect(addr).map(|h| (h, i, 0u64)).map_err(|e| format!("connect etcd: {e}"))).collect::<Result<Vec<_>, _>>()?;
            let (clock, tallies) = closed_loop(conns, cfg.warmup, cfg.duration, stop, |(h, i, n)| {
                let key = b64(format!("m/{i}/{n:016x}").as_bytes());
                *n += 1;
                h.post_json("/v3/kv/put", &format!(r#"{{"key":"{key}","value":"{value}"}}"#)).map(|_| 1).map_err(io_name)
            });
            Ok(summarise(label, System::Etcd.name(), round, &clock, &tallies, stop))
        }
        Workload::Tail => {
            let writer = EtcdFenced::new(addr, "t/".into())?;
            let mut watcher = Http::connect(addr).map_err(|e| format!("connect etcd: {e}"))?;
            let socket = watcher.socket().map_err(|e| format!("watch socket: {e}"))?;
            let acks: Mutex<BTreeMap<u64, Instant>> = Mutex::new(BTreeMap::new());
            let (clock, tallies, seen) = std::thread::scope(|s| {
                let r = s.spawn(move || {
                    let mut seen = BTreeMap::new();
                    let _ = watcher.watch(b"t/r/", b"t/r0", |m| {
                        let now = Instant::now();
                        for e in m.pointer("/result/events").and_then(|e| e.as_array()).into_iter().flatten() {
                            let key = e.pointer("/kv/key").and_then(|k| k.as_str()).and_then(unb64).unwrap_or_default();
                            if let Some(seq) = std::str::from_utf8(&key).ok().and_then(|k| k.strip_prefix("t/r/")).and_then(|h| u64::from_str_radix(h, 16).ok())
                            {
                                seen.insert(seq, now);
                            }
                        }
                        true
                    });
                    seen
                });
                // Give the watch a moment to be created before the first write.
                std::thread::sleep(Duration::from_millis(200));
                let (clock, tallies) = closed_loop(vec![writer], cfg.warmup, cfg.duration, stop, |w| {
                    let (seq, n) = w.write(1, &value).map_err(io_name)?;
                    acks.lock().expect("acks").insert(seq, Instant::now());
                    Ok(n)
                });
                // Let the last events arrive, then end the watch.
                std::thread::sleep(Duration::from_millis(200));
                let _ = socket.shutdown(std::net::Shutdown::Both);
                (clock, tallies, r.join().expect("watch thread panicked"))
            });
            let mut run = summarise(label, System::Etcd.name(), round, &clock, &tallies, stop);
            let (h, before) = tail_delays(&acks.lock().expect("acks"), &seen, &clock);
            run.latency = Latency::from_histogram(&h);
            run.seen_before_ack = before;
            Ok(run)
        }
        Workload::Dcb => Err("not an etcd workload".into()),
    }
}

// ---------------------------------------------------------------------------------------
// The rounds.

impl Run {
    /// A run of `workload` on `system` that measured nothing: `why`.
    pub fn failed(workload: String, system: &str, round: usize, why: String) -> Run {
        Run {
            workload,
            system: system.into(),
            round,
            records_per_sec: 0.0,
            writes_per_sec: 0.0,
            latency: None,
            records_acked_total: 0,
            errors: ErrorCounts::new(),
            check: "-".into(),
            seen_before_ack: 0,
            failed: Some(why),
            timeline_records: Vec::new(),
        }
    }

    /// Prints the run's line on stderr (progress while the rounds go on).
    pub fn progress(&self) {
        eprintln!(
            "  round {} {:<10} {:<58} {:>12} records/s  p50 {:>9}  p99 {:>9}  {}{}",
            self.round,
            self.system,
            self.workload,
            thousands(self.records_per_sec),
            self.latency.map_or("-".into(), |l| fmt_us(l.p50_us)),
            self.latency.map_or("-".into(), |l| fmt_us(l.p99_us)),
            self.check,
            self.failed.as_deref().map(|f| format!(" FAILED: {f}")).unwrap_or_default()
        );
    }
}

fn one_run(cfg: &JournalBenchConfig, w: Workload, system: System, round: usize, stop: &AtomicBool) -> Run {
    let tag = match w {
        Workload::Single(b) => format!("single{b}"),
        Workload::Multi => "multi".into(),
        Workload::Tail => "tail".into(),
        Workload::Dcb => "dcb".into(),
    };
    let data = cfg.dir.join(format!("{}-{tag}-r{round}", system.name()));
    let _ = std::fs::remove_dir_all(&data);
    let log = cfg.out.join("logs").join(format!("{}-{tag}-r{round}.log", system.name()));
    let result = match system {
        System::Ours => {
            let spec = ServerSpec { binary: cfg.ours.clone(), data_dir: data.clone(), env: vec![], log_file: log };
            match ServerProcess::start(&spec) {
                Ok(mut server) => {
                    let r = run_ours(cfg, w, round, &server.addr.to_string(), stop);
                    server.stop();
                    r
                }
                Err(e) => Err(e),
            }
        }
        System::Etcd => match cfg.etcd.as_deref().map(|bin| EtcdProcess::start(bin, &data, &log)) {
            Some(Ok(mut etcd)) => {
                let r = run_etcd(cfg, w, round, etcd.addr, stop);
                etcd.stop();
                r
            }
            Some(Err(e)) => Err(e),
            None => Err("no etcd".into()),
        },
    };
    let _ = std::fs::remove_dir_all(&data);
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    let run = result.unwrap_or_else(|e| Run::failed(w.label(cfg.writers), system.name(), round, e));
    run.progress();
    run
}

/// Runs every round and writes `journal.md` and `journal.json` into `cfg.out`.
///
/// # Errors
/// `cfg.out` or `cfg.dir` cannot be created or written.
pub fn run(cfg: &JournalBenchConfig, stop: &AtomicBool) -> Result<JournalReport, String> {
    std::fs::create_dir_all(cfg.out.join("logs")).map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    std::fs::create_dir_all(&cfg.dir).map_err(|e| format!("{}: {e}", cfg.dir.display()))?;
    let workloads = cfg.workloads();
    let mut runs = Vec::new();
    'rounds: for round in 1..=cfg.rounds {
        for (i, &w) in workloads.iter().enumerate() {
            let mut systems = vec![System::Ours];
            if cfg.etcd.is_some() && w.on_etcd() {
                systems.push(System::Etcd);
                if (round + i) % 2 == 0 {
                    systems.reverse();
                }
            }
            for system in systems {
                if stop.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                runs.push(one_run(cfg, w, system, round, stop));
                std::thread::sleep(cfg.settle);
            }
        }
    }
    let mut report = JournalReport {
        writers: cfg.writers,
        record_size: cfg.record_size,
        rounds: cfg.rounds,
        warmup_seconds: cfg.warmup.as_secs_f64(),
        duration_seconds: cfg.duration.as_secs_f64(),
        store_durability: format!("{:?}", cfg.durability).to_lowercase(),
        etcd: cfg.etcd.as_ref().map(|p| p.display().to_string()),
        medians: medians(&runs),
        runs,
        table: String::new(),
        interrupted: stop.load(Ordering::Relaxed),
    };
    report.table = render(cfg, &report);
    std::fs::write(cfg.out.join("journal.md"), &report.table).map_err(|e| format!("write journal.md: {e}"))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| format!("json: {e}"))?;
    std::fs::write(cfg.out.join("journal.json"), json).map_err(|e| format!("write journal.json: {e}"))?;
    Ok(report)
}

pub(crate) fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn median_u(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Medians over the successful runs, by workload and system.
pub fn medians(runs: &[Run]) -> BTreeMap<String, BTreeMap<String, Median>> {
    let mut groups: BTreeMap<(String, String), Vec<&Run>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.failed.is_none() && r.latency.is_some()) {
        groups.entry((r.workload.clone(), r.system.clone())).or_default().push(r);
    }
    let mut out: BTreeMap<String, BTreeMap<String, Median>> = BTreeMap::new();
    for ((w, s), rs) in groups {
        let m = Median {
            records_per_sec: median_f(rs.iter().map(|r| r.records_per_sec).collect()),
            p50_us: median_u(rs.iter().filter_map(|r| r.latency.map(|l| l.p50_us)).collect()),
            p99_us: median_u(rs.iter().filter_map(|r| r.latency.map(|l| l.p99_us)).collect()),
            runs: rs.len(),
        };
        out.entry(w).or_default().insert(s, m);
    }
    out
}

/// The markdown table of medians, the targets, and every run.
pub fn render(cfg: &JournalBenchConfig, r: &JournalReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Journals vs etcd\n\n{} rounds × {} s after {} s of warm-up per run, medians over rounds; {} writers, {}-byte records, store durability `{}`; etcd: {}.\n",
        r.rounds,
        r.duration_seconds,
        r.warmup_seconds,
        r.writers,
        r.record_size,
        r.store_durability,
        r.etcd.as_deref().unwrap_or("not run")
    );
    let _ = writeln!(s, "| workload | ours records/s | etcd records/s | ratio | ours p50 | etcd p50 | ours p99 | etcd p99 | p99 ratio | target |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let get = |w: &str, sys: &str| r.medians.get(w).and_then(|m| m.get(sys)).cloned();
    let fmt_rate = |m: &Option<Median>| m.as_ref().map_or("-".into(), |m| thousands(m.records_per_sec));
    let fmt_p = |m: &Option<Median>, f: fn(&Median) -> u64| m.as_ref().map_or("-".into(), |m| fmt_us(f(m)));
    let dcb = get(&Workload::Dcb.label(r.writers), "ours");
    for w in cfg.workloads() {
        let label = w.label(r.writers);
        let (o, e) = (get(&label, "ours"), get(&label, "etcd"));
        let ratio = match (&o, &e) {
            (Some(o), Some(e)) if e.records_per_sec > 0.0 => Some(o.records_per_sec / e.records_per_sec),
            _ => None,
        };
        let p99_ratio = match (&o, &e) {
            (Some(o), Some(e)) if e.p99_us > 0 => Some(o.p99_us as f64 / e.p99_us as f64),
            _ => None,
        };
        let target = match w {
            Workload::Single(_) | Workload::Multi => match (ratio, p99_ratio) {
                (Some(x), Some(p)) => format!("≥ 5× and p99 ≤ 0.5×: {}", if x >= 5.0 && p <= 0.5 { "met" } else { "NOT met" }),
                _ => "≥ 5× and p99 ≤ 0.5×: no etcd".into(),
            },
            Workload::Tail => match &o {
                Some(o) => format!("ours p99 ≤ 1 ms: {}", if o.p99_us <= 1000 { "met" } else { "NOT met" }),
                None => "-".into(),
            },
            Workload::Dcb => "(the base of the 70% target)".into(),
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {target} |",
            fmt_rate(&o),
            fmt_rate(&e),
            ratio.map_or("-".into(), |x| format!("{x:.2}×")),
            fmt_p(&o, |m| m.p50_us),
            fmt_p(&e, |m| m.p50_us),
            fmt_p(&o, |m| m.p99_us),
            fmt_p(&e, |m| m.p99_us),
            p99_ratio.map_or("-".into(), |x| format!("{x:.2}×")),
        );
    }
    if let (Some(d), Some(one)) = (&dcb, get(&Workload::Single(1).label(r.writers), "ours")) {
        if d.records_per_sec > 0.0 {
            let pct = 100.0 * one.records_per_sec / d.records_per_sec;
            let _ = writeln!(
                s,
                "\nSingle-record fenced writes from {} writers: {:.0}% of our DCB server's {} × 1 conditional append rate in the same run (target ≥ 70%: {}).",
                r.writers,
                pct,
                r.writers,
                if pct >= 70.0 { "met" } else { "NOT met" }
            );
        }
    }
    let _ = writeln!(
        s,
        "\nThe tail row's p50/p99 are the delay from a write's ack (seen by its writer) to the reader holding the record (ours: a read waiting at the tail; etcd: a watch); its records/s is the one writer's rate, closed loop. A record the reader held before its writer saw the ack counts as 0 (etcd notifies its watchers before the writer's answer is back, so its p50 is often 0)."
    );
    let _ = writeln!(s, "\n## Every run\n\n| round | system | workload | records/s | writes/s | p50 | p99 | max | first s → last s | acked | check | seen before ack | errors |");
    let _ = writeln!(s, "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|");
    for run in &r.runs {
        let errors = if let Some(f) = &run.failed {
            format!("FAILED: {}", f.replace('\n', " ").replace('|', "/"))
        } else if run.errors.is_empty() {
            "-".into()
        } else {
            run.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {errors} |",
            run.round,
            run.system,
            run.workload,
            thousands(run.records_per_sec),
            thousands(run.writes_per_sec),
            run.latency.map_or("-".into(), |l| fmt_us(l.p50_us)),
            run.latency.map_or("-".into(), |l| fmt_us(l.p99_us)),
            run.latency.map_or("-".into(), |l| fmt_us(l.max_us)),
            drift(&run.timeline_records, r.warmup_seconds, r.duration_seconds).map_or("-".into(), |(a, b)| format!("{} → {}", thousands(a), thousands(b))),
            run.records_acked_total,
            run.check,
            if run.workload == Workload::Tail.label(r.writers) { run.seen_before_ack.to_string() } else { "-".into() },
        );
    }
    s
}

/// Records per second in the first and in the last full second of the window, from a
/// timeline of 100 ms buckets; `None` for a window under 2 s or a timeline that stops short.
pub fn drift(timeline: &[u64], warmup_seconds: f64, duration_seconds: f64) -> Option<(f64, f64)> {
    let per_s = (Duration::from_secs(1).as_millis() / append::TIMELINE_BUCKET.as_millis()) as usize;
    let first = (warmup_seconds * per_s as f64).ceil() as usize;
    let end = ((warmup_seconds + duration_seconds) * per_s as f64).floor() as usize;
    if duration_seconds < 2.0 || end > timeline.len() || end < first + 2 * per_s {
        return None;
    }
    let sum = |a: usize| timeline[a..a + per_s].iter().sum::<u64>() as f64;
    Some((sum(first), sum(end - per_s)))
}

/// True when `p` lies on a RAM-backed filesystem (tmpfs, ramfs), where a sync is nearly free.
pub fn on_tmpfs(p: &Path) -> bool {
    crate::machine::gather(p).is_ok_and(|m| m.fs.in_memory)
}
