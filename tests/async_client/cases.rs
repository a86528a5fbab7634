// The `AsyncClient` cases, driven by async-io + async-executor (and one test each on
// glommio and a multi-threaded executor), with no other runtime. Included by a wrapper that
// defines `server_binary()` (the server to launch; `None` skips) and `SERVER_VERSION`.
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use async_executor::LocalExecutor;
use async_io::{Async, Timer};
use futures_lite::{future, StreamExt};
use support::Server;
use tephra::client::async_client::{AsyncClient, AsyncClientConfig, Driver, TlsConnector};
use tephra::client::{tls, ClientError, SubEvent};
use tephra::proto::{ErrorCode, FrameError};
use tephra::{AppendCondition, Event, Position, Query, QueryItem, Tags};

type Tcp = Async<TcpStream>;

fn start(env: &[(&str, &str)]) -> Option<Server> {
    let bin = server_binary()?;
    Some(Server::start(&bin, env))
}

use support::ev;

fn tag_query(tags: &[&str]) -> Query {
    Query::item(QueryItem::with_tags(Tags::new(tags.iter().copied()).unwrap()))
}

fn positions(events: &[tephra::client::SequencedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.position.get()).collect()
}

/// Runs `body` on a fresh single-threaded executor, failing the test after 60 s.
fn run<T, F: Future<Output = T>>(body: impl FnOnce(&'static LocalExecutor<'static>) -> F) -> T {
    // Leaked so spawned tasks may outlive the borrow; one small executor per run.
    let ex: &'static LocalExecutor<'static> = Box::leak(Box::new(LocalExecutor::new()));
    let fut = body(ex);
    async_io::block_on(ex.run(future::or(fut, async {
        Timer::after(Duration::from_secs(60)).await;
        panic!("test timed out");
    })))
}

/// Connects over plain TCP with the given settings; the test spawns the driver.
async fn connect(addr: SocketAddr, config: AsyncClientConfig) -> io::Result<(AsyncClient, Driver<Tcp>)> {
    let connector = move || async move {
        let s = Async::<TcpStream>::connect(addr).await?;
        s.get_ref().set_nodelay(true)?;
        Ok(s)
    };
    AsyncClient::connect_with(connector, config).await
}

fn config(bulk: usize) -> AsyncClientConfig {
    AsyncClientConfig { bulk_connections: bulk, ..AsyncClientConfig::default() }
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        Timer::after(Duration::from_millis(25)).await;
    }
}

#[test]
fn a_thousand_requests_in_flight_on_one_socket() {
    let Some(srv) = start(&[]) else { return };
    run(|ex| {
        async move {
            let (client, driver) = connect(srv.addr, config(0)).await.unwrap();
            assert_eq!(client.socket_count(), 1);
            assert_eq!(client.server_version(), SERVER_VERSION);
            let driver = ex.spawn(driver);

            // All 1,000 calls are issued before any is awaited.
            let appends: Vec<_> = (0..1000)
                .map(|i| ex.spawn(client.append(vec![ev("E", &[&format!("i:{i}")], format!("{i}").as_bytes())], None)))
                .collect();
            let stats: Vec<_> = (0..20).map(|_| ex.spawn(client.stats())).collect();
            let mut firsts = Vec::new();
            let mut by_position = std::collections::HashMap::new();
            for (i, task) in appends.into_iter().enumerate() {
                let r = task.await.unwrap();
                assert_eq!(r.first, r.last);
                firsts.push(r.first.get());
                by_position.insert(r.first.get(), i);
            }
            for task in stats {
                let s = task.await.unwrap();
                assert!(s.event_count <= 1000);
                assert_eq!(s.active_connections, 1, "one socket only");
            }
            firsts.sort_unstable();
            assert_eq!(firsts, (1..=1000).collect::<Vec<_>>(), "dense, each position once");

            // Every acknowledged position holds the event that was acknowledged for it.
            let (all, wm) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
            assert_eq!(wm, Position(1000));
            assert_eq!(positions(&all), (1..=1000).collect::<Vec<_>>());
            for e in &all {
                let i = by_position[&e.position.get()];
                assert_eq!(e.event, ev("E", &[&format!("i:{i}")], format!("{i}").as_bytes()));
            }

            // Dropping the client closes the socket and the driver ends cleanly.
            drop(client);
            driver.await;
        }
    });
}

