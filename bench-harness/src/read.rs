//! `tephra-bench read`: read-side benchmarks against a running server, in three phases.
//!
//! 1. **populate**: append `populate` events (`event_size` zero bytes, type `read-bench`,
//!    unconditional, batches of 512 over 4 connections). Every `needle_every`-th of them
//!    also carries a tag unique to this run, the *needle*.
//! 2. **scan**: read the whole log from position 0, `scan_repeats` times; events/s and
//!    MB/s of encoded events (type + tags + payload). **selective**: read the needle tag
//!    (few matches in a large log) `selective_reads` times; reads/s and latency.
//! 3. **fan-out**: `subscribers` connections subscribe to a fresh tag and wait until they
//!    are live; one writer then appends `sub_appends` requests of `sub_batch` events with
//!    that tag, one at a time. Each delivery is timed against the moment the append that
//!    holds it was acknowledged to the writer: the *delivery lag*. A delivery that beats
//!    the acknowledgement counts as 0 (and in `delivered_before_ack`).
//!
//! Every phase uses the blocking [`tephra::client::Client`].

use crate::metrics::{self, Latency};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tephra::client::{Client, SubEvent};
use tephra::{Event, EventType, Position, Query, QueryItem, Tags};

/// Events per append request while populating.
pub const POPULATE_BATCH: usize = 512;
/// Connections used to populate.
pub const POPULATE_CONNECTIONS: usize = 4;

/// Everything a read run needs.
#[derive(Debug, Clone)]
pub struct ReadConfig {
    /// Server address (`host:port`).
    pub addr: String,
    /// Events to append before reading (0: read what is there).
    pub populate: u64,
    /// Payload bytes per populated event.
    pub event_size: usize,
    /// Every this-many-th populated event carries the needle tag.
    pub needle_every: u64,
    /// Full scans to run.
    pub scan_repeats: usize,
    /// Needle reads to run.
    pub selective_reads: usize,
    /// Subscribers in the fan-out phase (0 skips it).
    pub subscribers: usize,
    /// Append requests the fan-out writer sends.
    pub sub_appends: usize,
    /// Events per fan-out append.
    pub sub_batch: usize,
    /// How long subscribers may take to become live, and to receive everything.
    pub sub_timeout: Duration,
}

/// The full-scan result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    /// Events each scan returned (the last one's count).
    pub events: u64,
    /// Encoded bytes each scan returned (type + tags + payload).
    pub bytes: u64,
    /// Seconds of every scan.
    pub seconds: Vec<f64>,
    /// Events/s of the median scan.
    pub events_per_sec_median: f64,
    /// Events/s of the fastest scan.
    pub events_per_sec_best: f64,
    /// MB/s (10^6 bytes) of the median scan.
    pub mb_per_sec_median: f64,
}

/// The selective-read result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelectiveReport {
    /// Matches each read returned.
    pub matches: u64,
    /// Matches expected from the populate phase.
    pub expected_matches: u64,
    /// Events in the log when the reads ran.
    pub log_events: u64,
    /// Reads done.
    pub reads: u64,
    /// Reads per second, back to back on one connection.
    pub reads_per_sec: f64,
    /// Latency per read (whole stream).
    pub latency: Option<Latency>,
}

/// The subscription fan-out result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FanoutReport {
    /// Subscribers.
    pub subscribers: usize,
    /// Events appended in this phase.
    pub events: u64,
    /// Deliveries received (ideally `subscribers * events`).
    pub deliveries: u64,
    /// Deliveries that arrived before the writer saw the acknowledgement.
    pub delivered_before_ack: u64,
    /// Delivery lag behind the append's acknowledgement.
    pub lag: Option<Latency>,
    /// Latency of the fan-out writer's appends.
    pub append_latency: Option<Latency>,
    /// True when a subscriber timed out before receiving everything.
    pub incomplete: bool,
}

