//! The append fast path: decode an `AppendRequest` frame straight into framed log records.
//!
//! The generic path decodes a frame into prost messages (a `String` per type and tag, a `Vec`
//! per payload), converts them to model events, encodes those, then frames and checksums the
//! records: about eight allocations per event. This decoder walks the protobuf bytes once and
//! writes each event's on-disk encoding (docs/format.md §5) and record frame (docs/format.md §4) into
//! one buffer. It applies exactly the generic path's rules, in the same order:
//!
//! - wire errors (malformed protobuf, invalid UTF-8 in a string field) are frame-level
//!   (docs/protocol.md §5: the frame is refused, id 0, and the connection closed);
//! - name and tag-set refusals are per request (`BAD_REQUEST`, texts of [`ConvertError`]); the
//!   first one wins, events before the condition.
//!
//! Frames it does not handle verbatim (not an append, or a message field repeated so that
//! protobuf merge rules would apply) return `Ok(None)`, and the caller decodes them
//! generically.

use super::convert::ConvertError;
use super::messages as pb;
use crate::log::record::RECORD_HEAD;
use crate::model::{NameError, MAX_NAME_LEN};
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::{DecodeError, Message};

/// An append request decoded into framed records.
#[derive(Debug)]
pub struct FramedAppend {
    /// The request id (field 1).
    pub request_id: u64,
    /// Framed data records (`len crc event`), in request order; empty when `invalid`.
    pub records: Vec<u8>,
    /// Number of events.
    pub count: u32,
    /// The largest framed record, in bytes.
    pub largest_record: usize,
    /// The largest event's wire `Event` body, in bytes, as a read sends it back
    /// ([`crate::proto::batch::event_body_len`]).
    pub largest_event: usize,
    /// The condition, still in wire form.
    pub condition: Option<pb::AppendCondition>,
    /// The first validation refusal, if any (answer `BAD_REQUEST`, append nothing).
    pub invalid: Option<ConvertError>,
}

fn ld<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let len = decode_varint(buf)? as usize;
    if len > buf.len() {
        return Err(DecodeError::new("buffer underflow"));
    }
    let (v, rest) = buf.split_at(len);
    *buf = rest;
    Ok(v)
}

fn skip(wt: WireType, buf: &mut &[u8]) -> Result<(), DecodeError> {
    let n = match wt {
        WireType::Varint => {
            decode_varint(buf)?;
            0
        }
        WireType::SixtyFourBit => 8,
        WireType::ThirtyTwoBit => 4,
        WireType::LengthDelimited => {
            ld(buf)?;
            0
        }
        WireType::StartGroup | WireType::EndGroup => return Err(DecodeError::new("groups are not supported")),
    };
    if n > buf.len() {
        return Err(DecodeError::new("buffer underflow"));
    }
    *buf = &buf[n..];
    Ok(())
}

fn utf8(b: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(b).map_err(|_| DecodeError::new("invalid string value: data is not UTF-8 encoded"))
}

fn name_ok(what: &'static str, s: &str) -> Result<(), ConvertError> {
    if s.is_empty() {
        return Err(ConvertError::Name(NameError::Empty { what }));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(ConvertError::Name(NameError::TooLong { what, len: s.len(), max: MAX_NAME_LEN }));
    }
    Ok(())
}

/// Decodes `frame` when it is an append request this fast path handles.
///
/// # Errors
/// A [`DecodeError`] when the frame is not valid protobuf for `tephra.v1.Request` (including
/// invalid UTF-8 in any string): a frame-level error.
pub fn decode(frame: &[u8]) -> Result<Option<FramedAppend>, DecodeError> {
    let mut buf = frame;
    let mut request_id = 0;
    let mut kind_field = 0u32;
    let mut append_body: Option<&[u8]> = None;
    let mut appends = 0;
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (1, WireType::Varint) => request_id = decode_varint(&mut buf)?,
            (2, WireType::LengthDelimited) => {
                append_body = Some(ld(&mut buf)?);
                appends += 1;
                kind_field = 2;
            }
            (3..=7, _) => {
                kind_field = tag;
                skip(wt, &mut buf)?;
            }
            _ => skip(wt, &mut buf)?,
        }
    }
    if kind_field != 2 || appends != 1 {
        return Ok(None);
    }
    let mut body = append_body.unwrap_or(&[]);
    let mut out = FramedAppend {
        request_id,
        records: Vec::with_capacity(body.len() + body.len() / 8),
        count: 0,
        largest_record: 0,
        largest_event: 0,
        condition: None,
        invalid: None,
    };
    let mut conditions = 0;
    let mut tags: Vec<&str> = Vec::new();
    while !body.is_empty() {
        let (tag, wt) = decode_key(&mut body)?;
        match (tag, wt) {
            (1, WireType::LengthDelimited) => {
                let ev = ld(&mut body)?;
                encode_event(ev, &mut out, &mut tags)?;
            }
            (2, WireType::LengthDelimited) => {
                let c = ld(&mut body)?;
                out.condition = Some(pb::AppendCondition::decode(c)?);
                conditions += 1;
            }
            _ => skip(wt, &mut body)?,
        }
    }
    if conditions > 1 {
        // Repeated message fields merge in protobuf; leave that to the generic decoder.
        return Ok(None);
    }
    if out.invalid.is_some() {
        out.records = Vec::new();
    }
    Ok(Some(out))
}

