//! Byte-layout locks for protocol v1 (docs/protocol.md §4-§5).
//!
//! Every live byte example from the spec is here, encoded *and* decoded. If one of these
//! fails, the wire format changed: fix the code, never the expected bytes.

use prost::Message;
use tephra::proto::{
    encode_frame, request, response, AppendCondition, AppendRequest, AppendResponse, CancelRequest, ErrorCode, ErrorResponse, Event, FrameDecoder, Hello,
    HelloAck, Query, QueryItem, ReadEnd, ReadEvents, ReadRequest, Request, Response, SequencedEvent, StatsRequest, StatsResponse, SubscribeCaughtUp,
    SubscribeRequest, DEFAULT_MAX_FRAME_LEN,
};

fn frame_of<M: Message>(m: &M) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(m, DEFAULT_MAX_FRAME_LEN, &mut out).unwrap();
    out
}

/// Encodes `msg`, compares with `bytes`, and decodes `bytes` back to `msg`.
fn lock<M: Message + Default + PartialEq>(msg: &M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(&M::decode(bytes).unwrap(), msg, "decoding of {bytes:02x?}");
}

#[test]
fn hello_frame() {
    let hello = Request::hello(1, None);
    assert_eq!(frame_of(&hello), [0x00, 0x00, 0x00, 0x06, 0x08, 0x01, 0x3a, 0x02, 0x08, 0x01]);
    lock(&hello, &[0x08, 0x01, 0x3a, 0x02, 0x08, 0x01]);
}

#[test]
fn hello_with_a_token_and_an_empty_token() {
    lock(&Request::hello(1, Some("s3cret")), &[0x08, 0x01, 0x3a, 0x0a, 0x08, 0x01, 0x12, 0x06, b's', b'3', b'c', b'r', b'e', b't']);
    // proto3 `optional`: an empty token is still sent (and the server rejects it).
    lock(&Request::hello(1, Some("")), &[0x08, 0x01, 0x3a, 0x04, 0x08, 0x01, 0x12, 0x00]);
    // Wrong or absent version: absent is just 0.
    let v0 = Request::new(1, request::Kind::Hello(Hello { protocol_version: 0, auth_token: None }));
    lock(&v0, &[0x08, 0x01, 0x3a, 0x00]);
}

#[test]
fn hello_ack_body() {
    let ack = Response::new(1, response::Kind::HelloAck(HelloAck { protocol_version: 1, server_version: "0.4.4".into() }));
    let mut want = vec![0x08, 0x01, 0x42, 0x09, 0x08, 0x01, 0x12, 0x05];
    want.extend_from_slice(b"0.4.4");
    lock(&ack, &want);
}

