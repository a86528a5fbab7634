//! The read-write open sequence and its three outcomes (docs/format.md §10.1, and
//! docs/compatibility.md §2.1-§2.4 for where it differs from the reference).

use super::header::{HeaderError, SegmentHeader, HEADER_LEN};
use super::lock::DirLock;
use super::record::{classify_tail, dirty_end, payload_at, walk, TailVerdict, Walk, RECORD_HEAD};
use super::segment::{create_segment, list_segments, sync_dir, Segment, SegmentConfig};
use super::LogError;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the log came back on open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenOutcome {
    /// Every byte after the committed prefix was zero.
    Clean,
    /// An uncommitted torn tail was discarded (and zeroed on disk so it can never return).
    RolledBack {
        /// The active segment that held the tail.
        segment: PathBuf,
        /// Discarded byte range `[start, end)` within that segment.
        bytes: (u64, u64),
        /// Positions the discarded records would have had, `first..=last`; `None` when no
        /// complete record was discarded.
        positions: Option<(u64, u64)>,
    },
}

/// A recovered, locked log ready for the writer.
pub struct Recovered {
    /// The held directory lock.
    pub lock: DirLock,
    /// Every segment, ascending; the last is the active one.
    pub segments: Vec<Arc<Segment>>,
    /// The next position to assign (`head + 1`).
    pub next_position: u64,
    /// Byte offset just past the active segment's last commit marker.
    pub active_end: u64,
    /// Clean or rolled back (the rollback done by [`Recovered::apply`]).
    pub outcome: OpenOutcome,
    /// Trailing never-written segment files, removed by [`Recovered::apply`] (or already, when
    /// no segment was ever written and they made way for the first one).
    pub removed: Vec<PathBuf>,
    /// The data directory.
    dir: PathBuf,
    /// [`Recovered::removed`] still on disk.
    to_remove: Vec<PathBuf>,
}

impl Recovered {
    /// Makes the log on disk what [`open_log`] judged it to be: removes the never-written
    /// trailing segments and zeroes a rolled-back tail (and syncs both). Nothing before this
    /// changes the directory, so the caller runs every check that can still refuse the open
    /// (the active segment opening for writing, say) first: a refused open changes nothing
    /// (review: an immutable directory refused a start after the tail had been zeroed).
    ///
    /// # Errors
    /// [`LogError::Io`] of the removal, or of the zeroing (the active segment named).
    pub fn apply(&mut self) -> Result<(), LogError> {
        remove_unwritten(&self.dir, &self.to_remove)?;
        self.to_remove.clear();
        if let OpenOutcome::RolledBack { segment, bytes: (from, to), positions } = &self.outcome {
            // Best effort: a disk too full for the copy must not keep the store from opening
            // (a full disk may be why it crashed).
            let kept = match keep_discarded(&self.dir, segment, *from, *to) {
                Ok(copy) => copy.display().to_string(),
                Err(e) => {
                    tracing::warn!(segment = %segment.display(), from, to, error = %e, "could not keep a copy of the discarded tail");
                    "nowhere".into()
                }
            };
            zero_range(segment, *from, *to)?;
            tracing::warn!(segment = %segment.display(), from, to, ?positions, kept, "recovered with rollback of an uncommitted tail");
        }
        Ok(())
    }
}

enum Class {
    Ready,
    Unwritten,
}