#[test]
fn reads_limits_backward_and_pool_round_robin() {
    let Some(srv) = start(&[("TEPHRA__SERVER__READS__BATCH_EVENTS", "3")]) else { return };
    run(|ex| {
        async move {
            let (client, driver) = connect(srv.addr, AsyncClientConfig::default()).await.unwrap();
            ex.spawn(driver).detach();
            assert_eq!(client.socket_count(), 5);
            assert_eq!(client.stats().await.unwrap().active_connections, 5, "1 control + 4 bulk");

            let r = client.append((1..=10).map(|i| ev("E", &[if i % 2 == 0 { "even" } else { "odd" }], &[i])), None);
            assert_eq!(r.await.unwrap().last, Position(10));

            // Limit + cursor pagination, watermark only once ended.
            let mut page = client.read(Query::all(), Position::ZERO, Some(4));
            let mut got = Vec::new();
            while let Some(e) = page.next().await {
                assert_eq!(page.watermark(), None);
                got.push(e.unwrap().position.get());
            }
            assert_eq!(got, [1, 2, 3, 4]);
            assert_eq!(page.watermark(), Some(Position(10)));
            assert!(page.next().await.is_none(), "a finished stream stays finished");
            let (rest, _) = client.read(Query::all(), Position(4), Some(100)).collect_all().await.unwrap();
            assert_eq!(positions(&rest), (5..=10).collect::<Vec<_>>());
            let (none, wm) = client.read(Query::all(), Position::ZERO, Some(0)).collect_all().await.unwrap();
            assert!(none.is_empty());
            assert_eq!(wm, Position(10));
            let (past, _) = client.read_all(Query::all(), Position(1000)).await.unwrap();
            assert!(past.is_empty());

            // Filters and backward reads.
            let (odd, _) = client.read_all(tag_query(&["odd"]), Position(2)).await.unwrap();
            assert_eq!(positions(&odd), [3, 5, 7, 9]);
            assert_eq!(odd[0].event.data(), &[3]);
            let (back, wm) = client.read_back(Query::all(), Position::MAX, Some(3)).collect_all().await.unwrap();
            assert_eq!((positions(&back), wm), (vec![10, 9, 8], Position(10)));
            let (back, _) = client.read_all_back(tag_query(&["even"]), Position(7)).await.unwrap();
            assert_eq!(positions(&back), [6, 4, 2]);
            let (back, _) = client.read_all_back(Query::all(), Position::ZERO).await.unwrap();
            assert!(back.is_empty());

            // Many concurrent reads spread over the pool, interleaved with appends.
            let reads: Vec<_> = (0..40).map(|_| ex.spawn(client.read_all(Query::all(), Position::ZERO))).collect();
            let more: Vec<_> = (0..10).map(|i| ex.spawn(client.append(vec![ev("More", &[], &[i])], None))).collect();
            for r in reads {
                let (events, wm) = r.await.unwrap();
                assert_eq!(events.len() as u64, wm.get(), "a read sees exactly its pinned prefix");
                assert_eq!(positions(&events), (1..=wm.get()).collect::<Vec<_>>());
            }
            for m in more {
                m.await.unwrap();
            }
            assert_eq!(client.stats().await.unwrap().event_count, 20);

            // Server errors arrive on the stream; the socket stays usable.
            let err = client.append(Vec::new(), None).await.unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::Empty));
            let guard = AppendCondition::new(tag_query(&["odd"]));
            let err = client.append(vec![ev("X", &["odd"], b"")], Some(guard)).await.unwrap_err();
            match err {
                ClientError::Server { code, conflict_position, retryable, .. } => {
                    assert_eq!((code, conflict_position, retryable), (ErrorCode::Conflict, Some(Position(1)), false))
                }
                other => panic!("expected a conflict, got {other:?}"),
            }
            assert_eq!(client.stats().await.unwrap().event_count, 20);
        }
    });
}

