//! The published `tephra-client` 0.5.3 (crates.io), blocking and async, against OUR
//! `tephra-server` binary: the client every existing Tephra user already has must work unchanged.
//!
//! The server binary comes from `TEPHRA_SERVER_BIN` (scripts/test.sh builds it in release and
//! sets it); without it the default `../../target/release/tephra-server` is tried.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tephra_client::{
    AppendCondition, AsyncClient, AsyncClientConfig, Client, ClientError, ErrorCode, Event, EventType, Position,
    Query, QueryItem, SequencedEvent, SubEvent, Tag, Tags,
};

fn server_binary() -> PathBuf {
    let path = match std::env::var_os("TEPHRA_SERVER_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/tephra-server"),
    };
    assert!(
        path.is_file(),
        "our tephra-server binary is not at {} (build it with `cargo build --release --bin tephra-server` \
         or set TEPHRA_SERVER_BIN)",
        path.display()
    );
    path
}

/// Our server on `127.0.0.1:0` over a temp data dir; killed on drop.
struct TestServer {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
    done: Arc<AtomicBool>,
}

/// The published blocking client has no timeouts: a server that stops answering would hang
/// the test forever. After this long the server is killed, so the test fails instead.
const WATCHDOG: Duration = Duration::from_secs(90);

impl TestServer {
    fn start(env: &[(&str, &str)]) -> TestServer {
        TestServer::start_with(env, None)
    }

    /// Like `start`, also passing `config_toml` as the `--config` file.
    fn start_with(env: &[(&str, &str)], config_toml: Option<&str>) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(server_binary());
        cmd.arg("--bind").arg("127.0.0.1:0").arg("--data-dir").arg(dir.path().join("data"));
        if let Some(toml) = config_toml {
            let path = dir.path().join("tephra.toml");
            std::fs::write(&path, toml).expect("write config");
            cmd.arg("--config").arg(path);
        }
        cmd.env("NO_COLOR", "1").env("TEPHRA__SEGMENT__SIZE", "16777216");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn tephra-server");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let l = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(i) = line.find("listening addr=") {
                    let rest = &line[i + "listening addr=".len()..];
                    let tok: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                    if let (Ok(a), Some(tx)) = (tok.parse::<SocketAddr>(), tx.take()) {
                        let _ = tx.send(a);
                    }
                }
                l.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                l.lock().unwrap().push_str(&format!("[stderr] {line}\n"));
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => {
                let done = Arc::new(AtomicBool::new(false));
                let (d, pid) = (done.clone(), child.id());
                std::thread::spawn(move || {
                    let start = Instant::now();
                    while !d.load(Ordering::SeqCst) {
                        if start.elapsed() > WATCHDOG {
                            eprintln!("*** watchdog: the test ran over {WATCHDOG:?}; killing tephra-server {pid} ***");
                            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                });
                TestServer { addr, child, _dir: dir, log, done }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tephra-server did not start; output:\n{}", log.lock().unwrap());
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("server output:\n{}", self.log.lock().unwrap());
        }
    }
}

fn ev(ty: &str, tags: &[&str], payload: &[u8]) -> Event {
    Event::new(ty, tags.iter().copied(), payload).unwrap()
}

fn tag_query(tags: &[&str]) -> Query {
    Query::item(QueryItem::with_tags(Tags::new(tags.iter().map(|t| Tag::new(*t).unwrap())).unwrap()))
}

fn positions(events: &[SequencedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.position().get()).collect()
}

