//! One client connection on its shard: Hello, request dispatch, the two egress lanes, budgets
//! and reaping (reference protocol §1.4-§1.9, §2.4-§2.7; seed "Backpressure", "Connection
//! limits and reaping").

use super::{Context, ReplyRouter};
use crate::proto::convert::{self, text, ConflictClause as WireClause};
use crate::proto::messages::{request, response};
use crate::proto::{self as pb, ErrorCode, FrameDecoder, FrameError, ReadEventsEncoder};
use crate::model::QueryMatcher;
use crate::read::Step;
use crate::writer::condition::{ConflictClause, ConflictSite};
use crate::writer::{AppendError, PreparedAppend};
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context as TaskCx, Poll};
use std::time::{Duration, Instant};

/// The transport: plain TCP or TLS over it.
enum Io {
    Plain(TcpStream),
    Tls(Box<futures_rustls::server::TlsStream<Heard>>),
}

/// A TCP stream that notes when it last received bytes: under TLS the connection's reader sees
/// only whole decrypted records, and a record still arriving is activity too (reference
/// protocol §2.7: "no complete frame or progressing byte").
struct Heard {
    stream: TcpStream,
    last: Rc<Cell<Instant>>,
}

impl AsyncRead for Heard {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(n)) = &got {
            if *n > 0 {
                me.last.set(Instant::now());
            }
        }
        got
    }
}

