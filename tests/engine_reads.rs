//! Reads and subscriptions (docs/protocol.md §2.2, docs/architecture.md §5): stateless pagination in both
//! directions tiles the matches with no gap or duplicate, reads are pinned to the watermark
//! loaded when they start, and a subscription's catch-up and live phases meet with no gap or
//! duplicate while a writer appends concurrently.

mod engine_util;

use engine_util::*;
use std::time::{Duration, Instant};
use tephra::*;

const TYPES: &[&str] = &["A", "B", "C"];
const TAGS: &[&str] = &["t0", "t1", "t2", "t3"];

fn random_event(rng: &mut Rng, i: u64) -> Event {
    let ty = TYPES[rng.below(3) as usize];
    let mut tags: Vec<String> = TAGS.iter().filter(|_| rng.chance(1, 3)).map(|t| t.to_string()).collect();
    tags.push(format!("n:{i}"));
    let payload: Vec<u8> = (0..rng.below(40)).map(|k| (k + i) as u8).collect();
    Event::new(&EventType::new(ty).unwrap(), &Tags::new(tags).unwrap(), &payload).unwrap()
}

fn random_query(rng: &mut Rng) -> Query {
    match rng.below(8) {
        0 => Query::all(),
        1 => Query::none(),
        _ => Query::items(
            (0..1 + rng.below(2))
                .map(|_| {
                    let types = TYPES.iter().filter(|_| rng.chance(1, 3)).map(|t| EventType::new(*t).unwrap()).collect();
                    let tags = Tags::new(TAGS.iter().filter(|_| rng.chance(1, 4)).copied()).unwrap();
                    QueryItem::new(types, tags)
                })
                .collect(),
        ),
    }
}

/// Positions of `log` (index 0 = position 1) that match `q`.
fn oracle(log: &[Event], q: &Query) -> Vec<u64> {
    log.iter().enumerate().filter(|(_, e)| q.matches(&e.as_ref())).map(|(i, _)| i as u64 + 1).collect()
}

fn positions(r: Reads) -> Vec<u64> {
    r.collect_owned().unwrap().into_iter().map(|(p, _)| p.get()).collect()
}

/// The positions of pages of at most 7 taken by `read` until one is empty, each page starting
/// from the last position of the one before (`start` for the first).
fn pages_of_7(start: Position, mut read: impl FnMut(Position) -> Vec<u64>) -> Vec<u64> {
    let mut got = Vec::new();
    let mut from = start;
    loop {
        let page = read(from);
        assert!(page.len() <= 7);
        let Some(&last) = page.last() else { break };
        got.extend(page);
        from = Position(last);
    }
    got
}

/// A store of `n` random events in small segments (appended in batches of 1..=4).
fn populated(d: &std::path::Path, rng: &mut Rng, n: u64) -> (Store, Vec<Event>) {
    let s = Store::open(d, cfg(2048)).unwrap();
    let h = s.handle();
    let mut log = Vec::new();
    while (log.len() as u64) < n {
        let k = 1 + rng.below(4);
        let batch: Vec<Event> = (0..k).map(|j| random_event(rng, log.len() as u64 + j + 1)).collect();
        h.append(batch.clone(), None).unwrap();
        log.extend(batch);
    }
    assert!(h.stats().segment_count > 1, "want several segments");
    (s, log)
}

