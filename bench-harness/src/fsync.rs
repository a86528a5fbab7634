//! The fsync probe: what can the disk under a directory commit?
//!
//! One *commit* is one write followed by one `fdatasync`, with a single commit in flight,
//! exactly like a group-commit log that waits for durability before acknowledging a batch.
//! For each block (write) size the probe measures four combinations:
//!
//! * **buffered**: `std::fs::File`, `pwrite` + `fdatasync` (through the page cache);
//! * **O_DIRECT**: glommio [`DmaFile`] with an aligned [`DmaBuffer`], `write_at` +
//!   `fdatasync` via io_uring, i.e. the path our writer uses;
//!
//! each on a **preallocated** file (`fallocate` of the whole test range first) and on a
//! **growing** file (every write appends past EOF, so every commit also changes the size).
//! One extra O_DIRECT row rewrites the same partial last 4 KiB block with a small
//! payload added per commit and advances to the next block once it is full, which is what
//! the log does when batches are small.
//!
//! Latencies go into HdrHistograms in microseconds. Files are created as dot-files in the
//! target directory and removed after each row.

// The O_DIRECT rows measure glommio's own DmaFile, which the runtime boundary (clippy.toml)
// otherwise keeps inside the shards crate.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use crate::machine::{Contention, MachineFacts};
use crate::metrics::Latency;
use glommio::io::{DmaBuffer, DmaFile};
use glommio::{LocalExecutor, LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Event size used for the "implied events/s" columns.
pub const EVENT_BYTES: u64 = 256;
/// Block size of the tail-rewrite row.
pub const TAIL_BLOCK: usize = 4096;
/// Bytes appended to the log per commit in the tail-rewrite row (a batch of four
/// 256-byte events); the same 4 KiB block is rewritten `TAIL_BLOCK / TAIL_PAYLOAD` times.
pub const TAIL_PAYLOAD: usize = 1024;
/// Default time budget per row, in seconds.
pub const DEFAULT_SECONDS: f64 = 1.0;
/// Default block sizes: 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB.
pub const DEFAULT_BLOCK_SIZES: [usize; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// Default cap on the bytes one row may write (and preallocate), in MiB.
pub const DEFAULT_MAX_ROW_MIB: u64 = 256;
/// An `fdatasync` p50 below this (µs) is faster than any real flush to stable media.
pub const SUSPICIOUS_SYNC_US: u64 = 20;
/// glommio `io_memory` we ask for: room for a 1 MiB buffer plus slack.
pub const WANTED_IO_MEMORY: usize = 4 << 20;
/// glommio registers `io_memory` as fixed buffers in each of its three rings (main, poll,
/// latency), and the kernel charges RLIMIT_MEMLOCK per registration.
pub const IO_MEMORY_REGISTRATIONS: u64 = 3;
/// glommio refuses to start an executor when RLIMIT_MEMLOCK is below this.
pub const GLOMMIO_MIN_MEMLOCK: u64 = 512 << 10;

/// Which I/O path a row uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// `std::fs::File`: `pwrite` + `fdatasync` through the page cache.
    Buffered,
    /// glommio `DmaFile` (O_DIRECT): `write_at` + `fdatasync` through io_uring.
    Direct,
}

/// How the test file is laid out before the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileLayout {
    /// The whole test range is `fallocate`d (size set) before the first commit.
    Preallocated,
    /// The file starts empty and every commit writes past EOF.
    Growing,
}

/// What each commit writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Each commit writes one fresh full block right after the previous one.
    FullBlocks,
    /// Each commit appends [`TAIL_PAYLOAD`] bytes and rewrites the whole partial last
    /// [`TAIL_BLOCK`] block that holds them, advancing once the block is full.
    TailRewrite,
}

/// One row of the probe: a combination of I/O path, layout, pattern and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RowSpec {
    /// I/O path.
    pub mode: IoMode,
    /// File layout.
    pub layout: FileLayout,
    /// Write pattern.
    pub pattern: Pattern,
    /// Bytes per write.
    pub block_bytes: usize,
    /// New log bytes per commit (equal to `block_bytes` except for the tail-rewrite row).
    pub payload_bytes: usize,
}

