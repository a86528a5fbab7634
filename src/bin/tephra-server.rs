//! `tephra-server`: the thread-per-core DCB event store server.
//!
//! ```text
//! tephra-server [-c|--config PATH] [-b|--bind ADDR] [-d|--data-dir DIR] [-l|--log FILTER] [--healthcheck]
//! ```
//!
//! Settings: built-in defaults < TOML file < `TEPHRA__SECTION__KEY` environment < flags (seed
//! "Configuring the server"). Exit codes: 0 after a graceful shutdown (first SIGINT/SIGTERM/SIGHUP),
//! 143 on a second signal, 1 on a configuration or start-up error or a failed healthcheck.

use clap::Parser;

// mimalloc: per-thread free lists without glibc's arena locking and consolidation passes
// (measured with perf at 16 connections x batch 64: glibc malloc/free were ~9% of all CPU in
// the load generator and ~2% in the server's writer).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;
use std::time::Duration;
use tephra::config::{self, ServerArgs, Settings};

/// `help`, `--help` or `-h`.
fn is_help_word(a: &std::ffi::OsStr) -> bool {
    a == "help" || a == "--help" || a == "-h"
}

/// Where the first help word stands in `argv` (after the program name), skipping the value
/// of every option that takes one (`-c help` names a file "help", `-c --` one named "--");
/// `None` when there is none, or when `--` (the end of options) comes first.
fn help_word_at(argv: &[std::ffi::OsString]) -> Option<usize> {
    use clap::CommandFactory;
    // The options that take a value, as clap knows them, in both spellings.
    let cmd = ServerArgs::command();
    let takes_value = |a: &std::ffi::OsStr| {
        cmd.get_arguments().filter(|o| o.get_action().takes_values() && !o.is_positional()).any(|o| {
            o.get_short().is_some_and(|c| a.to_str() == Some(format!("-{c}").as_str()))
                || o.get_long().is_some_and(|l| a.to_str() == Some(format!("--{l}").as_str()))
        })
    };
    let mut i = 1;
    while i < argv.len() {
        if is_help_word(&argv[i]) {
            return Some(i);
        }
        if argv[i] == "--" {
            return None;
        }
        i += if takes_value(&argv[i]) { 2 } else { 1 };
    }
    None
}

fn main() -> ExitCode {
    // Transparent huge pages off for the whole process, before it allocates much: mimalloc
    // marks its 1 GiB arenas MADV_HUGEPAGE, and the first touch of each 2 MiB page there is
    // zeroed inside the page fault of whichever thread touched it. On the writer that stalled
    // every append in flight: 23 stalls of 4-25 ms in 15 s of 16 connections x batch 64, each
    // one page fault (its CPU time, counted with getrusage); with THP off, p99.9 4.2 vs 5.5-7.4
    // ms and the worst request 9.6 vs 26-30 ms. The usual advice for latency-bound stores.
    let thp = nix::sys::prctl::set_thp_disable(true);
    let args = match parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    let settings = match config::resolve(&args, config::process_env()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("configuration error: {e}");
            return ExitCode::from(1);
        }
    };
    if args.healthcheck {
        return healthcheck(&settings);
    }
    init_logging(&settings);
    if let Err(e) = thp {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off for this process (prctl PR_SET_THP_DISABLE); page faults may stall appends for milliseconds");
    }
    check_settings(&settings);
    let serving = match take_signals() {
        Ok(slot) => slot,
        Err(e) => {
            eprintln!("cannot block signals: {e}");
            return ExitCode::from(1);
        }
    };
    let started = if args.follow {
        tephra::server::start_follower(settings, Duration::from_millis(args.follow_poll_ms.unwrap_or(100)))
    } else {
        tephra::server::start(settings)
    };
    let running = match started {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "tephra server failed to start");
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let _ = serving.set(running.context().clone());
    running.wait();
    ExitCode::SUCCESS
}

