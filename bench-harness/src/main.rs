//! `tephra-bench` binary: parses the command line and dispatches to the subcommands.

use clap::Parser;

// mimalloc: per-thread free lists without glibc's arena locking and consolidation passes
// (measured with perf at 16 connections x batch 64: glibc malloc/free were ~9% of all CPU in
// the load generator and ~2% in the server's writer).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::io::{IsTerminal, Write};
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tephra_bench::cli::{
    AppendArgs, Cli, ClusterArgs, Command, CompareArgs, FsyncArgs, IndexCommand, IndexPrepareArgs, IndexRunArgs, JournalArgs, ReadArgs, RunArgs, RunDefaults,
    RunPlan, CLUSTER_RUN, COMPARE_RUN, EXIT_ROW_FAILED, EXIT_USAGE, JOURNAL_RUN,
};
use tephra_bench::fsync::{self, Budget, ProbeConfig};
use tephra_bench::{append, cluster, compare, etcd, journal, logcapture, machine, read, report, server, signals, workload};

/// How a subcommand ends: `Ok` with the exit code of a run that went its course, `Err` with
/// the exit code of one that stopped early (the reason is on stderr by then).
type Exit = Result<i32, i32>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Fsync(args) => run_fsync(args),
        Command::Append(args) => run_append(args),
        Command::Read(args) => run_read(args),
        Command::Compare(args) => run_compare(args),
        Command::Index(args) => match args.command {
            IndexCommand::Prepare(a) => run_index_prepare(a),
            IndexCommand::Run(a) => run_index_run(a),
        },
        Command::Journal(args) => run_journal(args),
        Command::Cluster(args) => run_cluster(args),
    }
    .unwrap_or_else(|code| code);
    ExitCode::from(code as u8)
}

/// Prints `msg` as `cmd`'s error on stderr; [`EXIT_USAGE`].
fn usage(cmd: &str, msg: impl std::fmt::Display) -> i32 {
    eprintln!("tephra-bench {cmd}: error: {msg}");
    EXIT_USAGE
}

/// Prints `e` as the error that ended `cmd`'s run; [`EXIT_ROW_FAILED`].
fn run_failed(cmd: &str, e: impl std::fmt::Display) -> i32 {
    eprintln!("tephra-bench {cmd}: error: {e}");
    EXIT_ROW_FAILED
}

/// [`run_failed`], or the interrupted exit code when a signal stopped the run.
fn run_failed_or_stopped(cmd: &str, e: impl std::fmt::Display) -> i32 {
    let code = run_failed(cmd, e);
    if signals::stopped() {
        signals::interrupted_exit_code()
    } else {
        code
    }
}

/// The exit code of a run that went its course: interrupted by a signal, else
/// [`EXIT_ROW_FAILED`] when `failed`, else `code`.
fn finish(interrupted: bool, failed: bool, code: i32) -> Exit {
    if interrupted {
        Ok(signals::interrupted_exit_code())
    } else if failed {
        Ok(EXIT_ROW_FAILED)
    } else {
        Ok(code)
    }
}

/// Checks that `addr` names a socket address; a usage error otherwise.
fn check_addr(cmd: &str, addr: &str) -> Result<(), i32> {
    match addr.to_socket_addrs() {
        Ok(it) if it.len() > 0 => Ok(()),
        Ok(_) => Err(usage(cmd, format!("--addr {addr:?} resolves to no address"))),
        Err(e) => Err(usage(cmd, format!("--addr {addr:?} is not HOST:PORT ({e})"))),
    }
}

/// The load generator of `client` if it can keep `inflight` requests per connection; a
/// usage error otherwise.
fn backend_for(cmd: &str, client: append::ClientKind, inflight: u64) -> Result<&'static dyn append::LoadBackend, i32> {
    if inflight as usize <= client.max_inflight() {
        Ok(client.backend())
    } else if client == append::ClientKind::Blocking {
        Err(usage(
            cmd,
            format!(
                "--inflight {inflight}: the blocking client keeps one request in flight per connection; use --client async or raw, \
                 or more --connections"
            ),
        ))
    } else {
        Err(usage(cmd, format!("--inflight {inflight}: at most {} (the server's per-connection append budget)", client.max_inflight())))
    }
}

