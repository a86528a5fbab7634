//! The loop that drives one cluster node: journal calls from the shards and consensus
//! messages from the peers in, rounds of the [`Replica`] carried out against the node's command
//! log (one group commit for every group's entries and hard states) and the peer links, and
//! each call answered from the verdict of its applied entry. It runs on its own thread, as the
//! single-node sequencer does, and publishes what is applied to the same [`Published`] state,
//! from which the shards serve reads once a read is confirmed.
//!
//! Source: docs/journals.md §9.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raft::eraftpb::Message;

use super::durable::{self, group_of, DIRECTORY};
use super::peer::{encode_frame, encode_frame_removals};
use super::replica::{Applied, Durable, GroupStatus, Member, Refused, Replica, Verdict};
use crate::journal::apply::Outcome;
use crate::journal::command::{decode, Command, EntryId};
use crate::journal::held::{Held, Holdings, Loc};
use crate::journal::sequencer::{invalid, list, outcome, respond, unavailable, wire_view, Call, Published};
use crate::journal::store::{Commit, JournalStore, StoreError, JOURNALS_DIR};
use crate::journal::{Answer, JournalId, Mode, StoreDurability};
use crate::proto::{JournalOutcome, JournalResponse};

/// The file under `journals/` that names the cluster and node a command log belongs to, and
/// the incarnation of the data directory.
pub const IDENTITY_FILE: &str = "cluster";

/// The file under `journals/` that says below which position segment files may be missing,
/// given back because nothing in them was live (docs/journals.md §9.9): one line,
/// `reclaimed POSITION`, the position in decimal.
pub const RECLAIMED_FILE: &str = "reclaimed";

/// The newest sealed segments, whose pins are never moved ([`Node::relocate`]).
const YOUNG_SEGMENTS: usize = 2;

/// How often a node looks for segments to give back when none was sealed meanwhile.
const RECLAIM_EVERY: Duration = Duration::from_secs(10);

/// The exit code of a node that finds another incarnation of itself recorded in the
/// directory: its data directory was lost or replaced, and restarting it as this node would
/// break the promises (votes, acknowledged entries) the lost one made.
pub const EXIT_REPLACED: i32 = 3;

/// Most calls taken into one round.
const MAX_CALLS: usize = 4096;
/// How often the status (`cluster status`, `/metrics`) is refreshed.
const STATUS_EVERY: Duration = Duration::from_millis(50);
/// How often a deleted journal's name is asked to be freed, until it is.
const RELEASE_EVERY: Duration = Duration::from_millis(500);
/// Most peer frames taken into one round.
const MAX_FRAMES: usize = 1024;

pub use super::link::Inbound;

/// Where a node's outgoing frames go: the peer links (a frame is dropped when a link is down;
/// consensus sends again).
pub trait Outbox: Send {
    /// Queues one encoded frame for node `to`, without blocking.
    fn send(&self, to: u64, frame: Vec<u8>);

    /// Each peer: its node id, the address it is reached at, and whether its link is up.
    fn peers(&self) -> Vec<(u64, String, bool)> {
        Vec::new()
    }

    /// Whether the link to node `node` is up (asked on the path of a call, so without the
    /// allocation of [`Outbox::peers`]).
    fn is_up(&self, node: u64) -> bool {
        self.peers().iter().any(|(id, _, up)| *id == node && *up)
    }

    /// Tells the transport that the cluster knows node `node` by data directory incarnation
    /// `incarnation` (the directory's record), so that it refuses a handshake telling another.
    fn record_incarnation(&self, _node: u64, _incarnation: u64) {}
}

impl Outbox for super::link::Links {
    fn send(&self, to: u64, frame: Vec<u8>) {
        super::link::Links::send(self, to, frame);
    }

    fn peers(&self) -> Vec<(u64, String, bool)> {
        self.stats().into_iter().map(|s| (s.peer, s.addr, s.connected)).collect()
    }

    fn is_up(&self, node: u64) -> bool {
        self.connected(node)
    }

    fn record_incarnation(&self, node: u64, incarnation: u64) {
        super::link::Links::record_incarnation(self, node, incarnation);
    }
}

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// This node's id (non-zero).
    pub node: u64,
    /// The cluster's id (every frame carries it).
    pub cluster: u64,
    /// Every member, this node included.
    pub members: Vec<Member>,
    /// This node's zone, when set (shown by `cluster status`).
    pub zone: Option<String>,
    /// One consensus tick.
    pub tick: Duration,
    /// Proposals waiting for a verdict beyond which a new write is answered `BUSY`.
    pub admission: usize,
    /// How long a call waits on this node for a group to learn its leader, or for the
    /// journal's creation to arrive here, before it is answered `NOT_LEADER` or
    /// `UNKNOWN_JOURNAL`.
    pub settle: Duration,
    /// Entries a journal group applies between two snapshot candidates (0: its log is never
    /// compacted; docs/journals.md §9.9).
    pub snapshot_entries: u64,
}

/// What woke the loop.
enum Input {
    Call(Call),
    Frame(Inbound),
    /// Every sender of calls is gone: the server is stopping.
    Gone,
    /// The peer links are gone.
    Idle,
    /// The group commit in flight ran.
    Synced(Result<(), StoreError>),
}

/// Rounds whose durable items one group commit makes durable, and what waits for it.
#[derive(Default)]
struct Batch {
    /// Each group's readies, for [`Replica::persisted`].
    readies: Vec<(JournalId, u64)>,
    /// Messages that leave once the batch is durable.
    after: Vec<(JournalId, Message)>,
    /// Each entry and where it lies, for [`Replica::stored`].
    stored: Vec<(JournalId, u64, u64, Loc)>,
    /// Whether an entry of an `ordered` journal (or of the directory) is in it.
    ordered: bool,
    /// Whether it holds a promise that needs a sync (else at most higher commit indexes).
    sync: bool,
    /// Each hard state and snapshot and where it lies ([`HARD_STATE`] or [`SNAPSHOT`]).
    placed: Vec<(JournalId, u8, Loc)>,
}

