//! The embedded store: open a data directory, get cloneable handles, append, read, subscribe.
//!
//! [`Store::open`] recovers the log (one of three outcomes, returned as a value), takes the
//! `LOCK`, and starts the writer on a thread of its own. [`StoreHandle`]s are
//! `Clone + Send` and usable from any thread: `append` blocks until the batch is durable (or
//! the bounded queue has room), reads run on the caller's thread, pinned to the watermark.
//! See docs/architecture.md §4.

use crate::event::Event;
use crate::index::active::ActiveWriter;
use crate::index::SegIndex;
use crate::log::lock::DirLock;
use crate::log::segment::SegmentConfig;
use crate::log::{open_log, LogError, OpenOutcome, WalkedSegment};
use crate::model::{AppendCondition, Position, Query, QueryMatcher};
use crate::read::{Reads, Shared, Snapshot, Subscription};
use crate::writer::{AppendError, AppendResult, PreparedAppend, ReplyTo, Request, Writer, WriterConfig, WriterMetrics, WriterMsg};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The read planner's single dial (`read.scan_bias`, default 4): use an index only when the
/// range is at least this many times the estimated result. It changes speed, never results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadConfig {
    /// Planner bias; 0 and 1 always prefer an index, `u32::MAX` always scans.
    pub scan_bias: u32,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig { scan_bias: 4 }
    }
}

/// Everything [`Store::open`] needs.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Segment geometry (no default: choose a size).
    pub segment: SegmentConfig,
    /// Writer settings.
    pub writer: WriterConfig,
    /// Read settings.
    pub read: ReadConfig,
}

impl StoreConfig {
    /// A configuration with `segment` and default writer and read settings.
    pub fn new(segment: SegmentConfig) -> StoreConfig {
        StoreConfig { segment, writer: WriterConfig::default(), read: ReadConfig::default() }
    }
}

/// Why a store did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The log refused to open (lock, corruption, configuration, I/O).
    #[error(transparent)]
    Log(#[from] LogError),
    /// The writer's thread could not start.
    #[error("cannot start the writer: {0}")]
    Runtime(std::io::Error),
}

/// A point-in-time view of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreStats {
    /// The head: the last durable position, the watermark (also the event count).
    pub event_count: u64,
    /// Number of segment files.
    pub segment_count: u64,
}

/// An open store. Dropping it (or [`Store::shutdown`]) finishes queued appends, stops the
/// writer and releases the lock.
pub struct Store {
    handle: StoreHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    outcome: OpenOutcome,
    lock: Option<DirLock>,
    done: Option<flume::Receiver<()>>,
}

/// The writer of a store opened with [`Store::open_parts`], to be run on a thread of its own
/// ([`WriterTask::spawn`]) or an executor.
pub struct WriterTask {
    init: WriterInit,
    rx: flume::Receiver<WriterMsg>,
    done: flume::Sender<()>,
}

/// What the writer is built from, on the thread that runs it.
struct WriterInit {
    dir: PathBuf,
    segment: SegmentConfig,
    writer: WriterConfig,
    shared: Arc<Shared>,
    active: Arc<crate::log::segment::Segment>,
    active_end: u64,
    next: u64,
    index: ActiveWriter,
    fingerprint: crate::log::segment::Fingerprint,
    metrics: Arc<WriterMetrics>,
    /// The active segment, opened for writing (see [`Store::open_parts`]).
    opened_active: (Arc<std::fs::File>, Vec<u8>),
}

impl WriterTask {
    /// Runs the group-commit loop until the store shuts down.
    pub async fn run(self) {
        let i = self.init;
        Writer::new(i.dir, i.segment, i.writer, i.shared, i.active, i.active_end, i.next, i.index, i.fingerprint, i.metrics)
            .run(self.rx, i.opened_active)
            .await;
        let _ = self.done.send(());
    }

    /// Runs the writer on a thread of its own (`tephra-writer`), parked in the queue's
    /// receive between rounds. It needs nothing from an executor: its waits are the queue, the
    /// commit pipeline's condition variables and blocking file I/O, and a parked thread wakes
    /// with one futex call (an executor's sleep costs a `membarrier` and a ring wake-up).
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("tephra-writer".into()).spawn(move || futures_lite::future::block_on(self.run()))
    }
}

#[cfg(test)]
impl WriterTask {
    /// The writer and its active segment opened for writing, unstarted: for the writer's unit
    /// tests, which drive its steps one by one.
    pub(crate) fn into_writer(self) -> (Writer, (Arc<std::fs::File>, Vec<u8>)) {
        let i = self.init;
        (Writer::new(i.dir, i.segment, i.writer, i.shared, i.active, i.active_end, i.next, i.index, i.fingerprint, i.metrics), i.opened_active)
    }
}

