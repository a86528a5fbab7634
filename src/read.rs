//! Reads and subscriptions over the published, durable prefix of the log.
//!
//! The writer publishes a watermark (the last durable position) after each commit, after the
//! segment snapshot and record offsets it covers. A read loads the watermark, then the snapshot,
//! and never looks past that pinned watermark, so it sees a consistent prefix without taking a
//! lock across evaluation (docs/architecture.md §5.1). Subscriptions are the same read in a loop over
//! an advancing watermark (docs/architecture.md §5.5): catch-up and live tailing share one cursor, so there is no gap
//! and no duplicate at the seam.

use crate::event::EventRef;
use crate::index::view::Direction;
use crate::index::SegIndex;
use crate::log::record::{declared_len, verify_data, RECORD_HEAD};
use crate::log::segment::Segment;
use crate::model::{Position, Query, QueryMatcher};
use event_listener::Listener;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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
    /// The next record is neither in memory nor in the page cache, and the read was made not
    /// to wait for the disk ([`Reads::without_waiting`]); it surfaces as [`Step::Blocked`],
    /// never from a read that may wait.
    #[error("the data is on the disk and the read was made not to wait for it")]
    WouldBlock,
}

/// A segment range that was not in the page cache, which a read needs from the disk before it
/// can go on without waiting
/// ([`Step::Blocked`]): [`run`](Self::run) it on a thread that may block, hand it back to the
/// read ([`Reads::fetched`], [`Subscription::fetched`]), then step again: the read resumes
/// with these bytes, without reading the file again (the page cache may have dropped them by
/// then).
pub struct ColdRange {
    seg: Arc<Segment>,
    off: u64,
    len: usize,
    /// The bytes read by `run`: `[off, off + bytes.len())`, fewer than `len` at the end of the
    /// file or on an error.
    bytes: Vec<u8>,
    /// The watermark of the read that stopped at this range: every position up to it was
    /// durable before `run` read the file; later ones may not be in `bytes` yet.
    pinned: u64,
}

impl ColdRange {
    /// Reads the range with blocking `pread`s ([`Segment::read_at`]). An error or the end of
    /// the file leaves it short; the read then meets the same condition and reports it.
    pub fn run(&mut self) {
        self.bytes.clear();
        self.bytes.resize(self.len, 0);
        let got = self.seg.read_at(&mut self.bytes, self.off).unwrap_or(0);
        self.bytes.truncate(got);
    }
}

/// The segments and their indexes, as one unit: replaced (never mutated) at rollover, and
/// always published before the watermark that needs it.
pub struct Snapshot {
    /// Segments, ascending by base.
    pub segments: Vec<Arc<Segment>>,
    /// `indexes[i]` indexes `segments[i]`.
    pub indexes: Vec<SegIndex>,
}

impl Snapshot {
    /// A snapshot of `segments` with their `indexes` (same length).
    pub fn new(segments: Vec<Arc<Segment>>, indexes: Vec<SegIndex>) -> Snapshot {
        assert_eq!(segments.len(), indexes.len(), "one index per segment");
        Snapshot { segments, indexes }
    }

    /// The index in `segments` of the segment holding `pos` (the last one for positions past
    /// every base).
    pub fn segment_of(&self, pos: u64) -> usize {
        self.segments.partition_point(|s| s.base <= pos).saturating_sub(1)
    }

    /// Local position range `[lo, hi)` of segment `i` covered by the global inclusive range
    /// `[first, last]`.
    pub(crate) fn local_range(&self, i: usize, first: u64, last: u64) -> (u32, u32) {
        let base = self.segments[i].base;
        let end = self.segments.get(i + 1).map_or(u64::MAX, |s| s.base - 1).min(last);
        if end < base || end < first {
            return (0, 0);
        }
        ((first.max(base) - base) as u32, (end - base + 1) as u32)
    }
}

/// The batches committed lately, as the committer wrote them, so that reads of fresh events
/// (subscribers following the head, reads of the last appends, condition checks) copy them
/// from memory. The commit writes with O_DIRECT, which leaves nothing in the page cache: without
/// this every such read went to the disk, blocking the shard's thread for the read (a tenth
/// of a millisecond to milliseconds) and reading whole 256 KiB windows for a few new events.
///
/// A batch is `[start, start + len)` of the segment whose first position is `base`: exactly
/// the bytes on disk there once it is durable (a block-aligned start, so it begins with the
/// tail of the batch before it, and ends with its commit marker). Only durable batches are
/// remembered, newest last, at most [`RECENT_BATCHES`] of them and [`RECENT_BYTES`] of buffer
/// capacity; a read not covered falls back to the file.
#[derive(Default)]
pub(crate) struct RecentBatches {
    batches: Mutex<std::collections::VecDeque<RecentBatch>>,
}

