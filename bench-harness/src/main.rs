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
    AppendArgs, Cli, Command, CompareArgs, FsyncArgs, IndexCommand, IndexPrepareArgs, IndexRunArgs, JournalArgs, ReadArgs, RunArgs, RunDefaults, RunPlan,
    COMPARE_RUN, EXIT_ROW_FAILED, EXIT_USAGE, JOURNAL_RUN,
};
use tephra_bench::fsync::{self, Budget, ProbeConfig};
use tephra_bench::{append, compare, etcd, journal, logcapture, machine, read, report, server, signals, workload};

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
    };
    ExitCode::from(code as u8)
}

/// Checks that `addr` names a socket address; a usage error otherwise.
fn check_addr(cmd: &str, addr: &str) -> Result<(), i32> {
    match addr.to_socket_addrs() {
        Ok(it) if it.len() > 0 => Ok(()),
        Ok(_) => {
            eprintln!("tephra-bench {cmd}: error: --addr {addr:?} resolves to no address");
            Err(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("tephra-bench {cmd}: error: --addr {addr:?} is not HOST:PORT ({e})");
            Err(EXIT_USAGE)
        }
    }
}

/// The load generator of `client` if it can keep `inflight` requests per connection; a
/// usage error otherwise.
fn backend_for(cmd: &str, client: append::ClientKind, inflight: u64) -> Result<&'static dyn append::LoadBackend, i32> {
    if inflight as usize <= client.max_inflight() {
        Ok(client.backend())
    } else if client == append::ClientKind::Blocking {
        eprintln!(
            "tephra-bench {cmd}: error: --inflight {inflight}: the blocking client keeps one request in flight per \
             connection; use --client async or raw, or more --connections"
        );
        Err(EXIT_USAGE)
    } else {
        eprintln!("tephra-bench {cmd}: error: --inflight {inflight}: at most {} (the server's per-connection append budget)", client.max_inflight());
        Err(EXIT_USAGE)
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
    let files = write(rep, out).map_err(|e| {
        eprintln!("tephra-bench {cmd}: error: {e}");
        EXIT_ROW_FAILED
    })?;
    let code = print_report(cmd, json, rep, render);
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(code)
}

fn run_append(args: AppendArgs) -> i32 {
    if let Err(code) = check_addr("append", &args.addr) {
        return code;
    }
    let backend = match backend_for("append", args.load.client, args.load.inflight) {
        Ok(b) => b,
        Err(code) => return code,
    };
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
    let rep = match append::run(&cfg, backend, &signals::STOP) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tephra-bench append: error: {e}");
            return EXIT_ROW_FAILED;
        }
    };
    let code = print_report("append", args.json, &rep, append::render);
    if rep.interrupted {
        signals::interrupted_exit_code()
    } else {
        code
    }
}

fn run_read(args: ReadArgs) -> i32 {
    if let Err(code) = check_addr("read", &args.addr) {
        return code;
    }
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
    let rep = match read::run(&cfg, &signals::STOP) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tephra-bench read: error: {e}");
            return if signals::stopped() { signals::interrupted_exit_code() } else { EXIT_ROW_FAILED };
        }
    };
    let code = print_report("read", args.json, &rep, read::render);
    if rep.interrupted {
        signals::interrupted_exit_code()
    } else {
        code
    }
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
            eprintln!("tephra-bench {cmd}: error: {what} {}: {e}", d.display());
            return Err(EXIT_USAGE);
        }
    }
    Ok(plan)
}

fn run_compare(args: CompareArgs) -> i32 {
    let usage = |msg: String| {
        eprintln!("tephra-bench compare: error: {msg}");
        EXIT_USAGE
    };
    let cells = match compare::parse_matrix(&args.matrix) {
        Ok(c) => c,
        Err(e) => return usage(format!("--matrix: {e}")),
    };
    if let Err(code) = backend_for("compare", args.load.client, args.load.inflight) {
        return code;
    }
    let ours = match our_server("compare", &args.run.ours) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let reference = match args.reference.clone().or_else(server::default_reference) {
        Some(p) if p.is_file() => p,
        Some(p) => return usage(format!("reference server {} does not exist (scripts/install-reference.sh)", p.display())),
        None => return usage("reference server not found; run scripts/install-reference.sh or pass --reference / set TEPHRA_REFERENCE_SERVER".into()),
    };
    let plan = match run_plan("compare", &COMPARE_RUN, &args.run) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let out = plan.out.clone();
    if let Err(e) = std::fs::create_dir_all(out.join("logs")) {
        return usage(format!("--out {}: {e}", out.display()));
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
    let code = match publish("compare", args.json, &rep, &out, compare::write_outputs, compare::render_markdown) {
        Ok(c) => c,
        Err(c) => return c,
    };
    let failed = rep.runs.iter().any(|r| r.report.latency.is_none());
    if rep.interrupted {
        signals::interrupted_exit_code()
    } else if failed || code != 0 {
        EXIT_ROW_FAILED
    } else {
        0
    }
}

/// Our server: `--ours`, else next to this binary / `$TEPHRA_SERVER`; a usage error if missing.
fn our_server(cmd: &str, ours: &Option<PathBuf>) -> Result<PathBuf, i32> {
    match ours.clone().or_else(server::default_ours) {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => {
            eprintln!("tephra-bench {cmd}: error: our server {} does not exist (cargo build --release --bin tephra-server)", p.display());
            Err(EXIT_USAGE)
        }
        None => {
            eprintln!(
                "tephra-bench {cmd}: error: our server not found next to tephra-bench; build it \
                 (cargo build --release --bin tephra-server) or pass --ours"
            );
            Err(EXIT_USAGE)
        }
    }
}

fn progress_line(what: &str) {
    // Progress must never panic the run (a closed stderr would make eprintln! panic).
    let _ = writeln!(std::io::stderr(), "{what}");
}

fn run_index_prepare(args: IndexPrepareArgs) -> i32 {
    use tephra_bench::index::{layout::Layout, prepare};
    let server = match our_server("index prepare", &args.ours) {
        Ok(p) => p,
        Err(code) => return code,
    };
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
    if let Err(e) = cfg.layout.validate() {
        eprintln!("tephra-bench index prepare: error: {e}");
        return EXIT_USAGE;
    }
    signals::install();
    let prepared = match prepare::run(&cfg, &signals::STOP, &mut progress_line) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tephra-bench index prepare: error: {e}");
            return if signals::stopped() { signals::interrupted_exit_code() } else { EXIT_ROW_FAILED };
        }
    };
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
        return print_json("index prepare", &summary);
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
    0
}

