//! Shared fixtures for the unit tests: proptest strategies for the index and the condition
//! verdict (a few types and tags so random events and queries collide often), and scratch
//! directories for the log and the writer.

use crate::event::Event;
use crate::model::{EventType, Query, QueryItem, Tags};
use proptest::prelude::*;

/// Event types drawn from ("Z" is never used by [`event`], so queries can name an absent type).
pub const TYPES: &[&str] = &["A", "B", "C", "Z"];
/// Tags drawn from ("zz" is never used by [`event`]).
pub const TAGS: &[&str] = &["t0", "t1", "t2", "t3", "zz"];

/// A random event with `payload`: one of the first three types, up to three of the first four tags.
pub fn event(payload: &'static [u8]) -> impl Strategy<Value = Event> {
    (0..3usize, proptest::sample::subsequence((0..4usize).collect::<Vec<_>>(), 0..=3))
        .prop_map(move |(ty, tags)| Event::new(&EventType::new(TYPES[ty]).unwrap(), &Tags::new(tags.iter().map(|&t| TAGS[t])).unwrap(), payload).unwrap())
}

/// A random query item over [`TYPES`] and [`TAGS`]: up to two types, up to three tags.
pub fn item() -> impl Strategy<Value = QueryItem> {
    (proptest::sample::subsequence((0..TYPES.len()).collect::<Vec<_>>(), 0..=2), proptest::sample::subsequence((0..TAGS.len()).collect::<Vec<_>>(), 0..=3))
        .prop_map(|(ty, tg)| QueryItem::new(ty.iter().map(|&t| EventType::new(TYPES[t]).unwrap()).collect(), Tags::new(tg.iter().map(|&t| TAGS[t])).unwrap()))
}

/// A random query: `All`, none, or one to three items over [`TYPES`] and [`TAGS`].
pub fn query() -> impl Strategy<Value = Query> {
    prop_oneof![1 => Just(Query::All), 1 => Just(Query::none()), 6 => proptest::collection::vec(item(), 1..=3).prop_map(Query::items)]
}

/// A scratch directory on the disk the build uses (segments and group commits write with
/// O_DIRECT, which a tmpfs `/tmp` may refuse).
pub fn scratch() -> tempfile::TempDir {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/target");
    std::fs::create_dir_all(root).unwrap();
    tempfile::tempdir_in(root).unwrap()
}
