//! The `cli` cases run against OUR `tephra-server` binary (the same cases pass against the
//! reference in `cli_reference.rs`).

use tephra_test_support as support;

fn server_binary() -> Option<std::path::PathBuf> {
    Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server")))
}

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

include!("cli/cases.rs");

/// Runs `tephra args` against `addr`, killing it (and failing) after `limit`; returns its
/// output and how long it ran.
fn run_bounded(addr: std::net::SocketAddr, args: &[&str], limit: Duration) -> (Output, Duration) {
    let mut cmd = cli(addr);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("tephra {args:?} still waiting after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    (child.wait_with_output().unwrap(), took)
}

/// `--timeout` bounds the connect and the Hello too: a server that accepts but never answers
/// fails the command (exit 4) instead of hanging it.
#[test]
fn the_timeout_covers_a_server_that_never_answers_the_hello() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for args in [&["--timeout", "1", "stats"][..], &["--timeout", "1", "subscribe"]] {
        let (o, _) = run_bounded(silent.local_addr().unwrap(), args, Duration::from_secs(20));
        assert_code(&o, 4);
        assert!(stderr(&o).contains("cannot connect to") && stderr(&o).contains("no answer within 1s (--timeout)"), "{}", stderr(&o));
    }
    drop(silent);
}

/// `--timeout` takes any number of seconds over 0: one past what a `Duration` holds (`1e30`,
/// `1e309`, which parses as infinity, `inf`) means no practical limit (review: `1e30` was
/// refused with "expected a positive number of seconds"); NaN, 0, a negative number and text
/// that is not a number are refused as bad usage (exit 2), each with a message that says why.
#[test]
fn a_timeout_past_any_practical_limit_is_taken_and_bad_ones_are_named() {
    let Some(srv) = start(&[]) else { return };
    for secs in ["1e30", "1e309", "inf", "2.5"] {
        let o = tephra(srv.addr, &["--timeout", secs, "append", "--type", "E"]);
        assert_code(&o, 0);
        let o = tephra(srv.addr, &["--json", "--timeout", secs, "read"]);
        assert_code(&o, 0);
    }
    assert_eq!(event_count(srv.addr), 4);
    for (secs, why) in [
        ("nan", "expected a number of seconds, not NaN"),
        ("NaN", "expected a number of seconds, not NaN"),
        ("0", "the timeout must be more than 0 seconds"),
        ("-0.0", "the timeout must be more than 0 seconds"),
        ("-1", "the timeout must be more than 0 seconds"),
        ("-inf", "the timeout must be more than 0 seconds"),
        ("soon", "expected a number of seconds, such as 10 or 0.5"),
        ("", "expected a number of seconds, such as 10 or 0.5"),
    ] {
        let o = tephra(srv.addr, &["--timeout", secs, "stats"]);
        assert_code(&o, 2);
        assert!(stderr(&o).contains(&format!("invalid value '{secs}' for '--timeout <SECS>': {why}")), "{secs}: {}", stderr(&o));
        assert!(!stderr(&o).contains("positive"), "{}", stderr(&o));
    }
}

/// Without `--timeout` the connect and the Hello still give up, after 10 s: a server that
/// never answers (not a Tephra server) must not hang a command forever.
#[test]
fn without_a_timeout_a_server_that_never_answers_the_hello_is_given_up_on() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (o, took) = run_bounded(silent.local_addr().unwrap(), &["stats"], Duration::from_secs(30));
    assert_code(&o, 4);
    assert!(stderr(&o).contains("no answer to the Hello within 10s (is a Tephra server listening there?"), "{}", stderr(&o));
    assert!(took >= Duration::from_secs(9), "gave up after {took:?}");
    drop(silent);
}

/// A plaintext client at a TLS server is told so, not given a frame-length error.
#[test]
fn plaintext_at_a_tls_server_says_to_use_tls() {
    let Some((srv, _cert, _certs)) = tls_server() else { return };
    let o = tephra(srv.addr, &["stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains("the server answered with TLS"), "{}", stderr(&o));
}

/// Imports `n` events tagged `n:0`, `n:1`, ... with `payload_len`-byte payloads into `srv` and
/// checks every one arrived once, in order.
fn import_in_order(srv: &Server, n: usize, payload_len: usize) {
    let file = srv.dir.path().join("import.jsonl");
    let payload = "x".repeat(payload_len);
    let lines: String = (0..n).map(|i| format!("{{\"type\":\"E\",\"tags\":[\"n:{i}\"],\"payload\":{payload:?}}}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let o = tephra(srv.addr, &["import", file.to_str().unwrap()]);
    assert_code(&o, 0);
    assert!(stdout(&o).starts_with(&format!("imported {n} events in ")), "{}", stdout(&o));
    let got = read_everything(srv.addr);
    assert_eq!(got.len(), n);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.event.tags().collect::<Vec<_>>(), [format!("n:{i}")]);
    }
}

/// Import into a server whose segments are smaller than an import batch: the refused batch is
/// sent again in halves.
#[test]
fn import_halves_batches_the_server_finds_too_large() {
    let Some(srv) = start(&[("TEPHRA__SEGMENT__SIZE", "1048576")]) else { return };
    import_in_order(&srv, 1000, 2000);
}

/// Import into a server whose frame cap is smaller than an import batch: the server refuses the
/// frame and closes; the import reconnects once, learns the cap from the error and sends
/// every batch in halves under it.
#[test]
fn import_splits_batches_over_the_servers_frame_cap() {
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "65536")]) else { return };
    import_in_order(&srv, 3000, 200);
}

