//! The journal calls over any transport, written once for both clients: what each call sends,
//! when it is sent again (`BUSY`, `NOT_LEADER`, a stale connection), how a read asks across
//! servers, how an ambiguous write is settled, and how a writer session claims and writes
//! (docs/journals.md §8.2-§8.4).
//!
//! A client implements [`Transport`] (one exchange with a server, moving to the next server, a
//! pause) and awaits these futures: the async handle
//! ([`AsyncJournals`](crate::client::async_client::AsyncJournals)) on its executor, the
//! blocking [`Journals`](super::Journals) with `block_on` on its own thread (its transport
//! never yields, so each future completes in one poll).

use std::future::Future;
use std::time::{Duration, Instant};

use super::{
    create_call, decode_create, decode_delete, decode_list, decode_read, decode_set_leader, decode_truncate, decode_write, delete_call, find_named,
    fresh_leader, judge_read_back, judge_resend, list_call, read_call, set_leader_call, truncate_call, write_call, ClaimOutcome, CreateOutcome, DeleteOutcome,
    JournalError, JournalInfo, JournalRef, ListOutcome, NameError, ReadOutcome, Resolution, SetLeaderOutcome, TruncateOutcome, WriteOutcome, WriterOutcome,
};
use crate::client::async_client::AsyncJournalsConfig;
use crate::journal::{JournalId, LeaderUuid, Mode, Seq, StoreDurability, View};
use crate::proto::journal::{journal_request::Call, JournalOutcome, JournalResponse};

/// The numbers a client's calls run by (docs/journals.md §8.2), from its configuration.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    /// The timeouts, the retry budget and the pauses.
    pub timing: AsyncJournalsConfig,
    /// How many servers a call asks after `NOT_LEADER`.
    pub redirect_limit: u32,
    /// How many servers the client knows (at least 1 is asked).
    pub servers: usize,
}

/// What one exchange with a server came to.
#[derive(Debug)]
pub(crate) enum Exchange {
    /// The server's journal answer.
    Answer(JournalResponse),
    /// No server could be reached; nothing was sent.
    Unreachable(String),
    /// Sent; no answer (a transport error or a timeout). `stale`: the connection had carried
    /// answers before, so it may have gone stale.
    Lost {
        /// The server asked.
        server: String,
        /// Why no answer came.
        error: String,
        /// Whether asking again on a new connection may get an answer.
        stale: bool,
    },
}

/// How a client reaches its servers.
pub(crate) trait Transport {
    /// The numbers its calls run by.
    fn policy(&self) -> Policy;

    /// Sends `call` once to the current server and waits up to `timeout` for its answer.
    /// Errors are answers that are no answer to the call (a protocol error frame, a request
    /// over the frame cap, an answer of another kind).
    fn exchange(&mut self, call: Call, timeout: Duration) -> impl Future<Output = Result<Exchange, JournalError>>;

    /// Moves on to the next server (dropping any connection to this one).
    fn next_server(&mut self);

    /// Moves on after `NOT_LEADER` whose hint names node `leader` (0: none): to the server
    /// known to be that node when there is one. By default, the next server.
    fn redirect(&mut self, leader: u64) {
        let _ = leader;
        self.next_server();
    }

    /// Waits `duration`.
    fn pause(&mut self, duration: Duration) -> impl Future<Output = ()>;
}

/// A write answered `BUSY` is sent again; nothing else is.
fn busy_write(r: &JournalResponse) -> bool {
    r.outcome == JournalOutcome::Busy as i32
}

/// No answer is sent again for being busy.
fn never(_: &JournalResponse) -> bool {
    false
}

/// [`Transport::exchange`] for a call that changes nothing: an answer lost on a connection
/// that may have gone stale is asked for once more, on a new connection.
async fn ask<T: Transport>(t: &mut T, call: Call, timeout: Duration) -> Result<Exchange, JournalError> {
    match t.exchange(call.clone(), timeout).await? {
        Exchange::Lost { stale: true, .. } => t.exchange(call, timeout).await,
        other => Ok(other),
    }
}

