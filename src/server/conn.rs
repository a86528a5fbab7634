//! One client connection on its shard: Hello, request dispatch, the two egress lanes, budgets
//! and reaping (docs/protocol.md §6-§11,
//! docs/operations.md §4).
//!
//! [`serve`] is the connection's reader: it sets up the [transport](transport), opens the
//! [lanes](lanes) toward the client, and then loops over [`ConnState`]: serve the frames
//! buffered ([`ConnState::on_frame`]), reap the connection at its [next
//! deadline](ConnState::next_deadline), wait for bytes; then [close](ConnState::close) it.
//! Appends are answered from here; reads and subscriptions stream from [`streams`].

mod batch;
mod lanes;
mod streams;
mod transport;

use super::{Context, ReplyRouter};
use crate::config::TimeoutSettings;
use crate::proto::convert::{self, text, ConflictClause as WireClause};
use crate::proto::messages::{request, response};
use crate::proto::{self as pb, ErrorCode, FrameDecoder, FrameError};
use crate::writer::condition::{ConflictClause, ConflictSite};
use crate::writer::{AppendError, PreparedAppend};
use futures_lite::AsyncRead;
use lanes::Lanes;
use shards::net::TcpStream;
use shards::sync::{Permit, Semaphore};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Request frames at least this long (bytes) are decoded on a blocking thread
/// ([`pb::decode_inbound`]), not on the shard: decoding and converting a long condition or
/// query takes long enough (~0.5 µs per query item) to hold up every other connection the
/// shard serves. An append of 512 events of 256 bytes (~150 KiB) stays on the shard.
const DECODE_OFF_SHARD: usize = 256 << 10;

/// The least cap on a connection's first frame, before its Hello succeeds, in bytes.
const FIRST_FRAME_MIN_CAP: u32 = 64 << 10;

/// The largest first frame a connection may send, in bytes: its Hello (docs/protocol.md
/// §6) holds a version and a token, so room for the longest configured token (at least
/// [`FIRST_FRAME_MIN_CAP`]), and never more than `server.max_frame_len`. Without it, every
/// connection not yet authenticated could make the server buffer a whole `max_frame_len`
/// frame (16 MiB by default; up to `server.limits.max_connections` of them) before finding out
/// that it is not a Hello.
fn first_frame_cap(settings: &crate::config::Settings) -> u32 {
    let longest = settings.auth.token_strs().map(str::len).max().unwrap_or(0);
    let room = u32::try_from(longest.saturating_mul(2).saturating_add(1024)).unwrap_or(u32::MAX);
    room.max(FIRST_FRAME_MIN_CAP).min(settings.server.max_frame_len)
}

/// The longest a connection's reader waits for bytes before re-checking its deadlines (and
/// re-polling the socket). Deadlines themselves are waited for exactly; the tick only bounds
/// how late the idle timeout starts to count after in-flight work ends. Every tick wakes the
/// shard: at 100 ms, 200 idle connections cost 7.7% of a core.
const READ_TICK: Duration = Duration::from_secs(1);

/// How long a closing connection may take to deliver its queued frames.
const CLOSE_DRAIN: Duration = Duration::from_secs(5);
/// The same during a graceful shutdown.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// A connection's requests: what serving them needs, shared by the tasks that do.
struct Conn {
    ctx: Arc<Context>,
    router: Rc<ReplyRouter>,
    lanes: Lanes,
    /// `max_inflight_per_conn` permits: an append holds one until its answer is queued.
    append_budget: Semaphore,
    /// `max_inflight_per_conn` permits: a read runs while it holds one.
    read_budget: Semaphore,
    /// `max_inflight_per_conn` permits: a read queued for a running slot holds one.
    read_overflow: Semaphore,
    /// [`READ_SLOTS`] permits: a read builds a batch only while it holds one.
    read_slots: Semaphore,
    /// Subscriptions running.
    subscriptions: Rc<Cell<usize>>,
    /// Appends and reads in flight (the connection is not idle while any is).
    inflight: Rc<Cell<usize>>,
    /// The cancel flags of the reads and subscriptions running, by request id. Ids need not be
    /// unique (the reference does not check them, docs/protocol.md §7): a cancel stops every stream
    /// running under its target id, where the reference's stops only the latest.
    cancels: Rc<RefCell<CancelFlags>>,
    /// Notified whenever cancel flags are set (a cancel request, the connection closing):
    /// what [`Conn::abandoned`] waits on.
    cancelled: Rc<event_listener::Event>,
}

