//! The real `tephra-server` as a child process on loopback.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How to start servers: the binary, the segment size and a log file collecting every run's
/// output.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The `tephra-server` binary (built with `--features crash-points` for armed runs).
    pub binary: PathBuf,
    /// `TEPHRA__SEGMENT__SIZE`.
    pub segment_size: u64,
    /// Where all server output is appended.
    pub log_path: PathBuf,
}

/// A running (or exited) server.
pub struct Server {
    /// Its address once ready.
    pub addr: Option<SocketAddr>,
    child: Child,
    out: Arc<Mutex<String>>,
    ready: mpsc::Receiver<SocketAddr>,
    status: Option<ExitStatus>,
}

/// How a start attempt ended.
pub enum Started {
    /// Listening.
    Ready(Server),
    /// Exited before listening, with its status and output.
    Exited(ExitStatus, String),
}

impl ServerSpec {
    /// Spawns the server on `data` with `crash_point` armed (if any); does not wait.
    pub fn spawn(&self, data: &Path, crash_point: Option<&str>) -> Server {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--bind").arg("127.0.0.1:0").arg("--data-dir").arg(data);
        cmd.env("NO_COLOR", "1").env("TEPHRA__SEGMENT__SIZE", self.segment_size.to_string()).env_remove("TEPHRA_CRASH_POINT");
        if let Some(cp) = crash_point {
            cmd.env("TEPHRA_CRASH_POINT", cp);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        let out = Arc::new(Mutex::new(String::new()));
        let log = Arc::new(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).expect("server log")));
        let _ = writeln!(log.lock().unwrap(), "=== start pid {} data {} crash_point {:?}", child.id(), data.display(), crash_point);
        let (tx, ready) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for (stream, tx, prefix) in [(Box::new(stdout) as Box<dyn std::io::Read + Send>, Some(tx), ""), (Box::new(stderr), None, "[stderr] ")] {
            let out = Arc::clone(&out);
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut tx = tx;
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = parse_listening(&line) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(addr);
                        }
                    }
                    let _ = writeln!(log.lock().unwrap(), "{prefix}{line}");
                    let mut o = out.lock().unwrap();
                    o.push_str(prefix);
                    o.push_str(&line);
                    o.push('\n');
                }
            });
        }
        Server { addr: None, child, out, ready, status: None }
    }

    /// Spawns and waits up to `timeout` for the `listening addr=` line or an exit.
    pub fn start(&self, data: &Path, crash_point: Option<&str>, timeout: Duration) -> Started {
        let mut s = self.spawn(data, crash_point);
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(addr) = s.ready.recv_timeout(Duration::from_millis(20)) {
                s.addr = Some(addr);
                return Started::Ready(s);
            }
            if let Some(st) = s.try_status() {
                std::thread::sleep(Duration::from_millis(50));
                return Started::Exited(st, s.output());
            }
            if Instant::now() > deadline {
                s.kill();
                panic!("server did not become ready within {timeout:?}; output:\n{}", s.output());
            }
        }
    }

    /// Starts and expects readiness.
    pub fn start_ok(&self, data: &Path, crash_point: Option<&str>) -> Result<Server, String> {
        match self.start(data, crash_point, Duration::from_secs(60)) {
            Started::Ready(s) => Ok(s),
            Started::Exited(st, out) => Err(format!("server exited before listening ({st}); output:\n{out}")),
        }
    }
}

impl Server {
    /// The address (panics before readiness).
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("server not ready")
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed so far (stderr lines prefixed `[stderr] `).
    pub fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// The exit status if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.try_status() {
                std::thread::sleep(Duration::from_millis(50));
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(s) = self.try_status() {
            return s;
        }
        let _ = self.child.kill();
        let s = self.child.wait().expect("wait for the server");
        self.status = Some(s);
        s
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The signal that ended `status`, if any.
pub fn signal_of(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening addr=")? + "listening addr=".len()..];
    let token: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
    token.parse().ok()
}
