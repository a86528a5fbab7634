//! The `AsyncClient` against a scripted in-process server, for what a real server cannot
//! show: ids on the wire, answers out of order, the in-flight bound, cancel frames, ignored
//! stray frames, and an id-0 error as the failure reason.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use async_executor::LocalExecutor;
use async_io::{Async, Timer};
use futures_lite::{future, StreamExt};
use prost::Message;
use tephra::client::async_client::{AsyncClient, AsyncClientConfig, Driver};
use tephra::client::{ClientError, SubEvent};
use tephra::proto::{self, request, response, ErrorCode, FrameDecoder, Request, Response};
use tephra::{Position, Query};

/// The server end of one connection.
struct Peer {
    stream: TcpStream,
    dec: FrameDecoder,
}

impl Peer {
    fn accept(listener: &TcpListener) -> Peer {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Peer { stream, dec: FrameDecoder::new(u32::MAX) }
    }

    /// The next request; `None` on EOF.
    fn recv(&mut self) -> Option<Request> {
        self.dec.read_next(&mut self.stream).unwrap().map(|b| Request::decode(b).unwrap())
    }

    /// The next request, or `None` if none arrives within `wait`.
    fn try_recv(&mut self, wait: Duration) -> Option<Request> {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let r = match self.dec.read_next(&mut self.stream) {
            Ok(b) => b.map(|b| Request::decode(b).unwrap()),
            Err(proto::FrameError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => None,
            Err(e) => panic!("{e}"),
        };
        self.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        r
    }

    fn send(&mut self, resp: &Response) {
        let mut buf = Vec::new();
        proto::encode_frame(resp, u32::MAX, &mut buf).unwrap();
        self.stream.write_all(&buf).unwrap();
    }

    /// Answers the Hello, checking its id and token.
    fn handshake(listener: &TcpListener, token: Option<&str>) -> Peer {
        let mut peer = Peer::accept(listener);
        let hello = peer.recv().unwrap();
        assert_eq!(hello.request_id, 1, "the Hello uses id 1");
        let Some(request::Kind::Hello(h)) = hello.kind else { panic!("{hello:?}") };
        assert_eq!((h.protocol_version, h.auth_token.as_deref()), (1, token));
        peer.send(&Response::new(1, response::Kind::HelloAck(proto::HelloAck { protocol_version: 1, server_version: "mock".into() })));
        peer
    }
}

fn stats_reply(id: u64, event_count: u64) -> Response {
    Response::new(id, response::Kind::Stats(proto::StatsResponse { event_count, ..Default::default() }))
}

fn one_event(position: u64) -> response::Kind {
    response::Kind::ReadEvents(proto::ReadEvents {
        events: vec![proto::SequencedEvent { position, event: Some(proto::Event { r#type: "E".into(), tags: vec![], payload: b"p".to_vec() }) }],
    })
}

fn run<T, F: std::future::Future<Output = T>>(body: impl FnOnce(&'static LocalExecutor<'static>) -> F) -> T {
    let ex: &'static LocalExecutor<'static> = Box::leak(Box::new(LocalExecutor::new()));
    let fut = body(ex);
    async_io::block_on(ex.run(future::or(fut, async {
        Timer::after(Duration::from_secs(60)).await;
        panic!("test timed out");
    })))
}

/// A scripted server on a loopback port: `script` runs on a thread of its own with the
/// connection's server end once it has answered the Hello (which must carry `token`).
fn mock_server<T: Send + 'static>(token: Option<&'static str>, script: impl FnOnce(Peer) -> T + Send + 'static) -> (SocketAddr, thread::JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, thread::spawn(move || script(Peer::handshake(&listener, token))))
}

async fn connect(addr: SocketAddr, config: AsyncClientConfig) -> (AsyncClient, Driver<Async<TcpStream>>) {
    let connector = move || async move { Async::<TcpStream>::connect(addr).await };
    AsyncClient::connect_with(connector, config).await.unwrap()
}

#[test]
fn a_thousand_requests_are_all_in_flight_and_answered_out_of_order() {
    let (addr, server) = mock_server(Some("tok"), |mut peer| {
        // Read all 1,000 before answering any: they must all be in flight at once.
        let ids: Vec<u64> = (0..1000)
            .map(|_| {
                let r = peer.recv().unwrap();
                assert!(matches!(r.kind, Some(request::Kind::Stats(_))), "{r:?}");
                r.request_id
            })
            .collect();
        for &id in ids.iter().rev() {
            // A stray frame for an id nobody asked for is ignored.
            if id % 100 == 0 {
                peer.send(&stats_reply(id + 1_000_000, 0));
            }
            peer.send(&stats_reply(id, id));
        }
        assert!(peer.recv().is_none(), "the client closes the socket when dropped");
        ids
    });
    let answers = run(|ex| async move {
        let cfg = AsyncClientConfig { auth_token: Some("tok".into()), bulk_connections: 0, ..Default::default() };
        let (client, driver) = connect(addr, cfg).await;
        assert_eq!(client.server_version(), "mock");
        let driver = ex.spawn(driver);
        let calls: Vec<_> = (0..1000).map(|_| ex.spawn(client.stats())).collect();
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await.unwrap().event_count);
        }
        drop(client);
        driver.await;
        answers
    });
    let mut ids = server.join().unwrap();
    ids.sort_unstable();
    assert_eq!(ids, (2..=1001).collect::<Vec<_>>(), "ids count up from 2, after the Hello's");
    let mut answers = answers;
    answers.sort_unstable();
    assert_eq!(answers, ids, "each caller got the answer to its own request");
}

#[test]
fn max_inflight_requests_bounds_each_socket() {
    let (addr, server) = mock_server(None, |mut peer| {
        let mut rounds = Vec::new();
        let mut answered = 0;
        while answered < 25 {
            let mut ids = Vec::new();
            while let Some(r) = peer.try_recv(Duration::from_millis(300)) {
                ids.push(r.request_id);
            }
            for &id in &ids {
                peer.send(&stats_reply(id, id));
            }
            answered += ids.len();
            rounds.push(ids.len());
        }
        rounds
    });
    run(|ex| async move {
        let cfg = AsyncClientConfig { max_inflight_requests: 10, bulk_connections: 0, ..Default::default() };
        let (client, driver) = connect(addr, cfg).await;
        ex.spawn(driver).detach();
        let calls: Vec<_> = (0..25).map(|_| ex.spawn(client.stats())).collect();
        for c in calls {
            c.await.unwrap();
        }
    });
    let rounds = server.join().unwrap();
    assert_eq!(rounds.iter().sum::<usize>(), 25);
    assert!(rounds.iter().all(|&n| n <= 10) && rounds.contains(&10), "{rounds:?}");
}

#[test]
fn dropping_a_stream_sends_a_cancel_and_late_frames_are_ignored() {
    let (addr, server) = mock_server(None, |mut peer| {
        let sub = peer.recv().unwrap();
        let Some(request::Kind::Subscribe(s)) = &sub.kind else { panic!("{sub:?}") };
        assert_eq!(s.after, 7);
        peer.send(&Response::new(sub.request_id, one_event(8)));
        peer.send(&Response::new(sub.request_id, response::Kind::CaughtUp(proto::SubscribeCaughtUp { watermark: 8 })));
        let cancel = peer.recv().unwrap();
        let Some(request::Kind::Cancel(c)) = cancel.kind else { panic!("{cancel:?}") };
        assert_eq!(c.target, sub.request_id);
        assert!(cancel.request_id > sub.request_id, "a cancel uses a fresh id");
        // Frames already queued for the subscription still arrive; the client drops them.
        peer.send(&Response::new(sub.request_id, one_event(9)));
        // A read dropped mid-stream is cancelled too.
        let read = peer.recv().unwrap();
        assert!(matches!(read.kind, Some(request::Kind::Read(_))), "{read:?}");
        peer.send(&Response::new(read.request_id, one_event(1)));
        let cancel = peer.recv().unwrap();
        assert!(matches!(cancel.kind, Some(request::Kind::Cancel(c)) if c.target == read.request_id), "{cancel:?}");
        // The socket keeps serving.
        let stats = peer.recv().unwrap();
        peer.send(&Response::new(read.request_id, response::Kind::ReadEnd(proto::ReadEnd { watermark: 1 })));
        peer.send(&stats_reply(stats.request_id, 42));
        // A finished read sends no cancel.
        let read = peer.recv().unwrap();
        peer.send(&Response::new(read.request_id, response::Kind::ReadEnd(proto::ReadEnd { watermark: 5 })));
        let next = peer.recv().unwrap();
        assert!(matches!(next.kind, Some(request::Kind::Stats(_))), "no cancel for a finished read: {next:?}");
        peer.send(&stats_reply(next.request_id, 43));
    });
    run(|ex| async move {
        let (client, driver) = connect(addr, AsyncClientConfig { bulk_connections: 0, ..Default::default() }).await;
        ex.spawn(driver).detach();
        let mut sub = client.subscribe(Query::all(), Position(7));
        assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::Event(e) if e.position == Position(8)));
        assert!(matches!(sub.next().await.unwrap().unwrap(), SubEvent::CaughtUp(Position(8))));
        drop(sub);
        let mut read = client.read(Query::all(), Position::ZERO, None);
        assert_eq!(read.next().await.unwrap().unwrap().position, Position(1));
        drop(read);
        assert_eq!(client.stats().await.unwrap().event_count, 42);
        let (events, wm) = client.read_all(Query::all(), Position::ZERO).await.unwrap();
        assert_eq!((events.len(), wm), (0, Position(5)));
        assert_eq!(client.stats().await.unwrap().event_count, 43);
    });
    server.join().unwrap();
}

