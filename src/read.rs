//! Reads and subscriptions over the published, durable prefix of the log.
//!
//! The writer publishes a watermark (the last durable position) after each commit, after the
//! segment snapshot and record offsets it covers. A read loads the watermark, then the snapshot,
//! and never looks past that pinned watermark, so it sees a consistent prefix without taking a
//! lock across evaluation (reference engine §5.1). Subscriptions are the same read in a loop over
//! an advancing watermark (§5.4): catch-up and live tailing share one cursor, so there is no gap
//! and no duplicate at the seam.

use crate::event::EventRef;
use crate::log::record::{LENGTH_MASK, RECORD_HEAD};
use crate::log::segment::Segment;
use crate::model::{Position, Query};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use event_listener::Listener;
use std::time::Duration;

/// Why a read failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// An I/O error reading a segment.
    #[error("I/O error reading {}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    /// A committed record failed validation on read.
    #[error("corrupt record in {} at byte offset {offset}: {detail}", path.display())]
    Corrupt { path: PathBuf, offset: u64, detail: String },
}

/// State the writer publishes to every reader.
pub struct Shared {
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    watermark: AtomicU64,
    changed: event_listener::Event,
    closed: AtomicBool,
    failure: Mutex<Option<String>>,
    subscribers: AtomicU64,
}

impl Shared {
    pub(crate) fn new(segments: Vec<Arc<Segment>>, watermark: u64) -> Shared {
        Shared {
            segments: RwLock::new(Arc::new(segments)),
            watermark: AtomicU64::new(watermark),
            changed: event_listener::Event::new(),
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            subscribers: AtomicU64::new(0),
        }
    }

    /// The last durable position.
    pub fn watermark(&self) -> u64 {
        self.watermark.load(Ordering::SeqCst)
    }

    /// Pins a watermark and the snapshot that covers it.
    pub fn pin(&self) -> (u64, Arc<Vec<Arc<Segment>>>) {
        let w = self.watermark.load(Ordering::SeqCst);
        let s = self.segments.read().unwrap_or_else(|e| e.into_inner()).clone();
        (w, s)
    }

    /// Number of segments in the current snapshot.
    pub fn segment_count(&self) -> usize {
        self.segments.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn push_segment(&self, seg: Arc<Segment>) {
        let mut g = self.segments.write().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Arc<Segment>> = (**g).clone();
        v.push(seg);
        *g = Arc::new(v);
    }

    pub(crate) fn publish(&self, watermark: u64) {
        self.watermark.store(watermark, Ordering::SeqCst);
        if self.subscribers.load(Ordering::SeqCst) > 0 {
            self.changed.notify(usize::MAX);
        }
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.changed.notify(usize::MAX);
    }

    /// True once the store shut down.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub(crate) fn fail(&self, reason: String) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }

    /// Why the writer stopped accepting appends (fail-stop), if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

const WINDOW: usize = 256 * 1024;

/// Positional access to records of a pinned snapshot, through one reusable read window.
pub struct Cursor {
    segs: Arc<Vec<Arc<Segment>>>,
    buf: Vec<u8>,
    win_seg: usize,
    win_start: u64,
    win_len: usize,
}

impl Cursor {
    /// A cursor over `segs`.
    pub fn new(segs: Arc<Vec<Arc<Segment>>>) -> Cursor {
        Cursor { segs, buf: Vec::new(), win_seg: usize::MAX, win_start: 0, win_len: 0 }
    }

    fn segment_index(&self, pos: u64) -> usize {
        self.segs.partition_point(|s| s.base <= pos).saturating_sub(1)
    }

    fn ensure(&mut self, si: usize, start: u64, len: usize, lo: u64, hi: u64) -> Result<(), ReadError> {
        if self.win_seg == si && start >= self.win_start && start + len as u64 <= self.win_start + self.win_len as u64 {
            return Ok(());
        }
        let seg = &self.segs[si];
        let (lo, hi) = (lo.min(start), hi.max(start + len as u64));
        let n = (hi - lo) as usize;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        let got = seg.read_at(&mut self.buf[..n], lo).map_err(|e| ReadError::Io { path: seg.path.clone(), message: e.to_string() })?;
        self.win_seg = si;
        self.win_start = lo;
        self.win_len = got;
        if (got as u64) < start + len as u64 - lo {
            return Err(ReadError::Corrupt { path: seg.path.clone(), offset: start, detail: "record runs past the end of the file".into() });
        }
        Ok(())
    }

    /// Loads the event at `pos` (which must be durable) and returns its byte range in the
    /// window; `forward` picks the read-ahead direction.
    fn load(&mut self, pos: u64, forward: bool) -> Result<std::ops::Range<usize>, ReadError> {
        let si = self.segment_index(pos);
        let seg = &self.segs[si];
        let off = seg.offsets.get((pos - seg.base) as usize) as u64;
        let (lo, hi) = if forward { (off, off + WINDOW as u64) } else { ((off + WINDOW as u64 / 4).saturating_sub(WINDOW as u64).max(64), off + WINDOW as u64 / 4) };
        self.ensure(si, off, RECORD_HEAD, lo, hi)?;
        let h = (off - self.win_start) as usize;
        let len_field = u32::from_le_bytes(self.buf[h..h + 4].try_into().unwrap());
        let len = (len_field & LENGTH_MASK) as usize;
        self.ensure(si, off, RECORD_HEAD + len, off, off + (RECORD_HEAD + len) as u64)?;
        let h = (off - self.win_start) as usize;
        let rec = &self.buf[h..h + RECORD_HEAD + len];
        let crc = u32::from_le_bytes(rec[4..8].try_into().unwrap());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&rec[0..4]);
        hasher.update(&rec[RECORD_HEAD..]);
        if len_field & !LENGTH_MASK != 0 || hasher.finalize() != crc {
            let seg = &self.segs[si];
            return Err(ReadError::Corrupt { path: seg.path.clone(), offset: off, detail: "record checksum mismatch".into() });
        }
        Ok(h + RECORD_HEAD..h + RECORD_HEAD + len)
    }

    /// Decodes the event at `pos`.
    ///
    /// # Errors
    /// [`ReadError`] on I/O failure or a record that fails its checksum or decoding.
    pub fn event(&mut self, pos: u64, forward: bool) -> Result<EventRef<'_>, ReadError> {
        let r = self.load(pos, forward)?;
        self.decode(r)
    }

