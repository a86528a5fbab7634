//! The streams returned by [`AsyncClient::read`](super::AsyncClient::read) and
//! [`AsyncClient::subscribe`](super::AsyncClient::subscribe).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::connection::{ConnHandle, Delivery, InFlight};
use crate::client::{ClientError, SequencedEvent, SubEvent};
use crate::model::Position;
use crate::proto::{self, request, response};

type Starting = Pin<Box<dyn Future<Output = Result<InFlight, ClientError>> + Send>>;

/// Where a stream's request is.
enum Phase {
    /// Encoded, not sent: nothing happens until the stream is first polled.
    Idle(Vec<u8>),
    /// Encoding failed: the error is the stream's only item.
    Refused(ClientError),
    /// Waiting for an in-flight permit or room in the socket's queue.
    Starting(Starting),
    /// Sent; frames arrive in the mailbox.
    Open(InFlight),
    /// Ended (terminator, error, or connection failure); nothing more is sent on drop.
    Done,
}

/// The request half shared by both streams: lazy start, frame delivery, cancel on drop.
struct Core {
    conn: ConnHandle,
    id: u64,
    phase: Phase,
}

impl Core {
    fn new(conn: ConnHandle, kind: request::Kind) -> Core {
        match conn.prepare(kind) {
            Ok((id, frame)) => Core { conn, id, phase: Phase::Idle(frame) },
            Err(e) => Core { conn, id: 0, phase: Phase::Refused(e) },
        }
    }

    /// The next frame payload for this request. `None` only after [`end`](Self::end).
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        loop {
            match &mut self.phase {
                Phase::Idle(_) => {
                    let Phase::Idle(frame) = std::mem::replace(&mut self.phase, Phase::Done) else { unreachable!() };
                    self.phase = Phase::Starting(Box::pin(self.conn.clone().submit(self.id, frame)));
                }
                Phase::Refused(_) => {
                    let Phase::Refused(e) = std::mem::replace(&mut self.phase, Phase::Done) else { unreachable!() };
                    return Poll::Ready(Some(Err(e)));
                }
                Phase::Starting(fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(flight)) => self.phase = Phase::Open(flight),
                    Poll::Ready(Err(e)) => {
                        self.phase = Phase::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                Phase::Open(flight) => {
                    return match flight.registration.slot.poll_next(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
                        Poll::Ready(None) => {
                            self.phase = Phase::Done;
                            Poll::Ready(Some(Err(self.conn.shared.gone_error())))
                        }
                    };
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }

    /// The next item of a read or a subscription: the next event of `batch`, which
    /// `ReadEvents` frames refill. Any other frame goes to `frame`: `Ok(Some(item))` is the next
    /// item, `Ok(None)` ends the request and the stream, and `Err(kind)` is a frame the stream
    /// cannot accept (it cancels the request; the error says `wanted`). An error is the last
    /// item.
    fn poll_event<T>(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut std::vec::IntoIter<proto::SequencedEvent>,
        event: fn(SequencedEvent) -> T,
        wanted: &str,
        mut frame: impl FnMut(response::Kind) -> Result<Option<T>, Box<response::Kind>>,
    ) -> Poll<Option<Result<T, ClientError>>> {
        loop {
            if let Some(se) = batch.next() {
                return Poll::Ready(Some(SequencedEvent::from_proto(se).map(event)));
            }
            let item = match self.poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(item)) => item,
            };
            let kind = match item {
                Ok(response::Kind::ReadEvents(b)) => {
                    *batch = b.events.into_iter();
                    continue;
                }
                Ok(kind) => kind,
                Err(e) => {
                    self.end();
                    return Poll::Ready(Some(Err(e)));
                }
            };
            return match frame(kind) {
                Ok(Some(item)) => Poll::Ready(Some(Ok(item))),
                Ok(None) => {
                    self.end();
                    Poll::Ready(None)
                }
                Err(other) => {
                    self.abort();
                    Poll::Ready(Some(Err(unexpected(&other, wanted))))
                }
            };
        }
    }

    /// Marks the request finished: its id is released and no cancel will be sent.
    fn end(&mut self) {
        self.phase = Phase::Done;
    }

    /// Ends the request after a frame it cannot accept: cancels it on the server too.
    fn abort(&mut self) {
        if matches!(self.phase, Phase::Starting(_) | Phase::Open(_)) {
            self.conn.shared.cancel(self.id);
        }
        self.phase = Phase::Done;
    }

    fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Refused(_))
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // A request that may have reached the server is cancelled (docs/protocol.md §7). One that
        // never did costs a no-op cancel of an unknown id.
        if matches!(self.phase, Phase::Starting(_) | Phase::Open(_)) {
            self.conn.shared.cancel(self.id);
        }
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Idle(_) => "idle",
            Phase::Refused(_) => "refused",
            Phase::Starting(_) => "starting",
            Phase::Open(_) => "open",
            Phase::Done => "done",
        };
        f.debug_struct("Request").field("id", &self.id).field("phase", &phase).finish()
    }
}