#[test]
fn dropping_streams_sends_cancels_and_the_socket_keeps_working() {
    let Some(srv) =
        start(&[support::FAST_WAIT_TICK, ("TEPHRA__SERVER__READS__BATCH_EVENTS", "7")])
    else {
        return;
    };
    run(|ex| {
        async move {
            // One bulk socket, so every stream below shares it.
            let (client, driver) = connect(srv.addr, config(1)).await.unwrap();
            ex.spawn(driver).detach();
            client.append(vec![ev("A", &["k:1"], b"1"), ev("B", &["k:2"], b"2")], None).await.unwrap();

            let mut sub = client.subscribe(Query::all(), Position::ZERO);
            let mut seen = Vec::new();
            loop {
                match sub.next().await.unwrap().unwrap() {
                    SubEvent::Event(e) => seen.push(e.position.get()),
                    SubEvent::CaughtUp(w) => {
                        assert_eq!(w, Position(2));
                        break;
                    }
                }
            }
            assert_eq!(seen, [1, 2]);

            // A live event, appended on the control socket.
            client.append(vec![ev("C", &["k:3"], b"3")], None).await.unwrap();
            match sub.next().await.unwrap().unwrap() {
                SubEvent::Event(e) => assert_eq!((e.position, e.event), (Position(3), ev("C", &["k:3"], b"3"))),
                other => panic!("expected the live event, got {other:?}"),
            }
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position(3))));
            assert_eq!(client.stats().await.unwrap().active_subscriptions, 1);

            // Dropping it sends a CancelRequest: the server stops the subscription while the
            // connection stays open.
            drop(sub);
            let c = client.clone();
            eventually("the server to stop the subscription", async || {
                c.stats().await.unwrap().active_subscriptions == 0
            })
            .await;
            let stats = client.stats().await.unwrap();
            assert_eq!(stats.active_connections, 2, "no socket was closed");

            // A subscription dropped while frames are still coming, and a read dropped early.
            let mut sub = client.subscribe(tag_query(&["k:3"]), Position::ZERO);
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::Event(_)));
            client.append((0..200).map(|i| ev("D", &["k:3"], &[i as u8; 64])).collect::<Vec<_>>(), None).await.unwrap();
            drop(sub);
            let mut read = client.read(Query::all(), Position::ZERO, None);
            assert_eq!(read.next().await.unwrap().unwrap().position, Position(1));
            drop(read);
            // An unpolled stream never sends anything.
            drop(client.read(Query::all(), Position::ZERO, None));

            // The same bulk socket serves new streams correctly.
            let (all, wm) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
            assert_eq!(wm, Position(203));
            assert_eq!(positions(&all), (1..=203).collect::<Vec<_>>());
            let mut sub = client.subscribe(tag_query(&["k:1"]), Position::ZERO);
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::Event(e) if e.position == Position(1)));
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position(203))));
            sub.cancel();
            let c = client.clone();
            eventually("every subscription to stop", async || c.stats().await.unwrap().active_subscriptions == 0).await;
            assert_eq!(client.stats().await.unwrap().active_connections, 2);
        }
    });
}

#[test]
fn every_socket_authenticates_with_the_token() {
    let Some(bin) = server_binary() else { return };
    let srv = Server::start_with(&bin, &[], Some(support::AUTH_TOML));
    run(|ex| async move {
        for token in ["s3cret", "next"] {
            let cfg = AsyncClientConfig { auth_token: Some(token.into()), bulk_connections: 2, ..Default::default() };
            let (client, driver) = connect(srv.addr, cfg).await.unwrap();
            ex.spawn(driver).detach();
            client.append(vec![ev("T", &[], token.as_bytes())], None).await.unwrap();
            let (all, _) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
            assert_eq!(all.last().unwrap().event.data(), token.as_bytes());
            assert!(client.stats().await.unwrap().active_connections >= 3);
        }
        for token in [Some("nope"), Some(""), None] {
            let cfg =
                AsyncClientConfig { auth_token: token.map(str::to_owned), bulk_connections: 2, ..Default::default() };
            let err = connect(srv.addr, cfg).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "token {token:?}: {err}");
            assert!(err.to_string().contains("invalid or missing auth token"), "{err}");
        }
    });
}

#[test]
fn a_killed_server_fails_every_pending_request() {
    let Some(mut srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let addr = srv.addr;
    let (result, after) = run(|ex| {
        async move {
            let (client, driver) = connect(addr, config(1)).await.unwrap();
            let mut conns = driver.into_connections().into_iter();
            let control = ex.spawn(conns.next().unwrap());
            let bulk = ex.spawn(conns.next().unwrap());
            client.append(vec![ev("A", &[], b"")], None).await.unwrap();
            let mut sub = client.subscribe(Query::all(), Position::ZERO);
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::Event(_)));
            assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position(1))));
            let pending = ex.spawn(async move { sub.next().await });

            srv.kill();

            let result = pending.await;
            let control_end = control.await;
            let bulk_end = bulk.await;
            assert!(control_end.is_err() && bulk_end.is_err(), "{control_end:?} {bulk_end:?}");
            // Later requests fail at once with the same reason.
            let after = client.append(vec![ev("B", &[], b"")], None).await;
            let read_after = client.read_all(Query::all(), Position::ZERO).await;
            assert!(read_after.is_err());
            (result, after)
        }
    });
    let is_broken = |e: &ClientError| {
        matches!(e, ClientError::UnexpectedEof)
            || matches!(e, ClientError::Io(io) if matches!(io.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe))
    };
    match result {
        Some(Err(e)) => assert!(is_broken(&e), "{e:?}"),
        other => panic!("the pending subscription should fail, got {other:?}"),
    }
    match after {
        Err(e) => assert!(is_broken(&e), "{e:?}"),
        Ok(r) => panic!("an append after the failure succeeded: {r:?}"),
    }
}

