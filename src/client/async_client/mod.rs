//! The pipelined, runtime-agnostic async client (docs/protocol.md §13.3).
//!
//! [`AsyncClient`] keeps many requests in flight on each socket and demultiplexes the
//! responses by request id. It brings no executor and no timer: it is written against the
//! `futures-io` traits, and [`AsyncClient::connect_with`] hands back, next to the client, a
//! [`Driver`] future that does all the socket I/O. Spawn that on your executor (glommio,
//! smol, async-std, tokio through `tokio-util`'s `compat`, ...) and use the client from any
//! task.
//!
//! # Sockets
//! One **control** socket carries appends and stats; `bulk_connections` **bulk** sockets
//! (default 4) carry reads and subscriptions, assigned round-robin. With
//! `bulk_connections = 0` everything shares the control socket. Every socket is opened by
//! your [`Connector`] and performs its own Hello (request id 1, with the configured token);
//! its requests then use ids 2, 3, ... (never 0, never the Hello's).
//!
//! # Flow control
//! - At most `max_inflight_requests` requests are in flight per socket: a call waits for a
//!   permit, held until its answer arrives (or, for a stream, until it ends or is dropped).
//! - Encoded requests wait in a queue of `request_queue_depth` frames per socket: a call
//!   waits for room.
//! - Cancels (sent when an unfinished stream is dropped) bypass both and are sent first.
//! - Responses are buffered per request without bound: a stream that is not polled keeps
//!   receiving. Drop streams you no longer read.
//!
//! # Journals
//! [`AsyncClient::journal_call`] sends one journal call; [`AsyncJournals`] and
//! [`AsyncJournalWriter`] make the journal calls with the typed outcomes of the blocking
//! client (docs/journals.md §8).
//!
//! # Failures
//! No retries and no reconnects. When a socket fails, every request pending on it fails
//! with the reason, and so does every later request on it: the last id-0 error the server
//! sent before closing (docs/protocol.md §11) as [`ClientError::Server`], else
//! [`ClientError::UnexpectedEof`] for a close, [`ClientError::Io`] for a transport error,
//! [`ClientError::Frame`] for an over-long or torn frame, or [`ClientError::Protocol`].
//! The other sockets keep working.
//!
//! ```ignore
//! use futures_lite::StreamExt;
//! use tephra::client::async_client::{AsyncClient, AsyncClientConfig, TcpConnector};
//! use tephra::{Position, Query};
//!
//! async_io::block_on(async {
//!     let ex = async_executor::LocalExecutor::new();
//!     let connector = TcpConnector::new("127.0.0.1:9000")?; // feature `async-io`
//!     let (client, driver) = AsyncClient::connect_with(connector, AsyncClientConfig::default()).await?;
//!     ex.spawn(driver).detach();
//!     ex.run(async {
//!         let mut events = client.read(Query::all(), Position::ZERO, Some(10));
//!         while let Some(e) = events.next().await {
//!             println!("{}", e?.position);
//!         }
//!         Ok(())
//!     })
//!     .await
//! })
//! ```

mod connection;
mod connector;
mod journal;
mod streams;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use prost::Message;

use self::connection::{new_connection, ConnHandle, Delivery};
use crate::client::{AppendResult, ClientError, SequencedEvent, Stats};
use crate::event::Event;
use crate::model::{AppendCondition, Position, Query};
use crate::proto::journal::{journal_request::Call, JournalRequest, JournalResponse};
use crate::proto::{self, convert, request, response, FrameDecoder, FrameError, Request, Response};

pub use self::connection::Connection;
#[cfg(feature = "async-io")]
pub use self::connector::TcpConnector;
pub use self::connector::{Connector, TlsConnector};
pub use self::journal::{AsyncJournalWriter, AsyncJournals, AsyncJournalsConfig, Sleep};
pub use self::streams::{AsyncReadStream, AsyncSubscribeStream};

/// The request id of every socket's Hello; requests count up from the next one.
const HELLO_ID: u64 = 1;

/// Settings of an [`AsyncClient`]. `Default` gives the values noted on each field.
#[derive(Clone, PartialEq, Eq)]
pub struct AsyncClientConfig {
    /// Bearer token sent in every socket's Hello (default `None`).
    pub auth_token: Option<String>,
    /// Bulk sockets for reads and subscriptions, besides the control socket (default 4;
    /// 0 = everything on the control socket).
    pub bulk_connections: usize,
    /// Requests in flight per socket, streams included (default 1024; at least 1).
    pub max_inflight_requests: usize,
    /// Cap on a frame body in both directions, in bytes (default 16 MiB). Larger requests
    /// fail with [`ClientError::Frame`] before anything is sent; a larger response fails
    /// its socket.
    pub max_frame_len: u32,
    /// Encoded requests queued per socket ahead of its driver, in frames (default 256; at
    /// least 1).
    pub request_queue_depth: usize,
}

