//! Segment files: naming, creation, discovery and positional reads.
//!
//! Segments are `{base_position:020}.log`, fallocated to the configured size at creation,
//! never recycled (docs/format.md §1-§2.2).

use super::column::AtomicColumn;
use super::header::{SegmentHeader, HEADER_LEN};
use super::record::{MARKER_LEN, RECORD_HEAD};
use super::LogError;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Geometry of segment files: total size (header included), the largest framed record and the
/// header size (always 64). There is no default: embedders choose the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Segment file size in bytes, header included (the server default is 256 MiB).
    pub segment_size: u64,
    /// Largest framed record (8-byte head + encoded event), `segment_size / 4` by default.
    pub max_record_len: u64,
    /// Header size in bytes: 64.
    pub header_size: u64,
}

impl SegmentConfig {
    /// A geometry of `size` bytes with `max_record_len = size / 4` and a 64-byte header.
    pub fn new(size: u64) -> SegmentConfig {
        SegmentConfig { segment_size: size, max_record_len: size / 4, header_size: HEADER_LEN as u64 }
    }

    /// Bytes available to records and markers: `segment_size - 64`.
    pub fn capacity(&self) -> u64 {
        self.segment_size - self.header_size
    }

    /// Checks the reference's limits: size above the header and at most `u32::MAX`, a 64-byte
    /// header, and room for one maximal record plus its commit marker.
    ///
    /// # Errors
    /// [`LogError::InvalidConfig`] with the reason.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |reason: String| Err(LogError::InvalidConfig { reason });
        if self.header_size != HEADER_LEN as u64 {
            return bad(format!("header size must be {HEADER_LEN}"));
        }
        if self.segment_size <= self.header_size || self.segment_size > u32::MAX as u64 {
            return bad(format!("segment size {} must be above {} and at most {}", self.segment_size, self.header_size, u32::MAX));
        }
        if self.max_record_len < (RECORD_HEAD as u64 + 5) || self.max_record_len + MARKER_LEN as u64 > self.capacity() {
            return bad(format!("max record length {} must fit a segment of {} bytes with its commit marker", self.max_record_len, self.segment_size));
        }
        Ok(())
    }

    /// Most data records one segment can hold (each at least 13 bytes).
    pub fn max_records(&self) -> usize {
        max_records_in(self.capacity())
    }
}

/// Most data records `capacity` bytes of a segment can hold (each at least 13 bytes).
fn max_records_in(capacity: u64) -> usize {
    (capacity / (RECORD_HEAD as u64 + 5)) as usize + 1
}

/// Most data records the segment file at `path` can hold, by its length.
fn records_in_file(path: &Path, cfg: &SegmentConfig) -> Result<usize, LogError> {
    let len = std::fs::metadata(path).map_err(|source| LogError::Io { path: path.to_owned(), source })?.len();
    Ok(max_records_in(len.saturating_sub(cfg.header_size)))
}

/// The file name of the segment starting at `base`.
pub fn segment_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// Parses a segment file name: exactly 20 ASCII digits then `.log`.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Lists `(base, path)` of the segment files in `dir`, ascending by base.
///
/// # Errors
/// [`LogError::Io`] when the directory cannot be listed.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|source| LogError::Io { path: dir.to_owned(), source })? {
        let e = e.map_err(|source| LogError::Io { path: dir.to_owned(), source })?;
        if let Some(base) = e.file_name().to_str().and_then(parse_segment_name) {
            v.push((base, e.path()));
        }
    }
    v.sort();
    Ok(v)
}