#[test]
fn an_unattributed_error_is_the_reason_given_to_pending_requests() {
    let Some(srv) =
        start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "64"), support::FAST_WAIT_TICK])
    else {
        return;
    };
    let addr = srv.addr;
    // The reference sends the id-0 error best-effort; retry the rare close without it.
    let mut answered = false;
    for _ in 0..10 {
        let outcome = run(|ex| {
            async move {
                let (client, driver) = connect(addr, config(0)).await.unwrap();
                let driver = ex.spawn(driver);
                // A subscription pending on the same socket ...
                let mut sub = client.subscribe(Query::all(), Position::ZERO);
                assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position::ZERO)));
                let pending = ex.spawn(async move { sub.next().await });
                // ... and a request the server refuses at the frame level (TOO_LARGE, id 0,
                // then close).
                let big = client.append(vec![ev("Big", &[], &[0u8; 100])], None).await;
                driver.await;
                (big, pending.await)
            }
        });
        match outcome {
            (Err(ClientError::Server { code, message, .. }), Some(Err(sub_err))) => {
                assert_eq!(code, ErrorCode::TooLarge);
                assert!(message.ends_with("exceeds the maximum of 64"), "{message}");
                assert_eq!(sub_err.code(), Some(ErrorCode::TooLarge), "{sub_err:?}");
                answered = true;
                break;
            }
            (Err(ClientError::UnexpectedEof | ClientError::Io(_)), _) => continue,
            other => panic!("expected TOO_LARGE for both, got {other:?}"),
        }
    }
    assert!(answered, "never received the id-0 TOO_LARGE");
}

#[test]
fn the_client_frame_cap_refuses_before_sending() {
    let Some(srv) = start(&[]) else { return };
    run(|ex| async move {
        let cfg = AsyncClientConfig { max_frame_len: 64, bulk_connections: 0, ..Default::default() };
        let (client, driver) = connect(srv.addr, cfg).await.unwrap();
        ex.spawn(driver).detach();
        let err = client.append(vec![ev("Big", &[], &[0u8; 100])], None).await.unwrap_err();
        assert!(matches!(err, ClientError::Frame(FrameError::TooLong { max: 64, .. })), "{err:?}");
        assert_eq!(client.append(vec![ev("Small", &[], b"")], None).await.unwrap().first, Position(1));
        assert_eq!(client.stats().await.unwrap().event_count, 1);
    });
}

