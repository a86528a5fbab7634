//! Bad input (docs/protocol.md §1.2, §1.4): invalid names and tag sets are refused at
//! construction; oversized records and batches, empty appends, `after` beyond the tip and
//! conflicts are refused by the store. Each refusal changes nothing: the head, the stats and
//! every segment byte stay as they were, and the next append lands at `head + 1`.

mod engine_util;

use engine_util::*;
use tephra::*;

fn ty(s: &str) -> EventType {
    EventType::new(s).unwrap()
}

/// Checks that `f` leaves the store untouched and that an append still works afterwards.
fn unchanged<T: std::fmt::Debug>(s: &Store, what: &str, f: impl FnOnce(&StoreHandle) -> T) -> T {
    let h = s.handle();
    let (head, stats, files) = (h.head(), h.stats(), snapshot(h.dir()));
    let out = f(&h);
    assert_eq!(h.head(), head, "{what}: head moved");
    assert_eq!(h.stats(), stats, "{what}: stats changed");
    assert!(
        snapshot(h.dir()).into_iter().filter(|(n, _)| n.ends_with(".log")).eq(files.into_iter().filter(|(n, _)| n.ends_with(".log"))),
        "{what}: segment files changed"
    );
    let r = h.append(vec![ev("Ok", &[], b"fine")], None).unwrap();
    assert_eq!(r.first, head.next(), "{what}: the next append did not land at head + 1");
    out
}

#[test]
fn invalid_names_and_tag_sets_are_refused_at_construction() {
    assert!(matches!(EventType::new(""), Err(NameError::Empty { .. })));
    assert!(matches!(Tag::new(""), Err(NameError::Empty { .. })));
    assert!(matches!(EventType::new("x".repeat(MAX_NAME_LEN + 1)), Err(NameError::TooLong { len: 65536, max: 65535, .. })));
    assert!(matches!(Tag::new("é".repeat(32768)), Err(NameError::TooLong { len: 65536, .. })));
    assert!(matches!(Tags::new(["a", ""]), Err(TagsError::Name(NameError::Empty { .. }))));
    assert_eq!(Tags::new(["b", "a", "b"]), Err(TagsError::Duplicate("b".into())));
    assert_eq!(Tags::new((0..65536).map(|i| format!("t{i}"))), Err(TagsError::TooMany(65536)));
    assert_eq!(Tags::new((0..65535).map(|i| format!("t{i}"))).unwrap().len(), 65535);
}

#[test]
fn maximal_names_round_trip_through_the_store() {
    let d = dir();
    let long_type = "T".repeat(MAX_NAME_LEN);
    let long_tag = "é".repeat(MAX_NAME_LEN / 2) + "x";
    assert_eq!(long_tag.len(), MAX_NAME_LEN);
    let e = Event::new(&ty(&long_type), &Tags::new([long_tag.clone(), "short".into()]).unwrap(), b"data").unwrap();
    {
        let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
        s.handle().append(vec![e.clone()], None).unwrap();
    }
    let s = Store::open(d.path(), cfg(1 << 20)).unwrap();
    let h = s.handle();
    let got = read_all(&h);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.as_bytes(), e.as_bytes());
    assert_eq!(got[0].1.event_type(), long_type);
    let q = Query::item(QueryItem::new(vec![ty(&long_type)], Tags::new([long_tag]).unwrap()));
    assert_eq!(
        h.append(vec![ev("B", &[], b"")], Some(AppendCondition::new(q))),
        Err(AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(1) })
    );
}

