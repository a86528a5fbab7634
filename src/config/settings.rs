//! The settings tree: one struct per TOML table, every key with its built-in default.
//!
//! Field names are the TOML keys. Every struct carries `#[serde(default, deny_unknown_fields)]`,
//! so a key that is left out keeps its default and a key that does not exist is an error.
//! Every key is documented in docs/operations.md §2.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

/// Default for `bind`: the data listener address.
pub const DEFAULT_BIND: &str = "127.0.0.1:9000";
/// Default for `data_dir`: the store directory, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "tephra-data";
/// Log filter used when neither `log` (`--log`, the file, `TEPHRA__LOG`) nor `TEPHRA_LOG` is set.
pub const DEFAULT_LOG_FILTER: &str = "info";
/// Name of the single-underscore environment variable that is the fallback log filter.
pub const LOG_ENV_VAR: &str = "TEPHRA_LOG";

/// Bytes reserved at the start of every segment file for its header.
pub const SEGMENT_HEADER_LEN: u64 = 64;
/// Bytes of the commit marker that ends every batch in a segment.
pub const COMMIT_MARKER_LEN: u64 = 17;
/// Default `segment.size`: 256 MiB, header included.
pub const DEFAULT_SEGMENT_SIZE: u64 = 256 * 1024 * 1024;
/// Largest accepted `segment.size` (positions inside a segment are `u32` offsets).
pub const MAX_SEGMENT_SIZE: u64 = u32::MAX as u64;
/// Smallest accepted `segment.size`: the smallest size whose largest record (a quarter of the
/// size) plus one commit marker still fits after the header. Computed from the engine's rule
/// `size / 4 + 17 <= size - 64`.
pub const MIN_SEGMENT_SIZE: u64 = min_segment_size();

const fn min_segment_size() -> u64 {
    let mut size = SEGMENT_HEADER_LEN + 1;
    while !segment_size_fits(size) {
        size += 1;
    }
    size
}

/// Whether a segment of `size` bytes can hold its header, one record of the maximum length
/// (`size / 4`) and a commit marker, and stays addressable with `u32` offsets.
pub const fn segment_size_fits(size: u64) -> bool {
    size > SEGMENT_HEADER_LEN && size <= MAX_SEGMENT_SIZE && size / 4 + COMMIT_MARKER_LEN <= size - SEGMENT_HEADER_LEN
}

/// The fully resolved server settings.
///
/// Every field is a key of the configuration file (`tephra.example.toml` shows them all with
/// their defaults) and can also be set from the environment as `TEPHRA__<PATH>`, the dotted path
/// upper-cased and joined with `__` (`server.keepalive.idle_secs` is
/// `TEPHRA__SERVER__KEEPALIVE__IDLE_SECS`). `Settings::default()` is the built-in configuration,
/// identical to an empty file. Use [`resolve`](super::resolve) to build one from the real sources
/// and [`Settings::validate`] before using a hand-built one.
///
/// See docs/operations.md §1-§2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Address of the data listener, `HOST:PORT`. Default `"127.0.0.1:9000"`. Overridden by
    /// `--bind`. A literal socket address or a `hostname:port`; anything else fails validation.
    pub bind: String,
    /// Directory holding the store's segment and index files. Default `"tephra-data"`.
    /// Overridden by `--data-dir`.
    pub data_dir: PathBuf,
    /// Tracing filter (`target=level` directives, e.g. `info` or `tephra=debug`). Unset by
    /// default; see [`Settings::log_filter`] for the fallback chain. Overridden by `--log`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// `[segment]`: log segment sizing.
    pub segment: SegmentSettings,
    /// `[writer]`: group commit and the write queue.
    pub writer: WriterSettings,
    /// `[read]`: the read planner.
    pub read: ReadSettings,
    /// `[server]` and its sub-tables: the network server.
    pub server: ServerSettings,
    /// `[metrics]`: the optional Prometheus endpoint.
    pub metrics: MetricsSettings,
    /// `[tls]`: optional TLS 1.3 on the data listener.
    pub tls: TlsSettings,
    /// `[auth]`: optional bearer-token authentication.
    pub auth: AuthSettings,
    /// `[journal]`: the limits of the journal API (ours; the reference has no such section).
    pub journal: JournalSettings,
    /// `[cluster]`: this node's place in a cluster of replicating nodes. Absent (the default):
    /// a single node, no peer port, no replication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSettings>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            bind: DEFAULT_BIND.to_owned(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            log: None,
            segment: SegmentSettings::default(),
            writer: WriterSettings::default(),
            read: ReadSettings::default(),
            server: ServerSettings::default(),
            metrics: MetricsSettings::default(),
            tls: TlsSettings::default(),
            auth: AuthSettings::default(),
            journal: JournalSettings::default(),
            cluster: None,
        }
    }
}