/// The cancel flags of a connection's running streams, by request id.
type CancelFlags = HashMap<u64, Vec<Rc<Cell<bool>>>>;

/// Serves one accepted connection to completion.
pub(super) async fn serve(ctx: Arc<Context>, router: Rc<ReplyRouter>, stream: TcpStream) {
    let accepted = Instant::now();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let Some((io, heard)) = transport::open(&ctx, stream, accepted).await else { return };
    let (mut reader, writer) = futures_lite::io::split(io);
    let (lanes, abandon_rx, egress) = lanes::open(&ctx.settings, writer);
    let mut state = ConnState::new(Conn::new(&ctx, router, lanes), accepted, heard);
    // Until its Hello succeeds a client may send only a first frame of Hello size.
    let mut dec = FrameDecoder::new(first_frame_cap(&ctx.settings));
    let end = loop {
        if let Some(end) = state.serve_buffered(&mut dec).await {
            break end;
        }
        let now = Instant::now();
        let deadline = state.next_deadline(dec.has_partial(), now);
        if deadline.is_some_and(|d| d <= now) {
            ctx.connections_reaped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("connection reaped by a timeout");
            break End::Server;
        }
        if let Some(end) = state.wait(&mut dec, &mut reader, &abandon_rx, deadline, now).await {
            break end;
        }
    };
    state.close(end, egress, reader, fd).await;
}

/// Who ended a connection's loop, which decides how it closes ([`ConnState::close`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// The client ended the stream (or it failed): nothing to linger for.
    Client,
    /// The server did (an error sent, a timeout, a graceful shutdown): the answers queued
    /// still go out first.
    Server,
}

/// What serving one frame led to.
enum Flow {
    /// Go on reading.
    Continue,
    /// The Hello succeeded: frames may now be up to `server.max_frame_len`.
    Established,
    /// Close the connection.
    Close,
}

/// What ended a connection reader's wait.
enum Wake {
    /// Bytes arrived (`Ok(n)`), the client closed (`Ok(0)`) or the socket failed.
    Read(std::io::Result<usize>),
    /// The wait ran out (deadlines are due for a look) or an answer could not be sent.
    Tick,
    /// A graceful shutdown began.
    Shutdown,
}

/// The clocks a connection's timeouts run on (docs/operations.md §4.4).
#[derive(Clone, Copy, Debug)]
struct Clocks {
    /// When the connection was accepted (the Hello's deadline runs from it).
    accepted: Instant,
    /// When the frame still arriving began, if one is: the frame timer runs from the start of
    /// the frame still arriving, so a client whose every write ends mid-frame always leaves one
    /// partial, yet completes each.
    partial_since: Option<Instant>,
    /// When the client last sent a complete frame or any byte.
    last_activity: Instant,
}

impl Clocks {
    /// The earliest of the deadlines that apply at `now`: `incomplete_frame` while a frame is
    /// arriving (`partial`), `handshake` until the Hello succeeded (`established`), `idle`
    /// unless work is in flight (`busy`) with no frame arriving. `None`: no deadline.
    fn next_deadline(&mut self, timeouts: &TimeoutSettings, established: bool, busy: bool, partial: bool, now: Instant) -> Option<Instant> {
        self.partial_since = if partial { self.partial_since.or(Some(now)) } else { None };
        let frame = self.partial_since.and_then(|p| timeouts.incomplete_frame().map(|t| p + t));
        let hello = if established { None } else { timeouts.handshake().map(|t| self.accepted + t) };
        let idle = if !busy || self.partial_since.is_some() { timeouts.idle().map(|t| self.last_activity + t) } else { None };
        [frame, hello, idle].into_iter().flatten().min()
    }
}

/// What a connection's reader keeps between frames: the connection's requests ([`Conn`]),
/// whether its Hello succeeded, and the clocks its timeouts run on.
struct ConnState {
    ctx: Arc<Context>,
    conn: Rc<Conn>,
    established: bool,
    clocks: Clocks,
    /// When bytes last arrived under TLS (a plain connection's reader sees every byte itself).
    heard: Rc<Cell<Instant>>,
}

