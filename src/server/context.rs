//! Server-wide state every shard shares: settings, the store, counters for stats and
//! metrics, the accepted tokens, TLS, and the graceful-shutdown signal.

use crate::config::Settings;
use crate::store::StoreHandle;
use std::path::PathBuf;
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
    /// The connection cap was reached and said; cleared once a connection is accepted.
    pub(super) cap_warned: AtomicBool,
    /// The node's journals (docs/journals.md); unset on a follower, which serves none.
    pub journals: std::sync::OnceLock<super::journal::Journals>,
    /// The open-files limit (`RLIMIT_NOFILE`, soft) when the server started: connections are
    /// refused once a new one's descriptor comes within [`super::shard::FD_RESERVE`] (at most
    /// an eighth of it) of it.
    pub(super) open_files: u64,
    /// The descriptor reserve was reached and said; cleared once a connection is accepted.
    pub(super) fd_warned: AtomicBool,
}

impl Context {
    /// The context of a server starting over `store`, with `settings` and `tls` (its counters
    /// at zero, its uptime counted from now).
    pub(super) fn new(settings: Settings, store: StoreHandle, tls: Option<Arc<rustls::ServerConfig>>) -> Context {
        Context {
            store,
            data_dir: settings.data_dir.clone(),
            started: Instant::now(),
            active_connections: AtomicU64::new(0),
            active_subscriptions: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            connections_reaped: AtomicU64::new(0),
            read_disk_fetches: AtomicU64::new(0),
            append_errors: Default::default(),
            append_latency: std::sync::Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("bounds")),
            token_digests: settings.auth.token_strs().map(|t| <sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()).into()).collect(),
            tls,
            shutting_down: AtomicBool::new(false),
            shutdown_event: event_listener::Event::new(),
            cap_warned: AtomicBool::new(false),
            open_files: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(u64::MAX, |(soft, _)| soft),
            fd_warned: AtomicBool::new(false),
            journals: std::sync::OnceLock::new(),
            settings,
        }
    }

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

    /// The ten stats fields (docs/protocol.md §12), and ours, `writer_stopped`.
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
