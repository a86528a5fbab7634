//! A cluster of server processes on loopback: each node its own data directory, client port
//! (any free one) and peer port (picked free up front, since every node's `[cluster] peers`
//! names the others' before they start), configured through `TEPHRA__CLUSTER__*`.
//!
//! A cluster started with [`Cluster::start_proxied`] puts a [`Proxy`] in front of each node
//! pair's link: the lower id dials the higher one (one connection per pair), so node `i` lists
//! the proxy of the pair `(i, j)` as `j`'s address for every `j > i`, and that proxy forwards to
//! `j`'s peer port. Partitions ([`Cluster::partition`]) and delays ([`Cluster::set_delay`])
//! then act on the proxies; SIGSTOP and SIGCONT ([`Cluster::pause`], [`Cluster::resume`]) on
//! the processes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proxy::{Mode, Proxy};
use crate::Server;

/// A running cluster. Every node is killed on drop.
pub struct Cluster {
    binary: PathBuf,
    /// The nodes, node id `i + 1` at index `i`; `None` while a node is stopped.
    nodes: Vec<Option<Server>>,
    /// Whether each node is paused by SIGSTOP now.
    paused: Vec<bool>,
    /// What each node's earlier processes printed (killed or exited), in order.
    past_logs: Vec<String>,
    /// Each node's peer address.
    pub peer_addrs: Vec<SocketAddr>,
    /// The proxy in front of each pair's link, keyed `(lower id, higher id)`; empty unless
    /// started with [`Cluster::start_proxied`].
    proxies: BTreeMap<(u64, u64), Proxy>,
    /// Each node's data directory (kept across restarts).
    data: Vec<tempfile::TempDir>,
    /// Environment every node gets besides its cluster settings.
    env: Vec<(String, String)>,
    /// Each node's `cluster.zone`, when set.
    zones: Vec<Option<String>>,
}