/// The result of `tephra-bench read`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadReport {
    /// The server's version.
    pub server_version: String,
    /// Events appended by this run (populate + fan-out).
    pub events_appended: u64,
    /// Seconds the populate phase took.
    pub populate_seconds: f64,
    /// Full scans.
    pub scan: Option<ScanReport>,
    /// Needle reads.
    pub selective: Option<SelectiveReport>,
    /// Subscription fan-out.
    pub fanout: Option<FanoutReport>,
    /// CPU seconds the harness used.
    pub client_cpu_seconds: f64,
    /// True when SIGINT/SIGTERM cut the run short.
    pub interrupted: bool,
}

fn cerr(what: &str) -> impl Fn(tephra::client::ClientError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Runs the read benchmark.
///
/// # Errors
/// A connection or request fails (the message says which phase).
pub fn run(cfg: &ReadConfig, stop: &AtomicBool) -> Result<ReadReport, String> {
    let cpu0 = metrics::self_cpu_seconds();
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let needle = format!("needle-{run_id}");
    let mut control = Client::connect(cfg.addr.as_str()).map_err(|e| format!("connect to {}: {e}", cfg.addr))?;
    let server_version = control.server_version().to_owned();

    let t = Instant::now();
    let populated = populate(cfg, &run_id, &needle, stop)?;
    let populate_seconds = t.elapsed().as_secs_f64();
    let mut appended = populated;

    let scan = if cfg.scan_repeats > 0 && !stop.load(Ordering::Relaxed) { Some(scan(&mut control, cfg.scan_repeats, stop)?) } else { None };

    let selective = if cfg.selective_reads > 0 && !stop.load(Ordering::Relaxed) {
        let expected = if cfg.needle_every == 0 { 0 } else { cfg.populate.div_ceil(cfg.needle_every) };
        Some(selective(&mut control, &needle, expected, cfg.selective_reads, stop)?)
    } else {
        None
    };

    let fanout = if cfg.subscribers > 0 && cfg.sub_appends > 0 && !stop.load(Ordering::Relaxed) {
        let (rep, n) = fanout(cfg, &run_id, stop)?;
        appended += n;
        Some(rep)
    } else {
        None
    };

    Ok(ReadReport {
        server_version,
        events_appended: appended,
        populate_seconds,
        scan,
        selective,
        fanout,
        client_cpu_seconds: metrics::self_cpu_seconds() - cpu0,
        interrupted: stop.load(Ordering::Relaxed),
    })
}

/// Appends `cfg.populate` events; returns how many were acknowledged.
fn populate(cfg: &ReadConfig, run_id: &str, needle: &str, stop: &AtomicBool) -> Result<u64, String> {
    if cfg.populate == 0 {
        return Ok(0);
    }
    let conns = POPULATE_CONNECTIONS.min(cfg.populate.div_ceil(POPULATE_BATCH as u64) as usize).max(1);
    let per = cfg.populate.div_ceil(conns as u64);
    let ty = EventType::new("read-bench").expect("valid type");
    let payload = vec![0u8; cfg.event_size];
    let bulk = Tags::new([format!("bulk-{run_id}")]).expect("tag");
    let with_needle = Tags::new([format!("bulk-{run_id}"), needle.to_owned()]).expect("tags");
    let plain = Event::new(&ty, &bulk, &payload).map_err(|e| format!("event: {e}"))?;
    let marked = Event::new(&ty, &with_needle, &payload).map_err(|e| format!("event: {e}"))?;
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..conns as u64)
            .map(|c| {
                let (plain, marked) = (plain.clone(), marked.clone());
                s.spawn(move || -> Result<u64, String> {
                    let start = c * per;
                    let end = ((c + 1) * per).min(cfg.populate);
                    let mut client = Client::connect(cfg.addr.as_str()).map_err(|e| format!("populate connect: {e}"))?;
                    let mut i = start;
                    let mut done = 0;
                    while i < end && !stop.load(Ordering::Relaxed) {
                        let n = (end - i).min(POPULATE_BATCH as u64);
                        let events: Vec<Event> =
                            (i..i + n).map(|k| if cfg.needle_every > 0 && k % cfg.needle_every == 0 { marked.clone() } else { plain.clone() }).collect();
                        client.append(events, None).map_err(cerr("populate append"))?;
                        done += n;
                        i += n;
                    }
                    Ok(done)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("populate thread panicked")).collect()
    });
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok(total)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        0.0
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    }
}

