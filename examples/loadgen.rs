//! Embedded load for profiling: N threads, batch B, conditional appends as in the seed's table.
use std::sync::Arc;
use std::time::Instant;
use tephra::*;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let dir = &a[1];
    let writers: usize = a[2].parse().unwrap();
    let batch: usize = a[3].parse().unwrap();
    let appends: usize = a[4].parse().unwrap();
    let store = Store::open(dir, StoreConfig::new(SegmentConfig::new(256 << 20))).unwrap();
    let h = Arc::new(store.handle());
    let t = Instant::now();
    let th: Vec<_> = (0..writers).map(|w| { let h = h.clone(); std::thread::spawn(move || {
        let payload = [0u8; 256];
        let mut tag = String::new();
        for i in 0..appends {
            if i % 10 == 0 { tag = format!("stream-{w}-{i}-{}", i * 7919); }
            let ty = EventType::new(format!("test-{}", (i + w) % 10)).unwrap();
            let tags = Tags::new([tag.clone()]).unwrap();
            let events = (0..batch).map(|_| Event::new(&ty, &tags, &payload).unwrap()).collect();
            let c = AppendCondition::new(Query::item(QueryItem::new(vec![ty.clone()], tags.clone())));
            h.append(events, Some(c)).unwrap();
        } }) }).collect();
    for t in th { t.join().unwrap(); }
    let el = t.elapsed();
    let m = h.metrics().snapshot();
    println!("{} events in {:?}: {:.0} events/s; commits {} batch p50 {}", writers*appends*batch, el, (writers*appends*batch) as f64/el.as_secs_f64(), m.commits, m.batch_events.value_at_quantile(0.5));
}