impl ConnState {
    fn new(conn: Rc<Conn>, accepted: Instant, heard: Rc<Cell<Instant>>) -> ConnState {
        ConnState { ctx: conn.ctx.clone(), conn, established: false, clocks: Clocks { accepted, partial_since: None, last_activity: Instant::now() }, heard }
    }

    /// The connection's next deadline (see [`Clocks::next_deadline`]); due already means the
    /// connection is reaped.
    fn next_deadline(&mut self, partial: bool, now: Instant) -> Option<Instant> {
        let busy = self.conn.inflight.get() > 0 || self.conn.subscriptions.get() > 0;
        self.clocks.next_deadline(&self.ctx.settings.server.timeouts, self.established, busy, partial, now)
    }

    /// Serves every complete frame already buffered in `dec`; `Some` when the connection is to
    /// close (a bad frame, a refused Hello, an answer that could not be sent, a shutdown).
    async fn serve_buffered(&mut self, dec: &mut FrameDecoder) -> Option<End> {
        loop {
            let frame = match dec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    self.on_frame_error(e).await;
                    return Some(End::Server);
                }
            };
            match self.on_frame(frame).await {
                Flow::Continue => {}
                Flow::Established => dec.set_max_frame_len(self.ctx.settings.server.max_frame_len),
                Flow::Close => return Some(End::Server),
            }
        }
        self.conn.lanes.abandoned.get().then_some(End::Server)
    }

    /// Answers a frame that could not be taken (over the cap, undecodable framing) with the
    /// error the reference sends, if any.
    async fn on_frame_error(&self, e: FrameError) {
        let err = match e {
            FrameError::TooLong { len, max } if !self.established && max < self.ctx.settings.server.max_frame_len => {
                Some(convert::first_frame_too_long(len, max))
            }
            e => convert::frame_error_response(&e),
        };
        if let Some(err) = err {
            unless_shutdown(&self.ctx, self.conn.lanes.error(0, err)).await;
        }
    }

    /// Serves one complete frame: the Hello first, then requests.
    async fn on_frame(&mut self, frame: &[u8]) -> Flow {
        self.clocks.last_activity = Instant::now();
        self.clocks.partial_since = None;
        if !self.established {
            return self.on_hello(frame).await;
        }
        let Some(inbound) = self.decode(frame).await else { return Flow::Close };
        // Serving a request may park the reader (a full control lane toward a client that
        // stopped reading, a spent append budget, a full writer queue); a shutdown must still
        // end the connection.
        match unless_shutdown(&self.ctx, self.conn.clone().handle(inbound)).await {
            Some(()) => Flow::Continue,
            None => Flow::Close,
        }
    }

    /// Checks the first frame, which must be a Hello ([`Conn::hello`]).
    async fn on_hello(&mut self, frame: &[u8]) -> Flow {
        let req = match crate::proto::decode_request(frame) {
            Ok(r) => r,
            Err(e) => {
                if let Some(err) = convert::frame_error_response(&FrameError::Decode(e)) {
                    unless_shutdown(&self.ctx, self.conn.lanes.error(0, err)).await;
                }
                return Flow::Close;
            }
        };
        match unless_shutdown(&self.ctx, self.conn.hello(req)).await {
            Some(true) => {
                self.established = true;
                Flow::Established
            }
            _ => Flow::Close,
        }
    }

    /// Decodes a request frame; a long one on a blocking thread, so this shard's other
    /// connections go on meanwhile (frames keep their order: this reader waits for it). `None`
    /// closes the connection (an error was sent when there is one to send).
    async fn decode(&self, frame: &[u8]) -> Option<pb::Inbound> {
        let inbound = if frame.len() >= DECODE_OFF_SHARD {
            let owned = frame.to_vec();
            match unless_shutdown(&self.ctx, shards::run_blocking(move || pb::decode_inbound(&owned))).await? {
                Some(decoded) => decoded,
                None => {
                    tracing::error!(len = frame.len(), "decoding a request panicked; closing its connection");
                    unless_shutdown(&self.ctx, self.conn.lanes.error(0, convert::internal_error("the request could not be decoded"))).await;
                    return None;
                }
            }
        } else {
            pb::decode_inbound(frame)
        };
        match inbound {
            Ok(i) => Some(i),
            Err(e) => {
                if let Some(err) = convert::frame_error_response(&FrameError::Decode(e)) {
                    unless_shutdown(&self.ctx, self.conn.lanes.error(0, err)).await;
                }
                None
            }
        }
    }

    /// Waits for bytes into `dec`, for `deadline` (re-evaluated at least every [`READ_TICK`],
    /// since in-flight work changes what counts as idle), for an answer that could not be sent
    /// (`abandon`), or for a shutdown. `Some` when the connection is to close.
    async fn wait<R: AsyncRead + Unpin>(
        &mut self,
        dec: &mut FrameDecoder,
        reader: &mut R,
        abandon: &flume::Receiver<()>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Option<End> {
        let wait = deadline.map(|d| d - now).unwrap_or(READ_TICK).min(READ_TICK);
        let got = futures_lite::future::or(
            async { Wake::Read(dec.fill_from_async(reader).await) },
            futures_lite::future::or(
                async {
                    // Ends with the wait, or when a reply could not be sent (checked by the
                    // caller's next look at the lanes).
                    let _ = futures_lite::future::or(async { abandon.recv_async().await.ok() }, async {
                        shards::sleep(wait).await;
                        None
                    })
                    .await;
                    Wake::Tick
                },
                async {
                    self.ctx.wait_shutdown().await;
                    Wake::Shutdown
                },
            ),
        )
        .await;
        match got {
            Wake::Tick => {
                // Part of a TLS record arrived meanwhile: the client is not idle.
                self.clocks.last_activity = self.clocks.last_activity.max(self.heard.get());
                None
            }
            // Not the client's doing: its answers still go out before the close.
            Wake::Shutdown => Some(End::Server),
            Wake::Read(Ok(0)) | Wake::Read(Err(_)) => Some(End::Client),
            // Any byte is activity, a frame still arriving included (docs/operations.md §4.4:
            // idle is "no complete frame or progressing byte"); a frame that never completes
            // is for incomplete_frame_secs to end (review: a 1 MB append uploaded over 4 s was
            // reaped under idle_secs = 2 and lost; the reference acknowledged it).
            Wake::Read(Ok(_)) => {
                self.clocks.last_activity = Instant::now();
                None
            }
        }
    }

    /// Ends the connection: cancels its streams, lets queued frames go out (they may be an
    /// error telling the client why), then closes. A client that stopped reading gets a
    /// bounded grace, shorter during a shutdown; dropping the egress task then closes the
    /// socket and fails any producer still waiting on a lane. When the server ended it, the
    /// close waits for the client: it lingers ([`transport::linger`]) or, at a shutdown, waits
    /// for the answers to be acknowledged ([`transport::close_once_delivered`]).
    async fn close<R: AsyncRead + Unpin, W: futures_lite::AsyncWrite + Unpin>(self, end: End, egress: lanes::Egress<W>, reader: R, fd: std::os::fd::RawFd) {
        let ConnState { ctx, conn, .. } = self;
        for flag in conn.cancels.borrow().values().flatten() {
            flag.set(true);
        }
        conn.cancelled.notify(usize::MAX);
        drop(conn);
        let shutting_down = ctx.is_shutting_down();
        let grace = if shutting_down { SHUTDOWN_DRAIN } else { CLOSE_DRAIN };
        let drain_started = Instant::now();
        let sent = futures_lite::future::or(egress, async {
            shards::sleep(grace).await;
            None
        })
        .await;
        match sent {
            Some(writer) if end == End::Server && !shutting_down => transport::linger(reader, writer).await,
            Some(writer) if end == End::Server => transport::close_once_delivered(fd, writer, grace.saturating_sub(drain_started.elapsed())).await,
            _ => {}
        }
    }
}

