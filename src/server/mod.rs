//! The network server: thread-per-core shards speaking protocol v1.
//!
//! One pinned glommio executor per shard (`server.reads.worker_threads`, 0 = one per CPU), each
//! with its own `SO_REUSEPORT` listener on the same address, so the kernel spreads connections
//! and a connection lives and dies on the shard that accepted it. The store's writer runs on a
//! thread of its own (`tephra-writer`, not pinned) and hands each batch to its committer thread
//! (`tephra-commit`), which blocks in `pwrite` and `fdatasync` the way the reference's writer
//! thread does, so a commit costs no io_uring worker hand-offs and no shard's connections wait
//! behind it. Appends cross to it over the bounded writer queue; results come back grouped per
//! shard per commit. Reads and
//! subscriptions run on the connection's shard. (DESIGN "Shape", seed "Backpressure".)

mod conn;
pub mod metrics;

use crate::config::Settings;
use crate::store::{Store, StoreConfig, StoreHandle};
use crate::writer::{AppendResult, WriterConfig};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Server-wide state shared by every shard.
pub struct Context {
    /// The resolved settings.
    pub settings: Settings,
    /// The store.
    pub store: StoreHandle,
    /// The data directory (for stats).
    pub data_dir: PathBuf,
    /// When the server started serving.
    pub started: Instant,
    /// Live connections, all shards.
    pub active_connections: AtomicU64,
    /// Live subscriptions, all shards.
    pub active_subscriptions: AtomicU64,
    /// Connections closed at accept: over `max_connections`, or reset while the process was out
    /// of file descriptors.
    pub connections_refused: AtomicU64,
    /// Connections closed by a timeout.
    pub connections_reaped: AtomicU64,
    /// Times a read or a subscription met a range neither in memory nor in the page cache and
    /// had it fetched on a blocking thread (its shard served other connections meanwhile).
    pub read_disk_fetches: AtomicU64,
    /// Append requests answered with an error, by wire code index 0..=9.
    pub append_errors: [AtomicU64; 10],
    /// Append latency histogram, microseconds (merged from shards on scrape).
    pub append_latency: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
    /// SHA-256 digests of the accepted tokens.
    pub token_digests: Vec<[u8; 32]>,
    /// TLS configuration, when TLS is on.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    shutting_down: AtomicBool,
    shutdown_event: event_listener::Event,
    cap_warned: AtomicBool,
    /// The open-files limit (`RLIMIT_NOFILE`, soft) when the server started: connections are
    /// refused once a new one's descriptor comes within [`FD_RESERVE`] (at most an eighth of
    /// it) of it.
    open_files: u64,
    /// The descriptor reserve was reached and said; cleared once a connection is accepted.
    fd_warned: AtomicBool,
}

impl Context {
    /// True once a graceful shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Starts a graceful shutdown (idempotent).
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.shutdown_event.notify(usize::MAX);
    }

    /// Resolves once shutdown begins.
    pub async fn wait_shutdown(&self) {
        loop {
            if self.is_shutting_down() {
                return;
            }
            let l = self.shutdown_event.listen();
            if self.is_shutting_down() {
                return;
            }
            l.await;
        }
    }

    /// Does `token` match a configured token? Constant-time per digest comparison.
    pub fn accepts_token(&self, token: Option<&str>) -> bool {
        if self.token_digests.is_empty() {
            return true;
        }
        let Some(t) = token.filter(|t| !t.is_empty()) else { return false };
        let d: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()).into();
        let mut ok = subtle::Choice::from(0u8);
        for want in &self.token_digests {
            ok |= subtle::ConstantTimeEq::ct_eq(&want[..], &d[..]);
        }
        ok.into()
    }

    /// The ten stats fields (reference protocol §2.11), and ours, `writer_stopped`.
    pub fn stats(&self) -> crate::proto::StatsResponse {
        // A test holds the directory listing here, as a slow disk would.
        crate::fault::pause_point("stats_scan");
        let (mut segments, mut bytes) = (0u64, 0u64);
        if let Ok(rd) = std::fs::read_dir(&self.data_dir) {
            for e in rd.flatten() {
                if let Ok(md) = e.metadata() {
                    if md.is_file() {
                        bytes += md.len();
                        if e.file_name().to_str().and_then(crate::log::segment::parse_segment_name).is_some() {
                            segments += 1;
                        }
                    }
                }
            }
        }
        crate::proto::StatsResponse {
            event_count: self.store.head().get(),
            segment_count: segments,
            disk_bytes: bytes,
            uptime_seconds: self.started.elapsed().as_secs(),
            active_connections: self.active_connections.load(Ordering::Relaxed),
            active_subscriptions: self.active_subscriptions.load(Ordering::Relaxed),
            version: env!("CARGO_PKG_VERSION").to_string(),
            connections_refused: self.connections_refused.load(Ordering::Relaxed),
            max_connections: self.settings.server.limits.max_connections as u64,
            connections_reaped: self.connections_reaped.load(Ordering::Relaxed),
            writer_stopped: self.store.failure().unwrap_or_default(),
        }
    }
}

