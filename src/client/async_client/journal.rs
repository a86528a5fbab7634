//! Journal calls on an [`AsyncClient`], with the typed outcomes of the blocking client
//! (docs/journals.md §8): [`AsyncJournals`] and [`AsyncJournalWriter`], over the calls of
//! `client/journal/calls.rs`, which the blocking client runs too.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_lite::future;

use super::AsyncClient;
use crate::client::journal::calls::{self, Exchange, Policy, Transport};
use crate::client::journal::{
    not_a_journal_answer, over_frame_cap, ClaimOutcome, CreateOutcome, DeleteOutcome, JournalError, JournalInfo, JournalRef, JournalWriter, JournalsConfig,
    ListOutcome, ReadOutcome, Resolution, SetLeaderOutcome, TruncateOutcome, WriteOutcome, WriterOutcome,
};
use crate::client::ClientError;
use crate::journal::{JournalId, LeaderUuid, Mode, Seq, StoreDurability};
use crate::proto::journal::journal_request::Call;
use crate::proto::{response, FrameError};

/// How a lost answer names the server asked: the client knows no address.
const SERVER: &str = "the server";

/// A runtime's sleep, for [`AsyncJournals`]: a future that completes after a duration. Any
/// `Fn(Duration) -> impl Future<Output = ()>` is one: `glommio::timer::sleep`,
/// `|d| async move { async_io::Timer::after(d).await; }`, `tokio::time::sleep`.
///
/// The journal futures are `Send` when the handle is `Sync` and the sleep's future is `Send`.
pub trait Sleep {
    /// The future of one sleep.
    type Sleeping: Future<Output = ()>;

    /// A future that completes once `duration` has passed.
    fn sleep(&self, duration: Duration) -> Self::Sleeping;
}

impl<F, Fut> Sleep for F
where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    type Sleeping = Fut;

    fn sleep(&self, duration: Duration) -> Fut {
        self(duration)
    }
}

/// How long [`AsyncJournals`] waits and how it retries (docs/journals.md §8.2). `Default`
/// gives the blocking client's values, noted on each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncJournalsConfig {
    /// How long a call that changes a journal may take in all, its re-sends after `BUSY`
    /// included; a call whose answer has not come by then is `Ambiguous`. Default 5 s.
    pub request_timeout: Duration,
    /// How long a read or a list may take beyond its `wait_ms`. Default 5 s.
    pub read_timeout: Duration,
    /// How many times [`AsyncJournals::resolve`] sends an ambiguous write again. Default 4.
    pub retry_budget: u32,
    /// The pause between those re-sends. Default 100 ms.
    pub retry_backoff: Duration,
    /// The pause before a write answered `BUSY` is sent again. Default 20 ms.
    pub busy_backoff: Duration,
}

impl Default for AsyncJournalsConfig {
    fn default() -> Self {
        AsyncJournalsConfig::from(&JournalsConfig::new(Vec::<String>::new()))
    }
}

impl From<&JournalsConfig> for AsyncJournalsConfig {
    /// The timeouts, retry budget and pauses of a blocking configuration (its servers, token,
    /// TLS and redirect limit belong to the [`AsyncClient`]'s connector and are not used).
    fn from(c: &JournalsConfig) -> Self {
        AsyncJournalsConfig {
            request_timeout: c.request_timeout,
            read_timeout: c.read_timeout,
            retry_budget: c.retry_budget,
            retry_backoff: c.retry_backoff,
            busy_backoff: c.busy_backoff,
        }
    }
}