/// Parses the command line. Help as the reference reads it (review: scripts written for it
/// must keep their exit codes): `help`, `--help` (and our `-h`) anywhere an option may stand
/// ask for the usage. What comes before must parse (`--bogus --help` is refused); only more
/// help words may follow, and one `--` last (`--help extra`, `--help -b ADDR` and `help --
/// extra` are refused, exit 1; `help help`, `help --` and `--healthcheck help` print the
/// usage, exit 0). A help word in an option's value place (`-c help`) is that value.
///
/// # Errors
/// The exit code once the usage or the error has been printed.
fn parse_args() -> Result<ServerArgs, ExitCode> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(at) = help_word_at(&argv) {
        let after = &argv[at + 1..];
        let after = if after.last().is_some_and(|a| a == "--") { &after[..after.len() - 1] } else { after };
        if let Some(extra) = after.iter().find(|a| !is_help_word(a)) {
            use clap::CommandFactory;
            let e = ServerArgs::command().error(
                clap::error::ErrorKind::UnknownArgument,
                format!("unexpected argument '{}' after '{}': nothing but help may follow it", extra.to_string_lossy(), argv[at].to_string_lossy()),
            );
            let _ = e.print();
            return Err(ExitCode::from(1));
        }
        argv.truncate(at);
        argv.push("--help".into());
    }
    ServerArgs::try_parse_from(argv).map_err(|e| {
        let code = if e.use_stderr() { 1 } else { 0 };
        let _ = e.print();
        ExitCode::from(code)
    })
}

/// Starts logging to stdout under the configured filter (ANSI colours on a terminal unless
/// `NO_COLOR` is set). An empty filter logs nothing, as the reference's does, so that is said
/// on stderr first.
fn init_logging(settings: &Settings) {
    if blank_filter(&settings.log_filter(config::process_env())) {
        // Logging is off from here on, as in the reference, so say it where it is still seen.
        eprintln!("tephra-server: note: the log filter (--log, the log key, TEPHRA__LOG or TEPHRA_LOG) is empty, so nothing is logged, the `tephra server listening` line included, as the reference does; leave it unset for info, or set it to off to silence the server without this note");
    }
    let (targets, warning) = settings.log_targets(config::process_env());
    use tracing_subscriber::prelude::*;
    let ansi = std::env::var_os("NO_COLOR").is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::registry().with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stdout).with_filter(targets)).init();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
}

/// Says which settings are clamped or defeat themselves, as the reference warns of every clamp
/// (docs/operations.md §1.3, startup order), and raises the open-files limit for the connection cap
/// ([`open_files_for`]). The default batch budget (8 MiB) over a small segment.size is the
/// expected case, not a mistake: it is said at info (new-user review); a configured budget
/// that does not fit is warned of.
fn check_settings(settings: &Settings) {
    if settings.effective_max_batch_bytes() < settings.writer.max_batch_bytes {
        let (configured, effective) = (settings.writer.max_batch_bytes, settings.effective_max_batch_bytes());
        if configured == tephra::writer::WriterConfig::default().max_batch_bytes {
            tracing::info!(configured, effective, "writer.max_batch_bytes (the default) exceeds the segment capacity and is clamped");
        } else {
            tracing::warn!(configured, effective, "writer.max_batch_bytes exceeds the segment capacity and is clamped");
        }
    }
    for (key, secs) in
        [("server.keepalive.idle_secs", settings.server.keepalive.idle_secs), ("server.keepalive.interval_secs", settings.server.keepalive.interval_secs)]
    {
        if secs > tephra::config::MAX_KEEPALIVE_SECS {
            tracing::warn!(configured = secs, effective = tephra::config::MAX_KEEPALIVE_SECS, "{key} is over what Linux accepts and is clamped");
        }
    }
    open_files_for(settings.server.limits.connection_cap().map(|c| c.get()));
    let usable = tephra::server::min_usable_frame_len();
    if (settings.server.max_frame_len as usize) < usable {
        // Accepted, as by the reference, but no handshake can succeed.
        tracing::warn!(
            configured = settings.server.max_frame_len,
            needed = usable,
            "server.max_frame_len is too small for the answer to a Hello: every client will be disconnected at the handshake"
        );
    }
    if settings.writer.max_batch_bytes == 0 {
        // Accepted, as by the reference: every request is then over budget and commits alone.
        tracing::warn!("writer.max_batch_bytes = 0: group commit is off, every append request is synced on its own");
    }
}

/// Where the signal thread finds the context of the server once it serves.
type Serving = std::sync::Arc<std::sync::OnceLock<std::sync::Arc<tephra::server::Context>>>;

