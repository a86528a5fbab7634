//! `tephra-bench cluster`: replicated journals on a three-node cluster of our servers against a
//! three-member etcd 3.4 cluster, side by side in one run (docs/benchmarks.md §8; issue 31's
//! "Benchmark"). Everything runs on this machine: loopback, one disk.
//!
//! | workload | ours (3 nodes) | etcd (3 members) |
//! |---|---|---|
//! | `W writers × B` | `J` single-writer journals, each won once (`SetLeader`); `B` records per fenced write at the writer's `next_seq`, sent to the journal's leader | per journal a head key: `txn(if mod_revision(head) == r then put B record keys and head else get head)`, sent to the etcd leader |
//! | linearizable reads | `R` readers, reader `i` on node `i % 3`, reading the last record of journal `i % J` (ReadIndex on that node) | `R` readers, reader `i` on member `i % 3`, a linearizable range (`serializable: false`) of head key `i % J` |
//! | failover | SIGKILL of the leader of a journal's group, time to the next acknowledged fenced write | SIGKILL of the etcd leader, time to the next acknowledged txn |
//!
//! With `W < J` writer `i` takes journals `i, i + W, ...` in turn; with `W > J` writers
//! `i, i + J, ...` share journal `i % J` under one leader uuid (etcd: one head key), so their
//! fenced writes race: a loser takes the journal's `next_seq` from the refusal (etcd: the
//! head's revision from the txn's failure branch) and writes again at once. A write's latency
//! runs from its first try to its acceptance; the retries are counted as conflicts.
//!
//! Every fenced workload also runs on one node of ours (`ours-1node`, no `[cluster]`), for the
//! ≥ 50% target. Each run starts its cluster fresh on new data directories under `--dir`,
//! measures a closed loop after a warm-up, stops every process by pid and removes the
//! directories; the systems' order rotates from round to round and the tables quote medians.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tephra::client::journal::{fresh_leader, JournalError, Journals, JournalsConfig, ListOutcome, ReadOutcome, SetLeaderOutcome, WriteOutcome};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};

use crate::append::fmt_us;
use crate::etcd::{b64, free_port, EtcdCluster, Http};
use crate::journal::{self, closed_loop, create_journals, io_name, journal_error, median_f, ours_held, summarise, EtcdFenced, Fenced, Median, Run, TENANT};
use crate::report::thousands;
use crate::server::{ServerProcess, ServerSpec};

/// Nodes of our cluster and members of etcd's.
pub const NODES: usize = 3;
/// Records each journal (etcd: each head key) holds before the read workload.
pub const READ_POPULATE: usize = 8;
/// Fenced writes before each failover trial's kill.
const FAILOVER_WARM_WRITES: usize = 20;
/// How long a failover trial may wait for its first acknowledged write.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// How long a failover writer waits for one answer before it asks the next node (both
/// systems): a request stuck on a node that has no leader (etcd holds it until its 7 s
/// request timeout) would otherwise be measured instead of the election.
const FAILOVER_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a fresh cluster may take to serve its directory and lead every journal.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Refusals in a row after which a racing writer gives up a write (a fence that was lost).
const MAX_CONFLICTS_IN_A_ROW: u64 = 10_000;

/// One workload of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// `writers` writers over the journals, `batch` records per fenced write.
    Fenced {
        /// Concurrent writers.
        writers: usize,
        /// Records per write.
        batch: usize,
    },
    /// Linearizable reads at the journals' tails.
    Reads,
}

impl Workload {
    /// Its label in tables and JSON.
    pub fn label(self, journals: usize, readers: usize) -> String {
        match self {
            Workload::Fenced { writers, batch } => {
                format!("fenced, {writers} writers over {journals} journals × {batch} record{}", if batch == 1 { "" } else { "s" })
            }
            Workload::Reads => format!("linearizable reads, {readers} readers over {journals} journals"),
        }
    }

    /// A short tag for file names.
    fn tag(self) -> String {
        match self {
            Workload::Fenced { writers, batch } => format!("w{writers}b{batch}"),
            Workload::Reads => "reads".into(),
        }
    }
}

/// The systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// Three of our `tephra-server` nodes, one cluster.
    Ours,
    /// Three etcd 3.4 members.
    Etcd,
    /// One of our `tephra-server`, no cluster: the base of the ≥ 50% target.
    OursSingle,
}