impl RowSpec {
    /// A short human label, e.g. `"O_DIRECT prealloc 64 KiB"`.
    pub fn label(&self) -> String {
        let mode = match self.mode {
            IoMode::Buffered => "buffered",
            IoMode::Direct => "O_DIRECT",
        };
        let layout = match self.layout {
            FileLayout::Preallocated => "prealloc",
            FileLayout::Growing => "growing",
        };
        match self.pattern {
            Pattern::FullBlocks => {
                format!("{mode} {layout} {}", human_bytes(self.block_bytes as u64))
            }
            Pattern::TailRewrite => format!("{mode} {layout} {} tail +{} B/commit", human_bytes(self.block_bytes as u64), self.payload_bytes),
        }
    }

    /// Bytes by which the write position advances per commit (on average).
    fn advance(&self) -> u64 {
        self.payload_bytes as u64
    }
}

/// Formats a byte count as `"4 KiB"`, `"1 MiB"`, or `"512 B"`.
pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 && n % (1 << 30) == 0 {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// The rows the probe runs, in order: for each block size buffered/O_DIRECT ×
/// preallocated/growing, then the O_DIRECT tail-rewrite row.
pub fn plan_rows(block_sizes: &[usize]) -> Vec<RowSpec> {
    let mut rows = Vec::new();
    for &b in block_sizes {
        for mode in [IoMode::Buffered, IoMode::Direct] {
            for layout in [FileLayout::Preallocated, FileLayout::Growing] {
                rows.push(RowSpec { mode, layout, pattern: Pattern::FullBlocks, block_bytes: b, payload_bytes: b });
            }
        }
    }
    rows.push(RowSpec {
        mode: IoMode::Direct,
        layout: FileLayout::Preallocated,
        pattern: Pattern::TailRewrite,
        block_bytes: TAIL_BLOCK,
        payload_bytes: TAIL_PAYLOAD,
    });
    rows
}

/// How long each row runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Run each row for this many seconds (or until the byte cap).
    Seconds(f64),
    /// Run each row for this many commits (or until the byte cap).
    Commits(u64),
}

/// Settings of one probe run.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeConfig {
    /// Directory the test files are created in.
    pub dir: PathBuf,
    /// Per-row budget.
    pub budget: Budget,
    /// Block sizes to measure.
    pub block_sizes: Vec<usize>,
    /// Cap on bytes written (and preallocated) per row.
    pub max_row_bytes: u64,
}

/// Why a row stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The time budget ran out.
    Time,
    /// The commit budget was reached.
    Commits,
    /// The per-row byte cap was reached.
    Bytes,
    /// An I/O error ended the row.
    Error,
    /// SIGINT/SIGTERM arrived; the probe stops after cleaning up.
    Interrupted,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    crate::signals::record(signal);
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs SIGINT/SIGTERM handlers that make the probe stop after the current commit
/// and remove its files. The handlers reset themselves, so a second signal kills the
/// process the ordinary way.
pub fn install_interrupt_handler() {
    crate::signals::install_handler(on_stop_signal);
}

/// True once SIGINT/SIGTERM arrived (after [`install_interrupt_handler`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// The measurement of one row.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// Human label (see [`RowSpec::label`]).
    pub label: String,
    /// What was measured.
    #[serde(flatten)]
    pub spec: RowSpec,
    /// Whether O_DIRECT was really in effect (glommio silently drops it on tmpfs).
    pub o_direct: bool,
    /// Commits measured.
    pub commits: u64,
    /// Wall time of the measurement loop, in seconds.
    pub elapsed_s: f64,
    /// Bytes handed to the kernel by the measured writes.
    pub bytes_written: u64,
    /// Latency of one commit (write + fdatasync), µs; `None` if no commit completed.
    pub commit_latency: Option<Latency>,
    /// Latency of the fdatasync part alone, µs; `None` if no commit completed.
    pub fdatasync_latency: Option<Latency>,
    /// Implied ceiling: 1 / commit p50.
    pub commits_per_s_p50: f64,
    /// Measured: commits / elapsed.
    pub commits_per_s_measured: f64,
    /// Implied events/s for 256-byte events: payload / 256 × (1 / p50).
    pub events_per_s_p50: f64,
    /// Implied events/s for 256-byte events: payload / 256 × measured commits/s.
    pub events_per_s_measured: f64,
    /// Why the row stopped.
    pub stopped_by: StopReason,
    /// The error that ended the row, if any.
    pub error: Option<String>,
}

