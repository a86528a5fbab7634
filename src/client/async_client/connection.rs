//! One socket of an [`AsyncClient`](super::AsyncClient): the state shared between the
//! callers and the socket's driver, the per-request mailboxes, and the driver future.
//!
//! Callers encode their request frame themselves (so an over-long request fails before
//! anything is queued), take an in-flight permit, register a [`Slot`] under a fresh request
//! id, and push the frame into a bounded queue. The driver ([`Connection`]) is a single
//! hand-written future that owns the stream: it writes queued frames (cancels first),
//! flushing once per burst, and reads response frames, routing each by request id into its
//! slot. Frames for ids nobody waits for any more are dropped (docs/protocol.md §7).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures_core::Stream;
use futures_lite::{AsyncRead, AsyncWrite};
use prost::Message;

use crate::client::ClientError;
use crate::proto::frame::READ_CHUNK;
use crate::proto::{self, request, response, FrameDecoder, FrameError, Request, Response};

/// Bytes of queued frames gathered into one `write` call.
const WRITE_BATCH: usize = 256 * 1024;
/// Frames routed per poll of a [`Connection`] before it yields to its executor.
const FRAMES_PER_POLL: usize = 256;
/// Writes per poll of a [`Connection`] before it yields to its executor.
const WRITES_PER_POLL: usize = 64;

/// Why a socket stopped, kept in a cloneable form so every pending request can get it.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// The server sent an unattributed (id 0) error before the socket ended.
    Server(proto::ErrorResponse),
    /// The server closed the connection at a frame boundary.
    Eof,
    /// A transport error, by kind and text.
    Io(io::ErrorKind, String),
    /// A response frame longer than the cap.
    TooLong { len: u64, max: u32 },
    /// The server closed the connection part-way through a frame.
    Torn { buffered: usize },
    /// The server sent something unusable.
    Protocol(String),
    /// The driver future was dropped before the connection ended.
    DriverDropped,
    /// Every client handle was dropped and the socket was closed.
    Closed,
}

impl Failure {
    fn from_frame(err: FrameError) -> Failure {
        match err {
            FrameError::Io(e) => Failure::Io(e.kind(), e.to_string()),
            FrameError::TooLong { len, max } => Failure::TooLong { len, max },
            FrameError::Torn { buffered } => Failure::Torn { buffered },
            FrameError::Decode(e) => Failure::Protocol(format!("undecodable response frame: {e}")),
        }
    }

    fn from_io(err: &io::Error) -> Failure {
        Failure::Io(err.kind(), err.to_string())
    }

    /// The error handed to a request that was pending on (or issued after) the failure.
    pub(super) fn to_error(&self) -> ClientError {
        match self {
            Failure::Server(e) => ClientError::from_response(e.clone()),
            Failure::Eof => ClientError::UnexpectedEof,
            Failure::Io(kind, text) => ClientError::Io(io::Error::new(*kind, text.clone())),
            Failure::TooLong { len, max } => ClientError::Frame(FrameError::TooLong { len: *len, max: *max }),
            Failure::Torn { buffered } => ClientError::Frame(FrameError::Torn { buffered: *buffered }),
            Failure::Protocol(text) => ClientError::Protocol(text.clone()),
            Failure::DriverDropped => ClientError::Protocol("the connection driver was dropped".into()),
            Failure::Closed => ClientError::Protocol("the connection was closed".into()),
        }
    }
}

/// What a slot delivers: one response frame's payload, or an error.
pub(super) type Delivery = Result<response::Kind, ClientError>;

/// The mailbox of one request: frames routed to its id, in arrival order. Unbounded: a
/// stream that is not polled buffers its frames here (see the module docs of
/// [`AsyncClient`](super::AsyncClient)).
#[derive(Default)]
pub(super) struct Slot {
    inner: Mutex<SlotInner>,
}