/// Parses one wire `Event` and appends its framed record, or records the first refusal.
fn encode_event<'a>(mut ev: &'a [u8], out: &mut FramedAppend, tags: &mut Vec<&'a str>) -> Result<(), DecodeError> {
    let mut ty: &str = "";
    let mut payload: &[u8] = &[];
    tags.clear();
    while !ev.is_empty() {
        let (tag, wt) = decode_key(&mut ev)?;
        match (tag, wt) {
            (1, WireType::LengthDelimited) => ty = utf8(ld(&mut ev)?)?,
            (2, WireType::LengthDelimited) => tags.push(utf8(ld(&mut ev)?)?),
            (3, WireType::LengthDelimited) => payload = ld(&mut ev)?,
            _ => skip(wt, &mut ev)?,
        }
    }
    out.count += 1;
    if out.invalid.is_some() {
        return Ok(());
    }
    // The generic path's order: the type, each tag's name, duplicates, the tag count, size.
    let check = (|| {
        name_ok("event type", ty)?;
        for t in tags.iter() {
            name_ok("tag", t)?;
        }
        tags.sort_unstable();
        if let Some(w) = tags.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConvertError::DuplicateTag(w[0].to_owned()));
        }
        if tags.len() > u16::MAX as usize {
            return Err(ConvertError::TooManyTags(tags.len()));
        }
        let size = 4 + 2 * tags.len() as u64 + ty.len() as u64 + tags.iter().map(|t| t.len() as u64).sum::<u64>() + payload.len() as u64;
        if size > u32::MAX as u64 {
            return Err(ConvertError::EventTooLarge(size));
        }
        Ok(size as usize)
    })();
    let size = match check {
        Ok(s) => s,
        Err(e) => {
            out.invalid = Some(e);
            return Ok(());
        }
    };
    let r = &mut out.records;
    let start = r.len();
    r.reserve(RECORD_HEAD + size);
    r.extend_from_slice(&(size as u32).to_le_bytes());
    r.extend_from_slice(&[0; 4]);
    r.extend_from_slice(&(ty.len() as u16).to_le_bytes());
    r.extend_from_slice(&(tags.len() as u16).to_le_bytes());
    for t in tags.iter() {
        r.extend_from_slice(&(t.len() as u16).to_le_bytes());
    }
    r.extend_from_slice(ty.as_bytes());
    for t in tags.iter() {
        r.extend_from_slice(t.as_bytes());
    }
    r.extend_from_slice(payload);
    let mut h = crc32fast::Hasher::new();
    h.update(&r[start..start + 4]);
    h.update(&r[start + RECORD_HEAD..]);
    let crc = h.finalize().to_le_bytes();
    r[start + 4..start + 8].copy_from_slice(&crc);
    out.largest_record = out.largest_record.max(RECORD_HEAD + size);
    out.largest_event = out.largest_event.max(crate::proto::batch::wire_event_len(ty, tags.iter().copied(), payload.len()));
    Ok(())
}

/// Bytes of a protobuf length-delimited field `tag` holding `len` bytes (key, length, body).
fn ld_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(len as u64) + len
}