/// An import that fails at the server (an event too large for its 1 MiB segments) says how far
/// it got and which input lines the failed batch holds, counting the blank lines it skipped.
#[test]
fn a_failed_import_names_the_input_lines_of_the_failed_batch() {
    let Some(srv) = start(&[("TEPHRA__SEGMENT__SIZE", "1048576")]) else { return };
    let file = srv.dir.path().join("import.jsonl");
    let small = |i: usize| format!("{{\"type\":\"E\",\"tags\":[\"n:{i}\"],\"payload\":\"x\"}}\n");
    let mut text = String::from("\n");
    text.extend((0..10).map(small));
    text.push('\n');
    text.push_str(&format!("{{\"type\":\"Big\",\"payload\":{:?}}}\n", "y".repeat(300_000)));
    text.extend((10..13).map(small));
    std::fs::write(&file, text).unwrap();
    let o = tephra(srv.addr, &["import", file.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("10 of 14 events were appended (positions 1..=10)"), "{err}");
    // The big event sits on line 13: line 1 and line 12 are blank.
    assert!(err.contains(&format!("the failed batch is {} line 13", file.display())), "{err}");
    assert!(err.contains("(an event may take at most a quarter of the server's segment.size)"), "{err}");
    assert_eq!(read_everything(srv.addr).len(), 10);
}

/// An atomic `append --stdin` batch over the server's frame cap fails whole, and the error
/// names the setting (the server's text, pinned by the reference, does not) and points at
/// `tephra import`; a single event over the cap gets no such hint.
#[test]
fn an_atomic_batch_over_the_frame_cap_points_at_import() {
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "65536")]) else { return };
    let line = format!("{{\"type\":\"E\",\"payload\":{:?}}}\n", "x".repeat(300));
    let o = tephra_fed(srv.addr, &["append", "--stdin"], line.repeat(400).as_bytes());
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stderr(&o).contains("exceeds the maximum of 65536 (the server's frame cap, server.max_frame_len) (the 400 events are one atomic append and must fit one frame; `tephra import`"), "{}", stderr(&o));
    let o = tephra(srv.addr, &["append", "--type", "E", "--payload", &"y".repeat(70_000)]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("exceeds the maximum of 65536 (the server's frame cap, server.max_frame_len)") && !stderr(&o).contains("tephra import"),
        "{}",
        stderr(&o)
    );
    // Nor when one event of the batch is over the cap alone: import could not send it either.
    let o = tephra_fed(srv.addr, &["append", "--stdin"], format!("{line}{{\"type\":\"E\",\"payload\":{:?}}}\n", "z".repeat(70_000)).as_bytes());
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stderr(&o).contains("exceeds the maximum of 65536") && !stderr(&o).contains("tephra import"), "{}", stderr(&o));
    assert!(read_everything(srv.addr).is_empty());
}

/// With `held` connected to a server capped at one (its Hello answered, so the server has
/// accepted and counted it), runs `tephra args`: exit 4 with the connection-limit hint, the
/// cut step named as `when` ("before answering the Hello", "during the TLS handshake").
fn expect_refused_at_the_cap(srv: &Server, held: tephra::client::Client, args: &[&str], when: &str) {
    let o = tephra(srv.addr, args);
    assert_code(&o, 4);
    assert!(stderr(&o).contains(&format!("closed the connection {when} (a server at its connection limit, server.limits.max_connections")), "{}", stderr(&o));
    drop(held);
}

/// A server at its connection cap closes new connections without a word (docs/protocol.md §11);
/// the CLI says what that usually means.
#[test]
fn a_server_at_its_connection_cap_is_named_as_a_likely_cause() {
    let Some(srv) = start(&[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")]) else { return };
    let held = tephra::client::Client::connect(srv.addr).unwrap();
    expect_refused_at_the_cap(&srv, held, &["stats"], "before answering the Hello");
}

/// The same over TLS: the server closes during the TLS handshake, and the hint says so.
#[test]
fn a_tls_server_at_its_connection_cap_is_named_as_a_likely_cause() {
    let Some(bin) = server_binary() else { return };
    let (srv, cert, _certs, held) = support::tls_server_at_its_connection_cap(&bin);
    expect_refused_at_the_cap(&srv, held, &["--tls-ca", cert.to_str().unwrap(), "--tls-server-name", "localhost", "stats"], "during the TLS handshake");
}

/// An event over the CLI's own 16 MiB frame cap: the error names `--max-frame-len`, and with
/// it raised (the server's cap raised too) the event goes in and reads back.
#[test]
fn events_over_16_mib_need_the_clients_frame_cap_raised_too() {
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "33554432"), ("TEPHRA__SEGMENT__SIZE", "134217728")]) else { return };
    let file = srv.dir.path().join("big.bin");
    std::fs::write(&file, vec![7u8; 17 << 20]).unwrap();
    let o = tephra(srv.addr, &["append", "--type", "Big", "--payload-file", file.to_str().unwrap()]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("(this client's frame cap: --max-frame-len; the server's is server.max_frame_len)"), "{}", stderr(&o));
    let o = tephra(srv.addr, &["--max-frame-len", "33554432", "append", "--type", "Big", "--payload-file", file.to_str().unwrap()]);
    assert_code(&o, 0);
    let o = tephra(srv.addr, &["read", "--json"]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("--max-frame-len"), "{}", stderr(&o));
    let o = tephra(srv.addr, &["--max-frame-len", "33554432", "read", "--json"]);
    assert_code(&o, 0);
    let lines = json_lines(&o);
    assert_eq!(lines[0]["type"], "Big");
    assert_eq!(lines[0]["payload"].as_str().map(str::len), Some(17 << 20));
}

