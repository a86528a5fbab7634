//! Our `tephra-server` as monitoring sees it: `--healthcheck` (plain, TLS, at the connection
//! cap), the `/metrics` endpoint and what it counts. Seed "Monitoring".

use tephra_test_support as support;
mod server_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use server_util::*;
use support::{ev, run_to_exit, sample, Server};
use tephra::client::{Client, SubEvent};
use tephra::{Event, Position, Query};

#[test]
fn healthcheck_passes_against_a_live_server_and_fails_against_a_closed_port() {
    let srv = Server::start(&bin(), &[]);
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = scratch.path().join("never-created");
    let data_arg = data.display().to_string();
    let addr = srv.addr.to_string();
    let out = run_to_exit(&bin(), &["--healthcheck", "--bind", &addr, "--data-dir", &data_arg], &[], None, Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!data.exists(), "the healthcheck opened a store");
    // The bind address from the environment works the same; 0.0.0.0 maps to loopback.
    let any = format!("0.0.0.0:{}", srv.addr.port());
    let out = run_to_exit(&bin(), &["--healthcheck"], &[("TEPHRA__BIND", &any)], None, Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "{out:?}");

    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let out = healthcheck(&closed, None);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("healthcheck failed:"), "{}", out.stderr);

    // A port that accepts but never answers fails within the 5 s timeout.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let started = Instant::now();
    let out = healthcheck(&silent_addr, None);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
    assert!(out.stderr.contains("no answer within 5s"), "{}", out.stderr);
    // The same with a TLS configuration: the handshake's read runs out (not a raw "would block").
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key) = support::self_signed(certs.path());
    let out = healthcheck(&silent_addr, Some(&support::tls_toml(&cert, &key)));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("TLS handshake: no answer within 5s"), "{}", out.stderr);
    drop(silent);
}

#[test]
fn healthcheck_over_tls_with_a_token() {
    let (toml, cert, _certs) = support::tls_config_with_tokens(&["first", "second"]);
    let key = cert.with_file_name("key.pem");
    let srv = Server::start_with(&bin(), &[], Some(&toml));
    let addr = srv.addr.to_string();
    // The same configuration file: TLS pinned to the configured certificate, the first token.
    let out = healthcheck(&addr, Some(&toml));
    assert_eq!(out.code, Some(0), "{out:?}");
    // An end-entity certificate draws no CA warning from either.
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    assert!(!srv.log().contains("is a CA certificate"), "{}", srv.log());
    // A configuration whose first token the server does not accept fails.
    let wrong = format!("{}\n[[auth.tokens]]\ntoken = \"stale\"\n", support::tls_toml(&cert, &key));
    let out = healthcheck(&addr, Some(&wrong));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("healthcheck failed:"), "{}", out.stderr);
    // Pinning another certificate fails.
    let other_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (other_cert, other_key) = support::self_signed(other_dir.path());
    let pinned_wrong = format!("{}\n[[auth.tokens]]\ntoken = \"first\"\n", support::tls_toml(&other_cert, &other_key));
    let out = healthcheck(&addr, Some(&pinned_wrong));
    assert_eq!(out.code, Some(1), "{out:?}");
    // A plaintext healthcheck against the TLS port fails, and says why.
    let out = healthcheck(&addr, None);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("the server answered with TLS: give --healthcheck the server's configuration"), "{}", out.stderr);

    // The certificate is pinned, not name-checked: one issued for another name passes.
    let ck = rcgen::generate_simple_self_signed(vec!["tephra.internal".to_string()]).unwrap();
    let named = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (c2, k2) = (named.path().join("cert.pem"), named.path().join("key.pem"));
    std::fs::write(&c2, ck.cert.pem()).unwrap();
    std::fs::write(&k2, ck.key_pair.serialize_pem()).unwrap();
    let srv2 = Server::start_with(&bin(), &[], Some(&support::tls_toml(&c2, &k2)));
    let out = healthcheck(&srv2.addr.to_string(), Some(&support::tls_toml(&c2, &k2)));
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// A healthcheck turned away at the connection cap names the likely cause, and one given a
/// TLS configuration for a plaintext port says the server did not answer with TLS (not
/// rustls's "corrupt message" text).
#[test]
fn healthcheck_names_the_connection_cap_and_a_plaintext_port() {
    let srv = Server::start(&bin(), &[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")]);
    let addr = srv.addr.to_string();
    let held = Client::connect(srv.addr).unwrap();
    let out = healthcheck(&addr, None);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("before answering the Hello (a server at its connection limit, server.limits.max_connections"), "{}", out.stderr);
    drop(held);
    // A server without the cap: the one above frees its only slot when it has seen `held`
    // close, which may come after the next connect (CI once saw the cap's message here).
    let plain = Server::start(&bin(), &[]);
    let addr = plain.addr.to_string();
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key) = support::self_signed(certs.path());
    let out = healthcheck(&addr, Some(&support::tls_toml(&cert, &key)));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains(&format!("the server at {addr} did not answer with TLS (probably a plaintext port")), "{}", out.stderr);
    assert!(!out.stderr.contains("InvalidContentType"), "{}", out.stderr);
}

