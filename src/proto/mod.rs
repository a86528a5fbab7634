//! Protocol v1 (`package tephra.v1`): messages, framing and conversions.
//!
//! Pure code with no runtime: the server and the clients drive their own I/O.
//!
//! - [`messages`] (re-exported here): every request and response message, hand-written
//!   `prost` derives, field numbers per docs/protocol.md §5.
//! - [`frame`]: the 4-byte big-endian length prefix framing (docs/protocol.md §4), a sans-IO
//!   [`FrameDecoder`] and blocking/async helpers.
//! - [`convert`]: wire <-> model conversion with the reference's refusal texts, and the
//!   error responses of docs/protocol.md §8/§11.
//! - [`batch`]: a copy-once `ReadEvents` frame encoder for the read path.
//!
//! Section citations are to docs/protocol.md.

pub mod append;
pub mod batch;
pub mod convert;
pub mod frame;
pub mod journal;
pub mod messages;

pub use batch::ReadEventsEncoder;
pub use frame::{
    encode_frame, read_frame, read_frame_async, read_message, read_message_async, write_frame, write_frame_async, FrameDecoder, FrameError,
    DEFAULT_MAX_FRAME_LEN,
};
pub use messages::*;

/// A request frame of an established connection, decoded and with its queries converted to
/// the model: the CPU-heavy part of taking a request in, done in one step so that a server
/// can do it away from the thread that serves other connections (a condition of 500,000
/// items takes a few hundred milliseconds to decode and convert). Conversion refusals are
/// kept, not returned, so they are answered at the point the request is served, in the same
/// order as before (an append's events are judged before its condition).
#[derive(Debug)]
pub enum Inbound {
    /// An append taken by the fast path ([`append::decode`]), with its condition converted
    /// ([`convert::condition_from_proto`]).
    Framed(append::FramedAppend, Result<Option<crate::model::AppendCondition>, convert::ConvertError>),
    /// An append the fast path left to the full decoder: its id and its conversion
    /// ([`convert::append_from_proto`]).
    Append(u64, Result<(Vec<crate::event::Event>, Option<crate::model::AppendCondition>), convert::ConvertError>),
    /// A read, its query taken out, converted ([`convert::query_from_proto_opt`]) and
    /// prepared for matching.
    Read(u64, ReadRequest, Result<std::sync::Arc<crate::model::QueryMatcher>, convert::ConvertError>),
    /// A subscription, its query taken out, converted and prepared.
    Subscribe(u64, SubscribeRequest, Result<std::sync::Arc<crate::model::QueryMatcher>, convert::ConvertError>),
    /// Anything else (cancel, stats, a Hello after the handshake, no kind), as decoded.
    Other(Request),
}

fn prepared(query: crate::model::Query) -> std::sync::Arc<crate::model::QueryMatcher> {
    std::sync::Arc::new(crate::model::QueryMatcher::new(query))
}

/// Decodes a request frame of an established connection into an [`Inbound`]: the append fast
/// path first, then [`decode_request`].
///
/// # Errors
/// [`decode_request`]'s: the frame is not a valid `Request` (a frame-level error,
/// docs/protocol.md §11).
pub fn decode_inbound(frame: &[u8]) -> Result<Inbound, prost::DecodeError> {
    // Anything the fast path does not take (another request, or something it does not parse
    // that protobuf allows, such as an unknown group field) goes to the full decoder.
    if let Ok(Some(mut fa)) = append::decode(frame) {
        let condition = fa.condition.take().map(convert::condition_from_proto).transpose();
        return Ok(Inbound::Framed(fa, condition));
    }
    let req = decode_request(frame)?;
    let id = req.request_id;
    Ok(match req.kind {
        Some(request::Kind::Append(a)) => Inbound::Append(id, convert::append_from_proto(a)),
        Some(request::Kind::Read(mut r)) => {
            let query = convert::query_from_proto_opt(r.query.take()).map(prepared);
            Inbound::Read(id, r, query)
        }
        Some(request::Kind::Subscribe(mut s)) => {
            let query = convert::query_from_proto_opt(s.query.take()).map(prepared);
            Inbound::Subscribe(id, s, query)
        }
        kind => Inbound::Other(Request { request_id: id, kind }),
    })
}