impl AsyncWrite for Heard {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_close(cx)
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_close(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// Outbound frames on two lanes: control (acks, stats, errors) is always drained first.
#[derive(Clone)]
struct Lanes {
    control: flume::Sender<Vec<u8>>,
    bulk: flume::Sender<Vec<u8>>,
    /// Bytes the bulk lane may still take ([`BULK_LANE_BYTES`] in all); the egress task gives
    /// a frame's bytes back once it has written it, and closes this when it ends.
    bulk_room: Rc<LaneRoom>,
    max_frame_len: u32,
    /// Set (and the reader woken through `abandon_tx`) when a control frame could not be
    /// sent: its request would wait forever, so the connection is closed.
    abandoned: Rc<Cell<bool>>,
    abandon_tx: flume::Sender<()>,
}

impl Lanes {
    /// True when `ev` must go into a new `ReadEvents` frame: `enc` already holds events and
    /// one more (its body plus up to 24 bytes of position and field framing) would push the
    /// frame past `max_frame_len`.
    fn needs_new_frame(&self, enc: &ReadEventsEncoder, ev: &crate::event::EventRef<'_>) -> bool {
        let body = crate::proto::batch::event_body_len(ev) + 24;
        !enc.is_empty() && enc.events_len() + body + FRAME_HEAD_ROOM > self.max_frame_len as usize
    }

    /// Encodes a response frame, `None` when it cannot fit `max_frame_len`. An error whose
    /// message makes it too long goes out with the message cut to fit (on a char boundary), so
    /// its client still learns the code: under a tiny cap (64 bytes) an append refused as too
    /// large to read back got only a closed connection (review).
    fn encode(&self, id: u64, kind: response::Kind) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut resp = pb::Response::new(id, kind);
        let mut result = pb::encode_frame(&resp, self.max_frame_len, &mut out);
        if let (Err(pb::FrameError::TooLong { len, max }), Some(response::Kind::Error(e))) = (&result, &mut resp.kind) {
            let excess = (*len - u64::from(*max)) as usize;
            if excess <= e.message.len() {
                let mut keep = e.message.len() - excess;
                while !e.message.is_char_boundary(keep) {
                    keep -= 1;
                }
                e.message.truncate(keep);
                out.clear();
                result = pb::encode_frame(&resp, self.max_frame_len, &mut out);
            }
        }
        match result {
            Ok(()) => Some(out),
            Err(e) => {
                tracing::warn!(error = %e, "response frame not sent");
                None
            }
        }
    }

    /// Queues a control frame. One over `max_frame_len` (a HelloAck, an ack or an error under
    /// a tiny `server.max_frame_len`) cannot be sent and its client would wait for it forever:
    /// the connection is closed instead, as the reference does (its protocol §1.2 and open
    /// question 3).
    async fn control(&self, id: u64, kind: response::Kind) {
        match self.encode(id, kind) {
            Some(f) => {
                let _ = self.control.send_async(f).await;
            }
            None => {
                self.abandoned.set(true);
                let _ = self.abandon_tx.try_send(());
            }
        }
    }

    async fn error(&self, id: u64, e: pb::ErrorResponse) {
        self.control(id, response::Kind::Error(e)).await;
    }

    /// Queues a bulk frame once the lane has room for it: fewer than `frame_queue_depth`
    /// frames and [`BULK_LANE_BYTES`] bytes queued (a larger frame waits for an empty lane).
    /// `false` when the connection is going away.
    async fn bulk_frame(&self, f: Vec<u8>) -> bool {
        let n = bulk_units(f.len());
        if !self.bulk_room.take(n).await {
            return false;
        }
        if self.bulk.send_async(f).await.is_ok() {
            return true;
        }
        self.bulk_room.give(n);
        false
    }
}

/// Writes frames from both lanes: control first; after 64 control frames in a row one waiting
/// bulk frame goes through, so appends cannot starve reads (reference §1.8). Flushes when a
/// control run ends and when both lanes are empty.
///
/// Only consecutive *control* frames count toward the 64: counting every frame (as this did)
/// made bulk the preferred lane for the rest of any long read, so an append ack queued behind
/// the whole multi-megabyte read (tests/server_wire.rs, an_append_ack_overtakes_a_large_read_*).
///
/// Returns the writer once both lanes are closed and everything was written (`None` after a
/// failed write), so the connection can be half-closed.
async fn egress<W: AsyncWrite + Unpin>(mut w: W, control: flume::Receiver<Vec<u8>>, bulk: flume::Receiver<Vec<u8>>, room: &LaneRoom) -> Option<W> {
    let mut control_run = 0u32;
    let mut pending = false;
    loop {
        let next = if control_run >= CONTROL_RUN {
            bulk.try_recv().map(|f| (false, f)).or_else(|_| control.try_recv().map(|f| (true, f))).ok()
        } else {
            control.try_recv().map(|f| (true, f)).or_else(|_| bulk.try_recv().map(|f| (false, f))).ok()
        };
        let (is_control, frame) = match next {
            Some(f) => f,
            None => {
                if std::mem::take(&mut pending) && w.flush().await.is_err() {
                    return None;
                }
                control_run = 0;
                let got = futures_lite::future::or(async { control.recv_async().await.ok().map(|f| (true, f)) }, async {
                    bulk.recv_async().await.ok().map(|f| (false, f))
                })
                .await;
                match got {
                    Some(f) => f,
                    None => {
                        // One lane closed: drain the other, then stop.
                        while let Ok(f) = control.try_recv().or_else(|_| bulk.try_recv()) {
                            if w.write_all(&f).await.is_err() {
                                return None;
                            }
                        }
                        return w.flush().await.ok().map(|_| w);
                    }
                }
            }
        };
        control_run = if is_control { control_run + 1 } else { 0 };
        let written = w.write_all(&frame).await.is_ok();
        if !is_control {
            room.give(bulk_units(frame.len()));
        }
        if !written {
            return None;
        }
        pending = true;
        // The end of a control run: push it out (TLS buffers records until flushed).
        if is_control && control.is_empty() && !bulk.is_empty() {
            if w.flush().await.is_err() {
                return None;
            }
            pending = false;
        }
    }
}

/// Query items from which a query is freed on a blocking thread ([`shards::drop_detached`])
/// rather than on the shard, which it would hold up (~60 ns per item).
const WIDE_QUERY_ITEMS: usize = 4096;

/// Lets go of a read's or subscription's query once it is done: a wide one is freed on a
/// blocking thread (if this was its last reference).
fn release(query: Arc<QueryMatcher>) {
    if query.width() >= WIDE_QUERY_ITEMS {
        shards::drop_detached(query);
    }
}

/// Request frames at least this long (bytes) are decoded on a blocking thread
/// ([`pb::decode_inbound`]), not on the shard: decoding and converting a long condition or
/// query takes long enough (~0.5 µs per query item) to hold up every other connection the
/// shard serves. An append of 512 events of 256 bytes (~150 KiB) stays on the shard.
const DECODE_OFF_SHARD: usize = 256 << 10;

/// The least cap on a connection's first frame, before its Hello succeeds, in bytes.
const FIRST_FRAME_MIN_CAP: u32 = 64 << 10;

/// The largest first frame a connection may send, in bytes: its Hello (reference protocol
/// §1.4) holds a version and a token, so room for the longest configured token (at least
/// [`FIRST_FRAME_MIN_CAP`]), and never more than `server.max_frame_len`. Without it, every
/// connection not yet authenticated could make the server buffer a whole `max_frame_len`
/// frame (16 MiB by default; up to `server.limits.max_connections` of them) before finding out
/// that it is not a Hello.
fn first_frame_cap(settings: &crate::config::Settings) -> u32 {
    let longest = settings.auth.token_strs().map(str::len).max().unwrap_or(0);
    let room = u32::try_from(longest.saturating_mul(2).saturating_add(1024)).unwrap_or(u32::MAX);
    room.max(FIRST_FRAME_MIN_CAP).min(settings.server.max_frame_len)
}

/// Bytes of bulk frames queued toward one client, besides the `frame_queue_depth` bound on
/// their number (review: 256 frames of 512 KiB read batches held 128 MiB per connection).
const BULK_LANE_BYTES: u64 = 16 << 20;

/// The bytes a connection's bulk lane may still take, handed out strictly in the order they
/// were asked for: a frame that needs more room than is free holds up the frames queued after
/// it, so bulk frames reach the client in the order their producers queued them, as with the
/// reference's single queue (review: with glommio's semaphore, which lets a small request
/// pass a large one waiting, a 12 MB read frame waited as long as a busy subscription on the
/// same connection kept taking the room in ~400 KB pieces).
struct LaneRoom {
    free: Cell<u64>,
    /// Tickets of the callers waiting, oldest first.
    queue: RefCell<std::collections::VecDeque<u64>>,
    next_ticket: Cell<u64>,
    closed: Cell<bool>,
    changed: event_listener::Event,
}

impl LaneRoom {
    fn new(bytes: u64) -> LaneRoom {
        LaneRoom { free: Cell::new(bytes), queue: RefCell::new(Default::default()), next_ticket: Cell::new(0), closed: Cell::new(false), changed: event_listener::Event::new() }
    }

    /// Takes `n` bytes of room once every earlier caller has had theirs; `false` once the
    /// lane is closed. Dropping the future gives up its place in the queue.
    async fn take(&self, n: u64) -> bool {
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        self.queue.borrow_mut().push_back(ticket);
        let _place = Place { room: self, ticket };
        loop {
            if self.closed.get() {
                return false;
            }
            if self.queue.borrow().front() == Some(&ticket) && self.free.get() >= n {
                self.free.set(self.free.get() - n);
                // `_place` leaves the queue on the way out and wakes the next in line.
                return true;
            }
            let changed = self.changed.listen();
            if self.closed.get() || (self.queue.borrow().front() == Some(&ticket) && self.free.get() >= n) {
                continue;
            }
            changed.await;
        }
    }