/// What a shard does with an append's result when it arrives: answer the client (runs on
/// the dispatcher, so it must not block).
pub(crate) type Completion = Box<dyn FnOnce(AppendResult)>;

/// Per-shard routing of append results: the writer sends one message per commit to this
/// shard's sink; the dispatcher runs each waiting request's completion by token, in the
/// order the writer answered them.
pub(crate) struct ReplyRouter {
    sink: flume::Sender<Vec<(u64, AppendResult)>>,
    waiting: RefCell<HashMap<u64, Completion>>,
    next_token: std::cell::Cell<u64>,
}

impl ReplyRouter {
    fn new() -> (Rc<ReplyRouter>, flume::Receiver<Vec<(u64, AppendResult)>>) {
        let (tx, rx) = flume::unbounded();
        (Rc::new(ReplyRouter { sink: tx, waiting: RefCell::new(HashMap::new()), next_token: std::cell::Cell::new(1) }), rx)
    }

    /// Registers `done` to run with the result; returns the reply target and its token.
    pub(crate) fn register(&self, done: Completion) -> (crate::writer::ReplyTo, u64) {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        self.waiting.borrow_mut().insert(token, done);
        (crate::writer::ReplyTo::Batched { sink: self.sink.clone(), token }, token)
    }

    /// Takes back the completion of a request that never reached the writer.
    pub(crate) fn forget(&self, token: u64) -> Option<Completion> {
        self.waiting.borrow_mut().remove(&token)
    }

    async fn dispatch(self: Rc<Self>, rx: flume::Receiver<Vec<(u64, AppendResult)>>) {
        while let Ok(batch) = rx.recv_async().await {
            for (token, res) in batch {
                // Not borrowed while a completion runs.
                let done = self.waiting.borrow_mut().remove(&token);
                if let Some(done) = done {
                    done(res);
                }
            }
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store refused to open.
    #[error(transparent)]
    Open(#[from] crate::store::OpenError),
    /// Binding, TLS loading or the runtime failed.
    #[error("{0}")]
    Io(String),
}

/// A running server: its bound address and a way to stop it.
pub struct Running {
    follower: Option<Arc<crate::follow::Follower>>,
    /// The address every shard listens on.
    pub addr: SocketAddr,
    /// The metrics address, when enabled.
    pub metrics_addr: Option<SocketAddr>,
    ctx: Arc<Context>,
    shards: Vec<glommio::ExecutorJoinHandle<()>>,
    store: Option<Store>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// The shared context (stats, shutdown).
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Blocks until shutdown is requested, then stops accepting, ends connections, flushes
    /// and joins the writer, and returns.
    pub fn wait(mut self) {
        // Every shard returns once all of its connections are done, so no append can still be
        // on its way to the writer when the store is shut down below.
        for s in self.shards.drain(..) {
            let _ = s.join();
        }
        if let Some(store) = self.store.take() {
            store.shutdown();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        if let Some(f) = self.follower.take() {
            f.close();
        }
        tracing::info!("tephra server stopped");
    }
}

fn load_tls(settings: &Settings) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    let Some((cert, key)) = settings.tls.paths() else { return Ok(None) };
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(cert).map_err(|e| format!("cannot read tls.cert {}: {e}", cert.display()))?,
    ))
    .collect::<Result<_, _>>()
    .map_err(|e| format!("invalid tls.cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("tls.cert {} holds no certificate", cert.display()));
    }
    for warning in crate::client::tls::server_certificate_warnings(&certs) {
        tracing::warn!(cert = %cert.display(), "{warning}");
    }
    // A passphrase-protected key (PKCS#8 `ENCRYPTED PRIVATE KEY`, skipped by the PEM reader as
    // no key, or OpenSSL's legacy `Proc-Type: 4,ENCRYPTED` header, which it fails to decode)
    // is named as such (new-user review: "holds no private key").
    let encrypted = || {
        let text = std::fs::read(key).unwrap_or_default();
        let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
        (has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED")).then(|| {
            format!("tls.key {} is encrypted (passphrase-protected), which the server cannot read: give it the key unencrypted, e.g. `openssl pkey -in {} -out key.pem`", key.display(), key.display())
        })
    };
    let key_der = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(key).map_err(|e| format!("cannot read tls.key {}: {e}", key.display()))?,
    ))
    .map_err(|e| encrypted().unwrap_or_else(|| format!("invalid tls.key {}: {e}", key.display())))?
    .ok_or_else(|| encrypted().unwrap_or_else(|| format!("tls.key {} holds no private key", key.display())))?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| unusable_tls_pair(&e, cert, key))?;
    Ok(Some(Arc::new(cfg)))
}