/// An async handle on the journals of the server an [`AsyncClient`] is connected to
/// (docs/journals.md §8).
///
/// It makes the same calls as the blocking [`Journals`](crate::client::journal::Journals)
/// and answers with the same outcomes, decided by the same code (the re-sends after `BUSY`,
/// the settling of an ambiguous write, the claim). Where it differs:
/// - It talks to the one server its [`AsyncClient`] is connected to, so there are no
///   redirects: `NOT_LEADER` is answered as it comes.
/// - The client never reconnects: once its socket has failed, every call fails with
///   [`JournalError::Unreachable`] (nothing was sent), and [`resolve`](Self::resolve)
///   answers `Unresolved`, until you connect a new client and hand it over with
///   [`set_client`](Self::set_client).
/// - It brings no timer: you give it your runtime's [`Sleep`], used for the pause after
///   `BUSY`, the pause between re-sends while settling, and the timeout of each exchange.
///
/// ```ignore
/// use std::time::Duration;
/// use tephra::client::async_client::{AsyncClient, AsyncJournals, AsyncJournalsConfig};
///
/// // async-io's timer; on glommio `glommio::timer::sleep`, on tokio `tokio::time::sleep`.
/// let sleep = |d: Duration| async move { async_io::Timer::after(d).await; };
/// let journals = AsyncJournals::new(client, sleep, AsyncJournalsConfig::default());
/// let id = journals.resolve_name(&"acme/orders".parse()?).await?;
/// let written = journals.write_multi(id, &[b"hello"]).await?;
/// ```
///
/// Every method takes `&self`, so calls can run concurrently (a read waiting at a tail while
/// writes go on: reads travel on the client's bulk sockets, other calls on its control
/// socket). Cheap to clone when the sleep is. Every call returns a typed outcome; `Ambiguous`
/// means the request went out and no answer came back (a failed socket, or no answer within
/// the timeout): the call may or may not have been applied.
///
/// # Errors
/// Every call fails with [`JournalError`] for what is no answer to the call:
/// [`Unreachable`](JournalError::Unreachable) when the client's socket had failed before the
/// call (nothing sent), [`Invalid`](JournalError::Invalid) for a malformed call or one over
/// the client's frame cap (nothing sent), [`Unavailable`](JournalError::Unavailable),
/// [`Server`](JournalError::Server) for a protocol error frame (a server that does not serve
/// journal calls answers `BAD_REQUEST`), and [`Unexpected`](JournalError::Unexpected) or
/// [`Malformed`](JournalError::Malformed) for an answer this client cannot use.
#[derive(Clone)]
pub struct AsyncJournals<S> {
    client: AsyncClient,
    sleep: S,
    config: AsyncJournalsConfig,
}

impl<S> fmt::Debug for AsyncJournals<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncJournals").field("client", &self.client).field("config", &self.config).finish_non_exhaustive()
    }
}

impl<S: Sleep> AsyncJournals<S> {
    /// A handle making its calls on `client`, pausing and timing out with `sleep`.
    pub fn new(client: AsyncClient, sleep: S, config: AsyncJournalsConfig) -> AsyncJournals<S> {
        AsyncJournals { client, sleep, config }
    }

    /// The client the calls go on.
    pub fn client(&self) -> &AsyncClient {
        &self.client
    }

    /// Makes the next calls on `client` (a new connection, after the old one failed).
    pub fn set_client(&mut self, client: AsyncClient) {
        self.client = client;
    }

    /// The configuration.
    pub fn config(&self) -> &AsyncJournalsConfig {
        &self.config
    }

    /// Creates `tenant/journal` with a writer mode and a store durability; the server creates
    /// the tenant when it is missing (docs/journals.md §5). A lost answer is `Ambiguous`:
    /// create again, and `NameTaken` names the journal if the first one landed.
    ///
    /// # Errors
    /// [`NameError::Malformed`](crate::client::journal::NameError::Malformed) (nothing sent)
    /// for a name that breaks the name rules; as the [type](Self) says.
    pub async fn create(&self, tenant: &str, journal: &str, mode: Mode, durability: StoreDurability) -> Result<CreateOutcome, JournalError> {
        calls::create(&mut &*self, tenant, journal, mode, durability, None).await
    }

    /// Deletes a journal and frees its disk.
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn delete(&self, id: JournalId) -> Result<DeleteOutcome, JournalError> {
        calls::delete(&mut &*self, id).await
    }

    /// Lists the journals of the tenant named `tenant`, or of every tenant for `None`.
    ///
    /// # Errors
    /// [`JournalError::NoAnswer`] when the answer was lost; as the [type](Self) says.
    pub async fn list(&self, tenant: Option<&str>) -> Result<ListOutcome, JournalError> {
        calls::list(&mut &*self, tenant).await
    }