impl Default for AsyncClientConfig {
    fn default() -> Self {
        AsyncClientConfig {
            auth_token: None,
            bulk_connections: 4,
            max_inflight_requests: 1024,
            max_frame_len: proto::DEFAULT_MAX_FRAME_LEN,
            request_queue_depth: 256,
        }
    }
}

impl std::fmt::Debug for AsyncClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClientConfig")
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<redacted>"))
            .field("bulk_connections", &self.bulk_connections)
            .field("max_inflight_requests", &self.max_inflight_requests)
            .field("max_frame_len", &self.max_frame_len)
            .field("request_queue_depth", &self.request_queue_depth)
            .finish()
    }
}

/// A pipelined client over one control socket and a pool of bulk sockets. See the
/// [module docs](self).
///
/// Cheap to clone (one `Arc`); `Send + Sync`; every method takes `&self`. The futures of
/// [`append`](Self::append), [`stats`](Self::stats) and [`read_all`](Self::read_all) own
/// what they need (`'static`, `Send`), so they can be spawned. The sockets close once the
/// last clone, and every stream and call made from it, has been dropped.
#[derive(Clone)]
pub struct AsyncClient {
    inner: Arc<Inner>,
}

struct Inner {
    control: ConnHandle,
    bulk: Vec<ConnHandle>,
    next_bulk: AtomicUsize,
    server_version: String,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient").field("server_version", &self.inner.server_version).field("sockets", &self.socket_count()).finish()
    }
}

/// The I/O of every socket of an [`AsyncClient`]: a future to spawn on your executor.
///
/// Polling it drives all the sockets; it completes once every socket's [`Connection`] has.
/// To spread the sockets over several tasks (or threads, when the stream is `Send`), split
/// it with [`into_connections`](Self::into_connections) and spawn each. Dropping it fails
/// every pending and later request of the client.
#[derive(Debug)]
pub struct Driver<S> {
    connections: Vec<Option<Connection<S>>>,
}

