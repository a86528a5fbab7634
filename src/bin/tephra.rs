//! `tephra`: the command-line client of a Tephra event store.
//!
//! Append, read, follow, inspect, export and import events over the native protocol, using
//! the blocking [`Client`](tephra::client::Client). Human-readable output by default,
//! `--json` for scripts; exit codes are listed in `--help` (see [`EXIT_CODES`]).

#[path = "tephra/cluster.rs"]
mod cluster;
#[path = "tephra/commands.rs"]
mod commands;
#[path = "tephra/journal.rs"]
mod journal;
#[path = "tephra/jsonl.rs"]
mod jsonl;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tephra::client::{tls, Client, ClientError};
use tephra::proto::{ErrorCode, FrameError};

/// The exit-code table printed at the end of `--help`.
const EXIT_CODES: &str = "\
Exit codes:
  0  success (a `subscribe` stopped with Ctrl-C included)
  1  any other failure (server INTERNAL or SHUTDOWN, a local file error, a protocol error)
  2  bad usage or bad request: invalid arguments or names, a malformed input line (nothing
     is appended), the server's BAD_REQUEST, EMPTY, TOO_LARGE or AFTER_BEYOND_TIP, or a
     frame over this client's --max-frame-len (reported as TOO_LARGE)
  3  conflict: the append condition matched (CONFLICT or ALREADY_EXISTS)
  4  connection failure: cannot connect, TLS or token refused, or the connection was lost
  130  `import` or `export --output` stopped by SIGINT (Ctrl-C); 143: stopped by SIGTERM.
     What was written, and how to resume, is said on stderr";

/// Command-line client for a Tephra event store.
#[derive(Debug, Parser)]
#[command(name = "tephra", version, after_help = EXIT_CODES, after_long_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Server address, HOST:PORT.
    #[arg(long, global = true, env = "TEPHRA_ADDR", default_value = "127.0.0.1:9000")]
    addr: String,
    /// Bearer token sent in the Hello.
    #[arg(long, global = true, env = "TEPHRA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Connect with TLS, trusting the PEM certificate(s) in PATH.
    #[arg(long, global = true, value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// Connect with TLS and verify the certificate for NAME (default: the host of --addr).
    #[arg(long, global = true, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Connect with TLS, trusting the system's root certificates.
    #[arg(long, global = true)]
    tls: bool,
    /// Give up on a server that does not answer within SECS seconds (not for `subscribe`): a
    /// number over 0, fractions allowed; anything from 100 years up (`inf` included) means no
    /// practical limit.
    #[arg(long, global = true, value_name = "SECS", allow_hyphen_values = true, value_parser = timeout_secs)]
    timeout: Option<Duration>,
    /// Machine-readable output: JSON lines on stdout, errors as JSON on stderr.
    #[arg(long, global = true)]
    json: bool,
    /// This client's frame cap in bytes, both ways, at least 1 MiB (the server has its own,
    /// `server.max_frame_len`; raise both to move events over 16 MiB).
    #[arg(long, global = true, value_name = "BYTES", default_value_t = tephra::proto::DEFAULT_MAX_FRAME_LEN,
          value_parser = max_frame_len)]
    max_frame_len: u32,
}

/// The least `--max-frame-len`: the server never learns this client's cap and packs a read's
/// `ReadEvents` frames up to `server.reads.batch_bytes` (512 KiB by default), so a smaller cap
/// would refuse reads of small events.
const MIN_MAX_FRAME_LEN: u32 = 1 << 20;

/// Parses `--max-frame-len`: a byte count of at least [`MIN_MAX_FRAME_LEN`].
fn max_frame_len(arg: &str) -> Result<u32, String> {
    let n: u32 = arg.parse().map_err(|e| format!("expected a number of bytes: {e}"))?;
    if n < MIN_MAX_FRAME_LEN {
        return Err(format!(
            "must be at least {MIN_MAX_FRAME_LEN} (1 MiB): the server packs read batches into frames of up to server.reads.batch_bytes (512 KiB by default) and never learns this client's cap, so a smaller cap would refuse reads of small events"
        ));
    }
    Ok(n)
}

