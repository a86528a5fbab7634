//! The event codec: one event is one data record's payload on disk.
//!
//! Layout (docs/format.md §5), all integers little-endian, `n` = tag count:
//!
//! ```text
//! type_len u16 | tag_count u16 | tag_len[0] u16 .. tag_len[n-1] u16 |
//! type bytes | tag[0] bytes .. tag[n-1] bytes (strictly ascending) | payload (the rest)
//! ```
//!
//! The encoding is canonical (equal tag sets give equal bytes) and an [`Event`] *is* its
//! encoded bytes, so reads borrow straight from the read buffer through [`EventRef`].

use crate::model::{EventType, Tags};
use std::fmt;

/// Why an event could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// More than 65,535 tags.
    #[error("{0} tags, more than the maximum of 65535")]
    TooManyTags(usize),
    /// The encoded event does not fit a `u32` length.
    #[error("encoded event of {0} bytes is too large")]
    TooLarge(u64),
}

/// Why bytes are not a valid encoded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the 4-byte fixed header or the `4 + 2n` byte length table.
    #[error("encoded event is truncated")]
    Truncated,
    /// The declared lengths run past the buffer.
    #[error("encoded event lengths exceed the buffer")]
    TooLarge,
    /// A zero-length type.
    #[error("encoded event has an empty type")]
    EmptyType,
    /// A zero-length tag.
    #[error("encoded event has an empty tag")]
    EmptyTag,
    /// The type or a tag is not UTF-8.
    #[error("encoded event has a name that is not UTF-8")]
    InvalidUtf8,
    /// Tags are not strictly ascending.
    #[error("encoded event tags are not sorted and unique")]
    TagsNotSorted,
}

/// An owned, encoded event: type, sorted tags and opaque payload.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Event {
    buf: Box<[u8]>,
    data_offset: u32,
}

impl Event {
    /// Encodes an event.
    ///
    /// # Errors
    /// [`EncodeError::TooManyTags`] past 65,535 tags; [`EncodeError::TooLarge`] when the
    /// encoding exceeds `u32::MAX` bytes. Names are valid by construction.
    pub fn new(event_type: &EventType, tags: &Tags, payload: &[u8]) -> Result<Event, EncodeError> {
        let n = tags.len();
        if n > u16::MAX as usize {
            return Err(EncodeError::TooManyTags(n));
        }
        let names: usize = event_type.as_str().len() + tags.iter().map(|t| t.as_str().len()).sum::<usize>();
        let head = 4 + 2 * n + names;
        let total = head as u64 + payload.len() as u64;
        if total > u32::MAX as u64 {
            return Err(EncodeError::TooLarge(total));
        }
        let mut buf = Vec::with_capacity(total as usize);
        buf.extend_from_slice(&(event_type.as_str().len() as u16).to_le_bytes());
        buf.extend_from_slice(&(n as u16).to_le_bytes());
        for t in tags.iter() {
            buf.extend_from_slice(&(t.as_str().len() as u16).to_le_bytes());
        }
        buf.extend_from_slice(event_type.as_str().as_bytes());
        for t in tags.iter() {
            buf.extend_from_slice(t.as_str().as_bytes());
        }
        buf.extend_from_slice(payload);
        Ok(Event { buf: buf.into_boxed_slice(), data_offset: head as u32 })
    }

    /// Validates and adopts encoded bytes (for example a record read from disk).
    ///
    /// # Errors
    /// Any [`DecodeError`].
    pub fn from_encoded(buf: Box<[u8]>) -> Result<Event, DecodeError> {
        let r = EventRef::from_bytes(&buf)?;
        let data_offset = r.data_offset as u32;
        Ok(Event { buf, data_offset })
    }

    /// A borrowed view.
    pub fn as_ref(&self) -> EventRef<'_> {
        let type_len = u16::from_le_bytes([self.buf[0], self.buf[1]]) as usize;
        let tag_count = u16::from_le_bytes([self.buf[2], self.buf[3]]) as usize;
        EventRef { buf: &self.buf, type_len, tag_count, data_offset: self.data_offset as usize }
    }

    /// The encoded bytes (the data record payload).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Encoded length in bytes.
    pub fn encoded_len(&self) -> usize {
        self.buf.len()
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        self.as_ref().event_type()
    }

    /// The payload.
    pub fn data(&self) -> &[u8] {
        &self.buf[self.data_offset as usize..]
    }

    /// The tags, ascending.
    pub fn tags(&self) -> TagIter<'_> {
        self.as_ref().tags()
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

