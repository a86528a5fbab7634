// Conformance cases shared by `client_reference.rs` (the reference server) and
// `server_conformance.rs` (our server). The including file defines `server_binary()` and
// `SERVER_VERSION`.

use std::io;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::{RawConn, Server};
use tephra::client::{tls, Client, ClientError, SubEvent};
use tephra::proto::{self, convert, request, response, ErrorCode, FrameError, Request};
use tephra::{AppendCondition, Event, EventType, Position, Query, QueryItem, Tags};

fn start(env: &[(&str, &str)]) -> Option<Server> {
    let bin = server_binary()?;
    Some(Server::start(&bin, env))
}

fn start_with_config(env: &[(&str, &str)], toml: &str) -> Option<Server> {
    let bin = server_binary()?;
    Some(Server::start_with(&bin, env, Some(toml)))
}

use support::ev;

fn tag_query(tags: &[&str]) -> Query {
    Query::item(QueryItem::with_tags(Tags::new(tags.iter().copied()).unwrap()))
}

fn positions(events: &[tephra::client::SequencedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.position.get()).collect()
}

fn server_error(err: ClientError) -> (ErrorCode, String, bool, Option<Position>) {
    match err {
        ClientError::Server { code, message, retryable, conflict_position } => {
            (code, message, retryable, conflict_position)
        }
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[test]
fn append_read_and_stats_round_trip() {
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    assert_eq!(c.server_version(), SERVER_VERSION);

    let r = c.append(vec![ev("Registered", &["student:s1"], b"{\"n\":1}")], None).unwrap();
    assert_eq!((r.first, r.last), (Position(1), Position(1)));
    let r = c
        .append(
            vec![
                ev("Enrolled", &["student:s1", "course:c1"], b"{}"),
                ev("Enrolled", &["student:s2", "course:c1"], b""),
            ],
            None,
        )
        .unwrap();
    assert_eq!((r.first, r.last), (Position(2), Position(3)));

    let (all, wm) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(wm, Position(3));
    assert_eq!(positions(&all), [1, 2, 3]);
    assert_eq!(all[0].event, ev("Registered", &["student:s1"], b"{\"n\":1}"));
    assert_eq!(all[1].event.tags().collect::<Vec<_>>(), ["course:c1", "student:s1"]);
    assert_eq!(all[1].event.data(), b"{}");
    assert_eq!(all[2].event.data(), b"");

    // Tag query, type query, after cursor.
    let (s1, _) = c.read_all(tag_query(&["student:s1"]), Position::ZERO).unwrap();
    assert_eq!(positions(&s1), [1, 2]);
    let (enrolled, _) =
        c.read_all(Query::item(QueryItem::of_types(vec![EventType::new("Enrolled").unwrap()])), Position(2)).unwrap();
    assert_eq!(positions(&enrolled), [3]);
    let (none, wm) = c.read_all(Query::none(), Position::ZERO).unwrap();
    assert!(none.is_empty());
    assert_eq!(wm, Position(3));

    // Limit and pagination.
    let mut stream = c.read(Query::all(), Position::ZERO, Some(2)).unwrap();
    let page: Vec<_> = stream.by_ref().map(Result::unwrap).collect();
    assert_eq!(positions(&page), [1, 2]);
    assert_eq!(stream.watermark(), Some(Position(3)));
    drop(stream);
    let (page, _) = c.read(Query::all(), Position(2), Some(2)).unwrap().collect_all().unwrap();
    assert_eq!(positions(&page), [3]);
    let (zero, wm) = c.read(Query::all(), Position::ZERO, Some(0)).unwrap().collect_all().unwrap();
    assert!(zero.is_empty());
    assert_eq!(wm, Position(3));
    // Reads never fail on a cursor past the tip.
    let (past, _) = c.read_all(Query::all(), Position(1000)).unwrap();
    assert!(past.is_empty());

    // Backward.
    let (back, wm) = c.read_back(Query::all(), Position::MAX, None).unwrap().collect_all().unwrap();
    assert_eq!((positions(&back), wm), (vec![3, 2, 1], Position(3)));
    let (back, _) = c.read_back(Query::all(), Position::MAX, Some(1)).unwrap().collect_all().unwrap();
    assert_eq!(positions(&back), [3]);
    let (back, _) = c.read_all_back(Query::all(), Position(3)).unwrap();
    assert_eq!(positions(&back), [2, 1]);
    let (back, _) = c.read_all_back(Query::all(), Position::ZERO).unwrap();
    assert!(back.is_empty());

    let stats = c.stats().unwrap();
    assert_eq!(stats.event_count, 3);
    assert_eq!(stats.version, SERVER_VERSION);
    assert_eq!(stats.active_connections, 1);
    assert_eq!(stats.active_subscriptions, 0);
    assert_eq!(stats.segment_count, 1);
    assert!(stats.disk_bytes >= 16 * 1024 * 1024, "{stats:?}");
    assert_eq!(stats.max_connections, 1024);
}

#[test]
fn conditions_and_append_errors() {
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    let alice = tag_query(&["username:alice"]);

    // A uniqueness guard succeeds once ...
    let r =
        c.append(vec![ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice.clone()))).unwrap();
    assert_eq!(r.first, Position(1));
    // ... then fires as a durable, non-retryable CONFLICT at position 1.
    let err = c
        .append(vec![ev("Registered", &["username:alice"], b"")], Some(AppendCondition::new(alice.clone())))
        .unwrap_err();
    let (code, message, retryable, pos) = server_error(err);
    assert_eq!((code, retryable, pos), (ErrorCode::Conflict, false, Some(Position(1))));
    assert_eq!(message, convert::text::conflict(convert::ConflictClause::Boundary, Some(Position(1))));
    assert_eq!(message, "append condition conflict (Boundary, Durable(Position(1)))");
    // With the boundary moved past the match it passes.
    let r = c
        .append(
            vec![ev("Renamed", &["username:alice"], b"")],
            Some(AppendCondition::new(alice.clone()).after(Position(1))),
        )
        .unwrap();
    assert_eq!(r.first, Position(2));

    // Idempotency key: exists_only twice.
    let key = tag_query(&["cmd:order-42"]);
    let r = c
        .append(vec![ev("OrderPlaced", &["cmd:order-42"], b"x")], Some(AppendCondition::exists_only(key.clone())))
        .unwrap();
    assert_eq!(r.first, Position(3));
    let err = c
        .append(vec![ev("OrderPlaced", &["cmd:order-42"], b"x")], Some(AppendCondition::exists_only(key)))
        .unwrap_err();
    let (code, message, retryable, pos) = server_error(err);
    assert_eq!((code, retryable, pos), (ErrorCode::AlreadyExists, false, Some(Position(3))));
    assert_eq!(message, convert::text::conflict(convert::ConflictClause::Existence, Some(Position(3))));

    // `after` beyond the durable tip.
    let err =
        c.append(vec![ev("X", &[], b"")], Some(AppendCondition::new(Query::all()).after(Position(1000)))).unwrap_err();
    let (code, message, _, pos) = server_error(err);
    assert_eq!((code, pos), (ErrorCode::AfterBeyondTip, None));
    assert_eq!(message, convert::text::after_beyond_tip(Position(1000), Position(3)));

    // No events.
    let err = c.append(Vec::new(), None).unwrap_err();
    let (code, message, _, _) = server_error(err);
    assert_eq!((code, message.as_str()), (ErrorCode::Empty, convert::text::EMPTY_APPEND));

    // Failed appends consumed no positions, and the connection is fine.
    assert_eq!(c.append(vec![ev("Y", &[], b"")], None).unwrap().first, Position(4));
    assert_eq!(c.stats().unwrap().event_count, 4);
}

#[test]
fn dropping_a_read_early_keeps_the_connection_usable() {
    let Some(srv) = start(&[("TEPHRA__SERVER__READS__BATCH_EVENTS", "7")]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    let batch: Vec<Event> = (0..100).map(|i| ev("E", &[&format!("n:{i}")], &[i as u8; 100])).collect();
    c.append(batch, None).unwrap();
    {
        let mut s = c.read(Query::all(), Position::ZERO, None).unwrap();
        assert_eq!(s.next().unwrap().unwrap().position, Position(1));
        assert_eq!(s.watermark(), None);
    }
    assert_eq!(c.stats().unwrap().event_count, 100);
    let (all, wm) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!((all.len(), wm), (100, Position(100)));
    assert_eq!(positions(&all), (1..=100).collect::<Vec<_>>());
    assert_eq!(all[42].event.data(), &[42u8; 100]);
}

#[test]
fn subscribe_catches_up_streams_live_and_cancels() {
    let Some(srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.append(vec![ev("A", &["k:1"], b"1"), ev("B", &["k:2"], b"2")], None).unwrap();

    let (mut sub, cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
    let mut seen = Vec::new();
    loop {
        match sub.next().unwrap().unwrap() {
            SubEvent::Event(e) => seen.push(e.position.get()),
            SubEvent::CaughtUp(w) => {
                assert_eq!(w, Position(2));
                break;
            }
        }
    }
    assert_eq!(seen, [1, 2]);

    // A live event from another connection.
    let mut other = Client::connect(srv.addr).unwrap();
    other.append(vec![ev("C", &["k:3"], b"3")], None).unwrap();
    match sub.next().unwrap().unwrap() {
        SubEvent::Event(e) => {
            assert_eq!(e.position, Position(3));
            assert_eq!(e.event, ev("C", &["k:3"], b"3"));
        }
        other => panic!("expected the live event, got {other:?}"),
    }
    match sub.next().unwrap().unwrap() {
        SubEvent::CaughtUp(w) => assert_eq!(w, Position(3)),
        other => panic!("expected caught-up, got {other:?}"),
    }
    assert_eq!(other.stats().unwrap().active_subscriptions, 1);

    // Cancel from another thread while the stream is blocked waiting.
    let (tx, rx) = mpsc::channel();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        let at = Instant::now();
        cancel.cancel();
        tx.send(at).unwrap();
    });
    assert!(sub.next().is_none(), "a cancelled subscription ends");
    let cancelled_at = rx.recv().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(2));
    assert!(sub.next().is_none());
    drop(sub);
    canceller.join().unwrap();

    // The server stops the subscription, and the same connection keeps working.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = c.stats().unwrap().active_subscriptions;
        if n == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "subscription still active on the server");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.append(vec![ev("D", &[], b"")], None).unwrap().first, Position(4));
    let (all, _) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(positions(&all), [1, 2, 3, 4]);
}