#[test]
fn pagination_tiles_without_gap_or_duplicate_in_both_directions() {
    let d = dir();
    let mut rng = Rng::from_time("pagination");
    let (s, log) = populated(d.path(), &mut rng, 150);
    assert!(s.handle().stats().segment_count > 3);
    let h = s.handle();
    let head = log.len() as u64;
    for round in 0..40 {
        let q = random_query(&mut rng);
        let want = oracle(&log, &q);
        // Whole reads, with the events themselves.
        let fwd = h.read(q.clone(), Position::ZERO, None).collect_owned().unwrap();
        assert_eq!(fwd.iter().map(|(p, _)| p.get()).collect::<Vec<_>>(), want, "round {round} {q:?}");
        for (p, e) in &fwd {
            assert_eq!(e.as_bytes(), log[(p.get() - 1) as usize].as_bytes());
        }
        let mut rev = want.clone();
        rev.reverse();
        assert_eq!(positions(h.read_back(q.clone(), Position::MAX, None)), rev, "round {round} {q:?}");
        // Pages of 7, forward: the next `after` is the last position received.
        let got = pages_of_7(Position::ZERO, |after| positions(h.read(q.clone(), after, Some(7))));
        assert_eq!(got, want, "forward pages, round {round} {q:?}");
        // Pages of 7, backward: the next `before` is the oldest position received.
        let got = pages_of_7(Position::MAX, |before| positions(h.read_back(q.clone(), before, Some(7))));
        assert_eq!(got, rev, "backward pages, round {round} {q:?}");
        // Arbitrary bounds and limits.
        let after = rng.below(head + 3);
        let before = rng.below(head + 3);
        let limit = rng.below(12);
        let f: Vec<u64> = want.iter().copied().filter(|&p| p > after).take(limit as usize).collect();
        assert_eq!(positions(h.read(q.clone(), Position(after), Some(limit))), f, "after {after} limit {limit} {q:?}");
        let b: Vec<u64> = rev.iter().copied().filter(|&p| p < before).take(limit as usize).collect();
        assert_eq!(positions(h.read_back(q.clone(), Position(before), Some(limit))), b, "before {before} limit {limit} {q:?}");
    }
    // Edges: a zero limit, before = 0, after at or past the tip, Query::none.
    assert!(positions(h.read(Query::all(), Position::ZERO, Some(0))).is_empty());
    assert!(positions(h.read_back(Query::all(), Position::MAX, Some(0))).is_empty());
    assert!(positions(h.read_back(Query::all(), Position::ZERO, None)).is_empty());
    assert_eq!(positions(h.read_back(Query::all(), Position(1), None)), Vec::<u64>::new());
    assert_eq!(positions(h.read_back(Query::all(), Position(2), None)), vec![1]);
    assert_eq!(positions(h.read_back(Query::all(), Position::MAX, Some(1))), vec![head]);
    assert_eq!(positions(h.read_back(Query::all(), Position(head + 100), Some(2))), vec![head, head - 1]);
    assert!(positions(h.read(Query::all(), Position(head), None)).is_empty());
    assert!(positions(h.read(Query::all(), Position::MAX, None)).is_empty());
    assert!(positions(h.read(Query::none(), Position::ZERO, None)).is_empty());
    assert!(positions(h.read_back(Query::none(), Position::MAX, None)).is_empty());
}

#[test]
fn an_empty_store_reads_nothing() {
    let d = dir();
    let s = Store::open(d.path(), cfg(2048)).unwrap();
    let h = s.handle();
    assert!(positions(h.read(Query::all(), Position::ZERO, None)).is_empty());
    assert!(positions(h.read_back(Query::all(), Position::MAX, None)).is_empty());
    let mut sub = h.subscribe(Query::all(), Position::ZERO);
    assert_eq!(sub.poll_batch(10, |_, _| panic!("nothing to deliver")).unwrap(), 0);
    assert_eq!(sub.wait_timeout(Duration::from_millis(20)), WaitOutcome::TimedOut);
}

#[test]
fn large_records_read_back_across_segments_in_both_directions() {
    // Records from a few bytes to most of a quarter segment exercise the read windows.
    let d = dir();
    let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
    let h = s.handle();
    let mut rng = Rng::new(3);
    let mut log = Vec::new();
    for i in 0..40u64 {
        let len = [10usize, 5_000, 70_000, 200_000, 262_000][rng.below(5) as usize];
        let payload: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + i) as u8).collect();
        let e = ev("Big", &[&format!("n:{i}")], &payload);
        h.append(vec![e.clone()], None).unwrap();
        log.push(e);
    }
    assert!(h.stats().segment_count >= 3);
    let fwd = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    let back = h.read_back(Query::all(), Position::MAX, None).collect_owned().unwrap();
    assert_eq!(fwd.len(), log.len());
    assert_eq!(back.len(), log.len());
    for (p, e) in fwd.iter().chain(back.iter()) {
        assert_eq!(e.as_bytes(), log[(p.get() - 1) as usize].as_bytes(), "position {p}");
    }
    assert!(back.windows(2).all(|w| w[0].0.get() == w[1].0.get() + 1));
}

