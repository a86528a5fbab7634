//! The native blocking client (docs/protocol.md §13.2).
//!
//! [`Client`] owns one TCP (optionally TLS) connection and keeps **one request in flight**:
//! every method takes `&mut self` and returns once the answer is in, or hands back a stream
//! that borrows the client until it is dropped. Request ids start at 1 (the Hello) and count
//! up per connection.
//!
//! Compared with the reference client:
//! - a subscription is cancelled by [`SubscribeCancel::cancel`], from any thread; the stream
//!   then sends a `CancelRequest` and ends, and the connection stays usable (frames that
//!   still arrive for an abandoned request id are skipped, docs/protocol.md §7);
//! - dropping an unfinished [`SubscribeStream`] also sends a `CancelRequest`;
//! - dropping an unfinished [`ReadStream`] sends a `CancelRequest` too (the reference's
//!   client reads on to the `ReadEnd`, however long the read).
//!
//! There are no automatic retries and no reconnects. After an I/O or framing error the
//! connection should be discarded.
//!
//! ```no_run
//! use tephra::client::{Client, SubEvent};
//! use tephra::{AppendCondition, Event, EventType, Position, Query, QueryItem, Tags};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut client = Client::connect("127.0.0.1:9000")?;
//! let tags = Tags::new(["username:alice"])?;
//! let event = Event::new(&EventType::new("Registered")?, &tags, b"{}")?;
//! // A uniqueness guard: fails with CONFLICT if any event already carries the tag.
//! let guard = AppendCondition::new(Query::item(QueryItem::with_tags(tags)));
//! let written = client.append(vec![event], Some(guard))?;
//! println!("stored at {}..={}", written.first, written.last);
//!
//! let (events, watermark) = client.read_all(Query::all(), Position::ZERO)?;
//! println!("{} events up to {watermark}", events.len());
//!
//! let (stream, cancel) = client.subscribe(Query::all(), watermark)?;
//! std::thread::spawn(move || {
//!     std::thread::sleep(std::time::Duration::from_secs(5));
//!     cancel.cancel();
//! });
//! for item in stream {
//!     match item? {
//!         SubEvent::Event(e) => println!("{}: {}", e.position, e.event.event_type()),
//!         SubEvent::CaughtUp(at) => println!("live at {at}"),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod async_client;
pub mod journal;
mod stream;
pub mod tls;
mod transport;

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use crate::event::Event;
use crate::model::{AppendCondition, Position, Query};
use crate::proto::{self, convert, request, response, ErrorCode, FrameDecoder, FrameError, Request, Response};

pub use async_client::{AsyncClient, AsyncClientConfig, AsyncReadStream, AsyncSubscribeStream};
pub use stream::{ReadStream, SubscribeStream};
use transport::Transport;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The transport failed (including a read or write timeout).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// A frame was too long (either direction), torn, or not a valid `Response`.
    #[error(transparent)]
    Frame(FrameError),
    /// The server closed the connection (cleanly, between frames) while an answer was due.
    #[error("the server closed the connection")]
    UnexpectedEof,
    /// The server sent something this client cannot accept: an unexpected response kind,
    /// an id it never used, or a malformed event.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server answered with an `ErrorResponse` (docs/protocol.md §11).
    #[error("server error {code}: {message}")]
    Server {
        /// The error code; unknown codes read as [`ErrorCode::Unspecified`].
        code: ErrorCode,
        /// The server's text.
        message: String,
        /// True only for a same-batch condition conflict, which may be retried after a
        /// re-read.
        retryable: bool,
        /// The lowest conflicting durable position, for durable conflicts.
        conflict_position: Option<Position>,
    },
}

impl From<FrameError> for ClientError {
    fn from(err: FrameError) -> Self {
        match err {
            FrameError::Io(e) => ClientError::Io(e),
            other => ClientError::Frame(other),
        }
    }
}

