//! Our `tephra-server` at its limits: out of file descriptors, descriptors kept for the log, and
//! a slow listing that must not hold up its shard's other connections. Seed "Connection limits
//! and reaping".

use tephra_test_support as support;
mod server_util;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use server_util::*;
use support::{ev, RawConn, Server};
use tephra::client::Client;
use tephra::proto::{self, request, response, Request};

/// Our server started under `ulimit -n files` (through a wrapper script in the returned
/// directory, which must outlive the server).
fn start_with_open_files(files: u32, env: &[(&str, &str)]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let wrapper = dir.path().join(format!("tephra-server-{files}-files"));
    std::fs::write(&wrapper, format!("#!/bin/sh\nulimit -n {files} || exit 1\nexec '{}' \"$@\"\n", bin().display())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let srv = Server::start(&wrapper, env);
    (dir, srv)
}

/// Out of file descriptors, a server resets the connections it cannot take (its listener's
/// queue is shut down and listened on again) instead of leaving them in the backlog until their
/// clients give up (CI once saw the first version, which accepted and reset them with a
/// reserve descriptor, hang a connection: another shard had taken the freed descriptor), and says so about once a second (review:
/// under `ulimit -n 48`, 33 of 60 Hellos hung and the log took ~190 lines a second). Once
/// connections close, new ones are served again.
#[test]
fn out_of_descriptors_new_connections_are_reset_not_left_hanging() {
    let (_dir, srv) = start_with_open_files(48, &[]);
    assert!(srv.log().contains("the open-files limit leaves no room for server.limits.max_connections"), "{}", srv.log());
    let (mut answered, mut refused) = (0, 0);
    let mut held = Vec::new();
    for _ in 0..60 {
        // While a shard resets its queue its listener is briefly out of the group: a connect
        // may be refused then, which is as prompt an answer as a reset.
        let stream = match TcpStream::connect(srv.addr) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                refused += 1;
                continue;
            }
            Err(e) => panic!("connect: {e}"),
        };
        let mut raw = RawConn { stream, dec: proto::FrameDecoder::new(proto::DEFAULT_MAX_FRAME_LEN) };
        raw.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut hello = Vec::new();
        proto::encode_frame(&Request::hello(1, None), proto::DEFAULT_MAX_FRAME_LEN, &mut hello).unwrap();
        if raw.stream.write_all(&hello).is_err() {
            // Reset before the Hello went out.
            refused += 1;
            continue;
        }
        let started = Instant::now();
        let mut buf = [0u8; 64];
        match raw.stream.read(&mut buf) {
            Ok(n) if n > 0 => answered += 1,
            Ok(_) => refused += 1,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => refused += 1,
            Err(e) => panic!("connection {} waited {:?}: {e}", answered + refused, started.elapsed()),
        }
        held.push(raw);
    }
    assert!(answered >= 5 && refused >= 10, "answered {answered}, refused {refused}");
    let log = srv.log();
    let said = log.matches("accept failed").count() + log.matches("open-files limit is nearly reached").count();
    assert!((1..=6).contains(&said), "{said} accept warnings:\n{log}");
    // Refused at accept to keep descriptors for the log (an eighth of 48 here), or, once
    // the log's own files took those too, reset when accept runs out.
    assert!(
        log.contains("new connections are refused, keeping descriptors for the log") || log.contains("out of file descriptors; new connections are reset"),
        "{log}"
    );
    drop(held);
    let started = Instant::now();
    loop {
        match Client::connect(srv.addr) {
            Ok(mut c) => {
                // Connects refused by the kernel never reached a queue; the resets are counted.
                assert!(c.stats().unwrap().connections_refused >= 1);
                break;
            }
            Err(_) if started.elapsed() < Duration::from_secs(10) => thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("still refused 10 s after the connections closed: {e}"),
        }
    }
}