/// How the glommio executor was set up for the O_DIRECT rows.
#[derive(Debug, Clone, Serialize)]
pub struct GlommioSetup {
    /// glommio version this binary is built against.
    pub version: &'static str,
    /// RLIMIT_MEMLOCK soft limit before the probe touched it (bytes; `u64::MAX` = unlimited).
    pub memlock_soft_before: u64,
    /// RLIMIT_MEMLOCK soft limit the executor ran with.
    pub memlock_soft: u64,
    /// Whether the probe raised RLIMIT_MEMLOCK.
    pub memlock_raised: bool,
    /// `io_memory` given to the executor (bytes).
    pub io_memory: usize,
    /// Whether glommio registered its `io_memory` as io_uring fixed buffers
    /// (`false` if it logged "registering buffers ... Skipping"). `None` if no executor.
    pub fixed_buffers_registered: Option<bool>,
    /// O_DIRECT alignment the DmaFile probed (bytes), once known.
    pub dma_alignment: Option<u64>,
    /// Why no executor could be built (io_uring blocked, memlock too low...), if so.
    pub executor_error: Option<String>,
}

/// The whole probe result: machine facts, setup, warnings and rows.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// Always `"tephra-bench"`.
    pub tool: &'static str,
    /// Version of `tephra-bench`.
    pub version: &'static str,
    /// Always `"fsync"`.
    pub subcommand: &'static str,
    /// Event size the implied events/s columns assume.
    pub event_bytes: u64,
    /// Settings used.
    pub config: ProbeConfig,
    /// Machine and storage facts.
    pub machine: MachineFacts,
    /// glommio executor setup.
    pub glommio: GlommioSetup,
    /// Other load on the machine just before the first row.
    pub contention_before: Contention,
    /// Other load on the machine just after the last row (includes the probe's own I/O).
    pub contention_after: Contention,
    /// Things that make the numbers untrustworthy (tmpfs, lying caches, ...).
    pub warnings: Vec<String>,
    /// Context for reading the numbers (virtual disk, write-through cache, byte cap hit...).
    pub notes: Vec<String>,
    /// One entry per measured row.
    pub rows: Vec<RowResult>,
}

/// A reason the probe cannot run at all (bad `--dir`); maps to exit code 2.
#[derive(Debug)]
pub struct PreflightError(pub String);

impl std::fmt::Display for PreflightError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PreflightError {}

/// Checks that `dir` exists, is a directory and accepts a new file that can be
/// written and fdatasync'ed (the check file is removed again).
pub fn preflight(dir: &Path) -> Result<(), PreflightError> {
    let shown = dir.display();
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(PreflightError(format!("directory {shown} does not exist"))),
        Err(e) => return Err(PreflightError(format!("cannot access {shown}: {e}"))),
    };
    if !meta.is_dir() {
        return Err(PreflightError(format!("{shown} is not a directory")));
    }
    let probe = dir.join(format!(".tephra-bench-preflight.{}", std::process::id()));
    let res = (|| -> io::Result<()> {
        let f = OpenOptions::new().write(true).create_new(true).open(&probe)?;
        let _guard = RemoveOnDrop(probe.clone());
        f.write_all_at(&[0u8; 4096], 0)?;
        f.sync_data()?;
        Ok(())
    })();
    res.map_err(|e| PreflightError(format!("directory {shown} is not writable (creating, writing and fdatasyncing a test file failed: {e})")))
}

/// Removes a file when dropped (best effort).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Commit and fdatasync histograms plus the stop logic shared by all rows.
struct Recorder {
    commit: Histogram<u64>,
    sync: Histogram<u64>,
    commits: u64,
    bytes: u64,
    start: Instant,
    end: Instant,
}

impl Recorder {
    fn new() -> Self {
        let h = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        let now = Instant::now();
        Self { commit: h(), sync: h(), commits: 0, bytes: 0, start: now, end: now }
    }

    fn start(&mut self) {
        self.start = Instant::now();
        self.end = self.start;
    }