/// Sends a call that changes a journal, following `NOT_LEADER` to the leader it names (else to
/// the next server; up to the redirect limit) and re-sending after `BUSY` (`busy` says which answers are busy) until the
/// request timeout. Returns the last answer, `None` when it was lost.
async fn changing<T: Transport>(t: &mut T, call: Call, busy: fn(&JournalResponse) -> bool) -> Result<Option<JournalResponse>, JournalError> {
    let policy = t.policy();
    let deadline = Instant::now() + policy.timing.request_timeout;
    let mut redirects = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match t.exchange(call.clone(), left).await? {
            Exchange::Unreachable(why) => return Err(JournalError::Unreachable(why)),
            Exchange::Lost { .. } => return Ok(None),
            Exchange::Answer(r) => {
                let not_leader = r.outcome == JournalOutcome::NotLeader as i32;
                let again = if not_leader {
                    redirects += 1;
                    redirects < policy.redirect_limit && policy.servers > 1
                } else {
                    busy(&r)
                };
                if !again || Instant::now() + policy.timing.busy_backoff >= deadline {
                    return Ok(Some(r));
                }
                if not_leader {
                    t.redirect(r.leader_node);
                }
                // The first redirect that names the leader goes there at once; later ones back
                // off (40 ms doubling to 320 ms over the limit of 8), so that they span a leader
                // election (a few hundred milliseconds) rather than racing it.
                let pause = match (not_leader, redirects, r.leader_node) {
                    (true, 1, hint) if hint != 0 => Duration::ZERO,
                    (true, n, _) => policy.timing.busy_backoff * (1 << n.min(4)),
                    (false, _, _) => policy.timing.busy_backoff,
                };
                t.pause(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }
}

/// The outcome of a changing call's answer, `ambiguous` when it was lost.
fn decided<O>(answer: Option<JournalResponse>, decode: fn(&JournalResponse) -> Result<O, JournalError>, ambiguous: O) -> Result<O, JournalError> {
    match answer {
        Some(r) => decode(&r),
        None => Ok(ambiguous),
    }
}

/// `Journals::create` (docs/journals.md §5).
pub(crate) async fn create<T: Transport>(
    t: &mut T,
    tenant: &str,
    journal: &str,
    mode: Mode,
    durability: StoreDurability,
    survive: Option<u8>,
) -> Result<CreateOutcome, JournalError> {
    let call = create_call(tenant, journal, mode, durability, survive)?;
    decided(changing(t, call, never).await?, decode_create, CreateOutcome::Ambiguous)
}

/// `Journals::delete`.
pub(crate) async fn delete<T: Transport>(t: &mut T, id: JournalId) -> Result<DeleteOutcome, JournalError> {
    decided(changing(t, delete_call(id), never).await?, decode_delete, DeleteOutcome::Ambiguous)
}

/// `Journals::configure`.
pub(crate) async fn configure<T: Transport>(t: &mut T, id: JournalId, machines: u8) -> Result<super::ConfigureOutcome, JournalError> {
    decided(changing(t, super::configure_call(id, machines), never).await?, super::decode_configure, super::ConfigureOutcome::Ambiguous)
}

/// `Journals::configure_tenant`.
pub(crate) async fn configure_tenant<T: Transport>(t: &mut T, tenant: &str, machines: u8) -> Result<super::ConfigureOutcome, JournalError> {
    decided(changing(t, super::configure_tenant_call(tenant, machines), never).await?, super::decode_configure, super::ConfigureOutcome::Ambiguous)
}

/// `Journals::list`: a node that cannot confirm the list (`UNSERVED`, `NOT_LEADER`: a cluster
/// node without a quorum) sends the call to the next server; when none can,
/// [`JournalError::Unavailable`] with the last one's reason.
pub(crate) async fn list<T: Transport>(t: &mut T, tenant: Option<&str>) -> Result<ListOutcome, JournalError> {
    let policy = t.policy();
    let mut why = String::new();
    for _ in 0..policy.servers.max(1) {
        match ask(t, list_call(tenant), policy.timing.read_timeout).await? {
            Exchange::Answer(r) if r.outcome == JournalOutcome::Unserved as i32 || r.outcome == JournalOutcome::NotLeader as i32 => why = r.message,
            Exchange::Answer(r) => return decode_list(&r),
            Exchange::Unreachable(why) => return Err(JournalError::Unreachable(why)),
            Exchange::Lost { server, error, .. } => return Err(JournalError::NoAnswer { server, error }),
        }
        t.next_server();
    }
    Err(JournalError::Unavailable(format!("no server could serve the list: {why}")))
}

/// `Journals::node_status`: the current server's place in its cluster, `None` for a single
/// node (docs/journals.md §9.7). Asks only the current server.
pub(crate) async fn node_status<T: Transport>(t: &mut T) -> Result<Option<crate::proto::NodeReport>, JournalError> {
    let timeout = t.policy().timing.read_timeout;
    match ask(t, Call::Status(crate::proto::NodeStatusRequest {}), timeout).await? {
        Exchange::Answer(r) if r.outcome == JournalOutcome::Listed as i32 => Ok(r.node.map(|n| *n)),
        Exchange::Answer(r) => Err(super::common(&r, "status")),
        Exchange::Unreachable(why) => Err(JournalError::Unreachable(why)),
        Exchange::Lost { server, error, .. } => Err(JournalError::NoAnswer { server, error }),
    }
}

/// `Journals::show`: a list of the named tenant (of every tenant for an `id:` name), then
/// [`find_named`].
pub(crate) async fn show<T: Transport>(t: &mut T, name: &JournalRef) -> Result<JournalInfo, JournalError> {
    let tenant = match name {
        JournalRef::Named { tenant, .. } => Some(tenant.as_str()),
        JournalRef::Ids { .. } => None,
    };
    let mut info = match list(t, tenant).await? {
        ListOutcome::UnknownTenant => return Err(NameError::Unknown(name.to_string()).into()),
        ListOutcome::Listed(all) => find_named(name, &all)?.clone(),
    };
    // The list's server may hold no copy of the journal: its state comes from a read, which
    // the journal's voters confirm (docs/journals.md §9.2).
    if !info.state_here {
        info.state = match read(t, info.id, 0, 1, 0).await? {
            ReadOutcome::Page { state, .. } | ReadOutcome::Truncated { state } => state,
            ReadOutcome::UnknownJournal => return Err(NameError::Unknown(name.to_string()).into()),
            ReadOutcome::Unserved | ReadOutcome::Ambiguous => {
                return Err(JournalError::Unavailable(format!("no server could confirm the state of {name}: its voters are {:?}", info.voters)))
            }
        };
        info.state_here = true;
    }
    Ok(info)
}

/// `Journals::resolve_name`: the id as it is when both halves are whole, else [`show`].
pub(crate) async fn resolve_name<T: Transport>(t: &mut T, name: &JournalRef) -> Result<JournalId, JournalError> {
    match name.whole_id() {
        Some(id) => Ok(id),
        None => Ok(show(t, name).await?.id),
    }
}

/// A write (either mode), re-sent after `BUSY` until the request timeout.
pub(crate) async fn write<T: Transport>(t: &mut T, call: Call) -> Result<WriteOutcome, JournalError> {
    decided(changing(t, call, busy_write).await?, decode_write, WriteOutcome::Ambiguous)
}

/// `Journals::read`: each server is asked at most once, in turn; it moves on after
/// `UNSERVED`, a lost answer or `UNKNOWN_JOURNAL`, and answers `UnknownJournal` only when
/// every server said so.
pub(crate) async fn read<T: Transport>(t: &mut T, id: JournalId, from: Seq, limit: u64, wait_ms: u64) -> Result<ReadOutcome, JournalError> {
    let call = read_call(id, from, limit, wait_ms);
    let policy = t.policy();
    let timeout = policy.timing.read_timeout + Duration::from_millis(wait_ms);
    let n = policy.servers.max(1);
    // The last answer that was no page (unserved or lost), and how many said unknown.
    let mut last = None;
    let mut unknown = 0;
    let mut unreachable = None;
    for _ in 0..n {
        match ask(t, call.clone(), timeout).await? {
            Exchange::Answer(r) => match decode_read(&r)? {
                o @ (ReadOutcome::Page { .. } | ReadOutcome::Truncated { .. }) => return Ok(o),
                ReadOutcome::UnknownJournal => unknown += 1,
                o => last = Some(o),
            },
            Exchange::Lost { .. } => last = Some(ReadOutcome::Ambiguous),
            // Connecting tries every server: none takes a connection.
            Exchange::Unreachable(why) => {
                unreachable = Some(why);
                break;
            }
        }
        if n > 1 {
            t.next_server();
        }
    }
    if unknown == n {
        return Ok(ReadOutcome::UnknownJournal);
    }
    match (last, unreachable) {
        (Some(o), _) => Ok(o),
        (None, Some(why)) if unknown == 0 => Err(JournalError::Unreachable(why)),
        (None, _) => Ok(ReadOutcome::Unserved),
    }
}

/// `Journals::set_leader`: never re-sent after a lost answer.
pub(crate) async fn set_leader<T: Transport>(t: &mut T, id: JournalId, new: LeaderUuid, old: Option<LeaderUuid>) -> Result<SetLeaderOutcome, JournalError> {
    decided(changing(t, set_leader_call(id, new, old), never).await?, decode_set_leader, SetLeaderOutcome::Ambiguous)
}

/// `Journals::truncate`.
pub(crate) async fn truncate<T: Transport>(t: &mut T, id: JournalId, up_to: Seq, leader: Option<LeaderUuid>) -> Result<TruncateOutcome, JournalError> {
    decided(changing(t, truncate_call(id, up_to, leader), never).await?, decode_truncate, TruncateOutcome::Ambiguous)
}

// ---------------------------------------------------------------------------------------
// Settling an ambiguous write.

/// The three moves of settling an ambiguous write: over a server ([`resolve`]), or over
/// scripted answers (`settle`).
pub(crate) trait Attempts {
    /// Reads the position back.
    fn read_back(&mut self) -> impl Future<Output = Result<ReadOutcome, JournalError>>;
    /// Sends the identical write again.
    fn resend(&mut self) -> impl Future<Output = Result<WriteOutcome, JournalError>>;
    /// Waits between two re-sends.
    fn pause(&mut self) -> impl Future<Output = ()>;
}

/// Settles an ambiguous single-writer write at `seq` under `me` (docs/journals.md §8.3): one
/// read-back ([`judge_read_back`]), then up to `budget` identical re-sends ([`judge_resend`])
/// with a pause between them. An error from a move counts as no answer.
pub(crate) async fn settle_over(seq: Seq, me: LeaderUuid, budget: u32, moves: &mut impl Attempts) -> Resolution {
    if let Ok(read) = moves.read_back().await {
        if let Some(r) = judge_read_back(seq, me, &read) {
            return r;
        }
    }
    for attempt in 0..budget {
        if attempt > 0 {
            moves.pause().await;
        }
        if let Ok(answer) = moves.resend().await {
            if let Some(r) = judge_resend(seq, me, &answer) {
                return r;
            }
        }
    }
    Resolution::Unresolved
}

/// The moves of settling, over a server.
struct Resending<'a, T> {
    t: &'a mut T,
    id: JournalId,
    seq: Seq,
    call: Call,
    backoff: Duration,
}

impl<T: Transport> Attempts for Resending<'_, T> {
    async fn read_back(&mut self) -> Result<ReadOutcome, JournalError> {
        read(self.t, self.id, self.seq, 1, 0).await
    }

    async fn resend(&mut self) -> Result<WriteOutcome, JournalError> {
        write(self.t, self.call.clone()).await
    }

    async fn pause(&mut self) {
        self.t.pause(self.backoff).await
    }
}