/// One remembered batch (see [`RecentBatches`]).
#[derive(Clone)]
pub(crate) struct RecentBatch {
    base: u64,
    start: u64,
    len: usize,
    bytes: Arc<crate::log::aligned::AlignedBuf>,
}

/// Most buffer capacity [`RecentBatches`] holds: 32 MiB.
pub(crate) const RECENT_BYTES: usize = 32 << 20;

/// Most batches [`RecentBatches`] holds. Few: the committer refills the buffer it gets back
/// from the oldest, and one it wrote a few commits ago is still in the CPU's cache (with 32 MiB
/// of batches the refill wrote cold memory: 16 × 64 lost ~2% events/s and its p99 rose ~25%).
/// Readers at the head (subscribers, condition checks) need the last one or two.
pub(crate) const RECENT_BATCHES: usize = 4;

impl RecentBatches {
    /// Remembers the durable batch `bytes[..len]`, file offset `start` of segment `base`, and
    /// forgets the oldest ones beyond [`RECENT_BATCHES`] or [`RECENT_BYTES`]; returns a forgotten
    /// buffer no reader holds any more, for the committer to fill next.
    pub(crate) fn remember(&self, base: u64, start: u64, len: usize, bytes: crate::log::aligned::AlignedBuf) -> Option<crate::log::aligned::AlignedBuf> {
        let mut q = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(RecentBatch { base, start, len, bytes: Arc::new(bytes) });
        let mut held: usize = q.iter().map(|b| b.bytes.capacity()).sum();
        let mut reusable = None;
        while (held > RECENT_BYTES || q.len() > RECENT_BATCHES) && q.len() > 1 {
            let old = q.pop_front().expect("more than one batch");
            held -= old.bytes.capacity();
            if let Ok(buf) = Arc::try_unwrap(old.bytes) {
                reusable = Some(buf);
            }
        }
        reusable
    }

    /// A remembered batch of segment `base` holding all of `[from, to)`. Batches are ordered
    /// by (segment, start) and each ends past the one before it, so the last one starting at
    /// or before `from` is the only one to check.
    fn covering(&self, base: u64, from: u64, to: u64) -> Option<RecentBatch> {
        let q = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        let i = q.partition_point(|b| (b.base, b.start) <= (base, from)).checked_sub(1)?;
        let b = &q[i];
        (b.base == base && to <= b.start + b.len as u64).then(|| b.clone())
    }
}

/// State the writer publishes to every reader.
pub struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    recent: Arc<RecentBatches>,
    watermark: AtomicU64,
    changed: event_listener::Event,
    closed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// A follower's failed refreshes in a row (0 on a writer's store).
    refresh_failures: AtomicU64,
    subscribers: AtomicU64,
    scan_bias: u32,
}

impl Shared {
    pub(crate) fn new(snapshot: Snapshot, watermark: u64, scan_bias: u32) -> Shared {
        Shared {
            snapshot: RwLock::new(Arc::new(snapshot)),
            recent: Arc::new(RecentBatches::default()),
            watermark: AtomicU64::new(watermark),
            changed: event_listener::Event::new(),
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            refresh_failures: AtomicU64::new(0),
            subscribers: AtomicU64::new(0),
            scan_bias,
        }
    }

    /// The last durable position.
    pub fn watermark(&self) -> u64 {
        self.watermark.load(Ordering::SeqCst)
    }

    /// Pins a watermark and the snapshot that covers it.
    pub fn pin(&self) -> (u64, Arc<Snapshot>) {
        let w = self.watermark.load(Ordering::SeqCst);
        let s = self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone();
        (w, s)
    }

    /// Number of segments in the current snapshot.
    pub fn segment_count(&self) -> usize {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).segments.len()
    }

    /// Publishes a rollover: `sealed` replaces the last segment's index (when given) and `seg`
    /// is appended with `index`. Readers holding the old snapshot keep it.
    pub(crate) fn roll(&self, sealed: Option<SegIndex>, seg: Arc<Segment>, index: SegIndex) {
        let mut g = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        let mut segments = g.segments.clone();
        let mut indexes = g.indexes.clone();
        if let (Some(s), Some(last)) = (sealed, indexes.last_mut()) {
            *last = s;
        }
        segments.push(seg);
        indexes.push(index);
        *g = Arc::new(Snapshot::new(segments, indexes));
    }

    /// Replaces the last segment and its index (a follower's active segment reopened with
    /// larger tables). Readers holding the old snapshot keep it.
    pub(crate) fn replace_last(&self, seg: Arc<Segment>, index: SegIndex) {
        let mut g = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        let (mut segments, mut indexes) = (g.segments.clone(), g.indexes.clone());
        if let (Some(s), Some(i)) = (segments.last_mut(), indexes.last_mut()) {
            *s = seg;
            *i = index;
        }
        *g = Arc::new(Snapshot::new(segments, indexes));
    }

    /// Swaps in the sealed index of the segment starting at `base` (it replaces that segment's
    /// frozen active index once the sealed form is built).
    pub(crate) fn seal(&self, base: u64, sealed: SegIndex) {
        let mut g = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        let Some(i) = g.segments.iter().position(|s| s.base == base) else { return };
        let mut indexes = g.indexes.clone();
        indexes[i] = sealed;
        *g = Arc::new(Snapshot::new(g.segments.clone(), indexes));
    }

    /// The batches committed lately, kept in memory for reads (see [`RecentBatches`]).
    pub(crate) fn recent(&self) -> &Arc<RecentBatches> {
        &self.recent
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

    pub(crate) fn set_refresh_failures(&self, n: u64) {
        self.refresh_failures.store(n, Ordering::Relaxed);
    }

    /// A follower's failed refreshes in a row: 0 while it follows (and on a writer's store).
    pub fn refresh_failures(&self) -> u64 {
        self.refresh_failures.load(Ordering::Relaxed)
    }
}