    fn decode(&self, r: std::ops::Range<usize>) -> Result<EventRef<'_>, ReadError> {
        EventRef::from_bytes(&self.buf[r.clone()]).map_err(|e| ReadError::Corrupt {
            path: self.segs[self.win_seg].path.clone(),
            offset: self.win_start + r.start as u64 - RECORD_HEAD as u64,
            detail: e.to_string(),
        })
    }

    /// The lowest position in `(after, hi]` whose event matches `q`.
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn first_match(&mut self, q: &Query, after: u64, hi: u64) -> Result<Option<u64>, ReadError> {
        if q.is_none() {
            return Ok(None);
        }
        for pos in after + 1..=hi {
            if q.matches(&self.event(pos, true)?) {
                return Ok(Some(pos));
            }
        }
        Ok(None)
    }
}

/// A read pinned to the watermark loaded when it started: forward over `(after, watermark]`
/// ascending, or backward over `[1, before)` ∩ `[1, watermark]` descending, at most `limit`
/// matches. A lending iterator: each event borrows the read's buffer.
pub struct Reads {
    cursor: Cursor,
    query: Query,
    next: u64,
    last: u64,
    forward: bool,
    remaining: Option<u64>,
    watermark: u64,
}

impl Reads {
    pub(crate) fn forward(shared: &Shared, query: Query, after: Position, limit: Option<u64>) -> Reads {
        let (w, segs) = shared.pin();
        Reads { cursor: Cursor::new(segs), query, next: after.get().saturating_add(1), last: w, forward: true, remaining: limit, watermark: w }
    }

    pub(crate) fn backward(shared: &Shared, query: Query, before: Position, limit: Option<u64>) -> Reads {
        let (w, segs) = shared.pin();
        let start = before.get().saturating_sub(1).min(w);
        Reads { cursor: Cursor::new(segs), query, next: start, last: 1, forward: false, remaining: limit, watermark: w }
    }

    /// The durable tip this read is pinned to.
    pub fn watermark(&self) -> Position {
        Position(self.watermark)
    }

    fn exhausted(&self) -> bool {
        self.remaining == Some(0) || self.query.is_none() || if self.forward { self.next > self.last } else { self.next < self.last || self.next == 0 }
    }