/// A free loopback port (bound and released; a race with another process is possible but
/// rare on a test machine).
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port")
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) of `binary`, each with `env` besides its cluster settings;
    /// every node reaches its peers directly.
    ///
    /// # Panics
    /// When a node does not start.
    pub fn start(binary: &Path, n: usize, env: &[(&str, &str)]) -> Cluster {
        Cluster::start_with(binary, n, env, false, &[])
    }

    /// [`Cluster::start`] with one node per entry of `zones`, node `i + 1` in `zones[i]`.
    pub fn start_zoned(binary: &Path, zones: &[&str], env: &[(&str, &str)]) -> Cluster {
        Cluster::start_with(binary, zones.len(), env, false, zones)
    }

    /// [`Cluster::start`] with a [`Proxy`] in front of each node pair's link, all open.
    pub fn start_proxied(binary: &Path, n: usize, env: &[(&str, &str)]) -> Cluster {
        Cluster::start_with(binary, n, env, true, &[])
    }

    fn start_with(binary: &Path, n: usize, env: &[(&str, &str)], proxied: bool, zones: &[&str]) -> Cluster {
        // Each peer port stays bound until its node starts, so that no proxy (binding port 0)
        // is handed one of them meanwhile.
        let mut held: Vec<Option<TcpListener>> = (0..n).map(|_| Some(TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))).collect();
        let peer_addrs: Vec<SocketAddr> = held.iter().map(|l| l.as_ref().unwrap().local_addr().expect("a bound port")).collect();
        let mut proxies = BTreeMap::new();
        if proxied {
            for i in 1..=n as u64 {
                for j in i + 1..=n as u64 {
                    proxies.insert((i, j), Proxy::start(peer_addrs[j as usize - 1]));
                }
            }
        }
        let data = (0..n).map(|_| crate::scratch_dir()).collect();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut c = Cluster {
            binary: binary.to_owned(),
            nodes: (0..n).map(|_| None).collect(),
            paused: vec![false; n],
            past_logs: vec![String::new(); n],
            peer_addrs,
            proxies,
            data,
            env,
            zones: (0..n).map(|i| zones.get(i).map(|z| z.to_string())).collect(),
        };
        for id in 1..=n as u64 {
            drop(held[id as usize - 1].take());
            c.start_node(id);
        }
        c
    }

    /// How many nodes the cluster has (running or not).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// `"1=HOST:PORT,2=..."`: the peer addresses node `id` uses (its own entry is its bind
    /// address, which it ignores; a peer behind a proxy is named by the proxy).
    pub fn peers(&self, id: u64) -> String {
        (1..=self.nodes.len() as u64)
            .map(|j| {
                let addr = match self.proxies.get(&(id, j)) {
                    Some(p) => p.addr(),
                    None => self.peer_addrs[j as usize - 1],
                };
                format!("{j}={addr}")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The environment node `id` starts with.
    pub fn node_env(&self, id: u64) -> Vec<(String, String)> {
        let mut env = vec![
            ("TEPHRA__CLUSTER__NODE_ID".to_owned(), id.to_string()),
            ("TEPHRA__CLUSTER__BIND".to_owned(), self.peer_addrs[id as usize - 1].to_string()),
            ("TEPHRA__CLUSTER__PEERS".to_owned(), self.peers(id)),
        ];
        if let Some(z) = &self.zones[id as usize - 1] {
            env.push(("TEPHRA__CLUSTER__ZONE".to_owned(), z.clone()));
        }
        env.extend(self.env.iter().cloned());
        env
    }

    /// Starts node `id` (again) on its data directory.
    ///
    /// # Panics
    /// When it is running or does not start.
    pub fn start_node(&mut self, id: u64) {
        assert!(self.nodes[id as usize - 1].is_none(), "node {id} is running");
        let env = self.node_env(id);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let data = self.data[id as usize - 1].path().join("data");
        // Its peer port was free when drawn (or when it last ran), but any process may have
        // taken it since, often as a connection's own port for a moment: try again for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match Server::try_start_on(&self.binary, Some(&data), &env, None) {
                Ok(s) => {
                    self.nodes[id as usize - 1] = Some(s);
                    return;
                }
                Err(e) if e.contains("cannot listen for peers") && e.contains("Address already in use") && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// SIGKILLs node `id` (a paused one too).
    pub fn kill(&mut self, id: u64) {
        if let Some(mut s) = self.nodes[id as usize - 1].take() {
            let status = s.kill();
            self.keep_log(id, &s, status);
        }
        self.paused[id as usize - 1] = false;
    }

    fn keep_log(&mut self, id: u64, s: &Server, status: std::process::ExitStatus) {
        let past = &mut self.past_logs[id as usize - 1];
        past.push_str(&s.log());
        past.push_str(&format!("--- node {id} process {} ended: {status} ---\n", s.pid()));
    }

    /// Everything node `id`'s processes printed, the earlier ones (killed or exited) first.
    pub fn log(&self, id: u64) -> String {
        let mut log = self.past_logs[id as usize - 1].clone();
        if let Some(s) = self.node(id) {
            log.push_str(&s.log());
        }
        log
    }

    /// Pauses node `id` with SIGSTOP: it holds its sockets but answers nothing.
    ///
    /// # Panics
    /// When it is not running.
    pub fn pause(&mut self, id: u64) {
        self.node(id).unwrap_or_else(|| panic!("node {id} is not running")).signal(libc::SIGSTOP);
        self.paused[id as usize - 1] = true;
    }

    /// Resumes a paused node `id` with SIGCONT (nothing when it is not paused).
    pub fn resume(&mut self, id: u64) {
        if self.paused[id as usize - 1] {
            if let Some(s) = self.node(id) {
                s.signal(libc::SIGCONT);
            }
            self.paused[id as usize - 1] = false;
        }
    }

    /// Whether node `id` is paused now.
    pub fn is_paused(&self, id: u64) -> bool {
        self.paused[id as usize - 1]
    }

    /// Waits up to `timeout` for node `id` to exit by itself; its exit status, the node then
    /// counted as stopped. `None` when it is still running (or was not).
    pub fn wait_exit(&mut self, id: u64, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let status = self.nodes[id as usize - 1].as_mut()?.wait_exit(timeout)?;
        if let Some(s) = self.nodes[id as usize - 1].take() {
            self.keep_log(id, &s, status);
        }
        self.paused[id as usize - 1] = false;
        Some(status)
    }

    /// Node `id`, when running.
    pub fn node(&self, id: u64) -> Option<&Server> {
        self.nodes[id as usize - 1].as_ref()
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.data[id as usize - 1].path().join("data")
    }

    /// The client addresses of the running nodes, in id order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().flatten().map(|s| s.addr.to_string()).collect()
    }

    /// The ids of the running nodes (paused ones included).
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=self.nodes.len() as u64).filter(|&id| self.nodes[id as usize - 1].is_some())
    }

    /// The proxy of the link between `a` and `b` (either order).
    ///
    /// # Panics
    /// When the cluster has no proxies or `a == b`.
    pub fn proxy(&self, a: u64, b: u64) -> &Proxy {
        self.proxies.get(&(a.min(b), a.max(b))).expect("a proxied cluster and two distinct nodes")
    }

    /// Splits the cluster into `sides`: every link between nodes of different sides is put in
    /// `mode` ([`Mode::Cut`] or [`Mode::Hold`]), every link inside a side is opened (its
    /// delay kept). A node in no side is a side of its own.
    ///
    /// # Panics
    /// When the cluster has no proxies.
    pub fn partition(&self, sides: &[&[u64]], mode: Mode) {
        assert!(!self.proxies.is_empty(), "partitions need Cluster::start_proxied");
        let side = |n: u64| sides.iter().position(|s| s.contains(&n)).map_or(usize::MAX - n as usize, |i| i);
        for (&(a, b), p) in &self.proxies {
            if side(a) == side(b) {
                p.set_mode(Mode::Open);
            } else {
                p.set_mode(mode);
            }
        }
    }

    /// Opens every link and takes every delay away.
    pub fn heal(&self) {
        for p in self.proxies.values() {
            p.heal();
        }
    }

    /// Delays every byte on every link by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        for p in self.proxies.values() {
            p.set_delay(delay);
        }
    }

    /// The `/metrics` page of node `id`, or `None` when it is not running, is paused, or does
    /// not answer within `timeout` (the node must have been started with
    /// `TEPHRA__METRICS__BIND`).
    pub fn metrics(&self, id: u64, timeout: Duration) -> Option<String> {
        if self.is_paused(id) {
            return None;
        }
        let addr = self.node(id)?.metrics_addr();
        let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        s.set_write_timeout(Some(timeout)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    }

    /// The node that says it leads the group of journal `(tenant, journal)` now, from the
    /// `/metrics` of each running node that is not paused; `None` when none does.
    pub fn group_leader(&self, tenant: u64, journal: u64) -> Option<u64> {
        let label = format!("tephra_cluster_group_is_leader{{tenant=\"{tenant:016x}\",journal=\"{journal:016x}\"}} 1");
        self.ids().find(|&id| self.metrics(id, Duration::from_secs(1)).is_some_and(|m| m.contains(&label)))
    }
}

