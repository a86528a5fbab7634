//! A server under test: our `tephra-server` or the reference, on `127.0.0.1:0` with its own
//! scratch data directory, killed if it outlives [`WATCHDOG_LIMIT`]; and a server run that is
//! expected to stop by itself ([`run_to_exit`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::process::{Launch, Process};

/// How long a server may take to print its readiness line.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one [`Server`] may live. Blocking clients wait forever on a server that stops
/// answering; killing the server after this turns such a hang into a test failure.
pub const WATCHDOG_LIMIT: Duration = Duration::from_secs(150);

/// A subscription wait tick of 50 ms (the default is 250 ms), as an environment setting: idle
/// subscriptions notice a cancel or a shutdown sooner, which keeps the tests that wait for it short.
pub const FAST_WAIT_TICK: (&str, &str) = ("TEPHRA__SERVER__SUBSCRIPTIONS__WAIT_TICK_MS", "50");

/// The segment size the tests' servers use unless they set `TEPHRA__SEGMENT__SIZE`: 16 MiB.
pub const TEST_SEGMENT_SIZE: &str = "16777216";

/// The reference server binary named by `TEPHRA_REFERENCE_SERVER`, or `None` after a loud
/// notice on stderr (the caller then skips its test).
pub fn reference_binary() -> Option<PathBuf> {
    match std::env::var_os("TEPHRA_REFERENCE_SERVER") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            eprintln!(
                "\n*** SKIPPED: TEPHRA_REFERENCE_SERVER is not set; these tests need the reference \
                 tephra-server binary (scripts/install-reference.sh prints its path) ***\n"
            );
            None
        }
    }
}

/// The `crash-points` build of our server named by `TEPHRA_CRASH_SERVER` (`scripts/test.sh`
/// builds it), or `None` after a notice (the caller then skips its test). In CI (`CI` set) a
/// missing one is a failure.
pub fn crash_points_binary() -> Option<PathBuf> {
    match std::env::var_os("TEPHRA_CRASH_SERVER") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            assert!(std::env::var_os("CI").is_none(), "TEPHRA_CRASH_SERVER must be set in CI (scripts/test.sh)");
            eprintln!(
                "\n*** SKIPPED: TEPHRA_CRASH_SERVER is not set; this needs tephra-server built with \
                 --features crash-points (scripts/test.sh builds it; scripts/crash-soak.sh runs the harness alone) ***\n"
            );
            None
        }
    }
}

/// Kills the server it watches once [`WATCHDOG_LIMIT`] has passed.
struct Watchdog {
    done: AtomicBool,
    pid: AtomicU32,
}