    /// Gives `n` bytes of room back (a frame was written, or never queued).
    fn give(&self, n: u64) {
        self.free.set(self.free.get() + n);
        self.changed.notify(usize::MAX);
    }

    /// Ends every wait, now and later: nothing will be written any more.
    fn close(&self) {
        self.closed.set(true);
        self.changed.notify(usize::MAX);
    }
}

/// A caller's place in a [`LaneRoom`]'s queue, left when the caller is served or goes away.
struct Place<'a> {
    room: &'a LaneRoom,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut queue = self.room.queue.borrow_mut();
        if let Some(i) = queue.iter().position(|&t| t == self.ticket) {
            queue.remove(i);
            drop(queue);
            self.room.changed.notify(usize::MAX);
        }
    }
}

/// The error that ends a read or subscription whose next event does not fit one frame.
fn too_large_to_send(e: impl std::fmt::Display) -> response::Kind {
    response::Kind::Error(convert::internal_error(format!("event too large to send: {e} (raise server.max_frame_len to read it)")))
}

/// The lane room a bulk frame of `len` bytes takes: its length, or all of the room for a frame
/// larger than that (it then waits for an empty lane).
fn bulk_units(len: usize) -> u64 {
    (len as u64).clamp(1, BULK_LANE_BYTES)
}

/// How full the `ReadEvents` batch in the making is, by the reference's measure (its protocol
/// §1.7): events, and bytes of the events as the engine encodes them (type, tags, payload and
/// their lengths, as stored), not their protobuf size. A batch is sent once either reaches
/// `server.reads.batch_events` / `batch_bytes`, checked after each event.
#[derive(Default)]
struct Fill {
    count: usize,
    bytes: usize,
}

impl Fill {
    /// Counts `ev` in; true when the batch is now full.
    fn add(&mut self, ev: &crate::event::EventRef<'_>, cfg: &crate::config::ReadsSettings) -> bool {
        self.count += 1;
        self.bytes += ev.as_bytes().len();
        self.count >= cfg.batch_events || self.bytes >= cfg.batch_bytes
    }
}

/// Ends the `ReadEvents` frame of request `id` that `enc` holds, into `frames`, and starts the
/// next one (a subscription's poll cannot send from inside its callback, so it collects
/// frames); the error is why the frame could not be encoded (over `max_frame_len`).
fn cut_frame(enc: &mut ReadEventsEncoder, fill: &mut Fill, id: u64, max_frame_len: u32, frames: &mut Vec<Vec<u8>>) -> Result<(), String> {
    let cut = enc.finish(id, max_frame_len).map(|f| frames.push(f.to_vec())).map_err(|e| e.to_string());
    enc.clear();
    *fill = Fill::default();
    cut
}

/// Reads of one connection that build a batch at the same time (see `Conn::stream_read`).
const READ_SLOTS: u64 = 4;

/// Control frames written in a row before one waiting bulk frame is let through.
const CONTROL_RUN: u32 = 64;