/// fsyncs a directory so a created or removed entry is durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(|source| LogError::Io { path: dir.to_owned(), source })
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Reserves `len` bytes of `f` from its start (`fallocate(2)`, mode 0), as every segment is
/// reserved at its full size (docs/format.md §2.1).
///
/// The fault site `segment_extend` stands just before the system call, and an error injected
/// there is explained as the system call's would be.
///
/// # Errors
/// The system call's (or the injected one), with `EOPNOTSUPP` explained
/// ([`explain_preallocate`]).
fn preallocate(f: &std::fs::File, len: u64) -> std::io::Result<()> {
    crate::fault::io_point("segment_extend")
        .and_then(|()| nix::fcntl::fallocate(std::os::fd::AsRawFd::as_raw_fd(f), nix::fcntl::FallocateFlags::empty(), 0, len as i64).map_err(Into::into))
        .map_err(explain_preallocate)
}

/// An `EOPNOTSUPP` from reserving a segment says what it means for the operator: the data
/// directory's file system cannot preallocate (new-user review: a bare "Operation not
/// supported (os error 95)" on ext2). Other errors are returned as they are.
fn explain_preallocate(e: std::io::Error) -> std::io::Error {
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return e;
    }
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("the data directory's file system cannot preallocate segment files (fallocate: {e}), which the log needs; ext2 and some network and FUSE file systems lack it: use ext4, xfs, btrfs or tmpfs"),
    )
}

/// Creates segment `base` durably: create, fallocate the full size, fsync, fsync the
/// directory, write the header, fsync again. On failure the partial file is removed
/// (best effort); a crash in between leaves a short or all-zero file that open removes.
///
/// # Errors
/// [`LogError::Io`], e.g. `ENOSPC` from fallocate.
pub fn create_segment(dir: &Path, base: u64, cfg: &SegmentConfig) -> Result<PathBuf, LogError> {
    let path = dir.join(segment_name(base));
    let io = |source: std::io::Error| LogError::Io { path: path.clone(), source };
    let result = (|| {
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(&path).map_err(io)?;
        preallocate(&f, cfg.segment_size).map_err(io)?;
        f.sync_all().map_err(io)?;
        sync_dir(dir)?;
        f.write_all_at(&new_header(base), 0).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&path);
        let _ = sync_dir(dir);
        return Err(e);
    }
    Ok(path)
}

/// Name of the spare segment file [`prepare_segment`] writes, in the data directory. Neither
/// server treats it as a segment (discovery matches only `{base:020}.log`, docs/format.md
/// §1); our writer removes a stale one when it opens the log.
pub const PREPARED_NAME: &str = "segment.prep";

/// Size of one zeroing write of [`zero_prepared`], in bytes. A commit's `fdatasync` waits
/// behind whatever zeros are queued at the disk, so smaller is kinder to commit latency
/// (this machine's virtio disk, 96 KiB write+sync commits beside an unthrottled zeroing
/// thread: p99 921 µs with 1 MiB chunks, 439 µs with 128 KiB, 230 µs with no zeroing), but the
/// zeroing thread runs at nice +10 in the idle I/O class and waits for a CPU after each write:
/// with 128 KiB chunks it zeroed only 100-150 MiB of each 256 MiB spare before the rollover at
/// 16 writers x batch 64, and the commits past that point wrote in 345 µs and synced in
/// 188 µs instead of 201 and 133. With 512 KiB it zeroes the whole spare: `tephra-bench
/// compare` 512 KiB against 128 KiB, 4 alternated rounds x 10 s: 16 x 64 1.08× events/s
/// (every round faster), p99 1.66 vs 1.75 ms; 16 x 512 0.98×, p99 4.85 vs 4.84 ms, p99.9 8.7
/// vs 6.9 ms.
pub const PREPARE_CHUNK: usize = 512 << 10;

