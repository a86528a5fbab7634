//! Starting and stopping a server process for a benchmark run: ours or the reference,
//! started the same way (`--bind 127.0.0.1:0 --data-dir DIR`, settings through
//! `TEPHRA__*` variables), ready once it prints `tephra server listening addr=IP:PORT`.
//!
//! The child runs in its own process group (a terminal's Ctrl-C goes to the harness only)
//! and is asked to die with us (`PR_SET_PDEATHSIG`), so even a `kill -9` of the harness
//! leaves no server behind; [`ServerProcess::stop`] (also run on drop) sends
//! SIGTERM to its pid, waits, then SIGKILLs it.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
    /// Where the server's stdout and stderr go (appended).
    pub log_file: PathBuf,
}

/// A running server.
#[derive(Debug)]
pub struct ServerProcess {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its pid.
    pub pid: u32,
    /// From just before the process was spawned until its readiness line was read: the
    /// time it took to open the store and bind.
    pub ready_after: Duration,
    child: Option<Child>,
    log_file: PathBuf,
}

/// Parses the address out of a `... tephra server listening addr=IP:PORT ...` line.
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening")?..];
    let at = rest.find("addr=")? + "addr=".len();
    let token = rest[at..].split_whitespace().next()?;
    token.trim_matches(|c| c == '"' || c == ',').parse().ok()
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
    pub fn start_with_timeout(
        spec: &ServerSpec,
        timeout: Duration,
    ) -> Result<ServerProcess, String> {
        std::fs::create_dir_all(&spec.data_dir)
            .map_err(|e| format!("create {}: {e}", spec.data_dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_file)
            .map_err(|e| format!("open {}: {e}", spec.log_file.display()))?;
        let stderr_log = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&spec.binary);
        cmd.arg("--bind")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&spec.data_dir);
        cmd.env("NO_COLOR", "1");
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr_log));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Its own process group: a terminal's Ctrl-C reaches only the harness,
                // which then stops the server itself, by pid.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned_at = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", spec.binary.display()))?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let mut log_out = log;
        std::thread::Builder::new()
            .name(format!("server-{pid}-stdout"))
            .spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(log_out, "{line}");
                    if let Some(addr) = parse_listening(&line) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send((addr, Instant::now()));
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        let mut server = ServerProcess {
            addr: "0.0.0.0:0".parse().expect("addr"),
            pid,
            ready_after: Duration::ZERO,
            child: Some(child),
            log_file: spec.log_file.clone(),
        };
        match rx.recv_timeout(timeout) {
            Ok((addr, at)) => {
                server.addr = addr;
                server.ready_after = at.duration_since(spawned_at);
                Ok(server)
            }
            Err(_) => {
                server.stop();
                Err(format!(
                    "{} did not report `listening addr=` within {} s; log tail:\n{}",
                    spec.binary.display(),
                    timeout.as_secs(),
                    log_tail(&spec.log_file, 20)
                ))
            }
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The log file it writes to.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Stops the server: SIGTERM to its pid, wait up to [`STOP_TIMEOUT`], then SIGKILL.
    /// Returns its exit code when it exited by itself. Idempotent.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Ok(Some(st)) = child.try_wait() {
            return st.code();
        }
        // SAFETY: plain kill(2) on our own child's pid, which is not reaped yet.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return st.code(),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_readiness_lines() {
        let a = parse_listening(
            "2026-01-01T00:00:00Z  INFO tephra server listening addr=127.0.0.1:4567",
        )
        .unwrap();
        assert_eq!(a.port(), 4567);
        let b = parse_listening(
            "INFO tephra_server: tephra server listening addr=127.0.0.1:9 tls=false",
        )
        .unwrap();
        assert_eq!(b.port(), 9);
        assert!(parse_listening("INFO starting").is_none());
    }
}