    /// Returns why to stop before the next commit, whose write would end at `next_end`.
    fn should_stop(&self, budget: Budget, next_end: u64, cap: u64) -> Option<StopReason> {
        if interrupted() {
            return Some(StopReason::Interrupted);
        }
        match budget {
            Budget::Commits(n) if self.commits >= n => return Some(StopReason::Commits),
            Budget::Seconds(s) if self.start.elapsed().as_secs_f64() >= s => return Some(StopReason::Time),
            _ => {}
        }
        (next_end > cap).then_some(StopReason::Bytes)
    }

    fn record(&mut self, t0: Instant, t_written: Instant, t_synced: Instant, bytes: usize) {
        let us = |d: Duration| (d.as_micros() as u64).max(1);
        self.commit.saturating_record(us(t_synced - t0));
        self.sync.saturating_record(us(t_synced - t_written));
        self.commits += 1;
        self.bytes += bytes as u64;
        self.end = t_synced;
    }

    fn finish(self, spec: RowSpec, o_direct: bool, stop: StopReason, error: Option<String>) -> RowResult {
        let commit_latency = Latency::from_histogram(&self.commit);
        let fdatasync_latency = Latency::from_histogram(&self.sync);
        let elapsed_s = (self.end - self.start).as_secs_f64();
        let per_commit_events = spec.payload_bytes as f64 / EVENT_BYTES as f64;
        let commits_per_s_p50 = commit_latency.map(|l| 1e6 / l.p50_us as f64).unwrap_or(0.0);
        let commits_per_s_measured = if elapsed_s > 0.0 { self.commits as f64 / elapsed_s } else { 0.0 };
        RowResult {
            label: spec.label(),
            spec,
            o_direct,
            commits: self.commits,
            elapsed_s,
            bytes_written: self.bytes,
            commit_latency,
            fdatasync_latency,
            commits_per_s_p50,
            commits_per_s_measured,
            events_per_s_p50: per_commit_events * commits_per_s_p50,
            events_per_s_measured: per_commit_events * commits_per_s_measured,
            stopped_by: stop,
            error,
        }
    }
}

/// Bytes a row may use: the byte cap, or less when a commit budget needs less.
fn row_range(spec: &RowSpec, budget: Budget, max_row_bytes: u64) -> u64 {
    let block = spec.block_bytes as u64;
    let needed = match budget {
        Budget::Commits(n) => {
            let bytes = n.saturating_mul(spec.advance());
            bytes.div_ceil(block).saturating_mul(block)
        }
        Budget::Seconds(_) => u64::MAX,
    };
    let cap = (max_row_bytes / block) * block;
    needed.min(cap).max(block)
}

fn fill_pattern(buf: &mut [u8], seed: u64) {
    let b = (seed as u8) | 1;
    buf.fill(b);
}

fn test_file(dir: &Path, idx: usize) -> PathBuf {
    dir.join(format!(".tephra-bench-fsync.{}.{idx}.dat", std::process::id()))
}

/// One buffered full-block row (`block` bytes per commit, `commits` commits, written and
/// fdatasynced into a preallocated file under `dir`, removed after): what one commit of a
/// store on `dir` costs, measured without the glommio executor (`tephra-bench cluster` prices
/// its writes with it).
pub fn buffered_commits(dir: &Path, block: usize, commits: u64) -> RowResult {
    let spec = RowSpec { mode: IoMode::Buffered, layout: FileLayout::Preallocated, pattern: Pattern::FullBlocks, block_bytes: block, payload_bytes: block };
    run_buffered_row(&test_file(dir, 0), spec, Budget::Commits(commits), commits.saturating_mul(block as u64))
}

