//! `tephra-bench compare`: the same append matrix against our server and the reference
//! server, side by side.
//!
//! For every round and every matrix cell, each server is started fresh on a new data
//! directory under the same `--dir` (same disk), measured with [`crate::append`], asked
//! for its stats (the events it holds must equal the events acknowledged), stopped by
//! pid, and its data directory removed. The servers alternate A B A B so slow drift of a
//! noisy machine hits both alike; the summary quotes the **median** over rounds of each
//! figure, and the ratio ours / reference of those medians. With a read configuration,
//! every round ends with [`crate::read`] on each contender, again on a fresh server.

use crate::append::{self, AppendConfig, AppendReport, ClientKind};
use crate::chart::{self, ChartData, Series};
use crate::machine::MachineFacts;
use crate::metrics;
use crate::server::{ServerProcess, ServerSpec};
use crate::workload::WorkloadSpec;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// One matrix cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// Connections (writers).
    pub connections: usize,
    /// Events per append.
    pub batch: usize,
}

impl Cell {
    /// `16 × 512`.
    pub fn label(&self) -> String {
        format!("{} × {}", self.connections, self.batch)
    }
}

/// The seed's matrix: 16 writers × batch 1, 64, 512, and 64 writers × batch 512.
pub fn default_matrix() -> Vec<Cell> {
    vec![Cell { connections: 16, batch: 1 }, Cell { connections: 16, batch: 64 }, Cell { connections: 16, batch: 512 }, Cell { connections: 64, batch: 512 }]
}

/// Parses `16x1,16x64,64x512` (connections × batch; `x`, `X` or `×`).
///
/// # Errors
/// A malformed or zero entry.
pub fn parse_matrix(s: &str) -> Result<Vec<Cell>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let norm = part.replace('×', "x").to_ascii_lowercase();
        let (c, b) = norm.split_once('x').ok_or_else(|| format!("matrix entry {part:?} is not CONNECTIONSxBATCH"))?;
        let connections: usize = c.trim().parse().map_err(|_| format!("bad connection count in {part:?}"))?;
        let batch: usize = b.trim().parse().map_err(|_| format!("bad batch size in {part:?}"))?;
        if connections == 0 || batch == 0 || connections > 4096 || batch > 100_000 {
            return Err(format!("matrix entry {part:?} out of range (1..=4096 connections, 1..=100000 batch)"));
        }
        v.push(Cell { connections, batch });
    }
    if v.is_empty() {
        return Err("empty matrix".into());
    }
    Ok(v)
}

/// One side of the comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Contender {
    /// `ours` or `reference`.
    pub name: String,
    /// Its binary.
    pub binary: PathBuf,
}

/// Everything a comparison needs.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    /// A and B, in the order they run in every cell.
    pub contenders: Vec<Contender>,
    /// Scratch root for the data directories (one per run, removed after it).
    pub dir: PathBuf,
    /// Where `compare.json`, `compare.md`, `compare.svg` and the server logs go.
    pub out: PathBuf,
    /// The matrix.
    pub cells: Vec<Cell>,
    /// Rounds (each runs every cell on every contender once).
    pub rounds: usize,
    /// Warm-up per run.
    pub warmup: Duration,
    /// Measured window per run.
    pub duration: Duration,
    /// Payload bytes per event.
    pub event_size: usize,
    /// Guard every append with the never-firing `{tag, type}` condition.
    pub conditional: bool,
    /// Requests in flight per connection.
    pub inflight: usize,
    /// The load generator.
    pub client: ClientKind,
    /// Executor threads of the async generator.
    pub executor_threads: usize,
    /// `TEPHRA__SEGMENT__SIZE` for both servers.
    pub segment_size: u64,
    /// More `KEY=VALUE` environment for both servers.
    pub server_env: Vec<(String, String)>,
    /// Pause between runs (after the data directory is removed and synced).
    pub settle: Duration,
    /// Keep the data directories.
    pub keep_data: bool,
    /// Also run `tephra-bench read` on each contender every round (after the append
    /// cells), with these settings (`addr` is filled in per run).
    pub read: Option<crate::read::ReadConfig>,
}

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Contender name.
    pub server: String,
    /// Its version, from the Hello.
    pub server_version: String,
    /// 0-based round.
    pub round: usize,
    /// The cell.
    pub cell: Cell,
    /// The load generator's report.
    pub report: AppendReport,
    /// CPU seconds the server used over the run (warm-up and window).
    pub server_cpu_seconds: Option<f64>,
    /// `server_cpu_seconds` / run wall time.
    pub server_cpu_cores: Option<f64>,
    /// The server's `event_count` after the run.
    pub stored_events: Option<u64>,
    /// The server's exit code after SIGTERM (`None` = killed or unknown).
    pub exit_code: Option<i32>,
    /// The server's pid (it is stopped by the end of the run).
    pub server_pid: Option<u32>,
    /// Anything odd (stored ≠ acknowledged, errors, a failed start).
    pub notes: Vec<String>,
}

