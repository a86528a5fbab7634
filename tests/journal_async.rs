//! The journal calls of the async client (`AsyncJournals`, `AsyncJournalWriter`) against a
//! real `tephra-server` process on loopback: the seed's sequence diagram on glommio (claim,
//! write, duplicate retry, refused stale leader, supersession, truncate, a read waiting at the
//! tail that wakes when a record lands), many writers on a multi-writer journal, unknown
//! journals and names, the write limits, and ambiguous writes settled by `resolve`: answers
//! and requests lost on purpose by a stream that cuts them, and a server killed and restarted.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use async_executor::LocalExecutor;
use async_io::Timer;
use futures_lite::{future, AsyncRead, AsyncWrite};
use support::Server;
use tephra::client::async_client::{AsyncClient, AsyncClientConfig, AsyncJournalWriter, AsyncJournals, AsyncJournalsConfig, Connector, Sleep, TcpConnector};
use tephra::client::journal::{
    write_call, ClaimOutcome, CreateOutcome, DeleteOutcome, JournalError, JournalRef, ListOutcome, NameError, ReadOutcome, Resolution, SetLeaderOutcome,
    TruncateOutcome, WriteOutcome, WriterOutcome,
};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability, View};
use tephra::proto::journal::JournalOutcome;
use tephra_test_support as support;

const A: LeaderUuid = LeaderUuid(0xa);
const B: LeaderUuid = LeaderUuid(0xb);

fn server_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

/// async-io's timer as the handle's sleep.
async fn timer(d: Duration) {
    Timer::after(d).await;
}

