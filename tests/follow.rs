//! The follower against a live writer process, and on a read-only directory.

use tephra_test_support as support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::Server;
use tephra::client::{Client, SubEvent};
use tephra::*;

fn ours() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

fn ev(i: u64) -> Event {
    Event::new(&EventType::new(format!("T{}", i % 3)).unwrap(), &Tags::new([format!("k:{}", i % 5)]).unwrap(), &i.to_le_bytes()).unwrap()
}

const SEG: &str = "4096";

#[test]
fn a_follower_process_tracks_a_live_writer_as_a_growing_prefix() {
    let writer = Server::start(&ours(), &[("TEPHRA__SEGMENT__SIZE", SEG)]);
    let data = writer.data_dir();
    let mut w = Client::connect(writer.addr).unwrap();
    w.append(vec![ev(0)], None).unwrap();
    let follower = Server::start_args(&ours(), &data, &["--follow", "--follow-poll-ms", "20"], &[("TEPHRA__SEGMENT__SIZE", SEG)]);

    // A writer thread appends continuously and records what was acknowledged.
    let acked = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let (acked2, stop2, waddr) = (acked.clone(), stop.clone(), writer.addr);
    let appender = std::thread::spawn(move || {
        let mut c = Client::connect(waddr).unwrap();
        let mut i = 1;
        while !stop2.load(Ordering::SeqCst) {
            let batch: Vec<Event> = (i..i + 1 + i % 4).map(ev).collect();
            let r = c.append(batch.clone(), None).unwrap();
            assert_eq!(r.first.get(), i + 1);
            i = r.last.get();
            acked2.store(i, Ordering::SeqCst);
        }
        i
    });

    // A subscriber on the follower sees new events as they appear, in order, no gap.
    let faddr = follower.addr;
    let sub = std::thread::spawn(move || {
        let mut c = Client::connect(faddr).unwrap();
        let (stream, _cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
        let mut next = 1;
        for item in stream {
            match item.unwrap() {
                SubEvent::Event(e) => {
                    assert_eq!(e.position().get(), next, "subscription on the follower skipped or repeated");
                    assert_eq!(e.event().as_bytes(), ev(next - 1).as_bytes());
                    next += 1;
                    if next > 300 {
                        return next;
                    }
                }
                SubEvent::CaughtUp(_) => {}
            }
        }
        next
    });

    // Reads on the follower are always a prefix of the writer's acknowledged log.
    let mut f = Client::connect(follower.addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while seen < 300 && Instant::now() < deadline {
        let (events, watermark) = f.read_all(Query::all(), Position::ZERO).unwrap();
        let ack_after = acked.load(Ordering::SeqCst);
        assert_eq!(events.len() as u64, watermark.get());
        // The follower may already show the batch in flight, durable but not yet acknowledged
        // to the appender: the one after `ack_after`, of 1 + ack_after % 4 events (had the
        // acknowledgement moved on since the read, `ack_after` covers what the read saw).
        assert!(
            watermark.get() <= ack_after + 1 + ack_after % 4,
            "follower shows {} beyond the acknowledged {} and the batch in flight",
            watermark.get(),
            ack_after
        );
        for (k, e) in events.iter().enumerate() {
            assert_eq!(e.position().get(), k as u64 + 1);
            assert_eq!(e.event().as_bytes(), ev(k as u64).as_bytes(), "follower event {} differs", k + 1);
        }
        assert!(watermark.get() >= seen, "the follower's prefix shrank");
        seen = watermark.get();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(seen >= 300, "follower reached only {seen}");
    assert!(sub.join().unwrap() > 300);

    // Appends on the follower are refused clearly.
    let err = f.append(vec![ev(1)], None).unwrap_err();
    assert!(err.to_string().contains("read-only follower"), "{err}");

    stop.store(true, Ordering::SeqCst);
    let last = appender.join().unwrap();
    // It reaches the writer's tip within the lag (poll 20 ms plus the scan).
    let t = Instant::now();
    loop {
        let s = f.stats().unwrap();
        if s.event_count == last {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "follower stuck at {} behind {last}", s.event_count);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        std::fs::read_dir(&data).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log")).count() > 1,
        "the test should cross segments"
    );
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = walk_files(dir).into_iter().map(|p| (p.strip_prefix(dir).unwrap().display().to_string(), std::fs::read(&p).unwrap())).collect();
    v.sort();
    v
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_follower_writes_nothing_and_opens_a_read_only_mount() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    {
        let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(65536))).unwrap();
        let h = store.handle();
        for i in 0..500 {
            h.append(vec![ev(i)], None).unwrap();
        }
    }
    let before = snapshot(&data);
    let f = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(65536))).unwrap();
    let h = f.handle();
    assert_eq!(h.head(), Position(500));
    let all = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    assert!(all.iter().enumerate().all(|(k, (p, e))| p.get() == k as u64 + 1 && e.as_bytes() == ev(k as u64).as_bytes()));
    assert!(h.append(vec![ev(0)], None).is_err());
    f.close();
    drop(f);
    assert_eq!(snapshot(&data), before, "the follower changed the directory");

    // A read-only bind mount (needs root and mount permission; skipped loudly otherwise).
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = std::process::Command::new("mount").arg("--bind").arg(&data).arg(&ro).status().map(|s| s.success()).unwrap_or(false)
        && std::process::Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&ro).status().map(|s| s.success()).unwrap_or(false);
    if !mounted {
        eprintln!("*** SKIPPED the read-only mount case: cannot bind-mount here");
        let _ = std::process::Command::new("umount").arg(&ro).status();
        return;
    }
    let result = std::panic::catch_unwind(|| {
        assert!(std::fs::write(ro.join("probe"), b"x").is_err(), "the mount should be read-only");
        let f = Follower::open(&ro, FollowerConfig::new(SegmentConfig::new(65536))).unwrap();
        assert_eq!(f.handle().head(), Position(500));
        // A writer cannot open it (it needs the LOCK file), a follower can.
        assert!(Store::open(&ro, StoreConfig::new(SegmentConfig::new(65536))).is_err());
    });
    let _ = std::process::Command::new("umount").arg(&ro).status();
    result.unwrap();
}

