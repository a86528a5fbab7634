//! `tephra-bench append`: closed-loop append load against a running server.
//!
//! `connections` sockets each carry up to `inflight` append requests at a time; every
//! request is built by [`crate::workload::Generator`]. A request is timed from just before
//! it is sent to the moment its acknowledgement is in. The first `warmup` is not measured;
//! then, for `duration`, every acknowledgement that arrives inside the window counts:
//! `events/s` = events acknowledged in the window / window length, and its latency goes
//! into the histogram. After the window no new request starts; those still in flight
//! finish and count towards the totals only (`events_acked_total`), which is what the
//! server holds afterwards.
//!
//! How the requests travel is behind [`LoadBackend`]:
//! - [`BlockingBackend`] (`--client blocking`, the default): one OS thread per connection
//!   over the blocking [`tephra::client::Client`], one request in flight each, like the
//!   reference's published numbers;
//! - [`RawBackend`] (`--client raw`): one OS thread per connection writing pre-encoded
//!   frames ([`Generator::next_frame`]: the event is encoded once per request and its bytes
//!   repeated) and matching acknowledgements by request id, so it keeps `inflight`
//!   requests in flight per socket and costs the least CPU;
//! - [`AsyncBackend`] (`--client async`): our pipelined [`tephra::client::AsyncClient`],
//!   one control socket per connection, `inflight` append tasks on each, every socket's
//!   driver and every task on one `async-executor` thread over `async-io`.

use crate::metrics::{self, ErrorCounts, Latency};
use crate::workload::{Generator, WorkloadSpec};
use hdrhistogram::Histogram;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tephra::client::{Client, ClientError};
use tephra::proto::{self, response, FrameDecoder};

/// Everything an append run needs.
#[derive(Debug, Clone)]
pub struct AppendConfig {
    /// Server address (`host:port`).
    pub addr: String,
    /// Sockets to open.
    pub connections: usize,
    /// Append requests in flight per socket.
    pub inflight: usize,
    /// What each request holds.
    pub workload: WorkloadSpec,
    /// Unmeasured time before the window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Pause of a writer after an error (the reference's harness sleeps 1 s).
    pub error_backoff: Duration,
    /// Executor threads of [`AsyncBackend`] (connections are spread over them; default 1).
    pub executor_threads: usize,
}

/// The result of one append run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppendReport {
    /// Which [`LoadBackend`] drove the load.
    pub client: String,
    /// Sockets used.
    pub connections: usize,
    /// Requests in flight per socket.
    pub inflight: usize,
    /// Events per request.
    pub batch: usize,
    /// Payload bytes per event.
    pub event_size: usize,
    /// Whether every append carried the never-firing condition.
    pub conditional: bool,
    /// Warm-up, seconds.
    pub warmup_seconds: f64,
    /// Length of the measured window actually used, seconds (shorter if interrupted).
    pub window_seconds: f64,
    /// Events acknowledged inside the window.
    pub events: u64,
    /// Requests acknowledged inside the window.
    pub requests: u64,
    /// `events / window_seconds`.
    pub events_per_sec: f64,
    /// `requests / window_seconds`.
    pub requests_per_sec: f64,
    /// Payload throughput inside the window, MB/s (10^6 bytes).
    pub payload_mb_per_sec: f64,
    /// Latency of the requests acknowledged inside the window.
    pub latency: Option<Latency>,
    /// Every event acknowledged during the run (warm-up, window and drain).
    pub events_acked_total: u64,
    /// Every request acknowledged during the run.
    pub requests_acked_total: u64,
    /// Failed requests (whole run) by error name (see [`metrics::error_name`]).
    pub errors: ErrorCounts,
    /// CPU seconds the load generator used over the run (whole process).
    pub client_cpu_seconds: f64,
    /// `client_cpu_seconds` / run wall time: how many cores the generator kept busy.
    pub client_cpu_cores: f64,
    /// True when SIGINT/SIGTERM cut the run short.
    pub interrupted: bool,
    /// Events acknowledged in each 100 ms from the start of the warm-up (stalls show as
    /// zeros).
    pub timeline_events: Vec<u64>,
    /// The longest run of 100 ms buckets inside the window with no acknowledgement, ms.
    pub longest_stall_ms: u64,
}