fn http(addr: SocketAddr, request_line: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{request_line}\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Drops the segment files under `dir` from the page cache (synced first, so they are clean).
fn evict_page_cache(dir: &std::path::Path) {
    for p in tephra::log::segment::list_segments(dir).unwrap().into_iter().map(|(_, p)| p) {
        let f = std::fs::File::open(&p).unwrap();
        f.sync_all().unwrap();
        nix::fcntl::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
    }
}

/// A read or a subscription that reaches data only the disk holds has it fetched on a
/// blocking thread (counted in `tephra_read_disk_fetches_total`), so its shard keeps serving
/// other connections, and still returns every event in order. After a restart nothing is in
/// memory, and the test drops the segment files from the page cache before each.
#[test]
fn cold_reads_and_subscriptions_fetch_off_the_shard_and_return_everything() {
    let env = [("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("TEPHRA__SEGMENT__SIZE", "262144")];
    let mut srv = Server::start(&bin(), &env);
    let mut c = Client::connect(srv.addr).unwrap();
    let mut payloads = Vec::new();
    for b in 0..60u32 {
        let batch: Vec<Event> = (0..50u32)
            .map(|i| {
                let p = format!("{b}:{i}:{}", "x".repeat(200)).into_bytes();
                payloads.push(p.clone());
                ev("E", &[&format!("b:{b}")], &p)
            })
            .collect();
        c.append(batch, None).unwrap();
    }
    drop(c);
    srv.restart(&bin(), &env);
    assert!(tephra::log::segment::list_segments(&srv.data_dir()).unwrap().len() >= 3, "want several segments");
    evict_page_cache(&srv.data_dir());
    let mut c = Client::connect(srv.addr).unwrap();
    let (all, _) = c.read_all(Query::all(), Position::ZERO).unwrap();
    let got: Vec<&[u8]> = all.iter().map(|e| e.event.data()).collect();
    assert_eq!(got, payloads.iter().map(|p| p.as_slice()).collect::<Vec<_>>());
    assert!(all.iter().enumerate().all(|(i, e)| e.position.get() == i as u64 + 1));
    evict_page_cache(&srv.data_dir());
    let (sub, _cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
    let mut delivered = Vec::new();
    for item in sub {
        match item.unwrap() {
            SubEvent::Event(e) => delivered.push(e.position.get()),
            SubEvent::CaughtUp(_) => break,
        }
    }
    assert_eq!(delivered, (1..=payloads.len() as u64).collect::<Vec<_>>());
    let body = http(srv.metrics_addr(), "GET /metrics HTTP/1.1");
    let fetches: u64 = sample(&body, "tephra_read_disk_fetches_total").parse().unwrap();
    assert!(fetches >= 2, "a cold read and a cold subscription, fetched {fetches} times");
}

/// A metrics client trickling its request line a byte a second is closed once 5 s have gone
/// by in all, not kept while each byte comes within the read timeout (review: 70 such
/// clients kept every scrape out for as long as they trickled).
#[test]
fn a_metrics_request_trickling_in_is_closed_after_five_seconds() {
    use std::io::{Read, Write};
    let srv = Server::start(&bin(), &[("TEPHRA__METRICS__BIND", "127.0.0.1:0")]);
    let maddr = srv.metrics_addr();
    let mut s = TcpStream::connect(maddr).unwrap();
    let mut r = s.try_clone().unwrap();
    let started = Instant::now();
    let closed = thread::spawn(move || {
        let mut b = [0u8; 64];
        r.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = r.read(&mut b);
        started.elapsed()
    });
    for b in b"GET /metrics HTTP/1.1".iter().take(12) {
        if s.write_all(&[*b]).is_err() || closed.is_finished() {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    let after = closed.join().unwrap();
    assert!(after >= Duration::from_secs(4) && after < Duration::from_secs(8), "closed after {after:?}");
    // Scrapes are served as before.
    assert!(http(maddr, "GET /metrics HTTP/1.1").contains("tephra_events_total 0"));
}

#[test]
fn metrics_endpoint_serves_the_reference_names_and_our_histograms() {
    let srv = Server::start(&bin(), &[("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "0")]);
    let maddr = srv.metrics_addr();
    assert_ne!(maddr.port(), srv.addr.port());
    // Connections that never send a request do not hold up a scrape (each waits out its own
    // 5 s; review: 3 of them delayed a scrape by 15 s).
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(maddr).unwrap()).collect();
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    // A fresh server: empty histograms sum to 0, not "-0" (an empty float sum is -0.0).
    let fresh = http(maddr, "GET /metrics HTTP/1.1");
    assert!(started.elapsed() < Duration::from_secs(3), "a scrape behind 3 idle connections took {:?}", started.elapsed());
    drop(idle);
    assert!(fresh.contains("tephra_fsync_seconds_sum 0\n"), "{fresh}");
    assert!(!fresh.lines().any(|l| !l.starts_with('#') && l.split(' ').nth(1).is_some_and(|v| v.starts_with('-'))), "{fresh}");
    let mut c = Client::connect(srv.addr).unwrap();
    c.append(vec![ev("E", &["k:1"], b"x")], None).unwrap();
    c.append(vec![ev("E", &["k:2"], b"y"), ev("E", &["k:3"], b"z")], None).unwrap();
    let _ = c.append(vec![ev("E", &["k:4"], b"")], Some(tephra::AppendCondition::new(Query::all()))).unwrap_err();

    let resp = http(maddr, "GET /metrics HTTP/1.1");
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    let reference = [
        ("tephra_events_total", "counter"),
        ("tephra_segments", "gauge"),
        ("tephra_disk_bytes", "gauge"),
        ("tephra_uptime_seconds", "gauge"),
        ("tephra_active_connections", "gauge"),
        ("tephra_active_subscriptions", "gauge"),
        ("tephra_connections_refused_total", "counter"),
        ("tephra_connections_reaped_total", "counter"),
        ("tephra_max_connections", "gauge"),
        ("tephra_build_info", "gauge"),
    ];
    let ours = [
        ("tephra_append_latency_seconds", "histogram"),
        ("tephra_fsync_seconds", "histogram"),
        ("tephra_batch_events", "histogram"),
        ("tephra_conflicts_total", "counter"),
        ("tephra_read_disk_fetches_total", "counter"),
    ];
    for (name, kind) in reference.iter().chain(ours.iter()) {
        assert!(body.contains(&format!("# HELP {name} ")), "no HELP for {name}:\n{body}");
        assert!(body.contains(&format!("# TYPE {name} {kind}\n")), "no TYPE {kind} for {name}:\n{body}");
    }
    // Every sample belongs to a family with a TYPE line.
    for l in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = l.split(['{', ' ']).next().unwrap();
        let family = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
        assert!(body.contains(&format!("# TYPE {family} ")) || body.contains(&format!("# TYPE {name} ")), "untyped sample {l}");
    }
    assert_eq!(sample(body, "tephra_events_total"), "3");
    assert_eq!(sample(body, "tephra_segments"), "1");
    assert_eq!(sample(body, "tephra_active_connections"), "1");
    assert_eq!(sample(body, "tephra_max_connections"), "+Inf");
    assert_eq!(sample(body, "tephra_conflicts_total"), "1");
    assert!(sample(body, "tephra_disk_bytes").parse::<u64>().unwrap() >= 16 * 1024 * 1024);
    assert!(body.contains(&format!("tephra_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"))), "{body}");
    // Histograms: cumulative buckets ending in +Inf = _count; three acknowledged appends timed.
    for name in ["tephra_append_latency_seconds", "tephra_fsync_seconds", "tephra_batch_events"] {
        let buckets: Vec<u64> =
            body.lines().filter(|l| l.starts_with(&format!("{name}_bucket{{"))).map(|l| l.rsplit(' ').next().unwrap().parse().unwrap()).collect();
        assert!(buckets.len() >= 2, "{name}: {buckets:?}");
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{name} buckets not cumulative: {buckets:?}");
        let count: u64 = sample(body, &format!("{name}_count")).parse().unwrap();
        assert_eq!(*buckets.last().unwrap(), count, "{name}");
        assert!(body.contains(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n")), "{name}");
        assert!(sample(body, &format!("{name}_sum")).parse::<f64>().unwrap() >= 0.0);
    }
    assert_eq!(sample(body, "tephra_append_latency_seconds_count"), "2");
    let commits: u64 = sample(body, "tephra_fsync_seconds_count").parse().unwrap();
    assert!(commits >= 2, "{commits}");

    // Other targets are 404; the method is not checked.
    let nope = http(maddr, "GET /nope HTTP/1.1");
    assert!(nope.starts_with("HTTP/1.1 404"), "{nope}");
    assert!(nope.contains("\r\nContent-Type: text/plain; charset=utf-8\r\n"), "as the reference's: {nope}");
    assert!(http(maddr, "GET / HTTP/1.1").starts_with("HTTP/1.1 404"));
    assert!(http(maddr, "HEAD /metrics HTTP/1.1").starts_with("HTTP/1.1 200"));
    // A request line with no target is not HTTP: closed without an answer, as by the reference.
    for line in ["GARBAGE", ""] {
        let mut s = TcpStream::connect(maddr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "{line}\r\n").unwrap();
        let mut buf = [0u8; 64];
        // The close may come as a reset, since the head is left unread: no byte either way.
        match s.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0, "{line:?} got {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{line:?}: {e}"),
        }
    }
    // The metrics port does not speak the data protocol, and the data port is unaffected.
    assert!(Client::connect(maddr).is_err());
    assert_eq!(c.stats().unwrap().event_count, 3);
}

/// `tephra_writer_stopped` turns 1 once a failed fdatasync stopped the writer, 0 before; the
/// stats say why in our field 11, `tephra stats` shows it, and `--healthcheck` then fails
/// (review: it passed a server that refused every append).
#[test]
fn the_metrics_say_when_the_writer_has_stopped() {
    let Some(faulty) = support::crash_points_binary() else { return };
    let srv = Server::start(&faulty, &[("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("TEPHRA_CRASH_POINT", "commit_fsync:eio:3")]);
    let maddr = srv.metrics_addr();
    let mut c = Client::connect(srv.addr).unwrap();
    c.append([ev("A", &["t"], b"x")], None).unwrap();
    assert_eq!(sample(&http(maddr, "GET /metrics HTTP/1.1"), "tephra_writer_stopped"), "0");
    let mut refused = None;
    for _ in 0..10 {
        if let Err(e) = c.append([ev("A", &["t"], b"x")], None) {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = refused.expect("the injected fsync failure never came");
    assert!(refused.contains("until the server restarts"), "{refused}");
    let body = http(maddr, "GET /metrics HTTP/1.1");
    assert_eq!(sample(&body, "tephra_writer_stopped"), "1");
    assert_eq!(sample(&body, "tephra_follower_refresh_failures"), "0");
    let stats = c.stats().unwrap();
    assert!(stats.writer_stopped.contains("until the server restarts"), "{stats:?}");
    let out = healthcheck(&srv.addr.to_string(), None);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("healthcheck failed: the writer has stopped: "), "{}", out.stderr);
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_tephra")).args(["--addr", &srv.addr.to_string(), "stats"]).output().unwrap();
    assert!(String::from_utf8_lossy(&cli.stdout).contains("writer stopped"), "{cli:?}");
}

/// A follower whose refresh keeps failing (here a segment file whose header names another
/// base) counts the failures in `tephra_follower_refresh_failures`, and the count returns to
/// 0 once it follows again.
#[test]
fn the_metrics_count_a_followers_failed_refreshes() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = tmp.path().join("data");
    {
        let store = tephra::Store::open(&data, tephra::StoreConfig::new(tephra::SegmentConfig::new(65536))).unwrap();
        store.handle().append(vec![ev("A", &["t"], b"x")], None).unwrap();
        store.shutdown();
    }
    let follower = Server::start_args(
        &bin(),
        &data,
        &["--follow", "--follow-poll-ms", "10"],
        &[("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("TEPHRA__SEGMENT__SIZE", "65536")],
    );
    let maddr = follower.metrics_addr();
    let failures = || sample(&http(maddr, "GET /metrics HTTP/1.1"), "tephra_follower_refresh_failures").parse::<u64>().unwrap();
    assert_eq!(failures(), 0);
    // The next segment's name, with a header that names base 99.
    let bogus = data.join(tephra::log::segment::segment_name(2));
    let mut header = tephra::log::header::SegmentHeader { created_at_nanos: 1, base_position: 99 }.encode().to_vec();
    header.resize(65536, 0);
    std::fs::write(&bogus, header).unwrap();
    let t = Instant::now();
    while failures() < 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "the failing refreshes were not counted");
        thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&bogus).unwrap();
    let t = Instant::now();
    while failures() != 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "the count did not return to 0");
        thread::sleep(Duration::from_millis(20));
    }
}
