//! The follower: a read-only view of a live writer's data directory from another process on the
//! same host (docs/operations.md §10).
//!
//! It creates nothing, deletes nothing, writes nothing and takes no lock, so it works against a
//! live writer, on a directory it cannot write and on a read-only mount; neither side ever waits
//! for the other. It exposes only a committed prefix: a run of records counts only when every
//! record validates and the run ends in a commit marker (the recovery rule), so what it serves is
//! gap-free, duplicate-free and only grows.
//!
//! Limits, stated plainly:
//! - **Not a durability oracle.** A batch becomes visible once its commit marker reaches the page
//!   cache, just before the writer's fsync returns; a power loss in that window can erase events
//!   a follower already served. Treat it as an asynchronous replica.
//! - **Lag**: at most one poll interval plus the time to scan what was appended meanwhile.
//! - **Same host only**: visibility relies on a shared page cache (not NFS or SMB).
//! - **Cost at open**: the follower scans every segment once and builds its indexes in memory
//!   (it never writes index files).
//! - **Damage**: a damaged record that the writer's recovery would refuse (one followed by
//!   committed batches, or one that ends a sealed segment short of the next one's base) stops
//!   the follower there for good: it serves the committed prefix before it and nothing past it,
//!   and every refresh fails with [`LogError::Corrupt`] naming the file and byte offset
//!   (logged at once, then at most once a minute, and counted in
//!   `tephra_follower_refresh_failures`). It opens on such a store all the same: it cannot
//!   repair anything, and the prefix is as exact as ever.

use crate::event::EventRef;
use crate::index::active::ActiveWriter;
use crate::index::SegIndex;
use crate::log::header::{HeaderError, SegmentHeader, HEADER_LEN};
use crate::log::record::{classify_tail, declared_len, payload_at, walk, Stop, TailVerdict, Walk, RECORD_HEAD};
use crate::log::segment::{list_segments, Segment, SegmentConfig};
use crate::log::LogError;
use crate::read::{Shared, Snapshot};
use crate::repeated::RepeatedFailure;
use crate::store::StoreHandle;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Follower settings.
#[derive(Clone, Debug)]
pub struct FollowerConfig {
    /// Segment geometry; only sizes of records matter (each file's own length is used).
    pub segment: SegmentConfig,
    /// How often to look for new commits and segments.
    pub poll_interval: Duration,
    /// The read planner's bias (`read.scan_bias`, default 4).
    pub scan_bias: u32,
}

impl FollowerConfig {
    /// A configuration with `segment` and a 100 ms poll interval.
    pub fn new(segment: SegmentConfig) -> FollowerConfig {
        FollowerConfig { segment, poll_interval: Duration::from_millis(100), scan_bias: 4 }
    }
}

struct Tail {
    /// Segments known so far, ascending.
    segments: Vec<Arc<Segment>>,
    /// Byte offset just past the active segment's last commit marker.
    active_end: u64,
    /// Byte offset in the active segment where the last walk stopped: the record after the
    /// committed prefix, not written yet or damaged (see [`Follower::refresh`]).
    stopped_at: u64,
    /// The next position to expect.
    next: u64,
    /// The active segment's index, fed as commits become visible.
    index: Option<ActiveWriter>,
    /// The active segment was reopened with larger tables and is being read again from its
    /// start into them; readers keep the old tables until the new ones hold as much.
    regrown: Option<u64>,
    /// The directory held no segment when the follower opened, and the log said it waits for
    /// the writer to create the first one; cleared (and said) once that segment is followed.
    awaiting_first: bool,
    /// The buffer walks of the active segment read into, kept between polls (a follower polls
    /// every 100 ms by default, idle writer or not).
    scratch: Vec<u8>,
    /// Polls in a row that found nothing new while the active segment's modification time
    /// moved: the writer writes, yet nothing past [`Tail::stopped_at`] reads as committed.
    stuck_polls: u32,
    /// The active segment's modification time at the last poll.
    mtime: Option<std::time::SystemTime>,
    /// When the rest of the active segment was last checked whole ([`Follower::check_rest`]);
    /// `None` before the first check.
    rest_checked: Option<std::time::Instant>,
    /// A damaged record followed by committed batches, confirmed in a poll's window or by
    /// [`Follower::check_rest`]: said at every poll that stops there, without reading
    /// anything again while the file stays as it was.
    hole: Option<Hole>,
}