fn classify(base: u64, path: &Path) -> Result<Class, LogError> {
    let f = std::fs::File::open(path).map_err(|source| LogError::Io { path: path.to_owned(), source })?;
    let mut b = [0u8; HEADER_LEN];
    let mut n = 0;
    while n < HEADER_LEN {
        match f.read_at(&mut b[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(source) => return Err(LogError::Io { path: path.to_owned(), source }),
        }
    }
    match SegmentHeader::decode(&b[..n]) {
        Ok(h) if h.base_position == base => Ok(Class::Ready),
        Ok(h) => Err(LogError::BasePositionMismatch { path: path.to_owned(), header: h.base_position, name: base }),
        Err(HeaderError::Unwritten) => match nonzero_after_header(&f) {
            // A creation that never finished has nothing after its header either: each
            // server writes a segment's header before (or with) its first records, and ours
            // names a segment only once both are durable. A zeroed header over records is
            // damage, refused rather than removed with every event in the file (review; the
            // reference removes it).
            Ok(Some(offset)) => Err(LogError::Corrupt {
                path: path.to_owned(),
                offset: 0,
                detail: format!("the segment header is all zeros but the file holds data after it (a non-zero byte at offset {offset}); refusing to remove it as a segment whose creation never finished"),
            }),
            Ok(None) => Ok(Class::Unwritten),
            Err(source) => Err(LogError::Io { path: path.to_owned(), source }),
        },
        Err(source) => Err(LogError::Header { path: path.to_owned(), source }),
    }
}

/// The offset of the first non-zero byte after a segment file's header, if any. The whole file
/// is read (in 1 MiB pieces; the reserved, never-written part of a segment reads as zeros
/// without touching the disk): damage that zeroed more than the first block must not pass
/// for an unfinished creation either (review: 8 KiB zeroed at the start of the active segment
/// still had it removed when only 4 KiB were looked at). Only files whose header reads as
/// zeros get here, which a healthy store has only after a crash during a rollover.
fn nonzero_after_header(f: &std::fs::File) -> std::io::Result<Option<u64>> {
    let mut b = vec![0u8; 1 << 20];
    let mut at = HEADER_LEN as u64;
    loop {
        let n = match f.read_at(&mut b, at) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(i) = b[..n].iter().position(|&x| x != 0) {
            return Ok(Some(at + i as u64));
        }
        at += n as u64;
    }
}

/// A segment just walked at open, handed to the caller so derived state (the indexes) can be
/// loaded or rebuilt without reading the file again.
pub struct WalkedSegment<'a> {
    /// The segment (its offsets are filled in).
    pub segment: &'a Segment,
    /// The file as read at open, up to the end of its data (the rest reads as zeros).
    pub bytes: &'a [u8],
    /// Byte offset of each committed record, by local position.
    pub offsets: &'a [u32],
    /// True for the last (active) segment.
    pub active: bool,
}

impl WalkedSegment<'_> {
    /// The segment's [`super::segment::Fingerprint`] over its committed records.
    pub fn fingerprint(&self) -> super::segment::Fingerprint {
        let mut f = super::segment::Fingerprint::new(&self.bytes[..HEADER_LEN]);
        for &off in self.offsets {
            f.record(&self.bytes[off as usize..off as usize + RECORD_HEAD]);
        }
        f
    }

    /// The committed event payloads, in position order.
    pub fn payloads(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.offsets.iter().map(move |&off| payload_at(self.bytes, off as usize))
    }
}