/// Runs `f` to completion unless a shutdown begins first (then `None`).
async fn unless_shutdown<T>(ctx: &Context, f: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(f.await) }, async {
        ctx.wait_shutdown().await;
        None
    })
    .await
}

fn code_index(code: ErrorCode) -> usize {
    (code as i32).clamp(0, 9) as usize
}

impl Conn {
    /// The requests' state of a new connection of `ctx` whose frames go out through `lanes`.
    fn new(ctx: &Arc<Context>, router: Rc<ReplyRouter>, lanes: Lanes) -> Rc<Conn> {
        let bp = &ctx.settings.server.backpressure;
        Rc::new(Conn {
            lanes,
            append_budget: Semaphore::new(bp.max_inflight_per_conn as u64),
            read_budget: Semaphore::new(bp.max_inflight_per_conn as u64),
            read_overflow: Semaphore::new(bp.max_inflight_per_conn as u64),
            read_slots: Semaphore::new(streams::READ_SLOTS),
            subscriptions: Rc::new(Cell::new(0)),
            inflight: Rc::new(Cell::new(0)),
            cancels: Rc::new(RefCell::new(HashMap::new())),
            cancelled: Rc::new(event_listener::Event::new()),
            router,
            ctx: ctx.clone(),
        })
    }

    /// Checks the first frame (docs/protocol.md §6); false closes the connection.
    async fn hello(&self, req: pb::Request) -> bool {
        let id = req.request_id;
        let Some(request::Kind::Hello(h)) = req.kind else {
            self.lanes.error(id, convert::unauthenticated(text::FIRST_FRAME_NOT_HELLO)).await;
            return false;
        };
        if h.protocol_version != pb::PROTOCOL_VERSION {
            self.lanes.error(id, convert::bad_request(text::unsupported_version(h.protocol_version))).await;
            return false;
        }
        if !self.ctx.accepts_token(h.auth_token.as_deref()) {
            self.lanes.error(id, convert::unauthenticated(text::BAD_TOKEN)).await;
            return false;
        }
        self.lanes.control(id, response::Kind::HelloAck(super::hello_ack())).await;
        true
    }