/// The indexes the store's open finds or rebuilds, segment by segment, as the log is walked.
#[derive(Default)]
struct FoundIndexes {
    /// The sealed segments' indexes so far, in order.
    indexes: Vec<SegIndex>,
    /// The active segment's index and fingerprint, once it is walked (last).
    active_index: Option<ActiveWriter>,
    active_fingerprint: Option<crate::log::segment::Fingerprint>,
    /// Sealed indexes rebuilt because their files were missing or unusable: how many, the
    /// first one's segment and reason, and the time spent. Said in one line once the log is
    /// open (review: a directory the reference wrote, 786 segments, gave 786 lines).
    rebuilt: Rebuilt,
    /// Rebuilt sealed indexes, their files to be written once the open has succeeded.
    to_write: Vec<Arc<crate::index::sealed::SealedIndex>>,
}

/// How many sealed indexes the open rebuilt, the first one's segment and reason, and the time
/// spent.
type Rebuilt = (u64, Option<(PathBuf, String)>, std::time::Duration);

impl FoundIndexes {
    /// Takes one walked segment's index: a sealed segment's from its index file when that is
    /// usable, else (and for the active segment) rebuilt from the log.
    ///
    /// # Errors
    /// [`LogError::Corrupt`] for a committed record that is no valid event.
    fn take(&mut self, dir: &Path, w: WalkedSegment<'_>) -> Result<(), LogError> {
        let base = w.segment.base;
        let count = w.offsets.len() as u64;
        let fingerprint = w.fingerprint();
        if !w.active {
            match crate::index::load_index_file(dir, base, count, fingerprint.value()) {
                Ok(ix) => {
                    self.indexes.push(SegIndex::Sealed(Arc::new(ix)));
                    return Ok(());
                }
                Err(why) => {
                    tracing::debug!(segment = %w.segment.path.display(), %why, "rebuilding the sealed index from the log");
                    self.rebuilt.0 += 1;
                    self.rebuilt.1.get_or_insert_with(|| (w.segment.path.clone(), why));
                }
            }
        }
        let started = std::time::Instant::now();
        // Name the segment file and the record's byte offset, like every other refusal.
        let ix = crate::index::rebuild(base, w.segment.max_records(), w.payloads()).map_err(|bad| LogError::Corrupt {
            path: w.segment.path.clone(),
            offset: w.offsets[bad.at] as u64,
            detail: format!("committed record at position {} is not a valid event: {}", base + bad.at as u64, bad.error),
        })?;
        if w.active {
            self.active_index = Some(ix);
            self.active_fingerprint = Some(fingerprint);
        } else {
            let sealed = Arc::new(ix.to_sealed(fingerprint.value()));
            // Its file is written once the whole store is accepted: a refused open writes
            // nothing (review).
            self.to_write.push(sealed.clone());
            self.indexes.push(SegIndex::Sealed(sealed));
            self.rebuilt.2 += started.elapsed();
        }
        Ok(())
    }
}

/// Writes the files of the sealed indexes the open rebuilt and says so in one line (a failed
/// write is said, not fatal: the next start rebuilds that index again). Index files are ours
/// alone: a directory another server wrote (the reference) has none for its segments. Each
/// rebuilt one is written, so the next start loads it.
fn write_rebuilt(dir: &Path, to_write: &[Arc<crate::index::sealed::SealedIndex>], rebuilt: Rebuilt) {
    let mut unwritten: (u64, Option<std::io::Error>) = (0, None);
    for ix in to_write {
        if let Err(e) = crate::index::write_index_file(dir, ix.base(), ix.bytes()) {
            unwritten.0 += 1;
            unwritten.1.get_or_insert(e);
        }
    }
    let (n, Some((first, why)), took) = rebuilt else { return };
    match unwritten {
        (0, _) => {
            tracing::info!(segments = n, first = %first.display(), first_reason = %why, took_ms = took.as_millis() as u64, "rebuilt sealed indexes from the log (their files were missing or unusable; written now for the next start)")
        }
        (failed, e) => tracing::warn!(
            segments = n,
            first = %first.display(),
            first_reason = %why,
            took_ms = took.as_millis() as u64,
            not_written = failed,
            error = %e.map(|e| e.to_string()).unwrap_or_default(),
            "rebuilt sealed indexes from the log (their files were missing or unusable); {failed} could not be written, so the next start rebuilds them again (check {})",
            dir.join(crate::index::INDEX_DIR).display()
        ),
    }
}