/// A validated, borrowed view of an encoded event.
#[derive(Clone, Copy)]
pub struct EventRef<'a> {
    buf: &'a [u8],
    type_len: usize,
    tag_count: usize,
    data_offset: usize,
}

impl<'a> EventRef<'a> {
    /// Validates encoded bytes without copying (docs/format.md §5's checks).
    ///
    /// # Errors
    /// Any [`DecodeError`].
    pub fn from_bytes(buf: &'a [u8]) -> Result<EventRef<'a>, DecodeError> {
        if buf.len() < 4 {
            return Err(DecodeError::Truncated);
        }
        let type_len = u16::from_le_bytes([buf[0], buf[1]]) as usize;
        let tag_count = u16::from_le_bytes([buf[2], buf[3]]) as usize;
        let table_end = 4 + 2 * tag_count;
        if buf.len() < table_end {
            return Err(DecodeError::Truncated);
        }
        if type_len == 0 {
            return Err(DecodeError::EmptyType);
        }
        let mut off = table_end + type_len;
        if off > buf.len() {
            return Err(DecodeError::TooLarge);
        }
        std::str::from_utf8(&buf[table_end..off]).map_err(|_| DecodeError::InvalidUtf8)?;
        let mut prev: Option<&[u8]> = None;
        for i in 0..tag_count {
            let l = u16::from_le_bytes([buf[4 + 2 * i], buf[5 + 2 * i]]) as usize;
            if l == 0 {
                return Err(DecodeError::EmptyTag);
            }
            let end = off + l;
            if end > buf.len() {
                return Err(DecodeError::TooLarge);
            }
            let tag = &buf[off..end];
            std::str::from_utf8(tag).map_err(|_| DecodeError::InvalidUtf8)?;
            if let Some(p) = prev {
                if p >= tag {
                    return Err(DecodeError::TagsNotSorted);
                }
            }
            prev = Some(tag);
            off = end;
        }
        Ok(EventRef { buf, type_len, tag_count, data_offset: off })
    }

    /// A view of bytes this process encoded itself from an [`Event`] (the writer's staged
    /// records): lengths are read, nothing is re-validated.
    pub(crate) fn trusted(buf: &'a [u8]) -> EventRef<'a> {
        let type_len = u16::from_le_bytes([buf[0], buf[1]]) as usize;
        let tag_count = u16::from_le_bytes([buf[2], buf[3]]) as usize;
        let mut off = 4 + 2 * tag_count + type_len;
        for i in 0..tag_count {
            off += u16::from_le_bytes([buf[4 + 2 * i], buf[5 + 2 * i]]) as usize;
        }
        debug_assert!(EventRef::from_bytes(buf).is_ok());
        EventRef { buf, type_len, tag_count, data_offset: off }
    }

    /// The event type.
    pub fn event_type(&self) -> &'a str {
        let s = 4 + 2 * self.tag_count;
        let b = &self.buf[s..s + self.type_len];
        debug_assert!(std::str::from_utf8(b).is_ok());
        // SAFETY: an EventRef is only built by `from_bytes` (which validated every name as
        // UTF-8) or from an `Event` (built from `str` names), and its buffer is immutable.
        unsafe { std::str::from_utf8_unchecked(b) }
    }

    /// Number of tags.
    pub fn tag_count(&self) -> usize {
        self.tag_count
    }

    /// The tags, ascending.
    pub fn tags(&self) -> TagIter<'a> {
        TagIter { buf: self.buf, i: 0, n: self.tag_count, off: 4 + 2 * self.tag_count + self.type_len }
    }

