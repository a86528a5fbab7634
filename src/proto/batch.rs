//! A copy-once encoder for the read path: builds a complete `Response{read_events}` frame
//! straight from encoded events ([`EventRef`]), without intermediate protobuf structs.
//!
//! The bytes are identical to what `prost` would produce for the equivalent
//! [`Response`](crate::proto::Response) (checked by the tests), so this is purely an
//! allocation saving for servers streaming reads and subscriptions (docs/protocol.md §9).

use prost::encoding::{encode_varint, encoded_len_varint};

use crate::event::EventRef;
use crate::model::Position;
use crate::proto::frame::{FrameError, PREFIX_LEN};

/// Room reserved in front of the events for the frame prefix and the `Response` header:
/// 4 (prefix) + 1 + 10 (request id) + 1 + 5 (length of `ReadEvents`).
const HEADER_ROOM: usize = PREFIX_LEN + 1 + 10 + 1 + 5;

/// Protobuf size of a `bytes`/`string` field with a one-byte key.
fn ld_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Protobuf size of a `tephra.v1.Event` built from `event` (its body, without key or
/// length). The payload field is omitted when empty, as proto3 requires.
pub fn event_body_len(event: &EventRef<'_>) -> usize {
    wire_event_len(event.event_type(), event.tags(), event.data().len())
}

/// Protobuf size of a `tephra.v1.Event` body with type `ty`, `tags` and a payload of
/// `payload_len` bytes (fields 1, 2, 3, each with a one-byte key; the payload omitted when
/// empty). The one formula behind [`event_body_len`] and the append decoder's size checks.
pub fn wire_event_len<'a>(ty: &str, tags: impl IntoIterator<Item = &'a str>, payload_len: usize) -> usize {
    ld_len(ty.len()) + tags.into_iter().map(|t| ld_len(t.len())).sum::<usize>() + if payload_len == 0 { 0 } else { ld_len(payload_len) }
}

/// The longest `ReadEvents` frame body (bytes, without the 4-byte length prefix) a read may
/// need to send one event whose `tephra.v1.Event` body is `event_body` bytes
/// ([`event_body_len`]) on its own: `Response{request_id, read_events{events:
/// [SequencedEvent{position, event}]}}` with the id and the position at their longest
/// (10-byte varints). An event for which this exceeds the connection's `max_frame_len` could
/// be stored but never read back over it (docs/protocol.md §4 caps frames both ways; its
/// open question 3 notes the reference has no such guard).
pub fn lone_event_frame_len(event_body: usize) -> usize {
    let seq = 11 + 1 + encoded_len_varint(event_body as u64) + event_body;
    let events = 1 + encoded_len_varint(seq as u64) + seq;
    11 + 1 + encoded_len_varint(events as u64) + events
}

/// Builds one `ReadEvents` response frame incrementally. Typical use: [`push`](Self::push)
/// events until a batch threshold is reached, then [`finish`](Self::finish) to get the frame
/// bytes, write them, and [`clear`](Self::clear) to reuse the buffer.
#[derive(Debug)]
pub struct ReadEventsEncoder {
    buf: Vec<u8>,
    count: usize,
}

impl Default for ReadEventsEncoder {
    fn default() -> Self {
        ReadEventsEncoder::new()
    }
}

impl ReadEventsEncoder {
    /// An empty batch.
    pub fn new() -> ReadEventsEncoder {
        ReadEventsEncoder::with_capacity(0)
    }

    /// An empty batch with room for about `bytes` bytes of events.
    pub fn with_capacity(bytes: usize) -> ReadEventsEncoder {
        let mut buf = Vec::with_capacity(HEADER_ROOM + bytes);
        buf.resize(HEADER_ROOM, 0);
        ReadEventsEncoder { buf, count: 0 }
    }

    /// Appends one `SequencedEvent{position, event}`.
    pub fn push(&mut self, position: Position, event: &EventRef<'_>) {
        let body = event_body_len(event);
        let pos = position.get();
        let seq_len = if pos == 0 { 0 } else { 1 + encoded_len_varint(pos) } + 1 + encoded_len_varint(body as u64) + body;
        let b = &mut self.buf;
        b.reserve(1 + encoded_len_varint(seq_len as u64) + seq_len);
        // ReadEvents.events (1, L)
        b.push(0x0a);
        encode_varint(seq_len as u64, b);
        // SequencedEvent.position (1, V)
        if pos != 0 {
            b.push(0x08);
            encode_varint(pos, b);
        }
        // SequencedEvent.event (2, L)
        b.push(0x12);
        encode_varint(body as u64, b);
        // Event.type (1, L), Event.tags (2, L)*, Event.payload (3, L) unless empty
        let ty = event.event_type();
        b.push(0x0a);
        encode_varint(ty.len() as u64, b);
        b.extend_from_slice(ty.as_bytes());
        for t in event.tags() {
            b.push(0x12);
            encode_varint(t.len() as u64, b);
            b.extend_from_slice(t.as_bytes());
        }
        let data = event.data();
        if !data.is_empty() {
            b.push(0x1a);
            encode_varint(data.len() as u64, b);
            b.extend_from_slice(data);
        }
        self.count += 1;
    }