/// One read-side run on a fresh server.
#[derive(Debug, Clone, Serialize)]
pub struct ReadRun {
    /// Contender name.
    pub server: String,
    /// 0-based round.
    pub round: usize,
    /// The report, when the run worked.
    pub report: Option<crate::read::ReadReport>,
    /// The server's `event_count` after the run.
    pub stored_events: Option<u64>,
    /// What went wrong, if anything.
    pub notes: Vec<String>,
}

/// Medians over the rounds of one cell on one contender.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default)]
pub struct Summary {
    /// Runs that produced numbers.
    pub runs: usize,
    /// Median events/s.
    pub events_per_sec: f64,
    /// Median requests/s.
    pub requests_per_sec: f64,
    /// Median p50, ms.
    pub p50_ms: f64,
    /// Median p99, ms.
    pub p99_ms: f64,
    /// Median p99.9, ms.
    pub p999_ms: f64,
    /// Median server CPU (cores).
    pub server_cpu_cores: f64,
    /// Median load-generator CPU (cores).
    pub client_cpu_cores: f64,
    /// Failed requests over all its runs.
    pub errors: u64,
}

/// A cell's comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellResult {
    /// The cell.
    pub cell: Cell,
    /// Per contender, in [`CompareConfig::contenders`] order.
    pub summaries: Vec<(String, Summary)>,
    /// A's events/s over B's (medians).
    pub throughput_ratio: Option<f64>,
    /// A's p99 over B's (medians).
    pub p99_ratio: Option<f64>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// Seconds since the epoch when it started.
    pub started_unix: u64,
    /// Contenders.
    pub contenders: Vec<Contender>,
    /// Rounds asked for.
    pub rounds: usize,
    /// Warm-up, s.
    pub warmup_seconds: f64,
    /// Window, s.
    pub duration_seconds: f64,
    /// Payload bytes per event.
    pub event_size: usize,
    /// Conditional appends.
    pub conditional: bool,
    /// Requests in flight per connection.
    pub inflight: usize,
    /// The load generator's client.
    pub client: String,
    /// `TEPHRA__SEGMENT__SIZE`.
    pub segment_size: u64,
    /// Machine and storage facts of `--dir`.
    pub machine: Option<MachineFacts>,
    /// Load average and I/O pressure before the first run.
    pub contention_before: Option<crate::machine::Contention>,
    /// ... and after the last.
    pub contention_after: Option<crate::machine::Contention>,
    /// Every run, in execution order.
    pub runs: Vec<Run>,
    /// Per-cell medians and ratios.
    pub cells: Vec<CellResult>,
    /// Read-side runs (with `--read`), in execution order.
    pub read_runs: Vec<ReadRun>,
    /// True when SIGINT/SIGTERM cut it short.
    pub interrupted: bool,
    /// Wall time, s.
    pub wall_seconds: f64,
}

/// The median of `v` (0 when empty).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Summarises the runs of one contender on one cell.
pub fn summarize(runs: &[&Run]) -> Summary {
    let good: Vec<&&Run> = runs.iter().filter(|r| r.report.latency.is_some()).collect();
    let col = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = good.iter().map(|r| f(r)).collect();
        median(&mut v)
    };
    Summary {
        runs: good.len(),
        events_per_sec: col(&|r| r.report.events_per_sec),
        requests_per_sec: col(&|r| r.report.requests_per_sec),
        p50_ms: col(&|r| r.report.latency.map_or(0.0, |l| l.p50_us as f64 / 1e3)),
        p99_ms: col(&|r| r.report.latency.map_or(0.0, |l| l.p99_us as f64 / 1e3)),
        p999_ms: col(&|r| r.report.latency.map_or(0.0, |l| l.p999_us as f64 / 1e3)),
        server_cpu_cores: col(&|r| r.server_cpu_cores.unwrap_or(0.0)),
        client_cpu_cores: col(&|r| r.report.client_cpu_cores),
        errors: runs.iter().map(|r| r.report.errors.values().sum::<u64>()).sum(),
    }
}