impl<S> Driver<S> {
    /// One driver per socket, control socket first.
    pub fn into_connections(self) -> Vec<Connection<S>> {
        self.connections.into_iter().flatten().collect()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for Driver<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut live = false;
        for slot in &mut this.connections {
            if let Some(conn) = slot {
                match Pin::new(conn).poll(cx) {
                    Poll::Ready(_) => *slot = None,
                    Poll::Pending => live = true,
                }
            }
        }
        if live {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Polls every future of `futs` to completion, concurrently, keeping their order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut done = true;
        for (fut, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(outs.iter_mut().map(|o| o.take().expect("every future finished")).collect())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Opens one socket and performs its Hello.
async fn open_socket<C: Connector>(connector: &C, config: &AsyncClientConfig) -> io::Result<(C::Stream, FrameDecoder, String)> {
    let mut io = connector.connect().await?;
    let hello = Request::hello(HELLO_ID, config.auth_token.as_deref());
    let sent = async {
        proto::write_frame_async(&mut io, &hello, config.max_frame_len).await?;
        io.flush().await?;
        Ok::<_, FrameError>(())
    };
    sent.await.map_err(|e| ClientError::from(e).into_connect_error())?;
    let mut decoder = FrameDecoder::new(config.max_frame_len);
    let ack = match decoder.read_next_async(&mut io).await {
        Ok(Some(body)) => Response::decode(body).map_err(|e| ClientError::Frame(FrameError::Decode(e))),
        Ok(None) => Err(ClientError::UnexpectedEof),
        Err(e) => Err(ClientError::from(e)),
    };
    let ack = ack.and_then(|r| match r.kind {
        Some(response::Kind::Error(e)) => Err(ClientError::from_response(e)),
        Some(response::Kind::HelloAck(ack)) if r.request_id == HELLO_ID || r.request_id == 0 => Ok(ack),
        Some(kind) => Err(ClientError::unexpected(&kind, "hello_ack")),
        None => Err(ClientError::Protocol("response without a kind".into())),
    });
    let ack = ack.map_err(ClientError::into_connect_error)?;
    if ack.protocol_version != proto::PROTOCOL_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("server speaks protocol version {}, not {}", ack.protocol_version, proto::PROTOCOL_VERSION),
        ));
    }
    Ok((io, decoder, ack.server_version))
}

impl AsyncClient {
    /// Opens the control socket and `config.bulk_connections` bulk sockets, all at once,
    /// each through `connector` and each with its own Hello, and returns the client with
    /// the [`Driver`] that must be spawned for anything to move.
    ///
    /// # Errors
    /// `InvalidInput` when `max_inflight_requests` or `request_queue_depth` is 0. Then the
    /// first failure of any socket (the others are closed): the connector's error as it
    /// is; `PermissionDenied` when the server answers `UNAUTHENTICATED` (a missing or
    /// refused token); `UnexpectedEof` when it closes without answering (for example at its
    /// connection cap); `InvalidData` for any other refusal or a malformed answer.
    pub async fn connect_with<C: Connector>(connector: C, config: AsyncClientConfig) -> io::Result<(AsyncClient, Driver<C::Stream>)> {
        if config.max_inflight_requests == 0 || config.request_queue_depth == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "max_inflight_requests and request_queue_depth must be at least 1"));
        }
        let opened = join_all((0..=config.bulk_connections).map(|_| open_socket(&connector, &config)).collect()).await;
        let mut handles = Vec::with_capacity(opened.len());
        let mut connections = Vec::with_capacity(opened.len());
        let mut server_version = String::new();
        for socket in opened {
            let (io, decoder, version) = socket?;
            if server_version.is_empty() {
                server_version = version;
            }
            let (handle, conn) = new_connection(io, decoder, config.max_inflight_requests, config.request_queue_depth, config.max_frame_len, HELLO_ID + 1);
            handles.push(handle);
            connections.push(Some(conn));
        }
        let control = handles.remove(0);
        let inner = Inner { control, bulk: handles, next_bulk: AtomicUsize::new(0), server_version };
        Ok((AsyncClient { inner: Arc::new(inner) }, Driver { connections }))
    }

    /// [`connect_with`](Self::connect_with) over plain TCP (`async-io`), default settings
    /// except the token.
    ///
    /// # Errors
    /// As [`TcpConnector::new`] and [`connect_with`](Self::connect_with).
    #[cfg(feature = "async-io")]
    pub async fn connect(
        addr: impl std::net::ToSocketAddrs,
        auth_token: Option<&str>,
    ) -> io::Result<(AsyncClient, Driver<async_io::Async<std::net::TcpStream>>)> {
        let config = AsyncClientConfig { auth_token: auth_token.map(str::to_owned), ..AsyncClientConfig::default() };
        AsyncClient::connect_with(TcpConnector::new(addr)?, config).await
    }

    /// The server's version, from the control socket's HelloAck (e.g. `"0.4.4"`).
    pub fn server_version(&self) -> &str {
        &self.inner.server_version
    }

    /// How many sockets the client uses: 1 + `bulk_connections`.
    pub fn socket_count(&self) -> usize {
        1 + self.inner.bulk.len()
    }

    /// The socket for the next read or subscription.
    fn bulk(&self) -> &ConnHandle {
        if self.inner.bulk.is_empty() {
            return &self.inner.control;
        }
        let n = self.inner.next_bulk.fetch_add(1, Ordering::Relaxed);
        &self.inner.bulk[n % self.inner.bulk.len()]
    }

    /// Appends `events` as one atomic batch on the control socket, optionally guarded by
    /// `condition` (docs/protocol.md §8), and resolves once the batch is durable. Appends pipelined
    /// on the client are submitted to the server's writer in the order they were queued.
    ///
    /// # Errors
    /// [`ClientError::Server`] with `CONFLICT` / `ALREADY_EXISTS` (the condition fired;
    /// `conflict_position` is set for a durable conflict, `retryable` for a same-batch one),
    /// `AFTER_BEYOND_TIP`, `EMPTY` (no events), `TOO_LARGE`, `BAD_REQUEST`, `INTERNAL` or
    /// `SHUTDOWN`; [`ClientError::Frame`] when the request is over the frame cap (nothing
    /// sent); the socket's failure.
    pub fn append(
        &self,
        events: impl IntoIterator<Item = Event>,
        condition: Option<AppendCondition>,
    ) -> impl Future<Output = Result<AppendResult, ClientError>> + Send + 'static {
        let events: Vec<Event> = events.into_iter().collect();
        let refs: Vec<&Event> = events.iter().collect();
        let condition = condition.as_ref().map(convert::condition_to_proto);
        let call = self.inner.control.call_prepared(self.inner.control.prepare_append(&refs, condition.as_ref()));
        async move {
            match call.await? {
                response::Kind::Append(r) => Ok(AppendResult { first: Position(r.first), last: Position(r.last) }),
                other => Err(ClientError::unexpected(&other, "append")),
            }
        }
    }

    /// Fetches the server's statistics over the control socket.
    ///
    /// # Errors
    /// A server error or the socket's failure.
    pub fn stats(&self) -> impl Future<Output = Result<Stats, ClientError>> + Send + 'static {
        let call = self.inner.control.call(request::Kind::Stats(proto::StatsRequest {}));
        async move {
            match call.await? {
                response::Kind::Stats(s) => Ok(s.into()),
                other => Err(ClientError::unexpected(&other, "stats")),
            }
        }
    }

    /// One journal call (docs/journals.md §6): `call` at field 20 of a request, its answer at
    /// field 20 of the response. A read goes on the next bulk socket, every other call on the
    /// control socket: the server answers one connection's journal calls in order, and a read
    /// may wait at the tail up to its `wait_ms`. [`AsyncJournals`] is the usual way in, with
    /// typed outcomes; build calls with [`write_call`](crate::client::journal::write_call) and
    /// its siblings.
    ///
    /// # Errors
    /// [`ClientError::Frame`] when the request is over the frame cap (nothing sent); an error
    /// frame (a server that does not serve journal calls answers `BAD_REQUEST`); an answer of
    /// another kind; the socket's failure.
    pub fn journal_call(&self, call: Call) -> impl Future<Output = Result<JournalResponse, ClientError>> + Send + 'static {
        let staged = self.journal_staged(call);
        async move {
            match staged.await?? {
                response::Kind::Journal(r) => Ok(r),
                other => Err(ClientError::unexpected(&other, "journal")),
            }
        }
    }

    /// [`journal_call`](Self::journal_call) in two stages: the outer error is a request that
    /// never left, the inner result its answer or why none came.
    fn journal_staged(&self, call: Call) -> impl Future<Output = Result<Delivery, ClientError>> + Send + 'static {
        let socket = match call {
            Call::Read(_) => self.bulk(),
            _ => &self.inner.control,
        };
        socket.call_staged(socket.prepare(request::Kind::Journal(JournalRequest { call: Some(call) })))
    }

    fn start_read(&self, query: &Query, cursor: Position, limit: Option<u64>, reverse: bool) -> AsyncReadStream {
        let read = proto::ReadRequest { query: Some(convert::query_to_proto(query)), after: cursor.get(), limit, reverse };
        AsyncReadStream::new(self.bulk().clone(), read)
    }

    /// Streams the events matching `query` with position > `after`, ascending, at most
    /// `limit` of them (`None` = all), on the next bulk socket. The read is pinned to the
    /// durable tip when the server starts it; [`AsyncReadStream::watermark`] gives that tip
    /// once the stream has ended. Nothing is sent until the stream is first polled.
    pub fn read(&self, query: Query, after: Position, limit: Option<u64>) -> AsyncReadStream {
        self.start_read(&query, after, limit, false)
    }

    /// Streams the events matching `query` with position < `before`, newest first, at most
    /// `limit` of them. [`Position::MAX`] starts at the tip; [`Position::ZERO`] yields
    /// nothing.
    pub fn read_back(&self, query: Query, before: Position, limit: Option<u64>) -> AsyncReadStream {
        self.start_read(&query, before, limit, true)
    }

    /// Every event matching `query` after `after`, ascending, with the read's watermark.
    ///
    /// # Errors
    /// The first error of the read.
    pub fn read_all(&self, query: Query, after: Position) -> impl Future<Output = Result<(Vec<SequencedEvent>, Position), ClientError>> + Send + 'static {
        self.read(query, after, None).collect_all()
    }

    /// Every event matching `query` before `before`, newest first, with the watermark.
    ///
    /// # Errors
    /// The first error of the read.
    pub fn read_all_back(&self, query: Query, before: Position) -> impl Future<Output = Result<(Vec<SequencedEvent>, Position), ClientError>> + Send + 'static {
        self.read_back(query, before, None).collect_all()
    }

    /// Subscribes to `query` after `after` on the next bulk socket: the stream catches up
    /// on stored matches, then follows new commits, with [`SubEvent`](crate::client::SubEvent)
    /// `::CaughtUp` markers at the live edge. Nothing is sent until the stream is first
    /// polled; dropping it cancels the subscription.
    pub fn subscribe(&self, query: Query, after: Position) -> AsyncSubscribeStream {
        let sub = proto::SubscribeRequest { query: Some(convert::query_to_proto(&query)), after: after.get() };
        AsyncSubscribeStream::new(self.bulk().clone(), sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<AsyncClient>();
        sync::<AsyncClient>();
        send::<AsyncReadStream>();
        send::<AsyncSubscribeStream>();
        send::<Driver<futures_lite::io::Cursor<Vec<u8>>>>();
        send::<Connection<futures_lite::io::Cursor<Vec<u8>>>>();
    }

    #[test]
    fn defaults_match_the_reference() {
        let c = AsyncClientConfig::default();
        assert_eq!((c.auth_token, c.bulk_connections, c.max_inflight_requests, c.max_frame_len, c.request_queue_depth), (None, 4, 1024, 16 * 1024 * 1024, 256));
        let c = AsyncClientConfig { auth_token: Some("secret".into()), ..AsyncClientConfig::default() };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