/// A journal client of `servers` with a cluster test's patience: 10 s per request (redirects
/// and elections included), 3 s per read.
pub fn client(servers: Vec<String>) -> tephra::client::journal::Journals {
    let mut c = tephra::client::journal::JournalsConfig::new(servers);
    c.request_timeout = Duration::from_secs(10);
    c.read_timeout = Duration::from_secs(3);
    tephra::client::journal::Journals::new(c)
}

/// Writes `record` at `seq` of single-writer journal `id` under `leader`, asking again while
/// the cluster has no verdict for it (no leader yet, busy, an answer lost), for up to 20 s. A
/// write whose answer was lost and that landed is answered `REFUSED` at its retry, with the
/// tail past it and `leader` still leading: taken as written.
///
/// # Panics
/// On any other answer, or no verdict within 20 s.
pub fn write_until_written(
    c: &mut tephra::client::journal::Journals,
    id: tephra::journal::JournalId,
    leader: tephra::journal::LeaderUuid,
    seq: u64,
    record: &[u8],
) {
    use tephra::client::journal::{JournalError, WriteOutcome};
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match c.write_single(id, leader, seq, &[record.to_vec()]) {
            Ok(WriteOutcome::Written { seq: s, .. }) => {
                assert_eq!(s, seq);
                return;
            }
            Ok(WriteOutcome::Ambiguous | WriteOutcome::NotLeader { .. } | WriteOutcome::Busy)
            | Err(JournalError::Unreachable(_) | JournalError::NoAnswer { .. }) => {
                assert!(std::time::Instant::now() < deadline, "no verdict for the write at {seq} within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(WriteOutcome::Refused { state }) if state.next_seq > seq && state.leader == Some(leader) => return,
            other => panic!("write at {seq}: {other:?}"),
        }
    }
}