impl System {
    /// `ours`, `etcd` or `ours-1node`.
    pub fn name(self) -> &'static str {
        match self {
            System::Ours => "ours",
            System::Etcd => "etcd",
            System::OursSingle => "ours-1node",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterBenchConfig {
    /// Our `tephra-server`.
    pub ours: PathBuf,
    /// The etcd binary, or `None` for ours only.
    pub etcd: Option<PathBuf>,
    /// Scratch root for the data directories (one disk for every node; never a tmpfs).
    pub dir: PathBuf,
    /// Where `cluster.md`, `cluster.json` and `logs/` go.
    pub out: PathBuf,
    /// Journals (etcd: head keys) the writers and readers spread over.
    pub journals: usize,
    /// Writer counts of the fenced workloads.
    pub writers: Vec<usize>,
    /// Records per fenced write.
    pub batches: Vec<usize>,
    /// Bytes per record.
    pub record_size: usize,
    /// Readers of the read workload; 0 skips it.
    pub readers: usize,
    /// Run each fenced workload on one node of ours too.
    pub single_node: bool,
    /// Failover trials per system; 0 skips failover.
    pub failover_trials: usize,
    /// Rounds.
    pub rounds: usize,
    /// Unmeasured seconds before each window.
    pub warmup: Duration,
    /// Measured window of each run.
    pub duration: Duration,
    /// Pause between runs.
    pub settle: Duration,
    /// The journals' store durability.
    pub durability: StoreDurability,
}

impl ClusterBenchConfig {
    /// The workloads in the order each round runs them.
    pub fn workloads(&self) -> Vec<Workload> {
        let mut w: Vec<Workload> =
            self.writers.iter().flat_map(|&writers| self.batches.iter().map(move |&batch| Workload::Fenced { writers, batch })).collect();
        if self.readers > 0 {
            w.push(Workload::Reads);
        }
        w
    }

    /// The systems that run `w`, in the order of `round` (rotating, so none always goes first).
    fn systems(&self, w: Workload, round: usize, i: usize) -> Vec<System> {
        let mut s = vec![System::Ours];
        if self.etcd.is_some() {
            s.push(System::Etcd);
        }
        if self.single_node && matches!(w, Workload::Fenced { .. }) {
            s.push(System::OursSingle);
        }
        let k = (round + i) % s.len();
        s.rotate_left(k);
        s
    }

    fn label(&self, w: Workload) -> String {
        w.label(self.journals, self.readers)
    }
}

/// What our leader's `/metrics` say about a run's writes (ours only; counted over the whole
/// run, warm-up included).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerSide {
    /// The node (1-based) that answered the most writes: the leader of most journals.
    pub node: usize,
    /// Writes it answered.
    pub writes: u64,
    /// Their mean latency from request to answer on that node, µs.
    pub write_mean_us: f64,
    /// Group commits of its command log (each one `fdatasync`, two under `ordered`).
    pub commits: u64,
    /// Items (commands; in a cluster also entries and hard states) per group commit, mean.
    pub items_per_commit: f64,
}

/// One measured run, with what a cluster run adds.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRun {
    /// The run as `tephra-bench journal` reports it.
    #[serde(flatten)]
    pub run: Run,
    /// Fenced writes refused because another writer of the same journal got there first (each
    /// one retried at once).
    pub conflicts: u64,
    /// Ours: journals led by each node (node 1 first) when the run started.
    pub leaders: Vec<usize>,
    /// Ours: the leader's side of the writes.
    pub server: Option<ServerSide>,
    /// Ours, 3 nodes: leader changes during the measured loop (the most any node's groups saw;
    /// `tephra_cluster_leader_changes_total`).
    pub leader_changes: Option<u64>,
}

/// Failover trials of one system.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// `ours` or `etcd`.
    pub system: String,
    /// Each trial: from the SIGKILL of the leader to the next acknowledged write, ms.
    pub trials_ms: Vec<f64>,
    /// Median of the trials, ms.
    pub median_ms: Option<f64>,
    /// Largest, ms.
    pub max_ms: Option<f64>,
    /// Set when the trials stopped early: why.
    pub failed: Option<String>,
}

/// What one commit and one hop cost on this machine, measured before the rounds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Costs {
    /// A 1-byte TCP round trip on loopback, median, µs.
    pub loopback_rtt_us: f64,
    /// A 4 KiB write + fdatasync in a preallocated file under `--dir`, median, µs.
    pub fdatasync_4k_us: Option<f64>,
}

/// The whole result.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// Nodes (members) per cluster.
    pub nodes: usize,
    /// Journals.
    pub journals: usize,
    /// Bytes per record.
    pub record_size: usize,
    /// Readers.
    pub readers: usize,
    /// Rounds.
    pub rounds: usize,
    /// Warm-up seconds per run.
    pub warmup_seconds: f64,
    /// Window seconds per run.
    pub duration_seconds: f64,
    /// The journals' store durability.
    pub store_durability: String,
    /// The etcd binary, if any.
    pub etcd: Option<String>,
    /// The machine's costs behind the per-write breakdown.
    pub costs: Costs,
    /// Every run.
    pub runs: Vec<ClusterRun>,
    /// `workload label -> system -> median`.
    pub medians: BTreeMap<String, BTreeMap<String, Median>>,
    /// Failover, per system.
    pub failover: Vec<Failover>,
    /// The rendered tables (markdown).
    pub table: String,
    /// True when a signal stopped the run.
    pub interrupted: bool,
}

// ---------------------------------------------------------------------------------------
// Our nodes.

/// One of our nodes: how it starts, where its `/metrics` are, and its process while it runs.
struct Node {
    spec: ServerSpec,
    metrics: SocketAddr,
    process: Option<ServerProcess>,
}

/// Our servers for one run: `n` nodes of one cluster (`n > 1`), or one node without
/// `[cluster]`. Every node is stopped by its pid on drop.
pub struct OursCluster {
    nodes: Vec<Node>,
}

impl OursCluster {
    /// Starts `n` nodes of `binary`, node `i`'s data in `data_root/nI` and its log in
    /// `log_prefix-nI.log`, each with `/metrics` on a free loopback port.
    ///
    /// # Errors
    /// A port cannot be found or a node does not start.
    pub fn start(binary: &Path, data_root: &Path, log_prefix: &Path, n: usize) -> Result<OursCluster, String> {
        let port = || free_port().map_err(|e| format!("free port: {e}"));
        let peers: Vec<u16> = (0..n).map(|_| port()).collect::<Result<_, _>>()?;
        let peer_list = peers.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
        let mut nodes = Vec::with_capacity(n);
        for (i, peer) in peers.iter().enumerate() {
            let metrics: SocketAddr = ([127, 0, 0, 1], port()?).into();
            let mut env = vec![("TEPHRA__METRICS__BIND".to_owned(), metrics.to_string())];
            if n > 1 {
                env.push(("TEPHRA__CLUSTER__NODE_ID".into(), (i + 1).to_string()));
                env.push(("TEPHRA__CLUSTER__BIND".into(), format!("127.0.0.1:{peer}")));
                env.push(("TEPHRA__CLUSTER__PEERS".into(), peer_list.clone()));
            }
            let spec = ServerSpec {
                binary: binary.to_owned(),
                data_dir: data_root.join(format!("n{}", i + 1)),
                env,
                log_file: PathBuf::from(format!("{}-n{}.log", log_prefix.display(), i + 1)),
            };
            nodes.push(Node { spec, metrics, process: None });
        }
        let mut c = OursCluster { nodes };
        for i in 0..n {
            c.restart(i)?;
        }
        Ok(c)
    }

    /// Nodes, running or not.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The client addresses of the running nodes, node `first` (0-based) first and the others
    /// after it in turn: a client given this list talks to `first` until it is told to move.
    pub fn servers_from(&self, first: usize) -> Vec<String> {
        let n = self.nodes.len();
        (0..n).filter_map(|k| self.nodes[(first + k) % n].process.as_ref().map(|p| p.addr.to_string())).collect()
    }