/// A writer restarted with a larger `segment.size` grows the active segment past the tables a
/// follower sized from it: the follower's refresh fails with that reason instead of panicking
/// its thread (review), and what it serves stays exact.
#[test]
fn a_segment_grown_past_the_followers_tables_is_reopened_and_followed() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    {
        let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(65536))).unwrap();
        store.handle().append(vec![ev(0)], None).unwrap();
    }
    let f = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(65536))).unwrap();
    assert_eq!(f.handle().head(), Position(1));
    // A reader pinned before the growth keeps what it saw.
    let early = f.handle().read(Query::all(), Position::ZERO, None);
    // The writer restarts with 16 times the segment size and grows the active file past the
    // tables the follower sized for it (review: the follower's thread panicked; then the
    // refresh failed and the follower served a frozen prefix).
    let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(1 << 20))).unwrap();
    let h = store.handle();
    let mut sent = 1u64;
    for chunk in (1..20_000u64).collect::<Vec<_>>().chunks(1000) {
        h.append(chunk.iter().map(|&i| ev(i)).collect(), None).unwrap();
        sent += chunk.len() as u64;
    }
    assert_eq!(f.refresh().unwrap(), sent);
    let check = |got: &[(Position, Event)], n: u64| {
        assert_eq!(got.len() as u64, n);
        assert!(got.iter().enumerate().all(|(k, (p, e))| p.get() == k as u64 + 1 && e.as_bytes() == ev(k as u64).as_bytes()));
    };
    check(&f.handle().read(Query::all(), Position::ZERO, None).collect_owned().unwrap(), sent);
    check(&early.collect_owned().unwrap(), 1);
    // Index-backed reads see the re-read records too, and it goes on following.
    let r = h.append(vec![ev(sent)], None).unwrap();
    sent += 1;
    assert_eq!(f.refresh().unwrap(), r.last.get());
    check(&f.handle().read(Query::all(), Position::ZERO, None).collect_owned().unwrap(), sent);
    let tagged = f.handle().read(Query::item(QueryItem::with_tags(Tags::new(["k:3"]).unwrap())), Position::ZERO, None).collect_owned().unwrap();
    assert_eq!(tagged.iter().map(|(p, _)| p.get()).collect::<Vec<_>>(), (1..=sent).filter(|p| (p - 1) % 5 == 3).collect::<Vec<_>>());
    f.close();
}