#[derive(Default)]
struct SlotInner {
    queue: VecDeque<Delivery>,
    waker: Option<Waker>,
    /// No more deliveries will come (after a connection failure).
    done: bool,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, item: Delivery, last: bool) {
        let waker = {
            let mut s = self.lock();
            if s.done {
                return;
            }
            s.queue.push_back(item);
            s.done = last;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The next delivery; `None` once the slot is done and drained.
    pub(super) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        let mut s = self.lock();
        if let Some(item) = s.queue.pop_front() {
            return Poll::Ready(Some(item));
        }
        if s.done {
            return Poll::Ready(None);
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// State shared by the callers and the driver of one socket.
pub(super) struct Shared {
    state: Mutex<State>,
    /// Bounds the requests in flight on this socket (`max_inflight_requests`).
    pub(super) inflight: Arc<async_lock::Semaphore>,
    next_id: AtomicU64,
    max_frame_len: u32,
}

struct State {
    pending: HashMap<u64, Arc<Slot>>,
    failure: Option<Failure>,
    /// The last id-0 error received (docs/protocol.md §11): the reason given when the socket ends.
    unattributed: Option<proto::ErrorResponse>,
    /// Requests to cancel, sent ahead of queued requests.
    cancels: Vec<u64>,
    driver_waker: Option<Waker>,
}

impl Shared {
    /// `first_id` is the first request id after the Hello's.
    pub(super) fn new(max_inflight: usize, max_frame_len: u32, first_id: u64) -> Shared {
        Shared {
            state: Mutex::new(State { pending: HashMap::new(), failure: None, unattributed: None, cancels: Vec::new(), driver_waker: None }),
            inflight: Arc::new(async_lock::Semaphore::new(max_inflight)),
            next_id: AtomicU64::new(first_id),
            max_frame_len,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh request id; never 0 and never the Hello's.
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The error for a request that cannot be served because the socket is gone.
    pub(super) fn gone_error(&self) -> ClientError {
        self.lock().failure.as_ref().unwrap_or(&Failure::DriverDropped).to_error()
    }

    /// The failure, if the socket has ended.
    pub(super) fn failure(&self) -> Option<Failure> {
        self.lock().failure.clone()
    }

    /// Registers a mailbox for `id`, unless the socket has already failed.
    fn register(self: &Arc<Self>, id: u64) -> Result<Registration, ClientError> {
        let slot = Arc::new(Slot::default());
        let mut s = self.lock();
        if let Some(f) = &s.failure {
            return Err(f.to_error());
        }
        s.pending.insert(id, Arc::clone(&slot));
        Ok(Registration { shared: Arc::clone(self), id, slot })
    }

    /// Asks the driver to send a `CancelRequest` for `target` (never lost to a full queue).
    pub(super) fn cancel(&self, target: u64) {
        let waker = {
            let mut s = self.lock();
            if s.failure.is_some() {
                return;
            }
            s.cancels.push(target);
            s.driver_waker.clone()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Records the failure (the first one wins; an id-0 error received earlier takes its
    /// place) and fails every pending request with it.
    fn fail(&self, failure: Failure) -> Failure {
        let (failure, slots) = {
            let mut s = self.lock();
            if let Some(f) = &s.failure {
                return f.clone();
            }
            let failure = match (failure, s.unattributed.take()) {
                (Failure::Closed, _) => Failure::Closed,
                (_, Some(e)) => Failure::Server(e),
                (f, None) => f,
            };
            s.failure = Some(failure.clone());
            s.cancels.clear();
            let slots: Vec<_> = s.pending.drain().map(|(_, slot)| slot).collect();
            (failure, slots)
        };
        for slot in slots {
            slot.push(Err(failure.to_error()), true);
        }
        failure
    }

    /// Routes one response frame.
    fn route(&self, resp: Response) {
        if resp.request_id == 0 {
            if let Some(response::Kind::Error(e)) = resp.kind {
                self.lock().unattributed = Some(e);
            }
            return;
        }
        let Some(slot) = self.lock().pending.get(&resp.request_id).cloned() else {
            return; // a late frame for an abandoned or finished request
        };
        let item = match resp.kind {
            Some(response::Kind::Error(e)) => Err(ClientError::from_response(e)),
            Some(kind) => Ok(kind),
            None => Err(ClientError::Protocol("response without a kind".into())),
        };
        slot.push(item, false);
    }
}

/// A registered request: its id and mailbox. Dropping it unregisters the id, after which
/// frames for it are ignored.
pub(super) struct Registration {
    shared: Arc<Shared>,
    pub(super) id: u64,
    pub(super) slot: Arc<Slot>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.id);
    }
}

/// A request that has been queued: its mailbox and its in-flight permit, both held until
/// the request is finished with.
pub(super) struct InFlight {
    pub(super) registration: Registration,
    _permit: async_lock::SemaphoreGuardArc,
}

/// The callers' end of one socket: cheap to clone.
#[derive(Clone)]
pub(super) struct ConnHandle {
    pub(super) shared: Arc<Shared>,
    tx: flume::Sender<Vec<u8>>,
}

impl ConnHandle {
    /// Allocates an id and encodes the request frame.
    pub(super) fn prepare(&self, kind: request::Kind) -> Result<(u64, Vec<u8>), ClientError> {
        self.prepare_with(|id, max, out| proto::encode_frame(&Request::new(id, kind), max, out))
    }

    /// Allocates an id and encodes a frame with `encode(request_id, max_frame_len, out)`.
    fn prepare_with(&self, encode: impl FnOnce(u64, u32, &mut Vec<u8>) -> Result<(), FrameError>) -> Result<(u64, Vec<u8>), ClientError> {
        let id = self.shared.next_id();
        let mut frame = Vec::new();
        encode(id, self.shared.max_frame_len, &mut frame)?;
        Ok((id, frame))
    }

    /// Takes a permit, registers `id` and queues its frame.
    pub(super) async fn submit(self, id: u64, frame: Vec<u8>) -> Result<InFlight, ClientError> {
        let permit = self.shared.inflight.acquire_arc().await;
        let registration = self.shared.register(id)?;
        if self.tx.send_async(frame).await.is_err() {
            return Err(self.shared.gone_error());
        }
        Ok(InFlight { registration, _permit: permit })
    }

    /// An append's id and frame, encoded straight from the events' bytes
    /// ([`proto::append::encode_append_frame`]).
    pub(super) fn prepare_append(&self, events: &[&crate::event::Event], condition: Option<&proto::AppendCondition>) -> Result<(u64, Vec<u8>), ClientError> {
        self.prepare_with(|id, max, out| proto::append::encode_append_frame(id, events, condition, max, out))
    }

    /// Sends a request expecting exactly one response frame and waits for it.
    pub(super) fn call(&self, kind: request::Kind) -> impl Future<Output = Delivery> + Send + 'static {
        self.call_prepared(self.prepare(kind))
    }

    /// [`call`](Self::call) with a frame already encoded (by [`prepare`](Self::prepare) or
    /// [`prepare_append`](Self::prepare_append)).
    pub(super) fn call_prepared(&self, prepared: Result<(u64, Vec<u8>), ClientError>) -> impl Future<Output = Delivery> + Send + 'static {
        let staged = self.call_staged(prepared);
        async move { staged.await? }
    }

    /// [`call_prepared`](Self::call_prepared) in two stages. The outer error is a request
    /// that never left: its frame did not encode, or the socket had failed before it was
    /// queued. The inner result is its answer, or why none came once it was queued (it may
    /// have reached the server).
    pub(super) fn call_staged(&self, prepared: Result<(u64, Vec<u8>), ClientError>) -> impl Future<Output = Result<Delivery, ClientError>> + Send + 'static {
        let conn = self.clone();
        async move {
            let (id, frame) = prepared?;
            let shared = Arc::clone(&conn.shared);
            let flight = conn.submit(id, frame).await?;
            let slot = Arc::clone(&flight.registration.slot);
            Ok(match std::future::poll_fn(|cx| slot.poll_next(cx)).await {
                Some(item) => item,
                None => Err(shared.gone_error()),
            })
        }
    }
}

/// Sets up the shared state and queue of one socket whose Hello is done.
pub(super) fn new_connection<S>(
    io: S,
    decoder: FrameDecoder,
    max_inflight: usize,
    queue_depth: usize,
    max_frame_len: u32,
    first_id: u64,
) -> (ConnHandle, Connection<S>) {
    let shared = Arc::new(Shared::new(max_inflight, max_frame_len, first_id));
    let (tx, rx) = flume::bounded(queue_depth);
    let handle = ConnHandle { shared: Arc::clone(&shared), tx };
    let conn = Connection { io, shared, rx: Some(rx.into_stream()), decoder, out: Vec::new(), out_pos: 0, needs_flush: false, closing: false, finished: false };
    (handle, conn)
}

/// The driver of one socket of an [`AsyncClient`](super::AsyncClient): a future that owns
/// the stream, writes the queued requests and routes the responses. Spawn it (or the
/// [`Driver`](super::Driver) holding all of them) on your executor; nothing moves on the
/// socket while it is not polled.
///
/// It completes with `Ok(())` once every client handle and stream using the socket has been
/// dropped and the socket has been closed, or with `Err(reason)` when the connection fails:
/// a transport error, the server closing it (reported as the last id-0 error the server
/// sent, if any, else [`ClientError::UnexpectedEof`]), or an unusable frame. Every request
/// pending on the socket, and every later one, fails with the same reason. Dropping it
/// before completion fails them too.
///
/// It is `Send` when the stream is.
pub struct Connection<S> {
    io: S,
    shared: Arc<Shared>,
    rx: Option<flume::r#async::RecvStream<'static, Vec<u8>>>,
    decoder: FrameDecoder,
    out: Vec<u8>,
    out_pos: usize,
    needs_flush: bool,
    /// Every sender is gone: flush, close and finish.
    closing: bool,
    finished: bool,
}

impl<S> std::fmt::Debug for Connection<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("unwritten", &(self.out.len() - self.out_pos))
            .field("buffered", &self.decoder.buffered())
            .field("closing", &self.closing)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Reads and routes frames until the socket would block (`Pending`) or ends
    /// (`Ready(failure)`).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Failure> {
        let mut frames = 0;
        let mut reads = 0;
        loop {
            loop {
                let resp = match self.decoder.next_frame() {
                    Ok(Some(body)) => Response::decode(body),
                    Ok(None) => break,
                    Err(e) => return Poll::Ready(Failure::from_frame(e)),
                };
                match resp {
                    Ok(resp) => self.shared.route(resp),
                    Err(e) => return Poll::Ready(Failure::from_frame(FrameError::Decode(e))),
                }
                frames += 1;
                if frames >= FRAMES_PER_POLL {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            if reads >= WRITES_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let spare = self.decoder.spare(READ_CHUNK);
            match Pin::new(&mut self.io).poll_read(cx, spare) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(match self.decoder.finish() {
                        Ok(()) => Failure::Eof,
                        Err(e) => Failure::from_frame(e),
                    })
                }
                Poll::Ready(Ok(n)) => {
                    self.decoder.commit(n);
                    reads += 1;
                }
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Failure::from_io(&e)),
            }
        }
    }

    /// Writes queued frames. `Ready(Ok)` once the socket has been closed after the last
    /// sender went away; `Ready(Err)` on a transport error.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        for _ in 0..WRITES_PER_POLL {
            if self.out_pos == self.out.len() {
                if self.out.capacity() > 4 * WRITE_BATCH {
                    // Do not pin the memory of one large request for the life of the socket.
                    self.out = Vec::new();
                }
                self.out.clear();
                self.out_pos = 0;
                self.fill(cx);
            }
            if self.out_pos < self.out.len() {
                match Pin::new(&mut self.io).poll_write(cx, &self.out[self.out_pos..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(Failure::Io(io::ErrorKind::WriteZero, "the socket took no bytes".into()))),
                    Poll::Ready(Ok(n)) => {
                        self.out_pos += n;
                        self.needs_flush = true;
                        continue;
                    }
                    Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Failure::from_io(&e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            // Nothing left to write right now.
            if self.needs_flush {
                match Pin::new(&mut self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.needs_flush = false,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Failure::from_io(&e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.closing {
                return match Pin::new(&mut self.io).poll_close(cx) {
                    Poll::Ready(_) => Poll::Ready(Ok(())),
                    Poll::Pending => Poll::Pending,
                };
            }
            return Poll::Pending;
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Moves pending cancels, then queued frames, into the (empty) output buffer.
    fn fill(&mut self, cx: &mut Context<'_>) {
        let cancels = std::mem::take(&mut self.shared.lock().cancels);
        for target in cancels {
            let id = self.shared.next_id();
            let cancel = Request::new(id, request::Kind::Cancel(proto::CancelRequest { target }));
            // A cancel is a few bytes: it always fits the cap.
            let _ = proto::encode_frame(&cancel, u32::MAX, &mut self.out);
        }
        let Some(rx) = self.rx.as_mut() else { return };
        while self.out.len() < WRITE_BATCH {
            match Pin::new(&mut *rx).poll_next(cx) {
                Poll::Ready(Some(frame)) => {
                    if self.out.is_empty() {
                        self.out = frame;
                    } else {
                        self.out.extend_from_slice(&frame);
                    }
                }
                Poll::Ready(None) => {
                    self.closing = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
    }

    fn finish(&mut self, failure: Failure) -> Failure {
        self.finished = true;
        self.rx = None;
        self.shared.fail(failure)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for Connection<S> {
    type Output = Result<(), ClientError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(match this.shared.failure() {
                Some(Failure::Closed) | None => Ok(()),
                Some(f) => Err(f.to_error()),
            });
        }
        {
            let mut s = this.shared.lock();
            match &s.driver_waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => s.driver_waker = Some(cx.waker().clone()),
            }
        }
        if let Poll::Ready(failure) = this.poll_read(cx) {
            if this.closing && matches!(failure, Failure::Eof) {
                // We were closing anyway and nothing can be pending.
                this.finish(Failure::Closed);
                return Poll::Ready(Ok(()));
            }
            return Poll::Ready(Err(this.finish(failure).to_error()));
        }
        match this.poll_write(cx) {
            Poll::Ready(Ok(())) => {
                this.finish(Failure::Closed);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(failure)) => Poll::Ready(Err(this.finish(failure).to_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S> Drop for Connection<S> {
    fn drop(&mut self) {
        if !self.finished {
            self.rx = None;
            self.shared.fail(Failure::DriverDropped);
        }
    }
}