/// `[journal]`: the limits of the journal API, which are part of the API (docs/journals.md §7).
/// Each key can also be set by the journal seed's own `PAROS_*` variable (the key upper-cased
/// after `PAROS_`, e.g. `PAROS_MAX_READ_RECORDS`); `TEPHRA__JOURNAL__*` wins over `PAROS_*`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalSettings {
    /// `journal.max_batch_records`: most records in one write; a larger write gets `TOO_LARGE`
    /// before anything is logged. Default 1,024. At least 1.
    pub max_batch_records: u64,
    /// `journal.max_batch_bytes`: most record bytes in one write (`TOO_LARGE` above it).
    /// Default 1,048,576 (1 MiB). At least 1.
    pub max_batch_bytes: u64,
    /// `journal.max_read_records`: most records in one read page. Default 256. At least 1.
    pub max_read_records: u64,
    /// `journal.max_read_bytes`: most record bytes in one read page; a page still holds at
    /// least one record. Default 65,536. At least 1.
    pub max_read_bytes: u64,
    /// `journal.max_wait_ms`: the cap on a read's wait at the tail, in milliseconds. Default
    /// 1,000.
    pub max_wait_ms: u64,
    /// `journal.min_wait_ms`: a non-zero wait shorter than this is raised to it. Default 0.
    pub min_wait_ms: u64,
    /// `journal.admission_rounds`: writes judged but not yet durable beyond which a new write
    /// is answered `BUSY` before it is logged. Default 256. At least 1.
    pub admission_rounds: u64,
    /// `journal.segment_size`: bytes of each segment of the journal command log under
    /// `journals/`, reserved when it is created; truncation gives disk back a segment at a
    /// time. Default 67,108,864 (64 MiB). Within the bounds of `segment.size`.
    pub segment_size: u64,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            max_batch_records: 1_024,
            max_batch_bytes: 1_048_576,
            max_read_records: 256,
            max_read_bytes: 65_536,
            max_wait_ms: 1_000,
            min_wait_ms: 0,
            admission_rounds: 256,
            segment_size: 64 * 1024 * 1024,
        }
    }
}

/// Default `cluster.tick_ms`: the consensus tick, in milliseconds.
pub const DEFAULT_TICK_MS: u64 = 10;
/// Largest `cluster.tick_ms`.
pub const MAX_TICK_MS: u64 = 1_000;
/// Longest `cluster.zone`, in bytes.
pub const MAX_ZONE_LEN: usize = 64;

/// `[cluster]`: this node's place in a cluster (docs/journals.md §9). Each key can also be set
/// as `TEPHRA__CLUSTER__<KEY>`; `TEPHRA__CLUSTER__PEERS` takes the list as one comma-separated
/// string (`1=10.0.0.1:9400,2=10.0.0.2:9400`). Keys left out take the defaults below, which
/// validation refuses where a value is required (`node_id`, `bind`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// `cluster.node_id`: this node's id, unique in the cluster. Required: 0 (the default) is
    /// refused.
    pub node_id: u64,
    /// `cluster.bind`: the peer listener, `HOST:PORT`, apart from the client `bind`. Required.
    pub bind: String,
    /// `cluster.peers`: the cluster's nodes as `"ID=HOST:PORT"`, the address each one's peer
    /// listener is reached at from this node. This node's own entry may be listed (so that
    /// every node can share one list) and is ignored. Default empty. A malformed entry or an id
    /// listed twice is refused, naming the entry. See [`ClusterSettings::members`].
    pub peers: Vec<String>,
    /// `cluster.zone`: free text naming this node's failure zone (a rack, a room), at most
    /// [`MAX_ZONE_LEN`] bytes; voters are spread across zones. Unset by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// `cluster.tick_ms`: the consensus tick, in milliseconds (elections after 30 to 60 ticks
    /// without a leader, heartbeats every 5). Default 10; 1 to [`MAX_TICK_MS`].
    pub tick_ms: u64,
    /// `cluster.tls_ca`: path to the PEM bundle of the CA that signed every node's certificate.
    /// Required when `[tls]` is set (peer links then use mutual TLS with this node's
    /// `tls.cert` and `tls.key`), refused without it. Unset by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// `cluster.snapshot_entries`: entries a journal group applies between two snapshot
    /// candidates; its log is compacted to a candidate once the journal's `first_seq` passes
    /// every record up to it (docs/journals.md §9.9). Default 4096; 0 never compacts.
    pub snapshot_entries: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            node_id: 0,
            bind: String::new(),
            peers: Vec::new(),
            zone: None,
            tick_ms: DEFAULT_TICK_MS,
            tls_ca: None,
            snapshot_entries: crate::cluster::replica::SNAPSHOT_ENTRIES,
        }
    }
}