/// The moments that delimit a run.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// The start of the warm-up.
    pub start: Instant,
    /// The start of the measured window.
    pub window_start: Instant,
    /// The end of the measured window: no request starts after it.
    pub window_end: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn starting_now(warmup: Duration, duration: Duration) -> Clock {
        let start = Instant::now();
        Clock { start, window_start: start + warmup, window_end: start + warmup + duration }
    }

    /// True while `t` lies inside the measured window.
    pub fn in_window(&self, t: Instant) -> bool {
        t >= self.window_start && t <= self.window_end
    }
}

/// What one worker (a thread or a task) measured.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Latency of the requests acknowledged inside the window, µs.
    pub hist: Histogram<u64>,
    /// Events acknowledged inside the window.
    pub events_window: u64,
    /// Requests acknowledged inside the window.
    pub requests_window: u64,
    /// Events acknowledged at any time.
    pub events_total: u64,
    /// Requests acknowledged at any time.
    pub requests_total: u64,
    /// Failed requests by name.
    pub errors: ErrorCounts,
    /// Events acknowledged per [`TIMELINE_BUCKET`] since the start of the run.
    pub timeline: Vec<u64>,
}

/// The resolution of [`AppendReport::timeline_events`].
pub const TIMELINE_BUCKET: Duration = Duration::from_millis(100);

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            hist: metrics::latency_histogram(),
            events_window: 0,
            requests_window: 0,
            events_total: 0,
            requests_total: 0,
            errors: ErrorCounts::new(),
            timeline: Vec::new(),
        }
    }
}

impl Tally {
    /// Records an acknowledged request of `events` events sent at `sent`, acked at `acked`.
    pub fn ok(&mut self, clock: &Clock, sent: Instant, acked: Instant, events: u64) {
        self.events_total += events;
        self.requests_total += 1;
        let bucket = (acked.duration_since(clock.start).as_millis() / TIMELINE_BUCKET.as_millis()) as usize;
        if bucket >= self.timeline.len() {
            self.timeline.resize(bucket + 1, 0);
        }
        self.timeline[bucket] += events;
        if clock.in_window(acked) {
            self.events_window += events;
            self.requests_window += 1;
            metrics::record_us(&mut self.hist, acked.duration_since(sent).as_micros() as u64);
        }
    }

    /// Records a failed request.
    pub fn err(&mut self, name: String) {
        *self.errors.entry(name).or_default() += 1;
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Tally) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.events_window += other.events_window;
        self.requests_window += other.requests_window;
        self.events_total += other.events_total;
        self.requests_total += other.requests_total;
        metrics::merge_errors(&mut self.errors, &other.errors);
        if other.timeline.len() > self.timeline.len() {
            self.timeline.resize(other.timeline.len(), 0);
        }
        for (a, b) in self.timeline.iter_mut().zip(&other.timeline) {
            *a += b;
        }
    }
}

/// How append requests travel to the server. A backend opens `connections` sockets,
/// keeps `inflight` requests on each, records every outcome into [`Tally`]s against the
/// shared [`Clock`], and returns once the window has ended (or `stop` is set) and every
/// request it started has finished.
pub trait LoadBackend {
    /// A short name for reports (`"blocking"`, ...).
    fn name(&self) -> &'static str;

    /// Runs the load. The clock starts only once every socket is connected.
    ///
    /// # Errors
    /// A connection cannot be opened at the start, or `inflight` is unsupported.
    fn run(&self, cfg: &AppendConfig, stop: &AtomicBool) -> Result<(Clock, Vec<Tally>), String>;
}