fn run_buffered_row(path: &Path, spec: RowSpec, budget: Budget, max_row_bytes: u64) -> RowResult {
    let mut rec = Recorder::new();
    let range = row_range(&spec, budget, max_row_bytes);
    let res = (|| -> io::Result<StopReason> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        let _guard = RemoveOnDrop(path.to_path_buf());
        if spec.layout == FileLayout::Preallocated {
            nix::fcntl::fallocate(file.as_raw_fd(), nix::fcntl::FallocateFlags::empty(), 0, range as libc::off_t).map_err(io::Error::from)?;
        }
        // Make file creation and allocation durable before timing anything.
        file.sync_all()?;
        let mut buf = vec![0u8; spec.block_bytes];
        fill_pattern(&mut buf, 7);
        let mut off = 0u64;
        rec.start();
        loop {
            if let Some(stop) = rec.should_stop(budget, off + spec.block_bytes as u64, range) {
                return Ok(stop);
            }
            let t0 = Instant::now();
            file.write_all_at(&buf, off)?;
            let t1 = Instant::now();
            file.sync_data()?;
            let t2 = Instant::now();
            rec.record(t0, t1, t2, spec.block_bytes);
            off += spec.block_bytes as u64;
        }
    })();
    match res {
        Ok(stop) => rec.finish(spec, false, stop, None),
        Err(e) => rec.finish(spec, false, StopReason::Error, Some(e.to_string())),
    }
}

async fn run_direct_row(
    path: &Path,
    spec: RowSpec,
    budget: Budget,
    max_row_bytes: u64,
    alignment: &mut Option<u64>,
) -> Result<(Recorder, StopReason), (Recorder, String)> {
    let mut rec = Recorder::new();
    let range = row_range(&spec, budget, max_row_bytes);
    let file = match glommio::io::OpenOptions::new().read(true).write(true).create_new(true).dma_open(path).await {
        Ok(f) => f,
        Err(e) => return Err((rec, format!("open O_DIRECT: {e}"))),
    };
    let _guard = RemoveOnDrop(path.to_path_buf());
    let out = direct_loop(&file, &mut rec, spec, budget, range, alignment).await;
    let closed = file.close().await;
    match (out, closed) {
        (Ok(stop), Ok(())) => Ok((rec, stop)),
        (Err(e), _) => Err((rec, e)),
        (Ok(_), Err(e)) => Err((rec, format!("close: {e}"))),
    }
}

async fn direct_loop(file: &DmaFile, rec: &mut Recorder, spec: RowSpec, budget: Budget, range: u64, alignment: &mut Option<u64>) -> Result<StopReason, String> {
    let align = file.alignment();
    *alignment = Some(align);
    if spec.block_bytes as u64 % align != 0 {
        return Err(format!("block size {} is not a multiple of the device's O_DIRECT alignment {align}", spec.block_bytes));
    }
    if spec.layout == FileLayout::Preallocated {
        file.pre_allocate(range, false).await.map_err(|e| format!("fallocate: {e}"))?;
    }
    file.fdatasync().await.map_err(|e| format!("initial fdatasync: {e}"))?;

    let block = spec.block_bytes;
    match spec.pattern {
        Pattern::FullBlocks => {
            let mut off = 0u64;
            rec.start();
            loop {
                if let Some(stop) = rec.should_stop(budget, off + block as u64, range) {
                    return Ok(stop);
                }
                let mut buf: DmaBuffer = file.alloc_dma_buffer(block);
                fill_pattern(buf.as_bytes_mut(), rec.commits);
                let t0 = Instant::now();
                let n = file.write_at(buf, off).await.map_err(|e| format!("write_at: {e}"))?;
                if n != block {
                    return Err(format!("short O_DIRECT write: {n} of {block} bytes"));
                }
                let t1 = Instant::now();
                file.fdatasync().await.map_err(|e| format!("fdatasync: {e}"))?;
                let t2 = Instant::now();
                rec.record(t0, t1, t2, block);
                off += block as u64;
            }
        }
        Pattern::TailRewrite => {
            let payload = spec.payload_bytes;
            let mut tail = vec![0u8; block];
            let mut log_len = 0u64;
            rec.start();
            loop {
                let block_start = log_len / block as u64 * block as u64;
                if let Some(stop) = rec.should_stop(budget, block_start + block as u64, range) {
                    return Ok(stop);
                }
                let in_block = (log_len - block_start) as usize;
                fill_pattern(&mut tail[in_block..in_block + payload], rec.commits);
                let mut buf: DmaBuffer = file.alloc_dma_buffer(block);
                buf.as_bytes_mut().copy_from_slice(&tail);
                let t0 = Instant::now();
                let n = file.write_at(buf, block_start).await.map_err(|e| format!("write_at: {e}"))?;
                if n != block {
                    return Err(format!("short O_DIRECT write: {n} of {block} bytes"));
                }
                let t1 = Instant::now();
                file.fdatasync().await.map_err(|e| format!("fdatasync: {e}"))?;
                let t2 = Instant::now();
                rec.record(t0, t1, t2, block);
                log_len += payload as u64;
                if log_len % block as u64 == 0 {
                    tail.fill(0);
                }
            }
        }
    }
}

