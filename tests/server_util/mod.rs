//! What the `server_*` tests of our binary share: the binary, a configuration that must be
//! refused, and a server started on a port of the caller's choosing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tephra_test_support::{run_to_exit, Launch, Process};

/// Our `tephra-server` binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

/// Asserts that our server, given `toml` and `env`, exits 1 with `configuration error: want`
/// on stderr and never listens.
pub fn expect_config_error(toml: Option<&str>, env: &[(&str, &str)], want: &str) {
    let out = run_to_exit(&bin(), &["--bind", "127.0.0.1:0"], env, toml, Duration::from_secs(20));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains(&format!("configuration error: {want}")), "stderr: {}", out.stderr);
    assert!(!out.stdout.contains("listening"), "it must not start: {}", out.stdout);
}

/// The launch of `binary --bind 127.0.0.1:port --data-dir data args` with 16 MiB segments,
/// then `env`.
pub fn on_port(binary: &Path, port: u16, data: &Path, args: &[&str], env: &[(&str, &str)]) -> Launch {
    Launch::new(binary)
        .args(["--bind", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data)
        .args(args)
        .env("TEPHRA__SEGMENT__SIZE", tephra_test_support::server::TEST_SEGMENT_SIZE)
        .envs(env.iter().copied())
}

/// Starts `binary --bind 127.0.0.1:port --data-dir data` (16 MiB segments, then `env`): every
/// line of its stdout and stderr arrives on the receiver.
pub fn spawn_on_port(binary: &Path, port: u16, data: &Path, env: &[(&str, &str)]) -> (Process, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    let process = on_port(binary, port, data, &[], env).lines_to(tx).spawn().unwrap_or_else(|e| panic!("{e}"));
    (process, rx)
}

/// A scratch directory for a server held at crash points: the directory (keep it alive), the
/// `data` directory in it, and the `release` path prefix to name in `TEPHRA_CRASH_RELEASE`
/// (creating `<release>-<point>` lets the server go on past that point).
pub fn pause_scratch() -> (tempfile::TempDir, PathBuf, String) {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = tmp.path().join("data");
    let release = tmp.path().join("release").display().to_string();
    (tmp, data, release)
}

/// Runs our `tephra-server --healthcheck --bind addr` (with `config_toml`, if any, as its
/// configuration file) to its exit.
pub fn healthcheck(addr: &str, config_toml: Option<&str>) -> tephra_test_support::Exited {
    run_to_exit(&bin(), &["--healthcheck", "--bind", addr], &[], config_toml, Duration::from_secs(20))
}
