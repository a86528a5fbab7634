//! Conversions between the wire messages ([`crate::proto`]) and the validated model
//! ([`crate::model`], [`crate::event`]), plus the reference server's error texts.
//!
//! Wire-to-model conversion validates through the model constructors, so there is one
//! definition of every rule; only the *wording* of a refusal lives here, because the
//! reference server's `BAD_REQUEST` texts (docs/protocol.md §8) are part of its observable behaviour:
//!
//! | refusal | text |
//! |---|---|
//! | empty or over-long type/tag | `invalid name: event type must not be empty`, `invalid name: tag is N bytes, exceeding the 65535-byte maximum` |
//! | duplicate tag | `invalid tags: duplicate tag 'k:1'` (the bytewise-smallest duplicate) |
//! | more than 65,535 tags on an event | `invalid event: event has N tags, exceeding the maximum of 65535` |
//!
//! Checks run in the reference's order: for each event its type, then each tag name, then
//! duplicates, then the tag count and encoded size; then the append condition.
//!
//! The [`text`] module and the `*_error` builders produce the append-result and
//! connection-level messages (docs/protocol.md §6-§11) from plain values.

use std::fmt;

use crate::event::{Event, EventRef};
use crate::model::{AppendCondition, EventType, NameError, Position, Query, QueryItem, Tag, Tags, TagsError};
use crate::proto as pb;
use crate::proto::ErrorCode;

/// Why a wire message is not valid model input. Every variant is the sender's fault; a
/// server answers it with `BAD_REQUEST` and the [`Display`](fmt::Display) text, which
/// matches the reference server's wording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConvertError {
    /// An event type or tag is empty or longer than 65,535 bytes.
    Name(NameError),
    /// A tag set names the same tag twice (the bytewise-smallest such tag).
    DuplicateTag(String),
    /// An event carries more than 65,535 tags.
    TooManyTags(usize),
    /// An event's encoding does not fit a `u32` (size in bytes).
    EventTooLarge(u64),
    /// A message field that must be present is absent (only produced when reading a
    /// server's responses; requests treat absent queries as match-nothing).
    MissingField(&'static str),
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConvertError::Name(NameError::Empty { what }) => write!(f, "invalid name: {what} must not be empty"),
            ConvertError::Name(NameError::TooLong { what, len, max }) => {
                write!(f, "invalid name: {what} is {len} bytes, exceeding the {max}-byte maximum")
            }
            ConvertError::DuplicateTag(tag) => write!(f, "invalid tags: duplicate tag '{tag}'"),
            ConvertError::TooManyTags(count) => {
                write!(f, "invalid event: event has {count} tags, exceeding the maximum of {}", u16::MAX)
            }
            ConvertError::EventTooLarge(size) => write!(f, "invalid event: encoded event data region of {size} bytes exceeds the {}-byte maximum", u32::MAX),
            ConvertError::MissingField(field) => write!(f, "missing field '{field}'"),
        }
    }
}

impl std::error::Error for ConvertError {}

impl ConvertError {
    /// The `BAD_REQUEST` error response a server sends for this refusal.
    pub fn to_error_response(&self) -> pb::ErrorResponse {
        pb::ErrorResponse::new(ErrorCode::BadRequest, self.to_string())
    }
}

/// Tag names checked for names and duplicates; `Err(count)` when there are more distinct
/// tags than a [`Tags`] set can hold.
fn checked_tags(names: Vec<String>) -> Result<Result<Tags, usize>, ConvertError> {
    let mut tags = Vec::with_capacity(names.len());
    for name in names {
        tags.push(Tag::new(name).map_err(ConvertError::Name)?);
    }
    if tags.len() > u16::MAX as usize {
        // `Tags` refuses the count before looking for duplicates; the reference reports a
        // duplicate first, so look for one here.
        tags.sort_unstable();
        if let Some(w) = tags.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConvertError::DuplicateTag(w[0].as_str().to_owned()));
        }
        return Ok(Err(tags.len()));
    }
    match Tags::from_tags(tags) {
        Ok(t) => Ok(Ok(t)),
        Err(TagsError::Duplicate(tag)) => Err(ConvertError::DuplicateTag(tag)),
        Err(TagsError::TooMany(n)) => Ok(Err(n)),
        Err(TagsError::Name(e)) => Err(ConvertError::Name(e)),
    }
}