/// Opens (creating if needed) and recovers the log in `dir`; calls `on_segment` for each
/// committed segment in order, so derived state can be rebuilt in the same pass. It judges the
/// log and changes nothing in it (a new store's first segment aside): the caller has the
/// judgement carried out with [`Recovered::apply`] once nothing else can refuse the open.
///
/// # Errors
/// Any [`LogError`]: a lock held elsewhere, an unusable header anywhere, a gap, or corruption
/// that is not a torn tail (refused with the file and byte offset), or what `on_segment` returns.
pub fn open_log(dir: &Path, cfg: &SegmentConfig, on_segment: impl FnMut(WalkedSegment<'_>) -> Result<(), LogError>) -> Result<Recovered, LogError> {
    open_log_covered(dir, cfg, 0, on_segment)
}

/// [`open_log`] for a log whose state up to position `covered` is held elsewhere (the
/// journals' checkpoint, docs/journals.md §4.4), so segments holding only positions up to it
/// may have been deleted: a gap in the chain is accepted when every missing position is at
/// most `covered`, and refused as with [`open_log`] otherwise.
///
/// # Errors
/// As [`open_log`], and [`LogError::Corrupt`] when the log ends before `covered` (the
/// checkpoint claims commands the log does not hold).
pub fn open_log_covered(
    dir: &Path,
    cfg: &SegmentConfig,
    covered: u64,
    mut on_segment: impl FnMut(WalkedSegment<'_>) -> Result<(), LogError>,
) -> Result<Recovered, LogError> {
    cfg.validate()?;
    ensure_dir(dir)?;
    let lock = DirLock::acquire(dir)?;
    let Listed { segments: listed, trailing, fresh } = list_written(dir, cfg)?;

    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(listed.len());
    let mut progress = Progress::new(&listed);
    let mut expected = 1u64;
    let last = listed.len() - 1;
    let next_bases: Vec<Option<u64>> = (0..listed.len()).map(|i| listed.get(i + 1).map(|(b, _)| *b)).collect();
    let mut outcome = OpenOutcome::Clean;
    let mut active_end = HEADER_LEN as u64;
    // Where the previous segment's committed records end (named when the next does not follow).
    let mut prev_end = 0usize;
    for (i, (base, path)) in listed.into_iter().enumerate() {
        crate::fault::crash_point("recovery_midway");
        if base > expected && base <= covered.saturating_add(1) {
            expected = base;
        }
        check_follows(&path, base, expected, segments.last().map(|s| &*s.path), prev_end)?;
        // Every segment is read whole, the active one too: a clean open must see that every
        // byte after the last commit marker is zero, to the end of the file. Reading only up to
        // a long run of zeros past the data (32 MiB, as this did) let damage that zeroed a
        // record head, ahead of such a run, open as a clean log of fewer events, the rest
        // forgotten and their positions given to new appends (review: 4 KiB zeroed at the
        // head of an event of 40 MiB of zeros; 40 MiB zeroed among 256 MiB of records).
        // Read whole up to the end of its data, that is: past it the file system itself says
        // the bytes are zeros (`data_end`), and zeros written to disk count as data.
        let mapped = map_whole(&path).map_err(|source| LogError::Io { path: path.clone(), source })?;
        let buf: &[u8] = &mapped;
        progress.read(i, buf.len());
        let w = walk(buf, HEADER_LEN);
        let count = w.offsets.len() as u64;
        if let Some(highest) = w.last_marker {
            if highest + 1 != base + count {
                return Err(LogError::PositionMismatch { path, found: highest, expected: base + count - 1 });
            }
        }
        if i == last {
            if let Some(rolled_back) = judge_tail(&path, buf, &w, base)? {
                outcome = rolled_back;
            }
            active_end = w.committed_end as u64;
        } else {
            check_sealed_end(&path, buf, &w, base, next_bases[i])?;
        }
        // Only the active segment grows: the sealed ones get tables for what they hold.
        let seg = if i == last { Segment::open(base, path, cfg)? } else { Segment::open_sealed(base, path, w.offsets.len())? };
        for (k, &off) in w.offsets.iter().enumerate() {
            seg.offsets.set(k, off);
        }
        on_segment(WalkedSegment { segment: &seg, bytes: buf, offsets: &w.offsets, active: i == last })?;
        expected = base + count;
        prev_end = w.committed_end;
        segments.push(Arc::new(seg));
    }
    if expected <= covered {
        let path = segments.last().map_or_else(|| dir.to_owned(), |s| s.path.clone());
        let detail = format!("the log ends at position {} but the checkpoint covers positions up to {covered}: the log lost committed commands", expected - 1);
        return Err(LogError::Corrupt { path, offset: 0, detail });
    }
    tracing::info!(dir = %dir.display(), head = expected - 1, segments = segments.len(), ?outcome, took_ms = progress.started.elapsed().as_millis() as u64, "log opened");
    let to_remove = if fresh { Vec::new() } else { trailing.clone() };
    Ok(Recovered { lock, segments, next_position: expected, active_end, outcome, removed: trailing, dir: dir.to_owned(), to_remove })
}

/// Creates the data directory when it does not exist (syncing its parent), and refuses a path
/// that is not a directory.
fn ensure_dir(dir: &Path) -> Result<(), LogError> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|source| LogError::Io { path: dir.to_owned(), source })?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    if !dir.is_dir() {
        // Say so, rather than failing on the LOCK file inside it ("Not a directory").
        let source = std::io::Error::new(std::io::ErrorKind::NotADirectory, "the data directory exists but is not a directory");
        return Err(LogError::Io { path: dir.to_owned(), source });
    }
    Ok(())
}

