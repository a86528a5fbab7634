//! The follower: a read-only view of a live writer's data directory from another process on the
//! same host (seed "Running a second process against a live store").
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

use crate::log::header::{HeaderError, SegmentHeader, HEADER_LEN};
use crate::log::record::{walk, LENGTH_MASK};
use crate::log::segment::{list_segments, Segment, SegmentConfig};
use crate::log::LogError;
use crate::event::EventRef;
use crate::index::active::ActiveWriter;
use crate::index::sealed::SealedIndex;
use crate::index::SegIndex;
use crate::log::record::RECORD_HEAD;
use crate::read::{Shared, Snapshot};
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
}

/// A read-only follower of a data directory. Dropping it stops polling and ends subscriptions.
pub struct Follower {
    dir: PathBuf,
    cfg: FollowerConfig,
    shared: Arc<Shared>,
    tail: Mutex<Tail>,
    stop: Arc<AtomicBool>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
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
    /// # Errors
    /// [`LogError::Io`] when the directory cannot be read (it does not exist included: a
    /// follower creates nothing), or a header or contiguity error in the committed chain.
    pub fn open(dir: impl AsRef<Path>, cfg: FollowerConfig) -> Result<Arc<Follower>, FollowerError> {
        let dir = dir.as_ref().to_path_buf();
        let f = Arc::new(Follower {
            shared: Arc::new(Shared::new(Snapshot::new(Vec::new(), Vec::new()), 0, cfg.scan_bias)),
            tail: Mutex::new(Tail { segments: Vec::new(), active_end: HEADER_LEN as u64, next: 1, index: None, regrown: None, awaiting_first: false }),
            stop: Arc::new(AtomicBool::new(false)),
            poller: Mutex::new(None),
            dir,
            cfg,
        });
        f.refresh()?;
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
                let mut failures = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(every);
                    let Some(f) = me.upgrade() else { return };
                    match f.refresh() {
                        Ok(_) => {
                            failures = 0;
                            f.shared.set_refresh_failures(0);
                        }
                        Err(e) => {
                            failures += 1;
                            f.shared.set_refresh_failures(failures as u64);
                            if failures == 1 || failures % 100 == 0 {
                                tracing::warn!(error = %e, failures, "follower refresh failed; retrying");
                            }
                        }
                    }
                }
            })
            .expect("follower thread");
        *self.poller.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    }

    /// Picks up newly committed events and new segments; returns the visible head.
    ///
    /// # Errors
    /// I/O errors, or a chain that breaks contiguity (then nothing new is published).
    pub fn refresh(&self) -> Result<u64, FollowerError> {
        let mut t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
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
            if let Some(_last) = t.segments.last() {
                // Drain the old active segment before moving on: its tail is final now.
                self.scan_active(&mut t)?;
                if base != t.next {
                    // A new segment starts where the old one ends; until the old one's last
                    // batch is visible to us, wait.
                    break;
                }
            } else if base != 1 {
                return Err(LogError::NonContiguous { path, found: base, expected: 1 });
            }
            // One with a later segment after it is sealed: tables for its length, not for the
            // configured size (see `Segment::open_sealed`).
            let seg = Arc::new(if Some(base) == last_listed { Segment::open(base, path, &self.cfg.segment)? } else { Segment::open_by_length(base, path, &self.cfg.segment)? });
            // The old active segment is final: seal its index (in memory; the writer persists
            // the file, a follower writes nothing).
            let sealed = t.index.take().map(|w| {
                let (b, n) = (w.shared().base(), w.absorbed() as u64);
                // Never persisted, so no fingerprint is needed to tie it to the segment.
                SegIndex::Sealed(Arc::new(SealedIndex::load(w.encode_sealed(0), b, n, 0).expect("a freshly encoded index validates")))
            });
            let index = ActiveWriter::new(base, seg.max_records());
            let shared_index = SegIndex::Active(index.shared().clone());
            t.index = Some(index);
            t.segments.push(seg.clone());
            t.active_end = HEADER_LEN as u64;
            self.shared.roll(sealed, seg.clone(), shared_index);
            if std::mem::take(&mut t.awaiting_first) {
                tracing::info!(segment = %seg.path.display(), "the writer created the first segment; following it");
            }
        }
        if !t.segments.is_empty() {
            self.scan_active(&mut t)?;
        }
        let head = t.next - 1;
        if head > self.shared.watermark() {
            self.shared.publish(head);
        }
        Ok(head)
    }

    /// Walks the active segment from its last commit point, feeding offsets for newly committed
    /// records (the same commit rule as recovery; never modifies anything).
    fn scan_active(&self, t: &mut Tail) -> Result<(), FollowerError> {
        let Some(seg) = t.segments.last().cloned() else { return Ok(()) };
        let mut window = 4usize << 20;
        loop {
            let start = t.active_end;
            let mut buf = vec![0u8; window];
            let n = seg.read_at(&mut buf, start).map_err(|source| LogError::Io { path: seg.path.clone(), source })?;
            buf.truncate(n);
            let w = walk(&buf, 0);
            // The segment's tables were sized when the follower opened it; a writer restarted
            // with a larger `segment.size` grows the active file past them (review: the
            // follower's thread panicked and it served a frozen prefix, healthy as far as any
            // check could tell). Reopen it with tables for its new length and read it again.
            let room = seg.max_records().saturating_sub((t.next - seg.base) as usize);
            if w.offsets.len() > room {
                self.regrow(t)?;
                return self.scan_active(t);
            }
            for (k, off) in w.offsets.iter().enumerate() {
                let o = *off as usize;
                let len = (u32::from_le_bytes(buf[o..o + 4].try_into().unwrap()) & LENGTH_MASK) as usize;
                let pos = t.next + k as u64;
                let ev = EventRef::from_bytes(&buf[o + RECORD_HEAD..o + RECORD_HEAD + len]).map_err(|e| LogError::Corrupt {
                    path: seg.path.clone(),
                    offset: start + *off as u64,
                    detail: format!("committed record at position {pos} is not a valid event: {e}"),
                })?;
                t.index.as_mut().expect("an active segment has an index").absorb(pos, &ev);
                seg.offsets.set((t.next - seg.base) as usize + k, (start + *off as u64) as u32);
            }
            t.next += w.offsets.len() as u64;
            t.active_end = start + w.committed_end as u64;
            // Keep reading while the walk ran to the end of a full window (more may follow),
            // growing the window if one record did not fit.
            let ran_out = n == window && w.stop_offset + crate::log::record::RECORD_HEAD >= n.saturating_sub(1);
            let record_too_big = matches!(w.stop, crate::log::record::Stop::PastEnd) && n == window;
            if w.committed_end == 0 && (ran_out || record_too_big) {
                // Not one whole batch in the window (a group commit holds up to
                // `writer.max_batch_bytes`, 8 MiB by default): read twice as much, and at least
                // the record that did not fit (it used to stay the same, and the walk was
                // retried for ever with the tail held, at a batch over 4 MiB).
                let len = if record_too_big { u32::from_le_bytes(buf[w.stop_offset..w.stop_offset + 4].try_into().unwrap_or([0; 4])) & LENGTH_MASK } else { 0 };
                window = (window * 2).max(w.stop_offset + crate::log::record::RECORD_HEAD + len as usize + 64);
                continue;
            }
            if !(ran_out || record_too_big) {
                if let Some(served) = t.regrown {
                    if t.next >= served {
                        // The new tables hold everything the old ones did: swap them in.
                        let index = t.index.as_ref().expect("an active segment has an index").shared().clone();
                        self.shared.replace_last(seg.clone(), SegIndex::Active(index));
                        t.regrown = None;
                        tracing::info!(segment = %seg.path.display(), records = seg.max_records(), "the active segment grew past this follower's tables; reopened it with larger ones");
                    }
                }
                return Ok(());
            }
        }
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
            return Err(LogError::InvalidConfig { reason: format!("{} holds more records than its length allows ({})", old.path.display(), old.max_records()) });
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