impl ClusterSettings {
    /// The other nodes, id to peer address, parsed from `peers` (this node's own entry left
    /// out).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the entry: one that is not `ID=HOST:PORT` with a
    /// non-zero whole-number id and an address [`check_listen_addr`] accepts, or one whose id or
    /// address an earlier entry already listed.
    pub fn members(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        let mut seen: BTreeMap<u64, String> = BTreeMap::new();
        for entry in &self.peers {
            let malformed = |why: &str| ConfigError::invalid(format!("cluster.peers entry {entry:?} {why}; entries are ID=HOST:PORT, like 2=10.0.0.2:9400"));
            let (id, addr) = entry.split_once('=').ok_or_else(|| malformed("has no '='"))?;
            let id: u64 = id.trim().parse().map_err(|_| malformed("does not start with a node id (a whole number)"))?;
            if id == 0 {
                return Err(malformed("names node 0; node ids start at 1"));
            }
            let addr = addr.trim();
            if check_listen_addr(addr).is_none() {
                return Err(malformed("has no HOST:PORT address after '='"));
            }
            if seen.contains_key(&id) {
                return Err(ConfigError::invalid(format!("cluster.peers entry {entry:?} lists node {id} a second time")));
            }
            // Two nodes at one address: one of them would never be reached.
            if let Some((other, _)) = seen.iter().find(|(_, a)| a.as_str() == addr) {
                return Err(ConfigError::invalid(format!("cluster.peers entry {entry:?} gives node {id} the address of node {other}")));
            }
            seen.insert(id, addr.to_owned());
        }
        seen.remove(&self.node_id);
        Ok(seen)
    }

    /// `tick_ms` as a [`Duration`].
    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }
}

/// The cluster's id: a stable 64-bit hash (FNV-1a over the little-endian bytes) of the sorted,
/// deduplicated set of every node's id, this node included. Nodes that list the same set of
/// nodes agree on it whatever addresses they reach each other at; a node listing another set
/// gets another id, and its peer frames are refused (docs/journals.md §9.4).
pub fn cluster_id(node_ids: impl IntoIterator<Item = u64>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let ids: std::collections::BTreeSet<u64> = node_ids.into_iter().collect();
    ids.iter().flat_map(|id| id.to_le_bytes()).fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// `[segment]`: how big each log segment file is. See docs/operations.md §2.2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SegmentSettings {
    /// `segment.size`: bytes per segment file, including the 64-byte header. Default
    /// 268,435,456 (256 MiB). The largest record is a quarter of this. Must lie in
    /// [`MIN_SEGMENT_SIZE`]`..=`[`MAX_SEGMENT_SIZE`] (validation error otherwise).
    pub size: u64,
}

impl Default for SegmentSettings {
    fn default() -> Self {
        SegmentSettings { size: DEFAULT_SEGMENT_SIZE }
    }
}

impl SegmentSettings {
    /// Largest framed record a segment of this size accepts: `size / 4` bytes.
    pub fn max_record_len(&self) -> u64 {
        self.size / 4
    }

    /// Bytes available to records and commit markers: `size - 64` (saturating at 0 for an
    /// invalid size). One append request must fit in this.
    pub fn capacity(&self) -> u64 {
        self.size.saturating_sub(SEGMENT_HEADER_LEN)
    }
}