const WINDOW: usize = 256 * 1024;
/// Bytes read ahead of a record fetched by position (an indexed read's random access).
const FETCH: u64 = 2048;
/// An indexed read stretches one read to cover the next planned record when it is this close.
const FETCH_SPAN: u64 = 64 * 1024;

/// Positional access to records of a pinned snapshot, through one reusable read window.
pub struct Cursor {
    snap: Arc<Snapshot>,
    recent: Option<Arc<RecentBatches>>,
    buf: Vec<u8>,
    /// When set, the window is this remembered batch instead of `buf`.
    mem: Option<Arc<crate::log::aligned::AlignedBuf>>,
    win_seg: usize,
    win_start: u64,
    win_len: usize,
    /// Read the files only from the page cache; a miss fails with [`ReadError::WouldBlock`]
    /// and leaves the range to fetch in `cold`.
    nowait: bool,
    cold: Option<ColdRange>,
    /// A fetched range came back short (the end of the file, or an error): read the next
    /// window the usual way, which reports what stopped it, instead of missing again.
    fetched_short: bool,
}

impl Cursor {
    /// A cursor over `snap` that reads the segment files.
    pub fn new(snap: Arc<Snapshot>) -> Cursor {
        Cursor {
            snap,
            recent: None,
            buf: Vec::new(),
            mem: None,
            win_seg: usize::MAX,
            win_start: 0,
            win_len: 0,
            nowait: false,
            cold: None,
            fetched_short: false,
        }
    }

    /// A cursor over `snap` that takes records of recently committed batches from memory
    /// (`shared`'s [`RecentBatches`]) and the rest from the files.
    pub(crate) fn with_recent(snap: Arc<Snapshot>, shared: &Shared) -> Cursor {
        Cursor { recent: Some(shared.recent.clone()), ..Cursor::new(snap) }
    }

    /// Lets go of the window's memory; the next access reads it again.
    fn release_window(&mut self) {
        self.buf = Vec::new();
        self.mem = None;
        self.win_seg = usize::MAX;
        self.win_len = 0;
    }

    /// The bytes of the current window: file offsets `[win_start, win_start + win_len)`.
    fn window(&self) -> &[u8] {
        match &self.mem {
            Some(m) => &m.as_slice()[..self.win_len],
            None => &self.buf[..self.win_len],
        }
    }