/// Writes `text` to stdout; a closed stdout (e.g. an interrupted `| tee`) is not a panic.
fn write_stdout(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

fn print_json<T: serde::Serialize>(cmd: &str, v: &T) -> i32 {
    match serde_json::to_string_pretty(v) {
        Ok(s) => {
            write_stdout(&format!("{s}\n"));
            0
        }
        Err(e) => {
            eprintln!("tephra-bench {cmd}: error: cannot serialize result: {e}");
            EXIT_ROW_FAILED
        }
    }
}

/// Prints `rep` on stdout: as JSON with `json`, else as the text `render` makes of it. 0, or
/// [`EXIT_ROW_FAILED`] when it cannot be serialized.
fn print_report<T: serde::Serialize>(cmd: &str, json: bool, rep: &T, render: impl FnOnce(&T) -> String) -> i32 {
    if json {
        print_json(cmd, rep)
    } else {
        write_stdout(&render(rep));
        0
    }
}

/// Writes `rep`'s files into `out` with `write`, prints it ([`print_report`]) and names the
/// files on stderr: [`print_report`]'s code, or `Err(EXIT_ROW_FAILED)` when the files cannot
/// be written (nothing is printed then).
fn publish<T: serde::Serialize>(
    cmd: &str,
    json: bool,
    rep: &T,
    out: &std::path::Path,
    write: impl FnOnce(&T, &std::path::Path) -> Result<Vec<PathBuf>, String>,
    render: impl FnOnce(&T) -> String,
) -> Result<i32, i32> {
    let files = write(rep, out).map_err(|e| run_failed(cmd, e))?;
    let code = print_report(cmd, json, rep, render);
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(code)
}

fn run_append(args: AppendArgs) -> Exit {
    check_addr("append", &args.addr)?;
    let backend = backend_for("append", args.load.client, args.load.inflight)?;
    let cfg = append::AppendConfig {
        addr: args.addr.clone(),
        connections: args.connections as usize,
        inflight: args.load.inflight as usize,
        workload: workload::WorkloadSpec { batch: args.batch as usize, event_size: args.load.event_size as usize, conditional: !args.load.unconditional },
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
        error_backoff: Duration::from_millis(args.error_backoff_ms),
        executor_threads: args.load.executor_threads as usize,
    };
    signals::install();
    let rep = append::run(&cfg, backend, &signals::STOP).map_err(|e| run_failed("append", e))?;
    let code = print_report("append", args.json, &rep, append::render);
    finish(rep.interrupted, false, code)
}

fn run_read(args: ReadArgs) -> Exit {
    check_addr("read", &args.addr)?;
    let cfg = read::ReadConfig {
        addr: args.addr.clone(),
        populate: args.populate,
        event_size: args.event_size as usize,
        needle_every: args.needle_every,
        scan_repeats: args.scan_repeats as usize,
        selective_reads: args.selective_reads as usize,
        subscribers: args.subscribers as usize,
        sub_appends: args.sub_appends as usize,
        sub_batch: args.sub_batch as usize,
        sub_timeout: Duration::from_secs_f64(args.sub_timeout),
    };
    signals::install();
    let rep = read::run(&cfg, &signals::STOP).map_err(|e| run_failed_or_stopped("read", e))?;
    let code = print_report("read", args.json, &rep, read::render);
    finish(rep.interrupted, false, code)
}

/// `target/` of the build this binary belongs to (`target/release/tephra-bench`).
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(PathBuf::from))
        .filter(|p| p.file_name().is_some_and(|n| n == "target"))
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// `args` with `defaults` filled in, its data and output directories created; a usage error
/// if one cannot be.
fn run_plan(cmd: &str, defaults: &RunDefaults, args: &RunArgs) -> Result<RunPlan, i32> {
    let plan = defaults.plan(args, &target_dir());
    for (what, d) in [("--dir", &plan.dir), ("--out", &plan.out)] {
        if let Err(e) = std::fs::create_dir_all(d) {
            return Err(usage(cmd, format!("{what} {}: {e}", d.display())));
        }
    }
    Ok(plan)
}