/// `[writer]`: the single writer's queue and group commit. See docs/operations.md
/// §2.2, §4.1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WriterSettings {
    /// `writer.queue_capacity`: append requests that may wait for the writer, server-wide.
    /// Default 16,384. A full queue backpressures the caller. Must be at least 1.
    pub queue_capacity: usize,
    /// `writer.max_batch_records`: most append requests (not events) folded into one group
    /// commit. Default 2,048. Must be at least 1.
    pub max_batch_records: usize,
    /// `writer.max_batch_bytes`: byte budget of one batch. Default 8,388,608 (8 MiB). Not
    /// rejected when larger than a segment; clamp it with [`Settings::effective_max_batch_bytes`].
    pub max_batch_bytes: usize,
    /// `writer.tips_window`: width, in positions, of the recent-position window kept for the
    /// durable tips. Default 1,000,000. Only bounds memory.
    pub tips_window: u64,
    /// `writer.condition_force_scan`: decide append conditions by scanning the log rather than
    /// asking the index. Default `false`. Slower, never different.
    pub condition_force_scan: bool,
}

/// The writer's own defaults ([`crate::writer::WriterConfig::default`]).
impl Default for WriterSettings {
    fn default() -> Self {
        let w = crate::writer::WriterConfig::default();
        WriterSettings {
            queue_capacity: w.queue_capacity,
            max_batch_records: w.max_batch_records,
            max_batch_bytes: w.max_batch_bytes,
            tips_window: w.tips_window,
            condition_force_scan: w.condition_force_scan,
        }
    }
}

/// `[read]`: the planner. See docs/operations.md §2.2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadSettings {
    /// `read.scan_bias`: the planner uses the index only when the candidate range is at least
    /// this many times the estimated result count. Default 4; 0 and 1 always take the index,
    /// `u32::MAX` always scans (docs/architecture.md §5.2). Changes speed, never results.
    pub scan_bias: u32,
}

impl Default for ReadSettings {
    fn default() -> Self {
        ReadSettings { scan_bias: 4 }
    }
}

/// `[server]`: the network server and its sub-tables. See docs/operations.md
/// §2.2, §4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// `server.max_frame_len`: largest frame, in bytes, accepted from or sent to a client.
    /// Default 16,777,216 (16 MiB). Must be at least 1.
    pub max_frame_len: u32,
    /// `[server.reads]`: streamed reads and the read pool.
    pub reads: ReadsSettings,
    /// `[server.subscriptions]`: live subscriptions.
    pub subscriptions: SubscriptionSettings,
    /// `[server.backpressure]`: per-connection budgets.
    pub backpressure: BackpressureSettings,
    /// `[server.limits]`: server-wide limits.
    pub limits: LimitSettings,
    /// `[server.keepalive]`: TCP keepalive on accepted sockets.
    pub keepalive: KeepaliveSettings,
    /// `[server.timeouts]`: connection reaping.
    pub timeouts: TimeoutSettings,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            max_frame_len: 16 * 1024 * 1024,
            reads: ReadsSettings::default(),
            subscriptions: SubscriptionSettings::default(),
            backpressure: BackpressureSettings::default(),
            limits: LimitSettings::default(),
            keepalive: KeepaliveSettings::default(),
            timeouts: TimeoutSettings::default(),
        }
    }
}

/// `[server.reads]`: how streamed reads are cut into frames and how many threads serve them.
/// See docs/protocol.md §9, docs/architecture.md §3.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadsSettings {
    /// `server.reads.batch_events`: a streamed read or subscription sends a frame once it holds
    /// this many events. Default 1,024; 0 acts as 1 (checked after each event, as in the
    /// reference, docs/protocol.md §9).
    pub batch_events: usize,
    /// `server.reads.batch_bytes`: ... or once its buffered events reach this many bytes.
    /// Default 524,288 (512 KiB); 0 acts as 1.
    pub batch_bytes: usize,
    /// `server.reads.worker_threads`: size of the shared read pool. Default 0, meaning one
    /// worker per logical CPU; see [`ReadsSettings::worker_count`].
    pub worker_threads: usize,
}

impl Default for ReadsSettings {
    fn default() -> Self {
        ReadsSettings { batch_events: 1_024, batch_bytes: 512 * 1024, worker_threads: 0 }
    }
}

impl ReadsSettings {
    /// The number of shards to start: `worker_threads`, or when it is 0 the number of CPUs
    /// (`std::thread::available_parallelism()`, 1 if that cannot be determined); at most
    /// [`super::MAX_SHARDS_PER_CPU`] per CPU and [`super::MAX_SHARDS`] in all.
    pub fn worker_count(&self) -> NonZeroUsize {
        let cpus = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN).get();
        let cap = (cpus * super::MAX_SHARDS_PER_CPU).min(super::MAX_SHARDS);
        NonZeroUsize::new(self.worker_threads.min(cap)).unwrap_or(NonZeroUsize::new(cpus.min(cap)).unwrap_or(NonZeroUsize::MIN))
    }
}