    /// The payload.
    pub fn data(&self) -> &'a [u8] {
        &self.buf[self.data_offset..]
    }

    /// The encoded type and tags (everything before the payload): two events name the same
    /// type and tags exactly when these bytes are equal.
    pub fn names(&self) -> &'a [u8] {
        &self.buf[..self.data_offset]
    }

    /// The whole encoded event.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Event {
        Event { buf: self.buf.into(), data_offset: self.data_offset as u32 }
    }
}

impl fmt::Debug for EventRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").field("type", &self.event_type()).field("tags", &self.tags().collect::<Vec<_>>()).field("data_len", &self.data().len()).finish()
    }
}

/// Iterator over an encoded event's tags, ascending.
#[derive(Clone)]
pub struct TagIter<'a> {
    buf: &'a [u8],
    i: usize,
    n: usize,
    off: usize,
}

impl<'a> Iterator for TagIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.i >= self.n {
            return None;
        }
        let l = u16::from_le_bytes([self.buf[4 + 2 * self.i], self.buf[5 + 2 * self.i]]) as usize;
        let s = &self.buf[self.off..self.off + l];
        self.i += 1;
        self.off += l;
        debug_assert!(std::str::from_utf8(s).is_ok());
        // SAFETY: as in `EventRef::event_type`: the names were validated when the view was built.
        Some(unsafe { std::str::from_utf8_unchecked(s) })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.n - self.i, Some(self.n - self.i))
    }
}