impl ClientError {
    /// The server's error code, if this is a [`ClientError::Server`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn from_response(e: proto::ErrorResponse) -> ClientError {
        ClientError::Server {
            code: ErrorCode::from_wire(e.code),
            message: e.message,
            retryable: e.retryable,
            conflict_position: e.conflict_position.map(Position),
        }
    }

    fn unexpected(kind: &response::Kind, wanted: &str) -> ClientError {
        let got = match kind {
            response::Kind::Append(_) => "append",
            response::Kind::ReadEvents(_) => "read_events",
            response::Kind::ReadEnd(_) => "read_end",
            response::Kind::Error(_) => "error",
            response::Kind::CaughtUp(_) => "caught_up",
            response::Kind::Stats(_) => "stats",
            response::Kind::HelloAck(_) => "hello_ack",
            response::Kind::Journal(_) => "journal",
        };
        ClientError::Protocol(format!("expected {wanted}, got a {got} response"))
    }

    /// How a failed Hello surfaces from `connect*` (docs/protocol.md §13.1): `UNAUTHENTICATED` becomes
    /// `PermissionDenied`, transport errors pass through, a close becomes `UnexpectedEof`,
    /// anything else `InvalidData`. A close or a reset before the answer says what usually
    /// causes it (docs/protocol.md §11: a server over `server.limits.max_connections` closes new
    /// connections without a frame).
    fn into_connect_error(self) -> io::Error {
        match self {
            ClientError::Io(e) => name_early_close(e, ConnectStep::Hello),
            ClientError::UnexpectedEof => io::Error::new(io::ErrorKind::UnexpectedEof, closed_before_hello(ConnectStep::Hello)),
            e @ ClientError::Server { code: ErrorCode::Unauthenticated, .. } => io::Error::new(io::ErrorKind::PermissionDenied, e),
            e @ ClientError::Frame(FrameError::Torn { .. }) => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            // A TLS record header (content type 21 = alert or 22 = handshake, version 3.x)
            // read as a frame length: a TLS server answering a plaintext Hello.
            ClientError::Frame(FrameError::TooLong { len, .. }) if crate::proto::frame::is_tls_record_prefix(len) => {
                io::Error::new(io::ErrorKind::InvalidData, "the server answered with TLS: connect with TLS (the server has tls.cert and tls.key set)")
            }
            ClientError::Frame(FrameError::TooLong { len, .. }) if crate::proto::frame::is_http_prefix(len) => {
                io::Error::new(io::ErrorKind::InvalidData, "the server answered with HTTP: not a Tephra server")
            }
            e => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// An event with its log position, as returned by reads and subscriptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequencedEvent {
    /// The event's 1-based position.
    pub position: Position,
    /// The event (tags sorted).
    pub event: Event,
}

impl SequencedEvent {
    /// The event's position.
    pub fn position(&self) -> Position {
        self.position
    }

    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event, by value.
    pub fn into_event(self) -> Event {
        self.event
    }

    fn from_proto(se: proto::SequencedEvent) -> Result<SequencedEvent, ClientError> {
        let (position, event) = convert::sequenced_from_proto(se).map_err(|e| ClientError::Protocol(format!("malformed event from the server: {e}")))?;
        Ok(SequencedEvent { position, event })
    }
}

/// The positions assigned to a successful append: a dense, inclusive range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppendResult {
    /// First assigned position.
    pub first: Position,
    /// Last assigned position.
    pub last: Position,
}

/// What a subscription yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubEvent {
    /// A matching event.
    Event(SequencedEvent),
    /// The subscription reached the live edge; the position is its cursor (docs/protocol.md §8).
    /// Sent at most once per live edge; watermarks never decrease.
    CaughtUp(Position),
}