/// `[server.subscriptions]`: live subscriptions. See docs/operations.md §4.2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubscriptionSettings {
    /// `server.subscriptions.wait_tick_ms`: how often an idle subscription wakes to re-check for
    /// shutdown or cancel, in milliseconds. Default 250. Must be at least 1.
    pub wait_tick_ms: u64,
    /// `server.subscriptions.max_concurrent`: live subscriptions one connection may hold; one
    /// more is rejected with an error. Default 64. Must be at least 1.
    pub max_concurrent: usize,
}

impl Default for SubscriptionSettings {
    fn default() -> Self {
        SubscriptionSettings { wait_tick_ms: 250, max_concurrent: 64 }
    }
}

impl SubscriptionSettings {
    /// `wait_tick_ms` as a [`Duration`].
    pub fn wait_tick(&self) -> Duration {
        Duration::from_millis(self.wait_tick_ms)
    }
}

/// `[server.backpressure]`: per-connection budgets. See docs/operations.md §4.1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackpressureSettings {
    /// `server.backpressure.max_inflight_per_conn`: applied twice, separately: appends awaiting
    /// their durable reply before the connection reader stops reading, and reads running at once
    /// (with as many more allowed to queue; past both a read is rejected). Default 256. Must be
    /// at least 1.
    pub max_inflight_per_conn: usize,
    /// `server.backpressure.frame_queue_depth`: bulk (read and subscription) frames buffered
    /// toward one client before their producers wait. Control frames have their own lane.
    /// Default 256. Must be at least 1.
    pub frame_queue_depth: usize,
}

impl Default for BackpressureSettings {
    fn default() -> Self {
        BackpressureSettings { max_inflight_per_conn: 256, frame_queue_depth: 256 }
    }
}

/// `[server.limits]`: server-wide limits. See docs/operations.md §4.3.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// `server.limits.max_connections`: connections served at once across all clients; one more
    /// is closed on accept. Default 1,024. 0 means unlimited; see
    /// [`LimitSettings::connection_cap`].
    pub max_connections: usize,
}

impl Default for LimitSettings {
    fn default() -> Self {
        LimitSettings { max_connections: 1_024 }
    }
}

impl LimitSettings {
    /// The connection cap, or `None` when `max_connections` is 0 (unlimited).
    pub fn connection_cap(&self) -> Option<NonZeroUsize> {
        NonZeroUsize::new(self.max_connections)
    }
}

/// `[server.keepalive]`: TCP keepalive, always on. See
/// docs/operations.md §4.4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeepaliveSettings {
    /// `server.keepalive.idle_secs`: seconds of silence before the first probe. Default 60.
    /// Must be at least 1.
    pub idle_secs: u64,
    /// `server.keepalive.interval_secs`: seconds between probes. Default 15. Must be at least 1.
    pub interval_secs: u64,
}

impl Default for KeepaliveSettings {
    fn default() -> Self {
        KeepaliveSettings { idle_secs: 60, interval_secs: 15 }
    }
}

/// The largest `TCP_KEEPIDLE` / `TCP_KEEPINTVL` Linux accepts (`MAX_TCP_KEEPIDLE`,
/// `MAX_TCP_KEEPINTVL`: 32767 s); larger settings are clamped to it rather than failing the
/// socket option silently.
pub const MAX_KEEPALIVE_SECS: u64 = 32_767;

impl KeepaliveSettings {
    /// `idle_secs` as a [`Duration`] (`TCP_KEEPIDLE`), 1 s to [`MAX_KEEPALIVE_SECS`].
    pub fn idle(&self) -> Duration {
        Duration::from_secs(self.idle_secs.clamp(1, MAX_KEEPALIVE_SECS))
    }

    /// `interval_secs` as a [`Duration`] (`TCP_KEEPINTVL`), 1 s to [`MAX_KEEPALIVE_SECS`].
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs.clamp(1, MAX_KEEPALIVE_SECS))
    }
}