/// Validates and sorts a wire tag list into a [`Tags`] set (for an event).
///
/// # Errors
/// [`ConvertError::Name`], [`ConvertError::DuplicateTag`], [`ConvertError::TooManyTags`].
pub fn tags_from_proto(names: Vec<String>) -> Result<Tags, ConvertError> {
    checked_tags(names)?.map_err(ConvertError::TooManyTags)
}

/// Validates wire type names.
///
/// # Errors
/// [`ConvertError::Name`] for the first invalid one.
pub fn types_from_proto(names: Vec<String>) -> Result<Vec<EventType>, ConvertError> {
    names.into_iter().map(|n| EventType::new(n).map_err(ConvertError::Name)).collect()
}

/// Builds a model [`Event`] (the packed codec) from a wire event.
///
/// # Errors
/// Any name, tag-set or size refusal, in the reference's order.
pub fn event_from_proto(event: pb::Event) -> Result<Event, ConvertError> {
    let ty = EventType::new(event.r#type).map_err(ConvertError::Name)?;
    let tags = tags_from_proto(event.tags)?;
    Event::new(&ty, &tags, &event.payload).map_err(|e| match e {
        crate::event::EncodeError::TooManyTags(n) => ConvertError::TooManyTags(n),
        crate::event::EncodeError::TooLarge(size) => ConvertError::EventTooLarge(size),
    })
}

/// Converts every event of a batch, stopping at the first refusal.
///
/// # Errors
/// As [`event_from_proto`].
pub fn events_from_proto(events: Vec<pb::Event>) -> Result<Vec<Event>, ConvertError> {
    events.into_iter().map(event_from_proto).collect()
}

/// Builds a model [`Query`]: `all = true` gives [`Query::All`] (items are then ignored,
/// unvalidated); otherwise the OR of the items, where no items matches nothing.
///
/// An item requiring more than 65,535 distinct tags can never match (an event carries at
/// most that many), so it is dropped rather than refused.
///
/// # Errors
/// [`ConvertError::Name`] or [`ConvertError::DuplicateTag`] from any item.
pub fn query_from_proto(query: pb::Query) -> Result<Query, ConvertError> {
    if query.all {
        return Ok(Query::All);
    }
    let mut items = Vec::with_capacity(query.items.len());
    for item in query.items {
        let types = types_from_proto(item.types)?;
        if let Ok(tags) = checked_tags(item.tags)? {
            items.push(QueryItem::new(types, tags));
        }
    }
    Ok(Query::Items(items))
}

/// [`query_from_proto`] for an optional field: an absent query matches nothing (docs/protocol.md §5,
/// `ReadRequest.query`, `AppendCondition.fail_if_events_match`).
///
/// # Errors
/// As [`query_from_proto`].
pub fn query_from_proto_opt(query: Option<pb::Query>) -> Result<Query, ConvertError> {
    query.map_or_else(|| Ok(Query::none()), query_from_proto)
}

/// Builds a model [`AppendCondition`]. An absent boundary query matches nothing; an absent
/// `fail_if_exists` turns the existence check off.
///
/// # Errors
/// As [`query_from_proto`], boundary first.
pub fn condition_from_proto(condition: pb::AppendCondition) -> Result<AppendCondition, ConvertError> {
    let boundary = query_from_proto_opt(condition.fail_if_events_match)?;
    let exists = condition.fail_if_exists.map(query_from_proto).transpose()?;
    Ok(AppendCondition { fail_if_events_match: boundary, after: Position(condition.after), fail_if_exists: exists })
}

/// Converts an append request into its events and optional condition, events first (as the
/// reference does). An empty batch is *not* refused here: the caller answers it with
/// [`empty_append_error`] once the rest is known to be valid.
///
/// # Errors
/// The first [`ConvertError`].
pub fn append_from_proto(append: pb::AppendRequest) -> Result<(Vec<Event>, Option<AppendCondition>), ConvertError> {
    let events = events_from_proto(append.events)?;
    let condition = append.condition.map(condition_from_proto).transpose()?;
    Ok((events, condition))
}

/// Builds a wire [`pb::Event`] from a model event; tags come out sorted bytewise.
pub fn event_to_proto(event: &Event) -> pb::Event {
    event_ref_to_proto(&event.as_ref())
}

/// Builds a wire [`pb::Event`] straight from an encoded event (the read path).
pub fn event_ref_to_proto(event: &EventRef<'_>) -> pb::Event {
    pb::Event { r#type: event.event_type().to_owned(), tags: event.tags().map(str::to_owned).collect(), payload: event.data().to_vec() }
}

/// Builds a wire [`pb::SequencedEvent`] from a position and an encoded event.
pub fn sequenced_to_proto(position: Position, event: &EventRef<'_>) -> pb::SequencedEvent {
    pb::SequencedEvent { position: position.get(), event: Some(event_ref_to_proto(event)) }
}

/// Validates a server's [`pb::SequencedEvent`] into a position and a model event.
///
/// # Errors
/// [`ConvertError::MissingField`] without an event, or any refusal of
/// [`event_from_proto`].
pub fn sequenced_from_proto(sequenced: pb::SequencedEvent) -> Result<(Position, Event), ConvertError> {
    let event = sequenced.event.ok_or(ConvertError::MissingField("event"))?;
    Ok((Position(sequenced.position), event_from_proto(event)?))
}

/// Builds a wire [`pb::Query`]: `All` sets `all`, items are copied in order.
pub fn query_to_proto(query: &Query) -> pb::Query {
    match query {
        Query::All => pb::Query { all: true, items: Vec::new() },
        Query::Items(items) => pb::Query {
            all: false,
            items: items
                .iter()
                .map(|i| pb::QueryItem {
                    types: i.types.iter().map(|t| t.as_str().to_owned()).collect(),
                    tags: i.tags.iter().map(|t| t.as_str().to_owned()).collect(),
                })
                .collect(),
        },
    }
}

/// Builds a wire [`pb::AppendCondition`]. The boundary query is always sent (a
/// match-nothing boundary as an empty `Query`); `fail_if_exists` only when set.
pub fn condition_to_proto(condition: &AppendCondition) -> pb::AppendCondition {
    pb::AppendCondition {
        fail_if_events_match: Some(query_to_proto(&condition.fail_if_events_match)),
        after: condition.after.get(),
        fail_if_exists: condition.fail_if_exists.as_ref().map(query_to_proto),
    }
}

/// Which clause of an append condition fired (docs/protocol.md §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConflictClause {
    /// `fail_if_events_match` matched an event after `after`: code `CONFLICT`.
    Boundary,
    /// `fail_if_exists` matched an event anywhere: code `ALREADY_EXISTS`.
    Existence,
}

/// The reference server's message texts, as plain functions and constants.
pub mod text {
    use super::ConflictClause;
    use crate::model::Position;

    /// A condition conflict: `append condition conflict (Boundary, Durable(Position(7)))`,
    /// or `(Existence, SameBatch)` when `durable_at` is `None` (a match against an event
    /// staged earlier in the same group commit).
    pub fn conflict(clause: ConflictClause, durable_at: Option<Position>) -> String {
        let clause = match clause {
            ConflictClause::Boundary => "Boundary",
            ConflictClause::Existence => "Existence",
        };
        match durable_at {
            Some(p) => format!("append condition conflict ({clause}, Durable(Position({})))", p.get()),
            None => format!("append condition conflict ({clause}, SameBatch)"),
        }
    }

    /// `after 1000 is beyond the durable tip 7`.
    pub fn after_beyond_tip(after: Position, tip: Position) -> String {
        format!("after {} is beyond the durable tip {}", after.get(), tip.get())
    }

    /// An append with no events.
    pub const EMPTY_APPEND: &str = "append with no events";

    /// A batch that cannot fit even an empty segment (`size` in bytes).
    pub fn batch_too_large(size: usize) -> String {
        format!("event batch of {size} bytes exceeds the segment capacity")
    }

    /// The size named by a [`batch_too_large`] text (bytes); `None` for any other text. It is
    /// the framed record (8-byte head + encoded event) of an event over the per-event limit
    /// (a quarter segment), checked first, or else the whole batch with its commit marker.
    pub fn batch_size_of(message: &str) -> Option<u64> {
        message.strip_prefix("event batch of ")?.strip_suffix(" bytes exceeds the segment capacity")?.parse().ok()
    }

    /// An event a read could never send back: its lone `ReadEvents` frame would be `len`
    /// bytes, over the connection's cap `max` (`TOO_LARGE`; ours only, the reference stores
    /// such an event and then fails every read that reaches it).
    pub fn unreadable_event(len: usize, max: u32) -> String {
        format!("event too large to read back: a read frame holding it would be {len} bytes, over the maximum of {max} (server.max_frame_len)")
    }

    /// The writer has stopped after a failed log write or sync (`INTERNAL`; fail-stop: no
    /// append succeeds until the server restarts).
    pub fn writer_stopped(detail: impl std::fmt::Display) -> String {
        format!("log write failed, the writer has stopped: {detail}")
    }

    /// A rollover could not create the next segment (`INTERNAL`; nothing was written, and the
    /// next append tries the rollover again).
    pub fn rollover_failed(detail: impl std::fmt::Display) -> String {
        format!("log write failed, rollover failed (the next append tries again): {detail}")
    }

    /// A new segment's first batch waits for its name, for want of room (`INTERNAL`; appends
    /// are accepted again once it is named).
    pub fn naming_stuck(detail: impl std::fmt::Display) -> String {
        format!("log write refused while the new segment waits for its name (appends resume once it is named): {detail}")
    }

    /// An event on the log that failed to decode during a condition check (`INTERNAL`).
    pub fn corrupt_event(detail: impl std::fmt::Display) -> String {
        format!("event on the log failed to decode: {detail}")
    }

    /// The writer is gone (`SHUTDOWN`).
    pub const SHUTDOWN: &str = "write coordinator has shut down";

    /// First frame of a connection that is not a Hello (`UNAUTHENTICATED`, then close).
    pub const FIRST_FRAME_NOT_HELLO: &str = "first frame must be a hello";

    /// A Hello with the wrong protocol version (`BAD_REQUEST`, then close).
    pub fn unsupported_version(version: u32) -> String {
        format!("unsupported protocol version {version}: this server speaks {}", crate::proto::PROTOCOL_VERSION)
    }

    /// A missing or refused token (`UNAUTHENTICATED`, then close).
    pub const BAD_TOKEN: &str = "invalid or missing auth token";

    /// A request without a kind, or a second Hello (`BAD_REQUEST`; the connection stays).
    pub const NO_KIND: &str = "request has no append, read, subscribe, or cancel set";

    /// A read past both read budgets (`BAD_REQUEST`).
    pub const TOO_MANY_READS: &str = "too many in-flight reads on this connection";

    /// A subscription past the per-connection cap (`BAD_REQUEST`).
    pub const TOO_MANY_SUBSCRIPTIONS: &str = "too many concurrent subscriptions on this connection";

    /// The subscription worker could not be started (`BAD_REQUEST`).
    pub const SUBSCRIPTION_NOT_STARTED: &str = "server could not start the subscription";

    /// An inbound length prefix over the cap (`TOO_LARGE`, id 0, then close). Equal to the
    /// text of [`FrameError::TooLong`](crate::proto::FrameError::TooLong).
    pub fn frame_too_long(len: u64, max: u32) -> String {
        format!("frame length {len} exceeds the maximum of {max}")
    }

    /// A first frame, before the Hello, whose length prefix is over the cap on a Hello's size
    /// (`TOO_LARGE`, id 0, then close). Worded apart from [`frame_too_long`], so that
    /// [`frame_cap_of`] does not take `max` for the server's `server.max_frame_len`.
    pub fn first_frame_too_long(len: u64, max: u32) -> String {
        format!("first frame of {len} bytes is larger than a hello may be ({max} bytes)")
    }

    /// The cap named by a [`frame_too_long`] text (the server's `server.max_frame_len`, bytes);
    /// `None` for any other text.
    pub fn frame_cap_of(message: &str) -> Option<u32> {
        let rest = message.strip_prefix("frame length ")?;
        let (len, max) = rest.split_once(" exceeds the maximum of ")?;
        len.parse::<u64>().ok()?;
        max.parse().ok()
    }

    /// A frame body that does not parse, including invalid UTF-8 in a string field
    /// (`BAD_REQUEST`, id 0, then close). The reference sends this fixed text whatever the
    /// parse failure was (65 bytes: the `2a 45 08 05 12 41 ...` example of docs/protocol.md §5); the
    /// detailed cause is in [`FrameError::Decode`](crate::proto::FrameError::Decode)'s text.
    pub const FRAME_DECODE: &str = "frame decode error: Couldn't deserialize given bytes into a proto";
}

/// A condition conflict: `CONFLICT` (boundary) or `ALREADY_EXISTS` (existence). A durable
/// conflict carries its position and is not retryable; a same-batch one (`None`) is
/// retryable and has no position (docs/protocol.md §8).
pub fn conflict_error(clause: ConflictClause, durable_at: Option<Position>) -> pb::ErrorResponse {
    let code = match clause {
        ConflictClause::Boundary => ErrorCode::Conflict,
        ConflictClause::Existence => ErrorCode::AlreadyExists,
    };
    pb::ErrorResponse {
        code: code as i32,
        message: text::conflict(clause, durable_at),
        conflict_position: durable_at.map(Position::get),
        retryable: durable_at.is_none(),
    }
}

/// `AFTER_BEYOND_TIP`: the condition's `after` is past the durable tip.
pub fn after_beyond_tip_error(after: Position, tip: Position) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::AfterBeyondTip, text::after_beyond_tip(after, tip))
}