/// Reads of freshly committed events are served from the committed batches kept in memory;
/// after a reopen the same reads come from the files. Both must give exactly the appended
/// events, and so must reads that cross from file-backed to memory-backed batches (appends
/// after the reopen), in both directions and for selective queries.
#[test]
fn reads_from_memory_and_from_the_files_agree() {
    let d = dir();
    let mut rng = Rng::new(11);
    let mut log = Vec::new();
    let append = |h: &StoreHandle, rng: &mut Rng, log: &mut Vec<Event>, n: usize| {
        for _ in 0..n {
            let k = 1 + rng.below(6);
            let batch: Vec<Event> = (0..k)
                .map(|j| {
                    let i = log.len() as u64 + j + 1;
                    let len = [0usize, 40, 3_000, 30_000][rng.below(4) as usize];
                    let payload: Vec<u8> = (0..len).map(|b| (b as u64 * 13 + i) as u8).collect();
                    ev(TYPES[rng.below(3) as usize], &[&format!("n:{i}"), TAGS[rng.below(4) as usize]], &payload)
                })
                .collect();
            h.append(batch.clone(), None).unwrap();
            log.extend(batch);
        }
    };
    let check = |h: &StoreHandle, log: &[Event], rng: &mut Rng, when: &str| {
        let fwd = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
        let back = h.read_back(Query::all(), Position::MAX, None).collect_owned().unwrap();
        assert_eq!(fwd.len(), log.len(), "{when}: forward count");
        assert_eq!(back.len(), log.len(), "{when}: backward count");
        for (p, e) in fwd.iter().chain(back.iter()) {
            assert_eq!(e.as_bytes(), log[(p.get() - 1) as usize].as_bytes(), "{when}: position {p}");
        }
        for _ in 0..20 {
            let q = random_query(rng);
            assert_eq!(positions(h.read(q.clone(), Position::ZERO, None)), oracle(log, &q), "{when}: {q:?}");
        }
    };
    let s = Store::open(d.path(), cfg(256 << 10)).unwrap();
    append(&s.handle(), &mut rng, &mut log, 150);
    assert!(s.handle().stats().segment_count >= 3, "want several segments");
    check(&s.handle(), &log, &mut rng, "live");
    s.shutdown();
    let s = Store::open(d.path(), cfg(256 << 10)).unwrap();
    check(&s.handle(), &log, &mut rng, "reopened");
    append(&s.handle(), &mut rng, &mut log, 60);
    check(&s.handle(), &log, &mut rng, "reopened, then appended");
}

