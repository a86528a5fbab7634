//! Events for tests, built from plain strings and bytes.

use tephra::{Event, EventType, Tags};

/// An event of type `ty` with `tags` and `payload`.
///
/// # Panics
/// If the type or a tag is invalid, or the event does not encode.
pub fn ev(ty: &str, tags: &[&str], payload: &[u8]) -> Event {
    Event::new(&EventType::new(ty).unwrap(), &Tags::new(tags.iter().copied()).unwrap(), payload).unwrap()
}