    /// Node `i`'s `/metrics` page.
    ///
    /// # Errors
    /// It cannot be fetched.
    pub fn metrics(&self, i: usize) -> Result<String, String> {
        let (status, body) =
            Http::connect(self.nodes[i].metrics).and_then(|mut h| h.request("GET", "/metrics", b"")).map_err(|e| format!("metrics of node {}: {e}", i + 1))?;
        if status != 200 {
            return Err(format!("metrics of node {}: http {status}", i + 1));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// The node (0-based) leading each of `ids`, from the running nodes' `/metrics`; every node
    /// of a one-node deployment leads everything.
    ///
    /// # Errors
    /// Some journal has no leader within `timeout`.
    pub fn leaders(&self, ids: &[JournalId], timeout: Duration) -> Result<HashMap<JournalId, usize>, String> {
        if self.nodes.len() == 1 {
            return Ok(ids.iter().map(|&id| (id, 0)).collect());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let mut found = HashMap::new();
            for i in 0..self.nodes.len() {
                if self.nodes[i].process.is_none() {
                    continue;
                }
                let Ok(page) = self.metrics(i) else { continue };
                for id in ids {
                    let line = format!("tephra_cluster_group_is_leader{{tenant=\"{:016x}\",journal=\"{:016x}\"}} 1", id.tenant, id.journal);
                    if page.lines().any(|l| l == line) {
                        found.insert(*id, i);
                    }
                }
            }
            if found.len() == ids.len() {
                return Ok(found);
            }
            if Instant::now() > deadline {
                return Err(format!("{} of {} journals have no leader after {timeout:?}", ids.len() - found.len(), ids.len()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What node `i`'s `/metrics` say about journal writes and group commits.
    fn server_side(&self, i: usize) -> Result<ServerSide, String> {
        let page = self.metrics(i)?;
        let get = |name: &str| sample(&page, name).unwrap_or(0.0);
        let writes = get("tephra_journal_write_latency_seconds_count");
        let commits = get("tephra_journal_commit_commands_count");
        Ok(ServerSide {
            node: i + 1,
            writes: writes as u64,
            write_mean_us: if writes > 0.0 { get("tephra_journal_write_latency_seconds_sum") * 1e6 / writes } else { 0.0 },
            commits: commits as u64,
            items_per_commit: if commits > 0.0 { get("tephra_journal_commit_commands_sum") / commits } else { 0.0 },
        })
    }

    /// The side of the node that answered the most writes.
    fn busiest(&self) -> Option<ServerSide> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].process.is_some()).filter_map(|i| self.server_side(i).ok()).max_by_key(|s| s.writes)
    }

    /// Each running node's `tephra_cluster_leader_changes_total` (`None`: not a cluster, or
    /// unreadable).
    fn leader_changes(&self) -> Vec<Option<u64>> {
        (0..self.nodes.len()).map(|i| self.metrics(i).ok().and_then(|p| sample(&p, "tephra_cluster_leader_changes_total")).map(|v| v as u64)).collect()
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].process.take() {
            p.kill();
        }
    }

    /// Starts node `i` (again) on its data directory (on a new client port).
    ///
    /// # Errors
    /// It is running or does not start.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.nodes[i].process.is_some() {
            return Err(format!("node {} is running", i + 1));
        }
        self.nodes[i].process = Some(ServerProcess::start(&self.nodes[i].spec)?);
        Ok(())
    }

    /// Stops every node by its pid.
    pub fn stop(&mut self) {
        for n in &mut self.nodes {
            if let Some(p) = n.process.as_mut() {
                p.stop();
            }
        }
    }
}

/// The value of the unlabelled sample `name` in a `/metrics` page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).and_then(|v| v.trim().parse().ok())
}

/// The most leader changes any node saw between two [`OursCluster::leader_changes`] samples;
/// `None` when no node has the counter.
fn changes_since(before: &[Option<u64>], after: &[Option<u64>]) -> Option<u64> {
    before.iter().zip(after).filter_map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?))).max()
}

/// A client of `servers` (the first is asked first).
fn client(servers: Vec<String>) -> Journals {
    Journals::new(JournalsConfig::new(servers))
}

