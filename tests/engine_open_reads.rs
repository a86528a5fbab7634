//! What opening a store reads: the data of its segments, not their reserved, never-written
//! remainder. Reading the reservation filled the page cache with zeroed pages, 0.6 s of a new
//! server's first start with 256 MiB segments (issue 33, item 8). The property is checked by
//! the pages the open leaves in the page cache (`mincore`), never by a time.

mod engine_util;

use engine_util::*;
use std::os::fd::AsRawFd;
use std::path::Path;
use tephra::*;

/// Segment size of these tests: 256 MiB (the server's default), 65,536 pages.
const SIZE: u64 = 256 << 20;

/// At most this many of a new segment's pages may be cached after the open that created it:
/// the header's (written, so cached, when the segment was created).
const FEW_PAGES: usize = 8;

/// At most this many of a segment's pages may be cached after a cold open of a store holding
/// a few small events: the pages of their data, plus the kernel's read-ahead around them,
/// which reads up to one window (the device's `read_ahead_kb`: 128 KiB by default, 8 MiB on
/// some virtual disks) past the data. An eighth of the segment: 32 MiB.
const COLD_PAGES: usize = (SIZE / 4096 / 8) as usize;

/// Pages of the file at `path` that the page cache holds.
fn cached_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    // SAFETY: a shared read-only map of a file nothing writes meanwhile, never dereferenced:
    // only asked of the kernel which of its pages are in memory.
    unsafe {
        let at = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(at, libc::MAP_FAILED);
        let mut vec = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(at, len, vec.as_mut_ptr()), 0);
        libc::munmap(at, len);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }
}

/// Drops the file's clean pages from the page cache: the next open finds it cold.
fn drop_cached(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a plain system call on an open descriptor.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// True when the file system of `dir` reports a reserved, never-written range as a hole
/// (`SEEK_DATA` past a file's written first page finds nothing); where it does not, an open
/// has to read the whole file and there is nothing to check. Asked of a file of its own: an
/// open that read the reservation leaves it cached, which ext4 then reports as data.
fn holes_reported(dir: &Path) -> bool {
    let path = dir.join("holes-probe");
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 0).unwrap();
    // SAFETY: plain system calls on an open descriptor.
    let reported = unsafe {
        libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) == 0 && libc::fsync(f.as_raw_fd()) == 0 && libc::lseek(f.as_raw_fd(), 4096, libc::SEEK_DATA) < 0
    };
    std::fs::remove_file(&path).unwrap();
    reported
}

#[test]
fn opening_reads_the_data_of_the_active_segment_not_its_reservation() {
    let d = dir();
    if !holes_reported(d.path()) {
        eprintln!("skipped: the file system of {} does not report unwritten extents as holes", d.path().display());
        return;
    }
    // A new store: the open creates the first segment and walks it.
    let store = Store::open(d.path(), cfg(SIZE)).unwrap();
    let seg = segments(d.path()).remove(0);
    let cached = cached_pages(&seg);
    assert!(cached <= FEW_PAGES, "a new store's open left {cached} of the segment's {} pages cached", SIZE / 4096);
    for i in 0..20 {
        store.handle().append(vec![ev("t", &["a"], format!("event {i}").as_bytes())], None).unwrap();
    }
    store.shutdown();
    // Reopened with the segment out of the cache: its data is read back (and what the
    // read-ahead takes along), not the reservation.
    drop_cached(&seg);
    let store = Store::open(d.path(), cfg(SIZE)).unwrap();
    let cached = cached_pages(&seg);
    assert!(cached <= COLD_PAGES, "reopening a store of 20 small events left {cached} of the segment's {} pages cached", SIZE / 4096);
    assert_eq!(read_all(&store.handle()).len(), 20);
    store.shutdown();
}

#[test]
fn a_torn_tail_after_the_data_is_still_rolled_back() {
    // The tail past the last commit marker is still judged: an unacknowledged record written
    // after the last batch (data, though no marker follows it) is rolled back and zeroed.
    let d = dir();
    let store = Store::open(d.path(), cfg(SIZE)).unwrap();
    store.handle().append(vec![ev("t", &["a"], b"kept")], None).unwrap();
    store.shutdown();
    let seg = segments(d.path()).remove(0);
    let end = tephra::log::record::walk(&std::fs::read(&seg).unwrap(), tephra::log::header::HEADER_LEN).committed_end;
    // A data record head and part of its payload: a batch torn before its marker.
    let torn = [9u8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7];
    std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&seg).unwrap(), &torn, end as u64).unwrap();
    let store = Store::open(d.path(), cfg(SIZE)).unwrap();
    assert!(matches!(store.open_outcome(), tephra::log::OpenOutcome::RolledBack { .. }), "{:?}", store.open_outcome());
    assert_eq!(read_all(&store.handle()).len(), 1);
    store.shutdown();
    let bytes = std::fs::read(&seg).unwrap();
    assert!(bytes[end..].iter().all(|&b| b == 0), "the torn tail was not zeroed");
}
