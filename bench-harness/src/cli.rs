//! Command-line interface of `tephra-bench` (clap derive).

use clap::{Arg, Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Exit code for usage errors and bad environments (e.g. an unusable `--dir`, a server
/// binary that does not exist).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the probe ran but at least one row failed with an I/O error; for the
/// load generators: the server could not be reached or a run failed.
pub const EXIT_ROW_FAILED: i32 = 1;
/// Exit code after SIGINT stopped the run (files removed, servers stopped, partial result
/// printed); after SIGTERM it is 143 ([`crate::signals::interrupted_exit_code`] picks).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Benchmark harness for the Tephra event store.
#[derive(Debug, Parser)]
#[command(name = "tephra-bench", version, about, long_about = None)]
pub struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure what the disk under DIR can commit: write + fdatasync latency per block
    /// size, buffered vs O_DIRECT (glommio DmaFile), preallocated vs growing file.
    Fsync(FsyncArgs),
    /// Append throughput and latency against a running server: N connections, batch
    /// size, event size, conditional or not, warm-up, measured window.
    Append(AppendArgs),
    /// Read-side benchmarks against a running server: full-log scan, selective reads,
    /// subscription fan-out lag.
    Read(ReadArgs),
    /// Run the same append matrix against our server and the reference server (each
    /// started fresh, alternating A B A B) and write a table, JSON and an SVG chart.
    Compare(CompareArgs),
    /// The index benchmark: prepare a large log once, then time opening the store,
    /// selective and type-only reads and conditional appends naming a rare tag on our
    /// server, the reference and a full-scan baseline, checking every result.
    Index(IndexArgs),
    /// The journal API on our server against a one-member etcd 3.4, side by side: fenced
    /// single-writer journals (1 and 64 records per write), one multi-writer journal, a tail
    /// reader's delay, and our DCB server's conditional append rate (docs/benchmarks.md §7).
    Journal(JournalArgs),
    /// Replicated journals on a three-node cluster of ours against a three-member etcd 3.4
    /// cluster, side by side: fenced writes from 16, 64 and 256 writers over 64 journals (1 and
    /// 64 records per write), linearizable reads, failover time, and each write workload on
    /// one node of ours (docs/benchmarks.md §8).
    Cluster(ClusterArgs),
}

/// Options of `tephra-bench cluster`.
#[derive(Debug, Args)]
#[command(mut_args(|a| CLUSTER_RUN.describe(a)))]
pub struct ClusterArgs {
    /// Our server, the directories and the rounds.
    #[command(flatten)]
    pub run: RunArgs,
    /// The etcd binary, or `none` for ours only [default: $ETCD_BIN, else /usr/bin/etcd, else
    /// etcd on PATH; ours only, with a warning, when there is none (scripts/install-etcd.sh)].
    #[arg(long, value_name = "PATH|none")]
    pub etcd: Option<String>,
    /// Journals (etcd: head keys) the writers and readers spread over.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub journals: u64,
    /// Writer counts of the fenced workloads, comma separated (more writers than journals
    /// share journals and race for their `next_seq`).
    #[arg(long, value_name = "LIST", default_value = "16,64,256")]
    pub writers: String,
    /// Records per fenced write, comma separated.
    #[arg(long, value_name = "LIST", default_value = "1,64")]
    pub batches: String,
    /// Bytes per record.
    #[arg(long, value_name = "BYTES", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub record_size: u64,
    /// Readers of the linearizable read workload (0 skips it).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub readers: u64,
    /// Failover trials per system (0 skips failover) [default: 5, quick: 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=100))]
    pub failover_trials: Option<u64>,
    /// Skip the write workloads on one node of ours (the base of the ≥ 50% target).
    #[arg(long)]
    pub no_single_node: bool,
    /// The journals' store durability: ordered or batched.
    #[arg(long, value_name = "ordered|batched", default_value = "ordered")]
    pub store_durability: String,
    /// Pause between runs, ms (after the data directories are removed and synced).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub settle_ms: u64,
    /// Print the JSON report on stdout instead of the markdown tables.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tephra-bench journal`.
#[derive(Debug, Args)]
#[command(mut_args(|a| JOURNAL_RUN.describe(a)))]
pub struct JournalArgs {
    /// Our server, the directories and the rounds.
    #[command(flatten)]
    pub run: RunArgs,
    /// The etcd binary, or `none` for ours only [default: $ETCD_BIN, else /usr/bin/etcd, else
    /// etcd on PATH; ours only, with a warning, when there is none (scripts/install-etcd.sh)].
    #[arg(long, value_name = "PATH|none")]
    pub etcd: Option<String>,
    /// Writers, and journals of the single-writer workloads.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub writers: u64,
    /// Bytes per record.
    #[arg(long, value_name = "BYTES", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub record_size: u64,
    /// Records per fenced write of the single-writer workloads, comma separated.
    #[arg(long, value_name = "LIST", default_value = "1,64")]
    pub batches: String,
    /// The journals' store durability: ordered (the default: records, fdatasync, marker,
    /// fdatasync) or batched (one fdatasync per group commit).
    #[arg(long, value_name = "ordered|batched", default_value = "ordered")]
    pub store_durability: String,
    /// Skip the multi-writer workload.
    #[arg(long)]
    pub no_multi: bool,
    /// Skip the tail-reader workload.
    #[arg(long)]
    pub no_tail: bool,
    /// Skip our DCB server's conditional append workload.
    #[arg(long)]
    pub no_dcb: bool,
    /// Pause between runs, ms (after the data directory is removed and synced).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub settle_ms: u64,
    /// Print the JSON report on stdout instead of the markdown table.
    #[arg(long)]
    pub json: bool,
}

/// The options of the subcommands that start the servers themselves and measure them over
/// rounds (`compare`, `journal`, `cluster`): our server, where data and results go, and how long.
/// Their defaults are the subcommand's [`RunDefaults`], which also appends them to the help.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Our `tephra-server` [default: `tephra-server` next to this binary, or $TEPHRA_SERVER].
    #[arg(long, value_name = "PATH")]
    pub ours: Option<PathBuf>,
    /// Scratch directory for the servers' data directories (one disk for both, never a tmpfs;
    /// one fresh directory per run, removed after it).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Where the markdown and JSON reports and the servers' logs go.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Short settings: the `quick` defaults of --rounds, --duration and --warmup.
    #[arg(long)]
    pub quick: bool,
    /// Rounds; each runs every measurement on both systems.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: Option<u64>,
    /// Measured seconds per run.
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// Warm-up seconds per run.
    #[arg(long, value_name = "S", value_parser = parse_nonneg_seconds)]
    pub warmup: Option<f64>,
}

/// The defaults of one subcommand's [`RunArgs`]: `(normal, --quick)` pairs.
#[derive(Debug, Clone, Copy)]
pub struct RunDefaults {
    /// The subcommand; the directories default to `target/bench-NAME` and `target/bench-NAME/data`.
    pub name: &'static str,
    /// In which order a round runs the two systems.
    pub order: &'static str,
    /// Rounds.
    pub rounds: (usize, usize),
    /// Measured seconds per run.
    pub duration: (f64, f64),
    /// Warm-up seconds per run.
    pub warmup: (f64, f64),
}

/// The defaults of `tephra-bench journal`.
pub const JOURNAL_RUN: RunDefaults =
    RunDefaults { name: "journal", order: "alternating which goes first", rounds: (3, 2), duration: (10.0, 3.0), warmup: (2.0, 1.0) };

/// The defaults of `tephra-bench cluster`.
pub const CLUSTER_RUN: RunDefaults =
    RunDefaults { name: "cluster", order: "rotating which goes first", rounds: (3, 1), duration: (10.0, 2.0), warmup: (2.0, 1.0) };

/// The defaults of `tephra-bench compare`.
pub const COMPARE_RUN: RunDefaults = RunDefaults { name: "compare", order: "ours first", rounds: (3, 2), duration: (15.0, 5.0), warmup: (3.0, 2.0) };

/// What [`RunArgs`] come to once the defaults are filled in (the directories are not
/// created yet).
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// Scratch directory for the data directories.
    pub dir: PathBuf,
    /// Where the results go.
    pub out: PathBuf,
    /// Rounds.
    pub rounds: usize,
    /// Measured window per run.
    pub duration: Duration,
    /// Warm-up per run.
    pub warmup: Duration,
}