/// Blocks the termination signals (SIGINT, SIGTERM, and SIGHUP: a closed terminal or a
/// supervisor's stop, graceful too, as the reference's ctrlc termination set is) in every
/// thread, and starts the one thread that takes them with sigwait. It runs from here on, so a
/// signal during a long start (recovering a large store, rebuilding its indexes) is not left
/// waiting for the start to finish (review: it was taken only once the server listened).
/// Until the server is up it exits at once: nothing is served yet, and an interrupted recovery
/// is redone at the next start. Returns where to put the server's context once it serves.
///
/// # Errors
/// The signals could not be blocked.
fn take_signals() -> nix::Result<Serving> {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGHUP);
    set.thread_block()?;
    let serving = Serving::default();
    let slot = serving.clone();
    std::thread::Builder::new().name("tephra-signals".into()).spawn(move || on_signals(set, slot)).expect("signal thread");
    Ok(serving)
}

/// The signal thread: the first signal once serving is a graceful shutdown, a second one exits
/// at once (143); before serving, any signal exits at once.
fn on_signals(set: nix::sys::signal::SigSet, slot: Serving) {
    let mut first = true;
    loop {
        let Ok(sig) = set.wait() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        match serving_context(&slot) {
            Some(ctx) if first => {
                tracing::info!(signal = ?sig, "shutting down gracefully; a second signal exits at once");
                ctx.shutdown();
                first = false;
            }
            Some(_) => std::process::exit(143),
            None => {
                tracing::info!(signal = ?sig, "signal during startup: exiting before serving");
                std::process::exit(143);
            }
        }
    }
}

/// The serving server's context; a start that has bound its listeners is handing it over, so
/// it is waited for (up to 5 s); before that, nothing is served yet (`None`).
fn serving_context(slot: &Serving) -> Option<std::sync::Arc<tephra::server::Context>> {
    slot.get().cloned().or_else(|| {
        if !tephra::server::LISTENING.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
            if let Some(c) = slot.get() {
                return Some(c.clone());
            }
        }
        None
    })
}

/// Whether the log filter `filter` holds no directive at all (`""`, `" "`, `","`): it then
/// enables nothing, as the reference's does, which an operator may not have meant (an unset
/// shell variable in `--log "$FILTER"`), unlike `off`.
fn blank_filter(filter: &str) -> bool {
    filter.split(',').all(|directive| directive.trim().is_empty())
}

