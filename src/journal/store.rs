//! The journal command log on disk: segment files under `journals/` in the data directory,
//! written with the event log's framing, one commit marker per group commit, O_DIRECT writes
//! and fdatasync, and recovered by the event log's walk (torn tails rolled back, damage
//! followed by committed batches refused).
//!
//! Runs on the sequencer's thread; readers on other threads read records through the shared
//! segment handles ([`Segments`]). Source: docs/journals.md §3-§4.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::log::aligned::{AlignedBuf, BLOCK};
use crate::log::record::{data_head, find_marker, frame_control, frame_marker, read_record, Record, LENGTH_MASK, MARKER_LEN, RECORD_HEAD};
use crate::log::segment::{create_segment, sync_dir, Segment, SegmentConfig};
use crate::log::LogError;
use crate::log::{open_log_covered, OpenOutcome};

use super::checkpoint::{self, Checkpoint, CheckpointError};
use super::held::Loc;

/// The directory, under the data directory, that holds the journal command log.
pub const JOURNALS_DIR: &str = "journals";

/// Kind byte of the control record an `ordered` commit writes right before its commit marker,
/// after the batch's records are durable: "the marker that follows proves its batch". The
/// event log's walk skips it as a control record that commits nothing (docs/journals.md §3).
pub const ORDERED_MARK: u8 = 0x10;

/// The checkpoint file in the journals directory (docs/journals.md §4.4).
pub const CHECKPOINT_FILE: &str = "checkpoint";

/// Where a checkpoint is written before it is renamed over [`CHECKPOINT_FILE`].
const CHECKPOINT_TMP: &str = "checkpoint.tmp";

/// Bytes of the [`ORDERED_MARK`] control record: its head and one kind byte.
const ORDERED_MARK_LEN: usize = RECORD_HEAD + 1;

/// Kind byte of the control record a rollover writes last into the segment it leaves, after
/// the new segment exists, with the new segment's base position (u64 LE): "a successor holds
/// what follows". A log whose last segment is sealed lost its newest file (docs/journals.md §4.1).
pub const SEALED: u8 = 0x11;

/// Bytes of the seal batch: the [`SEALED`] control record (head, kind, base) and its marker.
const SEAL_BATCH_LEN: usize = RECORD_HEAD + 9 + MARKER_LEN;

/// Why the command log failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Opening or recovering the log failed (see [`LogError`]).
    #[error("journal log: {0}")]
    Log(#[from] LogError),
    /// A committed command did not decode: the log holds bytes this server did not write.
    #[error("journal log: command at position {position} in {}: {source}", segment.display())]
    Command {
        /// The segment file.
        segment: PathBuf,
        /// The command's position in the log.
        position: u64,
        /// What was wrong.
        source: super::command::CommandError,
    },
    /// A write or sync of the command log failed: the log stopped (fail-stop) and serves
    /// reads only until the server restarts, since the kernel may have dropped the pages.
    #[error("journal log stopped after a failed {what} of {}: {source}", path.display())]
    Stopped {
        /// `write` or `fdatasync`.
        what: &'static str,
        /// The segment file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The checkpoint file is damaged or inconsistent: the server refuses to start rather
    /// than replay a log whose early segments may be gone.
    #[error("journal checkpoint {}: {source}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What was wrong.
        source: CheckpointError,
    },
    /// Reading, writing or syncing the checkpoint, or deleting a segment, failed.
    #[error("journal checkpoint: {what} {}: {source}", path.display())]
    CheckpointIo {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// One command is larger than a segment can hold.
    #[error("journal command of {len} bytes does not fit a {segment_size}-byte segment")]
    TooLarge {
        /// The command's size.
        len: usize,
        /// The segment size.
        segment_size: u64,
    },
}

/// The read handles of every segment of the command log, shared with readers.
#[derive(Default)]
pub struct Segments {
    by_base: RwLock<BTreeMap<u64, Arc<Segment>>>,
}

impl Segments {
    /// Reads the record at `loc`.
    ///
    /// # Errors
    /// The I/O error of `pread`, or `UnexpectedEof` when the segment is gone or short.
    pub fn read(&self, loc: Loc) -> std::io::Result<Vec<u8>> {
        let seg = self.by_base.read().unwrap().get(&loc.segment).cloned();
        let Some(seg) = seg else {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("journal segment {} is gone", loc.segment)));
        };
        let mut buf = vec![0u8; loc.len as usize];
        if seg.read_at(&mut buf, loc.offset)? < buf.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "journal record past its segment's end"));
        }
        Ok(buf)
    }

    fn insert(&self, seg: Arc<Segment>) {
        self.by_base.write().unwrap().insert(seg.base, seg);
    }

    /// How many segment files the log has.
    pub fn len(&self) -> usize {
        self.by_base.read().unwrap().len()
    }

    /// Whether the log has no segment file (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The base positions of every segment, ascending.
    pub fn bases(&self) -> Vec<u64> {
        self.by_base.read().unwrap().keys().copied().collect()
    }

    fn remove(&self, base: u64) -> Option<Arc<Segment>> {
        self.by_base.write().unwrap().remove(&base)
    }
}