#[test]
fn an_unattributed_error_fails_every_pending_request() {
    let (addr, server) = mock_server(None, |mut peer| {
        let mut seen = 0;
        while seen < 3 {
            peer.recv().unwrap();
            seen += 1;
        }
        peer.send(&Response::error(0, ErrorCode::BadRequest, "frame decode error: nope"));
        // Closing drops the connection.
    });
    run(|ex| async move {
        let (client, driver) = connect(addr, AsyncClientConfig { bulk_connections: 0, ..Default::default() }).await;
        let driver = ex.spawn(driver.into_connections().pop().unwrap());
        let a = ex.spawn(client.stats());
        let b = ex.spawn(client.append(Vec::new(), None));
        let mut sub = client.subscribe(Query::all(), Position::ZERO);
        let c = ex.spawn(async move { sub.next().await });
        for err in [a.await.unwrap_err(), b.await.unwrap_err(), c.await.unwrap().unwrap_err()] {
            match err {
                ClientError::Server { code, message, .. } => {
                    assert_eq!((code, message.as_str()), (ErrorCode::BadRequest, "frame decode error: nope"))
                }
                other => panic!("expected the id-0 error, got {other:?}"),
            }
        }
        assert!(driver.await.is_err());
        // Later calls fail at once with the same reason.
        let err = client.stats().await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    });
    server.join().unwrap();
}

#[test]
fn dropping_the_driver_fails_pending_requests() {
    let (addr, server) = mock_server(None, |mut peer| {
        peer.recv();
        let _ = peer.recv();
    });
    run(|ex| async move {
        let (client, driver) = connect(addr, AsyncClientConfig { bulk_connections: 0, ..Default::default() }).await;
        let driver = ex.spawn(driver);
        let pending = ex.spawn(client.stats());
        Timer::after(Duration::from_millis(100)).await;
        drop(driver); // cancels the task, dropping the driver future
        let err = pending.await.unwrap_err();
        assert!(matches!(err, ClientError::Protocol(ref m) if m.contains("driver")), "{err:?}");
        assert!(client.stats().await.is_err());
    });
    server.join().unwrap();
}