    /// Serves one decoded request.
    async fn handle(self: Rc<Self>, inbound: pb::Inbound) {
        let req = match inbound {
            pb::Inbound::Framed(fa, condition) => return self.append_framed(fa, condition).await,
            pb::Inbound::Append(id, converted) => return self.append(id, converted).await,
            pb::Inbound::Read(id, r, query) => return self.read(id, r, query).await,
            pb::Inbound::Subscribe(id, s, query) => return self.subscribe(id, s, query).await,
            pb::Inbound::Other(req) => req,
        };
        let id = req.request_id;
        match req.kind {
            // Taken out by decode_inbound.
            Some(request::Kind::Append(_) | request::Kind::Read(_) | request::Kind::Subscribe(_)) => {
                self.lanes.error(id, convert::internal_error("request not decoded")).await
            }
            Some(request::Kind::Cancel(c)) => {
                for flag in self.cancels.borrow().get(&c.target).into_iter().flatten() {
                    flag.set(true);
                }
                self.cancelled.notify(usize::MAX);
            }
            Some(request::Kind::Stats(_)) => {
                // Stats list the data directory, which can wait for the disk (a directory lock
                // held across a slow inode read): off the shard, whose other connections
                // would wait with it.
                let ctx = self.ctx.clone();
                match shards::run_blocking(move || ctx.stats()).await {
                    Some(stats) => self.lanes.control(id, response::Kind::Stats(stats)).await,
                    None => self.lanes.error(id, convert::internal_error("stats could not be gathered")).await,
                }
            }
            Some(request::Kind::Journal(j)) => {
                let resp = match self.ctx.journals.get() {
                    Some(journals) => journals.serve(j).await,
                    None => crate::journal::sequencer::unavailable("this server serves no journals (a follower is read-only for events only)"),
                };
                self.lanes.control(id, response::Kind::Journal(resp)).await
            }
            Some(request::Kind::Hello(_)) | None => self.lanes.error(id, convert::bad_request(text::NO_KIND)).await,
        }
    }

    /// Counts an append refused with `e` (by its wire code) and answers it.
    async fn append_error(&self, id: u64, e: pb::ErrorResponse) {
        self.ctx.append_errors[code_index(ErrorCode::from_wire(e.code))].fetch_add(1, Ordering::Relaxed);
        self.lanes.error(id, e).await;
    }

