//! Protocol v1 (`package tephra.v1`): messages, framing and conversions.
//!
//! Pure code with no runtime: the server and the clients drive their own I/O.
//!
//! - [`messages`] (re-exported here): every request and response message, hand-written
//!   `prost` derives, field numbers per spec §1.3.
//! - [`frame`]: the 4-byte big-endian length prefix framing (spec §1.2), a sans-IO
//!   [`FrameDecoder`] and blocking/async helpers.
//! - [`convert`]: wire <-> model conversion with the reference's refusal texts, and the
//!   error responses of spec §1.6/§1.9.
//! - [`batch`]: a copy-once `ReadEvents` frame encoder for the read path.
//!
//! Spec references are to `reference/tephra-protocol-server.md`.

pub mod append;
pub mod batch;
pub mod convert;
pub mod frame;
pub mod messages;

pub use batch::ReadEventsEncoder;
pub use frame::{
    encode_frame, read_frame, read_frame_async, read_message, read_message_async, write_frame, write_frame_async,
    FrameDecoder, FrameError, DEFAULT_MAX_FRAME_LEN,
};
pub use messages::*;

/// Decodes a `Request` frame body the way the reference's parser (upb) does where prost is
/// stricter: a top-level field whose number the schema knows but whose wire type is not the
/// schema's (field 1 not a varint, fields 2-7 not length-delimited) is an unknown field and is
/// skipped, so `Request { request_id: 5, field 2 as the varint 7 }` decodes as request 5 with no
/// kind and is answered `BAD_REQUEST` on id 5, the connection kept open, as the reference does
/// (reference protocol §1.3 "Skip unknown fields by wire type", §1.9). Prost's own decoding is
/// tried first; this only runs when it fails.
///
/// # Errors
/// Prost's error when the frame is not valid protobuf even with such fields skipped (bad
/// varints, truncation, invalid UTF-8, groups at the top level, mismatches inside the kind's
/// message): a frame-level error (§1.9).
pub fn decode_request(frame: &[u8]) -> Result<Request, prost::DecodeError> {
    use prost::Message;
    let strict = match Request::decode(frame) {
        Ok(r) => return Ok(r),
        Err(e) => e,
    };
    let expected = |tag: u32| match tag {
        1 => Some(prost::encoding::WireType::Varint),
        2..=7 => Some(prost::encoding::WireType::LengthDelimited),
        _ => None,
    };
    let mut kept = Vec::with_capacity(frame.len());
    let mut buf = frame;
    let mut skipped = false;
    while !buf.is_empty() {
        let start = buf;
        let Ok((tag, wt)) = prost::encoding::decode_key(&mut buf) else { return Err(strict) };
        if append::skip(wt, &mut buf).is_err() {
            return Err(strict);
        }
        let field = &start[..start.len() - buf.len()];
        match expected(tag) {
            Some(want) if want != wt => skipped = true,
            _ => kept.extend_from_slice(field),
        }
    }
    if !skipped {
        return Err(strict);
    }
    Request::decode(&kept[..]).map_err(|_| strict)
}

/// The only protocol version (spec §1.4): a Hello must carry it and a HelloAck echoes it.
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
    fn what_is_not_protobuf_stays_a_decode_error() {
        // Truncated varint, truncated length, a length past the end.
        assert!(decode_request(&[0x08]).is_err());
        assert!(decode_request(&[0x10, 0x07, 0x12]).is_err());
        assert!(decode_request(&[0x10, 0x07, 0x12, 0x05, 0x00]).is_err());
        // Invalid UTF-8 inside the kind's message is still a frame error (spec §1.9).
        let mut b = vec![0x10, 0x07];
        b.extend([0x3a, 0x04, 0x12, 0x02, 0xff, 0xfe]);
        assert!(decode_request(&b).is_err());
        // Field 0 is never valid.
        assert!(decode_request(&[0x00, 0x01]).is_err());
    }
}