/// One group commit handed out by [`JournalStore::begin_commit`], made durable by
/// [`Commit::run`] on any thread: its blocks written with O_DIRECT at their place in the
/// segment and synced (under `ordered`: the records, a sync, then the commit marker, a sync).
pub struct Commit {
    file: Arc<File>,
    path: PathBuf,
    /// File offset of the first block.
    start: u64,
    /// Under `ordered`: the records without their marker, padded to blocks.
    records: Option<AlignedBuf>,
    /// The records and their marker, padded to blocks.
    full: AlignedBuf,
}

impl Commit {
    /// Writes and syncs the batch; blocks for the device's time.
    ///
    /// # Errors
    /// [`StoreError::Stopped`] naming the failed `write` or `fdatasync`; the caller hands it
    /// to [`JournalStore::end_commit`].
    pub fn run(&self) -> Result<(), StoreError> {
        let stop = |what, source| StoreError::Stopped { what, path: self.path.clone(), source };
        if let Some(records) = &self.records {
            self.file.write_all_at(records.as_slice(), self.start).map_err(|e| stop("write", e))?;
            sync(&self.file).map_err(|e| stop("fdatasync", e))?;
            crate::fault::crash_point("journal_between_syncs");
        }
        self.file.write_all_at(self.full.as_slice(), self.start).map_err(|e| stop("write", e))?;
        sync(&self.file).map_err(|e| stop("fdatasync", e))
    }
}

/// The segment being written: its O_DIRECT handle and the batch being staged, laid out as it
/// will sit in the file.
struct Active {
    base: u64,
    path: PathBuf,
    /// Shared with a [`Commit`] in flight on another thread.
    file: Arc<File>,
    /// File offset of `buf[0]` (a multiple of [`BLOCK`]).
    start: u64,
    /// The partial block already in the file, then the staged records.
    buf: AlignedBuf,
    /// Length of that partial block.
    prefix: usize,
    /// Bytes the segment may hold.
    limit: u64,
}

impl Active {
    fn open(seg: &Segment, end: u64, limit: u64) -> Result<Active, LogError> {
        let io = |source| LogError::Io { path: seg.path.clone(), source };
        let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&seg.path).map_err(io)?;
        let start = end & !(BLOCK as u64 - 1);
        let mut tail = vec![0u8; (end - start) as usize];
        seg.file.read_exact_at(&mut tail, start).map_err(io)?;
        let mut buf = AlignedBuf::with_capacity(1 << 20);
        buf.extend_from_slice(&tail);
        Ok(Active { base: seg.base, path: seg.path.clone(), file: Arc::new(file), start, prefix: tail.len(), buf, limit })
    }

    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Writes `buf` (padded to blocks with zeros) at `start`.
    fn write_out(&mut self) -> std::io::Result<()> {
        let len = self.buf.len();
        self.buf.pad_to_block();
        let r = self.file.write_all_at(self.buf.as_slice(), self.start);
        self.buf.truncate(len);
        r
    }

    /// After a durable commit: keeps only the new partial last block.
    fn settle(&mut self) {
        let end = self.end();
        let new_start = end & !(BLOCK as u64 - 1);
        let keep = (end - new_start) as usize;
        let from = self.buf.len() - keep;
        let tail = self.buf.as_slice()[from..].to_vec();
        self.buf.clear();
        self.buf.extend_from_slice(&tail);
        self.start = new_start;
        self.prefix = keep;
    }
}