/// Runs `body` on an executor of its own over async-io's reactor, failing the test after
/// 60 s. The executor, and every task left on it (the clients' drivers), goes at the end.
fn run<T>(body: impl AsyncFnOnce(&LocalExecutor<'static>) -> T) -> T {
    let ex = LocalExecutor::new();
    let limit = async {
        Timer::after(Duration::from_secs(60)).await;
        panic!("test timed out");
    };
    async_io::block_on(ex.run(future::or(body(&ex), limit)))
}

/// Starts a server with `env` and runs `body` with its address, as [`run`] does.
fn with_server<T>(env: &[(&str, &str)], body: impl AsyncFnOnce(&LocalExecutor<'static>, SocketAddr) -> T) -> T {
    let server = Server::start(&server_bin(), env);
    run(async |ex| body(ex, server.addr).await)
}

fn config(bulk_connections: usize) -> AsyncClientConfig {
    AsyncClientConfig { bulk_connections, ..AsyncClientConfig::default() }
}

/// A client over plain TCP (the library's async-io connector) with `bulk` bulk sockets; its
/// driver is spawned on `ex`.
async fn client(ex: &LocalExecutor<'static>, addr: SocketAddr, bulk: usize) -> AsyncClient {
    let (client, driver) = AsyncClient::connect_with(TcpConnector::new(addr).unwrap(), config(bulk)).await.unwrap();
    ex.spawn(driver).detach();
    client
}

/// A handle with the default settings and async-io's timer.
fn handle(client: AsyncClient) -> AsyncJournals<impl Sleep + Clone + 'static> {
    AsyncJournals::new(client, timer, AsyncJournalsConfig::default())
}

/// Creates `acme/NAME`, ordered.
async fn create(j: &AsyncJournals<impl Sleep>, name: &str, mode: Mode) -> JournalId {
    match j.create("acme", name, mode, StoreDurability::Ordered).await.unwrap() {
        CreateOutcome::Created { id } => id,
        other => panic!("create {name}: {other:?}"),
    }
}

fn view(leader: Option<LeaderUuid>, next_seq: u64, first_seq: u64) -> View {
    View { leader, next_seq, first_seq }
}

fn records(read: ReadOutcome) -> Vec<Vec<u8>> {
    match read {
        ReadOutcome::Page { records, .. } => records,
        other => panic!("not a page: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// A stream that loses what it is told to.

/// Nothing is lost.
const PASS: u8 = 0;
/// The next bytes the server sends (the answer to the request in flight) are dropped and the
/// stream ends: the request reached the server, its answer is lost.
const LOSE_ANSWER: u8 = 1;
/// The next request is swallowed and the stream ends: nothing reached the server.
const LOSE_REQUEST: u8 = 2;
/// The next response frame is dropped and the stream goes on: the call waits for an answer
/// that never comes, until its timeout.
const SWALLOW_ANSWER: u8 = 3;
/// Ended.
const ENDED: u8 = 4;

/// Arms a [`Cut`] (shared by the test and the stream). Arm it only while no call is in
/// flight, so that the next bytes each way start a frame.
#[derive(Clone, Default)]
struct Arm(Arc<AtomicU8>);

impl Arm {
    fn set(&self, what: u8) {
        self.0.store(what, Ordering::SeqCst);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A client stream that passes bytes through until armed.
struct Cut<S> {
    io: S,
    arm: Arm,
    /// Response bytes still to drop: the frame prefix read so far, then the body left.
    prefix: Vec<u8>,
    body_left: usize,
    dropping: bool,
}

impl<S: AsyncRead + Unpin> AsyncRead for Cut<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if this.arm.get() == ENDED {
                return Poll::Ready(Ok(0));
            }
            let n = ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            match this.arm.get() {
                LOSE_ANSWER => {
                    this.arm.set(ENDED);
                    return Poll::Ready(Ok(0));
                }
                SWALLOW_ANSWER => {
                    this.arm.set(PASS);
                    this.dropping = true;
                }
                _ => {}
            }
            // Drop the bytes of the swallowed frame; keep the rest, in place.
            let mut at = 0;
            while this.dropping && at < n {
                if this.prefix.len() < 4 {
                    this.prefix.push(buf[at]);
                    at += 1;
                    if this.prefix.len() == 4 {
                        this.body_left = u32::from_be_bytes(this.prefix[..].try_into().unwrap()) as usize;
                    }
                } else {
                    let take = this.body_left.min(n - at);
                    at += take;
                    this.body_left -= take;
                }
                if this.prefix.len() == 4 && this.body_left == 0 {
                    this.dropping = false;
                    this.prefix.clear();
                }
            }
            if at < n {
                buf.copy_within(at..n, 0);
                return Poll::Ready(Ok(n - at));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cut<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.arm.get() {
            LOSE_REQUEST => {
                this.arm.set(ENDED);
                // The reader must see the end now: nothing will come from the server.
                cx.waker().wake_by_ref();
                Poll::Ready(Ok(buf.len()))
            }
            ENDED => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            _ => Pin::new(&mut this.io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_close(cx)
    }
}

/// A client with one socket (reads share it) through a [`Cut`], and the cut's arm.
async fn cut_client(ex: &LocalExecutor<'static>, addr: SocketAddr) -> (AsyncClient, Arm) {
    let arm = Arm::default();
    let for_stream = arm.clone();
    let tcp = TcpConnector::new(addr).unwrap();
    let connect = move || {
        let (tcp, arm) = (tcp.clone(), for_stream.clone());
        async move { Ok(Cut { io: tcp.connect().await?, arm, prefix: Vec::new(), body_left: 0, dropping: false }) }
    };
    let (client, driver) = AsyncClient::connect_with(connect, config(0)).await.unwrap();
    ex.spawn(driver).detach();
    (client, arm)
}

/// A handle on a fresh single-writer journal `acme/orders` that A leads.
async fn led_by_a(ex: &LocalExecutor<'static>, addr: SocketAddr) -> (AsyncJournals<impl Sleep + Clone + 'static>, JournalId) {
    let j = handle(client(ex, addr, 1).await);
    let id = create(&j, "orders", Mode::Single).await;
    assert_eq!(j.set_leader(id, A, None).await.unwrap(), SetLeaderOutcome::Won { state: view(Some(A), 0, 0) });
    (j, id)
}

/// Gives `j` a new client through a [`Cut`] armed with `lose` (`LOSE_ANSWER` or
/// `LOSE_REQUEST`), and sends the write `call` through it: `Ambiguous`, and the client is dead.
async fn lose_a_write<S: Sleep>(
    ex: &LocalExecutor<'static>,
    addr: SocketAddr,
    j: &mut AsyncJournals<S>,
    lose: u8,
    write: impl AsyncFnOnce(&AsyncJournals<S>) -> WriteOutcome,
) {
    let (cut, arm) = cut_client(ex, addr).await;
    j.set_client(cut);
    arm.set(lose);
    assert_eq!(write(j).await, WriteOutcome::Ambiguous);
}

// ---------------------------------------------------------------------------------------
// The tests.

/// A glommio socket to `addr` (the stream of the glommio test's connector).
// A user's glommio socket, which the runtime boundary (clippy.toml) otherwise keeps inside the
// shards crate (its listener side only).
#[allow(clippy::disallowed_types)]
async fn glommio_tcp(addr: SocketAddr) -> io::Result<glommio::net::TcpStream> {
    let s = glommio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// The seed's sequence diagram through the async API, on a glommio executor of the test's
/// own (started by the shards crate, with its timer as the sleep): claims, writes, a
/// duplicate retry, a refused stale leader, the superseded writer stopping, a truncate, and a
/// read waiting at the tail that a write wakes.
#[test]
fn the_seeds_sequence_diagram_on_glommio() {
    let server = Server::start(&server_bin(), &[]);
    let addr = server.addr;
    let ex = shards::spawn_executor("journal-async-test", None, move || async move {
        let (client, driver) = AsyncClient::connect_with(move || glommio_tcp(addr), config(1)).await.unwrap();
        shards::spawn(driver).detach();
        let j = AsyncJournals::new(client, shards::sleep, AsyncJournalsConfig::default());
        let id = create(&j, "orders", Mode::Single).await;
        assert_eq!(j.resolve_name(&"acme/orders".parse().unwrap()).await.unwrap(), id);

        // A claims and writes r0 r1 at 0.
        let mut a = AsyncJournalWriter::new(j.clone(), id, A);
        assert_eq!(a.claim().await.unwrap(), ClaimOutcome::Won { state: view(Some(A), 0, 0) });
        let w = a.write(&[b"r0", b"r1"]).await.unwrap();
        assert_eq!(w, WriterOutcome::Written { seq: 0, count: 2, duplicate: false, resolved: false, state: Some(view(Some(A), 2, 0)) });
        assert_eq!(a.next_seq(), Some(2));

        // B takes over; A's next write is refused naming B, and A stops.
        let mut b = AsyncJournalWriter::new(j.clone(), id, B);
        assert_eq!(b.claim().await.unwrap(), ClaimOutcome::Won { state: view(Some(B), 2, 0) });
        assert_eq!(a.write(&[b"r2"]).await.unwrap(), WriterOutcome::Superseded { state: view(Some(B), 2, 0) });
        assert_eq!(a.next_seq(), None);
        assert_eq!(a.write(&[b"r2"]).await.unwrap(), WriterOutcome::NotOwner, "nothing is sent once superseded");
        let w = b.write(&[b"r2'"]).await.unwrap();
        assert!(matches!(w, WriterOutcome::Written { seq: 2, count: 1, duplicate: false, .. }), "{w:?}");

        // The exact retry of A's accepted write is a duplicate, even now; anything else from A
        // is refused with the current leader.
        let dup = j.write_single(id, A, 0, &[b"r0", b"r1"]).await.unwrap();
        assert_eq!(dup, WriteOutcome::Written { seq: 0, count: 2, duplicate: true, state: view(Some(B), 3, 0) });
        assert_eq!(j.write_single(id, A, 3, &[b"x"]).await.unwrap(), WriteOutcome::Refused { state: view(Some(B), 3, 0) });
        assert_eq!(j.set_leader(id, A, Some(A)).await.unwrap(), SetLeaderOutcome::Lost { state: view(Some(B), 3, 0) });

        // Truncate: fenced by the leader; never lowers first_seq.
        assert_eq!(j.truncate(id, 1, Some(A)).await.unwrap(), TruncateOutcome::Refused { state: view(Some(B), 3, 0) });
        assert_eq!(j.truncate(id, 1, Some(B)).await.unwrap(), TruncateOutcome::Applied { state: view(Some(B), 3, 1) });
        assert_eq!(j.truncate(id, 0, Some(B)).await.unwrap(), TruncateOutcome::Applied { state: view(Some(B), 3, 1) });
        assert_eq!(j.read(id, 0, 0, 0).await.unwrap(), ReadOutcome::Truncated { state: view(Some(B), 3, 1) });
        assert_eq!(records(j.read(id, 1, 0, 0).await.unwrap()), [b"r1".to_vec(), b"r2'".to_vec()]);

        // A read at the tail waits, and a write ends the wait: the read goes on the bulk
        // socket while the write goes on the control socket.
        let started = Instant::now();
        let (read, written) = future::zip(j.read(id, 3, 0, 1000), async {
            shards::sleep(Duration::from_millis(100)).await;
            b.write(&[b"r3"]).await.unwrap()
        })
        .await;
        let waited = started.elapsed();
        assert!(matches!(written, WriterOutcome::Written { seq: 3, .. }), "{written:?}");
        assert_eq!(records(read.unwrap()), [b"r3".to_vec()]);
        assert!(waited < Duration::from_millis(900), "the wait ended when the record landed, not at its end: {waited:?}");

        // A claims again: a fresh uuid (a uuid leads one term), and it wins against B.
        let claimed = a.claim().await.unwrap();
        assert_ne!(a.leader(), A);
        assert_eq!(claimed, ClaimOutcome::Won { state: view(Some(a.leader()), 4, 1) });
        assert!(matches!(a.write(&[b"r4"]).await.unwrap(), WriterOutcome::Written { seq: 4, .. }));
    });
    ex.unwrap().join().expect("the glommio executor ran the test to its end");
}

/// Many writers on one multi-writer journal: every write is accepted once, at dense seqs, and
/// each acknowledged seq holds the record written; the single-writer calls get `WrongMode`.
#[test]
fn many_writers_on_a_multi_writer_journal() {
    with_server(&[], async |ex, addr| {
        let j = handle(client(ex, addr, 2).await);
        let id = create(&j, "events", Mode::Multi).await;
        let tasks: Vec<_> = (0..64u32)
            .map(|i| {
                let j = j.clone();
                ex.spawn(async move { (i, j.write_multi(id, &[format!("w{i}")]).await.unwrap()) })
            })
            .collect();
        let mut at = std::collections::BTreeMap::new();
        for t in tasks {
            match t.await {
                (i, WriteOutcome::Written { seq, count: 1, duplicate: false, .. }) => assert!(at.insert(seq, format!("w{i}")).is_none(), "seq {seq} twice"),
                (i, other) => panic!("write {i}: {other:?}"),
            }
        }
        assert_eq!(at.keys().copied().collect::<Vec<_>>(), (0..64).collect::<Vec<_>>(), "dense seqs");
        let mut from = 0;
        while from < 64 {
            let page = j.read(id, from, 0, 0).await.unwrap();
            for r in records(page) {
                assert_eq!(String::from_utf8(r).unwrap(), at[&from]);
                from += 1;
            }
        }
        // The other mode's calls.
        let state = view(None, 64, 0);
        assert_eq!(j.write_single(id, A, 64, &[b"x"]).await.unwrap(), WriteOutcome::WrongMode { state });
        assert_eq!(j.set_leader(id, A, None).await.unwrap(), SetLeaderOutcome::WrongMode);
        assert_eq!(AsyncJournalWriter::new(j.clone(), id, A).claim().await.unwrap(), ClaimOutcome::WrongMode);
        assert_eq!(j.truncate(id, 10, None).await.unwrap(), TruncateOutcome::Applied { state: view(None, 64, 10) });
    });
}

/// Unknown journals and names, the write limits, and the directory calls.
#[test]
fn unknown_journals_limits_and_the_directory() {
    with_server(&[("PAROS_MAX_BATCH_RECORDS", "2"), ("PAROS_MAX_BATCH_BYTES", "100")], async |ex, addr| {
        let j = handle(client(ex, addr, 1).await);
        let id = create(&j, "orders", Mode::Single).await;
        assert_eq!(j.set_leader(id, A, None).await.unwrap(), SetLeaderOutcome::Won { state: view(Some(A), 0, 0) });

        // Over the limits: both limits named, nothing logged.
        let big = j.write_single(id, A, 0, &[b"a", b"b", b"c"]).await.unwrap();
        assert_eq!(big, WriteOutcome::TooLarge { max_records: 2, max_bytes: 100 });
        let big = j.write_single(id, A, 0, &[[0u8; 101]]).await.unwrap();
        assert_eq!(big, WriteOutcome::TooLarge { max_records: 2, max_bytes: 100 });
        assert_eq!(j.read(id, 0, 0, 0).await.unwrap(), ReadOutcome::Page { from: 0, records: vec![], state: view(Some(A), 0, 0) });

        // Unknown journals, by id and by name.
        let unknown = JournalId { tenant: id.tenant, journal: id.journal ^ 1 };
        for zero in [JournalId { tenant: 0, journal: id.journal }, JournalId { tenant: id.tenant, journal: 0 }, unknown] {
            assert_eq!(j.write_single(zero, A, 0, &[b"x"]).await.unwrap(), WriteOutcome::UnknownJournal);
            assert_eq!(j.write_multi(zero, &[b"x"]).await.unwrap(), WriteOutcome::UnknownJournal);
            assert_eq!(j.read(zero, 0, 0, 0).await.unwrap(), ReadOutcome::UnknownJournal);
        }
        assert_eq!(j.set_leader(unknown, A, None).await.unwrap(), SetLeaderOutcome::UnknownJournal);
        assert_eq!(j.truncate(unknown, 0, Some(A)).await.unwrap(), TruncateOutcome::UnknownJournal);
        assert_eq!(AsyncJournalWriter::new(j.clone(), unknown, A).claim().await.unwrap(), ClaimOutcome::UnknownJournal);
        let name: JournalRef = "acme/nope".parse().unwrap();
        assert!(matches!(j.show(&name).await, Err(JournalError::Name(NameError::Unknown(_)))));
        let name: JournalRef = "zeta/orders".parse().unwrap();
        assert!(matches!(j.resolve_name(&name).await, Err(JournalError::Name(NameError::Unknown(_)))));
        assert_eq!(j.list(Some("zeta")).await.unwrap(), ListOutcome::UnknownTenant);

        // The directory: a bad name is refused before sending, a taken one names its holder.
        assert!(matches!(j.create("acme", "a/b", Mode::Single, StoreDurability::Ordered).await, Err(JournalError::Name(NameError::Malformed(_)))));
        assert_eq!(j.create("acme", "orders", Mode::Multi, StoreDurability::Batched).await.unwrap(), CreateOutcome::NameTaken { id });
        let id_name: JournalRef = format!("id:{:016x}/{:016x}", id.tenant, id.journal).parse().unwrap();
        let shown = j.show(&id_name).await.unwrap();
        assert_eq!((shown.id, shown.name.as_str(), shown.mode, shown.state), (id, "orders", Mode::Single, view(Some(A), 0, 0)));
        match j.list(Some("acme")).await.unwrap() {
            ListOutcome::Listed(all) => assert_eq!(all.iter().map(|i| i.id).collect::<Vec<_>>(), [id]),
            other => panic!("{other:?}"),
        }
        assert_eq!(j.delete(id).await.unwrap(), DeleteOutcome::Deleted { state: view(Some(A), 0, 0) });
        assert_eq!(j.read(id, 0, 0, 0).await.unwrap(), ReadOutcome::UnknownJournal);
        assert_eq!(j.delete(id).await.unwrap(), DeleteOutcome::UnknownJournal);

        // journal_call: the raw answer, for callers that build their own calls.
        let raw = j.client().journal_call(write_call(unknown, None, 0, &[b"x"])).await.unwrap();
        assert_eq!(raw.outcome(), JournalOutcome::UnknownJournal);
    });
}

/// A write whose answer was lost is `Ambiguous`; `resolve` settles it by reading back, then
/// sending the identical write again: `Written` when the server had it (a duplicate), and,
/// once another leader took over, `NotWritten` when the request never arrived. A dead client
/// is not reconnected: its next call fails with nothing sent.
#[test]
fn ambiguous_writes_are_settled_by_resolve() {
    with_server(&[], async |ex, addr| {
        let (good, id) = led_by_a(ex, addr).await;

        // The request reached the server; its answer is lost.
        let mut j = good.clone();
        lose_a_write(ex, addr, &mut j, LOSE_ANSWER, async |j| j.write_single(id, A, 0, &[b"r0", b"r1"]).await.unwrap()).await;
        assert!(matches!(j.read(id, 0, 0, 0).await, Err(JournalError::Unreachable(_))), "the dead socket sends nothing");
        assert_eq!(j.resolve(id, A, 0, &[b"r0", b"r1"]).await, Resolution::Unresolved, "nothing answers on the dead socket");
        j.set_client(good.client().clone());
        assert_eq!(j.resolve(id, A, 0, &[b"r0", b"r1"]).await, Resolution::Written { seq: 0, count: 2 });
        assert_eq!(
            good.read(id, 0, 0, 0).await.unwrap(),
            ReadOutcome::Page { from: 0, records: vec![b"r0".to_vec(), b"r1".to_vec()], state: view(Some(A), 2, 0) }
        );

        // The request never reached the server, and B leads before it is settled.
        lose_a_write(ex, addr, &mut j, LOSE_REQUEST, async |j| j.write_single(id, A, 2, &[b"r2"]).await.unwrap()).await;
        assert_eq!(good.set_leader(id, B, Some(A)).await.unwrap(), SetLeaderOutcome::Won { state: view(Some(B), 2, 0) });
        j.set_client(good.client().clone());
        assert_eq!(j.resolve(id, A, 2, &[b"r2"]).await, Resolution::NotWritten { state: view(Some(B), 2, 0) });
        assert_eq!(good.read(id, 2, 0, 0).await.unwrap(), ReadOutcome::Page { from: 2, records: vec![], state: view(Some(B), 2, 0) });

        // A multi-writer write whose answer is lost stays ambiguous: the library never sends
        // it again (it would land twice).
        let multi = create(&good, "events", Mode::Multi).await;
        lose_a_write(ex, addr, &mut j, LOSE_ANSWER, async |j| j.write_multi(multi, &[b"m"]).await.unwrap()).await;
        assert_eq!(records(good.read(multi, 0, 0, 0).await.unwrap()), [b"m".to_vec()], "sent once");
    });
}

/// A writer session whose answers are lost but whose connection lives on: a claim whose
/// answer was lost is `Owned` on the next claim, and a write whose answer was lost is settled
/// before the session answers (`Written` with `resolved`), after which it writes on at the
/// tail.
#[test]
fn a_writer_session_settles_its_lost_answers() {
    with_server(&[], async |ex, addr| {
        let good = handle(client(ex, addr, 1).await);
        let id = create(&good, "orders", Mode::Single).await;
        let (cut, arm) = cut_client(ex, addr).await;
        let config = AsyncJournalsConfig { request_timeout: Duration::from_millis(300), ..AsyncJournalsConfig::default() };
        let j = AsyncJournals::new(cut, timer, config);
        let mut w = AsyncJournalWriter::new(j, id, A);

        // A set-leader of mine whose answer is lost: ambiguous (after the 300 ms timeout).
        // The claim then reads my uuid and owns the journal without sending anything more.
        arm.set(SWALLOW_ANSWER);
        assert_eq!(w.journals().set_leader(id, A, None).await.unwrap(), SetLeaderOutcome::Ambiguous);
        assert_eq!(w.claim().await.unwrap(), ClaimOutcome::Owned { state: view(Some(A), 0, 0) });

        // The write's answer is lost: settled by reading back and sending it again.
        arm.set(SWALLOW_ANSWER);
        let written = w.write(&[b"r0"]).await.unwrap();
        assert_eq!(written, WriterOutcome::Written { seq: 0, count: 1, duplicate: false, resolved: true, state: None });
        assert_eq!(w.next_seq(), Some(1));
        let w1 = w.write(&[b"r1"]).await.unwrap();
        assert!(matches!(w1, WriterOutcome::Written { seq: 1, count: 1, resolved: false, .. }), "{w1:?}");
        assert_eq!(records(good.read(id, 0, 0, 0).await.unwrap()), [b"r0".to_vec(), b"r1".to_vec()], "each write once");
    });
}

/// A server SIGKILLed after taking a write whose answer was lost, then restarted: a new
/// client settles the write as `Written`, and the record is there once. A write that never
/// reached the killed server is sent again by `resolve` (the writer still leads) and lands.
#[test]
fn a_write_settled_across_a_killed_and_restarted_server() {
    let mut server = Server::start(&server_bin(), &[]);
    let addr = server.addr;
    let (id, j) = run(async |ex| {
        let (mut j, id) = led_by_a(ex, addr).await;
        lose_a_write(ex, addr, &mut j, LOSE_ANSWER, async |j| j.write_single(id, A, 0, &[b"r0"]).await.unwrap()).await;
        lose_a_write(ex, addr, &mut j, LOSE_REQUEST, async |j| j.write_single(id, A, 1, &[b"r1"]).await.unwrap()).await;
        (id, j)
    });
    server.kill();
    server.restart(&server_bin(), &[]);
    let restarted = server.addr;
    run(async |ex| {
        let mut j = j;
        j.set_client(client(ex, restarted, 1).await);
        assert_eq!(j.resolve(id, A, 0, &[b"r0"]).await, Resolution::Written { seq: 0, count: 1 });
        assert_eq!(j.resolve(id, A, 1, &[b"r1"]).await, Resolution::Written { seq: 1, count: 1 });
        assert_eq!(
            j.read(id, 0, 0, 0).await.unwrap(),
            ReadOutcome::Page { from: 0, records: vec![b"r0".to_vec(), b"r1".to_vec()], state: view(Some(A), 2, 0) }
        );
    });
}