    /// The journal `name` names, with its mode, durability and view, found by a list
    /// (docs/journals.md §8.1).
    ///
    /// # Errors
    /// [`NameError::Unknown`](crate::client::journal::NameError::Unknown) (an unknown tenant
    /// included), [`NameError::Ambiguous`](crate::client::journal::NameError::Ambiguous) for
    /// id prefixes that match several journals, and as [`list`](Self::list).
    pub async fn show(&self, name: &JournalRef) -> Result<JournalInfo, JournalError> {
        calls::show(&mut &*self, name).await
    }

    /// The id `name` names: taken as it is when both halves are given whole in hex, else
    /// looked up with [`show`](Self::show).
    ///
    /// # Errors
    /// As [`show`](Self::show).
    pub async fn resolve_name(&self, name: &JournalRef) -> Result<JournalId, JournalError> {
        calls::resolve_name(&mut &*self, name).await
    }

    /// A single-writer write of `records` at `seq` under `leader` (docs/journals.md §2.2). A
    /// `BUSY` answer is sent again after `busy_backoff` until the request timeout. An
    /// `Ambiguous` outcome can be settled with [`resolve`](Self::resolve).
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn write_single(&self, id: JournalId, leader: LeaderUuid, seq: Seq, records: &[impl AsRef<[u8]>]) -> Result<WriteOutcome, JournalError> {
        calls::write(&mut &*self, crate::client::journal::write_call(id, Some(leader), seq, records)).await
    }

    /// A multi-writer write: no uuid, no position; the journal puts it at its tail. It is never
    /// sent again after an ambiguous answer (there is no deduplication: a second send could
    /// land twice), only after `BUSY`, which logs nothing.
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn write_multi(&self, id: JournalId, records: &[impl AsRef<[u8]>]) -> Result<WriteOutcome, JournalError> {
        calls::write(&mut &*self, crate::client::journal::write_call(id, None, 0, records)).await
    }

    /// Settles an ambiguous single-writer write (docs/journals.md §8.3): reads the position
    /// back, then sends the identical write (same `leader`, `seq` and `records`) again up to
    /// `retry_budget` times, `retry_backoff` apart, into `Written`, `NotWritten`,
    /// `Truncated` or `Unresolved`. Never fails: a call that fails counts as no answer.
    pub async fn resolve(&self, id: JournalId, leader: LeaderUuid, seq: Seq, records: &[impl AsRef<[u8]>]) -> Resolution {
        calls::resolve(&mut &*self, id, leader, seq, records).await
    }

    /// Reads up to `limit` records (0: a full page) from `from`, waiting up to `wait_ms`
    /// milliseconds at the tail, where it answers as soon as a record lands
    /// (docs/journals.md §2 and §7). It goes on the next bulk socket and may take
    /// `read_timeout` beyond `wait_ms` before it is `Ambiguous`.
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn read(&self, id: JournalId, from: Seq, limit: u64, wait_ms: u64) -> Result<ReadOutcome, JournalError> {
        calls::read(&mut &*self, id, from, limit, wait_ms).await
    }

    /// `SetLeader(new, old)`: a compare-and-set; `old` is `None` on a journal that never had
    /// a leader (docs/journals.md §2.3). Never re-sent after a lost answer (a claim that won
    /// shows in the next read).
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn set_leader(&self, id: JournalId, new: LeaderUuid, old: Option<LeaderUuid>) -> Result<SetLeaderOutcome, JournalError> {
        calls::set_leader(&mut &*self, id, new, old).await
    }

    /// `Truncate(up_to)`: fenced by `leader` in a single-writer journal, `None` in a
    /// multi-writer one (docs/journals.md §2.4); clamped to `next_seq`, never lowers
    /// `first_seq`.
    ///
    /// # Errors
    /// As the [type](Self) says.
    pub async fn truncate(&self, id: JournalId, up_to: Seq, leader: Option<LeaderUuid>) -> Result<TruncateOutcome, JournalError> {
        calls::truncate(&mut &*self, id, up_to, leader).await
    }
}

/// The async transport: one server, no reconnects, the caller's sleep.
impl<S: Sleep> Transport for &AsyncJournals<S> {
    fn policy(&self) -> Policy {
        Policy { timing: self.config.clone(), redirect_limit: 0, servers: 1 }
    }