/// How long a [`zero_prepared`] told to hold sleeps before asking again.
const ZERO_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Creates the spare segment file for a later rollover: `segment_size` bytes reserved with
/// `fallocate` (read back as zeros, docs/format.md §2.1) and synced, under
/// [`PREPARED_NAME`]. It is usable by [`claim_prepared`] as soon as this returns; a
/// [`zero_prepared`] afterwards only makes appends into it cheaper. A spare left over from an
/// earlier run is replaced.
///
/// # Errors
/// [`LogError::Io`] naming the file (ENOSPC at the `fallocate`); the partial file is removed.
pub fn prepare_segment(dir: &Path, cfg: &SegmentConfig) -> Result<PathBuf, LogError> {
    let path = dir.join(PREPARED_NAME);
    let io = |source: std::io::Error| LogError::Io { path: path.clone(), source };
    let _ = std::fs::remove_file(&path);
    let result = (|| {
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(&path).map_err(io)?;
        preallocate(&f, cfg.segment_size).map_err(io)?;
        f.sync_all().map_err(io)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// Writes zeros over the spare at `path` (from [`prepare_segment`]), front to back in
/// [`PREPARE_CHUNK`] O_DIRECT writes, so its blocks become *initialised*: appends into them are
/// then plain overwrites. On ext4 an O_DIRECT write into a fallocated (unwritten) extent must
/// convert the extent when it completes and `fdatasync` must then persist the extent tree,
/// while an overwrite needs neither (this machine's virtio disk, 96 KiB commits: write 66 vs
/// 161 µs, sync 44 vs 91 µs at p50; 16 writers x batch 64: about 6% more events/s).
///
/// It is an optimisation only, so it gives way: before each write it asks `hold()`, and while
/// that says true (the caller's view that the disk is busy) it sleeps 1 ms and asks again; it
/// returns as soon as `stop` is set. Returns the bytes zeroed. The zeros are not synced:
/// the file's reads are zeros either way, and the segment's first commit syncs the file
/// before [`name_prepared`] makes it a segment. Only whole blocks are written (a partial last block stays reserved).
///
/// # Errors
/// [`LogError::Io`] naming the file. The spare stays usable after a failed write (the range
/// reads as zeros, written or not).
pub fn zero_prepared(path: &Path, cfg: &SegmentConfig, stop: &std::sync::atomic::AtomicBool, hold: &mut dyn FnMut() -> bool) -> Result<u64, LogError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source: std::io::Error| LogError::Io { path: path.to_owned(), source };
    let f = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).map_err(io)?;
    let zeros = super::aligned::AlignedBuf::zeroed(PREPARE_CHUNK);
    let direct_end = cfg.segment_size & !(super::aligned::BLOCK as u64 - 1);
    let mut off = 0u64;
    while off < direct_end && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if hold() {
            std::thread::sleep(ZERO_POLL);
            continue;
        }
        let n = (direct_end - off).min(PREPARE_CHUNK as u64) as usize;
        f.write_all_at(&zeros.as_slice()[..n], off).map_err(io)?;
        off += n as u64;
    }
    Ok(off)
}