fn run_compare(args: CompareArgs) -> Exit {
    let cells = compare::parse_matrix(&args.matrix).map_err(|e| usage("compare", format!("--matrix: {e}")))?;
    backend_for("compare", args.load.client, args.load.inflight)?;
    let ours = our_server("compare", &args.run.ours)?;
    let reference = match args.reference.clone().or_else(server::default_reference) {
        Some(p) if p.is_file() => p,
        Some(p) => return Err(usage("compare", format!("reference server {} does not exist (scripts/install-reference.sh)", p.display()))),
        None => return Err(usage("compare", "reference server not found; run scripts/install-reference.sh or pass --reference / set TEPHRA_REFERENCE_SERVER")),
    };
    let plan = run_plan("compare", &COMPARE_RUN, &args.run)?;
    let out = plan.out.clone();
    if let Err(e) = std::fs::create_dir_all(out.join("logs")) {
        return Err(usage("compare", format!("--out {}: {e}", out.display())));
    }
    let cfg = compare::CompareConfig {
        contenders: vec![compare::Contender { name: "ours".into(), binary: ours }, compare::Contender { name: "reference".into(), binary: reference }],
        dir: plan.dir,
        out: plan.out,
        cells,
        rounds: plan.rounds,
        warmup: plan.warmup,
        duration: plan.duration,
        event_size: args.load.event_size as usize,
        conditional: !args.load.unconditional,
        inflight: args.load.inflight as usize,
        client: args.load.client,
        executor_threads: args.load.executor_threads as usize,
        segment_size: args.segment_size,
        server_env: args.server_env.clone(),
        settle: Duration::from_millis(args.settle_ms),
        keep_data: args.keep_data,
        read: args.read.then(|| {
            let populate = args.read_populate.unwrap_or(if args.run.quick { 200_000 } else { 1_000_000 });
            read::ReadConfig {
                addr: String::new(),
                populate,
                event_size: args.load.event_size as usize,
                // Ten needles whatever the size.
                needle_every: (populate / 10).max(1),
                scan_repeats: 3,
                selective_reads: if args.run.quick { 20 } else { 100 },
                subscribers: 8,
                sub_appends: if args.run.quick { 100 } else { 300 },
                sub_batch: 1,
                sub_timeout: Duration::from_secs(30),
            }
        }),
    };
    signals::install();
    let rep = compare::run(&cfg, &signals::STOP, &mut progress_line);
    let code = publish("compare", args.json, &rep, &out, compare::write_outputs, compare::render_markdown)?;
    finish(rep.interrupted, rep.runs.iter().any(|r| r.report.latency.is_none()), code)
}

/// Our server: `--ours`, else next to this binary / `$TEPHRA_SERVER`; a usage error if missing.
fn our_server(cmd: &str, ours: &Option<PathBuf>) -> Result<PathBuf, i32> {
    match ours.clone().or_else(server::default_ours) {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(usage(cmd, format!("our server {} does not exist (cargo build --release --bin tephra-server)", p.display()))),
        None => Err(usage(cmd, "our server not found next to tephra-bench; build it (cargo build --release --bin tephra-server) or pass --ours")),
    }
}

/// A second binary given as `PATH|none`: `None` for `none`, PATH when it is a file, a usage
/// error with `missing(PATH)` when it is not; `fallback()` when the option is not given.
fn binary_or_none(
    cmd: &str,
    given: Option<&str>,
    missing: impl FnOnce(&str) -> String,
    fallback: impl FnOnce() -> Result<Option<PathBuf>, i32>,
) -> Result<Option<PathBuf>, i32> {
    match given {
        Some("none") => Ok(None),
        Some(p) if std::path::Path::new(p).is_file() => Ok(Some(PathBuf::from(p))),
        Some(p) => Err(usage(cmd, missing(p))),
        None => fallback(),
    }
}

fn progress_line(what: &str) {
    // Progress must never panic the run (a closed stderr would make eprintln! panic).
    let _ = writeln!(std::io::stderr(), "{what}");
}

