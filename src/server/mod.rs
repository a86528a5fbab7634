//! The network server: thread-per-core shards speaking protocol v1.
//!
//! One pinned glommio executor per shard (`server.reads.worker_threads`, 0 = one per CPU), each
//! with its own `SO_REUSEPORT` listener on the same address, so the kernel spreads connections
//! and a connection lives and dies on the shard that accepted it. The store's writer runs on a
//! thread of its own (`tephra-writer`, not pinned) and hands each batch to its committer thread
//! (`tephra-commit`), which blocks in `pwrite` and `fdatasync` the way the reference's writer
//! thread does, so a commit costs no io_uring worker hand-offs and no shard's connections wait
//! behind it. Appends cross to it over the bounded writer queue; results come back grouped per
//! shard per commit. Reads and subscriptions run on the connection's shard. (DESIGN "Shape",
//! seed "Backpressure".)
//!
//! Code map: [`start`] runs the start as a sequence of named steps; `exclusive` holds the
//! start-up checks against other processes (a previous server still exiting, another server on
//! the address), `tls` loads the certificate and key, `shard` starts the shards, binds their
//! listeners and runs each one's accept loop, `conn` serves one connection, `reply` routes
//! append results back to their connections, [`Context`] is the state every shard shares, and
//! [`StartError`] says which stage of a start failed. Everything runtime-specific goes through
//! the `shards` crate.

mod conn;
mod context;
mod error;
mod exclusive;
pub mod journal;
pub mod metrics;
mod reply;
mod shard;
mod tls;

pub use context::Context;
pub use error::StartError;
pub(crate) use reply::ReplyRouter;
pub use tls::TlsError;