/// The longest `--timeout`: 100 years, no practical limit. A larger value (up to infinity) is
/// taken as this one: `Duration` cannot hold every `f64`, and a deadline computed from the
/// timeout must stay representable (`Instant + Duration` panics on overflow).
const LONGEST_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses `--timeout`: a number of seconds over 0 (`2`, `0.25`, `1e3`), as a duration between
/// 1 ns (a positive value below it is rounded up) and [`LONGEST_TIMEOUT`] (a larger value,
/// `inf` included, is taken as it).
///
/// Errors: text that is not a number, NaN, and 0 or less, each with its own message.
fn timeout_secs(arg: &str) -> Result<Duration, String> {
    let secs: f64 = arg.trim().parse().map_err(|_| "expected a number of seconds, such as 10 or 0.5".to_owned())?;
    if secs.is_nan() {
        return Err("expected a number of seconds, not NaN".to_owned());
    }
    if secs <= 0.0 {
        return Err(
            "the timeout must be more than 0 seconds (leave --timeout out for no limit on the calls; the connect and the Hello then give up after 10 s)"
                .to_owned(),
        );
    }
    let d = Duration::try_from_secs_f64(secs).unwrap_or(LONGEST_TIMEOUT);
    Ok(d.clamp(Duration::from_nanos(1), LONGEST_TIMEOUT))
}

/// The subcommands. Each states its usage line: clap's own lists, in an error's usage, every
/// option that has a value, and `--addr` always has one (its default, or `TEPHRA_ADDR`), so
/// it was shown as if required (`Usage: tephra append --addr <ADDR> --type <TYPE>`).
#[derive(Debug, Subcommand)]
enum Command {
    /// Append one event (from flags) or a batch (JSON lines on stdin), atomically.
    #[command(override_usage = "tephra append [OPTIONS] --type <TYPE>\n       tephra append [OPTIONS] --stdin")]
    Append(commands::AppendArgs),
    /// Read matching events, oldest first (or newest first with --backward).
    #[command(override_usage = "tephra read [OPTIONS]")]
    Read(commands::ReadArgs),
    /// Follow matching events: catch up, then print new ones until Ctrl-C.
    #[command(override_usage = "tephra subscribe [OPTIONS]")]
    Subscribe(commands::SubscribeArgs),
    /// Show the server's statistics.
    #[command(override_usage = "tephra stats [OPTIONS]")]
    Stats,
    /// Write a range of events as JSON lines (the `import` format).
    #[command(override_usage = "tephra export [OPTIONS]")]
    Export(commands::ExportArgs),
    /// Append the events of a JSON-lines file (or stdin) in batches, in order.
    #[command(override_usage = "tephra import [OPTIONS] [FILE]")]
    Import(commands::ImportArgs),
    /// Journals: create, list, write, read, tail, set-leader, truncate (exit codes: see
    /// `tephra journal --help`).
    #[command(override_usage = "tephra journal [OPTIONS] <COMMAND>")]
    Journal(journal::JournalArgs),
    /// A cluster of servers: `status` shows each node, its peers and its groups.
    #[command(override_usage = "tephra cluster [OPTIONS] status")]
    Cluster(cluster::ClusterArgs),
}

/// A failure: what to print and which exit code to use.
#[derive(Debug)]
pub struct CliError {
    /// Process exit code (see [`EXIT_CODES`]); 0 means "stop quietly".
    code: u8,
    message: String,
    /// The wire error code and conflict position (`"code"` and `"conflict_position"` in
    /// `--json` output): the server's when it refused, `TOO_LARGE` for a frame over this
    /// client's cap.
    wire: Option<(ErrorCode, Option<u64>)>,
    /// More fields for the `--json` error object (an interrupted import's counts), or
    /// `None`.
    details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl CliError {
    /// Exit 2: bad usage or input.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError { code: 2, message: message.into(), wire: None, details: None }
    }