impl RunDefaults {
    /// Appends this subcommand's default to the help of a [`RunArgs`] option (`--quick`: says
    /// what it sets); other options are returned as they are (for clap's `mut_args`).
    pub fn describe(&self, a: Arg) -> Arg {
        let out = self.out_dir(Path::new("target"));
        let pair = |(normal, quick): (f64, f64)| format!("{normal}, quick: {quick}");
        let default = match a.get_id().as_str() {
            "dir" => out.join("data").display().to_string(),
            "out" => out.display().to_string(),
            "rounds" => format!("{}, quick: {}", self.rounds.0, self.rounds.1),
            "duration" => pair(self.duration),
            "warmup" => pair(self.warmup),
            "quick" => {
                let (r, d, w) = (self.rounds.1, self.duration.1, self.warmup.1);
                return a.help(format!("Short settings: {r} rounds × {d} s after {w} s of warm-up"));
            }
            _ => return a,
        };
        let help = a.get_help().map(ToString::to_string).unwrap_or_default();
        let help = help.trim_end_matches('.');
        let order = if a.get_id() == "rounds" { format!(", {}", self.order) } else { String::new() };
        a.help(format!("{help}{order} [default: {default}]"))
    }

    /// `TARGET/bench-NAME`, the default of `--out`.
    pub fn out_dir(&self, target: &Path) -> PathBuf {
        target.join(format!("bench-{}", self.name))
    }