/// A follower started before its writer, on a directory that holds no segment yet, serves an
/// empty store (review: it refused to start with "invalid configuration: ... holds no segment
/// yet"), says once that it waits for the writer, passes the healthcheck meanwhile, and follows
/// the writer's first segment once the writer creates it: a subscription opened while it
/// waited and a later read both get the writer's event.
#[test]
fn a_follower_started_before_its_writer_waits_for_the_first_segment() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let follower = Server::start_args(&ours(), &data, &["--follow", "--follow-poll-ms", "20"], &[("TEPHRA__SEGMENT__SIZE", SEG)]);
    let waiting = format!("waiting for the writer to create the first segment in {}", data.display());
    assert!(follower.log_shows(&waiting, Duration::from_secs(5)), "{}", follower.log());

    let mut f = Client::connect(follower.addr).unwrap();
    let s = f.stats().unwrap();
    assert_eq!((s.event_count, s.segment_count), (0, 0));
    let (events, watermark) = f.read_all(Query::all(), Position::ZERO).unwrap();
    assert!(events.is_empty());
    assert_eq!(watermark, Position::ZERO);
    let hc = support::run_to_exit(&ours(), &["--healthcheck", "--bind", &follower.addr.to_string()], &[], None, Duration::from_secs(20));
    assert_eq!(hc.code, Some(0), "{hc:?}");

    let (tx, rx) = std::sync::mpsc::channel();
    let faddr = follower.addr;
    std::thread::spawn(move || {
        let mut c = Client::connect(faddr).unwrap();
        let (stream, _cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
        for item in stream {
            if tx.send(item.unwrap()).is_err() {
                return;
            }
        }
    });
    assert!(matches!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), SubEvent::CaughtUp(p) if p == Position::ZERO));

    let writer = Server::start_args(&ours(), &data, &[], &[("TEPHRA__SEGMENT__SIZE", SEG)]);
    let r = Client::connect(writer.addr).unwrap().append(vec![ev(0)], None).unwrap();
    assert_eq!(r.first.get(), 1);
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        SubEvent::Event(e) => assert_eq!((e.position().get(), e.event().as_bytes()), (1, ev(0).as_bytes())),
        other => panic!("expected the writer's event, got {other:?}"),
    }
    let (events, watermark) = f.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(watermark, Position(1));
    assert_eq!(events.iter().map(|e| e.event().as_bytes().to_vec()).collect::<Vec<_>>(), [ev(0).as_bytes().to_vec()]);
    assert_eq!(f.stats().unwrap().segment_count, 1);
    assert!(follower.log_shows("the writer created the first segment; following it", Duration::from_secs(5)), "{}", follower.log());
    assert_eq!(follower.log().matches(&waiting).count(), 1, "{}", follower.log());
}

/// An event of type `Ev` tagged `n:i` with a 1,000-byte payload that depends on `i`.
fn big(i: u64) -> Event {
    let payload: Vec<u8> = (0..1000u64).map(|k| (i * 7 + k) as u8).collect();
    Event::new(&EventType::new("Ev").unwrap(), &Tags::new([format!("n:{i}")]).unwrap(), &payload).unwrap()
}

/// Flips every bit of byte `at` of the segment `path`; returns where a walk of the file now
/// stops (the damaged record's offset) and how many records it commits before that.
fn damage(path: &Path, at: u64) -> (u64, u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[!b[0]], at).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let w = tephra::log::record::walk(&bytes, tephra::log::header::HEADER_LEN);
    (w.stop_offset as u64, w.offsets.len() as u64)
}

/// The value of the unlabelled sample `name` in a scrape of `addr`.
fn scrape(addr: std::net::SocketAddr, name: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).unwrap_or_else(|| panic!("no sample {name}:\n{body}")).parse().unwrap()
}