/// An event or a batch too large for the server's segments: the error says what the limit is.
#[test]
fn appends_too_large_for_the_segments_name_the_limit() {
    let Some(srv) = start(&[("TEPHRA__SEGMENT__SIZE", "1048576")]) else { return };
    let file = srv.dir.path().join("big.bin");
    std::fs::write(&file, vec![b'x'; 300_000]).unwrap();
    let o = tephra(srv.addr, &["append", "--type", "E", "--payload-file", file.to_str().unwrap()]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("exceeds the segment capacity (an event may take at most a quarter of the server's segment.size)"), "{}", stderr(&o));
    let line = format!("{{\"type\":\"E\",\"payload\":{:?}}}\n", "y".repeat(50_000));
    let o = tephra_fed(srv.addr, &["append", "--stdin"], line.repeat(30).as_bytes());
    assert_code(&o, 2);
    assert!(stderr(&o).contains("(one append must fit one segment, and each event a quarter of one: segment.size; `tephra import`"), "{}", stderr(&o));
    assert!(read_everything(srv.addr).is_empty());
}

/// A server whose own certificate is a CA certificate: the client names the mistake.
#[test]
fn a_ca_certificate_used_as_the_servers_is_named() {
    let Some(bin) = server_binary() else { return };
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert_path, key_path) = support::ca_self_signed(certs.path());
    let srv = Server::start_with(&bin, &[], Some(&support::tls_toml(&cert_path, &key_path)));
    let o = tephra(srv.addr, &["--tls-ca", cert_path.to_str().unwrap(), "--tls-server-name", "localhost", "stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains("it is a CA certificate presented as the server's own") && !stderr(&o).contains("OtherError"), "{}", stderr(&o));
}

/// A certificate the client does not trust: with the system's roots the CLI points at
/// `--tls-ca` (rustls alone reported an unsupported signature algorithm for a self-signed EC
/// certificate), with `--tls-ca` it names the file.
#[test]
fn an_untrusted_server_certificate_gets_a_hint_at_the_fix() {
    let Some(bin) = server_binary() else { return };
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ours = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_path, key_path, other_path) = (certs.path().join("cert.pem"), certs.path().join("key.pem"), certs.path().join("other.pem"));
    std::fs::write(&cert_path, ours.cert.pem()).unwrap();
    std::fs::write(&key_path, ours.key_pair.serialize_pem()).unwrap();
    std::fs::write(&other_path, other.cert.pem()).unwrap();
    let srv = Server::start_with(&bin, &[], Some(&support::tls_toml(&cert_path, &key_path)));
    let o = tephra(srv.addr, &["--tls", "--tls-server-name", "localhost", "stats"]);
    assert_code(&o, 4);
    assert!(
        stderr(&o).contains("the server's certificate was refused: ")
            && stderr(&o).contains("not signed by a root this system trusts; for a self-signed or private-CA certificate pass --tls-ca FILE"),
        "{}",
        stderr(&o)
    );
    // In words, not rustls's Debug text with its OIDs as byte lists (review).
    assert!(!stderr(&o).contains('{') && !stderr(&o).contains("_id:"), "{}", stderr(&o));
    let o = tephra(srv.addr, &["--tls-ca", other_path.to_str().unwrap(), "--tls-server-name", "localhost", "stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains(&format!("does not check out against {}", other_path.display())), "{}", stderr(&o));
    // The right file works.
    let o = tephra(srv.addr, &["--tls-ca", cert_path.to_str().unwrap(), "--tls-server-name", "localhost", "stats"]);
    assert_code(&o, 0);
}

/// And a TLS client at a plaintext server is told the server does not speak TLS.
#[test]
fn tls_at_a_plaintext_server_says_so() {
    let Some(srv) = start(&[]) else { return };
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let ca = certs.path().join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let o = tephra(srv.addr, &["--tls-ca", ca.to_str().unwrap(), "--tls-server-name", "localhost", "stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains("the server answered in plaintext, not TLS"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("InvalidContentType"), "no rustls Debug text: {}", stderr(&o));
}

/// `--max-frame-len` below 1 MiB is refused up front, saying why: the server packs read
/// batches up to `server.reads.batch_bytes` (512 KiB by default) and never learns this cap.
#[test]
fn a_frame_cap_below_one_mib_is_refused_with_the_reason() {
    let Some(srv) = start(&[]) else { return };
    let o = tephra(srv.addr, &["--max-frame-len", "1048575", "stats"]);
    assert_code(&o, 2);
    let err = stderr(&o);
    assert!(err.contains("--max-frame-len") && err.contains("at least 1048576"), "{err}");
    assert!(err.contains("server.reads.batch_bytes") && err.contains("512 KiB by default"), "{err}");
    assert_code(&tephra(srv.addr, &["--max-frame-len", "1048576", "stats"]), 0);
}

/// A frame from the server over this client's cap: the error says it came from the server,
/// gives both sizes and names `--max-frame-len`.
#[test]
fn a_frame_from_the_server_over_the_cap_names_both_sizes_and_the_flag() {
    let Some(srv) = start(&[]) else { return };
    let file = srv.dir.path().join("big.bin");
    std::fs::write(&file, vec![7u8; 1_500_000]).unwrap();
    assert_code(&tephra(srv.addr, &["append", "--type", "Big", "--payload-file", file.to_str().unwrap()]), 0);
    let o = tephra(srv.addr, &["--max-frame-len", "1048576", "read"]);
    assert_code(&o, 2);
    let err = stderr(&o);
    assert!(err.contains("read failed: the server sent a frame of 15000"), "{err}");
    assert!(err.contains(" bytes, over this client's frame cap of 1048576 bytes (raise --max-frame-len to receive it)"), "{err}");
}

/// A frame over this client's cap, either way, is reported as the server reports a frame
/// over its own: `"code":"TOO_LARGE"` in `--json` output, and exit 2 (as for the server's
/// TOO_LARGE).
#[test]
fn frames_over_the_clients_cap_are_too_large_in_json_and_exit_2() {
    let Some(srv) = start(&[]) else { return };
    let file = srv.dir.path().join("big.bin");
    std::fs::write(&file, vec![7u8; 1_500_000]).unwrap();
    let append = ["append", "--type", "Big", "--payload-file", file.to_str().unwrap()];
    let capped = |args: &[&str]| {
        let o = tephra(srv.addr, &[&["--json", "--max-frame-len", "1048576"], args].concat());
        assert_code(&o, 2);
        let err: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
        assert_eq!((err["code"].as_str(), err["exit_code"].as_u64()), (Some("TOO_LARGE"), Some(2)), "{err}");
        assert!(err["error"].as_str().unwrap().contains("--max-frame-len"), "{err}");
    };
    // Sending: the append request is over the cap.
    capped(&append);
    // Receiving: the read frame holding the event is over the cap.
    assert_code(&tephra(srv.addr, &append), 0);
    capped(&["read"]);
}

/// `append --stdin` over the client's own 16 MiB frame cap (the default, which trips before
/// the server's) points at `tephra import`, as the server's frame cap does; not when one
/// event alone is over the cap.
#[test]
fn an_atomic_batch_over_the_clients_frame_cap_points_at_import() {
    let Some(srv) = start(&[]) else { return };
    let line = format!("{{\"type\":\"E\",\"payload\":{:?}}}\n", "x".repeat(1_000_000));
    let o = tephra_fed(srv.addr, &["append", "--stdin"], line.repeat(20).as_bytes());
    assert_code(&o, 2);
    assert!(stderr(&o).contains("(the 20 events are one atomic append and must fit one frame; `tephra import`"), "{}", stderr(&o));
    let o = tephra_fed(
        srv.addr,
        &["--max-frame-len", "1048576", "append", "--stdin"],
        format!("{line}{{\"type\":\"E\",\"payload\":{:?}}}\n", "z".repeat(1_100_000)).as_bytes(),
    );
    assert_code(&o, 2);
    assert!(stderr(&o).contains("--max-frame-len") && !stderr(&o).contains("tephra import"), "{}", stderr(&o));
    assert!(read_everything(srv.addr).is_empty());
}

/// A batch refused because one of its events alone is over a quarter segment: importing
/// cannot help, so the hint says the event itself is too large instead of pointing at
/// `tephra import`.
#[test]
fn a_batch_holding_an_event_over_a_quarter_segment_does_not_point_at_import() {
    let Some(srv) = start(&[("TEPHRA__SEGMENT__SIZE", "1048576")]) else { return };
    let small = "{\"type\":\"E\",\"payload\":\"x\"}\n";
    let o = tephra_fed(srv.addr, &["append", "--stdin"], format!("{small}{{\"type\":\"Big\",\"payload\":{:?}}}\n{small}", "y".repeat(300_000)).as_bytes());
    assert_code(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("(one of the 3 events is by itself too large for the server's segment.size: an event may take at most a quarter of a segment)"),
        "{err}"
    );
    assert!(!err.contains("tephra import"), "{err}");
    assert!(read_everything(srv.addr).is_empty());
}

/// A request far over the server's frame cap (more than the server drains before closing)
/// makes the server answer TOO_LARGE and close while the CLI is still writing: the write fails
/// with a broken pipe or a reset, and the CLI reports the server's answer (exit 2), not a
/// connection failure (exit 4).
#[test]
fn an_append_refused_while_still_being_written_reports_the_servers_answer() {
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "1048576")]) else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let payload = dir.path().join("payload");
    std::fs::write(&payload, vec![0u8; 100 << 20]).unwrap();
    for _ in 0..3 {
        let o = tephra(srv.addr, &["--max-frame-len", "268435456", "append", "--type", "E", "--payload-file", payload.to_str().unwrap()]);
        assert_code(&o, 2);
        assert!(stderr(&o).contains("TOO_LARGE: frame length 104857620 exceeds the maximum of 1048576"), "{}", stderr(&o));
    }
    assert!(read_everything(srv.addr).is_empty());
}

/// A port where an HTTP server answers: the CLI and the healthcheck say so instead of reading
/// "HTTP" as a frame length of 1213486160 bytes.
#[test]
fn an_http_server_is_named_as_not_a_tephra_server() {
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = http.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in http.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 64];
            let _ = std::io::Read::read(&mut c, &mut buf);
            let _ = std::io::Write::write_all(&mut c, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let o = tephra(addr, &["stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains("the server answered with HTTP: not a Tephra server"), "{}", stderr(&o));
    let hc = std::process::Command::new(server_binary().unwrap()).args(["--healthcheck", "--bind", &addr.to_string()]).output().unwrap();
    assert_eq!(hc.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&hc.stderr).contains("answered with HTTP: not a Tephra server"), "{}", String::from_utf8_lossy(&hc.stderr));
}

/// A local file that cannot be read is exit 1 (a local file error, as `--help` says), not 2:
/// `import` of a missing file and `append --payload-file` of one exited 2 (review).
#[test]
fn an_unreadable_input_file_is_a_local_file_error() {
    let Some(srv) = start(&[]) else { return };
    let missing = srv.dir.path().join("missing.jsonl");
    let m = missing.to_str().unwrap();
    for args in [vec!["import", m], vec!["append", "--type", "E", "--payload-file", m]] {
        let o = tephra(srv.addr, &args);
        assert_code(&o, 1);
        assert!(stderr(&o).contains("missing.jsonl") && stderr(&o).contains("No such file"), "{args:?}: {}", stderr(&o));
    }
    assert!(read_everything(srv.addr).is_empty());
}

/// Control characters in a type or tag are escaped in `read`'s lines, as in payloads: a tag
/// holding a newline broke the event over two lines (review). Such a tag is quoted as a JSON
/// string.
#[test]
fn control_characters_in_tags_are_escaped_in_read_lines() {
    let Some(srv) = start(&[]) else { return };
    assert_code(&tephra(srv.addr, &["append", "--type", "A", "--tag", "a\nb", "--tag", "c\td", "--payload", "x\ny"]), 0);
    let o = tephra(srv.addr, &["read"]);
    assert_code(&o, 0);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("[\"a\\nb\",\"c\\td\"]  x\\ny"), "{out}");
}

/// The number after `flag ` in `text` (`--skip-lines 1234` gives 1234).
fn number_after(text: &str, flag: &str) -> u64 {
    let rest = text.split(&format!("{flag} ")).nth(1).unwrap_or_else(|| panic!("no {flag} in: {text}"));
    rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or_else(|e| panic!("{flag}: {e}: {text}"))
}

/// Starts `tephra import FILE --batch 1` and stops it with `sig` once some events are in the
/// store; returns its output.
fn interrupted_import(srv: &Server, file: &std::path::Path, skip: u64, sig: nix::sys::signal::Signal) -> Output {
    let before = event_count(srv.addr);
    let mut cmd = cli(srv.addr);
    cmd.args(["import", file.to_str().unwrap(), "--batch", "1", "--skip-lines", &skip.to_string()]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while event_count(srv.addr) < before + 50 {
        assert!(Instant::now() < deadline, "the import appended nothing in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&child, sig);
    child.wait_with_output().unwrap()
}

/// An import stopped by SIGTERM or SIGINT stops after the batch in flight is answered, says on
/// stderr what it read and appended, the last position written and the `--skip-lines N` that
/// resumes it, and exits 143 or 130 (it died of the signal, saying nothing: running it again
/// appended everything again). Resuming with that N gives every event exactly once, in order,
/// blank lines and all.
#[test]
fn an_interrupted_import_says_how_far_it_got_and_resumes_with_skip_lines() {
    let Some(srv) = start(&[]) else { return };
    let file = srv.dir.path().join("import.jsonl");
    let n = 30_000;
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("{{\"type\":\"E\",\"tags\":[\"n:{i}\"]}}\n"));
        if i % 7 == 0 {
            text.push('\n');
        }
    }
    let line_count = text.lines().count() as u64;
    std::fs::write(&file, &text).unwrap();
    let mut skip = 0;
    for (sig, code, name) in [(nix::sys::signal::Signal::SIGTERM, 143, "SIGTERM"), (nix::sys::signal::Signal::SIGINT, 130, "SIGINT")] {
        let before = event_count(srv.addr);
        let o = interrupted_import(&srv, &file, skip, sig);
        assert_code(&o, code);
        let err = stderr(&o);
        let stored = event_count(srv.addr);
        assert!(stored < n, "the import finished before the signal: {err}");
        assert!(err.contains(&format!("import interrupted by {name}: read {line_count} lines of ")), "{err}");
        assert!(err.contains("Running the import again appends everything again (nothing is deduplicated)"), "{err}");
        assert!(err.contains(&format!("the last position written is {stored})")), "{err}");
        let appended = number_after(&err, "appended");
        let resume = number_after(&err, "--skip-lines");
        assert!(resume > skip, "{err}");
        assert_eq!(appended, stored - before, "{err}");
        // The lines up to N hold exactly the events in the store.
        let in_lines = text.lines().take(resume as usize).filter(|l| !l.is_empty()).count() as u64;
        assert_eq!(in_lines, stored, "{err}");
        skip = resume;
    }
    let o = tephra(srv.addr, &["--json", "import", file.to_str().unwrap(), "--skip-lines", &skip.to_string()]);
    assert_code(&o, 0);
    let got = read_everything(srv.addr);
    assert_eq!(got.len() as u64, n);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.event.tags().collect::<Vec<_>>(), [format!("n:{i}")]);
    }
}