    /// The fast path: records were framed straight from the wire bytes.
    async fn append_framed(
        self: Rc<Self>,
        fa: crate::proto::append::FramedAppend,
        condition: Result<Option<crate::model::AppendCondition>, convert::ConvertError>,
    ) {
        let started = Instant::now();
        let id = fa.request_id;
        if let Some(e) = fa.invalid {
            return self.append_error(id, e.to_error_response()).await;
        }
        let condition = match condition {
            Ok(c) => c,
            Err(e) => return self.append_error(id, e.to_error_response()).await,
        };
        if fa.count == 0 {
            return self.append_error(id, convert::empty_append_error()).await;
        }
        if let Some(e) = self.unreadable(fa.largest_event) {
            return self.append_error(id, e).await;
        }
        // The reader waits here while the append budget is spent (backpressure).
        let Some(permit) = self.append_budget.acquire(1).await else { return };
        let prepared = match PreparedAppend::from_framed(fa.records, fa.count, fa.largest_record, condition, self.ctx.store.segment_config()) {
            Ok(p) => p,
            Err(e) => return self.append_error(id, append_error_response(e)).await,
        };
        self.submit(id, prepared, permit, started).await;
    }

    /// The general path: events decoded and converted one by one.
    async fn append(self: Rc<Self>, id: u64, converted: Result<(Vec<crate::event::Event>, Option<crate::model::AppendCondition>), convert::ConvertError>) {
        let started = Instant::now();
        let (events, condition) = match converted {
            Ok(v) => v,
            Err(e) => return self.append_error(id, e.to_error_response()).await,
        };
        if events.is_empty() {
            return self.append_error(id, convert::empty_append_error()).await;
        }
        let largest = events.iter().map(|e| crate::proto::batch::event_body_len(&e.as_ref())).max().unwrap_or(0);
        if let Some(e) = self.unreadable(largest) {
            return self.append_error(id, e).await;
        }
        // The reader waits here while the append budget is spent (backpressure).
        let Some(permit) = self.append_budget.acquire(1).await else { return };
        let prepared = match PreparedAppend::new(&events, condition, self.ctx.store.segment_config()) {
            Ok(p) => p,
            Err(e) => return self.append_error(id, append_error_response(e)).await,
        };
        drop(events);
        self.submit(id, prepared, permit, started).await;
    }

    /// `TOO_LARGE` when an event whose wire body is `largest_event` bytes could not be sent
    /// back by a read on this connection's frame cap: stored, it would fail every read that
    /// reaches it.
    fn unreadable(&self, largest_event: usize) -> Option<pb::ErrorResponse> {
        let len = crate::proto::batch::lone_event_frame_len(largest_event);
        (len > self.lanes.max_frame_len as usize).then(|| convert::unreadable_event_error(len, self.lanes.max_frame_len))
    }

    /// Queues a prepared append on the writer; the shard's dispatcher answers it
    /// ([`Conn::complete`]) when its batch is durable.
    async fn submit(self: Rc<Self>, id: u64, prepared: PreparedAppend, permit: Permit, started: Instant) {
        let me = self.clone();
        let (reply, token) = self.router.register(Box::new(move |res| me.complete(id, res, permit, started)));
        self.inflight.set(self.inflight.get() + 1);
        // A full writer queue also holds the reader here.
        if let Err(e) = self.ctx.store.submit(prepared, reply).await {
            if let Some(done) = self.router.forget(token) {
                done(Err(e));
            }
        }
    }

    /// Answers an append (on the dispatcher, without a task of its own): the ack or the error
    /// goes straight into the control lane; only when that lane is full does a task wait for
    /// room, holding the append's budget permit until the answer is queued (a client that does
    /// not read its answers still cannot have more appends in flight than its budget).
    fn complete(self: Rc<Self>, id: u64, res: crate::writer::AppendResult, permit: Permit, started: Instant) {
        let acked = res.is_ok();
        let kind = match res {
            Ok(r) => response::Kind::Append(pb::AppendResponse { first: r.first.get(), last: r.last.get() }),
            Err(e) => {
                let e = append_error_response(e);
                self.ctx.append_errors[code_index(ErrorCode::from_wire(e.code))].fetch_add(1, Ordering::Relaxed);
                response::Kind::Error(e)
            }
        };
        let done = move |me: &Conn| {
            if acked {
                crate::fault::crash_point("partial_ack");
                let us = started.elapsed().as_micros() as u64;
                if let Ok(mut h) = me.ctx.append_latency.lock() {
                    let _ = h.record(us.max(1));
                }
            }
            me.inflight.set(me.inflight.get() - 1);
            drop(permit);
        };
        match self.lanes.encode(id, kind) {
            None => {
                self.lanes.abandon();
                done(&self);
            }
            Some(frame) => match self.lanes.control.try_send(frame) {
                Err(flume::TrySendError::Full(frame)) => {
                    tracing::debug!(id, "control lane full: the append's answer waits for room");
                    shards::spawn(async move {
                        let _ = self.lanes.control.send_async(frame).await;
                        done(&self);
                    })
                    .detach();
                }
                // Queued, or the connection is gone.
                _ => done(&self),
            },
        }
    }

