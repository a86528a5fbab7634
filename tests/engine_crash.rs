//! Crash: a child process appends continuously from several threads and records every
//! acknowledged range in a witness file; the parent SIGKILLs it at a random moment, reopens the
//! store and checks that every acknowledged event is present byte for byte at its acknowledged
//! position, that positions `1..=head` have no hole, and that the next append lands at
//! `head + 1` (docs/architecture.md §4.1: nobody is answered before the batch is durable).
//!
//! The witness is written with one `write(2)` per line and no fsync: the child is killed, not
//! the machine, so the page cache keeps every completed write.

mod engine_util;

use engine_util::*;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use tephra::*;

const SEGMENT: u64 = 16 * 1024;
const THREADS: u64 = 3;

/// The events of append `seq` of `thread` in child run `run`; the parent rebuilds them from the
/// witness.
fn events(run: u64, thread: u64, seq: u64) -> Vec<Event> {
    (0..1 + seq % 3)
        .map(|k| {
            let len = ((seq * 7 + k * 13 + run) % 300 + 1) as usize;
            let payload: Vec<u8> = (0..len).map(|i| (i as u64 * 17 + seq + k + thread) as u8).collect();
            ev(&format!("T{thread}"), &[&format!("run:{run}"), &format!("th:{thread}"), &format!("id:{run}:{thread}:{seq}:{k}")], &payload)
        })
        .collect()
}

/// Child mode: runs only when the parent sets `TEPHRA_CRASH_DIR`; appends until killed.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var("TEPHRA_CRASH_DIR") else { return };
    let witness = std::env::var("TEPHRA_CRASH_WITNESS").unwrap();
    let run: u64 = std::env::var("TEPHRA_CRASH_RUN").unwrap().parse().unwrap();
    let store = Store::open(&dir, cfg(SEGMENT)).unwrap();
    let file = std::fs::OpenOptions::new().append(true).create(true).open(&witness).unwrap();
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let h = store.handle();
            let mut file = file.try_clone().unwrap();
            s.spawn(move || {
                for seq in 0.. {
                    // Every fourth append carries an idempotency guard on its own fresh key,
                    // which must pass.
                    let cond = (seq % 4 == 0)
                        .then(|| AppendCondition::exists_only(Query::item(QueryItem::with_tags(Tags::new([format!("id:{run}:{thread}:{seq}:0")]).unwrap()))));
                    let r = h.append(events(run, thread, seq), cond).unwrap();
                    let line = format!("{run} {thread} {seq} {} {}\n", r.first.get(), r.last.get());
                    file.write_all(line.as_bytes()).unwrap();
                }
            });
        }
    });
}

struct Ack {
    run: u64,
    thread: u64,
    seq: u64,
    first: u64,
    last: u64,
}

fn acks(witness: &Path) -> Vec<Ack> {
    let text = std::fs::read_to_string(witness).unwrap_or_default();
    // Only complete lines are acknowledgements the child finished recording.
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .map(|l| {
            let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            Ack { run: v[0], thread: v[1], seq: v[2], first: v[3], last: v[4] }
        })
        .collect()
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_event() {
    let data = dir();
    let side = dir();
    let witness = side.path().join("witness");
    let mut rng = Rng::from_time("crash");
    // Events the parent itself appended after each recovery, by position.
    let mut own: Vec<(u64, Event)> = Vec::new();
    let mut runs_with_acks = 0;
    for run in 0..4u64 {
        let before = acks(&witness).len();
        let mut c = child(
            "crash_child",
            &[
                ("TEPHRA_CRASH_DIR", data.path().display().to_string()),
                ("TEPHRA_CRASH_WITNESS", witness.display().to_string()),
                ("TEPHRA_CRASH_RUN", run.to_string()),
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        // Wait for the first acknowledgement of this run, then kill at a random moment.
        let t = Instant::now();
        while acks(&witness).len() == before {
            if let Some(status) = c.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("child exited on its own ({status}): {err}");
            }
            assert!(t.elapsed() < Duration::from_secs(30), "child made no progress");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(2_000 + rng.below(60_000)));
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();

        let all = acks(&witness);
        runs_with_acks += (all.len() > before) as u32;
        let store = Store::open(data.path(), cfg(SEGMENT)).unwrap();
        let h = store.handle();
        let head = h.head().get();
        let log = read_all(&h);
        // No hole: positions are exactly 1..=head.
        assert_eq!(log.len() as u64, head, "run {run}: {} events for head {head}", log.len());
        for (i, (p, _)) in log.iter().enumerate() {
            assert_eq!(*p, i as u64 + 1, "run {run}: hole before position {p}");
        }
        // Every acknowledged event is there, byte for byte, at its acknowledged position.
        let mut covered = std::collections::BTreeSet::new();
        for a in &all {
            let want = events(a.run, a.thread, a.seq);
            assert_eq!(a.last - a.first + 1, want.len() as u64);
            assert!(a.last <= head, "run {run}: acknowledged {}..={} but head is {head} ({:?})", a.first, a.last, store.open_outcome());
            for (k, e) in want.iter().enumerate() {
                let p = a.first + k as u64;
                assert!(covered.insert(p), "position {p} acknowledged twice");
                assert_eq!(log[(p - 1) as usize].1.as_bytes(), e.as_bytes(), "run {run}: position {p} differs from its acknowledgement");
            }
        }
        for (p, e) in &own {
            assert_eq!(log[(p - 1) as usize].1.as_bytes(), e.as_bytes(), "run {run}: the parent's event at {p} changed");
        }
        // The next append lands right after the recovered head.
        let e = ev("Parent", &[&format!("after-run:{run}")], b"p");
        let r = h.append(vec![e.clone()], None).unwrap();
        assert_eq!(r.first.get(), head + 1);
        own.push((head + 1, e));
        eprintln!("run {run}: {} acks in total, head {head}, outcome {:?}, {} segments", all.len(), store.open_outcome(), h.stats().segment_count);
    }
    assert_eq!(runs_with_acks, 4);
    let (head, _) = own.last().unwrap();
    if *head > 3 * SEGMENT / 100 {
        // More than a few segments' worth of events (each framed event is well over 100 bytes
        // on average): the runs crossed segment boundaries.
        assert!(segments(data.path()).len() > 1, "{head} events in one {SEGMENT}-byte segment");
    }
}