/// `Journals::resolve`: [`settle_over`] a server, with the retry budget and backoff of its
/// policy.
pub(crate) async fn resolve<T: Transport>(t: &mut T, id: JournalId, leader: LeaderUuid, seq: Seq, records: &[impl AsRef<[u8]>]) -> Resolution {
    let policy = t.policy();
    let call = write_call(id, Some(leader), seq, records);
    let mut moves = Resending { t, id, seq, call, backoff: policy.timing.retry_backoff };
    settle_over(seq, leader, policy.timing.retry_budget, &mut moves).await
}

// ---------------------------------------------------------------------------------------
// The writer session.

/// What a writer session knows (docs/journals.md §8.4): its journal, its uuid, the seq of its
/// next write while it believes it leads, and whether it was superseded since its last claim.
#[derive(Debug)]
pub(crate) struct Session {
    /// The journal.
    pub id: JournalId,
    /// The uuid it claims and writes under.
    pub leader: LeaderUuid,
    /// `Some(next_seq)` while the writer believes it leads.
    pub next_seq: Option<Seq>,
    /// Superseded since the last claim: the next claim draws a fresh uuid.
    pub superseded: bool,
}

impl Session {
    /// A session on `id` under `leader`, not leading yet.
    pub(crate) fn new(id: JournalId, leader: LeaderUuid) -> Session {
        Session { id, leader, next_seq: None, superseded: false }
    }