/// `--skip-lines` skips lines unread (a bad line among them does not stop the import); more
/// lines than the input has is bad usage, naming both numbers. `--help` says that running an
/// import again appends again and how to resume.
#[test]
fn skip_lines_skips_unread_lines_and_help_says_how_to_resume() {
    let Some(srv) = start(&[]) else { return };
    let file = srv.dir.path().join("import.jsonl");
    std::fs::write(&file, "not json\n\n{\"type\":\"A\"}\n{\"type\":\"B\"}\n").unwrap();
    let o = tephra(srv.addr, &["import", file.to_str().unwrap(), "--skip-lines", "3"]);
    assert_code(&o, 0);
    assert_eq!(read_everything(srv.addr).iter().map(|e| e.event.event_type().to_owned()).collect::<Vec<_>>(), ["B"]);
    let o = tephra(srv.addr, &["import", file.to_str().unwrap(), "--skip-lines", "5"]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("--skip-lines 5 is more than the 4 lines of "), "{}", stderr(&o));
    let o = tephra(srv.addr, &["import", "--help"]);
    assert_code(&o, 0);
    let help = stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("Running an import again appends every event again: nothing is deduplicated"), "{help}");
    assert!(help.contains("--skip-lines <N>"), "{help}");
}

/// A failed batch also says which `--skip-lines` resumes from it.
#[test]
fn a_failed_import_says_how_to_resume() {
    let Some(srv) = start(&[("TEPHRA__SEGMENT__SIZE", "1048576")]) else { return };
    let file = srv.dir.path().join("import.jsonl");
    let text = format!("{{\"type\":\"E\"}}\n\n{{\"type\":\"Big\",\"payload\":{:?}}}\n{{\"type\":\"E\"}}\n", "y".repeat(300_000));
    std::fs::write(&file, text).unwrap();
    let o = tephra(srv.addr, &["import", file.to_str().unwrap()]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("to resume from the failed batch, run the import again with --skip-lines 2"), "{}", stderr(&o));
}

