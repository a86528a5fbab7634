//! A cluster of server processes on loopback: each node its own data directory, client port
//! (any free one) and peer port (picked free up front, since every node's `[cluster] peers`
//! names the others' before they start), configured through `TEPHRA__CLUSTER__*`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use crate::Server;

/// A running cluster. Every node is killed on drop.
pub struct Cluster {
    binary: PathBuf,
    /// The nodes, node id `i + 1` at index `i`; `None` while a node is stopped.
    nodes: Vec<Option<Server>>,
    /// Each node's peer address.
    pub peer_addrs: Vec<SocketAddr>,
    /// Each node's data directory (kept across restarts).
    data: Vec<tempfile::TempDir>,
    /// Environment every node gets besides its cluster settings.
    env: Vec<(String, String)>,
}

/// A free loopback port (bound and released; a race with another process is possible but
/// rare on a test machine).
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port")
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) of `binary`, each with `env` besides its cluster settings.
    ///
    /// # Panics
    /// When a node does not start.
    pub fn start(binary: &Path, n: usize, env: &[(&str, &str)]) -> Cluster {
        let peer_addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
        let data = (0..n).map(|_| crate::scratch_dir()).collect();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut c = Cluster { binary: binary.to_owned(), nodes: (0..n).map(|_| None).collect(), peer_addrs, data, env };
        for id in 1..=n as u64 {
            c.start_node(id);
        }
        c
    }

    /// `"1=HOST:PORT,2=..."` for every node.
    pub fn peers(&self) -> String {
        self.peer_addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",")
    }

    /// The environment node `id` starts with.
    pub fn node_env(&self, id: u64) -> Vec<(String, String)> {
        let mut env = vec![
            ("TEPHRA__CLUSTER__NODE_ID".to_owned(), id.to_string()),
            ("TEPHRA__CLUSTER__BIND".to_owned(), self.peer_addrs[id as usize - 1].to_string()),
            ("TEPHRA__CLUSTER__PEERS".to_owned(), self.peers()),
        ];
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
        self.nodes[id as usize - 1] = Some(Server::start_on(&self.binary, Some(&data), &env, None));
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut s) = self.nodes[id as usize - 1].take() {
            s.kill();
        }
    }

    /// Waits up to `timeout` for node `id` to exit by itself; its exit status, the node then
    /// counted as stopped. `None` when it is still running (or was not).
    pub fn wait_exit(&mut self, id: u64, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let status = self.nodes[id as usize - 1].as_mut()?.wait_exit(timeout)?;
        self.nodes[id as usize - 1] = None;
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

    /// The client address of every node that ran, by id (a stopped node's last one).
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=self.nodes.len() as u64).filter(|&id| self.nodes[id as usize - 1].is_some())
    }
}
