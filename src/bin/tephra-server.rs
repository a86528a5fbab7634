//! `tephra-server`: the thread-per-core DCB event store server.
//!
//! ```text
//! tephra-server [-c|--config PATH] [-b|--bind ADDR] [-d|--data-dir DIR] [-l|--log FILTER] [--healthcheck]
//! ```
//!
//! Settings: built-in defaults < TOML file < `TEPHRA__SECTION__KEY` environment < flags (seed
//! "Configuring the server"). Exit codes: 0 after a graceful shutdown (first SIGINT/SIGTERM),
//! 143 on a second signal, 1 on a configuration or start-up error or a failed healthcheck.

use clap::Parser;
use std::process::ExitCode;
use std::time::Duration;
use tephra::config::{self, ServerArgs, Settings};

fn main() -> ExitCode {
    let args = match ServerArgs::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
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
    let (targets, warning) = settings.log_targets(config::process_env());
    use tracing_subscriber::prelude::*;
    let ansi = std::env::var_os("NO_COLOR").is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::registry().with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stdout).with_filter(targets)).init();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    if settings.effective_max_batch_bytes() < settings.writer.max_batch_bytes {
        tracing::warn!(
            configured = settings.writer.max_batch_bytes,
            effective = settings.effective_max_batch_bytes(),
            "writer.max_batch_bytes exceeds the segment capacity and is clamped"
        );
    }
    // Block the termination signals in every thread; one thread takes them with sigwait.
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    if let Err(e) = set.thread_block() {
        eprintln!("cannot block signals: {e}");
        return ExitCode::from(1);
    }
    let started = if args.follow {
        tephra::server::start_follower(settings, Duration::from_millis(args.follow_poll_ms.unwrap_or(100).max(1)))
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
    let ctx = running.context().clone();
    std::thread::Builder::new()
        .name("tephra-signals".into())
        .spawn(move || {
            let mut first = true;
            loop {
                match set.wait() {
                    Ok(sig) if first => {
                        tracing::info!(signal = ?sig, "shutting down gracefully; a second signal exits at once");
                        ctx.shutdown();
                        first = false;
                    }
                    Ok(_) => std::process::exit(143),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
        .expect("signal thread");
    running.wait();
    ExitCode::SUCCESS
}

/// `--healthcheck`: Hello (first token), one stats call, exit 0 or 1; opens no store.
fn healthcheck(settings: &Settings) -> ExitCode {
    let result = (|| -> Result<(), String> {
        let addr = settings.healthcheck_addr().map_err(|e| e.to_string())?;
        let token = settings.first_auth_token();
        let mut client = match settings.tls.paths() {
            Some((cert, _)) => {
                let tls = tephra::client::tls::config_with_custom_ca(cert).map_err(|e| e.to_string())?;
                tephra::client::Client::connect_tls_with(addr, "localhost", tls, token).map_err(|e| e.to_string())?
            }
            None => tephra::client::Client::connect_with(addr, token).map_err(|e| e.to_string())?,
        };
        client.set_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        client.stats().map_err(|e| e.to_string())?;
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("healthcheck failed: {e}");
            ExitCode::from(1)
        }
    }
}