/// Drops the segment files of `dir` from the page cache (they are clean: synced first), and
/// again until `mincore` finds none of their pages resident: pages still being read ahead
/// (the store's open reads the active segment) land after a first drop (seen once in 460
/// tests on a busy machine: the read then never met a cold record).
fn evict_page_cache(dir: &std::path::Path) {
    for p in segments(dir) {
        let f = std::fs::File::open(&p).unwrap();
        f.sync_all().unwrap();
        for attempt in 0.. {
            nix::fcntl::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
            if resident_pages(&f) == 0 {
                break;
            }
            assert!(attempt < 100, "{} stays in the page cache", p.display());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// How many of `f`'s pages are in the page cache (`mincore` over a read-only mapping).
fn resident_pages(f: &std::fs::File) -> usize {
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    // SAFETY: a read-only shared mapping of a file the test owns; only its residency is asked.
    let map = unsafe { memmap2::Mmap::map(f) }.unwrap();
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `vec` has a byte for every page of the mapping.
    assert_eq!(unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) }, 0);
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

/// Runs a read made not to wait to its end, fetching each range it stops at (then `changed`,
/// a hook run after the fetch) and handing it back; returns the events and the stops.
fn drain_fetching(r: &mut Reads, budget_per_step: usize, mut changed: impl FnMut()) -> (Vec<(u64, Event)>, usize) {
    let (mut got, mut blocked) = (Vec::new(), 0);
    loop {
        let mut budget = budget_per_step;
        match r.step(&mut budget) {
            Step::Event(p, e) => got.push((p.get(), e.to_owned())),
            Step::Pending => {}
            Step::End => return (got, blocked),
            Step::Failed(e) => panic!("{e}"),
            Step::Blocked(mut warm) => {
                blocked += 1;
                warm.run();
                changed();
                r.fetched(warm);
            }
        }
        assert!(blocked < 100_000, "no progress");
    }
}

/// A read made not to wait (the server's: its thread serves other connections) stops at a
/// record that only the disk holds with `Step::Blocked`; once that range is fetched
/// (`ColdRange::run`, on a thread that may block) it resumes where it stopped. Together the
/// steps give exactly what a waiting read gives, forward and backward, scanned and indexed,
/// from a cold page cache; a subscription made not to wait delivers every event too. (Needs a
/// file system with non-blocking buffered reads, `RWF_NOWAIT`: ext4, xfs, btrfs.)
#[test]
fn reads_made_not_to_wait_stop_at_cold_records_and_resume_where_they_stopped() {
    let d = dir();
    let mut rng = Rng::new(5);
    let (s, log) = populated(d.path(), &mut rng, 3000);
    s.shutdown();
    // Reopened, with every read taking the index (scan_bias 1) or scanning (u32::MAX): nothing
    // in memory, and the files dropped from the page cache below.
    let (mut blocked_scans, mut blocked_indexed) = (0, 0);
    for bias in [u32::MAX, 1] {
        let mut c = cfg(2048);
        c.read.scan_bias = bias;
        let s = Store::open(d.path(), c).unwrap();
        let h = s.handle();
        for round in 0..12 {
            let q = if round < 2 { Query::all() } else { random_query(&mut rng) };
            for back in [false, true] {
                evict_page_cache(d.path());
                let mut r = if back { h.read_back(q.clone(), Position::MAX, None) } else { h.read(q.clone(), Position::ZERO, None) }.without_waiting();
                let indexed = r.is_indexed();
                let (events, blocked) = drain_fetching(&mut r, 100, || {});
                let got: Vec<u64> = events.into_iter().map(|(p, _)| p).collect();
                let mut want = oracle(&log, &q);
                if back {
                    want.reverse();
                }
                assert_eq!(got, want, "query {q:?} backward {back} indexed {indexed}");
                *(if indexed { &mut blocked_indexed } else { &mut blocked_scans }) += blocked;
            }
        }
        s.shutdown();
    }
    assert!(
        blocked_scans > 0 && blocked_indexed > 0,
        "reads met records outside the page cache: {blocked_scans} times scanning, {blocked_indexed} by the index"
    );
    let s = Store::open(d.path(), cfg(2048)).unwrap();
    let h = s.handle();
    evict_page_cache(d.path());
    let mut sub = h.subscribe(Query::all(), Position::ZERO).without_waiting();
    let (mut got, mut blocked) = (Vec::new(), 0);
    loop {
        let mut budget = usize::MAX;
        let polled = sub.poll_within(64, &mut budget, |p, _| got.push(p.get())).unwrap();
        match sub.take_cold_range() {
            Some(mut warm) => {
                blocked += 1;
                warm.run();
                sub.fetched(warm);
            }
            None if polled.caught_up => break,
            None => {}
        }
    }
    assert_eq!(got, (1..=log.len() as u64).collect::<Vec<_>>());
    assert!(blocked > 0, "the subscription never met a cold record");
    s.shutdown();

    // A record of several MB, read cold.
    let d = dir();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let events = [ev("Small", &["a"], b"x"), ev("Big", &["b"], &big), ev("Small", &["c"], b"y")];
    let s = Store::open(d.path(), cfg(16 << 20)).unwrap();
    s.handle().append(events.to_vec(), None).unwrap();
    s.shutdown();
    let s = Store::open(d.path(), cfg(16 << 20)).unwrap();
    evict_page_cache(d.path());
    let mut r = s.handle().read(Query::all(), Position::ZERO, None).without_waiting();
    let (got, blocked) = drain_fetching(&mut r, usize::MAX, || {});
    assert!(blocked > 0);
    assert_eq!(got.iter().map(|(_, e)| e.as_bytes()).collect::<Vec<_>>(), events.iter().map(|e| e.as_bytes()).collect::<Vec<_>>());
}

/// After a `Step::Blocked`, the read resumes from the bytes its fetch read, not from the file
/// again: the page cache may have dropped them in between, and a re-read would then wait for
/// the disk on the server's shard thread. Shown by changing the file after the fetch: the
/// events still come back intact.
#[test]
fn a_blocked_read_resumes_from_the_fetched_bytes_not_the_file() {
    let d = dir();
    let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
    let events: Vec<Event> = (0..100u32).map(|i| ev("E", &[&format!("n:{i}")], &i.to_be_bytes())).collect();
    s.handle().append(events.clone(), None).unwrap();
    s.shutdown();
    let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
    evict_page_cache(d.path());
    let mut r = s.handle().read(Query::all(), Position::ZERO, None).without_waiting();
    let mut fetches = 0;
    let (got, blocked) = drain_fetching(&mut r, usize::MAX, || {
        fetches += 1;
        assert_eq!(fetches, 1, "stopped again after the fetch");
        // The records on disk change after the fetch (a stand-in for pages evicted and re-read):
        // the 4 KiB after the segment's header.
        let f = std::fs::OpenOptions::new().write(true).open(&segments(d.path())[0]).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xAA; 4096], 64).unwrap();
    });
    assert_eq!(blocked, 1, "stopped again after the fetch");
    assert_eq!(got.iter().map(|(_, e)| e.as_bytes()).collect::<Vec<_>>(), events.iter().map(|e| e.as_bytes()).collect::<Vec<_>>());
}