fn summarize_cells(cfg_contenders: &[Contender], cells: &[Cell], runs: &[Run]) -> Vec<CellResult> {
    cells
        .iter()
        .map(|cell| {
            let summaries: Vec<(String, Summary)> = cfg_contenders
                .iter()
                .map(|c| {
                    let rs: Vec<&Run> = runs.iter().filter(|r| r.cell == *cell && r.server == c.name).collect();
                    (c.name.clone(), summarize(&rs))
                })
                .collect();
            let ratio = |f: fn(&Summary) -> f64| -> Option<f64> {
                let (a, b) = (summaries.first()?.1, summaries.get(1)?.1);
                (a.runs > 0 && b.runs > 0 && f(&b) > 0.0).then(|| f(&a) / f(&b))
            };
            CellResult { cell: *cell, throughput_ratio: ratio(|s| s.events_per_sec), p99_ratio: ratio(|s| s.p99_ms), summaries }
        })
        .collect()
}

/// The data directory `<dir>/<run>` (emptied first) and the spec of a `who` server on it,
/// logging to `<out>/logs/<run>.log`.
fn fresh_server(cfg: &CompareConfig, who: &Contender, run: &str) -> (PathBuf, ServerSpec) {
    let data = cfg.dir.join(run);
    let _ = std::fs::remove_dir_all(&data);
    let mut env = vec![("TEPHRA__SEGMENT__SIZE".to_owned(), cfg.segment_size.to_string())];
    env.extend(cfg.server_env.iter().cloned());
    let spec = ServerSpec { binary: who.binary.clone(), data_dir: data.clone(), env, log_file: cfg.out.join("logs").join(format!("{run}.log")) };
    (data, spec)
}

/// One fresh-server run. When the server cannot start, the run has no latency and its
/// `notes` say why.
fn one_run(cfg: &CompareConfig, who: &Contender, round: usize, cell: Cell, seq: usize, stop: &AtomicBool, progress: &mut dyn FnMut(&str)) -> Run {
    let (data, spec) = fresh_server(cfg, who, &format!("run-{seq:03}-{}-{}x{}", who.name, cell.connections, cell.batch));
    let mut notes = Vec::new();
    let acfg = AppendConfig {
        addr: String::new(),
        connections: cell.connections,
        inflight: cfg.inflight,
        workload: WorkloadSpec { batch: cell.batch, event_size: cfg.event_size, conditional: cfg.conditional },
        warmup: cfg.warmup,
        duration: cfg.duration,
        error_backoff: Duration::from_secs(1),
        executor_threads: cfg.executor_threads,
    };
    let empty = |notes: Vec<String>| Run {
        server: who.name.clone(),
        server_version: String::new(),
        round,
        cell,
        report: empty_report(&acfg, cfg.client),
        server_cpu_seconds: None,
        server_cpu_cores: None,
        stored_events: None,
        exit_code: None,
        server_pid: None,
        notes,
    };
    let mut server = match ServerProcess::start(&spec) {
        Ok(s) => s,
        Err(e) => {
            cleanup_data(cfg, &data);
            return empty(vec![format!("server did not start: {e}")]);
        }
    };
    let addr = server.addr.to_string();
    progress(&format!("{} pid {} listening on {addr}", who.name, server.pid));
    let version = tephra::client::Client::connect(addr.as_str()).map(|c| c.server_version().to_owned()).unwrap_or_default();
    let acfg = AppendConfig { addr: addr.clone(), ..acfg };
    let cpu0 = metrics::process_cpu_seconds(server.pid);
    let t0 = Instant::now();
    let result = append::run(&acfg, cfg.client.backend(), stop);
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = metrics::process_cpu_seconds(server.pid);
    let server_cpu = cpu0.zip(cpu1).map(|(a, b)| b - a);
    let stored = tephra::client::Client::connect(addr.as_str()).ok().and_then(|mut c| c.stats().ok()).map(|s| s.event_count);
    let exit_code = server.stop();
    cleanup_data(cfg, &data);
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!("load generator failed: {e}"));
            let mut r = empty(notes);
            r.server_version = version;
            r.server_pid = Some(server.pid);
            return r;
        }
    };
    if let Some(s) = stored {
        if s != report.events_acked_total {
            notes.push(format!("server holds {s} events but {} were acknowledged", report.events_acked_total));
        }
    }
    if !report.errors.is_empty() {
        notes.push(format!("errors: {:?}", report.errors));
    }
    if exit_code != Some(0) {
        notes.push(format!("server exit code after SIGTERM: {exit_code:?}"));
    }
    Run {
        server: who.name.clone(),
        server_version: version,
        round,
        cell,
        report,
        server_cpu_seconds: server_cpu,
        server_cpu_cores: server_cpu.map(|c| if wall > 0.0 { c / wall } else { 0.0 }),
        stored_events: stored,
        exit_code,
        server_pid: Some(server.pid),
        notes,
    }
}