/// `EMPTY`: an append with no events.
pub fn empty_append_error() -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Empty, text::EMPTY_APPEND)
}

/// `TOO_LARGE`: a batch of `size` bytes that cannot fit an empty segment.
pub fn batch_too_large_error(size: usize) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::TooLarge, text::batch_too_large(size))
}

/// `TOO_LARGE`: an event whose read frame (`len` bytes) would exceed the cap `max`.
pub fn unreadable_event_error(len: usize, max: u32) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::TooLarge, text::unreadable_event(len, max))
}

/// `INTERNAL`: the writer has stopped after a failed log write ([`text::writer_stopped`]).
pub fn writer_stopped_error(detail: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Internal, text::writer_stopped(detail))
}

/// `INTERNAL`: a rollover failed; the next append retries it ([`text::rollover_failed`]).
pub fn rollover_failed_error(detail: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Internal, text::rollover_failed(detail))
}

/// `INTERNAL`: appends wait for a new segment's name ([`text::naming_stuck`]).
pub fn naming_stuck_error(detail: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Internal, text::naming_stuck(detail))
}

/// `INTERNAL`: a stored event failed to decode.
pub fn corrupt_event_error(detail: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Internal, text::corrupt_event(detail))
}

/// `SHUTDOWN`: the writer has shut down.
pub fn shutdown_error() -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Shutdown, text::SHUTDOWN)
}

