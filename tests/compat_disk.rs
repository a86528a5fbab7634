//! Data-directory compatibility with the reference, both ways (docs/compatibility.md §1).
//!
//! 1. The REFERENCE server writes a store (small segments, so it rolls over several times);
//!    our engine opens the directory and reads every event back equal.
//! 2. Our engine writes a store; the reference server opens it and serves every event back
//!    equal, and then appends after it at the right position.
//!
//! Needs `TEPHRA_REFERENCE_SERVER` (set by `scripts/test.sh`); skipped loudly without it.

use tephra_test_support as support;

use support::Server;
use tephra::client::Client;
use tephra::*;

const SEGMENT: u64 = 64 * 1024;

fn ev(i: usize) -> Event {
    let tags: Vec<String> = vec![format!("k:{}", i % 7), format!("n:{i}")];
    let payload: Vec<u8> = (0..(i * 37) % 900).map(|b| (b ^ i) as u8).collect();
    Event::new(&EventType::new(format!("T{}", i % 3)).unwrap(), &Tags::new(tags).unwrap(), &payload).unwrap()
}

/// Events 0 to 399 (and a few past, to end the last batch) in batches of 1 to 5.
fn batches() -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < 400 {
        let batch: Vec<Event> = (i..i + 1 + i % 5).map(ev).collect();
        i += batch.len();
        out.push(batch);
    }
    out
}

fn same(a: &Event, b: &Event) -> bool {
    a.as_bytes() == b.as_bytes()
}

#[test]
fn a_reference_directory_opens_here_with_every_event_equal() {
    let Some(bin) = support::reference_binary() else { return };
    let seg = SEGMENT.to_string();
    let mut srv = Server::start(&bin, &[("TEPHRA__SEGMENT__SIZE", &seg)]);
    let dir = srv.data_dir();
    let mut c = Client::connect(srv.addr).unwrap();
    let mut sent = Vec::new();
    for batch in batches() {
        c.append(batch.clone(), None).unwrap();
        sent.extend(batch);
    }
    drop(c);
    // SIGKILL: the reference made every acknowledged batch durable; keep `srv` (its temp dir).
    srv.kill();
    let segments = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log")).count();
    assert!(segments >= 3, "the reference should have rolled over several times, got {segments} segments");

    let store = Store::open(&dir, StoreConfig::new(SegmentConfig::new(SEGMENT))).unwrap();
    assert_eq!(store.open_outcome(), &tephra::log::OpenOutcome::Clean);
    let h = store.handle();
    let got = h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    assert_eq!(got.len(), sent.len());
    for (k, ((p, e), s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(p.get(), k as u64 + 1);
        assert!(same(e, s), "event {} differs", k + 1);
    }
    // Backward, through the segment boundaries, too.
    let back = h.read_back(Query::all(), Position::MAX, None).collect_owned().unwrap();
    assert_eq!(back.len(), sent.len());
    assert!(back.iter().rev().zip(&sent).all(|((_, e), s)| same(e, s)));
    // And we append after it at the right position.
    let r = h.append(vec![ev(9999)], None).unwrap();
    assert_eq!(r.first.get(), sent.len() as u64 + 1);
}

#[test]
fn a_directory_written_here_is_served_completely_by_the_reference() {
    let Some(bin) = support::reference_binary() else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = dir.path().join("data");
    let mut sent = Vec::new();
    {
        let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(SEGMENT))).unwrap();
        let h = store.handle();
        for batch in batches() {
            h.append(batch.clone(), None).unwrap();
            sent.extend(batch);
        }
        store.shutdown();
    }
    // Shutdown leaves no spare segment behind; plant one as a crash mid-preparation would:
    // the reference must ignore it (discovery matches only `{base:020}.log`).
    let spare = data.join(tephra::log::segment::PREPARED_NAME);
    assert!(!spare.exists(), "a spare segment survived shutdown");
    std::fs::write(&spare, vec![0u8; SEGMENT as usize]).unwrap();
    let seg = SEGMENT.to_string();
    let srv = Server::start_on(&bin, Some(&data), &[("TEPHRA__SEGMENT__SIZE", &seg)], None);
    let mut c = Client::connect(srv.addr).unwrap();
    let (got, watermark) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(watermark.get(), sent.len() as u64);
    assert_eq!(got.len(), sent.len());
    for (k, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(g.position().get(), k as u64 + 1);
        assert!(same(g.event(), s), "event {} differs", k + 1);
    }
    let r = c.append(vec![ev(9999)], None).unwrap();
    assert_eq!(r.first.get(), sent.len() as u64 + 1);
    drop(c);
    drop(srv);
    // Back here: the stale spare is removed when our writer opens the log, and nothing is lost.
    let store = Store::open(&data, StoreConfig::new(SegmentConfig::new(SEGMENT))).unwrap();
    let got = store.handle().read(Query::all(), Position::ZERO, None).collect_owned().unwrap();
    assert_eq!(got.len(), sent.len() + 1);
    store.shutdown();
    assert!(!spare.exists(), "the stale spare segment was not removed at open");
}