fn scan(client: &mut Client, repeats: usize, stop: &AtomicBool) -> Result<ScanReport, String> {
    let mut seconds = Vec::new();
    let (mut events, mut bytes) = (0u64, 0u64);
    for _ in 0..repeats {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        let (mut n, mut b) = (0u64, 0u64);
        for item in client.read(Query::all(), Position::ZERO, None).map_err(cerr("scan"))? {
            let se = item.map_err(cerr("scan"))?;
            n += 1;
            b += se.event.encoded_len() as u64;
        }
        seconds.push(t.elapsed().as_secs_f64());
        events = n;
        bytes = b;
    }
    let med = median(&seconds);
    let best = seconds.iter().copied().fold(f64::INFINITY, f64::min);
    let rate = |x: u64, s: f64| {
        if s > 0.0 && s.is_finite() {
            x as f64 / s
        } else {
            0.0
        }
    };
    Ok(ScanReport {
        events,
        bytes,
        events_per_sec_median: rate(events, med),
        events_per_sec_best: rate(events, best),
        mb_per_sec_median: rate(bytes, med) / 1e6,
        seconds,
    })
}

fn selective(client: &mut Client, needle: &str, expected: u64, reads: usize, stop: &AtomicBool) -> Result<SelectiveReport, String> {
    let q = Query::item(QueryItem::with_tags(Tags::new([needle.to_owned()]).expect("tag")));
    let log_events = client.stats().map_err(cerr("stats"))?.event_count;
    let mut hist = metrics::latency_histogram();
    let mut matches = 0;
    let mut done = 0u64;
    let t0 = Instant::now();
    for _ in 0..reads {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        let (evs, _) = client.read_all(q.clone(), Position::ZERO).map_err(cerr("selective read"))?;
        metrics::record_us(&mut hist, t.elapsed().as_micros() as u64);
        matches = evs.len() as u64;
        done += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(SelectiveReport {
        matches,
        expected_matches: expected,
        log_events,
        reads: done,
        reads_per_sec: if secs > 0.0 { done as f64 / secs } else { 0.0 },
        latency: Latency::from_histogram(&hist),
    })
}

/// Runs the fan-out phase; returns its report and the events it appended.
fn fanout(cfg: &ReadConfig, run_id: &str, stop: &AtomicBool) -> Result<(FanoutReport, u64), String> {
    let tag = Tags::new([format!("fanout-{run_id}")]).expect("tag");
    let query = Query::item(QueryItem::with_tags(tag.clone()));
    let expected = (cfg.sub_appends * cfg.sub_batch) as u64;
    let live = Arc::new(AtomicUsize::new(0));
    let cancels = Arc::new(Mutex::new(Vec::new()));
    let acks: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut subs = Vec::new();
    for i in 0..cfg.subscribers {
        let mut client = Client::connect(cfg.addr.as_str()).map_err(|e| format!("subscriber {i} connect: {e}"))?;
        let (query, live, cancels) = (query.clone(), Arc::clone(&live), Arc::clone(&cancels));
        subs.push(std::thread::spawn(move || -> Result<Vec<(u64, Instant)>, String> {
            let (stream, cancel) = client.subscribe(query, Position::ZERO).map_err(cerr("subscribe"))?;
            cancels.lock().expect("lock").push(cancel);
            let mut got = Vec::with_capacity(expected as usize);
            let mut is_live = false;
            for item in stream {
                match item.map_err(cerr("subscription"))? {
                    SubEvent::CaughtUp(_) => {
                        if !is_live {
                            is_live = true;
                            live.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    SubEvent::Event(se) => {
                        got.push((se.position.get(), Instant::now()));
                        if got.len() as u64 >= expected {
                            break;
                        }
                    }
                }
            }
            Ok(got)
        }));
    }
    let cancel_all = |cancels: &Mutex<Vec<tephra::client::SubscribeCancel>>| {
        for c in cancels.lock().expect("lock").iter() {
            c.cancel();
        }
    };
    // Wait until every subscriber is live.
    let deadline = Instant::now() + cfg.sub_timeout;
    while live.load(Ordering::SeqCst) < cfg.subscribers {
        if Instant::now() > deadline || stop.load(Ordering::Relaxed) {
            cancel_all(&cancels);
            for h in subs {
                let _ = h.join();
            }
            return Err(format!("only {} of {} subscribers became live within {:?}", live.load(Ordering::SeqCst), cfg.subscribers, cfg.sub_timeout));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The writer.
    let ty = EventType::new("fanout").expect("type");
    let ev = Event::new(&ty, &tag, &vec![0u8; cfg.event_size]).map_err(|e| format!("event: {e}"))?;
    let mut writer = Client::connect(cfg.addr.as_str()).map_err(|e| format!("fan-out writer connect: {e}"))?;
    let mut append_hist = metrics::latency_histogram();
    let mut appended = 0u64;
    for _ in 0..cfg.sub_appends {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        let r = writer.append(vec![ev.clone(); cfg.sub_batch], None).map_err(cerr("fan-out append"))?;
        let acked = Instant::now();
        metrics::record_us(&mut append_hist, acked.duration_since(t).as_micros() as u64);
        let mut m = acks.lock().expect("lock");
        for p in r.first.get()..=r.last.get() {
            m.insert(p, acked);
        }
        appended += cfg.sub_batch as u64;
    }
    // Wait for the deliveries, then cancel whoever is still waiting.
    let deadline = Instant::now() + cfg.sub_timeout;
    while subs.iter().any(|h| !h.is_finished()) && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let incomplete = subs.iter().any(|h| !h.is_finished());
    cancel_all(&cancels);
    let acks = acks.lock().expect("lock").clone();
    let mut lag = metrics::latency_histogram();
    let (mut deliveries, mut early) = (0u64, 0u64);
    for h in subs {
        let got = h.join().map_err(|_| "subscriber thread panicked".to_owned())??;
        for (pos, at) in got {
            deliveries += 1;
            match acks.get(&pos) {
                Some(ack) if at >= *ack => metrics::record_us(&mut lag, at.duration_since(*ack).as_micros() as u64),
                Some(_) => {
                    early += 1;
                    lag.saturating_record(0);
                }
                None => {}
            }
        }
    }
    Ok((
        FanoutReport {
            subscribers: cfg.subscribers,
            events: appended,
            deliveries,
            delivered_before_ack: early,
            lag: Latency::from_histogram(&lag),
            append_latency: Latency::from_histogram(&append_hist),
            incomplete,
        },
        appended,
    ))
}

/// Renders a report as a short human-readable block.
pub fn render(r: &ReadReport) -> String {
    use crate::append::fmt_us;
    let percentiles = |l: Latency| format!("p50 {} p99 {} p99.9 {}", fmt_us(l.p50_us), fmt_us(l.p99_us), fmt_us(l.p999_us));
    use crate::report::thousands;
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "server {}; appended {} events ({:.1} s to populate)", r.server_version, r.events_appended, r.populate_seconds);
    if let Some(sc) = &r.scan {
        let _ = writeln!(
            s,
            "full scan: {} events, {:.1} MB; median {} events/s ({:.1} MB/s), best {} events/s over {} scans",
            sc.events,
            sc.bytes as f64 / 1e6,
            thousands(sc.events_per_sec_median),
            sc.mb_per_sec_median,
            thousands(sc.events_per_sec_best),
            sc.seconds.len()
        );
    }
    if let Some(se) = &r.selective {
        let lat = se.latency.map(percentiles).unwrap_or_default();
        let _ = writeln!(
            s,
            "selective read: {} of {} events match (expected {}); {:.0} reads/s; {lat}",
            se.matches, se.log_events, se.expected_matches, se.reads_per_sec
        );
    }
    if let Some(f) = &r.fanout {
        let lat = f.lag.map(percentiles).unwrap_or_default();
        let _ = writeln!(
            s,
            "fan-out: {} subscribers x {} events: {} deliveries{}; lag behind ack {lat} ({} before the ack)",
            f.subscribers,
            f.events,
            f.deliveries,
            if f.incomplete { " (INCOMPLETE)" } else { "" },
            f.delivered_before_ack
        );
    }
    if r.interrupted {
        let _ = writeln!(s, "INTERRUPTED");
    }
    s
}
