//! etcd started by the harness (one member, or a cluster of members: [`EtcdCluster`]), and the
//! smallest HTTP/1.1 client that speaks to etcd's v3 JSON gateway (`POST /v3/kv/txn`,
//! `/v3/kv/put`, `/v3/kv/range`, `/v3/watch`) over one keep-alive connection: a request is one write, an answer is read by `Content-Length` or chunks. Keys
//! and values travel base64-encoded, as the gateway wants.
//!
//! The etcd process listens on loopback ports only, keeps its data directory where the caller
//! says (the same disk as our server's), runs in its own process group with
//! `PR_SET_PDEATHSIG`, and is stopped by its pid.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tephra_test_support::{Launch, Process};

/// How long etcd may take to answer `/health` after it is spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Base64 (standard alphabet, padded), as the gateway encodes `bytes` fields.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes a base64 field of a gateway answer.
pub fn unb64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// The etcd binary: `$ETCD_BIN`, else `/usr/bin/etcd` (Debian's `etcd-server`), else `etcd`
/// on `PATH`.
pub fn default_etcd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ETCD_BIN").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let mut candidates = vec![PathBuf::from("/usr/bin/etcd"), PathBuf::from("/usr/local/bin/etcd")];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("etcd")));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// A free loopback port (bound, then released: etcd binds it right after).
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How one etcd member is launched: its name, data directory, log, loopback ports and the
/// cluster it starts (`--initial-cluster`, `--initial-cluster-token`).
#[derive(Debug, Clone)]
pub struct EtcdMemberSpec {
    /// The etcd binary.
    pub binary: PathBuf,
    /// `--name`.
    pub name: String,
    /// `--data-dir` (created if missing).
    pub data_dir: PathBuf,
    /// Where its output goes (appended).
    pub log_file: PathBuf,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    /// Peer port on 127.0.0.1.
    pub peer_port: u16,
    /// `--initial-cluster`: `name=http://127.0.0.1:PEER,...` for every member.
    pub initial_cluster: String,
    /// `--initial-cluster-token`.
    pub token: String,
}

impl EtcdMemberSpec {
    /// Its client address.
    pub fn client_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.client_port).into()
    }

    /// Its peer URL.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// A running etcd member.
pub struct EtcdProcess {
    /// Its client address (`http://` on loopback).
    pub addr: SocketAddr,
    /// Its pid.
    pub pid: u32,
    process: Process,
    log_file: PathBuf,
}

impl EtcdProcess {
    /// Starts a one-member etcd: `binary` with `data_dir` (created if missing), logging to
    /// `log_file`, and waits until `/health` answers healthy.
    ///
    /// # Errors
    /// It cannot be spawned, exits, or is not healthy within [`START_TIMEOUT`].
    pub fn start(binary: &Path, data_dir: &Path, log_file: &Path) -> Result<EtcdProcess, String> {
        let client_port = free_port().map_err(|e| format!("free port: {e}"))?;
        let peer_port = free_port().map_err(|e| format!("free port: {e}"))?;
        let mut spec = EtcdMemberSpec {
            binary: binary.to_owned(),
            name: "bench".into(),
            data_dir: data_dir.to_owned(),
            log_file: log_file.to_owned(),
            client_port,
            peer_port,
            initial_cluster: String::new(),
            token: "bench".into(),
        };
        spec.initial_cluster = format!("bench={}", spec.peer_url());
        let mut etcd = EtcdProcess::spawn(&spec)?;
        etcd.wait_healthy(START_TIMEOUT)?;
        Ok(etcd)
    }

    /// Spawns one member as `spec` says, without waiting for it (a member of a larger
    /// cluster is healthy only once a quorum runs).
    ///
    /// # Errors
    /// The data directory cannot be created or the process cannot be spawned.
    pub fn spawn(spec: &EtcdMemberSpec) -> Result<EtcdProcess, String> {
        std::fs::create_dir_all(&spec.data_dir).map_err(|e| format!("create {}: {e}", spec.data_dir.display()))?;
        let addr = spec.client_addr();
        let curl = format!("http://{addr}");
        let purl = spec.peer_url();
        let process = Launch::new(&spec.binary)
            .arg("--name")
            .arg(&spec.name)
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .args(["--listen-client-urls", &curl, "--advertise-client-urls", &curl])
            .args(["--listen-peer-urls", &purl, "--initial-advertise-peer-urls", &purl])
            .args(["--initial-cluster", &spec.initial_cluster, "--initial-cluster-state", "new", "--initial-cluster-token", &spec.token])
            .log_file(&spec.log_file, None)
            .discard_output()
            .own_process_group()
            .spawn()?;
        Ok(EtcdProcess { addr, pid: process.pid(), process, log_file: spec.log_file.clone() })
    }