/// Decodes a `Request` frame body the way the reference's parser (upb) does where prost is
/// stricter: a field whose number the schema knows but whose wire type is not the schema's
/// (a varint where a message belongs, a length-delimited `after`, ...) is an unknown field and
/// is skipped, at every level of the request, and a varint whose tenth byte sets bits past 64
/// keeps its low 64 bits. So `Request { request_id: 5, field 2 as the
/// varint 7 }` decodes as request 5 with no kind and is answered `BAD_REQUEST` on id 5, the
/// connection kept open, and a condition whose query arrives as a varint is no condition, as
/// with the reference (docs/protocol.md §5.5, §11).
/// Prost's own decoding is tried first; this only runs when it fails.
///
/// # Errors
/// Prost's error when the frame is not valid protobuf even with such fields skipped (bad
/// varints, truncation, invalid UTF-8): a frame-level error (docs/protocol.md §11).
pub fn decode_request(frame: &[u8]) -> Result<Request, prost::DecodeError> {
    use prost::Message;
    let strict = match Request::decode(frame) {
        Ok(r) => return Ok(r),
        Err(e) => e,
    };
    let mut kept = Vec::with_capacity(frame.len());
    match lenient::keep_matching(lenient::Msg::Request, frame, &mut kept) {
        Ok(true) => Request::decode(&kept[..]).map_err(|_| strict),
        _ => Err(strict),
    }
}

/// The request messages' schema, as far as wire types go, and the rewrite that drops the
/// fields that do not match it (see [`decode_request`]).
mod lenient {
    use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, skip_field, DecodeContext, WireType};

    /// A request-side message of docs/protocol.md §5.
    #[derive(Clone, Copy)]
    pub(super) enum Msg {
        Request,
        Append,
        Event,
        Condition,
        Query,
        Item,
        Read,
        Subscribe,
        Cancel,
        Stats,
        Hello,
    }

    /// Field `tag` of `msg`: its wire type, and its message type when it holds one. `None`
    /// for a field the schema does not have (kept as it is: prost skips those itself).
    fn field(msg: Msg, tag: u32) -> Option<(WireType, Option<Msg>)> {
        use Msg::*;
        use WireType::{LengthDelimited as L, Varint as V};
        Some(match (msg, tag) {
            (Request, 1) => (V, None),
            (Request, 2) => (L, Some(Append)),
            (Request, 3) => (L, Some(Read)),
            (Request, 4) => (L, Some(Subscribe)),
            (Request, 5) => (L, Some(Cancel)),
            (Request, 6) => (L, Some(Stats)),
            (Request, 7) => (L, Some(Hello)),
            (Append, 1) => (L, Some(Event)),
            (Append, 2) => (L, Some(Condition)),
            (Event, 1..=3) => (L, None),
            (Condition, 1 | 3) => (L, Some(Query)),
            (Condition, 2) => (V, None),
            (Query, 1) => (V, None),
            (Query, 2) => (L, Some(Item)),
            (Item, 1 | 2) => (L, None),
            (Read, 1) | (Subscribe, 1) => (L, Some(Query)),
            (Read, 2..=4) | (Subscribe, 2) | (Cancel, 1) | (Hello, 1) => (V, None),
            (Hello, 2) => (L, None),
            _ => return None,
        })
    }

    /// Appends to `out` the fields of `buf` (a `msg`) whose wire types match the schema, at
    /// every level, varints written canonically; true when anything was dropped or rewritten.
    ///
    /// # Errors
    /// When `buf` is not well-formed protobuf.
    pub(super) fn keep_matching(msg: Msg, mut buf: &[u8], out: &mut Vec<u8>) -> Result<bool, prost::DecodeError> {
        let mut changed = false;
        while !buf.is_empty() {
            let whole = buf;
            let (tag, wt) = decode_key(&mut buf)?;
            if wt == WireType::Varint {
                // Read the way upb reads it (bits past 64 dropped), then dropped when the schema
                // wants another wire type here, or else written canonically.
                let v = varint_like_upb(&mut buf)?;
                if matches!(field(msg, tag), Some((want, _)) if want != wt) {
                    changed = true;
                    continue;
                }
                let at = out.len();
                encode_key(tag, wt, out);
                encode_varint(v, out);
                changed |= out[at..] != whole[..whole.len() - buf.len()];
                continue;
            }
            match field(msg, tag) {
                Some((want, _)) if want != wt => {
                    skip_field(wt, tag, &mut buf, DecodeContext::default())?;
                    changed = true;
                }
                Some((WireType::LengthDelimited, Some(inner))) => {
                    let len = decode_varint(&mut buf)? as usize;
                    if len > buf.len() {
                        return Err(prost::DecodeError::new("buffer underflow"));
                    }
                    let (body, rest) = buf.split_at(len);
                    buf = rest;
                    let mut kept = Vec::with_capacity(body.len());
                    if keep_matching(inner, body, &mut kept)? {
                        changed = true;
                        encode_key(tag, WireType::LengthDelimited, out);
                        encode_varint(kept.len() as u64, out);
                        out.extend_from_slice(&kept);
                    } else {
                        out.extend_from_slice(&whole[..whole.len() - buf.len()]);
                    }
                }
                _ => {
                    skip_field(wt, tag, &mut buf, DecodeContext::default())?;
                    out.extend_from_slice(&whole[..whole.len() - buf.len()]);
                }
            }
        }
        Ok(changed)
    }

    /// A varint as upb reads it: at most 10 bytes, and of the tenth only its lowest bit counts
    /// (prost refuses a tenth byte over 1; the reference keeps the low 64 bits).
    ///
    /// # Errors
    /// Truncated, or longer than 10 bytes (both servers refuse those).
    fn varint_like_upb(buf: &mut &[u8]) -> Result<u64, prost::DecodeError> {
        let mut v = 0u64;
        for (i, &b) in buf.iter().take(10).enumerate() {
            v |= if i < 9 { u64::from(b & 0x7f) << (7 * i) } else { u64::from(b & 0x01) << 63 };
            if b & 0x80 == 0 {
                *buf = &buf[i + 1..];
                return Ok(v);
            }
        }
        Err(prost::DecodeError::new(if buf.len() < 10 { "buffer underflow" } else { "invalid varint" }))
    }
}