    /// Events pushed since the last [`clear`](Self::clear).
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no event has been pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Protobuf bytes of the events pushed so far (the `ReadEvents` body).
    pub fn events_len(&self) -> usize {
        self.buf.len() - HEADER_ROOM
    }

    /// Writes the header for `request_id` and returns the complete frame (length prefix
    /// included). The id is omitted from the wire when it is 0, as proto3 requires.
    ///
    /// # Errors
    /// [`FrameError::TooLong`] when the body would exceed `max_frame_len`; the batch is kept
    /// so the caller may decide what to do.
    pub fn finish(&mut self, request_id: u64, max_frame_len: u32) -> Result<&[u8], FrameError> {
        let events_len = self.events_len();
        let id_len = if request_id == 0 { 0 } else { 1 + encoded_len_varint(request_id) };
        let body_len = id_len + 1 + encoded_len_varint(events_len as u64) + events_len;
        if body_len as u64 > u64::from(max_frame_len) {
            return Err(FrameError::TooLong { len: body_len as u64, max: max_frame_len });
        }
        let mut head = Vec::with_capacity(HEADER_ROOM);
        head.extend_from_slice(&(body_len as u32).to_be_bytes());
        if request_id != 0 {
            head.push(0x08);
            encode_varint(request_id, &mut head);
        }
        // Response.read_events (3, L)
        head.push(0x1a);
        encode_varint(events_len as u64, &mut head);
        let start = HEADER_ROOM - head.len();
        self.buf[start..HEADER_ROOM].copy_from_slice(&head);
        Ok(&self.buf[start..])
    }

    /// Empties the batch, keeping its buffer.
    pub fn clear(&mut self) {
        self.buf.truncate(HEADER_ROOM);
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use crate::model::{EventType, Tags};
    use crate::proto::{convert, encode_frame, response, ReadEvents, Response};

    #[test]
    fn the_lone_event_bound_is_the_longest_frame_one_event_makes() {
        for (payload, tags) in [(0usize, 0usize), (1, 1), (127, 3), (128, 0), (16_383, 2), (16_384, 9), (2_097_152, 1)] {
            let tag_names: Vec<String> = (0..tags).map(|i| format!("tag-{i}")).collect();
            let ev = Event::new(&EventType::new("Type").unwrap(), &Tags::new(tag_names.iter().map(String::as_str)).unwrap(), &vec![7u8; payload]).unwrap();
            let body = event_body_len(&ev.as_ref());
            let bound = lone_event_frame_len(body);
            for (id, pos) in [(u64::MAX, u64::MAX), (1, 1), (300, 1 << 40)] {
                let mut enc = ReadEventsEncoder::new();
                enc.push(Position(pos), &ev.as_ref());
                let frame_body = enc.finish(id, u32::MAX).unwrap().len() - 4;
                if id == u64::MAX {
                    assert_eq!(frame_body, bound, "payload {payload}, {tags} tags");
                } else {
                    assert!(frame_body < bound, "payload {payload}, {tags} tags, id {id}");
                }
            }
        }
    }

    #[test]
    fn matches_prost_byte_for_byte() {
        let events = [
            Event::new(&EventType::new("E").unwrap(), &Tags::new(["k:1"]).unwrap(), b"p").unwrap(),
            Event::new(&EventType::new("NoTagsNoPayload").unwrap(), &Tags::empty(), b"").unwrap(),
            Event::new(&EventType::new("t".repeat(200)).unwrap(), &Tags::new(["b", "a", "c".repeat(300).as_str()]).unwrap(), &[9u8; 5000]).unwrap(),
        ];
        for id in [0u64, 1, 12, 300, u64::MAX] {
            for n in 0..=events.len() {
                let mut enc = ReadEventsEncoder::new();
                let mut want = ReadEvents::default();
                for (i, e) in events[..n].iter().enumerate() {
                    let pos = Position(if i == 0 { 1 } else { (i as u64) << 40 });
                    enc.push(pos, &e.as_ref());
                    want.events.push(convert::sequenced_to_proto(pos, &e.as_ref()));
                }
                let mut expected = Vec::new();
                encode_frame(&Response::new(id, response::Kind::ReadEvents(want)), u32::MAX, &mut expected).unwrap();
                assert_eq!(enc.len(), n);
                assert_eq!(enc.finish(id, u32::MAX).unwrap(), &expected[..], "id {id}, {n} events");
                enc.clear();
                assert!(enc.is_empty());
                assert_eq!(enc.events_len(), 0);
            }
        }
    }

    #[test]
    fn finish_enforces_the_cap() {
        let e = Event::new(&EventType::new("E").unwrap(), &Tags::empty(), &[0u8; 100]).unwrap();
        let mut enc = ReadEventsEncoder::new();
        enc.push(Position(1), &e.as_ref());
        let full = enc.finish(5, u32::MAX).unwrap().len() - PREFIX_LEN;
        assert!(enc.finish(5, full as u32).is_ok());
        assert!(matches!(enc.finish(5, full as u32 - 1), Err(FrameError::TooLong { .. })));
    }
}