/// Why rustls would not take `tls.cert` with `tls.key`, in words: the key is not the
/// certificate's, the certificate is not one rustls can use (an X.509 v1 certificate, which
/// `openssl x509 -req` makes without `-extfile`, named so; the reference refuses one too), or
/// the key is of a kind it cannot sign with (review: every case said "do not match").
fn unusable_tls_pair(e: &rustls::Error, cert: &std::path::Path, key: &std::path::Path) -> String {
    match e {
        rustls::Error::InconsistentKeys(_) => format!("tls.cert {} and tls.key {} do not match: the key is not the certificate's", cert.display(), key.display()),
        rustls::Error::InvalidCertificate(c) if format!("{c:?}").contains("UnsupportedCertVersion") => format!(
            "invalid tls.cert {}: it is an X.509 v1 certificate (as `openssl x509 -req` makes without -extfile); TLS here needs a v3 certificate",
            cert.display()
        ),
        rustls::Error::InvalidCertificate(c) => format!("invalid tls.cert {}: {c:?}", cert.display()),
        other => format!("cannot use tls.key {} with tls.cert {}: {other}", key.display(), cert.display()),
    }
}

/// This server's answer to a Hello (reference protocol §1.4): protocol version 1 and our
/// crate version.
pub(crate) fn hello_ack() -> crate::proto::HelloAck {
    crate::proto::HelloAck { protocol_version: crate::proto::PROTOCOL_VERSION, server_version: env!("CARGO_PKG_VERSION").into() }
}

/// The smallest `server.max_frame_len` (bytes of frame body) with which this server can
/// answer a Hello from a client: the HelloAck to request id 1 (clients number their requests
/// from 1; any id up to 127 takes as many bytes). Below it every handshake ends in a close
/// (reference protocol §1.2: a frame over the cap is never sent).
pub fn min_usable_frame_len() -> usize {
    prost::Message::encoded_len(&crate::proto::Response::new(1, crate::proto::response::Kind::HelloAck(hello_ack())))
}

/// Opens the store and starts every shard; returns once all listeners are bound.
///
/// # Errors
/// [`StartError`] when io_uring cannot be used ([`shards::io_uring_usable`]), the locked-memory
/// limit is below what glommio needs ([`shards::memlock_sufficient`]), the store refuses to
/// open, TLS files are invalid, or binding fails.
pub fn start(settings: Settings) -> Result<Running, StartError> {
    start_mode(settings, None)
}

/// Starts a read-only server over a follower of `settings.data_dir` polled every `poll`
/// (issue: follower; seed "Running a second process against a live store").
///
/// A directory in which no writer has created a segment yet is served as an empty store until
/// the writer creates one (see [`crate::follow::Follower::open`]).
///
/// # Errors
/// As [`start`]; also when the directory cannot be read (a follower creates nothing, so it must
/// exist).
pub fn start_follower(settings: Settings, poll: std::time::Duration) -> Result<Running, StartError> {
    start_mode(settings, Some(poll))
}