    /// Fills in what `args` leaves out; the directories default below `target`.
    pub fn plan(&self, args: &RunArgs, target: &Path) -> RunPlan {
        fn choose<T>(quick: bool, (normal, short): (T, T)) -> T {
            if quick {
                short
            } else {
                normal
            }
        }
        let pick = |pair| choose(args.quick, pair);
        RunPlan {
            dir: args.dir.clone().unwrap_or_else(|| self.out_dir(target).join("data")),
            out: args.out.clone().unwrap_or_else(|| self.out_dir(target)),
            rounds: args.rounds.map_or(choose(args.quick, self.rounds), |r| r as usize),
            duration: Duration::from_secs_f64(args.duration.unwrap_or(pick(self.duration))),
            warmup: Duration::from_secs_f64(args.warmup.unwrap_or(pick(self.warmup))),
        }
    }
}

/// Options of `tephra-bench index`.
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The step.
    #[command(subcommand)]
    pub command: IndexCommand,
}

/// The steps of `tephra-bench index`.
#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Write the benchmark's log into DIR through our server and record its layout in
    /// DIR/prepare.json (a directory already prepared the same way is reused).
    Prepare(IndexPrepareArgs),
    /// Measure our server, the reference and our server forced to scan on copies of a
    /// prepared DIR; write index.md and index.json.
    Run(IndexRunArgs),
}

/// Options of `tephra-bench index prepare`.
#[derive(Debug, Args)]
pub struct IndexPrepareArgs {
    /// The data directory to fill (created; must be empty or prepared before).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Events in the log.
    #[arg(long, value_name = "N", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub events: u64,
    /// Bulk tags: every event carries one of them, `bulk-(k % N)`.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub tags: u64,
    /// Rare tags `rare-0..`, each on exactly --rare-tag-events events spread over the log.
    #[arg(long, value_name = "N", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rare_tags: u64,
    /// Events per rare tag (the selective read's matches).
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub rare_tag_events: u64,
    /// Common types `type-0..`.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub common_types: u64,
    /// Events of the rare type `type-rare`.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rare_type_events: u64,
    /// Payload bytes per event (at least 8: the payload starts with the event number).
    #[arg(long, value_name = "BYTES", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    pub event_bytes: u64,
    /// Segment size (`TEPHRA__SEGMENT__SIZE`), bytes; the run uses the same.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20,
          value_parser = clap::value_parser!(u64).range(4096..=u32::MAX as u64))]
    pub segment_bytes: u64,
    /// Seed of the rare placements and of the common types.
    #[arg(long, value_name = "N", default_value_t = 20_261_129)]
    pub seed: u64,
    /// Appending connections.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub connections: u64,
    /// Events per append request.
    #[arg(long, value_name = "N", default_value_t = 2048,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// Our `tephra-server` [default: `tephra-server` next to this binary, or $TEPHRA_SERVER].
    #[arg(long, value_name = "PATH")]
    pub ours: Option<PathBuf>,
    /// Replace whatever DIR holds if it is not prepared this way.
    #[arg(long)]
    pub force: bool,
    /// Print the manifest's summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tephra-bench index run`.