/// Current RLIMIT_MEMLOCK (soft, hard).
fn memlock() -> (u64, u64) {
    use nix::sys::resource::{getrlimit, Resource};
    getrlimit(Resource::RLIMIT_MEMLOCK).unwrap_or((0, 0))
}

/// Makes RLIMIT_MEMLOCK large enough for `wanted` bytes of glommio `io_memory` (raising
/// the hard limit too when privileged), or shrinks `io_memory` to what the limit allows.
/// Returns the setup (without executor fields filled).
pub fn prepare_memlock(wanted: usize) -> GlommioSetup {
    use nix::sys::resource::{setrlimit, Resource};
    let (soft0, hard0) = memlock();
    let slack = 256u64 << 10;
    let need = wanted as u64 * IO_MEMORY_REGISTRATIONS + slack;
    let mut raised = false;
    if soft0 < need {
        // Privileged (CAP_SYS_RESOURCE, e.g. root): raise both. Otherwise up to the hard limit.
        if setrlimit(Resource::RLIMIT_MEMLOCK, need as _, hard0.max(need) as _).is_ok()
            || (hard0 > soft0 && setrlimit(Resource::RLIMIT_MEMLOCK, hard0.min(need) as _, hard0 as _).is_ok())
        {
            raised = true;
        }
    }
    let (soft, _) = memlock();
    let io_memory = if soft >= need {
        wanted
    } else {
        let fit = soft.saturating_sub(slack) / IO_MEMORY_REGISTRATIONS;
        ((fit / 65536) * 65536).max(65536) as usize
    };
    GlommioSetup {
        version: "0.9.0",
        memlock_soft_before: soft0,
        memlock_soft: soft,
        memlock_raised: raised,
        io_memory,
        fixed_buffers_registered: None,
        dma_alignment: None,
        executor_error: None,
    }
}

fn make_executor(setup: &mut GlommioSetup) -> Option<LocalExecutor> {
    if setup.memlock_soft < GLOMMIO_MIN_MEMLOCK {
        setup.executor_error = Some(format!(
            "RLIMIT_MEMLOCK is {} bytes; glommio needs at least {} (raise `ulimit -l` or LimitMEMLOCK=)",
            setup.memlock_soft, GLOMMIO_MIN_MEMLOCK
        ));
        return None;
    }
    let _ = crate::logcapture::take();
    let ex = LocalExecutorBuilder::new(Placement::Unbound).name("fsync-probe").io_memory(setup.io_memory).make();
    let logged = crate::logcapture::take();
    match ex {
        Ok(ex) => {
            setup.fixed_buffers_registered = Some(!logged.iter().any(|l| l.contains("registering buffers")));
            Some(ex)
        }
        Err(e) => {
            setup.executor_error = Some(format!(
                "cannot start a glommio executor (io_uring blocked by seccomp or \
                 kernel.io_uring_disabled? memlock?): {e}"
            ));
            None
        }
    }
}

/// Called after each row with its result (e.g. for progress output).
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize, &RowResult);