/// Server statistics (docs/protocol.md §12).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Durable head position (= event count).
    pub event_count: u64,
    /// `*.log` files at the top of the data directory.
    pub segment_count: u64,
    /// Bytes of the regular files at the top of the data directory.
    pub disk_bytes: u64,
    /// Seconds since the server started serving.
    pub uptime_seconds: u64,
    /// Open connections, this one included.
    pub active_connections: u64,
    /// Live subscriptions, server-wide.
    pub active_subscriptions: u64,
    /// The server's version string.
    pub version: String,
    /// Connections refused at the connection cap.
    pub connections_refused: u64,
    /// The connection cap (0 = unlimited).
    pub max_connections: u64,
    /// Connections closed by a timeout.
    pub connections_reaped: u64,
    /// Why the writer stopped accepting appends (fail-stop, until the server restarts); empty
    /// while it writes, and always empty from a server that does not send it (the reference).
    pub writer_stopped: String,
}

impl From<proto::StatsResponse> for Stats {
    fn from(s: proto::StatsResponse) -> Stats {
        Stats {
            event_count: s.event_count,
            segment_count: s.segment_count,
            disk_bytes: s.disk_bytes,
            uptime_seconds: s.uptime_seconds,
            active_connections: s.active_connections,
            active_subscriptions: s.active_subscriptions,
            version: s.version,
            connections_refused: s.connections_refused,
            max_connections: s.max_connections,
            connections_reaped: s.connections_reaped,
            writer_stopped: s.writer_stopped,
        }
    }
}

/// How long a TLS handshake may take in total, and how long each socket call may block
/// during it.
const TLS_HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
const TLS_HANDSHAKE_POLL: Duration = Duration::from_secs(1);

/// A blocking connection to a Tephra server. See the [module docs](self).
pub struct Client {
    io: Transport,
    decoder: FrameDecoder,
    out: Vec<u8>,
    next_id: u64,
    max_frame_len: u32,
    server_version: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.io.tcp().peer_addr().ok())
            .field("tls", &matches!(self.io, Transport::Tls(_)))
            .field("next_id", &self.next_id)
            .field("server_version", &self.server_version)
            .finish()
    }
}

/// A TLS handshake error, with a hint where the usual cause is known: a server that answers
/// in plaintext makes rustls see an unknown record type; a server whose certificate is a CA
/// certificate is refused as `CaUsedAsEndEntity`.
fn tls_hint(e: io::Error) -> io::Error {
    if tls::answered_without_tls(&e) {
        return io::Error::new(io::ErrorKind::InvalidData, "the server answered in plaintext, not TLS (connect without TLS?)".to_owned());
    }
    // webpki's CaUsedAsEndEntity reaches us only inside rustls's catch-all
    // `CertificateError::Other`, so its name is all there is to match.
    if e.to_string().contains("CaUsedAsEndEntity") {
        return io::Error::new(
            io::ErrorKind::InvalidData,
            "the server's certificate was refused: it is a CA certificate presented as the server's own; give the server a certificate issued by that CA (tls.cert) and trust the CA here".to_owned(),
        );
    }
    name_early_close(e, ConnectStep::TlsHandshake)
}

/// The step of a connect that the server cut short, for [`closed_before_hello`] and
/// [`name_early_close`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectStep {
    /// The TLS handshake (a TLS connection's first step, before the Hello).
    TlsHandshake,
    /// The Hello: sent or being sent, its HelloAck not yet received.
    Hello,
}

/// What a connection closed or reset during `step` usually means: "the server closed the
/// connection before answering the Hello (a server at its connection limit, ...; so do a
/// TLS server reached without TLS and a server whose `server.max_frame_len` is too small for
/// its answer)", or
/// "... during the TLS handshake (...)". docs/protocol.md §11: a server over
/// `server.limits.max_connections` closes new connections without a frame, and a TLS server
/// does so before its handshake is done.
pub fn closed_before_hello(step: ConnectStep) -> String {
    let (when, also) = match step {
        ConnectStep::TlsHandshake => ("during the TLS handshake", ""),
        // A TLS server reads a plaintext Hello as a failed handshake and closes.
        ConnectStep::Hello => {
            ("before answering the Hello", "; so do a TLS server reached without TLS and a server whose server.max_frame_len is too small for its answer")
        }
    };
    format!("the server closed the connection {when} (a server at its connection limit, server.limits.max_connections, closes new connections this way{also})")
}