    /// Waits until `/health` answers healthy.
    ///
    /// # Errors
    /// The process exits, or is not healthy within `timeout` (it is stopped then).
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.process.try_status().is_some() {
                return Err(format!("etcd exited at start; log tail:\n{}", crate::server::log_tail(&self.log_file, 20)));
            }
            if healthy(self.addr) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.process.stop(Duration::from_secs(10));
                return Err(format!("etcd not healthy within {} s; log tail:\n{}", timeout.as_secs(), crate::server::log_tail(&self.log_file, 20)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops etcd: SIGTERM to its pid, then SIGKILL after 20 s. Idempotent.
    pub fn stop(&mut self) -> Option<i32> {
        self.process.stop(crate::server::STOP_TIMEOUT)
    }

    /// SIGKILLs etcd (a crash, for the failover measurement) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether the member at `addr` answers `/health` with `"health":"true"`.
pub fn healthy(addr: SocketAddr) -> bool {
    Http::connect(addr)
        .and_then(|mut h| h.request("GET", "/health", b""))
        .is_ok_and(|(status, body)| status == 200 && String::from_utf8_lossy(&body).contains("true"))
}

/// A cluster of etcd members on loopback, each with its own data directory; a stopped or
/// killed member can be started again on its directory. Every member is stopped on drop.
pub struct EtcdCluster {
    specs: Vec<EtcdMemberSpec>,
    members: Vec<Option<EtcdProcess>>,
}

impl EtcdCluster {
    /// Starts `n` members `m1..mN` of `binary`, member `i`'s data in `data_root/mI` and its
    /// log in `log_prefix-mI.log`, and waits until every one is healthy.
    ///
    /// # Errors
    /// A member cannot be started or is not healthy within [`START_TIMEOUT`].
    pub fn start(binary: &Path, data_root: &Path, log_prefix: &Path, n: usize) -> Result<EtcdCluster, String> {
        let mut specs = Vec::with_capacity(n);
        for i in 1..=n {
            let log = format!("{}-m{i}.log", log_prefix.display());
            specs.push(EtcdMemberSpec {
                binary: binary.to_owned(),
                name: format!("m{i}"),
                data_dir: data_root.join(format!("m{i}")),
                log_file: PathBuf::from(log),
                client_port: free_port().map_err(|e| format!("free port: {e}"))?,
                peer_port: free_port().map_err(|e| format!("free port: {e}"))?,
                initial_cluster: String::new(),
                token: String::new(),
            });
        }
        let initial = specs.iter().map(|s| format!("{}={}", s.name, s.peer_url())).collect::<Vec<_>>().join(",");
        let token = format!("bench-{}", data_root.file_name().map_or("cluster".into(), |f| f.to_string_lossy().into_owned()));
        for s in &mut specs {
            s.initial_cluster = initial.clone();
            s.token = token.clone();
        }
        let mut c = EtcdCluster { members: (0..n).map(|_| None).collect(), specs };
        for i in 0..n {
            c.members[i] = Some(EtcdProcess::spawn(&c.specs[i])?);
        }
        for m in c.members.iter_mut().flatten() {
            m.wait_healthy(START_TIMEOUT)?;
        }
        Ok(c)
    }

    /// Members, running or not.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether it has no member.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Member `i`'s client address (0-based; the same across restarts).
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.specs[i].client_addr()
    }

    /// The member that leads, from `/v3/maintenance/status` of the running members: the one
    /// whose own id is the leader id they report.
    ///
    /// # Errors
    /// No running member names itself leader within `timeout`.
    pub fn leader(&self, timeout: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.is_none() {
                    continue;
                }
                let status = Http::connect(self.addr(i)).map_err(|e| e.to_string()).and_then(|mut h| h.post_json("/v3/maintenance/status", "{}"));
                if let Ok(v) = status {
                    let me = v.pointer("/header/member_id").and_then(|x| x.as_str());
                    let leader = v.get("leader").and_then(|x| x.as_str());
                    if me.is_some() && me == leader {
                        return Ok(i);
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no etcd member leads within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            m.kill();
        }
    }

    /// Starts member `i` again on its data directory and waits until it is healthy.
    ///
    /// # Errors
    /// It is running, or cannot be started.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members[i].is_some() {
            return Err(format!("member {} is running", self.specs[i].name));
        }
        let mut m = EtcdProcess::spawn(&self.specs[i])?;
        m.wait_healthy(START_TIMEOUT)?;
        self.members[i] = Some(m);
        Ok(())
    }

    /// Stops every member by its pid.
    pub fn stop(&mut self) {
        for m in self.members.iter_mut().flatten() {
            m.stop();
        }
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Http {
    reader: BufReader<TcpStream>,
    host: String,
}

/// What an answer's head says about its body.
struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
}

impl Http {
    /// Connects (no delay on small writes).
    ///
    /// # Errors
    /// The connect fails.
    pub fn connect(addr: SocketAddr) -> io::Result<Http> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        Ok(Http { reader: BufReader::with_capacity(64 << 10, s), host: addr.to_string() })
    }

    /// Bounds how long a read or write on the connection may block (`None`: forever).
    ///
    /// # Errors
    /// The socket refuses the option.
    pub fn set_timeout(&self, limit: Option<Duration>) -> io::Result<()> {
        let s = self.reader.get_ref();
        s.set_read_timeout(limit)?;
        s.set_write_timeout(limit)
    }

    /// A handle on the socket, to shut it down from another thread (ends a watch).
    ///
    /// # Errors
    /// The socket cannot be cloned.
    pub fn socket(&self) -> io::Result<TcpStream> {
        self.reader.get_ref().try_clone()
    }

    fn send(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<()> {
        let mut req = Vec::with_capacity(body.len() + 128);
        write!(req, "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", self.host, body.len())?;
        req.extend_from_slice(body);
        self.reader.get_mut().write_all(&req)
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.reader.read_line(&mut l)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        Ok(l.trim_end().to_owned())
    }

    fn head(&mut self) -> io::Result<Head> {
        let status_line = self.line()?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        let mut head = Head { status, length: None, chunked: false };
        loop {
            let l = self.line()?;
            if l.is_empty() {
                return Ok(head);
            }
            let Some((k, v)) = l.split_once(':') else { continue };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                head.length = v.parse().ok();
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                head.chunked = true;
            }
        }
    }

    /// The next chunk of a chunked body; `None` at its end.
    fn chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let size_line = self.line()?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            // Trailers, then the empty line.
            while !self.line()?.is_empty() {}
            return Ok(None);
        }
        let mut buf = vec![0; size];
        self.reader.read_exact(&mut buf)?;
        self.line()?;
        Ok(Some(buf))
    }

    /// Sends a request and reads the whole answer: (status, body).
    ///
    /// # Errors
    /// A transport error or an answer that does not parse.
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        self.send(method, path, body)?;
        let head = self.head()?;
        let mut out = Vec::new();
        if head.chunked {
            while let Some(c) = self.chunk()? {
                out.extend_from_slice(&c);
            }
        } else if let Some(n) = head.length {
            out.resize(n, 0);
            self.reader.read_exact(&mut out)?;
        }
        Ok((head.status, out))
    }

    /// `POST path` with a JSON body; the answer parsed as JSON when the status is 200.
    ///
    /// # Errors
    /// A transport error, a status other than 200 (`http <status>: <body>`), or a body that is
    /// not JSON.
    pub fn post_json(&mut self, path: &str, body: &str) -> Result<serde_json::Value, String> {
        let (status, out) = self.request("POST", path, body.as_bytes()).map_err(|e| format!("io: {e}"))?;
        if status != 200 {
            return Err(format!("http {status}: {}", String::from_utf8_lossy(&out).chars().take(200).collect::<String>()));
        }
        serde_json::from_slice(&out).map_err(|e| format!("bad json: {e}"))
    }

    /// Opens a watch stream (`POST /v3/watch` with `create_request`) over keys in
    /// `[key, range_end)`, then calls `on_message` with every JSON message etcd streams, until
    /// the connection ends (shut it down through [`socket`](Self::socket) to stop) or
    /// `on_message` returns false.
    ///
    /// # Errors
    /// The request fails or etcd does not answer 200.
    pub fn watch(&mut self, key: &[u8], range_end: &[u8], mut on_message: impl FnMut(&serde_json::Value) -> bool) -> io::Result<()> {
        let body = format!(r#"{{"create_request":{{"key":"{}","range_end":"{}"}}}}"#, b64(key), b64(range_end));
        self.send("POST", "/v3/watch", body.as_bytes())?;
        let head = self.head()?;
        if head.status != 200 {
            return Err(io::Error::other(format!("watch: http {}", head.status)));
        }
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let next = if head.chunked {
                match self.chunk() {
                    Ok(Some(c)) => c,
                    Ok(None) | Err(_) => return Ok(()),
                }
            } else {
                let mut buf = vec![0; 16 << 10];
                match self.reader.read(&mut buf) {
                    Ok(0) | Err(_) => return Ok(()),
                    Ok(n) => {
                        buf.truncate(n);
                        buf
                    }
                }
            };
            pending.extend_from_slice(&next);
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) {
                    if !on_message(&v) {
                        return Ok(());
                    }
                }
            }
        }
    }
}