fn run_index_prepare(args: IndexPrepareArgs) -> Exit {
    use tephra_bench::index::{layout::Layout, prepare};
    let server = our_server("index prepare", &args.ours)?;
    let cfg = prepare::PrepareConfig {
        dir: args.dir.clone(),
        layout: Layout {
            events: args.events,
            tags: args.tags,
            rare_tags: args.rare_tags,
            rare_tag_events: args.rare_tag_events,
            common_types: args.common_types,
            rare_type_events: args.rare_type_events,
            event_bytes: args.event_bytes,
            seed: args.seed,
        },
        segment_bytes: args.segment_bytes,
        server,
        connections: args.connections as usize,
        batch: args.batch,
        force: args.force,
        start_timeout: Duration::from_secs(900),
    };
    cfg.layout.validate().map_err(|e| usage("index prepare", e))?;
    signals::install();
    let prepared = prepare::run(&cfg, &signals::STOP, &mut progress_line).map_err(|e| run_failed_or_stopped("index prepare", e))?;
    let m = prepared.manifest();
    let verb = match prepared {
        prepare::Prepared::Reused(_) => "reused",
        prepare::Prepared::Written(_) => "wrote",
    };
    let summary = serde_json::json!({
        "dir": args.dir,
        "action": verb,
        "events": m.layout.events,
        "segment_files": m.segments.len(),
        "log_bytes": m.segments.iter().map(|s| s.bytes).sum::<u64>(),
        "append_seconds": m.append_seconds,
        "events_per_sec": m.events_per_sec,
        "total_seconds": m.total_seconds,
        "connections": m.connections,
        "batch_events": m.batch_events,
        "created": m.created,
        "layout": m.layout,
    });
    if args.json {
        return Ok(print_json("index prepare", &summary));
    }
    write_stdout(&format!(
        "{verb} {}: {} events in {} segment files ({:.2} GB); appended at {} events/s \
         ({} connections × {} events per append, {:.1} s; {:.1} s in all, {})\n{}\n",
        args.dir.display(),
        m.layout.events,
        m.segments.len(),
        m.segments.iter().map(|s| s.bytes).sum::<u64>() as f64 / 1e9,
        report::thousands(m.events_per_sec),
        m.connections,
        m.batch_events,
        m.append_seconds,
        m.total_seconds,
        m.created,
        m.description
    ));
    Ok(0)
}

fn run_index_run(args: IndexRunArgs) -> Exit {
    use tephra_bench::index::run::{self as ixrun, Contender, RunConfig, ALWAYS_SCAN};
    let ours = our_server("index run", &args.ours)?;
    let reference = binary_or_none(
        "index run",
        args.reference.as_deref(),
        |p| format!("reference server {p} does not exist (scripts/install-reference.sh, or --reference none)"),
        || {
            let missing = || usage("index run", "reference server not found; run scripts/install-reference.sh, pass --reference PATH, or --reference none");
            server::default_reference().map(Some).ok_or_else(missing)
        },
    )?;
    if !args.dir.join(tephra_bench::index::layout::MANIFEST_FILE).is_file() {
        return Err(usage("index run", format!("{} is not prepared (tephra-bench index prepare --dir ...)", args.dir.display())));
    }
    let work = args.work.clone().unwrap_or_else(|| {
        let mut s = args.dir.clone().into_os_string();
        s.push(".work");
        PathBuf::from(s)
    });
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench-results").join(format!("{}-index", tephra_bench::index::prepare::utc_stamp())));
    let mut contenders = vec![Contender { name: "ours".into(), binary: ours.clone(), env: vec![], measure_open: true, baseline: false }];
    if let Some(r) = reference {
        contenders.push(Contender { name: "reference".into(), binary: r, env: vec![], measure_open: true, baseline: false });
    }
    if args.scan_rounds > 0 {
        contenders.push(Contender {
            name: "ours-scan".into(),
            binary: ours,
            env: vec![("TEPHRA__READ__SCAN_BIAS".into(), ALWAYS_SCAN.into()), ("TEPHRA__WRITER__CONDITION_FORCE_SCAN".into(), "true".into())],
            measure_open: false,
            baseline: true,
        });
    }
    let cfg = RunConfig {
        dir: args.dir.clone(),
        work,
        keep_work: args.keep_work,
        out: out.clone(),
        contenders,
        rounds: args.rounds as usize,
        scan_rounds: args.scan_rounds.min(args.rounds) as usize,
        selective_reads: args.selective_reads as usize,
        type_reads: args.type_reads as usize,
        type_limit: args.type_limit,
        appends: args.appends as usize,
        scan_reads: args.scan_reads as usize,
        scan_appends: args.scan_appends as usize,
        budget: Duration::from_secs_f64(args.budget),
        evict: args.evict_page_cache,
        start_timeout: Duration::from_secs_f64(args.start_timeout),
        request_timeout: Duration::from_secs_f64(args.request_timeout),
    };
    signals::install();
    let rep = ixrun::run(&cfg, &signals::STOP, &mut progress_line).map_err(|e| run_failed_or_stopped("index run", e))?;
    publish("index run", args.json, &rep, &out, ixrun::write_outputs, ixrun::render_markdown)
}