/// Which [`LoadBackend`] drives the load (`--client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// [`BlockingBackend`]: the blocking client, one request in flight per connection.
    Blocking,
    /// [`RawBackend`]: pre-encoded frames, `--inflight` requests per connection.
    Raw,
    /// [`AsyncBackend`]: the pipelined async client, `--inflight` requests per connection.
    Async,
}

impl ClientKind {
    /// The backend.
    pub fn backend(self) -> &'static dyn LoadBackend {
        match self {
            ClientKind::Blocking => &BlockingBackend,
            ClientKind::Raw => &RawBackend,
            ClientKind::Async => &AsyncBackend,
        }
    }

    /// The most requests in flight per connection it supports.
    pub fn max_inflight(self) -> usize {
        match self {
            ClientKind::Blocking => 1,
            // The server's default per-connection append budget.
            ClientKind::Raw | ClientKind::Async => 256,
        }
    }
}

/// One OS thread per connection over the blocking [`Client`], one request in flight each.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingBackend;

/// Sleeps up to `d`, in short steps, returning early at `until` or once `stop` is set.
fn nap(d: Duration, until: Instant, stop: &AtomicBool) {
    let end = (Instant::now() + d).min(until);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            break;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

/// Connects `cfg.connections` sockets with `connect`, then runs `writer` on one OS thread
/// per socket; the clock starts once every thread is ready.
fn thread_per_connection<C: Send>(
    cfg: &AppendConfig,
    stop: &AtomicBool,
    connect: impl Fn(&str) -> std::io::Result<C>,
    writer: impl Fn(C, &AppendConfig, &Clock, &AtomicBool) -> Tally + Sync,
) -> Result<(Clock, Vec<Tally>), String> {
    let mut conns = Vec::with_capacity(cfg.connections);
    for i in 0..cfg.connections {
        let c = connect(cfg.addr.as_str()).map_err(|e| format!("connection {} of {} to {}: {e}", i + 1, cfg.connections, cfg.addr))?;
        conns.push(c);
    }
    let barrier = Arc::new(Barrier::new(cfg.connections + 1));
    let clock_cell: Arc<std::sync::OnceLock<Clock>> = Arc::new(std::sync::OnceLock::new());
    let writer = &writer;
    let tallies = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(cfg.connections);
        for (i, conn) in conns.into_iter().enumerate() {
            let barrier = Arc::clone(&barrier);
            let clock_cell = Arc::clone(&clock_cell);
            let h = std::thread::Builder::new()
                .name(format!("writer-{i}"))
                .stack_size(256 << 10)
                .spawn_scoped(s, move || {
                    barrier.wait();
                    let clock = *clock_cell.get().expect("clock set before the barrier opens");
                    writer(conn, cfg, &clock, stop)
                })
                .expect("spawn writer thread");
            handles.push(h);
        }
        clock_cell.set(Clock::starting_now(cfg.warmup, cfg.duration)).expect("set once");
        barrier.wait();
        handles.into_iter().map(|h| h.join().expect("writer thread panicked")).collect::<Vec<_>>()
    });
    Ok((*clock_cell.get().expect("set"), tallies))
}

impl LoadBackend for BlockingBackend {
    fn name(&self) -> &'static str {
        "blocking"
    }

    fn run(&self, cfg: &AppendConfig, stop: &AtomicBool) -> Result<(Clock, Vec<Tally>), String> {
        if cfg.inflight != 1 {
            return Err(format!(
                "--inflight {} needs a pipelined client (--client raw); the blocking client keeps one request in flight per connection",
                cfg.inflight
            ));
        }
        thread_per_connection(cfg, stop, |a| Client::connect(a), blocking_writer)
    }
}

/// One OS thread per connection writing pre-encoded frames, `inflight` requests in flight
/// per socket, acknowledgements matched by request id.
#[derive(Debug, Default, Clone, Copy)]
pub struct RawBackend;