/// `BAD_REQUEST` with the given text.
pub fn bad_request(message: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::BadRequest, message.to_string())
}

/// `UNAUTHENTICATED` with the given text.
pub fn unauthenticated(message: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Unauthenticated, message.to_string())
}

/// `INTERNAL` with the given text (a read or subscription failing mid-stream).
pub fn internal_error(message: impl fmt::Display) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::Internal, message.to_string())
}

/// The answer to a first frame over the cap on a Hello's size ([`text::first_frame_too_long`]):
/// `TOO_LARGE`, sent with id 0 before the connection closes.
pub fn first_frame_too_long(len: u64, max: u32) -> pb::ErrorResponse {
    pb::ErrorResponse::new(ErrorCode::TooLarge, text::first_frame_too_long(len, max))
}

/// The frame-level error a server sends (with request id 0, then closing) for an inbound
/// framing failure: `TOO_LARGE` with [`text::frame_too_long`] for an over-long prefix,
/// `BAD_REQUEST` with [`text::FRAME_DECODE`] for an undecodable body. `None` for transport failures and torn frames, which get no reply.
///
/// The `TOO_LARGE` text is pinned by the reference (docs/protocol.md §11: `frame length N exceeds
/// the maximum of M`), and [`text::frame_cap_of`] reads the cap back from it, so it does not
/// name `server.max_frame_len` (the `tephra` CLI adds it when it reports the error).
pub fn frame_error_response(err: &crate::proto::FrameError) -> Option<pb::ErrorResponse> {
    use crate::proto::FrameError;
    match err {
        FrameError::TooLong { .. } => Some(pb::ErrorResponse::new(ErrorCode::TooLarge, err.to_string())),
        FrameError::Decode(_) => Some(pb::ErrorResponse::new(ErrorCode::BadRequest, text::FRAME_DECODE)),
        FrameError::Io(_) | FrameError::Torn { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pev(ty: &str, tags: &[&str], payload: &[u8]) -> pb::Event {
        pb::Event { r#type: ty.into(), tags: tags.iter().map(|s| s.to_string()).collect(), payload: payload.to_vec() }
    }

    #[test]
    fn the_frame_cap_is_read_back_from_its_refusal_text_only() {
        assert_eq!(text::frame_cap_of(&text::frame_too_long(25_165_824, 1_048_576)), Some(1_048_576));
        assert_eq!(text::frame_cap_of(&text::frame_too_long(u32::MAX as u64, 16_777_216)), Some(16_777_216));
        for other in ["append of 9 bytes exceeds the segment capacity", "frame length x exceeds the maximum of 5", "frame length 9 exceeds the maximum of", ""]
        {
            assert_eq!(text::frame_cap_of(other), None, "{other:?}");
        }
    }

    /// The three ways the log refuses an append share the reference's `INTERNAL` code, and
    /// each text says which one it is.
    #[test]
    fn log_refusals_are_internal_and_say_which_case() {
        let cases = [
            (writer_stopped_error("x"), "the writer has stopped"),
            (rollover_failed_error("x"), "the next append tries again"),
            (naming_stuck_error("x"), "waits for its name"),
        ];
        for (e, says) in cases {
            assert_eq!(ErrorCode::from_wire(e.code), ErrorCode::Internal);
            assert!(e.message.contains(says) && e.message.ends_with(": x"), "{}", e.message);
        }
    }

    #[test]
    fn refusal_texts_match_the_reference() {
        let e = event_from_proto(pev("", &["a"], b"")).unwrap_err();
        assert_eq!(e.to_string(), "invalid name: event type must not be empty");
        let e = event_from_proto(pev("E", &["k:1", "a", "k:1"], b"")).unwrap_err();
        assert_eq!(e.to_string(), "invalid tags: duplicate tag 'k:1'");
        let e = event_from_proto(pev("E", &["ok", ""], b"")).unwrap_err();
        assert_eq!(e.to_string(), "invalid name: tag must not be empty");
        let long = "x".repeat(65_536);
        let e = event_from_proto(pev(&long, &[], b"")).unwrap_err();
        assert_eq!(e.to_string(), "invalid name: event type is 65536 bytes, exceeding the 65535-byte maximum");
        // Names are checked before duplicates: an empty tag after a duplicate still wins.
        let e = event_from_proto(pev("E", &["d", "d", ""], b"")).unwrap_err();
        assert_eq!(e.to_string(), "invalid name: tag must not be empty");
        // The smallest duplicate is reported.
        let e = event_from_proto(pev("E", &["z", "z", "b", "b"], b"")).unwrap_err();
        assert_eq!(e, ConvertError::DuplicateTag("b".into()));
        assert_eq!(e.to_error_response().code(), ErrorCode::BadRequest);
    }

    #[test]
    fn too_many_tags_reports_duplicates_first() {
        let mut names: Vec<String> = (0..65_536).map(|i| format!("t{i}")).collect();
        let e = event_from_proto(pb::Event { r#type: "E".into(), tags: names.clone(), payload: vec![] }).unwrap_err();
        assert_eq!(e.to_string(), "invalid event: event has 65536 tags, exceeding the maximum of 65535");
        names.push("t7".into());
        let e = event_from_proto(pb::Event { r#type: "E".into(), tags: names.clone(), payload: vec![] }).unwrap_err();
        assert_eq!(e, ConvertError::DuplicateTag("t7".into()));
        // In a query, an item that can never match is dropped instead.
        names.pop();
        let q = pb::Query { all: false, items: vec![pb::QueryItem { types: vec![], tags: names }, pb::QueryItem { types: vec!["A".into()], tags: vec![] }] };
        let q = query_from_proto(q).unwrap();
        assert_eq!(q, Query::item(QueryItem::of_types(vec![EventType::new("A").unwrap()])));
    }

    #[test]
    fn event_round_trips_with_sorted_tags() {
        let ev = event_from_proto(pev("Enrolled", &["student:s1", "course:c1"], b"{}")).unwrap();
        let back = event_to_proto(&ev);
        assert_eq!(back, pev("Enrolled", &["course:c1", "student:s1"], b"{}"));
        let seq = sequenced_to_proto(Position(3), &ev.as_ref());
        assert_eq!(seq.position, 3);
        let (p, again) = sequenced_from_proto(seq).unwrap();
        assert_eq!((p, again), (Position(3), ev));
        assert_eq!(sequenced_from_proto(pb::SequencedEvent { position: 1, event: None }), Err(ConvertError::MissingField("event")));
    }

    #[test]
    fn queries_and_conditions_map_both_ways() {
        assert_eq!(query_from_proto(pb::Query { all: true, items: vec![pb::QueryItem { types: vec!["".into()], tags: vec![] }] }).unwrap(), Query::All);
        assert_eq!(query_from_proto(pb::Query::default()).unwrap(), Query::none());
        assert_eq!(query_from_proto_opt(None).unwrap(), Query::none());
        let bad = pb::Query { all: false, items: vec![pb::QueryItem { types: vec![], tags: vec!["a".into(), "a".into()] }] };
        assert_eq!(query_from_proto(bad).unwrap_err().to_string(), "invalid tags: duplicate tag 'a'");

        let q = Query::items(vec![
            QueryItem::of_types(vec![EventType::new("Registered").unwrap()]),
            QueryItem::new(vec![EventType::new("Enrolled").unwrap()], Tags::new(["student:s1", "course:c1"]).unwrap()),
        ]);
        assert_eq!(query_from_proto(query_to_proto(&q)).unwrap(), q);
        assert!(!query_to_proto(&Query::none()).all);

        let cond = AppendCondition::new(q.clone()).after(Position(42)).fail_if_exists(Query::all());
        assert_eq!(condition_from_proto(condition_to_proto(&cond)).unwrap(), cond);
        let only = AppendCondition::exists_only(q);
        let wire = condition_to_proto(&only);
        assert_eq!(wire.fail_if_events_match, Some(pb::Query::default()));
        assert_eq!(condition_from_proto(wire).unwrap(), only);
        let absent = condition_from_proto(pb::AppendCondition::default()).unwrap();
        assert_eq!(absent, AppendCondition { fail_if_events_match: Query::none(), after: Position::ZERO, fail_if_exists: None });
    }

    #[test]
    fn append_checks_events_before_the_condition() {
        let bad_cond = pb::AppendCondition {
            fail_if_events_match: Some(pb::Query { all: false, items: vec![pb::QueryItem { types: vec!["".into()], tags: vec![] }] }),
            ..Default::default()
        };
        let req = pb::AppendRequest { events: vec![pev("E", &["x", "x"], b"")], condition: Some(bad_cond.clone()) };
        assert_eq!(append_from_proto(req).unwrap_err(), ConvertError::DuplicateTag("x".into()));
        let req = pb::AppendRequest { events: vec![], condition: Some(bad_cond) };
        assert_eq!(append_from_proto(req).unwrap_err().to_string(), "invalid name: event type must not be empty");
        let (evs, cond) = append_from_proto(pb::AppendRequest { events: vec![pev("E", &[], b"p")], condition: None }).unwrap();
        assert_eq!((evs.len(), cond), (1, None));
    }

    #[test]
    fn append_result_errors_carry_the_reference_texts() {
        let e = conflict_error(ConflictClause::Boundary, Some(Position(7)));
        assert_eq!(
            (e.code(), e.message.as_str(), e.conflict_position, e.retryable),
            (ErrorCode::Conflict, "append condition conflict (Boundary, Durable(Position(7)))", Some(7), false)
        );
        let e = conflict_error(ConflictClause::Existence, Some(Position(7)));
        assert_eq!((e.code(), e.message.as_str()), (ErrorCode::AlreadyExists, "append condition conflict (Existence, Durable(Position(7)))"));
        let e = conflict_error(ConflictClause::Boundary, None);
        assert_eq!((e.message.as_str(), e.conflict_position, e.retryable), ("append condition conflict (Boundary, SameBatch)", None, true));
        let e = after_beyond_tip_error(Position(1000), Position(7));
        assert_eq!((e.code(), e.message.as_str()), (ErrorCode::AfterBeyondTip, "after 1000 is beyond the durable tip 7"));
        assert_eq!(empty_append_error().message, "append with no events");
        assert_eq!(empty_append_error().code(), ErrorCode::Empty);
        assert_eq!(batch_too_large_error(1033).message, "event batch of 1033 bytes exceeds the segment capacity");
        assert_eq!(text::batch_size_of(&text::batch_too_large(1033)), Some(1033));
        assert_eq!(text::batch_size_of(&text::frame_too_long(1033, 64)), None);
        assert_eq!(text::unsupported_version(2), "unsupported protocol version 2: this server speaks 1");
        let fe = crate::proto::FrameError::TooLong { len: 65, max: 64 };
        let r = frame_error_response(&fe).unwrap();
        assert_eq!((r.code(), r.message.as_str()), (ErrorCode::TooLarge, "frame length 65 exceeds the maximum of 64"));
        assert_eq!(text::frame_too_long(65, 64), r.message);
    }
}