impl Watchdog {
    fn start(pid: u32) -> Arc<Watchdog> {
        let w = Arc::new(Watchdog { done: false.into(), pid: pid.into() });
        let w2 = Arc::clone(&w);
        std::thread::spawn(move || {
            let started = Instant::now();
            while !w2.done.load(Ordering::SeqCst) {
                if started.elapsed() > WATCHDOG_LIMIT {
                    let pid = w2.pid.load(Ordering::SeqCst);
                    eprintln!("*** watchdog: server {pid} outlived {WATCHDOG_LIMIT:?}; killing it so the test fails instead of hanging ***");
                    // SAFETY: kill(2) on the pid of our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        w
    }
}

/// A running server process with its own data directory. Killed (and reaped) on drop.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Scratch directory holding `data/` (the data dir) and any config file.
    pub dir: tempfile::TempDir,
    process: Process,
    watchdog: Arc<Watchdog>,
    data: PathBuf,
    args: Vec<String>,
}

impl Server {
    /// Starts `binary --bind 127.0.0.1:0 --data-dir <tmp>/data` with `NO_COLOR=1`, a 16 MiB
    /// segment (`TEPHRA__SEGMENT__SIZE`), then `extra_env` (which may override those), and
    /// waits for its `listening addr=` line.
    ///
    /// # Panics
    /// If the process cannot start or does not become ready within 30 s.
    pub fn start(binary: &Path, extra_env: &[(&str, &str)]) -> Server {
        Server::start_with(binary, extra_env, None)
    }

    /// Like [`start`](Self::start), also writing `config_toml` to `<tmp>/tephra.toml` and
    /// passing it with `--config`.
    pub fn start_with(binary: &Path, extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Server {
        Server::start_on(binary, None, extra_env, config_toml)
    }

    /// Like [`start_with`](Self::start_with), serving `data_dir` when given (the caller owns
    /// it) instead of a fresh `<tmp>/data`.
    pub fn start_on(binary: &Path, data_dir: Option<&Path>, extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Server {
        Server::start_full(binary, data_dir, &[], extra_env, config_toml)
    }

    /// Like [`start_on`](Self::start_on) on `data_dir`, with extra command-line arguments.
    pub fn start_args(binary: &Path, data_dir: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> Server {
        Server::start_full(binary, Some(data_dir), args, extra_env, None)
    }

    fn start_full(binary: &Path, data_dir: Option<&Path>, args: &[&str], extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Server {
        Server::try_start_full(binary, data_dir, args, extra_env, config_toml).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`start_on`](Self::start_on), with the reason instead of a panic when the server
    /// does not start (its output included).
    pub fn try_start_on(binary: &Path, data_dir: Option<&Path>, extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Result<Server, String> {
        Server::try_start_full(binary, data_dir, &[], extra_env, config_toml)
    }

    fn try_start_full(binary: &Path, data_dir: Option<&Path>, args: &[&str], extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Result<Server, String> {
        let dir = crate::scratch_dir();
        let data = data_dir.map(Path::to_path_buf).unwrap_or_else(|| dir.path().join("data"));
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if let Some(toml) = config_toml {
            std::fs::write(dir.path().join("tephra.toml"), toml).expect("write config");
        }
        let (addr, process) = try_launch(binary, dir.path(), &data, &args, extra_env, config_toml.is_some())?;
        let watchdog = Watchdog::start(process.pid());
        Ok(Server { addr, dir, process, watchdog, data, args })
    }

    /// Starts `binary` again on the same directory (data and any config file), after the
    /// current process has exited or been killed. `addr`, the process and its output are
    /// replaced.
    pub fn restart(&mut self, binary: &Path, extra_env: &[(&str, &str)]) {
        self.process.kill();
        let has_config = self.dir.path().join("tephra.toml").exists();
        let (addr, process) = launch(binary, self.dir.path(), &self.data, &self.args, extra_env, has_config);
        self.watchdog.pid.store(process.pid(), Ordering::SeqCst);
        self.addr = addr;
        self.process = process;
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.process.pid() as i32
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signal: i32) {
        assert!(self.process.signal(signal), "kill({}, {signal}) failed", self.pid());
    }

    /// The metrics address the server logged (`metrics_addr=`); the server must have been
    /// started with `TEPHRA__METRICS__BIND`.
    ///
    /// # Panics
    /// When the server logged no metrics address.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        let log = self.log();
        let line = log.lines().find(|l| l.contains("metrics_addr=")).unwrap_or_else(|| panic!("no metrics_addr line:\n{log}"));
        let rest = &line[line.find("metrics_addr=").unwrap() + "metrics_addr=".len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// The `/metrics` page, from [`Server::metrics_addr`].
    ///
    /// # Panics
    /// When the server logged no metrics address or the page cannot be fetched.
    pub fn metrics(&self) -> String {
        let mut s = std::net::TcpStream::connect(self.metrics_addr()).unwrap();
        std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut s, &mut body).unwrap();
        body
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> ExitStatus {
        self.process.kill()
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(timeout)
    }

    /// Everything the server printed so far (stderr lines prefixed `[stderr] `).
    pub fn log(&self) -> String {
        self.process.output()
    }

    /// Whether the server's output contains `needle` within `timeout` (its lines reach the
    /// test through a reader thread, a moment after the server wrote them).
    pub fn log_shows(&self, needle: &str, timeout: Duration) -> bool {
        self.process.output_shows(needle, timeout)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data.clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.watchdog.done.store(true, Ordering::SeqCst);
        // Before the fields drop: the scratch directory goes only once the server has gone.
        self.process.kill();
    }
}

/// Spawns `binary --bind 127.0.0.1:0 --data-dir <data> [args] [--config <dir>/tephra.toml]`
/// and waits for its readiness line.
fn launch(binary: &Path, dir: &Path, data: &Path, args: &[String], extra_env: &[(&str, &str)], with_config: bool) -> (SocketAddr, Process) {
    try_launch(binary, dir, data, args, extra_env, with_config).unwrap_or_else(|e| panic!("{e}"))
}

/// [`launch`], with the reason when the server does not start.
fn try_launch(binary: &Path, dir: &Path, data: &Path, args: &[String], extra_env: &[(&str, &str)], with_config: bool) -> Result<(SocketAddr, Process), String> {
    let mut launch = Launch::new(binary);
    // A port of the caller's choosing (`--bind` in `args`) replaces the default of any free port.
    if !args.iter().any(|a| a == "--bind" || a == "-b") {
        launch = launch.args(["--bind", "127.0.0.1:0"]);
    }
    launch = launch.arg("--data-dir").arg(data).args(args);
    if with_config {
        launch = launch.arg("--config").arg(dir.join("tephra.toml"));
    }
    let mut process = launch.env("TEPHRA__SEGMENT__SIZE", TEST_SEGMENT_SIZE).envs(extra_env.iter().copied()).spawn()?;
    let addr = process.expect_ready(START_TIMEOUT)?;
    Ok((addr, process))
}

/// What a server process that was expected to stop by itself did.
#[derive(Debug)]
pub struct Exited {
    /// Its exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `binary` with `args`, `NO_COLOR=1`, a scratch `--data-dir` (unless `args` has one) and
/// `extra_env`, writing `config_toml` (if any) to a scratch file passed with `--config`, and
/// waits up to `timeout` for it to exit by itself.
///
/// # Panics
/// If it is still running after `timeout` (it is then killed).
pub fn run_to_exit(binary: &Path, args: &[&str], extra_env: &[(&str, &str)], config_toml: Option<&str>, timeout: Duration) -> Exited {
    let dir = crate::scratch_dir();
    let mut cmd = std::process::Command::new(binary);
    cmd.args(args);
    if !args.iter().any(|a| *a == "--data-dir" || *a == "-d") {
        cmd.arg("--data-dir").arg(dir.path().join("data"));
    }
    if let Some(toml) = config_toml {
        let path = dir.path().join("tephra.toml");
        std::fs::write(&path, toml).expect("write config");
        cmd.arg("--config").arg(path);
    }
    cmd.env("NO_COLOR", "1").env("TEPHRA__SEGMENT__SIZE", TEST_SEGMENT_SIZE);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} {args:?} was still running after {timeout:?}; stdout:\n{}\nstderr:\n{}", binary.display(), t_out.join().unwrap(), t_err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Exited { code: status.code(), stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// Polls a server's stats over one connection until `pred` holds (gauges move on other
/// shards a moment after the event that moves them) and returns them.
///
/// # Panics
/// If `pred` does not hold within 10 s (the message names `what`).
pub fn stats_until(addr: SocketAddr, what: &str, pred: impl Fn(&tephra::client::Stats) -> bool) -> tephra::client::Stats {
    let mut c = tephra::client::Client::connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.stats().unwrap();
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of the unlabelled sample `name` in a `/metrics` page.
///
/// # Panics
/// When the page has no such sample.
pub fn sample(body: &str, name: &str) -> String {
    body.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).unwrap_or_else(|| panic!("no sample {name}:\n{body}")).to_string()
}
