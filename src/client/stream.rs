//! The streams returned by [`Client::read`](super::Client::read) and
//! [`Client::subscribe`](super::Client::subscribe).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::transport::{raw_fd, wait_readable, Woken};
use super::{CancelShared, Client, ClientError, SequencedEvent, SubEvent};
use crate::model::Position;
use crate::proto::{self, response};

/// The events of one read, in order (docs/protocol.md §8): an iterator of
/// `Result<SequencedEvent, ClientError>` that borrows the client.
///
/// After the last event, [`watermark`](Self::watermark) gives the durable tip the read was
/// pinned to. An error ends the stream. Dropping it before the end sends a `CancelRequest`
/// for the read (docs/protocol.md §7): the server stops streaming it, and whatever of it is still on its
/// way is skipped by the client's next call (frames of an abandoned request id are), so the
/// connection stays usable without reading the rest of a long read.
pub struct ReadStream<'a> {
    client: &'a mut Client,
    id: u64,
    batch: std::vec::IntoIter<proto::SequencedEvent>,
    watermark: Option<Position>,
    finished: bool,
}

impl std::fmt::Debug for ReadStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadStream")
            .field("id", &self.id)
            .field("buffered", &self.batch.len())
            .field("watermark", &self.watermark)
            .field("finished", &self.finished)
            .finish()
    }
}

impl<'a> ReadStream<'a> {
    pub(super) fn new(client: &'a mut Client, id: u64) -> ReadStream<'a> {
        ReadStream { client, id, batch: Vec::new().into_iter(), watermark: None, finished: false }
    }

    /// The read's watermark, once its `ReadEnd` has arrived (`None` before that, or if the
    /// read failed).
    pub fn watermark(&self) -> Option<Position> {
        self.watermark
    }

    /// The request id of this read on its connection.
    pub fn request_id(&self) -> u64 {
        self.id
    }

    /// Drains the stream into a vector and returns it with the watermark.
    ///
    /// # Errors
    /// The first error of the stream (the rest of the read is then discarded).
    pub fn collect_all(mut self) -> Result<(Vec<SequencedEvent>, Position), ClientError> {
        let mut out = Vec::new();
        for item in self.by_ref() {
            out.push(item?);
        }
        match self.watermark {
            Some(w) => Ok((out, w)),
            None => Err(ClientError::Protocol("read ended without a watermark".into())),
        }
    }

    /// Reads one frame of this read; `Err` ends the stream.
    fn pull(&mut self) -> Result<(), ClientError> {
        match self.client.recv(self.id)? {
            response::Kind::ReadEvents(b) => {
                self.batch = b.events.into_iter();
                Ok(())
            }
            response::Kind::ReadEnd(end) => {
                self.watermark = Some(Position(end.watermark));
                self.finished = true;
                Ok(())
            }
            other => Err(ClientError::unexpected(&other, "read_events or read_end")),
        }
    }
}

impl Iterator for ReadStream<'_> {
    type Item = Result<SequencedEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(se) = self.batch.next() {
                return Some(SequencedEvent::from_proto(se));
            }
            if self.finished {
                return None;
            }
            if let Err(e) = self.pull() {
                self.finished = true;
                return Some(Err(e));
            }
        }
    }
}

impl Drop for ReadStream<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.client.send_cancel(self.id);
        }
    }
}

/// A live subscription (docs/protocol.md §8): an iterator of `Result<SubEvent, ClientError>` that
/// borrows the client and does not end by itself.
///
/// It ends (yields `None`) after [`SubscribeCancel::cancel`](super::SubscribeCancel::cancel),
/// having sent a `CancelRequest`; or after yielding an error (a server error, or
/// [`ClientError::UnexpectedEof`] when the server closes). Dropping it early also sends a
/// `CancelRequest`. Either way the connection remains usable afterwards.
pub struct SubscribeStream<'a> {
    client: &'a mut Client,
    id: u64,
    shared: Arc<CancelShared>,
    batch: std::vec::IntoIter<proto::SequencedEvent>,
    finished: bool,
}

impl std::fmt::Debug for SubscribeStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscribeStream").field("id", &self.id).field("buffered", &self.batch.len()).field("finished", &self.finished).finish()
    }
}

impl<'a> SubscribeStream<'a> {
    pub(super) fn new(client: &'a mut Client, id: u64, shared: Arc<CancelShared>) -> SubscribeStream<'a> {
        SubscribeStream { client, id, shared, batch: Vec::new().into_iter(), finished: false }
    }

    /// The request id of this subscription on its connection.
    pub fn request_id(&self) -> u64 {
        self.id
    }

    /// Stops the subscription on the server (best effort) and ends the stream.
    fn stop(&mut self) {
        if !self.finished {
            self.finished = true;
            self.batch = Vec::new().into_iter();
            let _ = self.client.send_cancel(self.id);
        }
    }

    /// Waits for and reads the next frame of this subscription.
    /// `Ok(None)`: a cancel arrived, or a stale frame was skipped (the caller re-checks).
    fn pull(&mut self) -> Result<Option<SubEvent>, ClientError> {
        if !self.client.decoder.ready() && !self.client.io.has_buffered_plaintext() {
            let timeout = self.client.io.tcp().read_timeout()?;
            match wait_readable(raw_fd(&self.client.io), self.shared.wake_rx.as_raw_fd(), timeout)? {
                Woken::Wake => return Ok(None),
                Woken::Socket => {}
            }
        }
        let resp = self.client.next_response()?;
        match self.client.accept(resp, self.id) {
            None => Ok(None),
            Some(Err(e)) => Err(e),
            Some(Ok(response::Kind::ReadEvents(b))) => {
                self.batch = b.events.into_iter();
                Ok(None)
            }
            Some(Ok(response::Kind::CaughtUp(c))) => Ok(Some(SubEvent::CaughtUp(Position(c.watermark)))),
            Some(Ok(other)) => Err(ClientError::unexpected(&other, "read_events or caught_up")),
        }
    }
}

impl Iterator for SubscribeStream<'_> {
    type Item = Result<SubEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.finished {
                return None;
            }
            if self.shared.cancelled.load(Ordering::Acquire) {
                self.stop();
                return None;
            }
            if let Some(se) = self.batch.next() {
                return Some(SequencedEvent::from_proto(se).map(SubEvent::Event));
            }
            match self.pull() {
                Ok(Some(ev)) => return Some(Ok(ev)),
                Ok(None) => {}
                Err(ClientError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    // A client timeout: report it; the stream stays usable.
                    return Some(Err(ClientError::Io(e)));
                }
                Err(e) => {
                    self.finished = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Drop for SubscribeStream<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}