    async fn exchange(&mut self, call: Call, timeout: Duration) -> Result<Exchange, JournalError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let staged = self.client.journal_staged(call);
        let timer = self.sleep.sleep(timeout);
        let answer = future::or(async { Some(staged.await) }, async {
            timer.await;
            None
        })
        .await;
        let lost = |error: String| Ok(Exchange::Lost { server: SERVER.to_owned(), error, stale: false });
        match answer {
            None => lost(format!("no answer within {} ms", timeout.as_millis())),
            Some(Err(ClientError::Frame(FrameError::TooLong { len, max }))) => Err(over_frame_cap(len, max)),
            // An error frame, before the call (the socket ended on it) or as its answer.
            Some(Err(ClientError::Server { code, message, .. }) | Ok(Err(ClientError::Server { code, message, .. }))) => {
                Err(JournalError::Server { code, message })
            }
            Some(Err(e)) => Ok(Exchange::Unreachable(e.to_string())),
            Some(Ok(Ok(response::Kind::Journal(r)))) => Ok(Exchange::Answer(r)),
            Some(Ok(Ok(other))) => Err(not_a_journal_answer(&other)),
            Some(Ok(Err(e))) => lost(e.to_string()),
        }
    }

    fn next_server(&mut self) {}

    async fn pause(&mut self, duration: Duration) {
        self.sleep.sleep(duration).await
    }
}

/// A single-writer session on one journal over an [`AsyncJournals`] (docs/journals.md
/// §8.4): [`JournalWriter`] with async [`claim`](JournalWriter::claim) and
/// [`write`](JournalWriter::write). It claims the journal under its uuid, writes at the tail
/// (it keeps `next_seq`), settles lost answers with [`AsyncJournals::resolve`], and stops
/// writing once another leader supersedes it, until it is claimed again. A claim after a
/// supersession draws a fresh uuid: a uuid leads one term.
pub type AsyncJournalWriter<S> = JournalWriter<AsyncJournals<S>>;

impl<S: Sleep> JournalWriter<AsyncJournals<S>> {
    /// Claims the journal: a read, then `SetLeader(mine, the leader read)`. A read that
    /// already names my uuid is `Owned` (an earlier claim of mine won and its answer was
    /// lost); no read served is `Unread`, with nothing sent. After a supersession, a fresh
    /// uuid is drawn first.
    ///
    /// # Errors
    /// As [`AsyncJournals::read`] and [`AsyncJournals::set_leader`].
    pub async fn claim(&mut self) -> Result<ClaimOutcome, JournalError> {
        let (journals, session) = self.parts();
        calls::claim(&mut &*journals, session).await
    }

    /// Writes `records` at the tail. Nothing is sent while the writer does not lead
    /// (`NotOwner`); a refusal naming another leader is `Superseded` and ends the lead; a lost
    /// answer is settled before it answers (`Written` with `resolved`, `NotWritten`,
    /// `Truncated`, or `Ambiguous` when the budget did not settle it).
    ///
    /// # Errors
    /// As [`AsyncJournals::write_single`].
    pub async fn write(&mut self, records: &[impl AsRef<[u8]>]) -> Result<WriterOutcome, JournalError> {
        let (journals, session) = self.parts();
        calls::write_at_tail(&mut &*journals, session, records).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Ready = fn(Duration) -> std::future::Ready<()>;

    /// The journal futures are `Send` with a `Send` sleep, so they can be spawned on a
    /// multi-threaded executor (checked by the compiler; nothing runs).
    #[test]
    fn journal_futures_are_send() {
        fn send<T: Send>(_: &T) {}
        fn check(j: &AsyncJournals<Ready>, w: &mut AsyncJournalWriter<Ready>) {
            let id = JournalId { tenant: 1, journal: 1 };
            send(&j.write_single(id, LeaderUuid(1), 0, &[b"x"]));
            send(&j.resolve(id, LeaderUuid(1), 0, &[b"x"]));
            send(&j.read(id, 0, 0, 0));
            send(&j.show(&"a/b".parse().unwrap()));
            send(&w.claim());
        }
        let _ = check as fn(&AsyncJournals<Ready>, &mut AsyncJournalWriter<Ready>);
        let c = AsyncJournalsConfig::default();
        assert_eq!((c.request_timeout, c.read_timeout, c.retry_budget), (Duration::from_secs(5), Duration::from_secs(5), 4));
        assert_eq!((c.retry_backoff, c.busy_backoff), (Duration::from_millis(100), Duration::from_millis(20)));
    }
}