/// A cloneable, `Send` handle on an open store.
#[derive(Clone)]
pub struct StoreHandle {
    /// `None` for a read-only handle (a follower).
    tx: Option<flume::Sender<WriterMsg>>,
    shared: Arc<Shared>,
    segment: SegmentConfig,
    metrics: Arc<WriterMetrics>,
    dir: PathBuf,
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// [`OpenError::Log`] when recovery refuses (corruption with the file and offset, a held
    /// lock naming the holder's pid, an invalid configuration), [`OpenError::Runtime`] when the
    /// writer's thread cannot start.
    pub fn open(dir: impl AsRef<Path>, cfg: StoreConfig) -> Result<Store, OpenError> {
        let (mut store, task) = Store::open_parts(dir, cfg)?;
        let thread = task.spawn().map_err(OpenError::Runtime)?;
        store.thread = Some(thread);
        Ok(store)
    }

    /// Recovers the store like [`Store::open`] but hands back the writer as a task for the
    /// caller to start ([`WriterTask::spawn`], a plain thread, as the server does, or an
    /// executor). Appends wait in the queue until the task runs; [`Store::shutdown`] waits for
    /// the task to finish.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_parts(dir: impl AsRef<Path>, cfg: StoreConfig) -> Result<(Store, WriterTask), OpenError> {
        let dir = dir.as_ref().to_path_buf();
        let mut found = FoundIndexes::default();
        let mut rec = open_log(&dir, &cfg.segment, |w| found.take(&dir, w))?;
        let FoundIndexes { mut indexes, active_index, active_fingerprint, rebuilt, to_write } = found;
        let active_index = active_index.expect("open_log walks the active segment last");
        indexes.push(SegIndex::Active(active_index.shared().clone()));
        let head = rec.next_position - 1;
        let shared = Arc::new(Shared::new(Snapshot::new(rec.segments.clone(), indexes), head, cfg.read.scan_bias));
        let metrics = Arc::new(WriterMetrics::default());
        let active = rec.segments.last().expect("open_log returns at least one segment").clone();
        // A store whose active segment cannot be written (permissions, an immutable file, a
        // read-only mount) refuses to open, as the reference does, rather than open and refuse
        // every append (review: it started, passed the healthcheck, and failed each append).
        let opened_active = Writer::open_active(&active, rec.active_end).map_err(|e| LogError::Io {
            path: active.path.clone(),
            source: std::io::Error::new(e.kind(), format!("cannot open the active segment for writing: {e}")),
        })?;
        // Every check that can refuse the open is behind us: remove never-written trailing
        // segments, zero a rolled-back tail, and write the rebuilt index files (a failed
        // index write is said, not fatal: the next start rebuilds that index again).
        rec.apply()?;
        write_rebuilt(&dir, &to_write, rebuilt);
        let (tx, rx) = flume::bounded(cfg.writer.queue_capacity.max(1));
        let (done_tx, done_rx) = flume::bounded(1);
        let task = WriterTask {
            init: WriterInit {
                dir: dir.clone(),
                segment: cfg.segment,
                writer: cfg.writer.clone(),
                shared: shared.clone(),
                active,
                active_end: rec.active_end,
                next: rec.next_position,
                index: active_index,
                fingerprint: active_fingerprint.unwrap_or_default(),
                metrics: metrics.clone(),
                opened_active,
            },
            rx,
            done: done_tx,
        };
        let store = Store {
            handle: StoreHandle { tx: Some(tx), shared, segment: cfg.segment, metrics, dir },
            thread: None,
            outcome: rec.outcome,
            lock: Some(rec.lock),
            done: Some(done_rx),
        };
        Ok((store, task))
    }

    /// How recovery went: clean, or a torn tail rolled back (with its byte and position range).
    pub fn open_outcome(&self) -> &OpenOutcome {
        &self.outcome
    }

    /// A new handle.
    pub fn handle(&self) -> StoreHandle {
        self.handle.clone()
    }

    /// Finishes every append queued so far, stops the writer and releases the lock.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(done) = self.done.take() {
            let (ack, acked) = flume::bounded(1);
            if self.handle.tx.as_ref().is_some_and(|tx| tx.send(WriterMsg::Shutdown(ack)).is_ok()) {
                let _ = acked.recv();
            }
            let _ = done.recv();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.lock.take();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop();
    }
}

impl StoreHandle {
    pub(crate) fn read_only(shared: Arc<Shared>, segment: SegmentConfig, dir: PathBuf) -> StoreHandle {
        StoreHandle { tx: None, shared, segment, metrics: Arc::new(WriterMetrics::default()), dir }
    }

    fn writer(&self) -> Result<&flume::Sender<WriterMsg>, AppendError> {
        self.tx.as_ref().ok_or(AppendError::ReadOnly)
    }

