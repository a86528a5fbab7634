//! Shared test support: launching a server binary (the reference `tephra-server`, or ours)
//! as a child process on `127.0.0.1:0`, and a raw-frame connection for wire-level checks.
//!
//! Include with `mod support;` from an integration test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tephra::proto::{self, FrameDecoder, Request, Response};

/// How long a server may take to print its readiness line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A running server process with its own data directory. Killed (and reaped) on drop.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The child process.
    pub child: Child,
    /// Scratch directory holding `data/` (the data dir) and any config file.
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
    watchdog: Arc<Watchdog>,
    data: PathBuf,
    args: Vec<String>,
}

/// How long one `Server` may live. Blocking clients wait forever on a server that stops
/// answering; killing the server after this turns such a hang into a test failure.
const WATCHDOG_LIMIT: Duration = Duration::from_secs(150);

struct Watchdog {
    done: std::sync::atomic::AtomicBool,
    pid: std::sync::atomic::AtomicU32,
}

impl Watchdog {
    fn start(pid: u32) -> Arc<Watchdog> {
        let w = Arc::new(Watchdog { done: false.into(), pid: pid.into() });
        let w2 = Arc::clone(&w);
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !w2.done.load(std::sync::atomic::Ordering::SeqCst) {
                if started.elapsed() > WATCHDOG_LIMIT {
                    let pid = w2.pid.load(std::sync::atomic::Ordering::SeqCst);
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
    #[allow(dead_code)]
    pub fn start_args(binary: &Path, data_dir: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> Server {
        Server::start_full(binary, Some(data_dir), args, extra_env, None)
    }

    fn start_full(binary: &Path, data_dir: Option<&Path>, args: &[&str], extra_env: &[(&str, &str)], config_toml: Option<&str>) -> Server {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
        let data = data_dir.map(Path::to_path_buf).unwrap_or_else(|| dir.path().join("data"));
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if let Some(toml) = config_toml {
            std::fs::write(dir.path().join("tephra.toml"), toml).expect("write config");
        }
        let (addr, child, log) = launch(binary, dir.path(), &data, &args, extra_env, config_toml.is_some());
        let watchdog = Watchdog::start(child.id());
        Server { addr, child, dir, log, watchdog, data, args }
    }

    /// Starts `binary` again on the same directory (data and any config file), after the
    /// current process has exited or been killed. `addr`, the child and the log are replaced.
    pub fn restart(&mut self, binary: &Path, extra_env: &[(&str, &str)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let has_config = self.dir.path().join("tephra.toml").exists();
        let (addr, child, log) = launch(binary, self.dir.path(), &self.data, &self.args, extra_env, has_config);
        self.watchdog.pid.store(child.id(), std::sync::atomic::Ordering::SeqCst);
        self.addr = addr;
        self.child = child;
        self.log = log;
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything the server printed so far (stderr lines prefixed `[stderr] `).
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Whether the server's output contains `needle` within `timeout` (its lines reach the
    /// test through a reader thread, a moment after the server wrote them).
    pub fn log_shows(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data.clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.watchdog.done.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `binary --bind 127.0.0.1:0 --data-dir <dir>/data [--config <dir>/tephra.toml]` and
/// waits for its readiness line; returns the address, the child and its output log.
fn launch(binary: &Path, dir: &Path, data: &Path, args: &[String], extra_env: &[(&str, &str)], with_config: bool) -> (SocketAddr, Child, Arc<Mutex<String>>) {
    let mut cmd = Command::new(binary);
    // A port of the caller's choosing (`--bind` in `args`) replaces the default of any free port.
    if !args.iter().any(|a| a == "--bind" || a == "-b") {
        cmd.arg("--bind").arg("127.0.0.1:0");
    }
    cmd.arg("--data-dir").arg(data).args(args);
    if with_config {
        cmd.arg("--config").arg(dir.join("tephra.toml"));
    }
    cmd.env("NO_COLOR", "1").env("TEPHRA__SEGMENT__SIZE", "16777216");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                {
                    // Logged before the address is announced, so `log()` has the line.
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                if let Some(addr) = parse_listening(&line) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
    }
    {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = log.lock().unwrap();
                l.push_str("[stderr] ");
                l.push_str(&line);
                l.push('\n');
            }
        });
    }
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => (addr, child, log),
        Err(_) => {
            let _ = child.kill();
            let status = child.wait().ok();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "server {} did not report `listening addr=` (exit: {status:?}); output:\n{}",
                binary.display(),
                log.lock().unwrap()
            );
        }
    }
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
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let mut cmd = Command::new(binary);
    cmd.args(args);
    if !args.iter().any(|a| *a == "--data-dir" || *a == "-d") {
        cmd.arg("--data-dir").arg(dir.path().join("data"));
    }
    if let Some(toml) = config_toml {
        let path = dir.path().join("tephra.toml");
        std::fs::write(&path, toml).expect("write config");
        cmd.arg("--config").arg(path);
    }
    cmd.env("NO_COLOR", "1").env("TEPHRA__SEGMENT__SIZE", "16777216");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
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
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {args:?} was still running after {timeout:?}; stdout:\n{}\nstderr:\n{}",
                binary.display(),
                t_out.join().unwrap(),
                t_err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Exited { code: status.code(), stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// A self-signed certificate for `localhost`, written as `cert.pem` and `key.pem` into `dir`.
pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

/// A self-signed CA certificate (`basicConstraints` CA:TRUE, what `openssl req -x509` makes by
/// default) for `localhost`, written as `ca.pem` and `ca-key.pem` into `dir`.
pub fn ca_self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let ca = params.self_signed(&key).unwrap();
    let (cert, key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    std::fs::write(&cert, ca.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert, key_path)
}

/// A `[tls]` table naming `cert` and `key`.
pub fn tls_toml(cert: &Path, key: &Path) -> String {
    format!("[tls]\ncert = {:?}\nkey = {:?}\n", cert.display().to_string(), key.display().to_string())
}

/// `binary` serving TLS (a self-signed `localhost` certificate) and capped at one connection,
/// which a client holds: its Hello was answered, so the server has accepted and counted it.
/// Returns the server, the certificate's path, the directory holding it (keep it alive) and
/// the held client.
pub fn tls_server_at_its_connection_cap(binary: &Path) -> (Server, PathBuf, tempfile::TempDir, tephra::client::Client) {
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let (cert, key) = self_signed(certs.path());
    let srv = Server::start_with(binary, &[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")], Some(&tls_toml(&cert, &key)));
    let config = tephra::client::tls::config_with_custom_ca(&cert).expect("trust the certificate");
    let held = tephra::client::Client::connect_tls_with(srv.addr, "localhost", config, None).expect("the one connection");
    (srv, cert, certs, held)
}

/// Extracts `IP:PORT` from a line containing `listening addr=IP:PORT`.
fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening addr=")? + "listening addr=".len()..];
    let token: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '\u{1b}').collect();
    token.parse().ok()
}

/// A raw protocol connection: frames in, frames out, nothing else.
pub struct RawConn {
    pub stream: TcpStream,
    pub dec: FrameDecoder,
}

impl RawConn {
    /// Connects with `TCP_NODELAY` and a 10 s read timeout (so a broken test fails instead
    /// of hanging).
    pub fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        RawConn { stream, dec: FrameDecoder::new(u32::MAX) }
    }

    /// Connects and completes a token-less Hello with id 1.
    pub fn connect_hello(addr: SocketAddr) -> RawConn {
        let mut c = RawConn::connect(addr);
        c.send(&Request::hello(1, None));
        let ack = c.recv().expect("hello ack");
        assert!(matches!(ack.kind, Some(proto::response::Kind::HelloAck(_))), "{ack:?}");
        c
    }

    /// Sends one message as a frame.
    pub fn send<M: Message>(&mut self, msg: &M) {
        let mut buf = Vec::new();
        proto::encode_frame(msg, u32::MAX, &mut buf).unwrap();
        self.stream.write_all(&buf).unwrap();
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next response, or `None` when the server closed the connection (EOF or reset).
    ///
    /// # Panics
    /// On a timeout, a torn frame or an undecodable body.
    pub fn recv(&mut self) -> Option<Response> {
        match self.dec.read_next(&mut self.stream) {
            Ok(Some(body)) => Some(Response::decode(body).expect("decode response")),
            Ok(None) => None,
            Err(proto::FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading a response: {e}"),
        }
    }

    /// Asserts that the server closes the connection without sending another frame.
    pub fn expect_closed(&mut self) {
        if let Some(r) = self.recv() {
            panic!("expected the connection to close, got {r:?}");
        }
    }
}

/// Runs a frame-level error check: connects (with a Hello), lets `provoke` send the bad
/// input, and expects one error frame with request id 0 followed by a close. Returns that
/// error.
///
/// The reference server occasionally closes such a connection without the error frame
/// (its reply is best-effort; about 1 in 200 attempts here, more under load), so a close
/// with no frame is retried, up to 10 attempts in all. Every attempt must end in a close,
/// and any frame that does arrive must be the id-0 error.
pub fn frame_level_error(addr: SocketAddr, provoke: impl Fn(&mut RawConn)) -> proto::ErrorResponse {
    for _ in 0..10 {
        let mut raw = RawConn::connect_hello(addr);
        provoke(&mut raw);
        match raw.recv() {
            Some(r) => {
                assert_eq!(r.request_id, 0, "frame-level errors are unattributed: {r:?}");
                let Some(proto::response::Kind::Error(e)) = r.kind else {
                    panic!("expected an error frame, got {r:?}")
                };
                raw.expect_closed();
                return e;
            }
            None => eprintln!("server closed without the frame-level error; retrying"),
        }
    }
    panic!("the server never sent the frame-level error in 10 attempts");
}
