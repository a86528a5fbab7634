//! Our `tephra-server` stopping on a signal: every acknowledged event flushed and answered,
//! subscriptions ended, clients that stopped reading or handshaking not holding it up, a second
//! signal, and a signal during startup. Seed "Shutdown".

use tephra_test_support as support;
mod server_util;

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use server_util::*;
use support::{ev, RawConn, Server};
use tephra::client::{Client, SubEvent};
use tephra::proto::{self, request, response, Request};
use tephra::{Position, Query};

#[test]
fn sigterm_flushes_every_acknowledged_event_ends_subscriptions_and_exits_zero() {
    let mut srv = Server::start(&bin(), &[]);
    let addr = srv.addr;
    // A live subscription, which the shutdown must end.
    let (sub_tx, sub_rx) = mpsc::channel();
    let subscriber = thread::spawn(move || {
        let mut c = Client::connect(addr).unwrap();
        let (sub, _cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
        let mut caught_up = false;
        for item in sub {
            match item {
                Ok(SubEvent::CaughtUp(_)) if !caught_up => {
                    caught_up = true;
                    sub_tx.send(()).unwrap();
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        Instant::now()
    });
    sub_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // Writers appending as fast as they can until the server goes away; remember every ack.
    // (position, payload) of every acknowledged append.
    type Acked = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
    let acked: Acked = Arc::default();
    let writers: Vec<_> = (0..4u8)
        .map(|w| {
            let acked = acked.clone();
            thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                for i in 0u32.. {
                    let payload = [&[w][..], &i.to_be_bytes()[..]].concat();
                    match c.append(vec![ev("E", &[&format!("w:{w}")], &payload)], None) {
                        Ok(r) => acked.lock().unwrap().push((r.first.get(), payload)),
                        Err(_) => break,
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    srv.signal(libc::SIGTERM);
    let status = srv.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", srv.log()));
    assert_eq!(status.code(), Some(0), "{}", srv.log());
    let ended_at = subscriber.join().unwrap();
    assert!(ended_at.duration_since(signalled) < Duration::from_secs(5));
    for w in writers {
        w.join().unwrap();
    }
    assert!(srv.log().contains("shutting down"), "{}", srv.log());
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() > 10, "too few appends before the signal: {}", acked.len());
    // Reopen: every acknowledged event is there, at its position, with its payload.
    srv.restart(&bin(), &[]);
    let mut c = Client::connect(srv.addr).unwrap();
    let (all, _) = c.read_all(Query::all(), Position::ZERO).unwrap();
    let max = acked.iter().map(|(p, _)| *p).max().unwrap();
    assert!(all.len() as u64 >= max, "{} events after reopen, acknowledged up to {max}", all.len());
    for (pos, payload) in &acked {
        assert_eq!(all[*pos as usize - 1].event.data(), &payload[..], "event {pos}");
    }
    assert!(all.iter().enumerate().all(|(i, e)| e.position.get() == i as u64 + 1));
}

#[test]
fn a_second_signal_during_a_slow_shutdown_exits_143() {
    // An idle subscription notices a shutdown on its next wait tick (docs/protocol.md §8, docs/operations.md §4.2), so
    // with a 5 s tick the graceful path takes seconds: time for the second signal.
    let mut srv = Server::start(&bin(), &[("TEPHRA__SERVER__SUBSCRIPTIONS__WAIT_TICK_MS", "5000")]);
    let mut raw = RawConn::connect_hello(srv.addr);
    raw.send(&Request::new(2, request::Kind::Subscribe(proto::SubscribeRequest { query: Some(proto::Query { all: true, items: vec![] }), after: 0 })));
    assert!(matches!(raw.recv().unwrap().kind, Some(response::Kind::CaughtUp(_))));
    thread::sleep(Duration::from_millis(100));
    srv.signal(libc::SIGTERM);
    thread::sleep(Duration::from_millis(200));
    if let Some(st) = srv.wait_exit(Duration::ZERO) {
        panic!("the graceful shutdown finished at once ({st:?}); the 143 path was not exercised");
    }
    // The listener is closed once shutdown begins.
    assert!(Client::connect(srv.addr).is_err(), "a new connection was accepted during shutdown");
    srv.signal(libc::SIGTERM);
    let status = srv.wait_exit(Duration::from_secs(3)).expect("no exit after the second signal");
    assert_eq!(status.code(), Some(143), "{}", srv.log());
}

#[test]
fn graceful_shutdown_is_not_held_up_by_a_client_that_stopped_reading() {
    let stats = |id| Request::new(id, request::Kind::Stats(proto::StatsRequest {}));
    shutdown_with_a_client_that_stopped_reading(&stats);
}

/// The same with appends: the reader then waits for an append budget permit, which answers
/// stuck behind the full control lane hold (it did not notice the shutdown: the process ran
/// until the client went away).
#[test]
fn graceful_shutdown_is_not_held_up_by_an_appender_that_stopped_reading() {
    let append = |id| {
        let event = proto::Event { r#type: "E".into(), tags: vec!["flood".into()], payload: vec![1] };
        Request::new(id, request::Kind::Append(proto::AppendRequest { events: vec![event], condition: None }))
    };
    shutdown_with_a_client_that_stopped_reading(&append);
}

fn shutdown_with_a_client_that_stopped_reading(request: &(dyn Fn(u64) -> Request + Sync)) {
    // The client pipelines requests and never reads: the control lane and the socket fill,
    // and the connection's reader is parked waiting to queue an answer. A SIGTERM must still
    // end the process promptly with exit 0 (reference: shutdown(Both) on every socket).
    let mut srv = Server::start(&bin(), &[("TEPHRA__SERVER__BACKPRESSURE__MAX_INFLIGHT_PER_CONN", "8")]);
    let mut raw = RawConn::connect(srv.addr);
    socket2::SockRef::from(&raw.stream).set_recv_buffer_size(4096).unwrap();
    raw.send(&Request::hello(1, None));
    assert!(raw.recv().is_some());
    let mut writer = raw.stream.try_clone().unwrap();
    let mut burst = Vec::new();
    for id in 0..1000u64 {
        proto::encode_frame(&request(10 + id), u32::MAX, &mut burst).unwrap();
    }
    let flooder = thread::spawn(move || {
        // Until the server stops reading (our writes block) and then goes away (they fail).
        for _ in 0..2000 {
            if writer.write_all(&burst).is_err() {
                break;
            }
        }
    });
    // Wait until the server side is backed up: our writes no longer progress.
    thread::sleep(Duration::from_millis(1500));
    let signalled = Instant::now();
    srv.signal(libc::SIGTERM);
    let status = srv.wait_exit(Duration::from_secs(15));
    let took = signalled.elapsed();
    let status = status.unwrap_or_else(|| panic!("still running 15 s after SIGTERM:\n{}", srv.log()));
    assert_eq!(status.code(), Some(0), "{}", srv.log());
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
    // The flooder may sit in a write to the exited server's orphaned socket, which holds our
    // unread answers (FIN-WAIT-1) and advertised a zero window; shutting our socket down wakes
    // it at once (dropping `raw` would not: the flooder's clone keeps the socket open, and the
    // write then waited out ~100 s of retransmission backoff when two of these tests ran side
    // by side).
    let _ = raw.stream.shutdown(std::net::Shutdown::Both);
    flooder.join().unwrap();
}

/// A client that pipelines appends and reads its answers gets the answer of every append the
/// server stored before a SIGTERM: the server stops reading, answers what it took, and closes
/// without a reset (a close with unread requests in the socket resets it, and a reset can cost
/// the client answers the server already sent: an append stored but never acknowledged, which
/// a client then retries into a duplicate). Here one connection sends without pause, so its
/// reader is busy (waiting for append budget) when the signal comes.
#[test]
fn sigterm_answers_every_append_it_stored_to_a_pipelining_client() {
    shutdown_answers_every_stored_append(1, None);
}

/// The same with eight connections sending bursts of 64 appends with pauses between them, so
/// that many readers wait for bytes, idle, when the signal comes (those connections were closed
/// at once, answers still queued: 1 to 214 stored appends without an answer per run in review).
#[test]
fn sigterm_answers_every_stored_append_also_to_connections_idle_at_the_signal() {
    for _ in 0..3 {
        shutdown_answers_every_stored_append(8, Some(Duration::from_millis(1)));
    }
}

fn shutdown_answers_every_stored_append(connections: usize, pause: Option<Duration>) {
    let mut srv = Server::start(&bin(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut sockets = Vec::new();
    let mut threads = Vec::new();
    for conn in 0..connections as u64 {
        let mut raw = RawConn::connect_hello(srv.addr);
        raw.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut writer = raw.stream.try_clone().unwrap();
        sockets.push(raw.stream.try_clone().unwrap());
        let stop = stop.clone();
        let flooder = thread::spawn(move || {
            let mut sent = 0u64;
            let mut frames = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                frames.clear();
                for _ in 0..64 {
                    sent += 1;
                    let payload = [conn.to_be_bytes(), sent.to_be_bytes()].concat();
                    let event = proto::Event { r#type: "E".into(), tags: vec!["pipelined".into()], payload };
                    let req = Request::new(10 + sent, request::Kind::Append(proto::AppendRequest { events: vec![event], condition: None }));
                    proto::encode_frame(&req, u32::MAX, &mut frames).unwrap();
                }
                if writer.write_all(&frames).is_err() {
                    break;
                }
                if let Some(p) = pause {
                    thread::sleep(p);
                }
            }
            sent
        });
        let acked = acked.clone();
        let reader = thread::spawn(move || loop {
            match raw.dec.read_next(&mut raw.stream) {
                Ok(Some(body)) => match <proto::Response as prost::Message>::decode(body).unwrap().kind {
                    Some(response::Kind::Append(a)) => {
                        assert_eq!(a.first, a.last);
                        acked.lock().unwrap().push(a.first);
                    }
                    other => panic!("unexpected answer {other:?}"),
                },
                Ok(None) => return "end of stream",
                Err(proto::FrameError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => return "reset",
                Err(e) => panic!("reading answers: {e}"),
            }
        });
        threads.push((flooder, reader));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 2_000 {
        assert!(Instant::now() < deadline, "too few answers before the signal");
        thread::sleep(Duration::from_millis(1));
    }
    srv.signal(libc::SIGTERM);
    let signalled = Instant::now();
    let status = srv.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", srv.log()));
    assert_eq!(status.code(), Some(0), "{}", srv.log());
    assert!(signalled.elapsed() < Duration::from_secs(8));
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    let mut ended = Vec::new();
    for ((flooder, reader), sock) in threads.into_iter().zip(&sockets) {
        ended.push(reader.join().unwrap());
        // A flooder blocked in a write to the exited server's socket wakes at the shutdown.
        let _ = sock.shutdown(std::net::Shutdown::Both);
        sent += flooder.join().unwrap();
    }
    srv.restart(&bin(), &[]);
    let stored = Client::connect(srv.addr).unwrap().stats().unwrap().event_count;
    assert!(sent > stored, "every request was stored: the test did not pipeline past the shutdown ({sent} sent)");
    let mut acked = std::mem::take(&mut *acked.lock().unwrap());
    acked.sort_unstable();
    acked.dedup();
    assert_eq!(acked.len() as u64, stored, "{stored} appends stored, {} acknowledged (connections ended by {ended:?})", acked.len());
}

#[test]
fn a_stalled_tls_handshake_does_not_hold_up_shutdown() {
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key) = support::self_signed(certs.path());
    // With every timeout off the handshake limit is an hour.
    let mut srv = Server::start_with(&bin(), &[("TEPHRA__SERVER__TIMEOUTS__INCOMPLETE_FRAME_SECS", "0")], Some(&support::tls_toml(&cert, &key)));
    let silent = TcpStream::connect(srv.addr).unwrap();
    let mut partial = TcpStream::connect(srv.addr).unwrap();
    partial.write_all(&[0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00]).unwrap();
    thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    srv.signal(libc::SIGTERM);
    let status = srv.wait_exit(Duration::from_secs(15)).expect("still running after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", srv.log());
    assert!(signalled.elapsed() < Duration::from_secs(5), "{:?}", signalled.elapsed());
    drop((silent, partial));
}

/// SIGINT and SIGHUP (a closed terminal, a supervisor's stop) shut down gracefully like
/// SIGTERM, as the reference's do (review: SIGHUP killed ours at once, exit 129).
#[test]
fn sigint_and_sighup_are_graceful_too() {
    for sig in [libc::SIGINT, libc::SIGHUP] {
        let mut srv = Server::start(&bin(), &[]);
        let mut c = Client::connect(srv.addr).unwrap();
        c.append(vec![ev("E", &["k:1"], b"x")], None).unwrap();
        srv.signal(sig);
        assert_eq!(srv.wait_exit(Duration::from_secs(10)).expect("exit").code(), Some(0), "signal {sig}");
        assert!(srv.log().contains("shutting down gracefully"), "{}", srv.log());
        assert!(c.stats().is_err());
        srv.restart(&bin(), &[]);
        assert_eq!(Client::connect(srv.addr).unwrap().stats().unwrap().event_count, 1);
    }
}

/// A signal while the server is still starting (here held before binding; in real life a long
/// recovery) stops it at once, instead of waiting for the start to finish (review: the signal
/// was taken only once the server listened). The store opens normally afterwards.
#[test]
fn a_signal_during_startup_stops_the_server_at_once() {
    let Some(paused_bin) = support::crash_points_binary() else { return };
    let (_tmp, data, release) = pause_scratch();
    let env = [("TEPHRA_CRASH_POINT", "before_bind:pause"), ("TEPHRA_CRASH_RELEASE", release.as_str())];
    let (mut child, rx) = spawn_on_port(&paused_bin, 0, &data, &env);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains("pause point before_bind") {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => seen.push_str(&format!("{line}\n")),
            Err(_) => {
                child.kill();
                panic!("the server never reached its pause:\n{seen}");
            }
        }
    }
    child.signal(libc::SIGTERM);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_status() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            child.kill();
            panic!("SIGTERM during startup did not stop the server:\n{seen}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
        seen.push_str(&format!("{line}\n"));
    }
    assert_eq!(status.code(), Some(143), "{seen}");
    assert!(seen.contains("signal during startup"), "{seen}");
    assert!(!seen.contains("server listening"), "{seen}");
    let srv = Server::start_on(&bin(), Some(&data), &[], None);
    let mut c = Client::connect(srv.addr).unwrap();
    assert_eq!(c.append([ev("A", &["t"], b"x")], None).unwrap().first, Position(1));
}