/// A subscription's fetched range holds the file as it was when it was read; events committed
/// after that, into the same range, must come from a fresh read, not from those bytes (zeros
/// there). Review: a subscription catching up while appends ran failed with "record checksum
/// mismatch" on such events.
#[test]
fn a_subscription_does_not_read_events_committed_after_its_fetch_from_the_fetched_bytes() {
    let d = dir();
    let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
    let h = s.handle();
    let event = |i: u32| ev("E", &[&format!("n:{i}")], &[i as u8; 3000]);
    // One commit each, of about a block: more than the few recent batches kept in memory, so
    // the first events are on the disk only.
    for i in 1..=8 {
        h.append(vec![event(i)], None).unwrap();
    }
    evict_page_cache(d.path());
    let mut sub = h.subscribe(Query::all(), Position::ZERO).without_waiting();
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut budget = usize::MAX;
    let polled = sub.poll_within(1024, &mut budget, |p, e| got.push((p.get(), e.as_bytes().to_vec()))).unwrap();
    assert_eq!((polled.delivered, polled.caught_up), (0, false), "the first record is cold");
    let mut warm = sub.take_cold_range().expect("a range to fetch");
    warm.run();
    // Committed after the fetch read the file, into the range it read.
    for i in 9..=16 {
        h.append(vec![event(i)], None).unwrap();
    }
    sub.fetched(warm);
    loop {
        let mut budget = usize::MAX;
        let polled = sub.poll_within(1024, &mut budget, |p, e| got.push((p.get(), e.as_bytes().to_vec()))).expect("no stale bytes read");
        match sub.take_cold_range() {
            Some(mut warm) => {
                warm.run();
                sub.fetched(warm);
            }
            None if polled.caught_up => break,
            None => {}
        }
    }
    let want: Vec<(u64, Vec<u8>)> = (1..=16u32).map(|i| (i as u64, event(i).as_bytes().to_vec())).collect();
    assert_eq!(got, want);
    s.shutdown();
}

#[test]
fn reads_are_pinned_to_the_watermark_they_started_with() {
    let d = dir();
    let s = Store::open(d.path(), cfg(2048)).unwrap();
    let h = s.handle();
    for i in 0..10 {
        h.append(vec![ev("A", &["x"], &[i])], None).unwrap();
    }
    let mut fwd = h.read(Query::all(), Position::ZERO, None);
    let back = h.read_back(Query::all(), Position::MAX, None);
    assert_eq!(fwd.watermark(), Position(10));
    // Consume part of the forward read, then append more (across a segment boundary).
    let (p, _) = fwd.next().unwrap().unwrap();
    assert_eq!(p, Position(1));
    for i in 10..80 {
        h.append(vec![ev("A", &["x"], &[i])], None).unwrap();
    }
    assert!(h.stats().segment_count > 1);
    let rest: Vec<u64> = positions(fwd);
    assert_eq!(rest, (2..=10).collect::<Vec<_>>());
    assert_eq!(positions(back), (1..=10).rev().collect::<Vec<_>>());
    // A read started now sees the new head.
    assert_eq!(positions(h.read(Query::all(), Position(75), None)), (76..=80).collect::<Vec<_>>());
}