/// The command log: the sequencer's handle.
pub struct JournalStore {
    dir: PathBuf,
    cfg: SegmentConfig,
    _lock: crate::log::lock::DirLock,
    segments: Arc<Segments>,
    active: Active,
    /// Position of the next command.
    next_position: u64,
    /// Commands staged in the open batch.
    staged: u64,
    failed: Option<String>,
}

/// A command found by recovery: its position, where its payload lies, and the payload.
pub struct Replayed<'a> {
    /// The command's position in the log (1-based, dense).
    pub position: u64,
    /// The segment's base position.
    pub segment: u64,
    /// File offset of the payload's first byte.
    pub offset: u64,
    /// The payload (one encoded command).
    pub payload: &'a [u8],
}

impl JournalStore {
    /// Reads the checkpoint of the command log in `data_dir/journals`, if there is one.
    ///
    /// # Errors
    /// [`StoreError::Checkpoint`] for a damaged or inconsistent file, [`StoreError::CheckpointIo`]
    /// when it cannot be read.
    pub fn read_checkpoint(data_dir: &Path) -> Result<Option<Checkpoint>, StoreError> {
        let path = data_dir.join(JOURNALS_DIR).join(CHECKPOINT_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => checkpoint::decode(&bytes).map(Some).map_err(|source| StoreError::Checkpoint { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::CheckpointIo { what: "reading", path, source }),
        }
    }

    /// Opens (creating when missing) the command log in `data_dir/journals`, recovering it,
    /// and hands every committed command after position `covered` (what a checkpoint holds),
    /// in order, to `replay`.
    ///
    /// # Errors
    /// [`StoreError::Log`] for what the event log refuses (damage followed by committed
    /// batches, a segment chain with a gap not covered, a held lock, I/O), or what `replay`
    /// returns.
    pub fn open(
        data_dir: &Path,
        segment_size: u64,
        covered: u64,
        replay: impl FnMut(Replayed<'_>) -> Result<(), StoreError>,
    ) -> Result<(JournalStore, OpenOutcome), StoreError> {
        JournalStore::open_gapped(data_dir, segment_size, covered, covered, replay)
    }

    /// [`JournalStore::open`] that replays every command after `covered` and accepts segment
    /// files missing below position `gaps_below` (segments a cluster node deleted because
    /// nothing in them was live any more, docs/journals.md §9.9): the segments left are
    /// replayed whole, in order, gaps and all.
    ///
    /// # Errors
    /// As [`JournalStore::open`].
    pub fn open_gapped(
        data_dir: &Path,
        segment_size: u64,
        covered: u64,
        gaps_below: u64,
        mut replay: impl FnMut(Replayed<'_>) -> Result<(), StoreError>,
    ) -> Result<(JournalStore, OpenOutcome), StoreError> {
        let dir = data_dir.join(JOURNALS_DIR);
        let cfg = SegmentConfig::new(segment_size);
        let mut failed = None;
        let mut recovered = open_log_covered(&dir, &cfg, gaps_below.max(covered), |walked| {
            let seg = walked.segment;
            for (i, (&off, payload)) in walked.offsets.iter().zip(walked.payloads()).enumerate() {
                let r = Replayed { position: seg.base + i as u64, segment: seg.base, offset: u64::from(off) + RECORD_HEAD as u64, payload };
                if r.position <= covered {
                    continue;
                }
                if let Err(e) = replay(r) {
                    failed = Some(e);
                    return Err(LogError::Corrupt { path: seg.path.clone(), offset: u64::from(off), detail: "a journal command could not be replayed".into() });
                }
            }
            Ok(())
        })
        .map_err(|e| failed.take().unwrap_or(StoreError::Log(e)))?;
        if let OpenOutcome::RolledBack { segment, bytes: (from, to), .. } = &recovered.outcome {
            refuse_damaged_ordered_batch(segment, *from, *to)?;
            refuse_cut_file(segment, *to)?;
        }
        let last = recovered.segments.last().expect("open_log leaves an active segment");
        refuse_sealed_last(&last.path, recovered.active_end)?;
        recovered.apply()?;
        let tmp = dir.join(CHECKPOINT_TMP);
        match std::fs::remove_file(&tmp) {
            Ok(()) => tracing::warn!(path = %tmp.display(), "removed a checkpoint whose writing never finished"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::CheckpointIo { what: "removing", path: tmp, source }),
        }
        let segments = Arc::new(Segments::default());
        for s in &recovered.segments {
            segments.insert(Arc::clone(s));
        }
        let last = recovered.segments.last().expect("open_log leaves an active segment").clone();
        let active = Active::open(&last, recovered.active_end, segment_size)?;
        let store = JournalStore { dir, cfg, _lock: recovered.lock, segments, active, next_position: recovered.next_position, staged: 0, failed: None };
        Ok((store, recovered.outcome))
    }

    /// The segment read handles, for readers.
    pub fn segments(&self) -> Arc<Segments> {
        Arc::clone(&self.segments)
    }

    /// Why the log stopped, once a write or sync failed.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Commands staged and not yet committed.
    pub fn staged(&self) -> u64 {
        self.staged
    }

    /// Whether a command of `len` payload bytes fits the open batch without a rollover.
    pub fn fits(&self, len: usize) -> bool {
        self.active.end() + (RECORD_HEAD + len + ORDERED_MARK_LEN + MARKER_LEN + SEAL_BATCH_LEN) as u64 <= self.active.limit
    }

    /// Stages one command payload in the open batch; returns its position and the file offset
    /// of its payload in the active segment (whose base is [`JournalStore::active_base`]).
    ///
    /// # Panics
    /// When it does not fit ([`JournalStore::fits`]): the caller commits and calls
    /// [`JournalStore::roll_over`] first.
    pub fn stage(&mut self, payload: &[u8]) -> (u64, u64) {
        assert!(self.fits(payload.len()), "staged a command without room for it");
        let offset = self.active.end() + RECORD_HEAD as u64;
        self.active.buf.extend_from_slice(&data_head(payload));
        self.active.buf.extend_from_slice(payload);
        let position = self.next_position;
        self.next_position += 1;
        self.staged += 1;
        (position, offset)
    }

    /// The longest command payload a segment of `segment_size` bytes holds: what
    /// [`JournalStore::check_len`] lets through.
    pub fn max_command_len(segment_size: u64) -> usize {
        let max = (SegmentConfig::new(segment_size).capacity() as usize).min(LENGTH_MASK as usize);
        max.saturating_sub(RECORD_HEAD + ORDERED_MARK_LEN + MARKER_LEN + SEAL_BATCH_LEN)
    }

    /// Checks that a command of `len` payload bytes fits an empty segment.
    ///
    /// # Errors
    /// [`StoreError::TooLarge`] when it does not.
    pub fn check_len(&self, len: usize) -> Result<(), StoreError> {
        if len > Self::max_command_len(self.cfg.segment_size) {
            return Err(StoreError::TooLarge { len, segment_size: self.active.limit });
        }
        Ok(())
    }

    /// The base position of the segment being written.
    pub fn active_base(&self) -> u64 {
        self.active.base
    }

    /// Makes the open batch durable: under `ordered`, the records, a sync, the commit marker,
    /// a sync; under `batched` (`ordered == false`), records and marker, one sync. Nothing is
    /// answered before this returns. No [`Commit`] may be in flight.
    ///
    /// # Errors
    /// [`StoreError::Stopped`]: the log is stopped for good (fail-stop), and so is every later
    /// commit.
    pub fn commit(&mut self, ordered: bool) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped { what: "earlier write", path: self.active.path.clone(), source: std::io::Error::other(why.clone()) });
        }
        if self.staged == 0 {
            return Ok(());
        }
        let r = self.write_and_sync(ordered);
        if let Err(StoreError::Stopped { what, source, .. }) = &r {
            self.failed = Some(format!("{what} failed: {source}"));
        }
        r
    }