    /// Exit 1: anything else.
    pub fn other(message: impl Into<String>) -> CliError {
        CliError { code: 1, message: message.into(), wire: None, details: None }
    }

    /// Exit 128 + `signal` (130 for SIGINT, 143 for SIGTERM): a command stopped by a signal
    /// at a safe point; `message` says what was done and `details` gives it to `--json`.
    pub fn interrupted(signal: i32, message: String, details: serde_json::Map<String, serde_json::Value>) -> CliError {
        CliError { code: u8::try_from(128 + signal).unwrap_or(130), message, wire: None, details: Some(details) }
    }

    /// A failed client call whose request is small (a read, a subscription, stats), prefixed
    /// with what was being done: a frame over this client's cap came from the server.
    pub fn client(context: &str, err: ClientError) -> CliError {
        CliError::from_client(context, err, false)
    }

    /// A failed append, prefixed with what was being done: a frame over this client's cap is
    /// the append's request (the answer to an append is small).
    pub fn append(context: &str, err: ClientError) -> CliError {
        CliError::from_client(context, err, true)
    }

    /// A failed client call; `request_over_cap` says which way a frame over this client's cap
    /// went (`true`: the request, refused before sending; `false`: a frame from the server).
    fn from_client(context: &str, err: ClientError, request_over_cap: bool) -> CliError {
        let (code, wire) = match &err {
            ClientError::Server { code, conflict_position, .. } => (refused_exit(*code), Some((*code, conflict_position.map(|p| p.get())))),
            ClientError::Io(_) | ClientError::UnexpectedEof | ClientError::Frame(FrameError::Torn { .. }) => (4, None),
            // Refused as the server refuses a frame over its own cap.
            ClientError::Frame(FrameError::TooLong { .. }) => (refused_exit(ErrorCode::TooLarge), Some((ErrorCode::TooLarge, None))),
            ClientError::Frame(_) | ClientError::Protocol(_) => (1, None),
        };
        let message = match &err {
            ClientError::Io(e) if timed_out(e) => format!("{context}: the server did not answer within --timeout"),
            ClientError::Frame(FrameError::TooLong { .. }) if request_over_cap => {
                format!("{context}: {err} (this client's frame cap: --max-frame-len; the server's is server.max_frame_len)")
            }
            ClientError::Frame(FrameError::TooLong { len, max }) => format!(
                "{context}: the server sent a frame of {len} bytes, over this client's frame cap of {max} bytes (raise --max-frame-len to receive it)"
            ),
            // The server's frame-level refusal: its text is pinned by the reference and does
            // not name the setting.
            ClientError::Server { code: ErrorCode::TooLarge, message, .. }
                if tephra::proto::convert::text::frame_cap_of(message).is_some() =>
            {
                format!("{context}: {err} (the server's frame cap, server.max_frame_len)")
            }
            // The reference's protocol ends a connection at shutdown by closing it, with no
            // frame (docs/operations.md §9), so this is all a client can know.
            ClientError::UnexpectedEof => format!(
                "{context}: the server closed the connection (a server shutting down or restarting does that; so does one that ended this connection for idling or a limit)"
            ),
            ClientError::Server { code: code @ (ErrorCode::Conflict | ErrorCode::AlreadyExists), retryable, conflict_position, .. } => {
                format!("{context}: {}", condition_failed(*code, *retryable, conflict_position.map(|p| p.get())))
            }
            _ => format!("{context}: {err}"),
        };
        CliError { code, message, wire, details: None }
    }

    /// A local write failed: a closed pipe (`tephra read | head`) stops quietly.
    pub fn output(err: io::Error) -> CliError {
        if err.kind() == io::ErrorKind::BrokenPipe {
            return CliError { code: 0, message: String::new(), wire: None, details: None };
        }
        CliError::other(format!("writing output: {err}"))
    }

