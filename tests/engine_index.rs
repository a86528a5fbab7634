//! The indexes and the planner change speed, never answers (docs/architecture.md
//! §5.2), and a corrupt index is not fatal (docs/format.md §8).
//!
//! - A differential property test: the same random history goes into three stores with tiny
//!   segments (so it spans many segments) under `scan_bias` 1 (always the index), 4 (the
//!   default) and `u32::MAX` (always a scan); random forward and backward reads with limits
//!   must return exactly the positions a brute-force oracle predicts, in every store, again
//!   after a reopen (sealed indexes loaded from their files), and on a follower (indexes built
//!   in memory).
//! - Every way an index file can be unusable (missing, bit flips, truncated, empty, describing
//!   another segment, its folder replaced by a file) leads to a rebuild, the same answers and,
//!   where the folder is writable, a file byte-identical to the original.
//! - A client reads its own write through the index, while the writer keeps appending.

mod engine_util;

use engine_util::history::*;
use engine_util::*;
use proptest::prelude::*;
use std::path::Path;
use tephra::*;

#[derive(Clone, Debug)]
struct ReadSpec {
    query: QSpec,
    forward: bool,
    /// `after` (forward) or `before` (backward) is this modulo `head + 3`.
    bound_seed: u64,
    limit: Option<u64>,
}

fn read_spec() -> impl Strategy<Value = ReadSpec> {
    (q_spec(), any::<bool>(), any::<u64>(), proptest::option::weighted(0.5, 0..6u64)).prop_map(|(query, forward, bound_seed, limit)| ReadSpec {
        query,
        forward,
        bound_seed,
        limit,
    })
}

/// The positions the oracle says `r` returns over `history`, in read order.
fn oracle(history: &[EvSpec], r: &ReadSpec) -> Vec<u64> {
    let head = history.len() as u64;
    let bound = r.bound_seed % (head + 3);
    let hit = |p: &u64| r.query.matches(&history[(*p - 1) as usize]);
    let limit = r.limit.unwrap_or(u64::MAX) as usize;
    if r.forward {
        (bound + 1..=head).filter(hit).take(limit).collect()
    } else {
        (1..bound.min(head + 1)).rev().filter(hit).take(limit).collect()
    }
}

/// Runs `r` on `h`; also returns whether the planner took the index.
fn run_read(h: &StoreHandle, history_len: u64, r: &ReadSpec) -> (Vec<u64>, bool) {
    let bound = Position(r.bound_seed % (history_len + 3));
    let mut reads = if r.forward { h.read(r.query.query(), bound, r.limit) } else { h.read_back(r.query.query(), bound, r.limit) };
    let indexed = reads.is_indexed();
    let mut got = Vec::new();
    while let Some(x) = reads.next() {
        got.push(x.unwrap().0.get());
    }
    (got, indexed)
}

const BIASES: [u32; 4] = [0, 1, 4, u32::MAX];

fn biased(bias: u32) -> StoreConfig {
    let mut c = cfg(512);
    c.read.scan_bias = bias;
    c
}