    /// Notes a view: another uuid leading ends the session.
    fn saw(&mut self, state: &View) -> bool {
        if state.leader != Some(self.leader) {
            self.next_seq = None;
            self.superseded = true;
            return true;
        }
        false
    }
}

/// `JournalWriter::claim`: a read, then `SetLeader(mine, the leader read)`; a read that
/// already names my uuid is `Owned`. After a supersession, a fresh uuid is drawn first.
pub(crate) async fn claim<T: Transport>(t: &mut T, s: &mut Session) -> Result<ClaimOutcome, JournalError> {
    if s.superseded {
        s.leader = fresh_leader();
        s.superseded = false;
    }
    let state = match read(t, s.id, 0, 1, 0).await? {
        ReadOutcome::Page { state, .. } | ReadOutcome::Truncated { state } => state,
        ReadOutcome::UnknownJournal => return Ok(ClaimOutcome::UnknownJournal),
        ReadOutcome::Unserved | ReadOutcome::Ambiguous => return Ok(ClaimOutcome::Unread),
    };
    if state.leader == Some(s.leader) {
        s.next_seq = Some(state.next_seq);
        return Ok(ClaimOutcome::Owned { state });
    }
    Ok(match set_leader(t, s.id, s.leader, state.leader).await? {
        SetLeaderOutcome::Won { state } => {
            s.next_seq = Some(state.next_seq);
            ClaimOutcome::Won { state }
        }
        SetLeaderOutcome::Lost { state } => {
            s.next_seq = None;
            ClaimOutcome::Lost { state }
        }
        SetLeaderOutcome::WrongMode => ClaimOutcome::WrongMode,
        SetLeaderOutcome::UnknownJournal => ClaimOutcome::UnknownJournal,
        // Refused before consensus: nothing changed, as when no server served the read.
        SetLeaderOutcome::NotLeader { .. } => ClaimOutcome::Unread,
        SetLeaderOutcome::Ambiguous => ClaimOutcome::Ambiguous,
    })
}