/// The thread that runs group commits for the node loop, one at a time and in order.
struct Syncer {
    commits: flume::Sender<Commit>,
    done: flume::Receiver<Result<(), StoreError>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    fn start(node: u64) -> std::io::Result<Syncer> {
        let (commits, todo) = flume::unbounded::<Commit>();
        let (tell, done) = flume::unbounded();
        let thread = std::thread::Builder::new().name(format!("journal-sync-{node}")).spawn(move || {
            for c in todo.iter() {
                if tell.send(c.run()).is_err() {
                    return;
                }
            }
        })?;
        Ok(Syncer { commits, done, thread: Some(thread) })
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the commit in flight (if any) ran.
        let (closed, _) = flume::bounded(0);
        drop(std::mem::replace(&mut self.commits, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a verdict answers.
enum Token {
    /// A call's answer; `target` is the journal whose state a write's answer shows.
    Answer { reply: flume::Sender<JournalResponse>, target: JournalId },
    /// The first step of a create: the tenant; the journal follows.
    Tenant {
        tenant: String,
        journal: String,
        mode: Mode,
        durability: StoreDurability,
        journal_id: u64,
        survive: Option<u8>,
        reply: flume::Sender<JournalResponse>,
    },
    /// A confirmed read.
    Confirm(flume::Sender<JournalResponse>),
    /// A list, answered once the directory read is confirmed.
    List { tenant: String, reply: flume::Sender<JournalResponse> },
}

/// A call that waits on this node for its group's leader or its journal's creation.
struct Parked {
    group: JournalId,
    /// The encoded command, or `None` for a read.
    command: Option<Vec<u8>>,
    token: Token,
    until: Instant,
}

/// Where a persisted entry lies, and its records inside it.
struct EntryLoc {
    segment: u64,
    offset: u64,
    /// Each record's offset in the entry's payload and length.
    records: Vec<(u64, u32)>,
}

/// What `cluster status` and `/metrics` show of this node, refreshed every round.
#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    /// This node's id.
    pub node: u64,
    /// This node's zone, when set.
    pub zone: Option<String>,
    /// Each peer: its id, the address it is reached at, whether its link is up.
    pub peers: Vec<(u64, String, bool)>,
    /// Each member's zone as the directory records it.
    pub zones: std::collections::BTreeMap<u64, String>,
    /// Each group held here and how it stands.
    pub groups: Vec<(JournalId, GroupStatus)>,
    /// Times a group here saw its leader change.
    pub leader_changes: u64,
    /// Writes answered `BUSY` by admission.
    pub busy: u64,
    /// Reads answered `UNSERVED`.
    pub unserved: u64,
    /// Snapshots sent, installed, and group logs compacted, since the start.
    pub snapshots: crate::cluster::replica::SnapshotCounts,
}

/// One cluster node's journals: its replica, its command log and the state it publishes.
pub struct Node<O: Outbox> {
    settings: NodeSettings,
    replica: Replica<Token>,
    store: JournalStore,
    holdings: Holdings,
    published: Arc<Published>,
    outbox: O,
    locs: HashMap<(JournalId, u64), EntryLoc>,
    parked: Vec<Parked>,
    leaders: HashMap<JournalId, Option<u64>>,
    status: Arc<Mutex<NodeStatus>>,
    next_tick: Instant,
    /// When the status was last refreshed.
    status_tick: Instant,
    /// Deleted journals whose names this node asks the directory to free, with when it last
    /// asked.
    releasing: HashMap<JournalId, Instant>,
    /// This data directory's incarnation.
    incarnation: u64,
    /// Rounds staged in the command log and not yet handed to the syncer.
    open: Batch,
    /// Rounds whose group commit the syncer is running.
    flight: Option<Batch>,
    syncer: Syncer,
    /// When this node last asked the directory to record it.
    joined: Option<Instant>,
    /// Where each group's latest durable hard state and snapshot lie, by group and kind
    /// ([`HARD_STATE`], [`SNAPSHOT`]).
    placed: HashMap<(JournalId, u8), Loc>,
    /// Segment files below this position may be missing ([`RECLAIMED_FILE`]).
    reclaimed: u64,
    /// The sealed segments when segments were last looked at, and when.
    reclaim_seen: (usize, Instant),
}

/// Why a node's command log cannot be used by this node.
fn identity_error(path: &Path, why: String) -> StoreError {
    StoreError::Log(crate::log::LogError::Io { path: path.to_owned(), source: std::io::Error::other(why) })
}

/// Checks (or, on a first start, records) which cluster and node the command log under
/// `data_dir` belongs to, and returns the incarnation of this data directory (drawn at random
/// when it was made): a log of another cluster or node, or a single-node log, is refused.
///
/// # Errors
/// [`StoreError`] naming the identity file and what is wrong with it, or the I/O error.
pub fn check_identity(data_dir: &Path, cluster: u64, node: u64) -> Result<u64, StoreError> {
    let dir = data_dir.join(JOURNALS_DIR);
    let path = dir.join(IDENTITY_FILE);
    let head = format!("cluster {cluster:016x}\nnode {node}\n");
    match std::fs::read_to_string(&path) {
        Ok(found) => {
            let incarnation = found.strip_prefix(&head).and_then(|rest| rest.strip_prefix("incarnation ")).and_then(|h| u64::from_str_radix(h.trim(), 16).ok());
            incarnation.ok_or_else(|| {
                identity_error(
                    &path,
                    format!(
                        "this data directory belongs to {:?}, not to cluster {cluster:016x} node {node}: the [cluster] node_id or peers differ from the cluster it was made for",
                        found.trim().replace('\n', " ")
                    ),
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let held = std::fs::read_dir(&dir).map(|d| d.filter_map(Result::ok).count()).unwrap_or(0);
            if held > 0 {
                return Err(identity_error(&path, "this data directory holds a single-node journal log; a cluster node needs a fresh one".into()));
            }
            let incarnation = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
            std::fs::create_dir_all(&dir).map_err(|source| StoreError::Log(crate::log::LogError::Io { path: dir.clone(), source }))?;
            write_synced(&path, format!("{head}incarnation {incarnation:016x}\n").as_bytes())
                .map_err(|source| StoreError::Log(crate::log::LogError::Io { path: path.clone(), source }))?;
            Ok(incarnation)
        }
        Err(source) => Err(StoreError::Log(crate::log::LogError::Io { path, source })),
    }
}

/// Refuses to open the command log under `data_dir` as a single node when it belongs to a
/// cluster member (its entries are consensus items, not single-node commands).
///
/// # Errors
/// [`StoreError`] naming the cluster and node the log belongs to.
pub fn refuse_member_log(data_dir: &Path) -> Result<(), StoreError> {
    let path = data_dir.join(JOURNALS_DIR).join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(found) => Err(identity_error(
            &path,
            format!(
                "this data directory belongs to a cluster member ({}); start it with that node's [cluster] section",
                found.lines().take(2).collect::<Vec<_>>().join(", ")
            ),
        )),
        Err(_) => Ok(()),
    }
}

/// Writes a small file durably: a temporary file, synced, renamed, the directory synced.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp: PathBuf = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// The position below which segment files of the command log under `data_dir` may be
/// missing ([`RECLAIMED_FILE`]; 0 when there is none).
///
/// # Errors
/// [`StoreError`] naming the file when it cannot be read or does not say `reclaimed POSITION`.
fn read_reclaimed(data_dir: &Path) -> Result<u64, StoreError> {
    let path = data_dir.join(JOURNALS_DIR).join(RECLAIMED_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .strip_prefix("reclaimed ")
            .and_then(|rest| rest.trim_end_matches('\n').parse::<u64>().ok())
            .ok_or_else(|| identity_error(&path, format!("expected one line 'reclaimed POSITION', found {:?}", text.chars().take(64).collect::<String>()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(StoreError::Log(crate::log::LogError::Io { path, source })),
    }
}

/// Where each record of an entry's command lies inside the entry's payload.
fn record_spans(data: &[u8]) -> Vec<(u64, u32)> {
    match decode(data) {
        Ok((_, Command::Write { records, .. })) => records.iter().map(|r| ((r.as_ptr() as usize - data.as_ptr() as usize) as u64, r.len() as u32)).collect(),
        _ => Vec::new(),
    }
}

impl<O: Outbox> Node<O> {
    /// Opens the command log under `data_dir` as node `settings.node` of its cluster,
    /// restores every group from it, and publishes the state applied so far.
    ///
    /// # Errors
    /// [`StoreError`] when the log belongs to another cluster or node, or to a single node;
    /// the log's recovery errors; a durable item that does not decode or a group log that
    /// does not hold together.
    pub fn open(data_dir: &Path, segment_size: u64, settings: NodeSettings, outbox: O) -> Result<Node<O>, StoreError> {
        let incarnation = check_identity(data_dir, settings.cluster, settings.node)?;
        let reclaimed = read_reclaimed(data_dir)?;
        let mut items = Vec::new();
        let mut locs = HashMap::new();
        let mut stored = HashMap::new();
        let mut placed = HashMap::new();
        let (store, _) = JournalStore::open_gapped(data_dir, segment_size, 0, reclaimed, |r| {
            let mut item = durable::decode(r.payload).map_err(|e| identity_error(&data_dir.join(JOURNALS_DIR), format!("position {}: {e}", r.position)))?;
            let loc = Loc { segment: r.segment, offset: r.offset, len: r.payload.len() as u32 };
            match &mut item {
                Durable::Entry { journal, entry } => {
                    locs.insert((*journal, entry.index), EntryLoc { segment: r.segment, offset: r.offset, records: record_spans(r.payload) });
                    stored.insert((*journal, entry.index, entry.term), loc);
                    // Held as its location only: read back from the log when it is applied or sent.
                    entry.data = Vec::new();
                }
                Durable::HardState { journal, .. } => {
                    placed.insert((*journal, durable::HARD_STATE), loc);
                }
                Durable::Snapshot { journal, .. } => {
                    placed.insert((*journal, durable::SNAPSHOT), loc);
                }
            }
            items.push(item);
            Ok(())
        })?;
        let segments = store.segments();
        let reader: super::group_log::EntryReader = Arc::new(move |loc| segments.read(loc));
        let mut replica = Replica::member(settings.node, settings.members.clone(), items, stored, reader)
            .map_err(|e| identity_error(&data_dir.join(JOURNALS_DIR), format!("restoring the consensus groups: {e}")))?;
        replica.set_snapshot_entries(settings.snapshot_entries);
        let published = Arc::new(Published::new(store.segments()));
        let status = Arc::new(Mutex::new(NodeStatus { node: settings.node, zone: settings.zone.clone(), ..NodeStatus::default() }));
        let next_tick = Instant::now() + settings.tick;
        let syncer = Syncer::start(settings.node).map_err(|e| identity_error(&data_dir.join(JOURNALS_DIR), format!("starting the sync thread: {e}")))?;
        let mut node = Node {
            settings,
            replica,
            store,
            holdings: Holdings::default(),
            published,
            outbox,
            locs,
            parked: Vec::new(),
            leaders: HashMap::new(),
            status,
            next_tick,
            status_tick: Instant::now().checked_sub(STATUS_EVERY).unwrap_or_else(Instant::now),
            releasing: HashMap::new(),
            incarnation,
            open: Batch::default(),
            flight: None,
            syncer,
            joined: None,
            placed,
            reclaimed,
            reclaim_seen: (0, Instant::now()),
        };
        node.take_applied();
        Ok(node)
    }

    /// What readers see.
    pub fn published(&self) -> Arc<Published> {
        Arc::clone(&self.published)
    }

    /// This node's status, refreshed every round.
    pub fn status(&self) -> Arc<Mutex<NodeStatus>> {
        Arc::clone(&self.status)
    }

    /// Runs until every sender of `calls` is gone or the command log fails (fail-stop: the
    /// node then answers nothing more and its peers see it as down).
    pub fn run(mut self, calls: flume::Receiver<Call>, inbox: flume::Receiver<Inbound>) {
        loop {
            let wait = self.next_tick.saturating_duration_since(Instant::now());
            let mut gone = false;
            let done = self.syncer.done.clone();
            let mut selector = flume::Selector::new().recv(&calls, |r| r.map(Input::Call).unwrap_or(Input::Gone));
            if !inbox.is_disconnected() {
                selector = selector.recv(&inbox, |r| r.map(Input::Frame).unwrap_or(Input::Idle));
            }
            if self.flight.is_some() {
                selector = selector.recv(&done, |r| Input::Synced(r.unwrap_or_else(|_| Err(stopped("the sync thread ended")))));
            }
            match selector.wait_timeout(wait) {
                Ok(Input::Call(call)) => self.call(call),
                Ok(Input::Frame(frame)) => self.step(frame),
                Ok(Input::Synced(r)) => {
                    if !self.synced(r) {
                        return;
                    }
                }
                Ok(Input::Gone) => gone = true,
                Ok(Input::Idle) | Err(_) => {}
            }
            if self.flight.is_some() {
                if let Ok(r) = self.syncer.done.try_recv() {
                    if !self.synced(r) {
                        return;
                    }
                }
            }
            for _ in 0..MAX_CALLS {
                match calls.try_recv() {
                    Ok(call) => self.call(call),
                    Err(flume::TryRecvError::Empty) => break,
                    Err(flume::TryRecvError::Disconnected) => {
                        gone = true;
                        break;
                    }
                }
            }
            for frame in inbox.try_iter().take(MAX_FRAMES) {
                self.step(frame);
            }
            if Instant::now() >= self.next_tick {
                self.replica.tick();
                self.next_tick = Instant::now() + self.settings.tick;
                self.retry_parked();
                self.release_names();
                self.check_member();
            }
            while self.replica.has_ready() {
                if !self.round() {
                    return;
                }
            }
            if !self.flush() || !self.reclaim() {
                return;
            }
            self.refresh_status();
            if gone {
                // What is in flight finishes; what is staged is given up, as by a crash.
                if self.flight.is_some() {
                    let r = self.syncer.done.recv().unwrap_or_else(|_| Err(stopped("the sync thread ended")));
                    self.synced(r);
                }
                return;
            }
        }
    }

    /// Steps a peer's messages into their groups, after its word on groups that no longer
    /// count this node among their voters. A message for a group not started here yet (its
    /// creation is still on its way) is dropped: consensus sends again.
    fn step(&mut self, frame: Inbound) {
        if let Some(why) = &frame.refused {
            self.replaced(&format!("node {} refused this node's link: {why}", frame.from));
        }
        for (group, term) in frame.removed {
            self.replica.removed(group, frame.from, term);
        }
        for (group, m) in frame.messages {
            if let Err(e @ super::replica::ReplicaError::LostEntries { .. }) = self.replica.step(group, m) {
                self.replaced(&format!("{e}"));
            }
        }
    }

    /// Stops the process with [`EXIT_REPLACED`]: this node's data was lost or replaced, and
    /// going on as this node would break what the lost data had promised.
    fn replaced(&self, why: &str) -> ! {
        let why = format!(
            "node {}: {why}. The cluster knows this node id by another data directory (this one was wiped or replaced, or another process runs with the id): do not restart this node with this id; add a new node in its place instead",
            self.settings.node
        );
        tracing::error!("{why}");
        eprintln!("tephra-server: {why}");
        std::process::exit(EXIT_REPLACED);
    }

    /// One round (docs/journals.md §9.1): sends what may leave, answers what was applied
    /// (decided by a quorum and durable here), and stages what must become durable into the
    /// open batch; false when the command log failed.
    fn round(&mut self) -> bool {
        let round = self.replica.ready();
        self.send(round.send);
        self.send_removals();
        self.take_applied();
        for (token, verdict) in round.verdicts {
            self.verdict(token, verdict);
        }
        if let Err(why) = self.stage(&round.persist) {
            return self.fail(&why);
        }
        self.open.sync |= round.must_sync;
        self.open.readies.extend(round.readies);
        self.open.after.extend(round.send_after_sync);
        true
    }

    /// Stops this node's journals after the command log failed: it leaves its groups until it
    /// restarts (fail-stop). Returns false.
    fn fail(&mut self, why: &str) -> bool {
        tracing::error!(error = %why, "journal log stopped: this node leaves its groups until it restarts");
        self.published.stop(why.to_owned());
        false
    }

    /// Hands the open batch to the syncer when no group commit is in flight. A batch with
    /// no promise in it (at most higher commit indexes) is done at once, unsynced: nothing
    /// that leaves depends on it, and it becomes durable with the next sync (a node that
    /// forgets it learns it again from its leader). This spares a sync per decided batch on
    /// every node. False when the command log failed.
    fn flush(&mut self) -> bool {
        if self.flight.is_some() || self.open.readies.is_empty() {
            return true;
        }
        let batch = std::mem::take(&mut self.open);
        if !batch.sync {
            self.done(batch);
            return true;
        }
        let staged = self.store.staged();
        match self.store.begin_commit(batch.ordered) {
            Ok(Some(commit)) => {
                if let Ok(mut h) = self.published.commit_commands.lock() {
                    let _ = h.record(staged);
                }
                if self.syncer.commits.send(commit).is_err() {
                    return self.fail("the sync thread ended");
                }
                self.flight = Some(batch);
            }
            Ok(None) => self.done(batch),
            Err(e) => return self.fail(&e.to_string()),
        }
        true
    }

    /// Gives disk back (docs/journals.md §9.9), whenever a segment was sealed since it last
    /// looked, or every [`RECLAIM_EVERY`]: a sealed segment is live while it holds an entry a
    /// group still needs, a group's latest hard state or snapshot, or a record a journal
    /// holds; every other sealed segment is deleted. Old live segments are freed first when
    /// what pins them can move cheaply ([`Node::relocate`]: hard states, snapshots, the
    /// directory's entries from there on in index order). It runs with nothing in flight, so
    /// every item it judges by is durable. False when the command log failed.
    fn reclaim(&mut self) -> bool {
        // Asked on every turn of the node loop: only a count and a clock until it is due.
        let count = self.published.segments.len();
        let (seen, at) = self.reclaim_seen;
        if count <= 1 || (count == seen && at.elapsed() < RECLAIM_EVERY) {
            return true;
        }
        // Everything staged becomes durable and done first.
        if !self.settle_flight() || !self.flush() || !self.settle_flight() {
            return false;
        }
        if self.store.staged() > 0 {
            if let Err(e) = self.store.commit(true) {
                return self.fail(&e.to_string());
            }
        }
        if !self.relocate(&self.store.sealed()) {
            return false;
        }
        let live = self.live_segments();
        let dead: Vec<u64> = self.store.sealed().into_iter().filter(|b| !live.contains(b)).collect();
        self.reclaim_seen = (self.published.segments.len() - dead.len(), Instant::now());
        if dead.is_empty() {
            return true;
        }
        // Segment files below the bound may be missing at the next start: the bound is durable
        // before any goes.
        let bases = self.published.segments.bases();
        let top = dead.iter().max().copied().unwrap_or(0);
        let next = bases.iter().copied().find(|&b| b > top).unwrap_or(self.store.last_position() + 1);
        let bound = self.reclaimed.max(next - 1);
        if bound > self.reclaimed {
            let path = self.store.dir().join(RECLAIMED_FILE);
            if let Err(e) = write_synced(&path, format!("reclaimed {bound}\n").as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "journal log: could not record the segments to give back; none deleted");
                return true;
            }
            self.reclaimed = bound;
        }
        let before = self.published.segments.len();
        let result = self.store.delete_segments(&dead);
        let deleted = before.saturating_sub(self.published.segments.len());
        self.published.disk.segments_deleted.fetch_add(deleted as u64, std::sync::atomic::Ordering::Relaxed);
        match result {
            Ok(()) => tracing::info!(deleted, "journal log: segments given back"),
            Err(e) => tracing::warn!(error = %e, "journal log: deleting a segment failed"),
        }
        true
    }

    /// The sealed or active segments holding an item still needed (see [`Node::reclaim`]).
    fn live_segments(&self) -> BTreeSet<u64> {
        let mut live = BTreeSet::new();
        self.replica.live_segments(&mut live);
        live.extend(self.holdings.live_segments());
        live.extend(self.placed.values().map(|l| l.segment));
        live
    }

    /// Writes what pins live sealed segments again at the log's head, oldest first and all
    /// but the [`YOUNG_SEGMENTS`] newest, for each where that is cheap (see [`Node::reclaim`]),
    /// up to about a quarter of a segment's bytes in all, and makes it durable; false when the
    /// command log failed.
    fn relocate(&mut self, sealed: &[u64]) -> bool {
        let mut moved = 0;
        // The newest sealed segments are left alone: what pins them is mostly still changing
        // (and what a pass moves lands there), so moving it would only move it again.
        let old = sealed.len().saturating_sub(YOUNG_SEGMENTS);
        for &segment in &sealed[..old] {
            if moved >= self.store.segment_size() / 4 {
                break;
            }
            match self.relocate_one(segment) {
                Some(bytes) => moved += bytes,
                None => return false,
            }
        }
        true
    }

    /// [`Node::relocate`] for one segment: the bytes written again (0: nothing pins it, or what
    /// does cannot move, such as a journal group's entries, or costs more than a quarter of a
    /// segment); `None` when the command log failed.
    fn relocate_one(&mut self, segment: u64) -> Option<u64> {
        if self.holdings.is_live(segment) {
            return Some(0);
        }
        // A journal group's entries wait for its compaction: written again, those whose
        // records the journal holds would stay where the holdings point too, twice.
        let Some(directory) = self.replica.directory_entries_in(segment) else { return Some(0) };
        let pinned: Vec<(JournalId, u8)> = self.placed.iter().filter(|(_, l)| l.segment == segment).map(|(k, _)| *k).collect();
        let mut cost = directory.map_or(0, |(_, bytes)| bytes);
        cost += pinned.iter().filter_map(|k| self.placed.get(k)).map(|l| u64::from(l.len)).sum::<u64>();
        if cost > self.store.segment_size() / 4 {
            return Some(0);
        }
        let mut items = Vec::new();
        let mut groups: BTreeSet<JournalId> = pinned.iter().map(|(j, _)| *j).collect();
        if directory.is_some() {
            groups.insert(DIRECTORY);
        }
        for journal in groups {
            // Everything that pins the segment moves, or nothing does (else the same items
            // would be written again at every pass).
            let Some((hs, snapshot)) = self.replica.durable_state(journal) else { return Some(0) };
            let moves = |kind| pinned.contains(&(journal, kind));
            if moves(durable::SNAPSHOT) {
                if snapshot.get_metadata().index == 0 {
                    return Some(0);
                }
                items.push(Durable::Snapshot { journal, snapshot });
            }
            if let Some((from, _)) = directory.filter(|_| journal == DIRECTORY) {
                match self.replica.entries_from(journal, from) {
                    Ok(es) => items.extend(es.into_iter().map(|entry| Durable::Entry { journal, entry })),
                    Err(e) => {
                        tracing::warn!(%journal, error = %e, "journal log: a group's entries could not be read back; segment {segment} stays");
                        return Some(0);
                    }
                }
            }
            if moves(durable::HARD_STATE) {
                items.push(Durable::HardState { journal, state: hs });
            }
        }
        if items.is_empty() {
            return Some(0);
        }
        if let Err(why) = self.stage(&items) {
            self.fail(&why);
            return None;
        }
        if let Err(e) = self.store.commit(true) {
            self.fail(&e.to_string());
            return None;
        }
        let batch = std::mem::take(&mut self.open);
        self.done(batch);
        self.published.disk.relocated.fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(segment, items = items.len(), bytes = cost, "journal log: moved what pinned a segment to the head");
        Some(cost.max(1))
    }

    /// Takes the result of the group commit in flight; false when it failed.
    fn synced(&mut self, result: Result<(), StoreError>) -> bool {
        self.store.end_commit(&result);
        if let Err(e) = result {
            self.flight = None;
            return self.fail(&e.to_string());
        }
        if let Some(batch) = self.flight.take() {
            self.done(batch);
        }
        true
    }

    /// A batch is durable: each group keeps only where its entries lie, raft learns it, and
    /// the messages that promise it leave.
    fn done(&mut self, batch: Batch) {
        for (journal, index, term, loc) in batch.stored {
            self.replica.stored(journal, index, term, loc);
        }
        for (journal, kind, loc) in batch.placed {
            self.placed.insert((journal, kind), loc);
        }
        self.replica.persisted(&batch.readies);
        self.send(batch.after);
    }

    /// Waits for the group commit in flight, if any; false when it failed.
    fn settle_flight(&mut self) -> bool {
        if self.flight.is_none() {
            return true;
        }
        let r = self.syncer.done.recv().unwrap_or_else(|_| Err(stopped("the sync thread ended")));
        self.synced(r)
    }

    /// Stages a round's durable items in order in the open batch of the command log, and
    /// remembers where each entry lies, for its records once it is applied. A segment that is
    /// full is committed (after the commit in flight) and left for a new one.
    fn stage(&mut self, items: &[Durable]) -> Result<(), String> {
        let mut payload = Vec::new();
        for item in items {
            payload.clear();
            durable::encode(item, &mut payload).map_err(|e| format!("a durable item did not encode: {e}"))?;
            if !self.store.fits(payload.len()) {
                self.store.check_len(payload.len()).map_err(|e| e.to_string())?;
                if !self.settle_flight() {
                    return Err(self.published.stopped().unwrap_or_else(|| "the command log stopped".into()));
                }
                self.store.commit(true).map_err(|e| e.to_string())?;
                self.store.roll_over().map_err(|e| e.to_string())?;
            }
            let (_, offset) = self.store.stage(&payload);
            let placed = match item {
                Durable::HardState { journal, .. } => Some((*journal, durable::HARD_STATE)),
                Durable::Snapshot { journal, .. } => Some((*journal, durable::SNAPSHOT)),
                Durable::Entry { .. } => None,
            };
            if let Some((journal, kind)) = placed {
                self.open.placed.push((journal, kind, Loc { segment: self.store.active_base(), offset, len: payload.len() as u32 }));
            }
            if let Durable::Entry { journal, entry } = item {
                let segment = self.store.active_base();
                let loc = EntryLoc { segment, offset, records: record_spans(&payload) };
                self.locs.insert((*journal, entry.index), loc);
                self.open.stored.push((*journal, entry.index, entry.term, Loc { segment, offset, len: payload.len() as u32 }));
                let batched = self.replica.directory().journal(*journal).is_some_and(|e| e.state.durability == StoreDurability::Batched);
                self.open.ordered |= !batched;
            }
        }
        Ok(())
    }

    /// Sends each message, one frame per peer.
    fn send(&mut self, messages: Vec<(JournalId, Message)>) {
        if messages.is_empty() {
            return;
        }
        let mut by_peer: std::collections::BTreeMap<u64, Vec<(JournalId, Message)>> = std::collections::BTreeMap::new();
        for (group, m) in messages {
            by_peer.entry(m.to).or_default().push((group, m));
        }
        for (to, ms) in by_peer {
            let frame = encode_frame(self.settings.cluster, self.settings.node, to, &ms);
            self.outbox.send(to, frame);
        }
    }

    /// Tells each node the replica found out of a group it leads that it is no longer a voter
    /// there (docs/journals.md §9.8): one frame per node, with no messages.
    fn send_removals(&mut self) {
        let mut by_peer: std::collections::BTreeMap<u64, Vec<(JournalId, u64)>> = std::collections::BTreeMap::new();
        for (to, group, term) in self.replica.take_removals() {
            by_peer.entry(to).or_default().push((group, term));
        }
        for (to, removed) in by_peer {
            let frame = encode_frame_removals(self.settings.cluster, self.settings.node, to, &[], &removed);
            self.outbox.send(to, frame);
        }
    }

    /// Brings the held records and the published state up to the entries applied.
    fn take_applied(&mut self) {
        let mut changed = BTreeSet::new();
        // A snapshot's journal state: every record below its next_seq goes (those missing here
        // were truncated before it was taken), as do the places of entries it replaced that
        // will never be applied.
        for (group, index, next_seq) in self.replica.take_installed() {
            self.holdings.trim(group, next_seq);
            self.locs.retain(|(j, i), _| *j != group || *i > index);
            changed.insert(group);
        }
        for Applied { group, index, answer } in self.replica.take_applied() {
            let loc = self.locs.remove(&(group, index));
            match answer {
                Some(Answer::Journal(Outcome::Accepted { seq, .. })) => {
                    if let Some(l) = loc {
                        for (i, (at, len)) in l.records.iter().enumerate() {
                            self.holdings.push(group, seq + i as u64, Loc { segment: l.segment, offset: l.offset + at, len: *len });
                        }
                    }
                    changed.insert(group);
                }
                Some(Answer::Journal(Outcome::Trimmed(view))) => {
                    self.holdings.trim(group, view.first_seq);
                    changed.insert(group);
                }
                Some(Answer::Journal(Outcome::Leader(_))) => {
                    changed.insert(group);
                }
                Some(Answer::JournalCreated { journal }) => {
                    changed.insert(journal);
                }
                Some(Answer::Deleted { .. }) if group != DIRECTORY => {
                    self.holdings.remove(group);
                    self.published.remove(group);
                    changed.remove(&group);
                    self.releasing.insert(group, Instant::now().checked_sub(RELEASE_EVERY).unwrap_or_else(Instant::now));
                }
                _ => {}
            }
        }
        for id in changed {
            if let Some(e) = self.replica.directory().journal(id) {
                self.published.show(id, e.state.view(), self.holdings.get(id).unwrap_or(&Held::default()));
            }
        }
    }

    /// Takes one call from a shard.
    fn call(&mut self, call: Call) {
        if let Some(why) = self.published.stopped() {
            let _ = call.reply().send(unavailable(&why));
            return;
        }
        match call {
            Call::Command { payload, reply } => {
                let Ok((_, cmd)) = decode(&payload) else {
                    let _ = reply.send(invalid("the journal command did not decode"));
                    return;
                };
                let write = matches!(cmd, Command::Write { .. });
                let (group, target) = (group_of(&cmd), cmd.target());
                if write && self.replica.pending() >= self.settings.admission {
                    self.status.lock().unwrap().busy += 1;
                    let _ = reply.send(JournalResponse {
                        outcome: JournalOutcome::Busy as i32,
                        message: format!("more than {} journal calls are waiting for consensus; retry the same write shortly", self.settings.admission),
                        ..Default::default()
                    });
                    return;
                }
                self.propose(group, payload, Token::Answer { reply, target });
            }
            Call::Create { tenant, journal, mode, durability, tenant_id, journal_id, survive, reply } => {
                // Without an F of its own the journal takes its tenant's default, if one is set.
                let survive = survive.or_else(|| self.replica.directory().tenant_named(&tenant).and_then(|(_, t)| t.survive));
                // Refused before anything changes, the tenant included.
                if let Err(resp) = self.place(JournalId { tenant: 0, journal: journal_id }, survive) {
                    let _ = reply.send(*resp);
                    return;
                }
                match self.replica.directory().tenant_named(&tenant) {
                    Some((tid, _)) => self.create_journal(tid, &journal, mode, durability, journal_id, survive, reply),
                    None => {
                        let cmd = Command::CreateTenant { tenant: tenant_id, name: &tenant };
                        let payload = encode(&cmd);
                        self.propose(DIRECTORY, payload, Token::Tenant { tenant, journal, mode, durability, journal_id, survive, reply });
                    }
                }
            }
            Call::List { tenant, reply } => self.read(DIRECTORY, Token::List { tenant, reply }),
            Call::Configure { journal, survive, reply } => match self.place(journal, Some(survive)) {
                Ok((survive, voters)) => {
                    self.propose(DIRECTORY, encode(&Command::Configure { journal, survive, voters }), Token::Answer { reply, target: journal })
                }
                Err(resp) => {
                    let _ = reply.send(*resp);
                }
            },
            Call::ConfigureTenant { tenant, tenant_id, survive, reply } => match self.place(JournalId { tenant: 0, journal: tenant_id }, Some(survive)) {
                Ok(_) => self.propose(
                    DIRECTORY,
                    encode(&Command::ConfigureTenant { tenant: tenant_id, name: &tenant, survive }),
                    Token::Answer { reply, target: JournalId { tenant: tenant_id, journal: 0 } },
                ),
                Err(resp) => {
                    let _ = reply.send(*resp);
                }
            },
            Call::Confirm { journal, reply } => self.read(journal, Token::Confirm(reply)),
        }
    }

    /// Where journal `journal`'s group goes: F (of `--survive machines=F`, default 1) and
    /// 2F+1 voters placed over the members, across their zones as the directory records them
    /// (docs/journals.md §9.5). Without an F asked for, a cluster of fewer than three members
    /// places every member.
    ///
    /// # Errors
    /// `UNPLACEABLE` when an F was asked for and the cluster has fewer than 2F+1 members.
    fn place(&self, journal: JournalId, survive: Option<u8>) -> Result<(u8, Vec<u64>), Box<JournalResponse>> {
        let members: Vec<Member> = self
            .settings
            .members
            .iter()
            .map(|m| Member { node: m.node, zone: self.replica.directory().zone(m.node).map(str::to_owned).or_else(|| m.zone.clone()) })
            .collect();
        let f = survive.unwrap_or(1);
        let need = 2 * usize::from(f) + 1;
        if survive.is_some() && need > members.len() {
            return Err(Box::new(crate::journal::sequencer::unplaceable(f, members.len())));
        }
        let count = need.min(members.len());
        Ok(((count.saturating_sub(1) / 2) as u8, super::placement::place(journal, &members, count)))
    }

    #[allow(clippy::too_many_arguments)]
    fn create_journal(
        &mut self,
        tenant: u64,
        name: &str,
        mode: Mode,
        durability: StoreDurability,
        journal_id: u64,
        survive: Option<u8>,
        reply: flume::Sender<JournalResponse>,
    ) {
        let id = JournalId { tenant, journal: journal_id };
        let (survive, voters) = match self.place(id, survive) {
            Ok(p) => p,
            Err(resp) => {
                let _ = reply.send(*resp);
                return;
            }
        };
        let payload = encode(&Command::CreatePlaced { journal: id, name, mode, durability, survive, voters });
        self.propose(DIRECTORY, payload, Token::Answer { reply, target: id });
    }

    fn propose(&mut self, group: JournalId, command: Vec<u8>, token: Token) {
        match self.replica.propose(group, command.clone(), token) {
            Ok(()) => {}
            Err((token, refused)) => self.refused(group, Some(command), token, refused),
        }
    }

    fn read(&mut self, group: JournalId, token: Token) {
        // A read sent to a leader this node cannot reach would wait for nothing: it waits here
        // for the election instead.
        if let Some(l) = self.replica.leader(group) {
            if !self.reachable(l) {
                self.parked.push(Parked { group, command: None, token, until: Instant::now() + self.settings.settle });
                return;
            }
        }
        if let Err((token, refused)) = self.replica.read(group, token) {
            self.refused(group, None, token, refused);
        }
    }

    /// A call refused before consensus: parked while the group has no leader yet or the
    /// journal is not known here yet, else answered.
    fn refused(&mut self, group: JournalId, command: Option<Vec<u8>>, token: Token, refused: Refused) {
        let known = group == DIRECTORY || self.replica.directory().journal(group).is_some();
        // A leader this node cannot reach is likely gone: wait for the election rather than
        // send the caller to it.
        let unreachable = match refused {
            Refused::NotLeader { leader: Some(l) } => !self.reachable(l),
            _ => false,
        };
        let wait = unreachable || matches!(refused, Refused::NotLeader { leader: None }) || (refused == Refused::UnknownGroup && !known);
        if wait {
            self.parked.push(Parked { group, command, token, until: Instant::now() + self.settings.settle });
            return;
        }
        let resp = match refused {
            Refused::NotLeader { leader } => not_leader(leader, command.is_none()),
            // No copy here: a voter the directory records is the node to ask.
            Refused::UnknownGroup => JournalResponse {
                outcome: if command.is_none() { JournalOutcome::Unserved } else { JournalOutcome::NotLeader } as i32,
                message: "this node holds no copy of the journal; ask another".into(),
                leader_node: self.replica.voters(group).first().copied().unwrap_or(0),
                ..Default::default()
            },
        };
        self.answer(token, resp);
    }

    /// Tries the parked calls again; those past their wait are answered.
    fn retry_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let now = Instant::now();
        for p in std::mem::take(&mut self.parked) {
            let known = p.group == DIRECTORY || self.replica.directory().journal(p.group).is_some();
            let leader = self.replica.leader(p.group);
            let ready = leader.is_some_and(|l| self.reachable(l)) || (now >= p.until);
            if !ready {
                self.parked.push(p);
                continue;
            }
            if leader.is_none() {
                let resp = if !known { outcome(JournalOutcome::UnknownJournal) } else { not_leader(None, p.command.is_none()) };
                self.answer(p.token, resp);
                continue;
            }
            match p.command {
                Some(c) => match self.replica.propose(p.group, c, p.token) {
                    Ok(()) => {}
                    Err((token, Refused::NotLeader { leader })) => self.answer(token, not_leader(leader, false)),
                    Err((token, Refused::UnknownGroup)) => self.answer(token, not_leader(None, false)),
                },
                None => {
                    if let Err((token, _)) = self.replica.read(p.group, p.token) {
                        self.answer(token, not_leader(None, true));
                    }
                }
            }
        }
    }

    /// Whether node `node` is this one or a peer whose link is up.
    fn reachable(&self, node: u64) -> bool {
        node == self.settings.node || self.outbox.is_up(node)
    }

    /// Answers a call that got no verdict, whatever its token.
    fn answer(&mut self, token: Token, resp: JournalResponse) {
        if resp.outcome == JournalOutcome::Unserved as i32 {
            self.status.lock().unwrap().unserved += 1;
        }
        let reply = match token {
            Token::Answer { reply, .. } | Token::Tenant { reply, .. } | Token::Confirm(reply) | Token::List { reply, .. } => reply,
        };
        let _ = reply.send(resp);
    }

    /// Carries out a verdict.
    fn verdict(&mut self, token: Token, verdict: Verdict) {
        match (token, verdict) {
            (Token::Answer { reply, target }, Verdict::Applied(answer)) => {
                let mut resp = respond(&answer);
                if resp.state.is_none() && matches!(answer, Answer::Journal(_)) {
                    resp.state = self.replica.directory().journal(target).map(|e| wire_view(e.state.view()));
                }
                let _ = reply.send(resp);
            }
            (Token::Tenant { tenant, journal, mode, durability, journal_id, survive, reply }, Verdict::Applied(answer)) => {
                match self.replica.directory().tenant_named(&tenant) {
                    Some((tid, _)) => self.create_journal(tid, &journal, mode, durability, journal_id, survive, reply),
                    None => {
                        let _ = reply.send(respond(&answer));
                    }
                }
            }
            (Token::Confirm(reply), Verdict::ReadReady) => {
                let _ = reply.send(outcome(JournalOutcome::Page));
            }
            (Token::List { tenant, reply }, Verdict::ReadReady) => {
                let mut resp = list(self.replica.directory(), &tenant);
                // The directory is confirmed; a journal's state is only where its group is.
                let held: BTreeSet<JournalId> = self.replica.groups().collect();
                for j in &mut resp.journals {
                    j.elsewhere = !held.contains(&JournalId { tenant: j.tenant, journal: j.journal });
                }
                let _ = reply.send(resp);
            }
            (token, Verdict::Undecodable) => self.answer(token, invalid("the journal command did not decode")),
            (token @ (Token::Confirm(_) | Token::List { .. }), _) => self.answer(token, not_leader(None, true)),
            (token, _) => self.answer(
                token,
                JournalResponse {
                    outcome: JournalOutcome::Ambiguous as i32,
                    message: "no verdict: the journal's leader changed while the call was in consensus; it may or may not take effect".into(),
                    ..Default::default()
                },
            ),
        }
    }

    /// The second step of each deletion this node applied: the directory group frees the
    /// journal's name. Asked again every [`RELEASE_EVERY`] until the directory here shows the
    /// name free (a repeat is harmless), so a leader change or a restart cannot leave a
    /// name taken by a deleted journal.
    fn release_names(&mut self) {
        if self.releasing.is_empty() {
            return;
        }
        let named: BTreeSet<JournalId> =
            self.replica.directory().tenants().flat_map(|(t, ten)| ten.journals.values().map(move |&j| JournalId { tenant: t, journal: j })).collect();
        self.releasing.retain(|id, _| named.contains(id));
        let now = Instant::now();
        for (id, last) in self.releasing.iter_mut() {
            if now.duration_since(*last) >= RELEASE_EVERY && self.replica.forward(DIRECTORY, encode(&Command::ReleaseName { journal: *id })) {
                *last = now;
            }
        }
    }

    /// Makes sure the directory records this node with this data directory's incarnation
    /// (asked every [`RELEASE_EVERY`] until it does), and stops the process with
    /// [`EXIT_REPLACED`] when it records another one: this node's data was lost or replaced.
    fn check_member(&mut self) {
        let zone = self.settings.zone.as_deref();
        match self.replica.directory().member(self.settings.node) {
            // Recorded; its zone too, when it has one (a zone changed in the configuration is
            // recorded again).
            Some(i) if i == self.incarnation && (zone.is_none() || self.replica.directory().zone(self.settings.node) == zone) => {}
            Some(i) if i == self.incarnation => self.join(),
            Some(i) => {
                self.replaced(&format!("the cluster knows this node by a data directory of incarnation {i:016x}, and this one is {:016x}", self.incarnation))
            }
            None => self.join(),
        }
    }

    /// Asks the directory to record this node, its incarnation and its zone (at most every
    /// [`RELEASE_EVERY`]).
    fn join(&mut self) {
        if self.joined.is_some_and(|t| t.elapsed() < RELEASE_EVERY) {
            return;
        }
        let (node, incarnation) = (self.settings.node, self.incarnation);
        let join = match self.settings.zone.as_deref() {
            Some(zone) => encode(&Command::JoinZone { node, incarnation, zone }),
            None => encode(&Command::Join { node, incarnation }),
        };
        if self.replica.forward(DIRECTORY, join) {
            self.joined = Some(Instant::now());
        }
    }

    /// Refreshes what `cluster status` and `/metrics` read.
    fn refresh_status(&mut self) {
        if self.status_tick.elapsed() < STATUS_EVERY {
            return;
        }
        self.status_tick = Instant::now();
        for (node, incarnation) in self.replica.directory().members() {
            self.outbox.record_incarnation(node, incarnation);
        }
        let groups: Vec<(JournalId, GroupStatus)> = self.replica.groups().filter_map(|g| self.replica.status(g).map(|s| (g, s))).collect();
        let mut changes = 0;
        for (g, s) in &groups {
            let before = self.leaders.insert(*g, s.leader);
            if before.is_some_and(|b| b != s.leader) && s.leader.is_some() {
                changes += 1;
            }
        }
        let peers = self.outbox.peers();
        let zones = self.settings.members.iter().filter_map(|m| Some((m.node, self.replica.directory().zone(m.node)?.to_owned()))).collect();
        let mut st = self.status.lock().unwrap();
        st.zones = zones;
        st.groups = groups;
        st.peers = peers;
        st.leader_changes += changes;
        st.snapshots = self.replica.snapshot_counts();
    }
}

/// The error of a command log whose syncer is gone.
fn stopped(why: &str) -> StoreError {
    StoreError::Stopped { what: "fdatasync", path: PathBuf::from(JOURNALS_DIR), source: std::io::Error::other(why.to_owned()) }
}

/// A command encoded by the node itself.
fn encode(cmd: &Command<'_>) -> Vec<u8> {
    let mut payload = Vec::with_capacity(cmd.encoded_len());
    cmd.encode(EntryId::default(), &mut payload);
    payload
}

/// `NOT_LEADER` naming the leader when known (for a read: `UNSERVED`).
fn not_leader(leader: Option<u64>, read: bool) -> JournalResponse {
    let message = match leader {
        Some(l) => format!("node {l} leads this journal's group; ask it"),
        None => "no leader of this journal's group is known here yet; ask another node".to_owned(),
    };
    let o = if read { JournalOutcome::Unserved } else { JournalOutcome::NotLeader };
    JournalResponse { outcome: o as i32, message, leader_node: leader.unwrap_or(0), ..Default::default() }
}
