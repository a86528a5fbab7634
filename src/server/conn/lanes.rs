//! A connection's outbound frames: two lanes toward the client, control (acks, stats, errors)
//! and bulk (reads and subscriptions), written by one egress task that drains control first;
//! and the room the bulk lane has, handed out in order.

use crate::proto::messages::response;
use crate::proto::{self as pb};
use futures_lite::{AsyncWrite, AsyncWriteExt};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Outbound frames on two lanes: control (acks, stats, errors) is always drained first.
#[derive(Clone)]
pub(super) struct Lanes {
    pub(super) control: flume::Sender<Vec<u8>>,
    bulk: flume::Sender<Vec<u8>>,
    /// Bytes the bulk lane may still take ([`BULK_LANE_BYTES`] in all); the egress task gives
    /// a frame's bytes back once it has written it, and closes this when it ends.
    bulk_room: Rc<LaneRoom>,
    pub(super) max_frame_len: u32,
    /// Set (and the reader woken through `abandon_tx`) when a control frame could not be
    /// sent: its request would wait forever, so the connection is closed.
    pub(super) abandoned: Rc<Cell<bool>>,
    abandon_tx: flume::Sender<()>,
}

impl Lanes {
    /// Encodes a response frame, `None` when it cannot fit `max_frame_len`. An error whose
    /// message makes it too long goes out with the message cut to fit (on a char boundary), so
    /// its client still learns the code: under a tiny cap (64 bytes) an append refused as too
    /// large to read back got only a closed connection (review).
    pub(super) fn encode(&self, id: u64, kind: response::Kind) -> Option<Vec<u8>> {
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
    /// the connection is closed instead, as the reference does (docs/protocol.md §4 and open
    /// question 3).
    pub(super) async fn control(&self, id: u64, kind: response::Kind) {
        match self.encode(id, kind) {
            Some(f) => {
                let _ = self.control.send_async(f).await;
            }
            None => self.abandon(),
        }
    }

    /// Marks the connection abandoned (a control frame could not be sent) and wakes its reader,
    /// which closes it.
    pub(super) fn abandon(&self) {
        self.abandoned.set(true);
        let _ = self.abandon_tx.try_send(());
    }

    /// Queues an error response (a control frame).
    pub(super) async fn error(&self, id: u64, e: pb::ErrorResponse) {
        self.control(id, response::Kind::Error(e)).await;
    }

    /// Queues a bulk frame once the lane has room for it: fewer than `frame_queue_depth`
    /// frames and [`BULK_LANE_BYTES`] bytes queued (a larger frame waits for an empty lane).
    /// `false` when the connection is going away.
    pub(super) async fn bulk_frame(&self, f: Vec<u8>) -> bool {
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

/// The egress task of [`open`]: it returns the writer once both lanes are closed and
/// everything was written (`None` after a failed write); dropping it stops the writing and
/// closes the socket, failing any producer still waiting on a lane.
pub(super) type Egress<W> = shards::Task<Option<W>>;

/// Opens a connection's lanes toward `writer` (the control lane holds up to
/// `max_inflight_per_conn` frames, at least 64; the bulk lane `frame_queue_depth` frames and
/// [`BULK_LANE_BYTES`]) and starts the egress task that writes them. Also returns what the
/// reader waits on to learn that a control frame could not be sent ([`Lanes::abandon`]).
pub(super) fn open<W: AsyncWrite + Unpin + 'static>(settings: &crate::config::Settings, writer: W) -> (Lanes, flume::Receiver<()>, Egress<W>) {
    let bp = &settings.server.backpressure;
    let (ctl_tx, ctl_rx) = flume::bounded(bp.max_inflight_per_conn.max(64));
    let (bulk_tx, bulk_rx) = flume::bounded(bp.frame_queue_depth.max(1));
    let (abandon_tx, abandon_rx) = flume::bounded(1);
    let bulk_room = Rc::new(LaneRoom::new(BULK_LANE_BYTES));
    let room = bulk_room.clone();
    let egress_task = shards::spawn(async move {
        let out = egress(writer, ctl_rx, bulk_rx, &room).await;
        // Whoever still waits for room gives up: nothing will be written any more.
        room.close();
        out
    });
    let lanes =
        Lanes { control: ctl_tx, bulk: bulk_tx, bulk_room, max_frame_len: settings.server.max_frame_len, abandoned: Rc::new(Cell::new(false)), abandon_tx };
    (lanes, abandon_rx, egress_task)
}

/// Writes frames from both lanes: control first; after 64 control frames in a row one waiting
/// bulk frame goes through, so appends cannot starve reads (docs/protocol.md §10). Flushes when a
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
        LaneRoom {
            free: Cell::new(bytes),
            queue: RefCell::new(Default::default()),
            next_ticket: Cell::new(0),
            closed: Cell::new(false),
            changed: event_listener::Event::new(),
        }
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

/// The lane room a bulk frame of `len` bytes takes: its length, or all of the room for a frame
/// larger than that (it then waits for an empty lane).
fn bulk_units(len: usize) -> u64 {
    (len as u64).clamp(1, BULK_LANE_BYTES)
}

/// Control frames written in a row before one waiting bulk frame is let through.
const CONTROL_RUN: u32 = 64;

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