/// `e`, from a connect's `step`, with [`closed_before_hello`] in front when it is a close or
/// a reset (`UnexpectedEof`, `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`); any other
/// error is returned unchanged. The kind is kept.
pub fn name_early_close(e: io::Error, step: ConnectStep) -> io::Error {
    use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe) {
        return io::Error::new(e.kind(), format!("{}: {e}", closed_before_hello(step)));
    }
    e
}

fn dial(addr: impl ToSocketAddrs) -> io::Result<TcpStream> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// [`dial`] where each address tried gets `timeout` to connect, and the socket's reads and
/// writes are then bounded by `timeout` too.
fn dial_within(addr: impl ToSocketAddrs, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(tcp) => {
                tcp.set_nodelay(true)?;
                tcp.set_read_timeout(Some(timeout))?;
                tcp.set_write_timeout(Some(timeout))?;
                return Ok(tcp);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the address resolved to nothing")))
}

impl Client {
    /// Connects over plain TCP and performs the Hello without a token.
    ///
    /// # Errors
    /// The dial's I/O error, or a failed Hello mapped as described for
    /// [`connect_with`](Self::connect_with).
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Client> {
        Client::connect_with(addr, None)
    }

    /// Connects over plain TCP (with `TCP_NODELAY`) and performs the Hello, carrying
    /// `auth_token` when given (docs/protocol.md §6).
    ///
    /// # Errors
    /// Transport errors as they are; `PermissionDenied` when the server answers
    /// `UNAUTHENTICATED`; `UnexpectedEof` when it closes without answering (for example at
    /// its connection cap); `InvalidData` for any other refusal (such as a version
    /// mismatch) or a malformed answer.
    pub fn connect_with(addr: impl ToSocketAddrs, auth_token: Option<&str>) -> io::Result<Client> {
        Client::handshake(Transport::Plain(dial(addr)?), auth_token)
    }

    /// [`connect_with`](Self::connect_with) bounded by `timeout`: the TCP connect (per
    /// address), the Hello's write and its answer each get `timeout`, and the client keeps it
    /// for every later call ([`set_timeout`](Self::set_timeout)). A server that accepts but
    /// never answers fails the connect instead of hanging it.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with); a timeout is `TimedOut` or `WouldBlock`. A
    /// zero `timeout` is refused (`InvalidInput`).
    pub fn connect_within(addr: impl ToSocketAddrs, auth_token: Option<&str>, timeout: Duration) -> io::Result<Client> {
        Client::handshake(Transport::Plain(dial_within(addr, timeout)?), auth_token)
    }

    /// [`connect_tls_with`](Self::connect_tls_with) bounded by `timeout` as
    /// [`connect_within`](Self::connect_within) is; the TLS handshake gets at most `timeout`
    /// (and never more than its usual 10 s).
    ///
    /// # Errors
    /// As [`connect_tls_with`](Self::connect_tls_with) and [`connect_within`](Self::connect_within).
    pub fn connect_tls_within(
        addr: impl ToSocketAddrs,
        server_name: &str,
        tls_config: Arc<rustls::ClientConfig>,
        auth_token: Option<&str>,
        timeout: Duration,
    ) -> io::Result<Client> {
        Client::tls(dial_within(addr, timeout)?, server_name, tls_config, auth_token, Some(timeout))
    }

    /// Connects over TLS (implicit: the TLS handshake comes first, docs/protocol.md §3), verifying
    /// the certificate for `server_name`, then performs the Hello without a token.
    ///
    /// # Errors
    /// As [`connect_tls_with`](Self::connect_tls_with).
    pub fn connect_tls(addr: impl ToSocketAddrs, server_name: &str, tls_config: Arc<rustls::ClientConfig>) -> io::Result<Client> {
        Client::connect_tls_with(addr, server_name, tls_config, None)
    }

    /// Connects over TLS and performs the Hello with an optional token. The TLS handshake
    /// is bounded at 10 s in total.
    ///
    /// # Errors
    /// `InvalidInput` for an unusable `server_name`; `TimedOut` when the handshake takes
    /// too long; the TLS or transport error; then as [`connect_with`](Self::connect_with).
    pub fn connect_tls_with(
        addr: impl ToSocketAddrs,
        server_name: &str,
        tls_config: Arc<rustls::ClientConfig>,
        auth_token: Option<&str>,
    ) -> io::Result<Client> {
        Client::tls(dial(addr)?, server_name, tls_config, auth_token, None)
    }

    /// The TLS handshake over `tcp` (at most `timeout`, capped at 10 s), then the Hello; the
    /// socket's timeouts end as `timeout` (none when `None`).
    fn tls(
        mut tcp: TcpStream,
        server_name: &str,
        tls_config: Arc<rustls::ClientConfig>,
        auth_token: Option<&str>,
        timeout: Option<Duration>,
    ) -> io::Result<Client> {
        let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut conn = rustls::ClientConnection::new(tls_config, name).map_err(io::Error::other)?;
        let limit = timeout.map_or(TLS_HANDSHAKE_LIMIT, |t| t.min(TLS_HANDSHAKE_LIMIT));
        let deadline = Instant::now() + limit;
        tcp.set_read_timeout(Some(TLS_HANDSHAKE_POLL))?;
        tcp.set_write_timeout(Some(TLS_HANDSHAKE_POLL))?;
        while conn.is_handshaking() {
            match conn.complete_io(&mut tcp) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(tls_hint(e)),
            }
            if conn.is_handshaking() && Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("TLS handshake did not finish within {limit:?}")));
            }
        }
        tcp.set_read_timeout(timeout)?;
        tcp.set_write_timeout(timeout)?;
        Client::handshake(Transport::Tls(Box::new(rustls::StreamOwned::new(conn, tcp))), auth_token)
    }

    fn handshake(io: Transport, auth_token: Option<&str>) -> io::Result<Client> {
        let mut client = Client {
            io,
            decoder: FrameDecoder::new(proto::DEFAULT_MAX_FRAME_LEN),
            out: Vec::new(),
            next_id: 1,
            max_frame_len: proto::DEFAULT_MAX_FRAME_LEN,
            server_version: String::new(),
        };
        let hello = proto::Hello { protocol_version: proto::PROTOCOL_VERSION, auth_token: auth_token.map(str::to_owned) };
        let ack = client.call(request::Kind::Hello(hello)).map_err(ClientError::into_connect_error)?;
        match ack {
            response::Kind::HelloAck(ack) if ack.protocol_version == proto::PROTOCOL_VERSION => {
                client.server_version = ack.server_version;
                Ok(client)
            }
            response::Kind::HelloAck(ack) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("server speaks protocol version {}, not {}", ack.protocol_version, proto::PROTOCOL_VERSION),
            )),
            other => Err(ClientError::unexpected(&other, "hello_ack").into_connect_error()),
        }
    }

    /// The server's version, from its HelloAck (e.g. `"0.4.4"`).
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// The frame cap applied in both directions, in bytes (default 16 MiB).
    pub fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }

    /// Sets the frame cap for both directions: larger requests are refused before sending
    /// ([`ClientError::Frame`]), larger responses are refused on their length prefix.
    pub fn set_max_frame_len(&mut self, max_frame_len: u32) {
        self.max_frame_len = max_frame_len;
        self.decoder.set_max_frame_len(max_frame_len);
    }

    /// Bounds every blocking read and write (`None` = wait forever, the default). A call
    /// that times out fails with [`ClientError::Io`] of kind `WouldBlock` or `TimedOut`.
    ///
    /// # Errors
    /// The socket's error (a zero duration is refused).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.tcp().set_read_timeout(timeout)?;
        self.io.tcp().set_write_timeout(timeout)
    }

    /// The local socket address.
    ///
    /// # Errors
    /// The socket's error.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.io.tcp().local_addr()
    }

    /// Sends one request under a fresh id and returns the id.
    fn send(&mut self, kind: request::Kind) -> Result<u64, ClientError> {
        self.send_with(|id, max, out| proto::encode_frame(&Request::new(id, kind), max, out))
    }

    /// Sends one frame that `encode(request_id, max_frame_len, out)` appends to `out`; returns
    /// its request id.
    fn send_with(&mut self, encode: impl FnOnce(u64, u32, &mut Vec<u8>) -> Result<(), FrameError>) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.out.clear();
        encode(id, self.max_frame_len, &mut self.out)?;
        self.next_id += 1;
        if let Err(e) = self.io.write_all(&self.out).and_then(|()| self.io.flush()) {
            return Err(self.refusal_behind(e));
        }
        Ok(id)
    }

    /// The error a failed send reports: a server that refuses a frame (one over its cap, docs/protocol.md
    /// §11) answers with an id-0 error and closes while the frame is still being written, and
    /// the write then fails with a broken pipe or a reset. The answer is usually still in the
    /// receive buffer: read it (waiting at most a second) and report it instead of the write's
    /// error. Any other failure, or no such answer, reports `e`.
    fn refusal_behind(&mut self, e: io::Error) -> ClientError {
        if !matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) {
            return e.into();
        }
        let before = self.io.tcp().read_timeout().ok().flatten();
        if self.io.tcp().set_read_timeout(Some(Duration::from_secs(1))).is_err() {
            return e.into();
        }
        let answer = self.next_response();
        let _ = self.io.tcp().set_read_timeout(before);
        match answer {
            Ok(Response { request_id: 0, kind: Some(response::Kind::Error(r)) }) => ClientError::from_response(r),
            _ => e.into(),
        }
    }

    /// Reads the next response frame.
    fn next_response(&mut self) -> Result<Response, ClientError> {
        match self.decoder.read_next(&mut self.io)? {
            Some(body) => Response::decode(body).map_err(|e| ClientError::Frame(FrameError::Decode(e))),
            None => Err(ClientError::UnexpectedEof),
        }
    }

    /// Sorts a response: `None` for a late frame of an abandoned request (skip it),
    /// otherwise the answer to `id`. Id 0 counts as ours (an unattributed error, docs/protocol.md §11).
    fn accept(&self, resp: Response, id: u64) -> Option<Result<response::Kind, ClientError>> {
        if resp.request_id != id && resp.request_id != 0 {
            if resp.request_id < id {
                return None;
            }
            return Some(Err(ClientError::Protocol(format!("response for request {} while waiting for request {id}", resp.request_id))));
        }
        Some(match resp.kind {
            Some(response::Kind::Error(e)) => Err(ClientError::from_response(e)),
            Some(kind) => Ok(kind),
            None => Err(ClientError::Protocol("response without a kind".into())),
        })
    }

    /// Waits for the next frame answering `id`.
    fn recv(&mut self, id: u64) -> Result<response::Kind, ClientError> {
        loop {
            let resp = self.next_response()?;
            if let Some(r) = self.accept(resp, id) {
                return r;
            }
        }
    }

    fn call(&mut self, kind: request::Kind) -> Result<response::Kind, ClientError> {
        let id = self.send(kind)?;
        self.recv(id)
    }

    /// Appends `events` as one atomic batch, optionally guarded by `condition`
    /// (docs/protocol.md §8), and waits until the batch is durable.
    ///
    /// # Errors
    /// [`ClientError::Server`] with `CONFLICT` / `ALREADY_EXISTS` (condition fired;
    /// `conflict_position` set and `retryable == false` for a durable conflict),
    /// `AFTER_BEYOND_TIP`, `EMPTY` (no events), `TOO_LARGE`, `BAD_REQUEST`, `INTERNAL`,
    /// `SHUTDOWN`; [`ClientError::Frame`] when the request exceeds the frame cap; transport
    /// and protocol errors.
    pub fn append(&mut self, events: impl IntoIterator<Item = Event>, condition: Option<AppendCondition>) -> Result<AppendResult, ClientError> {
        let events: Vec<Event> = events.into_iter().collect();
        self.append_refs(&events, condition)
    }

    /// [`append`](Self::append) for events the caller keeps: the request is encoded straight
    /// from their bytes ([`proto::append::encode_append_frame`]), nothing is copied first.
    ///
    /// # Errors
    /// As [`append`](Self::append).
    pub fn append_refs<'e>(&mut self, events: impl IntoIterator<Item = &'e Event>, condition: Option<AppendCondition>) -> Result<AppendResult, ClientError> {
        let refs: Vec<&Event> = events.into_iter().collect();
        let condition = condition.as_ref().map(convert::condition_to_proto);
        let id = self.send_with(|id, max, out| proto::append::encode_append_frame(id, &refs, condition.as_ref(), max, out))?;
        match self.recv(id)? {
            response::Kind::Append(r) => Ok(AppendResult { first: Position(r.first), last: Position(r.last) }),
            other => Err(ClientError::unexpected(&other, "append")),
        }
    }

    /// Fetches the server's statistics.
    ///
    /// # Errors
    /// Transport, protocol or server errors.
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        match self.call(request::Kind::Stats(proto::StatsRequest {}))? {
            response::Kind::Stats(s) => Ok(s.into()),
            other => Err(ClientError::unexpected(&other, "stats")),
        }
    }

    fn start_read(&mut self, query: &Query, cursor: Position, limit: Option<u64>, reverse: bool) -> Result<ReadStream<'_>, ClientError> {
        let read = proto::ReadRequest { query: Some(convert::query_to_proto(query)), after: cursor.get(), limit, reverse };
        let id = self.send(request::Kind::Read(read))?;
        Ok(ReadStream::new(self, id))
    }

    /// Streams the events matching `query` with position > `after`, ascending, at most
    /// `limit` of them (`None` = all). The read is pinned to the durable tip when it starts;
    /// [`ReadStream::watermark`] reports that tip once the stream has ended.
    ///
    /// # Errors
    /// Sending fails; errors during the stream (e.g. `BAD_REQUEST` for an invalid query)
    /// come out of the iterator.
    pub fn read(&mut self, query: Query, after: Position, limit: Option<u64>) -> Result<ReadStream<'_>, ClientError> {
        self.start_read(&query, after, limit, false)
    }

    /// Streams the events matching `query` with position < `before`, newest first, at most
    /// `limit` of them. [`Position::MAX`] starts at the tip; [`Position::ZERO`] yields
    /// nothing.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn read_back(&mut self, query: Query, before: Position, limit: Option<u64>) -> Result<ReadStream<'_>, ClientError> {
        self.start_read(&query, before, limit, true)
    }

    /// Reads every event matching `query` after `after` and returns them with the read's
    /// watermark (the durable tip it was pinned to).
    ///
    /// # Errors
    /// The first error of the stream.
    pub fn read_all(&mut self, query: Query, after: Position) -> Result<(Vec<SequencedEvent>, Position), ClientError> {
        self.read(query, after, None)?.collect_all()
    }

    /// [`read_all`](Self::read_all) backward: every match before `before`, newest first.
    ///
    /// # Errors
    /// The first error of the stream.
    pub fn read_all_back(&mut self, query: Query, before: Position) -> Result<(Vec<SequencedEvent>, Position), ClientError> {
        self.read_back(query, before, None)?.collect_all()
    }

    /// Subscribes to `query` after `after`: the stream first catches up on stored matches,
    /// then follows new commits, with [`SubEvent::CaughtUp`] markers at the live edge. It
    /// ends only on cancel (via the returned [`SubscribeCancel`]), on an error, or when the
    /// server closes.
    ///
    /// # Errors
    /// Sending fails; later errors (e.g. `BAD_REQUEST` over the subscription cap) come out
    /// of the stream.
    pub fn subscribe(&mut self, query: Query, after: Position) -> Result<(SubscribeStream<'_>, SubscribeCancel), ClientError> {
        let (wake_rx, wake_tx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        let shared = Arc::new(CancelShared { cancelled: AtomicBool::new(false), wake_tx, wake_rx });
        let sub = proto::SubscribeRequest { query: Some(convert::query_to_proto(&query)), after: after.get() };
        let id = self.send(request::Kind::Subscribe(sub))?;
        let cancel = SubscribeCancel { shared: Arc::clone(&shared) };
        Ok((SubscribeStream::new(self, id, shared), cancel))
    }

    /// Sends a `CancelRequest` for `target` (no answer is expected, docs/protocol.md §7).
    fn send_cancel(&mut self, target: u64) -> Result<(), ClientError> {
        self.send(request::Kind::Cancel(proto::CancelRequest { target })).map(|_| ())
    }
}

