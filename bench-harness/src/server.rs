//! Starting and stopping a server process for a benchmark run: ours or the reference,
//! started the same way (`--bind 127.0.0.1:0 --data-dir DIR`, settings through
//! `TEPHRA__*` variables), ready once it prints `tephra server listening addr=IP:PORT`.
//!
//! The child runs in its own process group (a terminal's Ctrl-C goes to the harness only)
//! and is asked to die with us (`PR_SET_PDEATHSIG`), so even a `kill -9` of the harness
//! leaves no server behind; [`ServerProcess::stop`] (also run on drop) sends
//! SIGTERM to its pid, waits, then SIGKILLs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tephra_test_support::{Launch, Process};

pub use tephra_test_support::parse_listening;

/// How long a server may take to print its readiness line.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to exit after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// What to start.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The `tephra-server` binary.
    pub binary: PathBuf,
    /// The data directory (created if missing).
    pub data_dir: PathBuf,
    /// Extra environment (`TEPHRA__SEGMENT__SIZE`, ...).
    pub env: Vec<(String, String)>,
    /// Where the server's stdout and stderr go (appended; stderr lines marked `[stderr] `).
    pub log_file: PathBuf,
}

/// A running server.
pub struct ServerProcess {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its pid.
    pub pid: u32,
    /// From just before the process was spawned until its readiness line was read: the
    /// time it took to open the store and bind.
    pub ready_after: Duration,
    process: Process,
    log_file: PathBuf,
}

impl ServerProcess {
    /// Starts `spec.binary` and waits for its readiness line.
    ///
    /// # Errors
    /// The process cannot be spawned, exits, or is not ready within [`START_TIMEOUT`]; the
    /// message carries the tail of its log.
    pub fn start(spec: &ServerSpec) -> Result<ServerProcess, String> {
        ServerProcess::start_with_timeout(spec, START_TIMEOUT)
    }

    /// [`ServerProcess::start`], waiting up to `timeout` for the readiness line (a large
    /// store takes a while to open).
    ///
    /// # Errors
    /// As [`ServerProcess::start`].
    pub fn start_with_timeout(spec: &ServerSpec, timeout: Duration) -> Result<ServerProcess, String> {
        std::fs::create_dir_all(&spec.data_dir).map_err(|e| format!("create {}: {e}", spec.data_dir.display()))?;
        let mut process = Launch::new(&spec.binary)
            .args(["--bind", "127.0.0.1:0", "--data-dir"])
            .arg(&spec.data_dir)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .log_file(&spec.log_file, None)
            .discard_output()
            .own_process_group()
            .spawn()?;
        let addr = process.expect_ready(timeout).map_err(|_| {
            format!("{} did not report `listening addr=` within {} s; log tail:\n{}", spec.binary.display(), timeout.as_secs(), log_tail(&spec.log_file, 20))
        })?;
        Ok(ServerProcess { addr, pid: process.pid(), ready_after: process.ready_after().unwrap_or_default(), process, log_file: spec.log_file.clone() })
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.process.try_status().is_none()
    }

    /// The log file it writes to.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Stops the server: SIGTERM to its pid, wait up to [`STOP_TIMEOUT`], then SIGKILL.
    /// Returns its exit code when it exited by itself. Idempotent.
    pub fn stop(&mut self) -> Option<i32> {
        self.process.stop(STOP_TIMEOUT)
    }

    /// SIGKILLs the server (a crash, for a failover measurement) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` lines of a text file (empty if unreadable).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Our server next to the running harness (`target/release/tephra-server` when the
/// harness is `target/release/tephra-bench`), or `$TEPHRA_SERVER`.
pub fn default_ours() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TEPHRA_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    // Test binaries live one level deeper, in target/<profile>/deps.
    for d in [Some(dir), dir.parent()] {
        let d = d?;
        let p = d.join("tephra-server");
        if p.is_file() {
            return Some(p);
        }
    }
    None
}

/// The reference server: `$TEPHRA_REFERENCE_SERVER`, else where
/// `scripts/install-reference.sh` puts it (`$HOME/.tephra-reference/bin/tephra-server`).
pub fn default_reference() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TEPHRA_REFERENCE_SERVER").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let root = std::env::var_os("TEPHRA_REFERENCE_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".tephra-reference")))?;
    let p = root.join("bin").join("tephra-server");
    p.is_file().then_some(p)
}