struct Conn {
    ctx: Arc<Context>,
    router: Rc<ReplyRouter>,
    lanes: Lanes,
    append_budget: Rc<Semaphore>,
    read_budget: Rc<Semaphore>,
    read_overflow: Rc<Semaphore>,
    /// [`READ_SLOTS`] permits: a read builds a batch only while it holds one.
    read_slots: Rc<Semaphore>,
    subscriptions: Rc<Cell<usize>>,
    inflight: Rc<Cell<usize>>,
    /// The cancel flags of the reads and subscriptions running, by request id. Ids need not be
    /// unique (the reference does not check them, protocol §1.5): a cancel stops every stream
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
    let _ = stream.set_nodelay(true);
    {
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        // SAFETY: borrow the descriptor only to set options; the stream keeps owning it.
        let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let ka = socket2::TcpKeepalive::new().with_time(ctx.settings.server.keepalive.idle()).with_interval(ctx.settings.server.keepalive.interval());
        if let Err(e) = socket2::SockRef::from(&sock).set_tcp_keepalive(&ka) {
            tracing::debug!(error = %e, "cannot set TCP keepalive");
        }
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let timeouts = ctx.settings.server.timeouts.clone();
    // When bytes last arrived under TLS (a plain connection's reader sees every byte itself).
    let heard = Rc::new(Cell::new(accepted));
    let io = match &ctx.tls {
        None => Io::Plain(stream),
        Some(cfg) => {
            let acceptor = futures_rustls::TlsAcceptor::from(cfg.clone());
            let limit = timeouts.tls_handshake().unwrap_or(Duration::from_secs(3600));
            let stream = Heard { stream, last: heard.clone() };
            let hs = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
                glommio::timer::sleep(limit).await;
                None
            });
            // A stalled handshake must not hold up a graceful shutdown either.
            match unless_shutdown(&ctx, hs).await {
                None => return,
                Some(Some(Ok(s))) => Io::Tls(Box::new(s)),
                Some(Some(Err(e))) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Some(None) => {
                    ctx.connections_reaped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    };
    let (mut reader, writer) = futures_lite::io::split(io);
    let bp = &ctx.settings.server.backpressure;
    let (ctl_tx, ctl_rx) = flume::bounded(bp.max_inflight_per_conn.max(64));
    let (bulk_tx, bulk_rx) = flume::bounded(bp.frame_queue_depth.max(1));
    let (abandon_tx, abandon_rx) = flume::bounded(1);
    let bulk_room = Rc::new(LaneRoom::new(BULK_LANE_BYTES));
    let room = bulk_room.clone();
    let egress_task = glommio::spawn_local(async move {
        let out = egress(writer, ctl_rx, bulk_rx, &room).await;
        // Whoever still waits for room gives up: nothing will be written any more.
        room.close();
        out
    });
    let conn = Rc::new(Conn {
        lanes: Lanes { control: ctl_tx, bulk: bulk_tx, bulk_room, max_frame_len: ctx.settings.server.max_frame_len, abandoned: Rc::new(Cell::new(false)), abandon_tx },
        append_budget: Rc::new(Semaphore::new(bp.max_inflight_per_conn as u64)),
        read_budget: Rc::new(Semaphore::new(bp.max_inflight_per_conn as u64)),
        read_overflow: Rc::new(Semaphore::new(bp.max_inflight_per_conn as u64)),
        read_slots: Rc::new(Semaphore::new(READ_SLOTS)),
        subscriptions: Rc::new(Cell::new(0)),
        inflight: Rc::new(Cell::new(0)),
        cancels: Rc::new(RefCell::new(HashMap::new())),
        cancelled: Rc::new(event_listener::Event::new()),
        router,
        ctx: ctx.clone(),
    });

    let max_frame_len = ctx.settings.server.max_frame_len;
    // Until its Hello succeeds a client may send only a first frame of Hello size.
    let first_cap = first_frame_cap(&ctx.settings);
    let mut dec = FrameDecoder::new(first_cap);
    let mut established = false;
    let mut partial_since: Option<Instant> = None;
    let mut last_activity = Instant::now();
    // The client ended the stream (or it failed): nothing to linger for at the close.
    let mut client_closed = false;
    'conn: loop {
        // Serve every complete frame already buffered.
        loop {
            let frame = match dec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    let err = match e {
                        FrameError::TooLong { len, max } if !established && max < max_frame_len => Some(convert::first_frame_too_long(len, max)),
                        e => convert::frame_error_response(&e),
                    };
                    if let Some(err) = err {
                        unless_shutdown(&ctx, conn.lanes.error(0, err)).await;
                    }
                    break 'conn;
                }
            };
            last_activity = Instant::now();
            // The frame timer runs from the start of the frame still arriving: a client whose
            // every write ends mid-frame always leaves one partial, yet completes each.
            partial_since = None;
            if established {
                // A long frame is decoded on a blocking thread: this shard's other connections
                // go on meanwhile (frames keep their order: this reader waits for it).
                let inbound = if frame.len() >= DECODE_OFF_SHARD {
                    let owned = frame.to_vec();
                    match unless_shutdown(&ctx, shards::run_blocking(move || pb::decode_inbound(&owned))).await {
                        None => break 'conn,
                        Some(Some(decoded)) => decoded,
                        Some(None) => {
                            tracing::error!(len = frame.len(), "decoding a request panicked; closing its connection");
                            unless_shutdown(&ctx, conn.lanes.error(0, convert::internal_error("the request could not be decoded"))).await;
                            break 'conn;
                        }
                    }
                } else {
                    pb::decode_inbound(frame)
                };
                let inbound = match inbound {
                    Ok(i) => i,
                    Err(e) => {
                        if let Some(err) = convert::frame_error_response(&FrameError::Decode(e)) {
                            unless_shutdown(&ctx, conn.lanes.error(0, err)).await;
                        }
                        break 'conn;
                    }
                };
                // Serving a request may park the reader (a full control lane toward a client
                // that stopped reading, a spent append budget, a full writer queue); a
                // shutdown must still end the connection.
                if unless_shutdown(&ctx, conn.clone().handle(inbound)).await.is_none() {
                    break 'conn;
                }
                continue;
            }
            let req = match crate::proto::decode_request(frame) {
                Ok(r) => r,
                Err(e) => {
                    if let Some(err) = convert::frame_error_response(&FrameError::Decode(e)) {
                        unless_shutdown(&ctx, conn.lanes.error(0, err)).await;
                    }
                    break 'conn;
                }
            };
            match unless_shutdown(&ctx, conn.hello(req)).await {
                Some(true) => {
                    established = true;
                    dec.set_max_frame_len(max_frame_len);
                }
                _ => break 'conn,
            }
        }
        if conn.lanes.abandoned.get() {
            break 'conn;
        }
        partial_since = if dec.has_partial() { partial_since.or(Some(Instant::now())) } else { None };
        let now = Instant::now();
        let mut deadline: Option<Instant> = None;
        let mut consider = |d: Option<Instant>| {
            if let Some(d) = d {
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
            }
        };
        consider(partial_since.and_then(|p| timeouts.incomplete_frame().map(|t| p + t)));
        if !established {
            consider(timeouts.handshake().map(|t| accepted + t));
        }
        let busy = conn.inflight.get() > 0 || conn.subscriptions.get() > 0;
        if !busy || partial_since.is_some() {
            consider(timeouts.idle().map(|t| last_activity + t));
        }
        if let Some(d) = deadline {
            if d <= now {
                ctx.connections_reaped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("connection reaped by a timeout");
                break 'conn;
            }
        }
        // Wait for bytes, a deadline (re-evaluated at least every READ_TICK, since in-flight
        // work changes what counts as idle), or shutdown.
        let wait = deadline.map(|d| d - now).unwrap_or(READ_TICK).min(READ_TICK);
        let got = futures_lite::future::or(
            async { Wake::Read(dec.fill_from_async(&mut reader).await) },
            futures_lite::future::or(
                async {
                    // Ends with the wait, or when a reply could not be sent (checked above).
                    let _ = futures_lite::future::or(async { abandon_rx.recv_async().await.ok() }, async {
                        glommio::timer::sleep(wait).await;
                        None
                    })
                    .await;
                    Wake::Tick
                },
                async {
                    ctx.wait_shutdown().await;
                    Wake::Shutdown
                },
            ),
        )
        .await;
        match got {
            Wake::Tick => {
                // Part of a TLS record arrived meanwhile: the client is not idle.
                last_activity = last_activity.max(heard.get());
                continue;
            }
            // Not the client's doing: its answers still go out before the close.
            Wake::Shutdown => break 'conn,
            Wake::Read(Ok(0)) | Wake::Read(Err(_)) => {
                client_closed = true;
                break 'conn;
            }
            // Any byte is activity, a frame still arriving included (reference protocol §2.7:
            // idle is "no complete frame or progressing byte"); a frame that never completes
            // is for incomplete_frame_secs to end (review: a 1 MB append uploaded over 4 s was
            // reaped under idle_secs = 2 and lost; the reference acknowledged it).
            Wake::Read(Ok(_)) => last_activity = Instant::now(),
        }
    }
    for flag in conn.cancels.borrow().values().flatten() {
        flag.set(true);
    }
    conn.cancelled.notify(usize::MAX);
    // Let queued frames go out (they may be an error telling the client why), then close. A
    // client that stopped reading gets a bounded grace, shorter during a shutdown; dropping the
    // egress task then closes the socket and fails any producer still waiting on a lane.
    let lanes = conn.lanes.clone();
    drop(conn);
    drop(lanes);
    let shutting_down = ctx.is_shutting_down();
    let grace = if shutting_down { SHUTDOWN_DRAIN } else { CLOSE_DRAIN };
    let drain_started = Instant::now();
    let sent = futures_lite::future::or(egress_task, async {
        glommio::timer::sleep(grace).await;
        None
    })
    .await;
    match sent {
        Some(writer) if !client_closed && !shutting_down => linger(reader, writer).await,
        Some(writer) if !client_closed => close_once_delivered(fd, writer, grace.saturating_sub(drain_started.elapsed())).await,
        _ => {}
    }
}