fn check_reads(name: &str, h: &StoreHandle, bias: u32, history: &[EvSpec], reads: &[ReadSpec]) -> Result<(), TestCaseError> {
    for r in reads {
        let (got, indexed) = run_read(h, history.len() as u64, r);
        prop_assert_eq!(&got, &oracle(history, r), "{} (scan_bias {}) read {:?}", name, bias, r);
        let selective = !matches!(r.query, QSpec::All);
        if bias == u32::MAX {
            prop_assert!(!indexed, "scan_bias u32::MAX must always scan");
        }
        if bias <= 1 && selective && !got.is_empty() {
            prop_assert!(indexed, "scan_bias {} must take the index for {:?}", bias, r.query);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn reads_are_identical_under_every_scan_bias(
        batches in proptest::collection::vec(proptest::collection::vec(ev_spec(), 1..=4), 1..24),
        reads in proptest::collection::vec(read_spec(), 1..24),
    ) {
        let dirs: Vec<_> = BIASES.iter().map(|_| dir()).collect();
        let history: Vec<EvSpec> = batches.iter().flatten().cloned().collect();
        {
            let stores: Vec<Store> = BIASES.iter().zip(&dirs).map(|(b, d)| Store::open(d.path(), biased(*b)).unwrap()).collect();
            for batch in &batches {
                for s in &stores {
                    s.handle().append(batch.iter().map(EvSpec::event).collect(), None).unwrap();
                }
            }
            for (s, b) in stores.iter().zip(BIASES) {
                check_reads("live", &s.handle(), b, &history, &reads)?;
            }
        }
        // Reopened: sealed indexes come from their files, the active one from a scan.
        for (d, b) in dirs.iter().zip(BIASES) {
            let s = Store::open(d.path(), biased(b)).unwrap();
            check_reads("reopened", &s.handle(), b, &history, &reads)?;
            // A follower builds its indexes in memory from the same log.
            let mut fc = FollowerConfig::new(SegmentConfig::new(512));
            fc.scan_bias = b;
            let f = Follower::open(d.path(), fc).unwrap();
            check_reads("follower", &f.handle(), b, &history, &reads)?;
        }
    }
}

fn tag_query(tags: &[&str]) -> Query {
    Query::item(QueryItem::with_tags(Tags::new(tags.iter().copied()).unwrap()))
}

fn type_query(ty: &str) -> Query {
    Query::item(QueryItem::new(vec![EventType::new(ty).unwrap()], Tags::new(Vec::<String>::new()).unwrap()))
}

/// Answers to a fixed set of queries through the index (scan_bias 1).
fn answers(h: &StoreHandle) -> Vec<Vec<u64>> {
    let queries = [tag_query(&["k:7"]), tag_query(&["k:60"]), tag_query(&["mod3:1", "all"]), tag_query(&["nope"]), type_query("Even"), type_query("Nope")];
    let mut out = Vec::new();
    for q in queries {
        let mut r = h.read(q.clone(), Position::ZERO, None);
        assert!(r.is_indexed());
        let mut v = Vec::new();
        while let Some(x) = r.next() {
            v.push(x.unwrap().0.get());
        }
        out.push(v);
        let back: Vec<u64> = h.read_back(q, Position::MAX, Some(3)).collect_owned().unwrap().into_iter().map(|(p, _)| p.get()).collect();
        out.push(back);
    }
    out
}

fn index_files(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(d.join("tagindex"))
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn unusable_index_files_are_rebuilt_and_answers_do_not_change() {
    let d = dir();
    let c = biased(1);
    let (want, files) = {
        let s = Store::open(d.path(), c.clone()).unwrap();
        let h = s.handle();
        for i in 1..=80u64 {
            let ty = if i % 2 == 0 { "Even" } else { "Odd" };
            h.append(vec![ev(ty, &[&format!("k:{i}"), &format!("mod3:{}", i % 3), "all"], &[i as u8; 7])], None).unwrap();
        }
        let segs = h.stats().segment_count as usize;
        assert!(segs >= 5, "history should span segments, got {segs}");
        let want = answers(&h);
        // Sealed files are written off the writer's thread; the shutdown waits for them.
        drop(h);
        s.shutdown();
        let files = index_files(d.path());
        // One file per sealed segment, named by its base, written at rollover.
        assert_eq!(files.len(), segs - 1);
        let bases: Vec<String> = segments(d.path()).iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(files.iter().map(|(n, _)| n.trim_end_matches(".tix").to_string()).collect::<Vec<_>>(), bases[..segs - 1]);
        (want, files)
    };
    assert_eq!(want[0], vec![7]);
    assert_eq!(want[4], (1..=80).filter(|i| i % 3 == 1).collect::<Vec<u64>>());
    let ix = d.path().join("tagindex");
    let reopen_and_check = |what: &str| {
        let s = Store::open(d.path(), c.clone()).unwrap();
        assert_eq!(answers(&s.handle()), want, "{what}");
    };
    reopen_and_check("intact");
    type Damage = fn(&Path, usize, &[u8]);
    let damages: [(&str, Damage); 5] = [
        ("deleted", |p, _, _| std::fs::remove_file(p).unwrap()),
        ("bit flip", |p, i, b| {
            let mut b = b.to_vec();
            let at = (i * 37) % b.len();
            b[at] ^= 0x10;
            std::fs::write(p, b).unwrap();
        }),
        ("truncated", |p, i, b| std::fs::write(p, &b[..(i * 13) % b.len()]).unwrap()),
        ("empty", |p, _, _| std::fs::write(p, b"").unwrap()),
        ("garbage", |p, _, b| std::fs::write(p, vec![0xA5u8; b.len()]).unwrap()),
    ];
    for (what, damage) in damages {
        for (i, (name, bytes)) in files.iter().enumerate() {
            damage(&ix.join(name), i, bytes);
        }
        reopen_and_check(what);
        assert_eq!(index_files(d.path()), files, "{what}: the rebuilt files equal the originals");
    }
    // A file describing another segment (the first file's content under every name).
    for (name, _) in &files[1..] {
        std::fs::write(ix.join(name), &files[0].1).unwrap();
    }
    reopen_and_check("another segment's file");
    assert_eq!(index_files(d.path()), files);
    // A stale file for the active segment is never loaded (the active index is always a scan).
    let active = segments(d.path()).last().unwrap().file_stem().unwrap().to_string_lossy().into_owned();
    std::fs::write(ix.join(format!("{active}.tix")), &files[0].1).unwrap();
    reopen_and_check("stale file for the active segment");
    std::fs::remove_file(ix.join(format!("{active}.tix"))).unwrap();
    // The folder cannot be written (a file in its place): the store opens and answers anyway.
    std::fs::remove_dir_all(&ix).unwrap();
    std::fs::write(&ix, b"not a folder").unwrap();
    reopen_and_check("folder replaced by a file");
    std::fs::remove_file(&ix).unwrap();
    reopen_and_check("folder gone");
    assert_eq!(index_files(d.path()), files);
}

/// Every append is readable through the index as soon as it is acknowledged, while other
/// threads read the growing log through the index too.
#[test]
fn an_acknowledged_append_is_readable_through_the_index_at_once() {
    let d = dir();
    let s = Store::open(d.path(), biased(1)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for _ in 0..2 {
            let h = s.handle();
            let stop = &stop;
            sc.spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Whatever the watermark, "all" matches exactly the positions 1..=watermark.
                    let mut r = h.read(tag_query(&["all"]), Position::ZERO, None);
                    let w = r.watermark().get();
                    let mut n = 0u64;
                    while let Some(x) = r.next() {
                        n += 1;
                        assert_eq!(x.unwrap().0.get(), n);
                    }
                    assert_eq!(n, w);
                    rounds += 1;
                }
                assert!(rounds > 0);
            });
        }
        let h = s.handle();
        for i in 1..=400u64 {
            let tag = format!("n:{i}");
            let r = h.append(vec![ev("E", &[&tag, "all"], b"x")], None).unwrap();
            let found: Vec<u64> = h.read(tag_query(&[&tag]), Position::ZERO, None).collect_owned().unwrap().into_iter().map(|(p, _)| p.get()).collect();
            assert_eq!(found, vec![r.first.get()], "own write through the index");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(s.handle().stats().segment_count > 3);
}

/// An index file from another log whose segments have the same bases and event counts (a
/// restored or reused directory) is not trusted: the fingerprint of the segment's content
/// differs, so it is rebuilt, and reads and conditions answer from this log.
#[test]
fn another_logs_index_files_are_rebuilt_not_trusted() {
    let (a, b) = (dir(), dir());
    for (d, name) in [(&a, "alpha"), (&b, "bravo")] {
        let s = Store::open(d.path(), biased(1)).unwrap();
        let h = s.handle();
        for i in 1..=40u64 {
            h.append(vec![ev("Ev", &[&format!("{name}:{}", i % 10)], b"0123456789")], None).unwrap();
        }
        assert!(h.stats().segment_count >= 3);
    }
    // Same layout, other content: swap in alpha's index files while bravo is closed.
    let (ia, ib) = (a.path().join("tagindex"), b.path().join("tagindex"));
    std::fs::remove_dir_all(&ib).unwrap();
    std::fs::create_dir(&ib).unwrap();
    for e in std::fs::read_dir(&ia).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), ib.join(e.file_name())).unwrap();
    }
    let s = Store::open(b.path(), biased(1)).unwrap();
    let h = s.handle();
    let found: Vec<u64> = h.read(tag_query(&["bravo:3"]), Position::ZERO, None).collect_owned().unwrap().into_iter().map(|(p, _)| p.get()).collect();
    assert_eq!(found, vec![3, 13, 23, 33]);
    assert!(h.read(tag_query(&["alpha:3"]), Position::ZERO, None).collect_owned().unwrap().is_empty());
    let guard = AppendCondition::exists_only(tag_query(&["bravo:3"]));
    assert_eq!(
        h.append(vec![ev("X", &["x"], b"")], Some(guard)),
        Err(AppendError::Conflict { clause: ConflictClause::Existence, at: ConflictSite::Durable(3) })
    );
}