/// Checks that the spare at `prepared` (from [`prepare_segment`]) can become segment `base`:
/// it has exactly `segment_size` bytes, no segment of that name exists, and `dir` can be
/// written (`access(W_OK)`: an immutable or read-only directory, or changed permissions, is
/// found here, while the caller can still fall back, instead of at the naming, where a failure
/// is fail-stop; review). Returns the
/// segment's path, `{base:020}.log`. Nothing is written: the writer then writes the header
/// (docs/format.md §2.1) as the first bytes of the segment's first commit, and once that
/// commit is durable [`name_prepared`] gives the file its name. A crash in between leaves only
/// the spare, which no server reads as a segment.
///
/// # Errors
/// [`LogError::Io`] naming the spare: unreadable, the wrong size, or the name already taken;
/// naming `dir` when it cannot be written.
pub fn claim_prepared(dir: &Path, prepared: &Path, base: u64, cfg: &SegmentConfig) -> Result<PathBuf, LogError> {
    let path = dir.join(segment_name(base));
    let io = |source: std::io::Error| LogError::Io { path: prepared.to_owned(), source };
    let len = std::fs::metadata(prepared).map_err(io)?.len();
    if len != cfg.segment_size {
        return Err(io(std::io::Error::other(format!("prepared segment has {len} bytes, expected {}", cfg.segment_size))));
    }
    if path.try_exists().map_err(io)? {
        return Err(io(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{} already exists", path.display()))));
    }
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).map_err(|e| LogError::Io { path: dir.to_owned(), source: e.into() })?;
    Ok(path)
}

/// Renames the spare at `prepared`, whose header and first records are durable, to the
/// segment `path` from [`claim_prepared`] (never over an existing file) and syncs the
/// directory: from then on the segment survives a crash. A failed rename leaves the spare as
/// it was; `retry` is asked whether to try again (it may wait first).
///
/// # Errors
/// [`LogError::Io`] naming the spare: the rename failed and `retry` said no (the spare
/// stays), or the directory sync failed (the new name is removed again, so that nothing
/// unsynced poses as a segment).
pub fn name_prepared(dir: &Path, prepared: &Path, path: &Path, retry: &mut dyn FnMut(&std::io::Error) -> bool) -> Result<(), LogError> {
    let io = |source: std::io::Error| LogError::Io { path: prepared.to_owned(), source };
    loop {
        let renamed = crate::fault::io_point("segment_naming")
            .and_then(|()| nix::fcntl::renameat2(None, prepared, None, path, nix::fcntl::RenameFlags::RENAME_NOREPLACE).map_err(std::io::Error::from));
        match renamed {
            Ok(()) => break,
            Err(e) if retry(&e) => {}
            Err(e) => return Err(io(e)),
        }
    }
    // Opening the directory may be retried (`retry`: out of descriptors, say); its sync never
    // is, since a failed fsync may have dropped what it was to persist.
    let synced = loop {
        match File::open(dir) {
            Ok(f) => break f.sync_all().map_err(|source| LogError::Io { path: dir.to_owned(), source }),
            Err(e) if retry(&e) => {}
            Err(source) => break Err(LogError::Io { path: dir.to_owned(), source }),
        }
    };
    if let Err(e) = synced {
        let _ = std::fs::remove_file(path);
        let _ = sync_dir(dir);
        return Err(e);
    }
    Ok(())
}

/// The 64-byte header of a new segment starting at `base`, stamped now (docs/format.md
/// §2.1).
pub fn new_header(base: u64) -> [u8; HEADER_LEN] {
    SegmentHeader { created_at_nanos: now_nanos(), base_position: base }.encode()
}

/// What ties a derived file (a sealed index) to one segment's content: CRC-32 over the
/// segment's 64-byte header (its base and creation time) followed by the 4-byte CRC field of
/// each committed data record, in position order. Cheap to keep (4 bytes per record, no payload
/// read) and different for a segment of another log, or one recreated with the same base.
#[derive(Clone, Default)]
pub struct Fingerprint(crc32fast::Hasher);

impl Fingerprint {
    /// Starts from the segment's header bytes.
    pub fn new(header: &[u8]) -> Fingerprint {
        let mut h = crc32fast::Hasher::new();
        h.update(header);
        Fingerprint(h)
    }

    /// Adds a committed data record, given its framed bytes (`len`, `crc`, data).
    pub fn record(&mut self, framed: &[u8]) {
        self.0.update(super::record::crc_field(framed));
    }

    /// The fingerprint so far.
    pub fn value(&self) -> u32 {
        self.0.clone().finalize()
    }
}

/// One segment as readers see it: its base, a read-only handle and its record offsets.
pub struct Segment {
    /// First position stored in the segment.
    pub base: u64,
    /// Path of the `.log` file.
    pub path: PathBuf,
    /// Read-only descriptor used for positional reads from any thread.
    pub file: File,
    /// Byte offset of each record, by local position.
    pub offsets: AtomicColumn,
}

impl Segment {
    /// Opens a read handle on an existing segment file. Its offsets table holds as many
    /// records as the larger of the configured size and the file can: a segment written with a
    /// larger `segment.size` than the one configured now is read whole (review: a store written
    /// with 1 MiB segments and reopened with 64 KiB ones panicked at open).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn open(base: u64, path: PathBuf, cfg: &SegmentConfig) -> Result<Segment, LogError> {
        let records = cfg.max_records().max(records_in_file(&path, cfg)?);
        Segment::open_sealed(base, path, records)
    }

    /// Opens a read handle on a sealed segment (one that will not grow) whose tables hold
    /// `records` records: what its recovery walk counted. Sizing every segment of a store for
    /// the configured size instead cost memory in proportion to segments × `segment.size`
    /// (review: 14,577 segments of 64 KiB opened with 256 MiB configured took 1.86 GB and 2.5 s,
    /// with 1 GiB 7 GB).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn open_sealed(base: u64, path: PathBuf, records: usize) -> Result<Segment, LogError> {
        let io = |source: std::io::Error| LogError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        Ok(Segment { base, path, file, offsets: AtomicColumn::new(records.max(1)) })
    }

    /// Opens a read handle on a segment sized by its file alone (as many records as its length
    /// can hold), for one known to be sealed before its records are counted (a follower's).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn open_by_length(base: u64, path: PathBuf, cfg: &SegmentConfig) -> Result<Segment, LogError> {
        let records = records_in_file(&path, cfg)?;
        Segment::open_sealed(base, path, records)
    }

    /// Most records this segment's tables hold (see [`Segment::open`]).
    pub fn max_records(&self) -> usize {
        self.offsets.capacity()
    }

    /// Reads up to `buf.len()` bytes at `off`, returning how many were read (short at EOF).
    ///
    /// # Errors
    /// The I/O error of `pread`.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Like [`read_at`](Self::read_at), but only what the page cache holds: one
    /// `preadv2(RWF_NOWAIT)`, which never waits for the disk. Returns the bytes read from the
    /// start of the range (fewer than asked when the rest is not cached, or at EOF).
    ///
    /// # Errors
    /// `WouldBlock` when the first byte is not cached; `Unsupported`-like errors (`EOPNOTSUPP`,
    /// `EINVAL`) from kernels or file systems without `RWF_NOWAIT` for buffered reads; any other
    /// error of `preadv2`.
    pub fn read_cached_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        loop {
            // SAFETY: `iov` describes `buf`, writable for its whole length, and outlives the
            // call; the descriptor is this segment's open file.
            let n = unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, off as libc::off_t, libc::RWF_NOWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen::scratch;

    /// What the writer does with a spare at a rollover: claim it, write the header (with the
    /// first commit's records, none here) and sync, then name it.
    fn adopt(dir: &Path, spare: &Path, base: u64, cfg: &SegmentConfig) -> Result<PathBuf, LogError> {
        let path = claim_prepared(dir, spare, base, cfg)?;
        let f = OpenOptions::new().write(true).open(spare).unwrap();
        f.write_all_at(&new_header(base), 0).unwrap();
        f.sync_data().unwrap();
        name_prepared(dir, spare, &path, &mut |_| false)?;
        Ok(path)
    }

    #[test]
    fn a_spare_segment_becomes_exactly_what_create_segment_makes() {
        let d = scratch();
        let cfg = SegmentConfig::new(3 * 4096 + 100);
        let spare = prepare_segment(d.path(), &cfg).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        assert_eq!(zero_prepared(&spare, &cfg, &stop, &mut || false).unwrap(), 3 * 4096, "whole blocks only");
        assert_eq!(spare, d.path().join(PREPARED_NAME));
        assert_eq!(parse_segment_name(PREPARED_NAME), None, "the spare must never look like a segment");
        let bytes = std::fs::read(&spare).unwrap();
        assert_eq!(bytes.len() as u64, cfg.segment_size);
        assert!(bytes.iter().all(|&b| b == 0));
        let adopted = adopt(d.path(), &spare, 7, &cfg).unwrap();
        assert_eq!(adopted, d.path().join(segment_name(7)));
        assert!(!spare.exists());
        let created = create_segment(d.path(), 8, &cfg).unwrap();
        let (a, c) = (std::fs::read(&adopted).unwrap(), std::fs::read(&created).unwrap());
        assert_eq!(a.len(), c.len());
        // Same layout: a header naming the base, then zeros (the creation time differs).
        let (ha, hc) = (SegmentHeader::decode(&a[..HEADER_LEN]).unwrap(), SegmentHeader::decode(&c[..HEADER_LEN]).unwrap());
        assert_eq!((ha.base_position, hc.base_position), (7, 8));
        assert_eq!(a[HEADER_LEN..], c[HEADER_LEN..]);
    }

    #[test]
    fn adopting_refuses_a_wrong_size_and_never_replaces_a_segment() {
        let d = scratch();
        let cfg = SegmentConfig::new(8192);
        let spare = prepare_segment(d.path(), &cfg).unwrap();
        assert!(claim_prepared(d.path(), &spare, 1, &SegmentConfig::new(16384)).is_err());
        let claimed = claim_prepared(d.path(), &spare, 1, &cfg).unwrap();
        // A segment of that name appears between the claim and the naming: it is kept.
        let existing = create_segment(d.path(), 1, &cfg).unwrap();
        assert_eq!(claimed, existing);
        let before = std::fs::read(&existing).unwrap();
        assert!(claim_prepared(d.path(), &spare, 1, &cfg).is_err(), "claimed an existing segment's name");
        assert!(name_prepared(d.path(), &spare, &existing, &mut |_| false).is_err(), "named over an existing segment");
        assert_eq!(std::fs::read(&existing).unwrap(), before);
        assert!(spare.exists(), "a refused spare stays for the caller");
    }

    #[test]
    fn zeroing_holds_and_stops_when_told_and_leaves_a_usable_spare() {
        let d = scratch();
        let chunk = PREPARE_CHUNK as u64;
        let cfg = SegmentConfig::new(8 * chunk);
        let spare = prepare_segment(d.path(), &cfg).unwrap();
        assert_eq!(std::fs::metadata(&spare).unwrap().len(), 8 * chunk, "reserved in full before any zero is written");
        // Three chunks go (asked before each write); then told to hold, asked twice (it waits
        // in between), the caller says stop.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut asked = 0;
        let zeroed = zero_prepared(&spare, &cfg, &stop, &mut || {
            asked += 1;
            if asked == 5 {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            asked > 3
        })
        .unwrap();
        assert_eq!((zeroed, asked), (3 * chunk, 5));
        // Stopped before the first write: nothing more is written.
        assert_eq!(zero_prepared(&spare, &cfg, &stop, &mut || false).unwrap(), 0);
        // Half-zeroed, it still becomes a whole segment that reads as zeros after its header.
        let seg = adopt(d.path(), &spare, 1, &cfg).unwrap();
        let bytes = std::fs::read(&seg).unwrap();
        assert_eq!(bytes.len() as u64, 8 * chunk);
        assert!(bytes[HEADER_LEN..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_failed_reservation_leaves_no_spare() {
        let d = scratch();
        // A segment size fallocate refuses (beyond any file size the file system allows).
        assert!(prepare_segment(d.path(), &SegmentConfig::new(u64::MAX / 2)).is_err());
        assert!(!d.path().join(PREPARED_NAME).exists());
    }

    #[test]
    fn names() {
        assert_eq!(segment_name(1), "00000000000000000001.log");
        assert_eq!(parse_segment_name("00000000000000000109.log"), Some(109));
        assert_eq!(parse_segment_name("0000000000000000109.log"), None);
        assert_eq!(parse_segment_name("0000000000000000010a.log"), None);
        assert_eq!(parse_segment_name("00000000000000000109.idx"), None);
    }

    #[test]
    fn config_limits() {
        SegmentConfig::new(4096).validate().unwrap();
        assert_eq!(SegmentConfig::new(4096).max_record_len, 1024);
        assert!(SegmentConfig::new(64).validate().is_err());
        assert!(SegmentConfig::new(u32::MAX as u64 + 1).validate().is_err());
        let mut c = SegmentConfig::new(4096);
        c.max_record_len = 4096;
        assert!(c.validate().is_err());
    }
}