/// Appends `n` × 1,000 events of 100-byte payloads (the store's export takes a while).
fn fill_thousands(addr: std::net::SocketAddr, n: usize) {
    let mut c = Client::connect(addr).unwrap();
    for _ in 0..n {
        c.append((0..1000).map(|i| ev("E", &[&format!("n:{i}")], &[b'x'; 100])), None).unwrap();
    }
}

/// `export -o FILE` writes FILE.partial and renames it to FILE only once complete: stopped by
/// SIGINT it leaves FILE.partial holding whole lines, as many as it says, up to the last
/// position it names, does not create FILE, says to move FILE.partial aside before exporting
/// the rest, and exits 130 (it died of the signal and left a cleanly cut FILE that looked
/// complete).
#[test]
fn an_interrupted_export_leaves_only_a_partial_file_and_says_what_it_holds() {
    let Some(srv) = start(&[]) else { return };
    fill_thousands(srv.addr, 200);
    let out = srv.dir.path().join("out.jsonl");
    let partial = srv.dir.path().join("out.jsonl.partial");
    let mut cmd = cli(srv.addr);
    cmd.args(["export", "-o", out.to_str().unwrap()]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 100_000 {
        assert!(Instant::now() < deadline, "the export wrote nothing in 30 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let o = child.wait_with_output().unwrap();
    assert_code(&o, 130);
    let err = stderr(&o);
    let text = std::fs::read_to_string(&partial).unwrap();
    assert!(text.ends_with('\n'), "FILE.partial ends inside a line");
    let written = text.lines().count() as u64;
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert!(written < 200_000, "the export finished before the signal: {err}");
    assert_eq!(last["position"], written);
    assert!(err.contains("export interrupted by SIGINT; the export is incomplete: "), "{err}");
    assert!(err.contains(&format!("out.jsonl.partial holds {written} events (positions 1..={written}; the last position written is {written}: move it aside, and --after {written} exports the rest)")), "{err}");
    assert!(err.contains("out.jsonl was not created"), "{err}");
    assert!(!out.exists());
}

/// A complete `export -o FILE` leaves FILE and no FILE.partial. A FILE.partial already there
/// is refused (exit 1) and left as it was, FILE not created: it may hold an interrupted
/// export's events, which exporting the rest to the same FILE, as the interrupted export's
/// message once advised, replaced (review). A FILE replaced keeps its permissions.
#[test]
fn an_export_refuses_a_partial_file_left_before_and_renames_its_own() {
    use std::os::unix::fs::PermissionsExt;
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.append(vec![ev("A", &[], b"1"), ev("B", &[], b"2")], None).unwrap();
    let out = srv.dir.path().join("out.jsonl");
    let partial = srv.dir.path().join("out.jsonl.partial");
    std::fs::write(&partial, "an earlier export's lines\n").unwrap();
    let o = tephra(srv.addr, &["export", "-o", out.to_str().unwrap()]);
    assert_code(&o, 1);
    assert!(
        stderr(&o).contains("out.jsonl.partial already exists: an earlier export to ") && stderr(&o).contains("move it aside or remove it"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&partial).unwrap(), "an earlier export's lines\n");
    assert!(!out.exists());
    std::fs::remove_file(&partial).unwrap();
    std::fs::write(&out, "old\n").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = tephra(srv.addr, &["export", "-o", out.to_str().unwrap()]);
    assert_code(&o, 0);
    assert!(!partial.exists());
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 2);
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
}

/// `export -o` into what a rename cannot replace: a symbolic link keeps pointing at its
/// target, which gets the export (a link to nothing yet creates its target); a FIFO stays a
/// FIFO and its reader gets every line; a device stays a device (review: each became a
/// regular file, and `-o /dev/null` as root would replace the system's). A directory, or a
/// path ending in `/`, is refused (exit 1) and nothing is left in it.
#[test]
fn an_export_into_a_link_a_fifo_a_device_or_a_directory() {
    let Some(srv) = start(&[]) else { return };
    Client::connect(srv.addr).unwrap().append(vec![ev("A", &[], b"1"), ev("B", &[], b"2"), ev("C", &[], b"3")], None).unwrap();
    let dir = srv.dir.path().join("exports");
    std::fs::create_dir_all(dir.join("real")).unwrap();
    let lines = |p: &std::path::Path| std::fs::read_to_string(p).unwrap().lines().count();
    // A link to a file, a dangling one (relative), and a chain of two to nothing yet.
    std::fs::write(dir.join("real/x.jsonl"), "old\n").unwrap();
    std::os::unix::fs::symlink("real/x.jsonl", dir.join("link")).unwrap();
    std::os::unix::fs::symlink("real/y.jsonl", dir.join("dangling")).unwrap();
    std::os::unix::fs::symlink("middle", dir.join("chain")).unwrap();
    std::os::unix::fs::symlink("real/z.jsonl", dir.join("middle")).unwrap();
    for (link, target) in [("link", "real/x.jsonl"), ("dangling", "real/y.jsonl"), ("chain", "real/z.jsonl")] {
        let o = tephra(srv.addr, &["export", "-o", dir.join(link).to_str().unwrap()]);
        assert_code(&o, 0);
        assert!(std::fs::symlink_metadata(dir.join(link)).unwrap().file_type().is_symlink(), "{link} is no longer a link");
        assert_eq!(lines(&dir.join(target)), 3, "{link}");
    }
    // A FIFO.
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let o = tephra(srv.addr, &["export", "-o", fifo.to_str().unwrap()]);
    assert_code(&o, 0);
    assert_eq!(reader.join().unwrap().lines().count(), 3);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::symlink_metadata(&fifo).unwrap().file_type()));
    // A device, where this test may make one (root): a null device of its own.
    let null = dir.join("null");
    if nix::sys::stat::mknod(&null, nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::from_bits_truncate(0o666), nix::sys::stat::makedev(1, 3)).is_ok() {
        let o = tephra(srv.addr, &["export", "-o", null.to_str().unwrap()]);
        assert_code(&o, 0);
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&std::fs::symlink_metadata(&null).unwrap().file_type()));
    }
    // A directory.
    let before: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    for arg in [dir.join("real").display().to_string(), format!("{}/", dir.join("real").display()), format!("{}/", dir.join("new").display())] {
        let o = tephra(srv.addr, &["export", "-o", &arg]);
        assert_code(&o, 1);
        assert!(stderr(&o).contains("is a directory; name a file"), "{arg}: {}", stderr(&o));
    }
    let after: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(before, after);
    assert_eq!(std::fs::read_dir(dir.join("real")).unwrap().count(), 3);
    assert!(std::fs::symlink_metadata(dir.join("middle")).unwrap().file_type().is_symlink());
    // `/dev/stdout` onto a file the shell opened to append to: the export goes after what the
    // file held (review: it was renamed over the file, its earlier lines gone).
    let log = dir.join("app.log");
    std::fs::write(&log, "an earlier line\n").unwrap();
    let appending = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let o = cli(srv.addr).args(["export", "-o", "/dev/stdout"]).stdin(Stdio::null()).stdout(appending).stderr(Stdio::piped()).output().unwrap();
    assert_code(&o, 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("an earlier line\n"), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("{\"position\":")).count(), 3, "{text}");
    assert!(std::fs::symlink_metadata("/dev/stdout").unwrap().file_type().is_symlink());
}