#[test]
fn subscription_catches_up_then_follows_a_concurrent_writer_without_gap_or_duplicate() {
    let d = dir();
    let mut rng = Rng::from_time("subscription");
    let (s, mut log) = populated(d.path(), &mut rng, 60);
    let h = s.handle();
    let q = Query::items(vec![QueryItem::with_tags(Tags::new(["t1"]).unwrap()), QueryItem::of_types(vec![EventType::new("C").unwrap()])]);
    let start = 17u64;
    let mut sub = h.subscribe(q.clone(), Position(start));
    let extra: Vec<Vec<Event>> = (0..40u64).map(|b| (0..1 + b % 3).map(|j| random_event(&mut rng, 1000 + b * 4 + j)).collect()).collect();
    let writer = {
        let h = h.clone();
        let extra = extra.clone();
        std::thread::spawn(move || {
            for batch in extra {
                h.append(batch, None).unwrap();
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    for b in &extra {
        log.extend(b.iter().cloned());
    }
    let want: Vec<u64> = oracle(&log, &q).into_iter().filter(|&p| p > start).collect();
    let mut got: Vec<(u64, Event)> = Vec::new();
    let t = Instant::now();
    while got.len() < want.len() {
        assert!(t.elapsed() < Duration::from_secs(20), "subscription stalled at {} of {}", got.len(), want.len());
        let n = sub.poll_batch(5, |p, e| got.push((p.get(), e.to_owned()))).unwrap();
        assert!(n <= 5);
        if n == 0 {
            let w = sub.wait_timeout(Duration::from_secs(1));
            assert_ne!(w, WaitOutcome::Closed);
        }
    }
    writer.join().unwrap();
    assert_eq!(got.iter().map(|(p, _)| *p).collect::<Vec<_>>(), want);
    for (p, e) in &got {
        assert_eq!(e.as_bytes(), log[(p - 1) as usize].as_bytes(), "position {p}");
    }
    // Nothing more, and the cursor sits at the head once everything is delivered.
    assert_eq!(sub.poll_batch(5, |p, _| panic!("duplicate delivery at {p}")).unwrap(), 0);
    assert_eq!(sub.position(), h.head());
}

#[test]
fn wait_timeout_times_out_advances_and_reports_closed_after_shutdown() {
    let d = dir();
    let s = Store::open(d.path(), cfg(2048)).unwrap();
    let h = s.handle();
    h.append(vec![ev("A", &[], b"1")], None).unwrap();
    let mut sub = h.subscribe(Query::all(), Position::ZERO);
    assert_eq!(sub.wait_timeout(Duration::from_millis(10)), WaitOutcome::Advanced);
    assert_eq!(sub.poll_batch(10, |_, _| {}).unwrap(), 1);
    let t = Instant::now();
    assert_eq!(sub.wait_timeout(Duration::from_millis(30)), WaitOutcome::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(30));
    // A waiter parked in another thread is woken by an append.
    let waiter = std::thread::spawn(move || {
        let w = sub.wait_timeout(Duration::from_secs(10));
        (w, sub)
    });
    std::thread::sleep(Duration::from_millis(20));
    h.append(vec![ev("A", &[], b"2")], None).unwrap();
    let (w, mut sub) = waiter.join().unwrap();
    assert_eq!(w, WaitOutcome::Advanced);
    assert_eq!(sub.poll_batch(10, |_, _| {}).unwrap(), 1);
    // A waiter parked when the store shuts down gets Closed promptly, and so does every later wait.
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        let w = sub.wait_timeout(Duration::from_secs(10));
        (w, t.elapsed(), sub)
    });
    std::thread::sleep(Duration::from_millis(20));
    s.shutdown();
    let (w, waited, sub) = waiter.join().unwrap();
    assert_eq!(w, WaitOutcome::Closed);
    assert!(waited < Duration::from_secs(5), "shutdown did not wake the waiter ({waited:?})");
    assert_eq!(sub.wait_timeout(Duration::from_secs(10)), WaitOutcome::Closed);
    assert!(h.is_closed());
    assert_eq!(h.append(vec![ev("A", &[], b"3")], None), Err(AppendError::Shutdown));
    // Reads keep working on the closed store's handle.
    assert_eq!(positions(h.read(Query::all(), Position::ZERO, None)), vec![1, 2]);
}

/// Readers on other threads, while the writer appends and rolls over tiny segments, always see
/// exactly the prefix `1..=watermark` of their pinned read, with the right bytes, both ways.
#[test]
fn concurrent_readers_see_consistent_prefixes_across_rollovers() {
    let d = dir();
    let s = Store::open(d.path(), cfg(512)).unwrap();
    let h = s.handle();
    let event = |p: u64| ev(["A", "B"][(p % 2) as usize], &[&format!("p:{p}")], &vec![(p % 251) as u8; (p % 13) as usize]);
    let done = std::sync::atomic::AtomicBool::new(false);
    let reads = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for forward in [true, false] {
            let h = h.clone();
            let (done, reads) = (&done, &reads);
            sc.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let r = if forward { h.read(Query::all(), Position::ZERO, None) } else { h.read_back(Query::all(), Position::MAX, None) };
                    let w = r.watermark().get();
                    let got = r.collect_owned().unwrap();
                    assert_eq!(got.len() as u64, w, "forward {forward}: {} events under watermark {w}", got.len());
                    for (i, (p, e)) in got.iter().enumerate() {
                        let want = if forward { i as u64 + 1 } else { w - i as u64 };
                        assert_eq!(p.get(), want);
                        assert_eq!(e.as_bytes(), event(want).as_bytes(), "position {want}");
                    }
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Leave the writer CPU time on a small machine.
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        }
        for p in 1..=150u64 {
            assert_eq!(h.append(vec![event(p)], None).unwrap().first.get(), p);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    assert!(h.stats().segment_count > 5);
    eprintln!("{} concurrent reads", reads.load(std::sync::atomic::Ordering::Relaxed));
}

/// Bounded steps ([`Reads::step`], [`Subscription::poll_within`]): a scan paused by its budget
/// resumes where it stopped, and the steps together return exactly what an unbounded read
/// returns, in both directions and for subscriptions.
#[test]
fn bounded_steps_return_exactly_the_unbounded_answer() {
    let d = dir();
    let mut rng = Rng::new(91);
    let (s, log) = populated(d.path(), &mut rng, 1500);
    let h = s.handle();
    for round in 0..40 {
        let q = if round == 0 {
            Query::items(vec![QueryItem::new(vec![EventType::new("Z").unwrap()], Tags::new(["t0"]).unwrap())])
        } else {
            random_query(&mut rng)
        };
        let after = rng.below(1600);
        for back in [false, true] {
            let want = positions(if back { h.read_back(q.clone(), Position(after), None) } else { h.read(q.clone(), Position(after), None) });
            let mut r = if back { h.read_back(q.clone(), Position(after), None) } else { h.read(q.clone(), Position(after), None) };
            let step = 1 + rng.below(7) as usize;
            let (mut got, mut pauses) = (Vec::new(), 0);
            loop {
                let mut budget = step;
                match r.step(&mut budget) {
                    Step::Event(p, _) => got.push(p.get()),
                    Step::Pending => {
                        assert_eq!(budget, 0, "a pause spends the budget");
                        pauses += 1;
                    }
                    Step::End => break,
                    Step::Failed(e) => panic!("{e}"),
                    Step::Blocked(_) => panic!("a read that may wait never stops for the disk"),
                }
                assert!(pauses < 10_000, "no progress");
            }
            assert_eq!(got, want, "query {q:?} after {after} backward {back} step {step}");
            if round == 0 && !back {
                // Nothing matches type Z: a scan of the whole range in small steps.
                assert!(pauses > 100, "a matchless scan pauses, {pauses} pauses");
            }
        }
        let mut sub = h.subscribe(q.clone(), Position(after));
        let want: Vec<u64> = oracle(&log, &q).into_iter().filter(|&p| p > after).collect();
        let mut got = Vec::new();
        loop {
            let mut budget = 1 + rng.below(20) as usize;
            let polled = sub.poll_within(3, &mut budget, |p, _| got.push(p.get())).unwrap();
            assert!(polled.delivered <= 3);
            if polled.caught_up {
                break;
            }
        }
        assert_eq!(got, want, "subscription to {q:?} after {after}");
        assert_eq!(sub.position().get(), h.head().get().max(after));
    }
}
