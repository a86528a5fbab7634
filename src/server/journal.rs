//! Journal calls on a connection's shard: validation and limits (before anything is logged),
//! the hand-off to the sequencer, and reads from the published durable state, waiting at the
//! tail when asked.
//!
//! Source: docs/journals.md §6-§7.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::JournalSettings;
use crate::journal::command::{self, Command, EntryId};
use crate::journal::model::{JournalId, LeaderUuid, Mode, StoreDurability};
use crate::journal::sequencer::{invalid, outcome, unavailable, wire_view, Call, Published, Sequencer};
use crate::journal::store::{JournalStore, StoreError};
use crate::journal::valid_name;
use crate::proto::{journal_request, JournalCreate, JournalDurability, JournalMode, JournalOutcome, JournalRead, JournalRequest, JournalResponse};

/// What `/metrics` shows of the journal calls (docs/journals.md §6).
pub struct JournalMetrics {
    /// Calls answered, by call kind ([`CALL_KINDS`]) and outcome (the wire number, 0..=24).
    pub calls: [[AtomicU64; OUTCOMES]; CALL_KINDS.len()],
    /// Reads waiting at a tail right now.
    pub waiting_reads: AtomicU64,
    /// Write latency, request to answer, in µs.
    pub write_latency: Mutex<hdrhistogram::Histogram<u64>>,
}

/// The call kinds as `/metrics` labels them, in the order of [`JournalMetrics::calls`].
pub const CALL_KINDS: [&str; 9] = ["write", "read", "truncate", "set_leader", "create", "delete", "list", "status", "configure"];
/// Outcome numbers counted (`JOURNAL_OUTCOME` 0..=26).
const OUTCOMES: usize = 27;
/// The largest F of `--survive machines=F` a create may ask for (2F+1 voters fit one byte).
pub const MAX_SURVIVE: u8 = 127;

/// The node's journals as a shard sees them: the way to the sequencer, the published durable
/// state, and the limits.
pub struct Journals {
    /// Counters for `/metrics`.
    pub metrics: JournalMetrics,
    calls: flume::Sender<Call>,
    published: Arc<Published>,
    limits: JournalSettings,
    /// The most record bytes a page may carry so that its frame fits `server.max_frame_len`.
    page_bytes: u64,
    /// Set when this server is a cluster member.
    cluster: Option<Cluster>,
}

/// A cluster member's side of the shards' journal calls.
struct Cluster {
    /// This node's id.
    node: u64,
    status: Arc<Mutex<crate::cluster::node::NodeStatus>>,
    /// How long a read waits for its confirmation before it is answered `UNSERVED`.
    confirm: Duration,
}

impl Cluster {
    /// The node's answer to a call confirmed by a quorum (a read's go-ahead, a list), or
    /// `UNSERVED` when none comes within `confirm` (the client asks another node).
    async fn confirmed(&self, rx: &flume::Receiver<JournalResponse>, what: &str) -> JournalResponse {
        let answer = futures_lite::future::or(async { rx.recv_async().await.ok() }, async {
            shards::sleep(self.confirm).await;
            None
        })
        .await;
        answer.unwrap_or_else(|| JournalResponse {
            outcome: JournalOutcome::Unserved as i32,
            message: format!("this node could not confirm the {what} with a quorum within {} ms; ask another", self.confirm.as_millis()),
            ..Default::default()
        })
    }
}

/// The limits with `max_batch_bytes` lowered, if needed, so that the largest write the limits
/// let through fits one segment of the command log (else it would pass the limits and be
/// refused for good), as the event log's writer does with its batch limit.
fn fit_limits(mut limits: JournalSettings) -> JournalSettings {
    let holds = JournalStore::max_command_len(limits.segment_size) as u64;
    let overhead = (command::COMMAND_HEAD + 28) as u64 + 4 * limits.max_batch_records;
    let fits = holds.saturating_sub(overhead).max(1);
    if limits.max_batch_bytes > fits {
        tracing::warn!(
            max_batch_bytes = limits.max_batch_bytes,
            segment_size = limits.segment_size,
            lowered_to = fits,
            "journal.max_batch_bytes does not fit a journal segment with journal.max_batch_records records; lowered"
        );
        limits.max_batch_bytes = fits;
    }
    limits
}

/// Bytes a page's frame may need beyond its records' bytes: the response's head and state,
/// and per record its field tag and length.
const PAGE_OVERHEAD: u64 = 256;
/// Per record, its field tag and length varint.
const PER_RECORD_OVERHEAD: u64 = 6;

