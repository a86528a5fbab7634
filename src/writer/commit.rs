//! Group commit, pipelined: the stage that makes staged appends durable (docs/architecture.md
//! §4.2, docs/format.md §6.3).
//!
//! The writer judges conditions, assigns positions, feeds the index and the tips, and copies
//! the framed records into the **open batch**. Committing takes the open batch, seals it with
//! one commit marker, writes it with one O_DIRECT `pwrite` (rewriting the partial last block
//! from the buffer) and makes it durable with one `fdatasync`, then publishes the watermark and
//! answers every request in it. A large batch is handed to a committer thread
//! (`tephra-commit`), and while it writes and syncs, the writer already judges and stages the
//! next batch; a small one is committed on the writer's own thread, where a hand-over would
//! cost more (a thread wake-up) than it overlaps. Either way one batch is committed at a time,
//! in order.
//!
//! Nobody is answered before the batch holding their events (and every batch before it) is
//! durable, including conflict verdicts, which may have been judged against staged events.
//! A failed write or sync is fail-stop: that batch, everything staged after it and every later
//! append get an error; reads go on.

use super::{deliver, AppendError, AppendResult, PositionRange, ReplyTo, WriterMetrics};
use crate::log::aligned::{AlignedBuf, BLOCK};
use crate::log::record::{frame_marker, MARKER_LEN};
use crate::log::segment::{name_prepared, Segment};
use crate::read::Shared;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What a request in a batch is answered once the batch is durable.
pub(super) enum Reply {
    /// Its events were staged at these positions.
    Staged(PositionRange),
    /// A verdict reached without staging (a condition conflict, a read error, ...).
    Done(AppendResult),
}

/// A new segment still under its spare's name ([`crate::log::segment::PREPARED_NAME`]): the
/// first batch committed into it renames it once its header and records are durable
/// ([`name_prepared`]), before anyone in that batch is answered.
pub(super) struct Naming {
    /// The spare's path.
    pub(super) spare: PathBuf,
    /// The data directory.
    pub(super) dir: PathBuf,
}

/// The open batch: records staged since the committer last took one, laid out exactly as they
/// will sit in the segment file.
pub(super) struct Batch {
    /// The active segment.
    pub(super) seg: Arc<Segment>,
    /// Its file, opened with O_DIRECT.
    pub(super) file: Arc<File>,
    /// File offset of `buf[0]` (a multiple of [`BLOCK`]).
    start: u64,
    /// `[start, previous end)`: the partial last block already in the file, then the records.
    buf: AlignedBuf,
    /// Length of that partial block.
    prefix: usize,
    /// Events staged.
    events: u64,
    /// Highest position staged.
    highest: u64,
    /// Who to answer, in arrival order.
    replies: Vec<(ReplyTo, Reply)>,
    /// The segment's configured size: the file never grows past it.
    limit: u64,
    /// Set on a new segment's batches until one with events is committed.
    naming: Option<Naming>,
}

impl Batch {
    /// An empty batch that continues `seg` at byte `end`; `tail` holds the file's bytes
    /// `[end rounded down to BLOCK, end)`.
    /// `limit` is the segment's size in bytes.
    pub(super) fn new(seg: Arc<Segment>, file: Arc<File>, limit: u64, end: u64, tail: &[u8], mut buf: AlignedBuf) -> Batch {
        let start = end & !(BLOCK as u64 - 1);
        debug_assert_eq!(tail.len() as u64, end - start);
        buf.clear();
        buf.extend_from_slice(tail);
        Batch { seg, file, start, prefix: tail.len(), buf, events: 0, highest: 0, replies: Vec::new(), limit, naming: None }
    }

    /// Makes this (empty) batch continue `seg` at byte `end` instead, as [`Batch::new`] does,
    /// keeping its buffer; `naming` when `seg` is a spare still to be named.
    pub(super) fn restart(&mut self, seg: Arc<Segment>, file: Arc<File>, limit: u64, end: u64, tail: &[u8], naming: Option<Naming>) {
        debug_assert!(self.replies.is_empty() && self.events == 0);
        let buf = std::mem::replace(&mut self.buf, AlignedBuf::with_capacity(0));
        *self = Batch::new(seg, file, limit, end, tail, buf);
        self.naming = naming;
    }

    /// File offset where the next staged record goes.
    pub(super) fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Bytes of records staged.
    pub(super) fn staged_bytes(&self) -> usize {
        self.buf.len() - self.prefix
    }