    /// The next matching event, or `None` at the end.
    ///
    /// # Errors
    /// A [`ReadError`] ends the read.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<(Position, EventRef<'_>), ReadError>> {
        loop {
            if self.exhausted() {
                return None;
            }
            let pos = self.next;
            if self.forward {
                self.next += 1;
            } else {
                self.next -= 1;
            }
            let loaded = self.cursor.load(pos, self.forward).and_then(|r| {
                let hit = self.query.matches(&self.cursor.decode(r.clone())?);
                Ok((r, hit))
            });
            match loaded {
                Ok((r, true)) => {
                    if let Some(n) = &mut self.remaining {
                        *n -= 1;
                    }
                    return Some(self.cursor.decode(r).map(|ev| (Position(pos), ev)));
                }
                Ok((_, false)) => {}
                Err(e) => {
                    self.remaining = Some(0);
                    return Some(Err(e));
                }
            }
        }
    }

    /// Collects the remaining events as owned copies.
    ///
    /// # Errors
    /// The first [`ReadError`].
    pub fn collect_owned(mut self) -> Result<Vec<(Position, crate::event::Event)>, ReadError> {
        let mut v = Vec::new();
        while let Some(r) = self.next() {
            let (p, e) = r?;
            v.push((p, e.to_owned()));
        }
        Ok(v)
    }
}

/// How a wait for new events ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The watermark moved past the cursor.
    Advanced,
    /// The timeout elapsed first.
    TimedOut,
    /// The store shut down.
    Closed,
}

/// A live query: catch up from `after`, then follow new commits.
pub struct Subscription {
    shared: Arc<Shared>,
    query: Query,
    cursor: u64,
}

impl Subscription {
    pub(crate) fn new(shared: Arc<Shared>, query: Query, after: Position) -> Subscription {
        shared.subscribers.fetch_add(1, Ordering::SeqCst);
        Subscription { shared, query, cursor: after.get() }
    }

    /// The exclusive cursor: every match at or below it has been delivered.
    pub fn position(&self) -> Position {
        Position(self.cursor)
    }

    /// Delivers up to `max_events` matches after the cursor to `f`; when fewer are found the
    /// cursor jumps to the pinned watermark (skipping a non-matching tail). Returns how many
    /// events were delivered.
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn poll_batch(&mut self, max_events: usize, mut f: impl FnMut(Position, EventRef<'_>)) -> Result<usize, ReadError> {
        let mut reads = Reads::forward(&self.shared, self.query.clone(), Position(self.cursor), Some(max_events as u64));
        let w = reads.watermark;
        let mut n = 0;
        let mut last = self.cursor;
        while let Some(r) = reads.next() {
            let (p, e) = r?;
            f(p, e);
            last = p.get();
            n += 1;
        }
        self.cursor = if n < max_events { w.max(self.cursor) } else { last };
        Ok(n)
    }

    /// True when events past the cursor are already durable.
    pub fn has_more(&self) -> bool {
        self.shared.watermark() > self.cursor
    }

    /// `Some` when a wait would end now: events past the cursor, or a closed store.
    fn settled(&self) -> Option<WaitOutcome> {
        if self.has_more() {
            Some(WaitOutcome::Advanced)
        } else if self.shared.is_closed() {
            Some(WaitOutcome::Closed)
        } else {
            None
        }
    }

    /// Blocks until the watermark passes the cursor, `timeout` elapses or the store closes.
    pub fn wait_timeout(&self, timeout: Duration) -> WaitOutcome {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(o) = self.settled() {
                return o;
            }
            // Listen, then re-check: a publish between the two cannot be missed.
            let l = self.shared.changed.listen();
            if let Some(o) = self.settled() {
                return o;
            }
            if l.wait_deadline(deadline).is_none() && std::time::Instant::now() >= deadline {
                return WaitOutcome::TimedOut;
            }
        }
    }

    /// Waits asynchronously (on any executor) until the watermark passes the cursor or the
    /// store closes.
    pub async fn wait(&self) -> WaitOutcome {
        loop {
            if let Some(o) = self.settled() {
                return o;
            }
            let l = self.shared.changed.listen();
            if let Some(o) = self.settled() {
                return o;
            }
            l.await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.subscribers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Most events one subscription poll delivers (the reference engine's `DEFAULT_MAX_BATCH_EVENTS`).
pub const POLL_BATCH_EVENTS: usize = 1024;
