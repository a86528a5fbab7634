//! The real `tephra-server` as a child process on loopback, started through the shared
//! [`tephra_test_support::Launch`] with a crash point armed or not.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tephra_test_support::{Launch, Process, Readiness};

pub use tephra_test_support::process::signal_of;

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
    process: Process,
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
        let header = format!("=== start pid {{pid}} data {} crash_point {:?}", data.display(), crash_point);
        let mut launch = Launch::new(&self.binary)
            .args(["--bind", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env("TEPHRA__SEGMENT__SIZE", self.segment_size.to_string())
            .env_remove("TEPHRA_CRASH_POINT")
            .log_file(&self.log_path, Some(header));
        if let Some(cp) = crash_point {
            launch = launch.env("TEPHRA_CRASH_POINT", cp);
        }
        let process = launch.spawn().unwrap_or_else(|e| panic!("{e}"));
        Server { addr: None, process }
    }

    /// Spawns and waits up to `timeout` for the `listening addr=` line or an exit.
    pub fn start(&self, data: &Path, crash_point: Option<&str>, timeout: Duration) -> Started {
        let mut s = self.spawn(data, crash_point);
        match s.process.wait_ready(timeout) {
            Readiness::Listening(addr) => {
                s.addr = Some(addr);
                Started::Ready(s)
            }
            Readiness::Exited(st) => Started::Exited(st, s.output()),
            Readiness::TimedOut => {
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
        self.process.pid()
    }

    /// Everything printed so far (stderr lines prefixed `[stderr] `).
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(timeout)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> ExitStatus {
        self.process.kill()
    }
}
