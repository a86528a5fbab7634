//! The startup rules a well-typed configuration must still satisfy.
//!
//! The messages of the rules the reference has are kept word for word (docs/operations.md §2); the
//! extra rules (segment size, planner bias, frame and batch sizes, addresses) follow the same
//! style (docs/operations.md §2.1).

use super::error::ConfigError;
use super::settings::{check_listen_addr, segment_size_fits, ClusterSettings, Settings, MAX_SEGMENT_SIZE, MAX_TICK_MS, MAX_ZONE_LEN, MIN_SEGMENT_SIZE};

fn at_least_one(key: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::invalid(format!("{key} must be at least 1")))
    } else {
        Ok(())
    }
}

fn listen_addr(key: &str, addr: &str) -> Result<(), ConfigError> {
    check_listen_addr(addr).ok_or_else(|| ConfigError::invalid(format!("{key} must be an address like 127.0.0.1:9000 or localhost:9000, got {addr:?}")))
}

/// Most shards (`server.reads.worker_threads`) a server starts: each is a thread with its own
/// io_uring rings and locked I/O memory, and far more than the machine has CPUs only costs
/// (review: 100000 ran out of file descriptors after ~25 s of starting threads). A larger
/// setting starts this many, with a warning ([`ReadsSettings::worker_count`]); the reference
/// starts with any number (review: ours refused 1025).
///
/// [`ReadsSettings::worker_count`]: super::ReadsSettings::worker_count
///
/// Also at most [`MAX_SHARDS_PER_CPU`] per CPU.
pub const MAX_SHARDS: usize = 1024;

/// Most shards a server starts per CPU. A shard is a thread with io_uring rings and 4 MiB of
/// registered I/O memory (about 4.3 MB resident); beyond a few per CPU more of them only cost
/// memory and start-up time (review: `worker_threads = 1025` took 4.4 GB and 11 s on two CPUs,
/// where the reference, whose setting sizes a pool of plain read threads, took 42 MB). A larger
/// setting starts this many per CPU, with a warning.
pub const MAX_SHARDS_PER_CPU: usize = 4;