#[derive(Debug, Args)]
pub struct IndexRunArgs {
    /// The prepared directory (left unchanged; each server works on its own copy).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Our `tephra-server` [default: `tephra-server` next to this binary, or $TEPHRA_SERVER].
    #[arg(long, value_name = "PATH")]
    pub ours: Option<PathBuf>,
    /// The reference `tephra-server`, or `none` to measure ours only [default:
    /// $TEPHRA_REFERENCE_SERVER, else ~/.tephra-reference/bin/tephra-server].
    #[arg(long, value_name = "PATH|none")]
    pub reference: Option<String>,
    /// Rounds (ours and the reference alternate: A B, then B A, ...).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Rounds that also run the full-scan baseline (the first ones; 0 skips it).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=100))]
    pub scan_rounds: u64,
    /// Where index.md, index.json and the server logs go [default:
    /// bench-results/<UTC stamp>-index].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Where the servers' copies of DIR go; must be on DIR's filesystem for hard links
    /// [default: DIR.work]. Removed afterwards unless --keep-work.
    #[arg(long, value_name = "DIR")]
    pub work: Option<PathBuf>,
    /// Keep the copies.
    #[arg(long)]
    pub keep_work: bool,
    /// Selective reads (`tag rare-K`, a different K each) per run.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub selective_reads: u64,
    /// Type-only reads of each kind (rare type; common type with a limit) per run.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub type_reads: u64,
    /// Limit of the common-type reads.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub type_limit: u64,
    /// Conditional appends of each kind per run.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub appends: u64,
    /// Reads of each kind on the full-scan baseline.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scan_reads: u64,
    /// Conditional appends of each kind on the full-scan baseline.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scan_appends: u64,
    /// Seconds one measurement may take; past it, it stops once it has 3 samples.
    #[arg(long, value_name = "S", default_value = "30", value_parser = parse_seconds)]
    pub budget: f64,
    /// Evict the data files from the page cache before every open (fdatasync +
    /// POSIX_FADV_DONTNEED), so opens read from the disk.
    #[arg(long)]
    pub evict_page_cache: bool,
    /// Seconds a server may take to open the store.
    #[arg(long, value_name = "S", default_value = "900", value_parser = parse_seconds)]
    pub start_timeout: f64,
    /// Seconds a request may go without an answer before the run fails as hung.
    #[arg(long, value_name = "S", default_value = "120", value_parser = parse_seconds)]
    pub request_timeout: f64,
    /// Print the JSON report on stdout instead of the markdown.
    #[arg(long)]
    pub json: bool,
}

/// The append load's options `append` and `compare` share.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Payload bytes per event.
    #[arg(long, value_name = "BYTES", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(0..=4 << 20))]
    pub event_size: u64,
    /// Send plain appends instead of ones guarded by the never-firing {tag, type} condition.
    #[arg(long)]
    pub unconditional: bool,
    /// Append requests in flight per connection (the blocking client supports 1, raw up to
    /// 256, the server's default per-connection budget).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub inflight: u64,
    /// The load generator: `blocking` (our blocking client, one thread per connection, as
    /// the reference's published numbers), `raw` (pre-encoded frames, cheapest, pipelined)
    /// or `async` (our pipelined AsyncClient on one executor thread).
    #[arg(long, value_enum, default_value = "blocking")]
    pub client: crate::append::ClientKind,
    /// Executor threads of `--client async` (connections are spread over them).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub executor_threads: u64,
}