/// The segment files of a data directory, as the open walks them ([`list_written`]).
struct Listed {
    /// The written segments, ascending by base (at least one).
    segments: Vec<(u64, PathBuf)>,
    /// The never-written trailing files, to be removed.
    trailing: Vec<PathBuf>,
    /// No segment was ever written: the first one was created (the trailing run removed).
    fresh: bool,
}

/// Lists the segments and sets apart the never-written ones. Never-written files are
/// tolerated only as a trailing run (a crash or ENOSPC during rollover); anywhere else the
/// chain is broken. The trailing run is removed only once the rest of the log has been
/// accepted, so a refused open changes nothing on disk (except when no segment was ever
/// written: then the run makes way for the first segment, created here).
fn list_written(dir: &Path, cfg: &SegmentConfig) -> Result<Listed, LogError> {
    let mut listed = list_segments(dir)?;
    let mut ready = 0;
    let mut classes = Vec::with_capacity(listed.len());
    for (base, path) in &listed {
        let c = classify(*base, path)?;
        if matches!(c, Class::Ready) {
            ready = classes.len() + 1;
        }
        classes.push(c);
    }
    if let Some(i) = classes.iter().take(ready).position(|c| matches!(c, Class::Unwritten)) {
        return Err(LogError::UnwrittenNonLast { path: listed[i].1.clone() });
    }
    let trailing: Vec<PathBuf> = listed.split_off(ready).into_iter().map(|(_, p)| p).collect();
    let fresh = listed.is_empty();
    if fresh {
        remove_unwritten(dir, &trailing)?;
        let path = create_segment(dir, 1, cfg)?;
        listed.push((1, path));
    }
    Ok(Listed { segments: listed, trailing, fresh })
}

/// A long open's progress: a large store takes a while to read, so the open says how far it
/// got every [`OPEN_PROGRESS_EVERY`], and a long start is seen to be working.
struct Progress {
    started: std::time::Instant,
    segments: usize,
    total_bytes: u64,
    read_bytes: u64,
    next_note: std::time::Instant,
}

impl Progress {
    fn new(listed: &[(u64, PathBuf)]) -> Progress {
        let started = std::time::Instant::now();
        let total_bytes = listed.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
        Progress { started, segments: listed.len(), total_bytes, read_bytes: 0, next_note: started + OPEN_PROGRESS_EVERY }
    }

    /// Segment `i` (from 0), of `bytes` bytes, was mapped.
    fn read(&mut self, i: usize, bytes: usize) {
        self.read_bytes += bytes as u64;
        if std::time::Instant::now() >= self.next_note {
            tracing::info!(
                reading_segment = i + 1,
                of = self.segments,
                mapped_mib = self.read_bytes >> 20,
                of_mib = self.total_bytes >> 20,
                elapsed_s = self.started.elapsed().as_secs(),
                "opening the log: every segment is read and checked at start"
            );
            self.next_note += OPEN_PROGRESS_EVERY;
        }
    }
}

