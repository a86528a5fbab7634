//! The `tephra-server` command line. See
//! docs/operations.md §1, §7.

use std::path::PathBuf;

use clap::Parser;

const AFTER_HELP: &str = "\
Settings are layered, later sources winning: built-in defaults, the --config file, \
TEPHRA__* environment variables, then --bind, --data-dir and --log. Every file key maps to a \
variable by upper-casing its dotted path and joining it with double underscores: \
server.keepalive.idle_secs is TEPHRA__SERVER__KEEPALIVE__IDLE_SECS. The log filter falls back \
to TEPHRA_LOG (single underscore), then to info. tephra.example.toml lists every key with its \
default.";

/// The `tephra-server` command line: `[-c|--config PATH] [-b|--bind ADDR] [-d|--data-dir DIR]
/// [-l|--log FILTER] [--healthcheck]`, and nothing else (no positional arguments). Everything
/// except the three overrides lives in the file or the environment. Parse it with
/// [`clap::Parser::parse`] (or `try_parse_from` in tests) and hand it to
/// [`resolve`](super::resolve). `Default` is "no flags".
#[derive(Clone, Debug, Default, PartialEq, Eq, Parser)]
#[command(
    name = "tephra-server",
    about = "Tephra event store server: serves a DCB event store over TCP",
    after_help = AFTER_HELP
)]
pub struct ServerArgs {
    /// TOML configuration file; it must exist when given
    #[arg(short = 'c', long = "config", value_name = "PATH", allow_hyphen_values = true)]
    pub config: Option<PathBuf>,

    /// Address to listen on, e.g. 127.0.0.1:9000 (overrides `bind`)
    #[arg(short = 'b', long = "bind", value_name = "ADDR", allow_hyphen_values = true)]
    pub bind: Option<String>,

    /// Directory of the event store (overrides `data_dir`)
    #[arg(short = 'd', long = "data-dir", value_name = "DIR", allow_hyphen_values = true)]
    pub data_dir: Option<PathBuf>,

    /// Tracing filter such as `info` or `tephra=debug` (overrides `log`, TEPHRA__LOG and
    /// TEPHRA_LOG)
    #[arg(short = 'l', long = "log", value_name = "FILTER", allow_hyphen_values = true)]
    pub log: Option<String>,

    /// Probe the server at the configured address (Hello, then stats) and exit 0 if it is
    /// healthy, 1 if not; opens no store
    #[arg(long = "healthcheck")]
    pub healthcheck: bool,

    /// Serve reads and subscriptions from another (live) writer's data directory, read-only:
    /// takes no lock, writes nothing, refuses appends
    #[arg(long = "follow")]
    pub follow: bool,

    /// With --follow: how often to look for new commits, in milliseconds, at least 1
    /// [default: 100]
    #[arg(long = "follow-poll-ms", value_name = "MS", requires = "follow", value_parser = clap::value_parser!(u64).range(1..))]
    pub follow_poll_ms: Option<u64>,
}
