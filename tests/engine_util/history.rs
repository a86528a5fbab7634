//! Random histories and queries shared by the engine property tests: few types, few tags,
//! random tag subsets, and queries with their own oracle predicate written from the spec (not
//! through `Query::matches`).

use super::ev;
use proptest::prelude::*;
use tephra::*;

pub const TYPES: &[&str] = &["A", "B", "C"];
/// Tags events carry; queries also ask for "zz", which no event carries.
pub const TAGS: &[&str] = &["t0", "t1", "t2", "t3"];
pub const QUERY_TAGS: &[&str] = &["t0", "t1", "t2", "t3", "zz"];
pub const QUERY_TYPES: &[&str] = &["A", "B", "C", "Z"];

#[derive(Clone, Debug)]
pub struct EvSpec {
    pub ty: usize,
    pub tags: Vec<usize>,
    pub payload: Vec<u8>,
}

impl EvSpec {
    pub fn event(&self) -> Event {
        let tags: Vec<&str> = self.tags.iter().map(|&i| TAGS[i]).collect();
        ev(TYPES[self.ty], &tags, &self.payload)
    }
}

#[derive(Clone, Debug)]
pub struct ItemSpec {
    pub types: Vec<usize>,
    pub tags: Vec<usize>,
}

#[derive(Clone, Debug)]
pub enum QSpec {
    All,
    Items(Vec<ItemSpec>),
}

impl QSpec {
    pub fn query(&self) -> Query {
        match self {
            QSpec::All => Query::all(),
            QSpec::Items(items) => Query::items(
                items
                    .iter()
                    .map(|i| {
                        QueryItem::new(
                            i.types.iter().map(|&t| EventType::new(QUERY_TYPES[t]).unwrap()).collect(),
                            Tags::new(i.tags.iter().map(|&t| QUERY_TAGS[t])).unwrap(),
                        )
                    })
                    .collect(),
            ),
        }
    }

    /// The oracle's own predicate, written from the spec, not through `Query::matches`.
    pub fn matches(&self, e: &EvSpec) -> bool {
        match self {
            QSpec::All => true,
            QSpec::Items(items) => items.iter().any(|i| {
                (i.types.is_empty() || i.types.iter().any(|&t| QUERY_TYPES[t] == TYPES[e.ty]))
                    && i.tags.iter().all(|&t| e.tags.iter().any(|&et| TAGS[et] == QUERY_TAGS[t]))
            }),
        }
    }
}

pub fn ev_spec() -> impl Strategy<Value = EvSpec> {
    (0..TYPES.len(), proptest::sample::subsequence((0..TAGS.len()).collect::<Vec<_>>(), 0..=3), proptest::collection::vec(any::<u8>(), 0..12))
        .prop_map(|(ty, tags, payload)| EvSpec { ty, tags, payload })
}

pub fn item_spec() -> impl Strategy<Value = ItemSpec> {
    (
        proptest::sample::subsequence((0..QUERY_TYPES.len()).collect::<Vec<_>>(), 0..=2),
        proptest::sample::subsequence((0..QUERY_TAGS.len()).collect::<Vec<_>>(), 0..=2),
    )
        .prop_map(|(types, tags)| ItemSpec { types, tags })
}

pub fn q_spec() -> impl Strategy<Value = QSpec> {
    prop_oneof![
        1 => Just(QSpec::All),
        1 => Just(QSpec::Items(vec![])),
        6 => proptest::collection::vec(item_spec(), 1..=3).prop_map(QSpec::Items),
    ]
}