/// One read-side run on a fresh server.
fn one_read_run(
    cfg: &CompareConfig,
    rcfg: &crate::read::ReadConfig,
    who: &Contender,
    round: usize,
    seq: usize,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> ReadRun {
    let (data, spec) = fresh_server(cfg, who, &format!("run-{seq:03}-{}-read", who.name));
    let mut run = ReadRun { server: who.name.clone(), round, report: None, stored_events: None, notes: Vec::new() };
    let mut server = match ServerProcess::start(&spec) {
        Ok(s) => s,
        Err(e) => {
            cleanup_data(cfg, &data);
            run.notes.push(format!("server did not start: {e}"));
            return run;
        }
    };
    let addr = server.addr.to_string();
    progress(&format!("{} pid {} listening on {addr}", who.name, server.pid));
    let rcfg = crate::read::ReadConfig { addr: addr.clone(), ..rcfg.clone() };
    match crate::read::run(&rcfg, stop) {
        Ok(r) => run.report = Some(r),
        Err(e) => run.notes.push(format!("read benchmark failed: {e}")),
    }
    run.stored_events = tephra::client::Client::connect(addr.as_str()).ok().and_then(|mut c| c.stats().ok()).map(|s| s.event_count);
    if let (Some(s), Some(r)) = (run.stored_events, &run.report) {
        if s != r.events_appended {
            run.notes.push(format!("server holds {s} events but {} were appended", r.events_appended));
        }
    }
    let exit = server.stop();
    if exit != Some(0) {
        run.notes.push(format!("server exit code after SIGTERM: {exit:?}"));
    }
    cleanup_data(cfg, &data);
    run
}

fn empty_report(acfg: &AppendConfig, client: ClientKind) -> AppendReport {
    AppendReport {
        client: client.backend().name().into(),
        connections: acfg.connections,
        inflight: acfg.inflight,
        batch: acfg.workload.batch,
        event_size: acfg.workload.event_size,
        conditional: acfg.workload.conditional,
        warmup_seconds: acfg.warmup.as_secs_f64(),
        window_seconds: 0.0,
        events: 0,
        requests: 0,
        events_per_sec: 0.0,
        requests_per_sec: 0.0,
        payload_mb_per_sec: 0.0,
        latency: None,
        events_acked_total: 0,
        requests_acked_total: 0,
        errors: Default::default(),
        client_cpu_seconds: 0.0,
        client_cpu_cores: 0.0,
        interrupted: false,
        timeline_events: Vec::new(),
        longest_stall_ms: 0,
    }
}

fn cleanup_data(cfg: &CompareConfig, data: &Path) {
    if !cfg.keep_data {
        let _ = std::fs::remove_dir_all(data);
        // Let the filesystem finish freeing the old segments before the next run.
        // SAFETY: sync(2) has no preconditions.
        unsafe { libc::sync() };
    }
    std::thread::sleep(cfg.settle);
}

/// Runs the comparison. `progress` gets one line of text before each run and once its
/// server is up (with the server's pid).
pub fn run(cfg: &CompareConfig, stop: &AtomicBool, progress: &mut dyn FnMut(&str)) -> CompareReport {
    let started = Instant::now();
    let machine = crate::machine::gather(&cfg.dir).ok();
    let contention_before = Some(crate::machine::contention());
    let per_round = (cfg.cells.len() + usize::from(cfg.read.is_some())) * cfg.contenders.len();
    let total = cfg.rounds * per_round;
    let mut runs = Vec::new();
    let mut read_runs = Vec::new();
    let mut seq = 0;
    'outer: for round in 0..cfg.rounds {
        for cell in &cfg.cells {
            for who in &cfg.contenders {
                if crate::signals::stopped() || stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break 'outer;
                }
                seq += 1;
                progress(&format!("[{seq}/{total}] round {} · {} · {}", round + 1, cell.label(), who.name));
                let r = one_run(cfg, who, round, *cell, seq, stop, progress);
                if let Some(l) = r.report.latency {
                    progress(&format!(
                        "    {} events/s, p50 {} p99 {}",
                        crate::report::thousands(r.report.events_per_sec),
                        crate::append::fmt_us(l.p50_us),
                        crate::append::fmt_us(l.p99_us)
                    ));
                } else {
                    progress(&format!("    no result: {}", r.notes.join("; ")));
                }
                runs.push(r);
            }
        }
        if let Some(rcfg) = &cfg.read {
            for who in &cfg.contenders {
                if crate::signals::stopped() || stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break 'outer;
                }
                seq += 1;
                progress(&format!("[{seq}/{total}] round {} · read · {}", round + 1, who.name));
                let r = one_read_run(cfg, rcfg, who, round, seq, stop, progress);
                match &r.report {
                    Some(rep) => progress(&format!("    {}", crate::read::render(rep).trim_end().replace('\n', "\n    "))),
                    None => progress(&format!("    no result: {}", r.notes.join("; "))),
                }
                read_runs.push(r);
            }
        }
    }
    let interrupted = stop.load(std::sync::atomic::Ordering::Relaxed);
    let cells = summarize_cells(&cfg.contenders, &cfg.cells, &runs);
    CompareReport {
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            .saturating_sub(started.elapsed().as_secs()),
        contenders: cfg.contenders.clone(),
        rounds: cfg.rounds,
        warmup_seconds: cfg.warmup.as_secs_f64(),
        duration_seconds: cfg.duration.as_secs_f64(),
        event_size: cfg.event_size,
        conditional: cfg.conditional,
        inflight: cfg.inflight,
        client: cfg.client.backend().name().into(),
        segment_size: cfg.segment_size,
        machine,
        contention_before,
        contention_after: Some(crate::machine::contention()),
        runs,
        cells,
        read_runs,
        interrupted,
        wall_seconds: started.elapsed().as_secs_f64(),
    }
}