impl Journals {
    /// Opens the command log under `data_dir`, replays it, and starts the sequencer on its own
    /// thread (`tephra-journal`), which ends once every handle is dropped.
    ///
    /// # Errors
    /// [`StoreError`] when the command log refuses to open; an I/O error as
    /// [`StoreError::Log`] when the thread cannot start.
    /// A page's record bytes are capped below `max_frame_len` too, so that no page is too
    /// large to send (docs/journals.md §7).
    pub fn start(data_dir: &std::path::Path, limits: JournalSettings, max_frame_len: u32) -> Result<Journals, StoreError> {
        let limits = fit_limits(limits);
        crate::cluster::node::refuse_member_log(data_dir)?;
        let sequencer = Sequencer::open(data_dir, limits.segment_size)?;
        let published = sequencer.published();
        // The queue holds the admission limit: a full queue answers `BUSY`, the write in no log.
        let (calls, rx) = flume::bounded(limits.admission_rounds.min(1 << 20) as usize);
        std::thread::Builder::new()
            .name("tephra-journal".into())
            .spawn(move || sequencer.run(rx))
            .map_err(|source| StoreError::Log(crate::log::LogError::Io { path: data_dir.to_owned(), source }))?;
        Ok(Journals::with(calls, published, limits, max_frame_len, None))
    }