    /// True for a follower's read-only handle.
    pub fn is_read_only(&self) -> bool {
        self.tx.is_none()
    }

    /// Appends `events` atomically, guarded by `condition`; blocks until durable.
    ///
    /// # Errors
    /// Any [`AppendError`]: a conflict, `after` beyond the tip, an empty or oversized batch, a
    /// stopped writer (fail-stop), a rollover to retry, a new segment waiting for its name, or
    /// shutdown.
    pub fn append(&self, events: Vec<Event>, condition: Option<AppendCondition>) -> AppendResult {
        let append = PreparedAppend::new(&events, condition, &self.segment)?;
        let (tx, rx) = flume::bounded(1);
        self.writer()?.send(WriterMsg::Append(Request { append, reply: ReplyTo::Oneshot(tx) })).map_err(|_| AppendError::Shutdown)?;
        rx.recv().map_err(|_| AppendError::Shutdown)?
    }

    /// Like [`StoreHandle::append`], awaiting on any executor instead of blocking.
    ///
    /// # Errors
    /// As [`StoreHandle::append`].
    pub async fn append_async(&self, events: Vec<Event>, condition: Option<AppendCondition>) -> AppendResult {
        let append = PreparedAppend::new(&events, condition, &self.segment)?;
        let (tx, rx) = flume::bounded(1);
        self.writer()?.send_async(WriterMsg::Append(Request { append, reply: ReplyTo::Oneshot(tx) })).await.map_err(|_| AppendError::Shutdown)?;
        rx.recv_async().await.map_err(|_| AppendError::Shutdown)?
    }

    /// Queues an already-framed append whose result goes to `reply` (the server's path);
    /// waits while the queue is full.
    ///
    /// # Errors
    /// [`AppendError::Shutdown`] when the writer is gone.
    pub async fn submit(&self, append: PreparedAppend, reply: ReplyTo) -> Result<(), AppendError> {
        self.writer()?.send_async(WriterMsg::Append(Request { append, reply })).await.map_err(|_| AppendError::Shutdown)
    }

    /// The segment geometry (needed to frame appends).
    pub fn segment_config(&self) -> &SegmentConfig {
        &self.segment
    }

    /// Forward read of matches with position > `after`, at most `limit`.
    pub fn read(&self, query: Query, after: Position, limit: Option<u64>) -> Reads {
        self.read_prepared(Arc::new(QueryMatcher::new(query)), after, limit)
    }

    /// Backward read of matches with position < `before` (`Position::MAX` = from the head).
    pub fn read_back(&self, query: Query, before: Position, limit: Option<u64>) -> Reads {
        self.read_back_prepared(Arc::new(QueryMatcher::new(query)), before, limit)
    }

    /// A subscription delivering matches after `after`, then live ones.
    pub fn subscribe(&self, query: Query, after: Position) -> Subscription {
        self.subscribe_prepared(Arc::new(QueryMatcher::new(query)), after)
    }

    /// [`read`](Self::read) of a query already prepared, where preparing it (in proportion
    /// to its items) was done elsewhere.
    pub fn read_prepared(&self, query: Arc<QueryMatcher>, after: Position, limit: Option<u64>) -> Reads {
        Reads::forward(&self.shared, query, after, limit)
    }

    /// [`read_back`](Self::read_back) of a query already prepared.
    pub fn read_back_prepared(&self, query: Arc<QueryMatcher>, before: Position, limit: Option<u64>) -> Reads {
        Reads::backward(&self.shared, query, before, limit)
    }

    /// [`subscribe`](Self::subscribe) to a query already prepared.
    pub fn subscribe_prepared(&self, query: Arc<QueryMatcher>, after: Position) -> Subscription {
        Subscription::new(self.shared.clone(), query, after)
    }

    /// The head: the last durable position (the watermark readers are pinned to).
    pub fn head(&self) -> Position {
        Position(self.shared.watermark())
    }

    /// Event and segment counts.
    pub fn stats(&self) -> StoreStats {
        StoreStats { event_count: self.shared.watermark(), segment_count: self.shared.segment_count() as u64 }
    }

    /// Why appends are refused (fail-stop after an I/O error), if they are.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure()
    }

    /// On a follower's handle, its failed refreshes in a row (it serves what it had meanwhile);
    /// 0 while it follows, and always on a writer's handle.
    pub fn refresh_failures(&self) -> u64 {
        self.shared.refresh_failures()
    }

    /// Writer metrics (fsync latency, batch sizes, conflicts).
    pub fn metrics(&self) -> &WriterMetrics {
        &self.metrics
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True once the store shut down.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }
}