/// `[server.timeouts]`: reaping connections that stop making progress. Every value is in
/// seconds and 0 disables it. See docs/operations.md §4.4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutSettings {
    /// `server.timeouts.incomplete_frame_secs`: once a frame's first byte has arrived, the whole
    /// frame must arrive within this time (slow-loris defence). Default 30.
    pub incomplete_frame_secs: u64,
    /// `server.timeouts.handshake_secs`: deadline, from accept, for a successful Hello.
    /// Default 0 (off), because pooling clients open connections they use later.
    pub handshake_secs: u64,
    /// `server.timeouts.idle_secs`: reap a connection with nothing in flight, no live
    /// subscription and no traffic for this long. Default 0 (off).
    pub idle_secs: u64,
}

impl Default for TimeoutSettings {
    fn default() -> Self {
        TimeoutSettings { incomplete_frame_secs: 30, handshake_secs: 0, idle_secs: 0 }
    }
}

/// The longest timeout the server acts on: 100 years. A larger value (the settings accept any
/// `u64`, as the reference does) means the same thing, never, and deadlines computed from it
/// stay representable (`Instant + Duration` panics on overflow: review, `idle_secs =
/// 9223372036854775807` reset every connection).
pub const MAX_TIMEOUT_SECS: u64 = 100 * 365 * 86_400;

fn secs_or_off(secs: u64) -> Option<Duration> {
    (secs != 0).then(|| Duration::from_secs(secs.min(MAX_TIMEOUT_SECS)))
}

impl TimeoutSettings {
    /// The incomplete-frame deadline, `None` when disabled (0).
    pub fn incomplete_frame(&self) -> Option<Duration> {
        secs_or_off(self.incomplete_frame_secs)
    }

    /// The handshake deadline, `None` when disabled (0, the default).
    pub fn handshake(&self) -> Option<Duration> {
        secs_or_off(self.handshake_secs)
    }

    /// The idle-connection deadline, `None` when disabled (0, the default).
    pub fn idle(&self) -> Option<Duration> {
        secs_or_off(self.idle_secs)
    }

    /// Whether any of the three reapers is on (the connection reader then needs to poll).
    pub fn any_enabled(&self) -> bool {
        self.incomplete_frame_secs != 0 || self.handshake_secs != 0 || self.idle_secs != 0
    }

    /// Deadline for finishing a TLS handshake, measured from accept: the first enabled value of
    /// handshake, incomplete-frame, idle (30 s with the defaults), or `None` if all are off.
    /// docs/operations.md §4.4.
    pub fn tls_handshake(&self) -> Option<Duration> {
        self.handshake().or_else(|| self.incomplete_frame()).or_else(|| self.idle())
    }
}

/// `[metrics]`: the Prometheus `/metrics` endpoint on its own port. See
/// docs/operations.md §8.2.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// `metrics.bind`: address of the endpoint, e.g. `"127.0.0.1:9100"`. Unset (the default)
    /// disables it. Must be a `HOST:PORT` when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
}

/// `[tls]`: TLS 1.3 on the data listener, off by default. Setting exactly one of the two paths is
/// a validation error. See docs/operations.md §5.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// `tls.cert`: path to the PEM certificate chain. Unset by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// `tls.key`: path to the PEM private key. Unset by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

impl TlsSettings {
    /// `(cert, key)` when TLS is configured, `None` for plaintext (or a half-set pair, which
    /// validation rejects).
    pub fn paths(&self) -> Option<(&Path, &Path)> {
        Some((self.cert.as_deref()?, self.key.as_deref()?))
    }

    /// Whether both paths are set, i.e. the listener serves TLS.
    pub fn enabled(&self) -> bool {
        self.paths().is_some()
    }
}

/// `[auth]`: bearer tokens, off by default (an empty list leaves the server open). See
/// docs/operations.md §6.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// `[[auth.tokens]]`: the accepted tokens; any one of them authenticates a connection, which
    /// is how rotation works. Default empty. Empty token strings are rejected, and so are tokens
    /// without TLS unless `allow_insecure` is set. Only settable from the file.
    pub tokens: Vec<TokenSettings>,
    /// `auth.allow_insecure`: allow tokens on a plaintext listener (TLS terminated by a proxy in
    /// front). Default `false`.
    pub allow_insecure: bool,
}

/// One `[[auth.tokens]]` entry. A table rather than a bare string so that scopes can be added
/// later without breaking existing files. `Debug` never prints the secret.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenSettings {
    /// `token`: the bearer secret a client sends in its Hello. Must not be empty.
    pub token: String,
}