    /// A cancel flag for the stream `id` (set by a `Cancel` of `id` or the connection closing).
    fn register_cancel(&self, id: u64) -> Rc<Cell<bool>> {
        let flag = Rc::new(Cell::new(false));
        self.cancels.borrow_mut().entry(id).or_default().push(flag.clone());
        flag
    }

    /// Forgets a stream's cancel flag once it has ended.
    fn unregister_cancel(&self, id: u64, flag: &Rc<Cell<bool>>) {
        let mut c = self.cancels.borrow_mut();
        if let Some(flags) = c.get_mut(&id) {
            flags.retain(|f| !Rc::ptr_eq(f, flag));
            if flags.is_empty() {
                c.remove(&id);
            }
        }
    }
}

/// Maps an engine append error to its wire error (docs/protocol.md §2.3 table).
fn append_error_response(e: AppendError) -> pb::ErrorResponse {
    match e {
        AppendError::Conflict { clause, at } => {
            let clause = match clause {
                ConflictClause::Boundary => WireClause::Boundary,
                ConflictClause::Existence => WireClause::Existence,
            };
            let pos = match at {
                ConflictSite::Durable(p) => Some(crate::model::Position(p)),
                ConflictSite::SameBatch => None,
            };
            convert::conflict_error(clause, pos)
        }
        AppendError::AfterBeyondTip { after, tip } => convert::after_beyond_tip_error(crate::model::Position(after), crate::model::Position(tip)),
        AppendError::Empty => convert::empty_append_error(),
        AppendError::TooLarge { size } => convert::batch_too_large_error(size as usize),
        AppendError::Stopped(reason) => convert::writer_stopped_error(reason),
        AppendError::RolloverFailed(reason) => convert::rollover_failed_error(reason),
        AppendError::NamingStuck(reason) => convert::naming_stuck_error(reason),
        AppendError::Read(reason) => convert::internal_error(reason),
        AppendError::Shutdown => convert::shutdown_error(),
        AppendError::ReadOnly => convert::bad_request(AppendError::ReadOnly),
    }
}

#[cfg(test)]
mod tests {
    use super::Clocks;
    use crate::config::TimeoutSettings;
    use std::time::{Duration, Instant};

    /// The reaping deadlines: the Hello's until it succeeded, a partial frame's while one
    /// arrives, idleness only while nothing is in flight or a frame is arriving.
    #[test]
    fn the_next_deadline_is_the_earliest_that_applies() {
        let t = TimeoutSettings { idle_secs: 30, handshake_secs: 10, incomplete_frame_secs: 5 };
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut c = Clocks { accepted: t0, partial_since: None, last_activity: t0 };
        assert_eq!(c.next_deadline(&t, false, false, false, t0), Some(t0 + s(10)));
        assert_eq!(c.next_deadline(&t, true, false, false, t0), Some(t0 + s(30)));
        // Busy: no idle deadline, and nothing else applies.
        assert_eq!(c.next_deadline(&t, true, true, false, t0), None);
        // A frame arriving: its own deadline from when it began, and idleness counts again.
        assert_eq!(c.next_deadline(&t, true, true, true, t0 + s(1)), Some(t0 + s(6)));
        assert_eq!(c.next_deadline(&t, true, true, true, t0 + s(3)), Some(t0 + s(6)), "the frame timer runs from the frame's start");
        assert_eq!(c.next_deadline(&t, true, true, false, t0 + s(4)), None);
        assert_eq!(c.partial_since, None);
    }
}