/// Damage confirmed at [`Tail::stopped_at`] (see [`Tail::hole`]).
#[derive(Clone, Copy)]
struct Hole {
    /// The segment's base.
    base: u64,
    /// The damaged record's byte offset.
    at: u64,
    stop: Stop,
    /// The segment file's modification time when the damage was confirmed.
    mtime: Option<std::time::SystemTime>,
    /// When the damage was confirmed (or last read again).
    since: std::time::Instant,
}

/// Polls in a row without progress while the writer writes before the rest of the active
/// segment is checked whole for committed batches past a hole.
const STUCK_POLLS: u32 = 3;

/// The least time between two whole checks of the rest of the active segment.
const REST_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Records a damaged record at [`Tail::stopped_at`] in the active segment `seg`, followed by
/// committed batches, as [`Tail::hole`] (said again at later polls without reading), and
/// returns its error.
fn confirm_damage(seg: &Segment, t: &mut Tail, stop: Stop) -> LogError {
    t.hole = Some(Hole { base: seg.base, at: t.stopped_at, stop, mtime: modified(seg), since: std::time::Instant::now() });
    damaged_active(seg, t, stop)
}

/// Fails when the file at `seg`'s path is not the one this follower has open: the followed
/// directory was removed and a store created again in its place (segments are never
/// replaced or removed by a writer once named). The follower keeps serving what it had; a
/// restart follows the new store (review: a recreated store was taken for damage to the old
/// one, "the writer refuses to open it at its next start", which it did not).
fn check_same_file(seg: &Segment) -> Result<(), LogError> {
    use std::os::unix::fs::MetadataExt;
    let io = |source| LogError::Io { path: seg.path.clone(), source };
    let held = seg.file.metadata().map_err(io)?;
    let now = match std::fs::metadata(&seg.path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(e)),
    };
    if now.as_ref().is_some_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino())) {
        return Ok(());
    }
    let what = if now.is_some() { "is another file now" } else { "is gone" };
    Err(io(std::io::Error::other(format!(
        "the segment this follower is reading {what}: the followed store was removed or replaced; this follower serves the events it had, and a restart follows the store now there"
    ))))
}

/// The segment file's modification time, if it can be had.
fn modified(seg: &Segment) -> Option<std::time::SystemTime> {
    seg.file.metadata().ok()?.modified().ok()
}

/// The error of a damaged record at [`Tail::stopped_at`] in the active segment `seg`, followed
/// by committed batches.
fn damaged_active(seg: &Segment, t: &Tail, stop: Stop) -> LogError {
    LogError::Corrupt {
        path: seg.path.clone(),
        offset: t.stopped_at,
        detail: format!(
            "a damaged record ({stop:?}) is followed by committed batches; this follower serves positions up to {} and cannot read past it",
            t.next - 1
        ),
    }
}

/// The damage already confirmed where the last walk stopped ([`Tail::hole`]), said again
/// without reading (a length field damaged to point 128 MiB on had every poll read that much
/// again; review), unless the file was written since: then it is read again, at most every
/// [`REST_CHECK_EVERY`] (a live writer writes past the damage all the time), so that a
/// segment restored in place is followed on (review: a restored sealed segment was never read
/// again, and the follower served the prefix before the damage until a restart).
fn known_damage(seg: &Segment, t: &mut Tail) -> Option<LogError> {
    let h = t.hole?;
    if h.base != seg.base || h.at != t.stopped_at {
        return None;
    }
    if h.since.elapsed() < REST_CHECK_EVERY || modified(seg) == h.mtime {
        return Some(damaged_active(seg, t, h.stop));
    }
    t.hole = None;
    None
}

