//! One way to launch a server binary (ours or the reference) as a child process and wait for
//! it to listen: [`Launch`] builds the command, [`Process`] is the running child, its output
//! collected line by line (kept in memory, appended to a log file, or both), and its
//! readiness read from the `listening addr=IP:PORT` line it prints on stdout.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The prefix marking a stderr line in a [`Process`]'s output.
pub const STDERR_MARK: &str = "[stderr] ";

/// A server command being put together: `NO_COLOR=1`, no stdin, stdout and stderr read by
/// the harness.
pub struct Launch {
    cmd: Command,
    binary: PathBuf,
    log_file: Option<PathBuf>,
    log_header: Option<String>,
    keep_output: bool,
    own_group: bool,
    lines: Option<mpsc::Sender<String>>,
}

impl Launch {
    /// `binary` with no arguments yet.
    pub fn new(binary: &Path) -> Launch {
        let mut cmd = Command::new(binary);
        cmd.env("NO_COLOR", "1");
        Launch { cmd, binary: binary.to_path_buf(), log_file: None, log_header: None, keep_output: true, own_group: false, lines: None }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Launch {
        self.cmd.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Launch {
        self.cmd.args(args);
        self
    }

    /// Sets one environment variable (a later setting of the same name wins).
    pub fn env(mut self, key: impl AsRef<std::ffi::OsStr>, value: impl AsRef<std::ffi::OsStr>) -> Launch {
        self.cmd.env(key, value);
        self
    }

    /// Sets environment variables, in order.
    pub fn envs<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Launch {
        self.cmd.envs(vars);
        self
    }

    /// Removes an inherited environment variable.
    pub fn env_remove(mut self, key: impl AsRef<std::ffi::OsStr>) -> Launch {
        self.cmd.env_remove(key);
        self
    }

    /// Appends every line the process prints to `path` (stderr lines marked
    /// [`STDERR_MARK`]), after `header` when given (`{pid}` in it stands for the process id).
    pub fn log_file(mut self, path: &Path, header: Option<String>) -> Launch {
        self.log_file = Some(path.to_path_buf());
        self.log_header = header;
        self
    }

    /// Also sends every line of either stream, unmarked, to `lines` as it arrives.
    pub fn lines_to(mut self, lines: mpsc::Sender<String>) -> Launch {
        self.lines = Some(lines);
        self
    }

    /// Does not keep the output in memory (a long benchmark run needs only its log file).
    pub fn discard_output(mut self) -> Launch {
        self.keep_output = false;
        self
    }

    /// Runs the child in its own process group (a terminal's Ctrl-C reaches only the
    /// harness, which then stops the server by its pid) and asks the kernel to kill it when
    /// the harness dies (`PR_SET_PDEATHSIG`), so even a `kill -9` of the harness leaves no
    /// server behind.
    pub fn own_process_group(mut self) -> Launch {
        self.own_group = true;
        self
    }

    /// Spawns the process and starts reading its output; does not wait for readiness.
    ///
    /// # Errors
    /// The log file cannot be opened or the process cannot be spawned.
    pub fn spawn(self) -> Result<Process, String> {
        let Launch { mut cmd, binary, log_file, log_header, keep_output, own_group, lines } = self;
        let log = match &log_file {
            Some(p) => Some(std::fs::OpenOptions::new().create(true).append(true).open(p).map_err(|e| format!("open {}: {e}", p.display()))?),
            None => None,
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if own_group {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::setpgid(0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let spawned_at = Instant::now();
        // A script or binary a test has just written may still be open for writing in a child
        // another test thread forked meanwhile (until that child's exec closes it): exec then
        // fails with ETXTBSY for a moment, so retry that for up to a second.
        let mut busy_tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && busy_tries < 100 => {
                    busy_tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.map_err(|e| format!("spawn {}: {e}", binary.display()))?,
            }
        };
        let log = log.map(|f| Arc::new(Mutex::new(f)));
        if let (Some(log), Some(header)) = (&log, log_header) {
            let _ = writeln!(log.lock().unwrap(), "{}", header.replace("{pid}", &child.id().to_string()));
        }
        let output = Arc::new(Mutex::new(String::new()));
        let (tx, ready) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let streams: [(Box<dyn std::io::Read + Send>, _, &str); 2] = [(Box::new(stdout), Some(tx), ""), (Box::new(stderr), None, STDERR_MARK)];
        let readers = streams
            .into_iter()
            .map(|(stream, tx, mark)| {
                let output = Arc::clone(&output);
                let log = log.clone();
                let lines = lines.clone();
                std::thread::spawn(move || {
                    let mut tx = tx;
                    for line in BufReader::new(stream).lines() {
                        let Ok(line) = line else { break };
                        if let Some(log) = &log {
                            let _ = writeln!(log.lock().unwrap(), "{mark}{line}");
                        }
                        if keep_output {
                            // Kept before the address is announced, so the output has the line.
                            let mut o = output.lock().unwrap();
                            o.push_str(mark);
                            o.push_str(&line);
                            o.push('\n');
                        }
                        if let Some(addr) = tx.as_ref().and(parse_listening(&line)) {
                            let _ = tx.take().expect("sender").send((addr, Instant::now()));
                        }
                        if let Some(lines) = &lines {
                            let _ = lines.send(line);
                        }
                    }
                })
            })
            .collect();
        Ok(Process { child, binary, output, ready, spawned_at, ready_after: None, status: None, readers })
    }
}

/// How waiting for a server's readiness line ended.
#[derive(Debug)]
pub enum Readiness {
    /// It printed `listening addr=` with this address.
    Listening(SocketAddr),
    /// It exited first.
    Exited(ExitStatus),
    /// Neither within the time allowed (it still runs).
    TimedOut,
}

/// A server child process. Killed (and reaped) on drop.
pub struct Process {
    child: Child,
    binary: PathBuf,
    output: Arc<Mutex<String>>,
    ready: mpsc::Receiver<(SocketAddr, Instant)>,
    spawned_at: Instant,
    ready_after: Option<Duration>,
    status: Option<ExitStatus>,
    readers: Vec<JoinHandle<()>>,
}

impl Process {
    /// Waits up to `timeout` for the readiness line or an exit.
    pub fn wait_ready(&mut self, timeout: Duration) -> Readiness {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((addr, at)) = self.ready.recv_timeout(Duration::from_millis(20)) {
                self.ready_after = Some(at.duration_since(self.spawned_at));
                return Readiness::Listening(addr);
            }
            if let Some(st) = self.try_status() {
                return Readiness::Exited(st);
            }
            if Instant::now() >= deadline {
                return Readiness::TimedOut;
            }
        }
    }

    /// Like [`wait_ready`](Self::wait_ready), with a failure (the process killed) said as an
    /// error carrying everything it printed.
    ///
    /// # Errors
    /// It exited first or did not listen within `timeout`.
    pub fn expect_ready(&mut self, timeout: Duration) -> Result<SocketAddr, String> {
        match self.wait_ready(timeout) {
            Readiness::Listening(addr) => Ok(addr),
            Readiness::Exited(st) => Err(format!("server {} exited before listening ({st}); output:\n{}", self.binary.display(), self.output())),
            Readiness::TimedOut => {
                let st = self.kill();
                Err(format!("server {} did not report `listening addr=` within {timeout:?} (exit: {st}); output:\n{}", self.binary.display(), self.output()))
            }
        }
    }

    /// From just before the process was spawned until its readiness line was read (the time
    /// it took to open the store and bind); `None` before readiness.
    pub fn ready_after(&self) -> Option<Duration> {
        self.ready_after
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed so far (stderr lines marked [`STDERR_MARK`]); once the process has
    /// exited and that was seen, all of it.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Whether the output contains `needle` within `timeout` (lines reach the harness
    /// through a reader thread, a moment after the server wrote them).
    pub fn output_shows(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.output().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if it has exited (its output then read to the end).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
            if self.status.is_some() {
                self.finish_output();
            }
        }
        self.status
    }

    /// Waits up to `timeout` for the process to exit by itself; `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_status() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process; false if it has been reaped.
    pub fn signal(&self, signal: i32) -> bool {
        if self.status.is_some() {
            return false;
        }
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) == 0 }
    }

    /// Waits for the process to exit by itself, however long that takes.
    pub fn wait(&mut self) -> ExitStatus {
        if let Some(st) = self.status {
            return st;
        }
        let st = self.child.wait().expect("wait for the server");
        self.status = Some(st);
        self.finish_output();
        st
    }

    /// SIGKILL and reap; the exit status.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(st) = self.try_status() {
            return st;
        }
        let _ = self.child.kill();
        let st = self.child.wait().expect("wait for the server");
        self.status = Some(st);
        self.finish_output();
        st
    }

    /// SIGTERM, then up to `timeout` for it to exit, then SIGKILL. Its exit code when it
    /// exited by itself.
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        if let Some(st) = self.try_status() {
            return st.code();
        }
        self.signal(libc::SIGTERM);
        match self.wait_exit(timeout) {
            Some(st) => st.code(),
            None => {
                self.kill();
                None
            }
        }
    }

    /// Waits for the output readers to reach the end of both streams.
    fn finish_output(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The address in a line containing `listening ... addr=IP:PORT` (the token ends at white
/// space or an escape; quotes and commas around it are dropped).
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening")?..];
    let rest = &rest[rest.find("addr=")? + "addr=".len()..];
    let token: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '\u{1b}').collect();
    token.trim_matches(|c| c == '"' || c == ',').parse().ok()
}

/// The signal that ended `status`, if any.
pub fn signal_of(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// A scratch directory for one test, under `<target>/tmp` (cargo's `CARGO_TARGET_TMPDIR`:
/// a test binary runs from `<target>/<profile>/deps`), or the system's temporary directory
/// for a binary that does not.
pub fn scratch_dir() -> tempfile::TempDir {
    let root = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(|t| t.join("tmp")))?
        })
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root).expect("scratch root");
    tempfile::tempdir_in(root).expect("temp dir")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_readiness_lines() {
        let a = parse_listening("2026-01-01T00:00:00Z  INFO tephra server listening addr=127.0.0.1:4567").unwrap();
        assert_eq!(a.port(), 4567);
        let b = parse_listening("INFO tephra_server: tephra server listening addr=127.0.0.1:9 tls=false").unwrap();
        assert_eq!(b.port(), 9);
        let c = parse_listening("INFO tephra server listening addr=127.0.0.1:10\u{1b}[0m").unwrap();
        assert_eq!(c.port(), 10);
        assert!(parse_listening("INFO starting").is_none());
    }
}