/// `JournalWriter::write`: writes `records` at the tail; nothing is sent while the session
/// does not lead; a lost answer is settled with [`resolve`] before it answers.
pub(crate) async fn write_at_tail<T: Transport>(t: &mut T, s: &mut Session, records: &[impl AsRef<[u8]>]) -> Result<WriterOutcome, JournalError> {
    let Some(seq) = s.next_seq else { return Ok(WriterOutcome::NotOwner) };
    let answer = write(t, write_call(s.id, Some(s.leader), seq, records)).await?;
    Ok(match answer {
        WriteOutcome::Written { seq, count, duplicate, state } => {
            s.next_seq = Some(state.next_seq.max(seq + u64::from(count)));
            WriterOutcome::Written { seq, count, duplicate, resolved: false, state: Some(state) }
        }
        WriteOutcome::Refused { state } => {
            if s.saw(&state) {
                WriterOutcome::Superseded { state }
            } else {
                s.next_seq = Some(state.next_seq);
                WriterOutcome::Refused { state }
            }
        }
        WriteOutcome::Truncated { state } => {
            s.next_seq = Some(state.next_seq);
            WriterOutcome::Truncated { state }
        }
        WriteOutcome::WrongMode { state } => {
            s.next_seq = None;
            WriterOutcome::WrongMode { state }
        }
        WriteOutcome::TooLarge { max_records, max_bytes } => WriterOutcome::TooLarge { max_records, max_bytes },
        WriteOutcome::UnknownJournal => WriterOutcome::UnknownJournal,
        WriteOutcome::Busy => WriterOutcome::Busy,
        WriteOutcome::NotLeader { message } => WriterOutcome::NotLeader { message },
        WriteOutcome::Ambiguous => match resolve(t, s.id, s.leader, seq, records).await {
            Resolution::Written { seq, count } => {
                s.next_seq = Some(seq + u64::from(count));
                WriterOutcome::Written { seq, count, duplicate: false, resolved: true, state: None }
            }
            Resolution::NotWritten { state } => {
                if !s.saw(&state) {
                    s.next_seq = Some(state.next_seq);
                }
                WriterOutcome::NotWritten { state }
            }
            Resolution::Truncated { state } => {
                s.next_seq = Some(state.next_seq);
                WriterOutcome::Truncated { state }
            }
            Resolution::Unresolved => WriterOutcome::Ambiguous,
        },
    })
}