    /// True when events are staged in it.
    pub(super) fn has_events(&self) -> bool {
        self.events > 0
    }

    /// Appends one request's framed records, which hold the events at positions `range`.
    pub(super) fn stage(&mut self, records: &[u8], range: PositionRange) {
        self.buf.extend_from_slice(records);
        self.events += range.count();
        self.highest = range.last.get();
    }

    /// Queues an answer.
    pub(super) fn answer(&mut self, reply: ReplyTo, what: Reply) {
        self.replies.push((reply, what));
    }
}

struct State {
    open: Batch,
    /// The committer is writing or syncing a batch it took.
    busy: bool,
    /// Why the log stopped accepting writes (fail-stop), once it did.
    failed: Option<String>,
    /// Finish what is open, then exit.
    stop: bool,
    /// A buffer the committer finished with, for the next open batch.
    spare: Option<AlignedBuf>,
}

/// The open batch shared by the writer and the committer thread.
pub(super) struct GroupCommit {
    state: Mutex<State>,
    /// Signalled when the open batch has something to answer, or at stop.
    work: Condvar,
    /// Signalled when the committer takes a batch or finishes one.
    progress: Condvar,
    /// The last commit's write + sync took longer than [`SLOW_COMMIT`] plus
    /// [`SLOW_COMMIT_PER_MIB`] per MiB it wrote: the disk is struggling right now.
    last_commit_slow: std::sync::atomic::AtomicBool,
    /// Set at shutdown: a naming that waits for room gives up (see [`GroupCommit::naming_stuck`]).
    give_up_naming: std::sync::atomic::AtomicBool,
    /// Why the batch being committed waits for its new segment's name (no room in the
    /// directory or on the disk for the rename): new appends are refused meanwhile. Apart from
    /// `state`, so the writer's check per round never waits behind the committer.
    naming_stuck: std::sync::RwLock<Option<String>>,
}

/// How long a new segment's naming waits before trying again when the rename found no room
/// (`ENOSPC`, `EDQUOT`).
const NAMING_RETRY: Duration = Duration::from_millis(100);

/// A commit (write + sync) slower than this plus [`SLOW_COMMIT_PER_MIB`] per MiB written says
/// the disk is struggling (the spare segment's zeroing then holds off).
const SLOW_COMMIT: Duration = Duration::from_millis(10);
const SLOW_COMMIT_PER_MIB: Duration = Duration::from_millis(2);