/// Options of `tephra-bench append`.
#[derive(Debug, Args)]
pub struct AppendArgs {
    /// Server address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: String,
    /// Connections (writers).
    #[arg(long, short = 'c', value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub connections: u64,
    /// Events per append request.
    #[arg(long, short = 'b', value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,
    /// What each append sends and how.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Measured seconds.
    #[arg(long, value_name = "S", default_value = "15", value_parser = parse_seconds)]
    pub duration: f64,
    /// Unmeasured seconds before the window.
    #[arg(long, value_name = "S", default_value = "3", value_parser = parse_nonneg_seconds)]
    pub warmup: f64,
    /// Pause of a writer after a failed request, in ms.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub error_backoff_ms: u64,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tephra-bench read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Server address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: String,
    /// Events to append first (the log to read); 0 reads what is there.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub populate: u64,
    /// Payload bytes per populated event.
    #[arg(long, value_name = "BYTES", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(0..=4 << 20))]
    pub event_size: u64,
    /// Every N-th populated event carries this run's needle tag (the selective read's
    /// target); 0 = none.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub needle_every: u64,
    /// Full scans of the whole log.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub scan_repeats: u64,
    /// Needle reads.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub selective_reads: u64,
    /// Subscribers in the fan-out phase (0 skips it).
    #[arg(long, value_name = "M", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub subscribers: u64,
    /// Appends the fan-out writer sends, one at a time.
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub sub_appends: u64,
    /// Events per fan-out append.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub sub_batch: u64,
    /// Seconds subscribers may take to go live, and to receive everything.
    #[arg(long, value_name = "S", default_value = "30", value_parser = parse_seconds)]
    pub sub_timeout: f64,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tephra-bench compare`.
#[derive(Debug, Args)]
#[command(mut_args(|a| COMPARE_RUN.describe(a)))]
pub struct CompareArgs {
    /// Our server, the directories and the rounds.
    #[command(flatten)]
    pub run: RunArgs,
    /// The reference `tephra-server` [default: $TEPHRA_REFERENCE_SERVER, else
    /// ~/.tephra-reference/bin/tephra-server].
    #[arg(long, value_name = "PATH")]
    pub reference: Option<PathBuf>,
    /// The matrix, CONNECTIONSxBATCH comma separated.
    #[arg(long, value_name = "LIST", default_value = "16x1,16x64,16x512,64x512")]
    pub matrix: String,
    /// What each append sends and how.
    #[command(flatten)]
    pub load: LoadArgs,
    /// `TEPHRA__SEGMENT__SIZE` for both servers, bytes (the published table: 256 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub segment_size: u64,
    /// More environment for both servers, KEY=VALUE (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub server_env: Vec<(String, String)>,
    /// Pause between runs, ms (after the data directory is removed and synced).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub settle_ms: u64,
    /// Keep every run's data directory.
    #[arg(long)]
    pub keep_data: bool,
    /// Also compare the read side each round (`tephra-bench read` on a fresh server:
    /// scans, selective reads, subscription fan-out).
    #[arg(long)]
    pub read: bool,
    /// Events the read phase populates [default: 1000000, quick: 200000].
    #[arg(long, value_name = "N")]
    pub read_populate: Option<u64>,
    /// Print the JSON report on stdout instead of the markdown table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `tephra-bench fsync`.
#[derive(Debug, Args)]
pub struct FsyncArgs {
    /// Directory on the filesystem to measure (test files are created and removed there).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Seconds to measure each row [default: 1].
    #[arg(long, value_name = "S", conflicts_with = "commits", value_parser = parse_seconds)]
    pub seconds: Option<f64>,
    /// Commits to measure in each row, instead of a time budget.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub commits: Option<u64>,
    /// Print the result as JSON on stdout (warnings also go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Block (write) sizes, comma separated, multiples of 4 KiB (suffixes k, m).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "4k,16k,64k,256k,1m",
        value_parser = parse_block_size
    )]
    pub block_sizes: Vec<usize>,
    /// At most this many MiB are written (and preallocated) per row.
    #[arg(long, value_name = "MIB", default_value_t = crate::fsync::DEFAULT_MAX_ROW_MIB,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_row_mib: u64,
}

/// Parses a `KEY=VALUE` pair.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Parses a finite number of seconds in [0, 86400].
pub fn parse_nonneg_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=86_400.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be a number of seconds in [0, 86400]".into())
    }
}

/// Parses a positive, finite number of seconds.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds in (0, 86400]".into())
    }
}

/// Parses a block size like `4096`, `4k`, `64K`, `1m`, `1MiB`; it must be a positive
/// multiple of 4096 and at most 64 MiB.
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = if let Some(n) = t.strip_suffix('k') {
        (n, 1usize << 10)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1usize << 20)
    } else {
        (t, 1)
    };
    let n: usize = num.trim().parse().map_err(|_| format!("invalid block size {s:?}"))?;
    let v = n.checked_mul(mult).ok_or_else(|| format!("block size {s:?} too large"))?;
    if v == 0 || v % 4096 != 0 || v > 64 << 20 {
        return Err(format!("block size {s:?} must be a multiple of 4 KiB, at most 64 MiB"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("4k"), Ok(4096));
        assert_eq!(parse_block_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_block_size("8192"), Ok(8192));
        assert!(parse_block_size("1000").is_err());
        assert!(parse_block_size("0").is_err());
        assert!(parse_block_size("x").is_err());
    }

    #[test]
    fn append_and_compare_parse() {
        let c = Cli::try_parse_from(["tephra-bench", "append", "--addr", "127.0.0.1:1", "-c", "4", "-b", "64", "--duration", "0.5"]).unwrap();
        match c.command {
            Command::Append(a) => {
                assert_eq!((a.connections, a.batch, a.load.event_size, a.load.inflight), (4, 64, 256, 1));
                assert!(!a.load.unconditional);
                assert_eq!(a.duration, 0.5);
            }
            _ => panic!("wrong subcommand"),
        }
        assert!(Cli::try_parse_from(["tephra-bench", "append", "--addr", "x", "--batch", "0"]).is_err());
        assert!(Cli::try_parse_from(["tephra-bench", "append", "--addr", "x", "--duration", "-1"]).is_err());
        let c = Cli::try_parse_from(["tephra-bench", "compare", "--quick", "--server-env", "A=b=c"]).unwrap();
        match c.command {
            Command::Compare(a) => {
                assert!(a.run.quick);
                assert_eq!(a.server_env, vec![("A".to_owned(), "b=c".to_owned())]);
            }
            _ => panic!("wrong subcommand"),
        }
        assert!(Cli::try_parse_from(["tephra-bench", "compare", "--server-env", "=x"]).is_err());
    }

    #[test]
    fn run_defaults_fill_in_what_is_left_out() {
        let target = Path::new("/t");
        let c = Cli::try_parse_from(["tephra-bench", "journal", "--quick", "--warmup", "0"]).unwrap();
        let Command::Journal(a) = c.command else { panic!("wrong subcommand") };
        let plan = JOURNAL_RUN.plan(&a.run, target);
        let want = RunPlan {
            dir: "/t/bench-journal/data".into(),
            out: "/t/bench-journal".into(),
            rounds: 2,
            duration: Duration::from_secs(3),
            warmup: Duration::ZERO,
        };
        assert_eq!(plan, want);
        let c = Cli::try_parse_from(["tephra-bench", "compare", "--rounds", "5", "--out", "/o"]).unwrap();
        let Command::Compare(a) = c.command else { panic!("wrong subcommand") };
        let plan = COMPARE_RUN.plan(&a.run, target);
        let want =
            RunPlan { dir: "/t/bench-compare/data".into(), out: "/o".into(), rounds: 5, duration: Duration::from_secs(15), warmup: Duration::from_secs(3) };
        assert_eq!(plan, want);
    }

    #[test]
    fn help_names_each_subcommands_defaults() {
        let mut cli = Cli::command();
        let help = |cmd: &mut clap::Command, name: &str| cmd.find_subcommand_mut(name).unwrap().render_help().to_string();
        let journal = help(&mut cli, "journal");
        assert!(journal.contains("Measured seconds per run [default: 10, quick: 3]"), "{journal}");
        assert!(journal.contains("Short settings: 2 rounds × 3 s after 1 s of warm-up"), "{journal}");
        assert!(journal.contains("[default: target/bench-journal/data]"), "{journal}");
        let cluster = help(&mut cli, "cluster");
        assert!(cluster.contains("Short settings: 1 rounds × 2 s after 1 s of warm-up"), "{cluster}");
        assert!(cluster.contains("[default: target/bench-cluster/data]"), "{cluster}");
        let compare = help(&mut cli, "compare");
        assert!(compare.contains("Warm-up seconds per run [default: 3, quick: 2]"), "{compare}");
        assert!(compare.contains("ours first [default: 3, quick: 2]"), "{compare}");
    }

    #[test]
    fn seconds_and_commits_conflict() {
        let r = Cli::try_parse_from(["tephra-bench", "fsync", "--dir", "/x", "--seconds", "1", "--commits", "3"]);
        assert!(r.is_err());
        let ok = Cli::try_parse_from(["tephra-bench", "fsync", "--dir", "/x", "--commits", "3"]).unwrap();
        match ok.command {
            Command::Fsync(a) => {
                assert_eq!(a.commits, Some(3));
                assert_eq!(a.block_sizes.len(), 5);
            }
            _ => panic!("wrong subcommand"),
        }
    }
}