    /// Hands the open batch out as a [`Commit`] to be made durable on another thread, so the
    /// caller can stage the next batch meanwhile; `None` when nothing is staged. The batch is
    /// laid out exactly as [`JournalStore::commit`] writes it (under `ordered`, the records,
    /// then the ordered mark and the commit marker). Commits must run one at a time, in the
    /// order handed out (each rewrites the partial last block of the one before), and the
    /// caller reports each result with [`JournalStore::end_commit`]. Nothing staged may be
    /// answered before its commit ran. Source: docs/journals.md §9.1.
    ///
    /// # Errors
    /// [`StoreError::Stopped`] when an earlier write or sync failed (fail-stop).
    pub fn begin_commit(&mut self, ordered: bool) -> Result<Option<Commit>, StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped { what: "earlier write", path: self.active.path.clone(), source: std::io::Error::other(why.clone()) });
        }
        if self.staged == 0 {
            return Ok(None);
        }
        let records = ordered.then(|| {
            let mut b = AlignedBuf::with_capacity(self.active.buf.len());
            b.extend_from_slice(self.active.buf.as_slice());
            b.pad_to_block();
            b
        });
        let mut marker = Vec::with_capacity(ORDERED_MARK_LEN + MARKER_LEN);
        if ordered {
            frame_control(&[ORDERED_MARK], &mut marker);
        }
        frame_marker(self.next_position - 1, &mut marker);
        self.active.buf.extend_from_slice(&marker);
        let mut full = AlignedBuf::with_capacity(self.active.buf.len());
        full.extend_from_slice(self.active.buf.as_slice());
        full.pad_to_block();
        let commit = Commit { file: Arc::clone(&self.active.file), path: self.active.path.clone(), start: self.active.start, records, full };
        self.active.settle();
        self.staged = 0;
        Ok(Some(commit))
    }

    /// Takes the result of a [`Commit`] handed out by [`JournalStore::begin_commit`]: a failed
    /// one stops the log for good (fail-stop), as a failed [`JournalStore::commit`] does.
    pub fn end_commit(&mut self, result: &Result<(), StoreError>) {
        if let Err(StoreError::Stopped { what, source, .. }) = result {
            self.failed.get_or_insert_with(|| format!("{what} failed: {source}"));
        }
    }

    fn write_and_sync(&mut self, ordered: bool) -> Result<(), StoreError> {
        let stop = |what, path: &Path, source| StoreError::Stopped { what, path: path.to_owned(), source };
        let path = self.active.path.clone();
        let mut marker = Vec::with_capacity(ORDERED_MARK_LEN + MARKER_LEN);
        if ordered {
            self.active.write_out().map_err(|e| stop("write", &path, e))?;
            sync(&self.active.file).map_err(|e| stop("fdatasync", &path, e))?;
            crate::fault::crash_point("journal_between_syncs");
            frame_control(&[ORDERED_MARK], &mut marker);
        }
        frame_marker(self.next_position - 1, &mut marker);
        self.active.buf.extend_from_slice(&marker);
        self.active.write_out().map_err(|e| stop("write", &path, e))?;
        sync(&self.active.file).map_err(|e| stop("fdatasync", &path, e))?;
        self.active.settle();
        self.staged = 0;
        Ok(())
    }

    /// The position of the last command staged or committed (0 before the first).
    pub fn last_position(&self) -> u64 {
        self.next_position - 1
    }

    /// The bytes each segment file takes.
    pub fn segment_size(&self) -> u64 {
        self.cfg.segment_size
    }

    /// The directory of the command log (`DATA_DIR/journals`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The base positions of the sealed segments (all but the one being written).
    pub fn sealed(&self) -> Vec<u64> {
        self.segments.bases().into_iter().filter(|&b| b != self.active.base).collect()
    }

    /// Writes `bytes` as the checkpoint, durably: to a temporary file, synced, renamed over
    /// the old one, and the directory synced. On an error the old checkpoint stands (or the
    /// new one; both are valid), and no segment may be deleted on the new one's account.
    ///
    /// # Errors
    /// [`StoreError::CheckpointIo`] naming the step that failed.
    pub fn write_checkpoint(&self, bytes: &[u8]) -> Result<(), StoreError> {
        fn io<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> StoreError + 'p {
            move |source| StoreError::CheckpointIo { what, path: path.to_owned(), source }
        }
        let tmp = self.dir.join(CHECKPOINT_TMP);
        let path = self.dir.join(CHECKPOINT_FILE);
        let file = File::create(&tmp).map_err(io("creating", &tmp))?;
        crate::fault::io_point("journal_checkpoint_write").and_then(|()| file.write_all_at(bytes, 0)).map_err(io("writing", &tmp))?;
        file.sync_all().map_err(io("syncing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming over", &path))?;
        self.sync_dir()?;
        crate::fault::crash_point("journal_after_checkpoint");
        Ok(())
    }

    /// Deletes the sealed segments `bases`, which a durable checkpoint covers and which hold
    /// no held record, and syncs the directory. Readers holding a segment's handle can still
    /// read it until they drop it.
    ///
    /// # Errors
    /// [`StoreError::CheckpointIo`] for a removal or the directory sync that failed (the
    /// segments not yet removed stay, and a later checkpoint retries them).
    pub fn delete_segments(&mut self, bases: &[u64]) -> Result<(), StoreError> {
        for &base in bases {
            assert_ne!(base, self.active.base, "the segment being written is never deleted");
            let Some(seg) = self.segments.remove(base) else { continue };
            if let Err(source) = std::fs::remove_file(&seg.path) {
                self.segments.insert(seg.clone());
                return Err(StoreError::CheckpointIo { what: "deleting", path: seg.path.clone(), source });
            }
        }
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        sync_dir(&self.dir).map_err(|e| match e {
            LogError::Io { path, source } => StoreError::CheckpointIo { what: "syncing", path, source },
            other => StoreError::Log(other),
        })
    }

    /// Starts a new segment at the next position (the open batch must be committed, and no
    /// [`Commit`] be in flight).
    ///
    /// # Errors
    /// [`StoreError::Log`] when the segment cannot be created (the log then goes on in the
    /// old one until it is full).
    pub fn roll_over(&mut self) -> Result<(), StoreError> {
        assert_eq!(self.staged, 0, "a batch never spans two segments");
        let path = create_segment(&self.dir, self.next_position, &self.cfg)?;
        let seg = Arc::new(Segment::open(self.next_position, path, &self.cfg)?);
        let next = Active::open(&seg, crate::log::header::HEADER_LEN as u64, self.cfg.segment_size)?;
        self.seal()?;
        self.active = next;
        self.segments.insert(seg);
        Ok(())
    }

    /// Writes the seal batch into the segment being left, durably, once its successor exists:
    /// a crash before leaves an unsealed segment and an empty successor (nothing lost either
    /// way); after, the seal proves the successor held data.
    ///
    /// # Errors
    /// [`StoreError::Stopped`]: the log stops for good, as for a failed commit.
    fn seal(&mut self) -> Result<(), StoreError> {
        let mut payload = [0u8; 9];
        payload[0] = SEALED;
        payload[1..].copy_from_slice(&self.next_position.to_le_bytes());
        let mut batch = Vec::with_capacity(SEAL_BATCH_LEN);
        frame_control(&payload, &mut batch);
        frame_marker(self.next_position - 1, &mut batch);
        self.active.buf.extend_from_slice(&batch);
        let path = self.active.path.clone();
        let r = self.active.write_out().map_err(|source| StoreError::Stopped { what: "write", path: path.clone(), source });
        let r = r.and_then(|()| sync(&self.active.file).map_err(|source| StoreError::Stopped { what: "fdatasync", path, source }));
        if let Err(StoreError::Stopped { what, source, .. }) = &r {
            self.failed = Some(format!("{what} failed: {source}"));
        }
        r
    }
}