impl Settings {
    /// Checks every rule and returns the first one broken, as [`ConfigError::Invalid`] whose
    /// message names the key:
    ///
    /// - `writer.queue_capacity`, `writer.max_batch_records`,
    ///   `server.subscriptions.wait_tick_ms`, `server.subscriptions.max_concurrent`,
    ///   `server.backpressure.max_inflight_per_conn`, `server.backpressure.frame_queue_depth`,
    ///   `server.keepalive.idle_secs`, `server.keepalive.interval_secs`:
    ///   `<key> must be at least 1`;
    /// - `data_dir must not be empty`;
    /// - `segment.size` must hold the 64-byte header plus a largest record (`size / 4`) and a
    ///   17-byte commit marker, and be at most `u32::MAX`;
    /// - `bind` and `metrics.bind` must be `HOST:PORT` (a literal address or a host name);
    /// - `tls.cert and tls.key must be set together`; neither may be an empty path
    ///   (`tls.cert must not be empty`);
    /// - `auth.tokens entries must have a non-empty token`;
    /// - `auth.tokens require tls; set tls.cert and tls.key, or auth.allow_insecure = true`;
    /// - with a `[cluster]` section: `cluster.node_id` set and non-zero, `cluster.bind` a
    ///   `HOST:PORT` other than `bind`, every `cluster.peers` entry well-formed and each id
    ///   listed once ([`ClusterSettings::members`]), `cluster.zone` at most 64 bytes,
    ///   `cluster.tick_ms` from 1 to 1000, `cluster.tls_ca` set (not empty) exactly when `[tls]`
    ///   is (peer links use TLS when the client listener does).
    ///
    /// [`resolve`](super::resolve) calls this; call it yourself on a hand-built `Settings`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let w = &self.writer;
        let s = &self.server;
        at_least_one("writer.queue_capacity", w.queue_capacity as u64)?;
        let j = &self.journal;
        at_least_one("journal.max_batch_records", j.max_batch_records)?;
        at_least_one("journal.max_batch_bytes", j.max_batch_bytes)?;
        at_least_one("journal.max_read_records", j.max_read_records)?;
        at_least_one("journal.max_read_bytes", j.max_read_bytes)?;
        at_least_one("journal.admission_rounds", j.admission_rounds)?;
        if !segment_size_fits(j.segment_size) {
            return Err(ConfigError::invalid(format!(
                "journal.segment_size must be between {MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE} bytes, got {}",
                j.segment_size
            )));
        }
        if j.min_wait_ms > j.max_wait_ms {
            return Err(ConfigError::invalid(format!("journal.min_wait_ms ({}) must not be above journal.max_wait_ms ({})", j.min_wait_ms, j.max_wait_ms)));
        }
        at_least_one("writer.max_batch_records", w.max_batch_records as u64)?;
        if !segment_size_fits(self.segment.size) {
            return Err(ConfigError::invalid(format!(
                "segment.size must be between {MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE} bytes, got {}",
                self.segment.size
            )));
        }
        // `read.scan_bias`, `server.reads.batch_events` and `batch_bytes` may be 0, as in the
        // reference (its table gives them no lower bound and it starts with 0): a bias of 0
        // always takes the index, and thresholds of 0 send every event in a frame of its own.
        // `server.max_frame_len` has no lower bound, as in the reference: under ~45 bytes no
        // Hello can be answered, which the server says at start.
        at_least_one("server.subscriptions.wait_tick_ms", s.subscriptions.wait_tick_ms)?;
        at_least_one("server.backpressure.max_inflight_per_conn", s.backpressure.max_inflight_per_conn as u64)?;
        at_least_one("server.subscriptions.max_concurrent", s.subscriptions.max_concurrent as u64)?;
        at_least_one("server.backpressure.frame_queue_depth", s.backpressure.frame_queue_depth as u64)?;
        at_least_one("server.keepalive.idle_secs", s.keepalive.idle_secs)?;
        at_least_one("server.keepalive.interval_secs", s.keepalive.interval_secs)?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir must not be empty"));
        }
        listen_addr("bind", &self.bind)?;
        if let Some(addr) = &self.metrics.bind {
            listen_addr("metrics.bind", addr)?;
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return Err(ConfigError::invalid("tls.cert and tls.key must be set together"));
        }
        for (key, path) in [("tls.cert", &self.tls.cert), ("tls.key", &self.tls.key)] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(ConfigError::invalid(format!("{key} must not be empty")));
            }
        }
        if self.auth.tokens.iter().any(|t| t.token.is_empty()) {
            return Err(ConfigError::invalid("auth.tokens entries must have a non-empty token"));
        }
        if self.auth.enabled() && !self.tls.enabled() && !self.auth.allow_insecure {
            return Err(ConfigError::invalid("auth.tokens require tls; set tls.cert and tls.key, or auth.allow_insecure = true"));
        }
        if let Some(cluster) = &self.cluster {
            self.validate_cluster(cluster)?;
        }
        Ok(())
    }

    fn validate_cluster(&self, c: &ClusterSettings) -> Result<(), ConfigError> {
        if c.node_id == 0 {
            return Err(ConfigError::invalid("cluster.node_id must be set to this node's id, a whole number from 1"));
        }
        listen_addr("cluster.bind", &c.bind)?;
        if c.bind == self.bind {
            return Err(ConfigError::invalid(format!("cluster.bind must differ from bind (both are {:?}): peers and clients have ports of their own", c.bind)));
        }
        c.members()?;
        if let Some(zone) = &c.zone {
            if zone.len() > MAX_ZONE_LEN {
                return Err(ConfigError::invalid(format!("cluster.zone must be at most {MAX_ZONE_LEN} bytes, got {}", zone.len())));
            }
        }
        if !(1..=MAX_TICK_MS).contains(&c.tick_ms) {
            return Err(ConfigError::invalid(format!("cluster.tick_ms must be between 1 and {MAX_TICK_MS}, got {}", c.tick_ms)));
        }
        match (&c.tls_ca, self.tls.enabled()) {
            (Some(ca), _) if ca.as_os_str().is_empty() => Err(ConfigError::invalid("cluster.tls_ca must not be empty")),
            (None, true) => Err(ConfigError::invalid(
                "cluster peer links use TLS when [tls] is set: set cluster.tls_ca to the CA that signed every node's certificate",
            )),
            (Some(_), false) => Err(ConfigError::invalid(
                "cluster.tls_ca is set but [tls] is not: peer links use TLS only with this node's own certificate; set tls.cert and tls.key, or leave cluster.tls_ca out",
            )),
            _ => Ok(()),
        }
    }
}