/// A follower that reaches a damaged record in a sealed segment of a live writer says so in
/// its log, naming the file and byte offset, once (not once per poll), counts it in
/// `tephra_follower_refresh_failures` for as long as it stays there, and serves exactly the
/// events before the damage (review: it stopped at position 130 of 350 for good, logging
/// nothing, the gauge at 0, while the writer went on).
#[test]
fn a_follower_stopped_by_a_damaged_sealed_segment_says_so_counts_it_and_serves_the_prefix() {
    let writer = Server::start(&ours(), &[("TEPHRA__SEGMENT__SIZE", "65536")]);
    let data = writer.data_dir();
    let mut w = Client::connect(writer.addr).unwrap();
    for i in 0..300 {
        w.append(vec![big(i)], None).unwrap();
    }
    let segments = tephra::log::segment::list_segments(&data).unwrap();
    assert!(segments.len() >= 3, "{} segments: the second must be sealed", segments.len());
    let (base, path) = segments[1].clone();
    let (stop, committed) = damage(&path, 5000);
    let prefix = base + committed - 1;

    let follower = Server::start_args(
        &ours(),
        &data,
        &["--follow", "--follow-poll-ms", "20"],
        &[("TEPHRA__SEGMENT__SIZE", "65536"), ("TEPHRA__METRICS__BIND", "127.0.0.1:0")],
    );
    for i in 300..325 {
        w.append(vec![big(i)], None).unwrap();
    }
    assert_eq!(w.stats().unwrap().event_count, 325);
    let said = format!("segment {} is corrupt at byte offset {stop}", path.display());
    assert!(follower.log_shows(&said, Duration::from_secs(10)), "the damage was not said:\n{}", follower.log());
    let maddr = follower.metrics_addr();
    let first = scrape(maddr, "tephra_follower_refresh_failures");
    assert!(first >= 1, "the gauge says {first} while the follower is stopped at the damage");
    // About 50 more polls, each of them stopped at the damage.
    std::thread::sleep(Duration::from_secs(1));
    assert!(scrape(maddr, "tephra_follower_refresh_failures") > first, "the failed refreshes were not counted");

    let mut f = Client::connect(follower.addr).unwrap();
    let (events, watermark) = f.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(watermark.get(), prefix);
    assert_eq!(events.len() as u64, prefix);
    for (k, e) in events.iter().enumerate() {
        assert_eq!((e.position().get(), e.event().as_bytes()), (k as u64 + 1, big(k as u64).as_bytes()), "follower event {} differs", k + 1);
    }
    assert_eq!(f.stats().unwrap().event_count, prefix);
    assert_eq!(follower.log().matches(&said).count(), 1, "said more than once:\n{}", follower.log());
}

/// A store the writer refuses to open, for a damaged record in the middle of its active
/// segment or of a sealed one, opens as a follower all the same (it cannot repair anything),
/// with exactly the events before the damage; the damage counts as a failed refresh, and every
/// refresh reports the file and byte offset the writer names (review: the follower opened
/// without a word and served 1..246 or 1..130 of 300 events as all there was).
#[test]
fn a_follower_opens_a_store_the_writer_refuses_with_the_prefix_before_the_damage() {
    for sealed in [true, false] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let data = dir.path().join("data");
        let size = if sealed { 65536 } else { 1 << 20 };
        {
            let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(size))).unwrap();
            let h = store.handle();
            for i in 0..300 {
                h.append(vec![big(i)], None).unwrap();
            }
            store.shutdown();
        }
        let segments = tephra::log::segment::list_segments(&data).unwrap();
        let (base, path) = if sealed { segments[1].clone() } else { segments.last().unwrap().clone() };
        assert!(!sealed || segments.len() >= 3, "{} segments", segments.len());
        // A payload byte: in the sealed case the reviewer's byte 5000, in the active one
        // half-way through its 300 events.
        let at = if sealed {
            5000
        } else {
            let w = tephra::log::record::walk(&std::fs::read(&path).unwrap(), tephra::log::header::HEADER_LEN);
            assert_eq!(w.offsets.len(), 300);
            w.offsets[150] as u64 + 20
        };
        let (stop, committed) = damage(&path, at);
        let prefix = base + committed - 1;
        let refused = Store::open(&data, StoreConfig::new(SegmentConfig::new(size))).err().expect("the writer opened a damaged store").to_string();
        let said = format!("segment {} is corrupt at byte offset {stop}", path.display());
        assert!(refused.contains(&said), "sealed {sealed}: the writer says {refused}");

        let f = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(size))).unwrap();
        let h = f.handle();
        assert_eq!(h.head(), Position(prefix), "sealed {sealed}");
        assert_eq!(h.refresh_failures(), 1, "sealed {sealed}");
        match f.refresh() {
            Err(e @ tephra::log::LogError::Corrupt { .. }) => assert!(e.to_string().contains(&said), "sealed {sealed}: {e}"),
            other => panic!("sealed {sealed}: the refresh gave {other:?}"),
        }
        assert_eq!(h.head(), Position(prefix));
        let all = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
        assert_eq!(all.len() as u64, prefix, "sealed {sealed}");
        assert!(all.iter().enumerate().all(|(k, (p, e))| p.get() == k as u64 + 1 && e.as_bytes() == big(k as u64).as_bytes()), "sealed {sealed}");
        // The segment restored in place (the byte flipped back), the follower goes on to the
        // end within a few polls (review: it served the prefix until a restart).
        damage(&path, at);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while f.refresh().is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(h.head(), Position(300), "sealed {sealed}: the restored segment was not followed on");
        let all = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
        assert!(
            all.len() == 300 && all.iter().enumerate().all(|(k, (p, e))| p.get() == k as u64 + 1 && e.as_bytes() == big(k as u64).as_bytes()),
            "sealed {sealed}"
        );
        f.close();
    }
}