/// The only protocol version (docs/protocol.md §6): a Hello must carry it and a HelloAck echoes it.
pub const PROTOCOL_VERSION: u32 = 1;

#[cfg(test)]
mod tests {
    use super::{decode_request, request, AppendRequest, Request, StatsRequest};
    use prost::Message;

    #[test]
    fn a_known_field_with_another_wire_type_is_skipped_like_upb() {
        // Field 2 (append) as the varint 7: request 5, no kind.
        assert_eq!(decode_request(&[0x08, 0x05, 0x10, 0x07]).unwrap(), Request { request_id: 5, kind: None });
        // Field 1 (request_id) length-delimited: id 0, the stats kind kept.
        let mut b = vec![0x0a, 0x01, 0x09];
        Request::new(0, request::Kind::Stats(StatsRequest {})).encode(&mut b).unwrap();
        assert_eq!(decode_request(&b).unwrap(), Request::new(0, request::Kind::Stats(StatsRequest {})));
        // A mismatched field 3 before a valid append: the append stands.
        let mut b = vec![0x18, 0x01];
        Request::new(9, request::Kind::Append(AppendRequest { events: vec![], condition: None })).encode(&mut b).unwrap();
        assert_eq!(decode_request(&b).unwrap(), Request::new(9, request::Kind::Append(AppendRequest { events: vec![], condition: None })));
        // A 64-bit and a 32-bit field 6 (stats) are skipped too.
        let b = [0x08, 0x02, 0x31, 1, 2, 3, 4, 5, 6, 7, 8, 0x35, 1, 2, 3, 4];
        assert_eq!(decode_request(&b).unwrap(), Request { request_id: 2, kind: None });
        // Prost accepts what it accepts, unchanged.
        let ok = Request::new(3, request::Kind::Stats(StatsRequest {}));
        assert_eq!(decode_request(&ok.encode_to_vec()).unwrap(), ok);
    }

