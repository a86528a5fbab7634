//! `tephra-bench index prepare`: writes the benchmark's log into a data directory through
//! our server, then records [`Manifest`] (`prepare.json`) next to the segments.
//!
//! Our `tephra-server` is started on the directory (`--bind 127.0.0.1:0`, the requested
//! segment size); `connections` blocking clients take chunks of `batch` consecutive events
//! (by logical index) from a shared counter and append each chunk as one unconditional
//! request. Every acknowledgement gives the chunk's first position ([`Batch`]). Once the
//! server's event count equals the events sent it is stopped (SIGTERM), and everything in
//! the directory that is not a segment file (`LOCK`, index folders) is removed, so the
//! directory holds only the log, the manifest and `prepare-server.log`.
//!
//! An existing directory whose manifest describes the same log, with its segment files
//! untouched, is reused as it is.

use super::layout::{self, Batch, Layout, Manifest, PositionMap, MANIFEST_FILE, MANIFEST_FORMAT};
use crate::server::{ServerProcess, ServerSpec};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tephra::client::Client;

/// How long one append of `prepare` may go without an answer before it fails as hung.
pub const APPEND_TIMEOUT: Duration = Duration::from_secs(300);

/// Name of the prepare server's log in the prepared directory.
pub const SERVER_LOG: &str = "prepare-server.log";

/// Everything `prepare` needs.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// The data directory to fill.
    pub dir: PathBuf,
    /// The log to write.
    pub layout: Layout,
    /// Segment size, bytes.
    pub segment_bytes: u64,
    /// Our `tephra-server`.
    pub server: PathBuf,
    /// Appending connections.
    pub connections: usize,
    /// Events per append request.
    pub batch: u64,
    /// Remove whatever `dir` holds when it is not a matching prepared directory.
    pub force: bool,
    /// How long the server may take to start.
    pub start_timeout: Duration,
}

/// What `prepare` did.
#[derive(Debug, Clone)]
pub enum Prepared {
    /// The directory already held this log.
    Reused(Manifest),
    /// The log was written now.
    Written(Manifest),
}

impl Prepared {
    /// The manifest either way.
    pub fn manifest(&self) -> &Manifest {
        match self {
            Prepared::Reused(m) | Prepared::Written(m) => m,
        }
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let (d, t) = utc_parts();
    format!("{}-{:02}-{:02}T{:02}:{:02}:{:02}Z", d.0, d.1, d.2, t.0, t.1, t.2)
}

/// The current UTC time as `YYYYMMDDTHHMMSSZ` (the `bench-results/` stamp).
pub fn utc_stamp() -> String {
    let (d, t) = utc_parts();
    format!("{}{:02}{:02}T{:02}{:02}{:02}Z", d.0, d.1, d.2, t.0, t.1, t.2)
}

fn utc_parts() -> ((i64, u32, u32), (u64, u64, u64)) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    ((year, month, day), (rem / 3600, rem % 3600 / 60, rem % 60))
}

/// Removes every entry of `dir` that is not a segment file and not in `keep`.
///
/// # Errors
/// Listing or removing fails.
pub fn remove_all_but_segments(dir: &Path, keep: &[&str]) -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))? {
        let e = e.map_err(|e| format!("list {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if layout::is_segment_name(&name) || keep.contains(&name.as_str()) {
            continue;
        }
        let p = e.path();
        let r = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        r.map_err(|err| format!("remove {}: {err}", p.display()))?;
        removed.push(name);
    }
    removed.sort();
    Ok(removed)
}

/// Prepares `cfg.dir` (or finds it already prepared). `progress` gets one line now and then.
///
/// # Errors
/// A bad configuration, a directory that holds something else (without `force`), a server
/// that does not start, a failed append, or a server that ends up holding a different
/// number of events than were sent.
pub fn run(cfg: &PrepareConfig, stop: &AtomicBool, progress: &mut dyn FnMut(&str)) -> Result<Prepared, String> {
    cfg.layout.validate()?;
    if cfg.connections == 0 || cfg.batch == 0 {
        return Err("--connections and --batch must be at least 1".into());
    }
    // A request is at most a quarter of a segment (the reference's record bound is a
    // quarter; its batch bound is the whole segment).
    let framed = cfg.layout.event_bytes + 64;
    if cfg.batch.saturating_mul(framed) > cfg.segment_bytes / 4 {
        return Err(format!("--batch {} × ~{framed} bytes exceeds a quarter of --segment-bytes {}; use a smaller batch", cfg.batch, cfg.segment_bytes));
    }
    if cfg.dir.exists() {
        let has_entries = std::fs::read_dir(&cfg.dir).map_err(|e| format!("list {}: {e}", cfg.dir.display()))?.next().is_some();
        match Manifest::load(&cfg.dir) {
            Ok(m) if m.format == MANIFEST_FORMAT && m.layout == cfg.layout && m.segment_bytes == cfg.segment_bytes && m.check_segments(&cfg.dir).is_ok() => {
                return Ok(Prepared::Reused(m));
            }
            Ok(_) if cfg.force => {}
            Ok(m) => {
                let why = if let Err(e) = m.check_segments(&cfg.dir) {
                    e
                } else {
                    format!(
                        "its manifest describes another log ({} events, {} tags, {}-byte events, {} B segments, seed {})",
                        m.layout.events, m.layout.tags, m.layout.event_bytes, m.segment_bytes, m.layout.seed
                    )
                };
                return Err(format!("{} is prepared differently: {why}; pass --force to rebuild it", cfg.dir.display()));
            }
            Err(_) if has_entries && !cfg.force => {
                return Err(format!("{} is not empty and holds no {MANIFEST_FILE}; pass --force to replace what it holds", cfg.dir.display()));
            }
            Err(_) => {}
        }
        if has_entries {
            progress(&format!("removing the old contents of {}", cfg.dir.display()));
            std::fs::remove_dir_all(&cfg.dir).map_err(|e| format!("remove {}: {e}", cfg.dir.display()))?;
        }
    }
    std::fs::create_dir_all(&cfg.dir).map_err(|e| format!("create {}: {e}", cfg.dir.display()))?;
    write_log(cfg, stop, progress).map(Prepared::Written)
}