    /// Opens the command log under `data_dir` as a member of a cluster (docs/journals.md §9)
    /// and starts the node's loop on its own thread (`tephra-node`): journal calls are ordered
    /// by consensus with the peers that `outbox` and `inbox` connect, and reads are confirmed
    /// by a quorum before they are served.
    ///
    /// # Errors
    /// As [`Journals::start`], and [`StoreError`] when the log belongs to another cluster or
    /// node or to a single node.
    pub fn start_cluster<O: crate::cluster::node::Outbox + 'static>(
        data_dir: &std::path::Path,
        limits: JournalSettings,
        max_frame_len: u32,
        mut node: crate::cluster::node::NodeSettings,
        outbox: O,
        inbox: flume::Receiver<crate::cluster::node::Inbound>,
    ) -> Result<Journals, StoreError> {
        let limits = fit_limits(limits);
        node.admission = limits.admission_rounds as usize;
        // Longer than a call may wait on the node for an election (`settle`), so that a read
        // that waited gets its confirmation rather than this timeout.
        let confirm = (node.settle * 2).max(Duration::from_secs(2));
        let node = crate::cluster::node::Node::open(data_dir, limits.segment_size, node, outbox)?;
        let published = node.published();
        let status = node.status();
        let id = status.lock().unwrap().node;
        let (calls, rx) = flume::bounded(limits.admission_rounds.min(1 << 20) as usize);
        std::thread::Builder::new()
            .name("tephra-node".into())
            .spawn(move || node.run(rx, inbox))
            .map_err(|source| StoreError::Log(crate::log::LogError::Io { path: data_dir.to_owned(), source }))?;
        Ok(Journals::with(calls, published, limits, max_frame_len, Some(Cluster { node: id, status, confirm })))
    }

    fn with(calls: flume::Sender<Call>, published: Arc<Published>, limits: JournalSettings, max_frame_len: u32, cluster: Option<Cluster>) -> Journals {
        let framed = u64::from(max_frame_len).saturating_sub(PAGE_OVERHEAD + PER_RECORD_OVERHEAD * limits.max_read_records).max(1);
        let page_bytes = limits.max_read_bytes.min(framed);
        let metrics = JournalMetrics {
            calls: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            waiting_reads: AtomicU64::new(0),
            write_latency: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("bounds")),
        };
        Journals { calls, published, limits, page_bytes, metrics, cluster }
    }

    /// The cluster node's status, when this server is a cluster member.
    pub fn node_status(&self) -> Option<crate::cluster::node::NodeStatus> {
        self.cluster.as_ref().map(|c| c.status.lock().unwrap().clone())
    }

    /// Commands per group commit of the journal log, for `/metrics`.
    pub fn commit_commands(&self) -> &Mutex<hdrhistogram::Histogram<u64>> {
        &self.published.commit_commands
    }

    /// How the command log's segment files are given back, for `/metrics`.
    pub fn disk(&self) -> &crate::journal::sequencer::DiskStats {
        &self.published.disk
    }

    /// Segment files of the command log now, for `/metrics`.
    pub fn log_segments(&self) -> usize {
        self.published.segments.len()
    }

    /// Serves one journal call.
    pub async fn serve(&self, req: JournalRequest) -> JournalResponse {
        let Some(call) = req.call else {
            return invalid("a journal request names no call");
        };
        let kind = match &call {
            journal_request::Call::Write(_) => 0,
            journal_request::Call::Read(_) => 1,
            journal_request::Call::Truncate(_) => 2,
            journal_request::Call::SetLeader(_) => 3,
            journal_request::Call::Create(_) => 4,
            journal_request::Call::Delete(_) => 5,
            journal_request::Call::List(_) => 6,
            journal_request::Call::Status(_) => 7,
            journal_request::Call::Configure(_) => 8,
        };
        let started = Instant::now();
        let mut resp = match call {
            journal_request::Call::Read(r) => self.read(r).await,
            journal_request::Call::Status(_) => self.status(),
            call => match self.prepare(call) {
                Ok((call, rx, admission)) => self.send(call, rx, admission).await,
                Err(refused) => *refused,
            },
        };
        if let Some(c) = self.metrics.calls[kind].get(resp.outcome as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if kind == 0 {
            if let Ok(mut h) = self.metrics.write_latency.lock() {
                let _ = h.record(started.elapsed().as_micros().max(1) as u64);
            }
        }
        resp.answered_by = self.cluster.as_ref().map_or(0, |c| c.node);
        resp
    }

    /// Checks a call that goes through the sequencer (ids, uuids, limits, names) and builds
    /// it, with the receiver of its answer and whether admission applies (writes only).
    fn prepare(&self, call: journal_request::Call) -> Result<(Call, flume::Receiver<JournalResponse>, bool), Box<JournalResponse>> {
        let (reply, rx) = flume::bounded(1);
        let (cmd, admission) = match call {
            journal_request::Call::Read(_) | journal_request::Call::Status(_) => unreachable!("reads and status are served by the shard"),
            journal_request::Call::Write(w) => {
                let id = known(w.tenant, w.journal)?;
                let leader = uuid(&w.leader)?;
                let bytes: u64 = w.records.iter().map(|r| r.len() as u64).sum();
                if w.records.len() as u64 > self.limits.max_batch_records || bytes > self.limits.max_batch_bytes {
                    return Err(Box::new(JournalResponse {
                        outcome: JournalOutcome::TooLarge as i32,
                        max_records: self.limits.max_batch_records,
                        max_bytes: self.limits.max_batch_bytes,
                        ..Default::default()
                    }));
                }
                let records: Vec<&[u8]> = w.records.iter().map(Vec::as_slice).collect();
                let seq = if leader.is_some() { w.seq } else { 0 };
                (encode(&Command::Write { journal: id, leader, seq, records }), true)
            }
            journal_request::Call::SetLeader(s) => {
                let journal = known(s.tenant, s.journal)?;
                let new = uuid(&s.new)?.unwrap_or(LeaderUuid::NONE);
                (encode(&Command::SetLeader { journal, new, old: uuid(&s.old)? }), false)
            }
            journal_request::Call::Truncate(t) => {
                let journal = known(t.tenant, t.journal)?;
                (encode(&Command::Truncate { journal, leader: uuid(&t.leader)?, up_to: t.up_to }), false)
            }
            journal_request::Call::Delete(d) => (encode(&Command::DeleteJournal { journal: known(d.tenant, d.journal)? }), false),
            journal_request::Call::Create(c) => return Ok((self.create(c, reply)?, rx, false)),
            journal_request::Call::List(l) => return Ok((Call::List { tenant: l.tenant_name, reply }, rx, false)),
            journal_request::Call::Configure(c) => {
                let survive = u8::try_from(c.survive).ok().filter(|f| *f <= MAX_SURVIVE);
                let Some(survive) = survive else {
                    return Err(Box::new(invalid(&format!("--survive machines=F takes F from 0 to {MAX_SURVIVE}"))));
                };
                if c.tenant_name.is_empty() {
                    let journal = known(c.tenant, c.journal)?;
                    return Ok((Call::Configure { journal, survive, reply }, rx, false));
                }
                if c.tenant != 0 || c.journal != 0 {
                    return Err(Box::new(invalid("a configure names a tenant by name or a journal by ids, not both")));
                }
                if !valid_name(&c.tenant_name) {
                    return Err(Box::new(invalid_name()));
                }
                return Ok((Call::ConfigureTenant { tenant: c.tenant_name, tenant_id: random_id(), survive, reply }, rx, false));
            }
        };
        Ok((Call::Command { payload: cmd, reply }, rx, admission))
    }

    /// Checks a create's names, mode and durability, and draws its ids.
    fn create(&self, c: JournalCreate, reply: flume::Sender<JournalResponse>) -> Result<Call, Box<JournalResponse>> {
        if !valid_name(&c.tenant_name) || !valid_name(&c.journal_name) {
            return Err(Box::new(invalid_name()));
        }
        let mode = match JournalMode::try_from(c.mode) {
            Ok(JournalMode::Single) => Mode::Single,
            Ok(JournalMode::Multi) => Mode::Multi,
            Err(_) => return Err(Box::new(invalid("unknown journal mode"))),
        };
        let durability = match JournalDurability::try_from(c.durability) {
            Ok(JournalDurability::Ordered) => StoreDurability::Ordered,
            Ok(JournalDurability::Batched) => StoreDurability::Batched,
            Err(_) => return Err(Box::new(invalid("unknown store durability"))),
        };
        let survive = match c.survive.map(u8::try_from) {
            None => None,
            Some(Ok(f)) if f <= MAX_SURVIVE => Some(f),
            Some(_) => return Err(Box::new(invalid(&format!("--survive machines=F takes F from 0 to {MAX_SURVIVE}")))),
        };
        Ok(Call::Create { tenant: c.tenant_name, journal: c.journal_name, mode, durability, tenant_id: random_id(), journal_id: random_id(), survive, reply })
    }

    /// Queues a call for the sequencer (answering `BUSY` when the admission queue is full and
    /// `admission` is set) and waits for its answer.
    async fn send(&self, call: Call, rx: flume::Receiver<JournalResponse>, admission: bool) -> JournalResponse {
        if let Some(why) = self.published.stopped() {
            return unavailable(&why);
        }
        let list = matches!(call, Call::List { .. });
        let sent = if admission {
            match self.calls.try_send(call) {
                Err(flume::TrySendError::Full(_)) => {
                    return JournalResponse {
                        outcome: JournalOutcome::Busy as i32,
                        message: format!(
                            "more than {} journal writes are waiting for their commit; retry the same write shortly",
                            self.limits.admission_rounds
                        ),
                        ..Default::default()
                    };
                }
                other => other.map_err(|_| ()),
            }
        } else {
            self.calls.send_async(call).await.map_err(|_| ())
        };
        if sent.is_err() {
            return unavailable("the journal sequencer has stopped");
        }
        // A cluster's list is a read of the directory: bounded as a journal read's
        // confirmation is, then UNSERVED (the client asks another node).
        if let (Some(c), true) = (&self.cluster, list) {
            return c.confirmed(&rx, "list").await;
        }
        rx.recv_async().await.unwrap_or_else(|_| unavailable("the journal sequencer has stopped"))
    }

    /// `LISTED` with this node's place in its cluster (none on a single node).
    fn status(&self) -> JournalResponse {
        let node = self.node_status().map(|st| {
            Box::new(crate::proto::NodeReport {
                node: st.node,
                zone: st.zone.unwrap_or_default(),
                groups: st
                    .groups
                    .into_iter()
                    .map(|(id, g)| crate::proto::GroupReport {
                        tenant: id.tenant,
                        journal: id.journal,
                        role: match g.role {
                            raft::StateRole::Leader => "leader",
                            raft::StateRole::Follower => "follower",
                            raft::StateRole::Candidate => "candidate",
                            raft::StateRole::PreCandidate => "pre-candidate",
                        }
                        .to_owned(),
                        leader: g.leader.unwrap_or(0),
                        term: g.term,
                        commit: g.commit,
                        applied: g.applied,
                        voters: g.voters,
                    })
                    .collect(),
                peers: st
                    .peers
                    .into_iter()
                    .map(|(node, addr, connected)| crate::proto::PeerReport { node, addr, connected, zone: st.zones.get(&node).cloned().unwrap_or_default() })
                    .collect(),
                leader_changes: st.leader_changes,
            })
        });
        JournalResponse { outcome: JournalOutcome::Listed as i32, node, ..Default::default() }
    }

    /// A read: the page from the durable state, or a wait at the tail up to `wait_ms`.
    async fn read(&self, r: JournalRead) -> JournalResponse {
        let id = JournalId { tenant: r.tenant, journal: r.journal };
        if let (Some(c), true) = (&self.cluster, id.is_set()) {
            // A quorum confirms the read first; this node then serves it from what it applied.
            let (reply, rx) = flume::bounded(1);
            if self.calls.send_async(Call::Confirm { journal: id, reply }).await.is_err() {
                return unavailable("the journal node has stopped");
            }
            let resp = c.confirmed(&rx, "read").await;
            if resp.outcome != JournalOutcome::Page as i32 {
                return resp;
            }
        }
        let Some(shown) = self.published.journal(id).filter(|_| id.is_set()) else {
            return outcome(JournalOutcome::UnknownJournal);
        };
        let max_records = if r.limit == 0 { self.limits.max_read_records } else { r.limit.min(self.limits.max_read_records) };
        let wait = match r.wait_ms {
            0 => 0,
            w => w.clamp(self.limits.min_wait_ms, self.limits.max_wait_ms),
        };
        let deadline = Instant::now() + Duration::from_millis(wait);
        loop {
            let listener = shown.tail.listen();
            let (view, page, deleted) = {
                let st = shown.state.lock().unwrap();
                (st.view, st.held.page(r.from_seq, max_records, self.page_bytes), st.deleted)
            };
            if deleted {
                return outcome(JournalOutcome::UnknownJournal);
            }
            if r.from_seq < view.first_seq {
                return JournalResponse { outcome: JournalOutcome::Truncated as i32, state: Some(wire_view(view)), ..Default::default() };
            }
            if let Some(page) = page {
                let mut records = Vec::with_capacity(page.locs.len());
                let mut failed = None;
                for loc in page.locs {
                    match self.published.segments.read(loc) {
                        Ok(b) => records.push(b),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if let Some(e) = failed {
                    // A truncation or deletion published after the page was taken may have
                    // let its segment go: judge the read again against the new state.
                    let st = shown.state.lock().unwrap();
                    if st.deleted || r.from_seq < st.view.first_seq {
                        continue;
                    }
                    return unavailable(&format!("reading a journal record failed: {e}"));
                }
                return JournalResponse {
                    outcome: JournalOutcome::Page as i32,
                    from_seq: r.from_seq,
                    records,
                    state: Some(wire_view(view)),
                    ..Default::default()
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return JournalResponse { outcome: JournalOutcome::Page as i32, from_seq: r.from_seq, state: Some(wire_view(view)), ..Default::default() };
            }
            self.metrics.waiting_reads.fetch_add(1, Ordering::Relaxed);
            futures_lite::future::or(listener, shards::sleep(deadline - now)).await;
            self.metrics.waiting_reads.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A command encoded here, on the connection's shard, so the sequencer does not have to.
fn encode(cmd: &Command<'_>) -> Vec<u8> {
    let mut payload = Vec::with_capacity(cmd.encoded_len());
    cmd.encode(EntryId::default(), &mut payload);
    payload
}

/// The journal id of a call, or `UNKNOWN_JOURNAL` when either half is 0.
fn known(tenant: u64, journal: u64) -> Result<JournalId, Box<JournalResponse>> {
    let id = JournalId { tenant, journal };
    if id.is_set() {
        Ok(id)
    } else {
        Err(Box::new(outcome(JournalOutcome::UnknownJournal)))
    }
}

/// A uuid off the wire: empty is none, 16 bytes big-endian is one (0 reads as none), any
/// other length is `INVALID`.
fn uuid(bytes: &[u8]) -> Result<Option<LeaderUuid>, Box<JournalResponse>> {
    match bytes.len() {
        0 => Ok(None),
        16 => Ok(LeaderUuid(u128::from_be_bytes(bytes.try_into().unwrap())).set()),
        n => Err(Box::new(invalid(&format!("a leader uuid is 16 bytes (or empty for none), got {n}")))),
    }
}

/// A random non-zero id.
fn random_id() -> u64 {
    loop {
        let (hi, _) = uuid::Uuid::new_v4().as_u64_pair();
        if hi != 0 {
            return hi;
        }
    }
}

/// `INVALID_NAME`, saying what a name may be.
fn invalid_name() -> JournalResponse {
    JournalResponse {
        outcome: JournalOutcome::InvalidName as i32,
        message: "a name is 1 to 64 bytes of ASCII letters, digits, '.', '_' and '-', not starting with '.' or '-'".into(),
        ..Default::default()
    }
}