fn ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0} ms")
    } else if x >= 10.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.2} ms")
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The markdown: the medians table, then every run.
pub fn render_markdown(r: &CompareReport) -> String {
    let names: Vec<&str> = r.contenders.iter().map(|c| c.name.as_str()).collect();
    let (a, b) = (names.first().copied().unwrap_or("A"), names.get(1).copied().unwrap_or("B"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} B events, {}, {} in flight per connection ({} client); {} round(s) of {:.0} s measured after {:.0} s warm-up; segment size {} MiB; medians over rounds.{}\n",
        r.event_size,
        if r.conditional { "every append guarded by a never-firing one-tag-one-type condition" } else { "unconditional appends" },
        r.inflight,
        r.client,
        r.rounds,
        r.duration_seconds,
        r.warmup_seconds,
        r.segment_size >> 20,
        if r.interrupted { " **INTERRUPTED: partial results.**" } else { "" }
    );
    let _ = writeln!(
        s,
        "| connections × batch | {a} events/s | {b} events/s | {a}/{b} | {a} p50 | {b} p50 | {a} p99 | {b} p99 | {a} p99.9 | {b} p99.9 | {a} server CPU | {b} server CPU |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in &r.cells {
        let x = c.summaries.first().map(|p| p.1).unwrap_or_default();
        let y = c.summaries.get(1).map(|p| p.1).unwrap_or_default();
        let cell = |s: &Summary, f: &dyn Fn(&Summary) -> String| {
            if s.runs == 0 {
                "–".to_owned()
            } else {
                f(s)
            }
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.cell.label(),
            cell(&x, &|s| crate::report::thousands(s.events_per_sec)),
            cell(&y, &|s| crate::report::thousands(s.events_per_sec)),
            ratio(c.throughput_ratio),
            cell(&x, &|s| ms(s.p50_ms)),
            cell(&y, &|s| ms(s.p50_ms)),
            cell(&x, &|s| ms(s.p99_ms)),
            cell(&y, &|s| ms(s.p99_ms)),
            cell(&x, &|s| ms(s.p999_ms)),
            cell(&y, &|s| ms(s.p999_ms)),
            cell(&x, &|s| format!("{:.2}", s.server_cpu_cores)),
            cell(&y, &|s| format!("{:.2}", s.server_cpu_cores)),
        );
    }
    let _ = writeln!(s, "\nEvery run, in the order it ran:\n");
    let _ = writeln!(
        s,
        "| # | round | cell | server | events/s | p50 | p99 | p99.9 | max | longest stall | server CPU | client CPU | stored = acked | errors / notes |"
    );
    let _ = writeln!(s, "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    for (i, run) in r.runs.iter().enumerate() {
        let l = run.report.latency;
        let f = |v: Option<u64>| v.map_or("–".into(), |us| ms(us as f64 / 1e3));
        let ok = match run.stored_events {
            Some(s) if s == run.report.events_acked_total => format!("yes ({s})"),
            Some(s) => format!("NO ({s} vs {})", run.report.events_acked_total),
            None => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
            i + 1,
            run.round + 1,
            run.cell.label(),
            run.server,
            run.server_version,
            crate::report::thousands(run.report.events_per_sec),
            f(l.map(|l| l.p50_us)),
            f(l.map(|l| l.p99_us)),
            f(l.map(|l| l.p999_us)),
            f(l.map(|l| l.max_us)),
            if run.report.longest_stall_ms > 0 { format!("{} ms", run.report.longest_stall_ms) } else { "–".into() },
            run.server_cpu_cores.map_or("–".into(), |c| format!("{c:.2}")),
            run.report.client_cpu_cores,
            ok,
            run.notes.join("; ")
        );
    }
    if !r.read_runs.is_empty() {
        render_read_markdown(&mut s, r);
    }
    if let Some(m) = &r.machine {
        let _ = writeln!(
            s,
            "\nMachine: {} · {} CPUs online · {} on {} ({}) · device {}",
            m.kernel,
            m.cpus_online,
            m.fs.mount_fstype.as_deref().unwrap_or(&m.fs.magic_name),
            m.fs.mount_source.as_deref().unwrap_or("?"),
            m.dir,
            m.device
                .as_ref()
                .map(|d| format!(
                    "{} (write cache: {}, rotational: {})",
                    d.name,
                    d.write_cache.as_deref().unwrap_or("?"),
                    d.rotational.map_or("?".into(), |x| x.to_string())
                ))
                .unwrap_or_else(|| "unknown".into())
        );
    }
    if let (Some(b), Some(a)) = (&r.contention_before, &r.contention_after) {
        let _ = writeln!(
            s,
            "Load average before / after: {:.2} / {:.2}; I/O pressure (some, avg10) before / after: {} / {}.",
            b.loadavg_1m.unwrap_or(f64::NAN),
            a.loadavg_1m.unwrap_or(f64::NAN),
            b.io_pressure_some_avg10.map_or("?".into(), |x| format!("{x:.1}%")),
            a.io_pressure_some_avg10.map_or("?".into(), |x| format!("{x:.1}%")),
        );
    }
    s
}

