//! Server settings: every configuration key with its default, the layering of the sources, the
//! validation rules and the `tephra-server` command line.
//!
//! Settings resolve from, later winning: the built-in defaults ([`Settings::default`]), the TOML
//! file named by `--config`, `TEPHRA__*` environment variables (`TEPHRA__` prefix, then the key
//! path joined with `__`, case-insensitive, values typed by the key they set), and the flags
//! `--bind`, `--data-dir`, `--log`. The log filter falls back to `TEPHRA_LOG`, then `info`.
//! `tephra.example.toml` at the repository root lists every key with its default.
//!
//! ```
//! use tephra::config::{resolve, ServerArgs};
//!
//! let args = ServerArgs { bind: Some("127.0.0.1:7000".into()), ..ServerArgs::default() };
//! let env = [("TEPHRA__SERVER__KEEPALIVE__IDLE_SECS".to_owned(), "5".to_owned())];
//! let settings = resolve(&args, env).unwrap();
//! assert_eq!(settings.bind, "127.0.0.1:7000");
//! assert_eq!(settings.server.keepalive.idle_secs, 5);
//! ```
//!
//! Documented in docs/operations.md §1, §2, §5-§7.

#![warn(missing_docs)]

mod cli;
mod error;
mod load;
mod settings;
mod validate;

pub use cli::ServerArgs;
pub use error::{ConfigError, Origin};
pub use load::{process_env, read_config_file, resolve, resolve_sources, FileSource, Overrides, ENV_PREFIX, ENV_SEPARATOR};
pub use settings::{
    check_listen_addr, cluster_id, segment_size_fits, AuthSettings, BackpressureSettings, ClusterSettings, JournalSettings, KeepaliveSettings, LimitSettings,
    MetricsSettings, ReadSettings, ReadsSettings, SegmentSettings, ServerSettings, Settings, SubscriptionSettings, TimeoutSettings, TlsSettings, TokenSettings,
    WriterSettings, COMMIT_MARKER_LEN, DEFAULT_BIND, DEFAULT_DATA_DIR, DEFAULT_LOG_FILTER, DEFAULT_SEGMENT_SIZE, DEFAULT_TICK_MS, LOG_ENV_VAR,
    MAX_KEEPALIVE_SECS, MAX_SEGMENT_SIZE, MAX_TICK_MS, MAX_TIMEOUT_SECS, MAX_ZONE_LEN, MIN_SEGMENT_SIZE, SEGMENT_HEADER_LEN,
};
pub use validate::{MAX_SHARDS, MAX_SHARDS_PER_CPU};