/// Refuses a segment whose base is not `expected`, the position after the segment before it
/// (`prev`, whose committed records end at byte `prev_end`). The segment before it is named
/// too: the one at fault when its last batches were lost (review: the healthy next file was
/// the only one named).
fn check_follows(path: &Path, base: u64, expected: u64, prev: Option<&Path>, prev_end: usize) -> Result<(), LogError> {
    if base == expected {
        return Ok(());
    }
    let hint = match prev {
        Some(prev) if base > expected => format!(
            " (the segment before it, {}, holds positions up to {} and its committed records end at byte offset {prev_end}: its last batches were lost, or a segment file between the two is missing)",
            prev.display(),
            expected - 1
        ),
        Some(prev) => format!(" (it overlaps the segment before it, {}, which holds positions up to {})", prev.display(), expected - 1),
        None => String::new(),
    };
    Err(LogError::NonContiguous { path: path.to_owned(), found: base, expected, hint })
}

/// Judges what follows the active segment's committed prefix ([`classify_tail`]): nothing,
/// a torn tail to roll back (returned as the outcome; zeroed by [`Recovered::apply`], once the
/// caller accepted the whole store), or damage followed by committed batches (refused).
fn judge_tail(path: &Path, buf: &[u8], w: &Walk, base: u64) -> Result<Option<OpenOutcome>, LogError> {
    let count = w.offsets.len() as u64;
    match classify_tail(buf, w, base) {
        TailVerdict::Clean => Ok(None),
        TailVerdict::Corrupt { offset, stop } => Err(LogError::Corrupt {
            path: path.to_owned(),
            offset: offset as u64,
            detail: format!("a damaged record ({stop:?}) is followed by committed batches; refusing to roll back acknowledged events"),
        }),
        TailVerdict::Torn { discard_start, discard_end, lost_records } => {
            let positions = (lost_records > 0).then(|| (base + count, base + count + lost_records - 1));
            Ok(Some(OpenOutcome::RolledBack { segment: path.to_owned(), bytes: (discard_start as u64, discard_end as u64), positions }))
        }
    }
}

/// Refuses a sealed segment whose walk stopped on a damaged record before reaching the next
/// segment's base (`next_base`): the contiguity check would blame the next file, so this one
/// is named, with the damaged record's offset.
fn check_sealed_end(path: &Path, buf: &[u8], w: &Walk, base: u64, next_base: Option<u64>) -> Result<(), LogError> {
    let count = w.offsets.len() as u64;
    if next_base == Some(base + count) || dirty_end(buf) <= w.committed_end {
        return Ok(());
    }
    Err(LogError::Corrupt {
        path: path.to_owned(),
        offset: w.stop_offset as u64,
        detail: format!(
            "{:?} in a sealed segment: its committed records end at position {}, the next segment starts at {}",
            w.stop,
            base + count - 1,
            next_base.unwrap_or(0)
        ),
    })
}