/// `--healthcheck`: Hello (first token), one stats call, exit 0 or 1 (1 also when the stats say
/// the writer has stopped); opens no store.
fn healthcheck(settings: &Settings) -> ExitCode {
    match probe(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("healthcheck failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// Every step of the healthcheck (dial, TLS handshake, each read and write) is bounded by this
/// (docs/operations.md §7), so a server that accepts and then says nothing fails instead of hanging.
const HEALTHCHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Dials the configured address, completes the Hello (id 1) and one Stats (id 2) with raw
/// frames. With `tls.cert` set it speaks TLS 1.3 and pins that certificate byte for byte: the
/// name in it is not checked, and SNI is `localhost`.
fn probe(settings: &Settings) -> Result<(), String> {
    use std::io::Write;
    use tephra::client::{closed_before_hello, name_early_close, tls, ConnectStep};
    use tephra::proto::{self, request, response, Request};
    let addr = settings.healthcheck_addr().map_err(|e| e.to_string())?;
    let token = settings.first_auth_token();
    let tcp = std::net::TcpStream::connect_timeout(&addr, HEALTHCHECK_TIMEOUT).map_err(|e| format!("connect {addr}: {e}"))?;
    tcp.set_read_timeout(Some(HEALTHCHECK_TIMEOUT)).map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(HEALTHCHECK_TIMEOUT)).map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let mut io: Box<dyn ReadWrite> = match settings.tls.paths() {
        Some((cert, _)) => {
            let config = pinned_tls_config(cert)?;
            let name = rustls::pki_types::ServerName::try_from("localhost").expect("a valid name");
            let conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let deadline = std::time::Instant::now() + HEALTHCHECK_TIMEOUT;
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock).map_err(|e| {
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                        format!("TLS handshake: no answer within {HEALTHCHECK_TIMEOUT:?}")
                    } else if tls::answered_without_tls(&e) {
                        format!("TLS handshake: the server at {addr} did not answer with TLS (probably a plaintext port; the configuration's tls.cert makes the healthcheck use TLS)")
                    } else {
                        format!("TLS handshake: {}", name_early_close(e, ConnectStep::TlsHandshake))
                    }
                })?;
                if std::time::Instant::now() >= deadline {
                    return Err("TLS handshake timed out".into());
                }
            }
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    let mut dec = proto::FrameDecoder::new(proto::DEFAULT_MAX_FRAME_LEN);
    // `step` is `Some(Hello)` for the Hello: a close or a reset before its answer gets the
    // connection-limit hint.
    let mut call = |req: Request, step: Option<ConnectStep>| -> Result<proto::Response, String> {
        let early = |e: std::io::Error| match step {
            Some(step) => name_early_close(e, step),
            None => e,
        };
        let mut buf = Vec::new();
        proto::encode_frame(&req, proto::DEFAULT_MAX_FRAME_LEN, &mut buf).map_err(|e| e.to_string())?;
        io.write_all(&buf).and_then(|()| io.flush()).map_err(|e| format!("send: {}", early(e)))?;
        match dec.read_next(&mut io) {
            Ok(Some(body)) => <proto::Response as prost::Message>::decode(body).map_err(|e| format!("bad response: {e}")),
            Ok(None) => Err(step.map_or_else(|| "the server closed the connection".into(), closed_before_hello)),
            Err(proto::FrameError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(format!("no answer within {HEALTHCHECK_TIMEOUT:?}"))
            }
            Err(proto::FrameError::TooLong { len, .. }) if proto::frame::is_http_prefix(len) => {
                Err(format!("the server at {addr} answered with HTTP: not a Tephra server"))
            }
            Err(proto::FrameError::TooLong { len, .. }) if proto::frame::is_tls_record_prefix(len) => {
                Err("the server answered with TLS: give --healthcheck the server's configuration (--config), which names tls.cert".into())
            }
            Err(proto::FrameError::Io(e)) => Err(format!("receive: {}", early(e))),
            Err(e) => Err(format!("receive: {e}")),
        }
    };
    match call(Request::hello(1, token), Some(ConnectStep::Hello))?.kind {
        Some(response::Kind::HelloAck(ack)) if ack.protocol_version == proto::PROTOCOL_VERSION => {}
        Some(response::Kind::Error(e)) => return Err(format!("hello refused: {}", e.message)),
        other => return Err(format!("unexpected answer to hello: {other:?}")),
    }
    match call(Request::new(2, request::Kind::Stats(proto::StatsRequest {})), None)?.kind {
        // Our servers say when the writer has stopped (fail-stop after a failed write or
        // sync): reads still work, appends do not, so the server is not healthy.
        Some(response::Kind::Stats(s)) if !s.writer_stopped.is_empty() => Err(format!("the writer has stopped: {}", s.writer_stopped)),
        Some(response::Kind::Stats(_)) => Ok(()),
        Some(response::Kind::Error(e)) => Err(format!("stats refused: {}", e.message)),
        other => Err(format!("unexpected answer to stats: {other:?}")),
    }
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

/// A TLS 1.3 client config that accepts exactly the first certificate of `cert_pem` (the
/// server's own), whatever names it carries, still checking the handshake signatures.
fn pinned_tls_config(cert_pem: &std::path::Path) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    let file = std::fs::File::open(cert_pem).map_err(|e| format!("cannot read tls.cert {}: {e}", cert_pem.display()))?;
    let chain = rustls_pemfile::certs(&mut std::io::BufReader::new(file))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid tls.cert {}: {e}", cert_pem.display()))?;
    let pinned = chain.first().ok_or_else(|| format!("tls.cert {} holds no certificate", cert_pem.display()))?;
    // The check passes (the server serves it, as OpenSSL- and Go-based clients accept it),
    // but says what rustls-based clients will do (review: it passed in silence).
    for warning in tephra::client::tls::server_certificate_warnings(&chain) {
        eprintln!("healthcheck: warning: {warning}");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Pinned { cert: pinned.to_vec(), algorithms: provider.signature_verification_algorithms };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// Accepts the pinned end-entity certificate only.
#[derive(Debug)]
struct Pinned {
    cert: Vec<u8>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_slice() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General("the server's certificate is not the configured tls.cert".into()))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Raises the soft open-files limit to the hard one (a service manager's default soft limit,
/// often 1,024, is below what `max_connections` = 1,024 needs once the server's own files are
/// counted), and says so at start when the limit still leaves no room for `cap` connections.
fn open_files_for(cap: Option<usize>) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft };
    // The server's own descriptors: rings, segments, indexes, listeners, a few per shard.
    const OWN: u64 = 128;
    if let Some(cap) = cap {
        if limit < cap as u64 + OWN {
            tracing::warn!(open_files = limit, max_connections = cap, "the open-files limit leaves no room for server.limits.max_connections: connections past it are refused at accept, keeping up to 16 descriptors for the log (raise it, e.g. ulimit -n or LimitNOFILE)");
        }
    }
}
