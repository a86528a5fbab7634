// The `tephra` CLI cases: the built binary against a server launched by `support`. Included
// by a wrapper that defines `server_binary()` (`None` skips) and `SERVER_VERSION`.
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Server;
use tephra::client::{Client, SequencedEvent};
use tephra::{Event, Position, Query};

fn start(env: &[(&str, &str)]) -> Option<Server> {
    let bin = server_binary()?;
    Some(Server::start(&bin, env))
}

/// A `tephra` command for `addr`, isolated from the caller's environment.
fn cli(addr: SocketAddr) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tephra"));
    cmd.env_remove("TEPHRA_ADDR").env_remove("TEPHRA_TOKEN").arg("--addr").arg(addr.to_string());
    cmd
}

/// Runs a command to completion, feeding `stdin`.
fn run(mut cmd: Command, stdin: &[u8]) -> Output {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn tephra");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn tephra(addr: SocketAddr, args: &[&str]) -> Output {
    tephra_fed(addr, args, b"")
}

/// Runs `tephra args` against `addr`, feeding `stdin`.
fn tephra_fed(addr: SocketAddr, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = cli(addr);
    cmd.args(args);
    run(cmd, stdin)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[track_caller]
fn assert_code(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o));
}

fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

use support::ev;

fn read_everything(addr: SocketAddr) -> Vec<SequencedEvent> {
    Client::connect(addr).unwrap().read_all(Query::all(), Position::ZERO).unwrap().0
}

/// `tephra subscribe --after N` against `a`, its output piped: the child and its stderr lines.
fn subscribe_after(a: SocketAddr, after: &str) -> (std::process::Child, std::io::Lines<BufReader<std::process::ChildStderr>>) {
    let mut cmd = cli(a);
    cmd.args(["subscribe", "--after", after]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, err_lines)
}

/// Sends `signal` to `child` (a `tephra` this test started).
fn signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

fn event_count(addr: SocketAddr) -> u64 {
    Client::connect(addr).unwrap().stats().unwrap().event_count
}