#[test]
fn subscribe_with_a_filter_skips_the_prefix_and_survives_a_drop() {
    let Some(srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.append((0..8).map(|i| ev("E", &[if i % 2 == 0 { "even" } else { "odd" }], b"")).collect::<Vec<_>>(), None)
        .unwrap();
    let mut writer = Client::connect(srv.addr).unwrap();
    {
        let (mut sub, _cancel) = c.subscribe(tag_query(&["odd"]), Position(3)).unwrap();
        let mut got = Vec::new();
        for item in sub.by_ref() {
            match item.unwrap() {
                SubEvent::Event(e) => got.push(e.position.get()),
                SubEvent::CaughtUp(w) => {
                    // The cursor jumps to the tip even past non-matching events.
                    assert_eq!(w, Position(8));
                    break;
                }
            }
        }
        assert_eq!(got, [4, 6, 8]);
        // Frames may still be in flight for this subscription when it is dropped.
        writer.append(vec![ev("E", &["odd"], b"late")], None).unwrap();
        thread::sleep(Duration::from_millis(100));
    }
    // Late frames of the abandoned subscription are skipped.
    let r = c.append(vec![ev("E", &["odd"], b"")], None).unwrap();
    assert_eq!(r.first, Position(10));
    assert_eq!(c.stats().unwrap().event_count, 10);
}

#[test]
fn client_frame_cap_refuses_before_sending() {
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.set_max_frame_len(64);
    let err = c.append(vec![ev("Big", &[], &[0u8; 100])], None).unwrap_err();
    assert!(matches!(err, ClientError::Frame(FrameError::TooLong { max: 64, .. })), "{err:?}");
    // Nothing went out: the connection is aligned and the store is empty.
    assert_eq!(c.stats().unwrap().event_count, 0);
    // Responses over the cap are refused on their prefix.
    c.set_max_frame_len(proto::DEFAULT_MAX_FRAME_LEN);
    c.append(vec![ev("Big", &[], &[0u8; 100])], None).unwrap();
    c.set_max_frame_len(64);
    let err = c.read_all(Query::all(), Position::ZERO).unwrap_err();
    assert!(matches!(err, ClientError::Frame(FrameError::TooLong { max: 64, .. })), "{err:?}");
}

#[test]
fn server_frame_cap_gives_too_large_then_close() {
    let Some(srv) = start(&[("TEPHRA__SERVER__MAX_FRAME_LEN", "64")]) else { return };
    // Through the client: the id-0 error is taken as the answer, then the server closes.
    // (A close without the error frame is the reference's best-effort race; retry it.)
    let mut answered = false;
    for _ in 0..10 {
        let mut c = Client::connect(srv.addr).unwrap();
        match c.append(vec![ev("Big", &[], &[0u8; 100])], None) {
            Err(ClientError::Server { code, message, .. }) => {
                assert_eq!(code, ErrorCode::TooLarge);
                assert!(
                    message.starts_with("frame length ") && message.ends_with(" exceeds the maximum of 64"),
                    "{message}"
                );
                assert!(c.stats().is_err(), "the server closes after a frame-level error");
                answered = true;
                break;
            }
            Err(ClientError::UnexpectedEof) | Err(ClientError::Io(_)) => continue,
            other => panic!("expected TOO_LARGE, got {other:?}"),
        }
    }
    assert!(answered, "never received TOO_LARGE");

    // Raw: len == max is fine ...
    let mut raw = RawConn::connect_hello(srv.addr);
    let body = prost::Message::encode_to_vec(&Request::new(2, request::Kind::Stats(proto::StatsRequest {})));
    // Pad with an unknown length-delimited field (15) so the body is exactly 64 bytes.
    let pad = 64 - body.len();
    let mut exact = body.clone();
    exact.push(0x7a);
    exact.push((pad - 2) as u8);
    exact.extend(std::iter::repeat_n(b'x', pad - 2));
    assert_eq!(exact.len(), 64);
    let mut frame = (exact.len() as u32).to_be_bytes().to_vec();
    frame.extend(&exact);
    raw.send_bytes(&frame);
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 2);
    assert!(matches!(r.kind, Some(response::Kind::Stats(_))), "{r:?}");
    // ... and max + 1 is refused on the prefix alone, with id 0, then close.
    let e = support::frame_level_error(srv.addr, |raw| raw.send_bytes(&65u32.to_be_bytes()));
    assert_eq!((e.code(), e.message.as_str()), (ErrorCode::TooLarge, convert::text::frame_too_long(65, 64).as_str()));
    assert_eq!(Some(e), convert::frame_error_response(&FrameError::TooLong { len: 65, max: 64 }));
}