/// A followed directory removed and created again with another store is said as that, not
/// as damage, and the follower keeps serving exactly what it had (review: it said "the
/// writer refuses to open it at its next start", which the new writer did not).
#[test]
fn a_follower_whose_store_is_replaced_says_so_and_keeps_what_it_had() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let size = 65536;
    let fill = |n: u64, from: u64| {
        let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(size))).unwrap();
        let h = store.handle();
        for i in from..from + n {
            h.append(vec![big(i)], None).unwrap();
        }
        store.shutdown();
    };
    fill(100, 0);
    let f = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(size))).unwrap();
    let h = f.handle();
    assert_eq!(h.head(), Position(100));
    std::fs::remove_dir_all(&data).unwrap();
    fill(300, 1000);
    for _ in 0..3 {
        match f.refresh() {
            Err(e @ tephra::log::LogError::Io { .. }) => assert!(e.to_string().contains("the followed store was removed or replaced"), "{e}"),
            other => panic!("the refresh gave {other:?}"),
        }
    }
    assert_eq!(h.head(), Position(100));
    let all = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    assert!(all.len() == 100 && all.iter().enumerate().all(|(k, (p, e))| p.get() == k as u64 + 1 && e.as_bytes() == big(k as u64).as_bytes()));
    f.close();
    // A new follower follows the new store.
    let g = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(size))).unwrap();
    assert_eq!(g.handle().head(), Position(300));
    g.close();
}

/// A batch larger than the follower's 4 MiB read window (a group commit holds up to
/// `writer.max_batch_bytes`, 8 MiB by default) is read whole: the follower's walk used to
/// retry the same window for ever, holding its tail, at such a batch.
#[test]
fn a_follower_reads_a_batch_larger_than_its_read_window() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let cfg = SegmentConfig::new(16 << 20);
    let store = Store::open(&data, StoreConfig::new(cfg)).unwrap();
    let r = store.handle().append((0..6000).map(big).collect(), None).unwrap();
    assert_eq!(r.last.get(), 6000);
    let (tx, rx) = std::sync::mpsc::channel();
    let opened = data.clone();
    std::thread::spawn(move || {
        let f = Follower::open(&opened, FollowerConfig::new(cfg)).unwrap();
        let _ = tx.send((f.handle().head(), f.refresh().unwrap()));
    });
    let (head, refreshed) = rx.recv_timeout(Duration::from_secs(30)).expect("the follower did not open within 30 s");
    assert_eq!((head, refreshed), (Position(6000), 6000));
}

/// A store in `data` under a new directory, of `size`-byte segments holding `n` of [`big`]'s
/// events, one append each, closed; returns the directory and the active segment's path.
fn store_of_big_events(size: u64, n: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(size))).unwrap();
    let h = store.handle();
    for i in 0..n {
        h.append(vec![big(i)], None).unwrap();
    }
    store.shutdown();
    let path = tephra::log::segment::list_segments(&data).unwrap().last().unwrap().1.clone();
    (dir, path)
}

/// Zeros the 128 KiB from record `k`'s head in the active segment `path` (past a follower's
/// first 64 KiB read window); returns that offset and the records committed before it.
fn hole(path: &Path, k: usize) -> (u64, u64) {
    use std::os::unix::fs::FileExt;
    let w = tephra::log::record::walk(&std::fs::read(path).unwrap(), tephra::log::header::HEADER_LEN);
    let at = w.offsets[k] as u64;
    std::fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(&vec![0u8; 128 << 10], at).unwrap();
    let w = tephra::log::record::walk(&std::fs::read(path).unwrap(), tephra::log::header::HEADER_LEN);
    assert_eq!(w.stop_offset as u64, at);
    (at, w.offsets.len() as u64)
}