/// An export into a FIFO stopped by SIGINT says how many events the FIFO received and the
/// last position (there is no FILE.partial to speak of), and exits 130.
#[test]
fn an_interrupted_export_into_a_fifo_says_what_it_received() {
    let Some(srv) = start(&[]) else { return };
    fill_thousands(srv.addr, 20);
    let fifo = srv.dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut cmd = cli(srv.addr);
    cmd.args(["export", "-o", fifo.to_str().unwrap()]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let mut rd = BufReader::new(std::fs::File::open(&fifo).unwrap());
    let mut line = String::new();
    for _ in 0..100 {
        line.clear();
        rd.read_line(&mut line).unwrap();
    }
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut rd, &mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_code(&o, 130);
    let written = 100 + rest.lines().count() as u64;
    assert!(written < 20_000);
    let err = stderr(&o);
    assert!(err.contains(&format!("fifo was written {written} events (positions 1..={written}; the last position written is {written}, and --after {written} exports the rest if its reader took them all")), "{err}");
    assert!(!srv.dir.path().join("fifo.partial").exists());
}

/// A signal while `import` still reads its input ends it at once, with nothing appended
/// (review: the handlers let the read go on, so the first Ctrl-C waited for the end of a
/// pipe's input and the import then appended).
#[test]
fn an_import_signalled_while_reading_its_input_ends_at_once() {
    let Some(srv) = start(&[]) else { return };
    let mut cmd = cli(srv.addr);
    cmd.args(["import"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(b"{\"type\":\"A\"}\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SIGTERM: a test run started in the background of a shell inherits SIGINT ignored.
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut child, Duration::from_secs(10), "import still reading 10 s after SIGTERM");
    drop(input);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM), "{status:?}");
    assert_eq!(event_count(srv.addr), 0);
}

/// An inverted range (`--to` before `--after`) is bad usage naming both values; it exported
/// nothing and exited 0. `--to` equal to `--after` stays an empty range (an incremental export
/// with nothing new).
#[test]
fn an_inverted_export_range_is_bad_usage() {
    let Some(srv) = start(&[]) else { return };
    Client::connect(srv.addr).unwrap().append(vec![ev("A", &[], b"1"), ev("B", &[], b"2")], None).unwrap();
    let o = tephra(srv.addr, &["export", "--after", "10", "--to", "5"]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("--to 5 is before --after 10"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    let o = tephra(srv.addr, &["export", "--after", "1", "--to", "1"]);
    assert_code(&o, 0);
    assert!(stdout(&o).is_empty() && stderr(&o).contains("exported 0 events"), "{}", stderr(&o));
    let o = tephra(srv.addr, &["export", "--after", "0", "--to", "1"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o).lines().count(), 1);
}

/// Usage lines show `--addr` as optional: it has a default (127.0.0.1:9000 or TEPHRA_ADDR),
/// yet with TEPHRA_ADDR set (or `--addr` given) an error's usage read
/// `Usage: tephra append --addr <ADDR> --type <TYPE>`.
#[test]
fn usage_lines_do_not_show_addr_as_required() {
    let make = |env: bool, flag: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tephra"));
        cmd.env_remove("TEPHRA_ADDR").env_remove("TEPHRA_TOKEN");
        if env {
            cmd.env("TEPHRA_ADDR", "127.0.0.1:1");
        }
        if flag {
            cmd.args(["--addr", "127.0.0.1:1"]);
        }
        cmd
    };
    for (env, flag) in [(false, false), (true, false), (false, true)] {
        let o = make(env, flag).arg("append").output().unwrap();
        assert_code(&o, 2);
        let err = stderr(&o);
        assert!(err.contains("Usage: tephra append [OPTIONS] --type <TYPE>"), "{err}");
        assert!(!err.contains("--addr <ADDR>"), "{err}");
        for args in [&["append", "--help"][..], &["read", "--help"], &["import", "--help"], &["stats", "--help"], &["--help"]] {
            let o = make(env, flag).args(args).output().unwrap();
            assert_code(&o, 0);
            let usage = stdout(&o).lines().find(|l| l.starts_with("Usage:")).unwrap().to_owned();
            assert!(!usage.contains("--addr"), "{args:?}: {usage}");
        }
    }
    let o = make(true, false).args(["export", "--bogus"]).output().unwrap();
    assert_code(&o, 2);
    assert!(stderr(&o).contains("Usage: tephra export [OPTIONS]") && !stderr(&o).contains("--addr <ADDR>"), "{}", stderr(&o));
}

/// A type or tag holding a space, a bracket, a comma, a quote or a backslash is quoted (as a
/// JSON string) in `read`'s and `subscribe`'s lines: type `T x` with tag `a] [b` printed as
/// `T x  [a] [b]`. Ordinary names print as before, and `--json` is unchanged.
#[test]
fn names_that_could_be_misread_are_quoted_in_human_output() {
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.append(vec![ev("T x", &["a] [b", "plain:1", "c,d", "q\"\\"], b"pay load")], None).unwrap();
    c.append(vec![ev("Plain", &["k:v"], b"x")], None).unwrap();
    let o = tephra(srv.addr, &["read"]);
    assert_code(&o, 0);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], r#"       1  "T x"  ["a] [b","c,d",plain:1,"q\"\\"]  pay load"#, "{out}");
    assert_eq!(lines[1], "       2  Plain  [k:v]  x", "{out}");
    let o = tephra(srv.addr, &["--json", "read"]);
    assert_eq!(json_lines(&o)[0]["type"], "T x");
    assert_eq!(json_lines(&o)[0]["tags"], serde_json::json!(["a] [b", "c,d", "plain:1", "q\"\\"]));
    // subscribe prints the same lines.
    let mut cmd = cli(srv.addr);
    cmd.args(["subscribe"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut sub = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(sub.next().unwrap().unwrap(), lines[0]);
    signal(&child, nix::sys::signal::Signal::SIGINT);
    assert_code(&child.wait_with_output().unwrap(), 0);
}