/// How often a long open says how far it got.
const OPEN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes never-written trailing segment files and syncs the directory.
fn remove_unwritten(dir: &Path, files: &[PathBuf]) -> Result<(), LogError> {
    for path in files {
        std::fs::remove_file(path).map_err(|source| LogError::Io { path: path.clone(), source })?;
        tracing::warn!(path = %path.display(), "removed a segment whose creation never finished");
    }
    if !files.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Maps a segment read-only for the walk at open: the page cache is read in place, with no
/// copy and no fresh memory to fault in and clear (a copy took a third of a warm open). The
/// map ends where the file's data does ([`data_end`]): what follows reads as zeros, and
/// mapping it would fill the page cache with zeroed pages (a new 256 MiB segment: 0.6 s of
/// the first start, and of any start whose cache does not hold the active segment). The
/// kernel's read-ahead around the mapped pages may still read up to one window past the data
/// (the device's `read_ahead_kb`) when they are not cached.
///
/// Safety of the mapping: this process holds the directory's `LOCK` and its writer has not
/// started, so nothing changes the file while it is mapped, except a rollback zeroing the
/// discarded tail of the active segment, bytes nothing reads afterwards.
fn map_whole(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let f = std::fs::File::open(path)?;
    let len = data_end(&f)?;
    // SAFETY: see above; the map is dropped before `open_log` returns.
    unsafe { memmap2::MmapOptions::new().len(len as usize).populate().map(&f) }
}

/// Most data ranges [`data_end`] steps through before it settles for the whole file.
const DATA_RANGES_MAX: usize = 4096;

/// The end of the last data in the file `f`: from there to its end every byte reads as zeros,
/// since `lseek`'s `SEEK_DATA`/`SEEK_HOLE` report as holes only ranges that read as zeros
/// (holes, and the reserved, never-written extents `fallocate` makes). An acknowledged batch
/// was synced, so its bytes are data and lie before this end. Where holes are not reported
/// (an error, or a file system without them: then the whole file is data) it is the file's
/// length. Never below the header's end, unless the file is shorter.
pub(crate) fn data_end(f: &std::fs::File) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let len = f.metadata()?.len();
    let seek = |at: u64, whence| {
        // SAFETY: a plain system call on a descriptor `f` owns; it only moves its offset.
        let r = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, whence) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    };
    let (mut end, mut at) = (0u64, 0u64);
    for _ in 0..DATA_RANGES_MAX {
        if at >= len {
            return Ok(end.max(HEADER_LEN as u64).min(len));
        }
        let data = match seek(at, libc::SEEK_DATA) {
            Ok(d) => d,
            // No data at or after `at`.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(end.max(HEADER_LEN as u64).min(len)),
            Err(_) => return Ok(len),
        };
        match seek(data, libc::SEEK_HOLE) {
            Ok(hole) => (end, at) = (hole.min(len), hole),
            Err(_) => return Ok(len),
        }
    }
    Ok(len)
}

/// The directory, inside the data directory, where a rollback keeps a copy of the bytes it
/// discards before zeroing them. Neither server reads it (segments are found by their names
/// of 20 digits and `.log` in the data directory itself, docs/format.md §1).
pub const RECOVERED_DIR: &str = "recovered";

/// The most a rollback copies to [`RECOVERED_DIR`], from the start of the discarded range, in
/// bytes: more than any batch (so a damaged last batch is kept whole), not the gigabytes a
/// stray byte at the end of a huge segment would make the range.
pub const KEEP_DISCARDED_MAX: u64 = 64 << 20;

/// Free space a rollback's copy must leave on the data directory's file system, in bytes:
/// the copy is skipped when it would leave less (the log itself needs the room, and a full
/// disk may be why the server crashed). Review: on a nearly full disk the copy took the last
/// free byte and left a truncated file behind.
pub const KEEP_DISCARDED_HEADROOM: u64 = 64 << 20;