/// Closes a connection at a graceful shutdown once the client's kernel has acknowledged every
/// byte sent to it, or after `limit`: half-close, then poll the socket's unacknowledged
/// output (`SIOCOUTQ`). The reader is not drained, so closing with requests still unread
/// sends a reset; a reset makes the client's kernel drop what it had not *received* yet (the
/// answers still in our send queue, behind a client that was slow to read), never what it
/// had: an append stored and answered must not lose its answer to the close (the client
/// would not know it was stored, and a retry would store it twice).
async fn close_once_delivered<W: AsyncWrite + Unpin>(fd: std::os::fd::RawFd, mut writer: W, limit: Duration) {
    use futures_lite::AsyncWriteExt;
    if writer.close().await.is_err() {
        return;
    }
    let delivered = async {
        while unacknowledged_output(fd).is_some_and(|n| n > 0) {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    };
    futures_lite::future::or(delivered, glommio::timer::sleep(limit)).await;
}

nix::ioctl_read_bad!(siocoutq, libc::TIOCOUTQ, libc::c_int);

/// Bytes written to the TCP socket `fd` that its peer has not acknowledged yet (sent or not),
/// from `SIOCOUTQ` (tcp(7)); `None` if the socket cannot say.
fn unacknowledged_output(fd: std::os::fd::RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which points at `n`; `fd` is the
    // connection's socket, open for as long as its stream halves live (the caller holds one).
    unsafe { siocoutq(fd, &mut n) }.ok().map(|_| n.max(0) as usize)
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

/// Closes a connection the server gave up on while its client may still be sending (a frame
/// over the cap, a bad Hello, an undecodable frame, a timeout): half-close (the client reads
/// the error and then end-of-stream), then read and discard what keeps arriving until the
/// client closes too, for at most [`LINGER`] and [`LINGER_BYTES`]. Closing a socket with
/// unread bytes in it sends a reset instead, and a reset makes the client's kernel drop the
/// error frame it had not read yet: a client that was writing a 20 MiB frame would see
/// "connection reset" instead of `TOO_LARGE`.
async fn linger<R: futures_lite::AsyncRead + Unpin, W: AsyncWrite + Unpin>(mut reader: R, mut writer: W) {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    if writer.close().await.is_err() {
        return;
    }
    let discard = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0usize;
        while total < LINGER_BYTES {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    futures_lite::future::or(discard, glommio::timer::sleep(LINGER)).await;
}

/// Longest a closing connection keeps discarding what its client still sends.
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes a closing connection discards before it closes regardless.
const LINGER_BYTES: usize = 64 << 20;

/// Positions a read or a subscription's catch-up may scan without a match before it checks
/// whether the shard's other work is due (each costs about 0.1 µs: ~50 µs per step).
const READ_STEP: usize = 512;

/// The longest a connection's reader waits for bytes before re-checking its deadlines (and
/// re-polling the socket). Deadlines themselves are waited for exactly; the tick only bounds
/// how late the idle timeout starts to count after in-flight work ends. Every tick wakes the
/// shard: at 100 ms, 200 idle connections cost 7.7% of a core.
const READ_TICK: Duration = Duration::from_secs(1);

/// Bytes a `ReadEvents` frame spends around its events (the response's request id and the
/// `kind` field's key and length): kept free when deciding whether one more event fits.
const FRAME_HEAD_ROOM: usize = 24;

/// How long a closing connection may take to deliver its queued frames.
const CLOSE_DRAIN: Duration = Duration::from_secs(5);
/// The same during a graceful shutdown.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

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
    /// Checks the first frame (reference protocol §1.4); false closes the connection.
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
            Some(request::Kind::Hello(_)) | None => self.lanes.error(id, convert::bad_request(text::NO_KIND)).await,
        }
    }

    async fn append_error(&self, id: u64, e: pb::ErrorResponse) {
        self.ctx.append_errors[code_index(ErrorCode::from_wire(e.code))].fetch_add(1, Ordering::Relaxed);
        self.lanes.error(id, e).await;
    }

    /// The fast path: records were framed straight from the wire bytes.
    async fn append_framed(self: Rc<Self>, fa: crate::proto::append::FramedAppend, condition: Result<Option<crate::model::AppendCondition>, convert::ConvertError>) {
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
        let Ok(permit) = self.append_budget.acquire_static_permit(1).await else { return };
        let prepared = match PreparedAppend::from_framed(fa.records, fa.count, fa.largest_record, condition, self.ctx.store.segment_config()) {
            Ok(p) => p,
            Err(e) => return self.append_error(id, append_error_response(e)).await,
        };
        self.submit(id, prepared, permit, started).await;
    }

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
        let Ok(permit) = self.append_budget.acquire_static_permit(1).await else { return };
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
    async fn submit(self: Rc<Self>, id: u64, prepared: PreparedAppend, permit: glommio::sync::StaticPermit, started: Instant) {
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
    fn complete(self: Rc<Self>, id: u64, res: crate::writer::AppendResult, permit: glommio::sync::StaticPermit, started: Instant) {
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
                self.lanes.abandoned.set(true);
                let _ = self.lanes.abandon_tx.try_send(());
                done(&self);
            }
            Some(frame) => match self.lanes.control.try_send(frame) {
                Err(flume::TrySendError::Full(frame)) => {
                    tracing::debug!(id, "control lane full: the append's answer waits for room");
                    glommio::spawn_local(async move {
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

    fn register_cancel(&self, id: u64) -> Rc<Cell<bool>> {
        let flag = Rc::new(Cell::new(false));
        self.cancels.borrow_mut().entry(id).or_default().push(flag.clone());
        flag
    }

    fn unregister_cancel(&self, id: u64, flag: &Rc<Cell<bool>>) {
        let mut c = self.cancels.borrow_mut();
        if let Some(flags) = c.get_mut(&id) {
            flags.retain(|f| !Rc::ptr_eq(f, flag));
            if flags.is_empty() {
                c.remove(&id);
            }
        }
    }

    async fn read(self: Rc<Self>, id: u64, r: pb::ReadRequest, query: Result<Arc<QueryMatcher>, convert::ConvertError>) {
        let query = match query {
            Ok(q) => q,
            Err(e) => return self.lanes.error(id, e.to_error_response()).await,
        };
        // Admission never blocks the reader: a running slot, else a queued slot, else refuse.
        let run_permit = self.read_budget.try_acquire_static_permit(1).ok();
        let overflow = if run_permit.is_none() {
            match self.read_overflow.try_acquire_static_permit(1) {
                Ok(p) => Some(p),
                Err(_) => {
                    release(query);
                    return self.lanes.error(id, convert::bad_request(text::TOO_MANY_READS)).await;
                }
            }
        } else {
            None
        };
        // Pinned now, in request order: a read sees exactly what was durable when it arrived,
        // not an append pipelined after it on this connection that commits before the read's
        // first step (planning waits for that step).
        let reads = if r.reverse {
            self.ctx.store.read_back_prepared(query.clone(), crate::model::Position(r.after), r.limit).without_waiting()
        } else {
            self.ctx.store.read_prepared(query.clone(), crate::model::Position(r.after), r.limit).without_waiting()
        };
        let cancel = self.register_cancel(id);
        self.inflight.set(self.inflight.get() + 1);
        let me = self.clone();
        shards::spawn_bulk(async move {
            let permit = match run_permit {
                Some(p) => Some(p),
                None => {
                    // Queued: until a running slot frees up, or the read is abandoned (cancelled,
                    // its connection closed, the server shutting down).
                    let p = futures_lite::future::or(async { me.read_budget.acquire_static_permit(1).await.ok() }, async {
                        me.abandoned(&cancel).await;
                        None
                    })
                    .await;
                    drop(overflow);
                    p
                }
            };
            // Planning a read (its first step) costs something too: a burst of new reads takes
            // its turn with the running ones rather than all planning before the executor
            // looks at I/O.
            shards::bulk_yield().await;
            if permit.is_some() && !cancel.get() {
                me.stream_read(id, reads, &cancel).await;
            } else {
                // Abandoned before it ran: its clone of the query goes first, so that `release`
                // holds the last reference and a wide one is freed off the shard.
                drop(reads);
            }
            me.unregister_cancel(id, &cancel);
            me.inflight.set(me.inflight.get() - 1);
            drop(permit);
            release(query);
        });
    }

    /// Fetches the range a read stopped at (it is on the disk) on a blocking thread while this
    /// shard serves its other connections; `None` if the fetch panicked (the read then stops
    /// at the same range again) or the read was cancelled (its connection closed, the client
    /// cancelled it, the server is shutting down) meanwhile: a fetch still queued then never
    /// runs, so abandoned reads do not hold up the blocking threads (review: 30 abandoned cold
    /// reads of large events held a new read up for 4 s on a throttled disk).
    async fn fetch(&self, mut warm: crate::read::ColdRange, cancel: &Cell<bool>) -> Option<crate::read::ColdRange> {
        self.ctx.read_disk_fetches.fetch_add(1, Ordering::Relaxed);
        let fetched = shards::run_blocking(move || {
            warm.run();
            warm
        });
        futures_lite::future::or(fetched, async {
            self.abandoned(cancel).await;
            None
        })
        .await
    }

    /// Returns once the request behind `cancel` is abandoned: cancelled (by the client, or by
    /// its connection closing) or the server is shutting down. Woken by the connection's
    /// [`Conn::cancelled`] and the shutdown, never by a timer: hundreds of queued reads on a
    /// connection cost nothing while they wait (review: their 20 ms polls, 512 reads on each
    /// of 60 connections, kept both CPUs busy).
    async fn abandoned(&self, cancel: &Cell<bool>) {
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            let l = self.cancelled.listen();
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            futures_lite::future::or(l, self.ctx.wait_shutdown()).await;
        }
    }

    /// Waits for one of the connection's [`READ_SLOTS`]; `None` once the read is cancelled
    /// (or the server shuts down) meanwhile.
    async fn read_slot(&self, cancel: &Cell<bool>) -> Option<glommio::sync::StaticPermit> {
        if let Ok(p) = self.read_slots.try_acquire_static_permit(1) {
            return Some(p);
        }
        futures_lite::future::or(async { self.read_slots.acquire_static_permit(1).await.ok() }, async {
            self.abandoned(cancel).await;
            None
        })
        .await
    }

    /// Streams a read as `ReadEvents` batches then `ReadEnd`; stops silently on cancel.
    ///
    /// Each batch is built while holding one of the connection's [`READ_SLOTS`], given back
    /// with the batch's buffers once the batch is queued: however many reads a connection has
    /// running (up to `max_inflight_per_conn`), at most that many hold a batch in the making or
    /// wait for room in the bulk lane (review: 512 reads on a client that never read its socket
    /// held ~600 MB per connection, each with its own half-built batch).
    async fn stream_read(&self, id: u64, mut reads: crate::read::Reads, cancel: &Cell<bool>) {
        let watermark = reads.watermark().get();
        let cfg = &self.ctx.settings.server.reads;
        let mut enc = ReadEventsEncoder::new();
        let mut fill = Fill::default();
        let mut budget = READ_STEP;
        let mut slot = None;
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            if slot.is_none() {
                slot = self.read_slot(cancel).await;
                if slot.is_none() {
                    return;
                }
            }
            let (full, done) = match reads.step(&mut budget) {
                Step::Blocked(warm) => {
                    if let Some(warm) = self.fetch(warm, cancel).await {
                        reads.fetched(warm);
                    }
                    continue;
                }
                Step::Pending => {
                    // A long non-matching stretch: let the shard's other work run.
                    budget = READ_STEP;
                    shards::bulk_yield().await;
                    continue;
                }
                Step::End => (!enc.is_empty(), true),
                Step::Failed(e) => {
                    if !enc.is_empty() {
                        if let Ok(f) = enc.finish(id, self.lanes.max_frame_len) {
                            if !self.stream_frame(f.to_vec(), cancel).await {
                                return;
                            }
                        }
                    }
                    self.stream_bulk(id, response::Kind::Error(convert::internal_error(e)), cancel).await;
                    return;
                }
                Step::Event(p, ev) => {
                    if self.lanes.needs_new_frame(&enc, &ev) {
                        // Keep every frame within max_frame_len: send what we have first.
                        if !self.flush_batch(id, &mut enc, &mut fill, cancel).await {
                            return;
                        }
                    }
                    enc.push(p, &ev);
                    (fill.add(&ev, cfg), false)
                }
            };
            if full {
                if !self.flush_batch(id, &mut enc, &mut fill, cancel).await {
                    return;
                }
                if !done {
                    // Queued: give the slot back, and the memory with it.
                    slot = None;
                    enc = ReadEventsEncoder::new();
                    reads.release_window();
                }
            }
            if done {
                self.stream_bulk(id, response::Kind::ReadEnd(pb::ReadEnd { watermark }), cancel).await;
                return;
            }
            shards::bulk_yield().await;
        }
    }

    /// Queues a read's or subscription's bulk frame once the lane has room, or gives up once
    /// the stream is abandoned (cancelled, its connection closing, a shutdown): a cancel ends a
    /// stream that waits for room toward a client that does not read (review: such a
    /// subscription outlived its cancel and kept its slot under the subscription cap). `false`
    /// when it gave up or the connection is going away.
    async fn stream_frame(&self, f: Vec<u8>, cancel: &Cell<bool>) -> bool {
        futures_lite::future::or(self.lanes.bulk_frame(f), async {
            self.abandoned(cancel).await;
            false
        })
        .await
    }

    /// [`Conn::stream_frame`] of a response to encode (the stream's batches, its end or its
    /// error: every bulk frame of a stream goes through here or `stream_frame`).
    async fn stream_bulk(&self, id: u64, kind: response::Kind, cancel: &Cell<bool>) -> bool {
        match self.lanes.encode(id, kind) {
            Some(f) => self.stream_frame(f, cancel).await,
            None => false,
        }
    }

    async fn flush_batch(&self, id: u64, enc: &mut ReadEventsEncoder, fill: &mut Fill, cancel: &Cell<bool>) -> bool {
        *fill = Fill::default();
        let frame = match enc.finish(id, self.lanes.max_frame_len) {
            Ok(f) => f.to_vec(),
            Err(e) => {
                enc.clear();
                self.stream_bulk(id, too_large_to_send(e), cancel).await;
                return false;
            }
        };
        enc.clear();
        self.stream_frame(frame, cancel).await
    }

    async fn subscribe(self: Rc<Self>, id: u64, s: pb::SubscribeRequest, query: Result<Arc<QueryMatcher>, convert::ConvertError>) {
        let query = match query {
            Ok(q) => q,
            Err(e) => return self.lanes.error(id, e.to_error_response()).await,
        };
        if self.subscriptions.get() >= self.ctx.settings.server.subscriptions.max_concurrent {
            release(query);
            return self.lanes.error(id, convert::bad_request(text::TOO_MANY_SUBSCRIPTIONS)).await;
        }
        self.subscriptions.set(self.subscriptions.get() + 1);
        self.ctx.active_subscriptions.fetch_add(1, Ordering::SeqCst);
        let cancel = self.register_cancel(id);
        let me = self.clone();
        // Woken by the writer's thread when new events are published.
        shards::spawn_bulk(shards::reliable_wakes(async move {
            me.run_subscription(id, query.clone(), crate::model::Position(s.after), &cancel).await;
            release(query);
            me.unregister_cancel(id, &cancel);
            me.subscriptions.set(me.subscriptions.get() - 1);
            me.ctx.active_subscriptions.fetch_sub(1, Ordering::SeqCst);
        }));
    }

    async fn run_subscription(&self, id: u64, query: Arc<QueryMatcher>, after: crate::model::Position, cancel: &Cell<bool>) {
        shards::bulk_yield().await;
        // Records that must come from the disk are fetched on a blocking thread, never on
        // this shard's (which serves other connections meanwhile).
        let mut sub = self.ctx.store.subscribe_prepared(query, after).without_waiting();
        let cfg = &self.ctx.settings.server.reads;
        let tick = self.ctx.settings.server.subscriptions.wait_tick();
        let mut announced = false;
        let mut enc = ReadEventsEncoder::new();
        let mut fill = Fill::default();
        // Events delivered so far in the reference-sized poll under way.
        let mut in_poll = 0usize;
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            let mut failed = None;
            let mut frames = Vec::new();
            let mut budget = READ_STEP;
            let polled = sub.poll_within(crate::read::POLL_BATCH_EVENTS - in_poll, &mut budget, |p, ev| {
                if failed.is_some() {
                    return;
                }
                // A frame that cannot be sent ends the subscription there: nothing after the
                // event that failed may be delivered, or a subscriber resuming from the last
                // position it saw would never get that event.
                if self.lanes.needs_new_frame(&enc, &ev) {
                    if let Err(e) = cut_frame(&mut enc, &mut fill, id, self.lanes.max_frame_len, &mut frames) {
                        failed = Some(e);
                        return;
                    }
                }
                enc.push(p, &ev);
                if fill.add(&ev, cfg) {
                    failed = cut_frame(&mut enc, &mut fill, id, self.lanes.max_frame_len, &mut frames).err();
                }
            });
            // The reference frames each poll of up to POLL_BATCH_EVENTS events on its own (its
            // protocol §1.7); ours may stop a poll early (the step budget, a fetch from the disk)
            // and resume it, so the rest of a batch is sent only where the reference's poll
            // would have ended: that many events, the live edge, or a failure.
            let poll_ended = match &polled {
                Ok(p) => {
                    in_poll += p.delivered;
                    p.caught_up || in_poll >= crate::read::POLL_BATCH_EVENTS
                }
                Err(_) => true,
            };
            if poll_ended {
                in_poll = 0;
            }
            if failed.is_none() && !enc.is_empty() && poll_ended {
                failed = cut_frame(&mut enc, &mut fill, id, self.lanes.max_frame_len, &mut frames).err();
            }
            // The frames built before a failure go out first: the subscriber gets every event
            // up to the one that failed, as a read does.
            for f in frames {
                if !self.stream_frame(f, cancel).await {
                    return;
                }
            }
            let polled = match (polled, failed) {
                (Ok(p), None) => p,
                (Err(e), _) => {
                    self.stream_bulk(id, response::Kind::Error(convert::internal_error(e)), cancel).await;
                    return;
                }
                (_, Some(e)) => {
                    self.stream_bulk(id, too_large_to_send(e), cancel).await;
                    return;
                }
            };
            if polled.delivered > 0 || !polled.caught_up {
                if polled.delivered > 0 {
                    announced = false;
                }
                match sub.take_cold_range() {
                    Some(warm) => {
                        if let Some(warm) = self.fetch(warm, cancel).await {
                            sub.fetched(warm);
                        }
                    }
                    None => shards::bulk_yield().await,
                }
                continue;
            }
            if !announced {
                if !self.stream_bulk(id, response::Kind::CaughtUp(pb::SubscribeCaughtUp { watermark: sub.position().get() }), cancel).await {
                    return;
                }
                announced = true;
            }
            let _ = futures_lite::future::or(async { Some(sub.wait().await) }, async {
                glommio::timer::sleep(tick).await;
                None
            })
            .await;
        }
    }
}

/// Maps an engine append error to its wire error (reference engine §2.3 table).
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
    use super::LaneRoom;
    use futures_lite::future::{block_on, poll_once};
    use std::pin::pin;

    /// Room is handed out in the order it was asked for: a small request does not pass a large
    /// one that is waiting, a caller that goes away gives up its place, and closing ends every
    /// wait.
    #[test]
    fn lane_room_serves_in_order() {
        block_on(async {
            let room = LaneRoom::new(10);
            assert!(room.take(8).await);
            let mut big = pin!(room.take(10));
            assert_eq!(poll_once(big.as_mut()).await, None);
            // 2 bytes are free, but the 10-byte request came first.
            let mut small = pin!(room.take(1));
            assert_eq!(poll_once(small.as_mut()).await, None);
            room.give(8);
            assert_eq!(poll_once(small.as_mut()).await, None);
            assert_eq!(poll_once(big.as_mut()).await, Some(true));
            assert_eq!(poll_once(small.as_mut()).await, None);
            room.give(10);
            assert_eq!(poll_once(small.as_mut()).await, Some(true));
            // A waiter that goes away no longer holds up the ones behind it.
            {
                let mut huge = Box::pin(room.take(100));
                assert_eq!(poll_once(huge.as_mut()).await, None);
                let mut next = pin!(room.take(1));
                assert_eq!(poll_once(next.as_mut()).await, None);
                drop(huge);
                assert_eq!(poll_once(next.as_mut()).await, Some(true));
            }
            let mut waiting = pin!(room.take(100));
            assert_eq!(poll_once(waiting.as_mut()).await, None);
            room.close();
            assert_eq!(poll_once(waiting.as_mut()).await, Some(false));
            assert!(!room.take(1).await);
        });
    }
}