    #[test]
    fn mismatched_fields_inside_the_kind_are_skipped_too() {
        use super::{AppendCondition, Event, Hello, Query, ReadRequest};
        // Hello with protocol_version length-delimited: version 0 (then refused by the Hello rules).
        let b = [0x08, 0x01, 0x3a, 0x03, 0x0a, 0x01, 0x01];
        assert_eq!(decode_request(&b).unwrap(), Request::new(1, request::Kind::Hello(Hello { protocol_version: 0, auth_token: None })));
        // A read whose query.all and limit are length-delimited: all = false, no limit.
        let b = [0x08, 0x02, 0x1a, 0x09, 0x0a, 0x03, 0x0a, 0x01, 0x01, 0x1a, 0x02, 0x01, 0x02];
        let want = ReadRequest { query: Some(Query { all: false, items: vec![] }), after: 0, limit: None, reverse: false };
        assert_eq!(decode_request(&b).unwrap(), Request::new(2, request::Kind::Read(want)));
        // An append whose condition's query is a varint: the condition has no query.
        let ev = Event { r#type: "E".into(), tags: vec![], payload: vec![] };
        let mut append = Vec::new();
        append.extend([0x0a, 0x03, 0x0a, 0x01, b'E']);
        append.extend([0x12, 0x02, 0x08, 0x01]);
        let mut b = vec![0x08, 0x03, 0x12, append.len() as u8];
        b.extend(&append);
        let want = AppendRequest { events: vec![ev], condition: Some(AppendCondition { fail_if_events_match: None, after: 0, fail_if_exists: None }) };
        assert_eq!(decode_request(&b).unwrap(), Request::new(3, request::Kind::Append(want)));
    }

    #[test]
    fn varints_with_bits_past_64_keep_their_low_64_bits_like_upb() {
        use super::{Hello, ReadRequest};
        // Stats with request_id = ff x9 7f: u64::MAX.
        let b = [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x32, 0x00];
        assert_eq!(decode_request(&b).unwrap(), Request::new(u64::MAX, request::Kind::Stats(StatsRequest {})));
        // A Hello whose version has a tenth byte of 0x7e: the low 32 bits are 1.
        let b = [0x3a, 0x0b, 0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7e];
        assert_eq!(decode_request(&b).unwrap(), Request::new(0, request::Kind::Hello(Hello { protocol_version: 1, auth_token: None })));
        // A read's `after`, and an unknown field 40, with such varints.
        let mut b = vec![0x08, 0x04, 0x1a, 0x0c, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        b.extend([0x0a, 0x00]);
        b[3] = (b.len() - 4) as u8;
        b.extend([0xc0, 0x02, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]);
        let want = ReadRequest { query: Some(super::Query { all: false, items: vec![] }), after: u64::MAX, limit: None, reverse: false };
        assert_eq!(decode_request(&b).unwrap(), Request::new(4, request::Kind::Read(want)));
        // Eleven bytes is no varint for either server.
        assert!(decode_request(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
    }

    #[test]
    fn what_is_not_protobuf_stays_a_decode_error() {
        // Truncated varint, truncated length, a length past the end.
        assert!(decode_request(&[0x08]).is_err());
        assert!(decode_request(&[0x10, 0x07, 0x12]).is_err());
        assert!(decode_request(&[0x10, 0x07, 0x12, 0x05, 0x00]).is_err());
        // Invalid UTF-8 inside the kind's message is still a frame error (docs/protocol.md §11).
        let mut b = vec![0x10, 0x07];
        b.extend([0x3a, 0x04, 0x12, 0x02, 0xff, 0xfe]);
        assert!(decode_request(&b).is_err());
        // Field 0 is never valid.
        assert!(decode_request(&[0x00, 0x01]).is_err());
    }
}