#[test]
fn oversized_records_and_batches_empty_appends_and_bad_conditions_change_nothing() {
    let d = dir();
    // 4096-byte segments: max_record_len 1024, capacity 4032 (docs/protocol.md §1.4).
    let s = Store::open(d.path(), cfg(4096)).unwrap();
    let h = s.handle();
    h.append(vec![ev("A", &["k"], b"seed")], None).unwrap();
    let rec = |payload: usize| ev("A", &[], &vec![b'p'; payload]); // framed: 8 + 5 + payload
                                                                   // A record of exactly max_record_len is accepted; one byte more is refused.
    assert_eq!(8 + rec(1011).encoded_len(), 1024);
    unchanged(&s, "record one byte too large", |h| assert_eq!(h.append(vec![rec(1012)], None), Err(AppendError::TooLarge { size: 1025 })));
    unchanged(&s, "record of the reference's example", |h| assert_eq!(h.append(vec![rec(1020)], None), Err(AppendError::TooLarge { size: 1033 })));
    unchanged(&s, "oversized record inside a batch", |h| {
        assert_eq!(h.append(vec![rec(10), rec(5000), rec(10)], None), Err(AppendError::TooLarge { size: 5013 }))
    });
    h.append(vec![rec(1011)], None).unwrap();
    // A batch whose records each fit but that cannot fit an empty segment with its marker.
    unchanged(&s, "batch larger than a segment", |h| assert_eq!(h.append(vec![rec(1011); 4], None), Err(AppendError::TooLarge { size: 4 * 1024 + 17 })));
    unchanged(&s, "empty append", |h| assert_eq!(h.append(vec![], None), Err(AppendError::Empty)));
    unchanged(&s, "empty conditional append", |h| assert_eq!(h.append(vec![], Some(AppendCondition::new(Query::all()))), Err(AppendError::Empty)));
    unchanged(&s, "after beyond the tip", |h| {
        let tip = h.head().get();
        assert_eq!(
            h.append(vec![rec(1)], Some(AppendCondition::new(Query::none()).after(Position(tip + 1)))),
            Err(AppendError::AfterBeyondTip { after: tip + 1, tip })
        )
    });
    unchanged(&s, "boundary conflict", |h| {
        assert_eq!(
            h.append(vec![rec(1)], Some(AppendCondition::new(Query::item(QueryItem::with_tags(Tags::new(["k"]).unwrap()))))),
            Err(AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(1) })
        )
    });
    unchanged(&s, "existence conflict", |h| {
        assert_eq!(
            h.append(vec![rec(1)], Some(AppendCondition::exists_only(Query::item(QueryItem::of_types(vec![ty("A")]))))),
            Err(AppendError::Conflict { clause: ConflictClause::Existence, at: ConflictSite::Durable(1) })
        )
    });
    // An oversized append with a condition: the condition is judged first, as the reference
    // judges its oversized (solo) batch before the write refuses it (docs/protocol.md §2.4;
    // the differential test found TOO_LARGE where the reference said AFTER_BEYOND_TIP).
    for (what, events) in [("oversized record", vec![rec(1012)]), ("oversized batch", vec![rec(1011); 4])] {
        unchanged(&s, what, |h| {
            let tip = h.head().get();
            assert_eq!(
                h.append(events.clone(), Some(AppendCondition::new(Query::none()).after(Position(tip + 5)))),
                Err(AppendError::AfterBeyondTip { after: tip + 5, tip })
            );
            assert_eq!(
                h.append(events.clone(), Some(AppendCondition::new(Query::all()))),
                Err(AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(1) })
            );
            assert_eq!(
                h.append(events.clone(), Some(AppendCondition::exists_only(Query::item(QueryItem::of_types(vec![ty("A")]))))),
                Err(AppendError::Conflict { clause: ConflictClause::Existence, at: ConflictSite::Durable(1) })
            );
            // A condition that passes: then it is too large.
            assert!(matches!(h.append(events.clone(), Some(AppendCondition::new(Query::none()))), Err(AppendError::TooLarge { .. })));
        });
    }
    // A batch of exactly the segment capacity is accepted, alone in a fresh segment.
    let full: Vec<Event> = vec![rec(1011), rec(1011), rec(1011), rec(4032 - 17 - 3 * 1024 - 13)];
    let total: usize = full.iter().map(|e| 8 + e.encoded_len()).sum::<usize>() + 17;
    assert_eq!(total, 4032);
    let segs = h.stats().segment_count;
    let head = h.head().get();
    let r = h.append(full.clone(), None).unwrap();
    assert_eq!((r.first.get(), r.last.get()), (head + 1, head + 4));
    assert_eq!(h.stats().segment_count, segs + 1);
    let back = h.read_back(Query::all(), Position::MAX, Some(4)).collect_owned().unwrap();
    for ((_, got), want) in back.iter().zip(full.iter().rev()) {
        assert_eq!(got.as_bytes(), want.as_bytes());
    }
    let last = segments(d.path()).pop().unwrap();
    let buf = std::fs::read(&last).unwrap();
    let w = tephra::log::record::walk(&buf, 64);
    assert_eq!((w.committed_end, w.offsets.len()), (4096, 4));
    // The next append rolls over again and everything survives a reopen.
    h.append(vec![rec(3)], None).unwrap();
    let n = h.head().get();
    drop(s);
    let s = Store::open(d.path(), cfg(4096)).unwrap();
    assert_eq!(s.handle().head().get(), n);
    assert_eq!(read_all(&s.handle()).len() as u64, n);
}

#[test]
fn invalid_segment_geometry_is_refused_before_touching_the_disk() {
    let d = dir();
    let target = d.path().join("never-created");
    for size in [0, 64, 100, u32::MAX as u64 + 1] {
        let err = Store::open(&target, cfg(size)).err().unwrap_or_else(|| panic!("size {size} accepted")).to_string();
        assert!(err.contains("invalid configuration"), "{err}");
        assert!(!target.exists(), "size {size}: the refused open created the directory");
    }
    let mut c = cfg(4096);
    c.segment.max_record_len = 4096 - 64 - 16;
    assert!(Store::open(&target, c).is_err());
    assert!(!target.exists());
}