/// How long, after the window, a raw writer waits for its last acknowledgements.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A raw protocol connection: a socket after a successful Hello, and its frame decoder.
#[derive(Debug)]
pub struct RawConn {
    stream: TcpStream,
    decoder: FrameDecoder,
}

impl RawConn {
    /// Dials `addr` (`TCP_NODELAY`) and performs the Hello (id 1, no token).
    ///
    /// # Errors
    /// The dial's error, or `InvalidData` when the server refuses the Hello.
    pub fn connect(addr: &str) -> std::io::Result<RawConn> {
        use std::io::{Error, ErrorKind};
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let mut out = Vec::new();
        proto::encode_frame(&proto::Request::hello(1, None), proto::DEFAULT_MAX_FRAME_LEN, &mut out)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
        stream.write_all(&out)?;
        let mut conn = RawConn { stream, decoder: FrameDecoder::new(proto::DEFAULT_MAX_FRAME_LEN) };
        match conn.next_response()? {
            Some(proto::Response { kind: Some(response::Kind::HelloAck(ack)), .. }) if ack.protocol_version == proto::PROTOCOL_VERSION => {
                conn.stream.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok(conn)
            }
            Some(other) => Err(Error::new(ErrorKind::InvalidData, format!("Hello refused: {other:?}"))),
            None => Err(Error::new(ErrorKind::UnexpectedEof, "closed during the Hello")),
        }
    }

    /// The next response, `None` at a clean close. A read timeout surfaces as an I/O
    /// error of kind `WouldBlock`/`TimedOut` and loses nothing.
    fn next_response(&mut self) -> std::io::Result<Option<proto::Response>> {
        use std::io::{Error, ErrorKind};
        match self.decoder.read_next(&mut self.stream) {
            Ok(Some(body)) => proto::Response::decode(body).map(Some).map_err(|e| Error::new(ErrorKind::InvalidData, e)),
            Ok(None) => Ok(None),
            Err(proto::FrameError::Io(e)) => Err(e),
            Err(e) => Err(Error::new(ErrorKind::InvalidData, e.to_string())),
        }
    }
}

impl LoadBackend for RawBackend {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn run(&self, cfg: &AppendConfig, stop: &AtomicBool) -> Result<(Clock, Vec<Tally>), String> {
        thread_per_connection(cfg, stop, RawConn::connect, raw_writer)
    }
}

/// Our pipelined [`tephra::client::AsyncClient`]: one client with only its control socket
/// (`bulk_connections = 0`) per connection, `inflight` tasks appending on each, driven by
/// [`AppendConfig::executor_threads`] `async-executor` threads (sockets on `async-io`'s
/// reactor).
#[derive(Debug, Default, Clone, Copy)]
pub struct AsyncBackend;

impl LoadBackend for AsyncBackend {
    fn name(&self) -> &'static str {
        "async"
    }

    fn run(&self, cfg: &AppendConfig, stop: &AtomicBool) -> Result<(Clock, Vec<Tally>), String> {
        let threads = cfg.executor_threads.clamp(1, cfg.connections);
        let barrier = Barrier::new(threads + 1);
        let clock_cell = std::sync::OnceLock::new();
        let results: Vec<Result<Vec<Tally>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    // Connections t, t + threads, t + 2 * threads, ...
                    let first = t;
                    let (barrier, clock_cell) = (&barrier, &clock_cell);
                    std::thread::Builder::new()
                        .name(format!("async-{t}"))
                        .spawn_scoped(s, move || async_group(cfg, stop, first, threads, barrier, clock_cell))
                        .expect("spawn executor thread")
                })
                .collect();
            let _ = clock_cell.set(Clock::starting_now(cfg.warmup, cfg.duration));
            // The clock starts once every thread has connected (or failed to).
            barrier.wait();
            handles.into_iter().map(|h| h.join().expect("executor thread panicked")).collect()
        });
        let mut tallies = Vec::new();
        for r in results {
            tallies.extend(r?);
        }
        Ok((*clock_cell.get().expect("set"), tallies))
    }
}