impl GroupCommit {
    /// A pipeline whose open batch is `open`.
    pub(super) fn new(open: Batch) -> Arc<GroupCommit> {
        Arc::new(GroupCommit {
            state: Mutex::new(State { open, busy: false, failed: None, stop: false, spare: None }),
            work: Condvar::new(),
            progress: Condvar::new(),
            last_commit_slow: std::sync::atomic::AtomicBool::new(false),
            give_up_naming: std::sync::atomic::AtomicBool::new(false),
            naming_stuck: std::sync::RwLock::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fail-stop reason, once a write or sync failed.
    pub(super) fn failed(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Why new appends are refused for now, while a new segment's first batch is durable but
    /// its rename finds no room (a full disk or directory): that batch, and what is staged
    /// behind it, wait for the name and are answered once it is there (the store would drop
    /// the unnamed spare, events and all, at its next start); the rename is retried every
    /// [`NAMING_RETRY`], and appends are accepted again once it succeeds (review: a failed
    /// rename stopped the writer until a restart, even once space was freed).
    pub(super) fn naming_stuck(&self) -> Option<String> {
        self.naming_stuck.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets (or, with `None`, clears) why new appends wait for a new segment's name.
    pub(super) fn set_naming_stuck(&self, reason: Option<String>) {
        *self.naming_stuck.write().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// Records the fail-stop of a batch whose write, sync or naming failed: every later batch
    /// fails with the same reason.
    fn fail(&self, reason: String) {
        self.lock().failed.get_or_insert(reason);
    }

    /// Makes a naming that waits for room give up (shutdown): its batch then fails.
    pub(super) fn give_up_naming(&self) {
        self.give_up_naming.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` on the open batch once it has room for `bytes` more bytes of records (an
    /// empty batch always has room; a full one is handed to the committer thread meanwhile).
    /// Waiting here is the writer's backpressure: while it waits it takes no new requests.
    /// The caller then has the batch committed ([`commit_or_hand_off`](Self::commit_or_hand_off)).
    pub(super) fn with_room<R>(&self, bytes: usize, max_bytes: usize, f: impl FnOnce(&mut Batch) -> R) -> R {
        let mut st = self.lock();
        while st.open.events > 0 && st.open.staged_bytes() + bytes > max_bytes && st.failed.is_none() {
            // A full batch goes to the committer thread, however small the batch limit.
            self.work.notify_one();
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        f(&mut st.open)
    }

    /// Waits until everything staged so far is durable (or failed) and answered, then runs `f`
    /// on the (empty) open batch: the writer's barrier before a rollover, a shutdown or a
    /// scan-judged condition.
    pub(super) fn quiesce<R>(&self, f: impl FnOnce(&mut Batch) -> R) -> R {
        let mut st = self.lock();
        while st.busy || !st.open.replies.is_empty() {
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        f(&mut st.open)
    }

    /// Waits until the committer has taken everything staged so far (it may still be writing
    /// or syncing it), then runs `f` on the (empty) open batch: the writer's step before a
    /// rollover moves the open batch to a new segment.
    pub(super) fn handed_over<R>(&self, f: impl FnOnce(&mut Batch) -> R) -> R {
        let mut st = self.lock();
        while !st.open.replies.is_empty() {
            self.work.notify_one();
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        f(&mut st.open)
    }

    /// True when the last commit was slow ([`SLOW_COMMIT`]).
    pub(super) fn last_commit_slow(&self) -> bool {
        self.last_commit_slow.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lets the committer finish what is open and exit.
    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.work.notify_one();
    }

    /// The retry decision of a new segment's naming: after `ENOSPC`, `EDQUOT`, `EMFILE` or
    /// `ENFILE` it says why
    /// appends are refused ([`GroupCommit::naming_stuck`]), logs it once, waits
    /// [`NAMING_RETRY`] and retries, unless shutting down; any other error is final.
    fn wait_for_room(&self, e: &std::io::Error, path: &std::path::Path, waited: &mut u32) -> bool {
        let no_room = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
        // Out of file descriptors (connections took them): wait for some to close, as for
        // room (review: the naming's directory sync failed with EMFILE and stopped the writer
        // until a restart).
        let no_files = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
        if !(no_room || no_files) || self.give_up_naming.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        if *waited == 0 {
            let freed = if no_files { "file descriptors are freed" } else { "space is freed" };
            self.set_naming_stuck(Some(format!("no room to name the new segment {}: {e}; appends are refused until {freed}", path.display())));
            tracing::warn!(segment = %path.display(), error = %e, "no room to name the new segment; its first batch waits, new appends are refused until it is named (retrying every 100 ms)");
        }
        *waited = waited.saturating_add(1);
        std::thread::sleep(NAMING_RETRY);
        true
    }

    /// The committer thread's loop: take the open batch, write and sync it, publish, answer.
    pub(super) fn run_committer(&self, shared: &Shared, metrics: &WriterMetrics) {
        loop {
            let mut st = self.lock();
            while st.open.replies.is_empty() && !st.stop {
                st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.open.replies.is_empty() {
                return;
            }
            self.commit(st, shared, metrics);
        }
    }

    /// Has the open batch committed, if it has anyone to answer. A `small` one is committed on
    /// the calling thread (the writer's) when the committer thread is idle: a hand-over would
    /// cost a thread wake-up, more than the write overlaps. Otherwise the committer thread
    /// takes it (once the batch before it is durable) and the writer goes on staging the next
    /// one into the open batch meanwhile. Committing inline behind a busy committer would keep
    /// the writer waiting for two commits with nothing staged.
    pub(super) fn commit_or_hand_off(&self, small: bool, shared: &Shared, metrics: &WriterMetrics) {
        let st = self.lock();
        if st.open.replies.is_empty() {
            return;
        }
        // A new segment's first batch goes to the committer thread: its rename may wait for
        // room, and meanwhile the writer refuses new appends instead of queueing them.
        if small && !st.busy && st.open.naming.is_none() {
            self.commit(st, shared, metrics);
        } else {
            drop(st);
            self.work.notify_one();
        }
    }

    /// Takes the open batch (`st` holds the lock) once no other batch is being committed,
    /// writes, syncs, publishes and answers it. Batches are taken one at a time and in order:
    /// a batch's write rewrites the last block of the one before it.
    fn commit(&self, mut st: MutexGuard<'_, State>, shared: &Shared, metrics: &WriterMetrics) {
        while st.busy {
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.open.replies.is_empty() {
            return;
        }
        let failed = st.failed.clone();
        if st.open.events == 0 {
            // Only verdicts: whatever they were judged against is already durable (the
            // committer finished every earlier batch before taking this one).
            let replies = std::mem::take(&mut st.open.replies);
            st.busy = true;
            drop(st);
            answer(replies, failed.as_deref());
            self.lock().busy = false;
            self.progress.notify_all();
            return;
        }
        let (mut batch, sealed) = Self::take_sealed(&mut st);
        st.busy = true;
        drop(st);
        self.progress.notify_all();
        let outcome = match &failed {
            Some(reason) => Err(reason.clone()),
            None => self.write_batch(&mut batch),
        };
        let spare = self.settle(batch, sealed, outcome, failed.is_some(), shared, metrics);
        let mut st = self.lock();
        st.busy = false;
        st.spare = spare;
        drop(st);
        self.progress.notify_all();
    }

    /// Seals the open batch (which holds events) with its commit marker and puts a new open
    /// batch in its place, continuing in its last block; returns the sealed batch and its
    /// length up to the marker (the write pads it to a block).
    fn take_sealed(st: &mut State) -> (Batch, usize) {
        let mut marker = Vec::with_capacity(MARKER_LEN);
        frame_marker(st.open.highest, &mut marker);
        st.open.buf.extend_from_slice(&marker);
        let end = st.open.end();
        let tail_at = ((end & !(BLOCK as u64 - 1)) - st.open.start) as usize;
        let spare = st.spare.take().unwrap_or_else(|| AlignedBuf::with_capacity(st.open.buf.len()));
        let next = Batch::new(st.open.seg.clone(), st.open.file.clone(), st.open.limit, end, &st.open.buf.as_slice()[tail_at..], spare);
        let batch = std::mem::replace(&mut st.open, next);
        let sealed = batch.buf.len();
        (batch, sealed)
    }

    /// Writes and syncs a sealed batch and, for a new segment's first one, names the segment
    /// (waiting for room as [`GroupCommit::wait_for_room`] decides); notes whether the commit
    /// was slow. Returns the sync's duration, or why the batch failed (the file named).
    fn write_batch(&self, batch: &mut Batch) -> Result<Duration, String> {
        let t = std::time::Instant::now();
        // A new segment's first commit writes its spare, not yet under its name.
        let shown = batch.naming.as_ref().map_or(&batch.seg.path, |n| &n.spare).display().to_string();
        let r = write_and_sync(batch).map_err(|e| format!("{shown}: {e}")).and_then(|sync_time| match batch.naming.take() {
            None => Ok(sync_time),
            Some(n) => self.name_segment(&n, &batch.seg.path).map(|()| sync_time),
        });
        let kib = (batch.buf.len() >> 10) as u32;
        self.last_commit_slow.store(t.elapsed() > SLOW_COMMIT + SLOW_COMMIT_PER_MIB * kib / 1024, std::sync::atomic::Ordering::Relaxed);
        r
    }

    /// Names a new segment (`path`) whose header and first records are durable under the
    /// spare's name, waiting while there is no room for the rename.
    fn name_segment(&self, n: &Naming, path: &std::path::Path) -> Result<(), String> {
        crate::fault::crash_point("spare_written_before_naming");
        // A test holds the naming here, to act while the segment is unnamed.
        crate::fault::pause_point("spare_written_before_naming");
        let mut waited = 0u32;
        let named = name_prepared(&n.dir, &n.spare, path, &mut |e| self.wait_for_room(e, path, &mut waited));
        if waited > 0 {
            self.set_naming_stuck(None);
            if named.is_ok() {
                tracing::info!(segment = %path.display(), waited_ms = u64::from(waited) * NAMING_RETRY.as_millis() as u64, "the new segment is named; appends are accepted again");
            }
        }
        named.map_err(|e| format!("naming the new segment {}: {e}", path.display()))?;
        crate::fault::crash_point("segment_created_before_commit");
        Ok(())
    }

    /// Settles a written batch: a durable one's buffer goes to readers (they may take it from
    /// memory from now on, before the watermark lets anyone ask), which may hand back an older
    /// one nobody reads any more; the watermark is published and the metrics fed. A failed one
    /// stops the writer (fail-stop; `already_failed` when it had stopped before this batch)
    /// and keeps its own buffer. Everyone in the batch is answered. Returns the buffer for the
    /// next open batch, if any.
    fn settle(
        &self,
        batch: Batch,
        sealed: usize,
        outcome: Result<Duration, String>,
        already_failed: bool,
        shared: &Shared,
        metrics: &WriterMetrics,
    ) -> Option<AlignedBuf> {
        let Batch { seg, start, buf, events, highest, replies, .. } = batch;
        let (failed, spare) = match outcome {
            Ok(sync_time) => {
                crate::fault::crash_point("after_fsync_before_ack");
                let spare = shared.recent().remember(seg.base, start, sealed, buf);
                shared.publish(highest);
                let mut m = metrics.inner.lock().unwrap_or_else(|e| e.into_inner());
                let _ = m.fsync_us.record((sync_time.as_micros() as u64).max(1));
                let _ = m.batch_events.record(events.max(1));
                m.commits += 1;
                (None, spare)
            }
            Err(reason) => {
                let reason = if already_failed {
                    reason
                } else {
                    tracing::error!(%reason, "writer stopped: appends are refused until restart, reads continue");
                    // What every later append is answered, too: say how to get out of it.
                    let reason = format!("{reason} (the writer has stopped; appends are refused until the server restarts)");
                    shared.fail(reason.clone());
                    self.fail(reason.clone());
                    reason
                };
                (Some(reason), Some(buf))
            }
        };
        answer(replies, failed.as_deref());
        spare
    }
}

/// Answers a finished batch: its positions, or everyone an error when it failed.
fn answer(replies: Vec<(ReplyTo, Reply)>, failed: Option<&str>) {
    deliver(replies.into_iter().map(|(to, what)| {
        let res = match (failed, what) {
            (Some(reason), _) => Err(AppendError::Stopped(reason.to_owned())),
            (None, Reply::Staged(range)) => Ok(range),
            (None, Reply::Done(res)) => res,
        };
        (to, res)
    }));
}

/// Writes a sealed batch with one `pwrite` and syncs it with one `fdatasync`; returns the
/// sync's duration.
fn write_and_sync(batch: &mut Batch) -> std::io::Result<Duration> {
    let sealed = batch.buf.len();
    // Crash harness: a marker torn mid-write keeps its head and kind byte only.
    let torn_marker = crate::fault::fires("torn_marker");
    if torn_marker {
        batch.buf.as_mut_slice()[sealed - 8..sealed].fill(0);
    }
    batch.buf.pad_to_block();
    if let Err(e) = crate::fault::io_point("commit_shortwrite") {
        // An injected short write puts the first half of the batch on disk, then fails.
        let half = batch.prefix + (sealed - batch.prefix) / 2;
        let mut part = AlignedBuf::with_capacity(batch.buf.len());
        part.extend_from_slice(&batch.buf.as_slice()[..half]);
        part.pad_to_block();
        let _ = pwrite(&batch.file, part.as_slice(), batch.start);
        return Err(e);
    }
    let n = pwrite(&batch.file, batch.buf.as_slice(), batch.start)?;
    if n < batch.buf.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {n} of {} bytes", batch.buf.len())));
    }
    if batch.start + n as u64 > batch.limit {
        // A segment size that is not a multiple of the block: the padded last block ran past
        // the end of the file. Cut the padding (zeros) off again; the sync below persists it.
        batch.file.set_len(batch.limit)?;
    }
    if torn_marker {
        let _ = fdatasync(&batch.file);
        crate::fault::abort_at("torn_marker");
    }
    crate::fault::crash_point("commit_before_fsync");
    crate::fault::io_point("commit_fsync")?;
    let t = std::time::Instant::now();
    fdatasync(&batch.file)?;
    Ok(t.elapsed())
}

// The commit's write and sync are plain blocking system calls on the committer thread, not
// io_uring ones: through io_uring both are punted to an io-wq kernel worker (ext4 does not
// complete an O_DIRECT write without blocking, and fsync always blocks), two extra thread
// hand-offs per commit, each a wake-up that waits for a CPU.

/// `pwrite(2)` of the aligned `buf` at `pos` (O_DIRECT), retried on EINTR.
fn pwrite(file: &File, buf: &[u8], pos: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.write_at(buf, pos) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// `fdatasync(2)`, retried on EINTR.
fn fdatasync(file: &File) -> std::io::Result<()> {
    loop {
        match file.sync_data() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}