/// The read-side table: per contender, medians over rounds, then every run.
fn render_read_markdown(s: &mut String, r: &CompareReport) {
    let us = |x: f64| crate::append::fmt_us(x.round() as u64);
    let _ = writeln!(s, "\nRead side (`tephra-bench read` on a fresh server each round; medians over rounds):\n");
    let _ = writeln!(
        s,
        "| server | log events | full scan events/s | scan MB/s | selective read p50 | selective read p99 | reads/s | fan-out lag p50 | lag p99 | lag p99.9 |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in &r.contenders {
        let reps: Vec<&crate::read::ReadReport> = r.read_runs.iter().filter(|x| x.server == c.name).filter_map(|x| x.report.as_ref()).collect();
        if reps.is_empty() {
            let _ = writeln!(s, "| {} | – | – | – | – | – | – | – | – | – |", c.name);
            continue;
        }
        let med = |f: &dyn Fn(&crate::read::ReadReport) -> Option<f64>| {
            let mut v: Vec<f64> = reps.iter().filter_map(|x| f(x)).collect();
            if v.is_empty() {
                None
            } else {
                Some(median(&mut v))
            }
        };
        let show = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("–".to_owned(), f);
        // One percentile of the selective reads' latency, or of the fan-out lag.
        type Pick = fn(&crate::metrics::Latency) -> u64;
        let selective = |pick: Pick| show(med(&|x| x.selective.as_ref().and_then(|se| se.latency.as_ref()).map(|l| pick(l) as f64)), &us);
        let lag = |pick: Pick| show(med(&|x| x.fanout.as_ref().and_then(|f| f.lag.as_ref()).map(|l| pick(l) as f64)), &us);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.name,
            show(med(&|x| x.scan.as_ref().map(|sc| sc.events as f64)), &|v| { crate::report::thousands(v) }),
            show(med(&|x| x.scan.as_ref().map(|sc| sc.events_per_sec_median)), &|v| crate::report::thousands(v)),
            show(med(&|x| x.scan.as_ref().map(|sc| sc.mb_per_sec_median)), &|v| format!("{v:.0}")),
            selective(|l| l.p50_us),
            selective(|l| l.p99_us),
            show(med(&|x| x.selective.as_ref().map(|se| se.reads_per_sec)), &|v| crate::report::thousands(v)),
            lag(|l| l.p50_us),
            lag(|l| l.p99_us),
            lag(|l| l.p999_us),
        );
    }
    let notes: Vec<String> =
        r.read_runs.iter().filter(|x| !x.notes.is_empty()).map(|x| format!("round {} {}: {}", x.round + 1, x.server, x.notes.join("; "))).collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\nRead-side notes: {}", notes.join(" · "));
    }
}