/// Runs the probe. `facts` must describe `config.dir`. Call [`preflight`] first.
pub fn run_probe(config: ProbeConfig, facts: MachineFacts, progress: Progress<'_>) -> ProbeReport {
    let contention_before = crate::machine::contention();
    let mut setup = prepare_memlock(WANTED_IO_MEMORY);
    let executor = make_executor(&mut setup);
    let specs = plan_rows(&config.block_sizes);
    let in_memory = facts.fs.in_memory;
    let mut rows = Vec::with_capacity(specs.len());
    for (idx, spec) in specs.iter().copied().enumerate() {
        if interrupted() {
            break;
        }
        let path = test_file(&config.dir, idx);
        let row = match spec.mode {
            IoMode::Buffered => run_buffered_row(&path, spec, config.budget, config.max_row_bytes),
            IoMode::Direct => match &executor {
                None => Recorder::new().finish(spec, false, StopReason::Error, setup.executor_error.clone()),
                Some(ex) => {
                    let mut align = setup.dma_alignment;
                    let r = ex.run(run_direct_row(&path, spec, config.budget, config.max_row_bytes, &mut align));
                    setup.dma_alignment = align;
                    // glommio turns O_DIRECT off on tmpfs without telling.
                    let o_direct = !in_memory;
                    match r {
                        Ok((rec, stop)) => rec.finish(spec, o_direct, stop, None),
                        Err((rec, e)) => rec.finish(spec, o_direct, StopReason::Error, Some(e)),
                    }
                }
            },
        };
        let _ = fs::remove_file(&path);
        progress(idx + 1, specs.len(), &row);
        rows.push(row);
    }
    drop(executor);
    let contention_after = crate::machine::contention();
    let (mut warnings, notes) = assess(&facts, &setup, &config, &rows, crate::logcapture::take());
    if let Some(w) = contention_warning(&facts, &contention_before, &contention_after) {
        warnings.push(w);
    }
    ProbeReport {
        tool: "tephra-bench",
        version: env!("CARGO_PKG_VERSION"),
        subcommand: "fsync",
        event_bytes: EVENT_BYTES,
        config,
        machine: facts,
        glommio: setup,
        contention_before,
        contention_after,
        warnings,
        notes,
        rows,
    }
}

/// Warnings and reading notes for a finished probe.
pub fn assess(facts: &MachineFacts, setup: &GlommioSetup, config: &ProbeConfig, rows: &[RowResult], logged: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    if interrupted() || rows.iter().any(|r| r.stopped_by == StopReason::Interrupted) {
        warnings.push(format!("interrupted by a signal: only {} row(s) ran, the last one cut short", rows.len()));
    }
    if facts.fs.in_memory {
        warnings.push(in_memory_warning(facts));
    }
    if let Some(d) = &facts.device {
        if d.ram_backed {
            warnings.push(format!(
                "{} is a RAM-backed block device: fsync reaches no stable medium; these \
                 numbers are meaningless for durability.",
                d.name
            ));
        }
        if d.virtual_disk {
            notes.push(format!(
                "{} is a virtual disk ({}): the host may acknowledge flushes from its own \
                 cache, so read these as the shape of the curve, not as a device number.",
                d.name,
                d.driver.as_deref().or(d.model.as_deref()).unwrap_or("virtual")
            ));
        }
        if d.write_cache.as_deref() == Some("write through") {
            notes.push(format!(
                "{}: queue/write_cache is \"write through\", so the kernel sends no cache \
                 flushes; fdatasync is only as durable as the device's own claim (fine with \
                 power-loss protection, data loss on power cut without it).",
                d.name
            ));
        }
        if d.loop_device {
            notes.push(format!("{} is a loop device: durability depends on the file and filesystem behind it.", d.name));
        }
    } else if !facts.fs.in_memory {
        notes.push("no backing block device found in sysfs (network, FUSE or virtual filesystem?)".into());
    }
    let fast: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let p50 = r.fdatasync_latency?.p50_us;
            (p50 < SUSPICIOUS_SYNC_US).then(|| format!("{} ({p50} µs)", r.label))
        })
        .collect();
    if !fast.is_empty() {
        warnings.push(format!(
            "fdatasync p50 below {SUSPICIOUS_SYNC_US} µs in {} row(s): {}. No real flush to \
             stable media is that fast; a write cache that acknowledges flushes early (or a \
             RAM-backed filesystem/device) is likely, and these are not durability numbers.",
            fast.len(),
            fast.join(", ")
        ));
    }
    if setup.fixed_buffers_registered == Some(false) {
        warnings.push(format!(
            "glommio could not register its io_memory ({} bytes) as io_uring fixed buffers \
             (RLIMIT_MEMLOCK {} bytes); O_DIRECT rows used unregistered buffers.",
            setup.io_memory, setup.memlock_soft
        ));
    }
    if let Some(e) = &setup.executor_error {
        warnings.push(format!("O_DIRECT rows not measured: {e}"));
    }
    let capped: Vec<&str> = rows.iter().filter(|r| r.stopped_by == StopReason::Bytes).map(|r| r.label.as_str()).collect();
    if !capped.is_empty() && matches!(config.budget, Budget::Seconds(_)) {
        notes.push(format!(
            "{} row(s) stopped at the {} per-row byte cap before the time budget (raise \
             --max-row-mib for more samples): {}",
            capped.len(),
            human_bytes(config.max_row_bytes),
            capped.join(", ")
        ));
    }
    if let Some(big) = config.block_sizes.iter().copied().filter(|&b| b > setup.io_memory).max() {
        notes.push(format!(
            "O_DIRECT blocks larger than glommio's io_memory ({}) come from the ordinary \
             allocator, not from the registered fixed buffers (largest: {}).",
            human_bytes(setup.io_memory as u64),
            human_bytes(big as u64)
        ));
    }
    for l in logged {
        notes.push(format!("log: {l}"));
    }
    (warnings, notes)
}