/// Waits until the deployment lists [`TENANT`] (in a cluster: the directory group has a
/// leader and confirms reads).
fn wait_ready(j: &mut Journals) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match j.list(Some(TENANT)) {
            Ok(ListOutcome::Listed(_) | ListOutcome::UnknownTenant) => return Ok(()),
            other if Instant::now() > deadline => return Err(format!("not serving its directory after {READY_TIMEOUT:?}: {other:?}")),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Sessions on `cfg.journals` journals `prefix-<i>`, created and won, each talking to its
/// journal's leader first; each journal's leader; and how many journals each node leads.
type Sessions = (Vec<Fenced>, HashMap<JournalId, usize>, Vec<usize>);

fn fenced_sessions(cfg: &ClusterBenchConfig, c: &OursCluster, admin: &mut Journals, prefix: &str) -> Result<Sessions, String> {
    wait_ready(admin)?;
    let ids = create_journals(admin, prefix, cfg.journals, Mode::Single, cfg.durability)?;
    let leaders = c.leaders(&ids, READY_TIMEOUT)?;
    let mut led = vec![0; c.len()];
    for l in leaders.values() {
        led[*l] += 1;
    }
    let sessions = ids.iter().map(|id| Fenced::claim(client(c.servers_from(leaders[id])), *id)).collect::<Result<Vec<_>, _>>()?;
    Ok((sessions, leaders, led))
}

// ---------------------------------------------------------------------------------------
// Writers spread over journals.

/// Spreads one session per journal over `writers` writers: with fewer writers than journals
/// writer `i` takes sessions `i, i + writers, ...`; with more, writer `i` takes session
/// `i % J`, the first `J` writers the sessions themselves, the others a `join` of them.
pub fn spread<T>(sessions: Vec<T>, writers: usize, join: impl Fn(&T) -> Result<T, String>) -> Result<Vec<Vec<T>>, String> {
    let n = sessions.len();
    let mut out: Vec<Vec<T>> = (0..writers).map(|_| Vec::new()).collect();
    if writers <= n {
        for (j, s) in sessions.into_iter().enumerate() {
            out[j % writers].push(s);
        }
    } else {
        for i in n..writers {
            out[i].push(join(&sessions[i % n])?);
        }
        for (j, s) in sessions.into_iter().enumerate() {
            out[j].push(s);
        }
    }
    Ok(out)
}

/// A writer's sessions, written in turn: one write per call, retried at once while another
/// writer of the same journal got there first.
struct Rotation<T> {
    sessions: Vec<T>,
    next: usize,
}

impl<T> Rotation<T> {
    /// One accepted write on the next session; `write` returns the records accepted or an
    /// error (`refused`: lost a race, write again).
    fn write(&mut self, conflicts: &AtomicU64, mut write: impl FnMut(&mut T) -> Result<u64, String>) -> Result<u64, String> {
        let k = self.next;
        self.next = (self.next + 1) % self.sessions.len();
        let mut refused = 0;
        loop {
            match write(&mut self.sessions[k]) {
                Err(e) if e == "refused" && refused < MAX_CONFLICTS_IN_A_ROW => {
                    refused += 1;
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }
}

/// `records(batch, size)` stamped with writer `i` in their first bytes, so that two writers'
/// batches never digest alike (a racing write must be refused, not taken for a duplicate).
fn stamped(i: usize, batch: usize, size: usize) -> Vec<Vec<u8>> {
    let mut recs = journal::records(batch, size);
    let tag = (i as u64).to_le_bytes();
    for r in &mut recs {
        let n = r.len().min(tag.len());
        r[..n].copy_from_slice(&tag[..n]);
    }
    recs
}

// ---------------------------------------------------------------------------------------
// The runs.

fn fenced_ours(
    cfg: &ClusterBenchConfig,
    c: &OursCluster,
    (writers, batch): (usize, usize),
    system: System,
    round: usize,
    stop: &AtomicBool,
) -> Result<ClusterRun, String> {
    let mut admin = client(c.servers_from(0));
    let (sessions, leaders, led) = fenced_sessions(cfg, c, &mut admin, "fenced")?;
    let groups = spread(sessions, writers, |s| Ok(s.join(client(c.servers_from(leaders[&s.id()])))))?;
    let conns: Vec<(Rotation<Fenced>, Vec<Vec<u8>>)> =
        groups.into_iter().enumerate().map(|(i, sessions)| (Rotation { sessions, next: 0 }, stamped(i, batch, cfg.record_size))).collect();
    let conflicts = AtomicU64::new(0);
    let changes_before = c.leader_changes();
    let (clock, tallies) = closed_loop(conns, cfg.warmup, cfg.duration, stop, |(r, recs)| r.write(&conflicts, |s| s.write(recs).map(|(_, n)| n)));
    let leader_changes = changes_since(&changes_before, &c.leader_changes());
    let mut run = summarise(cfg.label(Workload::Fenced { writers, batch }), system.name(), round, &clock, &tallies, stop);
    let held = ours_held(&mut admin)?;
    run.check = if held == run.records_acked_total { "held = acked".into() } else { format!("MISMATCH held {held} acked {}", run.records_acked_total) };
    Ok(ClusterRun { run, conflicts: conflicts.into_inner(), leaders: led, server: c.busiest(), leader_changes })
}

fn reads_ours(cfg: &ClusterBenchConfig, c: &OursCluster, round: usize, stop: &AtomicBool) -> Result<ClusterRun, String> {
    let mut admin = client(c.servers_from(0));
    let (mut sessions, _, led) = fenced_sessions(cfg, c, &mut admin, "read")?;
    let recs = journal::records(READ_POPULATE, cfg.record_size);
    for s in &mut sessions {
        s.write(&recs)?;
    }
    let ids: Vec<JournalId> = sessions.iter().map(Fenced::id).collect();
    let tail = READ_POPULATE as u64 - 1;
    let changes_before = c.leader_changes();
    let readers: Vec<(Journals, JournalId)> = (0..cfg.readers).map(|i| (client(c.servers_from(i % c.len())), ids[i % ids.len()])).collect();
    let (clock, tallies) = closed_loop(readers, cfg.warmup, cfg.duration, stop, |(j, id)| match j.read(*id, tail, 1, 0) {
        Ok(ReadOutcome::Page { records, .. }) if records.len() == 1 => Ok(1),
        Ok(ReadOutcome::Page { .. }) => Err("short page".into()),
        Ok(ReadOutcome::Truncated { .. }) => Err("truncated".into()),
        Ok(ReadOutcome::UnknownJournal) => Err("unknown_journal".into()),
        Ok(ReadOutcome::Unserved) => Err("unserved".into()),
        Ok(ReadOutcome::Ambiguous) => Err("ambiguous".into()),
        Err(e) => Err(journal_error(&e)),
    });
    let leader_changes = changes_since(&changes_before, &c.leader_changes());
    let run = summarise(cfg.label(Workload::Reads), System::Ours.name(), round, &clock, &tallies, stop);
    Ok(ClusterRun { run, conflicts: 0, leaders: led, server: None, leader_changes })
}

fn fenced_etcd(cfg: &ClusterBenchConfig, e: &EtcdCluster, (writers, batch): (usize, usize), round: usize, stop: &AtomicBool) -> Result<ClusterRun, String> {
    let addr = e.addr(e.leader(READY_TIMEOUT)?);
    let value = b64(&vec![b'x'; cfg.record_size]);
    let sessions = (0..cfg.journals).map(|j| EtcdFenced::new(addr, format!("j{j}/"))).collect::<Result<Vec<_>, _>>()?;
    let groups = spread(sessions, writers, |s| EtcdFenced::new(addr, s.prefix().to_owned()))?;
    let conns: Vec<Rotation<EtcdFenced>> = groups.into_iter().map(|sessions| Rotation { sessions, next: 0 }).collect();
    let conflicts = AtomicU64::new(0);
    let (clock, tallies) =
        closed_loop(conns, cfg.warmup, cfg.duration, stop, |r| r.write(&conflicts, |s| s.write(batch, &value).map(|(_, n)| n).map_err(io_name)));
    let run = summarise(cfg.label(Workload::Fenced { writers, batch }), System::Etcd.name(), round, &clock, &tallies, stop);
    Ok(ClusterRun { run, conflicts: conflicts.into_inner(), leaders: Vec::new(), server: None, leader_changes: None })
}

fn reads_etcd(cfg: &ClusterBenchConfig, e: &EtcdCluster, round: usize, stop: &AtomicBool) -> Result<ClusterRun, String> {
    let addr = e.addr(e.leader(READY_TIMEOUT)?);
    let value = b64(&vec![b'x'; cfg.record_size]);
    for j in 0..cfg.journals {
        EtcdFenced::new(addr, format!("j{j}/"))?.write(READ_POPULATE, &value)?;
    }
    let readers = (0..cfg.readers)
        .map(|i| {
            let body = format!(r#"{{"key":"{}","serializable":false}}"#, b64(format!("j{}/head", i % cfg.journals).as_bytes()));
            Http::connect(e.addr(i % e.len())).map(|h| (h, body)).map_err(|e| format!("connect etcd: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (clock, tallies) = closed_loop(readers, cfg.warmup, cfg.duration, stop, |(h, body)| {
        let v = h.post_json("/v3/kv/range", body).map_err(io_name)?;
        if v.pointer("/kvs/0").is_some() {
            Ok(1)
        } else {
            Err("no key".into())
        }
    });
    let run = summarise(cfg.label(Workload::Reads), System::Etcd.name(), round, &clock, &tallies, stop);
    Ok(ClusterRun { run, conflicts: 0, leaders: Vec::new(), server: None, leader_changes: None })
}

/// A fresh data directory `dir/<system>-<tag>` and the log prefix `out/logs/<system>-<tag>`.
fn places(cfg: &ClusterBenchConfig, system: System, tag: &str) -> (PathBuf, PathBuf) {
    let data = cfg.dir.join(format!("{}-{tag}", system.name()));
    let _ = std::fs::remove_dir_all(&data);
    (data, cfg.out.join("logs").join(format!("{}-{tag}", system.name())))
}

fn one_run(cfg: &ClusterBenchConfig, w: Workload, system: System, round: usize, stop: &AtomicBool) -> ClusterRun {
    let (data, log) = places(cfg, system, &format!("{}-r{round}", w.tag()));
    let result = match system {
        System::Ours | System::OursSingle => {
            let n = if system == System::Ours { NODES } else { 1 };
            OursCluster::start(&cfg.ours, &data, &log, n).and_then(|mut c| {
                let r = match w {
                    Workload::Fenced { writers, batch } => fenced_ours(cfg, &c, (writers, batch), system, round, stop),
                    Workload::Reads => reads_ours(cfg, &c, round, stop),
                };
                c.stop();
                r
            })
        }
        System::Etcd => match cfg.etcd.as_deref() {
            Some(bin) => EtcdCluster::start(bin, &data, &log, NODES).and_then(|mut e| {
                let r = match w {
                    Workload::Fenced { writers, batch } => fenced_etcd(cfg, &e, (writers, batch), round, stop),
                    Workload::Reads => reads_etcd(cfg, &e, round, stop),
                };
                e.stop();
                r
            }),
            None => Err("no etcd".into()),
        },
    };
    let _ = std::fs::remove_dir_all(&data);
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    let run = result.unwrap_or_else(|e| ClusterRun {
        run: Run::failed(cfg.label(w), system.name(), round, e),
        conflicts: 0,
        leaders: Vec::new(),
        server: None,
        leader_changes: None,
    });
    run.run.progress();
    run
}

// ---------------------------------------------------------------------------------------
// Failover.

/// A fenced write of ours retried (identical, so a write that got through is answered as a
/// duplicate) until one is acknowledged; the seq after it.
fn write_until_acked(j: &mut Journals, id: JournalId, leader: LeaderUuid, seq: u64, recs: &[Vec<u8>], limit: Duration) -> Result<u64, String> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match j.write_single(id, leader, seq, recs) {
            Ok(WriteOutcome::Written { seq: s, count, .. }) => return Ok(s + u64::from(count)),
            Ok(WriteOutcome::Refused { state }) => return Err(format!("write at {seq} refused: {state:?}")),
            Ok(o) => journal::write_outcome_name(&o).to_owned(),
            Err(JournalError::Unreachable(e)) => format!("unreachable: {e}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(format!("no acknowledged write within {limit:?} (last: {last})"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn failover_ours(cfg: &ClusterBenchConfig, stop: &AtomicBool) -> Result<Vec<f64>, String> {
    let (data, log) = places(cfg, System::Ours, "failover");
    let mut c = OursCluster::start(&cfg.ours, &data, &log, NODES)?;
    let result = (|| {
        let mut admin = client(c.servers_from(0));
        wait_ready(&mut admin)?;
        let id = create_journals(&mut admin, "failover", 1, Mode::Single, cfg.durability)?[0];
        let uuid = fresh_leader();
        let recs = journal::records(1, cfg.record_size);
        let mut seq = 0;
        let mut trials = Vec::new();
        let mut claimed = false;
        for _ in 0..cfg.failover_trials {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let leader = c.leaders(&[id], READY_TIMEOUT)?[&id];
            let mut config = JournalsConfig::new(c.servers_from(leader));
            config.request_timeout = FAILOVER_REQUEST_TIMEOUT;
            let mut j = Journals::new(config);
            if !claimed {
                match j.set_leader(id, uuid, None) {
                    Ok(SetLeaderOutcome::Won { .. }) => claimed = true,
                    other => return Err(format!("set-leader: {other:?}")),
                }
            }
            for _ in 0..FAILOVER_WARM_WRITES {
                seq = write_until_acked(&mut j, id, uuid, seq, &recs, FAILOVER_LIMIT)?;
            }
            let killed = Instant::now();
            c.kill(leader);
            seq = write_until_acked(&mut j, id, uuid, seq, &recs, FAILOVER_LIMIT)?;
            trials.push(killed.elapsed().as_secs_f64() * 1e3);
            c.restart(leader)?;
            // Back in the group: the restarted node knows the journal's leader again.
            let deadline = Instant::now() + READY_TIMEOUT;
            let line = format!("tephra_cluster_group_leader{{tenant=\"{:016x}\",journal=\"{:016x}\"}} ", id.tenant, id.journal);
            while !c.metrics(leader).is_ok_and(|p| p.lines().any(|l| l.starts_with(&line) && !l.ends_with(" 0"))) {
                if Instant::now() > deadline {
                    return Err(format!("node {} did not rejoin the group within {READY_TIMEOUT:?}", leader + 1));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(trials)
    })();
    c.stop();
    drop(c);
    let _ = std::fs::remove_dir_all(&data);
    result
}

fn failover_etcd(cfg: &ClusterBenchConfig, bin: &Path, stop: &AtomicBool) -> Result<Vec<f64>, String> {
    let (data, log) = places(cfg, System::Etcd, "failover");
    let mut e = EtcdCluster::start(bin, &data, &log, NODES)?;
    let value = b64(&vec![b'x'; cfg.record_size]);
    let result = (|| {
        let mut trials = Vec::new();
        for _ in 0..cfg.failover_trials {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let leader = e.leader(READY_TIMEOUT)?;
            let mut w = EtcdFenced::new(e.addr(leader), "f/".into())?;
            w.set_timeout(FAILOVER_REQUEST_TIMEOUT)?;
            for _ in 0..FAILOVER_WARM_WRITES {
                etcd_write_until_acked(&e, &mut w, leader, &value)?;
            }
            let killed = Instant::now();
            e.kill(leader);
            etcd_write_until_acked(&e, &mut w, leader, &value)?;
            trials.push(killed.elapsed().as_secs_f64() * 1e3);
            e.restart(leader)?;
        }
        Ok(trials)
    })();
    e.stop();
    drop(e);
    let _ = std::fs::remove_dir_all(&data);
    result
}

/// A fenced etcd write retried until one is acknowledged: after a transport error the writer
/// moves to the next member (its first write there is refused and takes the head's revision).
fn etcd_write_until_acked(e: &EtcdCluster, w: &mut EtcdFenced, mut member: usize, value: &str) -> Result<(), String> {
    let deadline = Instant::now() + FAILOVER_LIMIT;
    loop {
        let last = match w.write(1, value) {
            Ok(_) => return Ok(()),
            Err(r) if r == "refused" => continue,
            Err(err) => {
                if err.starts_with("io") {
                    member = (member + 1) % e.len();
                    if let Ok(next) = EtcdFenced::new(e.addr(member), w.prefix().to_owned()) {
                        next.set_timeout(FAILOVER_REQUEST_TIMEOUT)?;
                        *w = next;
                    }
                }
                err
            }
        };
        if Instant::now() > deadline {
            return Err(format!("no acknowledged txn within {FAILOVER_LIMIT:?} (last: {last})"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn failover(system: System, trials: Result<Vec<f64>, String>) -> Failover {
    let (trials_ms, failed) = match trials {
        Ok(t) => (t, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let f = Failover {
        system: system.name().into(),
        median_ms: (!trials_ms.is_empty()).then(|| median_f(trials_ms.clone())),
        max_ms: trials_ms.iter().copied().reduce(f64::max),
        trials_ms,
        failed,
    };
    eprintln!(
        "  failover {:<6} trials {:?} ms{}",
        f.system,
        f.trials_ms.iter().map(|t| t.round() as u64).collect::<Vec<_>>(),
        f.failed.as_deref().map(|e| format!(" FAILED: {e}")).unwrap_or_default()
    );
    f
}

// ---------------------------------------------------------------------------------------
// The machine's costs.

/// Median of `n` 1-byte TCP round trips on loopback, µs.
fn loopback_rtt(n: usize) -> std::io::Result<f64> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut b = [7u8; 1];
    let mut rtts = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(s);
    let _ = echo.join();
    Ok(median_f(rtts))
}

/// Measures [`Costs`] with `dir` as the disk.
pub fn costs(dir: &Path) -> Costs {
    let row = crate::fsync::buffered_commits(dir, 4096, 200);
    Costs { loopback_rtt_us: loopback_rtt(2000).unwrap_or(f64::NAN), fdatasync_4k_us: row.fdatasync_latency.map(|l| l.p50_us as f64) }
}

// ---------------------------------------------------------------------------------------
// The whole benchmark.

/// Runs every round and the failover trials, and writes `cluster.md` and `cluster.json` into
/// `cfg.out`.
///
/// # Errors
/// `cfg.out` or `cfg.dir` cannot be created or written.
pub fn run(cfg: &ClusterBenchConfig, stop: &AtomicBool) -> Result<ClusterReport, String> {
    std::fs::create_dir_all(cfg.out.join("logs")).map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    std::fs::create_dir_all(&cfg.dir).map_err(|e| format!("{}: {e}", cfg.dir.display()))?;
    let costs = costs(&cfg.dir);
    eprintln!(
        "  loopback round trip {:.0} µs, 4 KiB write + fdatasync {}",
        costs.loopback_rtt_us,
        costs.fdatasync_4k_us.map_or("-".into(), |u| fmt_us(u as u64))
    );
    let workloads = cfg.workloads();
    let mut runs = Vec::new();
    'rounds: for round in 1..=cfg.rounds {
        for (i, &w) in workloads.iter().enumerate() {
            for system in cfg.systems(w, round, i) {
                if stop.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                runs.push(one_run(cfg, w, system, round, stop));
                std::thread::sleep(cfg.settle);
            }
        }
    }
    let mut fo = Vec::new();
    if cfg.failover_trials > 0 && !stop.load(Ordering::Relaxed) {
        fo.push(failover(System::Ours, failover_ours(cfg, stop)));
        if let Some(bin) = cfg.etcd.as_deref() {
            if !stop.load(Ordering::Relaxed) {
                fo.push(failover(System::Etcd, failover_etcd(cfg, bin, stop)));
            }
        }
    }
    let plain: Vec<Run> = runs.iter().map(|r| r.run.clone()).collect();
    let mut report = ClusterReport {
        nodes: NODES,
        journals: cfg.journals,
        record_size: cfg.record_size,
        readers: cfg.readers,
        rounds: cfg.rounds,
        warmup_seconds: cfg.warmup.as_secs_f64(),
        duration_seconds: cfg.duration.as_secs_f64(),
        store_durability: format!("{:?}", cfg.durability).to_lowercase(),
        etcd: cfg.etcd.as_ref().map(|p| p.display().to_string()),
        costs,
        medians: journal::medians(&plain),
        runs,
        failover: fo,
        table: String::new(),
        interrupted: stop.load(Ordering::Relaxed),
    };
    report.table = render(cfg, &report);
    std::fs::write(cfg.out.join("cluster.md"), &report.table).map_err(|e| format!("write cluster.md: {e}"))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| format!("json: {e}"))?;
    std::fs::write(cfg.out.join("cluster.json"), json).map_err(|e| format!("write cluster.json: {e}"))?;
    Ok(report)
}

/// Median over the successful runs of `label` on `system` of `f`.
fn median_of(r: &ClusterReport, label: &str, system: System, f: impl Fn(&ClusterRun) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = r.runs.iter().filter(|x| x.run.workload == label && x.run.system == system.name() && x.run.failed.is_none()).filter_map(f).collect();
    (!v.is_empty()).then(|| median_f(v))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn fmt_x(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}×"))
}

fn fmt_ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.0} ms"))
}

/// µs with a sign (`−` below zero); `-` for none.
fn signed_us(x: Option<f64>) -> String {
    match x {
        Some(x) if x < 0.0 => format!("−{}", fmt_us((-x) as u64)),
        Some(x) => fmt_us(x as u64),
        None => "-".into(),
    }
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// The markdown tables: medians against the targets, failover, where a write's time goes, and
/// every run.
pub fn render(cfg: &ClusterBenchConfig, r: &ClusterReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Replicated journals vs etcd\n\n{} nodes (members) per cluster on loopback, one disk; {} rounds × {} s after {} s of warm-up per run, medians over rounds; {} journals, {}-byte records, store durability `{}`; etcd: {}.\n",
        r.nodes,
        r.rounds,
        r.duration_seconds,
        r.warmup_seconds,
        r.journals,
        r.record_size,
        r.store_durability,
        r.etcd.as_deref().unwrap_or("not run")
    );
    let _ = writeln!(s, "| workload | ours records/s | etcd records/s | ratio | ours p50 | etcd p50 | ours p99 | etcd p99 | p99 ratio | ours 1 node records/s | 3 nodes / 1 node | target |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let get = |w: &str, sys: System| r.medians.get(w).and_then(|m| m.get(sys.name())).cloned();
    let rate = |m: &Option<Median>| m.as_ref().map(|m| m.records_per_sec);
    let fmt_rate = |m: &Option<Median>| rate(m).map_or("-".into(), thousands);
    let fmt_p = |m: &Option<Median>, f: fn(&Median) -> u64| m.as_ref().map_or("-".into(), |m| fmt_us(f(m)));
    for w in cfg.workloads() {
        let label = cfg.label(w);
        let (o, e, one) = (get(&label, System::Ours), get(&label, System::Etcd), get(&label, System::OursSingle));
        let x = ratio(rate(&o), rate(&e));
        let p99 = ratio(o.as_ref().map(|m| m.p99_us as f64), e.as_ref().map(|m| m.p99_us as f64));
        let of_one = ratio(rate(&o), rate(&one));
        let target = match w {
            Workload::Fenced { .. } => {
                let vs_etcd = match (x, p99) {
                    (Some(x), Some(p)) => format!("≥ 5×, p99 ≤ 0.5×: {}", met(x >= 5.0 && p <= 0.5)),
                    _ => "≥ 5×, p99 ≤ 0.5×: no etcd".into(),
                };
                match of_one {
                    Some(f) => format!("{vs_etcd}; ≥ 50% of 1 node: {}", met(f >= 0.5)),
                    None => vs_etcd,
                }
            }
            Workload::Reads => match x {
                Some(x) => format!("≥ 2× reads/s: {}", met(x >= 2.0)),
                None => "≥ 2× reads/s: no etcd".into(),
            },
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {target} |",
            fmt_rate(&o),
            fmt_rate(&e),
            fmt_x(x),
            fmt_p(&o, |m| m.p50_us),
            fmt_p(&e, |m| m.p50_us),
            fmt_p(&o, |m| m.p99_us),
            fmt_p(&e, |m| m.p99_us),
            fmt_x(p99),
            fmt_rate(&one),
            of_one.map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
        );
    }
    let _ = writeln!(
        s,
        "\nRead rows count reads (one record each) per second. Writers that share a journal (more writers than journals) race for its `next_seq`: a write's latency runs from its first try to its acceptance, and the lost races are in the `conflicts` column below."
    );
    if !r.failover.is_empty() {
        let _ = writeln!(s, "\n## Failover\n\nSIGKILL of the leader (ours: of the journal's group; etcd: the cluster's), then the time to the next acknowledged fenced write, per trial; the node is started again between trials.\n");
        let _ = writeln!(s, "| system | trials | median | max | each | target |");
        let _ = writeln!(s, "|---|---:|---:|---:|---|---|");
        for f in &r.failover {
            let target = if f.system == System::Ours.name() { f.max_ms.map_or("-".into(), |m| format!("≤ 2 s: {}", met(m <= 2000.0))) } else { "-".into() };
            let each = match &f.failed {
                Some(e) => format!("FAILED: {}", e.replace('\n', " ").replace('|', "/")),
                None => f.trials_ms.iter().map(|t| format!("{t:.0}")).collect::<Vec<_>>().join(", "),
            };
            let _ = writeln!(s, "| {} | {} | {} | {} | {each} | {target} |", f.system, f.trials_ms.len(), fmt_ms(f.median_ms), fmt_ms(f.max_ms));
        }
    }
    let _ = writeln!(
        s,
        "\n## Where a write's time goes (ours)\n\nMedians over rounds of each run's means. Client: one try, sent to answered, as the writer saw it (writers sharing a journal try again after a lost race). Leader: request to answer on the node that answered the writes (its `/metrics`, warm-up included); the hop to the client and back is the difference. One node: the same workload on one node without `[cluster]`; the difference is what replication adds (peer round trips, the followers' commits, the rounds of the node loop). The machine: a loopback round trip {:.0} µs, a 4 KiB write + fdatasync {} (a group commit of `ordered` journals syncs twice).\n",
        r.costs.loopback_rtt_us,
        r.costs.fdatasync_4k_us.map_or("-".into(), |u| fmt_us(u as u64))
    );
    let _ = writeln!(s, "| workload | tries per write | client per try | leader mean | client ↔ leader | 1 node: leader mean | replication adds | commits/s, leader (3 nodes) | writes per commit (3 nodes / 1 node) |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let window = r.warmup_seconds + r.duration_seconds;
    for w in cfg.workloads() {
        let Workload::Fenced { batch, .. } = w else { continue };
        let label = cfg.label(w);
        let tries = |x: &ClusterRun| {
            let writes = x.run.records_acked_total as f64 / batch as f64;
            (writes > 0.0).then(|| (writes + x.conflicts as f64) / writes)
        };
        let per_try = median_of(r, &label, System::Ours, |x| Some(x.run.latency?.mean_us / tries(x)?));
        let leader_mean = median_of(r, &label, System::Ours, |x| x.server.map(|s| s.write_mean_us));
        let one_mean = median_of(r, &label, System::OursSingle, |x| x.server.map(|s| s.write_mean_us));
        let commits = median_of(r, &label, System::Ours, |x| x.server.map(|s| s.commits as f64 / window));
        let per_commit = |sys| median_of(r, &label, sys, |x: &ClusterRun| x.server.filter(|s| s.commits > 0).map(|s| s.writes as f64 / s.commits as f64));
        let diff = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            median_of(r, &label, System::Ours, tries).map_or("-".into(), |x| format!("{x:.2}")),
            signed_us(per_try),
            signed_us(leader_mean),
            signed_us(diff(per_try, leader_mean)),
            signed_us(one_mean),
            signed_us(diff(leader_mean, one_mean)),
            commits.map_or("-".into(), thousands),
            per_commit(System::Ours).map_or("-".into(), |x| format!("{x:.1}")),
            per_commit(System::OursSingle).map_or("-".into(), |x| format!("{x:.1}")),
        );
    }
    let _ = writeln!(
        s,
        "\n## Every run\n\n| round | system | workload | records/s | writes/s | p50 | p99 | max | acked | conflicts | journals led per node | leader changes | check | errors |"
    );
    let _ = writeln!(s, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|");
    for c in &r.runs {
        let run = &c.run;
        let errors = if let Some(f) = &run.failed {
            format!("FAILED: {}", f.replace('\n', " ").replace('|', "/"))
        } else if run.errors.is_empty() {
            "-".into()
        } else {
            run.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        let led = if c.leaders.is_empty() { "-".into() } else { c.leaders.iter().map(ToString::to_string).collect::<Vec<_>>().join(" / ") };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {led} | {} | {} | {errors} |",
            run.round,
            run.system,
            run.workload,
            thousands(run.records_per_sec),
            thousands(run.writes_per_sec),
            run.latency.map_or("-".into(), |l| fmt_us(l.p50_us)),
            run.latency.map_or("-".into(), |l| fmt_us(l.p99_us)),
            run.latency.map_or("-".into(), |l| fmt_us(l.max_us)),
            run.records_acked_total,
            c.conflicts,
            c.leader_changes.map_or("-".into(), |n| n.to_string()),
            run.check,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_covers_every_journal_once_or_shares_them_evenly() {
        let fewer = spread((0..8).collect::<Vec<usize>>(), 3, |&s| Ok(s)).unwrap();
        assert_eq!(fewer, vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]);
        let more = spread((0..2).collect::<Vec<usize>>(), 5, |&s| Ok(s + 100)).unwrap();
        assert_eq!(more, vec![vec![0], vec![1], vec![100], vec![101], vec![100]]);
    }

    #[test]
    fn stamped_records_of_two_writers_differ() {
        assert_ne!(stamped(1, 2, 256), stamped(2, 2, 256));
        assert_eq!(stamped(3, 1, 4)[0], vec![3, 0, 0, 0]);
    }

    #[test]
    fn systems_rotate_and_single_node_runs_only_writes() {
        let cfg = ClusterBenchConfig {
            ours: PathBuf::new(),
            etcd: Some(PathBuf::new()),
            dir: PathBuf::new(),
            out: PathBuf::new(),
            journals: 64,
            writers: vec![16],
            batches: vec![1],
            record_size: 256,
            readers: 8,
            single_node: true,
            failover_trials: 0,
            rounds: 1,
            warmup: Duration::ZERO,
            duration: Duration::ZERO,
            settle: Duration::ZERO,
            durability: StoreDurability::Ordered,
        };
        let w = Workload::Fenced { writers: 16, batch: 1 };
        assert_eq!(cfg.systems(w, 0, 0), vec![System::Ours, System::Etcd, System::OursSingle]);
        assert_eq!(cfg.systems(w, 1, 0), vec![System::Etcd, System::OursSingle, System::Ours]);
        assert_eq!(cfg.systems(Workload::Reads, 1, 0), vec![System::Etcd, System::Ours]);
        assert_eq!(cfg.workloads(), vec![w, Workload::Reads]);
    }

    #[test]
    fn samples_are_read_from_a_metrics_page() {
        let page = "# HELP x\nfoo_count 12\nfoo_sum 0.5\nfoo_bucket{le=\"1\"} 3\n";
        assert_eq!(sample(page, "foo_count"), Some(12.0));
        assert_eq!(sample(page, "foo_sum"), Some(0.5));
        assert_eq!(sample(page, "bar"), None);
    }
}