fn start_mode(settings: Settings, follow: Option<std::time::Duration>) -> Result<Running, StartError> {
    // Before anything is opened: without io_uring no shard can run.
    shards::io_uring_usable().map_err(StartError::Io)?;
    shards::memlock_sufficient().map_err(StartError::Io)?;
    let tls = load_tls(&settings).map_err(StartError::Io)?;
    // An address another listener holds is refused before the data directory is touched (a
    // refused start must not create or open a store); checked again right before binding,
    // since opening a large store takes a while.
    let bind = settings.bind_addr().map_err(|e| StartError::Io(e.to_string()))?;
    if bind.port() != 0 {
        probe_until_free(bind, &settings.data_dir).map_err(|e| StartError::Io(format!("cannot bind {bind}: {e}")))?;
    }
    let mut segment = crate::log::segment::SegmentConfig::new(settings.segment.size);
    segment.max_record_len = settings.segment.max_record_len();
    let cfg = StoreConfig {
        segment,
        writer: WriterConfig {
            queue_capacity: settings.writer.queue_capacity,
            max_batch_records: settings.writer.max_batch_records,
            max_batch_bytes: settings.effective_max_batch_bytes(),
            tips_window: settings.writer.tips_window,
            condition_force_scan: settings.writer.condition_force_scan,
            verify_tips: false,
        },
        read: crate::store::ReadConfig { scan_bias: settings.read.scan_bias },
    };
    let (store, writer_task, follower, handle) = match follow {
        None => {
            let (store, task) = open_waiting_for_lock(&settings.data_dir, cfg)?;
            let h = store.handle();
            (Some(store), Some(task), None, h)
        }
        Some(poll) => {
            let mut fc = crate::follow::FollowerConfig::new(cfg.segment);
            fc.poll_interval = poll;
            fc.scan_bias = cfg.read.scan_bias;
            let f = crate::follow::Follower::open(&settings.data_dir, fc).map_err(|e| StartError::Io(format!("cannot follow {}: {e}", settings.data_dir.display())))?;
            f.start_polling();
            let h = f.handle();
            (None, None, Some(f), h)
        }
    };
    let ctx = Arc::new(Context {
        store: handle,
        data_dir: settings.data_dir.clone(),
        started: Instant::now(),
        active_connections: AtomicU64::new(0),
        active_subscriptions: AtomicU64::new(0),
        connections_refused: AtomicU64::new(0),
        connections_reaped: AtomicU64::new(0),
        read_disk_fetches: AtomicU64::new(0),
        append_errors: Default::default(),
        append_latency: std::sync::Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("bounds")),
        token_digests: settings
            .auth
            .token_strs()
            .map(|t| <sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()).into())
            .collect(),
        tls,
        shutting_down: AtomicBool::new(false),
        shutdown_event: event_listener::Event::new(),
        cap_warned: AtomicBool::new(false),
        open_files: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(u64::MAX, |(soft, _)| soft),
        fd_warned: AtomicBool::new(false),
        settings,
    });
    let n = ctx.settings.server.reads.worker_count().get();
    if ctx.settings.server.reads.worker_threads > n {
        tracing::warn!(worker_threads = ctx.settings.server.reads.worker_threads, shards = n, "server.reads.worker_threads is above the most shards this server starts ({} per CPU, {} in all; each is a thread with its own io_uring rings and I/O memory); starting {n} shards instead", crate::config::MAX_SHARDS_PER_CPU, crate::config::MAX_SHARDS);
    }
    // Pinned only within the CPUs the process was given (its affinity mask).
    let placement = shards::placement(n, &shards::allowed_cpus());
    let mut shards = Vec::with_capacity(n);
    // The writer's own thread, unpinned: the scheduler may run it on whichever CPU is free.
    let writer = match writer_task {
        Some(task) => Some(task.spawn().map_err(|e| StartError::Io(format!("cannot start the writer: {e}")))?),
        None => None,
    };
    // Every shard's listener sets SO_REUSEPORT, which lets any process of the same user bind
    // the same address too (and take half the connections). Like the reference, refuse to
    // start on an address another listener holds: probe it with a plain socket first.
    if bind.port() != 0 {
        if let Err(e) = probe_until_free(bind, &ctx.settings.data_dir) {
            ctx.shutdown();
            return Err(StartError::Io(format!("cannot bind {bind}: {e}")));
        }
    }
    crate::fault::pause_point("before_bind");
    let mut addr = bind;
    // Each shard binds and listens, then waits for the word to accept: nothing is accepted
    // until the address is known to be ours alone (see `foreign_listeners`).
    // One channel of words per shard (a shared one would let a quick shard take two).
    let mut word_tx: Vec<flume::Sender<Word>> = Vec::with_capacity(n);
    let tell = |to: &[flume::Sender<Word>], w: Word| {
        for t in to {
            let _ = t.send(w);
        }
    };
    let (released_tx, released_rx) = flume::bounded::<()>(n);
    // Dropping the words' senders lets the shards waiting for a word end (they close their
    // listeners), so they can be joined.
    let refuse = |ctx: &Context, shards: Vec<glommio::ExecutorJoinHandle<()>>, words: Vec<flume::Sender<Word>>, e: String| {
        drop(words);
        ctx.shutdown();
        for s in shards {
            let _ = s.join();
        }
        Err(StartError::Io(e))
    };
    let mut ours = Vec::with_capacity(n);
    // Each shard's channel for what its bind gave (again after a `Word::Bind`).
    let mut bound_rx = Vec::with_capacity(n);
    for (shard, &cpu) in placement.iter().enumerate() {
        let ctx2 = ctx.clone();
        // Its own channel, so a shard whose thread dies before it has bound (a thread it
        // cannot start, under a process limit) is seen at once instead of waited for forever
        // (review: the server hung, never listening, deaf to SIGTERM).
        let (tx, bound) = flume::bounded::<Result<(SocketAddr, u64), String>>(1);
        let (to_shard, words) = flume::bounded::<Word>(1);
        word_tx.push(to_shard);
        let released = released_tx.clone();
        match shards::spawn_executor(&format!("tephra-shard-{shard}"), cpu, move || shard_main(ctx2, shard, n, addr, tx, words, released)) {
            Ok(h) => shards.push(h),
            Err(e) => return refuse(&ctx, shards, word_tx, format!("cannot start shard {shard}: {e}")),
        }
        // Shard 0 binds first so `--bind host:0` resolves to one port every shard shares.
        let got = bound.recv();
        bound_rx.push(bound);
        match got {
            Ok(Ok((a, inode))) => {
                addr = a;
                ours.push(inode);
            }
            Ok(Err(e)) => return refuse(&ctx, shards, word_tx, e),
            Err(_) => {
                // Its thread has ended: what glommio returned says why (a runtime that could
                // not be set up, a panic).
                let why = match shards.pop().map(|h| h.join()) {
                    Some(Err(glommio::GlommioError::BuilderError(glommio::BuilderErrorKind::ThreadPanic(_)))) => {
                        format!("shard {shard} stopped before it could listen: its thread panicked (a thread it needs could not start?)")
                    }
                    Some(Err(e)) => format!("shard {shard} could not start its runtime: {e}"),
                    _ => format!("shard {shard} stopped before it could listen (a thread it needs could not start?)"),
                };
                return refuse(&ctx, shards, word_tx, why);
            }
        }
    }
    // The probe and the binds are two steps: a server started in the same few milliseconds
    // can pass its probe between them and join our listeners (review: 7 of 30 starts 10 ms
    // apart both listened, and clients were split between two stores). Looking after our own
    // binds closes that gap: of two such servers at least the later one sees the other, and a
    // server accepts only once it has looked. When both see each other, both let go of the
    // address and wait a random while; the first to find it free binds again and keeps it,
    // the other finds it held and refuses.
    let mut attempt = 1;
    loop {
        crate::fault::pause_point("before_check");
        let foreign = match foreign_listeners(addr, &ours) {
            Ok(foreign) => foreign,
            Err(e) => {
                tracing::warn!(%addr, error = %e, "could not list the listening sockets to check the address is ours alone");
                Vec::new()
            }
        };
        crate::fault::pause_point("after_check");
        if foreign.is_empty() {
            break;
        }
        let mut holders = foreign.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        holders.dedup();
        let shared = format!("cannot bind {addr}: another server began listening on {} while this one was binding; refusing to share the address (start one server per address)", holders.join(", "));
        if attempt == BIND_ATTEMPTS {
            return refuse(&ctx, shards, word_tx, shared);
        }
        attempt += 1;
        tell(&word_tx, Word::Release);
        if (0..n).any(|_| released_rx.recv().is_err()) {
            return refuse(&ctx, shards, word_tx, shared);
        }
        std::thread::sleep(backoff());
        if probe_exclusive(addr).is_err() {
            return refuse(&ctx, shards, word_tx, shared);
        }
        tracing::info!(%addr, "another server started on this address at the same moment; binding again");
        tell(&word_tx, Word::Bind);
        ours.clear();
        for bound in &bound_rx {
            match bound.recv() {
                Ok(Ok((_, inode))) => ours.push(inode),
                Ok(Err(e)) => return refuse(&ctx, shards, word_tx, e),
                Err(_) => return refuse(&ctx, shards, word_tx, "a shard stopped while binding".into()),
            }
        }
    }
    // From here connections are served, so a signal is a graceful shutdown (before, a client
    // that had its answer could see the process exit 143: a test caught it under load).
    LISTENING.store(true, Ordering::SeqCst);
    tell(&word_tx, Word::Accept);
    let metrics_addr = match ctx.settings.metrics_addr().map_err(|e| StartError::Io(e.to_string()))? {
        Some(a) => {
            let bound = metrics::serve(ctx.clone(), a).map_err(|e| StartError::Io(format!("cannot bind metrics on {a}: {e}")))?;
            // The bound address, so `metrics.bind = "host:0"` can be found (and scraped).
            tracing::info!(metrics_addr = %bound, "serving /metrics");
            Some(bound)
        }
        None => None,
    };
    tracing::info!(shards = n, tls = ctx.tls.is_some(), follower = follower.is_some(), "serving");
    if !ctx.token_digests.is_empty() {
        // As the reference says it; how many, never which.
        tracing::info!(tokens = ctx.token_digests.len(), "requiring bearer-token authentication");
    }
    // The readiness line, exactly as the reference logs it (target `tephra_server`, nothing
    // after the address; reference §2.1): harnesses wait for it, some under filters such as
    // `warn,tephra_server=info`.
    tracing::info!(target: "tephra_server", addr = %addr, "tephra server listening");
    Ok(Running { addr, metrics_addr, ctx, shards, store, follower, writer })
}