/// I/O pressure (PSI "some avg10", %) above which we say the disk was shared.
pub const BUSY_IO_PRESSURE: f64 = 5.0;

/// A warning when other work loaded the disk or CPUs just before the run, else `None`.
///
/// Only the sample taken *before* the first row is judged: during and after the run the
/// probe's own fdatasync waits count as I/O pressure and add about 1 to the load average.
pub fn contention_warning(facts: &MachineFacts, before: &Contention, _after: &Contention) -> Option<String> {
    let psi = before.io_pressure_some_avg10.unwrap_or(0.0);
    let load = before.loadavg_1m.unwrap_or(0.0);
    let busy_io = psi >= BUSY_IO_PRESSURE;
    let busy_cpu = load > facts.cpus_online as f64;
    (busy_io || busy_cpu).then(|| {
        format!(
            "the machine was already busy before the probe started (I/O pressure some avg10 \
             {psi:.1}%, 1-min load {load:.2} on {} CPUs): latencies include queueing behind \
             other work; rerun on a quiet machine for device numbers.",
            facts.cpus_online
        )
    })
}

/// The prominent warning printed when the directory is on tmpfs/ramfs.
pub fn in_memory_warning(facts: &MachineFacts) -> String {
    format!(
        "{} is on {}: data lives in RAM, fsync is close to free and O_DIRECT is not in \
         effect. These numbers are MEANINGLESS for durability; run the probe on the \
         storage you will deploy on.",
        facts.dir, facts.fs.magic_name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_has_four_rows_per_size_plus_tail() {
        let rows = plan_rows(&DEFAULT_BLOCK_SIZES);
        assert_eq!(rows.len(), 21);
        assert_eq!(rows.last().unwrap().pattern, Pattern::TailRewrite);
        assert_eq!(rows[0].label(), "buffered prealloc 4 KiB");
        assert_eq!(rows[19].label(), "O_DIRECT growing 1 MiB");
    }

    #[test]
    fn row_range_respects_budget_and_cap() {
        let spec = plan_rows(&[65536])[0];
        assert_eq!(row_range(&spec, Budget::Commits(10), 1 << 30), 10 * 65536);
        assert_eq!(row_range(&spec, Budget::Seconds(1.0), 1 << 20), 1 << 20);
        let tail = *plan_rows(&[]).last().unwrap();
        assert_eq!(row_range(&tail, Budget::Commits(5), 1 << 30), 2 * 4096);
    }

    #[test]
    fn stop_rules() {
        let mut r = Recorder::new();
        r.start();
        assert_eq!(r.should_stop(Budget::Commits(1), 4096, 8192), None);
        assert_eq!(r.should_stop(Budget::Commits(1), 12288, 8192), Some(StopReason::Bytes));
        let t = Instant::now();
        r.record(t, t, t + Duration::from_micros(5), 4096);
        assert_eq!(r.should_stop(Budget::Commits(1), 4096, 8192), Some(StopReason::Commits));
        assert_eq!(r.should_stop(Budget::Seconds(0.0), 4096, 8192), Some(StopReason::Time));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }
}