    fn report(&self, json: bool) {
        if self.code == 0 {
            return;
        }
        if json {
            let mut obj = serde_json::json!({ "error": self.message, "exit_code": self.code });
            if let Some((code, position)) = self.wire {
                obj["code"] = code.short_name().into();
                if let Some(p) = position {
                    obj["conflict_position"] = p.into();
                }
            }
            for (k, v) in self.details.iter().flatten() {
                obj[k] = v.clone();
            }
            eprintln!("{obj}");
        } else {
            eprintln!("tephra: {}", self.message);
        }
    }
}

/// A refused append condition in words: which query matched and where (the server's own text
/// is the reference's, `append condition conflict (Boundary, Durable(Position(7)))`, pinned
/// for compatibility; docs/protocol.md §2.3). Nothing of the append was written either way.
fn condition_failed(code: ErrorCode, retryable: bool, position: Option<u64>) -> String {
    let (name, query) = match code {
        ErrorCode::Conflict => ("CONFLICT", "the condition's query (--if-type/--if-tag, after --after)"),
        _ => ("ALREADY_EXISTS", "the existence query (--exists-type/--exists-tag)"),
    };
    match position {
        Some(p) => format!("{name}: the event at position {p} matches {query}; nothing was appended"),
        None if retryable => {
            format!("{name}: an event appended concurrently, in the same commit, matches {query}; nothing was appended (retrying may succeed)")
        }
        None => format!("{name}: an event matches {query}; nothing was appended"),
    }
}

/// The exit code for a request the server refused with `code` (see [`EXIT_CODES`]).
fn refused_exit(code: ErrorCode) -> u8 {
    match code {
        ErrorCode::Conflict | ErrorCode::AlreadyExists => 3,
        ErrorCode::BadRequest | ErrorCode::Empty | ErrorCode::TooLarge | ErrorCode::AfterBeyondTip => 2,
        ErrorCode::Unauthenticated => 4,
        _ => 1,
    }
}

/// A socket timeout (`--timeout` ran out): blocking sockets report it as `WouldBlock`.
fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// The host part of `HOST:PORT` or `[V6]:PORT`, for certificate verification.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// How long the connect and the Hello may take when `--timeout` is not given: a server that
/// accepts and never answers (not a Tephra server, or a stuck one) must not hang a command.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What to do about a server certificate the TLS handshake refused (`e`), or nothing for any
/// other error: rustls names only the check that failed (for a self-signed certificate checked
/// against the system's roots, often an unsupported signature algorithm, not an unknown issuer).
fn untrusted_hint(e: &io::Error, ca: Option<&std::path::Path>) -> String {
    let refused = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).is_some_and(|t| matches!(t, rustls::Error::InvalidCertificate(_)));
    match (refused, ca) {
        (false, _) => String::new(),
        (true, None) => {
            " (the server's certificate is not signed by a root this system trusts; for a self-signed or private-CA certificate pass --tls-ca FILE)".to_owned()
        }
        (true, Some(path)) => {
            format!(" (the server's certificate does not check out against {}, or names another host: see --tls-server-name)", path.display())
        }
    }
}

/// Why the TLS handshake refused the server's certificate, in words, or `None` for any other
/// error.
fn refused_certificate(e: &io::Error) -> Option<String> {
    use rustls::CertificateError as C;
    let Some(rustls::Error::InvalidCertificate(c)) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else { return None };
    Some(match c {
        C::UnknownIssuer => "it is not signed by a trusted root".to_owned(),
        C::BadSignature => "its signature does not verify".to_owned(),
        C::UnsupportedSignatureAlgorithmContext { .. } | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
            "its signature uses an algorithm no trusted root can check, as a self-signed certificate's does".to_owned()
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => "it does not name this host".to_owned(),
        C::Expired | C::ExpiredContext { .. } => "it has expired".to_owned(),
        C::NotValidYet | C::NotValidYetContext { .. } => "it is not valid yet".to_owned(),
        C::Revoked => "it has been revoked".to_owned(),
        C::BadEncoding => "it is not a well-formed certificate".to_owned(),
        // The variant's name only, without the fields (byte lists of OIDs).
        other => format!("{other:?}").split(|ch: char| !ch.is_alphanumeric()).next().unwrap_or_default().to_owned(),
    })
}