    fn ensure(&mut self, si: usize, start: u64, len: usize, lo: u64, hi: u64) -> Result<(), ReadError> {
        if self.win_seg == si && start >= self.win_start && start + len as u64 <= self.win_start + self.win_len as u64 {
            return Ok(());
        }
        let seg = &self.snap.segments[si];
        if let Some(b) = self.recent.as_ref().and_then(|r| r.covering(seg.base, start, start + len as u64)) {
            self.win_seg = si;
            self.win_start = b.start;
            self.win_len = b.len;
            self.mem = Some(b.bytes);
            return Ok(());
        }
        self.mem = None;
        let (lo, hi) = (lo.min(start), hi.max(start + len as u64));
        let n = (hi - lo) as usize;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        let io_err = |e: std::io::Error| ReadError::Io { path: seg.path.clone(), message: e.to_string() };
        let need = (start + len as u64 - lo) as usize;
        let got = if self.nowait && !std::mem::take(&mut self.fetched_short) {
            match seg.read_cached_at(&mut self.buf[..n], lo) {
                Ok(got) if got >= need => got,
                Ok(_) => return self.miss(si, lo, n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return self.miss(si, lo, n),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)) => {
                    // No RWF_NOWAIT here: read the way everyone else does from now on.
                    self.nowait = false;
                    seg.read_at(&mut self.buf[..n], lo).map_err(io_err)?
                }
                Err(e) => return Err(io_err(e)),
            }
        } else {
            seg.read_at(&mut self.buf[..n], lo).map_err(io_err)?
        };
        self.win_seg = si;
        self.win_start = lo;
        self.win_len = got;
        if got < need {
            return Err(ReadError::Corrupt { path: seg.path.clone(), offset: start, detail: "record runs past the end of the file".into() });
        }
        Ok(())
    }

    /// A page-cache miss of a read that must not wait: the window is dropped and
    /// `[lo, lo + n)` of segment `si` is left to fetch.
    fn miss(&mut self, si: usize, lo: u64, n: usize) -> Result<(), ReadError> {
        self.win_seg = usize::MAX;
        self.win_len = 0;
        self.cold = Some(ColdRange { seg: self.snap.segments[si].clone(), off: lo, len: n, bytes: Vec::new(), pinned: 0 });
        Err(ReadError::WouldBlock)
    }

    /// Makes the bytes `cold` fetched the window (they belong to one of this snapshot's
    /// segments; a range of another is dropped).
    fn install(&mut self, cold: ColdRange) {
        let Some(si) = self.snap.segments.iter().position(|s| s.base == cold.seg.base) else { return };
        self.fetched_short = cold.bytes.len() < cold.len;
        self.win_seg = si;
        self.win_start = cold.off;
        self.win_len = cold.bytes.len();
        self.buf = cold.bytes;
        self.mem = None;
    }

    fn offset(&self, pos: u64) -> (usize, u64) {
        let si = self.snap.segment_of(pos);
        let seg = &self.snap.segments[si];
        (si, seg.offsets.get((pos - seg.base) as usize) as u64)
    }

    /// Loads the event at `pos` (which must be durable) and returns its byte range in the
    /// window; `forward` picks the read-ahead direction of a sequential walk.
    fn load(&mut self, pos: u64, forward: bool) -> Result<std::ops::Range<usize>, ReadError> {
        let (_, off) = self.offset(pos);
        let (lo, hi) =
            if forward { (off, off + WINDOW as u64) } else { ((off + WINDOW as u64 / 4).saturating_sub(WINDOW as u64).max(64), off + WINDOW as u64 / 4) };
        self.load_within(pos, lo, hi)
    }

    /// Loads the event at `pos` for an indexed read: a small read, stretched to cover `then`
    /// (the next planned position) when it lies close by in the same segment.
    fn fetch(&mut self, pos: u64, then: Option<u64>) -> Result<std::ops::Range<usize>, ReadError> {
        let (si, off) = self.offset(pos);
        let (mut lo, mut hi) = (off, off + FETCH);
        if let Some((sj, o2)) = then.map(|p| self.offset(p)) {
            if sj == si && o2.abs_diff(off) < FETCH_SPAN {
                lo = lo.min(o2);
                hi = hi.max(o2 + FETCH);
            }
        }
        self.load_within(pos, lo, hi)
    }

    fn load_within(&mut self, pos: u64, lo: u64, hi: u64) -> Result<std::ops::Range<usize>, ReadError> {
        let (si, off) = self.offset(pos);
        self.ensure(si, off, RECORD_HEAD, lo, hi)?;
        let h = (off - self.win_start) as usize;
        let len = declared_len(&self.window()[h..h + RECORD_HEAD]);
        self.ensure(si, off, RECORD_HEAD + len, off, off + (RECORD_HEAD + len) as u64)?;
        let h = (off - self.win_start) as usize;
        if verify_data(&self.window()[h..h + RECORD_HEAD + len]).is_none() {
            let seg = &self.snap.segments[si];
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
        EventRef::from_bytes(&self.window()[r.clone()]).map_err(|e| ReadError::Corrupt {
            path: self.snap.segments[self.win_seg].path.clone(),
            offset: self.win_start + r.start as u64 - RECORD_HEAD as u64,
            detail: e.to_string(),
        })
    }

    /// The lowest position in `(after, hi]` whose event matches `q`, by decoding every event
    /// (the oracle the index is checked against).
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

/// How a read finds its events (docs/architecture.md §5.2): decode every position in range, or
/// take the positions from the indexes and fetch only those.
enum Plan {
    /// Not chosen yet: the first step chooses (with this scan bias), so a read pins its
    /// watermark when it is created and pays for planning only when it is first served.
    Unplanned {
        scan_bias: u32,
    },
    Scan,
    Indexed {
        /// Planned positions not yet returned, in walk order.
        queue: VecDeque<u64>,
        /// The next segment to plan, in walk order; `None` when every segment is planned.
        next_seg: Option<usize>,
    },
}

/// What one bounded [`Reads::step`] found.
pub enum Step<'a> {
    /// The next match, borrowed from the read's buffer.
    Event(Position, EventRef<'a>),
    /// The step's budget of examined positions ran out before a match; call again.
    Pending,
    /// No more matches.
    End,
    /// The read failed (and is over).
    Failed(ReadError),
    /// Only from a read made [not to wait](Reads::without_waiting): the next record must come
    /// from the disk. Run the [`ColdRange`] where blocking is allowed, then step again; the
    /// read resumes where it stopped.
    Blocked(ColdRange),
}

/// Ranges of at most this many positions are scanned without asking the indexes.
const SMALL_RANGE: u64 = 64;

/// A read pinned to the watermark loaded when it started: forward over `(after, watermark]`
/// ascending, or backward over `[1, before)` ∩ `[1, watermark]` descending, at most `limit`
/// matches. A lending iterator: each event borrows the read's buffer.
///
/// The planner picks, once per read, between a scan and the indexes: the index when
/// `estimate × scan_bias ≤ range width` (the estimate sums, over the segments in range, each
/// query item's shortest tag posting list, or the width for a tagless item); `scan_bias` 0 or 1
/// always takes the index, `u32::MAX` always scans, [`Query::All`] is always a scan. Either way
/// the answer is the same.
pub struct Reads {
    cursor: Cursor,
    /// Shared, so that a subscription's polls do not copy or prepare a large query each time.
    query: Arc<QueryMatcher>,
    next: u64,
    last: u64,
    forward: bool,
    remaining: Option<u64>,
    watermark: u64,
    plan: Plan,
}

impl Reads {
    pub(crate) fn forward(shared: &Shared, query: Arc<QueryMatcher>, after: Position, limit: Option<u64>) -> Reads {
        let (w, snap) = shared.pin();
        Reads {
            cursor: Cursor::with_recent(snap, shared),
            query,
            next: after.get().saturating_add(1),
            last: w,
            forward: true,
            remaining: limit,
            watermark: w,
            plan: Plan::Unplanned { scan_bias: shared.scan_bias },
        }
    }

    pub(crate) fn backward(shared: &Shared, query: Arc<QueryMatcher>, before: Position, limit: Option<u64>) -> Reads {
        let (w, snap) = shared.pin();
        let start = before.get().saturating_sub(1).min(w);
        Reads {
            cursor: Cursor::with_recent(snap, shared),
            query,
            next: start,
            last: 1,
            forward: false,
            remaining: limit,
            watermark: w,
            plan: Plan::Unplanned { scan_bias: shared.scan_bias },
        }
    }

    /// Makes this read never wait for the disk: a record neither in memory nor in the page
    /// cache ends a step with [`Step::Blocked`] instead (for an executor thread that serves
    /// other connections meanwhile). Segments without an index, scanned while planning an
    /// indexed read, are still read the usual way.
    pub fn without_waiting(mut self) -> Reads {
        self.cursor.nowait = true;
        self
    }

    /// Hands back a [`ColdRange`] from [`Step::Blocked`] after [`ColdRange::run`]: the next
    /// step reads from its bytes.
    pub fn fetched(&mut self, cold: ColdRange) {
        self.cursor.install(cold);
    }

    /// Lowers a forward read's pinned watermark to `w` before its first step; true when that
    /// changed it.
    fn cap(&mut self, w: u64) -> bool {
        debug_assert!(self.forward && matches!(self.plan, Plan::Unplanned { .. }));
        if w >= self.watermark {
            return false;
        }
        self.watermark = w;
        self.last = self.last.min(w);
        true
    }

    /// Chooses the plan, once.
    fn plan(&mut self) {
        if let Plan::Unplanned { scan_bias } = self.plan {
            self.plan = self.choose(scan_bias);
        }
    }

    /// The inclusive global range still to read, low end first.
    fn range(&self) -> (u64, u64) {
        if self.forward {
            (self.next, self.last)
        } else {
            (self.last.max(1), self.next)
        }
    }

    fn choose(&self, scan_bias: u32) -> Plan {
        // `u32::MAX` means "always scan", even for a query the indexes say matches nothing.
        if self.exhausted() || matches!(self.query.query(), Query::All) || scan_bias == u32::MAX {
            return Plan::Scan;
        }
        let (first, last) = self.range();
        let width = last - first + 1;
        // Estimating looks up every item in every segment of the range: over a range narrower
        // than that (a live subscription's few new positions, a query of 100,000 items), a
        // scan is cheaper, and gives the same answer. A bias of 0 or 1 still takes the index.
        let items = match self.query.query() {
            Query::Items(v) => v.len() as u64,
            Query::All => 0,
        };
        if scan_bias > 1 && width <= items.max(SMALL_RANGE) {
            return Plan::Scan;
        }
        let snap = &self.cursor.snap;
        let (a, b) = (snap.segment_of(first), snap.segment_of(last));
        let mut est = 0u64;
        for i in a..=b {
            let (lo, hi) = snap.local_range(i, first, last);
            est = est.saturating_add(snap.indexes[i].estimate(self.query.query(), lo, hi));
        }
        if est.saturating_mul(scan_bias as u64) <= width {
            Plan::Indexed { queue: VecDeque::new(), next_seg: Some(if self.forward { a } else { b }) }
        } else {
            Plan::Scan
        }
    }

    /// Lets go of the read window's memory (a read about to wait for its turn); the next step
    /// reads the window again, from memory or the page cache as usual.
    pub fn release_window(&mut self) {
        self.cursor.release_window();
    }

    /// True when this read uses the indexes (for tests and diagnostics; plans the read if its
    /// first step has not).
    pub fn is_indexed(&mut self) -> bool {
        self.plan();
        matches!(self.plan, Plan::Indexed { .. })
    }

    /// The watermark (the last durable position) this read is pinned to.
    pub fn watermark(&self) -> Position {
        Position(self.watermark)
    }

    fn exhausted(&self) -> bool {
        self.remaining == Some(0) || self.query.query().is_none() || if self.forward { self.next > self.last } else { self.next < self.last || self.next == 0 }
    }

    /// Plans segments (in walk order) until some position is queued or none is left.
    fn refill(&mut self) {
        let (first, last) = self.range();
        let limit = self.remaining.map_or(usize::MAX, |n| n as usize);
        let dir = if self.forward { Direction::Forward } else { Direction::Backward };
        let Plan::Indexed { queue, next_seg } = &mut self.plan else { return };
        while queue.is_empty() {
            let Some(si) = *next_seg else { return };
            let snap = self.cursor.snap.clone();
            *next_seg = if self.forward {
                (si + 1 < snap.segments.len() && snap.segments[si + 1].base <= last).then_some(si + 1)
            } else {
                (si > 0 && snap.segments[si].base > first).then(|| si - 1)
            };
            let (lo, hi) = snap.local_range(si, first, last);
            if lo >= hi {
                continue;
            }
            let base = snap.segments[si].base;
            queue.extend(snap.indexes[si].matches(self.query.query(), lo, hi, dir, limit).into_iter().map(|l| base + l as u64));
        }
    }

    /// The next matching event, or `None` at the end.
    ///
    /// # Errors
    /// A [`ReadError`] ends the read.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<(Position, EventRef<'_>), ReadError>> {
        let mut unlimited = usize::MAX;
        // Iterating waits for the disk, also for a read made not to wait.
        self.cursor.nowait = false;
        match self.step(&mut unlimited) {
            Step::Event(p, ev) => Some(Ok((p, ev))),
            Step::Failed(e) => Some(Err(e)),
            Step::End | Step::Pending => None,
            Step::Blocked(_) => Some(Err(ReadError::WouldBlock)),
        }
    }

    /// Like [`next`](Self::next), but a scan takes one unit of `budget` per position it
    /// examines and returns [`Step::Pending`] once the budget is spent without a match;
    /// calling again (with more budget) resumes where it stopped. An index-planned read
    /// examines only matching positions and does not draw on the budget. A server serves
    /// reads in such steps so that one read over a long stretch of non-matching events cannot
    /// hold up the other requests of its thread.
    pub fn step(&mut self, budget: &mut usize) -> Step<'_> {
        self.plan();
        loop {
            if self.exhausted() {
                return Step::End;
            }
            if matches!(self.plan, Plan::Scan) {
                if *budget == 0 {
                    return Step::Pending;
                }
                *budget -= 1;
            }
            let (pos, loaded) = match &mut self.plan {
                Plan::Unplanned { .. } | Plan::Scan => {
                    let pos = self.next;
                    (pos, self.cursor.load(pos, self.forward))
                }
                Plan::Indexed { queue, .. } => {
                    if queue.is_empty() {
                        self.refill();
                    }
                    let Plan::Indexed { queue, .. } = &mut self.plan else { unreachable!() };
                    let Some(pos) = queue.pop_front() else {
                        self.remaining = Some(0);
                        return Step::End;
                    };
                    let then = queue.front().copied();
                    (pos, self.cursor.fetch(pos, then))
                }
            };
            if let Err(ReadError::WouldBlock) = loaded {
                // Not examined yet: the next step starts at the same position.
                match &mut self.plan {
                    Plan::Indexed { queue, .. } => queue.push_front(pos),
                    _ => *budget = budget.saturating_add(1),
                }
                let mut cold = self.cursor.cold.take().expect("a miss leaves its range");
                cold.pinned = self.watermark;
                return Step::Blocked(cold);
            }
            if self.forward {
                self.next = pos + 1;
            } else {
                self.next = pos - 1;
            }
            let loaded = loaded.and_then(|r| {
                let hit = self.query.matches(&self.cursor.decode(r.clone())?);
                Ok((r, hit))
            });
            match loaded {
                Ok((r, true)) => {
                    if let Some(n) = &mut self.remaining {
                        *n -= 1;
                    }
                    return match self.cursor.decode(r) {
                        Ok(ev) => Step::Event(Position(pos), ev),
                        Err(e) => Step::Failed(e),
                    };
                }
                Ok((_, false)) => {}
                Err(e) => {
                    self.remaining = Some(0);
                    return Step::Failed(e);
                }
            }
        }
    }

    /// For a forward read: every position at or below this one has been examined (and each
    /// match among them returned).
    fn examined_through(&self) -> u64 {
        self.next - 1
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

/// How a bounded subscription poll ([`Subscription::poll_within`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Polled {
    /// Events handed to the callback.
    pub delivered: usize,
    /// The cursor reached the watermark the poll was pinned to.
    pub caught_up: bool,
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
    /// Shared with each poll's read (a clone per poll copied every item: review, 100,000 items).
    query: Arc<QueryMatcher>,
    cursor: u64,
    /// Polls never wait for the disk ([`Subscription::without_waiting`]).
    nowait: bool,
    /// The range the last poll stopped at, to fetch before the next one.
    cold: Option<ColdRange>,
    /// That range, fetched: the next poll starts from its bytes and goes no further than the
    /// watermark of the poll that stopped at it.
    fetched: Option<ColdRange>,
}