#[test]
fn oversized_prefix_at_the_default_cap() {
    let Some(srv) = start(&[]) else { return };
    let e = support::frame_level_error(srv.addr, |raw| raw.send_bytes(&u32::MAX.to_be_bytes()));
    assert_eq!(e.code(), ErrorCode::TooLarge);
    assert_eq!(e.message, format!("frame length {} exceeds the maximum of {}", u32::MAX, proto::DEFAULT_MAX_FRAME_LEN));
}

#[test]
fn hello_rules() {
    let Some(srv) = start(&[]) else { return };
    // A non-Hello first frame: UNAUTHENTICATED with the request's id, then close.
    let mut raw = RawConn::connect(srv.addr);
    raw.send(&Request::new(9, request::Kind::Stats(proto::StatsRequest {})));
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 9);
    let Some(response::Kind::Error(e)) = r.kind else { panic!("{r:?}") };
    assert_eq!((e.code(), e.message.as_str()), (ErrorCode::Unauthenticated, convert::text::FIRST_FRAME_NOT_HELLO));
    raw.expect_closed();

    // A zero-length first frame (an empty Request) is not a Hello either.
    let mut raw = RawConn::connect(srv.addr);
    raw.send_bytes(&[0, 0, 0, 0]);
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 0);
    let Some(response::Kind::Error(e)) = r.kind else { panic!("{r:?}") };
    assert_eq!(e.code(), ErrorCode::Unauthenticated);
    raw.expect_closed();

    // Wrong version: BAD_REQUEST, then close.
    for version in [2u32, 0] {
        let mut raw = RawConn::connect(srv.addr);
        raw.send(&Request::new(1, request::Kind::Hello(proto::Hello { protocol_version: version, auth_token: None })));
        let r = raw.recv().unwrap();
        assert_eq!(r.request_id, 1);
        let Some(response::Kind::Error(e)) = r.kind else { panic!("{r:?}") };
        assert_eq!((e.code(), e.message), (ErrorCode::BadRequest, convert::text::unsupported_version(version)));
        raw.expect_closed();
    }

    // An open server accepts any token; a second Hello is BAD_REQUEST and the connection stays.
    let mut raw = RawConn::connect(srv.addr);
    raw.send(&Request::hello(1, Some("whatever")));
    let r = raw.recv().unwrap();
    let Some(response::Kind::HelloAck(ack)) = r.kind else { panic!("{r:?}") };
    assert_eq!((ack.protocol_version, ack.server_version.as_str()), (1, SERVER_VERSION));
    raw.send(&Request::hello(2, None));
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 2);
    let Some(response::Kind::Error(e)) = r.kind else { panic!("{r:?}") };
    assert_eq!((e.code(), e.message.as_str()), (ErrorCode::BadRequest, convert::text::NO_KIND));
    raw.send(&Request { request_id: 3, kind: None });
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 3);
    assert!(matches!(r.kind, Some(response::Kind::Error(ref e)) if e.message == convert::text::NO_KIND), "{r:?}");
    raw.send(&Request::new(4, request::Kind::Stats(proto::StatsRequest {})));
    assert!(matches!(raw.recv().unwrap().kind, Some(response::Kind::Stats(_))));

    // Through the client: connect_with(token) against an open server works.
    let mut c = Client::connect_with(srv.addr, Some("ignored")).unwrap();
    assert_eq!(c.stats().unwrap().event_count, 0);
}