/// Refuses a rolled-back tail that holds an `ordered` batch's commit marker: that marker was
/// written only after the batch's records were durable, so damage before it is corruption of
/// an acknowledged batch, never a torn tail (docs/journals.md §3). A tail torn between the two
/// syncs holds records and no marker, and is rolled back.
fn refuse_damaged_ordered_batch(segment: &Path, from: u64, to: u64) -> Result<(), StoreError> {
    let io = |source| StoreError::Log(LogError::Io { path: segment.to_owned(), source });
    let file = File::open(segment).map_err(io)?;
    // The discarded range ends at the last non-zero byte, which may cut a marker's trailing
    // zero bytes off: read a marker's length past it (within the file).
    let end = (to + MARKER_LEN as u64).min(file.metadata().map_err(io)?.len());
    let mut buf = vec![0u8; (end - from) as usize];
    file.read_exact_at(&mut buf, from).map_err(io)?;
    let mut at = 0;
    while let Some((m, _, end)) = find_marker(&buf, at) {
        let proven =
            m >= ORDERED_MARK_LEN && buf[m - 1] == ORDERED_MARK && matches!(read_record(&buf, m - ORDERED_MARK_LEN), Ok((Record::OtherControl, e)) if e == m);
        if proven {
            return Err(StoreError::Log(LogError::Corrupt {
                path: segment.to_owned(),
                offset: from,
                detail: format!(
                    "damage at byte {from} lies before the commit marker at byte {} of a batch committed in ordered mode, whose records were durable before the marker was written: refusing to roll back an acknowledged batch",
                    from + m as u64
                ),
            }));
        }
        at = end;
    }
    Ok(())
}