/// State shared by a [`SubscribeStream`] and its [`SubscribeCancel`] handles. Both ends of
/// the wake pair live here, so writing to it can never hit a closed peer.
struct CancelShared {
    cancelled: AtomicBool,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

/// Ends a [`SubscribeStream`] from any thread. Cloneable; `Send + Sync`.
#[derive(Clone)]
pub struct SubscribeCancel {
    shared: Arc<CancelShared>,
}

impl std::fmt::Debug for SubscribeCancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscribeCancel").field("cancelled", &self.is_cancelled()).finish()
    }
}

impl SubscribeCancel {
    /// Asks the stream to stop. A stream blocked waiting for the server wakes at once; it
    /// sends a `CancelRequest` to the server and then yields `None`. Idempotent, never
    /// blocks, and harmless after the stream has ended.
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Release);
        // Nonblocking: a full pipe already holds a wake-up.
        let _ = (&self.shared.wake_tx).write(&[1]);
    }

    /// True once [`cancel`](Self::cancel) has been called.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_can_cross_threads() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<Client>();
        send::<SubscribeCancel>();
        sync::<SubscribeCancel>();
        send::<ClientError>();
        sync::<ClientError>();
    }

    #[test]
    fn connect_errors_map_as_documented() {
        for (code, message, kind) in [
            (ErrorCode::Unauthenticated, "invalid or missing auth token", io::ErrorKind::PermissionDenied),
            (ErrorCode::BadRequest, "unsupported protocol version 1: this server speaks 2", io::ErrorKind::InvalidData),
        ] {
            let refused = ClientError::Server { code, message: message.into(), retryable: false, conflict_position: None };
            assert_eq!(refused.into_connect_error().kind(), kind, "{message}");
        }
        assert_eq!(ClientError::UnexpectedEof.into_connect_error().kind(), io::ErrorKind::UnexpectedEof);
        let io = ClientError::Io(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(io.into_connect_error().kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(ClientError::Protocol("x".into()).into_connect_error().kind(), io::ErrorKind::InvalidData);
        assert!(matches!(ClientError::from(FrameError::Io(io::ErrorKind::BrokenPipe.into())), ClientError::Io(_)));
        assert!(matches!(ClientError::from(FrameError::Torn { buffered: 3 }), ClientError::Frame(_)));
    }

    #[test]
    fn closes_and_resets_name_the_step_and_the_connection_limit() {
        let e = name_early_close(io::ErrorKind::BrokenPipe.into(), ConnectStep::Hello);
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        assert!(
            e.to_string()
                .starts_with("the server closed the connection before answering the Hello (a server at its connection limit, server.limits.max_connections"),
            "{e}"
        );
        assert!(e.to_string().contains("; so do a TLS server reached without TLS and a server whose server.max_frame_len is too small for its answer)"), "{e}");
        let e = name_early_close(io::ErrorKind::UnexpectedEof.into(), ConnectStep::TlsHandshake);
        assert!(e.to_string().starts_with("the server closed the connection during the TLS handshake (a server at its connection limit"), "{e}");
        assert!(!e.to_string().contains("without TLS"), "{e}");
        let refused = name_early_close(io::ErrorKind::ConnectionRefused.into(), ConnectStep::Hello);
        assert!(!refused.to_string().contains("connection limit"), "{refused}");
    }

    #[test]
    fn a_refused_dial_is_the_plain_io_error() {
        // Bind then drop a listener to get a port that refuses connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = Client::connect(("127.0.0.1", port)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }
}