/// Set once a server of this process has bound its listeners, just before its shards start
/// accepting connections: from then on a signal is a graceful shutdown, before it the process
/// just exits (the binary's signal thread).
pub static LISTENING: AtomicBool = AtomicBool::new(false);

/// How long a start waits for the data directory's `LOCK` while another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a start waits, past [`LOCK_WAIT`] or [`BIND_WAIT`], while the previous server of
/// its data directory is still being torn down (see [`previous_server_exiting`]).
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// True when `pid` is a process on its way out: its main thread has exited (zombie) while some
/// of its threads have not yet run to their end (`/proc/PID/stat` state `Z` or `X`).
fn exiting(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))).unwrap_or(false)
}

/// True when the process named in `dir/LOCK` (the last server of the directory) is on its way
/// out. After `kill -9` on a host other programs keep busy, its idle-class sealing thread can
/// keep it, its listeners and the lock alive for seconds (review: a restart right after it was
/// refused 1 time in 4 or 5, with the address or the directory still held).
fn previous_server_exiting(dir: &std::path::Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("LOCK")).ok()?.trim().parse().ok()?;
    (pid != std::process::id() && exiting(pid)).then_some(pid)
}

/// [`Store::open_parts`], retried for up to [`LOCK_WAIT`] while another process holds the data
/// directory's lock: a server restarted the moment the previous one was told to exit can find
/// the lock still held, since the old process releases it only once the kernel has run each of
/// its threads to its end, which on a host other programs keep busy took seconds (review: a
/// restart right after `kill -9` was refused with the directory locked). A server that keeps
/// running there is still refused, after the wait.
fn open_waiting_for_lock(dir: &std::path::Path, cfg: StoreConfig) -> Result<(Store, crate::store::WriterTask), crate::store::OpenError> {
    use crate::log::{lock::LockError, LogError};
    use crate::store::OpenError;
    let started = std::time::Instant::now();
    let mut announced = false;
    loop {
        match Store::open_parts(dir, cfg.clone()) {
            Err(OpenError::Log(LogError::Lock(LockError::Locked { path, holder })))
                if holder != Some(std::process::id()) && (started.elapsed() < LOCK_WAIT || (started.elapsed() < EXIT_WAIT && holder.is_some_and(exiting))) =>
            {
                if !std::mem::replace(&mut announced, true) {
                    let holder = holder.map_or_else(|| "another process".to_string(), |p| format!("pid {p}"));
                    tracing::info!(lock = %path.display(), %holder, "data directory locked; waiting up to {LOCK_WAIT:?} for it to be released (longer while its holder is exiting)");
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// [`probe_exclusive`], retried for up to [`BIND_WAIT`] while the address is in use: a server
/// restarted the moment the previous one exited can find the old listener still held, since
/// the kernel tears down an exited process's io_uring (and the accept pending in it) in the
/// background (review: 2 of 32 immediate restarts failed with "Address already in use"),
/// and for up to [`EXIT_WAIT`] while the data directory's previous server is still exiting
/// ([`previous_server_exiting`]). Another server that keeps the address is still refused,
/// after the wait.
fn probe_until_free(addr: SocketAddr, data_dir: &std::path::Path) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut announced = false;
    let mut exit_announced = false;
    loop {
        match probe_exclusive(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && (started.elapsed() < BIND_WAIT || (started.elapsed() < EXIT_WAIT && previous_server_exiting(data_dir).is_some())) => {
                if !std::mem::replace(&mut announced, true) {
                    tracing::info!(%addr, "address in use; waiting up to {BIND_WAIT:?} for it to be released");
                }
                if started.elapsed() >= BIND_WAIT && !std::mem::replace(&mut exit_announced, true) {
                    let pid = previous_server_exiting(data_dir).unwrap_or(0);
                    tracing::info!(%addr, pid, "the data directory's previous server is still exiting; waiting up to {EXIT_WAIT:?} for it");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// How long a start waits for its address to be released (see [`probe_until_free`]).
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds `addr` with `SO_REUSEADDR` only (no `SO_REUSEPORT`) and lets it go: fails with
/// `AddrInUse` when any listener (ours or another server's) holds the address.
fn probe_exclusive(addr: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sk = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sk.set_reuse_address(true)?;
    sk.bind(&addr.into())
}

/// What a shard that has bound its listener does next (see [`start`]).
#[derive(Clone, Copy)]
enum Word {
    /// Serve: the address is ours alone.
    Accept,
    /// Another server listens there too: close the listener, say so, and wait for the next word.
    Release,
    /// Bind again (after a [`Word::Release`]).
    Bind,
}

/// How many times a start binds before it gives an address shared with another server up.
const BIND_ATTEMPTS: u32 = 4;

/// A random pause of 20-150 ms before binding again, so that of two servers that let go of
/// one address at the same moment, one binds well before the other looks.
fn backoff() -> std::time::Duration {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    std::time::Duration::from_millis(20 + r % 131)
}

/// The listening TCP sockets on `addr`'s port, other than the sockets whose inode numbers are
/// in `ours`, that share the address with it (the same IP, or a wildcard on either side), from
/// `/proc/net/tcp` and `/proc/net/tcp6` of this network namespace.
///
/// # Errors
/// When `/proc/net/tcp` cannot be read or parsed (a missing `tcp6`, IPv6 off, counts as none).
fn foreign_listeners(addr: SocketAddr, ours: &[u64]) -> Result<Vec<SocketAddr>, String> {
    use procfs::net::TcpState;
    let mut all = procfs::net::tcp().map_err(|e| e.to_string())?;
    all.extend(procfs::net::tcp6().unwrap_or_default());
    let overlaps = |a: SocketAddr| a.port() == addr.port() && (a.ip() == addr.ip() || a.ip().is_unspecified() || addr.ip().is_unspecified());
    Ok(all
        .into_iter()
        .filter(|e| e.state == TcpState::Listen && overlaps(e.local_address) && !ours.contains(&e.inode))
        .map(|e| e.local_address)
        .collect())
}

/// This shard's listener on `addr`, one of `shards`: `SO_REUSEPORT` (every shard binds the
/// same address, [`steer`] keeps the group to them) and `SO_REUSEADDR` (a restart binds at once
/// even while connections of the previous process sit in TIME_WAIT on the port, as the
/// reference's listener does; glommio's own `bind` sets only the first), backlog 1024. Also
/// returns the socket's inode number (for [`foreign_listeners`]) and its descriptor (owned by
/// the listener).
fn listen(addr: SocketAddr, shards: usize) -> std::io::Result<(glommio::net::TcpListener, u64, std::os::fd::RawFd)> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let sk = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sk.set_reuse_address(true)?;
    sk.set_reuse_port(true)?;
    sk.bind(&addr.into())?;
    sk.listen(LISTEN_BACKLOG)?;
    // A kernel that refuses the program (before Linux 4.5, or a filter forbidding it) leaves
    // the kernel's own choice, which serves our shards just as well.
    if let Err(e) = steer(sk.as_raw_fd(), shards) {
        tracing::warn!(error = %e, "could not attach the listeners' connection steering; another program binding this port with SO_REUSEPORT would get a share of the connections");
    }
    let inode = nix::sys::stat::fstat(sk.as_raw_fd())?.st_ino;
    let fd = sk.into_raw_fd();
    // SAFETY: a bound, listening TCP socket whose descriptor is handed over exactly once.
    Ok((unsafe { glommio::net::TcpListener::from_raw_fd(fd) }, inode, fd))
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; not in the libc crate for Linux).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Gives the `SO_REUSEPORT` group of `listener` (one of `shards` listening sockets) a classic BPF
/// program that sends each new connection to a random one of the group's first `shards`
/// sockets. The shards' listeners are the group's first members; any socket another program of
/// the same user binds to the port later joins after them and so never gets a connection,
/// where the kernel's own choice (a hash over all members) would hand it a share of the
/// clients: the reference's exclusive listener refuses such a program, the kernel cannot refuse
/// it here, so it is ignored instead. The program belongs to the group: attaching it from every
/// shard, and again after [`reset_backlog`] listens anew, sets the same one.
///
/// # Errors
/// The kernel refused the program (it needs Linux 4.5); the caller warns and goes on.
fn steer(listener: std::os::fd::RawFd, shards: usize) -> std::io::Result<()> {
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let program = [
        // A = a random u32; A %= shards; return A (the index in the group).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, (libc::SKF_AD_OFF + libc::SKF_AD_RANDOM) as u32),
        stmt(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, shards.max(1) as u32),
        stmt(libc::BPF_RET | libc::BPF_A, 0),
    ];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `program`, both alive for the call; the kernel copies them.
    let r = unsafe { libc::setsockopt(listener, libc::SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, (&fprog as *const libc::sock_fprog).cast(), std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Resets every connection waiting in the accept queue of `listener` (a listening socket's
/// descriptor) and listens again: a shard out of file descriptors cannot accept them, and left
/// in the backlog they would wait for their clients' own timeouts. Shutting a listening socket
/// down resets its queue and keeps its address; `listen` then puts it back in the
/// `SO_REUSEPORT` group. No descriptor is needed (a reserve one, the usual trick, can be taken
/// by another shard the moment it is freed: CI saw a connection hang that way). Returns how
/// many were waiting.
fn reset_backlog(listener: std::os::fd::RawFd, shards: usize) -> std::io::Result<u64> {
    // SAFETY: plain socket calls on a descriptor the caller's listener owns; `info` is a
    // properly sized, writable tcp_info.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // For a listening socket `tcpi_unacked` is the length of its accept queue.
        let waiting = if libc::getsockopt(listener, libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len) == 0 { u64::from(info.tcpi_unacked) } else { 0 };
        if waiting == 0 {
            return Ok(0);
        }
        if libc::shutdown(listener, libc::SHUT_RD) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::listen(listener, LISTEN_BACKLOG) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Back in the group (the group and its program are new when it was the only member).
        // The program was accepted at start; should it be refused now, the socket listens
        // anyway and the kernel's own choice applies.
        if let Err(e) = steer(listener, shards) {
            tracing::warn!(error = %e, "could not set the listeners' connection steering again");
        }
        Ok(waiting)
    }
}

/// The listeners' accept queue length.
const LISTEN_BACKLOG: i32 = 1024;

/// Descriptors kept from connections for the log's own files (a new segment, its spare, an
/// index file, a directory sync): a connection whose descriptor number comes within this (or
/// an eighth of the open-files limit, if less) of that limit is refused at accept. Small on
/// purpose: every segment holds a descriptor, so a large store may leave few free, and a
/// larger reserve refused every connection there (review: 217 segments under a limit of 256).
const FD_RESERVE: u64 = 16;

/// Accept failures, said at most once a second per shard (a shard out of descriptors fails
/// every accept it tries).
#[derive(Default)]
struct AcceptErrors {
    last_said: Option<Instant>,
    failed: u64,
    reset: u64,
}

impl AcceptErrors {
    /// Counts a failed accept; `reset` is how many pending connections were reset after it,
    /// `None` when the failure was not for want of descriptors.
    fn note(&mut self, shard: usize, reset: Option<u64>, e: &dyn std::fmt::Display) {
        self.failed += 1;
        self.reset += reset.unwrap_or(0);
        if self.last_said.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return;
        }
        self.last_said = Some(Instant::now());
        let failed = std::mem::take(&mut self.failed);
        let reset_since = std::mem::take(&mut self.reset);
        if reset.is_some() {
            tracing::warn!(shard, error = %e, failed, reset = reset_since, "accept failed: out of file descriptors; new connections are reset (raise the open-files limit, e.g. LimitNOFILE, or lower server.limits.max_connections)");
        } else {
            tracing::warn!(shard, error = %e, failed, "accept failed");
        }
    }
}

async fn shard_main(
    ctx: Arc<Context>,
    shard: usize,
    shards: usize,
    addr: SocketAddr,
    bound: flume::Sender<Result<(SocketAddr, u64), String>>,
    words: flume::Receiver<Word>,
    released: flume::Sender<()>,
) {
    // Fault injection: the shard's thread dies before it binds, as when a thread it needs
    // cannot be started under a process limit.
    if crate::fault::fires("shard_start") {
        panic!("injected fault: shard {shard} dies before it binds");
    }
    let mut addr = addr;
    let (listener, listener_fd) = loop {
        let (listener, inode, fd) = match listen(addr, shards) {
            Ok(l) => l,
            Err(e) => {
                let _ = bound.send(Err(format!("cannot bind {addr}: {e}")));
                return;
            }
        };
        let local = listener.local_addr();
        if let Ok(a) = local {
            addr = a;
        }
        let _ = bound.send(local.map(|a| (a, inode)).map_err(|e| e.to_string()));
        // Refused (the address is shared, or another shard failed to bind) or released: the
        // listener closes here, resetting whatever connected meanwhile, before any request is
        // read.
        match words.recv_async().await {
            Ok(Word::Accept) => break (listener, fd),
            Ok(Word::Release) => {
                drop(listener);
                let _ = released.send(());
                match words.recv_async().await {
                    Ok(Word::Bind) => continue,
                    _ => return,
                }
            }
            Ok(Word::Bind) | Err(_) => return,
        }
    };
    let (router, replies) = ReplyRouter::new();
    // The writer's thread wakes the dispatcher: make that wake-up reach a sleeping shard.
    glommio::spawn_local(shards::reliable_wakes(router.clone().dispatch(replies))).detach();
    let live = Rc::new(std::cell::Cell::new(0usize));
    let closing = Rc::new(event_listener::Event::new());
    let mut accept_errors = AcceptErrors::default();
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            ctx.wait_shutdown().await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                let errno = match &e {
                    glommio::GlommioError::IoError(io) => io.raw_os_error(),
                    _ => None,
                };
                if matches!(errno, Some(libc::EMFILE) | Some(libc::ENFILE)) {
                    // Out of descriptors: the pending connections would wait in the backlog
                    // for their clients' own timeouts. Reset them now (review: 33 of 60 Hellos
                    // hung, and the log took ~190 lines a second).
                    match reset_backlog(listener_fd, shards) {
                        Ok(n) => {
                            ctx.connections_refused.fetch_add(n, Ordering::Relaxed);
                            accept_errors.note(shard, Some(n), &e);
                        }
                        Err(le) => tracing::error!(shard, error = %le, "could not reset the connections waiting to be accepted, nor listen again"),
                    }
                } else {
                    accept_errors.note(shard, None, &e);
                }
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Descriptors are allocated lowest first, so a connection's number says that every one
        // below it is in use: within FD_RESERVE of the limit, refuse it, and keep what is left
        // for the log (a new segment, its spare, index files). Connections alone could
        // otherwise take every descriptor and fail each rollover (review: 284 of 300 appends
        // refused with "Too many open files" while 200 idle connections were open).
        let reserve = FD_RESERVE.min(ctx.open_files / 8);
        if std::os::fd::AsRawFd::as_raw_fd(&stream) as u64 + reserve >= ctx.open_files {
            ctx.connections_refused.fetch_add(1, Ordering::Relaxed);
            if !ctx.fd_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(open_files = ctx.open_files, reserve, "the open-files limit is nearly reached: new connections are refused, keeping descriptors for the log (raise the limit, e.g. ulimit -n or LimitNOFILE, or lower server.limits.max_connections)");
            }
            let _ = stream.shutdown(std::net::Shutdown::Both).await;
            continue;
        }
        ctx.fd_warned.store(false, Ordering::Relaxed);
        if let Some(cap) = ctx.settings.server.limits.connection_cap() {
            if ctx.active_connections.load(Ordering::SeqCst) >= cap.get() as u64 {
                ctx.connections_refused.fetch_add(1, Ordering::Relaxed);
                if !ctx.cap_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(cap = cap.get(), "connection cap reached; refusing new connections");
                }
                let _ = stream.shutdown(std::net::Shutdown::Both).await;
                continue;
            }
            ctx.cap_warned.store(false, Ordering::Relaxed);
        }
        ctx.active_connections.fetch_add(1, Ordering::SeqCst);
        live.set(live.get() + 1);
        let (ctx2, router2, live2, closing2) = (ctx.clone(), router.clone(), live.clone(), closing.clone());
        glommio::spawn_local(shards::reliable_wakes(async move {
            conn::serve(ctx2.clone(), router2, stream).await;
            ctx2.active_connections.fetch_sub(1, Ordering::SeqCst);
            live2.set(live2.get() - 1);
            closing2.notify(usize::MAX);
        }))
        .detach();
    }
    drop(listener);
    // Connections notice the shutdown themselves; wait for them to finish.
    while live.get() > 0 {
        let l = closing.listen();
        if live.get() == 0 {
            break;
        }
        futures_lite::future::or(l, glommio::timer::sleep(std::time::Duration::from_millis(100))).await;
    }
}