fn run_index_run(args: IndexRunArgs) -> i32 {
    use tephra_bench::index::run::{self as ixrun, Contender, RunConfig, ALWAYS_SCAN};
    let usage = |msg: String| {
        eprintln!("tephra-bench index run: error: {msg}");
        EXIT_USAGE
    };
    let ours = match our_server("index run", &args.ours) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let reference = match args.reference.as_deref() {
        Some("none") => None,
        Some(p) if std::path::Path::new(p).is_file() => Some(PathBuf::from(p)),
        Some(p) => return usage(format!("reference server {p} does not exist (scripts/install-reference.sh, or --reference none)")),
        None => match server::default_reference() {
            Some(p) => Some(p),
            None => return usage("reference server not found; run scripts/install-reference.sh, pass --reference PATH, or --reference none".into()),
        },
    };
    if !args.dir.join(tephra_bench::index::layout::MANIFEST_FILE).is_file() {
        return usage(format!("{} is not prepared (tephra-bench index prepare --dir ...)", args.dir.display()));
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
    let rep = match ixrun::run(&cfg, &signals::STOP, &mut progress_line) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tephra-bench index run: error: {e}");
            return if signals::stopped() { signals::interrupted_exit_code() } else { EXIT_ROW_FAILED };
        }
    };
    publish("index run", args.json, &rep, &out, ixrun::write_outputs, ixrun::render_markdown).unwrap_or_else(|code| code)
}

fn run_fsync(args: FsyncArgs) -> i32 {
    logcapture::install();
    if let Err(e) = fsync::preflight(&args.dir) {
        eprintln!("tephra-bench fsync: error: {e}");
        return EXIT_USAGE;
    }
    let facts = match machine::gather(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tephra-bench fsync: error: cannot inspect {}: {e}", args.dir.display());
            return EXIT_USAGE;
        }
    };
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
            eprintln!("tephra-bench fsync: error: not enough free space in {} ({} bytes free)", args.dir.display(), facts.fs.free_bytes);
            return EXIT_USAGE;
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
        match serde_json::to_string_pretty(&rep) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("tephra-bench fsync: error: cannot serialize result: {e}");
                return EXIT_ROW_FAILED;
            }
        }
    } else {
        print!("{}", report::render_table(&rep));
    }
    if fsync::interrupted() {
        signals::interrupted_exit_code()
    } else if failed {
        EXIT_ROW_FAILED
    } else {
        0
    }
}

fn run_journal(args: JournalArgs) -> i32 {
    let usage = |msg: String| {
        eprintln!("tephra-bench journal: error: {msg}");
        EXIT_USAGE
    };
    let ours = match our_server("journal", &args.run.ours) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let etcd = match args.etcd.as_deref() {
        Some("none") => None,
        Some(p) if std::path::Path::new(p).is_file() => Some(PathBuf::from(p)),
        Some(p) => return usage(format!("--etcd {p} does not exist (scripts/install-etcd.sh)")),
        None => {
            let found = etcd::default_etcd();
            if found.is_none() {
                eprintln!("\n*** tephra-bench journal: etcd not found ($ETCD_BIN, /usr/bin/etcd, PATH): measuring ours only; scripts/install-etcd.sh installs it ***\n");
            }
            found
        }
    };
    let batches: Result<Vec<usize>, _> = args.batches.split(',').filter(|b| !b.trim().is_empty()).map(|b| b.trim().parse::<usize>()).collect();
    let batches = match batches {
        Ok(b) if b.iter().all(|&x| (1..=1024).contains(&x)) => b,
        _ => return usage(format!("--batches {:?}: a comma separated list of 1..=1024", args.batches)),
    };
    let durability = match args.store_durability.as_str() {
        "ordered" => tephra::journal::StoreDurability::Ordered,
        "batched" => tephra::journal::StoreDurability::Batched,
        other => return usage(format!("--store-durability {other:?}: ordered or batched")),
    };
    let plan = match run_plan("journal", &JOURNAL_RUN, &args.run) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if journal::on_tmpfs(&plan.dir) {
        eprintln!(
            "tephra-bench journal: warning: {} is on a RAM-backed filesystem: syncs are nearly free there and the numbers mean nothing",
            plan.dir.display()
        );
    }
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
    let rep = match journal::run(&cfg, &signals::STOP) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tephra-bench journal: error: {e}");
            return EXIT_ROW_FAILED;
        }
    };
    // The exit code does not depend on printing: journal::run has written the files in --out.
    let _ = print_report("journal", args.json, &rep, |r| r.table.clone());
    eprintln!("tephra-bench journal: results in {}", out.display());
    if rep.interrupted {
        signals::interrupted_exit_code()
    } else if rep.runs.iter().any(|r| r.failed.is_some()) {
        EXIT_ROW_FAILED
    } else {
        0
    }
}