/// Takes the committed records of a walk of the active segment's bytes `buf`, read from byte
/// `start`: feeds them to the index ([`crate::index::feed`]; they were checked to be valid
/// events) and the record offsets, and moves the follower's position and ends past them.
fn take_committed(seg: &Segment, t: &mut Tail, buf: &[u8], start: u64, w: &Walk) {
    let index = t.index.as_mut().expect("an active segment has an index");
    crate::index::feed(index, t.next, w.offsets.iter().map(|&off| payload_at(buf, off as usize))).expect("validated above");
    for (k, off) in w.offsets.iter().enumerate() {
        seg.offsets.set((t.next - seg.base) as usize + k, (start + *off as u64) as u32);
    }
    t.next += w.offsets.len() as u64;
    t.active_end = start + w.committed_end as u64;
    t.stopped_at = start + w.stop_offset as u64;
}

/// The window to read again with, when the walk `w` of a full window `buf` (of `window`
/// bytes) stopped at its end, where more may follow: within its last record head, or at a
/// record that did not fit in it. A record declared to end past the file is no record that
/// did not fit but a damaged length field (the window grew to as much as 1 GiB for it at every
/// poll). `None` when the stop lies inside the window.
///
/// # Errors
/// The file's length could not be had.
fn wider_window(seg: &Segment, t: &Tail, buf: &[u8], window: usize, w: &Walk) -> Result<Option<usize>, FollowerError> {
    let n = buf.len();
    let edge = n == window
        && (w.stop_offset + RECORD_HEAD >= n.saturating_sub(1)
            || (w.stop == Stop::PastEnd && {
                let len = declared_len(&buf[w.stop_offset..]);
                let file_len = seg.file.metadata().map_err(|source| LogError::Io { path: seg.path.clone(), source })?.len();
                t.stopped_at + (RECORD_HEAD as u64) + len as u64 <= file_len
            }));
    if !edge {
        return Ok(None);
    }
    Ok(Some(if w.committed_end == 0 {
        // Not one whole batch in the window (a group commit holds up to
        // `writer.max_batch_bytes`, 8 MiB by default, and a record up to
        // `segment.max_record_len`): read twice as much, and at least that record.
        let len = if w.stop == Stop::PastEnd { declared_len(&buf[w.stop_offset..]) } else { 0 };
        (window * 2).max(w.stop_offset + RECORD_HEAD + len + 64)
    } else {
        // Catching up: read more at a time.
        (window * 2).min(window.max(STEP_WINDOW))
    }))
}

/// Bytes of the active segment a poll reads first: an idle writer's follower reads this much
/// (of zeros past the log's end: segments are preallocated) and no more.
const FIRST_WINDOW: usize = 64 << 10;

/// The most a poll reads at a time while it finds whole batches to catch up on.
const STEP_WINDOW: usize = 4 << 20;

/// A read-only follower of a data directory. Dropping it stops polling and ends subscriptions.
pub struct Follower {
    dir: PathBuf,
    cfg: FollowerConfig,
    shared: Arc<Shared>,
    tail: Mutex<Tail>,
    stop: Arc<AtomicBool>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Failed refreshes in a row (`tephra_follower_refresh_failures`) and what the log said of
    /// them (review: a follower stopped at a damaged record polls every 100 ms; a line per poll
    /// would flood the log, none left it silent).
    failures: Mutex<RepeatedFailure>,
}

/// Why a follower could not open or refresh.
pub type FollowerError = LogError;

fn header_of(path: &Path) -> Result<Result<SegmentHeader, HeaderError>, LogError> {
    let f = std::fs::File::open(path).map_err(|source| LogError::Io { path: path.to_owned(), source })?;
    let mut b = [0u8; HEADER_LEN];
    let n = f.read_at(&mut b, 0).map_err(|source| LogError::Io { path: path.to_owned(), source })?;
    Ok(SegmentHeader::decode(&b[..n]))
}