fn unexpected(kind: &response::Kind, wanted: &str) -> ClientError {
    ClientError::unexpected(kind, wanted)
}

/// The events of one read (docs/protocol.md §8), as a [`Stream`] of
/// `Result<SequencedEvent, ClientError>`. Returned by
/// [`AsyncClient::read`](super::AsyncClient::read) and
/// [`read_back`](super::AsyncClient::read_back).
///
/// - The request is sent when the stream is first polled (it then waits for an in-flight
///   permit and room in the socket's queue).
/// - The stream ends (`None`) after the read's `ReadEnd`; [`watermark`](Self::watermark)
///   then gives the durable tip the read was pinned to.
/// - An error (a server error such as `BAD_REQUEST` for an invalid query, or the connection
///   failing) is the last item.
/// - Dropping the stream before its end sends a `CancelRequest` for it (never lost: cancels
///   bypass the request queue) and ignores its late frames; the socket stays usable.
/// - `Send`, not `Sync`; `Unpin`.
#[derive(Debug)]
pub struct AsyncReadStream {
    core: Core,
    batch: std::vec::IntoIter<proto::SequencedEvent>,
    watermark: Option<Position>,
}

impl AsyncReadStream {
    pub(super) fn new(conn: ConnHandle, read: proto::ReadRequest) -> AsyncReadStream {
        AsyncReadStream { core: Core::new(conn, request::Kind::Read(read)), batch: Vec::new().into_iter(), watermark: None }
    }

    /// The read's watermark (the durable tip it was pinned to) once the stream has ended
    /// normally; `None` before that or after an error.
    pub fn watermark(&self) -> Option<Position> {
        self.watermark
    }

    /// The request id of this read on its socket (0 if the request could not be encoded).
    pub fn request_id(&self) -> u64 {
        self.core.id
    }

    /// Drains the stream: every event, in order, and the watermark.
    ///
    /// # Errors
    /// The first error of the stream (the rest of the read is then cancelled).
    pub async fn collect_all(mut self) -> Result<(Vec<SequencedEvent>, Position), ClientError> {
        let mut out = Vec::new();
        while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut self).poll_next(cx)).await {
            out.push(item?);
        }
        match self.watermark {
            Some(w) => Ok((out, w)),
            None => Err(ClientError::Protocol("read ended without a watermark".into())),
        }
    }
}

impl Stream for AsyncReadStream {
    type Item = Result<SequencedEvent, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let watermark = &mut this.watermark;
        this.core.poll_event(
            cx,
            &mut this.batch,
            |e| e,
            "read_events or read_end",
            |kind| match kind {
                response::Kind::ReadEnd(end) => {
                    *watermark = Some(Position(end.watermark));
                    Ok(None)
                }
                other => Err(Box::new(other)),
            },
        )
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.batch.len(), if self.core.is_done() { Some(self.batch.len()) } else { None })
    }
}

/// A live subscription (docs/protocol.md §8), as a [`Stream`] of `Result<SubEvent, ClientError>`.
/// Returned by [`AsyncClient::subscribe`](super::AsyncClient::subscribe).
///
/// - The request is sent when the stream is first polled.
/// - It first catches up on stored matches, then follows new commits, with a
///   [`SubEvent::CaughtUp`] marker each time it reaches the live edge.
/// - It never ends by itself: only with an error (a server error, or the connection
///   failing), which is its last item.
/// - Dropping it (or calling [`cancel`](Self::cancel)) sends a `CancelRequest`; frames
///   still in flight are ignored and the socket stays usable.
/// - Frames that arrive while the stream is not polled are buffered without bound.
/// - `Send`, not `Sync`; `Unpin`.
#[derive(Debug)]
pub struct AsyncSubscribeStream {
    core: Core,
    batch: std::vec::IntoIter<proto::SequencedEvent>,
}

impl AsyncSubscribeStream {
    pub(super) fn new(conn: ConnHandle, sub: proto::SubscribeRequest) -> AsyncSubscribeStream {
        AsyncSubscribeStream { core: Core::new(conn, request::Kind::Subscribe(sub)), batch: Vec::new().into_iter() }
    }

    /// The request id of this subscription on its socket (0 if it could not be encoded).
    pub fn request_id(&self) -> u64 {
        self.core.id
    }

    /// Stops the subscription: same as dropping it.
    pub fn cancel(self) {}
}

impl Stream for AsyncSubscribeStream {
    type Item = Result<SubEvent, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        this.core.poll_event(cx, &mut this.batch, SubEvent::Event, "read_events or caught_up", |kind| match kind {
            response::Kind::CaughtUp(c) => Ok(Some(SubEvent::CaughtUp(Position(c.watermark)))),
            other => Err(Box::new(other)),
        })
    }
}