impl Subscription {
    pub(crate) fn new(shared: Arc<Shared>, query: Arc<QueryMatcher>, after: Position) -> Subscription {
        shared.subscribers.fetch_add(1, Ordering::SeqCst);
        Subscription { shared, query, cursor: after.get(), nowait: false, cold: None, fetched: None }
    }

    /// Makes every poll stop, instead of waiting for the disk, at a record neither in memory
    /// nor in the page cache (see [`Reads::without_waiting`]): the poll then returns not
    /// caught up and [`take_cold_range`](Self::take_cold_range) gives the range to fetch
    /// before polling again.
    pub fn without_waiting(mut self) -> Subscription {
        self.nowait = true;
        self
    }

    /// The range the last poll stopped at (see [`without_waiting`](Self::without_waiting)).
    pub fn take_cold_range(&mut self) -> Option<ColdRange> {
        self.cold.take()
    }

    /// Hands back a [`ColdRange`] from [`take_cold_range`](Self::take_cold_range) after
    /// [`ColdRange::run`]: the next poll reads from its bytes.
    pub fn fetched(&mut self, cold: ColdRange) {
        self.fetched = Some(cold);
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
    pub fn poll_batch(&mut self, max_events: usize, f: impl FnMut(Position, EventRef<'_>)) -> Result<usize, ReadError> {
        let mut unlimited = usize::MAX;
        Ok(self.poll_within(max_events, &mut unlimited, f)?.delivered)
    }

    /// [`poll_batch`](Self::poll_batch) that examines at most `budget` positions when it has
    /// to scan (each examined position takes one unit): when the budget runs out first, the
    /// cursor stops at the last position examined and the poll is not caught up.
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn poll_within(&mut self, max_events: usize, budget: &mut usize, mut f: impl FnMut(Position, EventRef<'_>)) -> Result<Polled, ReadError> {
        let mut reads = Reads::forward(&self.shared, self.query.clone(), Position(self.cursor), Some(max_events as u64));
        reads.cursor.nowait = self.nowait;
        // A fetched range holds the file as it was when it was read, which may be after the
        // poll that asked for it but before later commits: its bytes past that poll's
        // watermark can be zeros or a block still being written. This poll stops at that
        // watermark (every position up to it was durable before the range was read); the next
        // one reads on with a fresh window (review: a subscription catching up under appends
        // failed with "record checksum mismatch" on events the fetch read before they were
        // written).
        let mut capped = false;
        if let Some(cold) = self.fetched.take() {
            capped = reads.cap(cold.pinned);
            reads.cursor.install(cold);
        }
        let w = reads.watermark;
        let mut delivered = 0;
        let mut last = self.cursor;
        loop {
            match reads.step(budget) {
                Step::Event(p, e) => {
                    f(p, e);
                    last = p.get();
                    delivered += 1;
                }
                Step::Failed(e) => return Err(e),
                Step::Pending => {
                    self.cursor = reads.examined_through().max(self.cursor);
                    return Ok(Polled { delivered, caught_up: false });
                }
                Step::Blocked(cold) => {
                    self.cursor = reads.examined_through().max(self.cursor);
                    self.cold = Some(cold);
                    return Ok(Polled { delivered, caught_up: false });
                }
                Step::End => {
                    // Stopped short of the live watermark by a fetched range: not caught up.
                    let caught_up = delivered < max_events && !capped;
                    self.cursor = if caught_up { w.max(self.cursor) } else { last };
                    return Ok(Polled { delivered, caught_up });
                }
            }
        }
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

    /// The outcome when a wait would end now, or else a listener for the next change. It
    /// listens, then re-checks: a publish between the two cannot be missed.
    fn settled_or_listen(&self) -> Result<WaitOutcome, event_listener::EventListener> {
        if let Some(o) = self.settled() {
            return Ok(o);
        }
        let l = self.shared.changed.listen();
        match self.settled() {
            Some(o) => Ok(o),
            None => Err(l),
        }
    }

    /// Blocks until the watermark passes the cursor, `timeout` elapses or the store closes.
    pub fn wait_timeout(&self, timeout: Duration) -> WaitOutcome {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let l = match self.settled_or_listen() {
                Ok(o) => return o,
                Err(l) => l,
            };
            if l.wait_deadline(deadline).is_none() && std::time::Instant::now() >= deadline {
                return WaitOutcome::TimedOut;
            }
        }
    }

    /// Waits asynchronously (on any executor) until the watermark passes the cursor or the
    /// store closes.
    pub async fn wait(&self) -> WaitOutcome {
        loop {
            match self.settled_or_listen() {
                Ok(o) => return o,
                Err(l) => l.await,
            }
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

#[cfg(test)]
mod tests {
    use super::{RecentBatches, RECENT_BATCHES, RECENT_BYTES};
    use crate::log::aligned::AlignedBuf;

    fn batch(fill: u8, len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(len);
        b.extend_from_slice(&vec![fill; len]);
        b
    }

    #[test]
    fn a_range_is_found_only_in_the_batch_of_its_segment_that_holds_all_of_it() {
        let r = RecentBatches::default();
        // Segment 1: [0, 5000), then [4096, 9000) (it starts with the tail block of the first).
        assert!(r.remember(1, 0, 5000, batch(1, 5000)).is_none());
        assert!(r.remember(1, 4096, 4904, batch(2, 4904)).is_none());
        // Segment 100 starts over at offset 0.
        assert!(r.remember(100, 0, 300, batch(3, 300)).is_none());
        let at = |base, from, to| r.covering(base, from, to).map(|b| (b.start, b.bytes.as_slice()[0]));
        assert_eq!(at(1, 64, 200), Some((0, 1)));
        assert_eq!(at(1, 4100, 5000), Some((4096, 2)), "the newer batch holds the shared block too");
        assert_eq!(at(1, 4000, 4200), Some((0, 1)));
        assert_eq!(at(1, 4000, 5001), None, "split over two batches: read the file");
        assert_eq!(at(1, 8990, 9000), Some((4096, 2)));
        assert_eq!(at(1, 8990, 9001), None, "past the last durable byte");
        assert_eq!(at(100, 0, 300), Some((0, 3)));
        assert_eq!(at(100, 200, 400), None);
        assert_eq!(at(50, 0, 10), None, "a segment never remembered");
    }

    #[test]
    fn only_the_last_few_batches_are_kept() {
        let r = RecentBatches::default();
        let mut handed_back = 0;
        for i in 0..RECENT_BATCHES as u64 + 2 {
            handed_back += r.remember(1, i * 4096, 100, batch(i as u8, 100)).is_some() as usize;
        }
        assert_eq!(handed_back, 2, "the two oldest come back for reuse");
        assert!(r.covering(1, 4096, 4100).is_none());
        assert!(r.covering(1, 2 * 4096, 2 * 4096 + 10).is_some());
    }

    #[test]
    fn old_batches_are_forgotten_past_the_cap_and_handed_back_once_unread() {
        let r = RecentBatches::default();
        let chunk = RECENT_BYTES / 4;
        let mut start = 0u64;
        let mut remember = |fill| {
            let got = r.remember(1, start, chunk, batch(fill, chunk));
            start += chunk as u64;
            got
        };
        for fill in 0..4 {
            assert!(remember(fill).is_none(), "within the cap");
        }
        // A reader still holds the oldest batch: it is forgotten but not handed back.
        let held = r.covering(1, 0, 10).expect("the oldest batch");
        assert!(remember(4).is_none());
        assert!(r.covering(1, 0, 10).is_none(), "forgotten");
        assert_eq!(held.bytes.as_slice()[chunk - 1], 0, "a reader's batch stays intact");
        // Nobody reads the next oldest: its buffer comes back for reuse.
        let back = remember(5).expect("an unread buffer");
        assert!(back.capacity() >= chunk);
        assert!(r.covering(1, chunk as u64, chunk as u64 + 10).is_none());
        assert!(r.covering(1, 5 * chunk as u64, 5 * chunk as u64 + 10).is_some());
    }
}
