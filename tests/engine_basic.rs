//! Embedded store: appends, reads, conditions and reopen on a real disk.

use std::time::Instant;
use tephra::*;

use tephra_test_support::ev;

fn tag_query(tag: &str) -> Query {
    Query::item(QueryItem::with_tags(Tags::new([tag]).unwrap()))
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn append_read_condition_reopen() {
    let d = dir();
    let cfg = StoreConfig::new(SegmentConfig::new(64 * 1024));
    {
        let store = Store::open(d.path(), cfg.clone()).unwrap();
        assert_eq!(store.open_outcome(), &tephra::log::OpenOutcome::Clean);
        let h = store.handle();
        let r = h.append(vec![ev("A", &[], b"x")], None).unwrap();
        assert_eq!((r.first.get(), r.last.get()), (1, 1));
        let r = h.append(vec![ev("Enrolled", &["course:c1", "student:s1"], b"{}"), ev("A", &["course:c1"], b"yy")], None).unwrap();
        assert_eq!((r.first.get(), r.last.get()), (2, 3));
        // boundary conflict with after = 0 over a tag present at 2
        let e = h.append(vec![ev("B", &[], b"")], Some(AppendCondition::new(tag_query("course:c1")))).unwrap_err();
        assert_eq!(e, AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(2) });
        // after = 3 passes
        h.append(vec![ev("B", &[], b"")], Some(AppendCondition::new(tag_query("course:c1")).after(Position(3)))).unwrap();
        // existence
        let e = h
            .append(vec![ev("B", &[], b"")], Some(AppendCondition::new(Query::none()).after(Position(4)).fail_if_exists(tag_query("student:s1"))))
            .unwrap_err();
        assert_eq!(e, AppendError::Conflict { clause: ConflictClause::Existence, at: ConflictSite::Durable(2) });
        let e = h.append(vec![ev("B", &[], b"")], Some(AppendCondition::new(Query::all()).after(Position(99)))).unwrap_err();
        assert_eq!(e, AppendError::AfterBeyondTip { after: 99, tip: 4 });
        assert_eq!(h.append(vec![], None).unwrap_err(), AppendError::Empty);
        let all = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
        assert_eq!(all.iter().map(|(p, _)| p.get()).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert_eq!(all[1].1.event_type(), "Enrolled");
        assert_eq!(all[2].1.data(), b"yy");
        let back = h.read_back(tag_query("course:c1"), Position::MAX, Some(1)).collect_owned().unwrap();
        assert_eq!(back.iter().map(|(p, _)| p.get()).collect::<Vec<_>>(), vec![3]);
    }
    let store = Store::open(d.path(), cfg).unwrap();
    let h = store.handle();
    assert_eq!(h.head(), Position(4));
    let r = h.append(vec![ev("C", &[], b"z")], None).unwrap();
    assert_eq!(r.first.get(), 5);
    let e = h.append(vec![ev("B", &[], b"")], Some(AppendCondition::new(tag_query("course:c1")))).unwrap_err();
    assert_eq!(e, AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(2) });
}

#[test]
fn sequential_append_latency_is_fsync_bound() {
    let d = dir();
    let store = Store::open(d.path(), StoreConfig::new(SegmentConfig::new(16 << 20))).unwrap();
    let h = store.handle();
    let t = Instant::now();
    for i in 0..200 {
        h.append(vec![ev("T", &[&format!("k:{i}")], &[0u8; 256])], None).unwrap();
    }
    let per = t.elapsed() / 200;
    eprintln!("sequential append: {per:?} per append");
    assert_eq!(h.head(), Position(200));
}

/// Segment files never grow past `segment.size`, even when it is not a multiple of the 4 KiB
/// block (the O_DIRECT write pads the last block) and when appends race rollovers with a small
/// batch limit (a round staged behind a full open batch needs a commit marker of its own).
#[test]
fn segments_keep_their_size_under_racing_rollovers() {
    let d = dir();
    let size = 70_000u64;
    let mut cfg = StoreConfig::new(SegmentConfig::new(size));
    cfg.writer.max_batch_bytes = 9_000;
    let mut sent = 0u64;
    {
        let store = Store::open(d.path(), cfg.clone()).unwrap();
        let h = store.handle();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    for i in 0..150u64 {
                        let k = ((t * 7 + i * 13) % 9 + 1) as usize;
                        let payload = vec![b'p'; ((t * 31 + i * 17) % 900) as usize];
                        let batch: Vec<Event> = (0..k).map(|_| ev("E", &["t"], &payload)).collect();
                        h.append(batch, None).unwrap();
                        n += k as u64;
                    }
                    n
                })
            })
            .collect();
        for t in threads {
            sent += t.join().unwrap();
        }
        store.shutdown();
    }
    let mut segments = 0;
    for e in std::fs::read_dir(d.path()).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().ends_with(".log") {
            segments += 1;
            assert_eq!(e.metadata().unwrap().len(), size, "{:?} grew past the segment size", e.file_name());
        }
    }
    assert!(segments > 10, "only {segments} segments: the test did not roll over");
    let store = Store::open(d.path(), cfg).unwrap();
    assert_eq!(store.open_outcome(), &tephra::log::OpenOutcome::Clean);
    let got = store.handle().read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    assert_eq!(got.len() as u64, sent);
    assert!(got.iter().enumerate().all(|(i, (p, _))| p.get() == i as u64 + 1));
}