#[test]
fn append_frame_id_5() {
    let req = Request::new(
        5,
        request::Kind::Append(AppendRequest { events: vec![Event { r#type: "E".into(), tags: vec!["k:1".into()], payload: b"p".to_vec() }], condition: None }),
    );
    let want = [0x00, 0x00, 0x00, 0x11, 0x08, 0x05, 0x12, 0x0d, 0x0a, 0x0b, 0x0a, 0x01, 0x45, 0x12, 0x03, 0x6b, 0x3a, 0x31, 0x1a, 0x01, 0x70];
    assert_eq!(frame_of(&req), want);
    lock(&req, &want[4..]);
}

#[test]
fn append_response_read_end_caught_up() {
    lock(&Response::new(5, response::Kind::Append(AppendResponse { first: 7, last: 7 })), &[0x08, 0x05, 0x12, 0x04, 0x08, 0x07, 0x10, 0x07]);
    lock(&Response::new(12, response::Kind::ReadEnd(ReadEnd { watermark: 7 })), &[0x08, 0x0c, 0x22, 0x02, 0x08, 0x07]);
    lock(&Response::new(17, response::Kind::CaughtUp(SubscribeCaughtUp { watermark: 7 })), &[0x08, 0x11, 0x32, 0x02, 0x08, 0x07]);
    // A watermark of 0 (empty store) is a present message with no fields.
    lock(&Response::new(17, response::Kind::CaughtUp(SubscribeCaughtUp { watermark: 0 })), &[0x08, 0x11, 0x32, 0x00]);
}

#[test]
fn id_zero_response_omits_field_1() {
    // The spec's example is the frame-level decode error.
    let message = tephra::proto::convert::text::FRAME_DECODE;
    assert_eq!(message.len(), 0x41);
    let resp = Response::error(0, ErrorCode::BadRequest, message);
    let bytes = resp.encode_to_vec();
    assert_eq!(&bytes[..6], &[0x2a, 0x45, 0x08, 0x05, 0x12, 0x41]);
    assert_eq!(&bytes[6..], message.as_bytes());
    lock(&resp, &bytes);
}

#[test]
fn stats_request_is_32_00() {
    lock(&Request::new(0, request::Kind::Stats(StatsRequest {})), &[0x32, 0x00]);
    lock(&Request::new(2, request::Kind::Stats(StatsRequest {})), &[0x08, 0x02, 0x32, 0x00]);
}

#[test]
fn u64_max_is_a_ten_byte_varint() {
    let back = ReadRequest { query: None, after: u64::MAX, limit: None, reverse: true };
    lock(&back, &[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20, 0x01]);
    lock(
        &Request::new(u64::MAX, request::Kind::Cancel(CancelRequest { target: 1 })),
        &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x2a, 0x02, 0x08, 0x01],
    );
}

#[test]
fn optional_scalars_are_sent_when_zero_and_plain_ones_are_not() {
    // limit: present 0 is sent; absent is not.
    lock(&ReadRequest { query: Some(Query { all: true, items: vec![] }), after: 0, limit: Some(0), reverse: false }, &[0x0a, 0x02, 0x08, 0x01, 0x18, 0x00]);
    lock(&ReadRequest { query: Some(Query::default()), after: 3, limit: None, reverse: false }, &[0x0a, 0x00, 0x10, 0x03]);
    // conflict_position: present 0 is sent; retryable false is not.
    lock(&ErrorResponse { code: ErrorCode::Conflict as i32, message: String::new(), conflict_position: Some(0), retryable: false }, &[0x08, 0x01, 0x18, 0x00]);
    lock(&ErrorResponse { code: 0, message: String::new(), conflict_position: None, retryable: true }, &[0x20, 0x01]);
    // An event without payload omits field 3.
    lock(&Event { r#type: "A".into(), tags: vec![], payload: vec![] }, &[0x0a, 0x01, b'A']);
}

#[test]
fn conditions_queries_and_subscriptions() {
    let cond = AppendCondition {
        fail_if_events_match: Some(Query { all: false, items: vec![QueryItem { types: vec!["T".into()], tags: vec!["a".into(), "b".into()] }] }),
        after: 7,
        fail_if_exists: Some(Query::default()),
    };
    lock(&cond, &[0x0a, 0x0b, 0x12, 0x09, 0x0a, 0x01, b'T', 0x12, 0x01, b'a', 0x12, 0x01, b'b', 0x10, 0x07, 0x1a, 0x00]);
    lock(&AppendRequest { events: vec![], condition: Some(AppendCondition::default()) }, &[0x12, 0x00]);
    lock(&SubscribeRequest { query: Some(Query { all: true, items: vec![] }), after: 2 }, &[0x0a, 0x02, 0x08, 0x01, 0x10, 0x02]);
}

#[test]
fn read_events_and_stats_layout() {
    let ev = ReadEvents {
        events: vec![SequencedEvent { position: 1, event: Some(Event { r#type: "E".into(), tags: vec!["k:1".into()], payload: b"p".to_vec() }) }],
    };
    lock(
        &Response::new(3, response::Kind::ReadEvents(ev)),
        &[0x08, 0x03, 0x1a, 0x11, 0x0a, 0x0f, 0x08, 0x01, 0x12, 0x0b, 0x0a, 0x01, 0x45, 0x12, 0x03, 0x6b, 0x3a, 0x31, 0x1a, 0x01, 0x70],
    );
    let stats = StatsResponse {
        event_count: 1,
        segment_count: 2,
        disk_bytes: 3,
        uptime_seconds: 4,
        active_connections: 5,
        active_subscriptions: 6,
        version: "v".into(),
        connections_refused: 8,
        max_connections: 9,
        connections_reaped: 10,
        writer_stopped: String::new(),
    };
    // Our field 11 empty: not encoded, the reference's bytes exactly.
    lock(&stats, &[0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28, 0x05, 0x30, 0x06, 0x3a, 0x01, b'v', 0x40, 0x08, 0x48, 0x09, 0x50, 0x0a]);
    // Set (a fail-stopped writer): field 11, length-delimited, after the reference's ten.
    let stopped = StatsResponse { writer_stopped: "x".into(), ..stats };
    lock(
        &stopped,
        &[0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x20, 0x04, 0x28, 0x05, 0x30, 0x06, 0x3a, 0x01, b'v', 0x40, 0x08, 0x48, 0x09, 0x50, 0x0a, 0x5a, 0x01, b'x'],
    );
}

#[test]
fn decoding_is_lenient_where_proto3_is() {
    // Unknown fields (varint field 15, length-delimited field 16) are skipped.
    let r = Response::decode(&[0x78, 0x05, 0x82, 0x01, 0x01, 0xff, 0x08, 0x0c, 0x22, 0x02, 0x08, 0x07][..]).unwrap();
    assert_eq!(r, Response::new(12, response::Kind::ReadEnd(ReadEnd { watermark: 7 })));
    // Fields in any order; the last value of a scalar wins.
    let r = Request::decode(&[0x32, 0x00, 0x08, 0x01, 0x08, 0x09][..]).unwrap();
    assert_eq!(r, Request::new(9, request::Kind::Stats(StatsRequest {})));
    // An unknown error code keeps its raw value and reads as Unspecified.
    let e = ErrorResponse::decode(&[0x08, 0x63][..]).unwrap();
    assert_eq!((e.code, e.code(), ErrorCode::from_wire(e.code)), (99, ErrorCode::Unspecified, ErrorCode::Unspecified));
    assert_eq!(ErrorCode::from_wire(9), ErrorCode::AlreadyExists);
}

#[test]
fn invalid_utf8_in_a_string_field_fails_the_decode() {
    // Request{id 1, append{events[{type: ff}]}}
    let body = [0x08, 0x01, 0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xff];
    assert!(Request::decode(&body[..]).is_err());
    // The same through the frame decoder gives a Decode error that maps to BAD_REQUEST.
    let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    dec.feed(&(body.len() as u32).to_be_bytes());
    dec.feed(&body);
    let err = dec.next_message::<Request>().unwrap_err();
    let resp = tephra::proto::convert::frame_error_response(&err).unwrap();
    assert_eq!(resp.code(), ErrorCode::BadRequest);
    assert_eq!(resp.message, tephra::proto::convert::text::FRAME_DECODE);
    assert!(err.to_string().starts_with("frame decode error: "), "{err}");
    // Invalid UTF-8 in a bytes field is fine.
    let ok = Event::decode(&[0x0a, 0x01, b'A', 0x1a, 0x01, 0xff][..]).unwrap();
    assert_eq!(ok.payload, vec![0xff]);
}

#[test]
fn error_codes_have_the_spec_values() {
    let all = [
        (ErrorCode::Unspecified, 0),
        (ErrorCode::Conflict, 1),
        (ErrorCode::AfterBeyondTip, 2),
        (ErrorCode::Empty, 3),
        (ErrorCode::TooLarge, 4),
        (ErrorCode::BadRequest, 5),
        (ErrorCode::Internal, 6),
        (ErrorCode::Shutdown, 7),
        (ErrorCode::Unauthenticated, 8),
        (ErrorCode::AlreadyExists, 9),
    ];
    for (code, value) in all {
        assert_eq!(code as i32, value);
        assert_eq!(ErrorCode::from_wire(value), code);
    }
}
