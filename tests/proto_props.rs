//! Property tests for the framing and conversion layer: arbitrary messages survive any
//! chunking of the byte stream, the copy-once `ReadEvents` encoder agrees with prost, and
//! wire <-> model conversion round-trips.

use std::io::{self, Read};

use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;
use tephra::proto::{self, convert, request, response, FrameDecoder, ReadEventsEncoder, Request, Response};
use tephra::{AppendCondition, Event, EventType, Position, Query, QueryItem, Tags};

fn pb_event() -> impl Strategy<Value = proto::Event> {
    (".{0,6}", vec(".{0,4}", 0..4), vec(any::<u8>(), 0..40)).prop_map(|(r#type, tags, payload)| proto::Event { r#type, tags, payload })
}

fn pb_query() -> impl Strategy<Value = proto::Query> {
    (any::<bool>(), vec((vec("[a-c]{0,2}", 0..3), vec("[a-c]{0,2}", 0..3)), 0..3))
        .prop_map(|(all, items)| proto::Query { all, items: items.into_iter().map(|(types, tags)| proto::QueryItem { types, tags }).collect() })
}

fn pb_request() -> impl Strategy<Value = Request> {
    let kind = prop_oneof![
        (vec(pb_event(), 0..3), proptest::option::of((proptest::option::of(pb_query()), any::<u64>(), proptest::option::of(pb_query())))).prop_map(
            |(events, cond)| request::Kind::Append(proto::AppendRequest {
                events,
                condition: cond.map(|(fail_if_events_match, after, fail_if_exists)| proto::AppendCondition { fail_if_events_match, after, fail_if_exists }),
            })
        ),
        (proptest::option::of(pb_query()), any::<u64>(), proptest::option::of(any::<u64>()), any::<bool>())
            .prop_map(|(query, after, limit, reverse)| request::Kind::Read(proto::ReadRequest { query, after, limit, reverse })),
        (proptest::option::of(pb_query()), any::<u64>()).prop_map(|(query, after)| request::Kind::Subscribe(proto::SubscribeRequest { query, after })),
        any::<u64>().prop_map(|target| request::Kind::Cancel(proto::CancelRequest { target })),
        Just(request::Kind::Stats(proto::StatsRequest {})),
        (any::<u32>(), proptest::option::of(".{0,8}"))
            .prop_map(|(protocol_version, auth_token)| request::Kind::Hello(proto::Hello { protocol_version, auth_token })),
    ];
    (any::<u64>(), proptest::option::of(kind)).prop_map(|(request_id, kind)| Request { request_id, kind })
}

/// A reader that hands out the stream in the given chunk sizes (cycling), with an
/// `Interrupted` error before every chunk.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: Vec<usize>,
    i: usize,
    interrupt: bool,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = self.sizes[self.i % self.sizes.len()].min(buf.len()).min(self.data.len());
        self.i += 1;
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn valid_event() -> impl Strategy<Value = Event> {
    ("[A-Za-z]{1,8}", proptest::collection::btree_set("[a-z:0-9]{1,6}", 0..5), vec(any::<u8>(), 0..300))
        .prop_map(|(ty, tags, payload)| Event::new(&EventType::new(ty).unwrap(), &Tags::new(tags).unwrap(), &payload).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn frames_survive_any_chunking(reqs in vec(pb_request(), 0..6), sizes in vec(1usize..40, 1..5)) {
        let mut stream = Vec::new();
        for r in &reqs {
            proto::encode_frame(r, proto::DEFAULT_MAX_FRAME_LEN, &mut stream).unwrap();
        }
        // Fed in chunks.
        let mut dec = FrameDecoder::default();
        let mut got = Vec::new();
        let mut rest = &stream[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].min(rest.len());
            i += 1;
            dec.feed(&rest[..n]);
            rest = &rest[n..];
            while let Some(r) = dec.next_message::<Request>().unwrap() {
                got.push(r);
            }
        }
        prop_assert!(!dec.has_partial());
        prop_assert_eq!(&got, &reqs);
        // Pulled through a reader with short reads and interruptions.
        let mut reader = Chunked { data: &stream, sizes: sizes.clone(), i: 0, interrupt: false };
        let mut dec = FrameDecoder::default();
        let mut got = Vec::new();
        while let Some(body) = dec.read_next(&mut reader).unwrap() {
            got.push(Request::decode(body).unwrap());
        }
        prop_assert_eq!(&got, &reqs);
        // And one message at a time with the blocking helper.
        let mut r = &stream[..];
        let mut got = Vec::new();
        while let Some(m) = proto::read_message::<Request, _>(&mut r, proto::DEFAULT_MAX_FRAME_LEN).unwrap() {
            got.push(m);
        }
        prop_assert_eq!(got, reqs);
    }

    #[test]
    fn read_events_encoder_agrees_with_prost(id in any::<u64>(), events in vec((1u64.., valid_event()), 0..6)) {
        let mut enc = ReadEventsEncoder::new();
        let mut batch = proto::ReadEvents::default();
        for (pos, e) in &events {
            enc.push(Position(*pos), &e.as_ref());
            batch.events.push(convert::sequenced_to_proto(Position(*pos), &e.as_ref()));
        }
        let mut want = Vec::new();
        proto::encode_frame(&Response::new(id, response::Kind::ReadEvents(batch)), u32::MAX, &mut want).unwrap();
        prop_assert_eq!(enc.finish(id, u32::MAX).unwrap(), &want[..]);
    }

    #[test]
    fn append_frame_encoder_agrees_with_prost(
        id in any::<u64>(),
        runs in vec((valid_event(), 1..4usize), 0..6),
        cond in proptest::option::of((pb_query(), any::<u64>())),
        cap in proptest::option::of(0u32..2000),
    ) {
        // Runs of one event repeated (the encoder copies a repeat instead of re-encoding it),
        // by reference and as separate equal values.
        let owned: Vec<Event> = runs.iter().flat_map(|(e, n)| std::iter::repeat_n(e.clone(), *n)).collect();
        let refs: Vec<&Event> = owned.iter().collect();
        let condition = cond.map(|(q, after)| proto::AppendCondition { fail_if_events_match: Some(q), after, fail_if_exists: None });
        let req = Request::new(id, request::Kind::Append(proto::AppendRequest {
            events: owned.iter().map(convert::event_to_proto).collect(),
            condition: condition.clone(),
        }));
        let max = cap.unwrap_or(u32::MAX);
        let mut want = Vec::new();
        let want_res = proto::encode_frame(&req, max, &mut want);
        let mut got = vec![7u8];
        let got_res = proto::append::encode_append_frame(id, &refs, condition.as_ref(), max, &mut got);
        prop_assert_eq!(got_res.is_ok(), want_res.is_ok());
        if want_res.is_ok() {
            prop_assert_eq!(&got[1..], &want[..]);
        } else {
            prop_assert_eq!(got, vec![7u8], "a refused frame appends nothing");
        }
    }

    #[test]
    fn events_round_trip_through_the_wire(e in valid_event()) {
        let wire = convert::event_to_proto(&e);
        let bytes = wire.encode_to_vec();
        let back = convert::event_from_proto(proto::Event::decode(&bytes[..]).unwrap()).unwrap();
        prop_assert_eq!(back, e);
    }

    #[test]
    fn event_validation_agrees_with_the_model(e in pb_event()) {
        let model_ok = EventType::new(e.r#type.clone()).is_ok() && Tags::new(e.tags.clone()).is_ok();
        let converted = convert::event_from_proto(e.clone());
        prop_assert_eq!(converted.is_ok(), model_ok, "{:?} -> {:?}", e, converted);
        if let Ok(ev) = converted {
            prop_assert_eq!(ev.event_type(), e.r#type.as_str());
            prop_assert_eq!(ev.data(), &e.payload[..]);
            let mut sorted = e.tags.clone();
            sorted.sort();
            prop_assert_eq!(ev.tags().map(str::to_owned).collect::<Vec<_>>(), sorted);
        }
    }

    #[test]
    fn queries_and_conditions_round_trip(q in pb_query(), after in any::<u64>(), exists in any::<bool>()) {
        if let Ok(model) = convert::query_from_proto(q) {
            prop_assert_eq!(convert::query_from_proto(convert::query_to_proto(&model)).unwrap(), model.clone());
            let mut cond = AppendCondition::new(model.clone()).after(Position(after));
            if exists {
                cond = cond.fail_if_exists(model);
            }
            let wire = convert::condition_to_proto(&cond).encode_to_vec();
            let back = convert::condition_from_proto(proto::AppendCondition::decode(&wire[..]).unwrap()).unwrap();
            prop_assert_eq!(back, cond);
        }
    }
}

#[test]
fn query_items_keep_types_and_tags() {
    let q = Query::item(QueryItem::new(vec![EventType::new("A").unwrap()], Tags::new(["x", "y"]).unwrap()));
    let wire = convert::query_to_proto(&q);
    assert_eq!(wire.items[0].types, ["A"]);
    assert_eq!(wire.items[0].tags, ["x", "y"]);
}