/// Connects and performs the Hello; `timeout` applies the global `--timeout` to the calls
/// after it too. The connect and the Hello are bounded by `--timeout`, or [`HELLO_TIMEOUT`].
pub fn connect(g: &Global, timeout: bool) -> Result<Client, CliError> {
    let token = g.token.as_deref();
    // The timeout bounds the connect and the Hello too.
    let limit = g.timeout;
    let use_tls = g.tls || g.tls_ca.is_some() || g.tls_server_name.is_some();
    let result = if use_tls {
        let config = match &g.tls_ca {
            Some(path) => tls::config_with_custom_ca(path).map_err(|e| CliError::usage(format!("--tls-ca {}: {e}", path.display())))?,
            None => tls::config_with_native_roots().map_err(|e| CliError::other(format!("TLS roots: {e}")))?,
        };
        let name = g.tls_server_name.clone().unwrap_or_else(|| host_of(&g.addr).to_owned());
        Client::connect_tls_within(g.addr.as_str(), &name, config, token, limit.unwrap_or(HELLO_TIMEOUT))
    } else {
        Client::connect_within(g.addr.as_str(), token, limit.unwrap_or(HELLO_TIMEOUT))
    };
    let mut client = result.map_err(|e| {
        let what = match e.kind() {
            io::ErrorKind::PermissionDenied => "authentication failed at",
            _ => "cannot connect to",
        };
        let code = if e.kind() == io::ErrorKind::InvalidInput { 2 } else { 4 };
        let message = match limit {
            Some(d) if timed_out(&e) => format!("{what} {}: no answer within {d:?} (--timeout)", g.addr),
            None if timed_out(&e) => {
                format!("{what} {}: no answer to the Hello within {HELLO_TIMEOUT:?} (is a Tephra server listening there? --timeout sets the limit)", g.addr)
            }
            _ => match refused_certificate(&e) {
                // rustls's own text is its Debug form, OIDs as byte lists: say it in words.
                Some(why) => format!("{what} {}: the server's certificate was refused: {why}{}", g.addr, untrusted_hint(&e, g.tls_ca.as_deref())),
                None => format!("{what} {}: {e}{}", g.addr, untrusted_hint(&e, g.tls_ca.as_deref())),
            },
        };
        CliError { code, message, wire: None, details: None }
    })?;
    client.set_max_frame_len(g.max_frame_len);
    if !timeout || limit.is_none() {
        // Without --timeout, or for a long-lived command (subscribe): the limit covered only
        // the connect and the Hello.
        client.set_timeout(None).map_err(|e| CliError::other(format!("setting the timeout: {e}")))?;
    }
    Ok(client)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Append(a) => commands::append(&cli.global, a),
        Command::Read(a) => commands::read(&cli.global, a),
        Command::Subscribe(a) => commands::subscribe(&cli.global, a),
        Command::Stats => commands::stats(&cli.global),
        Command::Export(a) => commands::export(&cli.global, a),
        Command::Import(a) => commands::import(&cli.global, a),
        Command::Journal(a) => journal::run(&cli.global, a),
        Command::Cluster(a) => cluster::run(&cli.global, a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            e.report(cli.global.json);
            ExitCode::from(e.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn hosts_are_taken_from_addresses() {
        assert_eq!(host_of("db.example.com:9000"), "db.example.com");
        assert_eq!(host_of("[::1]:9000"), "::1");
        assert_eq!(host_of("127.0.0.1:1"), "127.0.0.1");
    }
}
