//! Side-by-side embedded append benchmark: our engine against the reference engine crate
//! (`tephra = "=0.4.1"` from crates.io) on the same disk, same workload, in one run.
//!
//! Workload (docs/benchmarks.md §2): `--writers` threads (16), each
//! appending batches of `--batch` events with a 256-byte zero payload, one type out of ten and
//! one tag renewed every 10 appends, every append guarded by a one-tag, one-type condition with
//! `after = 0` that never fires. Runs alternate ours/reference `--rounds` times so machine drift
//! cancels; the table quotes the median round.
//!
//! ```text
//! cargo run --release -p engine-compare -- --dir /path/on/real/disk [--seconds 5] [--rounds 3]
//! ```

use clap::Parser;
use hdrhistogram::Histogram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Directory on the disk to measure (a fresh store is created under it per run).
    #[arg(long, default_value = "target/engine-compare")]
    dir: PathBuf,
    /// Concurrent appending threads.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Batch sizes (events per append) to run.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512")]
    batch: Vec<usize>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Warm-up seconds per run (not measured).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Alternating rounds (ours, reference) per batch size.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Segment size in bytes (the server default, 256 MiB).
    #[arg(long, default_value_t = 256 << 20)]
    segment_size: u64,
}

#[derive(Clone, Debug)]
struct RunResult {
    events_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

/// One appender abstraction over both engines.
trait Engine: Send + Sync + 'static {
    fn append(&self, ty: &str, tag: &str, batch: usize, payload: &[u8]);
}

struct Ours(tephra::StoreHandle);

impl Engine for Ours {
    fn append(&self, ty: &str, tag: &str, batch: usize, payload: &[u8]) {
        use tephra::*;
        let t = EventType::new(ty).unwrap();
        let tags = Tags::new([tag]).unwrap();
        let events = (0..batch).map(|_| Event::new(&t, &tags, payload).unwrap()).collect();
        let cond = AppendCondition::new(Query::item(QueryItem::new(vec![t.clone()], tags.clone())));
        self.0.append(events, Some(cond)).expect("append");
    }
}

struct Reference(tephra_ref::WriteHandle);

impl Engine for Reference {
    fn append(&self, ty: &str, tag: &str, batch: usize, payload: &[u8]) {
        use tephra_ref::*;
        let t = EventType::new(ty).unwrap();
        let tags = Tags::new([Tag::new(tag).unwrap()]).unwrap();
        let events = (0..batch).map(|_| Event::new(&t, &tags, payload).unwrap()).collect();
        let cond = AppendCondition::new(Query::item(QueryItem::new(vec![t.clone()], tags.clone())));
        self.0.append(events, Some(cond)).expect("append");
    }
}

fn drive(engine: Arc<dyn Engine>, writers: usize, batch: usize, warmup: Duration, measure: Duration) -> RunResult {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(writers + 1));
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (engine, stop, measuring, barrier) = (engine.clone(), stop.clone(), measuring.clone(), barrier.clone());
            std::thread::spawn(move || {
                let payload = vec![0u8; 256];
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                let mut events = 0u64;
                let mut tag = String::new();
                barrier.wait();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if i.is_multiple_of(10) {
                        tag = format!("stream-{}-", uuid::Uuid::new_v4());
                    }
                    let ty = format!("test-{}", (i + w as u64) % 10);
                    let t = Instant::now();
                    engine.append(&ty, &tag, batch, &payload);
                    if measuring.load(Ordering::Relaxed) {
                        hist.record((t.elapsed().as_micros() as u64).max(1)).unwrap();
                        events += batch as u64;
                    }
                    i += 1;
                }
                (hist, events)
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(warmup);
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(measure);
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut events = 0;
    for t in threads {
        let (h, e) = t.join().unwrap();
        hist.add(h).unwrap();
        events += e;
    }
    RunResult { events_per_sec: events as f64 / elapsed.as_secs_f64(), p50_us: hist.value_at_quantile(0.5), p99_us: hist.value_at_quantile(0.99) }
}

fn run_ours(dir: &std::path::Path, args: &Args, batch: usize) -> RunResult {
    let store = tephra::Store::open(dir, tephra::StoreConfig::new(tephra::SegmentConfig::new(args.segment_size))).unwrap();
    let r = drive(Arc::new(Ours(store.handle())), args.writers, batch, Duration::from_secs_f64(args.warmup), Duration::from_secs_f64(args.seconds));
    store.shutdown();
    r
}

fn run_reference(dir: &std::path::Path, args: &Args, batch: usize) -> RunResult {
    let set = tephra_ref::SegmentSet::open(dir, tephra_ref::SegmentConfig::new(args.segment_size as usize)).unwrap();
    let (coord, handle) = tephra_ref::WriteCoordinator::start(set, tephra_ref::WriterConfig::default()).unwrap();
    let r = drive(Arc::new(Reference(handle)), args.writers, batch, Duration::from_secs_f64(args.warmup), Duration::from_secs_f64(args.seconds));
    drop(coord);
    r
}

fn median(mut v: Vec<RunResult>) -> RunResult {
    v.sort_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec));
    v[v.len() / 2].clone()
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir).unwrap();
    println!("| batch | ours events/s | ours p50 | ours p99 | reference events/s | ref p50 | ref p99 | throughput ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for &batch in &args.batch {
        let (mut ours, mut refs) = (Vec::new(), Vec::new());
        for round in 0..args.rounds {
            for which in [0, 1] {
                let d = tempfile::tempdir_in(&args.dir).unwrap();
                let r = if which == 0 { run_ours(d.path(), &args, batch) } else { run_reference(d.path(), &args, batch) };
                eprintln!(
                    "batch {batch} round {round} {}: {:.0} events/s p50 {} µs p99 {} µs",
                    ["ours", "reference"][which],
                    r.events_per_sec,
                    r.p50_us,
                    r.p99_us
                );
                if which == 0 {
                    ours.push(r)
                } else {
                    refs.push(r)
                }
            }
        }
        let (o, r) = (median(ours), median(refs));
        println!(
            "| {batch} | {:.0} | {:.2} ms | {:.2} ms | {:.0} | {:.2} ms | {:.2} ms | {:.2}x |",
            o.events_per_sec,
            o.p50_us as f64 / 1000.0,
            o.p99_us as f64 / 1000.0,
            r.events_per_sec,
            r.p50_us as f64 / 1000.0,
            r.p99_us as f64 / 1000.0,
            o.events_per_sec / r.events_per_sec
        );
    }
}