/// Waits for `child` to exit, failing with `what` after `limit`; returns its exit status.
fn wait_exit(child: &mut std::process::Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn append_then_read_in_both_formats() {
    let Some(srv) = start(&[]) else { return };
    let a = srv.addr;
    let o = tephra(a, &["append", "--type", "Registered", "--tag", "username:alice", "--payload", "{\"n\":1}"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "appended 1 event at position 1\n");
    let o = tephra(a, &["--json", "append", "--type", "Enrolled", "--tag", "student:s1", "--tag", "course:c1"]);
    assert_code(&o, 0);
    assert_eq!(json_lines(&o), [serde_json::json!({"first": 2, "last": 2, "count": 1})]);
    let payload_file = srv.dir.path().join("payload.bin");
    std::fs::write(&payload_file, [0xff, 0x00, 0x01]).unwrap();
    let o = tephra(a, &["append", "--type", "Blob", "--payload-file", payload_file.to_str().unwrap()]);
    assert_code(&o, 0);

    // Human output: position, type, tags, payload; a summary on stderr.
    let o = tephra(a, &["read"]);
    assert_code(&o, 0);
    let lines: Vec<String> = stdout(&o).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(
        lines,
        ["1 Registered [username:alice] {\"n\":1}", "2 Enrolled [course:c1,student:s1] ", "3 Blob [] base64:/wAB",]
            .map(|s| s.trim_end().to_owned())
    );
    assert!(stderr(&o).contains("3 events, watermark 3"), "{}", stderr(&o));

    // JSON lines: the events, then the watermark.
    let o = tephra(a, &["--json", "read"]);
    assert_code(&o, 0);
    let v = json_lines(&o);
    assert_eq!(v.len(), 4);
    assert_eq!(
        v[0],
        serde_json::json!({"position": 1, "type": "Registered", "tags": ["username:alice"], "payload": "{\"n\":1}"})
    );
    assert_eq!(v[1]["tags"], serde_json::json!(["course:c1", "student:s1"]));
    assert_eq!(v[1]["payload"], "");
    assert_eq!(v[2]["payload_base64"], "/wAB");
    assert_eq!(v[3], serde_json::json!({"watermark": 3}));

    // Filters, cursor, limit, backward.
    let o = tephra(a, &["--json", "read", "--tag", "student:s1"]);
    assert_eq!(json_lines(&o).iter().filter_map(|v| v["position"].as_u64()).collect::<Vec<_>>(), [2]);
    let o = tephra(a, &["--json", "read", "--type", "Blob", "--type", "Registered"]);
    assert_eq!(json_lines(&o).iter().filter_map(|v| v["position"].as_u64()).collect::<Vec<_>>(), [1, 3]);
    let o = tephra(a, &["--json", "read", "--after", "1", "--limit", "1"]);
    assert_eq!(json_lines(&o).iter().filter_map(|v| v["position"].as_u64()).collect::<Vec<_>>(), [2]);
    let o = tephra(a, &["--json", "read", "--backward", "--limit", "2"]);
    assert_eq!(json_lines(&o).iter().filter_map(|v| v["position"].as_u64()).collect::<Vec<_>>(), [3, 2]);
    let o = tephra(a, &["--json", "read", "--backward", "--after", "3"]);
    assert_eq!(json_lines(&o).iter().filter_map(|v| v["position"].as_u64()).collect::<Vec<_>>(), [2, 1]);

    // A batch from stdin, atomically.
    let mut cmd = cli(a);
    cmd.args(["append", "--stdin"]);
    let o = run(
        cmd,
        b"{\"type\":\"A\",\"tags\":[\"x\"],\"payload\":\"one\"}\n\n{\"type\":\"B\",\"payload_base64\":\"dHdv\"}\n",
    );
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "appended 2 events at positions 4..=5\n");
    let all = read_everything(a);
    assert_eq!(all[3].event, ev("A", &["x"], b"one"));
    assert_eq!(all[4].event, ev("B", &[], b"two"));

    // Stats in both formats.
    let o = tephra(a, &["stats"]);
    assert_code(&o, 0);
    assert!(stdout(&o).contains("events                5"), "{}", stdout(&o));
    assert!(stdout(&o).contains(SERVER_VERSION));
    let o = tephra(a, &["--json", "stats"]);
    let v = &json_lines(&o)[0];
    assert_eq!((v["event_count"].as_u64(), v["version"].as_str()), (Some(5), Some(SERVER_VERSION)));
}

#[test]
fn conflicts_exit_3_and_bad_requests_exit_2() {
    let Some(srv) = start(&[]) else { return };
    let a = srv.addr;
    let guarded = ["append", "--type", "Registered", "--tag", "username:bob", "--if-tag", "username:bob"];
    assert_code(&tephra(a, &guarded), 0);
    let o = tephra(a, &guarded);
    assert_code(&o, 3);
    assert!(
        stderr(&o).contains("CONFLICT: the event at position 1 matches the condition's query") && stderr(&o).contains("nothing was appended"),
        "the conflict in words, not the server's Debug-shaped text: {}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("Durable("), "{}", stderr(&o));
    let mut json = vec!["--json"];
    json.extend_from_slice(&guarded);
    let o = tephra(a, &json);
    assert_code(&o, 3);
    let err: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!((err["code"].as_str(), err["conflict_position"].as_u64()), (Some("CONFLICT"), Some(1)));
    assert_eq!(err["exit_code"], 3);

    // Optimistic concurrency on the whole log: "only if nothing after 1".
    assert_code(&tephra(a, &["append", "--type", "Next", "--after", "1"]), 0);
    assert_code(&tephra(a, &["append", "--type", "Next", "--after", "1"]), 3);
    // Existence check.
    let once = ["append", "--type", "Order", "--tag", "cmd:42", "--exists-tag", "cmd:42"];
    assert_code(&tephra(a, &once), 0);
    let o = tephra(a, &once);
    assert_code(&o, 3);
    assert!(stderr(&o).contains("ALREADY_EXISTS: the event at position 3 matches the existence query"), "{}", stderr(&o));

    // Bad requests: after beyond the tip, invalid names, bad usage.
    let o = tephra(a, &["append", "--type", "X", "--after", "1000"]);
    assert_code(&o, 2);
    assert!(stderr(&o).contains("beyond the durable tip"), "{}", stderr(&o));
    assert!(stderr(&o).contains("AFTER_BEYOND_TIP") && !stderr(&o).contains("ERROR_CODE_"), "the code by its short name: {}", stderr(&o));
    assert_code(&tephra(a, &["append", "--type", ""]), 2);
    assert_code(&tephra(a, &["append", "--type", "X", "--tag", "t", "--tag", "t"]), 2);
    assert_code(&tephra(a, &["append"]), 2);
    assert_code(&tephra(a, &["read", "--limit", "many"]), 2);
    assert_code(&tephra(a, &["import", "--batch", "0"]), 2);
    assert_eq!(event_count(a), 3, "nothing else was appended");
}

#[test]
fn export_then_import_into_a_fresh_server_gives_the_same_events() {
    let Some(src) = start(&[]) else { return };
    let mut c = Client::connect(src.addr).unwrap();
    for chunk in 0..5 {
        let batch: Vec<Event> = (0..500)
            .map(|i| {
                let n = chunk * 500 + i;
                match n % 4 {
                    0 => ev(
                        "Text",
                        &[&format!("n:{n}"), "kind:text"],
                        format!("{{\"n\":{n},\"s\":\"é\\n\"}}").as_bytes(),
                    ),
                    1 => ev("Binary", &[&format!("n:{n}")], &[0xff, (n % 256) as u8, 0]),
                    2 => ev("Empty", &[], b""),
                    _ => ev("Multi tag", &["z", "a", &format!("n:{n}")], "ünïcødé ✓".as_bytes()),
                }
            })
            .collect();
        c.append(batch, None).unwrap();
    }
    let original = read_everything(src.addr);
    assert_eq!(original.len(), 2500);

    let file = src.dir.path().join("export.jsonl");
    let o = tephra(src.addr, &["export", "--output", file.to_str().unwrap()]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "exported 2500 events (positions 1..=2500)\n");
    assert!(o.stderr.is_empty(), "no progress bar without a terminal: {}", stderr(&o));
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 2500);

    // A range to stdout.
    let o = tephra(src.addr, &["export", "--after", "10", "--to", "12"]);
    assert_code(&o, 0);
    assert_eq!(json_lines(&o).iter().map(|v| v["position"].as_u64().unwrap()).collect::<Vec<_>>(), [11, 12]);
    assert!(stderr(&o).contains("exported 2 events (positions 11..=12)"), "{}", stderr(&o));
    let o = tephra(src.addr, &["export", "--tag", "kind:text", "--to", "9"]);
    assert_eq!(json_lines(&o).iter().map(|v| v["position"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 5, 9]);

    // Import from the file into an empty server, in batches of 700.
    let Some(dst) = start(&[]) else { return };
    let o = tephra(dst.addr, &["import", "--batch", "700", file.to_str().unwrap()]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "imported 2500 events in 4 batches (positions 1..=2500)\n");
    assert_eq!(read_everything(dst.addr), original);

    // And from stdin, with --json, into another one.
    let Some(third) = start(&[]) else { return };
    let mut cmd = cli(third.addr);
    cmd.args(["--json", "import"]);
    let o = run(cmd, text.as_bytes());
    assert_code(&o, 0);
    assert_eq!(json_lines(&o), [serde_json::json!({"imported": 2500, "batches": 3, "first": 1, "last": 2500})]);
    assert_eq!(read_everything(third.addr), original);
}

#[test]
fn a_malformed_line_is_named_and_nothing_is_appended() {
    let Some(srv) = start(&[]) else { return };
    let a = srv.addr;
    let good = "{\"type\":\"A\",\"tags\":[\"x\"],\"payload\":\"1\"}\n";
    let cases = [
        (format!("{good}{good}{good}{{\"type\":\"A\",\"tags\":[\"x\"]\n{good}"), "line 4: invalid JSON"),
        (
            format!("{good}{good}{{\"type\":\"B\",\"tags\":[\"y\",\"y\"]}}\n"),
            "line 3: invalid event: duplicate tag 'y'",
        ),
        (format!("{good}{{\"type\":\"\"}}\n"), "line 2: invalid event: event type must not be empty"),
        (format!("{good}{{\"type\":\"A\",\"payload_base64\":\"***\"}}\n"), "line 2: \"payload_base64\" is not base64"),
        (format!("{good}\n{{\"type\":\"A\",\"colour\":\"red\"}}\n"), "line 3: invalid JSON"),
    ];
    for (input, expected) in &cases {
        let path = srv.dir.path().join("bad.jsonl");
        std::fs::write(&path, input).unwrap();
        let o = tephra(a, &["import", path.to_str().unwrap()]);
        assert_code(&o, 2);
        assert!(stderr(&o).contains(expected), "expected {expected:?} in {}", stderr(&o));
        assert!(stderr(&o).contains("bad.jsonl"), "the file is named: {}", stderr(&o));
        let mut cmd = cli(a);
        cmd.args(["append", "--stdin"]);
        let o = run(cmd, input.as_bytes());
        assert_code(&o, 2);
        assert!(stderr(&o).contains(expected), "expected {expected:?} in {}", stderr(&o));
    }
    assert_eq!(event_count(a), 0, "nothing was appended");
    let mut cmd = cli(a);
    cmd.args(["append", "--stdin"]);
    assert_code(&run(cmd, b"\n"), 2);
}

#[test]
fn connection_failures_exit_4() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let a: SocketAddr = ([127, 0, 0, 1], port).into();
    for args in [&["stats"][..], &["read"], &["append", "--type", "X"], &["subscribe"], &["export"]] {
        let o = tephra(a, args);
        assert_code(&o, 4);
        assert!(stderr(&o).contains("cannot connect to 127.0.0.1:"), "{}", stderr(&o));
    }
    // Input is validated before connecting: a bad line is still exit 2.
    let mut cmd = cli(a);
    cmd.args(["import"]);
    assert_code(&run(cmd, b"not json\n"), 2);
    let mut cmd = cli(a);
    cmd.args(["--json", "import"]);
    let o = run(cmd, b"{\"type\":\"A\"}\n");
    assert_code(&o, 4);
    let err: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(err["exit_code"], 4);
}

#[test]
fn subscribe_follows_until_ctrl_c_and_exits_0() {
    let Some(srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let a = srv.addr;
    let mut c = Client::connect(a).unwrap();
    c.append(vec![ev("A", &["k"], b"1"), ev("B", &[], b"2")], None).unwrap();

    let mut cmd = cli(a);
    cmd.args(["--json", "subscribe", "--tag", "k"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    assert_eq!(next()["position"], 1);
    assert_eq!(next(), serde_json::json!({"caught_up": 2}));
    c.append(vec![ev("C", &["k"], b"live")], None).unwrap();
    let live = next();
    assert_eq!((live["position"].as_u64(), live["payload"].as_str()), (Some(3), Some("live")));
    assert_eq!(next(), serde_json::json!({"caught_up": 3}));
    assert_eq!(c.stats().unwrap().active_subscriptions, 1);

    signal(&child, nix::sys::signal::Signal::SIGINT);
    let status = wait_exit(&mut child, Duration::from_secs(10), "subscribe did not stop on SIGINT");
    assert_eq!(status.code(), Some(0), "Ctrl-C ends cleanly");
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.stats().unwrap().active_subscriptions != 0 {
        assert!(Instant::now() < deadline, "the subscription is still active on the server");
        std::thread::sleep(Duration::from_millis(25));
    }

    // Human format: events on stdout, the live edge on stderr.
    let (child, mut err_lines) = subscribe_after(a, "2");
    assert_eq!(err_lines.next().unwrap().unwrap(), "caught up at 3");
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let o = child.wait_with_output().unwrap();
    assert_code(&o, 0);
    assert_eq!(stdout(&o).split_whitespace().collect::<Vec<_>>(), ["3", "C", "[k]", "live"]);
}

/// A start position past the store's tip is answered by the server as any other (a read ends at
/// once with the tip as its watermark, a subscription is caught up at its `after`:
/// docs/protocol.md §8, the same from both servers), so the command line says so in a note on stderr
/// instead of returning nothing, or "caught up at 999999999", without a word (review). A
/// position within the store, or a backward read from past the tip, gets no note.
#[test]
fn a_start_past_the_tip_gets_a_note() {
    let Some(srv) = start(&[]) else { return };
    let a = srv.addr;
    for i in 0..5 {
        assert_code(&tephra(a, &["append", "--type", "E", "--tag", &format!("k:{i}")]), 0);
    }
    let o = tephra(a, &["read", "--after", "1000"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "");
    assert_eq!(stderr(&o), "(0 events, watermark 5)\ntephra: note: --after 1000 is past the tip, 5: no event follows it yet\n");
    let o = tephra(a, &["--json", "read", "--after", "1000"]);
    assert_code(&o, 0);
    assert_eq!(json_lines(&o), [serde_json::json!({"watermark": 5})]);
    assert_eq!(stderr(&o), "{\"note\":\"--after 1000 is past the tip, 5: no event follows it yet\"}\n");
    let o = tephra(a, &["export", "--after", "1000"]);
    assert_code(&o, 0);
    assert_eq!(stderr(&o), "tephra: note: --after 1000 is past the tip, 5: no event follows it yet\nexported 0 events\n");
    for args in [&["read", "--after", "5"][..], &["read", "--after", "3"], &["read", "--backward", "--after", "1000", "--limit", "2"], &["export", "--after", "5"]] {
        let o = tephra(a, args);
        assert_code(&o, 0);
        assert!(!stderr(&o).contains("note"), "{args:?}: {}", stderr(&o));
    }

    // A subscription from past the tip: the note, then caught up at --after, then only the
    // events after it as they come.
    let (mut child, mut err_lines) = subscribe_after(a, "7");
    assert_eq!(err_lines.next().unwrap().unwrap(), "tephra: note: --after 7 is past the current tip, 5: the subscription skips the events up to 7 and shows those after it as the store reaches them (caught up at 7 meanwhile)");
    assert_eq!(err_lines.next().unwrap().unwrap(), "caught up at 7");
    for i in 5..9 {
        assert_code(&tephra(a, &["append", "--type", "E", "--tag", &format!("k:{i}")]), 0);
    }
    let mut out_lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let shown: Vec<String> = (0..2).map(|_| out_lines.next().unwrap().unwrap().split_whitespace().next().unwrap().to_owned()).collect();
    assert_eq!(shown, ["8", "9"]);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_code(&child.wait_with_output().unwrap(), 0);
    // Within the store: no note.
    let (child, mut err_lines) = subscribe_after(a, "9");
    assert_eq!(err_lines.next().unwrap().unwrap(), "caught up at 9");
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_code(&child.wait_with_output().unwrap(), 0);
}

#[test]
fn tokens_from_the_flag_or_the_environment() {
    let Some(bin) = server_binary() else { return };
    let srv = Server::start_with(&bin, &[], Some(support::AUTH_TOML));
    let a = srv.addr;
    assert_code(&tephra(a, &["--token", "s3cret", "append", "--type", "T"]), 0);
    let mut cmd = cli(a);
    cmd.env("TEPHRA_TOKEN", "s3cret").arg("stats");
    assert_code(&run(cmd, b""), 0);
    let o = tephra(a, &["--token", "wrong", "stats"]);
    assert_code(&o, 4);
    assert!(stderr(&o).contains("authentication failed"), "{}", stderr(&o));
    assert_code(&tephra(a, &["read"]), 4);
}

/// A server with TLS on, its certificate (self-signed for `localhost`) in a scratch directory
/// that lives as long as the returned guard; `None` skips.
fn tls_server() -> Option<(Server, std::path::PathBuf, tempfile::TempDir)> {
    let bin = server_binary()?;
    let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (cert, key) = support::self_signed(certs.path());
    Some((Server::start_with(&bin, &[], Some(&support::tls_toml(&cert, &key))), cert, certs))
}

#[test]
fn tls_with_a_custom_ca() {
    let Some((srv, cert, _certs)) = tls_server() else { return };
    let ca = cert.to_str().unwrap();
    let tls = ["--tls-ca", ca, "--tls-server-name", "localhost"];
    let mut args = tls.to_vec();
    args.extend(["append", "--type", "Secure", "--payload", "x"]);
    assert_code(&tephra(srv.addr, &args), 0);
    let mut args = tls.to_vec();
    args.extend(["--json", "read"]);
    let o = tephra(srv.addr, &args);
    assert_code(&o, 0);
    assert_eq!(json_lines(&o)[0]["type"], "Secure");
    // The wrong name, or no TLS at all, fails to connect.
    assert_code(&tephra(srv.addr, &["--tls-ca", ca, "--tls-server-name", "other", "stats"]), 4);
    assert_code(&tephra(srv.addr, &["stats"]), 4);
    let o = tephra(srv.addr, &["--tls-ca", "/nonexistent.pem", "stats"]);
    assert_code(&o, 2);
}

#[test]
fn a_failing_import_reports_how_far_it_got() {
    // A server frame cap that the third event's batch exceeds: TOO_LARGE, then a close.
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "4096")]) else { return };
    let big = "x".repeat(5000);
    let input = format!(
        "{{\"type\":\"A\",\"payload\":\"1\"}}\n{{\"type\":\"A\",\"payload\":\"2\"}}\n{{\"type\":\"A\",\"payload\":\"{big}\"}}\n"
    );
    let mut cmd = cli(srv.addr);
    cmd.args(["import", "--batch", "1"]);
    let o = run(cmd, input.as_bytes());
    let err = stderr(&o);
    assert!(err.contains("2 of 3 events were appended (positions 1..=2)"), "{err}");
    // TOO_LARGE is a bad request (2); the reference's id-0 reply is best-effort, and a bare
    // close is a lost connection (4).
    assert!(matches!(o.status.code(), Some(2) | Some(4)), "{err}");
    assert_eq!(event_count(srv.addr), 2);
}

#[test]
fn a_lost_connection_ends_subscribe_with_exit_4() {
    let Some(mut srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let mut cmd = cli(srv.addr);
    cmd.args(["subscribe"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
    assert_eq!(err_lines.next().unwrap().unwrap(), "caught up at 0");
    srv.kill();
    let rest: Vec<String> = err_lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(4), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("subscription failed")), "{rest:?}");
}

/// A subscription ended by the server's shutdown exits 4 and says the server closed the
/// connection, naming a shutdown as one cause (the protocol closes without a frame, so the
/// client cannot tell more; new-user review: the message read as a lost network only).
#[test]
fn a_subscription_ended_by_shutdown_says_the_server_closed_it() {
    let Some(mut srv) = start(&[]) else { return };
    let mut cmd = cli(srv.addr);
    cmd.args(["subscribe"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // Wait for the catch-up note (stderr) before stopping the server.
    let mut errs = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    errs.read_line(&mut line).unwrap();
    assert!(line.contains("caught up at 0"), "{line}");
    srv.signal(libc::SIGTERM);
    assert!(srv.wait_exit(Duration::from_secs(20)).is_some(), "the server exits");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut errs, &mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("subscription failed: the server closed the connection") && err.contains("shutting down"), "{err}");
}