impl Follower {
    /// Opens `dir` read-only and catches up with every committed event; call
    /// [`Follower::start_polling`] (or [`Follower::refresh`]) to follow new commits.
    ///
    /// A directory in which no writer has created a segment yet (a follower started before its
    /// writer) opens as an empty store, head 0, and logs once that it waits for the writer to
    /// create the first segment; the follower takes that segment up at the first refresh that
    /// finds it, like any later one.
    ///
    /// A store with a damaged record that the writer would refuse to open (see
    /// [`Follower::refresh`]) opens all the same, with the committed prefix before the damage:
    /// the damage is logged as an error naming the file and byte offset and counted as a failed
    /// refresh (`tephra_follower_refresh_failures` is 1), and every later refresh fails alike.
    /// A follower cannot repair a store, and refusing would take away the exact prefix too.
    ///
    /// # Errors
    /// [`LogError::Io`] when the directory cannot be read (it does not exist included: a
    /// follower creates nothing), or a header or contiguity error in the committed chain.
    pub fn open(dir: impl AsRef<Path>, cfg: FollowerConfig) -> Result<Arc<Follower>, FollowerError> {
        let dir = dir.as_ref().to_path_buf();
        let f = Arc::new(Follower {
            shared: Arc::new(Shared::new(Snapshot::new(Vec::new(), Vec::new()), 0, cfg.scan_bias)),
            tail: Mutex::new(Tail {
                segments: Vec::new(),
                active_end: HEADER_LEN as u64,
                stopped_at: HEADER_LEN as u64,
                next: 1,
                index: None,
                regrown: None,
                awaiting_first: false,
                scratch: Vec::new(),
                stuck_polls: 0,
                mtime: None,
                rest_checked: None,
                hole: None,
            }),
            stop: Arc::new(AtomicBool::new(false)),
            poller: Mutex::new(None),
            failures: Mutex::new(RepeatedFailure::default()),
            dir,
            cfg,
        });
        match f.refresh() {
            Ok(_) => {}
            // Damage: serve the prefix before it, say so and count it, as while following.
            Err(e @ LogError::Corrupt { .. }) => f.note(Err(&e)),
            Err(e) => return Err(e),
        }
        let mut t = f.tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.segments.is_empty() {
            t.awaiting_first = true;
            tracing::info!(poll_ms = f.cfg.poll_interval.as_millis() as u64, "waiting for the writer to create the first segment in {}", f.dir.display());
        }
        drop(t);
        Ok(f)
    }

    /// A read handle: reads, subscriptions and stats over the followed prefix. Appends through
    /// it fail with [`crate::AppendError::ReadOnly`].
    pub fn handle(&self) -> StoreHandle {
        StoreHandle::read_only(self.shared.clone(), self.cfg.segment, self.dir.clone())
    }

