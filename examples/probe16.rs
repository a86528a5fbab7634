use std::sync::Arc;
use std::time::Instant;
use tephra::*;
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let writers: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(16);
    let store = Store::open(&dir, StoreConfig::new(SegmentConfig::new(256 << 20))).unwrap();
    let h = Arc::new(store.handle());
    let t = Instant::now();
    let th: Vec<_> = (0..writers).map(|w| { let h = h.clone(); std::thread::spawn(move || {
        for i in 0..300 { let e = Event::new(&EventType::new("T").unwrap(), &Tags::new([format!("k:{w}:{i}")]).unwrap(), &[0u8;256]).unwrap();
            let c = if std::env::var("COND").is_ok() { Some(AppendCondition::new(Query::item(QueryItem::new(vec![EventType::new(format!("test-{}", i%10)).unwrap()], Tags::new([format!("k:{w}:{i}")]).unwrap())))) } else { None }; h.append(vec![e], c).unwrap(); } }) }).collect();
    for t in th { t.join().unwrap(); }
    let el = t.elapsed();
    let m = h.metrics().snapshot();
    println!("{} appends in {:?}: {:.0}/s; commits {} batch p50 {} max {}; fsync p50 {}us p99 {}us max {}us",
        writers*300, el, (writers*300) as f64/el.as_secs_f64(), m.commits, m.batch_events.value_at_quantile(0.5), m.batch_events.max(),
        m.fsync_us.value_at_quantile(0.5), m.fsync_us.value_at_quantile(0.99), m.fsync_us.max());
}