/// Copies the discarded bytes `[from, to)` of `segment` (at most [`KEEP_DISCARDED_MAX`]) to
/// `<dir>/recovered/<segment file name>.<from>-<to>.<unix seconds>.discarded` and makes the
/// copy durable, so that what a rollback zeroes can still be looked at: a torn batch was
/// never acknowledged, but damage in the last acknowledged batch reads the same way and is
/// rolled back too (the reference leaves the bytes in the segment until the next append
/// overwrites them). Returns the copy's path.
///
/// A copy of the same bytes of the same range already there (a start that kept it, then
/// stopped before zeroing) is returned instead of a second one. No copy is made when it would
/// leave less than [`KEEP_DISCARDED_HEADROOM`] free; a copy that fails part way is removed.
///
/// # Errors
/// Creating the directory or the file (an existing file is not replaced), too little free
/// space (`StorageFull`, saying how much there is), reading the segment, writing or syncing.
fn keep_discarded(dir: &Path, segment: &Path, from: u64, to: u64) -> std::io::Result<PathBuf> {
    let keep = to.saturating_sub(from).min(KEEP_DISCARDED_MAX);
    let recovered = dir.join(RECOVERED_DIR);
    let created = match std::fs::create_dir(&recovered) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    let name = segment.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut bytes = vec![0u8; keep as usize];
    std::fs::File::open(segment)?.read_exact_at(&mut bytes, from)?;
    let prefix = format!("{name}.{from}-{to}.");
    for entry in std::fs::read_dir(&recovered)? {
        let entry = entry?;
        let path = entry.path();
        let same_range = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".discarded"));
        // Only a regular file of the copy's length is read (review: a FIFO of that name held
        // the start forever; a huge file would have been read whole). Links are not followed.
        let same_size = || entry.metadata().is_ok_and(|m| m.is_file() && m.len() == keep);
        if same_range && same_size() && std::fs::read(&path).is_ok_and(|held| held == bytes) {
            return Ok(path);
        }
    }
    let free = nix::sys::statvfs::statvfs(&recovered).map_err(std::io::Error::from)?;
    let available = (free.blocks_available() as u64).saturating_mul(free.fragment_size() as u64);
    if !copy_fits(available, keep) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!("{keep} bytes to copy, {available} bytes free; a copy must leave {KEEP_DISCARDED_HEADROOM} free"),
        ));
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let path = recovered.join(format!("{prefix}{secs}.discarded"));
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
    let written = crate::fault::io_point("keep_discarded").and_then(|()| std::io::Write::write_all(&mut &f, &bytes)).and_then(|()| f.sync_all());
    if let Err(e) = written {
        drop(f);
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    std::fs::File::open(&recovered)?.sync_all()?;
    if created {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(path)
}

/// True when a copy of `keep` bytes leaves at least [`KEEP_DISCARDED_HEADROOM`] of
/// `available` bytes free.
fn copy_fits(available: u64, keep: u64) -> bool {
    available >= keep.saturating_add(KEEP_DISCARDED_HEADROOM)
}

/// A discarded range at least this long is zeroed by `fallocate(FALLOC_FL_ZERO_RANGE)`, not
/// by writing zeros (review: one stray byte at the end of a 4 GiB segment made the open
/// write 4 GiB, 3.4 s).
const ZERO_IN_PLACE_MIN: u64 = 1 << 20;

/// Overwrites `[start, end)` with zeros and syncs, so a rolled-back tail can never be read as
/// committed again (the reference leaves it in place, docs/compatibility.md §2.4). A long range is
/// zeroed in place by the file system ([`ZERO_IN_PLACE_MIN`]; the blocks then read as zeros
/// without being written, and the change is made durable with `fsync`); where that is not
/// supported, and for a short range, zeros are written.
fn zero_range(path: &Path, start: u64, end: u64) -> Result<(), LogError> {
    let io = |source| LogError::Io { path: path.to_owned(), source };
    let f = &std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
    if end - start >= ZERO_IN_PLACE_MIN {
        use nix::fcntl::{fallocate, FallocateFlags};
        let flags = FallocateFlags::FALLOC_FL_ZERO_RANGE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match fallocate(std::os::fd::AsRawFd::as_raw_fd(f), flags, start as i64, (end - start) as i64) {
            // The extents changed: fsync, not fdatasync, makes that durable on every file system.
            Ok(()) => return f.sync_all().map_err(io),
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::ENOSYS | nix::errno::Errno::EINVAL) => {}
            Err(e) => return Err(io(e.into())),
        }
    }
    let zeros = vec![0u8; 64 * 1024];
    let mut off = start;
    while off < end {
        let n = ((end - off) as usize).min(zeros.len());
        f.write_all_at(&zeros[..n], off).map_err(io)?;
        off += n as u64;
    }
    f.sync_data().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_must_leave_the_headroom_free() {
        assert!(copy_fits(KEEP_DISCARDED_HEADROOM + 10, 10));
        assert!(!copy_fits(KEEP_DISCARDED_HEADROOM + 9, 10));
        assert!(!copy_fits(1 << 20, 3_000_000));
        assert!(!copy_fits(u64::MAX - 1, u64::MAX));
    }
}
