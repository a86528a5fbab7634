//! Regression test for the multi-shard append stall: one blocking client appending 96 batches of
//! 16 x 8 KiB events, on fresh servers, round after round. While the writer ran in its own
//! `Latency::Matters` task queue, with two shards an append was never answered within a few
//! dozen rounds: the server kept answering other requests on the same connection (a Stats after
//! it came back at once) and on new ones, the stuck append was never committed (event_count did
//! not move), and every thread was idle (shards parked in io_uring_enter). With one shard it did
//! not happen. Ignored by default (it takes a few seconds per round).
//!
//! ```text
//! cargo test --release --test server_stall_repro -- --ignored --nocapture
//! REPRO_SHARDS=1 cargo test --release --test server_stall_repro -- --ignored
//! ```

mod support;

use std::time::Duration;
use support::Server;
use tephra::client::Client;
use tephra::{Event, EventType, Tags};

#[test]
#[ignore = "slow: 40 rounds of 96 appends; run with --ignored"]
fn sequential_appends_never_stall() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let shards = std::env::var("REPRO_SHARDS").unwrap_or_else(|_| "0".into());
    for round in 0..40 {
        let srv = Server::start(&bin, &[("TEPHRA__SERVER__READS__WORKER_THREADS", shards.as_str())]);
        let mut c = Client::connect(srv.addr).unwrap();
        c.set_timeout(Some(Duration::from_secs(5))).unwrap();
        for b in 0..96u8 {
            let events: Vec<Event> = (0..16)
                .map(|i| {
                    let tag = format!("s:{b}-{i}");
                    Event::new(&EventType::new("Seed").unwrap(), &Tags::new([tag.as_str()]).unwrap(), &[b; 8192]).unwrap()
                })
                .collect();
            if let Err(e) = c.append(events, None) {
                let pid = srv.child.id();
                let mut out = format!("round {round}, batch {b}: no answer in 5 s ({e:?})\n");
                for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
                    let p = t.path();
                    let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
                    out += &format!("  thread {} wchan={} syscall={}\n", read("comm").trim(), read("wchan"), read("syscall").trim());
                }
                let same = c.stats();
                out += &format!("a Stats on the same connection right after: {same:?}\n");
                panic!("{out}server log:\n{}", srv.log());
            }
        }
    }
}
