//! The journal sequencer: one thread per node that judges every journal call in log order,
//! stages the calls that change something in the command log, commits them in groups (many
//! journals' writes share one sync), and releases each answer only once the state it was
//! judged against is durable. Readers see only what it has published, which is durable.
//!
//! Source: docs/journals.md §4 and §6.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::proto::{JournalDurability, JournalInfo, JournalMode, JournalOutcome, JournalResponse, JournalView};

use super::apply::Outcome;
use super::checkpoint::{self, Checkpoint, CheckpointError};
use super::command::{decode, Command, EntryId};
use super::directory::{Answer, Directory};
use super::held::{Held, Holdings, Loc};
use super::model::{JournalId, LeaderUuid, Mode, StoreDurability, View};
use super::store::{JournalStore, Segments, StoreError};

/// One call for the sequencer, with where to send its answer.
pub enum Call {
    /// A journal command, already encoded by the connection's shard (docs/journals.md §4.2).
    Command {
        /// The encoded command.
        payload: Vec<u8>,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
    /// Create `tenant/journal`, the tenant too when it does not exist, under the given ids
    /// (drawn at random by the caller, non-zero).
    Create {
        /// The tenant's name.
        tenant: String,
        /// The journal's name.
        journal: String,
        /// The writer mode.
        mode: Mode,
        /// The store durability.
        durability: StoreDurability,
        /// The id the tenant gets if it is new.
        tenant_id: u64,
        /// The id the journal gets.
        journal_id: u64,
        /// F of `--survive machines=F` when the caller named it (0 to 127).
        survive: Option<u8>,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
    /// Record `journal`'s new `--survive machines=F` (a cluster moves its group to 2F+1 voters;
    /// a single node takes only 0). Answered `CONFIGURED`, `UNPLACEABLE` or `UNKNOWN_JOURNAL`.
    Configure {
        /// The journal.
        journal: JournalId,
        /// F.
        survive: u8,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
    /// Record the tenant `tenant`'s default `--survive machines=F` for the journals created in
    /// it later without an F of their own (a new tenant is created with `tenant_id`). Answered
    /// `CONFIGURED` (with the tenant's id), `UNPLACEABLE` or `INVALID_NAME`; a single node takes
    /// only 0, its only F, and records nothing.
    ConfigureTenant {
        /// The tenant's name.
        tenant: String,
        /// The id the tenant gets if it is new.
        tenant_id: u64,
        /// F.
        survive: u8,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
    /// Confirm that this node may serve a read of `journal` now (replication: a quorum
    /// confirmed the leader's commit index and this node applied up to it, docs/journals.md
    /// §9.2). The answer is `PAGE` (go), `UNSERVED` or `UNKNOWN_JOURNAL`; a single node
    /// answers `PAGE` at once, since what it published is durable and complete.
    Confirm {
        /// The journal.
        journal: JournalId,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
    /// List the journals of a tenant (all tenants for an empty name).
    List {
        /// The tenant's name, or empty.
        tenant: String,
        /// Where the answer goes.
        reply: flume::Sender<JournalResponse>,
    },
}

impl Call {
    /// Where the call's answer goes.
    pub fn reply(&self) -> &flume::Sender<JournalResponse> {
        match self {
            Call::Command { reply, .. }
            | Call::Create { reply, .. }
            | Call::List { reply, .. }
            | Call::Confirm { reply, .. }
            | Call::Configure { reply, .. }
            | Call::ConfigureTenant { reply, .. } => reply,
        }
    }
}

/// The durable state of one journal as readers see it.
pub struct Shown {
    /// Its state.
    pub state: Mutex<ShownState>,
    /// Notified after every commit that moved its tail (and when it is deleted).
    pub tail: event_listener::Event,
}

/// See [`Shown`].
#[derive(Clone, Debug)]
pub struct ShownState {
    /// The durable view.
    pub view: View,
    /// The held records' locations.
    pub held: Held,
    /// Whether the journal was deleted (readers then answer unknown journal).
    pub deleted: bool,
}

/// What the sequencer has made durable, shared with every shard.
pub struct Published {
    journals: RwLock<HashMap<JournalId, Arc<Shown>>>,
    /// The command log's segments, for reading records.
    pub segments: Arc<Segments>,
    stopped: RwLock<Option<String>>,
    /// Commands per group commit of the journal log.
    pub commit_commands: Mutex<hdrhistogram::Histogram<u64>>,
    /// Segment files and their reclamation.
    pub disk: DiskStats,
}

/// How the command log's segment files are given back (docs/journals.md §4.4).
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Checkpoints written since start.
    pub checkpoints: AtomicU64,
    /// Segment files deleted since start.
    pub segments_deleted: AtomicU64,
    /// Durable items a cluster node wrote again at its log's head so that the segment they
    /// lay in could go (docs/journals.md §9.9).
    pub relocated: AtomicU64,
}

impl Published {
    /// Nothing published yet, over the command log's `segments`.
    pub(crate) fn new(segments: Arc<Segments>) -> Published {
        Published {
            journals: RwLock::new(HashMap::new()),
            segments,
            stopped: RwLock::new(None),
            commit_commands: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 1 << 20, 2).expect("bounds")),
            disk: DiskStats::default(),
        }
    }

    /// Records why the log stopped judging calls (fail-stop after a failed write or sync).
    pub(crate) fn stop(&self, why: String) {
        *self.stopped.write().unwrap() = Some(why);
    }

    /// Publishes a journal and wakes its tail readers.
    pub(crate) fn show(&self, id: JournalId, view: View, held: &Held) {
        self.set(id, view, held);
        if let Some(s) = self.journal(id) {
            s.tail.notify(usize::MAX);
        }
    }

    /// Takes a deleted journal away: its readers answer unknown journal, its tail waiters wake.
    pub(crate) fn remove(&self, id: JournalId) {
        if let Some(s) = self.journals.write().unwrap().remove(&id) {
            s.state.lock().unwrap().deleted = true;
            s.tail.notify(usize::MAX);
        }
    }

    /// The journal, if it exists (durably).
    pub fn journal(&self, id: JournalId) -> Option<Arc<Shown>> {
        self.journals.read().unwrap().get(&id).cloned()
    }

    /// Why the sequencer stopped judging calls (a failed write or sync), if it did.
    pub fn stopped(&self) -> Option<String> {
        self.stopped.read().unwrap().clone()
    }

    /// Publishes a journal's durable view and brings its shown records up to `held`: the
    /// records past the shown end are added and those below `first_seq` dropped, so each
    /// commit costs what it changed, not what the journal holds.
    fn set(&self, id: JournalId, view: View, held: &Held) {
        let shown = {
            let mut map = self.journals.write().unwrap();
            Arc::clone(map.entry(id).or_insert_with(|| {
                Arc::new(Shown { state: Mutex::new(ShownState { view, held: Held::default(), deleted: false }), tail: event_listener::Event::new() })
            }))
        };
        let mut st = shown.state.lock().unwrap();
        st.view = view;
        st.deleted = false;
        st.held.trim(held.first());
        let end = st.held.end();
        for (seq, loc) in held.from(end) {
            st.held.push(seq, loc);
        }
    }
}

/// A change judged in the open batch, published once the batch is durable.
enum Change {
    /// The journal's new view and held records.
    Journal(JournalId),
    /// The journal is gone.
    Deleted(JournalId),
}

/// The sequencer's state: the directory (every journal's pending state), the held records,
/// and the command log.
pub struct Sequencer {
    directory: Directory,
    holdings: Holdings,
    store: JournalStore,
    published: Arc<Published>,
    /// Answers waiting for the open batch to be durable.
    waiting: Vec<(flume::Sender<JournalResponse>, JournalResponse)>,
    changes: Vec<Change>,
    ordered: bool,
}

/// Most calls judged into one group commit.
const MAX_GROUP: usize = 4096;

impl Sequencer {
    /// Opens the command log under `data_dir`: loads its checkpoint, if any, and replays the
    /// commands after it.
    ///
    /// # Errors
    /// [`StoreError`] from the log's recovery, a command that does not decode, a damaged
    /// checkpoint, or one naming a segment that is missing.
    pub fn open(data_dir: &Path, segment_size: u64) -> Result<Sequencer, StoreError> {
        let Checkpoint { position: covered, mut directory, mut holdings } = JournalStore::read_checkpoint(data_dir)?.unwrap_or_default();
        let (store, outcome) = JournalStore::open(data_dir, segment_size, covered, |r| {
            let (_, cmd) =
                decode(r.payload).map_err(|source| StoreError::Command { segment: data_dir.join(super::store::JOURNALS_DIR), position: r.position, source })?;
            let answer = directory.apply(&cmd);
            note_held(&mut holdings, &cmd, &answer, r.segment, r.offset, r.payload);
            Ok(())
        })?;
        let bases = store.segments().bases();
        if let Some(missing) = holdings.live_segments().find(|s| bases.binary_search(s).is_err()) {
            let path = data_dir.join(super::store::JOURNALS_DIR).join(super::store::CHECKPOINT_FILE);
            let source = CheckpointError::Body(format!("held records lie in the segment at position {missing}, whose file is missing"));
            return Err(StoreError::Checkpoint { path, source });
        }
        holdings.note_maybe_freed();
        if let crate::log::OpenOutcome::RolledBack { segment, bytes, .. } = &outcome {
            tracing::warn!(segment = %segment.display(), from = bytes.0, to = bytes.1, "journal log: rolled back a torn tail that was never acknowledged");
        }
        let published = Arc::new(Published::new(store.segments()));
        for t in directory.tenants().map(|(id, _)| id).collect::<Vec<_>>() {
            for (id, e) in directory.journals_of(t) {
                published.set(id, e.state.view(), holdings.get(id).unwrap_or(&Held::default()));
            }
        }
        Ok(Sequencer { directory, holdings, store, published, waiting: Vec::new(), changes: Vec::new(), ordered: false })
    }

    /// What readers see.
    pub fn published(&self) -> Arc<Published> {
        Arc::clone(&self.published)
    }

    /// Runs until every sender of `calls` is gone: takes the calls waiting, judges them in
    /// order, commits, answers.
    pub fn run(mut self, calls: flume::Receiver<Call>) {
        while let Ok(first) = calls.recv() {
            self.judge(first);
            for call in calls.try_iter().take(MAX_GROUP - 1) {
                self.judge(call);
            }
            self.commit();
            self.reclaim();
        }
    }

    /// Gives disk back once the batch is durable: when a segment lost its last held record
    /// (or a rollover sealed one), and the sealed segments holding none add up to at least
    /// what a checkpoint costs to write, writes a checkpoint of the whole state at the last
    /// command and deletes them (docs/journals.md §4.4). A failure leaves the segments in
    /// place and is retried at the next freed segment or rollover.
    fn reclaim(&mut self) {
        if self.store.staged() > 0 || self.published.stopped().is_some() || !self.holdings.take_freed() {
            return;
        }
        let free: Vec<u64> = self.store.sealed().into_iter().filter(|&b| !self.holdings.is_live(b)).collect();
        let cost = checkpoint::encoded_len_estimate(&self.directory, &self.holdings) as u64;
        if free.is_empty() || (free.len() as u64).saturating_mul(self.store.segment_size()) < cost {
            return;
        }
        let bytes = checkpoint::encode(self.store.last_position(), &self.directory, &self.holdings);
        let disk = &self.published.disk;
        match self.store.write_checkpoint(&bytes) {
            Ok(()) => disk.checkpoints.fetch_add(1, Ordering::Relaxed),
            Err(e) => return tracing::warn!(error = %e, "journal log: checkpoint failed; no segment deleted"),
        };
        let before = self.published.segments.len();
        let result = self.store.delete_segments(&free);
        disk.segments_deleted.fetch_add(before.saturating_sub(self.published.segments.len()) as u64, Ordering::Relaxed);
        match result {
            Ok(()) => {
                tracing::info!(deleted = free.len(), position = self.store.last_position(), checkpoint_bytes = bytes.len(), "journal log: segments given back")
            }
            Err(e) => tracing::warn!(error = %e, "journal log: deleting a segment failed"),
        }
    }

    fn judge(&mut self, call: Call) {
        if let Some(why) = self.published.stopped() {
            let _ = call.reply().send(unavailable(&why));
            return;
        }
        match call {
            Call::Command { payload, reply } => {
                let answer = self.command(&payload);
                self.answer(reply, answer);
            }
            Call::Create { survive: Some(f), reply, .. } if f > 0 => {
                let _ = reply.send(unplaceable(f, 1));
            }
            Call::Create { tenant, journal, mode, durability, tenant_id, journal_id, reply, .. } => {
                let answer = self.create(&tenant, &journal, mode, durability, tenant_id, journal_id);
                self.answer(reply, answer);
            }
            Call::Confirm { reply, .. } => {
                let _ = reply.send(outcome(JournalOutcome::Page));
            }
            // One node, one copy: F = 0 is what it has already.
            Call::Configure { journal, survive, reply } => {
                let resp = match (self.directory.journal(journal), survive) {
                    (None, _) => outcome(JournalOutcome::UnknownJournal),
                    (Some(_), 0) => outcome(JournalOutcome::Configured),
                    (Some(_), f) => unplaceable(f, 1),
                };
                let _ = reply.send(resp);
            }
            Call::ConfigureTenant { survive, reply, .. } => {
                let resp = if survive == 0 { outcome(JournalOutcome::Configured) } else { unplaceable(survive, 1) };
                let _ = reply.send(resp);
            }
            Call::List { tenant, reply } => {
                let answer = self.list(&tenant);
                self.answer(reply, answer);
            }
        }
    }

    /// Queues an answer behind the open batch, or sends it now when nothing is staged (the
    /// state it was judged against is then durable).
    fn answer(&mut self, reply: flume::Sender<JournalResponse>, answer: JournalResponse) {
        if self.store.staged() == 0 {
            let _ = reply.send(answer);
        } else {
            self.waiting.push((reply, answer));
        }
    }

    fn command(&mut self, payload: &[u8]) -> JournalResponse {
        let Ok((_, cmd)) = decode(payload) else {
            return invalid("the journal command did not decode");
        };
        if let Err(e) = self.make_room(payload.len()) {
            return unavailable(&e.to_string());
        }
        let answer = self.directory.apply(&cmd);
        if moved(&answer) {
            self.stage(payload, &cmd, &answer);
        }
        let mut resp = respond(&answer);
        if resp.state.is_none() {
            resp.state = self.directory.journal(cmd.target()).map(|e| wire_view(e.state.view()));
        }
        resp
    }

    fn create(&mut self, tenant: &str, journal: &str, mode: Mode, durability: StoreDurability, tenant_id: u64, journal_id: u64) -> JournalResponse {
        let tid = match self.directory.tenant_named(tenant) {
            Some((id, _)) => id,
            None => {
                let cmd = Command::CreateTenant { tenant: tenant_id, name: tenant };
                let payload = match self.encode_with_room(&cmd) {
                    Ok(p) => p,
                    Err(e) => return unavailable(&e.to_string()),
                };
                let answer = self.directory.apply(&cmd);
                if !matches!(answer, Answer::TenantCreated { .. }) {
                    return respond(&answer);
                }
                self.stage(&payload, &cmd, &answer);
                tenant_id
            }
        };
        let cmd = Command::CreateJournal { journal: JournalId { tenant: tid, journal: journal_id }, name: journal, mode, durability };
        let payload = match self.encode_with_room(&cmd) {
            Ok(p) => p,
            Err(e) => return unavailable(&e.to_string()),
        };
        let answer = self.directory.apply(&cmd);
        if moved(&answer) {
            self.stage(&payload, &cmd, &answer);
        }
        respond(&answer)
    }

    fn list(&self, tenant: &str) -> JournalResponse {
        list(&self.directory, tenant)
    }

    /// Makes room in the open batch for a command of `len` bytes before it is judged, so that
    /// a command whose verdict moved the state can always be staged: committing what is open
    /// and starting a new segment when the active one is full. A call that cannot get room is
    /// answered unavailable and judged not at all, so the pending state never runs ahead of
    /// the log (a full disk at a rollover refuses calls until there is room again).
    ///
    /// # Errors
    /// [`StoreError::TooLarge`] for a command no segment can hold, or the rollover's error.
    fn make_room(&mut self, len: usize) -> Result<(), StoreError> {
        self.store.check_len(len)?;
        if !self.store.fits(len) {
            self.commit();
            if let Some(why) = self.published.stopped() {
                return Err(StoreError::Stopped { what: "earlier write", path: std::path::PathBuf::new(), source: std::io::Error::other(why) });
            }
            self.store
                .roll_over()
                .inspect_err(|e| tracing::error!(error = %e, "journal log: cannot start a new segment; journal calls are refused until it can"))?;
            self.holdings.note_maybe_freed();
        }
        Ok(())
    }

    /// Encodes a command the sequencer makes itself and makes room for it.
    fn encode_with_room(&mut self, cmd: &Command<'_>) -> Result<Vec<u8>, StoreError> {
        let mut payload = Vec::with_capacity(cmd.encoded_len());
        cmd.encode(EntryId::default(), &mut payload);
        self.make_room(payload.len())?;
        Ok(payload)
    }

    /// Stages a command whose verdict moved the state; [`Sequencer::make_room`] made room for
    /// it before it was judged.
    fn stage(&mut self, payload: &[u8], cmd: &Command<'_>, answer: &Answer) {
        let (_, offset) = self.store.stage(payload);
        let segment = self.store.active_base();
        note_held(&mut self.holdings, cmd, answer, segment, offset, payload);
        let target = cmd.target();
        match answer {
            Answer::Deleted { .. } => self.changes.push(Change::Deleted(target)),
            Answer::TenantCreated { .. } => {}
            _ => self.changes.push(Change::Journal(target)),
        }
        let durability = self.directory.journal(target).map(|e| e.state.durability);
        if durability != Some(StoreDurability::Batched) {
            self.ordered = true;
        }
    }

    /// Commits the open batch, publishes what it changed, and sends every answer waiting for
    /// it; on a failed write or sync the sequencer stops (fail-stop) and those calls are
    /// answered unavailable.
    fn commit(&mut self) {
        let staged = self.store.staged();
        if staged > 0 {
            if let Err(e) = self.store.commit(self.ordered) {
                let why = e.to_string();
                tracing::error!(error = %why, "journal log stopped: calls are refused until the server restarts");
                self.published.stop(why.clone());
                for (reply, _) in self.waiting.drain(..) {
                    let _ = reply.send(unavailable(&why));
                }
                self.changes.clear();
                return;
            }
            self.publish();
            if let Ok(mut h) = self.published.commit_commands.lock() {
                let _ = h.record(staged);
            }
        }
        self.ordered = false;
        for (reply, answer) in self.waiting.drain(..) {
            let _ = reply.send(answer);
        }
    }

    fn publish(&mut self) {
        for change in std::mem::take(&mut self.changes) {
            match change {
                Change::Journal(id) => {
                    let Some(e) = self.directory.journal(id) else { continue };
                    self.published.show(id, e.state.view(), self.holdings.get(id).unwrap_or(&Held::default()));
                }
                Change::Deleted(id) => self.published.remove(id),
            }
        }
    }
}

/// The `LISTED` answer for a tenant's journals (every tenant's for an empty name), or
/// `UNKNOWN_TENANT`, from `directory`.
pub fn list(directory: &Directory, tenant: &str) -> JournalResponse {
    let tenants: Vec<u64> = if tenant.is_empty() {
        directory.tenants().map(|(id, _)| id).collect()
    } else {
        match directory.tenant_named(tenant) {
            Some((id, _)) => vec![id],
            None => return outcome(JournalOutcome::UnknownTenant),
        }
    };
    let mut journals = Vec::new();
    for t in tenants {
        let tenant_name = directory.tenant(t).map(|x| x.name.clone()).unwrap_or_default();
        for (id, e) in directory.journals_of(t) {
            journals.push(JournalInfo {
                tenant: id.tenant,
                journal: id.journal,
                tenant_name: tenant_name.clone(),
                name: e.name.clone(),
                mode: wire_mode(e.state.mode) as i32,
                durability: wire_durability(e.state.durability) as i32,
                state: Some(wire_view(e.state.view())),
                survive: e.placement.as_ref().map(|p| u32::from(p.survive)),
                voters: e.placement.as_ref().map(|p| p.voters.clone()).unwrap_or_default(),
                elsewhere: false,
            });
        }
    }
    JournalResponse { outcome: JournalOutcome::Listed as i32, journals, ..Default::default() }
}

/// `UNPLACEABLE`: `--survive machines=F` needs 2F+1 nodes and the cluster has `nodes`.
pub fn unplaceable(f: u8, nodes: usize) -> JournalResponse {
    let need = 2 * usize::from(f) + 1;
    JournalResponse {
        outcome: JournalOutcome::Unplaceable as i32,
        message: format!("--survive machines={f} needs {need} nodes (2F+1) and this cluster has {nodes}; nothing changed"),
        ..Default::default()
    }
}

/// Records where an accepted write's records lie, trims held records after a truncation, and
/// forgets a deleted journal.
fn note_held(held: &mut Holdings, cmd: &Command<'_>, answer: &Answer, segment: u64, offset: u64, payload: &[u8]) {
    match (cmd, answer) {
        (Command::Write { journal, records, .. }, Answer::Journal(Outcome::Accepted { seq, .. })) => {
            for (i, r) in records.iter().enumerate() {
                let at = r.as_ptr() as usize - payload.as_ptr() as usize;
                held.push(*journal, seq + i as u64, Loc { segment, offset: offset + at as u64, len: r.len() as u32 });
            }
        }
        (Command::Truncate { journal, .. }, Answer::Journal(Outcome::Trimmed(view))) => {
            held.trim(*journal, view.first_seq);
        }
        (Command::DeleteJournal { journal }, Answer::Deleted { .. }) => {
            held.remove(*journal);
        }
        _ => {}
    }
}

/// Whether a verdict changed the state (only those are logged on a single node).
fn moved(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Journal(Outcome::Accepted { .. } | Outcome::Leader(_) | Outcome::Trimmed(_))
            | Answer::TenantCreated { .. }
            | Answer::JournalCreated { .. }
            | Answer::Deleted { .. }
    )
}

/// The uuid as it travels: empty for none, else 16 bytes big-endian.
pub fn wire_uuid(u: Option<LeaderUuid>) -> Vec<u8> {
    u.map(|u| u.0.to_be_bytes().to_vec()).unwrap_or_default()
}

/// A view as it travels.
pub fn wire_view(v: View) -> JournalView {
    JournalView { leader: wire_uuid(v.leader), next_seq: v.next_seq, first_seq: v.first_seq }
}

fn wire_mode(m: Mode) -> JournalMode {
    match m {
        Mode::Single => JournalMode::Single,
        Mode::Multi => JournalMode::Multi,
    }
}

fn wire_durability(d: StoreDurability) -> JournalDurability {
    match d {
        StoreDurability::Ordered => JournalDurability::Ordered,
        StoreDurability::Batched => JournalDurability::Batched,
    }
}

/// A response with only an outcome.
pub fn outcome(o: JournalOutcome) -> JournalResponse {
    JournalResponse { outcome: o as i32, ..Default::default() }
}

/// `INVALID` with a message.
pub fn invalid(message: &str) -> JournalResponse {
    JournalResponse { outcome: JournalOutcome::Invalid as i32, message: message.to_owned(), ..Default::default() }
}

/// `UNAVAILABLE` with a message.
pub fn unavailable(message: &str) -> JournalResponse {
    JournalResponse { outcome: JournalOutcome::Unavailable as i32, message: message.to_owned(), ..Default::default() }
}

/// The wire answer to a directory answer.
pub fn respond(answer: &Answer) -> JournalResponse {
    let with_view = |o: JournalOutcome, v: &View| JournalResponse { outcome: o as i32, state: Some(wire_view(*v)), ..Default::default() };
    match answer {
        Answer::Journal(o) => match o {
            Outcome::Accepted { seq, count } => JournalResponse { outcome: JournalOutcome::Accepted as i32, seq: *seq, count: *count, ..Default::default() },
            Outcome::Duplicate { seq, count } => JournalResponse { outcome: JournalOutcome::Duplicate as i32, seq: *seq, count: *count, ..Default::default() },
            Outcome::Refused(v) => with_view(JournalOutcome::Refused, v),
            Outcome::Truncated(v) => with_view(JournalOutcome::Truncated, v),
            Outcome::WrongMode(v) => with_view(JournalOutcome::WrongMode, v),
            Outcome::Leader(v) => with_view(JournalOutcome::Leader, v),
            Outcome::LeaderRefused(v) => with_view(JournalOutcome::Lost, v),
            Outcome::Trimmed(v) => with_view(JournalOutcome::Trimmed, v),
            Outcome::TruncateRefused(v) => with_view(JournalOutcome::TruncateRefused, v),
            Outcome::Noop => outcome(JournalOutcome::Unspecified),
        },
        Answer::TenantCreated { tenant } => JournalResponse { outcome: JournalOutcome::Created as i32, tenant: *tenant, ..Default::default() },
        Answer::JournalCreated { journal } => {
            JournalResponse { outcome: JournalOutcome::Created as i32, tenant: journal.tenant, journal: journal.journal, ..Default::default() }
        }
        Answer::NameTaken { existing } => {
            JournalResponse { outcome: JournalOutcome::NameTaken as i32, tenant: existing.tenant, journal: existing.journal, ..Default::default() }
        }
        Answer::InvalidName => invalid_name(),
        Answer::UnknownTenant => outcome(JournalOutcome::UnknownTenant),
        Answer::UnknownJournal => outcome(JournalOutcome::UnknownJournal),
        Answer::Deleted { state } => with_view(JournalOutcome::Deleted, &state.view()),
        Answer::Configured { journal } => {
            JournalResponse { outcome: JournalOutcome::Configured as i32, tenant: journal.tenant, journal: journal.journal, ..Default::default() }
        }
    }
}

fn invalid_name() -> JournalResponse {
    JournalResponse {
        outcome: JournalOutcome::InvalidName as i32,
        message: format!("a name is 1 to {} bytes of ASCII letters, digits, '.', '_' and '-', not starting with '.' or '-'", super::directory::MAX_NAME_LEN),
        ..Default::default()
    }
}