use crate::config::Settings;
use crate::store::{Store, StoreConfig, StoreHandle, WriterTask};
use crate::writer::WriterConfig;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A running server: its bound address and a way to stop it.
pub struct Running {
    follower: Option<Arc<crate::follow::Follower>>,
    /// The address every shard listens on.
    pub addr: SocketAddr,
    /// The metrics address, when enabled.
    pub metrics_addr: Option<SocketAddr>,
    ctx: Arc<Context>,
    shards: Vec<shards::Executor<()>>,
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

/// This server's answer to a Hello (docs/protocol.md §6): protocol version 1 and our
/// crate version.
pub(crate) fn hello_ack() -> crate::proto::HelloAck {
    crate::proto::HelloAck { protocol_version: crate::proto::PROTOCOL_VERSION, server_version: env!("CARGO_PKG_VERSION").into() }
}

/// The smallest `server.max_frame_len` (bytes of frame body) with which this server can
/// answer a Hello from a client: the HelloAck to request id 1 (clients number their requests
/// from 1; any id up to 127 takes as many bytes). Below it every handshake ends in a close
/// (docs/protocol.md §4: a frame over the cap is never sent).
pub fn min_usable_frame_len() -> usize {
    prost::Message::encoded_len(&crate::proto::Response::new(1, crate::proto::response::Kind::HelloAck(hello_ack())))
}

/// Opens the store and starts every shard; returns once all listeners are bound.
///
/// # Errors
/// [`StartError`], by the stage that failed: io_uring cannot be used
/// ([`shards::io_uring_usable`]), the locked-memory limit is below what the shards' runtime
/// needs ([`shards::memlock_sufficient`]), the TLS files are invalid, the address is held, the
/// store refuses to open, or a shard cannot start or bind.
pub fn start(settings: Settings) -> Result<Running, StartError> {
    start_mode(settings, None)
}

/// Starts a read-only server over a follower of `settings.data_dir` polled every `poll`
/// (docs/operations.md §10).
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

/// The start, step by step: what can be checked without touching the data directory first,
/// then the store, the writer, the shards and their address, and the metrics endpoint.
fn start_mode(settings: Settings, follow: Option<std::time::Duration>) -> Result<Running, StartError> {
    check_host()?;
    let tls = tls::load(&settings)?;
    let peer_tls = tls::load_peer(&settings)?;
    let bind = settings.bind_addr()?;
    // An address another listener holds is refused before the data directory is touched (a
    // refused start must not create or open a store).
    check_address_free(bind, &settings.data_dir)?;
    let opened = open_store(&settings, follow)?;
    let ctx = Arc::new(Context::new(settings, opened.handle.clone(), tls));
    let n = shard_count(&ctx);
    let writer = start_writer(opened.writer)?;
    if opened.follower.is_none() {
        let journals = start_journals(&ctx.settings, peer_tls).inspect_err(|_| ctx.shutdown())?;
        let _ = ctx.journals.set(journals);
    }
    // Again right before binding, since opening a large store takes a while.
    check_address_free(bind, &ctx.settings.data_dir).inspect_err(|_| ctx.shutdown())?;
    crate::fault::pause_point("before_bind");
    let (shards, addr) = shard::Launch::start(&ctx, n, bind)?.claim_address(&ctx)?.accept();
    let metrics_addr = serve_metrics(&ctx)?;
    announce(&ctx, n, opened.follower.is_some(), addr);
    Ok(Running { addr, metrics_addr, ctx, shards, store: opened.store, follower: opened.follower, writer })
}

/// Starts the journals: the single-node sequencer, or with `[cluster]` the node's loop and its
/// peer links (docs/journals.md §9.5), over TLS with `peer_tls`.
fn start_journals(settings: &Settings, peer_tls: Option<crate::cluster::tls::PeerTls>) -> Result<journal::Journals, StartError> {
    let (limits, frame) = (settings.journal.clone(), settings.server.max_frame_len);
    let Some(c) = &settings.cluster else {
        return journal::Journals::start(&settings.data_dir, limits, frame).map_err(StartError::Journals);
    };
    let peers = c.members().map_err(|e| StartError::Cluster(e.to_string()))?;
    let ids: Vec<u64> = peers.keys().copied().chain([c.node_id]).collect();
    let cluster = crate::config::cluster_id(ids.iter().copied());
    // Zones are not exchanged yet, so placement sees none (it must be alike on every node).
    let mut members: Vec<crate::cluster::replica::Member> = ids.iter().map(|&node| crate::cluster::replica::Member { node, zone: None }).collect();
    members.sort_by_key(|m| m.node);
    let node = crate::cluster::node::NodeSettings {
        node: c.node_id,
        cluster,
        members,
        zone: c.zone.clone(),
        tick: c.tick(),
        admission: limits.admission_rounds as usize,
        settle: std::time::Duration::from_secs(1),
        snapshot_entries: c.snapshot_entries,
    };
    let (inbox_tx, inbox) = flume::bounded(4096);
    let tls = peer_tls.is_some();
    // The data directory's incarnation goes in every peer handshake, so it is known before
    // the links start.
    let incarnation = crate::cluster::node::check_identity(&settings.data_dir, cluster, c.node_id).map_err(StartError::Journals)?;
    let me = crate::cluster::link::Identity { node: c.node_id, cluster, incarnation };
    let links = crate::cluster::link::Links::start(me, &c.bind, &peers, peer_tls, inbox_tx)
        .map_err(|e| StartError::Cluster(format!("cannot listen for peers on {}: {e}", c.bind)))?;
    tracing::info!(node = c.node_id, cluster = format!("{cluster:016x}"), peer_addr = %links.local_addr(), peers = peers.len(), tls, "cluster member");
    journal::Journals::start_cluster(&settings.data_dir, limits, frame, node, links, inbox).map_err(StartError::Journals)
}

/// Checks, before anything is opened, that this host can run the shards' runtime: io_uring
/// ([`shards::io_uring_usable`]) and enough locked memory ([`shards::memlock_sufficient`]).
fn check_host() -> Result<(), StartError> {
    shards::io_uring_usable()?;
    Ok(shards::memlock_sufficient()?)
}

/// Refuses an address another listener holds, after waiting a little for a previous server of
/// the data directory to let go of it ([`exclusive::probe_until_free`]). Every shard's
/// listener sets `SO_REUSEPORT`, which lets any process of the same user bind the same address
/// too (and take half the connections); like the reference, the server refuses to start on an
/// address another listener holds. Port 0 is always free.
fn check_address_free(bind: SocketAddr, data_dir: &std::path::Path) -> Result<(), StartError> {
    if bind.port() == 0 {
        return Ok(());
    }
    exclusive::probe_until_free(bind, data_dir).map_err(|source| StartError::AddressInUse { addr: bind, source })
}

/// What [`open_store`] opened: the store and its writer (a writing server), or a follower.
struct Opened {
    store: Option<Store>,
    writer: Option<WriterTask>,
    follower: Option<Arc<crate::follow::Follower>>,
    handle: StoreHandle,
}

/// The store's configuration from the settings.
fn store_config(settings: &Settings) -> StoreConfig {
    let mut segment = crate::log::segment::SegmentConfig::new(settings.segment.size);
    segment.max_record_len = settings.segment.max_record_len();
    StoreConfig {
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
    }
}

/// Opens the data directory: the store (waiting a little for a previous server's lock,
/// [`exclusive::open_waiting_for_lock`]), or, with `follow`, a follower polling it that often.
fn open_store(settings: &Settings, follow: Option<std::time::Duration>) -> Result<Opened, StartError> {
    let cfg = store_config(settings);
    match follow {
        None => {
            let (store, writer) = exclusive::open_waiting_for_lock(&settings.data_dir, cfg)?;
            let handle = store.handle();
            Ok(Opened { store: Some(store), writer: Some(writer), follower: None, handle })
        }
        Some(poll) => {
            let mut fc = crate::follow::FollowerConfig::new(cfg.segment);
            fc.poll_interval = poll;
            fc.scan_bias = cfg.read.scan_bias;
            let f = crate::follow::Follower::open(&settings.data_dir, fc).map_err(|source| StartError::Follow { dir: settings.data_dir.clone(), source })?;
            f.start_polling();
            let handle = f.handle();
            Ok(Opened { store: None, writer: None, follower: Some(f), handle })
        }
    }
}

/// How many shards to start: `server.reads.worker_threads` (0: one per CPU), warned of when
/// above the most this server starts.
fn shard_count(ctx: &Context) -> usize {
    let n = ctx.settings.server.reads.worker_count().get();
    if ctx.settings.server.reads.worker_threads > n {
        tracing::warn!(worker_threads = ctx.settings.server.reads.worker_threads, shards = n, "server.reads.worker_threads is above the most shards this server starts ({} per CPU, {} in all; each is a thread with its own io_uring rings and I/O memory); starting {n} shards instead", crate::config::MAX_SHARDS_PER_CPU, crate::config::MAX_SHARDS);
    }
    n
}

/// Starts the writer on its own thread, unpinned (the scheduler may run it on whichever CPU
/// is free); a follower has none.
fn start_writer(task: Option<WriterTask>) -> Result<Option<std::thread::JoinHandle<()>>, StartError> {
    task.map(|t| t.spawn().map_err(StartError::Writer)).transpose()
}

/// Serves `/metrics` when `metrics.bind` is set; returns the bound address (so that
/// `metrics.bind = "host:0"` can be found and scraped).
fn serve_metrics(ctx: &Arc<Context>) -> Result<Option<SocketAddr>, StartError> {
    let Some(a) = ctx.settings.metrics_addr()? else { return Ok(None) };
    let bound = metrics::serve(ctx.clone(), a).map_err(|source| StartError::Metrics { addr: a, source })?;
    tracing::info!(metrics_addr = %bound, "serving /metrics");
    Ok(Some(bound))
}

/// Says the server is up: shards, TLS, follower, token authentication, and last the readiness
/// line, exactly as the reference logs it (target `tephra_server`, nothing after the address;
/// docs/operations.md §1.3): harnesses wait for it, some under filters such as
/// `warn,tephra_server=info`.
fn announce(ctx: &Context, shards: usize, follower: bool, addr: SocketAddr) {
    tracing::info!(shards, tls = ctx.tls.is_some(), follower, "serving");
    if !ctx.token_digests.is_empty() {
        // As the reference says it; how many, never which.
        tracing::info!(tokens = ctx.token_digests.len(), "requiring bearer-token authentication");
    }
    tracing::info!(target: "tephra_server", addr = %addr, "tephra server listening");
}

/// Set once a server of this process has bound its listeners, just before its shards start
/// accepting connections: from then on a signal is a graceful shutdown, before it the process
/// just exits (the binary's signal thread).
pub static LISTENING: AtomicBool = AtomicBool::new(false);