/// The chart data of a report.
pub fn chart_data(r: &CompareReport) -> ChartData {
    let series = |f: fn(&Summary) -> f64| -> Vec<Series> {
        r.contenders
            .iter()
            .enumerate()
            .map(|(k, c)| Series {
                name: format!("{} {}", c.name, r.runs.iter().find(|x| x.server == c.name).map(|x| x.server_version.as_str()).unwrap_or("")),
                values: r.cells.iter().map(|cell| cell.summaries.get(k).and_then(|(_, s)| (s.runs > 0).then(|| f(s)))).collect(),
            })
            .collect()
    };
    ChartData {
        title: format!(
            "{} B {} appends, medians of {} round(s) × {:.0} s",
            r.event_size,
            if r.conditional { "conditional" } else { "unconditional" },
            r.rounds,
            r.duration_seconds
        ),
        categories: r.cells.iter().map(|c| c.cell.label()).collect(),
        throughput: series(|s| s.events_per_sec),
        p99_ms: series(|s| s.p99_ms),
    }
}

/// Writes `compare.json`, `compare.md` and `compare.svg` into `out`; returns their paths.
///
/// # Errors
/// Creating or writing a file fails.
pub fn write_outputs(r: &CompareReport, out: &Path) -> Result<Vec<PathBuf>, String> {
    let (json, md) = crate::report::write_json_and_markdown(r, render_markdown(r), out, "compare")?;
    let svg = out.join("compare.svg");
    chart::write_svg(&chart_data(r), &svg)?;
    Ok(vec![json, md, svg])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_parses() {
        assert_eq!(
            parse_matrix("16x1, 64X512,2×3").unwrap(),
            vec![Cell { connections: 16, batch: 1 }, Cell { connections: 64, batch: 512 }, Cell { connections: 2, batch: 3 },]
        );
        assert!(parse_matrix("16").is_err());
        assert!(parse_matrix("0x1").is_err());
        assert!(parse_matrix("").is_err());
        assert_eq!(default_matrix().len(), 4);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