fn server_error(err: ClientError) -> (ErrorCode, String, bool, Option<Position>) {
    match err {
        ClientError::Server { code, message, retryable, conflict_position } => (code, message, retryable, conflict_position),
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[test]
fn blocking_client_round_trip() {
    let srv = TestServer::start(&[]);
    let mut c = Client::connect(srv.addr).unwrap();

    // Append.
    let r = c.append([ev("Registered", &["student:s1"], b"{\"n\":1}")], None).unwrap();
    assert_eq!((r.first.get(), r.last.get()), (1, 1));
    let r = c
        .append([ev("Enrolled", &["student:s1", "course:c1"], b"{}"), ev("Enrolled", &["student:s2", "course:c1"], b"")], None)
        .unwrap();
    assert_eq!((r.first.get(), r.last.get()), (2, 3));

    // Conditional conflict: a uniqueness guard passes once, then fails durably.
    let alice = tag_query(&["username:alice"]);
    let r = c.append([ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice.clone()))).unwrap();
    assert_eq!(r.first.get(), 4);
    let (code, message, retryable, pos) =
        server_error(c.append([ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice.clone()))).unwrap_err());
    assert_eq!((code, retryable, pos), (ErrorCode::Conflict, false, Some(Position::new(4))));
    assert_eq!(message, "append condition conflict (Boundary, Durable(Position(4)))");
    // Moving the boundary past the match lets it through.
    let r = c
        .append([ev("Renamed", &["username:alice"], b"")], Some(AppendCondition::new(alice).after(Position::new(4))))
        .unwrap();
    assert_eq!(r.first.get(), 5);

    // Already exists (existence clause, code 9).
    let key = tag_query(&["cmd:order-42"]);
    assert_eq!(c.append([ev("OrderPlaced", &["cmd:order-42"], b"x")], Some(AppendCondition::exists_only(key.clone()))).unwrap().first.get(), 6);
    let (code, message, retryable, pos) =
        server_error(c.append([ev("OrderPlaced", &["cmd:order-42"], b"x")], Some(AppendCondition::exists_only(key))).unwrap_err());
    assert_eq!((code, retryable, pos), (ErrorCode::AlreadyExists, false, Some(Position::new(6))));
    assert_eq!(message, "append condition conflict (Existence, Durable(Position(6)))");

    // After beyond tip, empty append.
    let (code, message, _, _) = server_error(
        c.append([ev("X", &["k:x"], b"")], Some(AppendCondition::new(Query::all()).after(Position::new(1000)))).unwrap_err(),
    );
    assert_eq!((code, message.as_str()), (ErrorCode::AfterBeyondTip, "after 1000 is beyond the durable tip 6"));
    let (code, message, _, _) = server_error(c.append(Vec::<Event>::new(), None).unwrap_err());
    assert_eq!((code, message.as_str()), (ErrorCode::Empty, "append with no events"));

    // Read: everything, fields intact.
    let (all, wm) = c.read_all(Query::all(), Position::ZERO, None).unwrap();
    assert_eq!(wm.get(), 6);
    assert_eq!(positions(&all), [1, 2, 3, 4, 5, 6]);
    assert_eq!(all[0].event(), &ev("Registered", &["student:s1"], b"{\"n\":1}"));
    assert_eq!(all[1].event().tags().collect::<Vec<_>>(), ["course:c1", "student:s1"]);
    assert_eq!(all[1].event().event_type(), "Enrolled");
    assert_eq!(all[2].event().payload(), b"");
    // Tag and type queries, after cursor.
    let (s1, _) = c.read_all(tag_query(&["student:s1"]), Position::ZERO, None).unwrap();
    assert_eq!(positions(&s1), [1, 2]);
    let enrolled = Query::item(QueryItem::of_types(vec![EventType::new("Enrolled").unwrap()]));
    let (e, _) = c.read_all(enrolled, Position::new(2), None).unwrap();
    assert_eq!(positions(&e), [3]);

    // Limit: pages tile with no gap or duplicate; limit 0 still gives the watermark.
    let mut stream = c.read(Query::all(), Position::ZERO, Some(4)).unwrap();
    let page: Vec<SequencedEvent> = stream.by_ref().map(Result::unwrap).collect();
    assert_eq!(positions(&page), [1, 2, 3, 4]);
    assert_eq!(stream.watermark(), Some(Position::new(6)));
    drop(stream);
    let (page, _) = c.read_all(Query::all(), Position::new(4), Some(4)).unwrap();
    assert_eq!(positions(&page), [5, 6]);
    let (zero, wm) = c.read_all(Query::all(), Position::ZERO, Some(0)).unwrap();
    assert!(zero.is_empty());
    assert_eq!(wm.get(), 6);

    // read_back: newest first, exclusive upper bound, limit.
    let (back, wm) = c.read_all_back(Query::all(), Position::MAX, None).unwrap();
    assert_eq!((positions(&back), wm.get()), (vec![6, 5, 4, 3, 2, 1], 6));
    let (back, _) = c.read_all_back(Query::all(), Position::MAX, Some(2)).unwrap();
    assert_eq!(positions(&back), [6, 5]);
    let (back, _) = c.read_all_back(Query::all(), Position::new(5), Some(2)).unwrap();
    assert_eq!(positions(&back), [4, 3]);
    let (back, _) = c.read_all_back(Query::all(), Position::ZERO, None).unwrap();
    assert!(back.is_empty());

    // Dropping a read early keeps the connection aligned.
    {
        let mut s = c.read(Query::all(), Position::ZERO, None).unwrap();
        assert_eq!(s.next().unwrap().unwrap().position().get(), 1);
    }

    // Stats.
    let stats = c.stats().unwrap();
    assert_eq!(stats.event_count, 6);
    assert_eq!(stats.segment_count, 1);
    assert!(stats.disk_bytes >= 16 * 1024 * 1024, "{stats:?}");
    assert_eq!(stats.active_connections, 1);
    assert_eq!(stats.active_subscriptions, 0);
    assert_eq!(stats.max_connections, 1024);
    assert_eq!((stats.connections_refused, stats.connections_reaped), (0, 0));
    assert!(!stats.version.is_empty());

    // Subscribe: catch up to CaughtUp, then a live event, then CaughtUp again.
    let mut sub_conn = Client::connect(srv.addr).unwrap();
    let (mut sub, cancel) = sub_conn.subscribe(tag_query(&["course:c1"]), Position::ZERO).unwrap();
    let mut seen = Vec::new();
    loop {
        match sub.next().unwrap().unwrap() {
            SubEvent::Event(e) => seen.push(e.position().get()),
            SubEvent::CaughtUp(w) => {
                // The cursor jumps to the tip past non-matching events.
                assert_eq!(w.get(), 6);
                break;
            }
        }
    }
    assert_eq!(seen, [2, 3]);
    assert_eq!(c.stats().unwrap().active_subscriptions, 1);
    c.append([ev("Enrolled", &["student:s3", "course:c1"], b"live")], None).unwrap();
    match sub.next().unwrap().unwrap() {
        SubEvent::Event(e) => {
            assert_eq!(e.position().get(), 7);
            assert_eq!(e.event().payload(), b"live");
        }
        other => panic!("expected the live event, got {other:?}"),
    }
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::CaughtUp(p) if p.get() == 7));
    // The published client's cancel shuts the socket down (no CancelRequest); the server must
    // notice the close and drop the subscription.
    cancel.cancel();
    drop(sub);
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.stats().unwrap().active_subscriptions != 0 {
        assert!(Instant::now() < deadline, "the cancelled subscription is still live on the server");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn blocking_client_tokens_and_rotation() {
    // Tokens need TLS or allow_insecure; the published client carries the token in its Hello.
    let toml = "[auth]\nallow_insecure = true\n[[auth.tokens]]\ntoken = \"s3cret\"\n[[auth.tokens]]\ntoken = \"next\"\n";
    let srv = TestServer::start_with(&[], Some(toml));
    for token in ["s3cret", "next"] {
        let mut c = Client::connect_with(srv.addr, Some(token)).unwrap();
        assert_eq!(c.stats().unwrap().event_count, 0);
    }
    for token in [Some("nope"), Some(""), None] {
        let err = Client::connect_with(srv.addr, token).err().expect("a bad token must fail the connect");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "token {token:?}: {err}");
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn async_client_round_trip() {
    let srv = TestServer::start(&[]);
    rt().block_on(async {
        let client = AsyncClient::connect(srv.addr).await.unwrap();
        // One control plus four bulk sockets.
        let mut active = 0;
        for _ in 0..200 {
            active = client.stats().await.unwrap().active_connections;
            if active == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(active, 5);

        // Concurrent appends over one connection: dense, distinct positions.
        let (a, b, c) = tokio::join!(
            client.append([ev("Enrolled", &["course:c1"], b"{}")], None),
            client.append([ev("Enrolled", &["course:c2"], b"{}")], None),
            client.append([ev("Enrolled", &["course:c3"], b"{}")], None),
        );
        let mut firsts = vec![a.unwrap().first.get(), b.unwrap().first.get(), c.unwrap().first.get()];
        firsts.sort();
        assert_eq!(firsts, [1, 2, 3]);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..200u32 {
            let client = client.clone();
            set.spawn(async move { client.append([ev("Bulk", &[&format!("n:{i}")], &i.to_be_bytes())], None).await.unwrap().first.get() });
        }
        let mut got = Vec::new();
        while let Some(p) = set.join_next().await {
            got.push(p.unwrap());
        }
        got.sort();
        assert_eq!(got, (4..=203).collect::<Vec<_>>());

        // Conflict and already-exists.
        let alice = tag_query(&["username:alice"]);
        client.append([ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice.clone()))).await.unwrap();
        let (code, _, retryable, pos) = server_error(
            client.append([ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice))).await.unwrap_err(),
        );
        assert_eq!((code, retryable, pos), (ErrorCode::Conflict, false, Some(Position::new(204))));
        let key = tag_query(&["cmd:1"]);
        client.append([ev("Cmd", &["cmd:1"], b"")], Some(AppendCondition::exists_only(key.clone()))).await.unwrap();
        let (code, _, retryable, pos) =
            server_error(client.append([ev("Cmd", &["cmd:1"], b"")], Some(AppendCondition::exists_only(key))).await.unwrap_err());
        assert_eq!((code, retryable, pos), (ErrorCode::AlreadyExists, false, Some(Position::new(205))));

        // Reads, limit, read_back.
        let (all, wm) = client.read_all(Query::all(), Position::ZERO, None).await.unwrap();
        assert_eq!((all.len(), wm.get()), (205, 205));
        assert_eq!(positions(&all), (1..=205).collect::<Vec<_>>());
        let (page, wm) = client.read_all(Query::all(), Position::new(10), Some(5)).await.unwrap();
        assert_eq!((positions(&page), wm.get()), (vec![11, 12, 13, 14, 15], 205));
        let (back, _) = client.read_all_back(Query::all(), Position::MAX, Some(3)).await.unwrap();
        assert_eq!(positions(&back), [205, 204, 203]);
        let (one, _) = client.read_all(tag_query(&["n:7"]), Position::ZERO, None).await.unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].event().payload(), 7u32.to_be_bytes());
        let mut stream = client.read(Query::all(), Position::new(200), None).await;
        let mut streamed = Vec::new();
        while let Some(item) = stream.next().await {
            streamed.push(item.unwrap().position().get());
        }
        assert_eq!(streamed, [201, 202, 203, 204, 205]);
        assert_eq!(stream.watermark(), Some(Position::new(205)));

        // Dropping an unfinished read sends a cancel and the client keeps working.
        {
            let mut s = client.read(Query::all(), Position::ZERO, None).await;
            assert_eq!(s.next().await.unwrap().unwrap().position().get(), 1);
        }

        // Subscribe until CaughtUp, then live, then drop (cancels server-side).
        let mut sub = client.subscribe(tag_query(&["course:c2"]), Position::ZERO).await;
        let mut seen = Vec::new();
        loop {
            match sub.next().await.unwrap().unwrap() {
                SubEvent::Event(e) => seen.push(e.position().get()),
                SubEvent::CaughtUp(w) => {
                    assert_eq!(w.get(), 205);
                    break;
                }
            }
        }
        assert_eq!(seen.len(), 1);
        assert_eq!(client.stats().await.unwrap().active_subscriptions, 1);
        client.append([ev("Enrolled", &["course:c2"], b"live")], None).await.unwrap();
        match sub.next().await.unwrap().unwrap() {
            SubEvent::Event(e) => assert_eq!((e.position().get(), e.event().payload()), (206, &b"live"[..])),
            other => panic!("expected the live event, got {other:?}"),
        }
        drop(sub);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stats = client.stats().await.unwrap();
            if stats.active_subscriptions == 0 {
                assert_eq!(stats.event_count, 206);
                break;
            }
            assert!(Instant::now() < deadline, "the dropped subscription is still live on the server");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn async_client_single_socket_and_tokens() {
    let srv = TestServer::start_with(&[], Some("[auth]\nallow_insecure = true\n[[auth.tokens]]\ntoken = \"s3cret\"\n"));
    rt().block_on(async {
        let config = AsyncClientConfig { bulk_connections: 0, auth_token: Some("s3cret".into()), ..AsyncClientConfig::default() };
        let client = AsyncClient::connect_with(srv.addr, config).await.unwrap();
        assert_eq!(client.stats().await.unwrap().active_connections, 1);
        client.append([ev("E", &["k:1"], b"x")], None).await.unwrap();
        let (all, _) = client.read_all(Query::all(), Position::ZERO, None).await.unwrap();
        assert_eq!(positions(&all), [1]);
        // Every pooled socket authenticates: a wrong token fails the connect.
        let bad = AsyncClientConfig { auth_token: Some("nope".into()), ..AsyncClientConfig::default() };
        assert!(AsyncClient::connect_with(srv.addr, bad).await.is_err());
        let good = AsyncClientConfig { auth_token: Some("s3cret".into()), ..AsyncClientConfig::default() };
        let pooled = AsyncClient::connect_with(srv.addr, good).await.unwrap();
        let (all, _) = pooled.read_all(Query::all(), Position::ZERO, None).await.unwrap();
        assert_eq!(all.len(), 1);
    });
}