impl TokenSettings {
    /// A token entry holding `token`.
    pub fn new(token: impl Into<String>) -> Self {
        TokenSettings { token: token.into() }
    }
}

impl fmt::Debug for TokenSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSettings").field("token", &"<redacted>").finish()
    }
}

impl AuthSettings {
    /// The configured token strings, in file order. Empty means authentication is off.
    pub fn token_strs(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().map(|t| t.token.as_str())
    }

    /// Whether any token is configured (connections must then authenticate).
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }
}

/// Parses an address without touching DNS: a literal socket address, or `host:port` where
/// `host` is a syntactically valid host name and `port` a `u16`. `None` when malformed. The
/// server checks its listen addresses with it, the CLI the server addresses it is given.
pub fn check_listen_addr(addr: &str) -> Option<()> {
    if addr.parse::<SocketAddr>().is_ok() {
        return Some(());
    }
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    host_ok.then_some(())
}

/// Resolves a validated listen address to one socket address (literal addresses without DNS).
fn resolve_listen_addr(key: &str, addr: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let unresolvable = |detail: String| ConfigError::Invalid { message: format!("{key} {addr:?} cannot be resolved: {detail}") };
    addr.to_socket_addrs().map_err(|e| unresolvable(e.to_string()))?.next().ok_or_else(|| unresolvable("no addresses".to_owned()))
}

impl Settings {
    /// The data listener address, resolved (a host name is looked up, first address wins).
    /// Errors with `bind "<addr>" cannot be resolved: ...` if the lookup fails.
    pub fn bind_addr(&self) -> Result<SocketAddr, ConfigError> {
        resolve_listen_addr("bind", &self.bind)
    }

    /// The `/metrics` address, resolved, or `None` when `metrics.bind` is unset (disabled).
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.metrics.bind.as_deref().map(|a| resolve_listen_addr("metrics.bind", a)).transpose()
    }

    /// The address `--healthcheck` dials: [`Settings::bind_addr`] with an unspecified IP
    /// (`0.0.0.0`, `[::]`) replaced by the matching loopback address. docs/operations.md §7.
    pub fn healthcheck_addr(&self) -> Result<SocketAddr, ConfigError> {
        let mut addr = self.bind_addr()?;
        match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            _ => {}
        }
        Ok(addr)
    }

    /// The token the healthcheck presents: the first configured one, if any. docs/operations.md §7.
    pub fn first_auth_token(&self) -> Option<&str> {
        self.auth.token_strs().next()
    }

    /// `writer.max_batch_bytes` clamped to the segment capacity (`segment.size - 64`), which is
    /// what the writer must be started with. The server logs a warning when this differs from
    /// the configured value. docs/operations.md §1.3 (startup order).
    pub fn effective_max_batch_bytes(&self) -> usize {
        let capacity = usize::try_from(self.segment.capacity()).unwrap_or(usize::MAX);
        self.writer.max_batch_bytes.min(capacity)
    }

    /// The tracing filter directive string. In order: `log` (set by `--log`, the file's `log`
    /// key or `TEPHRA__LOG`), else the `TEPHRA_LOG` variable found in `env` (single underscore;
    /// pass `std::env::vars()` or [`process_env`](super::process_env)), else `"info"`.
    /// See docs/operations.md §1.2 (the log filter).
    pub fn log_filter(&self, env: impl IntoIterator<Item = (String, String)>) -> String {
        if let Some(log) = &self.log {
            return log.clone();
        }
        env.into_iter().find(|(k, _)| k == LOG_ENV_VAR).map(|(_, v)| v).unwrap_or_else(|| DEFAULT_LOG_FILTER.to_owned())
    }

    /// [`Settings::log_filter`] parsed as `tracing_subscriber` `Targets` (`target=level`
    /// directives, no regex). A filter that does not parse falls back to INFO for everything,
    /// like the reference; the second element is then a warning (naming the filter and the parse
    /// error) for the caller to log once logging is up.
    pub fn log_targets(&self, env: impl IntoIterator<Item = (String, String)>) -> (tracing_subscriber::filter::Targets, Option<String>) {
        use tracing_subscriber::filter::{LevelFilter, Targets};
        let filter = self.log_filter(env);
        match filter.parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(e) => (Targets::new().with_default(LevelFilter::INFO), Some(format!("invalid log filter {filter:?} ({e}); logging at info"))),
        }
    }
}