/// 128 KiB zeroed from a record head in the middle of the active segment, committed batches
/// after it: a follower opened on it says so with the file and offset, as the writer does,
/// and serves the prefix before it (the zeros filled its 64 KiB read window and read as the
/// end of the log: it served the prefix as all there was, without a word; review).
#[test]
fn a_follower_opened_on_a_hole_wider_than_its_window_says_so() {
    let size = 4 << 20;
    let (dir, path) = store_of_big_events(size, 1000);
    let data = dir.path().join("data");
    let (at, committed) = hole(&path, 300);
    let said = format!("segment {} is corrupt at byte offset {at}", path.display());
    let refused = Store::open(&data, StoreConfig::new(SegmentConfig::new(size))).err().expect("the writer opened a damaged store").to_string();
    assert!(refused.contains(&said), "the writer says {refused}");

    let f = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(size))).unwrap();
    let h = f.handle();
    assert_eq!(h.head(), Position(committed));
    assert_eq!(h.refresh_failures(), 1);
    for _ in 0..3 {
        match f.refresh() {
            Err(e @ tephra::log::LogError::Corrupt { .. }) => assert!(e.to_string().contains(&said), "{e}"),
            other => panic!("the refresh gave {other:?}"),
        }
    }
    assert_eq!(h.head(), Position(committed));
    f.close();
}

/// The same hole made under a follower of a live writer, ahead of it, while the writer goes
/// on appending: the follower says so within seconds, naming the file and offset (it stayed
/// at the hole for good, healthy as far as its log and metrics told; review).
#[test]
fn a_follower_of_a_live_writer_notices_a_hole_wider_than_its_window() {
    use std::os::unix::fs::FileExt;
    let writer = Server::start(&ours(), &[("TEPHRA__SEGMENT__SIZE", "16777216")]);
    let data = writer.data_dir();
    let mut w = Client::connect(writer.addr).unwrap();
    w.append((0..100).map(big), None).unwrap();
    let follower = Server::start_args(&ours(), &data, &["--follow", "--follow-poll-ms", "1000"], &[("TEPHRA__SEGMENT__SIZE", "16777216")]);
    let mut f = Client::connect(follower.addr).unwrap();
    let path = tephra::log::segment::list_segments(&data).unwrap().last().unwrap().1.clone();
    let mut next = 100;
    // Append a batch and zero its first 128 KiB before the follower's next poll reads it (a
    // poll every second); again if a poll came in between.
    let at = loop {
        assert!(next < 2000, "the follower read every batch before it was damaged");
        let seen = f.stats().unwrap().event_count;
        let end = tephra::log::record::walk(&std::fs::read(&path).unwrap(), tephra::log::header::HEADER_LEN).committed_end;
        w.append((next..next + 200).map(big), None).unwrap();
        next += 200;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&vec![0u8; 128 << 10], end as u64).unwrap();
        if f.stats().unwrap().event_count == seen {
            break end;
        }
    };
    let said = format!("segment {} is corrupt at byte offset {at}", path.display());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !follower.log().contains(&said) && Instant::now() < deadline {
        w.append(vec![big(next)], None).unwrap();
        next += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(follower.log().contains(&said), "the hole was not said:\n{}", follower.log());
}

/// Bytes this thread has read through system calls (`rchar` of `/proc/thread-self/io`).
fn thread_read_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
}

/// A length field damaged to point 4 MiB on, in the active segment: the follower says so at
/// every refresh without reading the segment again each time (each poll re-read as much as
/// the damaged length declared, 128 MiB for bit 27: 40% of a core; review).
#[test]
fn a_follower_at_a_damaged_length_does_not_read_it_again_at_every_poll() {
    use std::os::unix::fs::FileExt;
    let size = 16 << 20;
    let (dir, path) = store_of_big_events(size, 300);
    let data = dir.path().join("data");
    let w = tephra::log::record::walk(&std::fs::read(&path).unwrap(), tephra::log::header::HEADER_LEN);
    let at = w.offsets[100] as u64;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at + 2).unwrap();
    f.write_all_at(&[b[0] | 0x40], at + 2).unwrap();
    let said = format!("segment {} is corrupt at byte offset {at}", path.display());

    let follower = Follower::open(&data, FollowerConfig::new(SegmentConfig::new(size))).unwrap();
    assert_eq!(follower.handle().head(), Position(100));
    let before = thread_read_bytes();
    for _ in 0..20 {
        match follower.refresh() {
            Err(e @ tephra::log::LogError::Corrupt { .. }) => assert!(e.to_string().contains(&said), "{e}"),
            other => panic!("the refresh gave {other:?}"),
        }
    }
    let read = thread_read_bytes() - before;
    assert!(read < 1 << 20, "20 refreshes read {read} bytes");
    follower.close();
}