fn write_log(cfg: &PrepareConfig, stop: &AtomicBool, progress: &mut dyn FnMut(&str)) -> Result<Manifest, String> {
    let t0 = Instant::now();
    let l = cfg.layout;
    let mut server = ServerProcess::start_with_timeout(
        &ServerSpec {
            binary: cfg.server.clone(),
            data_dir: cfg.dir.clone(),
            env: vec![("TEPHRA__SEGMENT__SIZE".into(), cfg.segment_bytes.to_string())],
            log_file: cfg.dir.join(SERVER_LOG),
        },
        cfg.start_timeout,
    )?;
    let addr = server.addr;
    let mut control = Client::connect(addr).map_err(|e| format!("connect to {addr}: {e}"))?;
    let server_version = control.server_version().to_owned();
    let head0 = control.stats().map_err(|e| format!("stats: {e}"))?.event_count;
    if head0 != 0 {
        return Err(format!("{} already holds {head0} events", cfg.dir.display()));
    }
    progress(&format!(
        "prepare: {} events of {} bytes into {} ({} connections × {} events per append, server {server_version} at {addr})",
        l.events,
        l.event_bytes,
        cfg.dir.display(),
        cfg.connections,
        cfg.batch
    ));
    let chunks = l.events.div_ceil(cfg.batch);
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let batches = Mutex::new(Vec::with_capacity(chunks as usize));
    let t_append = Instant::now();
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cfg.connections)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let mut client = Client::connect(addr).map_err(|e| format!("connect: {e}"))?;
                    client.set_timeout(Some(APPEND_TIMEOUT)).map_err(|e| format!("set the request timeout: {e}"))?;
                    let mut mine = Vec::new();
                    let r = loop {
                        if stop.load(Ordering::Relaxed) || failed.load(Ordering::Relaxed) {
                            break Ok(());
                        }
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            break Ok(());
                        }
                        let k0 = c * cfg.batch;
                        let n = cfg.batch.min(l.events - k0);
                        let events: Vec<_> = (k0..k0 + n).map(|k| l.event(k)).collect();
                        match client.append(events, None) {
                            Ok(r) if r.last.get() + 1 - r.first.get() == n => {
                                mine.push(Batch { k0, first: r.first.get(), n });
                                done.fetch_add(n, Ordering::Relaxed);
                            }
                            Ok(r) => break Err(format!("append of {n} events acknowledged as positions {}..={}", r.first.get(), r.last.get())),
                            Err(e) => break Err(format!("append: {e}")),
                        }
                    };
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    batches.lock().expect("lock").extend(mine);
                    r
                })
            })
            .collect();
        // Progress every 2 s until the workers are done.
        let mut last = Instant::now();
        while workers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if last.elapsed() >= Duration::from_secs(2) {
                last = Instant::now();
                let d = done.load(Ordering::Relaxed);
                let secs = t_append.elapsed().as_secs_f64();
                progress(&format!("  {d} / {} events ({:.0}%), {:.0} events/s", l.events, 100.0 * d as f64 / l.events as f64, d as f64 / secs));
            }
        }
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err("append thread panicked".into()))).collect()
    });
    let append_seconds = t_append.elapsed().as_secs_f64();
    for r in results {
        r?;
    }
    if stop.load(Ordering::Relaxed) {
        return Err("interrupted".into());
    }
    let head = control.stats().map_err(|e| format!("stats: {e}"))?.event_count;
    if head != l.events {
        return Err(format!("the server holds {head} events after {} were acknowledged", l.events));
    }
    drop(control);
    let code = server.stop();
    if code != Some(0) {
        return Err(format!("the prepare server exited with {code:?} (log: {})", server.log_file().display()));
    }
    let removed = remove_all_but_segments(&cfg.dir, &[SERVER_LOG])?;
    if !removed.is_empty() {
        progress(&format!("  removed from the prepared directory: {}", removed.join(", ")));
    }
    let mut batches = batches.into_inner().expect("lock");
    batches.sort_by_key(|b| b.first);
    let map = PositionMap::new(&batches, l.events)?;
    let (rare_tag_positions, rare_type_positions) = layout::positions_of(&l, &map);
    let segments = layout::segment_files(&cfg.dir)?;
    let m = Manifest {
        format: MANIFEST_FORMAT,
        layout: l,
        segment_bytes: cfg.segment_bytes,
        description: l.describe(),
        rare_tag_positions,
        rare_type_positions,
        type_counts: layout::type_counts(&l),
        batches,
        segments,
        server_version,
        connections: cfg.connections as u64,
        batch_events: cfg.batch,
        append_seconds,
        events_per_sec: l.events as f64 / append_seconds.max(1e-9),
        total_seconds: t0.elapsed().as_secs_f64(),
        created: utc_now(),
    };
    m.store(&cfg.dir)?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_look_right() {
        let s = utc_stamp();
        assert_eq!(s.len(), 16, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z') && s.as_bytes()[8] == b'T');
        let n = utc_now();
        assert_eq!(n.len(), 20, "{n}");
    }
}