/// A stats request lists the data directory, which can wait for the disk; the shard's other
/// connections do not wait with it (the listing was on the shard's thread: a Hello on the
/// same shard waited seconds under a loaded disk, review). Held here at a pause point.
#[test]
fn a_slow_stats_listing_does_not_hold_up_its_shards_other_connections() {
    let Some(crash_bin) = support::crash_points_binary() else { return };
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let release = tmp.path().join("release");
    let release_s = release.display().to_string();
    let env = [("TEPHRA_CRASH_POINT", "stats_scan:pause"), ("TEPHRA_CRASH_RELEASE", release_s.as_str()), ("TEPHRA__SERVER__READS__WORKER_THREADS", "1")];
    let srv = Server::start(&crash_bin, &env);
    let mut held = RawConn::connect_hello(srv.addr);
    held.send(&Request::new(2, request::Kind::Stats(proto::StatsRequest {})));
    assert!(srv.log_shows("pause point stats_scan", Duration::from_secs(10)), "{}", srv.log());
    // The only shard serves a new connection meanwhile.
    let t = Instant::now();
    let mut other = RawConn::connect(srv.addr);
    other.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    other.send(&Request::hello(1, None));
    let ack = other.dec.read_next(&mut other.stream).unwrap_or_else(|e| panic!("no HelloAck while a stats listing is held: {e}"));
    assert!(ack.is_some());
    let mut c = Client::connect(srv.addr).unwrap();
    c.append([ev("A", &["t"], b"x")], None).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    std::fs::write(format!("{release_s}-stats_scan"), b"").unwrap();
    let r = held.recv().unwrap();
    assert!(matches!((r.request_id, &r.kind), (2, Some(response::Kind::Stats(_)))), "{r:?}");
}

/// Idle connections up to the open-files limit do not starve the log of descriptors: with
/// `ulimit -n 128` and 200 connections opened, those that would leave fewer than 16 free are
/// refused at accept, and appends rolling over a few small segments succeed (review: 284 of
/// 300 were refused, "Too many open files", at each new segment). Segments beyond the reserve
/// (each holds a descriptor) may have appends refused, but never stop the writer: once the
/// idle connections close, appends go on (review: the naming's directory sync failed with
/// EMFILE and stopped the writer until a restart).
#[test]
fn connections_leave_descriptors_for_the_log() {
    let (_dir, srv) = start_with_open_files(128, &[("TEPHRA__SEGMENT__SIZE", "65536")]);
    let mut c = Client::connect(srv.addr).unwrap();
    let idle: Vec<std::net::TcpStream> = (0..200).map(|_| std::net::TcpStream::connect(srv.addr).unwrap()).collect();
    // Let the shards accept (or refuse) them all.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !srv.log().contains("open-files limit is nearly reached") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(srv.log().contains("open-files limit is nearly reached"), "{}", srv.log());
    let payload = [7u8; 3000];
    // About 21 appends fill a segment: 80 take 3 new segments, well within the reserve.
    for i in 0..80u32 {
        c.append([ev("E", &["k:1"], &payload)], None).unwrap_or_else(|e| panic!("append {i}: {e}\n{}", srv.log()));
    }
    let stats = c.stats().unwrap();
    assert!(stats.segment_count >= 4 && stats.connections_refused > 0, "{stats:?}");
    // Past the reserve: the idle connections are closed after 10 s in any case (an append
    // whose new segment waits for a descriptor waits with it).
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        drop(idle);
    });
    let mut refused = 0;
    for _ in 0..600u32 {
        if c.append([ev("E", &["k:1"], &payload)], None).is_err() {
            refused += 1;
        }
    }
    closer.join().unwrap();
    for i in 0..50u32 {
        c.append([ev("E", &["k:1"], &payload)], None)
            .unwrap_or_else(|e| panic!("append {i} after the connections closed ({refused} refused before): {e}\n{}", srv.log()));
    }
    let stats = c.stats().unwrap();
    assert_eq!(stats.writer_stopped, "", "{stats:?}");
}