#[test]
fn validation_texts_match_our_conversions() {
    let Some(srv) = start(&[]) else { return };
    let mut raw = RawConn::connect_hello(srv.addr);
    let cases: Vec<proto::Event> = vec![
        proto::Event { r#type: String::new(), tags: vec!["a".into()], payload: vec![] },
        proto::Event { r#type: "E".into(), tags: vec!["k:1".into(), "a".into(), "k:1".into()], payload: vec![] },
        proto::Event {
            r#type: "E".into(),
            tags: vec!["z".into(), "z".into(), "b".into(), "b".into()],
            payload: vec![],
        },
        proto::Event { r#type: "E".into(), tags: vec!["d".into(), "d".into(), String::new()], payload: vec![] },
        proto::Event { r#type: "x".repeat(65_536), tags: vec![], payload: vec![] },
        proto::Event { r#type: "E".into(), tags: vec!["t".repeat(65_536)], payload: vec![] },
        proto::Event { r#type: "E".into(), tags: (0..65_536).map(|i| format!("t{i}")).collect(), payload: vec![] },
    ];
    for (i, event) in cases.into_iter().enumerate() {
        let id = 10 + i as u64;
        let ours = convert::event_from_proto(event.clone()).unwrap_err().to_string();
        raw.send(&Request::new(
            id,
            request::Kind::Append(proto::AppendRequest { events: vec![event], condition: None }),
        ));
        let r = raw.recv().unwrap();
        assert_eq!(r.request_id, id);
        let Some(response::Kind::Error(e)) = r.kind else { panic!("case {i}: {r:?}") };
        assert_eq!(e.code(), ErrorCode::BadRequest, "case {i}");
        assert_eq!(e.message, ours, "case {i}");
    }
    // An invalid condition, after valid events; and an invalid read query.
    let bad_query =
        proto::Query { all: false, items: vec![proto::QueryItem { types: vec![String::new()], tags: vec![] }] };
    let ours = convert::query_from_proto(bad_query.clone()).unwrap_err().to_string();
    assert_eq!(ours, "invalid name: event type must not be empty");
    let cond = proto::AppendCondition { fail_if_events_match: Some(bad_query.clone()), after: 0, fail_if_exists: None };
    let good = proto::Event { r#type: "E".into(), tags: vec![], payload: vec![] };
    raw.send(&Request::new(
        30,
        request::Kind::Append(proto::AppendRequest { events: vec![good], condition: Some(cond) }),
    ));
    let r = raw.recv().unwrap();
    assert!(
        matches!(r.kind, Some(response::Kind::Error(ref e)) if e.message == ours && e.code() == ErrorCode::BadRequest),
        "{r:?}"
    );
    raw.send(&Request::new(
        31,
        request::Kind::Read(proto::ReadRequest { query: Some(bad_query), ..Default::default() }),
    ));
    let r = raw.recv().unwrap();
    assert_eq!(r.request_id, 31);
    assert!(matches!(r.kind, Some(response::Kind::Error(ref e)) if e.message == ours), "{r:?}");
    // Empty batch with a valid condition: EMPTY.
    raw.send(&Request::new(32, request::Kind::Append(proto::AppendRequest::default())));
    let r = raw.recv().unwrap();
    assert_eq!(r.kind, Some(response::Kind::Error(convert::empty_append_error())));
    // Nothing was stored; an absent read query matches nothing but still gets a ReadEnd.
    raw.send(&Request::new(33, request::Kind::Read(proto::ReadRequest::default())));
    let r = raw.recv().unwrap();
    assert_eq!(r, proto::Response::new(33, response::Kind::ReadEnd(proto::ReadEnd { watermark: 0 })));
}

#[test]
fn undecodable_frames_are_a_frame_level_bad_request() {
    let Some(srv) = start(&[]) else { return };
    let bodies: [&[u8]; 3] = [
        // Request{id 2, append{events[{type: 0xff}]}}: invalid UTF-8 in a string field.
        &[0x08, 0x02, 0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xff],
        // A length-delimited field running past the end.
        &[0x08, 0x02, 0x12, 0x05, 0x0a],
        // A truncated varint key.
        &[0xff],
    ];
    for body in bodies {
        let err = <Request as prost::Message>::decode(body).unwrap_err();
        let ours = convert::frame_error_response(&FrameError::Decode(err)).unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        let e = support::frame_level_error(srv.addr, |raw| raw.send_bytes(&frame));
        assert_eq!(e.message, convert::text::FRAME_DECODE);
        assert_eq!(e, ours, "body {body:02x?}");
    }
}

/// A field the schema knows sent with another wire type is an unknown field to the reference's
/// parser (upb): `Request{id 5, field 2 as the varint 7}` is request 5 with no kind, answered
/// BAD_REQUEST on its id, and the connection goes on.
#[test]
fn a_known_field_with_another_wire_type_is_skipped_not_a_frame_error() {
    let Some(srv) = start(&[]) else { return };
    let mut raw = support::RawConn::connect_hello(srv.addr);
    let framed = |body: &[u8]| {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    };
    let bodies: [&[u8]; 2] = [
        // Field 2 (append) as a varint.
        &[0x08, 0x05, 0x10, 0x07],
        // Field 3 (read) as a 32-bit value.
        &[0x08, 0x05, 0x1d, 0x01, 0x02, 0x03, 0x04],
    ];
    for body in bodies {
        raw.send_bytes(&framed(body));
        let r = raw.recv().unwrap_or_else(|| panic!("closed after {body:02x?}"));
        assert_eq!(r.request_id, 5, "{r:?}");
        let Some(tephra::proto::response::Kind::Error(e)) = r.kind else { panic!("{r:?}") };
        assert_eq!(e.code, tephra::proto::ErrorCode::BadRequest as i32, "{e:?}");
        assert_eq!(e.message, convert::text::NO_KIND);
    }
    raw.send(&Request::new(6, tephra::proto::request::Kind::Stats(tephra::proto::StatsRequest {})));
    let r = raw.recv().expect("the connection stays open");
    assert_eq!(r.request_id, 6);
    assert!(matches!(r.kind, Some(tephra::proto::response::Kind::Stats(_))), "{r:?}");
    // Inside the kind too: an append whose condition's query (field 1) is the varint 1 is an
    // append without that query, so it is stored.
    raw.send_bytes(&framed(&[0x08, 0x07, 0x12, 0x09, 0x0a, 0x03, 0x0a, 0x01, b'E', 0x12, 0x02, 0x08, 0x01]));
    let r = raw.recv().expect("the connection stays open");
    assert_eq!(r.request_id, 7);
    assert!(matches!(r.kind, Some(tephra::proto::response::Kind::Append(_))), "{r:?}");
    // A read whose query's `all` (field 1) is length-delimited: a query of nothing, so the
    // read ends at once.
    raw.send_bytes(&framed(&[0x08, 0x08, 0x1a, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0x01]));
    let r = raw.recv().expect("the connection stays open");
    assert_eq!(r.request_id, 8);
    assert!(matches!(r.kind, Some(tephra::proto::response::Kind::ReadEnd(_))), "{r:?}");
}

/// A varint whose tenth byte sets bits past 64 keeps its low 64 bits, as the reference's parser
/// (upb) reads it, instead of failing the frame: request id `ff x9 7f` is u64::MAX.
#[test]
fn varints_with_bits_past_64_keep_their_low_bits() {
    let Some(srv) = start(&[]) else { return };
    let mut raw = support::RawConn::connect_hello(srv.addr);
    let body: &[u8] = &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x32, 0x00];
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    raw.send_bytes(&frame);
    let r = raw.recv().expect("the connection stays open");
    assert_eq!(r.request_id, u64::MAX, "{r:?}");
    assert!(matches!(r.kind, Some(tephra::proto::response::Kind::Stats(_))), "{r:?}");
}

#[test]
fn raw_stream_uses_the_documented_layout() {
    let Some(srv) = start(&[]) else { return };
    let mut raw = RawConn::connect(srv.addr);
    // The exact Hello frame of docs/protocol.md §5, and the exact HelloAck body.
    raw.send_bytes(&[0x00, 0x00, 0x00, 0x06, 0x08, 0x01, 0x3a, 0x02, 0x08, 0x01]);
    let body = raw.dec.read_next(&mut raw.stream).unwrap().unwrap().to_vec();
    let mut want = vec![0x08, 0x01, 0x42, 0x09, 0x08, 0x01, 0x12, 0x05];
    want[7] = SERVER_VERSION.len() as u8;
    want[3] = 4 + SERVER_VERSION.len() as u8;
    want.extend_from_slice(SERVER_VERSION.as_bytes());
    assert_eq!(body, want);
    // The exact Append frame (id 5) on a store of 6 events gives the exact AppendResponse.
    for i in 0..6u64 {
        raw.send(&Request::new(
            100 + i,
            request::Kind::Append(proto::AppendRequest {
                events: vec![proto::Event { r#type: "F".into(), tags: vec![], payload: vec![] }],
                condition: None,
            }),
        ));
        raw.recv().unwrap();
    }
    raw.send_bytes(&[
        0x00, 0x00, 0x00, 0x11, 0x08, 0x05, 0x12, 0x0d, 0x0a, 0x0b, 0x0a, 0x01, 0x45, 0x12, 0x03, 0x6b, 0x3a, 0x31,
        0x1a, 0x01, 0x70,
    ]);
    let body = raw.dec.read_next(&mut raw.stream).unwrap().unwrap().to_vec();
    assert_eq!(body, [0x08, 0x05, 0x12, 0x04, 0x08, 0x07, 0x10, 0x07]);
    // ReadEnd (id 12, watermark 7) for a read of nothing.
    raw.send(&Request::new(
        12,
        request::Kind::Read(proto::ReadRequest { query: Some(proto::Query::default()), ..Default::default() }),
    ));
    let body = raw.dec.read_next(&mut raw.stream).unwrap().unwrap().to_vec();
    assert_eq!(body, [0x08, 0x0c, 0x22, 0x02, 0x08, 0x07]);
    // SubscribeCaughtUp (id 17, watermark 7) for a subscription at the tip.
    raw.send(&Request::new(
        17,
        request::Kind::Subscribe(proto::SubscribeRequest { query: Some(proto::Query::default()), after: 0 }),
    ));
    let body = raw.dec.read_next(&mut raw.stream).unwrap().unwrap().to_vec();
    assert_eq!(body, [0x08, 0x11, 0x32, 0x02, 0x08, 0x07]);
    raw.send(&Request::new(18, request::Kind::Cancel(proto::CancelRequest { target: 17 })));
    // Our ReadEvents encoder produces exactly what the server sends for the same event.
    raw.send(&Request::new(
        19,
        request::Kind::Read(proto::ReadRequest {
            query: Some(proto::Query { all: true, items: vec![] }),
            after: 6,
            ..Default::default()
        }),
    ));
    let body = raw.dec.read_next(&mut raw.stream).unwrap().unwrap().to_vec();
    let e = ev("E", &["k:1"], b"p");
    let mut enc = proto::ReadEventsEncoder::new();
    enc.push(Position(7), &e.as_ref());
    assert_eq!(&enc.finish(19, u32::MAX).unwrap()[4..], &body[..]);
}

#[test]
fn max_connections_refusal_fails_the_connect() {
    let Some(srv) = start(&[("TEPHRA__SERVER__LIMITS__MAX_CONNECTIONS", "1")]) else { return };
    let mut first = Client::connect(srv.addr).unwrap();
    let err = Client::connect(srv.addr).unwrap_err();
    assert!(
        matches!(err.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe),
        "{err:?}"
    );
    let stats = first.stats().unwrap();
    assert_eq!((stats.connections_refused, stats.max_connections), (1, 1));
}

#[test]
fn tokens_authenticate_and_refusals_are_permission_denied() {
    let Some(srv) = start_with_config(&[], support::AUTH_TOML) else { return };
    for token in ["s3cret", "next"] {
        let mut c = Client::connect_with(srv.addr, Some(token)).unwrap();
        assert_eq!(c.stats().unwrap().event_count, 0);
    }
    for token in [Some("nope"), Some(""), None] {
        let err = Client::connect_with(srv.addr, token).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "token {token:?}: {err}");
        assert!(err.to_string().contains(convert::text::BAD_TOKEN), "{err}");
    }
}

#[test]
fn tls_round_trip_subscribe_and_tokens() {
    let Some(bin) = server_binary() else { return };
    let (toml, cert, _certs) = support::tls_config_with_tokens(&["s3cret"]);
    let srv = Server::start_with(&bin, &[support::FAST_WAIT_TICK], Some(&toml));
    let config = tls::config_with_custom_ca(&cert).unwrap();

    let err = Client::connect_tls_with(srv.addr, "localhost", config.clone(), Some("bad")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(Client::connect_with(srv.addr, Some("s3cret")).is_err(), "plaintext against a TLS port fails");
    assert!(
        Client::connect_tls_with(srv.addr, "not-localhost", config.clone(), Some("s3cret")).is_err(),
        "name mismatch fails"
    );

    let mut c = Client::connect_tls_with(srv.addr, "localhost", config.clone(), Some("s3cret")).unwrap();
    assert_eq!(c.server_version(), SERVER_VERSION);
    // Big enough to span many TLS records and several ReadEvents frames.
    let batch: Vec<Event> = (0..64).map(|i| ev("Big", &[&format!("i:{i}")], &vec![i as u8; 16 * 1024])).collect();
    assert_eq!(c.append(batch, None).unwrap().last, Position(64));
    let (all, wm) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!((all.len(), wm), (64, Position(64)));
    assert!(all.iter().enumerate().all(|(i, e)| e.event.data() == vec![i as u8; 16 * 1024].as_slice()));

    let (mut sub, cancel) = c.subscribe(tag_query(&["i:63"]), Position::ZERO).unwrap();
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::Event(e) if e.position == Position(64)));
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::CaughtUp(Position(64))));
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        cancel.cancel();
    });
    assert!(sub.next().is_none());
    drop(sub);
    t.join().unwrap();
    assert_eq!(c.stats().unwrap().event_count, 64);
}

#[test]
fn tls_config_helpers_report_bad_inputs() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    assert_eq!(tls::config_with_custom_ca(&empty).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(
        tls::config_with_custom_ca(&dir.path().join("missing.pem")).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let (cert, _) = support::self_signed(dir.path());
    assert!(tls::config_with_custom_ca(&cert).is_ok());
    // The platform store may legitimately be empty in a container; either outcome is typed.
    match tls::config_with_native_roots() {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}"),
    }
}

#[test]
fn a_client_timeout_is_reported_and_the_subscription_resumes() {
    let Some(srv) = start(&[support::FAST_WAIT_TICK]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.set_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut writer = Client::connect(srv.addr).unwrap();
    let (mut sub, _cancel) = c.subscribe(Query::all(), Position::ZERO).unwrap();
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::CaughtUp(Position::ZERO)));
    let started = Instant::now();
    match sub.next() {
        Some(Err(ClientError::Io(e))) => {
            assert!(matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock), "{e}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(250));
    writer.append(vec![ev("Late", &[], b"")], None).unwrap();
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::Event(e) if e.position == Position(1)));
    assert!(matches!(sub.next().unwrap().unwrap(), SubEvent::CaughtUp(Position(1))));
}

/// Dropping a read stream before its end cancels the read: the connection goes on at once
/// with the next call, the late frames of the dropped read are skipped, and answers stay right.
#[test]
fn dropping_a_long_read_cancels_it_and_the_connection_goes_on() {
    let Some(srv) = start(&[("TEPHRA__SERVER__READS__BATCH_EVENTS", "16")]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    for b in 0..20 {
        c.append((0..1000).map(|i| ev("Bulk", &[&format!("n:{}", b * 1000 + i)], &[1u8; 100])).collect::<Vec<_>>(), None).unwrap();
    }
    for round in 0..3 {
        let mut r = c.read(Query::all(), Position::ZERO, None).unwrap();
        let first: Vec<u64> = r.by_ref().take(5).map(|e| e.unwrap().position.get()).collect();
        assert_eq!(first, [1, 2, 3, 4, 5]);
        drop(r);
        let a = c.append(vec![ev("After", &[], b"")], None).unwrap();
        assert_eq!(a.first.get(), 20_001 + round);
        let (tail, _) = c.read_all(Query::item(QueryItem::new(vec![EventType::new("After").unwrap()], Tags::empty())), Position(20_000)).unwrap();
        assert_eq!(tail.len() as u64, round + 1);
    }
    assert_eq!(c.stats().unwrap().event_count, 20_003);
}

/// Events per `ReadEvents` frame of stream `id` on `raw`, up to its terminator (`ReadEnd`,
/// or the first `SubscribeCaughtUp`).
fn frame_sizes(raw: &mut RawConn, id: u64) -> Vec<usize> {
    let mut sizes = Vec::new();
    loop {
        let r = raw.recv().expect("a frame");
        assert_eq!(r.request_id, id);
        match r.kind {
            Some(response::Kind::ReadEvents(b)) => sizes.push(b.events.len()),
            Some(response::Kind::ReadEnd(_)) | Some(response::Kind::CaughtUp(_)) => return sizes,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A streamed batch is sent once its events reach `batch_bytes` by the engine's encoded size
/// (type, tags, payload and their lengths), not by their protobuf size (docs/protocol.md §9; review:
/// ours cut 600-byte events at 837 per frame where the reference cuts at 851).
#[test]
fn batches_are_cut_by_the_engines_encoded_size() {
    // 4 + 2 (lengths) + 4 ("Type") + 5 ("tag-1") + 600 = 615 bytes each: 853 reach 512 KiB.
    let Some(srv) = start(&[]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    for _ in 0..4 {
        c.append((0..500).map(|_| ev("Type", &["tag-1"], &[b'x'; 600])), None).unwrap();
    }
    let mut raw = RawConn::connect_hello(srv.addr);
    let all = || Some(proto::Query { all: true, items: vec![] });
    raw.send(&Request::new(2, request::Kind::Read(proto::ReadRequest { query: all(), ..Default::default() })));
    assert_eq!(frame_sizes(&mut raw, 2), [853, 853, 294]);
    // A subscription frames each poll of up to 1024 events the same way (review: ours sent
    // 512-event frames, cut where its scan step paused).
    raw.send(&Request::new(3, request::Kind::Subscribe(proto::SubscribeRequest { query: all(), after: 0 })));
    assert_eq!(frame_sizes(&mut raw, 3), [853, 171, 853, 123]);

    // Small thresholds: 30-byte events (4 + 2 + 1 + 3 + 20) fill 64 bytes at the third.
    let Some(srv) = start(&[("TEPHRA__SERVER__READS__BATCH_EVENTS", "7"), ("TEPHRA__SERVER__READS__BATCH_BYTES", "64")]) else { return };
    let mut c = Client::connect(srv.addr).unwrap();
    c.append((0..10).map(|_| ev("A", &["k:1"], &[b'y'; 20])), None).unwrap();
    let mut raw = RawConn::connect_hello(srv.addr);
    raw.send(&Request::new(2, request::Kind::Read(proto::ReadRequest { query: all(), ..Default::default() })));
    assert_eq!(frame_sizes(&mut raw, 2), [3, 3, 3, 1]);
    raw.send(&Request::new(3, request::Kind::Read(proto::ReadRequest { query: all(), after: u64::MAX, reverse: true, limit: Some(8) })));
    assert_eq!(frame_sizes(&mut raw, 3), [3, 3, 2]);
    raw.send(&Request::new(4, request::Kind::Subscribe(proto::SubscribeRequest { query: all(), after: 0 })));
    assert_eq!(frame_sizes(&mut raw, 4), [3, 3, 3, 1]);

    // Thresholds of 0, which the reference starts with (ours refused them): one event a frame.
    for (events, bytes) in [("0", "1048576"), ("1024", "0")] {
        let Some(srv) = start(&[("TEPHRA__SERVER__READS__BATCH_EVENTS", events), ("TEPHRA__SERVER__READS__BATCH_BYTES", bytes), ("TEPHRA__READ__SCAN_BIAS", "0")]) else { return };
        let mut c = Client::connect(srv.addr).unwrap();
        c.append((0..4).map(|i| ev("A", &[&format!("k:{i}")], b"z")), None).unwrap();
        let mut raw = RawConn::connect_hello(srv.addr);
        raw.send(&Request::new(2, request::Kind::Read(proto::ReadRequest { query: all(), ..Default::default() })));
        assert_eq!(frame_sizes(&mut raw, 2), [1, 1, 1, 1], "batch_events {events}, batch_bytes {bytes}");
        // A selective read, planned with scan_bias 0 (always the index).
        let one = Some(proto::Query { all: false, items: vec![proto::QueryItem { types: vec![], tags: vec!["k:2".into()] }] });
        raw.send(&Request::new(3, request::Kind::Read(proto::ReadRequest { query: one, ..Default::default() })));
        assert_eq!(frame_sizes(&mut raw, 3), [1]);
    }
}

/// A condition that matches both a durable event and one staged earlier in the same group
/// commit is answered as a same-batch conflict (retryable, no position): the staged events are
/// checked first (docs/architecture.md §4.3; review: ours answered the durable position, terminal,
/// where the reference said retryable). Whether two pipelined appends share a group commit
/// depends on timing, so rounds repeat until one does; every answer must be well formed.
#[test]
fn a_condition_matching_staged_and_durable_events_is_a_same_batch_conflict() {
    let Some(srv) = start(&[]) else { return };
    let mut raw = RawConn::connect_hello(srv.addr);
    let event = |ty: &str| proto::Event { r#type: ty.into(), tags: vec!["order-7".into()], payload: b"x".to_vec() };
    let guard = proto::AppendCondition { fail_if_events_match: Some(proto::Query { all: false, items: vec![proto::QueryItem { types: vec![], tags: vec!["order-7".into()] }] }), after: 0, fail_if_exists: None };
    raw.send(&Request::new(1, request::Kind::Append(proto::AppendRequest { events: vec![event("Placed")], condition: None })));
    assert!(matches!(raw.recv().unwrap().kind, Some(response::Kind::Append(_))));
    let mut same_batch = 0;
    for round in 0..200u64 {
        // Both in one write: an unconditional append, then one guarded by the same tag.
        let (a, b) = (10 + 2 * round, 11 + 2 * round);
        let mut burst = Vec::new();
        for msg in [
            Request::new(a, request::Kind::Append(proto::AppendRequest { events: vec![event("Paid")], condition: None })),
            Request::new(b, request::Kind::Append(proto::AppendRequest { events: vec![event("Shipped")], condition: Some(guard.clone()) })),
        ] {
            proto::encode_frame(&msg, u32::MAX, &mut burst).unwrap();
        }
        raw.send_bytes(&burst);
        for _ in 0..2 {
            let r = raw.recv().unwrap();
            match (r.request_id, r.kind) {
                (id, Some(response::Kind::Append(_))) if id == a => {}
                (id, Some(response::Kind::Error(e))) if id == b => {
                    assert_eq!(e.code(), ErrorCode::Conflict, "{e:?}");
                    if e.retryable {
                        assert_eq!(e.conflict_position, None, "{e:?}");
                        assert_eq!(e.message, "append condition conflict (Boundary, SameBatch)");
                        same_batch += 1;
                    } else {
                        // Judged in a later group commit than the first append: its lowest
                        // durable match, the first event.
                        assert_eq!(e.conflict_position, Some(1), "{e:?}");
                        assert_eq!(e.message, "append condition conflict (Boundary, Durable(Position(1)))");
                    }
                }
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        if same_batch >= 3 {
            return;
        }
    }
    panic!("in 200 rounds only {same_batch} guarded appends shared a group commit with the append before them");
}
