//! A slow read never blocks a connection's other requests (docs/operations.md §4.1), measured
//! on its own: this timing test has its own test binary, so that no other test of the suite
//! shares the two cores while it measures (next to server_wire's other tests, CI saw an append
//! wait up to 0.39 of the reads' time, where alone it waits a few percent).

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::{ev, RawConn, Server};
use tephra::client::Client;
use tephra::proto::{self, request, response, Request};
use tephra_test_support as support;

fn start(env: &[(&str, &str)]) -> Server {
    Server::start(&PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")), env)
}

fn frame(msg: &Request) -> Vec<u8> {
    let mut buf = Vec::new();
    proto::encode_frame(msg, u32::MAX, &mut buf).unwrap();
    buf
}

/// docs/operations.md §4.1: a slow read never blocks a connection's other requests. One shard
/// serves a connection with many pipelined reads that scan 300k events and match none (their
/// tag is on every event, so the planner scans) and another that appends one event at a time.
/// The appends must keep being answered while the reads run: before reads ran in bounded steps
/// on a queue of their own, an ack waited behind the whole pile of scans (665 ms of 665 here;
/// now about 15 ms).
#[test]
fn long_scanning_reads_do_not_hold_up_appends_on_their_shard() {
    let srv = start(&[("TEPHRA__SERVER__READS__WORKER_THREADS", "1")]);
    let mut c = Client::connect(srv.addr).unwrap();
    for _ in 0..300 {
        c.append((0..1000).map(|_| ev("Common", &["tenant:a"], &[7u8; 64])).collect::<Vec<_>>(), None).unwrap();
    }
    let rare = proto::Query { all: false, items: vec![proto::QueryItem { types: vec!["Rare".into()], tags: vec!["tenant:a".into()] }] };
    const READS: u64 = 32;
    let mut raw = RawConn::connect_hello(srv.addr);
    raw.stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let (addr, stop) = (srv.addr, stop.clone());
        thread::spawn(move || {
            let mut c = Client::connect(addr).unwrap();
            c.append(vec![ev("Probe", &[], b"")], None).unwrap();
            let mut lat = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                c.append(vec![ev("Probe", &[], b"")], None).unwrap();
                lat.push(t.elapsed());
            }
            lat
        })
    };
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let mut burst = Vec::new();
    for id in 0..READS {
        burst.extend(frame(&Request::new(10 + id, request::Kind::Read(proto::ReadRequest { query: Some(rare.clone()), ..Default::default() }))));
    }
    raw.send_bytes(&burst);
    let mut ended = 0;
    while ended < READS {
        let r = raw.recv().expect("a response");
        match r.kind {
            Some(response::Kind::ReadEnd(_)) => ended += 1,
            other => panic!("only ReadEnds expected (nothing matches), got {other:?}"),
        }
    }
    let reads_took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let lat = appender.join().unwrap();
    let worst = lat.iter().max().copied().unwrap_or_default();
    assert!(lat.len() >= 10, "the appender made {} appends in {reads_took:?}", lat.len());
    // The test means something only if the scans kept the shard busy for a while.
    assert!(reads_took >= Duration::from_millis(200), "the reads took only {reads_took:?}");
    // Behind the pile of scans an ack waits about as long as the reads take (the ratio was
    // 1.0); served in bounded steps it waits a few percent of it.
    assert!(worst < reads_took / 4, "an append waited {worst:?} while the reads took {reads_took:?}");
}
