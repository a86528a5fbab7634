//! Network load for profiling: N blocking connections, batch B, conditional appends.
use std::time::Instant;
use tephra::client::Client;
use tephra::*;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let addr = a[1].clone();
    let writers: usize = a[2].parse().unwrap();
    let batch: usize = a[3].parse().unwrap();
    let appends: usize = a[4].parse().unwrap();
    let t = Instant::now();
    let th: Vec<_> = (0..writers).map(|w| { let addr = addr.clone(); std::thread::spawn(move || {
        let mut c = Client::connect(addr.as_str()).unwrap();
        let payload = [0u8; 256];
        let mut tag = String::new();
        let mut lat = Vec::new();
        for i in 0..appends {
            if i % 10 == 0 { tag = format!("stream-{w}-{i}-{}", std::process::id()); }
            let ty = EventType::new(format!("test-{}", (i + w) % 10)).unwrap();
            let tags = Tags::new([tag.clone()]).unwrap();
            let events: Vec<Event> = (0..batch).map(|_| Event::new(&ty, &tags, &payload).unwrap()).collect();
            let cnd = AppendCondition::new(Query::item(QueryItem::new(vec![ty.clone()], tags.clone())));
            let s = Instant::now();
            c.append(events, Some(cnd)).unwrap();
            lat.push(s.elapsed());
        } lat }) }).collect();
    let mut lat: Vec<_> = th.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let el = t.elapsed();
    lat.sort();
    println!("{} events in {:?}: {:.0} events/s p50 {:?} p99 {:?}", writers*appends*batch, el, (writers*appends*batch) as f64/el.as_secs_f64(), lat[lat.len()/2], lat[lat.len()*99/100]);
}