#[test]
fn bad_settings_and_refused_dials_fail_the_connect() {
    run(|_ex| async move {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let err = connect(addr, AsyncClientConfig::default()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let cfg = AsyncClientConfig { max_inflight_requests: 0, ..Default::default() };
        assert_eq!(connect(addr, cfg).await.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    });
}

#[test]
fn tls_connector_with_tokens() {
    let Some(bin) = server_binary() else { return };
    let (toml, cert, _certs) = support::tls_config_with_tokens(&["s3cret"]);
    let srv = Server::start_with(&bin, &[], Some(&toml));
    let tls_config = tls::config_with_custom_ca(&cert).unwrap();
    let addr = srv.addr;
    run(|ex| async move {
        let tcp = move || async move {
            let s = Async::<TcpStream>::connect(addr).await?;
            s.get_ref().set_nodelay(true)?;
            Ok(s)
        };
        let connector = TlsConnector::new(tcp, "localhost", tls_config.clone()).unwrap();
        let cfg = AsyncClientConfig { auth_token: Some("s3cret".into()), bulk_connections: 2, ..Default::default() };
        let (client, driver) = AsyncClient::connect_with(connector.clone(), cfg.clone()).await.unwrap();
        ex.spawn(driver).detach();
        let batch: Vec<Event> = (0..32).map(|i| ev("Big", &[&format!("i:{i}")], &vec![i as u8; 16 * 1024])).collect();
        assert_eq!(client.append(batch, None).await.unwrap().last, Position(32));
        let (all, wm) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
        assert_eq!((all.len(), wm), (32, Position(32)));
        assert!(all.iter().enumerate().all(|(i, e)| e.event.data() == vec![i as u8; 16 * 1024].as_slice()));

        let bad = AsyncClientConfig { auth_token: Some("bad".into()), ..cfg };
        let err = AsyncClient::connect_with(connector, bad).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let wrong_name = TlsConnector::new(tcp, "not-localhost", tls_config).unwrap();
        assert!(AsyncClient::connect_with(wrong_name, AsyncClientConfig::default()).await.is_err());
    });
}

#[test]
// The client on a glommio executor of its own (a user's, not the server's shards), which the
// runtime boundary (clippy.toml) otherwise keeps inside the shards crate.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn runs_on_glommio() {
    let Some(srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let addr = srv.addr;
    let ex = glommio::LocalExecutorBuilder::default().spawn(move || async move {
        let connect = move || async move {
            let s = glommio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok::<_, io::Error>(s)
        };
        let (client, driver) = AsyncClient::connect_with(connect, config(1)).await.unwrap();
        let driver = glommio::spawn_local(driver);
        let appends: Vec<_> =
            (0..100u8).map(|i| glommio::spawn_local(client.append(vec![ev("G", &[], &[i])], None))).collect();
        let mut firsts = Vec::new();
        for a in appends {
            firsts.push(a.await.unwrap().first.get());
        }
        firsts.sort_unstable();
        assert_eq!(firsts, (1..=100).collect::<Vec<_>>());
        let mut sub = client.subscribe(Query::all(), Position(99));
        assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::Event(e) if e.position == Position(100)));
        assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position(100))));
        drop(sub);
        let (back, _) = client.read_back(Query::all(), Position::MAX, Some(2)).collect_all().await.unwrap();
        assert_eq!(positions(&back), [100, 99]);
        drop(client);
        driver.await;
    });
    ex.unwrap().join().unwrap();
}

#[test]
fn the_async_io_tcp_connector() {
    let Some(srv) = start(&[]) else { return };
    run(|ex| async move {
        let (client, driver) = AsyncClient::connect(srv.addr, None).await.unwrap();
        ex.spawn(driver).detach();
        assert_eq!(client.socket_count(), 5);
        assert_eq!(client.append(vec![ev("T", &[], b"")], None).await.unwrap().first, Position(1));
        let (all, _) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
        assert_eq!(positions(&all), [1]);
        assert!(tephra::client::async_client::TcpConnector::new("256.0.0.1:1").is_err(), "unresolvable");
    });
}

#[test]
fn runs_on_a_multi_threaded_executor() {
    let Some(srv) = start(&[]) else { return };
    let ex = std::sync::Arc::new(async_executor::Executor::new());
    let (stop, stopped) = flume::bounded::<()>(0);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (ex, stopped) = (ex.clone(), stopped.clone());
            std::thread::spawn(move || async_io::block_on(ex.run(stopped.recv_async())))
        })
        .collect();
    async_io::block_on(async {
        let (client, driver) = connect(srv.addr, config(2)).await.unwrap();
        // Each socket on its own task, on whichever worker thread picks it up.
        for conn in driver.into_connections() {
            ex.spawn(conn).detach();
        }
        let appends: Vec<_> = (0..200u8).map(|i| ex.spawn(client.append(vec![ev("M", &[], &[i])], None))).collect();
        let reads: Vec<_> = (0..20).map(|_| ex.spawn(client.read_all(Query::all(), Position::ZERO))).collect();
        let mut firsts = Vec::new();
        for a in appends {
            firsts.push(a.await.unwrap().first.get());
        }
        firsts.sort_unstable();
        assert_eq!(firsts, (1..=200).collect::<Vec<_>>());
        for r in reads {
            let (events, wm) = r.await.unwrap();
            assert_eq!(positions(&events), (1..=wm.get()).collect::<Vec<_>>());
        }
        let sub_client = client.clone();
        let sub = ex.spawn(async move {
            let mut sub = sub_client.subscribe(Query::all(), Position(198));
            let mut got = Vec::new();
            while let Some(item) = sub.next().await {
                match item.unwrap() {
                    SubEvent::Event(e) => got.push(e.position.get()),
                    SubEvent::CaughtUp(_) => break,
                }
            }
            got
        });
        assert_eq!(sub.await, [199, 200]);
    });
    drop(stop);
    for w in workers {
        let _ = w.join().unwrap();
    }
}