impl ExactSizeIterator for TagIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    #[test]
    fn golden_event_bytes_match_the_reference_worked_example() {
        // docs/format.md §7: `Enrolled` {course:c1, student:s1} payload `{}`
        let e = Event::new(&EventType::new("Enrolled").unwrap(), &Tags::new(["student:s1", "course:c1"]).unwrap(), b"{}").unwrap();
        let mut want = vec![0x08, 0x00, 0x02, 0x00, 0x09, 0x00, 0x0a, 0x00];
        want.extend_from_slice(b"Enrolledcourse:c1student:s1{}");
        assert_eq!(e.as_bytes(), &want[..]);
        assert_eq!(e.as_bytes().len(), 0x25);
        let a = Event::new(&EventType::new("A").unwrap(), &Tags::new(["course:c1"]).unwrap(), b"yy").unwrap();
        let mut want = vec![0x01, 0x00, 0x01, 0x00, 0x09, 0x00];
        want.extend_from_slice(b"Acourse:c1yy");
        assert_eq!(a.as_bytes(), &want[..]);
    }

    #[test]
    fn decode_round_trips_and_rejects_malformed() {
        let e = Event::new(&EventType::new("T").unwrap(), &Tags::new(["b", "a"]).unwrap(), b"pay").unwrap();
        let r = EventRef::from_bytes(e.as_bytes()).unwrap();
        assert_eq!(r.event_type(), "T");
        assert_eq!(r.tags().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(r.data(), b"pay");
        assert_eq!(EventRef::from_bytes(&[1, 0, 0]).unwrap_err(), DecodeError::Truncated);
        assert_eq!(EventRef::from_bytes(&[0, 0, 0, 0]).unwrap_err(), DecodeError::EmptyType);
        assert_eq!(EventRef::from_bytes(&[5, 0, 0, 0, b'a']).unwrap_err(), DecodeError::TooLarge);
        assert_eq!(EventRef::from_bytes(&[1, 0, 0, 0, 0xff]).unwrap_err(), DecodeError::InvalidUtf8);
        assert_eq!(EventRef::from_bytes(&[1, 0, 1, 0, 0, 0, b'a']).unwrap_err(), DecodeError::EmptyTag);
        assert_eq!(EventRef::from_bytes(&[1, 0, 2, 0, 1, 0, 1, 0, b'T', b'b', b'a']).unwrap_err(), DecodeError::TagsNotSorted);
        assert_eq!(EventRef::from_bytes(&[1, 0, 2, 0, 1, 0, 1, 0, b'T', b'a', b'a']).unwrap_err(), DecodeError::TagsNotSorted);
    }

    #[test]
    fn names_and_tags_are_validated() {
        assert!(matches!(EventType::new(""), Err(NameError::Empty { .. })));
        assert!(EventType::new("x".repeat(65535)).is_ok());
        assert!(matches!(Tag::new("x".repeat(65536)), Err(NameError::TooLong { len: 65536, .. })));
        assert_eq!(Tags::new(["a", "b", "a"]), Err(TagsError::Duplicate("a".into())));
        let t = Tags::new(["z", "a", "m"]).unwrap();
        assert_eq!(t.iter().map(|t| t.as_str()).collect::<Vec<_>>(), vec!["a", "m", "z"]);
    }

    #[test]
    fn a_prepared_query_matches_exactly_what_the_query_does() {
        use crate::model::QueryMatcher;
        let ty = |s: &str| EventType::new(s).unwrap();
        let tags = |v: &[&str]| Tags::new(v.iter().copied()).unwrap();
        let events: Vec<Event> = [("A", vec!["k:1"]), ("B", vec![]), ("T7", vec!["k:2", "x"]), ("T40", vec!["x"]), ("Z", vec!["k:1", "k:2"])]
            .iter()
            .map(|(t, g)| Event::new(&ty(t), &tags(g), b"p").unwrap())
            .collect();
        let many = |n: usize| (0..n).map(|i| QueryItem::of_types(vec![ty(&format!("T{i}"))])).collect::<Vec<_>>();
        let mut queries = vec![Query::all(), Query::none(), Query::items(many(3)), Query::items(many(20))];
        let mut mixed = many(20);
        mixed.push(QueryItem::with_tags(tags(&["k:1", "k:2"])));
        mixed.push(QueryItem::new(vec![ty("A")], tags(&["k:1"])));
        queries.push(Query::items(mixed.clone()));
        mixed.push(QueryItem::default());
        queries.push(Query::items(mixed));
        for q in queries {
            let m = QueryMatcher::new(q.clone());
            for e in &events {
                assert_eq!(m.matches(&e.as_ref()), q.matches(&e.as_ref()), "{q:?} on {:?}", e.as_ref().event_type());
            }
        }
    }

    proptest::proptest! {
        /// Wide queries (indexed by the matcher) and narrow ones (not) match exactly as
        /// `Query::matches`, items without tags or types included.
        #[test]
        fn a_prepared_query_of_any_width_matches_as_the_query(mut items in proptest::collection::vec(crate::testgen::item(), 0..40), keep_empty in proptest::bool::weighted(0.2), events in proptest::collection::vec(crate::testgen::event(b"p"), 1..20)) {
            // An item of neither types nor tags matches everything: mostly leave it out.
            if !keep_empty {
                items.retain(|i| !i.types.is_empty() || !i.tags.is_empty());
            }
            let q = Query::items(items);
            let m = crate::model::QueryMatcher::new(q.clone());
            for e in &events {
                proptest::prop_assert_eq!(m.matches(&e.as_ref()), q.matches(&e.as_ref()), "{:?} on {:?}", q, e);
            }
        }
    }

    #[test]
    fn query_semantics() {
        let ev = Event::new(&EventType::new("A").unwrap(), &Tags::new(["k:1", "k:2"]).unwrap(), b"").unwrap();
        let r = ev.as_ref();
        assert!(Query::all().matches(&r));
        assert!(!Query::none().matches(&r));
        assert!(Query::item(QueryItem::default()).matches(&r));
        let ty = |s: &str| EventType::new(s).unwrap();
        let tags = |v: &[&str]| Tags::new(v.iter().copied()).unwrap();
        assert!(Query::item(QueryItem::new(vec![ty("B"), ty("A")], tags(&["k:2"]))).matches(&r));
        assert!(!Query::item(QueryItem::new(vec![ty("B")], tags(&["k:2"]))).matches(&r));
        assert!(Query::item(QueryItem::with_tags(tags(&["k:1", "k:2"]))).matches(&r));
        assert!(!Query::item(QueryItem::with_tags(tags(&["k:1", "k:3"]))).matches(&r));
        assert!(!Query::item(QueryItem::with_tags(tags(&["k:0"]))).matches(&r));
        assert!(!Query::item(QueryItem::with_tags(tags(&["k:1", "k:2", "k:3"]))).matches(&r));
        assert!(Query::items(vec![QueryItem::with_tags(tags(&["x"])), QueryItem::of_types(vec![ty("A")])]).matches(&r));
    }
}
