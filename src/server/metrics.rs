//! The Prometheus text endpoint on its own port (`metrics.bind`; docs/operations.md §8.2).
//!
//! A bare HTTP/1.1 responder: an accepting thread, and a short-lived thread per connection
//! (at most 64 at once), each given 5 s for its whole request line and a 5 s write timeout:
//! `GET /metrics` gets the
//! exposition (`text/plain; version=0.0.4`), any other target 404, a request line without a
//! target no answer; one response per connection. It carries
//! the reference's metric names plus what operators need and the reference lacks: append and
//! fsync latency histograms, events per batch, and conflict counters.

use super::Context;
use std::fmt::Write as _;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Binds `addr` and serves scrapes on a background thread; returns the bound address.
///
/// # Errors
/// The bind error.
pub fn serve(ctx: Arc<Context>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new().name("tephra-metrics".into()).spawn(move || {
        while !ctx.is_shutting_down() {
            match listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                    // Each connection on a thread of its own, so one that never sends its
                    // request holds up only itself for its 5 s, not every scrape behind it
                    // (review: 3 idle connections delayed a scrape 15 s, as the reference's
                    // single responder does). Past the cap, served here in turn.
                    if live.fetch_add(1, Ordering::SeqCst) < METRICS_CONNECTIONS {
                        let (ctx, held) = (ctx.clone(), live.clone());
                        let spawned = std::thread::Builder::new().name("tephra-metrics-conn".into()).spawn(move || {
                            let _ = respond(&ctx, s);
                            held.fetch_sub(1, Ordering::SeqCst);
                        });
                        if spawned.is_err() {
                            live.fetch_sub(1, Ordering::SeqCst);
                        }
                    } else {
                        let _ = respond(&ctx, s);
                        live.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    })?;
    Ok(local)
}

/// Metrics connections answered at once, each on its own thread.
const METRICS_CONNECTIONS: usize = 64;

/// The whole request line must arrive within this, however it trickles in.
const REQUEST_LINE_WITHIN: Duration = Duration::from_secs(5);

/// The longest request line read, in bytes.
const REQUEST_LINE_MAX: usize = 8192;

/// Reads the request line (up to `\n`, at most [`REQUEST_LINE_MAX`] bytes) within
/// [`REQUEST_LINE_WITHIN`] in all: a per-read timeout alone let a client sending a byte every
/// few seconds hold its thread for as long as it liked (review: 70 such clients kept every
/// scrape out).
fn request_line(s: &mut std::net::TcpStream) -> std::io::Result<String> {
    let deadline = std::time::Instant::now() + REQUEST_LINE_WITHIN;
    let mut line = Vec::new();
    let mut b = [0u8; 512];
    while !line.contains(&b'\n') && line.len() < REQUEST_LINE_MAX {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        let n = match std::io::Read::read(s, &mut b) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        line.extend_from_slice(&b[..n]);
    }
    let end = line.iter().position(|&c| c == b'\n').map_or(line.len().min(REQUEST_LINE_MAX), |i| i + 1);
    Ok(String::from_utf8_lossy(&line[..end]).into_owned())
}

fn respond(ctx: &Context, mut s: std::net::TcpStream) -> std::io::Result<()> {
    let line = request_line(&mut s)?;
    // A line without a target is not an HTTP request: close without an answer, as the
    // reference does (its parser refuses the line).
    let Some(target) = line.split_whitespace().nth(1) else { return Ok(()) };
    if target == "/metrics" {
        let body = render(ctx);
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.len(),
            body
        )
    } else {
        let body = "not found\n";
        write!(s, "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", body.len(), body)
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

fn histogram(out: &mut String, name: &str, help: &str, h: &hdrhistogram::Histogram<u64>, scale: f64, bounds: &[u64]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for &b in bounds {
        let c = h.count_between(0, b);
        let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {c}", b as f64 / scale);
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.len());
    // `+ 0.0`: an empty float sum is -0.0, which would print as "-0".
    let sum: f64 = h.iter_recorded().map(|v| v.value_iterated_to() as f64 * v.count_at_value() as f64).sum::<f64>() / scale + 0.0;
    let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {}", h.len());
}

/// Renders the exposition text.
pub fn render(ctx: &Context) -> String {
    let st = ctx.stats();
    let mut out = String::new();
    metric(&mut out, "tephra_events_total", "counter", "Events in the log (the durable head position).", st.event_count);
    metric(&mut out, "tephra_segments", "gauge", "Segment files in the data directory.", st.segment_count);
    metric(&mut out, "tephra_disk_bytes", "gauge", "Bytes of regular files at the top of the data directory.", st.disk_bytes);
    metric(&mut out, "tephra_uptime_seconds", "gauge", "Seconds since the server started.", st.uptime_seconds);
    metric(&mut out, "tephra_active_connections", "gauge", "Open client connections.", st.active_connections);
    metric(&mut out, "tephra_active_subscriptions", "gauge", "Live subscriptions.", st.active_subscriptions);
    metric(&mut out, "tephra_connections_refused_total", "counter", "Connections closed at the max_connections cap.", st.connections_refused);
    metric(&mut out, "tephra_connections_reaped_total", "counter", "Connections closed by a timeout.", st.connections_reaped);
    let cap = if st.max_connections == 0 { "+Inf".to_string() } else { st.max_connections.to_string() };
    metric(&mut out, "tephra_max_connections", "gauge", "Configured connection cap (+Inf when unlimited).", cap);
    let _ = writeln!(out, "# HELP tephra_build_info Build information.\n# TYPE tephra_build_info gauge\ntephra_build_info{{version=\"{}\"}} 1", st.version);
    // Health an operator alerts on: the protocol's stats cannot say either (its fields are
    // the reference's), so `--healthcheck` passes in both states.
    metric(
        &mut out,
        "tephra_writer_stopped",
        "gauge",
        "1 once the writer stopped accepting appends after a failed write or sync (fail-stop, until a restart), else 0.",
        u64::from(ctx.store.failure().is_some()),
    );
    metric(&mut out, "tephra_follower_refresh_failures", "gauge", "A follower's failed refreshes in a row, every poll of one stopped at a damaged record included (it serves what it had meanwhile); 0 while it follows and on a writer.", ctx.store.refresh_failures());
    let m = ctx.store.metrics().snapshot();
    metric(&mut out, "tephra_commits_total", "counter", "Group commits made durable.", m.commits);
    metric(&mut out, "tephra_conflicts_total", "counter", "Appends refused by a boundary condition (CONFLICT).", m.conflicts);
    metric(&mut out, "tephra_already_exists_total", "counter", "Appends refused by an existence condition (ALREADY_EXISTS).", m.already_exists);
    metric(
        &mut out,
        "tephra_read_disk_fetches_total",
        "counter",
        "Reads and subscription polls that stopped at data only the disk held and had it fetched on a blocking thread.",
        ctx.read_disk_fetches.load(Ordering::Relaxed),
    );
    let errors: u64 = ctx.append_errors.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    metric(&mut out, "tephra_append_errors_total", "counter", "Append requests answered with an error.", errors);
    let us = [100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];
    histogram(&mut out, "tephra_fsync_seconds", "fdatasync latency per group commit.", &m.fsync_us, 1e6, &us);
    histogram(&mut out, "tephra_batch_events", "Events per group commit.", &m.batch_events, 1.0, &[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]);
    if let Ok(h) = ctx.append_latency.lock() {
        histogram(&mut out, "tephra_append_latency_seconds", "Append latency from request to durable ack.", &h, 1e6, &us);
    }
    if let Some(j) = ctx.journals.get() {
        journal_metrics(&mut out, j, &us);
    }
    out
}

/// The journal calls: answered by kind and outcome, reads waiting at a tail, write latency,
/// and records per group commit of the journal log (docs/journals.md §6).
fn journal_metrics(out: &mut String, j: &super::journal::Journals, us: &[u64]) {
    let name = "tephra_journal_calls_total";
    let _ = writeln!(out, "# HELP {name} Journal calls answered, by call and outcome.\n# TYPE {name} counter");
    for (kind, row) in super::journal::CALL_KINDS.iter().zip(&j.metrics.calls) {
        for (n, c) in row.iter().enumerate() {
            let v = c.load(Ordering::Relaxed);
            if v > 0 {
                let outcome = crate::proto::JournalOutcome::try_from(n as i32).map_or_else(|_| n.to_string(), |o| format!("{o:?}"));
                let _ = writeln!(out, "{name}{{call=\"{kind}\",outcome=\"{outcome}\"}} {v}");
            }
        }
    }
    metric(out, "tephra_journal_waiting_reads", "gauge", "Journal reads waiting at a tail.", j.metrics.waiting_reads.load(Ordering::Relaxed));
    if let Ok(h) = j.metrics.write_latency.lock() {
        histogram(out, "tephra_journal_write_latency_seconds", "Journal write latency from request to answer.", &h, 1e6, us);
    }
    if let Ok(h) = j.commit_commands().lock() {
        histogram(out, "tephra_journal_commit_commands", "Journal commands per group commit.", &h, 1.0, &[1, 4, 16, 64, 256, 1024, 4096]);
    }
    let disk = j.disk();
    metric(out, "tephra_journal_log_segments", "gauge", "Segment files of the journal command log.", j.log_segments() as u64);
    metric(out, "tephra_journal_checkpoints_total", "counter", "Journal checkpoints written.", disk.checkpoints.load(Ordering::Relaxed));
    metric(out, "tephra_journal_segments_deleted_total", "counter", "Journal log segments given back.", disk.segments_deleted.load(Ordering::Relaxed));
    metric(
        out,
        "tephra_journal_items_relocated_total",
        "counter",
        "Durable items a cluster node wrote again at its log's head to give a segment back.",
        disk.relocated.load(Ordering::Relaxed),
    );
    if let Some(st) = j.node_status() {
        cluster_metrics(out, &st);
    }
}

/// A cluster member's consensus groups (docs/journals.md §9.6): per group its role, leader,
/// term, commit and apply lag, and proposals waiting; and the node's counters.
fn cluster_metrics(out: &mut String, st: &crate::cluster::node::NodeStatus) {
    metric(out, "tephra_cluster_node_id", "gauge", "This node's id in its cluster.", st.node);
    metric(out, "tephra_cluster_leader_changes_total", "counter", "Leader changes seen by this node's groups.", st.leader_changes);
    metric(out, "tephra_cluster_busy_total", "counter", "Journal writes answered BUSY by admission.", st.busy);
    metric(out, "tephra_cluster_unserved_total", "counter", "Journal reads answered UNSERVED.", st.unserved);
    metric(out, "tephra_cluster_snapshots_sent_total", "counter", "Snapshots sent to followers whose next entry was compacted.", st.snapshots.sent);
    metric(out, "tephra_cluster_snapshots_installed_total", "counter", "Snapshots installed here from a leader.", st.snapshots.installed);
    metric(out, "tephra_cluster_compactions_total", "counter", "Journal group logs compacted here.", st.snapshots.compacted);
    type Gauge = fn(&crate::cluster::replica::GroupStatus) -> u64;
    let rows: [(&str, &str, Gauge); 5] = [
        ("tephra_cluster_group_leader", "The node this node believes leads the group (0: none known).", |g| g.leader.unwrap_or(0)),
        ("tephra_cluster_group_is_leader", "1 when this node leads the group.", |g| u64::from(g.role == raft::StateRole::Leader)),
        ("tephra_cluster_group_term", "The group's current term here.", |g| g.term),
        ("tephra_cluster_group_apply_lag", "Entries known decided but not yet applied here.", |g| g.commit.saturating_sub(g.applied)),
        ("tephra_cluster_group_pending", "This node's proposals waiting for a verdict.", |g| g.pending as u64),
    ];
    for (name, help, value) in rows {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (id, g) in &st.groups {
            let _ = writeln!(out, "{name}{{tenant=\"{:016x}\",journal=\"{:016x}\"}} {}", id.tenant, id.journal, value(g));
        }
    }
}