    /// Starts a background thread that calls [`Follower::refresh`] every poll interval.
    pub fn start_polling(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let stop = self.stop.clone();
        let every = self.cfg.poll_interval;
        let h = std::thread::Builder::new()
            .name("tephra-follower".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(every);
                    let Some(f) = me.upgrade() else { return };
                    let refreshed = f.refresh();
                    f.note(refreshed.as_ref().map(|_| ()));
                }
            })
            .expect("follower thread");
        *self.poller.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    }

    /// Picks up newly committed events and new segments; returns the visible head.
    ///
    /// Whatever was committed before a failure is published all the same, so a follower that
    /// keeps failing serves the prefix it could read.
    ///
    /// # Errors
    /// I/O errors, or a chain that breaks contiguity; [`LogError::Corrupt`] (the file and the
    /// byte offset of the damaged record) for damage the writer's recovery would refuse: a
    /// damaged record followed by committed batches, a committed record that is no valid event,
    /// or a sealed segment whose committed records end before the next segment's base. The
    /// follower never reads past such a record, so every later refresh fails the same way.
    pub fn refresh(&self) -> Result<u64, FollowerError> {
        let mut t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let advanced = self.advance(&mut t);
        let head = t.next - 1;
        if head > self.shared.watermark() {
            self.shared.publish(head);
        }
        advanced.map(|()| head)
    }

    /// Counts a refresh's outcome in `tephra_follower_refresh_failures` and says failures in
    /// the log as [`RepeatedFailure`] decides: damage as an error, anything else as a warning.
    fn note(&self, outcome: Result<(), &FollowerError>) {
        let mut s = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let error = match outcome {
            Ok(()) => {
                if s.in_a_row() > 0 {
                    self.shared.set_refresh_failures(0);
                }
                if let Some(r) = s.succeeded() {
                    tracing::info!(failures = r.failures, head = self.shared.watermark(), "follower refreshes succeed again");
                }
                return;
            }
            Err(e) => e,
        };
        let said = s.failed();
        self.shared.set_refresh_failures(s.in_a_row());
        let Some(unsaid) = said else { return };
        let (failures, head) = (s.in_a_row(), self.shared.watermark());
        if matches!(error, LogError::Corrupt { .. }) {
            tracing::error!(%error, head, failures, more_since_last_said = unsaid, "the followed store is damaged: this follower serves the events before the damage and nothing past it (it cannot repair the store; the writer refuses to open it at its next start); said again at most once a minute");
        } else {
            tracing::warn!(%error, head, failures, more_since_last_said = unsaid, "follower refresh failed; serving what it had and retrying (said again at most once a minute while it fails)");
        }
    }

    /// The work of [`Follower::refresh`], up to its first failure; publishes nothing.
    fn advance(&self, t: &mut Tail) -> Result<(), FollowerError> {
        if let Some(seg) = t.segments.last() {
            check_same_file(seg)?;
        }
        let listed = list_segments(&self.dir)?;
        let last_listed = listed.last().map(|(b, _)| *b);
        // Open segments we have not seen yet, in order, as long as they are contiguous.
        for (base, path) in listed {
            if t.segments.iter().any(|s| s.base == base) {
                continue;
            }
            match header_of(&path)? {
                Ok(h) if h.base_position == base => {}
                // The writer may be creating this file right now: try again next time.
                Err(HeaderError::Unwritten) => break,
                Ok(h) => return Err(LogError::BasePositionMismatch { path, header: h.base_position, name: base }),
                Err(source) => return Err(LogError::Header { path, source }),
            }
            if let Some(last) = t.segments.last().cloned() {
                // Drain the old active segment before moving on: its tail is final now.
                self.scan_active(t)?;
                if base < t.next {
                    return Err(LogError::NonContiguous { path, found: base, expected: t.next, hint: String::new() });
                }
                if base > t.next && self.dir.join(crate::log::segment::segment_name(t.next)).exists() {
                    // The segment between them exists and this listing missed it: reading a
                    // directory is not atomic against the writer's renames and creates (review:
                    // ~20 false "damaged" errors with ~3,000 segments and a 1 ms poll). The
                    // next poll lists it.
                    break;
                }
                if base > t.next {
                    // The writer names a segment only once every batch before it has been
                    // written (its first commit names a spare after the batches before it;
                    // one created at once waits for them), so the old segment is complete:
                    // its committed records end short of this base at a damaged record, as
                    // the writer's recovery finds (review: this waited here for good, without
                    // a word, while the writer went on).
                    return Err(LogError::Corrupt {
                        path: last.path.clone(),
                        offset: t.stopped_at,
                        detail: format!(
                            "a damaged record in a sealed segment: its committed records end at position {}, the next segment starts at {base}; this follower serves positions up to {} and cannot read past it",
                            t.next - 1,
                            t.next - 1
                        ),
                    });
                }
            } else if base != 1 {
                return Err(LogError::NonContiguous { path, found: base, expected: 1, hint: String::new() });
            }
            // One with a later segment after it is sealed: tables for its length, not for the
            // configured size (see `Segment::open_sealed`).
            let seg = Arc::new(if Some(base) == last_listed {
                Segment::open(base, path, &self.cfg.segment)?
            } else {
                Segment::open_by_length(base, path, &self.cfg.segment)?
            });
            // The old active segment is final: seal its index (in memory; the writer persists
            // the file, a follower writes nothing).
            // Never persisted, so no fingerprint is needed to tie it to the segment.
            let sealed = t.index.take().map(|w| SegIndex::Sealed(Arc::new(w.to_sealed(0))));
            let index = ActiveWriter::new(base, seg.max_records());
            let shared_index = SegIndex::Active(index.shared().clone());
            t.index = Some(index);
            t.segments.push(seg.clone());
            t.active_end = HEADER_LEN as u64;
            t.stopped_at = HEADER_LEN as u64;
            self.shared.roll(sealed, seg.clone(), shared_index);
            if std::mem::take(&mut t.awaiting_first) {
                tracing::info!(segment = %seg.path.display(), "the writer created the first segment; following it");
            }
        }
        if !t.segments.is_empty() {
            self.scan_active(t)?;
        }
        Ok(())
    }

    /// Walks the active segment from its last commit point, feeding offsets for newly committed
    /// records (the same commit rule as recovery; never modifies anything).
    ///
    /// A walk stops at the first record that is not there yet, which is where a live writer's
    /// log ends, or at a damaged one. The two differ in what follows: the writer writes one batch
    /// at a time, each only once the one before it is durable, so only the last batch can be
    /// incomplete, and a stop followed by committed batches is damage (the verdict of
    /// [`classify_tail`], as the writer's recovery decides). Such a stop is read a second time
    /// before it is reported: one read may see a batch as it was before its write and later
    /// batches already written, but a read started after that one sees the batch written.
    ///
    /// # Errors
    /// An I/O error; [`LogError::Corrupt`] for a damaged record followed by committed batches
    /// or a committed record that is no valid event (the batches before it are fed first).
    fn scan_active(&self, t: &mut Tail) -> Result<(), FollowerError> {
        let mut scratch = std::mem::take(&mut t.scratch);
        let r = self.scan_active_into(t, &mut scratch);
        t.scratch = scratch;
        r
    }

    /// [`Follower::scan_active`], reading into `scratch`.
    fn scan_active_into(&self, t: &mut Tail, scratch: &mut Vec<u8>) -> Result<(), FollowerError> {
        let Some(seg) = t.segments.last().cloned() else { return Ok(()) };
        if let Some(known) = known_damage(&seg, t) {
            return Err(known);
        }
        let mut window = FIRST_WINDOW;
        let poll_start = t.active_end;
        // Byte offset of a damaged record seen once, to be read again before it is reported.
        let mut suspect: Option<u64> = None;
        loop {
            let start = t.active_end;
            if scratch.len() < window {
                scratch.resize(window, 0);
            }
            let n = seg.read_at(&mut scratch[..window], start).map_err(|source| LogError::Io { path: seg.path.clone(), source })?;
            let buf = &scratch[..n];
            let mut w = walk(buf, 0);
            // The segment's tables were sized when the follower opened it; a writer restarted
            // with a larger `segment.size` grows the active file past them (review: the
            // follower's thread panicked and it served a frozen prefix, healthy as far as any
            // check could tell). Reopen it with tables for its new length and read it again.
            let room = seg.max_records().saturating_sub((t.next - seg.base) as usize);
            if w.offsets.len() > room {
                self.regrow(t)?;
                return self.scan_active_into(t, scratch);
            }
            // A committed record that is no valid event ends what can be served: only the
            // batches committed before it are fed, from a walk that ends at it.
            let invalid = w
                .offsets
                .iter()
                .enumerate()
                .find_map(|(k, &off)| EventRef::from_bytes(payload_at(buf, off as usize)).err().map(|e| (off as usize, t.next + k as u64, e)));
            if let Some((o, _, _)) = invalid {
                w = walk(&buf[..o], 0);
            }
            take_committed(&seg, t, buf, start, &w);
            if let Some((o, pos, e)) = invalid {
                t.stopped_at = start + o as u64;
                return Err(LogError::Corrupt {
                    path: seg.path.clone(),
                    offset: t.stopped_at,
                    detail: format!(
                        "committed record at position {pos} is not a valid event: {e}; this follower serves positions up to {} and cannot read past it",
                        t.next - 1
                    ),
                });
            }
            if let Some(wider) = wider_window(&seg, t, buf, window, &w)? {
                window = wider;
                continue;
            }
            self.end_regrow(&seg, t);
            // A stop inside the window: the end of what the writer has written so far, or
            // damage (review: a damaged record in the middle of the active segment was
            // taken for the end of the log, and the follower served the prefix before it
            // as all there was).
            if let TailVerdict::Corrupt { stop, .. } = classify_tail(buf, &w, t.next) {
                if suspect != Some(t.stopped_at) {
                    suspect = Some(t.stopped_at);
                    continue;
                }
                return Err(confirm_damage(&seg, t, stop));
            }
            return self.check_rest(&seg, t, poll_start);
        }
    }

    /// Once a regrown active segment's new tables hold everything the old ones did, swaps them
    /// in for readers (see [`Tail::regrown`]).
    fn end_regrow(&self, seg: &Arc<Segment>, t: &mut Tail) {
        let Some(served) = t.regrown else { return };
        if t.next >= served {
            let index = t.index.as_ref().expect("an active segment has an index").shared().clone();
            self.shared.replace_last(seg.clone(), SegIndex::Active(index));
            t.regrown = None;
            tracing::info!(segment = %seg.path.display(), records = seg.max_records(), "the active segment grew past this follower's tables; reopened it with larger ones");
        }
    }

    /// After a poll whose window ended in zeros: decides whether what lies past the window
    /// needs a look. The window (64 KiB at first) shows a damaged record only when committed
    /// batches follow it within the window; a hole larger than that (zeroed record heads ahead
    /// of more batches, or ahead of an event of many MiB of zeros) reads as the end of the
    /// log, and the follower served the prefix before it as all there was, for good, while
    /// the writer went on (review: 128 KiB zeroed; a restarted writer refused the store). So
    /// the rest of the segment is checked whole, as the writer's open reads it: at the first
    /// poll, and when [`STUCK_POLLS`] polls in a row found nothing new while the file's
    /// modification time moved (at most every [`REST_CHECK_EVERY`]). `start` is where the
    /// committed prefix ended when this poll began.
    ///
    /// # Errors
    /// An I/O error; [`LogError::Corrupt`] when a damaged record past the window is followed
    /// by committed batches (seen in two reads, as in the window).
    fn check_rest(&self, seg: &Segment, t: &mut Tail, start: u64) -> Result<(), FollowerError> {
        let io = |source| LogError::Io { path: seg.path.clone(), source };
        let mtime = seg.file.metadata().map_err(io)?.modified().ok();
        let progressed = t.active_end > start || t.mtime.is_none();
        t.stuck_polls = if progressed || mtime == t.mtime { 0 } else { t.stuck_polls + 1 };
        t.mtime = mtime;
        let due = match t.rest_checked {
            None => true,
            Some(at) => t.stuck_polls >= STUCK_POLLS && at.elapsed() >= REST_CHECK_EVERY,
        };
        if !due {
            return Ok(());
        }
        t.rest_checked = Some(std::time::Instant::now());
        // The stop at `t.active_end`, when a damaged record there is followed by committed
        // batches in the rest of the file.
        let damaged = || -> Result<Option<Stop>, LogError> {
            // SAFETY: a read-only map of the active segment, which its writer only ever writes
            // (never truncates); bytes it changes while they are read can only make the two
            // reads below disagree, and Corrupt needs both.
            let map = unsafe { memmap2::Mmap::map(&seg.file) }.map_err(io)?;
            let rest = &map[(t.active_end as usize).min(map.len())..];
            let w = walk(rest, 0);
            // Whole batches right at the start: the writer wrote them since the window was
            // read, and the next poll takes them.
            Ok(match classify_tail(rest, &w, t.next) {
                TailVerdict::Corrupt { stop, .. } if w.committed_end == 0 => Some(stop),
                _ => None,
            })
        };
        if damaged()?.is_some() {
            if let Some(stop) = damaged()? {
                return Err(confirm_damage(seg, t, stop));
            }
        }
        Ok(())
    }

    /// Reopens the active segment with tables sized for its file as it is now, and restarts
    /// reading it from its first record into them (see [`Tail::regrown`]).
    ///
    /// # Errors
    /// The file cannot be opened, or did not grow (then the records cannot be held).
    fn regrow(&self, t: &mut Tail) -> Result<(), FollowerError> {
        let old = t.segments.last().cloned().expect("an active segment");
        let seg = Arc::new(Segment::open(old.base, old.path.clone(), &self.cfg.segment)?);
        if seg.max_records() <= old.max_records() {
            return Err(LogError::InvalidConfig {
                reason: format!("{} holds more records than its length allows ({})", old.path.display(), old.max_records()),
            });
        }
        // What the old tables served (an unfinished earlier regrow served no more than that).
        let served = t.regrown.unwrap_or(t.next);
        *t.segments.last_mut().expect("an active segment") = seg.clone();
        t.index = Some(ActiveWriter::new(seg.base, seg.max_records()));
        t.next = seg.base;
        t.active_end = HEADER_LEN as u64;
        t.regrown = Some(served);
        Ok(())
    }

    /// The data directory followed.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops polling and ends subscriptions.
    pub fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.shared.close();
        if let Some(h) = self.poller.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.shared.close();
    }
}