/// Appends one frame (4-byte big-endian length, then the body) holding
/// `Request { request_id, append: AppendRequest { events, condition } }` (docs/protocol.md
/// §5: `Request` field 1 and oneof field 2; `AppendRequest` fields 1 and 2; `Event` fields
/// 1-3), written straight from the encoded `events`: no wire `Event` values, so no `String`
/// or `Vec` per type, tag and payload. Byte for byte what prost encodes for the same message
/// (a property test holds it to that). A run of identical events is encoded once and copied.
///
/// # Errors
/// [`super::FrameError::TooLong`] when the body exceeds `max_frame_len`; nothing is appended.
pub fn encode_append_frame(
    request_id: u64,
    events: &[&crate::event::Event],
    condition: Option<&pb::AppendCondition>,
    max_frame_len: u32,
    out: &mut Vec<u8>,
) -> Result<(), super::FrameError> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len};
    let mut body = 0usize;
    let mut prev: Option<(&crate::event::Event, usize)> = None;
    let mut lens = Vec::with_capacity(events.len());
    for ev in events {
        let len = match prev {
            Some((p, l)) if std::ptr::eq(p, *ev) || p.as_bytes() == ev.as_bytes() => l,
            _ => crate::proto::batch::event_body_len(&ev.as_ref()),
        };
        prev = Some((ev, len));
        lens.push(len);
        body += ld_len(1, len);
    }
    if let Some(c) = condition {
        body += ld_len(2, c.encoded_len());
    }
    let request = if request_id == 0 { 0 } else { key_len(1) + encoded_len_varint(request_id) } + ld_len(2, body);
    if request as u64 > u64::from(max_frame_len) {
        return Err(super::FrameError::TooLong { len: request as u64, max: max_frame_len });
    }
    out.reserve(4 + request);
    out.extend_from_slice(&(request as u32).to_be_bytes());
    if request_id != 0 {
        encode_key(1, WireType::Varint, out);
        encode_varint(request_id, out);
    }
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(body as u64, out);
    let mut last: Option<(&crate::event::Event, std::ops::Range<usize>)> = None;
    for (ev, len) in events.iter().zip(lens) {
        if let Some((p, r)) = &last {
            if std::ptr::eq(*p, *ev) || p.as_bytes() == ev.as_bytes() {
                out.extend_from_within(r.clone());
                continue;
            }
        }
        let at = out.len();
        encode_key(1, WireType::LengthDelimited, out);
        encode_varint(len as u64, out);
        let s = |tag: u32, b: &[u8], out: &mut Vec<u8>| {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(b.len() as u64, out);
            out.extend_from_slice(b);
        };
        s(1, ev.event_type().as_bytes(), out);
        for t in ev.tags() {
            s(2, t.as_bytes(), out);
        }
        if !ev.data().is_empty() {
            s(3, ev.data(), out);
        }
        last = Some((ev, at..out.len()));
    }
    if let Some(c) = condition {
        encode_key(2, WireType::LengthDelimited, out);
        encode_varint(c.encoded_len() as u64, out);
        c.encode_raw(out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::frame_data;
    use crate::proto::convert::append_from_proto;
    use crate::proto::messages::request;

    fn frame(req: &pb::Request) -> Vec<u8> {
        req.encode_to_vec()
    }

    fn append(events: Vec<pb::Event>, condition: Option<pb::AppendCondition>) -> pb::Request {
        pb::Request::new(9, request::Kind::Append(pb::AppendRequest { events, condition }))
    }

    fn wire(ty: &str, tags: &[&str], payload: &[u8]) -> pb::Event {
        pb::Event { r#type: ty.into(), tags: tags.iter().map(|t| t.to_string()).collect(), payload: payload.to_vec() }
    }

    /// The fast path and the generic path must agree byte for byte and refusal for refusal.
    fn agree(req: pb::Request) {
        let bytes = frame(&req);
        let fast = decode(&bytes).unwrap().expect("an append");
        let Some(request::Kind::Append(a)) = req.kind else { unreachable!() };
        match append_from_proto(a.clone()) {
            Ok((events, cond)) => {
                assert_eq!(fast.invalid, None);
                let mut want = Vec::new();
                for e in &events {
                    frame_data(e.as_bytes(), &mut want);
                }
                assert_eq!(fast.records, want);
                assert_eq!(fast.count as usize, events.len());
                assert_eq!(fast.condition.is_some(), cond.is_some());
            }
            Err(e) => assert_eq!(fast.invalid, Some(e)),
        }
        assert_eq!(fast.request_id, 9);
    }

    #[test]
    fn agrees_with_the_generic_path() {
        agree(append(vec![wire("A", &[], b"x"), wire("Enrolled", &["student:s1", "course:c1"], b"{}")], None));
        agree(append(vec![wire("A", &["b", "a", "c"], b"")], Some(pb::AppendCondition { fail_if_events_match: None, after: 3, fail_if_exists: None })));
        agree(append(vec![], None));
        agree(append(vec![wire("", &[], b"")], None));
        agree(append(vec![wire("A", &["k", "k"], b"")], None));
        agree(append(vec![wire("A", &["", "k"], b"")], None));
        agree(append(vec![wire("A", &["z", "z", ""], b"")], None));
        agree(append(vec![wire(&"x".repeat(65536), &[], b"")], None));
        agree(append(vec![wire("ok", &[], b""), wire("", &["k", "k"], b"")], None));
    }

    #[test]
    fn invalid_utf8_is_a_frame_error_like_prost() {
        let mut bytes = frame(&append(vec![wire("AB", &[], b"")], None));
        let at = bytes.windows(2).position(|w| w == b"AB").unwrap();
        bytes[at] = 0xff;
        assert!(decode(&bytes).is_err());
        assert!(pb::Request::decode(&bytes[..]).is_err());
    }

    #[test]
    fn other_kinds_fall_back() {
        let stats = pb::Request::new(3, request::Kind::Stats(pb::StatsRequest {}));
        assert!(decode(&frame(&stats)).unwrap().is_none());
        assert!(decode(&[]).unwrap().is_none());
    }

    #[test]
    fn truncated_frames_are_errors() {
        let bytes = frame(&append(vec![wire("A", &["t"], b"payload")], None));
        for cut in 1..bytes.len() {
            let generic = pb::Request::decode(&bytes[..cut]);
            let fast = decode(&bytes[..cut]);
            if generic.is_err() {
                assert!(fast.is_err() || fast.unwrap().is_none(), "cut {cut}");
            }
        }
    }
}