/// One executor thread of [`AsyncBackend`]: connections `first`, `first + step`, ...
fn async_group(
    cfg: &AppendConfig,
    stop: &AtomicBool,
    first: usize,
    step: usize,
    barrier: &Barrier,
    clock_cell: &std::sync::OnceLock<Clock>,
) -> Result<Vec<Tally>, String> {
    use tephra::client::async_client::{AsyncClient, AsyncClientConfig, TcpConnector};
    let ex = async_executor::LocalExecutor::new();
    async_io::block_on(ex.run(async {
        let mut clients = Vec::new();
        let mut failed = None;
        for i in (first..cfg.connections).step_by(step) {
            let fail = |e: std::io::Error| format!("connection {} of {} to {}: {e}", i + 1, cfg.connections, cfg.addr);
            let config = AsyncClientConfig { bulk_connections: 0, max_inflight_requests: cfg.inflight, ..AsyncClientConfig::default() };
            let connected = match TcpConnector::new(cfg.addr.as_str()) {
                Ok(c) => AsyncClient::connect_with(c, config).await.map_err(fail),
                Err(e) => Err(fail(e)),
            };
            match connected {
                Ok((client, driver)) => {
                    ex.spawn(driver).detach();
                    clients.push(client);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        barrier.wait();
        if let Some(e) = failed {
            return Err(e);
        }
        let clock = *clock_cell.get().expect("clock set before the barrier opens");
        let mut tasks = Vec::with_capacity(clients.len() * cfg.inflight);
        for client in &clients {
            for _ in 0..cfg.inflight {
                let client = client.clone();
                tasks.push(ex.spawn(async move {
                    let mut tally = Tally::default();
                    let mut generator = Generator::new(cfg.workload);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < clock.window_end {
                        let Ok(req) = generator.next_request() else {
                            tally.err("encode".into());
                            break;
                        };
                        let n = req.count as u64;
                        let sent = Instant::now();
                        match client.append(std::iter::repeat_n(req.event, req.count), req.condition).await {
                            Ok(_) => tally.ok(&clock, sent, Instant::now(), n),
                            Err(e) => {
                                tally.err(metrics::error_name(&e));
                                let until = (Instant::now() + cfg.error_backoff).min(clock.window_end);
                                async_io::Timer::at(until).await;
                            }
                        }
                    }
                    tally
                }));
            }
        }
        let mut tallies = Vec::with_capacity(tasks.len());
        for t in tasks {
            tallies.push(t.await);
        }
        drop(clients);
        Ok(tallies)
    }))
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// The loop of one raw writer.
fn raw_writer(conn: RawConn, cfg: &AppendConfig, clock: &Clock, stop: &AtomicBool) -> Tally {
    let mut tally = Tally::default();
    let mut generator = Generator::new(cfg.workload);
    let mut conn = Some(conn);
    let mut pending: VecDeque<(u64, Instant, u64)> = VecDeque::with_capacity(cfg.inflight);
    let mut out = Vec::new();
    let mut next_id = 2u64;
    let drain_deadline = clock.window_end + DRAIN_TIMEOUT;
    loop {
        let stopping = stop.load(Ordering::Relaxed) || Instant::now() >= clock.window_end;
        if stopping && pending.is_empty() {
            break;
        }
        let Some(c) = conn.as_mut() else {
            match RawConn::connect(cfg.addr.as_str()) {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    tally.err("connect".into());
                    nap(cfg.error_backoff, clock.window_end, stop);
                }
            }
            continue;
        };
        if !stopping && pending.len() < cfg.inflight {
            out.clear();
            let sent = Instant::now();
            while pending.len() < cfg.inflight {
                let id = next_id;
                next_id += 1;
                let n = generator.next_frame(id, &mut out);
                pending.push_back((id, sent, n as u64));
            }
            if c.stream.write_all(&out).is_err() {
                for _ in pending.drain(..) {
                    tally.err("io".into());
                }
                conn = None;
                nap(cfg.error_backoff, clock.window_end, stop);
                continue;
            }
        }
        let lost = |tally: &mut Tally, pending: &mut VecDeque<(u64, Instant, u64)>, name: &str| {
            for _ in pending.drain(..) {
                tally.err(name.into());
            }
        };
        match c.next_response() {
            Ok(Some(resp)) => {
                let acked = Instant::now();
                let Some(k) = pending.iter().position(|p| p.0 == resp.request_id) else {
                    // An unattributed error (id 0) or a stray id: the connection is unusable.
                    tally.err("protocol".into());
                    lost(&mut tally, &mut pending, "protocol");
                    conn = None;
                    continue;
                };
                let (_, sent, n) = pending.remove(k).expect("index from position");
                match resp.kind {
                    Some(response::Kind::Append(_)) => tally.ok(clock, sent, acked, n),
                    Some(response::Kind::Error(e)) => {
                        let code = proto::ErrorCode::from_wire(e.code);
                        tally.err(code.short_name().to_owned());
                        nap(cfg.error_backoff, clock.window_end, stop);
                    }
                    _ => tally.err("protocol".into()),
                }
            }
            Ok(None) => {
                lost(&mut tally, &mut pending, "eof");
                conn = None;
            }
            Err(e) if is_timeout(&e) => {
                if Instant::now() > drain_deadline {
                    lost(&mut tally, &mut pending, "timeout");
                    break;
                }
            }
            Err(_) => {
                lost(&mut tally, &mut pending, "io");
                conn = None;
            }
        }
    }
    tally
}

/// The loop of one blocking writer.
fn blocking_writer(mut client: Client, cfg: &AppendConfig, clock: &Clock, stop: &AtomicBool) -> Tally {
    let mut tally = Tally::default();
    let mut generator = Generator::new(cfg.workload);
    let mut connected = true;
    loop {
        if stop.load(Ordering::Relaxed) || Instant::now() >= clock.window_end {
            break;
        }
        if !connected {
            match Client::connect(cfg.addr.as_str()) {
                Ok(c) => {
                    client = c;
                    connected = true;
                }
                Err(_) => {
                    tally.err("connect".into());
                    nap(cfg.error_backoff, clock.window_end, stop);
                    continue;
                }
            }
        }
        let req = match generator.next_request() {
            Ok(r) => r,
            Err(_) => {
                tally.err("encode".into());
                break;
            }
        };
        let n = req.count as u64;
        let sent = Instant::now();
        match client.append_refs(std::iter::repeat_n(&req.event, req.count), req.condition) {
            Ok(_) => tally.ok(clock, sent, Instant::now(), n),
            Err(e) => {
                tally.err(metrics::error_name(&e));
                if !matches!(e, ClientError::Server { .. }) {
                    connected = false;
                }
                nap(cfg.error_backoff, clock.window_end, stop);
            }
        }
    }
    tally
}

/// Runs an append benchmark with `backend` and summarises it.
///
/// # Errors
/// The backend's start-up error.
pub fn run(cfg: &AppendConfig, backend: &dyn LoadBackend, stop: &AtomicBool) -> Result<AppendReport, String> {
    let cpu0 = metrics::self_cpu_seconds();
    let (clock, tallies) = backend.run(cfg, stop)?;
    let finished = Instant::now();
    let cpu = metrics::self_cpu_seconds() - cpu0;
    let mut all = Tally::default();
    for t in &tallies {
        all.merge(t);
    }
    let interrupted = stop.load(Ordering::Relaxed);
    // An interrupted run measures up to the interruption.
    let window_end = clock.window_end.min(finished);
    let window = window_end.saturating_duration_since(clock.window_start).as_secs_f64();
    let per_sec = |x: u64| if window > 0.0 { x as f64 / window } else { 0.0 };
    let wall = finished.duration_since(clock.start).as_secs_f64();
    Ok(AppendReport {
        client: backend.name().to_owned(),
        connections: cfg.connections,
        inflight: cfg.inflight,
        batch: cfg.workload.batch,
        event_size: cfg.workload.event_size,
        conditional: cfg.workload.conditional,
        warmup_seconds: cfg.warmup.as_secs_f64(),
        window_seconds: window,
        events: all.events_window,
        requests: all.requests_window,
        events_per_sec: per_sec(all.events_window),
        requests_per_sec: per_sec(all.requests_window),
        payload_mb_per_sec: per_sec(all.events_window) * cfg.workload.event_size as f64 / 1e6,
        latency: Latency::from_histogram(&all.hist),
        events_acked_total: all.events_total,
        requests_acked_total: all.requests_total,
        errors: all.errors,
        client_cpu_seconds: cpu,
        client_cpu_cores: if wall > 0.0 { cpu / wall } else { 0.0 },
        interrupted,
        longest_stall_ms: longest_zero_run(&all.timeline, &clock, window_end) * TIMELINE_BUCKET.as_millis() as u64,
        timeline_events: all.timeline,
    })
}

/// The longest run of empty timeline buckets that lies inside the measured window, from
/// `clock.window_start` to `window_end`: the window's actual end, which for an interrupted
/// run is the interruption, not the planned `clock.window_end` (the buckets after an
/// interruption are empty because nothing was sent, not because the server stalled).
fn longest_zero_run(timeline: &[u64], clock: &Clock, window_end: Instant) -> u64 {
    let b = TIMELINE_BUCKET.as_millis();
    let first = clock.window_start.duration_since(clock.start).as_millis().div_ceil(b) as usize;
    let last = (window_end.saturating_duration_since(clock.start).as_millis() / b) as usize;
    let (mut best, mut cur) = (0u64, 0u64);
    for i in first..last {
        if timeline.get(i).copied().unwrap_or(0) == 0 {
            cur += 1;
            best = best.max(cur);
        } else {
            cur = 0;
        }
    }
    best
}

/// Renders a report as a short human-readable block.
pub fn render(r: &AppendReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "append: {} connections x {} in flight ({} client), batch {}, {} B events, {}",
        r.connections,
        r.inflight,
        r.client,
        r.batch,
        r.event_size,
        if r.conditional { "conditional" } else { "unconditional" }
    );
    let _ = writeln!(s, "window: {:.1} s after {:.1} s warm-up{}", r.window_seconds, r.warmup_seconds, if r.interrupted { " (INTERRUPTED)" } else { "" });
    let _ = writeln!(
        s,
        "throughput: {} events/s, {} requests/s, {:.1} MB/s payload",
        crate::report::thousands(r.events_per_sec),
        crate::report::thousands(r.requests_per_sec),
        r.payload_mb_per_sec
    );
    match &r.latency {
        Some(l) => {
            let _ = writeln!(
                s,
                "latency: p50 {} p99 {} p99.9 {} max {} (n = {})",
                fmt_us(l.p50_us),
                fmt_us(l.p99_us),
                fmt_us(l.p999_us),
                fmt_us(l.max_us),
                l.count
            );
        }
        None => {
            let _ = writeln!(s, "latency: no request completed inside the window");
        }
    }
    let _ = writeln!(s, "acknowledged in total: {} events in {} requests", r.events_acked_total, r.requests_acked_total);
    if r.longest_stall_ms > 0 {
        let _ = writeln!(s, "longest stall inside the window (no acknowledgement at all): {} ms", r.longest_stall_ms);
    }
    if r.errors.is_empty() {
        let _ = writeln!(s, "errors: none");
    } else {
        let list: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} x{v}")).collect();
        let _ = writeln!(s, "errors: {}", list.join(", "));
    }
    let _ = writeln!(s, "load generator CPU: {:.2} cores", r.client_cpu_cores);
    s
}

/// Formats µs as `123 µs`, `4.56 ms` or `1.23 s`.
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.2} ms", us as f64 / 1e3)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}