fn run_fsync(args: FsyncArgs) -> Exit {
    logcapture::install();
    fsync::preflight(&args.dir).map_err(|e| usage("fsync", e))?;
    let facts = machine::gather(&args.dir).map_err(|e| usage("fsync", format!("cannot inspect {}: {e}", args.dir.display())))?;
    let budget = match (args.seconds, args.commits) {
        (_, Some(n)) => Budget::Commits(n),
        (Some(s), None) => Budget::Seconds(s),
        (None, None) => Budget::Seconds(fsync::DEFAULT_SECONDS),
    };
    // Leave at least half of the free space alone.
    let mut max_row_bytes = args.max_row_mib << 20;
    let half_free = facts.fs.free_bytes / 2;
    if max_row_bytes > half_free {
        let biggest = args.block_sizes.iter().copied().max().unwrap_or(4096) as u64;
        if half_free < biggest {
            return Err(usage("fsync", format!("not enough free space in {} ({} bytes free)", args.dir.display(), facts.fs.free_bytes)));
        }
        max_row_bytes = half_free;
    }
    if facts.fs.in_memory {
        // Say it before the run too, not only after.
        eprintln!("WARNING: {}", fsync::in_memory_warning(&facts));
    }
    let config = ProbeConfig { dir: facts.dir.clone().into(), budget, block_sizes: args.block_sizes.clone(), max_row_bytes };
    let show_progress = std::io::stderr().is_terminal();
    let mut progress = |done: usize, total: usize, row: &fsync::RowResult| {
        if show_progress {
            eprint!("\r\x1b[2K[{done}/{total}] {}", row.label);
            if done == total {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        }
    };
    fsync::install_interrupt_handler();
    let rep = fsync::run_probe(config, facts, &mut progress);
    let failed = rep.rows.iter().any(|r| r.error.is_some());
    if args.json {
        for w in &rep.warnings {
            eprintln!("WARNING: {w}");
        }
        let json = serde_json::to_string_pretty(&rep).map_err(|e| run_failed("fsync", format!("cannot serialize result: {e}")))?;
        println!("{json}");
    } else {
        print!("{}", report::render_table(&rep));
    }
    finish(fsync::interrupted(), failed, 0)
}

/// The etcd binary of `--etcd PATH|none` (`given`), else the default one; `None` (with a loud
/// warning when none is found) to measure ours only.
fn etcd_binary(cmd: &str, given: Option<&str>) -> Result<Option<PathBuf>, i32> {
    binary_or_none(
        cmd,
        given,
        |p| format!("--etcd {p} does not exist (scripts/install-etcd.sh)"),
        || {
            let found = etcd::default_etcd();
            if found.is_none() {
                eprintln!(
                    "\n*** tephra-bench {cmd}: etcd not found ($ETCD_BIN, /usr/bin/etcd, PATH): measuring ours only; scripts/install-etcd.sh installs it ***\n"
                );
            }
            Ok(found)
        },
    )
}

/// A comma separated list of numbers in `range` given as `flag`; a usage error otherwise.
fn number_list(cmd: &str, flag: &str, text: &str, range: std::ops::RangeInclusive<usize>) -> Result<Vec<usize>, i32> {
    let list: Result<Vec<usize>, _> = text.split(',').filter(|b| !b.trim().is_empty()).map(|b| b.trim().parse::<usize>()).collect();
    match list {
        Ok(l) if l.iter().all(|x| range.contains(x)) => Ok(l),
        _ => Err(usage(cmd, format!("{flag} {text:?}: a comma separated list of {}..={}", range.start(), range.end()))),
    }
}

/// `--store-durability`: ordered or batched; a usage error otherwise.
fn store_durability(cmd: &str, text: &str) -> Result<tephra::journal::StoreDurability, i32> {
    match text {
        "ordered" => Ok(tephra::journal::StoreDurability::Ordered),
        "batched" => Ok(tephra::journal::StoreDurability::Batched),
        other => Err(usage(cmd, format!("--store-durability {other:?}: ordered or batched"))),
    }
}

/// Warns when the scratch directory is RAM-backed.
fn warn_tmpfs(cmd: &str, dir: &std::path::Path) {
    if journal::on_tmpfs(dir) {
        eprintln!("tephra-bench {cmd}: warning: {} is on a RAM-backed filesystem: syncs are nearly free there and the numbers mean nothing", dir.display());
    }
}

fn run_journal(args: JournalArgs) -> Exit {
    let ours = our_server("journal", &args.run.ours)?;
    let etcd = etcd_binary("journal", args.etcd.as_deref())?;
    let batches = number_list("journal", "--batches", &args.batches, 1..=1024)?;
    let durability = store_durability("journal", &args.store_durability)?;
    let plan = run_plan("journal", &JOURNAL_RUN, &args.run)?;
    warn_tmpfs("journal", &plan.dir);
    let out = plan.out.clone();
    let cfg = journal::JournalBenchConfig {
        ours,
        etcd,
        dir: plan.dir,
        out: plan.out,
        writers: args.writers as usize,
        record_size: args.record_size as usize,
        batches,
        multi: !args.no_multi,
        tail: !args.no_tail,
        dcb: !args.no_dcb,
        rounds: plan.rounds,
        warmup: plan.warmup,
        duration: plan.duration,
        settle: Duration::from_millis(args.settle_ms),
        durability,
    };
    signals::install();
    let rep = journal::run(&cfg, &signals::STOP).map_err(|e| run_failed("journal", e))?;
    // The exit code does not depend on printing: journal::run has written the files in --out.
    let _ = print_report("journal", args.json, &rep, |r| r.table.clone());
    eprintln!("tephra-bench journal: results in {}", out.display());
    finish(rep.interrupted, rep.runs.iter().any(|r| r.failed.is_some()), 0)
}

fn run_cluster(args: ClusterArgs) -> Exit {
    let ours = our_server("cluster", &args.run.ours)?;
    let etcd = etcd_binary("cluster", args.etcd.as_deref())?;
    let writers = number_list("cluster", "--writers", &args.writers, 1..=1024)?;
    let batches = number_list("cluster", "--batches", &args.batches, 1..=1024)?;
    let durability = store_durability("cluster", &args.store_durability)?;
    let plan = run_plan("cluster", &CLUSTER_RUN, &args.run)?;
    warn_tmpfs("cluster", &plan.dir);
    let out = plan.out.clone();
    let cfg = cluster::ClusterBenchConfig {
        ours,
        etcd,
        dir: plan.dir,
        out: plan.out,
        journals: args.journals as usize,
        writers,
        batches,
        record_size: args.record_size as usize,
        readers: args.readers as usize,
        single_node: !args.no_single_node,
        failover_trials: args.failover_trials.map_or(if args.run.quick { 2 } else { 5 }, |n| n as usize),
        rounds: plan.rounds,
        warmup: plan.warmup,
        duration: plan.duration,
        settle: Duration::from_millis(args.settle_ms),
        durability,
    };
    signals::install();
    let rep = cluster::run(&cfg, &signals::STOP).map_err(|e| run_failed("cluster", e))?;
    // The exit code does not depend on printing: cluster::run has written the files in --out.
    let _ = print_report("cluster", args.json, &rep, |r| r.table.clone());
    eprintln!("tephra-bench cluster: results in {}", out.display());
    let failed = rep.runs.iter().any(|r| r.run.failed.is_some()) || rep.failover.iter().any(|f| f.failed.is_some());
    finish(rep.interrupted, failed, 0)
}