/// Refuses a rolled-back tail that reaches the end of its file: segments are reserved at their
/// full size when created and a record is staged only where it fits, so a record running past
/// the end of the file means the file was cut short, never a torn write.
fn refuse_cut_file(segment: &Path, discard_end: u64) -> Result<(), StoreError> {
    let io = |source| StoreError::Log(LogError::Io { path: segment.to_owned(), source });
    let len = std::fs::metadata(segment).map_err(io)?.len();
    if discard_end < len {
        return Ok(());
    }
    Err(StoreError::Log(LogError::Corrupt {
        path: segment.to_owned(),
        offset: len,
        detail: format!("the file is {len} bytes and ends inside a record: it was cut short (journal segments are reserved at their full size), so the records past its end are lost; refusing to roll back acknowledged commands"),
    }))
}

/// Refuses a log whose last segment ends with the seal batch: the segment after it, which the
/// seal says existed and held what follows, is missing.
fn refuse_sealed_last(segment: &Path, committed_end: u64) -> Result<(), StoreError> {
    let Some(at) = committed_end.checked_sub(SEAL_BATCH_LEN as u64) else { return Ok(()) };
    let io = |source| StoreError::Log(LogError::Io { path: segment.to_owned(), source });
    let mut buf = vec![0u8; SEAL_BATCH_LEN];
    File::open(segment).and_then(|f| f.read_exact_at(&mut buf, at)).map_err(io)?;
    let sealed = matches!(read_record(&buf, 0), Ok((Record::OtherControl, end)) if end == RECORD_HEAD + 9) && buf[RECORD_HEAD] == SEALED;
    if !sealed {
        return Ok(());
    }
    let next = u64::from_le_bytes(buf[RECORD_HEAD + 1..RECORD_HEAD + 9].try_into().unwrap());
    Err(StoreError::Log(LogError::Corrupt {
        path: segment.to_owned(),
        offset: at,
        detail: format!("this segment was sealed for a successor starting at position {next}, and no segment file holds that position: the newest segment file is missing, with the commands it held"),
    }))
}

/// `fdatasync`, behind the fault-injection site `journal_sync` (tests make it fail).
fn sync(file: &File) -> std::io::Result<()> {
    crate::fault::io_point("journal_sync")?;
    file.sync_data()
}
